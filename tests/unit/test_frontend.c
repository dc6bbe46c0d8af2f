/* Unit tests of the frontend: the YAML loader (shapes, dims and their
 * overrides, blocks and repeat naming, {i} weight names, param sources and
 * their determinism and statistics, located errors), the safetensors reader
 * (a valid file and each kind of corruption) and .npy round trips.  Every
 * model and weights file is written to a fresh temporary directory here, so
 * the test has no fixtures to drift from the code.  The last part feeds the
 * loader every truncation and many byte mutations of a valid model: under
 * ASan/UBSan a crash, leak or undefined behaviour fails the test. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frontend/frontend.h"
#include "tests/unit/check.h"

static char tmpdir[64];
static char *made[256];
static int nmade;

/* A path inside the temporary directory (static storage, rotated). */
static const char *tpath(const char *name) {
  static char bufs[8][256];
  static int k;
  char *b = bufs[k++ % 8];
  snprintf(b, 256, "%s/%s", tmpdir, name);
  return b;
}

static void remember(const char *path) {
  for (int i = 0; i < nmade; i++)
    if (!strcmp(made[i], path)) return;
  if (nmade < 256) made[nmade++] = strdup(path);
}

static const char *write_bytes(const char *name, const void *data, size_t n) {
  const char *p = tpath(name);
  FILE *f = fopen(p, "wb");
  if (!f) {
    perror(p);
    exit(2);
  }
  fwrite(data, 1, n, f);
  fclose(f);
  remember(p);
  return p;
}

static const char *write_text(const char *name, const char *text) { return write_bytes(name, text, strlen(text)); }

/* ---- safetensors writer for fixtures ---- */
typedef struct {
  const char *name, *dtype;
  int rank;
  int64_t dim[4];
  const void *data;
  size_t nbytes;
} StEntry;

/* Writes a safetensors file; extra_json (may be "") is spliced into the
 * header object, so tests can add __metadata__ or malformed entries. */
static const char *write_st(const char *name, const StEntry *e, int n, const char *extra_json) {
  char header[4096];
  size_t k = (size_t)snprintf(header, sizeof header, "{");
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    k += (size_t)snprintf(header + k, sizeof header - k, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "",
                          e[i].name, e[i].dtype);
    for (int d = 0; d < e[i].rank; d++)
      k += (size_t)snprintf(header + k, sizeof header - k, "%s%lld", d ? "," : "", (long long)e[i].dim[d]);
    k += (size_t)snprintf(header + k, sizeof header - k, "],\"data_offsets\":[%zu,%zu]}", off, off + e[i].nbytes);
    off += e[i].nbytes;
  }
  k += (size_t)snprintf(header + k, sizeof header - k, "%s%s}", n && *extra_json ? "," : "", extra_json);
  while (k % 8) header[k++] = ' '; /* the reference writer pads with spaces */
  size_t total = 8 + k + off;
  unsigned char *buf = malloc(total);
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)k >> (8 * i));
  memcpy(buf + 8, header, k);
  off = 8 + k;
  for (int i = 0; i < n; i++) {
    memcpy(buf + off, e[i].data, e[i].nbytes);
    off += e[i].nbytes;
  }
  const char *p = write_bytes(name, buf, total);
  free(buf);
  return p;
}

/* Loads a model and expects an error whose message contains want. */
static void expect_error(const char *path, const FeOptions *opts, const char *want, int line) {
  Graph *g = NULL;
  smelt_status st = fe_load_yaml(path, opts, &g);
  if (!st) {
    fprintf(stderr, "test_frontend.c:%d: expected an error containing \"%s\", got success\n", line, want);
    check_failures++;
    ir_graph_destroy(g);
    return;
  }
  if (!strstr(st_message(st), want)) {
    fprintf(stderr, "test_frontend.c:%d: expected \"%s\" in \"%s\"\n", line, want, st_message(st));
    check_failures++;
  }
  CHECK(g == NULL);
  st_free(st);
}
#define EXPECT_ERROR(path, opts, want) expect_error(path, opts, want, __LINE__)

static Graph *load_ok(const char *path, const FeOptions *opts) {
  Graph *g = NULL;
  CHECK_OK(fe_load_yaml(path, opts, &g));
  return g;
}

static const Value *val(const Graph *g, const char *name) {
  int v = ir_find_value(g, name);
  if (v < 0) {
    fprintf(stderr, "no value '%s'\n", name);
    check_failures++;
    return NULL;
  }
  return &g->val[v];
}

static bool has_shape(const Value *v, DType dt, int rank, int64_t d0, int64_t d1) {
  if (!v || v->type.dt != dt || v->type.rank != rank) return false;
  if (rank > 0 && v->type.dim[0] != d0) return false;
  if (rank > 1 && v->type.dim[1] != d1) return false;
  return true;
}

/* ---- tests ---- */

static const char *model_text =
    "smelt: 1\n"
    "name: tiny\n"
    "seed: 7\n"
    "dims: {seq: 4, hidden: 8, layers: 3}\n"
    "inputs:\n"
    "  x: {shape: [seq, hidden]}\n"
    "  pos: {shape: [seq], dtype: i32}\n"
    "params:\n"
    "  g: {shape: [hidden], init: ones}\n"
    "blocks:\n"
    "  layer:\n"
    "    inputs: [x, pos]\n"
    "    params:\n"
    "      w: {shape: [hidden, hidden], init: {normal: 0.02}}\n"
    "    nodes:\n"
    "      - {out: q, op: matmul, in: [x, w]}\n"
    "      - {out: y, op: add, in: [x, q]}\n"
    "    outputs: [y]\n"
    "nodes:\n"
    "  - {out: h, repeat: layer, times: layers, in: [x, pos]}\n"
    "  - {out: r, op: reshape, in: [h], shape: [-1, hidden]}\n"
    "  - {out: y, op: rms_norm, in: [r, g], eps: 1.0e-6}\n"
    "outputs: [y]\n";

