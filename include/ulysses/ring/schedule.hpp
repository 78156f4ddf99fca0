// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The ring schedule: at each ring step, which query range of a rank attends which range of
///        the kv block it holds, with which mask (RingWork, ring_schedule()). Pure integers, no
///        communicator: an engine can run it with its own transport.
///
/// At step s ring rank r holds the block of ring rank (r − s) mod R; indices are ring-local. The
/// causal zigzag rule is zhuzilin's ring-flash-attention's and yunchang's; causal contiguous skips
/// the later sources; non-causal attends everything. Merge the steps in step order (ring/merge.hpp)
/// for the same bits on every run. See docs/ring.md ("The schedule").
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../partition/ring.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The mask of one ring step's attention.
enum class RingMask : std::int32_t {
  none = 0,    ///< every query row of the range attends every kv row of the range
  causal = 1,  ///< q row i attends kv row k iff k <= i (indices relative to the ranges' starts; the
               ///< ranges have equal length and start at 0: the diagonal block, top-left = bottom-right)
  /// Packed documents: the attention is the union of the step's RingBlocks (RingWork::blocks),
  /// each a rectangle of rows with mask none or causal; a pair no block covers is masked. What
  /// document ∧ causal (or document-only) masking leaves of a step (ring_work() of a partition
  /// made from Documents). A kernel that only knows `causal` must not take such a step.
  blocks = 2,
};

/// Name of a ring mask ("none", "causal", "blocks").
inline const char* to_string(RingMask m) noexcept {
  return m == RingMask::causal ? "causal" : m == RingMask::blocks ? "blocks" : "none";
}

/// One rectangle of a step's attention under packed documents (RingMask::blocks): query rows
/// [q_begin, q_begin + q_len) against kv rows [kv_begin, kv_begin + kv_len), rows counted as the
/// step's ranges count them (ring-local rows of the rank's queries and of the block held), with
/// `mask` none (every pair) or causal (a square, q_len == kv_len: row q_begin + i attends kv row
/// kv_begin + k iff k <= i). The rows of one block belong to one document. In FlashAttention's
/// varlen terms a block is one "sequence": cu_seqlens_q = q_begin, seqused_q = q_len, likewise k.
struct RingBlock {
  std::int64_t q_begin = 0;   ///< first query row
  std::int64_t q_len = 0;     ///< query rows (>= 1)
  std::int64_t kv_begin = 0;  ///< first kv row
  std::int64_t kv_len = 0;    ///< kv rows (>= 1)
  RingMask mask = RingMask::none;  ///< none or causal
  std::int64_t document = 0;  ///< the document (index into the global cu_seqlens) its rows belong to
  /// Whether query row i attends kv row k inside this block.
  bool attends(std::int64_t i, std::int64_t k) const {
    if (i < q_begin || i >= q_begin + q_len || k < kv_begin || k >= kv_begin + kv_len) return false;
    return mask == RingMask::none || (k - kv_begin) <= (i - q_begin);
  }
  /// The (query, key) pairs the block attends.
  std::int64_t pairs() const { return mask == RingMask::causal ? q_len * (q_len + 1) / 2 : q_len * kv_len; }
};

/// Equality of blocks (every field).
inline bool operator==(const RingBlock& a, const RingBlock& b) {
  return a.q_begin == b.q_begin && a.q_len == b.q_len && a.kv_begin == b.kv_begin && a.kv_len == b.kv_len && a.mask == b.mask &&
         a.document == b.document;
}

