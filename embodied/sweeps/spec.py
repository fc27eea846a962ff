"""The sweep file: configurations (a grid and/or named entries) times seeds -> one job per run.

Shape of the YAML file (every key optional except ``task``, which may also be given per entry)::

    name: hover_std              # default: the file name
    task: quad-hover
    algo: ppo
    preset: nominal              # `embodied train --preset` (default: the task's default preset)
    seeds: [0, 1, 2]
    overrides: ["trainer.total_env_steps=500000"]   # key=value, as on the `embodied train` line
    timeout_s: 900               # wall limit per run
    target: 0.95                 # success rate counted as reached in the table
    hold: each                   # "held": two evaluations in a row each at the target, or "mean":
                                 # the second at it and the mean of the two (trainer.success_hold)
    grid:                        # cartesian product; each point is one configuration
      algo.init_std: [0.2, 0.3]
      env.pos_weight: [10, 15]
    configs:                     # and/or named configurations (own task/algo/seeds/overrides)
      - name: base
        overrides: []

A plain YAML list of entries (``name``, ``task``, ``algo``, ``preset``, ``seeds``, ``overrides``) is read as
``configs`` with no defaults.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from embodied.config import ConfigError, load_yaml_text

TOP_KEYS = frozenset(
    {"name", "task", "algo", "preset", "seeds", "overrides", "timeout_s", "target", "hold", "grid", "configs"}
)
ENTRY_KEYS = frozenset({"name", "task", "algo", "preset", "seeds", "overrides", "timeout_s"})
HOLD_RULES = ("each", "mean")
"""The values of ``hold`` (:func:`embodied.training.eval_schedule.target_held_by`)."""


@dataclass(frozen=True)
class Job:
    """One ``embodied train`` run of a sweep."""

    config: str
    """Configuration label (grid point or entry name); also the run-directory prefix."""
    task: str
    algo: str
    seed: int
    overrides: tuple[str, ...]
    timeout_s: float
    preset: str | None = None
    """``embodied train --preset``; None: the task's default preset (``configs/<task>/default_presets.yaml``)."""
    allow_unphysical: bool = False
    """``embodied sweep --allow-unphysical``: the run is started with ``--allow-unphysical`` (and
    records it in its config.yaml, so its ``--resume`` accepts the same values)."""

    @property
    def run_name(self) -> str:
        return f"{self.config}_s{self.seed}"


@dataclass(frozen=True)
class SweepSpec:
    name: str
    target: float
    hold: str = "each"
    """How the table counts the target held (``trainer.success_hold``'s rules: ``each``, ``mean``)."""
    jobs: tuple[Job, ...] = field(default_factory=tuple)


def _need(ok: bool, where: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{where}: {message}")


def _seeds(value: Any, where: str) -> list[int]:
    _need(
        isinstance(value, list) and bool(value) and all(isinstance(s, int) and not isinstance(s, bool) for s in value),
        where,
        f"'seeds' expects a non-empty list of integers like [0, 1, 2], got {value!r}",
    )
    return list(value)


def _overrides(value: Any, where: str) -> list[str]:
    ok = isinstance(value, list) and all(isinstance(o, str) and "=" in o for o in value)
    _need(ok, where, f"'overrides' expects a list of key=value strings, got {value!r}")
    return list(value)


def _label(value: object) -> str:
    """A grid value as it appears in a run name (file-system safe)."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", str(value))


def grid_points(grid: Mapping[str, Sequence[Any]], where: str) -> list[tuple[str, list[str]]]:
    """``(label, ["key=value", ...])`` for every point of the cartesian product, in file order."""
    _need(isinstance(grid, Mapping) and bool(grid), where, "'grid' expects a mapping of key: [values]")
    for key, values in grid.items():
        _need(
            (isinstance(key, str) and "." in key) or key in ("num_envs", "seed"),
            where,
            f"grid key {key!r} is not a config key like algo.init_std",
        )
        _need(isinstance(values, list) and bool(values), where, f"grid key {key!r} expects a non-empty list of values")
    keys = list(grid)
    points = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        label = "__".join(f"{k.rsplit('.', 1)[-1]}-{_label(v)}" for k, v in zip(keys, combo))
        points.append(
            (
                label,
                [
                    f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
                    for k, v in zip(keys, combo)
                ],
            )
        )
    return points


def load_spec(path: Path) -> SweepSpec:
    """Read ``path`` into a :class:`SweepSpec`; a :class:`ConfigError` names the file and the key."""
    try:
        raw = load_yaml_text(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: sweep file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from None
    where = str(path)
    if isinstance(raw, list):
        raw = {"configs": raw}
    _need(isinstance(raw, dict), where, f"expected a mapping (or a list of entries), got {type(raw).__name__}")
    unknown = sorted(set(raw) - TOP_KEYS)
    _need(not unknown, where, f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(TOP_KEYS))}")
    defaults = {
        "task": raw.get("task"),
        "algo": raw.get("algo", "ppo"),
        "preset": raw.get("preset"),
        "seeds": _seeds(raw.get("seeds", [0]), where),
        "overrides": _overrides(raw.get("overrides", []), where),
        "timeout_s": raw.get("timeout_s", 3600.0),
    }
    target = raw.get("target", 0.95)
    _need(
        isinstance(target, int | float) and 0.0 < target <= 1.0,
        where,
        f"'target' expects a success rate in (0, 1], got {target!r}",
    )
    hold = raw.get("hold", "each")
    _need(hold in HOLD_RULES, where, f"'hold' expects one of {', '.join(HOLD_RULES)}, got {hold!r}")
    entries: list[dict[str, Any]] = []
    if "grid" in raw:
        for label, point in grid_points(raw["grid"], where):
            entries.append({**defaults, "name": label, "overrides": [*defaults["overrides"], *point]})
    for i, entry in enumerate(raw.get("configs", []) or []):
        at = f"{where}: configs[{i}]"
        _need(isinstance(entry, dict), at, "expected a mapping with name, task, algo, seeds, overrides")
        unknown = sorted(set(entry) - ENTRY_KEYS)
        _need(not unknown, at, f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(ENTRY_KEYS))}")
        _need(isinstance(entry.get("name"), str) and bool(entry.get("name")), at, "'name' is required (a label)")
        merged = {**defaults, **entry}
        merged["seeds"] = _seeds(merged["seeds"], at)
        merged["overrides"] = [*defaults["overrides"], *_overrides(entry.get("overrides", []), at)]
        entries.append(merged)
    _need(bool(entries), where, "no configurations: give 'grid' and/or 'configs'")
    names = [e["name"] for e in entries]
    dup = sorted({n for n in names if names.count(n) > 1})
    _need(not dup, where, f"configuration names must be unique, repeated: {', '.join(dup)}")
    jobs = []
    for e in entries:
        _need(isinstance(e["task"], str), where, f"configuration {e['name']!r} has no 'task' (e.g. task: quad-hover)")
        preset = e["preset"]
        _need(
            preset is None or (isinstance(preset, str) and bool(preset)),
            where,
            f"'preset' expects a preset name (e.g. nominal), got {preset!r}",
        )
        timeout = e["timeout_s"]
        _need(
            isinstance(timeout, int | float) and timeout > 0, where, f"'timeout_s' expects seconds > 0, got {timeout!r}"
        )
        for seed in e["seeds"]:
            overrides = tuple(e["overrides"])
            jobs.append(Job(e["name"], e["task"], str(e["algo"]), int(seed), overrides, float(timeout), preset))
    return SweepSpec(name=str(raw.get("name", path.stem)), target=float(target), hold=str(hold), jobs=tuple(jobs))
