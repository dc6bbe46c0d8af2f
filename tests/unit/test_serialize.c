/* Unit tests of graph serialisation (ir/serialize.c).
 *
 * Round trips: graphs built through the ir.h API (inputs, constants of
 * several dtypes, every attribute type, a multi-result split, a fusion group,
 * memory offsets, dead nodes and dead values) are encoded and decoded; the
 * decoded graph must print the same IR text, hold the same constant bytes
 * (64-byte aligned, pointing into the constants blob, not copied) and
 * encode to the very same bytes again.  A constant nothing uses is not
 * stored (it decodes as a dead value).
 *
 * Constant references: an offset that is misaligned or past the blob, a
 * blob cut short, a wrong size, an external tensor that does not exist or
 * has another size are each rejected by name.
 *
 * Hostile input: every truncation of an encoding must fail cleanly; random
 * byte corruptions must either fail cleanly or give a graph that verifies;
 * and specific faults (ids out of range, inconsistent links, bad attributes,
 * unknown ops and dtypes, wrong data sizes, absurd counts) must each be
 * rejected with a message that names the fault.  Run under ASan+UBSan
 * (SMELT_SANITIZE) this also checks that no path reads out of bounds or
 * leaks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "ir/serialize.h"
#include "tests/unit/check.h"

static TensorType tt(DType dt, int rank, const int64_t *dims) {
  TensorType t = {.dt = dt, .rank = rank};
  for (int i = 0; i < rank; i++) t.dim[i] = dims[i];
  return t;
}

static int out0(const Graph *g, int node) { return g->node[node].out[0]; }

/* Adds a node with one result, fills its defaults and infers it. */
static int add1(Graph *g, Op op, int nin, const int *in, const char *name, int line) {
  int n = ir_add_node(g, op, nin, in, 1, (const char *[]){name}, (SrcLoc){g->file, line, 3});
  return n;
}

static void finish(Graph *g, int n) {
  ir_fill_default_attrs(g, n);
  CHECK_OK(ir_infer_node(g, n));
}

/* Node ids of interest in the sample graph. */
typedef struct {
  int mm, add, gelu, softmax, norm, cast, reshape, split;
  int x, w, b, gamma, tbl;
} Sample;

/* A graph exercising every part of the encoding:
 *   input_alpha f32[4,8], consts w f32[8,8], b bf16->f32 [8], gamma f32[8],
 *   matmul (bool attr), add, gelu (enum), softmax (int), rms_norm (float),
 *   cast (dtype), reshape (ints), split (two results, ints), a group around
 *   gelu+softmax, and a memory plan. */
