/*
 * Crazyflie out-of-tree controller running an exported embodied policy.
 *
 * Who flies, every stabilizer tick (RATE_MAIN_LOOP, 1 kHz):
 *   - the policy, when its self-test passed and the policy fits this firmware's motor chain (at
 *     init), the `embodied.enable` parameter is 1 (default 0), the setpoint asks for an absolute
 *     position on x, y, z and an absolute yaw, a new setpoint arrived within
 *     QC_SETPOINT_TIMEOUT_MS, the estimate is finite and fresh, and the vehicle is inside the
 *     flight envelope the policy was trained in (policy_io.json extra.envelope, overridable by
 *     parameters);
 *   - otherwise the stock PID controller. The PID runs every tick into a command of its own
 *     (also while the policy flies), which is copied whole into `control` whenever it flies, so
 *     a handover back to it is immediate, finds its filters warm, and never mixes its fields
 *     with the policy's.
 * Engagement runs the policy on that very tick (its history freshly reset, like the start of a
 * simulated episode); afterwards it steps once per POLICY_CONTROL_PERIOD_US, counted from the
 * engagement tick, and the command is held in between. A non-finite or stale estimate, or leaving
 * the envelope while flying, hands over to the PID and clears `embodied.enable` (re-arm by
 * setting it to 1 again); `embodied.fault` says why.
 *
 * Observation: assembled by the portable quad_ctrl.c exactly as the simulator does
 * (docs/conventions.md) from the estimator's position, quaternion and velocity, the gyro
 * converted from deg/s to rad/s (body FLU, the Crazyflie body frame), the action history, and
 * the setpoint: position (m) and yaw (setpoint->attitude.yaw, degrees -> rad; the heading frame of docs/conventions.md),
 * and for a tracking policy (quad-track) the setpoint's feed-forward velocity (m/s) and
 * acceleration (m/s^2), setpoint->velocity / ->acceleration, world frame. Which commander sets
 * what (docs/conventions.md, "Moving setpoints"): the high-level commander's trajectories set
 * position, velocity, acceleration and yaw, all modeAbs (the policy tracks them); position
 * setpoints (cflib send_position_setpoint) set position and yaw with zero velocity and
 * acceleration (a fixed setpoint); full-state setpoints give the attitude as a quaternion with
 * mode.yaw = modeDisable, and velocity/hover/attitude setpoints are not absolute positions: in
 * those modes the PID flies.
 *
 * Output (the command chain of docs/conventions.md): per-motor thrust T_i = (a_i + 1) / 2 * POLICY_MAX_THRUST_PER_MOTOR_N,
 * zero below POLICY_MIN_THRUST_PER_MOTOR_N (as the simulator cuts it), sent as controlModeForce
 * with normalizedForces[i] = T_i / THRUST_MAX, THRUST_MAX being this firmware's own macro. The
 * firmware turns f back into f * THRUST_MAX newtons, inverts its motor-voltage thrust curve with
 * the filtered battery voltage and writes the PWM ratio (motorsCompensateBatteryVoltage), so the
 * thrust is the trained one on every accepted version. Arming, the supervisor and emergency stop
 * keep working because the command goes through the stabilizer's power distribution.
 *
 * Console output is plain text without conversions: the firmware's eprintf supports only a
 * small printf subset and loops forever on some formats (e.g. a two-digit precision).
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "FreeRTOS.h"
#include "app.h"
#include "controller.h"
#include "controller_pid.h"
#include "log.h"
#include "param.h"
#include "platform_defaults.h"
#include "task.h"

#define DEBUG_MODULE "EMBODIED"
#include "debug.h"

#include "policy_vehicle.h"
#include "quad_ctrl.h"

#ifndef CONFIG_ENABLE_THRUST_BAT_COMPENSATED
#error "CONFIG_ENABLE_THRUST_BAT_COMPENSATED is off: controlModeForce then skips the thrust curve and the policy's thrust commands would mean something else; enable it (default y) in the firmware config"
#endif
#if !defined(THRUST_MAX) || !defined(THRUST_MIN)
#error "this firmware's platform_defaults.h defines no THRUST_MAX / THRUST_MIN (crazyflie-firmware 2025.12 or newer, cf2 platform)"
#endif
#if !defined(POLICY_ACTION_MOTOR_THRUST_START) || !defined(POLICY_MAX_THRUST_PER_MOTOR_N) || \
    !defined(POLICY_MIN_THRUST_PER_MOTOR_N)
#error "policy.h lacks the motor_thrust action and extra max/min_thrust_per_motor_n (policy_io.json; docs/conventions.md); export a policy trained with the thrust action"
#endif

#define QC_DEG_TO_RAD 0.017453292519943295f

/* The firmware build this policy's vehicle variant needs (policy_vehicle.h, from policy_io.json)
   against this firmware's own Kconfig (autoconf.h): platform and Crazyflie 2.x propeller setup. */
