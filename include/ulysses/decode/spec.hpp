// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What one decode exchange merges (DecodeSpec: shapes, head split, element types, LSE
///        base, output, path, layouts), DecodeOutput, and the LSE layouts lse_layout_bth() /
///        lse_layout_bht(). The exchange and its wire format: docs/decode.md.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "../detail/limits.hpp"
#include "../layout/element.hpp"
#include "../layout/layout.hpp"
#include "../merge/lse.hpp"
#include "../partition/heads.hpp"
#include "../plan/spec.hpp"

ULYSSES_NAMESPACE_BEGIN

/// What the decode exchange returns on each rank.
enum class DecodeOutput : std::int32_t {
  heads = 0,      ///< rank j: its heads merged, O [B, T, H_j, Dv] and LSE [B, T, H_j] (one exchange)
  all_heads = 1,  ///< every rank: all H heads merged, O [B, T, H, Dv] and LSE [B, T, H] (a second exchange
                  ///< of the merged head groups: the all-gather variant)
};


/// Name of a decode output ("heads", "all_heads").
inline const char* to_string(DecodeOutput o) noexcept { return o == DecodeOutput::all_heads ? "all_heads" : "heads"; }

/// The dense LSE layout [B, T, H] (h fastest) as a Layout with head-dim extent 1 (how decode specs
/// describe LSE tensors: extents [B, T, H, 1]).
constexpr Layout lse_layout_bth(std::int64_t B, std::int64_t T, std::int64_t H) { return Layout::strided({B, T, H, 1}, {T * H, H, 1, 1}); }
/// FlashAttention's softmax_lse order [B, H, T] (t fastest), as a Layout of extents [B, T, H, 1].
constexpr Layout lse_layout_bht(std::int64_t B, std::int64_t T, std::int64_t H) { return Layout::strided({B, T, H, 1}, {H * T, 1, T, 1}); }

/// What one decode exchange merges: shapes, head split, element types, LSE base, output, path,
/// layouts.
///
/// Shapes (elements; logical order (b, t, h, d)): the partial output O_r [B, T, H, Dv] and LSE_r
/// [B, T, H] (fp32) of every rank; the merged output [B, T, H_j, Dv] and LSE [B, T, H_j] of rank j
/// (DecodeOutput::heads) or [B, T, H, Dv] and [B, T, H] (all_heads). Layouts are this rank's own
/// (they may differ between ranks); LSE layouts are Layouts of extents [B, T, H, 1] (see
/// lse_layout_bth()). Partial and output layouts need a contiguous head dim (stride 1 along d);
/// every other stride is free (strided views, e.g. an output slice of a larger tensor).
///
/// `path` is the transport (the shared Path of transport/dispatch.hpp): Path::automatic takes
/// messages where the communicator has exchange_messages() in the executor's memory, else
/// alltoallv (the same bytes either way), never direct; Path::direct (ranks sharing memory,
/// with_peers(), a host executor; every rank's partial and LSE layouts the same, P <= 64) reads
/// the peers' partials in place; Path::two_level is refused (a decode wire has no node layout).
struct DecodeSpec {
  std::int64_t batch = 1;       ///< B, sequences (>= 1)
  std::int64_t tokens = 1;      ///< T, new tokens per sequence this step (>= 1; T > 1: speculative decoding)
  HeadPartition heads;          ///< the H query heads and the head group each rank merges (disjoint ranges; even or balanced)
  std::int64_t head_dim_v = 0;  ///< Dv, elements of one head's output row (>= 1)
  ElementType partial_type = ElementType::float32;  ///< element type of O_r: float32, float16 or bfloat16
  ElementType out_type = ElementType::float32;      ///< element type of the merged output (rounded once)
  LseBase base = LseBase::natural;                  ///< the base of every LSE in and out
  DecodeOutput output = DecodeOutput::heads;        ///< this rank's heads, or all heads (all-gather variant)
  Path path = Path::automatic;                      ///< the transport (same bytes on each; see above)
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
  /// Sets the transport (Path::automatic by default; see the struct comment).
  DecodeSpec& with_path(Path p) { path = p; return *this; }
  /// Sets this rank's layouts of O_r and LSE_r (extents [B, T, H, Dv] and [B, T, H, 1]).
  DecodeSpec& with_partial_layouts(const Layout& o, const Layout& lse) { partial_layout = o; lse_layout = lse; return *this; }
  /// Sets this rank's layouts of the merged O and LSE (extents [B, T, H_j or H, Dv] and [.., 1]).
  DecodeSpec& with_out_layouts(const Layout& o, const Layout& lse) { out_layout = o; out_lse_layout = lse; return *this; }
};

ULYSSES_NAMESPACE_END
