"""The LeRobot adapter (``policies/vla.py``) around a real LeRobot ACT policy.

lerobot pins its own torch, so these tests run in their own environment:
``bash scripts/setup_lerobot.sh && .venv-lerobot/bin/python -m pytest tests/test_vla_lerobot.py``
(``scripts/test.sh`` does both unless ``EMBODIED_LEROBOT=0``). ACT is built from its config with
random weights (``pretrained_backbone_weights=None``: nothing is downloaded) and small sizes.
In the core environment they skip with that reason; tests/test_vla.py covers the batch mapping.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch

from embodied.action_chunks import ChunkSpec
from embodied.policies.vla import LEROBOT_IMAGE_PREFIX, LEROBOT_STATE_KEY, LeRobotPolicy

SETUP = "bash scripts/setup_lerobot.sh"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lerobot") is None,
    reason=f"lerobot is not installed here; its environment comes from {SETUP}",
)

N, SIZE_PX, STATE, ACTIONS, CHUNK, EXEC = 3, 48, 6, 2, 4, 2


def make_act(seed: int) -> Any:
    """A small ACT (one encoder and decoder layer, 64-wide) with random weights."""
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy

    identity = dict.fromkeys(("VISUAL", "STATE", "ACTION"), NormalizationMode.IDENTITY)
    cfg = ACTConfig(
        input_features={
            LEROBOT_STATE_KEY: PolicyFeature(FeatureType.STATE, (STATE,)),
            LEROBOT_IMAGE_PREFIX + "front": PolicyFeature(FeatureType.VISUAL, (3, SIZE_PX, SIZE_PX)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (ACTIONS,))},
        chunk_size=CHUNK,
        n_action_steps=EXEC,
        pretrained_backbone_weights=None,
        dim_model=64,
        n_heads=2,
        dim_feedforward=128,
        n_encoder_layers=1,
        n_decoder_layers=1,
        use_vae=False,
        normalization_mapping=identity,
        device="cpu",
    )
    torch.manual_seed(seed)
    return ACTPolicy(cfg).eval()


def observation(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "policy": torch.randn(N, STATE, generator=gen),
        "image": torch.randint(0, 256, (N, SIZE_PX, SIZE_PX, 3), generator=gen, dtype=torch.uint8),
    }


def wrap(act: Any, low: float = -1.0, high: float = 1.0) -> LeRobotPolicy:
    spec = ChunkSpec(act.config.chunk_size, act.config.n_action_steps)
    return LeRobotPolicy(
        act, "push the block to the target", {"front": "image"}, spec, [low] * ACTIONS, [high] * ACTIONS
    )


class CountingPlanner:
    """Passes calls through to ACT and counts them (to see when the chunk runner plans)."""

    def __init__(self, act: Any) -> None:
        self.act, self.calls = act, 0
        self.batches: list[dict[str, Any]] = []

    def predict_action_chunk(self, batch: dict[str, Any]) -> torch.Tensor:
        self.calls += 1
        self.batches.append(batch)
        return self.act.predict_action_chunk(batch)

    def reset(self) -> None:
        self.act.reset()


def test_act_chunk_shapes_and_range() -> None:
    policy = wrap(make_act(0))
    obs = observation(1)
    chunk = policy.plan(obs)
    assert chunk.shape == (N, CHUNK, ACTIONS) and chunk.dtype == torch.float32
    assert chunk.abs().max() <= 1.0
    action = policy.act(obs, deterministic=True)
    assert action.shape == (N, ACTIONS) and action.dtype == torch.float32


def test_act_is_deterministic_for_the_same_weights() -> None:
    obs = observation(2)
    a, b = wrap(make_act(7)).plan(obs), wrap(make_act(7)).plan(obs)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    other = wrap(make_act(8)).plan(obs)
    assert not torch.allclose(a, other)  # the seed reaches the weights: the check can fail
    # the images reach the actions (a blind policy would pass the other checks)
    moved = dict(obs, image=torch.flip(obs["image"], dims=(1,)))
    assert not torch.allclose(wrap(make_act(7)).plan(moved), a)


def test_chunks_run_through_the_chunk_runner() -> None:
    counter = CountingPlanner(make_act(3))
    policy = LeRobotPolicy(counter, "push", {"front": "image"}, ChunkSpec(CHUNK, EXEC))
    obs = [observation(10 + i) for i in range(5)]
    actions = [policy.act(o, deterministic=True) for o in obs]
    # plans at calls 0, 2, 4 (exec_steps = 2); each call in between acts the plan's next action
    assert counter.calls == 3
    first = policy.plan(obs[0])
    torch.testing.assert_close(actions[0], first[:, 0])
    torch.testing.assert_close(actions[1], first[:, 1])
    torch.testing.assert_close(actions[2], policy.plan(obs[2])[:, 0])
    batch = counter.batches[0]
    assert batch["task"] == ["push"] * N
    image = batch[LEROBOT_IMAGE_PREFIX + "front"]
    assert image.shape == (N, 3, SIZE_PX, SIZE_PX) and image.dtype == torch.float32
    before = counter.calls
    policy.act(obs[3], deterministic=True)
    assert counter.calls == before  # mid-plan: no new plan
    policy.reset_plan()
    policy.act(obs[0], deterministic=True)
    assert counter.calls == before + 1  # reset: the next call plans again


def test_action_range_maps_to_unit() -> None:
    act = make_act(4)
    raw = act.predict_action_chunk(
        {
            LEROBOT_STATE_KEY: observation(5)["policy"],
            LEROBOT_IMAGE_PREFIX + "front": observation(5)["image"].permute(0, 3, 1, 2).float() / 255.0,
        }
    )
    # a policy acting in [-4, 4] (a dataset's range) is scaled down by 4 into [-1, 1]
    scaled = wrap(act, -4.0, 4.0).plan(observation(5))
    torch.testing.assert_close(scaled, (raw / 4.0).clamp(-1.0, 1.0), rtol=1e-5, atol=1e-6)
