/*
 * Crazyflie out-of-tree controller running an exported embodied policy.
 *
 * Every stabilizer tick (RATE_MAIN_LOOP, 1 kHz) the controller decides who flies:
 *   - the policy, when its self-test passed, the `embodied.enable` parameter is set, the
 *     setpoint asks for an absolute position on x, y and z, and a new setpoint arrived within
 *     QC_SETPOINT_TIMEOUT_MS;
 *   - otherwise the stock PID controller (which the commander also drives to a stop when
 *     setpoints cease).
 * The policy runs once per POLICY_CONTROL_PERIOD_US (decimating the 1 kHz loop); between
 * policy steps the last motor commands are held.
 *
 * Observation: assembled by the portable quad_ctrl.c exactly as the simulator does
 * (docs/conventions.md): position error vs the setpoint (world, m), R_wb from the estimator's
 * quaternion, world velocity (m/s), gyro converted from deg/s to rad/s (body FLU, which is the
 * Crazyflie body frame), and the action history.
 *
 * Output: controlModeForce with normalizedForces[i] = rpm_i / max_rpm in [0, 1] (M1..M4). The
 * stabilizer's power distribution turns that ratio into the 16-bit motor command (ratio *
 * 65535, the same value motorsSetRatio takes), so arming, the supervisor and emergency stop
 * keep working.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "FreeRTOS.h"
#include "app.h"
#include "controller.h"
#include "controller_pid.h"
#include "debug.h"
#include "log.h"
#include "param.h"
#include "task.h"

#include "quad_ctrl.h"

#define QC_DEG_TO_RAD 0.017453292519943295f

#ifndef QC_SETPOINT_TIMEOUT_MS
#define QC_SETPOINT_TIMEOUT_MS 200
#endif

/* Main-loop ticks per policy step, from policy_io.json's control period. */
#define QC_DECIMATION ((POLICY_CONTROL_PERIOD_US * RATE_MAIN_LOOP) / 1000000)
#if QC_DECIMATION < 1 || (QC_DECIMATION * 1000000) != (POLICY_CONTROL_PERIOD_US * RATE_MAIN_LOOP)
#error "the policy's control period is not a whole number of stabilizer ticks"
#endif
#define QC_TIMEOUT_TICKS ((QC_SETPOINT_TIMEOUT_MS * RATE_MAIN_LOOP) / 1000)

#ifdef POLICY_HOVER_ACTION
#define QC_INITIAL_ACTION POLICY_HOVER_ACTION
#else
#define QC_INITIAL_ACTION 0.0f
#endif

/* All state static: the stabilizer task stack is small (~1.8 kB). */
static qc_ctx_t qc_ctx;
static float qc_action[POLICY_ACTION_DIM];
static float qc_ratio[POLICY_ACTION_DIM];
static uint8_t qc_enable = 1;      /* param: let the policy fly */
static uint8_t qc_selftest_ok;     /* log: policy_selftest() result at init */
static uint8_t qc_active;          /* log: 1 while the policy flies */
static uint32_t qc_last_setpoint_ts;
static uint32_t qc_last_fresh_tick;
static uint32_t qc_policy_steps;   /* log */
static uint32_t qc_clamped_inputs; /* log */
static uint32_t qc_clamped_outputs;/* log */

void appMain(void)
{
    DEBUG_PRINT("embodied policy controller, model %.12s\n", POLICY_MODEL_SHA256);
    while (1) {
        vTaskDelay(M2T(2000));
    }
}

void controllerOutOfTreeInit(void)
{
    controllerPidInit();
    qc_selftest_ok = (uint8_t)policy_selftest();
    qc_reset(&qc_ctx, QC_INITIAL_ACTION);
    qc_active = 0;
    qc_policy_steps = 0;
    if (!qc_selftest_ok) {
        DEBUG_PRINT("policy self-test FAILED (max err %f): PID only\n", (double)policy_selftest_error());
    }
}

bool controllerOutOfTreeTest(void)
{
    return controllerPidTest() && qc_selftest_ok;
}

