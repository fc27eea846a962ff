/*
 * Drives the Crazyflie app's controllerOutOfTree() on the host through the firmware shim, so
 * tests exercise the app's own unit conversions, decimation, handover and fallback logic, and
 * the shim's model of what the firmware does with its command (shim_motor_chain).
 */
#include <stdint.h>
#include <string.h>

#include "controller.h"
#include "log.h"
#include "param.h"
#include "stabilizer_types.h"

extern uint32_t shim_pid_calls;
extern int16_t shim_pid_rpy[3];
extern float shim_pid_thrust;
extern shim_param_t shim_param_group_embodied[];
extern const shim_log_t shim_log_group_embodied[];
int shim_motor_chain(const control_t *control, float supply_voltage_v, uint16_t pwm[4], float thrust_n[4]);

int cfh_tick(uint32_t tick, const float *estimate10, const float *gyro_deg_s, const float *setpoint_pos_w,
             float setpoint_yaw_deg, uint32_t setpoint_timestamp_ms, int position_mode, float supply_voltage_v,
             float *forces, float *thrust_n);
int cfh_param_set(const char *name, double value);
void cfh_boot(void);
int cfh_control(int16_t *rpy, float *thrust, int16_t *pid_rpy, float *pid_thrust);
void cfh_set_feedforward(const float *vel_w, const float *acc_w);
void cfh_motor_chain(int n, const float *forces, const float *supply_voltage_v, uint16_t *pwm, float *thrust_n);
int cfh_log_get(const char *name, double *value);

/* The setpoint's feed-forward velocity (m/s) and acceleration (m/s^2), world, for the next ticks. */
static float cfh_ff_vel_w[3];
static float cfh_ff_acc_w[3];

/* The stabilizer's command, kept across ticks as stabilizer.c keeps its static `control`: a
   controller that leaves a field unwritten on a tick passes on what the last tick left there. */
static control_t cfh_stabilizer_control;

/* A fresh boot: the stabilizer's command zeroed (static storage), then the controller's init. */
void cfh_boot(void)
{
    memset(&cfh_stabilizer_control, 0, sizeof(cfh_stabilizer_control));
    controllerOutOfTreeInit();
}

/* The legacy fields of the stabilizer's command after the last tick (rpy [3], thrust) and the
   stand-in PID's own latest output (pid_rpy [3], pid_thrust); returns the command's mode. */
int cfh_control(int16_t *rpy, float *thrust, int16_t *pid_rpy, float *pid_thrust)
{
    rpy[0] = cfh_stabilizer_control.roll;
    rpy[1] = cfh_stabilizer_control.pitch;
    rpy[2] = cfh_stabilizer_control.yaw;
    *thrust = cfh_stabilizer_control.thrust;
    memcpy(pid_rpy, shim_pid_rpy, 3 * sizeof(int16_t));
    *pid_thrust = shim_pid_thrust;
    return (int)cfh_stabilizer_control.controlMode;
}

/* Set the feed-forward of the following cfh_tick setpoints (a moving setpoint, as the high-level
   commander sends it); NULL leaves that part at zero (a plain position setpoint). */
void cfh_set_feedforward(const float *vel_w, const float *acc_w)
{
    int i;
    for (i = 0; i < 3; ++i) {
        cfh_ff_vel_w[i] = vel_w != NULL ? vel_w[i] : 0.0f;
        cfh_ff_acc_w[i] = acc_w != NULL ? acc_w[i] : 0.0f;
    }
}

static void set_vec(vector_t *v, const float *xyz)
{
    v->x = xyz[0];
    v->y = xyz[1];
    v->z = xyz[2];
}

/*
 * One stabilizer tick. estimate10: pos_w, quat (w, x, y, z), vel_w as the estimator reports
 * them; gyro_deg_s [3] body rates as the IMU reports them; the setpoint's position [3] (m) and
 * yaw (deg) with its commander timestamp (ms); position_mode 1 sets x, y, z and yaw to modeAbs
 * (a position setpoint), 0 to velocity modes. Runs the controller, then the modelled motor chain
 * at supply_voltage_v, on the stabilizer's command kept from the previous tick. Writes normalizedForces [4] (valid in force mode) and the motors' thrust
 * [4] (N); returns the control mode (controlModeForce 2 while the policy flies, controlModeLegacy
 * 0 from the PID).
 */
