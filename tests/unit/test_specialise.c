/* Specialisations through the public C API: tiny_llama compiled with
 * dims "seq=1,4,16" gives one bundle of three specialisations; one session
 * runs each, chosen by the shapes bound (going back and forth between
 * them), and every result is compared with the reference interpreter run
 * on the model loaded from YAML with that seq, on the same inputs.  Then
 * the refusals: a shape no specialisation takes (the message names the
 * model, the input, the shape and what the bundle has), bindings that fit
 * different specialisations, nothing bound, a bad index of a bundle whose
 * checksums are right (entries missing, a wrong signature, a missing
 * section, two alike, a bad header), bad dims at compile time, and
 * specialisations that could not be told apart.  A bundle of one keeps the
 * plain layout (no index) and is chosen at session creation.
 *
 * tiny_llama needs generated weights; without them the test is skipped
 * with a message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frontend/frontend.h"
#include "include/smelt.h"
#include "ir/interp.h"
#include "format/bundle.h"
#include "compiler/driver.h"
#include "tests/unit/check.h"

#define MODEL "examples/tiny_llama.yaml"
#define HIDDEN 64

static void expect_error(smelt_status st, int code, const char *words) {
  CHECK(st != NULL);
  if (!st) return;
  CHECK(smelt_status_code(st) == code);
  if (!strstr(smelt_status_message(st), words)) {
    fprintf(stderr, "message '%s' lacks '%s'\n", smelt_status_message(st), words);
    CHECK(0);
  }
  smelt_status_free(st);
}

/* x: seq x HIDDEN floats in [-1, 1) from seed; pos: 0..seq-1. */
static void make_inputs(int seq, uint64_t seed, float *x, int32_t *pos) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int i = 0; i < seq * HIDDEN; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (float)((double)(s >> 11) * 0x1.0p-52 - 1.0);
  }
  for (int i = 0; i < seq; i++) pos[i] = i;
}

/* y from the reference interpreter on the unoptimised model with that seq. */
static float *reference(int seq, const float *x, const int32_t *pos) {
  FeDim dim = {.name = "seq", .value = seq};
  FeOptions fo = {.dims = &dim, .ndims = 1, .dtype = DT_INVALID};
  Graph *g = NULL;
  Interp *it = NULL;
  float *y = NULL;
  CHECK_OK(fe_load_yaml(MODEL, &fo, &g));
  if (!g) return NULL;
  CHECK_OK(ir_interp_create(g, &it));
  if (it) {
    CHECK_OK(ir_interp_set_input(it, ir_find_value(g, "x"), x));
    CHECK_OK(ir_interp_set_input(it, ir_find_value(g, "pos"), pos));
    CHECK_OK(ir_interp_run(it));
    const void *out = ir_interp_value(it, g->outputs[0]);
    y = malloc((size_t)seq * HIDDEN * sizeof *y);
    if (out && y) memcpy(y, out, (size_t)seq * HIDDEN * sizeof *y);
    ir_interp_destroy(it);
  }
  ir_graph_destroy(g);
  return y;
}

/* Runs seq through the session by shape; compares with the reference. */
static void run_one(smelt_session *s, int seq, int want_spec, uint64_t seed) {
  float *x = malloc((size_t)seq * HIDDEN * sizeof *x), *y = calloc((size_t)seq * HIDDEN, sizeof *y);
  int32_t *pos = malloc((size_t)seq * sizeof *pos);
  make_inputs(seq, seed, x, pos);
  int64_t xd[2] = {seq, HIDDEN}, pd[1] = {seq};
  CHECK_OK(smelt_session_bind_input_shaped(s, "x", x, 2, xd, (size_t)seq * HIDDEN * 4));
  CHECK_OK(smelt_session_bind_input_shaped(s, "pos", pos, 1, pd, (size_t)seq * 4));
  CHECK_OK(smelt_session_bind_output(s, "y", y, (size_t)seq * HIDDEN * 4));
  CHECK_OK(smelt_session_run(s));
  CHECK(smelt_session_specialisation(s) == want_spec);
  smelt_tensor_info ti;
  smelt_session_input_info(s, 0, &ti);
  CHECK(ti.rank == 2 && ti.dims[0] == seq && ti.dims[1] == HIDDEN);
  float *ref = reference(seq, x, pos);
  double num = 0, den = 0;
  for (int i = 0; ref && i < seq * HIDDEN; i++) {
    num += ((double)y[i] - ref[i]) * ((double)y[i] - ref[i]);
    den += (double)ref[i] * ref[i];
  }
  double rel = den > 0 ? sqrt(num / den) : INFINITY;
  if (!(rel < 1e-5)) fprintf(stderr, "seq=%d: relative L2 error %g\n", seq, rel);
  CHECK(ref && rel < 1e-5);
  free(ref);
  free(x);
  free(y);
  free(pos);
}

