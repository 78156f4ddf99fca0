// SPDX-License-Identifier: Apache-2.0
/// @file plan.hpp
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

#include "copy.hpp"
#include "detail/checked.hpp"
#include "error.hpp"
#include "layout.hpp"
#include "partition.hpp"

ULYSSES_NAMESPACE_BEGIN

/// A member of a sequence-parallel group: the group's size (degree P) and this member's rank.
struct Group {
  int size = 1;  ///< P >= 1
  int rank = 0;  ///< in [0, P)
};

/// Which way a redistribution goes.
enum class Direction {
  seq_to_head,  ///< seq-sharded [B, S_r, H, D] → head-sharded [B, S, H_r, D] (before attention)
  head_to_seq,  ///< head-sharded → seq-sharded (after attention; the backward of seq_to_head)
};

/// One tensor of a redistribution (q, k, v, ...): its head partition, head dimension, element
/// size, and optionally this rank's local layouts (default: dense in the plan's Format).
struct TensorSpec {
  HeadPartition heads;              ///< head partition over the group (H = heads.num_heads())
  std::int64_t head_dim = 0;        ///< D, elements per head row
  std::size_t elem_bytes = 0;       ///< bytes per element (any trivially copyable type)
  std::optional<Layout> seq_layout;   ///< this rank's seq-sharded tensor, extents [B, S_r, H, D]
  std::optional<Layout> head_layout;  ///< this rank's head-sharded tensor, extents [B, S, H_r, D]

  /// Spec for elements of type T.
  template <class T>
  static TensorSpec of(HeadPartition heads, std::int64_t head_dim) {
    static_assert(std::is_trivially_copyable_v<T>, "ulysses moves elements as bytes: T must be trivially copyable");
    TensorSpec s{std::move(heads), head_dim, sizeof(T), std::nullopt, std::nullopt};
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
};

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
  bool direct_pieces = true;
};

/// One message of the message-level exchange (PlanOptions::direct_pieces): the bytes of one tensor
/// in the chunk between this rank and `peer`, in wire order. Both ranks of a pair list the same
/// pieces (one per tensor with bytes, in tensor order), so the k-th piece one sends to the other
/// is the k-th piece the other receives from it.
struct Piece {
  int peer = 0;             ///< the other rank
  int tensor = 0;           ///< index of the tensor in the plan
  std::size_t bytes = 0;    ///< > 0
  std::int32_t buffer = 0;  ///< where the bytes lie: Buffer::input(t) (sending) or Buffer::output(t)
                            ///< (receiving) when direct, else Buffer::send / Buffer::recv
  std::int64_t offset = 0;  ///< bytes from that buffer's base (the piece is `bytes` contiguous bytes there)
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
  std::vector<BlockCopy> pack;    ///< inputs → send region
  std::vector<BlockCopy> unpack;  ///< receive region → outputs, then this rank's own chunk inputs → outputs
  // Message-level exchange (PlanOptions::direct_pieces; each list in peer order, then tensor order).
  std::vector<Piece> send_pieces;        ///< what this rank sends, one piece per (peer, tensor) with bytes
  std::vector<Piece> recv_pieces;        ///< what this rank receives, likewise
  std::vector<BlockCopy> pack_staged;    ///< the pack blocks of the send pieces that are not direct
  std::vector<BlockCopy> unpack_staged;  ///< the unpack blocks of the receive pieces that are not direct, then the own chunk's
};

