// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Layout: how a rank's local 4-D attention tensor sits in memory.
///
/// A layout is extents plus strides over the logical dimensions (b, s, h, d) = (batch, tokens,
/// heads, head dim), strides in elements, as in CuTe (shape + stride): every memory format is
/// the same object with other strides, never a special case. Offsets are computed on host and
/// device (ULYSSES_HOST_DEVICE, constexpr).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <sstream>
#include <string>

#include "../detail/checked.hpp"
#include "../error.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The named dense memory orders. The logical order of dimensions is always (b, s, h, d); the
/// format only says which dimension is outermost in memory.
enum class Format {
  bshd,  ///< [batch, seq, heads, head_dim], d fastest (FlashAttention, Megatron with batch first)
  sbhd,  ///< [seq, batch, heads, head_dim] (Megatron-LM's default)
  bhsd,  ///< [batch, heads, seq, head_dim] (PyTorch SDPA)
};

/// Name of a format ("bshd", ...).
inline const char* to_string(Format f) noexcept {
  switch (f) {
    case Format::bshd: return "bshd";
    case Format::sbhd: return "sbhd";
    case Format::bhsd: return "bhsd";
  }
  return "?";
}

/// Extents and strides (in elements) over the logical dimensions (b, s, h, d).
///
/// Element (b, s, h, d) of a tensor with base pointer `p` is at `p + offset(b, s, h, d)`.
/// Strides are non-negative element counts. A layout says nothing of the element type.
struct Layout {
  static constexpr int B = 0, S = 1, H = 2, D = 3;  ///< dimension indices into extent/stride
  std::int64_t extent[4]{};                          ///< [B, S, H, D] of the local tensor
  std::int64_t stride[4]{};                          ///< elements between neighbours along b, s, h, d

  /// Offset in elements of element (b, s, h, d). No bounds check.
  ULYSSES_HOST_DEVICE constexpr std::int64_t offset(std::int64_t b, std::int64_t s, std::int64_t h,
                                                    std::int64_t d) const {
    return b * stride[0] + s * stride[1] + h * stride[2] + d * stride[3];
  }

  /// Number of logical elements B*S*H*D (not overflow-checked; Plan checks).
  constexpr std::int64_t numel() const { return extent[0] * extent[1] * extent[2] * extent[3]; }

  /// Elements a buffer must hold from the base pointer: 1 + the largest offset (0 when empty).
  constexpr std::int64_t span_elems() const {
    if (numel() == 0) return 0;
    std::int64_t last = 0;
    for (int i = 0; i < 4; ++i) last += (extent[i] - 1) * stride[i];
    return last + 1;
  }

  /// True when every logical element has its own address (no two elements alias) and all strides
  /// are non-negative (an empty layout is injective). Sufficient check: sorted by stride, each dimension's stride exceeds the
  /// largest offset reachable by the smaller ones.
  bool is_injective() const {
    std::array<int, 4> order{0, 1, 2, 3};
    for (int i = 0; i < 4; ++i)
      if (stride[i] < 0 || extent[i] < 0) return false;
    if (numel() == 0) return true;  // nothing to alias
    std::sort(order.begin(), order.end(), [&](int a, int b) { return stride[a] < stride[b]; });
    std::int64_t reach = 0;  // largest offset reachable with the dims seen so far
    for (int i : order) {
      if (extent[i] <= 1) continue;
      if (stride[i] <= reach) return false;
      reach += (extent[i] - 1) * stride[i];
    }
    return true;
  }

  /// True when the head dimension is contiguous (stride 1), so rows of D elements copy whole.
  constexpr bool rows_contiguous() const { return stride[3] == 1 || extent[3] <= 1; }

  /// Dense layout of extents [B, S, H, D] in the given memory order.
  static constexpr Layout dense(Format f, std::int64_t B_, std::int64_t S_, std::int64_t H_, std::int64_t D_) {
    switch (f) {
      case Format::sbhd: return strided({B_, S_, H_, D_}, {H_ * D_, B_ * H_ * D_, D_, 1});
      case Format::bhsd: return strided({B_, S_, H_, D_}, {H_ * S_ * D_, D_, S_ * D_, 1});
      case Format::bshd: break;
    }
    return strided({B_, S_, H_, D_}, {S_ * H_ * D_, H_ * D_, D_, 1});
  }
  /// Dense [B, S, H, D], d fastest.
  static constexpr Layout bshd(std::int64_t B_, std::int64_t S_, std::int64_t H_, std::int64_t D_) {
    return dense(Format::bshd, B_, S_, H_, D_);
  }
  /// Dense [S, B, H, D].
  static constexpr Layout sbhd(std::int64_t B_, std::int64_t S_, std::int64_t H_, std::int64_t D_) {
    return dense(Format::sbhd, B_, S_, H_, D_);
  }
  /// Dense [B, H, S, D].
  static constexpr Layout bhsd(std::int64_t B_, std::int64_t S_, std::int64_t H_, std::int64_t D_) {
    return dense(Format::bhsd, B_, S_, H_, D_);
  }
  /// Any strided view: extents [B, S, H, D] and strides in elements over (b, s, h, d).
  ///
  /// Examples (element offsets of the base pointer in comments):
  /// - q, k, v inside one fused projection output [B, S, 3, H, D] (bshd per tensor):
  ///   `strided({B,S,H,D}, {S*3*H*D, 3*H*D, D, 1})`, base `qkv + t*H*D` for t = 0, 1, 2.
  /// - tokens 4..11 of a dense bshd [B, S, H, D] tensor x (x[:, 4:12]):
  ///   `strided({B,8,H,D}, {S*H*D, H*D, D, 1})`, base `x + 4*H*D`.
  static constexpr Layout strided(std::array<std::int64_t, 4> extents, std::array<std::int64_t, 4> strides) {
    Layout l{};
    for (std::size_t i = 0; i < 4; ++i) {
      l.extent[i] = extents[i];
      l.stride[i] = strides[i];
    }
    return l;
  }

  /// "[B,S,H,D]:(sb,ss,sh,sd)" for messages.
  std::string str() const {
    std::ostringstream o;
    o << '[' << extent[0] << ',' << extent[1] << ',' << extent[2] << ',' << extent[3] << "]:(" << stride[0] << ','
      << stride[1] << ',' << stride[2] << ',' << stride[3] << ')';
    return o.str();
  }

  friend constexpr bool operator==(const Layout& a, const Layout& b) {
    for (int i = 0; i < 4; ++i)
      if (a.extent[i] != b.extent[i] || a.stride[i] != b.stride[i]) return false;
    return true;
  }
  friend constexpr bool operator!=(const Layout& a, const Layout& b) { return !(a == b); }
};

ULYSSES_NAMESPACE_END
