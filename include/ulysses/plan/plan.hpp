// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Plan: validation, wire chunks, block lists and workspace size of one redistribution.
///
/// Planning is a pure host computation (no communication; it allocates, so do it once, outside
/// the training step). Every rank computes the same global picture from the same inputs, so a bad
/// configuration is rejected on every rank before any rank enters a collective.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../layout/blocks.hpp"
#include "../layout/element.hpp"
#include "../detail/checked.hpp"
#include "../error.hpp"
#include "../layout/layout.hpp"
#include "../partition/heads.hpp"
#include "../topology/route.hpp"

ULYSSES_NAMESPACE_BEGIN

/// A member of a sequence-parallel group: the group's size (degree P) and this member's rank.
struct Group {
  int size = 1;  ///< P >= 1
  int rank = 0;  ///< in [0, P)
};

/// Which way a redistribution goes.
enum class Direction {
  seq_to_head,  ///< seq-sharded [B, S_r, H, D] → head-sharded [B, S, H_r, D] (before attention)
  head_to_seq,  ///< head-sharded → seq-sharded (after attention; with Replicas::sum, the backward of seq_to_head)
};

/// What head→seq does with a head that several ranks hold (GQA/MQA kv heads when Hkv < P, or the
/// shared boundary head of balanced splits).
enum class Replicas {
  sum,    ///< add the holders' copies, in ascending rank order (element.hpp): head→seq is then the
          ///< adjoint (backward) of seq→head, what dk and dv need. The default.
  owner,  ///< take the copy of the owner (the lowest holder): head→seq is then the inverse of
          ///< seq→head (head_to_seq(seq_to_head(x)) == x), but not its adjoint.
};

/// Name of a Replicas value ("sum", "owner").
inline const char* to_string(Replicas r) noexcept { return r == Replicas::sum ? "sum" : "owner"; }

/// One tensor of a redistribution (q, k, v, ...): its head partition, head dimension, element
/// size and type, what head→seq does with replicated heads, which query tensor it serves (kv
/// tensors), and optionally this rank's local layouts (default: dense in the plan's Format).
///
/// Prefer attention_specs() (attention.hpp), which makes q, k, v and o of an attention layer
/// with the GQA pairing right by construction.
struct TensorSpec {
  HeadPartition heads;                ///< head partition over the group (H = heads.num_heads())
  std::int64_t head_dim = 0;          ///< D, elements per head row
  std::size_t elem_bytes = 0;         ///< bytes per element (any trivially copyable type)
  std::optional<Layout> seq_layout;   ///< this rank's seq-sharded tensor, extents [B, S_r, H, D]
  std::optional<Layout> head_layout;  ///< this rank's head-sharded tensor, extents [B, S, H_r, D]
  ElementType type = ElementType::opaque;  ///< what the elements are (needed to sum replicated heads)
  Replicas replicas = Replicas::sum;       ///< head→seq of a head held by several ranks (only matters then)
  int serves = kAuto;  ///< for a kv tensor: index (in the plan) of the query tensor it serves; kNone; or kAuto

  /// `serves`: decide from the head counts (see Plan): a tensor after the first whose head count
  /// divides the first tensor's and is smaller serves the first (the q, k, v convention).
  static constexpr int kAuto = -2;
  /// `serves`: the tensor serves no query tensor (no GQA pairing check).
  static constexpr int kNone = -1;

  /// Spec for elements of type T (type: element_type_of<T>: float32, float64, or opaque unless
  /// specialised).
  template <class T>
  static TensorSpec of(HeadPartition heads, std::int64_t head_dim) {
    return of<T>(std::move(heads), head_dim, element_type_of_v<T>);
  }
  /// Spec for elements of type T that are `type` (e.g. your own bf16 struct as
  /// ElementType::bfloat16). The sizes must agree (checked by Plan: Error(invalid_shape)).
  template <class T>
  static TensorSpec of(HeadPartition heads, std::int64_t head_dim, ElementType type) {
    static_assert(std::is_trivially_copyable_v<T>, "ulysses moves elements as bytes: T must be trivially copyable");
    TensorSpec s{std::move(heads), head_dim, sizeof(T), std::nullopt, std::nullopt};
    s.type = type;
    return s;
  }
  /// Sets this rank's seq-sharded layout (strides in elements; extents must be [B, S_r, H, D]).
  TensorSpec& with_seq_layout(const Layout& l) {
    seq_layout = l;
    return *this;
  }
  /// Sets this rank's head-sharded layout (strides in elements; extents must be [B, S, H_r, D]).
  TensorSpec& with_head_layout(const Layout& l) {
    head_layout = l;
    return *this;
  }
  /// Sets what head→seq does with replicated heads (Replicas::sum by default).
  TensorSpec& with_replicas(Replicas r) {
    replicas = r;
    return *this;
  }
  /// Declares the element type (its size must be elem_bytes).
  TensorSpec& with_type(ElementType t) {
    type = t;
    return *this;
  }
  /// Declares that this kv tensor serves the query tensor at index `query` of the plan (or kNone).
  TensorSpec& serving(int query) {
    serves = query;
    return *this;
  }
};

/// Which transport moves the bytes between the ranks (PlanOptions::path; choose_path() in
/// transport.hpp picks one for `automatic`). Every path gives the same bytes.
enum class Path : int {
  automatic = 0,  ///< the fewest copies the communicator and executor allow: direct, else messages, else alltoallv
  alltoallv,      ///< pack into the send region, one all-to-all-v of the wire, unpack from the receive region
  messages,       ///< one message per (peer, tensor), sent from / received into the user's tensors where
                  ///< contiguous, staged in the workspace otherwise (communicator: exchange_messages())
  direct,         ///< ranks that share memory copy straight from each other's inputs into their own
                  ///< outputs: one copy per element, no workspace (communicator: with_peers())
  two_level,      ///< pack, three rounds of messages along PlanOptions::nodes (gather per destination node,
                  ///< one message per node pair, deliver; topology.hpp), unpack (communicator: exchange_messages())
};

/// Name of a path ("automatic", "alltoallv", "messages", "direct").
inline const char* to_string(Path p) noexcept {
  switch (p) {
    case Path::automatic: return "automatic";
    case Path::alltoallv: return "alltoallv";
    case Path::messages: return "messages";
    case Path::direct: return "direct";
    case Path::two_level: return "two_level";
  }
  return "?";
}

