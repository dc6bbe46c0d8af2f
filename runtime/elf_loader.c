/* A loader for ELF64 x86-64 relocatable objects, in the spirit of IREE's
 * embedded-ELF loader but for ET_REL: it does in memory what a static
 * linker and a dynamic loader do together, for one object.
 *
 * The algorithm, in the order rt_elf_load runs it:
 *   1. check the file header and the section header table (inside the
 *      file, overflow-checked), then every section: its bytes inside the
 *      file (NOBITS excepted), its sh_link/sh_info indices, its alignment
 *      (a power of two no larger than a page), its name in .shstrtab;
 *   2. classify the allocatable sections into three parts: text
 *      (SHF_EXECINSTR), read-only data (.rodata, .rodata.cst*, .rodata.str*,
 *      and .data.rel.ro, which only relocations write) and writable data
 *      (.data, .bss).  .eh_frame is skipped with its
 *      .rela.eh_frame: nothing unwinds through a kernel (no C++ exceptions,
 *      no longjmp across them), so its only use would be a debugger's
 *      backtrace.  Non-allocatable sections (.comment, .note.GNU-stack,
 *      .llvm_addrsig, debug info) and notes are skipped too;
 *   3. check the symbol table (entry size, bounds, names in a NUL-terminated
 *      string table, section indices; COMMON, TLS and IFUNC symbols are
 *      refused) and resolve every undefined symbol in the import table,
 *      listing every name that is missing;
 *   4. check every relocation that applies to a loaded section (type, symbol
 *      index, r_offset + width inside the section) and give each symbol a
 *      GOT slot if a GOT-relative relocation names it, and a jump stub if a
 *      call or PC-relative reference names an import: an import such as
 *      expf may lie more than 2 GiB from the image, out of reach of a 32-bit
 *      displacement, so the reference goes to a stub `jmp *slot(%rip)`
 *      inside the image instead, whose GOT slot holds the full address;
 *   5. lay the parts out page-aligned in one anonymous mapping (text + stubs,
 *      rodata + GOT, data), each section at its alignment, the total capped
 *      at RT_ELF_MAX_IMAGE_BYTES so that every displacement inside the
 *      image fits 32 bits;
 *   6. with the pages read+write: copy the sections, fill the GOT and the
 *      stubs, apply the relocations (range-checked), and only then
 *      mprotect text to read+execute and rodata to read-only.  W^X holds:
 *      no page is writable and executable at once.  x86 keeps instruction
 *      fetch coherent with stores, so no cache flush is needed.
 * Steps 1 to 4 are portable C that reads the file byte by byte in little
 * endian (no alignment or host byte order is assumed); steps 5 and 6 run
 * only on x86-64.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */

#include "runtime/elf_loader.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- ELF64 records and constants (the subset this loader reads) ---- */

enum {
  EHDR_SIZE = 64,
  SHDR_SIZE = 64,
  SYM_SIZE = 24,
  RELA_SIZE = 24,
  ELFCLASS64 = 2,
  ELFDATA2LSB = 1,
  EV_CURRENT = 1,
  ELFOSABI_NONE = 0,
  ELFOSABI_GNU = 3,
  ET_REL = 1,
  EM_X86_64 = 62,
};

enum {
  SHT_NULL = 0,
  SHT_PROGBITS = 1,
  SHT_SYMTAB = 2,
  SHT_STRTAB = 3,
  SHT_RELA = 4,
  SHT_NOTE = 7,
  SHT_NOBITS = 8,
  SHT_REL = 9,
  SHT_INIT_ARRAY = 14,
  SHT_FINI_ARRAY = 15,
  SHT_PREINIT_ARRAY = 16,
  SHT_SYMTAB_SHNDX = 18,
};
#define SHT_X86_64_UNWIND 0x70000001u

#define SHF_WRITE 0x1u
#define SHF_ALLOC 0x2u
#define SHF_EXECINSTR 0x4u
#define SHF_INFO_LINK 0x40u
#define SHF_TLS 0x400u

enum {
  SHN_UNDEF = 0,
  SHN_LORESERVE = 0xff00,
  SHN_ABS = 0xfff1,
  SHN_COMMON = 0xfff2,
  SHN_XINDEX = 0xffff,
};

enum { STB_LOCAL = 0, STB_GLOBAL = 1, STB_WEAK = 2 };
enum { STT_FUNC = 2, STT_COMMON = 5, STT_TLS = 6, STT_GNU_IFUNC = 10 };

enum {
  R_X86_64_NONE = 0,
  R_X86_64_64 = 1,
  R_X86_64_PC32 = 2,
  R_X86_64_PLT32 = 4,
  R_X86_64_GOTPCREL = 9,
  R_X86_64_32 = 10,
  R_X86_64_32S = 11,
  R_X86_64_PC64 = 24,
  R_X86_64_GOTPCRELX = 41,
  R_X86_64_REX_GOTPCRELX = 42,
};

typedef struct {
  uint32_t name, type;
  uint64_t flags, addr, offset, size;
  uint32_t link, info;
  uint64_t addralign, entsize;
} Shdr;

typedef struct {
  uint32_t name;
  uint8_t info, other;
  uint16_t shndx;
  uint64_t value, size;
} Sym;

