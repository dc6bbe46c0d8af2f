/* A KV cache as session state through the generated CUDA kernels, run the
 * way a CUDA session runs them (runtime/cuda_session.c: a state and the
 * scatter result that updates it share one buffer), step after step
 * against the reference interpreter:
 *   one layer's attention over a cache: k_cache, v_cache states
 *   [1, Hkv, C, D]; kc = scatter(k_cache, pos, k, axis 2) (in place),
 *   vc likewise, y = attention(q, kc, vc, pos, cache: true); a prefill of
 *   S0 tokens at positions 0 .. S0-1, then decode steps (S = 1) at the next
 *   positions and at the last slot C - 1, each a graph of its own sharing
 *   the states' buffers (as a session's specialisations do).  Checked per
 *   step: y against the interpreter; at the end the states' contents
 *   (every slot: written ones and the zeros of the others) and the guard
 *   bytes around them (the scatter writes only its rows).
 *   Indices outside the cache (-1, C) are skipped by the scatter: a graph
 *   of one scatter at [-1, 3, C] leaves every slot but 3 as it was.
 *   argmax over a 32000-wide row (and two rows) against the interpreter;
 *   topk over such rows (k = 50 largest, k = 64 smallest), both results,
 *   and k = 65 refused by the generator.
 * Used by tests/unit/test_cuda_state_ops.c (the CPU emulation) and
 * tests/gpu/test_cuda_state_ops.c (the GPU).
 */
#ifndef SMELT_TEST_STATE_CASES_H
#define SMELT_TEST_STATE_CASES_H

#include "tests/gpu/harness.h"

static const SrcLoc sc_loc = {"state_cases", 1, 1};

static inline int sc_node(Graph *g, Op op, int nin, const int *in, const char *name, bool *ok) {
  const char *names[1] = {name};
  (void)ok;
  int n = ir_add_node(g, op, nin, in, 1, names, sc_loc);
  ir_fill_default_attrs(g, n);
  return n;
}

static inline bool sc_infer_all(Graph *g) {
  for (int n = 0; n < g->nnode; n++) {
    smelt_status st = ir_infer_node(g, n);
    if (st) {
      fprintf(stderr, "state_cases: %s\n", st_message(st));
      st_free(st);
      return false;
    }
  }
  return true;
}

typedef struct {
  DType dt;
  int64_t H, Hkv, C, D;
} ScShape;

/* One step's graph: S tokens.  *ids: k_cache, v_cache, q, k, v, pos, y. */
static inline Graph *sc_step_graph(const ScShape *c, int64_t S, DType pos_dt, int ids[7]) {
  Graph *g = ir_graph_create("kv_step");
  TensorType ct = {.dt = c->dt, .rank = 4, .dim = {1, c->Hkv, c->C, c->D}};
  ids[0] = ir_add_state(g, "k_cache", ct, sc_loc);
  ids[1] = ir_add_state(g, "v_cache", ct, sc_loc);
  TensorType qt = {.dt = c->dt, .rank = 4, .dim = {1, c->H, S, c->D}}, kt = {.dt = c->dt, .rank = 4, .dim = {1, c->Hkv, S, c->D}};
  TensorType pt = {.dt = pos_dt, .rank = 1, .dim = {S}};
  ids[2] = ir_add_input(g, "q", qt, sc_loc);
  ids[3] = ir_add_input(g, "k", kt, sc_loc);
  ids[4] = ir_add_input(g, "v", kt, sc_loc);
  ids[5] = ir_add_input(g, "pos", pt, sc_loc);
  bool ok = true;
  int n = sc_node(g, OP_SCATTER, 3, (int[]){ids[0], ids[5], ids[3]}, "kc", &ok);
  ir_set_attr_int(g, n, "axis", 2);
  int kc = g->node[n].out[0];
  n = sc_node(g, OP_SCATTER, 3, (int[]){ids[1], ids[5], ids[4]}, "vc", &ok);
  ir_set_attr_int(g, n, "axis", 2);
  int vc = g->node[n].out[0];
  n = sc_node(g, OP_ATTENTION, 4, (int[]){ids[2], kc, vc, ids[5]}, "y", &ok);
  ir_set_attr_bool(g, n, "cache", true);
  ids[6] = g->node[n].out[0];
  ir_add_output(g, ids[6]);
  if (!sc_infer_all(g)) {
    ir_graph_destroy(g);
    return NULL;
  }
  return g;
}

