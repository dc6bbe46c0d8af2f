/* The register-blocked, cache-tiled GEMM: matmul with a constant right
 * operand (a weight), the common case of every linear layer.
 *
 * The scheme is Goto's / BLIS's, with the packing of the weight done once,
 * at compile time:
 *   - the weight B ([K,N], or [N,K] with transpose_b) is rearranged into
 *     panels of NR columns, each panel K rows of NR contiguous f32 (f16 and
 *     bf16 weights are widened here), the last panel padded with zeros.
 *     The result is a read-only global of the module, "<w>.packed<NR>" (or
 *     ".packedt<NR>" for a transposed weight), [ceil(N/NR)][K][NR] f32, so
 *     it lives in the object code's .rodata; two kernels over one weight
 *     share it.  The graph is not changed (an interpreter or a session on
 *     it sees the same values and arguments), and the kernel keeps its
 *     argument for the original weight, unread.  The cost: the bundle holds
 *     the weight twice, once in the graph and once packed in the object.
 *   - the micro-kernel computes an MR x NR tile of the output with MR*NR/VL
 *     vector accumulators held in registers for the whole k loop (allocas
 *     that mem2reg turns into phis): per k it loads NR/VL vectors of the
 *     panel, broadcasts MR elements of A, and issues MR*NR/VL fused
 *     multiply-adds (llvm.fmuladd).  A is read where it is, through cg_emit,
 *     so a fused prologue (a cast), transpose_a and broadcast batch dims of
 *     A work unchanged; its MR rows are MR sequential streams.
 *   - the panels are walked in chunks of about 256 KiB of B (L2-resident
 *     while every row block of the task passes over them); inside a chunk,
 *     the MR x K block of A stays in L1 while it meets each panel.
 *   - the kernel's tasks are the output rows (lower.c); a task range is cut
 *     into full MR-row blocks and a remainder done by blocks of 4, 2 and 1
 *     rows (its binary digits; 8 too where MR is larger), so M = 1
 *     (decoding) does no wasted work.
 *   - the tile goes through a small stack buffer to the epilogue (bias,
 *     activation, residual: cg_store_epilogue), which stores only the valid
 *     columns of the last panel.
 * VL and MR follow the target: 16 lanes and MR = 8 with AVX-512 (16 of the
 * 32 vector registers hold the accumulators), 8 lanes and MR = 6 with AVX
 * (12 of 16), 4 lanes otherwise; NR = 2*VL.  The vector width is read from
 * the host's features: compiling for another CPU still gives correct code
 * (LLVM legalises the vector type), only not tuned for it.
 *
 * Not handled here (the generic loop nest in contraction.c takes them):
 * a right operand that is not a constant, batched weights, a 1-D right
 * operand, integer and f64 matmuls, K or N of 0.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/TargetMachine.h>

#include "codegen/llvm/gemm.h"

#define GEMM_MAX_MR 16
#define GEMM_MAX_ACC 32
/* bytes of packed weight per chunk of panels: a quarter of a 1 MiB L2,
 * leaving room for A's rows and the output */
#define GEMM_CHUNK_BYTES (256 * 1024)

typedef struct {
  CgFn *f;
  int av;
  TensorType at, yt;
  bool a1;
  int abat, nb, prefix, am, ak;
  int64_t K, N, np;
  int vl, nr, nv, mr;
  LLVMTypeRef vt;
  LLVMValueRef packed; /* float* */
  LLVMValueRef tile;   /* float[mr * nr] on the stack */
  LLVMValueRef acc[GEMM_MAX_ACC];
} Gemm;

/* Vector lanes of f32 on the host: 16 with AVX-512, 8 with AVX, else 4. */
static int host_lanes(void) {
  char *feat = LLVMGetHostCPUFeatures();
  int vl = 4;
  if (feat && strstr(feat, "+avx512f"))
    vl = 16;
  else if (feat && strstr(feat, "+avx"))
    vl = 8;
  LLVMDisposeMessage(feat);
  return vl;
}

/* ---- packing the weight (at compile time) ---- */

/* The packed copy of weight bv for panels of nr columns: a read-only
 * global of the module (found when another kernel made it already), or
 * NULL when out of memory. */
