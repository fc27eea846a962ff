/*
 * Test doubles for the firmware services the controller app calls. They stand in for code
 * that only runs on the drone (PID controller, RTOS, console) and record what they were asked.
 */
#include <stdarg.h>
#include <stdint.h>

#include "FreeRTOS.h"
#include "controller_pid.h"
#include "debug.h"
#include "task.h"

uint32_t shim_pid_calls;      /* controllerPid invocations */
uint32_t shim_pid_init_calls; /* controllerPidInit invocations */
uint32_t shim_debug_prints;   /* DEBUG_PRINT invocations */
TickType_t shim_tick_ms;      /* what xTaskGetTickCount returns */

void controllerPidInit(void)
{
    ++shim_pid_init_calls;
}

bool controllerPidTest(void)
{
    return true;
}

void controllerPid(control_t *control, const setpoint_t *setpoint, const sensorData_t *sensors,
                   const state_t *state, const stabilizerStep_t stabilizerStep)
{
    (void)sensors;
    (void)state;
    (void)stabilizerStep;
    ++shim_pid_calls;
    control->controlMode = controlModeLegacy;
    control->roll = 0;
    control->pitch = 0;
    control->yaw = 0;
    control->thrust = setpoint->thrust;
}

void shim_debug_print(const char *fmt, ...)
{
    (void)fmt;
    ++shim_debug_prints;
}

void vTaskDelay(TickType_t ticks)
{
    shim_tick_ms += ticks;
}

TickType_t xTaskGetTickCount(void)
{
    return shim_tick_ms;
}