/// One ring step's attention on one rank: queries [q_begin, q_begin + q_len) of the rank's L_q
/// ring-local tokens against kv rows [kv_begin, kv_begin + kv_len) of the block it holds at the
/// step (the block of ring rank `source`, L_kv tokens), with `mask`. Token counts.
struct RingWork {
  int step = 0;                ///< s, 0 .. R−1
  int source = 0;              ///< ring rank whose kv block is held at the step: (r − s) mod R
  std::int64_t q_begin = 0;    ///< first query row (ring-local)
  std::int64_t q_len = 0;      ///< query rows (0: nothing to do)
  std::int64_t kv_begin = 0;   ///< first kv row of the block
  std::int64_t kv_len = 0;     ///< kv rows (0: nothing to do)
  RingMask mask = RingMask::none;  ///< the mask inside the ranges
  std::int64_t L_q = 0;        ///< the rank's query tokens, L_r
  std::int64_t L_kv = 0;       ///< the block's tokens, L_source
  /// With mask == RingMask::blocks (packed documents): the rectangles the step attends, rows
  /// relative to q_begin and kv_begin (which are 0 then), in document order, disjoint. Empty
  /// otherwise.
  std::vector<RingBlock> blocks;
  /// True when the step contributes nothing (no query row or no kv row): skip the attention, merge nothing.
  bool empty() const { return q_len == 0 || kv_len == 0; }
  /// Whether query row i (ring-local, 0 .. L_q − 1) attends kv row k (0 .. L_kv − 1) at this step:
  /// the brute-force form of the ranges, the mask and the blocks.
  bool attends(std::int64_t i, std::int64_t k) const {
    if (i < q_begin || i >= q_begin + q_len || k < kv_begin || k >= kv_begin + kv_len) return false;
    if (mask == RingMask::blocks) {
      for (const RingBlock& b : blocks)
        if (b.attends(i - q_begin, k - kv_begin)) return true;
      return false;
    }
    return mask == RingMask::none || (k - kv_begin) <= (i - q_begin);
  }
  /// The (query, key) pairs the step attends (its work).
  std::int64_t pairs() const {
    if (empty()) return 0;
    if (mask == RingMask::blocks) {
      std::int64_t n = 0;
      for (const RingBlock& b : blocks) n += b.pairs();
      return n;
    }
    return mask == RingMask::causal ? q_len * (q_len + 1) / 2 : q_len * kv_len;
  }
};

namespace detail {
/// A run of rows of one document: global tokens [token, token + length), rows [row, row + length).
struct DocumentRun {
  std::int64_t document, token, row, length;
};
/// The runs of `chunks` (SeqChunks in row order: offset = global token; rows counted from 0 in
/// list order) cut at document boundaries.
inline std::vector<DocumentRun> document_runs(const Documents& docs, const std::vector<SeqChunk>& chunks) {
  std::vector<DocumentRun> v;
  std::int64_t row = 0;
  for_each_document_run(docs, chunks, [&](std::int64_t d, std::int64_t a, std::int64_t n) {
    v.push_back({d, a, row, n});
    row += n;
  });
  return v;
}
/// Appends block b to v, merged with the last block when both are unmasked rectangles of one
/// document that continue each other (the same kv rows and the next q rows, or the reverse).
inline void push_block(std::vector<RingBlock>& v, const RingBlock& b) {
  if (b.q_len <= 0 || b.kv_len <= 0) return;
  if (!v.empty() && b.mask == RingMask::none && v.back().mask == RingMask::none && v.back().document == b.document) {
    RingBlock& l = v.back();
    if (l.kv_begin == b.kv_begin && l.kv_len == b.kv_len && l.q_begin + l.q_len == b.q_begin) {
      l.q_len += b.q_len;
      return;
    }
    if (l.q_begin == b.q_begin && l.q_len == b.q_len && l.kv_begin + l.kv_len == b.kv_begin) {
      l.kv_len += b.kv_len;
      return;
    }
  }
  v.push_back(b);
}
/// The blocks of one pair of runs of one document under causal masking (query at token s attends
/// key t iff t <= s): kv tokens before the queries' first, all queries; the tokens the two share, a
/// causal square, and the queries after it against them; kv tokens after the last query, none.
inline void causal_run_blocks(std::vector<RingBlock>& v, const DocumentRun& q, const DocumentRun& k) {
  const std::int64_t a = q.token, n = q.length, c = k.token, m = k.length;
  if (c + m <= a) return push_block(v, {q.row, n, k.row, m, RingMask::none, q.document});  // every key before every query
  if (c >= a + n) return;                                                                    // every key after every query
  if (c < a) push_block(v, {q.row, n, k.row, a - c, RingMask::none, q.document});           // keys [c, a): all queries
  const std::int64_t c1 = std::max(c, a), e = std::min(c + m, a + n);                        // shared tokens [c1, e)
  push_block(v, {q.row + (c1 - a), e - c1, k.row + (c1 - c), e - c1, RingMask::causal, q.document});
  if (e < a + n) push_block(v, {q.row + (e - a), a + n - e, k.row + (c1 - c), e - c1, RingMask::none, q.document});
}
}  // namespace detail

