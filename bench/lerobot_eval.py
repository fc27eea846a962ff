"""Seconds per env step and peak memory of LeRobot policies run as ``embodied eval lerobot:PATH``.

Each policy (ACT, Diffusion, SmolVLA; the small configurations of ``tests/lerobot_support.py``,
random weights, normalization from a LeRobotDataset that ``embodied collect`` wrote) is saved with
``save_pretrained`` and evaluated on arm-push with the top camera through LeRobot's own loading
code, each in a fresh process so that its peak resident memory is its own. The peer, in the same
run: uniform random actions on the same envs (the simulator's and renderer's share of a step).
Success of random weights is reported but says nothing about the architectures.

Run from the LeRobot environment::

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv-lerobot/bin/python bench/lerobot_eval.py \
        --episodes 8 --out bench_out/lerobot_eval.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch
from lerobot_support import KINDS, save_policy

from embodied import registry
from embodied.cli import main
from embodied.config import apply_overrides
from embodied.training.evaluate import EvalEnvs, evaluate
from embodied.training.lerobot_base import load_lerobot_policy

TASK, CAMERA = "arm-push", "top"


def measure(kind: str, path: Path | None, episodes: int, seed: int) -> dict[str, Any]:
    """One evaluation in this process: ``kind`` "random" or a saved policy at ``path``."""
    torch.set_num_threads(1)
    env_cfg = apply_overrides(registry.task_cfg(TASK), {"backend": {"camera": CAMERA}}, "bench")
    steps = {"n": 0}

    def load(env: Any) -> Any:
        if path is None:
            gen = torch.Generator().manual_seed(seed)

            def random_act(obs: Any) -> torch.Tensor:
                steps["n"] += 1
                return torch.rand(env.num_envs, env.action_dim, generator=gen) * 2.0 - 1.0

            return random_act
        policy = load_lerobot_policy(f"lerobot:{path}", TASK, env.obs_spec, env.action_dim, CAMERA)

        def act(obs: Any) -> torch.Tensor:
            steps["n"] += 1
            return policy.act(obs, deterministic=True)

        return act

    start = time.perf_counter()
    result = evaluate(load, EvalEnvs(TASK, env_cfg, "cpu"), episodes=episodes, seed=seed)
    wall_s = time.perf_counter() - start
    return {
        "kind": kind,
        "episodes": result.episodes,
        "success_rate": result.success_rate,
        "mean_episode_length": result.mean_episode_length,
        "batched_steps": steps["n"],
        "s_per_batched_step": wall_s / max(steps["n"], 1),
        "s_per_env_step": wall_s / max(steps["n"] * episodes, 1),
        "wall_s": wall_s,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    }


def main_cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=8, help="episodes = parallel envs (default: 8)")
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--kinds", default=",".join(("random", *KINDS)))
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--one", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)  # child process
    args = parser.parse_args()
    if args.one:
        kind, path = args.one
        print(json.dumps(measure(kind, None if path == "-" else Path(path), args.episodes, args.seed)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "demos"
        argv = ["collect", f"scripted:{TASK}", "--episodes", "3", "--num-envs", "3", "--images", "--camera", CAMERA]
        assert main([*argv, "--format", "lerobot", "--out", str(dataset)]) == 0
        for kind in args.kinds.split(","):
            path = "-" if kind == "random" else str(save_policy(kind, dataset, Path(tmp) / kind))
            cmd = [
                sys.executable,
                __file__,
                "--one",
                kind,
                path,
                "--episodes",
                str(args.episodes),
                "--seed",
                str(args.seed),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]))
    peer = next((r for r in rows if r["kind"] == "random"), None)
    for row in rows:
        if peer is not None:
            row["ratio_to_random"] = row["s_per_env_step"] / peer["s_per_env_step"]
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main_cli())
