"""Pick the matmul precision for this machine: bfloat16 autocast only where it is native.

bfloat16 autocast pays off on CUDA GPUs with bf16 support and on CPUs with native bf16 matmuls
(AVX-512 BF16 or AMX tiles). Elsewhere (AVX2-only CPUs such as most laptops and many AMD EPYC
servers) the CPU emulates it, many times slower than float32 (docs/benchmarks/precision.md,
"Precision"). So configs ask for ``"auto"`` and this module
decides once per run, from the device, and logs the decision with its reason.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch

log = logging.getLogger(__name__)

Bf16Setting = bool | Literal["auto"]
"""``true``/``false`` force bfloat16 autocast on or off; ``"auto"`` picks it per machine."""


def cpu_has_native_bf16() -> bool:
    """Whether this CPU runs bfloat16 matmuls natively (AVX-512 BF16 or AMX tiles).

    torch exposes the check only privately; a torch without it counts as "unknown" (True), so
    the caller does not warn on a guess."""
    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    known = [check for check in checks if callable(check)]
    return not known or any(bool(check()) for check in known)


def device_has_native_bf16(device: torch.device) -> bool:
    """Native bfloat16 matmuls on ``device`` (CPU: AVX-512 BF16/AMX; CUDA: compute capability 8+)."""
    if device.type == "cpu":
        return cpu_has_native_bf16()
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    return False


def resolve_bf16(setting: Bf16Setting, device: torch.device, key: str = "algo.bf16") -> bool:
    """The bf16 autocast decision for ``setting`` on ``device``, logged once with its reason.

    ``"auto"`` enables it exactly where the device computes bf16 natively; an explicit ``True``
    on a CPU without native support is honoured with a warning (it will be slower)."""
    native = device_has_native_bf16(device)
    where = "CPU with AVX-512 BF16/AMX" if device.type == "cpu" and native else device.type
    if setting == "auto":
        if native:
            log.info("%s=auto: bfloat16 autocast on (%s has native bf16 matmuls)", key, where)
        else:
            log.info("%s=auto: float32 (%s has no native bf16 matmuls; bf16 would be emulated)", key, device.type)
        return native
    if setting and device.type == "cpu" and not native:
        log.warning(
            "%s=true on a CPU without native bfloat16 matmuls (AVX-512 BF16 or AMX): the gradient "
            "steps will be slower than float32; set %s=auto or false",
            key,
            key,
        )
    return bool(setting)
