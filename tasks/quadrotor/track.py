"""``quad-track``: fly a Crazyflie-class quadrotor along a moving setpoint (figure-eight, circle, random).

The task is ``quad-hover`` with a setpoint that moves: everything else (physics step, reward
terms, reset pool, reality-gap models, heading frame) is the hover task's, reached through its
hooks (``_setpoint_at``, ``_on_step``, ``_success``). Each episode draws one reference path per env;
at control step ``k`` the setpoint is ``p_sp(t) = setpoint_w + R_z(path_yaw) path(t)``, ``t = k dt_s``,
with the path's feed-forward velocity ``v_sp = dp_sp/dt`` and acceleration ``a_sp = d²p_sp/dt²``
(what a Crazyflie's high-level commander puts in ``setpoint_t``: position, velocity, acceleration,
yaw).

Every path is a sum of sinusoids per world axis that starts at the centre (``path(0) = 0``)::

    path(t) = Σ_k A_k (sin(ω_k t + φ_k) - sin φ_k)         [N, 3, K] amplitudes, rates, phases

- ``figure8``: ``x = a sin(ω t)``, ``y = b sin(2 ω t)`` with ``(2a, 2b) = figure8_size_m`` (default
  1 m x 0.5 m) and ``ω = 2π / period_s`` (default 5 s);
- ``circle``: radius ``circle_radius_m`` through the centre, ``x = r sin(ω t)``, ``y = r (1 - cos(ω t))``;
- ``random``: ``random_components`` sinusoids per axis with periods uniform in
  ``random_period_s`` and random phases; amplitudes are scaled so the bounds
  ``Σ|A ω|`` (speed) and ``Σ|A| ω²`` (acceleration), summed over the axes as a vector norm, stay
  below ``random_max_speed_mps`` and ``random_max_acc_mps2``; the vertical amplitudes are then
  scaled down so the height stays within ``± random_max_dz_m`` of the centre (``2 Σ|A_z|``);
- ``mix``: each env draws one of the three.

Success: an episode that runs its full length with RMS position error (over all control steps
after the start) below ``success_rms_m``. ``info["episode_metrics"]["rms_error_m"]`` carries each
env's RMS so far (final where the episode just ended); evaluation averages it over episodes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from embodied.config import ConfigError, ranged
from embodied.io_spec import IOSpec
from embodied.sim.quadrotor import LIN_VEL, require_finite
from embodied.tasks.quadrotor.hover import QuadHover, QuadHoverCfg
from embodied.tasks.quadrotor.terms import FEEDFORWARD_TERM, STATE_DIM, policy_terms

PATH_KINDS = ("figure8", "circle", "random")
"""Reference path generators; ``mix`` draws one of them per env."""
PATH_COMPONENTS = 3
"""K: sinusoids per axis in the path tensors (figure8 and circle use one or two, the rest are 0)."""


@dataclass(frozen=True)
class QuadTrackCfg(QuadHoverCfg):
    """Tracking task settings: the hover task's, a path and the RMS success rule.

    Start-state defaults are gentler than hover's (the RMS counts the whole episode, so a start far
    off the path would fail by itself): near the path's start, roughly facing the setpoint yaw,
    moving with the path's initial velocity plus a small random error.
    """

    path: str = "figure8"
    """Reference path: ``figure8``, ``circle``, ``random`` or ``mix`` (one of the three per env)."""
    period_s: float = 5.0
    """Lap time of the figure-eight and the circle (s)."""
    figure8_size_m: tuple[float, float] = (1.0, 0.5)
    """Figure-eight extent along the path's x and y (m): x = a sin(ωt), y = b sin(2ωt), 2a x 2b."""
    circle_radius_m: float = 0.5
    """Circle radius (m)."""
    random_components: int = PATH_COMPONENTS
    """Sinusoids per axis of a random path (1..3)."""
    random_period_s: tuple[float, float] = (2.0, 8.0)
    """Range of the random components' periods (s)."""
    random_max_speed_mps: float = 1.0
    """Bound on a random path's speed (m/s)."""
    random_max_acc_mps2: float = 2.0
    """Bound on a random path's acceleration (m/s²)."""
    random_max_dz_m: float = 0.2
    """Bound on a random path's height change from its start (m)."""
    path_yaw_range_rad: float = math.pi
    """Each episode rotates its path about z by a yaw uniform in ± this (0: as written)."""
    success_rms_m: float = 0.1
    """Success: RMS position error over the whole episode below this (m), without early termination."""
    init_pos_range_m: float = ranged(0.05, 0.0, 10.0, "m")
    init_max_angle_rad: float = ranged(0.2, 0.0, math.pi, "rad", angle=True)
    init_lin_vel_mps: float = ranged(0.2, 0.0, 20.0, "m/s")
    init_ang_vel_rad_s: float = ranged(0.5, 0.0, 50.0, "rad/s")
    init_yaw_range_rad: float = ranged(math.pi, 0.0, math.pi, "rad", angle=True)
    """Initial heading within ± this of the setpoint yaw (default: any heading). With the 180° yaw
    symmetry (``yaw_symmetry``, on by default) the policy meets at most ±90° of heading error and
    learns the full range (docs/benchmarks/quad-track.md); without it, training from
    any heading did not learn within 730k env steps, so set ±0.5 rad there."""

    def __post_init__(self) -> None:
        super().__post_init__()

        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(f"quad-track: {msg}")

        need(
            self.path in (*PATH_KINDS, "mix"),
            f"path must be one of {', '.join((*PATH_KINDS, 'mix'))}, got {self.path!r}",
        )
        require_finite(
            "quad-track",
            {
                "period_s": self.period_s,
                "figure8_size_m": tuple(self.figure8_size_m),
                "circle_radius_m": self.circle_radius_m,
                "random_period_s": tuple(self.random_period_s),
                "random_max_speed_mps": self.random_max_speed_mps,
                "random_max_acc_mps2": self.random_max_acc_mps2,
                "success_rms_m": self.success_rms_m,
            },
            positive=True,
        )
        need(len(self.figure8_size_m) == 2, f"figure8_size_m must be [x, y] (m), got {self.figure8_size_m}")
        lo, hi = (*tuple(self.random_period_s), 0.0, 0.0)[:2]
        need(
            len(self.random_period_s) == 2 and 0.0 < lo <= hi,
            f"random_period_s must be [min, max] with 0 < min <= max (s), got {self.random_period_s}",
        )
        need(
            1 <= self.random_components <= PATH_COMPONENTS,
            f"random_components must be in 1..{PATH_COMPONENTS}, got {self.random_components}",
        )
        need(
            math.isfinite(self.random_max_dz_m) and self.random_max_dz_m >= 0.0,
            f"random_max_dz_m must be a finite number >= 0 (m), got {self.random_max_dz_m}",
        )
        need(
            0.0 <= self.path_yaw_range_rad <= math.pi,
            f"path_yaw_range_rad must be in [0, pi], got {self.path_yaw_range_rad}",
        )
        ground = self.sim.ground_z_m
        dip = self.random_max_dz_m
        need(
            ground is None
            or self.path not in ("random", "mix")
            or self.setpoint_w[2] - dip - self.position_bound_m > ground,
            f"random paths may dip {dip:.2f} m below setpoint_w z ({self.setpoint_w[2]}); with position_bound_m "
            f"({self.position_bound_m}) that reaches the ground at z={ground}: lower random_max_dz_m or raise "
            "setpoint_w",
        )

    @property
    def policy_terms(self) -> tuple[Any, ...]:
        """Tracking terms (``quadrotor.terms.policy_terms(..., tracking=True)``), in order."""
        return policy_terms(self.pos_err_integral, self.action_history, tracking=True)

    @property
    def critic_dim(self) -> int:
        """The hover critic plus the feed-forward acceleration (3)."""
        return super().critic_dim + FEEDFORWARD_TERM.size


