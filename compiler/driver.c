/* The compile driver: optimised graph → kernels → machine code → bundle.
 *
 * sc_compile_graph is the whole back half of the compiler written out step
 * by step: make sure every live node is in a group (one per node when the
 * fuse pass formed none), lower the groups to Kernels (codegen/lower.c),
 * then for each target: compile them all into one object for the CPU
 * (codegen/llvm), and/or generate CUDA C for them (codegen/cuda) and compile
 * every unit with NVRTC for every requested arch; and write the bundle's
 * sections: a manifest recording how it was built, the final IR as text,
 * the serialised graph (groups, memory plan and every constant), the kernel
 * table, the CPU object, the CUDA launch table, sources, cubins and PTX.
 * Both targets share one graph and one kernel table, so a bundle for
 * cpu,cuda runs the same kernels, in the same order, on either device.
 * smelt_compile puts the front end and the pass pipeline in front of it;
 * the pass context carries the targets, because the fuse pass's budget is
 * the target's on-chip memory.
 *
 */
#define _DEFAULT_SOURCE /* MAP_POPULATE, realpath */
#include "ir/bytes.h"
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cg_cuda.h"
#include "codegen/cuda/table.h"
#include "codegen/llvm/cg_llvm.h"
#include "codegen/lower.h"
#include "frontend/frontend.h"
#include "ir/clock.h"
#include "ir/serialize.h"
#include "passes/passes.h"
#include "runtime/cuda_driver.h"
#include "compiler/cache.h"
#include "compiler/cpu_target.h"
#include "compiler/driver.h"
#include "format/constants.h"
#include "format/cuda_launch.h"
#include "format/kernel_table.h"
#include "format/parallel.h"
#include "format/weights.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the kernel table is written in host order, which must be little-endian"
#endif

#ifndef SMELT_LLVM_VERSION
#define SMELT_LLVM_VERSION "none"
#endif

/* ---- compiling ---- */

/* Manifest values are one line each. */
static void put_kv(ByteBuf *b, const char *key, const char *value) {
  bb_printf(b, "%s=", key);
  for (const char *s = value ? value : ""; *s; s++) {
    char c = *s == '\n' || *s == '\r' ? ' ' : *s;
    bb_put(b, &c, 1);
  }
  bb_put(b, "\n", 1);
}

/* From cg_llvm_compile's description "LLVM 14.0.6 TRIPLE cpu=CPU ...", the
 * word after "LLVM x.y.z" and the value of cpu=. */
static void parse_desc(const char *desc, char *triple, size_t tcap, char *cpu, size_t ccap) {
  snprintf(triple, tcap, "unknown");
  snprintf(cpu, ccap, "unknown");
  const char *s = desc;
  if (strncmp(s, "LLVM ", 5) == 0) {
    s += 5;
    s += strcspn(s, " ");
    s += strspn(s, " ");
    size_t n = strcspn(s, " ");
    if (n > 0 && n < tcap) snprintf(triple, tcap, "%.*s", (int)n, s);
  }
  const char *c = strstr(desc, "cpu=");
  if (c) {
    c += 4;
    size_t n = strcspn(c, " ");
    if (n > 0 && n < ccap) snprintf(cpu, ccap, "%.*s", (int)n, c);
  }
}

smelt_status sc_parse_targets(const char *targets, bool *out_cpu, bool *out_cuda) {
  *out_cpu = *out_cuda = false;
  if (!targets || strcmp(targets, "cpu") == 0) *out_cpu = true;
  else if (strcmp(targets, "cuda") == 0) *out_cuda = true;
  else if (strcmp(targets, "cpu,cuda") == 0 || strcmp(targets, "cuda,cpu") == 0) *out_cpu = *out_cuda = true;
  else return st_error(ST_INVALID_INPUT, "unknown target '%s' (expected cpu, cuda or cpu,cuda)", targets);
  return NULL;
}

/* Splits an arch list into at most FMT_MAX_CUDA_ARCHS names; returns the
 * count, or -1 when the list is bad (*why says how). */
static int split_archs(const char *archs, char out[FMT_MAX_CUDA_ARCHS][16], const char **why) {
  int n = 0;
  *why = NULL;
  if (!archs || !*archs) {
    *why = "empty";
    return -1;
  }
  for (const char *p = archs;;) {
    size_t len = strcspn(p, ",");
    int cc;
    bool specific;
    if (n == FMT_MAX_CUDA_ARCHS) {
      *why = "too many archs";
      return -1;
    }
    if (len == 0 || len >= 16) {
      *why = "an empty or overlong name";
      return -1;
    }
    snprintf(out[n], 16, "%.*s", (int)len, p);
    /* cubins are for real archs: "compute_XY" names only a PTX target */
    if (strncmp(out[n], "sm_", 3) != 0 || !ir_cuda_parse_arch(out[n], &cc, &specific) || cc < 50) {
      *why = "not an arch name like sm_90a or sm_80";
      return -1;
    }
    for (int i = 0; i < n; i++)
      if (strcmp(out[i], out[n]) == 0) {
        *why = "an arch named twice";
        return -1;
      }
    n++;
    if (!p[len]) break;
    p += len + 1;
  }
  return n;
}

smelt_status sc_check_archs(const char *archs) {
  char list[FMT_MAX_CUDA_ARCHS][16];
  const char *why;
  if (split_archs(archs, list, &why) < 0)
    return st_error(ST_INVALID_INPUT, "--arch '%s': %s (expected a list like sm_90a,sm_80)", archs ? archs : "", why);
  return NULL;
}

void sc_cuda_default_arch(char *out, size_t cap) {
  snprintf(out, cap, "sm_90a");
  RtCudaDevice *d;
  smelt_status st = rt_cuda_device_create(0, &d);
  if (st) {
    st_free(st);
    return;
  }
  snprintf(out, cap, "%s", rt_cuda_device_info(d)->arch);
  rt_cuda_device_destroy(d);
}

/* Names every group after its kernel when the fuse pass left it unnamed,
 * so the IR text in the bundle says which kernel each group became. */
static void name_groups(Graph *g, const Kernel *k, int nk) {
  for (int i = 0; i < nk; i++)
    if (!g->groups[k[i].group].kernel) g->groups[k[i].group].kernel = ir_graph_strdup(g, k[i].name);
}

/* What the CUDA target adds to a bundle. */
typedef struct {
  FmtCudaModule *m;
  CgCudaBinary *bins; /* m->nunits * narch: unit u for arch a at u * narch + a */
  int narch;
  char arch[FMT_MAX_CUDA_ARCHS][16];
  char *launch;       /* the launch table */
  size_t launch_len;
  char nvrtc[32];     /* NVRTC's version */
} CudaBuild;

