"""The policy artifact kind ``image``: image policies (PPO's ``encoder: cnn``, the SAC/FastTD3
image actor) as plain arrays and back, saved and loaded, exported from the artifact, compared by
``verify`` with the hash their export records, and refused by the C exporter and ``deploy``.

Small untrained modules built directly (no rendering), 40x40 images."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from export_support import generic_io_spec
from torch import nn

from embodied.errors import EmbodiedError
from embodied.export.artifact import PolicyArtifact, PolicyArtifactError, artifact_kind_of, read_policy_artifact
from embodied.export.bundle import export_artifact, export_model_sha256
from embodied.export.formats import EXPORTERS
from embodied.export.image_arrays import ConvLayer, image_arrays
from embodied.export.layers import DenseLayer
from embodied.io_spec import IOSpec
from embodied.policies.actor_critic import ActorCritic
from embodied.policies.cnn import ImageEncoder, ImageExportedPolicy
from embodied.policies.deterministic import DeterministicActor
from embodied.policies.image_actor import ImageActor
from embodied.policies.squashed_gaussian import SquashedGaussianActor
from embodied.training.run_policy import POLICY_FILE, export_image_artifact, write_policy_artifact

OBS, ACT, FEATURES = 9, 3, 16
IMAGE = (40, 40, 3)
CONV0 = r"encoder\.convs\[0\] \(Conv2d\(3 -> 16, kernel 8x8, stride 4\)\)"


def _stats(norm: nn.Module, seed: int) -> None:
    """Non-trivial running statistics, so the normalizer (and its clip) matters."""
    gen = torch.Generator().manual_seed(seed)
    norm.update(torch.randn(64, OBS, generator=gen) * 3.0 + 1.0)  # type: ignore[operator]


def ppo_module(seed: int = 0) -> ImageExportedPolicy:
    """PPO's image policy (``encoder: cnn``) as ``export_module()`` returns it."""
    torch.manual_seed(seed)
    policy = ActorCritic(OBS, OBS, ACT, actor_hidden=(32, 32), image_shape=IMAGE, image_features=FEATURES)
    assert policy.actor_norm is not None
    _stats(policy.actor_norm, seed)
    module = policy.export_module()
    assert isinstance(module, ImageExportedPolicy)
    return module


def actor_module(head: str, seed: int = 0) -> nn.Module:
    """The SAC (``squashed``) or FastTD3 (``deterministic``) image actor's ``export_module()``."""
    torch.manual_seed(seed)
    width = OBS + FEATURES
    net: SquashedGaussianActor | DeterministicActor
    if head == "squashed":
        net = SquashedGaussianActor(width, ACT, hidden=(32, 32), normalize_obs=False)
    else:
        net = DeterministicActor(width, ACT, hidden=(32,), activation="elu", normalize_obs=False, out_init_std=0.5)
    actor = ImageActor(net, ImageEncoder(IMAGE, FEATURES), OBS)
    assert actor.obs_norm is not None
    _stats(actor.obs_norm, seed)
    return actor.export_module()


MODULES = {"ppo": ppo_module, "sac": lambda: actor_module("squashed"), "td3": lambda: actor_module("deterministic")}


