"""``embodied collect``: record demonstrations from a trained run or a scripted expert."""

from __future__ import annotations

import argparse
from pathlib import Path

from embodied.config import ConfigError, float_in_range, int_in_range

SCRIPTED_PREFIX = "scripted:"

EXAMPLES = """examples:
  embodied collect scripted:arm-push --episodes 200 --out demos/arm_push_expert
  embodied collect scripted:arm-push --episodes 200 --noise 0.6 --out demos/arm_push_noisy
  embodied collect scripted:arm-push --episodes 500 --noise 0.3 --record intended --out demos/arm_push_dart
  embodied collect runs/arm_push/20261202-050000_ppo_s0 --episodes 100 --out demos/from_ppo
  embodied collect scripted:arm-push --episodes 50 --images --camera top --out demos/arm_push_images
  embodied collect scripted:arm-push --episodes 200 --images --camera top --format lerobot --out demos/arm_push_lerobot

The dataset is a Minari directory (data/main_data.hdf5 + data/metadata.json): load it with
minari.MinariDataset(OUT/data), or train on it with `embodied train TASK --algo bc-flow --dataset OUT`.
--format lerobot writes a LeRobotDataset v3 instead, through LeRobot's own API (run it from the
LeRobot environment, scripts/setup_lerobot.sh): LeRobotDataset(repo_id, root=OUT) loads it, LeRobot's
trainer trains on it, and every --dataset learner here reads it."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "collect",
        help="record demonstrations (Minari or LeRobotDataset format) from a run or a scripted expert",
        description="Roll out a policy and write every finished episode (observations, actions, rewards, "
        "terminations, truncations) as a Minari dataset or a LeRobotDataset (--format). SOURCE is a run directory (its policy acts "
        "deterministically) or scripted:TASK (the task's scripted expert).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", metavar="RUN_DIR|scripted:TASK", help="where actions come from")
    p.add_argument("--episodes", type=int_in_range(1, 10_000_000), required=True, help="episodes to record")
    p.add_argument(
        "--noise",
        type=float_in_range(0.0, 100.0),
        default=0.0,
        metavar="S",
        help="std of Gaussian noise added to every action before clipping (recorded as executed; default 0)",
    )
    p.add_argument(
        "--record",
        choices=("executed", "intended"),
        default="executed",
        help="with --noise: store the executed noisy action (default; deliberately imperfect demos) or the "
        "source's intended action (clean labels on noise-perturbed states, for robust cloning)",
    )
    p.add_argument("--out", type=Path, default=None, help="dataset folder to create (default: demos/<task>_<source>)")
    p.add_argument(
        "--images",
        action="store_true",
        help="also record the env's camera images (observation group 'image', uint8 [H, W, 3]); the dataset's "
        "observations become a Dict of 'policy' and 'image'",
    )
    p.add_argument(
        "--camera",
        default=None,
        metavar="NAME",
        help="render this camera of the task's model (sets env.backend.camera; default: the run's or none)",
    )
    p.add_argument(
        "--format",
        choices=("minari", "lerobot"),
        default="minari",
        help="dataset format: minari (default; needs h5py) or lerobot (LeRobotDataset v3 written by LeRobot, "
        "camera images stored as PNG frames; needs the LeRobot environment)",
    )
    p.add_argument(
        "--instruction",
        default=None,
        metavar="TEXT",
        help="with --format lerobot: the language instruction stored as every frame's task (default: the task's "
        "row in embodied/data/lerobot_format.py, else the task name)",
    )
    p.add_argument("--num-envs", type=int_in_range(1, 65536), default=32, help="parallel envs (default: 32)")
    p.add_argument("--seed", type=int_in_range(0, 2**31 - 1), default=0, help="env and noise seed (default: 0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from embodied import registry
    from embodied.config import apply_overrides
    from embodied.data.collect import collect_episodes
    from embodied.data.demos import write_dataset
    from embodied.env import IMAGE_GROUP, ObsDict

    if args.format == "lerobot":  # before the rollout: fail fast outside the LeRobot environment
        from embodied.data.lerobot_writer import require_lerobot

        require_lerobot()
    source: str = args.source
    camera = {} if args.camera is None else {"backend": {"camera": args.camera}}
    if source.startswith(SCRIPTED_PREFIX):
        task = source[len(SCRIPTED_PREFIX) :]
        expert = registry.make_expert(task)
        env_cfg = apply_overrides(registry.task_cfg(task), camera, "--camera")
        env = registry.make_env(task, env_cfg, args.num_envs, "cpu", args.seed)
        act = expert.act
        label = "scripted"
    else:
        from embodied.training.run import load_run

        loaded = load_run(Path(source))
        task = loaded.cfg.task_name
        env_cfg = apply_overrides(loaded.cfg.env, camera, "--camera")
        env = registry.make_env(task, env_cfg, args.num_envs, "cpu", args.seed)
        policy = loaded.policy

        def act(obs: ObsDict) -> torch.Tensor:
            return policy.act(obs, deterministic=True)

        label = loaded.cfg.algo_name
    out = args.out or Path("demos") / f"{task.replace(':', '_')}_{label}"
    control_period_s = float(env.dt)
    try:
        if args.images and IMAGE_GROUP not in env.obs_spec:
            raise ConfigError(
                f"--images: {task} renders no camera images in this configuration; pass --camera NAME "
                "(a camera of the task's model, e.g. --camera top for arm-push)"
            )
        episodes = collect_episodes(
            env, act, args.episodes, noise_std=args.noise, seed=args.seed, record=args.record, images=args.images
        )
    finally:
        env.close()
    success = sum(bool(ep.terminations.any()) for ep in episodes) / len(episodes)
    dataset_id = f"embodied/{task.replace(':', '-').lower()}-{label}-v0"
    if args.format == "lerobot":
        from embodied.data.lerobot_format import task_map
        from embodied.data.lerobot_writer import write_lerobot_dataset

        write_lerobot_dataset(
            out,
            episodes,
            repo_id=dataset_id,
            fps=max(1, round(1.0 / control_period_s)),
            instruction=args.instruction or task_map(task).instruction,
            camera=args.camera or getattr(getattr(env_cfg, "backend", None), "camera", None) or None,
        )
    else:
        write_dataset(
            out,
            episodes,
            dataset_id=dataset_id,
            algorithm_name=label,
            description=f"{len(episodes)} episodes of {task} from {source}, action noise std {args.noise}, "
            f"{args.record} actions recorded",
        )
    print(f"episodes: {len(episodes)}  steps: {sum(len(e.actions) for e in episodes)}  success: {success:.3f}")
    print(out)
    return 0
