"""MJCF loading: MuJoCo's compiler warnings reach ``logging``, not stdout and a MUJOCO_LOG.TXT
in the working directory."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from embodied.sim.mujoco_model import load_mjcf

# mujoco 4.0 deprecated the compiler's settotalmass (gymnasium's half_cheetah.xml still sets it)
DEPRECATED_ATTRIBUTE_MJCF = """
<mujoco>
  <compiler settotalmass="2"/>
  <worldbody>
    <body><freejoint/><geom type="sphere" size="0.1"/></body>
  </worldbody>
</mujoco>
"""


def test_compiler_warnings_are_logged_once_and_leave_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model_path = tmp_path / "model.xml"
    model_path.write_text(DEPRECATED_ATTRIBUTE_MJCF)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="embodied.sim.mujoco_model"):
        first = load_mjcf(model_path)
        load_mjcf(model_path)
    assert first.body_mass.sum() == pytest.approx(2.0)  # the attribute still acted
    warnings = [r.getMessage() for r in caplog.records if "settotalmass" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert str(model_path) in warnings[0]
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
