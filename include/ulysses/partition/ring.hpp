// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The 2-D sequence partition of Ulysses × Ring: U Ulysses ranks × R ring ranks, zigzag
///        (causal load balance) or contiguous (RingPartition), and what every rank of a hybrid
///        agrees on (RingConfig, which a Plan's options carry).
///
/// World rank w = ring_rank · U + ulysses_rank; ring rank j holds chunks j and 2R−1−j of 2R
/// (zigzag, yunchang's zigzag_extract_local with balanced cuts) or range j of R (contiguous), cut
/// into U balanced pieces. After seq→head in ring group j every rank holds the L_j tokens of its
/// ring rank in ascending global order ("ring-local" token i = ring_token(j, i)).
/// See docs/ring.md ("Ranks, tokens and shapes").
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../detail/checked.hpp"
#include "../error.hpp"
#include "documents.hpp"
#include "seq.hpp"

ULYSSES_NAMESPACE_BEGIN

/// How a ring cuts the sequence (see the file comment).
enum class RingLayout : std::int32_t {
  contiguous = 0,  ///< ring rank j: the j-th of R balanced ranges (non-causal attention)
  zigzag = 1,      ///< ring rank j: chunks j and 2R−1−j of 2R (causal load balance)
};

/// Name of a ring layout ("contiguous", "zigzag").
inline const char* to_string(RingLayout l) noexcept { return l == RingLayout::zigzag ? "zigzag" : "contiguous"; }

/// The 2-D sequence partition of U Ulysses ranks × R ring ranks over S tokens (see the file
/// comment). Immutable, integers only; every rank computes the same one from (S, U, R, layout).
class RingPartition {
 public:
  /// @param S       global sequence length, tokens; S >= 2R for zigzag (each chunk a token), S >= R
  ///                for contiguous (each ring rank a token); any S otherwise (uneven lengths work)
  /// @param U       Ulysses degree, >= 1
  /// @param R       ring degree, >= 1
  /// @param layout  zigzag (causal) or contiguous
  /// @throws Error(invalid_group) U or R outside [1, 2^20], or U·R above it;
  ///         Error(invalid_shape) S < 2R (zigzag) or S < R (contiguous): a ring rank without a
  ///         token (the message says the smallest S).
  RingPartition(std::int64_t S, int U, int R, RingLayout layout) : S_(S), U_(U), R_(R), layout_(layout) {
    check_degrees(U, R);
    const std::int64_t n = layout == RingLayout::zigzag ? 2 * static_cast<std::int64_t>(R) : R;
    if (S < n)
      detail::fail(Errc::invalid_shape, "ring partition of S=" + std::to_string(S) + " tokens over R=" + std::to_string(R) +
                                            " ring ranks (" + to_string(layout) + "): needs S >= " + std::to_string(n) +
                                            " so that every " + (layout == RingLayout::zigzag ? "chunk" : "ring rank") +
                                            " holds a token");
    std::vector<std::int64_t> off(static_cast<std::size_t>(n + 1), 0);
    for (std::size_t i = 0; i + 1 < off.size(); ++i) off[i + 1] = off[i] + S / n + (static_cast<std::int64_t>(i) < S % n ? 1 : 0);
    for (int j = 0; j < R; ++j) {
      std::vector<SeqChunk> c;
      std::int64_t local = 0;  // the chunk's first ring-local token
      const auto add = [&](std::int64_t i) {
        const std::int64_t len = off[static_cast<std::size_t>(i + 1)] - off[static_cast<std::size_t>(i)];
        c.push_back({j, off[static_cast<std::size_t>(i)], len, local});
        local += len;
      };
      add(j);
      if (layout == RingLayout::zigzag) add(n - 1 - j);
      chunks_.push_back(std::move(c));
    }
  }

  /// Packed documents, per-document zigzag (TransformerEngine's THD context parallelism, case C20):
  /// every document cut into 2R balanced chunks (the first L % 2R one token longer), ring rank j
  /// holding chunks j and 2R−1−j of each, in document order (contiguous runs merged), each ring
  /// rank's tokens cut into U balanced pieces as for one sequence. layout() is zigzag; ring_work()
  /// then gives each step its document blocks (RingMask::blocks). Documents shorter than 2R leave
  /// some ring ranks nothing of them.
  /// @param docs  the packed documents (S = docs.seq_len())
  /// @param U     Ulysses degree, >= 1
  /// @param R     ring degree, >= 1
  /// @throws Error(invalid_group) U or R outside [1, 2^20], or U·R above it; Error(invalid_shape)
  ///         a ring rank left without a token (too few tokens in documents of >= 1 token for 2R
  ///         chunks; the message names it).
  RingPartition(const Documents& docs, int U, int R) : S_(docs.seq_len()), U_(U), R_(R), layout_(RingLayout::zigzag), docs_(docs) {
    check_degrees(U, R);
    const SeqPartition zigzag = documents_partition(docs, R, DocumentSplit::zigzag);  // ring rank j = rank j of R
    for (int j = 0; j < R; ++j) {
      std::vector<SeqChunk> c;
      for (const SeqChunk& k : zigzag.chunks_of(j))
        if (k.length > 0) c.push_back(k);
      if (c.empty())
        detail::fail(Errc::invalid_shape, "ring partition of packed documents (S=" + std::to_string(S_) + ", " +
                                              std::to_string(docs.non_empty()) + " non-empty documents) over R=" + std::to_string(R) +
                                              " ring ranks: ring rank " + std::to_string(j) +
                                              " holds no token (each document is cut into 2R chunks); use a smaller R");
      chunks_.push_back(std::move(c));
    }
  }

