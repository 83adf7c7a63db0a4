"""W3C trace context in message attributes (``rowbatch.tracing``): reading a producer's context
(either prefix, malformed values ignored), writing the current span's, the settings' checks,
and the consumer's ``[tracing]`` switch (never starting the real SDK here)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from pydantic import ValidationError

import rowbatch.tracing
from rowbatch.consumer.observe import tracing_settings
from rowbatch.consumer.observe.tracing_settings import TracingConfig, start_consumer_tracing
from rowbatch.tracing import (
    FOLLOWS_LINKS,
    PUBSUB_PREFIX,
    TRACE_CONTEXT_BYTES,
    Tracing,
    TracingError,
    TracingSettings,
    _sample_ratio,
    active,
    context_of,
    inject,
    linked_or_ratio,
    sampler,
    traceparent_of,
)
from tests.unit import tracing_fixtures
from tests.unit.tracing_fixtures import context

spans = tracing_fixtures.spans  # the fixture, where pytest finds it

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{SPAN}-01"

# --- reading: context_of ------------------------------------------------------------------------


def test_a_valid_traceparent_is_read() -> None:
    ctx = context_of({"traceparent": VALID})
    assert ctx is not None
    assert ctx.trace_id == int(TRACE, 16)
    assert ctx.span_id == int(SPAN, 16)
    assert ctx.trace_flags.sampled
    assert ctx.is_remote
    assert ctx.is_valid
    assert ctx.trace_state == TraceState()


def test_an_unsampled_traceparent_keeps_its_flag() -> None:
    ctx = context_of({"traceparent": f"00-{TRACE}-{SPAN}-00"})
    assert ctx is not None
    assert not ctx.trace_flags.sampled
    assert int(ctx.trace_flags) == 0


def test_the_pubsub_name_is_preferred_and_its_own_state_read() -> None:
    other_trace, other_span = "a" * 32, "b" * 16
    ctx = context_of(
        {
            "traceparent": VALID,
            "tracestate": "plain=1",
            "googclient_traceparent": f"00-{other_trace}-{other_span}-01",
            "googclient_tracestate": "google=2",
        }
    )
    assert ctx is not None
    assert (ctx.trace_id, ctx.span_id) == (int(other_trace, 16), int(other_span, 16))
    assert dict(ctx.trace_state) == {"google": "2"}


def test_the_pubsub_name_alone_is_read() -> None:
    ctx = context_of({PUBSUB_PREFIX + "traceparent": VALID})
    assert ctx is not None
    assert ctx.span_id == int(SPAN, 16)


def test_tracestate_is_read() -> None:
    ctx = context_of({"traceparent": VALID, "tracestate": "vendor=abc,other=x1"})
    assert ctx is not None
    assert dict(ctx.trace_state) == {"vendor": "abc", "other": "x1"}


def test_a_malformed_tracestate_leaves_the_context() -> None:
    ctx = context_of({"traceparent": VALID, "tracestate": "no equals sign, ==="})
    assert ctx is not None
    assert ctx.span_id == int(SPAN, 16)
    assert dict(ctx.trace_state) == {}


def test_surrounding_blanks_are_ignored() -> None:
    ctx = context_of({"traceparent": f"  {VALID} "})
    assert ctx is not None
    assert ctx.trace_id == int(TRACE, 16)


def test_a_later_version_with_more_fields_is_read() -> None:
    # W3C: a parser of version 00 reads the first four fields of a higher version.
    ctx = context_of({"traceparent": f"01-{TRACE}-{SPAN}-01-future"})
    assert ctx is not None
    assert ctx.span_id == int(SPAN, 16)


def test_no_context_when_absent() -> None:
    assert context_of({}) is None
    assert context_of({"content-type": "application/json", "tracestate": "a=1"}) is None


@pytest.mark.parametrize(
    "value",
    [
        "",
        "garbage",
        f"00-{TRACE}-{SPAN}",  # too few fields
        f"00-{TRACE}-{SPAN}-01-extra",  # version 00 has exactly four
        f"ff-{TRACE}-{SPAN}-01",  # version ff is invalid
        f"0-{TRACE}-{SPAN}-01",  # version of one digit
        f"000-{TRACE}-{SPAN}-01",  # version of three digits
        f"00-{TRACE[:-1]}-{SPAN}-01",  # trace id too short
        f"00-{TRACE}0-{SPAN}-01",  # trace id too long
        f"00-{TRACE}-{SPAN[:-1]}-01",  # span id too short
        f"00-{TRACE}-{SPAN}0-01",  # span id too long
        f"00-{TRACE}-{SPAN}-1",  # flags too short
        f"00-{TRACE}-{SPAN}-001",  # flags too long
        f"00-{'g' * 32}-{SPAN}-01",  # trace id not hex
        f"00-{TRACE}-{'z' * 16}-01",  # span id not hex
        f"00-{TRACE}-{SPAN}-0x",  # flags not hex
        f"zz-{TRACE}-{SPAN}-01",  # version not hex
        f"00-{'0' * 32}-{SPAN}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero span id
        f"00-{TRACE}--{SPAN}-01",  # an empty field
        f"00-{TRACE.upper()}-{SPAN}-01",  # W3C: lowercase hex only
    ],
)
def test_a_malformed_traceparent_is_ignored(value: str) -> None:
    assert context_of({"traceparent": value}) is None
    assert context_of({"googclient_traceparent": value, "googclient_tracestate": "a=1"}) is None
    # a malformed Pub/Sub one does not hide a good W3C one beside it
    fallback = context_of({"googclient_traceparent": value, "traceparent": VALID})
    assert fallback is not None
    assert (fallback.trace_id, fallback.span_id) == (int(TRACE, 16), int(SPAN, 16))


def test_traceparent_of_writes_the_w3c_form() -> None:
    ctx = SpanContext(int(TRACE, 16), int(SPAN, 16), False, TraceFlags(TraceFlags.SAMPLED))
    assert traceparent_of(ctx) == VALID
    small = SpanContext(1, 2, False, TraceFlags(0))
    assert traceparent_of(small) == f"00-{1:032x}-{2:016x}-00"


# --- writing: inject ----------------------------------------------------------------------------


def test_inject_writes_nothing_without_a_current_span(spans: InMemorySpanExporter) -> None:
    carrier: dict[str, str] = {"content-type": "application/json"}
    inject(carrier, pubsub=False)
    inject(carrier, pubsub=True)
    assert carrier == {"content-type": "application/json"}
    with trace.use_span(NonRecordingSpan(SpanContext(0, 0, False))):  # an invalid context
        inject(carrier, pubsub=False)
    assert carrier == {"content-type": "application/json"}


@pytest.mark.parametrize(
    ("pubsub", "name"), [(False, "traceparent"), (True, PUBSUB_PREFIX + "traceparent")]
)
def test_inject_writes_the_current_span(
    spans: InMemorySpanExporter, pubsub: bool, name: str
) -> None:
    carrier: dict[str, str] = {"content-type": "application/json"}
    with trace.get_tracer("test").start_as_current_span("send") as span:
        inject(carrier, pubsub=pubsub)
    assert carrier == {
        "content-type": "application/json",
        name: traceparent_of(span.get_span_context()),
    }
    [finished] = spans.get_finished_spans()
    assert carrier[name] == traceparent_of(context(finished))


@pytest.mark.parametrize("pubsub", [False, True])
def test_inject_writes_the_tracestate_and_round_trips(
    spans: InMemorySpanExporter, pubsub: bool
) -> None:
    parent = SpanContext(
        int(TRACE, 16),
        int(SPAN, 16),
        True,
        TraceFlags(TraceFlags.SAMPLED),
        TraceState([("vendor", "abc"), ("other", "x1")]),
    )
    carrier: dict[str, str] = {}
    with (
        trace.use_span(NonRecordingSpan(parent)),
        trace.get_tracer("test").start_as_current_span("send") as span,
    ):
        inject(carrier, pubsub=pubsub)
    prefix = PUBSUB_PREFIX if pubsub else ""
    assert set(carrier) == {prefix + "traceparent", prefix + "tracestate"}
    assert carrier[prefix + "tracestate"] == "vendor=abc,other=x1"
    read = context_of(carrier)
    assert read is not None
    sent = span.get_span_context()
    assert (read.trace_id, read.span_id) == (sent.trace_id, sent.span_id)
    assert read.trace_id == int(TRACE, 16)  # the child carries on the parent's trace
    assert read.trace_flags == sent.trace_flags
    assert dict(read.trace_state) == {"vendor": "abc", "other": "x1"}


def _state_of_length(length: int) -> TraceState:
    return TraceState([("k", "v" * (length - 2))])


def test_a_tracestate_too_long_is_dropped_and_the_longest_kept_fits(
    spans: InMemorySpanExporter,
) -> None:
    longest: int = rowbatch.tracing._MAX_STATE
    tracer = trace.get_tracer("test")
    for length, kept in [(longest, True), (longest + 1, False)]:
        parent = SpanContext(1, 2, True, TraceFlags(TraceFlags.SAMPLED), _state_of_length(length))
        carrier: dict[str, str] = {}
        with trace.use_span(NonRecordingSpan(parent)), tracer.start_as_current_span("send"):
            inject(carrier, pubsub=True)
        assert (PUBSUB_PREFIX + "tracestate" in carrier) is kept
        assert PUBSUB_PREFIX + "traceparent" in carrier
        if kept:
            # What the publishers keep free of a message's size limit is enough.
            used = sum(len(k.encode()) + len(v.encode()) for k, v in carrier.items())
            assert used <= TRACE_CONTEXT_BYTES


def test_round_trip_of_an_unsampled_context(spans: InMemorySpanExporter) -> None:
    parent = SpanContext(7, 9, True, TraceFlags(0))
    carrier: dict[str, str] = {}
    with trace.use_span(NonRecordingSpan(parent)):  # the current span, not recording
        inject(carrier, pubsub=False)
    assert carrier == {"traceparent": f"00-{7:032x}-{9:016x}-00"}
    read = context_of(carrier)
    assert read is not None
    assert (read.trace_id, read.span_id, read.trace_flags.sampled) == (7, 9, False)


# --- settings -----------------------------------------------------------------------------------


@pytest.mark.parametrize("ratio", [-0.01, 1.01, float("inf")])
def test_settings_reject_a_ratio_outside_0_1(ratio: float) -> None:
    with pytest.raises(TracingError, match="sample ratio"):
        TracingSettings("svc", sample_ratio=ratio)


@pytest.mark.parametrize("ratio", [-0.01, 1.01, float("nan")])
def test_settings_reject_a_batch_ratio_outside_0_1(ratio: float) -> None:
    with pytest.raises(TracingError, match="batch sample ratio"):
        TracingSettings("svc", batch_sample_ratio=ratio)


@pytest.mark.parametrize("limit", [0, -1])
def test_settings_reject_a_link_limit_below_1(limit: int) -> None:
    with pytest.raises(TracingError, match="link limit"):
        TracingSettings("svc", link_limit=limit)


def test_settings_accept_the_bounds() -> None:
    assert TracingSettings("svc", sample_ratio=0.0).sample_ratio == 0.0
    assert TracingSettings("svc", sample_ratio=1.0, link_limit=1).link_limit == 1
    assert TracingSettings("svc", batch_sample_ratio=1.0).batch_sample_ratio == 1.0
    assert TracingSettings("svc").batch_sample_ratio == 0.0  # follow the messages
    assert issubclass(TracingError, ValueError)


def test_sample_ratio_prefers_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    assert _sample_ratio(TracingSettings("svc", sample_ratio=0.25)) == 0.25
    assert _sample_ratio(TracingSettings("svc", sample_ratio=0.0)) == 0.0


@pytest.mark.parametrize(("raw", "ratio"), [(None, 1.0), ("", 1.0), ("0.25", 0.25), ("0", 0.0)])
def test_sample_ratio_reads_the_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, ratio: float
) -> None:
    if raw is None:
        monkeypatch.delenv("OTEL_TRACES_SAMPLER_ARG", raising=False)
    else:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", raw)
    assert _sample_ratio(TracingSettings("svc")) == ratio


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ("half", "not a number"),
        ("1.5", r"not in \[0, 1\]"),
        ("-0.1", r"not in \[0, 1\]"),
        ("nan", r"not in \[0, 1\]"),
    ],
)
def test_sample_ratio_rejects_junk(monkeypatch: pytest.MonkeyPatch, raw: str, match: str) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", raw)
    with pytest.raises(TracingError, match=match) as caught:
        _sample_ratio(TracingSettings("svc"))
    assert "OTEL_TRACES_SAMPLER_ARG" in str(caught.value)


def test_active_follows_the_module_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rowbatch.tracing, "_active", False)
    assert not active()
    monkeypatch.setattr(rowbatch.tracing, "_active", True)
    assert active()


def test_shutdown_turns_tracing_off_and_stops_the_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Provider:
        stopped = 0

        def shutdown(self) -> None:
            self.stopped += 1

    monkeypatch.setattr(rowbatch.tracing, "_active", True)
    provider = Provider()
    Tracing(provider, TracingSettings("svc")).shutdown()
    assert provider.stopped == 1
    assert not active()


# --- the consumer's [tracing] section -----------------------------------------------------------


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Tracing]:
    """``start_tracing`` replaced by a recorder (the real one would set the global provider)."""
    calls: list[Tracing] = []

    def fake_start(settings: TracingSettings) -> Tracing:
        calls.append(Tracing(object(), settings))
        return calls[-1]

    monkeypatch.setattr(tracing_settings, "start_tracing", fake_start)
    return calls


def test_consumer_tracing_is_off_by_default(
    monkeypatch: pytest.MonkeyPatch, started: list[Tracing]
) -> None:
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    assert TracingConfig().enabled is False
    assert start_consumer_tracing(TracingConfig()) is None
    assert started == []


@pytest.mark.parametrize("value", ["true", "TRUE", "True"])
def test_otel_sdk_disabled_turns_consumer_tracing_off(
    monkeypatch: pytest.MonkeyPatch, started: list[Tracing], value: str
) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", value)
    assert start_consumer_tracing(TracingConfig(enabled=True)) is None
    assert started == []


@pytest.mark.parametrize("value", [None, "false", ""])
def test_enabled_consumer_tracing_starts_with_its_settings(
    monkeypatch: pytest.MonkeyPatch, started: list[Tracing], value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    else:
        monkeypatch.setenv("OTEL_SDK_DISABLED", value)
    config = TracingConfig(
        enabled=True,
        endpoint="http://collector:4317",
        sample_ratio=0.5,
        batch_sample_ratio=0.25,
        service_name="svc",
        link_limit=7,
    )
    tracing = start_consumer_tracing(config)
    assert started == [tracing]
    assert tracing is not None
    assert tracing.settings == TracingSettings(
        service_name="svc",
        endpoint="http://collector:4317",
        sample_ratio=0.5,
        batch_sample_ratio=0.25,
        link_limit=7,
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"sample_ratio": 1.5},
        {"sample_ratio": -0.5},
        {"batch_sample_ratio": 1.5},
        {"batch_sample_ratio": -0.5},
        {"link_limit": 0},
        {"bogus": 1},
    ],
)
def test_tracing_config_rejects_bad_fields(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        TracingConfig(**fields)


def test_google_pubsub_clients_read_ours_and_we_read_theirs(spans: InMemorySpanExporter) -> None:
    """Interoperability with google-cloud-pubsub's own OpenTelemetry tracing: what its
    publisher injects (the W3C propagator through its ``googclient_`` setter) we read, and
    what we inject its subscriber's getter extracts, the same span context either way."""
    from google.cloud.pubsub_v1.open_telemetry.context_propagation import (
        OpenTelemetryContextGetter,
        OpenTelemetryContextSetter,
    )
    from google.pubsub_v1 import PubsubMessage
    from opentelemetry.trace.propagation.tracecontext import (
        TraceContextTextMapPropagator,
    )

    w3c = TraceContextTextMapPropagator()
    with trace.get_tracer("t").start_as_current_span("google publish") as span:
        theirs = PubsubMessage(data=b"x")
        w3c.inject(carrier=theirs, setter=OpenTelemetryContextSetter())
        ours: dict[str, str] = {}
        inject(ours, pubsub=True)
    read = context_of(dict(theirs.attributes))
    assert read is not None
    assert (read.trace_id, read.span_id) == (
        span.get_span_context().trace_id,
        span.get_span_context().span_id,
    )
    extracted = w3c.extract(
        carrier=PubsubMessage(data=b"x", attributes=ours), getter=OpenTelemetryContextGetter()
    )
    got = trace.get_current_span(extracted).get_span_context()
    assert (got.trace_id, got.span_id) == (read.trace_id, read.span_id)