static Graph *sample_graph(Sample *s) {
  Graph *g = ir_graph_create("tiny");
  g->file = ir_graph_strdup(g, "model.yaml");
  SrcLoc loc = {g->file, 2, 5};
  s->x = ir_add_input(g, "input_alpha", tt(DT_F32, 2, (int64_t[]){4, 8}), loc);
  float w[64], b[8], gamma[8];
  for (int i = 0; i < 64; i++) w[i] = 0.25f * (float)(i % 13) - 1.0f;
  for (int i = 0; i < 8; i++) b[i] = 0.5f * (float)i, gamma[i] = 1.0f + 0.125f * (float)i;
  s->w = ir_add_const(g, "w", tt(DT_F32, 2, (int64_t[]){8, 8}), w, loc);
  g->val[s->w].init = "normal(0.02)";
  s->b = ir_add_const(g, "b", tt(DT_F32, 1, (int64_t[]){8}), b, loc);
  g->val[s->b].init = "value";
  s->gamma = ir_add_const(g, "gamma", tt(DT_F32, 1, (int64_t[]){8}), gamma, loc);
  /* an unused bf16 constant: not stored (a dead value after decoding) */
  uint16_t tbl[3] = {0x3f80, 0x4049, 0xbf80};
  s->tbl = ir_add_const(g, "unused_tbl", tt(DT_BF16, 1, (int64_t[]){3}), tbl, loc);

  s->mm = add1(g, OP_MATMUL, 2, (int[]){s->x, s->w}, "mm", 10);
  ir_set_attr_bool(g, s->mm, "transpose_b", true);
  finish(g, s->mm);
  s->add = add1(g, OP_ADD, 2, (int[]){out0(g, s->mm), s->b}, "biased", 11);
  finish(g, s->add);
  s->gelu = add1(g, OP_GELU, 1, (int[]){out0(g, s->add)}, "act", 12);
  ir_set_attr_enum(g, s->gelu, "approximate", "tanh");
  finish(g, s->gelu);
  s->softmax = add1(g, OP_SOFTMAX, 1, (int[]){out0(g, s->gelu)}, "probs", 13);
  ir_set_attr_int(g, s->softmax, "axis", -1);
  finish(g, s->softmax);
  s->norm = add1(g, OP_RMS_NORM, 2, (int[]){out0(g, s->softmax), s->gamma}, "normed", 14);
  ir_set_attr_float(g, s->norm, "eps", 1.0e-5);
  finish(g, s->norm);
  s->cast = add1(g, OP_CAST, 1, (int[]){out0(g, s->norm)}, "half", 15);
  ir_set_attr_dtype(g, s->cast, "to", DT_F16);
  finish(g, s->cast);
  s->reshape = add1(g, OP_RESHAPE, 1, (int[]){out0(g, s->cast)}, "flat", 16);
  ir_set_attr_ints(g, s->reshape, "shape", (int64_t[]){2, 16}, 2);
  finish(g, s->reshape);
  s->split = ir_add_node(g, OP_SPLIT, 1, (int[]){out0(g, s->reshape)}, 2, (const char *[]){"lo", "hi"},
                         (SrcLoc){g->file, 17, 3});
  ir_set_attr_int(g, s->split, "axis", 1);
  ir_set_attr_ints(g, s->split, "sizes", (int64_t[]){4, 12}, 2);
  finish(g, s->split);
  ir_add_output(g, g->node[s->split].out[0]);
  ir_add_output(g, g->node[s->split].out[1]);

  int k = ir_add_group(g, GK_REDUCTION);
  Group *gr = &g->groups[k];
  gr->nodes = ir_graph_alloc(g, 2 * sizeof(int));
  gr->nodes[0] = s->gelu;
  gr->nodes[1] = s->softmax;
  gr->nnodes = 2;
  gr->anchor = s->softmax;
  gr->footprint = 1024;
  gr->budget = 2 << 20;
  gr->kernel = ir_graph_strdup(g, "k00_act_probs");
  g->node[s->gelu].group = k;
  g->node[s->softmax].group = k;

  g->val[out0(g, s->add)].mem_offset = 0;     /* f32[4,8]: 128 bytes */
  g->val[out0(g, s->softmax)].mem_offset = 128;
  g->val[out0(g, s->cast)].mem_offset = 0;    /* f16[4,8]: reuses the space */
  g->arena_bytes = 256;
  g->unplanned_bytes = 640;
  CHECK_OK(ir_verify(g));
  return g;
}

/* The constants blob of the last encode: the sink appends each constant at
 * the next multiple of 64 and remembers where (per value id). */
static _Alignas(64) unsigned char blob[1 << 16];
static size_t blob_len;
static int64_t blob_at[256];
static int puts_made;

static smelt_status test_put(void *ctx, const Graph *g, int v, IrConstRef *out) {
  (void)ctx;
  size_t n = ir_type_bytes(&g->val[v].type), off = (blob_len + 63) / 64 * 64;
  if (off + n > sizeof blob || v >= 256) return st_error(ST_INTERNAL, "test blob full");
  memset(blob + blob_len, 0, off - blob_len);
  memcpy(blob + off, g->val[v].data, n);
  blob_len = off + n;
  blob_at[v] = (int64_t)off;
  puts_made++;
  *out = (IrConstRef){IR_CONST_BLOB, off};
  return NULL;
}

static const IrConstSink test_sink = {.put = test_put};

static IrConstSpace blob_space(void) { return (IrConstSpace){.blob = blob, .blob_len = blob_len}; }

static smelt_status decode(const void *buf, size_t len, Graph **out) {
  IrConstSpace cs = blob_space();
  return ir_graph_deserialize(buf, len, &cs, out);
}

static void *encode(const Graph *g, size_t *len) {
  void *buf = NULL;
  blob_len = 0;
  puts_made = 0;
  for (int i = 0; i < 256; i++) blob_at[i] = -1;
  CHECK_OK(ir_graph_serialize(g, &test_sink, &buf, len));
  return buf;
}

