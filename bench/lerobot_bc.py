"""Behaviour cloning with LeRobot's own trainer on demonstrations that ``embodied collect`` wrote,
evaluated the way ``embodied eval lerobot:PATH --task arm-push`` evaluates.

Three stages, each runnable on its own (``--stages``), all under ``--out-dir``:

``collect``
    ``embodied collect scripted:arm-push --images --camera top --format lerobot``: the scripted
    expert (``tasks/arm_push_expert.py``) writes a LeRobotDataset v3 through LeRobot's own writer
    (state ``observation.state [18]``, camera ``observation.images.top [64, 64, 3]`` PNG frames,
    ``action [3]``, the task's instruction) to ``OUT/demos``. Collection seed 0; the evaluation
    seed (12345) draws other episodes.
``train``
    For each of ``--kinds`` (ACT, Diffusion, SmolVLA), LeRobot's training entry point
    ``python -m lerobot.scripts.lerobot_train`` (the ``lerobot-train`` console script) on that
    folder (``--dataset.root``), on the CPU, wandb off, nothing pushed. The policy configurations
    are the small ones of ``tests/lerobot_support.py`` (SmolVLA on the tiny SmolVLM backbone that
    file writes locally, so nothing is downloaded), given to the trainer as ``--policy.*`` flags,
    with the optimisation changes of :data:`TRAINING` for a short run from random weights. The
    trainer saves with ``save_pretrained`` into ``OUT/train/KIND/checkpoints/last/pretrained_model``.
``eval``
    Each checkpoint through ``load_lerobot_policy`` + ``evaluate`` (the functions ``embodied eval
    lerobot:PATH --task arm-push --camera top`` calls) on ``--eval-episodes`` episodes run as
    parallel envs, each policy in its own process (``bench/lerobot_eval.py``'s measurement) so its
    peak resident memory is its own; the peer on the same episodes is uniform random actions.
    Success rate, seconds per env step, peak RSS.

Results: ``OUT/results.json`` (dataset size, training steps, batch size and wall time per policy,
evaluation rows). Run from the LeRobot environment (``bash scripts/setup_lerobot.sh``)::

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv-lerobot/bin/python bench/lerobot_bc.py \\
        --demos 200 --steps act=400,diffusion=200,smolvla=900 --batch-size 16 --jobs 3

(about 10 minutes on two quiet cores, 40 on a loaded machine; docs/benchmarks/lerobot.md).

One stage at a time: ``--stages collect``, then ``--stages train --kinds act``, then
``--stages eval`` (a stage reads what the earlier ones left in ``--out-dir``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from lerobot_support import KINDS, make_config, write_tiny_vlm  # noqa: E402

TASK, CAMERA, REPO_ID = "arm-push", "top", "local/arm_push_expert"
STAGES = ("collect", "train", "eval")
TRAINING: dict[str, dict[str, Any]] = {
    # ACT's preset (lr 1e-5 for the transformer and the backbone) is for fine-tuning a pretrained
    # ResNet; from random weights in about a thousand steps both learn at 3e-4.
    "act": {"optimizer_lr": 3e-4, "optimizer_lr_backbone": 3e-4},
    # DDIM samples well in 10 steps where DDPM with the small config's 3 does not.
    "diffusion": {"noise_scheduler_type": "DDIM", "num_inference_steps": 10},
    # The tiny backbone is random, so freezing it (the preset, right for a pretrained SmolVLM)
    # would freeze noise: train all of it; warm-up and cosine decay fit the run's length.
    "smolvla": {
        "train_expert_only": False,
        "freeze_vision_encoder": False,
        "optimizer_lr": 3e-4,
    },
}
WARMUP_FRACTION = 0.1
"""Learning-rate warm-up as a share of the run for the kinds with a scheduler (Diffusion: 500
steps by default, SmolVLA: 1000, longer than a short run), and SmolVLA's cosine decay spans the run."""
SKIP_FIELDS = ("input_features", "output_features")  # the trainer derives them from the dataset


