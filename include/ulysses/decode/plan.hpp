// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The decode exchange of decode context parallelism, planned: DecodeSpec (what is merged),
///        DecodePlan (sizes, offsets, workspace; validation), DecodeBuffers and DecodeArgs (what
///        one call works on, as the executors read it).
///
/// Decode context parallelism (DCP; TensorRT-LLM's Helix, vLLM's DCP with `dcp_a2a_lse_reduce`,
/// SGLang's DCP) shards the KV cache of long sequences over the P ranks of a group. At every decode
/// step each rank r computes the attention of the new tokens' queries (all H heads) over its own
/// KV shard: the partial output O_r [B, T, H, Dv] and its log-sum-exp LSE_r [B, T, H] (fp32).
/// One exchange then gives rank j every rank's partials of its head group [h_begin(j), h_end(j))
/// and merges them by LSE weight (merge/lse.hpp, ascending rank order): rank j ends with the
/// attention output of its heads over the whole KV cache, [B, T, H_j, Dv] (DecodeOutput::heads),
/// or, after a second exchange of the merged head groups, all H heads on every rank
/// (DecodeOutput::all_heads).
///
/// Wire format (stable). The chunk rank i sends rank j (i ≠ j) carries the H_j heads rank j
/// merges, O and LSE together in ONE message:
///
///     [ O_i[:, :, h_begin(j):h_end(j), :]  as [B, T, H_j, Dv], row-major (dv fastest), partial type ]
///     [ zero to 15 bytes of padding: the LSE part starts at a multiple of 16 bytes from the chunk ]
///     [ LSE_i[:, :, h_begin(j):h_end(j)]   as [B, T, H_j], row-major, fp32 ]
///     [ padding to a multiple of 16 bytes ]
///
/// Chunks lie back to back in the send region in ascending peer order (the own rank skipped), and
/// so in the receive region. A rank's own share never crosses the transport: the merge reads it in
/// place from O_r and LSE_r. A rank with no heads (H < P) sends and receives empty chunks only.
/// DecodeOutput::all_heads adds a second exchange of the same format, made of the merged output
/// (out type) and merged LSE of the sender's own heads, the same chunk to every peer.
/// Padding bytes are not written (their contents are unspecified).
///
/// Planning is host work, done once: every rank computes the same sizes from the same inputs, so a
/// bad configuration is rejected with a coded Error on every rank before any rank enters a
/// collective. The call (decode/exchange.hpp) then allocates nothing.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../detail/checked.hpp"
#include "../detail/hash.hpp"
#include "../detail/limits.hpp"
#include "../error.hpp"
#include "../layout/element.hpp"
#include "../layout/layout.hpp"
#include "../merge/lse.hpp"
#include "../partition/heads.hpp"
#include "../plan/agreement_check.hpp"

ULYSSES_NAMESPACE_BEGIN

/// What the decode exchange returns on each rank.
enum class DecodeOutput : std::int32_t {
  heads = 0,      ///< rank j: its heads merged, O [B, T, H_j, Dv] and LSE [B, T, H_j] (one exchange)
  all_heads = 1,  ///< every rank: all H heads merged, O [B, T, H, Dv] and LSE [B, T, H] (a second exchange
                  ///< of the merged head groups: the all-gather variant)
};

/// Which collective carries the chunks (the same bytes either way).
enum class DecodePath : std::int32_t {
  automatic = 0,  ///< messages where the communicator has exchange_messages() and its memory is the executor's, else alltoallv
  alltoallv = 1,  ///< the communicator concept's alltoallv() (every communicator)
  messages = 2,   ///< one exchange_messages() message per peer with a non-empty chunk
  direct = 3,     ///< no wire: every rank merges its heads reading its peers' O_r and LSE_r in place
                  ///< (with_peers(): LocalGroup, MpiWindowComm), host executor; every rank's partial and
                  ///< LSE layouts the same (checked), P <= 64. Never chosen by automatic: ask for it
};

/// Name of a decode output ("heads", "all_heads").
inline const char* to_string(DecodeOutput o) noexcept { return o == DecodeOutput::all_heads ? "all_heads" : "heads"; }
/// Name of a decode path ("automatic", "alltoallv", "messages").
inline const char* to_string(DecodePath p) noexcept {
  return p == DecodePath::alltoallv ? "alltoallv" : p == DecodePath::messages ? "messages" : p == DecodePath::direct ? "direct" : "automatic";
}