static void test_basic(void) {
  const char *p = write_text("basic.yaml", model_text);
  Graph *g = load_ok(p, NULL);
  if (!g) return;
  CHECK(!strcmp(g->name, "tiny"));
  CHECK(g->file && !strcmp(g->file, p));
  CHECK(g->ninputs == 2 && g->noutputs == 1);
  CHECK(has_shape(val(g, "x"), DT_F32, 2, 4, 8));
  CHECK(has_shape(val(g, "pos"), DT_I32, 1, 4, 0));
  CHECK(has_shape(val(g, "g"), DT_F32, 1, 8, 0));
  CHECK(has_shape(val(g, "y"), DT_F32, 2, 4, 8));
  /* three copies, named by copy; chained: copy 1 adds to copy 0's output */
  CHECK(has_shape(val(g, "layer.0/q"), DT_F32, 2, 4, 8));
  CHECK(has_shape(val(g, "layer.1/q"), DT_F32, 2, 4, 8));
  CHECK(has_shape(val(g, "layer.2/w"), DT_F32, 2, 8, 8));
  CHECK(ir_find_value(g, "layer.3/q") < 0);
  const Value *y1 = val(g, "layer.1/y");
  if (y1) {
    const Node *n = &g->node[y1->node];
    CHECK(n->op == OP_ADD && n->in[0] == ir_find_value(g, "layer.0/y"));
  }
  /* `h` aliases the last copy's output */
  const Value *r = val(g, "r");
  if (r) CHECK(g->node[r->node].in[0] == ir_find_value(g, "layer.2/y"));
  /* reshape's -1 and dims name survive as numbers */
  if (r) {
    const Attr *a = ir_attr(&g->node[r->node], "shape");
    CHECK(a && a->n == 2 && a->ints[0] == -1 && a->ints[1] == 8);
  }
  /* defaults are filled in, given attributes kept */
  const Value *y = val(g, "y");
  if (y) {
    CHECK_NEAR(ir_attr_float(&g->node[y->node], "eps"), 1e-6, 1e-12);
    CHECK(ir_attr_int(&g->node[y->node], "axis") == -1);
  }
  /* every value and node carries its place in the file */
  const Value *x = val(g, "x");
  if (x) CHECK(x->loc.line == 6 && x->loc.col == 3 && x->loc.file == g->file);
  const Value *q = val(g, "layer.0/q");
  if (q) CHECK(g->node[q->node].loc.line == 16 && g->node[q->node].loc.col == 9);
  const Value *gv = val(g, "g");
  if (gv) CHECK(((const float *)gv->data)[7] == 1.0f && gv->init && !strcmp(gv->init, "ones"));
  ir_graph_destroy(g);
}

static void test_dims_override(void) {
  const char *p = write_text("dims.yaml", model_text);
  FeDim d[2] = {{"seq", 2, 0}, {"layers", 5, 0}};
  FeOptions o = {d, 2, DT_INVALID};
  Graph *g = load_ok(p, &o);
  if (g) {
    CHECK(has_shape(val(g, "x"), DT_F32, 2, 2, 8));
    CHECK(has_shape(val(g, "y"), DT_F32, 2, 2, 8));
    CHECK(ir_find_value(g, "layer.4/y") >= 0 && ir_find_value(g, "layer.5/y") < 0);
    ir_graph_destroy(g);
  }
  FeDim bad = {"sq", 2, 0};
  FeOptions ob = {&bad, 1, DT_INVALID};
  EXPECT_ERROR(p, &ob, "the model has no dim 'sq'");
  FeDim neg = {"seq", 0, 0};
  FeOptions on = {&neg, 1, DT_INVALID};
  EXPECT_ERROR(p, &on, "must be positive");
  /* --dtype retypes inputs and params without a dtype of their own */
  FeOptions of = {NULL, 0, DT_F16};
  g = load_ok(p, &of);
  if (g) {
    CHECK(has_shape(val(g, "x"), DT_F16, 2, 4, 8));
    CHECK(has_shape(val(g, "pos"), DT_I32, 1, 4, 0));
    CHECK(has_shape(val(g, "layer.0/w"), DT_F16, 2, 8, 8));
    ir_graph_destroy(g);
  }
}