@dataclass(frozen=True)
class Paths:
    """Per-env reference paths: ``amp [N, 3, K]`` (m), ``omega [N, 3, K]`` (rad/s), ``phase [N, 3, K]``
    (rad), each a sum of sinusoids per axis starting at 0 (module docstring), rotated about z by
    ``yaw [N]`` (rad)."""

    amp: torch.Tensor
    omega: torch.Tensor
    phase: torch.Tensor
    yaw: torch.Tensor

    def at(self, t_s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Offset from the centre, velocity and acceleration at times ``t_s [N]`` (s), each ``[N, 3]`` world."""
        arg = self.omega * t_s[:, None, None] + self.phase
        sin, cos = torch.sin(arg), torch.cos(arg)
        pos = (self.amp * (sin - torch.sin(self.phase))).sum(dim=2)
        vel = (self.amp * self.omega * cos).sum(dim=2)
        acc = -(self.amp * self.omega.square() * sin).sum(dim=2)
        c, s = torch.cos(self.yaw)[:, None], torch.sin(self.yaw)[:, None]
        return _rot_z(pos, c, s), _rot_z(vel, c, s), _rot_z(acc, c, s)

    def where(self, mask: torch.Tensor, other: Paths) -> Paths:
        """This path where ``mask [N]`` is False, ``other`` where it is True."""
        m3 = mask[:, None, None]
        return Paths(
            torch.where(m3, other.amp, self.amp),
            torch.where(m3, other.omega, self.omega),
            torch.where(m3, other.phase, self.phase),
            torch.where(mask, other.yaw, self.yaw),
        )


def _rot_z(v: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``R_z v`` for ``v [N, 3]`` with ``c, s [N, 1]``."""
    return torch.cat((c * v[:, 0:1] - s * v[:, 1:2], s * v[:, 0:1] + c * v[:, 1:2], v[:, 2:3]), dim=1)


def figure8_paths(n: int, size_m: Sequence[float], period_s: float, device: torch.device) -> Paths:
    """``n`` figure-eights ``x = a sin(ωt)``, ``y = b sin(2ωt)`` of extent ``size_m = (2a, 2b)``."""
    amp = torch.zeros(n, 3, PATH_COMPONENTS, device=device)
    omega = torch.zeros_like(amp)
    w = 2.0 * math.pi / period_s
    amp[:, 0, 0], amp[:, 1, 0] = 0.5 * size_m[0], 0.5 * size_m[1]
    omega[:, 0, 0], omega[:, 1, 0] = w, 2.0 * w
    return Paths(amp, omega, torch.zeros_like(amp), torch.zeros(n, device=device))


def circle_paths(n: int, radius_m: float, period_s: float, device: torch.device) -> Paths:
    """``n`` circles through the centre: ``x = r sin(ωt)``, ``y = r (1 - cos ωt) = r (sin(ωt - π/2) + 1)``."""
    amp = torch.zeros(n, 3, PATH_COMPONENTS, device=device)
    omega, phase = torch.zeros_like(amp), torch.zeros_like(amp)
    amp[:, 0:2, 0] = radius_m
    omega[:, 0:2, 0] = 2.0 * math.pi / period_s
    phase[:, 1, 0] = -0.5 * math.pi
    return Paths(amp, omega, phase, torch.zeros(n, device=device))


def random_paths(
    n: int,
    components: int,
    period_s: tuple[float, float],
    max_speed_mps: float,
    max_acc_mps2: float,
    max_dz_m: float,
    generator: torch.Generator,
    device: torch.device,
) -> Paths:
    """``n`` random smooth paths whose speed and acceleration stay below the bounds (module docstring)."""
    u = torch.rand(3, n, 3, PATH_COMPONENTS, generator=generator, device=device)
    active = (torch.arange(PATH_COMPONENTS, device=device) < components).float()
    period = period_s[0] + (period_s[1] - period_s[0]) * u[0]
    omega = 2.0 * math.pi / period * active
    amp = (2.0 * u[1] - 1.0) * active
    phase = 2.0 * math.pi * u[2] * active
    # Bounds per axis (triangle inequality), then as a vector norm over the axes.
    speed_bound = torch.linalg.vector_norm((amp * omega).abs().sum(dim=2), dim=1)
    acc_bound = torch.linalg.vector_norm((amp * omega.square()).abs().sum(dim=2), dim=1)
    scale = torch.minimum(max_speed_mps / speed_bound.clamp_min(1e-9), max_acc_mps2 / acc_bound.clamp_min(1e-9))
    amp = amp * scale[:, None, None]
    # Height: |z(t)| <= 2 Σ|A_z| (each term sin(.) - sin φ spans at most 2|A|); scaling only lowers the bounds.
    z_scale = (max_dz_m / (2.0 * amp[:, 2].abs().sum(dim=1)).clamp_min(1e-9)).clamp(max=1.0)
    amp = torch.cat((amp[:, :2], amp[:, 2:] * z_scale[:, None, None]), dim=1)
    return Paths(amp, omega, phase, torch.zeros(n, device=device))


PATH_CFG_KEYS = (
    "path",
    "period_s",
    "figure8_size_m",
    "circle_radius_m",
    "random_components",
    "random_period_s",
    "random_max_speed_mps",
    "random_max_acc_mps2",
    "random_max_dz_m",
    "path_yaw_range_rad",
)
"""The :class:`QuadTrackCfg` keys that define the reference paths (``draw_paths``)."""


def draw_paths(cfg: QuadTrackCfg, n: int, generator: torch.Generator, device: torch.device) -> Paths:
    """``n`` fresh paths of ``cfg.path`` (``mix``: one kind per env), each rotated by a random yaw."""
    kinds = {
        "figure8": lambda: figure8_paths(n, cfg.figure8_size_m, cfg.period_s, device),
        "circle": lambda: circle_paths(n, cfg.circle_radius_m, cfg.period_s, device),
        "random": lambda: random_paths(
            n,
            cfg.random_components,
            (float(cfg.random_period_s[0]), float(cfg.random_period_s[1])),
            cfg.random_max_speed_mps,
            cfg.random_max_acc_mps2,
            cfg.random_max_dz_m,
            generator,
            device,
        ),
    }
    u = torch.rand(n, 2, generator=generator, device=device)
    if cfg.path == "mix":
        paths = kinds["figure8"]()
        pick = (u[:, 0] * len(PATH_KINDS)).long()
        for i, name in enumerate(PATH_KINDS[1:], start=1):
            paths = paths.where(pick == i, kinds[name]())
    else:
        paths = kinds[cfg.path]()
    yaw = (2.0 * u[:, 1] - 1.0) * cfg.path_yaw_range_rad
    return Paths(paths.amp, paths.omega, paths.phase, yaw)


class QuadTrack(QuadHover):
    """``num_envs`` tracking episodes; the hover task with a moving setpoint (module docstring).

    Observation groups: ``"policy"`` ``[N, 21 + 4H]``: ``pos_err_h`` (to the moving setpoint),
    ``rot_hb``, ``lin_vel_err_h``, ``ang_vel_b`` (noised), ``acc_sp_h``, then the optional integral
    and the action history; ``"critic"`` ``[N, 37 (+3)]``.
    """

    cfg: QuadTrackCfg
    fusable = False  # a moving setpoint, its own success and resets: the hover-only fused step does not apply

    def __init__(self, cfg: QuadTrackCfg, num_envs: int, device: torch.device, seed: int) -> None:
        dev = torch.device(device)
        self.paths = figure8_paths(int(num_envs), cfg.figure8_size_m, cfg.period_s, dev)
        """The current episode's reference path of every env."""
        self.sq_err_sum = torch.zeros(int(num_envs), dtype=torch.float64, device=dev)
        """``[N]`` sum over the episode's control steps of ``|pos_err|²`` (m²)."""
        super().__init__(cfg, num_envs, device, seed)

    # ------------------------------------------------------------------ hover hooks
    def _setpoint_at(self, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        pos, vel, acc = self.paths.at(step.to(torch.float32) * self.dt)
        return self._setpoint_w + pos, vel, acc

    def _on_step(self, pos_err_h: torch.Tensor) -> dict[str, Any]:
        self.sq_err_sum = self.sq_err_sum + pos_err_h.double().square().sum(dim=1)
        rms = torch.sqrt(self.sq_err_sum / self.episode_step.clamp_min(1)).float()
        self._rms = rms
        return {"episode_metrics": {"rms_error_m": rms}}

    def _success(self, pos_err_h: torch.Tensor, rot_hb: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
        return truncated & (self._rms < self.cfg.success_rms_m)

    def _reset_envs(self, mask: torch.Tensor) -> None:
        """The hover reset, then a new path per ended env; its start moves with the path."""
        self.paths = self.paths.where(mask, self._draw_paths())
        self.sq_err_sum = torch.where(mask, 0.0, self.sq_err_sum)
        super()._reset_envs(mask)
        # The hover start is drawn around the setpoint at rest: add the path's initial velocity.
        _, vel0, _ = self.paths.at(torch.zeros(self.num_envs, device=self.device))
        state = self.sim.state
        state[:, LIN_VEL] = torch.where(mask[:, None], state[:, LIN_VEL] + vel0, state[:, LIN_VEL])
        self.sim.state = state
        if self.gaps is not None:  # delay buffers start at the state with the path's velocity
            self.gaps.refill(mask, self._observe(None)["policy"][:, :STATE_DIM])

    def _draw_paths(self) -> Paths:
        """A fresh path for every env (``cfg.path``), rotated by a random yaw."""
        return draw_paths(self.cfg, self.num_envs, self.generator, self.device)

    # ------------------------------------------------------------------ state and spec
    def physical_state(self) -> dict[str, torch.Tensor]:
        """The hover task's raw state with the moving setpoint: ``setpoint_w``, ``vel_sp_w``,
        ``acc_sp_w`` ``[N, 3]`` (world) at the current step."""
        out = super().physical_state()
        setpoint_w, vel_sp_w, acc_sp_w = self._setpoint_at(self.episode_step)
        assert vel_sp_w is not None and acc_sp_w is not None
        return out | {"setpoint_w": setpoint_w.clone(), "vel_sp_w": vel_sp_w.clone(), "acc_sp_w": acc_sp_w.clone()}

    def io_spec(self) -> IOSpec:
        """The hover spec with the tracking fields and ``extra.tracking`` (the setpoint's inputs)."""
        spec = super().io_spec()
        spec.extra["tracking"] = {
            "setpoint_inputs": ["position_w", "vel_sp_w", "acc_sp_w", "yaw_sp_rad"],
            "success_rms_m": self.cfg.success_rms_m,
        }
        return spec

    def state_dict(self) -> dict[str, Any]:
        """The hover state plus the paths and the running squared-error sums."""
        paths = self.paths
        return super().state_dict() | {
            "paths": {"amp": paths.amp, "omega": paths.omega, "phase": paths.phase, "yaw": paths.yaw},
            "sq_err_sum": self.sq_err_sum.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        p = state["paths"]
        self.paths = Paths(*(p[k].to(self.device, torch.float32).clone() for k in ("amp", "omega", "phase", "yaw")))
        self.sq_err_sum = state["sq_err_sum"].to(self.device, torch.float64).clone()
