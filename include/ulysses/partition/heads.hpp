// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief How heads are split over the group: the head partition of one tensor (HeadPartition).
///
/// A head partition gives, for one tensor, the head range [begin, end) every rank holds in the
/// head-sharded layout; under GQA the kv ranges of neighbouring ranks may overlap (a kv head used
/// by the query heads of several ranks is sent to each of them: replication folded into the
/// exchange).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <sstream>
#include <utility>
#include <vector>

#include "../detail/checked.hpp"
#include "../error.hpp"
#include "seq.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The head partition of one tensor: the head range [begin(r), end(r)) rank r holds in the
/// head-sharded layout.
///
/// Ranges are monotone (begin and end never decrease with r) and cover [0, H); neighbouring
/// ranges may overlap (replication: a kv head under GQA/MQA used by the query heads of several
/// ranks). The ranks holding a head form a contiguous run of ranks (holders()); the lowest is its
/// *owner*. In head→seq a replicated head is either summed over its holders (Replicas::sum, the
/// adjoint of seq→head: what the backward pass needs) or taken from its owner (Replicas::owner,
/// the plain inverse); see TensorSpec::replicas in plan.hpp.
///
/// Two visible properties besides the ranges: even_split() (made by even(), or by gqa() of such a
/// partition: every rank must hold as many heads as every other, and gqa() refuses kv counts that
/// cannot be split or replicated evenly) and query_per_kv() (made by gqa()); both are part of
/// operator==. Neither changes a byte on the wire.
class HeadPartition {
 public:
  /// Even split: rank r holds [r*H/P, (r+1)*H/P).
  /// @throws Error(invalid_group) P < 1; Error(invalid_shape) H < 1; Error(heads_not_divisible)
  ///         H % P != 0 (the message lists the P that divide H).
  static HeadPartition even(std::int64_t H, int P) {
    check(H, P, "num_heads");
    if (H % P != 0) {
      std::ostringstream m;
      m << "num_heads=" << H << " is not divisible by group size " << P
        << "; use a balanced split (HeadPartition::balanced, or HeadPolicy::balanced in attention_specs) or P in "
        << detail::join(detail::divisors(H));
      detail::fail(Errc::heads_not_divisible, m.str());
    }
    HeadPartition p = balanced(H, P);
    p.even_ = true;
    return p;
  }

  /// Every rank holds every head, [0, H) on each of the P ranks: the partition of an all-gather
  /// (seq→head then gives every rank the whole sequence of every head; head→seq with
  /// Replicas::sum is the reduce-scatter: allgather.hpp). @throws as even(), except heads_not_divisible.
  static HeadPartition all(std::int64_t H, int P) {
    check(H, P, "num_heads");
    return ranges(H, std::vector<std::pair<std::int64_t, std::int64_t>>(static_cast<std::size_t>(P), {0, H}));
  }

  /// Balanced split: the first H % P ranks hold one head more (H=7, P=4: [2,2,2,1]; H=3, P=4:
  /// [1,1,1,0]). @throws as even(), except heads_not_divisible.
  static HeadPartition balanced(std::int64_t H, int P) {
    check(H, P, "num_heads");
    std::vector<std::pair<std::int64_t, std::int64_t>> r;
    std::int64_t b = 0;
    for (int i = 0; i < P; ++i) {
      const std::int64_t n = H / P + (i < H % P ? 1 : 0);
      r.emplace_back(b, b + n);
      b += n;
    }
    return ranges(H, std::move(r));
  }

  /// Explicit ranges [begin, end), one per rank, monotone, covering [0, H).
  /// @throws Error(invalid_partition) when they are not monotone or do not cover [0, H).
  static HeadPartition ranges(std::int64_t H, std::vector<std::pair<std::int64_t, std::int64_t>> r) {
    check(H, static_cast<int>(r.size()), "num_heads");
    // Monotone begins and ends (empty ranges included, so owned_begin() stays right), and the
    // non-empty ranges leave no gap.
    std::int64_t prev_b = 0, prev_e = 0, covered = 0;
    for (std::size_t i = 0; i < r.size(); ++i) {
      auto [b, e] = r[i];
      const bool empty = b == e;
      if (b < 0 || e < b || e > H || b < prev_b || e < prev_e || (!empty && b > covered) || (empty && e > covered))
        detail::fail(Errc::invalid_partition, "head range of rank " + std::to_string(i) + " is [" + std::to_string(b) +
                                                  ", " + std::to_string(e) + "); ranges must lie in [0, " +
                                                  std::to_string(H) + "), be monotone and leave no gap");
      prev_b = b;
      prev_e = e;
      if (!empty) covered = e;
    }
    if (covered != H)
      detail::fail(Errc::invalid_partition, "head ranges end at " + std::to_string(covered) + ", not at H=" + std::to_string(H));
    HeadPartition p;
    p.H_ = H;
    p.r_ = std::move(r);
    p.index_holders();
    return p;
  }

