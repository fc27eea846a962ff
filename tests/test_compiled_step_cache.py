"""The on-disk cache of ahead-compiled functions (``tasks/compiled_step_cache.py``): what its key
covers and how it treats files that are absent or do not load. Saving and loading a real compiled
step is checked in ``tests/test_quad_hover_fused.py`` (slow: it compiles)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from embodied.tasks import compiled_step_cache


def _sources(folder: Path, text: str) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "step.py").write_text(text)
    return folder


def test_cache_key_changes_with_every_part_and_with_the_sources(tmp_path: Path) -> None:
    """Equal inputs give one key; a different constant, signature, thread count or source edit
    gives another (an edited module must not load a step compiled from its old text)."""
    src = _sources(tmp_path / "a", "x = 1\n")
    key = compiled_step_cache.cache_key(("step", (1.0, 2.0), (4096, 4)), [src])
    assert key == compiled_step_cache.cache_key(("step", (1.0, 2.0), (4096, 4)), [src])
    assert key != compiled_step_cache.cache_key(("step", (1.0, 2.5), (4096, 4)), [src])
    assert key != compiled_step_cache.cache_key(("step", (1.0, 2.0), (256, 4)), [src])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert key != compiled_step_cache.cache_key(("step", (1.0, 2.0), (4096, 4)), [src]), "threads are baked in"
    finally:
        torch.set_num_threads(threads)
    _sources(src, "x = 2\n")
    assert key != compiled_step_cache.cache_key(("step", (1.0, 2.0), (4096, 4)), [src])


def test_host_isa_names_the_vector_capability() -> None:
    """The key carries the CPU's instruction sets: a cache folder shared between machines does not
    hand code built for one ISA to another."""
    isa = compiled_step_cache.host_isa()
    assert "|" in isa and isa.split("|")[1] in {"DEFAULT", "AVX2", "AVX512", "ZVECTOR", "SVE256", "NO AVX"}


def test_load_of_an_absent_or_corrupt_file_returns_none(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A missing file is a miss; a file that does not load is logged and treated as a miss (the
    caller compiles again and overwrites it)."""
    assert compiled_step_cache.load(tmp_path / "absent.bin", {}) is None
    corrupt = tmp_path / "cut_short.bin"
    corrupt.write_bytes(b"\x80\x04not a pickle")
    with caplog.at_level(logging.WARNING, logger=compiled_step_cache.__name__):
        assert compiled_step_cache.load(corrupt, {}) is None
    assert "cut_short.bin" in caplog.text and "compiling again" in caplog.text


def test_save_failure_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A cache folder that cannot be written (here: its parent is a file) costs the next process
    a compile, not this run."""
    blocker = tmp_path / "file"
    blocker.write_text("")

    class Compiled:
        def save_compiled_function(self, path: str) -> None:
            Path(path).write_bytes(b"")

    with caplog.at_level(logging.WARNING, logger=compiled_step_cache.__name__):
        compiled_step_cache.save(Compiled(), blocker / "sub" / "x.bin")
    assert "could not save" in caplog.text
    compiled_step_cache.save(Compiled(), tmp_path / "sub" / "x.bin")
    assert (tmp_path / "sub" / "x.bin").is_file()
