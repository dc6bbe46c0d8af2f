/* smelt generate: runs a causal LM with its KV-cache state, token by token.
 *
 * The model's contract (examples/tiny_lm.yaml, and what `smelt import hf`
 * writes): inputs `ids` [seq] and `pos` [seq] (integers), output `logits`
 * [1, vocab] of the last position and, optionally, `next` [1] (its argmax),
 * and state tensors that its runs update in place (the caches).  A run of
 * seq tokens at positions p..p+seq-1 writes their keys and values into the
 * caches and returns the logits of the last one.
 *
 * The prompt is prefilled in chunks: each chunk is a run of the
 * specialisation with the largest seq that still fits the rest of the
 * prompt (a YAML model is compiled here with seq = 1 and seq = the prompt's
 * length, so its prompt is one run; a bundle uses the specialisations it
 * has, seq = 1 among them).  Then every new token is one run of the seq = 1
 * specialisation at the next position.  All runs share the session's state;
 * nothing is copied between them.
 *
 * Greedy decoding reads the model's `next` output (4 bytes a step); on
 * CUDA the logits then stay in device memory.  Sampling (--temperature)
 * reads the logits and draws on the host: temperature, then top-k, then
 * top-p (nucleus), from a splitmix64 stream seeded by --seed.
 *
 * Before anything is timed, every specialisation the run will use runs
 * once (making its run state: on CUDA its modules, constants and CUDA
 * graph) and the state is reset; that setup is reported on its own.
 * The report: prefill time, time to first token, decode time per token and
 * tokens/s, and the fraction of the bandwidth floor: the bytes a decode step
 * must read (every constant the decode kernels read, plus the valid part of
 * each cache at the mean context) over the measured copy bandwidth, divided
 * by the measured time per token.
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "ir/clock.h"
#include "include/smelt.h"
#include "include/smelt_compile.h"
#include "runtime/cuda_driver.h"
#include "runtime/runtime.h"

static const char generate_help[] =
    "usage: smelt generate MODEL.yaml|BUNDLE.smelt|HF_DIR --prompt-ids 1,2,3 | --prompt FILE -n N [flags]\n"
    "\n"
    "Generates N tokens with a causal LM that keeps its KV cache as session state: the\n"
    "prompt is prefilled (in one run, or in chunks of the bundle's specialisations), then\n"
    "each token is one decode run (seq = 1) at the next position.  Prints the generated ids\n"
    "and the timings: prefill, time to first token, decode tokens/s and the fraction of the\n"
    "bandwidth floor per token.\n"
    "\n"
    "The model takes inputs 'ids' and 'pos' ([seq] integers) and gives 'logits' ([1, vocab])\n"
    "and optionally 'next' (the argmax); see examples/tiny_lm.yaml and docs/serving.md.\n"
    "A Hugging Face checkpoint directory (config.json + safetensors, Llama family) is\n"
    "imported as `smelt import hf` does, with its KV cache (--dim ctx=N sets its capacity).\n"
    "\n"
    "flags:\n"
    "  --prompt-ids LIST       the prompt's token ids, comma-separated\n"
    "  --prompt FILE           a file of token ids (separated by commas or white space)\n"
    "  -n N                    tokens to generate (default 16); exactly N unless --stop-at-eos\n"
    "  --greedy                pick the most likely token (the default)\n"
    "  --temperature T         sample at temperature T > 0 (then --top-k, --top-p apply)\n"
    "  --top-k K               sample among the K most likely tokens (default: all)\n"
    "  --top-p P               sample among the most likely tokens whose mass reaches P (default 1)\n"
    "  --seed S                seed of the sampler (default 0)\n"
    "  --stop-at-eos           stop after the token given by --eos\n"
    "  --eos ID                the end-of-sequence id (default 2)\n"
    "  --device cpu|cuda[:N]   where to run (default cpu)\n"
    "  --threads N             CPU worker threads\n"
    CLI_TP_HELP
    "  --dim NAME=VALUE        (YAML only) override a size of the model, e.g. --dim ctx=1024\n"
    "  --dtype DTYPE           (YAML only) default element type\n"
    "  --json                  print one JSON object with the ids and the timings\n"
    "  --dump-logits FILE.npy  write the logits of every step ([steps, vocab] f32; the first\n"
    "                          row is the prefill's), for comparing with another implementation\n"
    "  --quiet                 no progress line\n";

typedef struct {
  int64_t *v;
  int n, cap;
} IdList;

static bool ids_push(IdList *l, int64_t x) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 64;
    int64_t *p = realloc(l->v, (size_t)cap * sizeof *p);
    if (!p) return false;
    l->v = p;
    l->cap = cap;
  }
  l->v[l->n++] = x;
  return true;
}

/* Token ids separated by commas and/or white space; false on anything else. */
static bool parse_ids(const char *text, IdList *out, char *why, size_t cap) {
  const char *p = text;
  for (;;) {
    p += strspn(p, " \t\r\n,");
    if (!*p) break;
    char *end;
    long long x = strtoll(p, &end, 10);
    if (end == p || x < 0 || x > INT32_MAX || (*end && !strchr(" \t\r\n,", *end))) {
      snprintf(why, cap, "'%.20s' is not a token id (a non-negative integer)", p);
      return false;
    }
    if (!ids_push(out, x)) {
      snprintf(why, cap, "out of memory");
      return false;
    }
    p = end;
  }
  if (out->n == 0) {
    snprintf(why, cap, "no token ids");
    return false;
  }
  return true;
}

