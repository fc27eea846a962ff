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

/* obs [n][POLICY_OBS_DIM]; returns the total number of clamped inputs. */
uint32_t sil_assemble_obs(const qc_ctx_t *ctxs, int n, const float *states, const float *setpoints, float *obs)
{
    uint32_t clamped = 0;
    qc_state_t s;
    int i;
    for (i = 0; i < n; ++i) {
        sil_unpack(states + (size_t)i * QC_STATE_FLOATS, &s);
        const float *sp = setpoints + (size_t)i * 4;
        clamped += qc_assemble_obs(&ctxs[i], &s, sp, sp[3], obs + (size_t)i * POLICY_OBS_DIM);
    }
    return clamped;
}

/* One control step for each vehicle: actions [n][4] normalized, histories updated. */
void sil_step(qc_ctx_t *ctxs, int n, const float *states, const float *setpoints, float *actions)
{
    qc_state_t s;
    int i;
    for (i = 0; i < n; ++i) {
        sil_unpack(states + (size_t)i * QC_STATE_FLOATS, &s);
        const float *sp = setpoints + (size_t)i * 4;
        qc_step(&ctxs[i], &s, sp, sp[3], actions + (size_t)i * POLICY_ACTION_DIM);
    }
}
