"""Benchmark the generated C policy: QEMU instructions per MAC, host latency, parity.

Builds a random 146 -> 64 -> 64 -> 4 tanh policy with the quad-hover interface (action history
32, the L2F actor size), generates policy.h/.c, and prints one JSON object:

    .venv/bin/python scripts/bench_tinyrl.py [--hidden 64,64] [--history 32]

QEMU's ``-icount`` count is deterministic, so one run is the measurement; the host latency is
the median of several timed batches.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from embodied.crazyflie import firmware_build as fb
from embodied.export.c_header import generate_c
from embodied.export.host_lib import HostPolicyLib
from embodied.export.layers import mlp_arrays
from embodied.export.onnx import probe_observations
from embodied.export.policy_io import weights_sha256, write_policy_io
from embodied.io_spec import ActionField, IOSpec, ObsField
from embodied.policies.mlp import ExportedPolicy, mlp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", default="64,64", help="hidden widths (default: 64,64)")
    parser.add_argument("--history", type=int, default=32, help="action history H (obs dim 18 + 4H)")
    args = parser.parse_args()
    hidden = tuple(int(h) for h in args.hidden.split(","))
    torch.manual_seed(0)
    obs_dim = 18 + 4 * args.history
    module = ExportedPolicy(mlp(obs_dim, hidden, 4, "tanh"), torch.randn(obs_dim) * 0.1, torch.rand(obs_dim) + 0.5, 5.0)
    spec = IOSpec(
        (
            ObsField("pos_err_w", 3),
            ObsField("rot_wb", 9),
            ObsField("lin_vel_w", 3),
            ObsField("ang_vel_b", 3),
            ObsField("prev_actions", 4 * args.history),
        ),
        (ActionField("motor_rpm", 4),),
        0.01,
        extra={"vehicle": "crazyflie", "action_history": args.history},
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        generate_c(module, write_policy_io(out, spec, weights_sha256(module)), out / "c")
        qemu = fb.run_qemu(fb.build_qemu_elf(out / "c", out / "qemu"))
        lib = HostPolicyLib(fb.build_host_library(out / "c", out / "host"))
        staged = fb.stage_crazyflie_app(out / "c", out / "app")
        _, footprint = fb.build_crazyflie_shim(staged, out / "app_build")
        obs = probe_observations(mlp_arrays(module), num=1000)
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            got = lib.policy_step(obs, 4)
            times.append((time.perf_counter() - t0) / len(obs))
        parity = float(np.max(np.abs(got - module(torch.from_numpy(obs)).numpy())))
    print(
        json.dumps(
            {
                "architecture": f"{obs_dim}->{'->'.join(map(str, hidden))}->4",
                "num_macs": qemu.num_macs,
                "qemu_selftest_passed": qemu.selftest_passed,
                "qemu_instructions_per_forward": round(qemu.instructions_per_forward),
                "qemu_instructions_per_mac": round(qemu.instructions_per_mac, 3),
                "qemu_instructions_per_control_step": round(qemu.instructions_per_control_step or 0),
                "host_us_per_forward_median": round(statistics.median(times) * 1e6, 3),
                "host_parity_max_abs_err": parity,
                "app_flash_bytes": footprint.flash_bytes,
                "app_ram_bytes": footprint.ram_bytes,
            }
        )
    )


if __name__ == "__main__":
    main()
