"""bfloat16 autocast against float32 for the layer sizes of the shipped off-policy configs.

Times one forward + backward of a 256-wide, 3-layer MLP at batch 256 (the SAC critic of the
MuJoCo configs) under float32 and under bf16 autocast, interleaved, and prints a JSON line with
the medians, their ratio and what ``algo.bf16=auto`` decides on this CPU::

    python bench/precision.py --repeats 200 --threads 1

Run it beside nothing else where possible; the ratio is what to compare between machines.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
from torch import nn

from embodied.precision import cpu_has_native_bf16


def _step(net: nn.Module, x: torch.Tensor, bf16: bool) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = net(x).float().square().mean()
    loss.backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=200, help="timed steps per precision")
    parser.add_argument("--batch", type=int, default=256, help="rows per step")
    parser.add_argument("--width", type=int, default=256, help="hidden units per layer")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    w = args.width
    net = nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 1))
    x = torch.randn(args.batch, w)
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for _ in range(10):  # warm-up: oneDNN picks its kernels on the first calls
        _step(net, x, False)
        _step(net, x, True)
    for _ in range(args.repeats):
        for name in ("fp32", "bf16"):
            start = time.perf_counter()
            _step(net, x, name == "bf16")
            times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(
        json.dumps(
            {
                "cpu": platform.processor() or platform.machine(),
                "native_bf16": cpu_has_native_bf16(),
                "fp32_ms_median": round(med["fp32"], 4),
                "bf16_ms_median": round(med["bf16"], 4),
                "bf16_over_fp32": round(med["bf16"] / med["fp32"], 3),
                "threads": args.threads,
                "batch": args.batch,
                "width": w,
            }
        )
    )


if __name__ == "__main__":
    main()
