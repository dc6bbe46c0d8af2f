/* Out of memory at every allocation (issue 16 #11), as Lua's test build does.
 *
 * This program is linked with `-Wl,--wrap=malloc,...` (CMakeLists.txt), so
 * every call to malloc, calloc, realloc, aligned_alloc, strdup, strndup and
 * open_memstream made by smelt's own code (the static libraries linked in
 * here), and every call into its arenas (ir/arena.h), goes through the
 * wrappers below; libc, LLVM, libyaml and jansson
 * keep their own allocator, so only what smelt itself allocates can fail.
 * The wrappers count allocations and, when armed with a number k, refuse
 * the k-th and every later one; they also keep the set of blocks they handed
 * out and not yet freed, which is how a leak is seen without ASan.
 *
 * Each scenario is a sequence of public API calls (smelt_compile,
 * smelt_bundle_open, smelt_bundle_open_memory, smelt_session_create,
 * binding, smelt_session_run, reading, writing and resetting state, destroy
 * and close).  It is
 * run once to count its allocations (N), then again with the failure armed
 * at k = 1..N: every call must return NULL (it came before the failure
 * point) or SMELT_NO_MEMORY, nothing may crash, and once everything is
 * destroyed no block may be left.  A last run without failures must still
 * give the right outputs (the same bits as the first), so a failure leaves
 * no global state behind.
 *
 * In the suite every point is tried (at most 1,000 spread over a scenario;
 * every other one under ASan, where each costs ~4x); SMELT_TEST_FULL=1 tries
 * every point of every scenario.
 */
#include <dirent.h>
#include <execinfo.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "include/smelt.h"
#include "ir/arena.h"
#include "include/smelt_compile.h"
#include "tests/unit/check.h"

/* ---- the wrappers ---- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
FILE *__real_open_memstream(char **p, size_t *n);
void __real_free(void *p);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);
void *__wrap_aligned_alloc(size_t a, size_t n);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);
FILE *__wrap_open_memstream(char **p, size_t *n);
void __wrap_free(void *p);

static atomic_long fa_count;   /* allocations since fa_arm */
static atomic_long fa_fail_at; /* refuse this one and every later one; 0 = none */
static atomic_int fa_refused;  /* whether one was refused since fa_arm */

/* The blocks handed out and not freed: open addressing over pointers. */
#define LIVE_CAP (1u << 20)
static void **live;
static long nlive;
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
#define TOMB ((void *)1)

static size_t slot_of(void *p) { return (size_t)(((uintptr_t)p >> 4) * 0x9e3779b97f4a7c15ull) & (LIVE_CAP - 1); }

static void live_add(void *p) {
  if (!p || !live) return;
  pthread_mutex_lock(&live_lock);
  size_t i = slot_of(p);
  while (live[i] && live[i] != TOMB) i = (i + 1) & (LIVE_CAP - 1);
  live[i] = p;
  nlive++;
  pthread_mutex_unlock(&live_lock);
}

static void live_del(void *p) {
  if (!p || !live) return;
  pthread_mutex_lock(&live_lock);
  for (size_t i = slot_of(p), k = 0; live[i] && k < LIVE_CAP; i = (i + 1) & (LIVE_CAP - 1), k++)
    if (live[i] == p) {
      live[i] = TOMB;
      nlive--;
      break;
    }
  pthread_mutex_unlock(&live_lock);
}

static long live_count(void) {
  pthread_mutex_lock(&live_lock);
  long n = nlive;
  pthread_mutex_unlock(&live_lock);
  return n;
}

/* Whether this allocation is refused. */
static int refuse(void) {
  long c = atomic_fetch_add(&fa_count, 1) + 1;
  long at = atomic_load(&fa_fail_at);
  if (at > 0 && c >= at) {
    atomic_store(&fa_refused, 1);
    return 1;
  }
  return 0;
}

