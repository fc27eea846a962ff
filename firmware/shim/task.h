/* Shim of FreeRTOS task.h. */
#ifndef SHIM_TASK_H
#define SHIM_TASK_H

#include "FreeRTOS.h"

void vTaskDelay(TickType_t ticks);
TickType_t xTaskGetTickCount(void);

#endif