static LLVMValueRef packed_weight(CgMod *m, const Value *w, bool tb, int64_t K, int64_t N, int nr) {
  char name[512];
  snprintf(name, sizeof name, "%s.packed%s%d", w->name, tb ? "t" : "", nr);
  LLVMValueRef gv = LLVMGetNamedGlobal(m->mod, name);
  if (gv) return gv;
  int64_t np = (N + nr - 1) / nr;
  size_t bytes = sizeof(float) * (size_t)(np * K * nr);
  float *buf = malloc(bytes);
  if (!buf) return NULL;
  for (int64_t p = 0; p < np; p++)
    for (int64_t k = 0; k < K; k++)
      for (int j = 0; j < nr; j++) {
        int64_t col = p * nr + j;
        float x = 0;
        if (col < N) x = (float)dt_load(w->type.dt, w->data, (size_t)(tb ? col * K + k : k * N + col));
        buf[(p * K + k) * nr + j] = x;
      }
  /* raw bytes: a ConstantDataArray, which LLVM keeps as one blob (an array
   * of float constants would cost a Value per element) */
  LLVMValueRef init = LLVMConstStringInContext(m->ctx, (const char *)buf, (unsigned)bytes, 1);
  free(buf);
  gv = LLVMAddGlobal(m->mod, LLVMTypeOf(init), name);
  LLVMSetInitializer(gv, init);
  LLVMSetGlobalConstant(gv, 1);
  LLVMSetLinkage(gv, LLVMPrivateLinkage);
  LLVMSetUnnamedAddr(gv, 1);
  LLVMSetAlignment(gv, 64);
  return gv;
}

/* ---- emission ---- */

static LLVMValueRef splat(Gemm *G, LLVMValueRef x) {
  LLVMBuilderRef B = G->f->b;
  LLVMValueRef v = LLVMBuildInsertElement(B, LLVMGetUndef(G->vt), x, cg_i32(G->f->m, 0), "");
  LLVMValueRef mask = LLVMConstNull(LLVMVectorType(G->f->m->t_i32, (unsigned)G->vl));
  return LLVMBuildShuffleVector(B, v, LLVMGetUndef(G->vt), mask, "");
}

static LLVMValueRef vec_ptr(Gemm *G, LLVMValueRef base, LLVMValueRef off) {
  LLVMBuilderRef B = G->f->b;
  LLVMValueRef p = LLVMBuildInBoundsGEP2(B, G->f->m->t_f32, base, &off, 1, "");
  return LLVMBuildBitCast(B, p, LLVMPointerType(G->vt, 0), "");
}

/* Coordinates of output row `row` (every output dim but the column): the
 * A coordinates without k into ac, the output ones without the column
 * into oc. */
static void row_coords(Gemm *G, LLVMValueRef row, LLVMValueRef *ac, LLVMValueRef *oc) {
  CgFn *f = G->f;
  LLVMValueRef pc[IR_MAX_RANK];
  cg_delinearize(f, row, G->yt.dim, G->prefix, pc);
  for (int i = 0; i < G->abat; i++) ac[i] = G->at.dim[i] == 1 ? cg_i64(f->m, 0) : pc[G->nb - G->abat + i];
  if (!G->a1) ac[G->am] = pc[G->nb];
  for (int i = 0; i < G->prefix; i++) oc[i] = pc[i];
}