/// Planning options.
struct PlanOptions {
  /// K >= 1: split each exchange into K stages along the heads (each rank's head range of every
  /// tensor cut into K balanced parts), so that packing stage k+1 and unpacking stage k-1 can run
  /// while stage k is exchanged (see HostPipeline). K = 1 is one exchange. At most 64.
  int stages = 1;
  /// Exchange one message per (peer, tensor) instead of one chunk per peer, wherever the
  /// communicator can (it has exchange_messages(), see redistribute.hpp: LocalGroup::Comm and
  /// MpiComm) and the executor runs on the host. A message whose bytes form one contiguous range
  /// of the user's tensor is then sent straight from the input, or received straight into the
  /// output, skipping its pack or unpack copy (e.g. in bshd with B = 1, one stage and one sequence
  /// chunk per rank, seq→head receives every message in place and head→seq sends in place every
  /// piece except those of kv heads a rank holds without owning them; Piece::direct() tells).
  /// Same bytes either way. Every rank must choose the same (it is part of Plan::fingerprint()),
  /// and use the same communicator and executor types (the path also depends on them).
  /// `false` with Path::automatic means Path::alltoallv.
  bool direct_pieces = true;
  /// The transport (Path::automatic: chosen by choose_path() from what the communicator and the
  /// executor can do). A path they cannot do is Error(path_unsupported) before any exchange.
  Path path = Path::automatic;
  /// Which node each rank of the group runs on (default: one node). When the group spans nodes
  /// and `path` is automatic or two_level, the plan lays out the two-level exchange
  /// (Plan::two_level(); topology.hpp): a forwarder's chunks for another node are packed into its
  /// gathered area and a receiver's unpacked from its received area, so that plan then runs on
  /// Path::two_level (or direct, which does not use the wire). Mesh::nodes() and split_by_node()
  /// (comm/mpi.hpp) give it. Every rank must pass the same (it is part of the agreement record).
  NodeLayout nodes{};
  /// Two-level exchange: inter-node messages per ordered node pair (topology.hpp). 1 (default):
  /// one forwarder per node pair carries its node's bytes for the other node; k: k lanes, each
  /// with its own forwarder and receiver; 0: one lane per rank of the destination node
  /// (rail-aligned, as NCCL's PXN: each rank's inter-node bytes those of the flat exchange, in
  /// N - 1 messages). advise_degree() (cost.hpp) says which pays on given links. >= 0.
  int lanes = 1;
};

/// One message of the message-level exchange (Path::messages): the bytes of one tensor, of one
/// batch index and one sequence chunk of the seq-sharded side, in the chunk between this rank and
/// `peer`, in wire order. Both ranks of a pair list the same pieces (in tensor, then batch, then
/// chunk order; empty ones left out), so the k-th piece one sends to the other is the k-th piece
/// the other receives from it.
struct Piece {
  int peer = 0;             ///< the other rank
  int tensor = 0;           ///< index of the tensor in the plan
  std::size_t bytes = 0;    ///< > 0
  std::int32_t buffer = 0;  ///< where the bytes lie: Buffer::input(t) (sending) or Buffer::output(t)
                            ///< (receiving) when direct, else Buffer::send / Buffer::recv
  std::int64_t offset = 0;  ///< bytes from that buffer's base (the piece is `bytes` contiguous bytes there)
  std::size_t wire_offset = 0;  ///< where the piece lies in the send (resp. receive) region, bytes
  std::uint32_t first = 0;      ///< its blocks: [first, last) of Schedule::pack (sending) or of
  std::uint32_t last = 0;       ///< Schedule::unpack (receiving; a summed head's terms are not among them)
  /// True when the piece lies in the user's tensor (no pack / unpack copy).
  bool direct() const { return buffer != Buffer::send && buffer != Buffer::recv; }
};

/// The wire chunks and block lists of one direction (one stage), for this rank. Byte counts and offsets are
/// indexed by peer rank; offsets are relative to the send (resp. receive) region of the workspace
/// (stage k's chunks follow stage k-1's).
/// The chunk with this rank itself is always empty: its data goes straight from input to output
/// through blocks of `unpack` (which thus reads the inputs too).
struct Schedule {
  std::vector<std::size_t> send_bytes;    ///< bytes this rank sends to each peer
  std::vector<std::size_t> send_offsets;  ///< offset of each peer's chunk in the send region
  std::vector<std::size_t> recv_bytes;    ///< bytes this rank receives from each peer
  std::vector<std::size_t> recv_offsets;  ///< offset of each peer's chunk in the receive region
  std::size_t send_total = 0;             ///< bytes this stage sends (its chunks start at send_offsets[0])
  std::size_t recv_total = 0;             ///< bytes this stage receives
  /// Of send_total: bytes of heads this rank holds without owning them, sent in head→seq only for
  /// tensors that sum their replicas (Replicas::sum): the extra bytes of the summed inverse.
  std::size_t replica_bytes = 0;
  std::vector<BlockCopy> pack;    ///< inputs → send region, piece by piece (Piece::first/last)
  /// Receive region → outputs piece by piece, then this rank's own chunk (inputs → outputs), then
  /// the sums of replicated heads (head→seq with Replicas::sum: terms from the receive region and
  /// from this rank's input, in ascending rank order).
  std::vector<BlockCopy> unpack;
  // Message-level exchange (PlanOptions::direct_pieces; each list in peer order, then tensor order).
  std::vector<Piece> send_pieces;        ///< what this rank sends, one piece per (peer, tensor) with bytes
  std::vector<Piece> recv_pieces;        ///< what this rank receives, likewise
  std::vector<BlockCopy> pack_staged;    ///< the pack blocks of the send pieces that are not direct
  std::vector<BlockCopy> unpack_staged;  ///< the unpack blocks of the receive pieces that are not direct, then the own chunk's and the sums
  /// Bytes this stage occupies in the send (resp. receive) region: send_total (recv_total), or on
  /// a two-level plan also the areas where this rank gathers and receives other ranks' chunks.
  std::size_t send_span = 0, recv_span = 0;
  /// Two-level plans (Plan::two_level()): what this rank sends and receives in each of the three
  /// rounds (intra-node gather, inter-node, intra-node delivery); each list in the order both ends
  /// of a pair list their transfers. Chunks of this rank travel from send_offsets and land at
  /// recv_offsets as on the other paths, but those offsets may lie in the gathered / received areas.
  std::array<std::vector<Hop>, 3> hop_send, hop_recv;
};

/// One rank's local layouts (extents and strides of the seq-sharded and head-sharded layout of
/// every tensor), as the ranks exchange them once per plan for the direct transport: a rank that
/// reads a peer's input must know how the peer holds it.
struct LayoutRecord {
  std::int64_t v[kMaxTensors][2][8] = {};  ///< [tensor][0: seq-sharded, 1: head-sharded][extents 0..3, strides 4..7]
};

/// Copies per element of one direction on one rank: bytes the executor copies (packs, unpacks,
/// sums and direct copies; a sum counts once per element it writes) and bytes the transport
/// delivers, both over the bytes of the rank's outputs. DeepSpeed-Ulysses' op sequence counts
/// executor 1 at B = 1 (the permute before its all-to-all) and 2 at B > 1, transport 1.
struct CopyCount {
  double executor = 0;   ///< executor bytes / output bytes
  double transport = 0;  ///< bytes received from other ranks / output bytes
};

/// The fixed-size record of what determines the wire, all-gathered by check_agreement()
/// (redistribute.hpp): kAgreementWords 64-bit words, one field (or a hash of one) per word.
inline constexpr int kAgreementWords = 64;
using AgreementRecord = std::array<std::uint64_t, kAgreementWords>;

