/* fuse-attention: rewrite the textbook attention subgraph into one
 * `attention` node, which the backends implement as a single flash-style
 * kernel (scores never reach memory).
 *
 * The match starts at every softmax over the last axis of a rank-4 tensor
 * and walks up and down from it:
 *
 *     scores = matmul(q, k, transpose_b) | matmul(q, transpose(k, [0,1,3,2]))
 *     scores = scores * c | c * scores | scores / c      (zero or more; c a
 *                                                         uniform constant)
 *     scores = scores + mask | mask + scores              (optional, or
 *            | where(cond, scores, fill) | where(cond, fill, scores))
 *     p      = softmax(scores, axis = -1)
 *     out    = matmul(p, v)
 *
 * with q [B,H,S,D], k [B,Hkv,T,D], v [B,Hkv,T,Dv].  When k and v were
 * widened from [B,Hkv,T,D] to H heads the way grouped-query attention does
 * it (reshape or unsqueeze to [B,Hkv,1,T,D], expand to [B,Hkv,G,T,D],
 * reshape to [B,H,T,D]) the chain is followed back to the narrow tensors,
 * since attention reads query head h from kv head h / G, which is exactly
 * what that expand builds.  Every intermediate (scores at each step and p)
 * must have no other user and not be a graph output: its node disappears.
 *
 * The result is attention(q, k, v[, mask]) with scale set explicitly to the
 * product of the constants (1 if there were none: attention's own default
 * is 1/sqrt(D), which the unfused graph did not apply).  Masks:
 *   - an additive constant mask that is 0 where key j <= T-S+i and <= -1e4
 *     (or -inf) elsewhere is the causal pattern: causal=true, no mask;
 *     an all-zero mask is dropped; any other additive mask stays as the 4th
 *     operand (it broadcasts to [B,H,S,T] because the add's result is the
 *     scores' shape);
 *   - where(cond, scores, fill) with a uniform fill <= -1e4 is a "may
 *     attend" bool mask, attention's meaning of a bool 4th operand; a
 *     constant cond is checked for the causal pattern the same way, and
 *     where(cond, fill, scores) is accepted when cond is constant (its
 *     negation is folded).  The rewrite differs from the unfused graph only
 *     for a query row whose keys are all masked (attention yields 0 there;
 *     softmax yields NaN or a uniform average, neither meaningful).
 * The attention result takes the name of the final matmul's result.  The
 * nodes that only fed k and v into the pattern (k's transpose, the GQA
 * widening) are removed when nothing else reads them, so the default
 * pipeline, where dce runs before this pass, does not keep them.
 *
 * Requires: topological order; canonicalize helps (explicit perms, constants
 * second) but is not needed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"
#include "rewrite.h"

#define MASKED_MAX (-1e4) /* an additive mask value at or below this masks a key */
#define MAX_CHAIN 16

typedef struct {
  int q, k, v, mask; /* mask: -1 when none */
  /* k_new: k is not a value of the graph yet but transpose(k_src, k_perm),
   * added with the attention node (the scores read k transposed in some
   * other way than a last-two swap of a [B,Hkv,T,D] tensor) */
  bool k_new;
  int k_src;
  int64_t k_perm[4];
  double scale;
  bool causal;
  bool negate_cond;  /* where(cond, fill, scores): the mask is !cond */
  int dead[MAX_CHAIN]; /* nodes the attention node replaces */
  int ndead;
  int spare[8]; /* nodes feeding k and v (k's transpose, the GQA widening),
                   consumers first: removed when the rewrite leaves them unused */
  int nspare;
} Match;

/* An intermediate of the pattern: read only by the next step of it. */
static bool private_value(const Graph *g, const int *uses, int v) {
  return uses[v] == 1 && !pass_is_output(g, v);
}

static bool push_dead(Match *m, const Graph *g, const Node *n) {
  if (m->ndead == MAX_CHAIN) return false;
  m->dead[m->ndead++] = (int)(n - g->node);
  return true;
}

static bool is_last_two_swap(const Graph *g, const Node *t) {
  const Attr *p = ir_attr(t, "perm");
  int rank = g->val[t->in[0]].type.rank;
  if (rank != 4) return false;
  if (!p) return false; /* absent means reversed: [3,2,1,0], not a swap of the last two */
  static const int64_t want[4] = {0, 1, 3, 2};
  for (int i = 0; i < 4; i++)
    if (ir_norm_axis(p->ints[i], 4) != want[i]) return false;
  return true;
}

