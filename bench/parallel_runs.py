"""Run many ``embodied train`` jobs side by side, each pinned to its own CPU cores, and tabulate
how fast each reached its success target.

Used for hyperparameter sweeps and seed studies on a many-core machine: env steps to a target
are deterministic per seed (and torch build), so they transfer to the 2-core reference machine,
where ``BENCHMARKS.md`` then measures wall time on the chosen settings.

Spec file (YAML), one entry per configuration::

    - name: ppo_base            # row label and run-directory prefix
      task: quad-hover
      algo: ppo
      seeds: [0, 1, 2]
      overrides: ["num_envs=256", "algo.num_steps_per_env=16"]   # key=value, as on the CLI
      timeout_s: 300            # optional, default --timeout-s

Example::

    python bench/parallel_runs.py --spec sweep.yaml --out /tmp/sweep --workers 12 --cores-per-run 1

Writes ``results.json`` (every run: evaluations, first and held target, return code) and
``results.md`` (one row per configuration: median and per-seed env steps and training seconds
to the held target) into ``--out``, and prints the table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from embodied.training.run import read_metrics

log = logging.getLogger("parallel_runs")


@dataclass
class Job:
    """One ``embodied train`` invocation."""

    config: str
    seed: int
    argv: list[str]
    run_dir: Path
    timeout_s: float
    result: dict[str, Any] = field(default_factory=dict)


def load_spec(path: Path, out_dir: Path, default_timeout_s: float, threads: int) -> list[Job]:
    """Jobs from the spec file (module docstring); raises ValueError naming the bad entry."""
    entries = yaml.safe_load(path.read_text())
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a list of run entries, got {type(entries).__name__}")
    base = _embodied_command()
    jobs: list[Job] = []
    for i, entry in enumerate(entries):
        missing = [k for k in ("name", "task", "algo") if k not in entry]
        if missing:
            raise ValueError(f"{path}: entry {i} lacks {', '.join(missing)}")
        for seed in entry.get("seeds", [0]):
            run_dir = out_dir / "runs" / f"{entry['name']}_s{seed}"
            argv = [
                *base, "train", entry["task"], "--algo", entry["algo"], "--seed", str(seed),
                "--run-dir", str(run_dir), "--no-progress", f"trainer.torch_threads={threads}",
                *entry.get("overrides", []),
            ]  # fmt: skip
            jobs.append(Job(entry["name"], int(seed), argv, run_dir, float(entry.get("timeout_s", default_timeout_s))))
    return jobs


def _embodied_command() -> list[str]:
    exe = shutil.which("embodied")
    return [exe] if exe else [sys.executable, "-m", "embodied.cli"]


def summarize_evals(run_dir: Path) -> dict[str, Any]:
    """The evaluations in a run's ``metrics.jsonl``: env steps, training s, success, return."""
    evals = [
        {
            "env_steps": row.get("eval/env_steps", row.get("step", 0)),
            "train_time_s": row.get("eval/train_time_s", float("nan")),
            "success_rate": row["eval/success_rate"],
            "mean_return": row.get("eval/mean_return", float("nan")),
        }
        for row in read_metrics(run_dir)
        if "eval/success_rate" in row
    ]
    return {"evals": evals}


def target_points(evals: list[dict[str, float]], target: float) -> dict[str, Any]:
    """First evaluation at or above ``target`` and the second of the first two in a row."""
    first = next((e for e in evals if e["success_rate"] >= target), None)
    held = next(
        (b for a, b in itertools.pairwise(evals) if a["success_rate"] >= target and b["success_rate"] >= target), None
    )
    return {"first": first, "held": held}


