// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Row transforms fused into the block copy: RowCoord (where a row of D elements lies),
///        the row-transform concept and its loud check, RowTransforms (one call's transforms per
///        tensor, on pack and on unpack), and the one-rounding load / store of a row in double.
///        Built-in transforms: Scale here, Rope in layout/rope.hpp. Notes: docs/transforms.md.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../detail/cpu.hpp"
#include "blocks.hpp"
#include "detail/row_lanes.hpp"
#include "element.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Where one head row of D elements lies in the whole tensor: its batch index, its GLOBAL token
/// index (0 <= token < S, in the sequence's order, whichever rank holds it) and its GLOBAL head
/// index (0 <= head < H). The same on every path and rank for the same element.
struct RowCoord {
  std::int64_t batch = 0;  ///< b in [0, B)
  std::int64_t token = 0;  ///< global token index in [0, S)
  std::int64_t head = 0;   ///< global head index in [0, H)
};

/// A run of `count` head rows of n elements each that the executor hands a transform's fused
/// copy_run() at once: row i (0 <= i < count) is read at src + i·src_stride and written at
/// dst + i·dst_stride (strides in bytes), and lies at RowCoord first + i·step (step: the
/// per-row increment of batch, token and head; {0, 0, 1} along the heads of one token). Each
/// row's src and dst are the same row or disjoint, and the rows do not overlap one another.
struct RowRun {
  RowCoord first;                  ///< row 0's coordinates
  RowCoord step;                   ///< the coordinates' increment from one row to the next
  const std::byte* src = nullptr;  ///< row 0's elements, read
  std::int64_t src_stride = 0;     ///< bytes from one row's source to the next
  std::byte* dst = nullptr;        ///< row 0's destination, written
  std::int64_t dst_stride = 0;     ///< bytes from one row's destination to the next
  std::int64_t n = 0;              ///< elements a row (D)
  std::int64_t count = 0;          ///< rows
  /// Whether the executor streams this call's stores (a list larger than the caches; it fences
  /// after the call): the copy may store its rows with non-temporal stores. Same bits either way.
  bool stream = false;
  /// The first row of the run copied next where it starts a new stride (rows src_stride apart, at
  /// most `count`), else null: a hint, never read. A transform with `static constexpr bool
  /// prefetches_next_src = true` prefetches its row i in copying row i; else the executor does.
  const std::byte* next_src = nullptr;
  /// Row i's coordinates: first + i·step.
  RowCoord at(std::int64_t i) const { return {first.batch + i * step.batch, first.token + i * step.token, first.head + i * step.head}; }
};

namespace detail {
/// Whether X has `void operator()(const RowCoord&, double*, std::int64_t) const`.
template <class X, class = void>
struct has_row_call : std::false_type {};
template <class X>
struct has_row_call<X, std::void_t<decltype(std::declval<const X&>()(std::declval<const RowCoord&>(), std::declval<double*>(),
                                                                      std::declval<std::int64_t>()))>> : std::true_type {};
/// Whether X names an operator() at all (a mistyped one is then an error, not an absent transform).
template <class X, class = void>
struct names_call : std::false_type {};
template <class X>
struct names_call<X, std::void_t<decltype(&X::operator())>> : std::true_type {};
/// Whether X has the optional `void check_rows(std::int64_t B, std::int64_t S, std::int64_t D) const`.
template <class X, class = void>
struct has_check_rows : std::false_type {};
template <class X>
struct has_check_rows<X, std::void_t<decltype(std::declval<const X&>().check_rows(std::int64_t{}, std::int64_t{}, std::int64_t{}))>>
    : std::true_type {};
/// Whether X has the fused `bool copy_row(const RowCoord&, ElementType, const std::byte*, std::byte*, std::int64_t) const`.
template <class X, class = void>
struct has_copy_row : std::false_type {};
template <class X>
struct has_copy_row<X, std::void_t<decltype(bool{std::declval<const X&>().copy_row(std::declval<const RowCoord&>(), ElementType{},
                                                                                   std::declval<const std::byte*>(),
                                                                                   std::declval<std::byte*>(), std::int64_t{})})>>
    : std::true_type {};
/// Whether X has the optional run form `bool copy_run(const RowRun&, ElementType) const`.
template <class X, class = void>
struct has_copy_run : std::false_type {};
template <class X>
struct has_copy_run<X, std::void_t<decltype(bool{std::declval<const X&>().copy_run(std::declval<const RowRun&>(), ElementType{})})>>
    : std::true_type {};
/// Whether X's copy_run prefetches RowRun::next_src itself (`static constexpr bool prefetches_next_src`).
template <class X, class = void>
struct prefetches_next_src : std::false_type {};
template <class X>
struct prefetches_next_src<X, std::enable_if_t<X::prefetches_next_src>> : std::true_type {};
}  // namespace detail

