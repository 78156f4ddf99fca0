// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A plan's inputs (PlanFields): the group, shape, partitions, tensors and options, their
///        validation (every error depends only on inputs all ranks share, except a rank's own
///        layouts), the GQA pairing and the resolved local layouts.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../../detail/checked.hpp"
#include "../../error.hpp"
#include "../spec.hpp"
#include "build.hpp"

ULYSSES_NAMESPACE_BEGIN
namespace detail {

/// The validated inputs of a Plan (Plan derives from it). Made once by the Plan constructor.
class PlanFields {
 public:
  PlanFields(Group group, std::int64_t batch, SeqPartition seq, std::vector<TensorSpec> tensors, Format format, PlanOptions options)
      : group_(group), batch_(batch), seq_(std::move(seq)), tensors_(std::move(tensors)), format_(format), options_(options) {
    validate_global();
    for (std::size_t t = 0; t < tensors_.size(); ++t) resolve_layouts(static_cast<int>(t));
  }

  int num_tensors() const { return static_cast<int>(tensors_.size()); }
  /// True when head→seq sums tensor t's replicated heads: it has some (its ranges overlap) and
  /// Replicas::sum.
  bool sums_replicas(int t) const {
    const TensorSpec& x = tensors_.at(at(t));
    return x.replicas == Replicas::sum && !x.heads.disjoint();
  }
  /// How the stages take tensor t's heads: with head bands, a kv tensor follows its query tensor.
  StageCut stage_cut(int t) const {
    const int q = serves_.empty() ? TensorSpec::kNone : serves_[at(t)];
    return {options_.stages, options_.head_bands && q >= 0 ? &tensors_[at(q)].heads : nullptr};
  }
  /// What the list building reads.
  PlanInputs inputs() const {
    PlanInputs in{group_, batch_, &seq_, &tensors_, options_.stages, {}, {}};
    for (int t = 0; t < num_tensors(); ++t) in.sums.push_back(sums_replicas(t) ? 1 : 0);
    for (int t = 0; t < num_tensors(); ++t) in.cuts.push_back(stage_cut(t));
    return in;
  }

