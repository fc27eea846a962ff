"""Policy evaluation: success rate, return and episode length over a fixed number of episodes.

Episodes run in parallel, one per env; each env counts only its first episode, so the estimate
is unbiased (short failing episodes cannot crowd out long ones).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from embodied.config import ConfigError, unknown_choice_message
from embodied.env import ObsDict

PolicyFn = Callable[[ObsDict], torch.Tensor]
"""``obs -> action [N, A]`` in [-1, 1], deterministic."""

TORCH = "torch"
"""``--policy torch``: the policy artifact's torch module; every other name is an export format."""

log = logging.getLogger(__name__)

MAX_PARALLEL_EPISODES = 4096


@dataclass(frozen=True)
class EvalResult:
    episodes: int
    success_rate: float
    mean_return: float
    std_return: float
    mean_episode_length: float
    metrics: dict[str, float] = field(default_factory=dict)
    """Episode means of the task's ``info["episode_metrics"]`` (e.g. ``rms_error_m`` of quad-track)."""

    def as_dict(self) -> dict[str, float]:
        """The fields, with ``metrics`` flattened in."""
        out = asdict(self)
        return out | out.pop("metrics")


@dataclass(frozen=True)
class EvalEnvs:
    """``(num_envs, seed) -> VecEnv`` for evaluations: the run's task and env config on ``device``.

    A picklable callable (not a closure), so the background evaluator's child can build the
    same envs as the trainer."""

    task_name: str
    env_cfg: Any
    device: str

    def __call__(self, num_envs: int, seed: int) -> Any:
        from embodied import registry

        return registry.make_env(self.task_name, self.env_cfg, num_envs, self.device, seed)


@torch.inference_mode()
def evaluate(
    policy_for_env: Callable[[Any], PolicyFn], make_env: Callable[[int, int], Any], episodes: int, seed: int
) -> EvalResult:
    """Run ``episodes`` episodes; ``make_env(num_envs, seed)`` builds the envs.

    ``policy_for_env(env)`` returns the policy to fly that env with: most policies ignore the
    env, but software-in-the-loop policies read its raw state. Batches of at most
    :data:`MAX_PARALLEL_EPISODES` envs; each env contributes its first episode.
    """
    if episodes < 1:
        raise ConfigError(f"episodes must be >= 1, got {episodes}")
    returns: list[torch.Tensor] = []
    lengths: list[torch.Tensor] = []
    successes: list[torch.Tensor] = []
    metrics: dict[str, list[torch.Tensor]] = {}
    remaining, batch_index = episodes, 0
    while remaining > 0:
        n = min(remaining, MAX_PARALLEL_EPISODES)
        env = make_env(n, seed + batch_index)
        try:
            r, length, s, m = _run_batch(policy_for_env(env), env, seed + batch_index)
        finally:
            env.close()
        returns.append(r)
        lengths.append(length)
        successes.append(s)
        for key, value in m.items():
            metrics.setdefault(key, []).append(value)
        remaining -= n
        batch_index += 1
    ret = torch.cat(returns).double()
    return EvalResult(
        episodes=episodes,
        success_rate=float(torch.cat(successes).double().mean()),
        mean_return=float(ret.mean()),
        std_return=float(ret.std()) if ret.numel() > 1 else 0.0,
        mean_episode_length=float(torch.cat(lengths).double().mean()),
        metrics={k: float(torch.cat(v).double().mean()) for k, v in metrics.items()},
    )


def evaluate_module(policy: Any, make_env: Callable[[int, int], Any], episodes: int, seed: int) -> EvalResult:
    """:func:`evaluate` a policy module as the trainer does: ``policy.act(obs, deterministic=True)``,
    with a fresh action-chunk plan (``policy.reset_plan()``, where it has one) for each batch."""

    def act(obs: ObsDict) -> torch.Tensor:
        action: torch.Tensor = policy.act(obs, deterministic=True)
        return action

    def act_in(env: Any) -> PolicyFn:
        reset_plan = getattr(policy, "reset_plan", None)
        if reset_plan is not None:
            reset_plan()
        return act

    return evaluate(act_in, make_env, episodes, seed)


