"""Service plumbing on top of the stages: configuration, the ``rowbatch-consumer`` CLI,
wiring a source, model, engine and sink into a running service, start-up waits, the health
and metrics HTTP server, and logging.

The consumer allocates Arrow buffers with malloc (pyarrow's ``system`` pool) unless
``ARROW_DEFAULT_MEMORY_POOL`` says otherwise: pyarrow's bundled allocator keeps what the
Parquet writer frees (~30 MiB more peak RSS measured, docs/memory.md). pyarrow reads the
variable once, when it loads, so it is set here, before the CLI imports anything that loads
it."""

import os

os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
