// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Packed documents as a sequence partition: Documents (validated cu_seqlens),
///        documents_partition() (per-document zigzag or balanced by causal work) and the per-rank
///        views a varlen kernel takes (local cu_seqlens, position ids, global tokens, causal work).
///
/// Many documents packed into one sequence of S tokens, attention masked per document and causal:
/// a query at global token s of document d attends keys [begin(d), s]. A rank's local tensor holds
/// its tokens in ascending global order, so its pieces of each document are contiguous there.
/// See docs/documents.md.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../detail/checked.hpp"
#include "../detail/hash.hpp"
#include "../error.hpp"
#include "seq.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// x·y / 2 for consecutive integers x, y (one of them even) without overflowing before the
/// halving. @throws Error(size_overflow) when the result does not fit int64.
inline std::int64_t half_product(std::int64_t x, std::int64_t y, const char* what) {
  return x % 2 == 0 ? mul(x / 2, y, what) : mul(x, y / 2, what);
}
}  // namespace detail

/// Packed documents: validated cumulative document lengths (cu_seqlens, as flash-attn's varlen
/// kernels and TransformerEngine's THD format take them). Document d spans global tokens
/// [cu[d], cu[d+1]); zero-length documents (padding placeholders) are allowed anywhere and own no
/// token: [0,16,40,40,40], [0,0,16,40] and [0,16,16,40] partition like [0,16,40].
class Documents {
 public:
  /// @param cu_seqlens  cumulative token offsets: at least 2 entries, the first 0, non-decreasing,
  ///                    the last S >= 1 (the sequence length, tokens)
  /// @throws Error(invalid_partition) fewer than 2 entries, a first entry other than 0, or a
  ///         decreasing entry (the message names its index); Error(invalid_shape) a last entry < 1
  ///         (no token).
  explicit Documents(std::vector<std::int64_t> cu_seqlens) : cu_(std::move(cu_seqlens)) {
    if (cu_.size() < 2)
      detail::fail(Errc::invalid_partition, "cu_seqlens has " + std::to_string(cu_.size()) +
                                                " entries; it needs at least 2 ([0, S] for one document)");
    if (cu_[0] != 0) detail::fail(Errc::invalid_partition, "cu_seqlens[0] is " + std::to_string(cu_[0]) + "; it must be 0");
    for (std::size_t i = 1; i < cu_.size(); ++i)
      if (cu_[i] < cu_[i - 1])
        detail::fail(Errc::invalid_partition, "cu_seqlens[" + std::to_string(i) + "] = " + std::to_string(cu_[i]) +
                                                  " is below cu_seqlens[" + std::to_string(i - 1) + "] = " +
                                                  std::to_string(cu_[i - 1]) + "; cu_seqlens must be non-decreasing");
    if (cu_.back() < 1) detail::fail(Errc::invalid_shape, "cu_seqlens ends at 0: the documents hold no token");
  }
  /// The same, checked against the sequence length the caller expects.
  /// @param cu_seqlens  as Documents(cu_seqlens)
  /// @param S           the sequence length, tokens: the last entry must equal it
  /// @throws as Documents(cu_seqlens); Error(seq_lengths_mismatch) a last entry other than S.
  Documents(std::vector<std::int64_t> cu_seqlens, std::int64_t S) : Documents(std::move(cu_seqlens)) {
    if (cu_.back() != S)
      detail::fail(Errc::seq_lengths_mismatch, "cu_seqlens ends at " + std::to_string(cu_.back()) +
                                                   " tokens, not at the sequence length S=" + std::to_string(S));
  }

