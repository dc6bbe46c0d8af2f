/* The variants the tuner may try for a kernel (cg_cuda_variants, and with
 * TF32 allowed cg_cuda_variants_tf32): the candidate lists of the
 * kernel's contraction or attention emitter, the heuristic's choice first.
 * The top layer of the backend beside module.c: it sets up a CuFn as the
 * driver does and asks the emitter; which variant a generated kernel gets
 * is decided lower down, in fn.c (cu_pick_variant).
 */
#include <stdio.h>
#include <string.h>

#include "codegen/cuda/cu_kernels.h"

int cg_cuda_variants(const Graph *g, const Kernel *k, const char *arch, char (*out)[CG_VARIANT_LEN], int max) {
  CgTuneKey key;
  if (max <= 0 || !cg_cuda_tune_key(g, k, &key)) return 0;
  CgCudaOptions opt = {.args_aligned = true, .arch = arch};
  CuFn f;
  smelt_status st = cu_fn_init(&f, g, k, &opt, NULL);
  if (st) {
    st_free(st);
    return 0;
  }
  /* the candidate lists look at shapes only, but emitters may note errors */
  bool contraction = strcmp(key.op, "matmul") == 0 || strcmp(key.op, "conv2d") == 0;
  int n = contraction ? cu_contraction_candidates(&f, out, max) : cu_attention_candidates(&f, out, max);
  cu_fn_fini(&f);
  return n;
}

int cg_cuda_variants_tf32(const Graph *g, const Kernel *k, const char *arch, char (*out)[CG_VARIANT_LEN], int max) {
  CgTuneKey key;
  if (max <= 0 || !cg_cuda_tune_key(g, k, &key)) return 0;
  if (strcmp(key.op, "matmul") != 0) return cg_cuda_variants(g, k, arch, out, max);
  CgCudaOptions opt = {.args_aligned = true, .arch = arch, .allow_tf32 = true};
  CuFn f;
  smelt_status st = cu_fn_init(&f, g, k, &opt, NULL);
  if (st) {
    st_free(st);
    return 0;
  }
  int n = cu_contraction_candidates(&f, out, max);
  cu_fn_fini(&f);
  return n;
}
