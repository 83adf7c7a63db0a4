"""A static waterfall of traces as Jaeger's query API returns them (OTLP JSON), for the README's
picture: the Jaeger binary built from the Go module proxy serves no UI (its web assets are built
apart, with npm, and are not in the module), so the spans are drawn here, as they are stored.

    .venv/bin/python -m harness.trace_view traces.json out.html   # then a headless browser

``traces.json``: ``{"title": [span, ...], ...}``, one list of OTLP JSON spans per panel (what
:meth:`harness.jaeger.JaegerEndpoint.trace` returns; tests/integration/test_tracing.py writes one
when ``ROWBATCH_TRACE_SNAPSHOT`` names a file)."""

from __future__ import annotations

import html
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.jaeger import attribute

_SHOWN = (
    "messaging.message.id",
    "messaging.batch.message_count",
    "rowbatch.rows",
    "rowbatch.outcome",
    "rowbatch.model.version",
    "rowbatch.dlq.reason",
    "rowbatch.dlq.code",
    "server.address",
    "server.port",
    "rowbatch.error.status",
    "rowbatch.backoff.seconds",
)
_COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1")


def _short(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _order(spans: Sequence[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """Spans depth-first from the roots, children by start time, with their depth."""
    ids = {s["spanId"] for s in spans}
    children: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        parent = span.get("parentSpanId", "")
        children.setdefault(parent if parent in ids else "", []).append(span)
    out: list[tuple[int, dict[str, Any]]] = []

    def walk(key: str, depth: int) -> None:
        for span in sorted(children.get(key, []), key=lambda s: int(s["startTimeUnixNano"])):
            out.append((depth, span))
            walk(span["spanId"], depth + 1)

    walk("", 0)
    return out


def panel(title: str, spans: Sequence[dict[str, Any]]) -> str:
    start = min(int(s["startTimeUnixNano"]) for s in spans)
    end = max(int(s["endTimeUnixNano"]) for s in spans)
    width = max(end - start, 1)
    services = sorted({s.get("service", "") for s in spans})
    colour = {name: _COLOURS[i % len(_COLOURS)] for i, name in enumerate(services)}
    rows = []
    for depth, span in _order(spans):
        left = (int(span["startTimeUnixNano"]) - start) / width * 100
        size = max((int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])) / width, 0.002)
        ms = (int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])) / 1e6
        tags = [
            f"{key.split('.')[-1]}={_short(attribute(span, key))}"
            for key in _SHOWN
            if attribute(span, key) is not None
        ]
        links = span.get("links") or []
        if links:
            tags.append(f"links={len(links)}")
        error = " error" if (span.get("status") or {}).get("code") == 2 else ""
        rows.append(
            f'<tr><td class="name" style="padding-left:{8 + depth * 16}px">'
            f'<span class="svc" style="background:{colour[span.get("service", "")]}">'
            f"{html.escape(span.get('service', ''))}</span> {html.escape(span['name'])}</td>"
            f'<td class="bar"><div class="b{error}" style="left:{left:.2f}%;'
            f'width:{size * 100:.2f}%;background:{colour[span.get("service", "")]}"></div>'
            f'<span class="ms">{ms:.1f} ms</span></td>'
            f'<td class="tags">{html.escape(" ".join(tags))}</td></tr>'
        )
    trace_id = spans[0]["traceId"]
    return (
        f"<h2>{html.escape(title)} <small>trace {trace_id}, {len(spans)} spans, "
        f"{width / 1e6:.1f} ms</small></h2><table>{''.join(rows)}</table>"
    )


def render(panels: dict[str, list[dict[str, Any]]]) -> str:
    style = (
        "body{font:13px sans-serif;margin:16px;width:1500px}h2{font-size:15px;margin:18px 0 6px}"
        "small{color:#666;font-weight:normal}table{border-collapse:collapse;width:100%}"
        "td{border-bottom:1px solid #eee;padding:3px 6px;vertical-align:middle}"
        ".name{width:390px;white-space:nowrap}.bar{position:relative;width:420px;height:18px}"
        ".b{position:absolute;top:4px;height:10px;border-radius:2px;min-width:2px}"
        ".error{outline:2px solid #d00}.ms{position:absolute;right:2px;top:2px;color:#555;"
        "font-size:11px}.tags{color:#333;font-size:11px}.svc{color:#fff;border-radius:3px;"
        "padding:0 4px;font-size:11px}"
    )
    body = "".join(panel(title, spans) for title, spans in panels.items() if spans)
    return f"<!doctype html><html><head><style>{style}</style></head><body>{body}</body></html>"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m harness.trace_view TRACES.json OUT.html", file=sys.stderr)
        return 2
    panels = json.loads(Path(args[0]).read_text())
    Path(args[1]).write_text(render(panels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