/* Strips multiplications and divisions of value v by uniform constants
 * that keep its shape and have no other reader, folding them into the
 * scale (an exporter that scales q and k by D^-1/4 each, as torch's SDPA
 * decomposition does); returns the value below them, or -1 when the chain
 * is too long. */
static int strip_scale(Graph *g, const int *uses, int v, Match *m) {
  for (;;) {
    Node *p = pass_producer(g, v);
    double c;
    if (!p || !private_value(g, uses, v) || (p->op != OP_MUL && p->op != OP_DIV)) return v;
    int x = p->in[0], k = p->in[1];
    if (p->op == OP_MUL && !pass_const_uniform(g, k, &c)) x = p->in[1], k = p->in[0];
    if (!pass_const_uniform(g, k, &c) || !ir_type_equal(&g->val[x].type, &g->val[v].type)) return v;
    if (p->op == OP_DIV && c == 0) return v;
    if (!push_dead(m, g, p)) return -1;
    m->scale = p->op == OP_MUL ? m->scale * c : m->scale / c;
    v = x;
  }
}

/* k^T ([B,H,D,T], the matmul's second operand) back to k [B,H,T,D]:
 * through a last-two swap as it is; through another rank-4 transpose P by
 * one transpose of P's input, P with its last two entries swapped (BERT's
 * and GPT-2's exports go from [B,T,H,D] with [0,2,3,1]); anything else by a
 * transpose of k^T itself. */
static bool match_k(Graph *g, const int *uses, int kt, Match *m) {
  if ((kt = strip_scale(g, uses, kt, m)) < 0 || g->val[kt].type.rank != 4) return false;
  Node *t = pass_producer(g, kt);
  if (t && t->op == OP_TRANSPOSE && is_last_two_swap(g, t)) {
    m->k = t->in[0];
    m->spare[m->nspare++] = (int)(t - g->node); /* may have other users */
    return true;
  }
  const Attr *p = t && t->op == OP_TRANSPOSE ? ir_attr(t, "perm") : NULL;
  m->k_new = true;
  if (p && p->n == 4 && g->val[t->in[0]].type.rank == 4) {
    m->k_src = t->in[0];
    for (int i = 0; i < 4; i++) m->k_perm[i] = ir_norm_axis(p->ints[i < 2 ? i : 5 - i], 4);
    m->spare[m->nspare++] = (int)(t - g->node);
  } else {
    m->k_src = kt;
    static const int64_t swap[4] = {0, 1, 3, 2};
    memcpy(m->k_perm, swap, sizeof swap);
  }
  static const int64_t id[4] = {0, 1, 2, 3};
  if (!memcmp(m->k_perm, id, sizeof id)) m->k = m->k_src, m->k_new = false;
  return true;
}

/* Scale constants and the q @ k^T matmul below them. */
static bool match_scores(Graph *g, const int *uses, int v, Match *m) {
  for (;;) {
    Node *p = pass_producer(g, v);
    if (!p || !private_value(g, uses, v)) return false;
    double c;
    if (p->op == OP_MUL || p->op == OP_DIV) {
      int x = p->in[0], k = p->in[1];
      if (p->op == OP_MUL && !pass_const_uniform(g, k, &c)) x = p->in[1], k = p->in[0];
      if (!pass_const_uniform(g, k, &c)) return false;
      /* the constant must not broadcast the scores to a bigger shape */
      if (!ir_type_equal(&g->val[x].type, &g->val[v].type)) return false;
      if (p->op == OP_DIV && c == 0) return false;
      m->scale = p->op == OP_MUL ? m->scale * c : m->scale / c;
      if (!push_dead(m, g, p)) return false;
      v = x;
      continue;
    }
    if (p->op != OP_MATMUL || ir_attr_int(p, "transpose_a")) return false;
    if (!push_dead(m, g, p)) return false;
    if ((m->q = strip_scale(g, uses, p->in[0], m)) < 0) return false;
    if (ir_attr_int(p, "transpose_b")) return (m->k = strip_scale(g, uses, p->in[1], m)) >= 0;
    return match_k(g, uses, p->in[1], m);
  }
}

/* Walks back from v ([B,H,T,D]) through reshape <- expand <- reshape or
 * unsqueeze to the [B,Hkv,T,D] tensor; returns it (and the three nodes in
 * chain, consumers first), or -1. */
