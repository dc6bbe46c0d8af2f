/* Every example end to end on the GPU through the public API and the CLI.
 *
 * For each examples/NAME.yaml in f32 and f16: compile in memory for
 * --target cuda (the GPU's arch), open the bundle, create a session on
 * "cuda", and check the outputs against the reference interpreter
 * (sc_check_outputs) at relative L2 error <= 1e-5 in f32 and <= 2e-3 in f16,
 * with no NaN/inf that the reference does not have; then every fused group
 * (sc_check_groups); then the session's binding paths against the first
 * result, bit for bit (the kernels are deterministic):
 *   - a second run with fresh host buffers (the CUDA graph replayed),
 *   - inputs and outputs bound as device memory (used directly: the graph is
 *     captured again with their addresses),
 *   - device memory 16 bytes off alignment (staged through the session's
 *     buffers, because the kernels assume 64-byte alignment),
 *   - host memory again.
 * Then the command line: `smelt compile --target cuda --arch sm_90a,sm_80`
 * writes a bundle, `smelt run BUNDLE|MODEL --device cuda --check` and
 * `--check=groups` pass, and `smelt bench --device cuda --json` prints a
 * graph replay time.
 *
 * Without a GPU it checks that a CUDA session fails cleanly
 * (SMELT_UNSUPPORTED naming CUDA), prints "SKIP: no CUDA device" and exits 77 (skipped, for ctest).
 */
#include <dirent.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "include/smelt.h"
#include "compiler/check.h"
#include "runtime/cuda_driver.h"
#include "compiler/driver.h"
#include "tests/unit/check.h"

static const double REL_L2_F32 = 1e-5, REL_L2_F16 = 2e-3;

/* Floats in [-1, 1), integers 0, 1, ... along the last axis, bools alternating. */
static void *make_input(const smelt_tensor_info *ti, size_t *out_bytes, uint64_t seed) {
  TensorType t = {.dt = (DType)ti->dtype, .rank = ti->rank};
  for (int i = 0; i < ti->rank; i++) t.dim[i] = ti->dims[i];
  size_t n = (size_t)ir_type_numel(&t), bytes = ir_type_bytes(&t);
  void *p = calloc(1, bytes + 64);
  int64_t last = t.rank && t.dim[t.rank - 1] ? t.dim[t.rank - 1] : 1;
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; p && i < n; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    double v = dt_is_float(t.dt) ? (double)(s >> 11) * 0x1.0p-52 - 1.0 : t.dt == DT_BOOL ? (double)(i % 2)
                                                                                          : (double)((int64_t)i % last);
    dt_store(t.dt, p, i, v);
  }
  *out_bytes = bytes;
  return p;
}

/* Runs s with inputs/outputs in device memory at `offset` bytes past a
 * 256-byte-aligned allocation, and compares the outputs with want[]. */
/* Whether st has code `code` and its message holds `part` (st freed). */
static bool expect_status(smelt_status st, int code, const char *part) {
  bool ok = st && smelt_status_code(st) == code && strstr(smelt_status_message(st), part);
  if (!ok) fprintf(stderr, "expected status %d with '%s', got %s\n", code, part, st ? smelt_status_message(st) : "success");
  smelt_status_free(st);
  return ok;
}

