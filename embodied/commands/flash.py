"""``embodied flash``: build the Crazyflie firmware with a run's policy and flash it over the radio."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "flash",
        help="build the Crazyflie firmware with the policy and flash it (cfloader)",
        description="Stage the out-of-tree controller app with RUN_DIR's exported policy, build it "
        "against a crazyflie-firmware checkout, and flash build/cf2.bin with "
        "`python3 -m cfloader flash cf2.bin stm32-fw -w URI` (cfloader ships with cfclient: "
        "pip install cfclient). Needs a Crazyradio plugged in.",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a trained run")
    p.add_argument("--uri", default="radio://0/80/2M", help="Crazyflie radio URI (default: radio://0/80/2M)")
    p.add_argument(
        "--crazyflie-base",
        type=Path,
        default=Path(os.environ["CRAZYFLIE_BASE"]) if os.environ.get("CRAZYFLIE_BASE") else None,
        metavar="DIR",
        help="crazyflie-firmware checkout with submodules (default: $CRAZYFLIE_BASE)",
    )
    p.add_argument("--python", default="python3", help="interpreter that has cfloader (default: python3)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import shutil
    import subprocess

    from embodied.commands.firmware import ensure_c_export
    from embodied.errors import EmbodiedError
    from embodied.export import firmware_build as fb
    from embodied.export.bundle import export_dir

    if args.crazyflie_base is None:
        raise EmbodiedError(
            "no crazyflie-firmware tree: pass --crazyflie-base DIR or set CRAZYFLIE_BASE (git clone --recursive "
            "https://github.com/bitcraze/crazyflie-firmware)"
        )
    python = shutil.which(args.python)
    if python is None:
        raise EmbodiedError(f"{args.python} not found on PATH (--python)")
    probe = subprocess.run([python, "-c", "import cfloader"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        raise EmbodiedError(
            f"cfloader is not importable by {python}: install cfclient there (pip install cfclient), "
            "or pass --python with an interpreter that has it"
        )
    fb.check_crazyflie_tree(args.crazyflie_base)
    c_out = ensure_c_export(args.run_dir)
    staged = fb.stage_crazyflie_app(c_out, export_dir(args.run_dir) / "crazyflie_app")
    binary = fb.build_crazyflie_real(staged, args.crazyflie_base)
    print(f"built {binary}; flashing {args.uri} (put the Crazyflie in bootloader mode if asked)")
    proc = subprocess.run(
        [python, "-m", "cfloader", "flash", str(binary), "stm32-fw", "-w", args.uri],
        capture_output=True,
        text=True,
        check=False,
    )
    print(proc.stdout, end="")
    if proc.returncode != 0:
        text = (proc.stderr + proc.stdout).lower()
        if "no crazyradio" in text or "cannot find a crazyradio" in text or "usb" in text:
            raise EmbodiedError(
                f"cfloader found no Crazyradio dongle (plug one in; check udev permissions):\n{proc.stderr}"
            )
        raise EmbodiedError(f"cfloader failed with exit code {proc.returncode}:\n{proc.stderr.strip()}")
    print("flashed; the app logs under the `embodied` log group and enables with param embodied.enable")
    return 0