typedef struct {
  uint64_t offset;
  uint32_t sym, type;
  int64_t addend;
} Rela;

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (unsigned)p[1] << 8); }
static uint32_t rd32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* ---- the object being loaded ---- */

enum { PART_NONE = -1, PART_TEXT, PART_RODATA, PART_DATA, NPARTS };
static const char *const part_names[NPARTS] = {"text", "rodata", "data"};

enum { STUB_BYTES = 16 };   /* jmp *disp32(%rip), then int3 padding */
enum { GOT_SLOT_BYTES = 8 };

typedef struct {
  const uint8_t *b;
  size_t len;
  int shnum, shstrndx;
  Shdr *sh;
  int *part;       /* per section: PART_*, or PART_NONE when not loaded */
  uint64_t *place; /* per loaded section: offset inside its part */
  int symtab;      /* section index of .symtab, 0 if none */
  size_t nsym;
  const uint8_t *syms; /* nsym * SYM_SIZE bytes */
  const char *str;     /* the symbol string table, NUL-terminated */
  uint64_t strsz;
  void **import; /* per symbol: the import's address (undefined symbols) */
  int32_t *got;  /* per symbol: GOT slot, or -1 */
  int32_t *stub; /* per symbol: stub, or -1 */
  int32_t ngot, nstub;
  uint64_t part_size[NPARTS]; /* bytes used, before page rounding */
  uint64_t part_off[NPARTS];  /* page-aligned offset of each part in the image */
  uint64_t got_off, stub_off; /* inside rodata and text */
  uint64_t image_size;
  size_t page;
  uint8_t *base; /* the mapping, once made */
} Obj;

struct RtElfImage {
  uint8_t *base;
  size_t size;
  uint64_t part_off[NPARTS], part_len[NPARTS]; /* page-rounded */
  int nexport;
  const char **export_name; /* sorted */
  void **export_addr;
  char *names; /* the export names, one block */
};

static smelt_status obj_err(StatusCode code, const char *fmt, ...) SMELT_PRINTF(2, 3);
static smelt_status obj_err(StatusCode code, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return st_error(code, "kernel object: %s", msg);
}
#define BAD(...) obj_err(ST_INVALID_INPUT, __VA_ARGS__)
#define UNSUP(...) obj_err(ST_UNSUPPORTED, __VA_ARGS__)

/* a + b <= limit, without overflow */
static bool fits(uint64_t a, uint64_t b, uint64_t limit) { return a <= limit && b <= limit - a; }

static bool is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

static const char *sec_name(const Obj *o, int i) {
  if (i <= 0 || i >= o->shnum || !o->shstrndx) return "?";
  return (const char *)o->b + o->sh[o->shstrndx].offset + o->sh[i].name;
}

static Sym read_sym(const Obj *o, size_t i) {
  const uint8_t *p = o->syms + i * SYM_SIZE;
  Sym s = {rd32(p), p[4], p[5], rd16(p + 6), rd64(p + 8), rd64(p + 16)};
  return s;
}

static const char *sym_name(const Obj *o, const Sym *s) { return o->str + s->name; }

/* A string table is usable when it lies in the file and ends with NUL: then
 * every offset below its size names a terminated string. */
static smelt_status check_strtab(const Obj *o, int i, const char *what) {
  const Shdr *s = &o->sh[i];
  if (s->type != SHT_STRTAB) return BAD("%s (section %d) is not a string table (type %u)", what, i, s->type);
  if (s->size == 0 || o->b[s->offset + s->size - 1] != '\0')
    return BAD("%s (section %d) is empty or does not end with NUL", what, i);
  return NULL;
}

/* ---- step 1: headers and sections ---- */

static smelt_status check_header(Obj *o, uint64_t *out_shoff) {
  const uint8_t *b = o->b;
  if (o->len < EHDR_SIZE) return BAD("%zu bytes is too short for an ELF header (64 bytes)", o->len);
  if (b[0] != 0x7f || b[1] != 'E' || b[2] != 'L' || b[3] != 'F') return BAD("not an ELF file (bad magic)");
  if (b[4] != ELFCLASS64) return BAD("ELF class %u, not ELFCLASS64", b[4]);
  if (b[5] != ELFDATA2LSB) return BAD("ELF data encoding %u, not little-endian", b[5]);
  if (b[6] != EV_CURRENT || rd32(b + 20) != EV_CURRENT) return BAD("ELF version %u/%u, not 1", b[6], rd32(b + 20));
  if (b[7] != ELFOSABI_NONE && b[7] != ELFOSABI_GNU) return BAD("OS ABI %u, not System V or GNU", b[7]);
  if (rd16(b + 18) != EM_X86_64) return BAD("machine %u, not x86-64 (62)", rd16(b + 18));
  if (rd16(b + 16) != ET_REL) return BAD("ELF type %u, not a relocatable object (ET_REL)", rd16(b + 16));
  if (rd16(b + 52) != EHDR_SIZE) return BAD("ELF header size %u, not 64", rd16(b + 52));
  uint64_t shoff = rd64(b + 40);
  unsigned shentsize = rd16(b + 58), shnum = rd16(b + 60), shstrndx = rd16(b + 62);
  if (shentsize != SHDR_SIZE) return BAD("section header size %u, not 64", shentsize);
  if (shnum == 0)
    return shoff ? UNSUP("extended section numbering (more than 65279 sections)") : BAD("no section headers");
  if (shstrndx == SHN_XINDEX) return UNSUP("extended section name table index");
  if (shstrndx == SHN_UNDEF || shstrndx >= shnum)
    return BAD("section name table index %u is not a section (there are %u)", shstrndx, shnum);
  if (!fits(shoff, (uint64_t)shnum * SHDR_SIZE, o->len))
    return BAD("section header table (offset 0x%llx, %u entries) lies past the end of the file (%zu bytes)",
               (unsigned long long)shoff, shnum, o->len);
  o->shnum = (int)shnum;
  o->shstrndx = (int)shstrndx;
  *out_shoff = shoff;
  return NULL;
}