/// The dense LSE layout [B, T, H] (h fastest) as a Layout with head-dim extent 1 (how decode specs
/// describe LSE tensors: extents [B, T, H, 1]).
constexpr Layout lse_layout_bth(std::int64_t B, std::int64_t T, std::int64_t H) { return Layout::strided({B, T, H, 1}, {T * H, H, 1, 1}); }
/// FlashAttention's softmax_lse order [B, H, T] (t fastest), as a Layout of extents [B, T, H, 1].
constexpr Layout lse_layout_bht(std::int64_t B, std::int64_t T, std::int64_t H) { return Layout::strided({B, T, H, 1}, {H * T, 1, T, 1}); }

/// What one decode exchange merges: shapes, head split, element types, LSE base, output, layouts.
///
/// Shapes (elements; logical order (b, t, h, d)): the partial output O_r [B, T, H, Dv] and LSE_r
/// [B, T, H] (fp32) of every rank; the merged output [B, T, H_j, Dv] and LSE [B, T, H_j] of rank j
/// (DecodeOutput::heads) or [B, T, H, Dv] and [B, T, H] (all_heads). Layouts are this rank's own
/// (they may differ between ranks); LSE layouts are Layouts of extents [B, T, H, 1] (see
/// lse_layout_bth()). Partial and output layouts need a contiguous head dim (stride 1 along d);
/// every other stride is free (strided views, e.g. an output slice of a larger tensor).
struct DecodeSpec {
  std::int64_t batch = 1;       ///< B, sequences (>= 1)
  std::int64_t tokens = 1;      ///< T, new tokens per sequence this step (>= 1; T > 1: speculative decoding)
  HeadPartition heads;          ///< the H query heads and the head group each rank merges (disjoint ranges; even or balanced)
  std::int64_t head_dim_v = 0;  ///< Dv, elements of one head's output row (>= 1)
  ElementType partial_type = ElementType::float32;  ///< element type of O_r: float32, float16 or bfloat16
  ElementType out_type = ElementType::float32;      ///< element type of the merged output (rounded once)
  LseBase base = LseBase::natural;                  ///< the base of every LSE in and out
  DecodeOutput output = DecodeOutput::heads;        ///< this rank's heads, or all heads (all-gather variant)
  DecodePath path = DecodePath::automatic;          ///< the collective (same bytes either way)
  std::optional<Layout> partial_layout;  ///< O_r [B, T, H, Dv]; default dense bshd
  std::optional<Layout> lse_layout;      ///< LSE_r [B, T, H, 1]; default lse_layout_bth()
  std::optional<Layout> out_layout;      ///< merged O [B, T, H_j or H, Dv]; default dense bshd
  std::optional<Layout> out_lse_layout;  ///< merged LSE [B, T, H_j or H, 1]; default lse_layout_bth()

  DecodeSpec() = default;
  /// B sequences of T new tokens, the head split `heads` over P = heads.degree() ranks, Dv; fp32 in
  /// and out, natural-log LSE, this rank's heads out, dense layouts.
  DecodeSpec(std::int64_t B, std::int64_t T, HeadPartition h, std::int64_t Dv)
      : batch(B), tokens(T), heads(std::move(h)), head_dim_v(Dv) {}

  /// Sets the element types of the partial outputs and of the merged output.
  DecodeSpec& with_types(ElementType partial, ElementType out) { partial_type = partial; out_type = out; return *this; }
  /// Sets the LSE base (natural or 2).
  DecodeSpec& with_base(LseBase b) { base = b; return *this; }
  /// Sets what the exchange returns (this rank's heads, or all heads).
  DecodeSpec& with_output(DecodeOutput o) { output = o; return *this; }
  /// Sets the collective (DecodePath::automatic by default).
  DecodeSpec& with_path(DecodePath p) { path = p; return *this; }
  /// Sets this rank's layouts of O_r and LSE_r (extents [B, T, H, Dv] and [B, T, H, 1]).
  DecodeSpec& with_partial_layouts(const Layout& o, const Layout& lse) { partial_layout = o; lse_layout = lse; return *this; }
  /// Sets this rank's layouts of the merged O and LSE (extents [B, T, H_j or H, Dv] and [.., 1]).
  DecodeSpec& with_out_layouts(const Layout& o, const Layout& lse) { out_layout = o; out_lse_layout = lse; return *this; }
};

