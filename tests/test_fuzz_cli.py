"""The command line under malformed input: the seeded fuzzer of ``tests/fuzz_support.py``.

The default suite runs a few hundred cases in-process; the ``slow`` test (and
``bench/fuzz_campaign.py``) runs 10,000. Every case must end in exit 0 or a one-line exit-2
error naming what is at fault; damaged checkpoints, ONNX files and absurd values never exit 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzz_support import FAILURES, Fuzzer, make_base_run, summary


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_base_run(tmp_path_factory.mktemp("fuzz_base"))


def _run(base_run: Path, work: Path, seed: int, cases: int) -> dict:
    fuzzer = Fuzzer(base_run, work, seed=seed)
    fuzzer.run(cases)
    report = summary(fuzzer.outcomes)
    assert not any(report["verdicts"].get(f) for f in FAILURES), report
    return report


def test_fuzz_a_few_hundred_cases(base_run: Path, tmp_path: Path) -> None:
    report = _run(base_run, tmp_path, seed=2026, cases=200)
    # The mix really reaches every family and really rejects (not an always-exit-0 runner).
    families = {"override", "config", "flag", "file", "physical", "number", "bounds", "checkpoint"}
    assert set(report["families"]) == families, report
    assert report["verdicts"].get("rejected", 0) > 100, report


@pytest.mark.slow
def test_fuzz_ten_thousand_cases(base_run: Path, tmp_path: Path) -> None:
    report = _run(base_run, tmp_path, seed=14, cases=10_000)
    assert report["cases"] == 10_000, report
