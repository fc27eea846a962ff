"""``embodied export``: write a trained run's policy as ONNX and/or C99 into ``RUN_DIR/export/``."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export",
        help="export a run's policy (policy.onnx, C99 policy.h/.c, policy_io.json)",
        description="Export the deterministic policy of a trained run into RUN_DIR/export/: "
        "policy_io.json (interface, scales, control period, model hash) always; policy.onnx "
        "(opset 17, input `obs`, output `action`, batch dynamic) checked against onnxruntime; "
        "c/policy.h + c/policy.c (C99, static weights, no malloc) checked on the host against "
        "torch. Parity (max |error| vs torch) is printed; above 1e-5 the export fails.",
        epilog="Next: embodied eval RUN_DIR --policy onnx|c, embodied firmware build RUN_DIR",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a folder printed by `embodied train`")
    p.add_argument(
        "--format", dest="fmt", choices=("onnx", "c", "all"), default="all", help="what to write (default: all)"
    )
    p.add_argument(
        "--no-record",
        action="store_true",
        help="check parity on random observations only (skip the short rollout that records real ones)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from embodied.export.bundle import export_run

    report = export_run(args.run_dir, args.fmt, record=not args.no_record)
    print(f"model_sha256: {report.model_sha256}")
    print(f"multiply-accumulates per forward pass: {report.num_macs}")
    for path in report.written:
        print(f"wrote {path}")
    if report.onnx_max_abs_err is not None:
        print(f"parity onnx vs torch: max |error| = {report.onnx_max_abs_err:.2e}")
    if report.c_max_abs_err is not None:
        tanh = "rational tanh" if report.c_fast_tanh else "tanhf"
        print(f"parity C (host, {tanh}) vs torch: max |error| = {report.c_max_abs_err:.2e}")
    return 0
