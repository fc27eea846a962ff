"""Loop-thread scheduling helpers and the real-time signal thread of `embodied deploy`."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

from embodied.real.realtime import set_realtime_priority, tune_loop_thread

WATCHER = """
import os, signal, sys, threading, time
from embodied.real.realtime import SignalWatcher

watcher = SignalWatcher((signal.SIGTERM, signal.SIGINT), 0)
started = threading.Thread(target=time.sleep, args=(60,), daemon=True)  # the kernel may pick it
started.start()
done = threading.Event()

def handler(name):
    print("handled", name, threading.current_thread().name, flush=True)
    done.set()

if sys.argv[1] == "late":
    os.kill(os.getpid(), signal.SIGTERM)  # before any handler: kept, handled once one is set
    time.sleep(0.2)
watcher.set_handler(handler)
print("ready", flush=True)
done.wait(30)
watcher.close()
"""


def _run_watcher(mode: str) -> str:
    proc = subprocess.Popen(
        [sys.executable, "-c", WATCHER, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if mode == "now":
        assert line.strip() == "ready", proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGTERM)
        line = proc.stdout.readline()
    else:
        line = proc.stdout.readline() if line.strip() == "ready" else line
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return line + out


def test_signal_watcher_handles_sigterm_on_its_own_thread() -> None:
    assert "handled SIGTERM signals" in _run_watcher("now")


def test_signal_watcher_keeps_a_signal_that_came_before_the_handler() -> None:
    # Handled where the handler is set (it was not there when the signal came).
    assert "handled SIGTERM MainThread" in _run_watcher("late")


def test_thread_tuning_reports_what_it_got() -> None:
    assert set_realtime_priority(0) is False
    result: list[str] = []
    worker = threading.Thread(target=lambda: result.append(tune_loop_thread(0)))
    worker.start()
    worker.join()
    assert result and result[0].startswith("normal")


HUNG_TEARDOWN = """
import threading
from embodied.real.realtime import arm_exit_guard

arm_exit_guard(0.5)
stuck = threading.Lock()
stuck.acquire()
print("armed", flush=True)
stuck.acquire()  # a teardown that never returns (holding the interpreter in a wait)
"""


def test_exit_guard_ends_a_hung_teardown_and_says_where() -> None:
    proc = subprocess.run([sys.executable, "-c", HUNG_TEARDOWN], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "armed"
    assert proc.returncode == 1
    assert "most recent call first" in proc.stderr and 'File "<string>", line 9' in proc.stderr
