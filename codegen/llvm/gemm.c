/* The register-blocked, cache-tiled GEMM: matmul with a constant right
 * operand (a weight), the common case of every linear layer, and conv2d
 * with a constant weight as an implicit GEMM over it (at the end).
 *
 * The scheme is Goto's / BLIS's, with the packing of the weight done once,
 * when the bundle is opened (as ONNX Runtime prepacks at session init, but
 * once per bundle for all its sessions):
 *   - the weight B ([K,N], or [N,K] with transpose_b) is rearranged into
 *     panels of NR columns, each panel K rows of NR contiguous f32 (f16 and
 *     bf16 weights are widened), the last panel padded with zeros, into a
 *     zero-initialised global of the module, "<w>.packed<NR>" (or
 *     ".packedt<NR>" for a transposed weight), [ceil(N/NR)][K][NR] f32.  It
 *     lives in the object's .bss, which costs no bytes in the bundle; the
 *     kernel's generated NAME__prepack(args) (cg_llvm.h) fills it from the
 *     weight constant, with the kernel's argument layout, and the loader
 *     (runtime/loader.c) calls it once when it loads the object.  So the
 *     bundle stores each weight once, in its constants section, which the
 *     interpreter and the CUDA target read too.  Two kernels over one
 *     weight share the global (the first one's prepack fills it).  The
 *     graph is not changed (an interpreter or a session on it sees the
 *     same values and arguments); the kernel keeps its argument for the
 *     original weight, unread.  CgLlvmOptions.pack_at_compile (tests)
 *     packs here instead, into a read-only global, as before prepacking;
 *     the two give bit-identical kernels.
 *   - the micro-kernel computes an MR x NR tile of the output with MR*NR/VL
 *     vector accumulators held in registers for the whole k loop (allocas
 *     that mem2reg turns into phis): per k it loads NR/VL vectors of the
 *     panel, broadcasts MR elements of A, and issues MR*NR/VL fused
 *     multiply-adds (llvm.fmuladd).  A is read where it is, through cg_emit,
 *     so a fused prologue (a cast), transpose_a and broadcast batch dims of
 *     A work unchanged; its MR rows are MR sequential streams.
 *   - the panels are walked in chunks of about 256 KiB of B (L2-resident
 *     while every row block of the task passes over them; one panel when a
 *     panel is larger), and while a chunk is in use the next one is
 *     prefetched into L2 (emit_rows); inside a chunk, the MR x K block of A
 *     stays in L1 while it meets each panel.
 *   - the kernel's tasks are the output rows, times blocks of CG_MM_COLS
 *     columns when the rows are few (lower.h, cg_matmul_space: decoding's
 *     M = 1 spreads its columns, and so its weight reads, over the
 *     threads).  A task range's rows are cut into full MR-row blocks and a
 *     remainder done by blocks of 4, 2 and 1 rows (its binary digits; 8
 *     too where MR is larger), so M = 1 does no wasted work; a block of
 *     fewer than MR rows computes up to GEMM_MAX_PANELS panels at once, so
 *     that it still has about as many independent accumulators as a full
 *     block (one row against one panel would be a chain of dependent
 *     multiply-adds, bound by their latency).
 *   - the tile goes through a small stack buffer to the epilogue (bias,
 *     activation, residual: cg_store_epilogue), which stores only the valid
 *     columns of the last panel.
 * VL and MR follow the target: 16 lanes and MR = 8 with AVX-512 (16 of the
 * 32 vector registers hold the accumulators; a matmul of GEMM_MR12_ROWS
 * rows or more takes MR = 12, 24 of them), 8 lanes and MR = 6 with AVX
 * (12 of 16), 4 lanes otherwise; NR = 2*VL.  The vector width is read from
 * the host's features: compiling for another CPU still gives correct code
 * (LLVM legalises the vector type), only not tuned for it.
 *
 * Not handled here (the generic loop nest in contraction.c takes them):
 * a right operand that is not a constant, or not an argument of the kernel
 * (the prepack function reads it there), batched weights, a 1-D right
 * operand, integer and f64 matmuls, K or N of 0.
 *
 * conv2d (NCHW x, OIHW w) is the same GEMM, implicit: per image n and
 * group g, Y[oc, p] = sum_k W[oc, k] * X[k, p] with oc < O/groups, the
 * pixels p = (oh, ow) and k = (c, kh, kw) < C/groups*KH*KW, X the im2col
 * matrix, never built whole.  The operand roles are swapped against
 * matmul's: the weight is the broadcast operand (MR channels a block) and
 * the pixels are the vector lanes (NR a panel).  Why: in NCHW an output
 * channel's pixels are contiguous, so a tile row (one channel, NR
 * consecutive pixels) is a contiguous run of the output, and so is each row
 * of the im2col panel in the input (for stride 1).  The other orientation
 * (pixels as rows, channels as lanes) would store every tile column with a
 * stride of OH*OW.  Concretely:
 *   - the weight is packed (at load time, as matmul's) into
 *     [groups][ceil(Og/MR)][K][MR] f32 ("<w>.convpacked<MR>", zero rows past
 *     the group's last channel), so the MR broadcasts of one k are adjacent;
 *   - a task unit is (n, g, pixel panel of NR linear pixels, chunk of up to
 *     CONV_OC_ROWS channels); the units are spread over the kernel's task
 *     range in proportion, so two threads split any shape evenly;
 *   - per unit and per chunk of KC k's (KC x NR f32 = 32 KiB, L1), the
 *     im2col panel is built on the stack: the panel's pixels are cut into
 *     output-row segments, and for each k the valid columns of a segment
 *     are computed exactly (the copy is then a plain strided loop, the
 *     padding a zero fill); x is read through cg_emit, so f16/bf16 are
 *     widened there and a fused prologue works unchanged;
 *   - every MR-channel block of the chunk meets the panel through the
 *     micro-kernel above, adding into a stack tile of partial sums
 *     (channels x NR); the last channels of a group, fewer than MR, go by
 *     blocks of 4, 2 and 1 (depthwise: one channel per group);
 *   - the tile goes to the epilogue (conv's own bias, then the group's
 *     members: activation, residual, ...) row segment by row segment.
 * Falls back (generic kernel) for a weight that is not a constant, integer
 * and f64 convolutions, and empty tensors.
 *
 * A 1x1 convolution of 256 input channels or more (groups 1, no padding,
 * any stride) goes the other way round, as the matmul above (conv_rows):
 * rows are the output pixels, columns the output channels, A is x read at
 * each pixel's input position, the weight [O, C] is packed as a transposed
 * matmul weight.  It needs no im2col, and a small image wastes no lanes
 * (ResNet's 7x7 = 49 pixels are two 32-pixel panels above, half empty).
 * The tile is transposed in registers (log2(MR) rounds of two-source
 * shuffles) so that the epilogue runs channel by channel over MR pixels
 * that are consecutive in NCHW.  Other convolutions (groups 1) on a small
 * image with many output channels go by pixel rows too (conv_pixels), A
 * being an im2col block built per chunk of k by the panel builder above,
 * MR lanes wide.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/TargetMachine.h>

#include "codegen/llvm/gemm.h"

#define GEMM_MAX_MR 16
/* output rows from which a matmul takes blocks of 12 rows with AVX-512 */
#define GEMM_MR12_ROWS 192
#define GEMM_MAX_ACC 32
/* panels a block of few rows computes at once (panels_for) */
#define GEMM_MAX_PANELS 4
/* bytes of packed weight per chunk of panels: a quarter of a 1 MiB L2,
 * leaving room for A's rows and the output */
#define GEMM_CHUNK_BYTES (256 * 1024)
/* packed weights from which the next chunk is prefetched (emit_rows): a
 * smaller one stays in L2 and L3 between runs, and the prefetch would be
 * an instruction a k for nothing (512^3: 1 MiB packed, 5% slower with it) */
#define GEMM_PREFETCH_MIN (2 * 1024 * 1024)
/* K from which a matmul of at least GEMM_KBLOCK_ROWS rows is blocked along
 * K too (gemm_long_k), and the rows of its units */
#define GEMM_KBLOCK_K 2048
#define GEMM_KBLOCK_ROWS 128

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
  /* a 1x1 convolution computed by output pixels (conv_rows): rows are
   * (n, pixel), columns output channels, A is x at the pixel's input
   * position; the tile is transposed on its way to the epilogue */
  bool crow, flat;
  int64_t P, OW, sh, sw;
  int bias;                /* the conv's bias value, -1 if none */
  LLVMValueRef tile_t;     /* float[mr * nr]: the tile by columns */
  /* the next chunk's L2 prefetch (emit_rows): while a full row block meets
   * a panel, the micro-kernel asks for bytes [pf, pf + K * pf_step) of the
   * packed weight, pf_step bytes a k; pf NULL: none */
  LLVMValueRef pf, pf_step;
} Gemm;

/* ---- packing the weight (at load time) ---- */

/* A packed weight's layout, shared by matmul and conv2d:
 * packed[((g * nblk + b) * K + k) * R + j] = w[g * gs + col * cs + k * ks]
 * with col = b * R + j, for col < L, and 0 past L (the last block's tail). */
typedef struct {
  int64_t groups, nblk, K, R, L;
  int64_t gs, cs, ks; /* the weight's element strides of a group, a column, a k */
} Pack;

static int64_t pack_count(const Pack *p) { return p->groups * p->nblk * p->K * p->R; }

/* The packing loop nest, at the end of the kernel's NAME__prepack function
 * (created at its first packed weight: void(void *const *args), the
 * kernel's argument layout, of which it reads the weight's argument only).
 * The loops run once per opened bundle, so they are plain; the column loop
 * stops at the valid columns and the tail loop writes the zeros. */
static void emit_prepack(CgFn *f, int wv, LLVMValueRef gv, const Pack *p) {
  CgMod *m = f->m;
  Graph *g = f->g;
  char name[sizeof f->k->name + 16];
  snprintf(name, sizeof name, "%s" CG_PREPACK_SUFFIX, f->k->name);
  /* The module's builder, which the conversions (cg_from_storage) build
   * with, is moved into the prepack function and back: the kernel's
   * emitters always build at the end of a block, so the block is enough
   * to come back to. */
  LLVMBasicBlockRef back = LLVMGetInsertBlock(m->b);
  LLVMValueRef fn = LLVMGetNamedFunction(m->mod, name);
  if (!fn) {
    LLVMTypeRef pt = LLVMPointerType(m->t_ptr, 0);
    fn = LLVMAddFunction(m->mod, name, LLVMFunctionType(m->t_void, &pt, 1, 0));
    /* it runs once: small code rather than vectorised and unrolled */
    static const char *const attrs[] = {"nounwind", "optsize", "minsize", "cold"};
    for (size_t i = 0; i < sizeof attrs / sizeof *attrs; i++) {
      unsigned kind = LLVMGetEnumAttributeKindForName(attrs[i], strlen(attrs[i]));
      LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex, LLVMCreateEnumAttribute(m->ctx, kind, 0));
    }
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(m->ctx, fn, "entry");
    LLVMPositionBuilderAtEnd(m->b, entry);
    LLVMBuildRetVoid(m->b);
  }
  LLVMBasicBlockRef last = LLVMGetLastBasicBlock(fn);
  LLVMInstructionEraseFromParent(LLVMGetBasicBlockTerminator(last)); /* the ret, rebuilt below */
  LLVMPositionBuilderAtEnd(m->b, last);
  CgFn pf = {.m = m, .b = m->b, .g = g, .k = f->k, .fn = fn};
  CgFn *P = &pf;
  LLVMBuilderRef B = m->b;
  DType dt = g->val[wv].type.dt;
  LLVMTypeRef st = cg_stype(m, dt);
  LLVMValueRef slot = LLVMBuildInBoundsGEP2(B, m->t_ptr, LLVMGetParam(fn, 0), (LLVMValueRef[]){cg_i64(m, f->arg_of[wv])},
                                            1, "");
  LLVMValueRef w = LLVMBuildBitCast(B, LLVMBuildLoad2(B, m->t_ptr, slot, "w"), LLVMPointerType(st, 0), "");
  LLVMValueRef dst = LLVMBuildBitCast(B, gv, LLVMPointerType(m->t_f32, 0), "");

  CgLoop lg, lb, lk, lj, lz;
  LLVMValueRef gi = cg_loop_begin(P, &lg, cg_i64(m, 0), cg_i64(m, p->groups), "group");
  LLVMValueRef bi = cg_loop_begin(P, &lb, cg_i64(m, 0), cg_i64(m, p->nblk), "block");
  LLVMValueRef c0 = cg_mulc(P, bi, p->R);
  LLVMValueRef ncols = cg_min(P, cg_i64(m, p->R), LLVMBuildNSWSub(B, cg_i64(m, p->L), c0, ""));
  LLVMValueRef src0 = cg_add(P, cg_mulc(P, gi, p->gs), cg_mulc(P, c0, p->cs));
  LLVMValueRef blk = cg_add(P, cg_mulc(P, gi, p->nblk), bi);
  LLVMValueRef k = cg_loop_begin(P, &lk, cg_i64(m, 0), cg_i64(m, p->K), "k");
  LLVMValueRef row = cg_mulc(P, cg_add(P, cg_mulc(P, blk, p->K), k), p->R);
  LLVMValueRef src = cg_add(P, src0, cg_mulc(P, k, p->ks));
  LLVMValueRef j = cg_loop_begin(P, &lj, cg_i64(m, 0), ncols, "col");
  LLVMValueRef e = cg_add(P, src, cg_mulc(P, j, p->cs));
  LLVMValueRef raw = LLVMBuildLoad2(B, st, LLVMBuildInBoundsGEP2(B, st, w, &e, 1, ""), "");
  LLVMValueRef d = cg_add(P, row, j);
  LLVMBuildStore(B, cg_from_storage(m, dt, raw), LLVMBuildInBoundsGEP2(B, m->t_f32, dst, &d, 1, ""));
  cg_loop_end(P, &lj, false);
  j = cg_loop_begin(P, &lz, ncols, cg_i64(m, p->R), "tail");
  d = cg_add(P, row, j);
  LLVMBuildStore(B, cg_fconst(m->t_f32, 0), LLVMBuildInBoundsGEP2(B, m->t_f32, dst, &d, 1, ""));
  cg_loop_end(P, &lz, false);
  cg_loop_end(P, &lk, false);
  cg_loop_end(P, &lb, false);
  cg_loop_end(P, &lg, false);
  LLVMBuildRetVoid(B);
  LLVMPositionBuilderAtEnd(m->b, back);
}

