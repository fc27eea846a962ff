"""``ros2 run embodied_ros2 policy_node``: an embodied policy export as an rclpy node.

All logic is ``embodied.real`` (shared with the Cyclone DDS path of ``embodied deploy``); this
file only reads ROS parameters, creates the node and reports status through the ROS logger.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

NODE_NAME = "embodied_policy"


def main(args: Any = None) -> None:
    import rclpy

    from embodied.real.deploy import build_node
    from embodied.real.transports.rclpy_node import RclpyTransport

    rclpy.init(args=args)
    node = rclpy.create_node(NODE_NAME)
    export_dir = str(node.declare_parameter("export_dir", "").value)
    robot_config = str(node.declare_parameter("robot_config", "crazyflie_sim").value)
    params_json = str(node.declare_parameter("params_json", "").value)
    trigger = str(node.declare_parameter("trigger", "").value)
    status_period_s = float(node.declare_parameter("status_period_s", 5.0).value)
    if not export_dir:
        node.get_logger().fatal("parameter export_dir is required (folder holding policy.onnx + policy_io.json)")
        raise SystemExit(2)
    transport = RclpyTransport(node=node)
    stop = threading.Event()
    try:
        policy = build_node(transport, Path(export_dir), robot_config, json.loads(params_json or "{}"), trigger or None)

        def report() -> None:
            s = policy.status()
            p50, p90, p99 = s["latency_ms"]
            node.get_logger().info(
                f"{s['state']} | {s['rate_hz']:.1f} Hz | latency ms p50 {p50:.3f} p90 {p90:.3f} p99 {p99:.3f} "
                f"| overruns {s['overruns']} | errors {s['errors']}"
            )

        node.create_timer(status_period_s, report)
        policy.run(stop)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        transport.close()
        node.destroy_node()
        if rclpy.ok():
            rclpy.shutdown()


if __name__ == "__main__":
    main()
