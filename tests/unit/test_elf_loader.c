/* The ELF loader (runtime/elf_loader.h) and the CPU feature check
 * (runtime/cpu_features.h).
 *
 * Three groups of cases:
 *   - a small relocatable object built byte by byte here (no LLVM needed),
 *     whose functions exercise each relocation kind the loader handles:
 *     PC32 into .rodata, .data and .bss, PLT32 to an import (through a stub:
 *     the import lives in this executable, far from the image), a
 *     REX_GOTPCRELX GOT load of the import, R_X86_64_64 and PC64 in data.
 *     The functions are called and their results checked, the image's pages
 *     are read back from /proc/self/maps (text r-x, rodata r--, data rw-,
 *     nothing writable and executable), and then the object is broken in
 *     every way the loader must notice (truncations at every length, bad
 *     magic, wrong machine, tables past the end of the file, overflowing
 *     offsets, relocations outside their section, bad symbol indices,
 *     unsupported relocation types, undefined symbols, ...): each must fail
 *     with the expected code and a message naming the fault;
 *   - real kernels from cg_llvm_compile (elementwise f64 tanh/exp/erf and
 *     f32 pow/sin, which call libm; a matmul; softmax and a sum), loaded
 *     with rt_elf_load and with the ORC JIT (cg_jit_create), their prepack
 *     functions (the matmul's packed weight, in .bss) run once, and run on
 *     the same inputs: results must match the reference interpreter and be
 *     bit-identical between the two loaders; the same objects then go
 *     through an empty or incomplete import table, truncation, and a
 *     byte-flip fuzz loop (each mutation must load or fail cleanly; the CI
 *     build runs this under ASan and UBSan);
 *   - CPU features: overrides, the missing-feature message, the psABI
 *     levels, and the host's detection against LLVM's own.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu_features.h"
#include "runtime/elf_loader.h"

#ifdef SMELT_HAVE_LLVM
#include "tests/unit/test_llvm_harness.h"
#else
#include "tests/unit/check.h"
#endif

/* Expects st to be an error of the given code whose message contains want
 * (and want2 when not NULL); frees st.  label names the case. */
static void expect_error(smelt_status st, StatusCode code, const char *want, const char *want2, const char *label) {
  if (!st) {
    fprintf(stderr, "%s: expected an error containing '%s', got success\n", label, want);
    check_failures++;
    return;
  }
  const char *msg = st_message(st);
  if (st_code(st) != code || !strstr(msg, want) || (want2 && !strstr(msg, want2))) {
    fprintf(stderr, "%s: expected code %d and '%s'%s%s, got code %d: %s\n", label, (int)code, want,
            want2 ? " and " : "", want2 ? want2 : "", (int)st_code(st), msg);
    check_failures++;
  }
  st_free(st);
}

/* ---- the image's pages, from /proc/self/maps ---- */

static bool range_has(uintptr_t lo, uintptr_t hi, const void *p, size_t n) {
  return n && (uintptr_t)p >= lo && (uintptr_t)p < hi;
}

/* Every mapping over the image is checked: none writable and executable,
 * and the text, rodata and data parts have exactly their protections. */
static void check_maps(const RtElfLayout *l, const char *label) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) {
    printf("%s: no /proc/self/maps, page protections not checked\n", label);
    return;
  }
  uintptr_t base = (uintptr_t)l->base, end = base + l->size;
  bool saw_text = !l->text_size, saw_ro = !l->rodata_size, saw_data = !l->data_size;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
    if (hi <= base || lo >= end) continue;
    if (strchr(perms, 'w') && strchr(perms, 'x')) {
      fprintf(stderr, "%s: image page is writable and executable: %s", label, line);
      check_failures++;
    }
    const struct {
      const void *p;
      size_t n;
      const char *want;
      bool *saw;
    } parts[3] = {{l->text, l->text_size, "r-x", &saw_text},
                  {l->rodata, l->rodata_size, "r--", &saw_ro},
                  {l->data, l->data_size, "rw-", &saw_data}};
    for (int i = 0; i < 3; i++)
      if (range_has(lo, hi, parts[i].p, parts[i].n)) {
        *parts[i].saw = true;
        if (strncmp(perms, parts[i].want, 3) != 0) {
          fprintf(stderr, "%s: part %d should be %s: %s", label, i, parts[i].want, line);
          check_failures++;
        }
      }
  }
  fclose(f);
  CHECK(saw_text && saw_ro && saw_data);
}

/* ---- a hand-made relocatable object ---- */

enum {
  S_NULL,
  S_TEXT,
  S_RODATA,
  S_DATA,
  S_BSS,
  S_EH,
  S_RELA_TEXT,
  S_RELA_RODATA,
  S_RELA_DATA,
  S_RELA_EH,
  S_NOTE,
  S_SYMTAB,
  S_STRTAB,
  S_SHSTRTAB,
  NSEC
};

/* symbols */
enum { Y_NULL, Y_TEXT, Y_RODATA, Y_DATA, Y_BSS, Y_ANSWER, Y_CALL, Y_GOT, Y_BUMP, Y_PTR, Y_RO, Y_TWICE, NSYM };

typedef struct {
  uint8_t b[4096];
  size_t len;
  size_t off[NSEC]; /* file offset of each section's bytes */
  size_t shoff;
  size_t nrela_text;
} Mini;

