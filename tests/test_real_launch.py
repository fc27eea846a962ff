"""``policy.launch.py`` through the real ``launch`` / ``launch_ros`` Python packages.

Neither is on PyPI: point ``EMBODIED_LAUNCH_SRC`` at one or more source snapshots (``os.pathsep``
separated), each a folder holding ``launch/`` and ``launch_ros/`` (the repositories' checkouts of
a distro branch, e.g. humble or jazzy) and ``py/`` with ``osrf_pycommon`` and
``ament_index_python``; ``lark`` must be importable (``EMBODIED_LAUNCH_PYDEPS`` may name a
``pip install --target`` folder). Without it these tests are skipped.

What is real: launch's LaunchService, argument handling and process execution, launch_ros's
Node action (parameter evaluation, the parameter file it writes, remappings, namespace) and
ament_index_python's package lookup in a throwaway install prefix. What is not: rclpy. launch_ros
imports rclpy in the launch process too (name validation, parameter and lifecycle types), and
rclpy needs its compiled core, which cannot be built here; a module stub answers those imports
(validation always passes, lifecycle/parameter types are empty). The node process is a stub that
records the command line and parameter files launch_ros hands it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "real" / "ros2" / "embodied_ros2"
SOURCES = [Path(p) for p in os.environ.get("EMBODIED_LAUNCH_SRC", "").split(os.pathsep) if p]

pytestmark = pytest.mark.skipif(
    not SOURCES, reason="EMBODIED_LAUNCH_SRC not set (launch/launch_ros source snapshots; see module docstring)"
)

RCLPY_STUB = """
import importlib.abc, importlib.machinery, sys, types
STUBBED = ("rclpy", "lifecycle_msgs", "composition_interfaces", "rcl_interfaces", "builtin_interfaces")
class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return 0
class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Meta(name, (), {"__init__": lambda self, *a, **k: None})
class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        return _Module(spec.name)
    def exec_module(self, module):
        module.__path__ = []
sys.meta_path.insert(0, _Finder())
import rclpy.validate_namespace, rclpy.validate_node_name
rclpy.validate_namespace.validate_namespace = lambda namespace: True
rclpy.validate_node_name.validate_node_name = lambda name: True
"""

NODE_STUB = """#!{python}
import json, os, sys
args = sys.argv[1:]
files = [args[i + 1] for i, a in enumerate(args) if a == "--params-file"]
with open(os.environ["EMBODIED_LAUNCH_DUMP"], "w") as out:
    json.dump({{"argv": args, "params_files": [open(f).read() for f in files]}}, out)
"""

RUN_LAUNCH = """
import sys
import rclpy_stub
from launch import LaunchDescription, LaunchService
from launch.actions import IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
arguments = dict(a.split(":=", 1) for a in sys.argv[2:])
service = LaunchService()
service.include_launch_description(LaunchDescription([
    IncludeLaunchDescription(PythonLaunchDescriptionSource(sys.argv[1]), launch_arguments=arguments.items())
]))
sys.exit(service.run())
"""


def _prefix(tmp_path: Path, launch_file: Path) -> Path:
    """A colcon-like install prefix with the package's launch file, config and a stub node."""
    prefix = tmp_path / "install"
    (prefix / "share/ament_index/resource_index/packages").mkdir(parents=True)
    (prefix / "share/ament_index/resource_index/packages/embodied_ros2").touch()
    share = prefix / "share/embodied_ros2"
    shutil.copytree(PACKAGE_DIR / "config", share / "config")
    (share / "launch").mkdir()
    shutil.copy(launch_file, share / "launch/policy.launch.py")
    node = prefix / "lib/embodied_ros2/policy_node"
    node.parent.mkdir(parents=True)
    node.write_text(NODE_STUB.format(python=sys.executable))
    node.chmod(0o755)
    return prefix


def _launch(
    tmp_path: Path, source: Path, launch_file: Path, arguments: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    prefix = _prefix(tmp_path, launch_file)
    (tmp_path / "rclpy_stub.py").write_text(RCLPY_STUB)
    path = [tmp_path, source / "launch", source / "launch_ros", source / "py"]
    if os.environ.get("EMBODIED_LAUNCH_PYDEPS"):
        path.append(Path(os.environ["EMBODIED_LAUNCH_PYDEPS"]))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(p) for p in path),
        "AMENT_PREFIX_PATH": str(prefix),
        "EMBODIED_LAUNCH_DUMP": str(tmp_path / "node.json"),
        "ROS_LOG_DIR": str(tmp_path / "log"),
        "HOME": str(tmp_path),
    }
    launch_path = prefix / "share/embodied_ros2/launch/policy.launch.py"
    argv = [f"{k}:={v}" for k, v in arguments.items()]
    return subprocess.run(
        [sys.executable, "-c", RUN_LAUNCH, str(launch_path), *argv], env=env, capture_output=True, text=True, timeout=60
    )


