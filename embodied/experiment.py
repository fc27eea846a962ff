"""The resolved experiment configuration: defaults, then YAML layers, then CLI overrides.

Layers, later wins: the task's and algorithm's dataclass defaults; ``configs/<task>/<algo>.yaml``
shipped with the package (``<task>`` lowercased with ``-`` and ``:`` replaced by ``_``); the
``--config FILE.yaml`` the user gives (``embodied train`` puts a ``--preset`` file, or the task's
default preset from ``configs/<task>/default_presets.yaml``, under it; this module layers only the
file it is handed); ``key=value`` overrides; explicit flags (``--seed``,
``--device``, ``--num-envs``). YAML and overrides use the same keys as the saved ``config.yaml``:
top-level ``seed``, ``device``, ``num_envs``, and sections ``env:``, ``algo:``, ``trainer:``.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import logging
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from embodied import registry
from embodied.config import DEVICE_PATTERN, ConfigError, apply_overrides, check_numbers, load_yaml, parse_dotted

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainerCfg:
    """How long to train, and when to evaluate, log and checkpoint."""

    total_env_steps: int = 1_000_000
    """Stop after this many environment steps (summed over all parallel envs)."""
    eval_every_env_steps: int = 0
    """Evaluate every this many env steps (0: only once, at the end)."""
    eval_episodes: int = 1000
    """Episodes per evaluation (run in parallel, each env counted once)."""
    success_target: float | None = None
    """Stop early once two consecutive evaluations hold this success rate (e.g. 0.95; how:
    ``success_hold``), keeping the policy of the second."""
    success_hold: Literal["each", "mean"] = "each"
    """How two consecutive evaluations hold ``success_target``: ``each`` at or above it, or
    ``mean``: the second (whose policy is kept) at or above it and the mean of the two as well,
    an estimate from twice the episodes that does not let one unlucky evaluation of a policy at
    the target delay the stop by an interval or more."""
    log_every_updates: int = 1
    """Write metrics every this many algorithm updates."""
    checkpoint_every_updates: int = 50
    """Write ``ckpt/latest.pt`` every this many updates (and always at the end)."""
    torch_threads: int = 0
    """``torch.set_num_threads`` for the run (0: leave torch's default)."""
    background_eval: bool | Literal["auto"] = "auto"
    """Fly periodic evaluations in a child process on a spare CPU core while training goes on
    (same results; a stop on the success target keeps the evaluated weights). ``auto``: for a
    single CPU process with as many spare cores as training threads (see
    ``embodied.training.background_eval``)."""
    check_finite: bool = True
    """Stop with a clear message when observations, rewards or losses become NaN/inf."""
    progress: bool = True
    """Show a live progress bar on stderr."""
    tensorboard: bool = True
    """Write TensorBoard event files next to ``metrics.jsonl``."""
    dataset: str | None = None
    """Demonstration dataset directory the algorithm preloads (``--dataset``; e.g. for bc-flow)."""
    base_run: str | None = None
    """Run directory whose checkpoint holds the base policy the algorithm starts from (``--base``)."""

    def __post_init__(self) -> None:
        if self.total_env_steps <= 0:
            raise ConfigError(f"trainer.total_env_steps must be > 0, got {self.total_env_steps}")
        if self.eval_every_env_steps < 0:
            raise ConfigError(f"trainer.eval_every_env_steps must be >= 0, got {self.eval_every_env_steps}")
        if self.eval_episodes < 0:
            raise ConfigError(f"trainer.eval_episodes must be >= 0, got {self.eval_episodes}")
        if self.success_target is not None and not 0.0 < self.success_target <= 1.0:
            raise ConfigError(f"trainer.success_target must be in (0, 1], got {self.success_target}")
        if self.log_every_updates < 1 or self.checkpoint_every_updates < 1:
            raise ConfigError("trainer.log_every_updates and trainer.checkpoint_every_updates must be >= 1")


@dataclass(frozen=True)
class ExperimentCfg:
    """Everything a training run depends on; saved resolved as ``config.yaml``."""

    task_name: str
    """Registered task (``embodied list``)."""
    algo_name: str = "ppo"
    """Registered algorithm (``embodied list``)."""
    seed: int = 0
    """Seeds the environments, the networks and every random draw of the run."""
    device: str = "cpu"
    """``cpu`` or ``cuda[:N]``: where the environments and networks live."""
    num_envs: int = 64
    """Parallel environments stepped as one batch."""
    env: Any = None
    """The task's config dataclass."""
    algo: Any = None
    """The algorithm's config dataclass."""
    trainer: TrainerCfg = field(default_factory=TrainerCfg)

    def __post_init__(self) -> None:
        if self.num_envs < 1:
            raise ConfigError(f"num_envs must be >= 1, got {self.num_envs}")
        if not re.fullmatch(DEVICE_PATTERN, self.device):
            raise ConfigError(f"key 'device' must be cpu, cuda or cuda:N, got {self.device!r}")


_FIXED_KEYS = ("task_name", "algo_name")
ALLOW_KEY = "i_know_what_im_doing"
"""Top-level ``config.yaml`` entry listing the keys whose range bound the run lifted."""


def config_key(task_name: str) -> str:
    """Folder name of a task's configs: lowercase, ``-`` and ``:`` become ``_``."""
    return re.sub(r"[^a-z0-9_]", "_", task_name.lower())


def default_config_file(task_name: str, algo_name: str) -> Path | None:
    """The shipped ``configs/<task>/<algo>.yaml``, or None."""
    root = importlib.resources.files("embodied.configs")
    # a deprecated alias (mujoco-ant) reads the configs of the task it names (ant)
    candidate = root / config_key(registry.canonical_task(task_name)[0]) / f"{algo_name}.yaml"
    return Path(str(candidate)) if candidate.is_file() else None


def _layer(cfg: ExperimentCfg, data: dict[str, Any], source: str, allow: Collection[str] = ()) -> ExperimentCfg:
    for key in _FIXED_KEYS:
        if key in data and data[key] != getattr(cfg, key):
            raise ConfigError(f"{source}: {key!r} is set by the command line, not by config files")
    data = {k: v for k, v in data.items() if k not in _FIXED_KEYS}
    return apply_overrides(cfg, data, source, allow=allow)


def resolve_experiment(
    task_name: str,
    algo_name: str = "ppo",
    config_file: Path | None = None,
    overrides: list[str] | None = None,
    seed: int | None = None,
    device: str | None = None,
    num_envs: int | None = None,
    allow: Collection[str] = (),
) -> ExperimentCfg:
    """Build the fully resolved config (see module docstring for the layer order).

    ``allow``: dotted keys whose upper range bound ``--i-know-what-im-doing`` lifted
    (:func:`embodied.config.check_number`)."""
    cfg = ExperimentCfg(
        task_name=task_name,
        algo_name=algo_name,
        env=registry.task_cfg(task_name),
        algo=registry.algo_cfg(algo_name),
    )
    shipped = default_config_file(task_name, algo_name)
    if shipped is not None:
        cfg = _layer(cfg, load_yaml(shipped), str(shipped), allow)
    if config_file is not None:
        cfg = _layer(cfg, load_yaml(Path(config_file)), str(config_file), allow)
    if overrides:
        cfg = _layer(cfg, parse_dotted(overrides), "command line", allow)
    flags = {k: v for k, v in {"seed": seed, "device": device, "num_envs": num_envs}.items() if v is not None}
    if flags:
        cfg = _layer(cfg, flags, "command line", allow)
    check_numbers(cfg, "default", allow)  # what no layer set is a default; those are checked too
    return cfg


def load_experiment(config_path: Path, allow: Collection[str] = ()) -> ExperimentCfg:
    """Rebuild a saved ``config.yaml`` (as written by :func:`embodied.training.run.write_config`).

    ``allow``: keys whose range bound the run was started with ``--i-know-what-im-doing`` for
    (saved in the file as ``i_know_what_im_doing``)."""
    data = load_yaml(config_path)
    missing = [k for k in _FIXED_KEYS if k not in data]
    if missing:
        raise ConfigError(f"{config_path}: missing key(s) {', '.join(missing)}")
    for key in _FIXED_KEYS:
        if not isinstance(data[key], str):
            raise ConfigError(f"{config_path}: key {key!r} expects a name (str), got {data[key]!r}")
    allow = [*allow, *_saved_allow(data, config_path)]
    data.pop(ALLOW_KEY, None)
    cfg = ExperimentCfg(
        task_name=data["task_name"],
        algo_name=data["algo_name"],
        env=registry.task_cfg(data["task_name"]),
        algo=registry.algo_cfg(data["algo_name"]),
    )
    _fill_keys_added_later(cfg, data, config_path)
    # A saved config lists every key: one that is missing means a truncated or damaged file,
    # which must not silently fall back to today's defaults.
    absent = _absent_keys(cfg, data)
    if absent:
        shown = ", ".join(absent[:5]) + (f" and {len(absent) - 5} more" if len(absent) > 5 else "")
        raise ConfigError(f"{config_path}: missing key(s) {shown}: the file is truncated or damaged")
    cfg = _layer(cfg, data, str(config_path), allow)
    check_numbers(cfg, "default", allow)
    if (cfg.trainer.base_run is not None or cfg.trainer.dataset is not None) and not registry.algo_preloads(
        cfg.algo_name
    ):
        # Training refuses this pairing, so no run has it: the file was damaged (a cut inside
        # its last value, e.g. `base_run: nul`) or edited.
        raise ConfigError(
            f"{config_path}: trainer.base_run / trainer.dataset name a source, but algorithm "
            f"{cfg.algo_name!r} starts from none (training refuses that): the file is damaged or was edited"
        )
    return cfg


_TODAYS_DEFAULT = object()
"""In :data:`KEYS_ADDED_LATER`: the key's current default is what older runs did."""

KEYS_ADDED_LATER: dict[str, Any] = {
    # key (dotted, in the saved config.yaml) -> the value that reproduces runs saved before it existed
    "env.backend": _TODAYS_DEFAULT,  # locomotion tasks ran on MuJoCo's batch API, today's default
    "env.yaw_symmetry": False,  # quad-hover policies trained before the 180-degree flip see raw headings
    "env.yaw_cost_mod_pi": False,
    "trainer.dataset": None,
    "trainer.base_run": None,
}
"""Keys a ``config.yaml`` written by an older version lacks, with the value that keeps that run's
meaning (not today's default where they differ). All of them arrived in one release: a saved
config that holds none of those its task has predates them, and loading fills them in (logged),
so an old run still resumes, evaluates and exports as it was trained. A config that holds some
but not all of them was cut or edited, and, like any other missing key, means a damaged file.
Keys of a later release form their own group in :data:`KEY_GROUPS_ADDED_LATER`."""

FINETUNING_RELEASE_KEYS: dict[str, Any] = {
    "algo.policy.temporal_ensemble": False,  # flow policies acted the first action of each plan
    "algo.critic_subset": 0,  # FastTD3 took the minimum over all of its critics
    "env.randomization_ramp": 0.0,  # quadrotor randomization drew its full ranges from the start
}
"""The release that added temporal ensembling of flow action chunks, residual RL (FastTD3's
critic subset) and the randomization curriculum of the quadrotor tasks."""

VISION_RELEASE_KEYS: dict[str, Any] = {
    "algo.lr_cooldown": 0.0,  # PPO kept its adaptive learning rate's cap to the last update
    "algo.policy.instruction": "",  # flow policies saw the policy observation group alone
    "env.backend.camera": "",  # MuJoCo tasks rendered no camera images
    "env.backend.image_size_px": 64,
    "algo.encoder": "mlp",  # the learners read the proprioceptive vector only
    "algo.image_features": 64,
    "algo.image_shift_px": 4,  # off-policy learners: used with encoder cnn only
}
"""The release that added camera observations and the CNN encoders (PPO's, the off-policy
learners'), image-instruction flow policies, a legged robot and PPO's learning-rate cooldown. Keys an
algorithm's config lacks are skipped, so the group serves every ``algo`` section."""

MANISKILL_CAMERA_KEYS: dict[str, Any] = {
    "env.backend": _TODAYS_DEFAULT,  # ManiSkill and robosuite tasks rendered no camera (camera "", 64 px)
}
"""ManiSkill's and robosuite's camera images: their task configs gained ``env.backend``
(``camera``, ``image_size_px``). robosuite's came a release later, but its one key is the same
and so is the value that reproduces older runs, so this group fills both. Last in the tuple, so
the older groups fill a MuJoCo config's ``env.backend`` first."""

BACKGROUND_EVAL_KEYS: dict[str, Any] = {
    "trainer.background_eval": False,  # evaluations ran in the training process, between updates
}
"""Periodic evaluations in a background process (:mod:`embodied.training.background_eval`)."""

QUAD_RAMP_START_KEYS: dict[str, Any] = {
    "env.randomization_ramp_start": 0.0,  # the quadrotor curriculum's ramp began with training
}
"""The quadrotor tasks' delayed curriculum (``randomization_ramp_start``)."""

QUAD_CRITIC_GAP_KEYS: dict[str, Any] = {
    "env.critic_gap_inputs": False,  # the quadrotor critic saw parameter scales and disturbances only
}
"""The quadrotor tasks' privileged critic inputs of the gap-model draws (``critic_gap_inputs``)."""

KEY_GROUPS_ADDED_LATER: tuple[dict[str, Any], ...] = (
    KEYS_ADDED_LATER,
    FINETUNING_RELEASE_KEYS,
    VISION_RELEASE_KEYS,
    MANISKILL_CAMERA_KEYS,
    BACKGROUND_EVAL_KEYS,
    QUAD_RAMP_START_KEYS,
    QUAD_CRITIC_GAP_KEYS,
)
"""One group per release; each group is all-or-nothing, as described for :data:`KEYS_ADDED_LATER`."""


def _fill_keys_added_later(cfg: Any, data: dict[str, Any], config_path: Path) -> None:
    """For each group of :data:`KEY_GROUPS_ADDED_LATER`: put the group's keys that ``cfg`` has
    into ``data`` (in place) when ``data`` holds none of them."""
    for group in KEY_GROUPS_ADDED_LATER:
        _fill_group(cfg, data, config_path, group)


def _fill_group(cfg: Any, data: dict[str, Any], config_path: Path, group: dict[str, Any]) -> None:
    slots: list[tuple[str, Any, dict[str, Any], str, Any]] = []  # (dotted, value, holder, name, default)
    for dotted, value in group.items():
        *parents, name = dotted.split(".")
        node, holder = cfg, data
        for part in parents:
            if not (hasattr(node, part) and isinstance(holder.get(part), dict)):
                break
            node, holder = getattr(node, part), holder[part]
        else:
            if hasattr(node, name):
                slots.append((dotted, value, holder, name, getattr(node, name)))
    if not slots or any(name in holder for _, _, holder, name, _ in slots):
        return  # a current config (or a damaged one: the missing keys are named by the caller)
    for dotted, value, holder, name, default in slots:
        if value is _TODAYS_DEFAULT:
            value = (
                dataclasses.asdict(default)
                if dataclasses.is_dataclass(default) and not isinstance(default, type)
                else default
            )
        holder[name] = value
        log.info("%s predates key %s: using %r, the behaviour the run was saved with", config_path, dotted, value)


def _absent_keys(cfg: Any, data: Any, prefix: str = "") -> list[str]:
    """Dotted keys of dataclass ``cfg`` that the nested mapping ``data`` does not hold."""
    if not isinstance(data, dict):
        return []  # a wrong type is reported, naming the key, when the layer is applied
    absent: list[str] = []
    for f in dataclasses.fields(cfg):
        if f.name not in data:
            absent.append(prefix + f.name)
            continue
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            absent += _absent_keys(value, data[f.name], prefix=f"{prefix}{f.name}.")
    return absent


def _saved_allow(data: dict[str, Any], config_path: Path) -> list[str]:
    saved = data.get(ALLOW_KEY, [])
    if not (isinstance(saved, list) and all(isinstance(k, str) for k in saved)):
        raise ConfigError(f"{config_path}: key {ALLOW_KEY!r} expects a list of dotted keys, got {saved!r}")
    return saved


def saved_allow(config_path: Path) -> list[str]:
    """The keys a saved ``config.yaml`` lists under ``i_know_what_im_doing``."""
    return _saved_allow(load_yaml(config_path), config_path)


def check_allow_keys(cfg: ExperimentCfg, keys: Collection[str]) -> None:
    """Raise unless every ``--i-know-what-im-doing KEY`` names a numeric key of ``cfg``."""
    from embodied.config import UNPHYSICAL, closest, describe

    known = [key for key, _, _ in describe(cfg)]
    for key in keys:
        if key not in known and key != UNPHYSICAL:
            raise ConfigError(
                f"command line: --i-know-what-im-doing {key}: unknown key; valid keys (closest first): "
                + ", ".join(closest(key, known)[:5])
            )


def replace_trainer(cfg: ExperimentCfg, **changes: Any) -> ExperimentCfg:
    """A copy of ``cfg`` with trainer fields changed (used by tests and sweeps)."""
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, **changes))
