"""Stop ``embodied train`` at random moments and check that no work is lost and no row is duplicated.

Two campaigns, each against one uninterrupted reference run of the same small configuration
(quad-hover PPO, 16 envs, 6 updates, a periodic evaluation and a separate final evaluation):

``signals``: a trial starts the run, waits a random time (or, for a share of trials, until the
final evaluation has begun, i.e. the checkpoint of the last step exists), sends SIGTERM, SIGINT
or SIGKILL, then resumes with ``embodied train --resume`` until done. Checked per trial:

- after SIGTERM/SIGINT: exit 143/130 (or 0 if the run had already finished), no traceback, and the
  checkpoint holds every env step that a metrics row reports (nothing lost but the step under way);
- after the resume: exit 0, the metrics rows equal the reference's (wall-clock entries aside) and
  the final network, optimizer and normalizer tensors equal the reference's bit for bit.

``diskfull``: the run directory lives on a small tmpfs of its own (needs root for ``mount``); a
trial fills that filesystem at a random moment. Checked: exit 2 with exactly one error line naming
the file and what was kept (or exit 0 when the run finished first); the previous checkpoint loads
(its seal verified) and the metrics rows up to it parse; after freeing the space, the resume matches
the reference as above.

Example (the figures in docs/benchmarks/faults.md)::

    .venv/bin/python bench/fault_campaign.py signals --trials 50 --seed 0 --out bench_out/signals
    .venv/bin/python bench/fault_campaign.py diskfull --trials 20 --seed 0 --out bench_out/diskfull

Writes ``results.json`` (every trial) into ``--out`` and prints a summary; exits 1 when a trial fails.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied.training.run import CHECKPOINT_FILE, load_checkpoint, read_metrics

RUN_ARGS = [
    "quad-hover", "--no-progress", "--seed", "0", "num_envs=16", "algo.num_steps_per_env=16",
    "trainer.total_env_steps=1536", "trainer.eval_every_env_steps=1000", "trainer.eval_episodes=128",
    "trainer.checkpoint_every_updates=2", "trainer.tensorboard=false",
]  # fmt: skip
"""6 updates of 256 env steps; an evaluation at 1024 env steps and a final one at 1536."""
TOTAL_ENV_STEPS = 1536
WINDOW_S: float | None = None
"""Random moments are drawn in [0, WINDOW_S] s after start (``--window-s``; default: the
reference run's wall time, which on a loaded machine can exceed a later run's)."""


def _train(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "embodied.cli", "train", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def comparable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows without wall-clock entries (time stamps, throughput, timings), which differ run to run."""
    return [
        {k: v for k, v in r.items() if k != "time" and not k.startswith("perf/") and "time_s" not in k} for r in rows
    ]


def final_tensors(run_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's algorithm state, flattened by path."""
    out: dict[str, torch.Tensor] = {}

    def walk(prefix: str, obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            out[prefix] = obj
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(obj, list | tuple):
            for i, v in enumerate(obj):
                walk(f"{prefix}[{i}]", v)

    walk("algo", load_checkpoint(run_dir)["algo"])
    return out


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def reference(out: Path) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor], float]:
    run_dir = out / "reference"
    if not (run_dir / CHECKPOINT_FILE).exists():
        start = time.perf_counter()
        proc = _train([*RUN_ARGS, "--run-dir", str(run_dir)])
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err
        (out / "reference_wall_s.txt").write_text(f"{time.perf_counter() - start:.2f}\n")
    wall = float((out / "reference_wall_s.txt").read_text())
    return comparable(read_metrics(run_dir)), final_tensors(run_dir), wall


def _ckpt_steps(run_dir: Path) -> int | None:
    try:
        return int(load_checkpoint(run_dir)["trainer"]["env_steps"])
    except Exception:  # absent, or being replaced right now
        return None


