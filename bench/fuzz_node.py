"""Fuzz the deployment node with malformed and implausible input messages.

A quad-hover node (the shipped crazyflie_sim config, a small exported policy) runs on the
in-process transport with a hand-driven clock: every control period it receives one message and
steps. Rounds of 0..15 valid hover states (so the node is armed for many of the bad messages)
are followed by one bad message of a random kind:

=====================  =============================================  ===========================
kind                   message                                        must be counted as
=====================  =============================================  ===========================
nan / inf              NaN or inf in a position, attitude or rate     ``invalid_observation``
wrong_size             a 3-vector where the quaternion belongs        ``invalid_observation``
zero_quaternion        orientation (0, 0, 0, 0)                        ``invalid_observation``
far                    an axis 1.01 x limit .. 1e300 m off setpoint    ``envelope_pos_err_m``
tilted                 tilt beyond the envelope (up to upside down)    ``envelope_tilt_rad``
spinning               body rate 10 .. 1e6 rad/s                       ``envelope_ang_vel_rad_s``
fast                   linear velocity 3 .. 1e6 m/s                    ``envelope_lin_vel_m_s``
old_stamp              stamp 1 s .. 1e6 s old (behind the newest)      ``stamp_out_of_order``
future_stamp           stamp 1 s .. 1e6 s ahead                        ``future_stamp``
zero_stamp             stamp 0                                         ``zero_stamp``
wrong_frame            frame_id other than ``world``                   ``wrong_frame``
=====================  =============================================  ===========================

Checked for every bad message: no exception escapes the node; the period's rejection counter
for the expected reason grows by exactly one, and the published ``/diagnostics`` carry the same
totals; a bad *state* (every kind but the stamp/frame rejections, which leave the previous valid
state in place) gets the safe command, whatever the node's state was.

    .venv/bin/python bench/fuzz_node.py --messages 10000 [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from embodied.real import messages
from embodied.real.node import PolicyNode
from embodied.real.robot_config import load_robot
from embodied.real.runner import PolicyRunner
from embodied.real.safety import SafetyState
from embodied.real.transports.memory import MemoryTransport

SETPOINT_W = (0.0, 0.0, 1.0)
STATE_KINDS = {
    "nan": "invalid_observation",
    "inf": "invalid_observation",
    "wrong_size": "invalid_observation",
    "zero_quaternion": "invalid_observation",
    "far": "envelope_pos_err_m",
    "tilted": "envelope_tilt_rad",
    "spinning": "envelope_ang_vel_rad_s",
    "fast": "envelope_lin_vel_m_s",
}
"""Kinds whose message is accepted as the newest state, which is then unusable."""
REJECTED_KINDS = {
    "old_stamp": "stamp_out_of_order",
    "future_stamp": "future_stamp",
    "zero_stamp": "zero_stamp",
    "wrong_frame": "wrong_frame",
}
"""Kinds rejected on arrival (the previous valid state stays the newest)."""
KINDS = tuple(STATE_KINDS) + tuple(REJECTED_KINDS)


def _odometry(
    rng: random.Random,
    stamp_s: float,
    pos: tuple[float, ...] | None = None,
    quat_xyzw: tuple[float, ...] = (0.0, 0.0, 0.0, 1.0),
    lin_vel_b: tuple[float, ...] = (0.0, 0.0, 0.0),
    ang_vel_b: tuple[float, ...] = (0.0, 0.0, 0.0),
    frame_id: str = "world",
) -> Any:
    """A near-hover odometry message (small random offsets) unless fields are given."""
    if pos is None:
        pos = tuple(s + rng.uniform(-0.05, 0.05) for s in SETPOINT_W)
    stamp_ns = max(0, round(stamp_s * 1e9))

    def xyz(v: tuple[float, ...]) -> dict[str, float]:
        return {"x": v[0], "y": v[1], "z": v[2]}

    return messages.make(
        "nav_msgs/msg/Odometry",
        {
            "header": {"frame_id": frame_id, "stamp": {"sec": stamp_ns // 10**9, "nanosec": stamp_ns % 10**9}},
            "pose": {"pose": {"position": xyz(pos), "orientation": dict(zip("xyzw", quat_xyzw, strict=True))}},
            "twist": {"twist": {"linear": xyz(lin_vel_b), "angular": xyz(ang_vel_b)}},
        },
    )


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high))) * rng.choice((-1.0, 1.0))


def bad_message(kind: str, rng: random.Random, now_s: float, limits: dict[str, float]) -> Any:
    """One message of ``kind`` (see the module docstring), stamped around ``now_s``."""
    if kind in ("nan", "inf"):
        value = float("nan") if kind == "nan" else rng.choice((math.inf, -math.inf))
        where = rng.choice(("pos", "quat", "lin", "ang"))
        vec = [0.0, 0.0, 0.0]
        vec[rng.randrange(3)] = value
        if where == "pos":
            return _odometry(rng, now_s, pos=(vec[0], vec[1], 1.0 + vec[2]))
        if where == "quat":
            quat = [0.0, 0.0, 0.0, 1.0]
            quat[rng.randrange(4)] = value
            return _odometry(rng, now_s, quat_xyzw=tuple(quat))
        if where == "lin":
            return _odometry(rng, now_s, lin_vel_b=tuple(vec))
        return _odometry(rng, now_s, ang_vel_b=tuple(vec))
    if kind == "wrong_size":
        message = _odometry(rng, now_s)
        message.pose.pose.orientation = messages.make("geometry_msgs/msg/Point", {"x": 0.0, "y": 0.0, "z": 1.0})
        return message
    if kind == "zero_quaternion":
        return _odometry(rng, now_s, quat_xyzw=(0.0, 0.0, 0.0, 0.0))
    if kind == "far":
        direction = np.asarray([rng.gauss(0, 1) for _ in range(3)])
        direction /= np.abs(direction).max()  # the largest axis error is ``distance`` (per-axis bound)
        distance = abs(_log_uniform(rng, limits["pos_err_m"] * 1.01, 1e300))
        pos = np.asarray(SETPOINT_W) + direction * distance
        return _odometry(rng, now_s, pos=tuple(float(v) for v in pos))
    if kind == "tilted":
        tilt = rng.uniform(limits["tilt_rad"] + 0.01, math.pi)
        azimuth = rng.uniform(-math.pi, math.pi)
        axis = (math.cos(azimuth), math.sin(azimuth), 0.0)  # horizontal axis: pure tilt
        s = math.sin(tilt / 2)
        return _odometry(rng, now_s, quat_xyzw=(axis[0] * s, axis[1] * s, 0.0, math.cos(tilt / 2)))
    if kind in ("spinning", "fast"):
        key = "ang_vel_rad_s" if kind == "spinning" else "lin_vel_m_s"
        vec = [0.0, 0.0, 0.0]
        vec[rng.randrange(3)] = _log_uniform(rng, limits[key] * 1.01, 1e6)
        if kind == "spinning":
            return _odometry(rng, now_s, ang_vel_b=tuple(vec))
        return _odometry(rng, now_s, lin_vel_b=tuple(vec))
    if kind == "old_stamp":
        return _odometry(rng, now_s - abs(_log_uniform(rng, 1.0, 1e6)))
    if kind == "future_stamp":
        return _odometry(rng, now_s + abs(_log_uniform(rng, 1.0, 1e6)))
    if kind == "zero_stamp":
        return _odometry(rng, 0.0)
    if kind == "wrong_frame":
        return _odometry(rng, now_s, frame_id=rng.choice(("map", "odom", "", "base_link", "wörld")))
    raise ValueError(f"unknown fuzz kind {kind!r}")


def fuzz(export_dir: Path, robot: Path, messages_n: int, seed: int = 0) -> dict[str, Any]:
    """Run the fuzzer; raises AssertionError on the first violated invariant. Returns counts."""
    rng = random.Random(seed)
    clock = [0.0]
    transport = MemoryTransport()
    cfg = load_robot(robot, {"setpoint_w": list(SETPOINT_W)})
    # Both clocks are driven by the fuzzer (stamps on an epoch-like base), so a slow machine
    # cannot age a message between its creation and its step.
    epoch = 1.7e9

    def stamp_now() -> float:
        return epoch + clock[0] + period

    node = PolicyNode(
        transport, cfg, PolicyRunner(export_dir), clock=lambda: clock[0], stamp_clock=lambda: epoch + clock[0]
    )
    odom = next(iter(cfg.inputs.values()))
    publish = transport.publisher(odom.topic, odom.type, odom.qos)
    safe = np.asarray(cfg.safety.safe_command)
    period = node.period_s
    limits = node.envelope.limits
    sent: Counter[str] = Counter()
    armed_at_bad = 0
    good = 0

    def period_with(message: Any) -> np.ndarray | None:
        clock[0] += period
        publish(message)
        return node.step(clock[0])

    t0 = time.perf_counter()
    for _ in range(messages_n):
        for _ in range(rng.randrange(16)):
            period_with(_odometry(rng, stamp_now()))
            good += 1
        kind = rng.choice(KINDS)
        expected = STATE_KINDS.get(kind) or REJECTED_KINDS[kind]
        before = node.rejections[expected]
        armed_at_bad += node.state is SafetyState.ARMED
        command = period_with(bad_message(kind, rng, stamp_now(), limits))
        sent[kind] += 1
        after = node.rejections[expected]
        assert after == before + 1, f"{kind}: {expected} went {before} -> {after} ({node.last_error})"
        if kind in STATE_KINDS:
            assert command is not None and np.array_equal(command, safe), f"{kind}: sent {command}"
    node.publish_diagnostics()
    diag = {kv.key: kv.value for kv in transport.published["/diagnostics"][-1].status[0].values}
    for kind, reason in {**STATE_KINDS, **REJECTED_KINDS}.items():
        total = sum(n for k, n in sent.items() if (STATE_KINDS.get(k) or REJECTED_KINDS.get(k)) == reason)
        assert int(diag.get(f"rejected.{reason}", "0")) == node.rejections[reason] >= total, (kind, diag)
    return {
        "bad_messages": sum(sent.values()),
        "good_messages": good,
        "armed_when_bad_arrived": armed_at_bad,
        "by_kind": dict(sent),
        "rejections": dict(node.rejections),
        "commands": node.commands_sent,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=10_000, help="bad messages to send (default 10000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from real_support import export_policy, quad_robot, quad_spec

    with tempfile.TemporaryDirectory() as tmp:
        export = export_policy(Path(tmp) / "export", quad_spec(history=2), seed=args.seed)
        report = fuzz(export, quad_robot(), args.messages, args.seed)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
