"""The observation/action interface of a policy, as written to ``policy_io.json``.

Tasks describe their policy observation and action layouts with these types; exporters add
the control period and model hash; ``real/`` and ``firmware/`` read the JSON so that no
constant is ever copied by hand.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ObsField:
    """One contiguous slice of the policy observation vector."""

    name: str
    size: int
    units: str = ""
    frame: str = ""
    scale: float = 1.0
    """The policy sees ``value * scale`` (before the normalizer folded into the export)."""
    description: str = ""


@dataclass(frozen=True)
class ObsTerm:
    """One named slice of a task's policy observation, as the task defines it: what
    ``policy_io.json`` records (:meth:`field`) plus the noise group the simulator draws for it.

    Every task lists its observation as a tuple of these; :func:`obs_fields` and
    :func:`terms_dim` turn the tuple into the interface and its size, so names and sizes are
    written once.
    """

    name: str
    size: int
    units: str = ""
    frame: str = ""
    description: str = ""
    noise_group: int | None = None
    """Index into the task's observation-noise σ table; None: never noised."""

    def field(self) -> ObsField:
        """The ``policy_io.json`` field of this term (scale 1)."""
        return ObsField(self.name, self.size, self.units, self.frame, description=self.description)


def terms_dim(terms: Sequence[ObsTerm]) -> int:
    """Total size of ``terms``."""
    return sum(t.size for t in terms)


def obs_fields(terms: Sequence[ObsTerm]) -> tuple[ObsField, ...]:
    """``policy_io.json`` observation fields of ``terms``, in order."""
    return tuple(t.field() for t in terms)


@dataclass(frozen=True)
class ActionField:
    """One contiguous slice of the action vector. Physical command = ``action * scale + offset``."""

    name: str
    size: int
    units: str = ""
    scale: float = 1.0
    offset: float = 0.0
    low: float = -1.0
    high: float = 1.0
    description: str = ""


def affine_action_fields(
    offset: Sequence[float], scale: Sequence[float], description: str = ""
) -> tuple[ActionField, ...]:
    """One 1-wide field per action dimension, ``action_i``: the physical command is
    ``action[i] * scale[i] + offset[i]`` (a simulator's bounds mapped from [-1, 1])."""
    if len(offset) != len(scale):
        raise ValueError(f"offset has {len(offset)} values, scale {len(scale)}; one per action dimension")
    return tuple(
        ActionField(f"action_{i}", 1, scale=float(s), offset=float(o), description=description)
        for i, (o, s) in enumerate(zip(offset, scale, strict=True))
    )


@dataclass(frozen=True)
class IOSpec:
    """Policy interface: ordered observation and action fields plus conventions."""

    obs_fields: tuple[ObsField, ...]
    action_fields: tuple[ActionField, ...]
    control_period_s: float
    conventions: dict[str, str] = field(default_factory=dict)
    """Frame and unit conventions of the task, e.g. ``{"world_frame": "ENU, z up", ...}``."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Task-specific constants the deployment side needs (e.g. action history length)."""

    @property
    def obs_dim(self) -> int:
        return sum(f.size for f in self.obs_fields)

    def mismatch(self, other: IOSpec) -> str | None:
        """The first observation or action field whose name or size differs from ``other``'s,
        as one clause (``self`` is "trained", ``other`` "built"); None when they fit."""
        groups: tuple[tuple[str, Sequence[ObsField | ActionField], Sequence[ObsField | ActionField]], ...] = (
            ("observation", self.obs_fields, other.obs_fields),
            ("action", self.action_fields, other.action_fields),
        )
        for kind, mine, theirs in groups:
            for a, b in zip(mine, theirs, strict=False):
                if a.name != b.name or a.size != b.size:
                    return (
                        f"{kind} field {a.name!r} has {a.size} values in the trained policy, "
                        f"the env built now has {b.name!r} with {b.size}"
                    )
            if len(mine) != len(theirs):
                return f"the trained policy has {len(mine)} {kind} fields, the env built now {len(theirs)}"
        return None

    @property
    def action_dim(self) -> int:
        return sum(f.size for f in self.action_fields)

    def to_dict(self) -> dict[str, Any]:
        return {
            "obs_fields": [asdict(f) for f in self.obs_fields],
            "action_fields": [asdict(f) for f in self.action_fields],
            "control_period_s": self.control_period_s,
            "conventions": dict(self.conventions),
            "extra": dict(self.extra),
            "obs_dim": self.obs_dim,
            "action_dim": self.action_dim,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IOSpec:
        return cls(
            obs_fields=tuple(ObsField(**f) for f in data["obs_fields"]),
            action_fields=tuple(ActionField(**f) for f in data["action_fields"]),
            control_period_s=float(data["control_period_s"]),
            conventions=dict(data.get("conventions", {})),
            extra=dict(data.get("extra", {})),
        )

    def save(self, path: Path, **top_level: Any) -> None:
        """Write as JSON; ``top_level`` adds keys such as ``model_sha256``."""
        payload = self.to_dict() | top_level
        path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")

    @classmethod
    def load(cls, path: Path) -> IOSpec:
        return cls.from_dict(json.loads(Path(path).read_text()))
