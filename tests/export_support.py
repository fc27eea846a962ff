"""Shared helpers of the export/firmware tests: random quad-hover-shaped policies and their exports."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from embodied.export.policy_io import weights_sha256, write_policy_io
from embodied.io_spec import ActionField, IOSpec, ObsField
from embodied.policies.mlp import ExportedPolicy, mlp

MAX_THRUST_N = 0.1125
"""The command chain of docs/conventions.md: per-motor thrust command T = (a + 1) / 2 * MAX_THRUST_N."""
MIN_THRUST_N = 0.02
HOVER_ACTION = 2.0 * (0.027 * 9.81 / 4.0) / MAX_THRUST_N - 1.0
ENVELOPE = {"pos_err_m": 0.6, "tilt_rad": 1.6, "ang_vel_rad_s": 10.0, "lin_vel_m_s": 3.0}

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="host gcc not installed")
needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None,
    reason="arm-none-eabi-gcc not installed (apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi)",
)
needs_qemu = pytest.mark.skipif(
    shutil.which("qemu-system-arm") is None or shutil.which("arm-none-eabi-gcc") is None,
    reason="qemu-system-arm / arm-none-eabi-gcc not installed (apt-get install qemu-system-arm gcc-arm-none-eabi)",
)


def quad_io_spec(
    history: int = 32, period_s: float = 0.01, obs_scale: float = 1.0, pos_err_integral: bool = False
) -> IOSpec:
    """The quad-hover interface of docs/conventions.md (146 inputs with H = 32; 149 with the
    position-error integral, whose constants go into ``extra`` as the task writes them)."""
    integral = (ObsField("pos_err_int_h", 3, "m*s", "heading"),) if pos_err_integral else ()
    extra: dict[str, object] = {
        "vehicle": "crazyflie",
        "action_history": history,
        "max_thrust_per_motor_n": MAX_THRUST_N,
        "min_thrust_per_motor_n": MIN_THRUST_N,
        "hover_action": HOVER_ACTION,
        "rotor_spin": [-1, 1, -1, 1],
        "envelope": dict(ENVELOPE),
    }
    if pos_err_integral:
        extra |= {"pos_err_int_decay": 0.995, "pos_err_int_limit_ms": 0.5, "pos_err_int_dt_s": period_s}
    return IOSpec(
        obs_fields=(
            ObsField("pos_err_h", 3, "m", "heading", scale=obs_scale),
            ObsField("rot_hb", 9, "", "body->heading"),
            ObsField("lin_vel_h", 3, "m/s", "heading"),
            ObsField("ang_vel_b", 3, "rad/s", "body"),
            *integral,
            ObsField("prev_actions", 4 * history, "", ""),
        ),
        action_fields=(ActionField("motor_thrust", 4, "N", scale=MAX_THRUST_N / 2, offset=MAX_THRUST_N / 2),),
        control_period_s=period_s,
        extra=extra,
    )


def generic_io_spec(obs_dim: int, action_dim: int, period_s: float = 0.02) -> IOSpec:
    return IOSpec(
        obs_fields=(ObsField("state", obs_dim),),
        action_fields=(ActionField("command", action_dim),),
        control_period_s=period_s,
    )


def random_policy(
    obs_dim: int = 146,
    hidden: tuple[int, ...] = (64, 64),
    action_dim: int = 4,
    act: str = "tanh",
    clip: float = 5.0,
    seed: int = 0,
) -> ExportedPolicy:
    """A randomly initialized ExportedPolicy with a non-trivial normalizer."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net: nn.Sequential = mlp(obs_dim, hidden, action_dim, act)
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(1.5)  # wider than default init so hidden units saturate and activations matter
    mean = torch.randn(obs_dim, generator=gen) * 0.2
    std = torch.rand(obs_dim, generator=gen) + 0.3
    return ExportedPolicy(net, mean, std, clip)


def linear_layer(net: nn.Sequential, index: int) -> nn.Linear:
    """Layer ``index`` of an :func:`mlp` network, checked to be a ``Linear`` (so its ``weight``
    and ``bias`` are typed tensors)."""
    layer = net[index]
    assert isinstance(layer, nn.Linear), f"net[{index}] is {type(layer).__name__}, not Linear"
    return layer


def write_io(module: nn.Module, spec: IOSpec, out_dir: Path) -> Path:
    return write_policy_io(out_dir, spec, weights_sha256(module), source_run="tests")


def near_hover_policy(obs_dim: int, hover: float, seed: int = 0, gain: float = 0.05) -> ExportedPolicy:
    """A random policy whose output stays near hover, so it flies a while instead of tumbling
    (``gain`` scales its last layer's weights)."""
    module = random_policy(obs_dim=obs_dim, seed=seed)
    with torch.no_grad():
        last = [m for m in module.modules() if isinstance(m, torch.nn.Linear)][-1]
        last.weight.mul_(gain)
        last.bias.fill_(hover)
    return module
