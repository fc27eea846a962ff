"""Assembles the policy observation from incoming messages, as a robot config declares it.

Every observation field of ``policy_io.json`` is one *signal*: a message field flattened to a
vector (``pose.pose.position`` -> ``[x, y, z]``) followed by declared conversions (ops). No
robot is hand-coded here: frames and units are converted by the ops a config lists.

Ops (YAML ``ops: [name, {name: argument}]``):

=========================  ====================================================================
``subtract: P``            minus a parameter name or a literal list (position error vs setpoint),
                           or ``{input, path}``: minus a field of another input's newest message
                           (a moving goal: ``geometry_msgs/PoseStamped`` position,
                           ``TwistStamped`` linear velocity)
``add: P``                 plus a parameter name, a literal list or ``{input, path}``
``scale: k``               times a number or a per-entry list
``deg_to_rad``             times pi/180 (deg -> rad, deg/s -> rad/s)
``ned_to_enu``             3-vector ``[n, e, d] -> [e, n, -d]`` (its own inverse)
``enu_to_ned``             same permutation, for readability in configs
``frd_to_flu``             body 3-vector ``[x, y, z] -> [x, -y, -z]`` (its own inverse)
``flu_to_frd``             same, for readability
``quat_to_rotmat: ORDER``  quaternion (``xyzw`` = ROS field order, or ``wxyz``) -> R body->world,
                           9 entries row-major, normalized first
``rotmat_ned_frd_to_enu_flu``  9 -> 9: attitude of an NED/FRD estimator in ENU/FLU
``rotate_body_to_world``   3-vector by the quaternion ``{input, path, order}`` (e.g. ROS
                           Odometry twist, which is in the child/body frame)
``rotate_world_to_body``   the inverse rotation
``world_to_heading: YAW``  into the heading frame ``h`` = world rotated about z by ``YAW`` (rad; a
                           number or a one-entry param, e.g. ``setpoint_yaw_rad``; or
                           ``{input, path, order}`` naming a quaternion, e.g. a moving goal's
                           ``pose.orientation``, whose yaw ``atan2(2(wz + xy), 1 - 2(y² + z²))``
                           is read from every new message):
                           3-vector ``R_whᵀ v``; 9-entry row-major rotation ``R_whᵀ R`` (e.g.
                           ``rot_wb`` -> ``rot_hb``)
``select_by_name``         ``{names_path, names}``: reorder by the message's own name list
                           (``sensor_msgs/JointState``)
``select: [i, ...]``       pick entries by index
``fill_nan: V``             NaN entries become ``V`` ("not measured", e.g. joint_state_broadcaster's
                           velocity of a joint without a velocity interface): a number for all
                           entries, or a per-entry list where ``null`` keeps NaN a fault
``integrate: {decay, limit, dt_s}``  stateful, leaky clamped integral of the signal so far (e.g.
                           quad-hover's ``pos_err_int_w``): zero on the first observation after
                           a reset, then ``I = clip(decay * I + dt_s * v, -limit, limit)`` per
                           entry on every later one. Each value is a number, a ``params`` name
                           or a number in ``policy_io.json``'s ``extra`` (``pos_err_int_decay``);
                           ``decay`` defaults to 1 (pure integrator), ``limit`` to none,
                           ``dt_s`` to the policy's control period. It resets with the action
                           history (each time the node (re-)arms), as the task does per episode.
                           Observation fields only.
=========================  ====================================================================

A field with ``optional: true`` is skipped when the policy does not take it, so one robot config
serves policies with and without such a field.

Runtime problems (missing input, wrong sizes, NaN, unknown joint names, a quaternion off unit norm) raise
:class:`ObservationError`; the node then commands the safe command and stays up.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from embodied.config import ConfigError, unknown_choice_message
from embodied.errors import EmbodiedError
from embodied.io_spec import IOSpec
from embodied.real import messages
from embodied.real.robot_config import OpCfg, RobotConfig, SignalCfg

Latest = Mapping[str, Any]
"""Input name -> newest message."""

Apply = Callable[[np.ndarray, Latest], np.ndarray]
SizeFn = Callable[[int | None], int | None]


class ObservationError(EmbodiedError):
    """Incoming data cannot form a valid observation (the node goes to its safe command).

    ``reason`` is the counter it is published under on ``/diagnostics`` (``rejected.<reason>``)."""

    def __init__(self, message: str, reason: str = "invalid_observation") -> None:
        super().__init__(message)
        self.reason = reason


WRONG_SIZE = "wrong_size"
"""Rejection reason: a message field holds another number of values than the config reads."""

QUAT_NORM_SQ_TOL = 0.01
"""Largest ``| |q|^2 - 1 |`` accepted from a message quaternion (about 0.5 % on the norm): float32
round-off and a filter's drift pass; a quaternion of norm 10 or 0.5 is corrupt data, not an
attitude, and is rejected like NaN instead of being normalized and flown."""


def unit_quaternion(q: np.ndarray, what: str = "quaternion") -> np.ndarray:
    """``q`` [4] divided by its norm; :class:`ObservationError` when it is not finite or its
    squared norm is further than :data:`QUAT_NORM_SQ_TOL` from 1."""
    norm_sq = float(np.dot(q, q))
    if not math.isfinite(norm_sq):
        raise ObservationError(f"{what} {q.tolist()} is not finite")
    if not abs(norm_sq - 1.0) <= QUAT_NORM_SQ_TOL:
        raise ObservationError(
            f"{what} {q.tolist()} has norm {math.sqrt(norm_sq):.6g}; a unit quaternion is expected "
            f"(|norm^2 - 1| <= {QUAT_NORM_SQ_TOL})"
        )
    return np.asarray(q / math.sqrt(norm_sq), dtype=np.float64)


def quat_to_rotmat(q_wxyz: np.ndarray) -> np.ndarray:
    """Unit quaternion ``(w, x, y, z)`` [4] -> rotation matrix body->world [3, 3] (a quaternion
    off unit norm raises, see :func:`unit_quaternion`)."""
    w, x, y, z = unit_quaternion(q_wxyz)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def _wxyz(q: np.ndarray, order: str) -> np.ndarray:
    return q if order == "wxyz" else np.array([q[3], q[0], q[1], q[2]])


# Axis permutations between conventions; each is its own inverse.
_NED_ENU = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])
_FRD_FLU = np.diag([1.0, -1.0, -1.0])


@dataclass(frozen=True)
class Signal:
    """A compiled signal: ``read(latest, history) -> float64 [size]``."""

    key: str
    input: str
    read: Callable[[Latest, np.ndarray], np.ndarray]
    size: int | None
    """Static size, or ``None`` when it depends on the message (unbounded sequences)."""


class Integrator:
    """State of one ``integrate`` op: ``I [n]`` float64, the op's rule (module docstring)."""

    def __init__(self, decay: float, limit: float, dt_s: float) -> None:
        self.decay, self.limit, self.dt_s = decay, limit, dt_s
        self.value: np.ndarray | None = None
        """None until the first observation after :meth:`reset` (which yields zeros)."""

    def reset(self) -> None:
        self.value = None

    def __call__(self, v: np.ndarray, _latest: Latest) -> np.ndarray:
        if self.value is None:
            self.value = np.zeros_like(v, dtype=np.float64)
        elif self.value.shape != v.shape:
            raise ObservationError(f"integrate: the signal changed size from {self.value.size} to {v.size}")
        else:
            # decay * I + dt * v, then the clip: the order quad-hover and the firmware use.
            self.value = np.clip(self.decay * self.value + self.dt_s * v, -self.limit, self.limit)
        return self.value.copy()


