/* conv2d on the tensor cores (the mma family's implicit GEMM, mma.c),
 * without a GPU.
 *
 * Each case is a YAML model whose input x feeds several conv2d nodes
 * cv<i> (the same shape, one weight each), every one with the case's
 * epilogue and producer, each kernel forced to its own mma token
 * (CgCudaOptions.force), the last left to the heuristic.  The shapes are
 * ragged against every tile: N = batch x OH x OW odd (a partial B chunk
 * and no column pairs in the epilogue) and even; K = Cg KH KW a multiple of
 * 8 (the weight copied with cp.async) and not (147: the weight computed in
 * registers, as for ResNet's first conv); 1x1 convs whose x is copied
 * with cp.async (HW a multiple of 8; of 4, by halves) and computed (odd
 * HW); strides, dilations, asymmetric
 * pads, groups, a bias, a fused relu epilogue and a fused producer of x.
 * The model
 *   - runs in the CPU emulation (tests/gpu/cuda_emu.hpp) against the
 *     reference interpreter (every element, guard regions), with run-time
 *     alignment tests, with every buffer 8 bytes off, and with
 *     args_aligned;
 *   - is generated for sm_90a and sm_80; every forced kernel records its
 *     token, the heuristic picks mma for f16/bf16 and the simple kernel for
 *     f32 and depthwise convs, and NVRTC compiles each unit.
 */
#define _GNU_SOURCE /* RTLD_NODELETE in harness.h */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/cuda/cg_cuda.h"
#include "codegen/lower.h"
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "tests/gpu/harness.h"
#include "tests/unit/check.h"

#define MAX_CONVS 6

static CgNvrtc *nvrtc;
static CgCudaCompileOptions copts;

typedef struct {
  const char *name, *dt;
  int64_t n, c, h, w, o, kh, kw;
  int64_t sh, sw, pads[4], dh, dw, groups;
  bool bias;
  const char *epi;      /* "", "relu" */
  const char *producer; /* "", "add": x + r (a [C, 1, 1] row) feeds the convs */
  const char *toks[MAX_CONVS]; /* NULL-terminated; one conv more for the heuristic */
  const char *expect;   /* the heuristic's family prefix: "mma:" or "simple" */
} Case;

static int ntoks(const Case *c) {
  int n = 0;
  while (n < MAX_CONVS - 1 && c->toks[n]) n++;
  return n;
}

static Graph *case_graph(const Case *c) {
  char path[] = "/tmp/smelt-conv-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return NULL;
  FILE *fp = fdopen(fd, "w");
  int count = ntoks(c) + 1;
  fprintf(fp, "smelt: 1\nname: conv\nseed: 5\ndtype: %s\ninputs:\n  x: {shape: [%lld, %lld, %lld, %lld]}\n", c->dt,
          (long long)c->n, (long long)c->c, (long long)c->h, (long long)c->w);
  if (!strcmp(c->producer, "add")) fprintf(fp, "  r: {shape: [%lld, 1, 1]}\n", (long long)c->c);
  fprintf(fp, "params:\n");
  for (int i = 0; i < count; i++)
    fprintf(fp, "  w%d: {shape: [%lld, %lld, %lld, %lld], init: {normal: 0.2}}\n", i, (long long)c->o,
            (long long)(c->c / c->groups), (long long)c->kh, (long long)c->kw);
  if (c->bias) fprintf(fp, "  b: {shape: [%lld], init: {normal: 0.5}}\n", (long long)c->o);
  fprintf(fp, "nodes:\n");
  const char *x = "x";
  if (!strcmp(c->producer, "add")) fprintf(fp, "  - {out: xr, op: add, in: [x, r]}\n"), x = "xr";
  for (int i = 0; i < count; i++) {
    fprintf(fp, "  - {out: cv%d, op: conv2d, in: [%s, w%d%s], strides: [%lld, %lld], pads: [%lld, %lld, %lld, %lld], "
                "dilations: [%lld, %lld], groups: %lld}\n",
            i, x, i, c->bias ? ", b" : "", (long long)c->sh, (long long)c->sw, (long long)c->pads[0],
            (long long)c->pads[1], (long long)c->pads[2], (long long)c->pads[3], (long long)c->dh, (long long)c->dw,
            (long long)c->groups);
    if (!strcmp(c->epi, "relu")) fprintf(fp, "  - {out: y%d, op: relu, in: [cv%d]}\n", i, i);
    else fprintf(fp, "  - {out: y%d, op: neg, in: [cv%d]}\n", i, i);
  }
  fprintf(fp, "outputs: [");
  for (int i = 0; i < count; i++) fprintf(fp, "%sy%d", i ? ", " : "", i);
  fprintf(fp, "]\n");
  fclose(fp);
  return h_load_temp_model(path, path);
}

