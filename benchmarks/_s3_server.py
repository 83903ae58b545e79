"""A real S3-compatible server on this machine (moto's, in a process of its own) holding a model folder.

The tests of models in object storage and the streaming benchmark start it themselves: `S3Server` runs
`python -m benchmarks._s3_server PORT`, and `upload_folder` puts a local model folder under a prefix with
boto3, as a user's `aws s3 cp --recursive` would.

One change to moto, here only: moto reads an object whole for every ranged GET (for a 538 MB checkpoint
fetched as 16 MiB ranges, 34 full reads: 180 s on this machine); the server keeps each object's bytes
once, so a ranged GET copies only its range. What a client sees is unchanged.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

ACCESS_KEY_ID = "AKIATESTBATCHER0001"
SECRET_ACCESS_KEY = "s3cr3t-test-key-never-printed-0001"
"""The credentials the tests give the server's clients: a test asserts that no output shows the secret."""

REGION = "us-east-1"


class S3Server:
    """moto's S3 server on a free loopback port, in its own process, until `stop()`.

    Example:
        ```python
        with S3Server.running() as server:
            server.upload_folder(bundled_smollm2_path(), "models", "smollm2")
            os.environ.update(server.environment())
        ```
    """

    def __init__(self) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        root = Path(__file__).resolve().parent.parent
        self._process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks._s3_server", str(self.port)],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._wait_ready()

    @classmethod
    @contextlib.contextmanager
    def running(cls) -> Iterator[S3Server]:
        """A server for the `with` block."""
        server = cls()
        try:
            yield server
        finally:
            server.stop()

    def environment(self) -> dict[str, str]:
        """The standard AWS variables that point boto3 and obstore (so Flyte's storage) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def client(self) -> object:
        """A boto3 S3 client of this server."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key=SECRET_ACCESS_KEY,
            region_name=REGION,
        )

    def upload_folder(self, folder: Path | str, bucket: str, prefix: str, only: Mapping[str, str] | None = None) -> str:
        """Upload every file of `folder` under `s3://bucket/prefix/` (creating the bucket); its URI.

        Args:
            only: When given, upload these files only (name in the folder -> name under the prefix).
        """
        client = self.client()
        with contextlib.suppress(Exception):  # it exists already
            client.create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
        folder = Path(folder)
        names = dict(only) if only is not None else {path.name: path.name for path in folder.iterdir()}
        for local, remote in names.items():
            client.upload_file(str(folder / local), bucket, f"{prefix}/{remote}")  # type: ignore[attr-defined]
        return f"s3://{bucket}/{prefix}"

    def stop(self) -> None:
        """Stop the server's process."""
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def _wait_ready(self, limit_s: float = 60.0) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"the S3 server exited with {self._process.returncode} (is moto[server] installed?)")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2).close()
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the S3 server did not answer on {self.endpoint} within {limit_s:.0f} s")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _serve(port: int) -> None:
    """Run moto's S3 server (objects kept once in memory: see the module's notes) until killed."""
    import logging

    import moto.s3.models as s3_models
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    read_whole = s3_models.FakeKey.value

    def kept_value(key: s3_models.FakeKey) -> bytes:
        kept = key.__dict__.get("_kept_value")
        if kept is None or kept[0] != key.contentsize:
            kept = (key.contentsize, read_whole.fget(key))  # type: ignore[attr-defined]
            key.__dict__["_kept_value"] = kept
        return kept[1]

    s3_models.FakeKey.value = property(kept_value, read_whole.fset)  # type: ignore[method-assign, assignment]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
