/* The attention kernels on the GPU against the reference interpreter.
 *
 * Every variant the backend lists for a shape (cg_cuda_variants: flash,
 * flashdec, simple) is forced on the attention kernel, compiled with NVRTC
 * for the GPU present, run twice with one workspace and compared element
 * by element with the interpreter (f16 4e-3, bf16 3e-2 of 1 + |ref|), with
 * guard bytes around every buffer and the workspace checked to be all zero
 * after each launch (tests/gpu/att_cases.h).  Shapes at real sizes:
 *   W3 prefill  f16 B1 H32 D128 S=T=2048 causal
 *   W3 decode   f16 B1 H32 D128 S=1 T=4096
 *   W4 prefill  f16 B1 H32 Hkv4 D64 S=T=512 causal
 *   W4 decode   f16 B1 H32 Hkv4 D64 S=1 T=2049, plain and as the model has
 *               it (rope'd q; a 2048-key cache with the rope'd new key and
 *               the new value appended by concat)
 *   long decode f16 B1 H32 D128 S=1 T=32768
 *   over a cache (cache: true; positions at run time): W4/W3 decode at
 *               positions 0, 127, 1023 and C - 1 and prefill chunks at two
 *               starts, timed (the time follows pos + 1, not C)
 * each variant also timed (rt_cuda_time_kernels) and reported in TFLOP/s
 * (prefill) or GB/s of K, V, Q and O moved (decode); then a matrix of
 * smaller shapes (bf16, not causal, grouped-query, S != T, ragged S and T,
 * head dims 16 to 256, buffers 8 bytes off, fused rope / transposed k /
 * residual epilogue, KV cache concat) under the heuristic's choice and a
 * few forced ones.
 * All variants of a shape are compiled first, in parallel, into the disk
 * cache.  The last line sums it up; any failure makes the test fail.
 *
 * Without a GPU it prints "SKIP: no CUDA device" and exits 77 (skipped, for ctest).
 */
#define _GNU_SOURCE /* RTLD_NODELETE in harness.h */
#include "tests/gpu/att_cases.h"
#include "tests/unit/check.h"

static int total_runs, total_failures;

/* (i, j) pairs a case's queries attend to. */
static double att_pairs(const AttCase *c) {
  if (!c->causal) return (double)c->S * (double)c->T;
  double n = 0;
  for (int64_t i = 0; i < c->S; i++) n += (double)(c->T - c->S + i + 1 < c->T ? c->T - c->S + i + 1 : c->T);
  return n;
}

/* Generates the unit of every token (as att_run_variant will) and compiles
 * them together, so that the runs that follow find them in the cache. */
static void prewarm(Exec *e, AttRef *r, char (*toks)[CG_VARIANT_LEN], int n, const char *arch, bool args_aligned) {
  char **units = calloc((size_t)n, sizeof(char *));
  FmtCudaModule **mods = calloc((size_t)n, sizeof *mods);
  int nu = 0;
  for (int i = 0; i < n; i++) {
    const char **force = calloc((size_t)r->nk, sizeof *force);
    force[r->att] = toks[i];
    CgCudaOptions opt = {.args_aligned = args_aligned, .max_units = 1, .arch = arch, .force = force};
    smelt_status st = cg_cuda_generate(r->g, r->k, r->nk, &opt, &mods[i]);
    free(force);
    if (st) {
      st_free(st); /* reported by the run */
      continue;
    }
    for (int u = 0; u < mods[i]->nunits && nu < n; u++) units[nu++] = mods[i]->units[u];
  }
  FmtCudaModule all = {.nunits = nu, .units = units};
  CgCudaBinary *bins = NULL;
  smelt_status st = nu ? cg_cuda_compile_module(e->nvrtc, &all, &arch, 1, NULL, &bins) : NULL;
  if (st) st_free(st); /* the runs report it */
  else if (nu) cg_cuda_binaries_free(bins, nu);
  for (int i = 0; i < n; i++) fmt_cuda_module_free(mods[i]);
  free(mods), free(units);
}

