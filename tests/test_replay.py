"""Replay buffer: n-step targets at episode boundaries, ring wraparound, memory check, resume."""

from __future__ import annotations

import pytest
import torch

from embodied.data.replay import ReplayBuffer, replay_bytes
from embodied.errors import EmbodiedError

GAMMA = 0.9


def fill(buffer: ReplayBuffer, steps: int, seed: int = 0, p_term: float = 0.15, p_trunc: float = 0.15) -> dict:
    """Write ``steps`` vectorized steps whose observations encode ``(step, env)``.

    ``obs["policy"][t, e] = (t, e)``; the successor is ``(t + 0.5, e)`` so a test can tell which
    row a bootstrap observation came from; ``critic`` holds ``-(t, e)``. Returns the raw arrays.
    """
    gen = torch.Generator().manual_seed(seed)
    n = buffer.num_envs
    rewards = torch.randn(steps, n, generator=gen)
    term = torch.rand(steps, n, generator=gen) < p_term
    trunc = (torch.rand(steps, n, generator=gen) < p_trunc) & ~term
    env_ids = torch.arange(n, dtype=torch.float32)
    for t in range(steps):
        obs = torch.stack([torch.full((n,), float(t)), env_ids], dim=1)
        succ = torch.stack([torch.full((n,), t + 0.5), env_ids], dim=1)
        buffer.add(
            {"policy": obs, "critic": -obs},
            torch.full((n, 1), float(t)),
            rewards[t],
            term[t],
            trunc[t],
            {"policy": succ, "critic": -succ},
        )
    return {"reward": rewards, "term": term, "trunc": trunc}


def reference(data: dict, t: int, e: int, n_step: int) -> tuple[float, float, float]:
    """Brute-force ``(n-step return, discount, successor step)`` for the window starting at ``t``."""
    ret, k = 0.0, 0
    for k in range(n_step):
        ret += GAMMA**k * float(data["reward"][t + k, e])
        if data["term"][t + k, e] or data["trunc"][t + k, e]:
            break
    discount = 0.0 if data["term"][t + k, e] else GAMMA ** (k + 1)
    return ret, discount, t + k + 0.5


def check_batch(buffer: ReplayBuffer, data: dict, n_step: int, batch: int = 512) -> set[tuple[int, int]]:
    """Compare a sampled batch with the brute-force reference; return the sampled pairs."""
    b = buffer.sample(batch)
    pairs = set()
    for i in range(batch):
        t, e = int(b.obs["policy"][i, 0]), int(b.obs["policy"][i, 1])
        ret, discount, succ = reference(data, t, e, n_step)
        assert float(b.reward[i]) == pytest.approx(ret, abs=1e-5)
        assert float(b.discount[i]) == pytest.approx(discount, abs=1e-6)
        assert float(b.next_obs["policy"][i, 0]) == succ and int(b.next_obs["policy"][i, 1]) == e
        assert torch.equal(b.next_obs["critic"][i], -b.next_obs["policy"][i])
        assert torch.equal(b.obs["critic"][i], -b.obs["policy"][i])
        assert float(b.action[i, 0]) == t
        pairs.add((t, e))
    return pairs


def make(num_envs: int = 3, capacity: int = 50, n_step: int = 3) -> ReplayBuffer:
    return ReplayBuffer(num_envs, capacity, {"policy": (2,), "critic": (2,)}, 1, n_step=n_step, gamma=GAMMA, seed=1)


@pytest.mark.parametrize("n_step", [1, 3, 5])
def test_nstep_matches_brute_force(n_step: int) -> None:
    buffer = make(n_step=n_step)
    data = fill(buffer, 40)
    pairs = check_batch(buffer, data, n_step, batch=2048)
    # Every fully written window of every env is reachable, nothing beyond the last one.
    assert pairs == {(t, e) for t in range(40 - n_step + 1) for e in range(3)}


def test_terminated_truncated_and_plain_windows_all_occur() -> None:
    """The reference cases the comparison above covers really occur in the data."""
    buffer = make(n_step=3)
    data = fill(buffer, 40)
    cases = set()
    for t in range(38):
        for e in range(3):
            _, discount, succ = reference(data, t, e, 3)
            cases.add("term" if discount == 0 else "trunc" if succ < t + 2.5 else "full")
    assert cases == {"term", "trunc", "full"}


