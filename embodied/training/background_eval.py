"""Periodic evaluations in a child process on a spare CPU core, while training goes on.

Why: on a small CPU run evaluation is a large share of the wall time. ``embodied train
quad-hover`` trains on one torch thread of a 2-core machine and spent 15-18 s in 16 evaluations
of 1,000 episodes beside 18-21 s of training, while the second core sat idle (BENCHMARKS.md,
"Evaluations in the background"). Here the trainer hands a snapshot of the policy to a child
process and trains on; the child flies the evaluation on the spare core
(:mod:`embodied.training.eval_schedule` decides when, and collects the results).

The numbers are those a synchronous evaluation of the same snapshot gives: the child builds the
same envs with the same seeds, uses the trainer's torch thread count and CPU tanh form
(:mod:`embodied.policies.cpu_tanh`), and the trainer collects each result at a fixed point of
the run (the next evaluation point, or the end), never "when it is ready". So a run is
reproducible whatever the timing. What changes: a stop on the success target is decided one
evaluation interval later (when the result arrives), and the trainer then puts the evaluated
snapshot's weights back, so the saved policy is the one that held the target. A checkpoint
keeps the snapshot in flight, and a resume evaluates it again.

A snapshot is a state dict (tensors only), never a pickled module: a checkpoint is a file that
others hand around, and everything read from one is loaded with ``weights_only=True``. The
child rebuilds the module once from the run's config (:class:`PolicyRecipe`) and loads each
snapshot's state dict into it; the trainer loads it into a copy of its own policy.

The child is a fresh interpreter (no fork of a process with OpenMP threads, and no re-import of
the user's ``__main__``), started when the trainer is built, so its imports overlap the
trainer's set-up. It runs in its own session, so a
Ctrl-C at the terminal reaches the trainer alone (which decides what a stop keeps and closes it),
and it ends when its socket closes, i.e. with its parent. Where it cannot build the task (e.g.
a task registered at run time in the parent only) or fails in any other way, the trainer logs
why and evaluates in its own process from then on.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import logging
import os
import socket
import subprocess
import sys
import time
import traceback
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Literal, NamedTuple

import torch
from torch import nn

from embodied.errors import EmbodiedError
from embodied.training.evaluate import EvalResult, evaluate_module

log = logging.getLogger(__name__)

BackgroundEvalSetting = bool | Literal["auto"]
"""``trainer.background_eval`` (:class:`embodied.experiment.TrainerCfg`): ``true``/``false`` force
it; ``"auto"`` uses it where a core is spare."""


class BackgroundEvalError(EmbodiedError):
    """The evaluation child failed or died; the message carries its traceback or exit code."""


@dataclasses.dataclass(frozen=True)
class EvalSnapshot:
    """The policy as it was at one evaluation point, with the counters the result is logged at."""

    env_steps: int
    train_time_s: float
    seed: int
    policy_state: dict[str, torch.Tensor]
    """The policy module's state dict (detached copies): what the child flies, what a checkpoint
    keeps of a snapshot in flight, and the weights the trainer puts back when this snapshot held."""

    @classmethod
    def take(cls, policy: nn.Module, env_steps: int, train_time_s: float, seed: int) -> EvalSnapshot:
        """Copy ``policy``'s weights now."""
        state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
        return cls(env_steps, train_time_s, seed, state)

    def to_checkpoint(self) -> dict[str, Any]:
        """What a checkpoint keeps of a snapshot still in flight (a resume evaluates it again):
        numbers and tensors only, so ``torch.load(weights_only=True)`` reads it back."""
        return dataclasses.asdict(self)

    @classmethod
    def from_checkpoint(cls, saved: dict[str, Any]) -> EvalSnapshot:
        """The snapshot :meth:`to_checkpoint` kept (its form is checked by
        :mod:`embodied.training.checkpoint_schema` before this is called)."""
        return cls(
            env_steps=int(saved["env_steps"]),
            train_time_s=float(saved["train_time_s"]),
            seed=int(saved["seed"]),
            policy_state=dict(saved["policy_state"]),
        )

    def policy_like(self, template: nn.Module) -> nn.Module:
        """A copy of ``template`` (a module of the same architecture) holding this snapshot's weights."""
        module = copy.deepcopy(template)
        module.load_state_dict(self.policy_state)
        return module

    def state_bytes(self) -> bytes:
        """The state dict serialized for the child (read back by :func:`state_from_bytes`)."""
        buffer = io.BytesIO()
        torch.save(self.policy_state, buffer)
        return buffer.getvalue()


