"""A seeded fuzzer for the ``embodied`` command line, run in-process (``embodied.cli.main``).

Each case is a malformed or absurd input: a ``key=value`` override, a ``--config`` file, a
flag value, or a damaged file of a trained run directory (``ckpt/latest.pt``, ``config.yaml``,
``metrics.jsonl``, ``export/policy.onnx``, ``export/policy_io.json``). A case passes when the
command

- exits 0 or 2 (never a traceback, never another code),
- finishes within a time bound,
- on exit 2 prints exactly one error line that names the key, flag or file at fault,
- exits 2 whenever the case is marked ``must_reject`` (a damaged checkpoint or ONNX file, a
  NaN, an out-of-range value, text that is not UTF-8, a truncated saved config), and
- exits 0 on a changed ``policy.onnx`` only when onnxruntime computes the same actions from
  it as from the original (an independent check that the change was harmless).

Inputs that stay well-formed (a bit flip that turns ``15.0`` into ``15.1`` in ``config.yaml``,
a digit changed in a metrics row) are edits that no reader can tell from intent; those cases
may exit 0 and are counted apart as ``accepted_edit``.

Further families: ``physical`` (a value outside a field's plausible range, some of them in a
real training run: exit 0 is a silent acceptance of physics that must not train), ``number``
(hex, octal, ``1_000``, ``1:30``, YAML 1.1 booleans, thousands of digits), ``bounds`` (config
files too large, too deep, with aliases or ``!!python`` tags), and ``checkpoint`` (a sealed
checkpoint of the wrong form, or with a pickled payload in any entry). A payload creates a
marker file when unpickled: a marker that appears is the ``code_execution`` failure, whatever
the exit code.

``tests/test_fuzz_cli.py`` runs a few hundred cases; ``bench/fuzz_campaign.py`` runs 10,000+.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import torch
import yaml

from embodied.checkpoint_seal import seal
from embodied.cli import main

CASE_TIMEOUT_S = 60.0
"""A case running longer than this counts as a hang (loaded 2-core machines included)."""

TINY_RUN = [
    "train", "quad-hover", "--preset", "nominal", "--no-progress", "num_envs=8", "algo.num_steps_per_env=8",
    "trainer.total_env_steps=128", "trainer.eval_episodes=4", "trainer.tensorboard=false",
]  # fmt: skip
"""A run of two PPO updates (a few seconds): the base every run-directory case damages a copy of."""

RUN_FILES = {
    "latest.pt": "ckpt/latest.pt",
    "config.yaml": "config.yaml",
    "metrics.jsonl": "metrics.jsonl",
    "policy.onnx": "export/policy.onnx",
    "policy_io.json": "export/policy_io.json",
}


@dataclass
class Case:
    """One fuzz input: ``argv`` with ``{run}`` (a fresh copy of the base run) and ``{dir}``
    (the case's own folder) placeholders, and files ``setup`` writes before it runs."""

    family: str
    argv: list[str]
    must_reject: bool
    names: tuple[str, ...]
    """At least one must appear in the error line (the key, flag or file at fault)."""
    setup: Callable[[Path], None] | None = None
    needs_run: bool = False
    onnx_oracle: bool = False
    """On exit 0, check that the (changed) policy.onnx computes what the original did."""
    marker: str | None = None
    """A file (``{dir}`` placeholder) that a payload creates if it runs: ``code_execution``."""


@dataclass
class Outcome:
    case: Case
    rc: int | None
    errors: str
    verdict: str
    """``rejected``, ``accepted``, ``accepted_edit``, or a failure: ``traceback``, ``hang``,
    ``bad_exit``, ``silent_acceptance``, ``multiline_error``, ``unnamed_error``, ``code_execution``."""
    detail: str = ""
    seconds: float = 0.0


FAILURES = (
    "traceback", "hang", "bad_exit", "silent_acceptance", "multiline_error", "unnamed_error", "code_execution",
)  # fmt: skip


class _Hang(BaseException):
    """Raised by the alarm when a case runs past :data:`CASE_TIMEOUT_S`."""


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


# ----------------------------------------------------------------------------- byte mutations
def _flip(data: bytes, rng: np.random.Generator) -> bytes:
    out = bytearray(data)
    for _ in range(int(rng.integers(1, 9))):
        i = int(rng.integers(0, len(out)))
        out[i] ^= 1 << int(rng.integers(0, 8))
    return bytes(out)


def _truncate(data: bytes, rng: np.random.Generator) -> bytes:
    return data[: int(rng.integers(0, len(data)))]


def _zero(data: bytes, rng: np.random.Generator) -> bytes:
    start = int(rng.integers(0, len(data)))
    length = int(rng.integers(1, 257))
    return data[:start] + bytes(min(length, len(data) - start)) + data[start + length :]


def _random_bytes(data: bytes, rng: np.random.Generator) -> bytes:
    return rng.bytes(int(rng.integers(0, max(2, len(data)))))


def _append(data: bytes, rng: np.random.Generator) -> bytes:
    return data + rng.bytes(int(rng.integers(1, 64)))


def _latin1(data: bytes, rng: np.random.Generator) -> bytes:
    """One Latin-1 byte (``é`` as 0xE9) dropped into the text, e.g. in a comment."""
    i = int(rng.integers(0, len(data) + 1))
    return data[:i] + b"\xe9" + data[i:]


def _utf16(data: bytes, rng: np.random.Generator) -> bytes:
    return data.decode("utf-8", "replace").encode("utf-16")


BYTE_MUTATIONS: dict[str, Callable[[bytes, np.random.Generator], bytes]] = {
    "bitflip": _flip,
    "truncate": _truncate,
    "zero": _zero,
    "random": _random_bytes,
    "append": _append,
    "latin1": _latin1,
    "utf16": _utf16,
}
OTHER_MUTATIONS = ("swap", "delete", "directory")

STRUCTURAL = {"truncate", "zero", "random", "latin1", "utf16", "swap", "delete", "directory"}
"""Mutations that leave no well-formed file behind."""


def _same_yaml(a: bytes, b: bytes) -> bool:
    """Whether two YAML texts load to equal data."""
    try:
        return bool(yaml.safe_load(a) == yaml.safe_load(b))
    except (yaml.YAMLError, UnicodeDecodeError):
        return False


def _file_case(rng: np.random.Generator, base_files: dict[str, bytes]) -> Case:
    name = str(rng.choice(list(RUN_FILES)))
    mutation = str(rng.choice([*BYTE_MUTATIONS, *OTHER_MUTATIONS]))
    rel = RUN_FILES[name]
    original = base_files[name]
    content: bytes | None = None
    if mutation in BYTE_MUTATIONS:
        content = BYTE_MUTATIONS[mutation](original, rng)
        for _ in range(8):  # a mutation that happens to change nothing is no test
            if content != original:
                break
            content = BYTE_MUTATIONS[mutation](original, rng)
        if content == original:
            content = original + b"\n#"
    elif mutation == "swap":
        other = str(rng.choice([n for n in RUN_FILES if n != name]))
        content = base_files[other]
    seed = int(rng.integers(0, 2**31 - 1))

    def setup(case_dir: Path) -> None:
        path = case_dir / "run" / rel
        if mutation == "delete":
            path.unlink()
        elif mutation == "directory":
            path.unlink()
            path.mkdir()
        else:
            assert content is not None
            path.write_bytes(content)

    if name == "latest.pt":
        command = [
            ["eval", "{run}", "--episodes", "2"],
            ["export", "{run}", "--format", "onnx", "--no-record"],
            ["train", "--resume", "{run}"],
            ["play", "{run}", "--video", "{dir}/v.mp4"],
        ][int(rng.integers(0, 4))]
    elif name == "config.yaml":
        command = [
            ["eval", "{run}", "--episodes", "2", "--seed", str(seed)],
            ["train", "--resume", "{run}"],
            ["train", "--resume", "{run}", "--print-config"],
        ][int(rng.integers(0, 3))]
    elif name == "metrics.jsonl":
        command = ["train", "--resume", "{run}"]
    else:
        command = ["eval", "{run}", "--episodes", "2", "--policy", "onnx"]
    if name == "metrics.jsonl":
        must = mutation in {"latin1", "utf16", "directory"}
    elif name == "latest.pt":
        # Sealed: any changed byte. A run without a checkpoint is resumed from its beginning
        # (nothing was kept to lose), so a deleted one is refused only where it is read.
        must = not (mutation == "delete" and command[0] == "train")
    else:
        # policy.onnx: hashed weights and graph, but its free-text metadata is not; the oracle
        # decides whether an accepted change was harmless. A deleted policy_io.json marks the run
        # as never exported: eval exports it again from the sealed policy artifact, and the
        # oracle checks that the new ONNX computes what the old one did.
        regenerated = name == "policy_io.json" and mutation == "delete"
        # A config cut after its last value's text (a trailing newline, or `key: null` cut to
        # `key:`) still loads to the same data: nothing is damaged, so accepting it is right.
        unchanged = name == "config.yaml" and content is not None and _same_yaml(content, original)
        must = mutation in STRUCTURAL and not regenerated and not unchanged
    return Case(
        family=f"file:{name}:{mutation}",
        argv=command,
        must_reject=must,
        names=(name, rel, "export"),
        setup=setup,
        needs_run=True,
        onnx_oracle=name == "policy.onnx" or (name == "policy_io.json" and mutation == "delete"),
    )


# ----------------------------------------------------------------------------- value pools
BAD_NUMBERS = [".nan", "nan", "NaN", ".inf", "-.inf", "inf", "1e308", "1e39", "-1e39", "1e23", "1e400", "-1e400"]
ODD_VALUES = [
    "-1", "0", "1e12", "2e9", "-2e9", "3.5", "abc", "[1, 2]", "{a: 1}", "", "[", "{{", "null", "true",
    "18446744073709551616", "-9223372036854775809", "'1'", "x" * 300, "é", "0x10", "1_000", "~", "!!binary AA==",
]  # fmt: skip


def _numeric_keys(cfg: Any) -> tuple[list[str], dict[str, Any]]:
    from embodied.config import describe

    rows = describe(cfg)
    values = {key: eval_value(value) for key, value, _ in rows}
    return [key for key, _, _ in rows], values


def eval_value(text: str) -> Any:
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _is_number(value: Any) -> bool:
    if isinstance(value, tuple):
        return bool(value) and all(_is_number(v) for v in value)
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_bad_number_for(raw: str, default: Any) -> bool:
    """NaN anywhere; infinity unless the default is infinite; a magnitude above every bound."""
    try:
        number = float(raw)
    except ValueError:
        return False
    if math.isnan(number):
        return True
    if math.isinf(number):
        return not (isinstance(default, float) and math.isinf(default))
    return abs(number) > 1e12


def _outside(raw: str, bound: Any) -> bool:
    """Whether YAML text ``raw`` is a decimal number outside ``bound``'s plausible range."""
    from embodied.config import DECIMAL_FLOAT

    if bound is None or not DECIMAL_FLOAT.fullmatch(raw.strip()):
        return False
    number = float(raw)
    return math.isfinite(number) and not bound.low <= number <= bound.high


def _override_case(
    rng: np.random.Generator, keys: list[str], values: dict[str, Any], bounds: dict[str, Any] | None = None
) -> Case:
    key = str(rng.choice(keys))
    default = values[key]
    pick = rng.random()
    must = False
    if pick < 0.1:
        key = key + "x" if rng.random() < 0.5 else key.replace(".", "..", 1) if "." in key else "no_such_key"
        raw = "1"
        must = True
    elif pick < 0.55 and _is_number(default):
        raw = str(rng.choice(BAD_NUMBERS))
        if isinstance(default, tuple):
            position = int(rng.integers(0, len(default)))
            items = [str(v) for v in default]
            items[position] = raw
            must = _is_bad_number_for(raw, default[position])
            raw = "[" + ", ".join(items) + "]"
        else:
            must = _is_bad_number_for(raw, default)
    else:
        raw = str(rng.choice(ODD_VALUES))
        if _is_number(default) and not isinstance(default, tuple):
            # a number beyond the bounds or the field's plausible range, or not a decimal literal
            bound = (bounds or {}).get(key)
            must = _is_bad_number_for(raw, default) or _outside(raw, bound) or raw in ("0x10", "1_000")
    if key in ("task_name", "algo_name"):
        must = raw != str(default)
    first = key.split(".", 1)[0].split("[", 1)[0]
    return Case(
        family="override:" + ("bad_number" if must else "odd_value"),
        argv=["train", "quad-hover", "--print-config", f"{key}={raw}"],
        must_reject=must,
        names=(key.split("[", 1)[0], "command line", first, raw[:20]),
    )


CONFIG_TEXTS = [
    "env:\n  sim:\n    params:\n      inertia_kgm2: [.nan, 1.0e-5, 1.0e-5]\n",
    "env:\n  sim:\n    params:\n      thrust_coef_n_per_rpm2: .inf\n",
    "env:\n  disturbance_force_std_n: 1.0e30\n",
    "env:\n  sim:\n    substeps: 1.0e12\n",
    "trainer:\n  eval_episodes: 1.0e12\n",
    "num_envs: 1.0e12\n",
    "seed: 1.0e23\n",
    "env:\n  reward_constant: 1.0e39\n",
    "device: cpu:abc\n",
    "- just\n- a list\n",
    "env: [1, 2]\n",
    "trainer: {total_env_steps: {a: 1}}\n",
    "a: b: c\n",
    "env:\n\tsim: 1\n",
    "key: &a [*a]\n",
    "[" * 200,
    "env:\n  no_such_field: 1\n",
    "task_name: other\n",
]
"""``--config`` bodies that must all be refused."""


def _config_case(rng: np.random.Generator) -> Case:
    pick = rng.random()
    if pick < 0.45:
        body = str(rng.choice(CONFIG_TEXTS)).encode()
        family, must = "config:absurd", True
    elif pick < 0.6:
        body = "# caf\xe9 settings\nnum_envs: 16\n".encode("latin-1")
        family, must = "config:latin1", True
    elif pick < 0.7:
        body = "num_envs: 16\n".encode("utf-16")
        family, must = "config:utf16", True
    elif pick < 0.8:
        body = rng.bytes(int(rng.integers(1, 200)))
        family, must = "config:random_bytes", False
    else:
        body = _flip(b"num_envs: 16\ntrainer:\n  eval_episodes: 8\nenv:\n  pos_weight: 15.0\n", rng)
        family, must = "config:bitflip", False

    def setup(case_dir: Path) -> None:
        (case_dir / "my.yaml").write_bytes(body)

    where = str(rng.choice(["file", "missing", "directory"])) if rng.random() < 0.15 else "file"
    path = {"file": "{dir}/my.yaml", "missing": "{dir}/absent.yaml", "directory": "{dir}"}[where]
    return Case(
        family=family if where == "file" else f"config:{where}",
        argv=["train", "quad-hover", "--print-config", "--config", path],
        must_reject=must or where != "file",
        names=("my.yaml", "absent.yaml", "command line", "--config", "config file", "device", "seed", "num_envs"),
        setup=setup,
    )


FLAG_CASES: list[tuple[list[str], bool, tuple[str, ...]]] = [
    (["train", "quad-hover", "--print-config", "--seed", "1e23"], True, ("--seed",)),
    (["train", "quad-hover", "--print-config", "--seed", "-5"], True, ("--seed",)),
    (["train", "quad-hover", "--print-config", "--seed", "abc"], True, ("--seed",)),
    (["train", "quad-hover", "--print-config", "--device", "cpu:abc"], True, ("--device",)),
    (["train", "quad-hover", "--print-config", "--device", ""], True, ("--device",)),
    (["train", "quad-hover", "--print-config", "--num-envs", "0"], True, ("--num-envs",)),
    (["train", "quad-hover", "--print-config", "--num-envs", "1e12"], True, ("--num-envs", "num_envs")),
    (["train", "quad-hover", "--print-config", "--seeds", "a,b"], True, ("--seeds",)),
    (["train", "quad-hover", "--print-config", "--seeds", ","], True, ("--seeds",)),
    (["train", "quad-hover", "--print-config", "--algo", "nosuch"], True, ("nosuch", "algorithm")),
    (["train", "nosuch-task", "--print-config"], True, ("nosuch-task", "task")),
    (["train", "--print-config"], True, ("TASK",)),
    (["train", "quad-hover", "--print-config", "--i-know-what-im-doing", "no.such"], True, ("no.such",)),
    (["train", "quad-hover", "--print-config", "--bogus"], True, ("--bogus",)),
    (["train", "quad-hover", "--print-config", "notakeyvalue"], True, ("notakeyvalue",)),
    (["train", "--resume", "{dir}/absent"], True, ("absent",)),
    (["train", "--resume", "{dir}/afile"], True, ("afile",)),
    (["train", "--resume", "{run}", "--seed", "3"], True, ("--seed",)),
    (["train", "--resume", "{run}", "--device", "cpu"], True, ("--device",)),
    (["train", "--resume", "{run}", "--num-envs", "4"], True, ("--num-envs",)),
    (["train", "--resume", "{run}", "--config", "{dir}/absent.yaml"], True, ("--config",)),
    (["train", "--resume", "{run}", "--algo", "sac"], True, ("--algo",)),
    (["train", "--resume", "{run}", "--seeds", "0,1"], True, ("--seeds",)),
    (["train", "--resume", "{run}", "--run-dir", "{dir}/x"], True, ("--run-dir",)),
    (["train", "--resume", "{run}", "env.pos_weight=3"], True, ("env",)),
    (["train", "--resume", "{run}", "trainer.total_env_steps=.nan"], True, ("trainer.total_env_steps",)),
    (["train", "--resume", "{run}", "quad-hover"], True, ("task",)),
    (["train", "quad-hover", "--run-dir", "{dir}/afile", "trainer.total_env_steps=64"], True, ("afile",)),
    (["train", "quad-hover", "--run-dir", "{run}", "trainer.total_env_steps=64"], True, ("run",)),
    (["eval", "{run}", "--episodes", "0"], True, ("--episodes",)),
    (["eval", "{run}", "--episodes", "1e12"], True, ("--episodes",)),
    (["eval", "{run}", "--device", "cpu:abc"], True, ("--device",)),
    (["eval", "{run}", "--policy", "nosuch"], True, ("nosuch", "policy")),
    (["eval", "{dir}/absent"], True, ("absent",)),
    (["eval", "{dir}/afile"], True, ("afile",)),
    (["play", "{run}", "--fps", "0"], True, ("--fps",)),
    (["play", "{run}", "--fps", "-3"], True, ("--fps",)),
    (["play", "{run}", "--seed", "1e23"], True, ("--seed",)),
    (["play", "{dir}/absent"], True, ("absent",)),
    (["export", "{run}", "--format", "x"], True, ("--format",)),
    (["export", "{dir}/afile"], True, ("afile",)),
    (["export", "{dir}/absent"], True, ("absent",)),
    (["nosuchcommand"], True, ("nosuchcommand",)),
    (["verify", "{run}", "--episodes", "1_000"], True, ("--episodes",)),
    (["verify", "{run}", "--threads", "0x10"], True, ("--threads",)),
    (["sim-robot", "quad-hover", "--seconds", "inf"], True, ("--seconds",)),
    (["sim-robot", "quad-hover", "--seed", "-1"], True, ("--seed",)),
    (["deploy", "{run}", "--duration", "nan"], True, ("--duration",)),
    (["collect", "scripted:arm-push", "--episodes", "2", "--noise", "1_0"], True, ("--noise",)),
    (["bench", "sim", "quadrotor", "--num-envs", "4,0x10"], True, ("--num-envs",)),
    (["bench", "sim", "quadrotor", "--steps", "1e400"], True, ("--steps",)),
    (["sweep", "{dir}/absent.yaml", "--workers", "1_0"], True, ("--workers",)),
]
"""Flags with values that must be refused, and the names the refusal must mention."""


FLAG_COMMANDS = ("train", "eval", "play", "export", "verify", "sim-robot", "deploy", "collect", "bench", "sweep")
"""Commands named in a flag case's family label."""


def _flag_case(rng: np.random.Generator) -> Case:
    argv, must, names = FLAG_CASES[int(rng.integers(0, len(FLAG_CASES)))]

    def setup(case_dir: Path) -> None:
        (case_dir / "afile").write_text("not a folder\n")

    return Case(
        family="flag:" + " ".join(a for a in argv if a.startswith("--") or a in FLAG_COMMANDS),
        argv=list(argv),
        must_reject=must,
        names=names,
        setup=setup,
        needs_run="{run}" in argv,
    )


# ----------------------------------------------------------------------------- physical ranges
def ranged_keys(cfg: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """``(dotted key, default, Bound)`` of every field of ``cfg`` declared with a plausible range."""
    import dataclasses

    from embodied.config import field_bound

    rows: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            rows += ranged_keys(value, f"{prefix}{f.name}.")
        elif field_bound(f) is not None:
            rows.append((prefix + f.name, value, field_bound(f)))
    return rows


ISSUE_PHYSICS = [
    "env.sim.dt_s=1e-30", "env.sim.params.mass_kg=1e-30", "env.sim.params.arm_length_m=1e-320",
    "env.sim.params.torque_to_thrust_m=1e-320", "algo.obs_clip=1e-320", "env.success_max_tilt_rad=1000",
]  # fmt: skip
"""The values that trained to exit 0 before physical ranges existed."""

TINY_TRAIN = [
    "train", "quad-hover", "--preset", "nominal", "--no-progress", "--run-dir", "{dir}/run-new", "num_envs=8", "algo.num_steps_per_env=8",
    "trainer.total_env_steps=64", "trainer.eval_episodes=2", "trainer.tensorboard=false",
]  # fmt: skip
"""A training run of one PPO update: a value it accepts really trains."""


def _implausible(rng: np.random.Generator, default: Any, low: float, high: float) -> float:
    """A number outside ``[low, high]``: tiny, negative, huge or just past an end."""
    span = max(high - low, abs(high), 1.0)
    picks = [high + span * float(rng.uniform(0.01, 10.0)), low - span * float(rng.uniform(0.01, 10.0)), high * 1e6 + 1]
    if low > 0:
        picks += [low / 1e6, 1e-30, 1e-320, 5e-324]
    return float(picks[int(rng.integers(0, len(picks)))])


def _physical_case(rng: np.random.Generator, ranged: list[tuple[str, Any, Any]]) -> Case:
    pick = rng.random()
    if pick < 0.2:
        override = str(rng.choice(ISSUE_PHYSICS))
        key = override.split("=", 1)[0]
    else:
        key, default, bound = ranged[int(rng.integers(0, len(ranged)))]
        value = _implausible(rng, default, bound.low, bound.high)
        if isinstance(default, tuple):
            items = [repr(float(v)) for v in default]
            items[int(rng.integers(0, len(items)))] = repr(value)
            override = f"{key}=[{', '.join(items)}]"
        else:
            override = f"{key}={int(value) if isinstance(default, int) else repr(value)}"
    trains = rng.random() < 0.25
    argv = [*TINY_TRAIN, override] if trains else ["train", "quad-hover", "--print-config", override]
    return Case(
        family="physical:train" if trains else "physical:print_config",
        argv=argv,
        must_reject=True,
        names=(key,),
    )


# ----------------------------------------------------------------------------- number forms
NUMBER_FORMS = [
    "0x10", "0X1F", "0o17", "0b101", "010", "007", "1_000", "1_0.5", "1:30", "190:20:30", "+0x1p3", "1e5_0",
    "١٢", "9" * 5000, "-" + "9" * 4301, "1" * 70, "0." + "1" * 80, "1e" + "9" * 5000,
]  # fmt: skip
"""Numbers that are not decimal literals (or are absurdly long): refused for any numeric key."""
BOOL_FORMS = ["yes", "no", "on", "off", "y", "n", "Yes", "ON", "1", "0", "2026-12-06"]
"""YAML 1.1 spellings of booleans (and a date): text, refused for a true/false key."""


def _number_case(rng: np.random.Generator, keys: list[str], values: dict[str, Any]) -> Case:
    numeric = [k for k in keys if _is_number(values[k]) and not isinstance(values[k], tuple)]
    flags = [k for k in keys if isinstance(values[k], bool)]
    if rng.random() < 0.25:
        key, raw = str(rng.choice(flags)), str(rng.choice(BOOL_FORMS))
    else:
        key, raw = str(rng.choice(numeric)), str(rng.choice(NUMBER_FORMS))
    where = rng.random()
    setup: Callable[[Path], None] | None
    if where < 0.6:
        argv = ["train", "quad-hover", "--print-config", f"{key}={raw}"]
        setup = None
    else:  # the same text in a --config file
        parts = key.split(".")
        body = (
            "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(parts[:-1]))
            + f"{'  ' * (len(parts) - 1)}{parts[-1]}: {raw}\n"
        )

        def write(case_dir: Path) -> None:
            (case_dir / "my.yaml").write_text(body)

        setup = write
        argv = ["train", "quad-hover", "--print-config", "--config", "{dir}/my.yaml"]
    if key == "seed" and rng.random() < 0.3:
        argv, setup = ["train", "quad-hover", "--print-config", "--seed", raw], None
    return Case(
        family="number:" + ("bool" if key in flags else "numeric"),
        argv=argv,
        must_reject=True,
        names=(key, "my.yaml", "--seed"),
        setup=setup,
    )


# ----------------------------------------------------------------------------- input bounds
PAYLOAD_TAG = "!!python/object/apply:builtins.open ['{marker}', 'w']"


def _bounds_case(rng: np.random.Generator) -> Case:
    kind = str(rng.choice(["digits", "size", "depth", "alias", "tag", "tag_run", "metrics_digits"]))
    marker = "{dir}/marker"
    if kind == "tag_run":  # a payload tag in a trained run's config.yaml
        command = [
            ["eval", "{run}", "--episodes", "2"],
            ["train", "--resume", "{run}"],
            ["play", "{run}", "--video", "{dir}/v.mp4"],
        ]
        argv = command[int(rng.integers(0, 3))]

        def setup(case_dir: Path) -> None:
            path = case_dir / "run" / "config.yaml"
            tag = PAYLOAD_TAG.format(marker=case_dir / "marker")
            path.write_text(path.read_text().replace("seed: 0", f"seed: {tag}", 1))

        return Case("bounds:tag_run", argv, True, ("config.yaml",), setup, needs_run=True, marker=marker)
    if kind == "metrics_digits":

        def setup(case_dir: Path) -> None:
            path = case_dir / "run" / "metrics.jsonl"
            path.write_text(path.read_text() + '{"env_steps": ' + "9" * int(rng_digits) + "}\n")

        rng_digits = int(rng.integers(4301, 20_000))
        return Case("bounds:metrics_digits", ["train", "--resume", "{run}"], True, ("metrics.jsonl",), setup, True)
    size = int(rng.integers(1, 4))
    bodies = {
        "digits": "9" * (100_000 * size),
        "size": "# padding\n" * (120_000 * size) + "num_envs: 8\n",
        "depth": "env: " + "[" * (40 * size) + "]" * (40 * size) + "\n",
        "alias": "a: &x [1, 2]\nb: [*x, *x]\n",
        "tag": str(
            rng.choice(
                [
                    f"seed: {PAYLOAD_TAG}\n",
                    f"env: {PAYLOAD_TAG}\n",
                    f"{PAYLOAD_TAG}\n",
                    "seed: !!python/name:os.system\n",
                ]
            )
        ),
    }
    body = bodies[kind]

    def write(case_dir: Path) -> None:
        (case_dir / "my.yaml").write_text(body.replace("{marker}", str(case_dir / "marker")))

    return Case(
        family=f"bounds:{kind}",
        argv=["train", "quad-hover", "--print-config", "--config", "{dir}/my.yaml"],
        must_reject=True,
        names=("my.yaml",),
        setup=write,
        marker=marker if kind == "tag" else None,
    )


# ----------------------------------------------------------------------------- checkpoints
class Payload:
    """Unpickling this creates ``marker`` (``open(marker, "w")``): evidence that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def load_plain(path: Path) -> dict[str, Any]:
    """A sealed ``torch.save`` file's contents (``weights_only``: plain data only)."""
    state: dict[str, Any] = torch.load(io.BytesIO(path.read_bytes()), weights_only=True)
    return state


def save_sealed(state: dict[str, Any], path: Path) -> None:
    """Write ``state`` sealed with the project's own (unkeyed) seal, as anyone can."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path.write_bytes(seal(buffer.getvalue()))


def entry_paths(state: dict[str, Any], depth: int = 2) -> list[tuple[str, ...]]:
    """Every mapping entry of ``state`` down to ``depth`` levels (the fields a load reads)."""
    paths: list[tuple[str, ...]] = []
    for key, value in state.items():
        paths.append((key,))
        if depth > 1 and isinstance(value, dict):
            paths += [(key, *rest) for rest in entry_paths(value, depth - 1)]
    return paths


def put(state: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """Set the entry at ``path`` (keys) of nested mappings ``state``."""
    node = state
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _set(*path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda state: put(state, path, value)


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda state: state.pop(key)


SCHEMA_EDITS: list[tuple[str, Callable[[dict[str, Any]], None], tuple[str, ...], str]] = [
    # (id, edit of the base run's checkpoint, commands that read the entry, text the error holds)
    ("trainer-a-string", _set("trainer", value="abc"), ("train", "eval", "export"), "'trainer'"),
    ("env-missing", _drop("env"), ("train",), "'env'"),
    ("algo-missing", _drop("algo"), ("train", "eval", "export"), "'algo'"),
    ("rng-3-bytes", _set("rng", "torch", value=torch.zeros(3, dtype=torch.uint8)), ("train",), "'rng.torch'"),
    ("rng-python-text", _set("rng", "python", value="abc"), ("train",), "'rng.python'"),
    ("env-steps-negative", _set("trainer", "env_steps", value=-100), ("train", "eval", "export"), "trainer.env_steps"),
    ("env-steps-off-grid", _set("trainer", "env_steps", value=100), ("train",), "multiple of 8"),
    ("env-steps-float", _set("trainer", "env_steps", value=128.5), ("train",), "trainer.env_steps"),
    ("updates-negative", _set("trainer", "updates", value=-1), ("train",), "trainer.updates"),
    ("time-nan", _set("trainer", "train_time_s", value=float("nan")), ("train",), "trainer.train_time_s"),
    ("evals-text", _set("trainer", "evals", value=[{"eval/success_rate": "high"}]), ("train",), "trainer.evals[0]"),
    ("obs-shape", _set("obs", "policy", value=torch.zeros(8, 5)), ("train",), "'obs.policy'"),
    ("weight-shape", _set("algo", "policy", "log_std", value=torch.zeros(7)), ("train", "eval", "export"), "algo.policy.log_std"),
    ("weight-dtype", _set("algo", "policy", "log_std", value=torch.zeros(4, dtype=torch.float64)), ("train",), "algo.policy.log_std"),
    ("pending-bad", _set("trainer", "pending_eval", value={"env_steps": 8}), ("train", "eval"), "trainer.pending_eval"),
    ("world-bad", _set("world", value={"size": "two"}), ("train", "eval"), "'world'"),
]  # fmt: skip
"""Sealed checkpoints of the wrong form (``tests/test_checkpoint_schema.py`` runs each)."""

CHECKPOINT_COMMANDS = {
    "train": ["train", "--resume", "{run}"],
    "eval": ["eval", "{run}", "--episodes", "2"],
    "export": ["export", "{run}", "--format", "onnx", "--no-record"],
}


def _checkpoint_case(rng: np.random.Generator, entries: list[tuple[str, ...]]) -> Case:
    if rng.random() < 0.4:
        name, edit, commands, _ = SCHEMA_EDITS[int(rng.integers(0, len(SCHEMA_EDITS)))]
        command = CHECKPOINT_COMMANDS[str(rng.choice(commands))]

        def setup(case_dir: Path) -> None:
            path = case_dir / "run" / "ckpt" / "latest.pt"
            state = load_plain(path)
            edit(state)
            save_sealed(state, path)

        return Case(f"checkpoint:schema:{name}", command, True, ("latest.pt",), setup, needs_run=True)
    entry = entries[int(rng.integers(0, len(entries)))]
    command = CHECKPOINT_COMMANDS[str(rng.choice(list(CHECKPOINT_COMMANDS)))]

    def inject(case_dir: Path) -> None:
        path = case_dir / "run" / "ckpt" / "latest.pt"
        state = load_plain(path)
        put(state, entry, Payload(case_dir / "marker"))
        save_sealed(state, path)

    return Case("checkpoint:payload", command, True, ("latest.pt",), inject, needs_run=True, marker="{dir}/marker")


# ----------------------------------------------------------------------------- running
@dataclass
class Fuzzer:
    """Generates and runs cases against ``base_run`` (a trained, exported run directory)."""

    base_run: Path
    work: Path
    seed: int = 0
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        from embodied.experiment import resolve_experiment

        self.rng = np.random.default_rng(self.seed)
        cfg = resolve_experiment("quad-hover")
        self.keys, self.values = _numeric_keys(cfg)
        self.ranged = ranged_keys(cfg)
        self.base_files = {name: (self.base_run / rel).read_bytes() for name, rel in RUN_FILES.items()}
        state = load_plain(self.base_run / RUN_FILES["latest.pt"])
        extra = [("trainer", "pending_eval"), ("rng", "python"), ("new_entry",)]
        self.entries = entry_paths(state) + [e for e in extra if e not in entry_paths(state)]

    def make_case(self) -> Case:
        pick = self.rng.random()
        if pick < 0.25:
            return _override_case(self.rng, self.keys, self.values, {k: b for k, _, b in self.ranged})
        if pick < 0.35:
            return _physical_case(self.rng, self.ranged)
        if pick < 0.42:
            return _number_case(self.rng, self.keys, self.values)
        if pick < 0.52:
            return _config_case(self.rng) if self.rng.random() < 0.6 else _bounds_case(self.rng)
        if pick < 0.62:
            return _flag_case(self.rng)
        if pick < 0.72:
            return _checkpoint_case(self.rng, self.entries)
        return _file_case(self.rng, self.base_files)

    def run(self, num_cases: int, progress: Callable[[int, Outcome], None] | None = None) -> Counter[str]:
        for index in range(num_cases):
            outcome = self.run_case(self.make_case(), index)
            self.outcomes.append(outcome)
            if progress is not None:
                progress(index, outcome)
        return Counter(o.verdict for o in self.outcomes)

    def run_case(self, case: Case, index: int) -> Outcome:
        case_dir = self.work / f"case{index:05d}"
        if case_dir.exists():
            shutil.rmtree(case_dir)
        case_dir.mkdir(parents=True)
        try:
            if case.needs_run:
                shutil.copytree(self.base_run, case_dir / "run")
            if case.setup is not None:
                case.setup(case_dir)
            argv = [a.replace("{run}", str(case_dir / "run")).replace("{dir}", str(case_dir)) for a in case.argv]
            return self._execute(case, argv, case_dir)
        finally:
            shutil.rmtree(case_dir, ignore_errors=True)

    def _execute(self, case: Case, argv: list[str], case_dir: Path) -> Outcome:
        records = _Records()
        root = logging.getLogger()
        root.addHandler(records)
        stderr = io.StringIO()
        rc: int | None = None
        escaped: BaseException | None = None

        def on_alarm(signum: int, frame: FrameType | None) -> None:
            raise _Hang()

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, CASE_TIMEOUT_S)
        start = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
                try:
                    rc = main(argv)
                except SystemExit as err:
                    rc = err.code if isinstance(err.code, int) else 2
        except _Hang as err:
            escaped = err
        except Exception as err:  # what the fuzzer hunts: anything that escapes main()
            escaped = err
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            root.removeHandler(records)
        seconds = time.perf_counter() - start
        if rc in (130, 143):  # no case sends a signal: this Ctrl-C/SIGTERM was meant for the fuzzer
            raise KeyboardInterrupt
        errors = "\n".join(records.lines + [line for line in stderr.getvalue().splitlines() if line.strip()])
        if case.marker is not None and Path(case.marker.replace("{dir}", str(case_dir))).exists():
            return Outcome(case, rc, errors, "code_execution", f"a payload ran: {case.family} {argv}", seconds)
        if isinstance(escaped, _Hang):
            return Outcome(case, None, errors, "hang", f"over {CASE_TIMEOUT_S:g} s: {argv}", seconds)
        if escaped is not None:
            detail = f"{type(escaped).__name__}: {str(escaped)[:300]} | argv {argv}"
            return Outcome(case, None, errors, "traceback", detail, seconds)
        return Outcome(case, rc, errors, *self._judge(case, rc, errors, argv, case_dir), seconds=seconds)

    def _judge(self, case: Case, rc: int | None, errors: str, argv: list[str], case_dir: Path) -> tuple[str, str]:
        if case.marker is not None and Path(case.marker.replace("{dir}", str(case_dir))).exists():
            return "code_execution", f"a payload ran (exit {rc}): {case.family} {argv}"
        if rc not in (0, 2):
            return "bad_exit", f"exit {rc}: {argv} | {errors[:300]}"
        if rc == 2:
            lines = [line for line in errors.splitlines() if line.strip()]
            if len(lines) != 1:
                return "multiline_error", f"{len(lines)} lines: {errors[:400]} | {argv}"
            if not any(name and name in lines[0] for name in case.names):
                return "unnamed_error", f"{lines[0][:300]} | expected one of {case.names} | {argv}"
            return "rejected", ""
        if case.must_reject:
            return "silent_acceptance", f"exit 0: {case.family} {argv}"
        if case.onnx_oracle:
            same = onnx_outputs_equal(
                self.base_run / RUN_FILES["policy.onnx"], case_dir / "run" / RUN_FILES["policy.onnx"]
            )
            return ("accepted_edit", "") if same else ("silent_acceptance", f"changed ONNX output accepted: {argv}")
        return (
            "accepted_edit" if case.family.startswith(("file:", "config:bitflip", "config:random")) else "accepted"
        ), ""


def onnx_outputs_equal(original: Path, changed: Path, num: int = 64) -> bool:
    """Whether onnxruntime computes bit-identical actions from both files on random observations."""
    import onnxruntime as ort

    try:
        a = ort.InferenceSession(str(original), providers=["CPUExecutionProvider"])
        b = ort.InferenceSession(str(changed), providers=["CPUExecutionProvider"])
        dim = a.get_inputs()[0].shape[1]
        obs = np.random.default_rng(0).normal(size=(num, dim)).astype(np.float32)
        return bool(np.array_equal(a.run(None, {"obs": obs})[0], b.run(None, {"obs": obs})[0]))
    except Exception:  # the changed file does not even load: its acceptance was wrong
        return False


def make_base_run(folder: Path) -> Path:
    """Train and export the tiny run that run-directory cases damage copies of."""
    run = folder / "base"
    if not (run / RUN_FILES["policy_io.json"]).exists():
        assert main([*TINY_RUN, "--run-dir", str(run)]) == 0
        assert main(["export", str(run), "--format", "onnx", "--no-record"]) == 0
    return run


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    """Counts by verdict and by family, and the first few failures (for reports)."""
    verdicts = Counter(o.verdict for o in outcomes)
    families = Counter(o.case.family.split(":")[0] for o in outcomes)
    failures = [f"{o.verdict}: {o.detail}" for o in outcomes if o.verdict in FAILURES][:20]
    slowest = max((o.seconds for o in outcomes), default=0.0)
    return {"cases": len(outcomes), "verdicts": dict(verdicts), "families": dict(families),
            "slowest_case_s": round(slowest, 2), "failures": failures}  # fmt: skip
