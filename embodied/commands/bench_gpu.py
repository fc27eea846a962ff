"""``embodied bench gpu``: one command for a lent GPU machine, finished in under 8 minutes.

It measures every installed backend's throughput (``embodied bench sim`` at GPU-scale batch
sizes: the quadrotor, MuJoCo, MuJoCo-Warp, ManiSkill3 and Isaac Lab's kit-less Cartpole, the
last in ``.venv-isaaclab`` when that exists) and runs short trainings with their tasks'
``--preset gpu``: PPO on ``quad-hover`` (until 95 % success holds), PPO and FastTD3 on
``go1-flat`` and FastTD3 on ``humanoid`` (MuJoCo-Warp when installed), and, where two GPUs exist,
a 2-process NCCL smoke run (``train quad-hover --nproc 2``); then, where LeRobot is installed (its
environment, ``scripts/setup_lerobot.sh``), ReinFlow and residual RL on a full-size SmolVLA
configuration (:data:`VLA_FINETUNES`, ``bench/smolvla_finetune.py``: env-steps/s, seconds per
update, peak memory; their time boxes are added to the budget); then writes ``bench_gpu.json`` and
``bench_gpu.md`` into ``--out``.

Every part runs as its own ``python -m embodied`` process with a time box (:data:`PARTS`,
:data:`TRAININGS`): a part that overruns gets SIGTERM (a training stops at its next step and
keeps what it logged), then SIGKILL, and the table records how far it got. The throughput parts
share the total budget (``--budget-s``, 480 s) minus the trainings' time boxes; a part that
would not start with 10 s left is skipped. A failing part is recorded with its error; the
others still run.

Without CUDA it refuses, unless ``--device cpu --quick``: tiny sizes and steps, a smoke check of
the script itself (the numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from embodied.config import ConfigError, float_in_range

log = logging.getLogger("embodied.bench_gpu")

BUDGET_S = 480.0
"""Default wall-clock budget of the whole command (8 minutes)."""

GRACE_S = 10.0
"""How long a part that overran its time box gets to stop after SIGTERM before SIGKILL."""


@dataclass(frozen=True)
class Part:
    """One ``embodied bench sim`` measurement: ``target`` at ``num_envs`` (GPU) or ``quick_envs``."""

    backend: str
    target: str
    num_envs: int
    quick_envs: int
    timeout_s: float
    steps: int = 100
    python: str = ""
    """Interpreter of the backend's own environment (e.g. ``.venv-isaaclab/bin/python``); empty:
    this one. The part counts as installed where that interpreter exists."""


ISAACLAB_PYTHON = ".venv-isaaclab/bin/python"
"""Isaac Lab 3 lives in its own environment (Python 3.12, scripts/setup_isaaclab.sh)."""


@dataclass(frozen=True)
class Training:
    """One short training run on ``task`` with its ``--preset`` (which sets the env count; under
    ``--quick`` ``quick_envs`` and the extra CLI words ``quick_args`` replace the sizes).

    ``on_bench_backend``: train on the backend the bench picked (MuJoCo-Warp, else MuJoCo); off
    for a task with its own simulator. ``evaluate``: keep the config's evaluations (the run
    stops once its success target holds), else one evaluation at the end.
    """

    algo: str
    task: str
    quick_envs: int
    timeout_s: float
    quick_args: tuple[str, ...] = ()
    preset: str = "gpu"
    on_bench_backend: bool = True
    evaluate: bool = False
    min_gpus: int = 1
    """GPUs the training needs (the NCCL smoke run takes 2; skipped where fewer exist)."""
    nproc: int = 1


PARTS: tuple[Part, ...] = (
    # eager: torch.compile's one-off warm-up (15-90 s) does not fit the time box
    Part("quadrotor", "quadrotor", 65536, 64, 40.0),
    Part("mujoco", "mujoco:go1-flat", 4096, 4, 40.0, steps=50),
    # MuJoCo-Warp compiles its kernels per model on the first run (cached afterwards, also for
    # the trainings that follow)
    Part("mjwarp", "mjwarp:go1-flat", 8192, 2, 60.0),
    Part("mjwarp", "mjwarp:humanoid", 8192, 2, 40.0),
    Part("maniskill", "maniskill:PushCube-v1", 1024, 2, 40.0, steps=50),
    # Newton's kernels compile on first use too (~4 min on a CPU; cached in warp's kernel cache)
    Part("isaaclab", "isaaclab:Isaac-Cartpole-Direct", 4096, 2, 45.0, steps=50, python=ISAACLAB_PYTHON),
)
"""Throughput parts, in order; a part whose backend is not installed is skipped."""

QUICK_EPISODES = ("env.backend.max_episode_steps=16", "trainer.eval_episodes=4")
"""``--quick``: short episodes, so the final evaluation is as small as the training (warp's CPU
device steps tens of env-steps per second)."""

FASTTD3_QUICK = (
    "algo.batch_size=32",
    "algo.learning_starts=8",
    "algo.buffer_size_per_env=64",
    "trainer.total_env_steps=64",
    *QUICK_EPISODES,
)

TRAININGS: tuple[Training, ...] = (
    # Issue 18's GPU target: >= 95 % hover success in <= 3 s of training at >= 1 M env steps/s.
    Training(
        "ppo",
        "quad-hover",
        64,
        45.0,
        quick_args=("trainer.total_env_steps=1024", "trainer.eval_episodes=4"),
        on_bench_backend=False,
        evaluate=True,
    ),
    # the legged trainings cannot finish in their boxes: they show how far a GPU gets in them
    Training(
        "ppo",
        "go1-flat",
        4,
        55.0,
        quick_args=("algo.num_steps_per_env=8", "trainer.total_env_steps=64", *QUICK_EPISODES),
    ),
    Training("fasttd3", "go1-flat", 4, 50.0, quick_args=FASTTD3_QUICK),
    Training("fasttd3", "humanoid", 2, 50.0, quick_args=FASTTD3_QUICK),
    # NCCL between two processes, one GPU each (embodied/distributed.py); skipped on one GPU
    Training(
        "ppo",
        "quad-hover",
        64,
        30.0,
        quick_args=("trainer.total_env_steps=1024", "trainer.eval_episodes=4"),
        on_bench_backend=False,
        min_gpus=2,
        nproc=2,
    ),
)
"""Short trainings after the throughput parts: PPO on quad-hover, PPO and FastTD3 on the legged
task, FastTD3 on the humanoid, each with its task's ``--preset gpu``; then the 2-GPU NCCL smoke run."""


