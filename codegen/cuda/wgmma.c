/* The Hopper matmul (sm_90a only): TMA loads into 128-byte-swizzled shared
 * memory, wgmma.mma_async from shared memory, warp-specialised producer and
 * consumer warpgroups, a persistent grid.
 *
 * Operands: A [M, K] and B [N, K] (transpose_b), both with K contiguous
 * ("K-major", the layout wgmma reads without transposing), f16 or bf16,
 * f32 accumulation, both kernel arguments, K a multiple of 8 (TMA needs
 * 16-byte row strides).  Batches: an A with the result's batch dims and a
 * B without any is one [Z*M, K] matrix (rows flattened); operands that
 * both carry the full batch, or only B does, are walked by the tile loop
 * with 3-D tensor maps {K, rows, Z}; broadcasting inside the batch dims
 * (a dim of 1 against a larger one) is not eligible.
 *
 * A block has 1 + c warpgroups of 128 threads.  Warpgroup 0 is the
 * producer: it gives registers back (setmaxnreg.dec) and one thread issues,
 * per K tile of 64, two bulk tensor copies (cp.async.bulk.tensor) of the
 * A box {64, BM} and the B box {64, BN} into stage s of `stages` buffers,
 * on mbarrier full[s] with the byte count it expects.  TMA writes each
 * 128-byte row of a box with the 128B swizzle (16-byte chunk index XOR
 * row % 8) and fills elements outside the tensor with zeros, so ragged M,
 * N and K need no special loads.  The consumers (setmaxnreg.inc) each own
 * BM/c rows of the tile as (BM/c)/64 accumulators of m64 x BN: they wait
 * for full[s], issue 4 wgmma m64nBNk16 per slice (k16 steps advance the
 * descriptors' start address by 32 bytes inside the swizzled rows), commit
 * them as a group and wait until at most that group is in flight, so the
 * previous stage's reads are over and one thread per warpgroup arrives on
 * empty[s'] for the producer.  Phases: a stage's barriers flip parity each
 * time the ring wraps; the producer waits on empty with the opposite
 * parity, so its first pass does not wait.
 *
 * The grid is persistent (at most one block per SM of an H100/H200): block
 * b takes tiles b, b + grid, ...; tiles are ordered in groups of up to 16
 * row blocks walked column by column, so that blocks running at the same
 * time share A and B tiles in L2.  While the consumers apply the epilogue
 * of one tile, the producer already loads the next.
 *
 * Split-K (token ",sk=N", N > 1): for few tiles, the work units are
 * (tile, slice) pairs, unit u being slice u % N of tile u / N, and slice s
 * the K tiles [s KT / N, (s + 1) KT / N) (N <= KT: none empty); producer
 * and consumers walk the same units.  After its slice, a consumer
 * warpgroup stores its f32 accumulators in the workspace (fragment order:
 * 16-byte stores, contiguous per warpgroup), __threadfence, and one thread
 * raises the (tile, warpgroup) counter with atomicAdd (a named barrier
 * orders the warpgroup's threads, not __syncthreads: the producer is
 * elsewhere).  The warpgroup that brings it to N adds the N partials in
 * slice order (so the result does not depend on which came last), clears
 * them and the counter (the workspace is all zero again when the kernel
 * ends: other kernels share it), and runs the epilogue; the others go on
 * to their next unit.  No block ever waits for another.
 *
 * Epilogue: consumer thread (warp w, lane l) holds, for each slice and each
 * 8-column group j, accumulators 4j .. 4j+3: rows 16w + l/4 (+8 for the
 * second pair), columns 8j + 2(l%4) (+1).  Each pair goes through the
 * group's fused elementwise ops (cu_store_epilogue) as two lanes, stored
 * with one vector store when N is even; rows and columns are guarded.
 *
 * The PTX is under __CUDA_ARCH__; without it (tests/gpu/cuda_emu.hpp on
 * the CPU) small stand-ins follow the PTX ISA: a copy that writes the
 * swizzled box, an mbarrier with arrival and byte counts, and a wgmma that
 * computes this thread's fragment from the descriptors, so the kernel's
 * indexing and its barrier protocol run without a GPU.  Compiled for
 * another GPU arch, the kernel traps: it is only generated for sm_90a.
 */
#include <stdio.h>
#include <string.h>

#include "codegen/cuda/cu_families.h"

/* Persistent grid: the SMs of an H100 SXM / H200 (one block per SM: the
 * stages fill shared memory); an H100 PCIe (114) gets a second, short
 * wave, still correct. */
#define WG_SMS 132
/* Row blocks per raster group (L2 reuse). */
#define WG_GROUP_M 16
/* Registers per thread after setmaxnreg: producer and consumers; with
 * 384 threads ptxas gives each thread 168 at launch, and
 * 128 x 40 + 256 x 232 = 168 x 384 exactly. */
#define WG_PRODUCER_REGS 40
#define WG_CONSUMER_REGS 232
/* The most f32 accumulators a consumer thread holds (BM/c/64 slices of BN/2). */
#define WG_MAX_ACC 128
/* The most split-K slices a token may ask for, and the largest workspace
 * a split-K variant may use. */
#define WG_MAX_SPLITK 32
#define WG_MAX_WORKSPACE ((uint64_t)512 << 20)

typedef struct {
  bool ok;
  bool a3, b3;       /* the operand's map is 3-D {K, rows, Z} */
  bool flat;         /* A's batch folded into its rows */
  int64_t rows;      /* rows of A as the tiles see them: M, or Z*M when flat */
  int64_t Z;         /* batches the tile loop walks (1 when flat) */
} WgLayout;

static bool is_arg_value(const CuFn *f, int v) {
  const Value *val = &f->g->val[v];
  if (f->arg_of[v] < 0) return false;
  return !(val->kind == VK_NODE && f->member[val->node]);
}

/* 1: operand t has no batch (all its batch dims are 1); 2: exactly the
 * result's batch dims; 0: anything else (broadcast inside the batch). */
static int batch_kind(const CuGemm *gm, const TensorType *t) {
  int nb = t->rank - 2;
  int64_t prod = 1;
  for (int d = 0; d < nb; d++) prod *= t->dim[d];
  if (prod == 1) return 1;
  if (nb != gm->nbatch) return 0;
  for (int d = 0; d < nb; d++)
    if (t->dim[d] != gm->yt->dim[d]) return 0;
  return 2;
}

static WgLayout layout(const CuGemm *gm) {
  WgLayout L = {.ok = false};
  if (gm->a1 || gm->b1 || gm->ta || !gm->tb) return L;
  int ka = batch_kind(gm, gm->at), kb = batch_kind(gm, gm->bt);
  if (!ka || !kb) return L;
  L.ok = true;
  L.rows = gm->M;
  L.Z = gm->Z;
  if (gm->Z <= 1) {
    L.Z = 1;
  } else if (ka == 2 && kb == 1) {
    L.flat = true;
    L.rows = gm->Z * gm->M;
    L.Z = 1;
  } else {
    L.a3 = ka == 2;
    L.b3 = kb == 2;
  }
  return L;
}

bool cu_wgmma_eligible(const CuFn *f, const CuGemm *gm) {
  const Node *an = gm->an;
  if (an->op != OP_MATMUL) return false;
  DType dt = gm->yt->dt;
  if (dt != DT_F16 && dt != DT_BF16) return false;
  if (gm->at->dt != dt || gm->bt->dt != dt) return false;
  /* TMA: 16-byte aligned bases (only args_aligned promises them) and row strides */
  if (!f->opt || !f->opt->args_aligned) return false;
  if (gm->K < 8 || gm->K % 8 != 0 || gm->M < 1 || gm->N < 1 || gm->Z < 1) return false;
  WgLayout L = layout(gm);
  if (!L.ok) return false;
  /* TMA coordinates are 32-bit signed */
  if (L.rows > 0x7fffffffLL || gm->N > 0x7fffffffLL || gm->K > 0x7fffffffLL || L.Z > 0x7fffffffLL) return false;
  return is_arg_value(f, an->in[0]) && is_arg_value(f, an->in[1]);
}

