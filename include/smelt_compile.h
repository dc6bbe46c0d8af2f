/* smelt — the compiler's public C API (libsmelt, on top of libsmelt_runtime).
 *
 * Compile a model (YAML) into a kernel bundle that the runtime
 * (include/smelt.h) opens and runs.  The conventions are the runtime's:
 * statuses, out_ parameters owned by the caller, no global state, nothing
 * printed.  Linking: `pkg-config --libs smelt`, or CMake's smelt::smelt.
 */
#ifndef SMELT_COMPILE_H
#define SMELT_COMPILE_H

#include "smelt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const char *targets;   /* "cpu", "cuda" or "cpu,cuda"; NULL = "cpu" */
  const char *dims;      /* "seq=1,128;hidden=64": dims overrides, several values = specialisations; NULL = none */
  const char *dtype;     /* default element type override ("f16"); NULL = the model's */
  const char *passes;    /* pass list; NULL = the default pipeline */
  const char *cpu;       /* LLVM CPU name; NULL = the host's */
  int64_t onchip_bytes;  /* fusion budget per tile; 0 = the target's */
  int threads;           /* recorded default thread count; 0 = number of cores */
  int allow_tf32;        /* non-zero: f32 matmuls may use the TF32 tensor cores (CUDA; operands
                          * rounded to a 10-bit mantissa, f32 accumulation), like PyTorch's
                          * torch.backends.cuda.matmul.allow_tf32; 0 = f32 throughout */
  int external_weights;  /* non-zero: weights read from the model's safetensors files stay there; the
                          * bundle names the files (path and content hash) and the runtime maps them
                          * at load, refusing a file that changed */
  int no_cache;          /* non-zero: neither look in nor fill the compile cache
                          * ($SMELT_CACHE_DIR/bundles, as the CUDA kernel cache) */
  int tp;                /* tensor parallelism: > 1 splits the model over tp ranks (the shard pass),
                          * one part per rank in the bundle; a session runs the ranks on threads of
                          * its own, collectives in process on the CPU and through NCCL on GPUs */
} smelt_compile_options;

/* Compiles the YAML model at model_path into the bundle file out_path.
 * options may be NULL (defaults). */
smelt_status smelt_compile(const char *model_path, const smelt_compile_options *options, const char *out_path);

/* NVRTC as the runtime's CUDA compiler hook (smelt_cuda_compile_fn): loads
 * libnvrtc with dlopen, compiles through the disk cache (keyed by source,
 * options, arch and NVRTC version).  ctx is unused (NULL).  SMELT_UNSUPPORTED
 * when NVRTC cannot be loaded. */
smelt_status smelt_nvrtc_compile(void *ctx, const char *source, const char *what, const char *arch,
                                 void **out_cubin, size_t *out_len);

#ifdef __cplusplus
}
#endif

#endif
