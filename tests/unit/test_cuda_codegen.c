/* Unit tests of the CUDA backend that need no GPU.
 *
 * Code generation: every example model (f32 and f16, through the default
 * pipeline and kernel lowering), every operator in f32, f16, bf16 and f64
 * (tests/gpu/op_cases.h, integer and bool cases with f32) and hand-formed
 * fused groups are turned into CUDA C, and every unit is compiled with NVRTC
 * for sm_90a and sm_80: all must compile (NVRTC needs no GPU).  Without
 * NVRTC the compile checks are skipped, visibly.
 *
 * Checks on the text: kernels carry the YAML names of the nodes they
 * compute; 16-byte vector accesses are chosen exactly when the innermost
 * dim allows them, with a run-time alignment test unless the caller
 * guarantees alignment; short rows get a warp, long rows a block.  Around
 * that: the arch table, the launch-table encoding (and its rejection of
 * bad input), the disk cache (a second compile is a hit; a corrupted entry
 * is recompiled), and the "absent" paths: no NVRTC, no driver.
 */
#define _GNU_SOURCE /* RTLD_NODELETE in harness.h */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/cuda/cg_cuda.h"
#include "codegen/lower.h"
#include "compiler/driver.h"
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "runtime/cuda_driver.h"
#include "tests/gpu/harness.h"
#include "tests/gpu/op_cases.h"
#include "tests/unit/check.h"

static CgNvrtc *nvrtc;
static CgCudaCompileOptions copts;
static const char *const archs[] = {"sm_90a", "sm_80"};
static int units_compiled;

/* Lowers g (single-node groups when it has none) and generates its module. */
static FmtCudaModule *generate(Graph *g, const CgCudaOptions *opt, const char *what) {
  if (g->ngroups == 0) CHECK_OK(cg_single_node_groups(g));
  Kernel *k = NULL;
  int nk = 0;
  smelt_status st = cg_lower(g, &k, &nk);
  if (st) {
    fprintf(stderr, "%s: cg_lower: %s\n", what, st_message(st));
    st_free(st);
    check_failures++;
    return NULL;
  }
  FmtCudaModule *m = NULL;
  st = cg_cuda_generate(g, k, nk, opt, &m);
  if (st) {
    fprintf(stderr, "%s: cg_cuda_generate: %s\n", what, st_message(st));
    st_free(st);
    check_failures++;
  }
  cg_kernels_free(k, nk);
  return m;
}

/* Compiles every unit for both archs; prints the first unit's error with
 * its source on failure. */
static void compile_all(const FmtCudaModule *m, const char *what) {
  if (!nvrtc || !m) return;
  CgCudaBinary *bins = NULL;
  smelt_status st = cg_cuda_compile_module(nvrtc, m, archs, 2, &copts, &bins);
  if (st) {
    fprintf(stderr, "%s: %s\n", what, st_message(st));
    st_free(st);
    check_failures++;
    return;
  }
  for (int i = 0; i < m->nunits * 2; i++) {
    CHECK(bins[i].cubin && bins[i].cubin_len > 0);
    CHECK(bins[i].ptx && bins[i].ptx_len > 0);
  }
  units_compiled += m->nunits * 2;
  cg_cuda_binaries_free(bins, m->nunits * 2);
}

static bool source_has(const FmtCudaModule *m, const char *needle) {
  for (int u = 0; u < m->nunits; u++)
    if (strstr(m->units[u], needle)) return true;
  return false;
}

/* ---- examples ---- */

static void check_example(const char *path, DType dtype) {
  FeOptions fo = {.dtype = dtype};
  Graph *g = NULL;
  smelt_status st = fe_load_yaml(path, &fo, &g);
  if (st) {
    fprintf(stderr, "%s (%s): %s\n", path, dt_name(dtype), st_message(st));
    st_free(st);
    check_failures++;
    return;
  }
  PassCtx ctx = {0};
  CHECK_OK(pass_run_pipeline(g, &ctx, NULL, NULL, NULL));
  pass_ctx_free(&ctx);
  char what[512];
  snprintf(what, sizeof what, "%s (%s)", path, dtype ? dt_name(dtype) : "model dtype");
  FmtCudaModule *m = generate(g, NULL, what);
  if (m) {
    /* provenance: every stored result of every group appears by its YAML name */
    for (int i = 0; i < g->noutputs; i++) {
      const char *name = g->val[g->outputs[i]].name;
      if (!source_has(m, name)) {
        fprintf(stderr, "%s: output '%s' not named in the CUDA source\n", what, name);
        check_failures++;
      }
    }
    for (int i = 0; i < m->nkernels; i++) CHECK(source_has(m, m->kernels[i].symbol));
    compile_all(m, what);
  }
  fmt_cuda_module_free(m);
  ir_graph_destroy(g);
}

static void test_examples(void) {
  DIR *d = opendir("examples");
  CHECK(d != NULL);
  if (!d) return;
  struct dirent *e;
  int n = 0;
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    if (len < 6 || strcmp(e->d_name + len - 5, ".yaml") != 0) continue;
    char path[512];
    snprintf(path, sizeof path, "examples/%s", e->d_name);
    check_example(path, DT_INVALID);
    check_example(path, DT_F16);
    n++;
  }
  closedir(d);
  CHECK(n >= 4);
}

/* ---- every op ---- */

static void test_suites(void) {
  DType dts[] = {DT_F32, DT_F16, DT_BF16, DT_F64};
  for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) {
    for (int fused = 0; fused < 2; fused++) {
      OpSuite s;
      Graph *g = fused ? oc_fused_suite(dts[i], &s) : oc_suite(dts[i], &s);
      if (!g) {
        fprintf(stderr, "op suite %s: %s\n", dt_name(dts[i]), s.msg);
        check_failures++;
        continue;
      }
      char what[64];
      snprintf(what, sizeof what, "%s suite %s", fused ? "fused" : "op", dt_name(dts[i]));
      FmtCudaModule *m = generate(g, NULL, what);
      compile_all(m, what);
      fmt_cuda_module_free(m);
      ir_graph_destroy(g);
    }
  }
}