int cfh_tick(uint32_t tick, const float *estimate10, const float *gyro_deg_s, const float *setpoint_pos_w,
             float setpoint_yaw_deg, uint32_t setpoint_timestamp_ms, int position_mode, float supply_voltage_v,
             float *forces, float *thrust_n)
{
    control_t *control = &cfh_stabilizer_control;
    setpoint_t setpoint;
    sensorData_t sensors;
    state_t state;
    uint16_t pwm[4];
    memset(&setpoint, 0, sizeof(setpoint));
    memset(&sensors, 0, sizeof(sensors));
    memset(&state, 0, sizeof(state));
    set_vec(&state.position, estimate10);
    state.attitudeQuaternion.w = estimate10[3];
    state.attitudeQuaternion.x = estimate10[4];
    state.attitudeQuaternion.y = estimate10[5];
    state.attitudeQuaternion.z = estimate10[6];
    set_vec(&state.velocity, estimate10 + 7);
    sensors.gyro.x = gyro_deg_s[0];
    sensors.gyro.y = gyro_deg_s[1];
    sensors.gyro.z = gyro_deg_s[2];
    setpoint.timestamp = setpoint_timestamp_ms;
    set_vec(&setpoint.position, setpoint_pos_w);
    set_vec(&setpoint.velocity, cfh_ff_vel_w);
    set_vec(&setpoint.acceleration, cfh_ff_acc_w);
    setpoint.attitude.yaw = setpoint_yaw_deg;
    setpoint.mode.x = setpoint.mode.y = setpoint.mode.z = position_mode ? modeAbs : modeVelocity;
    setpoint.mode.yaw = position_mode ? modeAbs : modeVelocity;
    controllerOutOfTree(control, &setpoint, &sensors, &state, tick);
    memcpy(forces, control->normalizedForces, 4 * sizeof(float));
    shim_motor_chain(control, supply_voltage_v, pwm, thrust_n);
    return (int)control->controlMode;
}

/* Write parameter embodied.<name> as cfclient would; returns 0, or -1 for an unknown name. */
int cfh_param_set(const char *name, double value)
{
    shim_param_t *p;
    for (p = shim_param_group_embodied; p->name != NULL; ++p) {
        if (strcmp(p->name, name) != 0) {
            continue;
        }
        if (p->type == PARAM_FLOAT) {
            *(float *)p->address = (float)value;
        } else if (p->type == PARAM_UINT8) {
            *(uint8_t *)p->address = (uint8_t)value;
        } else {
            return -1;
        }
        return 0;
    }
    return -1;
}

/* Read log variable embodied.<name>; returns 0, or -1 for an unknown name. */
int cfh_log_get(const char *name, double *value)
{
    const shim_log_t *l;
    for (l = shim_log_group_embodied; l->name != NULL; ++l) {
        if (strcmp(l->name, name) != 0) {
            continue;
        }
        if (l->type == LOG_FLOAT) {
            *value = (double)*(const float *)l->address;
        } else if (l->type == LOG_UINT8) {
            *value = *(const uint8_t *)l->address;
        } else if (l->type == LOG_UINT32) {
            *value = *(const uint32_t *)l->address;
        } else {
            return -1;
        }
        return 0;
    }
    return -1;
}

/* The modelled motor chain alone for n force-mode commands: forces [n][4], supply voltages [n]
   -> pwm [n][4] and thrust per motor [n][4] (N). */
void cfh_motor_chain(int n, const float *forces, const float *supply_voltage_v, uint16_t *pwm, float *thrust_n)
{
    control_t control;
    int i;
    memset(&control, 0, sizeof(control));
    control.controlMode = controlModeForce;
    for (i = 0; i < n; ++i) {
        memcpy(control.normalizedForces, forces + 4 * i, 4 * sizeof(float));
        shim_motor_chain(&control, supply_voltage_v[i], pwm + 4 * i, thrust_n + 4 * i);
    }
}
