/* The tensor-core matmul: f16/bf16 operands, f32 accumulation, sm_80+.
 *
 * A block computes a BM x BN tile of C = A B (per batch z, grid.z) with
 * (BM/WM) x (BN/WN) warps, each owning a WM x WN sub-tile held in registers
 * as f32 accumulators of m16n8 fragments.  Along K, tiles of BM x BK of A
 * and BK x BN of B (or BN x BK when B is given as [N, K], transpose_b) go
 * global -> shared with 16-byte cp.async, `stages` buffers deep: while the
 * warps multiply tile kt, the loads of tiles kt+1 .. kt+stages-1 are in
 * flight, and one __syncthreads per tile orders reuse of a buffer.  Rows
 * are padded by 16 bytes so that the 8 row addresses of an ldmatrix fall
 * in distinct banks.  Operand fragments come from shared memory with
 * ldmatrix (.trans for B stored [K, N]: the MMA wants B "col"), and every
 * k16 step issues (WM/16) x (WN/8) mma.sync.m16n8k16.
 *
 * Ragged edges: a 16-byte chunk (8 elements along a contiguous dim whose
 * length is a multiple of 8) is either wholly inside the matrix or wholly
 * outside; outside chunks are zero-filled (cp.async with a source size of
 * 0), so padding rows and k beyond K add nothing, and stores are guarded.
 * The epilogue applies the group's elementwise consumers to each f32
 * accumulator through cu_store_epilogue, like the simple kernel.
 *
 * Without the alignment guarantee (CgCudaOptions.args_aligned), a uniform
 * branch tests the operand pointers once and copies with plain loads when
 * they are not 16-byte aligned.  The PTX is under #ifdef __CUDA_ARCH__; on
 * the host (the CPU emulation of tests/gpu/cuda_emu.hpp) the same
 * fragments are exchanged with warp shuffles by small functions that
 * follow the PTX ISA's fragment layouts, so the kernel's indexing is
 * tested without a GPU.
 */
#include <string.h>

#include "codegen/cuda/cu_internal.h"

static bool is_arg_value(const CuFn *f, int v) {
  const Value *val = &f->g->val[v];
  if (f->arg_of[v] < 0) return false;
  return !(val->kind == VK_NODE && f->member[val->node]);
}

bool cu_mma_eligible(const CuFn *f, const CuGemm *gm) {
  const Node *an = gm->an;
  if (an->op != OP_MATMUL) return false;
  DType dt = gm->yt->dt;
  if (dt != DT_F16 && dt != DT_BF16) return false;
  if (gm->at->dt != dt || gm->bt->dt != dt) return false;
  if (gm->ta || gm->a1 || gm->b1) return false;
  if (gm->K % 8 != 0 || gm->N % 8 != 0) return false;
  if (gm->M < 1 || gm->N < 1) return false;
  /* the operands are read straight from memory with cp.async */
  return is_arg_value(f, an->in[0]) && is_arg_value(f, an->in[1]);
}

void cu_mma_default_params(const CuGemm *gm, CuMmaParams *out) {
  /* 128 x 128 x 32, 8 warps of 64 x 32, 3 stages (60 KiB): the usual
   * mma.sync shape; a small M gets a 64-row tile to waste less. */
  if (gm->M <= 64) *out = (CuMmaParams){64, 128, 32, 32, 32, 3};
  else *out = (CuMmaParams){128, 128, 32, 64, 32, 3};
}

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

/* Copies the 16-byte chunk at global `src` (when `ok`; zeros otherwise) to
 * shared `dst`: cp.async when the pointers allow, plain loads otherwise. */
static void copy_chunk(CuFn *f, const char *dst, const char *src, const char *ok, const char *aligned) {
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "if (%s) {", aligned);
  cu_line(f, "  const unsigned d = (unsigned)__cvta_generic_to_shared(%s);", dst);
  cu_line(f, "  asm volatile(\"cp.async.cg.shared.global [%%0], [%%1], 16, %%2;\\n\" :: \"r\"(d), \"l\"(%s), \"r\"(%s ? 16 : 0));",
          src, ok);
  cu_line(f, "} else");
  cu_line(f, "#endif");
  cu_line(f, "{");
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int e = 0; e < 8; e++) %s[e] = %s ? %s[e] : (unsigned short)0;", dst, ok, src);
  cu_line(f, "}");
}

