/* The pass manager: the table of passes, the default pipeline and the loop
 * that runs a list of them.
 *
 * Passes are declared once, in PASS_LIST (passes.h); this file only adds the
 * name each one has on the command line (dashes where C has underscores).
 * pass_run_pipeline parses the whole comma-separated list before running
 * anything, so a typo in the last name does not leave a half-optimised graph
 * behind.  After every pass it re-sorts the graph (ir_graph_compact drops dead
 * nodes and restores topological order, which passes that append nodes break)
 * and runs the verifier: a pass that leaves the IR inconsistent is a bug in
 * smelt, reported as an internal error that names the pass.
 */
#include "passes.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The summaries come from PASS_LIST; each table entry below refers to them by
 * the pass's C name, so a pass added to or renamed in PASS_LIST without a
 * table entry fails to compile (or trips the count assert). */
#define X(n, s) static const char summary_##n[] = s;
PASS_LIST(X)
#undef X

#define X(n, s) +1
enum { PASS_COUNT = 0 PASS_LIST(X) };
#undef X

#define ENTRY(cli_name, n) {cli_name, pass_##n, summary_##n}
static const PassInfo pass_table[] = {
    ENTRY("canonicalize", canonicalize),
    ENTRY("const-fold", const_fold),
    ENTRY("simplify", simplify),
    ENTRY("cse", cse),
    ENTRY("dce", dce),
    ENTRY("shard", shard),
    ENTRY("fuse-attention", fuse_attention),
    ENTRY("merge-matmuls", merge_matmuls),
    ENTRY("layout", layout),
    ENTRY("quantize", quantize),
    ENTRY("fuse", fuse),
    ENTRY("plan-memory", plan_memory),
};
#undef ENTRY
_Static_assert(sizeof pass_table / sizeof pass_table[0] == PASS_COUNT,
               "every pass of PASS_LIST needs a command-line name in pass_table");

#define MAX_PIPELINE 64

const PassInfo *pass_lookup(const char *name) {
  for (int i = 0; i < PASS_COUNT; i++)
    if (strcmp(pass_table[i].name, name) == 0) return &pass_table[i];
  return NULL;
}

const char *pass_default_pipeline(void) {
  return "canonicalize,const-fold,simplify,cse,dce,fuse-attention,merge-matmuls,layout,fuse,plan-memory";
}

const char *pass_quantize_pipeline(void) {
  return "canonicalize,const-fold,simplify,cse,dce,fuse-attention,merge-matmuls,layout,quantize,fuse,plan-memory";
}

smelt_status pass_with_shard(const char *base, char *buf, size_t cap) {
  if (!base) base = pass_default_pipeline();
  if (strstr(base, "shard")) {
    if ((size_t)snprintf(buf, cap, "%s", base) >= cap) return st_error(ST_INVALID_INPUT, "pass list too long");
    return NULL;
  }
  const char *at = strstr(base, "fuse-attention");
  if (!at) return st_error(ST_INVALID_INPUT, "--tp needs the shard pass in the pass list (before fuse-attention)");
  int n = snprintf(buf, cap, "%.*sshard,const-fold,cse,dce,%s", (int)(at - base), base, at);
  if (n < 0 || (size_t)n >= cap) return st_error(ST_INVALID_INPUT, "pass list too long");
  return NULL;
}

void pass_ctx_logf(PassCtx *ctx, const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) {
    va_end(ap2);
    return;
  }
  /* every note is one line; callers do not end theirs with '\n' */
  size_t need = ctx->log_len + (size_t)n + 2;
  if (need > ctx->log_cap) {
    size_t cap = ctx->log_cap ? ctx->log_cap : 256;
    while (cap < need) cap *= 2;
    char *p = realloc(ctx->log, cap);
    if (!p) { /* the log is a courtesy to the user; losing a note is not an error */
      va_end(ap2);
      return;
    }
    ctx->log = p;
    ctx->log_cap = cap;
  }
  vsnprintf(ctx->log + ctx->log_len, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  ctx->log_len += (size_t)n;
  ctx->log[ctx->log_len++] = '\n';
  ctx->log[ctx->log_len] = 0;
}

