/* Which x86 instruction-set extensions the host CPU (and its OS) supports,
 * in LLVM's spelling of target features ("sse4.1", "avx512f", "amx-tile").
 *
 * A bundle's CPU code is compiled for a CPU and a feature list
 * ("+avx2,+fma,..."); before the runtime calls that code it checks that
 * the host has every feature the code may use, and refuses with a message
 * naming the missing ones instead of dying of SIGILL in the middle of a
 * kernel.  Detection is cpuid plus XGETBV: an AVX or AVX-512 feature counts
 * only when the OS saves the register state it needs (XCR0), as LLVM's own
 * host detection does.
 *
 * Feature lists are comma-separated.  In a list of features the code needs,
 * "+name" and a bare "name" mean required and "-name" is ignored; names
 * this module does not know (tuning flags such as "+fast-gather", features
 * cpuid cannot report) are not checked.  In a host override list, the
 * features named with "+" or bare are the ones the host pretends to have
 * (with "sse4.2" comes LLVM's "crc32", which is the same cpuid bit); every
 * other feature is absent.
 *
 * Everything here is thread-safe and allocates nothing.  On a host that is
 * not x86, the host has no feature of the table.
 */
#ifndef SMELT_CPU_FEATURES_H
#define SMELT_CPU_FEATURES_H

#include <stdbool.h>
#include <stddef.h>

#include "ir/status.h"

/* True when name (bare, "avx2") is a feature this module can detect. */
bool rt_cpu_feature_known(const char *name);

/* The features the real host CPU has (no override), as "+sse2,+avx2,..."
 * in the order of the module's table, truncated at an entry boundary to fit
 * cap bytes (always NUL-terminated when cap > 0).  For diagnostics. */
void rt_cpu_host_features(char *buf, size_t cap);

/* True when the host (or host_override when it is not NULL) has every known
 * feature that needed requires.  needed NULL or "" is always satisfied.
 * For choosing among several CPU variants of the same code. */
bool rt_cpu_has_all(const char *needed, const char *host_override);

/* NULL when the host (or host_override) has every known feature needed
 * requires; otherwise ST_UNSUPPORTED with a message listing every missing
 * feature: "this CPU lacks avx512f, avx512bw, which the bundle's code needs
 * (built for cpu=skylake-avx512)".  built_for (may be NULL) is what the
 * message puts in the parentheses, e.g. the compile description. */
smelt_status rt_cpu_check_features(const char *needed, const char *host_override,
                                   const char *built_for) SMELT_MUST_USE;

/* getenv("SMELT_FAKE_CPU_FEATURES") (a host override list, for tests and
 * for trying a bundle's refusal on a machine that could run it), or NULL
 * when it is unset or empty. */
const char *rt_cpu_host_override(void);

/* The features of a psABI micro-architecture level in LLVM's spelling, each
 * level including the ones below it: "x86-64" (baseline), "x86-64-v2",
 * "x86-64-v3", "x86-64-v4".  A static string; NULL for any other name. */
const char *rt_cpu_level_features(const char *level);

#endif