/* The same packing done here, for CgLlvmOptions.pack_at_compile: the
 * scheme before prepacking, kept so that tests can check that the two
 * give bit-identical kernels. */
static float *pack_on_host(const Value *w, const Pack *p) {
  float *buf = malloc(sizeof(float) * (size_t)pack_count(p));
  if (!buf) return NULL;
  for (int64_t g = 0; g < p->groups; g++)
    for (int64_t b = 0; b < p->nblk; b++)
      for (int64_t k = 0; k < p->K; k++)
        for (int64_t j = 0; j < p->R; j++) {
          int64_t col = b * p->R + j;
          float x = 0;
          if (col < p->L) x = (float)dt_load(w->type.dt, w->data, (size_t)(g * p->gs + col * p->cs + k * p->ks));
          buf[((g * p->nblk + b) * p->K + k) * p->R + j] = x;
        }
  return buf;
}

/* The packed copy of weight wv, named `name`: a zero-initialised global of
 * the module (.bss, no bytes in the object) that the kernel's prepack
 * function fills when the bundle is opened, found when another kernel
 * made it already (that kernel's prepack fills it); NULL when out of
 * memory.  With pack_at_compile, a read-only global holding the packed
 * data instead. */
static LLVMValueRef packed_global(CgFn *f, int wv, const char *name, const Pack *p) {
  CgMod *m = f->m;
  LLVMValueRef gv = LLVMGetNamedGlobal(m->mod, name);
  if (gv) return gv;
  size_t bytes = sizeof(float) * (size_t)pack_count(p);
  if (m->pack_at_compile) {
    float *buf = pack_on_host(&f->g->val[wv], p);
    if (!buf) return NULL;
    /* raw bytes: a ConstantDataArray, which LLVM keeps as one blob (an
     * array of float constants would cost a Value per element) */
    LLVMValueRef init = LLVMConstStringInContext(m->ctx, (const char *)buf, (unsigned)bytes, 1);
    free(buf);
    gv = LLVMAddGlobal(m->mod, LLVMTypeOf(init), name);
    LLVMSetInitializer(gv, init);
    LLVMSetGlobalConstant(gv, 1);
    LLVMSetUnnamedAddr(gv, 1);
  } else {
    LLVMTypeRef t = LLVMArrayType(m->t_f32, (unsigned)pack_count(p));
    gv = LLVMAddGlobal(m->mod, t, name);
    LLVMSetInitializer(gv, LLVMConstNull(t));
    emit_prepack(f, wv, gv, p);
  }
  LLVMSetLinkage(gv, LLVMPrivateLinkage);
  LLVMSetAlignment(gv, 64);
  return gv;
}

/* Weight wv ([K,N], or [N,K] with tb) in panels of nr columns:
 * "<w>.packed<NR>" / "<w>.packedt<NR>", [ceil(N/NR)][K][NR] f32. */
static LLVMValueRef packed_weight(CgFn *f, int wv, bool tb, int64_t K, int64_t N, int nr) {
  char name[512];
  snprintf(name, sizeof name, "%s.packed%s%d", f->g->val[wv].name, tb ? "t" : "", nr);
  Pack p = {.groups = 1, .nblk = (N + nr - 1) / nr, .K = K, .R = nr, .L = N, .cs = tb ? K : 1, .ks = tb ? 1 : N};
  return packed_global(f, wv, name, &p);
}

/* ---- emission ---- */

static LLVMValueRef splat(Gemm *G, LLVMValueRef x) {
  LLVMBuilderRef B = G->f->b;
  LLVMValueRef v = LLVMBuildInsertElement(B, LLVMGetUndef(G->vt), x, cg_i32(G->f->m, 0), "");
  LLVMValueRef mask = LLVMConstNull(LLVMVectorType(G->f->m->t_i32, (unsigned)G->vl));
  return LLVMBuildShuffleVector(B, v, LLVMGetUndef(G->vt), mask, "");
}

/* The register blocking of the target (not the compiling host): VL f32
 * lanes, panels of NR = 2*VL columns, MR rows (8 with AVX-512's 32
 * vector registers, 6 otherwise). */
static void gemm_regs(Gemm *G, CgMod *m) {
  G->vl = m->f32_lanes;
  G->nr = 2 * G->vl;
  G->nv = 2;
  G->mr = G->vl == 16 ? 8 : 6;
  G->vt = LLVMVectorType(m->t_f32, (unsigned)G->vl);
}

static LLVMValueRef vec_ptr(Gemm *G, LLVMValueRef base, LLVMValueRef off) {
  LLVMBuilderRef B = G->f->b;
  LLVMValueRef p = LLVMBuildInBoundsGEP2(B, G->f->m->t_f32, base, &off, 1, "");
  return LLVMBuildBitCast(B, p, LLVMPointerType(G->vt, 0), "");
}

static void store_f32(CgFn *f, LLVMValueRef base, LLVMValueRef i, LLVMValueRef v) {
  LLVMBuildStore(f->b, v, LLVMBuildInBoundsGEP2(f->b, f->m->t_f32, base, &i, 1, ""));
}
static LLVMValueRef load_f32(CgFn *f, LLVMValueRef base, LLVMValueRef i) {
  return LLVMBuildLoad2(f->b, f->m->t_f32, LLVMBuildInBoundsGEP2(f->b, f->m->t_f32, base, &i, 1, ""), "");
}

/* Coordinates of output row `row` (every output dim but the column): the
 * A coordinates without k into ac, the output ones without the column
 * into oc. */
static void row_coords(Gemm *G, LLVMValueRef row, LLVMValueRef *ac, LLVMValueRef *oc) {
  CgFn *f = G->f;
  if (G->crow) { /* row = (n, pixel): x at (n, k, oh*sh, ow*sw), y at (n, col, oh, ow) */
    LLVMBuilderRef B = f->b;
    LLVMValueRef P = cg_i64(f->m, G->P), OW = cg_i64(f->m, G->OW);
    LLVMValueRef n = LLVMBuildUDiv(B, row, P, ""), p = LLVMBuildURem(B, row, P, "");
    LLVMValueRef oh = LLVMBuildUDiv(B, p, OW, ""), ow = LLVMBuildURem(B, p, OW, "");
    ac[0] = oc[0] = n;
    ac[2] = cg_mulc(f, oh, G->sh), ac[3] = cg_mulc(f, ow, G->sw);
    oc[2] = oh, oc[3] = ow;
    return;
  }
  LLVMValueRef pc[IR_MAX_RANK];
  cg_delinearize(f, row, G->yt.dim, G->prefix, pc);
  for (int i = 0; i < G->abat; i++) ac[i] = G->at.dim[i] == 1 ? cg_i64(f->m, 0) : pc[G->nb - G->abat + i];
  if (!G->a1) ac[G->am] = pc[G->nb];
  for (int i = 0; i < G->prefix; i++) oc[i] = pc[i];
}

/* The micro-kernel, shared by matmul and conv2d: for k in [k0, k1), rows
 * i < mr and panels j < npan, acc[(i * npan + j) * nv + v] += a(i, k) *
 * B[boff + j * pstride + (k - k0) * nr + v * vl ..], B a float* to rows of
 * NR contiguous floats (packed weight panels pstride floats apart, or the
 * im2col panel of a convolution).  Several panels at once (npan > 1) give
 * a block of few rows (decoding: one) enough independent accumulators to
 * hide the latency of the fused multiply-adds. */
typedef LLVMValueRef (*GemmAFn)(Gemm *G, const void *ctx, int i, LLVMValueRef k);

static void micro_kernel(Gemm *G, int mr, int npan, int64_t pstride, LLVMValueRef k0, LLVMValueRef k1, LLVMValueRef b,
                         LLVMValueRef boff, GemmAFn a_at, const void *ctx) {
  CgFn *f = G->f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  int nv = G->nv, nt = npan * nv;
  CgLoop lk;
  LLVMValueRef k = cg_loop_begin(f, &lk, k0, k1, "k");
  LLVMValueRef off = cg_add(f, boff, cg_mulc(f, LLVMBuildNSWSub(B, k, k0, ""), G->nr));
  if (G->pf) {
    /* prefetcht1: into L2, where the next chunk is read from */
    LLVMValueRef at = LLVMBuildGEP2(B, m->t_i8, G->pf, (LLVMValueRef[]){cg_mul(f, LLVMBuildNSWSub(B, k, k0, ""), G->pf_step)}, 1, "");
    LLVMValueRef args[4] = {at, cg_i32(m, 0), cg_i32(m, 2), cg_i32(m, 1)};
    LLVMTypeRef pt = LLVMTypeOf(at);
    cg_intrinsic(m, "llvm.prefetch", &pt, 1, args, 4);
  }
  LLVMValueRef bvec[GEMM_MAX_ACC];
  for (int j = 0; j < npan; j++)
    for (int v = 0; v < nv; v++) {
      LLVMValueRef e = cg_add(f, off, cg_i64(m, j * pstride + v * G->vl));
      LLVMValueRef ld = LLVMBuildLoad2(B, G->vt, vec_ptr(G, b, e), "b");
      LLVMSetAlignment(ld, 4);
      bvec[j * nv + v] = ld;
    }
  for (int i = 0; i < mr; i++) {
    LLVMValueRef a = splat(G, a_at(G, ctx, i, k));
    for (int t = 0; t < nt; t++) {
      LLVMValueRef slot = G->acc[i * nt + t];
      LLVMValueRef args[3] = {a, bvec[t], LLVMBuildLoad2(B, G->vt, slot, "")};
      LLVMBuildStore(B, cg_intrinsic(m, "llvm.fmuladd", &G->vt, 1, args, 3), slot);
    }
  }
  cg_loop_end(f, &lk, false);
}

/* matmul's A: row i's element k, read through cg_emit at its coordinates */
static LLVMValueRef mm_a_at(Gemm *G, const void *ctx, int i, LLVMValueRef k) {
  LLVMValueRef(*ac)[IR_MAX_RANK] = (LLVMValueRef(*)[IR_MAX_RANK])ctx;
  ac[i][G->ak] = k;
  return cg_emit(G->f, G->av, ac[i]);
}

/* Panels computed at once by a block of mr rows: as many as keep the
 * accumulators within those of a full MR-row block (the registers the
 * target has for them), at most GEMM_MAX_PANELS. */
static int panels_for(const Gemm *G, int mr) {
  int q = G->mr / mr;
  return q < 1 ? 1 : q > GEMM_MAX_PANELS ? GEMM_MAX_PANELS : q;
}

/* conv_rows' tile (mr pixels x npan * nr channels in the accumulators) to
 * tile_t by columns, tile_t[j * mr + i]: for a power-of-two mr, log2(mr)
 * rounds of interleaving the vectors of rows k and k + mr/2 (a perfect
 * shuffle; the result, read in order, is the transpose), one two-source
 * shuffle per vector and round; else element by element. */
static void transpose_tile(Gemm *G, int mr, int nt) {
  CgFn *f = G->f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  int vl = G->vl;
  bool pow2 = (mr & (mr - 1)) == 0;
  LLVMValueRef lo[16], hi[16];
  for (int e = 0; e < vl; e++) {
    int src = e / 2 + (e % 2 ? vl : 0);
    lo[e] = cg_i32(m, src), hi[e] = cg_i32(m, src + vl / 2);
  }
  LLVMValueRef mlo = LLVMConstVector(lo, (unsigned)vl), mhi = LLVMConstVector(hi, (unsigned)vl);
  for (int t = 0; t < nt; t++) {
    LLVMValueRef r[GEMM_MAX_MR], nx[GEMM_MAX_MR];
    for (int i = 0; i < mr; i++) r[i] = LLVMBuildLoad2(B, G->vt, G->acc[i * nt + t], "");
    LLVMValueRef base = cg_i64(m, (int64_t)t * vl * mr);
    if (!pow2) {
      for (int i = 0; i < mr; i++)
        for (int l = 0; l < vl; l++)
          store_f32(f, G->tile_t, cg_add(f, base, cg_i64(m, (int64_t)l * mr + i)),
                    LLVMBuildExtractElement(B, r[i], cg_i32(m, l), ""));
      continue;
    }
    for (int h = mr / 2; h >= 1; h /= 2) {
      for (int k = 0; k < mr / 2; k++) {
        nx[2 * k] = LLVMBuildShuffleVector(B, r[k], r[k + mr / 2], mlo, "");
        nx[2 * k + 1] = LLVMBuildShuffleVector(B, r[k], r[k + mr / 2], mhi, "");
      }
      memcpy(r, nx, sizeof(LLVMValueRef) * (size_t)mr);
    }
    for (int q = 0; q < mr; q++) {
      LLVMValueRef st = LLVMBuildStore(B, r[q], vec_ptr(G, G->tile_t, cg_add(f, base, cg_i64(m, (int64_t)q * vl))));
      LLVMSetAlignment(st, 4);
    }
  }
}

/* conv_rows: the tile of pixel rows [r0, r0 + mr) and the channels of
 * panels [p, p + npan) through tile_t to the epilogue, channel by channel
 * (a parallel loop: channel j reads and writes only its own elements),
 * the mr pixels of a channel innermost.  Where the epilogue allows it
 * (G->flat) and the rows are consecutive pixels of one image, a pixel is
 * addressed (n, col, 0, p): the same linear offset as (n, col, oh, ow),
 * consecutive for consecutive pixels, so that the mr stores (and the
 * residual's loads) become vectors. */
