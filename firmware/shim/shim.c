/*
 * Test doubles for the firmware services the controller app calls, and a model of what the
 * firmware does with the app's command. They stand in for code that only runs on the drone
 * (PID controller, RTOS, console, power distribution, motor driver) and record what they were
 * asked. Limits, written here so nobody mistakes them for the firmware:
 *   - controllerPid is not the PID: it models the stock PID's tick pattern (legacy mode and
 *     thrust every tick, roll/pitch/yaw only on attitude-rate ticks, all zero at zero thrust)
 *     with a toy control law (altitude hold around 38000, a rate damper); the real-firmware
 *     tier runs the app with the tree's own controller_pid.c.
 *   - shim_debug_print accepts exactly the formats the firmware's eprintf handles (a subset of
 *     printf) and aborts the process on anything else; it does not reproduce eprintf's output
 *     byte for byte (its %f differs).
 *   - shim_motor_chain models controlModeForce and controlModeLegacy of crazyflie-firmware
 *     2025.12 to 2026.08 with battery compensation on and 2.1+ propellers
 *     (platform_defaults.h); controlModeForceTorque aborts. The real-firmware test tier
 *     (tests/test_firmware_real.py) checks this model against the firmware's own code.
 */
#include <ctype.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "FreeRTOS.h"
#include "controller_pid.h"
#include "debug.h"
#include "platform_defaults.h"
#include "task.h"

uint32_t shim_pid_calls;      /* controllerPid invocations */
uint32_t shim_pid_init_calls; /* controllerPidInit invocations */
uint32_t shim_debug_prints;   /* DEBUG_PRINT invocations */
char shim_console[4096];      /* everything DEBUG_PRINT wrote since the last shim_console_clear */
TickType_t shim_tick_ms;      /* what xTaskGetTickCount returns */

void shim_console_clear(void);
const char *shim_eprintf_problem(const char *fmt);
int shim_motor_chain(const control_t *control, float supply_voltage_v, uint16_t pwm[4], float thrust_n[4]);

void controllerPidInit(void)
{
    ++shim_pid_init_calls;
}

bool controllerPidTest(void)
{
    return true;
}

/* The stand-in PID's attitude-loop output (roll, pitch, yaw), kept between its attitude ticks. */
int16_t shim_pid_rpy[3];
float shim_pid_thrust; /* its thrust of the latest tick */

static int16_t shim_clamp_i16(float v)
{
    if (!(v == v)) {
        return 0; /* a NaN gyro: no correction (keeps the conversion defined) */
    }
    return (int16_t)(v > 20000.0f ? 20000.0f : (v < -20000.0f ? -20000.0f : v));
}

/* The tick pattern of crazyflie-firmware's controllerPid (controller_pid.c), not its control
   law: legacy mode and thrust on every tick, roll/pitch/yaw only on attitude-rate ticks
   (RATE_DO_EXECUTE(RATE_500_HZ, tick), every second tick), and everything zero when the thrust
   is zero. Fields it does not write keep what the caller's control_t held. */
void controllerPid(control_t *control, const setpoint_t *setpoint, const sensorData_t *sensors,
                   const state_t *state, const stabilizerStep_t stabilizerStep)
{
    ++shim_pid_calls;
    control->controlMode = controlModeLegacy;
    if (RATE_DO_EXECUTE(RATE_500_HZ, stabilizerStep)) {
        /* A rate damper (gain in PWM per deg/s), enough to give every axis a distinct value. */
        shim_pid_rpy[0] = shim_clamp_i16(-40.0f * sensors->gyro.x);
        shim_pid_rpy[1] = shim_clamp_i16(40.0f * sensors->gyro.y);
        shim_pid_rpy[2] = shim_clamp_i16(-40.0f * sensors->gyro.z);
        control->roll = shim_pid_rpy[0];
        control->pitch = shim_pid_rpy[1];
        control->yaw = shim_pid_rpy[2];
    }
    if (setpoint->mode.z == modeDisable) {
        shim_pid_thrust = setpoint->thrust;
    } else {
        /* Altitude hold around a hover command (PWM units, clamped like the PID's thrust base). */
        const float t = 38000.0f + 20000.0f * (setpoint->position.z - state->position.z);
        shim_pid_thrust = !(t >= 20000.0f) ? 20000.0f : (t > 60000.0f ? 60000.0f : t); /* NaN -> floor */
    }
    control->thrust = shim_pid_thrust;
    if (control->thrust == 0.0f) {
        control->roll = 0;
        control->pitch = 0;
        control->yaw = 0;
        shim_pid_rpy[0] = shim_pid_rpy[1] = shim_pid_rpy[2] = 0;
    }
}

/*
 * NULL when eprintf prints fmt, else why it does not. eprintf's grammar after '%': "%%", or any
 * number of '0' (pad), decimal digits (width), then characters up to the first letter where
 * only '.' followed by at most ONE digit (precision) is understood (anything else, including a
 * second precision digit or the end of the string, loops forever), then the conversion:
 * d i u x X f s c, or l / ll followed by d i u x X. Other letters print nothing and consume no
 * argument, so every later argument is read as the wrong one.
 */