/* ---- parameters ---- */

static int64_t smem_bytes(const CuWgmmaParams *p) {
  /* the stages, two mbarriers per stage, and slack to align the base to 1024 */
  return (int64_t)p->stages * (p->BM + p->BN) * 128 + 16LL * p->stages + 1024;
}

static bool params_valid(const CuWgmmaParams *p) {
  if (p->BK != 64 || (p->consumers != 1 && p->consumers != 2)) return false;
  if (p->splitk < 1 || p->splitk > WG_MAX_SPLITK) return false;
  if (p->BM < 64 || p->BM > 256 || p->BM % (64 * p->consumers) != 0) return false;
  if (p->BN < 8 || p->BN > 256 || p->BN % 8 != 0) return false;
  if (p->stages < 2 || p->stages > 8) return false;
  if (p->BM / p->consumers / 64 * p->BN / 2 > WG_MAX_ACC) return false;
  IrCudaArchLimits lim;
  ir_cuda_arch_limits("sm_90a", &lim);
  return smem_bytes(p) <= lim.smem_per_block;
}

bool cu_wgmma_parse(const char *tok, CuWgmmaParams *out) {
  static const char prefix[] = "wgmma:";
  if (strncmp(tok, prefix, sizeof prefix - 1) != 0) return false;
  /* sk (split-K) is optional: 1 when absent */
  static const char *const keys[] = {"bm", "bn", "bk", "st", "c", "sk"};
  int val[6] = {0, 0, 0, 0, 0, 1}, seen = 0;
  const char *p = tok + sizeof prefix - 1;
  while (*p) {
    int k = -1;
    for (int i = 0; i < 6; i++) {
      size_t n = strlen(keys[i]);
      if (strncmp(p, keys[i], n) == 0 && p[n] == '=') {
        k = i;
        p += n + 1;
        break;
      }
    }
    if (k < 0 || (seen & (1 << k))) return false;
    int v = 0, digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 6) v = v * 10 + (*p++ - '0'), digits++;
    if (!digits) return false;
    val[k] = v;
    seen |= 1 << k;
    if (*p == ',' && p[1]) p++;
    else if (*p) return false;
  }
  if ((seen & 31) != 31) return false;
  CuWgmmaParams q = {val[0], val[1], val[2], val[3], val[4], val[5]};
  if (!params_valid(&q)) return false;
  *out = q;
  return true;
}

void cu_wgmma_format(const CuWgmmaParams *p, char out[CG_VARIANT_LEN]) {
  if (p->splitk > 1)
    snprintf(out, CG_VARIANT_LEN, "wgmma:bm=%d,bn=%d,bk=%d,st=%d,c=%d,sk=%d", p->BM, p->BN, p->BK, p->stages,
             p->consumers, p->splitk);
  else
    snprintf(out, CG_VARIANT_LEN, "wgmma:bm=%d,bn=%d,bk=%d,st=%d,c=%d", p->BM, p->BN, p->BK, p->stages, p->consumers);
}

