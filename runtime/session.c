/* Sessions: the public API of include/smelt.h on the CPU and on CUDA GPUs
 * (CUDA's own part in runtime/cuda_session.c, opening bundles in
 * runtime/loader.c).
 *
 * A session owns what one run mutates.  CPU: the thread pool, the
 * activation memory and the bindings.  Intermediates (values passed between
 * kernels that are not graph outputs) live in one 64-byte-aligned arena at
 * the offsets plan-memory chose (Value.mem_offset), or each in a buffer of
 * its own when the graph has no plan (arena_bytes == 0) or the value was
 * left out of it.  Inputs and outputs live in the user's memory.  A run
 * resolves the pointer of every value once (rt_session_prepare), fills each
 * kernel's argument array from it, and calls the kernels in table order,
 * each split over the pool by task ranges.
 *
 * A small kernel is not worth waking threads for: a kernel gets at most one
 * thread per RT_WORK_PER_THREAD units of estimated work (bytes + flops),
 * so the microsecond-sized kernels of a small model run on the caller alone.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/internal.h"

/* Units of estimated work (bytes + flops) per thread: about 2-5 us of a
 * core's time for generated code (measured at 20-80 GFLOP/s and 20 GB/s per
 * core); below that, handing a range to another thread costs more than it
 * saves (the workers spin between the kernels of a run, so a handover
 * costs about a microsecond).  Measured on the 2-core CI-class VM,
 * 2026-12-05, `smelt bench --threads 2`, whole run: 1048576 -> 131072 took
 * gpt2_block from 33.1 to 27.9 us, tiny_llama 77.7 -> 72.9, mlp 5.35 ->
 * 4.73, cnn 25.2 -> 24.1; tiny_lm's decode step unchanged (14.2 us). */
#define RT_WORK_PER_THREAD 131072.0

/* The public enums mirror the internal ones number for number, so the API
 * converts by cast. */
#define SAME(a, b) ((int)(a) == (int)(b))
_Static_assert(SAME(SMELT_F32, DT_F32) && SAME(SMELT_F16, DT_F16) && SAME(SMELT_BF16, DT_BF16) &&
                   SAME(SMELT_F64, DT_F64) && SAME(SMELT_I64, DT_I64) && SAME(SMELT_I32, DT_I32) &&
                   SAME(SMELT_I8, DT_I8) && SAME(SMELT_U8, DT_U8) && SAME(SMELT_BOOL, DT_BOOL),
               "smelt_dtype mirrors DType");
_Static_assert(SAME(SMELT_OK, ST_OK) && SAME(SMELT_INVALID_INPUT, ST_INVALID_INPUT) && SAME(SMELT_IO, ST_IO) &&
                   SAME(SMELT_UNSUPPORTED, ST_UNSUPPORTED) && SAME(SMELT_NO_MEMORY, ST_NO_MEMORY) &&
                   SAME(SMELT_INTERNAL, ST_INTERNAL),
               "smelt status codes mirror StatusCode");
#undef SAME

/* ---- status wrappers ---- */

int smelt_status_code(const struct Status *st) { return st ? (int)st_code(st) : SMELT_OK; }
const char *smelt_status_message(const struct Status *st) { return st ? st_message(st) : "ok"; }
void smelt_status_free(smelt_status st) { st_free(st); }

const char *smelt_version(void) { return SMELT_LIB_VERSION; }

/* ---- sessions ---- */

/* Parses a device name: "cpu", or "cuda" / "cuda:N" (*out_ordinal = N). */
static smelt_status parse_device(const char *device, bool *out_cuda, int *out_ordinal) {
  *out_cuda = false;
  *out_ordinal = 0;
  if (!device || strcmp(device, "cpu") == 0) return NULL;
  if (strcmp(device, "cuda") == 0) {
    *out_cuda = true;
    return NULL;
  }
  if (strncmp(device, "cuda:", 5) == 0) {
    const char *p = device + 5;
    char *end;
    long n = strtol(p, &end, 10);
    if (end != p && !*end && *p >= '0' && *p <= '9' && n <= 1024) {
      *out_cuda = true;
      *out_ordinal = (int)n;
      return NULL;
    }
  }
  return st_error(ST_UNSUPPORTED, "device '%s': unknown device (expected 'cpu', 'cuda' or 'cuda:N')", device);
}

bool rt_is_graph_output(const Graph *g, int v) {
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i] == v) return true;
  return false;
}

static int session_threads(const smelt_bundle *b, const smelt_session_options *o) {
  if (o && o->threads > 0) return o->threads;
  const char *t = rt_bundle_manifest_get(b, "threads");
  long n = t ? strtol(t, NULL, 10) : 0;
  return n > 0 && n <= 4096 ? (int)n : rt_cpu_count();
}

/* Gives every intermediate its memory: the arena at its planned offset, or
 * a buffer of its own.  The loader has checked every offset against the
 * arena's size. */
static smelt_status place_intermediates(smelt_session *s) {
  const smelt_bundle *b = s->b;
  const Graph *g = b->g;
  if (g->arena_bytes > 0 && !(s->r->arena = rt_aligned_buffer((size_t)g->arena_bytes)))
    return st_error(ST_NO_MEMORY, "out of memory: activation arena of %lld bytes", (long long)g->arena_bytes);
  for (int k = 0; k < b->nkernels; k++) {
    const Kernel *kn = &b->kernels[k];
    for (int a = kn->nargs - kn->nouts; a < kn->nargs; a++) {
      int v = kn->args[a];
      if (rt_is_graph_output(g, v) || s->r->vptr[v]) continue;
      const Value *val = &g->val[v];
      if (s->r->arena && val->mem_offset >= 0) {
        s->r->vptr[v] = (char *)s->r->arena + val->mem_offset;
        continue;
      }
      if (!(s->r->own[v] = rt_aligned_buffer(ir_type_bytes(&val->type))))
        return st_error(ST_NO_MEMORY, "out of memory: buffer of '%s'", val->name);
      s->r->vptr[v] = s->r->own[v];
    }
  }
  return NULL;
}

/* ---- sessions: specialisations ---- */

static smelt_status check_binding(const Graph *g, int v, const char *what, const void *data, size_t bytes, size_t want);

/* The memory of the states and of the scatter results that update them
 * (ir.h: ir_state_of) is the session's state memory. */
static void place_states(smelt_session *s) {
  const Graph *g = s->b->g;
  for (int v = 0; v < g->nval; v++) {
    int sv = ir_state_of(g, v);
    if (sv < 0) continue;
    for (int i = 0; i < g->nstates; i++)
      if (g->states[i] == sv) s->r->vptr[v] = s->state[i];
  }
}

/* Frees the run state s->r of specialisation s->b, leaving it zeroed. */
static void free_run(smelt_session *s) {
  if (!s->r) return;
  rt_cuda_session_destroy(s);
  if (s->r->own)
    for (int v = 0; v < s->b->g->nval; v++) free(s->r->own[v]);
  free(s->r->own);
  free(s->r->arena);
  free(s->r->vptr);
  free(s->r->argv);
  free(s->r->argv_at);
  memset(s->r, 0, sizeof *s->r);
}

/* Makes specialisation i's run state (arena, buffers, argument arrays; on
 * CUDA its modules, constants and device memory) the current one. */
