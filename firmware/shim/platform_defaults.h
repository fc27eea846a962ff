/*
 * Shim of the firmware's platform_defaults.h / platform_defaults_cf2.h: the motor constants of
 * the cf2 platform with 2.1+ propellers, per firmware release (SHIM_CF_FIRMWARE, YYYYMM; default
 * 202512). Values as published in crazyflie-firmware's src/platform/interface/
 * platform_defaults_cf2.h of each release (see docs/conventions.md):
 *   thrust per motor [N] = VMOTOR2THRUST0 + VMOTOR2THRUST1 v + VMOTOR2THRUST2 v^2 + VMOTOR2THRUST3 v^3,
 *   v = motor voltage [V]; commands below THRUST_MIN are cut to zero; f = 1 means THRUST_MAX.
 * Only the releases and the propeller setup listed here are modelled; anything else fails to
 * compile rather than fly a guess.
 */
#ifndef SHIM_PLATFORM_DEFAULTS_H
#define SHIM_PLATFORM_DEFAULTS_H

#include "autoconf.h"

#ifndef SHIM_CF_FIRMWARE
#define SHIM_CF_FIRMWARE 202512
#endif

#if SHIM_CF_FIRMWARE < 202512
#error "the shim models crazyflie-firmware 2025.12 and newer only (controlModeForce is not implemented before)"
#endif
#if SHIM_CF_FIRMWARE > 202608
#error "the shim models crazyflie-firmware up to 2026.08; add the newer release's constants after checking them"
#endif

#ifdef CONFIG_ENABLE_THRUST_BAT_COMPENSATED
#ifndef CONFIG_CRAZYFLIE_21_PLUS
#error "the shim models the 2.1+ propeller setup only"
#endif
#define VMOTOR2THRUST0 -0.02476537915958403f
#define VMOTOR2THRUST1 0.06523793527519485f
#define VMOTOR2THRUST2 -0.026792504967750107f
#define VMOTOR2THRUST3 0.006776789303971145f
#if SHIM_CF_FIRMWARE >= 202604
#define THRUST_MIN 0.012817578393224994f
#define THRUST_MAX 0.12f
#else
#define THRUST_MIN 0.02f
#define THRUST_MAX 0.1125f
#endif
#endif

#endif
