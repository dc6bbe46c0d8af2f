/* The CUDA backend: Kernels (codegen/kernel.h) to CUDA C that a person can
 * read, compiled with NVRTC to a cubin (and PTX) per requested arch.
 *
 * Generation (cg_cuda_generate) needs nothing from CUDA: it writes one
 * __global__ function per Kernel, named after the Kernel (made a C
 * identifier), with a comment block naming the YAML nodes it computes,
 * their shapes, the estimated bytes and FLOPs, and what each argument is.
 * Its launch configuration (grid, block, dynamic shared memory) is fixed at
 * generation time, because every shape is: a specialisation with other
 * dims is another graph.
 *
 * Kernel ABI: the parameters are the Kernel's arguments in order, each a
 * device pointer to the value's data (inputs `const T *__restrict__`, then
 * outputs `T *__restrict__`), so cuLaunchKernel's kernelParams is an array
 * of pointers to those device pointers.  Storage types: f32 float, f16
 * __half, bf16 __nv_bfloat16, f64 double, i64 long long, i32 int, i8 signed
 * char, u8 and bool unsigned char (0/1).  Arguments must not overlap each
 * other (the code says __restrict__), like the CPU backend's.
 *
 * Compilation units: the kernels of a module are split into at most
 * `max_units` sources (contiguous runs of kernels), each a complete
 * translation unit (prelude + its kernels).  Each unit is one NVRTC
 * program, so the units of a model compile in parallel, and each unit is
 * cached on its own: one changed kernel recompiles one unit.  At run time
 * each unit's cubin is one CUmodule.
 *
 * Layers, bottom-up: each file includes and
 * calls only the headers of the layers below it.
 *   cu_emit.h     text.c scalar.c emit.c: the per-kernel state, C text,
 *                 emission at coordinates                    (bottom)
 *   table.h       table.c: the tuning table
 *   cu_fn.h       fn.c: setting up a kernel's state, choosing its variant
 *   cu_gemm.h     gemm.c: a contraction as a batch of GEMMs
 *   cu_tc.h       tc.c: tensor-core helpers and the tiled GEMM skeleton
 *   cu_families.h mma.c tf32.c gemv.c wgmma.c: the GEMM families, each one
 *                 CuGemmFamily entry
 *   cu_attention.h attention.c (shared) < flash.c, flashdec.c < attention_emit.c
 *   cu_kernels.h  elemwise.c reduction.c pool.c contraction.c (the family
 *                 table) attention_emit.c: one emitter per kind of anchor
 *   this header   module.c (the driver, the prelude), variants.c (the
 *                 tuner's candidates)                        (top)
 *   cu_cache.h    cache.c < nvrtc.c, apart from generation
 * Target facts (arch limits) come from the leaf ir/target.h.
 *
 * Objects returned through out_ parameters are owned by the caller and
 * released with the matching _free/_close function.  Nothing here prints or
 * exits; allocation failure while generating text aborts, as in the IR
 * (ir.h explains why).
 */
#ifndef SMELT_CG_CUDA_H
#define SMELT_CG_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/cuda_launch.h"
#include "format/kernel.h"
#include "ir/target.h"

/* ---- target facts ----
 * They live in the leaf ir/target.h (the passes need them too); these
 * names stay for the backend's callers. */

typedef IrCudaArchLimits CgCudaArchLimits;

/* ir_cuda_arch_limits: limits of "sm_90a", "sm_80", "compute_86", ...; an
 * unknown arch gets conservative values (48 KiB). */
static inline void cg_cuda_arch_limits(const char *arch, CgCudaArchLimits *out) { ir_cuda_arch_limits(arch, out); }
/* ir_cuda_onchip_budget: the fuse pass's on-chip budget for --target cuda
 * (227 KiB on sm_90, 163 KiB on sm_80). */
static inline int64_t cg_cuda_onchip_budget(const char *arch) { return ir_cuda_onchip_budget(arch); }

/* ---- generation ---- */

