"""Database URLs (PostgreSQL, MySQL) for the tracking store and the sweep storage: the installed driver, the password
masked, and the check that the database answers before anything runs.

Both MLflow's SQL store and Optuna's ``RDBStorage`` hand the URL to SQLAlchemy, which picks a default driver for a
URL without one (``postgresql://`` is psycopg in SQLAlchemy 2.1, psycopg2 in 2.0; ``mysql://`` is mysqlclient). When
that default is not installed but another driver is (``pip install 'loopwise[postgres]'`` brings psycopg 3,
``loopwise[mysql]`` PyMySQL), ``with_installed_driver`` names the installed one (``postgresql+psycopg://``). A URL that
names its driver is used as written.

``check_database`` connects once (a few seconds at most) and turns a missing driver, a database that does not answer,
a refused login or a database that does not exist into one ``DatabaseUnavailable`` message naming the URL with its
password masked (``postgresql://user:***@host/db``) and what to do.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

CONNECT_TIMEOUT_S = 5

#: backend -> (the drivers tried for a URL that names none, in order; the extra that brings one, and which)
BACKENDS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "postgresql": (("psycopg", "psycopg2", "pg8000"), "loopwise[postgres]", "psycopg 3"),
    "mysql": (("mysqldb", "pymysql", "mysqlconnector"), "loopwise[mysql]", "PyMySQL"),
}
#: schemes SQLAlchemy (and MLflow) do not know, written as the one they mean
ALIASES = {"postgres": "postgresql"}
#: the connect argument that bounds the wait for the server, per driver
TIMEOUT_ARGS = {
    "psycopg": "connect_timeout", "psycopg2": "connect_timeout", "pg8000": "timeout",
    "mysqldb": "connect_timeout", "pymysql": "connect_timeout", "mysqlconnector": "connection_timeout",
}
LOGIN_REFUSED = ("password authentication failed", "no password supplied", "Access denied for user",
                 "authentication failed", "role \"")
NO_DATABASE = ("does not exist", "Unknown database")


class DatabaseUnavailable(ConnectionError):
    """A database URL that cannot be used: no driver, no answer, a refused login, no such database (one line)."""


def backend_of(url: str) -> str | None:
    """``postgresql`` or ``mysql`` for a URL of that database (with or without a driver), else ``None``."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    name = scheme.split("+", 1)[0]
    name = ALIASES.get(name, name)
    return name if name in BACKENDS else None


def is_database_url(url: str) -> bool:
    """Whether ``url`` names a PostgreSQL or MySQL database (SQLite and HTTP servers are not)."""
    return backend_of(url) is not None


