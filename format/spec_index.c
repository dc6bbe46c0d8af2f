/* Input signatures for the specialisation index (format/spec_index.h):
 * each input's name and type as the IR printer writes them, separated by
 * spaces, so that two specialisations differ exactly when their inputs'
 * shapes do. */
#include <stdlib.h>

#include "format/spec_index.h"
#include "ir/bytes.h"

char *fmt_input_signature(const Graph *g) {
  ByteBuf b = {0};
  for (int i = 0; i < g->ninputs; i++) {
    char ty[160];
    const Value *v = &g->val[g->inputs[i]];
    bb_printf(&b, "%s%s:%s", i ? " " : "", v->name, ir_type_str(&v->type, ty, sizeof ty));
  }
  bb_put(&b, "", 1);
  if (b.oom) {
    free(b.p);
    return NULL;
  }
  return (char *)b.p;
}
