/*
 * Host (software-in-the-loop) entry points around the portable controller, loaded with ctypes
 * by embodied/crazyflie/sil.py. Batched over n vehicles: states are packed [n][13] floats
 * (pos_w, quat_wb (w,x,y,z), lin_vel_w, ang_vel_b), setpoints [n][4] (x, y, z in m, world;
 * yaw in rad), contexts [n].
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "policy.h"
#include "quad_ctrl.h"

int sil_obs_dim(void) { return POLICY_OBS_DIM; }
int sil_action_dim(void) { return POLICY_ACTION_DIM; }
int sil_action_history(void) { return POLICY_ACTION_HISTORY; }
int sil_control_period_us(void) { return POLICY_CONTROL_PERIOD_US; }
size_t sil_ctx_size(void) { return sizeof(qc_ctx_t); }
const char *sil_model_sha256(void) { return POLICY_MODEL_SHA256; }
int sil_selftest(void) { return policy_selftest(); }
float sil_selftest_error(void) { return policy_selftest_error(); }

static void sil_unpack(const float *packed, qc_state_t *s)
{
    memcpy(s->pos_w, packed, 3 * sizeof(float));
    memcpy(s->quat_wb, packed + 3, 4 * sizeof(float));
    memcpy(s->lin_vel_w, packed + 7, 3 * sizeof(float));
    memcpy(s->ang_vel_b, packed + 10, 3 * sizeof(float));
}

/* Reset the contexts where mask[i] != 0 (all when mask is NULL). */
void sil_reset(qc_ctx_t *ctxs, int n, const uint8_t *mask, float initial_action)
{
    int i;
    for (i = 0; i < n; ++i) {
        if (mask == NULL || mask[i]) {
            qc_reset(&ctxs[i], initial_action);
        }
    }
}

/* Moving setpoints: rows [n][QC_SETPOINT_FLOATS] = x, y, z (m), yaw (rad), vx, vy, vz (m/s),
   ax, ay, az (m/s^2), world frame; fixed setpoints: rows [n][4] = x, y, z, yaw (no feed-forward). */
#define QC_SETPOINT_FLOATS 10

static void sil_unpack_setpoint(const float *row, int floats, qc_setpoint_t *sp)
{
    int i;
    memcpy(sp->pos_w, row, 3 * sizeof(float));
    sp->yaw_rad = row[3];
    for (i = 0; i < 3; ++i) {
        sp->vel_w[i] = floats == QC_SETPOINT_FLOATS ? row[4 + i] : 0.0f;
        sp->acc_w[i] = floats == QC_SETPOINT_FLOATS ? row[7 + i] : 0.0f;
    }
}

static uint32_t sil_assemble_rows(const qc_ctx_t *ctxs, int n, const float *states, const float *setpoints,
                                  int floats, float *obs)
{
    uint32_t clamped = 0;
    qc_state_t s;
    qc_setpoint_t sp;
    int i;
    for (i = 0; i < n; ++i) {
        sil_unpack(states + (size_t)i * QC_STATE_FLOATS, &s);
        sil_unpack_setpoint(setpoints + (size_t)i * (size_t)floats, floats, &sp);
        clamped += qc_assemble_obs_sp(&ctxs[i], &s, &sp, obs + (size_t)i * POLICY_OBS_DIM);
    }
    return clamped;
}

static void sil_step_rows(qc_ctx_t *ctxs, int n, const float *states, const float *setpoints, int floats,
                          float *actions)
{
    qc_state_t s;
    qc_setpoint_t sp;
    int i;
    for (i = 0; i < n; ++i) {
        sil_unpack(states + (size_t)i * QC_STATE_FLOATS, &s);
        sil_unpack_setpoint(setpoints + (size_t)i * (size_t)floats, floats, &sp);
        qc_step_sp(&ctxs[i], &s, &sp, actions + (size_t)i * POLICY_ACTION_DIM);
    }
}

/* obs [n][POLICY_OBS_DIM] for fixed setpoints [n][4]; returns the total number of clamped inputs. */
uint32_t sil_assemble_obs(const qc_ctx_t *ctxs, int n, const float *states, const float *setpoints, float *obs)
{
    return sil_assemble_rows(ctxs, n, states, setpoints, 4, obs);
}

/* One control step for each vehicle (fixed setpoints [n][4]): actions [n][4] normalized, histories updated. */
void sil_step(qc_ctx_t *ctxs, int n, const float *states, const float *setpoints, float *actions)
{
    sil_step_rows(ctxs, n, states, setpoints, 4, actions);
}

/* sil_assemble_obs for moving setpoints [n][QC_SETPOINT_FLOATS]. */
uint32_t sil_assemble_obs_sp(const qc_ctx_t *ctxs, int n, const float *states, const float *setpoints, float *obs)
{
    return sil_assemble_rows(ctxs, n, states, setpoints, QC_SETPOINT_FLOATS, obs);
}

/* sil_step for moving setpoints [n][QC_SETPOINT_FLOATS]. */
void sil_step_sp(qc_ctx_t *ctxs, int n, const float *states, const float *setpoints, float *actions)
{
    sil_step_rows(ctxs, n, states, setpoints, QC_SETPOINT_FLOATS, actions);
}