/* The index i of conv "cv<i>" that kernel k computes, or -1. */
static int conv_index(const Graph *g, const Kernel *k) {
  int count;
  int a = cg_group_anchor(g, &g->groups[k->group], &count);
  if (a < 0 || g->node[a].op != OP_CONV2D) return -1;
  const char *name = g->val[g->node[a].out[0]].name;
  return strncmp(name, "cv", 2) == 0 ? atoi(name + 2) : -1;
}

/* force[i] per kernel: its conv's token, NULL for the heuristic's conv and
 * other kernels; *last: the kernel of the heuristic's conv. */
static const char **force_table(const Case *c, Graph *g, int *out_nk, int *last) {
  Kernel *k = NULL;
  int nk = 0;
  CHECK_OK(cg_lower(g, &k, &nk));
  const char **force = calloc((size_t)(nk ? nk : 1), sizeof *force);
  int nt = ntoks(c);
  *last = -1;
  int convs = 0;
  for (int i = 0; i < nk && force; i++) {
    int ci = conv_index(g, &k[i]);
    if (ci < 0) continue;
    convs++;
    if (ci < nt) force[i] = c->toks[ci];
    else *last = i;
  }
  CHECK(convs == nt + 1); /* each conv is a kernel of its own */
  cg_kernels_free(k, nk);
  *out_nk = nk;
  return force;
}

static void generate_and_compile(const Case *c, Graph *g, const char **force, int nk, int last, const char *arch,
                                 bool args_aligned) {
  Kernel *k = NULL;
  int n = 0;
  CHECK_OK(cg_lower(g, &k, &n));
  CHECK(n == nk);
  CgCudaOptions opt = {.args_aligned = args_aligned, .max_units = 2, .force = force, .arch = arch};
  FmtCudaModule *m = NULL;
  smelt_status st = cg_cuda_generate(g, k, n, &opt, &m);
  if (st) {
    fprintf(stderr, "%s (%s): %s\n", c->name, arch, st_message(st));
    st_free(st);
    check_failures++;
  }
  for (int i = 0; m && i < m->nkernels; i++) {
    if (force[i] && strcmp(force[i], m->kernels[i].variant) != 0) {
      fprintf(stderr, "%s (%s): kernel %s was forced to %s but used %s\n", c->name, arch, m->kernels[i].name, force[i],
              m->kernels[i].variant);
      check_failures++;
    }
    if (i == last && strncmp(m->kernels[i].variant, c->expect, strlen(c->expect)) != 0) {
      fprintf(stderr, "%s (%s): the heuristic chose %s, expected %s\n", c->name, arch, m->kernels[i].variant, c->expect);
      check_failures++;
    }
  }
  if (m && nvrtc) {
    CgCudaBinary *bins = NULL;
    st = cg_cuda_compile_module(nvrtc, m, &arch, 1, &copts, &bins);
    if (st) {
      fprintf(stderr, "%s (%s): %s\n", c->name, arch, st_message(st));
      st_free(st);
      check_failures++;
    } else {
      cg_cuda_binaries_free(bins, m->nunits);
    }
  }
  fmt_cuda_module_free(m);
  cg_kernels_free(k, n);
}

static void run_case(Exec *e, const Case *c, HStats *stats) {
  Graph *g = case_graph(c);
  if (!g) {
    fprintf(stderr, "%s: no graph\n", c->name);
    check_failures++;
    return;
  }
  int nk = 0, last = -1;
  const char **force = force_table(c, g, &nk, &last);
  if (!force) {
    ir_graph_destroy(g);
    return;
  }
  if (e) {
    struct {
      bool aligned_opt;
      size_t offset;
    } runs[] = {{false, 0}, {false, 8}, {true, 0}};
    for (int r = 0; r < 3; r++) {
      CgCudaOptions opt = {.args_aligned = runs[r].aligned_opt, .max_units = 1, .force = force, .arch = "sm_90a"};
      Graph *cl = ir_graph_clone(g);
      CHECK(h_check_graph(e, cl, NULL, &opt, runs[r].offset, false, c->name, stats) == 0);
      ir_graph_destroy(cl);
    }
  }
  generate_and_compile(c, g, force, nk, last, "sm_90a", true);
  generate_and_compile(c, g, force, nk, last, "sm_80", false);
  printf("%-40s %d forced variants + the heuristic's (%s)\n", c->name, ntoks(c), c->expect);
  free(force);
  ir_graph_destroy(g);
}

