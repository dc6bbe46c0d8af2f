/* Attention test graphs for the flash / flashdec / simple kernels
 * (tests/unit/test_cuda_flash.c emulates them on the CPU,
 * tests/gpu/test_cuda_attention.c runs them on the GPU).
 *
 * A case is q [B,H,S,D], k and v [B,Hkv,T,D] -> attention -> y, optionally
 * with producers and a consumer in the kernel's group, the way the fuse
 * pass forms them in front of and behind an attention:
 *   rope_q   q = rope(xq, pos) with pos [S] (computed in the tile fill)
 *   rope_k   k = rope(xk, pos_k), also a graph output (a side output the
 *            kernel stores, like a KV-cache write)
 *   kt       k given as [B,T,Hkv,D] and transposed (perm 0,2,1,3)
 *   cat      a KV cache with the new key appended (decode, like W4): k =
 *            concat(k_cache [B,Hkv,T-1,D], k_new [B,Hkv,1,D]) along the keys
 *            (k_new = rope(xk, pos_k) with rope_k, stored as a side output),
 *            v = concat(v_cache, v_new) likewise
 *   epi      z = y + r (r [B,H,S,D]): an elementwise epilogue
 *   cache    attention(q, k, v, qpos) with cache: true: k and v are caches
 *            of capacity T, qpos [S] (i64 with pos64, else i32; also the
 *            positions of rope_q) holds p0 .. p0 + S - 1 (att_ref_init_at)
 * Without any of these the graph has no groups (the harness makes one
 * per node); with them all nodes form one GK_OPAQUE group around the
 * attention, built by hand here.
 */
#ifndef SMELT_TEST_ATT_CASES_H
#define SMELT_TEST_ATT_CASES_H

#include <stdio.h>
#include <string.h>

#include "codegen/cuda/cg_cuda.h"
#include "codegen/lower.h"
#include "ir/interp.h"
#include "ir/ir.h"
#include "tests/gpu/harness.h"

typedef struct {
  DType dt;
  int64_t B, H, Hkv, S, T, D;
  bool causal;
  bool rope_q, rope_k, kt, epi;
  bool cat; /* the initialisers that leave these out mean false */
  bool cache, pos64;
} AttCase;

static const SrcLoc att_loc = {"att_cases", 1, 1};

static inline void att_case_name(const AttCase *c, char *buf, size_t n) {
  snprintf(buf, n, "%s B%lld H%lld Hkv%lld S%lld T%lld D%lld%s%s%s%s%s%s", dt_name(c->dt), (long long)c->B, (long long)c->H,
           (long long)c->Hkv, (long long)c->S, (long long)c->T, (long long)c->D, c->causal ? " causal" : "",
           c->rope_q ? " rope(q)" : "", c->rope_k ? " rope(k)+store" : "", c->kt ? " k^T" : "", c->cat ? " cache+new" : "",
           c->epi ? " +r" : "");
  if (c->cache) {
    size_t l = strlen(buf);
    snprintf(buf + l, n > l ? n - l : 0, " over a cache%s", c->pos64 ? " (i64 positions)" : "");
  }
}

static inline int att_input(Graph *g, const char *name, DType dt, int64_t a, int64_t b, int64_t c, int64_t d) {
  TensorType t = {.dt = dt, .rank = 4, .dim = {a, b, c, d}};
  return ir_add_input(g, name, t, att_loc);
}

static inline int att_node(Graph *g, Op op, int nin, const int *in, const char *name) {
  const char *names[1] = {name};
  int n = ir_add_node(g, op, nin, in, 1, names, att_loc);
  ir_fill_default_attrs(g, n);
  return n;
}

static inline bool att_infer(Graph *g, int n) {
  smelt_status st = ir_infer_node(g, n);
  if (st) {
    fprintf(stderr, "att_cases: %s\n", st_message(st));
    st_free(st);
    return false;
  }
  return true;
}

