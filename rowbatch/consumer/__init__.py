"""rowbatch consumer, the subscriber service: a message travels ``sources`` (broker adapters)
-> ``engine`` (intake, batcher, byte budget, inference and writer stages, ledger) -> ``model``
(discovery, binding, the retrying inference client) -> ``sinks`` (result tables), with
``service`` (config, CLI, wiring, health server, logs) on top and ``observe`` (metrics, the
autoscaling signal) below them all; docs/architecture.md describes the flow."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rowbatch")
    """The installed distribution's version: pyproject.toml's ``version``, declared there only."""
except PackageNotFoundError:  # run from a source tree that is not installed
    __version__ = "0+unknown"
