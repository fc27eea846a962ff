"""Wiring shared by ``embodied deploy``, the ROS 2 entry point and tests: policy + robot -> node.

The policy is an ONNX export (run on numpy/onnxruntime, torch-free) or a LeRobot policy (run on
torch by :mod:`embodied.real.torch_runner`, imported only then); :func:`open_runner` picks.
"""

from __future__ import annotations

import importlib
import logging
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from embodied.config import ConfigError, unknown_choice_message
from embodied.lerobot_source import is_lerobot_source
from embodied.policy_io import ONNX_FILENAME
from embodied.real.node import PolicyNode
from embodied.real.robot_config import RobotConfig, load_robot, resolve_robot_path
from embodied.real.runner import DeployRunner, PolicyRunner, resolve_export_dir
from embodied.real.transports import TRANSPORTS, Transport

log = logging.getLogger(__name__)

ROS2_PACKAGE = "embodied_ros2"
LAUNCH_FILE = "policy.launch.py"
RUN_CONFIG_FILE = "config.yaml"
"""A run directory's resolved config (:mod:`embodied.training.run`; read here without torch)."""


def open_transport(name: str, **kwargs: Any) -> Transport:
    """Instantiate transport ``dds`` or ``ros2`` (keyword arguments go to its constructor)."""
    if name not in TRANSPORTS:
        raise ConfigError(unknown_choice_message("transport", name, TRANSPORTS))
    module, _, attr = TRANSPORTS[name].partition(":")
    transport: Transport = getattr(importlib.import_module(module), attr)(**kwargs)
    return transport


def needs_torch(source: str | Path) -> str:
    """Why ``source`` runs on torch (:class:`~embodied.real.torch_runner.TorchPolicyRunner`), or
    "" when it is an ONNX export the torch-free :class:`PolicyRunner` runs. Decided from names and
    files alone, without importing torch."""
    if is_lerobot_source(source):
        return "a LeRobot checkpoint runs on LeRobot's own torch code"
    path = Path(source)
    if (path / "export" / ONNX_FILENAME).is_file() or (path / ONNX_FILENAME).is_file() or path.is_file():
        return ""
    config = path / RUN_CONFIG_FILE
    if config.is_file():
        try:
            base = ((yaml.safe_load(config.read_text()) or {}).get("trainer") or {}).get("base_run")
        except (OSError, yaml.YAMLError, AttributeError):
            return ""  # PolicyRunner names what is missing
        if isinstance(base, str) and is_lerobot_source(base):
            return f"run {path} acts through its LeRobot base ({base}) and has no {ONNX_FILENAME}"
    return ""


def open_runner(source: str | Path, robot: RobotConfig, task: str | None = None, device: str = "cpu") -> DeployRunner:
    """The runner for ``source`` on ``robot``: numpy/onnxruntime for an ONNX export (no torch
    imported), torch for a LeRobot policy (:func:`needs_torch`); logs which one and why."""
    reason = needs_torch(source)
    if not reason:
        if task is not None:
            raise ConfigError(f"--task {task}: only for lerobot:REF; an export deploys on the task it was trained on")
        runner = PolicyRunner(Path(source))
        log.info("policy runner: %s (an ONNX export, torch-free)", runner.engine)
        return runner
    from embodied.real.torch_runner import TorchPolicyRunner  # imports torch: only now

    log.info("policy runner: torch (%s)", reason)
    return TorchPolicyRunner(source, robot, task, device)


def build_node(
    transport: Transport,
    export: str | Path,
    robot: str | Path,
    params: Mapping[str, Any] | None = None,
    task: str | None = None,
    device: str = "cpu",
    runner: DeployRunner | None = None,
    **node_kwargs: Any,
) -> PolicyNode:
    """Load and cross-check the policy (an export, or a LeRobot policy: :func:`open_runner`) and the
    robot config, then subscribe and advertise. ``runner``: one already opened for ``export``.

    ``node_kwargs`` go to :class:`PolicyNode` (``stamp_clock``, ``active``).
    """
    robot_cfg = load_robot(robot, params)
    if runner is None:
        runner = open_runner(export, robot_cfg, task, device)
    return PolicyNode(transport, robot_cfg, runner, **node_kwargs)


def launch_command(
    export: Path,
    robot: str | Path,
    params: Mapping[str, Any] | None = None,
    task: str | None = None,
    device: str = "cpu",
) -> str:
    """The ``ros2 launch`` line that runs the same deployment as a ROS 2 node (``task`` and
    ``device`` as ``embodied deploy --task/--device`` take them, for a LeRobot policy)."""
    if is_lerobot_source(export):
        export_dir: str | Path = export
    else:  # a run on a LeRobot base (no export) is passed as the run directory itself
        export_dir = Path(export).resolve() if needs_torch(export) else resolve_export_dir(export).resolve()
    robot_path = resolve_robot_path(robot).resolve()
    args = [
        "ros2", "launch", ROS2_PACKAGE, LAUNCH_FILE,
        f"export_dir:={export_dir}", f"robot_config:={robot_path}",
    ]  # fmt: skip
    if params:
        import json

        # Overrides travel as one JSON string parameter (ROS 2 parameters cannot be nested maps).
        args.append(f"params_json:={json.dumps(dict(params), separators=(',', ':'))}")
    if task:
        args.append(f"task:={task}")
    if device != "cpu":
        args.append(f"device:={device}")
    return " ".join(shlex.quote(a) for a in args)