def test_wraparound_keeps_only_latest_rows() -> None:
    buffer = make(capacity=20, n_step=3)
    data = fill(buffer, 57)
    assert buffer.size == 20 and buffer.cursor == 57 % 20
    pairs = check_batch(buffer, data, 3, batch=2048)
    # The oldest surviving row is 57 - 20 = 37; windows must lie within rows 37..56.
    assert pairs == {(t, e) for t in range(37, 57 - 3 + 1) for e in range(3)}


def test_sampling_is_uniform_over_valid_pairs() -> None:
    buffer = make(num_envs=2, capacity=10, n_step=1)
    fill(buffer, 10)
    b = buffer.sample(40_000)
    keys = (b.obs["policy"][:, 0] * 2 + b.obs["policy"][:, 1]).long()
    counts = torch.bincount(keys, minlength=20).float()
    assert counts.min() > 0.8 * 2000 and counts.max() < 1.2 * 2000


def test_too_few_rows_to_sample() -> None:
    buffer = make(n_step=3)
    fill(buffer, 2)
    with pytest.raises(EmbodiedError, match="n_step"):
        buffer.sample(4)


def test_memory_error_names_size_and_fix() -> None:
    spec = {"policy": (146,), "critic": (40,)}
    need = replay_bytes(10**9, 4096, spec, 4)
    assert need > 10**15
    with pytest.raises(EmbodiedError, match="buffer_size_per_env"):
        ReplayBuffer(4096, 10**9, spec, 4)


def test_state_dict_roundtrip() -> None:
    buffer = make()
    data = fill(buffer, 30)
    with_rows = buffer.state_dict(include_contents=True)
    without = buffer.state_dict()
    assert "contents" not in without
    expected = buffer.sample(64)

    restored = make()
    restored.load_state_dict(with_rows)
    again = restored.sample(64)
    assert torch.equal(again.obs["policy"], expected.obs["policy"])
    assert torch.equal(again.reward, expected.reward)
    check_batch(restored, data, 3)

    empty = make()
    empty.load_state_dict(without)
    assert len(empty) == 0


@pytest.mark.parametrize("steps", [20, 80])
def test_saved_contents_hold_only_written_rows_and_restore_exactly(steps: int) -> None:
    """A partly filled ring saves ``size`` rows, a wrapped one all of them; both resume exactly."""
    buffer = make(capacity=50)
    fill(buffer, steps)
    state = buffer.state_dict(include_contents=True)
    assert state["contents"]["reward"].shape[0] == min(steps, 50)
    restored = make(capacity=50)
    restored.load_state_dict(state)
    assert (restored.cursor, restored.size) == (buffer.cursor, buffer.size)
    for mine, theirs in zip(buffer.sample(128).obs.values(), restored.sample(128).obs.values()):
        assert torch.equal(mine, theirs)


def test_checkpoint_of_a_partly_filled_ring_holds_its_rows_not_its_capacity(tmp_path) -> None:
    """A slice of the ring is a view of the whole storage, which torch.save writes in full: a
    camera run's first checkpoint then serialized gigabytes of empty rows (and was killed for
    memory). The checkpoint of 10 written rows of a 2,000-row ring must be about 10 rows' size,
    and load back to the same samples."""
    from embodied.training.run import load_checkpoint, save_checkpoint

    spec = {"policy": (2,), "image": (32, 32, 3)}
    buffer = ReplayBuffer(4, 2000, spec, 2, uint8_groups=("image",))
    for t in range(10):
        obs = {"policy": torch.full((4, 2), float(t)), "image": torch.full((4, 32, 32, 3), t, dtype=torch.uint8)}
        buffer.add(
            obs,
            torch.zeros(4, 2),
            torch.ones(4),
            torch.zeros(4, dtype=torch.bool),
            torch.zeros(4, dtype=torch.bool),
            obs,
        )
    path = save_checkpoint(tmp_path, {"replay": buffer.state_dict(include_contents=True)})
    row_bytes = replay_bytes(1, 4, spec, 2, ("image",))
    assert path.stat().st_size < 20 * row_bytes  # 10 rows and the archive's own overhead; capacity is 2,000
    restored = ReplayBuffer(4, 2000, spec, 2, uint8_groups=("image",))
    restored.load_state_dict(load_checkpoint(tmp_path)["replay"])
    assert torch.equal(restored.sample(16).obs["image"], buffer.sample(16).obs["image"])