static void run_on_device_memory(RtCudaDevice *d, smelt_session *s, void **in, size_t *in_bytes, void **want,
                                 size_t *out_bytes, size_t offset, bool queued, const char *what) {
  int ni = smelt_session_num_inputs(s), no = smelt_session_num_outputs(s);
  RtCudaPtr *dev = calloc((size_t)(ni + no), sizeof *dev);
  for (int i = 0; i < ni + no; i++) {
    smelt_tensor_info ti;
    size_t n = i < ni ? in_bytes[i] : out_bytes[i - ni];
    CHECK_OK(rt_cuda_alloc(d, n + offset + 64, &dev[i]));
    if (i < ni) {
      smelt_session_input_info(s, i, &ti);
      CHECK_OK(rt_cuda_upload(d, dev[i] + offset, in[i], n));
      CHECK_OK(smelt_session_bind_input(s, ti.name, (void *)(uintptr_t)(dev[i] + offset), n));
    } else {
      smelt_session_output_info(s, i - ni, &ti);
      CHECK_OK(rt_cuda_memset(d, dev[i] + offset, 0, n));
      CHECK_OK(smelt_session_bind_output(s, ti.name, (void *)(uintptr_t)(dev[i] + offset), n));
    }
  }
  if (queued) {
    /* twice queued back to back, then one wait: the same results */
    CHECK_OK(smelt_session_enqueue(s));
    CHECK_OK(smelt_session_enqueue(s));
    CHECK_OK(smelt_session_synchronize(s));
  } else {
    CHECK_OK(smelt_session_run(s));
  }
  for (int o = 0; o < no; o++) {
    void *got = malloc(out_bytes[o] + 1);
    CHECK_OK(rt_cuda_download(d, got, dev[ni + o] + offset, out_bytes[o]));
    if (memcmp(got, want[o], out_bytes[o]) != 0) {
      fprintf(stderr, "%s: output %d differs from the first run (device memory, offset %zu)\n", what, o, offset);
      CHECK(0);
    }
    free(got);
  }
  for (int i = 0; i < ni + no; i++) rt_cuda_free(d, dev[i]);
  free(dev);
}

/* Binds host inputs and fresh host outputs, runs, compares with want[]. */
static void run_on_host_memory(smelt_session *s, void **in, size_t *in_bytes, void **want, size_t *out_bytes,
                               const char *what) {
  int ni = smelt_session_num_inputs(s), no = smelt_session_num_outputs(s);
  void **got = calloc((size_t)no + 1, sizeof *got);
  for (int i = 0; i < ni; i++) {
    smelt_tensor_info ti;
    smelt_session_input_info(s, i, &ti);
    CHECK_OK(smelt_session_bind_input(s, ti.name, in[i], in_bytes[i]));
  }
  for (int o = 0; o < no; o++) {
    smelt_tensor_info ti;
    smelt_session_output_info(s, o, &ti);
    got[o] = calloc(1, out_bytes[o] + 64);
    CHECK_OK(smelt_session_bind_output(s, ti.name, got[o], out_bytes[o]));
  }
  CHECK_OK(smelt_session_run(s));
  for (int o = 0; o < no; o++) {
    if (memcmp(got[o], want[o], out_bytes[o]) != 0) {
      fprintf(stderr, "%s: output %d differs from the first run (host memory)\n", what, o);
      CHECK(0);
    }
    free(got[o]);
  }
  free(got);
}

