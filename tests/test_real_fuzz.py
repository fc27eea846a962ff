"""The node under malformed and implausible messages (bench/fuzz_node.py): no crash, the safe
command for every unusable state, every rejection counted by reason on /diagnostics."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from real_support import export_policy, quad_robot, quad_spec

FUZZER = Path(__file__).resolve().parents[1] / "bench" / "fuzz_node.py"


def _fuzzer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_node", FUZZER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quad_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A policy pushed towards full thrust: an unguarded node would send non-safe commands.
    return export_policy(tmp_path_factory.mktemp("fuzz"), quad_spec(history=2), seed=2, bias=0.8)


def test_fuzz_a_few_hundred_messages(quad_export: Path) -> None:
    report = _fuzzer().fuzz(quad_export, quad_robot(), 300, seed=1)
    assert report["bad_messages"] == 300
    assert set(report["by_kind"]) == set(_fuzzer().KINDS)  # every kind was exercised
    assert report["armed_when_bad_arrived"] >= 30  # many bad messages hit an armed node


@pytest.mark.slow
def test_fuzz_ten_thousand_messages(quad_export: Path) -> None:
    report = _fuzzer().fuzz(quad_export, quad_robot(), 10_000, seed=2)
    assert report["bad_messages"] == 10_000 and report["armed_when_bad_arrived"] >= 1000


def test_fuzzer_detects_an_unguarded_node(quad_export: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fuzzer's checks can fail: with the envelope switched off, far-away states get driven."""
    from embodied.real.safety import Envelope

    monkeypatch.setattr(Envelope, "violation", lambda self, fields: None)
    with pytest.raises(AssertionError, match="envelope"):
        _fuzzer().fuzz(quad_export, quad_robot(), 300, seed=3)