/* The buffers of a run: the states' (shared by every step), the others per step. */
typedef struct {
  uint64_t state[2]; /* guarded: H_GUARD bytes each side */
  size_t state_bytes;
} ScStates;

/* Generates g's module, gives every value a buffer (states: st's, the
 * scatter results the same), uploads data[v] of its inputs, launches every
 * kernel once, downloads value `outv` into out (bytes of its type).  Returns
 * the number of failures (printed). */
static inline int sc_run_graph(Exec *e, Graph *g, void **data, const ScStates *st, int outv, void *out, bool aligned_opt,
                               const char *what) {
  int failures = 0;
  smelt_status s = g->ngroups == 0 ? cg_single_node_groups(g) : NULL;
  Kernel *k = NULL;
  int nk = 0;
  if (!s) s = cg_lower(g, &k, &nk);
  CgCudaOptions opt = {.args_aligned = aligned_opt, .max_units = 1, .emulation = e->load == he_load};
  FmtCudaModule *m = NULL;
  if (!s) s = cg_cuda_generate(g, k, nk, &opt, &m);
  if (!s) s = e->load(e, m);
  uint64_t *buf = calloc((size_t)g->nval, sizeof(uint64_t));
  uint64_t ws = 0, wsb = 0;
  for (int v = 0; v < g->nval && !s; v++) {
    int sv = ir_state_of(g, v);
    if (sv >= 0) {
      for (int i = 0; i < g->nstates; i++)
        if (g->states[i] == sv) buf[v] = st->state[i] + H_GUARD;
      continue;
    }
    bool used = false;
    for (int i = 0; i < nk && !used; i++)
      for (int a = 0; a < k[i].nargs && !used; a++) used = k[i].args[a] == v;
    if (!used) continue;
    size_t bytes = ir_type_bytes(&g->val[v].type);
    s = e->alloc(e, bytes ? bytes : 16, &buf[v]);
    if (!s && data[v]) s = e->upload(e, buf[v], data[v], bytes);
  }
  for (int i = 0; m && i < m->nkernels; i++)
    if (m->kernels[i].workspace > wsb) wsb = m->kernels[i].workspace;
  if (!s && wsb) {
    void *z = calloc(1, (size_t)wsb);
    s = e->alloc(e, (size_t)wsb, &ws);
    if (!s) s = e->upload(e, ws, z, (size_t)wsb);
    free(z);
  }
  for (int i = 0; i < nk && !s; i++) {
    uint64_t args[258];
    int na = 0;
    for (int a = 0; a < k[i].nargs && a < 256; a++) args[na++] = buf[k[i].args[a]];
    if (m->kernels[i].workspace) args[na++] = ws;
    s = e->launch(e, i, args, na);
    if (!s) s = e->sync(e);
    if (s) s = st_prefix(s, "kernel %s", k[i].name);
  }
  if (!s && outv >= 0) s = e->download(e, out, buf[outv], ir_type_bytes(&g->val[outv].type));
  if (s) {
    fprintf(stderr, "%s: %s\n", what, st_message(s));
    st_free(s);
    failures++;
  }
  if (m) e->unload(e);
  for (int v = 0; v < g->nval; v++)
    if (buf[v] && ir_state_of(g, v) < 0) e->free(e, buf[v]);
  if (ws) e->free(e, ws);
  free(buf);
  fmt_cuda_module_free(m);
  cg_kernels_free(k, nk);
  return failures;
}