/* Whether a live node or an output reads v. */
static bool is_used(const Graph *g, int v) {
  for (int i = 0; i < g->nnode; i++)
    for (int j = 0; !g->node[i].dead && j < g->node[i].nin; j++)
      if (g->node[i].in[j] == v) return true;
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i] == v) return true;
  return false;
}

/* Decodes buf and checks that the result is g again, through the printer,
 * the constant bytes, and a second encoding. */
static void check_round_trip(const Graph *g) {
  size_t len;
  void *buf = encode(g, &len);
  if (!buf) return;
  Graph *d = NULL;
  CHECK_OK(decode(buf, len, &d));
  if (!d) {
    free(buf);
    return;
  }
  char *a = ir_print_str(g), *b = ir_print_str(d);
  CHECK(a && b && strcmp(a, b) == 0);
  if (a && b && strcmp(a, b) != 0) fprintf(stderr, "--- original\n%s--- decoded\n%s", a, b);
  free(a), free(b);
  CHECK(d->nval == g->nval && d->nnode == g->nnode && d->ngroups == g->ngroups);
  CHECK(strcmp(d->name, g->name) == 0 && (g->file ? d->file && strcmp(d->file, g->file) == 0 : !d->file));
  for (int v = 0; v < g->nval && v < d->nval; v++) {
    const Value *x = &g->val[v], *y = &d->val[v];
    if (x->kind == VK_CONST && !is_used(g, v)) {
      /* dropped: a dead value without bytes, and nothing went into the blob */
      CHECK(y->kind == VK_DEAD && !y->data && blob_at[v] == -1);
      continue;
    }
    CHECK(x->kind == y->kind && strcmp(x->name, y->name) == 0 && x->mem_offset == y->mem_offset);
    CHECK(x->loc.line == y->loc.line && x->loc.col == y->loc.col);
    if (x->kind == VK_CONST) {
      /* in the blob, where the sink put it: not a copy */
      CHECK(y->data && ((uintptr_t)y->data % 64) == 0);
      CHECK(blob_at[v] >= 0 && y->data == blob + blob_at[v]);
      CHECK(y->data && memcmp(x->data, y->data, ir_type_bytes(&x->type)) == 0);
      CHECK((x->init == NULL) == (y->init == NULL) && (!x->init || strcmp(x->init, y->init) == 0));
    }
  }
  for (int k = 0; k < g->ngroups && k < d->ngroups; k++) {
    const Group *x = &g->groups[k], *y = &d->groups[k];
    CHECK(x->kind == y->kind && x->anchor == y->anchor && x->footprint == y->footprint && x->budget == y->budget);
    CHECK(x->nnodes == y->nnodes && strcmp(x->kernel, y->kernel) == 0);
  }
  CHECK(d->arena_bytes == g->arena_bytes && d->unplanned_bytes == g->unplanned_bytes);
  /* the strongest check: re-encoding gives the same bytes */
  size_t len2;
  void *buf2 = encode(d, &len2);
  CHECK(buf2 && len2 == len && memcmp(buf, buf2, len) == 0);
  free(buf2);
  ir_graph_destroy(d);
  free(buf);
}

