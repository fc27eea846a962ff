/*
 * Host model of crazyflie-firmware's stabilizer loop around the out-of-tree app, for the
 * real-firmware tier (tests/test_firmware_real.py): compiled with the tree's own
 * controller_pid.c (and the attitude/position PID, pid.c, filter.c, num.c it needs) and
 * power_distribution_quadrotor.c, plus motorsCompensateBatteryVoltage extracted from its
 * motors.c. Like stabilizer.c it keeps one static control_t across ticks, starts at step 1, and
 * turns the command into PWM: powerDistribution -> battery compensation -> powerDistributionCap.
 * Limits: a fixed supply voltage (3.9 V) instead of the stabilizer's low-pass filtered battery
 * voltage; no supervisor, commander, estimator or collision avoidance (the setpoint and state
 * are written here).
 *
 * Usage: stabilizer_handback app|pid HAND_BACK_TICK disarm|nan|stale
 *   app: controllerOutOfTree flies (the policy from tick 200, armed through its parameter);
 *   pid: controllerPid alone on the same inputs, the reference.
 * Prints "tick mode m1 m2 m3 m4" (PWM) for every tick from HAND_BACK_TICK - 2 to + 8.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "controller_policy.c" /* the app's own source: the harness arms it through qc_enable */
#include "power_distribution.h"

float motorsCompensateBatteryVoltage(uint32_t id, float iThrust, float supplyVoltage);

#define ENGAGE_TICK 200
#define SUPPLY_V 3.9f

static control_t control; /* stabilizer.c: static, kept across ticks */

static void motor_pwm(const control_t *c, uint16_t pwm[4])
{
    motors_thrust_uncapped_t uncapped, compensated;
    motors_thrust_pwm_t capped;
    int i;
    powerDistribution(c, &uncapped);
    for (i = 0; i < STABILIZER_NR_OF_MOTORS; ++i) {
        compensated.list[i] = (int32_t)motorsCompensateBatteryVoltage((uint32_t)i, (float)uncapped.list[i], SUPPLY_V);
    }
    powerDistributionCap(&compensated, &capped);
    for (i = 0; i < STABILIZER_NR_OF_MOTORS; ++i) {
        pwm[i] = capped.list[i];
    }
}

int main(int argc, char **argv)
{
    const int use_app = argc == 4 && strcmp(argv[1], "app") == 0;
    const stabilizerStep_t hand_back = argc == 4 ? (stabilizerStep_t)atoi(argv[2]) : 0;
    const char *how = argc == 4 ? argv[3] : "";
    stabilizerStep_t step;
    if (argc != 4 || hand_back < ENGAGE_TICK + 202) {
        fprintf(stderr, "usage: %s app|pid HAND_BACK_TICK(>=%d) disarm|nan|stale\n", argv[0], ENGAGE_TICK + 202);
        return 2;
    }
    if (use_app) {
        controllerOutOfTreeInit();
        if (!controllerOutOfTreeTest() || !qc_usable) {
            fprintf(stderr, "the app is not usable (self-test %d, fault %d)\n", qc_selftest_ok, qc_fault);
            return 3;
        }
    } else {
        controllerPidInit();
    }
    for (step = 1; step <= hand_back + 8; ++step) {
        setpoint_t setpoint;
        sensorData_t sensors;
        state_t state;
        uint16_t pwm[4];
        memset(&setpoint, 0, sizeof(setpoint));
        memset(&sensors, 0, sizeof(sensors));
        memset(&state, 0, sizeof(state));
        setpoint.mode.x = setpoint.mode.y = setpoint.mode.z = setpoint.mode.yaw = modeAbs;
        setpoint.position.z = 1.0f;
        /* A fresh setpoint every millisecond; "stale": none after hand_back - 201. */
        setpoint.timestamp = (strcmp(how, "stale") == 0 && step > hand_back - 201) ? hand_back - 201 : step;
        /* A live estimate near the setpoint, slightly tilted and turning. */
        state.position.x = 0.05f;
        state.position.y = -0.03f;
        state.position.z = 0.98f + 1e-6f * (float)step;
        state.attitude.roll = 2.0f;
        state.attitude.pitch = -1.5f;
        state.attitude.yaw = 3.0f;
        state.attitudeQuaternion.w = 0.999390827f;
        state.attitudeQuaternion.x = 0.017452406f;
        state.attitudeQuaternion.y = 0.013089596f;
        state.attitudeQuaternion.z = 0.026176948f;
        state.velocity.z = 0.02f;
        sensors.gyro.x = 4.0f;
        sensors.gyro.y = -3.0f;
        sensors.gyro.z = 2.0f;
        sensors.acc.z = 1.0f;
        if (step == hand_back && strcmp(how, "nan") == 0) {
            state.position.z = NAN;
        }
        if (use_app) {
            if (step == ENGAGE_TICK) {
                qc_enable = 1;
            }
            if (step == hand_back && strcmp(how, "disarm") == 0) {
                qc_enable = 0;
            }
            controllerOutOfTree(&control, &setpoint, &sensors, &state, step);
            if (step >= ENGAGE_TICK + 1 && step < hand_back && control.controlMode != controlModeForce) {
                fprintf(stderr, "tick %lu: the policy does not fly (fault %d)\n", (unsigned long)step, qc_fault);
                return 4;
            }
        } else {
            controllerPid(&control, &setpoint, &sensors, &state, step);
        }
        motor_pwm(&control, pwm);
        if (step + 2 >= hand_back) {
            printf("%lu %d %u %u %u %u\n", (unsigned long)step, (int)control.controlMode, pwm[0], pwm[1], pwm[2], pwm[3]);
        }
    }
    return 0;
}
