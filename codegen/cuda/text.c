/* Text plumbing of the CUDA code generator: growable buffers, indented
 * lines, temporaries, memo scopes, and index arithmetic on C expressions.
 *
 * Index expressions are built as strings; the helpers fold the literals the
 * generator produces all the time (a coordinate "0" of a size-1 dim, a
 * stride of 1) so that the generated code reads like code a person wrote
 * (`t3 * 512 + t4`, not `(t3 * 512) + ((0 * 16) + t4 * 1)`).  The CUDA
 * compiler would fold them too; the folding is for the reader.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cu_emit.h"

/* Out of memory marks the buffer; see CuBuf. */
void cu_buf_append(CuBuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 1024;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->s, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->s = p;
    b->cap = cap;
  }
  if (n) memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = 0;
}

void cu_buf_append_buf(CuBuf *b, const CuBuf *src) {
  if (src->oom) b->oom = true;
  cu_buf_append(b, src->s ? src->s : "", src->len);
}

void cu_buf_printf(CuBuf *b, const char *fmt, ...) {
  char small[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof small) {
    cu_buf_append(b, small, (size_t)n);
    return;
  }
  char *big = malloc((size_t)n + 1);
  if (!big) {
    b->oom = true;
    return;
  }
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  cu_buf_append(b, big, (size_t)n);
  free(big);
}

void cu_buf_free(CuBuf *b) {
  free(b->s);
  b->s = NULL;
  b->len = b->cap = 0;
  b->oom = false;
}

char *cu_buf_take(CuBuf *b) {
  char *s = b->oom ? NULL : b->s ? b->s : calloc(1, 1);
  if (!s) free(b->s);
  b->s = NULL;
  b->len = b->cap = 0;
  b->oom = false;
  return s;
}

void cu_fail(CuFn *f, StatusCode code, const char *fmt, ...) {
  if (f->err) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  f->err = st_error(code, "CUDA kernel %s: %s", f->k->name, msg);
}

void cu_line(CuFn *f, const char *fmt, ...) {
  char small[512];
  for (int i = 0; i < f->indent; i++) cu_buf_append(f->out, "  ", 2);
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof small) {
    cu_buf_append(f->out, small, (size_t)n);
  } else if (n >= 0) {
    char *big = malloc((size_t)n + 1);
    if (!big) {
      f->out->oom = true;
      return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    cu_buf_append(f->out, big, (size_t)n);
    free(big);
  }
  cu_buf_append(f->out, "\n", 1);
}

