"""``python -m bench``: rowbatch's benchmarks on the real local stack.

Sections (``--only``): ``ceiling`` (Triton's own saturated throughput), ``e2e`` (a backlog
drained by one consumer process into each sink, on both brokers), ``naive`` (a consumer written
the common way, for comparison), ``overhead`` (consumer CPU per row against no-op models, and a
profile by stage), ``latency`` (publish-to-written percentiles under steady load), ``memory``
(peak RSS against the budget) and ``scaling`` (1, 2, 3 consumer processes against
``fixed_latency``). Each prints a table; all of it goes to one JSON file. See
docs/benchmarks.md.
"""
