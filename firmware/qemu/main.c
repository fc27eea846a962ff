/*
 * QEMU benchmark and self-test of a generated policy on the STM32F405 (Cortex-M4F).
 *
 * Run with -icount shift=0: every instruction then advances virtual time by 1 ns and SysTick
 * (clocked from the CPU clock) counts deterministically. A calibration loop of known length
 * converts SysTick ticks into instructions. Output (semihosting), one `key=value` per line;
 * the exit code is 0 when the self-test passed.
 */
#include <stdint.h>
#include <stdio.h>

#include "policy.h"
#ifdef BENCH_QUAD_CTRL
#include "quad_ctrl.h"
#endif

#define SYST_CSR (*(volatile uint32_t *)0xE000E010u)
#define SYST_RVR (*(volatile uint32_t *)0xE000E014u)
#define SYST_CVR (*(volatile uint32_t *)0xE000E018u)

#ifndef BENCH_FORWARD_PASSES
#define BENCH_FORWARD_PASSES 20
#endif
#define CALIB_ITERATIONS 100000u

extern void initialise_monitor_handles(void);

static void systick_start(void)
{
    SYST_RVR = 0x00FFFFFFu;
    SYST_CVR = 0u;
    SYST_CSR = 0x5u; /* enable, processor clock, no interrupt */
}

/* Down-counter: elapsed = start - now (mod 2^24). */
static uint32_t systick_elapsed(uint32_t start)
{
    return (start - SYST_CVR) & 0x00FFFFFFu;
}

/* Exactly 2 instructions per iteration (subs + bne). */
static uint32_t calibrate(void)
{
    uint32_t n = CALIB_ITERATIONS;
    const uint32_t t0 = SYST_CVR;
    __asm__ volatile("1:\n\tsubs %0, %0, #1\n\tbne 1b\n\t" : "+r"(n) : : "cc");
    return systick_elapsed(t0);
}

int main(void)
{
    static float action[POLICY_ACTION_DIM];
    uint32_t t0, fwd_ticks, ctrl_ticks = 0u, calib_ticks;
    int passed, i;

    initialise_monitor_handles();
    systick_start();
    passed = policy_selftest();
    printf("selftest_passed=%d\n", passed);
    printf("selftest_max_err=%.9e\n", (double)policy_selftest_error());

    calib_ticks = calibrate();
    t0 = SYST_CVR;
    for (i = 0; i < BENCH_FORWARD_PASSES; ++i) {
        policy_step(policy_example_obs, action);
    }
    fwd_ticks = systick_elapsed(t0);

#ifdef BENCH_QUAD_CTRL
    {
        /* The whole control step: observation assembly, forward pass, clamps, history. */
        static qc_ctx_t ctx;
        static qc_state_t state;
        static const float setpoint_w[3] = {0.0f, 0.0f, 1.0f};
        state.quat_wb[0] = 1.0f;
        state.pos_w[2] = 1.0f;
        qc_reset(&ctx, 0.0f);
        t0 = SYST_CVR;
        for (i = 0; i < BENCH_FORWARD_PASSES; ++i) {
            qc_step(&ctx, &state, setpoint_w, 0.0f, action);
        }
        ctrl_ticks = systick_elapsed(t0);
    }
#endif

    printf("calib_instructions=%lu\n", (unsigned long)(2u * CALIB_ITERATIONS));
    printf("calib_ticks=%lu\n", (unsigned long)calib_ticks);
    printf("forward_passes=%d\n", BENCH_FORWARD_PASSES);
    printf("forward_ticks=%lu\n", (unsigned long)fwd_ticks);
    printf("control_step_ticks=%lu\n", (unsigned long)ctrl_ticks);
    printf("num_macs=%d\n", POLICY_NUM_MACS);
    printf("action0=%.9e\n", (double)action[0]);
    return passed ? 0 : 1;
}