static void put16(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 2; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put32(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static size_t mini_append(Mini *m, const void *data, size_t n, size_t align) {
  m->len = (m->len + align - 1) / align * align;
  size_t at = m->len;
  memcpy(m->b + at, data, n);
  m->len += n;
  return at;
}

/* The machine code: offsets of each function in .text, and where the
 * relocated fields are. */
static const uint8_t mini_text[56] = {
    /* 0 get_answer: mov eax, [rip + .rodata]; ret */
    0x8b, 0x05, 0, 0, 0, 0, 0xc3, 0xcc,
    /* 8 call_twice: jmp twice@PLT */
    0xe9, 0, 0, 0, 0, 0xcc, 0xcc, 0xcc,
    /* 16 got_twice: mov rax, [rip + twice@GOTPCREL]; ret */
    0x48, 0x8b, 0x05, 0, 0, 0, 0, 0xc3,
    /* 24 bump: inc dword [rip + .bss]; mov eax, [rip + .bss]; ret */
    0xff, 0x05, 0, 0, 0, 0, 0x8b, 0x05, 0, 0, 0, 0, 0xc3, 0xcc, 0xcc, 0xcc,
    /* 40 get_ptr: mov rax, [rip + .data]; ret */
    0x48, 0x8b, 0x05, 0, 0, 0, 0, 0xc3,
    /* 48 get_rodata: lea rax, [rip + .rodata]; ret */
    0x48, 0x8d, 0x05, 0, 0, 0, 0, 0xc3};

static const char mini_strtab[] = "\0get_answer\0call_twice\0got_twice\0bump\0get_ptr\0get_rodata\0twice";
static const char mini_shstrtab[] = "\0.text\0.rodata\0.data\0.bss\0.eh_frame\0.rela.text\0.rela.rodata\0.rela.data\0"
                                    ".rela.eh_frame\0.note.GNU-stack\0.symtab\0.strtab\0.shstrtab\0.data.rel.ro";

static uint32_t str_off(const char *tab, size_t size, const char *name) {
  for (size_t i = 0; i < size; i++)
    if (strcmp(tab + i, name) == 0) return (uint32_t)i;
  return 0;
}

static void rela(uint8_t *p, uint64_t off, uint32_t sym, uint32_t type, int64_t addend) {
  put64(p, off);
  put64(p + 8, (uint64_t)sym << 32 | type);
  put64(p + 16, (uint64_t)addend);
}

static void sym(uint8_t *p, uint32_t name, unsigned bind, unsigned type, uint16_t shndx, uint64_t value,
                uint64_t size) {
  put32(p, name);
  p[4] = (uint8_t)(bind << 4 | type);
  p[5] = 0;
  put16(p + 6, shndx);
  put64(p + 8, value);
  put64(p + 16, size);
}

static void mini_build(Mini *m) {
  memset(m, 0, sizeof *m);
  m->len = 64; /* the ELF header, written last */
  uint8_t ro[16] = {42};
  uint8_t data[8] = {0};
  uint8_t eh[8] = {0};
  m->off[S_TEXT] = mini_append(m, mini_text, sizeof mini_text, 16);
  m->off[S_RODATA] = mini_append(m, ro, sizeof ro, 16);
  m->off[S_DATA] = mini_append(m, data, sizeof data, 8);
  m->off[S_BSS] = m->len;
  m->off[S_EH] = mini_append(m, eh, sizeof eh, 8);

  uint8_t rt[7 * 24];
  rela(rt + 0 * 24, 2, Y_RODATA, 2 /* PC32 */, -4);
  rela(rt + 1 * 24, 9, Y_TWICE, 4 /* PLT32 */, -4);
  rela(rt + 2 * 24, 19, Y_TWICE, 42 /* REX_GOTPCRELX */, -4);
  rela(rt + 3 * 24, 26, Y_BSS, 2, -4);
  rela(rt + 4 * 24, 32, Y_BSS, 2, -4);
  rela(rt + 5 * 24, 43, Y_DATA, 2, -4);
  rela(rt + 6 * 24, 51, Y_RODATA, 2, -4);
  m->nrela_text = 7;
  m->off[S_RELA_TEXT] = mini_append(m, rt, sizeof rt, 8);
  uint8_t rr[24], rd[24], re[24];
  rela(rr, 8, Y_ANSWER, 24 /* PC64 */, 0);
  rela(rd, 0, Y_ANSWER, 1 /* 64 */, 0);
  rela(re, 0, Y_TEXT, 2, 0); /* like .rela.eh_frame: skipped with its target */
  m->off[S_RELA_RODATA] = mini_append(m, rr, sizeof rr, 8);
  m->off[S_RELA_DATA] = mini_append(m, rd, sizeof rd, 8);
  m->off[S_RELA_EH] = mini_append(m, re, sizeof re, 8);
  m->off[S_NOTE] = m->len;

  uint8_t st[NSYM * 24] = {0};
  const size_t ss = sizeof mini_strtab;
  sym(st + Y_TEXT * 24, 0, 0, 3 /* SECTION */, S_TEXT, 0, 0);
  sym(st + Y_RODATA * 24, 0, 0, 3, S_RODATA, 0, 0);
  sym(st + Y_DATA * 24, 0, 0, 3, S_DATA, 0, 0);
  sym(st + Y_BSS * 24, 0, 0, 3, S_BSS, 0, 0);
  sym(st + Y_ANSWER * 24, str_off(mini_strtab, ss, "get_answer"), 1, 2, S_TEXT, 0, 7);
  sym(st + Y_CALL * 24, str_off(mini_strtab, ss, "call_twice"), 1, 2, S_TEXT, 8, 5);
  sym(st + Y_GOT * 24, str_off(mini_strtab, ss, "got_twice"), 1, 2, S_TEXT, 16, 8);
  sym(st + Y_BUMP * 24, str_off(mini_strtab, ss, "bump"), 1, 2, S_TEXT, 24, 13);
  sym(st + Y_PTR * 24, str_off(mini_strtab, ss, "get_ptr"), 1, 2, S_TEXT, 40, 8);
  sym(st + Y_RO * 24, str_off(mini_strtab, ss, "get_rodata"), 1, 2, S_TEXT, 48, 8);
  sym(st + Y_TWICE * 24, str_off(mini_strtab, ss, "twice"), 1, 0, 0, 0, 0);
  m->off[S_SYMTAB] = mini_append(m, st, sizeof st, 8);
  m->off[S_STRTAB] = mini_append(m, mini_strtab, sizeof mini_strtab, 1);
  m->off[S_SHSTRTAB] = mini_append(m, mini_shstrtab, sizeof mini_shstrtab, 1);

  /* the section headers */
  const struct {
    const char *name;
    uint32_t type;
    uint64_t flags, size;
    uint32_t link, info;
    uint64_t align, entsize;
  } sh[NSEC] = {
      [S_TEXT] = {".text", 1, 0x6, sizeof mini_text, 0, 0, 16, 0},
      [S_RODATA] = {".rodata", 1, 0x2, 16, 0, 0, 16, 0},
      [S_DATA] = {".data", 1, 0x3, 8, 0, 0, 8, 0},
      [S_BSS] = {".bss", 8, 0x3, 4, 0, 0, 4, 0},
      [S_EH] = {".eh_frame", 0x70000001u, 0x2, 8, 0, 0, 8, 0},
      [S_RELA_TEXT] = {".rela.text", 4, 0x40, sizeof rt, S_SYMTAB, S_TEXT, 8, 24},
      [S_RELA_RODATA] = {".rela.rodata", 4, 0x40, 24, S_SYMTAB, S_RODATA, 8, 24},
      [S_RELA_DATA] = {".rela.data", 4, 0x40, 24, S_SYMTAB, S_DATA, 8, 24},
      [S_RELA_EH] = {".rela.eh_frame", 4, 0x40, 24, S_SYMTAB, S_EH, 8, 24},
      [S_NOTE] = {".note.GNU-stack", 1, 0, 0, 0, 0, 1, 0},
      [S_SYMTAB] = {".symtab", 2, 0, sizeof st, S_STRTAB, Y_ANSWER, 8, 24},
      [S_STRTAB] = {".strtab", 3, 0, sizeof mini_strtab, 0, 0, 1, 0},
      [S_SHSTRTAB] = {".shstrtab", 3, 0, sizeof mini_shstrtab, 0, 0, 1, 0},
  };
  m->len = (m->len + 7) / 8 * 8;
  m->shoff = m->len;
  for (int i = 1; i < NSEC; i++) {
    uint8_t *p = m->b + m->shoff + (size_t)i * 64;
    put32(p, str_off(mini_shstrtab, sizeof mini_shstrtab, sh[i].name));
    put32(p + 4, sh[i].type);
    put64(p + 8, sh[i].flags);
    put64(p + 24, m->off[i]);
    put64(p + 32, sh[i].size);
    put32(p + 40, sh[i].link);
    put32(p + 44, sh[i].info);
    put64(p + 48, sh[i].align);
    put64(p + 56, sh[i].entsize);
  }
  m->len = m->shoff + NSEC * 64;

  uint8_t *e = m->b;
  memcpy(e, "\x7f" "ELF", 4);
  e[4] = 2, e[5] = 1, e[6] = 1;
  put16(e + 16, 1);  /* ET_REL */
  put16(e + 18, 62); /* EM_X86_64 */
  put32(e + 20, 1);
  put64(e + 40, m->shoff);
  put16(e + 52, 64);
  put16(e + 58, 64);
  put16(e + 60, NSEC);
  put16(e + 62, S_SHSTRTAB);
}

/* where fields of section header i and symbol k lie in the file */
static uint8_t *mini_sh(Mini *m, int i) { return m->b + m->shoff + (size_t)i * 64; }
static uint8_t *mini_sym(Mini *m, int k) { return m->b + m->off[S_SYMTAB] + (size_t)k * 24; }
static uint8_t *mini_rela(Mini *m, int k) { return m->b + m->off[S_RELA_TEXT] + (size_t)k * 24; }

static double twice(double x) { return 2 * x; }

static const RtElfImport mini_imports[] = {{"unused", NULL}, {"twice", (void *)twice}};

static void test_mini_load(void) {
  Mini m;
  mini_build(&m);
  RtElfImage *img = NULL;
  CHECK_OK(rt_elf_load(m.b, m.len, mini_imports, 2, &img));
  if (!img) return;
  CHECK(rt_elf_symbol_count(img) == 6);
  CHECK(rt_elf_symbol_name(img, 0) && strcmp(rt_elf_symbol_name(img, 0), "bump") == 0); /* sorted */
  CHECK(rt_elf_lookup(img, "twice") == NULL);                                             /* undefined: not an export */
  CHECK(rt_elf_lookup(img, ".text") == NULL);
  CHECK(rt_elf_lookup(img, "nope") == NULL);
  void *p_answer = rt_elf_lookup(img, "get_answer"), *p_call = rt_elf_lookup(img, "call_twice"),
       *p_got = rt_elf_lookup(img, "got_twice"), *p_bump = rt_elf_lookup(img, "bump"),
       *p_ptr = rt_elf_lookup(img, "get_ptr"), *p_ro = rt_elf_lookup(img, "get_rodata");
  CHECK(p_answer && p_call && p_got && p_bump && p_ptr && p_ro);
  RtElfLayout l;
  rt_elf_layout(img, &l);
  CHECK(l.text_size && l.rodata_size && l.data_size);
  CHECK((const uint8_t *)p_answer >= (const uint8_t *)l.text &&
        (const uint8_t *)p_answer < (const uint8_t *)l.text + l.text_size);
#if defined(__x86_64__)
  if (p_answer && p_call && p_got && p_bump && p_ptr && p_ro) {
    int (*answer)(void), (*bump)(void);
    double (*call)(double);
    void *(*got)(void), *(*ptr)(void);
    const uint8_t *(*ro)(void);
    memcpy(&answer, &p_answer, sizeof answer);
    memcpy(&call, &p_call, sizeof call);
    memcpy(&got, &p_got, sizeof got);
    memcpy(&bump, &p_bump, sizeof bump);
    memcpy(&ptr, &p_ptr, sizeof ptr);
    memcpy(&ro, &p_ro, sizeof ro);
    CHECK(answer() == 42);
    CHECK(call(21.5) == 43.0);
    void *tw = (void *)twice;
    CHECK(got() == tw);
    CHECK(bump() == 1);
    CHECK(bump() == 2);
    CHECK(ptr() == p_answer);
    const uint8_t *r = ro();
    CHECK(r == l.rodata);
    int64_t pc64;
    memcpy(&pc64, r + 8, 8);
    CHECK((uintptr_t)r + 8 + (uint64_t)pc64 == (uintptr_t)p_answer);
    uintptr_t far = (uintptr_t)tw > (uintptr_t)l.base ? (uintptr_t)tw - (uintptr_t)l.base
                                                      : (uintptr_t)l.base - (uintptr_t)tw;
    printf("test_elf_loader: the import is %s the image (%.1f GiB)\n", far > ((uintptr_t)1 << 31) ? "far from" : "near",
           (double)far / (1 << 30));
  }
#endif
  check_maps(&l, "hand-made object");
  rt_elf_free(img);
  rt_elf_free(NULL);
}

/* .data.rel.ro (written by relocations only) goes with the read-only data:
 * the pointer in it still works, and the data part holds just .bss. */
static void test_mini_relro(void) {
  Mini m;
  mini_build(&m);
  put32(mini_sh(&m, S_DATA), str_off(mini_shstrtab, sizeof mini_shstrtab, ".data.rel.ro"));
  RtElfImage *img = NULL;
  CHECK_OK(rt_elf_load(m.b, m.len, mini_imports, 2, &img));
  if (!img) return;
  void *p_answer = rt_elf_lookup(img, "get_answer"), *p_ptr = rt_elf_lookup(img, "get_ptr");
  RtElfLayout l;
  rt_elf_layout(img, &l);
#if defined(__x86_64__)
  if (p_answer && p_ptr) {
    void *(*ptr)(void);
    memcpy(&ptr, &p_ptr, sizeof ptr);
    CHECK(ptr() == p_answer);
  }
#endif
  /* sections are placed in index order: .rodata (16 bytes), then this one */
  uintptr_t at16 = 0;
  if (l.rodata_size >= 24) memcpy(&at16, (const uint8_t *)l.rodata + 16, sizeof at16);
  CHECK(at16 == (uintptr_t)p_answer);
  check_maps(&l, ".data.rel.ro");
  rt_elf_free(img);
}

typedef struct {
  const char *label;
  void (*mutate)(Mini *m);
  StatusCode code;
  const char *want, *want2;
  bool no_imports;
} Broken;

static void m_magic(Mini *m) { m->b[1] = 'X'; }
static void m_class(Mini *m) { m->b[4] = 1; }
static void m_machine(Mini *m) { put16(m->b + 18, 183); }
static void m_type(Mini *m) { put16(m->b + 16, 3); }
static void m_shentsize(Mini *m) { put16(m->b + 58, 40); }
static void m_shoff_huge(Mini *m) { put64(m->b + 40, 0xffffffffffffffc0ull); }
static void m_shoff_end(Mini *m) { put64(m->b + 40, m->len - 64); }
static void m_shstrndx(Mini *m) { put16(m->b + 62, 200); }
static void m_text_offset(Mini *m) { put64(mini_sh(m, S_TEXT) + 24, 0xffffffffffffff00ull); }
static void m_text_size(Mini *m) { put64(mini_sh(m, S_TEXT) + 32, m->len); }
static void m_link(Mini *m) { put32(mini_sh(m, S_RELA_TEXT) + 40, 99); }
static void m_info(Mini *m) { put32(mini_sh(m, S_RELA_TEXT) + 44, 99); }
static void m_align(Mini *m) { put64(mini_sh(m, S_RODATA) + 48, 24); }
static void m_align_big(Mini *m) { put64(mini_sh(m, S_RODATA) + 48, 1 << 16); }
static void m_bss_huge(Mini *m) { put64(mini_sh(m, S_BSS) + 32, 1ull << 40); }
static void m_bss_overflow(Mini *m) { put64(mini_sh(m, S_BSS) + 32, 0xfffffffffffffff0ull); }
static void m_shstr_nul(Mini *m) { m->b[m->off[S_SHSTRTAB] + sizeof mini_shstrtab - 1] = 'x'; }
static void m_str_nul(Mini *m) { m->b[m->off[S_STRTAB] + sizeof mini_strtab - 1] = 'x'; }
static void m_secname(Mini *m) { put32(mini_sh(m, S_DATA), 0x7fffffff); }
static void m_sym_entsize(Mini *m) { put64(mini_sh(m, S_SYMTAB) + 56, 16); }
static void m_sym_size(Mini *m) { put64(mini_sh(m, S_SYMTAB) + 32, NSYM * 24 - 1); }
static void m_sym_past(Mini *m) { put64(mini_sh(m, S_SYMTAB) + 32, 0xffffffffffffffe8ull); }
static void m_sym_name(Mini *m) { put32(mini_sym(m, Y_BUMP), 100000); }
static void m_sym_shndx(Mini *m) { put16(mini_sym(m, Y_BUMP) + 6, 50); }
static void m_sym_common(Mini *m) { put16(mini_sym(m, Y_BUMP) + 6, 0xfff2); }
static void m_sym_value(Mini *m) { put64(mini_sym(m, Y_BUMP) + 8, 1000); }
static void m_sym_notloaded(Mini *m) { put16(mini_sym(m, Y_RODATA) + 6, S_NOTE); }
static void m_sym_tls(Mini *m) { mini_sym(m, Y_BUMP)[4] = 1 << 4 | 6; }
static void m_rel_offset(Mini *m) { put64(mini_rela(m, 3), sizeof mini_text - 2); }
static void m_rel_offset_huge(Mini *m) { put64(mini_rela(m, 3), 0xfffffffffffffffeull); }
static void m_rel_sym(Mini *m) { put64(mini_rela(m, 3) + 8, (uint64_t)1000 << 32 | 2); }
static void m_rel_type(Mini *m) { put64(mini_rela(m, 3) + 8, (uint64_t)Y_BSS << 32 | 19); }
static void m_rel_range(Mini *m) { put64(mini_rela(m, 0) + 16, 0x7fffffff00ull); }
static void m_rel_entsize(Mini *m) { put64(mini_sh(m, S_RELA_TEXT) + 56, 16); }
static void m_rel_kind(Mini *m) { put32(mini_sh(m, S_RELA_TEXT) + 4, 9); }
static void m_rel_nobits(Mini *m) { put32(mini_sh(m, S_RELA_DATA) + 44, S_BSS); }
static void m_rel_symtab(Mini *m) { put32(mini_sh(m, S_RELA_TEXT) + 40, S_STRTAB); }
static void m_two_symtabs(Mini *m) { put32(mini_sh(m, S_NOTE) + 4, 2); }
static void m_wx(Mini *m) { put64(mini_sh(m, S_TEXT) + 8, 0x7); }
static void m_ctor(Mini *m) { put32(mini_sh(m, S_DATA) + 4, 14); }
static void m_dup(Mini *m) { put32(mini_sym(m, Y_PTR), str_off(mini_strtab, sizeof mini_strtab, "bump")); }
static void m_none(Mini *m) { (void)m; }

static const Broken broken[] = {
    {"bad magic", m_magic, ST_INVALID_INPUT, "magic", NULL, false},
    {"32-bit class", m_class, ST_INVALID_INPUT, "ELFCLASS64", NULL, false},
    {"wrong machine", m_machine, ST_INVALID_INPUT, "machine 183", NULL, false},
    {"shared object", m_type, ST_INVALID_INPUT, "ET_REL", NULL, false},
    {"section header size", m_shentsize, ST_INVALID_INPUT, "section header size 40", NULL, false},
    {"e_shoff huge", m_shoff_huge, ST_INVALID_INPUT, "section header table", "past the end", false},
    {"e_shoff near the end", m_shoff_end, ST_INVALID_INPUT, "section header table", "past the end", false},
    {"e_shstrndx", m_shstrndx, ST_INVALID_INPUT, "section name table index 200", NULL, false},
    {"section offset overflows", m_text_offset, ST_INVALID_INPUT, "section 1", "past the end", false},
    {"section past the end", m_text_size, ST_INVALID_INPUT, "section 1", "past the end", false},
    {"sh_link out of range", m_link, ST_INVALID_INPUT, "sh_link 99", NULL, false},
    {"sh_info out of range", m_info, ST_INVALID_INPUT, "sh_info 99", NULL, false},
    {"alignment not a power of two", m_align, ST_INVALID_INPUT, "power of two", NULL, false},
    {"alignment above a page", m_align_big, ST_UNSUPPORTED, "65536-byte alignment", NULL, false},
    {".bss of 1 TiB", m_bss_huge, ST_UNSUPPORTED, "'.bss'", "larger than", false},
    {".bss size overflows", m_bss_overflow, ST_UNSUPPORTED, "'.bss'", "larger than", false},
    {"section names without NUL", m_shstr_nul, ST_INVALID_INPUT, "section name table", "NUL", false},
    {"symbol names without NUL", m_str_nul, ST_INVALID_INPUT, "symbol string table", "NUL", false},
    {"section name offset", m_secname, ST_INVALID_INPUT, "section 3", "name offset", false},
    {"symbol entry size", m_sym_entsize, ST_INVALID_INPUT, "entry size 16", NULL, false},
    {"symbol table size", m_sym_size, ST_INVALID_INPUT, "not a multiple of 24", NULL, false},
    {"symbol table past the end", m_sym_past, ST_INVALID_INPUT, "section 11", "past the end", false},
    {"symbol name offset", m_sym_name, ST_INVALID_INPUT, "symbol 8", "name offset", false},
    {"symbol section index", m_sym_shndx, ST_INVALID_INPUT, "'bump'", "section index 50", false},
    {"COMMON symbol", m_sym_common, ST_UNSUPPORTED, "'bump'", "COMMON", false},
    {"symbol past its section", m_sym_value, ST_INVALID_INPUT, "'bump'", "past the end of section '.text'", false},
    {"symbol in a section not loaded", m_sym_notloaded, ST_INVALID_INPUT, "not loaded", NULL, false},
    {"TLS symbol", m_sym_tls, ST_UNSUPPORTED, "'bump'", "thread-local", false},
    {"relocation past its section", m_rel_offset, ST_INVALID_INPUT, "offset 0x36", "outside '.text'", false},
    {"relocation offset overflows", m_rel_offset_huge, ST_INVALID_INPUT, "outside '.text'", NULL, false},
    {"relocation symbol index", m_rel_sym, ST_INVALID_INPUT, "symbol index 1000", NULL, false},
    {"unsupported relocation", m_rel_type, ST_UNSUPPORTED, "relocation type 19", NULL, false},
    {"displacement out of range", m_rel_range, ST_INVALID_INPUT, "does not fit in 32 bits", "'.rodata'", false},
    {"relocation entry size", m_rel_entsize, ST_INVALID_INPUT, "'.rela.text'", "entry size 16", false},
    {"SHT_REL", m_rel_kind, ST_UNSUPPORTED, "SHT_REL", NULL, false},
    {"relocations into .bss", m_rel_nobits, ST_INVALID_INPUT, "NOBITS", NULL, false},
    {"relocations with the wrong symbol table", m_rel_symtab, ST_INVALID_INPUT, "does not use the symbol table", NULL,
     false},
    {"two symbol tables", m_two_symtabs, ST_INVALID_INPUT, "more than one symbol table", NULL, false},
    {"writable code", m_wx, ST_UNSUPPORTED, "writable and executable", NULL, false},
    {"constructors", m_ctor, ST_UNSUPPORTED, "constructors", NULL, false},
    {"a function defined twice", m_dup, ST_INVALID_INPUT, "'bump' is defined twice", NULL, false},
    {"no import table", m_none, ST_INVALID_INPUT, "not in the import table", "twice", true},
};

static void test_mini_broken(void) {
  Mini m;
  for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++) {
    mini_build(&m);
    broken[i].mutate(&m);
    RtElfImage *img = NULL;
    smelt_status st = rt_elf_load(m.b, m.len, broken[i].no_imports ? NULL : mini_imports, broken[i].no_imports ? 0 : 2,
                                  &img);
    CHECK(img == NULL || st == NULL);
    expect_error(st, broken[i].code, broken[i].want, broken[i].want2, broken[i].label);
    rt_elf_free(img);
  }
  /* every truncation: the section headers are last, so each one cuts them */
  mini_build(&m);
  int loaded = 0;
  for (size_t n = 0; n < m.len; n++) {
    uint8_t *copy = malloc(n ? n : 1); /* exactly n bytes: ASan sees any read past them */
    memcpy(copy, m.b, n);
    RtElfImage *img = NULL;
    smelt_status st = rt_elf_load(copy, n, mini_imports, 2, &img);
    if (!st) loaded++;
    st_free(st);
    rt_elf_free(img);
    free(copy);
  }
  CHECK(loaded == 0);
  RtElfImage *img = NULL;
  expect_error(rt_elf_load(m.b, 10, mini_imports, 2, &img), ST_INVALID_INPUT, "too short", NULL, "10 bytes");
  expect_error(rt_elf_load(m.b, m.len - 1, mini_imports, 2, &img), ST_INVALID_INPUT, "past the end", NULL,
               "one byte short");
}

/* Random mutations of obj: each must load (then it is freed, never run) or
 * fail with a status.  Half of them land in the section header table, where
 * the structure is, the rest anywhere. */
static void fuzz(const uint8_t *obj, size_t len, size_t shoff, const RtElfImport *imp, int nimp, int rounds,
                 uint64_t seed, const char *label) {
  uint8_t *copy = malloc(len);
  int loaded = 0;
  uint64_t r = seed;
  for (int k = 0; k < rounds; k++) {
    memcpy(copy, obj, len);
    int flips = 1 + (int)(k % 4);
    for (int f = 0; f < flips; f++) {
      r ^= r << 13, r ^= r >> 7, r ^= r << 17;
      size_t at = (r & 1) && shoff < len ? shoff + (size_t)((r >> 8) % (len - shoff)) : (size_t)((r >> 8) % len);
      uint8_t v = (uint8_t)(r >> 40);
      copy[at] = (r >> 50) % 3 == 0 ? 0xff : (r >> 50) % 3 == 1 ? 0 : (uint8_t)(copy[at] ^ (v ? v : 1));
    }
    RtElfImage *img = NULL;
    smelt_status st = rt_elf_load(copy, len, imp, nimp, &img);
    if (!st) {
      loaded++;
      CHECK(img != NULL);
    } else {
      CHECK(img == NULL && st_message(st)[0]);
    }
    st_free(st);
    rt_elf_free(img);
  }
  printf("test_elf_loader: fuzz %s: %d of %d mutations loaded, the rest refused\n", label, loaded, rounds);
  free(copy);
}

/* ---- real kernels from the CPU backend ---- */

#ifdef SMELT_HAVE_LLVM

static const RunOpts R = {.tol32 = 1e-5, .tol16 = 2e-3};

static void build_elementwise(TG *t) {
  int x = tg_input(t, "x", DT_F64, 2, (const int64_t[]){5, 67}, DOM_ANY, 0);
  tg_node(t, OP_TANH, 1, &x, "th");
  tg_node(t, OP_EXP, 1, &x, "ex");
  tg_node(t, OP_ERF, 1, &x, "ef");
  int p = tg_input(t, "p", DT_F32, 2, (const int64_t[]){3, 41}, DOM_POS, 0);
  int q = tg_input(t, "q", DT_F32, 2, (const int64_t[]){3, 41}, DOM_ANY, 0);
  tg_node(t, OP_POW, 2, (const int[]){p, q}, "pw");
  tg_node(t, OP_SIN, 1, &q, "sn");
}

static void build_matmul(TG *t) {
  int a = tg_input(t, "a", DT_F32, 2, (const int64_t[]){37, 61}, DOM_ANY, 0);
  int w = tg_const(t, "w", DT_F32, 2, (const int64_t[]){61, 45}, DOM_ANY);
  tg_node(t, OP_MATMUL, 2, (const int[]){a, w}, "y");
}

static void build_reduce(TG *t) {
  int x = tg_input(t, "x", DT_F32, 2, (const int64_t[]){7, 300}, DOM_WIDE, 0);
  int n = tg_node(t, OP_SOFTMAX, 1, &x, "sm");
  ir_set_attr_int(t->g, n, "axis", -1);
  int z = tg_input(t, "z", DT_F32, 3, (const int64_t[]){5, 6, 19}, DOM_ANY, 0);
  n = tg_node(t, OP_SUM, 1, &z, "s");
  ir_set_attr_ints(t->g, n, "axes", (const int64_t[]){1}, 1);
}

/* Buffers for every value, with guards (as the harness makes them). */
static Buf *alloc_bufs(const Graph *g, void *const *inputs, const TG *t) {
  Buf *bufs = calloc((size_t)g->nval, sizeof *bufs);
  for (int v = 0; v < g->nval; v++) {
    const Value *val = &g->val[v];
    if (val->type.dt == DT_INVALID || val->kind == VK_DEAD) continue;
    size_t bytes = ir_type_bytes(&val->type);
    bufs[v].bytes = bytes;
    bufs[v].mem = malloc(bytes + 2 * GUARD);
    memset(bufs[v].mem, GUARD_BYTE, bytes + 2 * GUARD);
    memset(buf_data(&bufs[v]), 0xCD, bytes);
    if (val->kind == VK_CONST && val->data) memcpy(buf_data(&bufs[v]), val->data, bytes);
  }
  for (int i = 0; i < t->nin; i++) memcpy(buf_data(&bufs[t->in[i].value]), inputs[i], bufs[t->in[i].value].bytes);
  return bufs;
}

/* Runs every kernel in order, each as three uneven task ranges. */
static void run_kernels(const Kernel *ks, int nk, void *const *fns, Buf *bufs) {
  for (int i = 0; i < nk; i++) {
    void *args[256];
    for (int a = 0; a < ks[i].nargs; a++) args[a] = buf_data(&bufs[ks[i].args[a]]);
    CgKernelFn kf;
    memcpy(&kf, &fns[i], sizeof kf);
    int64_t n = ks[i].ntasks, s1 = n / 5, s2 = s1 + (n - s1) * 3 / 4;
    kf(args, s1, s2);
    kf(args, s2, n);
    kf(args, 0, s1);
  }
}

/* Builds the graph with build, compiles it, and runs it through rt_elf_load
 * and through the ORC JIT; checks both against the interpreter and against
 * each other.  The object is returned in *out_obj (malloc'd) for the
 * mutation tests, or freed when out_obj is NULL. */
static void check_kernels(void (*build)(TG *), const char *label, uint64_t seed, void **out_obj, size_t *out_len) {
  /* first the harness's own run (JIT against the interpreter) */
  TG t;
  tg_init(&t, label, seed);
  build(&t);
  tg_run(&t, &R);

  tg_init(&t, label, seed);
  build(&t);
  Graph *g = t.g;
  Kernel *ks = NULL;
  int nk = 0;
  void *obj = NULL;
  size_t len = 0;
  char *desc = NULL;
  CgJit *jit = NULL;
  RtElfImage *img = NULL;
  Interp *it = NULL;
  Buf *be = NULL, *bj = NULL;
  void **inputs = calloc((size_t)t.nin + 1, sizeof *inputs);
  void **fe = NULL, **fj = NULL;
  smelt_status st = NULL;
  for (int i = 0; i < g->nnode && !st; i++) {
    ir_fill_default_attrs(g, i);
    st = ir_infer_node(g, i);
  }
  if (st) goto fail;
  int *uses = ir_use_counts(g);
  for (int i = 0; i < g->nnode; i++)
    for (int j = 0; j < g->node[i].nout; j++)
      if (!uses[g->node[i].out[j]]) ir_add_output(g, g->node[i].out[j]);
  free(uses);
  if ((st = cg_single_node_groups(g)) || (st = ir_verify(g))) goto fail;
  if ((st = ir_interp_create(g, &it))) goto fail;
  for (int i = 0; i < t.nin; i++) {
    const Value *val = &g->val[t.in[i].value];
    size_t bytes = ir_type_bytes(&val->type);
    inputs[i] = malloc(bytes ? bytes : 1);
    tg_fill(&t, val->type.dt, inputs[i], ir_type_numel(&val->type), t.in[i].dom, t.in[i].bound);
    if ((st = ir_interp_set_input(it, t.in[i].value, inputs[i]))) goto fail;
  }
  if ((st = ir_interp_run(it))) goto fail;
  if ((st = cg_lower(g, &ks, &nk))) goto fail;
  if ((st = cg_llvm_compile(g, ks, nk, NULL, &obj, &len, &desc))) goto fail;

  int nimp = 0;
  const RtElfImport *imp = rt_elf_default_imports(&nimp);
  if ((st = rt_elf_load(obj, len, imp, nimp, &img))) goto fail;
  if ((st = cg_jit_create(obj, len, &jit))) goto fail;
  fe = calloc((size_t)nk + 1, sizeof *fe);
  fj = calloc((size_t)nk + 1, sizeof *fj);
  for (int i = 0; i < nk; i++) {
    fe[i] = rt_elf_lookup(img, ks[i].name);
    if (!fe[i]) {
      st = st_error(ST_INTERNAL, "the loaded image has no kernel '%s'", ks[i].name);
      goto fail;
    }
    if ((st = cg_jit_find(jit, ks[i].name, &fj[i]))) goto fail;
  }
  /* the packed weights, filled once before the kernels run: through the
   * loader's symbols as runtime/loader.c does, and through the JIT */
  int npacked = 0, npacked_jit = 0;
  for (int i = 0; i < nk; i++) {
    char pname[sizeof ks[i].name + 16];
    snprintf(pname, sizeof pname, "%s" CG_PREPACK_SUFFIX, ks[i].name);
    void *sym = rt_elf_lookup(img, pname);
    if (!sym) continue;
    void *args[256] = {0};
    for (int a = 0; a < ks[i].nargs; a++)
      if (g->val[ks[i].args[a]].kind == VK_CONST) args[a] = g->val[ks[i].args[a]].data;
    CgPrepackFn pf;
    memcpy(&pf, &sym, sizeof pf);
    pf(args);
    npacked++;
  }
  if ((st = cg_jit_prepack(jit, g, ks, nk, &npacked_jit))) goto fail;
  CHECK(npacked == npacked_jit);
  CHECK(rt_elf_symbol_count(img) == nk + npacked);
  RtElfLayout l;
  rt_elf_layout(img, &l);
  check_maps(&l, label);

  be = alloc_bufs(g, inputs, &t);
  bj = alloc_bufs(g, inputs, &t);
  run_kernels(ks, nk, fe, be);
  run_kernels(ks, nk, fj, bj);
  for (int i = 0; i < nk; i++)
    for (int a = ks[i].nargs - ks[i].nouts; a < ks[i].nargs; a++) {
      int v = ks[i].args[a];
      const void *want = ir_interp_value(it, v);
      CHECK(want != NULL);
      if (want && !compare_value(&t, v, buf_data(&be[v]), want, R.tol32, R.tol16)) check_failures++;
      if (memcmp(buf_data(&be[v]), buf_data(&bj[v]), be[v].bytes) != 0) {
        fprintf(stderr, "%s: '%s' differs between rt_elf_load and the JIT\n", label, g->val[v].name);
        check_failures++;
      }
    }
  for (int v = 0; v < g->nval; v++)
    if (be[v].mem && !buf_guards_ok(&be[v])) {
      fprintf(stderr, "%s: a guard region around '%s' was overwritten\n", label, g->val[v].name);
      check_failures++;
    }
  printf("test_elf_loader: %s: %d kernel(s), %zu-byte object, image %zu bytes (text %zu, rodata %zu)\n", label, nk,
         len, l.size, l.text_size, l.rodata_size);
  goto done;
fail:
  fprintf(stderr, "%s: %s\n", label, st ? st_message(st) : "failed");
  st_free(st);
  check_failures++;
done:
  free_bufs(be, g->nval);
  free_bufs(bj, g->nval);
  for (int i = 0; i < t.nin; i++) free(inputs[i]);
  free(inputs);
  free(fe);
  free(fj);
  rt_elf_free(img);
  cg_jit_destroy(jit);
  ir_interp_destroy(it);
  free(desc);
  cg_kernels_free(ks, nk);
  ir_graph_destroy(g);
  if (out_obj) {
    *out_obj = obj;
    *out_len = len;
  } else {
    free(obj);
  }
}

/* The little-endian e_shoff of an object (for aiming the fuzzer). */
static size_t obj_shoff(const uint8_t *b, size_t len) {
  if (len < 64) return len;
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | b[40 + i];
  return v < len ? (size_t)v : len;
}

static void test_real_objects(void) {
  void *obj = NULL;
  size_t len = 0;
  check_kernels(build_elementwise, "elementwise (libm calls)", 31, &obj, &len);
  check_kernels(build_matmul, "matmul", 32, NULL, NULL);
  check_kernels(build_reduce, "softmax and sum", 33, NULL, NULL);
  if (!obj) return;

  /* undefined symbols: every missing one is named */
  RtElfImage *img = NULL;
  expect_error(rt_elf_load(obj, len, NULL, 0, &img), ST_INVALID_INPUT, "not in the import table", "tanh",
               "empty import table");
  expect_error(rt_elf_load(obj, len, NULL, 0, &img), ST_INVALID_INPUT, "erf", "powf", "empty import table");
  int nimp = 0;
  const RtElfImport *imp = rt_elf_default_imports(&nimp);
  RtElfImport *partial = malloc((size_t)nimp * sizeof *partial);
  int np = 0;
  for (int i = 0; i < nimp; i++)
    if (strcmp(imp[i].name, "tanh") != 0) partial[np++] = imp[i];
  smelt_status st = rt_elf_load(obj, len, partial, np, &img);
  CHECK(st && strstr(st_message(st), "tanh") && !strstr(st_message(st), "powf"));
  st_free(st);
  free(partial);

  /* truncations: the section headers come last in LLVM's objects too */
  const uint8_t *b = obj;
  int loaded = 0;
  for (size_t n = 0; n < len; n += n + 200 < len ? 1 + len / 400 : 1) {
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, b, n);
    st = rt_elf_load(copy, n, imp, nimp, &img);
    if (!st) loaded++;
    st_free(st);
    rt_elf_free(img);
    img = NULL;
    free(copy);
  }
  CHECK(loaded == 0);
  fuzz(b, len, obj_shoff(b, len), imp, nimp, 3000, 77, "LLVM object");
  free(obj);
}