def decision(sampler: Any, links: list[trace.Link], attributes: Any = None) -> Any:
    """What ``sampler`` decides for a root span with ``links`` and ``attributes``."""
    return sampler.should_sample(None, 7, "infer m", attributes=attributes, links=links).decision


SAMPLED = trace.Link(SpanContext(1, 2, True, TraceFlags(TraceFlags.SAMPLED)))
UNSAMPLED = trace.Link(SpanContext(3, 4, True, TraceFlags(TraceFlags.DEFAULT)))
OVER_MESSAGES = {FOLLOWS_LINKS: 1}
"""The attributes of a span over messages (``infer``, ``write``), as far as sampling goes."""


def test_a_root_linking_a_sampled_message_is_kept_whatever_the_ratio() -> None:
    """An inference request carrying a sampled message is kept even at ratios 0 (the
    message's trace leads to it); a root linking only unsampled contexts, or none, follows
    the ratio."""
    from opentelemetry.sdk.trace.sampling import Decision

    never = linked_or_ratio(0.0, batch_ratio=0.0)
    always = linked_or_ratio(1.0, batch_ratio=1.0)
    assert decision(never, [UNSAMPLED, SAMPLED]) is Decision.RECORD_AND_SAMPLE
    assert decision(never, [UNSAMPLED, SAMPLED], OVER_MESSAGES) is Decision.RECORD_AND_SAMPLE
    assert decision(never, [UNSAMPLED]) is Decision.DROP
    assert decision(never, []) is Decision.DROP
    assert decision(always, []) is Decision.RECORD_AND_SAMPLE
    assert decision(always, [UNSAMPLED], OVER_MESSAGES) is Decision.RECORD_AND_SAMPLE
    assert "0.0" in never.get_description()