 protected:
  void validate_global() {
    const int P = group_.size;
    if (P < 1) detail::fail(Errc::invalid_group, "group size P=" + std::to_string(P) + " must be >= 1");
    if (group_.rank < 0 || group_.rank >= P)
      detail::fail(Errc::invalid_group, "rank " + std::to_string(group_.rank) + " is outside the group [0, " + std::to_string(P) + ")");
    if (seq_.degree() != P)
      detail::fail(Errc::invalid_group, "the sequence partition was made for P=" + std::to_string(seq_.degree()) +
                                            " ranks but the group has P=" + std::to_string(P));
    if (batch_ < 1) detail::fail(Errc::invalid_shape, "batch B=" + std::to_string(batch_) + " must be >= 1");
    if (static_cast<unsigned>(format_) > static_cast<unsigned>(Format::bhsd))  // (a value cast into the enum: no layout to build)
      detail::fail(Errc::invalid_shape, "Format value " + std::to_string(static_cast<int>(format_)) + " is not one of Format's");
    if (static_cast<unsigned>(options_.path) > static_cast<unsigned>(Path::two_level))
      detail::fail(Errc::invalid_shape, "PlanOptions::path value " + std::to_string(static_cast<int>(options_.path)) + " is not one of Path's");
    if (options_.stages < 1 || options_.stages > kMaxStages)
      detail::fail(Errc::invalid_shape, "PlanOptions::stages=" + std::to_string(options_.stages) + " must be in [1, " + std::to_string(kMaxStages) + "]");
    if (tensors_.empty() || tensors_.size() > at(kMaxTensors))
      detail::fail(Errc::invalid_shape, std::to_string(tensors_.size()) + " tensors given; a plan moves 1 to " +
                                            std::to_string(kMaxTensors));
    std::int64_t total = 0;
    for (std::size_t t = 0; t < tensors_.size(); ++t) {
      const TensorSpec& x = tensors_[t];
      const std::string name = "tensor " + std::to_string(t);
      if (x.heads.degree() != P)
        detail::fail(Errc::invalid_group, "the head partition of " + name + " was made for P=" + std::to_string(x.heads.degree()) +
                                              " ranks but the group has P=" + std::to_string(P));
      if (x.head_dim < 1) detail::fail(Errc::invalid_shape, name + ": head_dim D=" + std::to_string(x.head_dim) + " must be >= 1");
      if (x.elem_bytes < 1 || x.elem_bytes > (1u << 20))
        detail::fail(Errc::invalid_shape, name + ": element size " + std::to_string(x.elem_bytes) + " bytes is out of range");
      if (x.type != ElementType::opaque && size_of(x.type) != x.elem_bytes)
        detail::fail(Errc::invalid_shape, name + ": element type " + to_string(x.type) + " has " + std::to_string(size_of(x.type)) +
                                              " bytes, but the element size is " + std::to_string(x.elem_bytes));
      std::int64_t n = detail::mul(batch_, seq_.seq_len(), "B*S");
      n = detail::mul(n, x.heads.num_heads(), "B*S*H");
      n = detail::mul(n, x.head_dim, "B*S*H*D");
      n = detail::mul(n, static_cast<std::int64_t>(x.elem_bytes), "bytes of B*S*H*D");
      total = detail::add(total, n, "bytes of all tensors");
      if (sums_replicas(static_cast<int>(t)) && !summable(x.type)) {
        const std::int64_t h = first_replicated_head(x.heads);
        const auto [f, l] = x.heads.holders(h);
        detail::fail(Errc::not_summable,
                     name + " has heads held by several ranks (head " + std::to_string(h) + " on ranks [" + std::to_string(f) +
                         ", " + std::to_string(l) + ")), which head→seq sums (Replicas::sum, the backward of seq→head), but its "
                         "element type is opaque (" + std::to_string(x.elem_bytes) + "-byte elements): declare it "
                         "(TensorSpec::of<T>(heads, D, ElementType::bfloat16), with_type(), or specialise "
                         "ulysses::element_type_of<T>), or choose with_replicas(Replicas::owner) for the plain inverse");
      }
    }
    resolve_pairing();
    const NodeLayout& n = options_.nodes;
    if (n.degree() != 0 && n.degree() != P)
      detail::fail(Errc::invalid_mesh, "PlanOptions::nodes describes " + std::to_string(n.degree()) + " ranks " + n.str() +
                                           " but the group has P=" + std::to_string(P));
    nodes_ = n.degree() ? n : NodeLayout::uniform(P, P);
    if (options_.lanes < 0)
      detail::fail(Errc::invalid_shape, "PlanOptions::lanes=" + std::to_string(options_.lanes) + " must be >= 0 (0: one lane per rank)");
    if (options_.ring) validate_ring(*options_.ring);
    two_level_ = options_.path == Path::two_level || (options_.path == Path::automatic && nodes_.spans_nodes());
  }

  /// PlanOptions::ring: U must be P, and S the tokens of one ring rank's group (with packed documents: at most the documents' S).
  void validate_ring(const RingConfig& c) const {
    const std::string what = "PlanOptions::ring (U=" + std::to_string(c.ulysses_degree) + ", R=" + std::to_string(c.ring_degree) +
                             ", S=" + std::to_string(c.seq_len) + ")";
    if (c.ulysses_degree != group_.size)
      detail::fail(Errc::invalid_mesh, what + " is for Ulysses groups of " + std::to_string(c.ulysses_degree) + " ranks, but this group has P=" +
                                           std::to_string(group_.size));
    if (c.documents != 0) {  // packed documents: the ring ranks' lengths follow the documents (only their fingerprint is here)
      if (seq_.seq_len() <= c.seq_len) return;
      detail::fail(Errc::invalid_mesh, what + ": the plan's S=" + std::to_string(seq_.seq_len()) +
                                           " tokens exceed the packed documents' S; plan with RingPartition::ulysses_partition(j)");
    }
    const RingPartition part(c.seq_len, c.ulysses_degree, c.ring_degree, c.layout);  // throws invalid_group / invalid_shape
    for (int j = 0; j < c.ring_degree; ++j)
      if (part.ring_length(j) == seq_.seq_len()) return;
    detail::fail(Errc::invalid_mesh, what + ": no ring rank's group holds the plan's S=" + std::to_string(seq_.seq_len()) +
                                         " tokens; plan with RingPartition::ulysses_partition(j)");
  }

