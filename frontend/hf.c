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
 * GPTQ and AWQ checkpoints (a quantization_config in config.json) keep
 * their linears quantised.  Their packings (GPTQ: qweight [K/8, N] packed
 * along K, qzeros [K/G, N/8] along N, v1 storing zero - 1; AWQ: both packed
 * along N in the nibble order 0 2 4 6 1 3 5 7) are not what the kernels
 * stream, so these weights are the one thing the import copies: each
 * quantised linear is repacked into smelt's [N, K] 4- or 8-bit layout, its
 * scales and zeros into [N, K/G], written to NAME.gptq.safetensors beside
 * the YAML, and read through a dequantize feeding the matmul.  The choice
 * of dtypes is the whole model's (one repeat block serves every layer):
 * signed weights without zeros when every zero is 2^(bits-1), else
 * unsigned ones with zeros.  Act-order (a g_idx that is not k / G) sorts
 * the inputs by group, so that groups are runs of G as dequantize has
 * them, and the matmul reads its input through the same permutation.
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
#include <strings.h>
#include <sys/stat.h>

#include "fe_internal.h"

#define HF_MAX_CONFIG_BYTES ((size_t)16 << 20)
#define HF_MAX_INDEX_BYTES ((size_t)64 << 20)
#define HF_MAX_SHARDS 1024
#define HF_DEFAULT_CTX 2048

typedef enum { ROPE_DEFAULT, ROPE_LINEAR, ROPE_LLAMA3 } RopeKind;

typedef enum { HQ_NONE, HQ_GPTQ, HQ_AWQ } QuantMethod;

/* config.json's quantization_config */
typedef struct {
  QuantMethod method;
  int bits;      /* 4 or 8 (AWQ: 4) */
  int64_t group; /* group_size as written: -1 is one group of all K inputs */
  const char *group_key; /* the key group_size is read from, for errors */
  bool v1;       /* GPTQ checkpoint_format "gptq": the stored zero is the zero - 1 */
} HfQuant;

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
  HfQuant quant;
} HfConfig;

typedef struct {
  char *file; /* path as opened */
  char *base; /* its name in the checkpoint directory */
  SafeTensors *st;
} Shard;

/* The linears of the model: the seven of each layer, then lm_head. */
enum { LIN_Q, LIN_K, LIN_V, LIN_O, LIN_GATE, LIN_UP, LIN_DOWN, LIN_HEAD, NLIN };

static const struct {
  const char *param;  /* the weight's name in the YAML */
  const char *suffix; /* the module's HF name, after "model.layers.N." for those of a layer */
  const char *n, *k;  /* its [out, in] as YAML dims */
} hf_linears[NLIN] = {
    {"wq", "self_attn.q_proj", "q_dim", "hidden"},  {"wk", "self_attn.k_proj", "kv_dim", "hidden"},
    {"wv", "self_attn.v_proj", "kv_dim", "hidden"}, {"wo", "self_attn.o_proj", "hidden", "q_dim"},
    {"w_gate", "mlp.gate_proj", "ffn", "hidden"},   {"w_up", "mlp.up_proj", "ffn", "hidden"},
    {"w_down", "mlp.down_proj", "hidden", "ffn"},   {"lm_head", "lm_head", "vocab", "hidden"},
};

/* What every layer's linear of one kind is: the YAML writes one block for all. */
typedef struct {
  bool quant;    /* read from qweight, qzeros and scales */
  bool perm;     /* act-order in some layer: its input is permuted by a gather */
  int64_t n, k, group;
} HfLinear;

/* One quantised linear of the checkpoint, checked. */
typedef struct {
  char prefix[128]; /* model.layers.3.mlp.up_proj */
  int kind;
  int64_t n, k, group;
  const SafeTensor *qweight, *qzeros, *scales, *g_idx; /* g_idx NULL when absent */
  bool perm;                                           /* g_idx is not k / group */
} HfQLinear;