/// What a rank knows about one peer p of the group (p = this rank included): its head group and
/// where its chunks lie. Offsets are bytes from the start of the named region (send, receive,
/// gather-receive; see DecodePlan::workspace_bytes()), multiples of 16.
struct DecodePeer {
  std::int64_t head_begin = 0;             ///< first head rank p merges
  std::int64_t head_count = 0;             ///< H_p
  std::uint64_t send_offset = 0;           ///< this rank → p: the chunk's offset in the send region (0 for p = rank)
  std::uint64_t send_lse_offset = 0;       ///< ... and of its LSE part (send region)
  std::uint64_t recv_offset = 0;           ///< p → this rank: the chunk's offset in the receive region
  std::uint64_t gather_recv_offset = 0;    ///< all_heads: p's merged chunk in the gather-receive region
  std::uint64_t gather_recv_lse_offset = 0;  ///< ... and of its LSE part
};

/// The buffers of one call (this rank's): pointers and the bytes each holds. Device memory for a
/// device executor, host memory for the host executor.
struct DecodeBuffers {
  const void* partial = nullptr;  ///< O_r, in DecodeSpec::partial_layout, partial_type elements
  std::size_t partial_bytes = 0;  ///< bytes at `partial` (>= the layout's span)
  const float* lse = nullptr;     ///< LSE_r, in DecodeSpec::lse_layout
  std::size_t lse_bytes = 0;      ///< bytes at `lse`
  void* out = nullptr;            ///< merged O, in DecodeSpec::out_layout, out_type elements
  std::size_t out_bytes = 0;      ///< bytes at `out`
  float* out_lse = nullptr;       ///< merged LSE, in DecodeSpec::out_lse_layout; null: not written
  std::size_t out_lse_bytes = 0;  ///< bytes at `out_lse`
  void* workspace = nullptr;      ///< DecodePlan::workspace_bytes() bytes (16-byte aligned is fastest)
  std::size_t workspace_bytes = 0;  ///< bytes at `workspace`
};

/// One call's work as the executors read it (trivially copyable: passed by value to CUDA kernels).
/// Strides in elements over (b, t, h) (the head dim is contiguous); pointers into the caller's
/// buffers and workspace; `peers` the plan's table (host memory for the host executor, a device
/// copy for the CUDA one). Made by DecodePlan::args().
struct DecodeArgs {
  std::int64_t B, T, H, Dv;        ///< batch, new tokens, heads, head dim of the output (elements)
  int P, rank;                     ///< group size and this rank
  std::int64_t head_begin, heads;  ///< this rank's head group [head_begin, head_begin + heads)
  ElementType partial_type, out_type;  ///< element types of O_r and of the merged output
  LseBase base;                        ///< base of every LSE
  DecodeOutput output;                 ///< heads or all_heads
  std::int64_t partial_stride[3];  ///< O_r's strides over (b, t, h), elements (d is contiguous)
  std::int64_t lse_stride[3];      ///< LSE_r's strides over (b, t, h), elements
  std::int64_t out_stride[3];      ///< the merged output's strides over (b, t, h), elements
  std::int64_t out_lse_stride[3];  ///< the merged LSE's strides over (b, t, h), elements
  std::int64_t out_head0;            ///< head index in `out` of this rank's first head (0, or head_begin for all_heads)
  std::uint64_t recv_lse_offset;     ///< offset of the LSE part in every chunk this rank receives
  std::uint64_t gather_lse_offset;   ///< offset of the LSE part in the merged chunk it sends (all_heads)
  const DecodePeer* peers;           ///< P entries
  const std::byte* const* peer_partial;  ///< DecodePath::direct: rank p's O_r at [p] (P entries), else null
  const std::byte* const* peer_lse;      ///< DecodePath::direct: rank p's LSE_r at [p], else null
  const std::byte* partial;          ///< O_r
  const std::byte* lse;              ///< LSE_r
  std::byte* out;                    ///< the merged output
  std::byte* out_lse;                ///< the merged LSE; may be null
  std::byte* send;                   ///< send region
  std::byte* recv;                   ///< receive region
  std::byte* gather_send;            ///< all_heads: the merged chunk this rank sends
  std::byte* gather_recv;            ///< all_heads: the gather-receive region
};

namespace detail {
inline constexpr std::uint64_t pad16(std::uint64_t n) { return (n + 15) / 16 * 16; }
}  // namespace detail

