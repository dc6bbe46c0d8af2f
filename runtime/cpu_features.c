/* Host CPU feature detection, and checking a feature list against it.
 *
 * One table lists every feature this module knows: its LLVM name, the
 * cpuid leaf, subleaf, register and bit that reports it, and the register
 * state the OS must save for it to be usable.  Detection runs cpuid for the
 * leaves the CPU has (basic leaves up to cpuid(0).eax, leaf 7 subleaf 1 only
 * when cpuid(7,0).eax says it exists, extended leaves up to
 * cpuid(0x80000000).eax), reads XCR0 with XGETBV when the OS has enabled
 * XSAVE (cpuid(1).ecx.osxsave), and sets a feature when its bit is set and
 * its state is enabled: YMM for the AVX family (XCR0 bits 1-2), YMM plus the
 * opmask and upper ZMM state for AVX-512 (bits 5-7), the tile state for AMX
 * (bits 17-18).  These are the rules of LLVM's getHostCPUFeatures, so a
 * feature string LLVM produced for this host agrees with ours.  (Linux also
 * wants arch_prctl(ARCH_REQ_XCOMP_PERM) before a process touches AMX tiles;
 * that is the caller's business, not a property of the CPU.)
 *
 * A check parses the needed list, looks each '+' name up in the table
 * (unknown names are skipped: see cpu_features.h) and collects every
 * feature the host lacks into one message.  Nothing is cached: detection is
 * a few dozen cpuid instructions, cheap next to loading a bundle, and
 * keeping no state keeps it thread-safe.
 */
#include "runtime/cpu_features.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define HAVE_CPUID 1
#endif

enum { EAX, EBX, ECX, EDX };
enum { OS_NONE, OS_AVX, OS_AVX512, OS_AMX }; /* the state a feature needs saved */

typedef struct {
  const char *name;
  uint32_t leaf, sub;
  uint8_t reg, bit, os;
} Feature;