static int unexpand_kv(Graph *g, int v, int chain[3]) {
  const TensorType *t = &g->val[v].type;
  Node *r = pass_producer(g, v);
  if (t->rank != 4 || !r || r->op != OP_RESHAPE) return -1;
  Node *e = pass_producer(g, r->in[0]);
  if (!e || e->op != OP_EXPAND) return -1;
  const TensorType *et = &g->val[e->out[0]].type, *ut = &g->val[e->in[0]].type;
  if (et->rank != 5 || ut->rank != 5) return -1;
  int64_t B = t->dim[0], H = t->dim[1], T = t->dim[2], D = t->dim[3];
  int64_t Hkv = et->dim[1], G = et->dim[2];
  if (et->dim[0] != B || Hkv * G != H || et->dim[3] != T || et->dim[4] != D) return -1;
  if (ut->dim[0] != B || ut->dim[1] != Hkv || ut->dim[2] != 1 || ut->dim[3] != T || ut->dim[4] != D) return -1;
  Node *u = pass_producer(g, e->in[0]);
  if (!u || (u->op != OP_RESHAPE && u->op != OP_UNSQUEEZE)) return -1;
  int base = u->in[0];
  const TensorType *bt = &g->val[base].type;
  if (bt->rank != 4 || bt->dim[0] != B || bt->dim[1] != Hkv || bt->dim[2] != T || bt->dim[3] != D) return -1;
  chain[0] = (int)(r - g->node);
  chain[1] = (int)(e - g->node);
  chain[2] = (int)(u - g->node);
  return base;
}

/* Index ranges along S and T that mask element `lin` covers once broadcast
 * to [.., S, T]: a size-1 (or missing) dim covers the whole range. */
static void mask_cover(const TensorType *mt, int64_t lin, int64_t S, int64_t T, int64_t *i0, int64_t *i1, int64_t *j0,
                       int64_t *j1) {
  int r = mt->rank;
  int64_t ms = r >= 2 ? mt->dim[r - 2] : 1, mt_ = r >= 1 ? mt->dim[r - 1] : 1;
  int64_t j = lin % mt_, i = (lin / mt_) % ms;
  if (mt_ == 1) *j0 = 0, *j1 = T - 1;
  else *j0 = *j1 = j;
  if (ms == 1) *i0 = 0, *i1 = S - 1;
  else *i0 = *i1 = i;
}

/* Whether constant mask value `mv` (read as "may attend" when is_bool, else
 * as additive) expresses exactly the causal pattern for S queries, T keys. */
static bool mask_is_causal(const Graph *g, int mv, bool is_bool, bool negate, int64_t S, int64_t T) {
  const Value *c = &g->val[mv];
  if (c->kind != VK_CONST || S > T || S < 1) return false;
  int64_t n = ir_type_numel(&c->type);
  for (int64_t e = 0; e < n; e++) {
    int64_t i0, i1, j0, j1;
    mask_cover(&c->type, e, S, T, &i0, &i1, &j0, &j1);
    bool all_allowed = j1 <= T - S + i0, all_blocked = j0 > T - S + i1;
    double x = dt_load(c->type.dt, c->data, (size_t)e);
    bool attend;
    if (is_bool) attend = (x != 0) != negate;
    else if (x == 0) attend = true;
    else if (x <= MASKED_MAX) attend = false;
    else return false;
    if (attend ? !all_allowed : !all_blocked) return false;
  }
  return true;
}

static bool is_fill(const Graph *g, int v) {
  double c;
  return pass_const_uniform(g, v, &c) && c <= MASKED_MAX;
}

/* The optional mask step between the scores and the softmax. */
static bool match_masked_scores(Graph *g, const int *uses, int v, Match *m) {
  Node *p = pass_producer(g, v);
  if (p && p->op == OP_ADD && private_value(g, uses, v) &&
      g->val[p->in[0]].type.dt == g->val[v].type.dt && g->val[p->in[1]].type.dt == g->val[v].type.dt) {
    for (int side = 0; side < 2; side++) {
      Match t = *m;
      int s = p->in[side], mask = p->in[1 - side];
      if (!ir_type_equal(&g->val[s].type, &g->val[v].type) || !push_dead(&t, g, p)) continue;
      if (match_scores(g, uses, s, &t)) {
        t.mask = mask;
        *m = t;
        return true;
      }
    }
  }
  if (p && p->op == OP_WHERE && private_value(g, uses, v)) {
    int cond = p->in[0];
    for (int side = 1; side <= 2; side++) {
      Match t = *m;
      int s = p->in[side], fill = p->in[3 - side];
      if (!ir_type_equal(&g->val[s].type, &g->val[v].type) || !is_fill(g, fill)) continue;
      if (side == 2 && !ir_is_const(g, cond)) continue; /* !cond would need a new op */
      if (!push_dead(&t, g, p) || !match_scores(g, uses, s, &t)) continue;
      t.mask = cond;
      t.negate_cond = side == 2;
      *m = t;
      return true;
    }
  }
  return match_scores(g, uses, v, m);
}