void *__wrap_malloc(size_t n) {
  if (refuse()) return NULL;
  void *p = __real_malloc(n);
  live_add(p);
  return p;
}
void *__wrap_calloc(size_t n, size_t m) {
  if (refuse()) return NULL;
  void *p = __real_calloc(n, m);
  live_add(p);
  return p;
}
void *__wrap_realloc(void *p, size_t n) {
  if (refuse()) return NULL;
  void *q = __real_realloc(p, n);
  if (q || n == 0) live_del(p);
  live_add(q);
  return q;
}
void *__wrap_aligned_alloc(size_t a, size_t n) {
  if (refuse()) return NULL;
  void *p = __real_aligned_alloc(a, n);
  live_add(p);
  return p;
}
char *__wrap_strdup(const char *s) {
  if (refuse()) return NULL;
  char *p = __real_strdup(s);
  live_add(p);
  return p;
}
char *__wrap_strndup(const char *s, size_t n) {
  if (refuse()) return NULL;
  char *p = __real_strndup(s, n);
  live_add(p);
  return p;
}
/* The stream's buffer is libc's, so it is not tracked. */
FILE *__wrap_open_memstream(char **p, size_t *n) { return refuse() ? NULL : __real_open_memstream(p, n); }
void __wrap_free(void *p) {
  live_del(p);
  __real_free(p);
}

/* The graph's and the code generators' arenas take memory in blocks of
 * 64 KiB, so refusing only malloc would rarely fail an arena request: each
 * arena call is a point of its own (calls inside ir/arena.c itself are not
 * wrapped, which is fine: they come from one of these). */