def _node_params(tmp_path: Path) -> dict:
    """The node's parameters as the node process would load them (files in order, later wins)."""
    dump = json.loads((tmp_path / "node.json").read_text())
    merged: dict = {}
    for text in dump["params_files"]:
        for node_params in yaml.safe_load(text).values():
            merged.update(node_params["ros__parameters"])
    return merged


@pytest.fixture(params=SOURCES, ids=[p.name for p in SOURCES])
def source(request: pytest.FixtureRequest) -> Path:
    return Path(request.param)


PARAMS_JSON = '{"setpoint_w":[0.5,0,1.2],"setpoint_yaw_rad":[1.0]}'


def test_launch_passes_params_json_as_a_string(tmp_path: Path, source: Path) -> None:
    result = _launch(
        tmp_path,
        source,
        PACKAGE_DIR / "launch/policy.launch.py",
        {
            "export_dir": "/abs/run/export",
            "params_json": PARAMS_JSON,
            "namespace": "drone1",
            "odom_topic": "mocap/odom",
            "autostart": "false",
        },
    )
    assert result.returncode == 0, result.stdout + result.stderr
    argv = json.loads((tmp_path / "node.json").read_text())["argv"]
    assert "--ros-args" in argv and "__ns:=/drone1" in argv and "__node:=embodied_policy" in argv
    assert "cf/odom:=mocap/odom" in argv
    merged = _node_params(tmp_path)
    assert merged["params_json"] == PARAMS_JSON and isinstance(merged["params_json"], str)
    assert json.loads(merged["params_json"])["setpoint_w"] == [0.5, 0, 1.2]
    assert merged["export_dir"] == "/abs/run/export" and merged["use_sim_time"] is False
    assert merged["status_period_s"] == 5.0  # from config/policy_node.yaml
    assert merged["autostart"] is False  # the launch argument overrides the YAML's true


def test_unwrapped_params_json_fails_in_launch_ros(tmp_path: Path, source: Path) -> None:
    """The check above can fail: without ParameterValue(value_type=str) launch_ros parses the JSON
    object as YAML into a mapping and refuses it, as it does on Humble and Jazzy."""
    fixed = (PACKAGE_DIR / "launch/policy.launch.py").read_text()
    wrapped = 'ParameterValue(LaunchConfiguration("params_json"), value_type=str)'
    assert wrapped in fixed
    broken = tmp_path / "broken.launch.py"
    broken.write_text(fixed.replace(wrapped, 'LaunchConfiguration("params_json")'))
    result = _launch(tmp_path, source, broken, {"export_dir": "/abs/run/export", "params_json": PARAMS_JSON})
    assert "dict" in result.stdout + result.stderr
    assert not (tmp_path / "node.json").exists()


def test_deploy_print_launch_line_is_accepted_by_launch(tmp_path: Path, source: Path) -> None:
    from real_support import export_policy, quad_spec

    from embodied.real.deploy import launch_command

    export = export_policy(tmp_path / "export", quad_spec(history=1))
    line = launch_command(export, "crazyflie_sim", {"setpoint_w": [0, 0, 1.5]})
    words = shlex.split(line)
    assert words[:4] == ["ros2", "launch", "embodied_ros2", "policy.launch.py"]
    arguments = dict(w.split(":=", 1) for w in words[4:])
    result = _launch(tmp_path, source, PACKAGE_DIR / "launch/policy.launch.py", arguments)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(_node_params(tmp_path)["params_json"]) == {"setpoint_w": [0, 0, 1.5]}


@pytest.mark.parametrize("given", [False, True], ids=["defaults", "task-and-device"])
def test_task_and_device_reach_the_node(tmp_path: Path, source: Path, given: bool) -> None:
    """A ``lerobot:`` export's task and torch device, as ``embodied deploy --task/--device --print-launch``
    writes them, arrive as string parameters; without them the node gets "" (the robot config's
    ``task:``) and cpu."""
    from embodied.real.deploy import launch_command

    task, device = ("arm-push", "cuda:1") if given else (None, "cpu")
    line = launch_command(Path("lerobot:/abs/ckpt/act"), "crazyflie_sim", None, task, device)
    arguments = dict(w.split(":=", 1) for w in shlex.split(line)[4:])
    result = _launch(tmp_path, source, PACKAGE_DIR / "launch/policy.launch.py", arguments)
    assert result.returncode == 0, result.stdout + result.stderr
    merged = _node_params(tmp_path)
    assert merged["export_dir"] == "lerobot:/abs/ckpt/act"
    assert (merged["task"], merged["device"]) == (("arm-push", "cuda:1") if given else ("", "cpu"))