static bool read_text(const char *path, char **out) {
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  for (size_t r; buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
    n += r;
    if (n + 1 == cap) {
      char *nb = cap < ((size_t)64 << 20) ? realloc(buf, cap * 2) : NULL;
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap *= 2;
    }
  }
  fclose(f);
  if (!buf) return false;
  buf[n] = 0;
  *out = buf;
  return true;
}

/* ---- the model's interface ---- */

typedef struct {
  smelt_bundle *b;
  const Graph *g;        /* the root specialisation's */
  int in_ids, in_pos;    /* value ids in g */
  DType ids_dt, pos_dt;
  int logits, next;      /* output value ids; next = -1 when absent */
  int64_t vocab;
  int *spec_len;         /* per specialisation: its seq (length of 'ids'), the max of a range */
  int *spec_min;         /* per specialisation: the least seq it takes (spec_len but for a range) */
  int nspecs, decode_spec;
  int64_t capacity;      /* positions the states hold (the smallest scatter axis) */
  double weight_bytes;   /* constants the decode kernels read (one rank's, with --tp: each reads its own) */
  int ranks;             /* tensor-parallel ranks (1 without --tp) */
  double kv_bytes_full;  /* every state's bytes (read in full at capacity) */
} LmModel;

static int find_named(const Graph *g, const int *vals, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(g->val[vals[i]].name, name) == 0) return vals[i];
  return -1;
}

static smelt_status lm_describe(smelt_bundle *b, LmModel *m) {
  memset(m, 0, sizeof *m);
  m->b = b;
  m->g = rt_bundle_graph(b);
  m->ranks = rt_bundle_num_ranks(b);
  const Graph *g = m->g;
  const char *file = g->file ? g->file : "model";
  m->in_ids = find_named(g, g->inputs, g->ninputs, "ids");
  m->in_pos = find_named(g, g->inputs, g->ninputs, "pos");
  m->logits = find_named(g, g->outputs, g->noutputs, "logits");
  m->next = find_named(g, g->outputs, g->noutputs, "next");
  if (m->in_ids < 0 || m->in_pos < 0 || m->logits < 0)
    return st_error(ST_INVALID_INPUT, "%s: error: model '%s' cannot generate: it needs inputs 'ids' and 'pos' "
                    "([seq] integers) and an output 'logits' ([1, vocab]); see docs/serving.md", file, g->name);
  if (g->ninputs != 2)
    return st_error(ST_INVALID_INPUT, "%s: error: model '%s' has %d inputs; generate feeds only 'ids' and 'pos'", file,
                    g->name, g->ninputs);
  if (g->nstates == 0)
    return st_error(ST_INVALID_INPUT, "%s: error: model '%s' has no state: without a KV cache every token would "
                    "forget the ones before it (declare the caches under state:)", file, g->name);
  const Value *ids = &g->val[m->in_ids], *pos = &g->val[m->in_pos], *lg = &g->val[m->logits];
  m->ids_dt = ids->type.dt;
  m->pos_dt = pos->type.dt;
  if (ids->type.rank != 1 || pos->type.rank != 1 || !dt_is_int(ids->type.dt) || !dt_is_int(pos->type.dt))
    return st_error(ST_INVALID_INPUT, "%s: error: inputs 'ids' and 'pos' must be [seq] integers", file);
  if (lg->type.rank != 2 || lg->type.dim[0] != 1 || !dt_is_float(lg->type.dt))
    return st_error(ST_INVALID_INPUT, "%s: error: output 'logits' must be [1, vocab] floats (the last position's)", file);
  m->vocab = lg->type.dim[1];
  if (m->next >= 0 && (ir_type_numel(&g->val[m->next].type) != 1 || !dt_is_int(g->val[m->next].type.dt))) m->next = -1;
  m->nspecs = smelt_bundle_num_specialisations(b);
  m->spec_len = calloc((size_t)m->nspecs, sizeof *m->spec_len);
  m->spec_min = calloc((size_t)m->nspecs, sizeof *m->spec_min);
  if (!m->spec_len || !m->spec_min) return st_error(ST_NO_MEMORY, "out of memory");
  m->decode_spec = -1;
  for (int i = 0; i < m->nspecs; i++) {
    const Graph *sg = rt_bundle_graph(rt_bundle_spec(b, i));
    int v = find_named(sg, sg->inputs, sg->ninputs, "ids");
    m->spec_len[i] = m->spec_min[i] = v >= 0 ? (int)sg->val[v].type.dim[0] : 0;
    /* a ranged seq (`--dim seq=1..2048`): any length of its range */
    if (v >= 0 && sg->val[v].type.dyn[0]) {
      const TensorType *t = &sg->val[v].type;
      int64_t lo = (int64_t)t->dyn_a[0] * sg->ranges[t->dyn[0] - 1].min + t->dyn_b[0];
      m->spec_min[i] = (int)(lo > 1 ? lo : 1);
    }
    /* decoding: an exact seq = 1 first, else a range that holds 1 */
    if (m->spec_len[i] == 1 || (m->spec_min[i] == 1 && m->decode_spec < 0)) m->decode_spec = i;
  }
  if (m->decode_spec < 0)
    return st_error(ST_INVALID_INPUT, "%s: error: the bundle has no specialisation with seq = 1 for decoding "
                    "(compile it with --dim seq=1,...)", file);
  /* capacity: the positions every state updated by a scatter holds */
  const Graph *dg = rt_bundle_graph(rt_bundle_spec(b, m->decode_spec));
  m->capacity = INT64_MAX;
  for (int i = 0; i < dg->nstates; i++) {
    const Value *sv = &dg->val[dg->states[i]];
    m->kv_bytes_full += (double)ir_type_bytes(&sv->type);
    int up = ir_state_update(dg, dg->states[i]);
    if (up < 0) continue;
    int ax = ir_norm_axis(ir_attr_int(&dg->node[up], "axis"), sv->type.rank);
    if (sv->type.dim[ax] < m->capacity) m->capacity = sv->type.dim[ax];
  }
  if (m->capacity == INT64_MAX) m->capacity = INT32_MAX;
  /* the weights a decode step reads: every constant a kernel takes */
  bool *seen = calloc((size_t)dg->nval + 1, 1);
  if (!seen) return st_error(ST_NO_MEMORY, "out of memory");
  const smelt_bundle *db = rt_bundle_spec(b, m->decode_spec);
  int nk = rt_bundle_num_kernels(db);
  for (int k = 0; k < nk; k++)
    for (int a = 0; a < rt_bundle_kernel(db, k)->nargs; a++) {
      int v = rt_bundle_kernel(db, k)->args[a];
      if (dg->val[v].kind == VK_CONST && !seen[v]) {
        seen[v] = true;
        m->weight_bytes += (double)ir_type_bytes(&dg->val[v].type);
      }
    }
  free(seen);
  return NULL;
}