/* Compares n elements of dtype dt with the reference; failures (printed). */
static inline int sc_compare(DType dt, const void *got, const void *ref, int64_t n, const char *what) {
  double worst = 0, gv = 0, rv = 0;
  int64_t bad = h_compare(dt, dt, got, ref, n, &worst, &gv, &rv);
  if (bad < 0) return 0;
  fprintf(stderr, "%s: element %lld is %.6g, reference %.6g\n", what, (long long)bad, gv, rv);
  return 1;
}

/* The KV-cache sequence for shape c; failures. */
static inline int sc_kv_sequence(Exec *e, const ScShape *c, DType pos_dt, bool aligned_opt) {
  int failures = 0;
  char what[160];
  ScStates st = {.state_bytes = (size_t)(c->Hkv * c->C * c->D) * dt_size(c->dt)};
  size_t total = st.state_bytes + 2 * H_GUARD;
  unsigned char *pat = malloc(total);
  memset(pat, H_GUARD_BYTE, total);
  memset(pat + H_GUARD, 0, st.state_bytes); /* a session's state starts at zero */
  for (int i = 0; i < 2; i++) {
    smelt_status s = e->alloc(e, total, &st.state[i]);
    if (!s) s = e->upload(e, st.state[i], pat, total);
    if (s) {
      fprintf(stderr, "state alloc: %s\n", st_message(s));
      st_free(s);
      free(pat);
      return 1;
    }
  }
  void *ref_state[2] = {calloc(1, st.state_bytes), calloc(1, st.state_bytes)};
  /* prefill 5 tokens, decode 3, then a decode at the last slot */
  int64_t steps[][2] = {{5, 0}, {1, 5}, {1, 6}, {1, 7}, {1, c->C - 1}};
  for (size_t si = 0; si < sizeof steps / sizeof *steps; si++) {
    int64_t S = steps[si][0], p0 = steps[si][1];
    int ids[7];
    Graph *g = sc_step_graph(c, S, pos_dt, ids);
    if (!g) {
      failures++;
      continue;
    }
    snprintf(what, sizeof what, "%s H%lld Hkv%lld C%lld D%lld, %s positions, step %zu (S %lld at %lld)%s", dt_name(c->dt),
             (long long)c->H, (long long)c->Hkv, (long long)c->C, (long long)c->D, dt_name(pos_dt), si, (long long)S,
             (long long)p0, aligned_opt ? ", args_aligned" : "");
    void **data = calloc((size_t)g->nval, sizeof(void *));
    Interp *it = NULL;
    smelt_status s = ir_interp_create(g, &it);
    for (int i = 2; i < 5 && !s; i++) {
      data[ids[i]] = h_random(&g->val[ids[i]].type, -1, 1, (uint64_t)(si * 16 + i));
      s = ir_interp_set_input(it, ids[i], data[ids[i]]);
    }
    data[ids[5]] = calloc((size_t)S, 8);
    for (int64_t j = 0; j < S; j++) {
      if (pos_dt == DT_I64) ((int64_t *)data[ids[5]])[j] = p0 + j;
      else ((int32_t *)data[ids[5]])[j] = (int32_t)(p0 + j);
    }
    if (!s) s = ir_interp_set_input(it, ids[5], data[ids[5]]);
    for (int i = 0; i < 2 && !s; i++) s = ir_interp_set_input(it, ids[i], ref_state[i]);
    if (!s) s = ir_interp_run(it);
    if (s) {
      fprintf(stderr, "%s: interpreter: %s\n", what, st_message(s));
      st_free(s);
      failures++;
    } else {
      for (int i = 0; i < 2; i++) memcpy(ref_state[i], ir_interp_value(it, ids[i]), st.state_bytes);
      size_t yb = ir_type_bytes(&g->val[ids[6]].type);
      void *y = calloc(1, yb);
      int f = sc_run_graph(e, g, data, &st, ids[6], y, aligned_opt, what);
      if (!f) f = sc_compare(c->dt, y, ir_interp_value(it, ids[6]), ir_type_numel(&g->val[ids[6]].type), what);
      failures += f;
      free(y);
    }
    ir_interp_destroy(it);
    for (int v = 0; v < g->nval; v++) free(data[v]);
    free(data);
    ir_graph_destroy(g);
  }
  /* the states: every slot, and the guards around them */
  for (int i = 0; i < 2; i++) {
    smelt_status s = e->download(e, pat, st.state[i], total);
    if (s) {
      fprintf(stderr, "state download: %s\n", st_message(s));
      st_free(s);
      failures++;
      continue;
    }
    for (size_t b = 0; b < total; b++)
      if ((b < H_GUARD || b >= H_GUARD + st.state_bytes) && pat[b] != H_GUARD_BYTE) {
        fprintf(stderr, "%s: a guard byte of state %d was overwritten\n", what, i);
        failures++;
        break;
      }
    snprintf(what, sizeof what, "%s C%lld: state %s after the steps", dt_name(c->dt), (long long)c->C, i ? "v_cache" : "k_cache");
    failures += sc_compare(c->dt, pat + H_GUARD, ref_state[i], c->Hkv * c->C * c->D, what);
  }
  for (int i = 0; i < 2; i++) {
    e->free(e, st.state[i]);
    free(ref_state[i]);
  }
  free(pat);
  return failures;
}

