/*
 * Drives the Crazyflie app's controllerOutOfTree() on the host through the firmware shim, so
 * tests exercise the app's own unit conversions, decimation and fallback logic.
 */
#include <stdint.h>
#include <string.h>

#include "controller.h"
#include "stabilizer_types.h"

extern uint32_t shim_pid_calls;

int cfh_tick(uint32_t tick, const float *state13, const float *gyro_deg_s, const float *setpoint_pos_w,
             uint32_t setpoint_timestamp_ms, int position_mode, float *forces);

static void set_vec(vector_t *v, const float *xyz)
{
    v->x = xyz[0];
    v->y = xyz[1];
    v->z = xyz[2];
}

/*
 * One stabilizer tick. state13: pos_w, quat (w,x,y,z), vel_w as the estimator reports them;
 * gyro_deg_s [3] body rates as the IMU reports them; setpoint_pos_w [3] with its commander
 * timestamp (ms). Writes the four normalized forces (valid when 1 is returned) and returns
 * 1 when the policy flew this tick, 0 when the PID controller did.
 */
int cfh_tick(uint32_t tick, const float *state13, const float *gyro_deg_s, const float *setpoint_pos_w,
             uint32_t setpoint_timestamp_ms, int position_mode, float *forces)
{
    control_t control;
    setpoint_t setpoint;
    sensorData_t sensors;
    state_t state;
    const uint32_t pid_before = shim_pid_calls;
    memset(&control, 0, sizeof(control));
    memset(&setpoint, 0, sizeof(setpoint));
    memset(&sensors, 0, sizeof(sensors));
    memset(&state, 0, sizeof(state));
    set_vec(&state.position, state13);
    state.attitudeQuaternion.w = state13[3];
    state.attitudeQuaternion.x = state13[4];
    state.attitudeQuaternion.y = state13[5];
    state.attitudeQuaternion.z = state13[6];
    set_vec(&state.velocity, state13 + 7);
    sensors.gyro.x = gyro_deg_s[0];
    sensors.gyro.y = gyro_deg_s[1];
    sensors.gyro.z = gyro_deg_s[2];
    setpoint.timestamp = setpoint_timestamp_ms;
    set_vec(&setpoint.position, setpoint_pos_w);
    setpoint.mode.x = setpoint.mode.y = setpoint.mode.z = position_mode ? modeAbs : modeVelocity;
    controllerOutOfTree(&control, &setpoint, &sensors, &state, tick);
    if (shim_pid_calls != pid_before) {
        return 0;
    }
    memcpy(forces, control.normalizedForces, 4 * sizeof(float));
    return control.controlMode == controlModeForce ? 1 : -1;
}