def masked_url(url: str) -> str:
    """``url`` with its password shown as ``***`` (for messages, logs and MLflow params)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if not password:
        return url
    user, _, host = parts.netloc.rpartition("@")
    name = user.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{name}:***@{host}"))


def named_driver(url: str) -> str | None:
    """The driver a URL names (``psycopg`` of ``postgresql+psycopg://``), else ``None``."""
    scheme = url.split("://", 1)[0]
    return scheme.split("+", 1)[1].lower() if "+" in scheme else None


def driver_error(backend: str, driver: str) -> str | None:
    """Why SQLAlchemy cannot use ``driver`` for ``backend`` (not installed, unknown), or ``None`` when it can."""
    from sqlalchemy.engine import make_url  # noqa: PLC0415
    from sqlalchemy.exc import NoSuchModuleError  # noqa: PLC0415

    try:
        make_url(f"{backend}+{driver}://").get_dialect().import_dbapi()
    except NoSuchModuleError:
        return f"SQLAlchemy knows no driver {driver!r} for {backend}"
    except ImportError as err:
        return str(err)
    return None


def default_driver(backend: str) -> str:
    """The driver SQLAlchemy uses for ``<backend>://`` (no driver named)."""
    from sqlalchemy.engine import make_url  # noqa: PLC0415

    return str(make_url(f"{backend}://").get_dialect().driver)


def with_installed_driver(url: str) -> str:
    """``url`` naming a driver that is installed, where SQLAlchemy's default for it is not: ``postgresql://...`` ->
    ``postgresql+psycopg://...`` when psycopg is installed and the default psycopg2 is not (and ``postgres://`` ->
    ``postgresql://``). Any other URL, one that names its driver, or one no installed driver serves (``check_database``
    says so), comes back as it is."""
    backend = backend_of(url)
    if backend is None:
        return url
    scheme, rest = url.split("://", 1)
    if scheme.lower() in ALIASES:
        url = f"{ALIASES[scheme.lower()]}://{rest}"
    if named_driver(url) is not None or driver_error(backend, default_driver(backend)) is None:
        return url
    for driver in BACKENDS[backend][0]:
        if driver_error(backend, driver) is None:
            return f"{backend}+{driver}://{rest}"
    return url


def connect_args(url: str) -> dict[str, Any]:
    """The driver's argument that bounds the wait for a server that does not answer (``CONNECT_TIMEOUT_S``)."""
    backend = backend_of(url)
    driver = named_driver(url) or (default_driver(backend) if backend else None)
    name = TIMEOUT_ARGS.get(driver or "")
    return {name: CONNECT_TIMEOUT_S} if name else {}


def failure_reason(err: BaseException) -> str:
    """The driver's own words for a failed connection, on one line (``Connection refused``, ``password
    authentication failed for user "x"``), without SQLAlchemy's wrapping and background link."""
    orig = getattr(err, "orig", None) or err
    args = getattr(orig, "args", ())
    # MySQL drivers: (code, message)
    message = args[1] if len(args) == 2 and isinstance(args[0], int) and isinstance(args[1], str) else str(orig)
    text = " ".join(message.split())
    for marker in ("failed: ", "FATAL: "):
        if marker in text:
            text = text.rsplit(marker, 1)[1]
    text = text.split(" Is the server running", 1)[0].strip()
    return text[:200] or type(orig).__name__


def check_database(url: str, what: str = "database", shown: str | None = None) -> None:
    """Connect to the database of ``url`` once (``SELECT 1``, at most ``CONNECT_TIMEOUT_S`` to connect) and raise
    ``DatabaseUnavailable`` with one line naming ``what``, the URL (password masked), the reason and what to do:
    install the extra for a missing driver, start the server, check the user and password, create the database.
    Anything but a PostgreSQL or MySQL URL is left alone. ``shown``: the URL as the user wrote it, when ``url`` is
    ``with_installed_driver``'s form of it."""
    backend = backend_of(url)
    if backend is None:
        return
    shown = masked_url(shown or url)
    _, extra, brings = BACKENDS[backend]
    driver = named_driver(url) or default_driver(backend)
    missing = driver_error(backend, driver)
    if missing is not None:
        how = (f"pip install '{extra}' (it brings {brings})" if named_driver(url) is None else
               f"install that driver, or pip install '{extra}' and write the URL as {backend}://...")
        raise DatabaseUnavailable(
            f"the {what} {shown} needs a database driver that is not installed ({missing}): {how}"
        )
    from sqlalchemy import create_engine, text  # noqa: PLC0415
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError  # noqa: PLC0415
    from sqlalchemy.pool import NullPool  # noqa: PLC0415

    try:
        engine = create_engine(url, poolclass=NullPool, connect_args=connect_args(url))
    except (ArgumentError, ValueError) as err:
        raise DatabaseUnavailable(f"the {what} {shown} is not a valid database URL ({err})") from None
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except SQLAlchemyError as err:
        reason = failure_reason(err)
        if any(marker in reason for marker in LOGIN_REFUSED):
            problem, todo = "refused the login", "check the user and password in the URL"
        elif any(marker in reason for marker in NO_DATABASE):
            problem, todo = "has no such database", "create it (e.g. createdb <name>) or fix its name in the URL"
        else:
            problem, todo = "does not answer", "start the database server, or fix the host and port in the URL"
        raise DatabaseUnavailable(f"the {what} {shown} {problem} ({reason}): {todo}") from None
    finally:
        engine.dispose()


def usable_database_url(url: str, what: str = "database") -> str:
    """``with_installed_driver(url)``, checked with ``check_database`` (``DatabaseUnavailable`` when it cannot be
    used); any other URL as it is."""
    if not is_database_url(url):
        return url
    usable = with_installed_driver(url)
    check_database(usable, what, shown=url)
    return usable


__all__ = [
    "DatabaseUnavailable",
    "backend_of",
    "check_database",
    "failure_reason",
    "is_database_url",
    "masked_url",
    "usable_database_url",
    "with_installed_driver",
]