void *__real_arena_alloc(Arena *a, size_t size);
char *__real_arena_strdup(Arena *a, const char *s);
char *__real_arena_strndup(Arena *a, const char *s, size_t n);
void *__wrap_arena_alloc(Arena *a, size_t size);
char *__wrap_arena_strdup(Arena *a, const char *s);
char *__wrap_arena_strndup(Arena *a, const char *s, size_t n);
char *__wrap_arena_printf(Arena *a, const char *fmt, ...);
void *__wrap_arena_alloc(Arena *a, size_t size) { return refuse() ? NULL : __real_arena_alloc(a, size); }
char *__wrap_arena_strdup(Arena *a, const char *s) { return refuse() ? NULL : __real_arena_strdup(a, s); }
char *__wrap_arena_strndup(Arena *a, const char *s, size_t n) { return refuse() ? NULL : __real_arena_strndup(a, s, n); }
char *__wrap_arena_printf(Arena *a, const char *fmt, ...) {
  if (refuse()) return NULL;
  char small[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return NULL;
  if ((size_t)n < sizeof small) return __real_arena_strndup(a, small, (size_t)n);
  char *p = __real_arena_alloc(a, (size_t)n + 1);
  if (p) {
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
  }
  return p;
}

static void fa_arm(long k) {
  atomic_store(&fa_count, 0);
  atomic_store(&fa_refused, 0);
  atomic_store(&fa_fail_at, k);
}
static long fa_disarm(void) {
  atomic_store(&fa_fail_at, 0);
  return atomic_load(&fa_count);
}

/* ---- scenarios ---- */

typedef struct {
  const char *name;
  const char *model;   /* YAML compiled by the scenario, or the bundle's source */
  const char *targets; /* for smelt_compile */
  int compile;         /* 1: the scenario is smelt_compile; 0: open + run a bundle made beforehand */
  int from_memory;     /* open with smelt_bundle_open_memory */
} Scenario;

static char dir[256];
static char bundle_path[300];
static void *bundle_bytes;
static size_t bundle_len;
static void *in_data[8], *out_data[8];
static size_t in_bytes[8], out_bytes[8];
static int nin, nout;
static void *want[8]; /* outputs of the first clean run */

/* A status that must be NULL or SMELT_NO_MEMORY; returns whether to stop. */
static int bad_calls;
static long bad_at;
static int step(smelt_status st, const char *what, long k) {
  if (!st) return 0;
  int code = smelt_status_code(st);
  if (code != SMELT_NO_MEMORY) {
    if (bad_calls++ < 10)
      fprintf(stderr, "  failure at allocation %ld: %s returned code %d, not SMELT_NO_MEMORY: %s\n", k, what, code,
              smelt_status_message(st));
    bad_at = k;
  }
  smelt_status_free(st);
  return 1;
}

static int64_t numel_of(const smelt_tensor_info *ti) {
  int64_t n = 1;
  for (int i = 0; i < ti->rank; i++) n *= ti->dims[i];
  return n;
}

static size_t dt_bytes(smelt_dtype dt) {
  switch ((int)dt) {
  case SMELT_F64: case SMELT_I64: return 8;
  case SMELT_F32: case SMELT_I32: return 4;
  case SMELT_F16: case SMELT_BF16: return 2;
  default: return 1;
  }
}

/* Runs the scenario once; k is the armed failure point (0: none), for
 * messages.  fill: make the input/output buffers (first, unarmed run). */
static void run_scenario(const Scenario *sc, long k, int fill) {
  if (sc->compile) {
    smelt_compile_options o = {.targets = sc->targets, .no_cache = 1, .threads = 1};
    step(smelt_compile(sc->model, &o, bundle_path), "smelt_compile", k);
    return;
  }
  smelt_bundle *b = NULL;
  smelt_session *s = NULL;
  if (sc->from_memory) {
    if (step(smelt_bundle_open_memory(bundle_bytes, bundle_len, &b), "smelt_bundle_open_memory", k)) goto done;
  } else if (step(smelt_bundle_open(bundle_path, &b), "smelt_bundle_open", k)) {
    goto done;
  }
  smelt_session_options so = {.threads = 2};
  if (step(smelt_session_create(b, "cpu", &so, &s), "smelt_session_create", k)) goto done;
  if (fill) {
    nin = smelt_session_num_inputs(s);
    nout = smelt_session_num_outputs(s);
    for (int i = 0; i < nin; i++) {
      smelt_tensor_info ti;
      smelt_session_input_info(s, i, &ti);
      in_bytes[i] = (size_t)numel_of(&ti) * dt_bytes(ti.dtype);
      in_data[i] = __real_calloc(in_bytes[i] ? in_bytes[i] : 1, 1);
      if (ti.dtype == SMELT_F32)
        for (size_t j = 0; j < in_bytes[i] / 4; j++) ((float *)in_data[i])[j] = (float)((j * 7919) % 97) / 50.0f - 1.0f;
    }
    for (int i = 0; i < nout; i++) {
      smelt_tensor_info ti;
      smelt_session_output_info(s, i, &ti);
      out_bytes[i] = (size_t)numel_of(&ti) * dt_bytes(ti.dtype);
      out_data[i] = __real_malloc(out_bytes[i] ? out_bytes[i] : 1);
    }
  }
  for (int i = 0; i < nin; i++) {
    smelt_tensor_info ti;
    smelt_session_input_info(s, i, &ti);
    if (step(smelt_session_bind_input(s, ti.name, in_data[i], in_bytes[i]), "smelt_session_bind_input", k)) goto done;
  }
  for (int i = 0; i < nout; i++) {
    smelt_tensor_info ti;
    smelt_session_output_info(s, i, &ti);
    memset(out_data[i], 0, out_bytes[i]);
    if (step(smelt_session_bind_output(s, ti.name, out_data[i], out_bytes[i]), "smelt_session_bind_output", k))
      goto done;
  }
  for (int r = 0; r < 2; r++)
    if (step(smelt_session_run(s), "smelt_session_run", k)) goto done;
  if (smelt_session_num_states(s) > 0) {
    smelt_tensor_info ti;
    smelt_session_state_info(s, 0, &ti);
    size_t bytes = (size_t)numel_of(&ti) * dt_bytes(ti.dtype);
    void *buf = __real_malloc(bytes ? bytes : 1);
    int stop = step(smelt_session_read_state(s, ti.name, buf, bytes), "smelt_session_read_state", k) ||
               step(smelt_session_write_state(s, ti.name, buf, bytes), "smelt_session_write_state", k) ||
               step(smelt_session_reset_state(s), "smelt_session_reset_state", k);
    __real_free(buf);
    if (stop) goto done;
  }
done:
  smelt_session_destroy(s);
  smelt_bundle_close(b);
}

/* Files left in the scratch directory other than the bundle: a half-written
 * temporary that an error path did not remove. */
static int stray_files(void) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, "b.smelt")) {
      if (n++ < 3) fprintf(stderr, "  stray file %s/%s\n", dir, e->d_name);
      char p[600];
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      unlink(p);
    }
  closedir(d);
  return n;
}

static int read_file(const char *path, void **out, size_t *out_len) {
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  *out = __real_malloc((size_t)n);
  *out_len = fread(*out, 1, (size_t)n, f);
  fclose(f);
  return *out_len == (size_t)n;
}

/* In a child that dies: where (addresses for addr2line -e test_oom), with
 * SMELT_OOM_TRACE=1. */
