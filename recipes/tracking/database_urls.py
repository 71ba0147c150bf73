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

from recipes.tracking.hidden_passwords import remember_password

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


class AmbiguousCredentials(ValueError):
    """A URL whose user name or password cannot be read unambiguously: a raw ``@`` in it (more than one ``@`` before
    the host), a raw ``#`` or ``?`` (or, in a server URL, ``/``). Its message holds no part of the credentials."""


def credentials_problem(url: str) -> str | None:
    """Why the user name and password of ``url`` cannot be told apart from the rest, or ``None`` when they can (or
    there are none). SQLAlchemy reads the password up to the first ``@`` and ``urllib`` (so ``requests``) up to the
    first ``/``, ``?`` or ``#``: a raw ``@`` in a password makes both misplace the host, and part of the password
    would be shown as part of it; a raw ``#`` or ``?`` ends the authority for ``urllib``."""
    scheme, separator, rest = url.partition("://")
    if not separator or "@" not in rest:
        return None
    if rest.count("@") > 1:
        return "more than one '@'"
    userinfo = rest.split("@", 1)[0]
    raw = [c for c in ("#", "?") if c in userinfo]
    if "/" in userinfo and not is_database_url(url):  # SQLAlchemy reads a raw '/' in a password; urllib does not
        raw.append("/")
    return f"a raw {' and '.join(repr(c) for c in raw)} in it" if raw else None


def refuse_ambiguous_credentials(url: str, what: str = "database URL") -> None:
    """Raise ``AmbiguousCredentials`` (one line, no part of the user name or password) when ``credentials_problem``
    finds one in ``url``; say to percent-encode the password."""
    problem = credentials_problem(url)
    if problem is None:
        return
    scheme = url.split("://", 1)[0]
    raise AmbiguousCredentials(
        f"the {what} ({scheme}://...) has a user name or password that cannot be read unambiguously ({problem}): "
        "percent-encode the password (in Python: urllib.parse.quote(password, safe=''); '@' is %40, '#' %23, "
        "'?' %3F, '/' %2F, ':' %3A) and write the URL again"
    )


def masked_url(url: str) -> str:
    """``url`` with its password shown as ``***`` (for messages, logs and MLflow params). A database URL is read as
    SQLAlchemy reads it (``make_url(...).render_as_string(hide_password=True)``: the user, host and database shown are
    the ones it connects to); a server URL is split at its one ``@``. A URL whose credentials cannot be read
    unambiguously (``credentials_problem``) shows none of them: ``postgresql://***@...``."""
    scheme, separator, rest = url.partition("://")
    if not separator or "@" not in rest:
        return url
    remember_password(url)  # and hidden wherever else it may be printed (hidden_passwords)
    if credentials_problem(url) is not None:
        return f"{scheme}://***@..."
    userinfo, _, after = rest.partition("@")
    if ":" not in userinfo:
        return url
    if is_database_url(url):
        from sqlalchemy.engine import make_url  # noqa: PLC0415
        from sqlalchemy.exc import ArgumentError  # noqa: PLC0415

        try:
            return make_url(url).render_as_string(hide_password=True)
        except (ArgumentError, ValueError):
            pass
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{after}"


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
    says so), comes back as it is. A database URL whose credentials cannot be read unambiguously is refused
    (``AmbiguousCredentials``, ``refuse_ambiguous_credentials``); its password is hidden in this process's output from
    now on (``hidden_passwords``)."""
    backend = backend_of(url)
    if backend is None:
        return url
    remember_password(url)
    refuse_ambiguous_credentials(url, "database URL")
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
    "AmbiguousCredentials",
    "DatabaseUnavailable",
    "backend_of",
    "check_database",
    "credentials_problem",
    "failure_reason",
    "is_database_url",
    "masked_url",
    "refuse_ambiguous_credentials",
    "usable_database_url",
    "with_installed_driver",
]
