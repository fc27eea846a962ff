"""C51 categorical projection and the clipped double-Q distributional target."""

from __future__ import annotations

import math

import pytest
import torch

from embodied.policies.distributional import CriticEnsemble, make_support, project_distribution


def brute_force_projection(probs: torch.Tensor, reward: float, discount: float, support: list[float]) -> list[float]:
    """Atom by atom: clip ``r + d z_j`` into the support and split its mass between neighbours."""
    k = len(support)
    v_min, v_max = support[0], support[-1]
    dz = (v_max - v_min) / (k - 1)
    out = [0.0] * k
    for j in range(k):
        tz = min(max(reward + discount * support[j], v_min), v_max)
        pos = (tz - v_min) / dz
        if abs(pos - round(pos)) < 1e-9:  # exactly on an atom
            out[round(pos)] += float(probs[j])
            continue
        lo, hi = math.floor(pos), math.floor(pos) + 1
        out[lo] += float(probs[j]) * (hi - pos)
        out[hi] += float(probs[j]) * (pos - lo)
    return out


@pytest.mark.parametrize("num_atoms", [5, 51, 101])
def test_projection_matches_brute_force(num_atoms: int) -> None:
    gen = torch.Generator().manual_seed(num_atoms)
    support = make_support(-10.0, 10.0, num_atoms, "cpu").double()
    batch = 64
    probs = torch.softmax(torch.randn(batch, num_atoms, generator=gen, dtype=torch.float64) * 2, dim=-1)
    reward = torch.randn(batch, generator=gen, dtype=torch.float64) * 6  # some targets leave the support
    discount = torch.rand(batch, generator=gen, dtype=torch.float64)
    discount[:8] = 0.0  # terminal: all mass on r
    discount[8:16] = 1.0
    reward[16:24] = torch.round(reward[16:24] / (20 / (num_atoms - 1))) * (20 / (num_atoms - 1))  # land on atoms
    discount[16:24] = 1.0
    got = project_distribution(probs, reward, discount, support)
    for b in range(batch):
        expected = brute_force_projection(probs[b], float(reward[b]), float(discount[b]), support.tolist())
        torch.testing.assert_close(got[b], torch.tensor(expected, dtype=torch.float64), atol=1e-9, rtol=0)


def test_projection_keeps_mass_and_mean_inside_support() -> None:
    support = make_support(-5.0, 5.0, 21, "cpu")
    probs = torch.zeros(1, 21)
    probs[0, 8:13] = 0.2  # mass around 0, far from the edges
    reward, discount = torch.tensor([0.37]), torch.tensor([0.9])
    out = project_distribution(probs, reward, discount, support)
    assert float(out.sum()) == pytest.approx(1.0, abs=1e-6)
    expected_mean = 0.37 + 0.9 * float((probs * support).sum())
    assert float((out * support).sum()) == pytest.approx(expected_mean, abs=1e-5)


def test_terminal_target_is_a_point_mass_at_the_reward() -> None:
    support = make_support(-10.0, 10.0, 101, "cpu")
    probs = torch.softmax(torch.randn(3, 101), dim=-1)
    out = project_distribution(probs, torch.tensor([2.0, 2.1, 50.0]), torch.zeros(3), support)
    assert float(out[0, 60]) == pytest.approx(1.0)  # 2.0 is atom 60
    assert float(out[1, 60]) == pytest.approx(0.5) and float(out[1, 61]) == pytest.approx(0.5)
    assert float(out[2, 100]) == pytest.approx(1.0)  # clipped to v_max


def test_clipped_double_q_picks_the_lower_critic_per_sample() -> None:
    critic = CriticEnsemble(3, 1, (8,), num_critics=2, num_atoms=11, v_min=-5.0, v_max=5.0)
    # Critic 0 is sure of +2 on sample 0 and -2 on sample 1; critic 1 the opposite.
    logits = torch.full((2, 2, 11), -30.0)
    logits[0, 0, 7] = logits[0, 1, 3] = 30.0
    logits[1, 0, 3] = logits[1, 1, 7] = 30.0
    target = critic.td_target(logits, torch.zeros(2), torch.ones(2))
    assert int(target[0].argmax()) == 3 and int(target[1].argmax()) == 3
    scalar = CriticEnsemble(3, 1, (8,), num_critics=3)
    q = torch.tensor([[1.0, 5.0], [3.0, -1.0], [2.0, 0.0]]).unsqueeze(-1)  # [E, B, 1]
    y = scalar.td_target(q, torch.tensor([1.0, 1.0]), torch.tensor([0.5, 0.0]), bonus=torch.tensor([0.2, 0.2]))
    torch.testing.assert_close(y, torch.tensor([1.0 + 0.5 * (1.0 + 0.2), 1.0]))
