/*
 * bundlerun startup for QEMU mps3-an547 (Corstone SSE-300, Cortex-M55, Secure state).
 *
 * Why our own: ExecuTorch's arm_executor_runner.cpp expects the Ethos-U core_platform
 * startup, which is not available offline and assumes an NPU. This file is the minimum
 * the runner needs: vector table at the ITCM Secure alias (QEMU's reset VTOR), FPU/MVE
 * on, .bss cleared, C/C++ constructors, argc/argv from semihosting SYS_GET_CMDLINE
 * (semihosting mode) and a CMSDK UART0 console (uart mode). Faults are reported in one
 * line so a host can classify them.
 *
 * Defines (set by CMakeLists.txt):
 *   BUNDLERUN_SEMIHOSTING   1: files and console through semihosting; exit status to QEMU
 *   BUNDLERUN_UART_BASE     CMSDK APB UART used for stdout/stderr in uart mode
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef BUNDLERUN_SEMIHOSTING
#define BUNDLERUN_SEMIHOSTING 1
#endif
#ifndef BUNDLERUN_UART_BASE
#define BUNDLERUN_UART_BASE 0x49303000u
#endif

/* Exit status a hard fault gives QEMU in semihosting mode (SYS_EXIT_EXTENDED). */
#define BUNDLERUN_HARDFAULT_EXIT 139

extern uint32_t __StackTop;
extern uint32_t __bss_start__;
extern uint32_t __bss_end__;

extern int main(int argc, char** argv);
extern void __libc_init_array(void);
extern void exit(int status) __attribute__((noreturn));

void Reset_Handler(void) __attribute__((noreturn));
void HardFault_Handler(void) __attribute__((naked));
void Default_Handler(void);

/* crti.o is not linked (-nostartfiles); newlib's init/fini arrays still call these. */
void _init(void) {}
void _fini(void) {}
/* crtbegin.o is not linked either; libstdc++'s static destructors register against this. */
void* __dso_handle __attribute__((visibility("hidden"))) = &__dso_handle;

/* ---- semihosting ---------------------------------------------------------------- */

static inline uint32_t semihost(uint32_t op, const void* arg) {
  register uint32_t r0 __asm__("r0") = op;
  register const void* r1 __asm__("r1") = arg;
  __asm__ volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
  return r0;
}

#define SYS_WRITE0 0x04u
#define SYS_GET_CMDLINE 0x15u
#define SYS_EXIT 0x18u
#define SYS_EXIT_EXTENDED 0x20u
#define ADP_STOPPED_APPLICATION_EXIT 0x20026u

/* ---- UART0 (CMSDK APB UART) ------------------------------------------------------ */

typedef struct {
  volatile uint32_t data;
  volatile uint32_t state;
  volatile uint32_t ctrl;
  volatile uint32_t intstatus;
  volatile uint32_t bauddiv;
} cmsdk_uart_t;

#define UART0 ((cmsdk_uart_t*)BUNDLERUN_UART_BASE)

static void uart_init(void) {
  UART0->bauddiv = 16u;
  UART0->ctrl = 0x3u; /* TX and RX enable */
}

static void uart_putc(char c) {
  while (UART0->state & 0x1u) { /* TX buffer full */
  }
  UART0->data = (uint32_t)(unsigned char)c;
}

static void console_puts(const char* s) {
#if BUNDLERUN_SEMIHOSTING
  semihost(SYS_WRITE0, s);
#else
  while (*s) uart_putc(*s++);
#endif
}

#if !BUNDLERUN_SEMIHOSTING
/* newlib syscalls for uart mode: stdout/stderr to UART0, no files. */
int _write(int fd, const char* buf, int len) {
  (void)fd;
  for (int i = 0; i < len; i++) uart_putc(buf[i]);
  return len;
}

void _exit(int status) {
  (void)status;
  for (;;) {
    __asm__ volatile("wfi");
  }
}
#endif

/* ---- faults ---------------------------------------------------------------------- */

static char* put_hex(char* p, uint32_t v) {
  static const char digits[] = "0123456789abcdef";
  *p++ = '0';
  *p++ = 'x';
  for (int shift = 28; shift >= 0; shift -= 4) *p++ = digits[(v >> shift) & 0xFu];
  return p;
}

static char* put_str(char* p, const char* s) {
  while (*s) *p++ = *s++;
  return p;
}

