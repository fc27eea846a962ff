"""A live training progress bar on stderr: env steps, SPS, return, success rate."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class TrainProgress:
    """Context manager; :meth:`update` takes the latest metrics row (missing keys keep old values)."""

    def __init__(self, total_env_steps: int, enabled: bool = True, start: int = 0) -> None:
        self.enabled = enabled
        self._shown: dict[str, float] = {}
        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            disable=not enabled,
            transient=False,
        )
        self._task = self._progress.add_task("train", total=total_env_steps, completed=start, status="")

    def __enter__(self) -> TrainProgress:
        self._progress.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.__exit__(exc_type, exc, tb)

    def update(self, env_steps: int, row: dict[str, float]) -> None:
        if not self.enabled:
            return
        for key in ("perf/sps", "train/return", "train/success_rate", "eval/success_rate"):
            if key in row:
                self._shown[key] = row[key]
        parts = []
        if "perf/sps" in self._shown:
            parts.append(f"{self._shown['perf/sps'] / 1e3:.0f}k steps/s")
        if "train/return" in self._shown:
            parts.append(f"return {self._shown['train/return']:.1f}")
        if "train/success_rate" in self._shown:
            parts.append(f"success {100 * self._shown['train/success_rate']:.0f}%")
        if "eval/success_rate" in self._shown:
            parts.append(f"eval {100 * self._shown['eval/success_rate']:.1f}%")
        self._progress.update(self._task, completed=env_steps, status="  ".join(parts))
