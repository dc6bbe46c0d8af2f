/* libFuzzer target: the runtime's ELF loader (runtime/elf_loader.c), which
 * links a bundle's CPU object: checks, layout, symbol resolution against
 * the import table and relocation.  The image is mapped and write-protected
 * but nothing in it runs.  Beyond the rules of fuzz.h: every function the
 * image exports lies in its text. */
#include "fuzz.h"
#include "runtime/elf_loader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int nimports = 0;
  const RtElfImport *imports = rt_elf_default_imports(&nimports);
  RtElfImage *img = NULL;
  smelt_status st = rt_elf_load(data, size, imports, nimports, &img);
  if (st) {
    if (img) fuzz_fail("a failed load gives no image", st_message(st));
    fuzz_check_error(st, NULL);
    return 0;
  }
  RtElfLayout lay;
  rt_elf_layout(img, &lay);
  for (int i = 0; i < rt_elf_symbol_count(img); i++) {
    const char *name = rt_elf_symbol_name(img, i);
    const char *fn = rt_elf_lookup(img, name), *text = lay.text;
    if (!fn || fn < text || fn >= text + lay.text_size) fuzz_fail("an exported function lies in the text", name);
  }
  rt_elf_free(img);
  return 0;
}
