"""Named Crazyflie variants: the preset files, what training writes, what verify and the
firmware staging take from ``policy_io.json`` ``extra.vehicle_variant``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml
from export_support import quad_io_spec, random_policy, write_io

from embodied.config import ConfigError
from embodied.crazyflie import firmware_build as fb
from embodied.experiment import resolve_experiment
from embodied.export.c_header import generate_c
from embodied.sim.mujoco_crazyflie import CrazyflieParams
from embodied.sim.vehicle_variants import DEFAULT_VARIANT, VARIANTS

CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "vehicles"


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_preset_file_trains_its_variant_and_policy_io_names_it(name: str) -> None:
    path = CONFIGS / f"{name}.yaml"
    assert yaml.safe_load(path.read_text())["env"]["sim"]["params"] == VARIANTS[name].params_overrides()
    cfg = resolve_experiment("quad-hover", "ppo", path, seed=0, num_envs=4)
    params = cfg.env.sim.params
    assert params.variant == name and params.mass_kg == VARIANTS[name].mass_kg
    from embodied.tasks.quadrotor.hover import QuadHover

    extra = QuadHover(cfg.env, num_envs=4, device=torch.device("cpu"), seed=0).io_spec().extra
    assert extra["vehicle_variant"] == name
    assert -1.0 < extra["hover_action"] < 0.5  # the variant hovers well inside its thrust range


def test_the_default_is_the_crazyflie_2_1_with_its_numbers() -> None:
    cfg = resolve_experiment("quad-hover", "ppo", None, seed=0, num_envs=4)
    assert cfg.env.sim.params.variant == DEFAULT_VARIANT == "crazyflie-2.1"
    assert VARIANTS[DEFAULT_VARIANT].params_overrides() == {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in dataclasses.asdict(cfg.env.sim.params).items()
        if k in VARIANTS[DEFAULT_VARIANT].params_overrides()
    }


def test_a_variant_whose_firmware_cannot_apply_the_thrust_range_is_refused() -> None:
    with pytest.raises(
        ConfigError,
        match=r"below the crazyflie-2\.1-brushless firmware's THRUST_MIN .*configs/vehicles/crazyflie-2\.1-brushless\.yaml",
    ):
        resolve_experiment("quad-hover", "ppo", None, ["env.sim.params.variant=crazyflie-2.1-brushless"], seed=0)
    with pytest.raises(ConfigError, match=r"above the crazyflie-2\.1 firmware's THRUST_MAX"):
        resolve_experiment("quad-hover", "ppo", None, ["env.sim.params.max_thrust_per_motor_n=0.15"], seed=0)
    with pytest.raises(ConfigError, match=r"variant 'crazyflie-3' is not one of crazyflie-2\.1"):
        resolve_experiment("quad-hover", "ppo", None, ["env.sim.params.variant=crazyflie-3"], seed=0)


def test_verify_flies_the_variants_published_mass_not_the_trained_one() -> None:
    extra = {"vehicle_variant": "crazyflie-2.1-plus", "max_thrust_per_motor_n": 0.1125}
    assert CrazyflieParams.from_policy_extra(extra).mass_kg == 0.029
    assert CrazyflieParams.from_policy_extra({}).mass_kg == CrazyflieParams().mass_kg  # older exports
    with pytest.raises(ConfigError, match=r"extra\.vehicle_variant"):
        CrazyflieParams.from_policy_extra({"vehicle_variant": "cf9"})


@pytest.mark.parametrize(
    ("name", "lines"),
    [
        ("crazyflie-2.1", ["CONFIG_PLATFORM_CF2=y", "CONFIG_CRAZYFLIE_LEGACY_PROPELLERS=y"]),
        ("crazyflie-2.1-plus", ["CONFIG_PLATFORM_CF2=y", "CONFIG_CRAZYFLIE_21_PLUS=y"]),
        ("crazyflie-2.1-brushless", ["CONFIG_PLATFORM_CF21BL=y"]),
    ],
)
def test_staging_selects_the_variants_firmware_build(tmp_path: Path, name: str, lines: list[str]) -> None:
    spec = quad_io_spec(history=4)
    spec = dataclasses.replace(spec, extra={**spec.extra, "vehicle_variant": name})
    module = random_policy(obs_dim=spec.obs_dim)
    generate_c(module, write_io(module, spec, tmp_path), tmp_path / "c")
    staged = fb.stage_crazyflie_app(tmp_path / "c", tmp_path / "app")
    config = (staged / "app-config").read_text().splitlines()
    assert "CONFIG_CONTROLLER_OOT=y" in config and config[-len(lines) :] == lines
    header = (staged / "src" / fb.VEHICLE_HEADER).read_text()
    assert f'#define QC_VARIANT_NAME "{name}"' in header
    assert all(f"#define QC_VARIANT_{line.removeprefix('CONFIG_').removesuffix('=y')} 1" in header for line in lines)