static void test_repeat_twice_and_from(void) {
  /* weights layers.0.w = all 10, layers.1.w = all 11; b is f16 */
  float w0[4] = {10, 10, 10, 10}, w1[4] = {11, 11, 11, 11};
  uint16_t hb[2] = {dt_f32_to_f16(0.5f), dt_f32_to_f16(-2.0f)};
  int16_t odd[2] = {1, 2};
  StEntry e[4] = {
      {"layers.0.w", "F32", 2, {2, 2}, w0, sizeof w0},
      {"layers.1.w", "F32", 2, {2, 2}, w1, sizeof w1},
      {"b", "F16", 1, {2}, hb, sizeof hb},
      {"odd", "I16", 1, {2}, odd, sizeof odd},
  };
  write_st("w.safetensors", e, 4, "\"__metadata__\":{\"format\":\"pt\"}");
  const char *text =
      "smelt: 1\n"
      "weights: w.safetensors\n"
      "inputs: {x: {shape: [2, 2]}}\n"
      "params:\n"
      "  b: {shape: [2], dtype: f16, from: b}\n"
      "blocks:\n"
      "  blk:\n"
      "    inputs: [x]\n"
      "    params: {w: {shape: [2, 2], from: \"layers.{i}.w\"}}\n"
      "    nodes: [{out: y, op: matmul, in: [x, w]}]\n"
      "    outputs: [y]\n"
      "nodes:\n"
      "  - {out: a, repeat: blk, times: 2, in: [x]}\n"
      "  - {out: c, repeat: blk, times: 2, in: [a]}\n"
      "outputs: [c]\n";
  const char *p = write_text("from.yaml", text);
  Graph *g = load_ok(p, NULL);
  if (g) {
    /* numbering continues across the two repeats; {i} restarts */
    const Value *v0 = val(g, "blk.0/w"), *v1 = val(g, "blk.1/w"), *v2 = val(g, "blk.2/w"), *v3 = val(g, "blk.3/w");
    if (v0 && v1 && v2 && v3) {
      CHECK(((float *)v0->data)[0] == 10 && ((float *)v1->data)[3] == 11);
      CHECK(((float *)v2->data)[0] == 10 && ((float *)v3->data)[3] == 11);
      CHECK(!strcmp(v3->init, "from(layers.1.w)"));
    }
    const Value *b = val(g, "b");
    if (b) CHECK(b->type.dt == DT_F16 && ((uint16_t *)b->data)[1] == hb[1]);
    /* the output is the last copy's y, under the name the model gives it */
    CHECK(g->noutputs == 1 && g->outputs[0] == ir_find_value(g, "c") && ir_find_value(g, "blk.3/y") < 0);
    ir_graph_destroy(g);
  }
  /* --dtype f16 converts float weights of params without their own dtype */
  FeOptions of = {NULL, 0, DT_F16};
  g = load_ok(p, &of);
  if (g) {
    const Value *v1 = val(g, "blk.1/w");
    if (v1) CHECK(v1->type.dt == DT_F16 && dt_f16_to_f32(((uint16_t *)v1->data)[2]) == 11.0f);
    ir_graph_destroy(g);
  }

  /* mismatches name both sides */
  write_text("from_dt.yaml", "smelt: 1\nweights: w.safetensors\nparams: {b: {shape: [2], from: b}}\n"
                             "nodes: [{out: y, op: neg, in: [b]}]\noutputs: [y]\n");
  EXPECT_ERROR(tpath("from_dt.yaml"), NULL, "from_dt.yaml:3:32: error: param 'b': weights file has F16 [2], model says f32 [2]");
  write_text("from_shape.yaml", "smelt: 1\nweights: w.safetensors\nparams: {b: {shape: [1, 2], dtype: f16, from: b}}\n"
                                "outputs: [b]\n");
  EXPECT_ERROR(tpath("from_shape.yaml"), NULL, "weights file has F16 [2], model says f16 [1,2]");
  write_text("from_missing.yaml", "smelt: 1\nweights: w.safetensors\nparams: {b: {shape: [2], from: nope}}\n"
                                  "outputs: [b]\n");
  EXPECT_ERROR(tpath("from_missing.yaml"), NULL, "tensor 'nope' is not in weights file 'w.safetensors'");
  write_text("from_i16.yaml", "smelt: 1\nweights: w.safetensors\nparams: {o: {shape: [2], dtype: i32, from: odd}}\n"
                              "outputs: [o]\n");
  EXPECT_ERROR(tpath("from_i16.yaml"), NULL, "I16 [2], a dtype smelt does not support");
  write_text("from_now.yaml", "smelt: 1\nparams: {o: {shape: [2], from: odd}}\noutputs: [o]\n");
  EXPECT_ERROR(tpath("from_now.yaml"), NULL, "needs a weights file");
  write_text("from_idx.yaml", "smelt: 1\nweights: w.safetensors\nparams: {o: {shape: [2], from: \"a{i}\"}}\noutputs: [o]\n");
  EXPECT_ERROR(tpath("from_idx.yaml"), NULL, "only meaningful inside a repeated block");
  write_text("from_nofile.yaml", "smelt: 1\nweights: absent.safetensors\noutputs: []\n");
  EXPECT_ERROR(tpath("from_nofile.yaml"), NULL, "from_nofile.yaml:2:10: error: weights file 'absent.safetensors': cannot open");
}

static void test_nested_and_multi_output(void) {
  float w[2][4] = {{1, 1, 1, 1}, {2, 2, 2, 2}};
  StEntry e[2] = {{"in.0.w", "F32", 1, {4}, w[0], 16}, {"in.1.w", "F32", 1, {4}, w[1], 16}};
  write_st("nest.safetensors", e, 2, "");
  const char *p = write_text("nest.yaml",
                             "smelt: 1\n"
                             "weights: nest.safetensors\n"
                             "inputs: {x: {shape: [2, 4]}, s: {shape: [4]}}\n"
                             "blocks:\n"
                             "  inner:\n"
                             "    inputs: [x, s]\n"
                             "    params: {w: {shape: [4], from: \"in.{i}.w\"}}\n"
                             "    nodes: [{out: y, op: mul, in: [x, w]}]\n"
                             "    outputs: [y, s]\n"
                             "  outer:\n"
                             "    inputs: [x, s]\n"
                             "    nodes:\n"
                             "      - {out: [a, b], op: split, in: [x], axis: 0}\n"
                             "      - {out: c, op: concat, in: [b, a]}\n"
                             "      - {out: [d, t], repeat: inner, times: 2, in: [c, s]}\n"
                             "    outputs: [d]\n"
                             "nodes:\n"
                             "  - {out: h, repeat: outer, times: 3, in: [x, s]}\n"
                             "outputs: [h]\n");
  Graph *g = load_ok(p, NULL);
  if (!g) return;
  CHECK(has_shape(val(g, "outer.0/a"), DT_F32, 2, 1, 4));
  CHECK(has_shape(val(g, "h"), DT_F32, 2, 2, 4)); /* outer.2/inner.1/y, named as the output */
  const Value *w1 = val(g, "outer.2/inner.1/w");
  if (w1) CHECK(((float *)w1->data)[0] == 2);
  CHECK(ir_find_value(g, "outer.0/inner.2/y") < 0);
  /* the split is a single node with two results */
  const Value *a = val(g, "outer.1/a"), *b = val(g, "outer.1/b");
  if (a && b) CHECK(a->node == b->node && b->out_index == 1 && g->node[a->node].nout == 2);
  /* a block output that is one of its inputs passes the value through */
  const Value *y = val(g, "outer.1/inner.0/y");
  if (y) CHECK(g->node[y->node].in[1] == ir_find_value(g, "outer.1/inner.0/w"));
  CHECK(g->outputs[0] == ir_find_value(g, "h") && ir_find_value(g, "outer.2/inner.1/y") < 0);
  ir_graph_destroy(g);
}

