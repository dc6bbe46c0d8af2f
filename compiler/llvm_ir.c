/* The LLVM IR of one kernel of a bundle, for `smelt inspect --source` on a
 * CPU kernel: the bundle holds machine code only, so the IR is generated
 * again from the bundle's graph and kernel table (the same generator, so
 * the same IR) and the kernel's functions are cut out of the module text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/llvm/cg_llvm.h"
#include "ir/bytes.h"
#include "compiler/cpu_target.h"
#include "compiler/driver.h"

/* Whether a "define" line defines @name or one of its helpers @name.xyz
 * (quoted or not). */
static bool defines(const char *line, size_t n, const char *name) {
  size_t nl = strlen(name);
  for (const char *at = memchr(line, '@', n); at; at = memchr(at + 1, '@', n - (size_t)(at + 1 - line))) {
    const char *p = at + 1;
    if (*p == '"') p++;
    if ((size_t)(line + n - p) > nl && strncmp(p, name, nl) == 0 &&
        (p[nl] == '(' || p[nl] == '.' || (p[nl] == '"' && p[nl + 1] == '(')))
      return true;
  }
  return false;
}

/* Every function of a module's text that belongs to the kernel called
 * name, "define" to its closing "}", or NULL when there is none. */
static char *extract_functions(const char *module, const char *name) {
  ByteBuf out = {0};
  for (const char *line = module; *line;) {
    const char *nl = strchr(line, '\n');
    size_t n = nl ? (size_t)(nl - line) : strlen(line);
    if (strncmp(line, "define ", 7) == 0 && defines(line, n, name)) {
      const char *end = strstr(line, "\n}\n");
      size_t len = end ? (size_t)(end - line) + 3 : strlen(line);
      bb_put(&out, line, len);
      bb_put(&out, "\n", 1);
      line += len;
      continue;
    }
    line += n + (nl ? 1 : 0);
  }
  if (out.oom || !out.len) {
    free(out.p);
    return NULL;
  }
  bb_put(&out, "", 1);
  if (out.oom) {
    free(out.p);
    return NULL;
  }
  return (char *)out.p;
}

smelt_status sc_bundle_kernel_llvm_ir(const smelt_bundle *b, int kernel, char **out_text) {
  *out_text = NULL;
  /* cg_llvm_ir_text reads the graph and the kernels; it takes them
   * non-const only because the compile path shares its signature. */
  Graph *g = (Graph *)rt_bundle_graph(b);
  Kernel *k = (Kernel *)rt_bundle_kernel(b, 0);
  /* the first (most capable) CPU variant's name */
  const char *cpus = rt_bundle_manifest_get(b, "cpu");
  char cpu[64] = "";
  if (cpus) snprintf(cpu, sizeof cpu, "%.*s", (int)strcspn(cpus, ","), cpus);
  /* the bundle is untrusted, and may come from a newer LLVM: a name this
   * LLVM does not know must not reach it (compiler/cpu_target.h) */
  if (cpu[0] && strcmp(cpu, "unknown") != 0 && !sc_cpu_name_known(cpu))
    return st_error(ST_UNSUPPORTED,
                    "the bundle's CPU code is for '%s', a CPU this smelt does not know, so its LLVM IR cannot be "
                    "made again here (known: %s; or inspect it where it was compiled)",
                    cpu, sc_cpu_known_names());
  CgLlvmOptions lo = {.cpu = cpu[0] && strcmp(cpu, "unknown") != 0 ? cpu : NULL};
  char *module;
#ifdef SMELT_HAVE_LLVM
  RETURN_IF_ERROR(cg_llvm_ir_text(g, k, rt_bundle_num_kernels(b), &lo, false, &module));
#else
  (void)g, (void)lo;
  return st_error(ST_UNSUPPORTED, "this smelt was built without LLVM (SMELT_LLVM=OFF)");
#endif
  char *fn = extract_functions(module, k[kernel].name);
  free(module);
  if (!fn) return st_error(ST_INTERNAL, "kernel '%s' is missing from the regenerated LLVM module", k[kernel].name);
  *out_text = fn;
  return NULL;
}

