"""The ament_python package real/ros2/embodied_ros2 (colcon cannot run here: check its structure)
and the `embodied deploy` launch-line / missing-rclpy paths."""

from __future__ import annotations

import argparse
import ast
import configparser
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from real_support import export_policy, quad_spec

from embodied.commands import deploy
from embodied.errors import EmbodiedError
from embodied.real.deploy import launch_command
from embodied.real.transports.rclpy_node import rclpy_available

PKG = Path(__file__).resolve().parents[1] / "real" / "ros2" / "embodied_ros2"


def test_package_xml_is_format_3_ament_python() -> None:
    root = ET.parse(PKG / "package.xml").getroot()
    assert root.tag == "package" and root.get("format") == "3"
    assert root.findtext("name") == "embodied_ros2"
    assert root.findtext("export/build_type") == "ament_python"
    deps = {e.text for e in root.findall("exec_depend")}
    assert {"rclpy", "launch", "launch_ros", "std_msgs", "nav_msgs", "sensor_msgs", "diagnostic_msgs"} <= deps
    assert {"rosgraph_msgs", "rcl_interfaces", "lifecycle_msgs"} <= deps  # /clock, parameters, lifecycle
    for tag in ("version", "description", "maintainer", "license"):
        assert (root.findtext(tag) or "").strip(), tag


def test_resource_marker_and_setup_cfg_script_dir() -> None:
    assert (PKG / "resource" / "embodied_ros2").is_file()
    cfg = configparser.ConfigParser()
    cfg.read(PKG / "setup.cfg")
    assert cfg["develop"]["script_dir"] == "$base/lib/embodied_ros2"
    assert cfg["install"]["install_scripts"] == "$base/lib/embodied_ros2"


def _setup_call() -> ast.Call:
    tree = ast.parse((PKG / "setup.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup"]
    assert len(calls) == 1
    return calls[0]


def test_setup_py_installs_launch_config_and_entry_point() -> None:
    call = _setup_call()
    kwargs = {k.arg: k.value for k in call.keywords}
    data_files = ast.unparse(kwargs["data_files"])
    for needle in (
        "share/ament_index/resource_index/packages",
        "resource/{PACKAGE}",
        "share/{PACKAGE}/launch', glob('launch/*.launch.py')",
        "share/{PACKAGE}/config', glob('config/*.yaml')",
        "package.xml",
    ):
        assert needle in data_files, needle
    entry = ast.unparse(kwargs["entry_points"])
    assert "policy_node = {PACKAGE}.policy_node:main" in entry
    assert (PKG / "embodied_ros2" / "policy_node.py").is_file()
    assert list((PKG / "launch").glob("*.launch.py")) and list((PKG / "config").glob("*.yaml"))


def test_launch_file_declares_arguments_and_node() -> None:
    source = (PKG / "launch" / "policy.launch.py").read_text()
    tree = ast.parse(source)
    compile(tree, "policy.launch.py", "exec")
    funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "generate_launch_description" in funcs
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    declared = {
        c.args[0].value
        for c in calls
        if getattr(c.func, "id", "") == "DeclareLaunchArgument" and c.args and isinstance(c.args[0], ast.Constant)
    }
    assert {"export_dir", "robot_config", "params_json", "params_file", "autostart", "task", "device"} <= declared
    (node,) = [c for c in calls if getattr(c.func, "id", "") == "Node"]
    # `autostart:=false`, `task:=...` and `device:=...` must reach the node as parameters, not be
    # dropped by launch
    handed = {k.value for d in ast.walk(node) if isinstance(d, ast.Dict) for k in d.keys if isinstance(k, ast.Constant)}
    assert {"autostart", "task", "device"} <= handed
    kw = {k.arg for k in node.keywords}
    assert {"package", "executable", "parameters", "remappings"} <= kw


def test_parameter_yaml_uses_ros_parameters_and_matches_node() -> None:
    for path in (PKG / "config").glob("*.yaml"):
        data = yaml.safe_load(path.read_text())
        ((node_name, body),) = data.items()
        assert node_name == "embodied_policy"
        params = body["ros__parameters"]
        node_source = (PKG / "embodied_ros2" / "policy_node.py").read_text()
        for key in params:
            assert f'declare_parameter("{key}"' in node_source, key


def test_launch_line_points_at_absolute_export_and_config(tmp_path: Path) -> None:
    export = export_policy(tmp_path / "run" / "export", quad_spec(history=1))
    line = launch_command(tmp_path / "run", "crazyflie_sim", {"setpoint_w": [0, 0, 1]})
    argv = shlex.split(line)
    assert argv[:4] == ["ros2", "launch", "embodied_ros2", "policy.launch.py"]
    args = dict(a.split(":=", 1) for a in argv[4:])
    assert Path(args["export_dir"]) == export.resolve()
    assert args["robot_config"].endswith("real/robots/crazyflie_sim.yaml") and Path(args["robot_config"]).is_absolute()
    assert args["params_json"] == '{"setpoint_w":[0,0,1]}'
    assert "task" not in args and "device" not in args  # the node's defaults: the config's task, cpu


def test_launch_line_carries_task_and_device(tmp_path: Path) -> None:
    """``deploy lerobot:REF --task T --device D --print-launch`` gives the node the same task and device."""
    line = launch_command(Path("lerobot:/ckpt/act"), "crazyflie_sim", None, "arm-push", "cuda:1")
    args = dict(a.split(":=", 1) for a in shlex.split(line)[4:])
    assert args["export_dir"] == "lerobot:/ckpt/act"
    assert args["task"] == "arm-push" and args["device"] == "cuda:1"


def _deploy_args(run_dir: Path, **extra: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    deploy.register(parser.add_subparsers())
    argv = ["deploy", str(run_dir), "--robot", "crazyflie_sim"]
    for key, value in extra.items():
        argv += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return parser.parse_args(argv)


@pytest.mark.skipif(rclpy_available(), reason="rclpy is installed: the fallback path does not apply")
def test_deploy_ros2_without_rclpy_prints_launch_line_and_install_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export_policy(tmp_path / "export", quad_spec(history=1))
    with pytest.raises(EmbodiedError, match=r"rclpy is not importable: install ROS 2"):
        deploy.run(_deploy_args(tmp_path, transport="ros2"))
    assert capsys.readouterr().out.startswith("ros2 launch embodied_ros2 policy.launch.py export_dir:=")


def test_deploy_print_launch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    export_policy(tmp_path / "export", quad_spec(history=1))
    assert deploy.run(_deploy_args(tmp_path, print_launch=True)) == 0
    assert "policy.launch.py" in capsys.readouterr().out
