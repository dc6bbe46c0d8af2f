/* The decode matmul: M <= 8 rows of A against a weight matrix B that is
 * read exactly once, with 16-byte loads, f32 accumulation.
 *
 * Such a product is bound by the bytes of B, so the kernel's only job is to
 * keep enough 16-byte loads of B in flight on every SM, coalesced, and to
 * do little else per byte.  Parameters (CuGemvParams, token
 * "gemv:w=4,c=2,u=4,sk=1"): w warps per block, c and u as below, and sk
 * slices of K.  Two layouts of B:
 *
 *   B stored [N, K] (transpose_b, k contiguous; the layout the pipeline
 *   gives constant weights): warp w of block b owns the c columns
 *   n0 = (b * w_per_block + w) * c ...; its lanes read 16-byte chunks along
 *   k (512 contiguous bytes per column and step), u chunks per column per
 *   step; the c * u loads of the next step are issued before the
 *   arithmetic of this one (software pipelining: left inside one step, the
 *   compiler spreads them between the FMAs that use them, and a lane has
 *   two loads in flight instead of c * u), streamed with
 *   ld.global.nc.L1::no_allocate (B is never read again).  A's chunk at the
 *   same k is read as one 16-byte pack per row straight from memory (it
 *   stays in L1: every warp of the SM reads the same few KB).  At the end
 *   the 32 lanes' partial sums of the c x M results are added with a
 *   "transpose reduction": at each shuffle step a lane keeps half of its
 *   values and sends the other half, so P values cost about P shuffles
 *   instead of 5 P, and each result ends in one lane, which runs the
 *   epilogue.  No shared memory, no block barrier on this path.
 *
 *   B stored [K, N] (n contiguous): a block owns c chunks of 16 bytes of a
 *   row (c x 8 columns of f16); its threads split into row groups that
 *   stride along k, u rows per step in flight (pipelined the same way);
 *   partial sums are added across the row groups of a warp with the same
 *   transpose reduction, then across warps in shared memory (once per
 *   block).
 *
 * Split-K (sk > 1, grid.y = slice): when N alone gives too few warps to keep
 * the GPU's loads in flight (the small matrices of a 1B model are 1-23 MB),
 * each slice of K is summed by its own blocks into an f32 workspace
 * [Z][sk][M][N]; a counter per column block ([Z][blocks], at the start of
 * the workspace) is raised with atomicAdd after a __threadfence, and the
 * block that raises it to sk adds the sk slices in slice order (the result
 * does not depend on which block is last), clearing each partial sum as it
 * reads it, puts the counter back to 0 and runs the epilogue: the
 * workspace is all zero again when the kernel ends (other kernels keep
 * their counters where this one keeps partial sums).
 *
 * Either way each result goes through the group's elementwise epilogue.
 * Without the alignment guarantee a uniform test of the pointers picks
 * plain element loads.  Device-only instructions (the streaming load,
 * atomics, fences) are under #ifdef __CUDA_ARCH__ with a host form for the
 * CPU emulation, whose blocks run one after another.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "codegen/cuda/cu_families.h"

/* Warps the whole grid should have in flight before split-K stops paying
 * (132 SMs x 16 warps on an H200). */
#define GEMV_TARGET_WARPS 2048
/* Blocks of the default shape (4 warps, 4 chunks a step) an H200 holds
 * at once. */
#define GEMV_RESIDENT_BLOCKS 660
/* The largest workspace a split-K GEMV may ask for. */
#define GEMV_MAX_WORKSPACE ((uint64_t)256 << 20)

static bool float_storage(DType dt) { return dt == DT_F16 || dt == DT_BF16 || dt == DT_F32; }


const Node *cu_gemv_norm_node(const CuFn *f, const CuGemm *gm) {
  const Value *a = &f->g->val[gm->an->in[0]];
  if (a->kind != VK_NODE || !f->member[a->node]) return NULL;
  const Node *n = &f->g->node[a->node];
  return n->op == OP_RMS_NORM ? n : NULL;
}

bool cu_gemv_norm_mode(const CuFn *f, const CuGemm *gm) { return cu_gemv_norm_node(f, gm) != NULL; }

bool cu_gemv_norm_args_ok(const CuFn *f, const Node *nm) {
  return f->arg_of[nm->in[0]] >= 0 && f->arg_of[nm->in[1]] >= 0 && float_storage(f->g->val[nm->in[0]].type.dt) &&
         float_storage(f->g->val[nm->in[1]].type.dt);
}

bool cu_gemv_eligible(const CuFn *f, const CuGemm *gm) {
  if (gm->an->op != OP_MATMUL || gm->M > 8 || gm->M < 1 || gm->b1 || gm->N < 1 || gm->K < 1) return false;
  int bv = gm->an->in[1];
  const Value *b = &f->g->val[bv];
  if (f->arg_of[bv] < 0 || (b->kind == VK_NODE && f->member[b->node])) return false;
  if (!float_storage(gm->bt->dt) || !float_storage(gm->at->dt) || !float_storage(gm->yt->dt)) return false;
  int vec = (int)(16 / dt_size(gm->bt->dt));
  /* pair mode (a gated pair's halves in the epilogue) exists for B [N, K] */
  if (cu_gemm_wants_pairs(f, gm) && (!gm->tb || gm->N % 2)) return false;
  /* norm mode: for B [N, K], Y and G read from memory in the norm's axis order */
  const Node *nm = cu_gemv_norm_node(f, gm);
  if (nm && (!gm->tb || gm->ta || !cu_gemv_norm_args_ok(f, nm))) return false;
  return gm->tb ? gm->K % vec == 0 : gm->N % vec == 0;
}

/* ---- parameters ---- */

bool cu_gemv_parse(const char *tok, CuGemvParams *out) {
  int w, c, u, sk, used = 0;
  if (sscanf(tok, "gemv:w=%d,c=%d,u=%d,sk=%d%n", &w, &c, &u, &sk, &used) != 4 || tok[used] != 0) return false;
  /* c a power of two: the [K, N] layout's row groups are threads / c */
  if (w < 1 || w > 32 || c < 1 || c > 8 || (c & (c - 1)) || u < 1 || u > 8 || sk < 1 || sk > 64) return false;
  *out = (CuGemvParams){w, c, u, sk};
  return true;
}

void cu_gemv_format(const CuGemvParams *p, char out[CG_VARIANT_LEN]) {
  snprintf(out, CG_VARIANT_LEN, "gemv:w=%d,c=%d,u=%d,sk=%d", p->warps, p->cols, p->unroll, p->splitk);
}

static int vec_of(const CuGemm *gm) { return (int)(16 / dt_size(gm->bt->dt)); }