/* ---- sampling ---- */

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

typedef struct {
  double p;
  int id;
} Cand;

static int cmp_cand(const void *a, const void *b) {
  const Cand *x = a, *y = b;
  if (x->p != y->p) return x->p < y->p ? 1 : -1;
  return x->id - y->id;
}

typedef struct {
  bool greedy;
  double temperature, top_p;
  int top_k;
  uint64_t rng;
} Sampler;

/* Draws a token from logits (n of them, dtype dt). */
static int sample(Sampler *sp, const void *logits, DType dt, int64_t n, Cand *c) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    double x = dt_load(dt, logits, (size_t)i);
    c[i] = (Cand){.p = x, .id = (int)i};
    if (x > mx) mx = x;
  }
  if (sp->greedy) {
    int best = 0;
    for (int64_t i = 1; i < n; i++)
      if (c[i].p > c[best].p) best = (int)i;
    return best;
  }
  double sum = 0;
  for (int64_t i = 0; i < n; i++) {
    c[i].p = exp((c[i].p - mx) / sp->temperature);
    sum += c[i].p;
  }
  qsort(c, (size_t)n, sizeof *c, cmp_cand);
  int64_t keep = sp->top_k > 0 && sp->top_k < n ? sp->top_k : n;
  double mass = 0;
  for (int64_t i = 0; i < keep; i++) {
    mass += c[i].p / sum;
    if (mass >= sp->top_p) {
      keep = i + 1;
      break;
    }
  }
  double total = 0;
  for (int64_t i = 0; i < keep; i++) total += c[i].p;
  double u = (double)(splitmix64(&sp->rng) >> 11) * 0x1.0p-53 * total;
  for (int64_t i = 0; i < keep; i++) {
    u -= c[i].p;
    if (u < 0) return c[i].id;
  }
  return c[keep - 1].id;
}

/* ---- the loop ---- */

typedef struct {
  IdList prompt, out;
  int n;
  bool stop_at_eos, json, quiet, cuda;
  const char *dump_logits; /* .npy of every step's logits, or NULL */
  float *dumped;           /* [steps][vocab] */
  int ndumped;
  int64_t eos;
  int threads;
  const char *device;
  Sampler sp;
  /* results */
  double setup_s, prefill_s, ttft_s, decode_s, bw, kv_bytes_mean;
  int prefill_runs;
  char bw_how[256];
} Gen;

static void store_int(DType dt, void *p, int i, int64_t v) {
  if (dt == DT_I64) ((int64_t *)p)[i] = v;
  else if (dt == DT_I32) ((int32_t *)p)[i] = (int32_t)v;
  else dt_store(dt, p, (size_t)i, (double)v);
}

/* One run of `len` tokens at positions p0.. (the specialisation whose seq is len). */
static smelt_status step(smelt_session *s, const LmModel *m, const int64_t *tok, int len, int64_t p0, void *ids,
                         void *pos) {
  for (int i = 0; i < len; i++) {
    store_int(m->ids_dt, ids, i, tok[i]);
    store_int(m->pos_dt, pos, i, p0 + i);
  }
  int64_t dim = len;
  RETURN_IF_ERROR(smelt_session_bind_input_shaped(s, "ids", ids, 1, &dim, (size_t)len * dt_size(m->ids_dt)));
  RETURN_IF_ERROR(smelt_session_bind_input_shaped(s, "pos", pos, 1, &dim, (size_t)len * dt_size(m->pos_dt)));
  return smelt_session_run(s);
}

/* The longest prefill run for `left` prompt tokens that some
 * specialisation takes (exact lengths, or any length of a range), at
 * least 1 (the decode one). */