static void conv_rows_epilogue(Gemm *G, int mr, int npan, LLVMValueRef r0, LLVMValueRef p, LLVMValueRef nvalid) {
  CgFn *f = G->f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  int nt = npan * G->nv;
  transpose_tile(G, mr, nt);
  LLVMValueRef c0 = cg_mulc(f, p, G->nr);
  LLVMValueRef ncols = cg_min(f, cg_i64(m, (int64_t)npan * G->nr), LLVMBuildNSWSub(B, cg_i64(m, G->N), c0, ""));
  LLVMValueRef oc[GEMM_MAX_MR][IR_MAX_RANK], ac[IR_MAX_RANK];
  for (int i = 0; i < mr; i++) row_coords(G, cg_add(f, r0, cg_i64(m, i)), ac, oc[i]);
  LLVMValueRef n0 = LLVMBuildUDiv(B, r0, cg_i64(m, G->P), "");
  LLVMValueRef p0 = LLVMBuildNSWSub(B, r0, cg_mulc(f, n0, G->P), "");
  LLVMValueRef one_image = G->flat ? LLVMBuildICmp(B, LLVMIntSLE, cg_add(f, p0, cg_i64(m, mr)), cg_i64(m, G->P), "")
                                   : LLVMConstInt(m->t_i1, 0, 0);
  for (int flat = G->flat; flat >= 0; flat--) {
    CgIf branch;
    LLVMValueRef cond = flat ? one_image : LLVMBuildNot(B, one_image, "");
    cg_if_begin(f, &branch, cond, flat ? "flat" : "by_pixel");
    CgLoop lj;
    LLVMValueRef j = cg_loop_begin_parallel(f, &lj, cg_i64(m, 0), ncols, "channel");
    LLVMValueRef col = cg_add(f, c0, j);
    LLVMValueRef bias = G->bias >= 0 ? cg_emit(f, G->bias, &col) : NULL;
    for (int i = 0; i < mr; i++) {
      CgIf valid;
      if (nvalid && !flat) cg_if_begin(f, &valid, LLVMBuildICmp(B, LLVMIntSLT, cg_i64(m, i), nvalid, ""), "valid");
      LLVMValueRef y = load_f32(f, G->tile_t, cg_add(f, cg_mulc(f, j, mr), cg_i64(m, i)));
      cg_tag_access(f, y);
      if (bias) y = LLVMBuildFAdd(B, y, bias, "");
      LLVMValueRef yc[4] = {oc[i][0], col, oc[i][2], oc[i][3]};
      if (flat) yc[0] = n0, yc[2] = cg_i64(m, 0), yc[3] = cg_add(f, p0, cg_i64(m, i));
      cg_store_epilogue(f, yc, y);
      if (nvalid && !flat) cg_if_end(f, &valid);
    }
    cg_loop_end(f, &lj, false);
    cg_if_end(f, &branch);
  }
}

/* The rows [r0, r0 + mr) against panels [p, p + npan): the micro-kernel,
 * then the tile, through the stack, to the epilogue (valid columns only). */
static void emit_tile(Gemm *G, int mr, int npan, LLVMValueRef ac[][IR_MAX_RANK], LLVMValueRef r0, LLVMValueRef p) {
  CgFn *f = G->f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  int nt = npan * G->nv;
  int64_t width = (int64_t)npan * G->nr;
  LLVMValueRef zero = LLVMConstNull(G->vt);
  for (int a = 0; a < mr * nt; a++) LLVMBuildStore(B, zero, G->acc[a]);
  micro_kernel(G, mr, npan, G->K * G->nr, cg_i64(m, 0), cg_i64(m, G->K), G->packed, cg_mulc(f, p, G->K * G->nr), mm_a_at,
               ac);
  if (G->crow) {
    conv_rows_epilogue(G, mr, npan, r0, p, NULL);
    return;
  }
  for (int i = 0; i < mr; i++)
    for (int t = 0; t < nt; t++) {
      LLVMValueRef st = LLVMBuildStore(B, LLVMBuildLoad2(B, G->vt, G->acc[i * nt + t], ""),
                                       vec_ptr(G, G->tile, cg_i64(m, (int64_t)i * width + t * G->vl)));
      LLVMSetAlignment(st, 4);
    }
  LLVMValueRef c0 = cg_mulc(f, p, G->nr);
  LLVMValueRef ncols = cg_min(f, cg_i64(m, width), LLVMBuildNSWSub(B, cg_i64(m, G->N), c0, ""));
  CgLoop li, lj;
  LLVMValueRef i = cg_loop_begin(f, &li, cg_i64(m, 0), cg_i64(m, mr), "tile_row");
  LLVMValueRef a_coords[IR_MAX_RANK], oc[IR_MAX_RANK]; /* a_coords: not needed here */
  row_coords(G, cg_add(f, r0, i), a_coords, oc);
  /* column j reads and writes only what belongs to it, whether or not the
   * output overlaps an epilogue operand (a residual written in place) */
  LLVMValueRef j = cg_loop_begin_parallel(f, &lj, cg_i64(m, 0), ncols, "tile_col");
  oc[G->yt.rank - 1] = cg_add(f, c0, j);
  LLVMValueRef t = LLVMBuildInBoundsGEP2(B, m->t_f32, G->tile, (LLVMValueRef[]){cg_add(f, cg_mulc(f, i, width), j)}, 1, "");
  LLVMValueRef tv = LLVMBuildLoad2(B, m->t_f32, t, "");
  cg_tag_access(f, tv);
  cg_store_epilogue(f, oc, tv);
  cg_loop_end(f, &lj, false);
  cg_loop_end(f, &li, false);
}

/* The rows [r0, r0 + mr) against panels [p0, p1): npan panels at a time,
 * then the rest one by one.  pf (an i8*, or NULL): the block's share of
 * the next chunk's prefetch, pf_bytes for each panel (emit_rows). */
static void emit_block(Gemm *G, int mr, LLVMValueRef r0, LLVMValueRef p0, LLVMValueRef p1, LLVMValueRef pf,
                       LLVMValueRef pf_bytes) {
  CgFn *f = G->f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  LLVMValueRef ac[GEMM_MAX_MR][IR_MAX_RANK], oc[IR_MAX_RANK];
  for (int i = 0; i < mr; i++) row_coords(G, cg_add(f, r0, cg_i64(m, i)), ac[i], oc);
  int q = panels_for(G, mr);
  LLVMValueRef pq = p0;
  if (q > 1) {
    CgLoop lg;
    LLVMValueRef ng = LLVMBuildUDiv(B, LLVMBuildNSWSub(B, p1, p0, ""), cg_i64(m, q), "");
    LLVMValueRef gi = cg_loop_begin(f, &lg, cg_i64(m, 0), ng, "panels");
    emit_tile(G, mr, q, ac, r0, cg_add(f, p0, cg_mulc(f, gi, q)));
    cg_loop_end(f, &lg, false);
    pq = cg_add(f, p0, cg_mulc(f, ng, q));
  }
  CgLoop lp;
  LLVMValueRef p = cg_loop_begin(f, &lp, pq, p1, "panel");
  if (pf) G->pf = LLVMBuildGEP2(B, m->t_i8, pf, (LLVMValueRef[]){cg_mul(f, LLVMBuildNSWSub(B, p, p0, ""), pf_bytes)}, 1, "");
  emit_tile(G, mr, 1, ac, r0, p);
  G->pf = NULL;
  cg_loop_end(f, &lp, false);
}

/* Whether G's packed weight is large enough for the next chunk's or
 * slice's prefetch (GEMM_PREFETCH_MIN). */
static bool prefetch_wanted(const Gemm *G) { return G->np * G->K * G->nr * 4 > GEMM_PREFETCH_MIN; }

/* Each of `calls` micro-kernel calls of klen k's prefetches an equal share
 * of `bytes` (returned), G->pf_step bytes a k: a line a k at most (a
 * larger share is left partly to the hardware prefetcher). */
static LLVMValueRef prefetch_share(Gemm *G, LLVMValueRef bytes, LLVMValueRef calls, int64_t klen) {
  CgFn *f = G->f;
  CgMod *m = f->m;
  LLVMValueRef share = LLVMBuildUDiv(f->b, bytes, calls, "");
  G->pf_step = cg_min(f, LLVMBuildUDiv(f->b, cg_add(f, share, cg_i64(m, klen - 1)), cg_i64(m, klen), ""), cg_i64(m, 64));
  return share;
}

/* The rows [r, r + rem), rem < MR, by rem's binary digits (8, 4, 2, 1
 * below MR): block(ctx, mr, row) for each. */
typedef void (*GemmBlockFn)(void *ctx, int mr, LLVMValueRef r);
static void rest_blocks(Gemm *G, LLVMValueRef r, LLVMValueRef rem, GemmBlockFn block, void *ctx) {
  CgFn *f = G->f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  for (int s = 8; s >= 1; s /= 2) {
    if (s >= G->mr) continue;
    CgIf has;
    LLVMValueRef bit = LLVMBuildAnd(B, rem, cg_i64(m, s), "");
    cg_if_begin(f, &has, LLVMBuildICmp(B, LLVMIntNE, bit, cg_i64(m, 0), ""), "rest");
    LLVMValueRef before = LLVMBuildAnd(B, rem, cg_i64(m, ~(int64_t)(2 * s - 1)), "");
    block(ctx, s, cg_add(f, r, before));
    cg_if_end(f, &has);
  }
}

/* emit_block over panels [p0, p1) without prefetch (rest_blocks' callback) */
typedef struct {
  Gemm *G;
  LLVMValueRef p0, p1;
} RowsRest;
static void rows_rest_block(void *ctx, int mr, LLVMValueRef r) {
  RowsRest *rr = ctx;
  emit_block(rr->G, mr, r, rr->p0, rr->p1, NULL, NULL);
}

/* Rows [rlo, rhi) against panels [plo, phi), the panels in chunks
 * (L2-resident while every row block of the task passes over them), each
 * chunk met by the full MR-row blocks and then by the remaining rows, by
 * their binary digits.
 *   - A chunk is per_chunk panels (at least one, about GEMM_CHUNK_BYTES of
 *     B) when the rows are whole blocks, else rest_chunk (a multiple of
 *     GEMM_MAX_PANELS, so that a block of few rows still computes several
 *     panels at once: panels_for); all the panels when the rows are one
 *     block or fewer (nothing to reuse).
 *   - The first block to meet a chunk would read it from memory faster than
 *     one core streams (a panel of K = 1024 is 128 KiB in about 3 us of
 *     multiply-adds), so while a chunk is in use its full blocks prefetch
 *     the next one into L2, each micro-kernel call an equal share, a few
 *     bytes a k (packed weights over GEMM_PREFETCH_MIN only). */
static void emit_rows(Gemm *G, int64_t per_chunk, int64_t rest_chunk, LLVMValueRef rlo, LLVMValueRef rhi,
                      LLVMValueRef plo, LLVMValueRef phi) {
  CgFn *f = G->f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  LLVMValueRef span = LLVMBuildNSWSub(B, rhi, rlo, "");
  LLVMValueRef np = LLVMBuildNSWSub(B, phi, plo, "");
  LLVMValueRef few = LLVMBuildICmp(B, LLVMIntSLE, span, cg_i64(m, G->mr), "");
  LLVMValueRef nfull = LLVMBuildUDiv(B, span, cg_i64(m, G->mr), "");
  LLVMValueRef r = cg_add(f, rlo, cg_mulc(f, nfull, G->mr));
  LLVMValueRef rem = LLVMBuildNSWSub(B, rhi, r, "");
  LLVMValueRef panel_bytes = cg_i64(m, G->K * G->nr * 4);
  LLVMValueRef chunk = LLVMBuildSelect(
      B, few, cg_max(f, np, cg_i64(m, 1)),
      LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntSGT, rem, cg_i64(m, 0), ""), cg_i64(m, rest_chunk), cg_i64(m, per_chunk), ""),
      "");
  LLVMValueRef nchunks = LLVMBuildUDiv(B, cg_add(f, np, cg_add(f, chunk, cg_i64(m, -1))), chunk, "");
  CgLoop lc, lb;
  LLVMValueRef c = cg_loop_begin(f, &lc, cg_i64(m, 0), nchunks, "chunk");
  LLVMValueRef p0 = cg_add(f, plo, cg_mul(f, c, chunk));
  LLVMValueRef p1 = cg_min(f, cg_add(f, p0, chunk), phi);
  LLVMValueRef npc = LLVMBuildNSWSub(B, p1, p0, "");
  /* the next chunk [p1, pn): share bytes for each of the nfull * npc calls */
  LLVMValueRef share = NULL, next = NULL;
  if (prefetch_wanted(G)) {
    LLVMValueRef pn = cg_min(f, cg_add(f, p1, chunk), phi);
    LLVMValueRef calls = cg_max(f, cg_mul(f, nfull, npc), cg_i64(m, 1));
    share = prefetch_share(G, cg_mul(f, LLVMBuildNSWSub(B, pn, p1, ""), panel_bytes), calls, G->K);
    next = LLVMBuildGEP2(B, m->t_i8, LLVMBuildBitCast(B, G->packed, m->t_ptr, ""), (LLVMValueRef[]){cg_mul(f, p1, panel_bytes)},
                         1, "");
  }
  LLVMValueRef ib = cg_loop_begin(f, &lb, cg_i64(m, 0), nfull, "rows");
  LLVMValueRef row_pf =
      next ? LLVMBuildGEP2(B, m->t_i8, next, (LLVMValueRef[]){cg_mul(f, cg_mul(f, ib, npc), share)}, 1, "") : NULL;
  emit_block(G, G->mr, cg_add(f, rlo, cg_mulc(f, ib, G->mr)), p0, p1, row_pf, share);
  cg_loop_end(f, &lb, false);
  /* the remaining rows, fewer than MR: by their binary digits */
  rest_blocks(G, r, rem, rows_rest_block, &(RowsRest){G, p0, p1});
  cg_loop_end(f, &lc, false);
}