/* Our detection against LLVM's, for the features the CPU backend's code
 * generation depends on; the rest only reported. */
static void test_host_vs_llvm(void) {
  TG t;
  tg_init(&t, "host features", 5);
  int x = tg_input(&t, "x", DT_F32, 1, (const int64_t[]){8}, DOM_ANY, 0);
  tg_node(&t, OP_NEG, 1, &x, "y");
  Graph *g = t.g;
  Kernel *ks = NULL;
  int nk = 0;
  void *obj = NULL;
  size_t len = 0;
  char *desc = NULL;
  smelt_status st = NULL;
  for (int i = 0; i < g->nnode && !st; i++) {
    ir_fill_default_attrs(g, i);
    st = ir_infer_node(g, i);
  }
  if (!st) {
    ir_add_output(g, tg_val(&t, 0));
    st = cg_single_node_groups(g);
  }
  if (!st) st = cg_lower(g, &ks, &nk);
  if (!st) st = cg_llvm_compile(g, ks, nk, NULL, &obj, &len, &desc);
  CHECK_OK(st);
  const char *f = desc ? strstr(desc, "features=") : NULL;
  if (f) {
    static const char *const core[] = {"sse2",     "sse3",     "ssse3",    "sse4.1",   "sse4.2",   "popcnt",
                                       "avx",      "avx2",     "fma",      "f16c",     "bmi",      "bmi2",
                                       "lzcnt",    "movbe",    "avx512f",  "avx512bw", "avx512dq", "avx512vl",
                                       "avx512cd", "avx512vnni", "avx512bf16", "avx512fp16", "amx-tile", "xsave"};
    char list[64];
    int agree = 0, other = 0;
    for (const char *p = f + 9; *p;) {
      size_t n = strcspn(p, ",");
      if (n > 1 && n < sizeof list && (*p == '+' || *p == '-')) {
        memcpy(list, p + 1, n - 1);
        list[n - 1] = '\0';
        if (rt_cpu_feature_known(list)) {
          char one[80];
          snprintf(one, sizeof one, "+%s", list);
          bool ours = rt_cpu_has_all(one, NULL), llvms = *p == '+';
          bool is_core = false;
          for (size_t c = 0; c < sizeof core / sizeof core[0]; c++) is_core |= strcmp(core[c], list) == 0;
          if (ours == llvms) agree++;
          else if (is_core) {
            fprintf(stderr, "host features: LLVM says %c%s, cpuid here says %s\n", *p, list, ours ? "yes" : "no");
            check_failures++;
          } else {
            printf("test_elf_loader: note: LLVM says %c%s, cpuid here says %s\n", *p, list, ours ? "yes" : "no");
            other++;
          }
        }
      }
      p += n;
      if (*p == ',') p++;
    }
    printf("test_elf_loader: host features agree with LLVM's on %d known features (%d others differ)\n", agree, other);
    CHECK(agree > 20);
  }
  free(obj);
  free(desc);
  cg_kernels_free(ks, nk);
  ir_graph_destroy(g);
}