/* ---- variants and the tuning table ----
 * A matmul or attention kernel comes in variants: a kernel family and its
 * compile-time parameters, written as one token, e.g.
 *   "mma:bm=128,bn=128,bk=32,wm=64,wn=32,st=3,sk=1"   mma.sync (sm_80+)
 *   "wgmma:bm=128,bn=256,bk=64,st=4"                  wgmma + TMA (sm_90a only)
 *   "gemv:..."  "flash:..."  "flashdec:..."  "simple"
 * Each family parses and prints its own token (its file owns the syntax).
 * Which variant a kernel gets: a forced one (smelt tune's candidates), else
 * the tuning table's row for its shape (codegen/cuda/table.h), else a
 * heuristic, logged as a miss.  The launch table records the variant. */
#define CG_VARIANT_LEN FMT_VARIANT_LEN
typedef struct CgTuneTable CgTuneTable;

typedef struct {
  /* Every argument pointer is at least 64-byte aligned (the runtime's arena
   * and cudaMalloc'd memory are): vector paths need no run-time check and
   * no scalar fallback.  false: each vectorised loop checks its pointers'
   * alignment at run time and falls back to scalar code. */
  bool args_aligned;
  int max_units;  /* split into at most this many compilation units; 0 = 16 */
  /* The arch variants are chosen for ("sm_90a"): the one arch the module is
   * compiled for.  NULL (or several archs): variants every sm_80+ GPU runs
   * (no wgmma/TMA).  Hopper-only variants need an 'a' arch of CC 9.0. */
  const char *arch;
  const CgTuneTable *table;  /* tuned variants by shape; NULL: heuristics only */
  const char *const *force;  /* NULL, or per kernel (nk entries) a variant token or NULL */
  /* f32 matmuls may use the TF32 tensor cores ("tf32:..." variants,
   * codegen/cuda/tf32.c): operands rounded to a 10-bit mantissa, f32
   * accumulation, like torch.backends.cuda.matmul.allow_tf32.  false: f32
   * matmuls are computed in f32, and a tuning-table row naming a tf32
   * variant is not used. */
  bool allow_tf32;
  /* Tests only: also emit the host side of the kernels, the stand-ins for
   * the PTX (ldmatrix, mma.sync, cp.async, ...) under #ifndef __CUDA_ARCH__
   * / #else that the CPU emulation (tests/gpu/cuda_emu.hpp) compiles the
   * units with.  false: the kernels hold only the device code NVRTC
   * compiles, and the __CUDA_ARCH__ conditionals are resolved. */
  bool emulation;
  /* Called with one line per kernel whose shape the table does not have
   * ("no tuned variant for matmul f16 sm_90a M=37 N=4096 K=4096 ...:
   * heuristic mma:..."); NULL: not reported. */
  void (*log)(void *ctx, const char *msg);
  void *log_ctx;
} CgCudaOptions;

/* Generates CUDA C for kernels k[0..nk) of g (as cg_lower made them).
 * opt may be NULL (run-time alignment checks, 16 units).  A group shape the
 * backend cannot generate is ST_UNSUPPORTED naming the kernel. */
smelt_status cg_cuda_generate(const Graph *g, const Kernel *k, int nk, const CgCudaOptions *opt,
                              FmtCudaModule **out_module) SMELT_MUST_USE;

/* ---- tuning (codegen/cuda/variants.c) ---- */

/* The table key of a kernel whose anchor is a matmul or an attention:
 * op ("matmul", "attention"), dtype ("f16"), m (the rows: M of the matmul,
 * S of the attention) and the rest of the shape as "N=.. K=.. Z=.. tb=.." or
 * "T=.. D=.. H=.. Hkv=.. causal=..".  false for any other kernel. */
typedef struct {
  char op[16];
  char dtype[8];
  int64_t m;
  char rest[128];
} CgTuneKey;
bool cg_cuda_tune_key(const Graph *g, const Kernel *k, CgTuneKey *out);
/* The variants the backend can generate for kernel k on arch (NULL:
 * portable ones), the heuristic's choice first: at most max tokens into
 * out.  Returns how many (0 for a kernel without variants). */
