// SPDX-License-Identifier: Apache-2.0
// Command-line values for the examples and tools (ulysses_attention, ulysses_perf, torch_attention):
// each reads the value after a flag and exits with status 2, naming the flag, when it is missing or
// not what the flag takes.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

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

/// The position in `names` of the value after the flag argv[i] (i advances to it); exits 2, naming
/// the choices, when it is none of them.
inline std::size_t one_of(int argc, char** argv, int& i, std::initializer_list<const char*> names) {
  const char* flag = argv[i];
  const char* v = value(argc, argv, i);
  std::size_t k = 0;
  for (const char* n : names) {
    if (std::strcmp(n, v) == 0) return k;
    ++k;
  }
  std::fprintf(stderr, "%s must be one of", flag);
  for (const char* n : names) std::fprintf(stderr, " %s", n);
  std::fprintf(stderr, ", not '%s'\n", v);
  std::exit(2);
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