static void moments(const Value *v, double *mean, double *std, double *lo, double *hi) {
  int64_t n = ir_type_numel(&v->type);
  double s = 0, s2 = 0;
  *lo = 1e300, *hi = -1e300;
  for (int64_t i = 0; i < n; i++) {
    double x = dt_load(v->type.dt, v->data, (size_t)i);
    s += x, s2 += x * x;
    if (x < *lo) *lo = x;
    if (x > *hi) *hi = x;
  }
  *mean = s / (double)n;
  *std = sqrt(s2 / (double)n - *mean * *mean);
}

static void test_init(void) {
  const char *text =
      "smelt: 1\nseed: 3\n"
      "params:\n"
      "  n: {shape: [256, 256], init: {normal: 0.02}}\n"
      "  u: {shape: [256, 256], init: {uniform: [-0.5, 1.5]}}\n"
      "  h: {shape: [1001], dtype: bf16, init: {normal: 3}}\n"
      "  z: {shape: [3], dtype: i64, init: zeros}\n"
      "  o: {shape: [3], dtype: i8, init: ones}\n"
      "outputs: [n, u, h, z, o]\n";
  const char *p = write_text("init.yaml", text);
  Graph *g = load_ok(p, NULL), *g2 = load_ok(p, NULL);
  if (!g || !g2) {
    ir_graph_destroy(g);
    ir_graph_destroy(g2);
    return;
  }
  double mean, std, lo, hi;
  moments(val(g, "n"), &mean, &std, &lo, &hi);
  CHECK(fabs(std - 0.02) < 0.05 * 0.02);
  CHECK(fabs(mean) < 0.001);
  moments(val(g, "u"), &mean, &std, &lo, &hi);
  CHECK(lo >= -0.5 && hi <= 1.5 && lo < -0.49 && hi > 1.49);
  CHECK(fabs(mean - 0.5) < 0.01);
  CHECK(fabs(std - 2.0 / sqrt(12.0)) < 0.05 * 2.0 / sqrt(12.0));
  moments(val(g, "h"), &mean, &std, &lo, &hi); /* odd count: the last Box-Muller pair is half used */
  CHECK(fabs(std - 3) < 0.3);
  CHECK(((int64_t *)val(g, "z")->data)[2] == 0 && ((int8_t *)val(g, "o")->data)[2] == 1);
  /* deterministic: same file, same bytes; the name is part of the key */
  CHECK(!memcmp(val(g, "n")->data, val(g2, "n")->data, 256 * 256 * 4));
  CHECK(memcmp(val(g, "n")->data, val(g, "u")->data, 64) != 0);
  ir_graph_destroy(g2);
  /* another seed gives other numbers */
  char *t2 = strdup(text);
  t2[strlen("smelt: 1\nseed: ")] = '4';
  p = write_text("init2.yaml", t2);
  free(t2);
  g2 = load_ok(p, NULL);
  if (g2) {
    CHECK(memcmp(val(g, "n")->data, val(g2, "n")->data, 256 * 256 * 4) != 0);
    ir_graph_destroy(g2);
  }
  ir_graph_destroy(g);
  /* block params differ per copy */
  p = write_text("init3.yaml", "smelt: 1\ninputs: {x: {shape: [4]}}\nblocks:\n  b:\n    inputs: [x]\n"
                               "    params: {w: {shape: [4], init: {uniform: [0, 1]}}}\n"
                               "    nodes: [{out: y, op: mul, in: [x, w]}]\n    outputs: [y]\n"
                               "nodes: [{out: y, repeat: b, times: 2, in: [x]}]\noutputs: [y]\n");
  g = load_ok(p, NULL);
  if (g) {
    CHECK(memcmp(val(g, "b.0/w")->data, val(g, "b.1/w")->data, 16) != 0);
    ir_graph_destroy(g);
  }
  write_text("init_bad.yaml", "smelt: 1\nparams: {w: {shape: [4], init: xavier}}\noutputs: [w]\n");
  EXPECT_ERROR(tpath("init_bad.yaml"), NULL, "init_bad.yaml:2:32: error: param 'w': unknown init xavier");
  write_text("init_int.yaml", "smelt: 1\nparams: {w: {shape: [4], dtype: i32, init: {normal: 1}}}\noutputs: [w]\n");
  EXPECT_ERROR(tpath("init_int.yaml"), NULL, "needs a float dtype");
  write_text("init_two.yaml", "smelt: 1\nparams: {w: {shape: [4], init: ones, value: 1}}\noutputs: [w]\n");
  EXPECT_ERROR(tpath("init_two.yaml"), NULL, "needs exactly one of init, value or from");
}