static smelt_status make_run(smelt_session *s, int i) {
  s->b = s->root->specs[i];
  s->r = &s->runs[i];
  s->made[i] = true;
  const smelt_bundle *b = s->b;
  const Graph *g = b->g;
  size_t nval = (size_t)g->nval, nargs = 0;
  for (int k = 0; k < b->nkernels; k++) nargs += (size_t)b->kernels[k].nargs;
  /* on the CPU each kernel's arguments are followed by the ranges (format/kernel.h) */
  size_t slots = nargs + (s->cuda ? 0 : (size_t)b->nkernels);
  for (int r = 0; r < g->nranges; r++) s->r->ranges[r] = g->ranges[r].max;
  s->r->own = calloc(nval ? nval : 1, sizeof *s->r->own);
  s->r->vptr = calloc(nval ? nval : 1, sizeof *s->r->vptr);
  s->r->argv = calloc(slots ? slots : 1, sizeof *s->r->argv);
  s->r->argv_at = calloc(b->nkernels ? (size_t)b->nkernels : 1, sizeof *s->r->argv_at);
  if (!s->r->own || !s->r->vptr || !s->r->argv || !s->r->argv_at)
    return st_error(ST_NO_MEMORY, "out of memory creating a session");
  for (int k = 0, at = 0; k < b->nkernels; k++) {
    s->r->argv_at[k] = at;
    at += b->kernels[k].nargs + (s->cuda ? 0 : 1);
  }
  if (s->cuda) return rt_cuda_session_create(s, nargs);
  place_states(s);
  return place_intermediates(s);
}

/* Makes specialisation i the active one, creating its run state the first
 * time; a session keeps the state of every specialisation it has run, so
 * going back and forth (decode, prefill, decode) costs nothing. */
static smelt_status activate(smelt_session *s, int i) {
  if (s->active == i) return NULL;
  smelt_bundle *prev_b = s->b;
  RtRun *prev_r = s->r;
  if (s->made[i]) {
    s->b = s->root->specs[i];
    s->r = &s->runs[i];
    s->active = i;
    return NULL;
  }
  smelt_status st = make_run(s, i);
  if (st) {
    free_run(s);
    s->made[i] = false;
    s->b = prev_b;
    s->r = prev_r;
    if (s->root->nspecs > 1) st = st_prefix(st, "specialisation %s", s->root->specs[i]->label);
    return st;
  }
  s->active = i;
  return NULL;
}

/* The specialisations a bundle has, for messages: "seq=1,16,64" when they
 * differ in one dim, else their labels separated by "; ". */
static const char *spec_list(const smelt_bundle *root, char *buf, size_t cap) {
  const char *eq0 = strchr(root->specs[0]->label, '=');
  size_t nl = eq0 ? (size_t)(eq0 - root->specs[0]->label) + 1 : 0;
  bool one_dim = nl > 0;
  for (int i = 0; i < root->nspecs && one_dim; i++) {
    const char *l = root->specs[i]->label;
    one_dim = strncmp(l, root->specs[0]->label, nl) == 0 && !strchr(l, ' ');
  }
  size_t len = 0;
  buf[0] = 0;
  for (int i = 0; i < root->nspecs && len + 1 < cap; i++) {
    const char *l = root->specs[i]->label;
    int w = one_dim ? snprintf(buf + len, cap - len, "%s%s", i ? "," : "", i ? l + nl : l)
                    : snprintf(buf + len, cap - len, "%s%s", i ? "; " : "", l);
    if (w < 0) break;
    len += (size_t)w;
  }
  return buf;
}

static const char *shape_str(const TensorType *t, char *buf, size_t cap) {
  size_t k = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < t->rank && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, i ? ",%lld" : "%lld", (long long)t->dim[i]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
  return buf;
}

static int slot_value(const Graph *g, bool input, int slot) { return input ? g->inputs[slot] : g->outputs[slot]; }

bool rt_solve_range(const Graph *g, const TensorType *t, int a, int64_t e, int64_t *rv) {
  int r = t->dyn[a] - 1;
  int64_t num = e - t->dyn_b[a];
  if (num < 0 || num % t->dyn_a[a]) return false;
  int64_t d = num / t->dyn_a[a];
  if (d < g->ranges[r].min || d > g->ranges[r].max || (rv[r] >= 0 && rv[r] != d)) return false;
  rv[r] = d;
  return true;
}

/* Whether specialisation sp takes binding bd in that input/output slot:
 * the same shape when bound with one, else the same size; a ranged axis
 * takes any extent of its range, and fixes the range's value in rv
 * (which must agree with what earlier bindings fixed). */
static bool fits(const smelt_bundle *sp, bool input, int slot, const Binding *bd, int64_t *rv) {
  const Graph *g = sp->g;
  const TensorType *t = &g->val[slot_value(g, input, slot)].type;
  int64_t save[IR_MAX_RANGES];
  memcpy(save, rv, sizeof save);
  bool ok = true;
  if (bd->shaped) {
    ok = bd->shape.rank == t->rank;
    for (int d = 0; d < t->rank && ok; d++)
      ok = t->dyn[d] ? rt_solve_range(g, t, d, bd->shape.dim[d], rv) : bd->shape.dim[d] == t->dim[d];
    if (ok) ok = bd->bytes == (size_t)ir_type_numel(&bd->shape) * dt_size(t->dt);
  } else if (!ir_type_dynamic(t)) {
    ok = ir_type_bytes(t) == bd->bytes;
  } else {
    /* by size: the one ranged axis (codegen/ranges.c) takes the rest */
    size_t unit = dt_size(t->dt);
    int a = -1;
    for (int d = 0; d < t->rank; d++) {
      if (t->dyn[d]) a = d;
      else unit *= (size_t)t->dim[d];
    }
    ok = unit > 0 && bd->bytes % unit == 0 && rt_solve_range(g, t, a, (int64_t)(bd->bytes / unit), rv);
  }
  if (!ok) memcpy(rv, save, sizeof save);
  return ok;
}

static void ranges_unknown(int64_t *rv) {
  for (int r = 0; r < IR_MAX_RANGES; r++) rv[r] = -1;
}

static bool takes(const smelt_bundle *sp, bool input, int slot, const Binding *bd) {
  int64_t rv[IR_MAX_RANGES];
  ranges_unknown(rv);
  return fits(sp, input, slot, bd, rv);
}

/* The bytes of a tensor of type t with the ranges at rv. */
static size_t run_bytes(const TensorType *t, const int64_t *rv) {
  TensorType u = *t;
  for (int a = 0; a < t->rank; a++) u.dim[a] = ir_type_extent(t, a, rv);
  return ir_type_bytes(&u);
}

/* Checks a binding against specialisation sp (the message of a bundle of
 * one: what the tensor is and what was bound). */
static smelt_status check_against(const smelt_bundle *sp, bool input, int slot, const void *data, const Binding *bd) {
  const Graph *g = sp->g;
  int v = slot_value(g, input, slot);
  const Value *val = &g->val[v];
  if (ir_type_dynamic(&val->type)) {
    char ty[128], sh[128], rs[160] = "";
    if (takes(sp, input, slot, bd)) return check_binding(g, v, input ? "input" : "output", data, bd->bytes, bd->bytes);
    for (int r = 0; r < g->nranges; r++) {
      size_t k = strlen(rs);
      snprintf(rs + k, sizeof rs - k, "%s%s in %lld..%lld", r ? ", " : "", g->ranges[r].name,
               (long long)g->ranges[r].min, (long long)g->ranges[r].max);
    }
    if (bd->shaped) shape_str(&bd->shape, sh, sizeof sh);
    else snprintf(sh, sizeof sh, "%zu bytes", bd->bytes);
    return st_error(ST_INVALID_INPUT, "%s '%s' is %s (%s); the bound tensor has %s%s", input ? "input" : "output",
                    val->name, ir_type_str(&val->type, ty, sizeof ty), rs, bd->shaped ? "shape " : "", sh);
  }
  if (bd->shaped && !takes(sp, input, slot, bd) && ir_type_bytes(&val->type) == bd->bytes) {
    char ty[128], sh[128];
    return st_error(ST_INVALID_INPUT, "%s '%s' is %s; the bound tensor has shape %s", input ? "input" : "output",
                    val->name, ir_type_str(&val->type, ty, sizeof ty), shape_str(&bd->shape, sh, sizeof sh));
  }
  return check_binding(g, v, input ? "input" : "output", data, bd->bytes, ir_type_bytes(&val->type));
}