  /// The kv-head partition that goes with a query-head partition under GQA/MQA: rank r receives
  /// exactly the kv heads its query heads use (query head h uses kv head h / (H / Hkv)).
  ///
  /// With an even query split this is the DeepSpeed-Ulysses rule: if Hkv % P == 0 every rank gets
  /// Hkv/P kv heads; if P % Hkv == 0 every rank gets the one kv head its query heads use (ranks
  /// r*P/Hkv .. share it; the sender copies it into each of their wire chunks, it is never
  /// materialised P/Hkv times). With a balanced query split any Hkv is served, and neighbouring
  /// ranks may share a kv head. Hkv == H gives the query partition itself.
  /// @throws Error(invalid_shape) Hkv < 1; Error(gqa_invalid) Hkv does not divide H;
  ///         Error(gqa_group_mismatch) even query split and neither Hkv % P nor P % Hkv is 0
  ///         (the message lists the P that work).
  static HeadPartition gqa(const HeadPartition& query, std::int64_t Hkv) {
    const std::int64_t H = query.H_;
    const int P = query.degree();
    if (Hkv < 1) detail::fail(Errc::invalid_shape, "num_kv_heads=" + std::to_string(Hkv) + " must be >= 1");
    if (H % Hkv != 0)
      detail::fail(Errc::gqa_invalid, "num_kv_heads=" + std::to_string(Hkv) + " does not divide num_heads=" +
                                          std::to_string(H) + "; GQA needs H % Hkv == 0");
    if (query.even_ && Hkv % P != 0 && P % Hkv != 0) {
      std::vector<std::int64_t> ok;
      for (std::int64_t d : detail::divisors(H))
        if (Hkv % d == 0 || d % Hkv == 0) ok.push_back(d);
      std::ostringstream m;
      m << "num_kv_heads=" << Hkv << " with group size P=" << P
        << ": neither divides the other, so kv heads can be neither split nor replicated evenly; use P in "
        << detail::join(ok) << " (num_heads=" << H << "), or HeadPartition::balanced for the query heads";
      detail::fail(Errc::gqa_group_mismatch, m.str());
    }
    const std::int64_t g = H / Hkv;
    std::vector<std::pair<std::int64_t, std::int64_t>> r;
    std::int64_t last = 0;
    for (int i = 0; i < P; ++i) {
      auto [b, e] = query.r_[static_cast<std::size_t>(i)];
      if (b == e)
        r.emplace_back(last, last);
      else {
        last = (e - 1) / g + 1;
        r.emplace_back(b / g, last);
      }
    }
    HeadPartition p = ranges(Hkv, std::move(r));
    p.even_ = query.even_;
    p.query_per_kv_ = g;
    return p;
  }

