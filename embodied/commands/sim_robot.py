"""``embodied sim-robot TASK``: a simulated robot on ROS 2 topics, for closed-loop deployment tests."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TYPE_CHECKING, Any

import numpy as np

from embodied.config import float_in_range, int_in_range
from embodied.real.transports import add_middleware_arguments

if TYPE_CHECKING:
    from embodied.real.robot_config import RobotConfig

DESCRIPTION = """\
Run one env of TASK as a robot behind ROS 2 topics: publish its state on the robot config's
input topics (nav_msgs/Odometry for tasks on the quadrotor backend; for arm-push the joint
states, tracked points and, with a camera, sensor_msgs/Image) and apply the commands `embodied
deploy` sends back. Start the two in separate shells with the same --robot, e.g.

  embodied sim-robot quad-hover --run RUN_DIR --episodes 20 --loopback --handover-starts
  embodied deploy RUN_DIR --robot crazyflie_sim --loopback --use-sim-time

  embodied sim-robot arm-push --robot arm_push_sim --run RUN_DIR --episodes 10 --loopback
  embodied deploy RUN_DIR --robot arm_push_sim --loopback --use-sim-time

(--run RUN_DIR: the task as that policy was trained, e.g. without the constant disturbance force
the shipped quad-hover config leaves out.)

