"""SmolVLA's action expert as the chain ReinFlow fine-tunes (``--algo reinflow --base lerobot:PATH``).

SmolVLA (LeRobot's ``SmolVLAPolicy``) acts in two parts: a vision-language backbone (SmolVLM)
reads the camera images, the tokenized instruction and the projected state once (its "prefix")
and leaves a key/value cache per layer; a smaller action expert then integrates a velocity field
over ``K = config.num_steps`` Euler steps, attending to that cache. LeRobot's sampler starts at
``t = 1`` (noise) and steps ``dt = -1 / K``: ``x_{k+1} = x_k - v(x_k, t_k) / K`` with
``t_k = 1 - k / K`` on chunks ``[B, chunk_size, max_action_dim]`` (actions padded to
``max_action_dim``; the padded slots are part of the chain state the expert reads).

:class:`SmolVLAChain` implements the ``FlowChain`` interface of :mod:`embodied.algos.flow_chain`
on that structure, calling the policy's own methods (``prepare_images``, ``prepare_state``,
``model.embed_prefix``, ``model.vlm_with_expert``, ``model.denoise_step``), so the fine-tuned
weights stay a LeRobot checkpoint's:

- :meth:`encode` runs the frozen backbone once per observation (micro-batches of
  ``backbone_micro_batch``, bfloat16 autocast where enabled) and keeps the cache, the prefix
  padding mask, pooled backbone features and the normalized state (a conditioning dict whose
  tensors are batch-first, so rollouts store and index it);
- :meth:`step_mean` is one of LeRobot's denoising steps on that cache (float32: the chain's
  likelihood is exact, so ReinFlow's first importance ratio is 1);
- :meth:`features`: a fixed random projection (seeded, ``feature_dim`` wide) of the pooled
  backbone output, beside the normalized state: what the critic and the noise network read;
- trainable: the action expert (``train="expert"``: its transformer, the action in/out and
  time projections), only its last ``last_layers`` layers and the action output projection, or
  (``train="lora"``) low-rank adapters (:mod:`embodied.policies.lora`) on every linear layer of
  the expert's transformer layers (attention ``q/k/v/o_proj``, MLP ``gate/up/down_proj``) with
  everything else frozen; :meth:`SmolVLAChain.merge_adapters` folds them back into the weights,
  leaving a plain SmolVLA.

Nothing here imports lerobot: the policy object comes from :mod:`embodied.training.lerobot_base`.

Shapes: ``B`` = batch, ``L`` = prefix length, ``H`` = chunk_size, ``P`` = max_action_dim,
``F = H * P``, ``A`` = the task's action size, ``D`` = state size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from embodied.action_chunks import ChunkSpec
from embodied.env import ObsDict
from embodied.errors import EmbodiedError
from embodied.policies.flow import action_entry_mask
from embodied.policies.lora import add_lora, merge_lora
from embodied.policies.vla import LeRobotPolicy, actions_to_unit, lerobot_batch, unit_to_actions

LANGUAGE_TOKENS = "observation.language.tokens"
LANGUAGE_MASK = "observation.language.attention_mask"
STATE = "observation.state"


def smolvla_model(base: object) -> Any | None:
    """The wrapped ``SmolVLAPolicy`` of a :class:`LeRobotPolicy` (None for any other policy)."""
    if not isinstance(base, LeRobotPolicy) or base.lerobot is None:
        return None
    policy = base.lerobot
    config = getattr(policy, "config", None)
    model = getattr(policy, "model", None)
    if getattr(config, "type", None) != "smolvla" or not hasattr(model, "denoise_step"):
        return None
    return policy


def is_smolvla_base(base: object) -> bool:
    """Whether ``base`` is a LeRobot SmolVLA policy (a flow-matching action expert on a VLM)."""
    return smolvla_model(base) is not None


class SmolVLAChain:
    """A SmolVLA policy's denoising chain (see the module docstring)."""

    def __init__(
        self,
        base: LeRobotPolicy,
        train: str = "expert",
        last_layers: int = 1,
        lora_rank: int = 8,
        lora_alpha: float | None = None,
        backbone_micro_batch: int = 8,
        bf16: bool = False,
        feature_dim: int = 64,
        device: torch.device | str = "cpu",
    ) -> None:
        policy = smolvla_model(base)
        if policy is None:
            raise EmbodiedError(f"SmolVLAChain needs a LeRobot SmolVLA policy, got {type(base).__name__}")
        config = policy.config
        if not config.use_cache:
            raise EmbodiedError("the SmolVLA config has use_cache=false; its chain reuses the backbone's cache")
        if getattr(config, "rtc_config", None) is not None and config.rtc_config.enabled:
            raise EmbodiedError("real-time chunking (rtc_config) changes the sampler; disable it for ReinFlow")
        self.policy: nn.Module = base
        self.base = base
        self.model = policy.model
        self.lerobot = policy
        self.device = torch.device(device)
        self.chunk = int(config.chunk_size)
        self.slots = int(config.max_action_dim)
        self.action_dim = int(config.action_feature.shape[0])
        self.flat_dim = self.chunk * self.slots
        self.denoise_steps = int(config.num_steps)
        self.chunk_spec = ChunkSpec(self.chunk, int(config.n_action_steps))
        self.backbone_micro_batch = int(backbone_micro_batch)
        self.bf16 = bool(bf16)
        hidden = int(self.model.vlm_with_expert.config.text_config.hidden_size)
        self.state_dim = int(config.input_features[STATE].shape[0])
        gen = torch.Generator().manual_seed(0)
        self.projection = (torch.randn(hidden, feature_dim, generator=gen) / hidden**0.5).to(self.device)
        """Fixed ``[hidden, feature_dim]`` projection of the pooled backbone output."""
        self.feature_dim = feature_dim + self.state_dim
        self.time_dim = 16
        base.requires_grad_(False)
        self._trainable = self._select_trainable(train, last_layers, lora_rank, lora_alpha)
        for p in self._trainable:
            p.requires_grad_(True)
        policy.eval()  # no dropout: sampling and scoring must compute the same chain

    def _select_trainable(
        self, train: str, last_layers: int, lora_rank: int, lora_alpha: float | None
    ) -> list[nn.Parameter]:
        expert = self.model.vlm_with_expert.lm_expert
        if train == "lora":
            alpha = float(lora_rank if lora_alpha is None else lora_alpha)
            adapters = [a for layer in expert.layers for a in add_lora(layer, lora_rank, alpha, seed=0)]
            return [p for adapter in adapters for p in (adapter.lora_a, adapter.lora_b)]
        if train == "expert":
            modules = [expert, self.model.action_in_proj, self.model.action_out_proj]
            modules += [self.model.action_time_mlp_in, self.model.action_time_mlp_out]
        elif train == "last_layers":
            layers = list(expert.layers)
            if not 1 <= last_layers <= len(layers):
                raise EmbodiedError(
                    f"algo.vla.last_layers={last_layers}, but the action expert has {len(layers)} layers"
                )
            modules = [*layers[-last_layers:], expert.norm, self.model.action_out_proj]
        else:
            raise EmbodiedError(f"algo.vla.train must be 'expert', 'last_layers' or 'lora', got {train!r}")
        params: list[nn.Parameter] = []
        seen: set[int] = set()
        for module in modules:
            for name, p in module.named_parameters():
                if "lm_head" not in name and id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
        return params

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        return iter(self._trainable)

    def merge_adapters(self) -> int:
        """Fold LoRA adapters into the expert's weights (``W + s B A``, in place), so the policy is a
        plain SmolVLA again (LeRobot's module structure and state-dict keys); returns how many
        layers were merged (0 unless ``train="lora"``). Nothing trains afterwards."""
        merged = merge_lora(self.model.vlm_with_expert.lm_expert)
        if merged:
            self._trainable = []
        return merged

    # ------------------------------------------------------------------------- backbone
    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    @torch.no_grad()
    def encode(self, obs: ObsDict) -> dict[str, torch.Tensor]:
        """The backbone's cache of observations ``[B, ...]``, micro-batch by micro-batch."""
        rows = int(obs[self.base.state_group].shape[0])
        parts = []
        for start in range(0, rows, self.backbone_micro_batch):
            part = {group: value[start : start + self.backbone_micro_batch] for group, value in obs.items()}
            parts.append(self._encode(part))
        lengths = {int(p["pad"].shape[1]) for p in parts}
        if len(lengths) > 1:
            raise EmbodiedError(
                f"the SmolVLA prefix has different lengths in one batch ({sorted(lengths)}): pad the instruction "
                "to one length (config pad_language_to='max_length')"
            )
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}

    def _encode(self, obs: ObsDict) -> dict[str, torch.Tensor]:
        from lerobot.policies.smolvla.modeling_smolvla import make_att_2d_masks

        base, policy, model = self.base, self.lerobot, self.model
        batch = base.preprocessor(lerobot_batch(obs, base.instruction, base.cameras, base.state_group))
        with self._autocast():
            images, img_masks = policy.prepare_images(batch)
            state = policy.prepare_state(batch)
            embs, pad, att = model.embed_prefix(images, img_masks, batch[LANGUAGE_TOKENS], batch[LANGUAGE_MASK], state)
            att_2d = make_att_2d_masks(pad, att)
            positions = torch.cumsum(pad, dim=1) - 1
            (prefix_out, _), cache = model.vlm_with_expert.forward(
                attention_mask=att_2d,
                position_ids=positions,
                past_key_values=None,
                inputs_embeds=[embs, None],
                use_cache=True,
                fill_kv_cache=True,
            )
        weights = pad.float()[:, :, None]
        pooled = (prefix_out.float() * weights).sum(1) / weights.sum(1).clamp_min(1.0)
        out = {"pad": pad, "pooled": pooled, "state": batch[STATE].float()}
        for layer, entry in cache.items():
            out[f"k{layer}"] = entry["key_states"]
            out[f"v{layer}"] = entry["value_states"]
        return out

    # ---------------------------------------------------------------------------- chain
    def features(self, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([cond["pooled"] @ self.projection, cond["state"]], dim=-1)

    def time_features(self, k: int, batch: int) -> torch.Tensor:
        t = torch.full((batch, 1), 1.0 - k / self.denoise_steps, device=self.device)
        freqs = torch.exp(torch.linspace(0.0, 6.9, self.time_dim // 2, device=self.device))  # 1 .. ~1000
        return torch.cat([torch.sin(t * freqs), torch.cos(t * freqs)], dim=-1)

    def _cache(self, cond: dict[str, torch.Tensor]) -> dict[int, dict[str, torch.Tensor]]:
        layers = sorted(int(key[1:]) for key in cond if key.startswith("k") and key[1:].isdigit())
        return {i: {"key_states": cond[f"k{i}"].float(), "value_states": cond[f"v{i}"].float()} for i in layers}

    def step_mean(self, cond: dict[str, torch.Tensor], x: torch.Tensor, k: int) -> torch.Tensor:
        b = x.shape[0]
        t = torch.full((b,), 1.0 - k / self.denoise_steps, dtype=torch.float32, device=x.device)
        v = self.model.denoise_step(
            prefix_pad_masks=cond["pad"],
            past_key_values=self._cache(cond),
            x_t=x.reshape(b, self.chunk, self.slots),
            timestep=t,
        )
        return x - v.reshape(b, -1) / self.denoise_steps

    def base_step_mean(self, cond: dict[str, torch.Tensor], x: torch.Tensor, k: int) -> torch.Tensor:
        raise EmbodiedError("a SmolVLA chain keeps no frozen copy of its expert (algo.bc_coef must be 0)")

    def actions(self, x_final: torch.Tensor) -> torch.Tensor:
        """The chunk ``[B, H, A]`` in [-1, 1]: unpadded, un-normalized by the checkpoint's
        post-processor and mapped from the policy's action range, as LeRobot's sampler's would be."""
        chunk = x_final.reshape(-1, self.chunk, self.slots)[:, :, : self.action_dim]
        out = self.base.postprocessor(chunk)
        return actions_to_unit(out.float().to(self.device), self.base.action_low, self.base.action_high)

    def demo_chain_state(self, chunks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Demonstrated chunks ``[B, H, A]`` in [-1, 1] -> the chain state ``[B, F]`` LeRobot's
        sampler would end in for them: mapped to the policy's action range, normalized as the
        checkpoint's post-processor un-normalizes (the inverse of its per-action affine map), and
        padded to ``max_action_dim`` (padded slots weigh 0)."""
        low, high = self.base.action_low.to(chunks.device), self.base.action_high.to(chunks.device)
        actions = unit_to_actions(chunks, low, high)
        offset, scale = self._postprocessor_affine()
        normalized = (actions - offset) / scale
        b = chunks.shape[0]
        state = torch.zeros(b, self.chunk, self.slots, device=chunks.device)
        state[:, :, : self.action_dim] = normalized
        weight = action_entry_mask(self.chunk, self.slots, self.action_dim).to(state).expand(b, -1)
        return state.reshape(b, -1), weight

    def _postprocessor_affine(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``offset, scale`` ``[A]`` of the post-processor, ``post(z) = offset + scale * z``, read by
        probing it at 0, 1 and 2 (LeRobot's mean/std and min/max un-normalizations are affine per
        action; anything else is refused rather than inverted wrongly)."""
        probe = torch.tensor([0.0, 1.0, 2.0], device=self.device)[:, None, None].expand(3, 1, self.action_dim)
        out = self.base.postprocessor(probe.contiguous()).float().to(self.device).reshape(3, self.action_dim)
        offset, scale = out[0], out[1] - out[0]
        if not torch.allclose(out[2], offset + 2.0 * scale, rtol=1e-4, atol=1e-5) or bool((scale.abs() < 1e-12).any()):
            raise EmbodiedError(
                "the SmolVLA checkpoint's action post-processor is not an invertible per-action affine map "
                "(mean/std or min/max), so demonstrated actions cannot be put in its chain's space: train without "
                "--dataset"
            )
        return offset, scale


def smolvla_chain(base: object, vla_cfg: Any, device: torch.device) -> SmolVLAChain:
    """The chain of a SmolVLA base for ReinFlow's ``algo.vla`` settings (``VLAFineTuneCfg``)."""
    from embodied.precision import resolve_bf16

    if not isinstance(base, LeRobotPolicy):
        raise EmbodiedError(f"reinflow's VLA chain needs a LeRobot policy, got {type(base).__name__}")
    return SmolVLAChain(
        base,
        train=vla_cfg.train,
        last_layers=vla_cfg.last_layers,
        lora_rank=vla_cfg.lora_rank,
        lora_alpha=vla_cfg.lora_alpha,
        backbone_micro_batch=vla_cfg.backbone_micro_batch,
        bf16=resolve_bf16(vla_cfg.bf16, device, "algo.vla.bf16"),
        feature_dim=vla_cfg.feature_dim,
        device=device,
    )
