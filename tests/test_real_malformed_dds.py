"""Malformed input over Cyclone DDS: every bad odometry payload is counted on /diagnostics, each kind
under its own counter (bench/deploy_liveness.py runs the same with 10,000 payloads)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from real_support import export_policy, quad_spec

BENCH = Path(__file__).resolve().parents[1] / "bench" / "deploy_liveness.py"


def test_every_bad_payload_is_counted_on_diagnostics(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("deploy_liveness", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    export = export_policy(tmp_path / "export", quad_spec(history=2), seed=3)
    report = bench.malformed_series(export, 60, n_busy=0, seed=1)
    assert all(n > 0 for n in report["by_kind"].values())  # every kind was sent
    diagnostics = report["diagnostics"]
    assert report["counted_on_diagnostics"] == 60
    assert int(diagnostics["decode_errors"]) == report["by_kind"]["not_utf8"]
    assert int(diagnostics["rejected.wrong_frame"]) == report["by_kind"]["wrong_frame"]
    assert int(diagnostics["rejected.zero_stamp"]) == report["by_kind"]["zero_stamp"]
    assert int(diagnostics["rejected.future_stamp"]) == report["by_kind"]["future_stamp"]
    assert int(diagnostics["rejected.stamp_out_of_order"]) == report["by_kind"]["old_stamp"]