static const Feature features[] = {
    /* leaf 1 */
    {"x87", 1, 0, EDX, 0, OS_NONE},
    {"cx8", 1, 0, EDX, 8, OS_NONE},
    {"cmov", 1, 0, EDX, 15, OS_NONE},
    {"mmx", 1, 0, EDX, 23, OS_NONE},
    {"fxsr", 1, 0, EDX, 24, OS_NONE},
    {"sse", 1, 0, EDX, 25, OS_NONE},
    {"sse2", 1, 0, EDX, 26, OS_NONE},
    {"sse3", 1, 0, ECX, 0, OS_NONE},
    {"pclmul", 1, 0, ECX, 1, OS_NONE},
    {"ssse3", 1, 0, ECX, 9, OS_NONE},
    {"fma", 1, 0, ECX, 12, OS_AVX},
    {"cx16", 1, 0, ECX, 13, OS_NONE},
    {"sse4.1", 1, 0, ECX, 19, OS_NONE},
    {"sse4.2", 1, 0, ECX, 20, OS_NONE},
    {"crc32", 1, 0, ECX, 20, OS_NONE}, /* LLVM splits it from sse4.2; same bit */
    {"movbe", 1, 0, ECX, 22, OS_NONE},
    {"popcnt", 1, 0, ECX, 23, OS_NONE},
    {"aes", 1, 0, ECX, 25, OS_NONE},
    {"xsave", 1, 0, ECX, 26, OS_AVX}, /* as LLVM: only with the YMM state enabled */
    {"avx", 1, 0, ECX, 28, OS_AVX},
    {"f16c", 1, 0, ECX, 29, OS_AVX},
    {"rdrnd", 1, 0, ECX, 30, OS_NONE},
    /* leaf 7, subleaf 0 */
    {"fsgsbase", 7, 0, EBX, 0, OS_NONE},
    {"sgx", 7, 0, EBX, 2, OS_NONE},
    {"bmi", 7, 0, EBX, 3, OS_NONE},
    {"avx2", 7, 0, EBX, 5, OS_AVX},
    {"bmi2", 7, 0, EBX, 8, OS_NONE},
    {"invpcid", 7, 0, EBX, 10, OS_NONE},
    {"rtm", 7, 0, EBX, 11, OS_NONE},
    {"avx512f", 7, 0, EBX, 16, OS_AVX512},
    {"avx512dq", 7, 0, EBX, 17, OS_AVX512},
    {"rdseed", 7, 0, EBX, 18, OS_NONE},
    {"adx", 7, 0, EBX, 19, OS_NONE},
    {"avx512ifma", 7, 0, EBX, 21, OS_AVX512},
    {"clflushopt", 7, 0, EBX, 23, OS_NONE},
    {"clwb", 7, 0, EBX, 24, OS_NONE},
    {"avx512pf", 7, 0, EBX, 26, OS_AVX512},
    {"avx512er", 7, 0, EBX, 27, OS_AVX512},
    {"avx512cd", 7, 0, EBX, 28, OS_AVX512},
    {"sha", 7, 0, EBX, 29, OS_NONE},
    {"avx512bw", 7, 0, EBX, 30, OS_AVX512},
    {"avx512vl", 7, 0, EBX, 31, OS_AVX512},
    {"prefetchwt1", 7, 0, ECX, 0, OS_NONE},
    {"avx512vbmi", 7, 0, ECX, 1, OS_AVX512},
    {"pku", 7, 0, ECX, 4, OS_NONE}, /* OSPKE: the OS enabled protection keys */
    {"waitpkg", 7, 0, ECX, 5, OS_NONE},
    {"avx512vbmi2", 7, 0, ECX, 6, OS_AVX512},
    {"shstk", 7, 0, ECX, 7, OS_NONE},
    {"gfni", 7, 0, ECX, 8, OS_NONE},
    {"vaes", 7, 0, ECX, 9, OS_AVX},
    {"vpclmulqdq", 7, 0, ECX, 10, OS_AVX},
    {"avx512vnni", 7, 0, ECX, 11, OS_AVX512},
    {"avx512bitalg", 7, 0, ECX, 12, OS_AVX512},
    {"avx512vpopcntdq", 7, 0, ECX, 14, OS_AVX512},
    {"rdpid", 7, 0, ECX, 22, OS_NONE},
    {"kl", 7, 0, ECX, 23, OS_NONE},
    {"cldemote", 7, 0, ECX, 25, OS_NONE},
    {"movdiri", 7, 0, ECX, 27, OS_NONE},
    {"movdir64b", 7, 0, ECX, 28, OS_NONE},
    {"enqcmd", 7, 0, ECX, 29, OS_NONE},
    {"uintr", 7, 0, EDX, 5, OS_NONE},
    {"avx512vp2intersect", 7, 0, EDX, 8, OS_AVX512},
    {"serialize", 7, 0, EDX, 14, OS_NONE},
    {"tsxldtrk", 7, 0, EDX, 16, OS_NONE},
    {"pconfig", 7, 0, EDX, 18, OS_NONE},
    {"amx-bf16", 7, 0, EDX, 22, OS_AMX},
    {"avx512fp16", 7, 0, EDX, 23, OS_AVX512},
    {"amx-tile", 7, 0, EDX, 24, OS_AMX},
    {"amx-int8", 7, 0, EDX, 25, OS_AMX},
    /* leaf 7, subleaf 1 */
    {"raoint", 7, 1, EAX, 3, OS_NONE},
    {"avxvnni", 7, 1, EAX, 4, OS_AVX},
    {"avx512bf16", 7, 1, EAX, 5, OS_AVX512},
    {"cmpccxadd", 7, 1, EAX, 7, OS_NONE},
    {"amx-fp16", 7, 1, EAX, 21, OS_AMX},
    {"hreset", 7, 1, EAX, 22, OS_NONE},
    {"avxifma", 7, 1, EAX, 23, OS_AVX},
    {"avxvnniint8", 7, 1, EDX, 4, OS_AVX},
    {"avxneconvert", 7, 1, EDX, 5, OS_AVX},
    {"prefetchi", 7, 1, EDX, 14, OS_NONE},
    /* leaf 0xd, subleaf 1: XSAVE variants (as LLVM: only with YMM state) */
    {"xsaveopt", 0xd, 1, EAX, 0, OS_AVX},
    {"xsavec", 0xd, 1, EAX, 1, OS_AVX},
    {"xsaves", 0xd, 1, EAX, 3, OS_AVX},
    /* leaf 0x14, leaf 0x19 */
    {"ptwrite", 0x14, 0, EBX, 4, OS_NONE},
    {"widekl", 0x19, 0, EBX, 2, OS_NONE},
    /* extended leaves */
    {"sahf", 0x80000001u, 0, ECX, 0, OS_NONE},
    {"lzcnt", 0x80000001u, 0, ECX, 5, OS_NONE},
    {"sse4a", 0x80000001u, 0, ECX, 6, OS_NONE},
    {"prfchw", 0x80000001u, 0, ECX, 8, OS_NONE},
    {"xop", 0x80000001u, 0, ECX, 11, OS_AVX},
    {"lwp", 0x80000001u, 0, ECX, 15, OS_NONE},
    {"fma4", 0x80000001u, 0, ECX, 16, OS_AVX},
    {"tbm", 0x80000001u, 0, ECX, 21, OS_NONE},
    {"mwaitx", 0x80000001u, 0, ECX, 29, OS_NONE},
    {"64bit", 0x80000001u, 0, EDX, 29, OS_NONE},
    {"clzero", 0x80000008u, 0, EBX, 0, OS_NONE},
    {"rdpru", 0x80000008u, 0, EBX, 4, OS_NONE},
    {"wbnoinvd", 0x80000008u, 0, EBX, 9, OS_NONE},
};

