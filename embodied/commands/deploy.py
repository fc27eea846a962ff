"""``embodied deploy RUN_DIR --robot CONFIG``: run an exported policy as a ROS 2-compatible node."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from embodied.config import device_flag, float_in_range, int_in_range
from embodied.real.transports import add_middleware_arguments

log = logging.getLogger(__name__)

RT_PRIORITY = 10
"""Default SCHED_FIFO priority of the node's threads: above every normal process, below the
kernel's own real-time threads (50 for threaded IRQs) and ROS 2 executors tuned above it."""

DESCRIPTION = """\
Run RUN_DIR/export/policy.onnx on a robot through ROS 2 topics. The robot config (a built-in
name such as crazyflie_sim / ros2_control_arm, or a YAML path) names the input topics, how
each policy observation field is built from them, the command topic and the safe command.

A LeRobot policy runs on torch in the LeRobot environment (bash scripts/setup_lerobot.sh):
lerobot:REF (a LeRobot checkpoint folder or Hub id, e.g. an `embodied export RUN --format
lerobot` folder; --task or the robot config's `task:` names the task it was trained on), or a
run directory that fine-tuned one (ReinFlow or residual RL on --base lerobot:REF). The robot
config's camera input feeds its observation.images.<camera>, its `instruction:` LeRobot's task
text (default: the task's training instruction). ONNX exports never import torch.

--transport dds (default) speaks ROS 2's wire protocol through Cyclone DDS directly: no ROS 2
install needed, ROS 2 nodes on the same domain see its topics. --transport ros2 runs it as an
rclpy node (needs a sourced ROS 2 Humble/Jazzy); without rclpy it prints the equivalent
`ros2 launch embodied_ros2 policy.launch.py ...` line and how to install ROS 2.

The control loop runs at the policy's trained rate on its own clock and samples the newest
input. Inputs count as stale from their arrival time and header stamps (limits derived from the
rate; set per input in the robot config). Outside the training envelope, on stale or invalid
data, on the e-stop topic, and on every way out (SIGINT/SIGTERM, error) the robot's safe command
is sent. The process then ends within 10 s, even if middleware teardown hangs (every thread's
stack on stderr, exit status 1). In DDS mode the node is a ROS 2 managed (lifecycle) node:
`ros2 lifecycle get/set/list` work through its ~/get_state, ~/change_state and
~/get_available_transitions services; with --managed it starts unconfigured and sends the safe
command until activated. With --rt-priority the process runs SCHED_FIFO (the loop thread one
level above the rest, the signal thread two), and the loop sleeps to just before each deadline
and spins the rest.
Every state change is logged with its reason and published on /diagnostics and
~/state; rejected messages are counted there by reason.

A live line shows the safety state (waiting/stale/fault/envelope/estop/rearming/armed), loop
rate, period jitter, input->command latency percentiles, overruns and rejections.
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "deploy",
        help="run an exported policy on a robot over ROS 2 topics (Cyclone DDS or rclpy)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR|lerobot:REF",
        help="run directory (or its export/ folder) holding policy.onnx, a run that fine-tuned a LeRobot policy, "
        "or lerobot:<folder or hub id>",
    )
    p.add_argument("--robot", required=True, help="robot config: built-in name or path to a YAML file")
    p.add_argument(
        "--task",
        default=None,
        help="with lerobot:REF: the task the checkpoint was trained on (default: the robot config's `task:`)",
    )
    p.add_argument(
        "--device", type=device_flag, default="cpu", help="where torch runs a LeRobot policy: cpu (default), cuda[:N]"
    )
    p.add_argument("--transport", choices=("dds", "ros2"), default="dds", help="middleware (default: dds)")
    add_middleware_arguments(p)
    p.add_argument("--namespace", default="", help="ROS 2 namespace for the config's relative topic names (dds)")
    p.add_argument("--node-name", default="embodied_policy", help="node name (private ~/ topics, ros2 node list)")
    p.add_argument(
        "--use-sim-time",
        action="store_true",
        help="run the loop and judge input ages on /clock (rosgraph_msgs/Clock), e.g. with `sim-robot` lockstep",
    )

    p.add_argument(
        "--managed",
        action="store_true",
        help="start as an unconfigured lifecycle node: the policy drives only after "
        "`ros2 lifecycle set /NODE configure` and `... activate` (dds; without it the node starts active)",
    )
    p.add_argument(
        "--rt-priority",
        type=int_in_range(0, 99),
        default=RT_PRIORITY,
        metavar="N",
        help=f"SCHED_FIFO priority of the process (the control loop runs at N+1, the signal thread at N+2), "
        f"0 for normal scheduling (default {RT_PRIORITY}; needs root, an rtprio limit or CAP_SYS_NICE, "
        "else it logs once and runs normally)",
    )
    p.add_argument(
        "--duration", type=float_in_range(0.001, 1e7, "s"), default=None, metavar="S", help="stop after S seconds"
    )
    p.add_argument("--no-live", action="store_true", help="no live status line (log a status every 5 s)")
    p.add_argument(
        "--print-launch",
        action="store_true",
        help="print the equivalent ros2 launch line (with --task/--device for lerobot:REF) and exit",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import signal

    from embodied.config import parse_dotted
    from embodied.errors import EmbodiedError
    from embodied.real.deploy import launch_command, needs_torch, open_runner
    from embodied.real.robot_config import load_robot
    from embodied.real.runner import check_deployable
    from embodied.real.transports.rclpy_node import INSTALL_HINT, rclpy_available

    params = parse_dotted(args.param, source="--param")
    robot = load_robot(args.robot, params)
    # a policy the node cannot run on this robot fails before any middleware starts
    args.runner = None
    if not needs_torch(args.run_dir):
        check_deployable(args.run_dir, robot)
    if not args.print_launch and args.transport == "dds":
        args.runner = open_runner(args.run_dir, robot, args.task, args.device)  # loaded once, here
    if args.print_launch:
        print(launch_command(args.run_dir, args.robot, params, args.task, args.device))
        return 0
    if args.transport == "ros2" and not rclpy_available():
        print(launch_command(args.run_dir, args.robot, params, args.task, args.device))
        raise EmbodiedError(
            "--transport ros2: " + INSTALL_HINT + "; on a ROS 2 machine run the line above "
            "after `colcon build` of real/ros2/embodied_ros2"
        )
    from embodied.real.realtime import SignalWatcher, realtime_process

    # Before any middleware thread exists: they all inherit the scheduling and the blocked signals.
    priorities = realtime_process(args.rt_priority)
    signals = SignalWatcher((signal.SIGTERM, signal.SIGINT), priorities.signals)
    try:
        return _run_node(args, params, signals, priorities)
    finally:
        signals.close()


def _run_node(args: argparse.Namespace, params: dict[str, Any], signals: Any, priorities: Any) -> int:
    import threading

    from embodied.real.deploy import build_node, open_transport
    from embodied.real.realtime import arm_exit_guard

    if args.transport == "ros2":
        transport = open_transport("ros2")
    else:
        transport = open_transport(
            "dds",
            domain_id=args.domain_id,
            loopback=args.loopback,
            namespace=args.namespace,
            node_name=args.node_name,
            ros_distro=args.ros_distro,
        )
    try:
        node_kwargs: dict[str, Any] = {"rt_priority": priorities.loop}
        if args.use_sim_time:
            from embodied.real.freshness import SimClock

            sim_clock = SimClock()
            transport.subscribe(SimClock.TOPIC, SimClock.TYPE, "sensor", sim_clock.on_clock)
            node_kwargs["sim_clock"] = sim_clock
        if args.managed:
            node_kwargs["active"] = False
        node = build_node(
            transport, args.run_dir, args.robot, params, args.task, args.device, args.runner, **node_kwargs
        )
        stop = threading.Event()
        if args.transport == "dds":
            _serve_lifecycle(transport, node, stop, args.managed)

        # SIGTERM (a process manager) and SIGINT (Ctrl-C): the safe command goes out from the
        # signal thread itself (no command can follow it), then the loop ends.
        def on_signal(name: str) -> None:
            stop.set()
            node.shutdown(name)
            # Armed here too: the main thread may be the one stuck (in join or teardown) and
            # never reach the call below; a second arming only moves the deadline later.
            arm_exit_guard()

        signals.set_handler(on_signal)
        worker = threading.Thread(target=node.run, args=(stop, args.duration), name="control-loop", daemon=True)
        worker.start()
        try:
            _show_status(node, worker, live=not args.no_live)
        finally:
            stop.set()
            worker.join(timeout=2.0)
            arm_exit_guard()  # the loop ended with the safe command: nothing may keep the process now
            print(_status_line(node.status()), flush=True)
    finally:
        transport.close()
    return 0


def _serve_lifecycle(transport: Any, node: Any, stop: Any, managed: bool) -> None:
    """The managed-node states and their services (``ros2 lifecycle``) in DDS mode."""
    from embodied.real.lifecycle import ACTIVE, UNCONFIGURED, Lifecycle, serve_lifecycle

    def on_active(active: bool) -> None:
        if active:
            node.activate()
        else:
            node.deactivate("lifecycle deactivate")

    def on_finalized() -> None:
        node.shutdown("lifecycle shutdown")
        stop.set()

    serve_lifecycle(transport, Lifecycle(on_active, on_finalized, initial=UNCONFIGURED if managed else ACTIVE))


def _status_line(status: dict[str, Any]) -> str:
    p50, p90, p99 = status["latency_ms"]
    line = (
        f"{status['state']:>8} | {status['rate_hz']:6.1f} Hz | jitter ms p99 {status['jitter_ms'][2]:.3f} "
        f"| latency ms p50 {p50:.3f} p90 {p90:.3f} p99 {p99:.3f} | overruns {status['overruns']} "
        f"| in {status['received']} out {status['commands']} | errors {status['errors']}"
    )
    if status["last_error"]:
        line += f" | last: {status['last_error'][:80]}"
    return line


def _show_status(node: Any, worker: Any, live: bool) -> None:
    try:
        from rich.live import Live
        from rich.text import Text
    except ImportError:  # a minimal robot-side install has no rich: log the status instead
        live = False
    if not live:
        while worker.is_alive():
            worker.join(timeout=5.0)
            log.info("%s", _status_line(node.status()))
        return
    with Live(Text(_status_line(node.status())), refresh_per_second=4, transient=True) as display:
        while worker.is_alive():
            worker.join(timeout=0.25)
            display.update(Text(_status_line(node.status())))


def main(argv: list[str] | None = None) -> int:
    """``embodied-deploy`` / ``python -m embodied.commands.deploy``: the deploy command alone.

    The full ``embodied`` CLI loads every command (training needs torch); this entry point
    loads only the robot-side runtime, for a ROS 2 Python without torch.
    """
    import sys

    from embodied.config import ConfigError
    from embodied.errors import EmbodiedError

    parser = argparse.ArgumentParser(prog="embodied-deploy")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["deploy", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except (ConfigError, EmbodiedError, FileNotFoundError) as err:
        logging.getLogger("embodied").error("%s", err)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