static void cuda_build_free(CudaBuild *c) {
  if (c->m) cg_cuda_binaries_free(c->bins, c->m->nunits * c->narch);
  fmt_cuda_module_free(c->m);
  free(c->launch);
  memset(c, 0, sizeof *c);
}

/* Generates the CUDA C of every kernel and compiles each unit for each
 * arch with NVRTC (in parallel, through the disk cache). */
static smelt_status build_cuda(const Graph *g, const Kernel *k, int nk, const char *archs, const CgTuneTable *table,
                               const ScCompileOptions *o, CudaBuild *c) {
  const char *why;
  c->narch = split_archs(archs, c->arch, &why);
  if (c->narch < 0) {
    c->narch = 0;
    return st_error(ST_INVALID_INPUT, "--arch '%s': %s", archs, why);
  }
  /* Sessions give every argument 64-byte alignment (cuMemAlloc'd buffers,
   * 64-byte arena offsets, aligned user memory or else a staging copy), so
   * the kernels need no run-time alignment test. */
  CgCudaOptions co = {.args_aligned = true, .table = table, .log = o->log, .log_ctx = o->log_ctx,
                      .allow_tf32 = o->allow_tf32};
  /* Variants are chosen for one arch; for several, only those every
   * sm_80+ GPU runs (the same source is compiled for each). */
  if (c->narch == 1) co.arch = c->arch[0];
  double t0 = smelt_now_s();
  RETURN_IF_ERROR(cg_cuda_generate(g, k, nk, &co, &c->m));
  double t1 = smelt_now_s();
  CgNvrtc *nv;
  smelt_status st = cg_cuda_nvrtc_open(&nv);
  if (st) return st_prefix(st, "--target cuda: NVRTC compiles the kernels");
  snprintf(c->nvrtc, sizeof c->nvrtc, "%s", cg_cuda_nvrtc_version(nv));
  const char *av[FMT_MAX_CUDA_ARCHS];
  for (int a = 0; a < c->narch; a++) av[a] = c->arch[a];
  st = cg_cuda_compile_module(nv, c->m, av, c->narch, NULL, &c->bins);
  cg_cuda_nvrtc_close(nv);
  if (o->times) {
    o->times->cuda_gen_s += t1 - t0;
    o->times->nvrtc_s += smelt_now_s() - t1;
  }
  if (st) {
    c->bins = NULL;
    return st;
  }
  return fmt_cuda_launch_encode(c->m, &c->launch, &c->launch_len);
}

/* ---- specialisations ---- */

void sc_dim_space_free(ScDimSpace *d) {
  for (int i = 0; i < d->ndims; i++) {
    free(d->name[i]);
    free(d->value[i]);
    free(d->vmax[i]);
  }
  memset(d, 0, sizeof *d);
}

/* One "NAME=V[,V...]" item of a dims text into d. */
static smelt_status parse_dim_item(char *item, ScDimSpace *d) {
  char *eq = strchr(item, '=');
  if (!eq || eq == item) return st_error(ST_INVALID_INPUT, "dims '%s': expected NAME=VALUE[,VALUE...]", item);
  *eq = 0;
  const char *name = item, *list = eq + 1;
  for (int i = 0; i < d->ndims; i++)
    if (strcmp(d->name[i], name) == 0)
      return st_error(ST_INVALID_INPUT, "dims: '%s' is given twice (list its values in one: %s=A,B,...)", name, name);
  if (d->ndims == SC_MAX_DIMS) return st_error(ST_INVALID_INPUT, "dims: more than %d names", SC_MAX_DIMS);
  int n = 1;
  for (const char *s = list; *s; s++) n += *s == ',';
  if (n > FMT_MAX_SPECIALISATIONS)
    return st_error(ST_INVALID_INPUT, "dims '%s=%s': %d values; a bundle holds at most %d specialisations", name, list,
                    n, FMT_MAX_SPECIALISATIONS);
  int64_t *vals = calloc((size_t)n, sizeof *vals), *vmax = calloc((size_t)n, sizeof *vmax);
  char *nm = strdup(name);
  if (!vals || !vmax || !nm) {
    free(vals);
    free(vmax);
    free(nm);
    return st_error(ST_NO_MEMORY, "out of memory parsing dims");
  }
  const char *p = list;
  for (int k = 0; k < n; k++) {
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10), hi = v;
    smelt_status st = NULL;
    if (!errno && end != p && end[0] == '.' && end[1] == '.') {
      /* a range A..B */
      const char *q = end + 2;
      hi = strtoll(q, &end, 10);
      if (errno || end == q) end = (char *)p; /* reported below */
      else if (hi <= v)
        st = st_error(ST_INVALID_INPUT, "dims '%s=%s': the range %lld..%lld is empty (write one value for an exact dim)",
                      name, list, v, hi);
    }
    if (!st && (errno || end == p || (*end && *end != ',')))
      st = st_error(ST_INVALID_INPUT, "dims '%s=%s': '%.*s' is not an integer or a range A..B", name, list,
                    (int)strcspn(p, ","), p);
    for (int j = 0; j < k && !st; j++)
      if (vals[j] <= hi && v <= vmax[j])
        st = st_error(ST_INVALID_INPUT, "dims '%s=%s': %lld is listed twice", name, list, v > vals[j] ? v : vals[j]);
    if (st) {
      free(vals);
      free(vmax);
      free(nm);
      return st;
    }
    vals[k] = v;
    vmax[k] = hi;
    p = *end ? end + 1 : end;
  }
  d->name[d->ndims] = nm;
  d->vmax[d->ndims] = vmax;
  d->value[d->ndims] = vals;
  d->nvalues[d->ndims++] = n;
  return NULL;
}

smelt_status sc_dim_space_parse(const char *text, ScDimSpace *out) {
  memset(out, 0, sizeof *out);
  out->ncombos = 1;
  if (!text || !*text) return NULL;
  char *copy = strdup(text);
  if (!copy) return st_error(ST_NO_MEMORY, "out of memory parsing dims");
  smelt_status st = NULL;
  char *save = NULL;
  for (char *item = strtok_r(copy, ";", &save); item && !st; item = strtok_r(NULL, ";", &save))
    st = parse_dim_item(item, out);
  free(copy);
  /* The product is bounded as it grows, so it cannot overflow. */
  int64_t combos = 1;
  for (int i = 0; i < out->ndims && !st; i++) {
    combos *= out->nvalues[i];
    if (combos > FMT_MAX_SPECIALISATIONS) {
      ByteBuf why = {0};
      for (int j = 0; j < out->ndims; j++)
        if (out->nvalues[j] > 1) bb_printf(&why, "%s%d values of %s", why.len ? " x " : "", out->nvalues[j], out->name[j]);
      bb_put(&why, "", 1);
      st = st_error(ST_INVALID_INPUT, "dims '%s': %s make more than %d specialisations, the most a bundle holds", text,
                    why.oom ? "the values" : (const char *)why.p, FMT_MAX_SPECIALISATIONS);
      free(why.p);
    }
  }
  if (st) {
    sc_dim_space_free(out);
    return st;
  }
  out->ncombos = (int)combos;
  return NULL;
}