def run_jobs(jobs: list[Job], workers: int, cores_per_run: int) -> None:
    """Run ``jobs`` with at most ``workers`` at once, each pinned to ``cores_per_run`` cores."""
    available = sorted(os.sched_getaffinity(0))
    slots = [available[i * cores_per_run : (i + 1) * cores_per_run] for i in range(workers)]
    if any(len(s) < cores_per_run for s in slots):
        raise ValueError(
            f"{workers} workers x {cores_per_run} cores need more than the {len(available)} cores available"
        )
    pending = list(jobs)
    running: dict[int, tuple[Job, subprocess.Popen[bytes], float, Any]] = {}
    free = list(range(workers))
    while pending or running:
        while pending and free:
            slot = free.pop(0)
            job = pending.pop(0)
            job.run_dir.parent.mkdir(parents=True, exist_ok=True)
            log_file = open(job.run_dir.parent / f"{job.run_dir.name}.log", "wb")  # noqa: SIM115 (closed on exit)
            env = dict(os.environ, OMP_NUM_THREADS=str(cores_per_run), MKL_NUM_THREADS=str(cores_per_run))
            proc = subprocess.Popen(
                job.argv, stdout=log_file, stderr=subprocess.STDOUT, env=env, preexec_fn=_pin(slots[slot])
            )
            running[slot] = (job, proc, time.perf_counter(), log_file)
            log.info("started %s seed %d on cores %s", job.config, job.seed, slots[slot])
        time.sleep(0.5)
        for slot, (job, proc, start, log_file) in list(running.items()):
            elapsed = time.perf_counter() - start
            if proc.poll() is None and elapsed > job.timeout_s:
                proc.kill()
                proc.wait()
                job.result["timed_out"] = True
            if proc.poll() is not None:
                log_file.close()
                job.result |= {"returncode": proc.returncode, "wall_s": elapsed}
                job.result |= summarize_evals(job.run_dir)
                log.info("finished %s seed %d (rc %s, %.0f s)", job.config, job.seed, proc.returncode, elapsed)
                del running[slot]
                free.append(slot)


def _pin(cores: list[int]) -> Callable[[], None]:
    def pin() -> None:
        os.sched_setaffinity(0, cores)

    return pin


def table(jobs: list[Job], target: float) -> str:
    """Markdown table: per configuration, held-target env steps and training seconds per seed."""
    lines = [
        f"| config | seeds held ≥ {target:.0%} | held: env steps (median) | held: training s (median) | per seed (steps / s) | best success per seed |",
        "|---|---|---|---|---|---|",
    ]
    for config in dict.fromkeys(j.config for j in jobs):
        rows = [j for j in jobs if j.config == config]
        points = [target_points(j.result.get("evals", []), target)["held"] for j in rows]
        held = [p for p in points if p is not None]
        steps = statistics.median(p["env_steps"] for p in held) if held else float("nan")
        secs = statistics.median(p["train_time_s"] for p in held) if held else float("nan")
        per_seed = ", ".join(
            f"s{j.seed}: {p['env_steps']:.0f} / {p['train_time_s']:.1f}" if p else f"s{j.seed}: –"
            for j, p in zip(rows, points)
        )
        best = ", ".join(
            f"{max((e['success_rate'] for e in j.result.get('evals', [])), default=float('nan')):.3f}" for j in rows
        )
        lines.append(f"| {config} | {len(held)}/{len(rows)} | {steps:.0f} | {secs:.2f} | {per_seed} | {best} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", type=Path, required=True, help="YAML list of run entries (see above)")
    parser.add_argument("--out", type=Path, required=True, help="output directory (runs, logs, results)")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--cores-per-run", type=int, default=1, help="cores (and torch threads) per run")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="default per-run wall limit")
    parser.add_argument("--target", type=float, default=0.95, help="success rate counted as reached")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    jobs = load_spec(args.spec, args.out, args.timeout_s, args.cores_per_run)
    run_jobs(jobs, args.workers, args.cores_per_run)
    results = [
        {
            "config": j.config,
            "seed": j.seed,
            "argv": j.argv,
            **j.result,
            **target_points(j.result.get("evals", []), args.target),
        }
        for j in jobs
    ]
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    md = table(jobs, args.target)
    (args.out / "results.md").write_text(md + "\n")
    sys.stdout.write(md + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
