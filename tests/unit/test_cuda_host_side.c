/* Product kernels carry no emulation stand-ins (CgCudaOptions.emulation):
 * examples/gpt2_block.yaml in f16 (mma.sync matmuls, flashdec attention;
 * wgmma on sm_90a) generated for sm_80 and sm_90a holds no #ifdef /
 * #ifndef __CUDA_ARCH__ (wgmma's device-side guard against a non-'a' arch,
 * an #if, stays) and no emu_ helper; asked for the emulation, the same module
 * has them, with the same launch table. */
#include <stdio.h>
#include <string.h>

#include "codegen/cuda/cg_cuda.h"
#include "codegen/lower.h"
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "tests/unit/check.h"

static FmtCudaModule *generate(Graph *g, const Kernel *k, int nk, const char *arch, bool emulation) {
  CgCudaOptions o = {.args_aligned = true, .arch = arch, .emulation = emulation};
  FmtCudaModule *m = NULL;
  CHECK_OK(cg_cuda_generate(g, k, nk, &o, &m));
  return m;
}

static int count(const char *s, const char *what) {
  int n = 0;
  for (const char *p = s; (p = strstr(p, what)); p++) n++;
  return n;
}

int main(void) {
  const char *archs[] = {"sm_80", "sm_90a"};
  for (int a = 0; a < 2; a++) {
    Graph *g = NULL;
    FeOptions fo = {.dtype = DT_F16};
    CHECK_OK(fe_load_model("examples/gpt2_block.yaml", &fo, &g));
    if (!g) break;
    PassCtx pc = {.target = "cuda", .arch = archs[a]};
    CHECK_OK(pass_run_pipeline(g, &pc, NULL, NULL, NULL));
    pass_ctx_free(&pc);
    if (g->ngroups == 0) CHECK_OK(cg_single_node_groups(g));
    Kernel *k = NULL;
    int nk = 0;
    CHECK_OK(cg_lower(g, &k, &nk));
    FmtCudaModule *prod = generate(g, k, nk, archs[a], false), *emu = generate(g, k, nk, archs[a], true);
    if (prod && emu) {
      int pa = 0, pe = 0, ea = 0, ee = 0;
      size_t pn = 0, en = 0;
      for (int u = 0; u < prod->nunits; u++)
        pa += count(prod->units[u], "#ifdef __CUDA_ARCH__") + count(prod->units[u], "#ifndef __CUDA_ARCH__"), pe += count(prod->units[u], "emu_"), pn += strlen(prod->units[u]);
      for (int u = 0; u < emu->nunits; u++)
        ea += count(emu->units[u], "#ifndef __CUDA_ARCH__"), ee += count(emu->units[u], "emu_"), en += strlen(emu->units[u]);
      CHECK(pa == 0 && pe == 0);
      CHECK(ea > 0 && ee > 0);
      CHECK(prod->nunits == emu->nunits);
      /* the same kernels: the launch table does not depend on the option */
      CHECK(prod->nkernels == emu->nkernels);
      for (int i = 0; i < prod->nkernels && i < emu->nkernels; i++) {
        CHECK(strcmp(prod->kernels[i].variant, emu->kernels[i].variant) == 0);
        CHECK(prod->kernels[i].smem == emu->kernels[i].smem);
      }
      printf("%s: product units %zu bytes, with the emulation %zu\n", archs[a], pn, en);
    }
    fmt_cuda_module_free(prod);
    fmt_cuda_module_free(emu);
    cg_kernels_free(k, nk);
    ir_graph_destroy(g);
  }
  return check_done("test_cuda_host_side");
}
