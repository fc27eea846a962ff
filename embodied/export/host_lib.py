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
            lib.cfh_tick.argtypes = [ctypes.c_uint32, _P, _P, _P, ctypes.c_uint32, ctypes.c_int, _P]
            lib.cfh_tick.restype = ctypes.c_int
            lib.controllerOutOfTreeTest.restype = ctypes.c_bool

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
        ``[n, 4]`` (x, y, z in m, world; yaw in rad)."""
        n = ctxs.shape[0]
        s = _f32(states, (n, STATE_FLOATS), "states")
        sp = _f32(setpoints_w, (n, 4), "setpoints_w")
        obs = np.zeros((n, self.obs_dim), dtype=np.float32)
        clamped = self._lib.sil_assemble_obs(_ptr(ctxs), n, _ptr(s), _ptr(sp), _ptr(obs))
        return obs, int(clamped)

    def step(self, ctxs: np.ndarray, states: np.ndarray, setpoints_w: np.ndarray) -> np.ndarray:
        """One control step per vehicle: ``actions [n, 4]`` in [-1, 1]; histories advance.
        ``setpoints_w [n, 4]``: x, y, z (m, world), yaw (rad)."""
        n = ctxs.shape[0]
        s = _f32(states, (n, STATE_FLOATS), "states")
        sp = _f32(setpoints_w, (n, 4), "setpoints_w")
        out = np.zeros((n, 4), dtype=np.float32)
        self._lib.sil_step(_ptr(ctxs), n, _ptr(s), _ptr(sp), _ptr(out))
        return out

    def cf_init(self) -> bool:
        """``controllerOutOfTreeInit()`` then ``controllerOutOfTreeTest()`` of the Crazyflie app."""
        self._lib.controllerOutOfTreeInit()
        return bool(self._lib.controllerOutOfTreeTest())

    def cf_tick(
        self,
        tick: int,
        state13: np.ndarray,
        gyro_deg_s: np.ndarray,
        setpoint_w: np.ndarray,
        setpoint_timestamp_ms: int,
        position_mode: bool = True,
    ) -> tuple[int, np.ndarray]:
        """One 1 kHz stabilizer tick of the app; returns ``(1 policy | 0 PID, forces [4])``.

        ``state13`` is the estimator's state as packed in :data:`STATE_FLOATS` (its last three
        entries are ignored: the app reads body rates from ``gyro_deg_s``, in deg/s).
        """
        s = _f32(state13, (STATE_FLOATS,), "state13")
        g = _f32(gyro_deg_s, (3,), "gyro_deg_s")
        sp = _f32(setpoint_w, (3,), "setpoint_w")
        forces = np.zeros(4, dtype=np.float32)
        mode = self._lib.cfh_tick(
            tick, _ptr(s), _ptr(g), _ptr(sp), setpoint_timestamp_ms, int(position_mode), _ptr(forces)
        )
        return int(mode), forces
