"""Processor pipelines of LeRobot policy type ``embodied``: batching and device only (the
exported module normalizes its observation itself and returns actions in the env's [-1, 1])."""

from __future__ import annotations

from typing import Any

from lerobot.processor import (
    AddBatchDimensionProcessorStep,
    DeviceProcessorStep,
    PolicyProcessorPipeline,
)
from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action
from lerobot.utils.constants import POLICY_POSTPROCESSOR_DEFAULT_NAME, POLICY_PREPROCESSOR_DEFAULT_NAME

from lerobot_policy_embodied.configuration_embodied import EmbodiedConfig


def make_embodied_pre_post_processors(
    config: EmbodiedConfig, dataset_stats: dict[str, Any] | None = None
) -> tuple[PolicyProcessorPipeline, PolicyProcessorPipeline]:
    """``(preprocessor, postprocessor)``; ``dataset_stats`` is unused (no normalization step)."""
    return batching_processors(config.device or "cpu")


def batching_processors(device: str) -> tuple[PolicyProcessorPipeline, PolicyProcessorPipeline]:
    """``(preprocessor, postprocessor)`` that add the batch dimension and move tensors to ``device``
    (and actions back to the CPU), with LeRobot's default pipeline names."""
    preprocessor = PolicyProcessorPipeline(
        steps=[AddBatchDimensionProcessorStep(), DeviceProcessorStep(device=device)],
        name=POLICY_PREPROCESSOR_DEFAULT_NAME,
    )
    postprocessor = PolicyProcessorPipeline(
        steps=[DeviceProcessorStep(device="cpu")],
        name=POLICY_POSTPROCESSOR_DEFAULT_NAME,
        to_transition=policy_action_to_transition,
        to_output=transition_to_policy_action,
    )
    return preprocessor, postprocessor