int main(void) {
  char dir[] = "/tmp/smelt-conv-cache-XXXXXX";
  bool dir_ok;
  nvrtc = h_nvrtc_open(dir, &copts, &dir_ok);
  CHECK(dir_ok);
  static const Case cases[] = {
      /* 3x3, pad 1: N = 81 (odd: no pairs, a partial chunk), K = 72 (weight by cp.async), bias + relu */
      {"f16 3x3 pad 1, odd N, bias, relu", "f16", 1, 8, 9, 9, 16, 3, 3, 1, 1, {1, 1, 1, 1}, 1, 1, 1, true, "relu", "",
       {"mma:bm=64,bn=64,bk=32,wm=32,wn=32,st=3,sk=1", "mma:bm=32,bn=128,bk=16,wm=32,wn=32,st=2,sk=3",
        "mma:bm=64,bn=64,bk=16,wm=16,wn=32,st=4,sk=2"},
       "mma:"},
      /* ResNet's first conv in small: 7x7 stride 2 pad 3, K = 147 (weight in registers), batch 2 */
      {"bf16 7x7 stride 2, K 147, batch 2", "bf16", 2, 3, 11, 11, 24, 7, 7, 2, 2, {3, 3, 3, 3}, 1, 1, 1, true, "relu",
       "", {"mma:bm=32,bn=64,bk=32,wm=16,wn=32,st=2,sk=1", "mma:bm=64,bn=128,bk=64,wm=32,wn=64,st=3,sk=3"}, "mma:"},
      /* 1x1 stride 2 (a ResNet downsample), a fused producer x + r */
      {"f16 1x1 stride 2, fused producer", "f16", 1, 16, 8, 8, 32, 1, 1, 2, 2, {0, 0, 0, 0}, 1, 1, 1, false, "", "add",
       {"mma:bm=32,bn=32,bk=16,wm=16,wn=16,st=2,sk=1", "mma:bm=64,bn=64,bk=32,wm=32,wn=32,st=3,sk=1"}, "mma:"},
      /* 1x1 stride 1, HW = 24 (x read with cp.async), batch 2, groups 2, bias; then HW = 25 (registers) */
      {"f16 1x1 direct, batch 2, groups 2", "f16", 2, 32, 4, 6, 32, 1, 1, 1, 1, {0, 0, 0, 0}, 1, 1, 2, true, "relu", "",
       {"mma:bm=32,bn=32,bk=16,wm=16,wn=16,st=2,sk=1", "mma:bm=64,bn=64,bk=16,wm=32,wn=32,st=4,sk=2"}, "mma:"},
      {"f16 1x1 direct by halves, HW 12, batch 3", "f16", 3, 16, 3, 4, 24, 1, 1, 1, 1, {0, 0, 0, 0}, 1, 1, 1, true, "", "",
       {"mma:bm=32,bn=32,bk=16,wm=16,wn=16,st=2,sk=1", "mma:bm=32,bn=64,bk=16,wm=32,wn=32,st=3,sk=2"}, "mma:"},
      {"bf16 1x1, odd HW", "bf16", 1, 24, 5, 5, 16, 1, 1, 1, 1, {0, 0, 0, 0}, 1, 1, 1, false, "", "",
       {"mma:bm=32,bn=32,bk=16,wm=16,wn=16,st=3,sk=1"}, "mma:"},
      /* groups 2 (Og 16), dilation 2, asymmetric pads, rectangular kernel */
      {"f16 grouped, dilated, 3x2", "f16", 1, 16, 7, 8, 32, 3, 2, 1, 2, {2, 0, 1, 2}, 2, 1, 2, true, "", "",
       {"mma:bm=32,bn=64,bk=16,wm=32,wn=32,st=3,sk=2"}, "mma:"},
      /* long K split in 5 slices: 32 x 3 x 3 = 288 */
      {"bf16 K 288 split-K", "bf16", 1, 32, 6, 6, 40, 3, 3, 1, 1, {1, 1, 1, 1}, 1, 1, 1, true, "relu", "",
       {"mma:bm=64,bn=64,bk=16,wm=32,wn=32,st=3,sk=5"}, "mma:"},
      /* the simple kernel stays for f32 and depthwise */
      {"f32 3x3 (simple)", "f32", 1, 8, 6, 6, 16, 3, 3, 1, 1, {1, 1, 1, 1}, 1, 1, 1, true, "", "", {NULL}, "simple"},
      {"f16 depthwise (simple)", "f16", 1, 16, 6, 6, 16, 3, 3, 1, 1, {1, 1, 1, 1}, 1, 1, 16, true, "", "", {NULL},
       "simple"},
  };
  Exec e;
  const char *skip = NULL;
  CHECK_OK(h_exec_emulated(&e, &skip));
  if (skip) check_skip_part("emulation", skip);
  HStats stats = {0};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(skip ? NULL : &e, &cases[i], &stats);
  if (!skip) {
    printf("emulated: %d values (%d elements) compared with the interpreter, %d failures, %d guard failures, worst %.2f of tolerance\n",
           stats.values, stats.elements, stats.failures, stats.guard_failures, stats.worst);
    h_exec_close(&e);
  }
  cg_cuda_nvrtc_close(nvrtc);
  rmdir(dir);
  return check_done("test_cuda_conv");
}