/* Column blocks of the grid (grid.x). */
static int64_t col_blocks(const CuGemm *gm, const CuGemvParams *p) {
  int64_t nb = gm->tb ? (int64_t)p->warps * p->cols : (int64_t)p->cols * vec_of(gm);
  return (gm->N + nb - 1) / nb;
}

/* Units of K a slice is made of: 16-byte chunks ([N, K]) or rows ([K, N]). */
static int64_t k_units(const CuGemm *gm) { return gm->tb ? gm->K / vec_of(gm) : gm->K; }

/* Split K until the grid has GEMV_TARGET_WARPS warps, keeping at least two
 * units per lane (or row group) in every slice. */
static int pick_splitk(const CuGemm *gm, const CuGemvParams *p) {
  int64_t warps = col_blocks(gm, p) * p->warps * (gm->Z < 1 ? 1 : gm->Z);
  int64_t per = gm->tb ? 64 : 2 * (32 * (int64_t)p->warps / p->cols);
  int sk = 1;
  while (sk < 16 && warps * sk < GEMV_TARGET_WARPS && k_units(gm) >= per * 2 * sk) sk *= 2;
  return sk;
}

void cu_gemv_default_params(const CuFn *f, const CuGemm *gm, CuGemvParams *out) {
  (void)f;
  if (gm->tb) {
    /* 4 warps of 2 columns, 4 chunks per column a step: 8 loads (128 bytes)
     * per lane in flight, about 96 registers with the next step's loads,
     * 5 blocks per SM: 660 on an H200.  With more blocks than that, 2
     * chunks a step (64 registers, 8 blocks per SM) so that the blocks
     * left for a last wave are fewer and the GPU stays busy, as it does
     * for M > 4, where each chunk needs more registers (about 100 at
     * M = 8). */
    *out = (CuGemvParams){4, 2, 4, 1};
    if (gm->M > 4 || col_blocks(gm, out) * (gm->Z < 1 ? 1 : gm->Z) > GEMV_RESIDENT_BLOCKS) out->unroll = 2;
  } else {
    /* 4 chunks (64 bytes of f16) per row segment; 2 when that leaves too
     * few blocks to keep every SM's loads in flight */
    int vec = vec_of(gm);
    *out = (CuGemvParams){8, gm->N / (vec * 4) >= 264 ? 4 : 2, gm->M <= 2 ? 4 : 2, 1};
  }
  out->splitk = pick_splitk(gm, out);
}

/* Whether p fits the kernel's limits for gm: the [K, N] layout's shared
 * reduction buffer, the workspace of split-K. */
static uint64_t workspace_bytes(const CuGemm *gm, const CuGemvParams *p, uint64_t *out_part_off);

static bool params_fit(const CuGemm *gm, const CuGemvParams *p) {
  if (!gm->tb) {
    int64_t T = 32 * (int64_t)p->warps;
    if (T % p->cols || (int64_t)p->warps * gm->M * p->cols * vec_of(gm) * 4 > 48 * 1024) return false;
  }
  uint64_t off;
  return workspace_bytes(gm, p, &off) <= GEMV_MAX_WORKSPACE;
}

int cu_gemv_candidates(const CuFn *f, const CuGemm *gm, char (*out)[CG_VARIANT_LEN], int max) {
  CuGemvParams d;
  cu_gemv_default_params(f, gm, &d);
  CuGemvParams list[16];
  int n = 0;
  list[n++] = d;
  /* the same shape of block with half and twice the slices */
  if (d.splitk > 1) list[n] = d, list[n++].splitk = d.splitk / 2;
  if (d.splitk < 32) list[n] = d, list[n++].splitk = d.splitk * 2;
  /* other blocks, each with its own split */
  static const CuGemvParams tb_alt[] = {{4, 2, 2, 1}, {4, 1, 8, 1}, {8, 2, 4, 1}, {4, 4, 2, 1}, {2, 2, 4, 1}, {4, 2, 8, 1}};
  static const CuGemvParams kn_alt[] = {{8, 2, 4, 1}, {8, 4, 2, 1}, {4, 2, 4, 1}, {8, 1, 8, 1}, {16, 2, 2, 1}};
  const CuGemvParams *alt = gm->tb ? tb_alt : kn_alt;
  int nalt = gm->tb ? (int)(sizeof tb_alt / sizeof *tb_alt) : (int)(sizeof kn_alt / sizeof *kn_alt);
  for (int i = 0; i < nalt; i++) {
    list[n] = alt[i];
    list[n].splitk = pick_splitk(gm, &list[n]);
    n++;
  }
  /* pair mode runs an odd column count as twice that: not a variant of its own */
  bool pairs = f && cu_gemm_wants_pairs(f, gm);
  int got = 0;
  for (int i = 0; i < n && got < max; i++) {
    if (!params_fit(gm, &list[i]) || (pairs && list[i].cols % 2)) continue;
    char tok[CG_VARIANT_LEN];
    cu_gemv_format(&list[i], tok);
    bool dup = false;
    for (int j = 0; j < got && !dup; j++) dup = strcmp(out[j], tok) == 0;
    if (!dup) memcpy(out[got++], tok, CG_VARIANT_LEN);
  }
  return got;
}

/* ---- emission ---- */

typedef struct {
  const CuGemm *gm;
  const CuGemvParams *p;
  const int *epi;
  int nepi;
  DType bdt, adt;
  const char *st, *sa; /* storage types of B and A */
  int vec, M;
  int a0, b0;          /* argument indices */
  bool x_vec;          /* A read as packs straight from its argument */
  bool pairs;          /* pair mode: columns n, n + 1 reach the epilogue together */
  const Node *norm;    /* A = rms_norm(Y, G) computed in the loads (norm mode), else NULL */
  int y0, g0;          /* norm mode: argument indices of Y and G */
  DType ydt, gdt;
  const char *z;       /* the batch index */
  int64_t gx;          /* column blocks */
  uint64_t part_off;   /* split-K: byte offset of the partial sums in ws */
} Gv;

/* Ranged dims along the batch: a batch past this run's rows is skipped,
 * by the whole block (z is the same in all its threads, and the test
 * comes before any barrier or split-K counter of that batch).  Ranged
 * rows (M, at most 8) are all computed (the cost is reading B, the same
 * for any M); their stores are masked (store_run_rows). */
static void skip_past_batch(CuFn *f, const Gv *v) {
  const char *past = cu_gemm_batch_past(f, v->gm, v->z);
  if (past) cu_line(f, "if (%s) continue;  // ranged dims: this batch holds none of this run's rows", past);
}

/* Counters [Z][gx] (u32, rounded up to 256 bytes), then partial sums
 * [Z][sk][M][N] (f32); nothing when sk == 1. */
