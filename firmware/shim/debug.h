/* Shim of the firmware's console print. */
#ifndef SHIM_DEBUG_H
#define SHIM_DEBUG_H

void shim_debug_print(const char *fmt, ...);
#define DEBUG_PRINT(...) shim_debug_print(__VA_ARGS__)

#endif