static void on_fatal(int sig) {
  void *pc[48];
  int n = backtrace(pc, 48);
  backtrace_symbols_fd(pc, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

/* What one failure point gave, sent from the child that ran it. */
typedef struct {
  int refused, bad, strays;
  long left, count; /* count: the allocations this run made */
} Point;

/* Runs the scenario with the k-th allocation refused, in a child process,
 * so that a crash is reported as one and the next point still runs.
 * Returns -1 for a crash (*sig: the signal or exit status). */
static int try_point(const Scenario *sc, long k, Point *out, int *sig) {
  int fd[2];
  if (pipe(fd)) return -1;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    if (getenv("SMELT_OOM_TRACE")) {
      signal(SIGABRT, on_fatal);
      signal(SIGSEGV, on_fatal);
    }
    long base = live_count();
    bad_calls = 0;
    fa_arm(k);
    run_scenario(sc, k, 0);
    long count = fa_disarm();
    Point p = {atomic_load(&fa_refused), bad_calls, stray_files(), live_count() - base, count};
    if (write(fd[1], &p, sizeof p) != (ssize_t)sizeof p) _exit(3);
    _exit(0);
  }
  close(fd[1]);
  int status = 0;
  ssize_t got = read(fd[0], out, sizeof *out);
  close(fd[0]);
  waitpid(pid, &status, 0);
  if (got != (ssize_t)sizeof *out || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    *sig = WIFSIGNALED(status) ? WTERMSIG(status) : 1000 + WEXITSTATUS(status);
    return -1;
  }
  return 0;
}

static void try_scenario(const Scenario *sc, int full) {
  /* warm up (one-time initialisation: LLVM, tables), then count */
  run_scenario(sc, 0, 0);
  fa_arm(0);
  run_scenario(sc, 0, 0);
  long total = fa_disarm();
  long stride = full || total <= 1000 ? 1 : (total + 999) / 1000;
#if defined(__SANITIZE_ADDRESS__)
  if (!full) stride = 2; /* every point costs ~4x under ASan: half of them in the suite */
#endif
  long tried = 0, leaks = 0, strays = 0, crashes = 0, bad = 0, refused_runs = 0, short_runs = 0;
  for (long k = 1; k <= total; k += stride) {
    Point p;
    int sig = 0;
    tried++;
    if (try_point(sc, k, &p, &sig) < 0) {
      if (crashes++ < 8) fprintf(stderr, "  %s: allocation %ld refused: the process died (%s %d)\n", sc->name, k,
                                 sig >= 1000 ? "exit" : "signal", sig >= 1000 ? sig - 1000 : sig);
      continue;
    }
    refused_runs += p.refused;
    /* a run may make a few allocations fewer than the counting run (the
     * compile's worker threads): a point past its end refuses nothing */
    short_runs += !p.refused && p.count < k;
    bad += p.bad != 0;
    strays += p.strays;
    if (p.left != 0 && leaks++ < 5)
      fprintf(stderr, "  %s: allocation %ld refused: %ld block(s) left after everything was destroyed\n", sc->name, k,
              p.left);
  }
  /* afterwards, without failures, everything still works (and gives the same bits) */
  run_scenario(sc, 0, 0);
  int same = 1;
  if (!sc->compile)
    for (int i = 0; i < nout; i++) same &= memcmp(out_data[i], want[i], out_bytes[i]) == 0;
  printf("%-26s %6ld allocations, %5ld points tried (every %ld%s): %ld crash%s, %ld bad status, %ld leak%s, "
         "%ld stray file%s%s\n",
         sc->name, total, tried, stride, short_runs ? ", some past a shorter run's end" : "", crashes,
         crashes == 1 ? "" : "es", bad, leaks, leaks == 1 ? "" : "s", strays, strays == 1 ? "" : "s",
         same ? "" : ", RESULTS DIFFER AFTERWARDS");
  CHECK(crashes == 0);
  CHECK(bad == 0);
  CHECK(leaks == 0);
  CHECK(strays == 0);
  CHECK(same);
  CHECK(tried > 0 && refused_runs + short_runs == tried - crashes && short_runs * 50 <= tried);
}

/* A small model of each kernel family: a matmul with a bias and gelu
 * epilogue, a transpose, a residual and an rms_norm (a reduction with its
 * prologue), a softmax. */
static const char MODEL[] =
    "smelt: 1\n"
    "name: oom\n"
    "dtype: f32\n"
    "inputs: {x: {shape: [4, 8]}}\n"
    "params:\n"
    "  w: {shape: [8, 8], init: {normal: 0.3}}\n"
    "  b: {shape: [8], init: {uniform: [-0.1, 0.1]}}\n"
    "  g: {shape: [8], init: ones}\n"
    "nodes:\n"
    "  - {out: h, op: matmul, in: [x, w]}\n"
    "  - {out: hb, op: add, in: [h, b]}\n"
    "  - {out: a, op: gelu, in: [hb]}\n"
    "  - {out: t, op: transpose, in: [a], perm: [1, 0]}\n"
    "  - {out: t2, op: transpose, in: [t], perm: [1, 0]}\n"
    "  - {out: r, op: add, in: [t2, x]}\n"
    "  - {out: n, op: rms_norm, in: [r, g]}\n"
    "  - {out: y, op: softmax, in: [n], axis: -1}\n"
    "outputs: [y, r]\n";

/* A session state updated in place (scatter) and read back. */
static const char STATE_MODEL[] =
    "smelt: 1\n"
    "name: oom_state\n"
    "dtype: f32\n"
    "inputs: {x: {shape: [2, 4]}, pos: {shape: [2], dtype: i32}}\n"
    "state:\n"
    "  cache: {shape: [8, 4]}\n"
    "nodes:\n"
    "  - {out: c2, op: scatter, in: [cache, pos, x], axis: 0}\n"
    "  - {out: y, op: sum, in: [c2], axes: [0]}\n"
    "outputs: [y]\n";

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (f) {
    fputs(text, f);
    fclose(f);
  }
}

