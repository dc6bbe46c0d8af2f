"""For tests that load libsmelt_runtime.so into Python with ctypes.

A sanitizer build (scripts/test.sh's second pass, -DSMELT_SANITIZE=ON) links
the library against libasan, whose runtime must be the first library of the
process: Python is not, so such a test re-runs itself once with libasan in
LD_PRELOAD (and leak detection off: the interpreter's own allocations are
not ours to check).  In a normal build this does nothing.
"""
import os
import subprocess
import sys


def reexec_if_sanitized(lib_path):
    if os.environ.get("SMELT_ASAN_PRELOADED") or not os.path.exists(lib_path):
        return
    try:
        deps = subprocess.run(["ldd", lib_path], capture_output=True, text=True).stdout
    except OSError:
        return
    if "libasan" not in deps:
        return
    asan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not asan or not os.path.exists(asan):
        for line in deps.splitlines():
            if "libasan" in line and "=>" in line:
                asan = line.split("=>")[1].split()[0]
    env = dict(os.environ, SMELT_ASAN_PRELOADED="1", LD_PRELOAD=asan,
               ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0")
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable] + sys.argv, env)
