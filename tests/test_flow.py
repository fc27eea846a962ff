"""Flow-matching policy: deterministic sampler, one time grid, ONNX parity, BC loss falls."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.config import ConfigError
from embodied.errors import EmbodiedError
from embodied.policies.flow import FlowPolicy, FlowPolicyCfg


def _policy(**kw: object) -> FlowPolicy:
    torch.manual_seed(0)
    p = FlowPolicy(6, 2, FlowPolicyCfg(hidden=(32, 32), **kw))  # type: ignore[arg-type]
    p.set_obs_stats(torch.linspace(-1, 1, 6), torch.linspace(0.5, 2, 6))
    return p


def test_deterministic_sampler_is_a_function_of_obs() -> None:
    p = _policy()
    obs = torch.randn(7, 6)
    a1 = p.act(obs, deterministic=True)
    p.reset_plan()
    a2 = p.act(obs, deterministic=True)
    assert torch.equal(a1, a2) and a1.shape == (7, 2)
    assert bool((a1.abs() <= 1).all())
    torch.manual_seed(1)
    p.reset_plan()
    s1 = p.act(obs)
    torch.manual_seed(1)
    p.reset_plan()
    assert torch.equal(s1, p.act(obs))
    p.reset_plan()
    assert not torch.equal(s1, p.act(obs))


def test_grid_is_k_over_k_and_sampler_uses_it() -> None:
    p = _policy(denoise_steps=3)
    assert torch.allclose(p.grid(), torch.tensor([0.0, 1 / 3, 2 / 3]))
    obs_n = p.normalize(torch.randn(4, 6))
    x = torch.zeros(4, p.flat_dim)
    for k in range(3):
        t = torch.full((4,), float(p.grid()[k]))
        x = x + p.velocity(x, p.time_features(t), obs_n) / 3
    assert torch.allclose(p.sample_chunk(obs_n, torch.zeros(4, p.flat_dim)).reshape(4, -1), x.clamp(-1, 1))


def test_receding_horizon_replans_every_exec_steps() -> None:
    p = _policy(chunk=4, exec_steps=2)
    obs = torch.randn(3, 6)
    a0, a1 = p.act(obs, deterministic=True), p.act(obs, deterministic=True)
    start = p.x0_fixed.expand(3, -1)
    chunk = p.sample_chunk(p.normalize(obs), start)
    assert torch.equal(a0, chunk[:, 0]) and torch.equal(a1, chunk[:, 1])
    a2 = p.act(obs + 1.0, deterministic=True)  # a new plan from the new observation
    assert torch.equal(a2, p.sample_chunk(p.normalize(obs + 1.0), start)[:, 0])
    with pytest.raises(ConfigError, match="exec_steps"):
        FlowPolicyCfg(chunk=2, exec_steps=3)


def test_deterministic_start_is_stored_and_seeded() -> None:
    fixed, again, zero = _policy(deterministic_noise="fixed"), _policy(deterministic_noise="fixed"), _policy()
    assert torch.equal(fixed.x0_fixed, again.x0_fixed) and float(fixed.x0_fixed.abs().sum()) > 0
    assert float(zero.x0_fixed.abs().sum()) == 0.0
    other = _policy(deterministic_noise="fixed", noise_seed=1)
    assert not torch.equal(other.x0_fixed, fixed.x0_fixed)
    assert "x0_fixed" in fixed.state_dict()


@pytest.mark.parametrize(("shortcut", "start"), [(False, "fixed"), (True, "fixed"), (False, "zero")])
def test_export_module_matches_policy_and_onnx(tmp_path: Path, shortcut: bool, start: str) -> None:
    pytest.importorskip("onnxruntime")
    from embodied.export.onnx_traced import export_traced_onnx

    p = _policy(shortcut=shortcut, denoise_steps=4, activation="tanh", deterministic_noise=start)
    module = p.export_module()
    obs = torch.randn(64, 6) * 3
    with torch.no_grad():
        want = p.act(obs, deterministic=True)
        got = module(obs)  # the whole chunk [B, H, A]; the policy acts its first action
    assert got.shape == (64, p.cfg.chunk, p.action_dim)
    assert torch.allclose(got[:, 0], want, atol=1e-6)
    result = export_traced_onnx(module, 6, tmp_path, obs.numpy())
    assert result.max_abs_err <= 1e-5
    import onnxruntime as ort

    session = ort.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    (out,) = session.run(["action"], {"obs": obs[:5].numpy()})
    np.testing.assert_allclose(out[:, 0], want[:5].numpy(), atol=1e-5)


def test_c_export_names_what_it_cannot_express() -> None:
    from embodied.export.layers import mlp_arrays

    with pytest.raises(EmbodiedError, match="FlowSampler"):
        mlp_arrays(_policy().export_module())


@pytest.mark.parametrize("shortcut", [False, True])
def test_bc_loss_falls_on_a_fixed_mapping(shortcut: bool) -> None:
    torch.set_num_threads(1)
    p = _policy(shortcut=shortcut, chunk=2)
    gen = torch.Generator().manual_seed(0)
    obs = torch.randn(512, 6)
    chunks = torch.tanh(obs[:, :4]).reshape(512, 2, 2)  # actions are a function of the observation
    opt = torch.optim.Adam(p.parameters(), lr=3e-3)
    obs_n = p.normalize(obs)
    untrained = float((p.act(obs, deterministic=True) - chunks[:, 0]).abs().mean())
    with torch.no_grad():
        first = float(p.bc_loss(obs_n, chunks, gen))
    for _ in range(300):
        idx = torch.randint(0, 512, (128,), generator=gen)
        loss = p.bc_loss(obs_n[idx], chunks[idx], gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
    p.reset_plan()
    err = (p.act(obs, deterministic=True) - chunks[:, 0]).abs().mean()
    with torch.no_grad():
        assert float(p.bc_loss(obs_n, chunks, gen)) < 0.5 * first
    assert untrained > 0.4 and float(err) < 0.25
