"""The form of a checkpoint, checked before anything in it is restored.

A sealed checkpoint proves only that its bytes are the ones written (:mod:`embodied.checkpoint_seal`);
an edited file resealed, or one from another version or config, still has to be refused before a
tensor of the wrong shape or a string where a dict belongs reaches a ``load_state_dict``. The
expected form is what the run's config implies: the state a freshly built trainer, env and
algorithm would save (:func:`check_like`), plus the counters' own rules (:func:`check_trainer_entry`:
non-negative integers on the env-step grid). A mismatch is a :class:`CheckpointSchemaError`
naming the entry, the expected and the found form.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from embodied.training.run import WORLD_KEY, CheckpointError


class CheckpointSchemaError(CheckpointError):
    """A checkpoint entry has another type or shape than the run's config implies."""


MAX_LISTED_KEYS = 6
"""Keys named in a message about missing or unexpected entries."""


def form(value: Any) -> str:
    """A short description of ``value``'s type and shape, e.g. ``float32 tensor [8, 146]``."""
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')} tensor {list(value.shape)}"
    if isinstance(value, Mapping):
        keys = sorted(map(str, value))
        shown = ", ".join(keys[:MAX_LISTED_KEYS]) + (", ..." if len(keys) > MAX_LISTED_KEYS else "")
        return f"a mapping with keys [{shown}]" if keys else "an empty mapping"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"a number ({value!r})" if len(repr(value)) <= 24 else "a number"
    text = repr(value)
    return f"a {type(value).__name__} ({text[:40]}{'...' if len(text) > 40 else ''})"


def _keys(names: Any) -> str:
    listed = sorted(map(str, names))
    return ", ".join(listed[:MAX_LISTED_KEYS]) + (", ..." if len(listed) > MAX_LISTED_KEYS else "")


def _fail(path: Path, where: str, expected: str, found: Any) -> CheckpointSchemaError:
    return CheckpointSchemaError(
        f"{path}: entry {where!r} should be {expected}, found {form(found)}; "
        "the checkpoint does not fit the run's config.yaml (edited, or written by another version)"
    )


def check_like(found: Any, expected: Any, where: str, path: Path) -> None:
    """Raise :class:`CheckpointSchemaError` unless ``found`` has the form of ``expected``.

    Tensors match in dtype and shape (:func:`_fits`); mappings in their keys, recursively; lists of the same
    length element by element; numbers, strings and booleans in kind. An empty mapping or list
    expected (an optimizer's state before its first step, the evaluations so far) or ``None``
    (an optional value) takes any plain data of that kind (tensors, numbers, text, lists,
    mappings)."""
    if isinstance(expected, torch.Tensor):
        if not (
            isinstance(found, torch.Tensor) and found.dtype == expected.dtype and _fits(found.shape, expected.shape)
        ):
            raise _fail(path, where, form(expected), found)
    elif isinstance(expected, Mapping):
        if not isinstance(found, Mapping):
            raise _fail(path, where, form(expected), found)
        if not expected:
            _check_plain(found, where, path)
            return
        missing, extra = expected.keys() - found.keys(), found.keys() - expected.keys()
        if missing or extra:
            what = (f"missing {_keys(missing)}" if missing else "") + ("; " if missing and extra else "")
            what += f"unexpected {_keys(extra)}" if extra else ""
            raise _fail(path, where, f"{form(expected)} ({what})", found)
        for key, value in expected.items():
            check_like(found[key], value, f"{where}.{key}", path)
    elif isinstance(expected, list | tuple):
        if not isinstance(found, list | tuple):
            raise _fail(path, where, form(expected), found)
        if not expected:
            _check_plain(found, where, path)
        elif len(found) != len(expected):
            raise _fail(path, where, form(expected), found)
        else:
            for i, (item, want) in enumerate(zip(found, expected, strict=True)):
                check_like(item, want, f"{where}[{i}]", path)
    elif expected is None:
        _check_plain(found, where, path)
    elif isinstance(expected, bool):
        if not isinstance(found, bool):
            raise _fail(path, where, "a boolean", found)
    elif isinstance(expected, int | float):
        if isinstance(found, bool) or not isinstance(found, int | float):
            raise _fail(path, where, "a number", found)
        if isinstance(expected, int) and not isinstance(found, int):
            raise _fail(path, where, "an integer", found)
    elif isinstance(expected, str):
        if not isinstance(found, str):
            raise _fail(path, where, "text", found)
    else:
        _check_plain(found, where, path)


def _fits(found: torch.Size, expected: torch.Size) -> bool:
    """Equal shapes; an expected first size of 0 (storage that fills as the run goes, e.g. a
    replay buffer's rows so far) takes any first size."""
    if expected and expected[0] == 0:
        return len(found) == len(expected) and found[1:] == expected[1:]
    return found == expected


def _check_plain(found: Any, where: str, path: Path) -> None:
    """Only data ``weights_only`` loads can hold: tensors, numbers, text, lists, mappings."""
    if found is None or isinstance(found, torch.Tensor | bool | int | float | str | bytes):
        return
    if isinstance(found, Mapping):
        for key, value in found.items():
            _check_plain(value, f"{where}.{key}", path)
    elif isinstance(found, list | tuple):
        for i, value in enumerate(found):
            _check_plain(value, f"{where}[{i}]", path)
    else:
        raise _fail(path, where, "tensors, numbers, text, lists or mappings", found)


