"""Pick this CPU's faster float32 tanh: ``torch.tanh`` or ``2 sigmoid(2x) - 1``.

Hidden-layer tanh is a large share of a small MLP's time on CPU, and which kernel is faster
depends on the machine: on an AMD EPYC the sigmoid form was several times faster, on an Intel
Xeon with AVX-512 ``torch.tanh`` was (docs/benchmarks/precision.md, "CPU tanh").
So the choice is measured once per process, at the first tanh of a CPU float32 tensor, and
logged; ``EMBODIED_CPU_TANH=tanh|sigmoid`` forces it (``auto``, the default, measures).

The two forms agree to ~1e-7 absolute; the sigmoid form is picked only when it is at least
twice as fast, so a noisy neighbour cannot flip the choice between runs on one machine (the
measured margins are wider than that on both CPUs).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

ENV_VAR = "EMBODIED_CPU_TANH"
"""Environment variable that forces the choice: ``tanh``, ``sigmoid`` or ``auto``."""
CHOICES = ("auto", "tanh", "sigmoid")
SIGMOID_SPEEDUP_REQUIRED = 2.0
"""The sigmoid form must be this many times faster than ``torch.tanh`` to be used."""


def tanh_from_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """``tanh(x) = 2 sigmoid(2x) - 1``, elementwise, any shape."""
    return torch.sigmoid(x * 2.0).mul_(2.0).sub_(1.0)


def _best_call_s(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, calls: int) -> float:
    """Seconds per call of ``fn(x)``: the fastest of ``calls`` single timed calls."""
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        fn(x)
        best = min(best, time.perf_counter() - start)
    return best


def measure_tanh_s(rows: int = 1024, width: int = 128, rounds: int = 5, calls: int = 8) -> tuple[float, float]:
    """``(torch.tanh, sigmoid form)`` seconds per call on a ``[rows, width]`` float32 tensor.

    The two are timed in alternating rounds (a neighbour's burst hits both) and each keeps its
    fastest call. The input is a fixed ramp, so the global random state is not touched."""
    x = torch.linspace(-4.0, 4.0, rows * width).reshape(rows, width)
    tanh_s = sigmoid_s = float("inf")
    for _ in range(rounds):
        tanh_s = min(tanh_s, _best_call_s(torch.tanh, x, calls))
        sigmoid_s = min(sigmoid_s, _best_call_s(tanh_from_sigmoid, x, calls))
    return tanh_s, sigmoid_s


@functools.cache
def use_sigmoid_tanh() -> bool:
    """Whether CPU float32 tanh goes through the sigmoid form in this process (decided once, logged).

    Raises ``ValueError`` naming :data:`ENV_VAR` when it holds something other than :data:`CHOICES`."""
    setting = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if setting not in CHOICES:
        raise ValueError(f"{ENV_VAR}={setting!r}: expected one of {', '.join(CHOICES)}")
    if setting != "auto":
        log.info(
            "%s=%s: CPU tanh via %s", ENV_VAR, setting, "2 sigmoid(2x) - 1" if setting == "sigmoid" else "torch.tanh"
        )
        return setting == "sigmoid"
    tanh_s, sigmoid_s = measure_tanh_s()
    chosen = sigmoid_s * SIGMOID_SPEEDUP_REQUIRED <= tanh_s
    log.info(
        "CPU tanh via %s (measured on [1024, 128] float32: torch.tanh %.0f us, 2 sigmoid(2x) - 1 %.0f us; %s=tanh|sigmoid forces it)",
        "2 sigmoid(2x) - 1" if chosen else "torch.tanh",
        tanh_s * 1e6,
        sigmoid_s * 1e6,
        ENV_VAR,
    )
    return chosen
