"""``python -m bench autoscale``: a simulator of the Kubernetes HPA/KEDA loop scaling rowbatch
consumers, to compare scaling signals and choose their targets (docs/autoscaling.md).

Modules: ``traces`` (arrival traces), ``hpa`` (the HPA algorithm), ``fleet`` (consumers and
backlog), ``signals`` (the metrics and their delays), ``scenarios`` (what is compared),
``oracle`` (the minimum replica-minutes), ``run`` (one run), ``sweep`` (the recommendation),
``report`` (tables, JSON), ``cli``."""

from bench.autoscale.cli import main

__all__ = ["main"]
