/*
 * Portable quadrotor policy controller: observation assembly, safety clamps, action history.
 *
 * No Crazyflie, RTOS or OS headers: the same file is compiled into the Crazyflie app, the
 * QEMU target and the host (software-in-the-loop) library. Layouts and constants come from
 * the generated policy.h (itself generated from policy_io.json); see docs/conventions.md.
 *
 * Frames and units of qc_state_t (identical to the simulator's raw state):
 *   pos_w      [3] m, world (z up)
 *   quat_wb    [4] (w, x, y, z), rotates body vectors into the world
 *   lin_vel_w  [3] m/s, world
 *   ang_vel_b  [3] rad/s, body FLU
 *
 * The setpoint is a world position setpoint_w [3] (m) and a yaw yaw_sp_rad (rad). The
 * observation is expressed in the setpoint's heading frame h, the world rotated about z by
 * yaw_sp_rad (R_wh = Rz(yaw_sp_rad)), in the order of docs/conventions.md:
 *   pos_err_h = R_wh^T (pos_w - setpoint_w), rot_hb = R_wh^T R_wb (row-major),
 *   lin_vel_h = R_wh^T lin_vel_w, ang_vel_b, [pos_err_int_h], [prev_actions].
 * cos/sin of the yaw are evaluated in double and rounded to float, as the simulator does, so
 * the heading-frame values equal the simulator's bit for bit for the same inputs.
 *
 * Moving setpoints (tracking policies, policy.h defines POLICY_OBS_LIN_VEL_ERR_H_START): the
 * setpoint also carries a feed-forward velocity vel_w [3] (m/s) and acceleration acc_w [3] (m/s^2),
 * world frame (qc_setpoint_t; on the Crazyflie setpoint_t.velocity / .acceleration in modeAbs),
 * and the observation is, in the order of docs/conventions.md (tracking section):
 *   pos_err_h, rot_hb, lin_vel_err_h = R_wh^T (lin_vel_w - vel_w), ang_vel_b, acc_sp_h = R_wh^T acc_w,
 *   [pos_err_int_h], [prev_actions].
 * A hover policy (lin_vel_h) ignores vel_w and acc_w.
 *
 * Optional position-error integral: when policy.h defines POLICY_OBS_POS_ERR_INT_H_START (the
 * task was trained with pos_err_integral), the context keeps pos_err_int_h [3] (m*s, heading).
 * qc_reset zeroes it; every qc_step after the first one since the reset first updates it from
 * the current (sanitized) heading-frame position error e = pos_err_h, per axis, as the task does:
 *   I = clamp(POLICY_POS_ERR_INT_DECAY * I + POLICY_POS_ERR_INT_DT_S * e, +-POLICY_POS_ERR_INT_LIMIT_MS)
 * so the first observation after a reset carries I = 0, like the first one of an episode.
 */
#ifndef EMBODIED_QUAD_CTRL_H
#define EMBODIED_QUAD_CTRL_H

#include <stdint.h>

#include "policy.h"

#ifndef POLICY_ACTION_HISTORY
#define POLICY_ACTION_HISTORY 0
#endif

#if POLICY_ACTION_DIM != 4
#error "quad_ctrl needs a policy with 4 actions (motors M1..M4)"
#endif

/* Limits on the raw inputs: far outside anything the policy was trained on, so in-range
   states pass bit-exactly; beyond them the value is clamped (and counted), NaN/inf become 0. */
#ifndef QC_POS_ERR_LIMIT_M
#define QC_POS_ERR_LIMIT_M 2.0f
#endif
#ifndef QC_LIN_VEL_LIMIT_MPS
#define QC_LIN_VEL_LIMIT_MPS 10.0f
#endif
#ifndef QC_ANG_VEL_LIMIT_RAD_S
#define QC_ANG_VEL_LIMIT_RAD_S 35.0f /* the Crazyflie gyro saturates at 2000 deg/s */
#endif

#ifdef POLICY_OBS_POS_ERR_INT_H_START
#define QC_POS_ERR_INTEGRAL 1
#if !defined(POLICY_POS_ERR_INT_DECAY) || !defined(POLICY_POS_ERR_INT_LIMIT_MS) || !defined(POLICY_POS_ERR_INT_DT_S)
#error "policy.h has pos_err_int_h but lacks POLICY_POS_ERR_INT_DECAY / _LIMIT_MS / _DT_S (policy_io.json extra)"
#endif
#else
#define QC_POS_ERR_INTEGRAL 0
#endif

