/* CPU variants for the CPU backend (compiler/cpu_target.h).
 *
 * A named CPU is described by its psABI level plus the vector extensions
 * it adds; LLVM is given the CPU's name (for scheduling) and a feature
 * string that turns on exactly those extensions and turns off every other
 * vector extension in DENY, so that a CPU name cannot bring in an
 * instruction the bundle does not record.  Non-vector extensions a CPU
 * name implies (aes, adx, rdrnd, ...) are not used by generated kernels.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/llvm/cg_llvm.h"
#include "compiler/cpu_target.h"
#include "ir/bytes.h"
#include "runtime/cpu_features.h"

#define ICL "avx512vnni,avx512vbmi,avx512vbmi2,avx512bitalg,avx512vpopcntdq,avx512ifma,gfni,vaes,vpclmulqdq"

static const struct {
  const char *name, *level, *extra;
} CPUS[] = {
    {"x86-64", "x86-64", ""},
    {"x86-64-v2", "x86-64-v2", ""},
    {"x86-64-v3", "x86-64-v3", ""},
    {"x86-64-v4", "x86-64-v4", ""},
    {"nehalem", "x86-64-v2", ""},
    {"westmere", "x86-64-v2", ""},
    {"sandybridge", "x86-64-v2", "avx"},
    {"ivybridge", "x86-64-v2", "avx,f16c"},
    {"haswell", "x86-64-v3", ""},
    {"broadwell", "x86-64-v3", ""},
    {"skylake", "x86-64-v3", ""},
    {"alderlake", "x86-64-v3", "avxvnni,gfni,vaes,vpclmulqdq"},
    {"skylake-avx512", "x86-64-v4", ""},
    {"cascadelake", "x86-64-v4", "avx512vnni"},
    {"cooperlake", "x86-64-v4", "avx512vnni,avx512bf16"},
    {"icelake-client", "x86-64-v4", ICL},
    {"icelake-server", "x86-64-v4", ICL},
    {"tigerlake", "x86-64-v4", ICL},
    {"sapphirerapids", "x86-64-v4", ICL ",avx512bf16,avx512fp16,avxvnni"},
    {"znver1", "x86-64-v3", ""},
    {"znver2", "x86-64-v3", ""},
    {"znver3", "x86-64-v3", "vaes,vpclmulqdq"},
};

/* Vector extensions a CPU name must not bring in unless listed. */
static const char *const DENY[] = {
    "avx",          "avx2",         "fma",          "f16c",           "avx512f",      "avx512bw",
    "avx512cd",     "avx512dq",     "avx512vl",     "avx512vnni",     "avx512bf16",   "avx512fp16",
    "avx512vbmi",   "avx512vbmi2",  "avx512bitalg", "avx512vpopcntdq", "avx512ifma",  "avxvnni",
    "amx-tile",     "amx-bf16",     "amx-int8",     "gfni",           "vaes",         "vpclmulqdq",
};

const char *sc_cpu_known_names(void) {
  return "native x86-64 x86-64-v2 x86-64-v3 x86-64-v4 nehalem westmere sandybridge ivybridge haswell broadwell "
         "skylake alderlake skylake-avx512 cascadelake cooperlake icelake-client icelake-server tigerlake "
         "sapphirerapids znver1 znver2 znver3";
}

bool sc_cpu_name_known(const char *name) {
  for (size_t i = 0; i < sizeof CPUS / sizeof *CPUS; i++)
    if (strcmp(CPUS[i].name, name) == 0) return true;
#ifdef SMELT_HAVE_LLVM
  char *cpu = NULL, *feats = NULL;
  smelt_status st = cg_llvm_host_target(&cpu, &feats);
  bool host = !st && strcmp(cpu, name) == 0;
  st_free(st);
  free(cpu);
  free(feats);
  return host;
#else
  return false;
#endif
}

void sc_cpu_targets_free(ScCpuTargets *t) {
  for (int i = 0; i < t->n; i++) {
    free(t->v[i].features);
    free(t->v[i].needs);
  }
  memset(t, 0, sizeof *t);
}

/* Whether the comma list has `name` (bare or with '+'). */
static bool list_has(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    if (*p == '+') p++;
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == n && strncmp(p, name, n) == 0) return true;
    if (!e) break;
    p = e + 1;
  }
  return false;
}

static char *take(ByteBuf *b) {
  bb_put(b, "", 1);
  if (b->oom) {
    free(b->p);
    return NULL;
  }
  return (char *)b->p;
}

/* needs = the level's features and the extras, each "+f"; features = needs
 * and "-f" for each DENY entry not in it. */
