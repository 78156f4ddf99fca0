// SPDX-License-Identifier: Apache-2.0
// Packed documents (partition/documents.hpp): Documents, documents_partition() (zigzag, balanced)
// and the per-rank views, against per-token brute force; C20's padded cu_seqlens, C22's zigzag.
#include <doctest/doctest.h>
#include <ulysses/partition/documents.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "expect_error.hpp"

using namespace ulysses;
using V = std::vector<std::int64_t>;

namespace {
const DocumentSplit kSplits[] = {DocumentSplit::zigzag, DocumentSplit::balanced};

// Brute force, token by token, from the cu_seqlens and SeqPartition::global_token alone.
std::int64_t doc_of(const V& cu, std::int64_t t) {
  for (std::size_t d = 0; d + 1 < cu.size(); ++d)
    if (cu[d] <= t && t < cu[d + 1]) return static_cast<std::int64_t>(d);
  return -1;
}
V tokens_of(const SeqPartition& p, int r) {
  V v;
  for (std::int64_t i = 0; i < p.local_length(r); ++i) v.push_back(p.global_token(r, i));
  return v;
}
V positions_of(const V& cu, const V& tokens) {
  V v;
  for (auto t : tokens) v.push_back(t - cu[static_cast<std::size_t>(doc_of(cu, t))]);
  return v;
}
V cu_of(const V& cu, const V& tokens) {
  V n(cu.size(), 0);
  for (auto t : tokens) ++n[static_cast<std::size_t>(doc_of(cu, t) + 1)];
  for (std::size_t i = 1; i < n.size(); ++i) n[i] += n[i - 1];
  return n;
}
std::int64_t work_of(const V& cu, const V& tokens) {
  std::int64_t w = 0;
  for (auto t : tokens) w += t - cu[static_cast<std::size_t>(doc_of(cu, t))] + 1;
  return w;
}
// Rank r's non-empty chunks, (offset, length), in local order.
std::vector<std::pair<std::int64_t, std::int64_t>> runs_of(const SeqPartition& p, int r) {
  std::vector<std::pair<std::int64_t, std::int64_t>> v;
  for (const SeqChunk& k : p.chunks_of(r))
    if (k.length) v.emplace_back(k.offset, k.length);
  return v;
}
// The local cu_seqlens without the entries of placeholder documents.
V drop_placeholders(const V& global_cu, const V& local) {
  V v{local[0]};
  for (std::size_t d = 0; d + 1 < global_cu.size(); ++d)
    if (global_cu[d + 1] > global_cu[d]) v.push_back(local[d + 1]);
  return v;
}
// Independent per-document zigzag: document tokens cut into 2P chunks, the first L % 2P longer.
V zigzag_tokens(const V& cu, int P, int r) {
  V v;
  const std::int64_t n = 2 * P;
  for (std::size_t d = 0; d + 1 < cu.size(); ++d) {
    std::int64_t at = cu[d];
    const std::int64_t L = cu[d + 1] - cu[d];
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t len = L / n + (j < L % n ? 1 : 0);
      if (j == r || j == n - 1 - r)
        for (std::int64_t t = at; t < at + len; ++t) v.push_back(t);
      at += len;
    }
  }
  return v;
}
double max_over_mean(const Documents& docs, const SeqPartition& p) {
  std::int64_t mx = 0;
  for (int r = 0; r < p.degree(); ++r) mx = std::max(mx, causal_work(docs, p, r));
  return static_cast<double>(mx) * p.degree() / static_cast<double>(docs.causal_pairs());
}
double max_tokens(const SeqPartition& p) {
  std::int64_t m = 0;
  for (int r = 0; r < p.degree(); ++r) m = std::max(m, p.local_length(r));
  return static_cast<double>(m);
}
}  // namespace

TEST_CASE("Documents: validation, zero-length placeholders, accessors") {
  const Documents a({0, 16, 40, 40, 40}, 40);
  CHECK(a.seq_len() == 40);
  CHECK(a.count() == 4);
  CHECK(a.non_empty() == 2);
  CHECK(a.length(2) == 0);
  CHECK(a.document_of(0) == 0);
  CHECK(a.document_of(16) == 1);
  CHECK(a.document_of(39) == 1);
  const Documents b({0, 0, 16, 40}, 40);
  CHECK(b.document_of(0) == 1);
  CHECK(b.begin(2) == 16);
  const Documents c({0, 16, 16, 40}, 40);
  CHECK(c.document_of(16) == 2);
  CHECK(c.causal_pairs() == 16 * 17 / 2 + 24 * 25 / 2);
  const auto e = ut::error_of([] { Documents({0, 16, 10, 40}, 40); });
  CHECK(e.first == Errc::invalid_partition);
  CHECK(e.second.find("cu_seqlens[2]") != std::string::npos);
  CHECK(ut::code_of([] { Documents({0, 16, 40}, 41); }) == Errc::seq_lengths_mismatch);
  CHECK(ut::code_of([] { Documents({0, 16, 40}, 40); }) == Errc{});
  CHECK(ut::code_of([] { Documents({1, 16, 40}); }) == Errc::invalid_partition);
  CHECK(ut::code_of([] { Documents(V{0}); }) == Errc::invalid_partition);
  CHECK(ut::code_of([] { Documents({0, 0}); }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { a.document_of(40); }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { a.length(4); }) == Errc::invalid_shape);
  CHECK(ut::code_of([] { documents_partition(Documents({0, 4}), 0, DocumentSplit::zigzag); }) == Errc::invalid_group);
}

