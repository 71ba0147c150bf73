"""Passwords kept out of everything a command prints: the last guard behind ``database_urls.masked_url``.

Every message loopwise writes masks the URLs it names (``masked_url``), but a library's own text may quote a URL
whole: SQLAlchemy's "Could not parse SQLAlchemy URL from string '...'", a driver's or MLflow's exception, a
traceback. While a ``recipes`` command runs, ``passwords_hidden_in_output`` puts a thin writer in front of
``sys.stdout`` and ``sys.stderr`` (and of the logging handlers already writing to them) that replaces each password
it knows by ``***``. It learns the passwords of the tracking URI (``MLFLOW_TRACKING_URI``), of every URL on the
command line (``--storage``, ``--trainer.logger.init_args.tracking_uri``) and of every database or server URL the
command reads later (``remember_password``, called where a URL is taken in: a config file's ``tracking_uri``). Each
is hidden as written, percent-decoded and percent-encoded. Passwords shorter than ``MIN_HIDDEN_CHARS`` are not
searched for in free text (replacing every ``ab`` in the output would garble it); the URLs loopwise prints mask them
all the same.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO
from urllib.parse import quote, unquote

MIN_HIDDEN_CHARS = 4
#: the passwords hidden in this process's output (all the forms each may take)
HIDDEN: set[str] = set()


def password_forms(url: str) -> set[str]:
    """The forms in which the password of ``url`` may be printed: as written, percent-decoded, percent-encoded. For a
    URL whose credentials cannot be read unambiguously (several ``@``), everything between ``://`` and its last ``@``
    after the user name counts as the password. Empty for a URL without one."""
    _, separator, rest = url.partition("://")
    if not separator or "@" not in rest:
        return set()
    userinfo = rest.rsplit("@", 1)[0]
    if ":" not in userinfo:
        return set()
    password = userinfo.split(":", 1)[1]
    forms = {password, unquote(password), quote(unquote(password), safe="")}
    if "@" in password:  # a raw '@': whoever splits at the first one shows the part after it as the host
        forms.add(password.split("@", 1)[1])
    return {form for form in forms if form}


def remember_password(url: str) -> None:
    """Hide the password of ``url`` (if it has one) in this process's output from now on."""
    HIDDEN.update(password_forms(url))


def hide_passwords(text: str) -> str:
    """``text`` with each password known to this process (``HIDDEN``, longest first) replaced by ``***``."""
    for secret in sorted(HIDDEN, key=len, reverse=True):
        if len(secret) >= MIN_HIDDEN_CHARS and secret in text:
            text = text.replace(secret, "***")
    return text


class PasswordHidingWriter:
    """A text stream that writes to ``stream`` with ``hide_passwords`` applied; everything else (``isatty``,
    ``fileno``, ``encoding``, ``flush``) is the stream's own."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        """Write ``text`` without the passwords this process knows."""
        self.stream.write(hide_passwords(text))
        return len(text)

    def writelines(self, lines: Sequence[str]) -> None:
        """``write`` each line."""
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def urls_in(args: Sequence[str]) -> list[str]:
    """The URLs among command-line arguments (``--storage URL``, ``--trainer.logger.init_args.tracking_uri=URL``)."""
    found = []
    for arg in args:
        value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
        if "://" in value:
            found.append(value)
    return found


@contextmanager
def passwords_hidden_in_output(args: Sequence[str]) -> Iterator[None]:
    """While the block runs, ``sys.stdout``, ``sys.stderr`` and the logging handlers writing to them hide the passwords
    of ``MLFLOW_TRACKING_URI``, of the URLs in ``args`` and of those ``remember_password`` learns meanwhile. The
    streams and handlers are put back after."""
    for url in [os.environ.get("MLFLOW_TRACKING_URI", ""), *urls_in(args)]:
        remember_password(url)
    originals = sys.stdout, sys.stderr
    writers = {id(stream): PasswordHidingWriter(stream) for stream in originals}
    handlers = [h for h in all_stream_handlers() if id(h.stream) in writers]
    sys.stdout, sys.stderr = writers[id(originals[0])], writers[id(originals[1])]
    for handler in handlers:
        handler.setStream(writers[id(handler.stream)])  # type: ignore[arg-type]
    try:
        yield
    finally:
        for handler in handlers:
            if isinstance(handler.stream, PasswordHidingWriter):
                handler.setStream(handler.stream.stream)
        if sys.stdout is writers[id(originals[0])]:
            sys.stdout = originals[0]
        if sys.stderr is writers[id(originals[1])]:
            sys.stderr = originals[1]


def all_stream_handlers() -> list[logging.StreamHandler[Any]]:
    """The ``logging.StreamHandler``s of the root logger and of every logger made so far (Lightning's, MLflow's)."""
    made = [log for log in list(logging.root.manager.loggerDict.values()) if isinstance(log, logging.Logger)]
    loggers = [logging.getLogger(), *made]
    return [h for log in loggers for h in log.handlers if type(h) is logging.StreamHandler]


__all__ = [
    "HIDDEN",
    "MIN_HIDDEN_CHARS",
    "PasswordHidingWriter",
    "hide_passwords",
    "password_forms",
    "passwords_hidden_in_output",
    "remember_password",
]