/* Issues the loads of K tile `kt` into buffer `stage`. */
static void load_stage(CuFn *f, const CuGemm *gm, const CuMmaParams *p, int threads, const char *stage, const char *kt,
                       const char *aligned) {
  int CK = p->BK / 8;                /* 16-byte chunks per row of BK */
  int CN = p->BN / 8;                /* chunks per row of BN (B stored [K, N]) */
  int AS = p->BK + 8, BS = gm->tb ? p->BK + 8 : p->BN + 8;
  int a_chunks = p->BM * CK, b_chunks = p->BN * CK;
  cu_open(f, "%s", "");
  cu_line(f, "const long long k0 = (long long)(%s) * %d;", kt, p->BK);
  cu_line(f, "unsigned short *as = As + (%s) * %d, *bs = Bs + (%s) * %d;", stage, p->BM * AS, stage,
          gm->tb ? p->BN * BS : p->BK * BS);
  cu_line(f, "// A tile: %d rows of %d chunks", p->BM, CK);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", (a_chunks + threads - 1) / threads);
  cu_line(f, "const int c = threadIdx.x + i * %d, r = c / %d, kc = (c %% %d) * 8;", threads, CK, CK);
  if (a_chunks % threads) cu_line(f, "if (c >= %d) break;", a_chunks);
  cu_line(f, "const long long gm = m0 + r, gk = k0 + kc;");
  cu_line(f, "const bool ok = gm < %lldLL && gk < %lldLL;", (long long)gm->M, (long long)gm->K);
  cu_line(f, "const unsigned short *src = A + (ok ? gm * %lldLL + gk : 0LL);", (long long)gm->K);
  cu_line(f, "unsigned short *dst = as + r * %d + kc;", AS);
  copy_chunk(f, "dst", "src", "ok", aligned);
  cu_close(f);
  if (gm->tb) {
    cu_line(f, "// B tile, stored [N, K]: %d rows (n) of %d chunks", p->BN, CK);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int i = 0; i < %d; i++)", (b_chunks + threads - 1) / threads);
    cu_line(f, "const int c = threadIdx.x + i * %d, r = c / %d, kc = (c %% %d) * 8;", threads, CK, CK);
    if (b_chunks % threads) cu_line(f, "if (c >= %d) break;", b_chunks);
    cu_line(f, "const long long gn = n0 + r, gk = k0 + kc;");
    cu_line(f, "const bool ok = gn < %lldLL && gk < %lldLL;", (long long)gm->N, (long long)gm->K);
    cu_line(f, "const unsigned short *src = B + (ok ? gn * %lldLL + gk : 0LL);", (long long)gm->K);
    cu_line(f, "unsigned short *dst = bs + r * %d + kc;", BS);
  } else {
    cu_line(f, "// B tile, stored [K, N]: %d rows (k) of %d chunks", p->BK, CN);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int i = 0; i < %d; i++)", (b_chunks + threads - 1) / threads);
    cu_line(f, "const int c = threadIdx.x + i * %d, r = c / %d, nc = (c %% %d) * 8;", threads, CN, CN);
    if (b_chunks % threads) cu_line(f, "if (c >= %d) break;", b_chunks);
    cu_line(f, "const long long gk = k0 + r, gn = n0 + nc;");
    cu_line(f, "const bool ok = gk < %lldLL && gn < %lldLL;", (long long)gm->K, (long long)gm->N);
    cu_line(f, "const unsigned short *src = B + (ok ? gk * %lldLL + gn : 0LL);", (long long)gm->N);
    cu_line(f, "unsigned short *dst = bs + r * %d + nc;", BS);
  }
  copy_chunk(f, "dst", "src", "ok", aligned);
  cu_close(f);
  cu_close(f);
}

