// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief DecodePlan: the immutable, per-rank result of planning one decode exchange (decode
///        context parallelism): its validated spec (decode/spec.hpp), the per-peer table, the
///        byte counts and offsets of both exchanges, the workspace size; its agreement record
///        (decode/agreement.hpp). The exchange, the wire format and the errors: docs/decode.md.
///
/// Wire format (stable): the chunk rank i sends rank j (i != j) is O_i of rank j's heads as
/// [B, T, H_j, Dv] row-major (partial type), then at a 16-byte boundary LSE_i of those heads as
/// [B, T, H_j] fp32, padded to 16 bytes; chunks back to back in ascending peer order, the own
/// rank skipped. all_heads adds a second exchange of the same format (merged output and LSE).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../detail/hash.hpp"
#include "../plan/agreement_check.hpp"
#include "buffers.hpp"
#include "detail/build.hpp"
#include "detail/inputs.hpp"
#include "spec.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The fixed-size record of what determines a decode exchange's wire, compared across ranks by
/// the first call (check_agreement(), decode/agreement.hpp). Words: record version, P, B, T, H,
/// Dv, the partial's and the output's element types, the LSE base, the output, the path, the
/// layouts' hash (Path::direct), the hash of the head ranges.
inline constexpr int kDecodeAgreementWords = 13;
/// The decode plan's agreement record (DecodePlan::agreement_record()).
using DecodeRecord = std::array<std::uint64_t, kDecodeAgreementWords>;

/// Everything one rank needs to run a decode exchange: the validated spec, the per-peer table,
/// the byte counts and offsets of both exchanges, the workspace size. Immutable after
/// construction (apart from the agreement flag, which its copies share).
///
/// Workspace (bytes from its start, each region a multiple of 16): [send region: the chunks to the
/// peers][receive region: the chunks from them][all_heads: the merged chunk this rank sends], and
/// the gather-receive region of all_heads at 0 (reusing the first two, dead by then) when it fits
/// there, else after the merged chunk.
class DecodePlan : private detail::DecodeFields {
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
  ///         Error(path_unsupported) Path::direct with P > kMaxTableRanks.
  ///         Every error but the layout ones (this rank's own) depends only on inputs all ranks share.
  DecodePlan(DecodeSpec spec, int rank)
      : detail::DecodeFields(std::move(spec), rank), wire_(detail::DecodeWireBuilder(spec_, rank_).build()) {}

  const DecodeSpec& spec() const { return spec_; }  ///< the spec, layouts resolved
  int degree() const { return spec_.heads.degree(); }  ///< P
  int rank() const { return rank_; }                  ///< this rank
  std::int64_t batch() const { return spec_.batch; }   ///< B
  std::int64_t tokens() const { return spec_.tokens; }  ///< T
  std::int64_t num_heads() const { return spec_.heads.num_heads(); }  ///< H
  std::int64_t head_dim_v() const { return spec_.head_dim_v; }        ///< Dv
  /// The transport asked for (DecodeSpec::path; choose_path() resolves Path::automatic).
  Path path() const { return spec_.path; }
  /// The heads this rank merges: [head_begin(), head_begin() + local_heads()).
  std::int64_t head_begin() const { return wire_.peers[static_cast<std::size_t>(rank_)].head_begin; }
  std::int64_t local_heads() const { return wire_.peers[static_cast<std::size_t>(rank_)].head_count; }  ///< H_rank
  /// Heads of the merged output: local_heads() (DecodeOutput::heads) or H (all_heads).
  std::int64_t out_heads() const { return spec_.output == DecodeOutput::all_heads ? num_heads() : local_heads(); }
  /// The per-peer table (P entries, rank order).
  const std::vector<DecodePeer>& peers() const { return wire_.peers; }

  /// Bytes the caller's workspace must hold (0 when P = 1).
  std::size_t workspace_bytes() const { return wire_.workspace; }
  /// The first exchange (partials): byte counts and offsets per peer, as alltoallv() takes them
  /// (send offsets from the send region, receive offsets from the receive region; the own entry 0).
  const std::vector<std::size_t>& send_bytes() const { return wire_.sb; }
  const std::vector<std::size_t>& send_offsets() const { return wire_.so; }  ///< see send_bytes()
  const std::vector<std::size_t>& recv_bytes() const { return wire_.rb; }    ///< see send_bytes()
  const std::vector<std::size_t>& recv_offsets() const { return wire_.ro; }  ///< see send_bytes()
  /// The second exchange (all_heads): per peer, from the merged chunk (offset 0 for every peer)
  /// and into the gather-receive region; empty vectors for DecodeOutput::heads.
  const std::vector<std::size_t>& gather_send_bytes() const { return wire_.gsb; }
  const std::vector<std::size_t>& gather_send_offsets() const { return wire_.gso; }  ///< see gather_send_bytes()
  const std::vector<std::size_t>& gather_recv_bytes() const { return wire_.grb; }    ///< see gather_send_bytes()
  const std::vector<std::size_t>& gather_recv_offsets() const { return wire_.gro; }  ///< see gather_send_bytes()
  /// Where the regions lie in the workspace (bytes from its start).
  std::size_t recv_region() const { return wire_.recv_at; }
  std::size_t gather_send_region() const { return wire_.gsend_at; }  ///< see recv_region()
  std::size_t gather_recv_region() const { return wire_.grecv_at; }  ///< see recv_region()

