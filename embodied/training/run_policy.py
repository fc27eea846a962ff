"""A run's policy artifact (``ckpt/policy.pt``): written beside each checkpoint, read by every
consumer of the trained policy, and built once from the checkpoint for runs that predate it.

See :mod:`embodied.export.artifact` for the file itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from embodied import registry
from embodied.algo import ExportUnsupportedError
from embodied.checkpoint_seal import MAGIC, SealError, verify_file
from embodied.env import IMAGE_GROUP, RenderingEnv
from embodied.errors import EmbodiedError
from embodied.eval_cfg import eager_task_cfg
from embodied.experiment import load_experiment
from embodied.export.artifact import (
    POLICY_FILE,
    PolicyArtifact,
    PolicyArtifactError,
    artifact_kind_known,
    read_policy_artifact,
)
from embodied.export.bundle import ExportReport, export_artifact, export_dir, record_observations
from embodied.export.formats import ALL, FormatResult, selected, unsupported_kind_reason
from embodied.export.image_onnx import export_image_onnx, record_inputs
from embodied.export.policy_io import POLICY_IO_FILENAME
from embodied.io_spec import IOSpec
from embodied.training.run import CHECKPOINT_FILE, CONFIG_FILE, CheckpointError, atomic_write_bytes

log = logging.getLogger(__name__)


def checkpoint_seal(run_dir: Path) -> str:
    """The SHA-256 sealed into ``ckpt/latest.pt`` (its last 64 bytes), "" when it has none.

    Reads only the file's tail: an artifact records it to show which checkpoint it came from."""
    path = Path(run_dir) / CHECKPOINT_FILE
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            tail_len = len(MAGIC) + 64
            if size < tail_len:
                return ""
            fh.seek(size - tail_len)
            tail = fh.read(tail_len)
    except OSError:
        return ""
    return tail[len(MAGIC) :].decode("ascii", "replace") if tail.startswith(MAGIC) else ""


def write_policy_artifact(run_dir: Path, module: nn.Module, io_spec: IOSpec, env_steps: int) -> Path | None:
    """Write ``ckpt/policy.pt`` for the exported ``module`` of the checkpoint just saved.

    A policy family no artifact kind describes (``export.artifact.POLICY_KINDS``: ``mlp``,
    ``flow`` and ``image`` today) gets none: the checkpoint is the whole record, and this
    returns None (logged once per run directory)."""
    if not artifact_kind_known(module):
        if run_dir not in _SKIPPED:
            _SKIPPED.add(run_dir)
            log.info(
                "%s: no policy artifact for %s (no artifact kind for it yet); the checkpoint holds it",
                run_dir,
                type(module).__name__,
            )
        return None
    artifact = PolicyArtifact.from_module(
        module, io_spec, env_steps=env_steps, checkpoint_seal=checkpoint_seal(run_dir)
    )
    path = Path(run_dir) / POLICY_FILE
    atomic_write_bytes(path, artifact.to_bytes())
    return path


_SKIPPED: set[Path] = set()


class NoArtifactKindError(PolicyArtifactError):
    """The run's policy has no artifact kind (e.g. an image-instruction flow policy): only its checkpoint holds it."""


def policy_artifact(run_dir: Path) -> PolicyArtifact:
    """The run's policy artifact, without rebuilding its algorithm.

    The checkpoint's seal is verified first (its bytes hashed, nothing unpickled), so a damaged
    or missing ``ckpt/latest.pt`` is a :class:`CheckpointError` here as everywhere else. Runs
    saved before artifacts existed, or whose artifact does not belong to the current checkpoint
    (a crash between the two writes), get it built from the checkpoint once (this loads the
    whole run one time) and saved for next time.
    """
    run_dir = Path(run_dir)
    path = run_dir / POLICY_FILE
    checkpoint = run_dir / CHECKPOINT_FILE
    if not checkpoint.is_file():
        raise CheckpointError(
            f"{run_dir}: no checkpoint at {checkpoint} (the run was not trained long enough to save one, "
            "or this is not a run directory)"
        )
    try:
        seal = verify_file(checkpoint)
    except SealError as err:
        raise CheckpointError(str(err)) from None
    except OSError as err:
        raise CheckpointError(f"{checkpoint}: cannot read the checkpoint: {err.strerror or err}") from None
    if path.is_file():
        artifact = read_policy_artifact(path)
        if artifact.checkpoint_seal == seal:
            return artifact
        log.warning("%s was taken from another checkpoint than %s: rebuilding it", path, run_dir / CHECKPOINT_FILE)
    else:
        log.info("%s has no %s: building it from the checkpoint", run_dir, POLICY_FILE)
    from embodied.training.run import load_run

    run = load_run(run_dir)
    env_steps = int(run.checkpoint.get("trainer", {}).get("env_steps", 0))
    try:
        module = run.policy.export_module()
    except ExportUnsupportedError as err:  # e.g. a residual on an image-instruction base: the checkpoint holds it
        raise NoArtifactKindError(f"{run_dir}: its policy has no stateless export ({err})") from err
    if write_policy_artifact(run_dir, module, run.io_spec, env_steps) is None:
        raise NoArtifactKindError(
            f"{run_dir}: its policy ({type(module).__name__}) has no artifact kind yet, so export, eval "
            "--policy and the firmware tools cannot read it alone; evaluate it with `embodied eval` "
            "(torch; an image-instruction or residual policy also exports with --format onnx)"
        )
    return read_policy_artifact(path)