static void test_runs(smelt_bundle *b) {
  CHECK(smelt_bundle_num_specialisations(b) == 3);
  CHECK(strcmp(smelt_bundle_specialisation_dims(b, 0), "seq=1") == 0);
  CHECK(strcmp(smelt_bundle_specialisation_dims(b, 1), "seq=4") == 0);
  CHECK(strcmp(smelt_bundle_specialisation_dims(b, 2), "seq=16") == 0);
  CHECK(smelt_bundle_specialisation_dims(b, 3) == NULL);
  smelt_session_options o = {.threads = 2};
  smelt_session *s;
  CHECK_OK(smelt_session_create(b, "cpu", &o, &s));
  if (!s) return;
  CHECK(smelt_session_specialisation(s) == -1);
  smelt_tensor_info ti;
  smelt_session_input_info(s, 0, &ti);
  CHECK(strcmp(ti.name, "x") == 0 && ti.rank == 2 && ti.dims[0] == -1 && ti.dims[1] == HIDDEN);
  /* nothing bound: every specialisation fits, none is chosen */
  expect_error(smelt_session_run(s), SMELT_INVALID_INPUT, "fit 3 specialisations");
  /* back and forth: each specialisation's state is made once and kept */
  run_one(s, 16, 2, 1);
  run_one(s, 1, 0, 2);
  run_one(s, 4, 1, 3);
  run_one(s, 16, 2, 4);

  static float x[16 * HIDDEN], y[16 * HIDDEN];
  static int32_t pos[16];
  int64_t bad[2] = {3, HIDDEN}, x16[2] = {16, HIDDEN}, p4[1] = {4};
  expect_error(smelt_session_bind_input_shaped(s, "x", x, 2, bad, 3 * HIDDEN * 4), SMELT_INVALID_INPUT,
               "no specialisation of model 'tiny_llama' takes input 'x' with shape [3,64]; the bundle has seq=1,4,16");
  expect_error(smelt_session_bind_input(s, "x", x, 3 * HIDDEN * 4), SMELT_INVALID_INPUT,
               "takes input 'x' of 768 bytes; the bundle has seq=1,4,16");
  expect_error(smelt_session_bind_input_shaped(s, "x", x, 2, x16, 100), SMELT_INVALID_INPUT, "x");
  expect_error(smelt_session_bind_input_shaped(s, "nope", x, 2, x16, 16 * HIDDEN * 4), SMELT_INVALID_INPUT,
               "no input named 'nope'");
  /* each binding fits a specialisation, not the same one */
  CHECK_OK(smelt_session_bind_input_shaped(s, "x", x, 2, x16, 16 * HIDDEN * 4));
  CHECK_OK(smelt_session_bind_input_shaped(s, "pos", pos, 1, p4, 4 * 4));
  CHECK_OK(smelt_session_bind_output(s, "y", y, 16 * HIDDEN * 4));
  expect_error(smelt_session_run(s), SMELT_INVALID_INPUT, "together");
  /* chosen explicitly: bindings are checked against it alone */
  expect_error(smelt_session_select(s, 3), SMELT_INVALID_INPUT, "specialisation 3");
  CHECK_OK(smelt_session_select(s, 1));
  CHECK(smelt_session_specialisation(s) == 1);
  expect_error(smelt_session_bind_input_shaped(s, "x", x, 2, x16, 16 * HIDDEN * 4), SMELT_INVALID_INPUT,
               "is f32[4,64]");
  expect_error(smelt_session_run(s), SMELT_INVALID_INPUT, "f32[4,64]"); /* x is still bound for seq=16 */
  CHECK_OK(smelt_session_select(s, -1));
  smelt_session_destroy(s);
}

/* The bundle's sections rewritten by edit (which may change the index
 * text, drop or rename sections), with right checksums. */
typedef bool (*EditFn)(const FmtSection *sec, char *name, char *data, size_t *len, size_t cap);

