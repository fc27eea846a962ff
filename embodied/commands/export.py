"""``embodied export``: write a trained run's policy in the formats of the exporter table into ``RUN_DIR/export/``."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    from embodied.export.formats import ALL, EXPORTERS, format_choices

    formats = "; ".join(f"{name}: {exporter.description}" for name, exporter in EXPORTERS.items())
    p = subparsers.add_parser(
        "export",
        help=f"export a run's policy ({', '.join(EXPORTERS)}; policy_io.json always)",
        description="Export the deterministic policy of a trained run (its policy artifact "
        "ckpt/policy.pt, written beside each checkpoint) into RUN_DIR/export/: policy_io.json "
        f"(interface, scales, control period, model hash) always, then per format: {formats}. "
        "Parity (max |error| vs torch) is printed; above 1e-5 the export fails.",
        epilog="Next: embodied eval RUN_DIR --policy onnx|c, embodied firmware build RUN_DIR",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a folder printed by `embodied train`")
    p.add_argument(
        "--format",
        dest="fmt",
        choices=format_choices(),
        default=ALL,
        help=f"what to write (default: {ALL}, every format)",
    )
    p.add_argument(
        "--no-record",
        action="store_true",
        help="check parity on random observations only (skip the short rollout that records real ones)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from embodied.training.run_policy import export_run

    report = export_run(args.run_dir, args.fmt, record=not args.no_record)
    print(f"model_sha256: {report.model_sha256}")
    if report.num_macs:  # unknown (0) for a traced image-instruction graph
        print(f"multiply-accumulates per forward pass: {report.num_macs}")
    for path in report.written:
        print(f"wrote {path}")
    for name, result in report.formats.items():
        if result.max_abs_err is None:
            continue
        detail = ""
        if "fast_tanh" in result.details:
            detail = f" (host, {'rational tanh' if result.details['fast_tanh'] else 'tanhf'})"
        print(f"parity {name}{detail} vs torch: max |error| = {result.max_abs_err:.2e}")
    return 0