enum { NFEAT = (int)(sizeof features / sizeof features[0]) };

typedef struct {
  bool has[NFEAT];
} FeatureSet;

/* The table index of name[0..n), or -1. */
static int feature_index(const char *name, size_t n) {
  for (int i = 0; i < NFEAT; i++)
    if (strlen(features[i].name) == n && memcmp(features[i].name, name, n) == 0) return i;
  return -1;
}

bool rt_cpu_feature_known(const char *name) { return name && feature_index(name, strlen(name)) >= 0; }

/* Calls fn(name, n, sign, ctx) for every entry of a comma list; sign is
 * '+' for "+name" and bare "name", '-' for "-name".  Spaces around entries
 * are skipped. */
static void for_each_entry(const char *list, void (*fn)(const char *, size_t, char, void *), void *ctx) {
  if (!list) return;
  const char *p = list;
  while (*p) {
    const char *end = strchr(p, ',');
    if (!end) end = p + strlen(p);
    const char *a = p, *b = end;
    while (a < b && (*a == ' ' || *a == '\t')) a++;
    while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
    char sign = '+';
    if (a < b && (*a == '+' || *a == '-')) sign = *a++;
    if (a < b) fn(a, (size_t)(b - a), sign, ctx);
    p = *end ? end + 1 : end;
  }
}

static void add_override(const char *name, size_t n, char sign, void *ctx) {
  FeatureSet *fs = ctx;
  int i = feature_index(name, n);
  if (i >= 0) fs->has[i] = sign == '+';
  /* "sse4.2" also stands for LLVM's "crc32", as on real hardware */
  if (sign == '+' && n == 6 && memcmp(name, "sse4.2", 6) == 0) fs->has[feature_index("crc32", 5)] = true;
}

#ifdef HAVE_CPUID
static uint64_t read_xcr0(void) {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t)hi << 32 | lo;
}
#endif

static void detect_host(FeatureSet *fs) {
  memset(fs, 0, sizeof *fs);
#ifdef HAVE_CPUID
  unsigned a = 0, b = 0, c = 0, d = 0;
  unsigned max_basic = __get_cpuid_max(0, NULL), max_ext = __get_cpuid_max(0x80000000u, NULL);
  if (max_basic < 1) return;
  __get_cpuid_count(1, 0, &a, &b, &c, &d);
  bool osxsave = (c >> 27) & 1;
  uint64_t xcr0 = osxsave ? read_xcr0() : 0;
  bool state[4] = {
      [OS_NONE] = true,
      [OS_AVX] = (xcr0 & 0x6) == 0x6,
      [OS_AVX512] = (xcr0 & 0xe6) == 0xe6,
      [OS_AMX] = (xcr0 & 0x60006) == 0x60006,
  };
  unsigned max_sub7 = 0;
  if (max_basic >= 7) {
    __get_cpuid_count(7, 0, &a, &b, &c, &d);
    max_sub7 = a;
  }
  for (int i = 0; i < NFEAT; i++) {
    const Feature *f = &features[i];
    bool ext = f->leaf >= 0x80000000u;
    if (ext ? f->leaf > max_ext : f->leaf > max_basic) continue;
    if (f->leaf == 7 && f->sub > max_sub7) continue;
    unsigned r[4] = {0, 0, 0, 0};
    if (!__get_cpuid_count(f->leaf, f->sub, &r[EAX], &r[EBX], &r[ECX], &r[EDX])) continue;
    fs->has[i] = ((r[f->reg] >> f->bit) & 1) && state[f->os];
  }
#endif
}