/// Compile-time check of a row-transform type X (the concept): X must be callable as
/// `void operator()(const RowCoord& at, double* row, std::int64_t n) const`, transforming the n
/// elements of one head row in place (n == D; the row's elements widened exactly to double; the
/// library rounds the result once to the tensor's element type). It must not throw, must be
/// safe to call from several threads at once (const, no shared mutable state), and must give the
/// same result for the same (at, row) on every call: every path and rank then writes the same
/// bits. It may also have the fused form `bool copy_row(const RowCoord& at, ElementType type,
/// const std::byte* src, std::byte* dst, std::int64_t n) const`, which loads, transforms and
/// stores a row in one pass with the same bits (Rope has one; RowTransformRef::copy), and the run
/// form `bool copy_run(const RowRun& run, ElementType type) const`, copy_row() over a RowRun of
/// rows in one call (RowTransformRef::copy_run: the executor prefers it, one call per run of
/// rows along a block's innermost loop). Each returns false, touching nothing, where it does not
/// fuse (a type, a row length; copy_run() also a run it declines): the executor then copies
/// those rows one by one (copy_row(), else the row path).
/// True when X passes; else a static_assert names what is wrong.
template <class X>
constexpr bool check_row_transform() {
  static_assert(detail::names_call<X>::value || detail::has_row_call<X>::value,
                "ulysses row-transform concept: the type needs `void operator()(const RowCoord& at, double* row, std::int64_t n) "
                "const` (layout/transform.hpp)");
  static_assert(detail::has_row_call<X>::value,
                "ulysses row-transform concept: the type has an operator() whose signature is not `void operator()(const RowCoord& at, "
                "double* row, std::int64_t n) const` (rows are transformed in place, in double; layout/transform.hpp)");
  static_assert(std::is_void_v<decltype(std::declval<const X&>()(std::declval<const RowCoord&>(), std::declval<double*>(),
                                                                 std::declval<std::int64_t>()))>,
                "ulysses row-transform concept: operator()(const RowCoord&, double*, std::int64_t) must return void");
  return true;
}

/// A non-owning reference to one row transform (what RowTransforms holds per tensor and side).
struct RowTransformRef {
  const void* object = nullptr;                                          ///< the transform (the caller's object)
  void (*apply)(const void*, const RowCoord&, double*, std::int64_t) = nullptr;  ///< calls it
  /// The transform's check_rows(B, S, D) (optional: null when it has none), called by every call
  /// before any byte moves with the plan's batch, sequence length and the tensor's head dim.
  void (*check)(const void*, std::int64_t, std::int64_t, std::int64_t) = nullptr;
  /// The transform's fused copy_row(at, type, src, dst, n) (optional: null when it has none):
  /// loads, transforms and stores one row with the same bits as load_row(), the transform and
  /// store_row(); it returns false, touching nothing, for a type it does not fuse.
  bool (*copy)(const void*, const RowCoord&, ElementType, const std::byte*, std::byte*, std::int64_t) = nullptr;
  /// The transform's fused copy_run(run, type) (optional: null when it has none): copy over a
  /// RowRun of rows in one call, with the same bits; false, touching nothing, where copy would be.
  bool (*copy_run)(const void*, const RowRun&, ElementType) = nullptr;
  bool prefetches_next_src = false;  ///< whether copy_run prefetches RowRun::next_src (else the executor does)
  /// Whether a transform is set.
  constexpr explicit operator bool() const noexcept { return apply != nullptr; }
  /// Applies it to the row (n elements) at `at`. @pre a transform is set.
  void operator()(const RowCoord& at, double* row, std::int64_t n) const { apply(object, at, row, n); }
};