/* ---- text checks ---- */

static Graph *one_op(DType dt, Op op, int rank, const int64_t *dims, const char *yname) {
  Graph *g = ir_graph_create("one");
  TensorType t = {.dt = dt, .rank = rank};
  for (int i = 0; i < rank; i++) t.dim[i] = dims[i];
  int a = ir_add_input(g, "in.a", t, oc_loc), b = ir_add_input(g, "in.b", t, oc_loc);
  const char *names[1] = {yname};
  int n = ir_add_node(g, op, op == OP_SOFTMAX ? 1 : 2, (int[]){a, b}, 1, names, oc_loc);
  ir_fill_default_attrs(g, n);
  CHECK_OK(ir_infer_node(g, n));
  ir_add_output(g, g->node[n].out[0]);
  return g;
}

static void test_vector_choice(void) {
  CgCudaOptions aligned = {.args_aligned = true}, checked = {0};
  struct {
    DType dt;
    int64_t dims[2];
    const char *pack;
    bool vec;
  } cases[] = {
      {DT_F32, {8, 64}, "smelt_pack<float, 4>", true},
      {DT_F16, {8, 64}, "smelt_pack<__half, 8>", true},
      {DT_BF16, {3, 16}, "smelt_pack<__nv_bfloat16, 8>", true},
      {DT_F32, {8, 37}, "smelt_pack<", false},
      {DT_F16, {8, 12}, "smelt_pack<", false}, /* 12 is not a multiple of 8 halves */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    Graph *g = one_op(cases[i].dt, OP_ADD, 2, cases[i].dims, "layer.2/sum_out");
    FmtCudaModule *m = generate(g, &aligned, "vector choice");
    if (m) {
      CHECK(source_has(m, cases[i].pack) == cases[i].vec);
      CHECK(m->kernels[0].vectorised == cases[i].vec);
      CHECK(!source_has(m, "smelt_aligned(a")); /* alignment guaranteed: no test */
      CHECK(source_has(m, "layer.2/sum_out"));
      CHECK(strstr(m->kernels[0].symbol, "layer_2_sum_out") != NULL);
    }
    fmt_cuda_module_free(m);
    ir_graph_destroy(g);
    g = one_op(cases[i].dt, OP_ADD, 2, cases[i].dims, "y");
    m = generate(g, &checked, "vector choice (checked)");
    /* without the guarantee: a run-time test and a scalar fallback */
    if (m) CHECK(source_has(m, "smelt_aligned(a0, 16) && smelt_aligned(a1, 16) && smelt_aligned(a2, 16)") == cases[i].vec);
    fmt_cuda_module_free(m);
    ir_graph_destroy(g);
  }
  /* rows: short ones get a warp each, long ones a block */
  int64_t shortrow[2] = {64, 128}, longrow[2] = {4, 8192};
  Graph *g = one_op(DT_F16, OP_SOFTMAX, 2, shortrow, "p");
  FmtCudaModule *m = generate(g, &aligned, "short rows");
  if (m) {
    CHECK(source_has(m, "smelt_warp_reduce(") && !source_has(m, "smelt_block_reduce(t"));
    CHECK(m->kernels[0].block[0] == 128 && m->kernels[0].grid[0] == 16);
    CHECK(strcmp(m->kernels[0].kind, "reduction") == 0);
  }
  fmt_cuda_module_free(m);
  ir_graph_destroy(g);
  g = one_op(DT_F16, OP_SOFTMAX, 2, longrow, "p");
  m = generate(g, &aligned, "long rows");
  if (m) {
    CHECK(source_has(m, "smelt_block_reduce(") && source_has(m, "smelt_pack<__half, 8>"));
    /* 1024 chunks of 8 a row, and only 4 rows: one chunk a thread, so
     * that the GPU gets enough threads (reduction.c, CU_ROW_TARGET_THREADS) */
    CHECK(m->kernels[0].grid[0] == 4 && m->kernels[0].block[0] == 1024);
  }
  fmt_cuda_module_free(m);
  ir_graph_destroy(g);
}

