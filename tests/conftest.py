"""Test-suite wiring: GPU tests are skipped without CUDA; ``--skipslow`` skips tests marked slow.

Slow tests (cold ``torch.compile`` equivalence checks, up to ~90 s each) run by default: the
whole suite still fits the 10-minute CI budget. Skip them locally for a quick loop.
"""

from __future__ import annotations

import pytest
import torch


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--skipslow", action="store_true", help="skip tests marked slow (cold torch.compile)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs CUDA (none visible)")
    skip_slow = pytest.mark.skip(reason="slow: skipped by --skipslow")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and config.getoption("--skipslow"):
            item.add_marker(skip_slow)
