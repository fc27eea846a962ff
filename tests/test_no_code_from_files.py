"""No file the toolkit reads can run code: a source scan, and crafted payloads in every field.

The scan parses the package's sources (``embodied/``, ``sim/``, ``tasks/``, ``policies/``,
``real/``) and fails naming ``file:line`` for any unpickling call that is not the safe form.
The payload tests put a pickled object whose ``__reduce__`` creates a marker file into each
entry of a real run's checkpoint and policy artifact, seal the file again with the project's
own seal (an unkeyed hash, so anyone can), and check that ``train --resume``, ``eval`` and
``export`` refuse it with one error line and that the marker never appears; likewise for
``!!python/...`` tags in a run's ``config.yaml`` and in a ``--config`` file.
"""

from __future__ import annotations

import ast
import contextlib
import io
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from fuzz_support import Payload, entry_paths, load_plain, make_base_run, put, save_sealed

from embodied.cli import main

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = ("embodied", "sim", "tasks", "policies", "real")
SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader", "StrictYamlLoader"}
UNSAFE_YAML_NAMES = {
    "unsafe_load",
    "unsafe_load_all",
    "full_load",
    "full_load_all",
    "Loader",
    "UnsafeLoader",
    "FullLoader",
}


def _dotted(node: ast.AST) -> str:
    """``torch.load`` for ``Attribute(Name('torch'), 'load')``; "" for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def unsafe_loads(source: str, filename: str) -> list[str]:
    """``file:line: why`` for every unpickling or unsafe YAML load in ``source``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "yaml"
            and node.attr in UNSAFE_YAML_NAMES
        ):
            found.append(f"{where}: yaml.{node.attr} builds arbitrary Python objects")
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name == "torch.load":
            flag = _keyword(node, "weights_only")
            if not (isinstance(flag, ast.Constant) and flag.value is True):
                found.append(f"{where}: torch.load without weights_only=True")
        elif name.split(".")[-1] in ("load", "loads", "Unpickler") and name.split(".")[0] in (
            "pickle",
            "cPickle",
            "dill",
            "_pickle",
        ):
            found.append(f"{where}: {name} unpickles")
        elif name == "yaml.load" or name == "yaml.load_all":
            loader = _keyword(node, "Loader")
            loader_name = _dotted(loader).split(".")[-1] if loader is not None else ""
            if loader_name not in SAFE_YAML_LOADERS:
                found.append(f"{where}: {name} without a safe Loader")
        elif name in ("np.load", "numpy.load"):
            flag = _keyword(node, "allow_pickle")
            if flag is not None and not (isinstance(flag, ast.Constant) and flag.value is False):
                found.append(f"{where}: {name} with allow_pickle")
    return found


def test_no_unsafe_load_in_the_package() -> None:
    problems: list[str] = []
    for folder in PACKAGE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            problems += unsafe_loads(path.read_text(), str(path.relative_to(ROOT)))
    assert not problems, "\n".join(problems)


def test_the_scan_finds_each_unsafe_form() -> None:
    source = "\n".join(
        [
            "torch.load(f)",
            "torch.load(f, weights_only=False)",
            "torch.load(f, weights_only=True)",
            "pickle.loads(b)",
            "pickle.load(fh)",
            "yaml.load(t)",
            "yaml.load(t, Loader=yaml.Loader)",
            "yaml.load(t, Loader=StrictYamlLoader)",
            "yaml.unsafe_load(t)",
            "yaml.safe_load(t)",
            "np.load(p, allow_pickle=True)",
        ]
    )
    lines = sorted(int(p.split(":")[1]) for p in unsafe_loads(source, "x.py"))
    # line 7 is reported twice: yaml.load with yaml.Loader, and the name yaml.Loader itself
    assert lines == [1, 2, 4, 5, 6, 7, 7, 9, 11]


# ----------------------------------------------------------------------------- payloads
@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_base_run(tmp_path_factory.mktemp("payload_base"))


COMMANDS = (
    ("train", "--resume", "{run}"),
    ("eval", "{run}", "--episodes", "2"),
    ("export", "{run}", "--format", "onnx", "--no-record"),
)


def _refuses(argv: list[str], caplog: pytest.LogCaptureFixture, marker: Path, name: str) -> None:
    """``argv`` exits 2 with one error line naming ``name``, and ``marker`` was not created."""
    caplog.clear()
    rc = None
    with contextlib.suppress(SystemExit):
        rc = main(argv)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    err = "\n".join(errors)
    assert rc == 2, (argv, err)
    assert len(errors) == 1 and name in err, (argv, err)
    assert not marker.exists(), f"the payload ran: {argv}"


def _checkpoint_entries(base_run: Path, depth: int) -> list[tuple[str, ...]]:
    """Entries of the base run's checkpoint down to ``depth``, the snapshot in flight (None in
    the base run), the RNG states, and an entry no checkpoint has."""
    state = load_plain(base_run / "ckpt" / "latest.pt")
    paths = list(entry_paths(state, depth))
    extra = [("trainer", "pending_eval"), ("rng", "python"), ("algo", next(iter(state["algo"]))), ("new_entry",)]
    return paths + [e for e in extra if e not in paths]


