/* Variant selection: which kernel family and parameters a matmul or an
 * attention gets, and what the tuner may try.
 *
 * A kernel's shape is summed up as a tuning key (cg_cuda_tune_key): the
 * op, the dtype, the rows m (matmul M, attention query length S) and the
 * rest of the shape as sorted "k=v" tokens, so that the key is also the
 * tuning table's row key (table.h).  Selection, in order of precedence:
 *   1. a forced token (CgCudaOptions.force: smelt tune compiling one
 *      candidate per kernel copy);
 *   2. the table's row for the key on the target arch (interval lookup on
 *      m);
 *   3. the family's heuristic, reported through CgCudaOptions.log as a
 *      table miss when a table was given.
 * The emitters (contraction.c, attention.c) parse the token; each family
 * owns its syntax.
 */
#include <stdio.h>
#include <string.h>

#include "codegen/cuda/cu_internal.h"
#include "codegen/cuda/table.h"

bool cu_hopper(const CuFn *f) {
  int cc;
  bool specific;
  return f->opt && f->opt->arch && ir_cuda_parse_arch(f->opt->arch, &cc, &specific) && cc == 90 && specific;
}

static const char *dtype_name(DType dt) { return dt_name(dt); }

bool cg_cuda_tune_key(const Graph *g, const Kernel *k, CgTuneKey *out) {
  memset(out, 0, sizeof *out);
  if (k->group < 0 || k->group >= g->ngroups) return false;
  int count;
  int anchor = cg_group_anchor(g, &g->groups[k->group], &count);
  if (anchor < 0 || count != 1) return false;
  const Node *an = &g->node[anchor];
  if (an->op == OP_MATMUL) {
    const TensorType *at = &g->val[an->in[0]].type, *bt = &g->val[an->in[1]].type, *yt = &g->val[an->out[0]].type;
    bool ta = ir_attr_int(an, "transpose_a") != 0, tb = ir_attr_int(an, "transpose_b") != 0;
    int ra = at->rank, rb = bt->rank;
    int64_t M = ra == 1 ? 1 : at->dim[ta ? ra - 1 : ra - 2];
    int64_t K = ra == 1 ? at->dim[0] : at->dim[ta ? ra - 2 : ra - 1];
    int64_t N = rb == 1 ? 1 : bt->dim[tb ? rb - 2 : rb - 1];
    int64_t Z = 1;
    int nbatch = yt->rank - (ra == 1 ? 0 : 1) - (rb == 1 ? 0 : 1);
    for (int d = 0; d < nbatch; d++) Z *= yt->dim[d];
    snprintf(out->op, sizeof out->op, "matmul");
    snprintf(out->dtype, sizeof out->dtype, "%s", dtype_name(yt->dt));
    out->m = M;
    /* sorted by name, as the table keeps them */
    snprintf(out->rest, sizeof out->rest, "K=%lld N=%lld Z=%lld ta=%d tb=%d", (long long)K, (long long)N, (long long)Z,
             ta, tb);
    return true;
  }
  if (an->op == OP_ATTENTION) {
    const TensorType *qt = &g->val[an->in[0]].type, *kt = &g->val[an->in[1]].type;
    snprintf(out->op, sizeof out->op, "attention");
    snprintf(out->dtype, sizeof out->dtype, "%s", dtype_name(qt->dt));
    out->m = qt->dim[2];
    snprintf(out->rest, sizeof out->rest, "B=%lld D=%lld H=%lld Hkv=%lld T=%lld causal=%d mask=%d",
             (long long)qt->dim[0], (long long)qt->dim[3], (long long)qt->dim[1], (long long)kt->dim[1],
             (long long)kt->dim[2], ir_attr_int(an, "causal") != 0, an->nin > 3);
    return true;
  }
  return false;
}

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
  int n = strcmp(key.op, "matmul") == 0 ? cu_contraction_candidates(&f, out, max) : cu_attention_candidates(&f, out, max);
  cu_fn_fini(&f);
  return n;
}

const char *cu_pick_variant(CuFn *f, bool *out_from_table) {
  *out_from_table = false;
  const char *forced = cu_forced_variant(f);
  if (forced) return forced;
  if (!f->opt->table) return NULL;
  CgTuneKey key;
  if (!cg_cuda_tune_key(f->g, f->k, &key)) return NULL;
  const CgTuneRow *r = cg_tune_lookup(f->opt->table, f->opt->arch ? f->opt->arch : "", &key);
  if (!r) return NULL;
  *out_from_table = true;
  return cu_fmt(f, "%s", r->variant);
}

void cu_note_heuristic(CuFn *f, const char *variant) {
  if (!f->opt->table || cu_forced_variant(f)) return;
  CgTuneKey key;
  if (!cg_cuda_tune_key(f->g, f->k, &key)) return;
  cu_log(f, "no tuned variant for %s %s %s m=%lld %s (kernel %s): heuristic %s", key.op, key.dtype,
         f->opt->arch ? f->opt->arch : "(portable)", (long long)key.m, key.rest, f->k->name, variant);
}
