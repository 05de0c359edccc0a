"""Throwaway PostgreSQL servers for the test suite.

:class:`PostgresCluster` runs ``initdb`` into a fresh temporary directory, starts a private
``postgres`` on a free TCP port of 127.0.0.1 (durability switched off, so it is fast), creates
one database and hands out SQLAlchemy URLs. :meth:`PostgresCluster.stop` shuts it down with
``pg_ctl -m immediate`` and deletes the directory.

PostgreSQL refuses to run as root, so when the tests run as root the server's commands run as
the ``postgres`` system user (override with ``SEMANTIC_ORM_TEST_PG_OS_USER``). The cluster
lives in ``/dev/shm`` when that is a roomy tmpfs, else in ``/tmp`` (override the parent
directory with ``SEMANTIC_ORM_TEST_PG_TMPDIR``; the server user must be able to reach it).

Set ``SEMANTIC_ORM_TEST_PG_URL`` (e.g. ``postgresql+psycopg://me:pw@db.local:5432/postgres``)
to use an existing server instead; :func:`start_server` then starts nothing. That role needs
the CREATEDB privilege, because the fixtures create (and drop) a database per test.

Usable on its own::

    with PostgresCluster() as pg:
        engine = sqlalchemy.create_engine(pg.url)
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL, make_url

ENV_URL = "SEMANTIC_ORM_TEST_PG_URL"
ENV_OS_USER = "SEMANTIC_ORM_TEST_PG_OS_USER"
ENV_BINDIR = "SEMANTIC_ORM_TEST_PG_BINDIR"
ENV_TMPDIR = "SEMANTIC_ORM_TEST_PG_TMPDIR"

#: Server settings: no durability (it is thrown away) and TCP on loopback only.
SERVER_SETTINGS: dict[str, str] = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
}


class PostgresUnavailable(RuntimeError):
    """PostgreSQL cannot be started here (binaries or a usable OS user are missing)."""


def _pg_version_key(bindir: str) -> tuple[int, ...]:
    match = re.search(r"/postgresql/(\d+(?:\.\d+)*)/bin", bindir)
    return tuple(int(p) for p in match.group(1).split(".")) if match else (0,)


def find_bindir() -> Path:
    """Directory holding ``initdb``/``pg_ctl``/``postgres``.

    Order: ``$SEMANTIC_ORM_TEST_PG_BINDIR``, ``pg_config --bindir``, the newest
    ``/usr/lib/postgresql/*/bin`` (Debian/Ubuntu), then ``$PATH``.
    """
    candidates: list[str] = []
    if os.environ.get(ENV_BINDIR):
        candidates.append(os.environ[ENV_BINDIR])
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=30
            ).stdout.strip()
            if out:
                candidates.append(out)
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_pg_version_key, reverse=True)
    initdb_on_path = shutil.which("initdb")
    if initdb_on_path:
        candidates.append(str(Path(initdb_on_path).parent))
    for candidate in candidates:
        path = Path(candidate)
        if all(os.access(path / tool, os.X_OK) for tool in ("initdb", "pg_ctl", "postgres")):
            return path
    raise PostgresUnavailable(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found; looked in "
        f"{candidates or ['(nothing: no pg_config, no /usr/lib/postgresql/*/bin)']}. Install the "
        f"PostgreSQL server (e.g. `apt-get install postgresql`), set {ENV_BINDIR}, point "
        f"{ENV_URL} at an existing server, or deselect these tests with -m 'not postgres'."
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class PostgresServer:
    """A reachable server whose role may create databases; base of :class:`PostgresCluster`.

    ``admin_url`` is where ``CREATE/DROP DATABASE`` are issued; ``url`` is the default
    database for tests.
    """

    def __init__(self, admin_url: URL | str, url: URL | str | None = None) -> None:
        self.admin_url: URL = self._psycopg(make_url(admin_url))
        self.url: URL = self._psycopg(make_url(url)) if url is not None else self.admin_url

    @staticmethod
    def _psycopg(url: URL) -> URL:
        if url.drivername in ("postgresql", "postgres"):
            url = url.set(drivername="postgresql+psycopg")
        return url

    @staticmethod
    def _conninfo(url: URL) -> dict[str, Any]:
        info: dict[str, Any] = {
            "host": url.host,
            "port": url.port,
            "user": url.username,
            "password": url.password,
            "dbname": url.database,
        }
        return {k: v for k, v in info.items() if v is not None}

    def _admin_execute(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(**self._conninfo(self.admin_url), autocommit=True) as conn:
            conn.execute(sql.encode())

    def url_for(self, database: str) -> URL:
        """SQLAlchemy URL of ``database`` on this server."""
        return self.url.set(database=database)

    def create_database(self, name: str | None = None) -> URL:
        """``CREATE DATABASE`` (a ``test_<hex>`` name by default); returns its URL."""
        name = name or f"test_{uuid.uuid4().hex}"
        # FILE_COPY: for a small template it is faster than PG15's WAL_LOG default.
        try:
            self._admin_execute(
                f"CREATE DATABASE {_quote_ident(name)} TEMPLATE template0 "
                "ENCODING 'UTF8' STRATEGY FILE_COPY"
            )
        except Exception as exc:  # PostgreSQL < 15 has no STRATEGY
            if "strategy" not in str(exc).lower():
                raise
            self._admin_execute(
                f"CREATE DATABASE {_quote_ident(name)} TEMPLATE template0 ENCODING 'UTF8'"
            )
        return self.url_for(name)

    def drop_database(self, name: str) -> None:
        """``DROP DATABASE IF EXISTS ... WITH (FORCE)``: closes leftover connections too."""
        self._admin_execute(f"DROP DATABASE IF EXISTS {_quote_ident(name)} WITH (FORCE)")

    def stop(self) -> None:
        """Nothing to stop for an external server."""

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class PostgresCluster(PostgresServer):
    """A private PostgreSQL cluster in a temporary directory (see the module docstring).

    ``start()`` (or ``with``) runs it, ``stop()`` removes it; ``stop()`` is idempotent and is
    also registered with :mod:`atexit` so an aborted run leaves no server behind.
    """

    def __init__(
        self,
        *,
        database: str = "semantic_orm_test",
        bindir: Path | str | None = None,
        os_user: str | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        # admin_url / url are set by start(); PostgresServer.__init__ is deliberately not called.
        self.database = database
        self.bindir = Path(bindir) if bindir else None
        self.os_user = os_user
        self.host = host
        self.port: int | None = None
        self.root: Path | None = None
        self._uid: int | None = None
        self._gid: int | None = None
        self.start_seconds: float | None = None

    # -- paths ------------------------------------------------------------------------------
    @property
    def datadir(self) -> Path:
        assert self.root is not None, "cluster not started"
        return self.root / "data"

    @property
    def sockdir(self) -> Path:
        assert self.root is not None, "cluster not started"
        return self.root / "sock"

    @property
    def logfile(self) -> Path:
        assert self.root is not None, "cluster not started"
        return self.root / "postgres.log"

    @property
    def running(self) -> bool:
        return self.root is not None and self.port is not None

    # -- process helpers ----------------------------------------------------------------------
    def _resolve_user(self) -> None:
        if os.geteuid() != 0:
            return  # run as ourselves
        name = self.os_user or os.environ.get(ENV_OS_USER) or "postgres"
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise PostgresUnavailable(
                f"running as root, and PostgreSQL refuses to run as root, but there is no "
                f"{name!r} user to run it as. Create one (`useradd --system postgres`), set "
                f"{ENV_OS_USER} to another non-root user, or set {ENV_URL}."
            ) from None
        if entry.pw_uid == 0:
            raise PostgresUnavailable(f"{ENV_OS_USER}={name!r} is root; pick a non-root user")
        self._uid, self._gid = entry.pw_uid, entry.pw_gid

    def _run(self, tool: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        assert self.bindir is not None and self.root is not None
        kwargs: dict[str, Any] = {}
        env = dict(os.environ, LC_MESSAGES="C")
        env.pop("PGDATA", None)
        if self._uid is not None:
            # Drop to the unprivileged user just for this child (like `runuser -u postgres`).
            kwargs.update(user=self._uid, group=self._gid, extra_groups=[])
            env["HOME"] = str(self.root)
        return subprocess.run(
            [str(self.bindir / tool), *args],
            cwd=self.root,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **kwargs,
        )

    def _check(self, proc: subprocess.CompletedProcess[str], what: str) -> None:
        if proc.returncode == 0:
            return
        log = ""
        with contextlib.suppress(OSError, AssertionError):
            log = "\n".join(self.logfile.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(
            f"{what} failed (exit {proc.returncode}): {' '.join(map(str, proc.args))}\n"
            f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
            + (f"\n--- {self.logfile}\n{log}" if log else "")
        )

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> PostgresCluster:
        """initdb, start the server and create :attr:`database`; returns ``self``."""
        if self.running:
            return self
        t0 = time.perf_counter()
        self.bindir = self.bindir or find_bindir()
        self._resolve_user()
        self.root = Path(tempfile.mkdtemp(prefix="semantic-orm-pg-", dir=self._base_dir()))
        atexit.register(self.stop)
        try:
            self.sockdir.mkdir()
            if self._uid is not None:
                for path in (self.root, self.sockdir):
                    os.chown(path, self._uid, self._gid if self._gid is not None else -1)
            self._initdb()
            self._start_server()
            self.admin_url = self.url = URL.create(
                "postgresql+psycopg",
                username="postgres",
                host=self.host,
                port=self.port,
                database="postgres",
            )
            self.url = self.create_database(self.database)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.perf_counter() - t0
        return self

    def _base_dir(self) -> str | None:
        """Where the cluster directory goes.

        ``$SEMANTIC_ORM_TEST_PG_TMPDIR`` if set, else ``/dev/shm`` when it is a tmpfs with room
        (CREATE DATABASE there takes ~10 ms instead of ~250 ms on disk), else ``/tmp`` when
        running as root (pytest's own tmp dirs are 0700: the server user could not reach
        them), else the default temp dir.
        """
        if os.environ.get(ENV_TMPDIR):
            return os.environ[ENV_TMPDIR]
        with contextlib.suppress(OSError):
            st = os.statvfs("/dev/shm")
            if os.access("/dev/shm", os.W_OK | os.X_OK) and st.f_bavail * st.f_frsize >= 1 << 30:
                return "/dev/shm"
        if self._uid is not None and os.path.isdir("/tmp"):
            return "/tmp"
        return None

    def _initdb(self) -> None:
        common = ["-D", str(self.datadir), "-A", "trust", "-U", "postgres", "--no-sync"]
        proc = self._run("initdb", *common, "-E", "UTF8", "--locale=C.UTF-8")
        if proc.returncode != 0 and "locale" in (proc.stderr + proc.stdout).lower():
            shutil.rmtree(self.datadir, ignore_errors=True)
            proc = self._run("initdb", *common, "-E", "UTF8", "--no-locale")
        self._check(proc, "initdb")

    def _start_server(self, attempts: int = 3) -> None:
        for attempt in range(attempts):
            port = free_port(self.host)
            settings = {**SERVER_SETTINGS, "listen_addresses": self.host}
            options = f"-p {port} -k {self.sockdir} " + " ".join(
                f"-c {key}={value}" for key, value in settings.items()
            )
            proc = self._run(
                "pg_ctl", "-D", str(self.datadir), "-l", str(self.logfile), "-w", "-t", "60",
                "-o", options, "start",
            )  # fmt: skip
            if proc.returncode == 0:
                self.port = port
                return
            if attempt == attempts - 1:  # a lost race for the port is the usual reason
                self._check(proc, "pg_ctl start")

    def stop(self) -> None:
        """Stop the server (``pg_ctl -m immediate stop``) and delete its directory."""
        root, self.root = self.root, None
        port, self.port = self.port, None
        if root is None:
            return
        with contextlib.suppress(ValueError):
            atexit.unregister(self.stop)
        datadir = root / "data"
        if port is not None or (datadir / "postmaster.pid").exists():
            self.root = root  # _run needs it
            try:
                proc = self._run("pg_ctl", "-D", str(datadir), "-m", "immediate", "-w", "stop")
                if proc.returncode != 0:
                    self._kill_postmaster(datadir)
            except (OSError, subprocess.SubprocessError):
                self._kill_postmaster(datadir)
            finally:
                self.root = None
        shutil.rmtree(root, ignore_errors=True)

    @staticmethod
    def _kill_postmaster(datadir: Path) -> None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((datadir / "postmaster.pid").read_text().splitlines()[0])
            os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> PostgresCluster:
        return self.start()

    def __repr__(self) -> str:
        state = f"port={self.port}" if self.running else "stopped"
        return f"<PostgresCluster {state} root={self.root}>"


def start_server() -> PostgresServer:
    """``$SEMANTIC_ORM_TEST_PG_URL`` as a :class:`PostgresServer`, else a started cluster."""
    external = os.environ.get(ENV_URL)
    if external:
        return PostgresServer(external)
    return PostgresCluster().start()
