"""The README's deploy demos under CPU load, and how fast the safe command follows a kill.

Runs `embodied deploy` (the shipped crazyflie_sim config) and `embodied sim-robot quad-hover`
(given a run directory, ``--run RUN_DIR``: the task as the policy was trained) over Cyclone DDS
on loopback while ``--busy`` processes spin (``while True: pass``, one per core
on a 2-core machine), for each mode:

- ``lockstep``: sim-robot waits for the node's answer to each state (matched by stamp); the
  node runs on sim-robot's ``/clock`` (``--use-sim-time``);
- ``realtime``: sim-robot steps on the wall clock and holds the last command.

Reported per mode: episodes, success rate (and the same policy evaluated in-process on the same
episodes), safe commands applied after arming (spurious motors-off), missed commands, and the
node's control-period jitter p99 and overruns from its final status line.

``--kill-tests N``: N times for each victim (``--kill-victims node,robot``) and signal
(``--kill-signals SIGTERM,SIGKILL``), with the vehicle flying (realtime) and the node armed, this
script sends the signal and a third DDS participant on the command topic records every command's
write time (DDS source timestamp): the time from the signal to the first hold-or-safe command
(the gap hold is hover thrust, the safe command motors-off) and to the first safe command, and
whether any policy command followed. p50/p99/max over the N kills.

    .venv/bin/python bench/deploy_under_load.py RUN_DIR [--episodes 20] [--busy 2] [--kill-tests 20]

Timings depend on the machine and its load: report them with the CPU model and the load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

CLI = [sys.executable, "-m", "embodied.cli"]
NOISE_FREE = ["--env", "obs_noise_std=[0,0,0,0]"]


def busy(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop_all(procs: list[subprocess.Popen[Any]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


ENVELOPE_OVERRIDES: dict[str, float] = {}
"""``--envelope KEY=VALUE``: written into a copy of the robot config's safety.envelope_limits."""


def robot_config() -> Path:
    from real_support import quad_robot, write_robot_variant

    if not ENVELOPE_OVERRIDES:
        return quad_robot()
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="deploy_under_load_"))
    return write_robot_variant(folder, quad_robot(), {"safety.envelope_limits": dict(ENVELOPE_OVERRIDES)})


def node_status(output: str) -> dict[str, float]:
    """Jitter p99 and overruns from the node's last status line."""
    line = [ln for ln in output.splitlines() if " Hz | jitter ms p99 " in ln][-1]
    jitter = float(line.split("jitter ms p99 ")[1].split()[0])
    overruns = int(line.split("overruns ")[1].split()[0])
    rate = float(line.split(" Hz")[0].split("|")[-1])
    return {"jitter_p99_ms": jitter, "overruns": overruns, "rate_hz": rate}


HANDOVER = False
"""``--handover-starts``: sim-robot and the in-process reference start as after a PID take-off."""

ENV_OVERRIDES: list[str] = []
"""``--env KEY=VALUE``: task settings for sim-robot and the in-process reference alike, e.g. the
ones the policy was trained with (the shipped quad-hover config turns the constant disturbance
force off: ``--env disturbance_force_std_n=0``)."""


RUN_DIR: Path | None = None
"""The run directory when one was given: sim-robot serves the task as it was trained (``--run``),
and the in-process reference uses the same task config."""


def task_cfg() -> Any:
    """The task config both sides fly: the run's (as trained) or the task defaults."""
    from embodied import registry

    if RUN_DIR is None:
        return registry.task_cfg("quad-hover")
    from embodied.experiment import load_experiment
    from embodied.training.run import CONFIG_FILE

    return load_experiment(RUN_DIR / CONFIG_FILE).env