/* The most stages that fit (at most 8). */
static int max_stages(int BM, int BN, int c) {
  int st = 8;
  for (; st > 2; st--) {
    CuWgmmaParams p = {BM, BN, 64, st, c, 1};
    if (params_valid(&p)) break;
  }
  return st;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The workspace of a split-K variant over T tiles: a counter per (tile,
 * consumer warpgroup), padded to 256 bytes, then the f32 partial tiles
 * [T][consumers][splitk][BM/consumers x BN]; 0 without split-K. */
static uint64_t workspace_bytes(int64_t T, const CuWgmmaParams *p, uint64_t *out_part_off) {
  *out_part_off = 0;
  if (p->splitk <= 1) return 0;
  uint64_t counters = ((uint64_t)T * (uint64_t)p->consumers * 4 + 255) / 256 * 256;
  *out_part_off = counters;
  return counters + (uint64_t)T * (uint64_t)p->splitk * (uint64_t)p->BM * (uint64_t)p->BN * 4;
}

/* Tiles of a BM x BN tiling of gm (the tile loop's batches included). */
static int64_t tiles_of(const CuGemm *gm, int BM, int BN) {
  WgLayout L = layout(gm);
  int64_t rows = L.ok ? L.rows : gm->M, Z = L.ok ? L.Z : 1;
  return ceil_div(rows, BM) * ceil_div(gm->N, BN) * Z;
}

/* Whether sk slices suit gm's K and a BM x BN tiling: every slice keeps
 * at least WG_MIN_SLICE_KT K tiles, and the workspace fits. */
#define WG_MIN_SLICE_KT 4
static bool splitk_fits(const CuGemm *gm, const CuWgmmaParams *p) {
  if (p->splitk == 1) return true;
  uint64_t off;
  return ceil_div(gm->K, 64) >= (int64_t)WG_MIN_SLICE_KT * p->splitk &&
         workspace_bytes(tiles_of(gm, p->BM, p->BN), p, &off) <= WG_MAX_WORKSPACE;
}

/* The estimated time of a tiling: whole waves of the persistent grid
 * (units = tiles x sk over WG_SMS blocks) times one unit's work, in
 * BM x BN x 64 steps discounted by the tile's efficiency `eff`.  A split
 * unit also stores its partial tile, and the last slice reads and clears
 * all of them: counted as about one K tile of work per slice (an f32
 * tile through L2 costs about what a K tile of wgmma does). */
static double tiling_cost(const CuGemm *gm, int BM, int BN, double eff, int sk) {
  int64_t units = tiles_of(gm, BM, BN) * sk, KT = ceil_div(gm->K, 64);
  double per_unit = (double)ceil_div(KT, sk) + (sk > 1 ? sk : 0);
  return (double)ceil_div(units, WG_SMS) * per_unit * BM * BN / eff;
}

/* Whether the heuristic splits K at all.  Measured on the H200
 * (2026-11-30, smelt tune on W4 prefill): every split was slower than the
 * same shape unsplit, e.g. 512x2560x2048 18.6 us unsplit (128x128 tiles,
 * 0.6 of a wave) against 30.1 us at 128x256 sk=3 and 27.5 us at 64x128
 * sk=2, and 512x2048x2048 12.4 us against 18.6 us at sk=2: writing,
 * re-reading and clearing the f32 partial tiles costs more than the idle
 * SMs.  So the default does not split; the tuner still tries the splits
 * (cu_wgmma_candidates), and tiling_cost below keeps the model. */
#define WG_HEURISTIC_SPLITK 0

/* The split-K of a BM x BN tiling with the least estimated time; a split
 * must win by 10% (the estimate is rough, and slices cost workspace). */
static int pick_splitk(const CuGemm *gm, int BM, int BN, int c, double *out_cost) {
  int best = 1;
  double best_cost = tiling_cost(gm, BM, BN, 1.0, 1);
  for (int sk = 2; WG_HEURISTIC_SPLITK && sk <= 16; sk++) {
    CuWgmmaParams q = {BM, BN, 64, 2, c, sk};
    if (!splitk_fits(gm, &q)) break;
    double cost = tiling_cost(gm, BM, BN, 1.0, sk) * 1.1;
    if (cost < best_cost) best = sk, best_cost = cost;
  }
  if (out_cost) *out_cost = best_cost;
  return best;
}

void cu_wgmma_default_params(const CuGemm *gm, CuWgmmaParams *out) {
  WgLayout L = layout(gm);
  int64_t rows = L.ok ? L.rows : gm->M, Z = L.ok ? L.Z : 1;
  if (rows <= 64) {
    /* few rows: bound by reading B; narrower tiles put more SMs to it,
     * and split-K the rest when even 64 x 64 tiles leave SMs idle */
    int BN = ceil_div(gm->N, 256) * Z >= WG_SMS ? 256 : ceil_div(gm->N, 128) * Z >= WG_SMS / 2 ? 128 : 64;
    *out = (CuWgmmaParams){64, BN, 64, max_stages(64, BN, 1), 1, pick_splitk(gm, 64, BN, 1, NULL)};
    return;
  }
  /* Two consumers; among 128 x 256, 256 x 128 and 128 x 128 tiles and
   * their splits of K, the one with the least estimated time
   * (tiling_cost), the smaller tile discounted for its lower reuse of
   * shared memory. */
  static const struct {
    int BM, BN;
    double eff;
  } shapes[] = {{128, 256, 1.0}, {256, 128, 1.0}, {128, 128, 0.85}};
  int best = -1, best_sk = 1;
  double best_cost = 0;
  for (int i = 0; i < 3; i++) {
    if (shapes[i].BM > 128 && rows <= 128) continue;
    double cost;
    int sk = pick_splitk(gm, shapes[i].BM, shapes[i].BN, 2, &cost);
    cost /= shapes[i].eff;
    if (best < 0 || cost < best_cost) best = i, best_cost = cost, best_sk = sk;
  }
  int BM = shapes[best].BM, BN = shapes[best].BN;
  *out = (CuWgmmaParams){BM, BN, 64, max_stages(BM, BN, 2), 2, best_sk};
}

/* Adds p to list[0..*n) unless it is there already (or the list is full). */
static void add_candidate(CuWgmmaParams *list, int *n, int cap, const CuWgmmaParams *p) {
  for (int j = 0; j < *n; j++)
    if (!memcmp(&list[j], p, sizeof *p)) return;
  if (*n < cap) list[(*n)++] = *p;
}

int cu_wgmma_candidates(const CuGemm *gm, char (*out)[CG_VARIANT_LEN], int max) {
  WgLayout L = layout(gm);
  int64_t rows = L.ok ? L.rows : gm->M;
  CuWgmmaParams list[32];
  int n = 0;
  cu_wgmma_default_params(gm, &list[n++]);
  static const CuWgmmaParams more[] = {
      {128, 256, 64, 4, 2, 1}, {128, 128, 64, 6, 2, 1}, {256, 128, 64, 4, 2, 1},
      {128, 256, 64, 3, 2, 1}, {64, 256, 64, 5, 1, 1},  {64, 128, 64, 8, 1, 1},
  };
  for (size_t i = 0; i < sizeof more / sizeof *more; i++) {
    const CuWgmmaParams *p = &more[i];
    /* tiles much taller or wider than the result only waste work */
    if ((p->BM > 64 && rows <= 64) || (p->BM > 128 && rows <= 128) || (p->BN > 128 && gm->N <= 128)) continue;
    add_candidate(list, &n, 32, p);
  }
  /* Tiles cut to the grid: for each tile height and 1-3 waves, the
   * narrowest multiple of 8 columns (>= 64) whose tiles fill those waves
   * of WG_SMS blocks without going over (512x2560: 128x80 tiles, 128 of
   * them, instead of 80 tiles of 128x128, 0.6 of a wave).  wgmma takes any
   * N that is a multiple of 8. */
  static const struct {
    int BM, c;
  } heights[] = {{128, 2}, {64, 1}};
  for (size_t h = 0; h < sizeof heights / sizeof *heights; h++) {
    int BM = heights[h].BM, c = heights[h].c;
    if (BM > 64 && rows <= 64) continue;
    int64_t rb = ceil_div(rows, BM) * (L.ok ? L.Z : 1);
    for (int waves = 1; waves <= 3; waves++) {
      int64_t cols = (int64_t)WG_SMS * waves / rb; /* column blocks that fit */
      if (cols < 1) continue;
      int64_t BN = (ceil_div(gm->N, cols) + 7) / 8 * 8;
      if (BN < 64 || BN > 256) continue;
      CuWgmmaParams q = {BM, (int)BN, 64, max_stages(BM, (int)BN, c), c, 1};
      if (params_valid(&q)) add_candidate(list, &n, 32, &q);
    }
  }
  int nbase = n;
  /* Split-K for tilings of less than two waves: per tiling (the default's
   * without its split too), the split the estimate likes best and the
   * largest that still fits one wave. */
  CuWgmmaParams d = list[0];
  d.splitk = 1;
  add_candidate(list, &n, 32, &d);
  for (int i = 0; i < nbase; i++) {
    CuWgmmaParams q = list[i];
    int64_t tiles = tiles_of(gm, q.BM, q.BN);
    if (q.splitk > 1 || tiles >= 2 * WG_SMS) continue;
    int sks[2] = {1, 1};
    double best = 0;
    for (int sk = 2; sk <= 16; sk++) {
      q.splitk = sk;
      if (!splitk_fits(gm, &q)) break;
      double cost = tiling_cost(gm, q.BM, q.BN, 1.0, sk);
      if (sks[0] == 1 || cost < best) sks[0] = sk, best = cost;
      if (tiles * sk <= WG_SMS) sks[1] = sk;
    }
    for (int j = 0; j < 2; j++)
      if (sks[j] > 1) q.splitk = sks[j], add_candidate(list, &n, 32, &q);
  }
  int got = 0;
  for (int i = 0; i < n && got < max; i++) cu_wgmma_format(&list[i], out[got++]);
  return got;
}

/* ---- the kernel ---- */

/* The emulation's stand-ins (host only): an mbarrier with its arrival and
 * transaction counts under a spin lock, the 128B swizzle of a shared
 * address, f16/bf16 to float. */
static const char emu_helpers[] =
    "#ifndef __CUDA_ARCH__\n"
    "// Host emulation (tests/gpu/cuda_emu.hpp): the PTX below, after the PTX ISA.  Barrier state\n"
    "// changes under one mutex; waiting threads sleep on a condition variable.\n"
    "static pthread_mutex_t emu_mx = PTHREAD_MUTEX_INITIALIZER;\n"
    "static pthread_cond_t emu_cv = PTHREAD_COND_INITIALIZER;\n"
    "struct emu_mbar { int count, pending, phase; long long tx; };\n"
    "// A warpgroup's wgmma is one collective operation: its thread that signals the producer\n"
    "// knows the whole warpgroup is done.  Here, wgmma.wait_group is a barrier of the warpgroup.\n"
    "struct emu_wgbar { int count, gen; };\n"
    "__shared__ emu_wgbar emu_wgbars[4];\n"
    "auto emu_wg_sync = [&]() {\n"
    "  emu_wgbar *w = &emu_wgbars[threadIdx.x / 128];\n"
    "  pthread_mutex_lock(&emu_mx);\n"
    "  const int gen = w->gen;\n"
    "  if (++w->count == 128) w->count = 0, w->gen++, pthread_cond_broadcast(&emu_cv);\n"
    "  else while (w->gen == gen) pthread_cond_wait(&emu_cv, &emu_mx);\n"
    "  pthread_mutex_unlock(&emu_mx);\n"
    "};\n"
    "// a phase completes when its arrivals are in and its expected bytes have landed\n"
    "auto emu_settle = [](emu_mbar *b) {\n"
    "  if (b->pending == 0 && b->tx == 0) b->phase ^= 1, b->pending = b->count, pthread_cond_broadcast(&emu_cv);\n"
    "};\n"
    "// the 128B swizzle: address bits [4, 7) XOR bits [7, 10)\n"
    "auto emu_swz = [](unsigned a) { return a ^ (((a >> 7) & 7u) << 4); };\n"
    "auto emu_cvt = [](unsigned short h, bool bf16) -> float {\n"
    "  if (bf16) { unsigned u = (unsigned)h << 16; float v; memcpy(&v, &u, 4); return v; }\n"
    "  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;\n"
    "  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);\n"
    "  return s ? -v : v;\n"
    "};\n"
    "#endif\n";

typedef struct {
  const CuGemm *gm;
  const CuWgmmaParams *p;
  WgLayout L;
  int MS;              /* m64 slices per consumer */
  int NH;              /* accumulators per slice: BN / 2 */
  int64_t Mt, Nt, T;   /* row blocks, column blocks, tiles */
  int GM;              /* row blocks per raster group */
  int64_t KT;          /* K tiles */
  int SK;              /* split-K slices per tile (1: none) */
  int64_t U;           /* work units: T x SK */
  uint64_t part_off;   /* split-K: the partial tiles' offset in the workspace */
  /* ranged dims (NULL when fixed): this run's rows of A as the tiles see
   * them when they are a prefix of L.rows, the test that `row` is one of
   * them, and the test that batch tz holds none */
  const char *run_rows, *row_live, *z_past;
  int a_stage, b_stage;
  const char *ptx_type; /* "f16" or "bf16" */
} Wg;

/* `t` (a tile index) to its batch tz, row block tm and column block tn. */
static void tile_coords(CuFn *f, const Wg *w) {
  int64_t per_z = w->Mt * w->Nt, per_group = (int64_t)w->GM * w->Nt;
  if (w->L.Z > 1) cu_line(f, "const int tz = t / %lld, tr = t %% %lld;  // batch, tile within it", (long long)per_z,
                          (long long)per_z);
  else cu_line(f, "const int tr = t;");
  cu_line(f, "// groups of %d row blocks, walked column by column (L2 reuse)", w->GM);
  cu_line(f, "const int first = tr / %lld * %d, in_group = tr %% %lld;", (long long)per_group, w->GM, (long long)per_group);
  cu_line(f, "const int rows_in = %lld - first < %d ? %lld - first : %d;", (long long)w->Mt, w->GM, (long long)w->Mt, w->GM);
  cu_line(f, "const int tm = first + in_group %% rows_in, tn = in_group / rows_in;");
}

/* Opens the persistent loop over the work units of block blockIdx.x and
 * declares the unit's tile (tile_coords) and its K tiles [kt0, kt1).
 * Without split-K a unit is a tile; with it, unit u is slice u % SK of
 * tile u / SK (the slices of a tile run side by side, so the last of them
 * finds the others' partial tiles still in L2), and slice s takes K tiles
 * [s KT / SK, (s + 1) KT / SK): balanced and, as SK <= KT, never empty. */
static void unit_loop(CuFn *f, const Wg *w) {
  if (w->SK == 1) {
    cu_open(f, "for (int t = blockIdx.x; t < %lld; t += gridDim.x)", (long long)w->T);
    tile_coords(f, w);
    cu_line(f, "const int kt0 = 0, kt1 = %lld;", (long long)w->KT);
  } else {
    cu_open(f, "for (int u = blockIdx.x; u < %lld; u += gridDim.x)", (long long)w->U);
    cu_line(f, "const int t = u / %d, slice = u %% %d;  // tile, and its slice of K", w->SK, w->SK);
    tile_coords(f, w);
    cu_line(f, "const int kt0 = (int)((long long)slice * %lld / %d), kt1 = (int)((long long)(slice + 1) * %lld / %d);",
            (long long)w->KT, w->SK, (long long)w->KT, w->SK);
  }
  /* Ranged dims: a unit whose tile lies wholly past this run's rows is
   * skipped.  The producer and the consumers walk the same units and skip
   * the same ones, so their stage and phase counters stay in step; every
   * slice of a skipped tile skips it, so its split-K counter stays 0. */
  if (w->run_rows || w->z_past)
    cu_line(f, "if (%s%s%s) continue;  // ranged dims: nothing of this run in this tile",
            w->run_rows ? cu_fmt(f, "(long long)tm * %d >= %s", w->p->BM, w->run_rows) : "",
            w->run_rows && w->z_past ? " || " : "", w->z_past ? w->z_past : "");
}

/* A lambda's opening and closing lines (its body never calls cu_emit, so
 * it needs no memo scope). */
static void lambda_open(CuFn *f, const char *head) {
  cu_line(f, "%s {", head);
  f->indent++;
}

static void lambda_close(CuFn *f) {
  f->indent--;
  cu_line(f, "};");
}

/* The lambdas every role uses: mbarriers, the two TMA loads, descriptors,
 * one wgmma; each with its PTX and its host stand-in. */
static void helpers(CuFn *f, const Wg *w) {
  const CuGemm *gm = w->gm;
  const CuWgmmaParams *p = w->p;
  bool bf16 = gm->yt->dt == DT_BF16;
  int a0 = f->arg_of[gm->an->in[0]], b0 = f->arg_of[gm->an->in[1]];
  for (const char *line = emu_helpers; *line;) {
    const char *nl = strchr(line, '\n');
    cu_line(f, "%.*s", (int)(nl - line), line);
    line = nl + 1;
  }
  cu_line(f, "#ifndef __CUDA_ARCH__");
  cu_line(f, "__shared__ emu_mbar emu_bars[%d];  // full[], then empty[]", 2 * p->stages);
  cu_line(f, "auto emu_bar = [&](unsigned bar) { return &emu_bars[(bar - bar_full) / 8]; };");
  cu_line(f, "#endif");

  cu_line(f, "// mbarrier: `count` arrivals (and the bytes announced) complete a phase");
  lambda_open(f, "auto bar_init = [&](unsigned bar, unsigned count)");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "asm volatile(\"mbarrier.init.shared::cta.b64 [%%0], %%1;\\n\" :: \"r\"(bar), \"r\"(count) : \"memory\");");
  cu_line(f, "#else");
  cu_line(f, "*emu_bar(bar) = emu_mbar{(int)count, (int)count, 0, 0};");
  cu_line(f, "#endif");
  lambda_close(f);
  cu_line(f, "// waits until the phase of the given parity has completed");
  lambda_open(f, "auto bar_wait = [&](unsigned bar, unsigned parity)");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "unsigned done = 0;");
  cu_line(f, "while (!done)");
  cu_line(f, "  asm volatile(\"{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 p, [%%1], %%2;\\n"
             "selp.u32 %%0, 1, 0, p;\\n}\\n\" : \"=r\"(done) : \"r\"(bar), \"r\"(parity) : \"memory\");");
  cu_line(f, "#else");
  cu_line(f, "emu_mbar *b = emu_bar(bar);");
  cu_line(f, "pthread_mutex_lock(&emu_mx);");
  cu_line(f, "while ((unsigned)b->phase == parity) pthread_cond_wait(&emu_cv, &emu_mx);");
  cu_line(f, "pthread_mutex_unlock(&emu_mx);");
  cu_line(f, "#endif");
  lambda_close(f);
  lambda_open(f, "auto bar_arrive = [&](unsigned bar)");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "asm volatile(\"mbarrier.arrive.shared::cta.b64 _, [%%0];\\n\" :: \"r\"(bar) : \"memory\");");
  cu_line(f, "#else");
  cu_line(f, "emu_mbar *b = emu_bar(bar);");
  cu_line(f, "pthread_mutex_lock(&emu_mx);");
  cu_line(f, "b->pending--;");
  cu_line(f, "emu_settle(b);");
  cu_line(f, "pthread_mutex_unlock(&emu_mx);");
  cu_line(f, "#endif");
  lambda_close(f);
  cu_line(f, "// one arrival that also announces the bytes the copies will deliver");
  lambda_open(f, "auto bar_arrive_expect = [&](unsigned bar, unsigned bytes)");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%%0], %%1;\\n\" :: \"r\"(bar), \"r\"(bytes) : \"memory\");");
  cu_line(f, "#else");
  cu_line(f, "emu_mbar *b = emu_bar(bar);");
  cu_line(f, "pthread_mutex_lock(&emu_mx);");
  cu_line(f, "b->tx += bytes;");
  cu_line(f, "b->pending--;");
  cu_line(f, "emu_settle(b);");
  cu_line(f, "pthread_mutex_unlock(&emu_mx);");
  cu_line(f, "#endif");
  lambda_close(f);

  /* the TMA loads: A box {64, BM} at (k, row), B box {64, BN} at (k, n) */
  for (int op = 0; op < 2; op++) {
    bool is3 = op == 0 ? w->L.a3 : w->L.b3;
    int box = op == 0 ? p->BM : p->BN, arg = op == 0 ? a0 : b0;
    int64_t rows = op == 0 ? w->L.rows : gm->N;
    cu_line(f, "// %s: the box {64, %d} at (k, row%s) into `dst` (128B swizzle, zeros outside), on mbarrier `bar`",
            op == 0 ? "A" : "B", box, is3 ? ", z" : "");
    lambda_open(f, cu_fmt(f, "auto load_%s = [&](unsigned dst, unsigned bar, int k, int row, int z)", op == 0 ? "a" : "b"));
    if (!is3) cu_line(f, "(void)z;  // a 2-D map: no batch coordinate");
    cu_line(f, "#ifdef __CUDA_ARCH__");
    if (is3)
      cu_line(f, "asm volatile(\"cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%%0], [%%1, "
                 "{%%2, %%3, %%4}], [%%5];\\n\" :: \"r\"(dst), \"l\"(&tm%d), \"r\"(k), \"r\"(row), \"r\"(z), \"r\"(bar) : "
                 "\"memory\");",
              op);
    else
      cu_line(f, "asm volatile(\"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%%0], [%%1, "
                 "{%%2, %%3}], [%%4];\\n\" :: \"r\"(dst), \"l\"(&tm%d), \"r\"(k), \"r\"(row), \"r\"(bar) : \"memory\");",
              op);
    cu_line(f, "#else");
    cu_line(f, "const unsigned short *src = reinterpret_cast<const unsigned short *>(a%d)%s;", arg,
            is3 ? cu_fmt(f, " + (long long)z * %lldLL", (long long)(rows * gm->K)) : "");
    cu_open(f, "for (int i = 0; i < %d; i++)", box * 64);
    cu_line(f, "const int r = i / 64, c = i %% 64;");
    cu_line(f, "const long long gr = (long long)row + r, gk = (long long)k + c;");
    cu_line(f, "const unsigned short v = gr < %lldLL && gk < %lldLL ? src[gr * %lldLL + gk] : (unsigned short)0;",
            (long long)rows, (long long)gm->K, (long long)gm->K);
    cu_line(f, "memcpy(smelt_wg_smem + emu_swz(dst + r * 128 + c * 2), &v, 2);");
    cu_close(f);
    cu_line(f, "emu_mbar *b = emu_bar(bar);");
    cu_line(f, "pthread_mutex_lock(&emu_mx);");
    cu_line(f, "b->tx -= %d;", box * 128);
    cu_line(f, "emu_settle(b);");
    cu_line(f, "pthread_mutex_unlock(&emu_mx);");
    cu_line(f, "#endif");
    lambda_close(f);
  }

  cu_line(f, "// shared-memory matrix descriptor: start address >> 4 in bits [0, 14), leading byte offset 16 >> 4 (unused");
  cu_line(f, "// with the swizzle), stride byte offset 1024 >> 4 (8-row groups) in [32, 46), 128B swizzle (1) in [62, 64)");
  cu_line(f, "auto desc = [](unsigned addr) -> unsigned long long {");
  cu_line(f, "  return (unsigned long long)((addr & 0x3FFFFu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);");
  cu_line(f, "};");

  /* one wgmma: N = BN, BN/2 f32 accumulators per thread */
  int NH = w->NH;
  CuBuf regs = {0}, cons = {0};
  for (int i = 0; i < NH; i++) {
    cu_buf_printf(&regs, "%s%%%d", i ? ", " : "", i);
    cu_buf_printf(&cons, "%s\"+f\"(d[%d])", i ? ", " : "", i);
  }
  cu_line(f, "// d (64 x %d, f32, this thread's %d values) += A (64 x 16 at da) * B (16 x %d at db), both K-major", p->BN, NH,
          p->BN);
  lambda_open(f, cu_fmt(f, "auto mma = [&](float (&d)[%d], unsigned long long da, unsigned long long db)", NH));
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %%%d, 0;\\n\"", NH + 2);
  cu_line(f, "             \"wgmma.mma_async.sync.aligned.m64n%dk16.f32.%s.%s {%s}, %%%d, %%%d, p, 1, 1, 0, 0;\\n}\\n\"",
          p->BN, w->ptx_type, w->ptx_type, cu_buf_str(f, &regs), NH, NH + 1);
  cu_line(f, "             : %s", cu_buf_str(f, &cons));
  cu_line(f, "             : \"l\"(da), \"l\"(db), \"r\"(1));");
  cu_line(f, "#else");
  cu_line(f, "// fragment: value i is row 16 warp + lane/4 (+8 when i & 2), column 8 (i/4) + 2 (lane%%4) + (i & 1);");
  cu_line(f, "// element (r, k) of a descriptor's matrix is at start + (r/8) stride + (r%%8) 128 + 2k, then swizzled");
  cu_line(f, "const int w = (threadIdx.x / 32) %% 4, l = threadIdx.x %% 32;");
  cu_line(f, "auto elem = [&](unsigned long long dsc, int r, int k) {");
  cu_line(f, "  const unsigned start = (unsigned)(dsc & 0x3FFFu) << 4, stride = (unsigned)((dsc >> 32) & 0x3FFFu) << 4;");
  cu_line(f, "  unsigned short h;");
  cu_line(f, "  memcpy(&h, smelt_wg_smem + emu_swz(start + (r / 8) * stride + (r %% 8) * 128 + 2 * k), 2);");
  cu_line(f, "  return emu_cvt(h, %s);", bf16 ? "true" : "false");
  cu_line(f, "};");
  cu_line(f, "float ar[2][16], bc[%d][16];  // this thread's rows of A, columns of B", NH / 2);
  cu_line(f, "for (int k = 0; k < 16; k++) {");
  cu_line(f, "  for (int h = 0; h < 2; h++) ar[h][k] = elem(da, 16 * w + l / 4 + 8 * h, k);");
  cu_line(f, "  for (int q = 0; q < %d; q++) bc[q][k] = elem(db, 8 * (q >> 1) + 2 * (l %% 4) + (q & 1), k);", NH / 2);
  cu_line(f, "}");
  cu_open(f, "for (int i = 0; i < %d; i++)", NH);
  cu_line(f, "const float *a = ar[(i >> 1) & 1], *b = bc[(i >> 2) * 2 + (i & 1)];");
  cu_line(f, "float sum = 0.0f;");
  cu_line(f, "for (int k = 0; k < 16; k++) sum += a[k] * b[k];");
  cu_line(f, "d[i] += sum;");
  cu_close(f);
  cu_line(f, "#endif");
  lambda_close(f);
  cu_buf_free(&regs);
  cu_buf_free(&cons);
}

