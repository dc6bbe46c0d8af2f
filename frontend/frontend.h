/* Importers: the YAML model format v1 (SPEC §2), safetensors weight files
 * and .npy tensors.  Everything read here is untrusted input: every size,
 * offset and count is checked, and every error names file:line:col. */
#ifndef SMELT_FRONTEND_H
#define SMELT_FRONTEND_H

#include "../ir/ir.h"

typedef struct {
  const char *name;
  int64_t value;
} FeDim;

typedef struct {
  const FeDim *dims; /* --dim overrides; a name not in the model's dims is an error */
  int ndims;
  DType dtype; /* --dtype: replaces the model's default dtype; DT_INVALID keeps it */
} FeOptions;

/* Parses the YAML model at path into a new graph (owned by the caller).
 * Every node's attributes are checked against its op's schema, defaults
 * filled in, and shapes inferred. */
smelt_status fe_load_yaml(const char *path, const FeOptions *opts, Graph **out_graph) SMELT_MUST_USE;

/* ---- safetensors ---- */
typedef struct SafeTensors SafeTensors;
typedef struct {
  const char *name;
  const char *st_dtype; /* as written in the file: "F32", "BF16", "I16", ... */
  DType dt;             /* DT_INVALID when smelt has no such dtype */
  int rank;
  int64_t dim[IR_MAX_RANK];
  const void *data;
  size_t nbytes;
} SafeTensor;

/* Reads and validates the whole file (header JSON, dtypes, shapes, offsets
 * within bounds and not overlapping). Owned by the caller. */
smelt_status fe_safetensors_open(const char *path, SafeTensors **out) SMELT_MUST_USE;
void fe_safetensors_close(SafeTensors *st);
/* NULL when the file has no tensor of that name. */
const SafeTensor *fe_safetensors_find(const SafeTensors *st, const char *name);
int fe_safetensors_count(const SafeTensors *st);
const SafeTensor *fe_safetensors_at(const SafeTensors *st, int i);

/* ---- .npy ---- */
/* Reads a .npy file (v1-3, little endian, C order). *out_data is malloc'd,
 * owned by the caller. */
smelt_status fe_npy_read(const char *path, TensorType *out_type, void **out_data) SMELT_MUST_USE;
smelt_status fe_npy_write(const char *path, const TensorType *type, const void *data) SMELT_MUST_USE;

#endif