/* The graph of case c (owned by the caller), or NULL. */
static inline Graph *att_graph(const AttCase *c) {
  Graph *g = ir_graph_create("att");
  bool ok = true;
  int members[8], nm = 0;
  int q, k, v, kstore = -1;
  TensorType pt = {.dt = DT_I32, .rank = 1, .dim = {c->S}};
  int qpos = -1;
  if (c->cache) {
    TensorType qt = {.dt = c->pos64 ? DT_I64 : DT_I32, .rank = 1, .dim = {c->S}};
    qpos = ir_add_input(g, "qpos", qt, att_loc);
  }
  if (c->rope_q) {
    int xq = att_input(g, "xq", c->dt, c->B, c->H, c->S, c->D);
    int pos = qpos >= 0 ? qpos : ir_add_input(g, "pos", pt, att_loc);
    int n = att_node(g, OP_ROPE, 2, (int[]){xq, pos}, "q");
    ok = ok && att_infer(g, n);
    members[nm++] = n;
    q = g->node[n].out[0];
  } else {
    q = att_input(g, "q", c->dt, c->B, c->H, c->S, c->D);
  }
  if (c->cat) {
    /* the cache's T - 1 keys, then the new one (rope'd with rope_k) */
    int kc = att_input(g, "k_cache", c->dt, c->B, c->Hkv, c->T - 1, c->D);
    int kn = att_input(g, "k_new", c->dt, c->B, c->Hkv, 1, c->D);
    if (c->rope_k) {
      TensorType tt = {.dt = DT_I32, .rank = 1, .dim = {1}};
      int pos = ir_add_input(g, "pos_k", tt, att_loc);
      int n = att_node(g, OP_ROPE, 2, (int[]){kn, pos}, "k_rope");
      ok = ok && att_infer(g, n);
      members[nm++] = n;
      kn = kstore = g->node[n].out[0];
    }
    int n = att_node(g, OP_CONCAT, 2, (int[]){kc, kn}, "k");
    ir_set_attr_int(g, n, "axis", 2);
    ok = ok && att_infer(g, n);
    members[nm++] = n;
    k = g->node[n].out[0];
  } else if (c->kt) {
    int xk = att_input(g, "k_bthd", c->dt, c->B, c->T, c->Hkv, c->D);
    int n = att_node(g, OP_TRANSPOSE, 1, (int[]){xk}, "k");
    ir_set_attr_ints(g, n, "perm", (const int64_t[]){0, 2, 1, 3}, 4);
    ok = ok && att_infer(g, n);
    members[nm++] = n;
    k = g->node[n].out[0];
  } else if (c->rope_k) {
    int xk = att_input(g, "xk", c->dt, c->B, c->Hkv, c->T, c->D);
    TensorType tt = {.dt = DT_I32, .rank = 1, .dim = {c->T}};
    int pos = ir_add_input(g, "pos_k", tt, att_loc);
    int n = att_node(g, OP_ROPE, 2, (int[]){xk, pos}, "k");
    ok = ok && att_infer(g, n);
    members[nm++] = n;
    k = kstore = g->node[n].out[0];
  } else {
    k = att_input(g, "k", c->dt, c->B, c->Hkv, c->T, c->D);
  }
  if (c->cat) {
    int vc = att_input(g, "v_cache", c->dt, c->B, c->Hkv, c->T - 1, c->D);
    int vn = att_input(g, "v_new", c->dt, c->B, c->Hkv, 1, c->D);
    int n = att_node(g, OP_CONCAT, 2, (int[]){vc, vn}, "v");
    ir_set_attr_int(g, n, "axis", 2);
    ok = ok && att_infer(g, n);
    members[nm++] = n;
    v = g->node[n].out[0];
  } else {
    v = att_input(g, "v", c->dt, c->B, c->Hkv, c->T, c->D);
  }
  int an = c->cache ? att_node(g, OP_ATTENTION, 4, (int[]){q, k, v, qpos}, "y") : att_node(g, OP_ATTENTION, 3, (int[]){q, k, v}, "y");
  if (c->causal && !c->cache) ir_set_attr_bool(g, an, "causal", true);
  if (c->cache) ir_set_attr_bool(g, an, "cache", true);
  ok = ok && att_infer(g, an);
  int anchor = an;
  members[nm++] = an;
  int out = g->node[an].out[0];
  if (c->epi) {
    int r = att_input(g, "r", c->dt, c->B, c->H, c->S, c->D);
    int n = att_node(g, OP_ADD, 2, (int[]){out, r}, "z");
    ok = ok && att_infer(g, n);
    members[nm++] = n;
    out = g->node[n].out[0];
  }
  ir_add_output(g, out);
  if (kstore >= 0) ir_add_output(g, kstore);
  if (!ok) {
    ir_graph_destroy(g);
    return NULL;
  }
  if (nm > 1) {
    int gi = ir_add_group(g, GK_OPAQUE);
    Group *gr = &g->groups[gi];
    gr->nodes = ir_graph_alloc(g, sizeof(int) * (size_t)nm);
    memcpy(gr->nodes, members, sizeof(int) * (size_t)nm);
    gr->nnodes = nm;
    gr->anchor = anchor;
    for (int i = 0; i < nm; i++) g->node[members[i]].group = gi;
  }
  return g;
}

