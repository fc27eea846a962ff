"""Flow-matching policy: a velocity field that carries Gaussian noise to an action chunk.

Rectified flow (Liu et al. 2022; Lipman et al. 2023): with ``x0 ~ N(0, I)`` and a
demonstrated action chunk ``x1``, ``x_t = t x1 + (1 - t) x0`` and the network regresses the
velocity ``x1 - x0``. Sampling integrates ``K`` Euler steps on the grid ``t_k = k / K``
(``k = 0 .. K-1``): ``x_{k+1} = x_k + v(x_k, t_k) / K``. The optional shortcut model (Frans
et al. 2024) also conditions on the step size ``d`` and trains a fraction of each batch on
self-consistency, ``v(x, t, 2d) = (v(x, t, d) + v(x + d v(x, t, d), t + d, d)) / 2``, so few
steps stay accurate. An action chunk holds ``H`` future actions; ``exec_steps`` of them run
before the policy plans again (receding horizon).

Shapes: ``B`` = batch, ``D`` = observation size, ``H`` = chunk, ``A`` = action size,
``F = H * A`` the flattened chunk, ``K`` = denoising steps.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from embodied.action_chunks import ChunkExecutor, ChunkSpec
from embodied.config import ConfigError
from embodied.env import ObsDict


@dataclass(frozen=True)
class FlowPolicyCfg:
    """Architecture and sampler of a flow-matching policy (must match between BC and fine-tuning)."""

    hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of the velocity network."""
    activation: Literal["mish", "relu", "tanh", "elu"] = "mish"
    """Hidden activation."""
    chunk: int = 4
    """Actions per predicted chunk ``H``."""
    exec_steps: int = 1
    """Actions of a chunk executed before planning again (receding horizon), 1 <= exec_steps <= chunk."""
    denoise_steps: int = 4
    """Euler steps ``K`` of the sampler (grid ``t_k = k / K``)."""
    temporal_ensemble: bool = False
    """Plan every step and act the mean of what the last ``chunk`` plans said for this step
    (needs ``exec_steps = 1``; :mod:`embodied.action_chunks`). Evaluation, exports and
    ``deploy`` execute the policy this way."""
    time_embed_dim: int = 16
    """Size of the sinusoidal embedding of ``t`` (and of the step size with ``shortcut``)."""
    shortcut: bool = False
    """Condition on the step size and train self-consistency (shortcut model)."""
    shortcut_fraction: float = 0.25
    """Share of each batch trained on self-consistency when ``shortcut`` is on."""
    deterministic_noise: Literal["zero", "fixed"] = "zero"
    """Start of the deterministic sampler (evaluation, exports): ``zero`` (the centre of the
    noise, so the sampler follows the distribution's middle), or ``fixed``, one draw of
    ``N(0, I)`` from ``noise_seed`` stored with the weights (a typical start, but one fixed
    quantile of the action distribution for every state: biased where the clone is uncertain)."""
    noise_seed: int = 0
    """Seed of the fixed start of the deterministic sampler."""
    instruction: str = ""
    """Language instruction of an image-instruction flow policy (:mod:`embodied.policies.image_flow`): when set,
    the policy also conditions on its text embedding and, where the env renders a camera, on the
    images. Empty: a flow policy of the ``policy`` observation group alone."""

    def __post_init__(self) -> None:
        for name in ("chunk", "exec_steps", "denoise_steps", "time_embed_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"policy.{name} must be >= 1, got {getattr(self, name)}")
        if self.exec_steps > self.chunk:
            raise ConfigError(f"policy.exec_steps ({self.exec_steps}) must be <= policy.chunk ({self.chunk})")
        if self.temporal_ensemble and self.exec_steps != 1:
            raise ConfigError(
                f"policy.temporal_ensemble plans every step: policy.exec_steps must be 1, got {self.exec_steps}"
            )
        if self.time_embed_dim % 2:
            raise ConfigError(f"policy.time_embed_dim must be even, got {self.time_embed_dim}")
        if not 0.0 <= self.shortcut_fraction < 1.0:
            raise ConfigError(f"policy.shortcut_fraction must be in [0, 1), got {self.shortcut_fraction}")
        if any(w < 1 for w in self.hidden):
            raise ConfigError("policy.hidden widths must be >= 1")
        if self.deterministic_noise not in ("fixed", "zero"):
            raise ConfigError(f"policy.deterministic_noise must be 'zero' or 'fixed', got {self.deterministic_noise!r}")


OBS_CLIP = 10.0
"""Normalized observations are clipped to +-OBS_CLIP (a state far outside the demonstrations)."""

_ACTIVATIONS: dict[str, type[nn.Module]] = {"mish": nn.Mish, "relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU}


def time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features of ``t [B]`` in [0, 1] -> ``[B, dim]`` (frequencies 1 .. 1000)."""
    half = dim // 2
    freqs = torch.exp(torch.linspace(0.0, math.log(1000.0), half, device=t.device, dtype=t.dtype))
    angle = t[:, None] * freqs[None, :]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)


def mlp(sizes: list[int], activation: str) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(_ACTIVATIONS[activation]())
    return nn.Sequential(*layers)


class VelocityNet(nn.Module):
    """``v(x [B, F], t-features [B, E], obs_n [B, D]) -> [B, F]``; ``E`` doubles with shortcut."""

    def __init__(self, obs_dim: int, flat_dim: int, cfg: FlowPolicyCfg) -> None:
        super().__init__()
        embed = cfg.time_embed_dim * (2 if cfg.shortcut else 1)
        self.net = mlp([obs_dim + flat_dim + embed, *cfg.hidden, flat_dim], cfg.activation)

    def forward(self, x: torch.Tensor, t_feat: torch.Tensor, obs_n: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([obs_n, x, t_feat], dim=-1))


class FlowPolicy(nn.Module):
    """Flow-matching actor with a fixed observation normalizer (dataset statistics).

    Implements the ``Policy`` contract: ``act(obs, deterministic)`` and ``export_module()``.
    Deterministic sampling starts from the stored ``x0_fixed [F]`` (see
    ``FlowPolicyCfg.deterministic_noise``), so the sampler is a fixed function of the
    observation, which is what exports carry.
    """

    obs_mean: torch.Tensor
    obs_std: torch.Tensor
    x0_fixed: torch.Tensor

    def __init__(self, obs_dim: int, action_dim: int, cfg: FlowPolicyCfg, cond_dim: int | None = None) -> None:
        """``obs_dim`` = ``D`` of the ``policy`` group; ``cond_dim`` = ``C``, the size of what the
        velocity network is conditioned on (:meth:`condition`), ``D`` unless a subclass encodes more."""
        super().__init__()
        self.cfg = cfg
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.flat_dim = cfg.chunk * action_dim
        self.cond_dim = obs_dim if cond_dim is None else cond_dim
        self.velocity = VelocityNet(self.cond_dim, self.flat_dim, cfg)
        self.register_buffer("obs_mean", torch.zeros(obs_dim))
        self.register_buffer("obs_std", torch.ones(obs_dim))
        gen = torch.Generator().manual_seed(cfg.noise_seed)
        x0 = (
            torch.randn(self.flat_dim, generator=gen)
            if cfg.deterministic_noise == "fixed"
            else torch.zeros(self.flat_dim)
        )
        self.register_buffer("x0_fixed", x0)
        spec = ChunkSpec(cfg.chunk, cfg.exec_steps, cfg.temporal_ensemble)
        self.chunk_spec = spec
        """How this policy's chunks are executed (length, exec_steps, temporal_ensemble)."""
        # one executor per sampler: deterministic evaluation never mixes with stochastic plans
        # (the planner is passed per call: a deep copy of the policy must plan with its own weights)
        self._executors: dict[bool, ChunkExecutor[torch.Tensor]] = {
            True: ChunkExecutor(None, spec),
            False: ChunkExecutor(None, spec),
        }

    # ----------------------------------------------------------------------- normalization
    def set_obs_stats(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Freeze the normalizer to ``mean``/``std`` ``[D]`` (floored at 1e-3: constant fields stay finite)."""
        self.obs_mean.copy_(mean)
        self.obs_std.copy_(std.clamp_min(1e-3))

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        return ((obs - self.obs_mean) / self.obs_std).clamp(-OBS_CLIP, OBS_CLIP)

    def condition(self, obs: ObsDict | torch.Tensor) -> torch.Tensor:
        """What the velocity network is conditioned on, ``[B, C]``: here the normalized ``policy``
        group (``C = D``); a policy that also sees images and an instruction encodes them here."""
        return self.normalize(obs["policy"] if isinstance(obs, dict) else obs)

    # -------------------------------------------------------------------------- the field
    def time_features(self, t: torch.Tensor, step: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, E]`` features of times ``t [B]`` (and step sizes ``step [B]`` with shortcut)."""
        feat = time_embedding(t, self.cfg.time_embed_dim)
        if self.cfg.shortcut:
            step = step if step is not None else torch.full_like(t, 1.0 / self.cfg.denoise_steps)
            feat = torch.cat([feat, time_embedding(step, self.cfg.time_embed_dim)], dim=-1)
        return feat

    def grid(self, device: torch.device | None = None) -> torch.Tensor:
        """The sampling grid ``t_k = k / K``, ``[K]`` (the one grid for sampling and scoring)."""
        k = self.cfg.denoise_steps
        return torch.arange(k, device=device, dtype=torch.float32) / k

    def field(self, x: torch.Tensor, k: int, obs_n: torch.Tensor) -> torch.Tensor:
        """``v(x_k, t_k)`` ``[B, F]`` at grid step ``k`` for normalized observations."""
        t = torch.full((x.shape[0],), k / self.cfg.denoise_steps, device=x.device, dtype=x.dtype)
        return self.velocity(x, self.time_features(t), obs_n)

    def sample_chunk(self, obs_n: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        """Euler-integrate from ``x0 [B, F]``; the chunk ``[B, H, A]`` clipped to [-1, 1]."""
        x = x0
        for k in range(self.cfg.denoise_steps):
            x = x + self.field(x, k, obs_n) / self.cfg.denoise_steps
        return x.clamp(-1.0, 1.0).reshape(-1, self.cfg.chunk, self.action_dim)

    # --------------------------------------------------------------------------- training
    def bc_loss(
        self, obs_n: torch.Tensor, chunks: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Flow-matching loss for normalized observations ``[B, D]`` and chunks ``[B, H, A]``."""
        x1 = chunks.reshape(chunks.shape[0], -1)
        b = x1.shape[0]
        dev = x1.device
        x0 = torch.randn(x1.shape, generator=generator, device=dev)
        t = torch.rand(b, generator=generator, device=dev)
        if not self.cfg.shortcut:
            xt = t[:, None] * x1 + (1 - t[:, None]) * x0
            return (self.velocity(xt, self.time_features(t), obs_n) - (x1 - x0)).square().mean()
        # shortcut: the flow-matching rows use the smallest step; the rest train self-consistency
        n_sc = round(b * self.cfg.shortcut_fraction)
        levels = int(math.log2(128))
        d_small = torch.full((b,), 1.0 / 128, device=dev)
        xt = t[:, None] * x1 + (1 - t[:, None]) * x0
        fm = self.velocity(xt[n_sc:], self.time_features(t[n_sc:], d_small[n_sc:]), obs_n[n_sc:]) - (x1 - x0)[n_sc:]
        loss_fm = fm.square().mean()
        if n_sc == 0:
            return loss_fm
        exp = torch.randint(0, levels, (n_sc,), generator=generator, device=dev)
        d = 2.0 ** (-exp.float() - 1)  # half steps 1/2 .. 1/128, so 2d <= 1
        ts = (torch.rand(n_sc, generator=generator, device=dev) * (1 - 2 * d)).clamp_min(0)
        xs = ts[:, None] * x1[:n_sc] + (1 - ts[:, None]) * x0[:n_sc]
        o = obs_n[:n_sc]
        with torch.no_grad():
            v1 = self.velocity(xs, self.time_features(ts, d), o)
            v2 = self.velocity(xs + d[:, None] * v1, self.time_features(ts + d, d), o)
            target = 0.5 * (v1 + v2)
        loss_sc = (self.velocity(xs, self.time_features(ts, 2 * d), o) - target).square().mean()
        return (loss_fm * (b - n_sc) + loss_sc * n_sc) / b

    # ---------------------------------------------------------------------------- acting
    @torch.no_grad()
    def act(self, obs: ObsDict | torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """Actions ``[N, A]``: the next action of the current chunk, planning a new chunk every
        ``exec_steps`` calls, or the temporal ensemble of the last chunks (``temporal_ensemble``);
        deterministic: from ``x0_fixed``.

        With ``exec_steps > 1`` the plan is shared by all envs and not reset when one env's
        episode ends (this method does not see resets): such an env finishes the old plan first.
        """
        x = obs["policy"] if isinstance(obs, dict) else obs  # the executor's batch size
        return self._executors[deterministic].step(x, lambda _: self.plan(obs, deterministic))

    def plan(self, obs: ObsDict | torch.Tensor, deterministic: bool) -> torch.Tensor:
        """A fresh chunk ``[N, H, A]`` for raw observations (start: see :meth:`act`); no plan state is touched."""
        cond = self.condition(obs)
        if deterministic:
            x0 = self.x0_fixed.expand(cond.shape[0], -1)
        else:
            x0 = torch.randn(cond.shape[0], self.flat_dim, device=cond.device)
        return self.sample_chunk(cond, x0)

    def reset_plan(self) -> None:
        """Drop the chunks being executed (the next ``act`` plans anew)."""
        for executor in self._executors.values():
            executor.reset()

    def export_module(self) -> nn.Module:
        return FlowSampler.from_policy(self)


class FlowSampler(nn.Module):
    """The whole deterministic sampler as one graph: normalize, ``K`` unrolled Euler steps from
    the fixed start ``x0`` with the grid's time features baked in as constants, the chunk.

    ``forward(obs [B, D] float32) -> chunk [B, H, A]`` in [-1, 1]. ``velocity`` is the velocity
    network's ``nn.Sequential`` (input ``cat(obs_n, x, t_feat)``); ``time_feats [K, E]`` its time
    features at ``t_k = k / K``; ``x0 [F]``; ``exec_steps`` and ``temporal_ensemble`` travel with it to the exports.
    This is what the policy artifact (kind ``flow``) describes and rebuilds.
    """

    obs_mean: torch.Tensor
    obs_std: torch.Tensor
    time_feats: torch.Tensor
    x0: torch.Tensor

    def __init__(
        self,
        velocity: nn.Sequential,
        obs_mean: torch.Tensor,
        obs_std: torch.Tensor,
        time_feats: torch.Tensor,
        x0: torch.Tensor,
        chunk: int,
        exec_steps: int,
        obs_clip: float = OBS_CLIP,
        temporal_ensemble: bool = False,
    ) -> None:
        super().__init__()
        if x0.shape[-1] % chunk:
            raise ConfigError(f"FlowSampler: x0 has {x0.shape[-1]} entries, not a multiple of chunk={chunk}")
        self.velocity = velocity.eval()
        self.register_buffer("obs_mean", obs_mean.detach().clone().float())
        self.register_buffer("obs_std", obs_std.detach().clone().float())
        self.register_buffer("time_feats", time_feats.detach().clone().float())
        self.register_buffer("x0", x0.detach().clone().float())
        self.obs_clip = float(obs_clip)
        self.steps = int(time_feats.shape[0])
        self.chunk = int(chunk)
        self.exec_steps = int(exec_steps)
        self.temporal_ensemble = bool(temporal_ensemble)
        self.action_dim = int(x0.shape[-1]) // self.chunk

    @classmethod
    def from_policy(cls, policy: FlowPolicy) -> FlowSampler:
        """A deep copy of ``policy``'s deterministic sampler."""
        return cls(
            copy.deepcopy(policy.velocity.net),
            policy.obs_mean,
            policy.obs_std,
            policy.time_features(policy.grid()).detach(),
            policy.x0_fixed,
            policy.cfg.chunk,
            policy.cfg.exec_steps,
            temporal_ensemble=policy.cfg.temporal_ensemble,
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        obs_n = ((obs - self.obs_mean) / self.obs_std).clamp(-self.obs_clip, self.obs_clip)
        return self.integrate(obs_n)

    def integrate(self, cond: torch.Tensor) -> torch.Tensor:
        """The chunk ``[B, H, A]`` for what the velocity network is conditioned on, ``[B, C]``
        (the normalized observation here; an image-instruction sampler's encoded inputs)."""
        x = self.x0.expand(cond.shape[0], -1)
        for k in range(self.steps):
            feat = self.time_feats[k : k + 1].expand(cond.shape[0], -1)
            x = x + self.velocity(torch.cat([cond, x, feat], dim=-1)) / self.steps
        return x.clamp(-1.0, 1.0).reshape(-1, self.chunk, self.action_dim)


def action_entry_mask(chunk: int, slots: int, action_dim: int, positions: int | None = None) -> torch.Tensor:
    """``[chunk * slots]`` bool over a position-major chain state: True on the task's
    ``action_dim`` entries (the first slots) of the first ``positions`` chunk positions (all by
    default), False on padding slots and later positions."""
    mask = torch.zeros(chunk, slots, dtype=torch.bool)
    mask[: chunk if positions is None else positions, :action_dim] = True
    return mask.reshape(-1)
