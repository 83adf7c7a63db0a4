"""Tracing off costs nothing at start-up: the consumer's and the producer's entry points, and
the ``[tracing]`` section left at its default, load neither the OpenTelemetry SDK nor an
exporter (so no exporter thread can start); and the JSON log lines carry ``trace_id`` /
``span_id`` only while tracing is on and a span is current."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

import rowbatch.tracing
from rowbatch.consumer.service.logs import JsonFormatter

_PROBE = """
import sys
import rowbatch.consumer.service.cli, rowbatch.producer.cli.main
from rowbatch.consumer.observe.tracing_settings import TracingConfig, start_consumer_tracing
assert start_consumer_tracing(TracingConfig()) is None
loaded = [m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))]
print(",".join(loaded))
"""


def test_tracing_off_loads_no_sdk_and_no_exporter() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def _line(record: logging.LogRecord) -> dict[str, object]:
    loaded: dict[str, object] = json.loads(JsonFormatter().format(record))
    return loaded


def test_json_logs_name_the_current_span_only_while_tracing_is_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    record = logging.makeLogRecord({"msg": "inference attempt failed", "levelname": "WARNING"})
    context = SpanContext(0xABC, 0xDEF, is_remote=False, trace_flags=TraceFlags(1))
    with trace.use_span(NonRecordingSpan(context)):
        assert "trace_id" not in _line(record)  # tracing off: not even looked up
        monkeypatch.setattr(rowbatch.tracing, "_active", True)
        line = _line(record)
    assert line["trace_id"] == f"{0xABC:032x}"
    assert line["span_id"] == f"{0xDEF:016x}"
    assert "trace_id" not in _line(record)  # no span current