def flag_value(value: Any) -> str:
    """A config value as draccus parses it on the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (tuple, list)):
        return "[" + ",".join(flag_value(v) for v in value) + "]"
    return str(value)


def policy_flags(kind: str, vlm: Path, steps: int) -> list[str]:
    """``--policy.*`` flags for ``lerobot_train``: the small config of ``kind`` plus :data:`TRAINING`,
    as the fields that differ from the config class's defaults."""
    extra = dict(TRAINING[kind])
    if kind in ("diffusion", "smolvla"):
        extra["scheduler_warmup_steps"] = max(int(WARMUP_FRACTION * steps), 1)
    if kind == "smolvla":
        extra["scheduler_decay_steps"] = steps
    config = dataclasses.replace(make_config(kind, vlm), **extra)
    default = type(config)()
    flags = [f"--policy.type={config.type}"]
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name in SKIP_FIELDS or value == getattr(default, field.name):
            continue
        flags.append(f"--policy.{field.name}={flag_value(value)}")
    return [*flags, "--policy.device=cpu", "--policy.push_to_hub=false"]


def collect(out: Path, demos: int, num_envs: int) -> dict[str, Any]:
    """``embodied collect`` of ``demos`` expert episodes into ``out/demos`` (replaced)."""
    dataset = out / "demos"
    if dataset.exists():
        shutil.rmtree(dataset)
    cmd = [sys.executable, "-m", "embodied.cli", "collect", f"scripted:{TASK}", "--episodes", str(demos)]
    cmd += ["--num-envs", str(num_envs), "--images", "--camera", CAMERA, "--format", "lerobot", "--out", str(dataset)]
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    info = json.loads((dataset / "meta" / "info.json").read_text())
    return {
        "command": " ".join(["embodied", *cmd[3:]]),
        "episodes": info["total_episodes"],
        "frames": info["total_frames"],
        "fps": info["fps"],
        "wall_s": time.perf_counter() - start,
    }


def train_command(out: Path, kind: str, steps: int, batch_size: int, seed: int) -> list[str]:
    """The ``lerobot_train`` command line for ``kind`` on ``out/demos`` into ``out/train/KIND``."""
    dataset, run = out / "demos", out / "train" / kind
    if not (dataset / "meta" / "info.json").is_file():
        raise SystemExit(f"{dataset}: no LeRobotDataset; run --stages collect first")
    if run.exists():
        shutil.rmtree(run)  # lerobot_train refuses an existing output folder unless resuming
    run.parent.mkdir(parents=True, exist_ok=True)
    vlm = write_tiny_vlm(out / "tiny_vlm") if kind == "smolvla" else Path()
    return [
        sys.executable, "-m", "lerobot.scripts.lerobot_train",
        f"--dataset.repo_id={REPO_ID}", f"--dataset.root={dataset}",
        *policy_flags(kind, vlm, steps),
        f"--steps={steps}", f"--batch_size={batch_size}", "--num_workers=0", "--eval_freq=0",
        f"--save_freq={steps}", f"--log_freq={max(steps // 20, 1)}", "--wandb.enable=false",
        f"--output_dir={run}", f"--seed={seed}",
    ]  # fmt: skip


def train(out: Path, kinds: list[str], steps: dict[str, int], batch: dict[str, int], jobs: int, seed: int) -> None:
    """LeRobot's trainer for each of ``kinds``, up to ``jobs`` at once; each writes ``out/train_KIND.json``
    (and its log ``out/train_KIND.log``); the checkpoint is ``out/train/KIND/checkpoints/last/pretrained_model``."""
    waiting = list(kinds)
    running: dict[str, tuple[subprocess.Popen[bytes], list[str], float]] = {}
    while waiting or running:
        while waiting and len(running) < jobs:
            kind = waiting.pop(0)
            cmd = train_command(out, kind, steps[kind], batch[kind], seed)
            sink = (out / f"train_{kind}.log").open("w")
            running[kind] = (subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT), cmd, time.perf_counter())
        time.sleep(2.0)
        for kind, (proc, cmd, start) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[kind]
            log = out / f"train_{kind}.log"
            if proc.returncode != 0:
                raise SystemExit(f"lerobot_train for {kind} failed (exit {proc.returncode}); see {log}")
            wall_s = time.perf_counter() - start
            text = log.read_text()
            row = {
                "kind": kind,
                "command": " ".join(["lerobot-train", *cmd[3:]]),
                "steps": steps[kind],
                "batch_size": batch[kind],
                "concurrent_trainings": jobs,
                "wall_s": wall_s,
                "s_per_step": wall_s / steps[kind],
                "logged_losses": [
                    float(line.split(" loss:")[1].split()[0]) for line in text.splitlines() if " loss:" in line
                ],
                "checkpoint": str(out / "train" / kind / "checkpoints" / "last" / "pretrained_model"),
            }
            (out / f"train_{kind}.json").write_text(json.dumps(row, indent=2))
            print(json.dumps({k: row[k] for k in ("kind", "steps", "wall_s", "logged_losses")}), flush=True)


