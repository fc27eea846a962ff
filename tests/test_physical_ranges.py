"""Physical and algorithmic ranges, decimal-only numbers and bounded input, at config load.

Every ranged field (``embodied.config.ranged``) holds its default (the Crazyflie's published
values for the quadrotor) and every shipped config; the values of the issue that trained to
exit 0 (time standing still, a weightless vehicle, a tilt limit that wraps through cos) are
refused naming the key, the value and the range; ``--allow-unphysical`` lets a deliberate
experiment through (and its run reloads), but never NaN or an angle outside its interval.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from fuzz_support import ranged_keys

from embodied import registry
from embodied.cli import main
from embodied.commands.train import DEFAULT_PRESETS_FILE
from embodied.config import MAX_CONFIG_BYTES, UNPHYSICAL, ConfigError, load_yaml, parse_dotted
from embodied.experiment import config_key, load_experiment, resolve_experiment

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _inside(value: Any, bound: Any) -> bool:
    values = value if isinstance(value, tuple) else (value,)
    return all(bound.low <= v <= bound.high for v in values if isinstance(v, int | float))


def test_every_default_lies_in_its_declared_range() -> None:
    checked = 0
    for task in [*registry.TASKS, *PREFIXED_TASKS]:
        for algo in registry.ALGOS:
            try:
                cfg = resolve_experiment(task, algo)
            except ConfigError:
                continue  # an algorithm the task has no config for
            for key, value, bound in ranged_keys(cfg):
                assert _inside(value, bound), f"{task}/{algo}: {key} = {value} outside [{bound.low}, {bound.high}]"
                checked += 1
    assert checked > 1000


def test_the_crazyflie_published_values_are_inside_the_quadrotor_ranges() -> None:
    rows = {key: (value, bound) for key, value, bound in ranged_keys(resolve_experiment("quad-hover"))}
    published = {  # Crazyflie 2.x: mass, arm, thrust and drag coefficients, motor speed (REFERENCE.md)
        "env.sim.params.mass_kg": 0.027,
        "env.sim.params.arm_length_m": 0.046,
        "env.sim.params.thrust_coef_n_per_rpm2": 3.16e-10,
        "env.sim.params.torque_to_thrust_m": 0.005964,
        "env.sim.params.max_rpm": 21702.0,
        "env.sim.params.motor_tau_s": 0.15,  # L2F's slower motor model
        "env.sim.dt_s": 0.002,  # the on-board policy period (500 Hz)
    }
    for key, value in published.items():
        assert key in rows, key
        bound = rows[key][1]
        assert bound.unit and bound.low <= value <= bound.high, (key, value, bound)


PREFIXED_TASKS = ("gym:Pendulum-v1", "maniskill:PushCube-v1", "robosuite:Lift")
"""Tasks of the prefixed families with a shipped config (their folder names come from these)."""


def _shipped_configs() -> list[Path]:
    # default_presets.yaml names presets, it is not a config layer (tests/test_default_preset.py)
    return sorted(p for p in CONFIGS.glob("*/*.yaml") if p.name != DEFAULT_PRESETS_FILE)


@pytest.mark.parametrize("path", _shipped_configs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_config_resolves_inside_the_ranges(path: Path) -> None:
    if path.parent.name == "vehicles":  # a vehicle preset, given to a quadrotor task with --config
        for task in ("quad-hover", "quad-track"):
            assert resolve_experiment(task, "ppo", path).env.sim.params.variant == path.stem
        return
    names = [*registry.TASKS, *PREFIXED_TASKS]
    task = next(t for t in names if config_key(registry.canonical_task(t)[0]) == path.parent.name)
    algo, _, preset = path.stem.partition(".")
    cfg = resolve_experiment(task, algo, path if preset else None)
    assert (cfg.task_name, cfg.algo_name) == (task, algo)


ISSUE_VALUES = [
    ("env.sim.dt_s=1e-30", "env.sim.dt_s", "[0.0001, 0.1] s"),
    ("env.sim.params.mass_kg=1e-30", "env.sim.params.mass_kg", "kg"),
    ("env.sim.params.arm_length_m=1e-320", "env.sim.params.arm_length_m", "m"),
    ("env.sim.params.torque_to_thrust_m=1e-320", "env.sim.params.torque_to_thrust_m", "m"),
    ("algo.obs_clip=1e-320", "algo.obs_clip", "standard deviations"),
    ("env.success_max_tilt_rad=1000", "env.success_max_tilt_rad", "rad"),
    ("env.sim.params.gravity_mps2=1e5", "env.sim.params.gravity_mps2", "m/s^2"),
    ("algo.gamma=1.5", "algo.gamma", "[0, 1]"),
]


@pytest.mark.parametrize(("override", "key", "range_text"), ISSUE_VALUES)
def test_implausible_values_are_refused_naming_key_value_and_range(override: str, key: str, range_text: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_experiment("quad-hover", "ppo", overrides=[override])
    message = str(err.value)
    value = override.split("=", 1)[1]
    assert key in message and "plausible range" in message and range_text in message, message
    assert repr(float(value)) in message or value in message, message


def test_a_config_file_with_an_implausible_value_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "slow.yaml"
    path.write_text("env:\n  sim:\n    dt_s: 1.0e-30\n")
    with pytest.raises(ConfigError, match=r"slow\.yaml: key 'env\.sim\.dt_s' = 1e-30 s is outside"):
        resolve_experiment("quad-hover", "ppo", path)


def test_allow_unphysical_lets_a_deliberate_experiment_through_and_its_run_reloads(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        resolve_experiment("quad-hover", "ppo", overrides=["env.sim.params.mass_kg=80"])
    cfg = resolve_experiment("quad-hover", "ppo", overrides=["env.sim.params.mass_kg=80"], allow=[UNPHYSICAL])
    assert cfg.env.sim.params.mass_kg == 80.0
    one_key = ["env.sim.params.mass_kg"]
    assert resolve_experiment("quad-hover", "ppo", overrides=["env.sim.params.mass_kg=80"], allow=one_key)
    # the saved config records the flag: eval, play and --resume load the run
    from embodied.training.run import write_config

    write_config(tmp_path, cfg, [UNPHYSICAL])
    assert load_experiment(tmp_path / "config.yaml").env.sim.params.mass_kg == 80.0
    text = (tmp_path / "config.yaml").read_text().replace(f"i_know_what_im_doing:\n- {UNPHYSICAL}\n", "")
    (tmp_path / "config.yaml").write_text(text)
    with pytest.raises(ConfigError, match="mass_kg"):
        load_experiment(tmp_path / "config.yaml")


@pytest.mark.parametrize(
    "override", ["env.success_max_tilt_rad=7", "env.init_max_angle_rad=-1", "env.sim.dt_s=.nan", "num_envs=0"]
)
def test_allow_unphysical_never_lets_wrapping_angles_or_non_numbers_through(override: str) -> None:
    with pytest.raises(ConfigError, match=override.split("=")[0].replace(".", r"\.")):
        resolve_experiment("quad-hover", "ppo", overrides=[override], allow=[UNPHYSICAL])


def test_the_flag_is_on_the_command_line(caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", "quad-hover", "--print-config", "env.sim.params.mass_kg=80"]
    assert main(argv) == 2
    assert "--allow-unphysical" in caplog.text
    assert main([*argv, "--allow-unphysical"]) == 0
    assert "env.sim.params.mass_kg = 80.0" in capsys.readouterr().out


# ----------------------------------------------------------------------------- number forms
@pytest.mark.parametrize("raw", ["0x10", "1_000", "010", "0o17", "1:30", "0b11", "+0x1p3", "١٢", "1e5_0", "9" * 5000])
def test_numbers_are_decimal_literals_only(raw: str) -> None:
    with pytest.raises(ConfigError, match="num_envs"):
        resolve_experiment("quad-hover", "ppo", overrides=[f"num_envs={raw}"])


@pytest.mark.parametrize("raw", ["yes", "on", "y", "off", "1", "2026-12-06"])
def test_yaml_1_1_booleans_and_dates_are_not_booleans(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"trainer\.tensorboard"):
        resolve_experiment("quad-hover", "ppo", overrides=[f"trainer.tensorboard={raw}"])


def test_decimal_forms_still_parse() -> None:
    values = parse_dotted(["a=16", "b=-3", "c=1e6", "d=1.0e-5", "e=.5", "f=true", "g=.inf", "h=~"])
    assert values == {"a": 16, "b": -3, "c": 1e6, "d": 1e-5, "e": 0.5, "f": True, "g": float("inf"), "h": None}
    cfg = resolve_experiment("quad-hover", "ppo", overrides=["trainer.total_env_steps=4e6", "num_envs='64'"])
    assert cfg.trainer.total_env_steps == 4_000_000 and cfg.num_envs == 64


def test_huge_digit_counts_never_reach_int(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Python refuses to convert more than 4,300 digits (a ValueError that is no YAML error):
    every way a number enters stops long before that, with one error line."""
    digits = "9" * 5000
    for argv in (
        ["train", "quad-hover", "--print-config", f"num_envs={digits}"],
        ["train", "quad-hover", "--print-config", "--num-envs", digits],
        ["train", "quad-hover", "--print-config", "--seed", digits],
    ):
        caplog.clear()
        rc: int | str | None
        try:
            rc = main(argv)
        except SystemExit as exit_:  # an argparse usage error: one line on stderr
            rc = exit_.code
        assert rc == 2, argv
        assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) <= 1
    path = tmp_path / "digits.yaml"
    path.write_text("9" * 100_000)
    with pytest.raises(ConfigError, match=r"digits\.yaml: invalid YAML: a number of 100000 characters"):
        load_yaml(path)
    path.write_text(f"num_envs: {digits}\n")
    with pytest.raises(ConfigError, match="at most 64 digits"):
        load_yaml(path)


