"""The policy artifact (ckpt/policy.pt): written beside each checkpoint, read without the run's
algorithm, its kinds table, the compat path for older runs, and the exporter table it feeds."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from export_support import generic_io_spec, needs_gcc, quad_io_spec, random_policy, write_io
from torch import nn

from embodied.errors import EmbodiedError
from embodied.export import artifact as art
from embodied.export.artifact import (
    POLICY_FILE,
    PolicyArtifact,
    PolicyArtifactError,
    PolicyKind,
    UnknownPolicyKindError,
    read_policy_artifact,
)
from embodied.export.formats import EXPORTERS, format_choices


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A quad-hover PPO run of a few updates (weights barely trained: only the files matter)."""
    from embodied.experiment import replace_trainer, resolve_experiment
    from embodied.training.trainer import Trainer

    cfg = resolve_experiment("quad-hover", "ppo", None, ["trainer.total_env_steps=1024"], seed=0, num_envs=16)
    cfg = replace_trainer(cfg, progress=False, tensorboard=False, eval_every_env_steps=0, eval_episodes=4)
    run_dir = tmp_path_factory.mktemp("runs") / "quad"
    Trainer(cfg, run_dir, resume=False).train()
    return run_dir


def test_round_trip_keeps_every_weight_and_the_io_spec() -> None:
    module = random_policy(act="elu")
    artifact = PolicyArtifact.from_module(module, quad_io_spec(), env_steps=123)
    back = PolicyArtifact.from_bytes(artifact.to_bytes(), "mem")
    assert back.kind == "mlp" and back.env_steps == 123 and back.io_spec == quad_io_spec()
    for a, b in zip(artifact.description.layers, back.description.layers, strict=True):
        assert np.array_equal(a.weight, b.weight) and np.array_equal(a.bias, b.bias)
        assert (a.activation, a.elu_alpha) == (b.activation, b.elu_alpha)
    x = torch.randn(64, 146) * 3
    assert torch.allclose(back.module()(x), module(x), atol=1e-6)


def test_dimension_mismatch_with_the_io_spec_is_named() -> None:
    with pytest.raises(PolicyArtifactError, match="policy maps 6 -> 2 but its IOSpec describes 146 -> 4"):
        PolicyArtifact.from_module(random_policy(obs_dim=6, hidden=(8,), action_dim=2), quad_io_spec())


