/* The kernel table: which kernels a bundle runs, in order, and what each
 * reads and writes.
 *
 * It is this file's own little-endian encoding:
 *   header  u8[4] "SKTB", u32 version, u32 count, u32 reserved (0)
 *   kernel  u32 name_len, name bytes (no NUL), i32 group, i32 nargs,
 *           i32 nouts, i64 ntasks, f64 bytes, f64 flops, i32 args[nargs],
 *           i32 range, and when range > 0: i32 a, i32 b, i64 outer, mid, inner
 * and nothing after the last kernel.  The decoder reads it as untrusted
 * input and then checks it against the graph it is to run on: a kernel may
 * read a graph input, a constant or a result some earlier kernel wrote; it
 * may write only results of nodes of its own group, each written once; every
 * graph output must be written.  Those are exactly the facts the session
 * relies on to never read uninitialised memory nor write the (shared,
 * read-only) constants of a bundle.
 */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "format/kernel_table.h"
#include "ir/bytes.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the kernel table is written in host order, which must be little-endian"
#endif

static const unsigned char KT_MAGIC[4] = {'S', 'K', 'T', 'B'};
#define KT_HEADER_BYTES 16
/* name_len 4, a name of 1, group, nargs, nouts 4 each, ntasks, bytes, flops 8
 * each, at least one argument 4, range 4 */
#define KT_MIN_KERNEL_BYTES 49

smelt_status fmt_kernel_table_encode(const Kernel *k, int n, void **out_buf, size_t *out_len) {
  *out_buf = NULL;
  *out_len = 0;
  ByteBuf b = {0};
  bb_put(&b, KT_MAGIC, 4);
  bb_u32(&b, FMT_KERNEL_TABLE_VERSION);
  bb_u32(&b, (uint32_t)n);
  bb_u32(&b, 0);
  for (int i = 0; i < n; i++) {
    size_t nl = strlen(k[i].name);
    bb_u32(&b, (uint32_t)nl);
    bb_put(&b, k[i].name, nl);
    bb_i32(&b, k[i].group);
    bb_i32(&b, k[i].nargs);
    bb_i32(&b, k[i].nouts);
    bb_i64(&b, k[i].ntasks);
    bb_f64(&b, k[i].bytes);
    bb_f64(&b, k[i].flops);
    for (int a = 0; a < k[i].nargs; a++) bb_i32(&b, k[i].args[a]);
    const KernelRange *rg = &k[i].rg;
    bb_i32(&b, rg->range);
    if (rg->range > 0) {
      bb_i32(&b, rg->a);
      bb_i32(&b, rg->b);
      bb_i64(&b, rg->outer);
      bb_i64(&b, rg->mid);
      bb_i64(&b, rg->inner);
    }
  }
  if (b.oom) {
    free(b.p);
    return st_error(ST_NO_MEMORY, "out of memory encoding the kernel table");
  }
  *out_buf = b.p;
  *out_len = b.len;
  return NULL;
}

void fmt_kernel_table_free(Kernel *k, int n) {
  if (!k) return;
  for (int i = 0; i < n; i++) free(k[i].args);
  free(k);
}

/* A bounds-checked reader.  The table is written little-endian (ir/bytes.h)
 * and read with memcpy into native integers: smelt's hosts are
 * little-endian, and the build says so if one is not. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the kernel table reader assumes a little-endian host"
#endif
typedef struct {
  const unsigned char *p;
  size_t len, at;
} Rd;

static bool rd(Rd *r, void *dst, size_t n) {
  if (r->len - r->at < n) return false;
  memcpy(dst, r->p + r->at, n);
  r->at += n;
  return true;
}

static bool name_ok(const char *s) {
  if (!*s) return false;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && *s != '_' && *s != '.') return false;
  return true;
}

/* Checks kernel i against the graph, given which values hold data before
 * it runs (`ready`); marks its outputs ready. */