#ifdef POLICY_OBS_LIN_VEL_ERR_H_START
#define QC_TRACKING 1
#if !defined(POLICY_OBS_ACC_SP_H_START) || POLICY_OBS_ACC_SP_H_SIZE != 3 || POLICY_OBS_LIN_VEL_ERR_H_SIZE != 3
#error "policy.h: a tracking policy (lin_vel_err_h) needs acc_sp_h [3] and a 3-entry lin_vel_err_h"
#endif
#else
#define QC_TRACKING 0
#endif
#ifndef QC_ACC_LIMIT_MPS2
#define QC_ACC_LIMIT_MPS2 20.0f
#endif

#define QC_HISTORY_FLOATS (POLICY_ACTION_HISTORY * POLICY_ACTION_DIM)
#define QC_STATE_FLOATS 13 /* pos_w, quat_wb, lin_vel_w, ang_vel_b packed in this order */

typedef struct {
    float pos_w[3];
    float quat_wb[4];
    float lin_vel_w[3];
    float ang_vel_b[3];
} qc_state_t;

/* A (possibly moving) setpoint, world frame: what the Crazyflie commander's setpoint_t carries in
   modeAbs (position, feed-forward velocity and acceleration, yaw). */
typedef struct {
    float pos_w[3]; /* m */
    float vel_w[3]; /* m/s, feed-forward (0 for a fixed setpoint) */
    float acc_w[3]; /* m/s^2, feed-forward (0 for a fixed setpoint) */
    float yaw_rad;  /* rad, defines the heading frame */
} qc_setpoint_t;

typedef struct {
    /* The last POLICY_ACTION_HISTORY actions sent, newest first (one slot if none kept). */
    float prev_actions[QC_HISTORY_FLOATS > 0 ? QC_HISTORY_FLOATS : 1];
#if QC_POS_ERR_INTEGRAL
    float pos_err_int_h[3];       /* m*s, heading frame: leaky clamped integral of the position error */
    uint32_t pos_err_int_started; /* 0 until the first qc_step after qc_reset (which keeps I = 0) */
#endif
    uint32_t clamped_inputs;  /* raw inputs replaced or clamped since qc_reset */
    uint32_t clamped_outputs; /* action entries replaced or clamped since qc_reset */
} qc_ctx_t;

/* Fill the action history with initial_action (normalized, e.g. the hover command); zero the
   position-error integral when the policy has one. */
void qc_reset(qc_ctx_t *ctx, float initial_action);

/* obs[POLICY_OBS_DIM] from a raw state, a world-frame position setpoint [3] (m) and the setpoint
   yaw (rad, world; NaN/inf count as clamped and read as 0); the position-error integral (if
   any) is read from ctx as it stands (qc_step updates it first). Returns how many raw inputs
   were clamped or replaced (0 for any sane state). */
uint32_t qc_assemble_obs(const qc_ctx_t *ctx, const qc_state_t *state, const float setpoint_w[3], float yaw_sp_rad,
                         float obs[POLICY_OBS_DIM]);

/* qc_assemble_obs for a moving setpoint (position, feed-forward velocity and acceleration, yaw);
   a hover policy reads only its position and yaw. */
uint32_t qc_assemble_obs_sp(const qc_ctx_t *ctx, const qc_state_t *state, const qc_setpoint_t *sp,
                            float obs[POLICY_OBS_DIM]);

/* Update the position-error integral (if any), assemble, run policy_step, clamp the action
   to [-1, 1] (NaN -> 0), push it into the history. action[4] is normalized per docs/conventions.md. */
void qc_step(qc_ctx_t *ctx, const qc_state_t *state, const float setpoint_w[3], float yaw_sp_rad,
             float action[POLICY_ACTION_DIM]);

/* qc_step for a moving setpoint (see qc_assemble_obs_sp). */
void qc_step_sp(qc_ctx_t *ctx, const qc_state_t *state, const qc_setpoint_t *sp, float action[POLICY_ACTION_DIM]);


#endif /* EMBODIED_QUAD_CTRL_H */