def inputs(num: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``obs [num, OBS]`` (wide enough to reach the clip) and ``image [num, 40, 40, 3]`` uint8."""
    gen = torch.Generator().manual_seed(seed)
    obs = torch.randn(num, OBS, generator=gen) * 40.0
    return obs, torch.randint(0, 256, (num, *IMAGE), dtype=torch.uint8, generator=gen)


def io_spec() -> IOSpec:
    return generic_io_spec(OBS, ACT)


@pytest.mark.parametrize("name", list(MODULES))
def test_describe_build_round_trip_computes_the_same_actions(name: str) -> None:
    module = MODULES[name]()
    assert artifact_kind_of(module) == "image"
    arrays = image_arrays(module)
    assert (arrays.obs_dim, arrays.action_dim, arrays.image_shape, arrays.features) == (OBS, ACT, IMAGE, FEATURES)
    assert [c.activation for c in arrays.convs] == ["relu"] * 3 and arrays.project_norm is not None
    rebuilt = PolicyArtifact.from_module(module, io_spec()).module()
    obs, image = inputs()
    with torch.no_grad():
        want, got = module(obs, image), rebuilt(obs, image)
    assert want.abs().max() > 0.05  # the policies act: a zero action would compare trivially
    assert (got - want).abs().max().item() <= 1e-6
    # the same layers under the same names: the state dicts match entry for entry
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in module.state_dict().items()}


def test_artifact_save_load_round_trip(tmp_path: Path) -> None:
    module = ppo_module()
    path = write_policy_artifact(tmp_path, module, io_spec(), env_steps=123)
    assert path == tmp_path / POLICY_FILE  # image runs now write ckpt/policy.pt as every run does
    loaded = read_policy_artifact(path)
    assert loaded.kind == "image" and loaded.env_steps == 123 and loaded.io_spec == io_spec()
    assert loaded.obs_groups == ("policy", "image")
    original = image_arrays(module)
    assert isinstance(loaded.description.convs[0], ConvLayer)
    assert loaded.description.convs[1].stride == original.convs[1].stride == (2, 2)
    np.testing.assert_array_equal(loaded.description.convs[2].weight, original.convs[2].weight)
    obs, image = inputs()
    policy = loaded.obs_policy()  # what `embodied eval` runs: the observation dict in
    with torch.no_grad():
        want = module(obs, image)
    assert (policy({"policy": obs, "image": image}) - want).abs().max().item() <= 1e-6
    with pytest.raises(PolicyArtifactError, match="observation dict"):
        loaded.policy()  # the vector-only callable cannot feed the image
    with pytest.raises(PolicyArtifactError, match="'image'"):
        policy({"policy": obs})


def test_describe_names_an_unsupported_layer() -> None:
    module = ppo_module()
    module.encoder.convs = nn.Sequential(
        *list(module.encoder.convs)[:2], nn.MaxPool2d(2), *list(module.encoder.convs)[2:]
    )
    with pytest.raises(PolicyArtifactError, match=r"encoder\.convs\[2\] \(MaxPool2d\)"):
        image_arrays(module)
    module = ppo_module()
    module.net[1] = nn.Sigmoid()
    with pytest.raises(PolicyArtifactError, match=r"net\[1\] \(Sigmoid\)"):
        image_arrays(module)
    module = ppo_module()
    module.encoder.add_module("extra", nn.Linear(2, 2))  # a layer the description would drop
    with pytest.raises(PolicyArtifactError, match=r"layer 'encoder\.extra' \(Linear\) is outside"):
        image_arrays(module)


def test_a_damaged_description_is_named_when_built(tmp_path: Path) -> None:
    artifact = PolicyArtifact.from_module(ppo_module(), io_spec())
    arrays = artifact.description
    wrong_head = (DenseLayer(np.zeros((32, OBS + FEATURES + 1), np.float32), np.zeros(32, np.float32), "tanh"),)
    damaged = [
        (dataclasses.replace(arrays, head=(*wrong_head, *arrays.head[1:])), r"head\[0\] reads 26 inputs but receives 25"),
        (dataclasses.replace(arrays, image_shape=(48, 48, 3)), r"project reads 32 inputs but the convolutions leave 32x2x2 = 128"),
        (dataclasses.replace(arrays, convs=(dataclasses.replace(arrays.convs[0], activation="gelu"), *arrays.convs[1:])), r"convs\[0\]: unknown activation 'gelu'"),
        (dataclasses.replace(arrays, convs=(dataclasses.replace(arrays.convs[0], bias=np.zeros(3, np.float32)), *arrays.convs[1:])), r"convs\[0\].*bias"),
    ]  # fmt: skip
    for description, message in damaged:
        data = dataclasses.replace(artifact, description=description).to_bytes()
        loaded = PolicyArtifact.from_bytes(data, "policy.pt")  # the file reads; building it names the fault
        with pytest.raises(PolicyArtifactError, match=message):
            loaded.module()


def test_export_writes_the_traced_graph_and_c_names_the_first_convolution(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    artifact = PolicyArtifact.from_module(actor_module("squashed"), io_spec())

    class NoCamera:
        def close(self) -> None:
            pass

    report = export_image_artifact(artifact, tmp_path, "all", lambda n, seed: NoCamera(), record=False)
    assert report.formats["onnx"].max_abs_err is not None and report.formats["onnx"].max_abs_err <= 1e-5
    assert report.model_sha256 == export_model_sha256(artifact.module())  # tracing twice: the same graph
    with pytest.raises(EmbodiedError, match=rf"format 'c' cannot hold an image policy: .*{CONV0}"):
        export_image_artifact(artifact, tmp_path, "c", lambda n, seed: NoCamera(), record=False)
    with pytest.raises(EmbodiedError, match=rf"format 'c' cannot hold an image policy: .*{CONV0}"):
        EXPORTERS["c"].export(artifact, tmp_path, np.zeros((1, OBS), np.float32))
    with pytest.raises(EmbodiedError, match="traces every input"):
        export_artifact(artifact, tmp_path, "onnx")  # the vector-only export path is not taken by mistake


def test_verify_compares_an_image_export_with_its_traced_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``verify``'s ``ensure_export`` hashes the artifact as the image export did (its traced
    graph), not as an MLP graph: the run's own export passes and one of other weights is named."""
    pytest.importorskip("onnxruntime")
    import embodied.training.run_policy as run_policy
    from embodied.export.image_onnx import export_image_onnx
    from embodied.verify.report import ensure_export

    artifact = PolicyArtifact.from_module(ppo_module(seed=0), io_spec())
    export_image_onnx(artifact.module(), artifact.io_spec, tmp_path / "export")
    monkeypatch.setattr(run_policy, "policy_artifact", lambda run_dir: artifact)
    ensure_export(tmp_path)  # the same weights: no error
    other = PolicyArtifact.from_module(ppo_module(seed=1), io_spec())
    monkeypatch.setattr(run_policy, "policy_artifact", lambda run_dir: other)
    with pytest.raises(EmbodiedError, match="exported from other weights"):
        ensure_export(tmp_path)


def test_deploy_refuses_an_image_policy_on_a_robot_without_a_camera(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("onnxruntime")
    from embodied.cli import main
    from embodied.export.image_onnx import export_image_onnx

    run_dir = tmp_path / "run"
    module = ppo_module()
    export_image_onnx(module, io_spec(), run_dir / "export", camera="top", source_run=str(run_dir))
    assert main(["deploy", str(run_dir), "--robot", "crazyflie_sim", "--print-launch"]) == 2
    want = f"{run_dir / 'export' / 'policy_io.json'}: the policy of {run_dir} reads camera images"
    assert want in caplog.text and "40x40x3" in caplog.text and "crazyflie_sim.yaml has no camera" in caplog.text
