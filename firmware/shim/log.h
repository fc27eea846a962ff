/* Shim of the firmware's log table macros: entries land in a readable static table. */
#ifndef SHIM_LOG_H
#define SHIM_LOG_H

#include <stdint.h>

#define LOG_UINT8 1
#define LOG_UINT16 2
#define LOG_UINT32 3
#define LOG_FLOAT 7

typedef struct {
    const char *name;
    int type;
    const void *address;
} shim_log_t;

#define LOG_GROUP_START(NAME) const shim_log_t shim_log_group_##NAME[] = {
#define LOG_ADD(TYPE, NAME, ADDRESS) {#NAME, (TYPE), (const void *)(ADDRESS)},
#define LOG_ADD_CORE LOG_ADD
#define LOG_GROUP_STOP(NAME) {0, 0, 0}};

#endif
