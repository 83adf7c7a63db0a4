"""CPU cost per row of the consumer's hot path, in-process, no services (``python -m
bench.hot_path``, or ``scripts/profile_hot_path.py``).

Pre-encoded messages (chunks of ``--chunk-rows`` rows, JSON or Arrow, text or numeric rows) run
through the real ``Pipeline`` (intake -> batcher -> tensor building -> result rows -> sink ->
ledger/ack) with a fake source and a fake Triton client that encodes the real gRPC request
(protobuf) but runs no model. Reported: CPU microseconds per row (``time.process_time``, all
threads), in total and by stage (``time.thread_time`` of the stage's functions, exclusive of
nested stages; ``other`` is the rest: asyncio, metrics, pipeline glue).

Rows: ``text`` = ``id`` int64 + ``text`` (64 characters) -> ``embedder`` (TEXT -> EMBEDDING
fp32[384]); ``numeric`` = ``id`` + ``features`` vector[float32,16] + ``count`` int64 ->
``scorer`` (FEATURES, COUNT -> SCORE fp32, LABEL int32). ``id`` passes through.

Sinks: ``sqlite`` and ``parquet`` (real, in a temporary directory) and ``pg-encode`` (the
PostgreSQL sink's binary COPY encoding only: no server).

``--per-message``: CPU microseconds per *message* for small messages (``--sizes``, default 1
and 16 rows), through the same ``Pipeline`` with a sink that stores nothing and a model that
answers at once (no tensors, no gRPC unless ``--tensor``): rowbatch's own per-message cost
(headers, decode, check, intake, ledger entry, batcher add, batch take, result rows, settle;
``other`` is the pipeline's glue: asyncio, metrics, the byte budget, the writer). The total is
from uninstrumented runs; stage figures are corrected for the timers' own cost. The broker
clients' per-message receive cost (aiokafka record parsing, the Pub/Sub client's message
wrapper) is measured apart (``--broker``). ``--vector N``: the source gives its deliveries in
vectors of N, as the Kafka and Pub/Sub pull sources do (by default one at a time, as the
streaming Pub/Sub source does).

    .venv/bin/python scripts/profile_hot_path.py                      # table, all cases
    .venv/bin/python scripts/profile_hot_path.py --sink parquet --profile 20
    .venv/bin/python scripts/profile_hot_path.py --json out.json
    .venv/bin/python scripts/profile_hot_path.py --per-message --broker   # us/message
    .venv/bin/python scripts/profile_hot_path.py --per-message --vector 256
"""
