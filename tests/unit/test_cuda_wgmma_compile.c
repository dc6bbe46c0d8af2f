/* The Hopper matmul (codegen/cuda/wgmma.c) without a GPU.
 *
 * Tokens: parse/format round trips and rejections (split-K's ",sk=N"
 * optional, printed only when N > 1); eligibility (only
 * sm_90a, f16/bf16, B given as [N, K], K a multiple of 8, aligned
 * arguments, batch shapes the tensor maps can express).  Then, for
 * matmuls with fused epilogues over ragged and batched shapes, every
 * wgmma candidate the backend lists (cg_cuda_variants for sm_90a):
 *   - the launch: the variant recorded, 128 x (1 + consumers) threads,
 *     one block per work unit (tile x slice) up to 132, the shared memory
 *     the stages need, split-K's workspace (counters, then the partial
 *     tiles), and the
 *     two TMA descriptors exactly as the kernel reads them (dims innermost
 *     first {K, rows[, Z]}, row stride K * 2 bytes, box {64, BM or BN},
 *     128B swizzle);
 *   - NVRTC compiles the unit for sm_90a with ptxas reporting (-v): no
 *     error, no warning, no spill, no stack frame, no serialised wgmma;
 *     the default candidate also for sm_80 (where the kernel is a trap),
 *     so a bundle's source still compiles for another GPU;
 *   - the CPU emulation (the default candidate of every case, and every
 *     candidate of one; tests/gpu/cuda_emu.hpp with the kernel's host
 *     stand-ins for TMA, mbarriers and wgmma) runs it, and the results are
 *     compared with the reference interpreter: this checks the tiling, the
 *     swizzle and descriptor addressing, the fragment layout, the barrier
 *     protocol and the epilogue, as far as the stand-ins follow the PTX ISA;
 *     split-K variants run twice on one workspace, which must be all zero
 *     after each run.
 * Split-K is also forced onto ragged, odd-N, batched, bf16 and fused cases
 * (slices up to the number of K tiles; one with more units than blocks, so
 * that the last slice to count is not always the last slice), a split
 * beyond the K tiles must be refused, and the heuristic's picks for the
 * W4 prefill matmuls (M = 512) must not split K (measured slower).
 * Without NVRTC (or a host C++ compiler) those parts are skipped, visibly.
 */
#define _GNU_SOURCE /* RTLD_NODELETE in harness.h */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/cuda/cg_cuda.h"
#include "codegen/lower.h"
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "tests/gpu/harness.h"
#include "tests/unit/check.h"

/* The private declarations under test (parse/format/eligibility). */
#include "codegen/cuda/cu_families.h"

/* ---- models ---- */

typedef struct {
  const char *dt;
  int64_t za, zb; /* 0: no batch dim; else the operand's leading dim */
  int64_t M, K, N;
  const char *epi; /* "", "bias_silu" (bias [N], silu), "res" (+ r [.., M, N]) */
  bool tb;         /* B given as [N, K] */
} WgCase;

static Graph *wg_graph(const WgCase *c) {
  return h_batched_matmul_model(5, c->dt, c->za, c->zb, c->M, c->K, c->N, c->epi, c->tb);
}

static void case_name(const WgCase *c, char *buf, size_t n) {
  snprintf(buf, n, "%s %s[%lld,%lld]x%s[%lld,%lld]%s%s%s", c->dt, c->za ? "batched " : "", (long long)c->M,
           (long long)c->K, c->zb ? "batched " : "", (long long)c->N, (long long)c->K, c->tb ? "^T" : "",
           c->epi[0] ? " + " : "", c->epi);
}

/* The wgmma tokens cg_cuda_variants lists for the graph's one kernel. */
static int wgmma_variants(Graph *g, const char *arch, char (*out)[CG_VARIANT_LEN], int max) {
  Kernel *k = NULL;
  int nk = 0;
  smelt_status st = cg_lower(g, &k, &nk);
  if (st) {
    fprintf(stderr, "cg_lower: %s\n", st_message(st));
    st_free(st);
    check_failures++;
    return 0;
  }
  CHECK(nk == 1);
  char all[64][CG_VARIANT_LEN];
  int n = nk == 1 ? cg_cuda_variants(g, &k[0], arch, all, 64) : 0, got = 0;
  for (int i = 0; i < n && got < max; i++)
    if (!strncmp(all[i], "wgmma:", 6)) memcpy(out[got++], all[i], CG_VARIANT_LEN);
  cg_kernels_free(k, nk);
  return got;
}

