"""Camera images for the off-policy learners (``algo.encoder: cnn``), in the pattern of DrQ.

One :class:`ImageEncoder` per learner, trained by the critic loss only: the critics read its
features of the (randomly shifted) batch images, with gradients; the actor reads the same
features detached, so its loss moves its own head alone. The target critics read a target
encoder, a Polyak average of the encoder with the critics' factor ``tau``. Bootstrap actions
come from the actor on the encoder's (detached) features of the successor images.

Augmentation: every batch image, and its successor independently, is shifted by up to
``algo.image_shift_px`` pixels with replicated edges (:func:`random_shift`; 0: off).

Shapes: ``B`` = batch, ``D``/``C`` = actor/critic vector sizes, ``F`` = image features,
``H, W`` = image size in pixels.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from embodied.data.replay import ReplayBatch
from embodied.env import IMAGE_GROUP
from embodied.policies.cnn import ImageEncoder
from embodied.policies.image_shift import random_shift

if TYPE_CHECKING:  # offpolicy.py imports this module
    from embodied.algos.offpolicy import TrainBatch


class ImageFeatures:
    """Encoder, target encoder and augmentation of one off-policy learner (module docstring)."""

    def __init__(self, image_shape: tuple[int, ...], features: int, shift_px: int, device: torch.device) -> None:
        self.encoder = ImageEncoder(image_shape, features).to(device)
        self.target = copy.deepcopy(self.encoder).requires_grad_(False)
        self.shift_px = int(shift_px)
        self.features = self.encoder.features

    def encode(self, batch: TrainBatch, raw: ReplayBatch) -> TrainBatch:
        """``batch`` (normalized vectors ``[B, D]``/``[B, C]``) with the features of ``raw``'s images
        appended: ``critic_obs [B, C + F]`` carries the encoder's gradient, ``actor_obs [B, D + F]``
        and ``next_actor_obs`` are detached, ``next_critic_obs`` reads the target encoder."""
        image = random_shift(raw.obs[IMAGE_GROUP], self.shift_px)
        next_image = random_shift(raw.next_obs[IMAGE_GROUP], self.shift_px)
        feat = self.encoder(image)  # [B, F]
        with torch.no_grad():
            next_feat = self.encoder(next_image)
            next_target_feat = self.target(next_image)
        return dataclasses.replace(
            batch,
            actor_obs=torch.cat([batch.actor_obs, feat.detach()], dim=-1),
            next_actor_obs=torch.cat([batch.next_actor_obs, next_feat], dim=-1),
            critic_obs=torch.cat([batch.critic_obs, feat], dim=-1),
            next_critic_obs=torch.cat([batch.next_critic_obs, next_target_feat], dim=-1),
        )

    @staticmethod
    def for_actor(batch: TrainBatch) -> TrainBatch:
        """``batch`` with its critic inputs detached: the actor loss reaches neither the encoder nor
        the graph of the critic step that already ran backward."""
        return dataclasses.replace(batch, critic_obs=batch.critic_obs.detach())

    def state_dict(self) -> dict[str, Any]:
        """The target encoder (the encoder is saved with the actor that holds it)."""
        return {"target_encoder": self.target.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.target.load_state_dict(state["target_encoder"])
