/* Loading compiled kernels: an ORC LLJIT per object.
 *
 * The object cg_llvm_compile emitted is added to the main JITDylib of a
 * fresh LLJIT, which links it lazily, at the first lookup.  The kernels
 * call libm (expf, tanhf, erff, powf, ...) and may call memset/memcpy that
 * LLVM's idiom recognition introduced; a generator that searches the
 * running process resolves them (without it, linking fails with "Symbols
 * not found: expf").  No optimiser runs here: loading a bundle costs the
 * link only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>

#include "codegen/llvm/cg_internal.h"

struct CgJit {
  LLVMOrcLLJITRef jit;
};

static smelt_status llvm_error(LLVMErrorRef err, const char *what) {
  char *msg = LLVMGetErrorMessage(err);
  smelt_status st = st_error(ST_INTERNAL, "%s: %s", what, msg ? msg : "");
  LLVMDisposeErrorMessage(msg);
  return st;
}

smelt_status cg_jit_create(const void *obj, size_t len, CgJit **out_jit) {
  *out_jit = NULL;
  RETURN_IF_ERROR(cg_llvm_init());
  CgJit *j = calloc(1, sizeof *j);
  if (!j) return st_error(ST_NO_MEMORY, "out of memory creating the JIT");
  /* NULL builder: LLJIT detects the host itself */
  LLVMErrorRef err = LLVMOrcCreateLLJIT(&j->jit, NULL);
  if (err) {
    free(j);
    return llvm_error(err, "creating the LLVM JIT");
  }
  LLVMOrcJITDylibRef jd = LLVMOrcLLJITGetMainJITDylib(j->jit);
  LLVMOrcDefinitionGeneratorRef gen = NULL;
  err = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(j->jit), NULL, NULL);
  if (err) {
    cg_jit_destroy(j);
    return llvm_error(err, "JIT symbol generator for the process");
  }
  LLVMOrcJITDylibAddGenerator(jd, gen); /* the JITDylib owns gen now */
  LLVMMemoryBufferRef buf = LLVMCreateMemoryBufferWithMemoryRangeCopy(obj, len, "smelt-kernels");
  err = LLVMOrcLLJITAddObjectFile(j->jit, jd, buf); /* takes buf, also on error */
  if (err) {
    cg_jit_destroy(j);
    return llvm_error(err, "loading kernel machine code into the JIT");
  }
  *out_jit = j;
  return NULL;
}

smelt_status cg_jit_find(CgJit *jit, const char *name, void **out_fn) {
  *out_fn = NULL;
  LLVMOrcExecutorAddress addr = 0;
  LLVMErrorRef err = LLVMOrcLLJITLookup(jit->jit, &addr, name);
  if (err) return llvm_error(err, "looking up a kernel");
  /* object pointer <-> integer: the JIT hands out addresses as integers */
  *out_fn = (void *)(uintptr_t)addr;
  return NULL;
}

void *cg_jit_lookup(CgJit *jit, const char *name) {
  void *fn = NULL;
  smelt_status st = cg_jit_find(jit, name, &fn);
  st_free(st);
  return fn;
}

smelt_status cg_jit_prepack(CgJit *jit, const Graph *g, const Kernel *k, int nk, int *out_npacked) {
  if (out_npacked) *out_npacked = 0;
  for (int i = 0; i < nk; i++) {
    char name[sizeof k[i].name + 16];
    snprintf(name, sizeof name, "%s" CG_PREPACK_SUFFIX, k[i].name);
    void *sym = cg_jit_lookup(jit, name);
    if (!sym) continue; /* nothing packed */
    void **args = calloc((size_t)(k[i].nargs ? k[i].nargs : 1), sizeof *args);
    if (!args) return st_error(ST_NO_MEMORY, "out of memory preparing kernel %s", k[i].name);
    for (int a = 0; a < k[i].nargs; a++)
      if (g->val[k[i].args[a]].kind == VK_CONST) args[a] = g->val[k[i].args[a]].data;
    CgPrepackFn fn;
    memcpy(&fn, &sym, sizeof fn); /* object to function pointer, as dlsym users do */
    fn(args);
    free(args);
    if (out_npacked) (*out_npacked)++;
  }
  return NULL;
}

void cg_jit_destroy(CgJit *jit) {
  if (!jit) return;
  if (jit->jit) {
    LLVMErrorRef err = LLVMOrcDisposeLLJIT(jit->jit);
    if (err) LLVMConsumeError(err); /* nothing left to report it to */
  }
  free(jit);
}
