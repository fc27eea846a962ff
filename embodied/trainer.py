"""The shared training loop: collect -> update -> log -> checkpoint -> evaluate.

Never typed to one algorithm: it drives anything that satisfies ``embodied.algo.Algorithm``.
Training wall time (``train_time_s``) excludes evaluation and checkpoint writing, which are
timed separately, so speed targets measure learning alone.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from embodied import registry
from embodied.algo import Transition
from embodied.env import ObsDict, resumes_exactly
from embodied.errors import NonFiniteError
from embodied.evaluate import EvalResult, evaluate
from embodied.experiment import ExperimentCfg
from embodied.progress import TrainProgress
from embodied.run import MetricsLogger, load_checkpoint, save_checkpoint, write_config
from embodied.stop import StopRequest, deferred_stop

log = logging.getLogger(__name__)

EVAL_SEED_OFFSET = 1_000_003
"""Evaluation envs are seeded apart from training envs so they never replay training episodes."""


@dataclass
class TrainState:
    """Counters that a checkpoint restores."""

    env_steps: int = 0
    updates: int = 0
    train_time_s: float = 0.0
    eval_time_s: float = 0.0
    evals: list[dict[str, float]] = field(default_factory=list)
    time_to_target_s: float | None = None
    env_steps_to_target: int | None = None


class EpisodeStats:
    """Running per-env returns/lengths and sums over finished episodes, kept on device (no syncs)."""

    def __init__(self, num_envs: int, device: torch.device) -> None:
        self.ep_return = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.ep_length = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.done_sums = torch.zeros(4, dtype=torch.float64, device=device)  # count, return, length, success
        self.term_sums: dict[str, torch.Tensor] = {}
        self.term_steps = 0

    def add(
        self, reward: torch.Tensor, done: torch.Tensor, success: torch.Tensor, terms: dict[str, torch.Tensor]
    ) -> None:
        self.ep_return += reward
        self.ep_length += 1
        donef = done.double()
        self.done_sums += torch.stack(
            [
                donef.sum(),
                (self.ep_return * donef).sum(),
                (self.ep_length * donef).sum(),
                (success & done).double().sum(),
            ]
        )
        self.ep_return *= 1.0 - donef
        self.ep_length *= 1.0 - donef
        for name, value in terms.items():
            mean = value.double().mean()
            if name in self.term_sums:
                self.term_sums[name] += mean
            else:
                self.term_sums[name] = mean.clone()
        self.term_steps += 1

    def pop(self) -> dict[str, float]:
        """Means since the last pop (episode metrics only when an episode finished)."""
        out: dict[str, float] = {}
        count, ret, length, success = self.done_sums.tolist()
        if count > 0:
            out |= {
                "train/return": ret / count,
                "train/episode_length": length / count,
                "train/success_rate": success / count,
            }
        if self.term_steps:
            out |= {f"reward/{k}": float(v) / self.term_steps for k, v in self.term_sums.items()}
        self.done_sums.zero_()
        self.term_sums = {}
        self.term_steps = 0
        return out


def _check_finite(what: str, tensors: dict[str, torch.Tensor], env_steps: int) -> None:
    """Raise :class:`NonFiniteError` naming the group and first offending env (tensors ``[N, ...]``)."""
    for name, value in tensors.items():
        bad = ~torch.isfinite(value)
        if bool(bad.any()):
            env_index = int(bad.reshape(bad.shape[0], -1).any(dim=1).nonzero()[0, 0])
            raise NonFiniteError(f"non-finite {what} {name!r} (first at env {env_index}) after {env_steps} env steps")


class Trainer:
    """Builds env + algorithm from an :class:`ExperimentCfg` and trains them in ``run_dir``."""

    def __init__(self, cfg: ExperimentCfg, run_dir: Path, resume: bool = False) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.device = registry.resolve_device(cfg.device)
        if cfg.trainer.torch_threads > 0:
            torch.set_num_threads(cfg.trainer.torch_threads)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        self.env = registry.make_env(cfg.task_name, cfg.env, cfg.num_envs, self.device, cfg.seed)
        self.algo = registry.make_algo(cfg.algo_name, cfg.algo, self.env)
        self.state = TrainState()
        self.obs: ObsDict = self.env.reset(seed=cfg.seed)
        self.stats = EpisodeStats(cfg.num_envs, self.device)
        if resume:
            self._restore()
        else:
            write_config(self.run_dir, cfg)
        self.logger = MetricsLogger(self.run_dir, tensorboard=cfg.trainer.tensorboard)

    # ----------------------------------------------------------------- checkpoints
    def checkpoint_state(self) -> dict[str, Any]:
        s = self.state
        return {
            "algo": self.algo.state_dict(),
            "env": self.env.state_dict(),
            "obs": {k: v.clone() for k, v in self.obs.items()},
            "stats": {"ep_return": self.stats.ep_return, "ep_length": self.stats.ep_length},
            "trainer": {
                "env_steps": s.env_steps,
                "updates": s.updates,
                "train_time_s": s.train_time_s,
                "eval_time_s": s.eval_time_s,
                "evals": s.evals,
                "time_to_target_s": s.time_to_target_s,
                "env_steps_to_target": s.env_steps_to_target,
            },
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                "python": random.getstate(),
            },
        }

    def save(self) -> Path:
        return save_checkpoint(self.run_dir, self.checkpoint_state())

    def _restore(self) -> None:
        ckpt = load_checkpoint(self.run_dir, map_location=self.device)
        self.algo.load_state_dict(ckpt["algo"])
        self.env.load_state_dict(ckpt["env"])
        self.obs = {k: v.to(self.device) for k, v in ckpt["obs"].items()}
        if not resumes_exactly(self.env):
            # The env cannot restore its simulator state: start fresh episodes rather than pair
            # the checkpointed observation with a different physical state.
            log.warning("%s cannot restore its simulator state: resuming with fresh episodes", type(self.env).__name__)
            self.obs = self.env.reset(seed=self.cfg.seed + ckpt["trainer"]["env_steps"])
        self.stats.ep_return.copy_(ckpt["stats"]["ep_return"])
        self.stats.ep_length.copy_(ckpt["stats"]["ep_length"])
        t = ckpt["trainer"]
        self.state = TrainState(
            env_steps=t["env_steps"],
            updates=t["updates"],
            train_time_s=t["train_time_s"],
            eval_time_s=t["eval_time_s"],
            evals=list(t["evals"]),
            time_to_target_s=t["time_to_target_s"],
            env_steps_to_target=t["env_steps_to_target"],
        )
        torch.set_rng_state(ckpt["rng"]["torch"].cpu())
        if torch.cuda.is_available() and ckpt["rng"]["cuda"]:
            torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
        random.setstate(_as_random_state(ckpt["rng"]["python"]))
        log.info("resumed %s at %d env steps (%d updates)", self.run_dir, self.state.env_steps, self.state.updates)

    # ----------------------------------------------------------------- evaluation
    def run_eval(self) -> EvalResult:
        cfg = self.cfg
        policy = self.algo.policy

        def act(obs: ObsDict) -> torch.Tensor:
            return policy.act(obs, deterministic=True)

        start = time.perf_counter()
        result = evaluate(
            lambda env: act,
            lambda n, seed: registry.make_env(cfg.task_name, cfg.env, n, self.device, seed),
            episodes=cfg.trainer.eval_episodes,
            seed=cfg.seed + EVAL_SEED_OFFSET + 7919 * len(self.state.evals),
        )
        elapsed = time.perf_counter() - start
        self.state.eval_time_s += elapsed
        row = {f"eval/{k}": float(v) for k, v in result.as_dict().items()}
        row |= {"eval/train_time_s": self.state.train_time_s, "eval/env_steps": float(self.state.env_steps)}
        self.state.evals.append(row)
        self.logger.log(self.state.env_steps, row | {"perf/eval_time_s": elapsed})
        log.info(
            "eval at %d env steps (%.2f s training): success %.1f %%, return %.2f, length %.1f",
            self.state.env_steps,
            self.state.train_time_s,
            100 * result.success_rate,
            result.mean_return,
            result.mean_episode_length,
        )
        target = cfg.trainer.success_target
        if target is not None and self.state.time_to_target_s is None and result.success_rate >= target:
            self.state.time_to_target_s = self.state.train_time_s
            self.state.env_steps_to_target = self.state.env_steps
        return result

    def _target_held(self) -> bool:
        """Two consecutive evaluations at or above the success target."""
        target = self.cfg.trainer.success_target
        evals = self.state.evals
        return target is not None and len(evals) >= 2 and all(e["eval/success_rate"] >= target for e in evals[-2:])

    # ----------------------------------------------------------------- loop
    def train(self) -> TrainState:
        """Train until ``trainer.total_env_steps`` (or the success target is held)."""
        tcfg, st = self.cfg.trainer, self.state
        next_eval = (
            (st.env_steps // tcfg.eval_every_env_steps + 1) * tcfg.eval_every_env_steps
            if tcfg.eval_every_env_steps > 0
            else None
        )
        progress = TrainProgress(tcfg.total_env_steps, enabled=tcfg.progress, start=st.env_steps)
        last_saved_steps = st.env_steps
        ended_early = False
        try:
            with progress, deferred_stop() as stop:
                tick = time.perf_counter()
                while st.env_steps < tcfg.total_env_steps:
                    if stop.signum is not None:
                        self._save_and_stop(stop, time.perf_counter() - tick)
                    self._env_step()
                    if not self.algo.ready_to_update():
                        continue
                    metrics = self.algo.update()
                    st.updates += 1
                    if tcfg.check_finite:
                        bad = [k for k, v in metrics.items() if not math.isfinite(v)]
                        if bad:
                            raise NonFiniteError(
                                f"non-finite {', '.join(bad)} in update {st.updates} after {st.env_steps} env steps"
                            )
                    now = time.perf_counter()
                    st.train_time_s += now - tick
                    if st.updates % tcfg.log_every_updates == 0:
                        row = {f"algo/{k}": v for k, v in metrics.items()} | self.stats.pop()
                        row |= {
                            "perf/sps": st.env_steps / max(st.train_time_s, 1e-9),
                            "perf/train_time_s": st.train_time_s,
                        }
                        self.logger.log(st.env_steps, row)
                        progress.update(st.env_steps, row)
                    if next_eval is not None and st.env_steps >= next_eval:
                        next_eval += tcfg.eval_every_env_steps
                        result = self.run_eval()
                        progress.update(st.env_steps, {"eval/success_rate": result.success_rate})
                        if self._target_held():
                            ended_early = True
                    if st.updates % tcfg.checkpoint_every_updates == 0 or ended_early:
                        self.save()
                        last_saved_steps = st.env_steps
                    if ended_early:
                        log.info(
                            "success target %.2f held on two consecutive evaluations: stopping", tcfg.success_target
                        )
                        break
                    tick = time.perf_counter()
            if (
                not ended_early
                and tcfg.eval_episodes > 0
                and (not st.evals or st.evals[-1]["eval/env_steps"] != st.env_steps)
            ):
                self.run_eval()
            if st.env_steps != last_saved_steps or not (self.run_dir / "ckpt" / "latest.pt").exists():
                self.save()
        except NonFiniteError as err:
            saved = self.run_dir / "ckpt" / "latest.pt"
            keep = f"; last good checkpoint kept: {saved}" if saved.exists() else "; no checkpoint was written yet"
            raise NonFiniteError(f"{err}{keep}") from err
        finally:
            self.logger.close()
        summary = {
            "summary/env_steps": st.env_steps,
            "summary/train_time_s": st.train_time_s,
            "summary/eval_time_s": st.eval_time_s,
        }
        log.info("done: %s", ", ".join(f"{k.split('/')[1]}={v:.4g}" for k, v in summary.items()))
        return st

    def _save_and_stop(self, stop: StopRequest, unbooked_train_s: float) -> None:
        """Checkpoint between two loop iterations (the state is whole there), then raise the stop."""
        self.state.train_time_s += unbooked_train_s
        saved = self.save()
        log.warning(
            "checkpoint at %d env steps: %s (continue with: embodied train --resume %s)",
            self.state.env_steps,
            saved,
            self.run_dir,
        )
        stop.raise_now()

    def _env_step(self) -> None:
        """One vectorized step: act, step, check, hand the transition to the algorithm."""
        obs = self.obs
        action = self.algo.act(obs)
        next_obs, reward, terminated, truncated, info = self.env.step(action)
        if self.cfg.trainer.check_finite:
            _check_finite("observation group", next_obs, self.state.env_steps)
            _check_finite("reward", {"reward": reward}, self.state.env_steps)
        self.algo.observe(
            Transition(
                obs=obs,
                action=action,
                reward=reward,
                terminated=terminated,
                truncated=truncated,
                next_obs=next_obs,
                final_obs=info["final_obs"],
            )
        )
        self.stats.add(reward, terminated | truncated, info["success"], info["reward_terms"])
        self.obs = next_obs
        self.state.env_steps += self.env.num_envs


def _as_random_state(state: Any) -> tuple[Any, ...]:
    """``random.setstate`` needs tuples; checkpoints may round-trip them as lists."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