/// The largest group DecodePath::direct takes (the peers' pointers live in fixed tables).
inline constexpr int kDecodeDirectMaxRanks = kMaxTableRanks;  // the one limit (detail/limits.hpp)

/// The fixed-size record of what determines a decode exchange's wire, compared across ranks by
/// the first call (decode/exchange.hpp). Words: record version, P, B, T, H, Dv, element types,
/// LSE base and output, path, hash of the head ranges.
inline constexpr int kDecodeAgreementWords = 10;
/// The decode plan's agreement record (DecodePlan::agreement_record()).
using DecodeRecord = std::array<std::uint64_t, kDecodeAgreementWords>;

/// Everything one rank needs to run a decode exchange: the validated spec, the per-peer table,
/// the byte counts and offsets of both exchanges, the workspace size. Immutable after
/// construction (apart from the agreement flag, which a plan serving one rank's calls sets once).
///
/// Workspace (bytes from its start, each region a multiple of 16): [send region: the chunks to the
/// peers][receive region: the chunks from them][all_heads: the merged chunk this rank sends], and
/// the gather-receive region of all_heads at 0 (reusing the first two, dead by then) when it fits
/// there, else after the merged chunk.
class DecodePlan {
 public:
  /// Plans rank `rank`'s part of the decode exchange of `spec` over P = spec.heads.degree() ranks.
  /// @throws Error(invalid_group) rank outside [0, P) (or P invalid);
  ///         Error(invalid_shape) B, T or Dv < 1, or no heads (H < 1);
  ///         Error(invalid_partition) head ranges that overlap (a decode head is merged by one rank);
  ///         Error(not_summable) partial_type or out_type not float32, float16 or bfloat16;
  ///         Error(size_overflow) a byte count overflows int64;
  ///         Error(layout_mismatch) a layout whose extents are not the shape above, or whose head
  ///         dim is not contiguous (stride 1 along d, Dv > 1);
  ///         Error(layout_aliasing) a layout with negative or aliasing strides;
  ///         Error(path_unsupported) DecodePath::direct with P > kDecodeDirectMaxRanks.
  ///         Every error but the layout ones (this rank's own) depends only on inputs all ranks share.
  DecodePlan(DecodeSpec spec, int rank) : spec_(std::move(spec)), rank_(rank) {
    validate();
    build();
  }

  const DecodeSpec& spec() const { return spec_; }  ///< the spec, layouts resolved
  int degree() const { return spec_.heads.degree(); }  ///< P
  int rank() const { return rank_; }                  ///< this rank
  std::int64_t batch() const { return spec_.batch; }   ///< B
  std::int64_t tokens() const { return spec_.tokens; }  ///< T
  std::int64_t num_heads() const { return spec_.heads.num_heads(); }  ///< H
  std::int64_t head_dim_v() const { return spec_.head_dim_v; }        ///< Dv
  /// The heads this rank merges: [head_begin(), head_begin() + local_heads()).
  std::int64_t head_begin() const { return peers_[static_cast<std::size_t>(rank_)].head_begin; }
  std::int64_t local_heads() const { return peers_[static_cast<std::size_t>(rank_)].head_count; }  ///< H_rank
  /// Heads of the merged output: local_heads() (DecodeOutput::heads) or H (all_heads).
  std::int64_t out_heads() const { return spec_.output == DecodeOutput::all_heads ? num_heads() : local_heads(); }
  /// The per-peer table (P entries, rank order).
  const std::vector<DecodePeer>& peers() const { return peers_; }

  /// Bytes the caller's workspace must hold (0 when P = 1).
  std::size_t workspace_bytes() const { return workspace_; }
  /// The first exchange (partials): byte counts and offsets per peer, as alltoallv() takes them
  /// (send offsets from the send region, receive offsets from the receive region; the own entry 0).
  const std::vector<std::size_t>& send_bytes() const { return sb_; }
  const std::vector<std::size_t>& send_offsets() const { return so_; }  ///< see send_bytes()
  const std::vector<std::size_t>& recv_bytes() const { return rb_; }    ///< see send_bytes()
  const std::vector<std::size_t>& recv_offsets() const { return ro_; }  ///< see send_bytes()
  /// The second exchange (all_heads): per peer, from the merged chunk (offset 0 for every peer)
  /// and into the gather-receive region; empty vectors for DecodeOutput::heads.
  const std::vector<std::size_t>& gather_send_bytes() const { return gsb_; }
  const std::vector<std::size_t>& gather_send_offsets() const { return gso_; }  ///< see gather_send_bytes()
  const std::vector<std::size_t>& gather_recv_bytes() const { return grb_; }    ///< see gather_send_bytes()
  const std::vector<std::size_t>& gather_recv_offsets() const { return gro_; }  ///< see gather_send_bytes()
  /// Where the regions lie in the workspace (bytes from its start).
  std::size_t recv_region() const { return recv_at_; }
  std::size_t gather_send_region() const { return gsend_at_; }  ///< see recv_region()
  std::size_t gather_recv_region() const { return grecv_at_; }  ///< see recv_region()