typedef struct {
  const char *dir;
  HfConfig c;
  Shard shard[HF_MAX_SHARDS];
  int nshard;
  char *index_path; /* model.safetensors.index.json, or NULL */
  json_t *weight_map; /* of the index: name -> shard base name */
  DType dt;           /* of the weights */
  /* quantised checkpoints */
  HfLinear lin[NLIN];
  HfQLinear *ql;
  int nql;
  bool all_mid;     /* every zero is 2^(bits-1): the weights become signed, without zeros */
  bool zero_wide;   /* some zero is 2^bits (GPTQ v1's stored 2^bits - 1 plus one): zeros in floats */
  DType qdt, zdt;   /* of the repacked weights and zeros (zdt DT_INVALID: none) */
  char *qpath;      /* the file of repacked weights, or NULL */
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

/* ---- quantization_config ---- */

static const char *quant_name(QuantMethod m) { return m == HQ_GPTQ ? "GPTQ" : m == HQ_AWQ ? "AWQ" : "none"; }

/* The first of keys (a NULL-terminated list of a field's spellings: AutoAWQ
 * writes w_bit where transformers writes bits) that the object has, or NULL. */
static const char *q_key(const json_t *q, const char *const *keys) {
  for (; *keys; keys++)
    if (!is_null(json_object_get(q, *keys))) return *keys;
  return NULL;
}

static smelt_status q_int(const HfConfig *c, const json_t *q, const char *const *keys, int64_t *out) {
  const char *k = q_key(q, keys);
  if (!k) return cfg_err(c, "quantization_config", "quantization_config.%s is missing", keys[0]);
  const json_t *j = json_object_get(q, k);
  if (!json_is_integer(j) || json_integer_value(j) < INT32_MIN || json_integer_value(j) > INT32_MAX)
    return cfg_err_in(c, "quantization_config", k, "must be an integer");
  *out = json_integer_value(j);
  return NULL;
}

static smelt_status q_bool(const HfConfig *c, const json_t *q, const char *key, bool def, bool *out) {
  const json_t *j = json_object_get(q, key);
  *out = def;
  if (is_null(j)) return NULL;
  if (!json_is_boolean(j)) return cfg_err_in(c, "quantization_config", key, "must be true or false");
  *out = json_is_true(j);
  return NULL;
}

/* A string field; absent (or null) gives def. */
static smelt_status q_str(const HfConfig *c, const json_t *q, const char *key, const char *def, const char **out) {
  const json_t *j = json_object_get(q, key);
  *out = def;
  if (is_null(j)) return NULL;
  if (!json_is_string(j)) return cfg_err_in(c, "quantization_config", key, "must be a string");
  *out = json_string_value(j);
  return NULL;
}

/* GPTQ (AutoGPTQ, GPTQModel, optimum) and AutoAWQ's GEMM packing are read;
 * every other method or packing is refused here, before any tensor is. */
static smelt_status read_quant(HfConfig *c) {
  const json_t *q = json_object_get(c->root, "quantization_config");
  HfQuant *hq = &c->quant;
  hq->method = HQ_NONE;
  if (is_null(q)) return NULL;
  if (!json_is_object(q)) return cfg_err(c, "quantization_config", "'quantization_config' must be an object");
  const char *m;
  RETURN_IF_ERROR(q_str(c, q, "quant_method", NULL, &m));
  if (!m) return cfg_err(c, "quantization_config", "quantization_config has no quant_method (smelt imports gptq and "
                                                   "awq checkpoints)");
  if (!strcmp(m, "gptq")) hq->method = HQ_GPTQ;
  else if (!strcmp(m, "awq")) hq->method = HQ_AWQ;
  else
    return cfg_err_in(c, "quantization_config", "quant_method",
                      "'%s' is not supported (smelt imports gptq and awq checkpoints)", m);
  int64_t bits, group;
  RETURN_IF_ERROR(q_int(c, q, (const char *const[]){"bits", "w_bit", NULL}, &bits));
  RETURN_IF_ERROR(q_int(c, q, (const char *const[]){"group_size", "q_group_size", NULL}, &group));
  const char *bkey = q_key(q, (const char *const[]){"bits", "w_bit", NULL});
  const char *gkey = q_key(q, (const char *const[]){"group_size", "q_group_size", NULL});
  if (hq->method == HQ_GPTQ ? bits != 4 && bits != 8 : bits != 4)
    return cfg_err_in(c, "quantization_config", bkey, "%" PRId64 "-bit %s is not supported (smelt reads %s)", bits,
                      m, hq->method == HQ_GPTQ ? "4- and 8-bit GPTQ" : "4-bit AWQ");
  if (group == 0 || group < -1)
    return cfg_err_in(c, "quantization_config", gkey, "must be positive, or -1 for one group per row");
  hq->bits = (int)bits;
  hq->group = group;
  hq->group_key = gkey;
  const json_t *dyn = json_object_get(q, "dynamic");
  if (!is_null(dyn) && !(json_is_object(dyn) && json_object_size(dyn) == 0))
    return cfg_err_in(c, "quantization_config", "dynamic",
                      "per-module quantisation settings are not supported (one bits and group_size for all)");
  if (hq->method == HQ_GPTQ) {
    const char *fmt, *pack;
    bool marlin, sym, desc_act;
    RETURN_IF_ERROR(q_str(c, q, "checkpoint_format", "gptq", &fmt));
    RETURN_IF_ERROR(q_str(c, q, "pack_dtype", "int32", &pack));
    RETURN_IF_ERROR(q_bool(c, q, "is_marlin_format", false, &marlin));
    /* checked, but the tensors decide: g_idx whether it is act-order, the zeros whether symmetric */
    RETURN_IF_ERROR(q_bool(c, q, "desc_act", false, &desc_act));
    RETURN_IF_ERROR(q_bool(c, q, "sym", true, &sym));
    if (marlin || (strcmp(fmt, "gptq") && strcmp(fmt, "gptq_v2")))
      return cfg_err_in(c, "quantization_config", marlin ? "is_marlin_format" : "checkpoint_format",
                        "the %s packing is not supported (smelt reads checkpoint_format gptq and gptq_v2)",
                        marlin ? "marlin" : fmt);
    if (strcmp(pack, "int32"))
      return cfg_err_in(c, "quantization_config", "pack_dtype", "'%s' is not supported (smelt reads int32 packing)",
                        pack);
    hq->v1 = !strcmp(fmt, "gptq");
  } else {
    const char *version, *backend;
    bool zp;
    RETURN_IF_ERROR(q_str(c, q, "version", "gemm", &version));
    RETURN_IF_ERROR(q_str(c, q, "backend", "autoawq", &backend));
    RETURN_IF_ERROR(q_bool(c, q, "zero_point", true, &zp));
    if (strcasecmp(version, "gemm"))
      return cfg_err_in(c, "quantization_config", "version",
                        "AWQ version '%s' is not supported (smelt reads AutoAWQ's gemm packing)", version);
    if (strcmp(backend, "autoawq"))
      return cfg_err_in(c, "quantization_config", "backend",
                        "AWQ backend '%s' is not supported (smelt reads AutoAWQ's gemm packing)", backend);
    if (!zp)
      return cfg_err_in(c, "quantization_config", "zero_point",
                        "AWQ without zero points is not supported (AutoAWQ's gemm packing has them)");
  }
  return NULL;
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
  RETURN_IF_ERROR(read_quant(c));

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

/* Where tensor name is: *out_t NULL when the weights do not have it (*out_s
 * is then the file it would be in, for messages), an error when the index
 * maps it to a file that does not hold it. */
static smelt_status find_tensor(const Hf *h, const char *name, const Shard **out_s, const SafeTensor **out_t) {
  *out_s = &h->shard[0];
  *out_t = NULL;
  if (!h->weight_map) {
    *out_t = fe_safetensors_find(h->shard[0].st, name);
    return NULL;
  }
  const json_t *f = json_object_get(h->weight_map, name);
  if (!f) return NULL;
  const Shard *s = NULL;
  for (int i = 0; i < h->nshard && !s; i++)
    if (!strcmp(h->shard[i].base, json_string_value(f))) s = &h->shard[i];
  *out_s = s;
  *out_t = fe_safetensors_find(s->st, name);
  if (!*out_t)
    return st_at((SrcLoc){s->file, 0, 0}, "tensor '%s' is not in this file (%s maps it here)", name,
                 "model.safetensors.index.json");
  return NULL;
}

/* The error for a tensor that the model needs and the weights lack. */
static smelt_status missing_tensor(const Hf *h, const Shard *s, const char *name, const char *why) {
  if (h->weight_map) return st_at((SrcLoc){h->index_path, 0, 0}, "tensor '%s' is not in weight_map (%s)", name, why);
  return st_at((SrcLoc){s->file, 0, 0}, "tensor '%s' is missing (%s)", name, why);
}

static smelt_status check_shape(const Shard *s, const SafeTensor *t, int rank, const int64_t *dim,
                                const char *implied_by) {
  if (t->rank == rank && !memcmp(t->dim, dim, sizeof(int64_t) * (size_t)rank)) return NULL;
  char have[160], want[160];
  shape_text(t->rank, t->dim, have, sizeof have);
  shape_text(rank, dim, want, sizeof want);
  return st_at((SrcLoc){s->file, 0, 0}, "tensor '%s' has shape %s, %s implies %s", t->name, have, implied_by, want);
}

/* Checks that tensor name is in the weights with the given shape and the
 * checkpoint's float dtype (the first tensor checked sets it). */
static smelt_status check_tensor(Hf *h, const char *name, int rank, const int64_t *dim) {
  const Shard *s;
  const SafeTensor *t;
  RETURN_IF_ERROR(find_tensor(h, name, &s, &t));
  if (!t) {
    char why[96];
    snprintf(why, sizeof why, "a %s needs it", h->c.arch);
    return missing_tensor(h, s, name, why);
  }
  RETURN_IF_ERROR(check_shape(s, t, rank, dim, "config.json"));
  if (t->dt != DT_F32 && t->dt != DT_F16 && t->dt != DT_BF16)
    return st_at((SrcLoc){s->file, 0, 0}, "tensor '%s' is %s: smelt imports F32, F16 and BF16 checkpoints", name,
                 t->st_dtype);
  if (h->dt == DT_INVALID) h->dt = t->dt;
  else if (t->dt != h->dt)
    return st_at((SrcLoc){s->file, 0, 0}, "tensor '%s' is %s, the other weights are %s: smelt wants one dtype", name,
                 t->st_dtype, dt_name(h->dt));
  return NULL;
}

/* ---- quantised linears ---- */

/* AutoAWQ packs the columns 0 2 4 6 1 3 5 7 of each eight into the nibbles
 * 0..7 of an int32: column c is in nibble awq_slot[c]. */
static const unsigned char awq_slot[8] = {0, 4, 1, 5, 2, 6, 3, 7};

static uint32_t le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The zero of group g of output n, as dequantisation subtracts it (GPTQ
 * v1's stored zero plus one). */
static unsigned zero_at(const HfQuant *q, const SafeTensor *qz, int64_t g, int64_t n) {
  const unsigned char *row = (const unsigned char *)qz->data + (size_t)(g * qz->dim[1]) * 4;
  if (q->method == HQ_AWQ) return le32(row + 4 * (size_t)(n / 8)) >> (4 * awq_slot[n % 8]) & 15;
  int pp = 32 / q->bits;
  unsigned mask = (1u << q->bits) - 1;
  return (le32(row + 4 * (size_t)(n / pp)) >> (q->bits * (n % pp)) & mask) + (q->v1 ? 1 : 0);
}

/* A packed (I32) or scales (float) tensor of the quantised linear at prefix:
 * present, and of the shape that layout (the linear's [out, in] and the
 * quantisation, in words) implies. */
static smelt_status check_qtensor(const Hf *h, const char *prefix, const char *what, bool packed, int rank,
                                  const int64_t *dim, const char *layout, const SafeTensor **out) {
  char name[192];
  snprintf(name, sizeof name, "%s.%s", prefix, what);
  const Shard *s;
  const SafeTensor *t;
  RETURN_IF_ERROR(find_tensor(h, name, &s, &t));
  if (!t) {
    char why[96];
    snprintf(why, sizeof why, "a %s linear has qweight, qzeros and scales", quant_name(h->c.quant.method));
    return missing_tensor(h, s, name, why);
  }
  RETURN_IF_ERROR(check_shape(s, t, rank, dim, layout));
  if (packed && t->dt != DT_I32)
    return st_at((SrcLoc){s->file, 0, 0}, "tensor '%s' is %s: %s packs it in I32", name, t->st_dtype,
                 quant_name(h->c.quant.method));
  if (!packed && t->dt != DT_F32 && t->dt != DT_F16 && t->dt != DT_BF16)
    return st_at((SrcLoc){s->file, 0, 0}, "tensor '%s' is %s: scales are F16, BF16 or F32", name, t->st_dtype);
  *out = t;
  return NULL;
}

/* Checks the quantised linear at prefix ([n, k] as a float weight) whose
 * qweight t is in shard s, scans its zeros (for the dtypes of the repacked
 * weights) and its g_idx, and records it. */
static smelt_status check_qlinear(Hf *h, int kind, const char *prefix, int64_t n, int64_t k, const Shard *s,
                                  const SafeTensor *t) {
  const HfQuant *q = &h->c.quant;
  bool gptq = q->method == HQ_GPTQ;
  int pp = 32 / q->bits;
  int64_t G = q->group < 0 ? k : q->group;
  if (k % G)
    return cfg_err_in(&h->c, "quantization_config", q->group_key,
                      "%" PRId64 " does not divide the %" PRId64 " inputs of '%s'", G, k, prefix);
  int64_t ng = k / G;
  /* GPTQ packs K in qweight and N in qzeros, AWQ N in both */
  if ((gptq && k % pp) || n % pp)
    return st_at((SrcLoc){s->file, 0, 0},
                 "'%s' is [%" PRId64 ", %" PRId64 "] (out, in): %s packs %d values per int32 along the %s, and %" PRId64
                 " is not a multiple of %d",
                 prefix, n, k, quant_name(q->method), pp, gptq && k % pp ? "inputs" : "outputs",
                 gptq && k % pp ? k : n, pp);
  char layout[160];
  snprintf(layout, sizeof layout, "its [out, in] = [%" PRId64 ", %" PRId64 "] in %d-bit %s with group size %" PRId64,
           n, k, q->bits, quant_name(q->method), G);
  HfQLinear *L = &h->ql[h->nql];
  memset(L, 0, sizeof *L);
  snprintf(L->prefix, sizeof L->prefix, "%s", prefix);
  L->kind = kind;
  L->n = n;
  L->k = k;
  L->group = G;
  RETURN_IF_ERROR(check_shape(s, t, 2, gptq ? (int64_t[]){k / pp, n} : (int64_t[]){k, n / 8}, layout));
  if (t->dt != DT_I32)
    return st_at((SrcLoc){s->file, 0, 0}, "tensor '%s' is %s: %s packs it in I32", t->name, t->st_dtype,
                 quant_name(q->method));
  L->qweight = t;
  RETURN_IF_ERROR(check_qtensor(h, prefix, "qzeros", true, 2, (int64_t[]){ng, n / (gptq ? pp : 8)}, layout,
                                &L->qzeros));
  RETURN_IF_ERROR(check_qtensor(h, prefix, "scales", false, 2, (int64_t[]){ng, n}, layout, &L->scales));

  unsigned mid = 1u << (q->bits - 1), mask = (1u << q->bits) - 1;
  for (int64_t g = 0; g < ng; g++)
    for (int64_t j = 0; j < n; j++) {
      unsigned z = zero_at(q, L->qzeros, g, j);
      if (z != mid) h->all_mid = false;
      if (z > mask) h->zero_wide = true;
    }

  if (gptq) {
    char name[192];
    snprintf(name, sizeof name, "%s.g_idx", prefix);
    const Shard *gs;
    const SafeTensor *gi;
    RETURN_IF_ERROR(find_tensor(h, name, &gs, &gi));
    if (gi) {
      RETURN_IF_ERROR(check_shape(gs, gi, 1, (int64_t[]){k}, layout));
      if (gi->dt != DT_I32)
        return st_at((SrcLoc){gs->file, 0, 0}, "tensor '%s' is %s: g_idx is I32", name, gi->st_dtype);
      /* act-order: smelt's groups are runs of G inputs, so the inputs are
       * sorted by group, which needs G of them in each */
      int64_t *count = calloc((size_t)ng, sizeof *count);
      if (!count) return st_error(ST_NO_MEMORY, "out of memory");
      for (int64_t i = 0; i < k; i++) {
        int32_t v = (int32_t)le32((const unsigned char *)gi->data + 4 * (size_t)i);
        if (v < 0 || v >= ng) {
          free(count);
          return st_at((SrcLoc){gs->file, 0, 0},
                       "tensor '%s': g_idx[%" PRId64 "] is %" PRId32 ", not one of the %" PRId64 " groups", name, i,
                       v, ng);
        }
        count[v]++;
        if (v != i / G) L->perm = true;
      }
      for (int64_t g = 0; g < ng && L->perm; g++)
        if (count[g] != G) {
          int64_t c = count[g];
          free(count);
          return st_at((SrcLoc){gs->file, 0, 0},
                       "tensor '%s': group %" PRId64 " has %" PRId64 " inputs, not the group size %" PRId64
                       " (smelt reads act-order checkpoints whose groups are all that size)",
                       name, g, c, G);
        }
      free(count);
      L->g_idx = gi;
    }
  }
  h->lin[kind].perm |= L->perm;
  h->lin[kind].group = G;
  h->nql++;
  return NULL;
}

/* The linear of the given kind at prefix ("model.layers.3.mlp.up_proj"),
 * [n, k] as a float weight: a float weight, or a quantised one when the
 * checkpoint has its qweight.  Every layer's must be alike. */
static smelt_status check_linear(Hf *h, int kind, int64_t layer, const char *prefix, int64_t n, int64_t k) {
  char name[192];
  snprintf(name, sizeof name, "%s.qweight", prefix);
  const Shard *s;
  const SafeTensor *t;
  RETURN_IF_ERROR(find_tensor(h, name, &s, &t));
  if (!t) {
    snprintf(name, sizeof name, "%s.weight", prefix);
    const SafeTensor *w;
    RETURN_IF_ERROR(find_tensor(h, name, &s, &w));
    if (!w && h->c.quant.method != HQ_NONE) return missing_tensor(h, s, name, "and there is no qweight either");
  }
  HfLinear *L = &h->lin[kind];
  if (layer <= 0) {
    L->quant = t != NULL;
    L->n = n;
    L->k = k;
  } else if (L->quant != (t != NULL)) {
    return st_at((SrcLoc){s->file, 0, 0},
                 "'%s' is %s but 'model.layers.0.%s' is %s: smelt imports models whose layers are quantised alike",
                 prefix, t ? "quantised (it has a qweight)" : "not quantised", hf_linears[kind].suffix,
                 L->quant ? "quantised" : "not");
  }
  if (!t) return check_tensor(h, name, 2, (int64_t[]){n, k});
  if (h->c.quant.method == HQ_NONE)
    return st_at((SrcLoc){s->file, 0, 0},
                 "tensor '%s' is a quantised weight, but config.json has no quantization_config (smelt reads GPTQ "
                 "and AWQ checkpoints by theirs)",
                 name);
  return check_qlinear(h, kind, prefix, n, k, s, t);
}

static smelt_status check_weights(Hf *h) {
  const HfConfig *c = &h->c;
  int64_t qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim;
  h->ql = calloc((size_t)(c->layers * LIN_HEAD + 1), sizeof *h->ql);
  if (!h->ql) return st_error(ST_NO_MEMORY, "out of memory");
  h->all_mid = true;
  RETURN_IF_ERROR(check_tensor(h, "model.embed_tokens.weight", 2, (int64_t[]){c->vocab, c->hidden}));
  RETURN_IF_ERROR(check_tensor(h, "model.norm.weight", 1, (int64_t[]){c->hidden}));
  if (!c->tied) RETURN_IF_ERROR(check_linear(h, LIN_HEAD, -1, "lm_head", c->vocab, c->hidden));
  const int64_t lin_n[LIN_HEAD] = {qd, kvd, kvd, c->hidden, c->ffn, c->ffn, c->hidden};
  const int64_t lin_k[LIN_HEAD] = {c->hidden, c->hidden, c->hidden, qd, c->hidden, c->hidden, c->ffn};
  for (int64_t i = 0; i < c->layers; i++) {
    char n[256];
#define LAYER_TENSOR(suffix, rank, ...)                                                  \
  do {                                                                                   \
    snprintf(n, sizeof n, "model.layers.%" PRId64 ".%s", i, suffix);                     \
    RETURN_IF_ERROR(check_tensor(h, n, rank, (int64_t[]){__VA_ARGS__}));                 \
  } while (0)
    LAYER_TENSOR("input_layernorm.weight", 1, c->hidden);
    LAYER_TENSOR("post_attention_layernorm.weight", 1, c->hidden);
    for (int kind = 0; kind < LIN_HEAD; kind++) {
      snprintf(n, sizeof n, "model.layers.%" PRId64 ".%s", i, hf_linears[kind].suffix);
      RETURN_IF_ERROR(check_linear(h, kind, i, n, lin_n[kind], lin_k[kind]));
    }
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
  if (h->nql) {
    /* A symmetric checkpoint (every zero 2^(bits-1)) becomes signed weights
     * without zeros, q - 2^(bits-1), which the fast kernels read; otherwise
     * unsigned weights with zeros of their width, or floats where GPTQ v1
     * stored 2^bits - 1 (a zero of 2^bits, which AutoGPTQ's kernels use). */
    bool b4 = c->quant.bits == 4;
    h->qdt = h->all_mid ? (b4 ? DT_I4 : DT_I8) : (b4 ? DT_U4 : DT_U8);
    h->zdt = h->all_mid ? DT_INVALID : h->zero_wide ? h->dt : b4 ? DT_U4 : DT_U8;
  }
  return NULL;
}

/* ---- the repacked weights ---- */

/* The [N, K] values of a quantised linear's weight, one byte each. */
static void unpack_weight(const HfQuant *q, const HfQLinear *L, unsigned char *v) {
  const unsigned char *w = L->qweight->data;
  int64_t N = L->n, K = L->k;
  enum { TILE = 64 }; /* outputs at a time: the rows of v written stay in cache */
  if (q->method == HQ_GPTQ) {
    int pp = 32 / q->bits;
    unsigned mask = (1u << q->bits) - 1;
    for (int64_t n0 = 0; n0 < N; n0 += TILE) {
      int64_t n1 = n0 + TILE < N ? n0 + TILE : N;
      for (int64_t r = 0; r < K / pp; r++)
        for (int64_t n = n0; n < n1; n++) {
          uint32_t x = le32(w + 4 * (size_t)(r * N + n));
          unsigned char *d = v + (size_t)(n * K + r * pp);
          for (int j = 0; j < pp; j++) d[j] = (unsigned char)(x >> (q->bits * j) & mask);
        }
    }
    return;
  }
  int64_t W = N / 8; /* AWQ: [K, N/8] */
  for (int64_t c0 = 0; c0 < W; c0 += TILE / 8) {
    int64_t c1 = c0 + TILE / 8 < W ? c0 + TILE / 8 : W;
    for (int64_t k = 0; k < K; k++)
      for (int64_t c = c0; c < c1; c++) {
        uint32_t x = le32(w + 4 * (size_t)(k * W + c));
        for (int j = 0; j < 8; j++) v[(size_t)((8 * c + j) * K + k)] = (unsigned char)(x >> (4 * awq_slot[j]) & 15);
      }
  }
}

/* GPTQ in input order: each int32 of qweight [K/pp, N] is already the four
 * bytes of row n of the [N, K] weight at byte 4r (value j of the word is
 * element pp r + j, in bits bits*j, as ir/dtype.h packs i4/u4 and as u8
 * lies), so the repacking is a transpose of words, in blocks for the cache,
 * with flip xor'ed into each. */
static void transpose_words(const unsigned char *src, int64_t R, int64_t N, uint32_t flip, unsigned char *dst) {
  enum { B = 32 };
  for (int64_t r0 = 0; r0 < R; r0 += B)
    for (int64_t n0 = 0; n0 < N; n0 += B)
      for (int64_t n = n0; n < n0 + B && n < N; n++)
        for (int64_t r = r0; r < r0 + B && r < R; r++) {
          uint32_t x = le32(src + 4 * (size_t)(r * N + n)) ^ flip;
          unsigned char *d = dst + 4 * (size_t)(n * R + r);
          d[0] = (unsigned char)x;
          d[1] = (unsigned char)(x >> 8);
          d[2] = (unsigned char)(x >> 16);
          d[3] = (unsigned char)(x >> 24);
        }
}

/* The inputs sorted by group, stably: perm[j] is the input at j, and the
 * groups are runs of G (check_qlinear made sure each has G members). */
static bool make_perm(const HfQLinear *L, int32_t *perm) {
  int64_t K = L->k, G = L->group;
  if (!L->g_idx || !L->perm) {
    for (int64_t j = 0; j < K; j++) perm[j] = (int32_t)j;
    return true;
  }
  int64_t *next = malloc(sizeof *next * (size_t)(K / G));
  if (!next) return false;
  for (int64_t g = 0; g < K / G; g++) next[g] = g * G;
  for (int64_t k = 0; k < K; k++) {
    int32_t g = (int32_t)le32((const unsigned char *)L->g_idx->data + 4 * (size_t)k);
    perm[next[g]++] = (int32_t)k;
  }
  free(next);
  return true;
}

static uint64_t packed_bytes(DType dt, int64_t count) { return ((uint64_t)count * (uint64_t)dt_bits(dt) + 7) / 8; }

static void put_entry(FeStHeader *hd, const char *prefix, const char *what, DType dt, int rank, int64_t d0,
                      int64_t d1) {
  char name[512];
  snprintf(name, sizeof name, "%s.%s", prefix, what);
  fe_st_header_add(hd, name, dt, rank, (int64_t[]){d0, d1});
}

/* The tensors of one quantised linear, in the order put_entry declared
 * them: weight, scales, zeros (if any), the permutation (if the kind has
 * one). */
static bool write_qlinear(const Hf *h, const HfQLinear *L, FILE *f) {
  const HfQuant *q = &h->c.quant;
  int64_t N = L->n, K = L->k, ng = K / L->group;
  unsigned mid = 1u << (q->bits - 1);
  size_t nk = (size_t)(N * K), wbytes = (size_t)packed_bytes(h->qdt, N * K);
  size_t sbytes = (size_t)(ng * L->scales->dim[1]) * dt_size(L->scales->dt);
  size_t zbytes = h->zdt ? (size_t)packed_bytes(h->zdt, N * ng) : 0;
  size_t obytes = (size_t)(N * ng) * dt_size(h->dt);
  /* GPTQ in input order is a transpose of words; AWQ and act-order are
   * unpacked to a byte per value first */
  bool words = q->method == HQ_GPTQ && !L->perm;
  unsigned char *v = words ? NULL : malloc(nk), *w = calloc(1, wbytes), *sraw = malloc(sbytes), *so = malloc(obytes);
  unsigned char *z = zbytes ? calloc(1, zbytes) : NULL;
  int32_t *perm = malloc(sizeof *perm * (size_t)K);
  bool ok = (words || v) && w && sraw && so && perm && (!zbytes || z) && make_perm(L, perm);
  /* signed weights are q - 2^(bits-1): in two's complement, q with the top bit flipped */
  unsigned flip = h->all_mid ? mid : 0;
  if (ok && words) {
    uint32_t flips = 0;
    for (int j = 0; j < 32 / q->bits; j++) flips |= (uint32_t)flip << (q->bits * j);
    transpose_words(L->qweight->data, K * q->bits / 32, N, flips, w);
  } else if (ok) {
    unpack_weight(q, L, v);
    for (int64_t n = 0; n < N; n++) {
      const unsigned char *row = v + (size_t)(n * K);
      for (int64_t j = 0; j < K; j++) {
        size_t i = (size_t)(n * K + j);
        unsigned x = row[perm[j]] ^ flip;
        if (q->bits == 8) w[i] = (unsigned char)x;
        else w[i / 2] |= (unsigned char)(x << (4 * (i & 1)));
      }
    }
  }
  if (ok) {
    /* scales [K/G, N] -> [N, K/G] in the checkpoint's dtype; the file's data may be unaligned */
    memcpy(sraw, L->scales->data, sbytes);
    for (int64_t g = 0; g < ng; g++)
      for (int64_t n = 0; n < N; n++)
        dt_store(h->dt, so, (size_t)(n * ng + g), dt_load(L->scales->dt, sraw, (size_t)(g * N + n)));
    if (z)
      for (int64_t g = 0; g < ng; g++)
        for (int64_t n = 0; n < N; n++) {
          size_t i = (size_t)(n * ng + g);
          unsigned x = zero_at(q, L->qzeros, g, n);
          if (h->zdt == DT_U4) z[i / 2] |= (unsigned char)(x << (4 * (i & 1)));
          else if (h->zdt == DT_U8) z[i] = (unsigned char)x;
          else dt_store(h->zdt, z, i, x);
        }
    ok = fwrite(w, 1, wbytes, f) == wbytes && fwrite(so, 1, obytes, f) == obytes &&
         (!z || fwrite(z, 1, zbytes, f) == zbytes);
    if (ok && h->lin[L->kind].perm)
      for (int64_t j = 0; j < K && ok; j++) {
        uint32_t x = (uint32_t)perm[j];
        unsigned char b[4] = {(unsigned char)x, (unsigned char)(x >> 8), (unsigned char)(x >> 16),
                              (unsigned char)(x >> 24)};
        ok = fwrite(b, 1, 4, f) == 4;
      }
  }
  free(v);
  free(w);
  free(sraw);
  free(so);
  free(z);
  free(perm);
  return ok;
}

/* The model's name (the checkpoint directory's), as the YAML says it. */
static const char *model_name(const Hf *h) {
  const char *base = strrchr(h->dir, '/');
  base = base && base[1] ? base + 1 : h->dir;
  return *base && strcmp(base, ".") ? base : "hf_model";
}

/* Writes the quantised linears as dequantize reads them into NAME.gptq.safetensors
 * (or .awq) in yaml_dir: weights [N, K] (the fast kernels' layout: passes/
 * quantize.c), scales and zeros [N, K/G], and the input permutation of
 * act-order kinds.  The names are the checkpoint's with a suffix that no
 * HF tensor has (".qweight.nk"), so the two files never disagree on one. */
static smelt_status write_quant(Hf *h, const char *yaml_dir) {
  if (!yaml_dir)
    return st_error(ST_INVALID_INPUT, "%s: error: a quantised checkpoint needs a directory for its repacked weights",
                    h->dir);
  const char *name = model_name(h), *ext = h->c.quant.method == HQ_GPTQ ? "gptq" : "awq";
  size_t n = strlen(yaml_dir) + strlen(name) + 32;
  h->qpath = malloc(n);
  if (!h->qpath) return st_error(ST_NO_MEMORY, "out of memory");
  snprintf(h->qpath, n, "%s/%s.%s.safetensors", yaml_dir, name, ext);

  FeStHeader hd;
  RETURN_IF_ERROR(fe_st_header_open(&hd));
  for (int i = 0; i < h->nql; i++) {
    const HfQLinear *L = &h->ql[i];
    int64_t ng = L->k / L->group;
    put_entry(&hd, L->prefix, "qweight.nk", h->qdt, 2, L->n, L->k);
    put_entry(&hd, L->prefix, "scales.nk", h->dt, 2, L->n, ng);
    if (h->zdt) put_entry(&hd, L->prefix, "qzeros.nk", h->zdt, 2, L->n, ng);
    if (h->lin[L->kind].perm) put_entry(&hd, L->prefix, "g_idx.perm", DT_I32, 1, L->k, 0);
  }
  FILE *f = fopen(h->qpath, "wb");
  if (!f) {
    fclose(hd.json);
    free(hd.buf);
    return st_error(ST_IO, "%s: error: cannot write the repacked weights: %s", h->qpath, strerror(errno));
  }
  smelt_status wst = fe_st_header_write(&hd, f, h->qpath);
  bool ok = !wst;
  st_free(wst); /* reported below, with the file removed */
  for (int i = 0; i < h->nql && ok; i++) ok = write_qlinear(h, &h->ql[i], f);
  ok &= fclose(f) == 0;
  if (!ok) {
    remove(h->qpath);
    return st_error(ST_IO, "%s: error: cannot write the repacked weights (out of memory or disk space)", h->qpath);
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

/* out = in @ w^T (+ bias), w the weight of the linear of the given kind (or
 * -1 for the tied embedding).  A quantised kind's weight is the dequantize
 * of its params (put_qparams), and act-order kinds read their input
 * permuted as the weight's columns are. */
static void put_linear(FILE *f, const Hf *h, const char *ind, int kind, const char *out, const char *in,
                       const char *w, const char *bias) {
  char pin[80];
  const HfLinear *L = kind >= 0 ? &h->lin[kind] : NULL;
  if (L && L->quant) {
    fprintf(f, "%s- {out: %s, op: dequantize, in: [%s_q, %s_s%s%s%s], axis: 1, group: %" PRId64 "}\n", ind, w, w, w,
            h->zdt ? ", " : "", h->zdt ? w : "", h->zdt ? "_z" : "", L->group);
    if (L->perm) {
      snprintf(pin, sizeof pin, "%s_in", out);
      fprintf(f, "%s- {out: %s, op: gather, in: [%s, %s_perm], axis: -1}\n", ind, pin, in, w);
      in = pin;
    }
  }
  if (bias) {
    fprintf(f, "%s- {out: %s_mm, op: matmul, in: [%s, %s], transpose_b: true}\n", ind, out, in, w);
    fprintf(f, "%s- {out: %s, op: add, in: [%s_mm, %s]}\n", ind, out, out, bias);
  } else {
    fprintf(f, "%s- {out: %s, op: matmul, in: [%s, %s], transpose_b: true}\n", ind, out, in, w);
  }
}

static void put_param(FILE *f, const char *indent, const char *name, const char *shape, const char *from) {
  fprintf(f, "%s%s: {shape: %s, from: ", indent, name, shape);
  put_q(f, from);
  fputs("}\n", f);
}

/* The weight of the linear of the given kind: its float weight, or the
 * repacked tensors that dequantize reads (write_quant): w_q [out, in],
 * w_s and w_z [out, in/G], and w_perm [in] for act-order.  prefix is what
 * comes before the module's name ("model.layers.{i}."). */
static void put_weight(FILE *f, const Hf *h, const char *indent, int kind, const char *prefix) {
  const HfLinear *L = &h->lin[kind];
  const char *w = hf_linears[kind].param, *dn = hf_linears[kind].n, *dk = hf_linears[kind].k;
  char from[192], shape[96];
  if (!L->quant) {
    snprintf(from, sizeof from, "%s%s.weight", prefix, hf_linears[kind].suffix);
    snprintf(shape, sizeof shape, "[%s, %s]", dn, dk);
    put_param(f, indent, w, shape, from);
    return;
  }
  int64_t ng = L->k / L->group;
  snprintf(from, sizeof from, "%s%s.qweight.nk", prefix, hf_linears[kind].suffix);
  fprintf(f, "%s%s_q: {shape: [%s, %s], dtype: %s, from: ", indent, w, dn, dk, dt_name(h->qdt));
  put_q(f, from);
  fputs("}\n", f);
  snprintf(from, sizeof from, "%s%s.scales.nk", prefix, hf_linears[kind].suffix);
  snprintf(shape, sizeof shape, "[%s, %" PRId64 "]", dn, ng);
  char pname[48];
  snprintf(pname, sizeof pname, "%s_s", w);
  put_param(f, indent, pname, shape, from);
  if (h->zdt) {
    snprintf(from, sizeof from, "%s%s.qzeros.nk", prefix, hf_linears[kind].suffix);
    fprintf(f, "%s%s_z: {shape: %s, ", indent, w, shape);
    if (!dt_is_float(h->zdt)) fprintf(f, "dtype: %s, ", dt_name(h->zdt));
    fputs("from: ", f);
    put_q(f, from);
    fputs("}\n", f);
  }
  if (L->perm) {
    snprintf(from, sizeof from, "%s%s.g_idx.perm", prefix, hf_linears[kind].suffix);
    fprintf(f, "%s%s_perm: {shape: [%s], dtype: i32, from: ", indent, w, dk);
    put_q(f, from);
    fputs("}\n", f);
  }
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
  if (h->nql) {
    const char *qbase = strrchr(h->qpath, '/') ? strrchr(h->qpath, '/') + 1 : h->qpath;
    int nperm = 0;
    for (int k = 0; k < NLIN; k++) nperm += h->lin[k].quant && h->lin[k].perm;
    fprintf(f, "# %s %d-bit, group size %" PRId64 "%s: %d linears repacked into %s:\n",
            quant_name(c->quant.method), c->quant.bits, h->ql[0].group,
            c->quant.method == HQ_GPTQ ? (c->quant.v1 ? " (checkpoint_format gptq)" : " (gptq_v2)") : " (gemm)",
            h->nql, qbase);
    if (h->all_mid)
      fprintf(f, "# %s [out, in] weights (symmetric: q - %u) and [out, in/G] scales, read through dequantize.\n",
              dt_name(h->qdt), 1u << (c->quant.bits - 1));
    else
      fprintf(f, "# %s [out, in] weights, [out, in/G] scales and %s zeros, read through dequantize.\n",
              dt_name(h->qdt), dt_name(dt_is_float(h->zdt) ? dt : h->zdt));
    if (nperm)
      fputs("# Act-order (g_idx): the weights' inputs are sorted by group, and so are the matmuls' inputs (gather).\n",
            f);
  }
  fputs("smelt: 1\nname: ", f);
  put_q(f, model_name(h));
  fprintf(f, "\ndtype: %s\n", dt_name(dt));
  fprintf(f, "dims: {seq: %" PRId64, seq);
  if (cache) fprintf(f, ", ctx: %" PRId64, ctx);
  fprintf(f,
          ", hidden: %" PRId64 ", heads: %" PRId64 ", kv_heads: %" PRId64 ", head_dim: %" PRId64 ", q_dim: %" PRId64
          ", kv_dim: %" PRId64 ", ffn: %" PRId64 ", vocab: %" PRId64 ", layers: %" PRId64 "}\n",
          c->hidden, c->heads, c->kv_heads, c->head_dim, c->heads * c->head_dim, c->kv_heads * c->head_dim, c->ffn,
          c->vocab, c->layers);
  fputs("weights: ", f);
  int nfiles = h->nshard + (h->qpath != NULL);
  if (nfiles > 1) fputc('[', f);
  for (int i = 0; i < nfiles; i++) {
    char *r = yaml_ref(yaml_dir, i < h->nshard ? h->shard[i].file : h->qpath);
    if (!r) {
      fclose(f);
      free(text);
      return st_error(ST_NO_MEMORY, "out of memory");
    }
    fputs(i ? ", " : "", f);
    put_q(f, r);
    free(r);
  }
  if (nfiles > 1) fputc(']', f);
  fputs("\ninputs:\n  ids: {shape: [seq], dtype: i32}\n  pos: {shape: [seq], dtype: i32}\n", f);

  fputs("params:\n", f);
  put_param(f, "  ", "embed", "[vocab, hidden]", "model.embed_tokens.weight");
  put_param(f, "  ", "final_norm", "[hidden]", "model.norm.weight");
  if (!c->tied) put_weight(f, h, "  ", LIN_HEAD, "");
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
  for (int k = 0; k < LIN_HEAD; k++) put_weight(f, h, P, k, "model.layers.{i}.");
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
  put_linear(f, h, P, LIN_Q, "q0", "h", "wq", c->attn_bias ? "bq" : NULL);
  put_linear(f, h, P, LIN_K, "k0", "h", "wk", c->attn_bias ? "bk" : NULL);
  put_linear(f, h, P, LIN_V, "v0", "h", "wv", c->attn_bias ? "bv" : NULL);
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
  put_linear(f, h, P, LIN_O, "o", "att_m", "wo", c->o_bias ? "bo" : NULL);
  fputs("      - {out: x1, op: add, in: [x, o]}\n"
        "      # SwiGLU MLP: (silu(h2 @ gate^T) * (h2 @ up^T)) @ down^T\n"
        "      - {out: h2, op: rms_norm, in: [x1, ffn_norm], eps: ",
        f);
  put_real(f, c->eps);
  fputs("}\n", f);
  put_linear(f, h, P, LIN_GATE, "g0", "h2", "w_gate", c->mlp_bias ? "b_gate" : NULL);
  fputs("      - {out: g, op: silu, in: [g0]}\n", f);
  put_linear(f, h, P, LIN_UP, "u", "h2", "w_up", c->mlp_bias ? "b_up" : NULL);
  fputs("      - {out: gu, op: mul, in: [g, u]}\n", f);
  put_linear(f, h, P, LIN_DOWN, "d", "gu", "w_down", c->mlp_bias ? "b_down" : NULL);
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
  if (cache) fputs("  - {out: last, op: slice, in: [hn], axis: 0, start: -1}\n", f);
  put_linear(f, h, "  ", c->tied ? -1 : LIN_HEAD, "logits", cache ? "last" : "hn", head, NULL);
  if (cache) fputs("  - {out: next, op: argmax, in: [logits], axis: -1}\noutputs: [logits, next]\n", f);
  else fputs("outputs: [logits]\n", f);
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
  if (!st && h->nql) st = write_quant(h, yaml_dir);
  if (!st) st = write_yaml(h, &o, yaml_dir, ctx, dt, out_yaml);
  if (!st && out_info) {
    *out_info = (FeHfInfo){.layers = h->c.layers, .nfiles = h->nshard + (h->qpath != NULL), .ctx = o.no_cache ? 0 : ctx,
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
  free(h->ql);
  free(h->qpath);
  free(h);
  return st;
}
