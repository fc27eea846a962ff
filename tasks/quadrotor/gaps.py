"""Reality-gap models for the quadrotor tasks: what the real Crazyflie does that the nominal
simulator does not. Each model is switchable and off by default; ranges are drawn per episode.

Sources and values are in docs/conventions.md ("Reality-gap models"). The models act around the
task's pure step function (``quadrotor.hover.step_core``):

* before the physics: motor command delay (whole control steps), per-motor thrust mismatch
  and battery sag (both as a scale and a cap on the rotor-speed setpoint: thrust = k_f rpm²),
  ground effect and body drag (forces from the current state, held over the step);
* after it: estimator delay (the policy sees the state ``d`` steps old), estimator noise and a
  per-episode position bias, gyro white noise and a per-episode gyro bias.

The action history in the observation keeps the actions the policy sent (the firmware knows
those exactly); only the motors see them late.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from embodied.config import ConfigError, ranged
from embodied.sim.quadrotor import LIN_VEL, POS, RPM, require_finite

GAP_CRITIC_DIM = 6
"""Entries of :meth:`QuadGaps.critic_inputs`."""


class DrawLayout(NamedTuple):
    """Columns of one env's per-episode gap draws (:meth:`QuadGaps.draw`), kept in the task's
    pool of initial conditions beside the start state so the eager and the fused step restart
    an episode from the same row."""

    obs_delay: int
    """Observation delay in control steps (a whole number, as float)."""
    motor_delay: int
    rpm_scale: slice
    """sqrt of each motor's thrust mismatch (thrust ∝ rpm²)."""
    sag_per_step: slice
    """Fraction of the maximum thrust lost per control step."""
    pos_bias: slice
    gyro_bias: slice
    width: int


DRAW = DrawLayout(0, 1, slice(2, 6), slice(6, 7), slice(7, 10), slice(10, 13), 13)