  /// Bytes this rank sends to other ranks per call (both exchanges; the own share is never sent).
  /// DecodePath::direct sends nothing in the first exchange (the peers read O_r and LSE_r in
  /// place): only the all-gather's bytes (DecodeOutput::all_heads; 0 for DecodeOutput::heads).
  std::size_t sent_bytes() const {
    std::size_t n = 0;
    if (spec_.path != DecodePath::direct)
      for (std::size_t v : sb_) n += v;
    for (std::size_t v : gsb_) n += v;
    return n;
  }
  /// Bytes this rank receives from other ranks per call (both exchanges); on DecodePath::direct
  /// the all-gather's only (the merge reads the peers' partials in place: peer_read_bytes()).
  std::size_t received_bytes() const {
    std::size_t n = 0;
    if (spec_.path != DecodePath::direct)
      for (std::size_t v : rb_) n += v;
    for (std::size_t v : grb_) n += v;
    return n;
  }
  /// Bytes of the peers' partials (O and LSE rows of this rank's heads) this rank's merge reads in
  /// place per call on DecodePath::direct, the bytes the first exchange would have received
  /// (recv_bytes(), padding included); 0 on the other paths.
  std::size_t peer_read_bytes() const {
    std::size_t n = 0;
    if (spec_.path == DecodePath::direct)
      for (std::size_t v : rb_) n += v;
    return n;
  }

  /// Bytes a buffer must hold for each tensor: the span of its layout (elements × size).
  std::size_t partial_span_bytes() const { return span(*spec_.partial_layout, size_of(spec_.partial_type)); }
  std::size_t lse_span_bytes() const { return span(*spec_.lse_layout, 4); }  ///< see partial_span_bytes()
  std::size_t out_span_bytes() const { return span(*spec_.out_layout, size_of(spec_.out_type)); }  ///< see partial_span_bytes()
  std::size_t out_lse_span_bytes() const { return span(*spec_.out_lse_layout, 4); }  ///< see partial_span_bytes()

  /// The collective the call takes when the communicator can do messages (`can_messages`: it has
  /// exchange_messages() and its memory is the executor's), by DecodeSpec::path.
  /// DecodePath::direct needs `can_direct` (the communicator has with_peers(), the executor runs on
  /// the host in the communicator's memory).
  /// @throws Error(path_unsupported) DecodePath::messages asked for and !can_messages, or
  ///         DecodePath::direct and !can_direct.
  DecodePath path_for(bool can_messages, bool can_direct = false) const {
    if (spec_.path == DecodePath::messages && !can_messages)
      detail::fail(Errc::path_unsupported, "DecodeSpec::path = messages, but the communicator has no exchange_messages() whose "
                                           "memory is the executor's; use DecodePath::automatic or alltoallv");
    if (spec_.path == DecodePath::direct && !can_direct)
      detail::fail(Errc::path_unsupported, "DecodeSpec::path = direct, but the communicator has no with_peers() (ranks sharing "
                                           "memory: LocalGroup, MpiWindowComm) or the executor is not a host one in its memory; "
                                           "use DecodePath::automatic");
    if (spec_.path == DecodePath::automatic) return can_messages ? DecodePath::messages : DecodePath::alltoallv;
    return spec_.path;
  }