/// The row transforms of one call, per tensor (its index in the plan): `on_pack(t, x)` applies x
/// to tensor t's rows as they are read from the call's INPUT (the sender's side: in seq→head the
/// seq-sharded rows, where they are contiguous), `on_unpack(t, x)` to its rows as they are
/// written into the call's OUTPUT (the receiver's side). Each transform sees the row's RowCoord.
/// A path that copies an input row straight into an output (the peer copy, a rank's own chunk)
/// applies the pack transform, rounds to the element type as the wire would, then applies the
/// unpack transform: every path gives the same bits. A sum of replicated heads (head→seq)
/// applies the pack transform to each input term (rounded), adds the terms by the sum rules of
/// element.hpp and applies the unpack transform to the float32 sum before its one rounding.
///
/// Non-owning: the transform objects must outlive the call (for a split-phase exchange, its
/// finish()). Every rank passes transforms on the same tensors and sides: the calls compare
/// sides() across ranks with the call's plan and direction (a rank with RoPE beside one without
/// is Error(plan_mismatch) on every rank, on the communicators that number their calls; over
/// MpiComm's message path through the call probe of a wait, within a tenth of the timeout); what each
/// transform computes travels as code and is not compared. The plan's tensor must have been
/// built with TensorSpec::with_row_transforms(), and the executor must run transforms
/// (executor_traits::row_transforms: HostExecutor); else the call throws Error(invalid_shape)
/// before any byte moves.
class RowTransforms {
 public:
  /// Applies `x` to tensor t's rows on pack (see the class comment). Keeps a reference to x.
  /// @pre 0 <= t < kMaxTensors (else the call that uses it throws Error(invalid_shape))
  template <class X>
  RowTransforms& on_pack(int t, const X& x) {
    return set(pack_, t, x);
  }
  /// Applies `x` to tensor t's rows on unpack (see the class comment). Keeps a reference to x.
  template <class X>
  RowTransforms& on_unpack(int t, const X& x) {
    return set(unpack_, t, x);
  }
  /// A temporary would be gone before the call runs: refused at compile time.
  template <class X>
  RowTransforms& on_pack(int t, const X&& x) = delete;
  /// A temporary would be gone before the call runs: refused at compile time.
  template <class X>
  RowTransforms& on_unpack(int t, const X&& x) = delete;
  /// Tensor t's pack transform (empty when none or t is out of range).
  RowTransformRef pack(int t) const { return t >= 0 && t < kMaxTensors ? pack_[t] : RowTransformRef{}; }
  /// Tensor t's unpack transform (empty when none or t is out of range).
  RowTransformRef unpack(int t) const { return t >= 0 && t < kMaxTensors ? unpack_[t] : RowTransformRef{}; }
  /// Whether tensor t has a transform on either side.
  bool any(int t) const { return static_cast<bool>(pack(t)) || static_cast<bool>(unpack(t)); }
  /// Which tensors and sides have a transform: bit 2t tensor t's pack transform, bit 2t + 1 its
  /// unpack transform (what the calls compare across ranks).
  std::uint64_t sides() const {
    std::uint64_t m = 0;
    for (int t = 0; t < kMaxTensors; ++t)
      m |= (pack(t) ? std::uint64_t{1} : 0) << (2 * t) | (unpack(t) ? std::uint64_t{1} : 0) << (2 * t + 1);
    return m;
  }
  /// Whether any tensor has a transform.
  bool empty() const {
    for (int t = 0; t < kMaxTensors; ++t)
      if (any(t)) return false;
    return true;
  }
  /// Whether a tensor index outside [0, kMaxTensors) was given (the calls then refuse the set).
  bool has_bad_index() const { return bad_given_; }
  /// The first tensor index given that is outside [0, kMaxTensors) (when has_bad_index()).
  int bad_index() const { return bad_; }

