"""Seed sweeps: the aggregate curve and table over several runs."""

from __future__ import annotations

import json
from pathlib import Path

from embodied.training.sweep import aggregate


def _fake_run(root: Path, name: str, successes: list[float]) -> Path:
    run = root / name
    run.mkdir(parents=True)
    rows = [
        {
            "env_steps": 1000 * (i + 1),
            "eval/success_rate": s,
            "eval/mean_return": 10.0 * s,
            "eval/train_time_s": float(i + 1),
        }
        for i, s in enumerate(successes)
    ]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return run


def test_aggregate_writes_curve_and_mean_std_table(tmp_path: Path) -> None:
    runs = [_fake_run(tmp_path, "a_s0", [0.2, 0.6]), _fake_run(tmp_path, "a_s1", [0.4, 1.0])]
    out = aggregate(runs, tmp_path / "sweep")
    assert (out / "curves.png").stat().st_size > 1000
    table = (out / "summary.md").read_text()
    assert "| a_s0 | 2000 | 2.00 | 0.600 | 6.00 |" in table
    assert "0.800 ± 0.283" in table  # mean and sample std of the final success rates 0.6 and 1.0