  /// Bytes this rank sends to other ranks per call (both exchanges; the own share is never sent).
  /// Path::direct sends nothing in the first exchange (the peers read O_r and LSE_r in place):
  /// only the all-gather's bytes (DecodeOutput::all_heads; 0 for DecodeOutput::heads).
  std::size_t sent_bytes() const { return (reads_in_place() ? 0 : sum(wire_.sb)) + sum(wire_.gsb); }
  /// Bytes this rank receives from other ranks per call (both exchanges); on Path::direct the
  /// all-gather's only (the merge reads the peers' partials in place: peer_read_bytes()).
  std::size_t received_bytes() const { return (reads_in_place() ? 0 : sum(wire_.rb)) + sum(wire_.grb); }
  /// Bytes of the peers' partials (O and LSE rows of this rank's heads) this rank's merge reads in
  /// place per call on Path::direct, the bytes the first exchange would have received
  /// (recv_bytes(), padding included); 0 on the other paths.
  std::size_t peer_read_bytes() const { return reads_in_place() ? sum(wire_.rb) : 0; }

  /// Bytes a buffer must hold for each tensor: the span of its layout (elements × size).
  std::size_t partial_span_bytes() const { return span(*spec_.partial_layout, size_of(spec_.partial_type)); }
  std::size_t lse_span_bytes() const { return span(*spec_.lse_layout, 4); }  ///< see partial_span_bytes()
  std::size_t out_span_bytes() const { return span(*spec_.out_layout, size_of(spec_.out_type)); }  ///< see partial_span_bytes()
  std::size_t out_lse_span_bytes() const { return span(*spec_.out_lse_layout, 4); }  ///< see partial_span_bytes()

  /// The record compared across ranks before a plan's first exchange (see kDecodeAgreementWords;
  /// decode/agreement.hpp).
  DecodeRecord agreement_record() const;
  /// What word i of agreement_record() stands for ("the new tokens T").
  static std::string agreement_field(int i);
  /// Word i of agreement_record() as the mismatch message prints it ("" for the hashes).
  static std::string agreement_value(int i, std::uint64_t v);
  /// Hash of this rank's partial and LSE layouts (extents and strides): what Path::direct needs
  /// to be the same on every rank (in agreement_record() and in what with_peers() publishes).
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
  /// The plan's agreement check (shared with its copies), which check_agreement() records in.
  AgreementCheck& agreement_check() const { return *check_; }
  /// A number no other plan of this process has (copies share it): what a communicator's
  /// ExchangeState keys the passed check on.
  std::uint64_t id() const { return id_; }

  /// The executors' view of one call over `b` (see DecodeArgs), with the peer table at `peers`
  /// (peers().data() for the host executor, a device copy of it for a device executor). Does not
  /// validate `b`: decode_exchange() does (decode/exchange.hpp).
  DecodeArgs args(const DecodeBuffers& b, const DecodePeer* peers) const {
    DecodeArgs a{};
    a.B = spec_.batch; a.T = spec_.tokens; a.H = num_heads(); a.Dv = spec_.head_dim_v;
    a.P = degree(); a.rank = rank_;
    a.head_begin = head_begin(); a.heads = local_heads();
    a.partial_type = spec_.partial_type; a.out_type = spec_.out_type;
    a.base = spec_.base; a.output = spec_.output;
    const Layout* ls[4] = {&*spec_.partial_layout, &*spec_.lse_layout, &*spec_.out_layout, &*spec_.out_lse_layout};
    std::int64_t* st[4] = {a.partial_stride, a.lse_stride, a.out_stride, a.out_lse_stride};
    for (int i = 0; i < 4; ++i)
      for (int k = 0; k < 3; ++k) st[i][k] = ls[i]->stride[k];
    a.out_head0 = spec_.output == DecodeOutput::all_heads ? head_begin() : 0;
    a.recv_lse_offset = wire_.recv_lse_at;
    a.gather_lse_offset = wire_.gather_lse_at;
    a.peers = peers;
    a.peer_partial = a.peer_lse = nullptr;
    a.partial = static_cast<const std::byte*>(b.partial().data);
    a.lse = static_cast<const std::byte*>(b.lse().data);
    a.out = static_cast<std::byte*>(b.out().data);
    a.out_lse = static_cast<std::byte*>(b.out_lse().data);
    auto* ws = static_cast<std::byte*>(b.workspace().data);
    a.send = ws;
    a.recv = ws ? ws + wire_.recv_at : nullptr;
    a.gather_send = ws ? ws + wire_.gsend_at : nullptr;
    a.gather_recv = ws ? ws + wire_.grecv_at : nullptr;
    return a;
  }

 private:
  static std::size_t span(const Layout& l, std::size_t e) { return static_cast<std::size_t>(l.span_elems()) * e; }
  static std::size_t sum(const std::vector<std::size_t>& v) {
    std::size_t n = 0;
    for (std::size_t x : v) n += x;
    return n;
  }
  bool reads_in_place() const { return spec_.path == Path::direct; }

  detail::DecodeWire wire_;
  std::uint64_t id_ = detail::next_plan_id();
  std::shared_ptr<AgreementCheck> check_ = std::make_shared<AgreementCheck>();  // shared with copies (the same plan)
};

ULYSSES_NAMESPACE_END

#include "agreement.hpp"
