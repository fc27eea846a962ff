"""MuJoCo's native batch API (``mjb_*`` in ``mjbatch.h``) through ctypes.

Why not ``mujoco.batch.Batch``: gymnasium's locomotion observations read ``cfrc_ext`` after
``mj_rnePostConstraint`` runs on the final RK4 stage of a step, and only ``mjb_apply`` (which
the Python wrapper does not expose) can run that function inside the batch, per simulation,
on the batch's own threads. Everything here is a thin typed view over the C library that the
``mujoco`` package already loaded; no physics happens in Python.

Shapes: ``N`` = ``nsim``. Every array returned is a live numpy view of C storage:
state views are writable (a write is the simulation's state at its next call), outputs are
refreshed after every call on a simulation.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
from collections.abc import Sequence
from typing import Any

import mujoco
import numpy as np

_P = ctypes.c_void_p
_I = ctypes.c_int
_IP = ctypes.POINTER(ctypes.c_int)


class _BatchConfig(ctypes.Structure):
    """Mirror of ``mjBatchConfig``."""

    _fields_ = [("nthread", ctypes.c_int), ("persistent", ctypes.c_ubyte)]


def _library() -> ctypes.CDLL:
    """The ``libmujoco`` the ``mujoco`` package ships (already loaded: same global state)."""
    folder = os.path.dirname(mujoco.__file__)
    candidates = sorted(glob.glob(os.path.join(folder, "libmujoco.so*")))
    candidates += sorted(glob.glob(os.path.join(folder, "libmujoco*.dylib")))
    if not candidates:
        raise ImportError(f"no libmujoco shared library next to {mujoco.__file__}")
    lib = ctypes.CDLL(candidates[0])
    if not hasattr(lib, "mjb_makeBatch"):
        raise ImportError(f"mujoco {mujoco.__version__} has no batch API (mjb_*); mujoco >= 4.0 needed")
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "mjb_makeBatch": (_P, [_P, _I, ctypes.POINTER(_BatchConfig), ctypes.c_char_p, _I]),
        "mjb_deleteBatch": (None, [_P]),
        "mjb_nstate": (_I, [_P]),
        "mjb_state": (_P, [_P]),
        "mjb_stateComponent": (_P, [_P, _I, _IP]),
        "mjb_output": (_P, [_P, ctypes.c_char_p, _IP, _IP]),
        "mjb_expand": (_P, [_P, ctypes.c_char_p, _IP, _IP]),
        "mjb_setConst": (_I, [_P, _P, _I]),
        "mjb_step": (_I, [_P, _P, _I, _I, _I]),
        "mjb_forward": (_I, [_P, _P, _I, _I]),
        "mjb_reset": (_I, [_P, _P, _I, _P, _I]),
        "mjb_apply": (_I, [_P, _P, _I, _P, _P, _I]),
        "mjb_status": (_P, [_P]),
        "mjb_error": (ctypes.c_char_p, [_P, _I]),
        "mjb_nthread": (_I, [_P]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


_LIB: ctypes.CDLL | None = None


def library() -> ctypes.CDLL:
    global _LIB
    if _LIB is None:
        _LIB = _library()
    return _LIB


_NUM = np.dtype(np.float64)
_STAGE_NONE = int(mujoco.mjtStage.mjSTAGE_NONE)
STAGE_ACC = int(mujoco.mjtStage.mjSTAGE_ACC)


class NativeBatch:
    """``nsim`` simulations of a copy of ``model`` on ``nthread`` C threads (0: one per CPU).

    ``persistent=True`` keeps one ``mjData`` per simulation, so derived quantities of the last
    step (contacts, constraint forces) survive between calls, which :meth:`rne_post_constraint`
    needs. Otherwise an ``mjData`` per thread serves many simulations (less memory, faster).
    """

    def __init__(self, model: mujoco.MjModel, nsim: int, nthread: int = 0, persistent: bool = False):
        lib = library()
        self._lib = lib
        self.model = model
        self.nsim = int(nsim)
        err = ctypes.create_string_buffer(1000)
        cfg = _BatchConfig(int(nthread), int(persistent))
        handle = lib.mjb_makeBatch(model._address, self.nsim, ctypes.byref(cfg), err, len(err))
        if not handle:
            raise RuntimeError(f"mjb_makeBatch failed: {err.value.decode(errors='replace')}")
        self._b: int | None = handle
        self.persistent = persistent
        self.nthread = int(lib.mjb_nthread(handle))
        self.nstate = int(lib.mjb_nstate(handle))
        self._state_addr = int(lib.mjb_state(handle))
        self.state = self._view(self._state_addr, (self.nsim, self.nstate), _NUM)
        """All state rows ``[N, nstate]`` (``mjSTATE_INTEGRATION`` order), writable."""
        self._outputs: dict[str, np.ndarray] = {}
        self._expanded: dict[str, np.ndarray] = {}
        self._data = mujoco.MjData(model)  # field shapes and dtypes only
        self._rne = ctypes.cast(lib.mj_rnePostConstraint, ctypes.c_void_p).value

    @staticmethod
    def _view(addr: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        count = int(np.prod(shape))
        buf = (ctypes.c_char * (count * dtype.itemsize)).from_address(addr)
        return np.frombuffer(memoryview(buf), dtype=dtype, count=count).reshape(shape)

    def _handle(self) -> int:
        if self._b is None:
            raise RuntimeError("the MuJoCo batch was closed")
        return self._b

    def state_field(self, component: mujoco.mjtState) -> np.ndarray:
        """Writable ``[N, size]`` view of one state component (e.g. ``mjSTATE_QPOS``)."""
        size = _I()
        addr = self._lib.mjb_stateComponent(self._handle(), int(component), ctypes.byref(size))
        if not addr:
            return np.zeros((self.nsim, 0))
        offset = (int(addr) - self._state_addr) // _NUM.itemsize
        return self.state[:, offset : offset + size.value]

    def _field(self, name: str, owner: Any, register: Any, cache: dict[str, np.ndarray]) -> np.ndarray:
        """``[N, *field.shape]`` view of the batch storage ``register`` returns for ``name``."""
        if name in cache:
            return cache[name]
        template = getattr(owner, name, None)
        size, elem = _I(), _I()
        addr = register(self._handle(), name.encode(), ctypes.byref(size), ctypes.byref(elem))
        if not addr or not isinstance(template, np.ndarray):
            kind = "an output" if owner is self._data else "a per-simulation model field"
            raise ValueError(f"{name!r} cannot be {kind} of a MuJoCo batch")
        cache[name] = self._view(int(addr), (self.nsim, *template.shape), template.dtype)
        return cache[name]

    def output(self, name: str) -> np.ndarray:
        """``[N, *field.shape]`` view of an ``mjData`` field, copied out after every call."""
        return self._field(name, self._data, self._lib.mjb_output, self._outputs)

    def expand(self, name: str) -> np.ndarray:
        """Give model field ``name`` per-simulation values; a writable ``[N, *field.shape]`` view."""
        return self._field(name, self.model, self._lib.mjb_expand, self._expanded)

    def _ids(self, ids: Sequence[int] | np.ndarray | None) -> tuple[Any, int, np.ndarray | None]:
        if ids is None:
            return None, self.nsim, None
        arr = np.ascontiguousarray(ids, dtype=np.int32)
        return arr.ctypes.data, len(arr), arr  # keep ``arr`` alive during the call

    def _check(self, nfail: int) -> None:
        if nfail:
            status = self._view(int(self._lib.mjb_status(self._handle())), (self.nsim,), np.dtype(np.int32))
            sims = np.flatnonzero(status)
            first = int(sims[0]) if len(sims) else 0
            message = self._lib.mjb_error(self._handle(), first).decode(errors="replace")
            raise RuntimeError(f"MuJoCo failed in {nfail} simulations (first: {first}): {message}")

    def step(self, nstep: int, ids: Sequence[int] | np.ndarray | None = None) -> None:
        """``nstep`` calls of ``mj_step`` per simulation (derived outputs one substep behind)."""
        ptr, n, _keep = self._ids(ids)
        self._check(self._lib.mjb_step(self._handle(), ptr, n, int(nstep), _STAGE_NONE))

    def forward(self, ids: Sequence[int] | np.ndarray | None = None, stage: int = STAGE_ACC) -> None:
        """``mj_forward`` (up to ``stage``) at the current state of each simulation."""
        ptr, n, _keep = self._ids(ids)
        if n:
            self._check(self._lib.mjb_forward(self._handle(), ptr, n, int(stage)))

    def reset(self, ids: Sequence[int] | np.ndarray | None = None) -> None:
        """``mj_resetData`` (model defaults, zero time/ctrl/warm-start); no forward pass."""
        ptr, n, _keep = self._ids(ids)
        if n:
            self._check(self._lib.mjb_reset(self._handle(), ptr, n, None, _STAGE_NONE))

    def set_const(self, ids: Sequence[int] | np.ndarray | None = None) -> None:
        """``mj_setConst`` per simulation after editing expanded mass/inertia fields."""
        ptr, n, _keep = self._ids(ids)
        if n:
            self._check(self._lib.mjb_setConst(self._handle(), ptr, n))

    def rne_post_constraint(self) -> None:
        """Run ``mj_rnePostConstraint`` on every simulation (fills ``cfrc_ext``, ``cacc``).

        Needs a persistent batch: it reads the contacts and constraint forces of the last
        step, which only a per-simulation ``mjData`` keeps. ``mj_rnePostConstraint(m, d)`` is
        passed where ``mjfBatchFunc(m, d, sim, arg)`` is expected: the two extra integer and
        pointer arguments travel in registers the callee never reads (x86-64 SysV, AArch64).
        """
        if not self.persistent:
            raise RuntimeError("rne_post_constraint needs a persistent batch")
        self._check(self._lib.mjb_apply(self._handle(), None, self.nsim, self._rne, None, 0))
        # mjb_apply does not refresh the outputs afterwards; a forward call up to mjSTAGE_NONE
        # computes nothing and copies every output out again
        self.forward(stage=_STAGE_NONE)

    def close(self) -> None:
        if self._b is not None:
            # drop views first: they point into storage the delete frees
            self._outputs.clear()
            self._expanded.clear()
            self._lib.mjb_deleteBatch(self._b)
            self._b = None

    def __del__(self) -> None:
        # at interpreter shutdown the library may be gone already
        with contextlib.suppress(Exception):
            self.close()