 private:
  template <class X>
  RowTransforms& set(RowTransformRef* side, int t, const X& x) {
    static_assert(check_row_transform<X>());
    if (t < 0 || t >= kMaxTensors) {
      if (!bad_given_) bad_ = t;  // the first one, whatever its value (-1 included)
      bad_given_ = true;
      return *this;
    }
    side[t] = {&x, [](const void* o, const RowCoord& at, double* row, std::int64_t n) { (*static_cast<const X*>(o))(at, row, n); }};
    if constexpr (detail::has_check_rows<X>::value)
      side[t].check = [](const void* o, std::int64_t B, std::int64_t S, std::int64_t D) { static_cast<const X*>(o)->check_rows(B, S, D); };
    if constexpr (detail::has_copy_row<X>::value)
      side[t].copy = [](const void* o, const RowCoord& at, ElementType type, const std::byte* src, std::byte* dst, std::int64_t n) {
        return static_cast<const X*>(o)->copy_row(at, type, src, dst, n);
      };
    if constexpr (detail::has_copy_run<X>::value)
      side[t].copy_run = [](const void* o, const RowRun& run, ElementType type) { return static_cast<const X*>(o)->copy_run(run, type); };
    side[t].prefetches_next_src = detail::prefetches_next_src<X>::value;
    return *this;
  }
  RowTransformRef pack_[kMaxTensors] = {};
  RowTransformRef unpack_[kMaxTensors] = {};
  int bad_ = 0;
  bool bad_given_ = false;
};

/// Built-in transform: every element times `factor` (a QK scale, a softmax scale folded into q),
/// in double, rounded once. Its inverse is Scale{1 / factor} (exact only for powers of two).
struct Scale {
  double factor = 1.0;  ///< the multiplier
  /// row[i] *= factor.
  void operator()(const RowCoord&, double* row, std::int64_t n) const {
    for (std::int64_t i = 0; i < n; ++i) row[i] *= factor;
  }
};