int cg_cuda_variants(const Graph *g, const Kernel *k, const char *arch, char (*out)[CG_VARIANT_LEN], int max);
/* The same with TF32 allowed (CgCudaOptions.allow_tf32): an f32 matmul's
 * list then has the tf32 variants, the heuristic's (tf32) first (tf32.c). */
int cg_cuda_variants_tf32(const Graph *g, const Kernel *k, const char *arch, char (*out)[CG_VARIANT_LEN], int max);

/* ---- NVRTC (codegen/cuda/nvrtc.c) ----
 * libnvrtc is loaded with dlopen ("libnvrtc.so", then .so.13, .so.12): smelt
 * has no link-time dependency on CUDA.  Without it, cg_cuda_nvrtc_open
 * returns ST_UNSUPPORTED and everything else keeps working. */

typedef struct CgNvrtc CgNvrtc;

/* Loads NVRTC and finds the CUDA include directory that cuda_fp16.h and
 * cuda_bf16.h need ($CUDA_HOME/include, $CUDA_PATH/include,
 * /usr/local/cuda/include, or next to the library).  Thread-safe after
 * creation: several threads may compile with one CgNvrtc. */
smelt_status cg_cuda_nvrtc_open(CgNvrtc **out_nvrtc) SMELT_MUST_USE;
void cg_cuda_nvrtc_close(CgNvrtc *nv);
/* "13.0" */
const char *cg_cuda_nvrtc_version(const CgNvrtc *nv);
/* The include directory found (may be "" when none was: sources that use
 * f16/bf16 then fail to compile with a message saying so). */
const char *cg_cuda_nvrtc_include_dir(const CgNvrtc *nv);

typedef struct {
  int threads;           /* compile threads; 0 = number of CPUs */
  const char *cache_dir; /* NULL = $SMELT_CACHE_DIR, else $XDG_CACHE_HOME/smelt, else ~/.cache/smelt */
  bool no_cache;         /* neither read nor write the disk cache */
} CgCudaCompileOptions;

/* The result of compiling one source for one arch. */
typedef struct {
  char arch[16];         /* "sm_90a" */
  void *cubin;           /* malloc'd */
  size_t cubin_len;
  char *ptx;             /* malloc'd, NUL-terminated; ptx_len excludes the NUL */
  size_t ptx_len;
  bool cache_hit;
  double compile_ms;     /* 0 on a cache hit */
} CgCudaBinary;

void cg_cuda_binary_clear(CgCudaBinary *b);

/* Compiles one CUDA C source for one arch ("sm_90a", "sm_80"): a cubin and
 * the PTX it came from, through the disk cache (keyed by a SHA-256 of the
 * source, the options, the arch and the NVRTC version).  A compile error
 * carries NVRTC's program log; `what` names the source in messages. */
smelt_status cg_cuda_compile_source(CgNvrtc *nv, const char *source, const char *what, const char *arch,
                                    const CgCudaCompileOptions *o, CgCudaBinary *out) SMELT_MUST_USE;

/* Compiles every unit of m for every arch, (unit, arch) pairs in parallel
 * on o->threads threads.  out[u * narch + a] is unit u for archs[a]; the
 * array (nunits * narch entries) is owned by the caller: release with
 * cg_cuda_binaries_free.  Fails with the first error (in unit order). */
smelt_status cg_cuda_compile_module(CgNvrtc *nv, const FmtCudaModule *m, const char *const *archs, int narch,
                                    const CgCudaCompileOptions *o, CgCudaBinary **out) SMELT_MUST_USE;
void cg_cuda_binaries_free(CgCudaBinary *b, int n);

/* ---- the compilation cache (codegen/cuda/cache.c) ---- */

/* The cache directory the options select (malloc'd), or NULL when no
 * directory can be named (no HOME). */
char *cg_cuda_cache_dir(const CgCudaCompileOptions *o);
/* mkdir -p for a cache directory; failures show later as a failed open,
 * which is fine for a cache. */
void cg_cuda_make_dirs(const char *path);
/* SHA-256 of n bytes, as 64 lowercase hex digits and a NUL. */
void cg_cuda_sha256_hex(const void *data, size_t n, char out[65]);

#endif