#ifndef QC_VARIANT_NAME
#error "policy_vehicle.h names no vehicle variant; stage the app with embodied (firmware build / flash)"
#endif
#if defined(QC_VARIANT_PLATFORM_CF2) != defined(CONFIG_PLATFORM_CF2) || \
    defined(QC_VARIANT_PLATFORM_CF21BL) != defined(CONFIG_PLATFORM_CF21BL) || \
    defined(QC_VARIANT_CRAZYFLIE_LEGACY_PROPELLERS) != defined(CONFIG_CRAZYFLIE_LEGACY_PROPELLERS) || \
    defined(QC_VARIANT_CRAZYFLIE_21_PLUS) != defined(CONFIG_CRAZYFLIE_21_PLUS) || \
    defined(QC_VARIANT_CRAZYFLIE_THRUST_UPGRADE_KIT) != defined(CONFIG_CRAZYFLIE_THRUST_UPGRADE_KIT)
#define QC_PLATFORM_MATCHES 0
#else
#define QC_PLATFORM_MATCHES 1
#endif

#ifndef QC_SETPOINT_TIMEOUT_MS
#define QC_SETPOINT_TIMEOUT_MS 200
#endif
#ifndef QC_STALE_ESTIMATE_MS
#define QC_STALE_ESTIMATE_MS 100 /* the Kalman filter predicts at 100 Hz: 10 missed updates */
#endif

/* Flight envelope (docs/conventions.md): policy_io.json extra.envelope, else the training box. */
#if defined(POLICY_ENVELOPE_POS_ERR_M) && defined(POLICY_ENVELOPE_TILT_RAD) && defined(POLICY_ENVELOPE_ANG_VEL_RAD_S) && \
    defined(POLICY_ENVELOPE_LIN_VEL_M_S)
#define QC_ENVELOPE_FROM_POLICY 1
#define QC_ENV_POS_ERR_M POLICY_ENVELOPE_POS_ERR_M
#define QC_ENV_TILT_RAD POLICY_ENVELOPE_TILT_RAD
#define QC_ENV_ANG_VEL_RAD_S POLICY_ENVELOPE_ANG_VEL_RAD_S
#define QC_ENV_LIN_VEL_M_S POLICY_ENVELOPE_LIN_VEL_M_S
#else
#define QC_ENVELOPE_FROM_POLICY 0
#define QC_ENV_POS_ERR_M 0.6f
#define QC_ENV_TILT_RAD 1.6f
#define QC_ENV_ANG_VEL_RAD_S 10.0f
#define QC_ENV_LIN_VEL_M_S 3.0f
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


/* Why the policy is not flying (log embodied.fault); the last one that happened. */
enum {
    QC_FAULT_NONE = 0,
    QC_FAULT_SELFTEST = 1,     /* policy_selftest() failed at init: PID only until reboot */
    QC_FAULT_MOTOR_CHAIN = 2,  /* policy thrust range does not fit THRUST_MIN..THRUST_MAX */
    QC_FAULT_NON_FINITE = 3,   /* NaN/inf in the estimate, gyro or setpoint */
    QC_FAULT_STALE = 4,        /* the estimate stopped changing */
    QC_FAULT_ENVELOPE = 5,     /* left the flight envelope while flying */
    QC_FAULT_PLATFORM = 6,     /* policy trained for another Crazyflie variant than this build */
};

