"""ctypes binding of the host build of the firmware code (``libembodied_policy.so``).

The same C that flies on the Crazyflie (generated policy, portable observation assembly,
the app's controller on the firmware shim) runs here on numpy arrays, for parity tests and
software-in-the-loop evaluation.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from embodied.errors import EmbodiedError

STATE_FLOATS = 13
"""Packed raw state per vehicle: pos_w (3), quat_wb w,x,y,z (4), lin_vel_w (3), ang_vel_b (3)."""

MOVING_SETPOINT_FLOATS = 10
"""A moving setpoint row: x, y, z (m), yaw (rad), feed-forward velocity (3, m/s) and acceleration
(3, m/s²), world frame (``sil_api.c``)."""

_P = ctypes.c_void_p


def _ptr(array: np.ndarray) -> int:
    return array.ctypes.data


def _f32(array: np.ndarray, shape: tuple[int, ...], name: str) -> np.ndarray:
    out = np.ascontiguousarray(array, dtype=np.float32)
    if out.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {out.shape}")
    return out


class HostPolicyLib:
    """A loaded ``libembodied_policy.so``; quad methods need a quad-hover policy."""

    def __init__(self, path: Path) -> None:
        path = Path(path)
        if not path.is_file():
            raise EmbodiedError(f"{path} not found; build it with `embodied export RUN_DIR --format c`")
        self.path = path
        self._lib = ctypes.CDLL(str(path.resolve()))
        lib = self._lib
        lib.sil_policy_step.argtypes = [ctypes.c_int, _P, _P]
        lib.sil_policy_step.restype = None
        lib.policy_selftest.restype = ctypes.c_int
        lib.policy_selftest_error.restype = ctypes.c_float
        self.is_quad = hasattr(lib, "sil_obs_dim")
        if self.is_quad:
            lib.sil_ctx_size.restype = ctypes.c_size_t
            lib.sil_model_sha256.restype = ctypes.c_char_p
            lib.sil_reset.argtypes = [_P, ctypes.c_int, _P, ctypes.c_float]
            lib.sil_assemble_obs.argtypes = [_P, ctypes.c_int, _P, _P, _P]
            lib.sil_assemble_obs.restype = ctypes.c_uint32
            lib.sil_step.argtypes = [_P, ctypes.c_int, _P, _P, _P]
            lib.sil_assemble_obs_sp.argtypes = [_P, ctypes.c_int, _P, _P, _P]
            lib.sil_assemble_obs_sp.restype = ctypes.c_uint32
            lib.sil_step_sp.argtypes = [_P, ctypes.c_int, _P, _P, _P]
        # The Crazyflie app on the shim (cfh_*), built in for thrust-action quad policies.
        self.has_app = hasattr(lib, "cfh_tick")
        if self.has_app:
            lib.cfh_tick.argtypes = [ctypes.c_uint32, _P, _P, _P, ctypes.c_float, ctypes.c_uint32, ctypes.c_int]
            lib.cfh_tick.argtypes += [ctypes.c_float, _P, _P]
            lib.cfh_tick.restype = ctypes.c_int
            lib.cfh_param_set.argtypes = [ctypes.c_char_p, ctypes.c_double]
            lib.cfh_set_feedforward.argtypes = [_P, _P]
            lib.cfh_log_get.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_double)]
            lib.controllerOutOfTreeTest.restype = ctypes.c_bool
            lib.shim_eprintf_problem.argtypes = [ctypes.c_char_p]
            lib.shim_eprintf_problem.restype = ctypes.c_char_p
            lib.cfh_motor_chain.argtypes = [ctypes.c_int, _P, _P, _P, _P]
            lib.cfh_control.argtypes = [_P, _P, _P, _P]
            lib.cfh_control.restype = ctypes.c_int

    # ------------------------------------------------------------------ network only
    def policy_step(self, obs: np.ndarray, action_dim: int) -> np.ndarray:
        """``obs [N, D]`` -> ``actions [N, action_dim]`` through ``policy_step``."""
        obs = np.ascontiguousarray(obs, dtype=np.float32)
        if obs.ndim != 2:
            raise ValueError(f"obs: expected [N, D], got shape {obs.shape}")
        out = np.zeros((obs.shape[0], action_dim), dtype=np.float32)
        self._lib.sil_policy_step(obs.shape[0], _ptr(obs), _ptr(out))
        return out

    def selftest(self) -> tuple[bool, float]:
        """``(passed, max |error|)`` of the embedded example."""
        return bool(self._lib.policy_selftest()), float(self._lib.policy_selftest_error())

    # ------------------------------------------------------------------ quad controller
    @property
    def obs_dim(self) -> int:
        return int(self._lib.sil_obs_dim())

    @property
    def control_period_us(self) -> int:
        return int(self._lib.sil_control_period_us())

    @property
    def model_sha256(self) -> str:
        return bytes(self._lib.sil_model_sha256()).decode()

    def new_contexts(self, n: int, initial_action: float) -> np.ndarray:
        """Opaque controller contexts for ``n`` vehicles (a byte array the C side owns)."""
        ctxs = np.zeros((n, int(self._lib.sil_ctx_size())), dtype=np.uint8)
        self._lib.sil_reset(_ptr(ctxs), n, None, ctypes.c_float(initial_action))
        return ctxs

    def reset(self, ctxs: np.ndarray, mask: np.ndarray, initial_action: float) -> None:
        """Reset the contexts where ``mask [n] bool``."""
        m = np.ascontiguousarray(mask, dtype=np.uint8)
        self._lib.sil_reset(_ptr(ctxs), ctxs.shape[0], _ptr(m), ctypes.c_float(initial_action))

    def assemble_obs(self, ctxs: np.ndarray, states: np.ndarray, setpoints_w: np.ndarray) -> tuple[np.ndarray, int]:
        """``(obs [n, obs_dim], clamped_inputs)`` from packed states ``[n, 13]`` and setpoints
        ``[n, 4]`` (x, y, z in m, world; yaw in rad) or, for a moving setpoint, ``[n, 10]``
        (then vx, vy, vz in m/s and ax, ay, az in m/s², world: the feed-forward)."""
        n = ctxs.shape[0]
        s = _f32(states, (n, STATE_FLOATS), "states")
        moving = np.shape(setpoints_w)[-1:] == (MOVING_SETPOINT_FLOATS,)
        sp = _f32(setpoints_w, (n, MOVING_SETPOINT_FLOATS if moving else 4), "setpoints_w")
        obs = np.zeros((n, self.obs_dim), dtype=np.float32)
        assemble = self._lib.sil_assemble_obs_sp if moving else self._lib.sil_assemble_obs
        clamped = assemble(_ptr(ctxs), n, _ptr(s), _ptr(sp), _ptr(obs))
        return obs, int(clamped)

    def step(self, ctxs: np.ndarray, states: np.ndarray, setpoints_w: np.ndarray) -> np.ndarray:
        """One control step per vehicle: ``actions [n, 4]`` in [-1, 1]; histories advance.
        ``setpoints_w [n, 4]``: x, y, z (m, world), yaw (rad); ``[n, 10]`` adds the feed-forward
        velocity and acceleration (:meth:`assemble_obs`)."""
        n = ctxs.shape[0]
        s = _f32(states, (n, STATE_FLOATS), "states")
        moving = np.shape(setpoints_w)[-1:] == (MOVING_SETPOINT_FLOATS,)
        sp = _f32(setpoints_w, (n, MOVING_SETPOINT_FLOATS if moving else 4), "setpoints_w")
        out = np.zeros((n, 4), dtype=np.float32)
        (self._lib.sil_step_sp if moving else self._lib.sil_step)(_ptr(ctxs), n, _ptr(s), _ptr(sp), _ptr(out))
        return out

    def cf_init(self) -> bool:
        """``controllerOutOfTreeInit()`` then ``controllerOutOfTreeTest()`` of the Crazyflie app."""
        if not self.has_app:
            raise EmbodiedError(
                f"{self.path} has no Crazyflie app built in: the policy lacks the motor_thrust action (docs/conventions.md, command chain)"
            )
        self._lib.cfh_boot()  # the stabilizer's command zeroed, then controllerOutOfTreeInit()
        return bool(self._lib.controllerOutOfTreeTest())

    def cf_tick(
        self,
        tick: int,
        estimate10: np.ndarray,
        gyro_deg_s: np.ndarray,
        setpoint_w: np.ndarray,
        setpoint_timestamp_ms: int,
        setpoint_yaw_deg: float = 0.0,
        position_mode: bool = True,
        supply_voltage_v: float = 3.9,
        setpoint_vel_w: np.ndarray | None = None,
        setpoint_acc_w: np.ndarray | None = None,
    ) -> tuple[int, np.ndarray, np.ndarray]:
        """One 1 kHz stabilizer tick of the app, then the shim's motor chain.

        ``estimate10`` is the estimator's pos_w (3), quat_wb w, x, y, z (4), lin_vel_w (3);
        ``gyro_deg_s [3]`` the IMU's body rates in deg/s; the setpoint is a position (m) and yaw
        (deg) stamped ``setpoint_timestamp_ms`` (absolute modes when ``position_mode``), with the
        feed-forward ``setpoint_vel_w [3]`` (m/s) and ``setpoint_acc_w [3]`` (m/s²) of a moving
        setpoint in ``setpoint_t.velocity`` / ``.acceleration`` (zero when None).
        Returns ``(control mode: 2 force (policy) | 0 legacy (PID), normalizedForces [4],
        thrust per motor [4] in N at ``supply_voltage_v``)``.
        """
        s = _f32(estimate10, (10,), "estimate10")
        g = _f32(gyro_deg_s, (3,), "gyro_deg_s")
        sp = _f32(setpoint_w, (3,), "setpoint_w")
        zero = np.zeros(3, dtype=np.float32)
        vel = _f32(zero if setpoint_vel_w is None else setpoint_vel_w, (3,), "setpoint_vel_w")
        acc = _f32(zero if setpoint_acc_w is None else setpoint_acc_w, (3,), "setpoint_acc_w")
        self._lib.cfh_set_feedforward(_ptr(vel), _ptr(acc))
        forces = np.zeros(4, dtype=np.float32)
        thrust_n = np.zeros(4, dtype=np.float32)
        mode = self._lib.cfh_tick(
            tick,
            _ptr(s),
            _ptr(g),
            _ptr(sp),
            ctypes.c_float(setpoint_yaw_deg),
            setpoint_timestamp_ms,
            int(position_mode),
            ctypes.c_float(supply_voltage_v),
            _ptr(forces),
            _ptr(thrust_n),
        )
        return int(mode), forces, thrust_n

    def cf_control(self) -> tuple[int, np.ndarray, float, np.ndarray, float]:
        """The stabilizer's command after the last :meth:`cf_tick` and the stand-in PID's own
        output: ``(mode, roll/pitch/yaw [3] int16, thrust, PID roll/pitch/yaw [3], PID thrust)``."""
        rpy = np.zeros(3, dtype=np.int16)
        pid_rpy = np.zeros(3, dtype=np.int16)
        thrust = np.zeros(2, dtype=np.float32)  # the command's, the PID's
        mode = self._lib.cfh_control(_ptr(rpy), _ptr(thrust[0:]), _ptr(pid_rpy), _ptr(thrust[1:]))
        return int(mode), rpy, float(thrust[0]), pid_rpy, float(thrust[1])

    def cf_param_set(self, name: str, value: float) -> None:
        """Write parameter ``embodied.<name>`` as cfclient would."""
        if self._lib.cfh_param_set(name.encode(), float(value)) != 0:
            raise KeyError(f"no parameter embodied.{name}")

    def cf_log(self, name: str) -> float:
        """Read log variable ``embodied.<name>``."""
        out = ctypes.c_double()
        if self._lib.cfh_log_get(name.encode(), ctypes.byref(out)) != 0:
            raise KeyError(f"no log variable embodied.{name}")
        return float(out.value)

    def console(self) -> str:
        """Everything the app printed with DEBUG_PRINT so far (then cleared)."""
        buf = (ctypes.c_char * 4096).in_dll(self._lib, "shim_console")
        out = bytes(buf).split(b"\0", 1)[0].decode(errors="replace")
        self._lib.shim_console_clear()
        return out

    def eprintf_problem(self, fmt: str) -> str | None:
        """Why the firmware's eprintf cannot print ``fmt`` (the shim's model), or None."""
        problem = self._lib.shim_eprintf_problem(fmt.encode())
        return None if problem is None else bytes(problem).decode()

    def motor_chain(self, forces: np.ndarray, supply_voltage_v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The shim's model of the firmware's force-mode motor chain: ``forces [n, 4]`` (0..1) at
        supply voltages ``[n]`` -> ``(pwm [n, 4] in 0..65535, thrust per motor [n, 4] in N)``."""
        n = forces.shape[0]
        f = _f32(forces, (n, 4), "forces")
        v = _f32(supply_voltage_v, (n,), "supply_voltage_v")
        pwm = np.zeros((n, 4), dtype=np.uint16)
        thrust = np.zeros((n, 4), dtype=np.float32)
        self._lib.cfh_motor_chain(n, _ptr(f), _ptr(v), _ptr(pwm), _ptr(thrust))
        return pwm, thrust
