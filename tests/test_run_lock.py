"""One writer per run directory: the lock, its stale-lock takeover, and race-free run-dir creation."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from embodied.errors import EmbodiedError
from embodied.experiment import resolve_experiment
from embodied.training.run import new_run_dir, read_metrics
from embodied.training.run_lock import LOCK_FILE, RunLock, RunLockedError


def test_a_second_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    with RunLock(tmp_path):
        assert (tmp_path / LOCK_FILE).read_text().startswith(f"pid {os.getpid()} host ")
        with pytest.raises(RunLockedError, match=rf"in use by another process \(pid {os.getpid()} host"):
            RunLock(tmp_path).acquire()
    assert (tmp_path / LOCK_FILE).read_text() == "", "a clean release empties the lock file"
    with RunLock(tmp_path):
        pass


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # What a SIGKILLed holder leaves: its pid in the file, but the kernel dropped the flock.
    (tmp_path / LOCK_FILE).write_text("pid 4000001 host elsewhere\n")
    with caplog.at_level(logging.WARNING), RunLock(tmp_path):
        pass
    assert "took over a stale lock of pid 4000001 host elsewhere" in caplog.text


def test_simultaneous_run_dirs_never_collide(tmp_path: Path) -> None:
    cfg = resolve_experiment("quad-hover")
    made: list[Path] = []
    errors: list[BaseException] = []

    def create() -> None:
        try:
            made.append(new_run_dir(tmp_path, cfg))
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=create) for _ in range(90)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(made)) == 90


def test_a_run_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    from embodied.training.run import make_run_dir

    (tmp_path / "afile").write_text("x")
    with pytest.raises(EmbodiedError, match="afile: exists and is not a directory"):
        make_run_dir(tmp_path / "afile")


def test_two_trains_into_one_run_dir_one_wins(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "embodied.cli", "train", "quad-hover", "--preset", "nominal", "--run-dir", str(run_dir), "--no-progress",
        "num_envs=8", "algo.num_steps_per_env=8", "trainer.total_env_steps=256", "trainer.eval_episodes=4",
        "trainer.tensorboard=false",
    ]  # fmt: skip
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.communicate()[1]) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "Traceback" not in loser
    assert "in use by another process" in loser or "already holds a run" in loser, loser
    rows = read_metrics(run_dir)
    steps = [row["env_steps"] for row in rows]
    assert steps == sorted(steps), "one writer: rows in order"
    assert len({json.dumps(row, sort_keys=True) for row in rows}) == len(rows), "no row written twice"