namespace detail {
/// double → float rounded to odd (truncate, then set the last bit when inexact): a later rounding
/// to a type of at most 22 fraction bits (bfloat16, float16) then rounds once, as if from the
/// double (Boldo & Melquiond, "When double rounding is odd", 2005). NaN and infinities pass.
inline float float_round_odd(double d) {
  const float f = static_cast<float>(d);
  const double back = static_cast<double>(f);
  const std::uint32_t inexact = back != d && d == d ? 1u : 0u;  // (branch-free: the loops over rows vectorise)
  const std::uint32_t away = (back < 0 ? -back : back) > (d < 0 ? -d : d) ? 1u : 0u;  // rounded away from zero
  return bits_float((float_bits(f) - (inexact & away)) | inexact);
}

/// float_round_odd(d) for d of magnitude in [2^-126, 2^128), ±0, ±infinity or NaN (a NaN stays
/// a NaN, its payload not kept): the double's 29 bits below float precision cleared, the lowest
/// kept bit set when any of them was set (truncation, then odd when inexact), then converted to
/// float exactly. Integer operations on the double's lanes: it vectorises without narrowing
/// masks, as float_round_odd() must. Elsewhere (float subnormals, beyond FLT_MAX) it differs:
/// outside_float_normals() says where.
inline float float_round_odd_normal(double d) {
  std::uint64_t b;
  std::memcpy(&b, &d, 8);
  const std::uint64_t low = b & 0x1fffffffull;
  b = (b & ~0x1fffffffull) | (static_cast<std::uint64_t>(low != 0) << 29);
  std::memcpy(&d, &b, 8);
  return static_cast<float>(d);
}
/// Non-zero where float_round_odd_normal(d) may differ from float_round_odd(d): 0 < |d| < 2^-126
/// or 2^128 <= |d| < infinity. On the double's bits (its biased exponent e: [897, 1150] is the
/// float normal range; 0 with a zero mantissa is ±0; 2047 is infinity or NaN), so that an OR of
/// it over a loop vectorises.
inline std::uint64_t outside_float_normals(double d) {
  std::uint64_t b;
  std::memcpy(&b, &d, 8);
  const std::uint64_t e = (b >> 52) & 0x7ffu;
  return static_cast<std::uint64_t>(e - 897u > 253u) & static_cast<std::uint64_t>(e != 2047u) & static_cast<std::uint64_t>((b << 1) != 0);
}

/// Loads n elements of `type` at p (misaligned allowed) into row, exactly.
/// @pre type is float16, bfloat16, float32 or float64
inline void load_row(ElementType type, const std::byte* p, double* row, std::int64_t n) {
  // One copy of the row's bytes into a typed buffer, then AVX2 lanes (bfloat16, float32:
  // detail/row_lanes.hpp) and a plain loop for the rest.
  constexpr std::int64_t kChunk = 256;
  with_sum_arith(type, [&](auto a) {
    using A = decltype(a);
    using Bits = typename A::Bits;
    Bits b[kChunk];
    for (std::int64_t i0 = 0; i0 < n; i0 += kChunk) {
      const std::int64_t m = n - i0 < kChunk ? n - i0 : kChunk;
      std::memcpy(b, p + i0 * static_cast<std::int64_t>(sizeof(Bits)), static_cast<std::size_t>(m) * sizeof(Bits));
      std::int64_t i = 0;
#if ULYSSES_HOST_AVX2
      if constexpr (std::is_same_v<A, SumArith<ElementType::bfloat16>>) i = host_has_avx2() ? bf16_to_double_avx2(b, row + i0, m) : 0;
      if constexpr (std::is_same_v<A, SumArith<ElementType::float32>>) i = host_has_avx2() ? float_to_double_avx2(b, row + i0, m) : 0;
#endif
      for (; i < m; ++i) row[i0 + i] = static_cast<double>(A::widen(b[i]));
    }
  });
}

/// The element of `type` nearest to x (one rounding, ties to even; a NaN the canonical NaN of
/// element.hpp), as stored bits widened back to double: what a store then load gives.
/// @pre type is float16, bfloat16, float32 or float64
inline double round_to(ElementType type, double x) {
  switch (type) {
    case ElementType::float64: return x;  // (a NaN is stored as the canonical NaN: SumArith::narrow)
    case ElementType::float32: return x != x ? static_cast<double>(bits_float(0x7fc00000u)) : static_cast<double>(static_cast<float>(x));
    case ElementType::bfloat16:
      return static_cast<double>(SumArith<ElementType::bfloat16>::widen(SumArith<ElementType::bfloat16>::narrow(float_round_odd(x))));
    case ElementType::float16:
      return static_cast<double>(SumArith<ElementType::float16>::widen(SumArith<ElementType::float16>::narrow(float_round_odd(x))));
    case ElementType::opaque: break;
  }
  return x;
}

/// o[i] = float_round_odd(r[i]), i < m: the plain loops. The AVX2 and AVX-512 twins below do
/// the same operations in intrinsics (the same bits), so that their speed does not depend on the
/// user's optimisation flags (GCC's -O2 leaves these loops scalar: 4x slower).
ULYSSES_ALWAYS_INLINE inline void round_odd_n(const double* r, float* o, std::int64_t m) {
  std::uint64_t outside = 0;  // float_round_odd_normal() first (cheaper); all again where a value is outside its range
  for (std::int64_t i = 0; i < m; ++i) {
    o[i] = float_round_odd_normal(r[i]);
    outside |= outside_float_normals(r[i]);
  }
  if (outside)
    for (std::int64_t i = 0; i < m; ++i) o[i] = float_round_odd(r[i]);
}
#if ULYSSES_HOST_AVX2
/// round_odd_n() 8 lanes a step: float_round_odd_normal() (the low 29 bits cleared, bit 29 set
/// where any was set, then an exact conversion) and outside_float_normals() on the lanes' bits,
/// the tail in one masked step; all again by float_round_odd() where a lane is outside.
ULYSSES_TARGET_AVX512 inline void round_odd_n_avx512(const double* r, float* o, std::int64_t m) {
  const __m512i low = _mm512_set1_epi64(0x1fffffff), odd = _mm512_set1_epi64(0x20000000);
  __mmask8 outside = 0;
  for (std::int64_t i = 0; i < m; i += 8) {
    const auto k = static_cast<__mmask8>(m - i >= 8 ? 0xff : (1u << (m - i)) - 1u);  // zero lanes: not outside
    const __m512i b = _mm512_maskz_loadu_epi64(k, r + i);
    const __m512i kept = _mm512_maskz_andnot_epi64(0xff, low, b);  // (masked: GCC 12's unmasked andnot warns)
    const __m512i t = _mm512_mask_or_epi64(kept, _mm512_test_epi64_mask(b, low), kept, odd);
    _mm256_mask_storeu_ps(o + i, k, _mm512_maskz_cvtpd_ps(0xff, _mm512_castsi512_pd(t)));
    const __m512i e = _mm512_and_si512(_mm512_maskz_srli_epi64(0xff, b, 52), _mm512_set1_epi64(0x7ff));
    const __mmask8 off = _mm512_cmpgt_epu64_mask(_mm512_sub_epi64(e, _mm512_set1_epi64(897)), _mm512_set1_epi64(253));
    const __mmask8 finite = _mm512_cmpneq_epi64_mask(e, _mm512_set1_epi64(2047));
    const __m512i b2 = _mm512_add_epi64(b, b);  // b << 1: zero only for ±0
    outside = static_cast<__mmask8>(outside | (off & finite & _mm512_test_epi64_mask(b2, b2)));
  }
  if (outside)
    for (std::int64_t i = 0; i < m; ++i) o[i] = float_round_odd(r[i]);
}
/// The same in AVX2, 4 lanes a step (signed compares: the exponent field is below 2^11), the tail
/// one by one.
ULYSSES_TARGET_AVX2 inline void round_odd_n_avx2(const double* r, float* o, std::int64_t m) {
  const __m256i low = _mm256_set1_epi64x(0x1fffffff), zero = _mm256_setzero_si256();
  __m256i outside = zero;
  std::int64_t i = 0;
  for (; i + 4 <= m; i += 4) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + i));
    const __m256i exact = _mm256_cmpeq_epi64(_mm256_and_si256(b, low), zero);
    const __m256i t = _mm256_or_si256(_mm256_andnot_si256(low, b), _mm256_andnot_si256(exact, _mm256_set1_epi64x(0x20000000)));
    _mm_storeu_ps(o + i, _mm256_cvtpd_ps(_mm256_castsi256_pd(t)));
    const __m256i e = _mm256_and_si256(_mm256_srli_epi64(b, 52), _mm256_set1_epi64x(0x7ff));
    const __m256i off = _mm256_or_si256(_mm256_cmpgt_epi64(_mm256_set1_epi64x(897), e), _mm256_cmpgt_epi64(e, _mm256_set1_epi64x(1150)));
    const __m256i special = _mm256_or_si256(_mm256_cmpeq_epi64(e, _mm256_set1_epi64x(2047)), _mm256_cmpeq_epi64(_mm256_add_epi64(b, b), zero));
    outside = _mm256_or_si256(outside, _mm256_andnot_si256(special, off));
  }
  bool any = !_mm256_testz_si256(outside, outside);
  for (; i < m; ++i) {
    o[i] = float_round_odd_normal(r[i]);
    any = any || outside_float_normals(r[i]) != 0;
  }
  if (any)  // all again, as round_odd_n() does (the same bits: a NaN's payload too)
    for (std::int64_t j = 0; j < m; ++j) o[j] = float_round_odd(r[j]);
}
#endif
/// round_odd_n() through the widest twin this CPU runs.
inline void round_odd_to(const double* r, float* o, std::int64_t m) {
#if ULYSSES_HOST_AVX2
  if (host_has_avx512()) return round_odd_n_avx512(r, o, m);
  if (host_has_avx2()) return round_odd_n_avx2(r, o, m);
#endif
  round_odd_n(r, o, m);
}