/* The rows [r0, r0 + mr) against panels [p0, p1). */
static void emit_block(Gemm *G, int mr, LLVMValueRef r0, LLVMValueRef p0, LLVMValueRef p1) {
  CgFn *f = G->f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  LLVMValueRef ac[GEMM_MAX_MR][IR_MAX_RANK], oc[IR_MAX_RANK];
  for (int i = 0; i < mr; i++) row_coords(G, cg_add(f, r0, cg_i64(m, i)), ac[i], oc);
  int nv = G->nv;
  LLVMValueRef zero = LLVMConstNull(G->vt);

  CgLoop lp, lk, li, lj;
  LLVMValueRef p = cg_loop_begin(f, &lp, p0, p1, "panel");
  for (int a = 0; a < mr * nv; a++) LLVMBuildStore(B, zero, G->acc[a]);
  LLVMValueRef pbase = cg_mulc(f, p, G->K * G->nr);
  LLVMValueRef k = cg_loop_begin(f, &lk, cg_i64(m, 0), cg_i64(m, G->K), "k");
  LLVMValueRef off = cg_add(f, pbase, cg_mulc(f, k, G->nr));
  LLVMValueRef bvec[GEMM_MAX_ACC];
  for (int v = 0; v < nv; v++) {
    LLVMValueRef ld = LLVMBuildLoad2(B, G->vt, vec_ptr(G, G->packed, cg_add(f, off, cg_i64(m, v * G->vl))), "b");
    LLVMSetAlignment(ld, 4);
    bvec[v] = ld;
  }
  for (int i = 0; i < mr; i++) {
    ac[i][G->ak] = k;
    LLVMValueRef a = splat(G, cg_emit(f, G->av, ac[i]));
    for (int v = 0; v < nv; v++) {
      LLVMValueRef slot = G->acc[i * nv + v];
      LLVMValueRef args[3] = {a, bvec[v], LLVMBuildLoad2(B, G->vt, slot, "")};
      LLVMBuildStore(B, cg_intrinsic(m, "llvm.fmuladd", &G->vt, 1, args, 3), slot);
    }
  }
  cg_loop_end(f, &lk, false);

  /* the tile, through the stack, to the epilogue: valid columns only */
  for (int i = 0; i < mr; i++)
    for (int v = 0; v < nv; v++) {
      LLVMValueRef st = LLVMBuildStore(B, LLVMBuildLoad2(B, G->vt, G->acc[i * nv + v], ""),
                                       vec_ptr(G, G->tile, cg_i64(m, (int64_t)i * G->nr + v * G->vl)));
      LLVMSetAlignment(st, 4);
    }
  LLVMValueRef c0 = cg_mulc(f, p, G->nr);
  LLVMValueRef ncols = cg_min(f, cg_i64(m, G->nr), LLVMBuildNSWSub(B, cg_i64(m, G->N), c0, ""));
  LLVMValueRef i = cg_loop_begin(f, &li, cg_i64(m, 0), cg_i64(m, mr), "tile_row");
  LLVMValueRef a_coords[IR_MAX_RANK]; /* not needed here: the row's A coordinates */
  row_coords(G, cg_add(f, r0, i), a_coords, oc);
  LLVMValueRef j = cg_loop_begin(f, &lj, cg_i64(m, 0), ncols, "tile_col");
  oc[G->yt.rank - 1] = cg_add(f, c0, j);
  LLVMValueRef t = LLVMBuildInBoundsGEP2(B, m->t_f32, G->tile, (LLVMValueRef[]){cg_add(f, cg_mulc(f, i, G->nr), j)}, 1, "");
  cg_store_epilogue(f, oc, LLVMBuildLoad2(B, m->t_f32, t, ""));
  cg_loop_end(f, &lj, false);
  cg_loop_end(f, &li, false);
  cg_loop_end(f, &lp, false);
}

