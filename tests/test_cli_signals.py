"""``embodied train`` under SIGTERM (``kill``, a scheduler's preemption): a checkpoint at the stop,
a clean exit, then a resume; and the deferral rules of ``embodied.stop``."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from signal_support import signal_handler

from embodied.cli import main
from embodied.stop import EXIT_TERMINATED, Terminated, deferred_stop
from embodied.training.run import load_checkpoint, read_metrics


def _logged_env_steps(run_dir: Path) -> int:
    """Largest ``env_steps`` logged so far (0 before the first row)."""
    if not (run_dir / "metrics.jsonl").exists():
        return 0
    return max((int(row["env_steps"]) for row in read_metrics(run_dir)), default=0)


def test_sigterm_writes_a_checkpoint_exits_cleanly_and_the_run_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # No periodic checkpoint: the only one can come from the stop itself.
    command = [
        sys.executable, "-m", "embodied.cli", "train", "quad-hover", "--preset", "nominal", "--run-dir", str(run_dir), "--no-progress",
        "trainer.total_env_steps=1000000000", "trainer.eval_every_env_steps=0",
        "trainer.checkpoint_every_updates=1000000000", "trainer.log_every_updates=1", "trainer.tensorboard=false",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # A hang guard, not a speed check: the first update normally lands within seconds.
    deadline = time.monotonic() + 600.0
    try:
        while _logged_env_steps(run_dir) == 0:
            assert proc.poll() is None, f"training exited before its first update: {proc.communicate()}"
            assert time.monotonic() < deadline, "hung: no update within 600 s"
            time.sleep(0.05)
        steps_at_signal = _logged_env_steps(run_dir)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=600)  # hang guard
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == EXIT_TERMINATED, stderr
    assert "terminated (SIGTERM)" in stderr
    assert "Traceback" not in stderr

    checkpoint_steps = load_checkpoint(run_dir)["trainer"]["env_steps"]
    assert checkpoint_steps >= steps_at_signal > 0
    target = checkpoint_steps + 8192
    assert main(["train", "--resume", str(run_dir), "--no-progress", f"trainer.total_env_steps={target}"]) == 0
    assert max(row["env_steps"] for row in read_metrics(run_dir)) >= target


def test_first_signal_is_recorded_second_raises_handlers_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with deferred_stop() as stop:
        signal.raise_signal(signal.SIGTERM)
        assert stop.signum == signal.SIGTERM
        with pytest.raises(Terminated):
            signal.raise_signal(signal.SIGTERM)
        with pytest.raises(Terminated):
            stop.raise_now()
    assert signal.getsignal(signal.SIGTERM) is before


def test_ignored_ctrl_c_stays_ignored() -> None:
    with signal_handler(signal.SIGINT, signal.SIG_IGN), deferred_stop() as stop:
        signal.raise_signal(signal.SIGINT)
        assert stop.signum is None
        stop.raise_now()  # nothing recorded: returns