static uint64_t workspace_bytes(const CuGemm *gm, const CuGemvParams *p, uint64_t *out_part_off) {
  return cu_gemm_split_workspace(gm, col_blocks(gm, p), p->splitk, out_part_off);
}

uint64_t cu_gemm_split_workspace(const CuGemm *gm, int64_t gx, int sk, uint64_t *out_part_off) {
  *out_part_off = 0;
  if (sk <= 1) return 0;
  uint64_t Z = (uint64_t)(gm->Z < 1 ? 1 : gm->Z);
  uint64_t counters = (Z * (uint64_t)gx * 4 + 255) / 256 * 256;
  *out_part_off = counters;
  return counters + Z * (uint64_t)sk * (uint64_t)gm->M * (uint64_t)gm->N * 4;
}

/* Stores val at co through the epilogue; with ranged rows only those of
 * this run (the rows are computed all the same: B's bytes are the cost). */
static void store_run_rows(CuFn *f, const Gv *v, const char *m, const CuCoords *co, const CuVal *val) {
  const char *run = cu_gemm_run_m(f, v->gm);
  bool ranged = !cu_is_lit(run, NULL);
  if (ranged) cu_open(f, "if (%s < %s)", m, run);
  cu_store_epilogue(f, v->epi, v->nepi, co, val);
  if (ranged) cu_close(f);
}

/* The anchor's value at (m, n) from the f32 sum, through the epilogue. */
static void finish(CuFn *f, const Gv *v, const char *m, const char *n, const char *sum) {
  const Graph *g = f->g;
  const CuGemm *gm = v->gm;
  CuCoords co;
  CuVal val;
  gm->result(f, gm, v->z, m, n, sum, &co, &val);
  const Value *av = &g->val[gm->an->out[0]];
  const char *r = cu_tmp(f);
  cu_line(f, "const %s %s = %s;  // %s (%s)", cu_ctype(av->type.dt), r, val.l[0], av->name, ir_op_name(gm->an->op));
  val.l[0] = r;
  store_run_rows(f, v, m, &co, &val);
}

/* Result (m, n) of this block's slice: the epilogue, or (split-K) its
 * partial sum into the workspace.  m and n are expressions of f->idx. */
static void result(CuFn *f, const Gv *v, const char *m, const char *n, const char *sum) {
  if (v->p->splitk <= 1) {
    finish(f, v, m, n, sum);
    return;
  }
  cu_line(f, "part[((%s * %dLL + blockIdx.y) * %lldLL + %s) * %lldLL + %s] = %s;", v->z, v->p->splitk, (long long)v->gm->M,
          m, (long long)v->gm->N, n, sum);
}

/* Split-K: after every thread stored its partial sums, count this block's
 * slice; the last block of the column block (nb0 .. nb0 + NBLK - 1) adds
 * the slices in order and runs the epilogue. */
static void split_tail(CuFn *f, const Gv *v, const char *nb0, int NBLK, int threads) {
  cu_gemm_split_tail(f, v->gm, v->z, v->p->splitk, v->gx, v->pairs, nb0, NBLK, threads, v->epi, v->nepi);
}

void cu_gemm_split_tail(CuFn *f, const CuGemm *gm, const char *z, int sk, int64_t gx, bool pairs, const char *nb0,
                        int NBLK, int threads, const int *epi, int nepi) {
  cu_line(f, "// split-K: count this slice once its partial sums are visible; the last of the %d slices adds them", sk);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "__threadfence();");
  cu_line(f, "#endif");
  cu_line(f, "__syncthreads();");
  cu_open(f, "%s", "");
  cu_line(f, "__shared__ int last_slice;");
  cu_open(f, "if (threadIdx.x == 0)");
  cu_line(f, "unsigned *const count = reinterpret_cast<unsigned *>(ws) + (%s * %lldLL + blockIdx.x);", z, (long long)gx);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "const unsigned done = atomicAdd(count, 1u);");
  cu_line(f, "#else");
  cu_line(f, "const unsigned done = (*count)++;  // emulation: blocks run one after another");
  cu_line(f, "#endif");
  cu_line(f, "last_slice = done == %du;", sk - 1);
  cu_line(f, "if (last_slice) *count = 0u;  // the workspace is left zero for the next kernel");
  cu_close(f);
  cu_line(f, "__syncthreads();");
  cu_open(f, "if (last_slice)");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "__threadfence();");
  cu_line(f, "#endif");
  /* pair mode: each thread adds columns n and n + 1 (n even; NBLK is even) */
  int E = pairs ? 2 : 1, NU = NBLK / E;
  cu_open(f, "for (int i = threadIdx.x; i < %d; i += %d)", (int)gm->M * NU, threads);
  const char *m = cu_tmp(f), *n = cu_tmp(f);
  cu_line(f, "const %s %s = i / %d, %s = (%s)(%s + i %% %d * %d);", f->idx, m, NU, n, f->idx, nb0, NU, E);
  cu_open(f, "if (%s < %lld)", n, (long long)gm->N);
  cu_line(f, "float *const pp = part + (%s * %dLL * %lldLL + %s) * %lldLL + %s;", z, sk, (long long)gm->M, m,
          (long long)gm->N, n);
  cu_line(f, "float s[%d] = {0.0f};", E);
  cu_line(f, "// slice by slice (L2: written by other SMs), each cleared for the next kernel");
  cu_open(f, "for (int q = 0; q < %d; q++)", sk);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int e = 0; e < %d; e++)", E);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "s[e] += __ldcg(pp + q * %lldLL + e);", (long long)(gm->M * gm->N));
  cu_line(f, "#else");
  cu_line(f, "s[e] += pp[q * %lldLL + e];", (long long)(gm->M * gm->N));
  cu_line(f, "#endif");
  cu_line(f, "pp[q * %lldLL + e] = 0.0f;", (long long)(gm->M * gm->N));
  cu_close(f);
  cu_close(f);
  if (pairs) cu_gemm_store_pair_at(f, gm, z, m, n, "s[0]", "s[1]", epi, nepi);
  else cu_gemm_store_at(f, gm, z, m, n, "s[0]", epi, nepi);
  cu_close(f);
  cu_close(f);
  cu_close(f);
  cu_close(f);
}

/* A lambda `load_b(p)` returning the 16-byte pack of B at p, streamed
 * past L1 on the GPU (B is read once; A and the epilogue's operands keep
 * L1). */
