// SPDX-License-Identifier: Apache-2.0
// Command-line values for the examples and tools (ulysses_attention, ulysses_perf, torch_attention):
// each reads the value after a flag and exits with status 2, naming the flag, when it is missing or
// not what the flag takes.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace ulysses_cli {

/// The value after the flag argv[i] (i advances to it); exits 2 when there is none.
inline const char* value(int argc, char** argv, int& i) {
  if (i + 1 >= argc) {
    std::fprintf(stderr, "%s needs a value\n", argv[i]);
    std::exit(2);
  }
  return argv[++i];
}

/// The whole number in [lo, hi] after the flag argv[i]; exits 2 otherwise (not a number, trailing
/// characters, out of range).
inline long long whole(int argc, char** argv, int& i, long long lo, long long hi) {
  const char* flag = argv[i];
  const char* v = value(argc, argv, i);
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  if (!*v || *end || errno == ERANGE || n < lo || n > hi) {
    std::fprintf(stderr, "%s expects a whole number in [%lld, %lld], got '%s'\n", flag, lo, hi, v);
    std::exit(2);
  }
  return n;
}

/// The number >= lo after the flag argv[i]; exits 2 otherwise.
inline double real(int argc, char** argv, int& i, double lo) {
  const char* flag = argv[i];
  const char* v = value(argc, argv, i);
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (!*v || *end || !(x >= lo)) {
    std::fprintf(stderr, "%s expects a number >= %g, got '%s'\n", flag, lo, v);
    std::exit(2);
  }
  return x;
}

}  // namespace ulysses_cli
