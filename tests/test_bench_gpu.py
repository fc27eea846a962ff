"""``embodied bench gpu``: refuses to run without CUDA (or on the CPU without ``--quick``), and its
``--device cpu --quick`` mode runs the whole script end to end: a throughput part and both short
trainings as real ``python -m embodied`` processes, then the JSON and markdown report.

The quick run measures one backend (the built-in quadrotor) to stay fast; the trainings run on the
MuJoCo backend there (MuJoCo-Warp is not selected). What the GPU run measures is not checked here:
no GPU machine runs this suite.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("mujoco")
pytest.importorskip("gymnasium")

from embodied.cli import main
from embodied.commands import bench_gpu


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present: bench gpu would run")
def test_refuses_without_cuda(caplog: pytest.LogCaptureFixture) -> None:
    assert main(["bench", "gpu"]) == 2
    assert "CUDA is not available" in caplog.text and "--device cpu --quick" in caplog.text


def test_refuses_the_cpu_without_quick_and_a_name(caplog: pytest.LogCaptureFixture) -> None:
    assert main(["bench", "gpu", "--device", "cpu"]) == 2
    assert "needs --device cuda" in caplog.text
    assert main(["bench", "gpu", "quadrotor", "--device", "cpu", "--quick"]) == 2
    assert main(["bench", "sim"]) == 2  # sim and env still need a name


def test_quick_cpu_run_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench"
    args = ["bench", "gpu", "--device", "cpu", "--quick", "--backends", "quadrotor", "--out", str(out)]
    assert main(args) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out / "bench_gpu.json")
    report = json.loads((out / "bench_gpu.json").read_text())
    # the time box itself is test_an_overrunning_part_is_stopped's: wall time here depends on the
    # machine's load, and the VLA items' boxes come on top of the budget where lerobot is installed
    assert report["device"] == "cpu" and report["quick"] and report["total_s"] > 0 and report["budget_s"] > 0
    rows = {row["name"]: row for row in report["throughput"]}
    assert set(rows) == {part.target for part in bench_gpu.PARTS}
    assert rows["quadrotor"]["status"] == "ok" and rows["quadrotor"]["result"]["steps_per_s"] > 0
    assert rows["mujoco:go1-flat"]["status"] == "skipped"  # not selected
    assert rows["isaaclab:Isaac-Cartpole-Direct"]["status"] == "skipped"  # not selected
    trainings = {row["name"]: row for row in report["training"]}
    nccl = trainings.pop("ppo quad-hover x2 (NCCL)")
    assert nccl["status"] == "skipped" and nccl["error"] == "needs 2 GPUs, 0 here"
    assert set(trainings) == {"ppo quad-hover", "ppo go1-flat", "fasttd3 go1-flat", "fasttd3 humanoid"}
    for row in trainings.values():
        assert row["status"] == "ok", row["error"]
        assert row["result"]["env_steps"] >= 64
        # quad-hover runs on its own simulator, with its evaluations (the GPU target is a success rate)
        assert row["backend"] == ("own" if row["name"] == "ppo quad-hover" else "mujoco")
    assert "eval/success_rate" in trainings["ppo quad-hover"]["result"]
    table = (out / "bench_gpu.md").read_text()
    assert "| quadrotor | 64 | ok |" in table and "| ppo go1-flat | mujoco | 4 | ok |" in table
    # the SmolVLA fine-tuning items run where lerobot imports (a tiny SmolVLA under --quick)
    vla = {row["name"]: row for row in report["vla"]}
    assert set(vla) == {"reinflow smolvla", "residual smolvla"}
    for row in vla.values():
        if bench_gpu.lerobot_installed():
            assert row["status"] == "ok", row["error"]
            assert row["result"]["size"] == "tiny" and row["result"]["env_steps"] > 0
        else:
            assert row["status"] == "skipped" and "lerobot not installed" in row["error"]


def test_an_overrunning_part_is_stopped() -> None:
    """The time box: a part still running at its timeout gets SIGTERM (then SIGKILL)."""
    status, _, seconds, _ = bench_gpu._run(["bench", "sim", "quadrotor", "--steps", "10000000"], timeout_s=2.0)
    assert status == "timeout" and seconds < 2.0 + bench_gpu.GRACE_S + 5.0


def test_parts_that_do_not_fit_the_budget_are_skipped(tmp_path: Path) -> None:
    """A budget smaller than a part's minimum skips it: nothing starts that cannot finish in ``--budget-s``."""
    out = tmp_path / "bench"
    args = [
        "bench",
        "gpu",
        "--device",
        "cpu",
        "--quick",
        "--backends",
        "quadrotor",
        "--budget-s",
        "5",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    report = json.loads((out / "bench_gpu.json").read_text())
    assert all(row["status"] == "skipped" for row in report["throughput"] + report["training"])
    assert report["training"][0]["error"] == "time budget spent"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_full_run_on_cuda_fits_the_budget(tmp_path: Path) -> None:
    """The command a lent GPU machine runs: every part finishes or is time-boxed inside 8 minutes,
    and MuJoCo-Warp's rows carry numbers. Not yet run on a GPU (none was lent when it was written)."""
    pytest.importorskip("mujoco_warp")
    out = tmp_path / "bench"
    assert main(["bench", "gpu", "--out", str(out)]) == 0
    report = json.loads((out / "bench_gpu.json").read_text())
    assert report["total_s"] < bench_gpu.BUDGET_S
    rows = {row["name"]: row for row in report["throughput"]}
    assert rows["mjwarp:go1-flat"]["status"] == "ok" and rows["mjwarp:go1-flat"]["result"]["steps_per_s"] > 0
    for row in report["training"]:
        assert row["backend"] in ("mjwarp", "own") and row["status"] in ("ok", "time-boxed"), row
        assert row["result"]["env_steps"] > 0
