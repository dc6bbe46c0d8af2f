/* Pooling kernels: max_pool2d and avg_pool2d over NCHW with kernel,
 * strides (absent: the kernel size) and pads, with the fused epilogue.
 *
 * One thread per output element (grid-stride): it walks its window,
 * skipping positions in the padding, and keeps the maximum (NaN wins, as
 * numpy) or the sum and the count of in-bounds elements (avg divides by
 * that count: count_include_pad = false).  A window wholly in the padding
 * gives -inf (max) or 0 (avg), like the reference.  The input is read with
 * cu_emit, so a fused prologue is computed at each window position.
 */
#include <math.h>

#include "codegen/cuda/cu_kernels.h"

void cu_emit_pool(CuFn *f, CuLaunch *l) {
  const Graph *g = f->g;
  const Node *an = &g->node[f->anchor];
  const TensorType *xt = &g->val[an->in[0]].type, *yt = &g->val[an->out[0]].type;
  const Attr *kern = ir_attr(an, "kernel"), *strides = ir_attr(an, "strides"), *pads = ir_attr(an, "pads");
  const Attr *s = strides ? strides : kern;
  bool is_max = an->op == OP_MAX_POOL2D;
  int64_t H = xt->dim[2], W = xt->dim[3], KH = kern->ints[0], KW = kern->ints[1];
  int64_t sh = s->ints[0], sw = s->ints[1], pt = pads->ints[0], pl = pads->ints[1];
  DType dt = yt->dt;
  const char *ct = cu_ctype(dt);

  int *epi, nepi, *side, nside;
  cu_split_outputs(f, &epi, &nepi, &side, &nside);
  if (nside) cu_store_loops(f, side, nside);
  int64_t n = ir_type_numel(yt);
  l->kind = "pool";
  l->block[0] = CU_EW_THREADS;
  l->grid[0] = cu_grid_for(n, CU_EW_THREADS);
  if (n == 0) return;

  const char *i = cu_tmp(f);
  if (ir_type_dynamic(yt)) {
    /* a ranged batch (codegen/ranges.c: windows never slide along a
     * range): this run's outputs only, in the max's layout */
    const char *nrun = cu_tmp(f), *c = cu_tmp(f);
    cu_line(f, "const %s %s = (%s)%s;  // this run's outputs (ranged dims)", f->idx, nrun, f->idx, cu_run_numel(f, yt));
    cu_open(f, "for (%s %s = (%s)blockIdx.x * blockDim.x + threadIdx.x; %s < %s; %s += (%s)gridDim.x * blockDim.x)",
            f->idx, c, f->idx, c, nrun, c, f->idx);
    cu_line(f, "const %s %s = (%s)%s;", f->idx, i, f->idx, cu_run_index(f, yt, c));
  } else {
    cu_open(f, "for (%s %s = (%s)blockIdx.x * blockDim.x + threadIdx.x; %s < %lld; %s += (%s)gridDim.x * blockDim.x)",
            f->idx, i, f->idx, i, (long long)n, i, f->idx);
  }
  CuCoords yc;
  cu_delinearize(f, i, yt, &yc);
  const char *acc = cu_tmp(f), *cnt = cu_tmp(f);
  cu_line(f, "%s %s = %s;", ct, acc, is_max ? cu_const(f, dt, -INFINITY) : cu_const(f, dt, 0));
  cu_line(f, "int %s = 0;  // in-bounds elements of the window", cnt);
  cu_open(f, "for (int kh = 0; kh < %lld; kh++)", (long long)KH);
  const char *ih = cu_tmp(f);
  cu_line(f, "const %s %s = %s;", f->idx, ih, cu_add(f, cu_addk(f, cu_mulk(f, yc.c[2], sh), -pt), "kh"));
  cu_line(f, "if (%s < 0 || %s >= %lld) continue;", ih, ih, (long long)H);
  cu_open(f, "for (int kw = 0; kw < %lld; kw++)", (long long)KW);
  const char *iw = cu_tmp(f);
  cu_line(f, "const %s %s = %s;", f->idx, iw, cu_add(f, cu_addk(f, cu_mulk(f, yc.c[3], sw), -pl), "kw"));
  cu_line(f, "if (%s < 0 || %s >= %lld) continue;", iw, iw, (long long)W);
  const char *c[4] = {yc.c[0], yc.c[1], ih, iw};
  CuCoords xc;
  cu_coords_scalar(&xc, 4, c);
  CuVal x;
  cu_emit(f, an->in[0], &xc, &x);
  if (is_max) cu_line(f, "%s = %s;", acc, cu_max_nan(f, dt, acc, x.l[0]));
  else cu_line(f, "%s += %s;", acc, x.l[0]);
  cu_line(f, "%s++;", cnt);
  cu_close(f);
  cu_close(f);
  CuVal y = {{0}};
  y.l[0] = cu_tmp(f);
  if (is_max)
    cu_line(f, "const %s %s = %s;  // %s (max_pool2d)", ct, y.l[0], acc, g->val[an->out[0]].name);
  else
    cu_line(f, "const %s %s = %s ? %s / (%s)%s : %s;  // %s (avg_pool2d)", ct, y.l[0], cnt, acc, ct, cnt,
            cu_const(f, dt, 0), g->val[an->out[0]].name);
  cu_store_epilogue(f, epi, nepi, &yc, &y);
  cu_close(f);
}