/* The GEMM over rows x ncb column blocks of CG_MM_COLS columns (one
 * block: all columns), spread over the kernel's tasks: task t is column
 * block t / rows of row t % rows (cg_matmul_space). */
static void emit_space(Gemm *G, int64_t rows, int64_t ncb) {
  CgFn *f = G->f;
  CgMod *m = f->m;
  int64_t K = G->K;
  int64_t ppb = ncb > 1 ? CG_MM_COLS / G->nr : G->np; /* panels per column block */
  int64_t per_chunk = GEMM_CHUNK_BYTES / (K * G->nr * 4);
  if (per_chunk < 1) per_chunk = 1;
  int64_t rest_chunk = per_chunk < GEMM_MAX_PANELS ? GEMM_MAX_PANELS : per_chunk - per_chunk % GEMM_MAX_PANELS;
  cg_store_loops(f, f->side, f->nside);
  LLVMValueRef ub, ue;
  cg_task_span(f, f->k->ntasks, rows * ncb, &ub, &ue);
  if (ncb == 1) {
    emit_rows(G, per_chunk, rest_chunk, ub, ue, cg_i64(m, 0), cg_i64(m, G->np));
    return;
  }
  /* A task range is up to three pieces: the end of one column block
   * (rows [ub % rows, ..)), a run of whole blocks (every row, their panels
   * together), the start of another (rows [0, ue % rows)); a loop of
   * three pieces, some empty, emits the body once. */
  LLVMBuilderRef B = f->b;
  LLVMValueRef R = cg_i64(m, rows), one = cg_i64(m, 1), zero = cg_i64(m, 0);
  LLVMValueRef cb0 = LLVMBuildUDiv(B, ub, R, ""), rb0 = LLVMBuildURem(B, ub, R, "");
  LLVMValueRef cb1 = LLVMBuildUDiv(B, ue, R, ""), re1 = LLVMBuildURem(B, ue, R, "");
  LLVMValueRef head = LLVMBuildICmp(B, LLVMIntNE, rb0, zero, "");
  LLVMValueRef cfull = cg_add(f, cb0, LLVMBuildZExt(B, head, m->t_i64, "")); /* first whole block */
  LLVMValueRef head_end = LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntEQ, cb0, cb1, ""), re1, R, "");
  LLVMValueRef tail = LLVMBuildAnd(B, LLVMBuildICmp(B, LLVMIntNE, re1, zero, ""),
                                   LLVMBuildICmp(B, LLVMIntSGE, cb1, cfull, ""), "");
  CgLoop ls;
  LLVMValueRef sgi = cg_loop_begin(f, &ls, zero, cg_i64(m, 3), "piece");
  LLVMValueRef is0 = LLVMBuildICmp(B, LLVMIntEQ, sgi, zero, ""), is1 = LLVMBuildICmp(B, LLVMIntEQ, sgi, one, "");
  /* piece 0: block cb0, rows [rb0, head_end), when rb0 > 0;
   * piece 1: blocks [cfull, max(cb1, cfull)), every row;
   * piece 2: block cb1, rows [0, re1), when re1 > 0 and cb1 >= cfull */
  LLVMValueRef clo = LLVMBuildSelect(B, is0, cb0, LLVMBuildSelect(B, is1, cfull, cb1, ""), "");
  LLVMValueRef chi = LLVMBuildSelect(
      B, is0, cg_add(f, cb0, LLVMBuildZExt(B, head, m->t_i64, "")),
      LLVMBuildSelect(B, is1, cg_max(f, cb1, cfull), cg_add(f, cb1, LLVMBuildZExt(B, tail, m->t_i64, "")), ""), "");
  LLVMValueRef rlo = LLVMBuildSelect(B, is0, rb0, zero, "");
  LLVMValueRef rhi = LLVMBuildSelect(B, is0, head_end, LLVMBuildSelect(B, is1, R, re1, ""), "");
  LLVMValueRef plo = cg_mulc(f, clo, ppb);
  LLVMValueRef phi = cg_min(f, cg_mulc(f, chi, ppb), cg_i64(m, G->np));
  CgIf any;
  LLVMValueRef nonempty = LLVMBuildAnd(B, LLVMBuildICmp(B, LLVMIntSLT, clo, chi, ""),
                                       LLVMBuildICmp(B, LLVMIntSLT, rlo, rhi, ""), "");
  cg_if_begin(f, &any, nonempty, "piece_rows");
  emit_rows(G, per_chunk, rest_chunk, rlo, rhi, plo, phi);
  cg_if_end(f, &any);
  cg_loop_end(f, &ls, false);
  }

/* G for the matmul anchoring f, of K x N weight: the target's blocking
 * (gemm_regs) and A's coordinates (row_coords, mm_a_at). */
static void gemm_matmul_init(Gemm *G, CgFn *f, int64_t K, int64_t N) {
  const Node *n = &f->g->node[f->anchor];
  const TensorType *at = &f->g->val[n->in[0]].type, *yt = cg_anchor_type(f);
  bool ta = ir_attr_int(n, "transpose_a") != 0;
  *G = (Gemm){.f = f, .av = n->in[0], .at = *at, .yt = *yt, .K = K, .N = N};
  gemm_regs(G, f->m);
  G->a1 = at->rank == 1;
  G->abat = G->a1 ? 0 : at->rank - 2;
  G->prefix = yt->rank - 1;
  G->nb = yt->rank - (G->a1 ? 0 : 1) - 1;
  G->am = ta ? G->abat + 1 : G->abat;
  G->ak = G->a1 ? 0 : ta ? G->abat : G->abat + 1;
}

static void gemm_long_k(Gemm *G, int64_t rows);

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
  if (!ir_is_const(g, bv) || bt.rank < 2 || f->arg_of[bv] < 0) return NULL;
  for (int i = 0; i + 2 < bt.rank; i++)
    if (bt.dim[i] != 1) return NULL; /* batched weights: generic */
  bool tb = ir_attr_int(n, "transpose_b") != 0;
  int64_t K = bt.dim[tb ? bt.rank - 1 : bt.rank - 2], N = bt.dim[tb ? bt.rank - 2 : bt.rank - 1];
  if (K == 0 || N == 0) return NULL;

  Gemm G;
  gemm_matmul_init(&G, f, K, N);
  /* many rows (512^3: 256 a thread): blocks of 12 rows (24 accumulators of
   * the 32 registers) read each panel of B from L2 a third fewer times
   * than blocks of 8, 1.03-1.07x on the Intel VM's AVX-512 cores (ViT-B/16's
   * 197 rows: 1.07x the whole model); with fewer rows the remainder (by 8,
   * 4, 2, 1) costs more than that saves (W2 at M = 128: 0.97x) */
  if (G.vl == 16 && ir_type_numel(&yt) / N >= GEMM_MR12_ROWS) G.mr = 12;
  G.np = (N + G.nr - 1) / G.nr;
  if ((uint64_t)G.np * (uint64_t)K * (uint64_t)G.nr * 4 > UINT32_MAX) return NULL; /* LLVMConstString's limit */
  LLVMValueRef gv = packed_weight(f, bv, tb, K, N, G.nr);
  if (!gv) return st_error(ST_NO_MEMORY, "kernel %s: out of memory packing weight '%s'", f->k->name, g->val[bv].name);
  *out_done = true;
  G.packed = LLVMBuildBitCast(f->ab, gv, LLVMPointerType(m->t_f32, 0), "packed");
  G.tile = cg_alloca(f, m->t_f32, (int64_t)G.mr * G.nv * G.vl, "tile"); /* mr * npan <= G.mr rows of NR */
  for (int a = 0; a < G.mr * G.nv; a++) G.acc[a] = cg_alloca(f, G.vt, 1, "acc");

  /* the task space (lower.h): column block t / rows, row t % rows */
  int64_t rows, ncb;
  cg_matmul_space(g, n, &rows, &ncb);
  if (ncb == 1 && K >= GEMM_KBLOCK_K && rows >= GEMM_KBLOCK_ROWS && !f->k->rg.range) {
    gemm_long_k(&G, rows);
    return NULL;
  }
  emit_space(&G, rows, ncb);
  return NULL;
}

/* ---- shared by the GEMMs over panels built in the kernel ---- */

/* Rows [r0, r1) by blocks of MR, then the rest by rest_blocks. */
static void by_row_blocks(Gemm *G, LLVMValueRef r0, LLVMValueRef r1, const char *name, GemmBlockFn block, void *ctx) {
  CgFn *f = G->f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  CgLoop lb;
  LLVMValueRef nfull = LLVMBuildUDiv(B, LLVMBuildNSWSub(B, r1, r0, ""), cg_i64(m, G->mr), "");
  LLVMValueRef bi = cg_loop_begin(f, &lb, cg_i64(m, 0), nfull, name);
  block(ctx, G->mr, cg_add(f, r0, cg_mulc(f, bi, G->mr)));
  cg_loop_end(f, &lb, false);
  LLVMValueRef r = cg_add(f, r0, cg_mulc(f, nfull, G->mr));
  rest_blocks(G, r, LLVMBuildNSWSub(B, r1, r, ""), block, ctx);
}

/* The accumulators of mr rows into rows [rel, rel + mr) of a tile of
 * partial sums, NR floats a row: added to them, or stored when add is
 * false (one chunk of k is all of K). */
static void acc_to_partial(Gemm *G, int mr, LLVMValueRef cbuf, LLVMValueRef rel, bool add) {
  CgFn *f = G->f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  for (int i = 0; i < mr; i++)
    for (int v = 0; v < G->nv; v++) {
      LLVMValueRef p = vec_ptr(G, cbuf, cg_add(f, cg_mulc(f, cg_add(f, rel, cg_i64(m, i)), G->nr), cg_i64(m, v * G->vl)));
      LLVMValueRef sum = LLVMBuildLoad2(B, G->vt, G->acc[i * G->nv + v], "");
      if (add) {
        LLVMValueRef old = LLVMBuildLoad2(B, G->vt, p, "");
        LLVMSetAlignment(old, 4);
        sum = LLVMBuildFAdd(B, old, sum, "");
      }
      LLVMSetAlignment(LLVMBuildStore(B, sum, p), 4);
    }
}

/* ---- conv2d as an implicit GEMM ---- */

/* Blocks of MR output channels per task unit: bounds the stack tile of
 * partial sums (CONV_OC_ROWS x NR f32) while the im2col panel it was
 * built from is reused by as many channels as possible. */
#define CONV_OC_ROWS 128
/* bytes of the im2col panel (KC x NR f32): inside a 32 KiB L1 */
#define CONV_PANEL_BYTES (32 * 1024)

typedef struct {
  Gemm G;
  int xv, bv;
  int64_t N, C, H, W, OH, OW, P, Cg, Og, KH, KW, K, groups;
  int64_t sh, sw, pt, pl, dh, dw;
  int64_t nob, kc, ocb; /* MR blocks per group, k per panel, MR blocks per unit */
  LLVMValueRef panel, cbuf; /* float[kc * nr], float[ocb * mr * nr] */
  int xarg;                 /* x's kernel argument when packing by masked vector loads, else -1 */
  /* with xarg: per (kh, kw) and output-row segment of the unit, the panel
   * lanes [a, b) that are inside the image and x's offset without the
   * channel term (seg_table), maxseg segments at most; NULL: not used */
  LLVMValueRef segtab;
  int64_t maxseg;
  LLVMValueRef prow[GEMM_MAX_ACC / 2]; /* the panel row being built, nv vectors */
  /* per unit */
  LLVMValueRef n, g, p0, plen, r0, oh0, oh1;
} Conv;

/* The packed convolution weight: per group, blocks of MR output channels,
 * each K rows of MR floats (k = (c, kh, kw), the OIHW order), zero rows
 * past the group's last channel: [groups][nob][K][MR] f32,
 * "<w>.convpacked<MR>". */
static LLVMValueRef packed_conv_weight(CgFn *f, int wv, const Conv *c) {
  char name[512];
  int mr = c->G.mr;
  snprintf(name, sizeof name, "%s.convpacked%d", f->g->val[wv].name, mr);
  Pack p = {.groups = c->groups, .nblk = c->nob, .K = c->K, .R = mr, .L = c->Og, .gs = c->Og * c->K, .cs = c->K, .ks = 1};
  return packed_global(f, wv, name, &p);
}


/* base[i] = 0 for i in [lo, hi) */
static void zero_range(CgFn *f, LLVMValueRef base, LLVMValueRef lo, LLVMValueRef hi) {
  CgLoop l;
  LLVMValueRef i = cg_loop_begin(f, &l, lo, hi, "zero");
  store_f32(f, base, i, cg_fconst(f->m->t_f32, 0));
  cg_loop_end(f, &l, false);
}

/* The unit's pixels [p0, p0 + plen) by output rows: opens a loop over oh
 * and returns the segment's columns [*owa, *owb) and the panel column of
 * ow = 0 (*jbase, so that pixel (oh, ow) is column jbase + ow). */
static LLVMValueRef row_segment(Conv *c, CgLoop *l, LLVMValueRef *owa, LLVMValueRef *owb, LLVMValueRef *jbase) {
  CgFn *f = c->G.f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  LLVMValueRef oh = cg_loop_begin(f, l, c->oh0, c->oh1, "oh");
  LLVMValueRef rowp = cg_mulc(f, oh, c->OW);
  *jbase = LLVMBuildNSWSub(B, rowp, c->p0, "");
  LLVMValueRef neg = LLVMBuildNSWSub(B, cg_i64(m, 0), *jbase, ""); /* p0 - oh*OW */
  *owa = cg_max(f, neg, cg_i64(m, 0));
  *owb = cg_min(f, cg_add(f, neg, c->plen), cg_i64(m, c->OW));
  return oh;
}

