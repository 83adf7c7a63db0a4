"""An S3-compatible object store for tests: moto's server mode (``python -m moto.server``, from
the ``moto[server]`` dev dependency) on a free loopback port, read through pyarrow's filesystems.

moto keeps every bucket in memory, so each session starts empty; it accepts any credentials (and
unsigned requests), so the fixed ``testing`` keys below only need to be present, not right.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import quote

import pyarrow.fs as pafs

from harness.errors import PrerequisiteMissing
from harness.proc import LOOPBACK, ServiceProcess, free_port
from harness.service import ManagedService, RunDir

ACCESS_KEY = "testing"
SECRET_KEY = "testing"  # noqa: S105 - moto accepts any key; not a secret
REGION = "us-east-1"
_READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class S3Endpoint:
    """Where the S3 server listens, and how pyarrow (here or in a child process) reaches it."""

    host: str
    port: int

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:PORT``, for clients that take a full URL (boto3, the AWS CLI)."""
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        """What a child process needs for pyarrow's (the AWS SDK's) default credential chain to
        find credentials at once, without asking the EC2 metadata service (169.254.169.254).
        The endpoint itself travels in the ``url`` (pyarrow reads no endpoint variable)."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def filesystem(self, *, allow_bucket_creation: bool = False) -> pafs.S3FileSystem:
        """A pyarrow filesystem bound to this server whatever the environment says; paths are
        ``bucket/key``."""
        return pafs.S3FileSystem(
            endpoint_override=f"{self.host}:{self.port}",
            scheme="http",
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            allow_bucket_creation=allow_bucket_creation,
        )

    def url(self, bucket: str, key: str = "") -> str:
        """``s3://bucket/key?endpoint_override=127.0.0.1:PORT&scheme=http``, which
        ``pyarrow.fs.FileSystem.from_uri`` turns into an S3FileSystem for this server and the
        path ``bucket/key``. pyarrow rejects query parameters it does not know; the URL carries
        no credentials, which come from the environment (``env()``), or are absent (moto then
        takes unsigned requests). The key is percent-encoded; pyarrow decodes it."""
        path = quote(key.lstrip("/"), safe="/=")
        return f"s3://{bucket}/{path}?endpoint_override={self.host}:{self.port}&scheme=http"

    def create_bucket(self, name: str) -> None:
        """Create a bucket (pyarrow's S3FileSystem refuses to unless allow_bucket_creation)."""
        self.filesystem(allow_bucket_creation=True).create_dir(name)


class S3Service(ManagedService[S3Endpoint]):
    name = "s3"

    def __init__(self, run: RunDir) -> None:
        self._run = run
        self._proc: ServiceProcess | None = None

    def start(self) -> S3Endpoint:
        if importlib.util.find_spec("moto") is None:
            raise PrerequisiteMissing(
                f"moto's S3 server (the moto[server] package) in {sys.executable}",
                "scripts/setup.sh (installs the dev extra), or pip install 'moto[server]>=5,<6'",
            )
        port = free_port()
        endpoint = S3Endpoint(host=LOOPBACK, port=port)
        self._proc = ServiceProcess(
            name="s3 (moto)",
            argv=[sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)],
            log_path=self._run.log("s3"),
            cwd=self._run.data("s3"),
            env=dict(os.environ),
        )
        self._proc.start()
        self._proc.wait_ready(lambda: _answers(endpoint), timeout_s=_READY_TIMEOUT_S)
        return endpoint

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None


def _answers(endpoint: S3Endpoint) -> bool:
    """Ready when a real S3 ListBuckets call (``GET /``) answers with its XML."""
    try:
        with urllib.request.urlopen(f"{endpoint.endpoint_url}/", timeout=2) as response:  # noqa: S310 - our own http://127.0.0.1 URL
            body: bytes = response.read()
    except (urllib.error.URLError, OSError):
        return False
    return b"ListAllMyBucketsResult" in body


__all__ = ["S3Endpoint", "S3Service"]