  std::int64_t num_heads() const { return H_; }                       ///< H of this tensor
  int degree() const { return static_cast<int>(r_.size()); }          ///< P
  /// First head of rank r. @throws Error(invalid_group) r outside [0, P) (as end(), count(),
  /// owned_begin()).
  std::int64_t begin(int r) const {
    detail::check_rank(r, degree());
    return r_[static_cast<std::size_t>(r)].first;
  }
  /// One past rank r's last head.
  std::int64_t end(int r) const {
    detail::check_rank(r, degree());
    return r_[static_cast<std::size_t>(r)].second;
  }
  std::int64_t count(int r) const { return end(r) - begin(r); }  ///< H_r, heads rank r holds
  /// For a kv partition made by gqa(): query heads per kv head (H / Hkv); 1 otherwise.
  std::int64_t query_per_kv() const { return query_per_kv_; }
  /// True for a partition made by even() or by gqa() of one (the "even" head policy: gqa() then
  /// requires Hkv % P == 0 or P % Hkv == 0, as DeepSpeed-Ulysses does).
  bool even_split() const { return even_; }
  /// First head of rank r's range that no lower rank holds (the heads r sends in head→seq). O(1):
  /// ends are monotone, so the highest end below r is end(r - 1).
  std::int64_t owned_begin(int r) const {
    const std::int64_t b = r > 0 ? std::max(begin(r), end(r - 1)) : begin(r);
    return std::min(b, end(r));
  }
  /// True when no two ranges overlap (no head is held by two ranks).
  bool disjoint() const {
    for (int r = 0; r < degree(); ++r)
      if (owned_begin(r) != begin(r)) return false;
    return true;
  }
  /// The ranks holding head h: [first, last) (contiguous, since ranges are monotone; the first is
  /// the owner). O(1) from a per-head table (H <= 2^20), else O(log P). @pre 0 <= h < num_heads()
  std::pair<int, int> holders(std::int64_t h) const {
    if (!holders_.empty()) return holders_[static_cast<std::size_t>(h)];
    return search_holders(h);
  }
  /// The rank owning head h (the lowest holder). @pre 0 <= h < num_heads()
  int owner(std::int64_t h) const { return holders(h).first; }
  /// "[0,2) [2,3)" for messages.
  std::string str() const {
    std::string o;
    for (int r = 0; r < degree(); ++r)
      o += (r ? " [" : "[") + std::to_string(begin(r)) + "," + std::to_string(end(r)) + ")";
    return o;
  }

  /// Same head count and ranges, made by the same policy (even_split(), query_per_kv()).
  friend bool operator==(const HeadPartition& a, const HeadPartition& b) {
    return a.H_ == b.H_ && a.r_ == b.r_ && a.even_ == b.even_ && a.query_per_kv_ == b.query_per_kv_;
  }
  friend bool operator!=(const HeadPartition& a, const HeadPartition& b) { return !(a == b); }

 private:
  static void check(std::int64_t H, int P, const char* what) {
    detail::check_group_size(P);
    if (H < 1) detail::fail(Errc::invalid_shape, std::string(what) + "=" + std::to_string(H) + " must be >= 1");
  }
  /// holders(h) by binary search over the monotone ends and begins.
  std::pair<int, int> search_holders(std::int64_t h) const {
    auto first = std::partition_point(r_.begin(), r_.end(), [h](const std::pair<std::int64_t, std::int64_t>& x) { return x.second <= h; });
    auto last = std::partition_point(first, r_.end(), [h](const std::pair<std::int64_t, std::int64_t>& x) { return x.first <= h; });
    return {static_cast<int>(first - r_.begin()), static_cast<int>(last - r_.begin())};
  }
  /// The per-head holder table (one sweep over heads and ranks), for H <= kMaxIndexedHeads.
  void index_holders() {
    holders_.clear();
    if (H_ > kMaxIndexedHeads) return;
    holders_.resize(static_cast<std::size_t>(H_));
    int first = 0, last = 0;
    for (std::int64_t h = 0; h < H_; ++h) {
      while (first < degree() && r_[static_cast<std::size_t>(first)].second <= h) ++first;
      if (last < first) last = first;
      while (last < degree() && r_[static_cast<std::size_t>(last)].first <= h) ++last;
      holders_[static_cast<std::size_t>(h)] = {first, last};
    }
  }
  static constexpr std::int64_t kMaxIndexedHeads = std::int64_t{1} << 20;
  std::int64_t H_ = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> r_;
  std::vector<std::pair<int, int>> holders_;  // derived from r_ (holders(h)); not part of operator==
  bool even_ = false;
  std::int64_t query_per_kv_ = 1;
};


/// A run of heads [lo, hi) of one tensor (ascending, possibly empty).
struct HeadRun {
  std::int64_t lo = 0;  ///< first head
  std::int64_t hi = 0;  ///< one past the last head
  std::int64_t size() const { return hi - lo; }  ///< heads in the run
};

/// Heads in a list of runs.
inline std::int64_t total_heads(const std::vector<HeadRun>& runs) {
  std::int64_t n = 0;
  for (const HeadRun& r : runs) n += r.size();
  return n;
}
/// Position of head h in the list `runs` (the index of h when the runs are laid end to end).
/// @pre h lies in one of the runs.
inline std::int64_t position_of(const std::vector<HeadRun>& runs, std::int64_t h) {
  std::int64_t i = 0;
  for (const HeadRun& r : runs) {
    if (h < r.hi) return i + (h - r.lo);
    i += r.size();
  }
  return i;
}