static smelt_status read_sections(Obj *o, uint64_t shoff) {
  o->sh = calloc((size_t)o->shnum, sizeof *o->sh);
  o->part = malloc((size_t)o->shnum * sizeof *o->part);
  o->place = calloc((size_t)o->shnum, sizeof *o->place);
  if (!o->sh || !o->part || !o->place) return st_error(ST_NO_MEMORY, "out of memory reading a kernel object");
  for (int i = 0; i < o->shnum; i++) {
    const uint8_t *p = o->b + shoff + (uint64_t)i * SHDR_SIZE;
    Shdr *s = &o->sh[i];
    *s = (Shdr){rd32(p),      rd32(p + 4),  rd64(p + 8),  rd64(p + 16), rd64(p + 24),
                rd64(p + 32), rd32(p + 40), rd32(p + 44), rd64(p + 48), rd64(p + 56)};
    o->part[i] = PART_NONE;
    if (i == 0) {
      if (s->type != SHT_NULL) return BAD("section 0 is not SHT_NULL (type %u)", s->type);
      continue;
    }
    if (s->type != SHT_NOBITS && s->type != SHT_NULL && !fits(s->offset, s->size, o->len))
      return BAD("section %d: offset 0x%llx + size 0x%llx lies past the end of the file (%zu bytes)", i,
                 (unsigned long long)s->offset, (unsigned long long)s->size, o->len);
    if (s->link >= (uint32_t)o->shnum)
      return BAD("section %d: sh_link %u is not a section (there are %d)", i, s->link, o->shnum);
    bool info_is_index = s->type == SHT_RELA || s->type == SHT_REL || (s->flags & SHF_INFO_LINK);
    if (info_is_index && s->info >= (uint32_t)o->shnum)
      return BAD("section %d: sh_info %u is not a section (there are %d)", i, s->info, o->shnum);
    if (s->addralign > 1 && !is_pow2(s->addralign))
      return BAD("section %d: alignment %llu is not a power of two", i, (unsigned long long)s->addralign);
  }
  RETURN_IF_ERROR(check_strtab(o, o->shstrndx, "the section name table"));
  for (int i = 1; i < o->shnum; i++)
    if (o->sh[i].name >= o->sh[o->shstrndx].size)
      return BAD("section %d: name offset %u lies outside the section name table", i, o->sh[i].name);
  return NULL;
}

/* ---- step 2: which sections are loaded, and where ---- */