static void test_values(void) {
  const char *p = write_text("val.yaml", "smelt: 1\n"
                                         "params:\n"
                                         "  s: {shape: [2, 3], value: 2.5}\n"
                                         "  l: {shape: [2, 3], dtype: i64, value: [[1, 2, 3], [4, 5, 9007199254740993]]}\n"
                                         "  b: {shape: [2], dtype: bool, value: [true, 0]}\n"
                                         "  r: {shape: [], value: -.inf}\n"
                                         "  h: {shape: [2], dtype: f16, value: [1, 1.0e-3]}\n"
                                         "outputs: [s, l, b, r, h]\n");
  Graph *g = load_ok(p, NULL);
  if (g) {
    const float *s = val(g, "s")->data;
    CHECK(s[0] == 2.5f && s[5] == 2.5f);
    const int64_t *l = val(g, "l")->data;
    CHECK(l[0] == 1 && l[3] == 4 && l[5] == 9007199254740993LL);
    const uint8_t *b = val(g, "b")->data;
    CHECK(b[0] == 1 && b[1] == 0);
    CHECK(val(g, "r")->type.rank == 0 && isinf(*(float *)val(g, "r")->data));
    CHECK(((uint16_t *)val(g, "h")->data)[1] == dt_f32_to_f16(1.0e-3f));
    ir_graph_destroy(g);
  }
  write_text("val_shape.yaml", "smelt: 1\nparams: {l: {shape: [2, 3], value: [[1, 2, 3], [4, 5]]}}\noutputs: [l]\n");
  EXPECT_ERROR(tpath("val_shape.yaml"), NULL, "val_shape.yaml:2:48: error: param 'l': value does not match shape [2,3]");
  write_text("val_int.yaml", "smelt: 1\nparams: {l: {shape: [2], dtype: i32, value: [1, 1.5]}}\noutputs: [l]\n");
  EXPECT_ERROR(tpath("val_int.yaml"), NULL, "value 1.5 is not a valid i32");
  write_text("val_u8.yaml", "smelt: 1\nparams: {l: {shape: [1], dtype: u8, value: 256}}\noutputs: [l]\n");
  EXPECT_ERROR(tpath("val_u8.yaml"), NULL, "value 256 is not a valid u8");
  write_text("val_str.yaml", "smelt: 1\nparams: {l: {shape: [1], value: \"1\"}}\noutputs: [l]\n");
  EXPECT_ERROR(tpath("val_str.yaml"), NULL, "is not a valid f32");
}