/* One line, no printf: the C library may be in any state when a fault hits. */
void bundlerun_fault_report(const uint32_t* frame, uint32_t exc_return) {
  volatile uint32_t* scb = (volatile uint32_t*)0xE000ED00u;
  char line[160];
  char* p = line;
  p = put_str(p, "\nBUNDLERUN_HARDFAULT pc=");
  p = put_hex(p, frame[6]);
  p = put_str(p, " lr=");
  p = put_hex(p, frame[5]);
  p = put_str(p, " cfsr=");
  p = put_hex(p, scb[0x28 / 4]);
  p = put_str(p, " hfsr=");
  p = put_hex(p, scb[0x2C / 4]);
  p = put_str(p, " bfar=");
  p = put_hex(p, scb[0x38 / 4]);
  p = put_str(p, " exc_return=");
  p = put_hex(p, exc_return);
  p = put_str(p, "\n");
  *p = '\0';
  console_puts(line);
#if BUNDLERUN_SEMIHOSTING
  uint32_t block[2] = {ADP_STOPPED_APPLICATION_EXIT, BUNDLERUN_HARDFAULT_EXIT};
  semihost(SYS_EXIT_EXTENDED, block);
#endif
  for (;;) {
    __asm__ volatile("wfi");
  }
}

void HardFault_Handler(void) {
  __asm__ volatile(
      "tst lr, #4\n"
      "ite eq\n"
      "mrseq r0, msp\n"
      "mrsne r0, psp\n"
      "mov r1, lr\n"
      "b bundlerun_fault_report\n");
}

void Default_Handler(void) {
  console_puts("\nBUNDLERUN_UNEXPECTED_EXCEPTION\n");
  for (;;) {
    __asm__ volatile("wfi");
  }
}

/* ---- command line ---------------------------------------------------------------- */

#define MAX_ARGS 32
static char cmdline[1024];
static char* argv_buf[MAX_ARGS + 1];

/* Split QEMU's "-semihosting-config arg=..." command line on blanks. */
static int fetch_args(void) {
  int argc = 0;
#if BUNDLERUN_SEMIHOSTING
  struct {
    char* buf;
    uint32_t len;
  } block = {cmdline, sizeof(cmdline) - 1};
  if (semihost(SYS_GET_CMDLINE, &block) == 0) {
    cmdline[block.len < sizeof(cmdline) ? block.len : sizeof(cmdline) - 1] = '\0';
    char* p = cmdline;
    while (*p && argc < MAX_ARGS) {
      while (*p == ' ') *p++ = '\0';
      if (!*p) break;
      argv_buf[argc++] = p;
      while (*p && *p != ' ') p++;
    }
  }
#endif
  if (argc == 0) {
    strcpy(cmdline, "arm_executor_runner");
    argv_buf[argc++] = cmdline;
  }
  argv_buf[argc] = NULL;
  return argc;
}

/* ---- reset ----------------------------------------------------------------------- */

#if BUNDLERUN_SEMIHOSTING
extern void initialise_monitor_handles(void);
#endif

void Reset_Handler(void) {
  /* CP10/CP11 full access: the image is built -mfloat-abi=hard with MVE. */
  volatile uint32_t* cpacr = (volatile uint32_t*)0xE000ED88u;
  *cpacr |= (0xFu << 20);
  __asm__ volatile("dsb\n isb" ::: "memory");

  /* QEMU loads .data in place from the ELF; only .bss needs clearing. */
  for (uint32_t* p = &__bss_start__; p < &__bss_end__; p++) *p = 0u;

#if BUNDLERUN_SEMIHOSTING
  initialise_monitor_handles();
#else
  uart_init();
#endif
  __libc_init_array();
  int argc = fetch_args();
  exit(main(argc, argv_buf));
}

/* ---- vector table (placed at 0x10000000 by the linker script) --------------------- */

typedef void (*vector_t)(void);

__attribute__((section(".vectors"), used)) const vector_t bundlerun_vectors[16 + 16] = {
    (vector_t)(uintptr_t)&__StackTop,
    Reset_Handler,
    Default_Handler,   /* NMI */
    HardFault_Handler, /* HardFault */
    HardFault_Handler, /* MemManage */
    HardFault_Handler, /* BusFault */
    HardFault_Handler, /* UsageFault */
    HardFault_Handler, /* SecureFault */
    0,
    0,
    0,
    Default_Handler, /* SVC */
    Default_Handler, /* DebugMon */
    0,
    Default_Handler, /* PendSV */
    Default_Handler, /* SysTick */
    Default_Handler, Default_Handler, Default_Handler, Default_Handler,
    Default_Handler, Default_Handler, Default_Handler, Default_Handler,
    Default_Handler, Default_Handler, Default_Handler, Default_Handler,
    Default_Handler, Default_Handler, Default_Handler, Default_Handler,
};
