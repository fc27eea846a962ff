"""Learning speed against Stable-Baselines3 on MuJoCo HalfCheetah / Ant: return vs training wall time.

Runs several contenders, each pinned to its own CPU cores, each for at most ``--budget-s`` seconds of
training wall time (evaluation excluded on both sides), evaluating the deterministic policy every
``--eval-every-steps`` env steps on a separate env, and writes ``results.json`` and
``return_vs_time.png`` to ``--out``. For every contender it reports the training time (and env steps)
to each return threshold, the last evaluated return, env steps and env steps/s.

Contenders (``--contenders``, comma-separated):
  ours-sac, ours-fasttd3, ours-ppo  the real CLI: ``python -m embodied.cli train mujoco-<task> --algo ...``
                                   (configs/mujoco_<task>/<algo>.yaml plus ``--ours-override``); curves
                                   are read from the run's ``metrics.jsonl`` (``eval/mean_return``,
                                   ``eval/train_time_s``, which excludes evaluation).
  sb3-sac, sb3-ppo                 Stable-Baselines3 on gymnasium ``HalfCheetah-v5`` / ``Ant-v5`` with the
                                   rl-baselines3-zoo MuJoCo hyperparameters (``SB3_HYPERPARAMS``); a
                                   callback stops the training clock while it evaluates.
  sbx-sac, sbx-ppo                 SBX (Stable-Baselines-JAX: the same algorithms and API, networks and
                                   updates compiled by JAX) with the same hyperparameters, environments,
                                   evaluation and clock (ReLU maps to JAX's ReLU).
Our ``mujoco-halfcheetah`` / ``mujoco-ant`` tasks follow the v5 observation, reward, termination and
reset definitions (tasks/mujoco_locomotion.py), so the returns are on the same scale.

SB3 is not a dependency of the project: run this script from a side environment, created from
the repository root (the exact commands used):

    python3 -m venv /tmp/sb3venv
    /tmp/sb3venv/bin/pip install torch==2.13.0
    /tmp/sb3venv/bin/pip install stable-baselines3 mujoco==4.0.0 gymnasium==1.4.0
    /tmp/sb3venv/bin/pip install pyyaml rich matplotlib imageio   # imageio: gymnasium's MuJoCo envs import it
    /tmp/sb3venv/bin/pip install -e . --no-deps
    /tmp/sb3venv/bin/pip install sbx-rl "jax[cpu]"   # for the sbx-* contenders

Offline machine (Python 3.12 with torch, numpy, matplotlib, pillow, cloudpickle, pyyaml, rich
already installed): the cp312 wheels in ``.whl/`` (git-ignored) cover the rest:

    pip install --no-index --find-links .whl stable-baselines3 gymnasium farama-notifications mujoco \
        mujoco-core mujoco-studio glfw pyopengl websockets imageio
    pip install -e . --no-deps

Examples:

    /tmp/sb3venv/bin/python bench/sb3_compare.py --task halfcheetah --contenders ours-sac,sb3-sac \\
        --budget-s 1800 --cores-per-contender 1 --out bench_out/hc_sac
    /tmp/sb3venv/bin/python bench/sb3_compare.py --task ant --contenders ours-ppo,sb3-ppo,ours-fasttd3,sb3-sac \\
        --budget-s 3600 --cores-per-contender 4 --ours-override device=cuda --out bench_out/ant

Not a test: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing as mp
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embodied.stop import EXIT_TERMINATED, Terminated, raise_terminated
from embodied.training.run import read_metrics

TASKS = {"halfcheetah": ("mujoco-halfcheetah", "HalfCheetah-v5"), "ant": ("mujoco-ant", "Ant-v5")}
OURS_ALGOS = ("sac", "fasttd3", "ppo")
SB3_ALGOS = ("sac", "ppo")
"""Algorithms of the ``sb3-`` and ``sbx-`` contenders (SBX mirrors SB3's API and takes its hyperparameters)."""
PEER_LIBRARIES = {"sb3": "stable_baselines3", "sbx": "sbx"}
"""Contender side -> the module it trains with."""
SIDE_ENV_HINT = (
    "{module} is not installed in this Python ({exe}). It is not a dependency of embodied; "
    "create the side environment described at the top of bench/sb3_compare.py (python3 -m venv "
    "/tmp/sb3venv; pip install torch==2.13.0; pip install stable-baselines3 mujoco gymnasium pyyaml rich "
    "matplotlib imageio; pip install -e . --no-deps; for sbx-*: pip install sbx-rl jax[cpu]) and run this "
    "script with /tmp/sb3venv/bin/python."
)
COMPARABILITY = (
    "embodied's mujoco-halfcheetah / mujoco-ant follow gymnasium's HalfCheetah-v5 / Ant-v5 observations, "
    "reward terms, terminations, episode length (1000) and reset noise with default arguments, so "
    "undiscounted episode returns are directly comparable. Times are training wall time: evaluation "
    "(and our checkpoint writing) is excluded on both sides."
)

# rl-baselines3-zoo MuJoCo settings (hyperparams/sac.yml, ppo.yml; written out here, including the SB3
# defaults they rely on, so the JSON records every value). "normalize" means VecNormalize(obs, reward).
_SB3_SAC_MUJOCO: dict[str, Any] = {
    "learning_rate": 3e-4,
    "buffer_size": 1_000_000,
    "learning_starts": 10_000,
    "batch_size": 256,
    "tau": 0.005,
    "gamma": 0.99,
    "train_freq": 1,
    "gradient_steps": 1,
    "ent_coef": "auto",
    "policy_kwargs": {"net_arch": [256, 256]},
}
SB3_HYPERPARAMS: dict[tuple[str, str], dict[str, Any]] = {
    ("sac", "halfcheetah"): dict(_SB3_SAC_MUJOCO),
    ("sac", "ant"): dict(_SB3_SAC_MUJOCO),
    # The zoo's tuned HalfCheetah entry (1 env, normalized observations and rewards).
    ("ppo", "halfcheetah"): {
        "normalize": True,
        "n_steps": 512,
        "batch_size": 64,
        "n_epochs": 20,
        "learning_rate": 2.0633e-05,
        "gamma": 0.98,
        "gae_lambda": 0.92,
        "clip_range": 0.1,
        "ent_coef": 0.000401762,
        "vf_coef": 0.58096,
        "max_grad_norm": 0.8,
        "policy_kwargs": {
            "log_std_init": -2.0,
            "ortho_init": False,
            "activation_fn": "relu",
            "net_arch": {"pi": [256, 256], "vf": [256, 256]},
        },
    },
    # The zoo's Ant entry is its MuJoCo default: PPO defaults with normalized observations and rewards.
    ("ppo", "ant"): {
        "normalize": True,
        "n_steps": 2048,
        "batch_size": 64,
        "n_epochs": 10,
        "learning_rate": 3e-4,
        "gamma": 0.99,
        "gae_lambda": 0.95,
        "clip_range": 0.2,
        "ent_coef": 0.0,
        "vf_coef": 0.5,
        "max_grad_norm": 0.5,
    },
}
DEFAULT_THRESHOLDS = {"halfcheetah": "1000,2000,3000,5000", "ant": "2000,3000,4000,5000"}
DEFAULT_EVAL_EVERY_STEPS = {"sac": 10_000, "fasttd3": 10_000, "ppo": 50_000}
"""Off-policy runs take ~10x fewer env steps per second than PPO on a CPU: evaluate them more often."""


@dataclass
class BenchCfg:
    """Settings shared by every contender."""

    task: str
    budget_s: float
    eval_every_steps: int | None
    eval_episodes: int
    seed: int
    out: Path
    ours_overrides: list[str]
    python: str

    def eval_every(self, algo: str) -> int:
        return self.eval_every_steps or DEFAULT_EVAL_EVERY_STEPS[algo]


@dataclass
class Contender:
    """One learner: ``side`` is ``ours``, ``sb3`` or ``sbx``; ``cores`` are the CPUs it is pinned to."""

    name: str
    side: str
    algo: str
    cores: list[int] = field(default_factory=list)


# ------------------------------------------------------------------------------------------- results
def summarize(
    evals: list[dict[str, float]], thresholds: list[float], progress: list[tuple[float, int]]
) -> dict[str, Any]:
    """Time/steps to each threshold (first eval at or above it; None if never), last return, steps/s.

    ``evals``: rows with ``env_steps``, ``train_time_s``, ``mean_return`` in the order they were run.
    ``progress``: ``(train_time_s, env_steps)`` samples in order; the last one is the end of training.
    ``env_steps_per_s_second_half`` is the rate over the second half of the training time, i.e. after
    the cheap random-action warm-up of off-policy learners: the steady learning throughput.
    """
    train_time_s, env_steps = progress[-1] if progress else (0.0, 0)
    half = next(((t, n) for t, n in progress if t >= train_time_s / 2), None)
    steady = (
        round((env_steps - half[1]) / (train_time_s - half[0]), 1)
        if half is not None and train_time_s - half[0] > 1e-6
        else None
    )
    to_time: dict[str, float | None] = {}
    to_steps: dict[str, int | None] = {}
    for threshold in thresholds:
        hit = next((e for e in evals if e["mean_return"] >= threshold), None)
        to_time[f"{threshold:g}"] = None if hit is None else round(hit["train_time_s"], 2)
        to_steps[f"{threshold:g}"] = None if hit is None else int(hit["env_steps"])
    return {
        "time_to_threshold_s": to_time,
        "env_steps_to_threshold": to_steps,
        "final_return": evals[-1]["mean_return"] if evals else None,
        "best_return": max(e["mean_return"] for e in evals) if evals else None,
        "env_steps": env_steps,
        "train_time_s": round(train_time_s, 2),
        "env_steps_per_s": round(env_steps / train_time_s, 1) if train_time_s > 0 else None,
        "env_steps_per_s_second_half": steady,
        "progress": [(round(t, 3), n) for t, n in progress],
    }


def plot(results: list[dict[str, Any]], thresholds: list[float], title: str, path: Path) -> None:
    """Return vs training wall time for all contenders, thresholds as dotted lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for res in results:
        evals = res.get("evals") or []
        if evals:
            ax.plot(
                [e["train_time_s"] for e in evals],
                [e["mean_return"] for e in evals],
                marker="o",
                ms=3,
                label=res["name"],
            )
    for threshold in thresholds:
        ax.axhline(threshold, color="grey", lw=0.6, ls=":")
    ax.set_xlabel("training wall time [s] (evaluation excluded)")
    ax.set_ylabel("deterministic eval return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------------- ours
class OursRun:
    """``embodied train`` in a subprocess, stopped once its logged training time reaches the budget."""

    def __init__(self, c: Contender, cfg: BenchCfg) -> None:
        self.c, self.cfg = c, cfg
        self.dir = cfg.out / c.name
        self.run_dir = self.dir / "run"
        self.dir.mkdir(parents=True, exist_ok=True)
        task = TASKS[cfg.task][0]
        self.command = [
            cfg.python, "-m", "embodied.cli", "train", task, "--algo", c.algo, "--no-progress",
            "--seed", str(cfg.seed), "--run-dir", str(self.run_dir),
            f"trainer.torch_threads={len(c.cores)}",
            "trainer.total_env_steps=1000000000",  # the wall-time budget stops it, not a step count
            f"trainer.eval_every_env_steps={cfg.eval_every(c.algo)}",
            f"trainer.eval_episodes={cfg.eval_episodes}",
            "trainer.checkpoint_every_updates=1000000000",
            "trainer.tensorboard=false",
            # Frequent training-clock rows let the budget stop slow learners promptly (one JSON line each).
            "trainer.log_every_updates=20",
            *cfg.ours_overrides,
        ]  # fmt: skip
        cores = set(c.cores)
        self.log = (self.dir / "train.log").open("w")
        self.proc = subprocess.Popen(
            self.command, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=lambda: os.sched_setaffinity(0, cores)
        )
        self.started = time.monotonic()
        self.error: str | None = None

    def _rows(self) -> list[dict[str, Any]]:
        return read_metrics(self.run_dir)  # skips a line being written right now

    def _train_time_s(self, rows: list[dict[str, Any]]) -> float:
        times = [r.get("perf/train_time_s", r.get("eval/train_time_s", 0.0)) for r in rows]
        return max(times, default=0.0)

    def poll(self) -> bool:
        """True once finished (budget reached, exited, or hung past the wall-clock cap)."""
        if self.proc.poll() is not None:
            if self.proc.returncode != 0:
                self.error = f"exit code {self.proc.returncode}; see {self.dir / 'train.log'}"
            return True
        over_budget = self._train_time_s(self._rows()) >= self.cfg.budget_s
        hung = time.monotonic() - self.started > wall_cap_s(self.cfg.budget_s)
        if over_budget or hung:
            if hung and not over_budget:
                self.error = "wall-clock cap reached before the training-time budget"
            self.stop()
            return True
        return False

    def stop(self) -> None:
        """End the training process (a no-op once it has exited)."""
        if self.proc.poll() is not None:
            return
        # SIGTERM, not SIGINT: a benchmark started in the background (`cmd &`) passes an ignored
        # SIGINT on to its children. The CLI exits cleanly on either; rows are flushed per line.
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def result(self) -> dict[str, Any]:
        self.log.close()
        rows = self._rows()
        evals = [
            {
                "env_steps": r["eval/env_steps"],
                "train_time_s": r["eval/train_time_s"],
                "mean_return": r["eval/mean_return"],
            }
            for r in rows
            if "eval/mean_return" in r
        ]
        # Evaluation rows also carry the training clock: slow learners (FastTD3 on a CPU) log few perf rows.
        progress = sorted(
            (float(r.get("perf/train_time_s", r.get("eval/train_time_s", 0.0))), int(r["env_steps"]))
            for r in rows
            if "perf/train_time_s" in r or "eval/train_time_s" in r
        )
        config = self.run_dir / "config.yaml"
        return {
            "command": self.command,
            "config_yaml": config.read_text() if config.is_file() else None,
            "evals": evals,
            **summarize(evals, [], progress),
        }


def wall_cap_s(budget_s: float) -> float:
    """Hard wall-clock limit per contender: the budget plus generous room for startup and evaluations."""
    return 2.0 * budget_s + 300.0


# ------------------------------------------------------------------------------------------- SB3
def _sb3_child(c: Contender, cfg: BenchCfg, out_dir: str) -> None:
    """Child process: pin, build the SB3 (or SBX) model, learn until the budget, write ``sb3.json``."""
    os.sched_setaffinity(0, set(c.cores))
    import gymnasium as gym
    import numpy as np
    import torch

    torch.set_num_threads(len(c.cores))
    if c.side == "sbx":
        import flax.linen
        from sbx import PPO, SAC

        relu: Any = flax.linen.relu
    else:
        from stable_baselines3 import PPO, SAC

        relu = torch.nn.ReLU
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    env_id = TASKS[cfg.task][1]
    hp = dict(SB3_HYPERPARAMS[(c.algo, cfg.task)])
    normalize = hp.pop("normalize", False)
    kwargs = dict(hp.get("policy_kwargs", {}))
    if kwargs.get("activation_fn") == "relu":
        kwargs["activation_fn"] = relu
    if kwargs:
        hp["policy_kwargs"] = kwargs
    venv: Any = DummyVecEnv([lambda: gym.make(env_id)])
    if normalize:
        venv = VecNormalize(venv, gamma=hp.get("gamma", 0.99))
    model = (SAC if c.algo == "sac" else PPO)("MlpPolicy", venv, seed=cfg.seed, device="cpu", verbose=0, **hp)
    eval_env = gym.make(env_id)
    eval_every = cfg.eval_every(c.algo)
    evals: list[dict[str, float]] = []

    def evaluate(episodes: int, seed: int) -> float:
        """Mean undiscounted return of the deterministic policy (raw rewards, obs normalized as in training)."""
        total = 0.0
        for i in range(episodes):
            obs, _ = eval_env.reset(seed=seed + i)
            done = False
            while not done:
                x = venv.normalize_obs(obs) if normalize else obs
                action, _ = model.predict(x, deterministic=True)
                obs, reward, terminated, truncated, _ = eval_env.step(action)
                total += float(reward)
                done = terminated or truncated
        return total / episodes

    class BudgetEval(BaseCallback):
        """Keeps a training clock that stops during evaluation; ends learning at the budget."""

        def _on_training_start(self) -> None:
            self.train_time_s = 0.0
            self.tick = time.perf_counter()
            self.next_eval = eval_every
            self.progress: list[tuple[float, int]] = []

        def _on_step(self) -> bool:
            now = time.perf_counter()
            self.train_time_s += now - self.tick
            if not self.progress or self.train_time_s - self.progress[-1][0] >= 1.0:
                self.progress.append((self.train_time_s, self.num_timesteps))
            if self.num_timesteps >= self.next_eval:
                self.next_eval += eval_every
                ret = evaluate(cfg.eval_episodes, cfg.seed + 1_000_003 + 7919 * len(evals))
                evals.append({"env_steps": self.num_timesteps, "train_time_s": self.train_time_s, "mean_return": ret})
                with (Path(out_dir) / "evals.jsonl").open("a") as fh:
                    fh.write(json.dumps(evals[-1]) + "\n")
            self.tick = time.perf_counter()
            if self.train_time_s < cfg.budget_s:
                return True
            self.progress.append((self.train_time_s, self.num_timesteps))
            return False

    callback = BudgetEval()
    model.learn(total_timesteps=10**12, callback=callback)
    result = {
        "env_id": env_id,
        "hyperparameters": SB3_HYPERPARAMS[(c.algo, cfg.task)],
        "versions": {
            "stable_baselines3": _version("stable_baselines3"),
            **({"sbx": _version("sbx-rl"), "jax": _version("jax")} if c.side == "sbx" else {}),
            "gymnasium": gym.__version__,
            "numpy": np.__version__,
        },
        "evals": evals,
        **summarize(evals, [], callback.progress),
    }
    (Path(out_dir) / "sb3.json").write_text(json.dumps(result, indent=1))


def _version(module: str) -> str:
    import importlib.metadata

    return importlib.metadata.version(module)


class Sb3Run:
    """Stable-Baselines3 (or SBX) in a spawned process."""

    def __init__(self, c: Contender, cfg: BenchCfg) -> None:
        self.c, self.cfg = c, cfg
        self.dir = cfg.out / c.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = mp.get_context("spawn").Process(target=_sb3_child, args=(c, cfg, str(self.dir)), name=c.name)
        self.proc.start()
        self.started = time.monotonic()
        self.error: str | None = None

    def poll(self) -> bool:
        if not self.proc.is_alive():
            if self.proc.exitcode != 0:
                self.error = f"exit code {self.proc.exitcode}"
            return True
        if time.monotonic() - self.started > wall_cap_s(self.cfg.budget_s):
            self.error = "wall-clock cap reached before the training-time budget"
            self.stop()
            return True
        return False

    def stop(self) -> None:
        """End the SB3 process (a no-op once it has exited)."""
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()

    def result(self) -> dict[str, Any]:
        path = self.dir / "sb3.json"
        if path.is_file():
            out: dict[str, Any] = json.loads(path.read_text())
            return out
        evals = (
            [json.loads(line) for line in (self.dir / "evals.jsonl").read_text().splitlines()]
            if (self.dir / "evals.jsonl").is_file()
            else []
        )
        return {"evals": evals, **summarize(evals, [], [])}


# ------------------------------------------------------------------------------------------- driver
def parse_contenders(text: str) -> list[Contender]:
    out = []
    for name in (s.strip() for s in text.split(",") if s.strip()):
        side, _, algo = name.partition("-")
        valid = OURS_ALGOS if side == "ours" else SB3_ALGOS if side in PEER_LIBRARIES else ()
        if algo not in valid:
            choices = [f"ours-{a}" for a in OURS_ALGOS] + [f"{lib}-{a}" for lib in PEER_LIBRARIES for a in SB3_ALGOS]
            raise SystemExit(f"unknown contender {name!r}; choose from {', '.join(choices)}")
        out.append(Contender(name=name, side=side, algo=algo))
    if len({c.name for c in out}) != len(out):
        raise SystemExit("each contender may appear once")
    return out


def run_all(
    contenders: list[Contender], cfg: BenchCfg, cores: list[int], per: int, thresholds: list[float]
) -> list[dict[str, Any]]:
    """Start contenders on free core sets (concurrently when there are enough cores), collect results."""
    slots = [cores[i : i + per] for i in range(0, len(cores) - per + 1, per)]
    if not slots:
        raise SystemExit(f"--cores-per-contender {per} exceeds the {len(cores)} usable cores")
    pending = list(contenders)
    running: list[OursRun | Sb3Run] = []
    results: list[dict[str, Any]] = []
    try:
        while pending or running:
            while pending and slots:
                c = pending.pop(0)
                c.cores = slots.pop(0)
                print(f"start {c.name} on cores {c.cores}", flush=True)
                running.append(OursRun(c, cfg) if c.side == "ours" else Sb3Run(c, cfg))
            time.sleep(1.0)
            for r in [r for r in running if r.poll()]:
                running.remove(r)
                slots.append(r.c.cores)
                res = r.result()
                evals = res["evals"]
                res |= summarize(evals, thresholds, [tuple(x) for x in res["progress"]])
                res = {"name": r.c.name, "side": r.c.side, "algo": r.c.algo, "cores": r.c.cores, "error": r.error} | res
                results.append(res)
                print(
                    f"done {r.c.name}: {res['env_steps']} env steps in {res['train_time_s']} s ({res['env_steps_per_s']} /s), "
                    f"last return {res['final_return']}, to threshold [s]: {res['time_to_threshold_s']}"
                    + (f"  ERROR {r.error}" if r.error else ""),
                    flush=True,
                )

    finally:
        # An interrupted or killed benchmark must not leave contenders training on their cores.
        for r in running:
            r.stop()
    order = {c.name: i for i, c in enumerate(contenders)}
    return sorted(results, key=lambda res: order[res["name"]])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=sorted(TASKS), default="halfcheetah")
    p.add_argument(
        "--contenders",
        default="ours-sac,sb3-sac",
        help="comma-separated: ours-sac|ours-fasttd3|ours-ppo|sb3-sac|sb3-ppo|sbx-sac|sbx-ppo",
    )
    p.add_argument(
        "--budget-s", type=float, default=1800.0, help="training wall-time budget per contender (eval excluded)"
    )
    p.add_argument(
        "--eval-every-steps",
        type=int,
        default=None,
        help="env steps between evaluations (default: 10k off-policy, 50k PPO)",
    )
    p.add_argument("--eval-episodes", type=int, default=10, help="deterministic episodes per evaluation")
    p.add_argument(
        "--thresholds",
        default=None,
        help="comma-separated returns to time (default: HalfCheetah 1000,2000,3000,5000; Ant 2000,3000,4000,5000, "
        "since an Ant that merely stays upright already collects ~1000 of healthy reward)",
    )
    p.add_argument(
        "--cores-per-contender", type=int, default=1, help="CPUs pinned to each contender (torch threads = this)"
    )
    p.add_argument("--cores", default=None, help="comma-separated CPU ids to use (default: all this process may use)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--ours-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra override for our runs (repeatable), e.g. algo.updates_per_step=4",
    )
    p.add_argument(
        "--out", type=Path, required=True, help="output folder (results.json, return_vs_time.png, per-contender logs)"
    )
    args = p.parse_args(argv)

    contenders = parse_contenders(args.contenders)
    for module in sorted({PEER_LIBRARIES[c.side] for c in contenders if c.side in PEER_LIBRARIES}):
        try:
            importlib.import_module(module)
        except ImportError:
            raise SystemExit(SIDE_ENV_HINT.format(module=module, exe=sys.executable)) from None
    thresholds = [float(t) for t in (args.thresholds or DEFAULT_THRESHOLDS[args.task]).split(",") if t.strip()]
    cores = [int(x) for x in args.cores.split(",")] if args.cores else sorted(os.sched_getaffinity(0))
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = BenchCfg(
        task=args.task,
        budget_s=args.budget_s,
        eval_every_steps=args.eval_every_steps,
        eval_episodes=args.eval_episodes,
        seed=args.seed,
        out=args.out,
        ours_overrides=list(args.ours_override),
        python=sys.executable,
    )
    signal.signal(signal.SIGTERM, raise_terminated)  # `kill`/`pkill` then runs run_all's cleanup
    try:
        results = run_all(contenders, cfg, cores, args.cores_per_contender, thresholds)
    except Terminated:
        return EXIT_TERMINATED
    import torch

    report = {
        "task": {"ours": TASKS[args.task][0], "sb3": TASKS[args.task][1], "sbx": TASKS[args.task][1]},
        "comparability": COMPARABILITY,
        "budget_s": args.budget_s,
        "eval_every_steps": {c.name: cfg.eval_every(c.algo) for c in contenders},
        "eval_episodes": args.eval_episodes,
        "thresholds": thresholds,
        "seed": args.seed,
        "ours_overrides": args.ours_override,
        "host": {
            "cpus": os.cpu_count(),
            "cores_used": cores,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "platform": platform.platform(),
        },
        "contenders": results,
    }
    (args.out / "results.json").write_text(json.dumps(report, indent=1))
    plot(results, thresholds, f"{TASKS[args.task][1]}: return vs training wall time", args.out / "return_vs_time.png")
    print(args.out / "results.json")
    return 1 if any(r["error"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
