/*
 * Shim of the firmware's console print (src/utils/interface/debug.h): DEBUG_PRINT prefixes
 * DEBUG_MODULE like the firmware and goes to shim_debug_print, which accepts only the formats
 * the firmware's eprintf (src/utils/src/eprintf.c) handles and aborts on any other (eprintf
 * loops forever on e.g. a two-digit precision, or silently skips an unknown conversion).
 */
#ifndef SHIM_DEBUG_H
#define SHIM_DEBUG_H

#ifdef DEBUG_MODULE
#define DEBUG_FMT(fmt) DEBUG_MODULE ": " fmt
#else
#define DEBUG_FMT(fmt) fmt
#endif

void shim_debug_print(const char *fmt, ...);
#ifdef SHIM_LIST_FORMATS
/* For `gcc -E` only: marks every console format, macros expanded, for the format checks. */
#define DEBUG_PRINT(fmt, ...) @embodied_console_format@(DEBUG_FMT(fmt))
#else
#define DEBUG_PRINT(fmt, ...) shim_debug_print(DEBUG_FMT(fmt), ##__VA_ARGS__)
#endif

#endif