/// Everything one rank needs to run seq→head and head→seq for a set of tensors.
///
/// Wire format (stable): the chunk from rank i to rank j holds, for each tensor in the order
/// given, the block [B, tokens, heads, D] in row-major order (d fastest), where tokens are the
/// seq-sharded rank's local tokens (in its local order) and heads are the head-sharded rank's
/// heads of the stage in increasing order: in seq→head all it holds; in head→seq the heads it
/// owns, and with Replicas::sum (for a tensor whose ranges overlap) every head it holds, so that
/// the receiver can add the copies. With K stages, stage k carries part k of K of every rank's
/// range (seq→head) or of every owner's owned range (head→seq: a replica goes in the stage its
/// owner sends it). Chunks lie back to back in peer order. Engines running their own collective
/// can use `schedule()` and the executors and move the wire themselves.
class Plan {
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
  Plan(Group group, std::int64_t batch, SeqPartition seq, std::vector<TensorSpec> tensors,
       Format format = Format::bshd, PlanOptions options = {})
      : group_(group), batch_(batch), seq_(std::move(seq)), tensors_(std::move(tensors)), format_(format), options_(options) {
    validate_global();
    for (std::size_t t = 0; t < tensors_.size(); ++t) resolve_layouts(static_cast<int>(t));
    std::size_t send = 0, recv = 0;
    const auto P = static_cast<std::size_t>(group_.size);
    for (int d = 0; d < 2; ++d) {
      // Two-level plans: every rank's region offsets, stage after stage (a rank's route refers to
      // its peers' offsets).
      std::vector<std::size_t> sbase(two_level_ ? P : 0), rbase = sbase;
      std::size_t sb = 0, rb = 0;
      for (int k = 0; k < options_.stages; ++k) {
        sched_[d].emplace_back();
        if (two_level_) {
          const detail::TwoLevelRoute route(nodes_, chunk_matrix(static_cast<Direction>(d), k), sbase, rbase, options_.lanes);
          const detail::TwoLevelRoute::Regions& mine = route.regions(group_.rank);
          build(static_cast<Direction>(d), k, sbase[ix(group_.rank)], rbase[ix(group_.rank)], mine.send_off, mine.recv_off);
          Schedule& sc = sched_[d].back();
          sc.send_span = mine.send_span;
          sc.recv_span = mine.recv_span;
          for (int round = 0; round < 3; ++round) route.hops(group_.rank, round, sc.hop_send[ix(round)], sc.hop_recv[ix(round)]);
          for (int x = 0; x < group_.size; ++x) {
            const auto sp = route.spans(x);
            sbase[ix(x)] += sp.first;
            rbase[ix(x)] += sp.second;
          }
        } else {
          build(static_cast<Direction>(d), k, sb, rb, {}, {});
        }
        sb += sched_[d].back().send_span;
        rb += sched_[d].back().recv_span;
      }
      send = std::max(send, sb);
      recv = std::max(recv, rb);
    }
    recv_region_ = (send + 255) / 256 * 256;
    workspace_ = recv_region_ + recv;
  }

  const Group& group() const { return group_; }                 ///< this rank and P
  int degree() const { return group_.size; }                    ///< P
  int rank() const { return group_.rank; }                      ///< this rank
  std::int64_t batch() const { return batch_; }                 ///< B
  std::int64_t seq_len() const { return seq_.seq_len(); }       ///< S
  const SeqPartition& seq() const { return seq_; }              ///< the sequence partition
  Format format() const { return format_; }                     ///< default memory order
  const PlanOptions& options() const { return options_; }       ///< planning options
  int num_tensors() const { return static_cast<int>(tensors_.size()); }
  const TensorSpec& tensor(int t) const { return tensors_.at(static_cast<std::size_t>(t)); }
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
  int serves(int t) const { return serves_.at(static_cast<std::size_t>(t)); }
  /// True when head→seq sums tensor t's replicated heads: it has some (its ranges overlap) and
  /// Replicas::sum.
  bool sums_replicas(int t) const { return tensor(t).replicas == Replicas::sum && !tensor(t).heads.disjoint(); }
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
  /// Chunks and block lists of direction d, stage `stage` in [0, K).
  const Schedule& schedule(Direction d, int stage = 0) const {
    return sched_[static_cast<int>(d)].at(static_cast<std::size_t>(stage));
  }
  /// Bytes every rank sends every other in stage k of direction dir: [i * P + j] is the chunk from
  /// rank i to rank j (0 for i == j: a rank's own data never travels), computed from the shared
  /// inputs alone, so any rank's plan gives the whole matrix (what the two-level route and the
  /// cost model use). O(P^2) time and memory. @pre stage in [0, num_stages()).
  std::vector<std::size_t> chunk_matrix(Direction dir, int k) const {
    const int P = group_.size, T = num_tensors();
    const bool s2h = dir == Direction::seq_to_head;
    std::vector<std::size_t> c(ix(P) * ix(P), 0);
    for (int t = 0; t < T; ++t) {
      const TensorSpec& x = tensors_[ix(t)];
      const bool sums = !s2h && sums_replicas(t);
      const auto row = static_cast<std::size_t>(batch_ * x.head_dim) * x.elem_bytes;  // bytes of one token of one head
      std::vector<std::int64_t> n(ix(P));
      for (int r = 0; r < P; ++r) n[ix(r)] = total(stage_heads(x, sums, r, s2h, k));
      for (int i = 0; i < P; ++i)
        for (int j = 0; j < P; ++j) {
          if (i == j) continue;
          const int sr = s2h ? i : j, hr = s2h ? j : i;  // the seq-sharded and head-sharded side
          c[ix(i) * ix(P) + ix(j)] += static_cast<std::size_t>(seq_.local_length(sr) * n[ix(hr)]) * row;
        }
    }
    return c;
  }

  /// Workspace bytes one call needs (either direction): send region at offset 0, receive region
  /// at recv_region_offset().
  std::size_t workspace_bytes() const { return workspace_; }
  /// Offset of the receive region in the workspace, bytes (a multiple of 256).
  std::size_t recv_region_offset() const { return recv_region_; }
  /// Bytes this rank sends to other ranks in direction d (its own chunk excluded), all stages.
  std::size_t exchanged_bytes(Direction d) const {
    std::size_t n = 0;
    for (const Schedule& sc : sched_[static_cast<int>(d)]) n += sc.send_total;
    return n;
  }
  /// Of exchanged_bytes(d): the copies of replicated heads this rank sends without owning them
  /// (head→seq with Replicas::sum; 0 otherwise): what the summed inverse sends beyond the plain one.
  std::size_t replica_bytes(Direction d) const {
    std::size_t n = 0;
    for (const Schedule& sc : sched_[static_cast<int>(d)]) n += sc.replica_bytes;
    return n;
  }

