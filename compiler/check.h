/* Checking a compiled model against the reference interpreter.
 *
 * sc_check_outputs runs a session and the reference interpreter (ir/interp.h)
 * on the bundle's own graph, the one the kernels were generated from, with
 * the same inputs, and measures the difference of every output.
 * sc_check_groups does the same after every kernel, for every value the
 * kernel writes, and names the first kernel (fusion group) whose results
 * diverge: a fusion or code-generation bug is found without guessing.
 *
 * Both bind the session's inputs and outputs themselves (any earlier
 * binding is replaced; bind again before the next smelt_session_run) and
 * return their findings in a report owned by the caller; nothing is printed.
 *
 * Pass criteria (SPEC §6), per value, by dtype:
 *   f32, f64     relative L2 error <= SC_CHECK_REL_L2
 *   f16, bf16    cosine similarity >= SC_CHECK_COSINE
 *   integer, bool  exact
 * and in every case no element that is NaN or infinite in one result and not
 * the same in the other.  A float reference whose RMS is below
 * SC_CHECK_TINY_REF (zero, typically: a layer_norm of constant rows) has no
 * scale for a relative error or a cosine to be measured against; it is judged
 * by an absolute floor instead: max abs error <= SC_CHECK_ABS_FLOOR (f32,
 * f64), SC_CHECK_ABS_FLOOR_16 (f16, bf16).  The floor is set by that case:
 * the f32 rounding error of a row's mean, amplified by 1/sqrt(eps) = 316,
 * is 7.5e-4 for rows of 5.3 and 5.4e-3 for rows of 53 (a real bug gives
 * O(1)).  ScDiff.rule says which rule decided.
 *
 * An f16/bf16 model's outputs are also compared with the same graph run in
 * f32 (ScOutputReport.f32_note, ScOutputCheck.f32): informational, by the
 * f16 rules, it does not decide the check.
 *
 * Tolerances given by the user (smelt run --check --rtol R --atol A; ScTol)
 * replace these rules for float tensors: every element finite in both must
 * satisfy |x - r| <= atol + rtol * |r|, numpy.allclose's test, and
 * non-finite elements must still match.  Integers and bools stay exact.
 */
#ifndef SMELT_RT_CHECK_H
#define SMELT_RT_CHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "include/smelt.h"
#include "ir/ir.h"

#define SC_CHECK_REL_L2 1e-5
#define SC_CHECK_COSINE 0.999
#define SC_CHECK_TINY_REF 1e-6
#define SC_CHECK_ABS_FLOOR 1e-2
#define SC_CHECK_ABS_FLOOR_16 1e-1

/* The rule that judged a tensor (see the pass criteria above). */
typedef enum {
  SC_RULE_REL_L2,    /* rel_l2 <= limit */
  SC_RULE_COSINE,    /* cosine >= limit */
  SC_RULE_ABS_FLOOR, /* the reference is ~0: max_abs <= limit */
  SC_RULE_EXACT,     /* max_abs == 0 */
  SC_RULE_ALLCLOSE,  /* the user's ScTol: every |x - r| <= atol + rtol * |r| */
} ScRule;

/* The user's tolerances; set false: the default rules. */
typedef struct {
  double rtol, atol;
  bool set;
} ScTol;

/* How one tensor compares with its reference.  Over the elements finite in
 * both: max_abs = max |x - r|; max_rel = max |x - r| / max(|r|, 1e-6);
 * rel_l2 = ||x - r|| / ||r|| (0 when both are zero, infinite when only r
 * is); cosine = <x, r> / (||x|| ||r||) (1 when both are zero). */
typedef struct {
  double max_abs, max_rel, rel_l2, cosine;
  int64_t nonfinite; /* elements NaN/inf in one result and not equally so in the other */
  ScRule rule;       /* what decided pass */
  double limit;      /* the rule's bound (SC_RULE_ALLCLOSE: rtol) */
  double atol;       /* SC_RULE_ALLCLOSE: the absolute tolerance */
  /* SC_RULE_ALLCLOSE: the largest |x - r| / (atol + rtol * |r|) (pass when
   * <= 1), and the index of that element */
  double worst;
  int64_t worst_at;
  bool pass;
} ScDiff;

