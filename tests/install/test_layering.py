#!/usr/bin/env python3
"""The folders' dependencies follow the pipeline, and the runtime stands
alone.

Reads every `#include "folder/..."` of the library's C sources and headers
and checks:
  - ir/ includes only ir/; format/ only ir/ and format/; runtime/ only
    ir/, format/, runtime/ and include/ (the runtime library is the IR core,
    the bundle format and the runtime: nothing of the compiler);
  - no cycle runs between folders (codegen/cuda and codegen/llvm count as
    codegen/);
  - no runtime/, format/ or ir/ file includes a system header of the
    compiler's dependencies (yaml.h, jansson.h, llvm-c/, protobuf-c/).
The shared runtime library is linked with -Wl,--no-undefined, so a call
into the compiler from the runtime also fails the build.

Usage: test_layering.py [--smelt PATH]   (PATH unused; the runner passes it)
"""
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FOLDERS = ["ir", "format", "runtime", "frontend", "passes", "codegen", "compiler", "cli", "include"]
ALLOWED = {
    "ir": {"ir"},
    "format": {"ir", "format"},
    "runtime": {"ir", "format", "runtime", "include"},
    "include": {"include"},
}
FORBIDDEN_SYSTEM = ("yaml.h", "jansson.h", "llvm-c/", "protobuf-c/")


def folder_of(path):
    top = path.split("/")[0]
    return top if top in FOLDERS else None


def main():
    edges, bad = {}, []
    for folder in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in files:
                if not f.endswith((".c", ".h")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)
                text = open(os.path.join(dirpath, f), errors="replace").read()
                for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, re.M):
                    # "bytes.h" and "../ir/ir.h" are relative to the including file
                    local = os.path.normpath(os.path.join(os.path.dirname(rel), inc))
                    to = folder_of(inc) if not inc.startswith(".") and folder_of(inc) else folder_of(local) or folder
                    if to != folder:
                        edges.setdefault(folder, set()).add(to)
                    if folder in ALLOWED and to not in ALLOWED[folder]:
                        bad.append(f"{rel} includes {inc} ({folder}/ may include only {sorted(ALLOWED[folder])})")
                if folder in ("ir", "format", "runtime"):
                    for inc in re.findall(r'^\s*#\s*include\s+<([^>]+)>', text, re.M):
                        if inc.startswith(FORBIDDEN_SYSTEM):
                            bad.append(f"{rel} includes <{inc}>, a compiler dependency")
    # cycles between folders: depth-first search over the folder graph
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                bad.append("include cycle between folders: " + " -> ".join(stack[stack.index(m):] + [m]))
            elif not state.get(m):
                visit(m)
        stack.pop()
        state[n] = 2

    for n in FOLDERS:
        if not state.get(n):
            visit(n)
    for b in bad:
        print("FAIL:", b)
    if bad:
        sys.exit(1)
    for n in FOLDERS:
        print(f"ok: {n}/ -> {', '.join(sorted(edges.get(n, ()))) or '(nothing)'}")
    print("the folders form no cycle and the runtime depends only on ir/, format/ and include/")


if __name__ == "__main__":
    main()
