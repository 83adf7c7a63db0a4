"""Service plumbing on top of the stages: configuration, the ``rowbatch-consumer`` CLI,
wiring a source, model, engine and sink into a running service, start-up waits, the health
and metrics HTTP server, and logging."""
