#!/usr/bin/env python3
"""`cmake --install` into a temporary prefix, then a consumer built against
the installed tree, as a user outside the source tree would:

  1. with pkg-config (smelt-runtime.pc): cc run_bundle.c $(pkg-config ...);
  2. with CMake: find_package(smelt) and target smelt::runtime;

each runs a CPU bundle compiled by the installed `smelt` tool, and its
outputs must equal `smelt run`'s bitwise.  The installed
libsmelt_runtime.so must not depend on libLLVM, libyaml or libjansson, and
the headers, both libraries (static and shared), both .pc files and the
CMake package must be where they are promised.

Usage: test_install.py --smelt PATH   (the build directory is PATH's)
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, check_ldd, compare_with_smelt_run, run  # noqa: E402


def sanitizer_flags(build):
    """An ASan/UBSan build installs instrumented libraries: the consumer needs the same runtime."""
    cache = open(os.path.join(build, "CMakeCache.txt")).read()
    return ["-fsanitize=address,undefined"] if "SMELT_SANITIZE:BOOL=ON" in cache else []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smelt", required=True)
    args = ap.parse_args()
    build = os.path.dirname(os.path.abspath(args.smelt))
    if not shutil.which("pkg-config") or not shutil.which("cc"):
        print("SKIP: pkg-config or cc missing")
        sys.exit(77)  # ctest's SKIP_RETURN_CODE: reported as skipped, not passed
    san = sanitizer_flags(build)
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "prefix")
        run(["cmake", "--install", build, "--prefix", prefix])
        smelt = os.path.join(prefix, "bin", "smelt")
        libs = glob.glob(os.path.join(prefix, "lib*", "**", "libsmelt_runtime.so"), recursive=True)
        if len(libs) != 1:
            raise SystemExit(f"FAIL: libsmelt_runtime.so not installed once: {libs}")
        libdir = os.path.dirname(libs[0])
        for f in ["libsmelt_runtime.a", "libsmelt.so", "libsmelt.a", "pkgconfig/smelt.pc",
                  "pkgconfig/smelt-runtime.pc", "cmake/smelt/smeltConfig.cmake"]:
            if not os.path.exists(os.path.join(libdir, f)):
                raise SystemExit(f"FAIL: {f} not installed under {libdir}")
        for h in ["smelt.h", "smelt_compile.h"]:
            if not os.path.exists(os.path.join(prefix, "include", h)):
                raise SystemExit(f"FAIL: include/{h} not installed")
        print(f"ok: installed the tool, both libraries (static and shared), headers, .pc files, CMake package")
        check_ldd(libs[0])
        print("ok: the installed libsmelt_runtime.so needs no LLVM, libyaml or jansson")

        bundle = os.path.join(tmp, "mlp.smelt")
        run([smelt, "compile", os.path.join(ROOT, "examples", "mlp.yaml"), "-o", bundle])
        src = os.path.join(ROOT, "tests", "install", "consumer")

        # 1. pkg-config
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(libdir, "pkgconfig"))
        flags = run(["pkg-config", "--cflags", "--libs", "smelt-runtime"], env=env).split()
        exe = os.path.join(tmp, "run_bundle_pc")
        run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", *san, os.path.join(src, "run_bundle.c"), "-o", exe,
             *flags, f"-Wl,-rpath,{libdir}"])
        work = os.path.join(tmp, "pc")
        os.makedirs(work)
        n = compare_with_smelt_run(smelt, bundle, exe, work)
        print(f"ok: pkg-config consumer ({' '.join(flags)}) runs the bundle: {n} output(s) equal to smelt run")
        cflags = run(["pkg-config", "--cflags", "--libs", "smelt"], env=env).split()
        if "-lsmelt" not in cflags or "-lsmelt_runtime" not in cflags:
            raise SystemExit(f"FAIL: pkg-config smelt should give -lsmelt and -lsmelt_runtime: {cflags}")

        # 2. CMake
        cb = os.path.join(tmp, "cmake-build")
        run(["cmake", "-S", src, "-B", cb, f"-DCMAKE_PREFIX_PATH={prefix}", f"-DCMAKE_C_FLAGS={' '.join(san)}",
             f"-DCMAKE_EXE_LINKER_FLAGS={' '.join(san)}"])
        run(["cmake", "--build", cb])
        work = os.path.join(tmp, "cm")
        os.makedirs(work)
        n = compare_with_smelt_run(smelt, bundle, os.path.join(cb, "run_bundle"), work)
        print(f"ok: CMake consumer (find_package(smelt), smelt::runtime) runs the bundle: {n} output(s) equal")
    print("all install checks passed")


if __name__ == "__main__":
    main()
