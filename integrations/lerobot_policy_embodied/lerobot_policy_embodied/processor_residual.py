"""Processor pipelines of LeRobot policy type ``embodied_residual``: batching and device only.

The base's own pipelines (normalization, tokenization, image handling) are saved with the base
in its subfolder and run inside :meth:`EmbodiedResidualPolicy.select_action`, because the
residual reads the raw ``observation.state`` and corrects the base's action after its
postprocessor (in the env's [-1, 1] action range)."""

from __future__ import annotations

from typing import Any

from lerobot.processor import PolicyProcessorPipeline

from lerobot_policy_embodied.configuration_residual import EmbodiedResidualConfig
from lerobot_policy_embodied.processor_embodied import batching_processors


def make_embodied_residual_pre_post_processors(
    config: EmbodiedResidualConfig, dataset_stats: dict[str, Any] | None = None
) -> tuple[PolicyProcessorPipeline, PolicyProcessorPipeline]:
    """``(preprocessor, postprocessor)``; ``dataset_stats`` is unused (the base normalizes itself)."""
    return batching_processors(config.device or "cpu")
