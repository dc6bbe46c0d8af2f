/* The CUDA driver layer (runtime/cuda_driver.h) on a real GPU.
 *
 * Device facts; memory round trips with host and device pointers on either
 * side; the module loader's order of preference (the cubin for this GPU;
 * else the source through NVRTC; else PTX through the driver's JIT; else a
 * clear error) with each loaded module actually run; launch errors naming
 * the kernel; a CUDA graph captured once and replayed; per-kernel event
 * timings.
 *
 * Without a GPU it prints "SKIP: no CUDA device" and exits 77 (skipped, for ctest).
 */
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cg_cuda.h"
#include "frontend/frontend.h"
#include "include/smelt_compile.h"
#include "runtime/cuda_driver.h"
#include "tests/unit/check.h"

static const char probe_src[] =
    "extern \"C\" __global__ void probe(float *a, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) a[i] = a[i] * 2.0f + 1.0f;\n"
    "}\n";

#define N 1000

/* Runs probe on [0, N) once through module m and checks a[i] = 2 i + 1. */
static void run_probe(RtCudaDevice *d, RtCudaModule *m, const char *what) {
  RtCudaFunction fn = NULL;
  CHECK_OK(rt_cuda_module_function(m, "probe", 0, &fn));
  if (!fn) return;
  float host[N];
  for (int i = 0; i < N; i++) host[i] = (float)i;
  RtCudaPtr p = 0;
  CHECK_OK(rt_cuda_alloc(d, sizeof host, &p));
  CHECK_OK(rt_cuda_upload(d, p, host, sizeof host));
  int n = N;
  void *params[2] = {&p, &n};
  RtCudaLaunch l = {fn, "probe", {(N + 127) / 128, 1, 1}, {128, 1, 1}, 0, params, false, NULL, NULL};
  CHECK_OK(rt_cuda_launch(d, &l, 1));
  CHECK_OK(rt_cuda_sync(d));
  CHECK_OK(rt_cuda_download(d, host, p, sizeof host));
  int bad = 0;
  for (int i = 0; i < N; i++) bad += host[i] != 2.0f * (float)i + 1.0f;
  if (bad) fprintf(stderr, "%s: %d wrong elements\n", what, bad);
  CHECK(bad == 0);
  rt_cuda_free(d, p);
}

