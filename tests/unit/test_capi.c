/* The public C API end to end: compile example models to bundles with
 * smelt_compile, open them, run two sessions on two threads at once on
 * different inputs and compare every output with the reference interpreter
 * run on the bundle's graph; the same inputs on 1 and 3 threads must give
 * identical bits.  Then the API's refusals: unknown devices, wrong sizes,
 * unknown names, unbound tensors, corrupted files.  And the checkers: a
 * correct bundle passes sc_check_outputs and sc_check_groups, and a bundle
 * with a memory plan that puts two live tensors on the same bytes is caught
 * by sc_check_groups, which names the overwritten value.
 *
 * Models whose files are missing (tiny_llama needs generated weights) are
 * skipped with a message, not failed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frontend/frontend.h"
#include "include/smelt.h"
#include "ir/interp.h"
#include "compiler/check.h"
#include "compiler/driver.h"
#include "tests/unit/check.h"

/* Deterministic inputs: floats in [-1, 1) from a seeded LCG; integers
 * 0, 1, 2, ... along the last axis (valid positions/indices). */
static void *make_tensor(const smelt_tensor_info *ti, uint64_t seed, size_t *out_bytes) {
  TensorType t = {.dt = (DType)ti->dtype, .rank = ti->rank};
  for (int i = 0; i < ti->rank; i++) t.dim[i] = ti->dims[i];
  size_t n = (size_t)ir_type_numel(&t), bytes = ir_type_bytes(&t);
  void *p = calloc(bytes ? bytes : 1, 1);
  int64_t last = t.rank && t.dim[t.rank - 1] ? t.dim[t.rank - 1] : 1;
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    double v = dt_is_float(t.dt) ? (double)(s >> 11) * 0x1.0p-52 - 1.0 : (double)((int64_t)i % last);
    dt_store(t.dt, p, i, v);
  }
  *out_bytes = bytes;
  return p;
}

typedef struct {
  void **in, **out;
  size_t *in_bytes, *out_bytes;
  int nin, nout;
} Tensors;

static void tensors_free(Tensors *t) {
  for (int i = 0; i < t->nin; i++) free(t->in[i]);
  for (int i = 0; i < t->nout; i++) free(t->out[i]);
  free(t->in);
  free(t->out);
  free(t->in_bytes);
  free(t->out_bytes);
}

/* Inputs from seed, zeroed outputs, all bound to s. */
static void bind_tensors(smelt_session *s, uint64_t seed, Tensors *t) {
  t->nin = smelt_session_num_inputs(s);
  t->nout = smelt_session_num_outputs(s);
  t->in = calloc((size_t)t->nin + 1, sizeof *t->in);
  t->out = calloc((size_t)t->nout + 1, sizeof *t->out);
  t->in_bytes = calloc((size_t)t->nin + 1, sizeof *t->in_bytes);
  t->out_bytes = calloc((size_t)t->nout + 1, sizeof *t->out_bytes);
  for (int i = 0; i < t->nin; i++) {
    smelt_tensor_info ti;
    smelt_session_input_info(s, i, &ti);
    t->in[i] = make_tensor(&ti, seed + (uint64_t)i * 7919, &t->in_bytes[i]);
    CHECK_OK(smelt_session_bind_input(s, ti.name, t->in[i], t->in_bytes[i]));
  }
  for (int i = 0; i < t->nout; i++) {
    smelt_tensor_info ti;
    smelt_session_output_info(s, i, &ti);
    t->out[i] = make_tensor(&ti, 0, &t->out_bytes[i]);
    memset(t->out[i], 0xff, t->out_bytes[i]); /* NaN/garbage until written */
    CHECK_OK(smelt_session_bind_output(s, ti.name, t->out[i], t->out_bytes[i]));
  }
}

/* The session's outputs against the reference interpreter on the bundle's
 * graph with the same inputs; returns the number of failing outputs. */
static int compare_with_reference(const smelt_bundle *b, const Tensors *t, const char *what) {
  const Graph *g = rt_bundle_graph(b);
  Interp *it;
  CHECK_OK(ir_interp_create(g, &it));
  for (int i = 0; i < g->ninputs; i++) CHECK_OK(ir_interp_set_input(it, g->inputs[i], t->in[i]));
  CHECK_OK(ir_interp_run(it));
  int bad = 0;
  for (int i = 0; i < g->noutputs; i++) {
    const Value *v = &g->val[g->outputs[i]];
    const void *ref = ir_interp_value(it, g->outputs[i]);
    if (!ref) {
      bad++;
      continue;
    }
    ScDiff d;
    sc_diff(v->type.dt, t->out[i], ref, (size_t)ir_type_numel(&v->type), &d);
    if (!d.pass) {
      fprintf(stderr, "%s: output '%s': max abs %.3g, rel L2 %.3g, cosine %.6f, %lld non-finite\n", what, v->name,
              d.max_abs, d.rel_l2, d.cosine, (long long)d.nonfinite);
      bad++;
    }
  }
  ir_interp_destroy(it);
  return bad;
}