static void test_units_and_launch_table(void) {
  OpSuite s;
  Graph *g = oc_suite(DT_F32, &s);
  CHECK(g != NULL);
  if (!g) return;
  CgCudaOptions o = {.max_units = 5};
  FmtCudaModule *m = generate(g, &o, "units");
  if (m) {
    CHECK(m->nunits == 5);
    /* every kernel in exactly the unit the table says; kernels of the same
     * code share the first one's function, defined once */
    int shared = 0;
    for (int i = 0; i < m->nkernels; i++) {
      char decl[160];
      snprintf(decl, sizeof decl, " %s(", m->kernels[i].symbol);
      for (int u = 0; u < m->nunits; u++) CHECK((strstr(m->units[u], decl) != NULL) == (u == m->kernels[i].unit));
      const char *at = strstr(m->units[m->kernels[i].unit], decl);
      CHECK(at && !strstr(at + 1, decl));
      int first = fmt_cuda_module_find(m, m->kernels[i].symbol);
      CHECK(first >= 0 && first <= i && strcmp(m->kernels[first].symbol, m->kernels[i].symbol) == 0);
      CHECK(fmt_cuda_module_find(m, m->kernels[i].name) == i);
      shared += first < i;
    }
    printf("units: %d kernels, %d of them launch an earlier kernel's function (the same code)\n", m->nkernels, shared);
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(fmt_cuda_launch_encode(m, &text, &len));
    FmtCudaModule *d = NULL;
    CHECK_OK(fmt_cuda_launch_decode(text, len, &d));
    if (d) {
      CHECK(d->nkernels == m->nkernels && d->nunits == m->nunits);
      for (int i = 0; i < m->nkernels && i < d->nkernels; i++) {
        CHECK(strcmp(d->kernels[i].symbol, m->kernels[i].symbol) == 0);
        CHECK(strcmp(d->kernels[i].name, m->kernels[i].name) == 0);
        CHECK(memcmp(d->kernels[i].grid, m->kernels[i].grid, sizeof d->kernels[i].grid) == 0);
        CHECK(memcmp(d->kernels[i].block, m->kernels[i].block, sizeof d->kernels[i].block) == 0);
        CHECK(d->kernels[i].unit == m->kernels[i].unit && d->kernels[i].nargs == m->kernels[i].nargs);
        CHECK(strcmp(d->kernels[i].kind, m->kernels[i].kind) == 0);
      }
    }
    fmt_cuda_module_free(d);
    {
      /* the variant, the workspace and TMA descriptors travel too */
      const char *t2 = "smelt-cuda-launch 2\nunits 1\nkernels 1\n"
                       "kernel k0 0 3 4 2 1 384 1 1 200000 matmul 0 wgmma:bm=128,bn=256,bk=64,st=4 4096 2 kname\n"
                       "tmap 0 1 2 4096 2048 8192 64 128 128\ntmap 1 1 2 4096 11008 8192 64 256 128\n";
      FmtCudaModule *x = NULL;
      smelt_status st = fmt_cuda_launch_decode(t2, strlen(t2), &x);
      CHECK(st == NULL && x);
      st_free(st);
      if (x) {
        const FmtCudaLaunch *l = &x->kernels[0];
        CHECK(strcmp(l->variant, "wgmma:bm=128,bn=256,bk=64,st=4") == 0 && l->workspace == 4096 && l->ntmaps == 2);
        CHECK(l->tmaps[1].arg == 1 && l->tmaps[1].rank == 2 && l->tmaps[1].dims[1] == 11008 &&
              l->tmaps[1].strides[0] == 8192 && l->tmaps[1].box[1] == 256 && l->tmaps[1].swizzle == 128);
        CHECK(!l->pdl); /* version 2 has no PDL field: launched without PDL */
        /* encoded again it is a version 3 table with PDL 0, which reads back the same */
        const char *t3 = "smelt-cuda-launch 3\nunits 1\nkernels 1\n"
                         "kernel k0 0 3 4 2 1 384 1 1 200000 matmul 0 wgmma:bm=128,bn=256,bk=64,st=4 4096 2 0 kname\n"
                         "tmap 0 1 2 4096 2048 8192 64 128 128\ntmap 1 1 2 4096 11008 8192 64 256 128\n";
        char *again = NULL;
        size_t again_len = 0;
        CHECK_OK(fmt_cuda_launch_encode(x, &again, &again_len));
        CHECK(again && strcmp(again, t3) == 0);
        free(again);
      }
      fmt_cuda_module_free(x);
      const char *t4 = "smelt-cuda-launch 3\nunits 1\nkernels 1\nkernel k0 0 1 8 1 1 128 1 1 0 matmul 1 - 0 0 1 kname\n";
      x = NULL;
      st = fmt_cuda_launch_decode(t4, strlen(t4), &x);
      CHECK(st == NULL && x && x->kernels[0].pdl && x->kernels[0].vectorised);
      st_free(st);
      fmt_cuda_module_free(x);
    }
    /* every generated kernel waits for its predecessors (PDL) */
    for (int i = 0; i < m->nkernels; i++) CHECK(m->kernels[i].pdl);
    /* untrusted input: every corruption is an error, never a crash */
    const char *bad[] = {
        "",
        "smelt-cuda-launch 1\nunits 1\nkernels 0\n",
        "smelt-cuda-launch 2\nunits 0\nkernels 0\n",
        "smelt-cuda-launch 2\nunits 1\nkernels 1\n",
        "smelt-cuda-launch 2\nunits 1\nkernels 1\nkernel k0 0 1 1 1 1 2048 1 1 0 elementwise 0 - 0 0 k0\n",
        "smelt-cuda-launch 2\nunits 1\nkernels 1\nkernel k0 1 1 1 1 1 32 1 1 0 elementwise 0 - 0 0 k0\n",
        "smelt-cuda-launch 2\nunits 1\nkernels 1\nkernel 0k 0 1 1 1 1 32 1 1 0 elementwise 0 - 0 0 k0\n",
        "smelt-cuda-launch 2\nunits 1\nkernels 1\nkernel k0 0 1 1 1 1 32 1 1 0 bogus 0 - 0 0 k0\n",
        "smelt-cuda-launch 2\nunits 1\nkernels 1\nkernel k0 0 1 0 1 1 32 1 1 0 matmul 0 - 0 0 k0\n",
        "smelt-cuda-launch 2\nunits 1\nkernels 1\nkernel k0 0 1 1 1 1 32 1 1 0 matmul 0 - 0 0 k0 extra\n",
        "smelt-cuda-launch 2\nunits 1\nkernels 1\nkernel k0 0 1 1 1 1 32 1 1 0 matmul 0 mma 0 5 k0\n",
        "smelt-cuda-launch 2\nunits 1\nkernels 1\nkernel k0 0 1 1 1 1 32 1 1 0 matmul 0 mma 0 1 k0\n",
        "smelt-cuda-launch 2\nunits 1\nkernels 1\nkernel k0 0 1 1 1 1 32 1 1 0 matmul 0 mma 0 1 k0\ntmap 1 1 2 64 64 128 64 64 128\n",
        "smelt-cuda-launch 2\nunits 1\nkernels 1\nkernel k0 0 1 1 1 1 32 1 1 0 matmul 0 mma 0 1 k0\ntmap 0 1 2 64 64 128 64 64 100\n",
        "smelt-cuda-launch 2\nunits 1\nkernels 1\nkernel k0 0 1 1 1 1 32 1 1 0 matmul 0 mma 0 1 k0\ntmap 0 1 2 64 64 120 64 64 128\n",
        "smelt-cuda-launch 2\nunits 1\nkernels 1\nkernel k0 0 1 1 1 1 32 1 1 0 matmul 0 mma 0 1 k0\ntmap 0 1 2 64 64 128 64 999 128\n",
        "smelt-cuda-launch 2\nunits 1\nkernels 1\nkernel k0 0 1 1 1 1 32 1 1 0 matmul 0 mma 0 1 k0\ntmap 0 1 2 64 64 128 64 64\n",
        /* version 3: the PDL field is 0 or 1, and it is there */
        "smelt-cuda-launch 3\nunits 1\nkernels 1\nkernel k0 0 1 1 1 1 32 1 1 0 matmul 0 - 0 0 2 k0\n",
        "smelt-cuda-launch 3\nunits 1\nkernels 1\nkernel k0 0 1 1 1 1 32 1 1 0 matmul 0 - 0 0 k0\n",
        "smelt-cuda-launch 2\nunits 1\nkernels 1\nkernel k0 0 1 1 1 1 32 1 1 0 matmul 0 - 0 0 1 k0\n",
        "smelt-cuda-launch 4\nunits 1\nkernels 0\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
      FmtCudaModule *x = NULL;
      smelt_status st = fmt_cuda_launch_decode(bad[i], strlen(bad[i]), &x);
      CHECK(st != NULL && x == NULL);
      if (st) CHECK(st_code(st) == ST_INVALID_INPUT);
      st_free(st);
    }
    if (len > 20) { /* every truncation of the good table fails cleanly or decodes fewer lines */
      for (size_t cut = 0; cut + 1 < len; cut += len / 17 + 1) {
        FmtCudaModule *x = NULL;
        smelt_status st = fmt_cuda_launch_decode(text, cut, &x);
        CHECK((st == NULL) != (x == NULL));
        st_free(st);
        fmt_cuda_module_free(x);
      }
    }
    free(text);
  }
  fmt_cuda_module_free(m);
  ir_graph_destroy(g);
}

