/* Portable quadrotor policy controller; see quad_ctrl.h. C99, no dynamic memory. */
#include "quad_ctrl.h"

#include <math.h>

/* The velocity term: lin_vel_h (hover) or lin_vel_err_h (tracking, relative to the feed-forward velocity). */
#if QC_TRACKING
#define QC_OBS_VEL_START POLICY_OBS_LIN_VEL_ERR_H_START
#define QC_OBS_VEL_SCALE POLICY_OBS_LIN_VEL_ERR_H_SCALE
#elif defined(POLICY_OBS_LIN_VEL_H_START)
#define QC_OBS_VEL_START POLICY_OBS_LIN_VEL_H_START
#define QC_OBS_VEL_SCALE POLICY_OBS_LIN_VEL_H_SCALE
#if POLICY_OBS_LIN_VEL_H_SIZE != 3
#error "policy.h: lin_vel_h must have 3 entries"
#endif
#endif
#if !defined(POLICY_OBS_POS_ERR_H_START) || !defined(POLICY_OBS_ROT_HB_START) || !defined(QC_OBS_VEL_START) || \
    !defined(POLICY_OBS_ANG_VEL_B_START)
#error "policy.h lacks the heading-frame quad observation fields pos_err_h, rot_hb, lin_vel_h (or lin_vel_err_h), ang_vel_b (re-export a policy trained with the heading frame)"
#endif
#if POLICY_OBS_POS_ERR_H_SIZE != 3 || POLICY_OBS_ROT_HB_SIZE != 9 || POLICY_OBS_ANG_VEL_B_SIZE != 3
#error "policy.h: quad-hover observation field sizes differ from docs/conventions.md"
#endif
#if QC_POS_ERR_INTEGRAL && POLICY_OBS_POS_ERR_INT_H_SIZE != 3
#error "policy.h: pos_err_int_h must have 3 entries"
#endif
#if POLICY_ACTION_HISTORY > 0
#if !defined(POLICY_OBS_PREV_ACTIONS_START) || POLICY_OBS_PREV_ACTIONS_SIZE != QC_HISTORY_FLOATS
#error "policy.h: prev_actions field missing or not action_history * 4 long"
#endif
#endif

/* value clamped to [-limit, limit]; NaN/inf -> 0. Counts every change in *n_clamped. */
static float qc_sanitize(float value, float limit, uint32_t *n_clamped)
{
    if (!(value == value) || !(fabsf(value) <= 3.0e38f)) {
        ++*n_clamped;
        return 0.0f;
    }
    if (value > limit) {
        ++*n_clamped;
        return limit;
    }
    if (value < -limit) {
        ++*n_clamped;
        return -limit;
    }
    return value;
}

void qc_reset(qc_ctx_t *ctx, float initial_action)
{
    int i;
    for (i = 0; i < (int)(sizeof(ctx->prev_actions) / sizeof(ctx->prev_actions[0])); ++i) {
        ctx->prev_actions[i] = initial_action;
    }
    ctx->clamped_inputs = 0;
    ctx->clamped_outputs = 0;
#if QC_POS_ERR_INTEGRAL
    for (i = 0; i < 3; ++i) {
        ctx->pos_err_int_h[i] = 0.0f;
    }
    ctx->pos_err_int_started = 0;
#endif
}

/* (cos, sin) of the setpoint yaw: evaluated in double and rounded once, as the simulator's
   heading_cos_sin does, so both get identical floats. NaN/inf yaw -> heading 0 (counted). */
static void qc_heading(float yaw_sp_rad, float *c, float *s, uint32_t *n_clamped)
{
    const float yaw = qc_sanitize(yaw_sp_rad, 1.0e6f, n_clamped);
    *c = (float)cos((double)yaw);
    *s = (float)sin((double)yaw);
}

/* Sanitized world position error rotated into the heading frame: c x + s y, c y - s x, z (the
   simulator's vec_w_to_h, same operation order). */
static void qc_pos_err_h(const qc_state_t *state, const float setpoint_w[3], float c, float s, float err_h[3],
                         uint32_t *n_clamped)
{
    float e[3];
    int i;
    for (i = 0; i < 3; ++i) {
        e[i] = qc_sanitize(state->pos_w[i] - setpoint_w[i], QC_POS_ERR_LIMIT_M, n_clamped);
    }
    err_h[0] = c * e[0] + s * e[1];
    err_h[1] = c * e[1] - s * e[0];
    err_h[2] = e[2];
}

#if QC_POS_ERR_INTEGRAL
/* I = clamp(decay * I + dt * e) per axis with the current heading-frame position error
   (quad_ctrl.h); the first call after qc_reset leaves I = 0, as the task's first observation
   of an episode. */