/* ---- running one case under many variants ----
 * The reference is computed once per case (at real sizes it is the slow
 * part); each variant is then generated (forced on the attention kernel),
 * run `launches` times in a row with one workspace, and checked: every
 * stored value against the interpreter (h_compare's tolerances), the guard
 * bytes around every buffer, the recorded variant token, and that the
 * workspace is all zero again after each launch (FmtCudaLaunch.workspace).
 * On a GPU the kernels are also timed. */

typedef struct {
  Graph *g;
  Kernel *k;
  int nk;
  int att;        /* the kernel built around the attention */
  Interp *it;
  void **data;    /* per input value: the host data */
} AttRef;

static inline void att_ref_free(AttRef *r) {
  if (r->data)
    for (int v = 0; v < r->g->nval; v++) free(r->data[v]);
  free(r->data);
  ir_interp_destroy(r->it);
  cg_kernels_free(r->k, r->nk);
  memset(r, 0, sizeof *r);
}

/* Lowers g (groups made if it has none) and runs the interpreter on random
 * inputs in [-1, 1) (positions in [0, 64); a cache's query positions
 * "qpos" p0, p0 + 1, ...).  false (printed) on failure. */
static inline bool att_ref_init_at(AttRef *r, Graph *g, int64_t p0) {
  memset(r, 0, sizeof *r);
  r->g = g;
  r->att = -1;
  smelt_status st = g->ngroups == 0 ? cg_single_node_groups(g) : NULL;
  if (!st) st = cg_lower(g, &r->k, &r->nk);
  if (!st) st = ir_interp_create(g, &r->it);
  r->data = calloc((size_t)g->nval, sizeof(void *));
  for (int i = 0; i < g->ninputs && !st; i++) {
    int v = g->inputs[i];
    bool pos = dt_is_int(g->val[v].type.dt);
    r->data[v] = h_random(&g->val[v].type, pos ? 0 : -1, pos ? 63 : 1, (uint64_t)v + 7);
    if (g->val[v].name && strcmp(g->val[v].name, "qpos") == 0 && r->data[v])
      for (int64_t j = 0; j < ir_type_numel(&g->val[v].type); j++) {
        if (g->val[v].type.dt == DT_I64) ((int64_t *)r->data[v])[j] = p0 + j;
        else ((int32_t *)r->data[v])[j] = (int32_t)(p0 + j);
      }
    st = ir_interp_set_input(r->it, v, r->data[v]);
  }
  if (!st) st = ir_interp_run(r->it);
  for (int i = 0; i < r->nk && !st; i++) {
    CgTuneKey key;
    if (cg_cuda_tune_key(g, &r->k[i], &key) && strcmp(key.op, "attention") == 0) r->att = i;
  }
  if (!st && r->att < 0) st = st_error(ST_INTERNAL, "no attention kernel");
  if (st) {
    fprintf(stderr, "att_ref_init: %s\n", st_message(st));
    st_free(st);
    att_ref_free(r);
    return false;
  }
  return true;
}

