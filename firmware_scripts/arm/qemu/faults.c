/*
 * Fault variants of the QEMU runner, for tests of the host's fault classifier.
 *
 * Why here and not in ExecuTorch: the runner source stays unmodified; these wrap ExecuTorch
 * symbols at link time (-Wl,--wrap=SYMBOL, see CMakeLists.txt), so everything up to the
 * fault (model load, method setup, log lines) is the real runner's behaviour.
 *
 *   BUNDLERUN_FAULT_SPIN          Method::execute() never returns (a hang)
 *   BUNDLERUN_FAULT_HARDFAULT     Method::execute() executes an undefined instruction
 *   BUNDLERUN_FAULT_SHORT_OUTPUT  fwrite() of output files writes only half the bytes
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define ET_METHOD_EXECUTE _ZN10executorch7runtime6Method7executeEv
#define WRAP2(sym) __wrap_##sym
#define WRAP(sym) WRAP2(sym)

#if defined(BUNDLERUN_FAULT_SPIN)
uint32_t WRAP(ET_METHOD_EXECUTE)(void* self) {
  (void)self;
  for (;;) {
    __asm__ volatile("" ::: "memory");
  }
}
#endif

#if defined(BUNDLERUN_FAULT_HARDFAULT)
uint32_t WRAP(ET_METHOD_EXECUTE)(void* self) {
  (void)self;
  __asm__ volatile("udf #0x42" ::: "memory");
  return 0;
}
#endif

#if defined(BUNDLERUN_FAULT_SHORT_OUTPUT)
size_t __real_fwrite(const void* ptr, size_t size, size_t nmemb, FILE* stream);

size_t __wrap_fwrite(const void* ptr, size_t size, size_t nmemb, FILE* stream) {
  if (size == 1 && nmemb > 1) {
    nmemb /= 2;
  }
  return __real_fwrite(ptr, size, nmemb, stream);
}
#endif

/* Keeps the translation unit non-empty in the no-fault build. */
const char bundlerun_fault_variant[] =
#if defined(BUNDLERUN_FAULT_SPIN)
    "spin";
#elif defined(BUNDLERUN_FAULT_HARDFAULT)
    "hardfault";
#elif defined(BUNDLERUN_FAULT_SHORT_OUTPUT)
    "short-output";
#else
    "none";
#endif
