/* layout: weight layouts the target's kernels read best.
 *
 * For --target cuda, a matmul weight B stored [K, N] (a 2-D f16/bf16
 * constant, transpose_b false) is stored transposed, [N, K], and its
 * matmuls read it with transpose_b: every output column's weights are
 * then one contiguous row along K.  That is the layout the decode GEMV
 * streams with 16-byte loads along K, and the K-major operand layout that
 * Hopper's wgmma and the TMA copies take without a transpose (the
 * mma.sync kernel reads both).  PyTorch's nn.Linear keeps its weights the
 * same way ([out, in]).
 *
 * The constant is transposed in place (same value, same name, shape
 * [N, K]), so no second copy of a weight exists; it is done only when
 * every use of the constant is such a matmul's B operand (a weight also
 * read by another op keeps its layout).  The CPU target packs its
 * weights itself at code generation, so for it the pass changes nothing.
 *
 * Requires: const-fold (weights computed from constants are constants by
 * then).  Runs before fuse.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static bool is_weight_matmul(const Node *n, int v) {
  if (n->dead || n->op != OP_MATMUL || n->nin < 2 || n->in[1] != v || n->in[0] == v) return false;
  if (ir_attr_int(n, "transpose_b") != 0) return false;
  return true;
}

/* Whether constant v is read only as the B operand of matmuls that do not
 * transpose it, at least once. */
static bool only_weight_uses(const Graph *g, int v) {
  int uses = 0;
  for (int i = 0; i < g->nnode; i++) {
    const Node *n = &g->node[i];
    if (n->dead) continue;
    for (int j = 0; j < n->nin; j++) {
      if (n->in[j] != v) continue;
      if (!is_weight_matmul(n, v)) return false;
      uses++;
    }
  }
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i] == v) return false;
  return uses > 0;
}

smelt_status pass_layout(Graph *g, PassCtx *ctx, bool *changed) {
  *changed = false;
  if (!ctx->target || !strstr(ctx->target, "cuda")) return NULL;
  int done = 0;
  for (int v = 0; v < g->nval; v++) {
    Value *val = &g->val[v];
    if (val->kind != VK_CONST || !val->data || val->type.rank != 2) continue;
    if (val->type.dt != DT_F16 && val->type.dt != DT_BF16) continue;
    if (!only_weight_uses(g, v)) continue;
    int64_t K = val->type.dim[0], N = val->type.dim[1];
    size_t bytes = (size_t)(K * N) * sizeof(uint16_t);
    uint16_t *tmp = malloc(bytes ? bytes : 1);
    if (!tmp) return st_error(ST_NO_MEMORY, "out of memory transposing %s", val->name);
    const uint16_t *src = val->data;
    /* 64 x 64 blocks: both sides stay in cache (a 700 MB model's weights
     * are transposed in well under a second) */
    enum { TB = 64 };
    for (int64_t k0 = 0; k0 < K; k0 += TB)
      for (int64_t n0 = 0; n0 < N; n0 += TB) {
        int64_t k1 = k0 + TB < K ? k0 + TB : K, n1 = n0 + TB < N ? n0 + TB : N;
        for (int64_t k = k0; k < k1; k++)
          for (int64_t n = n0; n < n1; n++) tmp[n * K + k] = src[k * N + n];
      }
    memcpy(val->data, tmp, bytes);
    free(tmp);
    val->type.dim[0] = N, val->type.dim[1] = K;
    for (int i = 0; i < g->nnode; i++) {
      Node *n = &g->node[i];
      if (!n->dead && n->op == OP_MATMUL && n->nin >= 2 && n->in[1] == v) {
        ir_set_attr_bool(g, i, "transpose_b", true);
        RETURN_IF_ERROR(ir_infer_node(g, i));
      }
    }
    pass_ctx_logf(ctx, "layout: %s stored [%lld, %lld] (transpose_b) for the CUDA matmul kernels", val->name,
                  (long long)N, (long long)K);
    done++;
  }
  *changed = done > 0;
  return NULL;
}
