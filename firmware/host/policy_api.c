/* Host entry point for any generated policy: the bare network on a batch (ctypes). */
#include <stddef.h>

#include "policy.h"

void sil_policy_step(int n, const float *obs, float *actions);

/* obs [n][POLICY_OBS_DIM] -> actions [n][POLICY_ACTION_DIM], one policy_step per row. */
void sil_policy_step(int n, const float *obs, float *actions)
{
    int i;
    for (i = 0; i < n; ++i) {
        policy_step(obs + (size_t)i * POLICY_OBS_DIM, actions + (size_t)i * POLICY_ACTION_DIM);
    }
}