static bool has_prefix(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

static smelt_status classify_sections(Obj *o) {
  for (int i = 1; i < o->shnum; i++) {
    const Shdr *s = &o->sh[i];
    const char *name = sec_name(o, i);
    if (!(s->flags & SHF_ALLOC)) continue;
    if (s->flags & SHF_TLS) return UNSUP("section '%.80s' holds thread-local storage", name);
    if (s->type == SHT_INIT_ARRAY || s->type == SHT_FINI_ARRAY || s->type == SHT_PREINIT_ARRAY ||
        has_prefix(name, ".init_array") || has_prefix(name, ".fini_array") || has_prefix(name, ".preinit_array") ||
        has_prefix(name, ".ctors") || has_prefix(name, ".dtors"))
      return UNSUP("section '%.80s' lists constructors or destructors, which this loader does not run", name);
    /* see the top of the file: unwind tables are not needed */
    if (s->type == SHT_X86_64_UNWIND || strcmp(name, ".eh_frame") == 0 || s->type == SHT_NOTE) continue;
    if (s->type != SHT_PROGBITS && s->type != SHT_NOBITS)
      return UNSUP("allocatable section '%.80s' has type 0x%x, which this loader does not handle", name, s->type);
    if ((s->flags & SHF_EXECINSTR) && (s->flags & SHF_WRITE))
      return UNSUP("section '%.80s' is both writable and executable", name);
    if (s->addralign > o->page)
      return UNSUP("section '%.80s' asks for %llu-byte alignment, more than a page (%zu)", name,
                   (unsigned long long)s->addralign, o->page);
    /* .data.rel.ro is written only by relocations, which are done before
     * the pages are protected: it can be read-only like .rodata */
    bool relro = has_prefix(name, ".data.rel.ro");
    o->part[i] = (s->flags & SHF_EXECINSTR)            ? PART_TEXT
                 : (s->flags & SHF_WRITE) && !relro ? PART_DATA
                                                    : PART_RODATA;
  }
  return NULL;
}

/* ---- step 3: symbols ---- */

static smelt_status read_symtab(Obj *o) {
  for (int i = 1; i < o->shnum; i++) {
    if (o->sh[i].type == SHT_SYMTAB_SHNDX) return UNSUP("extended symbol section indices (SHT_SYMTAB_SHNDX)");
    if (o->sh[i].type != SHT_SYMTAB) continue;
    if (o->symtab) return BAD("more than one symbol table (sections %d and %d)", o->symtab, i);
    o->symtab = i;
  }
  if (!o->symtab) return NULL; /* no symbols: nothing exported, no relocations possible */
  const Shdr *s = &o->sh[o->symtab];
  if (s->entsize != SYM_SIZE) return BAD("symbol table entry size %llu, not 24", (unsigned long long)s->entsize);
  if (s->size % SYM_SIZE) return BAD("symbol table size %llu is not a multiple of 24", (unsigned long long)s->size);
  RETURN_IF_ERROR(check_strtab(o, (int)s->link, "the symbol string table"));
  if (s->size / SYM_SIZE > ((uint64_t)1 << 24))
    return UNSUP("%llu symbols, more than this loader takes", (unsigned long long)(s->size / SYM_SIZE));
  o->nsym = (size_t)(s->size / SYM_SIZE); /* so GOT and stub numbers fit int32_t */
  if (s->info > o->nsym) return BAD("symbol table: first global %u is past its %zu symbols", s->info, o->nsym);
  o->syms = o->b + s->offset;
  o->str = (const char *)o->b + o->sh[s->link].offset;
  o->strsz = o->sh[s->link].size;
  o->import = calloc(o->nsym ? o->nsym : 1, sizeof *o->import);
  o->got = malloc((o->nsym ? o->nsym : 1) * sizeof *o->got);
  o->stub = malloc((o->nsym ? o->nsym : 1) * sizeof *o->stub);
  if (!o->import || !o->got || !o->stub) return st_error(ST_NO_MEMORY, "out of memory reading a kernel object");
  for (size_t i = 0; i < o->nsym; i++) o->got[i] = o->stub[i] = -1;
  return NULL;
}

static const RtElfImport *find_import(const RtElfImport *imp, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (imp[i].name && strcmp(imp[i].name, name) == 0) return &imp[i];
  return NULL;
}

/* Appends ", name" (or "name") to buf while it fits. */
static void list_append(char *buf, size_t cap, const char *name) {
  size_t used = strlen(buf);
  if (used + 1 >= cap) return;
  snprintf(buf + used, cap - used, "%s%.80s", used ? ", " : "", name);
}

static smelt_status check_symbols(Obj *o, const RtElfImport *imports, int nimports) {
  char missing[512] = "";
  int nmissing = 0;
  for (size_t i = 1; i < o->nsym; i++) {
    Sym s = read_sym(o, i);
    if (s.name >= o->strsz) return BAD("symbol %zu: name offset %u lies outside the string table", i, s.name);
    const char *name = sym_name(o, &s);
    unsigned bind = s.info >> 4, type = s.info & 0xf;
    if (bind != STB_LOCAL && bind != STB_GLOBAL && bind != STB_WEAK)
      return UNSUP("symbol '%.80s' has binding %u, which this loader does not handle", name, bind);
    if (type == STT_TLS) return UNSUP("symbol '%.80s' is thread-local", name);
    if (type == STT_GNU_IFUNC) return UNSUP("symbol '%.80s' is an indirect function (IFUNC)", name);
    if (s.shndx == SHN_COMMON || type == STT_COMMON)
      return UNSUP("symbol '%.80s' is a COMMON symbol (compile with -fno-common)", name);
    if (s.shndx == SHN_UNDEF) {
      if (!*name) return BAD("symbol %zu is undefined and has no name", i);
      const RtElfImport *imp = find_import(imports, nimports, name);
      if (imp && imp->addr) o->import[i] = imp->addr;
      else if (bind != STB_WEAK) { /* an undefined weak symbol is 0, as in any ELF link */
        if (nmissing++ < 16) list_append(missing, sizeof missing, name);
      }
      continue;
    }
    if (s.shndx == SHN_ABS) continue;
    if (s.shndx >= SHN_LORESERVE)
      return UNSUP("symbol '%.80s' has the reserved section index 0x%x", name, s.shndx);
    if (s.shndx >= o->shnum)
      return BAD("symbol '%.80s': section index %u is not a section (there are %d)", name, s.shndx, o->shnum);
    if (o->part[s.shndx] != PART_NONE && s.value > o->sh[s.shndx].size)
      return BAD("symbol '%.80s': value 0x%llx lies past the end of section '%.80s' (0x%llx bytes)", name,
                 (unsigned long long)s.value, sec_name(o, s.shndx), (unsigned long long)o->sh[s.shndx].size);
  }
  if (nmissing)
    return BAD("undefined symbol%s not in the import table: %s%s", nmissing > 1 ? "s" : "", missing,
               nmissing > 16 ? ", ..." : "");
  return NULL;
}

/* ---- steps 4 and 6: relocations ---- */

static int reloc_width(uint32_t type) {
  switch (type) {
  case R_X86_64_NONE: return 0;
  case R_X86_64_64:
  case R_X86_64_PC64: return 8;
  case R_X86_64_PC32:
  case R_X86_64_PLT32:
  case R_X86_64_32:
  case R_X86_64_32S:
  case R_X86_64_GOTPCREL:
  case R_X86_64_GOTPCRELX:
  case R_X86_64_REX_GOTPCRELX: return 4;
  default: return -1;
  }
}

static bool reloc_uses_got(uint32_t type) {
  return type == R_X86_64_GOTPCREL || type == R_X86_64_GOTPCRELX || type == R_X86_64_REX_GOTPCRELX;
}

static uint8_t *sec_addr(const Obj *o, int i) { return o->base + o->part_off[o->part[i]] + o->place[i]; }
static uint8_t *got_addr(const Obj *o, int32_t slot) {
  return o->base + o->part_off[PART_RODATA] + o->got_off + (uint64_t)slot * GOT_SLOT_BYTES;
}
static uint8_t *stub_addr(const Obj *o, int32_t stub) {
  return o->base + o->part_off[PART_TEXT] + o->stub_off + (uint64_t)stub * STUB_BYTES;
}

/* The address symbol i stands for, once the image is mapped. */
static uint64_t sym_value(const Obj *o, size_t i) {
  if (i == 0) return 0;
  Sym s = read_sym(o, i);
  if (s.shndx == SHN_UNDEF) return (uint64_t)(uintptr_t)o->import[i];
  if (s.shndx == SHN_ABS) return s.value;
  return (uint64_t)(uintptr_t)sec_addr(o, s.shndx) + s.value;
}

static smelt_status reloc_range_error(const Obj *o, int target, const Rela *r, const char *sym, int64_t v) {
  return BAD("relocation type %u at offset 0x%llx of section '%.80s' against '%.80s': value 0x%llx does not fit "
             "in 32 bits",
             r->type, (unsigned long long)r->offset, sec_name(o, target), sym, (unsigned long long)v);
}

static bool fits_i32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }

