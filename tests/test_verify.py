"""``embodied verify``: verify.json schema, gates and exit codes, export handling, named errors."""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("mujoco")
pytest.importorskip("onnxruntime")

from embodied.cli import main
from embodied.errors import EmbodiedError
from embodied.verify.gates import DEFAULT_GATES, check_gates, parse_gate_overrides, parse_sweep_overrides

# Tiny counts and one sweep point per knob kind: this checks the plumbing, not the policy.
QUICK = ["--episodes", "6", "--sweep-episodes", "4", "--no-progress", "--threads", "1"]
QUICK_SWEEP = [
    "--sweep=mass_scale=1.3",
    "--sweep=inertia_scale=",
    "--sweep=motor_tau_scale=",
    "--sweep=obs_delay_steps=1",
    "--sweep=thrust_mismatch=",
    "--sweep=yaw_torque_nm=",
]
LENIENT = [
    "--gate=torch_success_min=0",
    "--gate=mujoco_success_min=0",
    "--gate=firmware_success_min=0",
    "--gate=sim_to_sim_drop_max=1",
    "--gate=perturbation_success_min=0",
    "--gate=l2f_recovery_min=0",
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real, briefly trained quad-hover PPO run (no export yet)."""
    from embodied.experiment import replace_trainer, resolve_experiment
    from embodied.training.trainer import Trainer

    cfg = resolve_experiment("quad-hover", "ppo", None, ["trainer.total_env_steps=2048"], seed=0, num_envs=32)
    cfg = replace_trainer(cfg, progress=False, tensorboard=False, eval_every_env_steps=0, eval_episodes=8)
    run_dir = tmp_path_factory.mktemp("runs") / "quad"
    run_dir.mkdir()
    Trainer(cfg, run_dir, resume=False).train()
    return run_dir


def test_verify_exports_writes_the_report_and_gates_decide_the_exit_code(
    tiny_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert not (tiny_run / "export").exists()
    code = main(["verify", str(tiny_run), *QUICK, *QUICK_SWEEP, *LENIENT, "--json"])
    assert code == 0
    assert (tiny_run / "export" / "policy.onnx").is_file(), "verify exports a run that has no export"
    report = json.loads((tiny_run / "verify.json").read_text())
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == report
    assert report["gates_passed"] is True
    rates = report["success_rate"]
    assert set(rates) == {
        "torch",
        "mujoco",
        "mujoco_l2f",
        "firmware",
        "perturb/mass_scale=1.3",
        "perturb/obs_delay_steps=1",
    }
    assert all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in rates.values())
    checks = report["checks"]
    assert checks["mujoco"]["episodes"] == 6 and checks["perturb/mass_scale=1.3"]["episodes"] == 4
    # The recovery check flies as many episodes as the nominal one, from L2F's starts; the nominal
    # one reports the run's own starts beside it (the shipped PPO config: 1 rad tilt).
    assert checks["mujoco_l2f"]["episodes"] == 6
    assert checks["mujoco_l2f"]["starts"]["init_max_angle_rad"] == pytest.approx(math.pi / 2)
    assert checks["mujoco"]["starts"]["init_max_angle_rad"] == pytest.approx(1.0)
    recovery_gate = next(g for g in report["gate_results"] if g["name"] == "l2f_recovery_min")
    assert recovery_gate["value"] == rates["mujoco_l2f"] and recovery_gate["threshold"] == 0.0
    assert set(report["gates"]) == set(DEFAULT_GATES)
    assert {g["name"] for g in report["gate_results"]} == set(DEFAULT_GATES)
    assert len(report["model_sha256"]) == 64
    assert (tiny_run / "verify.png").stat().st_size > 10_000

    # Gates no policy can meet fail the run: exit 1, gates_passed false, the gates named as failed.
    strict = ["--gate", "torch_success_min=1.01", "--gate", "l2f_recovery_min=1.01", "--no-plot"]
    code = main(["verify", str(tiny_run), *QUICK, *QUICK_SWEEP, *LENIENT, *strict])
    assert code == 1
    report = json.loads((tiny_run / "verify.json").read_text())
    assert report["gates_passed"] is False
    failed = [g["name"] for g in report["gate_results"] if not g["passed"]]
    assert failed == ["torch_success_min", "l2f_recovery_min"]
    # The summary prints the recovery row right after the nominal MuJoCo row, each with its starts.
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split()[0] for line in lines if " success " in line]
    assert rows[rows.index("mujoco") + 1] == "mujoco_l2f"
    assert "(starts: tilt <= 90 deg, 1 m/s, 1 rad/s)" in next(x for x in lines if x.startswith("mujoco_l2f "))
    assert "(starts: tilt <= 57 deg, 1 m/s, 1 rad/s)" in next(x for x in lines if x.startswith("mujoco "))
    assert any(x.startswith("FAIL  l2f_recovery_min") for x in lines)


def _copy_run(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run, dst, ignore=shutil.ignore_patterns("host", "verify.*"))
    return dst


def test_corrupt_or_partial_export_exits_2_naming_the_file(
    tiny_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if not (tiny_run / "export" / "policy.onnx").is_file():
        assert main(["export", str(tiny_run), "--format", "onnx", "--no-record"]) == 0
    run = _copy_run(tiny_run, tmp_path)
    (run / "export" / "policy.onnx").write_bytes(b"not an onnx model")
    with caplog.at_level(logging.ERROR):
        assert main(["verify", str(run), *QUICK, "--no-plot"]) == 2
    assert "policy.onnx: not a loadable ONNX model" in caplog.text
    assert not (run / "verify.json").exists()

    caplog.clear()
    shutil.copy(tiny_run / "export" / "policy.onnx", run / "export" / "policy.onnx")
    (run / "export" / "policy_io.json").unlink()
    with caplog.at_level(logging.ERROR):
        assert main(["verify", str(run), *QUICK, "--no-plot"]) == 2
    assert "policy_io.json: not found" in caplog.text

    caplog.clear()
    shutil.copy(tiny_run / "export" / "policy_io.json", run / "export" / "policy_io.json")
    data = json.loads((run / "export" / "policy_io.json").read_text())
    data["model_sha256"] = "0" * 64
    (run / "export" / "policy_io.json").write_text(json.dumps(data))
    with caplog.at_level(logging.ERROR):
        assert main(["verify", str(run), *QUICK, "--no-plot"]) == 2
    assert "exported from other weights" in caplog.text


def test_bad_input_exits_2(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        assert main(["verify", str(tmp_path), *QUICK]) == 2
    assert "not a run directory" in caplog.text
    with caplog.at_level(logging.ERROR):
        assert main(["verify", str(tmp_path), "--gate", "speed_max=3"]) == 2
    assert "unknown gate 'speed_max'" in caplog.text


def test_gate_and_sweep_parsing(tmp_path: Path) -> None:
    yaml_file = tmp_path / "gates.yaml"
    yaml_file.write_text("mujoco_success_min: 0.85\nsim_to_sim_drop_max: 0.1\n")
    gates = parse_gate_overrides(["sim_to_sim_drop_max=0.2"], yaml_file)
    assert gates["mujoco_success_min"] == 0.85 and gates["sim_to_sim_drop_max"] == 0.2  # the CLI wins
    with pytest.raises(EmbodiedError, match="needs a number"):
        parse_gate_overrides(["torch_success_min=high"], None)
    yaml_file.write_text("- 1\n")
    with pytest.raises(EmbodiedError, match="expected a mapping"):
        parse_gate_overrides([], yaml_file)
    sweep = parse_sweep_overrides(["mass_scale=0.5,1.5", "yaw_torque_nm="])
    assert sweep["mass_scale"] == (0.5, 1.5) and "yaw_torque_nm" not in sweep
    with pytest.raises(EmbodiedError, match="KNOB one of"):
        parse_sweep_overrides(["wind=1"])
    results = {g.name: g for g in check_gates({"a_min": 0.9, "b_max": 0.05}, {"a_min": 0.95, "b_max": float("nan")})}
    assert results["a_min"].passed and not results["b_max"].passed, "a NaN value never passes"


def test_check_verified_accepts_only_a_passing_report_of_the_current_export(tiny_run: Path, tmp_path: Path) -> None:
    from embodied.verify.report import check_verified

    run = _copy_run(tiny_run, tmp_path)
    with pytest.raises(EmbodiedError, match=r"verify\.json: not found"):
        check_verified(run)
    assert main(["verify", str(run), *QUICK, *QUICK_SWEEP, *LENIENT, "--no-plot"]) == 0
    assert check_verified(run)["gates_passed"] is True
    report = json.loads((run / "verify.json").read_text())
    (run / "verify.json").write_text(json.dumps(report | {"model_sha256": "f" * 64}))
    with pytest.raises(EmbodiedError, match="verified another export"):
        check_verified(run)
    failed = report | {"gates_passed": False, "gate_results": [{"name": "mujoco_success_min", "passed": False}]}
    (run / "verify.json").write_text(json.dumps(failed))
    with pytest.raises(EmbodiedError, match=r"failed verification \(gates: mujoco_success_min\)"):
        check_verified(run)


def test_verify_flies_a_compiled_run_with_the_eager_step(
    tiny_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run trained with ``env.sim.compile: true`` (the default command's) is verified with the
    eager step: a cold compile per distinct task config made a first verify take minutes."""
    import embodied.tasks.quadrotor.hover as hover
    from embodied.config import load_yaml

    run = _copy_run(tiny_run, tmp_path)
    config = run / "config.yaml"
    assert "compile: false" in config.read_text()
    config.write_text(config.read_text().replace("compile: false", "compile: true", 1))
    assert load_yaml(config)["env"]["sim"]["compile"] is True, "the edit reached env.sim.compile"

    def compiled_step_that_refuses(*_args: object, **_kwargs: object) -> Callable[..., None]:
        def step(*_a: object, **_k: object) -> None:
            raise AssertionError("verify stepped a compiled step")

        return step

    # Building a compiled step is lazy and cheap (export builds one); stepping it compiles.
    monkeypatch.setattr(hover, "compiled_step_core", compiled_step_that_refuses)
    monkeypatch.setattr(hover, "compiled_fused_step", compiled_step_that_refuses)
    assert main(["verify", str(run), *QUICK, *QUICK_SWEEP, *LENIENT]) == 0
    assert (run / "verify.png").is_file(), "the trajectory plot (its own torch envs) ran too"


def test_eager_and_quiet_task_cfg_leave_configs_without_those_fields_alone() -> None:
    from embodied.config import apply_overrides
    from embodied.eval_cfg import eager_task_cfg, quiet_task_cfg
    from embodied.registry import task_cfg
    from embodied.tasks.quadrotor.hover import QuadHoverCfg

    compiled = apply_overrides(task_cfg("quad-hover"), {"sim": {"compile": True}}, "test")
    assert isinstance(compiled, QuadHoverCfg)
    assert eager_task_cfg(compiled).sim.compile is False and compiled.sim.compile is True
    quiet = quiet_task_cfg(compiled)
    assert quiet.sim.compile is False and quiet.disturbance_force_std_n == 0.0
    other = task_cfg("arm-push")
    assert eager_task_cfg(other) is other