  bool has_documents() const { return docs_.has_value(); }  ///< made from packed documents
  /// The packed documents. @throws Error(invalid_partition) a partition not made from documents.
  const Documents& documents() const {
    if (!docs_) detail::fail(Errc::invalid_partition, "this ring partition was not made from packed documents");
    return *docs_;
  }
  std::int64_t seq_len() const { return S_; }       ///< S, global tokens
  int ulysses_degree() const { return U_; }          ///< U
  int ring_degree() const { return R_; }             ///< R
  int degree() const { return U_ * R_; }             ///< P = U·R, the world of one partition
  RingLayout layout() const { return layout_; }      ///< zigzag or contiguous
  /// World rank of (ring rank j, Ulysses rank u): j·U + u. @throws Error(invalid_group) out of range.
  int world_rank(int j, int u) const {
    detail::check_rank(j, R_);
    detail::check_rank(u, U_);
    return j * U_ + u;
  }
  /// Ring rank of world rank w (w / U). @throws Error(invalid_group) w outside [0, U·R).
  int ring_rank(int w) const {
    detail::check_rank(w, degree());
    return w / U_;
  }
  /// Ulysses rank of world rank w (w % U). @throws Error(invalid_group) w outside [0, U·R).
  int ulysses_rank(int w) const {
    detail::check_rank(w, degree());
    return w % U_;
  }

  /// Ring rank j's global token ranges, ascending: {chunk j, chunk 2R−1−j} (zigzag) or {range j},
  /// as SeqChunks (rank: j; offset, length: global tokens; local_offset: the chunk's first
  /// ring-local token). @throws Error(invalid_group) j outside [0, R).
  const std::vector<SeqChunk>& ring_chunks(int j) const {
    detail::check_rank(j, R_);
    return chunks_[static_cast<std::size_t>(j)];
  }
  /// L_j: the tokens of ring rank j (its kv block and its queries after seq→head).
  /// @throws Error(invalid_group) j outside [0, R).
  std::int64_t ring_length(int j) const {
    std::int64_t n = 0;
    for (const SeqChunk& c : ring_chunks(j)) n += c.length;
    return n;
  }
  /// The longest L_j (what a ring buffer must hold).
  std::int64_t max_ring_length() const {
    std::int64_t m = 0;
    for (int j = 0; j < R_; ++j) m = std::max(m, ring_length(j));
    return m;
  }
  /// The global token of ring-local token i (0 .. L_j − 1) of ring rank j.
  /// @throws Error(invalid_group) j outside [0, R); Error(invalid_shape) i outside [0, L_j).
  std::int64_t ring_token(int j, std::int64_t i) const {
    std::int64_t at = i;
    for (const SeqChunk& c : ring_chunks(j)) {
      if (at >= 0 && at < c.length) return c.offset + at;
      at -= c.length;
    }
    detail::fail(Errc::invalid_shape, "ring-local token " + std::to_string(i) + " is outside ring rank " + std::to_string(j) +
                                          "'s tokens [0, " + std::to_string(ring_length(j)) + ")");
  }

  /// The sequence partition of ring group j's Ulysses exchange: P = U ranks over the L_j
  /// ring-local tokens, Ulysses rank u holding the u-th balanced piece (one contiguous ring-local
  /// range). Give it to the Plan of the group (q, k, v, o: Plan({U, u}, B, ulysses_partition(j),
  /// specs, ...)): seq→head then gives every rank all L_j tokens in ring-local (= ascending
  /// global) order. @throws Error(invalid_group) j outside [0, R).
  SeqPartition ulysses_partition(int j) const { return SeqPartition::balanced(ring_length(j), U_); }