/* Writes relocation r into the mapped image. */
static smelt_status apply_reloc(const Obj *o, int target, const Rela *r) {
  Sym s = r->sym ? read_sym(o, r->sym) : (Sym){0};
  const char *name = r->sym ? sym_name(o, &s) : "";
  if (!*name && r->sym && s.shndx < o->shnum) name = sec_name(o, s.shndx); /* a section symbol */
  uint8_t *where = sec_addr(o, target) + r->offset;
  uint64_t P = (uint64_t)(uintptr_t)where, S = sym_value(o, r->sym), A = (uint64_t)r->addend;
  bool import = r->sym && s.shndx == SHN_UNDEF;
  int64_t v; /* two's complement arithmetic in uint64_t: no signed overflow */
  switch (r->type) {
  case R_X86_64_NONE: return NULL;
  case R_X86_64_64: wr64(where, S + A); return NULL;
  case R_X86_64_PC64: wr64(where, S + A - P); return NULL;
  case R_X86_64_PC32:
  case R_X86_64_PLT32:
    if (import) S = (uint64_t)(uintptr_t)stub_addr(o, o->stub[r->sym]);
    v = (int64_t)(S + A - P);
    if (!fits_i32(v)) return reloc_range_error(o, target, r, name, v);
    wr32(where, (uint32_t)v);
    return NULL;
  case R_X86_64_32:
    if (S + A > UINT32_MAX) return reloc_range_error(o, target, r, name, (int64_t)(S + A));
    wr32(where, (uint32_t)(S + A));
    return NULL;
  case R_X86_64_32S:
    v = (int64_t)(S + A);
    if (!fits_i32(v)) return reloc_range_error(o, target, r, name, v);
    wr32(where, (uint32_t)v);
    return NULL;
  default: /* the GOT-relative kinds (reloc_width refused the rest) */
    v = (int64_t)((uint64_t)(uintptr_t)got_addr(o, o->got[r->sym]) + A - P);
    if (!fits_i32(v)) return reloc_range_error(o, target, r, name, v);
    wr32(where, (uint32_t)v);
    return NULL;
  }
}

/* Checks every relocation of relocation section rs (whose target is
 * loaded); with apply false it also hands out GOT slots and stubs, with
 * apply true it writes them into the image. */
