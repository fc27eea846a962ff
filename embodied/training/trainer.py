"""The shared training loop: collect -> update -> log -> evaluate (when due) -> checkpoint.

Never typed to one algorithm: it drives anything that satisfies ``embodied.algo.Algorithm``.
When evaluations are due, where they run (here, or in a background process beside training)
and what a checkpoint keeps of one in flight is the :class:`~embodied.training.eval_schedule.EvalScheduler`'s
business; the loop asks it at each update.
Training wall time (``train_time_s``) excludes evaluation and checkpoint writing, which are
timed separately, so speed targets measure learning alone.

A trainer holds its run directory's lock (:mod:`embodied.training.run_lock`) from construction to the
end of :meth:`Trainer.train`. Every stop path keeps the last completed step: Ctrl-C/SIGTERM are
deferred to a whole state (loop top, or after the final save), the final evaluation runs after
a checkpoint of the last step, and a full disk stops with one line naming what was kept.

Several processes (``torchrun`` / ``embodied train --nproc N``, :mod:`embodied.distributed`) train
one run together: ``num_envs`` is the total, split evenly over the ranks, each rank seeded
apart; the algorithm averages gradients and normalizer statistics over the ranks, and every
counter (``env_steps``, evaluation times) counts the envs of all ranks. Rank 0 alone owns the
run directory (lock, config, metrics, TensorBoard, checkpoints, policy artifact) and evaluates;
its checkpoint holds every rank's own state (envs, rollout or replay, random generators), which
it gathers at each save and hands back on ``--resume`` (with the same number of processes).
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embodied import distributed, registry
from embodied.algo import ExportUnsupportedError, PreloadSource, Transition, preload_algorithm
from embodied.config import ConfigError
from embodied.env import ObsDict, TrainingCurriculum, resumes_exactly
from embodied.errors import DegenerateRunError, EmbodiedError, NonFiniteError
from embodied.experiment import ExperimentCfg
from embodied.export.artifact import POLICY_FILE, PolicyArtifactError, read_policy_artifact
from embodied.policies.cpu_tanh import use_sigmoid_tanh
from embodied.progress import TrainProgress
from embodied.stop import StopRequest, deferred_stop, stop_exception
from embodied.training.background_eval import BackgroundEvaluator, PolicyRecipe, background_eval_choice
from embodied.training.checkpoint_schema import check_restorable
from embodied.training.eval_schedule import EvalScheduler
from embodied.training.evaluate import EvalEnvs, EvalResult
from embodied.training.lerobot_base import load_base_policy
from embodied.training.run import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    WORLD_KEY,
    CheckpointError,
    MetricsLogger,
    checkpoint_world_size,
    clean_temp_files,
    load_algo_state,
    load_checkpoint,
    make_run_dir,
    save_checkpoint,
    write_config,
)
from embodied.training.run_lock import RunLock
from embodied.training.run_policy import check_artifact_fits, write_policy_artifact
from embodied.training.train_state import TrainState

log = logging.getLogger(__name__)

STOP_POLL_ITERATIONS = 16
"""With several processes, the ranks agree on a stop request every this many env steps (one
small all-reduce), so all of them checkpoint and stop at the same step."""


class EpisodeStats:
    """Running per-env returns/lengths and sums over finished episodes, kept on device (no syncs)."""

    def __init__(self, num_envs: int, device: torch.device) -> None:
        self.ep_return = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.ep_length = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.done_sums = torch.zeros(4, dtype=torch.float64, device=device)  # count, return, length, success
        self.term_sums: dict[str, torch.Tensor] = {}
        self.term_steps = 0
        self.episodes_seen = 0
        self.longer_than_one_step = False
        """Whether any finished episode so far lasted more than one step (see :meth:`pop`)."""

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
        if distributed.current() is not None:
            self._sum_across_ranks()
        count, ret, length, success = self.done_sums.tolist()
        if count > 0:
            self.episodes_seen += int(count)
            self.longer_than_one_step |= length > count
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

    def _sum_across_ranks(self) -> None:
        """Episode sums over the envs of every rank; reward-term means averaged over the ranks."""
        names = sorted(self.term_sums)
        packed = torch.cat([self.done_sums, *(self.term_sums[k].reshape(1) for k in names)])
        distributed.sum_(packed)
        self.done_sums.copy_(packed[:4])
        self.term_sums = {k: packed[4 + i] / distributed.size() for i, k in enumerate(names)}

    def state_dict(self) -> dict[str, Any]:
        """Running episodes and the sums since the last log row (a mid-rollout stop keeps them)."""
        return {
            "ep_return": self.ep_return,
            "ep_length": self.ep_length,
            "done_sums": self.done_sums,
            "term_sums": dict(self.term_sums),
            "term_steps": self.term_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ep_return.copy_(state["ep_return"])
        self.ep_length.copy_(state["ep_length"])
        if "done_sums" in state:
            self.done_sums.copy_(state["done_sums"])
            self.term_sums = {k: v.to(self.done_sums.device).clone() for k, v in state["term_sums"].items()}
            self.term_steps = int(state["term_steps"])


def _check_finite(what: str, tensors: dict[str, torch.Tensor], env_steps: int) -> None:
    """Raise :class:`NonFiniteError` naming the group and first offending env (tensors ``[N, ...]``)."""
    for name, value in tensors.items():
        bad = ~torch.isfinite(value)
        if bool(bad.any()):
            env_index = int(bad.reshape(bad.shape[0], -1).any(dim=1).nonzero()[0, 0])
            raise NonFiniteError(f"non-finite {what} {name!r} (first at env {env_index}) after {env_steps} env steps")


DEGENERATE_MIN_EPISODES_PER_ENV = 3
"""A run stops once this many episodes per env have finished, all of them after one step."""


class WorldSizeError(CheckpointError):
    """``--resume`` with another number of training processes than the checkpoint was written by."""


class _NoMetrics:
    """The metrics logger of ranks other than 0: they write nothing."""

    rows = 0

    def log(self, env_steps: int, metrics: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


class Trainer:
    """Builds env + algorithm from an :class:`ExperimentCfg` and trains them in ``run_dir``.

    Takes the run directory's lock (a second trainer on it fails naming the holder), removes
    temp files a killed writer left, and refuses to start a new run where one already is.
    ``allow``: keys whose range bound ``--i-know-what-im-doing`` lifted (saved in the config).
    """

    def __init__(self, cfg: ExperimentCfg, run_dir: Path, resume: bool = False, allow: list[str] | None = None) -> None:
        self.cfg = cfg
        self.world = distributed.current()
        """The training processes of this run (None: a single process)."""
        self.run_dir = Path(run_dir)
        self.lock: RunLock | None = None
        # Only rank 0 touches the run directory; its checks (a run already there, a missing
        # checkpoint) decide for every rank.
        resume = distributed.from_main(lambda: self._claim_run_dir(resume))
        try:
            self._setup(resume, allow)
        except BaseException:
            if hasattr(self, "eval_scheduler"):  # built mid set-up; it holds the background evaluator once started
                self.eval_scheduler.close()
            self._release()
            raise

    def close(self) -> None:
        """Close the training env and its simulator. :meth:`train` leaves it open for callers that
        look at it afterwards; ``embodied train`` closes it as soon as training ends, because
        Isaac Lab holds one simulation per process and an ``embodied eval`` in the same process
        builds another."""
        self.env.close()

    @property
    def _background(self) -> BackgroundEvaluator | None:
        """The child process evaluating beside training (None: evaluations run here)."""
        return self.eval_scheduler.background

    def _release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def _claim_run_dir(self, resume: bool) -> bool:
        """Create and lock the run directory; return whether a checkpoint is there to resume."""
        self.run_dir = make_run_dir(self.run_dir)
        self.lock = RunLock(self.run_dir).acquire()
        try:
            return self._prepare_run_dir(resume)
        except BaseException:
            self._release()
            raise

    def _prepare_run_dir(self, resume: bool) -> bool:
        clean_temp_files(self.run_dir)
        if resume and not (self.run_dir / CHECKPOINT_FILE).exists():
            # Stopped before its first checkpoint: no training progress was kept, so the run starts
            # again; rows it logged describe that lost progress and are moved aside, not deleted.
            log.warning("%s has no checkpoint yet: starting the run from its beginning", self.run_dir)
            resume = False
            metrics = self.run_dir / METRICS_FILE
            if metrics.exists() and metrics.stat().st_size > 0:
                aside = metrics.with_name(f"metrics.before-restart-{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
                os.replace(metrics, aside)
                log.warning("rows of the lost progress moved to %s", aside)
        elif not resume and (self.run_dir / CONFIG_FILE).exists():
            raise EmbodiedError(
                f"{self.run_dir} already holds a run; continue it with: embodied train --resume {self.run_dir}"
            )
        return resume

    def _setup(self, resume: bool, allow: list[str] | None) -> None:
        cfg = self.cfg
        self.device = distributed.rank_device(registry.resolve_device(cfg.device))
        if cfg.trainer.torch_threads > 0:
            torch.set_num_threads(cfg.trainer.torch_threads)
        self.seed = distributed.rank_seed(cfg.seed)
        """This rank's seed (the run's seed in a single process and on rank 0)."""
        torch.manual_seed(self.seed)
        random.seed(self.seed)
        self.ranks = distributed.size()
        """Processes training this run together (1: a single process)."""
        self.local_envs = distributed.split_evenly(cfg.num_envs, "num_envs")
        """Envs this process steps (``num_envs`` is the total over all processes)."""
        self.env = registry.make_env(cfg.task_name, cfg.env, self.local_envs, self.device, self.seed)
        self.algo = registry.make_algo(cfg.algo_name, cfg.algo, self.env)
        if self.world is not None and not getattr(self.algo, "multi_process", False):
            raise ConfigError(
                f"algorithm {cfg.algo_name!r} does not train in several processes yet "
                "(ppo, sac and fasttd3 do): start it without torchrun / --nproc"
            )
        tcfg = cfg.trainer
        if tcfg.dataset is not None or tcfg.base_run is not None:
            # before a restore: data and frozen base are inputs, the checkpoint holds what was learned
            base_run = Path(tcfg.base_run) if tcfg.base_run is not None else None
            source = PreloadSource(
                dataset=Path(tcfg.dataset) if tcfg.dataset is not None else None,
                base_run=base_run,
                base_policy=load_base_policy(base_run, cfg.task_name, cfg.env, self.env, self.device)
                if base_run is not None
                else None,
            )
            preload_algorithm(self.algo, cfg.algo_name, source)
        if self.world is not None:
            # every rank starts from rank 0's networks (each built them from its own seed)
            distributed.broadcast_modules(m for m in vars(self.algo).values() if isinstance(m, nn.Module))
        self.state = TrainState()
        self.obs: ObsDict = self.env.reset(seed=self.seed)
        self.stats = EpisodeStats(self.local_envs, self.device)
        self._saved_steps: int | None = None
        self.logger: MetricsLogger | _NoMetrics = _NoMetrics()
        self.eval_envs = EvalEnvs(cfg.task_name, cfg.env, str(self.device))
        """Builds the evaluation envs (picklable: the background evaluator's child calls it too)."""
        self.eval_scheduler = EvalScheduler(
            tcfg,
            cfg.seed,
            self.algo,
            self.eval_envs,
            self.run_dir / CONFIG_FILE,
            write_row=lambda env_steps, row: self.logger.log(env_steps, row),
        )
        """When and where evaluations run, and the one in flight (see :mod:`embodied.training.eval_schedule`)."""
        if resume:
            try:
                self._restore()
            except OSError as err:
                raise self._disk_error(err) from None
            self._saved_steps = self.state.env_steps
        self.eval_scheduler.background = self._background_evaluator()
        distributed.from_main(lambda: self._open_run_files(resume, allow))

    def _open_run_files(self, resume: bool, allow: list[str] | None) -> None:
        """Write ``config.yaml`` and open ``metrics.jsonl`` / TensorBoard (rank 0 only)."""
        cfg = self.cfg
        try:
            write_config(self.run_dir, cfg, allow)  # on resume: records a changed training budget
            # A resume cuts metrics.jsonl back to the rows its checkpoint had seen (checkpoints
            # from before that count was saved: to the rows up to its env step).
            rows = self.state.metrics_rows if resume else 0
            self.logger = MetricsLogger(
                self.run_dir,
                tensorboard=cfg.trainer.tensorboard,
                keep_rows=rows if rows >= 0 else None,
                keep_up_to_env_steps=self.state.env_steps if rows < 0 else None,
            )
        except OSError as err:
            raise self._disk_error(err) from None

    # ----------------------------------------------------------------- checkpoints
    def checkpoint_state(self) -> dict[str, Any]:
        s = self.state
        return {
            "algo": self.algo.state_dict(),
            "env": self.env.state_dict(),
            "obs": {k: v.clone() for k, v in self.obs.items()},
            "stats": self.stats.state_dict(),
            "trainer": {
                "env_steps": s.env_steps,
                "updates": s.updates,
                "train_time_s": s.train_time_s,
                "eval_time_s": s.eval_time_s,
                "evals": s.evals,
                "time_to_target_s": s.time_to_target_s,
                "env_steps_to_target": s.env_steps_to_target,
                "metrics_rows": self.logger.rows,
            }
            | self.eval_scheduler.state_dict(),
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                "python": random.getstate(),
            },
        }

    def save(self) -> Path:
        state = self.checkpoint_state()
        if self.world is not None:
            # rank 0 writes one checkpoint that holds every other rank's own state as well
            others = distributed.gather_to_main(None if self.world.is_main else distributed.to_cpu(state))
            if others is None:
                self._saved_steps = self.state.env_steps
                return self.run_dir / CHECKPOINT_FILE
            state[WORLD_KEY] = {"size": self.world.size, "ranks": others[1:]}
        path = save_checkpoint(self.run_dir, state)
        # The policy alone beside it (ckpt/policy.pt): what export, eval and deploy read.
        try:
            module = self.algo.policy.export_module()
        except ExportUnsupportedError as err:  # the checkpoint alone records such a policy
            log.debug("%s: no policy artifact: %s", self.run_dir, err)
        else:
            write_policy_artifact(self.run_dir, module, self.env.io_spec(), self.state.env_steps)
        self._saved_steps = self.state.env_steps
        self.eval_scheduler.policy_restored = False
        return path

    def _load_rank_checkpoint(self) -> dict[str, Any]:
        """This rank's part of ``ckpt/latest.pt`` (rank 0 reads the file and hands out the parts)."""
        world_size = distributed.size()

        def load() -> dict[str, Any]:
            ckpt = load_checkpoint(self.run_dir, map_location=self.device if self.world is None else "cpu")
            saved = checkpoint_world_size(ckpt, self.run_dir / CHECKPOINT_FILE)
            if saved != world_size:
                raise WorldSizeError(
                    f"{self.run_dir / CHECKPOINT_FILE} was written by {saved} training process(es), this run has "
                    f"{world_size}: resume with the same number (embodied train --nproc {saved} --resume "
                    f"{self.run_dir}, or torchrun --nproc-per-node {saved} ...)"
                )
            return ckpt

        if self.world is None:
            return load()
        holder: dict[str, dict[str, Any]] = {}
        distributed.from_main(lambda: holder.setdefault("ckpt", load()) and None)
        parts = None
        if self.world.is_main:
            ckpt = holder["ckpt"]
            parts = [ckpt, *ckpt.pop(WORLD_KEY)["ranks"]]
        return distributed.scatter_from_main(parts)

    def _restore(self) -> None:
        ckpt = self._load_rank_checkpoint()
        self._check_config_fits_policy()
        # every entry's form first: nothing is restored from a checkpoint that does not fit
        check_restorable(
            ckpt,
            self.checkpoint_state(),
            self.run_dir / CHECKPOINT_FILE,
            grid=self.cfg.num_envs,
            policy_form=self.algo.policy.state_dict() if isinstance(self.algo.policy, nn.Module) else None,
        )
        load_algo_state(self.algo, ckpt, self.run_dir)
        self.env.load_state_dict(ckpt["env"])
        self.obs = {k: v.to(self.device) for k, v in ckpt["obs"].items()}
        if not resumes_exactly(self.env):
            # The env cannot restore its simulator state: start fresh episodes rather than pair
            # the checkpointed observation with a different physical state.
            log.warning("%s cannot restore its simulator state: resuming with fresh episodes", type(self.env).__name__)
            self.obs = self.env.reset(seed=self.seed + ckpt["trainer"]["env_steps"])
        self.stats.load_state_dict(ckpt["stats"])
        t = ckpt["trainer"]
        self.state = TrainState(
            env_steps=t["env_steps"],
            updates=t["updates"],
            train_time_s=t["train_time_s"],
            eval_time_s=t["eval_time_s"],
            evals=list(t["evals"]),
            time_to_target_s=t["time_to_target_s"],
            env_steps_to_target=t["env_steps_to_target"],
            metrics_rows=int(t.get("metrics_rows", -1)),
        )
        self.eval_scheduler.load_state_dict(t)
        try:
            torch.set_rng_state(ckpt["rng"]["torch"].cpu())
            if torch.cuda.is_available() and ckpt["rng"]["cuda"]:
                torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
            random.setstate(_as_random_state(ckpt["rng"]["python"]))
        except (RuntimeError, ValueError, TypeError, OverflowError) as err:
            raise CheckpointError(
                f"{self.run_dir / CHECKPOINT_FILE}: entry 'rng' is not a random generator state ({err})"
            ) from None
        log.info("resumed %s at %d env steps (%d updates)", self.run_dir, self.state.env_steps, self.state.updates)

    def _check_config_fits_policy(self) -> None:
        """Name the ``config.yaml`` keys edited since training (``env.action_history``, say) when the
        env built from it no longer reads what the saved policy artifact was trained on; the
        checkpoint check that follows would name only the first tensor that differs."""
        path = self.run_dir / POLICY_FILE
        if not path.is_file():
            return
        try:
            artifact = read_policy_artifact(path)
        except PolicyArtifactError:  # a damaged artifact is written again at the next save
            return
        check_artifact_fits(artifact, self.env, self.run_dir)

    # ----------------------------------------------------------------- evaluation
    def run_eval(self) -> EvalResult:
        """Evaluate the current policy in this process and log the result at the current step."""
        return self.eval_scheduler.evaluate_here(self.state)

    def _evaluate_all(self) -> float:
        """:meth:`run_eval` on rank 0, its row kept by every rank (so all of them agree on an early
        stop); returns the success rate."""
        if self.world is None:
            return self.run_eval().success_rate
        row = distributed.from_main(lambda: (self.run_eval(), self.state.evals[-1])[1])
        if not self.world.is_main:
            self.eval_scheduler.keep(self.state, row)
        return row["eval/success_rate"]

    def _evaluate_at_point(self, progress: TrainProgress) -> bool:
        """An evaluation point: collect the evaluation in flight, then hand the background
        evaluator this one, or evaluate it here. Returns whether the success target is now held."""
        if self.eval_scheduler.collect(self.state, progress):
            return True
        if self.eval_scheduler.start(self.state):
            return False
        progress.update(self.state.env_steps, {"eval/success_rate": self._evaluate_all()})
        return self.eval_scheduler.target_held(self.state)

    def _final_eval(self) -> None:
        """Evaluate the last step's policy (already saved, so a stop here loses only this
        evaluation, which a resume runs again), then save again: the checkpoint keeps its row."""
        try:
            self._evaluate_all()
        except KeyboardInterrupt:
            log.warning("final evaluation interrupted: checkpoint of %d env steps kept", self.state.env_steps)
            raise
        self.save()

    def _background_evaluator(self) -> BackgroundEvaluator | None:
        """The child process that evaluates while training goes on, where it is used (logged)."""
        tcfg = self.cfg.trainer
        threads = torch.get_num_threads()
        use, why = background_eval_choice(
            tcfg.background_eval,
            device=self.device,
            processes=self.ranks,
            periodic=self.eval_scheduler.periodic_ahead(self.state.env_steps),
            threads=threads,
        )
        if use and not isinstance(self.algo.policy, nn.Module):
            use, why = False, f"the policy ({type(self.algo.policy).__name__}) is not a torch module"
        if not use:
            if tcfg.background_eval is True:
                log.warning("trainer.background_eval=true not used: %s", why)
            return None
        log.info("evaluations run in a background process beside training (%s)", why)
        tanh_form = "sigmoid" if use_sigmoid_tanh() else "tanh"
        cfg = self.cfg
        recipe = PolicyRecipe(cfg.task_name, cfg.env, cfg.algo_name, cfg.algo, tcfg.base_run)
        evaluator = BackgroundEvaluator(self.eval_envs, recipe, tcfg.eval_episodes, threads, tanh_form)
        try:
            evaluator.start()  # imports torch and the task while training starts
        except Exception as err:  # e.g. no process can be started here
            log.warning("background evaluation not used (its process did not start: %s)", err)
            return None
        return evaluator

    def _checkpoint_exists(self) -> bool:
        return distributed.from_main(lambda: (self.run_dir / CHECKPOINT_FILE).exists())

    def _agreed_stop(self, stop: StopRequest, iteration: int) -> int:
        """The stop signal to honour now (0: none); with several processes, any rank's request,
        polled every :data:`STOP_POLL_ITERATIONS` iterations (``iteration`` 0 always polls)."""
        if self.world is None:
            return stop.signum or 0
        if iteration % STOP_POLL_ITERATIONS:
            return 0
        return distributed.max_int(stop.signum or 0)

    # ----------------------------------------------------------------- loop
    def train(self) -> TrainState:
        """Train until ``trainer.total_env_steps`` (or the success target is held)."""
        try:
            self._train()
        except NonFiniteError as err:
            raise NonFiniteError(f"{err}; {self._kept()}") from err
        except OSError as err:
            raise self._disk_error(err) from None
        finally:
            self.eval_scheduler.close()
            self.logger.close()
            self._release()
        st = self.state
        summary = {
            "summary/env_steps": st.env_steps,
            "summary/train_time_s": st.train_time_s,
            "summary/eval_time_s": st.eval_time_s,
        }
        log.info("done: %s", ", ".join(f"{k.split('/')[1]}={v:.4g}" for k, v in summary.items()))
        return st

    def _tell_progress(self) -> None:
        """Pass ``env_steps / total_env_steps`` to a training env or an algorithm with a schedule
        (:class:`embodied.env.TrainingCurriculum`); recomputed from the counters, so a resumed
        run continues the same schedule."""
        fraction = min(self.state.env_steps / max(self.cfg.trainer.total_env_steps, 1), 1.0)
        for scheduled in (self.env, self.algo):
            if isinstance(scheduled, TrainingCurriculum):
                scheduled.set_training_progress(fraction)

    def _train(self) -> None:
        """The loop: collect a step of every env, update when the algorithm is ready, log, evaluate
        at the points of the env-step grid, checkpoint; then the last evaluation and save."""
        tcfg, st = self.cfg.trainer, self.state
        progress = TrainProgress(
            tcfg.total_env_steps, enabled=tcfg.progress and distributed.is_main(), start=st.env_steps
        )
        ended_early = False
        with progress, deferred_stop() as stop:
            tick = time.perf_counter()
            iteration = 0
            self._tell_progress()
            self.eval_scheduler.begin(st.env_steps)
            while st.env_steps < tcfg.total_env_steps:
                signum = self._agreed_stop(stop, iteration)
                iteration += 1
                if signum:
                    self._save_and_stop(signum, time.perf_counter() - tick)
                self._env_step()
                if not self.algo.ready_to_update():
                    continue
                self._tell_progress()  # the next rollout's episodes start from the new distribution
                metrics = self._update()
                st.train_time_s += time.perf_counter() - tick
                if st.updates % tcfg.log_every_updates == 0:
                    self._log_update(metrics, progress)
                if self.eval_scheduler.due(st.env_steps):
                    ended_early = self._evaluate_at_point(progress)
                if st.updates % tcfg.checkpoint_every_updates == 0 or ended_early:
                    self.save()
                if ended_early:
                    log.info(
                        "success target %.2f held on two consecutive evaluations (%s): stopping",
                        tcfg.success_target,
                        tcfg.success_hold,
                    )
                    break
                tick = time.perf_counter()
            if not ended_early:
                ended_early = self.eval_scheduler.collect(st, progress)
            # Still inside the deferred region: the last step is saved before the final
            # evaluation, so a stop during that evaluation loses only the evaluation (a resume
            # runs it again); a stop during a save is honoured right after it.
            if (
                self.eval_scheduler.policy_restored
                or st.env_steps != self._saved_steps
                or not self._checkpoint_exists()
            ):
                self.save()
            if not self._agreed_stop(stop, 0) and not ended_early and self.eval_scheduler.final_due(st):
                self._final_eval()
            signum = self._agreed_stop(stop, 0)
            if signum:
                if distributed.is_main():
                    log.warning(
                        "checkpoint at %d env steps kept (continue with: %s)", st.env_steps, self._resume_command()
                    )
                raise stop_exception(signum)

    def _update(self) -> dict[str, float]:
        """One update of the algorithm on what it collected; its metrics (checked finite where asked)."""
        metrics = self.algo.update()
        st = self.state
        st.updates += 1
        if self.cfg.trainer.check_finite:
            bad = [k for k, v in metrics.items() if not math.isfinite(v)]
            if bad:
                raise NonFiniteError(
                    f"non-finite {', '.join(bad)} in update {st.updates} after {st.env_steps} env steps"
                )
        return metrics

    def _log_update(self, metrics: dict[str, float], progress: TrainProgress) -> None:
        """Write the training row: the update's metrics, the episodes finished since the last row, speed."""
        st = self.state
        row = {f"algo/{k}": v for k, v in metrics.items()} | self.stats.pop()
        row |= {
            "perf/sps": st.env_steps / max(st.train_time_s, 1e-9),
            "perf/train_time_s": st.train_time_s,
        }
        self.logger.log(st.env_steps, row)
        progress.update(st.env_steps, row)
        if self.cfg.trainer.check_finite:
            self._check_episodes(row)

    def _check_episodes(self, row: dict[str, float]) -> None:
        """Stop a run whose episodes all end at step 1 or whose returns are not finite."""
        st = self.state
        ret = row.get("train/return")
        if ret is not None and not math.isfinite(ret):
            raise NonFiniteError(f"non-finite episode return {ret} after {st.env_steps} env steps")
        stats = self.stats
        if (
            not stats.longer_than_one_step
            and stats.episodes_seen >= DEGENERATE_MIN_EPISODES_PER_ENV * self.cfg.num_envs
        ):
            raise DegenerateRunError(
                f"every one of the {stats.episodes_seen} episodes so far ended at its first step (after "
                f"{st.env_steps} env steps): the simulation diverges at once; check the env.* values in "
                f"{self.run_dir / CONFIG_FILE} (physical parameters, disturbances, limits)"
            )

    def _kept(self) -> str:
        if self._saved_steps is not None and (self.run_dir / CHECKPOINT_FILE).exists():
            return (
                f"last good checkpoint kept: {self.run_dir / CHECKPOINT_FILE} ({self._saved_steps} env steps) "
                f"with the {METRICS_FILE} rows up to it (continue with: {self._resume_command()})"
            )
        return "no checkpoint was written yet"

    def _disk_error(self, err: OSError) -> EmbodiedError:
        """One line for a failed write (a full disk, a read-only folder) naming the file and what was kept."""
        what = err.strerror or str(err)
        where = err.filename or self.run_dir
        return EmbodiedError(f"cannot write {where}: {what}; {self._kept()}")

    def _save_and_stop(self, signum: int, unbooked_train_s: float) -> None:
        """Checkpoint between two loop iterations (the state is whole there), then raise the stop.

        The checkpoint holds the snapshot an evaluation in the background was flying; a resume
        evaluates it again."""
        self.eval_scheduler.close()
        self.state.train_time_s += unbooked_train_s
        saved = self.run_dir / CHECKPOINT_FILE
        if self._saved_steps != self.state.env_steps or not self._checkpoint_exists():
            saved = self.save()
        if distributed.is_main():
            log.warning(
                "checkpoint at %d env steps: %s (continue with: %s)",
                self.state.env_steps,
                saved,
                self._resume_command(),
            )
        raise stop_exception(signum)

    def _resume_command(self) -> str:
        """How to continue this run (with its number of processes)."""
        nproc = f" --nproc {distributed.size()}" if distributed.size() > 1 else ""
        return f"embodied train --resume {self.run_dir}{nproc}"

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
        self.state.env_steps += self.env.num_envs * self.ranks


def _as_random_state(state: Any) -> tuple[Any, ...]:
    """``random.setstate`` needs tuples; checkpoints may round-trip them as lists."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