def state_from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    """A state dict :meth:`EvalSnapshot.state_bytes` wrote; tensors only (``weights_only=True``)."""
    state: dict[str, torch.Tensor] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    return state


@dataclasses.dataclass(frozen=True)
class PolicyRecipe:
    """What rebuilds the run's policy module in the child: its task, env and algorithm configs.

    The child builds the algorithm once for one env and keeps its policy as the module each
    snapshot's weights are loaded into (strictly: a module of another shape fails, and the
    trainer then evaluates in its own process). A frozen base the algorithm keeps outside its
    checkpoint is loaded again from ``base_run`` (a run directory or ``lerobot:REF``), as the trainer
    loaded it (:func:`embodied.training.lerobot_base.load_base_policy`)."""

    task_name: str
    env_cfg: Any
    algo_name: str
    algo_cfg: Any
    base_run: str | None = None

    def __call__(self) -> nn.Module:
        """The policy module with the weights of a fresh build (replaced by every snapshot's)."""
        from pathlib import Path

        from embodied import registry
        from embodied.algo import PreloadSource, base_outside_checkpoint, preload_algorithm

        env = registry.make_env(self.task_name, self.env_cfg, 1, "cpu", 0)
        try:
            algo = registry.make_algo(self.algo_name, self.algo_cfg, env)
            if self.base_run is not None and base_outside_checkpoint(algo):
                from embodied.training.lerobot_base import load_base_policy

                # A run directory or a ``lerobot:`` reference, loaded as the trainer loaded it.
                base = load_base_policy(self.base_run, self.task_name, self.env_cfg, env, "cpu")
                preload_algorithm(algo, self.algo_name, PreloadSource(base_run=Path(self.base_run), base_policy=base))
        finally:
            env.close()
        policy = algo.policy
        if not isinstance(policy, nn.Module):
            raise TypeError(f"the policy ({type(policy).__name__}) is not a torch module")
        return policy