/* A PTX statement that the host emulation skips. */
static void ptx(CuFn *f, const char *stmt) {
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "%s", stmt);
  cu_line(f, "#endif");
}

/* wgmma.wait_group n; in the emulation, a barrier of the warpgroup. */
static void wait_group(CuFn *f, int n) {
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "asm volatile(\"wgmma.wait_group.sync.aligned %d;\\n\" ::: \"memory\");", n);
  cu_line(f, "#else");
  cu_line(f, "emu_wg_sync();");
  cu_line(f, "#endif");
}

static void producer(CuFn *f, const Wg *w) {
  const CuWgmmaParams *p = w->p;
  cu_line(f, "// producer warpgroup: hands registers to the consumers; one thread issues the loads");
  ptx(f, cu_fmt(f, "asm volatile(\"setmaxnreg.dec.sync.aligned.u32 %d;\\n\");", WG_PRODUCER_REGS));
  cu_open(f, "if (threadIdx.x == 0)");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "asm volatile(\"prefetch.tensormap [%%0];\\n\" :: \"l\"(&tm0) : \"memory\");");
  cu_line(f, "asm volatile(\"prefetch.tensormap [%%0];\\n\" :: \"l\"(&tm1) : \"memory\");");
  cu_line(f, "#endif");
  cu_line(f, "int stage = 0;");
  cu_line(f, "unsigned phase = 0;");
  unit_loop(f, w);
  cu_open(f, "for (int kt = kt0; kt < kt1; kt++)");
  cu_line(f, "bar_wait(bar_empty + 8 * stage, phase ^ 1);  // the consumers are done with this buffer");
  cu_line(f, "bar_arrive_expect(bar_full + 8 * stage, %d);", (p->BM + p->BN) * 128);
  const char *tz = w->L.Z > 1 ? "tz" : "0";
  cu_line(f, "load_a(smem_a + stage * %d, bar_full + 8 * stage, kt * 64, tm * %d, %s);", w->a_stage, p->BM, tz);
  cu_line(f, "load_b(smem_b + stage * %d, bar_full + 8 * stage, kt * 64, tn * %d, %s);", w->b_stage, p->BN, tz);
  cu_line(f, "if (++stage == %d) stage = 0, phase ^= 1;", p->stages);
  cu_close(f);
  cu_close(f);
  cu_close(f);
}

