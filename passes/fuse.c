/* fuse: cache-bounded fusion of producer-consumer chains into kernels.
 *
 * Not built yet: grouping nodes into kernels, with the on-chip footprint
 * check against the target's budget, is the work of issue 3.  Until then
 * this pass is an honest no-op: every node stays its own kernel (group -1),
 * the graph is untouched, and the log says so, so that nobody reads an
 * unfused IR as a fusion decision.
 *
 * Requires: nothing.
 */
#include "passes.h"

smelt_status pass_fuse(Graph *g, PassCtx *ctx, bool *changed) {
  (void)g;
  *changed = false;
  pass_ctx_logf(ctx, "fuse: not implemented yet (issue 3); no groups formed");
  return NULL;
}
