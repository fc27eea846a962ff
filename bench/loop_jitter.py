"""Control-loop period jitter of the deployment node beside busy processes.

Runs the real :class:`~embodied.real.node.PolicyNode` (in-process transport, an ONNX policy for
the quad-hover interface) on its own wall clock at the policy's rate, with a sensor thread
publishing odometry at the same rate (its callbacks compete for the interpreter as a DDS
listener's do) and ``--busy`` processes spinning (``while True: pass``). Reports the period
jitter ``|start_k - start_(k-1) - period|`` p50/p99/max, the wake-up lateness p99, overruns and
missed deadlines, with the 1-minute load average before and after.

    .venv/bin/python bench/loop_jitter.py [--busy 2] [--seconds 30] [--rt-priority 10] [--plain]

``--plain``: the loop as it was before the scheduling work (no spin before the deadline, no
real-time priority), for a side-by-side ratio on the same machine and load. Timings depend on
the machine and its load: report them with the CPU model and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--busy", type=int, default=2, help="busy-looping processes beside the node (default 2)")
    parser.add_argument("--seconds", type=float, default=30.0, help="measurement length (default 30)")
    parser.add_argument("--rt-priority", type=int, default=10, help="SCHED_FIFO priority, 0 for none (default 10)")
    parser.add_argument("--plain", action="store_true", help="no spin, no real-time priority (the earlier loop)")
    parser.add_argument("--export", type=Path, default=None, help="export folder (default: a random quad policy)")
    args = parser.parse_args()

    from real_support import export_policy, odometry, quad_robot, quad_spec

    from embodied.real.node import PolicyNode
    from embodied.real.realtime import realtime_process
    from embodied.real.robot_config import load_robot
    from embodied.real.runner import PolicyRunner
    from embodied.real.transports.memory import MemoryTransport

    export = args.export or export_policy(Path(tempfile.mkdtemp(prefix="loop_jitter_")), quad_spec(history=2), seed=1)
    # The busy processes first: a child started after the switch to SCHED_FIFO would inherit it.
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    priorities = realtime_process(0 if args.plain else args.rt_priority)  # as `embodied deploy` does
    robot = load_robot(quad_robot())
    transport = MemoryTransport()
    node = PolicyNode(transport, robot, PolicyRunner(export), rt_priority=priorities.loop)
    if args.plain:
        node.loop.spin_s = 0.0
    odom = robot.inputs["odom"]
    sensor = transport.publisher(odom.topic, odom.type, odom.qos)
    stop = threading.Event()

    def feed() -> None:
        while not stop.wait(node.period_s):
            sensor(odometry())

    feeder = threading.Thread(target=feed, daemon=True)
    try:
        time.sleep(1.0)  # the busy loops reach full speed
        load_before = os.getloadavg()[0]
        feeder.start()
        stats = node.run(stop, duration_s=args.seconds)
        load_after = os.getloadavg()[0]
    finally:
        stop.set()
        for p in busy:
            p.kill()
            p.wait()
    jitter = stats.jitter_summary_ms()
    report = {
        "mode": "plain" if args.plain else "tuned",
        "scheduling": stats.scheduling,
        "period_ms": node.period_s * 1e3,
        "busy": args.busy,
        "cpus": os.cpu_count(),
        "steps": stats.steps,
        "jitter_ms": {k: round(v, 3) for k, v in jitter.items()},
        "jitter_p99_pct_of_period": round(100 * jitter["p99"] / (node.period_s * 1e3), 1),
        "overruns": stats.overruns,
        "missed_deadlines": stats.missed_deadlines,
        "commands": node.commands_sent,
        "state": node.state.value,
        "load_1min_before_after": [round(load_before, 2), round(load_after, 2)],
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