static void reset_buffers(void) {
  for (int i = 0; i < 8; i++) {
    __real_free(in_data[i]);
    __real_free(out_data[i]);
    __real_free(want[i]);
    in_data[i] = out_data[i] = want[i] = NULL;
  }
  nin = nout = 0;
}

int main(void) {
#ifndef SMELT_HAVE_LLVM
  printf("SKIP test_oom: smelt was built without LLVM (SMELT_LLVM=OFF), so nothing can be compiled\n");
  return CHECK_SKIPPED;
#else
  live = __real_calloc(LIVE_CAP, sizeof *live);
  int full = getenv("SMELT_TEST_FULL") && atoi(getenv("SMELT_TEST_FULL"));
  char models[300], cache[300], model[400], state_model[400];
  snprintf(dir, sizeof dir, "/tmp/smelt_oom_%d", (int)getpid());
  snprintf(models, sizeof models, "%s_models", dir);
  snprintf(cache, sizeof cache, "%s_cache", dir);
  snprintf(bundle_path, sizeof bundle_path, "%s/b.smelt", dir);
  snprintf(model, sizeof model, "%s/oom.yaml", models);
  snprintf(state_model, sizeof state_model, "%s/oom_state.yaml", models);
  if (mkdir(dir, 0700) || mkdir(models, 0700)) {
    perror("mkdir");
    return 1;
  }
  setenv("SMELT_CACHE_DIR", cache, 1); /* the CUDA kernel cache: not the user's */
  write_text(model, MODEL);
  write_text(state_model, STATE_MODEL);

  const char *const models_of[2] = {model, state_model};
  for (int m = 0; m < 2; m++) {
    Scenario comp = {m ? "compile cpu (state)" : "compile cpu", models_of[m], "cpu", 1, 0};
    try_scenario(&comp, full);
    /* the bundle the last clean compile wrote, run from the file and from memory */
    reset_buffers();
    Scenario open_file = {m ? "open + run (state)" : "open + run", models_of[m], NULL, 0, 0};
    run_scenario(&open_file, 0, 1);
    for (int i = 0; i < nout; i++) {
      want[i] = __real_malloc(out_bytes[i] ? out_bytes[i] : 1);
      memcpy(want[i], out_data[i], out_bytes[i]);
    }
    try_scenario(&open_file, full);
    __real_free(bundle_bytes);
    CHECK(read_file(bundle_path, &bundle_bytes, &bundle_len));
    Scenario open_mem = {m ? "open memory + run (state)" : "open memory + run", models_of[m], NULL, 0, 1};
    try_scenario(&open_mem, full);
  }
  /* CUDA code generation (NVRTC, no GPU): the known abort sites were there */
  smelt_compile_options o = {.targets = "cuda", .no_cache = 1};
  smelt_status st = smelt_compile(model, &o, bundle_path);
  if (st && smelt_status_code(st) == SMELT_UNSUPPORTED) {
    check_skip_part("nvrtc", "compile cuda under failing allocations (no NVRTC)");
  } else {
    CHECK(st == NULL);
    Scenario cuda = {"compile cuda", model, "cuda", 1, 0};
    try_scenario(&cuda, full);
  }
  smelt_status_free(st);
  reset_buffers();
  __real_free(bundle_bytes);
  unlink(bundle_path);
  unlink(model);
  unlink(state_model);
  rmdir(dir);
  rmdir(models);
  return check_done("test_oom");
#endif
}