static void test_errors(void) {
  struct {
    const char *text, *want;
  } cases[] = {
      {"", "1:1: error: empty model file"},
      {"- a\n- b\n", "1:1: error: a model must be a YAML mapping"},
      {"smelt: 2\n", "1:8: error: unknown format version 2"},
      {"name: x\n", "1:1: error: missing 'smelt: 1'"},
      {"smelt: 1\nnodez: []\n", "2:1: error: unknown key 'nodez' in the model"},
      {"smelt: 1\nsmelt: 1\n", "2:1: error: duplicate key 'smelt'"},
      {"smelt: 1\nfoo: [\n", "invalid YAML"},
      {"smelt: 1\n---\nsmelt: 1\n", "more than one YAML document"},
      {"smelt: 1\ndims: {a: -3}\n", "2:11: error: dim 'a' must be positive, got -3"},
      {"smelt: 1\ndims: {a: 99999999999999999999}\n", "does not fit in 64 bits"},
      {"smelt: 1\ndims: {a: 4294967296}\ninputs: {x: {shape: [a, a, a]}}\noutputs: [x]\n", "3:21: error: input 'x': shape: dims overflow"},
      {"smelt: 1\ninputs: {x: {shape: [b]}}\noutputs: [x]\n", "unknown dim 'b'"},
      {"smelt: 1\ninputs: {x: {shape: [2], shap: 1}}\noutputs: [x]\n", "2:26: error: unknown key 'shap' in input 'x'"},
      {"smelt: 1\ninputs: {x: {shape: [2]}}\nnodes: [{out: y, op: addd, in: [x, x]}]\noutputs: [y]\n",
       "3:22: error: node 'y': unknown op 'addd'"},
      {"smelt: 1\ninputs: {x: {shape: [2]}}\nnodes: [{out: y, op: rms_norm, in: [x, x], eps: [1, 2]}]\noutputs: [y]\n",
       "3:49: error: node 'y': attribute 'eps' of rms_norm expects float, got [1, 2]"},
      {"smelt: 1\ninputs: {x: {shape: [2]}}\nnodes: [{out: y, op: rms_norm, in: [x, x], epss: 1}]\noutputs: [y]\n",
       "3:44: error: node 'y' (rms_norm): unknown key 'epss'"},
      {"smelt: 1\ninputs: {x: {shape: [2]}}\nnodes: [{out: y, op: cast, in: [x]}]\noutputs: [y]\n",
       "3:9: error: node 'y' (cast): missing required attribute 'to'"},
      {"smelt: 1\ninputs: {x: {shape: [2]}}\nnodes: [{out: y, op: gelu, in: [x], approximate: erf}]\noutputs: [y]\n",
       "expects one of none|tanh, got erf"},
      {"smelt: 1\ninputs: {x: {shape: [2]}}\nnodes: [{out: y, op: add, in: [x]}]\noutputs: [y]\n",
       "3:31: error: node 'y' (add): takes 2 inputs, got 1"},
      {"smelt: 1\ninputs: {x: {shape: [2]}}\nnodes: [{out: y, op: add, in: [x, z]}]\noutputs: [y]\n",
       "3:35: error: node 'y' (add): undefined name 'z'"},
      {"smelt: 1\ninputs: {x: {shape: [2]}}\nnodes: [{out: x, op: neg, in: [x]}]\noutputs: [x]\n",
       "3:15: error: duplicate name 'x' (first defined at 2:10)"},
      {"smelt: 1\ninputs: {x: {shape: [2]}}\noutputs: [q]\n", "3:11: error: undefined output 'q'"},
      {"smelt: 1\ninputs: {x: {shape: [2]}}\nblocks: {b: {inputs: [x], outputs: [x]}}\n"
       "nodes: [{out: y, repeat: b, times: 0, in: [x]}]\noutputs: [y]\n",
       "4:36: error: repeat node 'y': times must be positive, got 0"},
      {"smelt: 1\ninputs: {x: {shape: [2]}}\nblocks: {b: {inputs: [x], outputs: [x], nodes: [{out: z, repeat: b, in: [x]}]}}\n"
       "nodes: [{out: y, repeat: b, in: [x]}]\noutputs: [y]\n",
       "block 'b' repeats itself"},
      {"smelt: 1\ninputs: {x: {shape: [2]}}\nblocks: {b: {inputs: [x], outputs: [z]}}\n"
       "nodes: [{out: y, repeat: b, in: [x]}]\noutputs: [y]\n",
       "3:37: error: block 'b': output 'z' is not defined in the block"},
      {"smelt: 1\ninputs: {x: {shape: [2, 3]}, w: {shape: [4, 5]}}\nnodes: [{out: y, op: matmul, in: [x, w]}]\noutputs: [y]\n",
       "3:9: error: node 'y' (matmul)"},
      {"smelt: 1\ninputs: {x: {shape: [2, 3]}, w: {shape: [4]}}\nnodes: [{out: y, op: add, in: [x, w]}]\noutputs: [y]\n",
       "3:9: error: node 'y' (add)"},
      {"smelt: 1\ninputs: {x: {shape: [2]}}\nnodes: [{out: [a, b], op: neg, in: [x]}]\noutputs: [a]\n",
       "has 1 output but 'out' names 2"},
      {"smelt: 1\ninputs: {x/y: {shape: [2]}}\noutputs: [q]\n", "must not contain '/'"},
      {"smelt: 1\ninputs: {x: {shape: [2], dtype: f31}}\noutputs: [x]\n", "unknown dtype 'f31'"},
      {"smelt: 1\ninputs: {x: {shape: [1,1,1,1,1,1,1,1,1]}}\noutputs: [x]\n", "more than the maximum of 8"},
      {"smelt: 1\n\"a\\0b\": 1\n", "a key contains a NUL character"},
      {"smelt: 1\nname: \"\\0\"\n", "contains a NUL character"},
      {"smelt: 1\ninputs: {x: &a {shape: [2]}, y: *a}\nnodes: [{out: z, op: add, in: *a}]\noutputs: [z]\n",
       "must be a name or a list of names"},
      {"smelt: 1\ninputs: {x: {shape: [2]}}\nnodes: [{out: y, op: neg, in: [*nope]}]\noutputs: [y]\n",
       "invalid YAML: found undefined alias"},
      {"smelt: 1\n\x01\x02\x80\xff\n", "2:1: error: not a valid text file"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char name[32];
    snprintf(name, sizeof name, "err%zu.yaml", i);
    const char *p = write_text(name, cases[i].text);
    char want[512];
    snprintf(want, sizeof want, "%s:%s", p, cases[i].want);
    /* messages without a location only need the substring */
    expect_error(p, NULL, strchr(cases[i].want, ':') && cases[i].want[0] >= '0' && cases[i].want[0] <= '9'
                              ? want : cases[i].want, __LINE__);
  }
  EXPECT_ERROR(tpath("no-such-file.yaml"), NULL, "no-such-file.yaml: error: cannot open");
}

static void test_safetensors(void) {
  float a[6] = {1, 2, 3, 4, 5, 6};
  int64_t b[1] = {-7};
  StEntry e[2] = {{"a", "F32", 2, {2, 3}, a, sizeof a}, {"b", "I64", 0, {0}, b, sizeof b}};
  const char *p = write_st("ok.safetensors", e, 2, "\"__metadata__\":{}");
  SafeTensors *st = NULL;
  CHECK_OK(fe_safetensors_open(p, &st));
  if (st) {
    CHECK(fe_safetensors_count(st) == 2);
    const SafeTensor *t = fe_safetensors_find(st, "a");
    CHECK(t && t->dt == DT_F32 && t->rank == 2 && t->dim[1] == 3 && t->nbytes == 24 && !strcmp(t->st_dtype, "F32"));
    if (t) {
      float x;
      memcpy(&x, (const char *)t->data + 20, 4);
      CHECK(x == 6);
    }
    t = fe_safetensors_find(st, "b");
    CHECK(t && t->dt == DT_I64 && t->rank == 0);
    CHECK(fe_safetensors_find(st, "c") == NULL);
    CHECK(fe_safetensors_at(st, 0) && !strcmp(fe_safetensors_at(st, 0)->name, "a"));
    CHECK(fe_safetensors_at(st, 2) == NULL);
    fe_safetensors_close(st);
  }
  /* each corruption is refused with a message naming the file */
  struct {
    const char *header;
    size_t data_bytes;
    const char *want;
  } bad[] = {
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, "header is not valid JSON"},
      {"[1,2]", 0, "header is not a JSON object"},
      {"{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype 'F33'"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 12, "span 12 bytes but its dtype and shape need 8"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "run past the end of the data"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "not a non-negative integer"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
       12, "overlap"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
       8, "duplicate"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, "overflows"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "data_offsets must be"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"offsets\":[0,8]}}", 8, "unknown key 'offsets'"},
      {"{\"__metadata__\":[]}", 0, "__metadata__ is not a JSON object"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    size_t hl = strlen(bad[i].header), total = 8 + hl + bad[i].data_bytes;
    unsigned char *buf = calloc(1, total);
    for (int k = 0; k < 8; k++) buf[k] = (unsigned char)((uint64_t)hl >> (8 * k));
    memcpy(buf + 8, bad[i].header, hl);
    char name[32];
    snprintf(name, sizeof name, "bad%zu.safetensors", i);
    p = write_bytes(name, buf, total);
    free(buf);
    smelt_status s = fe_safetensors_open(p, &st);
    CHECK(s != NULL && st == NULL);
    if (s) {
      char want[300];
      snprintf(want, sizeof want, "%s: error: ", p);
      if (strncmp(st_message(s), want, strlen(want)) || !strstr(st_message(s), bad[i].want)) {
        fprintf(stderr, "safetensors case %zu: got \"%s\", want \"%s\"\n", i, st_message(s), bad[i].want);
        check_failures++;
      }
      st_free(s);
    }
  }
  /* length field larger than the file, and a file shorter than 8 bytes */
  unsigned char big[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
  p = write_bytes("big.safetensors", big, sizeof big);
  smelt_status s = fe_safetensors_open(p, &st);
  CHECK(s && strstr(st_message(s), "exceeds the file size"));
  st_free(s);
  p = write_bytes("short.safetensors", big, 5);
  s = fe_safetensors_open(p, &st);
  CHECK(s && strstr(st_message(s), "too short"));
  st_free(s);
  s = fe_safetensors_open(tpath("absent.safetensors"), &st);
  CHECK(s && st_code(s) == ST_IO && strstr(st_message(s), "absent.safetensors: error: cannot open"));
  st_free(s);
}

static void test_npy(void) {
  DType dts[] = {DT_F32, DT_F16, DT_F64, DT_I64, DT_I32, DT_I8, DT_U8, DT_BOOL};
  for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
    TensorType t = {.dt = dts[i], .rank = 3, .dim = {2, 1, 3}};
    unsigned char data[6 * 8];
    for (int k = 0; k < 6; k++) dt_store(dts[i], data, (size_t)k, k % 2 ? k : 0);
    const char *p = tpath("rt.npy");
    remember(p);
    CHECK_OK(fe_npy_write(p, &t, data));
    TensorType u;
    void *back = NULL;
    CHECK_OK(fe_npy_read(p, &u, &back));
    CHECK(back && ir_type_equal(&t, &u) && !memcmp(back, data, 6 * dt_size(dts[i])));
    free(back);
  }
  /* scalar and 1-d shapes, and data aligned at 64 bytes as numpy writes it */
  TensorType s0 = {.dt = DT_F32, .rank = 0, .dim = {0}}, s1 = {.dt = DT_F32, .rank = 1, .dim = {5}};
  float f[5] = {1, 2, 3, 4, 5};
  const char *p = tpath("s.npy");
  CHECK_OK(fe_npy_write(p, &s0, f));
  FILE *fh = fopen(p, "rb");
  char head[129] = {0};
  if (fh) {
    CHECK(fread(head, 1, 128, fh) == 128); /* 56-byte dict: padded to 128 */
    fclose(fh);
  }
  CHECK(strstr(head + 10, "'shape': ()") != NULL && head[127] == '\n');
  CHECK_OK(fe_npy_write(p, &s1, f));
  TensorType u;
  void *back = NULL;
  CHECK_OK(fe_npy_read(p, &u, &back));
  CHECK(back && u.rank == 1 && u.dim[0] == 5 && ((float *)back)[4] == 5);
  free(back);
  /* bf16 is written as f32 (numpy has no bfloat16) */
  TensorType tb = {.dt = DT_BF16, .rank = 1, .dim = {2}};
  uint16_t bf[2] = {dt_f32_to_bf16(1.5f), dt_f32_to_bf16(-3.0f)};
  CHECK_OK(fe_npy_write(p, &tb, bf));
  CHECK_OK(fe_npy_read(p, &u, &back));
  CHECK(back && u.dt == DT_F32 && ((float *)back)[1] == -3.0f);
  free(back);
  /* hand-written headers: v2.0, fortran order, big endian, truncated data */
  struct {
    int major;
    const char *header;
    size_t data;
    const char *want;
  } cases[] = {
      {2, "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }\n", 8, NULL},
      {1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }\n", 8, "Fortran-order"},
      {1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }\n", 8, "big-endian"},
      {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", 4, "truncated"},
      {1, "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }\n", 16, "not supported"},
      {1, "{'descr': '<f4', 'shape': (2,), }\n", 8, "lacks one of"},
      {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}\n", 8, "unexpected or repeated key"},
      {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }\n", 8, "'shape' is not a tuple"},
      {7, "{}", 0, "unsupported .npy format version 7"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t hl = strlen(cases[i].header), pre = cases[i].major == 1 || cases[i].major == 7 ? 10 : 12;
    size_t total = pre + hl + cases[i].data;
    unsigned char *buf = calloc(1, total);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)cases[i].major;
    buf[8] = (unsigned char)hl;
    memcpy(buf + pre, cases[i].header, hl);
    p = write_bytes("h.npy", buf, total);
    free(buf);
    back = NULL;
    smelt_status st = fe_npy_read(p, &u, &back);
    if (!cases[i].want) {
      CHECK(!st && u.dt == DT_I32 && u.rank == 1 && u.dim[0] == 2);
    } else {
      CHECK(st && strstr(st_message(st), cases[i].want) && strstr(st_message(st), "h.npy: error: "));
      if (st && !strstr(st_message(st), cases[i].want)) fprintf(stderr, "npy case %zu: %s\n", i, st_message(st));
      CHECK(back == NULL);
    }
    st_free(st);
    free(back);
  }
  /* One shape rule on both sides (issue 16 #9): every shape here is written
   * iff it is read, empty tensors with huge dims included.  The reader took
   * [2^61, 0] of u8, which the writer refuses. */
  const int64_t big = (int64_t)1 << 61, half = (int64_t)1 << 30;
  TensorType shapes[] = {
      {.dt = DT_U8, .rank = 2, .dim = {big, 0}},      {.dt = DT_U8, .rank = 2, .dim = {0, big}},        {.dt = DT_F32, .rank = 3, .dim = {half, half, 0}},
      {.dt = DT_F32, .rank = 3, .dim = {half / 2, half, 0}}, {.dt = DT_I64, .rank = 2, .dim = {(int64_t)1 << 59, 0}}, {.dt = DT_F32, .rank = 1, .dim = {0}},
      {.dt = DT_BOOL, .rank = 3, .dim = {big, big, 0}},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const TensorType *t = &shapes[i];
    p = tpath("shape.npy");
    smelt_status ws = fe_npy_write(p, t, "");
    /* the same header by hand, for the shapes the writer refuses */
    char hdr[256], dims[200] = "";
    for (int d = 0; d < t->rank; d++)
      snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%lld, ", (long long)t->dim[d]);
    const char *descr = t->dt == DT_U8 ? "|u1" : t->dt == DT_BOOL ? "|b1" : t->dt == DT_I64 ? "<i8" : "<f4";
    int hl = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }\n", descr, dims);
    unsigned char buf[266];
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)hl;
    buf[9] = 0;
    memcpy(buf + 10, hdr, (size_t)hl);
    p = write_bytes("shape_hand.npy", buf, 10 + (size_t)hl);
    back = NULL;
    smelt_status rs = fe_npy_read(p, &u, &back);
    CHECK(!ws == !rs);
    if (!ws != !rs)
      fprintf(stderr, "npy shape %zu (%s): writer %s, reader %s\n", i, dims, ws ? st_message(ws) : "ok",
              rs ? st_message(rs) : "ok");
    if (!rs) CHECK(ir_type_equal(&u, t));
    /* the refused shapes here hold no elements (a dim is 0) but have a
     * prefix too large to index; ir_type_numel would overflow on them */
    bool has_zero = false;
    for (int d = 0; d < t->rank; d++) has_zero |= t->dim[d] == 0;
    CHECK(!rs || has_zero);
    if (rs) CHECK(strstr(st_message(rs), "too large") != NULL);
    st_free(ws);
    st_free(rs);
    free(back);
  }
}

