/* Hugging Face checkpoints of the Llama family as smelt YAML.
 *
 * A checkpoint directory holds config.json and the weights, either in
 * model.safetensors or in the shards that model.safetensors.index.json maps
 * tensor names to.  fe_hf_import reads the config (jansson), checks every
 * tensor the model needs against it (present, the shape the config implies,
 * one float dtype for all), and writes the model as smelt YAML text that
 * references the tensors by their HF names (`from:`), so nothing is copied:
 * the YAML loader reads them from the checkpoint's files when it compiles.
 *
 * The layout is LlamaForCausalLM's, shared by Mistral and Qwen2 (which adds
 * biases to q/k/v):
 *   x = embed_tokens[ids]
 *   per layer:  h = rms_norm(x) * input_layernorm
 *               q, k, v = h @ Wq^T (+bq), h @ Wk^T (+bk), h @ Wv^T (+bv)
 *               rope (half style: rotate_half pairs d with d + D/2) on q and k
 *               x += attention(q, k, v) @ Wo^T             (GQA, causal)
 *               h = rms_norm(x) * post_attention_layernorm
 *               x += (silu(h @ Wg^T) * (h @ Wu^T)) @ Wd^T
 *   logits = rms_norm(x) * norm @ lm_head^T   (lm_head = embed_tokens if tied)
 * HF's Linear keeps its weight as [out, in], hence transpose_b on every
 * matmul with a weight.
 *
 * Two forms.  The default is a decoder with a KV cache: inputs ids and pos
 * ([seq] i32), per-layer state k_cache/v_cache [1, kv_heads, ctx, head_dim]
 * that the new k, v are scattered into at pos, attention over the cache
 * (`cache: true`), and the last row's logits [1, vocab] and their argmax
 * `next`.  The same compiled model serves prefill (seq = L) and decode
 * (seq = 1).  --no-cache gives plain causal attention over the sequence,
 * no state, and logits for every position [seq, vocab], as a transformers
 * forward pass without past_key_values.
 *
 * Rope scaling of the linear and llama3 types changes only the inverse
 * frequencies, so a model with either gets its rotation built from
 * primitives around a constant inv_freq vector computed here as
 * transformers computes it (in f32); unscaled models use the rope op.
 *
 * Errors name config.json with the line and column of the key at fault
 * (found in the text: jansson keeps no positions), or the weights file and
 * the tensor.
 */
#define _DEFAULT_SOURCE /* realpath, open_memstream */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fe_internal.h"

#define HF_MAX_CONFIG_BYTES ((size_t)16 << 20)
#define HF_MAX_INDEX_BYTES ((size_t)64 << 20)
#define HF_MAX_SHARDS 1024
#define HF_DEFAULT_CTX 2048

typedef enum { ROPE_DEFAULT, ROPE_LINEAR, ROPE_LLAMA3 } RopeKind;

typedef struct {
  /* the config file */
  char *path;
  char *text;
  size_t size;
  json_t *root;
  /* what it says */
  const char *arch; /* architectures[0], or model_type */
  bool qwen2;
  int64_t hidden, heads, kv_heads, head_dim, ffn, layers, vocab, max_pos;
  double eps, theta;
  bool tied, attn_bias, o_bias, mlp_bias;
  const char *config_dtype; /* torch_dtype as written, or NULL */
  RopeKind rope;
  double factor, low_freq, high_freq;
  int64_t orig_max_pos;
  int64_t window; /* sliding window in force, 0 for none */
} HfConfig;

typedef struct {
  char *file; /* path as opened */
  char *base; /* its name in the checkpoint directory */
  SafeTensors *st;
} Shard;

typedef struct {
  const char *dir;
  HfConfig c;
  Shard shard[HF_MAX_SHARDS];
  int nshard;
  char *index_path; /* model.safetensors.index.json, or NULL */
  json_t *weight_map; /* of the index: name -> shard base name */
  DType dt;           /* of the weights */
} Hf;

static char *path_join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/%s", dir, name);
  return p;
}

/* ---- config.json ---- */

/* The position of "key" used as a key in text at or after from, as a
 * source location (line and column of the opening quote); line 0 when the
 * text does not hold it. */
static SrcLoc key_loc(const HfConfig *c, const char *key, size_t *io_from) {
  SrcLoc loc = {c->path, 0, 0};
  size_t kl = strlen(key), from = io_from ? *io_from : 0;
  for (const char *p = c->text + from; (p = strstr(p, key)); p++) {
    if (p == c->text || p[-1] != '"' || p[kl] != '"') continue;
    const char *q = p + kl + 1;
    while (*q == ' ' || *q == '\t' || *q == '\r' || *q == '\n') q++;
    if (*q != ':') continue;
    const char *start = p - 1;
    loc.line = 1;
    const char *line_start = c->text;
    for (const char *s = c->text; s < start; s++)
      if (*s == '\n') {
        loc.line++;
        line_start = s + 1;
      }
    loc.col = (int)(start - line_start) + 1;
    if (io_from) *io_from = (size_t)(start - c->text);
    break;
  }
  return loc;
}