/* ---- NVRTC with ptxas's report ---- */

typedef struct {
  void *lib;
  int (*create)(void **, const char *, const char *, int, const char *const *, const char *const *);
  int (*destroy)(void **);
  int (*compile)(void *, int, const char *const *);
  int (*log_size)(void *, size_t *);
  int (*log)(void *, char *);
  char include_opt[1100];
} Nv;

static bool nv_open(Nv *nv, const char *include_dir) {
  static const char *const names[] = {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", "/usr/local/cuda/lib64/libnvrtc.so"};
  memset(nv, 0, sizeof *nv);
  for (size_t i = 0; i < sizeof names / sizeof *names && !nv->lib; i++)
    nv->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!nv->lib) return false;
  *(void **)&nv->create = dlsym(nv->lib, "nvrtcCreateProgram");
  *(void **)&nv->destroy = dlsym(nv->lib, "nvrtcDestroyProgram");
  *(void **)&nv->compile = dlsym(nv->lib, "nvrtcCompileProgram");
  *(void **)&nv->log_size = dlsym(nv->lib, "nvrtcGetProgramLogSize");
  *(void **)&nv->log = dlsym(nv->lib, "nvrtcGetProgramLog");
  snprintf(nv->include_opt, sizeof nv->include_opt, "-I%s", include_dir);
  return nv->create && nv->destroy && nv->compile && nv->log_size && nv->log;
}

/* Compiles src for arch with ptxas -v; returns NVRTC's result, *out_log
 * the program log (malloc'd). */
static int nv_compile(Nv *nv, const char *src, const char *arch, char **out_log) {
  void *p = NULL;
  *out_log = NULL;
  if (nv->create(&p, src, "wgmma.cu", 0, NULL, NULL) != 0) return -1;
  char archopt[64];
  snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
  const char *opts[] = {archopt, "--std=c++17", nv->include_opt, "--ptxas-options=-v"};
  int r = nv->compile(p, 4, opts);
  size_t n = 0;
  if (nv->log_size(p, &n) == 0 && (*out_log = malloc(n + 1)) != NULL) {
    if (nv->log(p, *out_log) != 0) (*out_log)[0] = 0;
    (*out_log)[n] = 0;
  }
  nv->destroy(&p);
  return r;
}

/* ptxas's line "Used N registers" for the kernel, or -1. */
static int used_registers(const char *log) {
  const char *u = strstr(log, "Used ");
  int r = -1;
  if (u) sscanf(u, "Used %d registers", &r);
  return r;
}

static bool contains_ci(const char *s, const char *word) {
  size_t n = strlen(word);
  for (; *s; s++)
    if (!strncasecmp(s, word, n)) return true;
  return false;
}

/* ---- the CPU emulation ---- */

static const char *storage_type(DType dt) {
  switch (dt) {
  case DT_F16: return "__half";
  case DT_BF16: return "__nv_bfloat16";
  case DT_F32: return "float";
  case DT_F64: return "double";
  case DT_I64: return "long long";
  case DT_I32: return "int";
  case DT_I8: return "signed char";
  default: return "unsigned char";
  }
}

/* Runs kernel 0 of m (the graph's only kernel) in the emulation and
 * compares every output with the interpreter; returns the failures. */
