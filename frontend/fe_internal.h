/* Internal to frontend/: helpers shared by the YAML, safetensors and .npy
 * readers.  Not part of the frontend's contract (frontend.h). */
#ifndef SMELT_FE_INTERNAL_H
#define SMELT_FE_INTERNAL_H

#include <stddef.h>

#include "frontend.h"

/* Reads the whole file at path into malloc'd memory (*out_buf, owned by the
 * caller; one extra NUL byte follows the data).  Files larger than max_bytes
 * are refused.  Errors are ST_IO with a bare message ("cannot read: No such
 * file or directory"), without the path: each caller places it. */
smelt_status fe_read_file(const char *path, size_t max_bytes, unsigned char **out_buf,
                          size_t *out_size) SMELT_MUST_USE;

/* fe_safetensors_open without the "file: error: " prefix on the message, so
 * that the YAML loader can put the error at the `weights:` key instead. */
smelt_status fe_safetensors_open_bare(const char *path, SafeTensors **out) SMELT_MUST_USE;

/* The most weights files one model reads. */
#define FE_MAX_WEIGHT_FILES 256

/* The shard files a Hugging Face model.safetensors.index.json names in its
 * weight_map, each once, in the order they first appear (*out_files and
 * each name malloc'd, owned by the caller).  Errors are bare messages. */
smelt_status fe_safetensors_index_files(const char *path, char ***out_files, int *out_n) SMELT_MUST_USE;

#endif