static smelt_status rewrite(const void *img, size_t n, EditFn edit, smelt_bundle **out) {
  FmtFile *f;
  CHECK_OK(fmt_file_open_memory(img, n, "good", &f));
  FmtWriter *w;
  CHECK_OK(fmt_writer_create(&w));
  for (int i = 0; f && w && i < fmt_file_section_count(f); i++) {
    const FmtSection *sec = fmt_file_section_at(f, i);
    size_t cap = sec->size + 256, len = sec->size;
    char *data = malloc(cap), name[FMT_SECTION_NAME_BYTES];
    memcpy(data, sec->data, sec->size);
    snprintf(name, sizeof name, "%s", sec->name);
    if (edit(sec, name, data, &len, cap)) CHECK_OK(fmt_writer_add(w, sec->kind, name, data, len));
    free(data);
  }
  void *buf = NULL;
  size_t len = 0;
  CHECK_OK(fmt_writer_to_memory(w, &buf, &len));
  fmt_writer_destroy(w);
  fmt_file_close(f);
  smelt_status st = smelt_bundle_open_memory(buf, len, out);
  free(buf);
  return st;
}

/* Replaces the first occurrence of a by b in an index payload. */
static void replace(char *data, size_t *len, size_t cap, const char *a, const char *b) {
  data[*len < cap ? *len : cap - 1] = 0;
  char *at = strstr(data, a);
  CHECK(at != NULL);
  if (!at || *len - strlen(a) + strlen(b) >= cap) return;
  memmove(at + strlen(b), at + strlen(a), *len - (size_t)(at - data) - strlen(a));
  memcpy(at, b, strlen(b));
  *len = *len - strlen(a) + strlen(b);
}

static bool keep(const FmtSection *sec, char *name, char *data, size_t *len, size_t cap) {
  (void)sec, (void)name, (void)data, (void)len, (void)cap;
  return true;
}
static bool count_four(const FmtSection *sec, char *name, char *data, size_t *len, size_t cap) {
  (void)name;
  if (sec->kind == FMT_SEC_SPECIALISATION) replace(data, len, cap, " 1 3\n", " 1 4\n");
  return true;
}
static bool wrong_signature(const FmtSection *sec, char *name, char *data, size_t *len, size_t cap) {
  (void)name;
  if (sec->kind == FMT_SEC_SPECIALISATION) replace(data, len, cap, "x:f32[4,64]", "x:f32[5,64]");
  return true;
}
static bool no_graph(const FmtSection *sec, char *name, char *data, size_t *len, size_t cap) {
  (void)data, (void)len, (void)cap;
  return !(sec->kind == FMT_SEC_GRAPH && strcmp(name, "s2/") == 0);
}
static bool bad_header(const FmtSection *sec, char *name, char *data, size_t *len, size_t cap) {
  (void)name;
  if (sec->kind == FMT_SEC_SPECIALISATION) replace(data, len, cap, "smelt-specialisations 1", "smelt-specialisations x");
  return true;
}
/* s1 becomes a copy of s0 under s1's name: two specialisations alike */
static bool twins(const FmtSection *sec, char *name, char *data, size_t *len, size_t cap) {
  if (sec->kind == FMT_SEC_SPECIALISATION) {
    replace(data, len, cap, "x:f32[4,64] pos:i32[4]", "x:f32[1,64] pos:i32[1]");
    return true;
  }
  if (strncmp(name, "s1/", 3) == 0) return false;
  return true;
}

static void test_index(const char *path) {
  FILE *f = fopen(path, "rb");
  CHECK(f != NULL);
  if (!f) return;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *img = malloc((size_t)n);
  CHECK(fread(img, 1, (size_t)n, f) == (size_t)n);
  fclose(f);
  smelt_bundle *b = NULL;
  CHECK_OK(rewrite(img, (size_t)n, keep, &b));
  smelt_bundle_close(b);
  expect_error(rewrite(img, (size_t)n, count_four, &b), SMELT_INVALID_INPUT, "3 entries, the header says 4");
  expect_error(rewrite(img, (size_t)n, wrong_signature, &b), SMELT_INVALID_INPUT, "the index says x:f32[5,64]");
  expect_error(rewrite(img, (size_t)n, no_graph, &b), SMELT_INVALID_INPUT, "specialisation s2/ (seq=16): no graph");
  expect_error(rewrite(img, (size_t)n, bad_header, &b), SMELT_INVALID_INPUT, "bad header");
  /* twins: s1's sections are dropped, then s0's copied under s1/ */
  FmtFile *rf;
  CHECK_OK(fmt_file_open_memory(img, (size_t)n, "good", &rf));
  FmtWriter *w;
  CHECK_OK(fmt_writer_create(&w));
  for (int i = 0; rf && w && i < fmt_file_section_count(rf); i++) {
    const FmtSection *sec = fmt_file_section_at(rf, i);
    char name[FMT_SECTION_NAME_BYTES];
    size_t len = sec->size, cap = sec->size + 256;
    char *data = malloc(cap);
    memcpy(data, sec->data, sec->size);
    snprintf(name, sizeof name, "%s", sec->name);
    if (twins(sec, name, data, &len, cap)) CHECK_OK(fmt_writer_add(w, sec->kind, name, data, len));
    if (strncmp(sec->name, "s0/", 3) == 0) {
      name[1] = '1';
      CHECK_OK(fmt_writer_add(w, sec->kind, name, sec->data, sec->size));
    }
    free(data);
  }
  void *buf = NULL;
  size_t len = 0;
  CHECK_OK(fmt_writer_to_memory(w, &buf, &len));
  expect_error(smelt_bundle_open_memory(buf, len, &b), SMELT_INVALID_INPUT, "are not distinct");
  free(buf);
  fmt_writer_destroy(w);
  fmt_file_close(rf);
  free(img);
}

