// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Rope: rotary position embedding as a row transform (layout/transform.hpp), fused into
///        the block copy: the half-rotation (GPT-NeoX) and interleaved (GPT-J) forms, frequencies
///        from theta or from given tables, positions from the global token index, position ids
///        or documents (cu_seqlens), and the inverse rotation for the backward. Su et al.,
///        "RoFormer" (arXiv:2104.09864); the forms as in HF transformers' rotate_half. docs/transforms.md.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "../detail/checked.hpp"
#include "../error.hpp"
#include "transform.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Which elements a rotation pairs.
enum class RopeStyle : int {
  half = 0,         ///< GPT-NeoX / Llama (rotate_half): element i with i + rotary_dim / 2
  interleaved = 1,  ///< GPT-J: element 2i with 2i + 1
};

/// Rotary position embedding of the first `rotary_dim` elements of every head row (the rest pass
/// unchanged): pair i (i < rotary_dim / 2) at position p is rotated by the angle p · f_i,
///   x' = x·cos − y·sin,  y' = y·cos + x·sin,
/// with f_i = theta^(−2i / rotary_dim) (or the given tables). The inverse (backward of q and k:
/// dq, dk) rotates by −p · f_i.
///
/// Arithmetic, the same on every path, rank and compiler (contraction included): cos and sin are
/// held as float pairs hi + lo (hi = float(c), lo = float(c − hi), from c in double), so every
/// product of an element with them is exact in double; the row's value is
/// (x·c_hi − y·s_hi) + (x·c_lo − y·s_lo) in double, then rounded once to the element type by the
/// executor. Within 1 ulp of the float32 result of an exact rotation with double cos and sin.
///
/// Positions: the row's global token index (the default), or position ids read at the global
/// token (with_position_ids(): never at a rank-local index), or the token's offset in its
/// document (with_documents(cu_seqlens)). Tables are built once, for positions [0, max_position).
class Rope {
 public:
  /// Rotation for head rows of `head_dim` elements, rotating the first `rotary_dim` (0: all;
  /// even) with frequencies theta^(−2i / rotary_dim), for positions [0, max_position).
  /// @throws Error(invalid_shape) rotary_dim odd, above head_dim or negative; head_dim above 1024
  ///         (the longest row a row transform sees); theta <= 0; max_position < 1.
  Rope(std::int64_t head_dim, std::int64_t max_position, double theta = 10000.0, std::int64_t rotary_dim = 0,
       RopeStyle style = RopeStyle::half)
      : d_(head_dim), rd_(rotary_dim == 0 ? head_dim : rotary_dim), style_(style), max_pos_(max_position) {
    check(theta > 0, "theta must be > 0");
    tables(nullptr, nullptr, theta);
  }

  /// Rotation with given tables: cos_table[p * rotary_dim / 2 + i] and sin_table[...] for
  /// positions p in [0, max_position) and pairs i (float32, as engines cache them).
  /// @throws as the other constructor; Error(invalid_shape) a null table.
  static Rope from_tables(std::int64_t head_dim, std::int64_t rotary_dim, std::int64_t max_position, const float* cos_table,
                          const float* sin_table, RopeStyle style = RopeStyle::half) {
    Rope r(head_dim, rotary_dim, max_position, style);
    r.check(cos_table && sin_table, "the cos and sin tables must not be null");
    r.tables(cos_table, sin_table, 0);
    return r;
  }

