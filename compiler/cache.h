/* The compile cache: a bundle compiled once is not compiled again.
 *
 * The key is the SHA-256 of everything the bundle's bytes depend on: the
 * model file's text and path, the weights file's path, size and CRC-32C
 * (hashed at memory speed: ~0.1 s for 700 MB), every compile option
 * (targets, archs, CPU variants with their LLVM features, dims, dtype,
 * passes, on-chip budget, threads, TF32, external weights), the tuning
 * table's contents, and the compiler itself (its version, its LLVM version,
 * NVRTC's version for cuda, and the size and CRC of the binary that holds
 * this code, so a rebuilt smelt never reuses an older one's bundles).  The
 * value is the bundle file, under the directory the CUDA kernel cache uses
 * ($SMELT_CACHE_DIR, else $XDG_CACHE_HOME/smelt, else ~/.cache/smelt), in
 * bundles/KEY.smelt.
 *
 * Only YAML models are cached (their weights file is known from the text);
 * anything else always compiles.  The cache is never trusted for
 * correctness: an entry that is not a whole bundle is ignored, and every
 * failure of the cache (no directory, a full disk) only costs a compile.
 * Entries are never evicted here; deleting the directory is always safe. */
#ifndef SMELT_COMPILER_CACHE_H
#define SMELT_COMPILER_CACHE_H

#include <stdbool.h>

#include "compiler/driver.h"

/* The key of compiling model_path with o (its fields as the driver will see
 * them: default arch and tune table already resolved) into out_key (64 hex
 * digits and a NUL).  ST_UNSUPPORTED for a model the cache does not handle;
 * any error only means: compile without the cache. */
smelt_status sc_cache_key(const char *model_path, const ScCompileOptions *o, char out_key[65]) SMELT_MUST_USE;
/* On a hit, writes the cached bundle to out_path (atomically, by reflink or
 * an in-kernel copy) and returns true. */
bool sc_cache_fetch(const char *key, const char *out_path);
/* Stores the bundle at bundle_path under key (best effort). */
void sc_cache_store(const char *key, const char *bundle_path);
/* The directory entries go in (malloc'd), NULL when there is none. */
char *sc_cache_dir(void);

#endif
