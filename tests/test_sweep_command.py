"""`embodied sweep`: the sweep file, the local and Ray engines, skip and resume, the report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from embodied.cli import main
from embodied.config import UNPHYSICAL, ConfigError, load_yaml
from embodied.experiment import load_experiment
from embodied.sweeps.engines import finished_result, job_argv, run_dir_of
from embodied.sweeps.report import table, target_points
from embodied.sweeps.spec import Job, load_spec

TINY = ["trainer.total_env_steps=1024", "num_envs=16", "trainer.eval_every_env_steps=512", "trainer.eval_episodes=4"]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return path


def test_grid_times_seeds_gives_one_job_per_run(tmp_path: Path) -> None:
    spec = load_spec(
        _write(
            tmp_path,
            "task: quad-hover\nseeds: [0, 1]\noverrides: ['num_envs=16']\n"
            "grid:\n  algo.init_std: [0.2, 0.3]\n  env.pos_weight: [10]\n"
            "configs:\n  - {name: sac_base, algo: sac, seeds: [5]}\n",
        )
    )
    assert [(j.config, j.seed, j.algo) for j in spec.jobs] == [
        ("init_std-0.2__pos_weight-10", 0, "ppo"),
        ("init_std-0.2__pos_weight-10", 1, "ppo"),
        ("init_std-0.3__pos_weight-10", 0, "ppo"),
        ("init_std-0.3__pos_weight-10", 1, "ppo"),
        ("sac_base", 5, "sac"),
    ]
    assert spec.jobs[2].overrides == ("num_envs=16", "algo.init_std=0.3", "env.pos_weight=10")
    assert spec.jobs[4].overrides == ("num_envs=16",)
    assert spec.name == "sweep" and spec.target == 0.95


def test_a_plain_list_of_entries_is_read_as_configs(tmp_path: Path) -> None:
    spec = load_spec(
        _write(tmp_path, "- {name: a, task: quad-hover, algo: ppo, seeds: [0, 1], overrides: ['num_envs=8']}\n")
    )
    assert [j.run_name for j in spec.jobs] == ["a_s0", "a_s1"]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("task: quad-hover\ngrid: {algo.init_std: 0.2}\n", "non-empty list of values"),
        ("task: quad-hover\ngrids: {algo.init_std: [0.2]}\n", "unknown key(s) grids"),
        ("grid: {algo.init_std: [0.2]}\n", "has no 'task'"),
        ("task: quad-hover\nseeds: 3\ngrid: {algo.init_std: [0.2]}\n", "'seeds' expects"),
        ("task: quad-hover\n", "no configurations"),
        ("task: quad-hover\nconfigs: [{name: a}, {name: a}]\n", "repeated: a"),
        ("task: quad-hover\nconfigs: [{name: a, overrides: [num_envs]}]\n", "key=value"),
        ("task: quad-hover\ntarget: 2\nconfigs: [{name: a}]\n", "'target'"),
        ("task: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_sweep_files_are_named_errors(tmp_path: Path, text: str, named: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=r"sweep\.yaml") as err:
        load_spec(path)
    assert named in str(err.value)


def test_a_saved_run_is_resumed_and_one_without_checkpoint_is_kept_aside(tmp_path: Path) -> None:
    job = Job("a", "quad-hover", "ppo", 0, ("num_envs=16",), 60.0)
    fresh = job_argv(tmp_path, job, threads=1)
    assert fresh[fresh.index("--run-dir") + 1] == str(run_dir_of(tmp_path, job)) and "num_envs=16" in fresh
    (run_dir_of(tmp_path, job) / "ckpt").mkdir(parents=True)
    (run_dir_of(tmp_path, job) / "ckpt" / "model_1024.pt").write_bytes(b"x")
    assert job_argv(tmp_path, job, threads=1)[-3:] == ["--resume", str(run_dir_of(tmp_path, job)), "--no-progress"]
    (run_dir_of(tmp_path, job) / "ckpt" / "model_1024.pt").unlink()
    again = job_argv(tmp_path, job, threads=1)
    assert "--run-dir" in again and not run_dir_of(tmp_path, job).exists()
    assert [p.name.startswith("a_s0.incomplete-") for p in (tmp_path / "runs").iterdir()] == [True]


def test_report_counts_held_targets_and_failed_runs() -> None:
    evals = [{"env_steps": s, "train_time_s": s / 100, "success_rate": r, "mean_return": 0.0} for s, r in
             [(100, 0.5), (200, 0.96), (300, 0.97), (400, 0.99)]]  # fmt: skip
    assert target_points(evals, 0.95)["held"]["env_steps"] == 300
    results = [
        {"config": "a", "seed": 0, "returncode": 0, "evals": evals},
        {"config": "a", "seed": 1, "returncode": 1, "evals": evals[:2]},
    ]
    md = table(results, 0.95)
    assert "| a | 1/2 | 300 | 3.00 | 0.975 ± 0.021 |" in md
    assert "s1: –; 0.960 (exit 1)" in md


def test_local_sweep_trains_reports_and_skips_finished_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _write(
        tmp_path,
        f"name: tiny\ntask: quad-hover\npreset: nominal\nseeds: [3]\noverrides: {json.dumps(TINY)}\nconfigs: [{{name: base}}]\n",
    )
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1"]) == 0
    status = json.loads((out / "status" / "base_s3.json").read_text())
    assert status["returncode"] == 0 and len(status["evals"]) >= 2
    assert status["argv"][:3] == [sys.executable, "-m", "embodied.cli"]
    report = json.loads((out / "results.json").read_text())
    assert report["sweep"] == "tiny" and [r["seed"] for r in report["runs"]] == [3]
    assert (out / "curves.png").stat().st_size > 1000
    assert "| base | " in (out / "results.md").read_text()
    log_size = (out / "runs" / "base_s3.log").stat().st_size
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1"]) == 0
    assert (out / "runs" / "base_s3.log").stat().st_size == log_size  # nothing ran again
    assert finished_result(out, load_spec(spec).jobs[0]) == status


@pytest.mark.slow
def test_ray_engine_runs_the_same_job_on_a_local_ray(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the sweep extra (ray) is not installed")
    from embodied.sweeps.engines import run_ray

    job = Job("r", "quad-hover", "ppo", 1, tuple(TINY), 600.0, preset="nominal")
    (result,) = run_ray(tmp_path, [job], address=None, cores_per_run=1)
    assert result["returncode"] == 0 and len(result["evals"]) >= 2
    assert finished_result(tmp_path, job) == result


def test_allow_unphysical_reaches_every_run_and_its_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    heavy = [*TINY, "env.sim.params.mass_kg=80"]  # outside the quadrotor's plausible mass range
    spec = _write(
        tmp_path,
        f"task: quad-hover\npreset: nominal\nseeds: [0]\noverrides: {json.dumps(heavy)}\nconfigs: [{{name: h}}]\n",
    )
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--dry-run"]) == 0
    assert "--allow-unphysical" not in capsys.readouterr().out
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1"]) == 1  # refused: the range holds
    assert "mass_kg" in (out / "runs" / "h_s0.log").read_text()
    (out / "status" / "h_s0.json").unlink()
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1", "--allow-unphysical"]) == 0
    status = json.loads((out / "status" / "h_s0.json").read_text())
    assert "--allow-unphysical" in status["argv"] and status["returncode"] == 0
    config = run_dir_of(out, load_spec(spec).jobs[0]) / "config.yaml"
    assert UNPHYSICAL in load_yaml(config)["i_know_what_im_doing"]  # so eval, play and --resume load it
    assert load_experiment(config).env.sim.params.mass_kg == 80.0


def test_the_hold_rule_of_a_sweep_file_counts_the_target_as_its_runs_do(tmp_path: Path) -> None:
    """``hold: mean`` (``trainer.success_hold: mean``): a run whose kept evaluation and the mean
    of the last two reach the target held it, even with one evaluation under it."""
    evals = [{"env_steps": s, "train_time_s": s / 100, "success_rate": r, "mean_return": 0.0} for s, r in
             [(100, 0.5), (200, 0.96), (300, 0.93), (400, 0.99)]]  # fmt: skip
    assert target_points(evals, 0.95)["held"] is None
    assert target_points(evals, 0.95, "mean")["held"]["env_steps"] == 400
    results = [{"config": "a", "seed": 0, "returncode": 0, "evals": evals}]
    assert "| a | 0/1 |" in table(results, 0.95) and "| a | 1/1 | 400 |" in table(results, 0.95, "mean")
    assert "held ≥ 95% (mean of two)" in table(results, 0.95, "mean")
    spec = load_spec(_write(tmp_path, "task: quad-hover\nhold: mean\nconfigs: [{name: a}]\n"))
    assert (
        spec.hold == "mean" and load_spec(_write(tmp_path, "task: quad-hover\nconfigs: [{name: a}]\n")).hold == "each"
    )
    with pytest.raises(ConfigError, match=r"'hold' expects one of each, mean, got 'both'"):
        load_spec(_write(tmp_path, "task: quad-hover\nhold: both\nconfigs: [{name: a}]\n"))