static smelt_status named_variant(int c, ScCpuVariant *v) {
  const char *level = rt_cpu_level_features(CPUS[c].level);
  if (!level) return st_error(ST_INTERNAL, "no features for level %s", CPUS[c].level);
  ByteBuf needs = {0}, feats = {0};
  bb_printf(&needs, "%s", level);
  for (const char *p = CPUS[c].extra; *p;) {
    size_t len = strcspn(p, ",");
    bb_printf(&needs, ",+%.*s", (int)len, p);
    p += len + (p[len] == ',');
  }
  if (!(v->needs = take(&needs))) return st_error(ST_NO_MEMORY, "out of memory choosing CPU variants");
  bb_printf(&feats, "%s", v->needs);
  for (size_t i = 0; i < sizeof DENY / sizeof *DENY; i++)
    if (!list_has(v->needs, DENY[i])) bb_printf(&feats, ",-%s", DENY[i]);
  snprintf(v->name, sizeof v->name, "%s", CPUS[c].name);
  snprintf(v->llvm_cpu, sizeof v->llvm_cpu, "%s", CPUS[c].name);
  if (!(v->features = take(&feats))) return st_error(ST_NO_MEMORY, "out of memory choosing CPU variants");
  return NULL;
}

/* The host: LLVM's name and feature string; the code needs what the string
 * enables, of the features the runtime can check. */
static smelt_status native_variant(ScCpuVariant *v) {
  char *cpu = NULL, *feats = NULL;
#ifdef SMELT_HAVE_LLVM
  RETURN_IF_ERROR(cg_llvm_host_target(&cpu, &feats));
#else
  (void)v;
  return st_error(ST_UNSUPPORTED, "target cpu: this smelt was built without LLVM (SMELT_LLVM=OFF)");
#endif
  ByteBuf needs = {0};
  int n = 0;
  for (const char *p = feats; *p;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    char name[64];
    if (*p == '+' && len > 1 && len < sizeof name) {
      snprintf(name, sizeof name, "%.*s", (int)len - 1, p + 1);
      if (rt_cpu_feature_known(name)) bb_printf(&needs, "%s+%s", n++ ? "," : "", name);
    }
    p = e ? e + 1 : p + len;
  }
  snprintf(v->name, sizeof v->name, "%s", cpu);
  snprintf(v->llvm_cpu, sizeof v->llvm_cpu, "%s", cpu);
  free(cpu);
  v->features = feats;
  v->needs = take(&needs);
  if (!v->needs) return st_error(ST_NO_MEMORY, "out of memory choosing CPU variants");
  return NULL;
}

static int count_features(const char *needs) {
  int n = *needs ? 1 : 0;
  for (const char *p = needs; *p; p++) n += *p == ',';
  return n;
}

smelt_status sc_cpu_targets_parse(const char *list, ScCpuTargets *out) {
  memset(out, 0, sizeof *out);
  const char *p = list && *list ? list : "native";
  while (*p) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    char name[64];
    if (len == 0 || len >= sizeof name) {
      sc_cpu_targets_free(out);
      return st_error(ST_INVALID_INPUT, "--cpu: bad CPU list '%s'", list);
    }
    snprintf(name, sizeof name, "%.*s", (int)len, p);
    if (out->n == SC_MAX_CPU_VARIANTS) {
      sc_cpu_targets_free(out);
      return st_error(ST_INVALID_INPUT, "--cpu: at most %d CPU variants", SC_MAX_CPU_VARIANTS);
    }
    ScCpuVariant *v = &out->v[out->n];
    smelt_status st = NULL;
    int c = -1;
    for (size_t i = 0; i < sizeof CPUS / sizeof *CPUS; i++)
      if (strcmp(CPUS[i].name, name) == 0) c = (int)i;
    if (strcmp(name, "native") == 0) st = native_variant(v);
    else if (c >= 0) st = named_variant(c, v);
    else st = st_error(ST_INVALID_INPUT, "--cpu: unknown CPU '%s'; known: %s", name, sc_cpu_known_names());
    out->n++;
    for (int j = 0; !st && j + 1 < out->n; j++)
      if (strcmp(out->v[j].name, v->name) == 0)
        st = st_error(ST_INVALID_INPUT, "--cpu: '%s' named twice", v->name);
    if (st) {
      sc_cpu_targets_free(out);
      return st;
    }
    p = e ? e + 1 : p + len;
  }
  /* most capable first (insertion sort: at most four) */
  for (int i = 1; i < out->n; i++)
    for (int j = i; j > 0 && count_features(out->v[j].needs) > count_features(out->v[j - 1].needs); j--) {
      ScCpuVariant t = out->v[j];
      out->v[j] = out->v[j - 1];
      out->v[j - 1] = t;
    }
  return NULL;
}