static void test_arch_table(void) {
  CHECK(cg_cuda_onchip_budget("sm_90a") == 227 * 1024);
  CHECK(cg_cuda_onchip_budget("sm_90") == 227 * 1024);
  CHECK(cg_cuda_onchip_budget("sm_80") == 163 * 1024);
  CHECK(cg_cuda_onchip_budget("sm_86") == 99 * 1024);
  CHECK(cg_cuda_onchip_budget("nonsense") == 48 * 1024);
  CgCudaArchLimits l;
  cg_cuda_arch_limits("sm_90a", &l);
  CHECK(l.regs_per_sm == 65536 && l.smem_default == 48 * 1024);
  int cc = 0;
  bool sp = false;
  CHECK(ir_cuda_parse_arch("sm_90a", &cc, &sp) && cc == 90 && sp);
  CHECK(ir_cuda_parse_arch("compute_80", &cc, &sp) && cc == 80 && !sp);
  CHECK(ir_cuda_parse_arch("sm_120", &cc, &sp) && cc == 120);
  CHECK(!ir_cuda_parse_arch("sm_", &cc, &sp) && !ir_cuda_parse_arch("gfx90a", &cc, &sp) && !ir_cuda_parse_arch("sm_90ax", &cc, &sp));
  char h[65];
  cg_cuda_sha256_hex("abc", 3, h);
  CHECK(strcmp(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0);
  cg_cuda_sha256_hex("", 0, h);
  CHECK(strcmp(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") == 0);
}

static void test_cache(const char *dir) {
  if (!nvrtc) return;
  const char *src = "extern \"C\" __global__ void cache_probe(float *a) { a[threadIdx.x] += 1.0f; }\n";
  CgCudaBinary b1, b2, b3;
  CHECK_OK(cg_cuda_compile_source(nvrtc, src, "probe.cu", "sm_80", &copts, &b1));
  CHECK(!b1.cache_hit && b1.cubin_len > 0);
  CHECK_OK(cg_cuda_compile_source(nvrtc, src, "probe.cu", "sm_80", &copts, &b2));
  CHECK(b2.cache_hit && b2.cubin_len == b1.cubin_len && b2.cubin && b1.cubin && memcmp(b1.cubin, b2.cubin, b1.cubin_len) == 0);
  CHECK(b2.ptx && b1.ptx && strcmp(b1.ptx, b2.ptx) == 0);
  /* corrupt every entry: the next compile must notice and recompile */
  char sub[1100];
  snprintf(sub, sizeof sub, "%s/cuda", dir);
  DIR *d = opendir(sub);
  CHECK(d != NULL);
  int corrupted = 0;
  if (d) {
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      if (!strstr(e->d_name, ".bin")) continue;
      char p[1400];
      snprintf(p, sizeof p, "%s/%s", sub, e->d_name);
      FILE *fp = fopen(p, "r+b");
      if (!fp) continue;
      fseek(fp, 100, SEEK_SET);
      fputc(0x5a, fp);
      fclose(fp);
      corrupted++;
    }
    closedir(d);
  }
  CHECK(corrupted > 0);
  CHECK_OK(cg_cuda_compile_source(nvrtc, src, "probe.cu", "sm_80", &copts, &b3));
  CHECK(!b3.cache_hit && b3.cubin_len == b1.cubin_len);
  /* a different arch is a different entry */
  CgCudaBinary b4;
  CHECK_OK(cg_cuda_compile_source(nvrtc, src, "probe.cu", "sm_90a", &copts, &b4));
  CHECK(!b4.cache_hit);
  /* compile errors carry NVRTC's log */
  CgCudaBinary bad;
  smelt_status st = cg_cuda_compile_source(nvrtc, "__global__ void broken( { }", "broken.cu", "sm_80", &copts, &bad);
  CHECK(st != NULL);
  if (st) CHECK(strstr(st_message(st), "broken.cu") != NULL && strstr(st_message(st), "error") != NULL);
  st_free(st);
  st = cg_cuda_compile_source(nvrtc, src, "probe.cu", "gfx90a", &copts, &bad);
  CHECK(st != NULL && st_code(st) == ST_INVALID_INPUT);
  st_free(st);
  cg_cuda_binary_clear(&b1), cg_cuda_binary_clear(&b2), cg_cuda_binary_clear(&b3), cg_cuda_binary_clear(&b4);
}

static void test_absent(void) {
  const char *old = getenv("SMELT_NVRTC");
  char *saved = old ? strdup(old) : NULL;
  setenv("SMELT_NVRTC", "/nonexistent/libnvrtc.so", 1);
  CgNvrtc *nv = NULL;
  smelt_status st = cg_cuda_nvrtc_open(&nv);
  CHECK(st != NULL && nv == NULL && st_code(st) == ST_UNSUPPORTED);
  if (st) CHECK(strstr(st_message(st), "no NVRTC") != NULL);
  st_free(st);
  if (saved) setenv("SMELT_NVRTC", saved, 1);
  else unsetenv("SMELT_NVRTC");
  free(saved);

  setenv("SMELT_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
  RtCudaDevice *dev = NULL;
  st = rt_cuda_device_create(0, &dev);
  CHECK(st != NULL && dev == NULL && st_code(st) == ST_UNSUPPORTED);
  if (st) CHECK(strstr(st_message(st), "no CUDA driver") != NULL);
  st_free(st);
  int count = -1;
  st = rt_cuda_device_count(&count);
  CHECK(st != NULL && count == 0);
  st_free(st);
  /* the toolkit's stub driver exports every entry point and fails every
   * call: all symbols must resolve, and cuInit's failure means "no CUDA" */
  const char *stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
  if (access(stub, R_OK) == 0) {
    setenv("SMELT_LIBCUDA", stub, 1);
    st = rt_cuda_device_create(0, &dev);
    CHECK(st != NULL && dev == NULL && st_code(st) == ST_UNSUPPORTED);
    if (st) CHECK(strstr(st_message(st), "no usable CUDA device") != NULL && strstr(st_message(st), "cuInit") != NULL);
    st_free(st);
  } else {
    printf("SKIP: no stub libcuda at %s: driver symbol resolution not checked\n", stub);
  }
  unsetenv("SMELT_LIBCUDA");
}

/* ---- numerics without a GPU: the CPU emulation ---- */

static Graph *load_example_dims(const char *path, DType dtype, const FeDim *dims, int ndims) {
  FeOptions fo = {.dtype = dtype, .dims = dims, .ndims = ndims};
  Graph *g = NULL;
  smelt_status st = fe_load_yaml(path, &fo, &g);
  if (!st) {
    /* the CUDA pipeline: merged matmuls, [N, K] weights, prologues */
    PassCtx ctx = {.target = "cuda"};
    st = pass_run_pipeline(g, &ctx, NULL, NULL, NULL);
    pass_ctx_free(&ctx);
  }
  if (st) {
    fprintf(stderr, "%s: %s\n", path, st_message(st));
    st_free(st);
    check_failures++;
    ir_graph_destroy(g);
    return NULL;
  }
  return g;
}

static Graph *load_example(const char *path, DType dtype) { return load_example_dims(path, dtype, NULL, 0); }

static void test_emulated(void) {
  Exec e;
  const char *skip = NULL;
  CHECK_OK(h_exec_emulated(&e, &skip));
  if (skip) {
    printf("SKIP: emulated runs: %s\n", skip);
    return;
  }
  HStats stats = {0};
  CgCudaOptions opt = {.max_units = 1};
  DType dts[] = {DT_F32, DT_F16, DT_BF16, DT_F64};
  for (size_t i = 0; i < sizeof dts / sizeof *dts; i++)
    for (int fused = 0; fused < 2; fused++) {
      OpSuite s;
      Graph *g = fused ? oc_fused_suite(dts[i], &s) : oc_suite(dts[i], &s);
      if (!g) continue; /* reported by test_suites */
      char what[64];
      snprintf(what, sizeof what, "%s suite %s", fused ? "fused" : "op", dt_name(dts[i]));
      /* f32 also at an offset of 8 bytes: the vector paths' scalar fallback */
      for (size_t off = 0; off <= (dts[i] == DT_F32 ? 8u : 0u); off += 8) {
        Graph *c = ir_graph_clone(g);
        CHECK(h_check_graph(&e, c, &s, &opt, off, false, what, &stats) == 0);
        ir_graph_destroy(c);
      }
      ir_graph_destroy(g);
    }
  const char *examples[] = {"examples/mlp.yaml", "examples/cnn.yaml", "examples/gpt2_block.yaml", "examples/tiny_llama.yaml",
                            "tests/unit/models/epilogue_layout.yaml"};
  for (size_t i = 0; i < sizeof examples / sizeof *examples; i++)
    for (int h = 0; h < 2; h++) {
      Graph *g = load_example(examples[i], h ? DT_F16 : DT_INVALID);
      if (!g) continue;
      char what[128];
      snprintf(what, sizeof what, "%s%s", examples[i], h ? " (f16)" : "");
      CHECK(h_check_graph(&e, g, NULL, &opt, 0, true, what, &stats) == 0);
      ir_graph_destroy(g);
    }
  /* the causal LM at decode sizes: the KV-cache appends with the rope and
   * transposes of k and v in their loads (scatter prologue), the gated
   * pair's SwiGLU in the GEMV's epilogue (pair mode) */
  for (int64_t seq = 1; seq <= 4; seq += 3)
    for (int h = 0; h < 2; h++) {
      FeDim d = {.name = "seq", .value = seq};
      Graph *g = load_example_dims("examples/tiny_lm.yaml", h ? DT_F16 : DT_INVALID, &d, 1);
      if (!g) continue;
      int scatters = 0, glu = 0;
      for (int k = 0; k < g->ngroups; k++) {
        const Node *an = &g->node[g->groups[k].anchor];
        if (an->op == OP_SCATTER) scatters += g->groups[k].nnodes > 1;
        if (an->op == OP_MATMUL)
          for (int j = 0; j < g->groups[k].nnodes; j++) glu += g->node[g->groups[k].nodes[j]].op == OP_SILU;
      }
      CHECK(scatters == 4 && glu == 2); /* 2 layers: k and v with their producers; one SwiGLU each */
      char what[128];
      snprintf(what, sizeof what, "examples/tiny_lm.yaml seq=%lld%s", (long long)seq, h ? " (f16)" : "");
      CHECK(h_check_graph(&e, g, NULL, &opt, 0, true, what, &stats) == 0);
      ir_graph_destroy(g);
    }
  h_exec_close(&e);
  printf("emulated CUDA: %d values (%d elements) compared with the interpreter, %d failures, %d guard failures, worst %.2f of tolerance\n",
         stats.values, stats.elements, stats.failures, stats.guard_failures, stats.worst);
}

/* ---- ranged dims in the emulation ----
 * tiny_lm compiled for seq = 1..8 (compiler/ranges.c) runs at seq = d with
 * the kernels reading d through their rng argument: the first d rows of
 * ids and pos hold the run's tokens, the rows beyond hold stale values (as
 * a session's buffers do after a longer run), and the logits, next token
 * and both KV caches must be those of an exact seq = d build run by the
 * interpreter on the same tokens and starting caches. */

typedef struct {
  DType dt;
} RangedBuild;

static smelt_status ranged_build(void *ctx, const FeDim *dims, int ndims, bool probe, Graph **out) {
  (void)probe;
  const RangedBuild *rb = ctx;
  FeOptions fo = {.dtype = rb->dt, .dims = dims, .ndims = ndims};
  *out = NULL;
  RETURN_IF_ERROR(fe_load_yaml("examples/tiny_lm.yaml", &fo, out));
  PassCtx pc = {.target = "cuda"};
  smelt_status st = pass_run_pipeline(*out, &pc, NULL, NULL, NULL);
  pass_ctx_free(&pc);
  return st;
}

static int value_named(const Graph *g, const char *name) {
  for (int v = 0; v < g->nval; v++)
    if (g->val[v].name && strcmp(g->val[v].name, name) == 0) return v;
  return -1;
}

/* Runs the ranged graph r at seq = d against exact graph x; failures. */
static int ranged_case(Exec *e, Graph *r, Graph *x, int64_t d, const char *what) {
  int failures = 0;
  Kernel *k = NULL;
  int nk = 0;
  FmtCudaModule *m = NULL;
  CgCudaOptions o = {.max_units = 1, .emulation = true};
  Interp *it = NULL;
  void **xdata = calloc((size_t)x->nval, sizeof(void *)), **rdata = calloc((size_t)r->nval, sizeof(void *));
  uint64_t *buf = calloc((size_t)r->nval, sizeof(uint64_t)), rng = 0, ws = 0;
  bool *stored = calloc((size_t)r->nval, sizeof(bool));
  smelt_status st = xdata && rdata && buf && stored ? NULL : st_error(ST_NO_MEMORY, "out of memory");
  if (!st) st = cg_lower(r, &k, &nk);
  if (!st) st = cg_cuda_generate(r, k, nk, &o, &m);
  /* the reference: ids and positions 0..d-1 (h_interp_random), random caches */
  if (!st) st = h_interp_random(x, NULL, xdata, &it);
  /* the ranged graph's inputs and states: the same bytes in the first rows,
   * stale ones beyond (token 3 at position 0: valid, and not the run's) */
  for (int v = 0; v < r->nval && !st; v++) {
    const Value *rv = &r->val[v];
    bool state = ir_state_of(r, v) == v;
    if (rv->kind != VK_INPUT && !state) continue;
    int xv = value_named(x, rv->name);
    if (xv < 0 || !xdata[xv]) {
      st = st_error(ST_INTERNAL, "'%s' has no counterpart in the exact build", rv->name);
      break;
    }
    size_t rb = ir_type_bytes(&rv->type), xb = ir_type_bytes(&x->val[xv].type);
    rdata[v] = calloc(1, rb ? rb : 1);
    if (!rdata[v]) {
      st = st_error(ST_NO_MEMORY, "out of memory");
      break;
    }
    for (int64_t j = 0; dt_is_int(rv->type.dt) && j < ir_type_numel(&rv->type); j++)
      dt_store(rv->type.dt, rdata[v], (size_t)j, strcmp(rv->name, "ids") == 0 ? 3.0 : 0.0);
    memcpy(rdata[v], xdata[xv], xb < rb ? xb : rb); /* [seq] inputs and whole states: the leading bytes */
  }
  if (!st) st = e->load(e, m);
  if (!st) st = h_upload_guarded(e, r, k, nk, rdata, 0, buf, stored);
  int64_t rv[IR_MAX_RANGES] = {d};
  if (!st) st = h_kernel_scratch(e, r, m, nk, rv, &rng, &ws);
  if (!st) st = h_launch_all(e, k, nk, m, buf, 0, rng, ws);
  /* the outputs (not ranged) and the caches after the appends */
  for (int v = 0; v < r->nval && !st; v++) {
    bool out = false;
    for (int i = 0; i < r->noutputs; i++) out |= r->outputs[i] == v;
    int sv = ir_state_of(r, v);
    if (!out && !(sv >= 0 && sv != v)) continue;
    int xv = value_named(x, r->val[v].name);
    const void *ref = xv >= 0 ? ir_interp_value(it, xv) : NULL;
    unsigned char *host = NULL;
    ssize_t guard = 0;
    if (!ref || !buf[v]) {
      fprintf(stderr, "%s: '%s' was not computed\n", what, r->val[v].name);
      failures++;
      continue;
    }
    st = h_download_guarded(e, r, v, buf[v], 0, &host, &guard);
    double rel = 0, cos = 1;
    if (!st && (guard || !h_compare_tensor(r->val[v].type.dt, host + H_GUARD, ref, ir_type_numel(&r->val[v].type), &rel, &cos))) {
      fprintf(stderr, "%s: '%s' differs from the exact build's (max error %.3g of the largest magnitude, cosine %.6f, guard %zd)\n",
              what, r->val[v].name, rel, cos, guard);
      failures++;
    }
    free(host);
  }
  if (st) {
    fprintf(stderr, "%s: %s\n", what, st_message(st));
    st_free(st);
    failures++;
  }
  if (m) e->unload(e);
  for (int v = 0; buf && v < r->nval; v++)
    if (buf[v] && !(ir_state_of(r, v) >= 0 && ir_state_of(r, v) != v)) e->free(e, buf[v]);
  if (rng) e->free(e, rng);
  if (ws) e->free(e, ws);
  for (int v = 0; xdata && v < x->nval; v++) free(xdata[v]);
  for (int v = 0; rdata && v < r->nval; v++) free(rdata[v]);
  free(xdata), free(rdata), free(buf), free(stored);
  ir_interp_destroy(it);
  fmt_cuda_module_free(m);
  cg_kernels_free(k, nk);
  return failures;
}

static void test_emulated_ranged(void) {
  Exec e;
  const char *skip = NULL;
  CHECK_OK(h_exec_emulated(&e, &skip));
  if (skip) {
    printf("SKIP: emulated ranged runs: %s\n", skip);
    return;
  }
  int cases = 0;
  for (int h = 0; h < 2; h++) {
    RangedBuild rb = {h ? DT_F16 : DT_INVALID};
    FeDim range = {.name = "seq", .value = 1, .max = 8};
    Graph *r = NULL;
    smelt_status st = sc_build_ranged(ranged_build, &rb, &range, 1, &r);
    if (st) {
      fprintf(stderr, "tiny_lm seq=1..8: %s\n", st_message(st));
      st_free(st);
      check_failures++;
      continue;
    }
    CHECK(r->nranges == 1);
    const int64_t lens[] = {1, 3, 8};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
      FeDim exact = {.name = "seq", .value = lens[i]};
      Graph *x = NULL;
      st = ranged_build(&rb, &exact, 1, false, &x);
      if (st) {
        fprintf(stderr, "tiny_lm seq=%lld: %s\n", (long long)lens[i], st_message(st));
        st_free(st);
        check_failures++;
        ir_graph_destroy(x);
        continue;
      }
      char what[96];
      snprintf(what, sizeof what, "tiny_lm seq=1..8 at %lld%s", (long long)lens[i], h ? " (f16)" : "");
      CHECK(ranged_case(&e, r, x, lens[i], what) == 0);
      cases++;
      ir_graph_destroy(x);
    }
    ir_graph_destroy(r);
  }
  h_exec_close(&e);
  printf("emulated CUDA, ranged: %d runs of a seq=1..8 tiny_lm against exact builds\n", cases);
}

/* ---- matmul variants: tensor cores, GEMV, the simple kernel ----
 * Matmuls (with fused epilogues, batched, transpose_b, ragged shapes) go
 * through the default pipeline; each must pick the expected variant, compile
 * with NVRTC for sm_90a and sm_80, and (small shapes) run in the CPU
 * emulation against the interpreter, with aligned buffers and 8 bytes off
 * (the tensor-core kernel's plain-copy path).  The emulation runs the
 * tensor-core kernel too: its host branch stands in for ldmatrix and
 * mma.sync with warp shuffles (mma.c). */

typedef struct {
  const char *dt;
  const char *a_shape, *b_shape; /* YAML shapes */
  int64_t n; /* the result's columns */
  bool tb;
  const char *epi; /* "", "bias_silu", "gelu_res", "mul" */
  const char *variant;
  bool emulate;
} TcCase;

static Graph *tc_graph(const TcCase *c, int64_t n_out) {
  char path[] = "/tmp/smelt-tc-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return NULL;
  FILE *fp = fdopen(fd, "w");
  fprintf(fp, "smelt: 1\nname: tc\nseed: 5\ndtype: %s\ninputs:\n  x: {shape: %s}\n", c->dt, c->a_shape);
  if (!strcmp(c->epi, "gelu_res") || !strcmp(c->epi, "mul")) fprintf(fp, "  r: {shape: [%lld]}\n", (long long)n_out);
  fprintf(fp, "params:\n  w: {shape: %s, init: {normal: 0.1}}\n  bias: {shape: [%lld], init: {normal: 0.5}}\nnodes:\n",
          c->b_shape, (long long)n_out);
  fprintf(fp, "  - {out: y0, op: matmul, in: [x, w]%s}\n", c->tb ? ", transpose_b: true" : "");
  const char *last = "y0";
  if (!strcmp(c->epi, "bias_silu")) {
    fprintf(fp, "  - {out: y1, op: add, in: [y0, bias]}\n  - {out: y2, op: silu, in: [y1]}\n");
    last = "y2";
  } else if (!strcmp(c->epi, "gelu_res")) {
    fprintf(fp, "  - {out: y1, op: gelu, in: [y0]}\n  - {out: y2, op: add, in: [y1, r]}\n");
    last = "y2";
  } else if (!strcmp(c->epi, "mul")) {
    fprintf(fp, "  - {out: y1, op: relu, in: [y0]}\n  - {out: y2, op: mul, in: [y1, r]}\n");
    last = "y2";
  }
  fprintf(fp, "outputs: [%s]\n", last);
  fclose(fp);
  Graph *g = load_example(path, DT_INVALID);
  unlink(path);
  return g;
}

static void test_matmul_variants(void) {
  static const TcCase cases[] = {
      {"f16", "[37, 40]", "[40, 24]", 24, false, "bias_silu", "tensor cores", true},
      {"bf16", "[130, 64]", "[136, 64]", 136, true, "gelu_res", "tensor cores", true},
      {"f16", "[9, 16]", "[16, 8]", 8, false, "mul", "tensor cores", true},
      {"f16", "[3, 2, 20, 16]", "[2, 16, 24]", 24, false, "", "tensor cores", true},
      {"bf16", "[2, 1, 33, 24]", "[3, 16, 24]", 16, true, "bias_silu", "tensor cores", true},
      {"f16", "[1, 64]", "[64, 40]", 40, false, "bias_silu", "GEMV", true},
      {"f16", "[5, 72]", "[24, 72]", 24, true, "gelu_res", "GEMV", true},
      {"bf16", "[8, 48]", "[48, 2056]", 2056, false, "mul", "GEMV", true},
      {"f32", "[3, 20]", "[20, 12]", 12, false, "bias_silu", "GEMV", true},
      {"f16", "[2, 7, 32]", "[32, 16]", 16, false, "", "GEMV", true},
      {"f16", "[9, 36]", "[36, 20]", 20, false, "bias_silu", "simple", true},
      {"f16", "[9, 32]", "[32, 21]", 21, false, "", "simple", true},
      {"f16", "[7, 31]", "[31, 21]", 21, false, "", "simple", true},
      {"f32", "[40, 32]", "[32, 24]", 24, false, "bias_silu", "simple", true},
      {"f16", "[2048, 4096]", "[4096, 11008]", 11008, false, "bias_silu", "tensor cores", false},
      {"bf16", "[1000, 4096]", "[4096, 4096]", 4096, true, "", "tensor cores", false},
      {"f16", "[1, 4096]", "[4096, 11008]", 11008, false, "", "GEMV", false},
      {"f16", "[1, 11008]", "[4096, 11008]", 4096, true, "", "GEMV", false},
  };
  Exec e;
  const char *skip = NULL;
  CHECK_OK(h_exec_emulated(&e, &skip));
  if (skip) printf("SKIP: emulated matmul variants: %s\n", skip);
  HStats stats = {0};
  int emulated = 0;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const TcCase *c = &cases[i];
    int64_t n_out = c->n;
    char what[160];
    snprintf(what, sizeof what, "matmul %s %s x %s%s %s", c->dt, c->a_shape, c->b_shape, c->tb ? "^T" : "", c->epi);
    Graph *g = tc_graph(c, n_out);
    if (!g) {
      fprintf(stderr, "%s: could not build the graph\n", what);
      check_failures++;
      continue;
    }
    const char *want = c->variant;
    for (int al = 0; al < 2; al++) {
      CgCudaOptions opt = {.args_aligned = al == 1, .max_units = 1};
      Graph *cl = ir_graph_clone(g);
      FmtCudaModule *m = generate(cl, &opt, what);
      if (m) {
        char needle[64];
        snprintf(needle, sizeof needle, "// variant: %s", want);
        if (!source_has(m, needle)) {
          fprintf(stderr, "%s: expected the '%s' variant\n", what, want);
          check_failures++;
        }
        compile_all(m, what);
        fmt_cuda_module_free(m);
      }
      ir_graph_destroy(cl);
    }
    if (c->emulate && !skip) {
      /* 8 bytes off (the plain-copy path) for every third case: the emulation is slow */
      for (size_t off = 0; off <= (i % 3 == 0 ? 8u : 0u); off += 8) {
        Graph *cl = ir_graph_clone(g);
        CgCudaOptions opt = {.max_units = 1};
        CHECK(h_check_graph(&e, cl, NULL, &opt, off, false, what, &stats) == 0);
        ir_graph_destroy(cl);
        emulated++;
      }
    }
    ir_graph_destroy(g);
  }
  if (!skip) {
    h_exec_close(&e);
    printf("matmul variants: %d emulated runs, %d values compared with the interpreter, %d failures, worst %.2f of tolerance\n",
           emulated, stats.values, stats.failures, stats.worst);
  }
}

static void rm_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char p[2048];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    struct stat sb;
    if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) rm_tree(p);
    else unlink(p);
  }
  closedir(d);
  rmdir(dir);
}

int main(void) {
  char dir[] = "/tmp/smelt-cuda-cache-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  copts.cache_dir = dir;

  smelt_status st = cg_cuda_nvrtc_open(&nvrtc);
  if (st) {
    char line[600];
    snprintf(line, sizeof line, "NVRTC not available (%s): CUDA sources are generated and checked but not compiled",
             st_message(st));
    check_skip_part("nvrtc", line);
    st_free(st);
  } else {
    printf("NVRTC %s, include dir '%s'\n", cg_cuda_nvrtc_version(nvrtc), cg_cuda_nvrtc_include_dir(nvrtc));
  }
  test_arch_table();
  test_vector_choice();
  test_units_and_launch_table();
  test_absent();
  test_cache(dir);
  test_suites();
  test_examples();
  test_emulated();
  test_emulated_ranged();
  test_matmul_variants();
  if (nvrtc) printf("compiled %d (unit, arch) pairs for sm_90a and sm_80\n", units_compiled);
  cg_cuda_nvrtc_close(nvrtc);
  rm_tree(dir);
  return check_done("test_cuda_codegen");
}