#endif

/* ---- CPU features ---- */

static void test_cpu_features(void) {
  expect_error(rt_cpu_check_features("+avx2,+fma,+avx512f,+avx512bw", "sse2,avx2,fma", "cpu=skylake-avx512"),
               ST_UNSUPPORTED, "avx512f, avx512bw", "(built for cpu=skylake-avx512)", "missing features");
  smelt_status st = rt_cpu_check_features("+avx2,+fma,+avx512f,+avx512bw", "sse2,avx2,fma", NULL);
  CHECK(st && !strstr(st_message(st), "fma") && !strstr(st_message(st), "avx2"));
  st_free(st);
  CHECK_OK(rt_cpu_check_features("+avx2,+fma,+avx512f,+avx512bw", "+sse2,+avx2,+fma,+avx512f,+avx512bw", NULL));
  /* '-' entries and names the table does not know are not checked */
  CHECK_OK(rt_cpu_check_features("+avx2,-avx512f,+fast-gather,+prefer-256-bit, -amx-tile", "avx2", "x"));
  CHECK_OK(rt_cpu_check_features("", "", NULL));
  CHECK_OK(rt_cpu_check_features(NULL, "", NULL));
  /* a feature named twice is listed once; bare names count as '+' */
  st = rt_cpu_check_features("avx512f,+avx512f, +sha ", "avx2,-avx512f", NULL);
  CHECK(st && strstr(st_message(st), "lacks avx512f, sha,"));
  if (st) CHECK(strstr(strstr(st_message(st), "avx512f") + 1, "avx512f") == NULL);
  st_free(st);
  CHECK(rt_cpu_has_all("+avx2,+fma", "avx2,fma,sse2"));
  CHECK(!rt_cpu_has_all("+avx2,+fma,+avx512f", "avx2,fma,sse2"));
  CHECK(rt_cpu_has_all(NULL, "sse2"));
  CHECK(rt_cpu_has_all("+crc32", "sse4.2")); /* LLVM's split of one cpuid bit */
  CHECK(rt_cpu_feature_known("avx512f") && rt_cpu_feature_known("sse4.1") && rt_cpu_feature_known("amx-tile"));
  CHECK(!rt_cpu_feature_known("fast-gather") && !rt_cpu_feature_known("") && !rt_cpu_feature_known(NULL));
  CHECK(!rt_cpu_feature_known("+avx2"));

  /* the psABI levels: cumulative, every name known */
  const char *lv[] = {"x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"};
  for (int i = 0; i < 4; i++) {
    const char *f = rt_cpu_level_features(lv[i]);
    CHECK(f != NULL);
    if (!f) continue;
    CHECK(strstr(f, "+sse2") != NULL);
    if (i > 0) CHECK(strstr(f, rt_cpu_level_features(lv[i - 1])) == f);
    for (const char *p = f; *p;) {
      size_t n = strcspn(p, ",");
      char name[32] = "";
      if (n > 1 && n < sizeof name) memcpy(name, p + 1, n - 1);
      if (!rt_cpu_feature_known(name)) {
        fprintf(stderr, "level %s: unknown feature '%s'\n", lv[i], name);
        check_failures++;
      }
      p += n;
      if (*p) p++;
    }
  }
  CHECK(strstr(rt_cpu_level_features("x86-64-v2"), "+sse4.2") && strstr(rt_cpu_level_features("x86-64-v2"), "+cx16"));
  CHECK(strstr(rt_cpu_level_features("x86-64-v3"), "+avx2") && strstr(rt_cpu_level_features("x86-64-v3"), "+movbe"));
  CHECK(!strstr(rt_cpu_level_features("x86-64-v3"), "avx512"));
  CHECK(strstr(rt_cpu_level_features("x86-64-v4"), "+avx512vl") != NULL);
  CHECK(rt_cpu_level_features("x86-64-v5") == NULL && rt_cpu_level_features(NULL) == NULL);
  CHECK(rt_cpu_has_all(rt_cpu_level_features("x86-64-v4"), "avx512f,avx512bw,avx512cd,avx512dq,avx512vl,avx,avx2,"
                                                            "bmi,bmi2,f16c,fma,lzcnt,movbe,xsave,cx16,popcnt,sahf,"
                                                            "sse3,sse4.1,sse4.2,ssse3,cmov,cx8,fxsr,mmx,sse,sse2,x87"));

  /* the host */
  char buf[2048];
  rt_cpu_host_features(buf, sizeof buf);
  printf("test_elf_loader: host features %s\n", buf);
#if defined(__x86_64__)
  CHECK(strstr(buf, "+sse2") != NULL);
  CHECK(rt_cpu_has_all("+sse,+sse2,+fxsr,+64bit", NULL));
  CHECK_OK(rt_cpu_check_features(rt_cpu_level_features("x86-64"), NULL, NULL));
#endif
  char small[12];
  rt_cpu_host_features(small, sizeof small);
  CHECK(strlen(small) < sizeof small && (!small[0] || small[strlen(small) - 1] != ','));
  CHECK(strncmp(buf, small, strlen(small)) == 0);
  rt_cpu_host_features(small, 1);
  CHECK(small[0] == '\0');

  /* the override variable */
  setenv("SMELT_FAKE_CPU_FEATURES", "sse2,avx2", 1);
  CHECK(rt_cpu_host_override() && strcmp(rt_cpu_host_override(), "sse2,avx2") == 0);
  CHECK(!rt_cpu_has_all("+fma", rt_cpu_host_override()));
  setenv("SMELT_FAKE_CPU_FEATURES", "", 1);
  CHECK(rt_cpu_host_override() == NULL);
  unsetenv("SMELT_FAKE_CPU_FEATURES");
  CHECK(rt_cpu_host_override() == NULL);
}