static void put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void test_round_trips(void) {
  Sample s;
  Graph *g = sample_graph(&s);
  check_round_trip(g);

  /* a dead node that is still in the graph (before compaction) */
  int extra = add1(g, OP_NEG, 1, (int[]){s.x}, "unused_neg", 20);
  finish(g, extra);
  g->node[extra].dead = true;
  CHECK_OK(ir_verify(g));
  check_round_trip(g);
  /* after compaction its result is a VK_DEAD value */
  CHECK_OK(ir_graph_compact(g));
  bool has_dead = false;
  for (int v = 0; v < g->nval; v++) has_dead |= g->val[v].kind == VK_DEAD;
  CHECK(has_dead);
  check_round_trip(g);
  ir_graph_destroy(g);

  /* state: a cache updated in place by scatter keeps its state flag, its
   * place in g->states and its update through a round trip */
  Graph *st = ir_graph_create("state");
  int xs = ir_add_input(st, "x", tt(DT_F32, 2, (int64_t[]){2, 4}), (SrcLoc){0});
  int ps = ir_add_input(st, "pos", tt(DT_I32, 1, (int64_t[]){2}), (SrcLoc){0});
  int cs = ir_add_state(st, "cache", tt(DT_F32, 2, (int64_t[]){8, 4}), (SrcLoc){0});
  int sc = add1(st, OP_SCATTER, 3, (int[]){cs, ps, xs}, "c2", 3);
  finish(st, sc);
  int sm = add1(st, OP_SUM, 1, (int[]){out0(st, sc)}, "y", 4);
  finish(st, sm);
  ir_add_output(st, out0(st, sm));
  CHECK_OK(ir_verify(st));
  check_round_trip(st);
  size_t slen;
  void *sbuf = encode(st, &slen);
  Graph *sd = NULL;
  if (sbuf) CHECK_OK(decode(sbuf, slen, &sd));
  if (sd) {
    CHECK(sd->nstates == 1 && sd->states[0] == cs && sd->val[cs].state && sd->ninputs == 2);
    CHECK(ir_state_update(sd, cs) == sc && ir_state_of(sd, out0(sd, sc)) == cs);
    ir_graph_destroy(sd);
  }
  /* the last i32 before the range count (u8 0) is the state's value id:
   * pointing it at a node result is refused */
  if (sbuf) {
    unsigned char *bb = sbuf;
    CHECK(bb[slen - 1] == 0);
    put32(bb + slen - 5, (uint32_t)out0(st, sm));
    Graph *bad = NULL;
    smelt_status e = decode(bb, slen, &bad);
    CHECK(e && !bad && strstr(st_message(e), "which is not a free input"));
    st_free(e);
  }
  free(sbuf);
  ir_graph_destroy(st);

  /* ranged dims: the ranges and each value's ranged axes round-trip; an
   * axis whose extent does not match its range's max is refused */
  Graph *rg = ir_graph_create("ranged");
  int rx = ir_add_input(rg, "x", tt(DT_F32, 2, (int64_t[]){16, 4}), (SrcLoc){0});
  int rn = add1(rg, OP_NEG, 1, (int[]){rx}, "y", 2);
  finish(rg, rn);
  ir_add_output(rg, out0(rg, rn));
  rg->ranges[0] = (IrRange){ir_graph_strdup(rg, "seq"), 2, 8};
  rg->nranges = 1;
  for (int v = 0; v < rg->nval; v++) {
    rg->val[v].type.dyn[0] = 1;
    rg->val[v].type.dyn_a[0] = 2; /* 2 * seq: 16 at the max 8 */
    rg->val[v].type.dyn_b[0] = 0;
  }
  size_t rlen;
  void *rbuf = encode(rg, &rlen);
  Graph *rd = NULL;
  if (rbuf) CHECK_OK(decode(rbuf, rlen, &rd));
  if (rd) {
    CHECK(rd->nranges == 1 && strcmp(rd->ranges[0].name, "seq") == 0 && rd->ranges[0].min == 2 && rd->ranges[0].max == 8);
    CHECK(rd->val[rx].type.dyn[0] == 1 && rd->val[rx].type.dyn_a[0] == 2 && rd->val[rx].type.dyn[1] == 0);
    int64_t d5[1] = {5};
    CHECK(ir_type_extent(&rd->val[out0(rd, rn)].type, 0, d5) == 10);
    ir_graph_destroy(rd);
  }
  if (rbuf) {
    /* the range's max, the graph's last i64, made 9: 2 * 9 != 16 */
    unsigned char *bb = rbuf;
    bb[rlen - 8] = 9;
    Graph *bad = NULL;
    smelt_status e = decode(bb, rlen, &bad);
    CHECK(e && !bad && strstr(st_message(e), "ranged extent does not match"));
    st_free(e);
  }
  free(rbuf);
  ir_graph_destroy(rg);

  /* the smallest graph: an input passed through; no file name */
  Graph *t = ir_graph_create("id");
  int x = ir_add_input(t, "x", tt(DT_I64, 0, NULL), (SrcLoc){0});
  ir_add_output(t, x);
  check_round_trip(t);
  ir_graph_destroy(t);
}

/* Expects decoding to fail with a message containing `want`. */
static void expect_reject(const void *buf, size_t len, const char *want, int line) {
  Graph *d = (Graph *)1;
  smelt_status st = decode(buf, len, &d);
  if (!st) {
    fprintf(stderr, "%s:%d: decoding succeeded, expected '%s'\n", __FILE__, line, want);
    check_failures++;
    ir_graph_destroy(d);
    return;
  }
  CHECK(d == NULL);
  CHECK(st_code(st) == ST_INVALID_INPUT);
  if (!strstr(st_message(st), want) || strncmp(st_message(st), "graph section: ", 15) != 0) {
    fprintf(stderr, "%s:%d: message '%s' lacks '%s'\n", __FILE__, line, st_message(st), want);
    check_failures++;
  }
  st_free(st);
}
#define EXPECT_REJECT(buf, len, want) expect_reject((buf), (len), (want), __LINE__)

