"""Run a sweep's jobs: a local pool of processes pinned to cores, or tasks on a Ray cluster.

Every job is one ``embodied train`` process with its own run directory, so a sweep inherits
the trainer's guarantees: atomic checkpoints, Ctrl-C saves, and ``--resume``. Running the same
sweep again skips the runs that finished (``status/<run>.json`` with return code 0) and resumes
those that stopped with a checkpoint.

Why Ray: it is the established Python cluster engine (``ray start --head`` on one machine,
``ray start --address HEAD:6379`` on the others), schedules by declared resources
(``num_cpus``/``num_gpus`` per task), and a local instance starts from ``pip install ray`` alone,
which is how the tests run it. Each run is a Ray task rather than a Ray Tune trial because the
run already owns its checkpointing, resume and early stop; Tune's trial checkpoint/restore would
be a second copy of those. On a cluster ``--out`` must be on a file system every node sees (the
run directories are written by the node that runs them).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from embodied.errors import EmbodiedError
from embodied.sweeps.report import summarize_evals
from embodied.sweeps.spec import Job

log = logging.getLogger(__name__)

STATUS_DIR = "status"
RUNS_DIR = "runs"


def embodied_command() -> list[str]:
    """How to start the CLI in a child process: this interpreter, so the same install is used."""
    return [sys.executable, "-m", "embodied.cli"]


def run_dir_of(out_dir: Path, job: Job) -> Path:
    return out_dir / RUNS_DIR / job.run_name


def status_file(out_dir: Path, job: Job) -> Path:
    return out_dir / STATUS_DIR / f"{job.run_name}.json"


def finished_result(out_dir: Path, job: Job) -> dict[str, Any] | None:
    """The saved result of a job that already ended with return code 0, else None."""
    path = status_file(out_dir, job)
    if not path.is_file():
        return None
    try:
        result: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return result if result.get("returncode") == 0 else None


def job_argv(out_dir: Path, job: Job, threads: int) -> list[str]:
    """The ``embodied train`` command for ``job``: a fresh run, or ``--resume`` of a saved one."""
    run_dir = run_dir_of(out_dir, job)
    base = [*embodied_command(), "train"]
    if (run_dir / "ckpt").is_dir() and any((run_dir / "ckpt").iterdir()):
        return [*base, "--resume", str(run_dir), "--no-progress"]
    if run_dir.exists():
        # Stopped before its first checkpoint: nothing to resume. Kept aside, never deleted.
        aside = run_dir.with_name(f"{run_dir.name}.incomplete-{int(time.time())}")
        run_dir.rename(aside)
        log.warning("%s had no checkpoint; moved to %s and starting it again", run_dir, aside.name)
    # Evaluations stay in the run's own process: a background evaluator would use a core outside
    # the run's share (Ray places runs by --cores-per-run without pinning them).
    flags = ["--allow-unphysical"] if job.allow_unphysical else []
    if job.preset is not None:
        flags += ["--preset", job.preset]
    return [
        *base, job.task, "--algo", job.algo, "--seed", str(job.seed), "--run-dir", str(run_dir),
        "--no-progress", *flags, f"trainer.torch_threads={threads}", "trainer.background_eval=false",
        *job.overrides,
    ]  # fmt: skip


def execute_job(out_dir: Path, job: Job, threads: int, cores: Sequence[int] | None = None) -> dict[str, Any]:
    """Run ``job`` to the end (or its timeout) and return its result; also written to status/."""
    argv = job_argv(out_dir, job, threads)
    run_dir = run_dir_of(out_dir, job)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    pin: Callable[[], None] | None = None
    if cores:
        chosen = list(cores)

        def pin() -> None:
            os.sched_setaffinity(0, chosen)

    start = time.perf_counter()
    timed_out = False
    with open(out_dir / RUNS_DIR / f"{job.run_name}.log", "ab") as log_file:
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, env=env, preexec_fn=pin)
        try:
            proc.wait(timeout=job.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.terminate()  # SIGTERM: the trainer writes a checkpoint, a later sweep resumes it
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    result: dict[str, Any] = {
        "config": job.config,
        "seed": job.seed,
        "task": job.task,
        "algo": job.algo,
        "argv": argv,
        "returncode": proc.returncode,
        "timed_out": timed_out,
        "wall_s": round(time.perf_counter() - start, 3),
        "host": socket.gethostname(),
        "run_dir": str(run_dir),
        **summarize_evals(run_dir),
    }
    path = status_file(out_dir, job)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)
    return result


def run_local(out_dir: Path, jobs: Sequence[Job], workers: int, cores_per_run: int) -> list[dict[str, Any]]:
    """Run ``jobs`` here, at most ``workers`` at once, each pinned to its own ``cores_per_run`` cores."""
    available = sorted(os.sched_getaffinity(0))
    if workers * cores_per_run > len(available):
        raise EmbodiedError(
            f"--workers {workers} x --cores-per-run {cores_per_run} needs {workers * cores_per_run} cores; "
            f"this process may use {len(available)}"
        )
    slots = [available[i * cores_per_run : (i + 1) * cores_per_run] for i in range(workers)]
    results: dict[int, dict[str, Any]] = {}
    pending = list(enumerate(jobs))
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

    running: dict[Future[dict[str, Any]], tuple[int, int]] = {}
    free = list(range(workers))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        while pending or running:
            while pending and free:
                index, job = pending.pop(0)
                done = finished_result(out_dir, job)
                if done is not None:
                    log.info("%s: finished earlier, skipped", job.run_name)
                    results[index] = done
                    continue
                slot = free.pop(0)
                log.info("%s: started on cores %s", job.run_name, slots[slot])
                running[pool.submit(execute_job, out_dir, job, cores_per_run, slots[slot])] = (index, slot)
            if not running:
                continue
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                index, slot = running.pop(future)
                results[index] = future.result()
                free.append(slot)
                _log_end(results[index])
    return [results[i] for i in range(len(jobs))]


def run_ray(out_dir: Path, jobs: Sequence[Job], address: str | None, cores_per_run: int) -> list[dict[str, Any]]:
    """Run ``jobs`` as Ray tasks of ``cores_per_run`` CPUs each, on ``address`` or a local Ray."""
    try:
        import ray
    except ImportError:
        raise EmbodiedError('--engine ray needs Ray: pip install "embodied[sweep]" (or pip install ray)') from None
    ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        remote = ray.remote(num_cpus=cores_per_run)(execute_job)
        results: dict[int, dict[str, Any]] = {}
        refs = {}
        for index, job in enumerate(jobs):
            done = finished_result(out_dir, job)
            if done is not None:
                log.info("%s: finished earlier, skipped", job.run_name)
                results[index] = done
            else:
                refs[remote.remote(out_dir, job, cores_per_run)] = index
        waiting = list(refs)
        while waiting:
            ready, waiting = ray.wait(waiting, num_returns=1)
            for ref in ready:
                results[refs[ref]] = ray.get(ref)
                _log_end(results[refs[ref]])
        return [results[i] for i in range(len(jobs))]
    finally:
        if address is None:
            ray.shutdown()


def _log_end(result: dict[str, Any]) -> None:
    best = max((e["success_rate"] for e in result.get("evals", [])), default=float("nan"))
    log.info(
        "%s_s%s: exit %s after %.0f s on %s, best success %.3f%s",
        result["config"],
        result["seed"],
        result["returncode"],
        result["wall_s"],
        result["host"],
        best,
        " (timed out: resume by running the sweep again)" if result.get("timed_out") else "",
    )