/* Emits the anchor result at (row, col[, col + 1]) through the epilogue;
 * `a0` and `a1` are the accumulators of col and col + 1. */
static void store_pair(CuFn *f, const Wg *w, const char *z, const char *m, const char *col, const char *a0,
                       const char *a1, const int *epi, int nepi) {
  const CuGemm *gm = w->gm;
  const Graph *g = f->g;
  const Value *av = &g->val[gm->an->out[0]];
  CuCoords co;
  CuVal val;
  if (!(gm->N % 2)) {
    /* n even and N even: both columns are inside, one vector store */
    gm->result(f, gm, z, m, col, a0, &co, &val);
    const char *r0 = cu_tmp(f), *r1 = cu_tmp(f);
    cu_line(f, "const %s %s = %s, %s = %s;  // %s (%s), columns col, col + 1", cu_ctype(av->type.dt), r0, val.l[0], r1,
            cu_normalise(f, av->type.dt, a1), av->name, ir_op_name(gm->an->op));
    co.lanes = 2;
    co.step[co.rank - 1] = 1;
    co.aligned = true;
    co.whole_lanes = true;
    val.l[0] = r0;
    val.l[1] = r1;
    cu_store_epilogue(f, epi, nepi, &co, &val);
    return;
  }
  for (int e = 0; e < 2; e++) {
    const char *c = e ? cu_fmt(f, "(%s + 1)", col) : col;
    cu_open(f, "if (%s < %lld)", c, (long long)gm->N);
    gm->result(f, gm, z, m, c, e ? a1 : a0, &co, &val);
    const char *r = cu_tmp(f);
    cu_line(f, "const %s %s = %s;  // %s (%s)", cu_ctype(av->type.dt), r, val.l[0], av->name, ir_op_name(gm->an->op));
    val.l[0] = r;
    cu_store_epilogue(f, epi, nepi, &co, &val);
    cu_close(f);
  }
}