  /// Reads positions from `ids`: the row at (b, token) has position ids[b * batch_stride + token]
  /// (batch_stride 0: one list for every batch). `count` entries; each in [0, max_position).
  /// Copied. @throws Error(invalid_shape) an id out of range.
  Rope& with_position_ids(const std::int64_t* ids, std::int64_t count, std::int64_t batch_stride = 0) {
    check(count >= 0 && batch_stride >= 0, "the position ids' count and batch_stride must be >= 0");
    check(count == 0 || ids, "the position ids must not be null");
    ids_.assign(ids, ids + count);
    has_ids_ = true;
    for (std::int64_t v : ids_) check(v >= 0 && v < max_pos_, "position id " + std::to_string(v) + " is outside [0, max_position)");
    batch_stride_ = batch_stride;
    return *this;
  }
  /// Positions restart at 0 at every document: cu_seqlens (global token offsets, first 0,
  /// non-decreasing; zero-length documents allowed) makes the position of token s its offset in
  /// its document. @throws Error(invalid_shape) a decreasing or negative cu_seqlens, or a document
  /// longer than max_position.
  Rope& with_documents(const std::vector<std::int64_t>& cu_seqlens) {
    check(!cu_seqlens.empty() && cu_seqlens.front() == 0, "cu_seqlens must start at 0");
    ids_.clear();
    has_ids_ = true;
    for (std::size_t k = 1; k < cu_seqlens.size(); ++k) {
      check(cu_seqlens[k] >= cu_seqlens[k - 1], "cu_seqlens must be non-decreasing");
      for (std::int64_t s = cu_seqlens[k - 1]; s < cu_seqlens[k]; ++s) ids_.push_back(s - cu_seqlens[k - 1]);
    }
    for (std::int64_t v : ids_) check(v < max_pos_, "a document is longer than max_position");
    batch_stride_ = 0;
    return *this;
  }
  /// The inverse rotation (by −p · f_i): the backward of this one, for dq and dk.
  Rope inverse() const {
    Rope r = *this;
    const std::int64_t half = rd_ / 2;  // sin(−a) = −sin(a): every position's sine halves negated (exactly)
    for (std::int64_t p = 0; p < max_pos_; ++p)
      for (std::int64_t i = 2 * half; i < 4 * half; ++i) {
        float& e = r.tab_[static_cast<std::size_t>(p * half * 4 + i)];
        e = -e;
      }
    return r;
  }

  /// The position of the row at (b, token).
  std::int64_t position(const RowCoord& at) const {
    if (!has_ids_) return at.token;
    const std::int64_t i = at.batch * batch_stride_ + at.token;
    return i >= 0 && i < static_cast<std::int64_t>(ids_.size()) ? ids_[static_cast<std::size_t>(i)] : 0;
  }
  /// Rotates one head row in place (the row-transform concept).
  /// @pre check_rows() passed for the plan: n == head_dim(), the position in [0, max_position)
  void operator()(const RowCoord& at, double* row, std::int64_t n) const {
    const std::int64_t p = position(at), half = rd_ / 2;
    (void)n;
    const float* t = &tab_[static_cast<std::size_t>(p * half * 4)];
    if (style_ == RopeStyle::half) {
      rotate(row, row + half, t, half);
    } else {  // (pairs 2k, 2k + 1: gathered into halves, rotated, scattered back)
      double x[kMaxPairs], y[kMaxPairs];
      for (std::int64_t k = 0; k < half; ++k) {
        x[k] = row[2 * k];
        y[k] = row[2 * k + 1];
      }
      rotate(x, y, t, half);
      for (std::int64_t k = 0; k < half; ++k) {
        row[2 * k] = x[k];
        row[2 * k + 1] = y[k];
      }
    }
  }
  /// Loads, rotates and stores one head row of `type` in one pass: the same bits as
  /// detail::load_row(type, src, row, n), (*this)(at, row, n) and detail::store_row(type, dst,
  /// row, n) (the same IEEE operations: each product of an element with a table value is exact
  /// in double, so contraction cannot change them). The optional fused form of the row-transform
  /// concept: the host executor takes it for a row that only this transform touches (no fp8 or
  /// cast wire, no transform on the other side). src and dst hold n elements each, may be
  /// misaligned, and are either the same row or disjoint.
  /// @returns false, touching nothing, for a type it has no fused form for (float64, opaque), or
  ///          n != head_dim(): the executor then takes the row path.
  /// @pre as operator(): n == head_dim(), the position in [0, max_position)
  bool copy_row(const RowCoord& at, ElementType type, const std::byte* src, std::byte* dst, std::int64_t n) const {
    const std::int64_t half = rd_ / 2, eb = static_cast<std::int64_t>(size_of(type));
    const float* t = &tab_[static_cast<std::size_t>(position(at) * half * 4)];
    const bool il = style_ == RopeStyle::interleaved;
    if (type != ElementType::bfloat16 && type != ElementType::float16 && type != ElementType::float32) return false;
    if (n != d_) return false;  // (outside the precondition: the general path, which reads the row as given)
    if (n > rd_) {  // the elements past rotary_dim pass through one load and store (a NaN made canonical)
      double rest[kMaxPairs * 2];
      detail::load_row(type, src + rd_ * eb, rest, n - rd_);
      detail::store_row(type, dst + rd_ * eb, rest, n - rd_);
    }
    detail::with_sum_arith(type, [&](auto a) {
      using A = decltype(a);
      if constexpr (!std::is_same_v<typename A::Acc, double>) {
#if ULYSSES_HOST_AVX2
        if (detail::host_has_avx512()) return copy_rotated_avx512<A>(src, dst, t, half, il);
        if (detail::host_has_avx2()) return copy_rotated_avx2<A>(src, dst, t, half, il);
#endif
        copy_rotated<A>(src, dst, t, half, il);
      }
    });
    return true;
  }
  /// What a call checks before any byte moves (the optional check of the row-transform concept):
  /// rows of D == head_dim() elements, and a position in [0, max_position) for every token of a
  /// batch of B sequences of S tokens (the global token index, or the position ids' count).
  /// @throws Error(invalid_shape) naming what does not fit.
  void check_rows(std::int64_t B, std::int64_t S, std::int64_t D) const {
    check(D == d_, "the tensor's head dim is D=" + std::to_string(D));
    if (!has_ids_)
      check(S <= max_pos_, "the sequence has S=" + std::to_string(S) + " tokens, beyond max_position=" + std::to_string(max_pos_));
    else
      check(static_cast<std::int64_t>(ids_.size()) >= (B - 1) * batch_stride_ + S,
            std::to_string(ids_.size()) + " position ids do not cover B=" + std::to_string(B) + " sequences of S=" + std::to_string(S));
  }

