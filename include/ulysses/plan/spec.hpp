// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What a plan is made from: the group, the direction, the tensors (TensorSpec) and the
///        planning options (PlanOptions, Path).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>

#include "../layout/element.hpp"
#include "../layout/layout.hpp"
#include "../partition/heads.hpp"
#include "../partition/ring.hpp"
#include "../topology/route.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Most pipeline stages one plan may have (PlanOptions::stages).
inline constexpr int kMaxStages = 64;

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

/// What a tensor's elements are on the wire (TensorSpec::wire; docs/wire-format.md, "fp8 rows").
enum class Wire : int {
  element = 0,   ///< the tensor's own elements (the default): the bytes as they are
  fp8_e4m3 = 1,  ///< each head row as D fp8 E4M3FN bytes then its float32 scale (layout/fp8.hpp)
  fp8_e5m2 = 2,  ///< each head row as D fp8 E5M2 bytes then its float32 scale
  bfloat16 = 3,  ///< each element cast to bfloat16 (a float32 tensor on half the bytes), back on unpack
  float16 = 4,   ///< each element cast to float16 (e.g. a bfloat16 tensor), back on unpack
};

/// Name of a wire ("element", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16").
inline const char* to_string(Wire w) noexcept {
  switch (w) {
    case Wire::fp8_e4m3: return "fp8_e4m3";
    case Wire::fp8_e5m2: return "fp8_e5m2";
    case Wire::bfloat16: return "bfloat16";
    case Wire::float16: return "float16";
    case Wire::element: break;
  }
  return "element";
}

/// One tensor of a redistribution (q, k, v, ...): its head partition, head dimension, element
/// size and type, what head→seq does with replicated heads, which query tensor it serves (kv
/// tensors), and optionally this rank's local layouts (default: dense in the plan's Format).
///
/// Prefer attention_specs() (plan/attention.hpp), which makes q, k, v and o of an attention layer
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
  /// Plan the tensor's blocks row by row, each row one head row of D elements with its RowCoord,
  /// so that a call's RowTransforms (layout/transform.hpp: RoPE, a scale, your own) can be
  /// applied to it in the copy (with_row_transforms()). Its pieces are then always staged (never
  /// sent from or received into the tensor in place). In the agreement record.
  bool row_transforms = false;
  /// How the tensor travels (Wire): its elements, or an fp8 wire of D bytes and one float32
  /// scale per head row (with_wire()). In the agreement record.
  Wire wire = Wire::element;

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
  /// Plans the tensor for row transforms (see `row_transforms`). Plan then requires its element
  /// type to be float16, bfloat16, float32 or float64, D <= 1024 and D contiguous (stride 1) in
  /// both layouts: else Error(invalid_shape).
  TensorSpec& with_row_transforms(bool on = true) {
    row_transforms = on;
    return *this;
  }
  /// Sends the tensor on a cast wire (Wire::bfloat16, Wire::float16): each element (after a
  /// call's pack transform, rounded to the element type) converted to the wire's type, rounded to
  /// nearest even, and back to the element type on unpack (exact). Or as an fp8 wire
  /// (Wire::fp8_e4m3 or fp8_e5m2): each head row quantized on
  /// pack with the scale of its own amax (layout/fp8.hpp: fp8_scale_of(), floored at FLT_MIN),
  /// the scale sent after the row's D bytes in the same exchange, dequantized on unpack as
  /// fp8_to_float(q) * scale in float32 and rounded once to the element type. A path without a
  /// wire (the peer copy, a rank's own chunk) quantizes and dequantizes the same way, so every
  /// path gives the same bits. Implies with_row_transforms() (and its requirements); a call's
  /// pack transform runs before the quantization, its unpack transform after.
  TensorSpec& with_wire(Wire w) {
    wire = w;
    if (w != Wire::element) row_transforms = true;
    return *this;
  }
  /// Whether the tensor's blocks are planned row by row (row transforms, or an fp8 wire).
  bool by_rows() const { return row_transforms || wire != Wire::element; }
  /// Bytes of one head row on the wire: D elements, D fp8 bytes and a 4-byte scale, or D 2-byte
  /// elements of a cast wire.
  std::size_t wire_row_bytes() const {
    const auto D = static_cast<std::size_t>(head_dim);
    if (wire == Wire::element) return D * elem_bytes;
    return wire == Wire::bfloat16 || wire == Wire::float16 ? 2 * D : D + 4;
  }
  /// Declares that this kv tensor serves the query tensor at index `query` of the plan (or kNone).
  TensorSpec& serving(int query) {
    serves = query;
    return *this;
  }
};

/// Which transport moves the bytes between the ranks (PlanOptions::path; choose_path() in
/// transport/dispatch.hpp picks one for `automatic`; each has its file under transport/). Every
/// path gives the same bytes.
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

/// Name of a path ("automatic", "alltoallv", "messages", "direct", "two_level").
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
  /// while stage k is exchanged (see HostPipeline). K = 1 is one exchange. At most kMaxStages (64).
  int stages = 1;
  /// Exchange one message per (peer, tensor) instead of one chunk per peer, wherever the
  /// communicator can (it has exchange_messages(), comm/concepts.hpp: LocalGroup::Comm, MpiComm,
  /// NcclComm) and the executor runs on the host. A message whose bytes form one contiguous range
  /// of the user's tensor is then sent straight from the input, or received straight into the
  /// output, skipping its pack or unpack copy (e.g. in bshd with B = 1, one stage and one sequence
  /// chunk per rank, seq→head receives every message in place and head→seq sends in place every
  /// piece except those of kv heads a rank holds without owning them; Piece::in_place() tells).
  /// Same bytes either way. Every rank must choose the same (it is part of Plan::fingerprint()),
  /// and use the same communicator and executor types (the path also depends on them).
  /// `false` with Path::automatic means Path::alltoallv.
  bool in_place_messages = true;
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
  /// The Ulysses × Ring configuration this plan serves, when the group is one of a hybrid's
  /// Ulysses groups (RingConfig::of(partition, causal); the plan's sequence partition is then
  /// RingPartition::ulysses_partition(j) of a ring rank j). Part of the agreement record: the
  /// plan's one all-gather before its first exchange (check_agreement()) then also compares U, R,
  /// the ring layout, causal and the global S across the group, and check_ring_config(plan, ...)
  /// (ring/agreement.hpp) uses it for the whole U × R block. Every rank must pass the same.
  /// Empty (default): a plain Ulysses group.
  std::optional<RingConfig> ring{};
  /// The stages are head bands (HeadBands, bands.hpp): stage k takes part k of each rank's query
  /// heads, and a kv tensor's heads go with the query heads that use them (StageCut in
  /// partition/heads.hpp: seq→head in the first band that uses a kv head, head→seq in the last),
  /// so that band k's attention needs only band k's bytes. Off (default): each tensor's range is
  /// cut on its own (kv heads fall in stages of their own count). Same bytes either way, once
  /// all stages ran. Part of the agreement record. Every rank must pass the same.
  bool head_bands = false;
  /// in_place_messages: whether the message path may be chosen.
  bool messages_enabled() const { return in_place_messages; }
};


ULYSSES_NAMESPACE_END
