/* Tensor-core helpers shared by the mma.sync kernels: the GEMM families
 * mma (f16/bf16) and tf32, and the flash attention kernels.
 *
 * Fragments: ldmatrix .x4 [.trans] fills four registers per lane from
 * eight row addresses per matrix; mma.sync m16n8k16 adds A (16x16, row) B
 * (16x8, col) into four f32 accumulators; a 16-byte cp.async copies global
 * to shared memory (zero-filled past the matrix), or plain loads when the
 * pointers are not known to be aligned.  The PTX is under #ifdef
 * __CUDA_ARCH__; the host-side stand-ins (cu_tc_emu_helpers) follow the
 * PTX ISA's fragment layouts for the CPU emulation the tests run.
 *
 * The block-tiled GEMM skeleton (mma.c, tf32.c): a BM x BN tile per block
 * walked in raster groups of 8 tile rows, warps owning WM x WN sub-tiles,
 * K tiles streamed through `stages` shared buffers with one cp.async
 * group per tile in flight, and the epilogue that runs the group's
 * elementwise consumers on each accumulator pair.  Shared memory is
 * bounded by the arch's opt-in limit (ir_cuda_arch_limits), 99 KiB when
 * no arch is named (the least of any sm_80+ GPU).
 */
#include <stdio.h>
#include <string.h>

#include "codegen/cuda/cu_tc.h"

/* Rows of tiles a raster group covers (grid.x order). */
#define TC_GROUP_M 8

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The host-side stand-ins for ldmatrix and mma.sync (emulation only).
 * Without warps to exchange registers, each thread computes what another
 * lane would hold: a_of(l, regs) / b_of(l, regs) give lane l's fragment
 * (through ldsm, which evaluates the row address lane s would give), and
 * mma assembles its rows and columns from the lanes that hold them. */
static const char emu_helpers[] =
    "#ifndef __CUDA_ARCH__\n"
    "  // Host emulation of ldmatrix / mma.sync after the fragment layouts of the\n"
    "  // PTX ISA (g = lane / 4, t = lane % 4).\n"
    "  auto emu_cvt = [](unsigned short h, bool bf16) -> float {\n"
    "    if (bf16) { unsigned u = (unsigned)h << 16; float v; memcpy(&v, &u, 4); return v; }\n"
    "    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;\n"
    "    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);\n"
    "    return s ? -v : v;\n"
    "  };\n"
    "  // x4: lanes 8q..8q+7 give the rows of matrix q; lane l gets row g, columns 2t, 2t+1\n"
    "  // (.trans: rows 2t, 2t+1 of column g).\n"
    "  auto emu_ldsm_x4 = [](unsigned r[4], auto ptr_of, bool trans, int l) {\n"
    "    const int g = l / 4, t = l % 4;\n"
    "    for (int q = 0; q < 4; q++) {\n"
    "      if (!trans) {\n"
    "        const unsigned short *row = ptr_of(8 * q + g);\n"
    "        r[q] = row[2 * t] | (unsigned)row[2 * t + 1] << 16;\n"
    "      } else {\n"
    "        const unsigned short *r0 = ptr_of(8 * q + 2 * t), *r1 = ptr_of(8 * q + 2 * t + 1);\n"
    "        r[q] = r0[g] | (unsigned)r1[g] << 16;\n"
    "      }\n"
    "    }\n"
    "  };\n"
    "  // A (16x16, row): lane 4g+s holds a0 = A[g][2s..], a1 = A[g+8][2s..], a2 = A[g][2s+8..], a3 = A[g+8][2s+8..];\n"
    "  // B (16x8, col): lane 4n+s holds b0 = B[2s..][n], b1 = B[2s+8..][n];\n"
    "  // C: c0, c1 = C[g][2t], C[g][2t+1]; c2, c3 = C[g+8][2t], C[g+8][2t+1].\n"
    "  auto emu_mma = [&](float c[4], auto a_of, auto b_of, bool bf16) {\n"
    "    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;\n"
    "    float A[2][16], B[2][16];  // rows g, g+8 of A; columns 2t, 2t+1 of B\n"
    "    for (int s = 0; s < 4; s++) {\n"
    "      unsigned x[4], y[2][2];\n"
    "      a_of(4 * g + s, x);\n"
    "      for (int n = 0; n < 2; n++) b_of(4 * (2 * t + n) + s, y[n]);\n"
    "      for (int h = 0; h < 2; h++) {\n"
    "        A[h][2 * s] = emu_cvt(x[h] & 0xffffu, bf16), A[h][2 * s + 1] = emu_cvt(x[h] >> 16, bf16);\n"
    "        A[h][2 * s + 8] = emu_cvt(x[h + 2] & 0xffffu, bf16), A[h][2 * s + 9] = emu_cvt(x[h + 2] >> 16, bf16);\n"
    "        B[h][2 * s] = emu_cvt(y[h][0] & 0xffffu, bf16), B[h][2 * s + 1] = emu_cvt(y[h][0] >> 16, bf16);\n"
    "        B[h][2 * s + 8] = emu_cvt(y[h][1] & 0xffffu, bf16), B[h][2 * s + 9] = emu_cvt(y[h][1] >> 16, bf16);\n"
    "      }\n"
    "    }\n"
    "    for (int e = 0; e < 4; e++)\n"
    "      for (int k = 0; k < 16; k++) c[e] += A[e / 2][k] * B[e % 2][k];\n"
    "  };\n"
    "#endif\n";