static void test_compile_refusals(void) {
  smelt_compile_options o = {.dims = "seq=1,2,3,4,5;layers=1,2,3,4"};
  expect_error(smelt_compile(MODEL, &o, "/tmp/never_spec.smelt"), SMELT_INVALID_INPUT, "more than 16 specialisations");
  o = (smelt_compile_options){.dims = "seq=4,4"};
  expect_error(smelt_compile(MODEL, &o, "/tmp/never_spec.smelt"), SMELT_INVALID_INPUT, "listed twice");
  o = (smelt_compile_options){.dims = "seq=4,x"};
  expect_error(smelt_compile(MODEL, &o, "/tmp/never_spec.smelt"), SMELT_INVALID_INPUT, "not an integer");
  /* layers changes no input shape: a run could not choose */
  o = (smelt_compile_options){.dims = "layers=1,2"};
  expect_error(smelt_compile(MODEL, &o, "/tmp/never_spec.smelt"), SMELT_INVALID_INPUT, "take the same inputs");
  CHECK(access("/tmp/never_spec.smelt", F_OK) != 0);
}

/* One value per dim: the plain layout, chosen at creation. */
static void test_single(const char *path) {
  smelt_compile_options o = {.dims = "seq=4"};
  CHECK_OK(smelt_compile(MODEL, &o, path));
  smelt_bundle *b = NULL;
  CHECK_OK(smelt_bundle_open(path, &b));
  if (!b) return;
  CHECK(smelt_bundle_num_specialisations(b) == 1);
  CHECK(strcmp(smelt_bundle_specialisation_dims(b, 0), "") == 0);
  const void *p;
  size_t n;
  CHECK(!fmt_file_find(rt_bundle_file(b), FMT_SEC_SPECIALISATION, NULL, &p, &n));
  CHECK(fmt_file_find(rt_bundle_file(b), FMT_SEC_GRAPH, "", &p, &n));
  int i = -1;
  CHECK_OK(rt_bundle_find_spec(b, "seq=4", &i));
  CHECK(i == 0);
  expect_error(rt_bundle_find_spec(b, "seq=16", &i), SMELT_INVALID_INPUT, "not compiled for seq=16");
  smelt_session *s;
  CHECK_OK(smelt_session_create(b, "cpu", NULL, &s));
  CHECK(s && smelt_session_specialisation(s) == 0);
  if (s) run_one(s, 4, 0, 9);
  smelt_session_destroy(s);
  smelt_bundle_close(b);
}

int main(void) {
#ifndef SMELT_HAVE_LLVM
  printf("test_specialise: skipped (built without LLVM)\n");
  return 0;
#endif
  if (access("examples/tiny_llama.safetensors", R_OK) != 0) {
    printf("test_specialise: skipped (examples/tiny_llama.safetensors missing: run examples/gen_weights.py)\n");
    return 0;
  }
  char path[64], single[64];
  snprintf(path, sizeof path, "/tmp/test_specialise_%d.smelt", (int)getpid());
  snprintf(single, sizeof single, "/tmp/test_specialise_one_%d.smelt", (int)getpid());
  smelt_compile_options o = {.dims = "seq=1,4,16", .threads = 2};
  CHECK_OK(smelt_compile(MODEL, &o, path));
  smelt_bundle *b = NULL;
  CHECK_OK(smelt_bundle_open(path, &b));
  if (b) {
    test_runs(b);
    int i = -1;
    CHECK_OK(rt_bundle_find_spec(b, "seq=16", &i));
    CHECK(i == 2);
    expect_error(rt_bundle_find_spec(b, "seq=3", &i), SMELT_INVALID_INPUT, "no specialisation has seq=3");
    smelt_bundle_close(b);
  }
  test_index(path);
  test_compile_refusals();
  test_single(single);
  unlink(path);
  unlink(single);
  return check_done("test_specialise");
}
