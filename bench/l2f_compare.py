"""quad-hover PPO against the L2F trainer (learning-to-fly's ``training_benchmark``) on one machine.

The anchor of the quadrotor task: L2F's TD3 trains a Crazyflie hover policy in 300,001 steps of
one env, its fastest configuration without logging, UI or checkpoints. Its score is its own
"Training took: X s" line (the whole 300k-step run; it has no success criterion of its own). Ours
is ``embodied train quad-hover [--preset NAME]`` with one torch thread, scored two ways:

- ``held``: as ``rslrl_compare.py`` scores it, training seconds (evaluation excluded) to the second
  of two consecutive evaluations at the config's success target, or the first one where none is
  held (both reported). With ``--preset nominal``: the nominal vehicle's score (issue 18's target
  ≤ 0.1×).
- ``verified`` (``--verify``): ``embodied verify`` with its default gates runs on each of our runs
  after training; the score is the run's training seconds where its last policy passed, and the
  summary counts the seeds that passed (issue 43's target for the default command, its default
  preset ``sweep``: ≤ 1×, at most 2×).

The two run side by side, each pinned to its own core (``--cores 0,1``), so a busy neighbour
slows both alike; with one core they run one after the other.

Building the L2F trainer (exact commands used; the json submodule replaced by Debian's headers
because only its CMake target is needed; MKL from PyPI, the README's fastest configuration)::

    git clone https://github.com/arplaboratory/learning-to-fly /tmp/l2f
    cd /tmp/l2f && git submodule update --init -- external/rl_tools
    apt-get install -y cmake g++ libboost-dev nlohmann-json3-dev
    printf 'add_library(nlohmann_json INTERFACE)\\nadd_library(nlohmann_json::nlohmann_json ALIAS nlohmann_json)\\n' \\
        > external/rl_tools/external/json/CMakeLists.txt
    python3 -m venv /tmp/mklenv && /tmp/mklenv/bin/pip install mkl-devel
    mkdir build_mkl && cd build_mkl
    cmake .. -DCMAKE_BUILD_TYPE=Release -DRL_TOOLS_BACKEND_ENABLE_MKL:BOOL=ON \\
        -DMKL_DIR=/tmp/mklenv/lib/cmake/mkl -DMKL_THREADING=sequential -DMKL_INTERFACE=lp64
    make training_benchmark

(OpenBLAS instead: ``apt-get install libopenblas-dev`` and ``-DRL_TOOLS_BACKEND_ENABLE_OPENBLAS:BOOL=ON``;
run it with ``OPENBLAS_NUM_THREADS=1``, its threads only contend on 2 cores.)

Examples (results.json and both contenders' logs under --out)::

    LD_LIBRARY_PATH=/tmp/mklenv/lib .venv/bin/python bench/l2f_compare.py \\
        --l2f-binary /tmp/l2f/build_mkl/src/training_benchmark --seeds 0,1,2 --cores 0,1
    LD_LIBRARY_PATH=/tmp/mklenv/lib .venv/bin/python bench/l2f_compare.py \\
        --l2f-binary /tmp/l2f/build_mkl/src/training_benchmark --seeds 0,1,2 --cores 0,1 --verify

Not a test: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rslrl_compare import machine_info, preset_cfg, run_ours

from embodied.experiment import load_experiment
from embodied.sweeps.report import target_points

L2F_TIME = re.compile(r"Training took:\s*([0-9.]+)\s*s")


def run_l2f(binary: Path, cores: list[int], out: Path, index: int) -> dict[str, Any]:
    """One ``training_benchmark`` run pinned to ``cores``: its reported and wall seconds."""
    log_path = out / f"l2f_run{index}.log"
    start = time.perf_counter()
    with log_path.open("w") as log:
        code = subprocess.call(
            [str(binary)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=out,
            preexec_fn=lambda: os.sched_setaffinity(0, set(cores)),
        )
    wall_s = time.perf_counter() - start
    match = L2F_TIME.search(log_path.read_text())
    if code != 0 or match is None:
        return {"error": f"exit code {code}; no 'Training took' line in {log_path}", "wall_s": wall_s}
    return {"training_s": float(match.group(1)), "wall_s": wall_s}


def run_success_rule(run_dir: Path, target: float | None, hold: str) -> tuple[float | None, str]:
    """The success target and hold rule the run trained with (its ``config.yaml``, so an
    ``--override trainer.success_target=...`` counts), or the shipped ones if it wrote none."""
    config = run_dir / "config.yaml"
    if not config.is_file():
        return target, hold
    trainer = load_experiment(config).trainer
    return trainer.success_target, trainer.success_hold


def score_ours(res: dict[str, Any], target: float | None, hold: str = "each") -> dict[str, Any]:
    """Seconds to the held target (rule ``hold``, the config's ``success_hold``) and to the first
    evaluation at it (None where not reached, or with no target)."""
    evals = res.get("evals", [])
    held = None if target is None else target_points(evals, target, hold)["held"]
    first = None if target is None else next((e for e in evals if e["success_rate"] >= target), None)
    return {
        "held_s": None if held is None else held["train_time_s"],
        "held_env_steps": None if held is None else held["env_steps"],
        "first_s": None if first is None else first["train_time_s"],
        "first_env_steps": None if first is None else first["env_steps"],
    }


def verify_ours(run_dir: Path, cores: list[int], out: Path, seed: int) -> dict[str, Any]:
    """``embodied verify`` of one of our runs with its default gates, pinned to ``cores``: whether
    it passed, each check's success rate, and the run's training seconds (the policy verified is
    the run's last one, so that is the time to it)."""
    command = [
        sys.executable, "-m", "embodied.cli", "verify", str(run_dir), "--no-progress", "--threads", "1", "--json",
    ]  # fmt: skip
    with (out / f"verify_seed{seed}.err").open("w") as err:
        proc = subprocess.run(
            command,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            preexec_fn=lambda: os.sched_setaffinity(0, set(cores)),
        )
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"error": f"exit code {proc.returncode}; no JSON report (see {out / f'verify_seed{seed}.err'})"}
    failed = [g["name"] for g in report.get("gate_results", []) if not g.get("passed")]
    return {
        "gates_passed": bool(report["gates_passed"]),
        "failed_gates": failed,
        "success_rate": report["success_rate"],
    }


def median_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--l2f-binary", type=Path, required=True, help="a built training_benchmark (see above)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds of ours; L2F runs once per seed")
    parser.add_argument(
        "--cores", default="0,1", help="two cores: side by side, one each; one core: one after the other"
    )
    parser.add_argument("--out", type=Path, default=Path("bench_out/l2f"))
    parser.add_argument(
        "--max-env-steps", type=int, default=None, help="our step budget per run (default: the shipped config's)"
    )
    parser.add_argument(
        "--preset",
        default=None,
        help="train ours with `--preset NAME` (e.g. nominal: the nominal vehicle only; default: the task's "
        "default preset, as `embodied train quad-hover` without --preset: sweep)",
    )
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for our runs, after the preset (repeatable; e.g. env.sim.compile=true: "
        "the fused compiled step, loaded from the compiled-step cache when an earlier run filled it)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="run `embodied verify` (default gates) on each of our runs; the summary then counts the seeds "
        "whose last policy passed and the median training seconds to it (issue 43's score)",
    )
    args = parser.parse_args(argv)
    if not args.l2f_binary.is_file():
        parser.error(f"--l2f-binary {args.l2f_binary}: no such file (build it as the docstring shows)")
    args.out.mkdir(parents=True, exist_ok=True)
    cores = [int(c) for c in args.cores.split(",")]
    side_by_side = len(cores) >= 2
    shipped = preset_cfg(args.preset).trainer
    target, max_env_steps = shipped.success_target, args.max_env_steps or shipped.total_env_steps
    l2f_runs: list[dict[str, Any]] = []
    ours_runs: dict[str, dict[str, Any]] = {}
    for index, seed in enumerate(int(s) for s in args.seeds.split(",")):
        l2f_cores, our_cores = ([cores[0]], [cores[1]]) if side_by_side else (cores, cores)
        with ThreadPoolExecutor(max_workers=2 if side_by_side else 1) as pool:
            l2f = pool.submit(run_l2f, args.l2f_binary.resolve(), l2f_cores, args.out, index)
            ours = pool.submit(
                run_ours, seed, our_cores, max_env_steps, args.out, None, args.preset, tuple(args.override)
            )
        l2f_runs.append(l2f.result())
        res = ours.result()
        res["score"] = score_ours(res, *run_success_rule(args.out / f"ours_seed{seed}", target, shipped.success_hold))
        if args.verify and res.get("evals"):
            res["verify"] = verify_ours(args.out / f"ours_seed{seed}", our_cores, args.out, seed)
            res["score"]["trained_s"] = res["evals"][-1]["train_time_s"]
        ours_runs[str(seed)] = res
        print(f"seed {seed}: L2F {l2f_runs[-1]}; ours {res['score']}")
    l2f_s = median_or_none([r.get("training_s") for r in l2f_runs])
    summary: dict[str, Any] = {
        "l2f_median_training_s": l2f_s,
        "ours_median_held_s": median_or_none([r["score"]["held_s"] for r in ours_runs.values()]),
        "ours_held_seeds": sum(r["score"]["held_s"] is not None for r in ours_runs.values()),
        "ours_median_first_s": median_or_none([r["score"]["first_s"] for r in ours_runs.values()]),
        "seeds": len(ours_runs),
        "preset": args.preset,
        "overrides": args.override,
    }
    if args.verify:
        verified = [r for r in ours_runs.values() if r.get("verify", {}).get("gates_passed")]
        summary["ours_verified_seeds"] = len(verified)
        summary["ours_median_verified_s"] = median_or_none([r["score"]["trained_s"] for r in verified])
        summary["ratio_verified_vs_l2f"] = (
            None
            if (summary["ours_median_verified_s"] is None or not l2f_s)
            else summary["ours_median_verified_s"] / l2f_s
        )
    for key in ("held", "first"):
        ours_s = summary[f"ours_median_{key}_s"]
        summary[f"ratio_{key}_vs_l2f"] = None if (ours_s is None or not l2f_s) else ours_s / l2f_s
    machine = machine_info(cores, side_by_side)
    (args.out / "results.json").write_text(
        json.dumps({"summary": summary, "machine": machine, "l2f": l2f_runs, "ours": ours_runs}, indent=1)
    )
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