static void ldmatrix(CuFn *f, const char *regs, const char *ptr, bool trans) {
  cu_open(f, "%s", "");
  cu_line(f, "const unsigned s = (unsigned)__cvta_generic_to_shared(%s);", ptr);
  cu_line(f,
          "asm volatile(\"ldmatrix.sync.aligned.m8n8.x4%s.shared.b16 {%%0, %%1, %%2, %%3}, [%%4];\\n\" : \"=r\"(%s[0]), "
          "\"=r\"(%s[1]), \"=r\"(%s[2]), \"=r\"(%s[3]) : \"r\"(s));",
          trans ? ".trans" : "", regs, regs, regs, regs);
  cu_close(f);
}

void cu_emit_mma(CuFn *f, const CuGemm *gm, const CuMmaParams *p, const int *epi, int nepi, CuLaunch *l) {
  const Graph *g = f->g;
  const Node *an = gm->an;
  bool bf16 = gm->yt->dt == DT_BF16;
  int warps_m = p->BM / p->WM, warps_n = p->BN / p->WN, threads = 32 * warps_m * warps_n;
  int MI = p->WM / 16, NI = p->WN / 8;
  int AS = p->BK + 8, BS = gm->tb ? p->BK + 8 : p->BN + 8;
  int a_stage = p->BM * AS, b_stage = gm->tb ? p->BN * BS : p->BK * BS;
  int smem_elems = p->stages * (a_stage + b_stage);

  l->kind = "matmul";
  l->block[0] = (unsigned)threads;
  int64_t gx = (gm->N + p->BN - 1) / p->BN, gy = (gm->M + p->BM - 1) / p->BM;
  if (gy > 65535 || gx > 0x7fffffffLL) {
    cu_fail(f, ST_UNSUPPORTED, "a %lld x %lld result exceeds the grid", (long long)gm->M, (long long)gm->N);
    return;
  }
  l->grid[0] = (unsigned)gx;
  l->grid[1] = (unsigned)gy;
  l->grid[2] = (unsigned)(gm->Z < 1 ? 1 : gm->Z > 65535 ? 65535 : gm->Z);
  l->smem = (unsigned)(smem_elems * 2);
  if (gm->Z == 0) return;

  cu_line(f, "// variant: tensor cores (mma.sync.m16n8k16.row.col.f32.%s, ldmatrix, cp.async), %s x %s%s",
          bf16 ? "bf16.bf16" : "f16.f16", g->val[an->in[0]].name, g->val[an->in[1]].name,
          gm->tb ? " (B given as [N, K])" : "");
  cu_line(f, "// parameters: BM %d, BN %d, BK %d, warps %d x %d of %d x %d, %d stages; M %lld, N %lld, K %lld, batch %lld",
          p->BM, p->BN, p->BK, warps_m, warps_n, p->WM, p->WN, p->stages, (long long)gm->M, (long long)gm->N,
          (long long)gm->K, (long long)gm->Z);
  cu_buf_append(f->out, emu_helpers, sizeof emu_helpers - 1);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "extern __shared__ __align__(16) unsigned short smelt_mma_smem[];");
  cu_line(f, "#else");
  cu_line(f, "__align__(16) __shared__ unsigned short smelt_mma_smem[%d];", smem_elems);
  cu_line(f, "#endif");
  cu_line(f, "unsigned short *const As = smelt_mma_smem;  // [%d stages][%d][%d] (rows padded by 8)", p->stages, p->BM, AS);
  cu_line(f, "unsigned short *const Bs = smelt_mma_smem + %d;  // [%d stages][%d][%d]", p->stages * a_stage, p->stages,
          gm->tb ? p->BN : p->BK, BS);
  cu_line(f, "const int warp = threadIdx.x / 32, lane = threadIdx.x %% 32;");
  cu_line(f, "const int wm = warp / %d, wn = warp %% %d;  // this warp's %d x %d sub-tile", warps_n, warps_n, p->WM, p->WN);
  cu_line(f, "const long long m0 = (long long)blockIdx.y * %d, n0 = (long long)blockIdx.x * %d;", p->BM, p->BN);
  int a0 = f->arg_of[an->in[0]], b0 = f->arg_of[an->in[1]];
  const char *aligned = f->opt && f->opt->args_aligned ? "true" : "aligned16";
  if (!(f->opt && f->opt->args_aligned))
    cu_line(f, "const bool aligned16 = smelt_aligned(a%d, 16) && smelt_aligned(a%d, 16);", a0, b0);
  const char *z = cu_tmp(f);
  cu_open(f, "for (long long %s = blockIdx.z; %s < %lldLL; %s += gridDim.z)", z, z, (long long)gm->Z, z);
  cu_line(f, "const unsigned short *A = reinterpret_cast<const unsigned short *>(a%d) + %s;  // %s", a0,
          cu_gemm_batch_offset(f, gm, z, gm->at), g->val[an->in[0]].name);
  cu_line(f, "const unsigned short *B = reinterpret_cast<const unsigned short *>(a%d) + %s;  // %s", b0,
          cu_gemm_batch_offset(f, gm, z, gm->bt), g->val[an->in[1]].name);
  cu_line(f, "float acc[%d][%d][4];", MI, NI);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int j = 0; j < %d; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;", NI);
  int64_t KT = (gm->K + p->BK - 1) / p->BK;
  cu_line(f, "// prologue: tiles 0 .. %d in flight", p->stages - 2);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int s = 0; s < %d; s++)", p->stages - 1);
  cu_open(f, "if (s < %lld)", (long long)KT);
  load_stage(f, gm, p, threads, "s", "s", aligned);
  cu_close(f);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "asm volatile(\"cp.async.commit_group;\\n\" ::);");
  cu_line(f, "#endif");
  cu_close(f);
  cu_open(f, "for (int kt = 0; kt < %lld; kt++)", (long long)KT);
  cu_line(f, "// tile kt has landed (at most %d newer groups pending); everyone is done with tile kt-1", p->stages - 2);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "asm volatile(\"cp.async.wait_group %d;\\n\" ::);", p->stages - 2);
  cu_line(f, "#endif");
  cu_line(f, "__syncthreads();");
  cu_open(f, "%s", "");
  cu_line(f, "const int next = kt + %d;  // into the buffer tile kt-1 used", p->stages - 1);
  cu_open(f, "if (next < %lld)", (long long)KT);
  load_stage(f, gm, p, threads, cu_fmt(f, "(next %% %d)", p->stages), "next", aligned);
  cu_close(f);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "asm volatile(\"cp.async.commit_group;\\n\" ::);");
  cu_line(f, "#endif");
  cu_close(f);
  cu_line(f, "const unsigned short *as = As + (kt %% %d) * %d, *bs = Bs + (kt %% %d) * %d;", p->stages, a_stage, p->stages,
          b_stage);
  /* lane's row addresses for ldmatrix: A tile i, B tiles j, j+1 */
  const char *pa = cu_fmt(f, "as + (wm * %d + i * 16 + (lane & 15)) * %d + kk + (lane >> 4) * 8", p->WM, AS);
  const char *pb = gm->tb ? cu_fmt(f, "bs + (wn * %d + j * 8 + (lane & 7) + ((lane >> 4) << 3)) * %d + kk + ((lane >> 3) & 1) * 8",
                                   p->WN, BS)
                          : cu_fmt(f, "bs + (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * %d + wn * %d + j * 8 + (lane >> 4) * 8",
                                   BS, p->WN);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int kk = 0; kk < %d; kk += 16)", p->BK);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "unsigned af[%d][4], bf[%d][2];", MI, NI);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "const unsigned short *pa = %s;", pa);
  ldmatrix(f, "af[i]", "pa", false);
  cu_close(f);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < %d; j += 2)", NI);
  cu_line(f, "unsigned r[4];");
  if (gm->tb) cu_line(f, "// B rows are n: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)");
  else cu_line(f, "// B rows are k: transposed matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15)");
  cu_line(f, "const unsigned short *pb = %s;", pb);
  ldmatrix(f, "r", "pb", !gm->tb);
  cu_line(f, "bf[j][0] = r[0], bf[j][1] = r[1], bf[j + 1][0] = r[2], bf[j + 1][1] = r[3];");
  cu_close(f);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "  #pragma unroll");
  cu_open(f, "  for (int j = 0; j < %d; j++)", NI);
  cu_line(f,
          "asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.%s.f32 {%%0, %%1, %%2, %%3}, {%%4, %%5, %%6, %%7}, "
          "{%%8, %%9}, {%%0, %%1, %%2, %%3};\\n\" : \"+f\"(acc[i][j][0]), \"+f\"(acc[i][j][1]), \"+f\"(acc[i][j][2]), "
          "\"+f\"(acc[i][j][3]) : \"r\"(af[i][0]), \"r\"(af[i][1]), \"r\"(af[i][2]), \"r\"(af[i][3]), \"r\"(bf[j][0]), "
          "\"r\"(bf[j][1]));",
          bf16 ? "bf16.bf16" : "f16.f16");
  cu_close(f);
  cu_line(f, "#else");
  cu_line(f, "// the same fragments, each lane's computed from its row addresses");
  cu_line(f, "for (int i = 0; i < %d; i++)", MI);
  cu_open(f, "  for (int j = 0; j < %d; j++)", NI);
  cu_line(f, "auto a_of = [&](int l, unsigned a[4]) { emu_ldsm_x4(a, [&](int lane) { return %s; }, false, l); };", pa);
  cu_line(f, "auto b_of = [&](int l, unsigned b[2]) {");
  cu_line(f, "  unsigned r[4];");
  cu_line(f, "  const int j0 = j & ~1;");
  cu_line(f, "  emu_ldsm_x4(r, [&](int lane) { const int j = j0; return %s; }, %s, l);", pb, gm->tb ? "false" : "true");
  cu_line(f, "  b[0] = r[(j & 1) * 2], b[1] = r[(j & 1) * 2 + 1];");
  cu_line(f, "};");
  cu_line(f, "emu_mma(acc[i][j], a_of, b_of, %s);", bf16 ? "true" : "false");
  cu_close(f);
  cu_line(f, "#endif");
  cu_close(f); /* kk */
  cu_close(f); /* kt */
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "asm volatile(\"cp.async.wait_group 0;\\n\" ::);");
  cu_line(f, "#endif");
  cu_line(f, "__syncthreads();  // the next batch reuses the buffers");
  /* epilogue: fragment element e of tile (i, j) is row g (+8 for e >= 2),
   * column 2t (+1 for odd e) */
  cu_line(f, "// epilogue: the fused elementwise ops on each f32 accumulator, stored");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < %d; j++)", NI);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int e = 0; e < 4; e++)");
  const char *m = cu_tmp(f), *n = cu_tmp(f);
  cu_line(f, "const %s %s = (%s)(m0 + wm * %d + i * 16 + (lane >> 2) + (e >> 1) * 8);", f->idx, m, f->idx, p->WM);
  cu_line(f, "const %s %s = (%s)(n0 + wn * %d + j * 8 + (lane & 3) * 2 + (e & 1));", f->idx, n, f->idx, p->WN);
  cu_open(f, "if (%s < %lld && %s < %lld)", m, (long long)gm->M, n, (long long)gm->N);
  CuCoords co;
  CuVal val;
  const char *zi = cu_fmt(f, "((%s)%s)", f->idx, z);
  gm->result(f, gm, zi, m, n, "acc[i][j][e]", &co, &val);
  const Value *av = &g->val[an->out[0]];
  const char *r = cu_tmp(f);
  cu_line(f, "const %s %s = %s;  // %s (%s)", cu_ctype(av->type.dt), r, val.l[0], av->name, ir_op_name(an->op));
  val.l[0] = r;
  cu_store_epilogue(f, epi, nepi, &co, &val);
  cu_close(f);
  cu_close(f);
  cu_close(f);
  cu_close(f);
  cu_close(f); /* z */
}
