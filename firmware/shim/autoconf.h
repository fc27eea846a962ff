/*
 * Shim of the Kconfig-generated autoconf.h. The build passes the platform and propeller setup
 * of the firmware build it models (-DCONFIG_PLATFORM_CF2=1 -DCONFIG_CRAZYFLIE_21_PLUS=1, ...;
 * embodied.crazyflie.firmware_build.shim_defines); without them the firmware's defaults: cf2
 * platform with 2.1+ propellers. Battery-compensated thrust (CONFIG_ENABLE_THRUST_BAT_COMPENSATED,
 * default y) is on unless SHIM_NO_THRUST_BAT_COMPENSATED models a build with it turned off.
 */
#ifndef SHIM_AUTOCONF_H
#define SHIM_AUTOCONF_H

#if !defined(CONFIG_PLATFORM_CF2) && !defined(CONFIG_PLATFORM_CF21BL)
#define CONFIG_PLATFORM_CF2 1
#endif
#if defined(CONFIG_PLATFORM_CF2) && !defined(CONFIG_CRAZYFLIE_LEGACY_PROPELLERS) && \
    !defined(CONFIG_CRAZYFLIE_21_PLUS) && !defined(CONFIG_CRAZYFLIE_THRUST_UPGRADE_KIT)
#define CONFIG_CRAZYFLIE_21_PLUS 1
#endif
#ifndef SHIM_NO_THRUST_BAT_COMPENSATED
#define CONFIG_ENABLE_THRUST_BAT_COMPENSATED 1
#endif

#endif
