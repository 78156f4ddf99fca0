// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The wire of a decode plan (DecodeWire), built once from its validated spec: the
///        per-peer table, the chunk sizes and offsets of both exchanges, the workspace regions.
///        Wire format: docs/decode.md, "The call", and the comment of decode/plan.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../buffers.hpp"
#include "../spec.hpp"

ULYSSES_NAMESPACE_BEGIN
namespace detail {

inline constexpr std::uint64_t pad16(std::uint64_t n) { return (n + 15) / 16 * 16; }

/// Everything a decode plan computes from its spec: sizes and offsets in bytes (multiples of 16).
struct DecodeWire {
  std::vector<DecodePeer> peers;                       // P entries, rank order
  std::vector<std::size_t> sb, so, rb, ro;             // the first exchange, per peer (own entry 0)
  std::vector<std::size_t> gsb, gso, grb, gro;         // all_heads: the second exchange; empty otherwise
  std::uint64_t recv_lse_at = 0, gather_lse_at = 0;    // the LSE part in a received chunk, in the merged chunk
  std::size_t recv_at = 0, gsend_at = 0, grecv_at = 0;  // the regions in the workspace
  std::size_t workspace = 0;
};

/// Builds the wire of `s` (validated, layouts resolved) on rank `me`.
class DecodeWireBuilder {
 public:
  /// A builder of the wire of `s` on rank `me` (`s` must outlive it).
  DecodeWireBuilder(const DecodeSpec& s, int me)
      : s_(s), me_(me), P_(s.heads.degree()), BT_(static_cast<std::uint64_t>(s.batch * s.tokens)),
        Dv_(static_cast<std::uint64_t>(s.head_dim_v)) {}

  /// The wire: the peer table and the first exchange, then (all_heads, P > 1) the second.
  DecodeWire build() {
    DecodeWire w;
    const std::uint64_t used = partials(w);
    std::uint64_t end = used;
    w.gsend_at = w.grecv_at = static_cast<std::size_t>(end);
    if (s_.output == DecodeOutput::all_heads && P_ > 1) end = gather(w, used);
    w.workspace = static_cast<std::size_t>(end);
    return w;
  }

 private:
  /// Bytes of the O part of h heads in elements of e bytes, and of the LSE part, each padded.
  std::uint64_t o_part(std::int64_t h, std::uint64_t e) const { return pad16(BT_ * static_cast<std::uint64_t>(h) * Dv_ * e); }
  std::uint64_t l_part(std::int64_t h) const { return pad16(BT_ * static_cast<std::uint64_t>(h) * 4); }
  std::uint64_t chunk(std::int64_t h, std::uint64_t e) const { return h ? o_part(h, e) + l_part(h) : 0; }

  /// The peer table and the first exchange; returns the bytes of its two regions.
  std::uint64_t partials(DecodeWire& w) const {
    const auto uP = static_cast<std::size_t>(P_);
    const std::uint64_t ein = size_of(s_.partial_type);
    w.peers.resize(uP);
    for (auto* v : {&w.sb, &w.so, &w.rb, &w.ro}) v->assign(uP, 0);
    const std::int64_t Hr = s_.heads.count(me_);
    std::uint64_t s = 0, r = 0;
    for (int p = 0; p < P_; ++p) {
      const auto up = static_cast<std::size_t>(p);
      DecodePeer& x = w.peers[up];
      x.head_begin = s_.heads.begin(p);
      x.head_count = s_.heads.count(p);
      if (p == me_) continue;
      const std::uint64_t send = chunk(x.head_count, ein), recv = chunk(Hr, ein);
      x.send_offset = s;
      x.send_lse_offset = s + o_part(x.head_count, ein);
      x.recv_offset = r;
      w.sb[up] = static_cast<std::size_t>(send);
      w.so[up] = static_cast<std::size_t>(s);
      w.rb[up] = static_cast<std::size_t>(recv);
      w.ro[up] = static_cast<std::size_t>(r);
      s += send;
      r += recv;
    }
    w.recv_lse_at = o_part(Hr, ein);
    w.recv_at = static_cast<std::size_t>(s);
    return s + r;
  }

  /// The second exchange (all_heads) after the first's regions (`used` bytes); returns the end
  /// of the workspace. The gather-receive region reuses the first two (dead once merged) when it
  /// fits there.
  std::uint64_t gather(DecodeWire& w, std::uint64_t used) const {
    const auto uP = static_cast<std::size_t>(P_);
    const std::uint64_t eout = size_of(s_.out_type);
    const std::int64_t Hr = s_.heads.count(me_);
    const std::uint64_t mine = chunk(Hr, eout);
    w.gather_lse_at = o_part(Hr, eout);
    for (auto* v : {&w.gsb, &w.gso, &w.grb, &w.gro}) v->assign(uP, 0);
    std::uint64_t g = 0;
    for (int p = 0; p < P_; ++p) {
      if (p == me_) continue;
      const auto up = static_cast<std::size_t>(p);
      DecodePeer& x = w.peers[up];
      const std::uint64_t in = chunk(x.head_count, eout);
      x.gather_recv_offset = g;
      x.gather_recv_lse_offset = g + o_part(x.head_count, eout);
      w.gsb[up] = static_cast<std::size_t>(mine);
      w.grb[up] = static_cast<std::size_t>(in);
      w.gro[up] = static_cast<std::size_t>(g);
      g += in;
    }
    w.gsend_at = static_cast<std::size_t>(used);
    std::uint64_t end = used + mine;
    if (g <= used) {
      w.grecv_at = 0;
    } else {
      w.grecv_at = static_cast<std::size_t>(end);
      end += g;
    }
    return end;
  }

  const DecodeSpec& s_;
  int me_, P_;
  std::uint64_t BT_, Dv_;
};

}  // namespace detail
ULYSSES_NAMESPACE_END