/* Compares n elements of dtype dt (x: the result, ref: the reference) by
 * the default rules. */
void sc_diff(DType dt, const void *x, const void *ref, size_t n, ScDiff *out);
/* The same, judged by tol when tol && tol->set (floats only). */
void sc_diff_tol(DType dt, const void *x, const void *ref, size_t n, const ScTol *tol, ScDiff *out);

/* The rule of d in words with its bound ("rel L2 <= 1e-05", "max abs <= 0.001,
 * reference ~0", "|x-ref| <= 0.0001 + 0.001*|ref|, worst 0.27"), into buf (cap bytes, NUL-terminated); returns buf. */
const char *sc_rule_text(const ScDiff *d, char *buf, size_t cap);

typedef struct {
  const char *name; /* the output's name (owned by the bundle) */
  int value;        /* its value id in the bundle's graph */
  TensorType type;
  ScDiff diff;
  void *data;       /* the session's result (owned by the report) */
  /* An f16/bf16 output against the f32 reference (see ScOutputReport):
   * judged by the f16 rules (cosine, or the absolute floor); informational,
   * it does not decide `pass`.  has_f32 is false for other outputs. */
  bool has_f32;
  ScDiff f32;
} ScOutputCheck;

typedef struct {
  ScOutputCheck *outputs; /* one per graph output, in order */
  int noutputs;
  bool pass;              /* every output passed */
  /* A graph with f16/bf16 values is also evaluated in f32 (sc_widen_f32):
   * the loss a user cares about is against full precision, not against
   * the interpreter's own rounding to f16.  When that reference could not
   * be made, f32_note says why ("" otherwise, or when nothing is f16). */
  char f32_note[160];
} ScOutputReport;

/* A copy of g with every f16 and bf16 value in f32: constants widened,
 * `to: f16` attributes made f32; quantised weights (i8, i4/u4, f8) stay
 * as they are.  Returns an error when the copy does not verify (an op that
 * only exists in f16).  *out is owned by the caller. */
smelt_status sc_widen_f32(const Graph *g, Graph **out) SMELT_MUST_USE;

/* inputs[i] holds the data of session input i (smelt_session_input_info
 * order) in its dtype and shape.  Runs the session once and the reference
 * once.  A failed run is an error status; a numerical mismatch is not (it is
 * in the report).  Release the report with sc_output_report_free. */
smelt_status sc_check_outputs(smelt_session *s, const void *const *inputs, ScOutputReport *out_report) SMELT_MUST_USE;
/* The same, judged by tol (NULL: the default rules). */
smelt_status sc_check_outputs_tol(smelt_session *s, const void *const *inputs, const ScTol *tol,
                                  ScOutputReport *out_report) SMELT_MUST_USE;
void sc_output_report_free(ScOutputReport *r);

typedef struct {
  int kernel;              /* index in the bundle's kernel table */
  int group;               /* the fusion group it computes */
  const char *kernel_name; /* owned by the bundle */
  int value;               /* a value the kernel writes (or, when clobbered, reads) */
  const char *value_name;  /* owned by the bundle */
  TensorType type;
  ScDiff diff;
  /* The value was right when written but had been overwritten before this
   * kernel read it: two tensors share memory while both live (a memory
   * plan bug), not a bug of this kernel. */
  bool clobbered;
} ScValueCheck;

typedef struct {
  ScValueCheck *checks; /* in execution order */
  int nchecks;
  int first_bad;        /* index into checks of the first failure; -1 when all passed */
} ScGroupReport;

/* Runs the session kernel by kernel on `inputs` (as for sc_check_outputs),
 * comparing after each kernel every value it wrote with the reference's
 * value of the same id, and before each kernel every intermediate it reads
 * (which finds a value overwritten too early).  Errors accumulate along the
 * graph as in a normal run.  Release the report with sc_group_report_free. */
smelt_status sc_check_groups(smelt_session *s, const void *const *inputs, ScGroupReport *out_report) SMELT_MUST_USE;
/* The same, judged by tol (NULL: the default rules). */
smelt_status sc_check_groups_tol(smelt_session *s, const void *const *inputs, const ScTol *tol,
                                 ScGroupReport *out_report) SMELT_MUST_USE;
void sc_group_report_free(ScGroupReport *r);

#endif
