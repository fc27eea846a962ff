"""Behaviour cloning of a flow-matching policy (``policies/flow.py``) from demonstrations.

Driven by the shared trainer like any algorithm: the dataset enters through ``preload``
(``--dataset PATH``), every trainer step acts in the env with the current policy (so training
curves show closed-loop success) and ``update`` runs ``grad_steps_per_update`` minibatch steps
of the flow-matching loss. The observation normalizer is frozen to the dataset's statistics.
The policy that acts, is evaluated, checkpointed as ``policy`` and exported is an exponential
moving average of the trained weights (``ema_decay``), as is usual for diffusion/flow policies.

Shapes: ``M`` = dataset steps, ``D`` = observation size, ``H`` = chunk, ``A`` = action size.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from embodied.algo import PreloadSource, Transition
from embodied.config import ConfigError, ranged
from embodied.data.demos import load_dataset
from embodied.env import IMAGE_GROUP, ObsDict, VecEnv, require_box_actions
from embodied.errors import EmbodiedError, NonFiniteError
from embodied.policies.flow import FlowPolicyCfg
from embodied.policies.image_flow import ImageInstructionFlowPolicy, make_flow_policy


@dataclass(frozen=True)
class BCFlowCfg:
    """Flow-matching behaviour cloning."""

    policy: FlowPolicyCfg = field(default_factory=FlowPolicyCfg)
    batch_size: int = 256
    """Dataset samples per gradient step."""
    grad_steps_per_update: int = 10
    """Gradient steps per trainer update (one update per env step)."""
    learning_rate: float = ranged(1e-3, 1e-9, 1.0)
    """Adam learning rate."""
    weight_decay: float = ranged(1e-6, 0.0, 10.0)
    """AdamW weight decay."""
    max_grad_norm: float = ranged(1.0, 0.0, 1e6)
    """Global gradient-norm clip (<= 0 disables)."""
    ema_decay: float = ranged(0.995, 0.0, 1.0)
    """Per-gradient-step decay of the weight average that acts, is evaluated and exported (0: no
    averaging). Single flow-matching iterates swing widely in closed-loop success; the average does not."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "grad_steps_per_update"):
            if getattr(self, name) < 1:
                raise ConfigError(f"algo.{name} must be >= 1, got {getattr(self, name)}")
        if not self.learning_rate > 0.0:
            raise ConfigError(f"algo.learning_rate must be > 0, got {self.learning_rate}")
        if self.weight_decay < 0.0:
            raise ConfigError(f"algo.weight_decay must be >= 0, got {self.weight_decay}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ConfigError(f"algo.ema_decay must be in [0, 1), got {self.ema_decay}")


class BCFlow:
    """Implements ``Algorithm`` and ``Preloadable`` (dataset only)."""

    def __init__(self, cfg: BCFlowCfg, env: VecEnv) -> None:
        require_box_actions(env, "bc-flow")
        self.cfg = cfg
        self.device = torch.device(env.device)
        self.obs_dim = int(math.prod(env.obs_spec["policy"]))
        self.action_dim = int(env.action_dim)
        self.learner = make_flow_policy(env.obs_spec, self.action_dim, cfg.policy).to(self.device)
        """The iterate the optimizer trains; ``policy`` is its exponential moving average."""
        self.policy = copy.deepcopy(self.learner).requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            self.learner.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay
        )
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(torch.randint(0, 2**62, (1,)).item()))
        self._demo_obs: ObsDict | None = None  # "policy" [M, D] raw (conditioned per batch: encoders train)
        self._chunks: torch.Tensor | None = None  # [M, H, A]

    def preload(self, source: PreloadSource) -> None:
        """Load and validate the demonstrations; freeze the normalizer to their statistics."""
        if source.dataset is None:
            raise EmbodiedError(
                f"bc-flow learns from demonstrations: give --dataset PATH (it cannot start from {source.describe()})"
            )
        if source.base_run is not None:
            raise EmbodiedError(
                f"bc-flow learns a policy from demonstrations alone and takes no base policy ({source.describe()}); "
                "to fine-tune a base use --algo reinflow or --algo residual with --base"
            )
        demos = load_dataset(source.dataset, obs_dim=self.obs_dim, action_dim=self.action_dim)
        obs = torch.as_tensor(demos.obs, device=self.device)
        self.learner.set_obs_stats(obs.mean(0), obs.std(0))
        self.policy.set_obs_stats(obs.mean(0), obs.std(0))
        self._demo_obs = {"policy": obs}
        if isinstance(self.learner, ImageInstructionFlowPolicy) and self.learner.encoder is not None:
            images = demos.camera_images(tuple(self.learner.encoder.image_shape), "bc-flow")
            self._demo_obs[IMAGE_GROUP] = torch.as_tensor(images, device=self.device)  # uint8
        self._chunks = torch.as_tensor(demos.action_chunks(self.cfg.policy.chunk), device=self.device)

    def act(self, obs: ObsDict) -> torch.Tensor:
        return self.policy.act(obs, deterministic=False)

    def observe(self, transition: Transition) -> None:
        pass  # behaviour cloning learns from the dataset only

    def ready_to_update(self) -> bool:
        return True

    def update(self) -> dict[str, float]:
        if self._demo_obs is None or self._chunks is None:
            raise EmbodiedError(
                "bc-flow has no demonstrations: train with --dataset PATH (embodied collect writes one)"
            )
        cfg = self.cfg
        total = torch.zeros((), device=self.device)
        for _ in range(cfg.grad_steps_per_update):
            idx = torch.randint(0, len(self._chunks), (cfg.batch_size,), generator=self.generator, device=self.device)
            cond = self.learner.condition({group: rows[idx] for group, rows in self._demo_obs.items()})
            loss = self.learner.bc_loss(cond, self._chunks[idx], self.generator)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.max_grad_norm > 0.0:
                torch.nn.utils.clip_grad_norm_(self.learner.parameters(), cfg.max_grad_norm)
            self.optimizer.step()
            self._average()
            total += loss.detach()
        value = float(total) / cfg.grad_steps_per_update
        if not math.isfinite(value):
            raise NonFiniteError(f"bc-flow loss is {value}")
        return {"bc_loss": value}

    @torch.no_grad()
    def _average(self) -> None:
        """``policy <- decay * policy + (1 - decay) * learner`` (weights; buffers are copied)."""
        decay = self.cfg.ema_decay
        for avg, cur in zip(self.policy.parameters(), self.learner.parameters(), strict=True):
            avg.lerp_(cur, 1.0 - decay)
        for avg_b, cur_b in zip(self.policy.buffers(), self.learner.buffers(), strict=True):
            avg_b.copy_(cur_b)

    def state_dict(self) -> dict[str, Any]:
        return {
            "learner": self.learner.state_dict(),
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state["learner"])
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"].cpu())