/* Named barrier 1 + cw: the 128 threads of consumer warpgroup cw only
 * (the producer and the other consumer go their own ways). */
static void wg_barrier(CuFn *f) {
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "asm volatile(\"bar.sync %%0, 128;\\n\" :: \"r\"(1 + cw) : \"memory\");");
  cu_line(f, "#else");
  cu_line(f, "emu_wg_sync();");
  cu_line(f, "#endif");
}

/* Split-K, after a unit's main loop: the warpgroup stores its partial
 * tile (its f32 accumulators) in the workspace and counts it on the
 * (tile, warpgroup) counter; the warpgroup that brings the count to SK
 * adds the SK partials in slice order (its own from registers), clears
 * the slots and the counter, and goes on to the epilogue with the sum in
 * acc; the others go on to their next unit.  Nothing waits for another
 * block.  Slot layout: for each float4 v of the thread's accumulators
 * (acc[ms][4i .. 4i+3], v = ms NH/4 + i), the warpgroup's 128 float4
 * side by side, so that every store and load is 16 bytes per thread and
 * 2 KiB per warpgroup, contiguous. */
static void split_k(CuFn *f, const Wg *w) {
  const CuWgmmaParams *p = w->p;
  int SK = w->SK, NV = w->MS * w->NH / 4;
  long long slot = (long long)NV * 128; /* float4 per (tile, warpgroup, slice) */
  cu_line(f, "// split-K: this warpgroup's partial tile of slice `slice` into the workspace; the last of the %d", SK);
  cu_line(f, "// slices of (tile, warpgroup) to count its own adds them all, in slice order (deterministic)");
  cu_open(f, "%s", "");
  cu_line(f, "__shared__ int wg_last[2];  // per consumer warpgroup: this unit's slice came last");
  cu_line(f, "// [tiles][%d warpgroups][%d slices][%d float4][128 threads], after %llu bytes of counters", p->consumers, SK, NV,
          (unsigned long long)w->part_off);
  cu_line(f, "float *const part = reinterpret_cast<float *>(ws + %lluULL) + ((long long)(t * %d + cw) * %d * %lldLL + "
             "threadIdx.x %% 128) * 4;",
          (unsigned long long)w->part_off, p->consumers, SK, slot);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int ms = 0; ms < %d; ms++)", w->MS);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", w->NH / 4);
  cu_line(f, "float *const pp = part + ((long long)slice * %lld + ms * %d + i) * 512;", (long long)NV, w->NH / 4);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "__stcg(reinterpret_cast<float4 *>(pp), make_float4(acc[ms][4 * i], acc[ms][4 * i + 1], acc[ms][4 * i + 2], "
             "acc[ms][4 * i + 3]));");
  cu_line(f, "#else");
  cu_line(f, "for (int e = 0; e < 4; e++) pp[e] = acc[ms][4 * i + e];");
  cu_line(f, "#endif");
  cu_close(f);
  cu_close(f);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "__threadfence();  // the partial tile is visible before it is counted");
  cu_line(f, "#endif");
  wg_barrier(f);
  cu_open(f, "if (threadIdx.x %% 128 == 0)");
  cu_line(f, "unsigned *const count = reinterpret_cast<unsigned *>(ws) + (t * %d + cw);", p->consumers);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "const unsigned done = atomicAdd(count, 1u);");
  cu_line(f, "#else");
  cu_line(f, "const unsigned done = (*count)++;  // emulation: blocks run one after another");
  cu_line(f, "#endif");
  cu_line(f, "wg_last[cw] = done == %du;", SK - 1);
  cu_line(f, "if (done == %du) *count = 0u;  // the workspace is left zero for the next kernel", SK - 1);
  cu_close(f);
  wg_barrier(f);
  cu_line(f, "if (!wg_last[cw]) continue;  // another slice adds this tile");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "__threadfence();");
  cu_line(f, "#endif");
  cu_line(f, "// acc = 0 + slice 0 + slice 1 + ... + slice %d, in this order whichever came last (its own slice", SK - 1);
  cu_line(f, "// read back too, so that the loop over slices stays rolled and acc is the only array live); every");
  cu_line(f, "// slot cleared for the next kernel");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int ms = 0; ms < %d; ms++)", w->MS);
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int i = 0; i < %d; i++) acc[ms][i] = 0.0f;", w->NH);
  cu_line(f, "#pragma unroll 1");
  cu_open(f, "for (int q = 0; q < %d; q++)", SK);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int ms = 0; ms < %d; ms++)", w->MS);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", w->NH / 4);
  cu_line(f, "float *const pp = part + ((long long)q * %lld + ms * %d + i) * 512;", (long long)NV, w->NH / 4);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "const float4 g = __ldcg(reinterpret_cast<const float4 *>(pp));  // L2: written by other SMs");
  cu_line(f, "const float v[4] = {g.x, g.y, g.z, g.w};");
  cu_line(f, "__stcg(reinterpret_cast<float4 *>(pp), make_float4(0.0f, 0.0f, 0.0f, 0.0f));");
  cu_line(f, "#else");
  cu_line(f, "const float v[4] = {pp[0], pp[1], pp[2], pp[3]};");
  cu_line(f, "for (int e = 0; e < 4; e++) pp[e] = 0.0f;");
  cu_line(f, "#endif");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int e = 0; e < 4; e++) acc[ms][4 * i + e] += v[e];");
  cu_close(f); /* i */
  cu_close(f); /* ms */
  cu_close(f); /* q */
  cu_close(f); /* the split-K block */
}

