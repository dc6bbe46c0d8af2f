/* The NVRTC compilation cache (cache.c), used by nvrtc.c.  Independent of
 * code generation: it sees sources and binaries only. */
#ifndef SMELT_CU_CACHE_H
#define SMELT_CU_CACHE_H

#include "codegen/cuda/cg_cuda.h"

/* The cache key: SHA-256 over source, options, arch and NVRTC version. */
void cu_cache_key(const char *source, const char *const *opts, int nopts, const char *arch, const char *version,
                  char out[65]);
/* True (and out's cubin/ptx filled) when dir holds a valid entry for key. */
bool cu_cache_read(const char *dir, const char *key, CgCudaBinary *out);
/* Best effort: a failure to write only costs a later recompilation. */
void cu_cache_write(const char *dir, const char *key, const CgCudaBinary *b);

#endif
