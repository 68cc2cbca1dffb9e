/*
 * newlib as packaged by Debian (libnewlib-arm-none-eabi) is built without C99 printf
 * formats: "%zu"/"%zd" print "zu"/"zd" and shift every later argument, so ExecuTorch log
 * lines such as "Missing operator: [%zd] %s" come out as "Missing operator: [zd] e6".
 * ExecuTorch formats every ET_LOG message with vsnprintf (runtime/platform/log.cpp); this
 * link-time wrap (-Wl,--wrap=vsnprintf) drops the 'z' length modifier before newlib sees
 * the format. On this 32-bit target size_t is unsigned int, so "%u"/"%d" are exact.
 */
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

int __real_vsnprintf(char* buf, size_t size, const char* format, va_list args);

int __wrap_vsnprintf(char* buf, size_t size, const char* format, va_list args) {
  _Static_assert(sizeof(size_t) == sizeof(unsigned int), "dropping %z needs a 32-bit size_t");
  char fixed[320];
  if (format == NULL || strchr(format, 'z') == NULL || strlen(format) >= sizeof(fixed)) {
    return __real_vsnprintf(buf, size, format, args);
  }
  const char* in = format;
  char* out = fixed;
  while (*in) {
    if (*in != '%') {
      *out++ = *in++;
      continue;
    }
    *out++ = *in++; /* '%' */
    while (*in && strchr("-+ #0123456789.*", *in)) *out++ = *in++;
    if (*in == 'z') in++; /* the length modifier newlib does not know */
    if (*in) *out++ = *in++; /* conversion (or the second '%' of "%%") */
  }
  *out = '\0';
  return __real_vsnprintf(buf, size, fixed, args);
}
