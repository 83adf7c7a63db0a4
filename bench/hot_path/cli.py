"""The hot-path profile's command line: a table of CPU per row by stage (or, with
``--per-message``, per message), optionally cProfile's top functions and a JSON file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import bench.hot_path
from bench.help_text import description
from bench.hot_path.broker import broker_costs
from bench.hot_path.fakes import make_deliveries
from bench.hot_path.per_message import per_message_table
from bench.hot_path.per_row import run_once
from bench.hot_path.timers import STAGES, print_profile


def main() -> None:
    parser = argparse.ArgumentParser(description=description(bench.hot_path.__doc__))
    parser.add_argument("--messages", type=int, default=40)
    parser.add_argument("--chunk-rows", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the fastest counts")
    parser.add_argument("--encoding", default="json,arrow")
    parser.add_argument("--kind", default="text,numeric")
    parser.add_argument("--sink", default="sqlite,parquet,pg-encode")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile top N")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--per-message", action="store_true", help="us per message of small messages"
    )
    parser.add_argument("--sizes", default="1,16", help="rows per message (--per-message)")
    parser.add_argument(
        "--message-rows", type=int, default=4096, help="rows per run (--per-message)"
    )
    parser.add_argument(
        "--tensor", action="store_true", help="build the input tensors (--per-message)"
    )
    parser.add_argument(
        "--broker", action="store_true", help="broker clients' receive cost (--per-message)"
    )
    parser.add_argument(
        "--vector",
        type=int,
        default=0,
        metavar="N",
        help="deliveries per vector, as the Kafka and Pub/Sub pull sources give them (0: one "
        "by one, as the streaming Pub/Sub source does) (--per-message)",
    )
    args = parser.parse_args()
    if args.per_message:
        results = per_message_table(args)
        if args.broker:
            print("\nbroker clients, receive side, CPU us/message (not in the table above)")
            for rows in (int(r) for r in args.sizes.split(",")):
                for encoding in args.encoding.split(","):
                    deliveries = make_deliveries(encoding, "text", 1000, rows)
                    costs = broker_costs(deliveries, args.repeat)
                    case = f"{encoding}/text/{rows}row"
                    print(f"  {case:<22}" + "".join(f"{k:>8} {v:6.1f}" for k, v in costs.items()))
                    results.append({"case": f"broker/{case}", **costs})
        if args.json is not None:
            args.json.write_text(json.dumps(results, indent=1))
        return

    results = []
    header = f"{'case':<26}{'total':>7}" + "".join(f"{s:>8}" for s in (*STAGES, "other"))
    print(f"CPU us/row, {args.messages} messages x {args.chunk_rows} rows, best of {args.repeat}")
    print(header)
    for encoding in args.encoding.split(","):
        for kind in args.kind.split(","):
            deliveries = make_deliveries(encoding, kind, args.messages, args.chunk_rows)
            for sink_name in args.sink.split(","):
                runs = [
                    run_once(encoding, kind, sink_name, deliveries, False)
                    for _ in range(args.repeat)
                ]
                total, stages, rows, _ = min(runs, key=lambda r: r[0])
                per_row = {s: v / rows * 1e6 for s, v in stages.items()}
                per_row["other"] = total / rows * 1e6 - sum(per_row.values())
                case = f"{encoding}/{kind}/{sink_name}"
                print(
                    f"{case:<26}{total / rows * 1e6:7.1f}"
                    + "".join(f"{per_row[s]:8.2f}" for s in (*STAGES, "other"))
                )
                results.append({"case": case, "total": total / rows * 1e6, **per_row})
                if args.profile:
                    _, _, rows, stats = run_once(encoding, kind, sink_name, deliveries, True)
                    assert stats is not None
                    print_profile(case, stats, rows, args.profile)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
