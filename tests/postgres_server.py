"""A real PostgreSQL server for the tests: the binaries of the ``pgserver`` package (PyPI, in the dev extra), else the
machine's own (``/usr/lib/postgresql/<version>/bin``, ``initdb`` on the PATH); the tests that use it are skipped,
with the reason, only when neither can start.

The server listens on a free port of 127.0.0.1 with password authentication (``USER``/``PASSWORD``), so the tests
use the URLs a team writes (``postgresql://loopwise:<password>@127.0.0.1:<port>/<database>``). PostgreSQL refuses
to run as root: under root it runs as the ``postgres`` user (else ``nobody``), its data in a folder that user owns.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

USER = "loopwise"
PASSWORD = "pg-s3cret"
START_TIMEOUT_S = 60


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def postgres_bin_dirs() -> list[Path]:
    """Folders holding ``initdb`` and ``postgres``: pgserver's first, then the machine's (newest version first)."""
    found: list[Path] = []
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.submodule_search_locations:  # located, not imported (its import makes lock files)
        found += [Path(p) / "pginstall" / "bin" for p in spec.submodule_search_locations]
    found += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name)
                    if p.parent.name.isdigit() else 0, reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        found.append(Path(on_path).parent)
    return [d for d in found if (d / "initdb").is_file() and (d / "postgres").is_file()]


def server_user() -> str | None:
    """The user PostgreSQL runs as: this one, or under root ``postgres`` (else ``nobody``)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    return None


class PostgresServer:
    """One PostgreSQL server started from ``bin_dir`` (``start``/``stop``), its databases and URLs."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.user = server_user()
        self.root = Path(tempfile.mkdtemp(prefix="loopwise-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.log = self.root / "postgres.log"

    def _run_as(self) -> dict:
        return {"user": self.user} if self.user else {}

    def start(self) -> None:
        """initdb (password authentication over TCP) and the server on ``self.port``; waits until it answers."""
        self.root.chmod(0o755)
        password_file = self.root / "password"
        password_file.write_text(PASSWORD + "\n")
        if self.user:
            entry = pwd.getpwnam(self.user)
            for path in (self.root, password_file):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        subprocess.run(
            [str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", USER, f"--pwfile={password_file}",
             "--auth-host=scram-sha-256", "--auth-local=trust", "--encoding=UTF8", "--no-sync"],
            check=True, capture_output=True, text=True, timeout=120, cwd=self.root, **self._run_as(),
        )
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [str(self.bin_dir / "postgres"), "-D", str(self.data), "-h", "127.0.0.1", "-p", str(self.port),
                 "-k", str(self.root), "-c", "fsync=off", "-c", "synchronous_commit=off",
                 "-c", "full_page_writes=off", "-c", "max_connections=100"],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.root, **self._run_as(),
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def answers(self) -> bool:
        """Whether the server accepts a login now."""
        import psycopg

        try:
            psycopg.connect(self.dsn("postgres"), connect_timeout=2).close()
            return True
        except psycopg.OperationalError:
            return False

    def dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user={USER} password={PASSWORD} dbname={database}"

    def create_database(self, name: str) -> str:
        """A new empty database ``name``; its ``postgresql://`` URL."""
        import psycopg

        with psycopg.connect(self.dsn("postgres"), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def url(self, database: str, password: str = PASSWORD, scheme: str = "postgresql") -> str:
        """``postgresql://loopwise:<password>@127.0.0.1:<port>/<database>``."""
        return f"{scheme}://{USER}:{password}@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        """Fast shutdown (SIGINT), killed after 15 s; the data removed."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def start_postgres() -> PostgresServer:
    """A running server from the first binaries that start; ``pytest.skip`` naming why none did."""
    if importlib.util.find_spec("psycopg") is None:
        pytest.skip("psycopg is not installed: pip install 'loopwise[postgres]' (the dev extra has it)")
    dirs = postgres_bin_dirs()
    if not dirs:
        pytest.skip("no PostgreSQL to start: neither the pgserver package (pip install pgserver) nor the machine's "
                    "initdb/postgres (/usr/lib/postgresql/<version>/bin, PATH) is installed")
    failures = []
    for bin_dir in dirs:
        server = PostgresServer(bin_dir)
        try:
            server.start()
            return server
        except (OSError, RuntimeError, subprocess.SubprocessError) as err:
            detail = getattr(err, "stderr", None) or str(err)
            failures.append(f"{bin_dir}: {str(detail).strip()[-300:]}")
            server.stop()
    pytest.skip("PostgreSQL could not start: " + " | ".join(failures))


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server for the session (per xdist worker)."""
    server = start_postgres()
    try:
        yield server
    finally:
        server.stop()