By default (lockstep) simulation time advances one control period per step and is published on
/clock; the simulator waits for the node's answer to each state it published, matched by the
state's header stamp, so the node must run on /clock (--use-sim-time). --realtime steps on the
wall clock and holds the last command, as a vehicle would (deploy without --use-sim-time). In both
modes, no new command for the robot config's command.watchdog_periods periods (the node killed,
hung or cut off) applies the robot's safe command, as a driver must. Ends with a summary: episodes,
success rate, steps, missed commands, safe commands applied after arming (spurious motors-off),
watchdog trips, state->command round trip; exit code 1 when lockstep lost the node.
"""


HANDOVER_STARTS: dict[str, float] = {
    "init_max_angle_rad": 0.3,
    "init_lin_vel_mps": 0.3,
    "init_ang_vel_rad_s": 0.5,
}
"""``--handover-starts``: the start states a policy meets on a real vehicle, where it takes over
from a PID hover after take-off (near the setpoint, within 0.3 rad of level, slow), instead of
the training distribution's tumbling starts (tilts up to pi/2, which reach the edge of the
training envelope the node enforces, so a recovery there may end in the safe command)."""


def held_setpoint(robot_params: dict[str, Any], env_cfg: object) -> dict[str, Any]:
    """Task overrides that fix the setpoint to the robot config's ``setpoint_w`` /
    ``setpoint_yaw_rad`` parameters, for the task fields of the same names (``{}`` if none)."""
    fields = {f.name for f in dataclasses.fields(env_cfg)} if dataclasses.is_dataclass(env_cfg) else set()
    held: dict[str, Any] = {}
    if "setpoint_w" in robot_params and "setpoint_w" in fields:
        held["setpoint_w"] = [float(v) for v in robot_params["setpoint_w"]]
    if "setpoint_yaw_rad" in robot_params and "setpoint_yaw_rad" in fields:
        held["setpoint_yaw_rad"] = float(np.asarray(robot_params["setpoint_yaw_rad"], dtype=float).reshape(-1)[0])
        if "setpoint_yaw_range_rad" in fields:
            held["setpoint_yaw_range_rad"] = 0.0
    return held


def served_env_cfg(env_cfg: Any, robot: RobotConfig, env_overrides: list[str], *, handover_starts: bool = False) -> Any:
    """The task config sim-robot serves for ``robot``: ``env_cfg``
    holding the robot's setpoint, then the handover starts if asked, then the ``--env``
    ``KEY=VALUE`` overrides. An in-process run on this config flies the same episodes."""
    from embodied.config import apply_overrides, parse_dotted

    held = held_setpoint(robot.params, env_cfg)
    if held:
        # The node holds one setpoint (its parameters), so the served task holds the same one
        # instead of drawing a new setpoint (yaw) per episode.
        env_cfg = apply_overrides(env_cfg, held, f"{robot.path} params")
    if handover_starts:
        env_cfg = apply_overrides(env_cfg, dict(HANDOVER_STARTS), "--handover-starts")
    if env_overrides:
        env_cfg = apply_overrides(env_cfg, parse_dotted(env_overrides, source="--env"), "--env")
    return env_cfg


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sim-robot",
        help="serve a simulated robot over ROS 2 topics (Cyclone DDS) for `embodied deploy`",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("task", metavar="TASK", help="task name: quad-hover, quad-track or arm-push")
    p.add_argument("--robot", default="crazyflie_sim", help="robot config: built-in name or YAML path")
    p.add_argument("--transport", choices=("dds",), default="dds", help="middleware (Cyclone DDS)")
    p.add_argument("--episodes", type=int_in_range(1, 10_000_000), default=None, help="stop after N finished episodes")
    p.add_argument(
        "--seconds", type=float_in_range(0.001, 1e7, "s"), default=None, help="stop after S seconds of wall time"
    )
    p.add_argument(
        "--run", default=None, metavar="RUN_DIR", help="take the task config from this run (as it was trained)"
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="task config override, e.g. --env obs_noise_std=[0,0,0,0] (repeatable)",
    )
    p.add_argument("--seed", type=int_in_range(0, 2**31 - 1), default=0, help="env seed")
    p.add_argument(
        "--handover-starts",
        action="store_true",
        help="start episodes as a real take-off hands over from PID hover: "
        + ", ".join(f"{k}={v}" for k, v in HANDOVER_STARTS.items()),
    )
    p.add_argument("--realtime", action="store_true", help="step on the wall clock instead of lockstep")
    p.add_argument(
        "--rt-priority",
        type=int_in_range(0, 99),
        default=10,
        metavar="N",
        help="--realtime: SCHED_FIFO priority of the process, as a robot's driver would run "
        "(default 10; 0 for normal scheduling; needs root, an rtprio limit or CAP_SYS_NICE)",
    )
    add_middleware_arguments(p)
    p.add_argument(
        "--arm-timeout",
        type=float_in_range(0.001, 86_400, "s"),
        default=30.0,
        metavar="S",
        help="wait at most S s for the node",
    )
    p.add_argument(
        "--command-timeout",
        type=float_in_range(0.001, 3600, "s"),
        default=None,
        metavar="S",
        help="lockstep: wall time to wait for the answer to each state before the step counts as a period "
        "without a command (default 2.0); the robot config's command.watchdog_periods such periods in a "
        "row apply the safe command",
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from embodied import registry
    from embodied.config import ConfigError
    from embodied.real.deploy import open_transport
    from embodied.real.robot_config import load_robot
    from embodied.real.sim_robot import SimRobot

    if args.episodes is None and args.seconds is None:
        raise ConfigError("sim-robot needs a stop condition: --episodes N and/or --seconds S")
    from embodied.config import parse_dotted

    robot = load_robot(args.robot, parse_dotted(args.param, source="--param"))
    env_cfg = registry.task_cfg(args.task)
    if args.run is not None:
        from pathlib import Path

        from embodied.experiment import load_experiment
        from embodied.training.run import CONFIG_FILE

        run_cfg = load_experiment(Path(args.run) / CONFIG_FILE)
        if run_cfg.task_name != args.task:
            raise ConfigError(f"--run {args.run} trained task {run_cfg.task_name!r}, not {args.task!r}")
        env_cfg = run_cfg.env
    env_cfg = served_env_cfg(env_cfg, robot, args.env or [], handover_starts=args.handover_starts)
    import torch

    # One env steps fastest on one thread, and idle OpenMP workers spin on the cores the node needs.
    torch.set_num_threads(1)
    env = registry.make_env(args.task, env_cfg, 1, "cpu", args.seed)
    if args.realtime:
        from embodied.real.realtime import realtime_process, set_timer_slack

        # Before the middleware's threads start: they inherit it (see realtime_process).
        set_timer_slack()
        realtime_process(args.rt_priority)
    transport = open_transport(
        args.transport,
        domain_id=args.domain_id,
        loopback=args.loopback,
        node_name="embodied_sim_robot",
        ros_distro=args.ros_distro,
    )
    try:
        import signal

        sim = SimRobot(env, robot, transport, args.task)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: sim.halt())
        summary = sim.run(
            episodes=args.episodes,
            seconds=args.seconds,
            seed=args.seed,
            realtime=args.realtime,
            arm_timeout_s=args.arm_timeout,
            **({} if args.command_timeout is None else {"command_timeout_s": args.command_timeout}),
        )
    finally:
        # The node's safe command follows its input publisher leaving: close before anything else.
        transport.close()
        env.close()
    if args.json:
        print(json.dumps(summary.as_dict()))
    else:
        p50, p90, p99 = summary.rtt_ms
        print(
            f"episodes {summary.episodes} | success {summary.success_rate:.1%} ({summary.successes}) | "
            f"mean length {summary.mean_episode_steps:.1f} steps | steps {summary.steps} | "
            f"missed commands {summary.missed_commands} | safe commands {summary.safe_commands} | state->command ms p50 {p50:.3f} p90 {p90:.3f} "
            f"p99 {p99:.3f} | watchdog trips {summary.watchdog_trips} | {summary.wall_s:.1f} s"
        )
    return 1 if summary.node_lost else 0