class _Compiler:
    """Turns :class:`SignalCfg` into :class:`Signal`, checking paths, params and sizes.

    ``io_spec`` (absent for stand-alone signals such as ``safety.hold``) resolves names in
    ``policy_io.json``'s ``extra``; every stateful op compiled is listed in ``integrators``.
    """

    def __init__(self, robot: RobotConfig, io_spec: IOSpec | None = None) -> None:
        self.robot = robot
        self.io_spec = io_spec
        self.integrators: list[Integrator] = []

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.robot.path}: {key}: {message}")

    def vector_arg(self, arg: Any, key: str) -> np.ndarray:
        if isinstance(arg, str):
            if arg not in self.robot.params:
                raise self.fail(key, unknown_choice_message("parameter", arg, self.robot.params or ["<none>"]))
            return np.asarray(self.robot.params[arg], dtype=np.float64)
        if isinstance(arg, int | float) and not isinstance(arg, bool):
            return np.asarray([float(arg)])
        if isinstance(arg, list) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in arg):
            return np.asarray(arg, dtype=np.float64)
        raise self.fail(key, f"expected a parameter name, a number or a list of numbers, got {arg!r}")

    def scalar_arg(self, arg: Any, key: str) -> float:
        """A number, a one-entry ``params`` name, or a number in ``policy_io.json``'s ``extra``."""
        if isinstance(arg, int | float) and not isinstance(arg, bool):
            return float(arg)
        if isinstance(arg, str):
            if arg in self.robot.params:
                value = self.robot.params[arg]
                if len(value) != 1:
                    raise self.fail(key, f"parameter {arg!r} has {len(value)} values, expected one number")
                return float(value[0])
            extra = self.io_spec.extra if self.io_spec is not None else {}
            found = extra.get(arg)
            if isinstance(found, int | float) and not isinstance(found, bool):
                return float(found)
            numeric = [k for k, v in extra.items() if isinstance(v, int | float) and not isinstance(v, bool)]
            raise self.fail(
                key, unknown_choice_message("parameter or policy_io extra number", arg, [*self.robot.params, *numeric])
            )
        raise self.fail(key, f"expected a number or the name of one, got {arg!r}")

    def integrator(self, arg: Any, key: str) -> Integrator:
        if self.io_spec is None:
            raise self.fail(key, "integrate keeps state between control steps: only observation fields may use it")
        spec = arg if isinstance(arg, Mapping) else None
        if spec is None or any(k not in ("decay", "limit", "dt_s") for k in spec):
            raise self.fail(key, f"integrate needs a mapping with keys decay, limit, dt_s (all optional), got {arg!r}")
        decay = self.scalar_arg(spec.get("decay", 1.0), f"{key}.decay")
        limit = self.scalar_arg(spec["limit"], f"{key}.limit") if "limit" in spec else math.inf
        dt_s = self.scalar_arg(spec.get("dt_s", self.io_spec.control_period_s), f"{key}.dt_s")
        if not 0.0 < decay <= 1.0:
            raise self.fail(f"{key}.decay", f"must be in (0, 1], got {decay}")
        if not (limit > 0.0 and dt_s > 0.0):
            raise self.fail(key, f"limit and dt_s must be > 0, got limit={limit}, dt_s={dt_s}")
        integ = Integrator(decay, limit, dt_s)
        self.integrators.append(integ)
        return integ

    def field_reader(self, input_name: str, path: str, key: str) -> tuple[Callable[[Latest], Any], int | None]:
        type_name = self.robot.inputs[input_name].type
        try:
            kind, spec = messages.resolve_path(type_name, path)
        except EmbodiedError as err:
            raise self.fail(key, str(err)) from None

        def get(latest: Latest) -> Any:
            if input_name not in latest:
                raise ObservationError(f"no message received yet on input {input_name!r}")
            return messages.get_path(latest[input_name], path)

        return get, messages.numeric_size(kind, spec)

    def op(self, op: OpCfg, key: str, input_name: str) -> tuple[Apply, SizeFn]:
        same: SizeFn = lambda n: n  # noqa: E731
        name, arg = op.name, op.arg
        if name in ("subtract", "add") and isinstance(arg, Mapping):
            return self.input_offset(arg, key, -1.0 if name == "subtract" else 1.0)
        if name in ("subtract", "add", "scale"):
            value = self.vector_arg(arg, key)
            sign = -1.0 if name == "subtract" else 1.0

            def size(n: int | None) -> int | None:
                if value.size != 1 and n is not None and n != value.size:
                    raise self.fail(key, f"{name} has {value.size} values but the signal has {n}")
                return n

            if name == "scale":
                return (lambda v, _l: v * value), size
            return (lambda v, _l: v + sign * value), size
        if name == "deg_to_rad":
            return (lambda v, _l: v * (math.pi / 180.0)), same
        if name in ("ned_to_enu", "enu_to_ned", "frd_to_flu", "flu_to_frd"):
            matrix = _NED_ENU if name in ("ned_to_enu", "enu_to_ned") else _FRD_FLU
            return (lambda v, _l: matrix @ v), self._fixed(key, name, 3, 3)
        if name == "quat_to_rotmat":
            order = self._order(arg, key)
            return (lambda v, _l: quat_to_rotmat(_wxyz(v, order)).ravel()), self._fixed(key, name, 4, 9)
        if name == "rotmat_ned_frd_to_enu_flu":
            return (lambda v, _l: (_NED_ENU @ v.reshape(3, 3) @ _FRD_FLU).ravel()), self._fixed(key, name, 9, 9)
        if name in ("rotate_body_to_world", "rotate_world_to_body"):
            get_q, order = self.quat_reader(arg if isinstance(arg, Mapping) else {}, key, name, input_name)
            inverse = name == "rotate_world_to_body"

            def rotate(v: np.ndarray, latest: Latest) -> np.ndarray:
                rot = quat_to_rotmat(_wxyz(messages.to_vector(get_q(latest)), order))
                return (rot.T if inverse else rot) @ v

            return rotate, self._fixed(key, name, 3, 3)
        if name == "world_to_heading":
            yaw_of = self.yaw_reader(arg, key)

            def to_heading(v: np.ndarray, latest: Latest) -> np.ndarray:
                yaw = yaw_of(latest)
                c, s_ = math.cos(yaw), math.sin(yaw)
                r_hw = np.array([[c, s_, 0.0], [-s_, c, 0.0], [0.0, 0.0, 1.0]])  # R_wh transposed
                if v.size == 9:
                    return (r_hw @ v.reshape(3, 3)).ravel()
                if v.size != 3:
                    raise ObservationError(f"{key}: world_to_heading takes 3 or 9 values, got {v.size}", WRONG_SIZE)
                return r_hw @ v

            def heading_size(n: int | None) -> int | None:
                if n is not None and n not in (3, 9):
                    raise self.fail(key, f"world_to_heading takes a 3-vector or a 9-entry rotation, the signal has {n}")
                return n

            return to_heading, heading_size
        if name == "select_by_name":
            spec = arg if isinstance(arg, Mapping) else {}
            names = [str(n) for n in spec.get("names", [])]
            if not names:
                raise self.fail(key, "select_by_name needs {names_path: <field>, names: [..]}")
            get_names, _ = self.field_reader(input_name, str(spec.get("names_path", "name")), f"{key}.names_path")

            def by_name(v: np.ndarray, latest: Latest) -> np.ndarray:
                present = [str(n) for n in get_names(latest)]
                if len(present) != len(v):
                    raise ObservationError(f"{key}: message has {len(present)} names but {len(v)} values", WRONG_SIZE)
                index = {n: i for i, n in enumerate(present)}
                missing = [n for n in names if n not in index]
                if missing:
                    raise ObservationError(f"{key}: message lacks name(s) {missing}; it has {present}")
                return v[[index[n] for n in names]]

            return by_name, lambda _n: len(names)
        if name == "select":
            if not (isinstance(arg, list) and arg and all(isinstance(i, int) for i in arg)):
                raise self.fail(key, f"select needs a list of indices, got {arg!r}")
            indices = list(arg)

            def pick(v: np.ndarray, _l: Latest) -> np.ndarray:
                if max(indices) >= len(v):
                    raise ObservationError(f"{key}: index {max(indices)} out of range for {len(v)} values")
                return v[indices]

            return pick, lambda _n: len(indices)
        if name == "fill_nan":
            per_entry = isinstance(arg, list)
            items = arg if per_entry else [arg]
            if not items or not all(
                v is None or (isinstance(v, int | float) and not isinstance(v, bool)) for v in items
            ):
                raise self.fail(key, f"fill_nan needs a number or a list of numbers/null, got {arg!r}")
            fill = np.array([np.nan if v is None else float(v) for v in items])

            def fill_nan(v: np.ndarray, _l: Latest) -> np.ndarray:
                if per_entry and v.size != fill.size:
                    raise ObservationError(f"{key}: fill_nan has {fill.size} entries, the signal {v.size}", WRONG_SIZE)
                return np.where(np.isnan(v), fill if per_entry else fill[0], v)

            def fill_size(n: int | None) -> int | None:
                if per_entry and n is not None and n != fill.size:
                    raise self.fail(key, f"fill_nan has {fill.size} entries but the signal has {n}")
                return n

            return fill_nan, fill_size
        if name == "integrate":
            return self.integrator(arg, key), same
        raise self.fail(key, unknown_choice_message("op", name, OP_NAMES))

    def input_offset(self, arg: Mapping[str, Any], key: str, sign: float) -> tuple[Apply, SizeFn]:
        """``subtract``/``add`` of a field of another input's newest message (a moving goal)."""
        if set(arg) != {"input", "path"}:
            raise self.fail(key, f"expected {{input: NAME, path: FIELD}} (another input's field), got {dict(arg)!r}")
        other = str(arg["input"])
        if other not in self.robot.inputs:
            raise self.fail(f"{key}.input", unknown_choice_message("input", other, self.robot.inputs))
        get, n_other = self.field_reader(other, str(arg["path"]), f"{key}.path")

        def apply(v: np.ndarray, latest: Latest) -> np.ndarray:
            offset = messages.to_vector(get(latest))
            if offset.size != v.size:
                raise ObservationError(
                    f"{key}: {other} field has {offset.size} values, the signal {v.size}", WRONG_SIZE
                )
            return v + sign * offset

        def size(n: int | None) -> int | None:
            if n is not None and n_other is not None and n != n_other:
                raise self.fail(
                    key, f"input {other!r} field {arg['path']!r} has {n_other} values but the signal has {n}"
                )
            return n

        return apply, size

    def yaw_reader(self, arg: Any, key: str) -> Callable[[Latest], float]:
        """The heading yaw of ``world_to_heading``: a fixed number/param, or the yaw of a quaternion
        field ``{input, path, order}`` of another input's newest message."""
        if not isinstance(arg, Mapping):
            yaw = self.scalar_arg(arg, key)
            return lambda _l: yaw
        if not set(arg) <= {"input", "path", "order"} or "input" not in arg:
            raise self.fail(
                key, f"expected a yaw (number or param) or {{input, path, order}} of a quaternion, got {dict(arg)!r}"
            )
        get_q, order = self.quat_reader(arg, key, "world_to_heading", str(arg["input"]))

        def yaw_of(latest: Latest) -> float:
            w, x, y, z = unit_quaternion(_wxyz(messages.to_vector(get_q(latest)), order), f"{key}: heading quaternion")
            return math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))

        return yaw_of

    def quat_reader(
        self, spec: Mapping[str, Any], key: str, op_name: str, default_input: str
    ) -> tuple[Callable[[Latest], Any], str]:
        """Reader of the quaternion field ``{input, path, order}`` of an op (input defaults to
        ``default_input``, order to ``xyzw``) and its order."""
        q_input = str(spec.get("input", default_input))
        if q_input not in self.robot.inputs:
            raise self.fail(f"{key}.input", unknown_choice_message("input", q_input, self.robot.inputs))
        get_q, q_size = self.field_reader(q_input, str(spec.get("path", "")), f"{key}.path")
        if q_size != 4:
            raise self.fail(key, f"{op_name}: path must name a quaternion (4 numbers), found {q_size}")
        return get_q, self._order(spec.get("order", "xyzw"), f"{key}.order")

    def _order(self, arg: Any, key: str) -> str:
        if arg not in ("xyzw", "wxyz"):
            raise self.fail(key, f"quaternion order must be 'xyzw' (ROS field order) or 'wxyz', got {arg!r}")
        return str(arg)

    def _fixed(self, key: str, name: str, n_in: int, n_out: int) -> SizeFn:
        def size(n: int | None) -> int:
            if n is not None and n != n_in:
                raise self.fail(key, f"{name} takes {n_in} values, the signal has {n}")
            return n_out

        return size

    def signal(self, cfg: SignalCfg, key: str, history_size: int | None = None) -> Signal:
        if cfg.action_history:
            if not history_size:
                raise self.fail(key, "action_history requested but policy_io.json has extra.action_history = 0")
            return Signal(key, "", lambda _l, h: h, history_size)
        if cfg.param:
            value = self.vector_arg(cfg.param, f"{key}.param")
            return Signal(key, "", lambda _l, _h: value, value.size)
        get, size = self.field_reader(cfg.input, cfg.path, f"{key}.path")
        steps: list[Apply] = []
        for i, op in enumerate(cfg.ops):
            apply, size_fn = self.op(op, f"{key}.ops[{i}] ({op.name})", cfg.input)
            size = size_fn(size)
            steps.append(apply)

        def read(latest: Latest, _h: np.ndarray) -> np.ndarray:
            try:
                v = messages.to_vector(get(latest))
                for apply in steps:
                    v = apply(v, latest)
            except (ValueError, TypeError, IndexError, AttributeError) as err:
                raise ObservationError(f"{key}: cannot convert the message ({err})") from None
            return v

        return Signal(key, cfg.input, read, size)


