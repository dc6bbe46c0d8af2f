/* Importers: the YAML model format v1 (SPEC §2), safetensors weight files
 * and .npy tensors.  Everything read here is untrusted input: every size,
 * offset and count is checked, and every error names file:line:col. */
#ifndef SMELT_FRONTEND_H
#define SMELT_FRONTEND_H

#include "../ir/ir.h"

typedef struct {
  const char *name;
  int64_t value;
  /* > value: the dim is the range value..max (`--dim seq=1..2048`); the
   * compiler loads the model at exact values (compiler/ranges.c), the
   * frontend never sees a range here */
  int64_t max;
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

/* The weights files a YAML model reads (its top-level `weights:`: one
 * file, a list, or a model.safetensors.index.json and its shards),
 * resolved relative to the model as the loader resolves them, without
 * loading the model (the compile cache keys on their contents).
 * *out_paths and each path are malloc'd, owned by the caller. */
smelt_status fe_yaml_weights_files(const char *path, char ***out_paths, int *out_n) SMELT_MUST_USE;

/* ---- safetensors ---- */
typedef struct SafeTensors SafeTensors;
typedef struct {
  const char *name;
  const char *st_dtype; /* as written in the file: "F32", "BF16", "I16", ... */
  DType dt;             /* DT_INVALID when smelt has no such dtype */
  int rank;
  int64_t dim[IR_MAX_RANK];
  const void *data;
  uint64_t offset;      /* of data in the file */
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
/* The safetensors dtype string of a smelt dtype ("F32", "F8_E4M3", and
 * smelt's own "I4"/"U4"), for the writers; NULL when the file format has
 * none (f64 has "F64"; every DType smelt stores has one). */
const char *fe_safetensors_dtype_name(DType dt);

/* Writing a safetensors file: the header is built in memory, one entry per
 * tensor in the order its bytes will follow (offsets counted here), then
 * written with its 8-byte length and padded to 8; the caller writes the
 * tensors' bytes after it, in the same order. */
typedef struct {
  FILE *json;
  char *buf;
  size_t len;
  uint64_t off; /* bytes of the tensors added so far */
  int n;
} FeStHeader;
smelt_status fe_st_header_open(FeStHeader *h) SMELT_MUST_USE;
void fe_st_header_add(FeStHeader *h, const char *name, DType dt, int rank, const int64_t *dim);
/* Writes the header to f (path for messages) and frees it; also frees it
 * on failure. */
smelt_status fe_st_header_write(FeStHeader *h, FILE *f, const char *path) SMELT_MUST_USE;

/* ---- .npy ---- */
/* Reads a .npy file (v1-3, little endian, C order). *out_data is malloc'd,
 * owned by the caller. */
smelt_status fe_npy_read(const char *path, TensorType *out_type, void **out_data) SMELT_MUST_USE;
smelt_status fe_npy_write(const char *path, const TensorType *type, const void *data) SMELT_MUST_USE;

/* ---- ONNX (frontend/onnx.c) ---- */
/* What the ONNX importer learned besides the graph, for `smelt import`. */
typedef struct {
  const FeDim *dims; /* the symbolic dims (dim_param) and the values used */
  int ndims;
  /* input_dims[i * IR_MAX_RANK + a]: the dim name of axis a of graph input i
   * (g->inputs order), or NULL for a fixed size */
  const char *const *input_dims;
  int64_t opset; /* of the default domain */
  const char *producer;
} FeOnnxInfo;

/* Imports an ONNX model (opsets 13 to 23 of the default domain) into a new
 * graph owned by the caller.  Symbolic dims become dims of those names
 * (value 1 unless opts sets them); shape arithmetic is evaluated at import.
 * Built without protobuf-c it returns ST_UNSUPPORTED. */
smelt_status fe_load_onnx(const char *path, const FeOptions *opts, Graph **out_graph) SMELT_MUST_USE;
/* fe_load_onnx that also fills *out_info (its memory belongs to the graph). */
smelt_status fe_load_onnx_info(const char *path, const FeOptions *opts, Graph **out_graph, FeOnnxInfo *out_info)
    SMELT_MUST_USE;
/* Whether this build can read ONNX files. */
bool fe_onnx_available(void);

/* ---- Hugging Face checkpoints (frontend/hf.c) ---- */
typedef struct {
  int64_t ctx;   /* KV cache capacity; 0: min(max_position_embeddings, 2048) */
  int64_t seq;   /* the seq dim's value in the YAML; 0: 1 */
  DType dtype;   /* the model's dtype; DT_INVALID: the checkpoint's */
  bool no_cache; /* causal attention over the whole sequence, no state, logits for every position */
} FeHfOptions;

typedef struct {
  char arch[64]; /* LlamaForCausalLM, ... */
  int64_t layers, ctx; /* ctx 0 without a cache */
  int nfiles;          /* weight files referenced */
  DType weights_dtype, dtype;
} FeHfInfo;

/* Reads the Llama-family checkpoint in directory dir (config.json plus
 * model.safetensors or the shards of model.safetensors.index.json), checks
 * every tensor the model needs, and makes the model as smelt YAML text
 * (*out_yaml, malloc'd, owned by the caller) whose weights are the
 * checkpoint's files by their HF tensor names, named relative to yaml_dir
 * (the directory the YAML will be written to).  A GPTQ or AWQ checkpoint's
 * linears are repacked into NAME.gptq.safetensors (or .awq) written into
 * yaml_dir, which the YAML lists too.  out_info may be NULL. */
smelt_status fe_hf_import(const char *dir, const char *yaml_dir, const FeHfOptions *opts, char **out_yaml,
                          FeHfInfo *out_info) SMELT_MUST_USE;

/* Loads a model by its file name: .onnx with fe_load_onnx, anything else
 * with fe_load_yaml. */
smelt_status fe_load_model(const char *path, const FeOptions *opts, Graph **out_graph) SMELT_MUST_USE;

#endif