  std::int64_t head_dim() const { return d_; }      ///< D the rows have
  std::int64_t rotary_dim() const { return rd_; }   ///< elements rotated per row
  std::int64_t max_position() const { return max_pos_; }  ///< positions the tables cover
  RopeStyle style() const { return style_; }        ///< the pairing

 private:
  Rope(std::int64_t head_dim, std::int64_t rotary_dim, std::int64_t max_position, RopeStyle style)
      : d_(head_dim), rd_(rotary_dim == 0 ? head_dim : rotary_dim), style_(style), max_pos_(max_position) {}

  void check(bool ok, const std::string& what) const {
    if (!ok) detail::fail(Errc::invalid_shape, "Rope(head_dim=" + std::to_string(d_) + ", rotary_dim=" + std::to_string(rd_) + "): " + what);
  }
  /// Rotates the pairs (x[k], y[k]), k < m, by a position's table t: c_hi[m], c_lo[m], s_hi[m],
  /// s_lo[m] back to back (four contiguous loads: the loop vectorises).
  static void rotate(double* x, double* y, const float* t, std::int64_t m) {
#if ULYSSES_HOST_AVX2
    if (detail::host_has_avx2()) return rotate_pairs_avx2(x, y, t, m);
#endif
    rotate_pairs(x, y, t, m);
  }
  /// rotate()'s loop, written once and compiled twice: plainly, and inside an AVX2 twin (the
  /// float table's widening keeps the plain one scalar). The same IEEE operations, the same bits.
  /// Pair k: (x, y) rotated by its table entries in double, as the class comment says (the
  /// inverse's table holds the sines negated).
  ULYSSES_ALWAYS_INLINE static void rotate_pairs(double* x, double* y, const float* t, std::int64_t m) {
    for (std::int64_t k = 0; k < m; ++k) {
      const double u = x[k], v = y[k], c_hi = t[k], c_lo = t[m + k], s_hi = t[2 * m + k], s_lo = t[3 * m + k];
      x[k] = (u * c_hi - v * s_hi) + (u * c_lo - v * s_lo);
      y[k] = (v * c_hi + u * s_hi) + (v * c_lo + u * s_lo);
    }
  }
#if ULYSSES_HOST_AVX2
  ULYSSES_TARGET_AVX2 static void rotate_pairs_avx2(double* x, double* y, const float* t, std::int64_t m) {
    rotate_pairs(x, y, t, m);
  }
#endif
  /// copy_row()'s pass over the first 2m elements (A: SumArith of a type whose Acc is float):
  /// widened to double (exactly), rotated by rotate_pairs(), rounded to float (16-bit types: to
  /// odd by detail::round_odd_n(), so that the narrowing rounds once, as store_row() does), narrowed.
  /// Written once and compiled three times: plainly, in an AVX2 twin and in an AVX-512 twin.
  template <class A>
  ULYSSES_ALWAYS_INLINE static void copy_rotated(const std::byte* src, std::byte* dst, const float* t, std::int64_t m, bool il) {
    using Bits = typename A::Bits;
    Bits b[2 * kMaxPairs];
    double x[kMaxPairs], y[kMaxPairs];
    std::memcpy(b, src, static_cast<std::size_t>(2 * m) * sizeof(Bits));
    if (il) {
      for (std::int64_t k = 0; k < m; ++k) {
        x[k] = static_cast<double>(A::widen(b[2 * k]));
        y[k] = static_cast<double>(A::widen(b[2 * k + 1]));
      }
    } else {
      for (std::int64_t k = 0; k < m; ++k) {
        x[k] = static_cast<double>(A::widen(b[k]));
        y[k] = static_cast<double>(A::widen(b[k + m]));
      }
    }
    rotate_pairs(x, y, t, m);
    float ox[kMaxPairs], oy[kMaxPairs];
    if constexpr (sizeof(Bits) == 4) {
      for (std::int64_t k = 0; k < m; ++k) {
        ox[k] = static_cast<float>(x[k]);
        oy[k] = static_cast<float>(y[k]);
      }
    } else {
      detail::round_odd_n(x, ox, m);
      detail::round_odd_n(y, oy, m);
    }
    if (il) {
      for (std::int64_t k = 0; k < m; ++k) {
        b[2 * k] = A::narrow(ox[k]);
        b[2 * k + 1] = A::narrow(oy[k]);
      }
    } else {
      for (std::int64_t k = 0; k < m; ++k) {
        b[k] = A::narrow(ox[k]);
        b[k + m] = A::narrow(oy[k]);
      }
    }
    std::memcpy(dst, b, static_cast<std::size_t>(2 * m) * sizeof(Bits));
  }
#if ULYSSES_HOST_AVX2
  template <class A>
  ULYSSES_TARGET_AVX512 static void copy_rotated_avx512(const std::byte* src, std::byte* dst, const float* t, std::int64_t m, bool il) {
    copy_rotated<A>(src, dst, t, m, il);
  }
  template <class A>
  ULYSSES_TARGET_AVX2 static void copy_rotated_avx2(const std::byte* src, std::byte* dst, const float* t, std::int64_t m, bool il) {
    copy_rotated<A>(src, dst, t, m, il);
  }
#endif
  static constexpr std::int64_t kMaxPairs = 512;  // rotary_dim / 2 for D <= 1024
  double freq(std::int64_t i) const { return std::pow(theta_, -2.0 * static_cast<double>(i) / static_cast<double>(rd_)); }
  static void split(double v, float& hi, float& lo) {
    hi = static_cast<float>(v);
    lo = static_cast<float>(v - static_cast<double>(hi));
  }
  /// The tables [max_position][c_hi, c_lo, s_hi, s_lo][rotary_dim / 2], from the given float
  /// tables (lo = 0) or from theta.
  void tables(const float* cos_t, const float* sin_t, double theta) {
    check(d_ >= 1 && rd_ >= 2 && rd_ % 2 == 0 && rd_ <= d_, "rotary_dim must be even, >= 2 and <= head_dim");
    check(d_ <= 2 * kMaxPairs, "head_dim must be <= 1024 (the longest row a row transform sees: Plan refuses longer ones too)");
    check(max_pos_ >= 1, "max_position must be >= 1");
    theta_ = theta;
    const std::int64_t half = rd_ / 2;
    tab_.assign(static_cast<std::size_t>(detail::mul(detail::mul(max_pos_, half, "Rope table"), 4, "Rope table")), 0.0f);
    for (std::int64_t p = 0; p < max_pos_; ++p)
      for (std::int64_t i = 0; i < half; ++i) {
        float* e = &tab_[static_cast<std::size_t>(p * half * 4 + i)];  // c_hi, c_lo, s_hi, s_lo: `half` apart
        if (cos_t) {
          e[0] = cos_t[p * half + i];
          e[2 * half] = sin_t[p * half + i];
          continue;
        }
        split(std::cos(static_cast<double>(p) * freq(i)), e[0], e[half]);
        split(std::sin(static_cast<double>(p) * freq(i)), e[2 * half], e[3 * half]);
      }
  }

  std::int64_t d_, rd_;
  RopeStyle style_;
  std::int64_t max_pos_;
  double theta_ = 10000.0;
  std::vector<float> tab_;
  std::vector<std::int64_t> ids_;
  bool has_ids_ = false;  // positions from ids_ (position ids or documents), even when it is empty
  std::int64_t batch_stride_ = 0;
};

ULYSSES_NAMESPACE_END