/* Every variant of case c, timed; prints one line per variant. */
static void run_all_variants(Exec *e, const AttCase *c, const char *label, bool decode, char *summary, size_t cap) {
  char name[160];
  att_case_name(c, name, sizeof name);
  Graph *g = att_graph(c);
  AttRef r;
  if (!g || !att_ref_init(&r, g)) {
    fprintf(stderr, "%s: could not build the case\n", name);
    total_failures++;
    ir_graph_destroy(g);
    return;
  }
  const char *arch = rt_cuda_device_info(e->dev)->arch;
  char toks[64][CG_VARIANT_LEN];
  int n = cg_cuda_variants(g, &r.k[r.att], arch, toks, 64);
  prewarm(e, &r, toks, n, arch, true);
  double flops = 4.0 * (double)c->B * (double)c->H * (double)c->D * att_pairs(c);
  double bytes = 2.0 * (2.0 * (double)c->B * c->H * c->S * c->D + 2.0 * (double)c->B * c->Hkv * c->T * c->D);
  double best = 0;
  char best_tok[CG_VARIANT_LEN] = "";
  printf("%s (%s): %d variants\n", label, name, n);
  for (int i = 0; i < n; i++) {
    double ms = 0;
    int f = att_run_variant(e, &r, toks[i], arch, true, 0, 2, 10, &ms, NULL, label);
    total_runs++;
    total_failures += f;
    if (f) {
      printf("  %-40s FAILED\n", toks[i]);
      continue;
    }
    if (decode)
      printf("  %-40s %9.4f ms  %7.1f GB/s%s\n", toks[i], ms, ms > 0 ? bytes / (ms * 1e6) : 0, i == 0 ? "  (heuristic)" : "");
    else
      printf("  %-40s %9.4f ms  %7.1f TFLOP/s%s\n", toks[i], ms, ms > 0 ? flops / (ms * 1e9) : 0, i == 0 ? "  (heuristic)" : "");
    if (ms > 0 && (best == 0 || ms < best)) {
      best = ms;
      memcpy(best_tok, toks[i], CG_VARIANT_LEN);
    }
  }
  if (best > 0) {
    size_t len = strlen(summary);
    snprintf(summary + len, cap - len, "%s%s %.4f ms %.1f %s [%s]", len ? "; " : "", label, best,
             decode ? bytes / (best * 1e6) : flops / (best * 1e9), decode ? "GB/s" : "TFLOP/s", best_tok);
  }
  att_ref_free(&r);
  ir_graph_destroy(g);
}

typedef struct {
  AttCase c;
  const char *toks[6]; /* forced besides the heuristic's choice */
  bool offset;         /* also with every buffer 8 bytes off */
} MatrixCase;

static AttCase mk(DType dt, int64_t B, int64_t H, int64_t Hkv, int64_t S, int64_t T, int64_t D, bool causal) {
  return (AttCase){dt, B, H, Hkv, S, T, D, causal, false, false, false, false, false, false, false};
}

