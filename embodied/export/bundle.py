"""Export a trained run: ``RUN_DIR/export/`` with policy_io.json, policy.onnx and the C99 policy.

Layout written here (and read by ``firmware``, ``flash``, ``eval --policy onnx|c``)::

    RUN_DIR/export/policy_io.json    interface + model hash (always)
    RUN_DIR/export/policy.onnx       --format onnx|all
    RUN_DIR/export/c/policy.{h,c}    --format c|all
    RUN_DIR/export/host/libembodied_policy.so   host build of the C, parity-checked
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from embodied.errors import EmbodiedError
from embodied.export.c_header import generate_c
from embodied.export.layers import mlp_arrays, with_io_symmetry
from embodied.export.onnx import PARITY_TOL, export_onnx, probe_observations, symmetry_twin
from embodied.export.policy_io import weights_sha256, write_policy_io
from embodied.io_spec import IOSpec

log = logging.getLogger(__name__)

FORMATS = ("onnx", "c", "all")
RECORD_ENVS = 16
RECORD_STEPS = 100


def export_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "export"


def c_dir(run_dir: Path) -> Path:
    return export_dir(run_dir) / "c"


def host_dir(run_dir: Path) -> Path:
    return export_dir(run_dir) / "host"


@dataclass
class ExportReport:
    """Files written and measured parities (max |error| against torch)."""

    written: list[Path] = field(default_factory=list)
    onnx_max_abs_err: float | None = None
    c_max_abs_err: float | None = None
    c_fast_tanh: bool | None = None
    num_macs: int = 0
    model_sha256: str = ""


@torch.inference_mode()
def record_observations(
    policy: Any, make_env: Any, num_envs: int = RECORD_ENVS, steps: int = RECORD_STEPS
) -> np.ndarray:
    """``[num_envs * steps, obs_dim]`` policy observations visited by the deterministic policy."""
    env = make_env(num_envs, 0)
    try:
        obs = env.reset(seed=0)
        rows = []
        for _ in range(steps):
            rows.append(obs["policy"].detach().cpu().float().numpy())
            obs, *_ = env.step(policy.act(obs, deterministic=True))
    finally:
        env.close()
    return np.concatenate(rows)


def check_host_parity(module: nn.Module, c_out: Path, build_dir: Path, observations: np.ndarray) -> float:
    """Build the host library from ``c_out`` and return max ``|C - torch|`` over ``observations``."""
    from embodied.export.firmware_build import build_host_library
    from embodied.export.host_lib import HostPolicyLib

    lib = HostPolicyLib(build_host_library(c_out, build_dir))
    ok, err = lib.selftest()
    if not ok:
        raise EmbodiedError(f"{c_out}: policy_selftest failed on the host (max err {err:.3g})")
    obs = np.ascontiguousarray(observations, dtype=np.float32)
    with torch.no_grad():
        want = module(torch.from_numpy(obs)).numpy()
    got = lib.policy_step(obs, want.shape[1])
    return float(np.max(np.abs(got - want)))


def export_module(
    module: nn.Module,
    io_spec: IOSpec,
    out_dir: Path,
    fmt: str,
    recorded_obs: np.ndarray | None = None,
    source_run: str = "",
) -> ExportReport:
    """Export ``module`` into ``out_dir`` (``policy_io.json`` always, then ONNX and/or C)."""
    if fmt not in FORMATS:
        raise EmbodiedError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    module = with_io_symmetry(module, io_spec)  # the task's symmetry travels inside the export
    arrays = mlp_arrays(module)  # validates the architecture before anything is written
    out_dir = Path(out_dir)
    report = ExportReport(model_sha256=weights_sha256(module), num_macs=arrays.num_macs)
    report.written.append(write_policy_io(out_dir, io_spec, report.model_sha256, source_run))
    checks = [probe_observations(arrays)]
    if recorded_obs is not None and len(recorded_obs):
        checks.append(np.asarray(recorded_obs, dtype=np.float32))
        if arrays.symmetry is not None:  # a task's observations are canonical: check the mirror images too
            checks.append(symmetry_twin(arrays, checks[-1]))
    observations = np.concatenate(checks)
    if fmt in ("onnx", "all"):
        onnx_report = export_onnx(module, io_spec, out_dir, recorded_obs)
        report.written.append(onnx_report.path)
        report.onnx_max_abs_err = onnx_report.max_abs_err
    if fmt in ("c", "all"):
        example = recorded_obs[len(recorded_obs) // 2] if recorded_obs is not None and len(recorded_obs) else None
        c_out = out_dir / "c"
        build = out_dir / "host"
        if shutil.which("gcc") is None:
            generate_c(module, out_dir / "policy_io.json", c_out, example, fast_tanh=True)
            log.warning("gcc not found: the C export was written but its parity was not checked")
        else:
            for fast in (True, False):
                if build.exists():
                    shutil.rmtree(build)
                generate_c(module, out_dir / "policy_io.json", c_out, example, fast_tanh=fast)
                # A fresh folder per attempt: ctypes cannot reload a library path it already opened.
                err = check_host_parity(module, c_out, build / ("fast" if fast else "libm"), observations)
                report.c_max_abs_err, report.c_fast_tanh = err, fast
                if err <= PARITY_TOL:
                    break
                log.warning("fast tanh misses parity (%.2e); regenerating with tanhf", err)
            if report.c_max_abs_err is None or report.c_max_abs_err > PARITY_TOL:
                raise EmbodiedError(
                    f"{c_out}: C policy differs from torch by {report.c_max_abs_err:.3g} (> {PARITY_TOL:g})"
                )
        report.written += [c_out / "policy.h", c_out / "policy.c"]
    return report


def export_run(run_dir: Path, fmt: str = "all", record: bool = True) -> ExportReport:
    """Load ``run_dir``'s checkpoint and export it to ``RUN_DIR/export/``."""
    from embodied.run import load_run

    run = load_run(run_dir)
    module = run.policy.export_module()
    recorded = None
    if record:
        recorded = record_observations(run.policy, lambda n, seed: run.make_env(n, seed))
    return export_module(
        module, run.io_spec, export_dir(run_dir), fmt, recorded, source_run=str(Path(run_dir).resolve())
    )
