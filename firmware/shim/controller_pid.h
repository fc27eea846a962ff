/* Shim: the stock PID controller the policy app falls back to (controller_pid.h). */
#ifndef SHIM_CONTROLLER_PID_H
#define SHIM_CONTROLLER_PID_H

#include "stabilizer_types.h"

void controllerPidInit(void);
bool controllerPidTest(void);
void controllerPid(control_t *control, const setpoint_t *setpoint, const sensorData_t *sensors,
                   const state_t *state, const stabilizerStep_t stabilizerStep);

#endif
