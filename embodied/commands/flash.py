"""``embodied flash``: build the Crazyflie firmware with a run's policy, flash it over the radio, optionally arm it."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from embodied.errors import EmbodiedError

ARM_PARAM = "embodied.enable"
ARM_SCRIPT = """
import sys
import cflib.crtp
from cflib.crazyflie import Crazyflie
from cflib.crazyflie.syncCrazyflie import SyncCrazyflie

cflib.crtp.init_drivers()
with SyncCrazyflie(sys.argv[1], cf=Crazyflie(rw_cache=None)) as scf:
    scf.cf.param.set_value(sys.argv[2], "1")
print("set", sys.argv[2], "= 1 on", sys.argv[1])
"""
"""Run with the ``--python`` interpreter (it needs cflib, which cfclient installs): URI, parameter."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "flash",
        help="build the Crazyflie firmware with the policy and flash it (cfloader)",
        description="Stage the out-of-tree controller app with RUN_DIR's exported policy, build it "
        "against a crazyflie-firmware checkout (2025.12 or newer), and flash build/cf2.bin with "
        "`python3 -m cfloader flash cf2.bin stm32-fw -w URI` (cfloader ships with cfclient: "
        "pip install cfclient). Needs a Crazyradio plugged in. Refuses a run whose "
        "RUN_DIR/verify.json is missing or failed (run `embodied verify RUN_DIR`) unless --force. "
        f"The policy stays disarmed after flashing ({ARM_PARAM} = 0, the stock PID flies): arm it "
        f"with --enable, or in cfclient's Parameters tab (set {ARM_PARAM} to 1), or from Python "
        f"with cflib: cf.param.set_value('{ARM_PARAM}', '1').",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a trained run")
    p.add_argument("--uri", default="radio://0/80/2M", help="Crazyflie radio URI (default: radio://0/80/2M)")
    p.add_argument(
        "--crazyflie-base",
        type=Path,
        default=Path(os.environ["CRAZYFLIE_BASE"]) if os.environ.get("CRAZYFLIE_BASE") else None,
        metavar="DIR",
        help="crazyflie-firmware checkout (2025.12 or newer) with submodules (default: $CRAZYFLIE_BASE)",
    )
    p.add_argument("--python", default="python3", help="interpreter that has cfloader/cflib (default: python3)")
    p.add_argument(
        "--enable",
        action="store_true",
        help=f"after flashing, set {ARM_PARAM} = 1 over the radio with cflib so the policy flies once a "
        "position setpoint arrives (default: leave it 0)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="flash even when RUN_DIR/verify.json is missing or says the pre-flight gates failed",
    )
    p.set_defaults(func=run)


def check_verified(run_dir: Path) -> None:
    """Raise unless ``RUN_DIR/verify.json`` exists and says ``"gates_passed": true``."""
    path = Path(run_dir) / "verify.json"
    how = f"run `embodied verify {run_dir}` first, or pass --force to flash an unverified policy"
    if not path.is_file():
        raise EmbodiedError(f"{path} not found: this run was not verified; {how}")
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise EmbodiedError(f"{path}: not readable JSON ({err}); {how}") from None
    passed = report.get("gates_passed") if isinstance(report, dict) else None
    if not isinstance(passed, bool):
        raise EmbodiedError(f'{path}: no boolean "gates_passed" key; {how}')
    if not passed:
        rates = report.get("success_rate", {})
        detail = ", ".join(f"{k} {v:.0%}" for k, v in rates.items() if isinstance(v, int | float))
        raise EmbodiedError(
            f"{path}: the pre-flight gates failed{f' (success: {detail})' if detail else ''}; "
            "retrain or fix the policy and re-run `embodied verify`, or pass --force"
        )


def _run_tool(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    print(proc.stdout, end="")
    return proc


def run(args: argparse.Namespace) -> int:
    import shutil

    from embodied.commands.firmware import ensure_c_export
    from embodied.crazyflie import firmware_build as fb
    from embodied.export.bundle import export_dir

    if args.force:
        print("--force: skipping the verify.json check")
    else:
        check_verified(args.run_dir)
    if args.crazyflie_base is None:
        raise EmbodiedError(
            "no crazyflie-firmware tree: pass --crazyflie-base DIR or set CRAZYFLIE_BASE (git clone --recursive "
            "https://github.com/bitcraze/crazyflie-firmware; 2025.12 or newer)"
        )
    python = shutil.which(args.python)
    if python is None:
        raise EmbodiedError(f"{args.python} not found on PATH (--python)")
    modules = "cfloader, cflib" if args.enable else "cfloader"
    probe = subprocess.run([python, "-c", f"import {modules}"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        raise EmbodiedError(
            f"{modules} not importable by {python}: install cfclient there (pip install cfclient), "
            "or pass --python with an interpreter that has it"
        )
    version = fb.check_crazyflie_tree(args.crazyflie_base)
    c_out = ensure_c_export(args.run_dir)
    staged = fb.stage_crazyflie_app(c_out, export_dir(args.run_dir) / "crazyflie_app")
    binary = fb.build_crazyflie_real(staged, args.crazyflie_base)
    print(f"built {binary} (crazyflie-firmware {version}); flashing {args.uri} (bootloader mode if asked)")
    proc = _run_tool([python, "-m", "cfloader", "flash", str(binary), "stm32-fw", "-w", args.uri])
    if proc.returncode != 0:
        text = (proc.stderr + proc.stdout).lower()
        if "no crazyradio" in text or "cannot find a crazyradio" in text or "usb" in text:
            raise EmbodiedError(
                f"cfloader found no Crazyradio dongle (plug one in; check udev permissions):\n{proc.stderr}"
            )
        raise EmbodiedError(f"cfloader failed with exit code {proc.returncode}:\n{proc.stderr.strip()}")
    if not args.enable:
        print(
            f"flashed; the policy is disarmed ({ARM_PARAM} = 0). Arm it with cfclient (Parameters tab: "
            f"{ARM_PARAM} = 1) or `embodied flash ... --enable`; log group `embodied` shows active/fault"
        )
        return 0
    proc = _run_tool([python, "-c", ARM_SCRIPT, args.uri, ARM_PARAM])
    if proc.returncode != 0:
        raise EmbodiedError(
            f"flashed, but setting {ARM_PARAM} over {args.uri} failed (exit code {proc.returncode}); "
            f"set it in cfclient instead:\n{proc.stderr.strip()[-2000:]}"
        )
    print(f"flashed and armed: {ARM_PARAM} = 1; the policy flies once a position setpoint arrives")
    return 0