  static std::int64_t first_replicated_head(const HeadPartition& hp) {
    for (int r = 1; r < hp.degree(); ++r)
      if (hp.owned_begin(r) != hp.begin(r)) return hp.begin(r);
    return 0;
  }

  /// Resolves TensorSpec::serves and checks that every kv tensor gives each rank the kv heads its
  /// query heads use (query head h uses kv head h / (H / Hkv)).
  void resolve_pairing() {
    const int T = num_tensors(), P = group_.size;
    serves_.assign(at(T), TensorSpec::kNone);
    for (int t = 0; t < T; ++t) {
      const TensorSpec& x = tensors_[at(t)];
      int q = x.serves;
      const std::int64_t Hkv = x.heads.num_heads();
      if (q == TensorSpec::kAuto) {
        const std::int64_t H0 = tensors_[0].heads.num_heads();
        q = t > 0 && Hkv < H0 && H0 % Hkv == 0 ? 0 : TensorSpec::kNone;
      }
      if (q == TensorSpec::kNone) continue;
      const std::string name = "tensor " + std::to_string(t);
      if (q < 0 || q >= T || q == t || tensors_[at(q)].serves >= 0)
        detail::fail(Errc::gqa_invalid, name + " says it serves tensor " + std::to_string(q) +
                                            ", which is not another query tensor of the plan (0.." + std::to_string(T - 1) + ")");
      const HeadPartition& qh = tensors_[at(q)].heads;
      const std::int64_t H = qh.num_heads();
      if (H % Hkv != 0)
        detail::fail(Errc::gqa_invalid, name + " (kv, " + std::to_string(Hkv) + " heads) serves tensor " + std::to_string(q) +
                                            " (" + std::to_string(H) + " query heads): GQA needs H % Hkv == 0");
      const std::int64_t g = H / Hkv;
      std::string bad;
      int n_bad = 0;
      for (int r = 0; r < P; ++r) {
        if (qh.count(r) == 0) continue;
        const std::int64_t need_b = qh.begin(r) / g, need_e = (qh.end(r) - 1) / g + 1;
        if (need_b >= x.heads.begin(r) && need_e <= x.heads.end(r)) continue;
        if (n_bad++ < 4)
          bad += "; rank " + std::to_string(r) + " holds query heads [" + std::to_string(qh.begin(r)) + ", " + std::to_string(qh.end(r)) +
                 ") of tensor " + std::to_string(q) + ", which use kv heads [" + std::to_string(need_b) + ", " +
                 std::to_string(need_e) + "), but gets kv heads [" + std::to_string(x.heads.begin(r)) + ", " +
                 std::to_string(x.heads.end(r)) + ")";
      }
      if (n_bad)
        detail::fail(Errc::gqa_invalid, "the kv partition of " + name + " " + x.heads.str() + " does not give " +
                                            std::to_string(n_bad) + " rank(s) the kv heads their query heads use" + bad +
                                            (n_bad > 4 ? "; ..." : "") + ". Make it with HeadPartition::gqa(query partition, " +
                                            std::to_string(Hkv) + ") or use attention_specs() (to skip this check: "
                                            "serving(TensorSpec::kNone))");
      serves_[at(t)] = q;
    }
  }

