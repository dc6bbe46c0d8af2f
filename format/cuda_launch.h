/* The CUDA side of a bundle: the launch table (how each generated kernel is
 * launched: symbol, unit, grid, block, shared memory, workspace, TMA
 * descriptors) and the compilation units' sources.  The compiler
 * (codegen/cuda) fills an FmtCudaModule; the bundle carries it as a
 * "cuda-launch" section plus one "cuda-source" section per unit; the
 * runtime decodes it, trusting nothing.
 *
 * The launch table is text: "smelt-cuda-launch 3", "units N", "kernels N",
 * then per kernel one line
 *   kernel SYMBOL UNIT NARGS GX GY GZ BX BY BZ SMEM KIND VEC VARIANT WS NTMAPS PDL NAME
 * followed by NTMAPS lines "tmap ARG DTYPE RANK dims.. strides.. box.. SWIZZLE".
 * Version 2 tables (no PDL field) are read with pdl false.
 *
 * Objects returned through out_ parameters are owned by the caller
 * (fmt_cuda_module_free).  Nothing here prints or exits. */
#ifndef SMELT_FMT_CUDA_LAUNCH_H
#define SMELT_FMT_CUDA_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ir/status.h"

/* The longest variant token ("mma:bm=128,...") with its NUL. */
#define FMT_VARIANT_LEN 96
/* The most CUDA archs one bundle is compiled for. */
#define FMT_MAX_CUDA_ARCHS 8

/* A TMA descriptor a kernel needs (cuTensorMapEncodeTiled's arguments,
 * innermost dim first), built by the runtime from the argument's device
 * address once its buffers are known. */
#define FMT_MAX_TMAPS 4
typedef struct {
  int arg;              /* the kernel argument it maps */
  int dtype;            /* DType of the elements (f16, bf16, f32) */
  int rank;             /* 2..5 */
  uint64_t dims[5];     /* elements per dim, innermost first */
  uint64_t strides[4];  /* bytes between consecutive indices of dims 1..rank-1 */
  uint32_t box[5];      /* elements per dim of one copy */
  int swizzle;          /* 0, 32, 64 or 128 (bytes) */
} FmtCudaTmap;

/* How one generated kernel is launched. */
typedef struct {
  char name[96];        /* the Kernel's name (YAML provenance) */
  char symbol[112];     /* the __global__ function in the source (a C identifier) */
  int unit;             /* the compilation unit that holds it */
  int nargs;            /* parameters: the Kernel's args, in order */
  unsigned grid[3], block[3];
  unsigned smem;        /* dynamic shared memory in bytes */
  const char *kind;     /* "elementwise", "reduction", "matmul", "conv2d", "attention", "pool", or "collective":
                         * an all_reduce / all_gather the runtime issues (no code, in no unit) */
  bool vectorised;      /* some loop uses 16-byte vector loads/stores */
  char variant[FMT_VARIANT_LEN]; /* matmul/attention: the variant token; "" for other kernels */
  /* When the bundle's graph has ranged dims (ir.h: Graph.ranges), every
   * kernel takes one more parameter after the arguments, `const long long
   * *__restrict__ rng`: the run's value of each range, in device memory
   * (runtime/cuda_session.c keeps it up to date before each launch).
   * Bytes of scratch the kernel needs, zero when the session starts and
   * left zero by every launch (counters are reset by the block that uses
   * them last).  Non-zero: one more parameter after those,
   * `unsigned char *__restrict__ ws`.  Kernels of a module run one after
   * another, so one buffer of the largest size serves them all. */
  uint64_t workspace;
  /* Then, per TMA descriptor: a `const __grid_constant__ smelt_tmap`
   * parameter (128 bytes, by value). */
  int ntmaps;
  FmtCudaTmap tmaps[FMT_MAX_TMAPS];
  /* The kernel may be launched with programmatic dependent launch (sm_90+):
   * its code waits for the kernels before it (griddepcontrol.wait) before
   * it touches anything but its constants, and then lets the next one
   * start (griddepcontrol.launch_dependents). */
  bool pdl;
} FmtCudaLaunch;

typedef struct {
  int nkernels;
  FmtCudaLaunch *kernels; /* one per Kernel, in Kernel order */
  int nunits;
  char **units;          /* per unit: a complete CUDA C translation unit */
} FmtCudaModule;

/* A launch that is a collective (kind "collective"): no code to load. */
static inline bool fmt_cuda_launch_is_collective(const FmtCudaLaunch *l) {
  return l->kind && strcmp(l->kind, "collective") == 0;
}

void fmt_cuda_module_free(FmtCudaModule *m);
/* Index of the kernel whose symbol or name is `name`, or -1. */
int fmt_cuda_module_find(const FmtCudaModule *m, const char *name);

/* The launch table and unit count as text ("smelt-cuda-launch 3" then one
 * line per kernel), for a bundle; the sources travel separately.  Decoding
 * treats the text as untrusted and checks every field; the decoded module
 * has no sources (units[i] == NULL) unless the caller sets them. */
smelt_status fmt_cuda_launch_encode(const FmtCudaModule *m, char **out_text, size_t *out_len) SMELT_MUST_USE;
smelt_status fmt_cuda_launch_decode(const void *text, size_t len, FmtCudaModule **out_module) SMELT_MUST_USE;

#endif