def test_damaged_or_foreign_files_are_named_errors(tmp_path: Path) -> None:
    data = bytearray(PolicyArtifact.from_module(random_policy(), quad_io_spec()).to_bytes())
    data[len(data) // 2] ^= 0x01
    with pytest.raises(PolicyArtifactError, match="checksum mismatch"):
        PolicyArtifact.from_bytes(bytes(data), "policy.pt")
    with pytest.raises(PolicyArtifactError, match="no policy artifact there"):
        read_policy_artifact(tmp_path / "missing.pt")


@dataclass(frozen=True)
class _Affine:
    """A toy policy description with nested fields: ``action = tanh(obs @ w.T) * gain``."""

    w: np.ndarray
    gain: float
    tags: tuple[str, ...] = ()

    @property
    def obs_dim(self) -> int:
        return int(self.w.shape[1])

    @property
    def action_dim(self) -> int:
        return int(self.w.shape[0])


class _AffineModule(nn.Module):
    def __init__(self, d: _Affine) -> None:
        super().__init__()
        self.d = d

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(obs @ torch.from_numpy(self.d.w).T) * self.d.gain


def test_a_new_policy_kind_is_one_table_entry_and_unknown_kinds_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    kind = PolicyKind("affine", _Affine, (_Affine,), lambda m: m.d, _AffineModule)
    monkeypatch.setitem(art.POLICY_KINDS, "affine", kind)
    d = _Affine(np.arange(12, dtype=np.float32).reshape(2, 6) / 10, 0.5, ("a", "b"))
    data = PolicyArtifact.from_module(_AffineModule(d), generic_io_spec(6, 2), kind="affine").to_bytes()
    back = PolicyArtifact.from_bytes(data, "mem")
    assert back.description.tags == ("a", "b") and back.description.gain == 0.5  # every field travels
    assert np.array_equal(back.description.w, d.w)
    monkeypatch.delitem(art.POLICY_KINDS, "affine")
    with pytest.raises(UnknownPolicyKindError, match="policy kind 'affine' is not known"):
        PolicyArtifact.from_bytes(data, "mem")


def test_a_description_field_the_torch_rebuild_ignores_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    arrays = PolicyArtifact.from_module(random_policy(), quad_io_spec()).description
    extended = dataclasses.make_dataclass(
        "MlpArrays", [("extra_stage", object, dataclasses.field(default=None))], bases=(type(arrays),), frozen=True
    )
    staged = extended(**{f.name: getattr(arrays, f.name) for f in dataclasses.fields(arrays)}, extra_stage=(1, 2))
    with pytest.raises(PolicyArtifactError, match=r"MlpArrays.extra_stage is set but not rebuilt"):
        art.POLICY_KINDS["mlp"].build(staged)


def test_every_checkpoint_writes_the_artifact_and_consumers_skip_the_algorithm(
    small_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from embodied import registry
    from embodied.experiment import load_experiment
    from embodied.export.layers import with_io_symmetry
    from embodied.training import run
    from embodied.training.evaluate import evaluate, load_policy
    from embodied.training.run_policy import checkpoint_seal, policy_artifact

    artifact = read_policy_artifact(small_run / POLICY_FILE)
    assert artifact.checkpoint_seal == checkpoint_seal(small_run) and len(artifact.checkpoint_seal) == 64
    assert artifact.env_steps >= 1024 and artifact.io_spec.extra["vehicle"] == "crazyflie"
    loaded = run.load_run(small_run)
    # the artifact carries the task's declared symmetry flip around the trained network
    trained = with_io_symmetry(loaded.policy.export_module(), loaded.io_spec)
    assert artifact.description.symmetry is not None
    x = torch.randn(32, artifact.io_spec.obs_dim)
    assert torch.allclose(policy_artifact(small_run).module()(x), trained(x), atol=1e-5)

    def no_algorithm(*_: object, **__: object) -> None:
        raise AssertionError("the run's algorithm was rebuilt")

    monkeypatch.setattr(run, "load_run", no_algorithm)
    monkeypatch.setattr(registry, "make_algo", no_algorithm)
    cfg = load_experiment(small_run / run.CONFIG_FILE)
    result = evaluate(
        lambda env: load_policy("torch", small_run, env),
        lambda n, seed: registry.make_env(cfg.task_name, cfg.env, n, "cpu", seed),
        episodes=4,
        seed=0,
    )
    assert result.episodes == 4


def test_runs_without_an_artifact_build_it_once_from_the_checkpoint(
    small_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import shutil

    from embodied.training.run_policy import policy_artifact

    old = tmp_path / "old"
    shutil.copytree(small_run, old)
    (old / POLICY_FILE).unlink()
    with caplog.at_level(logging.INFO, logger="embodied.training.run_policy"):
        built = policy_artifact(old)
    assert "has no ckpt/policy.pt: building it from the checkpoint" in caplog.text
    assert (old / POLICY_FILE).is_file()
    x = torch.randn(8, built.io_spec.obs_dim)
    assert torch.equal(built.module()(x), read_policy_artifact(small_run / POLICY_FILE).module()(x))
    # An artifact from another checkpoint (a crash between the two writes) is rebuilt too.
    stale = PolicyArtifact(built.kind, built.description, built.io_spec, 0, "0" * 64)
    (old / POLICY_FILE).write_bytes(stale.to_bytes())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="embodied.training.run_policy"):
        assert policy_artifact(old).checkpoint_seal != "0" * 64
    assert "was taken from another checkpoint" in caplog.text


def test_the_exporter_table_drives_the_cli_choices() -> None:
    from embodied.cli import build_parser
    from embodied.training.evaluate import policy_choices

    assert format_choices() == (*EXPORTERS, "all")
    assert policy_choices() == ("torch", *EXPORTERS)
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["export", "run", "--format", "tflite"])
    assert parser.parse_args(["export", "run", "--format", "onnx"]).fmt == "onnx"
    with pytest.raises(EmbodiedError, match="unknown export format 'tflite'"):
        from embodied.export.formats import selected

        selected("tflite")


@needs_gcc
def test_c_format_flies_any_policy_on_the_host(tmp_path: Path) -> None:
    """A policy without a vehicle: ``--policy c`` runs the generated network on the env's observation."""
    from embodied.export.bundle import export_module

    module = random_policy(obs_dim=6, hidden=(16,), action_dim=2, seed=3)
    export_module(module, generic_io_spec(6, 2), tmp_path / "export", "c")
    env = argparse.Namespace(obs_spec={"policy": (6,)}, action_dim=2, device=torch.device("cpu"))
    act = EXPORTERS["c"].load_policy(tmp_path, env)
    obs = torch.randn(20, 6)
    assert torch.allclose(act({"policy": obs}), module(obs), atol=1e-5)
    write_io(random_policy(obs_dim=6, hidden=(16,), action_dim=2, seed=4), generic_io_spec(6, 2), tmp_path / "export")
    with pytest.raises(EmbodiedError, match="generated for another model"):
        EXPORTERS["c"].load_policy(tmp_path, env)


def test_eval_exports_a_run_once_and_names_an_export_older_than_extra_vehicle(small_run: Path, tmp_path: Path) -> None:
    import json
    import shutil

    from embodied import registry
    from embodied.training.evaluate import load_policy

    run_dir = tmp_path / "run"
    shutil.copytree(small_run, run_dir)
    shutil.rmtree(run_dir / "export", ignore_errors=True)
    env = registry.make_env("quad-hover", registry.task_cfg("quad-hover"), 2, "cpu", 0)
    try:
        load_policy("onnx", run_dir, env)  # never exported: exported first
        io_path = run_dir / "export" / "policy_io.json"
        written = io_path.stat().st_mtime_ns
        load_policy("onnx", run_dir, env)
        assert io_path.stat().st_mtime_ns == written  # an existing export is used as it is
        data = json.loads(io_path.read_text())
        del data["extra"]["vehicle"]  # as written before extra.vehicle existed
        io_path.write_text(json.dumps(data))
        with pytest.raises(EmbodiedError, match=r"extra\.vehicle is '' but the run's policy says 'crazyflie'"):
            load_policy("onnx", run_dir, env)
        (run_dir / "export" / "policy.onnx").unlink()
        io_path.write_text(json.dumps(data | {"extra": data["extra"] | {"vehicle": "crazyflie"}}))
        with pytest.raises(EmbodiedError, match=r"policy\.onnx not found"):
            load_policy("onnx", run_dir, env)
    finally:
        env.close()


def test_streamed_seal_check_agrees_with_the_in_memory_one(tmp_path: Path) -> None:
    from embodied.checkpoint_seal import SealError, unseal, verify_file

    data = PolicyArtifact.from_module(random_policy(), quad_io_spec()).to_bytes()
    path = tmp_path / "sealed.pt"
    path.write_bytes(data)
    assert verify_file(path, chunk_bytes=1000) == data[-64:].decode()
    unseal(data, "mem")
    damaged = bytearray(data)
    damaged[123] ^= 0x10
    path.write_bytes(bytes(damaged))
    with pytest.raises(SealError, match="checksum mismatch"):
        verify_file(path, chunk_bytes=1000)
    path.write_bytes(data[:-10])
    with pytest.raises(SealError, match="no integrity seal"):
        verify_file(path)


def test_a_format_for_one_vehicle_refuses_other_policies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from embodied.export import formats
    from embodied.export.bundle import export_module

    class QuadOnly(formats.OnnxExporter):
        name = "quad-only"
        vehicle = "crazyflie"

    monkeypatch.setitem(formats.EXPORTERS, "quad-only", QuadOnly())
    with pytest.raises(EmbodiedError, match="format 'quad-only' needs a 'crazyflie' policy"):
        export_module(random_policy(obs_dim=6, hidden=(8,), action_dim=2), generic_io_spec(6, 2), tmp_path, "quad-only")
    report = export_module(random_policy(), quad_io_spec(), tmp_path, "quad-only")
    assert report.onnx_max_abs_err is None and report.max_abs_err("quad-only") is not None