/// The blocks of document ∧ causal (or, with causal false, document-only) attention between query
/// rows and kv rows given as their global tokens (SeqChunks in row order, each ascending; rows
/// numbered from 0 in list order): for every document, its query rows against its kv rows. When a
/// document's query and kv rows hold the same tokens in the same rows (the diagonal step), its
/// block is one causal square (or one full square); otherwise each pair of runs gives at most three
/// rectangles (causal_run_blocks), adjacent unmasked rectangles merged. Row i attends key k iff
/// some block says so, which is exactly: same document, and (causal) key token <= query token.
/// @param docs    the packed documents
/// @param q       the query rows' global tokens, as SeqChunks in row order
/// @param kv      the kv rows' global tokens, likewise
/// @param causal  document ∧ causal, or document-only
/// @throws Error(invalid_shape) a token outside [0, docs.seq_len()).
inline std::vector<RingBlock> document_blocks(const Documents& docs, const std::vector<SeqChunk>& q, const std::vector<SeqChunk>& kv,
                                              bool causal) {
  const std::vector<detail::DocumentRun> qr = detail::document_runs(docs, q), kr = detail::document_runs(docs, kv);
  std::vector<RingBlock> v;
  std::size_t k0 = 0;
  for (std::size_t i = 0; i < qr.size();) {
    std::size_t i1 = i;  // the query runs of document d: [i, i1)
    const std::int64_t d = qr[i].document;
    while (i1 < qr.size() && qr[i1].document == d) ++i1;
    while (k0 < kr.size() && kr[k0].document < d) ++k0;
    std::size_t k1 = k0;  // its kv runs: [k0, k1)
    while (k1 < kr.size() && kr[k1].document == d) ++k1;
    bool same = i1 - i == k1 - k0;  // the same tokens in the same rows
    for (std::size_t x = 0; same && x < i1 - i; ++x)
      same = qr[i + x].token == kr[k0 + x].token && qr[i + x].length == kr[k0 + x].length && qr[i + x].row - qr[i].row == kr[k0 + x].row - kr[k0].row;
    if (k1 > k0) {
      const std::int64_t qrows = qr[i1 - 1].row + qr[i1 - 1].length - qr[i].row, krows = kr[k1 - 1].row + kr[k1 - 1].length - kr[k0].row;
      const bool q_contiguous = qrows == [&] { std::int64_t n = 0; for (std::size_t x = i; x < i1; ++x) n += qr[x].length; return n; }();
      const bool k_contiguous = krows == [&] { std::int64_t n = 0; for (std::size_t x = k0; x < k1; ++x) n += kr[x].length; return n; }();
      if (same && q_contiguous) {
        detail::push_block(v, {qr[i].row, qrows, kr[k0].row, krows, causal ? RingMask::causal : RingMask::none, d});
      } else if (!causal && q_contiguous && k_contiguous) {
        detail::push_block(v, {qr[i].row, qrows, kr[k0].row, krows, RingMask::none, d});
      } else {
        for (std::size_t x = i; x < i1; ++x)
          for (std::size_t y = k0; y < k1; ++y) {
            if (causal)
              detail::causal_run_blocks(v, qr[x], kr[y]);
            else
              detail::push_block(v, {qr[x].row, qr[x].length, kr[y].row, kr[y].length, RingMask::none, d});
          }
      }
    }
    i = i1;
  }
  return v;
}