@dataclass(frozen=True)
class QuadGapCfg:
    """Reality-gap models (all off by default). ``(low, high)`` ranges are drawn uniformly per
    episode and env; ``low == high`` fixes the value."""

    obs_delay_steps: tuple[int, int] = (0, 0)
    """Estimator/radio latency in control steps: the policy's state terms are this many steps old."""
    motor_delay_steps: tuple[int, int] = (0, 0)
    """Whole control steps before a motor command reaches the motors (on top of ``motor_tau_s``)."""
    pos_noise_std_m: float = ranged(0.0, 0.0, 1.0, "m")
    """Extra white noise σ on the position estimate (per axis, heading frame), m."""
    pos_bias_std_m: float = ranged(0.0, 0.0, 1.0, "m")
    """Per-episode constant offset σ of the position estimate (per axis), m."""
    lin_vel_noise_std_mps: float = ranged(0.0, 0.0, 5.0, "m/s")
    """Extra white noise σ on the velocity estimate (per axis), m/s."""
    gyro_noise_std_rad_s: float = ranged(0.0, 0.0, 5.0, "rad/s")
    """Gyro white noise σ per axis, rad/s."""
    gyro_bias_std_rad_s: float = ranged(0.0, 0.0, 1.0, "rad/s")
    """Per-episode constant gyro bias σ per axis, rad/s."""
    thrust_mismatch: tuple[float, float] = ranged((1.0, 1.0), 0.1, 10.0, "x nominal")
    """Per-motor thrust scale range (each motor drawn independently)."""
    battery_sag: tuple[float, float] = (0.0, 0.0)
    """Fraction of the motors' maximum thrust lost, linearly, over one full episode."""
    ground_effect: bool = False
    """Rotor thrust scaled by ``1 / (1 - (R / 4 z)²)`` at height ``z`` above the ground."""
    rotor_radius_m: float = ranged(0.0231, 0.005, 1.0, "m")
    """Propeller radius R for the ground effect (45 mm propellers)."""
    body_drag_n_per_mps: tuple[float, float, float] = ranged((0.0, 0.0, 0.0), 0.0, 10.0, "N s/m")
    """Linear drag coefficient per body axis: force_b = -coef * lin_vel_b (N per m/s)."""

    def __post_init__(self) -> None:
        where = "quad gaps"
        for name in ("obs_delay_steps", "motor_delay_steps"):
            low, high = getattr(self, name)
            if not (isinstance(low, int) and isinstance(high, int) and 0 <= low <= high <= 50):
                raise ConfigError(f"{where}: {name} needs integers 0 <= low <= high <= 50, got {(low, high)}")
        require_finite(
            where,
            {
                "pos_noise_std_m": self.pos_noise_std_m,
                "pos_bias_std_m": self.pos_bias_std_m,
                "lin_vel_noise_std_mps": self.lin_vel_noise_std_mps,
                "gyro_noise_std_rad_s": self.gyro_noise_std_rad_s,
                "gyro_bias_std_rad_s": self.gyro_bias_std_rad_s,
                "battery_sag": tuple(self.battery_sag),
                "body_drag_n_per_mps": tuple(self.body_drag_n_per_mps),
            },
            non_negative=True,
        )
        require_finite(where, {"thrust_mismatch": tuple(self.thrust_mismatch)}, positive=True)
        require_finite(where, {"rotor_radius_m": self.rotor_radius_m}, positive=True)
        for name in ("thrust_mismatch", "battery_sag"):
            low, high = getattr(self, name)
            if not low <= high:
                raise ConfigError(f"{where}: {name} needs low <= high, got {(low, high)}")
        if self.battery_sag[1] >= 1.0:
            raise ConfigError(f"{where}: battery_sag must stay below 1 (all thrust lost), got {self.battery_sag}")
        if len(self.body_drag_n_per_mps) != 3:
            raise ConfigError(f"{where}: body_drag_n_per_mps needs 3 values (x, y, z), got {self.body_drag_n_per_mps}")

    @property
    def enabled(self) -> bool:
        """Whether any model is on (otherwise the task skips this module entirely)."""
        return self != QuadGapCfg(rotor_radius_m=self.rotor_radius_m)

    @property
    def fusable(self) -> bool:
        """Whether the fused step (``tasks/quadrotor/hover_fused.py``) models every gap that is on:
        all but body drag and ground effect (forces from the state, outside its physics inputs)."""
        return not self.ground_effect and not any(k > 0.0 for k in self.body_drag_n_per_mps)

    @property
    def noisy(self) -> bool:
        """Whether any per-step estimator or gyro noise is on."""
        return any(self.noise_std)

    @property
    def noise_std(self) -> tuple[float, float, float]:
        """σ of the position, velocity and gyro noise."""
        return (self.pos_noise_std_m, self.lin_vel_noise_std_mps, self.gyro_noise_std_rad_s)

    @property
    def max_obs_delay(self) -> int:
        return int(self.obs_delay_steps[1])

    @property
    def max_motor_delay(self) -> int:
        return int(self.motor_delay_steps[1])