  /// Copies per element of direction d on this rank when it takes path p (Path::automatic counts
  /// as alltoallv; Path::direct is 1 executor copy and no transport by construction; on
  /// Path::two_level the transport counts every byte this rank receives in the three rounds,
  /// including what it forwards for others).
  CopyCount copies(Direction d, Path p) const {
    double out = 0, exec = 0, wire = 0;
    auto bytes = [](const std::vector<BlockCopy>& l) {
      double n = 0;
      for (const BlockCopy& c : l) n += static_cast<double>(c.written_bytes());
      return n;
    };
    for (const Schedule& sc : sched_[static_cast<int>(d)]) {
      out += bytes(sc.unpack);
      if (p == Path::two_level) {  // every hop this rank receives, forwarded chunks included
        for (const auto& round : sc.hop_recv)
          for (const Hop& h : round) wire += static_cast<double>(h.bytes);
      } else {
        wire += static_cast<double>(sc.recv_total);
      }
      exec += p == Path::messages ? bytes(sc.pack_staged) + bytes(sc.unpack_staged) : bytes(sc.pack) + bytes(sc.unpack);
    }
    if (out == 0) return {};
    if (p == Path::direct) return {1, 0};
    return {exec / out, wire / out};
  }

  /// What determines the wire, one field per word: P, B, S, the sequence partition, the number of
  /// tensors, stages, path options, and per tensor its head partition (H and ranges), its head dim
  /// and element size, and how head→seq treats its replicas (with the element type, when it sums).
  /// Nothing that is a rank's own business: not its layouts or format, not its pointers. Ranks
  /// whose records differ would exchange different bytes; check_agreement() compares them.
  AgreementRecord agreement_record() const {
    AgreementRecord w{};
    auto hash = [](std::uint64_t h, std::int64_t v) {  // 64-bit FNV-1a over the 8 bytes of v
      for (int i = 0; i < 8; ++i) h = (h ^ static_cast<std::uint64_t>((v >> (8 * i)) & 0xff)) * 0x100000001b3ull;
      return h;
    };
    const std::uint64_t h0 = 0xcbf29ce484222325ull;
    w[0] = 0x756c797373657301ull;  // "ulysses" + record version 1
    w[1] = static_cast<std::uint64_t>(group_.size);
    w[2] = static_cast<std::uint64_t>(batch_);
    w[3] = static_cast<std::uint64_t>(seq_.seq_len());
    std::uint64_t h = h0;
    for (const SeqChunk& c : seq_.chunks()) h = hash(hash(hash(h, c.rank), c.offset), c.length);
    w[4] = h;
    w[5] = tensors_.size();
    w[6] = static_cast<std::uint64_t>(options_.stages);
    w[7] = (options_.direct_pieces ? 1 : 0) | static_cast<std::uint64_t>(options_.path) << 1;
    int max_node = 1;  // lanes >= the largest node are all "one lane per rank": the same wire
    for (int n = 0; n < nodes_.num_nodes(); ++n) max_node = std::max(max_node, static_cast<int>(nodes_.members(n).size()));
    const std::uint64_t lanes = options_.lanes >= max_node ? 0u : static_cast<unsigned>(options_.lanes), golden = 0x9e3779b97f4a7c15u;
    w[kNodesWord] = two_level_ ? (nodes_.hash() ^ (lanes * golden)) | 1u : 0u;
    for (std::size_t t = 0; t < tensors_.size(); ++t) {
      const TensorSpec& x = tensors_[t];
      h = hash(h0, x.heads.num_heads());
      for (int r = 0; r < group_.size; ++r) h = hash(hash(h, x.heads.begin(r)), x.heads.end(r));
      w[kHeadsWord + t] = h;
      w[kElementWord + t] = hash(hash(h0, x.head_dim), static_cast<std::int64_t>(x.elem_bytes));
      const bool sums = sums_replicas(static_cast<int>(t));
      w[kReplicasWord + t] = hash(hash(h0, sums ? 1 : 0), sums ? static_cast<std::int64_t>(x.type) : 0);
    }
    return w;
  }
  /// What word i of agreement_record() stands for ("the head partition of tensor 1", ...).
  static std::string agreement_field(int i) {
    static const char* const first[8] = {"the record version", "the group size P", "the batch B", "the sequence length S",
                                         "the sequence partition", "the number of tensors", "the number of stages K",
                                         "the path options (PlanOptions::path, direct_pieces)"};
    if (i < 8) return first[i];
    if (i < kElementWord) return "the head partition of tensor " + std::to_string(i - kHeadsWord);
    if (i < kReplicasWord) return "the head dim or element size of tensor " + std::to_string(i - kElementWord);
    if (i < kReplicasWord + kMaxTensors) return "the replica handling (Replicas, element type) of tensor " + std::to_string(i - kReplicasWord);
    if (i == kNodesWord) return "the node layout of the two-level exchange (PlanOptions::nodes, lanes)";
    return "word " + std::to_string(i);
  }
  /// 64-bit FNV-1a hash of agreement_record(): equal on ranks that would exchange the same bytes.
  std::uint64_t fingerprint() const {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (std::uint64_t v : agreement_record())
      for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    return h;
  }

  /// This rank's layouts, for the direct transport (see LayoutRecord).
  LayoutRecord layout_record() const {
    LayoutRecord r;
    for (int t = 0; t < num_tensors(); ++t)
      for (int side = 0; side < 2; ++side) {
        const Layout& l = side == 0 ? seq_layout(t) : head_layout(t);
        for (int i = 0; i < 4; ++i) {
          r.v[t][side][i] = l.extent[static_cast<std::size_t>(i)];
          r.v[t][side][4 + i] = l.stride[static_cast<std::size_t>(i)];
        }
      }
    return r;
  }
  /// Builds the direct transport's block lists from every rank's layout_record() (`all` holds P
  /// of them, in rank order). Called once per plan by the direct transport (it allocates); the
  /// lists stay with the plan. @throws Error(plan_mismatch) when a record's extents are not the
  /// ones rank p's local shape has (the ranks' plans differ).
  void set_peer_layouts(const LayoutRecord* all) const {
    for (int d = 0; d < 2; ++d) build_direct(static_cast<Direction>(d), all);
    direct_ready_ = true;
  }
  /// True once set_peer_layouts() has run.
  bool has_direct_lists() const { return direct_ready_; }
  /// The direct transport's block list of direction d (all stages at once): for every peer p (this
  /// rank included) and tensor, the blocks copying p's input (Buffer::peer_input(p, t)) into this
  /// rank's outputs, then the sums of replicated heads (head→seq, Replicas::sum) over the holders'
  /// inputs in ascending rank order. One copy per element, no workspace. @pre has_direct_lists()
  const std::vector<BlockCopy>& direct_list(Direction d) const { return direct_[static_cast<int>(d)]; }