const char *shim_eprintf_problem(const char *fmt)
{
    const char *p = fmt;
    while (*p) {
        if (*p++ != '%') {
            continue;
        }
        if (*p == '%') {
            ++p;
            continue;
        }
        while (*p == '0') {
            ++p;
        }
        while (isdigit((unsigned char)*p)) {
            ++p;
        }
        while (!isalpha((unsigned char)*p)) {
            if (*p != '.') {
                return "eprintf loops forever: after '%' only '0', a width, '.' and one precision digit may precede the conversion";
            }
            ++p;
            if (isdigit((unsigned char)*p)) {
                ++p;
            }
        }
        switch (*p++) {
        case 'd': case 'i': case 'u': case 'x': case 'X': case 'f': case 's': case 'c':
            break;
        case 'l':
            if (*p == 'l') {
                ++p;
            }
            if (*p != 'd' && *p != 'i' && *p != 'u' && *p != 'x' && *p != 'X') {
                return "eprintf ignores this %l conversion and misreads the arguments after it";
            }
            ++p;
            break;
        default:
            return "eprintf does not support this conversion (prints nothing, consumes no argument)";
        }
    }
    return NULL;
}

void shim_console_clear(void)
{
    shim_console[0] = '\0';
}

void shim_debug_print(const char *fmt, ...)
{
    const char *problem = shim_eprintf_problem(fmt);
    size_t used = 0;
    va_list ap;
    if (problem != NULL) {
        fprintf(stderr, "shim DEBUG_PRINT: %s; format \"%s\"\n", problem, fmt);
        fflush(stderr);
        abort();
    }
    ++shim_debug_prints;
    while (used < sizeof(shim_console) - 1 && shim_console[used] != '\0') {
        ++used;
    }
    va_start(ap, fmt);
    /* Every format eprintf accepts means the same in vsnprintf (output detail aside). */
    vsnprintf(shim_console + used, sizeof(shim_console) - used, fmt, ap);
    va_end(ap);
}

void vTaskDelay(TickType_t ticks)
{
    shim_tick_ms += ticks;
}

TickType_t xTaskGetTickCount(void)
{
    return shim_tick_ms;
}

/* Thrust [N] of one motor at motor voltage v [V]: the firmware's published cubic fit. */
static double shim_thrust_of_voltage(double v)
{
    return (double)VMOTOR2THRUST0 +
           v * ((double)VMOTOR2THRUST1 + v * ((double)VMOTOR2THRUST2 + v * (double)VMOTOR2THRUST3));
}

/* Motor voltage giving thrust_n: bisection on [0, 10] V (the fit rises monotonically there). */
static double shim_voltage_of_thrust(double thrust_n)
{
    double lo = 0.0, hi = 10.0;
    int i;
    for (i = 0; i < 60; ++i) {
        const double mid = 0.5 * (lo + hi);
        if (shim_thrust_of_voltage(mid) < thrust_n) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return 0.5 * (lo + hi);
}

/*
 * What the stabilizer does with a control_t after the controller: power distribution to a
 * 16-bit thrust per motor, battery compensation (thrust f * THRUST_MAX [N] -> motor voltage by
 * inverting the fit -> PWM ratio = V / supply voltage, zero below THRUST_MIN or under 2 V
 * supply), capping at 65535, and the thrust the motor then produces at that PWM. Writes pwm[4]
 * and thrust_n[4]; returns 0, or aborts on a control mode it does not model.
 */
int shim_motor_chain(const control_t *control, float supply_voltage_v, uint16_t pwm[4], float thrust_n[4])
{
    double uncapped[4];
    int i;
#ifndef CONFIG_ENABLE_THRUST_BAT_COMPENSATED
    (void)control;
    (void)supply_voltage_v;
    (void)pwm;
    (void)thrust_n;
    (void)uncapped;
    (void)i;
    fprintf(stderr, "shim_motor_chain: battery compensation off is not modelled\n");
    abort();
#else
    if (control->controlMode == controlModeForce) {
        for (i = 0; i < 4; ++i) {
            double f = (double)control->normalizedForces[i];
            f = f < 0.0 ? 0.0 : (f > 1.0 ? 1.0 : f);
            uncapped[i] = f * 65535.0;
        }
    } else if (control->controlMode == controlModeLegacy) {
        /* Legacy mixer (power_distribution_quadrotor.c): roll/pitch halved, yaw added to M1/M3. */
        const double r = (double)(int16_t)(control->roll / 2.0f), p = (double)(int16_t)(control->pitch / 2.0f);
        const double t = (double)control->thrust, y = (double)control->yaw;
        uncapped[0] = t - r + p + y;
        uncapped[1] = t - r - p - y;
        uncapped[2] = t + r - p + y;
        uncapped[3] = t + r + p - y;
    } else {
        fprintf(stderr, "shim_motor_chain: control mode %d is not modelled\n", (int)control->controlMode);
        abort();
    }
    for (i = 0; i < 4; ++i) {
        const double wanted_n = uncapped[i] / 65535.0 * (double)THRUST_MAX;
        double ratio = 0.0;
        if (supply_voltage_v >= 2.0f && wanted_n >= (double)THRUST_MIN) {
            ratio = shim_voltage_of_thrust(wanted_n) / (double)supply_voltage_v;
        }
        ratio = ratio > 1.0 ? 1.0 : ratio;
        pwm[i] = (uint16_t)(ratio * 65535.0);
        thrust_n[i] = pwm[i] == 0 ? 0.0f
                                  : (float)shim_thrust_of_voltage((double)supply_voltage_v * (double)pwm[i] / 65535.0);
    }
    return 0;
#endif
}