static void qc_update_pos_err_int(qc_ctx_t *ctx, const qc_state_t *state, const float setpoint_w[3],
                                  float yaw_sp_rad)
{
    const float decay = (float)POLICY_POS_ERR_INT_DECAY;
    const float dt_s = (float)POLICY_POS_ERR_INT_DT_S;
    const float limit = (float)POLICY_POS_ERR_INT_LIMIT_MS;
    uint32_t not_counted = 0; /* qc_assemble_obs counts the same clamps */
    float c, s, err[3];
    int i;
    if (!ctx->pos_err_int_started) {
        ctx->pos_err_int_started = 1;
        return;
    }
    qc_heading(yaw_sp_rad, &c, &s, &not_counted);
    qc_pos_err_h(state, setpoint_w, c, s, err, &not_counted);
    for (i = 0; i < 3; ++i) {
        const float leaked = decay * ctx->pos_err_int_h[i];
        float v = leaked + dt_s * err[i];
        if (v > limit) {
            v = limit;
        } else if (v < -limit) {
            v = -limit;
        }
        ctx->pos_err_int_h[i] = v;
    }
}
#endif

/* A fixed setpoint: position and yaw, no feed-forward. */
static void qc_fixed_setpoint(const float setpoint_w[3], float yaw_sp_rad, qc_setpoint_t *sp)
{
    int i;
    for (i = 0; i < 3; ++i) {
        sp->pos_w[i] = setpoint_w[i];
        sp->vel_w[i] = 0.0f;
        sp->acc_w[i] = 0.0f;
    }
    sp->yaw_rad = yaw_sp_rad;
}

uint32_t qc_assemble_obs(const qc_ctx_t *ctx, const qc_state_t *state, const float setpoint_w[3], float yaw_sp_rad,
                         float obs[POLICY_OBS_DIM])
{
    qc_setpoint_t sp;
    qc_fixed_setpoint(setpoint_w, yaw_sp_rad, &sp);
    return qc_assemble_obs_sp(ctx, state, &sp, obs);
}

uint32_t qc_assemble_obs_sp(const qc_ctx_t *ctx, const qc_state_t *state, const qc_setpoint_t *sp,
                            float obs[POLICY_OBS_DIM])
{
    uint32_t n_clamped = 0;
    float q[4];
    float norm2, c, s, err_h[3], vel_w[3];
    int i;
    qc_heading(sp->yaw_rad, &c, &s, &n_clamped);
    qc_pos_err_h(state, sp->pos_w, c, s, err_h, &n_clamped);
    for (i = 0; i < 3; ++i) {
        vel_w[i] = qc_sanitize(state->lin_vel_w[i], QC_LIN_VEL_LIMIT_MPS, &n_clamped);
#if QC_TRACKING
        /* Velocity error to the feed-forward velocity, then rotated (the task's order). */
        vel_w[i] -= qc_sanitize(sp->vel_w[i], QC_LIN_VEL_LIMIT_MPS, &n_clamped);
#endif
        obs[POLICY_OBS_POS_ERR_H_START + i] = err_h[i] * POLICY_OBS_POS_ERR_H_SCALE;
        obs[POLICY_OBS_ANG_VEL_B_START + i] =
            qc_sanitize(state->ang_vel_b[i], QC_ANG_VEL_LIMIT_RAD_S, &n_clamped) * POLICY_OBS_ANG_VEL_B_SCALE;
    }
    obs[QC_OBS_VEL_START + 0] = (c * vel_w[0] + s * vel_w[1]) * QC_OBS_VEL_SCALE;
    obs[QC_OBS_VEL_START + 1] = (c * vel_w[1] - s * vel_w[0]) * QC_OBS_VEL_SCALE;
    obs[QC_OBS_VEL_START + 2] = vel_w[2] * QC_OBS_VEL_SCALE;
#if QC_TRACKING
    {
        float acc_w[3];
        for (i = 0; i < 3; ++i) {
            acc_w[i] = qc_sanitize(sp->acc_w[i], QC_ACC_LIMIT_MPS2, &n_clamped);
        }
        obs[POLICY_OBS_ACC_SP_H_START + 0] = (c * acc_w[0] + s * acc_w[1]) * POLICY_OBS_ACC_SP_H_SCALE;
        obs[POLICY_OBS_ACC_SP_H_START + 1] = (c * acc_w[1] - s * acc_w[0]) * POLICY_OBS_ACC_SP_H_SCALE;
        obs[POLICY_OBS_ACC_SP_H_START + 2] = acc_w[2] * POLICY_OBS_ACC_SP_H_SCALE;
    }
#endif
    for (i = 0; i < 4; ++i) {
        q[i] = qc_sanitize(state->quat_wb[i], 2.0f, &n_clamped);
    }
    norm2 = q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3];
    if (!(norm2 > 0.25f)) {
        /* No usable attitude: fall back to level so the matrix stays a rotation. */
        ++n_clamped;
        q[0] = 1.0f;
        q[1] = q[2] = q[3] = 0.0f;
    } else if (fabsf(norm2 - 1.0f) > 1.0e-3f) {
        /* Renormalize only off-unit input, so an estimator's unit quaternion passes untouched. */
        const float inv = 1.0f / sqrtf(norm2);
        for (i = 0; i < 4; ++i) {
            q[i] *= inv;
        }
    }
    {
        /* Row-major R_wb; every entry homogeneous quadratic in q (as in the simulator); then
           R_hb = R_wh^T R_wb mixes rows 0 and 1 like a vector (the simulator's rot_wb_to_hb). */
        const float w = q[0], x = q[1], y = q[2], z = q[3];
        float rwb[9];
        float *r = obs + POLICY_OBS_ROT_HB_START;
        const float k = POLICY_OBS_ROT_HB_SCALE;
        rwb[0] = w * w + x * x - y * y - z * z;
        rwb[1] = 2.0f * x * y - 2.0f * w * z;
        rwb[2] = 2.0f * x * z + 2.0f * w * y;
        rwb[3] = 2.0f * x * y + 2.0f * w * z;
        rwb[4] = w * w - x * x + y * y - z * z;
        rwb[5] = 2.0f * y * z - 2.0f * w * x;
        rwb[6] = 2.0f * x * z - 2.0f * w * y;
        rwb[7] = 2.0f * y * z + 2.0f * w * x;
        rwb[8] = w * w - x * x - y * y + z * z;
        for (i = 0; i < 3; ++i) {
            r[i] = (c * rwb[i] + s * rwb[3 + i]) * k;
            r[3 + i] = (c * rwb[3 + i] - s * rwb[i]) * k;
            r[6 + i] = rwb[6 + i] * k;
        }
    }