  /// The record compared across ranks before a plan's first exchange (see kDecodeAgreementWords).
  std::array<std::uint64_t, kDecodeAgreementWords> agreement_record() const {
    std::array<std::uint64_t, kDecodeAgreementWords> w{};
    w[0] = 1;
    w[1] = static_cast<std::uint64_t>(degree());
    w[2] = static_cast<std::uint64_t>(spec_.batch);
    w[3] = static_cast<std::uint64_t>(spec_.tokens);
    w[4] = static_cast<std::uint64_t>(num_heads());
    w[5] = static_cast<std::uint64_t>(spec_.head_dim_v);
    w[6] = static_cast<std::uint64_t>(spec_.partial_type) | static_cast<std::uint64_t>(spec_.out_type) << 8;
    w[7] = static_cast<std::uint64_t>(spec_.base) | static_cast<std::uint64_t>(spec_.output) << 8;
    w[8] = spec_.path == DecodePath::direct ? detail::fnv1a(static_cast<std::uint64_t>(spec_.path), direct_layouts_hash())
                                            : static_cast<std::uint64_t>(spec_.path);
    std::uint64_t h = detail::kFnvBasis;
    for (const DecodePeer& p : peers_) h = detail::fnv1a(detail::fnv1a(h, p.head_begin), p.head_count);
    w[9] = h;
    return w;
  }
  /// What word i of agreement_record() stands for.
  static const char* agreement_field(int i) {
    static const char* const names[kDecodeAgreementWords] = {
        "the record version", "the group size P", "the batch B", "the new tokens T", "the head count H", "the head dim Dv",
        "the element types (partial, out)", "the LSE base or the output (heads, all_heads)",
        "the path (for DecodePath::direct also the partial and LSE layouts)", "the head split"};
    return i >= 0 && i < kDecodeAgreementWords ? names[i] : "?";
  }
  /// Whether word i of agreement_record() is a count the mismatch message prints (P, B, T, H, Dv).
  static bool agreement_word_printed(int i) { return i >= 1 && i <= 5; }

  /// Hash of this rank's partial and LSE layouts (extents and strides): what DecodePath::direct
  /// needs to be the same on every rank (in agreement_record() and in what with_peers() publishes).
  std::uint64_t direct_layouts_hash() const {
    std::uint64_t h = detail::kFnvBasis;
    for (const Layout* l : {&*spec_.partial_layout, &*spec_.lse_layout})
      for (int i = 0; i < 4; ++i) h = detail::fnv1a(detail::fnv1a(h, static_cast<std::uint64_t>(l->extent[i])), static_cast<std::uint64_t>(l->stride[i]));
    return h;
  }

  /// Whether the first call on a communicator checks that every rank planned the same wire
  /// (default on; every rank must choose the same). The check is one small all-gather, outside
  /// any CUDA graph capture.
  bool agreement_check_enabled() const { return check_->enabled(); }
  /// Turns the first call's cross-rank check on or off (before the first call, on every rank
  /// alike; copies of the plan share the setting).
  void set_agreement_check(bool on) { check_->enable(on); }
  /// True once the cross-rank check has passed (on any communicator).
  bool agreement_checked() const { return check_->passed(); }
  /// The plan's agreement check (shared with its copies), which decode/exchange.hpp records in.
  AgreementCheck& agreement_check() const { return *check_; }
  /// A number no other plan of this process has (copies share it): what a communicator's
  /// ExchangeState keys the passed check on.
  std::uint64_t id() const { return id_; }

  /// The executors' view of one call over `b` (see DecodeArgs), with the peer table at `peers`
  /// (peers().data() for the host executor, a device copy of it for a device executor). Does not
  /// validate `b`: decode/exchange.hpp's detail::check_decode_buffers() does.
  DecodeArgs args(const DecodeBuffers& b, const DecodePeer* peers) const {
    DecodeArgs a{};
    a.B = spec_.batch;
    a.T = spec_.tokens;
    a.H = num_heads();
    a.Dv = spec_.head_dim_v;
    a.P = degree();
    a.rank = rank_;
    a.head_begin = head_begin();
    a.heads = local_heads();
    a.partial_type = spec_.partial_type;
    a.out_type = spec_.out_type;
    a.base = spec_.base;
    a.output = spec_.output;
    const Layout* ls[4] = {&*spec_.partial_layout, &*spec_.lse_layout, &*spec_.out_layout, &*spec_.out_lse_layout};
    std::int64_t* st[4] = {a.partial_stride, a.lse_stride, a.out_stride, a.out_lse_stride};
    for (int i = 0; i < 4; ++i)
      for (int k = 0; k < 3; ++k) st[i][k] = ls[i]->stride[k];
    a.out_head0 = spec_.output == DecodeOutput::all_heads ? head_begin() : 0;
    a.recv_lse_offset = recv_lse_at_;
    a.gather_lse_offset = gather_lse_at_;
    a.peers = peers;
    a.peer_partial = nullptr;
    a.peer_lse = nullptr;
    a.partial = static_cast<const std::byte*>(b.partial);
    a.lse = reinterpret_cast<const std::byte*>(b.lse);
    a.out = static_cast<std::byte*>(b.out);
    a.out_lse = reinterpret_cast<std::byte*>(b.out_lse);
    auto* ws = static_cast<std::byte*>(b.workspace);
    a.send = ws;
    a.recv = ws ? ws + recv_at_ : nullptr;
    a.gather_send = ws ? ws + gsend_at_ : nullptr;
    a.gather_recv = ws ? ws + grecv_at_ : nullptr;
    return a;
  }

