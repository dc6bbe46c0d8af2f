/* Flag helpers: "did you mean" for a misspelled flag or command, and the
 * tolerances of --check.
 *
 * The flags a command knows are read from its own --help text: every token
 * that starts with "--" (and "-x" after a space) is a flag, with an "=word"
 * suffix kept when the help spells one out ("--check=groups").  So the
 * suggestions can only name flags the help documents, and a flag added to
 * the parser and its help is suggested without another list to keep.
 *
 * The suggestion is the known flag nearest to what was typed by optimal
 * string alignment distance (Levenshtein plus the transposition of two
 * neighbours, the commonest typo: "--devcie"), compared by name (the part
 * before '=') unless the candidate spells out a value; it is offered when
 * the distance is small for the name's length (1 up to 4 letters, 2 up to
 * 8, 3 beyond), or when what was typed is a prefix of exactly one flag
 * ("--thr" for "--threads").  Ties go to the flag the help lists first.
 *
 * Also here: the tolerances of --check (cli_parse_tolerance).
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define MAX_FLAG 64

/* Optimal string alignment distance of a[0..na) and b[0..nb). */
static int osa_distance(const char *a, size_t na, const char *b, size_t nb) {
  if (na >= MAX_FLAG || nb >= MAX_FLAG) return MAX_FLAG;
  int d[MAX_FLAG + 1][MAX_FLAG + 1];
  for (size_t i = 0; i <= na; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= nb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= na; i++)
    for (size_t j = 1; j <= nb; j++) {
      int cost = a[i - 1] != b[j - 1];
      int v = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
      if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
        v = d[i - 2][j - 2] + 1;
      d[i][j] = v;
    }
  return d[na][nb];
}

static bool flag_char(char c) { return isalnum((unsigned char)c) || c == '-' || c == '_'; }

/* The next flag token of help at or after *p: its start and length (an
 * "=word" suffix included); false at the end. */
static bool next_flag(const char **p, const char **out, size_t *out_len) {
  for (const char *s = *p; *s; s++) {
    bool at_word = s == *p || s[-1] == ' ' || s[-1] == '\n' || s[-1] == '(' || s[-1] == ',' || s[-1] == '\'';
    if (!at_word || s[0] != '-') continue;
    const char *q = s + 1;
    if (*q == '-') q++;
    if (!isalpha((unsigned char)*q)) continue;
    while (flag_char(*q)) q++;
    if (*q == '=' && isalpha((unsigned char)q[1]) && islower((unsigned char)q[1])) {
      const char *w = q + 1;
      while (isalnum((unsigned char)*w)) w++;
      /* "--input NAME=FILE" has its value after a space; "--check=groups"
       * spells out one of a fixed set: only lower-case words count */
      bool lower = true;
      for (const char *c = q + 1; c < w; c++) lower = lower && !isupper((unsigned char)*c);
      if (lower) q = w;
    }
    if (s[1] != '-' && q - s > 2) continue; /* "-o" flags are one letter; "-1e-5" and the like are not flags */
    *out = s;
    *out_len = (size_t)(q - s);
    *p = q;
    return true;
  }
  return false;
}

static int allowed_distance(size_t letters) { return letters <= 4 ? 1 : letters <= 8 ? 2 : 3; }

bool cli_suggest_flag(const char *help, const char *arg, char *out, size_t cap) {
  out[0] = 0;
  if (!help || !arg || arg[0] != '-') return false;
  size_t alen = strlen(arg), aname = strcspn(arg, "=");
  int best = MAX_FLAG;
  char prefix_of[MAX_FLAG] = ""; /* the one flag arg is a prefix of, so far */
  bool ambiguous = false;        /* ... or it is a prefix of two */
  const char *p = help, *tok;
  size_t tlen;
  while (next_flag(&p, &tok, &tlen)) {
    if (tlen >= MAX_FLAG) continue;
    size_t tname = strcspn(tok, "=");
    if (tname > tlen) tname = tlen;
    bool spelled = tname < tlen; /* the candidate spells out its value */
    int d = osa_distance(arg, spelled ? alen : aname, tok, spelled ? tlen : tname);
    size_t letters = (spelled ? tlen : tname) - (tok[1] == '-' ? 2 : 1);
    if (d <= allowed_distance(letters) && d < best && d > 0) {
      best = d;
      snprintf(out, cap, "%.*s", (int)(spelled ? tlen : tname), tok);
    }
    /* a prefix of one flag (at least 3 letters typed) */
    if (!spelled && aname >= 5 && aname < tname && strncmp(arg, tok, aname) == 0) {
      if (!prefix_of[0]) snprintf(prefix_of, sizeof prefix_of, "%.*s", (int)tname, tok);
      else if (strlen(prefix_of) != tname || strncmp(prefix_of, tok, tname) != 0) ambiguous = true;
    }
  }
  if (!out[0] && prefix_of[0] && !ambiguous) snprintf(out, cap, "%s", prefix_of);
  return out[0] != 0;
}

int cli_unknown_flag(const char *cmd, const char *help, const char *arg) {
  char near[MAX_FLAG];
  if (cli_suggest_flag(help, arg, near, sizeof near))
    return cli_usage(cmd, "unknown flag '%s' (did you mean '%s'?)", arg, near);
  return cli_usage(cmd, "unknown flag '%s'", arg);
}

const char *cli_suggest_word(const char *word, const char *const *known, int n) {
  const char *best = NULL;
  int bd = MAX_FLAG;
  size_t wl = strlen(word);
  for (int i = 0; i < n; i++) {
    int d = osa_distance(word, wl, known[i], strlen(known[i]));
    if (d > 0 && d <= allowed_distance(strlen(known[i])) && d < bd) bd = d, best = known[i];
  }
  return best;
}

bool cli_parse_tolerance(const char *s, double *out) {
  if (!s || !*s) return false;
  char *end;
  double v = strtod(s, &end);
  if (*end || !isfinite(v) || v < 0) return false;
  *out = v;
  return true;
}