/* All state static: the stabilizer task stack is small (~1.8 kB). */
static qc_ctx_t qc_ctx;
static qc_state_t qc_state;
static control_t qc_pid_cmd; /* the PID's own command, every tick (see controllerOutOfTree) */
static float qc_action[POLICY_ACTION_DIM];
static float qc_forces[POLICY_ACTION_DIM]; /* log: normalizedForces sent, 0..1 of THRUST_MAX */
static uint8_t qc_enable;                  /* param: 1 lets the policy fly (default 0) */
static uint8_t qc_usable;                  /* 1 when self-test and motor-chain checks passed */
static uint8_t qc_selftest_ok;             /* log */
static uint8_t qc_active;                  /* log: 1 while the policy flies */
static uint8_t qc_fault;                   /* log: QC_FAULT_* */
static uint8_t qc_was_out;                 /* 1 while waiting outside the envelope (not a fault) */
static float qc_env_pos_err_m = QC_ENV_POS_ERR_M;         /* param */
static float qc_env_tilt_rad = QC_ENV_TILT_RAD;           /* param */
static float qc_env_ang_vel_rad_s = QC_ENV_ANG_VEL_RAD_S; /* param */
static float qc_env_lin_vel_m_s = QC_ENV_LIN_VEL_M_S;     /* param */
static uint32_t qc_engage_tick;
static uint32_t qc_last_setpoint_ts;
static uint32_t qc_last_fresh_tick;
static uint32_t qc_last_change_tick;
static float qc_yaw_sp_rad;         /* log */
static uint32_t qc_policy_steps;    /* log */
static uint32_t qc_engagements;     /* log */
static uint32_t qc_clamped_inputs;  /* log */
static uint32_t qc_clamped_outputs; /* log */

void appMain(void)
{
    DEBUG_PRINT("policy controller, model " POLICY_MODEL_SHA256 "\n");
    if (!QC_ENVELOPE_FROM_POLICY) {
        DEBUG_PRINT("policy_io.json has no envelope: using the training-box defaults\n");
    }
    while (1) {
        vTaskDelay(M2T(2000));
    }
}

/* Whether the policy's thrust range is what this firmware's force path can apply exactly. */
static bool qc_motor_chain_fits(void)
{
    const float t_max = (float)POLICY_MAX_THRUST_PER_MOTOR_N;
    const float t_min = (float)POLICY_MIN_THRUST_PER_MOTOR_N;
    /* Above THRUST_MAX the firmware clips f at 1; above the policy's minimum it would cut
       commands the policy expects to fly. */
    return t_max <= THRUST_MAX * 1.000001f && THRUST_MIN <= t_min * 1.000001f && t_min < t_max;
}

void controllerOutOfTreeInit(void)
{
    controllerPidInit();
    memset(&qc_pid_cmd, 0, sizeof(qc_pid_cmd)); /* as stabilizer.c's static control at boot */
    qc_selftest_ok = (uint8_t)policy_selftest();
    qc_usable = 0;
    qc_enable = 0; /* disarmed at every (re)initialisation, not only at boot */
    qc_active = 0;
    qc_was_out = 0;
    qc_fault = QC_FAULT_NONE;
    qc_policy_steps = 0;
    qc_engagements = 0;
    qc_last_setpoint_ts = 0;
    qc_last_fresh_tick = 0;
    qc_last_change_tick = 0;
    qc_reset(&qc_ctx, QC_INITIAL_ACTION);
    if (!QC_PLATFORM_MATCHES) {
        qc_fault = QC_FAULT_PLATFORM;
        DEBUG_PRINT("policy trained for " QC_VARIANT_NAME ", not this firmware platform: the PID controller flies\n");
    } else if (!qc_selftest_ok) {
        qc_fault = QC_FAULT_SELFTEST;
        DEBUG_PRINT("policy self-test failed: the PID controller flies\n");
    } else if (!qc_motor_chain_fits()) {
        qc_fault = QC_FAULT_MOTOR_CHAIN;
        DEBUG_PRINT("policy thrust range outside THRUST_MIN..THRUST_MAX: the PID controller flies\n");
    } else {
        qc_usable = 1;
    }
}

