"""Command liveness, the last word and rejected input, measured over Cyclone DDS on loopback.

Three campaigns (issue: "no robot left on its last command"), each beside ``--busy`` processes
spinning (``while True: pass``):

- ``kill``: ``--kills`` times, with the vehicle flying (``embodied sim-robot quad-hover --realtime``)
  and the node armed, SIGKILL the node (``embodied deploy``). Nothing tells the robot side, so its
  command watchdog must: after ``command.watchdog_periods`` periods without a new command it applies
  the safe command. One sim-robot serves every kill (a fresh node re-arms after each); its summary
  lists every watchdog trip with the periods (wall clock) from the last command's arrival.
- ``term``: ``--terms`` times, SIGTERM the armed node; an independent DDS participant (this
  process, not the node's) records every command on the command topic; counted when the last
  command the node wrote, written after the signal, is the safe command (motors off) and reached it.
- ``malformed``: ``--payloads`` bad odometry messages over DDS into a node (kinds: not UTF-8
  ``frame_id``, undecodable by the reader; wrong frame; zero stamp; stamp in the future; stamp older
  than the newest), then the node's ``/diagnostics`` read back over DDS: every payload must be
  counted (``decode_errors`` + ``rejected.*``).

    .venv/bin/python bench/deploy_liveness.py [--busy 2] [--kills 20] [--terms 50] [--payloads 10000] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from deploy_under_load import CLI, NOISE_FREE, CommandWatch, _hold_command, _wait_policy, busy, stop_all


def _flight(export: Path, domain: int) -> tuple[list[str], subprocess.Popen[str]]:
    common = ["--robot", "crazyflie_sim", "--loopback", "--domain-id", str(domain)]
    sim = subprocess.Popen(
        [
            *CLI,
            "sim-robot",
            "quad-hover",
            *common,
            "--seconds",
            "3600",
            "--realtime",
            "--handover-starts",
            "--json",
            *NOISE_FREE,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    return common, sim


def node_signal_series(export: Path, sig: signal.Signals, n: int, n_busy: int) -> dict[str, Any]:
    """``n`` times: start a node, wait until it drives, send ``sig``; one sim-robot throughout."""
    from embodied.real.robot_config import load_robot

    robot = load_robot("crazyflie_sim")
    domain = random.Random().randrange(100, 230)
    safe = np.asarray(robot.safety.safe_command)
    watch = CommandWatch(domain, robot.command.topic, robot.command.type, safe, _hold_command(export))
    common, sim = _flight(export, domain)
    load = busy(n_busy)
    trials: list[dict[str, Any]] = []
    try:
        for _ in range(n):
            node = subprocess.Popen([*CLI, "deploy", str(export), *common, "--no-live"], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)  # fmt: skip
            if not _wait_policy(watch, time.time_ns(), 100, 120.0):
                trials.append({"error": "the node did not arm"})
                stop_all([node])
                continue
            t_sent = time.time_ns()
            os.kill(node.pid, sig)
            node.wait(timeout=30)
            time.sleep(0.5 if sig == signal.SIGTERM else 0.05)
            with watch._lock:  # the watcher's record: write time -> kind
                after = sorted((ts, kind) for ts, kind in watch.events if ts >= t_sent)
                before = [kind for ts, kind in sorted(watch.events) if ts < t_sent]
            trial = {"armed_at_signal": bool(before) and before[-1] == "policy", "commands_after": len(after)}
            if sig == signal.SIGTERM:
                trial["last_is_safe"] = bool(after) and after[-1][1] == "safe"
                trial["to_safe_ms"] = next(((ts - t_sent) * 1e-6 for ts, kind in after if kind == "safe"), None)
            trials.append(trial)
            print(sig.name, trial, flush=True)
            time.sleep(1.0 if sig == signal.SIGKILL else 0.2)  # the robot's watchdog trips, the vehicle falls
    finally:
        stop_all(load)
        sim.send_signal(signal.SIGINT)  # ends with its JSON summary
        out, _ = sim.communicate(timeout=60)
        watch.transport.close()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    summary = json.loads(lines[-1]) if lines else {}
    return {"trials": trials, "sim_robot": summary, "watchdog_periods": robot.command.watchdog_periods}


def malformed_series(export: Path, n: int, n_busy: int, seed: int = 0) -> dict[str, Any]:
    """``n`` bad odometry payloads into a node over DDS; its ``/diagnostics`` read back over DDS."""
    from cyclonedds.domain import DomainParticipant
    from cyclonedds.pub import DataWriter
    from cyclonedds.topic import Topic
    from real_support import odometry, write_robot_variant

    from embodied.real.deploy import build_node
    from embodied.real.node import DIAGNOSTICS_TOPIC
    from embodied.real.robot_config import load_robot
    from embodied.real.transports.dds import DdsTransport, _qos, idl_struct, to_idl

    domain = random.Random().randrange(100, 230)
    # reliable odometry, so a burst is delivered rather than lost to the sensor profile's history
    robot_path = write_robot_variant(Path(tempfile.mkdtemp()), load_robot("crazyflie_sim").path,
                                     {"inputs.odom.qos": "reliable"})  # fmt: skip
    transport = DdsTransport(domain_id=domain, loopback=True, node_name="embodied_policy")
    node = build_node(transport, export, robot_path)
    stop = threading.Event()
    worker = threading.Thread(target=node.run, args=(stop,), daemon=True)
    worker.start()
    reports: list[dict[str, str]] = []
    reader = DdsTransport(domain_id=domain, loopback=True)
    reader.subscribe(DIAGNOSTICS_TOPIC, "diagnostic_msgs/msg/DiagnosticArray", "reliable",
                     lambda m: reports.append({kv.key: kv.value for kv in m.status[0].values}))  # fmt: skip
    odo_type = "nav_msgs/msg/Odometry"
    struct = idl_struct(odo_type)
    participant = DomainParticipant(domain)
    writer = DataWriter(participant, Topic(participant, "rt/cf/odom", struct), qos=_qos("reliable"))
    rng = random.Random(seed)
    kinds = ("not_utf8", "wrong_frame", "zero_stamp", "future_stamp", "old_stamp")
    sent = dict.fromkeys(kinds, 0)
    load = busy(n_busy)
    try:
        while writer.get_publication_matched_status().current_count < 1:
            time.sleep(0.01)
        t_valid = time.time()
        writer.write(to_idl(odometry(stamp_s=t_valid), odo_type))  # the newest valid state for the whole run
        for _ in range(n):
            kind = rng.choice(kinds)
            # older than the valid state above: out of order however long the campaign runs
            message = odometry(stamp_s=t_valid - 5.0) if kind == "old_stamp" else odometry()
            if kind == "wrong_frame":
                message.header.frame_id = "map"
            elif kind == "zero_stamp":
                message.header.stamp.sec = message.header.stamp.nanosec = 0
            elif kind == "future_stamp":
                message.header.stamp.sec += 3600
            sample = to_idl(message, odo_type)
            if kind == "not_utf8":  # valid CDR that Cyclone delivers, but no Python string
                payload = struct.serialize(sample).replace(b"world", b"\xff\xfe\xfd\xfc\xfb")
                sample = _raw_sample(struct, sample, payload)
            writer.write(sample)
            sent[kind] += 1
            # At most a few in flight: the reader keeps the last 10 (ROS 2's reliable profile), and a
            # flood faster than its listener would be overwritten in DDS before the node saw it.
            pace = time.monotonic() + 5.0
            while sum(sent.values()) - _counted(node, transport) > 4 and time.monotonic() < pace:
                time.sleep(0.0002)
        writer.wait_for_acks(5_000_000_000)
        time.sleep(0.5)
        node.publish_diagnostics()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not reports:
            time.sleep(0.05)
        time.sleep(0.5)
    finally:
        stop_all(load)
        stop.set()
        worker.join(timeout=5)
        transport.close()
        reader.close()
    last = reports[-1] if reports else {}
    counted = int(last.get("decode_errors", 0)) + sum(int(last.get(f"rejected.{r}", 0)) for r in REJECTIONS)
    return {"sent": n, "by_kind": sent, "counted_on_diagnostics": counted, "diagnostics": last}


REJECTIONS = ("wrong_frame", "zero_stamp", "future_stamp", "stamp_out_of_order")
"""The node's counters (``rejected.<reason>``) of the campaign's kinds, besides ``decode_errors``."""


def _counted(node: Any, transport: Any) -> int:
    """Bad payloads the node has counted so far (read in process, only to pace the sender)."""
    return int(transport.decode_errors) + sum(node.rejections[r] for r in REJECTIONS)


def _raw_sample(struct: Any, sample: Any, payload: bytes) -> Any:
    """``sample`` whose serialization is ``payload`` (bytes Cyclone validates and delivers)."""

    class Raw(struct):  # type: ignore[misc, valid-type]
        def serialize(self, *_a: Any, **_k: Any) -> bytes:
            return payload

    raw = struct.__new__(Raw)
    raw.__dict__.update(sample.__dict__)
    return raw


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--busy", type=int, default=2)
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--terms", type=int, default=50)
    p.add_argument("--payloads", type=int, default=10_000)
    p.add_argument("--export", type=Path, default=None, help="export folder (default: a small random policy)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    export = args.export
    if export is None:
        from real_support import export_policy, quad_spec

        export = export_policy(Path(tempfile.mkdtemp()) / "export", quad_spec(history=2), seed=3)
    result: dict[str, Any] = {"busy": args.busy}
    if args.payloads:
        result["malformed"] = malformed_series(export, args.payloads, args.busy)
        print("malformed", {k: v for k, v in result["malformed"].items() if k != "diagnostics"}, flush=True)
    if args.kills:
        result["kill"] = node_signal_series(export, signal.SIGKILL, args.kills, args.busy)
    if args.terms:
        result["term"] = node_signal_series(export, signal.SIGTERM, args.terms, args.busy)
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
