/* Shim of the FreeRTOS pieces the app touches. */
#ifndef SHIM_FREERTOS_H
#define SHIM_FREERTOS_H

#include <stdint.h>

typedef uint32_t TickType_t;
#define M2T(MS) ((TickType_t)(MS))
#define T2M(TICKS) ((uint32_t)(TICKS))

#endif