void cu_tc_emu_helpers(CuFn *f) { cu_buf_append(f->out, emu_helpers, sizeof emu_helpers - 1); }

void cu_tc_mma_16816(CuFn *f, bool bf16, const char *c, const char *a, const char *b0, const char *b1) {
  cu_line(f,
          "asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.%s.f32 {%%0, %%1, %%2, %%3}, {%%4, %%5, %%6, %%7}, "
          "{%%8, %%9}, {%%0, %%1, %%2, %%3};\\n\" : \"+f\"(%s[0]), \"+f\"(%s[1]), \"+f\"(%s[2]), \"+f\"(%s[3]) : "
          "\"r\"(%s[0]), \"r\"(%s[1]), \"r\"(%s[2]), \"r\"(%s[3]), \"r\"(%s), \"r\"(%s));",
          bf16 ? "bf16.bf16" : "f16.f16", c, c, c, c, a, a, a, a, b0, b1);
}

/* Copies the 16-byte chunk at global `src` (when `ok`; zeros otherwise) to
 * shared `dst`: cp.async when the pointers allow, plain loads otherwise;
 * the chunk as `n` elements of which `zero` is the zero. */
static void cp_async(CuFn *f, const char *dst, const char *src, const char *ok, const char *aligned, int n,
                     const char *zero, int bytes) {
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "if (%s) {", aligned);
  cu_line(f, "  const unsigned d = (unsigned)__cvta_generic_to_shared(%s);", dst);
  /* .cg (L2 only) takes 16 bytes alone; smaller copies go through .ca */
  cu_line(f, "  asm volatile(\"cp.async.%s.shared.global.L2::128B [%%0], [%%1], %d, %%2;\\n\" :: \"r\"(d), \"l\"(%s), \"r\"(%s ? %d : 0));",
          bytes == 16 ? "cg" : "ca", bytes, src, ok, bytes);
  cu_line(f, "} else");
  cu_line(f, "#endif");
  cu_line(f, "{");
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int e = 0; e < %d; e++) %s[e] = %s ? %s[e] : %s;", n, dst, ok, src, zero);
  cu_line(f, "}");
}

void cu_tc_cp_async16(CuFn *f, const char *dst, const char *src, const char *ok, const char *aligned) {
  cp_async(f, dst, src, ok, aligned, 8, "(unsigned short)0", 16);
}

void cu_tc_cp_async8(CuFn *f, const char *dst, const char *src, const char *ok, const char *aligned) {
  cp_async(f, dst, src, ok, aligned, 4, "(unsigned short)0", 8);
}

void cu_tc_cp_async16_f32(CuFn *f, const char *dst, const char *src, const char *ok, const char *aligned) {
  cp_async(f, dst, src, ok, aligned, 4, "0.0f", 16);
}

void cu_tc_ldmatrix_x4(CuFn *f, const char *regs, const char *ptr, bool trans) {
  cu_open(f, "%s", "");
  cu_line(f, "const unsigned ldsm_addr = (unsigned)__cvta_generic_to_shared(%s);", ptr);
  cu_line(f,
          "asm volatile(\"ldmatrix.sync.aligned.m8n8.x4%s.shared.b16 {%%0, %%1, %%2, %%3}, [%%4];\\n\" : \"=r\"(%s[0]), "
          "\"=r\"(%s[1]), \"=r\"(%s[2]), \"=r\"(%s[3]) : \"r\"(ldsm_addr));",
          trans ? ".trans" : "", regs, regs, regs, regs);
  cu_close(f);
}