static void stream_lambda(CuFn *f, const Gv *v) {
  const char *pk = cu_fmt(f, "smelt_pack<%s, %d>", v->st, v->vec);
  cu_line(f, "// 16-byte loads of B that bypass L1: B is read once");
  cu_open(f, "auto load_b = [](const %s *p)", pk);
  cu_line(f, "%s r;", pk);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "unsigned *const w = reinterpret_cast<unsigned *>(&r);");
  cu_line(f, "asm volatile(\"ld.global.nc.L1::no_allocate.v4.u32 {%%0, %%1, %%2, %%3}, [%%4];\\n\" : \"=r\"(w[0]), \"=r\"(w[1]), "
             "\"=r\"(w[2]), \"=r\"(w[3]) : \"l\"(p));");
  cu_line(f, "#else");
  cu_line(f, "r = *p;");
  cu_line(f, "#endif");
  cu_line(f, "return r;");
  f->indent--;
  cu_line(f, "};");
}

/* ---- B stored [N, K] ---- */

static int pow2_at_least(int x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}

/* The loads of one step of the [N, K] stream into `dst` (smelt_pack
 * [U][C]): chunks c + 32 u of every column, clamped into the slice (a
 * chunk past c1 is loaded again and not used, so every load is valid). */
static void tb_loads(CuFn *f, const Gv *v, int U, const char *dst, const char *c) {
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int u = 0; u < %d; u++)", U);
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int j = 0; j < %d; j++)", v->p->cols);
  cu_line(f, "    %s[u][j] = load_b(reinterpret_cast<const smelt_pack<%s, %d> *>(br[j]) + (%s + 32 * u < c1 ? %s + 32 * u : c1 - 1));",
          dst, v->st, v->vec, c, c);
}

/* Norm mode: an element of A from its f32 value, rounded to A's storage
 * dtype as the norm's own kernel would have stored it (a K-long sum of
 * products otherwise drifts from the unfused graph's by more than f16's
 * tolerance). */
static const char *a_rounded(CuFn *f, const Gv *v, const char *x) {
  return cu_from_storage(f, v->adt, cu_to_storage(f, v->adt, x));
}

/* The arithmetic of one step: chunks c + 32 u (u < U) of every column,
 * from `src` (the packs tb_loads gave) or, without one, element loads;
 * guarded: chunks at or past c1 add nothing. */
static void tb_compute(CuFn *f, const Gv *v, int U, const char *src, bool guarded) {
  const CuGemm *gm = v->gm;
  int C = v->p->cols, vec = v->vec, M = v->M, MP = pow2_at_least(M);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int u = 0; u < %d; u++)", U);
  if (guarded) cu_line(f, "if (c + 32 * u >= c1) break;");
  cu_line(f, "const %s k = (%s)(c + 32 * u) * %d;", f->idx, f->idx, vec);
  cu_line(f, "float bf[%d][%d];", C, vec);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int j = 0; j < %d; j++)", C);
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int e = 0; e < %d; e++) bf[j][e] = %s;", vec,
          cu_from_storage(f, v->bdt, src ? cu_fmt(f, "%s[u][j].v[e]", src) : "br[j][k + e]"));
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int m = 0; m < %d; m++)", M);
  cu_line(f, "float x[%d];  // A[m][k .. k+%d]", vec, vec - 1);
  if (v->norm && src) {
    cu_line(f, "const smelt_pack<%s, %d> yp = *reinterpret_cast<const smelt_pack<%s, %d> *>(Y + m * %lldLL + k);",
            cu_stype(v->ydt), vec, cu_stype(v->ydt), vec, (long long)gm->K);
    cu_line(f, "const smelt_pack<%s, %d> gp = *reinterpret_cast<const smelt_pack<%s, %d> *>(G + k);", cu_stype(v->gdt),
            vec, cu_stype(v->gdt), vec);
    /* rounded to A's dtype, as the norm's own kernel would store it */
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int e = 0; e < %d; e++) x[e] = %s;", vec,
            a_rounded(f, v, cu_fmt(f, "%s * rs[m] * %s", cu_from_storage(f, v->ydt, "yp.v[e]"),
                                   cu_from_storage(f, v->gdt, "gp.v[e]"))));
  } else if (v->norm) {
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int e = 0; e < %d; e++) x[e] = %s;", vec,
            a_rounded(f, v,
                      cu_fmt(f, "%s * rs[m] * %s",
                             cu_from_storage(f, v->ydt, cu_fmt(f, "Y[m * %lldLL + k + e]", (long long)gm->K)),
                             cu_from_storage(f, v->gdt, "G[k + e]"))));
  } else if (src && v->x_vec) {
    cu_line(f, "const smelt_pack<%s, %d> xp = *reinterpret_cast<const smelt_pack<%s, %d> *>(X + m * %lldLL + k);", v->sa, vec,
            v->sa, vec, (long long)gm->K);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int e = 0; e < %d; e++) x[e] = %s;", vec, cu_from_storage(f, v->adt, "xp.v[e]"));
  } else {
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int e = 0; e < %d; e++)", vec);
    CuVal x;
    gm->load_a(f, gm, v->z, "m", "(k + e)", &x);
    cu_line(f, "x[e] = (float)%s;", x.l[0]);
    cu_close(f);
  }
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int j = 0; j < %d; j++)", C);
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int e = 0; e < %d; e++) acc[j * %d + m] += x[e] * bf[j][e];", vec, MP);
  cu_close(f);
  cu_close(f);
}

/* The lanes' stream over this slice's chunks [c0, c1).  With 16-byte
 * loads it is software-pipelined: the U x C loads of the next step are
 * issued before the arithmetic of this one, so they are in flight together
 * while it runs (issued inside the step, the compiler would spread them
 * between the FMAs that use them, a round trip for every two). */
static void tb_stream(CuFn *f, const Gv *v, bool vector) {
  int U = v->p->unroll, C = v->p->cols;
  cu_line(f, "int c = c0 + lane;");
  if (!vector) {
    cu_open(f, "for (; c < c1; c += 32)");
    tb_compute(f, v, 1, NULL, false);
    cu_close(f);
    return;
  }
  cu_open(f, "if (c < c1)");
  cu_line(f, "smelt_pack<%s, %d> next[%d][%d];  // the next step's chunks, loaded a step ahead", v->st, v->vec, U, C);
  tb_loads(f, v, U, "next", "c");
  cu_open(f, "for (;;)");
  cu_line(f, "smelt_pack<%s, %d> b[%d][%d];", v->st, v->vec, U, C);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int u = 0; u < %d; u++)", U);
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int j = 0; j < %d; j++) b[u][j] = next[u][j];", C);
  cu_line(f, "const int cn = c + %d;", 32 * U);
  cu_open(f, "if (cn < c1)");
  tb_loads(f, v, U, "next", "cn");
  cu_close(f);
  tb_compute(f, v, U, "b", true);
  cu_line(f, "c = cn;");
  cu_line(f, "if (c >= c1) break;");
  cu_close(f);
  cu_close(f);
}