/* Every prefix of a valid model, and byte mutations of it, must load or
 * fail cleanly; sanitizers catch the rest. */
static void test_fuzz(void) {
  size_t n = strlen(model_text);
  int failures_before = check_failures, ok = 0, errors = 0;
  for (size_t len = 0; len <= n; len++) {
    const char *p = write_bytes("fuzz.yaml", model_text, len);
    Graph *g = NULL;
    smelt_status st = fe_load_yaml(p, NULL, &g);
    if (st) {
      errors++;
      CHECK(g == NULL && strncmp(st_message(st), p, strlen(p)) == 0);
    } else {
      ok++;
    }
    st_free(st);
    ir_graph_destroy(g);
  }
  CHECK(ok >= 1 && errors > 100);
  uint64_t state = 12345;
  const char alphabet[] = "{}[]:,-&*!|>'\"#\n \t0123456789abxyz.\x00\xff\xc3";
  char *buf = malloc(n);
  for (int iter = 0; iter < 400; iter++) {
    memcpy(buf, model_text, n);
    for (int k = 0; k < 1 + iter % 4; k++) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      size_t pos = (size_t)(state >> 33) % n;
      buf[pos] = alphabet[(state >> 20) % (sizeof alphabet - 1)];
    }
    const char *p = write_bytes("fuzz.yaml", buf, n);
    Graph *g = NULL;
    smelt_status st = fe_load_yaml(p, NULL, &g);
    CHECK((st == NULL) == (g != NULL));
    st_free(st);
    ir_graph_destroy(g);
  }
  free(buf);
  CHECK(check_failures == failures_before);
}