def _count(value: Any, where: str, path: Path, grid: int = 1, optional: bool = False) -> None:
    """A non-negative integer, a multiple of ``grid`` (``None`` allowed where ``optional``)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(path, where, "a non-negative integer" + (" or null" if optional else ""), value)
    if value % grid:
        raise _fail(path, where, f"a multiple of {grid} (the env steps of one step of all envs)", value)


def _seconds(value: Any, where: str, path: Path, optional: bool = False) -> None:
    """A finite non-negative number of seconds (``None`` allowed where ``optional``)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise _fail(path, where, "a finite non-negative number of seconds" + (" or null" if optional else ""), value)


TRAINER_KEYS = (
    "env_steps",
    "updates",
    "train_time_s",
    "eval_time_s",
    "evals",
    "time_to_target_s",
    "env_steps_to_target",
)
"""Entries every checkpoint's ``trainer`` mapping has (``metrics_rows``, ``pending_eval``: later ones)."""


def check_trainer_entry(
    trainer: Any, path: Path, grid: int, policy_form: Mapping[str, torch.Tensor] | None = None
) -> None:
    """Check the ``trainer`` entry: counters non-negative integers, ``env_steps`` (and the
    step counts of the target and of a snapshot in flight) multiples of ``grid`` (the env steps
    one step of all envs adds: ``num_envs``), times finite and non-negative, evaluations rows of
    numbers, and a snapshot in flight holding a state dict of the form ``policy_form``."""
    if not isinstance(trainer, Mapping):
        raise _fail(path, "trainer", "a mapping of counters", trainer)
    missing = [k for k in TRAINER_KEYS if k not in trainer]
    if missing:
        raise _fail(path, "trainer", f"a mapping of counters (missing {_keys(missing)})", trainer)
    _count(trainer["env_steps"], "trainer.env_steps", path, grid)
    _count(trainer["updates"], "trainer.updates", path)
    _seconds(trainer["train_time_s"], "trainer.train_time_s", path)
    _seconds(trainer["eval_time_s"], "trainer.eval_time_s", path)
    _seconds(trainer["time_to_target_s"], "trainer.time_to_target_s", path, optional=True)
    _count(trainer["env_steps_to_target"], "trainer.env_steps_to_target", path, grid, optional=True)
    _count(trainer.get("metrics_rows", 0), "trainer.metrics_rows", path)
    evals = trainer["evals"]
    if not isinstance(evals, list | tuple):
        raise _fail(path, "trainer.evals", "a list of evaluation rows", evals)
    for i, row in enumerate(evals):
        if not (
            isinstance(row, Mapping)
            and all(
                isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) for k, v in row.items()
            )
        ):
            raise _fail(path, f"trainer.evals[{i}]", "a mapping of metric names to numbers", row)
    pending = trainer.get("pending_eval")
    if pending is None:
        return
    if not isinstance(pending, Mapping) or set(pending) != {"env_steps", "train_time_s", "seed", "policy_state"}:
        raise _fail(
            path, "trainer.pending_eval", "null or a mapping of env_steps, train_time_s, seed, policy_state", pending
        )
    _count(pending["env_steps"], "trainer.pending_eval.env_steps", path, grid)
    if pending["env_steps"] > trainer["env_steps"]:
        raise _fail(
            path,
            "trainer.pending_eval.env_steps",
            f"at most trainer.env_steps ({trainer['env_steps']})",
            pending["env_steps"],
        )
    _seconds(pending["train_time_s"], "trainer.pending_eval.train_time_s", path)
    _count(pending["seed"], "trainer.pending_eval.seed", path)
    if policy_form is None:
        _check_plain(pending["policy_state"], "trainer.pending_eval.policy_state", path)
    else:
        check_like(pending["policy_state"], dict(policy_form), "trainer.pending_eval.policy_state", path)


def check_world_entry(ckpt: Mapping[str, Any], path: Path) -> int:
    """The number of training processes that wrote ``ckpt``, its ``world`` entry checked."""
    world = ckpt.get(WORLD_KEY)
    if world is None:
        return 1
    if not isinstance(world, Mapping) or not isinstance(world.get("size"), int) or isinstance(world["size"], bool):
        raise _fail(path, WORLD_KEY, "a mapping with an integer size and a list of ranks", world)
    size, ranks = world["size"], world.get("ranks")
    if size < 2 or not isinstance(ranks, list | tuple) or len(ranks) != size - 1:
        raise _fail(path, WORLD_KEY, f"a size of 2 or more and size - 1 rank states (size {size})", ranks)
    for i, rank in enumerate(ranks, start=1):
        if not isinstance(rank, Mapping):
            raise _fail(path, f"{WORLD_KEY}.ranks[{i - 1}]", f"the state of rank {i} (a mapping)", rank)
    return size


def check_restorable(
    ckpt: Mapping[str, Any],
    expected: Mapping[str, Any],
    path: Path,
    grid: int,
    policy_form: Mapping[str, torch.Tensor] | None,
) -> None:
    """Check a whole checkpoint (one rank's part) against ``expected``, the state a freshly built
    trainer of the run's config would save: every entry's type and shape, the counters' rules."""
    missing = [k for k in expected if k not in ckpt]
    if missing:
        raise CheckpointSchemaError(
            f"{path}: entry {missing[0]!r} is missing (a checkpoint holds {_keys(expected)}); "
            "the file is not a checkpoint of this run"
        )
    check_trainer_entry(ckpt["trainer"], path, grid, policy_form)
    # the observations first: their shapes say most plainly which env.* setting differs
    for key in sorted(expected, key=lambda k: k != "obs"):
        if key != "trainer":
            check_like(ckpt[key], expected[key], key, path)
