/*
 * Shim of the Crazyflie firmware's stabilizer types (src/modules/interface/stabilizer_types.h),
 * written for this project so CI can compile the out-of-tree controller without the firmware
 * tree. Only the members the controller reads or writes are guaranteed to match the firmware's
 * names and meanings; layouts of the rest are simplified.
 */
#ifndef SHIM_STABILIZER_TYPES_H
#define SHIM_STABILIZER_TYPES_H

#include <stdbool.h>
#include <stdint.h>

#define STABILIZER_NR_OF_MOTORS 4

#define RATE_1000_HZ 1000
#define RATE_500_HZ 500
#define RATE_250_HZ 250
#define RATE_100_HZ 100
#define RATE_50_HZ 50
#define RATE_25_HZ 25
#define RATE_MAIN_LOOP RATE_1000_HZ
#define RATE_DO_EXECUTE(RATE_HZ, TICK) (((TICK) % (RATE_MAIN_LOOP / (RATE_HZ))) == 0)

typedef uint32_t stabilizerStep_t;

typedef struct vec3_s {
    uint32_t timestamp; /* ms */
    float x;
    float y;
    float z;
} vector_t;
typedef vector_t point_t;
typedef vector_t velocity_t;
typedef vector_t acc_t;
typedef vector_t jerk_t;

typedef struct attitude_s {
    uint32_t timestamp;
    float roll;  /* deg */
    float pitch; /* deg, legacy sign */
    float yaw;   /* deg */
} attitude_t;

typedef struct quaternion_s {
    union {
        struct {
            float q0;
            float q1;
            float q2;
            float q3;
        };
        struct {
            float x;
            float y;
            float z;
            float w;
        };
    };
} quaternion_t;

typedef union {
    struct {
        float x;
        float y;
        float z;
    };
    float axis[3];
} Axis3f;

typedef struct sensorData_s {
    Axis3f acc;  /* g */
    Axis3f gyro; /* deg/s */
    Axis3f mag;  /* gauss */
    uint64_t interruptTimestamp;
} sensorData_t;

typedef struct state_s {
    attitude_t attitude;
    quaternion_t attitudeQuaternion;
    point_t position;    /* m, world */
    velocity_t velocity; /* m/s, world */
    acc_t acc;           /* Gs, world, without gravity */
} state_t;

typedef enum control_mode_e {
    controlModeLegacy = 0,
    controlModeForceTorque = 1,
    controlModeForce = 2,
} control_mode_t;

typedef struct control_s {
    union {
        struct {
            int16_t roll;
            int16_t pitch;
            int16_t yaw;
            float thrust;
        };
        struct {
            float thrustSi;
            float torque[3];
        };
        float normalizedForces[STABILIZER_NR_OF_MOTORS]; /* 0..1 per motor */
    };
    control_mode_t controlMode;
} control_t;

typedef enum mode_e {
    modeDisable = 0,
    modeAbs,
    modeVelocity,
} stab_mode_t;

typedef struct setpoint_s {
    uint32_t timestamp; /* ms, set by the commander when the setpoint arrives */
    attitude_t attitude;
    attitude_t attitudeRate;
    quaternion_t attitudeQuaternion;
    float thrust;
    point_t position;
    velocity_t velocity;
    acc_t acceleration;
    jerk_t jerk;
    bool velocity_body;
    struct {
        stab_mode_t x;
        stab_mode_t y;
        stab_mode_t z;
        stab_mode_t roll;
        stab_mode_t pitch;
        stab_mode_t yaw;
        stab_mode_t quat;
    } mode;
} setpoint_t;

#endif /* SHIM_STABILIZER_TYPES_H */
