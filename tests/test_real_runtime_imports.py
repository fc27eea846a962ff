"""The robot-side runtime needs only numpy, onnxruntime, PyYAML, rosbags and a middleware: it
must run in a ROS 2 Python where torch is not installed. Checked by running it in a fresh
interpreter in which importing torch fails."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from real_support import export_policy, quad_robot, quad_spec

BLOCK_TORCH = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked: the deploy runtime must not import it")
        return None
sys.meta_path.insert(0, _NoTorch())
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH + textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )


def test_the_blocker_blocks() -> None:
    result = _run("import torch")
    assert result.returncode != 0 and "torch is blocked" in result.stderr


def test_deploy_runtime_runs_without_torch(tmp_path: Path) -> None:
    export = export_policy(tmp_path / "export", quad_spec(history=2), seed=3)
    result = _run(
        f"""
        import importlib
        for name in [
            "embodied.policy_io", "embodied.real.deploy", "embodied.real.node", "embodied.real.runner",
            "embodied.real.observation", "embodied.real.safety", "embodied.real.freshness",
            "embodied.real.robot_config", "embodied.real.control_loop", "embodied.real.messages",
            "embodied.real.transports.dds", "embodied.real.transports.memory",
            "embodied.real.transports.rclpy_node", "embodied.commands.deploy",
        ]:
            importlib.import_module(name)
        from embodied.real.deploy import build_node
        from embodied.real.transports.memory import MemoryTransport
        from embodied.real import messages
        import time
        transport = MemoryTransport()
        node = build_node(transport, {str(export)!r}, {str(quad_robot())!r})
        publish = transport.publisher("cf/odom", "nav_msgs/msg/Odometry", "sensor")
        for k in range(15):
            ns = time.time_ns()
            publish(messages.make("nav_msgs/msg/Odometry", {{
                "header": {{"frame_id": "world", "stamp": {{"sec": ns // 10**9, "nanosec": ns % 10**9}}}},
                "pose": {{"pose": {{"position": {{"z": 1.0}}, "orientation": {{"w": 1.0}}}}}},
            }}))
            node.step(k * 0.01)
        assert node.state.value == "armed", node.status()
        assert "torch" not in sys.modules
        print("OK", node.commands_sent)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["OK", "15"]


def test_deploy_help_without_torch() -> None:
    result = _run("from embodied.commands.deploy import main; main(['--help'])")
    assert "safe command" in result.stdout, result.stderr