static int chunk_len(const LmModel *m, int64_t left) {
  int len = 1;
  for (int i = 0; i < m->nspecs; i++) {
    int64_t fit = m->spec_len[i] < left ? m->spec_len[i] : left;
    if (fit >= m->spec_min[i] && fit > len) len = (int)fit;
  }
  return len;
}

static void keep_logits(Gen *G, const void *logits, DType dt, int64_t vocab) {
  if (!G->dumped || G->ndumped >= G->n) return;
  float *row = G->dumped + (size_t)G->ndumped++ * (size_t)vocab;
  for (int64_t i = 0; i < vocab; i++) row[i] = (float)dt_load(dt, logits, (size_t)i);
}

/* Steps queued between two looks at the generated ids (the progress line,
 * --stop-at-eos): the GPU waits for the host once per chunk. */
enum { QUEUE_CHUNK = 16 };

/* Whether greedy decode can run queued on the device: each step's 'next'
 * (on the device) is the following step's 'ids', so they must have one
 * dtype. */
static bool can_queue(const LmModel *m) {
  return m->next >= 0 && m->g->val[m->next].type.dt == m->ids_dt && ir_type_numel(&m->g->val[m->next].type) == 1;
}

/* Greedy decode on CUDA without the host in the loop: every step is
 * queued on the session's stream (smelt_session_enqueue) with its inputs
 * in device memory: 'ids' copied from the step before's 'next', 'pos'
 * from a table of all the steps' positions written once, and each step's
 * 'next' copied into a history of ids.  The host queues QUEUE_CHUNK steps,
 * then reads their ids (the progress line, --stop-at-eos) while the GPU
 * goes on with nothing between its steps but three 4-byte copies.
 * Continues from token tok at position at; appends to G->out. */
static smelt_status decode_queued(Gen *G, const LmModel *m, smelt_session *s, RtCudaDevice *dev, int64_t tok,
                                  int64_t at, bool tty, double t1) {
  int steps = G->n - G->out.n;
  if (steps <= 0) return NULL;
  size_t isz = dt_size(m->ids_dt), psz = dt_size(m->pos_dt);
  RtCudaPtr d_ids = 0, d_pos = 0, d_next = 0, d_hist = 0, d_posall = 0;
  void *host = malloc((size_t)steps * (isz > psz ? isz : psz));
  smelt_status st = host ? NULL : st_error(ST_NO_MEMORY, "out of memory");
  if (!st) st = rt_cuda_alloc(dev, isz, &d_ids);
  if (!st) st = rt_cuda_alloc(dev, psz, &d_pos);
  if (!st) st = rt_cuda_alloc(dev, isz, &d_next);
  if (!st) st = rt_cuda_alloc(dev, (size_t)steps * isz, &d_hist);
  if (!st) st = rt_cuda_alloc(dev, (size_t)steps * psz, &d_posall);
  for (int i = 0; !st && i < steps; i++) store_int(m->pos_dt, host, i, at + i);
  if (!st) st = rt_cuda_upload(dev, d_posall, host, (size_t)steps * psz);
  if (!st) {
    store_int(m->ids_dt, host, 0, tok);
    st = rt_cuda_upload(dev, d_next, host, isz);
  }
  int64_t one = 1;
  if (!st) st = smelt_session_bind_input_shaped(s, "ids", (void *)(uintptr_t)d_ids, 1, &one, isz);
  if (!st) st = smelt_session_bind_input_shaped(s, "pos", (void *)(uintptr_t)d_pos, 1, &one, psz);
  if (!st) st = smelt_session_bind_output(s, "next", (void *)(uintptr_t)d_next, isz);
  double last_print = 0;
  bool stop = false;
  for (int t0 = 0; !st && !stop && t0 < steps; t0 += QUEUE_CHUNK) {
    int t1c = t0 + QUEUE_CHUNK < steps ? t0 + QUEUE_CHUNK : steps;
    for (int t = t0; !st && t < t1c; t++) {
      st = rt_cuda_copy_async(dev, d_ids, d_next, isz);
      if (!st) st = rt_cuda_copy_async(dev, d_pos, d_posall + (RtCudaPtr)t * psz, psz);
      if (!st) st = smelt_session_enqueue(s);
      if (!st) st = rt_cuda_copy_async(dev, d_hist + (RtCudaPtr)t * isz, d_next, isz);
    }
    if (!st) st = smelt_session_synchronize(s);
    if (!st) st = rt_cuda_download(dev, host, d_hist + (RtCudaPtr)t0 * isz, (size_t)(t1c - t0) * isz);
    for (int t = t0; !st && !stop && t < t1c; t++) {
      tok = (int64_t)dt_load(m->ids_dt, host, (size_t)(t - t0));
      if (!ids_push(&G->out, tok)) st = st_error(ST_NO_MEMORY, "out of memory");
      stop = G->stop_at_eos && tok == G->eos;
    }
    double now = smelt_now_s();
    if (tty && (now - last_print > 0.1 || G->out.n == G->n)) {
      fprintf(stderr, "\rgenerate: %d/%d tokens, %.1f tokens/s   ", G->out.n, G->n, (G->out.n - 1) / (now - t1));
      last_print = now;
    }
  }
  RtCudaPtr bufs[] = {d_ids, d_pos, d_next, d_hist, d_posall};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
    if (bufs[i]) rt_cuda_free(dev, bufs[i]);
  free(host);
  return st;
}