def _payload_in_each(
    base_run: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    entries: list[tuple[str, ...]],
    file: str = "latest.pt",
    commands: tuple[tuple[str, ...], ...] = COMMANDS,
) -> None:
    """For each entry: a fresh copy of the run whose ``ckpt/<file>`` holds a payload there,
    resealed; every command refuses it naming the file, and the payload never runs."""
    for i, entry in enumerate(entries):
        run = tmp_path / f"run{i}"
        shutil.copytree(base_run, run)
        marker = tmp_path / f"marker{i}"
        state = load_plain(run / "ckpt" / file)
        put(state, entry, Payload(marker))
        save_sealed(state, run / "ckpt" / file)
        for command in commands:
            _refuses([a.replace("{run}", str(run)) for a in command], caplog, marker, file)
        shutil.rmtree(run)


def test_a_payload_in_any_top_level_checkpoint_entry_is_refused_unrun(
    base_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _payload_in_each(base_run, tmp_path, caplog, _checkpoint_entries(base_run, depth=1))


@pytest.mark.slow
def test_a_payload_in_any_checkpoint_entry_two_levels_down_is_refused_unrun(
    base_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert len(_checkpoint_entries(base_run, 2)) > 20  # the walk really reaches the nested entries
    _payload_in_each(base_run, tmp_path, caplog, _checkpoint_entries(base_run, depth=2))


def test_a_payload_in_a_snapshot_in_flight_is_refused_unrun(
    base_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The entry the old format unpickled: a snapshot's policy, in every field of it."""
    state = load_plain(base_run / "ckpt" / "latest.pt")
    policy = {k: v.clone() for k, v in state["algo"]["policy"].items()}
    steps = state["trainer"]["env_steps"]
    for field in ("env_steps", "train_time_s", "seed", "policy_state", "policy_state.weight"):
        run = tmp_path / field
        shutil.copytree(base_run, run)
        marker = tmp_path / f"marker-{field}"
        snapshot: dict[str, Any] = {"env_steps": steps, "train_time_s": 0.1, "seed": 3, "policy_state": dict(policy)}
        if field == "policy_state.weight":
            snapshot["policy_state"][next(iter(policy))] = Payload(marker)
        else:
            snapshot[field] = Payload(marker)
        state["trainer"]["pending_eval"] = snapshot
        save_sealed(state, run / "ckpt" / "latest.pt")
        for command in COMMANDS:
            _refuses([a.replace("{run}", str(run)) for a in command], caplog, marker, "latest.pt")
        assert not marker.exists(), f"the payload in pending_eval.{field} ran"


def test_a_pickled_module_of_an_older_version_is_skipped_never_loaded(
    base_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Older checkpoints kept a snapshot in flight as ``torch.save`` of the module: those bytes
    are dropped (logged), not unpickled, and the run resumes."""
    run = tmp_path / "old"
    shutil.copytree(base_run, run)
    marker = tmp_path / "marker-old"
    inner = io.BytesIO()
    torch.save(Payload(marker), inner)
    state = load_plain(run / "ckpt" / "latest.pt")
    steps = state["trainer"]["env_steps"]
    state["trainer"]["pending_eval"] = {
        "env_steps": steps,
        "train_time_s": 0.1,
        "seed": 3,
        "policy_bytes": inner.getvalue(),
    }
    save_sealed(state, run / "ckpt" / "latest.pt")
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert not marker.exists()


def test_a_payload_in_the_policy_artifact_is_refused_unrun(
    base_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    original = load_plain(base_run / "ckpt" / "policy.pt")
    # changing checkpoint_seal makes the artifact stale: it is rebuilt from the checkpoint instead
    entries = [e for e in entry_paths(original, depth=3) if e != ("checkpoint_seal",)]
    _payload_in_each(base_run, tmp_path, caplog, entries, "policy.pt", COMMANDS[1:])


TAG = "!!python/object/apply:builtins.open ['{marker}', 'w']"


def test_python_tags_in_a_config_are_refused_unrun(
    base_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "marker-yaml"
    tag = TAG.format(marker=marker)
    run = tmp_path / "run"
    shutil.copytree(base_run, run)
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(text.replace("seed: 0", f"seed: {tag}", 1))
    for command in COMMANDS:
        _refuses([a.replace("{run}", str(run)) for a in command], caplog, marker, "config.yaml")
    config = tmp_path / "my.yaml"
    for body in (f"seed: {tag}\n", f"env: {tag}\n", f"{tag}\n", "trainer: !!python/name:os.system\n"):
        config.write_text(body)
        _refuses(["train", "quad-hover", "--print-config", "--config", str(config)], caplog, marker, "my.yaml")
    _refuses(["train", "quad-hover", "--print-config", f"seed={tag}"], caplog, marker, "seed")
    assert not marker.exists(), "a !!python tag ran"
