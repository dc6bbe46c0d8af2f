/* plan-memory: one arena for the tensors that live between kernels, with
 * space reused between tensors whose lifetimes do not overlap.
 *
 * Not built yet: it needs the kernel boundaries that `fuse` (issue 3)
 * decides, and the planner itself comes with that issue.  Until then this
 * pass is an honest no-op: no offsets are assigned, the graph is untouched,
 * and the log says so.
 *
 * Requires: nothing.
 */
#include "passes.h"

smelt_status pass_plan_memory(Graph *g, PassCtx *ctx, bool *changed) {
  (void)g;
  *changed = false;
  pass_ctx_logf(ctx, "plan-memory: not implemented yet (issue 3); no memory plan made");
  return NULL;
}