static smelt_status generate(Gen *G, const LmModel *m) {
  const Graph *g = m->g;
  if ((int64_t)G->prompt.n + G->n > m->capacity)
    return st_error(ST_INVALID_INPUT, "a prompt of %d tokens and %d new ones need %lld positions; the model's state "
                    "holds %lld (compile with a larger cache, e.g. --dim ctx=N)", G->prompt.n, G->n,
                    (long long)G->prompt.n + G->n, (long long)m->capacity);
  int maxlen = 1;
  for (int i = 0; i < m->nspecs; i++)
    if (m->spec_len[i] > maxlen) maxlen = m->spec_len[i];
  smelt_session_options so = {.threads = G->threads};
  smelt_session *s = NULL;
  RETURN_IF_ERROR(smelt_session_create(m->b, G->device, &so, &s));
  smelt_status st = NULL;
  size_t lbytes = ir_type_bytes(&g->val[m->logits].type);
  DType ldt = g->val[m->logits].type.dt;
  void *ids = malloc((size_t)maxlen * 8), *pos = malloc((size_t)maxlen * 8), *logits = malloc(lbytes);
  int64_t next_host[1] = {0};
  Cand *cand = malloc((size_t)m->vocab * sizeof *cand);
  RtCudaPtr dlogits = 0;
  RtCudaDevice *dev = G->cuda ? rt_session_cuda_device(s) : NULL;
  bool device_logits = G->cuda && G->sp.greedy && m->next >= 0 && !G->dump_logits;
  if (G->dump_logits && !(G->dumped = malloc((size_t)G->n * (size_t)m->vocab * sizeof(float))))
    st = st_error(ST_NO_MEMORY, "out of memory");
  if (!ids || !pos || !logits || !cand) st = st_error(ST_NO_MEMORY, "out of memory");
  /* greedy on CUDA with a 'next' output: the logits stay on the device */
  if (!st && device_logits) st = rt_cuda_alloc(dev, lbytes, &dlogits);
  if (!st) st = smelt_session_bind_output(s, "logits", device_logits ? (void *)(uintptr_t)dlogits : logits, lbytes);
  size_t nbytes = m->next >= 0 ? ir_type_bytes(&g->val[m->next].type) : 0;
  DType ndt = m->next >= 0 ? g->val[m->next].type.dt : DT_I32;
  if (!st && m->next >= 0) st = smelt_session_bind_output(s, "next", next_host, nbytes);
  if (!st && G->cuda) G->bw = cli_gpu_copy_bandwidth(dev, G->bw_how, sizeof G->bw_how);
  else if (!st) {
    G->bw = cli_host_copy_bandwidth(rt_session_threads(s));
    snprintf(G->bw_how, sizeof G->bw_how, "host memcpy of 256 MiB on %d threads, best of 3, read + write bytes",
             rt_session_threads(s));
  }

  /* Warm-up, untimed: one run of every specialisation the prompt and the
   * decode steps will use makes its run state (on CUDA: modules loaded,
   * constants uploaded, the CUDA graph captured), then the state is reset.
   * The timings below are then those of a session that serves. */
  double ts = smelt_now_s();
  int64_t zeros[1] = {0};
  bool *warm = calloc((size_t)maxlen + 1, 1);
  if (!st && !warm) st = st_error(ST_NO_MEMORY, "out of memory");
  for (int64_t left = G->prompt.n; !st && left > 0;) {
    int len = chunk_len(m, left);
    if (!warm[len]) st = step(s, m, G->prompt.v, len, 0, ids, pos);
    warm[len] = true;
    left -= len;
  }
  if (!st && !warm[1]) st = step(s, m, zeros, 1, 0, ids, pos);
  free(warm);
  if (!st) st = smelt_session_reset_state(s);
  G->setup_s = smelt_now_s() - ts;

  /* prefill, in chunks of the specialisations' lengths */
  double t0 = smelt_now_s();
  int64_t at = 0;
  while (!st && at < G->prompt.n) {
    int len = chunk_len(m, G->prompt.n - at);
    st = step(s, m, G->prompt.v + at, len, at, ids, pos);
    at += len;
    G->prefill_runs++;
  }
  G->prefill_s = smelt_now_s() - t0;
  int64_t tok = 0;
  if (!st) {
    tok = m->next >= 0 && G->sp.greedy ? (int64_t)dt_load(ndt, next_host, 0) : sample(&G->sp, logits, ldt, m->vocab, cand);
    G->ttft_s = smelt_now_s() - t0;
    keep_logits(G, logits, ldt, m->vocab);
    if (!ids_push(&G->out, tok)) st = st_error(ST_NO_MEMORY, "out of memory");
  }
  /* decode: one run per token at the next position (queued on the device
   * for greedy CUDA decoding, unless SMELT_GENERATE_SYNC=1 asks for one
   * synchronous run per step, for a comparison) */
  bool tty = !G->quiet && !G->json && isatty(2);
  double t1 = smelt_now_s(), last_print = 0;
  const char *sync_env = getenv("SMELT_GENERATE_SYNC");
  bool queued = device_logits && can_queue(m) && !(sync_env && !strcmp(sync_env, "1"));
  if (!st && queued && G->out.n < G->n && !(G->stop_at_eos && tok == G->eos)) {
    st = decode_queued(G, m, s, dev, tok, at, tty, t1);
  }
  while (!st && !queued && G->out.n < G->n && !(G->stop_at_eos && tok == G->eos)) {
    st = step(s, m, &tok, 1, at, ids, pos);
    at++;
    if (st) break;
    tok = m->next >= 0 && G->sp.greedy ? (int64_t)dt_load(ndt, next_host, 0) : sample(&G->sp, logits, ldt, m->vocab, cand);
    keep_logits(G, logits, ldt, m->vocab);
    if (!ids_push(&G->out, tok)) st = st_error(ST_NO_MEMORY, "out of memory");
    double t = smelt_now_s();
    if (tty && (t - last_print > 0.1 || G->out.n == G->n)) {
      int done = G->out.n - 1;
      fprintf(stderr, "\rgenerate: %d/%d tokens, %.1f tokens/s   ", G->out.n, G->n, done / (t - t1));
      last_print = t;
    }
  }
  G->decode_s = smelt_now_s() - t1;
  if (tty) fputc('\n', stderr);
  /* the caches' valid part at the decode steps' mean context */
  double mean_ctx = G->prompt.n + (G->out.n > 1 ? (G->out.n - 1) / 2.0 : 0);
  G->kv_bytes_mean = m->capacity > 0 ? m->kv_bytes_full * mean_ctx / (double)m->capacity : 0;
  if (dlogits) rt_cuda_free(dev, dlogits);
  smelt_session_destroy(s);
  free(ids);
  free(pos);
  free(logits);
  free(cand);
  return st;
}