/* Checks a binding before it is recorded: against the chosen
 * specialisation when there is one, else against all of them. */
static smelt_status check_slot(smelt_session *s, bool input, int slot, const void *data, const Binding *bd) {
  const smelt_bundle *root = s->root;
  if (s->pinned >= 0) return check_against(root->specs[s->pinned], input, slot, data, bd);
  for (int i = 0; i < root->nspecs; i++)
    if (takes(root->specs[i], input, slot, bd)) return check_against(root->specs[i], input, slot, data, bd);
  char what[160], sh[192], list[512];
  const char *name = root->g->val[slot_value(root->g, input, slot)].name;
  if (bd->shaped) snprintf(sh, sizeof sh, "with shape %s", shape_str(&bd->shape, what, sizeof what));
  else snprintf(sh, sizeof sh, "of %zu bytes", bd->bytes);
  return st_error(ST_INVALID_INPUT, "no specialisation of model '%s' takes %s '%s' %s; the bundle has %s",
                  root->g->name, input ? "input" : "output", name, sh, spec_list(root, list, sizeof list));
}

/* Picks the specialisation of the next run: the one chosen with
 * smelt_session_select, else the only one that takes every binding. */
/* Whether specialisation sp takes every binding together, with the
 * values of its ranges they fix in rv (-1: none fixes it). */
static bool fits_all(const smelt_session *s, const smelt_bundle *sp, int64_t *rv) {
  const Graph *g = s->root->g;
  ranges_unknown(rv);
  bool ok = true;
  for (int k = 0; k < g->ninputs && ok; k++) ok = !s->in_bind[k].bound || fits(sp, true, k, &s->in_bind[k], rv);
  for (int k = 0; k < g->noutputs && ok; k++) ok = !s->out_bind[k].bound || fits(sp, false, k, &s->out_bind[k], rv);
  return ok;
}

/* Activates specialisation i for the next run, with its ranges at the
 * values the bindings give (their max where none does). */
static smelt_status activate_with_ranges(smelt_session *s, int i) {
  RETURN_IF_ERROR(activate(s, i));
  int64_t rv[IR_MAX_RANGES];
  if (!fits_all(s, s->b, rv)) return NULL; /* check_against says which binding */
  for (int r = 0; r < s->b->g->nranges; r++) s->r->ranges[r] = rv[r] >= 0 ? rv[r] : s->b->g->ranges[r].max;
  return NULL;
}

static smelt_status choose(smelt_session *s) {
  const smelt_bundle *root = s->root;
  if (s->pinned >= 0) return activate_with_ranges(s, s->pinned);
  const Graph *g = root->g;
  int found = -1, count = 0;
  char list[512], fits[512] = "";
  for (int i = 0; i < root->nspecs; i++) {
    int64_t rv[IR_MAX_RANGES];
    if (!fits_all(s, root->specs[i], rv)) continue;
    size_t n = strlen(fits);
    snprintf(fits + n, sizeof fits - n, "%s%s", count ? ", " : "", root->specs[i]->label);
    if (count++ == 0 || i == s->active) found = i;
  }
  if (count == 1) return activate_with_ranges(s, found);
  if (count == 0) {
    /* each binding fits some specialisation, but not the same one */
    char what[1024] = "", sh[160];
    for (int k = 0; k < g->ninputs + g->noutputs; k++) {
      bool input = k < g->ninputs;
      const Binding *bd = input ? &s->in_bind[k] : &s->out_bind[k - g->ninputs];
      if (!bd->bound) continue;
      size_t n = strlen(what);
      if (bd->shaped) shape_str(&bd->shape, sh, sizeof sh);
      else snprintf(sh, sizeof sh, "%zu bytes", bd->bytes);
      snprintf(what + n, sizeof what - n, "%s%s '%s' %s", n ? ", " : "", input ? "input" : "output",
               g->val[slot_value(g, input, input ? k : k - g->ninputs)].name, sh);
    }
    return st_error(ST_INVALID_INPUT, "no specialisation of model '%s' takes all of %s together; the bundle has %s",
                    g->name, what, spec_list(root, list, sizeof list));
  }
  return st_error(ST_INVALID_INPUT, "the tensors bound fit %d specialisations of model '%s' (%s): bind the inputs "
                  "with smelt_session_bind_input_shaped or choose one with smelt_session_select", count, g->name, fits);
}

/* Whether the space-separated label has the item "k=v". */
static bool label_has(const char *label, const char *item, size_t n) {
  for (const char *p = label; *p;) {
    size_t len = strcspn(p, " ");
    if (len == n && strncmp(p, item, n) == 0) return true;
    p += len;
    p += strspn(p, " ");
  }
  return false;
}

/* Whether any label names dim `name` (n bytes). */
static bool labels_name(const smelt_bundle *root, const char *name, size_t n) {
  for (int i = 0; i < root->nspecs; i++)
    for (const char *p = root->specs[i]->label; *p;) {
      size_t len = strcspn(p, " ");
      if (len > n && p[n] == '=' && strncmp(p, name, n) == 0) return true;
      p += len;
      p += strspn(p, " ");
    }
  return false;
}

/* Whether the manifest's dims ("seq=16;hidden=64", as compiled) hold the
 * item "k=v" (n bytes) as given. */
static bool manifest_has(const smelt_bundle *root, const char *item, size_t n) {
  const char *dims = rt_bundle_manifest_get(root, "dims");
  for (const char *p = dims ? dims : ""; *p;) {
    size_t len = strcspn(p, ";");
    if (len == n && strncmp(p, item, n) == 0) return true;
    p += len;
    p += strspn(p, ";");
  }
  return false;
}

smelt_status rt_bundle_find_spec(const smelt_bundle *b, const char *dims, int *out_index) {
  const smelt_bundle *root = b->root;
  *out_index = -1;
  char list[512];
  const char *text = dims ? dims : "";
  int found = -1, count = 0;
  char fits[512] = "";
  for (int i = 0; i < root->nspecs; i++) {
    bool ok = true;
    for (const char *p = text + strspn(text, "; "); *p && ok;) {
      size_t n = strcspn(p, "; ");
      const char *eq = memchr(p, '=', n);
      if (!eq || eq == p)
        return st_error(ST_INVALID_INPUT, "dims '%s': expected NAME=VALUE", text);
      if (labels_name(root, p, (size_t)(eq - p))) ok = label_has(root->specs[i]->label, p, n);
      else if (!manifest_has(root, p, n))
        return st_error(ST_INVALID_INPUT, "%s: the bundle was not compiled for %.*s (%s%s%s)",
                        fmt_file_path(root->file), (int)n, p, root->nspecs > 1 ? "its specialisations: " : "its dims: ",
                        root->nspecs > 1 ? spec_list(root, list, sizeof list) : "",
                        root->nspecs > 1 ? "" : (rt_bundle_manifest_get(root, "dims") && *rt_bundle_manifest_get(root, "dims") ? rt_bundle_manifest_get(root, "dims") : "the model's"));
      p += n;
      p += strspn(p, "; ");
    }
    if (!ok) continue;
    size_t k = strlen(fits);
    snprintf(fits + k, sizeof fits - k, "%s%s", count ? "; " : "", root->specs[i]->label);
    if (count++ == 0) found = i;
  }
  if (count > 1)
    return st_error(ST_INVALID_INPUT, "%s: %s fits %d specialisations (%s): give a value for each dim in which they "
                    "differ", fmt_file_path(root->file), text, count, fits);
  if (found < 0)
    return st_error(ST_INVALID_INPUT, "%s: no specialisation has %s; the bundle has %s", fmt_file_path(root->file),
                    text, spec_list(root, list, sizeof list));
  *out_index = found;
  return NULL;
}