/* A scatter into a state at [-1, 3, C]: only slot 3 changes. */
static inline int sc_scatter_skips(Exec *e) {
  int failures = 0;
  const int64_t C = 8, D = 16;
  Graph *g = ir_graph_create("scatter_skip");
  TensorType ct = {.dt = DT_F32, .rank = 3, .dim = {2, C, D}}, xt = {.dt = DT_F32, .rank = 3, .dim = {2, 3, D}};
  TensorType it = {.dt = DT_I32, .rank = 1, .dim = {3}};
  int sv = ir_add_state(g, "cache", ct, sc_loc), x = ir_add_input(g, "x", xt, sc_loc), idx = ir_add_input(g, "idx", it, sc_loc);
  bool ok = true;
  int n = sc_node(g, OP_SCATTER, 3, (int[]){sv, idx, x}, "upd", &ok);
  ir_set_attr_int(g, n, "axis", 1);
  /* the run reads the update (else it is no kernel's result: codegen/lower.c) */
  int m = sc_node(g, OP_NEG, 1, &g->node[n].out[0], "neg", &ok);
  if (!sc_infer_all(g)) {
    ir_graph_destroy(g);
    return 1;
  }
  ir_add_output(g, g->node[m].out[0]);
  ScStates st = {.state_bytes = (size_t)(2 * C * D) * 4};
  size_t total = st.state_bytes + 2 * H_GUARD;
  unsigned char *pat = malloc(total);
  memset(pat, H_GUARD_BYTE, total);
  float *init = (float *)(pat + H_GUARD);
  for (int64_t i = 0; i < 2 * C * D; i++) init[i] = (float)i;
  float *expect = malloc(st.state_bytes);
  memcpy(expect, init, st.state_bytes);
  void **data = calloc((size_t)g->nval, sizeof(void *));
  data[x] = h_random(&xt, -1, 1, 99);
  int32_t *iv = calloc(3, 4);
  iv[0] = -1, iv[1] = 3, iv[2] = (int32_t)C;
  data[idx] = iv;
  for (int o = 0; o < 2; o++)
    for (int64_t d = 0; d < D; d++) expect[(o * C + 3) * D + d] = ((float *)data[x])[(o * 3 + 1) * D + d];
  smelt_status s = e->alloc(e, total, &st.state[0]);
  if (!s) s = e->upload(e, st.state[0], pat, total);
  if (s) {
    fprintf(stderr, "scatter skip: %s\n", st_message(s));
    st_free(s);
    failures++;
  } else {
    failures += sc_run_graph(e, g, data, &st, -1, NULL, false, "scatter at [-1, 3, C] into a state");
    s = e->download(e, pat, st.state[0], total);
    if (s) {
      st_free(s);
      failures++;
    } else {
      for (size_t b = 0; b < total; b++)
        if ((b < H_GUARD || b >= H_GUARD + st.state_bytes) && pat[b] != H_GUARD_BYTE) {
          fprintf(stderr, "scatter skip: a guard byte was overwritten\n");
          failures++;
          break;
        }
      if (memcmp(pat + H_GUARD, expect, st.state_bytes) != 0) {
        fprintf(stderr, "scatter at [-1, 3, C]: the state is not the old one with slot 3 replaced\n");
        failures++;
      }
    }
    e->free(e, st.state[0]);
  }
  for (int v = 0; v < g->nval; v++) free(data[v]);
  free(data), free(pat), free(expect);
  ir_graph_destroy(g);
  return failures;
}