def check_artifact_fits(artifact: PolicyArtifact, env: Any, run_dir: Path) -> None:
    """Raise naming both files when the env ``config.yaml`` builds does not read and write what
    the trained policy does (``env.action_history`` edited after training, say)."""
    io_spec = getattr(env, "io_spec", None)
    built = io_spec() if callable(io_spec) else None
    why = artifact.io_spec.mismatch(built) if built is not None else None
    if why is None:
        return
    assert built is not None
    changed = _changed_keys(artifact.io_spec.extra.get("task_cfg"), built.extra.get("task_cfg"), "env.")
    edited = "; ".join(f"{key} is {now!r} in config.yaml, {then!r} when it was trained" for key, then, now in changed)
    raise EmbodiedError(
        f"{Path(run_dir) / CONFIG_FILE} does not fit {Path(run_dir) / POLICY_FILE}: "
        + (f"{edited} ({why})" if edited else f"{why}; was config.yaml (env.*) edited after training?")
    )


def _changed_keys(trained: Any, now: Any, prefix: str) -> list[tuple[str, Any, Any]]:
    """``(dotted key, trained value, current value)`` where two task configs (as the policy's
    ``extra.task_cfg`` records them) differ; at most 5."""
    if isinstance(trained, dict) and isinstance(now, dict):
        rows: list[tuple[str, Any, Any]] = []
        for key in trained.keys() & now.keys():
            rows += _changed_keys(trained[key], now[key], f"{prefix}{key}.")
        return sorted(rows)[:5]
    return [] if trained == now else [(prefix.rstrip("."), trained, now)]


def export_run(run_dir: Path, fmt: str = "all", record: bool = True) -> ExportReport:
    """Export the run's policy artifact to ``RUN_DIR/export/`` (``fmt``: a format name or ``all``).

    ``record``: also check parity on observations of a short rollout of the policy in the run's
    own task (besides random probes)."""
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).is_file():
        raise EmbodiedError(
            f"{run_dir}: not a run directory (no {CONFIG_FILE}); pass the folder `embodied train` printed"
        )
    selected(fmt)  # an unknown format fails before the artifact is read
    try:
        artifact = policy_artifact(run_dir)
    except NoArtifactKindError:
        from embodied.training.image_instruction_export import export_image_instruction_run
        from embodied.training.lerobot_residual_export import export_lerobot_residual_run
        from embodied.training.lerobot_run_export import export_lerobot_run
        from embodied.training.residual_export import export_residual_run
        from embodied.training.run import load_run

        # policies no artifact kind describes: image-instruction flow policies, residuals on a frozen base
        # (the checkpoint is loaded once for both: a residual's base is rebuilt with it)
        run = load_run(run_dir)
        report = (
            export_lerobot_residual_run(run, fmt)
            or export_residual_run(run, fmt)
            or export_lerobot_run(run, fmt)
            or export_image_instruction_run(run, fmt)
        )
        if report is None:
            raise
        return report
    cfg = load_experiment(run_dir / CONFIG_FILE)
    env_cfg = eager_task_cfg(cfg.env)  # a few hundred recorded steps: compiling would cost more

    def make_env(num_envs: int, seed: int) -> Any:
        return registry.make_env(cfg.task_name, env_cfg, num_envs, "cpu", seed)

    env = make_env(1, 0)
    try:
        check_artifact_fits(artifact, env, run_dir)
    finally:
        env.close()
    source_run = str(run_dir.resolve())
    if IMAGE_GROUP in artifact.obs_groups:
        return export_image_artifact(artifact, export_dir(run_dir), fmt, make_env, record, source_run)
    recorded = record_observations(artifact.policy(), make_env) if record else None
    return export_artifact(artifact, export_dir(run_dir), fmt, recorded, source_run=source_run)


def export_image_artifact(
    artifact: PolicyArtifact,
    out: Path,
    fmt: str,
    make_env: Callable[[int, int], Any],
    record: bool,
    source_run: str = "",
) -> ExportReport:
    """Export an image policy's artifact (:mod:`embodied.export.image_onnx`) into ``out``. Only
    ONNX holds such a policy: ``--format c`` fails naming the first convolution, ``all`` writes
    ONNX alone. The graph is traced from the artifact's module, so ``model_sha256`` is what
    :func:`embodied.export.bundle.export_model_sha256` gives for the artifact."""
    if fmt != "onnx":
        if fmt != ALL:
            raise EmbodiedError(unsupported_kind_reason(fmt, artifact))
        log.info("an image policy has only an onnx export; writing onnx")
    module = artifact.module()
    env = make_env(4 if record else 1, 0)
    try:
        camera = env.camera if isinstance(env, RenderingEnv) else ""
        recorded = record_inputs(module, env, steps=8) if record else None
    finally:
        env.close()
    result = export_image_onnx(module, artifact.io_spec, out, recorded, camera, source_run)
    report = ExportReport(model_sha256=result.model_sha256, num_macs=artifact.description.num_macs)
    report.written += [out / POLICY_IO_FILENAME, result.path]
    report.formats["onnx"] = FormatResult([result.path], result.max_abs_err)
    return report


def ensure_export(run_dir: Path, fmt: str = "all") -> None:
    """Export ``fmt`` when ``RUN_DIR/export`` lacks one of its files; an existing export is
    left as it is (its readers check it against ``policy_io.json`` and name what differs)."""
    out = export_dir(run_dir)
    files = [POLICY_IO_FILENAME, *(f for exporter in selected(fmt) for f in exporter.files)]
    missing = [f for f in files if not (out / f).is_file()]
    if missing:
        log.info("%s lacks %s: exporting %s", out, ", ".join(missing), fmt)
        export_run(run_dir, fmt)


__all__ = [
    "NoArtifactKindError",
    "PolicyArtifactError",
    "check_artifact_fits",
    "checkpoint_seal",
    "ensure_export",
    "export_run",
    "policy_artifact",
    "write_policy_artifact",
]
