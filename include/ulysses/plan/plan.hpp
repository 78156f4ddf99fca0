// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Plan: the immutable, per-rank result of planning one redistribution: its validated
///        inputs, the wire chunks and block lists of every stage, the workspace size.
///
/// Planning is a pure host computation (no communication; it allocates, so do it once, outside
/// the training step). Every rank computes the same global picture from the same inputs, so a bad
/// configuration is rejected on every rank before any rank enters a collective. A Plan never
/// changes after construction: what a transport learns from its peers at run time lives with the
/// communicator (comm/exchange_state.hpp), and whether the cross-rank check passed is recorded
/// there and in the plan's AgreementCheck (plan/agreement.hpp), an object the plan shares.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../comm/exchange_state.hpp"
#include "../error.hpp"
#include "../layout/blocks.hpp"
#include "../layout/layout.hpp"
#include "../partition/heads.hpp"
#include "../topology/route.hpp"
#include "detail/build.hpp"
#include "agreement_check.hpp"
#include "detail/inputs.hpp"
#include "spec.hpp"
#include "stage.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The fixed-size record of what determines the wire, all-gathered by check_agreement()
/// (plan/agreement.hpp): kAgreementWords 64-bit words, one field (or a hash of one) per word.
inline constexpr int kAgreementWords = 64;
using AgreementRecord = std::array<std::uint64_t, kAgreementWords>;

namespace detail {
struct TransportDispatch;  // transport/dispatch.hpp: what Plan::copies() forwards to
}  // namespace detail

/// Everything one rank needs to run seq→head and head→seq for a set of tensors: the validated
/// inputs, the wire chunks and block lists of every stage (StageLists), and the workspace size.
/// Immutable once made.
///
/// Wire format (stable): docs/wire-format.md. In short, the chunk from rank i to rank j holds,
/// for each tensor in order, the block [B, tokens, heads, D] in row-major order, tokens those of
/// the seq-sharded side in its local order, heads those the head-sharded side receives (seq→head)
/// or sends (head→seq: owned, and with Replicas::sum every head it holds) in this stage. Engines
/// running their own collective can use stage_lists() and the executors and move the wire
/// themselves.
class Plan : private detail::PlanFields {
 public:
  /// Plans the redistribution of `tensors` for member `group.rank` of a group of `group.size`.
  ///
  /// @param group   this rank and the degree P
  /// @param batch   B >= 1
  /// @param seq     sequence partition over P ranks (S = seq.seq_len())
  /// @param tensors 1..kMaxTensors tensors, each with a head partition over P ranks
  /// @param format  memory order of the local tensors whose layouts are not given
  /// @param options stages, transport, node layout of the two-level exchange (PlanOptions)
  /// @throws Error(invalid_group) bad rank or size, or a partition made for another P;
  ///         Error(invalid_shape) B, D or element size < 1, no / too many tensors, an element
  ///         type whose size is not the element size, options.stages outside [1, 64];
  ///         Error(size_overflow) a tensor's byte count overflows int64;
  ///         Error(layout_mismatch) a layout whose extents are not the local shape;
  ///         Error(layout_aliasing) a layout with negative or aliasing strides;
  ///         Error(gqa_invalid) a kv tensor whose partition does not give a rank the kv heads its
  ///         query heads use (or whose head count does not divide its query tensor's; the message
  ///         names the rank and the heads);
  ///         Error(not_summable) a tensor with replicated heads and Replicas::sum whose element
  ///         type is opaque (declare it, e.g. TensorSpec::of<T>(heads, D, ElementType::bfloat16),
  ///         or choose Replicas::owner for a plain inverse);
  ///         Error(invalid_mesh) options.nodes describes another number of ranks than P;
  ///         Error(invalid_shape) options.lanes < 0.
  ///         Every error depends only on inputs all ranks share, except layout_mismatch,
  ///         layout_aliasing and size_overflow of a rank's own layouts.
  Plan(Group group, std::int64_t batch, SeqPartition seq, std::vector<TensorSpec> tensors, Format format = Format::bshd,
       PlanOptions options = {})
      : detail::PlanFields(group, batch, std::move(seq), std::move(tensors), format, options),
        id_(detail::next_plan_id()),
        check_(std::make_shared<AgreementCheck>()) {
    build_stages();
  }

