/*
 * Shim of the Kconfig-generated autoconf.h with the firmware's defaults for a Crazyflie 2.x:
 * cf2 platform, battery-compensated thrust (CONFIG_ENABLE_THRUST_BAT_COMPENSATED, default y)
 * and 2.1+ propellers (CONFIG_CRAZYFLIE_21_PLUS, the default setup). Define
 * SHIM_NO_THRUST_BAT_COMPENSATED to model a build with the compensation turned off.
 */
#ifndef SHIM_AUTOCONF_H
#define SHIM_AUTOCONF_H

#define CONFIG_PLATFORM_CF2 1
#ifndef SHIM_NO_THRUST_BAT_COMPENSATED
#define CONFIG_ENABLE_THRUST_BAT_COMPENSATED 1
#define CONFIG_CRAZYFLIE_21_PLUS 1
#endif

#endif