const char *cu_fmt(CuFn *f, const char *fmt, ...) {
  char small[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return "";
  char *p = arena_alloc(&f->arena, (size_t)n + 1);
  if (!p) {
    cu_fail(f, ST_NO_MEMORY, "out of memory");
    return "";
  }
  if ((size_t)n < sizeof small) {
    memcpy(p, small, (size_t)n + 1);
  } else {
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
  }
  return p;
}

const char *cu_tmp(CuFn *f) { return cu_fmt(f, "t%d", f->tmp++); }

const char *cu_buf_str(CuFn *f, const CuBuf *b) {
  if (b->oom) {
    cu_fail(f, ST_NO_MEMORY, "out of memory");
    return "";
  }
  return cu_fmt(f, "%s", b->s ? b->s : "");
}

int cu_scope_push(CuFn *f) { return f->nmemo; }
void cu_scope_pop(CuFn *f, int mark) {
  if (mark < f->nmemo) f->nmemo = mark;
}


void cu_open(CuFn *f, const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (line[0]) cu_line(f, "%s {", line);
  else cu_line(f, "{");
  if (f->indent < CU_MAX_DEPTH) f->open_marks[f->indent] = cu_scope_push(f);
  f->indent++;
}

void cu_close(CuFn *f) {
  f->indent--;
  if (f->indent >= 0 && f->indent < CU_MAX_DEPTH) cu_scope_pop(f, f->open_marks[f->indent]);
  cu_line(f, "}");
}

/* ---- index arithmetic ---- */

bool cu_is_lit(const char *e, int64_t *out) {
  const char *p = e;
  if (*p == '-') p++;
  if (!*p) return false;
  for (const char *q = p; *q; q++)
    if (*q < '0' || *q > '9') return false;
  if (out) *out = strtoll(e, NULL, 10);
  return true;
}

const char *cu_mulk(CuFn *f, const char *e, int64_t k) {
  int64_t v;
  if (k == 0) return "0";
  if (cu_is_lit(e, &v)) return cu_fmt(f, "%lld", (long long)(v * k));
  if (k == 1) return e;
  return cu_fmt(f, "%s * %lld", e, (long long)k);
}

const char *cu_addk(CuFn *f, const char *e, int64_t k) {
  int64_t v;
  if (k == 0) return e;
  if (cu_is_lit(e, &v)) return cu_fmt(f, "%lld", (long long)(v + k));
  return k > 0 ? cu_fmt(f, "(%s + %lld)", e, (long long)k) : cu_fmt(f, "(%s - %lld)", e, (long long)-k);
}

const char *cu_extent(CuFn *f, const TensorType *t, int a) {
  if (!t->dyn[a]) return cu_fmt(f, "%lld", (long long)t->dim[a]);
  return cu_fmt(f, "(rng[%d] * %dLL + %dLL)", t->dyn[a] - 1, (int)t->dyn_a[a], (int)t->dyn_b[a]);
}

/* The ranged axis of t (one at most: codegen/ranges.c), -1 if none, with
 * the products of the extents before and after it (at the max). */
static int ranged_axis(const TensorType *t, int64_t *before, int64_t *after) {
  int ax = -1;
  for (int a = 0; a < t->rank && ax < 0; a++)
    if (t->dyn[a]) ax = a;
  *before = *after = 1;
  for (int a = 0; ax >= 0 && a < t->rank; a++) {
    if (a < ax) *before *= t->dim[a];
    if (a > ax) *after *= t->dim[a];
  }
  return ax;
}

const char *cu_live(CuFn *f, const TensorType *t, const char *lin) {
  int64_t before, after;
  int ax = ranged_axis(t, &before, &after);
  if (ax < 0) return NULL;
  const char *q = after == 1 ? cu_fmt(f, "(long long)(%s)", lin) : cu_fmt(f, "((long long)(%s) / %lldLL)", lin, (long long)after);
  /* the axes before it are all 1: no modulo */
  if (before == 1) return cu_fmt(f, "(%s < %s)", q, cu_extent(f, t, ax));
  return cu_fmt(f, "(%s %% %lldLL < %s)", q, (long long)t->dim[ax], cu_extent(f, t, ax));
}

const char *cu_run_numel(CuFn *f, const TensorType *t) {
  int64_t before, after;
  int ax = ranged_axis(t, &before, &after);
  if (ax < 0) return cu_fmt(f, "%lld", (long long)ir_type_numel(t));
  return cu_fmt(f, "(%s * %lldLL)", cu_extent(f, t, ax), (long long)(before * after));
}

const char *cu_run_index(CuFn *f, const TensorType *t, const char *c) {
  int64_t before, after;
  int ax = ranged_axis(t, &before, &after);
  if (ax < 0 || before == 1) return c;
  /* block o of the axes before the ranged one holds ext * after of this
   * run's elements and dim * after of the layout's */
  const char *run = cu_fmt(f, "(%s * %lldLL)", cu_extent(f, t, ax), (long long)after);
  return cu_fmt(f, "((long long)(%s) / %s * %lldLL + (long long)(%s) %% %s)", c, run, (long long)(t->dim[ax] * after), c, run);
}

const char *cu_add(CuFn *f, const char *a, const char *b) {
  int64_t va, vb;
  bool la = cu_is_lit(a, &va), lb = cu_is_lit(b, &vb);
  if (la && lb) return cu_fmt(f, "%lld", (long long)(va + vb));
  if (la && va == 0) return b;
  if (lb && vb == 0) return a;
  if (lb) return cu_addk(f, a, vb);
  return cu_fmt(f, "(%s + %s)", a, b);
}

void cu_coords_scalar(CuCoords *co, int rank, const char *const *c) {
  memset(co, 0, sizeof *co);
  co->rank = rank;
  co->lanes = 1;
  co->aligned = true;
  for (int d = 0; d < rank; d++) co->c[d] = c[d];
}

void cu_delinearize(CuFn *f, const char *lin, const TensorType *t, CuCoords *out) {
  memset(out, 0, sizeof *out);
  out->rank = t->rank;
  out->lanes = 1;
  out->aligned = true;
  int64_t stride = 1;
  int outer = 0; /* the first dim that is not 1: it needs no modulo */
  while (outer < t->rank && t->dim[outer] == 1) outer++;
  for (int d = t->rank - 1; d >= 0; d--) {
    if (t->dim[d] == 1) {
      out->c[d] = "0";
      continue;
    }
    const char *q = stride == 1 ? lin : cu_fmt(f, "%s / %lld", lin, (long long)stride);
    const char *e = d == outer ? q : cu_fmt(f, "%s%s%s %% %lld", stride == 1 ? "" : "(", q, stride == 1 ? "" : ")",
                                             (long long)t->dim[d]);
    if (cu_is_lit(lin, NULL) || strcmp(e, lin) == 0) {
      out->c[d] = e;
    } else {
      const char *name = cu_tmp(f);
      cu_line(f, "const %s %s = %s;", f->idx, name, e);
      out->c[d] = name;
    }
    stride *= t->dim[d];
  }
}

const char *cu_lane_coord(CuFn *f, const CuCoords *co, int j, int d) {
  return cu_addk(f, co->c[d], co->step[d] * j);
}

void cu_bcast_coords(const TensorType *in, const CuCoords *co, CuCoords *out) {
  memset(out, 0, sizeof *out);
  out->rank = in->rank;
  out->lanes = co->lanes;
  out->aligned = co->aligned;
  for (int i = 0; i < in->rank; i++) {
    int j = co->rank - in->rank + i;
    if (j < 0 || in->dim[i] == 1) {
      out->c[i] = "0";
      out->step[i] = 0;
    } else {
      out->c[i] = co->c[j];
      out->step[i] = co->step[j];
    }
  }
}

unsigned cu_grid_for(int64_t items, int threads) {
  int64_t blocks = (items + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > CU_MAX_GRID) blocks = CU_MAX_GRID;
  return (unsigned)blocks;
}