/* Combination i counts like a number whose digits are the dims' value
 * indices, the first dim the most significant. */
static int combo_digit(const ScDimSpace *d, int i, int dim) {
  for (int j = d->ndims - 1; j > dim; j--) i /= d->nvalues[j];
  return i % d->nvalues[dim];
}

void sc_dim_space_combo(const ScDimSpace *d, int i, FeDim *out_dims) {
  for (int k = 0; k < d->ndims; k++) {
    out_dims[k].name = d->name[k];
    out_dims[k].value = d->value[k][combo_digit(d, i, k)];
    out_dims[k].max = d->vmax[k][combo_digit(d, i, k)];
    if (out_dims[k].max == out_dims[k].value) out_dims[k].max = 0;
  }
}

void sc_dim_space_label(const ScDimSpace *d, int i, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = 0;
  for (int k = 0; k < d->ndims && len < cap; k++) {
    if (d->nvalues[k] < 2) continue;
    int c = combo_digit(d, i, k);
    int w = d->vmax[k][c] > d->value[k][c]
                ? snprintf(buf + len, cap - len, "%s%s=%lld..%lld", len ? " " : "", d->name[k],
                           (long long)d->value[k][c], (long long)d->vmax[k][c])
                : snprintf(buf + len, cap - len, "%s%s=%lld", len ? " " : "", d->name[k], (long long)d->value[k][c]);
    if (w < 0) break;
    len += (size_t)w;
  }
}

/* ---- building a bundle ---- */

static smelt_status build_manifest(const ScSpecGraph *specs, int nspecs, const ScCompileOptions *o, const char *desc,
                                   const char *triple, const ScCpuTargets *cpu, const CudaBuild *cu, const int *nk,
                                   ByteBuf *m) {
  const Graph *g = specs[0].g;
  char num[32];
  put_kv(m, "smelt_version", SMELT_LIB_VERSION);
  snprintf(num, sizeof num, "%d", FMT_BUNDLE_VERSION);
  put_kv(m, "bundle_format", num);
  snprintf(num, sizeof num, "%d", IR_SERIAL_VERSION);
  put_kv(m, "graph_format", num);
  snprintf(num, sizeof num, "%d", FMT_KERNEL_TABLE_VERSION);
  put_kv(m, "kernel_table_format", num);
  put_kv(m, "model", o->model ? o->model : g->file);
  put_kv(m, "graph", g->name);
  put_kv(m, "targets", o->targets ? o->targets : "cpu");
  put_kv(m, "dims", o->dims);
  put_kv(m, "dtype", o->dtype);
  put_kv(m, "passes", o->passes ? o->passes : pass_default_pipeline());
  put_kv(m, "external_weights", o->external_weights ? "1" : "0");
  if (o->quantize) put_kv(m, "quantize", o->quantize);
  snprintf(num, sizeof num, "%lld", (long long)o->onchip_bytes);
  put_kv(m, "onchip_bytes", num);
  snprintf(num, sizeof num, "%d", o->threads);
  put_kv(m, "threads", num);
  put_kv(m, "llvm_version", SMELT_LLVM_VERSION);
  if (desc) {
    put_kv(m, "cpu_triple", triple);
    ByteBuf names = {0};
    for (int i = 0; i < cpu->n; i++) bb_printf(&names, "%s%s", i ? "," : "", cpu->v[i].name);
    bb_put(&names, "", 1);
    put_kv(m, "cpu", names.oom ? "" : (const char *)names.p);
    free(names.p);
    put_kv(m, "cpu_codegen", desc);
    /* what each variant's code may use: the runtime checks it before loading */
    for (int i = 0; i < cpu->n; i++) {
      char key[96];
      snprintf(key, sizeof key, "cpu_features:%s", cpu->v[i].name);
      put_kv(m, key, cpu->v[i].needs);
    }
  }
  if (cu && cu->m) {
    ByteBuf archs = {0};
    for (int a = 0; a < cu->narch; a++) bb_printf(&archs, "%s%s", a ? "," : "", cu->arch[a]);
    bb_put(&archs, "", 1);
    put_kv(m, "cuda_archs", archs.oom ? "" : (const char *)archs.p);
    free(archs.p);
    put_kv(m, "nvrtc_version", cu->nvrtc);
    put_kv(m, "tune_table", o->tune_table);
    put_kv(m, "allow_tf32", o->allow_tf32 ? "1" : "0");
  }
  /* Per specialisation, in index order, comma-separated when several. */
  ByteBuf kn = {0}, arena = {0}, units = {0};
  for (int i = 0; i < nspecs; i++) {
    bb_printf(&kn, "%s%d", i ? "," : "", nk[i]);
    bb_printf(&arena, "%s%lld", i ? "," : "", (long long)specs[i].g->arena_bytes);
    bb_printf(&units, "%s%d", i ? "," : "", cu[i].m ? cu[i].m->nunits : 0);
  }
  bb_put(&kn, "", 1);
  bb_put(&arena, "", 1);
  bb_put(&units, "", 1);
  bool oom = kn.oom || arena.oom || units.oom;
  if (!oom && cu && cu->m) put_kv(m, "cuda_units", (const char *)units.p);
  if (!oom) put_kv(m, "kernels", (const char *)kn.p);
  if (!oom) put_kv(m, "arena_bytes", (const char *)arena.p);
  if (nspecs > 1) {
    snprintf(num, sizeof num, "%d", nspecs);
    put_kv(m, "specialisations", num);
  }
  if (o->tp > 1) { /* the runtime runs one session per rank (runtime/ranks.c) */
    snprintf(num, sizeof num, "%d", o->tp);
    put_kv(m, "tp", num);
    if (specs[0].tp_states) put_kv(m, "tp_states", specs[0].tp_states);
  }
  free(kn.p);
  free(arena.p);
  free(units.p);
  return oom || m->oom ? st_error(ST_NO_MEMORY, "out of memory writing the manifest") : NULL;
}

/* ---- constants: the shared blob and external weights ---- */

/* A weights file that external constants come from, mapped while the
 * bundle is built: to hash it and to confirm each constant's provenance. */
