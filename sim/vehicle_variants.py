"""Named Crazyflie variants: published physical parameters and the firmware build each one flies.

A quadrotor run trains one variant (``env.sim.params.variant``, written into ``policy_io.json``
as ``extra.vehicle_variant``); ``verify`` flies that variant's published mass and inertia in
MuJoCo, and ``flash`` builds the firmware for that variant's platform. Every number's source is
listed in docs/conventions.md ("Vehicle variants"). The files ``configs/vehicles/<name>.yaml``
hold the same parameters as training overrides (``embodied train quad-hover --config ...``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class VehicleVariant:
    """One Crazyflie variant. Physical values are SI; the firmware fields name the Kconfig
    choices of its build (``PLATFORM_<firmware_platform>``, ``CONFIG_<firmware_setup>``) and
    the per-motor thrust limits every accepted release of that build applies (``THRUST_MAX``
    at its smallest, ``THRUST_MIN`` at its largest)."""

    name: str
    title: str
    mass_kg: float
    inertia_kgm2: tuple[float, float, float]
    arm_length_m: float
    thrust_coef_n_per_rpm2: float
    torque_to_thrust_m: float
    max_rpm: float
    motor_tau_s: float
    max_thrust_per_motor_n: float
    min_thrust_per_motor_n: float
    firmware_platform: str
    firmware_setup: str | None
    firmware_thrust_max_n: float
    firmware_thrust_min_n: float

    def params_overrides(self) -> dict[str, Any]:
        """The ``env.sim.params`` keys that train this variant (``configs/vehicles/<name>.yaml``)."""
        return {
            "variant": self.name,
            "mass_kg": self.mass_kg,
            "inertia_kgm2": list(self.inertia_kgm2),
            "arm_length_m": self.arm_length_m,
            "thrust_coef_n_per_rpm2": self.thrust_coef_n_per_rpm2,
            "torque_to_thrust_m": self.torque_to_thrust_m,
            "max_rpm": self.max_rpm,
            "motor_tau_s": self.motor_tau_s,
            "max_thrust_per_motor_n": self.max_thrust_per_motor_n,
            "min_thrust_per_motor_n": self.min_thrust_per_motor_n,
        }


_CF21 = VehicleVariant(
    name="crazyflie-2.1",
    title="Crazyflie 2.1 (brushed 7x16 mm motors, legacy 45 mm propellers)",
    mass_kg=0.027,
    inertia_kgm2=(1.66e-5, 1.66e-5, 2.93e-5),
    arm_length_m=0.046,
    thrust_coef_n_per_rpm2=3.16e-10,
    torque_to_thrust_m=0.005964,
    max_rpm=21702.0,
    motor_tau_s=0.05,
    max_thrust_per_motor_n=0.1125,
    min_thrust_per_motor_n=0.02,
    firmware_platform="CF2",
    firmware_setup="CRAZYFLIE_LEGACY_PROPELLERS",
    firmware_thrust_max_n=0.1125,
    firmware_thrust_min_n=0.02,
)

VARIANTS: dict[str, VehicleVariant] = {
    v.name: v
    for v in (
        _CF21,
        # The 2.1's dynamics (no other published k_f or inertia) at the 2.1+ build's 29 g.
        replace(
            _CF21,
            name="crazyflie-2.1-plus",
            title="Crazyflie 2.1+ (brushed motors, 2.1+ propellers; the firmware's default cf2 build)",
            mass_kg=0.029,
            firmware_setup="CRAZYFLIE_21_PLUS",
        ),
        VehicleVariant(
            name="crazyflie-2.1-brushless",
            title="Crazyflie 2.1 Brushless (08028 10000 KV motors, 55 mm propellers)",
            mass_kg=0.032,
            # Not published: the 2.1's inertia scaled by mass and arm length squared (x 1.40).
            inertia_kgm2=(2.32e-5, 2.32e-5, 4.10e-5),
            arm_length_m=0.050,
            thrust_coef_n_per_rpm2=3.16e-10,
            torque_to_thrust_m=0.00569278844371417,
            # Up to 30 g (0.294 N) per motor: the speed at which kf * rpm^2 reaches it.
            max_rpm=30519.0,
            motor_tau_s=0.05,
            max_thrust_per_motor_n=0.2,
            min_thrust_per_motor_n=0.022,
            firmware_platform="CF21BL",
            firmware_setup=None,
            firmware_thrust_max_n=0.2,
            firmware_thrust_min_n=0.02136263065537499,
        ),
    )
}
DEFAULT_VARIANT = "crazyflie-2.1"
"""What quad-hover and quad-track train unless told otherwise (27 g, legacy propellers)."""

NOMINAL = VARIANTS[DEFAULT_VARIANT]
"""The default variant's values: the defaults of the simulators' parameter classes
(``QuadrotorParams``, the MuJoCo ``CrazyflieParams``) and of the renderer's arm length."""


def variant(name: str) -> VehicleVariant:
    """The variant called ``name``; ``KeyError`` naming the known ones otherwise."""
    try:
        return VARIANTS[name]
    except KeyError:
        raise KeyError(f"unknown vehicle variant {name!r}; known: {', '.join(VARIANTS)}") from None
