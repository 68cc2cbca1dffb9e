/* bundlerun: posix_memalign for Debian's arm-none-eabi newlib (--etdump runners only).
 *
 * That newlib's aligned_alloc() calls posix_memalign(), which the library does not define, so a
 * link that pulls in aligned_alloc fails ("undefined reference to `posix_memalign'"). The ETDump
 * writer does: ETDumpGen without a preallocated buffer lets flatcc's builder allocate, and
 * flatcc/portable/paligned_alloc.h maps that to aligned_alloc on C11 compilers. memalign() is
 * there; this is the POSIX contract on top of it. Weak, so a newlib that has it wins.
 */
#include <errno.h>
#include <malloc.h>
#include <stddef.h>

__attribute__((weak)) int posix_memalign(void** memptr, size_t alignment, size_t size) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment % sizeof(void*) != 0) {
    return EINVAL;
  }
  void* p = memalign(alignment, size);
  if (p == NULL && size != 0) {
    return ENOMEM;
  }
  *memptr = p;
  return 0;
}