/* The live node reading value v (v has exactly one use). */
static int sole_user(const Graph *g, int v) {
  for (int id = 0; id < g->nnode; id++) {
    const Node *n = &g->node[id];
    if (n->dead) continue;
    for (int i = 0; i < n->nin; i++)
      if (n->in[i] == v) return id;
  }
  return -1;
}

/* Checks shapes and dtypes of q, k, v against attention's contract, first
 * trying to undo a grouped-query widening of k and v. */
static bool check_qkv(Graph *g, Match *m, int out) {
  const TensorType *q = &g->val[m->q].type;
  int kc[3], vc[3];
  int kb = m->k_new ? -1 : unexpand_kv(g, m->k, kc), vb = unexpand_kv(g, m->v, vc);
  if (kb >= 0 && vb >= 0 && g->val[kb].type.dim[1] == g->val[vb].type.dim[1]) {
    m->k = kb, m->v = vb;
    for (int i = 0; i < 3; i++) m->spare[m->nspare++] = kc[i];
    for (int i = 0; i < 3; i++) m->spare[m->nspare++] = vc[i];
  }
  TensorType knew;
  if (m->k_new) { /* the type transpose(k_src, k_perm) will have */
    const TensorType *src = &g->val[m->k_src].type;
    knew = *src;
    for (int i = 0; i < 4; i++) knew.dim[i] = src->dim[m->k_perm[i]];
  }
  const TensorType *k = m->k_new ? &knew : &g->val[m->k].type, *v = &g->val[m->v].type;
  if (q->rank != 4 || k->rank != 4 || v->rank != 4 || !dt_is_float(q->dt) || k->dt != q->dt || v->dt != q->dt)
    return false;
  int64_t B = q->dim[0], H = q->dim[1], S = q->dim[2], D = q->dim[3], Hkv = k->dim[1], T = k->dim[2];
  if (k->dim[0] != B || v->dim[0] != B || v->dim[1] != Hkv || v->dim[2] != T || k->dim[3] != D) return false;
  /* a kv head dim of 1 broadcast by matmul is attention with Hkv = 1 */
  if (Hkv < 1 || H % Hkv != 0) return false;
  TensorType want = {.dt = q->dt, .rank = 4, .dim = {B, H, S, v->dim[3]}};
  return ir_type_equal(&want, &g->val[out].type);
}

/* S queries and T keys: the scores' last two dims. */
static void decide_mask(Graph *g, Match *m, int64_t S, int64_t T) {
  if (m->mask < 0) return;
  bool is_bool = g->val[m->mask].type.dt == DT_BOOL;
  double c;
  /* a mask that masks nothing: additive zeros, or "may attend" everywhere */
  if (pass_const_uniform(g, m->mask, &c) && (is_bool ? (c != 0) != m->negate_cond : c == 0)) {
    m->mask = -1;
    return;
  }
  if (mask_is_causal(g, m->mask, is_bool, m->negate_cond, S, T)) {
    m->causal = true;
    m->mask = -1;
    return;
  }
  if (m->negate_cond) { /* a constant cond: store its negation */
    const Value *cv = &g->val[m->mask];
    char base[512];
    snprintf(base, sizeof base, "%s.not", cv->name);
    int nv = ir_add_const(g, pass_fresh_name(g, base), g->val[m->mask].type, NULL, g->val[m->mask].loc);
    g->val[nv].init = "folded";
    if (!g->val[nv].data) return; /* out of memory: the graph is marked */
    int64_t n = ir_type_numel(&g->val[nv].type);
    for (int64_t i = 0; i < n; i++)
      dt_store(DT_BOOL, g->val[nv].data, (size_t)i, dt_load(DT_BOOL, g->val[m->mask].data, (size_t)i) != 0 ? 0 : 1);
    m->mask = nv;
    m->negate_cond = false;
  }
}

/* The transpose of k and the GQA widening nodes now feed nothing, unless
 * something else reads them: drop them here, so the default pipeline (where
 * dce runs before this pass) does not keep them. */
static void remove_unused_spares(Graph *g, const Match *m) {
  int *uses = ir_use_counts(g); /* live nodes only: the replaced chain is dead */
  for (int i = 0; uses && i < m->nspare; i++) { /* out of memory: dce drops them later */
    Node *n = &g->node[m->spare[i]];
    if (n->dead || uses[n->out[0]] > 0) continue;
    n->dead = true;
    for (int j = 0; j < n->nin; j++) uses[n->in[j]]--;
  }
  free(uses);
}

