"""C99 (TinyRL) export: strict host/ARM compiles, parity with torch, self-test, error cases."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from export_support import generic_io_spec, needs_arm, needs_gcc, quad_io_spec, random_policy, write_io
from torch import nn

from embodied.crazyflie.firmware_build import ARM_CFLAGS, STRICT_CFLAGS, build_host_library
from embodied.errors import EmbodiedError
from embodied.export.c_header import generate_c
from embodied.export.host_lib import HostPolicyLib
from embodied.export.layers import mlp_arrays
from embodied.export.onnx import probe_observations
from embodied.io_spec import IOSpec
from embodied.policies.mlp import ExportedPolicy

TOL = 1e-5


def _export(module: nn.Module, spec: IOSpec, out: Path, **kw: Any) -> Path:
    io_path = write_io(module, spec, out)
    generate_c(module, io_path, out / "c", **kw)
    return out / "c"


@pytest.fixture(scope="module")
def quad_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[ExportedPolicy, Path, HostPolicyLib]:
    out = tmp_path_factory.mktemp("quad")
    module = random_policy()
    c_out = _export(module, quad_io_spec(), out)
    return module, c_out, HostPolicyLib(build_host_library(c_out, out / "build"))


@needs_gcc
def test_host_c_matches_torch_146_64_64_4(quad_export: tuple[ExportedPolicy, Path, HostPolicyLib]) -> None:
    module, _, lib = quad_export
    obs = probe_observations(mlp_arrays(module), num=500, seed=7)
    got = lib.policy_step(obs, 4)
    want = module(torch.from_numpy(obs)).numpy()
    assert np.abs(want).max() > 0.5  # the probe reaches saturated outputs, not just ~0
    assert np.max(np.abs(got - want)) <= TOL
    assert lib.selftest()[0]


@needs_gcc
@pytest.mark.parametrize(
    ("act", "dims", "clip"),
    [("elu", (7, (5, 9), 3), float("inf")), ("relu", (13, (6,), 2), 2.0), ("tanh", (3, (1,), 1), 5.0)],
)
def test_host_c_parity_odd_sizes(tmp_path: Path, act: str, dims: tuple[int, tuple[int, ...], int], clip: float) -> None:
    obs_dim, hidden, action_dim = dims
    module = random_policy(obs_dim, hidden, action_dim, act=act, clip=clip, seed=3)
    c_out = _export(module, generic_io_spec(obs_dim, action_dim), tmp_path)
    lib = HostPolicyLib(build_host_library(c_out, tmp_path / "build"))
    obs = probe_observations(mlp_arrays(module), num=300, seed=2)
    got = lib.policy_step(obs, action_dim)
    np.testing.assert_allclose(got, module(torch.from_numpy(obs)).numpy(), atol=TOL, rtol=0)
    assert lib.selftest()[0]


@needs_gcc
def test_fast_tanh_accuracy(tmp_path: Path) -> None:
    """A 1-1 identity layer exposes the C tanh directly; compare with float64 tanh."""
    linear = nn.Linear(1, 1)
    with torch.no_grad():
        linear.weight.fill_(1.0)
        linear.bias.zero_()
    net = nn.Sequential(linear, nn.Tanh())
    module = ExportedPolicy(net, torch.zeros(1), torch.ones(1), float("inf"))
    c_out = _export(module, generic_io_spec(1, 1), tmp_path)
    lib = HostPolicyLib(build_host_library(c_out, tmp_path / "build"))
    x = np.linspace(-12, 12, 20001, dtype=np.float32)[:, None]
    err = np.abs(lib.policy_step(x, 1)[:, 0] - np.tanh(x[:, 0].astype(np.float64)))
    assert err.max() < 1e-6


@needs_gcc
def test_selftest_fails_on_a_wrong_expected_output(tmp_path: Path) -> None:
    module = random_policy(obs_dim=6, hidden=(8,), action_dim=2)
    c_out = _export(module, generic_io_spec(6, 2), tmp_path)
    src = (c_out / "policy.c").read_text()
    # Shift the embedded expected action by 1e-3: far beyond the 1e-5 tolerance.
    pattern = r"(policy_example_action\[POLICY_ACTION_DIM\] = \{\n    )([^,]+)f"
    value = float(re.search(pattern, src).group(2))  # type: ignore[union-attr]
    (c_out / "policy.c").write_text(re.sub(pattern, lambda m: f"{m.group(1)}{value + 1e-3:.9e}f", src))
    lib = HostPolicyLib(build_host_library(c_out, tmp_path / "build"))
    passed, err = lib.selftest()
    assert not passed
    assert err == pytest.approx(1e-3, rel=1e-2)


def test_defines_come_from_policy_io(tmp_path: Path) -> None:
    module = random_policy()
    c_out = _export(module, quad_io_spec(history=32, period_s=0.002, obs_scale=0.5), tmp_path)
    header = (c_out / "policy.h").read_text()
    assert "#define POLICY_OBS_DIM 146" in header
    assert "#define POLICY_CONTROL_PERIOD_US 2000" in header
    assert "#define POLICY_ACTION_HISTORY 32" in header
    assert "#define POLICY_OBS_PREV_ACTIONS_START 18" in header
    assert "#define POLICY_OBS_POS_ERR_H_SCALE 5.000000000e-01f" in header
    assert "#define POLICY_NUM_MACS 13696" in header
    source = (c_out / "policy.c").read_text()
    assert "malloc" not in source
    assert re.search(r"static const float policy_w0\[9344\]", source)


def test_pos_err_integral_defines_come_from_policy_io(tmp_path: Path) -> None:
    module = random_policy(obs_dim=149)
    c_out = _export(module, quad_io_spec(history=32, period_s=0.002, pos_err_integral=True), tmp_path)
    header = (c_out / "policy.h").read_text().splitlines()
    for define in (
        "OBS_DIM 149",
        "OBS_POS_ERR_INT_H_START 18",  # right after ang_vel_b, before the history
        "OBS_POS_ERR_INT_H_SIZE 3",
        "OBS_PREV_ACTIONS_START 21",
        "POS_ERR_INT_DECAY 9.950000048e-01f",  # the integral's constants, from policy_io extra
        "POS_ERR_INT_LIMIT_MS 5.000000000e-01f",
        "POS_ERR_INT_DT_S 2.000000095e-03f",
    ):
        assert f"#define POLICY_{define}" in header, define


def test_envelope_and_thrust_extras_become_defines(tmp_path: Path) -> None:
    """The command-chain and flight-envelope constants of docs/conventions.md reach policy.h: numbers, and one level of dicts (``envelope``)."""
    module = random_policy()
    c_out = _export(module, quad_io_spec(history=32), tmp_path)
    header = (c_out / "policy.h").read_text().splitlines()
    for define in (
        "ENVELOPE_POS_ERR_M 6.000000238e-01f",
        "ENVELOPE_TILT_RAD 1.600000024e+00f",
        "ENVELOPE_ANG_VEL_RAD_S 1.000000000e+01f",
        "ENVELOPE_LIN_VEL_M_S 3.000000000e+00f",
        "MAX_THRUST_PER_MOTOR_N 1.124999970e-01f",
        "MIN_THRUST_PER_MOTOR_N 1.999999955e-02f",
        "ACTION_MOTOR_THRUST_SCALE 5.624999851e-02f",
    ):
        assert f"#define POLICY_{define}" in header, define
    assert not any("ROTOR_SPIN" in line for line in header)  # lists stay in policy_io.json


@needs_gcc
def test_strict_compile_flags_are_applied(tmp_path: Path) -> None:
    """The build fails on warnings: a double-promotion slipped into the source must not compile."""
    module = random_policy(obs_dim=4, hidden=(4,), action_dim=2)
    c_out = _export(module, generic_io_spec(4, 2), tmp_path)
    src = (c_out / "policy.c").read_text()
    (c_out / "policy.c").write_text(
        src.replace("return policy_last_selftest_error;", "return policy_last_selftest_error * 0.5;")
    )
    with pytest.raises(EmbodiedError, match="double-promotion"):
        build_host_library(c_out, tmp_path / "build")


@needs_arm
def test_arm_cross_compile_strict(quad_export: tuple[ExportedPolicy, Path, HostPolicyLib], tmp_path: Path) -> None:
    _, c_out, _ = quad_export
    obj = tmp_path / "policy.o"
    cmd = ["arm-none-eabi-gcc", *ARM_CFLAGS, *STRICT_CFLAGS, "-c", str(c_out / "policy.c"), "-o", str(obj)]
    subprocess.run(cmd, check=True, capture_output=True)
    dis = subprocess.run(["arm-none-eabi-objdump", "-d", str(obj)], check=True, capture_output=True, text=True)
    assert "vfma.f32" in dis.stdout and "vldmia" in dis.stdout  # the Cortex-M4F kernel was used


def test_hash_mismatch_between_policy_io_and_module(tmp_path: Path) -> None:
    module = random_policy(obs_dim=6, hidden=(8,), action_dim=2)
    io_path = write_io(module, generic_io_spec(6, 2), tmp_path)
    with pytest.raises(EmbodiedError, match="model_sha256"):
        generate_c(random_policy(obs_dim=6, hidden=(8,), action_dim=2, seed=9), io_path, tmp_path / "c")


def test_bad_field_name_for_c(tmp_path: Path) -> None:
    module = random_policy(obs_dim=6, hidden=(8,), action_dim=2)
    spec = generic_io_spec(6, 2)
    bad = type(spec)(
        obs_fields=(type(spec.obs_fields[0])("3d", 6),), action_fields=spec.action_fields, control_period_s=0.01
    )
    io_path = write_io(module, bad, tmp_path)
    with pytest.raises(EmbodiedError, match="'3d' cannot become a C macro"):
        generate_c(module, io_path, tmp_path / "c")


@needs_gcc
def test_export_module_writes_every_format_with_parity(tmp_path: Path) -> None:
    from embodied.export.bundle import export_module
    from embodied.export.policy_io import read_policy_io

    module = random_policy()
    recorded = np.random.default_rng(5).normal(size=(40, 146)).astype(np.float32)
    report = export_module(module, quad_io_spec(), tmp_path, "all", recorded, source_run="unit-test")
    names = sorted(p.relative_to(tmp_path).as_posix() for p in report.written)
    assert names == ["c/policy.c", "c/policy.h", "policy.onnx", "policy_io.json"]
    assert report.onnx_max_abs_err is not None and report.onnx_max_abs_err <= TOL
    assert report.c_max_abs_err is not None and report.c_max_abs_err <= TOL
    assert report.c_fast_tanh is True
    assert read_policy_io(tmp_path).source_run == "unit-test"
    with pytest.raises(EmbodiedError, match="unknown export format"):
        export_module(module, quad_io_spec(), tmp_path, "tflite")
