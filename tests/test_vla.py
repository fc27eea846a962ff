"""The VLA interface in the core environment: LeRobot's batch from an observation dict, the
action-range mapping, and that importing the adapter never imports lerobot.

The adapter around a real LeRobot policy is tested in its own environment
(tests/test_vla_lerobot.py, ``bash scripts/setup_lerobot.sh``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from embodied.errors import EmbodiedError
from embodied.policies.vla import (
    LEROBOT_IMAGE_PREFIX,
    LEROBOT_STATE_KEY,
    LEROBOT_TASK_KEY,
    actions_to_unit,
    lerobot_batch,
)


def test_importing_the_adapter_does_not_import_lerobot() -> None:
    code = "import sys, embodied.policies.vla; print('lerobot' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_lerobot_batch_keys_layout_and_range() -> None:
    images = torch.zeros(2, 5, 7, 3, dtype=torch.uint8)
    images[0, 1, 2] = torch.tensor([255, 0, 51], dtype=torch.uint8)
    obs = {"policy": torch.arange(8.0).reshape(2, 4), "image": images}
    batch = lerobot_batch(obs, "push the block", {"front": "image"})
    assert set(batch) == {LEROBOT_STATE_KEY, LEROBOT_IMAGE_PREFIX + "front", LEROBOT_TASK_KEY}
    front = batch[LEROBOT_IMAGE_PREFIX + "front"]
    assert front.shape == (2, 3, 5, 7) and front.dtype == torch.float32
    # channels first, row/column kept, 255 -> 1.0
    torch.testing.assert_close(front[0, :, 1, 2], torch.tensor([1.0, 0.0, 0.2]))
    assert float(front.sum()) == pytest.approx(1.2)
    torch.testing.assert_close(batch[LEROBOT_STATE_KEY], obs["policy"])
    assert batch[LEROBOT_TASK_KEY] == ["push the block", "push the block"]


def test_lerobot_batch_refuses_float_images_and_missing_cameras() -> None:
    obs = {"policy": torch.zeros(2, 4), "image": torch.zeros(2, 5, 7, 3)}
    with pytest.raises(EmbodiedError, match="uint8"):
        lerobot_batch(obs, "push", {"front": "image"})
    with pytest.raises(EmbodiedError, match="'wrist'"):
        lerobot_batch({"policy": torch.zeros(2, 4)}, "push", {"front": "wrist"})


def test_actions_to_unit_maps_the_range_ends() -> None:
    low, high = torch.tensor([0.0, -2.0]), torch.tensor([4.0, 2.0])
    chunk = torch.tensor([[[0.0, -2.0], [4.0, 2.0], [2.0, 0.0], [9.0, -9.0]]])
    unit = actions_to_unit(chunk, low, high)
    torch.testing.assert_close(unit, torch.tensor([[[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0], [1.0, -1.0]]]))