static void run_matrix(Exec *e) {
  AttCase fq = mk(DT_F16, 1, 8, 2, 300, 300, 64, true);
  fq.rope_q = fq.rope_k = fq.epi = true;
  AttCase fkt = mk(DT_BF16, 2, 8, 8, 257, 257, 128, true);
  fkt.kt = fkt.rope_q = true;
  AttCase fdec = mk(DT_F16, 2, 32, 4, 1, 2049, 64, true);
  fdec.rope_q = fdec.rope_k = fdec.epi = true;
  AttCase fcat = mk(DT_F16, 1, 32, 4, 1, 2049, 64, true), bcat = mk(DT_BF16, 2, 16, 16, 1, 1000, 128, true);
  fcat.rope_q = fcat.rope_k = fcat.cat = fcat.epi = true;
  bcat.cat = true;
  const MatrixCase cases[] = {
      {mk(DT_F16, 1, 8, 8, 1024, 1024, 128, false), {"flash:bm=128,bn=64,w=8,st=2", "flash:bm=64,bn=32,w=4,st=3", "flash:bm=128,bn=64,w=4,st=2,ks=2"}, false},
      {mk(DT_BF16, 1, 8, 8, 1024, 1024, 128, true), {"flash:bm=64,bn=64,w=4,st=3"}, false},
      {mk(DT_BF16, 2, 16, 4, 777, 1000, 64, true),
       {"flash:bm=128,bn=128,w=8,st=2", "flash:bm=64,bn=64,w=2,st=3", "flash:bm=64,bn=128,w=4,st=2,ks=2", "flash:bm=32,bn=128,w=2,st=2,ks=4"},
       true},
      {mk(DT_F16, 1, 4, 2, 37, 37, 64, true), {"flash:bm=32,bn=16,w=1,st=3", "simple"}, true},
      {mk(DT_F16, 1, 6, 3, 5, 70, 128, true), {"flash:bm=64,bn=64,w=4,st=2", "flashdec:split=3,bn=16,w=1"}, true},
      {mk(DT_BF16, 3, 8, 1, 1, 300, 64, true), {"flashdec:split=1,bn=32,w=4", "flashdec:split=5,bn=128,w=8", "flashdec:split=5,bn=64,w=4,pf=1"}, false},
      {mk(DT_F16, 1, 12, 12, 100, 100, 16, false), {"flash:bm=64,bn=32,w=2,st=3"}, false},
      {mk(DT_F16, 1, 4, 4, 333, 1111, 48, true), {"flash:bm=64,bn=128,w=4,st=2", "flash:bm=64,bn=64,w=4,st=3,ks=2"}, true},
      {mk(DT_BF16, 1, 24, 2, 3, 4097, 32, true), {"flashdec:split=16,bn=32,w=2", "flash:bm=64,bn=32,w=4,st=2", "flashdec:split=16,bn=64,w=2,pf=1"}, false},
      {mk(DT_F16, 1, 8, 8, 1, 1000, 256, false), {"flashdec:split=8,bn=16,w=4", "flashdec:split=8,bn=16,w=4,pf=1"}, false},
      {mk(DT_F16, 1, 8, 8, 4, 8192, 128, true), {"flashdec:split=64,bn=32,w=4", "flashdec:split=64,bn=64,w=4,pf=1"}, false},
      {fq, {"flash:bm=64,bn=64,w=4,st=2", "simple", "flash:bm=64,bn=64,w=4,st=2,ks=2"}, false},
      {fkt, {"flash:bm=64,bn=64,w=4,st=2", "flash:bm=64,bn=64,w=2,st=2,ks=2"}, false},
      {fdec, {"flashdec:split=16,bn=16,w=4", "flashdec:split=16,bn=32,w=4,pf=1", "flashdec:split=16,bn=32,w=4,pf=2"}, true},
      /* loads two steps ahead: ragged T, GQA with B = 2, more splits than the merge preloads */
      {mk(DT_F16, 2, 8, 2, 1, 3001, 128, true),
       {"flashdec:split=16,bn=16,w=4,pf=2", "flashdec:split=40,bn=8,w=4,pf=2,tr=1", "flashdec:split=7,bn=32,w=8,pf=2,tr=1",
        "flashdec:split=9,bn=48,w=4,pf=1,tr=1"},
       true},
      /* three rows per kv head: the transposed reduction padded (6 and 9 values) */
      {mk(DT_BF16, 1, 12, 4, 1, 777, 64, true), {"flashdec:split=8,bn=32,w=4,pf=2,tr=1", "flashdec:split=4,bn=48,w=4,pf=1,tr=1"}, false},
      /* a KV cache with the new key (rope'd, stored) and value appended (W4 decode) */
      {fcat, {"flashdec:split=32,bn=64,w=8,pf=2", "flashdec:split=32,bn=32,w=8", "flashdec:split=64,bn=32,w=4,pf=1,tr=1"}, true},
      {bcat, {"flashdec:split=16,bn=16,w=4,pf=2,tr=1", "flashdec:split=8,bn=32,w=8,pf=1"}, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const MatrixCase *mc = &cases[i];
    char name[160];
    att_case_name(&mc->c, name, sizeof name);
    Graph *g = att_graph(&mc->c);
    AttRef r;
    if (!g || !att_ref_init(&r, g)) {
      fprintf(stderr, "%s: could not build the case\n", name);
      total_failures++;
      ir_graph_destroy(g);
      continue;
    }
    char heur[CG_VARIANT_LEN] = "";
    for (int t = -1; t < 6; t++) {
      const char *tok = t < 0 ? NULL : mc->toks[t];
      if (t >= 0 && !tok) break;
      for (int off = 0; off <= (mc->offset ? 1 : 0); off++) {
        char used[CG_VARIANT_LEN];
        int f = att_run_variant(e, &r, tok, rt_cuda_device_info(e->dev)->arch, false, off ? 8 : 0, 2, 0, NULL, used, name);
        total_runs++;
        total_failures += f;
        if (t < 0 && !off) snprintf(heur, sizeof heur, "%s", used);
        printf("  %-60s %-36s%s %s\n", name, t < 0 ? heur : tok, off ? " (8 bytes off)" : "", f ? "FAILED" : "ok");
      }
    }
    att_ref_free(&r);
    ir_graph_destroy(g);
  }
}

/* Attention over a cache (cache: true): the heuristic's kernel at several
 * positions of one capacity, timed, so that the time is seen to follow the
 * valid length (pos + 1) and not the capacity; decode (S = 1) at 0, 127,
 * 1023 and C - 1, and prefill chunks at two starts; plus forced variants
 * at one position. */
static void run_cache(Exec *e, char *summary, size_t cap) {
  struct {
    AttCase c;
    const char *label;
    int64_t p0[4];
    const char *toks[4];
  } cases[] = {
      {{DT_F16, 1, 32, 4, 1, 2048, 64, false, true, false, false, false, false, true, false}, "W4 decode over a cache (rope q)",
       {0, 127, 1023, 2047}, {"flashdec:split=32,bn=64,w=8,pf=1,tr=1", "flashdec:split=8,bn=32,w=4,pf=2", "simple"}},
      {{DT_F16, 1, 32, 32, 1, 4096, 128, false, false, false, false, false, false, true, false}, "W3 decode over a cache",
       {0, 127, 1023, 4095}, {"flashdec:split=16,bn=16,w=4,pf=2,tr=1"}},
      {{DT_BF16, 1, 32, 4, 1, 2048, 64, false, false, false, false, false, false, true, true}, "bf16 decode, i64 positions",
       {5, 2047, -1}, {NULL}},
      {{DT_F16, 1, 32, 4, 512, 2048, 64, false, true, false, false, false, false, true, false}, "W4 prefill chunk over a cache (rope q)",
       {0, 1536, -1}, {"flash:bm=128,bn=64,w=4,st=2", "flash:bm=64,bn=128,w=4,st=2,ks=2"}},
      {{DT_BF16, 1, 8, 2, 100, 1000, 128, false, false, false, false, false, false, true, false}, "bf16 prefill over a cache",
       {0, 900, -1}, {"flash:bm=64,bn=32,w=4,st=2", "simple"}},
  };
  const char *arch = rt_cuda_device_info(e->dev)->arch;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    for (int pi = 0; pi < 4 && cases[i].p0[pi] >= 0; pi++) {
      char name[200];
      att_case_name(&cases[i].c, name, sizeof name);
      Graph *g = att_graph(&cases[i].c);
      AttRef r;
      if (!g || !att_ref_init_at(&r, g, cases[i].p0[pi])) {
        fprintf(stderr, "%s: could not build the case\n", name);
        total_failures++;
        ir_graph_destroy(g);
        continue;
      }
      for (int t = -1; t < 4; t++) {
        const char *tok = t < 0 ? NULL : cases[i].toks[t];
        if (t >= 0 && (!tok || pi > 0)) break; /* forced variants at the first position only */
        double ms = 0;
        char used[CG_VARIANT_LEN];
        int f = att_run_variant(e, &r, tok, arch, true, 0, 2, 10, &ms, used, cases[i].label);
        total_runs++;
        total_failures += f;
        printf("  %-40s p0 %5lld  %-40s %9.4f ms %s\n", cases[i].label, (long long)cases[i].p0[pi], used, ms, f ? "FAILED" : "ok");
        if (t < 0 && !f) {
          size_t len = strlen(summary);
          snprintf(summary + len, cap - len, "%s%s p0=%lld %.4f ms", len ? "; " : "", cases[i].label, (long long)cases[i].p0[pi], ms);
        }
      }
      att_ref_free(&r);
      ir_graph_destroy(g);
    }
}

int main(void) {
  Exec e;
  int rc = h_cuda_test_start(&e, "test_cuda_attention");
  if (rc >= 0) return rc;
  char summary[2048] = "";
  run_all_variants(&e, (AttCase[]){mk(DT_F16, 1, 32, 32, 2048, 2048, 128, true)}, "W3 prefill", false, summary, sizeof summary);
  run_all_variants(&e, (AttCase[]){mk(DT_F16, 1, 32, 32, 1, 4096, 128, true)}, "W3 decode", true, summary, sizeof summary);
  run_all_variants(&e, (AttCase[]){mk(DT_F16, 1, 32, 4, 512, 512, 64, true)}, "W4 prefill", false, summary, sizeof summary);
  run_all_variants(&e, (AttCase[]){mk(DT_F16, 1, 32, 4, 1, 2049, 64, true)}, "W4 decode", true, summary, sizeof summary);
  /* W4 decode as the model has it: rope'd q, the cache with the rope'd new key (stored) and value appended */
  AttCase w4f = mk(DT_F16, 1, 32, 4, 1, 2049, 64, true);
  w4f.rope_q = w4f.rope_k = w4f.cat = true;
  run_all_variants(&e, &w4f, "W4 decode (rope, cache concat)", true, summary, sizeof summary);
  run_all_variants(&e, (AttCase[]){mk(DT_F16, 1, 32, 32, 1, 32768, 128, true)}, "decode T=32768", true, summary, sizeof summary);
  run_matrix(&e);
  char cache_summary[2048] = "";
  run_cache(&e, cache_summary, sizeof cache_summary);
  printf("cache attention (heuristic): %s\n", cache_summary);
  printf("test_cuda_attention: %d variant runs, %d failures; best: %s\n", total_runs, total_failures, summary);
  h_exec_close(&e);
  check_failures += total_failures;
  return check_done("test_cuda_attention");
}