void pass_ctx_free(PassCtx *ctx) {
  free(ctx->log);
  ctx->log = NULL;
  free(ctx->tp_states);
  ctx->tp_states = NULL;
  ctx->log_len = ctx->log_cap = 0;
  if (ctx->quant_report) {
    pass_quant_report_free(ctx->quant_report);
    free(ctx->quant_report);
    ctx->quant_report = NULL;
  }
}

static void known_names(char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = 0;
  for (int i = 0; i < PASS_COUNT && len < cap; i++) {
    int n = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", pass_table[i].name);
    if (n < 0) break;
    len += (size_t)n;
  }
}

/* Splits "a, b,c" into pass table entries; spaces around names are allowed,
 * empty names are not. */
static smelt_status parse_pipeline(const char *list, const PassInfo **out, int *out_n) {
  int n = 0;
  const char *p = list;
  for (;;) {
    while (*p == ' ') p++;
    const char *end = p;
    while (*end && *end != ',') end++;
    const char *last = end;
    while (last > p && last[-1] == ' ') last--;
    char name[64];
    size_t len = (size_t)(last - p);
    if (len == 0) return st_error(ST_INVALID_INPUT, "empty pass name in pass list '%s'", list);
    if (len >= sizeof name) len = sizeof name - 1; /* too long to be a pass; reported below */
    memcpy(name, p, len);
    name[len] = 0;
    const PassInfo *pi = pass_lookup(name);
    if (!pi) {
      char known[512];
      known_names(known, sizeof known);
      return st_error(ST_INVALID_INPUT, "unknown pass '%s' (known: %s)", name, known);
    }
    if (n == MAX_PIPELINE)
      return st_error(ST_INVALID_INPUT, "pass list has more than %d passes", MAX_PIPELINE);
    out[n++] = pi;
    if (!*end) break;
    p = end + 1;
  }
  *out_n = n;
  return NULL;
}

smelt_status pass_run_pipeline(Graph *g, PassCtx *ctx, const char *passes, PassHook hook,
                               void *user) {
  const PassInfo *list[MAX_PIPELINE];
  int n = 0;
  RETURN_IF_ERROR(parse_pipeline(passes ? passes : pass_default_pipeline(), list, &n));

  /* A graph that is already broken would be blamed on the first pass. */
  smelt_status st = ir_verify(g);
  if (st && st_code(st) == ST_NO_MEMORY) return st;
  if (st) return st_prefix(st, "internal error: IR invalid before the first pass");

  for (int i = 0; i < n; i++) {
    const PassInfo *pi = list[i];
    if (hook) hook(user, pi, i + 1, false, false, g);
    bool changed = false;
    st = pi->run(g, ctx, &changed);
    /* out of memory while the pass added to the graph: whatever else the
     * pass made of the scratch it was given, that is the error */
    if (g->oom) {
      st_free(st);
      return ir_graph_status(g);
    }
    if (st && st_code(st) == ST_NO_MEMORY) return st;
    /* A user error found by a pass (const-fold evaluating a gather whose
     * constant index is out of range) is located in the model and reads
     * "file:line:col: error: ..."; it stays that way.  Anything else gets
     * the pass's name. */
    if (st && st_code(st) == ST_INVALID_INPUT) return st;
    if (st) return st_prefix(st, "pass '%s'", pi->name);
    st = ir_graph_compact(g);
    if (st && st_code(st) == ST_NO_MEMORY) return st;
    if (st) return st_prefix(st, "internal error: after pass '%s'", pi->name);
    st = ir_verify(g);
    if (st && st_code(st) == ST_NO_MEMORY) return st;
    if (st) {
      smelt_status err = st_error(ST_INTERNAL, "internal error: IR invalid after pass '%s': %s",
                                  pi->name, st_message(st));
      st_free(st);
      return err;
    }
    if (hook) hook(user, pi, i + 1, true, changed, g);
  }
  return NULL;
}