/* Infers the type of a node the rewrite added.  The checks above mirror
 * the inference; if they ever drift, the graph is left as it was (the node,
 * and `also` when >= 0, dropped) rather than the compile failed. */
static bool inferred(Graph *g, PassCtx *ctx, int node, const char *name, int also) {
  smelt_status st = ir_infer_node(g, node);
  if (!st) return true;
  g->node[node].dead = true;
  if (also >= 0) g->node[also].dead = true;
  pass_ctx_logf(ctx, "fuse-attention: not fusing '%s': %s", name, st_message(st));
  st_free(st);
  return false;
}

/* Tries the pattern around softmax node sid; on success rewrites the graph. */
static smelt_status try_fuse(Graph *g, PassCtx *ctx, const int *uses, int sid, bool *done) {
  Node *sm = &g->node[sid];
  int x = sm->in[0], p = sm->out[0];
  const TensorType *xt = &g->val[x].type;
  if (xt->rank != 4 || ir_norm_axis(ir_attr_int(sm, "axis"), 4) != 3) return NULL;
  if (!private_value(g, uses, p)) return NULL;
  int fid = sole_user(g, p);
  if (fid < 0) return NULL;
  Node *fin = &g->node[fid];
  if (fin->op != OP_MATMUL || fin->in[0] != p || fin->in[1] == p || ir_attr_int(fin, "transpose_a") ||
      ir_attr_int(fin, "transpose_b"))
    return NULL;
  Match m = {.q = -1, .k = -1, .v = fin->in[1], .mask = -1, .scale = 1.0};
  push_dead(&m, g, fin);
  push_dead(&m, g, sm);
  if (!match_masked_scores(g, uses, x, &m)) return NULL;
  int out = fin->out[0];
  if (!check_qkv(g, &m, out)) return NULL;
  decide_mask(g, &m, xt->dim[2], xt->dim[3]);

  const char *name = g->val[out].name;
  if (m.k_new) {
    char base[512];
    snprintf(base, sizeof base, "%s.k", name);
    const char *kname = pass_fresh_name(g, base);
    int tn = ir_add_node(g, OP_TRANSPOSE, 1, &m.k_src, 1, &kname, g->node[fid].loc);
    ir_set_attr_ints(g, tn, "perm", m.k_perm, 4);
    if (!inferred(g, ctx, tn, name, -1)) return NULL;
    m.k = g->node[tn].out[0];
    name = g->val[out].name; /* adding may have moved the values */
  }
  int in[4] = {m.q, m.k, m.v, m.mask};
  int nin = m.mask >= 0 ? 4 : 3;
  int an = ir_add_node(g, OP_ATTENTION, nin, in, 1, &name, g->node[fid].loc);
  ir_set_attr_float(g, an, "scale", m.scale);
  ir_set_attr_bool(g, an, "causal", m.causal);
  ir_fill_default_attrs(g, an);
  if (!inferred(g, ctx, an, name, m.k_new ? g->val[m.k].node : -1)) return NULL;
  for (int i = 0; i < m.ndead; i++) g->node[m.dead[i]].dead = true;
  ir_replace_all_uses(g, out, g->node[an].out[0]);
  remove_unused_spares(g, &m);
  pass_ctx_logf(ctx, "fuse-attention: '%s' = attention('%s', '%s', '%s'%s%s%s) scale=%g causal=%s (%d nodes replaced)",
                name, g->val[m.q].name, g->val[m.k].name, g->val[m.v].name, m.mask >= 0 ? ", '" : "",
                m.mask >= 0 ? g->val[m.mask].name : "", m.mask >= 0 ? "'" : "", m.scale, m.causal ? "true" : "false",
                m.ndead);
  *done = true;
  return NULL;
}

smelt_status pass_fuse_attention(Graph *g, PassCtx *ctx, bool *changed) {
  *changed = false;
  int *uses = ir_use_counts(g);
  int nnode = g->nnode; /* attention nodes appended below are not softmaxes */
  for (int id = 0; id < nnode; id++) {
    if (!uses) return st_error(ST_NO_MEMORY, "out of memory");
    if (g->node[id].dead || g->node[id].op != OP_SOFTMAX) continue;
    bool done = false;
    smelt_status st = try_fuse(g, ctx, uses, id, &done);
    if (st) {
      free(uses);
      return st;
    }
    if (done) {
      /* the rewrite moved uses (k and v now feed attention directly) */
      free(uses);
      uses = ir_use_counts(g);
      *changed = true;
    }
  }
  free(uses);
  return NULL;
}
