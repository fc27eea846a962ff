"""LeRobot policy type ``embodied_residual``: a residual embodied trained on a frozen LeRobot base.

The checkpoint folder holds ``config.json`` (:class:`EmbodiedResidualConfig`), the residual's
weights and observation statistics (``model.safetensors``) and, in ``base/``, the base's own
LeRobot checkpoint (its ``config.json``, weights and processor pipelines).
:meth:`EmbodiedResidualPolicy.from_pretrained` loads the base with LeRobot's own loaders
(``PreTrainedConfig.from_pretrained``, ``get_policy_class``, ``make_pre_post_processors``).

``select_action`` acts as embodied's residual policy acted in training: the base's next action
from its own ``select_action`` (its queue, so chunks execute exactly as in training) between its
own processors, mapped to [-1, 1], then ``clip(b + scale * tanh(MLP([norm(state), b])), ±1)``
(embodied's :class:`~embodied.policies.residual.ResidualPolicy`, the same code).

Shapes: ``B`` = batch, ``D`` = state size, ``A`` = action size.
"""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any, TypeVar

import torch
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.pretrained import PreTrainedPolicy
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from embodied.policies.residual import ResidualPolicy
from embodied.policies.vla import actions_to_unit
from lerobot_policy_embodied.configuration_residual import STATE_KEY, EmbodiedResidualConfig
from lerobot_policy_embodied.modeling_embodied import checkpoint_config, checkpoint_folder

RESIDUAL_FILE = "model.safetensors"
"""The residual's ``state_dict`` (MLP weights, normalizer statistics), LeRobot's weights file name."""

T = TypeVar("T", bound="EmbodiedResidualPolicy")
Processor = Any  # a LeRobot PolicyProcessorPipeline (callable: batch -> batch, action -> action)


class EmbodiedResidualPolicy(PreTrainedPolicy):
    config_class = EmbodiedResidualConfig
    name = "embodied_residual"

    def __init__(
        self,
        config: EmbodiedResidualConfig,
        base: PreTrainedPolicy | None = None,
        base_preprocessor: Processor | None = None,
        base_postprocessor: Processor | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(config)
        config.validate_features()
        self.config: EmbodiedResidualConfig = config
        state_dim = int(config.input_features[STATE_KEY].shape[0])
        action_dim = int(config.output_features["action"].shape[0])
        self.residual = ResidualPolicy(
            state_dim,
            action_dim,
            config.residual_scale,
            hidden=tuple(config.hidden),
            activation=config.activation,
            normalize_obs=config.normalize_obs,
            obs_clip=config.obs_clip,
        )
        self.base: nn.Module | None = base
        self.base_preprocessor = base_preprocessor
        self.base_postprocessor = base_postprocessor
        low, high = config.base_action_low or [-1.0] * action_dim, config.base_action_high or [1.0] * action_dim
        # plain CPU tensors, not buffers: the base's actions are mapped on the CPU, as in training
        self.base_action_low = torch.tensor(low, dtype=torch.float32)
        self.base_action_high = torch.tensor(high, dtype=torch.float32)

    @classmethod
    def from_pretrained(  # type: ignore[override]
        cls: builtins.type[T],
        pretrained_name_or_path: str | Path,
        *,
        config: EmbodiedResidualConfig | None = None,
        revision: str | None = None,
        cache_dir: str | Path | None = None,
        local_files_only: bool = False,
        **kwargs: Any,
    ) -> T:
        from lerobot.policies.factory import get_policy_class, make_pre_post_processors

        folder = checkpoint_folder(pretrained_name_or_path, revision, cache_dir, local_files_only)
        if config is None:
            config = checkpoint_config(folder, EmbodiedResidualConfig)
        device = config.device or "cpu"
        base_folder = folder / config.base_subfolder
        base_config = PreTrainedConfig.from_pretrained(base_folder)
        base_config.device = device
        base = get_policy_class(base_config.type).from_pretrained(base_folder, config=base_config)
        pre, post = make_pre_post_processors(
            base_config,
            pretrained_path=str(base_folder),
            preprocessor_overrides={"device_processor": {"device": device}},
        )
        policy = cls(config, base, pre, post)
        policy.residual.load_state_dict(load_file(str(folder / RESIDUAL_FILE)))
        policy.to(device)
        policy.eval()
        return policy

    def _save_pretrained(self, save_directory: Path) -> None:
        base, pre, post = self._require_base()
        self.config._save_pretrained(save_directory)
        state = {key: value.detach().contiguous().cpu() for key, value in self.residual.state_dict().items()}
        save_file(state, str(Path(save_directory) / RESIDUAL_FILE))
        base_folder = Path(save_directory) / self.config.base_subfolder
        base.save_pretrained(base_folder)  # type: ignore[operator]
        pre.save_pretrained(base_folder)
        post.save_pretrained(base_folder)

    def _require_base(self) -> tuple[nn.Module, Processor, Processor]:
        if self.base is None or self.base_preprocessor is None or self.base_postprocessor is None:
            raise ValueError("this EmbodiedResidualPolicy holds no base policy (load it with from_pretrained)")
        return self.base, self.base_preprocessor, self.base_postprocessor

    def get_optim_params(self) -> Any:
        return self.residual.parameters()

    def reset(self) -> None:
        base, _, _ = self._require_base()
        base.reset()  # type: ignore[operator]

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict | None]:
        raise NotImplementedError("an exported embodied residual runs inference only; fine-tune it with embodied")

    def predict_action_chunk(self, batch: dict[str, Tensor], **kwargs: Any) -> Tensor:
        raise NotImplementedError(
            "an embodied residual corrects each executed action of its base (select_action); it has no action "
            "chunk of one observation"
        )

    @torch.no_grad()
    def base_action(self, batch: dict[str, Any]) -> Tensor:
        """``[B, A]`` in [-1, 1]: the base's next action, through its own processors and queue."""
        base, pre, post = self._require_base()
        action = post(base.select_action(pre(dict(batch))))  # type: ignore[operator]
        return actions_to_unit(action.float().cpu(), self.base_action_low, self.base_action_high)

    @torch.no_grad()
    def select_action(self, batch: dict[str, Any], **kwargs: Any) -> Tensor:
        """``[B, A]`` in [-1, 1]: the base's next action corrected by the residual."""
        state: Tensor = batch[STATE_KEY]
        return self.residual.combine(state.float(), self.base_action(batch).to(state.device))
