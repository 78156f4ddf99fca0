// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief How tokens are split over the group: the sequence partition (SeqChunk, SeqPartition).
///
/// A sequence partition is an ordered list of chunks (rank, global token offset, length); a rank
/// may hold several (zigzag / dual-chunk load balancing for causal attention), and its local
/// tensor holds its chunks back to back in the order they are listed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <sstream>
#include <utility>
#include <vector>

#include "../detail/checked.hpp"
#include "../error.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// The largest sequence-parallel degree accepted (far above any head count, which caps a Ulysses
/// group; a bound that keeps the per-rank tables of a plan small).
inline constexpr int kMaxDegree = 1 << 20;
inline void check_group_size(int P) {
  if (P < 1 || P > kMaxDegree)
    fail(Errc::invalid_group, "group size P=" + std::to_string(P) + " must be in [1, " + std::to_string(kMaxDegree) + "]");
}
/// Rank r of a group of P. @throws Error(invalid_group) outside [0, P).
inline void check_rank(int r, int P) {
  if (r < 0 || r >= P) fail(Errc::invalid_group, "rank " + std::to_string(r) + " is outside the group [0, " + std::to_string(P) + ")");
}
}  // namespace detail

/// One contiguous run of tokens owned by one rank.
struct SeqChunk {
  int rank = 0;                   ///< owner, in [0, P)
  std::int64_t offset = 0;        ///< first global token
  std::int64_t length = 0;        ///< tokens (may be 0)
  std::int64_t local_offset = 0;  ///< first token of the chunk in the owner's local tensor (computed)
};

/// The sequence partition: which global tokens each rank holds in the seq-sharded layout.
///
/// Invariants (checked by every factory): the chunks tile [0, S) exactly once; every rank in
/// [0, P) is valid; a rank's local tensor holds its chunks in listing order, so its local length
/// is the sum of its chunks' lengths.
class SeqPartition {
 public:
  /// Even split: rank r holds [r*S/P, (r+1)*S/P).
  /// @throws Error(invalid_group) P < 1; Error(invalid_shape) S < 1;
  ///         Error(seq_not_divisible) S % P != 0 (the message lists the P that divide S).
  static SeqPartition even(std::int64_t S, int P) {
    check(S, P);
    if (S % P != 0) {
      std::ostringstream m;
      m << "sequence length S=" << S << " is not divisible by group size P=" << P
        << "; use SeqPartition::balanced (the first S % P ranks get one more token), pad S to "
        << ((S + P - 1) / P) * P << ", or use P in " << detail::join(detail::divisors(S));
      detail::fail(Errc::seq_not_divisible, m.str());
    }
    return balanced(S, P);
  }

  /// Balanced split: the first S % P ranks hold one token more; rank r's range is contiguous.
  /// Ranks hold 0 tokens when S < P. @throws as even(), except seq_not_divisible.
  static SeqPartition balanced(std::int64_t S, int P) {
    check(S, P);
    std::vector<std::int64_t> len(static_cast<std::size_t>(P));
    for (std::size_t r = 0; r < len.size(); ++r) len[r] = S / P + (static_cast<std::int64_t>(r) < S % P ? 1 : 0);
    return lengths(len);
  }

  /// Explicit per-rank lengths (zeros allowed): rank r holds one contiguous range, ranks in order.
  /// S = the sum. @throws Error(invalid_group) empty list; Error(seq_lengths_mismatch) a negative
  /// length or a zero sum.
  static SeqPartition lengths(const std::vector<std::int64_t>& len) {
    detail::check_group_size(static_cast<int>(len.size()));
    std::vector<SeqChunk> c;
    std::int64_t off = 0;
    for (std::size_t r = 0; r < len.size(); ++r) {
      if (len[r] < 0)
        detail::fail(Errc::seq_lengths_mismatch, "sequence length of rank " + std::to_string(r) + " is " +
                                                     std::to_string(len[r]) + "; lengths must be >= 0");
      c.push_back({static_cast<int>(r), off, len[r], 0});
      off = detail::add(off, len[r], "sum of sequence lengths");
    }
    return chunks(off, static_cast<int>(len.size()), std::move(c));
  }