static void consumer(CuFn *f, const Wg *w, const int *epi, int nepi) {
  const CuGemm *gm = w->gm;
  const CuWgmmaParams *p = w->p;
  int WM = p->BM / p->consumers;
  cu_line(f, "// consumer warpgroups: %d x %d of the tile each, as %d slice%s of m64n%d", WM, p->BN, w->MS,
          w->MS > 1 ? "s" : "", p->BN);
  ptx(f, cu_fmt(f, "asm volatile(\"setmaxnreg.inc.sync.aligned.u32 %d;\\n\");", WG_CONSUMER_REGS));
  cu_line(f, "const int cw = threadIdx.x / 128 - 1, warp = (threadIdx.x / 32) %% 4, lane = threadIdx.x %% 32;");
  cu_line(f, "float acc[%d][%d];", w->MS, w->NH);
  cu_line(f, "int stage = 0;");
  cu_line(f, "unsigned phase = 0;");
  unit_loop(f, w);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int ms = 0; ms < %d; ms++)", w->MS);
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int i = 0; i < %d; i++) acc[ms][i] = 0.0f;", w->NH);
  cu_line(f, "int prev = -1;  // the stage whose wgmma group may still be reading");
  cu_open(f, "for (int kt = kt0; kt < kt1; kt++)");
  cu_line(f, "bar_wait(bar_full + 8 * stage, phase);  // the stage's A and B tiles have landed");
  ptx(f, "asm volatile(\"wgmma.fence.sync.aligned;\\n\" ::: \"memory\");");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int kk = 0; kk < 4; kk++)");
  cu_line(f, "const unsigned long long db = desc(smem_b + stage * %d + kk * 32);", w->b_stage);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int ms = 0; ms < %d; ms++)", w->MS);
  cu_line(f, "  mma(acc[ms], desc(smem_a + stage * %d + (cw * %d + ms * 64) * 128 + kk * 32), db);", w->a_stage, WM);
  cu_close(f);
  ptx(f, "asm volatile(\"wgmma.commit_group.sync.aligned;\\n\" ::: \"memory\");");
  cu_line(f, "// at most this stage's group in flight: the previous stage's reads are over");
  wait_group(f, 1);
  cu_line(f, "if (prev >= 0 && threadIdx.x %% 128 == 0) bar_arrive(bar_empty + 8 * prev);");
  cu_line(f, "prev = stage;");
  cu_line(f, "if (++stage == %d) stage = 0, phase ^= 1;", p->stages);
  cu_close(f);
  wait_group(f, 0);
  cu_line(f, "if (threadIdx.x %% 128 == 0) bar_arrive(bar_empty + 8 * prev);");
  if (w->SK > 1) split_k(f, w);

  cu_line(f, "// epilogue: acc[ms][4j + 2h + e] is row 64 ms + 16 warp + lane/4 + 8h, column 8j + 2 (lane%%4) + e");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int ms = 0; ms < %d; ms++)", w->MS);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int h = 0; h < 2; h++)");
  const char *ix = f->idx;
  cu_line(f, "const %s row = (%s)tm * %d + cw * %d + ms * 64 + warp * 16 + lane / 4 + h * 8;", ix, ix, p->BM, WM);
  if (w->row_live) cu_open(f, "if (row < %lld && %s)", (long long)w->L.rows, w->row_live); /* tails masked */
  else cu_open(f, "if (row < %lld)", (long long)w->L.rows);
  const char *z, *m;
  if (w->L.flat) {
    cu_line(f, "const %s zr = row / %lld, mr = row %% %lld;  // batch and row of the flattened A", ix, (long long)gm->M,
            (long long)gm->M);
    z = "zr", m = "mr";
  } else {
    z = w->L.Z > 1 ? cu_fmt(f, "((%s)tz)", ix) : "0", m = "row";
  }
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < %d; j++)", p->BN / 8);
  cu_line(f, "const %s col = (%s)tn * %d + j * 8 + (lane %% 4) * 2;", ix, ix, p->BN);
  cu_open(f, "if (col < %lld)", (long long)gm->N);
  store_pair(f, w, z, m, "col", "acc[ms][4 * j + 2 * h]", "acc[ms][4 * j + 2 * h + 1]", epi, nepi);
  cu_close(f);
  cu_close(f); /* j */
  cu_close(f); /* row */
  cu_close(f); /* h */
  cu_close(f); /* ms */
  cu_close(f); /* t */
}

static void set_tmap(FmtCudaTmap *tm, int arg, DType dt, bool is3, int64_t K, int64_t rows, int64_t Z, int box) {
  memset(tm, 0, sizeof *tm);
  tm->arg = arg;
  tm->dtype = dt;
  tm->rank = is3 ? 3 : 2;
  tm->dims[0] = (uint64_t)K;
  tm->dims[1] = (uint64_t)rows;
  tm->strides[0] = (uint64_t)K * 2;
  tm->box[0] = 64;
  tm->box[1] = (uint32_t)box;
  if (is3) {
    tm->dims[2] = (uint64_t)Z;
    tm->strides[1] = (uint64_t)(K * rows * 2);
    tm->box[2] = 1;
  }
  tm->swizzle = 128;
}

