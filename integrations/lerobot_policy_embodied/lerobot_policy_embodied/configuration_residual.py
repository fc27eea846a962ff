"""The config of LeRobot policy type ``embodied_residual``: a residual (trained by embodied's
``residual`` or ``o2o-residual``) on a frozen LeRobot base policy saved beside it."""

from __future__ import annotations

from dataclasses import dataclass, field

from lerobot.configs.policies import PreTrainedConfig
from lerobot.configs.types import FeatureType

from lerobot_policy_embodied.configuration_embodied import InferenceOnlyConfig

BASE_SUBFOLDER = "base"
"""The base's own LeRobot checkpoint (config, weights, processors), inside this checkpoint's folder."""
STATE_KEY = "observation.state"


@PreTrainedConfig.register_subclass("embodied_residual")
@dataclass
class EmbodiedResidualConfig(InferenceOnlyConfig):
    """``a = clip(b + residual_scale * tanh(MLP([norm(observation.state), b])), -1, 1)``, where ``b``
    is the base's next action (its own ``select_action``: its queue, chunking and history), mapped
    from ``[base_action_low, base_action_high]`` (empty: [-1, 1]) to [-1, 1] and clipped, as
    embodied trained it.

    ``input_features``/``output_features`` are the base's; the residual reads ``observation.state``
    (``[D]``). ``hidden``/``activation``: the residual MLP; ``normalize_obs``/``obs_clip``: its
    running observation normalization (statistics in ``model.safetensors`` with its weights).
    ``base_subfolder``: where the base's LeRobot checkpoint lies. The processors only batch and
    place tensors: the base's own processors run inside ``select_action``.
    """

    hidden: list[int] = field(default_factory=lambda: [256, 256])
    activation: str = "relu"
    residual_scale: float = 0.2
    normalize_obs: bool = True
    obs_clip: float = 10.0
    base_action_low: list[float] = field(default_factory=list)
    base_action_high: list[float] = field(default_factory=list)
    base_subfolder: str = BASE_SUBFOLDER

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.residual_scale <= 0.0:
            raise ValueError(f"residual_scale must be > 0, got {self.residual_scale}")
        if len(self.base_action_low) != len(self.base_action_high):
            raise ValueError("base_action_low and base_action_high must have the same length")

    @property
    def action_delta_indices(self) -> list[int]:
        return [0]

    def validate_features(self) -> None:
        states = [k for k, f in self.input_features.items() if f.type is FeatureType.STATE]
        if states != [STATE_KEY] or "action" not in self.output_features:
            raise ValueError(
                f"an embodied residual reads {STATE_KEY} and writes action; got inputs {list(self.input_features)}, "
                f"outputs {list(self.output_features)}"
            )
