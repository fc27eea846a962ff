"""``embodied export`` for a run whose policy is a residual on a frozen base (``residual``,
``o2o-residual``).

No policy artifact kind describes base and residual together, so the run's checkpoint is loaded
(its base from ``trainer.base_run``) and traced to ONNX (:mod:`embodied.export.onnx_traced`),
checked against torch with onnxruntime, and described by a ``policy_io.json`` as any vector
policy is. How depends on the base's chunk execution (:func:`base_chunk_spec`):

- one fresh plan per observation (an MLP actor, a flow base with ``exec_steps = 1``):
  :meth:`ResidualPolicy.export_module`, one pure ``obs [B, D] -> action [B, A]`` graph, is
  ``policy.onnx``;
- chunks run open-loop (``exec_steps > 1``) or blended (``temporal_ensemble``): the base keeps
  state between calls, so ``policy.onnx`` is the base's planner ``obs -> plan [B, H, A]`` with
  ``extra.action_chunk`` and ``residual.onnx`` the residual step ``(obs, base_action) -> action``
  (:mod:`embodied.residual_graph`); deployments and ``eval --policy onnx`` run the plans through
  the chunk executor and the residual on each executed action. The composition is checked
  against the torch policy's own ``act`` over a rollout of the run's task.

A base the graphs cannot carry (an image-instruction flow base) is refused naming it; only ONNX
holds traced graphs (``--format c`` is refused). A residual on a LeRobot base is exported as a
LeRobot checkpoint instead (:mod:`embodied.training.lerobot_residual_export`, which
``embodied export`` tries first).

Parity probes: the policy observations of a short rollout of the run's own task, plus random
observations spread over the residual's normalizer statistics.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from embodied.action_chunks import CHUNK_EXTRA_KEY, ChunkExecutor
from embodied.errors import EmbodiedError
from embodied.export.bundle import RECORD_ENVS, RECORD_STEPS, ExportReport, export_dir, record_observations
from embodied.export.formats import ALL, FormatResult
from embodied.export.onnx import PARITY_TOL
from embodied.export.onnx_traced import export_traced_inputs, export_traced_onnx
from embodied.export.policy_io import write_policy_io
from embodied.policies.residual import ResidualPolicy, base_chunk_spec
from embodied.policy_io import RESIDUAL_STEP_KEY, read_policy_io
from embodied.residual_graph import (
    BASE_ACTION_INPUT,
    OBS_INPUT,
    RESIDUAL_FILENAME,
    ResidualGraph,
    residual_step_entry,
)
from embodied.training.run import LoadedRun

RANDOM_PROBES = 256


def export_residual_run(run: LoadedRun, fmt: str) -> ExportReport | None:
    """Export a residual run (see the module docstring); None when the run's policy is not one."""
    if not isinstance(run.policy, ResidualPolicy):
        return None
    if fmt not in (ALL, "onnx"):
        raise EmbodiedError(
            f"format {fmt!r} cannot hold a residual policy (base and residual are traced into ONNX graphs); "
            "export it with --format onnx"
        )
    spec = base_chunk_spec(run.policy.base)
    if spec.temporal_ensemble or spec.exec_steps > 1:
        return _export_two_graphs(run)
    module = run.policy.export_module()  # names a base it cannot carry
    with torch.no_grad():
        recorded = record_observations(module, lambda n, seed: run.make_env(n, seed=seed))
    probes = np.concatenate([recorded, _spread_probes(run.policy)]).astype(np.float32)
    out = export_dir(run.run_dir)
    onnx = export_traced_onnx(module, run.io_spec.obs_dim, out, probes)
    report = ExportReport(model_sha256=onnx.model_sha256)
    report.written.append(write_policy_io(out, run.io_spec, onnx.model_sha256, str(Path(run.run_dir).resolve())))
    report.written.append(onnx.path)
    report.formats["onnx"] = FormatResult([onnx.path], max_abs_err=onnx.max_abs_err)
    return report


def _spread_probes(policy: ResidualPolicy) -> np.ndarray:
    """``[RANDOM_PROBES, D]`` observations spread over the residual's normalizer (2 std)."""
    step = policy.step_module()
    gen = torch.Generator().manual_seed(0)
    spread = step.obs_mean + 2.0 * step.obs_std * torch.randn(RANDOM_PROBES, step.obs_mean.shape[0], generator=gen)
    return spread.numpy()