/* The output-column range [*vlo, *vhi) of the segment [owa, owb) of row
 * oh whose input pixel for (kh, kw) lies inside the image (empty when the
 * input row is in the padding), exactly, so no test remains per pixel;
 * *off = pl - kw*dw, the input column being ow*sw - off. */
static void valid_cols(Conv *c, LLVMValueRef oh, LLVMValueRef kh, LLVMValueRef kw, LLVMValueRef owa, LLVMValueRef owb,
                       LLVMValueRef *ih, LLVMValueRef *off, LLVMValueRef *vlo, LLVMValueRef *vhi) {
  CgFn *f = c->G.f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  *ih = cg_add(f, cg_mulc(f, oh, c->sh), cg_add(f, cg_i64(m, -c->pt), cg_mulc(f, kh, c->dh)));
  LLVMValueRef in_h = LLVMBuildICmp(B, LLVMIntULT, *ih, cg_i64(m, c->H), "");
  *off = LLVMBuildNSWSub(B, cg_i64(m, c->pl), cg_mulc(f, kw, c->dw), "");
  LLVMValueRef lo = LLVMBuildSDiv(B, cg_add(f, cg_max(f, *off, cg_i64(m, 0)), cg_i64(m, c->sw - 1)), cg_i64(m, c->sw), "");
  LLVMValueRef u = cg_add(f, *off, cg_i64(m, c->W - 1));
  LLVMValueRef hi = cg_add(f, LLVMBuildSDiv(B, cg_max(f, u, cg_i64(m, 0)), cg_i64(m, c->sw), ""), cg_i64(m, 1));
  hi = LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntSLT, u, cg_i64(m, 0), ""), cg_i64(m, 0), hi, "");
  LLVMValueRef a = cg_min(f, cg_max(f, lo, owa), owb);
  LLVMValueRef b = cg_max(f, cg_min(f, hi, owb), a);
  *vlo = LLVMBuildSelect(B, in_h, a, owb, "");
  *vhi = LLVMBuildSelect(B, in_h, b, owb, "");
}

/* The panel row being built (c->prow, nv vectors) starts at zero. */
static void row_begin(Conv *c) {
  for (int v = 0; v < c->G.nv; v++) LLVMBuildStore(c->G.f->b, LLVMConstNull(c->G.vt), c->prow[v]);
}

/* Lanes [a, b) of the panel row from x at element e0 + sw * lane (e0:
 * lane 0's offset; masked-off lanes are never accessed, so the padding
 * needs no test and no copy).  Stride 2 (sw): each vector of VL lanes is
 * the even elements of a span of 2 VL, read as two masked loads of its
 * even elements whose lanes are valid and interleaved by one shuffle. */
static void row_masked_loads_s2(Conv *c, LLVMValueRef va, LLVMValueRef vb, LLVMValueRef e0);
static void row_masked_loads(Conv *c, LLVMValueRef a, LLVMValueRef b, LLVMValueRef e0) {
  Gemm *G = &c->G;
  CgFn *f = G->f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  LLVMTypeRef it = LLVMVectorType(m->t_i64, (unsigned)G->vl);
  LLVMValueRef zmask = LLVMConstNull(LLVMVectorType(m->t_i32, (unsigned)G->vl));
  LLVMValueRef va = LLVMBuildShuffleVector(B, LLVMBuildInsertElement(B, LLVMGetUndef(it), a, cg_i32(m, 0), ""),
                                           LLVMGetUndef(it), zmask, "");
  LLVMValueRef vb = LLVMBuildShuffleVector(B, LLVMBuildInsertElement(B, LLVMGetUndef(it), b, cg_i32(m, 0), ""),
                                           LLVMGetUndef(it), zmask, "");
  if (c->sw == 2) {
    row_masked_loads_s2(c, va, vb, e0);
    return;
  }
  LLVMTypeRef vpt = LLVMPointerType(G->vt, 0);
  for (int v = 0; v < G->nv; v++) {
    LLVMValueRef lanes[16]; /* vl <= 16 */
    for (int l = 0; l < G->vl; l++) lanes[l] = cg_i64(m, (int64_t)v * G->vl + l);
    LLVMValueRef idx = LLVMConstVector(lanes, (unsigned)G->vl);
    LLVMValueRef mask = LLVMBuildAnd(B, LLVMBuildICmp(B, LLVMIntSGE, idx, va, ""), LLVMBuildICmp(B, LLVMIntSLT, idx, vb, ""), "");
    /* not inbounds: the masked-off lanes' addresses may lie outside x */
    LLVMValueRef e = cg_add(f, e0, cg_i64(m, (int64_t)v * G->vl));
    LLVMValueRef p = LLVMBuildBitCast(B, LLVMBuildGEP2(B, m->t_f32, f->base[c->xarg], &e, 1, ""), vpt, "");
    LLVMTypeRef over[2] = {G->vt, vpt};
    LLVMValueRef args[4] = {p, cg_i32(m, 4), mask, LLVMBuildLoad2(B, G->vt, c->prow[v], "")};
    LLVMBuildStore(B, cg_intrinsic(m, "llvm.masked.load", over, 2, args, 4), c->prow[v]);
  }
}

/* row_masked_loads at stride 2: va, vb are a and b splat over i64 lanes. */
static void row_masked_loads_s2(Conv *c, LLVMValueRef va, LLVMValueRef vb, LLVMValueRef e0) {
  Gemm *G = &c->G;
  CgFn *f = G->f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  int vl = G->vl;
  LLVMTypeRef vpt = LLVMPointerType(G->vt, 0);
  LLVMValueRef zero = LLVMConstNull(G->vt);
  for (int v = 0; v < G->nv; v++) {
    LLVMValueRef half[2];
    for (int h = 0; h < 2; h++) {
      /* element i of this half of the span is lane (v vl + (h vl + i) / 2)'s when h vl + i is even */
      LLVMValueRef lanes[16], on[16];
      for (int i = 0; i < vl; i++) {
        lanes[i] = cg_i64(m, (int64_t)v * vl + (h * vl + i) / 2);
        on[i] = LLVMConstInt(m->t_i1, (h * vl + i) % 2 == 0, 0);
      }
      LLVMValueRef idx = LLVMConstVector(lanes, (unsigned)vl);
      LLVMValueRef mask = LLVMBuildAnd(B, LLVMBuildICmp(B, LLVMIntSGE, idx, va, ""), LLVMBuildICmp(B, LLVMIntSLT, idx, vb, ""), "");
      mask = LLVMBuildAnd(B, mask, LLVMConstVector(on, (unsigned)vl), "");
      LLVMValueRef e = cg_add(f, e0, cg_i64(m, 2 * (int64_t)v * vl + (int64_t)h * vl));
      LLVMValueRef p = LLVMBuildBitCast(B, LLVMBuildGEP2(B, m->t_f32, f->base[c->xarg], &e, 1, ""), vpt, "");
      LLVMTypeRef over[2] = {G->vt, vpt};
      LLVMValueRef args[4] = {p, cg_i32(m, 4), mask, zero};
      half[h] = cg_intrinsic(m, "llvm.masked.load", over, 2, args, 4);
    }
    LLVMValueRef even[16], lanes[16];
    for (int l = 0; l < vl; l++) {
      even[l] = cg_i32(m, 2 * l);
      lanes[l] = cg_i64(m, (int64_t)v * vl + l);
    }
    LLVMValueRef got = LLVMBuildShuffleVector(B, half[0], half[1], LLVMConstVector(even, (unsigned)vl), "");
    LLVMValueRef idx = LLVMConstVector(lanes, (unsigned)vl);
    LLVMValueRef valid = LLVMBuildAnd(B, LLVMBuildICmp(B, LLVMIntSGE, idx, va, ""), LLVMBuildICmp(B, LLVMIntSLT, idx, vb, ""), "");
    LLVMBuildStore(B, LLVMBuildSelect(B, valid, got, LLVMBuildLoad2(B, G->vt, c->prow[v], ""), ""), c->prow[v]);
  }
}

/* Whether the panel rows of conv c, nr lanes, are built by masked vector
 * loads: at stride 1; at stride 2 only for conv_pixels' narrow im2col
 * blocks (nr = MR lanes) whose output rows fill half a block or more.
 * Each segment of a panel row costs two masked loads and a shuffle per
 * vector at stride 2 against element copies; measured on the Intel VM (2026-12-07,
 * ResNet-50 in the model, 2 threads): the 8-lane blocks of the 14x14 and
 * 7x7 stride-2 convs 1.22-1.31 -> 1.00-1.13 and 1.37-1.40 -> 1.17-1.23 ms,
 * but the 32-lane panels of the 28x28 one 1.18-1.25 -> 1.32-1.40, conv1's
 * no faster, cnn.yaml's 8-pixel rows 50% slower. */
static bool masked_stride_ok(const Conv *c, int64_t nr) {
  return c->sw == 1 || (c->sw == 2 && nr <= 8 && 2 * c->OW >= nr);
}

/* The finished panel row into row k - k0 of the panel. */
static void row_store(Conv *c, LLVMValueRef k, LLVMValueRef k0) {
  Gemm *G = &c->G;
  CgFn *f = G->f;
  for (int v = 0; v < G->nv; v++) {
    LLVMValueRef off = cg_add(f, cg_mulc(f, LLVMBuildNSWSub(f->b, k, k0, ""), G->nr), cg_i64(f->m, (int64_t)v * G->vl));
    LLVMValueRef st = LLVMBuildStore(f->b, LLVMBuildLoad2(f->b, G->vt, c->prow[v], ""), vec_ptr(G, c->panel, off));
    LLVMSetAlignment(st, 4);
  }
}

/* The panel row of one k by masked vector loads (stride 1 or 2, x an f32
 * argument): each output-row segment loads its valid lanes straight from
 * x's input row.  Small copies written as loops would otherwise become
 * memcpy/memset calls, three per segment and k. */
static void pack_row_vector(Conv *c, LLVMValueRef k, LLVMValueRef k0, LLVMValueRef ci, LLVMValueRef kh,
                            LLVMValueRef kw) {
  CgFn *f = c->G.f;
  row_begin(c);
  CgLoop ls;
  LLVMValueRef owa, owb, jbase, ih, off, vlo, vhi;
  LLVMValueRef oh = row_segment(c, &ls, &owa, &owb, &jbase);
  valid_cols(c, oh, kh, kw, owa, owb, &ih, &off, &vlo, &vhi);
  /* x[n, g*Cg + ci, ih, 0]: ih may be outside when no lane is valid; lane
   * j reads x_row[sw * (j - jbase) - off] */
  LLVMValueRef ch = cg_add(f, cg_mulc(f, c->g, c->Cg), ci);
  LLVMValueRef rowlin = cg_mulc(f, cg_add(f, cg_mulc(f, cg_add(f, cg_mulc(f, c->n, c->C), ch), c->H), ih), c->W);
  row_masked_loads(c, cg_add(f, jbase, vlo), cg_add(f, jbase, vhi),
                   LLVMBuildNSWSub(f->b, rowlin, cg_add(f, cg_mulc(f, jbase, c->sw), off), ""));
  cg_loop_end(f, &ls, false);
  row_store(c, k, k0);
}

/* Entries of the segment table: (kh*KW + kw) * maxseg + segment, three i64
 * each (lane a, lane b, x's offset of lane 0 but for c*H*W). */
#define SEG_TABLE_MAX 4096

static void seg_table_at(Conv *c, LLVMValueRef t, LLVMValueRef seg, LLVMValueRef *slot) {
  CgFn *f = c->G.f;
  LLVMValueRef e = cg_mulc(f, cg_add(f, cg_mulc(f, t, c->maxseg), seg), 3);
  for (int i = 0; i < 3; i++)
    slot[i] = LLVMBuildInBoundsGEP2(f->b, f->m->t_i64, c->segtab, (LLVMValueRef[]){cg_add(f, e, cg_i64(f->m, i))}, 1, "");
}

/* The segment table of the unit (the valid lanes and the row's offset of
 * every (kh, kw) and output row it spans): what pack_row_vector would
 * compute again for every input channel, done once per panel build. */
static void seg_table(Conv *c) {
  Gemm *G = &c->G;
  CgFn *f = G->f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  CgLoop lt, ls;
  LLVMValueRef t = cg_loop_begin(f, &lt, cg_i64(m, 0), cg_i64(m, c->KH * c->KW), "khw");
  LLVMValueRef kw = LLVMBuildURem(B, t, cg_i64(m, c->KW), ""), kh = LLVMBuildUDiv(B, t, cg_i64(m, c->KW), "");
  LLVMValueRef owa, owb, jbase, ih, off, vlo, vhi;
  LLVMValueRef oh = row_segment(c, &ls, &owa, &owb, &jbase);
  valid_cols(c, oh, kh, kw, owa, owb, &ih, &off, &vlo, &vhi);
  LLVMValueRef ch0 = cg_mulc(f, c->g, c->Cg);
  LLVMValueRef rowlin = cg_mulc(f, cg_add(f, cg_mulc(f, cg_add(f, cg_mulc(f, c->n, c->C), ch0), c->H), ih), c->W);
  LLVMValueRef slot[3];
  seg_table_at(c, t, LLVMBuildNSWSub(B, oh, c->oh0, ""), slot);
  LLVMBuildStore(B, cg_add(f, jbase, vlo), slot[0]);
  LLVMBuildStore(B, cg_add(f, jbase, vhi), slot[1]);
  LLVMBuildStore(B, LLVMBuildNSWSub(B, rowlin, cg_add(f, cg_mulc(f, jbase, c->sw), off), ""), slot[2]);
  cg_loop_end(f, &ls, false);
  cg_loop_end(f, &lt, false);
}

