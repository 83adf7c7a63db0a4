"""rowbatch consumer: the subscriber service. A message travels ``sources`` (broker
adapters) -> ``engine`` (intake, batching, budget, ledger, pipeline, writer) -> ``model``
(discovery, binding, the inference client) -> ``sinks`` (result tables); ``service`` wires
them (config, CLI, health server, logs) and ``observe`` holds the metrics and the autoscaling
signal used by both. See docs/architecture.md."""

__version__ = "0.1.0"
