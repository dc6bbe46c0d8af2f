/* The CPU backend: Kernels (codegen/kernel.h) to machine code through the
 * LLVM C API, and an in-process JIT that loads that machine code.
 *
 * cg_llvm_compile builds one LLVM module with one function per kernel
 * (ABI in kernel.h), verifies it, optimises it with the new pass manager at
 * O3 (loop and SLP vectorisation on) for the host CPU or a named one, and
 * emits one ELF object into memory.  The object may refer to libm (logf,
 * powf, sinf, tanh, ...), which the JIT resolves in the running process.
 *
 * A kernel whose matmul or conv2d reads a packed copy of its weight
 * (codegen/llvm/gemm.c) comes with a second function,
 *     void NAME__prepack(void *const *args);
 * with the kernel's argument layout, of which only the constant arguments
 * need be set (the others may be NULL).  It writes the packed copy (a
 * zero-initialised global of the object's .bss) from the weight constant;
 * whoever loads the object calls it once before the kernel first runs,
 * and not while any kernel of the object runs.  A kernel without it has
 * nothing to prepare.
 *
 * Kernel arguments must not overlap one another: the generated code tells
 * LLVM they do not alias (that is what lets it vectorise without run-time
 * checks), so a memory planner must not place a kernel's output over one of
 * the same kernel's inputs.
 *
 * This header does not include LLVM's; it is usable (and the functions
 * link) only when smelt is built with SMELT_LLVM (SMELT_HAVE_LLVM defined).
 */
#ifndef SMELT_CG_LLVM_H
#define SMELT_CG_LLVM_H

#include <stdbool.h>
#include <stddef.h>

#include "format/kernel.h"

typedef struct {
  const char *cpu;      /* LLVM CPU name ("znver3", "x86-64-v3"); NULL = the host's */
  const char *features; /* "+avx2,+fma"; NULL = the host's when cpu is NULL, none otherwise */
  bool no_opt;          /* skip the optimiser (debugging; the code is much slower) */
  bool soft_f16;        /* f16 loads with integer ops even where the CPU converts in hardware (tests) */
  /* weights packed here into read-only globals (in the object) instead of
   * zero-initialised ones that NAME__prepack fills: the scheme before
   * prepacking, for tests that compare the two (tests) */
  bool pack_at_compile;
} CgLlvmOptions;

/* The suffix of a kernel's prepack function's name, and its signature. */
#define CG_PREPACK_SUFFIX "__prepack"
typedef void (*CgPrepackFn)(void *const *args);

/* Compiles kernels k[0..nk) of g into one ELF object.  opt may be NULL
 * (host CPU, optimised).  On success *out_obj (malloc'd, *out_len bytes) and
 * *out_desc (malloc'd "LLVM 14.0.6 x86_64-pc-linux-gnu cpu=znver3
 * features=...": what the code was built for) are owned by the caller.
 * Errors carry the LLVM verifier's or code generator's message; a group
 * shape the backend does not handle is ST_UNSUPPORTED naming the kernel. */
smelt_status cg_llvm_compile(Graph *g, Kernel *k, int nk, const CgLlvmOptions *opt, void **out_obj,
                             size_t *out_len, char **out_desc) SMELT_MUST_USE;

/* This machine's CPU name and feature string as LLVM sees them ("znver3",
 * "+sse2,+avx2,-avx512f,..."), both malloc'd (free()). */
smelt_status cg_llvm_host_target(char **out_cpu, char **out_features) SMELT_MUST_USE;

/* The LLVM IR of the same module as text (malloc'd, owned by the caller),
 * before optimisation or after it: for `smelt inspect` and for debugging. */
smelt_status cg_llvm_ir_text(Graph *g, Kernel *k, int nk, const CgLlvmOptions *opt, bool optimised,
                             char **out_text) SMELT_MUST_USE;

/* ---- JIT ---- */

typedef struct CgJit CgJit;

/* Loads an object made by cg_llvm_compile into a fresh ORC LLJIT whose
 * unresolved symbols are looked up in the running process (libm, libc).
 * The object bytes are copied.  Owned by the caller: cg_jit_destroy. */
smelt_status cg_jit_create(const void *obj, size_t len, CgJit **out_jit) SMELT_MUST_USE;
/* Address of the kernel called name, or NULL when the object has none (or
 * it could not be linked: a symbol missing from the process).  Safe to call
 * from several threads. */
void *cg_jit_lookup(CgJit *jit, const char *name);
/* The same with the reason when it fails (the linker's message). */
smelt_status cg_jit_find(CgJit *jit, const char *name, void **out_fn) SMELT_MUST_USE;
/* Calls the prepack function of every kernel k[0..nk) of g that has one,
 * its constant arguments pointing at the graph's constant data (the
 * others NULL); once, before the kernels run.  *out_npacked (may be NULL):
 * how many kernels had one. */
smelt_status cg_jit_prepack(CgJit *jit, const Graph *g, const Kernel *k, int nk, int *out_npacked) SMELT_MUST_USE;
/* Frees the JIT and its code; NULL is allowed. */
void cg_jit_destroy(CgJit *jit);

/* The signature of every kernel (kernel.h). */
typedef void (*CgKernelFn)(void *const *args, int64_t task_begin, int64_t task_end);

#endif