smelt_status rt_bundle_match_inputs(const smelt_bundle *b, const char *const *names, const TensorType *shapes, int n,
                                    int *out_index) {
  const smelt_bundle *root = b->root;
  const Graph *g = root->g;
  *out_index = -1;
  char list[512], sh[160];
  int *slot = calloc(n > 0 ? (size_t)n : 1, sizeof *slot);
  Binding *bd = calloc(n > 0 ? (size_t)n : 1, sizeof *bd);
  smelt_status st = NULL;
  if (!slot || !bd) st = st_error(ST_NO_MEMORY, "out of memory");
  /* each input alone first, for the message that names it */
  for (int i = 0; i < n && !st; i++) {
    slot[i] = -1;
    for (int k = 0; k < g->ninputs; k++)
      if (strcmp(g->val[g->inputs[k]].name, names[i]) == 0) slot[i] = k;
    if (slot[i] < 0) {
      st = st_error(ST_INVALID_INPUT, "model '%s' has no input named '%s'", g->name, names[i]);
      break;
    }
    TensorType t = shapes[i];
    t.dt = g->val[g->inputs[slot[i]]].type.dt;
    bd[i] = (Binding){.bytes = ir_type_bytes(&t), .bound = true, .shaped = true, .shape = t};
    bool any = false;
    for (int j = 0; j < root->nspecs && !any; j++) any = takes(root->specs[j], true, slot[i], &bd[i]);
    if (!any)
      st = st_error(ST_INVALID_INPUT, "no specialisation of model '%s' takes input '%s' with shape %s; the bundle has %s",
                    g->name, names[i], shape_str(&t, sh, sizeof sh), spec_list(root, list, sizeof list));
  }
  int found = -1, count = 0;
  for (int j = 0; j < root->nspecs && !st; j++) {
    bool ok = true;
    for (int i = 0; i < n && ok; i++) ok = takes(root->specs[j], true, slot[i], &bd[i]);
    if (ok && count++ == 0) found = j;
  }
  if (!st && count == 0)
    st = st_error(ST_INVALID_INPUT, "no specialisation of model '%s' takes these inputs together; the bundle has %s",
                  g->name, spec_list(root, list, sizeof list));
  else if (!st && count > 1)
    st = st_error(ST_INVALID_INPUT, "the inputs given fit %d specialisations of model '%s' (the bundle has %s)", count,
                  g->name, spec_list(root, list, sizeof list));
  free(slot);
  free(bd);
  if (!st) *out_index = found;
  return st;
}

smelt_status smelt_session_select(smelt_session *s, int i) {
  if (i < -1 || i >= s->root->nspecs)
    return st_error(ST_INVALID_INPUT, "smelt_session_select: specialisation %d (the bundle has %d)", i,
                    s->root->nspecs);
  if (i >= 0) RETURN_IF_ERROR(activate(s, i));
  s->pinned = i;
  for (int r = 1; s->peers && r < s->nranks; r++) RETURN_IF_ERROR(smelt_session_select(s->peers[r - 1], i));
  return NULL;
}

int smelt_session_specialisation(const smelt_session *s) { return s->active; }

static const char *name_list(const Graph *g, const int *vals, int n, char *buf, size_t cap);

/* ---- sessions: state ---- */

/* Every specialisation must have the root's states (names, types, order):
 * they share the session's memory. */
static smelt_status create_states(smelt_session *s) {
  const smelt_bundle *root = s->root;
  const Graph *g = root->g;
  char a[128], b[128];
  for (int k = 1; k < root->nspecs; k++) {
    const Graph *o = root->specs[k]->g;
    bool same = o->nstates == g->nstates;
    for (int i = 0; same && i < g->nstates; i++) {
      const Value *x = &g->val[g->states[i]], *y = &o->val[o->states[i]];
      same = strcmp(x->name, y->name) == 0 && ir_type_equal(&x->type, &y->type);
      if (!same)
        return st_error(ST_INVALID_INPUT, "%s: state '%s' is %s in specialisation %s but %s '%s' in %s: the "
                        "specialisations of one bundle must share their state", fmt_file_path(root->file), x->name,
                        ir_type_str(&x->type, a, sizeof a), root->specs[0]->label, ir_type_str(&y->type, b, sizeof b),
                        y->name, root->specs[k]->label);
    }
    if (!same)
      return st_error(ST_INVALID_INPUT, "%s: specialisations %s and %s have different state tensors",
                      fmt_file_path(root->file), root->specs[0]->label, root->specs[k]->label);
  }
  s->nstates = g->nstates;
  size_t n = g->nstates ? (size_t)g->nstates : 1;
  s->state_bytes = calloc(n, sizeof *s->state_bytes);
  s->state = calloc(n, sizeof *s->state);
  s->state_dev = calloc(n, sizeof *s->state_dev);
  if (!s->state_bytes || !s->state || !s->state_dev) return st_error(ST_NO_MEMORY, "out of memory creating a session");
  for (int i = 0; i < g->nstates; i++) {
    const Value *v = &g->val[g->states[i]];
    size_t bytes = ir_type_bytes(&v->type);
    s->state_bytes[i] = bytes;
    if (s->cuda) {
      smelt_status st = rt_cuda_alloc(s->dev, bytes ? bytes : 1, &s->state_dev[i]);
      if (!st) st = rt_cuda_memset(s->dev, s->state_dev[i], 0, bytes);
      if (st) return st_prefix(st, "state '%s'", v->name);
    } else if (!(s->state[i] = rt_aligned_buffer(bytes))) {
      return st_error(ST_NO_MEMORY, "out of memory: state '%s' of %zu bytes", v->name, bytes);
    }
  }
  return NULL;
}

static void destroy_states(smelt_session *s) {
  for (int i = 0; i < s->nstates; i++) {
    if (s->state) free(s->state[i]);
    if (s->state_dev && s->dev) rt_cuda_free(s->dev, s->state_dev[i]);
  }
  free(s->state);
  free(s->state_dev);
  free(s->state_bytes);
}

int smelt_session_num_states(const smelt_session *s) { return s->nstates; }

static void value_info(const Value *val, smelt_tensor_info *out);

void smelt_session_state_info(const smelt_session *s, int i, smelt_tensor_info *out) {
  memset(out, 0, sizeof *out);
  if (i < 0 || i >= s->nstates) return;
  value_info(&s->root->g->val[s->root->g->states[i]], out);
  int a = rt_ranks_state_axis(s, i); /* a tensor-parallel session's whole state */
  if (a >= 0 && a < out->rank) out->dims[a] *= s->nranks;
}

static smelt_status find_state(const smelt_session *s, const char *name, size_t bytes, int *out) {
  const Graph *g = s->root->g;
  *out = -1;
  for (int i = 0; name && i < s->nstates; i++)
    if (strcmp(g->val[g->states[i]].name, name) == 0) *out = i;
  if (*out < 0) {
    char list[512];
    return st_error(ST_INVALID_INPUT, "no state named '%s' (the states are: %s)", name ? name : "(null)",
                    name_list(g, g->states, g->nstates, list, sizeof list));
  }
  /* a tensor-parallel session's split state is read and written whole */
  int a = rt_ranks_state_axis(s, *out);
  size_t want = s->state_bytes[*out] * (size_t)(a >= 0 ? s->nranks : 1);
  if (bytes != want) {
    char ty[128];
    const Value *v = &g->val[g->states[*out]];
    TensorType t = v->type;
    if (a >= 0) t.dim[a] *= s->nranks;
    return st_error(ST_INVALID_INPUT, "state '%s' is %s (%zu bytes); the memory given has %zu bytes", v->name,
                    ir_type_str(&t, ty, sizeof ty), want, bytes);
  }
  return NULL;
}

