"""``embodied flash``: build the Crazyflie firmware with a run's policy, flash it over the radio, optionally arm it."""

from __future__ import annotations

import argparse
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
        "pip install cfclient). Checks first, in about a second: RUN_DIR/verify.json passed every "
        "default gate for the exported model and the run's checkpoint is that model (run `embodied verify RUN_DIR`; "
        "--force skips this), a Crazyradio (radio://) or the Crazyflie (usb://) is on USB, the tree and "
        "cfloader are there; then builds for the platform of the run's vehicle variant "
        "(policy_io.json vehicle_variant: crazyflie-2.1, -2.1-plus, -2.1-brushless) and flashes. "
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
        help="flash even when RUN_DIR/verify.json is missing, failed, lacks a default gate, or verified another model",
    )
    p.set_defaults(func=run)


USB_DEVICES = Path("/sys/bus/usb/devices")
"""Where Linux lists USB devices (``idVendor``/``idProduct`` files per device)."""
CRAZYRADIO_USB = ("1915", "7777")
"""Crazyradio PA and Crazyradio 2.0 (radio firmware): vendor and product id, as cflib opens it."""
CRAZYFLIE_USB = ("0483", "5740")
"""A Crazyflie on a USB cable (``usb://`` URIs)."""
USB_PROBE = """
import sys
import usb.core
found = usb.core.find(idVendor=int(sys.argv[1], 16), idProduct=int(sys.argv[2], 16))
print("found" if found is not None else "none")
"""
"""Run with the ``--python`` interpreter (pyusb comes with cflib) where sysfs lists no USB bus."""


def _usb_ids_in_sysfs(root: Path) -> set[tuple[str, str]]:
    ids = set()
    for dev in root.iterdir():
        try:
            ids.add(((dev / "idVendor").read_text().strip(), (dev / "idProduct").read_text().strip()))
        except OSError:
            continue
    return ids


def find_radio(uri: str, python: str) -> str:
    """Which USB device will carry ``uri`` (a Crazyradio for ``radio://``, the Crazyflie itself
    for ``usb://``); raises a one-line :class:`EmbodiedError` saying what to plug in when there is
    none. Other URI schemes are not probed. Looks in sysfs, else asks pyusb in ``python``."""
    if uri.startswith("radio://"):
        wanted, what = CRAZYRADIO_USB, "Crazyradio"
        fix = "plug in a Crazyradio (PA or 2.0 with its radio firmware); on Linux give your user access (Bitcraze's udev rules)"
    elif uri.startswith("usb://"):
        wanted, what = CRAZYFLIE_USB, "Crazyflie on USB"
        fix = "connect the Crazyflie with a USB cable and switch it on, or flash over a radio:// URI"
    else:
        return f"{uri} (not a USB link: not probed)"
    if USB_DEVICES.is_dir():
        if wanted in _usb_ids_in_sysfs(USB_DEVICES):
            return f"{what} (USB {wanted[0]}:{wanted[1]})"
        raise EmbodiedError(
            f"no {what} found (USB {wanted[0]}:{wanted[1]} not in {USB_DEVICES}); {fix}, then run flash again"
        )
    try:
        proc = subprocess.run(
            [python, "-c", USB_PROBE, *wanted], capture_output=True, text=True, timeout=4.0, check=False
        )
        answer = proc.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        answer = ""
    if answer == "found":
        return f"{what} (USB {wanted[0]}:{wanted[1]})"
    why = (
        "not on the USB bus"
        if answer == "none"
        else f"no USB bus visible ({USB_DEVICES} missing, pyusb in {python} could not look)"
    )
    raise EmbodiedError(f"no {what} found ({why}); {fix}, then run flash again")