void cu_emit_wgmma(CuFn *f, const CuGemm *gm, const CuWgmmaParams *p, const int *epi, int nepi, CuLaunch *l) {
  const Graph *g = f->g;
  const Node *an = gm->an;
  Wg w = {.gm = gm, .p = p, .L = layout(gm)};
  if (!w.L.ok || !params_valid(p)) {
    cu_fail(f, ST_INTERNAL, "wgmma kernel for an ineligible matmul or invalid parameters");
    return;
  }
  w.MS = p->BM / p->consumers / 64;
  w.NH = p->BN / 2;
  w.Mt = ceil_div(w.L.rows, p->BM);
  w.Nt = ceil_div(gm->N, p->BN);
  w.T = w.Mt * w.Nt * w.L.Z;
  w.GM = w.Mt < WG_GROUP_M ? (int)w.Mt : WG_GROUP_M;
  w.KT = ceil_div(gm->K, 64);
  w.a_stage = p->BM * 128;
  w.b_stage = p->BN * 128;
  w.ptx_type = gm->yt->dt == DT_BF16 ? "bf16" : "f16";
  w.SK = p->splitk;
  w.U = w.T * w.SK;
  if (w.U > 0x7fffffffLL) {
    cu_fail(f, ST_UNSUPPORTED, "a %lld x %lld x %lld matmul has too many tiles", (long long)w.L.rows, (long long)gm->N,
            (long long)w.L.Z);
    return;
  }
  if (cu_gemm_ranged(gm)) {
    if (w.L.flat) {
      /* the rows of A flattened with its batch: [batch..., M]; this run's
       * rows are a prefix when nothing before the ranged axis exceeds 1 */
      const TensorType *y = gm->yt;
      TensorType R = *y;
      R.rank = y->rank - 1;
      int64_t before = 1;
      int ax = 0;
      while (ax < R.rank && !R.dyn[ax]) before *= R.dim[ax++];
      w.row_live = cu_live(f, &R, "row");
      if (before == 1) w.run_rows = cu_run_numel(f, &R);
    } else {
      w.run_rows = cu_gemm_run_m(f, gm);
      if (!cu_is_lit(w.run_rows, NULL)) w.row_live = cu_fmt(f, "row < %s", w.run_rows);
      else w.run_rows = NULL;
      if (w.L.Z > 1) w.z_past = cu_gemm_batch_past(f, gm, "tz");
    }
  }
  uint64_t ws = workspace_bytes(w.T, p, &w.part_off);
  if (w.SK > w.KT || ws > WG_MAX_WORKSPACE) {
    char tok[CG_VARIANT_LEN];
    cu_wgmma_format(p, tok);
    cu_fail(f, ST_UNSUPPORTED, "variant %s: %lld K tiles of 64 cannot make %d slices, or its workspace (%llu bytes) is too large",
            tok, (long long)w.KT, w.SK, (unsigned long long)ws);
    return;
  }
  int threads = 128 * (1 + p->consumers);
  int64_t smem = smem_bytes(p);

  l->kind = "matmul";
  cu_wgmma_format(p, l->variant);
  l->block[0] = (unsigned)threads;
  l->grid[0] = (unsigned)(w.U < WG_SMS ? w.U : WG_SMS);
  l->workspace = ws;
  l->grid[1] = l->grid[2] = 1;
  l->smem = (unsigned)smem;
  l->min_blocks = 1;
  l->ntmaps = 2;
  set_tmap(&l->tmaps[0], f->arg_of[an->in[0]], gm->at->dt, w.L.a3, gm->K, w.L.rows, w.L.Z, p->BM);
  set_tmap(&l->tmaps[1], f->arg_of[an->in[1]], gm->bt->dt, w.L.b3, gm->K, gm->N, w.L.Z, p->BN);

  int stage_bytes = w.a_stage + w.b_stage;
  cu_line(f, "// variant: Hopper GEMM: TMA -> 128B-swizzled shared memory -> wgmma.mma_async.m64n%dk16.f32.%s.%s,", p->BN,
          w.ptx_type, w.ptx_type);
  cu_line(f, "// producer/consumer warpgroups, persistent grid; %s x %s (B given as [N, K])", g->val[an->in[0]].name,
          g->val[an->in[1]].name);
  cu_line(f, "// parameters: BM %d, BN %d, BK %d, %d stages, %d consumer warpgroup%s; M %lld, N %lld, K %lld, batch %lld%s",
          p->BM, p->BN, p->BK, p->stages, p->consumers, p->consumers > 1 ? "s" : "", (long long)gm->M, (long long)gm->N,
          (long long)gm->K, (long long)gm->Z, w.L.flat ? " (folded into the rows)" : "");
  cu_line(f, "// tiles: %lld x %lld%s = %lld%s over %u blocks; K in %lld tiles of 64", (long long)w.Mt, (long long)w.Nt,
          w.L.Z > 1 ? cu_fmt(f, " x %lld batches", (long long)w.L.Z) : "", (long long)w.T,
          w.SK > 1 ? cu_fmt(f, ", split-K in %d slices: %lld units", w.SK, (long long)w.U) : "", l->grid[0],
          (long long)w.KT);
  cu_line(f, "#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)");
  cu_line(f, "__trap();  // wgmma and TMA exist only on sm_90a");
  cu_line(f, "#else");
  cu_open(f, "%s", "");
  cu_line(f, "// shared memory: A stages [%d][%d rows][128 B], B stages [%d][%d rows][128 B], rows 128B-swizzled as TMA",
          p->stages, p->BM, p->stages, p->BN);
  cu_line(f, "// writes them (1024-byte aligned: the swizzle repeats every 8 rows); then full[%d] and empty[%d] mbarriers",
          p->stages, p->stages);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "extern __shared__ __align__(1024) unsigned char smelt_wg_smem[];");
  cu_line(f, "const unsigned smem_a = ((unsigned)__cvta_generic_to_shared(smelt_wg_smem) + 1023u) & ~1023u;");
  cu_line(f, "#else");
  cu_line(f, "__align__(1024) __shared__ unsigned char smelt_wg_smem[%lld];", (long long)smem);
  cu_line(f, "const unsigned smem_a = 0;  // emulation: addresses are offsets into smelt_wg_smem");
  cu_line(f, "#endif");
  cu_line(f, "const unsigned smem_b = smem_a + %d;", p->stages * w.a_stage);
  cu_line(f, "const unsigned bar_full = smem_b + %d, bar_empty = bar_full + %d;", p->stages * w.b_stage, 8 * p->stages);
  helpers(f, &w);

  cu_open(f, "if (threadIdx.x == 0)");
  cu_open(f, "for (int s = 0; s < %d; s++)", p->stages);
  cu_line(f, "bar_init(bar_full + 8 * s, 1);  // the producer's arrival (with %d bytes)", stage_bytes);
  cu_line(f, "bar_init(bar_empty + 8 * s, %d);  // one arrival per consumer warpgroup", p->consumers);
  cu_close(f);
  cu_line(f, "#ifndef __CUDA_ARCH__");
  cu_line(f, "for (int i = 0; i < 4; i++) emu_wgbars[i] = emu_wgbar{0, 0};");
  cu_line(f, "#endif");
  cu_line(f, "// make the initialised barriers visible to the async proxy (TMA)");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "asm volatile(\"fence.mbarrier_init.release.cluster;\\n\" ::: \"memory\");");
  cu_line(f, "asm volatile(\"fence.proxy.async.shared::cta;\\n\" ::: \"memory\");");
  cu_line(f, "#endif");
  cu_close(f);
  cu_line(f, "__syncthreads();");
  cu_open(f, "if (threadIdx.x < 128)");
  producer(f, &w);
  cu_close(f);
  cu_open(f, "else");
  consumer(f, &w, epi, nepi);
  cu_close(f);
  cu_close(f);
  cu_line(f, "#endif");
}

/* ---- the family's entry (cu_families.h) ---- */

/* wgmma needs sm_90a (cu_hopper), on top of the shapes it takes. */
static bool family_eligible(const CuFn *f, const CuGemm *gm) { return cu_hopper(f) && cu_wgmma_eligible(f, gm); }

static void family_default(const CuFn *f, const CuGemm *gm, char out[CG_VARIANT_LEN]) {
  CuWgmmaParams p;
  cu_wgmma_default_params(gm, &p);
  cu_wgmma_format(&p, out);
  (void)f;
}

static int family_candidates(const CuFn *f, const CuGemm *gm, char (*out)[CG_VARIANT_LEN], int max) {
  (void)f;
  return cu_wgmma_candidates(gm, out, max);
}

static bool family_emit(CuFn *f, const CuGemm *gm, const char *tok, const int *epi, int nepi, CuLaunch *l) {
  CuWgmmaParams p;
  if (!cu_wgmma_parse(tok, &p)) return false;
  cu_emit_wgmma(f, gm, &p, epi, nepi, l);
  return true;
}

const CuGemmFamily cu_family_wgmma = {"wgmma", family_eligible, family_default, family_candidates, family_emit};