static void print_ids(const IdList *l, const char *sep) {
  for (int i = 0; i < l->n; i++) printf("%s%lld", i ? sep : "", (long long)l->v[i]);
}

static void report(const Gen *G, const LmModel *m) {
  int steps = G->out.n - 1;
  double per_tok = steps > 0 ? G->decode_s / steps : 0;
  double bytes = m->weight_bytes + G->kv_bytes_mean;
  double floor_s = G->bw > 0 ? bytes / G->bw : 0;
  double frac = per_tok > 0 && floor_s > 0 ? floor_s / per_tok : 0;
  if (G->json) {
    printf("{\"prompt_ids\": [");
    print_ids(&G->prompt, ", ");
    printf("], \"ids\": [");
    print_ids(&G->out, ", ");
    printf("], \"device\": \"%s\", \"prompt_tokens\": %d, \"generated\": %d, \"prefill_runs\": %d, "
           "\"setup_ms\": %.3f, \"prefill_ms\": %.4f, \"ttft_ms\": %.4f, \"decode_steps\": %d, \"decode_ms\": %.4f, "
           "\"decode_ms_per_token\": %.5f, \"decode_tokens_per_s\": %.2f, \"weight_bytes\": %.0f, "
           "\"kv_bytes_per_token\": %.0f, \"copy_bandwidth_gbs\": %.3f, \"floor_ms_per_token\": %.5f, "
           "\"floor_fraction\": %.4f, \"copy_method\": \"%s\", \"ranks\": %d}\n",
           G->device, G->prompt.n, G->out.n, G->prefill_runs, 1e3 * G->setup_s, 1e3 * G->prefill_s, 1e3 * G->ttft_s, steps,
           1e3 * G->decode_s, 1e3 * per_tok, per_tok > 0 ? 1.0 / per_tok : 0, m->weight_bytes, G->kv_bytes_mean,
           G->bw * 1e-9, 1e3 * floor_s, frac, G->bw_how, m->ranks);
    return;
  }
  print_ids(&G->out, " ");
  printf("\n");
  printf("session setup (untimed warm-up of each specialisation used): %.1f ms\n", 1e3 * G->setup_s);
  printf("prompt: %d tokens in %d prefill run%s, %.3f ms; time to first token %.3f ms\n", G->prompt.n,
         G->prefill_runs, G->prefill_runs == 1 ? "" : "s", 1e3 * G->prefill_s, 1e3 * G->ttft_s);
  if (steps > 0)
    printf("decode: %d tokens, %.4f ms/token, %.1f tokens/s\n", steps, 1e3 * per_tok, 1.0 / per_tok);
  if (steps > 0 && G->bw > 0)
    printf("bandwidth floor%s: %.1f MB/token (weights %.1f MB + KV %.2f MB at the mean context) at %.1f GB/s = %.4f "
           "ms/token; %.1f%% of the floor\n", m->ranks > 1 ? " per rank (each reads its part)" : "",
           bytes * 1e-6, m->weight_bytes * 1e-6, G->kv_bytes_mean * 1e-6, G->bw * 1e-9, 1e3 * floor_s, 100 * frac);
}

static bool is_bundle_path(const char *p) {
  size_t n = strlen(p);
  return n > 6 && strcmp(p + n - 6, ".smelt") == 0;
}

/* Removes the temporary directory a checkpoint was imported into: the YAML
 * and whatever the import wrote beside it (a GPTQ/AWQ checkpoint's
 * repacked weights), then the directory. */
static void remove_import_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)))
      if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
          (size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < sizeof path)
        remove(path);
    closedir(d);
  }
  rmdir(dir);
}