OP_NAMES = (
    "subtract", "add", "scale", "deg_to_rad", "ned_to_enu", "enu_to_ned", "frd_to_flu", "flu_to_frd",
    "quat_to_rotmat", "rotmat_ned_frd_to_enu_flu", "rotate_body_to_world", "rotate_world_to_body",
    "select_by_name", "select", "integrate", "world_to_heading", "fill_nan",
)  # fmt: skip


def compile_signal(robot: RobotConfig, cfg: SignalCfg, key: str) -> Signal:
    """Compile a stand-alone signal (e.g. ``safety.hold``)."""
    return _Compiler(robot).signal(cfg, key)


class ActionHistory:
    """The last ``length`` normalized actions sent, newest first: ``vector() -> [length * A]``.

    After :meth:`reset` every entry is ``initial`` (how the task fills it at an episode start).
    """

    def __init__(self, length: int, action_dim: int, initial: float = 0.0) -> None:
        self.initial = initial
        self._buf = np.full((length, action_dim), initial, dtype=np.float64)
        self.on_reset: list[Callable[[], None]] = []
        """Called by :meth:`reset`: the observation's stateful ops (``integrate``) restart with
        the history, whenever the node restarts the policy."""

    def reset(self) -> None:
        self._buf[:] = self.initial
        for hook in self.on_reset:
            hook()

    def push(self, action: np.ndarray) -> None:
        if len(self._buf):
            self._buf[1:] = self._buf[:-1].copy()
            self._buf[0] = action

    def vector(self) -> np.ndarray:
        return self._buf.ravel()