#if QC_POS_ERR_INTEGRAL
    for (i = 0; i < 3; ++i) {
        obs[POLICY_OBS_POS_ERR_INT_H_START + i] = ctx->pos_err_int_h[i] * POLICY_OBS_POS_ERR_INT_H_SCALE;
    }
#endif
#if POLICY_ACTION_HISTORY > 0
    for (i = 0; i < QC_HISTORY_FLOATS; ++i) {
        obs[POLICY_OBS_PREV_ACTIONS_START + i] = ctx->prev_actions[i] * POLICY_OBS_PREV_ACTIONS_SCALE;
    }
#elif !QC_POS_ERR_INTEGRAL
    (void)ctx;
#endif
    return n_clamped;
}

void qc_step(qc_ctx_t *ctx, const qc_state_t *state, const float setpoint_w[3], float yaw_sp_rad,
             float action[POLICY_ACTION_DIM])
{
    qc_setpoint_t sp;
    qc_fixed_setpoint(setpoint_w, yaw_sp_rad, &sp);
    qc_step_sp(ctx, state, &sp, action);
}

void qc_step_sp(qc_ctx_t *ctx, const qc_state_t *state, const qc_setpoint_t *sp, float action[POLICY_ACTION_DIM])
{
    /* static: the Crazyflie stabilizer task has ~1.8 kB of stack; this is ~0.6 kB. */
    static float obs[POLICY_OBS_DIM];
    int i;
#if QC_POS_ERR_INTEGRAL
    qc_update_pos_err_int(ctx, state, sp->pos_w, sp->yaw_rad);
#endif
    ctx->clamped_inputs += qc_assemble_obs_sp(ctx, state, sp, obs);
    policy_step(obs, action);
    for (i = 0; i < POLICY_ACTION_DIM; ++i) {
        float a = action[i];
        if (!(a == a)) {
            ++ctx->clamped_outputs;
            a = 0.0f;
        } else if (a > 1.0f) {
            ++ctx->clamped_outputs;
            a = 1.0f;
        } else if (a < -1.0f) {
            ++ctx->clamped_outputs;
            a = -1.0f;
        }
        action[i] = a;
    }
#if POLICY_ACTION_HISTORY > 0
    /* Shift by one action (newest first) and insert the new one at the front. */
    for (i = QC_HISTORY_FLOATS - 1; i >= POLICY_ACTION_DIM; --i) {
        ctx->prev_actions[i] = ctx->prev_actions[i - POLICY_ACTION_DIM];
    }
    for (i = 0; i < POLICY_ACTION_DIM; ++i) {
        ctx->prev_actions[i] = action[i];
    }
#endif
}
