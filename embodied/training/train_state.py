"""The counters of a training run that a checkpoint restores (:class:`TrainState`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TrainState:
    """Counters that a checkpoint restores."""

    env_steps: int = 0
    updates: int = 0
    train_time_s: float = 0.0
    eval_time_s: float = 0.0
    """Seconds the training loop spent on evaluations (evaluating, or waiting for the background
    evaluator's results)."""
    evals: list[dict[str, float]] = field(default_factory=list)
    time_to_target_s: float | None = None
    env_steps_to_target: int | None = None
    metrics_rows: int = 0
    """Rows in ``metrics.jsonl`` when the state was saved (a resume cuts the file back to them)."""