/// row[i] = round_to(type, row[i]) for i < n, with one dispatch for the row (AVX2 lanes for
/// float32 and bfloat16, detail/row_lanes.hpp; plain loops otherwise).
inline void round_row(ElementType type, double* row, std::int64_t n) {
  constexpr std::int64_t kChunk = 256;
  with_sum_arith(type, [&](auto a) {
    using A = decltype(a);
    using Acc = typename A::Acc;
    if constexpr (std::is_same_v<Acc, double>) {
      (void)row;
    } else if constexpr (sizeof(typename A::Bits) == 4) {
      std::int64_t i = 0;
#if ULYSSES_HOST_AVX2
      if (host_has_avx2()) i = round_float_double_avx2(row, n);
#endif
      for (; i < n; ++i) row[i] = static_cast<double>(static_cast<float>(row[i]));  // (NaN stays NaN)
    } else {
      float f[kChunk];
      for (std::int64_t i0 = 0; i0 < n; i0 += kChunk) {
        const std::int64_t m = n - i0 < kChunk ? n - i0 : kChunk;
        round_odd_to(row + i0, f, m);
        std::int64_t i = 0;
#if ULYSSES_HOST_AVX2
        if constexpr (std::is_same_v<A, SumArith<ElementType::bfloat16>>) i = host_has_avx2() ? bf16_round_double_avx2(f, row + i0, m) : 0;
#endif
        for (; i < m; ++i) row[i0 + i] = static_cast<double>(A::widen(A::narrow(f[i])));
      }
    }
  });
}