/* Encodes a copy of the sample graph after `mutate` has damaged it. */
static void expect_graph_reject(void (*mutate)(Graph *, const Sample *), const char *want, int line) {
  Sample s;
  Graph *g = sample_graph(&s);
  mutate(g, &s);
  size_t len;
  void *buf = encode(g, &len);
  if (buf) expect_reject(buf, len, want, line);
  free(buf);
  ir_graph_destroy(g);
}
#define EXPECT_GRAPH_REJECT(mutate, want) expect_graph_reject((mutate), (want), __LINE__)

static void m_value_node(Graph *g, const Sample *s) { g->val[out0(g, s->mm)].node = 99; }
static void m_operand(Graph *g, const Sample *s) { g->node[s->add].in[0] = 1000; }
static void m_result(Graph *g, const Sample *s) { g->node[s->add].out[0] = s->x; }
static void m_member(Graph *g, const Sample *s) { (void)s, g->groups[0].nodes[1] = 77; }
static void m_membership(Graph *g, const Sample *s) { g->node[s->softmax].group = -1; }
static void m_group_id(Graph *g, const Sample *s) { g->node[s->norm].group = 5; }
static void m_output(Graph *g, const Sample *s) { (void)s, g->outputs[0] = 500; }
static void m_input_kind(Graph *g, const Sample *s) { g->inputs[0] = s->w; }
static void m_mem_offset(Graph *g, const Sample *s) { g->val[out0(g, s->softmax)].mem_offset = 200; }
static void m_neg_dim(Graph *g, const Sample *s) { g->val[s->x].type.dim[1] = -8; }
static void m_attr_type(Graph *g, const Sample *s) { ir_set_attr_int(g, s->mm, "transpose_b", 1); }
static void m_attr_unknown(Graph *g, const Sample *s) { ir_set_attr_int(g, s->softmax, "bogus", 1); }
static void m_attr_bool(Graph *g, const Sample *s) { ((Attr *)ir_attr(&g->node[s->mm], "transpose_b"))->i = 2; }
static void m_attr_enum(Graph *g, const Sample *s) { ir_set_attr_enum(g, s->gelu, "approximate", "sigmoid"); }
static void m_arity(Graph *g, const Sample *s) { g->node[s->add].nin = 1; }
static void m_type(Graph *g, const Sample *s) { g->val[out0(g, s->add)].type.dim[0] = 5; }
static void m_names(Graph *g, const Sample *s) { g->val[out0(g, s->add)].name = "mm"; }

static void test_bad_graphs(void) {
  EXPECT_GRAPH_REJECT(m_value_node, "refers to node 99 of ");
  EXPECT_GRAPH_REJECT(m_operand, "operand 0 is value 1000 of ");
  EXPECT_GRAPH_REJECT(m_result, "claims to be result 0 of node 1, which does not list it");
  EXPECT_GRAPH_REJECT(m_member, "member 1 is node 77 of ");
  EXPECT_GRAPH_REJECT(m_membership, "which is in group -1");
  EXPECT_GRAPH_REJECT(m_group_id, "is in group 5 of 1");
  EXPECT_GRAPH_REJECT(m_output, "output 0 is value 500 of ");
  EXPECT_GRAPH_REJECT(m_input_kind, "which is not an input");
  EXPECT_GRAPH_REJECT(m_mem_offset, "past the arena's 256 bytes");
  EXPECT_GRAPH_REJECT(m_neg_dim, "negative dimension");
  EXPECT_GRAPH_REJECT(m_attr_type, "'transpose_b' has type int, the schema says bool");
  EXPECT_GRAPH_REJECT(m_attr_unknown, "'bogus' is not in the schema of softmax");
  EXPECT_GRAPH_REJECT(m_attr_bool, "bool attribute 'transpose_b' is 2");
  EXPECT_GRAPH_REJECT(m_attr_enum, "'sigmoid', not one of none|tanh");
  EXPECT_GRAPH_REJECT(m_arity, "has 1 operands, add takes 2 to 2");
  EXPECT_GRAPH_REJECT(m_type, "differs from shape inference");
  EXPECT_GRAPH_REJECT(m_names, "two live values are named 'mm'");

  /* the encoder refuses what it cannot represent */
  Sample s;
  Graph *g = sample_graph(&s);
  g->val[s.x].type.rank = IR_MAX_RANK + 1;
  void *buf = NULL;
  size_t len = 0;
  smelt_status st = ir_graph_serialize(g, &test_sink, &buf, &len);
  CHECK(st && st_code(st) == ST_INTERNAL && strstr(st_message(st), "rank out of range") && !buf);
  st_free(st);
  ir_graph_destroy(g);
}

