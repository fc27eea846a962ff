"""A residual policy on a frozen base: ``a = clip(a_base + scale * r(obs, a_base), -1, 1)``.

The residual network ``r`` sees the normalized observation and the base's action and ends in
``tanh``; its last linear layer starts at exactly zero (weights and bias), so before training
the combined action *is* the base action, bit for bit. ``scale`` bounds how far the residual
may move the base (``|a - a_base| <= scale`` before the clip).

The base is any ``Policy`` (an MLP actor, a flow policy running action chunks, ...). It is
held outside this module's parameters and ``state_dict``: checkpoints hold only the residual,
and the base comes from its own run (``--base RUN_DIR``) every time the run is rebuilt.

Shapes: ``B`` = batch, ``D`` = observation size, ``A`` = action size.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import nn

from embodied.action_chunks import ChunkSpec
from embodied.algo import ExportUnsupportedError, Policy
from embodied.env import ObsDict
from embodied.errors import EmbodiedError
from embodied.normalizer import RunningNormalizer
from embodied.policies.deterministic import policy_obs
from embodied.policies.image_flow import ImageInstructionFlowPolicy
from embodied.policies.mlp import mlp
from embodied.policies.vla import LeRobotPolicy


def base_chunk_spec(base: Policy) -> ChunkSpec:
    """How a base executes its plans: a chunked policy's ``chunk_spec``, else one action per
    observation (a plain actor has no state between calls)."""
    spec = getattr(base, "chunk_spec", None)
    return spec if isinstance(spec, ChunkSpec) else ChunkSpec()


class FirstAction(nn.Module):
    """``forward(obs [B, D]) -> [B, A]``: a base's export, reduced to the first action of a fresh
    plan where it plans action chunks (``[B, H, A]``, e.g. a flow sampler)."""

    def __init__(self, plan: nn.Module) -> None:
        super().__init__()
        self.plan = plan

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.plan(obs)
        return out[:, 0] if out.dim() == 3 else out


def stateless_base(base: Policy) -> FirstAction:
    """The base's ``obs -> action`` of a fresh plan, for successors its running plan never saw."""
    return FirstAction(base.export_module())


def fresh_base_action(base: Policy) -> Callable[[ObsDict], torch.Tensor]:
    """``obs dict -> [B, A]``: the base's first action of a fresh plan, for successors its running
    plan never saw. An image-instruction or LeRobot base plans from the whole dict (images, instruction); any other
    base runs its stateless export on the ``policy`` group."""
    if isinstance(base, ImageInstructionFlowPolicy):
        return lambda obs: base.plan(obs, deterministic=True)[:, 0]
    if isinstance(base, LeRobotPolicy):
        return lambda obs: base.plan(obs)[:, 0]
    first = stateless_base(base)
    return lambda obs: first(obs["policy"])