static inline bool att_ref_init(AttRef *r, Graph *g) { return att_ref_init_at(r, g, 0); }

/* Runs variant tok (NULL: the heuristic's choice), generated for `arch`
 * (CgCudaOptions.arch; NULL: portable); returns the number of failures
 * (printed, prefixed with `what`).  *out_ms: the attention
 * kernel's time (GPU only, when timing_reps > 0), else 0.  out_tok gets the
 * token the kernel recorded. */
static inline int att_run_variant(Exec *e, AttRef *r, const char *tok, const char *arch, bool args_aligned, size_t offset, int launches,
                                  int timing_reps, double *out_ms, char out_tok[CG_VARIANT_LEN], const char *what) {
  int failures = 0;
#define ATT_FAIL(...)                                            \
  do {                                                           \
    if (failures < 6) {                                          \
      fprintf(stderr, "%s [%s] %s: ", what, e->name, tok ? tok : "(heuristic)"); \
      fprintf(stderr, __VA_ARGS__);                              \
      fprintf(stderr, "\n");                                     \
    }                                                            \
    failures++;                                                  \
  } while (0)
  Graph *g = r->g;
  if (out_ms) *out_ms = 0;
  if (out_tok) out_tok[0] = 0;
  const char **force = calloc((size_t)r->nk, sizeof *force);
  force[r->att] = tok;
  CgCudaOptions opt = {.args_aligned = args_aligned, .max_units = 1, .arch = arch, .force = force,
                       .emulation = e->load == he_load};  /* the emulation compiles the host side */
  FmtCudaModule *m = NULL;
  smelt_status st = cg_cuda_generate(g, r->k, r->nk, &opt, &m);
  free(force);
  if (st) {
    ATT_FAIL("%s", st_message(st));
    st_free(st);
    return failures;
  }
  const FmtCudaLaunch *al = &m->kernels[r->att];
  if (out_tok) snprintf(out_tok, CG_VARIANT_LEN, "%s", al->variant);
  if (tok && strcmp(al->variant, tok) != 0) ATT_FAIL("the kernel recorded variant '%s'", al->variant);
  uint64_t *buf = calloc((size_t)g->nval, sizeof(uint64_t));
  bool *stored = calloc((size_t)g->nval, sizeof(bool));
  uint64_t ws = 0, ws_bytes = 0;
  st = e->load(e, m);
  for (int i = 0; i < r->nk && !st; i++)
    for (int a = 0; a < r->k[i].nargs && !st; a++) {
      int v = r->k[i].args[a];
      if (a >= r->k[i].nargs - r->k[i].nouts) stored[v] = true;
      if (buf[v]) continue;
      size_t bytes = ir_type_bytes(&g->val[v].type), total = bytes + 2 * H_GUARD + offset;
      st = e->alloc(e, total, &buf[v]);
      unsigned char *pat = malloc(total);
      if (!st && pat) {
        memset(pat, H_GUARD_BYTE, total);
        const void *src = g->val[v].kind == VK_CONST ? g->val[v].data : g->val[v].kind == VK_INPUT ? r->data[v] : NULL;
        if (src && bytes) memcpy(pat + H_GUARD + offset, src, bytes);
        st = e->upload(e, buf[v], pat, total);
      }
      free(pat);
    }
  for (int i = 0; i < m->nkernels; i++)
    if (m->kernels[i].workspace > ws_bytes) ws_bytes = m->kernels[i].workspace;
  unsigned char *wsh = ws_bytes ? calloc(1, (size_t)ws_bytes) : NULL;
  if (!st && ws_bytes) {
    st = e->alloc(e, (size_t)ws_bytes, &ws);
    if (!st) st = e->upload(e, ws, wsh, (size_t)ws_bytes);
  }
  uint64_t(*args)[257] = calloc((size_t)m->nkernels, sizeof *args);
  int *nargs = calloc((size_t)m->nkernels, sizeof(int));
  for (int i = 0; i < r->nk; i++) {
    int na = r->k[i].nargs < 256 ? r->k[i].nargs : 256;
    for (int a = 0; a < na; a++) args[i][a] = buf[r->k[i].args[a]] + H_GUARD + offset;
    if (m->kernels[i].workspace) args[i][na++] = ws;
    nargs[i] = na;
  }
  for (int rep = 0; rep < launches && !st; rep++) {
    for (int i = 0; i < r->nk && !st; i++) {
      st = e->launch(e, i, args[i], nargs[i]);
      if (!st) st = e->sync(e);
      if (st) st = st_prefix(st, "kernel %s", r->k[i].name);
    }
    /* the workspace is zero again after every launch */
    if (!st && ws_bytes) {
      st = e->download(e, wsh, ws, (size_t)ws_bytes);
      for (uint64_t b = 0; !st && b < ws_bytes; b++)
        if (wsh[b]) {
          ATT_FAIL("launch %d left workspace byte %llu of %llu non-zero", rep + 1, (unsigned long long)b,
                   (unsigned long long)ws_bytes);
          break;
        }
    }
  }
  if (st) {
    ATT_FAIL("%s", st_message(st));
    st_free(st);
    st = NULL;
  } else {
    for (int v = 0; v < g->nval; v++) {
      if (!stored[v]) continue;
      const TensorType *t = &g->val[v].type;
      size_t bytes = ir_type_bytes(t), total = bytes + 2 * H_GUARD + offset;
      unsigned char *host = malloc(total);
      st = e->download(e, host, buf[v], total);
      if (st) {
        ATT_FAIL("download: %s", st_message(st));
        st_free(st);
        st = NULL;
        free(host);
        continue;
      }
      for (size_t b = 0; b < total; b++)
        if ((b < H_GUARD + offset || b >= H_GUARD + offset + bytes) && host[b] != H_GUARD_BYTE) {
          ATT_FAIL("'%s': a guard byte %s the tensor was overwritten", g->val[v].name, b < H_GUARD + offset ? "before" : "after");
          break;
        }
      double worst = 0, gv = 0, rv = 0;
      int64_t bad = h_compare(t->dt, t->dt, host + H_GUARD + offset, ir_interp_value(r->it, v), ir_type_numel(t), &worst, &gv, &rv);
      if (bad >= 0) {
        int64_t d = t->dim[t->rank - 1];
        ATT_FAIL("'%s': element %lld (row %lld, column %lld) is %.6g, reference %.6g", g->val[v].name, (long long)bad,
                 (long long)(bad / d), (long long)(bad % d), gv, rv);
      }
      free(host);
    }
  }
  /* timing (a real GPU only): the attention kernel alone, inputs as they are */
  if (!failures && timing_reps > 0 && e->dev && out_ms) {
    void *params[257];
    RtCudaPtr vals[257];
    for (int a = 0; a < nargs[r->att]; a++) vals[a] = args[r->att][a], params[a] = &vals[a];
    RtCudaLaunch rl = {e->fns[r->att], al->name, {al->grid[0], al->grid[1], al->grid[2]}, {al->block[0], al->block[1], al->block[2]},
                       al->smem, params, false, NULL, NULL};
    st = rt_cuda_time_kernels(e->dev, &rl, 1, timing_reps, out_ms);
    if (st) {
      ATT_FAIL("timing: %s", st_message(st));
      st_free(st);
    }
  }
  e->unload(e);
  for (int v = 0; v < g->nval; v++)
    if (buf[v]) e->free(e, buf[v]);
  if (ws) e->free(e, ws);
  free(buf), free(stored), free(wsh), free(args), free(nargs);
  fmt_cuda_module_free(m);
  return failures;
#undef ATT_FAIL
}

#endif
