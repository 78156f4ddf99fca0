// SPDX-License-Identifier: Apache-2.0
// ulysses_perf --docs SPEC: the packed documents a run prices (--advise) or moves (--allgather-kv).
//   --docs L1,L2,...                 documents of these token counts (0: a placeholder); S = their sum
//   --docs lognormal:MEAN[:SIGMA[:SEED]]
//                                    lengths drawn from a log-normal of mean MEAN tokens (sigma
//                                    SIGMA of the log, default 1; std::mt19937_64 seeded SEED,
//                                    default 1234), packed until they cover S (the last one cut at
//                                    S), for every S of the run: test_documents' balance case
// partition/documents.hpp's Documents is what the library takes; this only makes one.
#pragma once

#include <ulysses/partition/documents.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace perf_documents {

/// A parsed --docs.
struct Spec {
  bool given = false;
  bool lognormal = false;
  std::vector<std::int64_t> lengths;  // the list form
  double mean = 0, sigma = 1;         // the log-normal form
  std::uint64_t seed = 1234;
  /// S of the list form (the lengths' sum); 0 for the log-normal form (any S).
  std::int64_t fixed_seq_len() const {
    std::int64_t s = 0;
    for (std::int64_t n : lengths) s += n;
    return lognormal ? 0 : s;
  }
  /// What the tables' headers print.
  std::string describe() const {
    if (!given) return "one sequence";
    if (lognormal) {
      char b[160];
      std::snprintf(b, sizeof b, "packed documents, log-normal lengths (mean %.0f tokens, sigma %.2f, seed %llu)", mean, sigma,
                    static_cast<unsigned long long>(seed));
      return b;
    }
    return "packed documents, " + std::to_string(lengths.size()) + " of the given lengths";
  }
};

[[noreturn]] inline void bad(const std::string& s) {
  std::fprintf(stderr,
               "--docs takes document lengths >= 0 separated by commas (4000,300,12000) or lognormal:MEAN[:SIGMA[:SEED]] "
               "(MEAN >= 1 tokens, SIGMA > 0), not '%s'\n",
               s.c_str());
  std::exit(2);
}

/// Parses --docs' argument; exits (2) on a malformed one.
inline Spec parse(const std::string& s) {
  Spec p;
  p.given = true;
  auto number = [&](const std::string& x) {
    char* end = nullptr;
    const double v = std::strtod(x.c_str(), &end);
    if (x.empty() || *end || !std::isfinite(v)) bad(s);
    return v;
  };
  if (s.rfind("lognormal:", 0) == 0) {
    p.lognormal = true;
    std::vector<std::string> f;
    std::string rest = s.substr(10);
    for (std::size_t at; (at = rest.find(':')) != std::string::npos; rest = rest.substr(at + 1)) f.push_back(rest.substr(0, at));
    f.push_back(rest);
    if (f.size() > 3) bad(s);
    p.mean = number(f[0]);
    if (f.size() > 1) p.sigma = number(f[1]);
    if (f.size() > 2) {
      const double seed = number(f[2]);
      if (seed < 0 || seed != std::floor(seed)) bad(s);
      p.seed = static_cast<std::uint64_t>(seed);
    }
    if (p.mean < 1 || !(p.sigma > 0)) bad(s);
    return p;
  }
  std::string rest = s;
  for (;;) {
    const std::size_t at = rest.find(',');
    const double v = number(rest.substr(0, at));
    if (v < 0 || v != std::floor(v)) bad(s);
    p.lengths.push_back(static_cast<std::int64_t>(v));
    if (at == std::string::npos) break;
    rest = rest.substr(at + 1);
  }
  if (p.fixed_seq_len() < 1) bad(s);
  return p;
}

/// The documents of `p` over S tokens. The list form needs S = its sum (exits (2) otherwise);
/// the log-normal form draws lengths (each >= 1 token) until they cover S.
inline ulysses::Documents documents(const Spec& p, std::int64_t S) {
  std::vector<std::int64_t> cu{0};
  if (!p.lognormal) {
    if (S != p.fixed_seq_len()) {
      std::fprintf(stderr, "--docs: the documents hold %lld tokens, not S = %lld (a length list fixes S: give -b/--seq as their sum)\n",
                   static_cast<long long>(p.fixed_seq_len()), static_cast<long long>(S));
      std::exit(2);
    }
    for (std::int64_t n : p.lengths) cu.push_back(cu.back() + n);
    return ulysses::Documents(cu, S);
  }
  std::mt19937_64 rng(p.seed);
  const double mu = std::log(p.mean) - p.sigma * p.sigma / 2;  // the mean of the lengths: exp(mu + sigma^2 / 2)
  std::lognormal_distribution<double> dist(mu, p.sigma);
  while (cu.back() < S) cu.push_back(std::min(S, cu.back() + std::max<std::int64_t>(1, std::llround(dist(rng)))));
  return ulysses::Documents(cu, S);
}

}  // namespace perf_documents