def test_a_span_over_messages_linking_none_sampled_follows_the_batch_ratio() -> None:
    """The consumer's own ratio (1.0 here, the default) keeps the traces that start in the
    consumer (a message without context), never a request or write that carries no sampled
    message; ``batch_ratio`` alone decides those."""
    from opentelemetry.sdk.trace.sampling import Decision

    follow = linked_or_ratio(1.0, batch_ratio=0.0)
    assert decision(follow, [], OVER_MESSAGES) is Decision.DROP
    assert decision(follow, [UNSAMPLED], OVER_MESSAGES) is Decision.DROP
    assert decision(follow, [SAMPLED], OVER_MESSAGES) is Decision.RECORD_AND_SAMPLE
    assert decision(follow, [], {"messaging.message.id": "m1"}) is Decision.RECORD_AND_SAMPLE
    keep = linked_or_ratio(0.0, batch_ratio=1.0)
    assert decision(keep, [], OVER_MESSAGES) is Decision.RECORD_AND_SAMPLE
    assert decision(keep, [], {"messaging.message.id": "m1"}) is Decision.DROP
    assert "batch=0.0" in follow.get_description()


def test_a_kept_root_keeps_its_attributes() -> None:
    result = linked_or_ratio(0.0, batch_ratio=0.0).should_sample(
        None, 7, "infer m", attributes={FOLLOWS_LINKS: 1, "rowbatch.rows": 3}, links=[SAMPLED]
    )
    assert dict(result.attributes) == {FOLLOWS_LINKS: 1, "rowbatch.rows": 3}


def test_the_sampler_is_parent_based_over_the_settings_ratios(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``sampler`` (what ``start_tracing`` installs): a child follows its parent whatever the
    ratios; a root goes to ``linked_or_ratio`` with ``sample_ratio`` (or
    ``OTEL_TRACES_SAMPLER_ARG``) and ``batch_sample_ratio``."""
    from opentelemetry.sdk.trace.sampling import Decision

    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    built = sampler(TracingSettings("svc", batch_sample_ratio=1.0))
    assert "LinkedOrRatio{0.0,batch=1.0}" in built.get_description()
    unsampled_parent = trace.set_span_in_context(NonRecordingSpan(UNSAMPLED.context))
    sampled_parent = trace.set_span_in_context(NonRecordingSpan(SAMPLED.context))
    child = built.should_sample(unsampled_parent, 7, "isolate", links=[SAMPLED])
    assert child.decision is Decision.DROP
    child = built.should_sample(sampled_parent, 7, "isolate")
    assert child.decision is Decision.RECORD_AND_SAMPLE
    root = built.should_sample(None, 7, "infer m", attributes=OVER_MESSAGES, links=[])
    assert root.decision is Decision.RECORD_AND_SAMPLE
    assert decision(built, []) is Decision.DROP