/// Part k of K of the head range [b, e): balanced, the first (e - b) % K parts one head longer
/// (the pipeline stages of PlanOptions::stages). @pre 0 <= k < K, b <= e.
inline HeadRun stage_part(std::int64_t b, std::int64_t e, int k, int K) {
  const std::int64_t n = e - b;
  const std::int64_t lo = b + k * (n / K) + std::min<std::int64_t>(k, n % K);
  return {lo, lo + n / K + (k < n % K ? 1 : 0)};
}

/// Which heads a head-sharded rank puts on the wire (the wire format, docs/wire-format.md).
enum class WireHeads {
  held,          ///< seq→head: every head it holds
  owned,         ///< head→seq, replicas taken from their owner: the heads it owns
  held_for_sum,  ///< head→seq, replicas summed: every head it holds, each in the stage of its owner's part
};

/// The heads of partition `hp` that head-sharded rank r puts on the wire in stage k of K, as
/// ascending runs: `held`: part k of its range; `owned`: part k of its owned range;
/// `held_for_sum`: the heads it holds that fall in part k of their owner's owned range.
/// Source: the wire format of Plan (stages cut every rank's, resp. every owner's, range).
inline std::vector<HeadRun> wire_heads(const HeadPartition& hp, int r, WireHeads which, int k, int K) {
  std::vector<HeadRun> runs;
  auto add = [&runs](HeadRun x) {
    if (x.hi > x.lo) runs.push_back(x);
  };
  if (which == WireHeads::held) {
    add(stage_part(hp.begin(r), hp.end(r), k, K));
  } else if (which == WireHeads::owned) {
    add(stage_part(hp.owned_begin(r), hp.end(r), k, K));
  } else {
    for (int o = 0; o <= r; ++o) {  // owned ranges ascend with o; only owners up to r hold heads r holds
      const HeadRun p = stage_part(hp.owned_begin(o), hp.end(o), k, K);
      add({std::max(p.lo, hp.begin(r)), std::min(p.hi, hp.end(r))});
    }
  }
  return runs;
}

/// The heads of stage k of K that head→seq moves at all: part k of every rank's owned range.
inline std::vector<HeadRun> stage_heads(const HeadPartition& hp, int k, int K) {
  std::vector<HeadRun> runs;
  for (int o = 0; o < hp.degree(); ++o) {
    const HeadRun p = stage_part(hp.owned_begin(o), hp.end(o), k, K);
    if (p.hi > p.lo) runs.push_back(p);
  }
  return runs;
}

/// How the K stages of a plan take the heads of one tensor (PlanOptions::stages, head_bands).
/// Without `query`, stage k takes part k of each rank's range (stage_part()). With it (head bands:
/// PlanOptions::head_bands, for a kv tensor that serves the query tensor of partition `*query`),
/// stage k is band k: part k of each rank's query heads, and a kv head goes with the query heads
/// that use it (query head j uses kv head j / (H / Hkv)): seq→head sends it to rank r in the first
/// band of r whose query heads use it, head→seq in the last band, over its holders, that uses it
/// (its holders' partial gradients are summed in one stage, and each is complete only after that
/// band's attention). A head no query head of a holder uses goes in stage 0.
struct StageCut {
  int K = 1;                              ///< stages, >= 1
  const HeadPartition* query = nullptr;   ///< head bands of a kv tensor: the query partition it serves
};