smelt_status smelt_session_reset_state(smelt_session *s) {
  for (int i = 0; i < s->nstates; i++) {
    if (!s->cuda) memset(s->state[i], 0, s->state_bytes[i]);
    else RETURN_IF_ERROR(rt_cuda_memset(s->dev, s->state_dev[i], 0, s->state_bytes[i]));
  }
  for (int r = 1; s->peers && r < s->nranks; r++) RETURN_IF_ERROR(smelt_session_reset_state(s->peers[r - 1]));
  return NULL;
}

smelt_status smelt_session_read_state(smelt_session *s, const char *name, void *data, size_t bytes) {
  int i;
  RETURN_IF_ERROR(find_state(s, name, bytes, &i));
  if (bytes && !data) return st_error(ST_INVALID_INPUT, "state '%s': NULL data", name);
  if (s->peers) return rt_ranks_state_copy(s, i, data, true);
  if (!s->cuda) {
    memcpy(data, s->state[i], bytes);
    return NULL;
  }
  return rt_cuda_download(s->dev, data, s->state_dev[i], bytes);
}

smelt_status smelt_session_write_state(smelt_session *s, const char *name, const void *data, size_t bytes) {
  int i;
  RETURN_IF_ERROR(find_state(s, name, bytes, &i));
  if (bytes && !data) return st_error(ST_INVALID_INPUT, "state '%s': NULL data", name);
  if (s->peers) return rt_ranks_state_copy(s, i, (void *)data, false);
  if (!s->cuda) {
    memcpy(s->state[i], data, bytes);
    return NULL;
  }
  return rt_cuda_upload(s->dev, s->state_dev[i], data, bytes);
}

/* Positions that index a state (scatter) or a cache (attention with
 * cache: true) must lie inside it; compiled kernels would skip such rows,
 * so this makes a bad position an error instead.  Checked for graph inputs
 * bound in host memory (device memory is not read back for it). */
static smelt_status check_positions(smelt_session *s) {
  const Graph *g = s->b->g;
  for (int i = 0; i < g->nnode; i++) {
    const Node *n = &g->node[i];
    if (n->dead) continue;
    int iv, limit;
    const char *what;
    if (n->op == OP_SCATTER) {
      const TensorType *d = &g->val[n->in[0]].type;
      int ax = ir_norm_axis(ir_attr_int(n, "axis"), d->rank);
      iv = n->in[1];
      limit = (int)d->dim[ax];
      what = "scatter";
    } else if (n->op == OP_ATTENTION && ir_attr_int(n, "cache")) {
      iv = n->in[3];
      limit = (int)g->val[n->in[1]].type.dim[2];
      what = "attention";
    } else {
      continue;
    }
    int slot = -1;
    for (int k = 0; k < g->ninputs; k++)
      if (g->inputs[k] == iv) slot = k;
    if (slot < 0 || !s->in_ptr[slot]) continue;
    if (s->cuda && rt_cuda_is_device_pointer(s->dev, s->in_ptr[slot])) continue;
    const Value *pv = &g->val[iv];
    int64_t cnt = (int64_t)(run_bytes(&pv->type, s->r->ranges) / dt_size(pv->type.dt));
    for (int64_t j = 0; j < cnt; j++) {
      int64_t p = pv->type.dt == DT_I64 ? ((const int64_t *)s->in_ptr[slot])[j]
                  : pv->type.dt == DT_I32 ? ((const int32_t *)s->in_ptr[slot])[j]
                                          : (int64_t)dt_load(pv->type.dt, s->in_ptr[slot], (size_t)j);
      if (p < 0 || p >= limit)
        return st_error(ST_INVALID_INPUT, "input '%s'[%lld] = %lld is outside [0, %d), the capacity of '%s' that "
                        "node '%s' (%s) indexes", pv->name, (long long)j, (long long)p, limit,
                        g->val[n->in[n->op == OP_SCATTER ? 0 : 1]].name, ir_node_name(g, n), what);
    }
  }
  return NULL;
}

/* ---- sessions ---- */

smelt_status smelt_session_create(smelt_bundle *b, const char *device, const smelt_session_options *options,
                                  smelt_session **out_session) {
  *out_session = NULL;
  if (!b) return st_error(ST_INVALID_INPUT, "smelt_session_create: no bundle");
  b = b->root;
  bool cuda;
  int ordinal;
  /* tensor-parallel ranks on the GPU: "cuda:0,cuda:1", one device a rank */
  int ordinals[RT_MAX_RANKS], ndev = 0;
  if (device && strchr(device, ',')) {
    char one[32];
    for (const char *p = device; *p;) {
      const char *end = strchr(p, ',');
      size_t len = end ? (size_t)(end - p) : strlen(p);
      bool c = false;
      smelt_status st = NULL;
      if (len >= sizeof one || ndev == RT_MAX_RANKS) st = st_error(ST_UNSUPPORTED, "too long");
      if (!st) {
        snprintf(one, sizeof one, "%.*s", (int)len, p);
        st = parse_device(one, &c, &ordinals[ndev]);
      }
      if (st || !c || strcmp(one, "cuda") == 0) {
        st_free(st);
        return st_error(ST_UNSUPPORTED, "devices '%s': expected a list of CUDA devices such as cuda:0,cuda:1", device);
      }
      ndev++;
      p += len + (end ? 1 : 0);
      if (end && !*p) return st_error(ST_UNSUPPORTED, "devices '%s': a trailing comma", device);
    }
    cuda = true;
    ordinal = ordinals[0];
  } else {
    RETURN_IF_ERROR(parse_device(device, &cuda, &ordinal));
  }
  if (!b->code)
    return st_error(ST_INVALID_INPUT, "%s: the bundle was opened without its machine code", fmt_file_path(b->file));
  if (!cuda && b->no_cpu) return st_error(ST_UNSUPPORTED, "%s", b->no_cpu);
  RETURN_IF_ERROR(rt_bundle_check_constants(b)); /* deferred at open (loader.c) */
  if (options && options->threads < 0)
    return st_error(ST_INVALID_INPUT, "smelt_session_create: %d threads", options->threads);
  if (ndev > 0 && ndev != b->nranks)
    return st_error(ST_INVALID_INPUT, "%s: %d devices (%s) for a bundle of %d tensor-parallel rank%s: give one device "
                    "a rank", fmt_file_path(b->file), ndev, device, b->nranks, b->nranks == 1 ? "" : "s");
  if (b->nranks > 1 && cuda && ndev == 0) {
    /* "cuda": ranks on cuda:0 .. cuda:N-1 */
    int count = 0;
    if (strcmp(device, "cuda") != 0 || rt_cuda_device_count(&count) != NULL || count < b->nranks)
      return st_error(ST_INVALID_INPUT, "%s: a bundle of %d tensor-parallel ranks runs on %d GPUs: name them, e.g. "
                      "cuda:0,cuda:1 (this machine has %d; naming one GPU for every rank runs them all on it, their "
                      "collectives through host memory: a test, not a speed-up)", fmt_file_path(b->file),
                      b->nranks, b->nranks, count);
    for (int r = 0; r < b->nranks; r++) ordinals[r] = r;
  }
  if (b->nranks > 1)
    return rt_ranks_session_create(b, session_threads(b, options), options, cuda, ordinals, out_session);
  return rt_session_create_one(b, cuda, ordinal, session_threads(b, options), options, out_session);
}