bool controllerOutOfTreeTest(void)
{
    /* A failed policy self-test must not fail the system test: the PID still flies. */
    return controllerPidTest();
}

static bool qc_finite(float v)
{
    return v == v && fabsf(v) <= 3.0e38f;
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
    return setpoint->mode.x == modeAbs && setpoint->mode.y == modeAbs && setpoint->mode.z == modeAbs &&
           setpoint->mode.yaw == modeAbs;
}

/* The estimate, gyro and setpoint of this tick: pos_w, quat (w, x, y, z), lin_vel_w, gyro
   (deg/s), setpoint position (m), yaw (deg), velocity (m/s) and acceleration (m/s^2). */
#define QC_INPUTS 23
#define QC_ESTIMATE_INPUTS 10 /* pos, quat, vel: what a running estimator keeps changing */
static float qc_in[QC_INPUTS];
static float qc_prev_estimate[QC_ESTIMATE_INPUTS];

/* Copy the inputs into qc_state (gyro deg/s -> rad/s); false when anything is non-finite. */
static bool qc_read_state(const sensorData_t *sensors, const state_t *state, const setpoint_t *setpoint)
{
    int i;
    qc_in[0] = state->position.x;
    qc_in[1] = state->position.y;
    qc_in[2] = state->position.z;
    qc_in[3] = state->attitudeQuaternion.w;
    qc_in[4] = state->attitudeQuaternion.x;
    qc_in[5] = state->attitudeQuaternion.y;
    qc_in[6] = state->attitudeQuaternion.z;
    qc_in[7] = state->velocity.x;
    qc_in[8] = state->velocity.y;
    qc_in[9] = state->velocity.z;
    qc_in[10] = sensors->gyro.x;
    qc_in[11] = sensors->gyro.y;
    qc_in[12] = sensors->gyro.z;
    qc_in[13] = setpoint->position.x;
    qc_in[14] = setpoint->position.y;
    qc_in[15] = setpoint->position.z;
    qc_in[16] = setpoint->attitude.yaw;
    qc_in[17] = setpoint->velocity.x;
    qc_in[18] = setpoint->velocity.y;
    qc_in[19] = setpoint->velocity.z;
    qc_in[20] = setpoint->acceleration.x;
    qc_in[21] = setpoint->acceleration.y;
    qc_in[22] = setpoint->acceleration.z;
    for (i = 0; i < QC_INPUTS; ++i) {
        if (!qc_finite(qc_in[i])) {
            return false;
        }
    }
    for (i = 0; i < 3; ++i) {
        qc_state.pos_w[i] = qc_in[i];
        qc_state.lin_vel_w[i] = qc_in[7 + i];
        qc_state.ang_vel_b[i] = qc_in[10 + i] * QC_DEG_TO_RAD;
    }
    for (i = 0; i < 4; ++i) {
        qc_state.quat_wb[i] = qc_in[3 + i];
    }
    qc_yaw_sp_rad = qc_in[16] * QC_DEG_TO_RAD;
    return true;
}

/* False once position, attitude and velocity have not changed for QC_STALE_ESTIMATE_MS. */
static bool qc_estimate_fresh(stabilizerStep_t tick)
{
    bool changed = false;
    int i;
    for (i = 0; i < QC_ESTIMATE_INPUTS; ++i) {
        if (qc_in[i] != qc_prev_estimate[i]) {
            changed = true;
            qc_prev_estimate[i] = qc_in[i];
        }
    }
    if (changed) {
        qc_last_change_tick = tick;
    }
    return (uint32_t)(tick - qc_last_change_tick) <= (uint32_t)((QC_STALE_ESTIMATE_MS * RATE_MAIN_LOOP) / 1000);
}