def _resume_to_end(run_dir: Path) -> tuple[int, str]:
    proc = _train(["--resume", str(run_dir), "--no-progress"])
    _, err = proc.communicate(timeout=900)
    return proc.returncode, err


def _check_resumed(trial: dict[str, Any], run_dir: Path, ref_rows: list[dict[str, Any]], ref_tensors: dict) -> None:
    rc, err = _resume_to_end(run_dir)
    trial["resume_rc"] = rc
    if rc != 0:
        trial["failures"].append(f"resume exit {rc}: {err.strip().splitlines()[-1:]}")
        return
    rows = comparable(read_metrics(run_dir))
    if rows != ref_rows:
        first = next(
            (i for i, (a, b) in enumerate(zip(rows, ref_rows, strict=False)) if a != b), min(len(rows), len(ref_rows))
        )
        trial["failures"].append(
            f"metrics differ from the reference at row {first} ({len(rows)} vs {len(ref_rows)} rows)"
        )
    if not same_tensors(final_tensors(run_dir), ref_tensors):
        trial["failures"].append("final tensors differ from the reference")


def signal_trial(index: int, rng: np.random.Generator, out: Path, ref: tuple) -> dict[str, Any]:
    ref_rows, ref_tensors, ref_wall = ref
    run_dir = out / f"trial{index:03d}"
    sig = [signal.SIGTERM, signal.SIGTERM, signal.SIGINT, signal.SIGKILL][index % 4]
    at_final_eval = index % 5 == 4 and sig != signal.SIGKILL
    delay = float(rng.uniform(0.0, WINDOW_S or ref_wall))
    trial: dict[str, Any] = {"trial": index, "signal": signal.Signals(sig).name, "failures": []}
    proc = _train([*RUN_ARGS, "--run-dir", str(run_dir)])
    start = time.perf_counter()
    if at_final_eval:
        trial["moment"] = "final evaluation"
        while proc.poll() is None and _ckpt_steps(run_dir) != TOTAL_ENV_STEPS:
            time.sleep(0.01)
    else:
        trial["moment"] = f"{delay:.2f} s after start"
        while proc.poll() is None and time.perf_counter() - start < delay:
            time.sleep(0.005)
    logged = max((r["env_steps"] for r in read_metrics(run_dir)), default=0) if run_dir.exists() else 0
    if proc.poll() is None:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=900)
    trial["rc"] = proc.returncode
    trial["logged_env_steps_at_signal"] = logged
    kept = _ckpt_steps(run_dir)
    trial["checkpoint_env_steps"] = kept
    if "Traceback" in err:
        trial["failures"].append("traceback: " + err.strip().splitlines()[-1])
    expected = {signal.SIGTERM: (143, 0), signal.SIGINT: (130, 0), signal.SIGKILL: (-9, 0)}[sig]
    if proc.returncode not in expected:
        trial["failures"].append(f"exit {proc.returncode}, expected one of {expected}")
    if sig != signal.SIGKILL and proc.returncode != 0:
        rows_now = read_metrics(run_dir) if run_dir.exists() else []
        newest = max((r["env_steps"] for r in rows_now), default=0)
        if rows_now and (kept is None or kept < newest):
            trial["failures"].append(f"progress lost: rows reach {newest} env steps, the checkpoint {kept}")
    if not (run_dir / "config.yaml").exists():
        trial["note"] = "stopped before the run directory held a config: started again"
        proc = _train([*RUN_ARGS, "--run-dir", str(run_dir)])
        proc.communicate(timeout=900)
    _check_resumed(trial, run_dir, ref_rows, ref_tensors)
    return trial