static void host_set(const char *host_override, FeatureSet *fs) {
  if (host_override) {
    memset(fs, 0, sizeof *fs);
    for_each_entry(host_override, add_override, fs);
  } else {
    detect_host(fs);
  }
}

typedef struct {
  const FeatureSet *host;
  bool reported[NFEAT];
  int nmissing;
  char list[2048];
} Missing;

static void note_needed(const char *name, size_t n, char sign, void *ctx) {
  Missing *m = ctx;
  int i = sign == '+' ? feature_index(name, n) : -1;
  if (i < 0 || m->host->has[i] || m->reported[i]) return;
  m->reported[i] = true;
  m->nmissing++;
  size_t used = strlen(m->list);
  if (used + 1 < sizeof m->list)
    snprintf(m->list + used, sizeof m->list - used, "%s%s", used ? ", " : "", features[i].name);
}

static int count_missing(const char *needed, const FeatureSet *host, Missing *m) {
  memset(m, 0, sizeof *m);
  m->host = host;
  for_each_entry(needed, note_needed, m);
  return m->nmissing;
}

void rt_cpu_host_features(char *buf, size_t cap) {
  if (!cap) return;
  FeatureSet fs;
  detect_host(&fs);
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < NFEAT; i++) {
    if (!fs.has[i]) continue;
    size_t n = strlen(features[i].name) + (used ? 2 : 1); /* ",+" or "+" */
    if (used + n + 1 > cap) break;
    snprintf(buf + used, cap - used, "%s+%s", used ? "," : "", features[i].name);
    used += n;
  }
}

bool rt_cpu_has_all(const char *needed, const char *host_override) {
  FeatureSet fs;
  host_set(host_override, &fs);
  Missing m;
  return count_missing(needed, &fs, &m) == 0;
}

smelt_status rt_cpu_check_features(const char *needed, const char *host_override, const char *built_for) {
  FeatureSet fs;
  host_set(host_override, &fs);
  Missing m;
  if (count_missing(needed, &fs, &m) == 0) return NULL;
  return st_error(ST_UNSUPPORTED, "this CPU%s lacks %s, which the bundle's code needs%s%s%s",
                  host_override ? " (as the feature override describes it)" : "", m.list,
                  built_for ? " (built for " : "", built_for ? built_for : "", built_for ? ")" : "");
}

const char *rt_cpu_host_override(void) {
  const char *s = getenv("SMELT_FAKE_CPU_FEATURES");
  return s && *s ? s : NULL;
}

#define LEVEL1 "+cmov,+cx8,+fxsr,+mmx,+sse,+sse2,+x87"
#define LEVEL2 LEVEL1 ",+cx16,+popcnt,+sahf,+sse3,+sse4.1,+sse4.2,+ssse3"
#define LEVEL3 LEVEL2 ",+avx,+avx2,+bmi,+bmi2,+f16c,+fma,+lzcnt,+movbe,+xsave"
#define LEVEL4 LEVEL3 ",+avx512bw,+avx512cd,+avx512dq,+avx512f,+avx512vl"

const char *rt_cpu_level_features(const char *level) {
  static const struct {
    const char *name, *features;
  } levels[] = {{"x86-64", LEVEL1}, {"x86-64-v2", LEVEL2}, {"x86-64-v3", LEVEL3}, {"x86-64-v4", LEVEL4}};
  for (size_t i = 0; level && i < sizeof levels / sizeof levels[0]; i++)
    if (strcmp(level, levels[i].name) == 0) return levels[i].features;
  return NULL;
}
