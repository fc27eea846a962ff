"""A task's default preset (``configs/<task>/default_presets.yaml``): ``embodied train quad-hover``
without ``--preset`` layers ``sweep`` (the policy ``verify`` passes), ``--preset nominal`` is the
algorithm's YAML alone, and a sweep file's ``preset`` reaches every run's command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from embodied.cli import main
from embodied.commands import train as train_command
from embodied.commands.train import DEFAULT_PRESETS_FILE, configs_root, default_preset, list_presets, preset_file
from embodied.config import ConfigError, describe, load_yaml
from embodied.experiment import resolve_experiment
from embodied.sweeps.engines import job_argv
from embodied.sweeps.spec import load_spec


def _printed(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """``key -> value`` of ``embodied train ... --print-config``."""
    assert main([*argv, "--print-config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    return dict(line.split("    # ")[0].split(" = ", 1) for line in lines if " = " in line)


def test_quad_hover_trains_the_sweep_preset_unless_told_otherwise(capsys: pytest.CaptureFixture[str]) -> None:
    assert default_preset("quad-hover", "ppo") == "sweep"
    assert default_preset("quad-hover", "sac") is None  # only the algorithms the file names
    assert default_preset("halfcheetah", "ppo") is None  # a task without the file
    default = _printed(["train", "quad-hover"], capsys)
    sweep = _printed(["train", "quad-hover", "--preset", "sweep"], capsys)
    nominal = _printed(["train", "quad-hover", "--preset", "nominal"], capsys)
    assert default == sweep
    assert default["env.action_history"] == "16" and default["env.sim.compile"] == "True"
    # the nominal preset is the YAML alone: what the Python API resolves without a preset file
    assert nominal == {key: str(value) for key, value, _ in describe(resolve_experiment("quad-hover", "ppo"))}
    assert nominal["env.action_history"] == "1" and nominal["env.sim.compile"] == "False"
    # another algorithm of the same task keeps its YAML alone
    assert _printed(["train", "quad-hover", "--algo", "sac"], capsys)["env.action_history"] == "1"


def test_every_default_preset_exists_beside_a_nominal_one() -> None:
    """What `embodied train --help` promises: each default names a shipped preset, and
    ``--preset nominal`` is there to turn it off."""
    files = sorted(configs_root().glob(f"*/{DEFAULT_PRESETS_FILE}"))
    assert files, "no task names a default preset"
    for path in files:
        for algo, name in load_yaml(path).items():
            task = path.parent.name
            assert preset_file(task, algo, name).is_file()
            assert load_yaml(preset_file(task, algo, "nominal")) == {}, f"{task}: the nominal preset must be empty"
    listed = next(li for li in list_presets().splitlines() if li.strip().startswith("quad_hover:"))
    assert "ppo.sweep (default)" in listed and "ppo.nominal" in listed
    assert not any(li.strip().startswith("vehicles:") for li in list_presets().splitlines())


def test_a_default_that_is_not_a_name_is_refused_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "quad_hover").mkdir()
    (tmp_path / "quad_hover" / DEFAULT_PRESETS_FILE).write_text("ppo: [sweep]\n")
    monkeypatch.setattr(train_command, "configs_root", lambda: tmp_path)
    with pytest.raises(ConfigError, match=rf"{DEFAULT_PRESETS_FILE}: 'ppo' expects a preset name"):
        default_preset("quad-hover", "ppo")


def test_a_sweep_file_names_the_preset_of_its_runs(tmp_path: Path) -> None:
    spec_path = tmp_path / "sweep.yaml"
    spec_path.write_text(
        "task: quad-hover\npreset: nominal\nseeds: [0]\n"
        "configs:\n  - {name: a}\n  - {name: b, preset: robust}\n  - {name: c, algo: sac}\n"
    )
    jobs = {job.config: job for job in load_spec(spec_path).jobs}
    assert {name: job.preset for name, job in jobs.items()} == {"a": "nominal", "b": "robust", "c": "nominal"}
    argv = job_argv(tmp_path, jobs["b"], threads=1)
    assert argv[argv.index("--preset") + 1] == "robust"
    spec_path.write_text("task: quad-hover\nconfigs: [{name: a}]\n")
    (job,) = load_spec(spec_path).jobs
    assert job.preset is None and "--preset" not in job_argv(tmp_path, job, threads=1)  # the task's default
    spec_path.write_text("task: quad-hover\npreset: 3\nconfigs: [{name: a}]\n")
    with pytest.raises(ConfigError, match=r"'preset' expects a preset name \(e.g. nominal\), got 3"):
        load_spec(spec_path)
