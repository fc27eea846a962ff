"""``embodied flash``: the gate on the verified model, the radio probe before the build, and the
flash/arm command lines. No Crazyradio or Crazyflie is plugged in here, which is the path most
of these tests take; firmware builds are the real tier's (tests/test_firmware_real.py)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from export_support import quad_io_spec, random_policy, write_io

from embodied.commands import firmware, flash
from embodied.crazyflie import firmware_build as fb
from embodied.errors import EmbodiedError
from embodied.export.policy_io import read_policy_io
from embodied.verify.gates import DEFAULT_GATES


def _flash_args(run_dir: Path, **kw: object) -> argparse.Namespace:
    base = dict(
        run_dir=run_dir, uri="radio://0/80/2M", crazyflie_base=None, python="python3", enable=False, force=False
    )
    return argparse.Namespace(**(base | kw))


def _exported_run(run_dir: Path, verified_sha256: str | None = None, passed: bool = True) -> str:
    """A run folder with an exported quad policy (``export/policy_io.json``) and a verify.json
    for ``verified_sha256`` (default: the export's own model). Returns the export's model hash."""
    io_path = write_io(random_policy(), quad_io_spec(history=32), run_dir / "export")
    current = read_policy_io(io_path).model_sha256
    report = {
        "gates_passed": passed,
        "gates": dict(DEFAULT_GATES),
        "gate_results": [],
        "model_sha256": verified_sha256 or current,
    }
    (run_dir / "verify.json").write_text(json.dumps(report))
    return current


@pytest.fixture
def no_usb_bus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty stand-in for /sys/bus/usb/devices (this machine has no USB bus at all)."""
    root = tmp_path / "usb_devices"
    root.mkdir()
    monkeypatch.setattr(flash, "USB_DEVICES", root)
    return root


def _refuse_build_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step after the cheap checks fails the test if reached."""

    def reached(*_: object) -> None:
        raise AssertionError("flash went on to the tree check, export or build")

    monkeypatch.setattr(fb, "check_crazyflie_tree", reached)
    monkeypatch.setattr(fb, "build_crazyflie_real", reached)
    monkeypatch.setattr(firmware, "ensure_c_export", reached)


def test_flash_refuses_an_unverified_failed_or_stale_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _refuse_build_steps(monkeypatch)
    monkeypatch.setattr(flash, "find_radio", lambda uri, python: "Crazyradio (stand-in: none is plugged in here)")
    with pytest.raises(EmbodiedError, match=r"verify\.json: not found; run `embodied verify"):
        flash.run(_flash_args(tmp_path))
    _exported_run(tmp_path, passed=False)
    with pytest.raises(EmbodiedError, match=r"failed verification .*verify again \(or pass --force\)"):
        flash.run(_flash_args(tmp_path))
    (tmp_path / "verify.json").write_text("{not json")
    with pytest.raises(EmbodiedError, match="not valid JSON"):
        flash.run(_flash_args(tmp_path))
    # Verified, trained on, re-exported: verify.json names another model than the export's.
    _exported_run(tmp_path, verified_sha256="f" * 64)
    with pytest.raises(EmbodiedError, match=r"verified another export \(ffffffffffff\)") as err:
        flash.run(_flash_args(tmp_path))
    assert "\n" not in str(err.value) and f"embodied verify {tmp_path}" in str(err.value)


def test_flash_refuses_a_report_from_before_a_default_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A verify.json that passed every gate of an older ``embodied verify`` (here: before the L2F
    recovery check) is refused in one line naming the gate it never measured."""
    _refuse_build_steps(monkeypatch)
    monkeypatch.setattr(flash, "find_radio", lambda uri, python: "Crazyradio (stand-in: none is plugged in here)")
    _exported_run(tmp_path)
    report = json.loads((tmp_path / "verify.json").read_text())
    del report["gates"]["l2f_recovery_min"]
    (tmp_path / "verify.json").write_text(json.dumps(report))
    with pytest.raises(EmbodiedError, match=r"older `embodied verify` that did not check l2f_recovery_min") as err:
        flash.run(_flash_args(tmp_path))
    assert "\n" not in str(err.value) and f"embodied verify {tmp_path}` again" in str(err.value)
    del report["gates"]  # a report with no gate thresholds at all names every default gate
    (tmp_path / "verify.json").write_text(json.dumps(report))
    with pytest.raises(EmbodiedError, match=", ".join(DEFAULT_GATES)):
        flash.run(_flash_args(tmp_path))


def test_flash_with_no_radio_fails_before_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_usb_bus: Path
) -> None:
    _refuse_build_steps(monkeypatch)
    _exported_run(tmp_path)  # verified, current
    with pytest.raises(EmbodiedError, match=r"no Crazyradio found .*plug in a Crazyradio") as err:
        flash.run(_flash_args(tmp_path, crazyflie_base=tmp_path))
    assert "\n" not in str(err.value)
    # The radio is looked for first of all: even an unverified run hears about it first.
    (tmp_path / "verify.json").unlink()
    with pytest.raises(EmbodiedError, match="no Crazyradio found"):
        flash.run(_flash_args(tmp_path, crazyflie_base=tmp_path))
    with pytest.raises(EmbodiedError, match=r"no Crazyflie on USB found .*USB cable"):
        flash.run(_flash_args(tmp_path, crazyflie_base=tmp_path, force=True, uri="usb://0"))