  /// Explicit per-rank lengths that must add up to S.
  /// @throws Error(seq_lengths_mismatch) when the count differs from P or the sum from S.
  static SeqPartition lengths(std::int64_t S, int P, const std::vector<std::int64_t>& len) {
    check(S, P);
    if (static_cast<std::int64_t>(len.size()) != P)
      detail::fail(Errc::seq_lengths_mismatch, std::to_string(len.size()) + " sequence lengths given for group size P=" +
                                                   std::to_string(P) + "; give one per rank");
    SeqPartition p = lengths(len);
    if (p.S_ != S)
      detail::fail(Errc::seq_lengths_mismatch, "sequence lengths " + detail::join(len) + " sum to " +
                                                   std::to_string(p.S_) + ", not to S=" + std::to_string(S));
    return p;
  }

  /// Zigzag (dual-chunk) split for causal load balance: the sequence is cut into 2P balanced
  /// chunks and rank r holds chunks r and 2P-1-r, in that order (as in Megatron-LM's context
  /// parallelism and yunchang's "zigzag" ring attention). @throws as balanced().
  static SeqPartition zigzag(std::int64_t S, int P) {
    check(S, P);
    const std::int64_t n = 2 * static_cast<std::int64_t>(P);
    std::vector<std::int64_t> off(static_cast<std::size_t>(n + 1), 0);
    for (std::size_t i = 0; i + 1 < off.size(); ++i) off[i + 1] = off[i] + S / n + (static_cast<std::int64_t>(i) < S % n ? 1 : 0);
    std::vector<SeqChunk> c;
    for (int r = 0; r < P; ++r) {  // chunks r and 2P-1-r
      for (const auto j : {static_cast<std::size_t>(r), static_cast<std::size_t>(n - 1 - r)}) c.push_back({r, off[j], off[j + 1] - off[j], 0});
    }
    return chunks(S, P, std::move(c));
  }

  /// Any list of chunks (rank, offset, length); local_offset is computed. The chunks must tile
  /// [0, S) exactly once. @throws Error(invalid_group) a rank outside [0, P);
  /// Error(invalid_partition) gaps, overlaps or negative lengths.
  static SeqPartition chunks(std::int64_t S, int P, std::vector<SeqChunk> c) {
    detail::check_group_size(P);
    if (S < 1) detail::fail(Errc::invalid_shape, "sequence length S=" + std::to_string(S) + " must be >= 1");
    std::vector<std::int64_t> local(static_cast<std::size_t>(P), 0);
    std::vector<std::pair<std::int64_t, std::int64_t>> cover;
    for (auto& k : c) {
      if (k.rank < 0 || k.rank >= P)
        detail::fail(Errc::invalid_group, "sequence chunk names rank " + std::to_string(k.rank) +
                                              " outside the group [0, " + std::to_string(P) + ")");
      if (k.length < 0 || k.offset < 0 || k.offset > S)
        detail::fail(Errc::invalid_partition, "sequence chunk at offset " + std::to_string(k.offset) + " has length " +
                                                  std::to_string(k.length) + "; both must be >= 0 and the offset <= S=" +
                                                  std::to_string(S));
      detail::add(k.offset, k.length, "end of a sequence chunk");
      std::int64_t& mine = local[static_cast<std::size_t>(k.rank)];
      k.local_offset = mine;
      mine = detail::add(mine, k.length, "tokens of a rank");
      if (k.length) cover.emplace_back(k.offset, k.length);
    }
    std::sort(cover.begin(), cover.end());
    std::int64_t next = 0;
    for (auto& [o, l] : cover) {
      if (o != next)
        detail::fail(Errc::invalid_partition, "sequence chunks do not tile [0, S=" + std::to_string(S) + "): " +
                                                  (o < next ? "overlap" : "gap") + " at token " + std::to_string(std::min(o, next)));
      next = o + l;
    }
    if (next != S)
      detail::fail(Errc::seq_lengths_mismatch, "sequence chunks cover " + std::to_string(next) + " tokens, not S=" +
                                                   std::to_string(S));
    SeqPartition p;
    p.S_ = S;
    p.P_ = P;
    p.chunks_ = std::move(c);
    p.local_ = std::move(local);
    return p;
  }

