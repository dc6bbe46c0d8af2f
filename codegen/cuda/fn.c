/* The per-kernel state and the choice of a kernel's variant.
 *
 * cu_fn_init gathers what every emitter asks about the kernel: which
 * values are its arguments, which nodes are members of its group, which
 * of those read the anchor's result (directly or through members: they
 * form the epilogue), the anchor itself, and the index type (int, or long
 * long when a tensor has 2^31 elements or more).
 *
 * Variant selection: a kernel's shape is summed up as a tuning key
 * (cg_cuda_tune_key): the op, the dtype, the rows m (matmul M, attention
 * query length S, conv2d images) and the rest of the shape as sorted "k=v" tokens, so
 * that the key is also the tuning table's row key (table.h).  Selection,
 * in order of precedence:
 *   1. a forced token (CgCudaOptions.force: smelt tune compiling one
 *      candidate per kernel copy);
 *   2. the table's row for the key on the target arch (interval lookup on
 *      m);
 *   3. the family's heuristic, reported through CgCudaOptions.log as a
 *      table miss when a table was given.
 * The emitters (contraction.c, attention.c) parse the token; each family
 * owns its syntax.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cu_fn.h"
#include "codegen/cuda/table.h"

/* ---- the per-kernel state ---- */

/* Sets up the generation state of kernel k (module.c's gen_kernel and the
 * tuner's queries share it); release with cu_fn_fini. */
smelt_status cu_fn_init(CuFn *f, const Graph *g, const Kernel *k, const CgCudaOptions *opt, const char *force) {
  memset(f, 0, sizeof *f);
  if (k->group < 0 || k->group >= g->ngroups)
    return st_error(ST_INTERNAL, "CUDA kernel %s: group %d does not exist", k->name, k->group);
  f->g = g;
  f->k = k;
  f->grp = &g->groups[k->group];
  f->opt = opt;
  f->ov_value = -1;
  f->nin = k->nargs - k->nouts;
  f->force = force;
  f->arg_of = malloc(sizeof(int) * (size_t)(g->nval ? g->nval : 1));
  f->member = calloc((size_t)(g->nnode ? g->nnode : 1), sizeof(bool));
  f->dep = calloc((size_t)(g->nnode ? g->nnode : 1), sizeof(bool));
  f->vec_bytes = calloc((size_t)(k->nargs ? k->nargs : 1), sizeof(int));
  if (!f->arg_of || !f->member || !f->dep || !f->vec_bytes) {
    cu_fn_fini(f);
    return st_error(ST_NO_MEMORY, "out of memory generating CUDA kernel %s", k->name);
  }
  for (int v = 0; v < g->nval; v++) f->arg_of[v] = -1;
  int64_t biggest = 0;
  for (int a = 0; a < k->nargs; a++) {
    f->arg_of[k->args[a]] = a;
    int64_t n = ir_type_numel(&g->val[k->args[a]].type);
    if (n > biggest) biggest = n;
  }
  f->anchor = cg_group_anchor(g, f->grp, &f->nanchors);
  for (int i = 0; i < f->grp->nnodes; i++) {
    int id = f->grp->nodes[i];
    const Node *n = &g->node[id];
    f->member[id] = true;
    for (int o = 0; o < n->nout; o++) {
      int64_t c = ir_type_numel(&g->val[n->out[o]].type);
      if (c > biggest) biggest = c;
    }
  }
  /* members are in topological order: one sweep finds what reads the anchor */
  for (int i = 0; i < f->grp->nnodes; i++) {
    int id = f->grp->nodes[i];
    const Node *n = &g->node[id];
    bool d = id == f->anchor;
    for (int j = 0; j < n->nin && !d; j++) {
      const Value *v = &g->val[n->in[j]];
      d = v->kind == VK_NODE && f->member[v->node] && f->dep[v->node];
    }
    f->dep[id] = d;
  }
  f->idx = biggest >= ((int64_t)1 << 31) - 1024 ? "long long" : "int";
  return NULL;
}