/* What one block may use on the target: the arch's opt-in maximum, or
 * 99 KiB (sm_86/89/120, the least of any sm_80+ GPU) without an arch. */
int64_t cu_tc_smem_limit(const CuFn *f) {
  if (!f->opt || !f->opt->arch) return 99 * 1024;
  IrCudaArchLimits lim;
  ir_cuda_arch_limits(f->opt->arch, &lim);
  return lim.smem_per_block;
}

int cu_tc_fit_stages(const CuFn *f, int stages, int64_t per_stage) {
  int64_t limit = cu_tc_smem_limit(f);
  while (stages * per_stage > limit && stages > 2) stages--;
  return stages;
}

bool cu_tc_smem_fits(CuFn *f, const CuLaunch *l, int stages, int64_t per_stage) {
  int64_t limit = cu_tc_smem_limit(f);
  if (stages * per_stage <= limit) return true;
  cu_fail(f, ST_UNSUPPORTED, "variant %s needs %lld bytes of shared memory, the arch allows %lld", l->variant,
          (long long)(stages * per_stage), (long long)limit);
  return false;
}

bool cu_tc_launch(CuFn *f, const CuGemm *gm, int BM, int BN, int threads, int slices, CuLaunch *l) {
  int64_t TM = ceil_div(gm->M, BM), TN = ceil_div(gm->N, BN);
  l->block[0] = (unsigned)threads;
  if (TM * TN > 0x7fffffffLL) {
    cu_fail(f, ST_UNSUPPORTED, "a %lld x %lld result exceeds the grid", (long long)gm->M, (long long)gm->N);
    return false;
  }
  l->grid[0] = (unsigned)(TM * TN);
  l->grid[1] = (unsigned)slices;
  l->grid[2] = (unsigned)(gm->Z < 1 ? 1 : gm->Z > 65535 ? 65535 : gm->Z);
  return true;
}

/* Dynamic shared memory on the GPU; a static array in the emulation. */
void cu_tc_smem_decl(CuFn *f, const char *elem, const char *name, int elems) {
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "extern __shared__ __align__(16) %s %s[];", elem, name);
  cu_line(f, "#else");
  cu_line(f, "__align__(16) __shared__ %s %s[%d];", elem, name, elems);
  cu_line(f, "#endif");
}

void cu_tc_block_tile(CuFn *f, const CuGemm *gm, int BM, int BN, int WM, int WN) {
  int warps_n = BN / WN;
  int64_t TM = ceil_div(gm->M, BM), TN = ceil_div(gm->N, BN);
  cu_line(f, "const int wm = warp / %d, wn = warp %% %d;  // this warp's %d x %d sub-tile", warps_n, warps_n, WM, WN);
  cu_line(f, "// tile (tm, tn) of block x: groups of %d tile rows, column by column, so that blocks running together share",
          TC_GROUP_M);
  cu_line(f, "// their A rows and B columns in L2");
  cu_line(f, "const int group = blockIdx.x / %lld, first = group * %d;", (long long)(TC_GROUP_M * TN), TC_GROUP_M);
  cu_line(f, "const int rows = %lld - first < %d ? %lld - first : %d;", (long long)TM, TC_GROUP_M, (long long)TM,
          TC_GROUP_M);
  cu_line(f, "const int tm = first + (blockIdx.x %% %lld) %% rows, tn = (blockIdx.x %% %lld) / rows;",
          (long long)(TC_GROUP_M * TN), (long long)(TC_GROUP_M * TN));
  cu_line(f, "const long long m0 = (long long)tm * %d, n0 = (long long)tn * %d;", BM, BN);
}