smelt_status cg_gemm_try(CgFn *f, bool *out_done) {
  *out_done = false;
  Graph *g = f->g;
  CgMod *m = f->m;
  const Node *n = &g->node[f->anchor];
  if (n->op != OP_MATMUL) return NULL;
  int av = n->in[0], bv = n->in[1];
  TensorType at = g->val[av].type, bt = g->val[bv].type, yt = *cg_anchor_type(f);
  DType dt = at.dt;
  if ((dt != DT_F32 && dt != DT_F16 && dt != DT_BF16) || bt.dt != dt) return NULL;
  if (!ir_is_const(g, bv) || bt.rank < 2) return NULL;
  for (int i = 0; i + 2 < bt.rank; i++)
    if (bt.dim[i] != 1) return NULL; /* batched weights: generic */
  bool ta = ir_attr_int(n, "transpose_a") != 0, tb = ir_attr_int(n, "transpose_b") != 0;
  int64_t K = bt.dim[tb ? bt.rank - 1 : bt.rank - 2], N = bt.dim[tb ? bt.rank - 2 : bt.rank - 1];
  if (K == 0 || N == 0) return NULL;

  Gemm G = {.f = f, .av = av, .at = at, .yt = yt, .K = K, .N = N};
  G.vl = host_lanes();
  G.nr = 2 * G.vl;
  G.nv = 2;
  G.mr = G.vl == 16 ? 8 : 6;
  G.np = (N + G.nr - 1) / G.nr;
  if ((uint64_t)G.np * (uint64_t)K * (uint64_t)G.nr * 4 > UINT32_MAX) return NULL; /* LLVMConstString's limit */
  LLVMValueRef gv = packed_weight(m, &g->val[bv], tb, K, N, G.nr);
  if (!gv) return st_error(ST_NO_MEMORY, "kernel %s: out of memory packing weight '%s'", f->k->name, g->val[bv].name);
  *out_done = true;

  G.a1 = at.rank == 1;
  G.abat = G.a1 ? 0 : at.rank - 2;
  G.prefix = yt.rank - 1;
  G.nb = yt.rank - (G.a1 ? 0 : 1) - 1;
  G.am = ta ? G.abat + 1 : G.abat;
  G.ak = G.a1 ? 0 : ta ? G.abat : G.abat + 1;
  G.vt = LLVMVectorType(m->t_f32, (unsigned)G.vl);
  G.packed = LLVMBuildBitCast(f->ab, gv, LLVMPointerType(m->t_f32, 0), "packed");
  G.tile = cg_alloca(f, m->t_f32, (int64_t)G.mr * G.nr, "tile");
  for (int a = 0; a < G.mr * G.nv; a++) G.acc[a] = cg_alloca(f, G.vt, 1, "acc");

  int64_t rows = 1;
  for (int i = 0; i < G.prefix; i++) rows *= yt.dim[i];
  cg_store_loops(f, f->side, f->nside);
  LLVMValueRef rb, re;
  cg_task_span(f, f->k->ntasks, rows, &rb, &re);
  int64_t per_chunk = GEMM_CHUNK_BYTES / (K * G.nr * 4);
  if (per_chunk < 1) per_chunk = 1;
  if (per_chunk > G.np) per_chunk = G.np;
  int64_t nchunks = (G.np + per_chunk - 1) / per_chunk;

  LLVMBuilderRef B = f->b;
  CgLoop lc, lb;
  LLVMValueRef c = cg_loop_begin(f, &lc, cg_i64(m, 0), cg_i64(m, nchunks), "chunk");
  LLVMValueRef p0 = cg_mulc(f, c, per_chunk);
  LLVMValueRef p1 = cg_min(f, cg_add(f, p0, cg_i64(m, per_chunk)), cg_i64(m, G.np));
  LLVMValueRef span = LLVMBuildNSWSub(B, re, rb, "");
  LLVMValueRef nfull = LLVMBuildUDiv(B, span, cg_i64(m, G.mr), "");
  LLVMValueRef ib = cg_loop_begin(f, &lb, cg_i64(m, 0), nfull, "rows");
  emit_block(&G, G.mr, cg_add(f, rb, cg_mulc(f, ib, G.mr)), p0, p1);
  cg_loop_end(f, &lb, false);
  /* the remaining rows, fewer than MR: by their binary digits */
  LLVMValueRef r = cg_add(f, rb, cg_mulc(f, nfull, G.mr));
  LLVMValueRef rem = LLVMBuildNSWSub(B, re, r, "");
  for (int s = 8; s >= 1; s /= 2) {
    if (s >= G.mr) continue;
    CgIf has;
    LLVMValueRef bit = LLVMBuildAnd(B, rem, cg_i64(m, s), "");
    cg_if_begin(f, &has, LLVMBuildICmp(B, LLVMIntNE, bit, cg_i64(m, 0), ""), "rest");
    LLVMValueRef before = LLVMBuildAnd(B, rem, cg_i64(m, ~(int64_t)(2 * s - 1)), "");
    emit_block(&G, s, cg_add(f, r, before), p0, p1);
    cg_if_end(f, &has);
  }
  cg_loop_end(f, &lc, false);
  return NULL;
}
