"""``embodied verify``: the pre-flight report of a quadrotor run (``RUN_DIR/verify.json``, ``verify.png``)."""

from __future__ import annotations

import argparse
import json
import math
import textwrap
from pathlib import Path
from typing import Any

from embodied.config import int_in_range
from embodied.verify.gates import DEFAULT_GATES, GATE_HELP

EPILOG = """\
checks (each a success rate in verify.json):
  torch      the run's own task, torch policy (what `embodied eval` reports)
  mujoco     the exported ONNX policy in an independent MuJoCo Crazyflie (real rotor spin,
             firmware thrust-command chain, MuJoCo integrator and ground contact), started
             like the run's own task
  mujoco_l2f the same from L2F's start distribution (tilt up to 90 deg, +-1 m/s, +-1 rad/s per
             axis): can the policy recover from what L2F's policies recover from?
  firmware   the run's own task flown by the firmware's C controller (`embodied eval --policy c`)
  perturb/K=V  MuJoCo with one perturbation: mass, inertia, motor lag, observation delay,
             per-motor thrust mismatch, yaw disturbance torque

gates (defaults; a failed gate exits 1):
{gates}

examples:
  embodied verify runs/quad_hover/20261201-101500_ppo_s0
  embodied verify RUN_DIR --episodes 200 --sweep-episodes 50          # quicker, noisier
  embodied verify RUN_DIR --gate sim_to_sim_drop_max=0.1 --gate perturbation_success_min=0.7
  embodied verify RUN_DIR --gate l2f_recovery_min=0.8                 # a looser recovery gate
  embodied verify RUN_DIR --gates my_gates.yaml --json                # YAML: {mujoco_success_min: 0.85}
  embodied verify RUN_DIR --sweep mass_scale=0.6,0.8,1.2,1.4 --sweep yaw_torque_nm=

exit codes: 0 all gates passed, 1 a gate failed, 2 bad input (no run, corrupt export, bad gate).
`embodied flash` refuses runs whose verify.json is missing, failed, or lacks a gate (older verify).
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "verify",
        help="pre-flight report: torch, MuJoCo sim-to-sim, firmware-in-the-loop, perturbation sweep, gates",
        description=textwrap.fill(
            "Verify a trained quadrotor run before it flies: evaluate it in its own torch task, in an "
            "independent MuJoCo Crazyflie, with the firmware's C controller in the loop, and across a sweep of "
            "vehicle perturbations; compare against gates; write RUN_DIR/verify.json and RUN_DIR/verify.png. "
            "Exports the policy first when RUN_DIR/export is missing.",
            width=92,
        ),
        epilog=EPILOG.replace(
            "{gates}",
            "\n".join(f"  {f'{name}={DEFAULT_GATES[name]:g}':31s} {GATE_HELP[name]}" for name in DEFAULT_GATES),
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a quad-hover run printed by `embodied train`")
    p.add_argument(
        "--episodes",
        type=int_in_range(1, 1_000_000),
        default=1000,
        help="episodes of the torch, MuJoCo and firmware checks (default: 1000)",
    )
    p.add_argument(
        "--sweep-episodes",
        type=int_in_range(1, 1_000_000),
        default=100,
        help="episodes per perturbation point (default: 100)",
    )
    p.add_argument("--seed", type=int_in_range(0, 2**31 - 1), default=12345, help="evaluation seed (default: 12345)")
    p.add_argument("--gate", action="append", default=[], metavar="NAME=VALUE", help="override one gate (repeatable)")
    p.add_argument("--gates", type=Path, metavar="FILE", help="YAML mapping of gate name -> threshold")
    p.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KNOB=V1,V2",
        help="replace a knob's sweep values (empty: drop it)",
    )
    p.add_argument(
        "--substeps", type=int_in_range(1, 1000), default=2, help="MuJoCo steps per control period (default: 2)"
    )
    p.add_argument("--threads", type=int_in_range(1, 1024), default=2, help="MuJoCo rollout threads (default: 2)")
    p.add_argument("--no-plot", action="store_true", help="skip verify.png and the torch-vs-MuJoCo trajectories")
    p.add_argument("--json", action="store_true", help="print verify.json to stdout instead of a summary")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from embodied.verify.gates import parse_gate_overrides, parse_sweep_overrides
    from embodied.verify.report import VERIFY_JSON, VerifyOptions, run_verify

    options = VerifyOptions(
        episodes=args.episodes,
        sweep_episodes=args.sweep_episodes,
        seed=args.seed,
        substeps=args.substeps,
        threads=args.threads,
        gates=parse_gate_overrides(args.gate, args.gates),
        sweep=parse_sweep_overrides(args.sweep),
        plot=not args.no_plot,
    )
    bar = Progress(
        TextColumn("[bold]verify"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=args.no_progress,
    )
    with bar:
        task = bar.add_task("verify", total=None, status="")

        def progress(name: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, status=name)

        report = run_verify(args.run_dir, options, progress)
    if args.json:
        print(json.dumps(report))
    else:
        for name, rate in report["success_rate"].items():
            print(f"{name:32s} success {100 * rate:5.1f} %{_starts_note(report['checks'][name])}")
        for gate in report["gate_results"]:
            mark = "pass" if gate["passed"] else "FAIL"
            print(f"{mark}  {gate['name']:26s} {gate['value']:.3f} (threshold {gate['threshold']:g})")
        for name in report.get("gates_not_applicable", []):
            print(f"n/a   {name:26s} (not checked for this kind of run)")
        print(f"wrote {args.run_dir / VERIFY_JSON} ({report['seconds']:.1f} s)")
    return 0 if report["gates_passed"] else 1


def _starts_note(check: dict[str, Any]) -> str:
    """``"  (starts: tilt <= 57 deg, 1 m/s, 1 rad/s)"`` for a check that reports its start ranges."""
    starts = check.get("starts")
    if not isinstance(starts, dict):
        return ""
    tilt_deg = math.degrees(starts["init_max_angle_rad"])
    return (
        f"  (starts: tilt <= {tilt_deg:.0f} deg, {starts['init_lin_vel_mps']:g} m/s, "
        f"{starts['init_ang_vel_rad_s']:g} rad/s)"
    )
