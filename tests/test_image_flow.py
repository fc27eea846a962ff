"""The image-instruction flow policy (``policies/image_flow.py``): the packaged text model, conditioning,
the ONNX export of its sampler (instruction embedding and proprioception inputs) and the C
refusal, and the fine-tuning algorithms building and loading it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.config import ConfigError
from embodied.errors import EmbodiedError
from embodied.export.image_instruction_onnx import export_image_instruction_onnx, refuse_c_export
from embodied.policies.flow import FlowPolicy, FlowPolicyCfg
from embodied.policies.image_flow import (
    IMAGE_FEATURES,
    TEXT_FEATURES,
    ImageInstructionFlowPolicy,
    ImageInstructionSampler,
    make_flow_policy,
)
from embodied.policies.text_embedding import EMBED_DIM, embed_instruction

pytest.importorskip("wordllama", reason='the VLA policy\'s text model: pip install "embodied[instruction]"')

INSTRUCTION = "push the block to the goal"
PROPRIO, ACTIONS = 6, 2


def test_text_model_runs_without_network_and_is_cached(tmp_path: Path) -> None:
    # a fresh process with no home (no download cache) and every proxy pointing nowhere:
    # the embedding must come from the files inside the wheel
    code = (
        "import socket\n"
        "def refuse(*a, **k): raise OSError('network disabled in this test')\n"
        "socket.socket.connect = refuse\n"
        "from embodied.policies.text_embedding import embed_instruction\n"
        f"print(float(embed_instruction({INSTRUCTION!r}).abs().sum()))\n"
    )
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert float(out.stdout.strip()) > 0.0
    a, b = embed_instruction(INSTRUCTION), embed_instruction(INSTRUCTION)
    assert a.shape == (EMBED_DIM,) and a.dtype == torch.float32
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert a.data_ptr() != b.data_ptr()  # each call gets its own tensor from the cache
    assert not torch.allclose(a, embed_instruction("open the drawer"))


def vla_policy(seed: int = 0) -> ImageInstructionFlowPolicy:
    torch.manual_seed(seed)
    cfg = FlowPolicyCfg(hidden=(32, 32), instruction=INSTRUCTION)
    policy = make_flow_policy({"policy": (PROPRIO,)}, ACTIONS, cfg)
    assert isinstance(policy, ImageInstructionFlowPolicy)
    policy.set_obs_stats(torch.linspace(-1, 1, PROPRIO), torch.linspace(0.5, 2, PROPRIO))
    return policy


def test_make_flow_policy_builds_vla_only_with_an_instruction() -> None:
    plain = make_flow_policy({"policy": (PROPRIO,)}, ACTIONS, FlowPolicyCfg(hidden=(32,)))
    assert type(plain) is FlowPolicy and plain.cond_dim == PROPRIO
    policy = vla_policy()
    assert policy.cond_dim == TEXT_FEATURES + PROPRIO
    obs = {"policy": torch.randn(5, PROPRIO)}
    cond = policy.condition(obs)
    assert cond.shape == (5, TEXT_FEATURES + PROPRIO)
    torch.testing.assert_close(cond[:, TEXT_FEATURES:], policy.normalize(obs["policy"]))
    # the text features are the projected instruction, the same for every row
    torch.testing.assert_close(cond[0, :TEXT_FEATURES], policy.text_proj(embed_instruction(INSTRUCTION)))
    action = policy.act(obs, deterministic=True)
    assert action.shape == (5, ACTIONS) and action.abs().max() <= 1.0


def probes(policy: ImageInstructionFlowPolicy, n: int = 64) -> dict[str, np.ndarray]:
    gen = torch.Generator().manual_seed(1)
    emb = policy.instruction_embedding.expand(n, -1) + 0.1 * torch.randn(n, EMBED_DIM, generator=gen)
    return {"instruction_embedding": emb.numpy().astype(np.float32), "proprio": 3 * torch.randn(n, PROPRIO).numpy()}


def test_onnx_export_matches_torch(tmp_path: Path) -> None:
    policy = vla_policy()
    sampler = policy.export_module()
    assert isinstance(sampler, ImageInstructionSampler) and sampler.input_names == ("instruction_embedding", "proprio")
    inputs = probes(policy)
    # the sampler is the policy's deterministic plan, with the instruction as an input
    proprio = torch.from_numpy(inputs["proprio"][:4])
    embedding = policy.instruction_embedding.expand(4, -1)
    torch.testing.assert_close(sampler(embedding, proprio), policy.plan({"policy": proprio}, deterministic=True))
    result = export_image_instruction_onnx(sampler, tmp_path, inputs)
    assert result.max_abs_err <= 1e-5 and result.path.is_file()
    import onnx

    graph = onnx.load(str(result.path)).graph
    assert [i.name for i in graph.input] == ["instruction_embedding", "proprio"]
    # the embedding input matters: a graph with the instruction folded in would ignore it
    import onnxruntime as ort

    session = ort.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    a = session.run(["action"], inputs)[0]
    b = session.run(["action"], {**inputs, "instruction_embedding": -inputs["instruction_embedding"]})[0]
    assert np.abs(a - b).max() > 1e-4


def test_c_export_is_refused_naming_the_layer() -> None:
    sampler = vla_policy().export_module()
    err = refuse_c_export(sampler)
    assert isinstance(err, EmbodiedError)
    # the flow head's Mish is the first layer with no C code; the inputs are named
    assert "head.velocity.1 (Mish)" in str(err) and "instruction_embedding, proprio" in str(err)


def camera_vla(seed: int = 0) -> ImageInstructionFlowPolicy:
    torch.manual_seed(seed)
    cfg = FlowPolicyCfg(hidden=(32, 32), instruction=INSTRUCTION)
    policy = make_flow_policy({"policy": (PROPRIO,), "image": (SIZE_PX, SIZE_PX, 3)}, ACTIONS, cfg)
    assert isinstance(policy, ImageInstructionFlowPolicy) and policy.encoder is not None
    return policy


SIZE_PX = 40


def camera_obs(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "policy": torch.randn(n, PROPRIO, generator=gen),
        "image": torch.randint(0, 256, (n, SIZE_PX, SIZE_PX, 3), generator=gen, dtype=torch.uint8),
    }


def test_camera_vla_conditions_on_images_and_trains_its_encoder() -> None:
    policy = camera_vla()
    obs = camera_obs(4)
    cond = policy.condition(obs)
    assert cond.shape == (4, IMAGE_FEATURES + TEXT_FEATURES + PROPRIO)
    assert policy.cond_dim == cond.shape[1]
    other = policy.condition({**obs, "image": torch.flip(obs["image"], dims=(1,))})
    assert not torch.allclose(cond[:, :IMAGE_FEATURES], other[:, :IMAGE_FEATURES])
    torch.testing.assert_close(cond[:, IMAGE_FEATURES:], other[:, IMAGE_FEATURES:])
    # the flow-matching loss reaches the encoder's convolutions (bc-flow trains them)
    loss = policy.bc_loss(cond, torch.zeros(4, policy.cfg.chunk, ACTIONS))
    loss.backward()
    assert policy.encoder is not None
    conv = policy.encoder.convs[0]
    assert isinstance(conv, torch.nn.Conv2d) and conv.weight.grad is not None and conv.weight.grad.abs().sum() > 0
    with pytest.raises(ConfigError, match="'image'"):
        policy.condition({"policy": obs["policy"]})


def test_camera_vla_onnx_has_image_input_and_c_names_the_convolution(tmp_path: Path) -> None:
    policy = camera_vla()
    sampler = policy.export_module()
    assert sampler.input_names == ("image", "instruction_embedding", "proprio")
    obs = camera_obs(32, seed=3)
    inputs = {
        "image": obs["image"].numpy(),
        "instruction_embedding": policy.instruction_embedding.expand(32, -1).numpy().copy(),
        "proprio": obs["policy"].numpy(),
    }
    torch.testing.assert_close(
        sampler(*(torch.from_numpy(v) for v in inputs.values())), policy.plan(obs, deterministic=True)
    )
    result = export_image_instruction_onnx(sampler, tmp_path, inputs)
    assert result.max_abs_err <= 1e-5
    import onnx

    graph = onnx.load(str(result.path)).graph
    assert [i.name for i in graph.input] == ["image", "instruction_embedding", "proprio"]
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT8
    assert "encoder.convs.0 (Conv2d)" in str(refuse_c_export(sampler))


def test_former_module_name_still_imports_with_a_warning() -> None:
    import importlib
    import sys

    sys.modules.pop("embodied.policies.vla_flow", None)
    with pytest.warns(DeprecationWarning, match="embodied.policies.image_flow"):
        old = importlib.import_module("embodied.policies.vla_flow")
    assert old.VLAFlowPolicy is ImageInstructionFlowPolicy
