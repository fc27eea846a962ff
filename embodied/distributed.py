"""Multi-process training through ``torch.distributed``: which process this is, and the few
collectives the trainer, the algorithms and the normalizer need.

A process belongs to a *world* when ``torchrun`` (or ``embodied train --nproc N``, which starts
``torch.distributed.run``) launched it with ``WORLD_SIZE > 1``. :func:`init_from_environment`
joins that world once; :func:`current` returns it afterwards, and ``None`` in a single process,
where nothing in this module runs (callers test ``current() is None`` and skip every collective).

Backend: gloo for CPU tensors, and NCCL for CUDA tensors where torch has it (one process group
``cpu:gloo,cuda:nccl``, so object collectives and CPU tensors keep working on a GPU machine).

Every collective here must be called by every rank in the same order; a rank that skips one
blocks the others until ``torchrun`` tears the world down (it does so when any rank fails).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from embodied.config import ConfigError
from embodied.errors import EmbodiedError

log = logging.getLogger(__name__)

T = TypeVar("T")

RANK_SEED_STRIDE = 10_000_019
"""Rank ``r`` seeds its envs and random draws with ``seed + r * RANK_SEED_STRIDE`` (rank 0 keeps
the run's seed); far apart from the evaluation seeds, which start at ``seed + 1_000_003``."""

DEFAULT_TIMEOUT_S = 1800.0
"""How long a collective waits for a missing rank before it fails (torch's own default)."""


@dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int
    """0 .. size-1; rank 0 owns the run directory, checkpoints, logs and evaluation."""
    size: int
    """Number of training processes (> 1: a single process has no World)."""
    local_rank: int
    """Index on this machine: the CUDA device the rank trains on."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_WORLD: World | None = None


def current() -> World | None:
    """The world this process joined, or ``None`` (a single process)."""
    return _WORLD


def is_main() -> bool:
    """True in a single process and on rank 0: the process that writes files and logs."""
    return _WORLD is None or _WORLD.rank == 0


def size() -> int:
    """Processes training together (1 without a world)."""
    return 1 if _WORLD is None else _WORLD.size


def launched_world_size() -> int:
    """``WORLD_SIZE`` that ``torchrun`` set for this process (1 when not launched by it)."""
    return _env_int("WORLD_SIZE", 1)


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise EmbodiedError(f"environment variable {name}={text!r} is not an integer (set by torchrun)") from None


def backend_name() -> str:
    """``cpu:gloo,cuda:nccl`` where CUDA and NCCL are present, else ``gloo``."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def init_from_environment(timeout_s: float = DEFAULT_TIMEOUT_S) -> World | None:
    """Join the world ``torchrun`` describes in ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (and
    ``MASTER_ADDR``/``MASTER_PORT``); ``None`` when ``WORLD_SIZE`` is 1 or unset."""
    global _WORLD
    if _WORLD is not None:
        return _WORLD
    world_size = launched_world_size()
    if world_size <= 1:
        return None
    if not dist.is_available():
        raise EmbodiedError(f"WORLD_SIZE={world_size}, but this torch build has no torch.distributed")
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    if torch.cuda.is_available() and local_rank < torch.cuda.device_count():
        torch.cuda.set_device(local_rank)  # NCCL and object collectives use the current device
    backend = backend_name()
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    _WORLD = World(rank=rank, size=world_size, local_rank=local_rank)
    log.info("joined the training world as rank %d of %d (backend %s)", rank, world_size, backend)
    return _WORLD


def shutdown(together: bool = True) -> None:
    """Leave the world. ``together``: every rank got here without an error and waits for the
    others first (a rank whose peers already closed their sockets aborts inside gloo)."""
    global _WORLD
    if dist.is_available() and dist.is_initialized():
        if together:
            dist.barrier()
        dist.destroy_process_group()
    _WORLD = None


# --------------------------------------------------------------------------- splitting the work


def rank_seed(seed: int) -> int:
    """This rank's seed: ``seed`` on rank 0 and in a single process (see :data:`RANK_SEED_STRIDE`)."""
    return seed if _WORLD is None else seed + _WORLD.rank * RANK_SEED_STRIDE


def split_evenly(total: int, key: str) -> int:
    """``total / size()``; a :class:`ConfigError` naming ``key`` when it does not divide evenly."""
    n = size()
    if total % n:
        raise ConfigError(
            f"{key}={total} does not split evenly over {n} training processes: "
            f"use a multiple of {n} (e.g. {key}={max(n, total - total % n)})"
        )
    return total // n


def rank_device(device: torch.device) -> torch.device:
    """The device this rank trains on: ``cuda:<LOCAL_RANK>`` for a CUDA run, else ``device``."""
    if _WORLD is None or device.type != "cuda":
        return device
    if _WORLD.local_rank >= torch.cuda.device_count():
        raise ConfigError(
            f"rank {_WORLD.rank} has LOCAL_RANK {_WORLD.local_rank}, but this machine has "
            f"{torch.cuda.device_count()} CUDA device(s): start at most that many processes per node"
        )
    return torch.device("cuda", _WORLD.local_rank)


# --------------------------------------------------------------------------- tensor collectives


def sum_(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all ranks in place (identity without a world); returns it."""
    if _WORLD is not None:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def average_(tensors: Sequence[torch.Tensor]) -> None:
    """Replace every tensor by its mean over the ranks, with one collective for all of them.

    All tensors share one dtype and device (gradients of float32 parameters, a KL scalar)."""
    if _WORLD is None or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= _WORLD.size
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


def average_gradients(params: Iterable[torch.Tensor]) -> None:
    """Average the ``.grad`` of ``params`` over the ranks (before any clipping, as one large batch
    would); parameters without a gradient are skipped on every rank alike."""
    average_([p.grad for p in params if p.grad is not None])


def broadcast_modules(modules: Iterable[nn.Module]) -> None:
    """Copy rank 0's parameters and buffers into every rank's ``modules`` (same structure)."""
    if _WORLD is None:
        return
    with torch.no_grad():
        for module in modules:
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)


def max_int(value: int) -> int:
    """The largest ``value`` over the ranks (e.g. a pending stop signal, 0 for none)."""
    if _WORLD is None:
        return value
    device = torch.device("cuda", torch.cuda.current_device()) if backend_name() != "gloo" else torch.device("cpu")
    flag = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


# --------------------------------------------------------------------------- object collectives


def broadcast_object(obj: T) -> T:
    """Rank 0's ``obj`` on every rank (pickled; for small things such as a path or a config)."""
    if _WORLD is None:
        return obj
    box: list[Any] = [obj]
    dist.broadcast_object_list(box, src=0)
    value: T = box[0]
    return value


def from_main(fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0 only and hand its result (or its error) to every rank.

    What only rank 0 may do (create the run directory, read a checkpoint, evaluate) goes through
    here, so a failure there stops every rank with the same message instead of leaving the
    others waiting in their next collective."""
    if _WORLD is None:
        return fn()
    if _WORLD.is_main:
        try:
            value = fn()
        except Exception as err:
            broadcast_object(("error", _portable_error(err)))
            raise
        broadcast_object(("ok", value))
        return value
    reply: tuple[str, Any] = broadcast_object(("", None))
    kind, payload = reply
    if kind == "error":
        raise payload
    result: T = payload
    return result


def _portable_error(err: Exception) -> Exception:
    """``err`` as other ranks re-raise it: the user-facing types keep their class."""
    message = f"(rank 0) {err}"
    if isinstance(err, ConfigError):
        return ConfigError(message)
    if isinstance(err, EmbodiedError):
        return EmbodiedError(message)
    if isinstance(err, OSError):
        return OSError(err.errno, f"(rank 0) {err.strerror or err}", err.filename)
    return EmbodiedError(f"(rank 0) {type(err).__name__}: {err}")


def gather_to_main(obj: T) -> list[T] | None:
    """Every rank's ``obj`` on rank 0 (a list in rank order), ``None`` on the others.

    Tensors travel pickled through the CPU: move CUDA tensors off the device first
    (:func:`to_cpu`)."""
    if _WORLD is None:
        return [obj]
    out: list[Any] | None = [None] * _WORLD.size if _WORLD.is_main else None
    dist.gather_object(obj, out, dst=0)
    return out


def scatter_from_main(objs: list[T] | None) -> T:
    """Rank ``r`` receives ``objs[r]`` of rank 0's list (the others pass ``None``)."""
    if _WORLD is None:
        assert objs is not None
        return objs[0]
    box: list[Any] = [None]
    dist.scatter_object_list(box, objs if _WORLD.is_main else None, src=0)
    value: T = box[0]
    return value


def to_cpu(obj: Any) -> Any:
    """A copy of nested dicts/lists/tuples with every tensor on the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_cpu(v) for v in obj)
    return obj