/* pack_row_vector from the segment table: the panel row of k = (ci, t). */
static void pack_row_table(Conv *c, LLVMValueRef k, LLVMValueRef k0, LLVMValueRef ci, LLVMValueRef t) {
  CgFn *f = c->G.f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  row_begin(c);
  LLVMValueRef chan = cg_mulc(f, ci, c->H * c->W);
  CgLoop ls;
  LLVMValueRef seg = cg_loop_begin(f, &ls, cg_i64(m, 0), LLVMBuildNSWSub(B, c->oh1, c->oh0, ""), "seg");
  LLVMValueRef slot[3];
  seg_table_at(c, t, seg, slot);
  row_masked_loads(c, LLVMBuildLoad2(B, m->t_i64, slot[0], ""), LLVMBuildLoad2(B, m->t_i64, slot[1], ""),
                   cg_add(f, LLVMBuildLoad2(B, m->t_i64, slot[2], ""), chan));
  cg_loop_end(f, &ls, false);
  row_store(c, k, k0);
}

/* Sets up the segment table of a convolution packed by masked vector
 * loads (c->xarg >= 0), when it is small enough for the stack. */
static void seg_table_alloc(CgFn *f, Conv *c) {
  c->segtab = NULL;
  if (c->xarg < 0 || c->OW <= 0) return;
  c->maxseg = (c->G.nr + c->OW - 1) / c->OW + 1;
  int64_t n = c->KH * c->KW * c->maxseg * 3;
  if (n <= SEG_TABLE_MAX) c->segtab = cg_alloca(f, f->m->t_i64, n, "segtab");
}

/* The im2col panel for k in [k0, k1): row k - k0 holds, for each pixel of
 * the unit, x[n, g*Cg + c, oh*sh - pt + kh*dh, ow*sw - pl + kw*dw] (0 in
 * the padding), then zeros up to NR past the last pixel. */
static void pack_panel(Conv *c, LLVMValueRef k0, LLVMValueRef k1) {
  CgFn *f = c->G.f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  int64_t nr = c->G.nr;
  CgLoop lo_, lk, lw;
  if (c->xarg >= 0 && c->segtab) {
    seg_table(c);
    LLVMValueRef k = cg_loop_begin(f, &lk, k0, k1, "pk");
    LLVMValueRef t = LLVMBuildURem(B, k, cg_i64(m, c->KH * c->KW), "");
    pack_row_table(c, k, k0, LLVMBuildUDiv(B, k, cg_i64(m, c->KH * c->KW), ""), t);
    cg_loop_end(f, &lk, false);
    return;
  }
  if (c->xarg >= 0) {
    LLVMValueRef k = cg_loop_begin(f, &lk, k0, k1, "pk");
    LLVMValueRef kw = LLVMBuildURem(B, k, cg_i64(m, c->KW), "");
    LLVMValueRef kh = LLVMBuildURem(B, LLVMBuildUDiv(B, k, cg_i64(m, c->KW), ""), cg_i64(m, c->KH), "");
    pack_row_vector(c, k, k0, LLVMBuildUDiv(B, k, cg_i64(m, c->KH * c->KW), ""), kh, kw);
    cg_loop_end(f, &lk, false);
    return;
  }
  LLVMValueRef owa, owb, jbase;
  LLVMValueRef oh = row_segment(c, &lo_, &owa, &owb, &jbase);
  LLVMValueRef k = cg_loop_begin(f, &lk, k0, k1, "pk");
  LLVMValueRef kw = LLVMBuildURem(B, k, cg_i64(m, c->KW), "");
  LLVMValueRef kh = LLVMBuildURem(B, LLVMBuildUDiv(B, k, cg_i64(m, c->KW), ""), cg_i64(m, c->KH), "");
  LLVMValueRef ci = LLVMBuildUDiv(B, k, cg_i64(m, c->KH * c->KW), "");
  LLVMValueRef row = LLVMBuildInBoundsGEP2(
      B, m->t_f32, c->panel, (LLVMValueRef[]){cg_add(f, cg_mulc(f, LLVMBuildNSWSub(B, k, k0, ""), nr), jbase)}, 1, "");
  LLVMValueRef ih, off, vlo, vhi;
  valid_cols(c, oh, kh, kw, owa, owb, &ih, &off, &vlo, &vhi);
  zero_range(f, row, owa, vlo);
  LLVMValueRef ow = cg_loop_begin(f, &lw, vlo, vhi, "im2col");
  LLVMValueRef xc[4] = {c->n, cg_add(f, cg_mulc(f, c->g, c->Cg), ci), ih,
                        LLVMBuildNSWSub(B, cg_mulc(f, ow, c->sw), off, "")};
  store_f32(f, row, ow, cg_emit(f, c->xv, xc));
  cg_loop_end(f, &lw, false);
  zero_range(f, row, vhi, owb);
  cg_loop_end(f, &lk, false);
  cg_loop_end(f, &lo_, false);

  /* columns past the last pixel (the image's last panel): zeros, so that
   * the micro-kernel reads defined values */
  CgIf tail;
  cg_if_begin(f, &tail, LLVMBuildICmp(B, LLVMIntSLT, c->plen, cg_i64(m, nr), ""), "tail");
  k = cg_loop_begin(f, &lk, k0, k1, "tk");
  row = LLVMBuildInBoundsGEP2(B, m->t_f32, c->panel, (LLVMValueRef[]){cg_mulc(f, LLVMBuildNSWSub(B, k, k0, ""), nr)}, 1, "");
  zero_range(f, row, c->plen, cg_i64(m, nr));
  cg_loop_end(f, &lk, false);
  cg_if_end(f, &tail);
}

/* conv's A: the packed weight, channel row i of the block at *ctx (the
 * float index of its k = 0 element) */
static LLVMValueRef conv_a_at(Gemm *G, const void *ctx, int i, LLVMValueRef k) {
  CgFn *f = G->f;
  LLVMValueRef base = *(const LLVMValueRef *)ctx;
  return load_f32(f, G->packed, cg_add(f, base, cg_add(f, cg_mulc(f, k, G->mr), cg_i64(f->m, i))));
}

/* Group-relative output channels [r, r + mr) over k in [k0, k1), added to
 * the partial sums (rows r - r0 of cbuf), or stored there when the k
 * range is all of K (one chunk: cbuf is then neither zeroed nor read). */
static void conv_block(Conv *c, int mr, LLVMValueRef r, LLVMValueRef k0, LLVMValueRef k1) {
  Gemm *G = &c->G;
  CgFn *f = G->f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  LLVMValueRef ob = LLVMBuildUDiv(B, r, cg_i64(m, G->mr), ""), ri = LLVMBuildURem(B, r, cg_i64(m, G->mr), "");
  LLVMValueRef blk = cg_add(f, cg_mulc(f, c->g, c->nob), ob);
  LLVMValueRef wbase = cg_add(f, cg_mulc(f, blk, c->K * G->mr), ri);
  LLVMValueRef zero = LLVMConstNull(G->vt);
  for (int a = 0; a < mr * G->nv; a++) LLVMBuildStore(B, zero, G->acc[a]);
  micro_kernel(G, mr, 1, 0, k0, k1, c->panel, cg_i64(m, 0), conv_a_at, &wbase);
  acc_to_partial(G, mr, c->cbuf, LLVMBuildNSWSub(B, r, c->r0, ""), c->kc < c->K);
}

/* conv_block over the chunk [k0, k1) (by_row_blocks' callback) */
typedef struct {
  Conv *c;
  LLVMValueRef k0, k1;
} ConvChunk;
static void conv_chunk_block(void *ctx, int mr, LLVMValueRef r) {
  ConvChunk *cc = ctx;
  conv_block(cc->c, mr, r, cc->k0, cc->k1);
}

/* Whether a pixel of conv_rows may be addressed (n, col, 0, p) in the
 * epilogue (conv_rows_epilogue): every member of the group but the
 * anchor is elementwise or broadcasting, and each of their operands and
 * results, aligned right to rank 4, spans the output's (OH, OW) or is 1 in
 * both (so its linear offset at (.., 0, p) is the one at (.., oh, ow)). */
static bool flat_pixels_ok(CgFn *f, const Conv *c) {
  const Graph *g = f->g;
  if (g->nranges) return false;
  for (int i = 0; i < g->nnode; i++) {
    if (!f->member[i] || i == f->anchor) continue;
    const Node *n = &g->node[i];
    FusionClass fc = ir_op_info(n->op)->fclass;
    if (fc != FC_ELEMWISE && fc != FC_BROADCAST) return false;
    for (int e = 0; e < n->nin + n->nout; e++) {
      int v = e < n->nin ? n->in[e] : n->out[e - n->nin];
      if (v < 0) continue;
      const TensorType *t = &g->val[v].type;
      if (t->rank > 4) return false;
      int64_t h = t->rank >= 2 ? t->dim[t->rank - 2] : 1, w = t->rank >= 1 ? t->dim[t->rank - 1] : 1;
      if (!(h == c->OH && w == c->OW) && !(h == 1 && w == 1)) return false;
    }
  }
  return true;
}

/* Input channels from which a 1x1 convolution is computed by pixel rows
 * (conv_rows); below, the channel-row scheme, whose vector epilogue costs
 * less against so short a k loop.  Measured on a 2-core AVX-512 host
 * (2026-12-04), 1x1 + bias + residual + relu, ms, pixel rows against
 * channel rows (one row of H*W pixels, below): 128 -> 512 at 28x28 0.66
 * against 0.58; 256 -> 64 at 56x56 0.55 against 0.58, 256 -> 1024 at
 * 14x14 0.57 against 0.72, 512 -> 2048 at 7x7 0.51 against 1.10. */
#define CONV_ROWS_MIN_K 256

/* conv_pixels' unit: row blocks of MR pixels, panels of NR channels, and
 * its chunk of k (the panel's slice, KC x NR f32, 32 KiB with AVX-512) */
#define PIX_PANELS 8
#define PIX_KC 128
/* row blocks of a unit on a larger image (a small one, up to 8 blocks, is
 * one unit's rows) */
#define PIX_BLOCKS 2

/* Whether conv_pixels computes a convolution (groups 1, not conv_rows'):
 * on small images with many output channels.  Measured on a 2-core
 * AVX-512 host (2026-12-04), 3x3 pad 1, ms: 7x7 512->512 1.41 against the
 * channel-row scheme's 1.76, 14x14 256->256 1.29 against 1.38, stride 2
 * to 7x7 and 14x14 1.53 / 1.38 against 1.95 / 1.56; but 56x56 64->64
 * 1.73 against 1.26: with few channels the im2col block, built per k for
 * every row block, costs too much against its few multiply-adds. */
#define PIX_MAX_PIXELS 256
#define PIX_MIN_CHANNELS 256
static bool conv_pixels_wanted(const Conv *c) { return c->P <= PIX_MAX_PIXELS && c->Og >= PIX_MIN_CHANNELS; }

/* The GEMM of a convolution by pixel rows (conv_rows, conv_pixels) over k
 * < K: the weight [O, K] packed as a transposed matmul weight, rows
 * addressed as pixels, the tile transposed for the epilogue.  Leaves
 * *out_done false (the channel-row scheme takes it) when the packed
 * weight would be too large. */
static smelt_status pixel_gemm(CgFn *f, const Conv *c, int wv, int64_t K, Gemm *G, bool *out_done) {
  CgMod *m = f->m;
  Graph *g = f->g;
  *G = (Gemm){.f = f, .av = c->xv, .at = g->val[c->xv].type, .yt = *cg_anchor_type(f), .K = K, .N = c->Og};
  gemm_regs(G, m);
  G->np = (G->N + G->nr - 1) / G->nr;
  if ((uint64_t)G->np * (uint64_t)G->K * (uint64_t)G->nr * 4 > UINT32_MAX) return NULL;
  LLVMValueRef gv = packed_weight(f, wv, true, G->K, G->N, G->nr);
  if (!gv) return st_error(ST_NO_MEMORY, "kernel %s: out of memory packing weight '%s'", f->k->name, g->val[wv].name);
  *out_done = true;
  G->crow = true;
  G->flat = flat_pixels_ok(f, c);
  G->P = c->P, G->OW = c->OW, G->sh = c->sh, G->sw = c->sw, G->bias = c->bv;
  G->packed = LLVMBuildBitCast(f->ab, gv, LLVMPointerType(m->t_f32, 0), "packed");
  G->tile_t = cg_alloca(f, m->t_f32, (int64_t)G->mr * G->nv * G->vl, "tile_t");
  for (int a = 0; a < G->mr * G->nv; a++) G->acc[a] = cg_alloca(f, G->vt, 1, "acc");
  return NULL;
}

/* A 1x1 convolution (groups 1, no padding, any stride) as the matmul GEMM
 * Y^T = X^T W^T: the rows are the output pixels (n, oh, ow), the columns
 * the output channels, k the input channels; A is x at the pixel's input
 * position (read through cg_emit, as matmul's A), B the weight [O, C]
 * packed in panels of NR channels as a transposed matmul weight.  Against
 * the channel-row scheme below it needs no im2col panel, wastes no lanes
 * on a small image (7x7 = 49 pixels are 6 full rows of 8 and one row, not
 * two panels of 32 pixels), and reads its weight panels from L2 as a
 * matmul does; its tile is transposed for the epilogue. */
static smelt_status conv_rows(CgFn *f, Conv *c, int wv, bool *out_done) {
  Gemm G;
  RETURN_IF_ERROR(pixel_gemm(f, c, wv, c->C, &G, out_done));
  if (!*out_done) return NULL;
  G.ak = 1;
  int64_t rows = c->N * c->P;
  int64_t ncb = rows < CG_MM_SPLIT_ROWS && G.N > CG_MM_COLS ? (G.N + CG_MM_COLS - 1) / CG_MM_COLS : 1;
  emit_space(&G, rows, ncb);
  return NULL;
}