/// Stores row (n values) as elements of `type` at p, each rounded once (round_to()).
inline void store_row(ElementType type, std::byte* p, const double* row, std::int64_t n) {
  constexpr std::int64_t kChunk = 256;
  with_sum_arith(type, [&](auto a) {
    using A = decltype(a);
    using Acc = typename A::Acc;
    using Bits = typename A::Bits;
    Bits b[kChunk];
    for (std::int64_t i0 = 0; i0 < n; i0 += kChunk) {
      const std::int64_t m = n - i0 < kChunk ? n - i0 : kChunk;
      const double* r = row + i0;
      std::int64_t i = 0;  // (AVX2 lanes for float32 and bfloat16: detail/row_lanes.hpp)
      if constexpr (std::is_same_v<Acc, double>) {
        for (; i < m; ++i) b[i] = A::narrow(r[i]);
      } else if constexpr (sizeof(Bits) == 4) {
#if ULYSSES_HOST_AVX2
        i = host_has_avx2() ? double_to_float_avx2(r, b, m) : 0;
#endif
        for (; i < m; ++i) b[i] = A::narrow(static_cast<float>(r[i]));
      } else {
        float f[kChunk];
        round_odd_to(r, f, m);
#if ULYSSES_HOST_AVX2
        if constexpr (std::is_same_v<A, SumArith<ElementType::bfloat16>>) i = host_has_avx2() ? float_to_bf16_avx2(f, b, m) : 0;
#endif
        for (; i < m; ++i) b[i] = A::narrow(f[i]);
      }
      std::memcpy(p + i0 * static_cast<std::int64_t>(sizeof(Bits)), b, static_cast<std::size_t>(m) * sizeof(Bits));
    }
  });
}
}  // namespace detail

ULYSSES_NAMESPACE_END