/* argmax of [rows, 32000] (the LM head's logits) against the interpreter. */
static inline int sc_argmax_vocab(Exec *e, DType dt, int64_t rows) {
  Graph *g = ir_graph_create("argmax_vocab");
  TensorType xt = {.dt = dt, .rank = 2, .dim = {rows, 32000}};
  int x = ir_add_input(g, "logits", xt, sc_loc);
  bool ok = true;
  int n = sc_node(g, OP_ARGMAX, 1, &x, "next", &ok);
  if (!sc_infer_all(g)) {
    ir_graph_destroy(g);
    return 1;
  }
  int y = g->node[n].out[0];
  ir_add_output(g, y);
  void **data = calloc((size_t)g->nval, sizeof(void *));
  data[x] = h_random(&xt, -8, 8, 1234 + (uint64_t)rows);
  Interp *it = NULL;
  smelt_status s = ir_interp_create(g, &it);
  if (!s) s = ir_interp_set_input(it, x, data[x]);
  if (!s) s = ir_interp_run(it);
  int failures = 0;
  char what[96];
  snprintf(what, sizeof what, "argmax %s [%lld, 32000]", dt_name(dt), (long long)rows);
  if (s) {
    fprintf(stderr, "%s: %s\n", what, st_message(s));
    st_free(s);
    failures++;
  } else {
    int32_t got[4] = {0};
    ScStates none = {{0}, 0};
    failures += sc_run_graph(e, g, data, &none, y, got, false, what);
    const int32_t *ref = ir_interp_value(it, y);
    for (int64_t r = 0; r < rows && !failures; r++)
      if (got[r] != ref[r]) {
        fprintf(stderr, "%s: row %lld: %d, reference %d\n", what, (long long)r, got[r], ref[r]);
        failures++;
      }
  }
  ir_interp_destroy(it);
  for (int v = 0; v < g->nval; v++) free(data[v]);
  free(data);
  ir_graph_destroy(g);
  return failures;
}

/* topk of [rows, 32000] (sampling's top-k over the logits), both results
 * against the interpreter (random logits in [-1, 1): f16 and bf16 rows
 * have many equal values, which must go to the lower index). */
static inline int sc_topk_vocab(Exec *e, DType dt, int64_t rows, int64_t k, bool largest) {
  Graph *g = ir_graph_create("topk_vocab");
  TensorType xt = {.dt = dt, .rank = 2, .dim = {rows, 32000}};
  int x = ir_add_input(g, "logits", xt, sc_loc);
  const char *names[2] = {"top_v", "top_i"};
  int n = ir_add_node(g, OP_TOPK, 1, &x, 2, names, sc_loc);
  ir_set_attr_int(g, n, "k", k);
  ir_set_attr_bool(g, n, "largest", largest);
  ir_fill_default_attrs(g, n);
  if (!sc_infer_all(g)) {
    ir_graph_destroy(g);
    return 1;
  }
  ir_add_output(g, g->node[n].out[0]);
  ir_add_output(g, g->node[n].out[1]);
  char what[96];
  snprintf(what, sizeof what, "topk %s [%lld, 32000] k=%lld%s", dt_name(dt), (long long)rows, (long long)k,
           largest ? "" : " smallest");
  int failures = h_check_graph(e, g, NULL, NULL, 0, false, what, NULL);
  ir_graph_destroy(g);
  return failures;
}