def policy_extra_number(io_spec: IOSpec, name: str, what: str) -> float:
    """The number ``policy_io.json``'s ``extra`` holds under ``name`` (e.g. ``hover_action``);
    ``what`` (file and key) starts the error when there is none."""
    value = io_spec.extra.get(name)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ConfigError(
            f"{what} names {name!r}, which policy_io.json's extra does not hold as a number "
            f"(extra keys: {', '.join(sorted(io_spec.extra))})"
        )
    return float(value)


class ObservationBuilder:
    """Checks a robot config against ``policy_io.json`` once, then builds observations.

    ``build(latest) -> float32 [obs_dim]``: fields in ``policy_io`` order, each multiplied by
    its ``scale`` (the policy sees ``value * scale``).
    """

    def __init__(self, robot: RobotConfig, io_spec: IOSpec) -> None:
        self.io_spec = io_spec
        history_len = int(io_spec.extra.get("action_history", 0))
        self.history = ActionHistory(history_len, io_spec.action_dim, self._history_initial(robot, io_spec))
        wanted = [f.name for f in io_spec.obs_fields]
        missing = [n for n in wanted if n not in robot.observation]
        extra = [n for n, sig in robot.observation.items() if n not in wanted and not sig.optional]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"policy fields without a source: {', '.join(missing)}")
            if extra:
                parts.append(f"config fields the policy does not take: {', '.join(extra)}")
            raise ConfigError(
                f"{robot.path}: observation does not match policy_io.json ({'; '.join(parts)}); "
                f"the policy expects, in order: {', '.join(f'{f.name}[{f.size}]' for f in io_spec.obs_fields)}"
            )
        compiler = _Compiler(robot, io_spec)
        self.signals: list[tuple[Signal, int, float]] = []
        for f in io_spec.obs_fields:
            sig = compiler.signal(robot.observation[f.name], f"observation.{f.name}", history_len * io_spec.action_dim)
            if sig.size is not None and sig.size != f.size:
                raise ConfigError(
                    f"{robot.path}: observation.{f.name} yields {sig.size} values but policy_io.json "
                    f"declares size {f.size}"
                )
            self.signals.append((sig, f.size, f.scale))
        self.history.on_reset += [integ.reset for integ in compiler.integrators]
        self._out = np.zeros(io_spec.obs_dim, dtype=np.float32)
        self.fields: dict[str, np.ndarray] = {}
        """Each field of the last :meth:`build`, in physical units (before ``scale``), by name."""

    @staticmethod
    def _history_initial(robot: RobotConfig, io_spec: IOSpec) -> float:
        initial: float | str = 0.0
        for sig in robot.observation.values():
            if sig.action_history:
                initial = sig.history_initial
        if isinstance(initial, str):
            return policy_extra_number(io_spec, initial, f"{robot.path}: action history initial value")
        return float(initial)

    def build(self, latest: Latest) -> np.ndarray:
        """The observation ``[obs_dim]`` float32; raises :class:`ObservationError` on bad data.

        :attr:`fields` holds every field in float64 even when the float32 observation overflows
        (e.g. a position 1e300 m away), so a caller can still tell *why* the state is unusable.
        """
        start = 0
        hist = self.history.vector()
        self.fields = {}
        for sig, size, _scale in self.signals:
            v = sig.read(latest, hist)
            if v.shape != (size,):
                raise ObservationError(f"{sig.key}: got {v.size} values, the policy expects {size}", WRONG_SIZE)
            if not np.isfinite(v).all():
                raise ObservationError(f"{sig.key}: non-finite value(s) {v.tolist()}")
            self.fields[sig.key.removeprefix("observation.")] = v
            start += size
        start = 0
        with np.errstate(over="ignore"):  # finite float64 beyond float32 range: reported below
            for (_sig, size, scale), v in zip(self.signals, self.fields.values(), strict=True):
                self._out[start : start + size] = v * scale
                start += size
        if not np.isfinite(self._out).all():
            self._raise_non_finite()
        return self._out.copy()

    @property
    def complete(self) -> bool:
        """The last :meth:`build` read every field as finite float64 values."""
        return len(self.fields) == len(self.signals)

    def _raise_non_finite(self) -> None:
        start = 0
        for sig, size, _scale in self.signals:
            chunk = self._out[start : start + size]
            if not np.isfinite(chunk).all():
                raise ObservationError(
                    f"{sig.key}: value(s) beyond float32 range {self.fields[sig.key.removeprefix('observation.')].tolist()}"
                )
            start += size
        raise ObservationError("observation: non-finite value(s)")
