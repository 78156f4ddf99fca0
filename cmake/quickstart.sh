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

# What each preset cannot do without (the others only add optional parts).
required=(cmake g++ make)
case "$preset" in test | sanitize | tsan) required+=(doctest-dev pkg-config) ;; esac
[ "$preset" = test ] && required+=(libopenmpi-dev openmpi-bin)
packages=("${required[@]}" doctest-dev pkg-config libopenmpi-dev openmpi-bin libbenchmark-dev nlohmann-json3-dev)
[ "$preset" = test ] && packages+=(libtorch-dev libgloo-dev)  # the libtorch client's tests (optional)
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=()
for p in "${packages[@]}"; do
  installed "$p" || [[ " ${missing[*]} " == *" $p "* ]] || missing+=("$p")
done
if ((${#missing[@]})) && command -v dpkg-query >/dev/null; then
  if command -v apt-get >/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
    echo "quickstart: installing ${missing[*]}"
    apt_install() { DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
    if ! { $sudo apt-get update -qq && apt_install "${missing[@]}"; }; then
      # An optional package this distribution lacks must not keep the required ones out.
      need=()
      for p in "${required[@]}"; do installed "$p" || need+=("$p"); done
      echo "quickstart: could not install ${missing[*]} (needs root or password-less sudo, and the packages in your distribution)" >&2
      ((${#need[@]} == 0)) || apt_install "${need[@]}" || true
    fi
  fi
  still=()
  for p in "${required[@]}"; do installed "$p" || still+=("$p"); done
  if ((${#still[@]})); then
    echo "quickstart: the '$preset' preset needs these packages, which are not installed: ${still[*]}" >&2
    echo "quickstart: install them (e.g. sudo apt-get install ${still[*]}) and run this again" >&2
    exit 1
  fi
fi

# OpenMPI refuses to start as root unless told it may (containers, CI).
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# ctest's summary names skipped tests without their reasons ("***Skipped"): after the run, print
# each one's reason from the test preset's JUnit file (CMakePresets.json: outputJUnitFile).
case "$preset" in
test) build=build ;;
sanitize | tsan) build="build-$preset" ;;
*) build="" ;;
esac
[ -z "$build" ] || rm -f "$build/ctest-junit.xml"  # (not a previous run's)
status=0
cmake --workflow --preset "$preset" || status=$?
if [ -n "$build" ] && [ -f "$build/ctest-junit.xml" ]; then
  cmake -DJUNIT="$build/ctest-junit.xml" -P cmake/ctest_skips.cmake 2>&1 || true
fi
exit "$status"