/* An error at the config's key (its first occurrence as a key). */
static smelt_status cfg_err(const HfConfig *c, const char *key, const char *fmt, ...) SMELT_PRINTF(3, 4);
static smelt_status cfg_err(const HfConfig *c, const char *key, const char *fmt, ...) {
  char body[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  SrcLoc loc = key ? key_loc(c, key, NULL) : (SrcLoc){c->path, 0, 0};
  return st_at(loc, "%s", body);
}

/* An error at key inside the object under parent (rope_scaling.factor). */
static smelt_status cfg_err_in(const HfConfig *c, const char *parent, const char *key, const char *fmt, ...)
    SMELT_PRINTF(4, 5);
static smelt_status cfg_err_in(const HfConfig *c, const char *parent, const char *key, const char *fmt, ...) {
  char body[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  size_t from = 0;
  SrcLoc loc = key_loc(c, parent, &from);
  if (loc.line) {
    SrcLoc inner = key_loc(c, key, &from);
    if (inner.line) loc = inner;
  }
  return st_at(loc, "%s.%s: %s", parent, key, body);
}

static bool is_null(const json_t *j) { return !j || json_is_null(j); }

/* A positive integer field; absent (or null) gives def, or an error when
 * def < 0 (required). */
static smelt_status cfg_int(const HfConfig *c, const json_t *obj, const char *key, int64_t def, int64_t *out) {
  const json_t *j = json_object_get(obj, key);
  if (is_null(j)) {
    if (def < 0) return cfg_err(c, NULL, "'%s' is missing (a %s needs it)", key, c->arch ? c->arch : "model");
    *out = def;
    return NULL;
  }
  if (!json_is_integer(j) || json_integer_value(j) <= 0 || json_integer_value(j) > ((int64_t)1 << 40))
    return cfg_err(c, key, "'%s' must be a positive integer", key);
  *out = json_integer_value(j);
  return NULL;
}

static smelt_status cfg_real(const HfConfig *c, const json_t *obj, const char *key, const char *parent, double def,
                             bool required, double *out) {
  const json_t *j = json_object_get(obj, key);
  if (is_null(j)) {
    if (required) {
      if (parent) return cfg_err(c, parent, "%s.%s is missing", parent, key);
      return cfg_err(c, NULL, "'%s' is missing", key);
    }
    *out = def;
    return NULL;
  }
  if (!json_is_number(j) || !(json_number_value(j) > 0) || !isfinite(json_number_value(j))) {
    if (parent) return cfg_err_in(c, parent, key, "must be a positive number");
    return cfg_err(c, key, "'%s' must be a positive number", key);
  }
  *out = json_number_value(j);
  return NULL;
}

static smelt_status cfg_bool(const HfConfig *c, const json_t *obj, const char *key, bool def, bool *out) {
  const json_t *j = json_object_get(obj, key);
  if (is_null(j)) {
    *out = def;
    return NULL;
  }
  if (!json_is_boolean(j)) return cfg_err(c, key, "'%s' must be true or false", key);
  *out = json_is_true(j);
  return NULL;
}

static const struct {
  const char *arch, *model_type;
  bool qwen2;
} hf_archs[] = {
    {"LlamaForCausalLM", "llama", false},
    {"MistralForCausalLM", "mistral", false},
    {"Qwen2ForCausalLM", "qwen2", true},
};

static const char supported_archs[] = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM";

static smelt_status read_arch(HfConfig *c) {
  const json_t *archs = json_object_get(c->root, "architectures");
  const json_t *mt = json_object_get(c->root, "model_type");
  if (!is_null(archs)) {
    if (!json_is_array(archs) || json_array_size(archs) != 1 || !json_is_string(json_array_get(archs, 0)))
      return cfg_err(c, "architectures", "'architectures' must be a list of one name (supported: %s)",
                     supported_archs);
    c->arch = json_string_value(json_array_get(archs, 0));
    for (size_t i = 0; i < sizeof hf_archs / sizeof hf_archs[0]; i++)
      if (!strcmp(c->arch, hf_archs[i].arch)) {
        c->qwen2 = hf_archs[i].qwen2;
        return NULL;
      }
    return cfg_err(c, "architectures", "architecture '%s' is not supported (supported: %s)", c->arch,
                   supported_archs);
  }
  if (is_null(mt)) return cfg_err(c, NULL, "neither 'architectures' nor 'model_type' says what model this is");
  if (!json_is_string(mt)) return cfg_err(c, "model_type", "'model_type' must be a string");
  for (size_t i = 0; i < sizeof hf_archs / sizeof hf_archs[0]; i++)
    if (!strcmp(json_string_value(mt), hf_archs[i].model_type)) {
      c->arch = hf_archs[i].arch;
      c->qwen2 = hf_archs[i].qwen2;
      return NULL;
    }
  return cfg_err(c, "model_type", "model_type '%s' is not supported (supported: llama, mistral, qwen2)",
                 json_string_value(mt));
}

/* rope_theta and scaling: `rope_theta` with `rope_scaling` at the top level
 * (transformers up to 4.x), or one `rope_parameters` object holding
 * rope_type, rope_theta and the scaling fields (newer configs). */
static smelt_status read_rope(HfConfig *c) {
  const json_t *rp = json_object_get(c->root, "rope_parameters");
  const json_t *rs = json_object_get(c->root, "rope_scaling");
  const char *where = "rope_scaling";
  const json_t *scaling = rs;
  c->theta = 10000.0;
  if (!is_null(rp)) {
    if (!json_is_object(rp)) return cfg_err(c, "rope_parameters", "'rope_parameters' must be an object");
    /* a per-layer-type mapping ({"full_attention": {...}}) is another family's */
    if (!json_object_get(rp, "rope_type") && !json_object_get(rp, "rope_theta"))
      return cfg_err(c, "rope_parameters", "'rope_parameters' needs rope_type and rope_theta");
    RETURN_IF_ERROR(cfg_real(c, rp, "rope_theta", "rope_parameters", 10000.0, false, &c->theta));
    where = "rope_parameters";
    scaling = rp;
    if (!is_null(rs) && !(json_is_object(rs) && json_equal((json_t *)rs, (json_t *)rp)))
      return cfg_err(c, "rope_scaling", "both 'rope_scaling' and 'rope_parameters' are given; keep one");
  } else {
    RETURN_IF_ERROR(cfg_real(c, c->root, "rope_theta", NULL, 10000.0, false, &c->theta));
  }
  c->rope = ROPE_DEFAULT;
  if (is_null(scaling)) return NULL;
  if (!json_is_object(scaling)) return cfg_err(c, where, "'%s' must be an object or null", where);
  const json_t *type = json_object_get(scaling, "rope_type");
  const char *tkey = "rope_type";
  if (is_null(type)) {
    type = json_object_get(scaling, "type");
    tkey = "type";
  }
  if (is_null(type)) return cfg_err(c, where, "'%s' has no rope_type", where);
  if (!json_is_string(type)) return cfg_err_in(c, where, tkey, "must be a string");
  const char *t = json_string_value(type);
  if (!strcmp(t, "default")) return NULL;
  if (!strcmp(t, "linear")) {
    c->rope = ROPE_LINEAR;
    return cfg_real(c, scaling, "factor", where, 1.0, true, &c->factor);
  }
  if (!strcmp(t, "llama3")) {
    c->rope = ROPE_LLAMA3;
    RETURN_IF_ERROR(cfg_real(c, scaling, "factor", where, 1.0, true, &c->factor));
    RETURN_IF_ERROR(cfg_real(c, scaling, "low_freq_factor", where, 1.0, true, &c->low_freq));
    RETURN_IF_ERROR(cfg_real(c, scaling, "high_freq_factor", where, 4.0, true, &c->high_freq));
    double omp;
    RETURN_IF_ERROR(cfg_real(c, scaling, "original_max_position_embeddings", where, 8192, true, &omp));
    c->orig_max_pos = (int64_t)omp;
    if (!(c->high_freq > c->low_freq))
      return cfg_err_in(c, where, "high_freq_factor", "must be greater than low_freq_factor (%g)", c->low_freq);
    return NULL;
  }
  return cfg_err_in(c, where, tkey, "rope type '%s' is not supported (supported: default, linear, llama3)", t);
}

static smelt_status read_config(HfConfig *c, const char *dir, const FeHfOptions *o, int64_t *io_ctx) {
  c->path = path_join(dir, "config.json");
  if (!c->path) return st_error(ST_NO_MEMORY, "out of memory");
  unsigned char *buf;
  smelt_status st = fe_read_file(c->path, HF_MAX_CONFIG_BYTES, &buf, &c->size);
  if (st) {
    smelt_status io = st_error(st_code(st), "%s: error: %s (a Hugging Face checkpoint directory holds config.json)",
                               c->path, st_message(st));
    st_free(st);
    return io;
  }
  c->text = (char *)buf;
  json_error_t je;
  c->root = json_loadb(c->text, c->size, JSON_REJECT_DUPLICATES, &je);
  if (!c->root) return st_at((SrcLoc){c->path, je.line > 0 ? je.line : 0, je.column > 0 ? je.column : 1},
                             "invalid JSON: %s", je.text);
  if (!json_is_object(c->root)) return st_at((SrcLoc){c->path, 1, 1}, "config.json must hold a JSON object");
  RETURN_IF_ERROR(read_arch(c));

  const json_t *r = c->root;
  RETURN_IF_ERROR(cfg_int(c, r, "hidden_size", -1, &c->hidden));
  RETURN_IF_ERROR(cfg_int(c, r, "num_attention_heads", -1, &c->heads));
  RETURN_IF_ERROR(cfg_int(c, r, "num_key_value_heads", c->heads, &c->kv_heads));
  RETURN_IF_ERROR(cfg_int(c, r, "intermediate_size", -1, &c->ffn));
  RETURN_IF_ERROR(cfg_int(c, r, "num_hidden_layers", -1, &c->layers));
  RETURN_IF_ERROR(cfg_int(c, r, "vocab_size", -1, &c->vocab));
  RETURN_IF_ERROR(cfg_int(c, r, "max_position_embeddings", 2048, &c->max_pos));
  if (c->hidden % c->heads && is_null(json_object_get(r, "head_dim")))
    return cfg_err(c, "num_attention_heads",
                   "num_attention_heads %" PRId64 " does not divide hidden_size %" PRId64 " and no head_dim is given",
                   c->heads, c->hidden);
  RETURN_IF_ERROR(cfg_int(c, r, "head_dim", c->hidden / c->heads, &c->head_dim));
  if (c->heads % c->kv_heads)
    return cfg_err(c, "num_key_value_heads",
                   "num_key_value_heads %" PRId64 " does not divide num_attention_heads %" PRId64, c->kv_heads,
                   c->heads);
  if (c->head_dim % 2) return cfg_err(c, "head_dim", "head_dim %" PRId64 " is odd: rope needs it even", c->head_dim);
  if (c->layers > 100000) return cfg_err(c, "num_hidden_layers", "more than 100000 layers");
  RETURN_IF_ERROR(cfg_real(c, r, "rms_norm_eps", NULL, 1e-6, false, &c->eps));
  RETURN_IF_ERROR(cfg_bool(c, r, "tie_word_embeddings", false, &c->tied));
  bool ab = false, mb = false;
  RETURN_IF_ERROR(cfg_bool(c, r, "attention_bias", false, &ab));
  RETURN_IF_ERROR(cfg_bool(c, r, "mlp_bias", false, &mb));
  /* Qwen2 always has q/k/v biases and none on o; Llama's attention_bias puts
   * one on all four projections, mlp_bias on all three MLP ones. */
  c->attn_bias = c->qwen2 || ab;
  c->o_bias = !c->qwen2 && ab;
  c->mlp_bias = !c->qwen2 && mb;

  const json_t *act = json_object_get(r, "hidden_act");
  if (!is_null(act) && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
    return cfg_err(c, "hidden_act", "hidden_act %s%s%s is not supported (the Llama MLP uses silu)",
                   json_is_string(act) ? "'" : "", json_is_string(act) ? json_string_value(act) : "(not a string)",
                   json_is_string(act) ? "'" : "");
  const json_t *prf = json_object_get(r, "partial_rotary_factor");
  if (!is_null(prf) && (!json_is_number(prf) || json_number_value(prf) != 1.0))
    return cfg_err(c, "partial_rotary_factor", "partial rotary embeddings are not supported (factor must be 1)");
  const json_t *dt = json_object_get(r, "torch_dtype");
  if (is_null(dt)) dt = json_object_get(r, "dtype");
  if (!is_null(dt) && json_is_string(dt)) c->config_dtype = json_string_value(dt);
  RETURN_IF_ERROR(read_rope(c));

  int64_t ctx = o->ctx > 0 ? o->ctx : c->max_pos < HF_DEFAULT_CTX ? c->max_pos : HF_DEFAULT_CTX;
  /* the longest sequence the model sees: the cache, or the whole input */
  int64_t span = o->no_cache ? (o->seq > 0 ? o->seq : 1) : ctx;
  /* sliding-window attention changes nothing while every key is inside the
   * window (query i sees key j when i - j < window); beyond that it is not
   * implemented */
  const json_t *sw = json_object_get(r, "sliding_window");
  bool use_sw = true;
  if (c->qwen2) RETURN_IF_ERROR(cfg_bool(c, r, "use_sliding_window", false, &use_sw));
  if (use_sw && !is_null(sw)) {
    if (!json_is_integer(sw) || json_integer_value(sw) <= 0)
      return cfg_err(c, "sliding_window", "'sliding_window' must be a positive integer or null");
    c->window = json_integer_value(sw);
    if (span > c->window)
      return cfg_err(c, "sliding_window",
                     "sliding_window %" PRId64 ": sliding-window attention is not supported, and the %s of %" PRId64
                     " is longer than the window: import with %s <= %" PRId64,
                     c->window, o->no_cache ? "sequence" : "KV cache", span, o->no_cache ? "--seq" : "--ctx",
                     c->window);
  }
  *io_ctx = ctx;
  return NULL;
}

/* ---- weights ---- */

static smelt_status open_shard(Hf *h, const char *base, Shard **out) {
  for (int i = 0; i < h->nshard; i++)
    if (!strcmp(h->shard[i].base, base)) {
      *out = &h->shard[i];
      return NULL;
    }
  if (h->nshard == HF_MAX_SHARDS)
    return st_at((SrcLoc){h->index_path, 0, 0}, "more than %d weight files", HF_MAX_SHARDS);
  if (strchr(base, '/') || !strcmp(base, "..") || !*base)
    return st_at((SrcLoc){h->index_path, 0, 0}, "weight file '%s' is not a file name in the checkpoint directory",
                 base);
  Shard *s = &h->shard[h->nshard];
  s->base = strdup(base);
  s->file = path_join(h->dir, base);
  if (!s->base || !s->file) return st_error(ST_NO_MEMORY, "out of memory");
  h->nshard++;
  RETURN_IF_ERROR(fe_safetensors_open(s->file, &s->st));
  *out = s;
  return NULL;
}

static smelt_status open_weights(Hf *h) {
  char *single = path_join(h->dir, "model.safetensors");
  h->index_path = path_join(h->dir, "model.safetensors.index.json");
  if (!single || !h->index_path) {
    free(single);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  struct stat sb;
  bool have_index = stat(h->index_path, &sb) == 0;
  bool have_single = stat(single, &sb) == 0;
  free(single);
  if (!have_index) {
    free(h->index_path);
    h->index_path = NULL;
    if (!have_single) {
      char *bin = path_join(h->dir, "pytorch_model.bin");
      bool have_bin = bin && stat(bin, &sb) == 0;
      free(bin);
      return st_error(ST_INVALID_INPUT, "%s: error: no model.safetensors or model.safetensors.index.json%s", h->dir,
                      have_bin ? " (pytorch_model.bin is a pickle: save the model with safe_serialization=True)" : "");
    }
    Shard *s;
    return open_shard(h, "model.safetensors", &s);
  }
  unsigned char *buf;
  size_t n;
  smelt_status st = fe_read_file(h->index_path, HF_MAX_INDEX_BYTES, &buf, &n);
  if (st) {
    smelt_status io = st_error(st_code(st), "%s: error: %s", h->index_path, st_message(st));
    st_free(st);
    return io;
  }
  json_error_t je;
  json_t *idx = json_loadb((const char *)buf, n, JSON_REJECT_DUPLICATES, &je);
  free(buf);
  if (!idx) return st_at((SrcLoc){h->index_path, je.line > 0 ? je.line : 0, je.column > 0 ? je.column : 1},
                         "invalid JSON: %s", je.text);
  json_t *wm = json_is_object(idx) ? json_object_get(idx, "weight_map") : NULL;
  if (!json_is_object(wm)) {
    json_decref(idx);
    return st_at((SrcLoc){h->index_path, 0, 0}, "no 'weight_map' object (tensor name -> file)");
  }
  h->weight_map = json_incref(wm);
  json_decref(idx);
  const char *name;
  json_t *file;
  json_object_foreach(h->weight_map, name, file) {
    if (!json_is_string(file))
      return st_at((SrcLoc){h->index_path, 0, 0}, "weight_map['%s'] must be a file name", name);
    Shard *s;
    RETURN_IF_ERROR(open_shard(h, json_string_value(file), &s));
  }
  if (!h->nshard) return st_at((SrcLoc){h->index_path, 0, 0}, "weight_map is empty");
  return NULL;
}

static void shape_text(int rank, const int64_t *dim, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < rank && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, i ? ", " : "", dim[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

/* Checks that tensor name is in the weights with the given shape and the
 * checkpoint's float dtype (the first tensor checked sets it). */
static smelt_status check_tensor(Hf *h, const char *name, int rank, const int64_t *dim) {
  const Shard *s = NULL;
  const SafeTensor *t = NULL;
  if (h->weight_map) {
    const json_t *f = json_object_get(h->weight_map, name);
    if (!f)
      return st_at((SrcLoc){h->index_path, 0, 0}, "tensor '%s' is not in weight_map (a %s needs it)", name,
                   h->c.arch);
    for (int i = 0; i < h->nshard && !s; i++)
      if (!strcmp(h->shard[i].base, json_string_value(f))) s = &h->shard[i];
    t = fe_safetensors_find(s->st, name);
    if (!t)
      return st_at((SrcLoc){s->file, 0, 0}, "tensor '%s' is not in this file (%s maps it here)", name,
                   "model.safetensors.index.json");
  } else {
    s = &h->shard[0];
    t = fe_safetensors_find(s->st, name);
    if (!t) return st_at((SrcLoc){s->file, 0, 0}, "tensor '%s' is missing (a %s needs it)", name, h->c.arch);
  }
  char have[160], want[160];
  shape_text(t->rank, t->dim, have, sizeof have);
  shape_text(rank, dim, want, sizeof want);
  if (t->rank != rank || memcmp(t->dim, dim, sizeof(int64_t) * (size_t)rank))
    return st_at((SrcLoc){s->file, 0, 0}, "tensor '%s' has shape %s, config.json implies %s", name, have, want);
  if (t->dt != DT_F32 && t->dt != DT_F16 && t->dt != DT_BF16)
    return st_at((SrcLoc){s->file, 0, 0}, "tensor '%s' is %s: smelt imports F32, F16 and BF16 checkpoints", name,
                 t->st_dtype);
  if (h->dt == DT_INVALID) h->dt = t->dt;
  else if (t->dt != h->dt)
    return st_at((SrcLoc){s->file, 0, 0}, "tensor '%s' is %s, the other weights are %s: smelt wants one dtype", name,
                 t->st_dtype, dt_name(h->dt));
  return NULL;
}

static smelt_status check_weights(Hf *h) {
  const HfConfig *c = &h->c;
  int64_t qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim;
  RETURN_IF_ERROR(check_tensor(h, "model.embed_tokens.weight", 2, (int64_t[]){c->vocab, c->hidden}));
  RETURN_IF_ERROR(check_tensor(h, "model.norm.weight", 1, (int64_t[]){c->hidden}));
  if (!c->tied) RETURN_IF_ERROR(check_tensor(h, "lm_head.weight", 2, (int64_t[]){c->vocab, c->hidden}));
  for (int64_t i = 0; i < c->layers; i++) {
    char n[256];
#define LAYER_TENSOR(suffix, rank, ...)                                                  \
  do {                                                                                   \
    snprintf(n, sizeof n, "model.layers.%" PRId64 ".%s", i, suffix);                     \
    RETURN_IF_ERROR(check_tensor(h, n, rank, (int64_t[]){__VA_ARGS__}));                 \
  } while (0)
    LAYER_TENSOR("input_layernorm.weight", 1, c->hidden);
    LAYER_TENSOR("post_attention_layernorm.weight", 1, c->hidden);
    LAYER_TENSOR("self_attn.q_proj.weight", 2, qd, c->hidden);
    LAYER_TENSOR("self_attn.k_proj.weight", 2, kvd, c->hidden);
    LAYER_TENSOR("self_attn.v_proj.weight", 2, kvd, c->hidden);
    LAYER_TENSOR("self_attn.o_proj.weight", 2, c->hidden, qd);
    LAYER_TENSOR("mlp.gate_proj.weight", 2, c->ffn, c->hidden);
    LAYER_TENSOR("mlp.up_proj.weight", 2, c->ffn, c->hidden);
    LAYER_TENSOR("mlp.down_proj.weight", 2, c->hidden, c->ffn);
    if (c->attn_bias) {
      LAYER_TENSOR("self_attn.q_proj.bias", 1, qd);
      LAYER_TENSOR("self_attn.k_proj.bias", 1, kvd);
      LAYER_TENSOR("self_attn.v_proj.bias", 1, kvd);
    }
    if (c->o_bias) LAYER_TENSOR("self_attn.o_proj.bias", 1, c->hidden);
    if (c->mlp_bias) {
      LAYER_TENSOR("mlp.gate_proj.bias", 1, c->ffn);
      LAYER_TENSOR("mlp.up_proj.bias", 1, c->ffn);
      LAYER_TENSOR("mlp.down_proj.bias", 1, c->hidden);
    }
#undef LAYER_TENSOR
  }
  return NULL;
}

/* ---- paths ---- */

/* target (an absolute path) relative to the absolute directory from ("" for
 * the root): up to their last common directory, then down. */
static char *relative_to(const char *from, const char *target) {
  size_t k = 0, fl = strlen(from);
  for (size_t i = 0;; i++) {
    if ((i == fl || from[i] == '/') && target[i] == '/') k = i; /* both at a directory boundary */
    if (i == fl || from[i] != target[i]) break;
  }
  int ups = 0;
  for (size_t i = k; i < fl; i++)
    if (from[i] == '/') ups++;
  const char *rest = target + k + 1;
  size_t n = (size_t)ups * 3 + strlen(rest) + 1;
  char *r = malloc(n);
  if (!r) return NULL;
  r[0] = 0;
  for (int i = 0; i < ups; i++) strcat(r, "../");
  strcat(r, rest);
  return r;
}

/* How the YAML at yaml_dir names the weight file at path: relative when
 * both resolve, else absolute. */
static char *yaml_ref(const char *yaml_dir, const char *path) {
  char a[PATH_MAX], b[PATH_MAX];
  if (yaml_dir && realpath(yaml_dir, a) && realpath(path, b)) {
    if (!strcmp(a, "/")) a[0] = 0;
    return relative_to(a, b);
  }
  if (realpath(path, b)) return strdup(b);
  return strdup(path);
}

/* ---- the YAML ---- */

static void put_q(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    if ((unsigned char)*s < 0x20) fprintf(f, "\\x%02x", (unsigned char)*s);
    else fputc(*s, f);
  }
  fputc('"', f);
}

static void put_real(FILE *f, double x) {
  char b[40];
  /* the shortest text that reads back as x */
  for (int prec = 6; prec <= 17; prec++) {
    snprintf(b, sizeof b, "%.*g", prec, x);
    if (strtod(b, NULL) == x) break;
  }
  /* a float that prints as an integer gets ".0" so it reads as a float */
  if (!strpbrk(b, ".eEn")) strcat(b, ".0");
  fputs(b, f);
}

/* transformers' inverse frequencies for rope scaling, in f32 as it computes them */
static void inv_freq(const HfConfig *c, int64_t i, float *out) {
  float dim = (float)c->head_dim;
  float f = 1.0f / powf((float)c->theta, (float)(2 * i) / dim);
  if (c->rope == ROPE_LINEAR) {
    *out = f / (float)c->factor;
    return;
  }
  /* llama3 (transformers' _compute_llama3_parameters) */
  float factor = (float)c->factor, lo = (float)c->low_freq, hi = (float)c->high_freq;
  float old = (float)c->orig_max_pos;
  float lo_wl = old / lo, hi_wl = old / hi;
  float wl = 2.0f * (float)M_PI / f;
  float g = wl > lo_wl ? f / factor : f;
  float smooth = (old / wl - lo) / (hi - lo);
  float smoothed = (1.0f - smooth) * g / factor + smooth * g;
  bool medium = !(wl < hi_wl) && !(wl > lo_wl);
  *out = medium ? smoothed : g;
}

static void put_linear(FILE *f, const char *out, const char *in, const char *w, const char *bias) {
  if (bias) {
    fprintf(f, "      - {out: %s_mm, op: matmul, in: [%s, %s], transpose_b: true}\n", out, in, w);
    fprintf(f, "      - {out: %s, op: add, in: [%s_mm, %s]}\n", out, out, bias);
  } else {
    fprintf(f, "      - {out: %s, op: matmul, in: [%s, %s], transpose_b: true}\n", out, in, w);
  }
}

static void put_param(FILE *f, const char *indent, const char *name, const char *shape, const char *from) {
  fprintf(f, "%s%s: {shape: %s, from: ", indent, name, shape);
  put_q(f, from);
  fputs("}\n", f);
}

/* The rotation of x [1, H, seq, head_dim] by the shared rcos/rsin [seq, head_dim]:
 * x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]. */
static void put_rotation(FILE *f, const char *out, const char *x, int64_t half) {
  fprintf(f, "      - {out: %s_a, op: slice, in: [%s], axis: 3, start: 0, end: %" PRId64 "}\n", out, x, half);
  fprintf(f, "      - {out: %s_b, op: slice, in: [%s], axis: 3, start: %" PRId64 "}\n", out, x, half);
  fprintf(f, "      - {out: %s_nb, op: neg, in: [%s_b]}\n", out, out);
  fprintf(f, "      - {out: %s_rot, op: concat, in: [%s_nb, %s_a], axis: 3}\n", out, out, out);
  fprintf(f, "      - {out: %s_c, op: mul, in: [%s, rcos]}\n", out, x);
  fprintf(f, "      - {out: %s_s, op: mul, in: [%s_rot, rsin]}\n", out, out);
  fprintf(f, "      - {out: %s, op: add, in: [%s_c, %s_s]}\n", out, out, out);
}

static smelt_status write_yaml(const Hf *h, const FeHfOptions *o, const char *yaml_dir, int64_t ctx, DType dt,
                               char **out_text) {
  const HfConfig *c = &h->c;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return st_error(ST_NO_MEMORY, "out of memory");
  bool cache = !o->no_cache, explicit_rope = c->rope != ROPE_DEFAULT;
  int64_t seq = o->seq > 0 ? o->seq : 1;

  fprintf(f, "# Imported by smelt import hf from %s: %s, %" PRId64 " layers, %s weights", h->dir, c->arch, c->layers,
          dt_name(h->dt));
  if (dt != h->dt) fprintf(f, " (model dtype %s)", dt_name(dt));
  fputs(".\n", f);
  if (c->config_dtype) fprintf(f, "# config.json torch_dtype: %s.\n", c->config_dtype);
  if (cache) {
    fputs("# A decoder with a KV cache: run it with ids and their positions pos ([seq] i32), prefill with\n"
          "# seq = the prompt's length (--dim seq=L), then decode with seq = 1 and the same session: the\n"
          "# caches k_cache/v_cache of every layer keep the keys and values of the positions written so far.\n"
          "# logits are the last row's [1, vocab], next its argmax.\n",
          f);
  } else {
    fputs("# Without a KV cache (--no-cache): causal attention over the whole sequence, ids and pos [seq] i32,\n"
          "# logits [seq, vocab] for every position.\n",
          f);
  }
  if (c->window)
    fprintf(f, "# Sliding window %" PRId64 ": exact only while %s <= %" PRId64 ".\n", c->window,
            cache ? "ctx" : "seq", c->window);
  if (c->rope == ROPE_LINEAR) fprintf(f, "# Rope scaling: linear, factor %g.\n", c->factor);
  if (c->rope == ROPE_LLAMA3)
    fprintf(f, "# Rope scaling: llama3, factor %g, low_freq_factor %g, high_freq_factor %g, original %" PRId64 ".\n",
            c->factor, c->low_freq, c->high_freq, c->orig_max_pos);
  fputs("smelt: 1\nname: ", f);
  const char *base = strrchr(h->dir, '/');
  base = base && base[1] ? base + 1 : h->dir;
  put_q(f, *base && strcmp(base, ".") ? base : "hf_model");
  fprintf(f, "\ndtype: %s\n", dt_name(dt));
  fprintf(f, "dims: {seq: %" PRId64, seq);
  if (cache) fprintf(f, ", ctx: %" PRId64, ctx);
  fprintf(f,
          ", hidden: %" PRId64 ", heads: %" PRId64 ", kv_heads: %" PRId64 ", head_dim: %" PRId64 ", q_dim: %" PRId64
          ", kv_dim: %" PRId64 ", ffn: %" PRId64 ", vocab: %" PRId64 ", layers: %" PRId64 "}\n",
          c->hidden, c->heads, c->kv_heads, c->head_dim, c->heads * c->head_dim, c->kv_heads * c->head_dim, c->ffn,
          c->vocab, c->layers);
  fputs("weights: ", f);
  if (h->nshard == 1) {
    char *r = yaml_ref(yaml_dir, h->shard[0].file);
    if (!r) {
      fclose(f);
      free(text);
      return st_error(ST_NO_MEMORY, "out of memory");
    }
    put_q(f, r);
    free(r);
  } else {
    fputc('[', f);
    for (int i = 0; i < h->nshard; i++) {
      char *r = yaml_ref(yaml_dir, h->shard[i].file);
      if (!r) {
        fclose(f);
        free(text);
        return st_error(ST_NO_MEMORY, "out of memory");
      }
      fputs(i ? ", " : "", f);
      put_q(f, r);
      free(r);
    }
    fputc(']', f);
  }
  fputs("\ninputs:\n  ids: {shape: [seq], dtype: i32}\n  pos: {shape: [seq], dtype: i32}\n", f);

  fputs("params:\n", f);
  put_param(f, "  ", "embed", "[vocab, hidden]", "model.embed_tokens.weight");
  put_param(f, "  ", "final_norm", "[hidden]", "model.norm.weight");
  if (!c->tied) put_param(f, "  ", "lm_head", "[vocab, hidden]", "lm_head.weight");
  int64_t half = c->head_dim / 2;
  if (explicit_rope) {
    fprintf(f, "  inv_freq: {shape: [1, %" PRId64 "], dtype: f32, value: [[", half);
    for (int64_t i = 0; i < half; i++) {
      float v;
      inv_freq(c, i, &v);
      fprintf(f, "%s%.9g", i ? ", " : "", (double)v);
    }
    fputs("]]}\n", f);
  }

  fputs("blocks:\n  layer:\n", f);
  fprintf(f, "    inputs: [x, pos%s]\n", explicit_rope ? ", rcos, rsin" : "");
  if (cache)
    fputs("    state:\n"
          "      k_cache: {shape: [1, kv_heads, ctx, head_dim]}\n"
          "      v_cache: {shape: [1, kv_heads, ctx, head_dim]}\n",
          f);
  fputs("    params:\n", f);
  const char *P = "      ";
  put_param(f, P, "attn_norm", "[hidden]", "model.layers.{i}.input_layernorm.weight");
  put_param(f, P, "ffn_norm", "[hidden]", "model.layers.{i}.post_attention_layernorm.weight");
  put_param(f, P, "wq", "[q_dim, hidden]", "model.layers.{i}.self_attn.q_proj.weight");
  put_param(f, P, "wk", "[kv_dim, hidden]", "model.layers.{i}.self_attn.k_proj.weight");
  put_param(f, P, "wv", "[kv_dim, hidden]", "model.layers.{i}.self_attn.v_proj.weight");
  put_param(f, P, "wo", "[hidden, q_dim]", "model.layers.{i}.self_attn.o_proj.weight");
  put_param(f, P, "w_gate", "[ffn, hidden]", "model.layers.{i}.mlp.gate_proj.weight");
  put_param(f, P, "w_up", "[ffn, hidden]", "model.layers.{i}.mlp.up_proj.weight");
  put_param(f, P, "w_down", "[hidden, ffn]", "model.layers.{i}.mlp.down_proj.weight");
  if (c->attn_bias) {
    put_param(f, P, "bq", "[q_dim]", "model.layers.{i}.self_attn.q_proj.bias");
    put_param(f, P, "bk", "[kv_dim]", "model.layers.{i}.self_attn.k_proj.bias");
    put_param(f, P, "bv", "[kv_dim]", "model.layers.{i}.self_attn.v_proj.bias");
  }
  if (c->o_bias) put_param(f, P, "bo", "[hidden]", "model.layers.{i}.self_attn.o_proj.bias");
  if (c->mlp_bias) {
    put_param(f, P, "b_gate", "[ffn]", "model.layers.{i}.mlp.gate_proj.bias");
    put_param(f, P, "b_up", "[ffn]", "model.layers.{i}.mlp.up_proj.bias");
    put_param(f, P, "b_down", "[hidden]", "model.layers.{i}.mlp.down_proj.bias");
  }
  fputs("    nodes:\n", f);
  fputs("      # attention\n      - {out: h, op: rms_norm, in: [x, attn_norm], eps: ", f);
  put_real(f, c->eps);
  fputs("}\n", f);
  put_linear(f, "q0", "h", "wq", c->attn_bias ? "bq" : NULL);
  put_linear(f, "k0", "h", "wk", c->attn_bias ? "bk" : NULL);
  put_linear(f, "v0", "h", "wv", c->attn_bias ? "bv" : NULL);
  fputs("      # [seq, heads*head_dim] -> [1, heads, seq, head_dim]\n"
        "      - {out: q1, op: reshape, in: [q0], shape: [1, seq, heads, head_dim]}\n"
        "      - {out: q2, op: transpose, in: [q1], perm: [0, 2, 1, 3]}\n"
        "      - {out: k1, op: reshape, in: [k0], shape: [1, seq, kv_heads, head_dim]}\n"
        "      - {out: k2, op: transpose, in: [k1], perm: [0, 2, 1, 3]}\n"
        "      - {out: v1, op: reshape, in: [v0], shape: [1, seq, kv_heads, head_dim]}\n"
        "      - {out: v, op: transpose, in: [v1], perm: [0, 2, 1, 3]}\n",
        f);
  if (explicit_rope) {
    put_rotation(f, "q", "q2", half);
    put_rotation(f, "k", "k2", half);
  } else {
    for (int i = 0; i < 2; i++) {
      fprintf(f, "      - {out: %s, op: rope, in: [%s2, pos], style: half, base: ", i ? "k" : "q", i ? "k" : "q");
      put_real(f, c->theta);
      fputs("}\n", f);
    }
  }
  if (cache) {
    fputs("      # the new keys and values go into the caches at pos; attention reads slots 0..pos[i]\n"
          "      - {out: kc, op: scatter, in: [k_cache, pos, k], axis: 2}\n"
          "      - {out: vc, op: scatter, in: [v_cache, pos, v], axis: 2}\n"
          "      - {out: att, op: attention, in: [q, kc, vc, pos], cache: true}\n",
          f);
  } else {
    fputs("      - {out: att, op: attention, in: [q, k, v], causal: true}\n", f);
  }
  fputs("      - {out: att_t, op: transpose, in: [att], perm: [0, 2, 1, 3]}\n"
        "      - {out: att_m, op: reshape, in: [att_t], shape: [seq, q_dim]}\n",
        f);
  put_linear(f, "o", "att_m", "wo", c->o_bias ? "bo" : NULL);
  fputs("      - {out: x1, op: add, in: [x, o]}\n"
        "      # SwiGLU MLP: (silu(h2 @ gate^T) * (h2 @ up^T)) @ down^T\n"
        "      - {out: h2, op: rms_norm, in: [x1, ffn_norm], eps: ",
        f);
  put_real(f, c->eps);
  fputs("}\n", f);
  put_linear(f, "g0", "h2", "w_gate", c->mlp_bias ? "b_gate" : NULL);
  fputs("      - {out: g, op: silu, in: [g0]}\n", f);
  put_linear(f, "u", "h2", "w_up", c->mlp_bias ? "b_up" : NULL);
  fputs("      - {out: gu, op: mul, in: [g, u]}\n", f);
  put_linear(f, "d", "gu", "w_down", c->mlp_bias ? "b_down" : NULL);
  fputs("      - {out: y, op: add, in: [x1, d]}\n    outputs: [y]\n", f);

  fputs("nodes:\n  - {out: x, op: gather, in: [embed, ids]}\n", f);
  if (explicit_rope) {
    /* cos and sin of pos * inv_freq, in f32 as transformers computes them, shared by every layer */
    fputs("  - {out: pos_f, op: cast, in: [pos], to: f32}\n"
          "  - {out: pos_c, op: reshape, in: [pos_f], shape: [seq, 1]}\n"
          "  - {out: freqs, op: mul, in: [pos_c, inv_freq]}\n"
          "  - {out: freqs2, op: concat, in: [freqs, freqs], axis: 1}\n",
          f);
    if (dt == DT_F32) {
      fputs("  - {out: rcos, op: cos, in: [freqs2]}\n  - {out: rsin, op: sin, in: [freqs2]}\n", f);
    } else {
      fprintf(f,
              "  - {out: rcos32, op: cos, in: [freqs2]}\n  - {out: rsin32, op: sin, in: [freqs2]}\n"
              "  - {out: rcos, op: cast, in: [rcos32], to: %s}\n  - {out: rsin, op: cast, in: [rsin32], to: %s}\n",
              dt_name(dt), dt_name(dt));
    }
  }
  fprintf(f, "  - {out: hid, repeat: layer, times: layers, in: [x, pos%s]}\n", explicit_rope ? ", rcos, rsin" : "");
  fputs("  - {out: hn, op: rms_norm, in: [hid, final_norm], eps: ", f);
  put_real(f, c->eps);
  fputs("}\n", f);
  const char *head = c->tied ? "embed" : "lm_head";
  if (cache) {
    fprintf(f,
            "  - {out: last, op: slice, in: [hn], axis: 0, start: -1}\n"
            "  - {out: logits, op: matmul, in: [last, %s], transpose_b: true}\n"
            "  - {out: next, op: argmax, in: [logits], axis: -1}\n"
            "outputs: [logits, next]\n",
            head);
  } else {
    fprintf(f, "  - {out: logits, op: matmul, in: [hn, %s], transpose_b: true}\noutputs: [logits]\n", head);
  }
  if (fclose(f) != 0) {
    free(text);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  *out_text = text;
  return NULL;
}

smelt_status fe_hf_import(const char *dir, const char *yaml_dir, const FeHfOptions *opts, char **out_yaml,
                          FeHfInfo *out_info) {
  *out_yaml = NULL;
  FeHfOptions o = opts ? *opts : (FeHfOptions){.dtype = DT_INVALID};
  Hf *h = calloc(1, sizeof *h);
  if (!h) return st_error(ST_NO_MEMORY, "out of memory");
  h->dir = dir;
  h->dt = DT_INVALID;
  struct stat sb;
  smelt_status st = NULL;
  int64_t ctx = 0;
  if (stat(dir, &sb) != 0) st = st_error(ST_IO, "%s: error: %s", dir, strerror(errno));
  else if (!S_ISDIR(sb.st_mode))
    st = st_error(ST_INVALID_INPUT, "%s: error: not a directory (smelt import hf takes a checkpoint directory)", dir);
  if (!st && o.ctx < 0) st = st_error(ST_INVALID_INPUT, "error: --ctx must be positive");
  if (!st) st = read_config(&h->c, dir, &o, &ctx);
  if (!st) st = open_weights(h);
  if (!st) st = check_weights(h);
  DType dt = o.dtype != DT_INVALID ? o.dtype : h->dt;
  if (!st && !dt_is_float(dt))
    st = st_error(ST_INVALID_INPUT, "error: --dtype %s: the model's dtype must be a float type", dt_name(dt));
  if (!st) st = write_yaml(h, &o, yaml_dir, ctx, dt, out_yaml);
  if (!st && out_info) {
    *out_info = (FeHfInfo){.layers = h->c.layers, .nfiles = h->nshard, .ctx = o.no_cache ? 0 : ctx,
                           .weights_dtype = h->dt, .dtype = dt};
    snprintf(out_info->arch, sizeof out_info->arch, "%s", h->c.arch);
  }
  for (int i = 0; i < h->nshard; i++) {
    fe_safetensors_close(h->shard[i].st);
    free(h->shard[i].file);
    free(h->shard[i].base);
  }
  json_decref(h->weight_map);
  json_decref(h->c.root);
  free(h->c.text);
  free(h->c.path);
  free(h->index_path);
  free(h);
  return st;
}