smelt_status rt_session_create_one(smelt_bundle *b, bool cuda, int ordinal, int threads,
                                   const smelt_session_options *options, smelt_session **out_session) {
  *out_session = NULL;
  const Graph *g = b->g;
  smelt_session *s = calloc(1, sizeof *s);
  if (!s) return st_error(ST_NO_MEMORY, "out of memory creating a session");
  s->root = s->b = b;
  s->rank = b->rank;
  s->nranks = 1;
  s->active = s->pinned = -1;
  s->cuda = cuda;
  s->ordinal = ordinal;
  size_t nin = g->ninputs ? (size_t)g->ninputs : 1, nout = g->noutputs ? (size_t)g->noutputs : 1;
  s->runs = calloc((size_t)b->nspecs, sizeof *s->runs);
  s->made = calloc((size_t)b->nspecs, sizeof *s->made);
  s->in_ptr = calloc(nin, sizeof *s->in_ptr);
  s->out_ptr = calloc(nout, sizeof *s->out_ptr);
  s->in_bind = calloc(nin, sizeof *s->in_bind);
  s->out_bind = calloc(nout, sizeof *s->out_bind);
  smelt_status st = NULL;
  if (!s->runs || !s->made || !s->in_ptr || !s->out_ptr || !s->in_bind || !s->out_bind) {
    st = st_error(ST_NO_MEMORY, "out of memory creating a session");
    goto fail;
  }
  if (cuda) {
    if ((st = rt_cuda_device_create(ordinal, &s->dev))) {
      st = st_prefix(st, "device 'cuda:%d'", ordinal);
      goto fail;
    }
    if (options && options->cuda_compile) rt_cuda_device_set_compiler(s->dev, options->cuda_compile, options->cuda_compile_ctx);
    if (b->nkernels > 0 && !b->cuda) {
      st = st_error(ST_UNSUPPORTED, "%s: error: the bundle has no CUDA kernels (it was compiled for --target cpu; "
                    "compile with --target cuda or cpu,cuda)", fmt_file_path(b->file));
      goto fail;
    }
  } else if ((st = rt_pool_create(threads, &s->pool))) {
    goto fail;
  }
  if ((st = create_states(s))) goto fail;
  /* A bundle of one has nothing to choose: it is chosen now, as before
   * bundles had specialisations. */
  if (b->nspecs == 1 && (st = smelt_session_select(s, 0))) goto fail;
  *out_session = s;
  return NULL;
fail:
  smelt_session_destroy(s);
  return st;
}

void smelt_session_destroy(smelt_session *s) {
  if (!s) return;
  rt_ranks_session_free(s);
  for (int i = 0; s->made && i < s->root->nspecs; i++) {
    if (!s->made[i]) continue;
    s->b = s->root->specs[i];
    s->r = &s->runs[i];
    free_run(s);
  }
  destroy_states(s);
  rt_cuda_session_free_constants(s);
  if (s->dev) rt_cuda_device_destroy(s->dev);
  rt_pool_destroy(s->pool);
  free(s->runs);
  free(s->made);
  free(s->in_ptr);
  free(s->out_ptr);
  free(s->in_bind);
  free(s->out_bind);
  free(s);
}

int smelt_session_num_inputs(const smelt_session *s) { return s->b->g->ninputs; }
int smelt_session_num_outputs(const smelt_session *s) { return s->b->g->noutputs; }

/* A value's name, dtype and shape as its graph gives them (a ranged axis:
 * its extent at the range's max). */
static void value_info(const Value *val, smelt_tensor_info *out) {
  memset(out, 0, sizeof *out);
  out->name = val->name;
  out->dtype = (smelt_dtype)val->type.dt;
  out->rank = val->type.rank;
  for (int i = 0; i < val->type.rank && i < 8; i++) out->dims[i] = val->type.dim[i];
}

/* Before a specialisation is chosen, the dims in which they differ are -1. */
static void tensor_info(const smelt_session *s, bool input, int slot, smelt_tensor_info *out) {
  const Graph *g = s->b->g;
  const Value *val = &g->val[slot_value(g, input, slot)];
  value_info(val, out);
  for (int i = 0; i < val->type.rank && i < 8; i++) {
    /* a ranged axis: its extent in the chosen specialisation's last (or
     * next) run */
    if (val->type.dyn[i]) out->dims[i] = s->r ? ir_type_extent(&val->type, i, s->r->ranges) : -1;
    for (int j = 0; !s->r && j < s->root->nspecs; j++) {
      const Graph *o = s->root->specs[j]->g;
      if (o->val[slot_value(o, input, slot)].type.dim[i] != val->type.dim[i]) out->dims[i] = -1;
    }
  }
}

void smelt_session_input_info(const smelt_session *s, int i, smelt_tensor_info *out_info) {
  tensor_info(s, true, i, out_info);
}

void smelt_session_output_info(const smelt_session *s, int i, smelt_tensor_info *out_info) {
  tensor_info(s, false, i, out_info);
}

/* ---- bundles: tensors without a session ---- */

/* The same in every specialisation (counts, names, dtypes, ranks). */
int smelt_bundle_num_inputs(const smelt_bundle *b) { return b->root->g->ninputs; }
int smelt_bundle_num_outputs(const smelt_bundle *b) { return b->root->g->noutputs; }
int smelt_bundle_num_states(const smelt_bundle *b) { return b->root->g->nstates; }

/* What = 0 inputs, 1 outputs, 2 states: slot i of specialisation spec. */
static smelt_status bundle_info(const smelt_bundle *b, int spec, int what, int i, smelt_tensor_info *out) {
  static const char *const kind[] = {"input", "output", "state"};
  memset(out, 0, sizeof *out);
  const smelt_bundle *r = b->root;
  if (spec < 0 || spec >= r->nspecs)
    return st_error(ST_INVALID_INPUT, "specialisation %d (the bundle has %d)", spec, r->nspecs);
  const Graph *g = r->specs[spec]->g;
  int n = what == 0 ? g->ninputs : what == 1 ? g->noutputs : r->g->nstates;
  if (i < 0 || i >= n) return st_error(ST_INVALID_INPUT, "%s %d (the model has %d)", kind[what], i, n);
  /* states are the root's: every specialisation shares them (smelt.h) */
  value_info(what == 2 ? &r->g->val[r->g->states[i]] : &g->val[slot_value(g, what == 0, i)], out);
  return NULL;
}

smelt_status smelt_bundle_input_info(const smelt_bundle *b, int spec, int i, smelt_tensor_info *out_info) {
  return bundle_info(b, spec, 0, i, out_info);
}
smelt_status smelt_bundle_output_info(const smelt_bundle *b, int spec, int i, smelt_tensor_info *out_info) {
  return bundle_info(b, spec, 1, i, out_info);
}
smelt_status smelt_bundle_state_info(const smelt_bundle *b, int spec, int i, smelt_tensor_info *out_info) {
  return bundle_info(b, spec, 2, i, out_info);
}

/* "x, y" into buf: the names of a list of values, for messages. */
static const char *name_list(const Graph *g, const int *vals, int n, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = 0;
  for (int i = 0; i < n && len + 1 < cap; i++) {
    int w = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", g->val[vals[i]].name);
    if (w < 0) break;
    len += (size_t)w;
  }
  if (n == 0) snprintf(buf, cap, "none");
  return buf;
}

