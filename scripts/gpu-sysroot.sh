# Sourced by scripts/gpu-check.sh and scripts/gpu-python.sh (not run):
# unpacks the Debian packages given after SYSROOT into SYSROOT (dpkg -x),
# points their pkg-config files at it and exports PKG_CONFIG_PATH,
# LD_LIBRARY_PATH and CMAKE_PREFIX_PATH so that CMake finds libyaml and
# jansson there.  With no packages given, only the exports (an already
# unpacked SYSROOT).
#   smelt_gpu_sysroot SYSROOT [PACKAGE.deb ...]
smelt_gpu_sysroot() {
  local root=$1 d pc libdirs pcdirs
  shift
  if [ $# -gt 0 ]; then
    rm -rf "$root"
    mkdir -p "$root"
    for d in "$@"; do dpkg -x "$d" "$root"; done
    # the .pc files say prefix=/usr: point them at the unpacked tree
    for pc in "$root"/usr/lib/*/pkgconfig/*.pc "$root"/usr/lib/pkgconfig/*.pc; do
      [ -f "$pc" ] && sed -i "s|^prefix=.*|prefix=$root/usr|" "$pc"
    done
  fi
  libdirs=$(find "$root/usr/lib" -maxdepth 2 -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd:)
  pcdirs=$(find "$root/usr/lib" -maxdepth 3 -type d -name pkgconfig | paste -sd:)
  export PKG_CONFIG_PATH="$pcdirs${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CMAKE_PREFIX_PATH="$root/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
}