static void test_model(RtCudaDevice *d, const char *path, const char *dtype) {
  char what[600];
  snprintf(what, sizeof what, "%s --dtype %s", path, dtype);
  smelt_compile_options co = {.targets = "cuda", .dtype = dtype};
  void *buf = NULL;
  size_t len = 0;
  smelt_bundle *b = NULL;
  smelt_session *s = NULL;
  smelt_status st = sc_compile_model_to_memory(path, &co, &buf, &len);
  if (!st) st = smelt_bundle_open_memory(buf, len, &b);
  free(buf);
  if (!st) st = smelt_session_create(b, "cuda", NULL, &s);
  if (st) {
    fprintf(stderr, "%s: %s\n", what, smelt_status_message(st));
    smelt_status_free(st);
    CHECK(0);
    smelt_bundle_close(b);
    return;
  }
  int ni = smelt_session_num_inputs(s), no = smelt_session_num_outputs(s);
  void **in = calloc((size_t)ni + 1, sizeof *in);
  size_t *in_bytes = calloc((size_t)ni + 1, sizeof *in_bytes), *out_bytes = calloc((size_t)no + 1, sizeof *out_bytes);
  for (int i = 0; i < ni; i++) {
    smelt_tensor_info ti;
    smelt_session_input_info(s, i, &ti);
    in[i] = make_input(&ti, &in_bytes[i], (uint64_t)i + 1);
  }
  ScOutputReport rep = {0};
  CHECK_OK(sc_check_outputs(s, (const void *const *)in, &rep));
  double tol = strcmp(dtype, "f16") == 0 ? REL_L2_F16 : REL_L2_F32;
  void **want = calloc((size_t)no + 1, sizeof *want);
  for (int o = 0; o < rep.noutputs; o++) {
    const ScOutputCheck *oc = &rep.outputs[o];
    bool ok = oc->diff.rel_l2 <= tol && oc->diff.nonfinite == 0;
    printf("%-44s %-6s rel L2 %.3g (<= %g), max abs %.3g  %s\n", what, oc->name, oc->diff.rel_l2, tol,
           oc->diff.max_abs, ok ? "ok" : "FAILED");
    CHECK(ok);
    want[o] = oc->data;
    out_bytes[o] = ir_type_bytes(&oc->type);
  }
  if (rep.noutputs == no) {
    run_on_host_memory(s, in, in_bytes, want, out_bytes, what);
    run_on_device_memory(d, s, in, in_bytes, want, out_bytes, 0, false, what);
    run_on_device_memory(d, s, in, in_bytes, want, out_bytes, 16, false, what);
    run_on_device_memory(d, s, in, in_bytes, want, out_bytes, 0, true, what);
    run_on_device_memory(d, s, in, in_bytes, want, out_bytes, 16, true, what);
    run_on_host_memory(s, in, in_bytes, want, out_bytes, what);
    /* queued, outputs must be device memory: host outputs are refused */
    CHECK(expect_status(smelt_session_enqueue(s), SMELT_INVALID_INPUT, "bound to host memory"));
  }
  ScGroupReport gr = {0};
  CHECK_OK(sc_check_groups(s, (const void *const *)in, &gr));
  if (gr.first_bad >= 0) {
    const ScValueCheck *c = &gr.checks[gr.first_bad];
    fprintf(stderr, "%s: --check=groups: kernel %s, value %s diverges (cosine %.6f)%s\n", what, c->kernel_name,
            c->value_name, c->diff.cosine, c->clobbered ? " (clobbered)" : "");
    CHECK(0);
  }
  sc_group_report_free(&gr);
  sc_output_report_free(&rep);
  for (int i = 0; i < ni; i++) free(in[i]);
  free(in), free(in_bytes), free(out_bytes), free(want);
  smelt_session_destroy(s);
  smelt_bundle_close(b);
}

/* Runs a shell command; checks its exit status and, when `expect` is not
 * NULL, that its output contains it. */
static void cli(const char *cmd, const char *expect) {
  char full[4096];
  snprintf(full, sizeof full, "%s 2>&1", cmd);
  FILE *p = popen(full, "r");
  CHECK(p != NULL);
  if (!p) return;
  char out[65536];
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  int rc = pclose(p);
  bool ok = rc == 0 && (!expect || strstr(out, expect));
  printf("%-6s %s\n", ok ? "ok" : "FAILED", cmd);
  if (!ok) fprintf(stderr, "%s\n(exit status %d; output:)\n%s\n", cmd, rc, out);
  CHECK(ok);
}

