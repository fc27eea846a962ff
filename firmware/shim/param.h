/* Shim of the firmware's parameter table macros: entries land in a readable static table
   (shim_param_group_<GROUP>), which the host harness reads and writes by name as cfclient does. */
#ifndef SHIM_PARAM_H
#define SHIM_PARAM_H

#include <stdint.h>

#define PARAM_UINT8 0x08
#define PARAM_UINT16 0x09
#define PARAM_UINT32 0x0A
#define PARAM_FLOAT 0x06

typedef struct {
    const char *name;
    int type;
    void *address;
} shim_param_t;

#define PARAM_GROUP_START(NAME) shim_param_t shim_param_group_##NAME[] = {
#define PARAM_ADD(TYPE, NAME, ADDRESS) {#NAME, (TYPE), (void *)(ADDRESS)},
#define PARAM_ADD_CORE PARAM_ADD
#define PARAM_GROUP_STOP(NAME) {0, 0, 0}};

#endif
