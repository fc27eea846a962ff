"""``embodied train`` under SIGTERM (``kill``, a scheduler's preemption): a clean exit, then a resume."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from embodied.cli import EXIT_TERMINATED, main
from embodied.run import read_metrics


def test_sigterm_exits_cleanly_and_the_run_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "embodied.cli", "train", "quad-hover", "--run-dir", str(run_dir), "--no-progress",
        "trainer.total_env_steps=1000000000", "trainer.eval_every_env_steps=0",
        "trainer.checkpoint_every_updates=1", "trainer.log_every_updates=1", "trainer.tensorboard=false",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    checkpoint = run_dir / "ckpt" / "latest.pt"
    deadline = time.monotonic() + 120.0
    try:
        while not checkpoint.exists():
            assert proc.poll() is None, f"training exited before its first checkpoint: {proc.communicate()}"
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == EXIT_TERMINATED, stderr
    assert "terminated (SIGTERM)" in stderr
    assert "Traceback" not in stderr

    steps_before = max(row["env_steps"] for row in read_metrics(run_dir))
    target = steps_before + 8192
    assert main(["train", "--resume", str(run_dir), "--no-progress", f"trainer.total_env_steps={target}"]) == 0
    assert max(row["env_steps"] for row in read_metrics(run_dir)) >= target