def test_without_sysfs_the_radio_is_looked_for_with_pyusb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flash, "USB_DEVICES", tmp_path / "no-such-dir")
    # This interpreter: pyusb absent or no device, either way no radio and one line saying so.
    with pytest.raises(EmbodiedError, match=r"no Crazyradio found \((not on the USB bus|no USB bus visible)") as err:
        flash.find_radio("radio://0/80/2M", sys.executable)
    assert "\n" not in str(err.value)
    assert flash.find_radio("tcp://127.0.0.1:1234", sys.executable).endswith("not probed)")


def test_find_radio_reads_the_usb_ids(no_usb_bus: Path) -> None:
    # A stand-in sysfs entry (the files Linux writes per USB device) for each device kind.
    dev = no_usb_bus / "1-1"
    dev.mkdir()
    (dev / "idVendor").write_text("1915\n")
    (dev / "idProduct").write_text("7777\n")
    assert flash.find_radio("radio://0/80/2M/E7E7E7E7E7", "python3") == "Crazyradio (USB 1915:7777)"
    with pytest.raises(EmbodiedError, match="no Crazyflie on USB"):
        flash.find_radio("usb://0", "python3")
    (dev / "idVendor").write_text("0483\n")
    (dev / "idProduct").write_text("5740\n")
    assert flash.find_radio("usb://0", "python3").startswith("Crazyflie on USB")


def test_flash_explains_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flash, "find_radio", lambda uri, python: "Crazyradio (stand-in: none is plugged in here)")
    _exported_run(tmp_path)
    args = _flash_args(tmp_path)
    with pytest.raises(EmbodiedError, match="no crazyflie-firmware tree"):
        flash.run(args)
    args.crazyflie_base = tmp_path
    args.python = "no-such-python-here"
    with pytest.raises(EmbodiedError, match="not found on PATH"):
        flash.run(args)
    if importlib.util.find_spec("cfloader") is None:
        args.python = sys.executable
        with pytest.raises(EmbodiedError, match="cfloader not importable"):
            flash.run(args)


def test_flash_refuses_a_checkpoint_that_is_not_the_verified_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verify.json matches the export, but training went on: the export step would re-export."""
    from embodied.verify import report

    current = _exported_run(tmp_path)
    monkeypatch.setattr(report, "checkpoint_model_sha256", lambda run_dir: "e" * 64)
    with pytest.raises(
        EmbodiedError, match=rf"checkpoint \(eeeeeeeeeeee\) is not the verified model \({current[:12]}\)"
    ):
        flash._require_checkpoint_verified(tmp_path, current)
    monkeypatch.setattr(report, "checkpoint_model_sha256", lambda run_dir: current)
    flash._require_checkpoint_verified(tmp_path, current)


def test_flash_enable_wiring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--enable`` flashes, then sets embodied.enable over the radio with cflib.

    Stand-ins, because no Crazyradio or firmware build is reachable here: ``--python`` is a
    script that records its arguments instead of running cfloader/cflib, the radio probe says
    one is there, and the tree check, checkpoint check, export and build return fixed values.
    The real path (cfloader flash, then cflib's param.set_value through SyncCrazyflie) is what
    ``embodied flash`` runs otherwise.
    """
    calls = tmp_path / "calls.txt"
    fake = tmp_path / "fakepython"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {calls}\nexit 0\n')
    fake.chmod(0o755)
    binary = tmp_path / "cf2.bin"
    _exported_run(tmp_path)
    monkeypatch.setattr(flash, "find_radio", lambda uri, python: "Crazyradio (stand-in)")
    monkeypatch.setattr(flash, "_require_checkpoint_verified", lambda run_dir, sha: None)
    monkeypatch.setattr(fb, "check_crazyflie_tree", lambda base: "2026.08")
    monkeypatch.setattr(firmware, "ensure_c_export", lambda run_dir: tmp_path / "export" / "c")
    monkeypatch.setattr(fb, "stage_crazyflie_app", lambda c_dir, dest: tmp_path)
    monkeypatch.setattr(fb, "build_crazyflie_real", lambda staged, base: binary)
    args = _flash_args(tmp_path, crazyflie_base=tmp_path, python=str(fake), enable=True, uri="radio://0/60/2M/E7")
    assert flash.run(args) == 0
    lines = calls.read_text().splitlines()
    assert lines[0] == "-c import cfloader, cflib"
    assert lines[1] == f"-m cfloader flash {binary} stm32-fw -w radio://0/60/2M/E7"
    assert lines[2] == "-c " and "param.set_value" in calls.read_text()  # the cflib script (multi-line)
    assert lines[-1].endswith("radio://0/60/2M/E7 embodied.enable")
    out = capsys.readouterr().out
    assert "armed" in out and "Crazyflie 2.1 (brushed" in out  # the run's variant, built for
    # Without --enable nothing is armed, and the output says how to arm.
    calls.unlink()
    assert flash.run(_flash_args(tmp_path, crazyflie_base=tmp_path, python=str(fake))) == 0
    assert len(calls.read_text().splitlines()) == 2
    assert "cfclient" in capsys.readouterr().out


def test_the_cli_reaches_the_radio_check_without_importing_torch(tmp_path: Path) -> None:
    """`embodied flash` registers only its own parser, so the radio check comes before any heavy
    import (`export`'s format table imports torch, which alone takes seconds on a busy machine)."""
    import subprocess

    probe = (
        "import sys\n"
        "from embodied.cli import main\n"
        f"code = main(['flash', {str(tmp_path / 'no_run')!r}])\n"
        "print('torch' in sys.modules, code)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "2"], out.stderr