@dataclass(frozen=True)
class VLAFinetune:
    """One run of ``bench/smolvla_finetune.py`` (a full-size SmolVLA; ``--size tiny`` under ``--quick``)."""

    algo: str
    timeout_s: float
    args: tuple[str, ...] = ()


VLA_FINETUNES: tuple[VLAFinetune, ...] = (
    # 4 envs x 2 chains of 50 actions: 400 env steps per update, two updates
    VLAFinetune("reinflow", 150.0, ("--num-envs", "4", "--chains", "2", "--updates", "2", "--micro-batch", "4")),
    # 4 envs x 100 steps with updates from the 50th
    VLAFinetune("residual", 120.0, ("--num-envs", "4", "--updates", "10")),
)
"""Fine-tuning of a pretrained VLA's size, run only where lerobot is importable."""

VLA_SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "smolvla_finetune.py"


@dataclass
class Outcome:
    """What one part or training produced; ``status`` is ok, timeout, failed or skipped."""

    name: str
    backend: str
    num_envs: int
    status: str = "skipped"
    seconds: float = 0.0
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags only ``bench gpu`` reads."""
    group = parser.add_argument_group("bench gpu")
    group.add_argument("--quick", action="store_true", help="gpu: tiny sizes (the only mode --device cpu accepts)")
    group.add_argument(
        "--out", type=Path, default=None, help="gpu: folder for bench_gpu.json/.md (default: runs/bench_gpu/<stamp>)"
    )
    group.add_argument(
        "--budget-s",
        type=float_in_range(1.0, 86_400, "s"),
        default=BUDGET_S,
        help=f"gpu: total time box in seconds (default: {BUDGET_S:.0f})",
    )
    group.add_argument(
        "--backends", default=None, help="gpu: comma-separated backends to measure (default: every installed one)"
    )


def check_device(device: str, quick: bool) -> None:
    """Refuse a run that would not measure a GPU: no CUDA, or the CPU without ``--quick``."""
    import torch

    kind = device.split(":")[0]
    if kind == "cpu" and not quick:
        raise ConfigError(
            "bench gpu measures GPU-scale batches and needs --device cuda; on a CPU only "
            "`embodied bench gpu --device cpu --quick` runs (tiny sizes: a check of the script, not a measurement)"
        )
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"bench gpu: CUDA is not available here (torch {torch.__version__}); run it on a machine with an "
            "NVIDIA GPU, or check the script with `embodied bench gpu --device cpu --quick`"
        )
    if kind not in ("cpu", "cuda"):
        raise ConfigError(f"bench gpu: --device must be cpu or cuda[:N], got {device!r}")


def _run(words: list[str], timeout_s: float, command: list[str] | None = None) -> tuple[str, str, float, str]:
    """Run ``python -m embodied WORDS`` (or ``command + WORDS``); ``(status, stdout, seconds, stderr tail)``."""
    start = time.perf_counter()
    argv = [*(command or [sys.executable, "-m", "embodied"]), *words]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    status = "ok"
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        status = "timeout"
        proc.send_signal(signal.SIGTERM)  # a training stops cleanly at its next step
        try:
            out, err = proc.communicate(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    if status == "ok" and proc.returncode != 0:
        status = "failed"
    return status, out, time.perf_counter() - start, err[-2000:]


def _last_line(text: str, default: str) -> str:
    """The last line of a process's stderr (its error message), or ``default`` when it printed none."""
    lines = text.strip().splitlines()
    return lines[-1] if lines else default


