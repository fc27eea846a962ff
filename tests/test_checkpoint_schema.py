"""Sealed checkpoints of the wrong form are refused, naming the entry, before anything is restored.

Each case edits one entry of a real run's checkpoint and seals it again with the project's own
seal (so the seal passes), then checks that the commands that read it exit 2 with one error
line naming the entry; and that an edited ``config.yaml`` is refused naming the field that no
longer fits the trained policy.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from fuzz_support import SCHEMA_EDITS as CASES
from fuzz_support import make_base_run

from embodied.checkpoint_seal import seal
from embodied.cli import main


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_base_run(tmp_path_factory.mktemp("schema_base"))


def _edit_checkpoint(run: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    path = run / "ckpt" / "latest.pt"
    state = torch.load(io.BytesIO(path.read_bytes()), weights_only=True)
    edit(state)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path.write_bytes(seal(buffer.getvalue()))


def _error(argv: list[str], caplog: pytest.LogCaptureFixture) -> str:
    caplog.clear()
    rc = None
    with contextlib.suppress(SystemExit):
        rc = main(argv)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert rc == 2 and len(errors) == 1, (argv, rc, errors)
    return errors[0]


ARGV = {
    "train": ["train", "--resume", "{run}", "--no-progress"],
    "eval": ["eval", "{run}", "--episodes", "2"],
    "export": ["export", "{run}", "--format", "onnx", "--no-record"],
}


@pytest.mark.parametrize(("edit", "commands", "text"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_sealed_checkpoint_of_the_wrong_form_is_refused_naming_the_entry(
    base_run: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    edit: Callable[[dict[str, Any]], None],
    commands: tuple[str, ...],
    text: str,
) -> None:
    run = tmp_path / "run"
    shutil.copytree(base_run, run)
    before = (run / "metrics.jsonl").read_bytes()
    _edit_checkpoint(run, edit)
    for command in commands:
        message = _error([a.replace("{run}", str(run)) for a in ARGV[command]], caplog)
        assert text in message and "latest.pt" in message, (command, message)
    assert (run / "metrics.jsonl").read_bytes() == before  # nothing was resumed or rewritten


def test_a_well_formed_checkpoint_still_resumes(base_run: Path, tmp_path: Path) -> None:
    """The check is no blanket refusal: the untouched checkpoint, resealed, resumes and evaluates."""
    run = tmp_path / "run"
    shutil.copytree(base_run, run)
    _edit_checkpoint(run, lambda state: None)
    assert main(["train", "--resume", str(run), "--no-progress", "trainer.total_env_steps=192"]) == 0
    assert main(["eval", str(run), "--episodes", "2"]) == 0


def test_an_edited_config_names_the_field_that_no_longer_fits(
    base_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = tmp_path / "run"
    shutil.copytree(base_run, run)
    text = (run / "config.yaml").read_text()
    assert "  action_history: 1\n" in text
    (run / "config.yaml").write_text(text.replace("  action_history: 1\n", "  action_history: 3\n"))
    for command in ("eval", "export", "train"):
        message = _error([a.replace("{run}", str(run)) for a in ARGV[command]], caplog)
        assert "config.yaml does not fit" in message and "'prev_actions' has 4 values" in message, message
        assert "env.action_history is 3 in config.yaml, 1 when it was trained" in message, message
    # without the policy artifact, the checkpoint check names the observation entry and both shapes
    (run / "ckpt" / "policy.pt").unlink()
    message = _error([a.replace("{run}", str(run)) for a in ARGV["train"]], caplog)
    assert "'obs.policy'" in message and "[8, 30]" in message and "[8, 22]" in message, message


def test_run_files_with_huge_numbers_are_refused_naming_the_file(
    base_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """JSON has no digit limit of its own: Python's 4,300-digit one must not surface as a traceback."""
    run = tmp_path / "run"
    shutil.copytree(base_run, run)
    metrics = run / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"env_steps": ' + "9" * 5000 + "}\n")
    message = _error(["train", "--resume", str(run), "--no-progress"], caplog)
    assert "metrics.jsonl" in message and "line" in message, message
    shutil.rmtree(run)
    shutil.copytree(base_run, run)
    policy_io = run / "export" / "policy_io.json"
    policy_io.write_text(policy_io.read_text().replace('"size": 3', '"size": ' + "1" * 5000, 1))
    assert "1" * 5000 in policy_io.read_text()
    message = _error(["eval", str(run), "--episodes", "2", "--policy", "onnx"], caplog)
    assert "policy_io.json" in message, message
