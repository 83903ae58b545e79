"""A throwaway PostgreSQL server for the tests: `initdb` and `pg_ctl` in a temporary folder, on 127.0.0.1.

It runs Debian's `postgresql` package (`make test` installs it when missing), or any PostgreSQL whose
`initdb` is on the PATH. PostgreSQL refuses to run as root: as root, its commands run as the
`postgres` user (`runuser`), which the package creates. Authentication is `trust`, on 127.0.0.1 only.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from benchmarks.server_process import free_port

SUPERUSER = "postgres"


def postgres_bin() -> Path | None:
    """The folder of PostgreSQL's programs (the newest Debian version, else `initdb` on the PATH), if any."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def _version(initdb: str) -> tuple[int, ...]:
    """`/usr/lib/postgresql/15/bin/initdb` -> (15,)."""
    return tuple(int(part) for part in Path(initdb).parents[1].name.split(".") if part.isdigit())


@dataclass
class PostgresServer:
    """A running server: where it lives and how to reach it."""

    bin: Path
    folder: Path
    port: int
    run_as: str | None

    def url(self, database: str = "postgres") -> str:
        """A URL for `database`, as a user passes it to `--database-url`."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A new, empty database; returns its URL."""
        import psycopg

        name = f"test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        """Stop the server at once and remove its files."""
        self._run("pg_ctl", "-D", str(self.folder / "data"), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _run(self, program: str, *arguments: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / program), *arguments]
        if self.run_as is not None:
            command = ["runuser", "-u", self.run_as, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=self.folder)
        if check and done.returncode != 0:
            log = self.folder / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{program} failed ({done.returncode}): {done.stdout}{done.stderr}{tail}")
        return done


def start_postgres(bin_folder: Path) -> PostgresServer:
    """Create a cluster in a new temporary folder and start it on a free port of 127.0.0.1.

    Raises:
        RuntimeError: It could not be created or started (the message has PostgreSQL's own words).
    """
    run_as = _unprivileged_user()
    folder = Path(tempfile.mkdtemp(prefix="batcher-pg-"))
    if run_as is not None:
        account = pwd.getpwnam(run_as)
        os.chown(folder, account.pw_uid, account.pw_gid)
    server = PostgresServer(bin_folder, folder, free_port(), run_as)
    data = str(folder / "data")
    try:
        server._run("initdb", "-D", data, "-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
        options = f"-h 127.0.0.1 -p {server.port} -k {folder} -c fsync=off -c full_page_writes=off"
        server._run("pg_ctl", "-D", data, "-l", str(folder / "server.log"), "-o", options, "-w", "-t", "60", "start")
    except BaseException:
        server.stop()
        raise
    return server


def _unprivileged_user() -> str | None:
    """`None` when this process may run PostgreSQL itself; as root, the `postgres` user to run it as.

    Raises:
        RuntimeError: Root, and no `postgres` user to run it as.
    """
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SUPERUSER)
    except KeyError:
        raise RuntimeError("PostgreSQL refuses to run as root, and there is no 'postgres' user to run it as") from None
    if shutil.which("runuser") is None:
        raise RuntimeError("PostgreSQL refuses to run as root, and 'runuser' is missing to run it as 'postgres'")
    return SUPERUSER