/* Transpose reduction of the P values acc[0..P) (P a power of two) over
 * the lanes that share lane % lo (offsets 16 .. lo): at the step of offset
 * o a lane keeps the upper half of its values when its bit o is set, the
 * lower half otherwise, and adds what its partner sends of the same half,
 * so P values cost about P shuffles instead of P log2(32 / lo).  With
 * S = 32 / lo lanes and g = lane / lo, lane g ends with R = P / S values,
 * indices g R .. g R + R - 1, when P >= S; else with index g / (S / P)
 * (the same in S / P lanes).  Returns R (at least 1). */
int cu_gemv_transpose_reduce(CuFn *f, int P, int lo) {
  int cnt = P;
  cu_line(f, "// add the partial sums of the lanes: each shuffle step halves the values a lane keeps");
  for (int o = 16; o >= lo; o >>= 1) {
    if (cnt > 1) {
      int H = cnt / 2;
      cu_open(f, "%s", "");
      cu_line(f, "const bool up = (lane & %d) != 0;", o);
      cu_line(f, "#pragma unroll");
      cu_open(f, "for (int i = 0; i < %d; i++)", H);
      cu_line(f, "const float send = up ? acc[i] : acc[i + %d], keep = up ? acc[i + %d] : acc[i];", H, H);
      cu_line(f, "acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, %d);", o);
      cu_close(f);
      cu_close(f);
      cnt = H;
    } else {
      cu_line(f, "acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], %d);", o);
    }
  }
  return cnt;
}

void cu_gemv_allreduce(CuFn *f, int P) {
  cu_line(f, "// add the partial sums of the lanes: every lane ends with all %d sums", P);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int o = 16; o >= 1; o >>= 1)");
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int i = 0; i < %d; i++) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);", P);
}

/* Opens the code for value r of the R a lane holds after
 * cu_gemv_transpose_reduce(P, lo): declares `i` (the value's index) and `s` (its
 * sum) inside a block whose condition says the lane is the one to use it;
 * the caller closes the block. */
static void reduced_value(CuFn *f, int P, int lo, int R, int r) {
  int S = 32 / lo;
  if (P >= S) {
    cu_open(f, "%s", "");
    cu_line(f, "const int i = lane / %d * %d + %d;", lo, R, r);
    cu_line(f, "const float s = acc[%d];", r);
  } else {
    cu_open(f, "if (lane / %d %% %d == 0)", lo, S / P);
    cu_line(f, "const int i = lane / %d;  // the same sum in %d lanes", lo * (S / P), S / P);
    cu_line(f, "const float s = acc[0];");
  }
}

/* The code before the kernel waits for its predecessors (CuLaunch.pre_wait):
 * when B is a constant, each lane asks L2 for the first step of its
 * stream (U chunks of each of the warp's columns), so the weights start
 * arriving while the kernel before this one finishes.  Only for one
 * matrix (Z = 1). */
static const char *tb_prefetch(CuFn *f, const Gv *v) {
  const CuGemm *gm = v->gm;
  const CuGemvParams *p = v->p;
  CuPrefetch mode = cu_gemm_prefetch_mode();
  if (gm->Z != 1 || f->g->val[gm->an->in[1]].kind != VK_CONST || mode == CU_PREFETCH_NONE) return NULL;
  int64_t KC = gm->K / v->vec, CPS = (KC + p->splitk - 1) / p->splitk, es = (int64_t)dt_size(f->g->val[gm->an->in[1]].type.dt);
  if (mode == CU_PREFETCH_ALL && p->splitk == 1 && gm->K * es % 16 == 0 && (int64_t)p->cols * gm->K * es < (1LL << 31))
    return cu_fmt(f,
                  "  {  // B is a constant: before the wait, this warp's %d columns (contiguous rows of B) toward L2\n"
                  "    const long long n0 = ((long long)blockIdx.x * %d + threadIdx.x / 32) * %d;\n"
                  "    if (threadIdx.x %% 32 == 0 && n0 < %lldLL && smelt_aligned(a%d, 16))\n"
                  "      smelt_prefetch_l2_bulk(a%d + n0 * %lldLL, (unsigned)((%lldLL - n0 < %d ? %lldLL - n0 : %d) * %lldLL));\n"
                  "  }\n",
                  p->cols, p->warps, p->cols, (long long)gm->N, v->b0, v->b0, (long long)gm->K, (long long)gm->N, p->cols,
                  (long long)gm->N, p->cols, (long long)(gm->K * es));
  return cu_fmt(f,
                "  {  // B is a constant: before the wait, the first %d chunks of each of this warp's columns toward L2\n"
                "    const long long n0 = ((long long)blockIdx.x * %d + threadIdx.x / 32) * %d;\n"
                "    const long long c0 = (long long)blockIdx.y * %lld, c1 = c0 + %lld < %lld ? c0 + %lld : %lld;\n"
                "    #pragma unroll\n"
                "    for (int j = 0; j < %d; j++)\n"
                "      #pragma unroll\n"
                "      for (int u = 0; u < %d; u++) {\n"
                "        const long long c = c0 + threadIdx.x %% 32 + 32 * u;\n"
                "        if (n0 + j < %lldLL && c < c1) smelt_prefetch_l2(a%d + (n0 + j) * %lldLL + c * %d);\n"
                "      }\n"
                "  }\n",
                p->unroll, p->warps, p->cols, (long long)CPS, (long long)CPS, (long long)KC, (long long)CPS,
                (long long)KC, p->cols, p->unroll, (long long)gm->N, v->b0, (long long)gm->K, v->vec);
}

/* Norm mode: A = rms_norm(Y, G) over K, computed in the loads.  Every
 * warp first takes the mean square of each of its M rows of Y (all lanes,
 * before any lane-dependent branch: the sums end in every lane), so that
 * rs[m] = 1 / sqrt(mean(Y[m]^2) + eps) and A[m][k] = Y[m][k] rs[m] G[k].
 * Y is 4 to 32 KB a warp reads from L2 while its weights stream in.
 * Declares Y and G (arguments y0 and g0 of the norm node's in[0], in[1])
 * and rs[]; vec_ok: a run-time test that Y's rows may be read in packs of
 * vec (NULL: they may). */
