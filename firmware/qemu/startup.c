/*
 * Bare-metal start-up for the STM32F405 under QEMU: vector table, FPU enable, .data/.bss init.
 * The FPU must be on before any floating-point instruction runs, so Reset_Handler enables it
 * first and is compiled so that it uses none itself.
 */
#include <stdint.h>

extern uint32_t _estack, _sidata, _sdata, _edata, _sbss, _ebss;
extern int main(void);
extern void exit(int status);

void Reset_Handler(void);
void Default_Handler(void);

#define SCB_CPACR (*(volatile uint32_t *)0xE000ED88u)

void Reset_Handler(void)
{
    uint32_t *src = &_sidata;
    uint32_t *dst = &_sdata;
    SCB_CPACR |= (0xFu << 20); /* CP10 and CP11 full access */
    __asm__ volatile("dsb\n\tisb" ::: "memory");
    while (dst < &_edata) {
        *dst++ = *src++;
    }
    for (dst = &_sbss; dst < &_ebss; ++dst) {
        *dst = 0u;
    }
    exit(main());
    for (;;) {
    }
}

void Default_Handler(void)
{
    for (;;) {
    }
}

/* -nostartfiles: newlib's exit() still calls these. */
void _init(void);
void _fini(void);
void _init(void) {}
void _fini(void) {}

__attribute__((section(".isr_vector"), used)) static void (*const vectors[16])(void) = {
    (void (*)(void))(&_estack),
    Reset_Handler,
    Default_Handler, /* NMI */
    Default_Handler, /* HardFault */
    Default_Handler, /* MemManage */
    Default_Handler, /* BusFault */
    Default_Handler, /* UsageFault */
    0, 0, 0, 0,
    Default_Handler, /* SVCall */
    Default_Handler, /* DebugMon */
    0,
    Default_Handler, /* PendSV */
    Default_Handler, /* SysTick */
};