  /// Whether the first exchange of this plan checks that every rank planned the same wire (see
  /// check_agreement() in redistribute.hpp). Default: on, in every build type; the macro
  /// ULYSSES_CHECK_AGREEMENT=0 turns the default off. Every rank must choose the same (a rank
  /// that skips the check while its peers make it leaves them waiting in the all-gather).
  bool check_agreement() const { return check_; }
  /// Turns the cross-rank check of the first exchange on or off (call before the first exchange,
  /// the same on every rank).
  void set_check_agreement(bool on) { check_ = on; }
  /// True once the cross-rank check has passed for this plan (no further checks are made).
  bool agreement_checked() const { return checked_; }
  /// Records that the cross-rank check passed (called by check_agreement()).
  void mark_agreement_checked() const { checked_ = true; }

 private:
  static constexpr int kHeadsWord = 8, kElementWord = kHeadsWord + kMaxTensors, kReplicasWord = kElementWord + kMaxTensors;
  static constexpr int kNodesWord = kReplicasWord + kMaxTensors;
  static_assert(kNodesWord < kAgreementWords, "the agreement record holds every field");

  /// A run of heads [lo, hi).
  struct Run {
    std::int64_t lo, hi;
  };

  std::size_t span_bytes(const Layout& l, int t) const { return static_cast<std::size_t>(l.span_elems()) * tensor(t).elem_bytes; }

  void validate_global() {
    const int P = group_.size;
    if (P < 1) detail::fail(Errc::invalid_group, "group size P=" + std::to_string(P) + " must be >= 1");
    if (group_.rank < 0 || group_.rank >= P)
      detail::fail(Errc::invalid_group, "rank " + std::to_string(group_.rank) + " is outside the group [0, " + std::to_string(P) + ")");
    if (seq_.degree() != P)
      detail::fail(Errc::invalid_group, "the sequence partition was made for P=" + std::to_string(seq_.degree()) +
                                            " ranks but the group has P=" + std::to_string(P));
    if (batch_ < 1) detail::fail(Errc::invalid_shape, "batch B=" + std::to_string(batch_) + " must be >= 1");
    if (options_.stages < 1 || options_.stages > 64)
      detail::fail(Errc::invalid_shape, "PlanOptions::stages=" + std::to_string(options_.stages) + " must be in [1, 64]");
    if (tensors_.empty() || tensors_.size() > static_cast<std::size_t>(kMaxTensors))
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
    two_level_ = options_.path == Path::two_level || (options_.path == Path::automatic && nodes_.spans_nodes());
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
    serves_.assign(static_cast<std::size_t>(T), TensorSpec::kNone);
    for (int t = 0; t < T; ++t) {
      const TensorSpec& x = tensors_[static_cast<std::size_t>(t)];
      int q = x.serves;
      const std::int64_t Hkv = x.heads.num_heads();
      if (q == TensorSpec::kAuto) {
        const std::int64_t H0 = tensors_[0].heads.num_heads();
        q = t > 0 && Hkv < H0 && H0 % Hkv == 0 ? 0 : TensorSpec::kNone;
      }
      if (q == TensorSpec::kNone) continue;
      const std::string name = "tensor " + std::to_string(t);
      if (q < 0 || q >= T || q == t || tensors_[static_cast<std::size_t>(q)].serves >= 0)
        detail::fail(Errc::gqa_invalid, name + " says it serves tensor " + std::to_string(q) +
                                            ", which is not another query tensor of the plan (0.." + std::to_string(T - 1) + ")");
      const HeadPartition& qh = tensors_[static_cast<std::size_t>(q)].heads;
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
      serves_[static_cast<std::size_t>(t)] = q;
    }
  }