  const Group& group() const { return group_; }                 ///< this rank and P
  int degree() const { return group_.size; }                    ///< P
  int rank() const { return group_.rank; }                      ///< this rank
  std::int64_t batch() const { return batch_; }                 ///< B
  std::int64_t seq_len() const { return seq_.seq_len(); }       ///< S
  const SeqPartition& seq() const { return seq_; }              ///< the sequence partition
  Format format() const { return format_; }                     ///< default memory order
  const PlanOptions& options() const { return options_; }       ///< planning options
  using detail::PlanFields::num_tensors;  ///< tensors the plan moves
  const TensorSpec& tensor(int t) const { return tensors_.at(detail::at(t)); }
  /// This rank's seq-sharded layout of tensor t: extents [B, S_r, H, D], strides in elements.
  const Layout& seq_layout(int t) const { return *tensor(t).seq_layout; }
  /// This rank's head-sharded layout of tensor t: extents [B, S, H_r, D], strides in elements.
  const Layout& head_layout(int t) const { return *tensor(t).head_layout; }
  /// Bytes of this rank's seq-sharded (resp. head-sharded) buffer of tensor t, from its base.
  std::size_t seq_bytes(int t) const { return span_bytes(seq_layout(t), t); }
  std::size_t head_bytes(int t) const { return span_bytes(head_layout(t), t); }
  /// Bytes of the input (resp. output) buffer of tensor t in direction d.
  std::size_t input_bytes(Direction d, int t) const { return d == Direction::seq_to_head ? seq_bytes(t) : head_bytes(t); }
  std::size_t output_bytes(Direction d, int t) const { return d == Direction::seq_to_head ? head_bytes(t) : seq_bytes(t); }
  /// The query tensor tensor t serves (GQA pairing, resolved from TensorSpec::serves), or
  /// TensorSpec::kNone.
  int serves(int t) const { return serves_.at(detail::at(t)); }
  /// How the stages take tensor t's heads (StageCut, partition/heads.hpp): under
  /// PlanOptions::head_bands a kv tensor follows the query tensor it serves.
  StageCut stage_cut(int t) const { return detail::PlanFields::stage_cut(t); }
  using detail::PlanFields::sums_replicas;  ///< True when head→seq sums tensor t's replicated heads (they overlap, Replicas::sum)
  /// The first tensor whose replicated heads head→seq takes from their owner (Replicas::owner
  /// with overlapping ranges), or -1 when there is none: then seq→head and head→seq are each
  /// other's adjoints, and seq_to_head_backward() / head_to_seq_backward() accept the plan.
  int first_non_adjoint_tensor() const {
    for (int t = 0; t < num_tensors(); ++t)
      if (tensor(t).replicas == Replicas::owner && !tensor(t).heads.disjoint()) return t;
    return -1;
  }

  /// Number of pipeline stages K (PlanOptions::stages).
  int num_stages() const { return options_.stages; }
  /// True when the plan lays out the two-level exchange (PlanOptions::nodes spans nodes and the
  /// path is automatic or two_level, or the path is two_level): it then runs on Path::two_level,
  /// or on Path::direct, and not on the flat paths (choose_path() says so).
  bool two_level() const { return two_level_; }
  /// The node layout of the group (PlanOptions::nodes; one node of P ranks when not given).
  const NodeLayout& nodes() const { return nodes_; }
  /// The wire chunks and block lists of direction d, stage `stage` in [0, K) (StageLists).
  /// @throws std::out_of_range stage outside [0, K).
  const StageLists& stage_lists(Direction d, int stage = 0) const {
    return lists_[static_cast<int>(d)].at(static_cast<std::size_t>(stage));
  }
  /// Bytes every rank sends every other in stage k of direction dir: [i * P + j] is the chunk from
  /// rank i to rank j (0 for i == j: a rank's own data never travels), computed from the shared
  /// inputs alone, so any rank's plan gives the whole matrix (what the two-level route and the
  /// cost model use). O(P^2) time and memory. @pre stage in [0, num_stages()).
  std::vector<std::size_t> chunk_matrix(Direction dir, int k) const {
    const int P = group_.size, T = num_tensors();
    const bool s2h = dir == Direction::seq_to_head;
    std::vector<std::size_t> c(detail::at(P) * detail::at(P), 0);
    for (int t = 0; t < T; ++t) {
      const TensorSpec& x = tensors_[detail::at(t)];
      const WireHeads which = s2h ? WireHeads::held : sums_replicas(t) ? WireHeads::held_for_sum : WireHeads::owned;
      const auto row = static_cast<std::size_t>(batch_) * x.wire_row_bytes();  // bytes of one token of one head
      std::vector<std::int64_t> n(detail::at(P));
      for (int r = 0; r < P; ++r) n[detail::at(r)] = total_heads(wire_heads(x.heads, r, which, k, stage_cut(t)));
      for (int i = 0; i < P; ++i)
        for (int j = 0; j < P; ++j) {
          if (i == j) continue;
          const int sr = s2h ? i : j, hr = s2h ? j : i;  // the seq-sharded and head-sharded side
          c[detail::at(i) * detail::at(P) + detail::at(j)] += static_cast<std::size_t>(seq_.local_length(sr) * n[detail::at(hr)]) * row;
        }
    }
    return c;
  }

