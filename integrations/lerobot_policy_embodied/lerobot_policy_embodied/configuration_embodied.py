"""The config of LeRobot policy type ``embodied`` (an exported embodied policy artifact)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lerobot.configs.policies import PreTrainedConfig
from lerobot.configs.types import FeatureType, NormalizationMode
from lerobot.optim.optimizers import AdamConfig

ARTIFACT_FILE = "embodied_policy.pt"
"""embodied's policy artifact (its sealed, weights-only ``torch.save`` archive) beside config.json."""


@dataclass
class InferenceOnlyConfig(PreTrainedConfig):
    """What LeRobot's config interface asks of a policy that runs inference only: no normalization
    by the processors (``IDENTITY``; the policy normalizes itself), no observation or reward
    offsets, an optimizer preset that LeRobot's trainer would need but never uses here."""

    normalization_mapping: dict[str, NormalizationMode] = field(
        default_factory=lambda: {
            "STATE": NormalizationMode.IDENTITY,
            "VISUAL": NormalizationMode.IDENTITY,
            "ACTION": NormalizationMode.IDENTITY,
        }
    )
    push_to_hub: bool = False

    @property
    def observation_delta_indices(self) -> None:
        return None

    @property
    def reward_delta_indices(self) -> None:
        return None

    def get_optimizer_preset(self) -> AdamConfig:
        return AdamConfig(lr=1e-4)

    def get_scheduler_preset(self) -> None:
        return None


@PreTrainedConfig.register_subclass("embodied")
@dataclass
class EmbodiedConfig(InferenceOnlyConfig):
    """``observation.state [D]`` -> ``action [A]`` through embodied's exported policy.

    ``chunk_size``: actions per plan (``H``); ``n_action_steps``: actions of a plan executed before
    planning again (embodied's ``exec_steps``). The observation normalization lives inside the
    exported module, so the processors do not normalize (``IDENTITY``).
    """

    chunk_size: int = 1
    n_action_steps: int = 1
    artifact_file: str = ARTIFACT_FILE

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.n_action_steps <= self.chunk_size:
            raise ValueError(f"n_action_steps must be in [1, chunk_size={self.chunk_size}], got {self.n_action_steps}")

    @property
    def action_delta_indices(self) -> list[int]:
        return list(range(self.chunk_size))

    def validate_features(self) -> None:
        states = [k for k, f in self.input_features.items() if f.type is FeatureType.STATE]
        if states != ["observation.state"] or "action" not in self.output_features:
            raise ValueError(
                f"an embodied policy reads observation.state and writes action; got inputs {list(self.input_features)}, "
                f"outputs {list(self.output_features)}"
            )
