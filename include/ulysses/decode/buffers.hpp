// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The buffers of one decode call, by name (DecodeBuffers), the per-peer table of a decode
///        plan (DecodePeer) and one call's work as the executors read it (DecodeArgs).
///        docs/decode.md, "Shapes and layouts".
#pragma once

#include <cstddef>
#include <cstdint>

#include "../layout/byte_span.hpp"
#include "../layout/element.hpp"
#include "../merge/lse.hpp"
#include "spec.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The buffers of one decode_exchange() call on this rank, each named once:
/// `DecodeBuffers().partial(o).lse(lse).out(out).out_lse(out_lse).workspace(ws)` (any order; a
/// name given twice keeps the last). Each is a ConstByteSpan / ByteSpan: a std::vector (of float,
/// a 16-bit type or std::byte), a std::span or {pointer, bytes}, holding at least the plan's bytes
/// of that tensor (DecodePlan::partial_span_bytes(), lse_span_bytes(), out_span_bytes(),
/// out_lse_span_bytes(), workspace_bytes()). Device memory for a device executor, host memory for
/// the host executor. There is no positional constructor (not an aggregate).
class DecodeBuffers {
 public:
  DecodeBuffers() noexcept {}  ///< no buffer given (user-provided: `DecodeBuffers{o, lse, ...}` does not compile)
  /// O_r [B, T, H, Dv] in DecodeSpec::partial_layout, partial_type elements (read).
  [[nodiscard]] DecodeBuffers partial(ConstByteSpan s) const { DecodeBuffers b = *this; b.partial_ = s; return b; }
  /// LSE_r [B, T, H] (fp32) in DecodeSpec::lse_layout (read).
  [[nodiscard]] DecodeBuffers lse(ConstByteSpan s) const { DecodeBuffers b = *this; b.lse_ = s; return b; }
  /// The merged O in DecodeSpec::out_layout, out_type elements (written).
  [[nodiscard]] DecodeBuffers out(ByteSpan s) const { DecodeBuffers b = *this; b.out_ = s; return b; }
  /// The merged LSE (fp32) in DecodeSpec::out_lse_layout (written; not given: not written).
  [[nodiscard]] DecodeBuffers out_lse(ByteSpan s) const { DecodeBuffers b = *this; b.out_lse_ = s; return b; }
  /// Scratch of DecodePlan::workspace_bytes() bytes (16-byte aligned is fastest; none when P = 1).
  [[nodiscard]] DecodeBuffers workspace(ByteSpan s) const { DecodeBuffers b = *this; b.workspace_ = s; return b; }

  ConstByteSpan partial() const { return partial_; }  ///< the span given as partial() (empty if none)
  ConstByteSpan lse() const { return lse_; }          ///< the span given as lse()
  ByteSpan out() const { return out_; }               ///< the span given as out()
  ByteSpan out_lse() const { return out_lse_; }       ///< the span given as out_lse()
  ByteSpan workspace() const { return workspace_; }   ///< the span given as workspace()

 private:
  ConstByteSpan partial_, lse_;
  ByteSpan out_, out_lse_, workspace_;
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
  const std::byte* const* peer_partial;  ///< Path::direct: rank p's O_r at [p] (P entries), else null
  const std::byte* const* peer_lse;      ///< Path::direct: rank p's LSE_r at [p], else null
  const std::byte* partial;          ///< O_r
  const std::byte* lse;              ///< LSE_r
  std::byte* out;                    ///< the merged output
  std::byte* out_lse;                ///< the merged LSE; may be null
  std::byte* send;                   ///< send region
  std::byte* recv;                   ///< receive region
  std::byte* gather_send;            ///< all_heads: the merged chunk this rank sends
  std::byte* gather_recv;            ///< all_heads: the gather-receive region
};

ULYSSES_NAMESPACE_END