static smelt_status walk_relocs(Obj *o, int rs, bool apply) {
  const Shdr *h = &o->sh[rs];
  int target = (int)h->info;
  const Shdr *t = &o->sh[target];
  if (!o->symtab || h->link != (uint32_t)o->symtab)
    return BAD("relocation section '%.80s' does not use the symbol table (sh_link %u)", sec_name(o, rs), h->link);
  if (h->entsize != RELA_SIZE)
    return BAD("relocation section '%.80s': entry size %llu, not 24", sec_name(o, rs), (unsigned long long)h->entsize);
  if (h->size % RELA_SIZE)
    return BAD("relocation section '%.80s': size %llu is not a multiple of 24", sec_name(o, rs),
               (unsigned long long)h->size);
  if (t->type == SHT_NOBITS)
    return BAD("relocation section '%.80s' applies to '%.80s', which has no bytes (NOBITS)", sec_name(o, rs),
               sec_name(o, target));
  uint64_t n = h->size / RELA_SIZE;
  for (uint64_t k = 0; k < n; k++) {
    const uint8_t *p = o->b + h->offset + k * RELA_SIZE;
    uint64_t info = rd64(p + 8);
    Rela r = {rd64(p), (uint32_t)(info >> 32), (uint32_t)info, (int64_t)rd64(p + 16)};
    int width = reloc_width(r.type);
    if (width < 0)
      return UNSUP("relocation type %u (entry %llu of '%.80s') is not supported", r.type, (unsigned long long)k,
                   sec_name(o, rs));
    if (!fits(r.offset, (uint64_t)width, t->size))
      return BAD("relocation %llu of '%.80s': offset 0x%llx + %d bytes lies outside '%.80s' (0x%llx bytes)",
                 (unsigned long long)k, sec_name(o, rs), (unsigned long long)r.offset, width, sec_name(o, target),
                 (unsigned long long)t->size);
    if (r.sym >= o->nsym)
      return BAD("relocation %llu of '%.80s': symbol index %u is past the %zu symbols", (unsigned long long)k,
                 sec_name(o, rs), r.sym, o->nsym);
    if (r.type == R_X86_64_NONE) continue;
    Sym s = r.sym ? read_sym(o, r.sym) : (Sym){0};
    if (r.sym && s.shndx != SHN_UNDEF && s.shndx != SHN_ABS && o->part[s.shndx] == PART_NONE)
      return BAD("relocation %llu of '%.80s' refers to '%.80s' in section '%.80s', which is not loaded",
                 (unsigned long long)k, sec_name(o, rs), sym_name(o, &s), sec_name(o, s.shndx));
    if (apply) {
      RETURN_IF_ERROR(apply_reloc(o, target, &r));
      continue;
    }
    bool import = r.sym && s.shndx == SHN_UNDEF;
    bool needs_stub = import && (r.type == R_X86_64_PC32 || r.type == R_X86_64_PLT32);
    if ((reloc_uses_got(r.type) || needs_stub) && o->got[r.sym] < 0) o->got[r.sym] = o->ngot++;
    if (needs_stub && o->stub[r.sym] < 0) o->stub[r.sym] = o->nstub++;
  }
  return NULL;
}

static smelt_status walk_all_relocs(Obj *o, bool apply) {
  for (int i = 1; i < o->shnum; i++) {
    const Shdr *h = &o->sh[i];
    if (h->type != SHT_RELA && h->type != SHT_REL) continue;
    if (o->part[h->info] == PART_NONE) continue; /* .rela.eh_frame, .rela.debug_*: their targets are skipped */
    if (h->type == SHT_REL)
      return UNSUP("relocation section '%.80s' has no addends (SHT_REL); x86-64 objects use SHT_RELA", sec_name(o, i));
    RETURN_IF_ERROR(walk_relocs(o, i, apply));
  }
  return NULL;
}

/* ---- step 5: layout ---- */

static smelt_status layout(Obj *o) {
  const uint64_t max = RT_ELF_MAX_IMAGE_BYTES;
  uint64_t total = 0;
  for (int p = 0; p < NPARTS; p++) {
    uint64_t at = 0;
    for (int i = 1; i < o->shnum; i++) {
      if (o->part[i] != p) continue;
      uint64_t a = o->sh[i].addralign > 1 ? o->sh[i].addralign : 1; /* <= page, checked */
      at = align_up(at, a);
      if (!fits(at, o->sh[i].size, max))
        return UNSUP("section '%.80s' (0x%llx bytes) makes the image larger than %zu bytes", sec_name(o, i),
                     (unsigned long long)o->sh[i].size, (size_t)RT_ELF_MAX_IMAGE_BYTES);
      o->place[i] = at;
      at += o->sh[i].size;
    }
    /* the stubs after the code, the GOT after the constants */
    uint64_t extra = 0;
    if (p == PART_TEXT) {
      at = o->stub_off = align_up(at, STUB_BYTES);
      extra = (uint64_t)o->nstub * STUB_BYTES;
    } else if (p == PART_RODATA) {
      at = o->got_off = align_up(at, GOT_SLOT_BYTES);
      extra = (uint64_t)o->ngot * GOT_SLOT_BYTES;
    }
    if (!fits(at, extra, max)) return UNSUP("the image would be larger than %zu bytes", (size_t)RT_ELF_MAX_IMAGE_BYTES);
    o->part_size[p] = at + extra;
    o->part_off[p] = total;
    total += align_up(o->part_size[p], o->page);
    if (total > max) return UNSUP("the image would be larger than %zu bytes", (size_t)RT_ELF_MAX_IMAGE_BYTES);
  }
  o->image_size = total;
  return NULL;
}

/* ---- step 6: mapping ---- */

static bool host_is_x86_64(void) {
#if defined(__x86_64__)
  return true;
#else
  return false;
#endif
}

static void write_stubs(const Obj *o) {
  for (size_t i = 0; i < o->nsym; i++) {
    if (o->got[i] >= 0) wr64(got_addr(o, o->got[i]), sym_value(o, i));
    if (o->stub[i] < 0) continue;
    /* jmp *disp32(%rip): FF 25 disp32, relative to the end of the 6 bytes */
    uint8_t *st = stub_addr(o, o->stub[i]);
    int64_t disp = (int64_t)((uint64_t)(uintptr_t)got_addr(o, o->got[i]) - (uint64_t)(uintptr_t)(st + 6));
    st[0] = 0xff, st[1] = 0x25;
    wr32(st + 2, (uint32_t)disp); /* inside one image of at most 1 GiB: fits */
    memset(st + 6, 0xcc, STUB_BYTES - 6);
  }
}

