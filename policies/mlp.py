"""Multilayer perceptrons: the network family every exporter (ONNX, C99) must express.

Networks are plain ``nn.Sequential`` stacks of ``nn.Linear`` and activation modules, so the
C exporter can walk them layer by layer.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from embodied.normalizer import RunningNormalizer
from embodied.policies.cpu_tanh import tanh_from_sigmoid, use_sigmoid_tanh


class _TanhFromSigmoid(torch.autograd.Function):
    """``tanh(x) = 2 sigmoid(2x) - 1`` with tanh's own backward ``grad * (1 - y^2)``."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        y = tanh_from_sigmoid(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return torch.ops.aten.tanh_backward(grad, y)


class Tanh(nn.Tanh):
    """``nn.Tanh`` with this CPU's faster float32 kernel.

    On some CPUs ``torch.tanh`` is several times slower than ``2 sigmoid(2x) - 1``, on others
    several times faster (:mod:`embodied.policies.cpu_tanh` measures once per process and logs the
    choice). The two agree with ``torch.tanh`` to ~1e-7 absolute (exporters emit the real tanh,
    whose outputs match within the 1e-5 parity bound). Other devices and dtypes, and compiled
    graphs, use ``torch.tanh``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            x.device.type == "cpu"
            and x.dtype == torch.float32
            and not torch.compiler.is_compiling()
            and use_sigmoid_tanh()
        ):
            out: torch.Tensor = _TanhFromSigmoid.apply(x)
            return out
        return torch.tanh(x)


ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": Tanh, "elu": nn.ELU, "relu": nn.ReLU}


def activation(name: str) -> nn.Module:
    """An activation module by name (``tanh``, ``elu``, ``relu``)."""
    try:
        return ACTIVATIONS[name]()
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; choose one of {', '.join(ACTIVATIONS)}") from None


def mlp(
    in_dim: int,
    hidden: Sequence[int],
    out_dim: int,
    act: str = "tanh",
    layer_norm: bool = False,
    out_act: str | None = None,
) -> nn.Sequential:
    """``in_dim -> hidden... -> out_dim``; ``Linear [-> LayerNorm] -> act`` per hidden layer."""
    layers: list[nn.Module] = []
    prev = in_dim
    for width in hidden:
        layers.append(nn.Linear(prev, width))
        if layer_norm:
            layers.append(nn.LayerNorm(width))
        layers.append(activation(act))
        prev = width
    layers.append(nn.Linear(prev, out_dim))
    if out_act is not None:
        layers.append(activation(out_act))
    return nn.Sequential(*layers)


def normalizer_constants(
    normalizer: RunningNormalizer | None, obs_dim: int
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(mean [D], std [D], clip)`` an exported module folds in: ``clamp((obs - mean) / std,
    +-clip)`` is what ``normalizer`` computes (none: the identity, zeros, ones and inf)."""
    if normalizer is None:
        return torch.zeros(obs_dim), torch.ones(obs_dim), float("inf")
    return normalizer.mean, torch.sqrt(normalizer.var + normalizer.eps), float(normalizer.clip)