TEST_CASE("C20: padded cu_seqlens partition, position and cu_seqlens like [0,16,40]") {
  const Documents ref({0, 16, 40}, 40);
  for (const V& cu : {V{0, 16, 40, 40, 40}, V{0, 0, 16, 40}, V{0, 16, 16, 40}}) {
    const Documents docs(cu, 40);
    for (const DocumentSplit s : kSplits)
      for (int P : {2, 4}) {
        CAPTURE(P);
        CAPTURE(to_string(s));
        const SeqPartition a = documents_partition(ref, P, s), b = documents_partition(docs, P, s);
        for (int r = 0; r < P; ++r) {
          CHECK(runs_of(a, r) == runs_of(b, r));
          CHECK(local_position_ids(ref, a, r) == local_position_ids(docs, b, r));
          CHECK(local_global_tokens(ref, a, r) == local_global_tokens(docs, b, r));
          const V lcu = local_cu_seqlens(docs, b, r);
          CHECK(lcu.size() == cu.size());  // one entry per document of the global list
          CHECK(drop_placeholders(cu, lcu) == local_cu_seqlens(ref, a, r));
          CHECK(causal_work(ref, a, r) == causal_work(docs, b, r));
        }
      }
  }
}

TEST_CASE("zigzag: chunks r and 2P-1-r of every document (TransformerEngine THD), C22's cases") {
  const Documents d1({0, 8, 16});
  const SeqPartition p1 = documents_partition(d1, 2, DocumentSplit::zigzag);
  CHECK(tokens_of(p1, 0) == V{0, 1, 6, 7, 8, 9, 14, 15});
  CHECK(tokens_of(p1, 1) == V{2, 3, 4, 5, 10, 11, 12, 13});
  using R = std::vector<std::pair<std::int64_t, std::int64_t>>;
  CHECK(runs_of(p1, 0) == R{{0, 2}, {6, 4}, {14, 2}});  // contiguous runs of a rank merged
  CHECK(local_cu_seqlens(d1, p1, 0) == V{0, 4, 8});

  const Documents d2({0, 4, 8});  // C22
  const SeqPartition p2 = documents_partition(d2, 2, DocumentSplit::zigzag);
  CHECK(local_global_tokens(d2, p2, 0) == V{0, 3, 4, 7});
  CHECK(local_position_ids(d2, p2, 0) == V{0, 3, 0, 3});
  CHECK(local_global_tokens(d2, p2, 1) == V{1, 2, 5, 6});
  CHECK(local_position_ids(d2, p2, 1) == V{1, 2, 1, 2});

  const Documents d3({0, 5, 12});  // chunks of 2,1,1,1 and 2,2,2,1 tokens
  const SeqPartition p3 = documents_partition(d3, 2, DocumentSplit::zigzag);
  CHECK(local_global_tokens(d3, p3, 0) == V{0, 1, 4, 5, 6, 11});
  CHECK(local_position_ids(d3, p3, 0) == V{0, 1, 4, 0, 1, 6});
  CHECK(local_cu_seqlens(d3, p3, 0) == V{0, 3, 6});
  CHECK(local_global_tokens(d3, p3, 1) == V{2, 3, 7, 8, 9, 10});
  CHECK(local_position_ids(d3, p3, 1) == V{2, 3, 2, 3, 4, 5});
  CHECK(local_cu_seqlens(d3, p3, 1) == V{0, 2, 6});

  const Documents d4({0, 3, 40});  // a document shorter than 2P: ranks 3 holds nothing of it
  const SeqPartition p4 = documents_partition(d4, 4, DocumentSplit::zigzag);
  CHECK(local_cu_seqlens(d4, p4, 3)[1] == 0);
  CHECK(local_cu_seqlens(d4, p4, 0)[1] == 1);
}