typedef struct {
  char *opened;  /* the path the frontend opened (IrCopy.file) */
  char *name;    /* as the model names it */
  char *abs;     /* realpath */
  unsigned char *map;
  size_t size;
  uint32_t crc;
} WFile;

/* What every specialisation's constants go into. */
typedef struct {
  FmtConstPool *pool;
  bool external;     /* --external-weights */
  WFile *files;
  int nfiles;
  FmtWeights w;      /* the table being built (files filled at the end) */
  int cap_t, cap_c;
  const IrSource **tsrc; /* per external tensor: the provenance it was made from (dedup) */
  uint64_t embedded_bytes, external_bytes; /* what the constants of all specialisations add up to */
} ConstCtx;

static void const_ctx_free(ConstCtx *c) {
  fmt_const_pool_destroy(c->pool);
  for (int i = 0; i < c->nfiles; i++) {
    if (c->files[i].map && c->files[i].size) munmap(c->files[i].map, c->files[i].size);
    free(c->files[i].opened);
    free(c->files[i].name);
    free(c->files[i].abs);
  }
  free(c->files);
  for (int i = 0; i < c->w.nfiles; i++) c->w.files[i].name = c->w.files[i].path = NULL; /* c->files' strings */
  free(c->w.files);
  free(c->w.tensors);
  free(c->w.copies);
  free(c->tsrc);
  memset(c, 0, sizeof *c);
}

/* The weights file the frontend opened at `opened`, mapped and hashed on
 * first use; -1 (with *out_st) when it cannot be read. */
