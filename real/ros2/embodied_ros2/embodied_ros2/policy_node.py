"""``ros2 run embodied_ros2 policy_node``: an embodied policy export as a managed (lifecycle) node.

All control logic is ``embodied.real`` (shared with the Cyclone DDS path of ``embodied deploy``);
this file maps the ROS 2 lifecycle and parameters onto it:

- ``configure``: load the export and robot config, subscribe and advertise, start the control
  loop (it sends the safe command while inactive).
- ``activate``: the policy may drive once inputs are fresh and the re-arm rule is met.
- ``deactivate``: safe command at once, and every period until activated again.
- ``cleanup`` / ``shutdown`` / errors / SIGINT: the loop stops and sends the safe command last.
- parameter ``params_json`` (robot params, e.g. the setpoint) changes live: safe command, then
  re-arm; ``export_dir`` / ``robot_config`` / ``task`` / ``device`` need cleanup + configure.
- ``task`` / ``device`` (a ``lerobot:`` export): the embodied task the checkpoint was trained on
  (default: the robot config's ``task:``) and where torch runs it, as ``embodied deploy --task/--device``.
- ``autostart`` (default true): configure and activate on start, as a plain node would run.
- ros2_control robots: ``configure`` reads the controller's ``joints`` parameter
  (``command.controller``) and fails when it differs from the robot config's ``command.joints``.

Header stamps are judged against the node's ROS clock, so ``use_sim_time:=true`` compares them
with ``/clock``; the control loop itself runs on the monotonic clock at the policy's rate.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

NODE_NAME = "embodied_policy"

RELOAD_PARAMETERS = ("export_dir", "robot_config", "task", "device")
"""Parameters read when the policy is loaded (``configure``): they change only after cleanup."""


def _policy_node_class(base: Any, ok: Any, failure: Any) -> Any:
    """The node class on ``base`` (rclpy's lifecycle ``Node``); ``ok``/``failure`` are its
    ``TransitionCallbackReturn`` values."""

    class EmbodiedPolicyNode(base):
        def __init__(self) -> None:
            super().__init__(NODE_NAME)
            self.declare_parameter("export_dir", "")
            self.declare_parameter("robot_config", "crazyflie_sim")
            self.declare_parameter("params_json", "")
            self.declare_parameter("task", "")
            self.declare_parameter("device", "cpu")
            self.declare_parameter("status_period_s", 5.0)
            self.declare_parameter("autostart", True)
            self.policy: Any = None
            self._transport: Any = None
            self._stop = threading.Event()
            self._worker: threading.Thread | None = None
            self.add_on_set_parameters_callback(self._on_parameters)

        def _param(self, name: str) -> Any:
            return self.get_parameter(name).value

        def _ros_time_s(self) -> float:
            return float(self.get_clock().now().nanoseconds) * 1e-9

        # -- lifecycle transitions ------------------------------------------------------------
        def on_configure(self, state: Any) -> Any:
            from embodied.real.deploy import build_node
            from embodied.real.transports.rclpy_node import RclpyTransport

            export_dir = str(self._param("export_dir"))
            if not export_dir:
                self.get_logger().error(
                    "parameter export_dir is required (folder with policy.onnx + policy_io.json, or lerobot:PATH)"
                )
                return failure
            try:
                params = json.loads(str(self._param("params_json")) or "{}")
                self._transport = RclpyTransport(node=self, spin=False)
                self.policy = build_node(
                    self._transport,
                    Path(export_dir),
                    str(self._param("robot_config")),
                    params,
                    task=str(self._param("task")) or None,
                    device=str(self._param("device")),
                    stamp_clock=self._ros_time_s,
                    active=False,
                )
            except Exception as err:  # the error names file and key; the node stays unconfigured
                self.get_logger().error(f"configure failed: {err}")
                return failure
            mismatch = self._controller_joint_mismatch()
            if mismatch:
                self.get_logger().error(f"configure failed: {mismatch}")
                self.policy.shutdown("configure failed")
                self.policy = None
                return failure
            self._stop.clear()
            self._worker = threading.Thread(
                target=self.policy.run, args=(self._stop,), name="control-loop", daemon=True
            )
            self._worker.start()
            self.create_timer(float(self._param("status_period_s")), self._report)
            return ok

        def _controller_joint_mismatch(self, timeout_s: float = 2.0) -> str:
            """Compare ``command.joints`` with the ros2_control controller's ``joints`` parameter
            (``command.controller``); '' when they match or the parameter cannot be read."""
            import time

            cmd = self.policy.robot.command
            if not (cmd.joints and cmd.controller):
                return ""
            from rcl_interfaces.srv import GetParameters

            client = self.create_client(GetParameters, f"{cmd.controller}/get_parameters")
            future = (
                client.call_async(GetParameters.Request(names=["joints"]))
                if client.wait_for_service(timeout_sec=timeout_s)
                else None
            )
            deadline = time.monotonic() + timeout_s
            while future is not None and not future.done() and time.monotonic() < deadline:
                time.sleep(0.01)  # the executor spins this node on another thread
            if future is None or not future.done() or future.result() is None:
                self.get_logger().warning(
                    f"cannot read {cmd.controller}'s joints parameter: command joint order not checked"
                )
                return ""
            values = future.result().values
            joints = tuple(values[0].string_array_value) if values else ()
            if joints and joints != cmd.joints:
                return (
                    f"controller {cmd.controller} commands joints {list(joints)} but the robot config's "
                    f"command.joints is {list(cmd.joints)}"
                )
            return ""

        def on_activate(self, state: Any) -> Any:
            self.policy.activate()
            return super().on_activate(state)

        def on_deactivate(self, state: Any) -> Any:
            self.policy.deactivate("lifecycle deactivate")
            return super().on_deactivate(state)

        def _stop_loop(self, reason: str) -> None:
            if self.policy is not None:
                self._stop.set()
                if self._worker is not None:
                    self._worker.join(timeout=2.0)
                self.policy.shutdown(reason)  # no-op when the loop's exit already sent it
            self.policy = None

        def on_cleanup(self, state: Any) -> Any:
            self._stop_loop("lifecycle cleanup")
            return ok

        def on_shutdown(self, state: Any) -> Any:
            self._stop_loop("lifecycle shutdown")
            return ok

        def on_error(self, state: Any) -> Any:
            self._stop_loop("lifecycle error")
            return ok

        # -- parameters and status -------------------------------------------------------------
        def _on_parameters(self, parameters: list[Any]) -> Any:
            from rcl_interfaces.msg import SetParametersResult

            for p in parameters:
                if p.name in RELOAD_PARAMETERS and self.policy is not None:
                    return SetParametersResult(successful=False, reason=f"{p.name}: deactivate, cleanup, configure")
                if p.name == "params_json" and self.policy is not None:
                    try:
                        self.policy.set_params(json.loads(str(p.value) or "{}"))
                    except Exception as err:
                        return SetParametersResult(successful=False, reason=f"params_json: {err}")
            return SetParametersResult(successful=True)

        def _report(self) -> None:
            if self.policy is None:
                return
            s = self.policy.status()
            p50, p90, p99 = s["latency_ms"]
            self.get_logger().info(
                f"{s['state']} | {s['rate_hz']:.1f} Hz | jitter ms p99 {s['jitter_ms'][2]:.3f} | latency ms "
                f"p50 {p50:.3f} p90 {p90:.3f} p99 {p99:.3f} | overruns {s['overruns']} | errors {s['errors']}"
            )

    return EmbodiedPolicyNode


def main(args: Any = None) -> None:
    import rclpy
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.lifecycle import Node as LifecycleNode
    from rclpy.lifecycle import TransitionCallbackReturn

    rclpy.init(args=args)
    node = _policy_node_class(LifecycleNode, TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE)()
    executor = MultiThreadedExecutor()
    executor.add_node(node)
    # Spin first: configure waits on a service reply (the controller's joint order).
    spinner = threading.Thread(target=executor.spin, name="rclpy-spin", daemon=True)
    spinner.start()
    try:
        if node.get_parameter("autostart").value:
            node.trigger_configure()
            node.trigger_activate()
        while spinner.is_alive():
            spinner.join(timeout=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        node._stop_loop("interrupted")
        if node._transport is not None:  # the final safe command acknowledged (bounded) before the node goes
            node._transport.close()
        executor.shutdown()
        node.destroy_node()
        if rclpy.ok():
            rclpy.shutdown()


if __name__ == "__main__":
    main()