  std::int64_t seq_len() const { return cu_.back(); }                                   ///< S, tokens
  std::int64_t count() const { return static_cast<std::int64_t>(cu_.size()) - 1; }      ///< documents, placeholders included
  const std::vector<std::int64_t>& cu_seqlens() const { return cu_; }                   ///< the count() + 1 offsets
  /// First global token of document d. @throws Error(invalid_shape) d outside [0, count()).
  std::int64_t begin(std::int64_t d) const { return cu_[at(d)]; }
  /// Tokens of document d (0 for a placeholder). @throws Error(invalid_shape) d outside [0, count()).
  std::int64_t length(std::int64_t d) const { return cu_[at(d) + 1] - cu_[at(d)]; }
  /// Documents holding at least one token.
  std::int64_t non_empty() const {
    std::int64_t n = 0;
    for (std::size_t i = 1; i < cu_.size(); ++i) n += cu_[i] > cu_[i - 1] ? 1 : 0;
    return n;
  }
  /// The document holding global token `token` (never a placeholder). O(log count()).
  /// @throws Error(invalid_shape) `token` outside [0, S).
  std::int64_t document_of(std::int64_t token) const {
    if (token < 0 || token >= seq_len())
      detail::fail(Errc::invalid_shape, "token " + std::to_string(token) + " is outside the sequence [0, " +
                                            std::to_string(seq_len()) + ")");
    return static_cast<std::int64_t>(std::upper_bound(cu_.begin(), cu_.end(), token) - cu_.begin()) - 1;
  }
  /// The causal pairs of all documents: the sum of L(L+1)/2 over the document lengths L (the work
  /// of causal attention masked per document). @throws Error(size_overflow) above int64.
  std::int64_t causal_pairs() const {
    std::int64_t w = 0;
    for (std::int64_t d = 0; d < count(); ++d) w = detail::add(w, detail::half_product(length(d), length(d) + 1, "causal pairs"), "causal pairs");
    return w;
  }
  /// A 64-bit fingerprint of the documents that determines the attention mask: FNV-1a over S and
  /// the offsets of the non-empty documents, so padded forms ([0,16,40,40,40], [0,0,16,40]) and
  /// [0,16,40] agree; never 0. What the agreement records carry (RingConfig::documents).
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::fnv1a(detail::kFnvBasis, seq_len());
    for (std::size_t i = 1; i < cu_.size(); ++i)
      if (cu_[i] > cu_[i - 1]) h = detail::fnv1a(h, cu_[i - 1]);
    return h | 1u;
  }

 private:
  std::size_t at(std::int64_t d) const {
    if (d < 0 || d >= count())
      detail::fail(Errc::invalid_shape, "document " + std::to_string(d) + " is outside [0, " + std::to_string(count()) + ")");
    return static_cast<std::size_t>(d);
  }
  std::vector<std::int64_t> cu_;
};

/// How documents_partition() spreads packed documents over the ranks.
enum class DocumentSplit : std::int32_t {
  /// Every document cut into 2P balanced chunks (the first L % 2P one token longer), rank r
  /// holding chunks r and 2P−1−r of each: TransformerEngine's THD context parallelism. Balanced
  /// per document up to rounding; every rank holds a piece of every document of >= 2P tokens.
  zigzag = 0,
  /// Balanced by causal work, a document of L tokens costing L(L+1)/2: the k costliest documents
  /// cut as by `zigzag`, the others kept whole and placed greedily, costliest first (ties: the
  /// lower document), each on the least-loaded rank (ties: the lower rank). k is the smallest
  /// count that minimises the most-loaded rank's work, searched from the documents costing more
  /// than the mean share W/P up to 2P more. Deterministic: every rank computes the same split.
  balanced = 1,
};

/// Name of a document split ("zigzag", "balanced").
inline const char* to_string(DocumentSplit s) noexcept { return s == DocumentSplit::balanced ? "balanced" : "zigzag"; }