static smelt_status check_kernel(const Graph *g, const Kernel *k, int i, bool *ready) {
  if (k->group < 0 || k->group >= g->ngroups)
    return st_error(ST_INVALID_INPUT, "kernel table: kernel %d '%s' belongs to group %d, the graph has %d", i, k->name,
                    k->group, g->ngroups);
  if (k->nouts < 1 || k->nargs < k->nouts)
    return st_error(ST_INVALID_INPUT, "kernel table: kernel '%s' has %d arguments of which %d outputs", k->name,
                    k->nargs, k->nouts);
  if (k->ntasks < 0 || !isfinite(k->bytes) || k->bytes < 0 || !isfinite(k->flops) || k->flops < 0)
    return st_error(ST_INVALID_INPUT, "kernel table: kernel '%s' has invalid task count or cost estimates", k->name);
  for (int a = 0; a < k->nargs; a++) {
    int v = k->args[a];
    if (v < 0 || v >= g->nval || g->val[v].kind == VK_DEAD)
      return st_error(ST_INVALID_INPUT, "kernel table: kernel '%s' argument %d is value %d, which does not exist",
                      k->name, a, v);
    const Value *val = &g->val[v];
    if (a < k->nargs - k->nouts) {
      if (val->kind == VK_NODE && !ready[v])
        return st_error(ST_INVALID_INPUT, "kernel table: kernel '%s' reads '%s' before any kernel writes it", k->name,
                        val->name);
      continue;
    }
    if (val->kind != VK_NODE)
      return st_error(ST_INVALID_INPUT, "kernel table: kernel '%s' writes '%s', which is not a node result", k->name,
                      val->name);
    if (g->node[val->node].group != k->group)
      return st_error(ST_INVALID_INPUT, "kernel table: kernel '%s' writes '%s', computed by another group", k->name,
                      val->name);
    if (ready[v])
      return st_error(ST_INVALID_INPUT, "kernel table: '%s' is written twice (by kernel '%s')", val->name, k->name);
    ready[v] = true;
  }
  /* An output that is also an input of the same kernel would alias
   * arguments the code was told do not alias (cg_llvm.h). */
  for (int a = 0; a < k->nargs - k->nouts; a++)
    for (int o = k->nargs - k->nouts; o < k->nargs; o++)
      if (k->args[a] == k->args[o])
        return st_error(ST_INVALID_INPUT, "kernel table: kernel '%s' reads and writes '%s'", k->name,
                        g->val[k->args[a]].name);
  return NULL;
}

static smelt_status decode_kernel(Rd *r, const Graph *g, Kernel *k) {
  uint32_t nl = 0;
  if (!rd(r, &nl, 4) || nl == 0 || nl >= sizeof k->name || r->len - r->at < nl)
    return st_error(ST_INVALID_INPUT, "kernel table: bad kernel name length");
  memcpy(k->name, r->p + r->at, nl);
  k->name[nl] = 0;
  r->at += nl;
  if (strlen(k->name) != nl || !name_ok(k->name)) return st_error(ST_INVALID_INPUT, "kernel table: bad kernel name");
  int32_t head[3] = {0, 0, 0}; /* group, nargs, nouts */
  if (!rd(r, head, sizeof head) || !rd(r, &k->ntasks, 8) || !rd(r, &k->bytes, 8) || !rd(r, &k->flops, 8))
    return st_error(ST_INVALID_INPUT, "kernel table: truncated in kernel '%s'", k->name);
  k->group = head[0];
  k->nargs = head[1];
  k->nouts = head[2];
  /* Bound the count by the bytes left before allocating for it. */
  if (k->nargs < 1 || (size_t)k->nargs > (r->len - r->at) / 4 || k->nargs > g->nval)
    return st_error(ST_INVALID_INPUT, "kernel table: kernel '%s' claims %d arguments", k->name, k->nargs);
  k->args = malloc((size_t)k->nargs * sizeof *k->args);
  if (!k->args) return st_error(ST_NO_MEMORY, "out of memory reading the kernel table");
  /* int and int32_t are the same on every target smelt builds for. */
  _Static_assert(sizeof(int) == 4, "kernel arguments are stored as 32-bit ints");
  rd(r, k->args, (size_t)k->nargs * 4);
  KernelRange *rg = &k->rg;
  if (!rd(r, &rg->range, 4)) return st_error(ST_INVALID_INPUT, "kernel table: truncated in kernel '%s'", k->name);
  if (rg->range < 0 || rg->range > g->nranges)
    return st_error(ST_INVALID_INPUT, "kernel table: kernel '%s' follows range %d of %d", k->name, rg->range, g->nranges);
  if (rg->range > 0) {
    if (!rd(r, &rg->a, 4) || !rd(r, &rg->b, 4) || !rd(r, &rg->outer, 8) || !rd(r, &rg->mid, 8) || !rd(r, &rg->inner, 8))
      return st_error(ST_INVALID_INPUT, "kernel table: truncated in kernel '%s'", k->name);
    const IrRange *ir = &g->ranges[rg->range - 1];
    /* the task split covers ntasks, and every run's rows fit in it */
    bool ok = rg->a > 0 && rg->outer > 0 && rg->mid > 0 && rg->inner > 0 && rg->outer <= k->ntasks &&
              rg->mid <= k->ntasks / rg->outer && rg->inner <= k->ntasks / rg->outer / rg->mid &&
              rg->outer * rg->mid * rg->inner == k->ntasks && (int64_t)rg->a * ir->max + rg->b <= rg->mid &&
              (int64_t)rg->a * ir->min + rg->b >= 0;
    if (!ok) return st_error(ST_INVALID_INPUT, "kernel table: kernel '%s' has an inconsistent ranged task split", k->name);
  }
  return NULL;
}