namespace detail {
/// The band (part of K) of rank r's query partition `q` that holds query head j. @pre j in r's range.
inline int band_of(const HeadPartition& q, int r, std::int64_t j, int K) {
  const std::int64_t n = q.count(r), base = n / K, rem = n % K, o = j - q.begin(r);
  return static_cast<int>(o < rem * (base + 1) ? o / (base + 1) : rem + (o - rem * (base + 1)) / base);
}
/// The band of rank r where its query heads start (`last` false) or stop (true) using kv head h
/// (query heads [h g, (h + 1) g), g = H / Hkv); 0 when none of them does.
inline int kv_band(const HeadPartition& kv, const HeadPartition& q, int r, std::int64_t h, int K, bool last) {
  const std::int64_t g = q.num_heads() / kv.num_heads();
  const std::int64_t lo = std::max(q.begin(r), h * g), hi = std::min(q.end(r), (h + 1) * g);
  if (lo >= hi) return 0;
  return band_of(q, r, last ? hi - 1 : lo, K);
}
/// The head→seq stage of kv head h under head bands: the last band, over its holders, using it.
inline int kv_sum_band(const HeadPartition& kv, const HeadPartition& q, std::int64_t h, int K) {
  const auto [first, last] = kv.holders(h);
  int s = 0;
  for (int r = first; r < last; ++r) s = std::max(s, kv_band(kv, q, r, h, K, true));
  return s;
}
/// The heads of [lo, hi) whose stage `stage_of(h)` is k, as ascending runs (appended to `runs`).
template <class F>
void runs_in_stage(std::int64_t lo, std::int64_t hi, int k, F&& stage_of, std::vector<HeadRun>& runs) {
  for (std::int64_t h = lo; h < hi; ++h) {
    if (stage_of(h) != k) continue;
    if (!runs.empty() && runs.back().hi == h) ++runs.back().hi;
    else runs.push_back({h, h + 1});
  }
}
}  // namespace detail

/// wire_heads() under a stage cut: as wire_heads(hp, r, which, k, cut.K) without head bands; with
/// them (cut.query), the kv heads of stage k by StageCut's rule. @pre 0 <= k < cut.K.
inline std::vector<HeadRun> wire_heads(const HeadPartition& hp, int r, WireHeads which, int k, const StageCut& cut) {
  if (!cut.query) return wire_heads(hp, r, which, k, cut.K);
  const HeadPartition& q = *cut.query;
  std::vector<HeadRun> runs;
  auto sum_band = [&](std::int64_t h) { return detail::kv_sum_band(hp, q, h, cut.K); };
  if (which == WireHeads::held)
    detail::runs_in_stage(hp.begin(r), hp.end(r), k, [&](std::int64_t h) { return detail::kv_band(hp, q, r, h, cut.K, false); }, runs);
  else if (which == WireHeads::owned)
    detail::runs_in_stage(hp.owned_begin(r), hp.end(r), k, sum_band, runs);
  else
    detail::runs_in_stage(hp.begin(r), hp.end(r), k, sum_band, runs);
  return runs;
}

/// stage_heads() under a stage cut: the heads head→seq moves in stage k (with head bands, the kv
/// heads whose last band is k).
inline std::vector<HeadRun> stage_heads(const HeadPartition& hp, int k, const StageCut& cut) {
  if (!cut.query) return stage_heads(hp, k, cut.K);
  std::vector<HeadRun> runs;
  detail::runs_in_stage(0, hp.num_heads(), k, [&](std::int64_t h) { return detail::kv_sum_band(hp, *cut.query, h, cut.K); }, runs);
  return runs;
}

/// The longest run [h, e) with e <= hi whose heads all have the holders of head h (ranges change
/// only at range boundaries, so this is O(log P), not one step per head). @pre h < hi <= H.
inline HeadRun same_holders(const HeadPartition& hp, std::int64_t h, std::int64_t hi) {
  const auto [first, last] = hp.holders(h);
  // The holders change at the next range boundary above h: end(first) or begin(last).
  std::int64_t e = hi;
  if (first < hp.degree()) e = std::min(e, hp.end(first));
  if (last < hp.degree()) e = std::min(e, std::max(hp.begin(last), h + 1));
  return {h, std::max(e, h + 1)};
}

/// The maximal runs of `runs` whose heads are held by several ranks (`shared` true) or by one.
inline std::vector<HeadRun> shared_runs(const HeadPartition& hp, const std::vector<HeadRun>& runs, bool shared) {
  std::vector<HeadRun> out;
  for (const HeadRun& r : runs)
    for (std::int64_t a = r.lo; a < r.hi;) {
      const HeadRun same = same_holders(hp, a, r.hi);
      const auto h = hp.holders(a);
      if ((h.second - h.first > 1) == shared) {
        if (!out.empty() && out.back().hi == a) out.back().hi = same.hi;
        else out.push_back(same);
      }
      a = same.hi;
    }
  return out;
}

ULYSSES_NAMESPACE_END