static int emulate(Graph *g, const Kernel *k, const FmtCudaModule *m, const char *what, const char *tmpdir) {
  const FmtCudaLaunch *l = &m->kernels[0];
  char src[512], so[512], cmd[2048];
  static int serial;
  serial++;
  snprintf(src, sizeof src, "%s/wg%d.cpp", tmpdir, serial);
  snprintf(so, sizeof so, "%s/wg%d.so", tmpdir, serial);
  FILE *fp = fopen(src, "w");
  if (!fp) return 1;
  fputs(m->units[l->unit], fp);
  /* the entry point: pointers from args[], the TMA descriptors unused on the host */
  fprintf(fp, "\nextern \"C\" void wg_entry(void **args) {\n  smelt_tmap tm{};\n  %s(", l->symbol);
  for (int a = 0; a < k->nargs; a++)
    fprintf(fp, "%s(%s%s *)args[%d]", a ? ", " : "", a < k->nargs - k->nouts ? "const " : "",
            storage_type(g->val[k->args[a]].type.dt), a);
  /* split-K: the workspace after the arguments */
  if (l->workspace) fprintf(fp, ", (unsigned char *)args[%d]", k->nargs);
  for (int t = 0; t < l->ntmaps; t++) fprintf(fp, ", tm");
  fprintf(fp, ");\n}\n");
  fclose(fp);
  snprintf(cmd, sizeof cmd,
           "c++ -std=c++17 -O1 -w -Wno-psabi -shared -fPIC -Wl,-Bsymbolic -DSMELT_EMU_IMPLEMENTATION -Itests/gpu/emu_include "
           "-include tests/gpu/cuda_emu.hpp %s -o %s -lpthread",
           src, so);
  int rc = system(cmd);
  unlink(src);
  if (rc != 0) {
    fprintf(stderr, "%s: the host C++ compiler rejected the emulated unit\n", what);
    return 1;
  }
  void *lib = dlopen(so, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  unlink(so);
  if (!lib) {
    fprintf(stderr, "%s: dlopen: %s\n", what, dlerror());
    return 1;
  }
  void (*entry)(void **) = (void (*)(void **))dlsym(lib, "wg_entry");
  int (*launch)(void (*)(void **), void **, const unsigned *, const unsigned *) =
      (int (*)(void (*)(void **), void **, const unsigned *, const unsigned *))dlsym(lib, "smelt_emu_launch");
  int failures = 0;
  Interp *it = NULL;
  void **data = calloc((size_t)g->nval, sizeof(void *));
  void *args[65] = {0};
  smelt_status st = ir_interp_create(g, &it);
  for (int i = 0; i < g->ninputs && !st; i++) {
    int v = g->inputs[i];
    data[v] = h_random(&g->val[v].type, -1, 1, (uint64_t)v + 3);
    st = ir_interp_set_input(it, v, data[v]);
  }
  if (!st) st = ir_interp_run(it);
  if (st || !entry || !launch || k->nargs > 64) {
    fprintf(stderr, "%s: %s\n", what, st ? st_message(st) : "emulation entry points missing");
    st_free(st);
    failures++;
    goto done;
  }
  for (int a = 0; a < k->nargs; a++) {
    const Value *v = &g->val[k->args[a]];
    size_t bytes = ir_type_bytes(&v->type);
    args[a] = aligned_alloc(1024, (bytes + 1023) / 1024 * 1024);
    if (!args[a]) abort();
    const void *from = v->kind == VK_CONST ? v->data : v->kind == VK_INPUT ? data[k->args[a]] : NULL;
    if (from) memcpy(args[a], from, bytes);
    else memset(args[a], 0xA5, bytes);
  }
  /* split-K: a zeroed workspace that every launch must leave zero; two
   * launches, so that counters not reset spoil the second */
  if (l->workspace) {
    args[k->nargs] = calloc(1, (size_t)l->workspace);
    if (!args[k->nargs]) abort();
  }
  for (int rep = 0; rep < (l->workspace ? 2 : 1); rep++) {
    if (launch(entry, args, l->grid, l->block) != 0) {
      fprintf(stderr, "%s: emulated launch failed\n", what);
      failures++;
      goto done;
    }
    for (int a = k->nargs - k->nouts; a < k->nargs; a++) {
      int v = k->args[a];
      const TensorType *t = &g->val[v].type;
      double worst = 0, gv = 0, rv = 0;
      int64_t bad = h_compare(t->dt, t->dt, args[a], ir_interp_value(it, v), ir_type_numel(t), &worst, &gv, &rv);
      if (bad >= 0) {
        fprintf(stderr, "%s [emulated, launch %d]: '%s' element %lld is %g, the interpreter says %g\n", what, rep + 1,
                g->val[v].name, (long long)bad, gv, rv);
        failures++;
      }
      memset(args[a], 0xA5, ir_type_bytes(t)); /* the next launch must write every element again */
    }
    const unsigned char *wsb = args[k->nargs];
    for (uint64_t b = 0; wsb && b < l->workspace; b++)
      if (wsb[b]) {
        fprintf(stderr, "%s [emulated, launch %d]: workspace byte %llu left non-zero\n", what, rep + 1, (unsigned long long)b);
        failures++;
        break;
      }
  }
done:
  for (int a = 0; a < 65; a++) free(args[a]);
  for (int v = 0; v < g->nval; v++) free(data[v]);
  free(data);
  ir_interp_destroy(it);
  return failures;
}

/* ---- the checks ---- */

static void check_tokens(void) {
  CuWgmmaParams p;
  CHECK(cu_wgmma_parse("wgmma:bm=128,bn=256,bk=64,st=4,c=2", &p));
  CHECK(p.BM == 128 && p.BN == 256 && p.BK == 64 && p.stages == 4 && p.consumers == 2);
  char buf[CG_VARIANT_LEN];
  cu_wgmma_format(&p, buf);
  CHECK(!strcmp(buf, "wgmma:bm=128,bn=256,bk=64,st=4,c=2"));
  CHECK(cu_wgmma_parse("wgmma:c=1,st=5,bk=64,bn=256,bm=64", &p) && p.BM == 64 && p.consumers == 1);
  CHECK(p.splitk == 1); /* sk absent: no split */
  /* split-K: sk=N, printed only when N > 1, so older tokens keep their meaning */
  CHECK(cu_wgmma_parse("wgmma:bm=128,bn=128,bk=64,st=6,c=2,sk=3", &p) && p.splitk == 3 && p.BN == 128);
  cu_wgmma_format(&p, buf);
  CHECK(!strcmp(buf, "wgmma:bm=128,bn=128,bk=64,st=6,c=2,sk=3"));
  CHECK(cu_wgmma_parse("wgmma:sk=32,bm=64,bn=64,bk=64,st=4,c=1", &p) && p.splitk == 32);
  CHECK(cu_wgmma_parse("wgmma:bm=128,bn=128,bk=64,st=6,c=2,sk=1", &p) && p.splitk == 1);
  cu_wgmma_format(&p, buf);
  CHECK(!strcmp(buf, "wgmma:bm=128,bn=128,bk=64,st=6,c=2"));
  static const char *const bad[] = {
      "wgmma:bm=128,bn=256,bk=64,st=4",         /* a key missing */
      "wgmma:bm=128,bn=256,bk=32,st=4,c=2",     /* BK must be 64 */
      "wgmma:bm=128,bn=256,bk=64,st=5,c=2",     /* 5 x 48 KiB > 227 KiB */
      "wgmma:bm=96,bn=128,bk=64,st=4,c=1",      /* BM a multiple of 64 */
      "wgmma:bm=64,bn=128,bk=64,st=4,c=2",      /* 32 rows per consumer */
      "wgmma:bm=256,bn=256,bk=64,st=2,c=2",     /* 256 accumulators per thread */
      "wgmma:bm=128,bn=260,bk=64,st=2,c=2",     /* BN > 256 */
      "wgmma:bm=128,bn=128,bk=64,st=4,c=2,x=1", /* unknown key */
      "wgmma:bm=128,bm=128,bk=64,st=4,c=2",     /* a key twice */
      "wgmma:bm=128,bn=128,bk=64,st=4,c=2,",    /* trailing comma */
      "wgmma:bm=128,bn=128,bk=64,st=4,c=2,sk=0",  /* no slice */
      "wgmma:bm=128,bn=128,bk=64,st=4,c=2,sk=33", /* more than 32 slices */
      "wgmma:bm=128,bn=128,bk=64,st=4,c=2,sk=2,sk=2",
      "wgmma:bm=128,bn=128,bk=64,st=4,sk=2", /* c missing */
      "mma:bm=128,bn=128,bk=32,wm=64,wn=32,st=3,sk=1",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    bool ok = cu_wgmma_parse(bad[i], &p);
    if (ok) fprintf(stderr, "accepted bad token %s\n", bad[i]);
    CHECK(!ok);
  }
}

/* Matmuls the kernel must not take: no wgmma candidate. */
static void check_ineligible(void) {
  struct {
    WgCase c;
    const char *arch;
    const char *why;
  } cases[] = {
      {{"f16", 0, 0, 64, 64, 64, "", true}, "sm_80", "not Hopper"},
      {{"f16", 0, 0, 64, 64, 64, "", true}, "sm_90", "sm_90 without 'a'"},
      {{"f16", 0, 0, 64, 64, 64, "", false}, "sm_90a", "B given as [K, N]"},
      {{"f32", 0, 0, 64, 64, 64, "", true}, "sm_90a", "f32"},
      {{"f16", 0, 0, 64, 36, 64, "", true}, "sm_90a", "K not a multiple of 8"},
      {{"f16", 3, 1, 64, 64, 64, "", true}, "sm_90a", "B with a batch dim of 1 (eligible)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    Graph *g = wg_graph(&cases[i].c);
    CHECK(g != NULL);
    if (!g) continue;
    char v[16][CG_VARIANT_LEN];
    int n = wgmma_variants(g, cases[i].arch, v, 16);
    bool expect = i == 5; /* a batch dim of 1 is no batch: eligible */
    if ((n > 0) != expect) fprintf(stderr, "%s: %d wgmma candidates\n", cases[i].why, n);
    CHECK((n > 0) == expect);
    ir_graph_destroy(g);
  }
}

static void check_launch(const FmtCudaLaunch *l, const WgCase *c, const char *tok, const char *what) {
  CuWgmmaParams p;
  if (!cu_wgmma_parse(tok, &p)) {
    CHECK(false);
    return;
  }
  int bad = check_failures;
  CHECK(!strcmp(l->variant, tok));
  CHECK(l->block[0] == 128u * (1 + (unsigned)p.consumers) && l->block[1] == 1 && l->block[2] == 1);
  int64_t za = c->za > 1 ? c->za : 0, zb = c->zb > 1 ? c->zb : 0;
  bool flat = za && !zb;
  /* one unit per (tile, slice); the persistent grid fills 132 SMs at most */
  int64_t rows = flat ? za * c->M : c->M, Z = flat ? 1 : (za > zb ? za : zb ? zb : 1);
  int64_t T = (rows + p.BM - 1) / p.BM * ((c->N + p.BN - 1) / p.BN) * Z, U = T * p.splitk;
  CHECK(l->grid[0] == (unsigned)(U < 132 ? U : 132) && l->grid[1] == 1 && l->grid[2] == 1);
  CHECK(l->smem >= (unsigned)(p.stages * (p.BM + p.BN) * 128) && l->smem <= 227u * 1024);
  /* split-K: a counter per (tile, consumer warpgroup) padded to 256 bytes, then sk f32 partial tiles per tile */
  uint64_t ws = p.splitk > 1 ? ((uint64_t)T * p.consumers * 4 + 255) / 256 * 256 + (uint64_t)T * p.splitk * p.BM * p.BN * 4 : 0;
  if (l->workspace != ws) fprintf(stderr, "%s %s: workspace %llu, expected %llu\n", what, tok, (unsigned long long)l->workspace,
                                  (unsigned long long)ws);
  CHECK(l->workspace == ws);
  CHECK(l->ntmaps == 2);
  for (int t = 0; t < 2 && l->ntmaps == 2; t++) {
    const FmtCudaTmap *tm = &l->tmaps[t];
    int64_t trows = t == 0 ? rows : c->N;
    bool is3 = !flat && (t == 0 ? za : zb);
    CHECK(tm->arg == t); /* x, then w */
    CHECK(tm->dtype == (!strcmp(c->dt, "bf16") ? DT_BF16 : DT_F16));
    CHECK(tm->rank == (is3 ? 3 : 2));
    CHECK(tm->dims[0] == (uint64_t)c->K && tm->dims[1] == (uint64_t)trows);
    CHECK(tm->strides[0] == (uint64_t)c->K * 2);
    CHECK(tm->box[0] == 64 && tm->box[1] == (uint32_t)(t == 0 ? p.BM : p.BN));
    CHECK(tm->swizzle == 128);
    if (is3) {
      CHECK(tm->dims[2] == (uint64_t)(t == 0 ? za : zb));
      CHECK(tm->strides[1] == (uint64_t)(trows * c->K * 2));
      CHECK(tm->box[2] == 1);
    }
  }
  if (check_failures != bad) fprintf(stderr, "%s %s: launch checks failed\n", what, tok);
}

/* The tools the candidate checks use. */
typedef struct {
  Nv nv;
  bool have_nvrtc, have_cxx;
  char tmpdir[32];
  int compiled, emulated;
} Tools;

/* Generates candidate tok of g (case c) and checks its launch; compiles
 * it with NVRTC (also for sm_80 when `also_sm80`); runs it in the
 * emulation when `emu`. */
static void check_candidate(Tools *T, Graph *g, const WgCase *c, const char *what, const char *tok, bool also_sm80, bool emu) {
  Kernel *k = NULL;
  int nk = 0;
  FmtCudaModule *m = NULL;
  const char *force[1] = {tok};
  CgCudaOptions opt = {.args_aligned = true, .arch = "sm_90a", .force = force, .max_units = 1, .emulation = emu};
  smelt_status st = cg_lower(g, &k, &nk);
  if (!st) st = nk == 1 ? cg_cuda_generate(g, k, nk, &opt, &m) : st_error(ST_INTERNAL, "%d kernels", nk);
  if (st) {
    fprintf(stderr, "%s %s: %s\n", what, tok, st_message(st));
    st_free(st);
    check_failures++;
    cg_kernels_free(k, nk);
    return;
  }
  check_launch(&m->kernels[0], c, tok, what);
  int regs = -1;
  if (T->have_nvrtc) {
    for (int a = 0; a < (also_sm80 ? 2 : 1); a++) {
      const char *arch = a == 0 ? "sm_90a" : "sm_80";
      char *log = NULL;
      int r = nv_compile(&T->nv, m->units[0], arch, &log);
      const char *lg = log ? log : "";
      bool clean = r == 0 && !contains_ci(lg, "warning") && !contains_ci(lg, "serializ");
      if (a == 0) {
        regs = used_registers(lg);
        clean = clean && strstr(lg, " 0 bytes spill stores, 0 bytes spill loads") && strstr(lg, "0 bytes stack frame");
      }
      if (!clean) fprintf(stderr, "%s %s (%s): NVRTC %d:\n%s\n", what, tok, arch, r, lg);
      CHECK(clean);
      T->compiled++;
      free(log);
    }
  }
  int fails = 0;
  emu = emu && T->have_cxx;
  if (emu) {
    fails = emulate(g, &k[0], m, what, T->tmpdir);
    check_failures += fails;
    T->emulated++;
  }
  printf("%-44s %-44s %3d registers %s\n", what, tok, regs, emu ? (fails ? "FAILED" : "ok") : "");
  cg_kernels_free(k, nk);
  fmt_cuda_module_free(m);
}

/* The heuristic's pick for the W4 prefill matmuls (512 tokens, f16,
 * weights [N, K]) on the H200's 132 SMs does not split K (every split
 * measured slower there: wgmma.c, WG_HEURISTIC_SPLITK), and the
 * candidates offer split-K for these shapes, for the tuner. */
static void check_prefill_picks(void) {
  static const WgCase shapes[] = {
      {"f16", 0, 0, 512, 2048, 2560, "", true},  /* QKV */
      {"f16", 0, 0, 512, 2048, 2048, "", true},  /* out-proj */
      {"f16", 0, 0, 512, 5632, 2048, "", true},  /* down */
      {"f16", 0, 0, 512, 2048, 11264, "", true}, /* gate-up */
  };
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    const WgCase *c = &shapes[i];
    Graph *g = wg_graph(c);
    CHECK(g != NULL);
    if (!g) continue;
    char toks[32][CG_VARIANT_LEN];
    int nt = wgmma_variants(g, "sm_90a", toks, 32), nsplit = 0;
    CuWgmmaParams p;
    CHECK(nt >= 1 && cu_wgmma_parse(toks[0], &p));
    for (int v = 0; v < nt; v++) nsplit += strstr(toks[v], ",sk=") != NULL;
    if (nt >= 1 && cu_wgmma_parse(toks[0], &p)) {
      int64_t T = (c->M + p.BM - 1) / p.BM * ((c->N + p.BN - 1) / p.BN), U = T * p.splitk;
      double fill = (double)U / (double)((U + 131) / 132 * 132);
      printf("W4 prefill %lld x %lld x %lld: %s (%lld tiles, %lld units, waves %.0f%% full), %d candidates, %d split-K\n",
             (long long)c->M, (long long)c->N, (long long)c->K, toks[0], (long long)T, (long long)U, 100 * fill, nt, nsplit);
      CHECK(p.splitk == 1);
    }
    /* few tiles: split-K candidates for the tuner */
    if (i < 3) CHECK(nsplit >= 2);
    ir_graph_destroy(g);
  }
}

/* A split the K tiles cannot make is refused, not emitted. */
static void check_too_many_slices(void) {
  WgCase c = {"f16", 0, 0, 64, 200, 64, "", true}; /* 4 K tiles */
  Graph *g = wg_graph(&c);
  CHECK(g != NULL);
  if (!g) return;
  for (int sk = 4; sk <= 5; sk++) {
    char tok[CG_VARIANT_LEN];
    snprintf(tok, sizeof tok, "wgmma:bm=64,bn=64,bk=64,st=4,c=1,sk=%d", sk);
    Kernel *k = NULL;
    int nk = 0;
    FmtCudaModule *m = NULL;
    const char *force[1] = {tok};
    CgCudaOptions opt = {.args_aligned = true, .arch = "sm_90a", .force = force, .max_units = 1};
    smelt_status st = cg_lower(g, &k, &nk);
    if (!st) st = cg_cuda_generate(g, k, nk, &opt, &m);
    if ((st == NULL) != (sk == 4)) fprintf(stderr, "%s on 4 K tiles: %s\n", tok, st ? st_message(st) : "generated");
    CHECK((st == NULL) == (sk == 4));
    st_free(st);
    fmt_cuda_module_free(m);
    cg_kernels_free(k, nk);
  }
  ir_graph_destroy(g);
}

/* argv[1], if given, picks the candidates whose case name or token contains it. */
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  check_tokens();
  check_ineligible();
  check_prefill_picks();
  check_too_many_slices();

  CgNvrtc *cg = NULL;
  smelt_status st = cg_cuda_nvrtc_open(&cg);
  Tools T = {.compiled = 0};
  T.have_nvrtc = !st && nv_open(&T.nv, cg_cuda_nvrtc_include_dir(cg));
  if (st) st_free(st);
  if (!T.have_nvrtc) check_skip_part("nvrtc", "NVRTC not found: the kernels are generated but not compiled");
  T.have_cxx = system("c++ --version > /dev/null 2>&1") == 0;
  snprintf(T.tmpdir, sizeof T.tmpdir, "/tmp/smelt-wgemu-XXXXXX");
  if (T.have_cxx && !mkdtemp(T.tmpdir)) T.have_cxx = false;
  if (!T.have_cxx) printf("SKIP: no host C++ compiler: no emulated runs\n");

  /* (M, K, N) ragged against every tile, batched three ways, both dtypes and epilogues */
  static const WgCase cases[] = {
      {"f16", 0, 0, 1, 8, 8, "", true},
      {"bf16", 0, 0, 7, 72, 120, "bias_silu", true},
      {"f16", 0, 0, 64, 64, 256, "res", true},
      {"f16", 0, 0, 127, 136, 72, "bias_silu", true},
      {"bf16", 0, 0, 200, 200, 264, "res", true},
      {"f16", 0, 0, 129, 24, 45, "", true},       /* N odd: scalar stores */
      {"f16", 3, 0, 50, 72, 120, "bias_silu", true},  /* A batched: rows folded */
      {"bf16", 2, 2, 70, 64, 40, "res", true},    /* both batched: 3-D maps */
      {"f16", 0, 3, 33, 16, 24, "", true},        /* only B batched */
      {"f16", 0, 0, 200, 1000, 264, "res", true}, /* few tiles, long K: split-K candidates (the default among them) */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const WgCase *c = &cases[i];
    char what[160];
    case_name(c, what, sizeof what);
    Graph *g = wg_graph(c);
    CHECK(g != NULL);
    if (!g) continue;
    char toks[32][CG_VARIANT_LEN];
    int nt = wgmma_variants(g, "sm_90a", toks, 32), nsplit = 0;
    if (nt < 1) fprintf(stderr, "%s: no wgmma candidate\n", what);
    CHECK(nt >= 1);
    for (int v = 0; v < nt; v++) {
      nsplit += strstr(toks[v], ",sk=") != NULL;
      if (argc > 1 && !strstr(what, argv[1]) && !strstr(toks[v], argv[1])) continue;
      /* the emulation is slow: the default of every case, every candidate of two */
      check_candidate(&T, g, c, what, toks[v], v == 0, v == 0 || i == 4 || i == 9 || argc > 1);
    }
    /* few tiles: split-K among the candidates, not the default (wgmma.c,
     * WG_HEURISTIC_SPLITK) */
    if (i == 9) CHECK(nsplit >= 2 && strstr(toks[0], ",sk=") == NULL);
    ir_graph_destroy(g);
  }

  /* Split-K forced onto ragged M, N and K, odd N, the three batch kinds,
   * bf16 and the fused epilogues; slices from 2 to as many as K tiles;
   * one with more units than blocks, so that a block's second unit is
   * slice 0 of a tile whose later slices already came: the last to count
   * is not the last slice. */
  static const struct {
    WgCase c;
    const char *tok;
  } forced[] = {
      {{"f16", 0, 0, 200, 1000, 264, "res", true}, "wgmma:bm=128,bn=128,bk=64,st=4,c=2,sk=3"},
      {{"bf16", 0, 0, 127, 520, 45, "bias_silu", true}, "wgmma:bm=64,bn=64,bk=64,st=4,c=1,sk=5"},
      {{"f16", 3, 0, 50, 264, 120, "bias_silu", true}, "wgmma:bm=128,bn=128,bk=64,st=4,c=2,sk=2"},
      {{"bf16", 2, 2, 70, 512, 40, "res", true}, "wgmma:bm=64,bn=128,bk=64,st=4,c=1,sk=8"},
      {{"f16", 0, 3, 33, 200, 24, "", true}, "wgmma:bm=64,bn=64,bk=64,st=4,c=1,sk=4"},
      {{"f16", 0, 0, 320, 200, 576, "", true}, "wgmma:bm=64,bn=64,bk=64,st=4,c=1,sk=3"},
      {{"bf16", 0, 0, 200, 1024, 264, "bias_silu", true}, "wgmma:bm=128,bn=256,bk=64,st=3,c=2,sk=4"},
      {{"f16", 0, 0, 300, 448, 136, "res", true}, "wgmma:bm=256,bn=128,bk=64,st=4,c=2,sk=7"},
  };
  for (size_t i = 0; i < sizeof forced / sizeof *forced; i++) {
    const WgCase *c = &forced[i].c;
    char what[160];
    case_name(c, what, sizeof what);
    if (argc > 1 && !strstr(what, argv[1]) && !strstr(forced[i].tok, argv[1])) continue;
    Graph *g = wg_graph(c);
    CHECK(g != NULL);
    if (!g) continue;
    check_candidate(&T, g, c, what, forced[i].tok, false, true);
    ir_graph_destroy(g);
  }
  printf("%d compilations, %d emulated runs\n", T.compiled, T.emulated);
  if (T.have_cxx) rmdir(T.tmpdir);
  cg_cuda_nvrtc_close(cg);
  return check_done("test_cuda_wgmma_compile");
}