def test_file_size_nesting_and_aliases_are_bounded_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * MAX_CONFIG_BYTES + "\nnum_envs: 8\n")
    with pytest.raises(ConfigError, match=r"big\.yaml: \d+ bytes, larger than any config"):
        load_yaml(path)
    path.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="nested more than 32 levels"):
        load_yaml(path)
    path.write_text("a: &x [1, 2]\nb: [*x, *x]\n")
    with pytest.raises(ConfigError, match="anchors and aliases"):
        load_yaml(path)


NUMERIC_FLAGS = [
    ("verify", ["verify", "RUN_DIR"], "--episodes", "1_000"),
    ("verify", ["verify", "RUN_DIR"], "--threads", "0x10"),
    ("verify", ["verify", "RUN_DIR"], "--substeps", "0"),
    ("sim-robot", ["sim-robot", "quad-hover"], "--seconds", "inf"),
    ("sim-robot", ["sim-robot", "quad-hover"], "--arm-timeout", "nan"),
    ("sim-robot", ["sim-robot", "quad-hover"], "--seed", "-1"),
    ("deploy", ["deploy", "RUN_DIR"], "--duration", "1_0"),
    ("collect", ["collect", "scripted:arm-push", "--episodes", "3"], "--noise", "-0.5"),
    ("bench", ["bench", "sim", "quadrotor"], "--num-envs", "4,0x10"),
    ("bench", ["bench", "sim", "quadrotor"], "--steps", "1e400"),
    ("bench", ["bench", "gpu"], "--budget-s", "1e999"),
]


@pytest.mark.parametrize(("command", "argv", "flag", "raw"), NUMERIC_FLAGS)
def test_every_commands_numeric_flags_take_bounded_decimals_only(
    command: str, argv: list[str], flag: str, raw: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, flag, raw])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"embodied {command}: error: argument {flag}"), err
    assert repr(raw.split(",")[-1]) in err[0] and "expected" in err[0], err


def test_seeds_list_takes_decimals_only(caplog: pytest.LogCaptureFixture) -> None:
    assert main(["train", "quad-hover", "--print-config", "--seeds", "0,1_0"]) == 2
    assert "--seeds" in caplog.text and "'1_0'" in caplog.text