static void test_cli(const char *smelt, const char *const *models, int nmodels) {
  if (access(smelt, X_OK) != 0) {
    fprintf(stderr, "the smelt binary %s is not built\n", smelt);
    CHECK(0);
    return;
  }
  char cmd[8704], bundle[64]; /* room for a PATH_MAX binary and model path */
  snprintf(bundle, sizeof bundle, "/tmp/smelt-gpu-test-%d.smelt", (int)getpid());
  snprintf(cmd, sizeof cmd, "%s compile examples/mlp.yaml -o %s --target cuda --arch sm_90a,sm_80", smelt, bundle);
  cli(cmd, NULL);
  snprintf(cmd, sizeof cmd, "%s inspect %s", smelt, bundle);
  cli(cmd, "sm_80/u0");
  snprintf(cmd, sizeof cmd, "%s run %s --device cuda --check", smelt, bundle);
  cli(cmd, "pass");
  snprintf(cmd, sizeof cmd, "%s run %s --device cuda:0 --check=groups", smelt, bundle);
  cli(cmd, "all groups match");
  snprintf(cmd, sizeof cmd, "%s bench %s --device cuda --iters 5 --json", smelt, bundle);
  cli(cmd, "CUDA graph replay");
  unlink(bundle);
  for (int i = 0; i < nmodels; i++)
    for (int h = 0; h < 2; h++) {
      snprintf(cmd, sizeof cmd, "%s run %s --device cuda --check%s", smelt, models[i], h ? " --dtype f16" : "");
      cli(cmd, "pass");
    }
}

int main(int argc, char **argv) {
  (void)argc;
  RtCudaDevice *d = NULL;
  smelt_status st = rt_cuda_device_create(0, &d);
  if (st && st_code(st) == ST_UNSUPPORTED) {
    /* what a session says on this machine: a clean refusal */
    smelt_compile_options co = {.targets = "cuda"};
    void *buf = NULL;
    size_t len = 0;
    smelt_bundle *b = NULL;
    smelt_session *s = NULL;
    smelt_status cst = sc_compile_model_to_memory("examples/mlp.yaml", &co, &buf, &len);
    if (cst && smelt_status_code(cst) == SMELT_UNSUPPORTED) {
      printf("(no NVRTC either: %s)\n", smelt_status_message(cst));
    } else {
      CHECK_OK(cst);
      cst = NULL;
      CHECK_OK(smelt_bundle_open_memory(buf, len, &b));
      smelt_status sst = smelt_session_create(b, "cuda", NULL, &s);
      CHECK(sst != NULL && smelt_status_code(sst) == SMELT_UNSUPPORTED && s == NULL);
      if (sst) printf("a CUDA session here: %s\n", smelt_status_message(sst));
      smelt_status_free(sst);
    }
    smelt_status_free(cst);
    free(buf);
    smelt_bundle_close(b);
    printf("SKIP: no CUDA device (%s)\n", st_message(st));
    st_free(st);
    /* the checks without a device ran; the test's point did not */
    return check_failures ? check_done("test_cuda_session") : CHECK_SKIPPED;
  }
  CHECK_OK(st);
  if (!d) return check_done("test_cuda_session");
  const RtCudaInfo *info = rt_cuda_device_info(d);
  printf("device %d: %s (%s, %d SMs)\n", info->ordinal, info->name, info->arch, info->sm_count);

  const char *models[16];
  char paths[16][300];
  int nmodels = 0;
  DIR *dir = opendir("examples");
  CHECK(dir != NULL);
  struct dirent *ent;
  while (dir && (ent = readdir(dir)) != NULL && nmodels < 16) {
    size_t n = strlen(ent->d_name);
    if (n < 6 || strcmp(ent->d_name + n - 5, ".yaml") != 0) continue;
    snprintf(paths[nmodels], sizeof paths[nmodels], "examples/%s", ent->d_name);
    models[nmodels] = paths[nmodels];
    nmodels++;
  }
  if (dir) closedir(dir);
  CHECK(nmodels >= 4);
  for (int i = 0; i < nmodels; i++) {
    test_model(d, models[i], "f32");
    test_model(d, models[i], "f16");
  }
  /* the smelt binary sits next to this test in the build directory */
  char self[4096], smelt[4200];
  snprintf(self, sizeof self, "%s", argv[0]);
  snprintf(smelt, sizeof smelt, "%s/smelt", dirname(self));
  test_cli(smelt, models, nmodels);
  printf("%d examples in f32 and f16 through the C API and the CLI on %s\n", nmodels, info->name);
  rt_cuda_device_destroy(d);
  return check_done("test_cuda_session");
}