 private:
  static std::size_t span(const Layout& l, std::size_t e) { return static_cast<std::size_t>(l.span_elems()) * e; }

  void validate() {
    const int P = spec_.heads.degree();
    detail::check_group_size(P);
    detail::check_rank(rank_, P);
    const std::int64_t H = spec_.heads.num_heads();
    auto positive = [](std::int64_t v, const char* what) {
      if (v < 1) detail::fail(Errc::invalid_shape, std::string(what) + "=" + std::to_string(v) + " must be >= 1");
    };
    positive(spec_.batch, "decode batch B");
    positive(spec_.tokens, "decode tokens T");
    positive(H, "decode heads H (DecodeSpec::heads)");
    positive(spec_.head_dim_v, "decode head dim Dv");
    if (!spec_.heads.disjoint())
      detail::fail(Errc::invalid_partition, "decode head ranges " + spec_.heads.str() +
                                                " overlap; each head is merged by one rank: use HeadPartition::even or balanced");
    if (spec_.path == DecodePath::direct && P > kDecodeDirectMaxRanks)
      detail::fail(Errc::path_unsupported, "DecodePath::direct takes groups of up to " + std::to_string(kDecodeDirectMaxRanks) +
                                               " ranks; this one has " + std::to_string(P) + ": use DecodePath::automatic");
    for (ElementType t : {spec_.partial_type, spec_.out_type})
      if (!mergeable(t))
        detail::fail(Errc::not_summable, std::string("decode element type ") + to_string(t) +
                                             " cannot be merged; partial and merged outputs are float32, float16 or bfloat16");
    // Byte counts of the largest tensors: overflow-checked once here.
    const std::int64_t rows = detail::mul(detail::mul(spec_.batch, spec_.tokens, "B*T"), H, "B*T*H");
    detail::mul(detail::mul(rows, spec_.head_dim_v, "B*T*H*Dv"), 4, "decode bytes");
    const std::int64_t Ho = spec_.output == DecodeOutput::all_heads ? H : spec_.heads.count(rank_);
    resolve(spec_.partial_layout, Layout::bshd(spec_.batch, spec_.tokens, H, spec_.head_dim_v), "the partial output O_r", true);
    resolve(spec_.lse_layout, lse_layout_bth(spec_.batch, spec_.tokens, H), "the partial LSE_r", false);
    resolve(spec_.out_layout, Layout::bshd(spec_.batch, spec_.tokens, Ho, spec_.head_dim_v), "the merged output", true);
    resolve(spec_.out_lse_layout, lse_layout_bth(spec_.batch, spec_.tokens, Ho), "the merged LSE", false);
  }

  /// Checks a given layout against the expected extents (or takes the default).
  static void resolve(std::optional<Layout>& l, const Layout& dflt, const char* what, bool rows) {
    if (!l) {
      l = dflt;
      return;
    }
    for (int i = 0; i < 4; ++i)
      if (l->extent[i] != dflt.extent[i])
        detail::fail(Errc::layout_mismatch, std::string("the layout of ") + what + " is " + l->str() + "; its extents must be [" +
                                                std::to_string(dflt.extent[0]) + "," + std::to_string(dflt.extent[1]) + "," +
                                                std::to_string(dflt.extent[2]) + "," + std::to_string(dflt.extent[3]) + "]");
    if (!l->is_injective())
      detail::fail(Errc::layout_aliasing, std::string("the layout of ") + what + " " + l->str() + " maps two elements to one address or has negative strides");
    if (rows && !l->rows_contiguous())
      detail::fail(Errc::layout_mismatch, std::string("the layout of ") + what + " " + l->str() +
                                              " has a head dim that is not contiguous; decode layouts need stride 1 along d");
  }

