"""A canonical SHA-256 of a checkpoint's contents (tensors, numbers, strings, nested containers).

torch does not check the CRC of the ZIP members it reads, so a flipped bit in ``latest.pt``
would otherwise load silently as a different weight. The hash is taken over the in-memory
state, not the file bytes, so it does not depend on torch's serialization details and is the
same after a load onto another device.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import torch

INTEGRITY_KEY = "integrity"
"""Top-level checkpoint entry ``{"sha256": hex}`` (excluded from the hash itself)."""


def state_sha256(state: dict[str, Any]) -> str:
    """Hex SHA-256 of ``state`` without its :data:`INTEGRITY_KEY` entry.

    Tensors contribute dtype, shape and raw bytes (CPU, contiguous); mappings are walked in
    sorted key order; lists and tuples alike (a round trip may turn one into the other).
    """
    digest = hashlib.sha256()
    _update(digest, {k: v for k, v in state.items() if k != INTEGRITY_KEY})
    return digest.hexdigest()


def _update(digest: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        tensor = obj.detach().cpu().contiguous()
        digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
        if tensor.numel():
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, dict):
        digest.update(f"D{len(obj)}".encode())
        for key in sorted(obj, key=repr):
            _update(digest, key)
            _update(digest, obj[key])
    elif isinstance(obj, list | tuple):
        digest.update(f"L{len(obj)}".encode())
        for item in obj:
            _update(digest, item)
    elif isinstance(obj, float):
        digest.update(b"F" + struct.pack("<d", obj))
    elif isinstance(obj, bool | int | str | bytes | type(None) | torch.dtype | torch.device | torch.Size):
        digest.update(f"{type(obj).__name__}:{obj!r};".encode())
    else:
        raise TypeError(f"checkpoint entry of type {type(obj).__name__} cannot be hashed")