  void resolve_layouts(int t) {
    TensorSpec& x = tensors_[static_cast<std::size_t>(t)];
    const std::int64_t H = x.heads.num_heads(), D = x.head_dim, r = group_.rank;
    const std::int64_t Sr = seq_.local_length(group_.rank), Hr = x.heads.count(group_.rank);
    if (!x.seq_layout) x.seq_layout = Layout::dense(format_, batch_, Sr, H, D);
    if (!x.head_layout) x.head_layout = Layout::dense(format_, batch_, seq_.seq_len(), Hr, D);
    check_layout(*x.seq_layout, {batch_, Sr, H, D}, x.elem_bytes, "seq-sharded layout of tensor " + std::to_string(t) + " on rank " + std::to_string(r));
    check_layout(*x.head_layout, {batch_, seq_.seq_len(), Hr, D}, x.elem_bytes,
                 "head-sharded layout of tensor " + std::to_string(t) + " on rank " + std::to_string(r));
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

  /// Part k of K of the head range [b, e) (balanced: the first (e-b) % K parts one head longer).
  Run part(std::int64_t b, std::int64_t e, int k) const {
    const std::int64_t n = e - b, K = options_.stages;
    const std::int64_t lo = b + k * (n / K) + std::min<std::int64_t>(k, n % K);
    return {lo, lo + n / K + (k < n % K ? 1 : 0)};
  }

  /// The heads of tensor x that head-sharded rank hr puts on the wire in stage k, ascending:
  /// seq→head: part k of its range; head→seq: part k of its owned range, and when x sums its
  /// replicas also the heads it holds of lower owners, each in the stage of its owner's part.
  std::vector<Run> stage_heads(const TensorSpec& x, bool sums, int hr, bool s2h, int k) const {
    const HeadPartition& hp = x.heads;
    std::vector<Run> runs;
    auto add = [&](Run r) {
      if (r.hi > r.lo) runs.push_back(r);
    };
    if (s2h) {
      add(part(hp.begin(hr), hp.end(hr), k));
    } else if (!sums) {
      add(part(hp.owned_begin(hr), hp.end(hr), k));
    } else {
      for (int o = 0; o <= hr; ++o) {  // owned ranges ascend with o
        const Run p = part(hp.owned_begin(o), hp.end(o), k);
        add({std::max(p.lo, hp.begin(hr)), std::min(p.hi, hp.end(hr))});
      }
    }
    return runs;
  }
  static std::int64_t total(const std::vector<Run>& runs) {
    std::int64_t n = 0;
    for (const Run& r : runs) n += r.hi - r.lo;
    return n;
  }
  /// Position of head h in the list `runs` (h must be in it).
  static std::int64_t index_of(const std::vector<Run>& runs, std::int64_t h) {
    std::int64_t i = 0;
    for (const Run& r : runs) {
      if (h < r.hi) return i + (h - r.lo);
      i += r.hi - r.lo;
    }
    return i;
  }

  /// An index (rank, tensor, holder) as a container index.
  template <class I>
  static constexpr std::size_t ix(I i) { return static_cast<std::size_t>(i); }

  /// Appends the block copying extents `ext` from (src buffer, byte offset, element strides) to
  /// (dst buffer, byte offset, element strides).
  static void add_block(std::vector<BlockCopy>& list, const std::int64_t ext[4], std::int64_t elem_bytes, int sbuf,
                        std::int64_t soff, const std::int64_t sstr[4], int dbuf, std::int64_t doff, const std::int64_t dstr[4]) {
    BlockCopy c;
    if (detail::make_block(ext, sstr, dstr, elem_bytes, soff, doff, sbuf, dbuf, c)) list.push_back(c);
  }

  /// Builds stage k of direction dir; its chunks start at send_base / recv_base of the regions
  /// (on a two-level plan, `send_off` / `recv_off` place each peer's chunk: the route's regions;
  /// empty: back to back).
  void build(Direction dir, int k, std::size_t send_base, std::size_t recv_base, const std::vector<std::size_t>& send_off,
             const std::vector<std::size_t>& recv_off) {
    const int P = group_.size, me = group_.rank, T = num_tensors();
    const bool s2h = dir == Direction::seq_to_head;
    Schedule& sc = sched_[static_cast<int>(dir)][static_cast<std::size_t>(k)];
    sc.send_bytes.assign(ix(P), 0);
    sc.send_offsets.assign(ix(P), 0);
    sc.recv_bytes.assign(ix(P), 0);
    sc.recv_offsets.assign(ix(P), 0);
    // heads[t][r]: the heads head-sharded rank r puts on the wire for tensor t in this stage.
    std::vector<std::vector<std::vector<Run>>> heads(static_cast<std::size_t>(T));
    std::vector<char> sums(static_cast<std::size_t>(T));
    for (int t = 0; t < T; ++t) {
      sums[ix(t)] = !s2h && sums_replicas(t);
      for (int r = 0; r < P; ++r) heads[ix(t)].push_back(stage_heads(tensors_[ix(t)], sums[ix(t)], r, s2h, k));
    }
    // Bytes of tensor t in the chunk between seq-sharded rank sr and head-sharded rank hr.
    auto piece_bytes = [&](int t, int sr, int hr) {
      const TensorSpec& x = tensors_[static_cast<std::size_t>(t)];
      return static_cast<std::size_t>(batch_ * seq_.local_length(sr) * total(heads[ix(t)][ix(hr)]) * x.head_dim) * x.elem_bytes;
    };
    // recv_at[p][t]: offset of tensor t's piece from p in the receive region.
    std::vector<std::vector<std::size_t>> recv_at(static_cast<std::size_t>(P), std::vector<std::size_t>(static_cast<std::size_t>(T)));
    std::vector<std::vector<std::size_t>> send_at = recv_at;
    std::size_t so = send_base, ro = recv_base;
    for (int p = 0; p < P; ++p) {
      if (!send_off.empty() && p != me) {  // the chunk may lie in a gathered / received area
        so = send_off[ix(p)];
        ro = recv_off[ix(p)];
      }
      sc.send_offsets[ix(p)] = so;
      sc.recv_offsets[ix(p)] = ro;
      if (p != me)
        for (int t = 0; t < T; ++t) {
          send_at[ix(p)][ix(t)] = so;
          recv_at[ix(p)][ix(t)] = ro;
          const std::size_t sb = s2h ? piece_bytes(t, me, p) : piece_bytes(t, p, me);
          const std::size_t rb = s2h ? piece_bytes(t, p, me) : piece_bytes(t, me, p);
          so += sb;
          ro += rb;
          sc.send_bytes[ix(p)] += sb;
          sc.recv_bytes[ix(p)] += rb;
          if (sums[ix(t)]) {  // heads I hold below my owned range are copies I send only to be summed
            const TensorSpec& x = tensors_[static_cast<std::size_t>(t)];
            const std::int64_t own = x.heads.owned_begin(me);
            std::int64_t n = 0;
            for (const Run& r : heads[ix(t)][ix(me)]) n += std::max<std::int64_t>(0, std::min(r.hi, own) - r.lo);
            sc.replica_bytes += static_cast<std::size_t>(batch_ * seq_.local_length(p) * n * x.head_dim) * x.elem_bytes;
          }
        }
      sc.send_total += sc.send_bytes[ix(p)];
      sc.recv_total += sc.recv_bytes[ix(p)];
    }
    sc.send_span = sc.send_total;  // a two-level plan's constructor sets its own
    sc.recv_span = sc.recv_total;
    // A head of tensor t is summed on receipt when several ranks hold it (and t sums).
    auto summed = [&](int t, std::int64_t h) {
      if (!sums[ix(t)]) return false;
      const auto [f, l] = tensors_[static_cast<std::size_t>(t)].heads.holders(h);
      return l - f > 1;
    };
    // Splits a list of runs into the maximal runs of heads that are (not) summed.
    auto runs_where = [&](int t, const std::vector<Run>& runs, bool want_summed) {
      std::vector<Run> out;
      for (const Run& r : runs)
        for (std::int64_t h = r.lo; h < r.hi; ++h) {
          if (summed(t, h) != want_summed) continue;
          if (!out.empty() && out.back().hi == h) ++out.back().hi;
          else out.push_back({h, h + 1});
        }
      return out;
    };
    const std::vector<SeqChunk> my_chunks = seq_.chunks_of(me);
    const std::int64_t Tm = seq_.local_length(me);
    // The chunk between me and a peer holds, per tensor, the wire block [B, Ts, n, D] (Ts: the
    // seq-side rank's local tokens, n: the head-side rank's heads of this stage). It is cut into
    // one piece per (b, chunk of the seq-side rank): the same cut on both sides (it depends on B
    // and the sequence partition only), and each piece is contiguous in the user's tensor more
    // often than the whole (bshd: seq→head receives, head→seq sends every piece in place, at any
    // B, for zigzag splits too).
    for (int p = 0; p < P; ++p) {
      if (p == me) continue;
      const std::vector<SeqChunk> peer_chunks = seq_.chunks_of(p);
      const std::int64_t Tp = seq_.local_length(p);
      for (int t = 0; t < T; ++t) {
        const TensorSpec& x = tensors_[static_cast<std::size_t>(t)];
        const Layout& sl = *x.seq_layout;
        const Layout& hl = *x.head_layout;
        const std::int64_t e = static_cast<std::int64_t>(x.elem_bytes), D = x.head_dim, hb = x.heads.begin(me);
        const int in = Buffer::input(t), out = Buffer::output(t);
        // Sending to p: the seq side is me (seq→head) or p (head→seq); the heads are p's or mine.
        {
          const std::vector<SeqChunk>& cs = s2h ? my_chunks : peer_chunks;
          const std::int64_t Ts = s2h ? Tm : Tp;
          const std::vector<Run>& hs = heads[ix(t)][ix(s2h ? p : me)];
          const std::int64_t n = total(hs);
          const std::int64_t wire[4] = {Ts * n * D, n * D, D, 1};
          for (std::int64_t b = 0; b < batch_; ++b)
            for (const SeqChunk& c : cs) {
              const auto off = static_cast<std::int64_t>(send_at[ix(p)][ix(t)]) + ((b * Ts + c.local_offset) * n) * D * e;
              Piece pc{p, t, static_cast<std::size_t>(c.length * n * D * e), Buffer::send, off, static_cast<std::size_t>(off)};
              pc.first = static_cast<std::uint32_t>(sc.pack.size());
              for (const Run& r : hs) {
                const std::int64_t ext[4] = {1, c.length, r.hi - r.lo, D};
                const std::int64_t src = s2h ? sl.offset(b, c.local_offset, r.lo, 0) : hl.offset(b, c.offset, r.lo - hb, 0);
                add_block(sc.pack, ext, e, in, src * e, s2h ? sl.stride : hl.stride, Buffer::send, off + index_of(hs, r.lo) * D * e, wire);
              }
              pc.last = static_cast<std::uint32_t>(sc.pack.size());
              if (pc.bytes) sc.send_pieces.push_back(place(pc, sc.pack, true));
            }
        }
        // Receiving from p: the seq side is p (seq→head) or me (head→seq); the heads are mine or
        // p's (those summed on receipt are read by the sums below, not copied here).
        {
          const std::vector<SeqChunk>& cs = s2h ? peer_chunks : my_chunks;
          const std::int64_t Ts = s2h ? Tp : Tm;
          const std::vector<Run>& hs = heads[ix(t)][ix(s2h ? me : p)];
          const std::int64_t n = total(hs);
          const std::int64_t wire[4] = {Ts * n * D, n * D, D, 1};
          const std::vector<Run> copied = s2h ? hs : runs_where(t, hs, false);
          for (std::int64_t b = 0; b < batch_; ++b)
            for (const SeqChunk& c : cs) {
              const auto off = static_cast<std::int64_t>(recv_at[ix(p)][ix(t)]) + ((b * Ts + c.local_offset) * n) * D * e;
              Piece pc{p, t, static_cast<std::size_t>(c.length * n * D * e), Buffer::recv, off, static_cast<std::size_t>(off)};
              pc.first = static_cast<std::uint32_t>(sc.unpack.size());
              for (const Run& r : copied) {
                const std::int64_t ext[4] = {1, c.length, r.hi - r.lo, D};
                const std::int64_t dst = s2h ? hl.offset(b, c.offset, r.lo - hb, 0) : sl.offset(b, c.local_offset, r.lo, 0);
                add_block(sc.unpack, ext, e, Buffer::recv, off + index_of(hs, r.lo) * D * e, wire, out, dst * e, s2h ? hl.stride : sl.stride);
              }
              pc.last = static_cast<std::uint32_t>(sc.unpack.size());
              if (pc.bytes) sc.recv_pieces.push_back(place(pc, sc.unpack, false));
            }
        }
      }
    }
    // This rank's own chunk: input → output, for the heads it would send itself.
    const std::size_t own_first = sc.unpack.size();
    for (int t = 0; t < T; ++t) {
      const TensorSpec& x = tensors_[static_cast<std::size_t>(t)];
      const Layout& sl = *x.seq_layout;
      const Layout& hl = *x.head_layout;
      const std::int64_t e = static_cast<std::int64_t>(x.elem_bytes), D = x.head_dim, hb = x.heads.begin(me);
      const int in = Buffer::input(t), out = Buffer::output(t);
      for (const Run& r : s2h ? heads[ix(t)][ix(me)] : runs_where(t, heads[ix(t)][ix(me)], false))
        for (const SeqChunk& c : my_chunks) {
          const std::int64_t ext[4] = {batch_, c.length, r.hi - r.lo, D};
          if (s2h)
            add_block(sc.unpack, ext, e, in, sl.offset(0, c.local_offset, r.lo, 0) * e, sl.stride, out,
                      hl.offset(0, c.offset, r.lo - hb, 0) * e, hl.stride);
          else
            add_block(sc.unpack, ext, e, in, hl.offset(0, c.offset, r.lo - hb, 0) * e, hl.stride, out,
                      sl.offset(0, c.local_offset, r.lo, 0) * e, sl.stride);
        }
    }
    // Sums (head→seq, Replicas::sum): each head of this stage held by several ranks, from every
    // holder's copy in ascending rank order (the wire of a peer, this rank's own input).
    for (int t = 0; t < T; ++t) {
      if (!sums[ix(t)]) continue;
      const TensorSpec& x = tensors_[static_cast<std::size_t>(t)];
      const HeadPartition& hp = x.heads;
      const Layout& sl = *x.seq_layout;
      const Layout& hl = *x.head_layout;
      const std::int64_t e = static_cast<std::int64_t>(x.elem_bytes), D = x.head_dim;
      std::vector<Run> stage;  // the heads of this stage: part k of every owned range
      for (int o = 0; o < P; ++o) {
        const Run r = part(hp.owned_begin(o), hp.end(o), k);
        if (r.hi > r.lo) stage.push_back(r);
      }
      for (const Run& run : runs_where(t, stage, true)) {
        for (std::int64_t a = run.lo; a < run.hi;) {  // sub-runs with the same holders
          const auto holders = hp.holders(a);
          std::int64_t b = a + 1;
          while (b < run.hi && hp.holders(b) == holders) ++b;
          const int n = holders.second - holders.first;
          for (const SeqChunk& c : my_chunks) {
            const std::int64_t ext[4] = {batch_, c.length, b - a, D};
            std::vector<std::array<std::int64_t, 4>> strides(static_cast<std::size_t>(n));
            std::vector<const std::int64_t*> sp(static_cast<std::size_t>(n));
            std::vector<std::int64_t> soff(static_cast<std::size_t>(n));
            std::vector<int> sbuf(static_cast<std::size_t>(n));
            for (int j = 0; j < n; ++j) {
              const int q = holders.first + j;
              if (q == me) {
                strides[ix(j)] = {hl.stride[0], hl.stride[1], hl.stride[2], hl.stride[3]};
                soff[ix(j)] = hl.offset(0, c.offset, a - hp.begin(me), 0) * e;
                sbuf[ix(j)] = Buffer::input(t);
              } else {
                const std::int64_t nq = total(heads[ix(t)][ix(q)]);
                strides[ix(j)] = {Tm * nq * D, nq * D, D, 1};
                soff[ix(j)] = static_cast<std::int64_t>(recv_at[ix(q)][ix(t)]) + (c.local_offset * nq + index_of(heads[ix(t)][ix(q)], a)) * D * e;
                sbuf[ix(j)] = Buffer::recv;
              }
              sp[ix(j)] = strides[ix(j)].data();
            }
            std::vector<BlockCopy> g(static_cast<std::size_t>(n));
            if (detail::make_blocks(ext, n, sp.data(), sl.stride, e, soff.data(), sl.offset(0, c.local_offset, a, 0) * e,
                                    sbuf.data(), Buffer::output(t), x.type, g.data()))
              sc.unpack.insert(sc.unpack.end(), g.begin(), g.end());
          }
          a = b;
        }
      }
    }
    // Message-level lists: the staged blocks of the pieces that are not direct, then the rest.
    for (const Piece& pc : sc.send_pieces)
      if (!pc.direct()) sc.pack_staged.insert(sc.pack_staged.end(), sc.pack.begin() + pc.first, sc.pack.begin() + pc.last);
    for (const Piece& pc : sc.recv_pieces)
      if (!pc.direct()) sc.unpack_staged.insert(sc.unpack_staged.end(), sc.unpack.begin() + pc.first, sc.unpack.begin() + pc.last);
    sc.unpack_staged.insert(sc.unpack_staged.end(), sc.unpack.begin() + static_cast<std::ptrdiff_t>(own_first), sc.unpack.end());
  }

  /// Builds direct_[dir] (see direct_list()) from every rank's layouts.
  void build_direct(Direction dir, const LayoutRecord* all) const {
    const int P = group_.size, me = group_.rank, T = num_tensors();
    const bool s2h = dir == Direction::seq_to_head;
    std::vector<BlockCopy>& out = direct_[static_cast<int>(dir)];
    out.clear();
    const std::vector<SeqChunk> my_chunks = seq_.chunks_of(me);
    for (int t = 0; t < T; ++t) {
      const TensorSpec& x = tensors_[static_cast<std::size_t>(t)];
      const HeadPartition& hp = x.heads;
      const std::int64_t e = static_cast<std::int64_t>(x.elem_bytes), D = x.head_dim;
      auto layout_of = [&](int p, bool seq_side) {
        const std::int64_t* v = all[p].v[t][seq_side ? 0 : 1];
        const Layout l = Layout::strided({v[0], v[1], v[2], v[3]}, {v[4], v[5], v[6], v[7]});
        const std::int64_t want[4] = {batch_, seq_side ? seq_.local_length(p) : seq_.seq_len(), seq_side ? hp.num_heads() : hp.count(p), D};
        for (int i = 0; i < 4; ++i)
          if (l.extent[i] != want[i])
            detail::fail(Errc::plan_mismatch, "rank " + std::to_string(p) + " holds tensor " + std::to_string(t) + " as " + l.str() +
                                                  ", not the local shape this rank's plan gives it; the ranks' plans differ");
        return l;
      };
      if (s2h) {  // my heads of every peer's tokens, from the peer's seq-sharded input
        const Layout& hl = *x.head_layout;
        const std::int64_t hb = hp.begin(me), n = hp.count(me);
        for (int p = 0; p < P; ++p) {
          const Layout lp = layout_of(p, true);
          for (const SeqChunk& c : seq_.chunks_of(p)) {
            const std::int64_t ext[4] = {batch_, c.length, n, D};
            add_block(out, ext, e, Buffer::peer_input(p, t), lp.offset(0, c.local_offset, hb, 0) * e, lp.stride, Buffer::output(t),
                      hl.offset(0, c.offset, 0, 0) * e, hl.stride);
          }
        }
        continue;
      }
      // head→seq: every head of my tokens from its owner, or summed over its holders.
      const Layout& sl = *x.seq_layout;
      const bool sums = sums_replicas(t);
      for (std::int64_t a = 0; a < hp.num_heads();) {
        const auto holders = hp.holders(a);
        std::int64_t b = a + 1;
        while (b < hp.num_heads() && hp.holders(b) == holders) ++b;
        const int n = sums ? holders.second - holders.first : 1;
        std::vector<Layout> lq;
        std::vector<std::array<std::int64_t, 4>> strides;
        std::vector<int> bufs;
        for (int j = 0; j < n; ++j) {
          lq.push_back(layout_of(holders.first + j, false));
          strides.push_back({lq[ix(j)].stride[0], lq[ix(j)].stride[1], lq[ix(j)].stride[2], lq[ix(j)].stride[3]});
          bufs.push_back(Buffer::peer_input(holders.first + j, t));
        }
        for (const SeqChunk& c : my_chunks) {
          const std::int64_t ext[4] = {batch_, c.length, b - a, D};
          std::vector<const std::int64_t*> sp;
          std::vector<std::int64_t> soff;
          for (int j = 0; j < n; ++j) {
            sp.push_back(strides[ix(j)].data());
            soff.push_back(lq[ix(j)].offset(0, c.offset, a - hp.begin(holders.first + j), 0) * e);
          }
          std::vector<BlockCopy> g(static_cast<std::size_t>(n));
          if (detail::make_blocks(ext, n, sp.data(), sl.stride, e, soff.data(), sl.offset(0, c.local_offset, a, 0) * e, bufs.data(),
                                  Buffer::output(t), x.type, g.data()))
            out.insert(out.end(), g.begin(), g.end());
        }
        a = b;
      }
    }
  }

  /// Makes a piece direct when its blocks are one contiguous range of the user's tensor that
  /// covers all its bytes (sending: one pack block; receiving: one unpack block, and no byte of it
  /// is a term of a sum).
  static Piece place(Piece pc, const std::vector<BlockCopy>& list, bool sending) {
    if (pc.last - pc.first != 1) return pc;
    const BlockCopy& c = list[pc.first];
    if (c.rows() != 1 || static_cast<std::size_t>(c.bytes()) != pc.bytes) return pc;
    pc.buffer = sending ? c.src_buffer : c.dst_buffer;
    pc.offset = sending ? c.src_offset : c.dst_offset;
    return pc;
  }

  Group group_;
  std::int64_t batch_;
  SeqPartition seq_;
  std::vector<TensorSpec> tensors_;
  Format format_;
  PlanOptions options_;
  std::vector<int> serves_;
  NodeLayout nodes_;        // options_.nodes, or one node of P ranks
  bool two_level_ = false;  // see two_level()
  std::vector<Schedule> sched_[2];  // per direction, per stage
  std::size_t recv_region_ = 0, workspace_ = 0;
#if defined(ULYSSES_CHECK_AGREEMENT)
  bool check_ = ULYSSES_CHECK_AGREEMENT;
#else
  bool check_ = true;
#endif
  mutable bool checked_ = false;  // not atomic: one plan object is used by one rank's thread
  mutable bool direct_ready_ = false;
  mutable std::vector<BlockCopy> direct_[2];  // the direct transport's lists, per direction (set_peer_layouts)
};

/// Views of every block list of `plan` that an executor may be given outside the direct path:
/// for each direction (seq_to_head, then head_to_seq), each stage k in [0, num_stages()), the
/// lists pack, unpack, pack_staged and unpack_staged of schedule(d, k), in that order (4 × 2 × K
/// views; empty lists included). What CudaExecutor(plan, stream) uploads (found by
/// argument-dependent lookup: executors include no planner). The direct path's lists are not in
/// it (direct_list(), built later). Allocates the returned vector; the views point into `plan`,
/// which must outlive them.
inline std::vector<BlockList> block_lists(const Plan& plan) {
  std::vector<BlockList> lists;
  for (Direction d : {Direction::seq_to_head, Direction::head_to_seq})
    for (int k = 0; k < plan.num_stages(); ++k) {
      const Schedule& sc = plan.schedule(d, k);
      for (const std::vector<BlockCopy>* l : {&sc.pack, &sc.unpack, &sc.pack_staged, &sc.unpack_staged})
        lists.push_back(BlockList{l->data(), l->size()});
    }
  return lists;
}

ULYSSES_NAMESPACE_END
