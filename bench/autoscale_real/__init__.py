"""``python -m bench autoscale_real``: the autoscaling loop on the real stack, against the
simulator's prediction for the same arrivals.

A burst of rows 5-10x what one consumer drains within its target latency is published to Kafka
(6 partitions) or Pub/Sub between steady phases; consumer processes are started and stopped by
``controller.py``, which applies the HPA's rule to their ``rowbatch_desired_replicas``
on a clock ``--time-scale`` times faster than the HPA's. The model is ``fixed_latency`` on
three instances with one request in flight per consumer, so a consumer's throughput, not this
machine's CPUs, sets how many are needed. Per run: latency (publish to inference answered,
per row from the result table), replica-seconds, scale events and direction reversals, rows
written exactly once; then ``bench/autoscale``'s fleet and HPA replay the same arrivals with
the measured per-replica rate and start-up, scaled to HPA time, and report the same figures.

    python -m bench autoscale_real                       both brokers, the long plan
    python -m bench autoscale_real --broker kafka --short --out /tmp/autoscale-real.json

Modules: ``stack`` (the model, topics, consumer configuration, a paced publisher, the result
table), ``run`` (one burst under the controller), ``compare`` (the simulator on the same
arrivals, and the table), ``cli``.
"""

from bench.autoscale_real.cli import main

__all__ = ["main"]