/* Checks size and alignment of memory bound to value v. */
static smelt_status check_binding(const Graph *g, int v, const char *what, const void *data, size_t bytes, size_t want) {
  const Value *val = &g->val[v];
  char ty[128];
  if (bytes != want)
    return st_error(ST_INVALID_INPUT, "%s '%s' is %s (%zu bytes); the bound memory has %zu bytes", what, val->name,
                    ir_type_str(&val->type, ty, sizeof ty), want, bytes);
  if (!data && want > 0) return st_error(ST_INVALID_INPUT, "%s '%s': NULL data", what, val->name);
  /* Kernels load whole elements: memory must be aligned to the element size. */
  if (data && (uintptr_t)data % dt_size(val->type.dt) != 0)
    return st_error(ST_INVALID_INPUT, "%s '%s': the bound memory is not aligned to its %zu-byte elements", what,
                    val->name, dt_size(val->type.dt));
  return NULL;
}

/* Binds every slot of that name (the same value may be listed as an
 * output twice). */
static smelt_status bind(smelt_session *s, bool input, const char *name, const void *data, const Binding *bd) {
  const Graph *g = s->b->g; /* names, dtypes and ranks are the same in every specialisation */
  const int *vals = input ? g->inputs : g->outputs;
  int n = input ? g->ninputs : g->noutputs;
  bool found = false;
  for (int i = 0; name && i < n; i++) {
    if (strcmp(g->val[vals[i]].name, name) != 0) continue;
    if (!found) RETURN_IF_ERROR(check_slot(s, input, i, data, bd));
    if (input) {
      s->in_ptr[i] = data;
      s->in_bind[i] = *bd;
    } else {
      s->out_ptr[i] = (void *)data;
      s->out_bind[i] = *bd;
    }
    found = true;
  }
  if (!found) {
    char list[512];
    return st_error(ST_INVALID_INPUT, "no %s named '%s' (the %ss are: %s)", input ? "input" : "output",
                    name ? name : "(null)", input ? "input" : "output", name_list(g, vals, n, list, sizeof list));
  }
  return NULL;
}

smelt_status smelt_session_bind_input(smelt_session *s, const char *name, const void *data, size_t bytes) {
  Binding bd = {.bytes = bytes, .bound = true};
  RETURN_IF_ERROR(bind(s, true, name, data, &bd));
  return s->peers ? rt_ranks_bind(s, true, name, data, &bd) : NULL;
}

smelt_status smelt_session_bind_input_shaped(smelt_session *s, const char *name, const void *data, int rank,
                                             const int64_t *dims, size_t bytes) {
  Binding bd = {.bytes = bytes, .bound = true, .shaped = true};
  if (rank < 0 || rank > IR_MAX_RANK || (rank > 0 && !dims))
    return st_error(ST_INVALID_INPUT, "input '%s': rank %d (expected 0 to %d, with its dims)", name ? name : "(null)",
                    rank, IR_MAX_RANK);
  bd.shape.rank = rank;
  for (int d = 0; d < rank; d++) {
    if (dims[d] < 0) return st_error(ST_INVALID_INPUT, "input '%s': dim %d is %lld", name ? name : "(null)", d, (long long)dims[d]);
    bd.shape.dim[d] = dims[d];
  }
  RETURN_IF_ERROR(bind(s, true, name, data, &bd));
  return s->peers ? rt_ranks_bind(s, true, name, data, &bd) : NULL;
}

smelt_status smelt_session_bind_output(smelt_session *s, const char *name, void *data, size_t bytes) {
  Binding bd = {.bytes = bytes, .bound = true};
  RETURN_IF_ERROR(bind(s, false, name, data, &bd));
  return s->peers ? rt_ranks_bind(s, false, name, data, &bd) : NULL;
}
/* ---- running, on either device ---- */

void rt_ranged_blocks(const TensorType *t, const int64_t *rv, size_t *count, size_t *run, size_t *full) {
  size_t before = 1, after = dt_size(t->dt);
  int a = 0;
  while (a < t->rank && !t->dyn[a]) a++;
  for (int i = 0; i < a; i++) before *= (size_t)t->dim[i];
  for (int i = a + 1; i < t->rank; i++) after *= (size_t)t->dim[i];
  *count = before;
  *run = (size_t)ir_type_extent(t, a, rv) * after;
  *full = (size_t)t->dim[a] * after;
}

/* Copies between a tensor of type t with the ranges at rv, packed (run),
 * and the same laid out at the max (full). */
static void copy_ranged(const TensorType *t, const int64_t *rv, void *full, const void *run, bool to_full) {
  size_t count, rb, fb;
  rt_ranged_blocks(t, rv, &count, &rb, &fb);
  for (size_t p = 0; p < count; p++) {
    char *f = (char *)full + p * fb;
    char *r = (char *)run + p * rb;
    if (to_full) memcpy(f, r, rb);
    else memcpy(r, f, rb);
  }
}

/* A graph input or output v with a ranged axis runs in a buffer of its own
 * laid out at the max (zeroed once, so that rows beyond a run's are never
 * uninitialised); an input is copied in from data. */
static smelt_status stage(smelt_session *s, int v, const void *data) {
  const Graph *g = s->b->g;
  const Value *val = &g->val[v];
  if (!s->r->own[v]) {
    size_t n = ir_type_bytes(&val->type);
    if (!(s->r->own[v] = rt_aligned_buffer(n))) return st_error(ST_NO_MEMORY, "out of memory: buffer of '%s'", val->name);
    memset(s->r->own[v], 0, n);
  }
  s->r->vptr[v] = s->r->own[v];
  if (data) copy_ranged(&val->type, s->r->ranges, s->r->own[v], data, true);
  return NULL;
}

smelt_status rt_session_prepare(smelt_session *s) {
  return s->peers ? rt_ranks_step(s, RT_STEP_PREPARE, -1) : rt_session_prepare_one(s);
}

smelt_status rt_session_prepare_one(smelt_session *s) {
  RETURN_IF_ERROR(choose(s));
  const smelt_bundle *b = s->b;
  const Graph *g = b->g;
  for (int i = 0; i < g->ninputs; i++)
    if (!s->in_ptr[i] && ir_type_bytes(&g->val[g->inputs[i]].type) > 0)
      return st_error(ST_INVALID_INPUT, "input '%s' is not bound", g->val[g->inputs[i]].name);
  for (int i = 0; i < g->noutputs; i++)
    if (!s->out_ptr[i] && ir_type_bytes(&g->val[g->outputs[i]].type) > 0)
      return st_error(ST_INVALID_INPUT, "output '%s' is not bound", g->val[g->outputs[i]].name);
  /* Bindings made before smelt_session_select chose another
   * specialisation were checked against the ones then possible. */
  for (int i = 0; i < g->ninputs; i++)
    if (s->in_bind[i].bound) RETURN_IF_ERROR(check_against(b, true, i, s->in_ptr[i], &s->in_bind[i]));
  for (int i = 0; i < g->noutputs; i++)
    if (s->out_bind[i].bound) RETURN_IF_ERROR(check_against(b, false, i, s->out_ptr[i], &s->out_bind[i]));
  RETURN_IF_ERROR(check_positions(s));
  if (s->r->cu) return rt_cuda_session_prepare(s);
  /* Outputs first, then inputs and constants over them: a value that is
   * both an input and an output is read from the input, and the output gets
   * a copy in rt_session_finish. */
  for (int i = g->noutputs - 1; i >= 0; i--) {
    int v = g->outputs[i];
    s->r->vptr[v] = s->out_ptr[i];
    if (ir_type_dynamic(&g->val[v].type)) RETURN_IF_ERROR(stage(s, v, NULL));
  }
  for (int i = 0; i < g->ninputs; i++) {
    int v = g->inputs[i];
    s->r->vptr[v] = (void *)s->in_ptr[i];
    if (ir_type_dynamic(&g->val[v].type)) RETURN_IF_ERROR(stage(s, v, s->in_ptr[i]));
  }
  for (int k = 0; k < b->nkernels; k++) {
    const Kernel *kn = &b->kernels[k];
    void **argv = s->r->argv + s->r->argv_at[k];
    for (int a = 0; a < kn->nargs; a++) {
      int v = kn->args[a];
      /* The kernel table's validation guarantees a kernel never writes a
       * constant or an input: their memory is only read. */
      argv[a] = g->val[v].kind == VK_CONST ? g->val[v].data : s->r->vptr[v];
    }
    argv[kn->nargs] = s->r->ranges;
  }
  return NULL;
}