void cu_gemv_norm_rows(CuFn *f, const CuGemm *gm, const char *z, const Node *norm, int M, int vec, const char *vec_ok) {
  const Graph *g = f->g;
  int MP = pow2_at_least(M);
  int64_t K = gm->K;
  DType ydt = g->val[norm->in[0]].type.dt, gdt = g->val[norm->in[1]].type.dt;
  cu_line(f, "const %s *Y = a%d + %s;  // %s, normalised in the loads (%s)", cu_stype(ydt), f->arg_of[norm->in[0]],
          cu_gemm_batch_offset(f, gm, z, gm->at), g->val[norm->in[0]].name, g->val[norm->out[0]].name);
  cu_line(f, "const %s *G = a%d;  // %s", cu_stype(gdt), f->arg_of[norm->in[1]], g->val[norm->in[1]].name);
  cu_line(f, "float rs[%d];  // 1 / rms of each row", MP);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int m = 0; m < %d; m++)", M);
  cu_line(f, "float ss = 0.0f;");
  const char *pk = cu_fmt(f, "smelt_pack<%s, %d>", cu_stype(ydt), vec);
  const char *sq = cu_fmt(f, "{ const float y = %s; ss += y * y; }", cu_from_storage(f, ydt, "p.v[e]"));
  if (vec_ok) cu_open(f, "if (%s)", vec_ok);
  cu_line(f, "for (int c = lane; c < %lld; c += 32) {", (long long)(K / vec));
  cu_line(f, "  const %s p = *reinterpret_cast<const %s *>(Y + m * %lldLL + c * %d);", pk, pk, (long long)K, vec);
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int e = 0; e < %d; e++) %s", vec, sq);
  cu_line(f, "}");
  if (vec_ok) {
    cu_close(f);
    cu_open(f, "else");
    cu_line(f, "for (int k = lane; k < %lld; k += 32) { const float y = %s; ss += y * y; }", (long long)K,
            cu_from_storage(f, ydt, cu_fmt(f, "Y[m * %lldLL + k]", (long long)K)));
    cu_close(f);
  }
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int o = 16; o >= 1; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);");
  cu_line(f, "rs[m] = rsqrtf(ss / %lld.0f + %.9gf);", (long long)K, ir_attr_float(norm, "eps"));
  cu_close(f);
}

static void emit_tb(CuFn *f, Gv *v, CuLaunch *l) {
  const CuGemm *gm = v->gm;
  const CuGemvParams *p = v->p;
  int W = p->warps, C = p->cols, T = 32 * W, M = v->M, MP = pow2_at_least(M), P = C * MP;
  int64_t KC = gm->K / v->vec, CPS = (KC + p->splitk - 1) / p->splitk;
  bool aligned_opt = f->opt && f->opt->args_aligned;
  const Graph *g = f->g;
  cu_line(f, "// B given as [N, K]: warp w of block b owns columns (b * %d + w) * %d .. + %d; its lanes stream 16-byte", W, C, C - 1);
  cu_line(f, "// chunks of k (chunk c at k = %d c), %d chunks per column in flight, A's chunks read beside them", v->vec,
          p->unroll);
  if (!aligned_opt)
    cu_line(f, "const bool vec_ok = smelt_aligned(a%d, 16)%s%s;", v->b0,
            v->x_vec ? cu_fmt(f, " && smelt_aligned(a%d, %d)", v->a0, v->vec * (int)dt_size(v->adt)) : "",
            v->norm ? cu_fmt(f, " && smelt_aligned(a%d, %d) && smelt_aligned(a%d, %d)", v->y0,
                             v->vec * (int)dt_size(v->ydt), v->g0, v->vec * (int)dt_size(v->gdt))
                    : "");
  cu_line(f, "const int warp = threadIdx.x / 32, lane = threadIdx.x %% 32;");
  stream_lambda(f, v);
  if (p->splitk > 1)
    cu_line(f, "float *const part = reinterpret_cast<float *>(ws + %lluULL);  // split-K partial sums [Z][%d][M][N]",
            (unsigned long long)v->part_off, p->splitk);
  cu_open(f, "for (%s %s = blockIdx.z; %s < %lld; %s += gridDim.z)", f->idx, v->z, v->z, (long long)gm->Z, v->z);
  skip_past_batch(f, v);
  cu_line(f, "const %s *B = a%d + %s;  // %s", v->st, v->b0, cu_gemm_batch_offset(f, gm, v->z, gm->bt),
          g->val[gm->an->in[1]].name);
  if (v->x_vec)
    cu_line(f, "const %s *X = a%d + %s;  // %s", v->sa, v->a0, cu_gemm_batch_offset(f, gm, v->z, gm->at),
            g->val[gm->an->in[0]].name);
  if (v->norm) cu_gemv_norm_rows(f, gm, v->z, v->norm, v->M, v->vec, aligned_opt ? NULL : "vec_ok");
  cu_line(f, "const long long n0 = ((long long)blockIdx.x * %d + warp) * %d;  // this warp's first column", W, C);
  if (p->splitk > 1)
    cu_line(f, "const int c0 = (int)blockIdx.y * %lld, c1 = c0 + %lld < %lld ? c0 + %lld : %lld;  // this slice's chunks",
            (long long)CPS, (long long)CPS, (long long)KC, (long long)CPS, (long long)KC);
  else cu_line(f, "const int c0 = 0, c1 = %lld;", (long long)KC);
  cu_line(f, "float acc[%d];  // acc[j * %d + m]: column n0 + j, row m", P, MP);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int i = 0; i < %d; i++) acc[i] = 0.0f;", P);
  cu_open(f, "if (n0 < %lldLL)", (long long)gm->N);
  cu_line(f, "const %s *br[%d];  // column n0 + j (past N: the last column, its sums unused)", v->st, C);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int j = 0; j < %d; j++) br[j] = B + (n0 + j < %lldLL ? n0 + j : %lldLL) * %lldLL;", C, (long long)gm->N,
          (long long)gm->N - 1, (long long)gm->K);
  if (aligned_opt) {
    tb_stream(f, v, true);
  } else {
    cu_open(f, "if (vec_ok)");
    tb_stream(f, v, true);
    cu_close(f);
    cu_open(f, "else");
    tb_stream(f, v, false);
    cu_close(f);
  }
  cu_close(f);
  if (v->pairs) {
    /* pair mode: every lane gets every sum (P is small: C <= 8 columns,
     * M <= 8 rows), and lane q runs the epilogue of column pair q / M
     * (columns n0 + 2 (q / M) and the next) for row q %% M */
    cu_gemv_allreduce(f, P);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int q = 0; q < %d; q++)", C / 2 * M);
    const char *m = cu_tmp(f), *n = cu_tmp(f);
    cu_line(f, "const %s %s = q %% %d, %s = (%s)(n0 + 2 * (q / %d));", f->idx, m, M, n, f->idx, M);
    cu_open(f, "if (lane == q && %s < %lld)", n, (long long)gm->N);
    const char *s0 = cu_fmt(f, "acc[2 * (q / %d) * %d + q %% %d]", M, MP, M);
    const char *s1 = cu_fmt(f, "acc[(2 * (q / %d) + 1) * %d + q %% %d]", M, MP, M);
    if (p->splitk <= 1) {
      cu_gemm_store_pair_at(f, gm, v->z, m, n, s0, s1, v->epi, v->nepi);
    } else {
      result(f, v, m, n, s0);
      result(f, v, m, cu_fmt(f, "(%s + 1)", n), s1);
    }
    cu_close(f);
    cu_close(f);
  } else {
    int R = cu_gemv_transpose_reduce(f, P, 1);
    for (int r = 0; r < R; r++) {
      reduced_value(f, P, 1, R, r);
      const char *m = cu_tmp(f), *n = cu_tmp(f);
      cu_line(f, "const %s %s = i %% %d, %s = (%s)(n0 + i / %d);", f->idx, m, MP, n, f->idx, MP);
      cu_open(f, "if (%s < %d && %s < %lld)", m, M, n, (long long)gm->N);
      result(f, v, m, n, "s");
      cu_close(f);
      cu_close(f);
    }
  }
  if (p->splitk > 1) split_tail(f, v, cu_fmt(f, "(long long)blockIdx.x * %d", W * C), W * C, T);
  cu_close(f); /* z */
  l->pre_wait = tb_prefetch(f, v);
}

