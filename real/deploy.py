"""Wiring shared by ``embodied deploy``, the ROS 2 entry point and tests: export + robot -> node."""

from __future__ import annotations

import importlib
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from embodied.config import ConfigError, unknown_choice_message
from embodied.real.node import PolicyNode
from embodied.real.robot_config import load_robot, resolve_robot_path
from embodied.real.runner import PolicyRunner, resolve_export_dir
from embodied.real.transports import TRANSPORTS, Transport

ROS2_PACKAGE = "embodied_ros2"
LAUNCH_FILE = "policy.launch.py"


def open_transport(name: str, **kwargs: Any) -> Transport:
    """Instantiate transport ``dds`` or ``ros2`` (keyword arguments go to its constructor)."""
    if name not in TRANSPORTS:
        raise ConfigError(unknown_choice_message("transport", name, TRANSPORTS))
    module, _, attr = TRANSPORTS[name].partition(":")
    transport: Transport = getattr(importlib.import_module(module), attr)(**kwargs)
    return transport


def build_node(
    transport: Transport,
    export: Path,
    robot: str | Path,
    params: Mapping[str, Any] | None = None,
    **node_kwargs: Any,
) -> PolicyNode:
    """Load and cross-check the export and the robot config, then subscribe and advertise.

    ``node_kwargs`` go to :class:`PolicyNode` (``stamp_clock``, ``active``).
    """
    runner = PolicyRunner(export)
    robot_cfg = load_robot(robot, params)
    return PolicyNode(transport, robot_cfg, runner, **node_kwargs)


def launch_command(export: Path, robot: str | Path, params: Mapping[str, Any] | None = None) -> str:
    """The ``ros2 launch`` line that runs the same deployment as a ROS 2 node."""
    export_dir = resolve_export_dir(export).resolve()
    robot_path = resolve_robot_path(robot).resolve()
    args = [
        "ros2", "launch", ROS2_PACKAGE, LAUNCH_FILE,
        f"export_dir:={export_dir}", f"robot_config:={robot_path}",
    ]  # fmt: skip
    if params:
        import json

        # Overrides travel as one JSON string parameter (ROS 2 parameters cannot be nested maps).
        args.append(f"params_json:={json.dumps(dict(params), separators=(',', ':'))}")
    return " ".join(shlex.quote(a) for a in args)