  void resolve_layouts(int t) {
    TensorSpec& x = tensors_[at(t)];
    const std::int64_t H = x.heads.num_heads(), D = x.head_dim, r = group_.rank;
    const std::int64_t Sr = seq_.local_length(group_.rank), Hr = x.heads.count(group_.rank);
    if (!x.seq_layout) x.seq_layout = Layout::dense(format_, batch_, Sr, H, D);
    if (!x.head_layout) x.head_layout = Layout::dense(format_, batch_, seq_.seq_len(), Hr, D);
    check_layout(*x.seq_layout, {batch_, Sr, H, D}, x.elem_bytes, "seq-sharded layout of tensor " + std::to_string(t) + " on rank " + std::to_string(r));
    check_layout(*x.head_layout, {batch_, seq_.seq_len(), Hr, D}, x.elem_bytes,
                 "head-sharded layout of tensor " + std::to_string(t) + " on rank " + std::to_string(r));
    if (x.row_transforms || x.wire != Wire::element) check_row_transforms(x, t);
  }

  /// What a tensor planned with_row_transforms() needs: a type the rows can be loaded as, rows
  /// that fit the executor's row buffer, D contiguous on both sides.
  static void check_row_transforms(const TensorSpec& x, int t) {
    const std::string name = "tensor " + std::to_string(t) + (x.wire == Wire::element ? " (with_row_transforms)" : " (with_wire(" + std::string(to_string(x.wire)) + "): planned by rows)");
    if (!summable(x.type))
      detail::fail(Errc::invalid_shape, name + ": row transforms load float16, bfloat16, float32 or float64 elements, but the element "
                                               "type is opaque: declare it (TensorSpec::of<T>(heads, D, ElementType::bfloat16) or with_type())");
    if (x.head_dim > 1024)
      detail::fail(Errc::invalid_shape, name + ": head_dim D=" + std::to_string(x.head_dim) + " is above the 1024 a transformed row may have");
    if (x.wire != Wire::element && x.type == ElementType::float64)
      detail::fail(Errc::invalid_shape, name + ": a " + std::string(to_string(x.wire)) +
                                               " wire carries float16, bfloat16 or float32 rows, but the element type is float64");
    if (static_cast<int>(x.wire) < 0 || static_cast<int>(x.wire) > 4)
      detail::fail(Errc::invalid_shape, name + ": Wire value " + std::to_string(static_cast<int>(x.wire)) + " is not one of Wire's");
    if (x.seq_layout->stride[3] != 1 || x.head_layout->stride[3] != 1)
      detail::fail(Errc::invalid_shape, name + ": the head dim must be contiguous (stride 1) in both layouts, but they are " +
                                               x.seq_layout->str() + " and " + x.head_layout->str());
  }

  static void check_layout(const Layout& l, std::array<std::int64_t, 4> want, std::size_t elem_bytes, const std::string& what) {
    for (std::size_t i = 0; i < 4; ++i)
      if (l.extent[i] != want[i])
        detail::fail(Errc::layout_mismatch, what + " has extents " + l.str() + " but the plan needs [" + std::to_string(want[0]) +
                                                "," + std::to_string(want[1]) + "," + std::to_string(want[2]) + "," +
                                                std::to_string(want[3]) + "] over (b,s,h,d)");
    std::int64_t reach = 0;  // largest element offset; the buffer's bytes must fit int64
    for (int i = 0; i < 4; ++i)
      if (l.extent[i] > 0) reach = detail::add(reach, detail::mul(l.extent[i] - 1, l.stride[i], "layout span"), "layout span");
    detail::mul(detail::add(reach, 1, "layout span"), static_cast<std::int64_t>(elem_bytes), "bytes of the layout span");
    if (!l.is_injective())
      detail::fail(Errc::layout_aliasing, what + " " + l.str() +
                                              " has negative strides or maps two elements to one address; strides must be >= 0 and "
                                              "non-overlapping");
  }

  Group group_;
  std::int64_t batch_;
  SeqPartition seq_;
  std::vector<TensorSpec> tensors_;
  Format format_;
  PlanOptions options_;
  std::vector<int> serves_;  // the query tensor each tensor serves (TensorSpec::kNone)
  NodeLayout nodes_;         // options_.nodes, or one node of P ranks
  bool two_level_ = false;   // the plan lays out the two-level exchange
};

}  // namespace detail
ULYSSES_NAMESPACE_END