int cli_generate(int argc, char **argv) {
  Gen G;
  memset(&G, 0, sizeof G);
  G.n = 16;
  G.eos = 2;
  G.device = "cpu";
  G.sp.greedy = true;
  G.sp.top_p = 1.0;
  ModelOpts mo;
  memset(&mo, 0, sizeof mo);
  mo.dtype = DT_INVALID;
  const char *model = NULL, *prompt_ids = NULL, *prompt_file = NULL;
  bool sampled = false, greedy_flag = false;
  int rc = 0, tp = 1;
  char why[160];
  for (int i = 1; i < argc && !rc; i++) {
    const char *a = argv[i], *v;
    bool missing = false;
    int r = cli_model_opt("generate", argc, argv, &i, &mo);
    if (r == 2) {
      rc = 2;
      break;
    }
    if (r == 1) continue;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(generate_help, stdout);
      goto done;
    } else if ((v = cli_flag_value("--prompt-ids", argc, argv, &i, &missing))) {
      prompt_ids = v;
    } else if ((v = cli_flag_value("--prompt", argc, argv, &i, &missing))) {
      prompt_file = v;
    } else if ((v = cli_flag_value("-n", argc, argv, &i, &missing))) {
      char *end;
      long n = strtol(v, &end, 10);
      if (*end || end == v || n < 1 || n > 1000000) rc = cli_usage("generate", "-n %s: expected a count from 1", v);
      G.n = (int)n;
    } else if ((v = cli_flag_value("--temperature", argc, argv, &i, &missing))) {
      char *end;
      G.sp.temperature = strtod(v, &end);
      if (*end || end == v || !(G.sp.temperature > 0) || isinf(G.sp.temperature))
        rc = cli_usage("generate", "--temperature %s: expected a number > 0", v);
      sampled = true;
    } else if ((v = cli_flag_value("--top-k", argc, argv, &i, &missing))) {
      char *end;
      long k = strtol(v, &end, 10);
      if (*end || end == v || k < 1) rc = cli_usage("generate", "--top-k %s: expected a count from 1", v);
      G.sp.top_k = (int)k;
      sampled = true;
    } else if ((v = cli_flag_value("--top-p", argc, argv, &i, &missing))) {
      char *end;
      G.sp.top_p = strtod(v, &end);
      if (*end || end == v || !(G.sp.top_p > 0 && G.sp.top_p <= 1))
        rc = cli_usage("generate", "--top-p %s: expected a number in (0, 1]", v);
      sampled = true;
    } else if ((v = cli_flag_value("--seed", argc, argv, &i, &missing))) {
      G.sp.rng = strtoull(v, NULL, 10);
    } else if ((v = cli_flag_value("--eos", argc, argv, &i, &missing))) {
      char *end;
      G.eos = strtoll(v, &end, 10);
      if (*end || end == v || G.eos < 0) rc = cli_usage("generate", "--eos %s: expected a token id", v);
    } else if ((v = cli_flag_value("--dump-logits", argc, argv, &i, &missing))) {
      G.dump_logits = v;
    } else if ((v = cli_flag_value("--device", argc, argv, &i, &missing))) {
      G.device = v;
    } else if ((v = cli_flag_value("--devices", argc, argv, &i, &missing))) {
      if (cli_cuda_devices(v) < 1) rc = cli_usage("generate", "--devices needs a list of GPUs: cuda:0,cuda:1");
      G.device = v;
    } else if ((v = cli_flag_value("--threads", argc, argv, &i, &missing))) {
      G.threads = atoi(v);
      if (G.threads < 1) rc = cli_usage("generate", "--threads %s: expected a count from 1", v);
    } else if (missing) {
      rc = cli_usage("generate", "%s needs a value", a);
    } else if ((v = cli_flag_value("--tp", argc, argv, &i, &missing)) || missing) {
      if (!cli_parse_tp(v, &tp)) rc = cli_usage("generate", "--tp needs a number of ranks, 1 to 64");
    } else if (!strcmp(a, "--greedy")) {
      greedy_flag = true;
    } else if (!strcmp(a, "--stop-at-eos")) {
      G.stop_at_eos = true;
    } else if (!strcmp(a, "--json")) {
      G.json = true;
    } else if (!strcmp(a, "--quiet")) {
      G.quiet = true;
    } else if (a[0] == '-' && a[1]) {
      rc = cli_usage("generate", "unknown flag '%s'", a);
    } else if (!model) {
      model = a;
    } else {
      rc = cli_usage("generate", "more than one model given ('%s' and '%s')", model, a);
    }
  }
  if (rc) goto done;
  if (!model) {
    rc = cli_usage("generate", "no model given");
    goto done;
  }
  if (!prompt_ids == !prompt_file) {
    rc = cli_usage("generate", "give the prompt with --prompt-ids LIST or --prompt FILE (one of them)");
    goto done;
  }
  if (greedy_flag && sampled) {
    rc = cli_usage("generate", "--greedy and sampling flags (--temperature, --top-k, --top-p) exclude each other");
    goto done;
  }
  if (sampled && G.sp.temperature == 0) G.sp.temperature = 1.0;
  G.sp.greedy = !sampled;
  G.cuda = cli_cuda_devices(G.device) > 0;
  if (strcmp(G.device, "cpu") && !G.cuda) {
    rc = cli_usage("generate", "unknown device '%s' (cpu, cuda, cuda:N, or cuda:0,cuda:1 for ranks)", G.device);
    goto done;
  }
  if (prompt_ids && !parse_ids(prompt_ids, &G.prompt, why, sizeof why)) {
    rc = cli_usage("generate", "--prompt-ids: %s", why);
    goto done;
  }
  if (prompt_file) {
    char *text = NULL;
    if (!read_text(prompt_file, &text)) {
      fprintf(stderr, "%s: error: cannot read the prompt file\n", prompt_file);
      rc = 1;
      goto done;
    }
    bool ok = parse_ids(text, &G.prompt, why, sizeof why);
    free(text);
    if (!ok) {
      fprintf(stderr, "%s: error: %s\n", prompt_file, why);
      rc = 1;
      goto done;
    }
  }
  bool bundle = is_bundle_path(model);
  struct stat stt;
  char tmpdir[] = "/tmp/smelt-generate-XXXXXX", yaml_path[64] = "";
  if (stat(model, &stt) == 0 && S_ISDIR(stt.st_mode)) {
    /* a Hugging Face checkpoint: imported with its cache into a temporary YAML */
    FeHfOptions ho = {.dtype = mo.dtype};
    for (int i = 0; i < mo.ndims; i++)
      if (!strcmp(mo.dims[i].name, "ctx")) ho.ctx = mo.dims[i].value;
    char *text = NULL;
    smelt_status ist = mkdtemp(tmpdir) ? fe_hf_import(model, tmpdir, &ho, &text, NULL)
                                       : st_error(ST_IO, "cannot make a temporary directory");
    FILE *f = NULL;
    if (!ist) {
      snprintf(yaml_path, sizeof yaml_path, "%s/model.yaml", tmpdir);
      f = fopen(yaml_path, "w");
      if (!f || fputs(text, f) < 0) ist = st_error(ST_IO, "%s: cannot write the imported model", yaml_path);
      if (f) fclose(f);
    }
    free(text);
    if (ist) {
      rc = cli_fail(ist);
      goto cleanup;
    }
    model = yaml_path;
    /* the import applied them */
    int k = 0;
    for (int i = 0; i < mo.ndims; i++)
      if (strcmp(mo.dims[i].name, "ctx")) mo.dims[k++] = mo.dims[i];
      else free((char *)mo.dims[i].name);
    mo.ndims = k;
    mo.dtype = DT_INVALID;
  }
  if (tp > 1 && bundle) {
    rc = cli_usage("generate", "--tp applies when compiling a model (a bundle's ranks are set by smelt compile --tp)");
    goto done;
  }
  if ((rc = cli_devices_tp("generate", G.device, !bundle, &tp)) != 0) goto done;
  if (bundle && (mo.ndims || mo.dtype != DT_INVALID)) {
    rc = cli_usage("generate", "--dim and --dtype apply when compiling; a bundle is already compiled");
    goto done;
  }
  for (int i = 0; i < mo.ndims; i++)
    if (!strcmp(mo.dims[i].name, "seq")) {
      rc = cli_usage("generate", "--dim seq is chosen by generate (1 for decoding, the prompt's length for prefill)");
      goto done;
    }

  smelt_bundle *b = NULL;
  smelt_status st = NULL;
  if (bundle) {
    st = smelt_bundle_open(model, &b);
  } else {
    /* compile for decoding (seq = 1) and for this prompt's prefill */
    char dims[1200];
    size_t k = (size_t)snprintf(dims, sizeof dims, G.prompt.n > 1 ? "seq=1,%d" : "seq=1", G.prompt.n);
    for (int i = 0; i < mo.ndims && k < sizeof dims; i++)
      k += (size_t)snprintf(dims + k, sizeof dims - k, ";%s=%lld", mo.dims[i].name, (long long)mo.dims[i].value);
    smelt_compile_options co = {.targets = G.cuda ? "cuda" : "cpu", .dims = dims,
                                .dtype = mo.dtype != DT_INVALID ? dt_name(mo.dtype) : NULL, .threads = G.threads,
                                .tp = tp};
    void *buf = NULL;
    size_t len = 0;
    st = sc_compile_model_to_memory(model, &co, &buf, &len);
    if (st && strstr(st_message(st), "no dim 'seq'")) {
      smelt_status located = st_error(ST_INVALID_INPUT, "%s: error: the model cannot generate: it has no dim 'seq' (the "
                                  "length of its inputs 'ids' and 'pos'; see docs/serving.md)", model);
      st_free(st);
      st = located;
    }
    if (!st) st = rt_bundle_open_bytes(buf, len, model, &b);
    free(buf);
  }
  LmModel m;
  memset(&m, 0, sizeof m);
  if (!st) st = lm_describe(b, &m);
  for (int i = 0; !st && i < G.prompt.n; i++)
    if (G.prompt.v[i] >= m.vocab)
      st = st_error(ST_INVALID_INPUT, "prompt token %d is id %lld, outside the vocabulary of %lld", i,
                    (long long)G.prompt.v[i], (long long)m.vocab);
  if (!st) st = generate(&G, &m);
  if (!st && G.dump_logits) {
    TensorType t = {.dt = DT_F32, .rank = 2, .dim = {G.ndumped, m.vocab}};
    st = fe_npy_write(G.dump_logits, &t, G.dumped);
  }
  if (!st) report(&G, &m);
  free(m.spec_len);
  free(m.spec_min);
  smelt_bundle_close(b);
  if (st) rc = cli_fail(st);
cleanup:
  if (yaml_path[0]) remove_import_dir(tmpdir);
done:
  free(G.prompt.v);
  free(G.out.v);
  free(G.dumped);
  for (int i = 0; i < mo.ndims; i++) free((char *)mo.dims[i].name);
  return rc;
}
