/* Loading the CPU backend's kernels without LLVM: a linker-loader for one
 * ELF64 x86-64 relocatable object (ET_REL), the kind cg_llvm_compile emits
 * (position-independent code, default code model).
 *
 * The object's bytes are untrusted input (they come from a bundle file on
 * disk): every header, index, offset, size and relocation is checked before
 * it is used, sizes are checked for overflow, and a malformed object gives a
 * status that says what is wrong with it, never a crash.
 *
 * The loaded image is one private anonymous mapping holding three
 * page-aligned parts: text (code, plus a jump stub per imported function)
 * mapped read+execute, read-only data (constants, plus a GOT slot per symbol
 * that GOT-relative relocations need) mapped read-only, and writable data
 * (.data, .bss) mapped read+write.  No page is ever writable and executable
 * at once.  The object refers to code outside itself only through the
 * import table the caller gives: anything else undefined is an error naming
 * the symbol.
 *
 * This module depends on libc only (no LLVM).  The parser is portable; the
 * loader itself runs only on x86-64 hosts and returns ST_UNSUPPORTED
 * elsewhere.
 */
#ifndef SMELT_ELF_LOADER_H
#define SMELT_ELF_LOADER_H

#include <stddef.h>

#include "ir/status.h"

/* One symbol the object may refer to without defining it. */
typedef struct {
  const char *name; /* "expf" */
  void *addr;       /* its address in this process */
} RtElfImport;

typedef struct RtElfImage RtElfImage;

/* The address ranges of a loaded image (for diagnostics and tests).  Each
 * part is page-aligned; a part the object does not need has size 0. */
typedef struct {
  const void *base; /* the whole mapping */
  size_t size;
  const void *text; /* read + execute: code and import stubs */
  size_t text_size;
  const void *rodata; /* read-only: constants and the GOT */
  size_t rodata_size;
  const void *data; /* read + write: .data and .bss */
  size_t data_size;
} RtElfLayout;

/* The largest image the loader builds (all parts together).  Keeping it far
 * below 2 GiB means every PC-relative reference inside the image fits its
 * 32-bit field; the limit also bounds what a forged size can make it map. */
#define RT_ELF_MAX_IMAGE_BYTES ((size_t)1 << 30)

/* Checks the ELF64 x86-64 relocatable object obj[0..len), lays its
 * allocatable sections out in fresh memory, resolves its undefined symbols
 * against imports[0..nimports) (names compared exactly), applies its
 * relocations and write-protects the result.  obj need not be aligned and
 * is not referenced after the call.  On success *out_image is owned by the
 * caller (rt_elf_free).  Errors: ST_INVALID_INPUT for a malformed object or
 * a symbol missing from the import table (every missing name is listed),
 * ST_UNSUPPORTED for valid ELF the loader does not handle (a relocation
 * type, TLS, COMMON symbols, constructors) or a host that is not x86-64,
 * ST_NO_MEMORY when mapping fails.
 * Supported relocations: R_X86_64_NONE, 64, PC32, PLT32, 32, 32S, PC64,
 * GOTPCREL, GOTPCRELX, REX_GOTPCRELX. */
smelt_status rt_elf_load(const void *obj, size_t len, const RtElfImport *imports, int nimports,
                         RtElfImage **out_image) SMELT_MUST_USE;

/* The address of the function called name that the object defines and
 * exports (a global or weak STT_FUNC symbol in a code section), or NULL.
 * Read-only: safe to call from several threads at once. */
void *rt_elf_lookup(const RtElfImage *img, const char *name);

/* The number of exported functions, and the name of the i-th one
 * (0 <= i < count; sorted by strcmp; the string lives as long as img). */
int rt_elf_symbol_count(const RtElfImage *img);
const char *rt_elf_symbol_name(const RtElfImage *img, int i);

/* Fills *out with where the parts of img lie. */
void rt_elf_layout(const RtElfImage *img, RtElfLayout *out);

/* Unmaps the image; its functions must not be running.  NULL is allowed. */
void rt_elf_free(RtElfImage *img);

/* The import table for kernels from cg_llvm_compile: memcpy, memmove and
 * memset (which LLVM's idiom recognition introduces) and the libm functions
 * the generated code calls or that LLVM lowers its math intrinsics to
 * (exp, expf, log, logf, pow, powf, sin, cos, tanh, erf, floor, fma, ...,
 * and sincos/sincosf, supplied here since they are not standard C).  A
 * static table; *out_n receives its length. */
const RtElfImport *rt_elf_default_imports(int *out_n);

#endif