/* Inside the envelope: every heading-frame position-error axis, the tilt, |body rate| and
   |velocity| below their bounds (a unit quaternion is assumed; quad_ctrl renormalizes). */
static bool qc_inside_envelope(const float setpoint_w[3])
{
    const float ex = qc_state.pos_w[0] - setpoint_w[0];
    const float ey = qc_state.pos_w[1] - setpoint_w[1];
    const float ez = qc_state.pos_w[2] - setpoint_w[2];
    const float c = cosf(qc_yaw_sp_rad), s = sinf(qc_yaw_sp_rad);
    const float *q = qc_state.quat_wb;
    const float n2 = q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3];
    /* R_wb[2][2] = cos(tilt) for a unit quaternion; divided by |q|^2 for any other. */
    const float cos_tilt = (q[0] * q[0] - q[1] * q[1] - q[2] * q[2] + q[3] * q[3]) / (n2 > 0.0f ? n2 : 1.0f);
    const float *w = qc_state.ang_vel_b;
    const float *v = qc_state.lin_vel_w;
    const float bound = qc_env_pos_err_m;
    if (fabsf(c * ex + s * ey) > bound || fabsf(-s * ex + c * ey) > bound || fabsf(ez) > bound) {
        return false;
    }
    if (!(n2 > 0.25f) || cos_tilt < cosf(qc_env_tilt_rad)) {
        return false;
    }
    if (w[0] * w[0] + w[1] * w[1] + w[2] * w[2] > qc_env_ang_vel_rad_s * qc_env_ang_vel_rad_s) {
        return false;
    }
    return v[0] * v[0] + v[1] * v[1] + v[2] * v[2] <= qc_env_lin_vel_m_s * qc_env_lin_vel_m_s;
}

/* Stop flying the policy because of `fault`; the operator re-arms with embodied.enable = 1. */
static void qc_disengage(uint8_t fault)
{
    qc_active = 0;
    qc_enable = 0;
    qc_fault = fault;
    if (fault == QC_FAULT_NON_FINITE) {
        DEBUG_PRINT("non-finite estimate: PID flies, set embodied.enable to re-arm\n");
    } else if (fault == QC_FAULT_STALE) {
        DEBUG_PRINT("stale estimate: PID flies, set embodied.enable to re-arm\n");
    } else {
        DEBUG_PRINT("left the flight envelope: PID flies, set embodied.enable to re-arm\n");
    }
}

/* The motor command of action a in [-1, 1] (the command chain of docs/conventions.md): T / THRUST_MAX, 0 below the cut. */
static float qc_force_of_action(float a)
{
    const float thrust_n = 0.5f * (a + 1.0f) * (float)POLICY_MAX_THRUST_PER_MOTOR_N;
    if (!(thrust_n >= (float)POLICY_MIN_THRUST_PER_MOTOR_N)) {
        return 0.0f;
    }
    return thrust_n / THRUST_MAX;
}

/* Who flies this tick: 1 the policy, 0 the PID; disengages (with a fault) where needed. */
static bool qc_decide(const setpoint_t *setpoint, const sensorData_t *sensors, const state_t *state,
                      stabilizerStep_t tick, qc_setpoint_t *sp)
{
    const bool finite = qc_read_state(sensors, state, setpoint);
    const bool fresh = finite && qc_estimate_fresh(tick);
    const bool wanted = qc_enable && qc_usable && qc_setpoint_usable(setpoint, tick);
    int i;
    if (!wanted) {
        qc_active = 0; /* disarmed, setpoints stopped or changed mode: a plain handover */
        return false;
    }
    if (!finite || !fresh) {
        if (qc_active) {
            qc_disengage(finite ? QC_FAULT_STALE : QC_FAULT_NON_FINITE);
        }
        return false;
    }
    for (i = 0; i < 3; ++i) {
        sp->pos_w[i] = qc_in[13 + i];
        sp->vel_w[i] = qc_in[17 + i];
        sp->acc_w[i] = qc_in[20 + i];
    }
    sp->yaw_rad = qc_yaw_sp_rad;
    if (!qc_inside_envelope(sp->pos_w)) {
        if (qc_active) {
            qc_disengage(QC_FAULT_ENVELOPE);
        }
        qc_was_out = 1; /* not engaged yet: the PID brings it in, then the policy takes over */
        return false;
    }
    qc_was_out = 0;
    if (!qc_active) {
        /* Engage: fresh history (the start of a simulated episode) and a policy step now. */
        qc_reset(&qc_ctx, QC_INITIAL_ACTION);
        qc_active = 1;
        qc_fault = QC_FAULT_NONE;
        qc_engage_tick = tick;
        ++qc_engagements;
    }
    return true;
}

