"""Calling the model over KServe v2 gRPC: :mod:`.client` talks to one server, :mod:`.errors`
sorts every failure into one of three classes, and :mod:`.retry` retries the transient ones
with exponential backoff. Several servers are balanced by :mod:`rowbatch.consumer.model.balancer`,
which sends a batch a server failed with a retryable error to another one before this backoff
applies.

=============================  ==============================================  ===============
class                          when                                            what to do
=============================  ==============================================  ===============
:class:`RetryableInferenceError` UNAVAILABLE, RESOURCE_EXHAUSTED,               back off, retry
                               DEADLINE_EXCEEDED, HTTP 429/503 (from a proxy),  for ever
                               connection failures
:class:`PoisonInferenceError`  INVALID_ARGUMENT: the rows are bad              bisect, dead-
                                                                               letter
:class:`FatalInferenceError`   anything else (INTERNAL, UNKNOWN, NOT_FOUND     bisect, nack
                               at start-up, ...)                               (redelivered)
=============================  ==============================================  ===============

Fatal at start-up (discovery, ``check``) stops the consumer. While running, a batch failing
fatally is bisected like poison (MLServer and KServe answer INTERNAL for any exception a
model raises on some rows): what succeeds is written, and the messages that fail alone are
nacked, not dead-lettered, since the server may be at fault; one that never succeeds is
dead-lettered as ``too-many-attempts`` by the source (:mod:`rowbatch.consumer.engine.poison` bounds
the bisection when the server fails everything).

Import a name from the module that defines it: this package re-exports nothing.
"""