def _rollout(policy: ResidualPolicy, run: LoadedRun) -> tuple[np.ndarray, np.ndarray]:
    """Policy observations ``[T, N, D]`` of a rollout of the torch policy and its actions ``[T, N, A]``
    (base plans as in training: the base's own chunk execution, started fresh)."""
    reset = getattr(policy.base, "reset_plan", None)
    if callable(reset):
        reset()
    env = run.make_env(RECORD_ENVS, seed=0)
    observations, actions = [], []
    try:
        obs = env.reset(seed=0)
        with torch.no_grad():
            for _ in range(RECORD_STEPS):
                action = policy.act(obs)
                observations.append(obs["policy"].detach().to("cpu", torch.float32).numpy())
                actions.append(action.detach().to("cpu", torch.float32).numpy())
                obs, *_ = env.step(action.to(env.device))
    finally:
        env.close()
        if callable(reset):
            reset()
    return np.stack(observations), np.stack(actions)


def _export_two_graphs(run: LoadedRun) -> ExportReport:
    """The base's planner and the residual step as two graphs (see the module docstring)."""
    policy = run.policy
    assert isinstance(policy, ResidualPolicy)
    planner = policy.base_planner()  # names a base it cannot carry
    step = policy.step_module()
    observations, torch_actions = _rollout(policy, run)
    obs_probes = np.concatenate([observations.reshape(-1, observations.shape[-1]), _spread_probes(policy)])
    obs_probes = obs_probes.astype(np.float32)
    with torch.no_grad():
        base_probes = planner(torch.from_numpy(obs_probes))
        base_probes = (base_probes[:, 0] if base_probes.dim() == 3 else base_probes).numpy()
    out = export_dir(run.run_dir)
    dim = run.io_spec.obs_dim
    base_onnx = export_traced_onnx(planner, dim, out, obs_probes)
    step_onnx = export_traced_inputs(
        step,
        {OBS_INPUT: torch.zeros(2, dim), BASE_ACTION_INPUT: torch.zeros(2, run.io_spec.action_dim)},
        out,
        {OBS_INPUT: obs_probes, BASE_ACTION_INPUT: base_probes.astype(np.float32)},
        filename=RESIDUAL_FILENAME,
    )
    io_spec = dataclasses.replace(
        run.io_spec, extra={**run.io_spec.extra, CHUNK_EXTRA_KEY: base_chunk_spec(policy.base).to_dict()}
    )
    source = str(Path(run.run_dir).resolve())
    written = write_policy_io(
        out, io_spec, base_onnx.model_sha256, source, **{RESIDUAL_STEP_KEY: residual_step_entry(step_onnx.model_sha256)}
    )
    err = _check_composition(out, observations, torch_actions)
    report = ExportReport(model_sha256=base_onnx.model_sha256)
    report.written += [written, base_onnx.path, step_onnx.path]
    report.formats["onnx"] = FormatResult([base_onnx.path, step_onnx.path], max_abs_err=max(err, step_onnx.max_abs_err))
    return report


def _check_composition(out: Path, observations: np.ndarray, torch_actions: np.ndarray) -> float:
    """Max ``|onnx - torch|`` of the composed export (planner through the chunk executor, then
    the residual step) over the recorded rollout ``[T, N, D]``; raises above the parity tolerance."""
    import onnxruntime as ort

    policy_io = read_policy_io(out)
    session = ort.InferenceSession(str(out / "policy.onnx"), providers=["CPUExecutionProvider"])
    residual = ResidualGraph(out, policy_io, lambda p: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]))

    def plan(x: np.ndarray) -> np.ndarray:
        (chunk,) = session.run(["action"], {"obs": x})
        return np.asarray(chunk)

    executor: ChunkExecutor[np.ndarray] = ChunkExecutor(plan, policy_io.chunk)
    err = 0.0
    for obs, want in zip(observations, torch_actions, strict=True):
        base = np.ascontiguousarray(executor(np.ascontiguousarray(obs)), dtype=np.float32)
        got = residual(np.ascontiguousarray(obs), base)
        err = max(err, float(np.max(np.abs(got - want))))
    if not err <= PARITY_TOL:
        raise EmbodiedError(
            f"{out}: the exported planner and residual step differ from the torch policy by {err:.3g} "
            f"(> {PARITY_TOL:g}) over a rollout; export is wrong"
        )
    return err
