"""``embodied eval``: success rate, mean return and episode length of a trained run."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

from embodied.config import device_flag, int_in_range


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval",
        help="evaluate a trained run (success_rate, mean_return, mean_episode_length)",
        description="Fly a run's policy deterministically for N episodes (one per parallel env) and "
        "report success_rate, mean_return and mean_episode_length. --policy selects which form of "
        "the policy flies: the torch module, the exported ONNX model, or the compiled C firmware "
        "controller in the loop.",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a folder printed by `embodied train`")
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
    from embodied.experiment import load_experiment
    from embodied.training.evaluate import EvalEnvs, evaluate, load_policy
    from embodied.training.run import CONFIG_FILE
    from embodied.training.run_policy import NoArtifactKindError, policy_artifact

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
        EvalEnvs(cfg.task_name, cfg.env, str(device)),
        episodes=args.episodes,
        seed=args.seed,
    )
    out = {
        "success_rate": result.success_rate,
        "mean_return": result.mean_return,
        "mean_episode_length": result.mean_episode_length,
        "std_return": result.std_return,
        "episodes": result.episodes,
        "policy": args.policy,
    } | result.metrics
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key}: {value:.4f}" if isinstance(value, float) else f"{key}: {value}")
    return 0