typedef struct {
  RtKernelFn fn;
  void *const *args;
} KernelCall;

static void call_kernel(void *ctx, int64_t begin, int64_t end) {
  const KernelCall *c = ctx;
  c->fn(c->args, begin, end);
}

/* A ranged kernel's tasks (format/kernel.h: KernelRange): [begin, end) of
 * the outer * run * inner tasks this run has, back to back, become the
 * pieces of the kernel's own task space that hold them. */
typedef struct {
  KernelCall call;
  int64_t block, mid_inner; /* run * inner tasks per outer index; mid * inner */
} RangedCall;

static void call_ranged(void *ctx, int64_t begin, int64_t end) {
  const RangedCall *c = ctx;
  while (begin < end) {
    int64_t o = begin / c->block, r = begin % c->block;
    int64_t n = c->block - r < end - begin ? c->block - r : end - begin;
    c->call.fn(c->call.args, o * c->mid_inner + r, o * c->mid_inner + r + n);
    begin += n;
  }
}

smelt_status rt_session_run_kernel(smelt_session *s, int i) {
  return s->peers ? rt_ranks_step(s, RT_STEP_KERNEL, i) : rt_session_run_kernel_one(s, i);
}

smelt_status rt_session_run_kernel_one(smelt_session *s, int i) {
  const Kernel *kn = &s->b->kernels[i];
  if (fmt_kernel_collective(s->b->g, kn)) return rt_ranks_collective(s, i);
  if (s->r->cu) {
    smelt_status st = rt_cuda_launch(s->r->cu->dev, &s->r->cu->launches[i], 1);
    if (!st) st = rt_cuda_sync(s->r->cu->dev);
    return st ? st_prefix(st, "kernel '%s'", kn->name) : NULL;
  }
  KernelCall c = {.fn = s->b->fns[i], .args = s->r->argv + s->r->argv_at[i]};
  double work = kn->bytes + kn->flops;
  const KernelRange *rg = &kn->rg;
  int64_t run = rg->range ? (int64_t)rg->a * s->r->ranges[rg->range - 1] + rg->b : 0;
  if (rg->range && rg->mid > 0) work *= (double)run / (double)rg->mid;
  int max_parts = 0;
  if (work > 0) max_parts = work / RT_WORK_PER_THREAD >= 4096 ? 4096 : (int)(work / RT_WORK_PER_THREAD);
  if (work > 0 && max_parts < 1) max_parts = 1;
  if (!rg->range) {
    rt_pool_parallel_for(s->pool, kn->ntasks, max_parts, call_kernel, &c);
    return NULL;
  }
  /* a ranged dim below its max: only the tasks of the rows this run has */
  RangedCall rc = {.call = c, .block = run * rg->inner, .mid_inner = rg->mid * rg->inner};
  if (rc.block > 0) rt_pool_parallel_for(s->pool, rg->outer * rc.block, max_parts, call_ranged, &rc);
  return NULL;
}

smelt_status rt_session_finish(smelt_session *s) {
  return s->peers ? rt_ranks_step(s, RT_STEP_FINISH, -1) : rt_session_finish_one(s);
}

smelt_status rt_session_finish_one(smelt_session *s) {
  if (s->r->cu) return rt_cuda_session_finish(s);
  const Graph *g = s->b->g;
  for (int i = 0; i < g->noutputs; i++) {
    int v = g->outputs[i];
    const void *src = g->val[v].kind == VK_CONST ? g->val[v].data : s->r->vptr[v];
    if (ir_type_dynamic(&g->val[v].type)) {
      copy_ranged(&g->val[v].type, s->r->ranges, (void *)src, s->out_ptr[i], false);
      continue;
    }
    size_t n = ir_type_bytes(&g->val[v].type);
    if (src != s->out_ptr[i] && n > 0) memmove(s->out_ptr[i], src, n);
  }
  return NULL;
}

smelt_status smelt_session_run(smelt_session *s) {
  if (s->peers) return rt_ranks_step(s, RT_STEP_RUN, -1);
  return s->cuda ? rt_cuda_session_run(s) : rt_session_run_one(s);
}

smelt_status rt_session_run_one(smelt_session *s) {
  RETURN_IF_ERROR(rt_session_prepare_one(s));
  for (int k = 0; k < s->b->nkernels; k++) RETURN_IF_ERROR(rt_session_run_kernel_one(s, k));
  return rt_session_finish_one(s);
}

smelt_status smelt_session_enqueue(smelt_session *s) {
  if (!s) return st_error(ST_INVALID_INPUT, "smelt_session_enqueue: no session");
  if (s->peers && s->cuda) {
    /* checked before any rank queues its graph: the others' collectives
     * would wait for a rank that stopped */
    RETURN_IF_ERROR(rt_cuda_check_enqueue_outputs(s));
    return rt_ranks_step(s, RT_STEP_ENQUEUE, -1);
  }
  return s->cuda ? rt_cuda_session_enqueue(s) : smelt_session_run(s);
}

smelt_status smelt_session_synchronize(smelt_session *s) {
  if (!s) return st_error(ST_INVALID_INPUT, "smelt_session_synchronize: no session");
  if (s->peers && s->cuda) return rt_ranks_step(s, RT_STEP_SYNC, -1);
  return s->cuda && s->r && s->r->cu ? rt_cuda_session_synchronize(s) : NULL;
}

void *rt_session_value_data(const smelt_session *s, int v) {
  const Graph *g = s->b->g;
  if (v < 0 || v >= g->nval || !s->r || s->r->cu) return NULL;
  return g->val[v].kind == VK_CONST ? g->val[v].data : s->r->vptr[v];
}

smelt_status rt_session_read_value(smelt_session *s, int v, const void **out_data) {
  *out_data = NULL;
  const Graph *g = s->b->g;
  if (v < 0 || v >= g->nval || !s->r) return NULL;
  if (!s->r->cu || g->val[v].kind == VK_CONST) {
    *out_data = g->val[v].kind == VK_CONST ? g->val[v].data : s->r->vptr[v];
    return NULL;
  }
  CudaState *cu = s->r->cu;
  if (!cu->dptr[v]) return NULL;
  size_t n = ir_type_bytes(&g->val[v].type);
  if (!cu->mirror[v] && !(cu->mirror[v] = malloc(n ? n : 1)))
    return st_error(ST_NO_MEMORY, "out of memory reading '%s'", g->val[v].name);
  smelt_status st = rt_cuda_download(cu->dev, cu->mirror[v], cu->dptr[v], n);
  if (st) return st_prefix(st, "reading '%s' from the device", g->val[v].name);
  *out_data = cu->mirror[v];
  return NULL;
}

const smelt_bundle *rt_session_bundle(const smelt_session *s) { return s->b; }
int rt_session_threads(const smelt_session *s) { return s->pool ? rt_pool_threads(s->pool) : 0; }
