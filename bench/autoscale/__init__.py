"""``python -m bench autoscale``: a simulator of the Kubernetes HPA/KEDA loop scaling rowbatch
consumers, to compare scaling signals and choose their targets (docs/autoscaling.md).

Modules: ``traces`` (arrival traces), ``hpa`` (the HPA algorithm), ``fleet`` (consumers and
backlog), ``signals`` (the metrics and their delays), ``scenarios`` (what is compared),
``oracle`` (the minimum replica-minutes), ``run`` (one run), ``sweep`` (the recommendation),
``report`` (tables, JSON), ``cli``; for model servers slower than the load (``--only
server-bound``): ``consumer_figure`` (the figure through the consumer's own signal and
safeguards), ``server_bound`` (the cases, with and without the server-saturated safeguard),
``server_bound_report``."""

from bench.autoscale.cli import main

__all__ = ["main"]