/* ---- B stored [K, N] ---- */

/* The loads of one step of the [K, N] stream into `dst` (smelt_pack [U]):
 * rows k + KG u of this thread's chunk, clamped into the slice. */
static void kn_loads(CuFn *f, const Gv *v, int U, int KG, const char *dst, const char *k) {
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int u = 0; u < %d; u++)", U);
  cu_line(f, "  %s[u] = load_b(reinterpret_cast<const smelt_pack<%s, %d> *>(B + (long long)(%s + %d * u < k1 ? %s + %d * u : k1 - 1) * %lldLL + nc));",
          dst, v->st, v->vec, k, KG, k, KG, (long long)v->gm->N);
}

/* The arithmetic of one step: rows k + KG u (u < U), from `src` or, without
 * one, element loads; guarded: rows at or past k1 add nothing. */
static void kn_compute(CuFn *f, const Gv *v, int U, int KG, const char *src, bool guarded) {
  const CuGemm *gm = v->gm;
  int vec = v->vec, M = v->M;
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int u = 0; u < %d; u++)", U);
  if (guarded) cu_line(f, "if (k + %d * u >= k1) break;", KG);
  cu_line(f, "const %s kr = k + %d * u;", f->idx, KG);
  cu_line(f, "float bf[%d];", vec);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int e = 0; e < %d; e++) bf[e] = %s;", vec,
          cu_from_storage(f, v->bdt, src ? cu_fmt(f, "%s[u].v[e]", src) : cu_fmt(f, "B[(long long)kr * %lldLL + nc + e]", (long long)gm->N)));
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int m = 0; m < %d; m++)", M);
  CuVal x;
  gm->load_a(f, gm, v->z, "m", "kr", &x);
  cu_line(f, "const float xm = (float)%s;", x.l[0]);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int e = 0; e < %d; e++) acc[m * %d + e] += xm * bf[e];", vec, vec);
  cu_close(f);
  cu_close(f);
}

/* The thread's stream over rows [k0, k1) of its chunk, software-pipelined
 * as in tb_stream. */
static void kn_stream(CuFn *f, const Gv *v, int KG, bool vector) {
  int U = v->p->unroll;
  cu_line(f, "int k = k0 + kg;");
  if (!vector) {
    cu_open(f, "for (; k < k1; k += %d)", KG);
    kn_compute(f, v, 1, KG, NULL, false);
    cu_close(f);
    return;
  }
  cu_open(f, "if (k < k1)");
  cu_line(f, "smelt_pack<%s, %d> next[%d];  // the next step's rows, loaded a step ahead", v->st, v->vec, U);
  kn_loads(f, v, U, KG, "next", "k");
  cu_open(f, "for (;;)");
  cu_line(f, "smelt_pack<%s, %d> b[%d];", v->st, v->vec, U);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int u = 0; u < %d; u++) b[u] = next[u];", U);
  cu_line(f, "const int kn = k + %d;", KG * U);
  cu_open(f, "if (kn < k1)");
  kn_loads(f, v, U, KG, "next", "kn");
  cu_close(f);
  kn_compute(f, v, U, KG, "b", true);
  cu_line(f, "k = kn;");
  cu_line(f, "if (k >= k1) break;");
  cu_close(f);
  cu_close(f);
}