namespace detail {
/// Causal pairs of the queries [a, a + n) of a document starting at b (keys [b, s] each).
inline std::int64_t piece_work(std::int64_t b, std::int64_t a, std::int64_t n) {
  const std::int64_t first = add(a - b, 1, "causal work");
  return add(mul(n, first, "causal work"), half_product(n, n - 1, "causal work"), "causal work");
}
/// Chunk j of 2P balanced chunks of the document [b, b + L): {offset, length}.
inline std::pair<std::int64_t, std::int64_t> doc_chunk(std::int64_t b, std::int64_t L, int P, std::int64_t j) {
  const std::int64_t n = 2 * static_cast<std::int64_t>(P), q = L / n, rem = L % n;
  return {b + j * q + std::min(j, rem), q + (j < rem ? 1 : 0)};
}
/// Appends [offset, offset + length) to rank r's chunks, merged with the last when contiguous.
inline void push_run(std::vector<SeqChunk>& c, int r, std::int64_t offset, std::int64_t length) {
  if (length == 0) return;
  if (!c.empty() && c.back().rank == r && c.back().offset + c.back().length == offset) {
    c.back().length += length;
    return;
  }
  c.push_back({r, offset, length, 0});
}
/// The ranks' causal work when rank r holds zigzag chunks r and 2P−1−r of document d.
inline void add_zigzag_work(const Documents& docs, std::int64_t d, int P, std::vector<std::int64_t>& load) {
  for (int r = 0; r < P; ++r)
    for (const std::int64_t j : {static_cast<std::int64_t>(r), 2 * static_cast<std::int64_t>(P) - 1 - r}) {
      const auto [o, n] = doc_chunk(docs.begin(d), docs.length(d), P, j);
      load[static_cast<std::size_t>(r)] = add(load[static_cast<std::size_t>(r)], piece_work(docs.begin(d), o, n), "causal work");
    }
}
/// Owner of each document under `balanced` with the `k` costliest of `order` cut (-1: cut), and
/// the most-loaded rank's work.
inline std::pair<std::vector<int>, std::int64_t> place_documents(const Documents& docs, const std::vector<std::int64_t>& order,
                                                                 std::size_t k, int P) {
  std::vector<int> owner(static_cast<std::size_t>(docs.count()), -1);
  std::vector<std::int64_t> load(static_cast<std::size_t>(P), 0);
  for (std::size_t i = 0; i < k; ++i) add_zigzag_work(docs, order[i], P, load);
  for (std::size_t i = k; i < order.size(); ++i) {
    const std::size_t r = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());  // first minimum
    const std::int64_t d = order[i];
    owner[static_cast<std::size_t>(d)] = static_cast<int>(r);
    load[r] = add(load[r], piece_work(docs.begin(d), docs.begin(d), docs.length(d)), "causal work");
  }
  return {std::move(owner), *std::max_element(load.begin(), load.end())};
}
/// The owners of `balanced` (see DocumentSplit::balanced); -1 marks a document cut by zigzag.
inline std::vector<int> balanced_owners(const Documents& docs, int P) {
  std::vector<std::int64_t> order;  // the non-empty documents, costliest first, ties: lower index
  for (std::int64_t d = 0; d < docs.count(); ++d)
    if (docs.length(d) > 0) order.push_back(d);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return docs.length(a) > docs.length(b); });
  const std::int64_t share = docs.causal_pairs() / P;
  std::size_t k0 = 0;
  while (k0 < order.size() && piece_work(0, 0, docs.length(order[k0])) > share) ++k0;
  auto best = place_documents(docs, order, k0, P);
  const std::size_t last = std::min(order.size(), k0 + 2 * static_cast<std::size_t>(P));
  for (std::size_t k = k0 + 1; k <= last; ++k) {
    auto next = place_documents(docs, order, k, P);
    if (next.second < best.second) best = std::move(next);
  }
  return std::move(best.first);
}
/// Fails unless partition p's sequence is the documents' and its ranks list their chunks in
/// ascending global order (a rank's pieces of a document then lie contiguous in its tensor).
inline void check_documents_partition(const Documents& docs, const SeqPartition& p, int r, bool ordered) {
  if (p.seq_len() != docs.seq_len())
    fail(Errc::seq_lengths_mismatch, "the partition spans S=" + std::to_string(p.seq_len()) + " tokens, the documents " +
                                         std::to_string(docs.seq_len()));
  check_rank(r, p.degree());
  std::int64_t next = 0;
  for (const SeqChunk& k : p.chunks_of(r)) {
    if (k.length == 0) continue;
    if (ordered && k.offset < next)
      fail(Errc::invalid_partition, "rank " + std::to_string(r) + " lists the chunk at token " + std::to_string(k.offset) +
                                        " after one ending at " + std::to_string(next) +
                                        "; per-document views need a rank's chunks in ascending global order");
    next = k.offset + k.length;
  }
}
/// Calls f(d, a, n) for every run [a, a + n) of the global tokens of `chunks` (in list order)
/// within one document d, in list order.
template <class Chunks, class F>
void for_each_document_run(const Documents& docs, const Chunks& chunks, F&& f) {
  for (const SeqChunk& k : chunks) {
    std::int64_t a = k.offset;
    const std::int64_t end = k.offset + k.length;
    while (a < end) {
      const std::int64_t d = docs.document_of(a), n = std::min(end, docs.begin(d) + docs.length(d)) - a;
      f(d, a, n);
      a += n;
    }
  }
}
/// Calls f(d, a, n) for every run [a, a + n) of rank r's local tokens within one document d, in
/// local order.
template <class F>
void for_each_document_piece(const Documents& docs, const SeqPartition& p, int r, F&& f) {
  for_each_document_run(docs, p.chunks_of(r), f);
}
}  // namespace detail