def _run_batch(
    policy: PolicyFn, env: Any, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """One episode per env. Returns ``(return [N], length [N], success [N] bool, metrics)`` on CPU;
    ``metrics``: each ``info["episode_metrics"]`` entry ``[N]`` as it was when the env's episode ended."""
    n, device = env.num_envs, env.device
    obs = env.reset(seed=seed)
    ep_return = torch.zeros(n, dtype=torch.float64, device=device)
    ep_length = torch.zeros(n, dtype=torch.long, device=device)
    success = torch.zeros(n, dtype=torch.bool, device=device)
    finished = torch.zeros(n, dtype=torch.bool, device=device)
    metrics: dict[str, torch.Tensor] = {}
    # The episode limit bounds the loop even if an env never reports done.
    for _ in range(int(env.max_episode_steps) + 1):
        action = policy(obs)
        obs, reward, terminated, truncated, info = env.step(action)
        running = ~finished
        ep_return += torch.where(running, reward.double(), 0.0)
        ep_length += running.long()
        done = (terminated | truncated) & running
        success |= done & info["success"]
        for key, value in info.get("episode_metrics", {}).items():
            metrics[key] = torch.where(
                done, value.double(), metrics.get(key, torch.zeros_like(value, dtype=torch.float64))
            )
        finished |= done
        if bool(finished.all()):
            break
    return ep_return.cpu(), ep_length.cpu(), success.cpu(), {k: v.cpu() for k, v in metrics.items()}


def load_torch_policy(run_dir: Path, env: Any) -> PolicyFn:
    """The run's policy artifact as a torch module (deterministic actions, fed the groups of the
    observation dict its kind reads), without its algorithm; for a policy with no artifact kind
    (an image-instruction one reads images and an instruction), the checkpoint's policy itself."""
    from embodied.training.run import load_run
    from embodied.training.run_policy import NoArtifactKindError, check_artifact_fits, policy_artifact

    try:
        artifact = policy_artifact(run_dir)
        check_artifact_fits(artifact, env, run_dir)
        return artifact.obs_policy(env.device)  # chunked kinds run receding-horizon
    except NoArtifactKindError:
        trained = load_run(run_dir, env.device).policy
        return lambda obs: trained.act(obs, deterministic=True)


def policy_choices() -> tuple[str, ...]:
    """``--policy`` names: ``torch`` and every export format."""
    from embodied.export.formats import EXPORTERS

    return (TORCH, *EXPORTERS)


def _lerobot_checkpoint_policy(run_dir: Path, env: Any) -> PolicyFn:
    """``RUN_DIR/export/lerobot/`` flown as ``embodied eval lerobot:...`` flies it, on the run's task and camera."""
    from embodied.experiment import load_experiment
    from embodied.export.formats import EXPORT_SUBDIR
    from embodied.export.lerobot_checkpoint import LEROBOT_SUBDIR
    from embodied.training.lerobot_base import load_lerobot_policy, rendered_camera
    from embodied.training.run import CONFIG_FILE

    cfg = load_experiment(run_dir / CONFIG_FILE)
    folder = run_dir / EXPORT_SUBDIR / LEROBOT_SUBDIR
    policy = load_lerobot_policy(
        f"lerobot:{folder}", cfg.task_name, env.obs_spec, env.action_dim, rendered_camera(cfg.env), env.device
    )
    return lambda obs: policy.act(obs, deterministic=True)


def load_policy(kind: str, run_dir: Path, env: Any) -> PolicyFn:
    """``--policy KIND``: ``torch`` or an export format of :data:`~embodied.export.formats.EXPORTERS`.

    A run never exported is exported first; an existing ``RUN_DIR/export`` is used as it is
    (the format's loader checks it). A policy whose ``policy_io.json`` names a vehicle with its
    own loader for KIND (the Crazyflie: ``c`` is the firmware controller in the loop) flies
    with that loader."""
    from embodied.crazyflie import sil
    from embodied.crazyflie.vehicle import VEHICLE, vehicle_name
    from embodied.errors import EmbodiedError
    from embodied.export.formats import EXPORT_SUBDIR, EXPORTERS
    from embodied.export.lerobot_checkpoint import LEROBOT_SUBDIR, LeRobotExporter
    from embodied.export.policy_io import POLICY_IO_FILENAME, read_policy_io
    from embodied.training.run_policy import NoArtifactKindError, export_run, policy_artifact

    if kind not in policy_choices():
        raise ConfigError(unknown_choice_message("policy kind", kind, policy_choices()))
    if kind == TORCH:
        return load_torch_policy(run_dir, env)
    export = Path(run_dir) / EXPORT_SUBDIR
    lerobot_only = kind == LeRobotExporter.name and (export / LEROBOT_SUBDIR / "config.json").is_file()
    if not (export / POLICY_IO_FILENAME).is_file() and not lerobot_only:
        log.info("%s has no export yet: exporting %s", run_dir, kind)
        export_run(run_dir, kind)
    if kind == LeRobotExporter.name and not (export / POLICY_IO_FILENAME).is_file():
        # a fine-tuned LeRobot policy, or a residual on one: a LeRobot checkpoint is its only export
        return _lerobot_checkpoint_policy(Path(run_dir), env)
    exported = read_policy_io(export)
    try:
        trained = policy_artifact(run_dir).io_spec.extra.get("vehicle", "")
    except NoArtifactKindError:
        # image-instruction flow policies and residuals on a frozen base: the export is their only
        # stateless form, so there is nothing to compare it with.
        trained = vehicle_name(exported)
    if vehicle_name(exported) != trained:
        raise EmbodiedError(
            f"{exported.path}: extra.vehicle is {vehicle_name(exported)!r} but the run's policy says "
            f"{trained!r} (exported by an older version); re-export with `embodied export {run_dir}`"
        )
    vehicle_loaders = {VEHICLE: sil.EVAL_LOADERS}
    loader = vehicle_loaders.get(vehicle_name(exported), {}).get(kind, EXPORTERS[kind].load_policy)
    return loader(run_dir, env)