def _run_tool(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    print(proc.stdout, end="")
    return proc


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _require_checkpoint_verified(run_dir: Path, verified_sha256: str) -> None:
    """The run's checkpoint is the model that was exported and verified (training went on since
    otherwise, and the flash's export step would put unverified weights on the drone)."""
    from embodied.verify.report import checkpoint_model_sha256

    current = checkpoint_model_sha256(run_dir)
    if current != verified_sha256:
        raise EmbodiedError(
            f"{run_dir}: the checkpoint ({current[:12]}) is not the verified model ({verified_sha256[:12]}); "
            f"run `embodied export {run_dir}` and `embodied verify {run_dir}`, then flash (or pass --force)"
        )


def run(args: argparse.Namespace) -> int:
    import shutil

    # Cheap checks first, the radio before anything imports torch; the firmware build (minutes) last.
    radio = find_radio(args.uri, args.python)
    verified = None
    if args.force:
        print("--force: skipping the verify.json check")
    else:
        from embodied.verify.report import check_verified

        verified = check_verified(args.run_dir)
    if args.crazyflie_base is None:
        raise EmbodiedError(
            "no crazyflie-firmware tree: pass --crazyflie-base DIR or set CRAZYFLIE_BASE (git clone --recursive "
            "https://github.com/bitcraze/crazyflie-firmware; 2025.12 or newer)"
        )
    python = shutil.which(args.python)
    if python is None:
        raise EmbodiedError(f"{args.python} not found on PATH: pass --python with an interpreter that has cfclient")
    modules = "cfloader, cflib" if args.enable else "cfloader"
    probe = subprocess.run([python, "-c", f"import {modules}"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        raise EmbodiedError(
            f"{modules} not importable by {python}: install cfclient there (pip install cfclient), "
            "or pass --python with an interpreter that has it"
        )
    from embodied.commands.firmware import ensure_c_export
    from embodied.crazyflie import firmware_build as fb
    from embodied.crazyflie.vehicle import c_policy_io, vehicle_variant
    from embodied.export.bundle import export_dir

    version = fb.check_crazyflie_tree(args.crazyflie_base)
    if verified is not None:
        _require_checkpoint_verified(args.run_dir, str(verified["model_sha256"]))
    c_out = ensure_c_export(args.run_dir)
    variant = vehicle_variant(c_policy_io(c_out))
    print(f"{radio}; building for the {variant.title} (policy_io.json vehicle_variant {variant.name})")
    staged = fb.stage_crazyflie_app(c_out, export_dir(args.run_dir) / "crazyflie_app")
    binary = fb.build_crazyflie_real(staged, args.crazyflie_base)
    print(f"built {binary} (crazyflie-firmware {version}); flashing {args.uri} (bootloader mode if asked)")
    proc = _run_tool([python, "-m", "cfloader", "flash", str(binary), "stm32-fw", "-w", args.uri])
    if proc.returncode != 0:
        text = (proc.stderr + proc.stdout).lower()
        if "no crazyradio" in text or "cannot find a crazyradio" in text or "usb" in text:
            raise EmbodiedError(
                f"cfloader found no Crazyradio ({_last_line(proc.stderr)}): plug one in, check its udev permissions, "
                "and run flash again"
            )
        raise EmbodiedError(
            f"cfloader failed with exit code {proc.returncode} ({_last_line(proc.stderr)}): switch the Crazyflie on "
            f"(or into bootloader mode: hold its power button 3 s) within range of {args.uri}, then run flash again"
        )
    if not args.enable:
        print(
            f"flashed; the policy is disarmed ({ARM_PARAM} = 0). Arm it with cfclient (Parameters tab: "
            f"{ARM_PARAM} = 1) or `embodied flash ... --enable`; log group `embodied` shows active/fault"
        )
        return 0
    proc = _run_tool([python, "-c", ARM_SCRIPT, args.uri, ARM_PARAM])
    if proc.returncode != 0:
        raise EmbodiedError(
            f"flashed, but setting {ARM_PARAM} over {args.uri} failed with exit code {proc.returncode} "
            f"({_last_line(proc.stderr)}); set it to 1 in cfclient's Parameters tab instead"
        )
    print(f"flashed and armed: {ARM_PARAM} = 1; the policy flies once a position setpoint arrives")
    return 0
