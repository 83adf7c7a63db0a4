"""The seam every launcher implements, and where launchers keep their files."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Generic, Protocol, TypeVar

REPO_ROOT = Path(__file__).resolve().parent.parent

EndpointT_co = TypeVar("EndpointT_co", covariant=True)
EndpointT = TypeVar("EndpointT")


def cache_dir() -> Path:
    """Downloads kept between runs (Kafka jars, the pstest binary): ``$ROWBATCH_CACHE`` or
    ``~/.cache/rowbatch``; outside the checkout so a fresh clone on the same machine reuses it."""
    root = os.environ.get("ROWBATCH_CACHE") or str(Path.home() / ".cache" / "rowbatch")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass(frozen=True)
class RunDir:
    """Per-run files: ``<root>/<service>/`` for data, ``<root>/logs/<service>.log`` for logs."""

    root: Path

    def data(self, service: str) -> Path:
        path = self.root / service
        path.mkdir(parents=True, exist_ok=True)
        return path

    def log(self, service: str) -> Path:
        path = self.root / "logs" / f"{service}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


class Service(Protocol[EndpointT_co]):
    """A real service process: ``start`` blocks until a real client call succeeds."""

    name: str

    def start(self) -> EndpointT_co: ...

    def stop(self) -> None: ...


class ManagedService(Generic[EndpointT]):
    """Context-manager plumbing shared by launchers: ``with XService(run) as endpoint:``."""

    name: str = "service"

    def start(self) -> EndpointT:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> EndpointT:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