smelt_status fmt_kernel_table_decode(const void *buf, size_t len, const Graph *g, Kernel **out_kernels, int *out_n) {
  *out_kernels = NULL;
  *out_n = 0;
  Rd r = {.p = buf, .len = len};
  unsigned char magic[4];
  uint32_t version, count, reserved;
  if (!rd(&r, magic, 4) || !rd(&r, &version, 4) || !rd(&r, &count, 4) || !rd(&r, &reserved, 4))
    return st_error(ST_INVALID_INPUT, "kernel table: truncated header");
  if (memcmp(magic, KT_MAGIC, 4) != 0) return st_error(ST_INVALID_INPUT, "kernel table: bad magic");
  if (version != FMT_KERNEL_TABLE_VERSION)
    return st_error(ST_INVALID_INPUT, "kernel table: version %u (this smelt reads version %d)", version,
                    FMT_KERNEL_TABLE_VERSION);
  if (reserved != 0) return st_error(ST_INVALID_INPUT, "kernel table: reserved field is not zero");
  if (count > (len - KT_HEADER_BYTES) / KT_MIN_KERNEL_BYTES)
    return st_error(ST_INVALID_INPUT, "kernel table: %u kernels cannot fit in %zu bytes", count, len);
  Kernel *k = calloc(count ? count : 1, sizeof *k);
  bool *ready = calloc(g->nval ? (size_t)g->nval : 1, sizeof *ready);
  smelt_status st = NULL;
  int n = 0;
  if (!k || !ready) {
    st = st_error(ST_NO_MEMORY, "out of memory reading the kernel table");
    goto done;
  }
  for (; n < (int)count; n++) {
    if ((st = decode_kernel(&r, g, &k[n]))) {
      n++; /* its args, if any, are freed with the rest */
      goto done;
    }
    for (int j = 0; j < n; j++)
      if (strcmp(k[j].name, k[n].name) == 0) {
        st = st_error(ST_INVALID_INPUT, "kernel table: two kernels named '%s'", k[n].name);
        n++;
        goto done;
      }
    if ((st = check_kernel(g, &k[n], n, ready))) {
      n++;
      goto done;
    }
  }
  if (r.at != len) {
    st = st_error(ST_INVALID_INPUT, "kernel table: %zu bytes after the last kernel", len - r.at);
    goto done;
  }
  for (int i = 0; i < g->noutputs; i++) {
    int v = g->outputs[i];
    if (g->val[v].kind == VK_NODE && !ready[v]) {
      st = st_error(ST_INVALID_INPUT, "kernel table: no kernel writes the output '%s'", g->val[v].name);
      goto done;
    }
  }
done:
  free(ready);
  if (st) {
    fmt_kernel_table_free(k, n);
    return st;
  }
  *out_kernels = k;
  *out_n = n;
  return NULL;
}