def demo(export: Path, mode: str, episodes: int, seed: int, n_busy: int) -> dict[str, Any]:
    domain = str(random.Random().randrange(100, 230))
    common = ["--robot", str(robot_config()), "--loopback", "--domain-id", domain]
    load = busy(n_busy)
    try:
        node = subprocess.Popen(
            [*CLI, "deploy", str(export), *common, "--no-live", *(["--use-sim-time"] if mode == "lockstep" else [])],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        sim_cmd = [*CLI, "sim-robot", "quad-hover", *common, "--episodes", str(episodes), "--seed", str(seed), "--json"]
        sim_cmd += ["--run", str(RUN_DIR)] if RUN_DIR is not None else []
        sim_cmd += NOISE_FREE + [a for kv in ENV_OVERRIDES for a in ("--env", kv)]
        sim_cmd += ["--realtime"] if mode == "realtime" else []
        sim_cmd += ["--handover-starts"] if HANDOVER else []
        sim = subprocess.run(sim_cmd, capture_output=True, text=True, timeout=3600)
        node.send_signal(signal.SIGTERM)
        node_out, _ = node.communicate(timeout=30)
    finally:
        stop_all(load)
    if sim.returncode != 0:
        raise RuntimeError(f"sim-robot failed: {sim.stderr[-2000:]}\nnode:\n{node_out[-3000:]}")
    summary = json.loads(sim.stdout.strip().splitlines()[-1])
    # "armed -> hold" (a short input gap, hover thrust) is not a disarm; it is counted apart.
    moves = [ln.split("armed -> ", 1)[1] for ln in node_out.splitlines() if " armed -> " in ln]
    disarms = [m for m in moves if not m.startswith("hold:")]
    holds = len(moves) - len(disarms)
    return {"mode": mode, **summary, **node_status(node_out), "node_disarms": disarms, "gap_holds": holds}


def in_process(export: Path, episodes: int, seed: int) -> float:
    import dataclasses

    import torch

    from embodied import registry
    from embodied.commands.sim_robot import HANDOVER_STARTS, held_setpoint
    from embodied.config import apply_overrides
    from embodied.real.robot_config import load_robot
    from embodied.real.runner import PolicyRunner

    runner = PolicyRunner(export)
    cfg = dataclasses.replace(task_cfg(), obs_noise_std=(0.0, 0.0, 0.0, 0.0))
    # The same task config sim-robot serves: the robot config's held setpoint, the start states.
    cfg = apply_overrides(cfg, held_setpoint(load_robot(robot_config()).params, cfg), "robot params")
    if HANDOVER:
        cfg = apply_overrides(cfg, dict(HANDOVER_STARTS), "--handover-starts")
    if ENV_OVERRIDES:
        from embodied.config import parse_dotted

        cfg = apply_overrides(cfg, parse_dotted(ENV_OVERRIDES, "--env"), "--env")
    env = registry.make_env("quad-hover", cfg, 1, "cpu", seed)
    obs = env.reset(seed=seed)
    done = successes = 0
    while done < episodes:
        action = torch.from_numpy(runner(obs["policy"][0].numpy())).reshape(1, -1)
        obs, _r, terminated, truncated, info = env.step(action)
        if bool(terminated[0] | truncated[0]):
            done += 1
            successes += int(bool(info["success"][0]))
    return successes / episodes


COMMAND_KINDS = ("policy", "hold", "safe")


class CommandWatch:
    """A DDS participant on the command topic: every command's kind (the policy's, the gap hold,
    the safe command) with the time its writer stamped it (DDS source timestamp, ns since the
    epoch). Write times, not this process's receive times: this watcher runs in the normal class
    beside busy loops, and its own wake-up delays are not the node's."""

    def __init__(
        self, domain: int, topic: str, type_name: str, safe: np.ndarray, hold: np.ndarray, state_topic: str = ""
    ) -> None:
        from embodied.real import messages
        from embodied.real.transports.dds import DdsTransport

        self.safe, self.hold = safe, hold
        self.events: list[tuple[int, str]] = []
        self.seen_ns: dict[int, int] = {}
        """Write time -> this process's receive time (``time.time_ns()``): the difference is the
        watcher's own delay, which a receive-time measurement would have added."""
        self._lock = threading.Lock()
        self.transport = DdsTransport(domain_id=domain, loopback=True)

        def on_command(message: Any) -> None:
            values = messages.to_vector(message.data)
            kind = "safe" if np.allclose(values, self.safe) else "hold" if np.allclose(values, self.hold) else "policy"
            written = int(message.sample_info.source_timestamp)
            with self._lock:
                self.events.append((written, kind))
                self.seen_ns[written] = time.time_ns()

        self.transport.subscribe(topic, type_name, "reliable", on_command)
        self.state_writes: list[int] = []
        """Write times of the robot side's state messages (``state_topic``, odometry)."""

        def on_state(message: Any) -> None:
            with self._lock:
                self.state_writes.append(int(message.sample_info.source_timestamp))

        if state_topic:
            self.transport.subscribe(state_topic, "nav_msgs/msg/Odometry", "sensor", on_state)

    def last_state_before(self, t_ns: int) -> int:
        """Write time of the newest state message written before ``t_ns`` (0: none)."""
        with self._lock:
            return max((ts for ts in self.state_writes if ts < t_ns), default=0)

    def count_since(self, t_ns: int, kinds: tuple[str, ...]) -> int:
        with self._lock:
            return sum(1 for ts, kind in self.events if ts >= t_ns and kind in kinds)

    def first_after(
        self, t_ns: int, kinds: tuple[str, ...], timeout_s: float = 5.0, seen: bool = False
    ) -> float | None:
        """Seconds from ``t_ns`` to the write of the first command of ``kinds`` (``seen``: to its
        arrival here instead); None when none came."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                hits = [ts for ts, kind in self.events if ts >= t_ns and kind in kinds]
                first = min(hits) if hits else 0
                first = self.seen_ns[first] if hits and seen else first
            if hits:
                return (first - t_ns) * 1e-9
            time.sleep(0.005)
        return None

    def last_kind_before(self, t_ns: int) -> str:
        """Kind of the newest command written before ``t_ns`` ("" when none)."""
        with self._lock:
            before = [(ts, kind) for ts, kind in self.events if ts < t_ns]
        return max(before)[1] if before else ""

    def policy_after(self, t_ns: int) -> int:
        """Policy commands written after the first non-policy command that follows ``t_ns``."""
        with self._lock:
            after = sorted((ts, kind) for ts, kind in self.events if ts >= t_ns)
        first = next((i for i, (_ts, kind) in enumerate(after) if kind != "policy"), len(after))
        return sum(1 for _ts, kind in after[first:] if kind == "policy")


def _hold_command(export: Path) -> np.ndarray:
    """The shipped gap command (hover_action on every motor) in physical units."""
    from embodied.real.robot_config import load_robot
    from embodied.real.runner import PolicyRunner
    from embodied.real.safety import SafetyLayer

    robot_cfg = load_robot(robot_config())
    spec = PolicyRunner(export).io_spec
    command = SafetyLayer(spec, robot_cfg.safety, spec.control_period_s).gap_command(None)
    assert command is not None
    return command


def _wait_policy(watch: CommandWatch, since_ns: int, n: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while watch.count_since(since_ns, ("policy",)) < n:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def kill_series(export: Path, victim: str, sig: signal.Signals, n: int, n_busy: int) -> list[dict[str, Any]]:
    """``n`` kills of ``victim`` with ``sig`` while the vehicle flies (realtime) and the node is
    armed: the time from the signal to the first hold-or-safe command and to the first safe
    command (write times), and how many policy commands followed. A robot kill restarts
    sim-robot beside the same node (which re-arms); a node kill restarts both."""
    from embodied.real.robot_config import load_robot

    domain = random.Random().randrange(100, 230)
    robot = load_robot(robot_config())
    common = ["--robot", str(robot_config()), "--loopback", "--domain-id", str(domain)]
    safe = np.asarray(robot.safety.safe_command)
    state_topic = robot.inputs["odom"].topic if victim == "robot" else ""
    watch = CommandWatch(domain, robot.command.topic, robot.command.type, safe, _hold_command(export), state_topic)
    load = busy(n_busy)
    node: subprocess.Popen[Any] | None = None
    sim: subprocess.Popen[Any] | None = None
    results: list[dict[str, Any]] = []
    try:
        for _ in range(n):
            if node is None or node.poll() is not None:
                node = subprocess.Popen([*CLI, "deploy", str(export), *common, "--no-live"], stdout=subprocess.DEVNULL)
            sim = subprocess.Popen(
                [*CLI, "sim-robot", "quad-hover", *common, "--seconds", "120", "--realtime", *NOISE_FREE],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            started = time.time_ns()
            if not _wait_policy(watch, started, 100, 120.0):  # 1 s of flight with the policy driving
                results.append({"error": "the node did not arm"})
                stop_all([sim])
                continue
            target = node if victim == "node" else sim
            t_sent = time.time_ns()
            os.kill(target.pid, sig)
            first = watch.first_after(t_sent, ("hold", "safe"))
            first_safe = watch.first_after(t_sent, ("safe",))
            seen = watch.first_after(t_sent, ("hold", "safe"), seen=True)
            armed = watch.last_kind_before(t_sent)  # after the waits above: the watcher has caught up
            if armed != "policy":
                # The node was not driving at the kill (an envelope exit, a gap hold): its reaction
                # to the kill cannot be told apart. Not counted.
                results.append({"error": f"not driving at the kill (last command: {armed or 'none'})"})
                print(victim, sig.name, results[-1], flush=True)
                stop_all([sim] if victim == "robot" else [sim, node])
                continue
            # This script runs in the normal class beside busy loops: it may lose the CPU between
            # reading the clock and the kill. A SIGKILLed victim cannot have died before its last
            # state write, so measure from the later of the two (still an upper bound on the
            # reaction). Not for SIGTERM: a victim may write once more while its handler is due.
            last_state = watch.last_state_before(t_sent + round((first or 0.0) * 1e9))
            t_kill = max(t_sent, last_state) if sig == signal.SIGKILL else t_sent
            shift_s = (t_kill - t_sent) * 1e-9
            first = None if first is None else first - shift_s
            first_safe = None if first_safe is None else first_safe - shift_s
            time.sleep(0.3)  # policy commands after the reaction would show up by now
            results.append(
                {
                    "to_hold_or_safe_ms": None if first is None else round(first * 1e3, 2),
                    "to_safe_ms": None if first_safe is None else round(first_safe * 1e3, 2),
                    "seen_by_watcher_ms": None if seen is None else round((seen - shift_s) * 1e3, 2),
                    "signal_sent_late_ms": round(shift_s * 1e3, 2),
                    "policy_after": watch.policy_after(t_kill),
                }
            )
            print(victim, sig.name, results[-1], flush=True)
            stop_all([sim] if victim == "robot" else [sim, node])
    finally:
        stop_all([p for p in (node, sim) if p is not None] + load)
        watch.transport.close()
    return results


def summarize_kills(results: list[dict[str, Any]]) -> dict[str, Any]:
    """p50/p99/max of the kill-to-command times, and how many kills met 2 periods (20 ms)."""
    out: dict[str, Any] = {"kills": len(results)}
    for key in ("to_hold_or_safe_ms", "to_safe_ms", "seen_by_watcher_ms"):
        values = [r[key] for r in results if r.get(key) is not None]
        if values:
            p50, p99 = np.percentile(values, [50, 99]).tolist()
            out[key] = {"p50": round(p50, 2), "p99": round(p99, 2), "max": max(values), "n": len(values)}
            out[key]["within_20ms"] = sum(v <= 20.0 for v in values)
    out["policy_after_kill"] = sum(r.get("policy_after", 0) for r in results)
    out["errors"] = [r["error"] for r in results if "error" in r]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="run directory or export folder of a quad-hover policy")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--busy", type=int, default=2, help="busy-looping processes beside the demo (default 2)")
    parser.add_argument("--modes", default="lockstep,realtime")
    parser.add_argument("--kill-tests", type=int, default=0, metavar="N", help="kills per victim and signal")
    parser.add_argument("--kill-victims", default="node,robot", help="whom to kill: node, robot or both")
    parser.add_argument("--kill-signals", default="SIGTERM,SIGKILL", help="signals to kill with")
    parser.add_argument(
        "--envelope",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an envelope limit (for policies exported without extra.envelope), e.g. ang_vel_rad_s=20",
    )
    parser.add_argument("--handover-starts", action="store_true", help="sim-robot --handover-starts (and in-process)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="task setting (ENV_OVERRIDES)")
    args = parser.parse_args()
    global HANDOVER
    HANDOVER = args.handover_starts
    ENV_OVERRIDES.extend(args.env)
    for item in args.envelope:
        key, _, value = item.partition("=")
        ENVELOPE_OVERRIDES[key] = float(value)
    from embodied.real.runner import resolve_export_dir

    export = resolve_export_dir(args.run_dir)
    global RUN_DIR
    from embodied.training.run import CONFIG_FILE

    RUN_DIR = args.run_dir if (args.run_dir / CONFIG_FILE).is_file() else None
    report: dict[str, Any] = {"cpu_count": os.cpu_count(), "busy": args.busy, "envelope": ENVELOPE_OVERRIDES}
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        report[mode] = demo(export, mode, args.episodes, args.seed, args.busy)
        print(json.dumps(report[mode]), flush=True)
    if modes:  # after the demos: on a loaded machine this single-env loop takes minutes
        report["in_process_success_rate"] = in_process(export, args.episodes, args.seed)
        print("in-process success rate", report["in_process_success_rate"], flush=True)
    for victim in [v for v in args.kill_victims.split(",") if v] if args.kill_tests else ():
        for name in [s for s in args.kill_signals.split(",") if s]:
            if victim == "node" and name == "SIGKILL":
                # Nothing in a SIGKILLed node can send a command: only the robot side's own command
                # timeout can act (sim-robot --realtime has none; it holds the last command).
                print("skipping SIGKILL of the node: it cannot send anything", flush=True)
                continue
            results = kill_series(export, victim, signal.Signals[name], args.kill_tests, args.busy)
            report[f"kill_{victim}_{name}"] = {"summary": summarize_kills(results), "kills": results}
            print(victim, name, json.dumps(report[f"kill_{victim}_{name}"]["summary"]), flush=True)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