TEST_CASE("random documents: the views against per-token brute force, P = 2..8") {
  std::mt19937_64 rng(20261202);
  const auto pick = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  for (int trial = 0; trial < 24; ++trial)
    for (int P = 2; P <= 8; ++P) {
      V len;
      for (std::int64_t i = pick(0, 30); i > 0; --i) len.push_back(pick(1, 20));      // many short
      len.insert(len.begin() + pick(0, static_cast<std::int64_t>(len.size())), pick(100, 400));  // one long
      len.insert(len.begin() + pick(0, static_cast<std::int64_t>(len.size())), pick(1, P - 1));  // one shorter than P
      for (std::int64_t i = pick(0, 3); i > 0; --i) len.insert(len.begin() + pick(0, static_cast<std::int64_t>(len.size())), 0);
      V cu{0};
      for (auto l : len) cu.push_back(cu.back() + l);
      const Documents docs(cu, cu.back());
      std::vector<SeqPartition> parts{documents_partition(docs, P, DocumentSplit::zigzag),
                                      documents_partition(docs, P, DocumentSplit::balanced),
                                      SeqPartition::balanced(docs.seq_len(), P), SeqPartition::zigzag(docs.seq_len(), P)};
      for (std::size_t i = 0; i < parts.size(); ++i) {
        CAPTURE(trial);
        CAPTURE(P);
        CAPTURE(i);
        std::int64_t total = 0;
        for (int r = 0; r < P; ++r) {
          const V t = tokens_of(parts[i], r);
          CHECK(std::is_sorted(t.begin(), t.end()));  // local order = global order
          if (i == 0) CHECK(t == zigzag_tokens(cu, P, r));
          CHECK(local_global_tokens(docs, parts[i], r) == t);
          CHECK(local_position_ids(docs, parts[i], r) == positions_of(cu, t));
          CHECK(local_cu_seqlens(docs, parts[i], r) == cu_of(cu, t));
          CHECK(causal_work(docs, parts[i], r) == work_of(cu, t));
          total += causal_work(docs, parts[i], r);
        }
        CHECK(total == docs.causal_pairs());
      }
    }
}

TEST_CASE("the views check their partition") {
  const Documents docs({0, 5, 12});
  CHECK(ut::code_of([&] { local_cu_seqlens(docs, SeqPartition::balanced(13, 2), 0); }) == Errc::seq_lengths_mismatch);
  CHECK(ut::code_of([&] { causal_work(docs, SeqPartition::balanced(12, 2), 2); }) == Errc::invalid_group);
  const SeqPartition back = SeqPartition::chunks(12, 2, {{0, 6, 6, 0}, {0, 0, 6, 0}, {1, 0, 0, 0}});  // rank 0: [6,12) then [0,6)
  CHECK(ut::code_of([&] { local_cu_seqlens(docs, back, 0); }) == Errc::invalid_partition);
  CHECK(local_position_ids(docs, back, 0) == V{1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 0});
}

TEST_CASE("balance: log-normal documents (mean 2048 tokens) packed to 128k, P = 8 and 16") {
  std::mt19937_64 rng(1234);
  const double sigma = 1.0, mu = std::log(2048.0) - sigma * sigma / 2;  // mean exp(mu + sigma^2 / 2) = 2048
  std::lognormal_distribution<double> dist(mu, sigma);
  const std::int64_t S = 131072;
  V cu{0};
  while (cu.back() < S) cu.push_back(std::min(S, cu.back() + std::max<std::int64_t>(1, std::llround(dist(rng)))));
  const Documents docs(cu, S);
  MESSAGE("log-normal documents: ", docs.count(), " documents, the longest ",
          [&] { std::int64_t m = 0; for (std::int64_t d = 0; d < docs.count(); ++d) m = std::max(m, docs.length(d)); return m; }(),
          " tokens");
  for (int P : {8, 16}) {
    const SeqPartition pb = documents_partition(docs, P, DocumentSplit::balanced);
    const SeqPartition pz = documents_partition(docs, P, DocumentSplit::zigzag);
    const double bal = max_over_mean(docs, pb), zz = max_over_mean(docs, pz);
    const double even = max_over_mean(docs, SeqPartition::even(S, P));
    MESSAGE("P=", P, " max/mean causal work: balanced ", bal, ", zigzag ", zz, ", contiguous (SeqPartition::even) ", even,
            "; chunks: balanced ", pb.chunks().size(), ", zigzag ", pz.chunks().size(), "; max/mean tokens: balanced ",
            max_tokens(pb) * P / static_cast<double>(S), ", zigzag ", max_tokens(pz) * P / static_cast<double>(S));
    CHECK(bal <= 1.05);
  }
}

TEST_CASE("break32: causal_pairs() of a document whose L(L+1)/2 fits int64 although L(L+1) does not") {
  const std::int64_t L = 4000000000LL;
  const Documents d({0, L});
  CHECK(d.causal_pairs() == L / 2 * (L + 1));
  CHECK(ut::code_of([] { (void)Documents({0, std::int64_t{1} << 33}).causal_pairs(); }) == Errc::size_overflow);
}