/* conv_pixels' A: element (row i, k) of the im2col block at ctx, a float*
 * to [KC][mr] built for k from k0 */
typedef struct {
  LLVMValueRef block, k0;
} PixA;
static LLVMValueRef pixels_a_at(Gemm *G, const void *ctx, int i, LLVMValueRef k) {
  const PixA *a = ctx;
  CgFn *f = G->f;
  LLVMValueRef e = cg_add(f, cg_mulc(f, LLVMBuildNSWSub(f->b, k, a->k0, ""), G->mr), cg_i64(f->m, i));
  return load_f32(f, a->block, e);
}

/* Accumulators <-> the partial tile of row block b, panel jj of a unit
 * (cbuf, [row blocks * mr][PIX_PANELS * nr] f32). */
static void pixels_acc(Gemm *G, LLVMValueRef cbuf, LLVMValueRef b, LLVMValueRef jj, bool store) {
  CgFn *f = G->f;
  LLVMBuilderRef B = f->b;
  for (int i = 0; i < G->mr; i++)
    for (int v = 0; v < G->nv; v++) {
      LLVMValueRef row = cg_add(f, cg_mulc(f, b, G->mr), cg_i64(f->m, i));
      LLVMValueRef e = cg_add(f, cg_mulc(f, row, (int64_t)PIX_PANELS * G->nr), cg_add(f, cg_mulc(f, jj, G->nr), cg_i64(f->m, (int64_t)v * G->vl)));
      LLVMValueRef ptr = vec_ptr(G, cbuf, e);
      if (store) {
        LLVMValueRef st = LLVMBuildStore(B, LLVMBuildLoad2(B, G->vt, G->acc[i * G->nv + v], ""), ptr);
        LLVMSetAlignment(st, 4);
      } else {
        LLVMValueRef ld = LLVMBuildLoad2(B, G->vt, ptr, "");
        LLVMSetAlignment(ld, 4);
        LLVMBuildStore(B, ld, G->acc[i * G->nv + v]);
      }
    }
}

/* A convolution with a spatial kernel or padding (groups 1) by output
 * pixels, as conv_rows, with the im2col operand built: the rows are the
 * pixels of an image in blocks of MR, the columns the output channels, the
 * weight packed as a transposed matmul weight [O, C*KH*KW].  A unit is
 * (image, up to 8 row blocks, PIX_PANELS panels of channels); per chunk
 * of PIX_KC k's it builds each row block's im2col block [KC][MR] (the
 * channel-row scheme's panel builder, MR lanes wide: masked vector loads
 * along output rows for stride 1, and 2 where masked_stride_ok), then meets every panel of the unit
 * with every row block, the panel's KC x NR slice (16 KiB) staying in L1
 * across the row blocks, the partial tile kept in cbuf.  Last, each tile
 * is transposed and goes to the epilogue (conv_rows_epilogue) with its
 * valid pixels.  Against the channel-row scheme: a small image (14x14,
 * 7x7) wastes no lanes, and the weight, the larger operand there, is read
 * from L1 and L2 as vectors rather than broadcast from L3. */
static smelt_status conv_pixels(CgFn *f, Conv *c, int wv, bool *out_done) {
  CgMod *m = f->m;
  Graph *g = f->g;
  LLVMBuilderRef B = f->b;
  Gemm *G = &c->G;
  RETURN_IF_ERROR(pixel_gemm(f, c, wv, c->K, G, out_done));
  if (!*out_done) return NULL;
  int mr = G->mr;
  int64_t kc = PIX_KC < c->K ? PIX_KC : c->K, nkc = (c->K + kc - 1) / kc;
  /* a small image is one unit's pixels (7x7: 7 blocks), its channels split
   * among the units; a larger one goes by two blocks */
  int64_t nbk = c->P <= 8 * (int64_t)mr ? (c->P + mr - 1) / mr : PIX_BLOCKS;
  LLVMValueRef apack = cg_alloca(f, m->t_f32, nbk * kc * mr, "im2col");
  LLVMValueRef cbuf = cg_alloca(f, m->t_f32, nbk * mr * PIX_PANELS * G->nr, "partial");

  /* the im2col builder: the channel-row scheme's, MR lanes wide */
  Conv a = *c;
  a.G = (Gemm){.f = f, .vl = mr, .nr = mr, .nv = 1, .mr = mr};
  a.G.vt = LLVMVectorType(m->t_f32, (unsigned)mr);
  a.prow[0] = cg_alloca(f, a.G.vt, 1, "arow");
  a.xarg = g->val[c->xv].type.dt == DT_F32 && masked_stride_ok(c, mr) ? f->arg_of[c->xv] : -1;
  a.g = cg_i64(m, 0);
  seg_table_alloc(f, &a);

  int64_t mc = nbk * mr;
  int64_t nmb = (c->P + mc - 1) / mc, ncb = (G->np + PIX_PANELS - 1) / PIX_PANELS;
  int64_t udims[3] = {c->N, nmb, ncb};
  cg_store_loops(f, f->side, f->nside);
  LLVMValueRef ub, ue;
  cg_task_span(f, f->k->ntasks, c->N * nmb * ncb, &ub, &ue);
  CgLoop lu, lz, lk, lb, lj, lb2, lb3, lj3;
  LLVMValueRef unit = cg_loop_begin(f, &lu, ub, ue, "unit");
  LLVMValueRef uc[3];
  cg_delinearize(f, unit, udims, 3, uc);
  LLVMValueRef n = uc[0];
  a.n = n;
  LLVMValueRef plo = cg_mulc(f, uc[1], mc);
  LLVMValueRef npix = cg_min(f, cg_i64(m, mc), LLVMBuildNSWSub(B, cg_i64(m, c->P), plo, ""));
  LLVMValueRef nblk = LLVMBuildUDiv(B, cg_add(f, npix, cg_i64(m, mr - 1)), cg_i64(m, mr), "");
  LLVMValueRef jlo = cg_mulc(f, uc[2], PIX_PANELS);
  LLVMValueRef jhi = cg_min(f, cg_add(f, jlo, cg_i64(m, PIX_PANELS)), cg_i64(m, G->np));
  LLVMValueRef z = cg_loop_begin(f, &lz, cg_i64(m, 0), cg_i64(m, mc * PIX_PANELS * G->nr), "zero");
  store_f32(f, cbuf, z, cg_fconst(m->t_f32, 0));
  cg_loop_end(f, &lz, false);

  LLVMValueRef kci = cg_loop_begin(f, &lk, cg_i64(m, 0), cg_i64(m, nkc), "kchunk");
  LLVMValueRef k0 = cg_mulc(f, kci, kc);
  LLVMValueRef k1 = cg_min(f, cg_add(f, k0, cg_i64(m, kc)), cg_i64(m, c->K));
  /* each row block's im2col block for [k0, k1) */
  LLVMValueRef b = cg_loop_begin(f, &lb, cg_i64(m, 0), nblk, "build");
  a.p0 = cg_add(f, plo, cg_mulc(f, b, mr));
  a.plen = cg_min(f, cg_i64(m, mr), LLVMBuildNSWSub(B, cg_i64(m, c->P), a.p0, ""));
  a.oh0 = LLVMBuildUDiv(B, a.p0, cg_i64(m, c->OW), "");
  a.oh1 = cg_add(f, LLVMBuildUDiv(B, cg_add(f, a.p0, cg_add(f, a.plen, cg_i64(m, -1))), cg_i64(m, c->OW), ""), cg_i64(m, 1));
  a.panel = LLVMBuildInBoundsGEP2(B, m->t_f32, apack, (LLVMValueRef[]){cg_mulc(f, b, kc * mr)}, 1, "");
  pack_panel(&a, k0, k1);
  cg_loop_end(f, &lb, false);
  /* every panel of the unit against every row block */
  LLVMValueRef j = cg_loop_begin(f, &lj, jlo, jhi, "panel");
  LLVMValueRef jj = LLVMBuildNSWSub(B, j, jlo, "");
  /* The weight slice after this one (panel j + 1's, K * NR floats further
   * on, else the next chunk's first panel's; 16 KiB each), is prefetched into L2
   * by this slice's row blocks, an equal share each: on a large weight
   * (layer 4 of ResNet-50: 9.4 MB, read once a run) every slice would
   * otherwise come from memory when its first block needs it. */
  bool prefetch = prefetch_wanted(G);
  LLVMValueRef share = NULL, slice_next = NULL;
  if (prefetch) {
    LLVMValueRef last = LLVMBuildICmp(B, LLVMIntSGE, cg_add(f, j, cg_i64(m, 1)), jhi, "");
    LLVMValueRef nj = LLVMBuildSelect(B, last, jlo, cg_add(f, j, cg_i64(m, 1)), "");
    LLVMValueRef nk0 = LLVMBuildSelect(B, last, cg_add(f, k0, cg_i64(m, kc)), k0, "");
    LLVMValueRef off = cg_mulc(f, cg_add(f, cg_mulc(f, nj, c->K * G->nr), cg_mulc(f, nk0, G->nr)), 4);
    slice_next = LLVMBuildGEP2(B, m->t_i8, LLVMBuildBitCast(B, G->packed, m->t_ptr, ""), &off, 1, "");
    share = prefetch_share(G, cg_i64(m, kc * G->nr * 4), nblk, kc);
  }
  b = cg_loop_begin(f, &lb2, cg_i64(m, 0), nblk, "rows");
  pixels_acc(G, cbuf, b, jj, false);
  PixA pa = {LLVMBuildInBoundsGEP2(B, m->t_f32, apack, (LLVMValueRef[]){cg_mulc(f, b, kc * mr)}, 1, ""), k0};
  if (prefetch) G->pf = LLVMBuildGEP2(B, m->t_i8, slice_next, (LLVMValueRef[]){cg_mul(f, b, share)}, 1, "");
  micro_kernel(G, mr, 1, 0, k0, k1, G->packed, cg_add(f, cg_mulc(f, j, c->K * G->nr), cg_mulc(f, k0, G->nr)), pixels_a_at,
               &pa);
  G->pf = NULL;
  pixels_acc(G, cbuf, b, jj, true);
  cg_loop_end(f, &lb2, false);
  cg_loop_end(f, &lj, false);
  cg_loop_end(f, &lk, false);

  /* the tiles, transposed, to the epilogue */
  b = cg_loop_begin(f, &lb3, cg_i64(m, 0), nblk, "out_rows");
  LLVMValueRef p0 = cg_add(f, plo, cg_mulc(f, b, mr));
  LLVMValueRef valid = cg_min(f, cg_i64(m, mr), LLVMBuildNSWSub(B, cg_i64(m, c->P), p0, ""));
  LLVMValueRef r0 = cg_add(f, cg_mulc(f, n, c->P), p0);
  j = cg_loop_begin(f, &lj3, jlo, jhi, "out_panel");
  pixels_acc(G, cbuf, b, LLVMBuildNSWSub(B, j, jlo, ""), false);
  conv_rows_epilogue(G, mr, 1, r0, j, valid);
  cg_loop_end(f, &lj3, false);
  cg_loop_end(f, &lb3, false);
  cg_loop_end(f, &lu, false);
  return NULL;
}