typedef struct {
  smelt_bundle *b;
  uint64_t seed;
  const char *model;
  int failures;
} Worker;

/* One thread: its own session, several runs on its own inputs. */
static void *worker(void *arg) {
  Worker *w = arg;
  smelt_session_options o = {.threads = 2};
  smelt_session *s;
  smelt_status st = smelt_session_create(w->b, "cpu", &o, &s);
  if (st) {
    fprintf(stderr, "%s: %s\n", w->model, smelt_status_message(st));
    smelt_status_free(st);
    w->failures++;
    return NULL;
  }
  Tensors t = {0};
  bind_tensors(s, w->seed, &t);
  for (int rep = 0; rep < 3; rep++) {
    for (int i = 0; i < t.nout; i++) memset(t.out[i], 0xff, t.out_bytes[i]);
    st = smelt_session_run(s);
    if (st) {
      fprintf(stderr, "%s: run: %s\n", w->model, smelt_status_message(st));
      smelt_status_free(st);
      w->failures++;
      break;
    }
    w->failures += compare_with_reference(w->b, &t, w->model);
  }
  tensors_free(&t);
  smelt_session_destroy(s);
  return NULL;
}

static void test_concurrent(smelt_bundle *b, const char *model) {
  Worker w[2] = {{.b = b, .seed = 1, .model = model}, {.b = b, .seed = 2, .model = model}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) CHECK(pthread_create(&th[i], NULL, worker, &w[i]) == 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  CHECK(w[0].failures == 0);
  CHECK(w[1].failures == 0);
}

/* Splitting work over threads must not change a single bit. */
static void test_thread_counts_agree(smelt_bundle *b) {
  smelt_session *s1, *s3;
  smelt_session_options o1 = {.threads = 1}, o3 = {.threads = 3};
  CHECK_OK(smelt_session_create(b, "cpu", &o1, &s1));
  CHECK_OK(smelt_session_create(b, NULL, &o3, &s3));
  Tensors t1 = {0}, t3 = {0};
  bind_tensors(s1, 5, &t1);
  bind_tensors(s3, 5, &t3);
  CHECK_OK(smelt_session_run(s1));
  /* on the CPU a queued run is a run: done when enqueue returns */
  CHECK_OK(smelt_session_enqueue(s3));
  CHECK_OK(smelt_session_synchronize(s3));
  for (int i = 0; i < t1.nout; i++) CHECK(memcmp(t1.out[i], t3.out[i], t1.out_bytes[i]) == 0);
  tensors_free(&t1);
  tensors_free(&t3);
  smelt_session_destroy(s1);
  smelt_session_destroy(s3);
}

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

static void test_refusals(smelt_bundle *b) {
  smelt_session *s = (smelt_session *)1;
  expect_error(smelt_session_create(b, "tpu", NULL, &s), SMELT_UNSUPPORTED, "'tpu'");
  CHECK(s == NULL);
  expect_error(smelt_session_create(b, "cuda:0", NULL, &s), SMELT_UNSUPPORTED, "CUDA");
  smelt_session_options bad = {.threads = -1};
  expect_error(smelt_session_create(b, "cpu", &bad, &s), SMELT_INVALID_INPUT, "threads");

  CHECK_OK(smelt_session_create(b, "cpu", NULL, &s));
  if (!s) return;
  smelt_tensor_info in, out;
  smelt_session_input_info(s, 0, &in);
  smelt_session_output_info(s, 0, &out);
  size_t in_bytes, out_bytes;
  void *x = make_tensor(&in, 3, &in_bytes), *y = make_tensor(&out, 3, &out_bytes);
  expect_error(smelt_session_run(s), SMELT_INVALID_INPUT, "is not bound");
  expect_error(smelt_session_enqueue(s), SMELT_INVALID_INPUT, "is not bound");
  expect_error(smelt_session_enqueue(NULL), SMELT_INVALID_INPUT, "no session");
  expect_error(smelt_session_synchronize(NULL), SMELT_INVALID_INPUT, "no session");
  expect_error(smelt_session_bind_input(s, in.name, x, in_bytes - 1), SMELT_INVALID_INPUT, "bytes");
  expect_error(smelt_session_bind_input(s, in.name, x, in_bytes + 4), SMELT_INVALID_INPUT, in.name);
  expect_error(smelt_session_bind_output(s, out.name, y, out_bytes / 2), SMELT_INVALID_INPUT, "bytes");
  expect_error(smelt_session_bind_input(s, "no_such_tensor", x, in_bytes), SMELT_INVALID_INPUT, "no_such_tensor");
  expect_error(smelt_session_bind_output(s, "no_such_tensor", y, out_bytes), SMELT_INVALID_INPUT, "no output");
  /* An output's name is not an input's. */
  expect_error(smelt_session_bind_input(s, out.name, y, out_bytes), SMELT_INVALID_INPUT, "no input named");
  expect_error(smelt_session_bind_input(s, NULL, x, in_bytes), SMELT_INVALID_INPUT, "no input");
  expect_error(smelt_session_bind_input(s, in.name, (char *)x + 1, in_bytes), SMELT_INVALID_INPUT, "aligned");
  free(x);
  free(y);
  smelt_session_destroy(s);
}

static void test_bad_files(const char *path) {
  smelt_bundle *b = (smelt_bundle *)1;
  expect_error(smelt_bundle_open("/nonexistent/dir/x.smelt", &b), SMELT_IO, "x.smelt");
  CHECK(b == NULL);
  FILE *f = fopen(path, "rb");
  CHECK(f != NULL);
  if (!f) return;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *bytes = malloc((size_t)n);
  CHECK(fread(bytes, 1, (size_t)n, f) == (size_t)n);
  fclose(f);
  /* Truncated, and one flipped byte in every part of the file. */
  smelt_status st = smelt_bundle_open_memory(bytes, (size_t)n / 2, &b);
  CHECK(st && smelt_status_code(st) == SMELT_INVALID_INPUT && !b);
  smelt_status_free(st);
  for (long at = 0; at < n; at += n / 37 + 1) {
    bytes[at] ^= 0x5a;
    st = smelt_bundle_open_memory(bytes, (size_t)n, &b);
    CHECK(st != NULL && b == NULL);
    smelt_status_free(st);
    smelt_bundle_close(st ? NULL : b);
    bytes[at] ^= 0x5a;
  }
  CHECK_OK(smelt_bundle_open_memory(bytes, (size_t)n, &b));
  smelt_bundle_close(b);
  free(bytes);
}

static void test_checkers(smelt_bundle *b) {
  smelt_session *s;
  CHECK_OK(smelt_session_create(b, "cpu", NULL, &s));
  if (!s) return;
  Tensors t = {0};
  bind_tensors(s, 9, &t);
  ScOutputReport r;
  CHECK_OK(sc_check_outputs(s, (const void *const *)t.in, &r));
  CHECK(r.pass && r.noutputs == smelt_session_num_outputs(s));
  for (int i = 0; i < r.noutputs; i++) CHECK(r.outputs[i].data && r.outputs[i].diff.pass);
  sc_output_report_free(&r);
  ScGroupReport gr;
  CHECK_OK(sc_check_groups(s, (const void *const *)t.in, &gr));
  int writes = 0;
  for (int k = 0; k < rt_bundle_num_kernels(b); k++) writes += rt_bundle_kernel(b, k)->nouts;
  CHECK(gr.first_bad == -1 && gr.nchecks == writes);
  if (gr.first_bad >= 0) {
    const ScValueCheck *c = &gr.checks[gr.first_bad];
    fprintf(stderr, "first bad: kernel %s value %s cos %.6f relL2 %.3g\n", c->kernel_name, c->value_name,
            c->diff.cosine, c->diff.rel_l2);
  }
  sc_group_report_free(&gr);
  tensors_free(&t);
  smelt_session_destroy(s);
}

/* x -> a = exp(x), b = neg(x) -> y = add(a, b), with a and b placed on the
 * same arena bytes although both live when `y` runs: b overwrites a. */
static void test_bad_plan_is_caught(void) {
  Graph *g = ir_graph_create("badplan");
  SrcLoc loc = {0};
  TensorType ty = {.dt = DT_F32, .rank = 2, .dim = {4, 16}};
  int x = ir_add_input(g, "x", ty, loc);
  const char *na[] = {"a"}, *nb[] = {"b"}, *ny[] = {"y"};
  /* ir_add_node may move g->node: call first, index after. */
  int n = ir_add_node(g, OP_EXP, 1, &x, 1, na, loc);
  int a = g->node[n].out[0];
  n = ir_add_node(g, OP_NEG, 1, &x, 1, nb, loc);
  int b = g->node[n].out[0];
  int ab[2] = {a, b};
  n = ir_add_node(g, OP_ADD, 2, ab, 1, ny, loc);
  int y = g->node[n].out[0];
  ir_add_output(g, y);
  for (n = 0; n < g->nnode; n++) CHECK_OK(ir_infer_node(g, n));
  g->arena_bytes = (int64_t)ir_type_bytes(&ty);
  g->val[a].mem_offset = 0;
  g->val[b].mem_offset = 0;
  void *buf;
  size_t len;
  CHECK_OK(sc_compile_graph_to_memory(g, NULL, &buf, &len));
  ir_graph_destroy(g);
  smelt_bundle *bun;
  CHECK_OK(rt_bundle_open_bytes(buf, len, "badplan", &bun));
  free(buf);
  if (!bun) return;
  smelt_session *s;
  CHECK_OK(smelt_session_create(bun, "cpu", NULL, &s));
  Tensors t = {0};
  bind_tensors(s, 4, &t);
  ScGroupReport gr;
  CHECK_OK(sc_check_groups(s, (const void *const *)t.in, &gr));
  CHECK(gr.first_bad >= 0);
  if (gr.first_bad >= 0) {
    const ScValueCheck *c = &gr.checks[gr.first_bad];
    CHECK(c->clobbered && strcmp(c->value_name, "a") == 0);
  }
  sc_group_report_free(&gr);
  ScOutputReport r;
  CHECK_OK(sc_check_outputs(s, (const void *const *)t.in, &r));
  CHECK(!r.pass && r.noutputs == 1 && !r.outputs[0].diff.pass);
  sc_output_report_free(&r);
  tensors_free(&t);
  smelt_session_destroy(s);
  smelt_bundle_close(bun);
}

static void test_model(const char *model, const char *needs) {
  if (access(model, R_OK) != 0 || (needs && access(needs, R_OK) != 0)) {
    printf("SKIP %s: %s is missing (run python3 examples/gen_weights.py)\n", model, needs ? needs : model);
    return;
  }
  char path[256];
  snprintf(path, sizeof path, "/tmp/smelt_test_capi_%d.smelt", (int)getpid());
  CHECK_OK(smelt_compile(model, NULL, path));
  smelt_bundle *b;
  CHECK_OK(smelt_bundle_open(path, &b));
  if (b) {
    test_concurrent(b, model);
    test_thread_counts_agree(b);
    test_refusals(b);
    test_checkers(b);
    smelt_bundle_close(b);
    test_bad_files(path);
  }
  unlink(path);
  printf("%s: compiled, run on two threads, checked\n", model);
}

static bool same_info(const smelt_tensor_info *a, const smelt_tensor_info *b) {
  if (!a->name || !b->name || strcmp(a->name, b->name) != 0 || a->dtype != b->dtype || a->rank != b->rank) return false;
  for (int d = 0; d < a->rank && d < 8; d++)
    if (a->dims[d] != b->dims[d]) return false;
  return true;
}

/* The bundle-level descriptions (smelt_bundle_input_info, ...) equal a
 * session's once it has chosen that specialisation, for every one; a spec
 * or slot out of range is an error; the CUDA extras refuse a CPU session. */
static void test_bundle_infos(const char *model, const char *dims) {
  char path[256];
  snprintf(path, sizeof path, "/tmp/smelt_test_capi_info_%d.smelt", (int)getpid());
  smelt_compile_options o = {.dims = dims};
  CHECK_OK(smelt_compile(model, &o, path));
  smelt_bundle *b = NULL;
  CHECK_OK(smelt_bundle_open(path, &b));
  unlink(path);
  if (!b) return;
  int nspecs = smelt_bundle_num_specialisations(b);
  CHECK(nspecs >= 2);
  smelt_session *s = NULL;
  CHECK_OK(smelt_session_create(b, "cpu", NULL, &s));
  if (!s) {
    smelt_bundle_close(b);
    return;
  }
  CHECK(smelt_bundle_num_inputs(b) == smelt_session_num_inputs(s));
  CHECK(smelt_bundle_num_outputs(b) == smelt_session_num_outputs(s));
  CHECK(smelt_bundle_num_states(b) == smelt_session_num_states(s));
  smelt_tensor_info bi, si;
  for (int sp = 0; sp < nspecs; sp++) {
    CHECK_OK(smelt_session_select(s, sp));
    for (int i = 0; i < smelt_bundle_num_inputs(b); i++) {
      CHECK_OK(smelt_bundle_input_info(b, sp, i, &bi));
      smelt_session_input_info(s, i, &si);
      CHECK(same_info(&bi, &si));
    }
    for (int i = 0; i < smelt_bundle_num_outputs(b); i++) {
      CHECK_OK(smelt_bundle_output_info(b, sp, i, &bi));
      smelt_session_output_info(s, i, &si);
      CHECK(same_info(&bi, &si));
    }
    for (int i = 0; i < smelt_bundle_num_states(b); i++) {
      CHECK_OK(smelt_bundle_state_info(b, sp, i, &bi));
      smelt_session_state_info(s, i, &si);
      CHECK(same_info(&bi, &si));
    }
  }
  /* the specialisations differ in the input shapes (else they would be one) */
  smelt_tensor_info first;
  bool differ = false;
  for (int i = 0; i < smelt_bundle_num_inputs(b); i++) {
    CHECK_OK(smelt_bundle_input_info(b, 0, i, &first));
    CHECK_OK(smelt_bundle_input_info(b, nspecs - 1, i, &bi));
    differ = differ || !same_info(&first, &bi);
  }
  CHECK(differ);
  expect_error(smelt_bundle_input_info(b, nspecs, 0, &bi), SMELT_INVALID_INPUT, "specialisation");
  CHECK(bi.name == NULL && bi.rank == 0);
  expect_error(smelt_bundle_output_info(b, -1, 0, &bi), SMELT_INVALID_INPUT, "specialisation");
  expect_error(smelt_bundle_input_info(b, 0, smelt_bundle_num_inputs(b), &bi), SMELT_INVALID_INPUT, "input");
  expect_error(smelt_bundle_state_info(b, 0, smelt_bundle_num_states(b), &bi), SMELT_INVALID_INPUT, "state");
  /* CUDA only */
  void *stream = (void *)1;
  expect_error(smelt_session_cuda_stream(s, &stream), SMELT_UNSUPPORTED, "CPU");
  CHECK(stream == NULL);
  smelt_cuda_buffer *buf = (smelt_cuda_buffer *)1;
  expect_error(smelt_session_cuda_alloc(s, 64, &buf), SMELT_UNSUPPORTED, "CPU");
  CHECK(buf == NULL && smelt_cuda_buffer_data(NULL) == NULL);
  smelt_cuda_buffer_free(NULL);
  smelt_session_destroy(s);
  smelt_bundle_close(b);
  printf("%s (%s): bundle-level tensor infos match the sessions'\n", model, dims);
}

static void test_compile_errors(void) {
  smelt_compile_options o = {.targets = "tpu"};
  expect_error(smelt_compile("examples/mlp.yaml", &o, "/tmp/never.smelt"), SMELT_INVALID_INPUT, "tpu");
  o = (smelt_compile_options){.dims = "batch=1,1"};
  expect_error(smelt_compile("examples/mlp.yaml", &o, "/tmp/never.smelt"), SMELT_INVALID_INPUT, "twice");
  o = (smelt_compile_options){.dtype = "f13"};
  expect_error(smelt_compile("examples/mlp.yaml", &o, "/tmp/never.smelt"), SMELT_INVALID_INPUT, "f13");
  expect_error(smelt_compile("examples/no_such_model.yaml", NULL, "/tmp/never.smelt"), SMELT_IO, "no_such_model");
  /* an unknown CPU is refused with the known names (LLVM itself aborts on one) */
  o = (smelt_compile_options){.cpu = "znver9"};
  expect_error(smelt_compile("examples/mlp.yaml", &o, "/tmp/never.smelt"), SMELT_INVALID_INPUT, "x86-64-v3");
  o = (smelt_compile_options){.cpu = "x86-64-v3,x86-64-v3"};
  expect_error(smelt_compile("examples/mlp.yaml", &o, "/tmp/never.smelt"), SMELT_INVALID_INPUT, "twice");
  CHECK(access("/tmp/never.smelt", F_OK) != 0);
}

int main(void) {
#ifndef SMELT_HAVE_LLVM
  printf("SKIP test_capi: smelt was built without LLVM (SMELT_LLVM=OFF), so nothing can be compiled\n");
  return CHECK_SKIPPED;
#endif
  test_model("examples/mlp.yaml", NULL);
  test_model("examples/tiny_llama.yaml", "examples/tiny_llama.safetensors");
  test_bad_plan_is_caught();
  test_bundle_infos("examples/mlp.yaml", "batch=1,8");
  test_bundle_infos("examples/tiny_lm.yaml", "seq=1,16");
  test_compile_errors();
  return check_done("test_capi");
}
