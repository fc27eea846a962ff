"""The README's deploy demos under CPU load, and how fast the safe command follows a kill.

Runs `embodied deploy` (the shipped crazyflie_sim config) and `embodied sim-robot quad-hover`
over Cyclone DDS on loopback while ``--busy`` processes spin (``while True: pass``, one per core
on a 2-core machine), for each mode:

- ``lockstep``: sim-robot waits for the node's answer to each state (matched by stamp); the
  node runs on sim-robot's ``/clock`` (``--use-sim-time``);
- ``realtime``: sim-robot steps on the wall clock and holds the last command.

Reported per mode: episodes, success rate (and the same policy evaluated in-process on the same
episodes), safe commands applied after arming (spurious motors-off), missed commands, and the
node's control-period jitter p99 and overruns from its final status line.

``--kill-tests N``: N times each, with the vehicle flying (realtime) and the node armed, this
script (a third DDS participant listening on the command topic) sends SIGTERM to the node, or to
sim-robot, and measures the time until the first safe command is on the wire.

    .venv/bin/python bench/deploy_under_load.py RUN_DIR [--episodes 20] [--busy 2] [--kill-tests 5]

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
    disarms = [ln.split("armed -> ", 1)[1] for ln in node_out.splitlines() if " armed -> " in ln]
    return {"mode": mode, **summary, **node_status(node_out), "node_disarms": disarms}


def in_process(export: Path, episodes: int, seed: int) -> float:
    import dataclasses

    import torch

    from embodied import registry
    from embodied.commands.sim_robot import HANDOVER_STARTS, held_setpoint
    from embodied.config import apply_overrides
    from embodied.real.robot_config import load_robot
    from embodied.real.runner import PolicyRunner

    runner = PolicyRunner(export)
    cfg = dataclasses.replace(registry.task_cfg("quad-hover"), obs_noise_std=(0.0, 0.0, 0.0, 0.0))
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


class CommandWatch:
    """A DDS participant on the command topic: time of every command, and whether it was safe."""

    def __init__(self, domain: int, topic: str, type_name: str, safe: np.ndarray) -> None:
        from embodied.real import messages
        from embodied.real.transports.dds import DdsTransport

        self.safe = safe
        self.events: list[tuple[float, bool]] = []
        self._lock = threading.Lock()
        self.transport = DdsTransport(domain_id=domain, loopback=True)

        def on_command(message: Any) -> None:
            values = messages.to_vector(message.data)
            with self._lock:
                self.events.append((time.monotonic(), bool(np.allclose(values, self.safe))))

        self.transport.subscribe(topic, type_name, "reliable", on_command)

    def armed_since(self, t: float) -> bool:
        with self._lock:
            return any(not safe for ts, safe in self.events if ts >= t)

    def first_safe_after(self, t: float, timeout_s: float = 5.0) -> float | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                hits = [ts for ts, safe in self.events if ts >= t and safe]
            if hits:
                return hits[0] - t
            time.sleep(0.001)
        return None


def kill_test(export: Path, victim: str, n_busy: int) -> float | None:
    """Seconds from SIGTERM of ``victim`` (node or robot) to the first safe command on the wire."""
    from embodied.real.robot_config import load_robot

    domain = random.Random().randrange(100, 230)
    robot = load_robot(robot_config())
    common = ["--robot", str(robot_config()), "--loopback", "--domain-id", str(domain)]
    watch = CommandWatch(domain, robot.command.topic, robot.command.type, np.asarray(robot.safety.safe_command))
    load = busy(n_busy)
    procs: list[subprocess.Popen[Any]] = []
    try:
        node = subprocess.Popen([*CLI, "deploy", str(export), *common, "--no-live"], stdout=subprocess.DEVNULL)
        sim = subprocess.Popen(
            [*CLI, "sim-robot", "quad-hover", *common, "--seconds", "60", "--realtime", *NOISE_FREE],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs = [node, sim]
        t0 = time.monotonic()
        while not watch.armed_since(t0):
            if time.monotonic() - t0 > 60:
                return None
            time.sleep(0.05)
        time.sleep(1.0)  # flying
        target = node if victim == "node" else sim
        t_kill = time.monotonic()
        target.send_signal(signal.SIGTERM)
        return watch.first_safe_after(t_kill)
    finally:
        stop_all(procs + load)
        watch.transport.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="run directory or export folder of a quad-hover policy")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--busy", type=int, default=2, help="busy-looping processes beside the demo (default 2)")
    parser.add_argument("--modes", default="lockstep,realtime")
    parser.add_argument("--kill-tests", type=int, default=0, metavar="N")
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
    report: dict[str, Any] = {"cpu_count": os.cpu_count(), "busy": args.busy, "envelope": ENVELOPE_OVERRIDES}
    report["in_process_success_rate"] = in_process(export, args.episodes, args.seed)
    for mode in [m for m in args.modes.split(",") if m]:
        report[mode] = demo(export, mode, args.episodes, args.seed, args.busy)
        print(json.dumps(report[mode]), flush=True)
    for victim in ("node", "robot") if args.kill_tests else ():
        delays = [kill_test(export, victim, args.busy) for _ in range(args.kill_tests)]
        report[f"kill_{victim}_to_safe_ms"] = [None if d is None else round(d * 1e3, 2) for d in delays]
        print(victim, report[f"kill_{victim}_to_safe_ms"], flush=True)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