  /// Workspace bytes one call needs (either direction): send region at offset 0, receive region
  /// at recv_region_offset().
  std::size_t workspace_bytes() const { return workspace_; }
  /// Offset of the receive region in the workspace, bytes (a multiple of kRegionAlignment).
  std::size_t recv_region_offset() const { return recv_region_; }
  /// Alignment of the receive region in the workspace, bytes.
  static constexpr std::size_t kRegionAlignment = 256;
  /// Bytes this rank sends to other ranks in direction d (its own chunk excluded), all stages.
  std::size_t exchanged_bytes(Direction d) const {
    std::size_t n = 0;
    for (const StageLists& sc : lists_[static_cast<int>(d)]) n += sc.send_total;
    return n;
  }
  /// Of exchanged_bytes(d): the copies of replicated heads this rank sends without owning them
  /// (head→seq with Replicas::sum; 0 otherwise): what the summed inverse sends beyond the plain one.
  std::size_t replica_bytes(Direction d) const {
    std::size_t n = 0;
    for (const StageLists& sc : lists_[static_cast<int>(d)]) n += sc.replica_bytes;
    return n;
  }

  /// Copies per element of direction d on this rank when it takes path p: what p's transport file
  /// counts (transport/dispatch.hpp; Path::automatic counts as alltoallv). Needs the transport
  /// layer (included by <ulysses/ulysses.hpp>, <ulysses/redistribute.hpp>).
  template <class Dispatch = detail::TransportDispatch>
  CopyCount copies(Direction d, Path p) const {
    return Dispatch::copies(*this, d, p);
  }

  /// What determines the wire, one field per word (plan/agreement.hpp): P, B, S, the sequence
  /// partition, the number of tensors, stages, path options, the node layout, and per tensor its
  /// head partition, head dim and element size, and how head→seq treats its replicas. Nothing
  /// that is a rank's own business (layouts, format, pointers). Defined in plan/agreement.hpp,
  /// as are agreement_field() and fingerprint() (see the end of this header).
  AgreementRecord agreement_record() const;
  /// What word i of agreement_record() stands for ("the head partition of tensor 1", ...).
  static std::string agreement_field(int i);
  /// 64-bit FNV-1a hash of agreement_record(): equal on ranks that would exchange the same bytes.
  std::uint64_t fingerprint() const;

  /// This rank's layouts, as the peer copy (Path::direct) exchanges them (see LayoutRecord).
  LayoutRecord layout_record() const {
    LayoutRecord r;
    for (int t = 0; t < num_tensors(); ++t)
      for (int side = 0; side < 2; ++side) {
        const Layout& l = side == 0 ? seq_layout(t) : head_layout(t);
        for (int i = 0; i < 4; ++i) {
          r.v[t][side][i] = l.extent[detail::at(i)];
          r.v[t][side][4 + i] = l.stride[detail::at(i)];
        }
      }
    return r;
  }

  /// A number no other plan of this process has; copies of a plan share it (they are the same
  /// plan). What a communicator keys what it learns about the plan on.
  std::uint64_t id() const { return id_; }
  /// The plan's agreement check (shared with its copies): whether exchanges check, whether a
  /// check has passed.
  AgreementCheck& agreement_check() const { return *check_; }
  /// Whether the first exchange of this plan on a communicator checks that every rank planned the
  /// same wire (check_agreement()). Default: on, in every build type; the macro
  /// ULYSSES_CHECK_AGREEMENT=0 turns the default off. Every rank must choose the same (a rank that
  /// skips the check while its peers make it leaves them waiting in the all-gather).
  bool agreement_check_enabled() const { return check_->enabled(); }
  /// Turns the cross-rank check of the first exchange on or off (call before the first exchange,
  /// the same on every rank; copies of the plan share the setting).
  void set_agreement_check(bool on) { check_->enable(on); }
  /// True once the cross-rank check has passed for this plan (on any communicator).
  bool agreement_checked() const { return check_->passed(); }