def _fill(path: Path) -> None:
    """Write zeros into ``path`` until its filesystem is full."""
    chunk = bytes(1 << 16)
    with path.open("wb", buffering=0) as fh:
        try:
            while True:
                fh.write(chunk)
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
        # Fill the last partial chunk too, byte block by byte block.
        for size in (4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    fh.write(bytes(size))


def diskfull_trial(index: int, rng: np.random.Generator, out: Path, ref: tuple) -> dict[str, Any]:
    ref_rows, ref_tensors, ref_wall = ref
    mount = out / f"fs{index:03d}"
    mount.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], check=True)
    trial: dict[str, Any] = {"trial": index, "failures": []}
    try:
        run_dir = mount / "run"
        filler = mount / "filler"
        delay = float(rng.uniform(0.3, WINDOW_S or ref_wall))
        trial["moment"] = f"{delay:.2f} s after start"
        proc = _train([*RUN_ARGS, "--run-dir", str(run_dir)])
        start = time.perf_counter()
        while proc.poll() is None and time.perf_counter() - start < delay:
            time.sleep(0.005)
        kept_before = _ckpt_steps(run_dir)
        if proc.poll() is None:
            _fill(filler)
        _, err = proc.communicate(timeout=900)
        trial["rc"] = proc.returncode
        trial["checkpoint_env_steps_when_full"] = kept_before
        errors = [line for line in err.splitlines() if line.startswith("ERROR")]
        if "Traceback" in err:
            trial["failures"].append("traceback: " + err.strip().splitlines()[-1])
        if proc.returncode == 2:
            trial["error"] = errors[0] if errors else ""
            if len(errors) != 1 or "No space left on device" not in errors[0]:
                trial["failures"].append(f"expected one 'No space left on device' line, got {errors}")
            kept = _ckpt_steps(run_dir)
            trial["checkpoint_env_steps_after"] = kept
            if kept_before is not None and (kept is None or kept < kept_before):
                trial["failures"].append(f"checkpoint damaged: {kept_before} env steps before, {kept} after")
            if kept is not None and "kept" not in errors[0]:
                trial["failures"].append("the error line does not say what was kept")
            if kept is not None:
                rows_kept = int(load_checkpoint(run_dir)["trainer"]["metrics_rows"])
                if len(read_metrics(run_dir)) < rows_kept:
                    trial["failures"].append("metrics rows the checkpoint had seen are gone")
        elif proc.returncode != 0:
            trial["failures"].append(f"exit {proc.returncode}: {errors[-1:]}")
        if filler.exists():
            filler.unlink()
        if proc.returncode == 2 and not (run_dir / "config.yaml").exists():
            proc = _train([*RUN_ARGS, "--run-dir", str(run_dir)])
            proc.communicate(timeout=900)
        _check_resumed(trial, run_dir, ref_rows, ref_tensors)
    finally:
        subprocess.run(["umount", str(mount)], check=False)
    return trial


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("campaign", choices=("signals", "diskfull"))
    parser.add_argument("--trials", type=int, default=50, help="number of trials (default: 50)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random moments (default: 0)")
    parser.add_argument("--out", type=Path, required=True, help="output folder (run directories, results.json)")
    parser.add_argument(
        "--window-s", type=float, default=None, help="moments in [0, this] s (default: reference wall time)"
    )
    args = parser.parse_args()
    global WINDOW_S
    WINDOW_S = args.window_s
    args.out.mkdir(parents=True, exist_ok=True)
    ref = reference(args.out)
    rng = np.random.default_rng(args.seed)
    trial_fn = signal_trial if args.campaign == "signals" else diskfull_trial
    trials = []
    for index in range(args.trials):
        trial = trial_fn(index, rng, args.out, ref)
        trials.append(trial)
        print(json.dumps(trial), flush=True)
    failed = [t for t in trials if t["failures"]]
    summary = {
        "campaign": args.campaign,
        "trials": len(trials),
        "failed": len(failed),
        "reference_wall_s": ref[2],
        "exit_codes": {str(rc): sum(t["rc"] == rc for t in trials) for rc in sorted({t["rc"] for t in trials})},
    }
    (args.out / "results.json").write_text(json.dumps({"summary": summary, "trials": trials}, indent=2))
    print(json.dumps(summary, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
