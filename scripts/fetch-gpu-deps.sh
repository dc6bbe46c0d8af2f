#!/usr/bin/env bash
# Downloads the Debian packages of libyaml and jansson (headers, pkg-config
# files and shared libraries) into .deps/, on a machine that can reach a
# package mirror, so that scripts/gpu-check.sh can build smelt on the lent
# GPU machine, which has neither library and no network.  .deps/ is
# git-ignored: hand it to the GPU machine along with the tree (the device
# tool's `carry: [".deps"]`).
#
# Usage: scripts/fetch-gpu-deps.sh          (from anywhere in the repository)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(libyaml-dev libyaml-0-2 libjansson-dev libjansson4)
mkdir -p .deps
cd .deps
rm -f ./*.deb
echo "== apt-get download ${PACKAGES[*]} -> $(pwd)"
# apt drops privileges to _apt for downloads; a directory _apt cannot write
# to only produces a warning, so the check below is what decides success
apt-get download "${PACKAGES[@]}"
missing=0
for p in "${PACKAGES[@]}"; do
  if ls "${p}"_*.deb > /dev/null 2>&1; then
    echo "   ok  $(ls "${p}"_*.deb)"
  else
    echo "   MISSING ${p}" >&2
    missing=1
  fi
done
if [ "$missing" != 0 ]; then
  echo "fetch-gpu-deps: some packages were not downloaded" >&2
  exit 1
fi
echo "== done: run scripts/gpu-check.sh on the GPU machine with .deps/ carried along"
