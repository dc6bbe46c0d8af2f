/* The decode matmul: M <= 8 rows of A against a weight matrix B that is
 * read exactly once, with 16-byte loads, f32 accumulation.
 *
 * Such a product is bound by the bytes of B, so the kernel's only job is to
 * keep enough 16-byte loads in flight over the whole GPU, coalesced.  A
 * (M x K, small) is read through cu_emit (cached; a fused producer such as
 * a cast is computed in the load).  Two layouts of B:
 *
 *   B stored [K, N] (n contiguous): a block owns NB = CL x VEC columns;
 *   thread (kg, c) of its 256 reads the VEC columns of chunk c at rows
 *   k = kg, kg + KG, ... (KG = 256 / CL row groups), so each row segment of
 *   CL x 16 bytes is read by neighbouring lanes.  Partial sums are added
 *   across the row groups of a warp with shuffles, then across the 8 warps
 *   through shared memory.
 *
 *   B stored [N, K] (transpose_b, k contiguous): each warp owns CPW columns
 *   and its lanes stride along k in 16-byte chunks (512 contiguous bytes
 *   per column and step), then a shuffle reduction gives every lane the M
 *   dot products.
 *
 * Either way each result goes through the group's elementwise epilogue.
 * Without the alignment guarantee a uniform test of B's pointer picks
 * plain element loads.
 */
#include <string.h>

#include "codegen/cuda/cu_internal.h"

#define GEMV_THREADS 256
#define GEMV_CPW 2 /* columns per warp, B stored [N, K] */

static bool float_storage(DType dt) { return dt == DT_F16 || dt == DT_BF16 || dt == DT_F32; }

bool cu_gemv_eligible(const CuFn *f, const CuGemm *gm) {
  if (gm->an->op != OP_MATMUL || gm->M > 8 || gm->M < 1 || gm->b1 || gm->N < 1) return false;
  int bv = gm->an->in[1];
  const Value *b = &f->g->val[bv];
  if (f->arg_of[bv] < 0 || (b->kind == VK_NODE && f->member[b->node])) return false;
  if (!float_storage(gm->bt->dt) || !float_storage(gm->at->dt) || !float_storage(gm->yt->dt)) return false;
  int vec = (int)(16 / dt_size(gm->bt->dt));
  return gm->tb ? gm->K % vec == 0 : gm->N % vec == 0;
}

/* The anchor's value at (m, n) from the f32 sum, through the epilogue. */
static void finish(CuFn *f, const CuGemm *gm, const char *z, const char *m, const char *n, const char *sum,
                   const int *epi, int nepi) {
  const Graph *g = f->g;
  CuCoords co;
  CuVal val;
  gm->result(f, gm, z, m, n, sum, &co, &val);
  const Value *av = &g->val[gm->an->out[0]];
  const char *r = cu_tmp(f);
  cu_line(f, "const %s %s = %s;  // %s (%s)", cu_ctype(av->type.dt), r, val.l[0], av->name, ir_op_name(gm->an->op));
  val.l[0] = r;
  cu_store_epilogue(f, epi, nepi, &co, &val);
}

/* A 16-byte pack of B at element offset `off` into `pk`. */
static void load_pack(CuFn *f, const char *pk, const char *st, int vec, const char *ptr, const char *off,
                      const char *vec_ok) {
  cu_line(f, "smelt_pack<%s, %d> %s;", st, vec, pk);
  if (!strcmp(vec_ok, "true")) {
    cu_line(f, "%s = *reinterpret_cast<const smelt_pack<%s, %d> *>(%s + %s);", pk, st, vec, ptr, off);
    return;
  }
  cu_line(f, "if (%s) %s = *reinterpret_cast<const smelt_pack<%s, %d> *>(%s + %s);", vec_ok, pk, st, vec, ptr, off);
  cu_line(f, "else for (int v = 0; v < %d; v++) %s.v[v] = %s[%s + v];", vec, pk, ptr, off);
}