class ExportedPolicy(nn.Module):
    """The deterministic ``obs -> action`` module every exporter consumes.

    ``forward(obs [B, D] float32) -> action [B, A]``:
    ``clamp(net(clamp((obs - obs_mean) / obs_std, ±obs_clip)), -1, 1)``.
    ``net`` is an ``nn.Sequential`` of ``nn.Linear`` and activations (see :func:`mlp`); a
    deterministic head (e.g. a Gaussian mean or tanh actor) is already part of it. Buffers are
    float32 copies, detached from training.

    With a symmetry (:meth:`with_symmetry`, the task's ``policy_io.json`` ``extra.yaw_symmetry``)
    the module first maps the observation to the canonical half of the symmetry and maps the
    action back, so it takes and returns physical quantities::

        flip = obs[:, select_index] < 0
        obs' = where(flip, obs[:, obs_source] * obs_sign, obs)
        action = where(flip, out[:, action_source], out),   out = the expression above on obs'
    """

    obs_mean: torch.Tensor
    obs_std: torch.Tensor
    sym_obs_source: torch.Tensor
    sym_obs_sign: torch.Tensor
    sym_action_source: torch.Tensor

    def __init__(self, net: nn.Sequential, obs_mean: torch.Tensor, obs_std: torch.Tensor, obs_clip: float) -> None:
        super().__init__()
        self.net = copy.deepcopy(net).float().cpu().eval()
        for p in self.net.parameters():
            p.requires_grad_(False)
        self.register_buffer("obs_mean", obs_mean.detach().float().cpu().clone())
        self.register_buffer("obs_std", obs_std.detach().float().cpu().clone())
        self.obs_clip = float(obs_clip)
        self.sym_select_index: int | None = None
        """Observation entry whose sign selects the symmetry flip; None: no symmetry."""
        self.register_buffer("sym_obs_source", torch.zeros(0, dtype=torch.long), persistent=False)
        self.register_buffer("sym_obs_sign", torch.zeros(0), persistent=False)
        self.register_buffer("sym_action_source", torch.zeros(0, dtype=torch.long), persistent=False)

    @classmethod
    def from_normalizer(cls, net: nn.Sequential, normalizer: RunningNormalizer | None, obs_dim: int) -> ExportedPolicy:
        """Fold a :class:`RunningNormalizer` (or none: identity) into the exported module."""
        return cls(net, *normalizer_constants(normalizer, obs_dim))

    def with_symmetry(self, tables: Mapping[str, Any] | None) -> ExportedPolicy:
        """This module with the symmetry ``tables`` (keys ``select_index``, ``obs_source``,
        ``obs_sign``, ``action_source``: ``policy_io.json`` ``extra.yaw_symmetry``) around it;
        ``None`` leaves it unchanged. Raises ``ValueError`` naming a key of the wrong form."""
        if tables is None:
            return self
        dim = int(self.obs_mean.shape[0])
        try:
            select = int(tables["select_index"])
            source = torch.tensor([int(i) for i in tables["obs_source"]], dtype=torch.long)
            sign = torch.tensor([float(v) for v in tables["obs_sign"]], dtype=torch.float32)
            action_source = torch.tensor([int(i) for i in tables["action_source"]], dtype=torch.long)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(
                f"symmetry tables need select_index (int), obs_source, obs_sign and action_source (lists): {err}"
            ) from None
        out_dim = int(self.net[-1].out_features) if isinstance(self.net[-1], nn.Linear) else len(action_source)
        checks = {
            "select_index": 0 <= select < dim,
            "obs_source": source.shape == (dim,) and bool(((source >= 0) & (source < dim)).all()),
            "obs_sign": sign.shape == (dim,) and bool((sign.abs() == 1.0).all()),
            "action_source": sorted(action_source.tolist()) == list(range(out_dim)),
        }
        for key, ok in checks.items():
            if not ok:
                raise ValueError(
                    f"symmetry table {key!r} does not fit a policy with {dim} observations and {out_dim} actions "
                    "(indices in range, signs +-1, action_source a permutation)"
                )
        module = copy.deepcopy(self)
        module.sym_select_index = select
        module.sym_obs_source, module.sym_obs_sign, module.sym_action_source = source, sign, action_source
        return module

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        flip = None
        if self.sym_select_index is not None:
            flip = obs[:, self.sym_select_index : self.sym_select_index + 1] < 0.0
            obs = torch.where(flip, obs[:, self.sym_obs_source] * self.sym_obs_sign, obs)
        x = torch.clamp((obs - self.obs_mean) / self.obs_std, -self.obs_clip, self.obs_clip)
        action = torch.clamp(self.net(x), -1.0, 1.0)
        if flip is not None:
            action = torch.where(flip, action[:, self.sym_action_source], action)
        return action