  std::int64_t seq_len() const { return S_; }  ///< S, global tokens
  int degree() const { return P_; }             ///< P
  /// Tokens rank r holds in the seq-sharded layout (S_r).
  /// @throws Error(invalid_group) r outside [0, P).
  std::int64_t local_length(int r) const {
    detail::check_rank(r, P_);
    return local_[static_cast<std::size_t>(r)];
  }
  /// The global token of rank r's first local token (the offset of its first non-empty chunk):
  /// for the splits whose ranks hold one contiguous range (even, balanced, lengths), rank r's
  /// seq-sharded tensor holds global tokens [first_token(r), first_token(r) + local_length(r)). A
  /// rank holding no token gets where its first (empty) chunk would start, S when it has none.
  /// @throws Error(invalid_group) r outside [0, P).
  std::int64_t first_token(int r) const {
    detail::check_rank(r, P_);
    std::int64_t empty_at = S_;
    for (const SeqChunk& k : chunks_) {
      if (k.rank != r) continue;
      if (k.length > 0) return k.offset;
      empty_at = std::min(empty_at, k.offset);
    }
    return empty_at;
  }
  /// The global token (0 .. S-1) at local index `local` (0 .. local_length(r) - 1) of rank r's
  /// seq-sharded tensor, for every split (zigzag and other multi-chunk splits included): how a rank
  /// fills its shard of a global [B, S, H, D] tensor x: local token i of rank r is
  /// x[:, global_token(r, i)]. O(chunks of r).
  /// @throws Error(invalid_group) r outside [0, P); Error(invalid_shape) `local` outside
  ///         [0, local_length(r)).
  std::int64_t global_token(int r, std::int64_t local) const {
    detail::check_rank(r, P_);
    for (const SeqChunk& k : chunks_)
      if (k.rank == r && local >= k.local_offset && local < k.local_offset + k.length) return k.offset + (local - k.local_offset);
    detail::fail(Errc::invalid_shape, "local token " + std::to_string(local) + " is outside rank " + std::to_string(r) +
                                          "'s local tokens [0, " + std::to_string(local_length(r)) + ")");
  }
  /// The rank holding global token `token` (0 .. S-1) in the seq-sharded layout, and its local
  /// index there: {rank, local index}. O(chunks).
  /// @throws Error(invalid_shape) `token` outside [0, S).
  std::pair<int, std::int64_t> locate(std::int64_t token) const {
    for (const SeqChunk& k : chunks_)
      if (token >= k.offset && token < k.offset + k.length) return {k.rank, k.local_offset + (token - k.offset)};
    detail::fail(Errc::invalid_shape, "token " + std::to_string(token) + " is outside the sequence [0, " + std::to_string(S_) + ")");
  }
  /// All chunks, in listing order.
  const std::vector<SeqChunk>& chunks() const { return chunks_; }
  /// Rank r's chunks in its local order. @throws Error(invalid_group) r outside [0, P).
  std::vector<SeqChunk> chunks_of(int r) const {
    detail::check_rank(r, P_);
    std::vector<SeqChunk> out;
    for (auto& k : chunks_)
      if (k.rank == r) out.push_back(k);
    return out;
  }

  friend bool operator==(const SeqPartition& a, const SeqPartition& b) {
    if (a.S_ != b.S_ || a.P_ != b.P_ || a.chunks_.size() != b.chunks_.size()) return false;
    for (std::size_t i = 0; i < a.chunks_.size(); ++i)
      if (a.chunks_[i].rank != b.chunks_[i].rank || a.chunks_[i].offset != b.chunks_[i].offset ||
          a.chunks_[i].length != b.chunks_[i].length)
        return false;
    return true;
  }

 private:
  static void check(std::int64_t S, int P) {
    detail::check_group_size(P);
    if (S < 1) detail::fail(Errc::invalid_shape, "sequence length S=" + std::to_string(S) + " must be >= 1");
  }
  std::int64_t S_ = 0;
  int P_ = 0;
  std::vector<SeqChunk> chunks_;
  std::vector<std::int64_t> local_;
};

ULYSSES_NAMESPACE_END