void cu_emit_gemv(CuFn *f, const CuGemm *gm, const int *epi, int nepi, CuLaunch *l) {
  const Graph *g = f->g;
  const Node *an = gm->an;
  DType bdt = gm->bt->dt;
  const char *st = cu_stype(bdt);
  int vec = (int)(16 / dt_size(bdt)), M = (int)gm->M;
  int b0 = f->arg_of[an->in[1]];
  const char *vec_ok = f->opt && f->opt->args_aligned ? "true" : "b_aligned";
  l->kind = "matmul";
  l->block[0] = GEMV_THREADS;
  l->grid[2] = (unsigned)(gm->Z < 1 ? 1 : gm->Z > 65535 ? 65535 : gm->Z);
  int CL = 0, NB;
  if (!gm->tb) {
    /* 4 chunks (64 bytes of f16) per row segment; 2 when that leaves too
     * few blocks to keep every SM's loads in flight */
    CL = gm->N / (vec * 4) >= 264 ? 4 : 2;
    NB = CL * vec;
  } else {
    NB = GEMV_CPW * (GEMV_THREADS / 32);
  }
  int64_t gx = (gm->N + NB - 1) / NB;
  if (gx > 0x7fffffffLL) {
    cu_fail(f, ST_UNSUPPORTED, "a result of %lld columns exceeds the grid", (long long)gm->N);
    return;
  }
  l->grid[0] = (unsigned)gx;
  if (gm->Z == 0) return;

  cu_line(f, "// variant: GEMV for M = %d (decode): %s read once with 16-byte loads, f32 accumulation%s", M,
          g->val[an->in[1]].name, gm->tb ? ", B given as [N, K]" : "");
  if (strcmp(vec_ok, "true") != 0) cu_line(f, "const bool b_aligned = smelt_aligned(a%d, 16);", b0);
  const char *z = cu_tmp(f);
  cu_open(f, "for (%s %s = blockIdx.z; %s < %lld; %s += gridDim.z)", f->idx, z, z, (long long)gm->Z, z);
  cu_line(f, "const %s *B = a%d + %s;  // %s", st, b0, cu_gemm_batch_offset(f, gm, z, gm->bt), g->val[an->in[1]].name);
  cu_line(f, "const int warp = threadIdx.x / 32, lane = threadIdx.x %% 32;");
  if (!gm->tb) {
    int KG = GEMV_THREADS / CL;
    cu_line(f, "// %d columns per block: thread (kg, c) reads columns n0 + %d c .. +%d at rows kg, kg + %d, ...", NB, vec,
            vec - 1, KG);
    cu_line(f, "__shared__ float red[%d][%d][%d];  // per warp, row, column", GEMV_THREADS / 32, M, NB);
    cu_line(f, "const int c = threadIdx.x %% %d, kg = threadIdx.x / %d;", CL, CL);
    cu_line(f, "const long long n0 = (long long)blockIdx.x * %d, nc = n0 + c * %d;", NB, vec);
    cu_line(f, "float acc[%d][%d];", M, vec);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int m = 0; m < %d; m++)", M);
    cu_line(f, "  #pragma unroll");
    cu_line(f, "  for (int v = 0; v < %d; v++) acc[m][v] = 0.0f;", vec);
    cu_open(f, "if (nc < %lldLL)", (long long)gm->N);
    cu_line(f, "#pragma unroll 4");
    const char *k = cu_tmp(f);
    cu_open(f, "for (%s %s = kg; %s < %lld; %s += %d)", f->idx, k, k, (long long)gm->K, k, KG);
    load_pack(f, "pk", st, vec, "B", cu_fmt(f, "(long long)%s * %lldLL + nc", k, (long long)gm->N), vec_ok);
    cu_line(f, "float b[%d];", vec);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int v = 0; v < %d; v++) b[v] = %s;", vec, cu_from_storage(f, bdt, "pk.v[v]"));
    for (int m = 0; m < M; m++) {
      CuVal x;
      gm->load_a(f, gm, z, cu_fmt(f, "%d", m), k, &x);
      cu_line(f, "#pragma unroll");
      cu_line(f, "for (int v = 0; v < %d; v++) acc[%d][v] += (float)%s * b[v];", vec, m, x.l[0]);
    }
    cu_close(f);
    cu_close(f);
    cu_line(f, "// add the row groups of a warp (lanes c, c + %d, ...), then of the block", CL);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int m = 0; m < %d; m++)", M);
    cu_line(f, "  #pragma unroll");
    cu_line(f, "  for (int v = 0; v < %d; v++)", vec);
    cu_line(f, "    #pragma unroll");
    cu_line(f, "    for (int o = %d; o < 32; o <<= 1) acc[m][v] += __shfl_xor_sync(0xffffffffu, acc[m][v], o);", CL);
    cu_open(f, "if (lane < %d)", CL);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int m = 0; m < %d; m++)", M);
    cu_line(f, "  #pragma unroll");
    cu_line(f, "  for (int v = 0; v < %d; v++) red[warp][m][c * %d + v] = acc[m][v];", vec, vec);
    cu_close(f);
    cu_line(f, "__syncthreads();");
    cu_open(f, "for (int i = threadIdx.x; i < %d; i += %d)", M * NB, GEMV_THREADS);
    cu_line(f, "const int m = i / %d, col = i %% %d;", NB, NB);
    cu_line(f, "float s = 0.0f;");
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int w = 0; w < %d; w++) s += red[w][m][col];", GEMV_THREADS / 32);
    const char *n = cu_tmp(f), *mm = cu_tmp(f);
    cu_line(f, "const %s %s = (%s)(n0 + col), %s = m;", f->idx, n, f->idx, mm);
    cu_open(f, "if (%s < %lld)", n, (long long)gm->N);
    finish(f, gm, z, mm, n, "s", epi, nepi);
    cu_close(f);
    cu_close(f);
    cu_line(f, "__syncthreads();  // red is reused by the next batch");
  } else {
    cu_line(f, "// warp w owns columns n0 + %d w .. +%d; its lanes stride along k, %d elements at a time", GEMV_CPW,
            GEMV_CPW - 1, vec);
    cu_line(f, "const long long n0 = (long long)blockIdx.x * %d + warp * %d;", NB, GEMV_CPW);
    cu_line(f, "float acc[%d][%d];", GEMV_CPW, M);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int j = 0; j < %d; j++)", GEMV_CPW);
    cu_line(f, "  #pragma unroll");
    cu_line(f, "  for (int m = 0; m < %d; m++) acc[j][m] = 0.0f;", M);
    cu_line(f, "#pragma unroll 2");
    const char *k = cu_tmp(f);
    cu_open(f, "for (%s %s = lane * %d; %s < %lld; %s += %d)", f->idx, k, vec, k, (long long)gm->K, k, 32 * vec);
    cu_line(f, "float x[%d][%d];  // A[m][k .. k+%d]", M, vec, vec - 1);
    for (int m = 0; m < M; m++)
      for (int v = 0; v < vec; v++) {
        CuVal x;
        gm->load_a(f, gm, z, cu_fmt(f, "%d", m), cu_fmt(f, "(%s + %d)", k, v), &x);
        cu_line(f, "x[%d][%d] = (float)%s;", m, v, x.l[0]);
      }
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int j = 0; j < %d; j++)", GEMV_CPW);
    cu_line(f, "const long long n = n0 + j;");
    cu_line(f, "if (n >= %lldLL) break;", (long long)gm->N);
    load_pack(f, "pk", st, vec, "B", cu_fmt(f, "n * %lldLL + %s", (long long)gm->K, k), vec_ok);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int v = 0; v < %d; v++) {", vec);
    cu_line(f, "  const float b = %s;", cu_from_storage(f, bdt, "pk.v[v]"));
    cu_line(f, "  #pragma unroll");
    cu_line(f, "  for (int m = 0; m < %d; m++) acc[j][m] += x[m][v] * b;", M);
    cu_line(f, "}");
    cu_close(f);
    cu_close(f);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int j = 0; j < %d; j++)", GEMV_CPW);
    cu_line(f, "  #pragma unroll");
    cu_line(f, "  for (int m = 0; m < %d; m++)", M);
    cu_line(f, "    #pragma unroll");
    cu_line(f, "    for (int o = 16; o > 0; o >>= 1) acc[j][m] += __shfl_xor_sync(0xffffffffu, acc[j][m], o);");
    cu_line(f, "// lane j * %d + m stores row m of column n0 + j", M);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int j = 0; j < %d; j++)", GEMV_CPW);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int m = 0; m < %d; m++)", M);
    const char *n = cu_tmp(f), *mm = cu_tmp(f);
    cu_line(f, "const %s %s = (%s)(n0 + j), %s = m;", f->idx, n, f->idx, mm);
    cu_open(f, "if (lane == j * %d + m && %s < %lld)", M, n, (long long)gm->N);
    finish(f, gm, z, mm, n, "acc[j][m]", epi, nepi);
    cu_close(f);
    cu_close(f);
    cu_close(f);
  }
  cu_close(f); /* z */
}
