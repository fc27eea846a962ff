"""An off-policy actor that also reads camera images, through the encoder its critics train.

The actor head (SAC's :class:`SquashedGaussianActor` or TD3's :class:`DeterministicActor`) is
built over ``D + F`` inputs: the normalized ``policy`` vector, then the :class:`ImageEncoder`'s
features of the ``"image"`` group. The encoder belongs to the critics' side of the learner (it is
trained by the critic loss, as in DrQ); this module holds a reference to it so that acting and
export see the current weights. Training losses feed the head features that were computed
(and detached) by the learner, so the actor's gradients never reach the encoder.

Shapes: ``B`` = batch, ``D`` = policy vector size, ``F`` = image features, ``A`` = action size,
``H, W`` = image size in pixels.
"""

from __future__ import annotations

import torch
from torch import nn

from embodied.env import IMAGE_GROUP, ObsDict
from embodied.normalizer import RunningNormalizer
from embodied.policies.cnn import ImageEncoder, ImageExportedPolicy
from embodied.policies.deterministic import DeterministicActor
from embodied.policies.squashed_gaussian import SquashedGaussianActor


class ImageActor(nn.Module):
    """``head(cat(norm(obs["policy"]), encoder(obs["image"])))`` (see module docstring)."""

    def __init__(
        self,
        head: SquashedGaussianActor | DeterministicActor,
        encoder: ImageEncoder,
        obs_dim: int,
        normalize_obs: bool = True,
        obs_clip: float = 10.0,
    ) -> None:
        """``head`` reads ``obs_dim + encoder.features`` inputs and normalizes none of them itself."""
        super().__init__()
        if head.obs_dim != obs_dim + encoder.features:
            raise ValueError(
                f"the head reads {head.obs_dim} inputs, not obs_dim + features = {obs_dim + encoder.features}"
            )
        if head.obs_norm is not None:
            raise ValueError("the head must not normalize: image features are not running statistics")
        self.head = head
        self.encoder = encoder
        self.obs_dim = obs_dim
        self.action_dim = head.action_dim
        self.obs_norm = RunningNormalizer(obs_dim, clip=obs_clip) if normalize_obs else None

    def head_parameters(self) -> list[nn.Parameter]:
        """What the actor's optimizer moves: the head's parameters (not the critics' encoder)."""
        return list(self.head.parameters())

    def normalize(self, obs_raw: torch.Tensor) -> torch.Tensor:
        """Raw policy vector ``[B, D]`` -> normalized ``[B, D]`` (identity without normalization)."""
        return obs_raw if self.obs_norm is None else self.obs_norm(obs_raw)

    def inputs(self, obs: ObsDict | torch.Tensor) -> torch.Tensor:
        """The head's input ``[B, D + F]`` of an observation dict with its ``"image"`` group."""
        if isinstance(obs, torch.Tensor) or IMAGE_GROUP not in obs:
            raise ValueError("this policy reads camera images: pass the observation dict with its 'image' group")
        return torch.cat([self.normalize(obs["policy"]), self.encoder(obs[IMAGE_GROUP])], dim=-1)

    def sample(self, head_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """SAC: reparameterized ``(action [B, A], log_prob [B])`` from head inputs ``[B, D + F]``."""
        if not isinstance(self.head, SquashedGaussianActor):
            raise TypeError(f"{type(self.head).__name__} has no action distribution to sample")
        return self.head.sample(head_in)

    def forward(self, head_in: torch.Tensor) -> torch.Tensor:
        """TD3: actions ``[B, A]`` from head inputs ``[B, D + F]``."""
        if not isinstance(self.head, DeterministicActor):
            raise TypeError(f"{type(self.head).__name__} is not a deterministic actor")
        action: torch.Tensor = self.head(head_in)
        return action

    @torch.no_grad()
    def act(
        self, obs: ObsDict | torch.Tensor, deterministic: bool = False, noise_std: torch.Tensor | float = 0.1
    ) -> torch.Tensor:
        """Actions ``[B, A]`` in [-1, 1]; ``noise_std`` is the TD3 head's exploration noise."""
        head_in = self.inputs(obs)
        if isinstance(self.head, DeterministicActor):
            return self.head.act(head_in, deterministic=deterministic, noise_std=noise_std)
        return self.head.act(head_in, deterministic=deterministic)

    def export_module(self) -> ImageExportedPolicy:
        """``(obs [B, D], image [B, H, W, 3] uint8) -> action [B, A]``: the deterministic action
        (SAC: tanh of the mean; TD3: the actor), normalizer and encoder folded in."""
        return ImageExportedPolicy.from_normalizer(
            self.encoder, self.head.deterministic_net(), self.obs_norm, self.obs_dim
        )