static size_t find_bytes(const unsigned char *hay, size_t n, const void *needle, size_t m) {
  for (size_t i = 0; i + m <= n; i++)
    if (memcmp(hay + i, needle, m) == 0) return i;
  return SIZE_MAX;
}


/* Faults patched into the bytes, where the layout documented in
 * ir/serialize.c says they are. */
static void test_bad_bytes(void) {
  Sample s;
  Graph *g = sample_graph(&s);
  size_t len;
  unsigned char *good = encode(g, &len);
  unsigned char *b = malloc(len + 1);
  if (!good || !b) {
    free(good), free(b), ir_graph_destroy(g);
    return;
  }
#define FRESH() memcpy(b, good, len)
  FRESH();
  b[0] = 'X';
  EXPECT_REJECT(b, len, "bad magic");
  FRESH();
  put32(b + 4, 1);
  EXPECT_REJECT(b, len, "unsupported encoding version 1 (this smelt reads version 4)");
  /* header: magic 4, version 4, "tiny" 8, "model.yaml" 14, two i64, then nval */
  size_t counts = 4 + 4 + 8 + 14 + 16;
  FRESH();
  CHECK(b[counts] == (unsigned char)g->nval);
  put32(b + counts, 0xfffffff0u);
  EXPECT_REJECT(b, len, "4294967280 values");
  FRESH();
  b[len] = 0;
  EXPECT_REJECT(b, len + 1, "1 unexpected bytes after the graph");

  size_t at = find_bytes(b, len, "softmax", 7);
  CHECK(at != SIZE_MAX);
  if (at != SIZE_MAX) {
    FRESH();
    b[at + 6] = 'z';
    EXPECT_REJECT(b, len, "unknown op 'softmaz'");
  }
  at = find_bytes(b, len, "\004\0\0\0bf16", 8);
  CHECK(at != SIZE_MAX);
  if (at != SIZE_MAX) {
    FRESH();
    b[at + 7] = '7';
    EXPECT_REJECT(b, len, "unknown dtype 'bf17'");
  }
  /* the value record of input_alpha: name, kind u8, dtype "f32", rank u8 */
  at = find_bytes(b, len, "\013\0\0\0input_alpha", 15);
  CHECK(at != SIZE_MAX);
  if (at != SIZE_MAX) {
    size_t kind = at + 15, rank = kind + 1 + 4 + 3;
    CHECK(b[rank] == 2);
    FRESH();
    b[rank] = IR_MAX_RANK + 1;
    EXPECT_REJECT(b, len, "rank 9 exceeds the maximum 8");
    FRESH();
    b[kind] = 9;
    EXPECT_REJECT(b, len, "unknown value kind 9");
    FRESH();
    b[kind + 4] = 0x7f; /* dtype length 0x7f000003: far past the end */
    EXPECT_REJECT(b, len, "truncated");
  }
  /* gamma's reference: store 1 (blob), u64 offset, u64 size 32 */
  unsigned char ref[17] = {1};
  for (int i = 0; i < 8; i++) ref[1 + i] = (unsigned char)((uint64_t)blob_at[s.gamma] >> (8 * i));
  ref[9] = 32;
  CHECK(blob_at[s.gamma] > 0 && blob_at[s.tbl] == -1 && puts_made == 3);
  at = find_bytes(b, len, ref, sizeof ref);
  CHECK(at != SIZE_MAX);
  if (at != SIZE_MAX) {
    FRESH();
    b[at + 9] = 28;
    EXPECT_REJECT(b, len, "holds 28 bytes of data but its type f32[8] needs 32");
    FRESH();
    b[at] = 0;
    EXPECT_REJECT(b, len, "constant without data");
    FRESH();
    b[at] = 3;
    EXPECT_REJECT(b, len, "constant store is 3");
    FRESH();
    b[at + 1] += 1;
    EXPECT_REJECT(b, len, "constant offset");
    FRESH();
    b[at + 1] = 0, b[at + 2] = 0x10; /* offset 4096, past the blob */
    EXPECT_REJECT(b, len, "lie outside the constants section");
    FRESH();
    b[at + 8] = 0x80; /* an offset near 2^64: no overflow into range */
    EXPECT_REJECT(b, len, "outside the constants section");
    FRESH();
    b[at] = 2; /* external tensor N, and there are none */
    EXPECT_REJECT(b, len, "external tensor");
    /* a blob cut short: gamma's bytes are no longer all there */
    FRESH();
    size_t full = blob_len;
    blob_len = (size_t)blob_at[s.gamma] + 31;
    EXPECT_REJECT(b, len, "lie outside the constants section");
    blob_len = full;
    /* external tensors: there, but of the wrong size; then right */
    FRESH();
    b[at] = 2;
    memset(b + at + 1, 0, 8);
    void *ext[1] = {blob + blob_at[s.gamma]};
    size_t ext_len[1] = {28};
    IrConstSpace cs = {.blob = blob, .blob_len = blob_len, .ext = ext, .ext_len = ext_len, .next = 1};
    Graph *d = NULL;
    smelt_status st = ir_graph_deserialize(b, len, &cs, &d);
    CHECK(st && strstr(st_message(st), "external tensor 0 has 28 bytes, the constant needs 32"));
    st_free(st);
    ext_len[0] = 32;
    st = ir_graph_deserialize(b, len, &cs, &d);
    CHECK_OK(st);
    CHECK(d && d->val[s.gamma].data == ext[0]);
    ir_graph_destroy(d);
  }
#undef FRESH
  free(b);
  free(good);
  ir_graph_destroy(g);
}