void cu_fn_fini(CuFn *f) {
  arena_free_all(&f->arena);
  free(f->arg_of), free(f->member), free(f->dep), free(f->vec_bytes);
  f->arg_of = NULL, f->member = f->dep = NULL, f->vec_bytes = NULL, f->memo = NULL; /* memo lives in the arena */
  st_free(f->err);
  f->err = NULL;
}

const char *cu_forced_variant(const CuFn *f) { return f->force && f->force[0] ? f->force : NULL; }

void cu_log(CuFn *f, const char *fmt, ...) {
  if (!f->opt->log) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  f->opt->log(f->opt->log_ctx, msg);
}

/* ---- variant selection ---- */

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
    /* a weight dequantised in the kernel (qgemv.c) is another kernel than
     * the float one: its group and quantised dtype join the key (left out
     * otherwise, so that the keys of the tables stay) */
    char quant[48] = "";
    const Value *b = &g->val[an->in[1]];
    if (b->kind == VK_NODE && g->node[b->node].op == OP_DEQUANTIZE && g->node[b->node].group == k->group) {
      const Node *dq = &g->node[b->node];
      snprintf(quant, sizeof quant, " g=%lld q=%s", (long long)ir_attr_int(dq, "group"), dtype_name(g->val[dq->in[0]].type.dt));
    }
    /* sorted by name, as the table keeps them */
    snprintf(out->rest, sizeof out->rest, "K=%lld N=%lld Z=%lld%s ta=%d tb=%d", (long long)K, (long long)N, (long long)Z,
             quant, ta, tb);
    return true;
  }
  if (an->op == OP_CONV2D) {
    /* m: the images; the rest: everything the implicit GEMM's shape and
     * addressing depend on */
    const TensorType *xt = &g->val[an->in[0]].type, *wt = &g->val[an->in[1]].type, *yt = &g->val[an->out[0]].type;
    const Attr *st = ir_attr(an, "strides"), *pd = ir_attr(an, "pads"), *dl = ir_attr(an, "dilations");
    if (!st || !pd || !dl || st->n < 2 || pd->n < 2 || dl->n < 2) return false;
    snprintf(out->op, sizeof out->op, "conv2d");
    snprintf(out->dtype, sizeof out->dtype, "%s", dtype_name(yt->dt));
    out->m = xt->dim[0];
    snprintf(out->rest, sizeof out->rest,
             "C=%lld H=%lld KH=%lld KW=%lld O=%lld OH=%lld OW=%lld W=%lld dh=%lld dw=%lld g=%lld pl=%lld pt=%lld sh=%lld sw=%lld",
             (long long)xt->dim[1], (long long)xt->dim[2], (long long)wt->dim[2], (long long)wt->dim[3],
             (long long)wt->dim[0], (long long)yt->dim[2], (long long)yt->dim[3], (long long)xt->dim[3],
             (long long)dl->ints[0], (long long)dl->ints[1], (long long)ir_attr_int(an, "groups"), (long long)pd->ints[1],
             (long long)pd->ints[0], (long long)st->ints[0], (long long)st->ints[1]);
    return true;
  }
  if (an->op == OP_ATTENTION) {
    const TensorType *qt = &g->val[an->in[0]].type, *kt = &g->val[an->in[1]].type;
    snprintf(out->op, sizeof out->op, "attention");
    snprintf(out->dtype, sizeof out->dtype, "%s", dtype_name(qt->dt));
    out->m = qt->dim[2];
    /* cache: true (the 4th input is the positions, not a mask): a token of
     * its own, left out otherwise so that the keys of the tables stay */
    bool cache = ir_attr_int(an, "cache") != 0;
    snprintf(out->rest, sizeof out->rest, "B=%lld D=%lld H=%lld Hkv=%lld T=%lld%s causal=%d mask=%d",
             (long long)qt->dim[0], (long long)qt->dim[3], (long long)qt->dim[1], (long long)kt->dim[1],
             (long long)kt->dim[2], cache ? " cache=1" : "", ir_attr_int(an, "causal") != 0, an->nin > 3 && !cache);
    return true;
  }
  return false;
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