static bool qc_setpoint_usable(const setpoint_t *setpoint, stabilizerStep_t tick)
{
    if (setpoint->timestamp != qc_last_setpoint_ts) {
        qc_last_setpoint_ts = setpoint->timestamp;
        qc_last_fresh_tick = tick;
    }
    if ((uint32_t)(tick - qc_last_fresh_tick) > QC_TIMEOUT_TICKS) {
        return false;
    }
    return setpoint->mode.x == modeAbs && setpoint->mode.y == modeAbs && setpoint->mode.z == modeAbs;
}

void controllerOutOfTree(control_t *control, const setpoint_t *setpoint, const sensorData_t *sensors,
                         const state_t *state, const stabilizerStep_t stabilizerStep)
{
    int i;
    const bool fly = qc_enable && qc_selftest_ok && qc_setpoint_usable(setpoint, stabilizerStep);
    if (!fly) {
        qc_active = 0;
        controllerPid(control, setpoint, sensors, state, stabilizerStep);
        return;
    }
    if (!qc_active) {
        /* (Re)engaging: start from a fresh history, like the start of a simulated episode. */
        qc_reset(&qc_ctx, QC_INITIAL_ACTION);
        qc_active = 1;
    }
    if ((stabilizerStep % QC_DECIMATION) == 0) {
        static qc_state_t s; /* static: keep the stabilizer stack free */
        float setpoint_w[3];
        s.pos_w[0] = state->position.x;
        s.pos_w[1] = state->position.y;
        s.pos_w[2] = state->position.z;
        s.quat_wb[0] = state->attitudeQuaternion.w;
        s.quat_wb[1] = state->attitudeQuaternion.x;
        s.quat_wb[2] = state->attitudeQuaternion.y;
        s.quat_wb[3] = state->attitudeQuaternion.z;
        s.lin_vel_w[0] = state->velocity.x;
        s.lin_vel_w[1] = state->velocity.y;
        s.lin_vel_w[2] = state->velocity.z;
        s.ang_vel_b[0] = sensors->gyro.x * QC_DEG_TO_RAD;
        s.ang_vel_b[1] = sensors->gyro.y * QC_DEG_TO_RAD;
        s.ang_vel_b[2] = sensors->gyro.z * QC_DEG_TO_RAD;
        setpoint_w[0] = setpoint->position.x;
        setpoint_w[1] = setpoint->position.y;
        setpoint_w[2] = setpoint->position.z;
        qc_step(&qc_ctx, &s, setpoint_w, qc_action);
        for (i = 0; i < POLICY_ACTION_DIM; ++i) {
            qc_ratio[i] = qc_action_to_ratio(qc_action[i]);
        }
        ++qc_policy_steps;
        qc_clamped_inputs = qc_ctx.clamped_inputs;
        qc_clamped_outputs = qc_ctx.clamped_outputs;
    }
    control->controlMode = controlModeForce;
    for (i = 0; i < STABILIZER_NR_OF_MOTORS; ++i) {
        control->normalizedForces[i] = qc_ratio[i];
    }
}

PARAM_GROUP_START(embodied)
PARAM_ADD(PARAM_UINT8, enable, &qc_enable)
PARAM_GROUP_STOP(embodied)

LOG_GROUP_START(embodied)
LOG_ADD(LOG_UINT8, active, &qc_active)
LOG_ADD(LOG_UINT8, selftest, &qc_selftest_ok)
LOG_ADD(LOG_UINT32, steps, &qc_policy_steps)
LOG_ADD(LOG_UINT32, clampIn, &qc_clamped_inputs)
LOG_ADD(LOG_UINT32, clampOut, &qc_clamped_outputs)
LOG_ADD(LOG_FLOAT, m1, &qc_ratio[0])
LOG_ADD(LOG_FLOAT, m2, &qc_ratio[1])
LOG_ADD(LOG_FLOAT, m3, &qc_ratio[2])
LOG_ADD(LOG_FLOAT, m4, &qc_ratio[3])
LOG_GROUP_STOP(embodied)