static int weights_file(ConstCtx *c, const char *opened, const char *name, smelt_status *out_st) {
  *out_st = NULL;
  for (int i = 0; i < c->nfiles; i++)
    if (strcmp(c->files[i].opened, opened) == 0) return i;
  WFile *f = realloc(c->files, sizeof *f * (size_t)(c->nfiles + 1));
  if (!f) {
    *out_st = st_error(ST_NO_MEMORY, "out of memory");
    return -1;
  }
  c->files = f;
  f = &c->files[c->nfiles];
  memset(f, 0, sizeof *f);
  char abs[PATH_MAX];
  int fd = open(opened, O_RDONLY);
  struct stat sb;
  if (fd < 0 || fstat(fd, &sb) < 0 || !realpath(opened, abs)) {
    *out_st = st_error(ST_IO, "%s: error: cannot read the weights file again: %s", opened, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  f->size = (size_t)sb.st_size;
  if (f->size) {
    void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
      *out_st = st_error(ST_IO, "%s: error: cannot map: %s", opened, strerror(errno));
      close(fd);
      return -1;
    }
    f->map = p;
  }
  close(fd);
  f->opened = strdup(opened);
  f->name = strdup(name ? name : opened);
  f->abs = strdup(abs);
  f->crc = fmt_crc32c_parallel(f->map, f->size);
  c->nfiles++;
  if (!f->opened || !f->name || !f->abs) *out_st = st_error(ST_NO_MEMORY, "out of memory");
  return *out_st ? -1 : c->nfiles - 1;
}

/* Whether v's bytes really are what its provenance says: every copy inside
 * its file and the constant, the copies adding up to the constant's size,
 * and each copied byte equal.  A pass that rewrote the constant in place
 * (layout's transpose) without dropping the provenance fails here, and the
 * constant is stored in the bundle instead. */
static bool source_confirmed(ConstCtx *c, const Value *v, int *fidx, smelt_status *out_st) {
  *out_st = NULL;
  const IrSource *src = v->source;
  uint64_t nbytes = ir_type_bytes(&v->type), total = 0;
  const unsigned char *data = v->data;
  for (int k = 0; k < src->ncopies; k++) {
    const IrCopy *cp = &src->copies[k];
    int fi = weights_file(c, cp->file, cp->name, out_st);
    if (fi < 0) return false;
    fidx[k] = fi;
    const WFile *f = &c->files[fi];
    if (!cp->rows || !cp->cols || !cp->elem) continue;
    uint64_t bytes = cp->rows * cp->cols * cp->elem;
    uint64_t src_end = cp->src + (cp->rows - 1) * cp->src_row + (cp->cols - 1) * cp->src_col + cp->elem;
    uint64_t dst_end = cp->dst + (cp->rows - 1) * cp->dst_row + (cp->cols - 1) * cp->dst_col + cp->elem;
    if (src_end > f->size || dst_end > nbytes) return false;
    total += bytes;
    for (uint64_t r = 0; r < cp->rows; r++) {
      const unsigned char *fs = f->map + cp->src + r * cp->src_row;
      const unsigned char *ds = data + cp->dst + r * cp->dst_row;
      if (cp->cols == 1 || (cp->src_col == cp->elem && cp->dst_col == cp->elem)) {
        if (memcmp(fs, ds, (size_t)(cp->cols * cp->elem)) != 0) return false;
        continue;
      }
      for (uint64_t q = 0; q < cp->cols; q++)
        if (memcmp(fs + q * cp->src_col, ds + q * cp->dst_col, (size_t)cp->elem) != 0) return false;
    }
  }
  return total == nbytes;
}

static bool same_source(const IrSource *a, const IrSource *b) {
  if (a->ncopies != b->ncopies) return false;
  for (int k = 0; k < a->ncopies; k++) {
    const IrCopy *x = &a->copies[k], *y = &b->copies[k];
    if (strcmp(x->file, y->file) || x->src != y->src || x->dst != y->dst || x->rows != y->rows || x->cols != y->cols ||
        x->elem != y->elem || x->src_row != y->src_row || x->src_col != y->src_col || x->dst_row != y->dst_row ||
        x->dst_col != y->dst_col)
      return false;
  }
  return true;
}

/* Adds v as an external tensor (or finds it among those added). */
static smelt_status add_external(ConstCtx *c, const Value *v, const int *fidx, uint64_t *out_index) {
  for (int i = 0; i < c->w.ntensors; i++)
    if (c->w.tensors[i].nbytes == ir_type_bytes(&v->type) && same_source(c->tsrc[i], v->source)) {
      *out_index = (uint64_t)i;
      return NULL;
    }
  if (c->w.ntensors == c->cap_t) {
    int cap = c->cap_t ? 2 * c->cap_t : 64;
    FmtWeightsTensor *t = realloc(c->w.tensors, sizeof *t * (size_t)cap);
    if (t) c->w.tensors = t;
    const IrSource **ts = realloc(c->tsrc, sizeof *ts * (size_t)cap);
    if (ts) c->tsrc = ts;
    if (!t || !ts) return st_error(ST_NO_MEMORY, "out of memory");
    c->cap_t = cap;
  }
  int nc = v->source->ncopies;
  if (c->w.ncopies + nc > c->cap_c) {
    int cap = c->cap_c ? 2 * c->cap_c : 64;
    while (cap < c->w.ncopies + nc) cap *= 2;
    FmtWeightsCopy *cp = realloc(c->w.copies, sizeof *cp * (size_t)cap);
    if (!cp) return st_error(ST_NO_MEMORY, "out of memory");
    c->w.copies = cp;
    c->cap_c = cap;
  }
  for (int k = 0; k < nc; k++) {
    const IrCopy *x = &v->source->copies[k];
    c->w.copies[c->w.ncopies + k] = (FmtWeightsCopy){(uint32_t)fidx[k], x->src, x->dst, x->rows, x->cols, x->elem,
                                                     x->src_row, x->src_col, x->dst_row, x->dst_col};
  }
  c->w.tensors[c->w.ntensors] = (FmtWeightsTensor){ir_type_bytes(&v->type), (uint32_t)c->w.ncopies, (uint32_t)nc};
  c->tsrc[c->w.ntensors] = v->source;
  c->w.ncopies += nc;
  *out_index = (uint64_t)c->w.ntensors++;
  return NULL;
}

/* The graph serialiser's sink (ir/serialize.h): external when asked for
 * and the provenance holds, else into the shared blob. */
static smelt_status put_constant(void *ctx, const Graph *g, int v, IrConstRef *out_ref) {
  ConstCtx *c = ctx;
  const Value *val = &g->val[v];
  size_t n = ir_type_bytes(&val->type);
  if (c->external && val->source && val->source->ncopies > 0 && val->source->ncopies <= 64) {
    int fidx[64];
    smelt_status st;
    bool ok = source_confirmed(c, val, fidx, &st);
    if (st) return st;
    if (ok) {
      out_ref->where = IR_CONST_EXTERN;
      c->external_bytes += n;
      return add_external(c, val, fidx, &out_ref->index);
    }
  }
  out_ref->where = IR_CONST_BLOB;
  c->embedded_bytes += n;
  return fmt_const_pool_add(c->pool, val->data, n, &out_ref->index);
}

/* The weights section, when any constant is external. */
static smelt_status add_weights_section(ConstCtx *c, FmtWriter *w) {
  if (c->w.ntensors == 0) return NULL;
  c->w.files = calloc((size_t)c->nfiles, sizeof *c->w.files);
  if (!c->w.files) return st_error(ST_NO_MEMORY, "out of memory");
  c->w.nfiles = c->nfiles;
  for (int i = 0; i < c->nfiles; i++)
    c->w.files[i] = (FmtWeightsFile){c->files[i].name, c->files[i].abs, c->files[i].size, c->files[i].crc};
  void *buf;
  size_t len;
  RETURN_IF_ERROR(fmt_weights_encode(&c->w, &buf, &len));
  smelt_status st = fmt_writer_take(w, FMT_SEC_WEIGHTS, NULL, &buf, len);
  free(buf);
  return st;
}

/* One specialisation's compiled form, before it is written. */
typedef struct {
  Kernel *k;
  int nk;
  void *obj[SC_MAX_CPU_VARIANTS], *graph_bytes, *table;
  size_t obj_len[SC_MAX_CPU_VARIANTS], graph_len, table_len;
  char *desc, *ir_text; /* desc: of the first CPU variant */
  char triple[40];
  CudaBuild cu;
} SpecBuild;

static void spec_build_free(SpecBuild *s) {
  cuda_build_free(&s->cu);
  free(s->table);
  free(s->graph_bytes);
  free(s->ir_text);
  free(s->desc);
  for (int i = 0; i < SC_MAX_CPU_VARIANTS; i++) free(s->obj[i]);
  cg_kernels_free(s->k, s->nk);
  memset(s, 0, sizeof *s);
}

/* Lowers g and generates code for the targets: the back half of the
 * compiler for one specialisation. */
static smelt_status build_spec(Graph *g, const ScCompileOptions *o, const ScCpuTargets *cpu, bool cuda,
                               const char *archs, const CgTuneTable *table, ConstCtx *cc, SpecBuild *s) {
  ScCompileTimes unused = {0}, *tm = o->times ? o->times : &unused;
  double t0 = smelt_now_s();
  if (g->ngroups == 0) RETURN_IF_ERROR(cg_single_node_groups(g));
  RETURN_IF_ERROR(cg_lower(g, &s->k, &s->nk));
  name_groups(g, s->k, s->nk);
  double t1 = smelt_now_s();
  tm->lower_s += t1 - t0;
  for (int i = 0; i < cpu->n; i++) {
#ifdef SMELT_HAVE_LLVM
    CgLlvmOptions lo = {.cpu = cpu->v[i].llvm_cpu, .features = cpu->v[i].features};
    char *desc = NULL;
    RETURN_IF_ERROR(cg_llvm_compile(g, s->k, s->nk, &lo, &s->obj[i], &s->obj_len[i], &desc));
    if (i == 0) s->desc = desc;
    else free(desc);
#endif
  }
  tm->cpu_s += smelt_now_s() - t1;
  char cpu_name[40];
  if (cpu->n) parse_desc(s->desc ? s->desc : "", s->triple, sizeof s->triple, cpu_name, sizeof cpu_name);
  /* A model without kernels (its outputs are inputs or constants) has no
   * CUDA code; sessions need none. */
  if (cuda && s->nk > 0) RETURN_IF_ERROR(build_cuda(g, s->k, s->nk, archs, table, o, &s->cu));
  t0 = smelt_now_s();
  if (!(s->ir_text = ir_print_str(g))) return st_error(ST_NO_MEMORY, "out of memory printing the IR");
  /* the kernels' arguments are kept whatever the graph says (they are live
   * nodes' operands, but the bundle must not depend on that) */
  bool *keep = calloc((size_t)(g->nval ? g->nval : 1), sizeof *keep);
  if (!keep) return st_error(ST_NO_MEMORY, "out of memory");
  for (int i = 0; i < s->nk; i++)
    for (int a = 0; a < s->k[i].nargs; a++)
      if (s->k[i].args[a] >= 0 && s->k[i].args[a] < g->nval) keep[s->k[i].args[a]] = true;
  IrConstSink sink = {.put = put_constant, .ctx = cc, .keep = keep};
  smelt_status st = ir_graph_serialize(g, &sink, &s->graph_bytes, &s->graph_len);
  free(keep);
  tm->graph_s += smelt_now_s() - t0;
  RETURN_IF_ERROR(st);
  return fmt_kernel_table_encode(s->k, s->nk, &s->table, &s->table_len);
}

/* A section name under a specialisation's prefix ("" or "s3/"). */
static const char *prefixed(char *buf, size_t cap, const char *prefix, const char *name) {
  snprintf(buf, cap, "%s%s", prefix, name);
  return buf;
}

static smelt_status add_cuda_sections(FmtWriter *w, const CudaBuild *c, const char *prefix) {
  char name[FMT_SECTION_NAME_BYTES], rel[FMT_SECTION_NAME_BYTES];
  RETURN_IF_ERROR(fmt_writer_add(w, FMT_SEC_CUDA_LAUNCH, prefix, c->launch, c->launch_len));
  for (int u = 0; u < c->m->nunits; u++) {
    snprintf(rel, sizeof rel, "u%d", u);
    RETURN_IF_ERROR(fmt_writer_add(w, FMT_SEC_CUDA_SOURCE, prefixed(name, sizeof name, prefix, rel),
                                         c->m->units[u], strlen(c->m->units[u])));
    for (int a = 0; a < c->narch; a++) {
      const CgCudaBinary *bin = &c->bins[u * c->narch + a];
      snprintf(rel, sizeof rel, "%s/u%d", c->arch[a], u);
      prefixed(name, sizeof name, prefix, rel);
      RETURN_IF_ERROR(fmt_writer_add(w, FMT_SEC_CUBIN, name, bin->cubin, bin->cubin_len));
      /* with its NUL: the driver's JIT takes PTX as a C string */
      if (bin->ptx) RETURN_IF_ERROR(fmt_writer_add(w, FMT_SEC_PTX, name, bin->ptx, bin->ptx_len + 1));
    }
  }
  return NULL;
}

static smelt_status add_spec_sections(FmtWriter *w, SpecBuild *s, const char *prefix, const ScCpuTargets *cpu) {
  RETURN_IF_ERROR(fmt_writer_add(w, FMT_SEC_IR_TEXT, prefix, s->ir_text, strlen(s->ir_text)));
  RETURN_IF_ERROR(fmt_writer_take(w, FMT_SEC_GRAPH, prefix, &s->graph_bytes, s->graph_len));
  RETURN_IF_ERROR(fmt_writer_add(w, FMT_SEC_KERNELS, prefix, s->table, s->table_len));
  for (int i = 0; i < cpu->n; i++) {
    /* "TRIPLE/CPU", most capable variant first (the loader takes the first
     * that runs); the names fit the section table (checked in build_bundle) */
    char name[FMT_SECTION_NAME_BYTES + 96];
    snprintf(name, sizeof name, "%s%s/%s", prefix, s->triple, cpu->v[i].name);
    RETURN_IF_ERROR(fmt_writer_add(w, FMT_SEC_CPU_OBJECT, name, s->obj[i], s->obj_len[i]));
  }
  if (s->cu.m) RETURN_IF_ERROR(add_cuda_sections(w, &s->cu, prefix));
  return NULL;
}

/* The specialisation index (driver.h): a header line, then per
 * specialisation its prefix, label and input signature, tab-separated.
 * Two specialisations that take the same inputs could not be told apart
 * when running, so that is an error here already. */
static smelt_status build_index(const ScSpecGraph *specs, int n, ByteBuf *out) {
  char **sig = calloc((size_t)n, sizeof *sig);
  if (!sig) return st_error(ST_NO_MEMORY, "out of memory writing the specialisation index");
  smelt_status st = NULL;
  bb_printf(out, "%s %d %d\n", FMT_SPEC_INDEX_MAGIC, FMT_SPEC_INDEX_VERSION, n);
  for (int i = 0; i < n && !st; i++) {
    const char *label = specs[i].label ? specs[i].label : "";
    if (!*label || strchr(label, '\t') || strchr(label, '\n'))
      st = st_error(ST_INTERNAL, "specialisation %d has a bad label '%s'", i, label);
    else if (!(sig[i] = fmt_input_signature(specs[i].g)))
      st = st_error(ST_NO_MEMORY, "out of memory writing the specialisation index");
    for (int j = 0; j < i && !st; j++)
      if (strcmp(sig[i], sig[j]) == 0)
        st = st_error(ST_INVALID_INPUT, "specialisations %s and %s take the same inputs (%s): a run could not tell "
                      "them apart", specs[j].label, label, sig[i][0] ? sig[i] : "none");
    if (!st) {
      /* the section table holds names of up to 55 bytes; the rest is the runtime's */
      bb_printf(out, "s%d/\t", i);
      bb_put(out, label, strlen(label));
      bb_put(out, "\t", 1);
      bb_put(out, sig[i], strlen(sig[i]));
      bb_put(out, "\n", 1);
    }
  }
  for (int i = 0; i < n; i++) free(sig[i]);
  free(sig);
  if (!st && out->oom) st = st_error(ST_NO_MEMORY, "out of memory writing the specialisation index");
  return st;
}

/* sc_parse_targets, and the cpu target refused in a build without LLVM. */
static smelt_status buildable_targets(const char *targets, bool *out_cpu, bool *out_cuda) {
  RETURN_IF_ERROR(sc_parse_targets(targets, out_cpu, out_cuda));
#ifndef SMELT_HAVE_LLVM
  if (*out_cpu)
    return st_error(ST_UNSUPPORTED, "target cpu: this smelt was built without LLVM (SMELT_LLVM=OFF) and cannot "
                    "generate CPU code; use --target cuda");
#endif
  return NULL;
}

/* Everything that goes into a bundle, made into a writer.  One
 * specialisation keeps the unprefixed layout of driver.h; several get
 * their sections under "s0/", "s1/", ... and an index. */
static smelt_status build_bundle(ScSpecGraph *specs, int nspecs, const ScCompileOptions *o,
                                 FmtWriter **out_writer) {
  *out_writer = NULL;
  static const ScCompileOptions no_options = {0};
  if (!o) o = &no_options;
  if (nspecs < 1 || nspecs > FMT_MAX_SPECIALISATIONS)
    return st_error(ST_INVALID_INPUT, "%d specialisations (a bundle holds 1 to %d)", nspecs, FMT_MAX_SPECIALISATIONS);
  bool for_cpu, cuda;
  RETURN_IF_ERROR(buildable_targets(o->targets, &for_cpu, &cuda));
  ScCpuTargets cpu_storage = {0}, *cpu = &cpu_storage;
  if (for_cpu) RETURN_IF_ERROR(sc_cpu_targets_parse(o->cpu, cpu));
  char archs[FMT_MAX_CUDA_ARCHS * 16];
  if (cuda) {
    if (o->archs) snprintf(archs, sizeof archs, "%s", o->archs);
    else sc_cuda_default_arch(archs, sizeof archs);
    smelt_status bad = sc_check_archs(archs);
    if (bad) {
      sc_cpu_targets_free(cpu);
      return bad;
    }
  }
  /* tensor parallelism (--tp): one full set of sections per rank, under
   * "r0/", "r1/", ... (specs holds the ranks' specialisations, rank-major) */
  int nranks = o->tp > 1 ? o->tp : 1, total = nranks * nspecs;
  SpecBuild *sb = calloc((size_t)total, sizeof *sb);
  CudaBuild *cus = calloc((size_t)total, sizeof *cus);
  int *nk = calloc((size_t)total, sizeof *nk);
  ByteBuf manifest = {0}, *index = calloc((size_t)nranks, sizeof *index);
  FmtWriter *w = NULL;
  smelt_status st = NULL;
  if (!sb || !cus || !nk || !index) st = st_error(ST_NO_MEMORY, "out of memory building the bundle");
  /* the index first: specialisations alike are refused before any code is made */
  for (int r = 0; r < nranks && nspecs > 1 && !st; r++) st = build_index(specs + r * nspecs, nspecs, &index[r]);
  CgTuneTable *table = NULL;
  if (!st && cuda && o->tune_table) st = cg_tune_table_load(o->tune_table, &table);
  ConstCtx cc = {.external = o->external_weights};
  if (!st) st = fmt_const_pool_create(&cc.pool);
  for (int i = 0; i < total && !st; i++) {
    st = build_spec(specs[i].g, o, cpu, cuda, archs, table, &cc, &sb[i]);
    if (st && nspecs > 1) st = st_prefix(st, "specialisation %s", specs[i].label ? specs[i].label : "?");
    if (st && nranks > 1) st = st_prefix(st, "rank %d", i / nspecs);
    cus[i] = sb[i].cu;
    nk[i] = sb[i].nk;
  }
  if (!st)
    st = build_manifest(specs, nspecs, o, sb[0].desc, sb[0].triple, cpu, cus, nk, &manifest);
  if (!st) st = fmt_writer_create(&w);
  if (!st) st = fmt_writer_add(w, FMT_SEC_MANIFEST, NULL, manifest.p, manifest.len);
  for (int r = 0; r < nranks && nspecs > 1 && !st; r++) {
    char rp[16] = "";
    if (nranks > 1) snprintf(rp, sizeof rp, "r%d/", r);
    st = fmt_writer_add(w, FMT_SEC_SPECIALISATION, rp, index[r].p, index[r].len);
  }
  for (int i = 0; i < total && !st; i++) {
    char prefix[16] = "";
    int n = 0;
    if (nranks > 1) n = snprintf(prefix, sizeof prefix, "r%d/", i / nspecs);
    if (nspecs > 1) snprintf(prefix + n, sizeof prefix - (size_t)n, "s%d/", i % nspecs);
    st = add_spec_sections(w, &sb[i], prefix, cpu);
    if (!st && specs[i].quant_report)
      st = fmt_writer_add(w, FMT_SEC_QUANT_REPORT, prefix, specs[i].quant_report, strlen(specs[i].quant_report));
  }
  /* one constants section for every specialisation, after their sections */
  if (!st) st = fmt_const_pool_add_section(cc.pool, w, NULL);
  if (!st) st = add_weights_section(&cc, w);
  if (!st) {
    *out_writer = w;
    w = NULL;
  }
  fmt_writer_destroy(w);
  for (int i = 0; sb && i < total; i++) spec_build_free(&sb[i]);
  const_ctx_free(&cc);
  cg_tune_table_free(table);
  sc_cpu_targets_free(cpu);
  free(manifest.p);
  for (int r = 0; index && r < nranks; r++) free(index[r].p);
  free(index), free(sb), free(cus), free(nk);
  return st;
}

smelt_status sc_compile_specs(ScSpecGraph *specs, int n, const ScCompileOptions *o, const char *out_path) {
  FmtWriter *w;
  RETURN_IF_ERROR(build_bundle(specs, n, o, &w));
  double t0 = smelt_now_s();
  smelt_status st = fmt_writer_write(w, out_path);
  fmt_writer_destroy(w);
  if (o && o->times) o->times->write_s += smelt_now_s() - t0;
  return st;
}

smelt_status sc_compile_specs_to_memory(ScSpecGraph *specs, int n, const ScCompileOptions *o, void **out_buf,
                                        size_t *out_len) {
  *out_buf = NULL;
  *out_len = 0;
  FmtWriter *w;
  RETURN_IF_ERROR(build_bundle(specs, n, o, &w));
  smelt_status st = fmt_writer_to_memory(w, out_buf, out_len);
  fmt_writer_destroy(w);
  return st;
}

smelt_status sc_compile_graph(Graph *g, const ScCompileOptions *o, const char *out_path) {
  ScSpecGraph one = {.g = g};
  return sc_compile_specs(&one, 1, o, out_path);
}

smelt_status sc_compile_graph_to_memory(Graph *g, const ScCompileOptions *o, void **out_buf, size_t *out_len) {
  ScSpecGraph one = {.g = g};
  return sc_compile_specs_to_memory(&one, 1, o, out_buf, out_len);
}

smelt_status sc_bundle_from_graph(Graph *g, const ScCompileOptions *o, smelt_bundle **out_bundle) {
  *out_bundle = NULL;
  void *buf;
  size_t len;
  RETURN_IF_ERROR(sc_compile_graph_to_memory(g, o, &buf, &len));
  smelt_status st = rt_bundle_open_bytes(buf, len, o && o->model ? o->model : g->file, out_bundle);
  free(buf);
  return st;
}
/* ---- a kernel's LLVM IR, for smelt inspect ---- */

/* ---- smelt_compile ---- */

/* YAML → graph → passes for one assignment of dims; the graph is the
 * caller's.  archs: the CUDA archs the fuse pass budgets for (NULL without
 * the cuda target). */
typedef struct {
  const char *model_path;
  const smelt_compile_options *o;
  const char *archs;
  const char *passes; /* o->passes, with the shard pass when tp > 1 */
  int rank;
  char *tp_states;    /* the last build's PassCtx.tp_states (malloc'd) */
} BuildCtx;

static smelt_status load_and_optimise(BuildCtx *c, const FeDim *dims, int ndims, Graph **out_graph);

static smelt_status build_one(void *ctx, const FeDim *dims, int ndims, bool probe, Graph **out) {
  (void)probe;
  return load_and_optimise(ctx, dims, ndims, out);
}

static smelt_status load_and_optimise(BuildCtx *c, const FeDim *dims, int ndims, Graph **out_graph) {
  *out_graph = NULL;
  const smelt_compile_options *o = c->o;
  FeOptions fo = {.dims = dims, .ndims = ndims};
  if (o->dtype && (fo.dtype = dt_from_name(o->dtype)) == DT_INVALID)
    return st_error(ST_INVALID_INPUT, "unknown dtype '%s'", o->dtype);
  Graph *g = NULL;
  RETURN_IF_ERROR(fe_load_model(c->model_path, &fo, &g));
  PassCtx ctx = {.onchip_bytes = o->onchip_bytes, .target = o->targets, .arch = c->archs, .tp = o->tp, .rank = c->rank};
  smelt_status st = pass_run_pipeline(g, &ctx, c->passes, NULL, NULL);
  if (!st && ctx.tp_states) {
    free(c->tp_states);
    c->tp_states = ctx.tp_states;
    ctx.tp_states = NULL;
  }
  pass_ctx_free(&ctx);
  if (st) {
    ir_graph_destroy(g);
    return st;
  }
  *out_graph = g;
  return NULL;
}

/* The archs a compile for o->targets is for (the default one when cuda is
 * a target), into buf; NULL when cuda is not. */
static const char *default_archs(const smelt_compile_options *o, char *buf, size_t cap) {
  if (!o->targets || !strstr(o->targets, "cuda")) return NULL;
  sc_cuda_default_arch(buf, cap);
  return buf;
}

static ScCompileOptions driver_options(const char *model_path, const smelt_compile_options *o, const char *archs) {
  return (ScCompileOptions){.targets = o->targets, .archs = archs, .cpu = o->cpu, .threads = o->threads,
                            .model = model_path, .dims = o->dims, .dtype = o->dtype, .passes = o->passes,
                            .onchip_bytes = o->onchip_bytes, .allow_tf32 = o->allow_tf32 != 0,
                            .external_weights = o->external_weights != 0, .tp = o->tp > 1 ? o->tp : 0};
}

/* The whole compiler: one pipeline run per combination of the dims'
 * values, every result into one bundle (to out_path, or to memory when
 * out_path is NULL). */
static smelt_status compile_model(const char *model_path, const smelt_compile_options *options, const char *out_path,
                                  void **out_buf, size_t *out_len) {
  static const smelt_compile_options defaults = {0};
  const smelt_compile_options *o = options ? options : &defaults;
  if (!model_path) return st_error(ST_INVALID_INPUT, "smelt_compile: no model path");
  if (o->threads < 0) return st_error(ST_INVALID_INPUT, "smelt_compile: %d threads", o->threads);
  bool cpu, cuda;
  RETURN_IF_ERROR(buildable_targets(o->targets, &cpu, &cuda));
  ScDimSpace space;
  RETURN_IF_ERROR(sc_dim_space_parse(o->dims, &space));
  char buf[32];
  const char *archs = default_archs(o, buf, sizeof buf);
  /* the compile cache (compiler/cache.h), for a bundle written to a file */
  char key[65] = "";
  if (out_path && !o->no_cache) {
    ScCompileOptions ko = driver_options(model_path, o, archs);
    smelt_status kst = sc_cache_key(model_path, &ko, key);
    if (kst) key[0] = 0;
    st_free(kst);
    if (key[0] && sc_cache_fetch(key, out_path)) {
      sc_dim_space_free(&space);
      return NULL;
    }
  }
  int nranks = o->tp > 1 ? o->tp : 1;
  char passes[1024];
  smelt_status st = NULL;
  if (o->tp < 0 || o->tp > 64) st = st_error(ST_INVALID_INPUT, "smelt_compile: tp %d (1 to 64 ranks)", o->tp);
  else if (nranks > 1) st = pass_with_shard(o->passes, passes, sizeof passes);
  ScSpecGraph *specs = calloc((size_t)nranks * FMT_MAX_SPECIALISATIONS, sizeof *specs);
  char labels[FMT_MAX_SPECIALISATIONS][256];
  if (!specs && !st) st = st_error(ST_NO_MEMORY, "out of memory");
  int n = 0;
  for (int r = 0; r < nranks && !st; r++)
    for (int c = 0; c < space.ncombos && !st; c++, n++) {
      FeDim dims[SC_MAX_DIMS];
      sc_dim_space_combo(&space, c, dims);
      sc_dim_space_label(&space, c, labels[c], sizeof labels[c]);
      specs[n] = (ScSpecGraph){.label = labels[c]}; /* no quant_report: smelt_compile does not quantize */
      BuildCtx bc = {model_path, o, archs, nranks > 1 ? passes : o->passes, r, NULL};
      st = sc_build_ranged(build_one, &bc, dims, space.ndims, &specs[n].g);
      specs[n].tp_states = bc.tp_states;
      if (st && space.ncombos > 1) st = st_prefix(st, "specialisation %s", labels[c]);
      if (st && nranks > 1) st = st_prefix(st, "rank %d", r);
    }
  if (!st) {
    ScCompileOptions ro = driver_options(model_path, o, archs);
    if (nranks > 1) ro.passes = passes;
    int per = n / nranks;
    st = out_path ? sc_compile_specs(specs, per, &ro, out_path) : sc_compile_specs_to_memory(specs, per, &ro, out_buf, out_len);
    if (!st && out_path && key[0]) sc_cache_store(key, out_path);
  }
  for (int i = 0; i < n; i++) {
    ir_graph_destroy(specs[i].g);
    free((char *)specs[i].tp_states);
  }
  free(specs);
  sc_dim_space_free(&space);
  return st;
}

smelt_status smelt_compile(const char *model_path, const smelt_compile_options *options, const char *out_path) {
  if (!out_path) return st_error(ST_INVALID_INPUT, "smelt_compile: model and output paths are needed");
  return compile_model(model_path, options, out_path, NULL, NULL);
}

smelt_status sc_compile_model_to_memory(const char *model_path, const smelt_compile_options *options, void **out_buf,
                                        size_t *out_len) {
  *out_buf = NULL;
  *out_len = 0;
  return compile_model(model_path, options, NULL, out_buf, out_len);
}

/* ---- NVRTC as the runtime's CUDA compiler hook ---- */

smelt_status smelt_nvrtc_compile(void *ctx, const char *source, const char *what, const char *arch, void **out_cubin,
                                 size_t *out_len) {
  (void)ctx;
  *out_cubin = NULL;
  *out_len = 0;
  CgNvrtc *nv = NULL;
  RETURN_IF_ERROR(cg_cuda_nvrtc_open(&nv));
  CgCudaBinary bin;
  smelt_status st = cg_cuda_compile_source(nv, source, what, arch, NULL, &bin);
  cg_cuda_nvrtc_close(nv);
  if (st) return st;
  *out_cubin = bin.cubin;
  *out_len = bin.cubin_len;
  bin.cubin = NULL;
  cg_cuda_binary_clear(&bin);
  return NULL;
}