static void test_default_imports(void) {
  int n = 0;
  const RtElfImport *imp = rt_elf_default_imports(&n);
  CHECK(n > 20);
  const char *must[] = {"memcpy", "memmove", "memset", "expf", "exp", "logf", "log", "powf", "pow", "sinf",
                        "cosf",   "sin",     "cos",    "tanh", "tanhf", "erf", "erff", "sincos", "sincosf", "fmaf"};
  for (size_t k = 0; k < sizeof must / sizeof must[0]; k++) {
    bool found = false;
    for (int i = 0; i < n; i++) found |= strcmp(imp[i].name, must[k]) == 0 && imp[i].addr;
    if (!found) {
      fprintf(stderr, "default imports: no %s\n", must[k]);
      check_failures++;
    }
  }
}

int main(void) {
  test_cpu_features();
  test_default_imports();
  test_mini_load();
  test_mini_relro();
  test_mini_broken();
  Mini m;
  mini_build(&m);
  fuzz(m.b, m.len, m.shoff, mini_imports, 2, 3000, 99, "hand-made object");
#ifdef SMELT_HAVE_LLVM
  test_real_objects();
  test_host_vs_llvm();
#else
  check_skip_part("llvm", "test_elf_loader: the LLVM-compiled kernels (built without SMELT_LLVM)");
#endif
  return check_done("test_elf_loader");
}