def spare_cores(threads: int) -> int:
    """CPU cores this process may run on beyond the ``threads`` training uses."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 1
    return usable - threads


def background_eval_choice(
    setting: BackgroundEvalSetting, *, device: torch.device, processes: int, periodic: bool, threads: int
) -> tuple[bool, str]:
    """Whether to evaluate in the background, and why (one clause, for the log).

    Only for a single CPU training process with periodic evaluations: the child needs as many
    spare cores as training has threads (it uses the same count, so its numbers match a
    synchronous evaluation's). ``True`` where that does not hold is refused with the reason."""
    if not setting:
        return False, "trainer.background_eval=false"
    if device.type != "cpu":
        return False, f"training runs on {device.type} (background evaluation is for CPU runs)"
    if processes > 1:
        return False, f"{processes} training processes (rank 0 evaluates between updates)"
    if not periodic:
        return False, "no periodic evaluation within the budget (trainer.eval_every_env_steps, eval_episodes)"
    spare = spare_cores(threads)
    if setting == "auto" and spare < threads:
        return False, f"no spare core ({spare + threads} usable, {threads} training threads)"
    return True, f"{spare + threads} usable cores, {threads} training thread(s)"


class ChildSetup(NamedTuple):
    """What the evaluation child is sent once (picklable; see :class:`BackgroundEvaluator`)."""

    make_env: Callable[[int, int], Any]
    make_policy: Callable[[], nn.Module]
    episodes: int
    threads: int
    tanh_form: str


class BackgroundEvaluator:
    """One child process that evaluates policy snapshots, one at a time.

    ``make_env(num_envs, seed)`` must be picklable (a module-level function, or an instance of
    a module-level class such as :class:`~embodied.training.evaluate.EvalEnvs`): the child calls it to build the envs.
    ``make_policy()`` (picklable too, e.g. a :class:`PolicyRecipe`) builds the module the child
    loads each snapshot's state dict into.

    The child is a fresh interpreter (``python -c``, this process's ``sys.path``) talking over a
    socket pair, not a :mod:`multiprocessing` spawn: spawn imports the parent's ``__main__`` in
    the child, so a training script without an ``if __name__ == "__main__"`` guard would start
    a second training run there."""

    def __init__(
        self,
        make_env: Callable[[int, int], Any],
        make_policy: Callable[[], nn.Module],
        episodes: int,
        threads: int,
        tanh_form: str,
    ) -> None:
        self.setup = ChildSetup(make_env, make_policy, episodes, threads, tanh_form)
        """What the child is sent once: how to build the envs and the policy module, and how to evaluate."""
        self._conn: Connection | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._end: weakref.finalize[Any, Any] | None = None
        self._in_flight = False

    def start(self) -> None:
        """Start the child now (its imports then overlap the trainer's set-up and first
        rollouts); :meth:`submit` starts it otherwise."""
        if self._conn is None:
            self._start()

    def _start(self) -> Connection:
        parent_sock, child_sock = socket.socketpair()
        search_path = [p for p in sys.path if isinstance(p, str)]
        bootstrap = (
            f"import sys; sys.path[:] = {search_path!r}; "
            f"from {__name__} import child_main; child_main({child_sock.fileno()})"
        )
        try:
            # its own session: a Ctrl-C at the terminal reaches the trainer alone, which decides
            # what a stop keeps; the child ends when its socket closes
            process = subprocess.Popen(
                [sys.executable, "-c", bootstrap], pass_fds=(child_sock.fileno(),), start_new_session=True
            )
        except BaseException:
            parent_sock.close()
            raise
        finally:
            child_sock.close()
        conn = Connection(parent_sock.detach())
        # a trainer dropped without train() (a failed check, an interactive session) must not
        # leave its idle child behind until the interpreter exits
        self._end = weakref.finalize(self, _end_child, conn, process)
        self._conn, self._process = conn, process
        try:
            conn.send(self.setup)
        except OSError as err:
            raise BackgroundEvalError(f"cannot reach the evaluation child: {err}") from None
        log.debug("evaluation child started (pid %s)", process.pid)
        return conn

    def submit(self, snapshot: EvalSnapshot) -> None:
        """Hand ``snapshot`` to the child (started on first use); at most one may be in flight."""
        if self._in_flight:
            raise RuntimeError("an evaluation is already in flight: collect() it first")
        conn = self._conn if self._conn is not None else self._start()
        try:
            conn.send((snapshot.state_bytes(), snapshot.seed))
        except (OSError, EOFError) as err:
            raise BackgroundEvalError(f"cannot reach the evaluation child: {err}") from None
        self._in_flight = True

    def collect(self) -> tuple[EvalResult, float]:
        """Wait for the evaluation in flight: ``(result, seconds the child spent on it)``."""
        if not self._in_flight or self._conn is None:
            raise RuntimeError("no evaluation in flight")
        self._in_flight = False
        try:
            status, payload, elapsed_s = self._conn.recv()
        except (OSError, EOFError):
            code = self._process.poll() if self._process is not None else None
            raise BackgroundEvalError(f"the evaluation child died (exit code {code})") from None
        if status != "ok":
            raise BackgroundEvalError(f"the evaluation child failed:\n{payload}")
        return payload, elapsed_s

    def close(self) -> None:
        """Stop the child (an evaluation in flight is dropped; the trainer's checkpoint keeps
        its snapshot)."""
        end = self._end
        self._conn = self._process = self._end = None
        self._in_flight = False
        if end is not None:
            end()


def _end_child(conn: Connection, process: subprocess.Popen[bytes]) -> None:
    """End the child at once: it holds nothing to keep, and it may still be importing (a
    polite request would wait for that)."""
    with contextlib.suppress(OSError):
        conn.close()
    process.kill()
    process.wait()


def child_main(fd: int) -> None:
    """Entry point of the child interpreter: serve evaluations over the socket ``fd``."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s (evaluation child): %(message)s")
    conn = Connection(fd)
    try:
        setup: ChildSetup = conn.recv()
    except EOFError:
        return
    except Exception:  # e.g. a task config class the child cannot import
        with contextlib.suppress(OSError):
            conn.send(("error", traceback.format_exc(), 0.0))
        return
    serve(conn, setup)


def serve(conn: Connection, setup: ChildSetup) -> None:
    """The child's loop: receive ``(state dict bytes, seed)``, send ``("ok", EvalResult, seconds)``
    or ``("error", traceback, 0.0)``; it ends when the socket closes (the trainer's close, or its
    exit). The policy module is built on the first job (``setup.make_policy()``) and reused."""
    from embodied.policies import cpu_tanh

    os.environ[cpu_tanh.ENV_VAR] = setup.tanh_form  # the trainer's measured choice, not a new measurement
    torch.set_num_threads(setup.threads)
    module: nn.Module | None = None
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        state_bytes, seed = job
        start = time.perf_counter()
        try:
            if module is None:
                module = setup.make_policy()
            module.load_state_dict(state_from_bytes(state_bytes))
            result = evaluate_module(module, setup.make_env, setup.episodes, seed)
            reply: tuple[str, Any, float] = ("ok", result, time.perf_counter() - start)
        except Exception:  # reported to the trainer, which falls back to evaluating itself
            reply = ("error", traceback.format_exc(), 0.0)
        try:
            conn.send(reply)
        except OSError:  # the trainer is gone
            return