class ResidualPolicy(nn.Module):
    """Frozen base plus a zero-initialized, scaled residual (see module docstring).

    ``forward(x [B, D + A])`` takes ``[normalized obs, base action]`` (the learner's input) and
    returns the combined action ``[B, A]``; ``act(obs)`` asks the base for its action first.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        scale: float,
        hidden: Sequence[int] = (256, 256),
        activation: str = "relu",
        normalize_obs: bool = True,
        obs_clip: float = 10.0,
    ) -> None:
        super().__init__()
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.scale = float(scale)
        self.net = mlp(obs_dim + action_dim, hidden, action_dim, act=activation, out_act="tanh")
        out_layer = self.net[-2]
        assert isinstance(out_layer, nn.Linear)
        with torch.no_grad():  # tanh(0) = 0: the residual starts at exactly nothing
            out_layer.weight.zero_()
            out_layer.bias.zero_()
        self.obs_norm = RunningNormalizer(obs_dim, clip=obs_clip) if normalize_obs else None
        self._base: list[Policy] = []  # a list keeps the base out of parameters and state_dict

    @property
    def base(self) -> Policy:
        if not self._base:
            raise EmbodiedError("the residual policy has no base policy: train it with --base RUN_DIR")
        return self._base[0]

    def set_base(self, base: Policy) -> None:
        self._base[:] = [base]

    def normalize(self, obs_raw: torch.Tensor) -> torch.Tensor:
        """Raw ``[B, D]`` -> normalized ``[B, D]`` (identity without normalization)."""
        return obs_raw if self.obs_norm is None else self.obs_norm(obs_raw)

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        """``scale * r(x)`` ``[B, A]`` for ``x = [obs_n, base_action]`` ``[B, D + A]``."""
        out: torch.Tensor = self.net(x) * self.scale
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Combined actions ``[B, A]`` from ``x = [obs_n, base_action]`` ``[B, D + A]``."""
        base_action = x[:, self.obs_dim :]
        return (base_action + self.residual(x)).clamp(-1.0, 1.0)

    def combine(self, obs_raw: torch.Tensor, base_action: torch.Tensor) -> torch.Tensor:
        """Combined actions ``[B, A]`` for raw observations ``[B, D]`` and base actions ``[B, A]``."""
        return self(torch.cat([self.normalize(obs_raw), base_action], dim=-1))

    @torch.no_grad()
    def act(self, obs: ObsDict | torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """Combined actions ``[B, A]``; the base acts deterministically (it is frozen) and so does
        the residual: exploration noise is the training algorithm's, not the policy's."""
        return self.combine(policy_obs(obs), self.base.act(obs, deterministic=True))

    def _refuse_image_instruction_base(self) -> None:
        if isinstance(self.base, ImageInstructionFlowPolicy):
            raise ExportUnsupportedError(
                "the residual policy's base is an image-instruction flow policy (image, instruction embedding and "
                "proprioception inputs), which a one-vector obs -> action export cannot carry; export the base itself"
            )

    def export_module(self) -> ResidualExport:
        """``obs [B, D] -> action [B, A]``: the base's export module and the residual in one graph.

        Only for a base without state between calls (one fresh plan per observation). A base
        that runs chunks open-loop or blends its last chunks keeps state no stateless module
        carries: :class:`ExportUnsupportedError` then names it, and the run exports as two
        graphs instead (:meth:`base_planner` and :meth:`step_module`, which ``embodied export``
        writes and the deploy runner composes around its chunk executor)."""
        self._refuse_image_instruction_base()
        spec = base_chunk_spec(self.base)
        if spec.temporal_ensemble or spec.exec_steps > 1:
            how = (
                "blends its last chunks (temporal_ensemble)"
                if spec.temporal_ensemble
                else (f"runs {spec.exec_steps} actions of each chunk open-loop (exec_steps > 1)")
            )
            raise ExportUnsupportedError(
                f"the residual policy's base ({type(self.base).__name__}) {how}, state that one stateless "
                "obs -> action graph cannot carry; `embodied export RUN_DIR` writes the base's planner and the "
                "residual step as two graphs instead (base_planner() and step_module())"
            )
        return ResidualExport(self)

    def base_planner(self) -> nn.Module:
        """The base's own stateless export, ``obs [B, D] -> plan [B, H, A]`` (or ``[B, A]``); its
        plans are executed as :func:`base_chunk_spec` says, outside the graph."""
        self._refuse_image_instruction_base()
        return self.base.export_module()

    def step_module(self) -> ResidualStep:
        """``(obs [B, D], base_action [B, A]) -> action [B, A]``: the residual step alone (a deep copy)."""
        return ResidualStep(self)


class ResidualStep(nn.Module):
    """The residual's step as one pure graph (a deep copy), given the base's executed action:
    ``forward(obs [B, D], base_action [B, A]) -> [B, A]`` =
    ``clamp(b + scale * r([clamp((obs - mean) / std, ±clip), b]), ±1)``."""

    obs_mean: torch.Tensor
    obs_std: torch.Tensor

    def __init__(self, policy: ResidualPolicy) -> None:
        super().__init__()
        self.residual_net = copy.deepcopy(policy.net).eval()
        norm = policy.obs_norm
        mean = torch.zeros(policy.obs_dim) if norm is None else norm.mean.detach().clone()
        std = torch.ones(policy.obs_dim) if norm is None else torch.sqrt(norm.var + norm.eps).detach().clone()
        self.register_buffer("obs_mean", mean.float())
        self.register_buffer("obs_std", std.float())
        self.obs_clip = float("inf") if norm is None else float(norm.clip)
        self.scale = policy.scale

    def forward(self, obs: torch.Tensor, base_action: torch.Tensor) -> torch.Tensor:
        obs_n = ((obs - self.obs_mean) / self.obs_std).clamp(-self.obs_clip, self.obs_clip)
        residual = self.residual_net(torch.cat([obs_n, base_action], dim=-1)) * self.scale
        return (base_action + residual).clamp(-1.0, 1.0)


class ResidualExport(nn.Module):
    """The combined policy as one pure graph (a deep copy): ``forward(obs [B, D] float32) -> [B, A]``,
    the residual step (:class:`ResidualStep`) on the first action of the base's fresh plan."""

    def __init__(self, policy: ResidualPolicy) -> None:
        super().__init__()
        self.base = stateless_base(policy.base)
        self.step = ResidualStep(policy)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.step(obs, self.base(obs))
