"""quad-hover PPO against rsl-rl-lib's PPO on the same env: training wall time to 95 % success held.

Both contenders train ``quad-hover`` with the task settings of the shipped
``configs/quad_hover/ppo.yaml`` (128 envs, the same env section) and are judged the same way:
every 65,536 env steps the deterministic policy flies 1,000 evaluation episodes (our
``embodied.training.evaluate``, same seeds), and the score is the training wall time (evaluation
excluded) at the second of two consecutive evaluations at or above 95 % success, the stop rule of
``embodied train``.

Contenders, each with one torch thread, run side by side on their own cores (``--cores 0,1``) or
one after the other on the cores given:

- ``ours``: the real CLI, ``python -m embodied.cli train quad-hover --seed S``; evaluations are read
  from the run's ``metrics.jsonl``.
- ``rsl-rl``: ``rsl_rl.runners.OnPolicyRunner`` (rsl-rl-lib) on :class:`RslRlQuadHover`, a thin
  adapter of the same env to rsl-rl's ``VecEnv``. rsl-rl's PPO is the algorithm ours is modelled on,
  so the runner gets our config's values wherever it has the same setting (rollout 32 steps,
  2 epochs, 4 minibatches, gamma 0.995, lambda 0.95, clip 0.2, no value clipping, no entropy bonus,
  adaptive learning rate from 1e-3 at our KL target ``algo.desired_kl``, 128x128 tanh networks,
  initial std 0.2, observation normalization). What our config does through algorithm options that rsl-rl lacks, the adapter
  does on the env side: actions are offsets from the hover command (our ``init_action_mean:
  hover_action``) clamped to [-1, 1], rewards are scaled by 0.01 (our ``reward_scale``). Not
  reproduced: our cap of the adaptive rate at 1e-3 (``lr_max``), its cooldown and the small initial
  output layer (``actor_output_gain``).

rsl-rl-lib is not a dependency of embodied: run this script from a side environment (the exact
commands used):

    python3 -m venv /tmp/rslvenv
    /tmp/rslvenv/bin/pip install torch==2.13.0
    /tmp/rslvenv/bin/pip install rsl-rl-lib==5.5.1
    /tmp/rslvenv/bin/pip install -e .

Example (results.json, success_vs_time.png and each contender's log under --out):

    /tmp/rslvenv/bin/python bench/rslrl_compare.py --seeds 0,1,2 --cores 0,1 --out bench_out/rslrl

``--rsl-rl-num-envs N`` gives rsl-rl another env count than ours (its best measured setting may
differ). The summary's median counts every seed; one that did not hold is slower than every held
one, so a median falling on it is reported as a lower bound (``median_at_least_s``).

Not a test: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from embodied import registry
from embodied.commands.train import default_preset, preset_file
from embodied.experiment import ExperimentCfg, resolve_experiment
from embodied.sweeps.report import target_points
from embodied.training.evaluate import evaluate
from embodied.training.run import read_metrics

TASK = "quad-hover"
RSL_RL_VERSION = "5.5.1"
SIDE_ENV_HINT = (
    "rsl-rl-lib is not installed in this Python ({exe}); it is not a dependency of embodied. Create the side "
    "environment described at the top of bench/rslrl_compare.py and run this script with its python."
)


def preset_cfg(preset: str | None, seed: int = 0) -> ExperimentCfg:
    """``quad-hover`` PPO as ``embodied train quad-hover [--preset PRESET] --seed SEED`` resolves it
    (None: the task's default preset, as the command without ``--preset``)."""
    name = preset or default_preset(TASK, "ppo")
    return resolve_experiment(TASK, "ppo", preset_file(TASK, "ppo", name) if name else None, seed=seed)


class RslRlQuadHover:
    """rsl-rl's ``VecEnv`` over ``quad-hover`` (an ``embodied`` ``VecEnv``).

    Observations are a TensorDict with our groups (``policy``, and ``critic`` where the task has
    it); ``actions [N, 4]`` are offsets from ``hover_action`` (clamped to [-1, 1] after adding);
    rewards ``[N]`` are scaled by ``reward_scale``; ``dones = terminated | truncated`` with
    ``extras["time_outs"] = truncated`` (rsl-rl bootstraps those with the critic's value).
    """

    def __init__(self, env: Any, episode_steps: int, reward_scale: float) -> None:
        from tensordict import TensorDict

        self._tensordict = TensorDict
        self.env = env
        self.num_envs = int(env.num_envs)
        self.num_actions = int(env.action_dim)
        self.max_episode_length = int(episode_steps)
        self.device = env.device
        self.episode_length_buf = torch.zeros(self.num_envs, dtype=torch.long)
        self.cfg: dict[str, Any] = {"task": TASK}
        self.hover_action = torch.as_tensor(env.io_spec().extra["hover_action"], dtype=torch.float32).expand(
            self.num_envs, self.num_actions
        )
        self.reward_scale = reward_scale
        self._obs = self._wrap(env.reset(seed=None))

    def _wrap(self, obs: dict[str, torch.Tensor]) -> Any:
        return self._tensordict({k: v for k, v in obs.items() if v.dtype.is_floating_point}, batch_size=[self.num_envs])

    def get_observations(self) -> Any:
        return self._obs

    def step(self, actions: torch.Tensor) -> tuple[Any, torch.Tensor, torch.Tensor, dict[str, Any]]:
        command = torch.clamp(self.hover_action + actions, -1.0, 1.0)
        obs, reward, terminated, truncated, _info = self.env.step(command)
        done = terminated | truncated
        self.episode_length_buf = torch.where(done, 0, self.episode_length_buf + 1)
        self._obs = self._wrap(obs)
        extras = {"time_outs": truncated.to(torch.float32)}
        return self._obs, reward * self.reward_scale, done.to(torch.float32), extras


def runner_cfg(algo: Any) -> dict[str, Any]:
    """rsl-rl-lib 5.x ``OnPolicyRunner`` config with our PPO config's values where it has them."""
    activation = algo.activation
    distribution = {"class_name": "GaussianDistribution", "init_std": algo.init_std, "std_type": "scalar"}
    return {
        "num_steps_per_env": algo.num_steps_per_env,
        "save_interval": 10**9,
        "obs_groups": {"actor": ["policy"], "critic": ["critic"]},
        "multi_gpu": None,
        "check_for_nan": False,
        "actor": {
            "class_name": "rsl_rl.models.MLPModel",
            "hidden_dims": list(algo.actor_hidden),
            "activation": activation,
            "obs_normalization": algo.normalize_obs,
            "distribution_cfg": distribution,
        },
        "critic": {
            "class_name": "rsl_rl.models.MLPModel",
            "hidden_dims": list(algo.critic_hidden),
            "activation": activation,
            "obs_normalization": algo.normalize_obs,
        },
        "algorithm": {
            "class_name": "rsl_rl.algorithms.PPO",
            "num_learning_epochs": algo.num_epochs,
            "num_mini_batches": algo.num_minibatches,
            "clip_param": algo.clip_ratio,
            "gamma": algo.gamma,
            "lam": algo.lam,
            "value_loss_coef": algo.value_coef,
            "entropy_coef": algo.entropy_coef,
            "learning_rate": algo.learning_rate,
            "max_grad_norm": algo.max_grad_norm,
            "use_clipped_value_loss": algo.clip_value_loss,
            "schedule": algo.schedule,
            "desired_kl": algo.desired_kl,
        },
    }


def _rsl_rl_child(seed: int, cores: list[int], max_env_steps: int, out_file: str, num_envs: int | None) -> None:
    """Child process: train with rsl-rl until the target is held or the step budget is spent
    (``num_envs``: rsl-rl's env count; None: the shipped config's)."""
    os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(1)
    try:
        from rsl_rl.runners import OnPolicyRunner
    except ImportError:
        raise SystemExit(SIDE_ENV_HINT.format(exe=sys.executable)) from None
    cfg = resolve_experiment(TASK, "ppo", seed=seed)
    if num_envs is not None:
        cfg = dataclasses.replace(cfg, num_envs=num_envs)
    torch.manual_seed(seed)
    env = registry.make_env(TASK, cfg.env, cfg.num_envs, "cpu", seed)
    adapter = RslRlQuadHover(env, cfg.env.episode_steps, cfg.algo.reward_scale)
    train_cfg = runner_cfg(cfg.algo)
    runner = OnPolicyRunner(adapter, train_cfg, log_dir=None, device="cpu")
    steps_per_iter = cfg.num_envs * cfg.algo.num_steps_per_env
    iters_per_eval = max(1, cfg.trainer.eval_every_env_steps // steps_per_iter)
    actor = runner.alg.get_policy()
    evals: list[dict[str, float]] = []
    train_time_s = 0.0
    env_steps = 0
    while env_steps < min(max_env_steps, cfg.trainer.total_env_steps):
        start = time.perf_counter()
        runner.learn(num_learning_iterations=iters_per_eval)
        train_time_s += time.perf_counter() - start
        env_steps += iters_per_eval * steps_per_iter
        actor.eval()

        def act(obs: dict[str, torch.Tensor], n: int = 0) -> torch.Tensor:
            batch = adapter._tensordict({"policy": obs["policy"]}, batch_size=[obs["policy"].shape[0]])
            hover = adapter.hover_action[:1].expand(obs["policy"].shape[0], -1)
            return torch.clamp(hover + actor(batch), -1.0, 1.0)

        result = evaluate(
            lambda _env: act,
            lambda n, s: registry.make_env(TASK, cfg.env, n, "cpu", s),
            episodes=cfg.trainer.eval_episodes,
            seed=seed + 1_000_003 + 7919 * len(evals),
        )
        actor.train()
        evals.append({"env_steps": env_steps, "train_time_s": train_time_s, "success_rate": result.success_rate})
        print(f"rsl-rl seed {seed}: {env_steps} steps, {train_time_s:.1f} s, success {result.success_rate:.3f}")
        if target_points(evals, cfg.trainer.success_target)["held"] is not None:
            break
    Path(out_file).write_text(json.dumps({"evals": evals, "runner_cfg": train_cfg}))


def run_rsl_rl(
    seed: int, cores: list[int], max_env_steps: int, out: Path, num_envs: int | None = None
) -> dict[str, Any]:
    out_file = out / f"rsl-rl_seed{seed}.json"
    proc = mp.get_context("spawn").Process(
        target=_rsl_rl_child, args=(seed, cores, max_env_steps, str(out_file), num_envs)
    )
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        return {"error": f"rsl-rl child exited with {proc.exitcode}"}
    data: dict[str, Any] = json.loads(out_file.read_text())
    return data


def run_ours(
    seed: int,
    cores: list[int],
    max_env_steps: int,
    out: Path,
    num_envs: int | None = None,
    preset: str | None = None,
    overrides: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Our CLI with the shipped config and ``--preset preset`` where given, then ``overrides``
    (``key=value`` config overrides; ``num_envs`` is rsl-rl's option, unused here)."""
    run_dir = out / f"ours_seed{seed}"
    command = [
        sys.executable, "-m", "embodied.cli", "train", TASK, "--seed", str(seed), "--run-dir", str(run_dir),
        "--no-progress", "trainer.torch_threads=1", "trainer.tensorboard=false",
    ]  # fmt: skip
    if preset:
        command += ["--preset", preset]
    if max_env_steps < preset_cfg(preset).trainer.total_env_steps:
        command.append(f"trainer.total_env_steps={max_env_steps}")
    command += list(overrides)
    with (out / f"ours_seed{seed}.log").open("w") as log:
        code = subprocess.call(
            command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=lambda: os.sched_setaffinity(0, set(cores))
        )
    if code != 0:
        return {"error": f"exit code {code}", "command": command}
    evals = [
        {
            "env_steps": r["eval/env_steps"],
            "train_time_s": r["eval/train_time_s"],
            "success_rate": r["eval/success_rate"],
        }
        for r in read_metrics(run_dir)
        if "eval/success_rate" in r
    ]
    return {"evals": evals, "command": command}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0", help="comma-separated seeds, each run by both contenders")
    parser.add_argument(
        "--cores",
        default="0",
        help="comma-separated CPU cores; with one core per contender (e.g. 0,1) they run side by side, "
        "each pinned to its own core, so a busy neighbour slows both alike; otherwise one after the other",
    )
    parser.add_argument("--contenders", default="ours,rsl-rl")
    parser.add_argument("--out", type=Path, default=Path("bench_out/rslrl"))
    parser.add_argument(
        "--max-env-steps", type=int, default=2_000_000, help="step budget of each run (the shipped config's: 2M)"
    )
    parser.add_argument(
        "--rsl-rl-num-envs",
        type=int,
        default=None,
        help="rsl-rl's env count (default: the shipped config's num_envs, as ours); the rollout length, "
        "epochs and minibatch count stay the config's",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cores = [int(c) for c in args.cores.split(",")]
    target = resolve_experiment(TASK, "ppo").trainer.success_target
    # rsl-rl's runner trains the nominal config (configs/quad_hover/ppo.yaml alone): ours too
    runners = {"ours": functools.partial(run_ours, preset="nominal"), "rsl-rl": run_rsl_rl}
    results: dict[str, dict[str, Any]] = {name: {} for name in args.contenders.split(",")}
    side_by_side = len(cores) >= len(results)
    for seed in (int(s) for s in args.seeds.split(",")):
        with ThreadPoolExecutor(max_workers=len(results) if side_by_side else 1) as pool:
            futures = {
                name: pool.submit(
                    runners[name],
                    seed,
                    [cores[i]] if side_by_side else cores,
                    args.max_env_steps,
                    args.out,
                    args.rsl_rl_num_envs,
                )
                for i, name in enumerate(results)
            }
        for name, future in futures.items():
            res = future.result()
            held = target_points(res.get("evals", []), target)["held"]
            res["held"] = held
            results[name][str(seed)] = res
            print(
                f"{name} seed {seed}: "
                + (
                    "not held"
                    if held is None
                    else f"held at {held['train_time_s']:.1f} s, {held['env_steps']:.0f} steps"
                )
            )
    summary: dict[str, Any] = {name: summarize(per_seed) for name, per_seed in results.items()}
    if "ours" in summary and "rsl-rl" in summary:
        ours, peer = summary["ours"], summary["rsl-rl"]
        if ours["median_time_to_held_s"] is not None:
            if peer["median_time_to_held_s"] is not None:
                summary["speedup_rsl_rl_over_ours"] = peer["median_time_to_held_s"] / ours["median_time_to_held_s"]
            elif peer["median_at_least_s"] is not None:
                summary["speedup_rsl_rl_over_ours_at_least"] = peer["median_at_least_s"] / ours["median_time_to_held_s"]
    (args.out / "results.json").write_text(
        json.dumps({"summary": summary, "machine": machine_info(cores, side_by_side), "results": results}, indent=1)
    )
    plot(results, target, args.out / "success_vs_time.png")
    print(json.dumps(summary, indent=1))
    return 0


def summarize(per_seed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Held seeds and the median time to held over **all** seeds: a seed that did not hold counts
    as slower than every held one (at least its whole training time), so when such a seed is the
    median, only a lower bound is known (``median_at_least_s``) and ``median_time_to_held_s`` is None."""
    held = [r["held"]["train_time_s"] for r in per_seed.values() if r.get("held")]
    unheld = [
        max((e["train_time_s"] for e in r.get("evals", [])), default=0.0)
        for r in per_seed.values()
        if not r.get("held")
    ]
    ranked = sorted((t, True) for t in held) + sorted((max(t, max(held, default=0.0)), False) for t in unheld)
    out: dict[str, Any] = {
        "held_seeds": len(held),
        "seeds": len(per_seed),
        "median_time_to_held_s": None,
        "median_at_least_s": None,
    }
    if not ranked:
        return out
    middle = ranked[(len(ranked) - 1) // 2 : len(ranked) // 2 + 1]  # one entry, or the two of an even count
    value = statistics.mean(t for t, _ in middle)
    out["median_time_to_held_s" if all(ok for _, ok in middle) else "median_at_least_s"] = value
    return out


def plot(results: dict[str, dict[str, Any]], target: float, path: Path) -> None:
    """Evaluation success rate against training wall time, one line per contender and seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, per_seed in results.items():
        for seed, res in per_seed.items():
            evals = res.get("evals") or []
            xs = [e["train_time_s"] for e in evals]
            ax.plot(xs, [e["success_rate"] for e in evals], marker="o", ms=3, label=f"{name} seed {seed}")
    ax.axhline(target, color="grey", lw=0.6, ls=":")
    ax.set_xlabel("training wall time [s] (evaluation excluded)")
    ax.set_ylabel("evaluation success rate")
    ax.set_title(f"{TASK}: PPO (embodied) vs rsl-rl-lib PPO")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine_info(cores: list[int], side_by_side: bool) -> dict[str, Any]:
    """What a results.json records about the run's machine."""
    return {
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cores": cores,
        "side_by_side": side_by_side,
        "load_average_at_end": os.getloadavg(),
    }


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    raise SystemExit(main())