def evaluate_all(out: Path, kinds: list[str], episodes: int, seed: int) -> list[dict[str, Any]]:
    """The random peer and each trained checkpoint, each in a fresh ``bench/lerobot_eval.py`` process."""
    rows = []
    for kind in ["random", *kinds]:
        path = "-" if kind == "random" else str(out / "train" / kind / "checkpoints" / "last" / "pretrained_model")
        if path != "-" and not Path(path).is_dir():
            raise SystemExit(f"{path}: no checkpoint; run --stages train --kinds {kind} first")
        cmd = [sys.executable, str(ROOT / "bench" / "lerobot_eval.py"), "--one", kind, path]
        done = subprocess.run([*cmd, "--episodes", str(episodes), "--seed", str(seed)], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"evaluating {kind} failed:\n{done.stderr[-3000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        rows[-1]["checkpoint"] = None if path == "-" else path
        print(json.dumps(rows[-1]), flush=True)
    peer = rows[0]
    for row in rows:
        row["ratio_to_random"] = row["s_per_env_step"] / peer["s_per_env_step"]
        row["beats_random"] = row["success_rate"] > peer["success_rate"]
    return rows


def per_kind(text: str, kinds: list[str], flag: str) -> dict[str, int]:
    """``N`` (every kind) or ``act=N,diffusion=N,...`` -> kind -> N."""
    if "=" not in text:
        return {kind: int(text) for kind in kinds}
    values = {k: int(v) for k, v in (item.split("=", 1) for item in text.split(","))}
    missing = [kind for kind in kinds if kind not in values]
    if missing:
        raise SystemExit(f"{flag} {text}: no value for {missing}; give KIND=N for each of {kinds}")
    return values


def gather(out: Path) -> dict[str, Any]:
    """``out/results.json``: what the stages left in ``out`` (dataset, training runs, evaluation)."""
    results: dict[str, Any] = {}
    for name in ("dataset", "eval"):
        if (out / f"{name}.json").is_file():
            results[name] = json.loads((out / f"{name}.json").read_text())
    results["train"] = {p.stem[len("train_") :]: json.loads(p.read_text()) for p in sorted(out.glob("train_*.json"))}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench_out" / "lerobot_bc", help="all outputs here")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma list of {STAGES} (default: all)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"policies to train/evaluate (default: {KINDS})")
    parser.add_argument("--demos", type=int, default=200, help="expert episodes to collect (default: 200)")
    parser.add_argument("--collect-envs", type=int, default=50, help="parallel envs while collecting (default: 50)")
    parser.add_argument(
        "--steps",
        default="act=400,diffusion=200,smolvla=900",
        help="training steps: N, or KIND=N,... (default: act=400,diffusion=200,smolvla=900, the recorded budget)",
    )
    parser.add_argument("--batch-size", default="16", help="training batch: N, or KIND=N,... (default: 16)")
    parser.add_argument("--jobs", type=int, default=1, help="trainings run at once, one thread each (default: 1)")
    parser.add_argument("--train-seed", type=int, default=1000, help="lerobot_train's --seed (default: its 1000)")
    parser.add_argument("--eval-episodes", type=int, default=100, help="evaluation episodes (default: 100)")
    parser.add_argument("--seed", type=int, default=12345, help="evaluation seed (default: embodied eval's)")
    args = parser.parse_args()
    stages = args.stages.split(",")
    kinds = args.kinds.split(",")
    unknown = sorted(set(stages) - set(STAGES)) + sorted(set(kinds) - set(KINDS))
    if unknown:
        raise SystemExit(f"unknown stage or kind {unknown}; stages {STAGES}, kinds {KINDS}")
    steps = per_kind(args.steps, kinds, "--steps")
    batch = per_kind(args.batch_size, kinds, "--batch-size")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    if "collect" in stages:
        dataset = collect(out, args.demos, args.collect_envs)
        (out / "dataset.json").write_text(json.dumps(dataset, indent=2))
        print(json.dumps(dataset), flush=True)
    if "train" in stages:
        train(out, kinds, steps, batch, args.jobs, args.train_seed)
    if "eval" in stages:
        rows = evaluate_all(out, kinds, args.eval_episodes, args.seed)
        (out / "eval.json").write_text(json.dumps(rows, indent=2))
    gather(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
