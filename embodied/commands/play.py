"""``embodied play``: roll out a trained policy and render a video plus a trajectory plot."""

from __future__ import annotations

import argparse
from pathlib import Path

from embodied.config import int_in_range


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "play",
        help="render a trained policy to a video and a trajectory plot",
        description="Fly one episode of a run's policy (deterministic) and write a video (.mp4, "
        "mp4v codec) and a trajectory plot PNG next to it.",
        epilog="example: embodied play runs/quad_hover/20261129-101500_ppo_s0 --video hover.mp4",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a folder printed by `embodied train`")
    p.add_argument("--video", type=Path, default=None, help="output video (default: RUN_DIR/videos/play_s<seed>.mp4)")
    p.add_argument("--plot", type=Path, default=None, help="output trajectory PNG (default: next to the video)")
    p.add_argument("--seed", type=int_in_range(0, 2**31 - 1), default=0, help="initial-state seed (default: 0)")
    p.add_argument(
        "--fps",
        type=int_in_range(1, 1000),
        default=50,
        help="video frames per second (default: 50; the sim runs at 100 Hz)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from embodied.env import PhysicalStateEnv
    from embodied.errors import EmbodiedError
    from embodied.training.run import load_run

    loaded = load_run(args.run_dir)
    env = loaded.make_env(1, args.seed)
    if not isinstance(env, PhysicalStateEnv):
        raise EmbodiedError(f"play has no renderer for task {loaded.cfg.task_name!r} yet (quadrotor tasks only)")
    from embodied.sim.quadrotor_render import plot_trajectory, render_video

    video = args.video or args.run_dir / "videos" / f"play_s{args.seed}.mp4"
    plot = args.plot or video.with_suffix(".png")
    video.parent.mkdir(parents=True, exist_ok=True)
    plot.parent.mkdir(parents=True, exist_ok=True)
    obs = env.reset(seed=args.seed)
    positions, quats = [], []
    success = False
    steps = 0
    with torch.inference_mode():
        for steps in range(1, env.max_episode_steps + 1):  # noqa: B007 (steps is reported below)
            state = env.physical_state()
            positions.append(state["position_w"][0].cpu().numpy())
            quats.append(state["quat_wb"][0].cpu().numpy())
            obs, _, terminated, truncated, info = env.step(loaded.policy.act(obs, deterministic=True))
            if bool(terminated[0] | truncated[0]):
                success = bool(info["success"][0])
                break
    setpoint = env.physical_state()["setpoint_w"].cpu().numpy().astype(np.float64)
    position_w, quat_wb = np.stack(positions), np.stack(quats)
    stride = max(1, round(1.0 / (env.dt * args.fps)))
    render_video(position_w[::stride], quat_wb[::stride], setpoint, video, fps=args.fps)
    plot_trajectory(np.arange(len(position_w)) * env.dt, position_w, setpoint, plot)
    env.close()
    print(f"episode: {steps} steps ({steps * env.dt:.2f} s), success: {success}")
    print(f"video: {video}")
    print(f"plot: {plot}")
    return 0