static void emit_kn(CuFn *f, Gv *v, CuLaunch *l) {
  const CuGemm *gm = v->gm;
  const CuGemvParams *p = v->p;
  int W = p->warps, CL = p->cols, T = 32 * W, vec = v->vec, NB = CL * vec, KG = T / CL, M = v->M, MP = pow2_at_least(M);
  int64_t RPS = (gm->K + p->splitk - 1) / p->splitk;
  bool aligned_opt = f->opt && f->opt->args_aligned;
  (void)l;
  cu_line(f, "// B given as [K, N]: a block owns %d columns; thread (kg, c) reads columns n0 + %d c .. +%d at rows", NB, vec,
          vec - 1);
  cu_line(f, "// kg, kg + %d, ... of its slice, %d rows in flight", KG, p->unroll);
  if (!aligned_opt) cu_line(f, "const bool vec_ok = smelt_aligned(a%d, 16);", v->b0);
  cu_line(f, "const int warp = threadIdx.x / 32, lane = threadIdx.x %% 32;");
  cu_line(f, "const int c = threadIdx.x %% %d, kg = threadIdx.x / %d;", CL, CL);
  stream_lambda(f, v);
  if (p->splitk > 1)
    cu_line(f, "float *const part = reinterpret_cast<float *>(ws + %lluULL);  // split-K partial sums [Z][%d][M][N]",
            (unsigned long long)v->part_off, p->splitk);
  cu_line(f, "__shared__ float red[%d][%d][%d];  // per warp, row, column", W, M, NB);
  cu_open(f, "for (%s %s = blockIdx.z; %s < %lld; %s += gridDim.z)", f->idx, v->z, v->z, (long long)gm->Z, v->z);
  skip_past_batch(f, v);
  cu_line(f, "const %s *B = a%d + %s;  // %s", v->st, v->b0, cu_gemm_batch_offset(f, gm, v->z, gm->bt),
          f->g->val[gm->an->in[1]].name);
  cu_line(f, "const long long n0 = (long long)blockIdx.x * %d, nc = n0 + c * %d;", NB, vec);
  if (p->splitk > 1)
    cu_line(f, "const int k0 = (int)blockIdx.y * %lld, k1 = k0 + %lld < %lld ? k0 + %lld : %lld;  // this slice's rows",
            (long long)RPS, (long long)RPS, (long long)gm->K, (long long)RPS, (long long)gm->K);
  else cu_line(f, "const int k0 = 0, k1 = %lld;", (long long)gm->K);
  cu_line(f, "float acc[%d];  // acc[m * %d + e]: row m, column nc + e", MP * vec, vec);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int i = 0; i < %d; i++) acc[i] = 0.0f;", MP * vec);
  cu_open(f, "if (nc < %lldLL)", (long long)gm->N);
  if (aligned_opt) {
    kn_stream(f, v, KG, true);
  } else {
    cu_open(f, "if (vec_ok)");
    kn_stream(f, v, KG, true);
    cu_close(f);
    cu_open(f, "else");
    kn_stream(f, v, KG, false);
    cu_close(f);
  }
  cu_close(f);
  cu_line(f, "// add the row groups of a warp (lanes c, c + %d, ...), then of the block", CL);
  int P = MP * vec, R = cu_gemv_transpose_reduce(f, P, CL);
  for (int r = 0; r < R; r++) {
    reduced_value(f, P, CL, R, r);
    cu_line(f, "if (i < %d) red[warp][i / %d][c * %d + i %% %d] = s;", M * vec, vec, vec, vec);
    cu_close(f);
  }
  cu_line(f, "__syncthreads();");
  cu_open(f, "for (int i = threadIdx.x; i < %d; i += %d)", M * NB, T);
  cu_line(f, "const int col = i %% %d;", NB);
  cu_line(f, "float s = 0.0f;");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int w = 0; w < %d; w++) s += red[w][i / %d][col];", W, NB);
  const char *n = cu_tmp(f), *mm = cu_tmp(f);
  cu_line(f, "const %s %s = (%s)(n0 + col), %s = i / %d;", f->idx, n, f->idx, mm, NB);
  cu_open(f, "if (%s < %lld)", n, (long long)gm->N);
  result(f, v, mm, n, "s");
  cu_close(f);
  cu_close(f);
  cu_line(f, "__syncthreads();  // red is reused by the next batch");
  if (p->splitk > 1) split_tail(f, v, "n0", NB, T);
  cu_close(f); /* z */
}

void cu_emit_gemv(CuFn *f, const CuGemm *gm, const CuGemvParams *given, const int *epi, int nepi, CuLaunch *l) {
  const Graph *g = f->g;
  const Node *an = gm->an;
  /* pair mode needs both columns of a pair in one warp: an odd count a warp
   * (a tuning table row of the shape without the pair) runs as twice that
   * with half the chunks a step, the same loads in flight per lane
   * (measured on the H200, W5's gate/up K=2048 N=11264: c=1,u=8 as c=2,u=4
   * takes 19.2 us, as c=2,u=8 20.2 us) */
  bool pairs = gm->tb && cu_gemm_wants_pairs(f, gm);
  CuGemvParams pp = *given;
  if (pairs && pp.cols % 2) {
    pp.cols *= 2;
    pp.unroll = (pp.unroll + 1) / 2;
  }
  const CuGemvParams *p = &pp;
  cu_gemv_format(p, l->variant);
  l->kind = "matmul";
  if (!params_fit(gm, p)) {
    cu_fail(f, ST_UNSUPPORTED, "GEMV variant %s does not fit a %lld x %lld x %lld matmul (shared memory or workspace)",
            l->variant, (long long)gm->M, (long long)gm->N, (long long)gm->K);
    return;
  }
  Gv v = {.gm = gm, .p = p, .epi = epi, .nepi = nepi, .bdt = gm->bt->dt, .adt = gm->at->dt, .M = (int)gm->M,
          .pairs = pairs};
  v.st = cu_stype(v.bdt);
  v.sa = cu_stype(v.adt);
  v.vec = vec_of(gm);
  v.b0 = f->arg_of[an->in[1]];
  v.a0 = f->arg_of[an->in[0]];
  /* A is read as packs when it is a plain argument with k contiguous */
  const Value *av = &g->val[an->in[0]];
  v.x_vec = gm->tb && !gm->ta && v.a0 >= 0 && !(av->kind == VK_NODE && f->member[av->node]);
  v.norm = cu_gemv_norm_node(f, gm);
  if (v.norm) {
    v.y0 = f->arg_of[v.norm->in[0]];
    v.g0 = f->arg_of[v.norm->in[1]];
    v.ydt = g->val[v.norm->in[0]].type.dt;
    v.gdt = g->val[v.norm->in[1]].type.dt;
  }
  v.gx = col_blocks(gm, p);
  uint64_t ws = workspace_bytes(gm, p, &v.part_off);
  if (v.gx > 0x7fffffffLL || k_units(gm) > INT_MAX / 2) {
    cu_fail(f, ST_UNSUPPORTED, "a %lld x %lld matrix exceeds the GEMV's grid", (long long)gm->N, (long long)gm->K);
    return;
  }
  l->block[0] = (unsigned)(32 * p->warps);
  l->grid[0] = (unsigned)v.gx;
  l->grid[1] = (unsigned)p->splitk;
  l->grid[2] = (unsigned)(gm->Z < 1 ? 1 : gm->Z > 65535 ? 65535 : gm->Z);
  l->workspace = ws;
  if (gm->Z == 0) return;
  cu_line(f, "// variant: GEMV for M = %d (decode): %s read once with 16-byte loads, f32 accumulation%s", v.M,
          g->val[an->in[1]].name, p->splitk > 1 ? cu_fmt(f, ", K in %d slices", p->splitk) : "");
  v.z = cu_tmp(f);
  if (gm->tb) emit_tb(f, &v, l);
  else emit_kn(f, &v, l);
}

/* ---- the family's entry (cu_families.h) ---- */

static void family_default(const CuFn *f, const CuGemm *gm, char out[CG_VARIANT_LEN]) {
  CuGemvParams p;
  cu_gemv_default_params(f, gm, &p);
  cu_gemv_format(&p, out);
}

static int family_candidates(const CuFn *f, const CuGemm *gm, char (*out)[CG_VARIANT_LEN], int max) {
  return cu_gemv_candidates(f, gm, out, max);
}

static bool family_emit(CuFn *f, const CuGemm *gm, const char *tok, const int *epi, int nepi, CuLaunch *l) {
  CuGemvParams p;
  if (!cu_gemv_parse(tok, &p)) return false;
  cu_emit_gemv(f, gm, &p, epi, nepi, l);
  return true;
}

const CuGemmFamily cu_family_gemv = {"gemv", cu_gemv_eligible, family_default, family_candidates, family_emit};
