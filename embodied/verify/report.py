"""``embodied verify RUN_DIR``: every pre-flight check of a quadrotor run, gated, into ``verify.json``.

Checks, in order (each reports a success rate):

``torch``     the run's own task through ``embodied eval``'s code, torch policy;
``mujoco``    the exported ONNX policy in the independent MuJoCo Crazyflie, nominal vehicle;
``mujoco_l2f``  the same, from L2F's start distribution (tilt up to 90°, ±1 m/s, ±1 rad/s) instead
              of the run's own starts: the recovery check;
``firmware``  the run's own task with the firmware's C controller in the loop (``eval --policy c``);
``perturb/<knob>=<value>``  MuJoCo with one perturbation (:data:`gates.DEFAULT_SWEEP`).

``verify.json`` keys: ``gates_passed`` (bool), ``success_rate`` (check -> fraction), ``checks``
(check -> details), ``gates`` (gate -> threshold), ``gates_not_applicable`` (gates left out for
this kind of run), ``gate_results``, ``model_sha256`` (the export that was verified), ``options``
and ``seconds``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied.errors import EmbodiedError
from embodied.eval_cfg import eager_task_cfg
from embodied.verify.gates import DEFAULT_GATES, DEFAULT_SWEEP, check_gates

log = logging.getLogger(__name__)

VERIFY_JSON = "verify.json"
VERIFY_PNG = "verify.png"

Progress = Callable[[str, int, int], None]
"""``progress(check_name, done, total)`` after each check."""


@dataclass(frozen=True)
class VerifyOptions:
    episodes: int = 1000
    """Episodes of the torch, MuJoCo and firmware checks."""
    sweep_episodes: int = 100
    """Episodes per perturbation sweep point."""
    seed: int = 12345
    substeps: int = 2
    """MuJoCo steps per control period."""
    threads: int = 2
    """MuJoCo rollout threads."""
    trajectories: int = 4
    """Start states flown in both simulators for the plot."""
    gates: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_GATES))
    sweep: dict[str, tuple[float, ...]] = field(default_factory=lambda: dict(DEFAULT_SWEEP))
    plot: bool = True

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.sweep_episodes < 1:
            raise EmbodiedError(f"episodes must be >= 1, got {self.episodes} and {self.sweep_episodes}")
        if self.substeps < 1 or self.threads < 1:
            raise EmbodiedError(f"substeps and threads must be >= 1, got {self.substeps} and {self.threads}")


def ensure_export(run_dir: Path) -> None:
    """Export the run (ONNX + C) when ``RUN_DIR/export`` lacks ``policy_io.json`` or ``policy.onnx``;
    otherwise check that the export holds the run's current weights: the artifact's hash is
    computed as its export computes ``model_sha256`` (an image policy's traced graph, any other
    policy's graph built from its arrays)."""
    from embodied.export.bundle import export_dir
    from embodied.export.policy_io import ONNX_FILENAME, POLICY_IO_FILENAME, read_policy_io
    from embodied.training.run_policy import export_run

    out = export_dir(run_dir)
    if not (out / POLICY_IO_FILENAME).exists() and not (out / ONNX_FILENAME).exists():
        log.info("%s has no export yet: exporting it", run_dir)
        export_run(run_dir, "all")
        return
    policy_io = read_policy_io(out)
    current = checkpoint_model_sha256(run_dir)
    if current != policy_io.model_sha256:
        raise EmbodiedError(
            f"{policy_io.path}: exported from other weights ({policy_io.model_sha256[:12]}) than the run's checkpoint "
            f"({current[:12]}); re-export with `embodied export {run_dir}`"
        )


def checkpoint_model_sha256(run_dir: Path) -> str:
    """The ``model_sha256`` an export of the run's current checkpoint would record."""
    from embodied.export.bundle import export_model_sha256
    from embodied.training.run_policy import policy_artifact

    return export_model_sha256(policy_artifact(run_dir).module())


def _torch_task_eval(run_dir: Path, kind: str, episodes: int, seed: int) -> dict[str, float]:
    """``embodied eval RUN_DIR --policy KIND`` as a dict."""
    from embodied.experiment import load_experiment
    from embodied.training.evaluate import EvalEnvs, evaluate, load_policy
    from embodied.training.run import CONFIG_FILE

    cfg = load_experiment(run_dir / CONFIG_FILE)
    result = evaluate(
        lambda env: load_policy(kind, run_dir, env),
        EvalEnvs(cfg.task_name, eager_task_cfg(cfg.env), "cpu"),
        episodes=episodes,
        seed=seed,
    )
    return result.as_dict()


def run_verify(run_dir: Path, options: VerifyOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Run every check on ``run_dir``, write ``verify.json`` (and ``verify.png``); return the report."""
    run_dir = Path(run_dir)
    # Torch's intra-op threads spin while waiting for each other: on a 2-core machine with
    # anything else running, one thread evaluated the torch task ~9x faster in wall time than
    # two (measured side by side). The checks are sequential, so one thread loses nothing.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run_verify(run_dir, options, progress)
    finally:
        torch.set_num_threads(threads)


def _run_verify(run_dir: Path, options: VerifyOptions, progress: Progress | None) -> dict[str, Any]:
    from embodied.export.bundle import export_dir
    from embodied.sim.mujoco_crazyflie import Perturbation
    from embodied.training.run import CONFIG_FILE, load_checkpoint
    from embodied.verify.episodes import EpisodeRules, run_episodes, start_ranges, start_rules
    from embodied.verify.policy import load_exported_policy

    for module, extra in (("mujoco", "mujoco"), ("onnxruntime", "export")):
        if importlib.util.find_spec(module) is None:
            raise EmbodiedError(f"embodied verify needs {module}: pip install 'embodied[{extra}]'")
    if not (run_dir / CONFIG_FILE).is_file():
        raise EmbodiedError(
            f"{run_dir}: not a run directory (no {CONFIG_FILE}); pass the folder `embodied train` printed"
        )
    load_checkpoint(run_dir)  # a clear error before any work when the checkpoint is missing
    started = time.perf_counter()
    ensure_export(run_dir)
    policy, policy_io = load_exported_policy(export_dir(run_dir))
    spec, source = policy_io.io_spec, str(policy_io.path)
    # L2F's starts are hover starts: a tracking run is scored on following its path, which no
    # 90-degree start can do within the RMS bound, so the recovery check and its gate do not apply.
    not_applicable = ["l2f_recovery_min"] if "tracking" in spec.extra else []
    total = 4 - len(not_applicable) + sum(len(v) for v in options.sweep.values())
    checks: dict[str, dict[str, Any]] = {}

    def done(name: str, details: dict[str, Any], t0: float) -> None:
        checks[name] = details | {"seconds": round(time.perf_counter() - t0, 2)}
        log.info("%s: success %.1f %%", name, 100.0 * details["success_rate"])
        if progress is not None:
            progress(name, len(checks), total)

    t0 = time.perf_counter()
    done("torch", _torch_task_eval(run_dir, "torch", options.episodes, options.seed), t0)
    t0 = time.perf_counter()
    mujoco = run_episodes(
        policy,
        spec,
        options.episodes,
        options.seed,
        substeps=options.substeps,
        record=options.trajectories,
        source=source,
        num_threads=options.threads,
    )
    rules = EpisodeRules.from_spec(spec, source)
    done("mujoco", mujoco.as_dict() | {"starts": start_ranges(rules)}, t0)
    # The recovery check: the nominal check's episodes from L2F's start distribution.
    if not not_applicable:
        t0 = time.perf_counter()
        recovery = run_episodes(
            policy,
            spec,
            options.episodes,
            options.seed,
            source=source,
            substeps=options.substeps,
            num_threads=options.threads,
            starts="l2f",
        )
        done("mujoco_l2f", recovery.as_dict() | {"starts": start_ranges(start_rules(rules, "l2f"))}, t0)
    else:
        log.info("mujoco_l2f: not flown for a tracking run (L2F's starts are hover starts)")
    t0 = time.perf_counter()
    done("firmware", _torch_task_eval(run_dir, "c", options.episodes, options.seed), t0)
    sweep_rows: list[dict[str, Any]] = []
    for knob, levels in options.sweep.items():
        for value in levels:
            t0 = time.perf_counter()
            kwargs: dict[str, Any] = {knob: round(value) if knob == "obs_delay_steps" else float(value)}
            result = run_episodes(
                policy,
                spec,
                options.sweep_episodes,
                options.seed + 1,
                perturbation=Perturbation(**kwargs),
                substeps=options.substeps,
                source=source,
                num_threads=options.threads,
            )
            done(f"perturb/{knob}={value:g}", result.as_dict() | {"knob": knob, "value": value}, t0)
            sweep_rows.append({"knob": knob, "value": value, "success_rate": result.success_rate})
    rates = {name: float(c["success_rate"]) for name, c in checks.items()}
    sweep_min = min((r["success_rate"] for r in sweep_rows), default=math.nan)
    values: dict[str, float] = {
        "torch_success_min": rates["torch"],
        "mujoco_success_min": rates["mujoco"],
        "l2f_recovery_min": rates.get("mujoco_l2f", math.nan),
        "firmware_success_min": rates["firmware"],
        "sim_to_sim_drop_max": rates["torch"] - rates["mujoco"],
        "perturbation_success_min": sweep_min if sweep_rows else 1.0,
    }
    gate_results = check_gates({k: v for k, v in options.gates.items() if k not in not_applicable}, values)
    report: dict[str, Any] = {
        "gates_passed": all(g.passed for g in gate_results),
        "success_rate": rates,
        "checks": checks,
        "gates": dict(options.gates),
        "gates_not_applicable": not_applicable,
        "gate_results": [g.as_dict() for g in gate_results],
        "model_sha256": policy_io.model_sha256,
        "options": {k: v for k, v in dataclasses.asdict(options).items() if k not in ("gates",)},
        "seconds": round(time.perf_counter() - started, 2),
    }
    if options.plot:
        from embodied.verify.plot import compare_trajectories, write_plot

        traj_torch, traj_mujoco = compare_trajectories(run_dir, policy, spec, options, source)
        write_plot(run_dir / VERIFY_PNG, sweep_rows, traj_torch, traj_mujoco, rates, spec.control_period_s)
        report["plot"] = VERIFY_PNG
    report["seconds"] = round(time.perf_counter() - started, 2)
    report = _json_safe(report)
    (run_dir / VERIFY_JSON).write_text(json.dumps(report, indent=2) + "\n")
    return report


def _json_safe(value: Any) -> Any:
    """NaN/inf -> None and numpy scalars -> Python, so ``verify.json`` is strict JSON."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def check_verified(run_dir: Path) -> dict[str, Any]:
    """The run's ``verify.json`` when it passed every gate for the export now in ``RUN_DIR/export``.

    Raises :class:`EmbodiedError` with one line saying what to do when the report is missing,
    unreadable, failed, lacks a default gate (made before that gate existed, e.g. without
    ``l2f_recovery_min``), or was made for other weights than the current export (for ``embodied
    flash``).
    """
    from embodied.export.bundle import export_dir
    from embodied.export.policy_io import read_policy_io

    path = Path(run_dir) / VERIFY_JSON
    again = f"run `embodied verify {run_dir}`"
    if not path.is_file():
        raise EmbodiedError(f"{path}: not found; {again} first (or pass --force)")
    try:
        report = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise EmbodiedError(f"{path}: not valid JSON ({err}); {again} again") from None
    if not isinstance(report, dict) or report.get("gates_passed") is not True:
        failed = (
            [g.get("name") for g in report.get("gate_results", []) if isinstance(g, dict) and not g.get("passed")]
            if isinstance(report, dict)
            else []
        )
        raise EmbodiedError(
            f"{path}: the run failed verification (gates: {', '.join(map(str, failed)) or 'unknown'}); "
            "retrain or fix the policy, then verify again (or pass --force)"
        )
    measured = report.get("gates")
    missing = [name for name in DEFAULT_GATES if not isinstance(measured, dict) or name not in measured]
    if missing:
        raise EmbodiedError(
            f"{path}: made by an older `embodied verify` that did not check {', '.join(missing)}; "
            f"{again} again (or pass --force)"
        )
    current = read_policy_io(export_dir(run_dir)).model_sha256
    verified = report.get("model_sha256")
    if verified != current:
        raise EmbodiedError(
            f"{path}: verified another export ({str(verified)[:12]}) than the one in {export_dir(run_dir)} "
            f"({current[:12]}); {again} on the current export (or pass --force)"
        )
    return report