smelt_status cg_gemm_conv_try(CgFn *f, bool *out_done) {
  *out_done = false;
  Graph *g = f->g;
  CgMod *m = f->m;
  const Node *n = &g->node[f->anchor];
  if (n->op != OP_CONV2D) return NULL;
  Conv c = {.xv = n->in[0], .bv = n->nin > 2 ? n->in[2] : -1};
  int wv = n->in[1];
  const TensorType *xt = &g->val[c.xv].type, *wt = &g->val[wv].type, *yt = cg_anchor_type(f);
  DType dt = xt->dt;
  if ((dt != DT_F32 && dt != DT_F16 && dt != DT_BF16) || wt->dt != dt) return NULL;
  if (!ir_is_const(g, wv) || !g->val[wv].data || f->arg_of[wv] < 0) return NULL;
  if (ir_type_numel(yt) == 0 || ir_type_numel(wt) == 0) return NULL;
  const Attr *st = ir_attr(n, "strides"), *pd = ir_attr(n, "pads"), *dl = ir_attr(n, "dilations");
  c.groups = ir_attr_int(n, "groups");
  c.N = xt->dim[0], c.C = xt->dim[1], c.H = xt->dim[2], c.W = xt->dim[3];
  c.OH = yt->dim[2], c.OW = yt->dim[3], c.P = c.OH * c.OW;
  c.Cg = wt->dim[1], c.KH = wt->dim[2], c.KW = wt->dim[3], c.K = c.Cg * c.KH * c.KW;
  c.Og = wt->dim[0] / c.groups;
  c.sh = st->ints[0], c.sw = st->ints[1], c.pt = pd->ints[0], c.pl = pd->ints[1];
  c.dh = dl->ints[0], c.dw = dl->ints[1];

  bool pointwise = c.KH == 1 && c.KW == 1 && pd->ints[0] == 0 && pd->ints[1] == 0 && pd->ints[2] == 0 && pd->ints[3] == 0;
  if (pointwise && c.groups == 1 && c.C >= CONV_ROWS_MIN_K) return conv_rows(f, &c, wv, out_done);
  if (c.groups == 1 && conv_pixels_wanted(&c)) return conv_pixels(f, &c, wv, out_done);
  /* A 1x1 convolution at stride 1 without padding maps pixel p of x to
   * pixel p of y: the image can be one row of H*W pixels, so a unit's
   * panel is one segment (one run of masked loads per k, one epilogue run
   * per channel) instead of one per output row it touches, when the
   * epilogue may address pixels linearly (flat_pixels_ok). */
  if (pointwise && c.sh == 1 && c.sw == 1 && c.OH > 1 && flat_pixels_ok(f, &c)) {
    c.H = c.OH = 1;
    c.W = c.OW = c.P;
  }

  Gemm *G = &c.G;
  *G = (Gemm){.f = f, .K = c.K};
  gemm_regs(G, m);
  c.nob = (c.Og + G->mr - 1) / G->mr;
  if ((uint64_t)c.groups * (uint64_t)c.nob * (uint64_t)c.K * (uint64_t)G->mr * 4 > UINT32_MAX) return NULL;
  c.kc = CONV_PANEL_BYTES / (G->nr * 4);
  if (c.kc > c.K) c.kc = c.K;
  c.ocb = (CONV_OC_ROWS + G->mr - 1) / G->mr;
  if (c.ocb > c.nob) c.ocb = c.nob;
  LLVMValueRef gv = packed_conv_weight(f, wv, &c);
  if (!gv) return st_error(ST_NO_MEMORY, "kernel %s: out of memory packing weight '%s'", f->k->name, g->val[wv].name);
  *out_done = true;

  LLVMBuilderRef B = f->b;
  G->packed = LLVMBuildBitCast(f->ab, gv, LLVMPointerType(m->t_f32, 0), "wpacked");
  c.panel = cg_alloca(f, m->t_f32, c.kc * G->nr, "panel");
  c.cbuf = cg_alloca(f, m->t_f32, c.ocb * G->mr * G->nr, "partial");
  for (int a = 0; a < G->mr * G->nv; a++) G->acc[a] = cg_alloca(f, G->vt, 1, "acc");
  /* masked vector loads need x in memory as f32 and stride 1 (stride 2
   * only for conv_pixels' narrow blocks: masked_stride_ok) */
  c.xarg = dt == DT_F32 && masked_stride_ok(&c, G->nr) ? f->arg_of[c.xv] : -1;
  for (int v = 0; v < G->nv; v++) c.prow[v] = cg_alloca(f, G->vt, 1, "prow");
  seg_table_alloc(f, &c);

  /* units (n, group, pixel panel, channel chunk), the chunk innermost so
   * that one thread's consecutive units read the same input pixels */
  int64_t npb = (c.P + G->nr - 1) / G->nr, nocc = (c.nob + c.ocb - 1) / c.ocb, nkc = (c.K + c.kc - 1) / c.kc;
  int64_t udims[4] = {c.N, c.groups, npb, nocc};
  cg_store_loops(f, f->side, f->nside);
  LLVMValueRef ub, ue;
  cg_task_span(f, f->k->ntasks, c.N * c.groups * npb * nocc, &ub, &ue);
  CgLoop lu, lkc, li, lseg, lw;
  LLVMValueRef unit = cg_loop_begin(f, &lu, ub, ue, "unit");
  LLVMValueRef uc[4];
  cg_delinearize(f, unit, udims, 4, uc);
  c.n = uc[0], c.g = uc[1];
  c.p0 = cg_mulc(f, uc[2], G->nr);
  c.plen = cg_min(f, cg_i64(m, G->nr), LLVMBuildNSWSub(B, cg_i64(m, c.P), c.p0, ""));
  c.oh0 = LLVMBuildUDiv(B, c.p0, cg_i64(m, c.OW), "");
  c.oh1 = cg_add(f, LLVMBuildUDiv(B, cg_add(f, c.p0, cg_add(f, c.plen, cg_i64(m, -1))), cg_i64(m, c.OW), ""), cg_i64(m, 1));
  c.r0 = cg_mulc(f, uc[3], c.ocb * G->mr);
  LLVMValueRef r1 = cg_min(f, cg_add(f, c.r0, cg_i64(m, c.ocb * G->mr)), cg_i64(m, c.Og));
  LLVMValueRef nrows = LLVMBuildNSWSub(B, r1, c.r0, "");
  if (c.kc < c.K) zero_range(f, c.cbuf, cg_i64(m, 0), cg_mulc(f, nrows, G->nr)); /* else conv_block stores */

  LLVMValueRef kci = cg_loop_begin(f, &lkc, cg_i64(m, 0), cg_i64(m, nkc), "kchunk");
  LLVMValueRef k0 = cg_mulc(f, kci, c.kc);
  LLVMValueRef k1 = cg_min(f, cg_add(f, k0, cg_i64(m, c.kc)), cg_i64(m, c.K));
  pack_panel(&c, k0, k1);
  /* the channels by blocks of MR, the group's last ones by their binary digits */
  by_row_blocks(G, c.r0, r1, "oc_block", conv_chunk_block, &(ConvChunk){&c, k0, k1});
  cg_loop_end(f, &lkc, false);

  /* the epilogue: rows of cbuf are output channels, columns the unit's
   * pixels, stored row segment by row segment (contiguous in NCHW) */
  LLVMValueRef i = cg_loop_begin(f, &li, cg_i64(m, 0), nrows, "oc");
  LLVMValueRef oc = cg_add(f, cg_mulc(f, c.g, c.Og), cg_add(f, c.r0, i));
  LLVMValueRef bias = c.bv >= 0 ? cg_emit(f, c.bv, &oc) : NULL;
  LLVMValueRef rowbuf = LLVMBuildInBoundsGEP2(B, m->t_f32, c.cbuf, (LLVMValueRef[]){cg_mulc(f, i, G->nr)}, 1, "");
  LLVMValueRef owa, owb, jbase;
  LLVMValueRef oh = row_segment(&c, &lseg, &owa, &owb, &jbase);
  /* pixel ow reads and writes only what belongs to it (as the matmul's
   * tile_col loop) */
  LLVMValueRef ow = cg_loop_begin_parallel(f, &lw, owa, owb, "ow");
  LLVMValueRef y = load_f32(f, rowbuf, cg_add(f, jbase, ow));
  cg_tag_access(f, y);
  if (bias) y = LLVMBuildFAdd(B, y, bias, "");
  LLVMValueRef yc[4] = {c.n, oc, oh, ow};
  cg_store_epilogue(f, yc, y);
  cg_loop_end(f, &lw, false);
  cg_loop_end(f, &lseg, false);
  cg_loop_end(f, &li, false);
  cg_loop_end(f, &lu, false);
  return NULL;
}

/* ---- matmul over weight panels built in the kernel ----
 *
 * A quantised weight (qmatmul.c) is not packed at load time: that would
 * keep a float copy of it, 4-8x its bytes, for the bundle's life.  Instead
 * each task unit (a chunk of up to PANEL_ROWS output rows and one panel of
 * NR columns, the rows outer so that two threads split one chunk's panels)
 * builds its panel KC k's at a time on the stack through the source's fill
 * (the dequantisation: codes times scales, in f32), and every MR-row block
 * of the chunk meets it through the micro-kernel, adding into a stack tile
 * of partial sums, as the convolution above meets its im2col panels.  The
 * dequantisation of an element is then paid once per chunk of rows, not
 * once per row as in the GEMV (qmatmul.c's row-at-a-time kernel, which
 * decode keeps). */
#define PANEL_ROWS 192               /* rows of a unit: a 24 KiB tile of partial sums at NR = 32 */
#define PANEL_BYTES (32 * 1024)      /* the KC x NR f32 panel: inside a 32 KiB L1 */

typedef struct {
  Gemm G;
  CgPanelSource *src; /* NULL: the panels are G.packed's, packed at load time */
  int64_t kc, urows;  /* k's a chunk, rows a unit */
  LLVMValueRef panel, cbuf, r0;
  LLVMValueRef k0, k1; /* the chunk */
  LLVMValueRef boff;   /* its first float in panel */
} Panels;

/* Rows [r, r + mr) of the unit over the chunk's k's, added into cbuf (or
 * stored, when one chunk is all of K); by_row_blocks' callback. */
static void panels_block(void *ctx, int mr, LLVMValueRef r) {
  Panels *P = ctx;
  Gemm *G = &P->G;
  CgFn *f = G->f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  LLVMValueRef ac[GEMM_MAX_MR][IR_MAX_RANK], oc[IR_MAX_RANK];
  for (int i = 0; i < mr; i++) row_coords(G, cg_add(f, r, cg_i64(m, i)), ac[i], oc);
  LLVMValueRef zero = LLVMConstNull(G->vt);
  for (int a = 0; a < mr * G->nv; a++) LLVMBuildStore(B, zero, G->acc[a]);
  micro_kernel(G, mr, 1, 0, P->k0, P->k1, P->panel, P->boff, mm_a_at, ac);
  acc_to_partial(G, mr, P->cbuf, LLVMBuildNSWSub(B, r, P->r0, ""), P->kc < G->K);
}

/* The units (see above) of G over `rows` rows, P's chunk and unit sizes
 * chosen. */
static void panels_units(Panels *P, int64_t rows) {
  Gemm *G = &P->G;
  CgFn *f = G->f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  if (P->src) P->panel = cg_alloca(f, m->t_f32, P->kc * G->nr, "panel");
  P->cbuf = cg_alloca(f, m->t_f32, P->urows * G->nr, "partial");
  for (int a = 0; a < G->mr * G->nv; a++)
    if (!G->acc[a]) G->acc[a] = cg_alloca(f, G->vt, 1, "acc");

  int64_t nrc = (rows + P->urows - 1) / P->urows, nkc = (G->K + P->kc - 1) / P->kc;
  cg_store_loops(f, f->side, f->nside);
  LLVMValueRef ub, ue;
  cg_task_span(f, f->k->ntasks, nrc * G->np, &ub, &ue);
  CgLoop lu, lkc, li, lj;
  LLVMValueRef unit = cg_loop_begin(f, &lu, ub, ue, "unit");
  LLVMValueRef p = LLVMBuildURem(B, unit, cg_i64(m, G->np), "panel_i");
  P->r0 = cg_mulc(f, LLVMBuildUDiv(B, unit, cg_i64(m, G->np), ""), P->urows);
  LLVMValueRef r1 = cg_min(f, cg_add(f, P->r0, cg_i64(m, P->urows)), cg_i64(m, rows));
  LLVMValueRef nrows = LLVMBuildNSWSub(B, r1, P->r0, "");
  LLVMValueRef c0 = cg_mulc(f, p, G->nr);
  if (P->kc < G->K) zero_range(f, P->cbuf, cg_i64(m, 0), cg_mulc(f, nrows, G->nr)); /* else panels_block stores */

  LLVMValueRef kci = cg_loop_begin(f, &lkc, cg_i64(m, 0), cg_i64(m, nkc), "kchunk");
  P->k0 = cg_mulc(f, kci, P->kc);
  P->k1 = cg_min(f, cg_add(f, P->k0, cg_i64(m, P->kc)), cg_i64(m, G->K));
  if (P->src) {
    P->src->fill(P->src, f, P->panel, c0, P->k0, P->k1, G->nr);
    P->boff = cg_i64(m, 0);
  } else {
    P->panel = G->packed;
    P->boff = cg_mulc(f, cg_add(f, cg_mulc(f, p, G->K), P->k0), G->nr);
  }
  by_row_blocks(G, P->r0, r1, "row_block", panels_block, P);
  cg_loop_end(f, &lkc, false);

  /* the epilogue, row by row over the panel's valid columns */
  LLVMValueRef ncols = cg_min(f, cg_i64(m, G->nr), LLVMBuildNSWSub(B, cg_i64(m, G->N), c0, ""));
  LLVMValueRef i = cg_loop_begin(f, &li, cg_i64(m, 0), nrows, "tile_row");
  LLVMValueRef a_coords[IR_MAX_RANK], oc[IR_MAX_RANK];
  row_coords(G, cg_add(f, P->r0, i), a_coords, oc);
  LLVMValueRef j = cg_loop_begin_parallel(f, &lj, cg_i64(m, 0), ncols, "tile_col");
  oc[G->yt.rank - 1] = cg_add(f, c0, j);
  LLVMValueRef y = load_f32(f, P->cbuf, cg_add(f, cg_mulc(f, i, G->nr), j));
  cg_tag_access(f, y);
  cg_store_epilogue(f, oc, y);
  cg_loop_end(f, &lj, false);
  cg_loop_end(f, &li, false);
  cg_loop_end(f, &lu, false);
}

smelt_status cg_gemm_panels(CgFn *f, CgPanelSource *src) {
  Panels P = {.src = src, .urows = PANEL_ROWS};
  Gemm *G = &P.G;
  gemm_matmul_init(G, f, src->K, src->N);
  int64_t rows = ir_type_numel(&G->yt) / src->N;
  if (G->vl == 16 && rows >= GEMM_MR12_ROWS) G->mr = 12;
  G->np = (src->N + G->nr - 1) / G->nr;
  P.kc = PANEL_BYTES / (G->nr * 4);
  if (P.kc > G->K) P.kc = G->K;
  panels_units(&P, rows);
  return NULL;
}

/* A long K (GEMM_KBLOCK_K and more) with many rows: the packed weight's
 * panels in chunks of KC k's (PANEL_BYTES, in L1) met by units of about
 * GEMM_KBLOCK_ROWS rows (an even split, whole MR blocks), the partial sums
 * in a stack tile, as BLIS blocks K; emit_space's whole-K panels would not
 * stay in L1 while a row block streams them (ViT-B/16's fc2, 197 x 3072 x
 * 768, alone: 3.7 -> 3.2 ms on the Intel VM, ORT 2.8-2.9; in the model
 * its 12 kernels 48.9 -> 47.1 ms, the mean of three interleaved runs, within
 * that machine's noise). */
static void gemm_long_k(Gemm *G, int64_t rows) {
  int64_t nch = (rows + GEMM_KBLOCK_ROWS - 1) / GEMM_KBLOCK_ROWS, urows = (rows + nch - 1) / nch;
  Panels P = {.G = *G, .urows = (urows + G->mr - 1) / G->mr * G->mr, .kc = PANEL_BYTES / (G->nr * 4)};
  panels_units(&P, rows);
}
