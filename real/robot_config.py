"""Robot configuration YAML: which topics feed the policy, how, and what the robot is sent.

A robot config names its input topics, builds every policy observation field from message
fields through declared conversions (see :mod:`embodied.real.observation`), maps the action
onto an output message, and defines the robot's safe command. Built-in configs live in
``real/robots/``; pass a name (``crazyflie_sim``) or a path. Errors name the file and key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embodied.config import ConfigError, closest, load_yaml, unknown_choice_message
from embodied.real import messages
from embodied.real.transports import QOS_PROFILES

ROBOTS_DIR = Path(__file__).with_name("robots")
ENVELOPE_MEASURES = ("norm", "tilt", "abs_max")
"""How an envelope check reduces a field: Euclidean norm, tilt angle of a row-major rotation
matrix (``arccos(R[2][2])``: the body z axis against the frame's z axis), largest magnitude."""


@dataclass(frozen=True)
class InputCfg:
    """A subscribed topic; its newest message is cached for the control step."""

    name: str
    topic: str
    type: str
    qos: str = "sensor"
    stale_timeout_s: float | None = None
    """Longest time since the newest message arrived before the input counts as stale
    (``None``: derived from the policy's control period, see :mod:`embodied.real.freshness`)."""
    max_stamp_age_s: float | None = None
    """Largest age of the message's header stamp against the node's clock (``None``: derived
    from the control period). Only for types with a ``header``; a zero stamp is rejected."""
    frame_id: str = ""
    """Expected ``header.frame_id`` (empty: any). Messages in another frame are rejected."""

    @property
    def stamped(self) -> bool:
        """The message type carries a ``std_msgs/Header`` (freshness is judged by its stamp too)."""
        return any(name == "header" for name, _ in messages.fields(self.type))


@dataclass(frozen=True)
class OpCfg:
    """One conversion step of a signal pipeline: ``name`` with its YAML argument (or None)."""

    name: str
    arg: Any = None


@dataclass(frozen=True)
class SignalCfg:
    """A vector read from a message field (``input`` + ``path``) and converted by ``ops``.

    ``action_history: true`` instead reads the last H actions the node sent, newest first;
    ``param: NAME`` is the constant vector ``params.NAME`` (e.g. a goal). ``optional: true``
    marks an observation field that is used only when the policy takes it (e.g. ``pos_err_int_w``
    of quad-hover policies trained with ``pos_err_integral``).
    """

    input: str = ""
    path: str = ""
    ops: tuple[OpCfg, ...] = ()
    action_history: bool = False
    history_initial: float | str = 0.0
    """Value of every history entry after a (re-)arm: a number, or the name of a number in
    ``policy_io.json``'s ``extra`` (e.g. ``hover_action``), matching how the task starts episodes."""
    param: str = ""
    optional: bool = False


@dataclass(frozen=True)
class CommandCfg:
    """The output message: the physical action vector is written into field ``path``."""

    topic: str
    type: str
    qos: str = "reliable"
    path: str = "data"
    layout_label: str = ""
    """For ``*MultiArray`` outputs: the label of the single layout dimension (e.g. ``motors``)."""
    stamped_topic: str = ""
    """Optional ``sensor_msgs/JointState`` echo of every command, its header stamp the stamp of
    the input message the command answers (for lockstep simulators and logging)."""
    joints: tuple[str, ...] = ()
    """Joint order of the command (ros2_control): checked against the hold signal's names here,
    and against the controller's ``joints`` parameter when the ROS 2 node can read it."""
    controller: str = ""
    """ros2_control controller node whose ``joints`` parameter must equal :attr:`joints`."""
    watchdog_periods: float = 20.0
    """Command liveness: the robot side applies the safe command once no new command arrived
    for this many control periods (the node dead, hung or cut off). The node offers it as the
    command writer's DEADLINE QoS (``watchdog_periods * control_period_s``), so a driver can
    request the same deadline and be told by its middleware; ``sim-robot`` enforces it on its
    own clock. The default, 20, equals the node's own stale-input limit (``freshness``). See
    real/ros2/README.md, "Command liveness"."""


@dataclass(frozen=True)
class EnvelopeCheck:
    """One plausibility bound: observation field ``field`` reduced by ``measure`` must stay at or
    below limit ``key`` of ``policy_io.json``'s ``extra.envelope`` (or the robot config's override)."""

    key: str
    field: str
    measure: str = "norm"


@dataclass(frozen=True)
class GapHoldCfg:
    """The first stage of losing an input: no new message for ``after_periods`` control periods.

    The node then sends ``command`` (not the safe command) and does not disarm: the next fresh
    message lets the policy drive again at once. Only a gap beyond the input's stale limit
    (``stale_timeout_s``) escalates to the safe command and the re-arm rule. Checked on the
    node's own clock, between periods too, so it does not wait for the middleware to report a
    lost publisher (a crashed driver is reported only when its lease expires, seconds later).
    """

    after_periods: float = 1.5
    """Gap length in control periods (1.5 at 100 Hz: 15 ms, so the command is out within 2 periods
    of the last message, while one message arriving up to half a period late does not trip it)."""
    command: tuple[float, ...] | str | None = None
    """Physical command during the gap, or the name of a normalized action in ``policy_io.json``'s
    ``extra`` for every entry (``hover_action``); ``None``: the robot's safe command."""
    inputs: tuple[str, ...] = ()
    """Inputs watched for gaps (empty: every input but cameras, which publish at their own frame
    rate, often slower than the control loop: between two pictures is not a gap)."""


@dataclass(frozen=True)
class SafetyCfg:
    """Safe command, re-arm rule, rate limit and e-stop topic."""

    safe_command: tuple[float, ...] | None = None
    """Physical command sent while not armed (e.g. motors off)."""
    hold: SignalCfg | None = None
    """Alternative safe command: the latest value of this signal (e.g. measured joint positions)."""
    rearm_periods: int = 10
    """Consecutive fresh, valid control periods required before the policy drives again."""
    max_action_rate_per_s: float | None = None
    """Largest change of any normalized action per second (``None``: no limit)."""
    estop_topic: str = ""
    """``std_msgs/msg/Bool`` topic: ``true`` latches the e-stop; ``false`` releases it (then re-arm).
    Subscribed both transient-local (a late-joining node sees a latched stop) and volatile."""
    envelope: tuple[EnvelopeCheck, ...] = ()
    """Plausibility bounds from the training distribution; outside them -> safe command."""
    envelope_limits: dict[str, float] = field(default_factory=dict)
    """Overrides of ``policy_io.json``'s ``extra.envelope`` limits (same keys)."""
    gap_hold: GapHoldCfg | None = None
    """Short input gaps bridged with a hold command before the safe command (``None``: off)."""


IMAGE_TYPE = "sensor_msgs/msg/Image"
COMPRESSED_IMAGE_TYPE = "sensor_msgs/msg/CompressedImage"
IMAGE_TYPES = (IMAGE_TYPE, COMPRESSED_IMAGE_TYPE)
"""The message types a ``camera`` input may carry."""


@dataclass(frozen=True)
class CameraCfg:
    """The input whose ``sensor_msgs/Image`` feeds an image policy's ``image`` (see
    :mod:`embodied.real.camera_image`); ``resize``: scale pictures of another size to the policy's."""

    input: str
    resize: bool = False


@dataclass(frozen=True)
class RobotConfig:
    name: str
    path: Path
    inputs: dict[str, InputCfg]
    observation: dict[str, SignalCfg]
    command: CommandCfg
    safety: SafetyCfg
    params: dict[str, tuple[float, ...]] = field(default_factory=dict)
    description: str = ""
    camera: CameraCfg | None = None
    """The camera an image policy reads (``None``: the robot feeds vector policies only)."""
    instruction: str = ""
    """The language instruction an image-instruction policy is given ("": the one it was trained with)."""
    task: str = ""
    """The embodied task a LeRobot checkpoint (``deploy lerobot:REF``) was trained on: its interface
    and LeRobot feature mapping ("": give ``--task``; exports and run directories name their own)."""


def builtin_robots() -> list[str]:
    return sorted(p.stem for p in ROBOTS_DIR.glob("*.yaml"))


def resolve_robot_path(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"robot config {str(path)!r} does not exist; built-in: {', '.join(builtin_robots())}")
        return path
    builtin = ROBOTS_DIR / f"{name_or_path}.yaml"
    if not builtin.is_file():
        raise ConfigError(unknown_choice_message("robot config", str(name_or_path), builtin_robots()))
    return builtin


class _Reader:
    """Typed access to a YAML mapping with errors naming file and dotted key."""

    def __init__(self, source: Path) -> None:
        self.source = source

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {key}: {message}")

    def mapping(self, value: Any, key: str, allowed: tuple[str, ...] | None = None) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(key, f"expected a mapping, got {value!r}")
        if allowed is not None:
            for k in value:
                if k not in allowed:
                    raise self.fail(
                        key, f"unknown key {k!r}; valid keys (closest first): {', '.join(closest(str(k), allowed))}"
                    )
        return value

    def string(self, data: Mapping[str, Any], key: str, prefix: str, default: str | None = None) -> str:
        value = data.get(key, default)
        if not isinstance(value, str):
            raise self.fail(f"{prefix}{key}", f"expected a string, got {value!r}")
        return value

    def number(self, value: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, f"expected a number, got {value!r}")
        return float(value)

    def numbers(self, value: Any, key: str) -> tuple[float, ...]:
        if not isinstance(value, list | tuple):
            raise self.fail(key, f"expected a list of numbers, got {value!r}")
        return tuple(self.number(v, f"{key}[{i}]") for i, v in enumerate(value))

    def positive_or_none(self, value: Any, key: str) -> float | None:
        if value is None:
            return None
        number = self.number(value, key)
        if not number > 0:
            raise self.fail(key, f"expected a positive number of seconds, got {value!r}")
        return number

    def choice(self, value: Any, key: str, choices: Any) -> str:
        if value not in choices:
            raise self.fail(key, unknown_choice_message("value", str(value), choices))
        return str(value)

    def message_type(self, value: Any, key: str) -> str:
        if not isinstance(value, str):
            raise self.fail(key, f"expected a message type such as nav_msgs/msg/Odometry, got {value!r}")
        try:
            return messages.check_type(value)
        except Exception as err:
            raise self.fail(key, str(err)) from None


def _signal(r: _Reader, value: Any, key: str) -> SignalCfg:
    data = r.mapping(value, key, ("input", "path", "ops", "action_history", "initial", "param", "optional"))
    optional = data.get("optional", False)
    if not isinstance(optional, bool):
        raise r.fail(f"{key}.optional", f"expected true or false, got {optional!r}")
    if data.get("action_history"):
        initial = data.get("initial", 0.0)
        if not isinstance(initial, str):
            initial = r.number(initial, f"{key}.initial")
        return SignalCfg(action_history=True, history_initial=initial, optional=optional)
    if "param" in data:
        return SignalCfg(param=r.string(data, "param", f"{key}."), optional=optional)
    raw_ops = data.get("ops", []) or []
    if not isinstance(raw_ops, list):
        raise r.fail(f"{key}.ops", f"expected a list of operations, got {raw_ops!r}")
    ops: list[OpCfg] = []
    for i, op in enumerate(raw_ops):
        if isinstance(op, str):
            ops.append(OpCfg(op))
        elif isinstance(op, Mapping) and len(op) == 1:
            ((name, arg),) = op.items()
            ops.append(OpCfg(str(name), arg))
        else:
            raise r.fail(f"{key}.ops[{i}]", f"expected `name` or `{{name: argument}}`, got {op!r}")
    return SignalCfg(
        input=r.string(data, "input", f"{key}."),
        path=r.string(data, "path", f"{key}.", ""),
        ops=tuple(ops),
        optional=optional,
    )


def _envelope(r: _Reader, value: Any, observation: Mapping[str, SignalCfg]) -> tuple[EnvelopeCheck, ...]:
    checks = []
    for key, raw in r.mapping(value, "safety.envelope").items():
        item = r.mapping(raw, f"safety.envelope.{key}", ("field", "measure"))
        name = r.string(item, "field", f"safety.envelope.{key}.")
        if name not in observation:
            raise r.fail(f"safety.envelope.{key}.field", unknown_choice_message("observation field", name, observation))
        measure = r.choice(item.get("measure", "norm"), f"safety.envelope.{key}.measure", ENVELOPE_MEASURES)
        checks.append(EnvelopeCheck(str(key), name, measure))
    return tuple(checks)


def _gap_hold(r: _Reader, value: Any, inputs: Mapping[str, InputCfg]) -> GapHoldCfg:
    key = "safety.gap_hold"
    data = r.mapping(value or {}, key, ("after_periods", "command", "inputs"))
    after = r.number(data.get("after_periods", GapHoldCfg.after_periods), f"{key}.after_periods")
    if not after > 0:
        raise r.fail(f"{key}.after_periods", f"expected a positive number of control periods, got {after!r}")
    raw = data.get("command")
    command: tuple[float, ...] | str | None = (
        raw if raw is None or isinstance(raw, str) else r.numbers(raw, f"{key}.command")
    )
    watched = data.get("inputs", []) or []
    if not (isinstance(watched, list) and all(isinstance(i, str) for i in watched)):
        raise r.fail(f"{key}.inputs", f"expected a list of input names, got {watched!r}")
    for name in watched:
        if name not in inputs:
            raise r.fail(f"{key}.inputs", unknown_choice_message("input", name, inputs))
    return GapHoldCfg(after_periods=after, command=command, inputs=tuple(watched))


def _watchdog_periods(r: _Reader, value: Any) -> float:
    periods = r.number(value, "command.watchdog_periods")
    if not 1.0 <= periods <= 1000.0:
        raise r.fail(
            "command.watchdog_periods",
            f"expected a number of control periods in [1, 1000] (how long the robot waits for a new "
            f"command before it applies its safe command), got {value!r}",
        )
    return periods


def _camera(r: _Reader, value: Any, inputs: Mapping[str, InputCfg]) -> CameraCfg:
    item = r.mapping(value, "camera", ("input", "resize"))
    name = r.string(item, "input", "camera.")
    if name not in inputs:
        raise r.fail("camera.input", unknown_choice_message("input", name, inputs))
    if inputs[name].type not in IMAGE_TYPES:
        raise r.fail(
            "camera.input",
            f"input {name!r} carries {inputs[name].type}; a camera input carries {' or '.join(IMAGE_TYPES)}",
        )
    resize = item.get("resize", False)
    if not isinstance(resize, bool):
        raise r.fail("camera.resize", f"expected true or false, got {resize!r}")
    return CameraCfg(input=name, resize=resize)


def load_robot(name_or_path: str | Path, params: Mapping[str, Any] | None = None) -> RobotConfig:
    """Read and check a robot config; ``params`` override its ``params`` block (e.g. setpoints)."""
    path = resolve_robot_path(name_or_path)
    r = _Reader(path)
    data = r.mapping(
        load_yaml(path),
        "top level",
        (
            "name",
            "description",
            "trigger",
            "params",
            "inputs",
            "observation",
            "command",
            "safety",
            "camera",
            "instruction",
            "task",
        ),
    )
    if data.get("trigger", "timer") != "timer":
        raise r.fail(
            "trigger",
            f"{data['trigger']!r} is no longer supported: the control loop always runs at the policy's "
            "trained rate on its own clock and samples the newest input; remove the key",
        )
    inputs: dict[str, InputCfg] = {}
    for name, raw in r.mapping(data.get("inputs"), "inputs").items():
        key = f"inputs.{name}"
        item = r.mapping(raw, key, ("topic", "type", "qos", "stale_timeout_s", "max_stamp_age_s", "frame_id"))
        inputs[name] = InputCfg(
            name=name,
            topic=r.string(item, "topic", f"{key}."),
            type=r.message_type(item.get("type"), f"{key}.type"),
            qos=r.choice(item.get("qos", "sensor"), f"{key}.qos", QOS_PROFILES),
            stale_timeout_s=r.positive_or_none(item.get("stale_timeout_s"), f"{key}.stale_timeout_s"),
            max_stamp_age_s=r.positive_or_none(item.get("max_stamp_age_s"), f"{key}.max_stamp_age_s"),
            frame_id=r.string(item, "frame_id", f"{key}.", ""),
        )
    if not inputs:
        raise r.fail("inputs", "at least one input topic is required")
    merged_params = dict(r.mapping(data.get("params", {}) or {}, "params")) | dict(params or {})
    param_values = {k: r.numbers(v, f"params.{k}") for k, v in merged_params.items()}
    observation = {
        name: _signal(r, raw, f"observation.{name}")
        for name, raw in r.mapping(data.get("observation"), "observation").items()
    }
    for name, sig in observation.items():
        if not (sig.action_history or sig.param) and sig.input not in inputs:
            raise r.fail(f"observation.{name}.input", unknown_choice_message("input", sig.input, inputs))
    cmd = r.mapping(
        data.get("command"),
        "command",
        ("topic", "type", "qos", "path", "layout_label", "stamped_topic", "joints", "controller", "watchdog_periods"),
    )
    raw_joints = cmd.get("joints", []) or []
    if not (isinstance(raw_joints, list) and all(isinstance(j, str) for j in raw_joints)):
        raise r.fail("command.joints", f"expected a list of joint names, got {raw_joints!r}")
    command = CommandCfg(
        topic=r.string(cmd, "topic", "command."),
        type=r.message_type(cmd.get("type"), "command.type"),
        qos=r.choice(cmd.get("qos", "reliable"), "command.qos", QOS_PROFILES),
        path=r.string(cmd, "path", "command.", "data"),
        layout_label=str(cmd.get("layout_label", "") or ""),
        stamped_topic=r.string(cmd, "stamped_topic", "command.", ""),
        joints=tuple(raw_joints),
        controller=r.string(cmd, "controller", "command.", ""),
        watchdog_periods=_watchdog_periods(r, cmd.get("watchdog_periods", CommandCfg.watchdog_periods)),
    )
    raw_safety = r.mapping(
        data.get("safety", {}) or {},
        "safety",
        (
            "safe_command", "hold", "rearm_periods", "max_action_rate_per_s", "estop_topic", "envelope",
            "envelope_limits", "gap_hold",
        ),
    )  # fmt: skip
    rate = raw_safety.get("max_action_rate_per_s")
    safety = SafetyCfg(
        safe_command=r.numbers(raw_safety["safe_command"], "safety.safe_command")
        if "safe_command" in raw_safety
        else None,
        hold=_signal(r, raw_safety["hold"], "safety.hold") if "hold" in raw_safety else None,
        rearm_periods=int(r.number(raw_safety.get("rearm_periods", 10), "safety.rearm_periods")),
        max_action_rate_per_s=None if rate is None else r.number(rate, "safety.max_action_rate_per_s"),
        estop_topic=str(raw_safety.get("estop_topic", "") or ""),
        envelope=_envelope(r, raw_safety.get("envelope", {}) or {}, observation),
        envelope_limits={
            k: r.number(v, f"safety.envelope_limits.{k}")
            for k, v in r.mapping(raw_safety.get("envelope_limits", {}) or {}, "safety.envelope_limits").items()
        },
        gap_hold=_gap_hold(r, raw_safety["gap_hold"], inputs) if "gap_hold" in raw_safety else None,
    )
    if (safety.safe_command is None) == (safety.hold is None):
        raise r.fail("safety", "define exactly one of safe_command (a constant) or hold (a signal)")
    if safety.hold is not None and (safety.hold.param or safety.hold.action_history):
        raise r.fail("safety.hold", "hold must read an input (input + path), not a param or the action history")
    if safety.hold is not None and safety.hold.input not in inputs:
        raise r.fail("safety.hold.input", unknown_choice_message("input", safety.hold.input, inputs))
    if command.joints and safety.hold is not None:
        for op in safety.hold.ops:
            names = op.arg.get("names") if op.name == "select_by_name" and isinstance(op.arg, Mapping) else None
            if names is not None and tuple(names) != command.joints:
                raise r.fail(
                    "safety.hold",
                    f"holds joints in the order {list(names)} but command.joints is {list(command.joints)}: the "
                    "held positions would go to the wrong joints",
                )
    camera = _camera(r, data["camera"], inputs) if data.get("camera") is not None else None
    return RobotConfig(
        name=r.string(data, "name", "", path.stem),
        path=path,
        inputs=inputs,
        observation=observation,
        command=command,
        safety=safety,
        params=param_values,
        description=str(data.get("description", "")),
        camera=camera,
        instruction=r.string(data, "instruction", "", ""),
        task=r.string(data, "task", "", ""),
    )
