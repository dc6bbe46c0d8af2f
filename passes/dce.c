/* dce: remove nodes whose results nobody reads.
 *
 * Use counts are taken over live nodes and graph outputs.  Walking the nodes
 * backwards (consumers before producers in a topological order), a node none
 * of whose results is used dies and gives back one use of each operand, so
 * its producers can die in the same walk.  The walk repeats until nothing
 * changes, which makes the result right even if the order were not
 * topological.  Constants and inputs are not nodes and stay; a constant
 * without uses is simply not printed, and graph inputs are the model's
 * interface.  A multi-result node (split) stays while any result is used.
 *
 * Requires: nothing (faster with topological order).
 */
#include <stdlib.h>

#include "passes.h"

smelt_status pass_dce(Graph *g, PassCtx *ctx, bool *changed) {
  (void)ctx;
  *changed = false;
  int *uses = ir_use_counts(g); /* counts only live nodes' operands and outputs */
  if (!uses) return st_error(ST_NO_MEMORY, "out of memory");
  for (bool again = true; again;) {
    again = false;
    for (int id = g->nnode - 1; id >= 0; id--) {
      Node *n = &g->node[id];
      if (n->dead) continue;
      bool used = false;
      for (int i = 0; i < n->nout && !used; i++) used = uses[n->out[i]] > 0;
      if (used) continue;
      n->dead = true;
      for (int i = 0; i < n->nin; i++) uses[n->in[i]]--;
      again = *changed = true;
    }
  }
  free(uses);
  return NULL;
}