void controllerOutOfTree(control_t *control, const setpoint_t *setpoint, const sensorData_t *sensors,
                         const state_t *state, const stabilizerStep_t stabilizerStep)
{
    qc_setpoint_t sp;
    int i;
    const bool policy_flies = qc_decide(setpoint, sensors, state, stabilizerStep, &sp);
    /* The PID runs every tick into its own command, kept across ticks exactly as stabilizer.c
       keeps `control` for a controller that flies alone. It writes thrust and the legacy mode
       on every tick but roll/pitch/yaw only on attitude-rate ticks (controller_pid.c), so
       running it on `control` after a force-mode tick would leave the policy's
       normalizedForces in roll/pitch/yaw (the same union) on an odd-tick hand-back. */
    controllerPid(&qc_pid_cmd, setpoint, sensors, state, stabilizerStep);
    if (!policy_flies) {
        *control = qc_pid_cmd;
        return;
    }
    if (((uint32_t)(stabilizerStep - qc_engage_tick) % QC_DECIMATION) == 0) {
        qc_step_sp(&qc_ctx, &qc_state, &sp, qc_action);
        for (i = 0; i < POLICY_ACTION_DIM; ++i) {
            qc_forces[i] = qc_force_of_action(qc_action[i]);
        }
        ++qc_policy_steps;
        qc_clamped_inputs = qc_ctx.clamped_inputs;
        qc_clamped_outputs = qc_ctx.clamped_outputs;
    }
    control->controlMode = controlModeForce;
    for (i = 0; i < STABILIZER_NR_OF_MOTORS; ++i) {
        control->normalizedForces[i] = qc_forces[i];
    }
}

PARAM_GROUP_START(embodied)
PARAM_ADD(PARAM_UINT8, enable, &qc_enable)
PARAM_ADD(PARAM_FLOAT, envPos, &qc_env_pos_err_m)
PARAM_ADD(PARAM_FLOAT, envTilt, &qc_env_tilt_rad)
PARAM_ADD(PARAM_FLOAT, envAngVel, &qc_env_ang_vel_rad_s)
PARAM_ADD(PARAM_FLOAT, envLinVel, &qc_env_lin_vel_m_s)
PARAM_GROUP_STOP(embodied)

LOG_GROUP_START(embodied)
LOG_ADD(LOG_UINT8, active, &qc_active)
LOG_ADD(LOG_UINT8, selftest, &qc_selftest_ok)
LOG_ADD(LOG_UINT8, fault, &qc_fault)
LOG_ADD(LOG_UINT8, waitEnv, &qc_was_out)
LOG_ADD(LOG_UINT32, steps, &qc_policy_steps)
LOG_ADD(LOG_UINT32, engaged, &qc_engagements)
LOG_ADD(LOG_UINT32, clampIn, &qc_clamped_inputs)
LOG_ADD(LOG_UINT32, clampOut, &qc_clamped_outputs)
LOG_ADD(LOG_FLOAT, yawSp, &qc_yaw_sp_rad)
LOG_ADD(LOG_FLOAT, f1, &qc_forces[0])
LOG_ADD(LOG_FLOAT, f2, &qc_forces[1])
LOG_ADD(LOG_FLOAT, f3, &qc_forces[2])
LOG_ADD(LOG_FLOAT, f4, &qc_forces[3])
LOG_GROUP_STOP(embodied)
