/* Shim of the firmware's app entry point. */
#ifndef SHIM_APP_H
#define SHIM_APP_H

void appMain(void);

#endif
