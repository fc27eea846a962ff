"""``embodied export`` for a run whose policy is image-instruction (``policies/image_flow.py``).

Such a policy has no policy artifact kind (its graph takes an instruction embedding and, with a
camera, images beside the proprioception), so the run's checkpoint is loaded and its
:class:`~embodied.policies.image_flow.ImageInstructionSampler` is traced to ``RUN_DIR/export/policy.onnx``
(:mod:`embodied.export.image_instruction_onnx`); ``--format c`` is refused naming the first layer C has no
code for. ``policy_io.json`` is written as for any export (its observation fields describe the
proprioceptive ``policy`` group; the other inputs are named in the graph).

Parity probes: the observations of a short rollout of the run's own task (images included)
with the training instruction's embedding, plus random proprioception around the dataset
statistics with perturbed embeddings.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from embodied.action_chunks import CHUNK_EXTRA_KEY, ChunkSpec
from embodied.env import IMAGE_GROUP, RenderingEnv
from embodied.errors import EmbodiedError
from embodied.export.bundle import ExportReport, export_dir
from embodied.export.formats import ALL, FormatResult
from embodied.export.image_instruction_onnx import export_image_instruction_onnx, refuse_c_export
from embodied.export.image_onnx import IMAGE_INPUT_KEY, image_input_entry
from embodied.export.policy_io import write_policy_io
from embodied.io_spec import IOSpec
from embodied.policies.image_flow import ImageInstructionSampler
from embodied.policy_io import INSTRUCTION_INPUT_KEY
from embodied.training.run import LoadedRun

ROLLOUT_ENVS, ROLLOUT_STEPS, RANDOM_PROBES = 4, 16, 64


def image_instruction_sampler_of(
    run: LoadedRun,
) -> tuple[ImageInstructionSampler, list[dict[str, np.ndarray]], IOSpec, str, str] | None:
    """The run's image-instruction sampler, probe inputs, IOSpec, camera name and instruction, or None when its
    policy is not image-instruction."""
    module = run.policy.export_module()
    if not isinstance(module, ImageInstructionSampler):
        return None
    env = run.make_env(ROLLOUT_ENVS, seed=0)
    camera = env.camera if isinstance(env, RenderingEnv) else ""
    gen = torch.Generator().manual_seed(0)
    probes: list[dict[str, np.ndarray]] = []
    obs = env.reset(seed=0)
    with torch.no_grad():
        for _ in range(ROLLOUT_STEPS):
            probes.append(_inputs(module, obs, module.instruction_embedding.expand(ROLLOUT_ENVS, -1)))
            obs = env.step(run.policy.act(obs, deterministic=True))[0]
        n = RANDOM_PROBES
        proprio = module.obs_mean + module.obs_std * torch.randn(n, module.proprio_dim, generator=gen)
        embedding = module.instruction_embedding + 0.1 * torch.randn(
            n, module.instruction_embedding.shape[0], generator=gen
        )
        fake = {"policy": proprio}
        if IMAGE_GROUP in obs:
            fake[IMAGE_GROUP] = torch.randint(
                0, 256, (n, *obs[IMAGE_GROUP].shape[1:]), generator=gen, dtype=torch.uint8
            )
        probes.append(_inputs(module, fake, embedding))
    env.close()
    # the graph returns action chunks: policy_io.json says how they run (extra.action_chunk), as
    # for any chunked policy, so a deployment executes them as the run did
    spec = run.io_spec
    chunk = getattr(run.policy, "chunk_spec", None)
    if isinstance(chunk, ChunkSpec):
        spec = dataclasses.replace(spec, extra={**spec.extra, CHUNK_EXTRA_KEY: chunk.to_dict()})
    return module, probes, spec, camera, str(getattr(getattr(run.policy, "cfg", None), "instruction", ""))


def _inputs(
    module: ImageInstructionSampler, obs: dict[str, torch.Tensor], embedding: torch.Tensor
) -> dict[str, np.ndarray]:
    values = {"instruction_embedding": embedding, "proprio": obs["policy"]}
    if IMAGE_GROUP in obs:
        values["image"] = obs[IMAGE_GROUP]
    return {name: np.ascontiguousarray(values[name].cpu().numpy()) for name in module.input_names}


def export_image_instruction_run(run: LoadedRun, fmt: str) -> ExportReport | None:
    """Export an image-instruction run (see the module docstring); None when the run's policy is not one."""
    run_dir = run.run_dir
    found = image_instruction_sampler_of(run)
    if found is None:
        return None
    module, probes, io_spec, camera, instruction = found
    if fmt == "c":
        raise refuse_c_export(module)
    if fmt not in (ALL, "onnx"):
        raise EmbodiedError(
            f"format {fmt!r} cannot hold an image-instruction flow policy; export it with --format onnx"
        )
    merged = {name: np.concatenate([p[name] for p in probes]) for name in module.input_names}
    out = export_dir(run_dir)
    onnx = export_image_instruction_onnx(module, out, merged)
    report = ExportReport(model_sha256=onnx.model_sha256)
    # the camera input is described as for image policies; the embedding input by its name and
    # size, with the training instruction and its embedding (what a deployment feeds by default)
    extra: dict[str, object] = {
        INSTRUCTION_INPUT_KEY: {
            "name": "instruction_embedding",
            "size": module.embed_dim,
            "instruction": instruction,
            "embedding": [float(v) for v in module.instruction_embedding.tolist()],
        }
    }
    if module.encoder is not None:
        extra[IMAGE_INPUT_KEY] = image_input_entry(module.encoder.image_shape, camera)
    source = str(Path(run_dir).resolve())
    report.written.append(write_policy_io(out, io_spec, onnx.model_sha256, source, **extra))
    report.written.append(onnx.path)
    report.formats["onnx"] = FormatResult([onnx.path], max_abs_err=onnx.max_abs_err)
    return report