  /// The whole world's seq-sharded partition: P = U·R ranks over [0, S), world rank j·U + u
  /// holding the global tokens of its piece (one or two SeqChunks: a piece straddling the pair's
  /// chunks is two), in ring-local order. How a rank fills its shard of a global [B, S, H, D]
  /// tensor x: local token i of world rank w is x[:, seq_partition().global_token(w, i)].
  SeqPartition seq_partition() const {
    std::vector<SeqChunk> c;
    for (int j = 0; j < R_; ++j) {
      const SeqPartition up = ulysses_partition(j);
      for (int u = 0; u < U_; ++u) {
        std::int64_t a = up.first_token(u), left = up.local_length(u);  // ring-local [a, a + left)
        std::int64_t base = 0;
        for (const SeqChunk& k : ring_chunks(j)) {
          const std::int64_t lo = std::max(a, base), hi = std::min(a + left, base + k.length);
          if (hi > lo) c.push_back({j * U_ + u, k.offset + (lo - base), hi - lo, 0});
          base += k.length;
        }
        if (left == 0) c.push_back({j * U_ + u, ring_chunks(j).front().offset, 0, 0});
      }
    }
    return SeqPartition::chunks(S_, degree(), std::move(c));
  }

 private:
  static void check_degrees(int U, int R) {
    detail::check_group_size(U);
    detail::check_group_size(R);
    if (static_cast<std::int64_t>(U) * R > detail::kMaxDegree)
      detail::fail(Errc::invalid_group, "U x R = " + std::to_string(static_cast<std::int64_t>(U) * R) + " ranks exceeds " +
                                            std::to_string(detail::kMaxDegree));
  }

  std::int64_t S_;
  int U_, R_;
  RingLayout layout_;
  std::optional<Documents> docs_;
  std::vector<std::vector<SeqChunk>> chunks_;
};

/// The most messages a ring block may be cut into (RingConfig::messages).
inline constexpr int kMaxRingMessages = 64;

/// Where piece i of a ring block of `bytes` cut into `messages` pieces begins (RingConfig::messages):
/// min(bytes, ⌈i · bytes / messages⌉ rounded up to a multiple of 4096); piece i spans
/// [begin(i), begin(i + 1)), so that every rank cuts a block alike (a small block's last pieces may be
/// empty). @pre 1 <= messages <= kMaxRingMessages, 0 <= i <= messages.
inline std::size_t ring_piece_begin(std::size_t bytes, int messages, int i) noexcept {
  if (i >= messages) return bytes;
  const std::size_t m = static_cast<std::size_t>(messages), k = static_cast<std::size_t>(i);
  const std::size_t at = bytes / m * k + (bytes % m * k + m - 1) / m;  // ⌈k·bytes/m⌉ without overflow
  const std::size_t page = (at + 4095) / 4096 * 4096;
  return page < bytes ? page : bytes;
}

/// What every rank of a Ulysses × Ring hybrid must agree on: check_ring_config()
/// (ring/agreement.hpp) checks it across ranks, and a Ulysses group's Plan made with
/// PlanOptions::ring carries it in its agreement record (plan/agreement.hpp).
struct RingConfig {
  int ulysses_degree = 1;                    ///< U
  int ring_degree = 1;                       ///< R
  RingLayout layout = RingLayout::zigzag;    ///< zigzag or contiguous
  bool causal = true;                        ///< causal attention
  std::int64_t seq_len = 0;                  ///< S, global tokens
  /// Messages a ring step's block goes in over a message transport (the wire split; every rank
  /// the same, or the peers' posts do not match): 1 = the k|v block as one message; n > 1 = n
  /// pieces of nearly equal size cut at 4 KiB multiples (n = 2: k and v when D = Dv). The
  /// window and in-process paths copy the block in place and ignore it. Choose it by measurement
  /// (measure_ring_split(), tune/ring_split.hpp) or by the cost model (best_ring_messages(),
  /// tune/ring_cost.hpp). 1 .. kMaxRingMessages.
  int messages = 1;
  /// Packed documents: Documents::fingerprint() of the partition's documents (the attention mask
  /// depends on them), 0 for one sequence.
  std::uint64_t documents = 0;
  /// How k|v cross the ring ranks: false, the ring rotation (R steps); true, one all-gather of
  /// the ring group's k|v (U × AG, DistributedAttentionPlan::allgather(const RingPlan&)). Ranks
  /// that mix the two would pair a rotation's messages with a gather's.
  bool allgather_kv = false;
  /// The configuration of a partition, a causal flag and a wire split.
  static RingConfig of(const RingPartition& p, bool causal, int messages = 1) {
    return {p.ulysses_degree(), p.ring_degree(), p.layout(), causal, p.seq_len(), messages,
            p.has_documents() ? p.documents().fingerprint() : 0, false};
  }
};

ULYSSES_NAMESPACE_END
