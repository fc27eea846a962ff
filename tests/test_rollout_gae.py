"""The shared on-policy pieces in embodied/data: GAE against a plain loop, time-out bootstrapping."""

from __future__ import annotations

import torch

import embodied.algos.ppo as ppo
from embodied.data.gae import compute_gae
from embodied.data.rollout import RolloutStorage, bootstrap_timeouts


def _gae_loop(rewards, values, dones, last_values, gamma, lam):  # type: ignore[no-untyped-def,unused-ignore]
    steps, n = rewards.shape
    adv = torch.zeros(steps, n)
    for e in range(n):
        running = 0.0
        for t in reversed(range(steps)):
            next_v = last_values[e] if t == steps - 1 else values[t + 1, e]
            nd = 1.0 - dones[t, e]
            delta = rewards[t, e] + gamma * next_v * nd - values[t, e]
            running = delta + gamma * lam * nd * running
            adv[t, e] = running
    return adv


def test_gae_matches_a_plain_loop() -> None:
    gen = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(9, 3, generator=gen), torch.randn(9, 3, generator=gen)
    dones = (torch.rand(9, 3, generator=gen) < 0.2).float()
    last = torch.randn(3, generator=gen)
    adv, ret = compute_gae(rewards, values, dones, last, 0.97, 0.9)
    torch.testing.assert_close(adv, _gae_loop(rewards, values, dones, last, 0.97, 0.9))
    torch.testing.assert_close(ret, adv + values)


def test_ppo_uses_the_shared_pieces() -> None:
    assert ppo.compute_gae is compute_gae and ppo.RolloutStorage is RolloutStorage


def test_timeouts_bootstrap_terminations_do_not() -> None:
    reward = torch.tensor([1.0, 1.0, 1.0, 1.0])
    terminated = torch.tensor([False, True, False, True])
    truncated = torch.tensor([False, False, True, True])  # the last is both: terminal wins
    seen: list[list[int]] = []

    def final_values(idx: torch.Tensor) -> torch.Tensor:
        seen.append(idx.tolist())
        return torch.full((len(idx),), 10.0)

    out, done = bootstrap_timeouts(reward, terminated, truncated, 0.9, final_values)
    assert seen == [[2]]
    torch.testing.assert_close(out, torch.tensor([1.0, 1.0, 10.0, 1.0]))
    torch.testing.assert_close(done, torch.tensor([0.0, 1.0, 1.0, 1.0]))