const char *cu_tc_batch_loop(CuFn *f, const CuGemm *gm, const char **aligned) {
  const Node *an = gm->an;
  *aligned = f->opt && f->opt->args_aligned ? "true" : "aligned16";
  if (!(f->opt && f->opt->args_aligned)) {
    /* the operands that are arguments (a conv2d's im2col operand is computed, not copied) */
    CuBuf b = {0};
    for (int i = 0; i < 2; i++) {
      int v = an->in[i];
      const Value *val = &f->g->val[v];
      if (f->arg_of[v] < 0 || (val->kind == VK_NODE && f->member[val->node])) continue;
      cu_buf_printf(&b, "%ssmelt_aligned(a%d, 16)", b.len ? " && " : "", f->arg_of[v]);
    }
    cu_line(f, "const bool aligned16 = %s;", b.len || b.oom ? cu_buf_str(f, &b) : "true");
    cu_buf_free(&b);
  }
  const char *z = cu_tmp(f);
  cu_open(f, "for (long long %s = blockIdx.z; %s < %lldLL; %s += gridDim.z)", z, z, (long long)gm->Z, z);
  if (cu_gemm_ranged(gm)) {
    /* Ranged dims: the grid is the max's, and a tile wholly past this
     * run's rows (or a batch past them) leaves at once.  The test is the
     * same in every thread of the block and in every split-K slice of the
     * tile (m0, n0 and z do not depend on blockIdx.y), and it comes before
     * the first barrier and the first touch of a split-K counter: a tile
     * that is skipped is skipped by all its slices, so its counter stays
     * 0.  Updating the grids of the CUDA graph's nodes per run would save
     * the launch of these blocks too, at the cost of host work per run
     * and per family grid layouts; an empty block costs well under a
     * microsecond. */
    const char *past = cu_gemm_batch_past(f, gm, z);
    cu_line(f, "// ranged dims: nothing of this run's rows in this tile");
    cu_line(f, "if (m0 >= %s || n0 >= %s%s%s) continue;", cu_gemm_run_m(f, gm), cu_gemm_run_n(f, gm), past ? " || " : "",
            past ? past : "");
  }
  return z;
}

void cu_tc_commit_group(CuFn *f) {
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "asm volatile(\"cp.async.commit_group;\\n\" ::);");
  cu_line(f, "#endif");
}

void cu_tc_wait_group(CuFn *f, int n) {
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "asm volatile(\"cp.async.wait_group %d;\\n\" ::);", n);
  cu_line(f, "#endif");
}

void cu_tc_pipeline(CuFn *f, const CuTcPipeline *pl) {
  int S = pl->stages;
  cu_line(f, "float acc[%d][%d][4];", pl->MI, pl->NI);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int i = 0; i < %d; i++)", pl->MI);
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int j = 0; j < %d; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;", pl->NI);
  cu_line(f, "// prologue: tiles 0 .. %d in flight", S - 2);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int s = 0; s < %d; s++)", S - 1);
  cu_open(f, "if (s < nt)");
  pl->load_stage(f, pl->ctx, "s", pl->kt0 ? cu_fmt(f, "%s + s", pl->kt0) : "s");
  if (pl->store_stage) pl->store_stage(f, pl->ctx, "s");
  cu_close(f);
  cu_tc_commit_group(f);
  cu_close(f);
  cu_open(f, "for (int kt = 0; kt < nt; kt++)");
  cu_line(f, "// tile kt has landed (at most %d newer groups pending); everyone is done with tile kt-1", S - 2);
  cu_tc_wait_group(f, S - 2);
  cu_line(f, "__syncthreads();");
  cu_open(f, "%s", "");
  cu_line(f, "const int next = kt + %d;  // into the buffer tile kt-1 used", S - 1);
  cu_open(f, "if (next < nt)");
  pl->load_stage(f, pl->ctx, cu_fmt(f, "(next %% %d)", S), pl->kt0 ? cu_fmt(f, "%s + next", pl->kt0) : "next");
  cu_close(f);
  cu_tc_commit_group(f);
  cu_open(f, "%s", "");
  cu_line(f, "const %s *as = As + (kt %% %d) * %d, *bs = Bs + (kt %% %d) * %d;", pl->elem, S, pl->a_stage, S,
          pl->b_stage);
  pl->k_tile(f, pl->ctx);
  cu_close(f);
  if (pl->store_stage) {
    cu_line(f, "// the registers loaded above, into the buffer tile kt-1 used (everyone left it at the barrier)");
    cu_open(f, "if (next < nt)");
    pl->store_stage(f, pl->ctx, cu_fmt(f, "(next %% %d)", S));
    cu_close(f);
  }
  cu_close(f);
  cu_close(f); /* kt */
  cu_tc_wait_group(f, 0);
  cu_line(f, "__syncthreads();  // the next batch reuses the buffers");
}