/// Everything one rank needs to run seq→head and head→seq for a set of tensors.
///
/// Wire format (stable): the chunk from rank i to rank j holds, for each tensor in the order
/// given, the block [B, tokens, heads, D] in row-major order (d fastest), where tokens are the
/// seq-sharded rank's local tokens (in its local order) and heads are the head-sharded rank's
/// heads (for head→seq, only the heads it owns: a replicated kv head is sent by its lowest rank).
/// Chunks lie back to back in peer order. Engines running their own collective can use
/// `schedule()` and the executors and move the wire themselves.
class Plan {
 public:
  /// Plans the redistribution of `tensors` for member `group.rank` of a group of `group.size`.
  ///
  /// @param group   this rank and the degree P
  /// @param batch   B >= 1
  /// @param seq     sequence partition over P ranks (S = seq.seq_len())
  /// @param tensors 1..kMaxTensors tensors, each with a head partition over P ranks
  /// @param format  memory order of the local tensors whose layouts are not given
  /// @throws Error(invalid_group) bad rank or size, or a partition made for another P;
  ///         Error(invalid_shape) B, D or element size < 1, or no / too many tensors;
  ///         Error(size_overflow) a tensor's byte count overflows int64;
  ///         Error(layout_mismatch) a layout whose extents are not the local shape;
  ///         Error(layout_aliasing) a layout with negative or aliasing strides;
  ///         Error(invalid_shape) options.stages outside [1, 64].
  Plan(Group group, std::int64_t batch, SeqPartition seq, std::vector<TensorSpec> tensors,
       Format format = Format::bshd, PlanOptions options = {})
      : group_(group), batch_(batch), seq_(std::move(seq)), tensors_(std::move(tensors)), format_(format), options_(options) {
    validate_global();
    for (std::size_t t = 0; t < tensors_.size(); ++t) resolve_layouts(static_cast<int>(t));
    std::size_t send = 0, recv = 0;
    for (int d = 0; d < 2; ++d) {
      std::size_t sb = 0, rb = 0;
      for (int k = 0; k < options_.stages; ++k) {
        sched_[d].emplace_back();
        build(static_cast<Direction>(d), k, sb, rb);
        sb += sched_[d].back().send_total, rb += sched_[d].back().recv_total;
      }
      send = std::max(send, sb), recv = std::max(recv, rb);
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

  /// Number of pipeline stages K (PlanOptions::stages).
  int num_stages() const { return options_.stages; }
  /// Chunks and block lists of direction d, stage `stage` in [0, K).
  const Schedule& schedule(Direction d, int stage = 0) const {
    return sched_[static_cast<int>(d)].at(static_cast<std::size_t>(stage));
  }
  /// Workspace bytes one call needs (either direction): send region at offset 0, receive region
  /// at recv_region_offset().
  std::size_t workspace_bytes() const { return workspace_; }
  /// Offset of the receive region in the workspace, bytes (a multiple of 256).
  std::size_t recv_region_offset() const { return recv_region_; }
  /// Bytes this rank sends to other ranks in direction d (its own chunk excluded).
  std::size_t exchanged_bytes(Direction d) const {
    std::size_t n = 0;
    for (const Schedule& sc : sched_[static_cast<int>(d)]) n += sc.send_total;
    return n;
  }

  /// 64-bit FNV-1a hash of the inputs every rank must share: P, B, the sequence partition, the
  /// plan's Format, the number of stages, PlanOptions::direct_pieces and, per tensor, its head ranges, head dim and element size. (Local layouts are
  /// not included: ranks may legitimately hold different views.)
  std::uint64_t fingerprint() const {
    std::uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](std::int64_t v) {
      for (int i = 0; i < 8; ++i) h = (h ^ static_cast<std::uint64_t>((v >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    };
    mix(group_.size), mix(batch_), mix(seq_.seq_len()), mix(static_cast<std::int64_t>(format_)), mix(options_.stages), mix(options_.direct_pieces);
    for (const SeqChunk& c : seq_.chunks()) mix(c.rank), mix(c.offset), mix(c.length);
    for (const TensorSpec& x : tensors_) {
      mix(x.heads.num_heads()), mix(x.head_dim), mix(static_cast<std::int64_t>(x.elem_bytes));
      for (int r = 0; r < group_.size; ++r) mix(x.heads.begin(r)), mix(x.heads.end(r));
    }
    return h;
  }

  /// Whether the first exchange of this plan checks that every rank planned from the same inputs
  /// (see check_agreement() in redistribute.hpp). Default: on in debug builds (NDEBUG undefined),
  /// off otherwise; the macro ULYSSES_CHECK_AGREEMENT (0 or 1) overrides the default.
  bool check_agreement() const { return check_; }
  /// Turns the cross-rank check of the first exchange on or off (call before the first exchange).
  void set_check_agreement(bool on) { check_ = on; }
  /// True once the cross-rank check has passed for this plan (no further checks are made).
  bool agreement_checked() const { return checked_; }
  /// Records that the cross-rank check passed (called by check_agreement()).
  void mark_agreement_checked() const { checked_ = true; }

 private:
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
      std::int64_t n = detail::mul(batch_, seq_.seq_len(), "B*S");
      n = detail::mul(n, x.heads.num_heads(), "B*S*H");
      n = detail::mul(n, x.head_dim, "B*S*H*D");
      n = detail::mul(n, static_cast<std::int64_t>(x.elem_bytes), "bytes of B*S*H*D");
      total = detail::add(total, n, "bytes of all tensors");
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
    for (int i = 0; i < 4; ++i)
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

  /// Appends the block copying extents `ext` from (src buffer, byte offset, element strides) to
  /// (dst buffer, byte offset, element strides).
  static void add_block(std::vector<BlockCopy>& list, const std::int64_t ext[4], int t_elem_bytes, int sbuf,
                        std::int64_t soff, const std::int64_t sstr[4], int dbuf, std::int64_t doff, const std::int64_t dstr[4]) {
    BlockCopy c;
    if (detail::make_block(ext, sstr, dstr, t_elem_bytes, soff, doff, sbuf, dbuf, c)) list.push_back(c);
  }

  /// Builds stage k of direction dir; its chunks start at send_base / recv_base of the regions.
  void build(Direction dir, int k, std::size_t send_base, std::size_t recv_base) {
    const int P = group_.size, me = group_.rank, K = options_.stages;
    const bool s2h = dir == Direction::seq_to_head;
    Schedule& sc = sched_[static_cast<int>(dir)][static_cast<std::size_t>(k)];
    sc.send_bytes.assign(P, 0);
    sc.send_offsets.assign(P, 0);
    sc.recv_bytes.assign(P, 0);
    sc.recv_offsets.assign(P, 0);
    // Chunk between a seq-sharded rank `sr` and a head-sharded rank `hr`: [B, S_sr, heads of hr, D]
    // per tensor; in head→seq only the heads hr owns; of those, part k of K. Returns the head range.
    auto heads_of = [&](const TensorSpec& x, int hr) {
      const std::int64_t b = s2h ? x.heads.begin(hr) : x.heads.owned_begin(hr), n = x.heads.end(hr) - b;
      const std::int64_t lo = b + k * (n / K) + std::min<std::int64_t>(k, n % K);
      return std::pair<std::int64_t, std::int64_t>(lo, lo + n / K + (k < n % K ? 1 : 0));
    };
    auto chunk_bytes = [&](int sr, int hr) {
      std::size_t n = 0;
      for (auto& x : tensors_) {
        auto [hb, he] = heads_of(x, hr);
        n += static_cast<std::size_t>(batch_ * seq_.local_length(sr) * (he - hb) * x.head_dim) * x.elem_bytes;
      }
      return n;
    };
    for (int p = 0; p < P; ++p) {
      if (p == me) continue;
      sc.send_bytes[p] = s2h ? chunk_bytes(me, p) : chunk_bytes(p, me);
      sc.recv_bytes[p] = s2h ? chunk_bytes(p, me) : chunk_bytes(me, p);
    }
    for (int p = 0; p < P; ++p) {
      sc.send_offsets[p] = send_base + sc.send_total, sc.send_total += sc.send_bytes[p];
      sc.recv_offsets[p] = recv_base + sc.recv_total, sc.recv_total += sc.recv_bytes[p];
    }
    const std::vector<SeqChunk> my_chunks = seq_.chunks_of(me);
    struct Mark {  // where a (peer, tensor) piece starts in the block lists and in the regions
      std::size_t pack, unpack;
      std::int64_t send, recv;
      int peer, tensor;
    };
    std::vector<Mark> pieces;
    for (int p = 0; p < P; ++p) {
      const std::int64_t T = seq_.local_length(s2h ? me : p);
      // Pack: this rank sends to p. Unpack: this rank receives from p.
      std::int64_t send_t_off = static_cast<std::int64_t>(sc.send_offsets[p]);
      std::int64_t recv_t_off = static_cast<std::int64_t>(sc.recv_offsets[p]);
      const std::vector<SeqChunk> peer_chunks = seq_.chunks_of(p);
      for (int t = 0; t < num_tensors(); ++t) {
        if (p != me) pieces.push_back({sc.pack.size(), sc.unpack.size(), send_t_off, recv_t_off, p, t});
        const TensorSpec& x = tensors_[static_cast<std::size_t>(t)];
        const Layout& sl = *x.seq_layout;
        const Layout& hl = *x.head_layout;
        const std::int64_t e = static_cast<std::int64_t>(x.elem_bytes), D = x.head_dim;
        const int in = Buffer::input(t), out = Buffer::output(t);
        if (s2h) {
          // seq→head. Pack to p: my tokens, p's heads. Unpack from p: p's tokens, my heads.
          const auto [hb, he] = heads_of(x, p);
          const std::int64_t Hp = he - hb;
          const auto [mb, me_end] = heads_of(x, me);
          const std::int64_t Hm = me_end - mb;
          if (p == me) {
            for (const SeqChunk& c : my_chunks) {
              const std::int64_t ext[4] = {batch_, c.length, Hm, D};
              add_block(sc.unpack, ext, e, in, sl.offset(0, c.local_offset, mb, 0) * e, sl.stride, out,
                        hl.offset(0, c.offset, mb - x.heads.begin(me), 0) * e, hl.stride);
            }
            continue;
          }
          {
            const std::int64_t ext[4] = {batch_, T, Hp, D};
            const std::int64_t wire[4] = {T * Hp * D, Hp * D, D, 1};
            add_block(sc.pack, ext, e, in, sl.offset(0, 0, hb, 0) * e, sl.stride, Buffer::send, send_t_off, wire);
            send_t_off += batch_ * T * Hp * D * e;
          }
          const std::int64_t Tp = seq_.local_length(p);
          const std::int64_t wire[4] = {Tp * Hm * D, Hm * D, D, 1};
          for (const SeqChunk& c : peer_chunks) {
            const std::int64_t ext[4] = {batch_, c.length, Hm, D};
            add_block(sc.unpack, ext, e, Buffer::recv, recv_t_off + c.local_offset * Hm * D * e, wire, out,
                      hl.offset(0, c.offset, mb - x.heads.begin(me), 0) * e, hl.stride);
          }
          recv_t_off += batch_ * Tp * Hm * D * e;
        } else {
          // head→seq. Pack to p: p's tokens, the heads I own. Unpack from p: my tokens, p's owned heads.
          const auto [ob, oe] = heads_of(x, me);
          const std::int64_t Ho = oe - ob, mb = x.heads.begin(me);
          if (p == me) {
            for (const SeqChunk& c : my_chunks) {
              const std::int64_t ext[4] = {batch_, c.length, Ho, D};
              add_block(sc.unpack, ext, e, in, hl.offset(0, c.offset, ob - mb, 0) * e, hl.stride, out,
                        sl.offset(0, c.local_offset, ob, 0) * e, sl.stride);
            }
            continue;
          }
          const std::int64_t Tp = seq_.local_length(p);
          {
            const std::int64_t wire[4] = {Tp * Ho * D, Ho * D, D, 1};
            for (const SeqChunk& c : peer_chunks) {
              const std::int64_t ext[4] = {batch_, c.length, Ho, D};
              add_block(sc.pack, ext, e, in, hl.offset(0, c.offset, ob - mb, 0) * e, hl.stride, Buffer::send,
                        send_t_off + c.local_offset * Ho * D * e, wire);
            }
            send_t_off += batch_ * Tp * Ho * D * e;
          }
          const auto [pb, pe] = heads_of(x, p);
          const std::int64_t Hp = pe - pb, Tm = seq_.local_length(me);
          const std::int64_t ext[4] = {batch_, Tm, Hp, D};
          const std::int64_t wire[4] = {Tm * Hp * D, Hp * D, D, 1};
          add_block(sc.unpack, ext, e, Buffer::recv, recv_t_off, wire, out, sl.offset(0, 0, pb, 0) * e, sl.stride);
          recv_t_off += batch_ * Tm * Hp * D * e;
        }
      }
    }
    split_pieces(sc, pieces);
  }

  /// Fills the message-level lists of `sc` from the marks of its (peer, tensor) pieces.
  template <class Mark>
  static void split_pieces(Schedule& sc, const std::vector<Mark>& marks) {
    for (std::size_t i = 0; i < marks.size(); ++i) {
      const Mark& m = marks[i];
      const bool last = i + 1 == marks.size();
      for (int send = 1; send >= 0; --send) {
        const std::vector<BlockCopy>& all = send ? sc.pack : sc.unpack;
        std::size_t end = last ? all.size() : send ? marks[i + 1].pack : marks[i + 1].unpack;
        const std::size_t begin = send ? m.pack : m.unpack;
        if (!send)  // the own chunk's blocks sit between two peers' pieces: they are not part of this one
          while (end > begin && all[end - 1].src_buffer != Buffer::recv) --end;
        std::size_t bytes = 0;
        for (std::size_t b = begin; b < end; ++b) bytes += static_cast<std::size_t>(all[b].bytes());
        if (!bytes) continue;
        Piece pc{m.peer, m.tensor, bytes, send ? Buffer::send : Buffer::recv, send ? m.send : m.recv};
        if (end - begin == 1 && all[begin].rows() == 1) {  // one contiguous range of the user's tensor
          pc.buffer = send ? all[begin].src_buffer : all[begin].dst_buffer;
          pc.offset = send ? all[begin].src_offset : all[begin].dst_offset;
        } else {
          std::vector<BlockCopy>& staged = send ? sc.pack_staged : sc.unpack_staged;
          staged.insert(staged.end(), all.begin() + static_cast<std::ptrdiff_t>(begin), all.begin() + static_cast<std::ptrdiff_t>(end));
        }
        (send ? sc.send_pieces : sc.recv_pieces).push_back(pc);
      }
    }
    for (const BlockCopy& c : sc.unpack)  // the own chunk: input → output, after the exchange
      if (c.src_buffer != Buffer::recv) sc.unpack_staged.push_back(c);
  }

  Group group_;
  std::int64_t batch_;
  SeqPartition seq_;
  std::vector<TensorSpec> tensors_;
  Format format_;
  PlanOptions options_;
  std::vector<Schedule> sched_[2];  // per direction, per stage
  std::size_t recv_region_ = 0, workspace_ = 0;
#if defined(ULYSSES_CHECK_AGREEMENT)
  bool check_ = ULYSSES_CHECK_AGREEMENT;
#elif defined(NDEBUG)
  bool check_ = false;
#else
  bool check_ = true;
#endif
  mutable bool checked_ = false;  // not atomic: one plan object is used by one rank's thread
};

ULYSSES_NAMESPACE_END
