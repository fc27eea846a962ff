"""Gaussian MLP actor and MLP value critic with running observation normalization.

The actor is a mean network plus a state-independent log standard deviation; the critic may
read a different (privileged) observation group than the actor, with its own normalizer.
With ``image_shape`` the actor also sees the ``"image"`` group through a CNN
(:class:`~embodied.policies.cnn.ImageEncoder`) whose features are concatenated with the
normalized proprioceptive vector; a critic without a privileged group shares that encoder.
Shapes: ``B`` = batch, ``D`` = actor observation size, ``C`` = critic observation size,
``A`` = action size, ``P = H * W * 3`` pixels of an image, ``F`` = image features.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from embodied.env import IMAGE_GROUP, ObsDict
from embodied.normalizer import RunningNormalizer
from embodied.policies.cnn import ImageEncoder, ImageExportedPolicy
from embodied.policies.mlp import ExportedPolicy, mlp

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class ActorCritic(nn.Module):
    """Gaussian actor ``N(mean_net(norm(obs)), exp(log_std)^2)`` and critic ``V(norm_c(obs_c))``.

    Actions handed to an environment are clipped to [-1, 1]; log-probabilities are always
    evaluated on the unclipped sample so the PPO ratio stays a ratio of Gaussian densities.
    """

    def __init__(
        self,
        actor_obs_dim: int,
        critic_obs_dim: int,
        action_dim: int,
        actor_hidden: Sequence[int] = (64, 64),
        critic_hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        init_std: float = 1.0,
        init_action_mean: Sequence[float] | None = None,
        actor_output_gain: float | None = None,
        normalize_obs: bool = True,
        obs_clip: float = 10.0,
        separate_critic_obs: bool = False,
        image_shape: tuple[int, ...] | None = None,
        image_features: int = 64,
    ) -> None:
        """``separate_critic_obs``: the critic reads its own observation group (own normalizer).

        ``image_shape`` ``(H, W, 3)``: the actor (and a critic without its own group) also reads
        ``obs["image"]`` through an :class:`ImageEncoder` of ``image_features`` outputs.

        ``actor_output_gain``: if set, the actor's last layer weights are re-initialized
        orthogonally with this gain (a small gain makes the initial mean nearly state-independent,
        i.e. close to ``init_action_mean``). ``init_action_mean`` [A] sets the output bias.
        """
        super().__init__()
        self.actor_obs_dim = actor_obs_dim
        self.critic_obs_dim = critic_obs_dim
        self.action_dim = action_dim
        self.separate_critic_obs = separate_critic_obs
        self.encoder = ImageEncoder(image_shape, image_features) if image_shape is not None else None
        feature_dim = 0 if self.encoder is None else self.encoder.features
        self.image_numel = 0 if image_shape is None else math.prod(image_shape)
        self.actor_input_dim = actor_obs_dim + self.image_numel
        """Width of :meth:`actor_input` rows, ``D + P``: what on-policy storage keeps per step."""
        self.mean_net = mlp(actor_obs_dim + feature_dim, actor_hidden, action_dim, act=activation)
        critic_in = critic_obs_dim if separate_critic_obs else actor_obs_dim + feature_dim
        self.critic = mlp(critic_in, critic_hidden, 1, act=activation)
        self.log_std = nn.Parameter(torch.full((action_dim,), math.log(init_std)))
        self.actor_norm: RunningNormalizer | None = None
        self.critic_norm: RunningNormalizer | None = None
        if normalize_obs:
            self.actor_norm = RunningNormalizer(actor_obs_dim, clip=obs_clip)
            # Without a privileged group the critic sees the actor's observation: one normalizer
            # then serves both, so the statistics are merged once per step, not twice.
            if separate_critic_obs:
                self.critic_norm = RunningNormalizer(critic_obs_dim, clip=obs_clip)
        out_layer = self.mean_net[-1]
        assert isinstance(out_layer, nn.Linear)
        with torch.no_grad():
            if actor_output_gain is not None:
                nn.init.orthogonal_(out_layer.weight, gain=actor_output_gain)
            if init_action_mean is not None:
                if len(init_action_mean) != action_dim:
                    raise ValueError(
                        f"init_action_mean has {len(init_action_mean)} values, the action has {action_dim}"
                    )
                out_layer.bias.copy_(torch.as_tensor(init_action_mean, dtype=out_layer.bias.dtype))

    # --- observation handling -------------------------------------------------------------

    @staticmethod
    def policy_obs(obs: ObsDict | torch.Tensor) -> torch.Tensor:
        """The actor's raw observation ``[B, D]`` from an ObsDict (group ``policy``) or a tensor."""
        return obs if isinstance(obs, torch.Tensor) else obs["policy"]

    def critic_obs(self, obs: ObsDict) -> torch.Tensor:
        """The critic's raw observation ``[B, C]``: group ``critic`` if used, else ``policy``."""
        return obs["critic"] if self.separate_critic_obs else obs["policy"]

    def normalize_actor(self, obs_raw: torch.Tensor) -> torch.Tensor:
        """``[B, D]`` raw -> normalized ``[B, D]`` (identity without normalization)."""
        return obs_raw if self.actor_norm is None else self.actor_norm(obs_raw)

    def normalize_critic(self, obs_raw: torch.Tensor) -> torch.Tensor:
        """``[B, C]`` raw -> normalized ``[B, C]`` with the critic's (or shared) normalizer."""
        norm = self.critic_norm if self.separate_critic_obs else self.actor_norm
        return obs_raw if norm is None else norm(obs_raw)

    def actor_input(self, obs: ObsDict) -> torch.Tensor:
        """``[B, D + P]``: the normalized policy vector, then (image policies) the image's pixels
        flattened as floats 0..255, one row per sample so rollouts store it as one table."""
        x = self.normalize_actor(self.policy_obs(obs))
        if self.encoder is None:
            return x
        pixels = obs[IMAGE_GROUP].reshape(x.shape[0], -1).to(x.dtype)
        return torch.cat([x, pixels], dim=-1)

    def encode(self, actor_in: torch.Tensor) -> torch.Tensor:
        """:meth:`actor_input` rows ``[B, D + P]`` -> the networks' input ``[B, D + F]`` (identity
        without an encoder)."""
        if self.encoder is None:
            return actor_in
        d = self.actor_obs_dim
        image = actor_in[:, d:].reshape(actor_in.shape[0], *self.encoder.image_shape)
        return torch.cat([actor_in[:, :d], self.encoder(image)], dim=-1)

    def value_of(self, obs: ObsDict) -> torch.Tensor:
        """``V [B]`` of raw observations with the current normalizer statistics."""
        if self.separate_critic_obs:
            return self.value(self.normalize_critic(self.critic_obs(obs)))
        return self.value(self.encode(self.actor_input(obs)))

    @torch.no_grad()
    def update_normalizers(self, actor_obs_raw: torch.Tensor, critic_obs_raw: torch.Tensor | None) -> None:
        """Merge a batch of raw observations into the running statistics."""
        if self.actor_norm is not None:
            self.actor_norm.update(actor_obs_raw)
        if self.critic_norm is not None and critic_obs_raw is not None:
            self.critic_norm.update(critic_obs_raw)

    # --- distribution ---------------------------------------------------------------------

    def log_prob(self, action: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """Log-density ``[B]`` of unclipped ``action [B, A]`` under ``N(mean [B, A], std)``."""
        log_std = self.log_std
        z = (action - mean) * torch.exp(-log_std)
        return -(0.5 * z.square() + log_std + _HALF_LOG_2PI).sum(dim=-1)

    def entropy(self) -> torch.Tensor:
        """Entropy of the Gaussian (a scalar: the std does not depend on the state)."""
        return (self.log_std + 0.5 + _HALF_LOG_2PI).sum()

    # --- Policy protocol ------------------------------------------------------------------

    @torch.no_grad()
    def act(self, obs: ObsDict | torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """Actions ``[B, A]`` clipped to [-1, 1]; statistics are not updated here. An image
        policy needs an ObsDict with ``"image"``."""
        if isinstance(obs, torch.Tensor) and self.encoder is not None:
            raise ValueError("this policy reads camera images: pass the observation dict with its 'image' group")
        mean = self.mean_net(self.encode(self.actor_input({"policy": obs} if isinstance(obs, torch.Tensor) else obs)))
        if not deterministic:
            mean = mean + torch.exp(self.log_std) * torch.randn_like(mean)
        return mean.clamp(-1.0, 1.0)

    def value(self, critic_obs_norm: torch.Tensor) -> torch.Tensor:
        """State values ``[B]`` of normalized critic observations ``[B, C]``."""
        return self.critic(critic_obs_norm).squeeze(-1)

    def export_module(self) -> ExportedPolicy | ImageExportedPolicy:
        """Deterministic ``obs [B, D] -> clamp(mean, -1, 1) [B, A]`` with the normalizer folded in;
        an image policy's takes ``(obs, image [B, H, W, 3] uint8)``."""
        if self.encoder is not None:
            return ImageExportedPolicy.from_normalizer(self.encoder, self.mean_net, self.actor_norm, self.actor_obs_dim)
        return ExportedPolicy.from_normalizer(self.mean_net, self.actor_norm, self.actor_obs_dim)