class QuadGaps:
    """Per-env state of the gap models of :class:`QuadGapCfg` (delay buffers, per-episode draws).

    Shapes (``N`` envs): ``obs_delay [N]``, ``motor_delay [N]`` (long), ``pos_bias [N, 3]``,
    ``gyro_bias [N, 3]``, ``rpm_scale [N, 4]`` (sqrt of the thrust mismatch), ``sag_per_step [N, 1]``,
    ``state_buf [D + 1, N, 18]`` (newest first) and ``action_buf [M + 1, N, 4]`` (newest first).
    """

    def __init__(
        self,
        cfg: QuadGapCfg,
        num_envs: int,
        episode_steps: int,
        state_dim: int,
        hover_action: float,
        device: torch.device,
        generator: torch.Generator,
    ) -> None:
        self.cfg = cfg
        self.n = num_envs
        self.device = device
        self.generator = generator
        self.hover_action = hover_action
        self.episode_steps = episode_steps
        f32 = torch.float32
        self.obs_delay = torch.zeros(num_envs, dtype=torch.long, device=device)
        self.motor_delay = torch.zeros(num_envs, dtype=torch.long, device=device)
        self.pos_bias = torch.zeros(num_envs, 3, dtype=f32, device=device)
        self.gyro_bias = torch.zeros(num_envs, 3, dtype=f32, device=device)
        self.rpm_scale = torch.ones(num_envs, 4, dtype=f32, device=device)
        self.sag_per_step = torch.zeros(num_envs, 1, dtype=f32, device=device)
        self.state_buf = torch.zeros(cfg.max_obs_delay + 1, num_envs, state_dim, dtype=f32, device=device)
        self.action_buf = torch.full((cfg.max_motor_delay + 1, num_envs, 4), hover_action, dtype=f32, device=device)
        self._envs = torch.arange(num_envs, device=device)
        spread = max(abs(cfg.thrust_mismatch[0] - 1.0), abs(cfg.thrust_mismatch[1] - 1.0))
        self._critic_input_scale = torch.tensor(
            [1.0 / max(1, cfg.max_obs_delay), 1.0 / max(1, cfg.max_motor_delay)]
            + [1.0 / spread if spread else 0.0] * 4,
            dtype=f32,
            device=device,
        )
        """``[6]`` :meth:`critic_inputs`' normalization (fixed by the config, so built once)."""

    # ------------------------------------------------------------------ per episode
    def draw(self, count: int, scale: float = 1.0) -> torch.Tensor:
        """``[count, DRAW.width]`` per-episode draws (columns :data:`DRAW`) from the env's generator,
        for the rows of the task's pool of initial conditions.

        ``scale`` in [0, 1] (a training curriculum) shrinks every draw towards the model being
        off: delays ``round(scale * d)``, thrust scale ``1 + scale (m - 1)``, sag and biases
        times ``scale``. The random numbers drawn do not depend on it.
        """
        c, g, dev = self.cfg, self.generator, self.device
        u = torch.rand(count, 7, generator=g, device=dev)
        gauss = torch.randn(count, 6, generator=g, device=dev)
        if scale < 1.0:
            gauss = gauss * scale

        def draw_int(lo_hi: tuple[int, int], col: int) -> torch.Tensor:
            lo, hi = lo_hi
            steps = lo + (u[:, col : col + 1] * (hi - lo + 1)).floor().clamp(max=hi - lo)
            return (steps * scale).round() if scale < 1.0 else steps

        lo, hi = c.thrust_mismatch
        mismatch = lo + u[:, 2:6] * (hi - lo)
        lo, hi = c.battery_sag
        sag = (lo + u[:, 6:7] * (hi - lo)) / self.episode_steps
        if scale < 1.0:  # the full ranges keep their exact arithmetic
            mismatch = 1.0 + (mismatch - 1.0) * scale
            sag = sag * scale
        return torch.cat(
            (
                draw_int(c.obs_delay_steps, 0),
                draw_int(c.motor_delay_steps, 1),
                torch.sqrt(mismatch),
                sag,
                gauss[:, 0:3] * c.pos_bias_std_m,
                gauss[:, 3:6] * c.gyro_bias_std_rad_s,
            ),
            dim=1,
        )

    def redraw(self, mask: torch.Tensor, draws: torch.Tensor) -> None:
        """This episode's values for envs where ``mask [N]``, from their rows ``draws [N, DRAW.width]``
        (:meth:`draw`; rows of other envs are ignored)."""
        m1 = mask.unsqueeze(1)
        self.obs_delay = torch.where(mask, draws[:, DRAW.obs_delay].long(), self.obs_delay)
        self.motor_delay = torch.where(mask, draws[:, DRAW.motor_delay].long(), self.motor_delay)
        self.rpm_scale = torch.where(m1, draws[:, DRAW.rpm_scale], self.rpm_scale)
        self.sag_per_step = torch.where(m1, draws[:, DRAW.sag_per_step], self.sag_per_step)
        self.pos_bias = torch.where(m1, draws[:, DRAW.pos_bias], self.pos_bias)
        self.gyro_bias = torch.where(m1, draws[:, DRAW.gyro_bias], self.gyro_bias)

    def refill(self, mask: torch.Tensor, state_obs: torch.Tensor) -> None:
        """Delay buffers of envs where ``mask [N]`` hold the fresh observation ``state_obs [N, 18]``
        (no older one exists) and the hover command."""
        m3 = mask.view(1, -1, 1)
        self.state_buf = torch.where(m3, state_obs.unsqueeze(0), self.state_buf)
        self.action_buf = torch.where(m3, self.hover_action, self.action_buf)

    def critic_inputs(self) -> torch.Tensor:
        """``[N, 6]`` this episode's draws for a privileged critic, each about in [-1, 1]:
        observation and motor delay over their range's maximum, and the four motors' thrust
        mismatch - 1 over the range's largest deviation from 1 (0 where a model is off)."""
        delays = torch.stack((self.obs_delay, self.motor_delay), dim=1).float()
        return torch.cat((delays, self.rpm_scale.square() - 1.0), dim=1) * self._critic_input_scale

    # ------------------------------------------------------------------ before the physics
    def motor_action(self, action: torch.Tensor) -> torch.Tensor:
        """Push the sent ``action [N, 4]``; return the one each env's motors get now."""
        self.action_buf = torch.cat((action.unsqueeze(0), self.action_buf[:-1]), dim=0)
        return self.action_buf[self.motor_delay, self._envs]

    def rpm_limits(self, episode_step: torch.Tensor, max_rpm: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rpm_scale [N, 4], rpm_cap [N, 1])``: thrust mismatch as a setpoint scale
        (thrust ∝ rpm²) and the battery-sag cap on the setpoint at this episode step."""
        available = (1.0 - self.sag_per_step * episode_step.unsqueeze(1).float()).clamp(min=0.0)
        return self.rpm_scale, torch.sqrt(available) * max_rpm

    def extra_acc_w(
        self, state: torch.Tensor, rot_wb: torch.Tensor, thrust_coef: torch.Tensor, inv_mass: torch.Tensor
    ) -> torch.Tensor | None:
        """``[N, 3]`` world acceleration of body drag and ground effect from ``state [N, 17]``
        and row-major ``rot_wb [N, 9]``; None when both are off."""
        c = self.cfg
        acc: torch.Tensor | None = None
        rot = rot_wb.view(-1, 3, 3)
        if any(k > 0.0 for k in c.body_drag_n_per_mps):
            drag = torch.tensor(c.body_drag_n_per_mps, dtype=state.dtype, device=state.device)
            vel_b = torch.einsum("nji,nj->ni", rot, state[:, LIN_VEL])
            acc = torch.einsum("nij,nj->ni", rot, -drag * vel_b) * inv_mass
        if c.ground_effect:
            # Cheeseman & Bennett: T_ige / T_oge = 1 / (1 - (R / 4z)^2), bounded near the ground.
            z = state[:, POS][:, 2:3].clamp(min=c.rotor_radius_m)
            gain = 1.0 / (1.0 - (c.rotor_radius_m / (4.0 * z)).square()) - 1.0
            thrust = (state[:, RPM].square().sum(dim=1, keepdim=True)) * thrust_coef
            ge = rot[:, :, 2] * (gain * thrust * inv_mass)
            acc = ge if acc is None else acc + ge
        return acc

    # ------------------------------------------------------------------ after the physics
    def push(self, state_obs: torch.Tensor) -> None:
        """Record the newest state terms ``[N, 18]`` (after a physics step)."""
        self.state_buf = torch.cat((state_obs.unsqueeze(0), self.state_buf[:-1]), dim=0)

    def view(self, policy: torch.Tensor, state_dim: int) -> torch.Tensor:
        """``policy [N, D]`` as the vehicle would see it: state terms (first ``state_dim``) from
        the delay buffer, plus estimator and gyro errors; the rest (integral, history) unchanged."""
        c, g, n = self.cfg, self.generator, self.n
        seen = self.state_buf[self.obs_delay, self._envs].clone()
        seen[:, 0:3] += self.pos_bias
        seen[:, 15:18] += self.gyro_bias
        if self.cfg.noisy:  # no draw otherwise: the generator's stream stays the pool's
            noise = torch.randn(n, 9, generator=g, device=self.device)
            seen[:, 0:3] += noise[:, 0:3] * c.pos_noise_std_m
            seen[:, 12:15] += noise[:, 3:6] * c.lin_vel_noise_std_mps
            seen[:, 15:18] += noise[:, 6:9] * c.gyro_noise_std_rad_s
        return torch.cat((seen, policy[:, state_dim:]), dim=1)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The per-env state in :data:`STATE_KEYS` order (what the fused step takes and returns)."""
        return tuple(getattr(self, k) for k in STATE_KEYS)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: getattr(self, k).clone() for k in STATE_KEYS}

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        for k in STATE_KEYS:
            if k in sd:
                setattr(self, k, sd[k].to(self.device).clone())


STATE_KEYS = (
    "obs_delay",
    "motor_delay",
    "rpm_scale",
    "sag_per_step",
    "pos_bias",
    "gyro_bias",
    "state_buf",
    "action_buf",
)
"""Names of :class:`QuadGaps`' per-env state, in the order the fused step's arguments take them."""
