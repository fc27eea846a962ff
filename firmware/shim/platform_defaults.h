/*
 * Shim of the firmware's platform_defaults.h: the motor and mass constants of one Crazyflie
 * build. A build that models a firmware tree passes that tree's own values (read from its
 * platform_defaults.h by embodied/crazyflie/firmware_tree.py) as SHIM_THRUST_MAX,
 * SHIM_THRUST_MIN, SHIM_VMOTOR2THRUST0..3 and SHIM_CF_MASS; without them the values are those of
 * crazyflie-firmware 2025.12's cf2 platform (platform_defaults_cf2.h, 2.1+ propellers):
 *   thrust per motor [N] = VMOTOR2THRUST0 + VMOTOR2THRUST1 v + VMOTOR2THRUST2 v^2 + VMOTOR2THRUST3 v^3,
 *   v = motor voltage [V]; commands below THRUST_MIN are cut to zero; f = 1 means THRUST_MAX.
 */
#ifndef SHIM_PLATFORM_DEFAULTS_H
#define SHIM_PLATFORM_DEFAULTS_H

#include "autoconf.h"

#ifdef CONFIG_ENABLE_THRUST_BAT_COMPENSATED
#ifdef SHIM_THRUST_MAX
#define VMOTOR2THRUST0 SHIM_VMOTOR2THRUST0
#define VMOTOR2THRUST1 SHIM_VMOTOR2THRUST1
#define VMOTOR2THRUST2 SHIM_VMOTOR2THRUST2
#define VMOTOR2THRUST3 SHIM_VMOTOR2THRUST3
#define THRUST_MIN SHIM_THRUST_MIN
#define THRUST_MAX SHIM_THRUST_MAX
#else
#define VMOTOR2THRUST0 -0.02476537915958403f
#define VMOTOR2THRUST1 0.06523793527519485f
#define VMOTOR2THRUST2 -0.026792504967750107f
#define VMOTOR2THRUST3 0.006776789303971145f
#define THRUST_MIN 0.02f
#define THRUST_MAX 0.1125f
#endif
#endif

#ifdef SHIM_CF_MASS
#define CF_MASS SHIM_CF_MASS
#else
#define CF_MASS 0.029f /* kg */
#endif

#endif
