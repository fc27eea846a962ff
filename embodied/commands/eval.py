"""``embodied eval``: success rate, mean return and episode length of a trained run."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any

from embodied.config import ConfigError, device_flag, int_in_range


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval",
        help="evaluate a trained run (success_rate, mean_return, mean_episode_length)",
        description="Fly a run's policy deterministically for N episodes (one per parallel env) and "
        "report success_rate, mean_return and mean_episode_length. --policy selects which form of "
        "the policy flies: the torch module, the exported ONNX model, or the compiled C firmware "
        "controller in the loop.",
    )
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR|lerobot:REF",
        help="a folder printed by `embodied train`, or lerobot:<hub id or folder>: a LeRobot pretrained policy "
        "evaluated on its own (needs --task; run from the LeRobot environment, scripts/setup_lerobot.sh)",
    )
    p.add_argument(
        "--task",
        default=None,
        help="with lerobot:REF: the task to evaluate on (its observations map to the policy's features by the "
        "task's row in embodied/data/lerobot_format.py)",
    )
    p.add_argument(
        "--camera",
        default=None,
        metavar="NAME",
        help="with lerobot:REF: render this camera of the task's model (sets env.backend.camera)",
    )
    p.add_argument(
        "--episodes", type=int_in_range(1, 1_000_000), default=1000, help="number of episodes (default: 1000)"
    )
    p.add_argument("--seed", type=int_in_range(0, 2**31 - 1), default=12345, help="evaluation seed (default: 12345)")
    p.add_argument(
        "--policy",
        default="torch",
        help="torch (default: the run's policy artifact ckpt/policy.pt), or an export format: onnx "
        "(onnxruntime), c (the generated C on the host; for Crazyflie policies the firmware controller "
        "in the loop, which builds its own observation). Missing exports are written first.",
    )
    p.add_argument("--device", type=device_flag, default="cpu", help="cpu or cuda")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from embodied import registry
    from embodied.errors import EmbodiedError
    from embodied.eval_cfg import eager_task_cfg
    from embodied.experiment import load_experiment
    from embodied.training.evaluate import EvalEnvs, evaluate, load_policy
    from embodied.training.lerobot_base import is_lerobot_source
    from embodied.training.run import CONFIG_FILE
    from embodied.training.run_policy import NoArtifactKindError, policy_artifact

    if is_lerobot_source(args.run_dir):
        return _run_lerobot(args)
    if args.task is not None or args.camera is not None:
        raise EmbodiedError("--task and --camera are for lerobot:REF; a run directory evaluates on its own task")
    args.run_dir = Path(args.run_dir)
    if not (args.run_dir / CONFIG_FILE).is_file():
        raise EmbodiedError(
            f"{args.run_dir}: not a run directory (no {CONFIG_FILE}); pass the folder `embodied train` printed"
        )
    cfg = load_experiment(args.run_dir / CONFIG_FILE)
    # fail early and clearly when there is no checkpoint; a policy with no artifact kind is
    # evaluated from the checkpoint (load_policy)
    with contextlib.suppress(NoArtifactKindError):
        policy_artifact(args.run_dir)
    device = registry.resolve_device(args.device)
    result = evaluate(
        lambda env: load_policy(args.policy, args.run_dir, env),
        EvalEnvs(cfg.task_name, eager_task_cfg(cfg.env), str(device)),
        episodes=args.episodes,
        seed=args.seed,
    )
    return _report(args, result, args.policy)


def _run_lerobot(args: argparse.Namespace) -> int:
    """``embodied eval lerobot:REF --task TASK``: a LeRobot checkpoint on its own, no training."""
    from embodied import registry
    from embodied.config import apply_overrides
    from embodied.training.evaluate import EvalEnvs, evaluate
    from embodied.training.lerobot_base import load_lerobot_policy

    if args.task is None:
        raise ConfigError(f"{args.run_dir}: give the task to evaluate on, e.g. --task arm-push --camera top")
    if args.policy != "torch":
        raise ConfigError(f"--policy {args.policy}: a LeRobot checkpoint is evaluated as it is (--policy torch)")
    camera = {} if args.camera is None else {"backend": {"camera": args.camera}}
    env_cfg = apply_overrides(registry.task_cfg(args.task), camera, "--camera")
    device = registry.resolve_device(args.device)

    def load(env: Any) -> Any:
        policy = load_lerobot_policy(args.run_dir, args.task, env.obs_spec, env.action_dim, args.camera, device)
        return lambda obs: policy.act(obs, deterministic=True)

    result = evaluate(load, EvalEnvs(args.task, env_cfg, str(device)), episodes=args.episodes, seed=args.seed)
    return _report(args, result, args.run_dir)


def _report(args: argparse.Namespace, result: Any, policy: str) -> int:
    out = {
        "success_rate": result.success_rate,
        "mean_return": result.mean_return,
        "mean_episode_length": result.mean_episode_length,
        "std_return": result.std_return,
        "episodes": result.episodes,
        "policy": policy,
    } | result.metrics
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key}: {value:.4f}" if isinstance(value, float) else f"{key}: {value}")
    return 0