/// The ring rank whose kv block ring rank r holds at step s: (r − s) mod R.
/// @throws Error(invalid_group) r outside [0, R) or s outside [0, R).
inline int ring_source(int r, int s, int R) {
  detail::check_group_size(R);
  detail::check_rank(r, R);
  if (s < 0 || s >= R)
    detail::fail(Errc::invalid_group, "ring step " + std::to_string(s) + " is outside [0, R=" + std::to_string(R) + ")");
  return ((r - s) % R + R) % R;
}

/// Ring rank r's work at step s (see the file comment), for a causal or a non-causal attention.
/// A partition of packed documents (RingPartition(Documents, U, R)) gives mask RingMask::blocks:
/// the ranges cover all rows (or none, when no block is left), and `blocks` are
/// document_blocks() of ring rank r's tokens against the source's.
/// @throws Error(invalid_group) r or s outside [0, R).
inline RingWork ring_work(const RingPartition& part, int r, int s, bool causal) {
  const int R = part.ring_degree();
  RingWork w;
  w.step = s;
  w.source = ring_source(r, s, R);
  w.L_q = part.ring_length(r);
  w.L_kv = part.ring_length(w.source);
  w.q_len = w.L_q;
  w.kv_len = w.L_kv;
  if (part.has_documents()) {
    w.mask = RingMask::blocks;
    w.blocks = document_blocks(part.documents(), part.ring_chunks(r), part.ring_chunks(w.source), causal);
    if (w.blocks.empty()) w.q_len = w.kv_len = 0;
    return w;
  }
  if (!causal) return w;
  if (w.source == r) {
    w.mask = RingMask::causal;
  } else if (part.layout() == RingLayout::zigzag) {
    if (w.source < r) {
      w.kv_len = part.ring_chunks(w.source).front().length;
    } else {
      w.q_begin = part.ring_chunks(r).front().length;
      w.q_len = w.L_q - w.q_begin;
    }
  } else if (w.source > r) {
    w.q_len = 0;
    w.kv_len = 0;
  }
  return w;
}

/// Ring rank r's whole schedule: ring_work(part, r, s, causal) for s = 0 .. R−1, in step order.
/// @throws Error(invalid_group) r outside [0, R).
inline std::vector<RingWork> ring_schedule(const RingPartition& part, int r, bool causal) {
  std::vector<RingWork> v;
  for (int s = 0; s < part.ring_degree(); ++s) v.push_back(ring_work(part, r, s, causal));
  return v;
}

/// The last ring step at which some ring rank attends each ring rank's kv block: entry j is the
/// largest s in [0, R) such that ring_work(part, (j + s) mod R, s, causal) is not empty (−1 when
/// no step attends it: a rank with no tokens). A rotation carries block j from step s to step s + 1
/// only while s < entry j: past its last use no ring rank reads it, and its message is skipped on
/// every transport (RingRotation, RingGradRotation's kv blocks). Every step attends its block
/// under zigzag causal and non-causal attention (nothing skipped); contiguous causal attention
/// reads block j only up to step R − 1 − j (the ranks after j), and packed documents only while a
/// later rank holds tokens of one of the block's documents (TransformerEngine's THD ring also
/// skips the masked steps' compute, but sends every block).
/// @throws Error(invalid_group) R < 1.
inline std::vector<int> ring_last_use(const RingPartition& part, bool causal) {
  const int R = part.ring_degree();
  std::vector<int> last(static_cast<std::size_t>(R), -1);
  for (int j = 0; j < R; ++j)
    for (int s = R - 1; s >= 0; --s)
      if (!ring_work(part, (j + s) % R, s, causal).empty()) {
        last[static_cast<std::size_t>(j)] = s;
        break;
      }
  return last;
}

ULYSSES_NAMESPACE_END