/// The sequence partition of packed documents over P ranks (see DocumentSplit). Every rank's
/// chunks are listed in ascending global order (document order), contiguous runs of a rank merged
/// into one chunk and empty ones left out, so rank r's local tensor holds its tokens in global
/// order; a rank may hold no token (fewer tokens than ranks). Placeholders change nothing: padded
/// cu_seqlens give the partition of their non-empty documents.
/// @param docs    the packed documents, S = docs.seq_len() tokens
/// @param P       group size, in [1, 2^20]
/// @param split   zigzag (TransformerEngine's THD context parallelism) or balanced (causal work)
/// @throws Error(invalid_group) P outside [1, 2^20]; Error(size_overflow) causal work above int64.
inline SeqPartition documents_partition(const Documents& docs, int P, DocumentSplit split) {
  detail::check_group_size(P);
  std::vector<int> owner(static_cast<std::size_t>(docs.count()), -1);  // -1: zigzag
  if (split == DocumentSplit::balanced) owner = detail::balanced_owners(docs, P);
  std::vector<SeqChunk> c;
  for (int r = 0; r < P; ++r)
    for (std::int64_t d = 0; d < docs.count(); ++d) {
      const std::int64_t b = docs.begin(d), L = docs.length(d);
      if (owner[static_cast<std::size_t>(d)] == r) detail::push_run(c, r, b, L);
      if (owner[static_cast<std::size_t>(d)] != -1) continue;
      for (const std::int64_t j : {static_cast<std::int64_t>(r), 2 * static_cast<std::int64_t>(P) - 1 - r}) {
        const auto [o, n] = detail::doc_chunk(b, L, P, j);
        detail::push_run(c, r, o, n);
      }
    }
  return SeqPartition::chunks(docs.seq_len(), P, std::move(c));
}