  void build() {
    const int P = degree();
    const auto uP = static_cast<std::size_t>(P);
    const auto BT = static_cast<std::uint64_t>(spec_.batch * spec_.tokens);
    const auto Dv = static_cast<std::uint64_t>(spec_.head_dim_v);
    const std::uint64_t ein = size_of(spec_.partial_type), eout = size_of(spec_.out_type);
    auto o_part = [&](std::int64_t h, std::uint64_t e) { return detail::pad16(BT * static_cast<std::uint64_t>(h) * Dv * e); };
    auto l_part = [&](std::int64_t h) { return detail::pad16(BT * static_cast<std::uint64_t>(h) * 4); };
    peers_.resize(uP);
    for (auto* v : {&sb_, &so_, &rb_, &ro_}) v->assign(uP, 0);
    const std::int64_t Hr = spec_.heads.count(rank_);
    std::uint64_t s = 0, r = 0;
    for (int p = 0; p < P; ++p) {
      DecodePeer& x = peers_[static_cast<std::size_t>(p)];
      x.head_begin = spec_.heads.begin(p);
      x.head_count = spec_.heads.count(p);
      if (p == rank_) continue;
      const std::uint64_t send = x.head_count ? o_part(x.head_count, ein) + l_part(x.head_count) : 0;
      const std::uint64_t recv = Hr ? o_part(Hr, ein) + l_part(Hr) : 0;
      x.send_offset = s;
      x.send_lse_offset = s + o_part(x.head_count, ein);
      x.recv_offset = r;
      sb_[static_cast<std::size_t>(p)] = static_cast<std::size_t>(send);
      so_[static_cast<std::size_t>(p)] = static_cast<std::size_t>(s);
      rb_[static_cast<std::size_t>(p)] = static_cast<std::size_t>(recv);
      ro_[static_cast<std::size_t>(p)] = static_cast<std::size_t>(r);
      s += send;
      r += recv;
    }
    recv_lse_at_ = o_part(Hr, ein);
    recv_at_ = static_cast<std::size_t>(s);
    std::uint64_t w = s + r;
    gsend_at_ = grecv_at_ = static_cast<std::size_t>(w);
    if (spec_.output == DecodeOutput::all_heads && P > 1) {
      const std::uint64_t mine = Hr ? o_part(Hr, eout) + l_part(Hr) : 0;
      gather_lse_at_ = o_part(Hr, eout);
      for (auto* v : {&gsb_, &gso_, &grb_, &gro_}) v->assign(uP, 0);
      std::uint64_t g = 0;
      for (int p = 0; p < P; ++p) {
        if (p == rank_) continue;
        DecodePeer& x = peers_[static_cast<std::size_t>(p)];
        const std::uint64_t in = x.head_count ? o_part(x.head_count, eout) + l_part(x.head_count) : 0;
        x.gather_recv_offset = g;
        x.gather_recv_lse_offset = g + o_part(x.head_count, eout);
        gsb_[static_cast<std::size_t>(p)] = static_cast<std::size_t>(mine);
        grb_[static_cast<std::size_t>(p)] = static_cast<std::size_t>(in);
        gro_[static_cast<std::size_t>(p)] = static_cast<std::size_t>(g);
        g += in;
      }
      gsend_at_ = static_cast<std::size_t>(w);
      w += mine;
      if (g <= s + r) {
        grecv_at_ = 0;  // the partials' regions are dead once merged
      } else {
        grecv_at_ = static_cast<std::size_t>(w);
        w += g;
      }
    }
    workspace_ = static_cast<std::size_t>(w);
  }

  DecodeSpec spec_;
  int rank_ = 0;
  std::vector<DecodePeer> peers_;
  std::vector<std::size_t> sb_, so_, rb_, ro_, gsb_, gso_, grb_, gro_;
  std::uint64_t recv_lse_at_ = 0, gather_lse_at_ = 0;
  std::size_t recv_at_ = 0, gsend_at_ = 0, grecv_at_ = 0, workspace_ = 0;
  std::uint64_t id_ = detail::next_plan_id();
  std::shared_ptr<AgreementCheck> check_ = std::make_shared<AgreementCheck>();  // shared with copies (the same plan)
};

ULYSSES_NAMESPACE_END
