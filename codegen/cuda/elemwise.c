/* Elementwise kernels: a group of elementwise, broadcast and injective ops
 * (and single data-movement nodes: split, concat, gather, ...) becomes
 * grid-stride loops over its stored results, each thread computing `lanes`
 * consecutive elements with 16-byte loads and stores where the innermost
 * dim allows (emit.c: cu_store_loops).  Results of one shape share a loop,
 * so a value two of them need is computed once per element.
 */
#include "codegen/cuda/cu_kernels.h"

void cu_emit_elemwise(CuFn *f, CuLaunch *l) {
  const int *outs = f->k->args + f->nin;
  int n = f->k->nargs - f->nin;
  int64_t items = 1;
  for (int i = 0; i < n; i++) {
    const TensorType *t = &f->g->val[outs[i]].type;
    int64_t it = ir_type_numel(t) / cu_pick_lanes(f, t, &outs[i], 1);
    if (it > items) items = it;
  }
  cu_store_loops(f, outs, n);
  l->kind = "elementwise";
  l->block[0] = CU_EW_THREADS;
  l->grid[0] = cu_grid_for(items, CU_EW_THREADS);
}
