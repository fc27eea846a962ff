"""``embodied firmware``: build the Crazyflie controller app, or run the policy on an emulated STM32F405."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "firmware",
        help="cross-compile the Crazyflie app or run the C policy under QEMU",
        description="Build and check the on-board side of an exported quad-hover policy. "
        "`build` cross-compiles the Crazyflie out-of-tree controller app (against a shim of the "
        "firmware interface, or a real crazyflie-firmware checkout with --crazyflie-base) and "
        "prints its flash/RAM use. `emulate` runs the policy self-test and a timed loop of forward "
        "passes on QEMU's netduinoplus2 (STM32F405, the Crazyflie's MCU) and reports instructions "
        "per forward pass and per multiply-accumulate. Both export the C policy first if "
        "RUN_DIR/export/c/ is missing. `build` needs a Crazyflie policy (policy_io.json "
        "extra.vehicle = crazyflie, written by the quadrotor tasks); `emulate` takes any policy.",
    )
    sub = p.add_subparsers(dest="firmware_command", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="cross-compile the Crazyflie app; print flash/RAM use")
    b.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a trained run")
    b.add_argument(
        "--crazyflie-base",
        type=Path,
        default=None,
        metavar="DIR",
        help="a crazyflie-firmware checkout (2025.12 or newer, the first release whose controlModeForce "
        "drives the motors) with submodules: run its real out-of-tree `make` (produces build/cf2.bin); "
        "without it the app is compiled against firmware/shim/",
    )
    b.set_defaults(func=run_build)
    e = sub.add_parser("emulate", help="self-test + instruction count on QEMU (STM32F405)")
    e.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a trained run")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.set_defaults(func=run_emulate)


def ensure_c_export(run_dir: Path) -> Path:
    """``RUN_DIR/export/c``, exported first from the run's policy artifact when it is missing
    or holds other weights."""
    from embodied.export.bundle import c_dir
    from embodied.training.run_policy import ensure_export

    ensure_export(run_dir, "c")
    return c_dir(run_dir)


def run_build(args: argparse.Namespace) -> int:
    from embodied.crazyflie import firmware_build as fb
    from embodied.export.bundle import export_dir

    version = fb.check_crazyflie_tree(args.crazyflie_base) if args.crazyflie_base is not None else ""
    c_out = ensure_c_export(args.run_dir)
    staged = fb.stage_crazyflie_app(c_out, export_dir(args.run_dir) / "crazyflie_app")
    print(f"staged the app in {staged}")
    if args.crazyflie_base is not None:
        print(f"crazyflie-firmware at {args.crazyflie_base} ({version})")
        binary = fb.build_crazyflie_real(staged, args.crazyflie_base)
        elf = binary.with_suffix(".elf")
        if elf.is_file():
            fp = fb.arm_size(elf)
            print(f"firmware image: flash {fp.flash_bytes} B, static RAM {fp.ram_bytes} B")
        print(f"wrote {binary} (flash it with: embodied flash {args.run_dir})")
        return 0
    obj, fp = fb.build_crazyflie_shim(staged, staged / "build_shim")
    print(f"compiled against firmware/shim: {obj}")
    print(
        f"app footprint: flash {fp.flash_bytes} B (text {fp.text} + data {fp.data}), "
        f"RAM {fp.ram_bytes} B (data {fp.data} + bss {fp.bss})"
    )
    return 0


def run_emulate(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from embodied.crazyflie import firmware_build as fb
    from embodied.export.bundle import export_dir

    c_out = ensure_c_export(args.run_dir)
    elf = fb.build_qemu_elf(c_out, export_dir(args.run_dir) / "qemu")
    report = fb.run_qemu(elf)
    out: dict[str, Any] = asdict(report)
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key}: {value:.6g}" if isinstance(value, float) else f"{key}: {value}")
    return 0 if report.selftest_passed else 1
