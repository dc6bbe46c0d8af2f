/* Small helpers shared by the rewrite passes: facts about constants, graph
 * outputs and fresh names, and the one way a pass swaps a value for another.
 * Internal to passes/; not part of the pass API in passes.h. */
#ifndef SMELT_PASSES_REWRITE_H
#define SMELT_PASSES_REWRITE_H

#include "../ir/ir.h"

/* True when v is one of the graph's outputs. */
bool pass_is_output(const Graph *g, int v);
/* The live node that produces v, or NULL for inputs, constants and results of
 * nodes already marked dead. */
Node *pass_producer(Graph *g, int v);
/* True when v is a constant whose elements all equal one value; that value
 * goes to *out (read as double, so any dtype works).  Empty constants are
 * not uniform. */
bool pass_const_uniform(const Graph *g, int v, double *out);
/* A name no live value has: base itself, else base.1, base.2, ...  The
 * string lives in the graph's arena. */
const char *pass_fresh_name(Graph *g, const char *base);
/* Gives node dst every attribute node src has (same names and values). */
void pass_copy_attrs(Graph *g, int dst, int src);
/* Replaces every use of the result `from` by `to` and marks from's producer
 * dead.  Refuses (returns false, changes nothing) when `from` is a graph
 * output and `to` is a different name: the outputs are the model's interface
 * and keep their YAML names.  Only for single-result producers. */
bool pass_forward(Graph *g, int from, int to);

#endif