int main(void) {
  RtCudaDevice *d = NULL;
  smelt_status st = rt_cuda_device_create(0, &d);
  if (st && st_code(st) == ST_UNSUPPORTED) {
    printf("SKIP: no CUDA device (%s)\n", st_message(st));
    st_free(st);
    return CHECK_SKIPPED;
  }
  CHECK_OK(st);
  if (!d) return check_done("test_cuda_driver");
  const RtCudaInfo *in = rt_cuda_device_info(d);
  printf("device %d: %s, cc %d (%s), %d SMs, %.1f GiB, smem/block %lld, L2 %lld, peak %.0f GB/s, driver %d\n",
         in->ordinal, in->name, in->cc, in->arch, in->sm_count, in->total_mem / 1073741824.0,
         (long long)in->smem_per_block_optin, (long long)in->l2_bytes, in->mem_bandwidth_gbs, in->driver_version);
  CHECK(in->cc >= 50 && in->sm_count > 0 && in->total_mem > 0);
  int count = 0;
  CHECK_OK(rt_cuda_device_count(&count));
  CHECK(count >= 1);
  RtCudaDevice *none = NULL;
  st = rt_cuda_device_create(count + 5, &none);
  CHECK(st && st_code(st) == ST_UNSUPPORTED && !none);
  st_free(st);

  /* memory: host and device pointers on both sides */
  {
    unsigned char h1[4096], h2[4096];
    for (int i = 0; i < 4096; i++) h1[i] = (unsigned char)(i * 7);
    RtCudaPtr a = 0, b = 0;
    CHECK_OK(rt_cuda_alloc(d, sizeof h1, &a));
    CHECK_OK(rt_cuda_alloc(d, sizeof h1, &b));
    CHECK(a % 256 == 0 && b % 256 == 0);
    CHECK(rt_cuda_is_device_pointer(d, (void *)(uintptr_t)a));
    CHECK(!rt_cuda_is_device_pointer(d, h1));
    CHECK_OK(rt_cuda_upload(d, a, h1, sizeof h1));
    CHECK_OK(rt_cuda_upload(d, b, (const void *)(uintptr_t)a, sizeof h1));   /* device to device */
    CHECK_OK(rt_cuda_memset(d, a, 0, sizeof h1));
    CHECK_OK(rt_cuda_download(d, (void *)(uintptr_t)a, b, sizeof h1));       /* device to device */
    CHECK_OK(rt_cuda_download(d, h2, a, sizeof h2));
    CHECK(memcmp(h1, h2, sizeof h1) == 0);
    rt_cuda_free(d, a);
    rt_cuda_free(d, b);
  }

  /* the constants of a model in one block, each where the table says */
  {
    Graph *g = NULL;
    CHECK_OK(fe_load_yaml("examples/mlp.yaml", NULL, &g));
    if (g) {
      RtCudaPtr block = 0, *ptrs = calloc((size_t)g->nval, sizeof *ptrs);
      CHECK_OK(rt_cuda_upload_constants(d, g, &block, ptrs));
      int nconst = 0;
      for (int v = 0; v < g->nval && block; v++) {
        if (g->val[v].kind != VK_CONST) {
          CHECK(ptrs[v] == 0);
          continue;
        }
        size_t n = ir_type_bytes(&g->val[v].type);
        void *back = malloc(n ? n : 1);
        CHECK(ptrs[v] % 256 == 0);
        CHECK_OK(rt_cuda_download(d, back, ptrs[v], n));
        CHECK(memcmp(back, g->val[v].data, n) == 0);
        free(back);
        nconst++;
      }
      CHECK(nconst > 0);
      rt_cuda_free(d, block);
      free(ptrs);
      ir_graph_destroy(g);
    }
  }

  /* module loading, in order of preference */
  CgNvrtc *nv = NULL;
  CHECK_OK(cg_cuda_nvrtc_open(&nv));
  if (nv) {
    CgCudaBinary own, old;
    CHECK_OK(cg_cuda_compile_source(nv, probe_src, "probe.cu", in->arch, NULL, &own));
    CHECK_OK(cg_cuda_compile_source(nv, probe_src, "probe.cu", "sm_80", NULL, &old));
    RtCudaModule *m = NULL;
    RtCudaLoadKind kind;
    RtCudaImage both[2] = {{"sm_80", old.cubin, old.cubin_len, old.ptx}, {in->arch, own.cubin, own.cubin_len, own.ptx}};
    CHECK_OK(rt_cuda_module_load(d, both, 2, probe_src, "both", &m, &kind));
    CHECK(kind == RT_CUDA_LOADED_CUBIN);
    if (m) run_probe(d, m, "cubin");
    rt_cuda_module_unload(m);

    /* only an sm_80 cubin: usable on 8.x; elsewhere the source is compiled
     * by the device's compiler hook, and without one the PTX is JIT-ed */
    bool sm80_runs = in->cc >= 80 && in->cc < 90;
    CHECK_OK(rt_cuda_module_load(d, both, 1, probe_src, "sm_80 only, no compiler", &m, &kind));
    CHECK(kind == (sm80_runs ? RT_CUDA_LOADED_CUBIN : RT_CUDA_LOADED_PTX));
    if (m) run_probe(d, m, "sm_80 cubin or PTX");
    rt_cuda_module_unload(m);
    rt_cuda_device_set_compiler(d, smelt_nvrtc_compile, NULL);
    CHECK_OK(rt_cuda_module_load(d, both, 1, probe_src, "sm_80 only", &m, &kind));
    CHECK(kind == (sm80_runs ? RT_CUDA_LOADED_CUBIN : RT_CUDA_LOADED_NVRTC));
    if (m) run_probe(d, m, "sm_80 cubin or NVRTC");
    rt_cuda_module_unload(m);

    /* no cubin that runs, no source: PTX through the driver's JIT */
    RtCudaImage ptx_only = {"sm_80", NULL, 0, old.ptx};
    CHECK_OK(rt_cuda_module_load(d, &ptx_only, 1, NULL, "ptx only", &m, &kind));
    CHECK(kind == RT_CUDA_LOADED_PTX);
    if (m) run_probe(d, m, "PTX JIT");
    rt_cuda_module_unload(m);

    /* nothing usable: a clear error */
    RtCudaImage wrong = {"sm_90a", NULL, 0, NULL};
    m = NULL;
    st = rt_cuda_module_load(d, &wrong, 1, NULL, "nothing", &m, &kind);
    CHECK(st && !m && st_code(st) == ST_UNSUPPORTED);
    if (st) CHECK(strstr(st_message(st), "no code for this GPU") != NULL);
    st_free(st);

    /* launches: an error names the kernel; graphs replay; events time */
    CHECK_OK(rt_cuda_module_load(d, both, 2, NULL, "graph", &m, &kind));
    RtCudaFunction fn = NULL;
    if (m) CHECK_OK(rt_cuda_module_function(m, "probe", 0, &fn));
    if (fn) {
      RtCudaPtr p = 0;
      float host[N], want[N];
      for (int i = 0; i < N; i++) host[i] = (float)i, want[i] = (float)i;
      CHECK_OK(rt_cuda_alloc(d, sizeof host, &p));
      CHECK_OK(rt_cuda_upload(d, p, host, sizeof host));
      int n = N;
      void *params[2] = {&p, &n};
      RtCudaLaunch l[3];
      for (int i = 0; i < 3; i++) l[i] = (RtCudaLaunch){fn, "probe", {(N + 127) / 128, 1, 1}, {128, 1, 1}, 0, params, false, NULL, NULL};
      RtCudaLaunch badl = l[0];
      badl.block[0] = 4096;
      badl.name = "k99_too_many_threads";
      st = rt_cuda_launch(d, &badl, 1);
      CHECK(st != NULL);
      if (st) CHECK(strstr(st_message(st), "cuLaunchKernel") && strstr(st_message(st), "k99_too_many_threads"));
      st_free(st);
      RtCudaGraph *gr = NULL;
      CHECK_OK(rt_cuda_graph_capture(d, l, 3, &gr));
      for (int rep = 0; rep < 2 && gr; rep++) {
        CHECK_OK(rt_cuda_graph_launch(d, gr));
        for (int i = 0; i < N; i++)
          for (int k = 0; k < 3; k++) want[i] = want[i] * 2.0f + 1.0f;
      }
      CHECK_OK(rt_cuda_sync(d));
      CHECK_OK(rt_cuda_download(d, host, p, sizeof host));
      int bad = 0;
      for (int i = 0; i < N; i++) bad += host[i] != want[i];
      CHECK(gr && bad == 0);
      rt_cuda_graph_destroy(gr);
      double ms[3] = {0};
      CHECK_OK(rt_cuda_time_kernels(d, l, 3, 5, ms));
      printf("probe kernel times: %.4f %.4f %.4f ms\n", ms[0], ms[1], ms[2]);
      CHECK(ms[0] > 0 && ms[1] > 0 && ms[2] > 0);
      rt_cuda_free(d, p);
    }
    rt_cuda_module_unload(m);
    cg_cuda_binary_clear(&own);
    cg_cuda_binary_clear(&old);
    cg_cuda_nvrtc_close(nv);
  }
  rt_cuda_device_destroy(d);
  return check_done("test_cuda_driver");
}