def _last_json(text: str) -> dict[str, Any]:
    """The JSON object the bench printed last (its stdout is that object, indented)."""
    start = text.rfind("\n{")
    data = json.loads(text[start + 1 :] if start >= 0 else text)
    return data[-1] if isinstance(data, list) else dict(data)


def _success_target(run_dir: Path) -> float | None:
    """``trainer.success_target`` of the run (its saved config), None if unset or not written."""
    from embodied.experiment import load_experiment
    from embodied.training.run import CONFIG_FILE

    path = run_dir / CONFIG_FILE
    return load_experiment(path).trainer.success_target if path.is_file() else None


def _preset_num_envs(training: Training) -> int:
    """The env count ``training``'s preset sets (its task's ``configs/<task>/<algo>.<preset>.yaml``)."""
    from embodied.commands.train import preset_file
    from embodied.experiment import resolve_experiment

    preset = preset_file(training.task, training.algo, training.preset)
    return resolve_experiment(training.task, training.algo, preset).num_envs


def _training_result(run_dir: Path) -> dict[str, Any]:
    """From metrics.jsonl: env steps reached, last logged training return, last evaluation, and
    the training time and env steps at the first evaluation that met the run's success target
    (``target_train_time_s``, ``target_env_steps``)."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    result: dict[str, Any] = {"env_steps": max((int(r.get("env_steps", 0)) for r in rows), default=0)}
    returns = [r for r in rows if "train/return" in r]
    if returns:
        result["last_train_return"] = float(returns[-1]["train/return"])
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    if evals:
        result.update({k: v for k, v in evals[-1].items() if k.startswith("eval/") or k == "train_time_s"})
    target = _success_target(run_dir)
    reached = [r for r in evals if target is not None and r.get("eval/success_rate", -1.0) >= target]
    if reached:
        result["target_train_time_s"] = float(reached[0]["eval/train_time_s"])
        result["target_env_steps"] = int(reached[0]["eval/env_steps"])
    return result


def _measure(outcome: Outcome, words: list[str], timeout_s: float, command: list[str] | None = None) -> None:
    """Run a measuring process (:func:`_run`) and record its JSON result or why it has none."""
    outcome.status, out, outcome.seconds, err = _run(words, timeout_s, command)
    if outcome.status == "ok":
        outcome.result = _last_json(out)
    elif outcome.status == "timeout":
        outcome.error = f"stopped after {timeout_s:.0f} s"
    else:
        outcome.error = _last_line(err, outcome.status)


MIN_BOX_S = 10.0
"""A part or training with less time than this left in the budget is skipped."""


def _time_box(outcome: Outcome, deadline: float, timeout_s: float) -> float | None:
    """The seconds ``outcome``'s run may take (its own box, cut to the budget left), or None
    after recording why it is skipped when less than :data:`MIN_BOX_S` is left."""
    box_s = min(timeout_s, deadline - time.perf_counter())
    if box_s < MIN_BOX_S:
        outcome.error = "time budget spent"
        return None
    return box_s


def run_parts(args: argparse.Namespace, device: str, deadline: float, backends: set[str]) -> list[Outcome]:
    """Throughput of every selected part; skips what is not installed or does not fit the budget."""
    outcomes = []
    for part in PARTS:
        n = part.quick_envs if args.quick else part.num_envs
        outcome = Outcome(part.target, part.backend, n)
        outcomes.append(outcome)
        if part.backend not in backends and not (part.python and _side_env_selected(part, args.backends)):
            outcome.error = "backend not installed or not selected"
            continue
        timeout_s = _time_box(outcome, deadline, part.timeout_s)
        if timeout_s is None:
            continue
        steps, repeats = (3, 1) if args.quick else (part.steps, 3)
        words = ["bench", "sim", part.target, "--num-envs", str(n), "--steps", str(steps)]
        words += ["--repeats", str(repeats), "--device", device, "--json"]
        if part.backend == "quadrotor":
            words.append("--no-compile")
        _measure(outcome, words, timeout_s, [part.python, "-m", "embodied"] if part.python else None)
        log.info("bench gpu: %s at %d envs: %s", part.target, n, outcome.status)
    return outcomes


def run_trainings(
    args: argparse.Namespace, device: str, deadline: float, backends: set[str], out: Path
) -> list[Outcome]:
    """The short trainings on MuJoCo-Warp when it is selected, else on the MuJoCo backend."""
    backend = "mjwarp" if "mjwarp" in backends else "mujoco"
    gpus = _gpu_count(device)
    outcomes = []
    for training in TRAININGS:
        n = training.quick_envs if args.quick else _preset_num_envs(training)
        train_backend = backend if training.on_bench_backend else None
        name = f"{training.algo} {training.task}" + (f" x{training.nproc} (NCCL)" if training.nproc > 1 else "")
        outcome = Outcome(name, train_backend or "own", n)
        outcomes.append(outcome)
        if training.min_gpus > 1 and gpus < training.min_gpus:
            outcome.error = f"needs {training.min_gpus} GPUs, {gpus} here"
            continue
        timeout_s = _time_box(outcome, deadline, training.timeout_s)
        if timeout_s is None:
            continue
        run_dir = out / (
            f"train_{training.algo}_{training.task}" + (f"_x{training.nproc}" if training.nproc > 1 else "")
        )
        words = ["train", training.task, "--algo", training.algo, "--preset", training.preset, "--device", device]
        words += ["--nproc", str(training.nproc)] if training.nproc > 1 else []
        words += ["--backend", train_backend] if train_backend else []
        words += ["--run-dir", str(run_dir), "--no-progress"]
        words += ["--num-envs", str(n), *training.quick_args] if args.quick else []
        words += [] if training.evaluate else ["trainer.eval_every_env_steps=0"]
        words += ["trainer.tensorboard=false"]
        outcome.status, _, outcome.seconds, err = _run(words, timeout_s)
        outcome.result = _training_result(run_dir)
        if outcome.status == "timeout" and outcome.result["env_steps"] > 0:
            outcome.status = "time-boxed"  # stopped by the time box after it logged progress
        elif outcome.status == "timeout":
            outcome.error = f"no progress logged in {timeout_s:.0f} s"
        elif outcome.status != "ok":
            outcome.error = _last_line(err, outcome.status)
        log.info("bench gpu: %s: %s", outcome.name, outcome.status)
    return outcomes


def lerobot_installed() -> bool:
    """Whether lerobot imports here (the VLA fine-tuning items need it)."""
    import importlib.util

    return importlib.util.find_spec("lerobot") is not None


def run_vla_finetunes(args: argparse.Namespace, device: str, deadline: float) -> list[Outcome]:
    """ReinFlow and residual on a SmolVLA (full size; tiny under ``--quick``), each in its time box."""
    outcomes = []
    for item in VLA_FINETUNES:
        outcome = Outcome(f"{item.algo} smolvla", "arm-push", int(item.args[1]) if not args.quick else 2)
        outcomes.append(outcome)
        if not lerobot_installed():
            outcome.error = "lerobot not installed (scripts/setup_lerobot.sh)"
            continue
        if not VLA_SCRIPT.is_file():
            outcome.error = f"{VLA_SCRIPT} not found (run from a source checkout)"
            continue
        timeout_s = _time_box(outcome, deadline, item.timeout_s)
        if timeout_s is None:
            continue
        words = ["--algo", item.algo, "--device", device]
        words += ["--size", "tiny", "--num-envs", "2", "--updates", "1"] if args.quick else list(item.args)
        _measure(outcome, words, timeout_s, [sys.executable, str(VLA_SCRIPT)])
        log.info("bench gpu: %s: %s", outcome.name, outcome.status)
    return outcomes


def _gpu_count(device: str) -> int:
    """CUDA devices visible (0 on a CPU run)."""
    import torch

    return torch.cuda.device_count() if device.startswith("cuda") else 0


def _side_env_selected(part: Part, selected: str | None) -> bool:
    """Whether a part that runs in its own environment is selected and that environment exists."""
    wanted = selected is None or part.backend in {s.strip() for s in selected.split(",")}
    return wanted and Path(part.python).is_file()


def machine(device: str) -> dict[str, str]:
    """The GPU (if used) and CPU this ran on."""
    import torch

    info = {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [
            line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")
        ]
        if names:
            info["cpu"] = f"{names[0]} x{len(names)}"
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    info["torch"] = torch.__version__
    return info


def _cell(result: dict[str, Any], key: str, spec: str) -> str:
    """``result[key]`` formatted with ``spec``; empty when the part did not produce it."""
    return format(result[key], spec) if key in result else ""


def _status(row: dict[str, Any]) -> str:
    return row["status"] + (f" ({row['error']})" if row["error"] else "")


def _table_row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown(report: dict[str, Any]) -> str:
    """The report as two markdown tables (throughput, training)."""
    lines = [
        f"# embodied bench gpu ({report['started']}, device {report['device']}{', quick' if report['quick'] else ''})",
        "",
        f"Machine: {', '.join(f'{k} {v}' for k, v in report['machine'].items())}. Total {report['total_s']:.0f} s.",
        "",
        "| bench | num_envs | status | env-steps/s | raw env-steps/s | ratio_vs_raw | seconds |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for row in report["throughput"]:
        r = row["result"]
        cells = [_cell(r, "steps_per_s", ",.0f"), _cell(r, "raw_steps_per_s", ",.0f"), _cell(r, "ratio_vs_raw", ".2f")]
        lines.append(_table_row([row["name"], row["num_envs"], _status(row), *cells, f"{row['seconds']:.0f}"]))
    lines += [
        "",
        "| training | backend | num_envs | status | env steps | last train return | last eval success "
        "| success target met at: training s | env steps | seconds |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["training"]:
        r = row["result"]
        cells = [_cell(r, "env_steps", ","), _cell(r, "last_train_return", ".2f"), _cell(r, "eval/success_rate", ".3f")]
        cells += [_cell(r, "target_train_time_s", ".2f"), _cell(r, "target_env_steps", ","), f"{row['seconds']:.0f}"]
        lines.append(_table_row([row["name"], row["backend"], row["num_envs"], _status(row), *cells]))
    lines += [
        "",
        "| VLA fine-tuning | num_envs | status | params M | trainable M | env-steps/s | s per update "
        "| peak GPU GiB | peak RSS GiB | seconds |",
        "|---|---:|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for row in report.get("vla", []):
        r = row["result"]
        rate = r.get("env_steps_per_s", r.get("env_steps_per_s_acting"))
        cells = [_cell(r, "params_m", ".1f"), _cell(r, "trainable_m", ".1f"), "" if rate is None else f"{rate:.2f}"]
        cells += [" ".join(str(v) for v in r.get("s_per_update", [])), _cell(r, "peak_cuda_gib", ".2f")]
        cells += [_cell(r, "peak_rss_gib", ".2f"), f"{row['seconds']:.0f}"]
        lines.append(_table_row([row["name"], row["num_envs"], _status(row), *cells]))
    return "\n".join(lines) + "\n"


def installed_backends(selected: str | None) -> set[str]:
    """Backends whose packages are importable, narrowed to ``selected`` (comma-separated) if given."""
    from embodied import registry

    names = {name for name, backend in registry.BACKENDS.items() if not backend.missing()}
    names -= {p.backend for p in PARTS if p.python}  # measured in their own environment
    if selected is None:
        return names
    wanted = {s.strip() for s in selected.split(",") if s.strip()}
    unknown = wanted - set(registry.BACKENDS)
    if unknown:
        raise ConfigError(f"bench gpu --backends: unknown {sorted(unknown)}; backends: {', '.join(registry.BACKENDS)}")
    return names & wanted


def run(args: argparse.Namespace) -> int:
    """``embodied bench gpu``: throughput parts, then trainings; writes the JSON and markdown report."""
    device = args.device or "cuda"
    check_device(device, args.quick)
    from embodied.sim.isaaclab import builtin_asset_root

    # Isaac Lab's Cartpole from the assets shipped here: a lent machine reaches no asset server
    os.environ.setdefault("ISAACSIM_ASSET_ROOT", str(builtin_asset_root()))
    backends = installed_backends(args.backends)
    started = datetime.now(timezone.utc)
    out: Path = args.out or Path("runs") / "bench_gpu" / started.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    deadline = start + args.budget_s - GRACE_S  # the last part's SIGTERM grace stays inside the budget
    # the trainings' time boxes are kept free of throughput parts that run long
    gpus = _gpu_count(device)
    reserved_s = sum(t.timeout_s for t in TRAININGS if t.min_gpus <= max(gpus, 1))
    throughput = run_parts(args, device, deadline - reserved_s, backends)
    training = run_trainings(args, device, deadline, backends, out)
    # the VLA items' boxes come on top of the budget, and only where LeRobot is installed
    vla_s = sum(v.timeout_s for v in VLA_FINETUNES) if lerobot_installed() else 0.0
    vla = run_vla_finetunes(args, device, max(deadline, time.perf_counter()) + vla_s)
    report = {
        "started": started.isoformat(timespec="seconds"),
        "device": device,
        "quick": bool(args.quick),
        "budget_s": args.budget_s,
        "total_s": time.perf_counter() - start,
        "machine": machine(device),
        "throughput": [asdict(o) for o in throughput],
        "training": [asdict(o) for o in training],
        "vla": [asdict(o) for o in vla],
    }
    (out / "bench_gpu.json").write_text(json.dumps(report, indent=1))
    (out / "bench_gpu.md").write_text(markdown(report))
    print(markdown(report), flush=True)
    print(out / "bench_gpu.json", flush=True)
    return 0