/* Row m / column n (of f->idx) of fragment element pair h (elements 2h,
 * 2h+1: columns n, n + 1) of tile (i, j), inside loops over i, j, h. */
void cu_tc_frag_coords(CuFn *f, int WM, int WN, const char *m, const char *n) {
  cu_line(f, "const %s %s = (%s)(m0 + wm * %d + i * 16 + (lane >> 2) + h * 8);", f->idx, m, f->idx, WM);
  cu_line(f, "const %s %s = (%s)(n0 + wn * %d + j * 8 + (lane & 3) * 2);", f->idx, n, f->idx, WN);
}

bool cu_tc_pairs(const CuGemm *gm) {
  if (gm->an->op == OP_CONV2D) return gm->OW % 2 == 0;
  return gm->N % 2 == 0;
}

/* Fragment element e of tile (i, j) is row g (+8 for e >= 2), column 2t
 * (+1 for odd e).  With N even, the two columns of a row a lane holds are
 * one 4-byte (f16) or 8-byte (f32) access for every tensor the epilogue
 * reads or writes: n is even and so is N, so with aligned arguments each
 * pair is aligned; without that guarantee, two element accesses (the pair
 * is still handed over whole, which a gated pair's halves need:
 * merge-matmuls). */
void cu_tc_epilogue(CuFn *f, const CuGemm *gm, int WM, int WN, int MI, int NI, const char *z, const int *epi, int nepi) {
  const Graph *g = f->g;
  const Node *an = gm->an;
  const Value *av = &g->val[an->out[0]];
  const char *zi = cu_fmt(f, "((%s)%s)", f->idx, z);
  bool pairs = cu_tc_pairs(gm);
  CuCoords co;
  CuVal val;
  cu_line(f, "// epilogue: the fused elementwise ops on each %s, stored",
          pairs ? "pair of f32 accumulators (columns n, n + 1)" : "f32 accumulator");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < %d; j++)", NI);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int %s = 0; %s < %d; %s++)", pairs ? "h" : "e", pairs ? "h" : "e", pairs ? 2 : 4, pairs ? "h" : "e");
  const char *m = cu_tmp(f), *n = cu_tmp(f);
  if (pairs) {
    cu_tc_frag_coords(f, WM, WN, m, n);
  } else {
    cu_line(f, "const %s %s = (%s)(m0 + wm * %d + i * 16 + (lane >> 2) + (e >> 1) * 8);", f->idx, m, f->idx, WM);
    cu_line(f, "const %s %s = (%s)(n0 + wn * %d + j * 8 + (lane & 3) * 2 + (e & 1));", f->idx, n, f->idx, WN);
  }
  /* ranged dims: the rows past this run's are left alone (tails masked) */
  if (cu_gemm_ranged(gm)) cu_open(f, "if (%s < %s && %s < %s)", m, cu_gemm_run_m(f, gm), n, cu_gemm_run_n(f, gm));
  else cu_open(f, "if (%s < %lld && %s < %lld)", m, (long long)gm->M, n, (long long)gm->N);
  gm->result(f, gm, zi, m, n, pairs ? "acc[i][j][2 * h]" : "acc[i][j][e]", &co, &val);
  if (pairs) {
    co.lanes = 2;
    co.step[co.rank - 1] = 1;
    co.aligned = f->opt && f->opt->args_aligned;
    co.whole_lanes = true;
    /* column n + 1's value through the same rule (a conv2d's bias) */
    CuCoords co1;
    CuVal val1;
    gm->result(f, gm, zi, m, cu_fmt(f, "(%s + 1)", n), "acc[i][j][2 * h + 1]", &co1, &val1);
    val.l[1] = val1.l[0];
  }
  for (int e = 0; e < (pairs ? 2 : 1); e++) {
    const char *r = cu_tmp(f);
    cu_line(f, "const %s %s = %s;  // %s (%s)%s", cu_ctype(av->type.dt), r, val.l[e], av->name, ir_op_name(an->op),
            e ? ", column n + 1" : "");
    val.l[e] = r;
  }
  cu_store_epilogue(f, epi, nepi, &co, &val);
  cu_close(f);
  cu_close(f);
  cu_close(f);
  cu_close(f);
}