static smelt_status map_and_relocate(Obj *o) {
  if (o->image_size == 0) return NULL;
  void *m = mmap(NULL, (size_t)o->image_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    return st_error(ST_NO_MEMORY, "kernel object: cannot map %llu bytes for its image (errno %d)",
                    (unsigned long long)o->image_size, errno);
  o->base = m;
  for (int i = 1; i < o->shnum; i++)
    if (o->part[i] != PART_NONE && o->sh[i].type != SHT_NOBITS && o->sh[i].size)
      memcpy(sec_addr(o, i), o->b + o->sh[i].offset, (size_t)o->sh[i].size); /* NOBITS: the mapping is zero */
  write_stubs(o);
  RETURN_IF_ERROR(walk_all_relocs(o, true));
  static const int prot[NPARTS] = {PROT_READ | PROT_EXEC, PROT_READ, PROT_READ | PROT_WRITE};
  for (int p = 0; p < NPARTS; p++) {
    size_t n = (size_t)align_up(o->part_size[p], o->page);
    if (n && mprotect(o->base + o->part_off[p], n, prot[p]) != 0)
      return st_error(ST_INTERNAL, "kernel object: mprotect of its %s pages failed (errno %d)", part_names[p], errno);
  }
  return NULL;
}

/* ---- exports ---- */

static int cmp_export(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static smelt_status collect_exports(const Obj *o, RtElfImage *img) {
  size_t n = 0, bytes = 0;
  for (size_t i = 1; i < o->nsym; i++) {
    Sym s = read_sym(o, i);
    unsigned bind = s.info >> 4, type = s.info & 0xf;
    if ((bind != STB_GLOBAL && bind != STB_WEAK) || type != STT_FUNC || !*sym_name(o, &s)) continue;
    if (s.shndx == SHN_UNDEF || s.shndx >= o->shnum || o->part[s.shndx] != PART_TEXT) continue;
    if (s.value >= o->sh[s.shndx].size) continue; /* a function must start inside its section */
    n++;
    bytes += strlen(sym_name(o, &s)) + 1; /* <= file size: no overflow */
  }
  img->export_name = malloc((n ? n : 1) * sizeof *img->export_name);
  img->export_addr = malloc((n ? n : 1) * sizeof *img->export_addr);
  img->names = malloc(bytes ? bytes : 1);
  if (!img->export_name || !img->export_addr || !img->names)
    return st_error(ST_NO_MEMORY, "out of memory loading a kernel object");
  /* pairs sorted by name: sort (name, index) then fill the addresses */
  typedef struct {
    const char *name;
    size_t sym;
  } Pair;
  Pair *pairs = malloc((n ? n : 1) * sizeof *pairs);
  if (!pairs) return st_error(ST_NO_MEMORY, "out of memory loading a kernel object");
  size_t k = 0;
  char *w = img->names;
  for (size_t i = 1; i < o->nsym; i++) {
    Sym s = read_sym(o, i);
    unsigned bind = s.info >> 4, type = s.info & 0xf;
    if ((bind != STB_GLOBAL && bind != STB_WEAK) || type != STT_FUNC || !*sym_name(o, &s)) continue;
    if (s.shndx == SHN_UNDEF || s.shndx >= o->shnum || o->part[s.shndx] != PART_TEXT) continue;
    if (s.value >= o->sh[s.shndx].size) continue;
    size_t len = strlen(sym_name(o, &s)) + 1;
    memcpy(w, sym_name(o, &s), len);
    pairs[k++] = (Pair){w, i};
    w += len;
  }
  qsort(pairs, n, sizeof *pairs, cmp_export); /* Pair starts with the name */
  for (size_t i = 0; i < n; i++) {
    if (i && strcmp(pairs[i].name, pairs[i - 1].name) == 0) {
      smelt_status st = BAD("function '%.80s' is defined twice", pairs[i].name);
      free(pairs);
      return st;
    }
    img->export_name[i] = pairs[i].name;
    img->export_addr[i] = (void *)(uintptr_t)sym_value(o, pairs[i].sym);
  }
  img->nexport = (int)n;
  free(pairs);
  return NULL;
}

/* ---- the API ---- */

static void obj_free(Obj *o) {
  free(o->sh);
  free(o->part);
  free(o->place);
  free(o->import);
  free(o->got);
  free(o->stub);
}

static smelt_status load(Obj *o, const RtElfImport *imports, int nimports, RtElfImage *img) {
  uint64_t shoff = 0;
  RETURN_IF_ERROR(check_header(o, &shoff));
  RETURN_IF_ERROR(read_sections(o, shoff));
  RETURN_IF_ERROR(classify_sections(o));
  RETURN_IF_ERROR(read_symtab(o));
  RETURN_IF_ERROR(check_symbols(o, imports, nimports));
  RETURN_IF_ERROR(walk_all_relocs(o, false));
  RETURN_IF_ERROR(layout(o));
  if (!host_is_x86_64()) return st_error(ST_UNSUPPORTED, "kernel object: x86-64 code cannot run on this host");
  RETURN_IF_ERROR(map_and_relocate(o));
  img->base = o->base;
  img->size = (size_t)o->image_size;
  for (int p = 0; p < NPARTS; p++) {
    img->part_off[p] = o->part_off[p];
    img->part_len[p] = align_up(o->part_size[p], o->page);
  }
  return collect_exports(o, img);
}

smelt_status rt_elf_load(const void *obj, size_t len, const RtElfImport *imports, int nimports,
                         RtElfImage **out_image) {
  *out_image = NULL;
  if (!obj && len) return st_error(ST_INTERNAL, "rt_elf_load: no bytes");
  long page = sysconf(_SC_PAGESIZE);
  Obj o = {.b = obj, .len = len, .page = page > 0 ? (size_t)page : 4096};
  RtElfImage *img = calloc(1, sizeof *img);
  if (!img) return st_error(ST_NO_MEMORY, "out of memory loading a kernel object");
  smelt_status st = load(&o, imports, nimports < 0 ? 0 : nimports, img);
  if (st && o.base && !img->base) munmap(o.base, (size_t)o.image_size);
  obj_free(&o);
  if (st) {
    rt_elf_free(img);
    return st;
  }
  *out_image = img;
  return NULL;
}

void *rt_elf_lookup(const RtElfImage *img, const char *name) {
  if (!img || !name) return NULL;
  int lo = 0, hi = img->nexport - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    int c = strcmp(name, img->export_name[mid]);
    if (c == 0) return img->export_addr[mid];
    if (c < 0) hi = mid - 1;
    else lo = mid + 1;
  }
  return NULL;
}

int rt_elf_symbol_count(const RtElfImage *img) { return img ? img->nexport : 0; }

const char *rt_elf_symbol_name(const RtElfImage *img, int i) {
  return img && i >= 0 && i < img->nexport ? img->export_name[i] : NULL;
}

void rt_elf_layout(const RtElfImage *img, RtElfLayout *out) {
  memset(out, 0, sizeof *out);
  if (!img || !img->base) return;
  out->base = img->base;
  out->size = img->size;
  out->text = img->base + img->part_off[PART_TEXT];
  out->text_size = (size_t)img->part_len[PART_TEXT];
  out->rodata = img->base + img->part_off[PART_RODATA];
  out->rodata_size = (size_t)img->part_len[PART_RODATA];
  out->data = img->base + img->part_off[PART_DATA];
  out->data_size = (size_t)img->part_len[PART_DATA];
}

void rt_elf_free(RtElfImage *img) {
  if (!img) return;
  if (img->base) munmap(img->base, img->size);
  free(img->export_name);
  free(img->export_addr);
  free(img->names);
  free(img);
}

/* ---- the default imports ---- */

/* sincos and sincosf are GNU extensions, not in every libm; LLVM turns a
 * sin and a cos of one value into them, so they are supplied here. */
static void sm_sincos(double x, double *s, double *c) {
  *s = sin(x);
  *c = cos(x);
}
static void sm_sincosf(float x, float *s, float *c) {
  *s = sinf(x);
  *c = cosf(x);
}

/* A function's address as the table's object pointer (POSIX guarantees the
 * conversion, as dlsym's users rely on). */
#define IMP(f) {#f, (void *)(f)}

static const RtElfImport default_imports[] = {
    IMP(memcpy), IMP(memmove), IMP(memset),
    /* exponentials and logarithms */
    IMP(exp), IMP(expf), IMP(exp2), IMP(exp2f), IMP(expm1), IMP(expm1f), IMP(log), IMP(logf), IMP(log2),
    IMP(log2f), IMP(log10), IMP(log10f), IMP(log1p), IMP(log1pf), IMP(pow), IMP(powf), IMP(sqrt), IMP(sqrtf),
    IMP(cbrt), IMP(cbrtf), IMP(ldexp), IMP(ldexpf),
    /* trigonometric and hyperbolic */
    IMP(sin), IMP(sinf), IMP(cos), IMP(cosf), IMP(tan), IMP(tanf), IMP(asin), IMP(asinf), IMP(acos), IMP(acosf),
    IMP(atan), IMP(atanf), IMP(atan2), IMP(atan2f), IMP(sinh), IMP(sinhf), IMP(cosh), IMP(coshf), IMP(tanh),
    IMP(tanhf), {"sincos", (void *)sm_sincos}, {"sincosf", (void *)sm_sincosf},
    /* error function */
    IMP(erf), IMP(erff), IMP(erfc), IMP(erfcf),
    /* rounding, remainders, min/max, fma (what LLVM lowers llvm.floor, frem,
     * llvm.minnum, llvm.fma, ... to on CPUs without the instruction) */
    IMP(floor), IMP(floorf), IMP(ceil), IMP(ceilf), IMP(trunc), IMP(truncf), IMP(round), IMP(roundf), IMP(rint),
    IMP(rintf), IMP(nearbyint), IMP(nearbyintf), IMP(fmod), IMP(fmodf), IMP(fmin), IMP(fminf), IMP(fmax),
    IMP(fmaxf), IMP(fma), IMP(fmaf), IMP(fabs), IMP(fabsf), IMP(copysign), IMP(copysignf),
};

const RtElfImport *rt_elf_default_imports(int *out_n) {
  *out_n = (int)(sizeof default_imports / sizeof default_imports[0]);
  return default_imports;
}