/* Every proper prefix of an encoding must be rejected, and cleanly. */
static void test_truncations(void) {
  Sample s;
  Graph *g = sample_graph(&s);
  size_t len;
  unsigned char *good = encode(g, &len);
  int accepted = 0, wrong_code = 0;
  for (size_t n = 0; good && n < len; n++) {
    /* a private copy of exactly n bytes, so ASan sees any over-read */
    unsigned char *b = malloc(n ? n : 1);
    memcpy(b, good, n);
    Graph *d = NULL;
    smelt_status st = decode(b, n, &d);
    if (!st) accepted++, ir_graph_destroy(d);
    else if (st_code(st) != ST_INVALID_INPUT || d) wrong_code++;
    st_free(st);
    free(b);
  }
  CHECK(accepted == 0);
  CHECK(wrong_code == 0);
  free(good);
  ir_graph_destroy(g);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* Random corruption: each decode either fails cleanly or gives a graph that
 * verifies and prints. */
static void test_random_corruption(void) {
  Sample s;
  Graph *g = sample_graph(&s);
  size_t len;
  unsigned char *good = encode(g, &len);
  int rejected = 0, accepted = 0;
  for (int seed = 0; good && seed < 600; seed++) {
    rng_state = 0x9e3779b97f4a7c15u ^ (uint64_t)seed * 0x2545f4914f6cdd1du;
    unsigned char *b = malloc(len);
    memcpy(b, good, len);
    int flips = 1 + (int)(rng() % 4);
    for (int i = 0; i < flips; i++) {
      size_t at = rng() % len;
      /* half the time a plausible small value, half the time any byte */
      b[at] = rng() & 1 ? (unsigned char)(b[at] ^ (1u << (rng() % 8))) : (unsigned char)rng();
    }
    Graph *d = NULL;
    smelt_status st = decode(b, len, &d);
    if (st) {
      CHECK(st_code(st) == ST_INVALID_INPUT && d == NULL);
      rejected++;
      st_free(st);
    } else {
      accepted++;
      CHECK_OK(ir_verify(d));
      char *text = ir_print_str(d);
      CHECK(text != NULL);
      free(text);
      ir_graph_destroy(d);
    }
    free(b);
  }
  CHECK(rejected > 0);
  printf("test_serialize: random corruption: %d rejected, %d decoded into graphs that verify\n", rejected, accepted);
  free(good);
  ir_graph_destroy(g);
}

int main(void) {
  test_round_trips();
  test_bad_graphs();
  test_bad_bytes();
  test_truncations();
  test_random_corruption();
  return check_done("test_serialize");
}
