"""Isaac Lab's own RSL-RL agent config for a task, translated into embodied's PPO keys.

``embodied train isaaclab:<TaskId>`` (algorithm ``ppo``) starts from the ``RslRlOnPolicyRunnerCfg``
that the task registers (``rsl_rl_cfg_entry_point``), so an Isaac Lab user's run carries over.
The mapping (docs/backends.md "Isaac Lab" repeats it):

=====================================================  =======================================
RSL-RL (``isaaclab_rl.rsl_rl``)                        embodied
=====================================================  =======================================
``num_steps_per_env``                                  ``algo.num_steps_per_env``
``max_iterations`` x ``num_steps_per_env`` x N envs    ``trainer.total_env_steps``
``algorithm.num_learning_epochs``                      ``algo.num_epochs``
``algorithm.num_mini_batches``                         ``algo.num_minibatches``
``algorithm.gamma`` / ``lam``                          ``algo.gamma`` / ``algo.lam``
``algorithm.clip_param``                               ``algo.clip_ratio``
``algorithm.use_clipped_value_loss``                   ``algo.clip_value_loss``
``algorithm.value_loss_coef``                          ``algo.value_coef``
``algorithm.entropy_coef``                             ``algo.entropy_coef``
``algorithm.learning_rate`` / ``schedule``             ``algo.learning_rate`` / ``algo.schedule``
``algorithm.desired_kl`` / ``max_grad_norm``           ``algo.desired_kl`` / ``algo.max_grad_norm``
``actor.hidden_dims`` / ``critic.hidden_dims``         ``algo.actor_hidden`` / ``algo.critic_hidden``
``actor.activation``                                   ``algo.activation`` (elu, tanh, relu)
``actor.distribution_cfg.init_std``                    ``algo.init_std``
``actor.obs_normalization``                            ``algo.normalize_obs``
``scene.num_envs`` of the env config                   ``num_envs`` (``--num-envs`` wins)
(none: one simulation per process)                     ``trainer.eval_episodes = 0``
=====================================================  =======================================

Isaac Lab refuses a second simulation in a process ("Simulation context already exists"), so
the trainer cannot build its evaluation env beside the training env: evaluations are off and
``embodied eval RUN_DIR`` evaluates the run afterwards (a new process).

Not carried over (logged when set): RSL-RL's symmetry and RND extensions, recurrent or CNN
models, a state-dependent std and ``clip_actions`` (embodied's actions are always in [-1, 1]).
A key whose value embodied cannot express (an activation other than elu, tanh or relu) is a
named error. Only the standard library is imported here; :func:`agent_overrides` imports
Isaac Lab.
"""

from __future__ import annotations

import logging
from typing import Any

from embodied.config import ConfigError
from embodied.errors import import_optional

log = logging.getLogger("embodied.sim.isaaclab_agent")

ALGORITHM_KEYS: dict[str, str] = {
    "num_learning_epochs": "num_epochs",
    "num_mini_batches": "num_minibatches",
    "gamma": "gamma",
    "lam": "lam",
    "clip_param": "clip_ratio",
    "use_clipped_value_loss": "clip_value_loss",
    "value_loss_coef": "value_coef",
    "entropy_coef": "entropy_coef",
    "learning_rate": "learning_rate",
    "schedule": "schedule",
    "desired_kl": "desired_kl",
    "max_grad_norm": "max_grad_norm",
}
"""``RslRlPpoAlgorithmCfg`` field -> ``PPOCfg`` field, same meaning and units."""

ACTIVATIONS = ("elu", "tanh", "relu")
NOT_CARRIED = ("symmetry_cfg", "rnd_cfg")


def translate(agent_cfg: Any, num_envs: int) -> dict[str, Any]:
    """Nested overrides ``{"algo": {...}, "trainer": {...}}`` from an ``RslRlOnPolicyRunnerCfg``.

    ``num_envs`` is the run's env count (``max_iterations`` becomes env steps through it)."""
    algorithm = agent_cfg.algorithm
    if getattr(algorithm, "class_name", "PPO") != "PPO":
        raise ConfigError(
            f"isaaclab agent config: RSL-RL algorithm {algorithm.class_name!r} has no embodied twin (PPO)"
        )
    algo: dict[str, Any] = {ours: getattr(algorithm, theirs) for theirs, ours in ALGORITHM_KEYS.items()}
    if algo["desired_kl"] is None:  # RSL-RL adapts the learning rate only with a KL target
        algo.pop("desired_kl")
        algo["schedule"] = "fixed"
    algo["num_steps_per_env"] = int(agent_cfg.num_steps_per_env)
    actor, critic = _model(agent_cfg, "actor", "policy"), _model(agent_cfg, "critic", "policy")
    algo["actor_hidden"] = list(actor.hidden_dims)
    algo["critic_hidden"] = list(getattr(critic, "critic_hidden_dims", None) or critic.hidden_dims)
    activation = str(actor.activation).lower()
    if activation not in ACTIVATIONS:
        raise ConfigError(
            f"isaaclab agent config: actor activation {activation!r} has no embodied twin ({', '.join(ACTIVATIONS)})"
        )
    algo["activation"] = activation
    distribution = getattr(actor, "distribution_cfg", None)
    init_std = getattr(distribution, "init_std", None) or getattr(actor, "init_noise_std", None)
    if init_std is not None:
        algo["init_std"] = float(init_std)
    if getattr(actor, "obs_normalization", None) is not None:
        algo["normalize_obs"] = bool(actor.obs_normalization)
    for name in NOT_CARRIED:
        if getattr(algorithm, name, None) is not None:
            log.warning("isaaclab agent config: %s is not carried over (embodied's PPO has no such extension)", name)
    steps = int(agent_cfg.max_iterations) * algo["num_steps_per_env"] * num_envs
    return {"algo": algo, "trainer": {"total_env_steps": steps}}


def _model(agent_cfg: Any, name: str, legacy: str) -> Any:
    """``agent_cfg.<name>`` (RSL-RL 5 model configs), else the older shared ``policy`` config."""
    model = getattr(agent_cfg, name, None)
    if model is None:
        model = getattr(agent_cfg, legacy)
    return model


def agent_overrides(task_id: str, num_envs: int | None) -> dict[str, Any] | None:
    """The task's translated RSL-RL agent config plus ``num_envs``; None when it registers none.

    ``num_envs`` None: the env config's ``scene.num_envs``."""
    import_optional("isaaclab_tasks", "isaaclab agent configs", "bash scripts/setup_isaaclab.sh")
    import gymnasium

    spec = gymnasium.registry.get(task_id)
    if spec is None or "rsl_rl_cfg_entry_point" not in spec.kwargs:
        return None
    parse = import_optional("isaaclab_tasks.utils", "isaaclab agent configs", "bash scripts/setup_isaaclab.sh")
    agent_cfg = parse.load_cfg_from_registry(task_id, "rsl_rl_cfg_entry_point")
    if num_envs is None:
        env_cfg = parse.load_cfg_from_registry(task_id, "env_cfg_entry_point")
        num_envs = int(env_cfg.scene.num_envs)
    overrides = {"num_envs": num_envs, **translate(agent_cfg, num_envs)}
    # Isaac Lab holds one simulation per process: the trainer's evaluation env cannot be built
    # beside the training env, so evaluate afterwards with `embodied eval RUN_DIR`
    overrides["trainer"]["eval_episodes"] = 0
    return overrides