/* A k beyond the CUDA kernel's per-thread lists is refused when the
 * module is generated, naming the node and the limit. */
static inline int sc_topk_k_limit(void) {
  Graph *g = ir_graph_create("topk_limit");
  TensorType xt = {.dt = DT_F32, .rank = 2, .dim = {1, 1000}};
  int x = ir_add_input(g, "logits", xt, sc_loc);
  const char *names[2] = {"top_v", "top_i"};
  int n = ir_add_node(g, OP_TOPK, 1, &x, 2, names, sc_loc);
  ir_set_attr_int(g, n, "k", 65);
  ir_fill_default_attrs(g, n);
  int failures = 0;
  if (!sc_infer_all(g)) failures++;
  ir_add_output(g, g->node[n].out[0]);
  ir_add_output(g, g->node[n].out[1]);
  Kernel *k = NULL;
  int nk = 0;
  FmtCudaModule *m = NULL;
  smelt_status st = failures ? NULL : cg_single_node_groups(g);
  if (!st && !failures) st = cg_lower(g, &k, &nk);
  if (!st && !failures) st = cg_cuda_generate(g, k, nk, NULL, &m);
  if (!failures && (!st || st_code(st) != ST_UNSUPPORTED || !strstr(st_message(st), "'top_v': k = 65") ||
                    !strstr(st_message(st), "at most 64"))) {
    fprintf(stderr, "topk k=65: expected an unsupported-k error, got %s\n", st ? st_message(st) : "success");
    failures++;
  }
  st_free(st);
  fmt_cuda_module_free(m);
  cg_kernels_free(k, nk);
  ir_graph_destroy(g);
  return failures;
}

/* Everything above; failures. */
static inline int sc_run_all(Exec *e) {
  int failures = 0;
  const ScShape shapes[] = {{DT_F16, 8, 2, 128, 64}, {DT_BF16, 4, 4, 64, 128}, {DT_F32, 4, 2, 32, 16}};
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    int f = sc_kv_sequence(e, &shapes[i], i == 1 ? DT_I64 : DT_I32, false);
    printf("  KV cache sequence %s: %s\n", dt_name(shapes[i].dt), f ? "FAILED" : "ok");
    failures += f;
  }
  failures += sc_kv_sequence(e, &shapes[0], DT_I32, true);
  int f = sc_scatter_skips(e);
  printf("  scatter skips indices outside the state: %s\n", f ? "FAILED" : "ok");
  failures += f;
  DType adt[] = {DT_F32, DT_F16, DT_BF16};
  for (int i = 0; i < 3; i++) {
    f = sc_argmax_vocab(e, adt[i], i == 0 ? 2 : 1);
    printf("  argmax over 32000 %s: %s\n", dt_name(adt[i]), f ? "FAILED" : "ok");
    failures += f;
  }
  for (int i = 0; i < 3; i++) {
    f = sc_topk_vocab(e, adt[i], i == 0 ? 2 : 1, 50, true);
    printf("  topk k=50 over 32000 %s: %s\n", dt_name(adt[i]), f ? "FAILED" : "ok");
    failures += f;
  }
  f = sc_topk_vocab(e, DT_F32, 1, 64, false);
  printf("  topk k=64 smallest over 32000 f32: %s\n", f ? "FAILED" : "ok");
  failures += f;
  f = sc_topk_k_limit();
  printf("  topk k=65 refused by the CUDA generator: %s\n", f ? "FAILED" : "ok");
  failures += f;
  return failures;
}

#endif