 private:
  std::size_t span_bytes(const Layout& l, int t) const { return static_cast<std::size_t>(l.span_elems()) * tensor(t).elem_bytes; }

  /// The StageLists of every (direction, stage) and the workspace. On a two-level plan every
  /// rank's region offsets advance stage after stage (a rank's route refers to its peers').
  void build_stages() {
    const detail::PlanInputs in = inputs();
    const std::size_t P = detail::at(group_.size), me = detail::at(group_.rank);
    std::size_t send = 0, recv = 0;
    for (int d = 0; d < 2; ++d) {
      const auto dir = static_cast<Direction>(d);
      std::vector<std::size_t> send_base(two_level_ ? P : 0), recv_base = send_base;  // every rank's (two-level)
      std::size_t sent = 0, received = 0;  // this rank's regions so far
      for (int k = 0; k < options_.stages; ++k) {
        detail::StageBuilder b(in, dir, k);
        if (two_level_) {
          const detail::TwoLevelRoute route(nodes_, chunk_matrix(dir, k), send_base, recv_base, options_.lanes);
          const detail::TwoLevelRoute::Regions& r = route.regions(group_.rank);
          lists_[d].push_back(b.build(send_base[me], recv_base[me], r.send_off, r.recv_off));
          StageLists& sc = lists_[d].back();
          sc.send_span = r.send_span;
          sc.recv_span = r.recv_span;
          for (int round = 0; round < 3; ++round) route.hops(group_.rank, round, sc.hop_send[detail::at(round)], sc.hop_recv[detail::at(round)]);
          for (std::size_t x = 0; x < P; ++x) {
            const auto spans = route.spans(static_cast<int>(x));
            send_base[x] += spans.first;
            recv_base[x] += spans.second;
          }
        } else {
          lists_[d].push_back(b.build(sent, received, {}, {}));
        }
        sent += lists_[d].back().send_span;
        received += lists_[d].back().recv_span;
      }
      send = std::max(send, sent);
      recv = std::max(recv, received);
    }
    recv_region_ = (send + kRegionAlignment - 1) / kRegionAlignment * kRegionAlignment;
    workspace_ = recv_region_ + recv;
  }

  std::uint64_t id_;
  std::shared_ptr<AgreementCheck> check_;           // shared with copies (the same plan)
  std::vector<StageLists> lists_[2];                // per direction, per stage
  std::size_t recv_region_ = 0, workspace_ = 0;
};

/// Views of every block list of `plan` that an executor may be given outside the direct path:
/// for each direction (seq_to_head, then head_to_seq), each stage k in [0, num_stages()), the
/// lists pack, unpack, pack_staged and unpack_staged of stage_lists(d, k), in that order (4 × 2 × K
/// views; empty lists included). What CudaExecutor(plan, stream) uploads (found by
/// argument-dependent lookup: executors include no planner). The peer copy's lists are not in
/// it (they are built at its first exchange, transport/peer_copy.hpp). Allocates the returned vector; the views point into `plan`,
/// which must outlive them.
inline std::vector<BlockList> block_lists(const Plan& plan) {
  std::vector<BlockList> lists;
  for (Direction d : {Direction::seq_to_head, Direction::head_to_seq})
    for (int k = 0; k < plan.num_stages(); ++k) {
      const StageLists& sc = plan.stage_lists(d, k);
      for (const std::vector<BlockCopy>* l : {&sc.pack, &sc.unpack, &sc.pack_staged, &sc.unpack_staged})
        lists.push_back(BlockList{l->data(), l->size()});
    }
  return lists;
}

ULYSSES_NAMESPACE_END

// ---- Plan's members defined in other headers -----------------------------------------------------
// Plan's class above declares them; their definitions need what those headers hold, and each of
// them includes this header first, so they are included here, last, where Plan is complete:
// - agreement_record(), agreement_field(), fingerprint(): plan/agreement.hpp (with
//   check_agreement(), which compares the records).
// plan/peer_lists.hpp follows: peer_copy_lists(plan, all), the peer copy's lists (no member of Plan).
#include "agreement.hpp"
#include "peer_lists.hpp"
