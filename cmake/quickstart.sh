#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Quick start on Debian/Ubuntu:  cmake/quickstart.sh demo   |   cmake/quickstart.sh test
# Installs the missing system packages when it can (root, or sudo without a password), then runs
# the CMake workflow preset of the same name (configure, build, run).
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-demo}"
case "$preset" in demo | test | sanitize | tsan) ;; *)
  echo "usage: $0 demo|test|sanitize|tsan" >&2
  exit 2
  ;;
esac

packages=(cmake g++ make doctest-dev libopenmpi-dev openmpi-bin libbenchmark-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if command -v apt-get >/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
    echo "quickstart: installing ${missing[*]}"
    if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
      echo "quickstart: could not install ${missing[*]} (need root or sudo); continuing without them" >&2
    fi
  else
    echo "quickstart: no apt-get; make sure these are installed: ${missing[*]}" >&2
  fi
fi

# OpenMPI refuses to start as root unless told it may (containers, CI).
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
exec cmake --workflow --preset "$preset"