/// Rank r's cu_seqlens for a varlen kernel over its local tokens: count() + 1 entries, entry d + 1
/// minus entry d the tokens rank r holds of document d, so that its pieces of document d are local
/// tokens [entry d, entry d + 1). One entry per document of the global list, placeholders and
/// documents the rank holds nothing of staying zero-length: every rank's list has the same length
/// (a static-shape consumer keeps its shape). Under zigzag a document's two chunks form one entry
/// (as TransformerEngine's THD cu_seqlens / P); the mask within it follows local_position_ids().
/// @param docs  the packed documents
/// @param p     a partition of the documents' S tokens whose ranks list their chunks in ascending
///              global order (documents_partition(), SeqPartition::even / balanced / zigzag)
/// @param r     the rank, in [0, P)
/// @throws Error(seq_lengths_mismatch) p.seq_len() != docs.seq_len(); Error(invalid_group) r
///         outside [0, P); Error(invalid_partition) rank r's chunks not in ascending global order.
inline std::vector<std::int64_t> local_cu_seqlens(const Documents& docs, const SeqPartition& p, int r) {
  detail::check_documents_partition(docs, p, r, true);
  std::vector<std::int64_t> cu(static_cast<std::size_t>(docs.count() + 1), 0);
  detail::for_each_document_piece(docs, p, r, [&](std::int64_t d, std::int64_t, std::int64_t n) { cu[static_cast<std::size_t>(d + 1)] += n; });
  for (std::size_t i = 1; i < cu.size(); ++i) cu[i] += cu[i - 1];
  return cu;
}

/// For each of rank r's local tokens (local order, p.local_length(r) entries) its offset within its
/// document, 0 .. L−1: the RoPE position under per-document positions.
/// @param docs  the packed documents
/// @param p     any partition of the documents' S tokens
/// @param r     the rank, in [0, P)
/// @throws Error(seq_lengths_mismatch) p.seq_len() != docs.seq_len(); Error(invalid_group) r
///         outside [0, P).
inline std::vector<std::int64_t> local_position_ids(const Documents& docs, const SeqPartition& p, int r) {
  detail::check_documents_partition(docs, p, r, false);
  std::vector<std::int64_t> pos;
  pos.reserve(static_cast<std::size_t>(p.local_length(r)));
  detail::for_each_document_piece(docs, p, r, [&](std::int64_t d, std::int64_t a, std::int64_t n) {
    for (std::int64_t t = a; t < a + n; ++t) pos.push_back(t - docs.begin(d));
  });
  return pos;
}

/// For each of rank r's local tokens (local order) its global token, 0 .. S−1 (what
/// p.global_token(r, i) gives, all at once): local token i of rank r is x[:, result[i]] of a
/// global [B, S, ...] tensor x.
/// @param docs  the packed documents
/// @param p     any partition of the documents' S tokens
/// @param r     the rank, in [0, P)
/// @throws as local_position_ids().
inline std::vector<std::int64_t> local_global_tokens(const Documents& docs, const SeqPartition& p, int r) {
  detail::check_documents_partition(docs, p, r, false);
  std::vector<std::int64_t> g;
  g.reserve(static_cast<std::size_t>(p.local_length(r)));
  for (const SeqChunk& k : p.chunks_of(r))
    for (std::int64_t t = k.offset; t < k.offset + k.length; ++t) g.push_back(t);
  return g;
}

/// The (query, key) pairs rank r's queries attend under document ∧ causal masking (a query at
/// global token s of document d attends keys [begin(d), s]): the attention work of rank r when it
/// holds its queries and all keys (all-gathered kv). Summed over the ranks: docs.causal_pairs().
/// @param docs  the packed documents
/// @param p     any partition of the documents' S tokens
/// @param r     the rank, in [0, P)
/// @throws as local_position_ids(); Error(size_overflow) above int64.
inline std::int64_t causal_work(const Documents& docs, const SeqPartition& p, int r) {
  detail::check_documents_partition(docs, p, r, false);
  std::int64_t w = 0;
  detail::for_each_document_piece(docs, p, r, [&](std::int64_t d, std::int64_t a, std::int64_t n) {
    w = detail::add(w, detail::piece_work(docs.begin(d), a, n), "causal work");
  });
  return w;
}

ULYSSES_NAMESPACE_END