/* A repeat node's `out` named as a model output is the output's name
 * (SPEC §2: never the internal alias "b.1/y"); a state block declares one
 * state per copy. */
static void test_repeat_output_and_state(void) {
  const char *p = write_text("rep.yaml",
                             "smelt: 1\n"
                             "inputs: {x: {shape: [4]}, pos: {shape: [1], dtype: i32}}\n"
                             "blocks:\n"
                             "  b:\n"
                             "    inputs: [x, pos]\n"
                             "    state: {c: {shape: [8, 4]}}\n"
                             "    nodes:\n"
                             "      - {out: x2, op: reshape, in: [x], shape: [1, 4]}\n"
                             "      - {out: c2, op: scatter, in: [c, pos, x2]}\n"
                             "      - {out: y, op: sum, in: [c2], axes: [0]}\n"
                             "    outputs: [y]\n"
                             "nodes:\n"
                             "  - {out: h, repeat: b, times: 2, in: [x, pos]}\n"
                             "outputs: [h]\n");
  Graph *g = load_ok(p, NULL);
  if (!g) return;
  CHECK(g->noutputs == 1 && !strcmp(g->val[g->outputs[0]].name, "h"));
  CHECK(ir_find_value(g, "b.1/y") < 0 && ir_find_value(g, "b.0/y") >= 0);
  CHECK(g->nstates == 2 && !strcmp(g->val[g->states[1]].name, "b.1/c") && g->val[g->states[0]].state);
  CHECK(g->ninputs == 2); /* states are not inputs */
  int up = ir_state_update(g, g->states[1]);
  CHECK(up >= 0 && !strcmp(g->val[g->node[up].out[0]].name, "b.1/c2"));
  ir_graph_destroy(g);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/smelt_test_frontend_XXXXXX");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 2;
  }
  test_basic();
  test_dims_override();
  test_repeat_twice_and_from();
  test_repeat_output_and_state();
  test_nested_and_multi_output();
  test_init();
  test_values();
  test_errors();
  test_safetensors();
  test_npy();
  test_fuzz();
  remember(tpath("rt.npy"));
  remember(tpath("s.npy"));
  for (int i = 0; i < nmade; i++) {
    unlink(made[i]);
    free(made[i]);
  }
  rmdir(tmpdir);
  return check_done("test_frontend");
}
