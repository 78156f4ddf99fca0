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
#include "../detail/cpu.hpp"
#include "../detail/hash.hpp"
#include "../error.hpp"
#include "rows.hpp"
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
/// Arithmetic: float32 with explicit fused multiply-adds, as FlashAttention's apply_rotary computes
/// in float32: c = float(cos(p·f_i)) and s = float(sin(p·f_i)) (cos and sin in double, rounded once;
/// or the given float tables), and
///   x' = fma(x, c, −(y·s)),  y' = fma(y, c, x·s)
/// (y·s and x·s rounded to float, each fma rounded once), then rounded to the element type (RNE).
/// The same bits on every path, rank, compiler and ISA: an fma is one IEEE operation whether the
/// CPU has the instruction or not (CUDA: __fmaf_rn), and -ffp-contract cannot change an explicit
/// one. Every element type computes in float32, float64 rows included (their values are rounded to
/// float first). Error against the exact rotation by a = p·f_i (theta's tables):
///   |x' − exact| ≤ 2^−22 (|x·c| + |y·s|) + (|x| + |y|) (a (ln theta + 3) + 2) 2^−53
/// (y': x and y swapped). The first term: the roundings of c and s to float, of the product and
/// of the fma; the second: the angle's in double (its exponent −2i/rotary_dim, pow, the product
/// and cos, sin), which counts only where c or s nears 0 at a large position (4.4× the first term
/// alone at p = 104348, theta 10000). tests/layout/test_rope.cpp checks every position below 128k.
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
  /// positions p in [0, max_position) and pairs i (float32, as engines cache them), used as c and s.
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
    digest();
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
    digest();
    return *this;
  }
  /// The inverse rotation (by −p · f_i): the backward of this one, for dq and dk.
  Rope inverse() const {
    Rope r = *this;
    const std::int64_t half = rd_ / 2;  // sin(−a) = −sin(a): every position's sines negated (exactly)
    for (std::int64_t p = 0; p < max_pos_; ++p)
      for (std::int64_t i = half; i < 2 * half; ++i) {
        float& e = r.tab_[static_cast<std::size_t>(p * half * 2 + i)];
        e = -e;
      }
    r.inverse_ = !inverse_;
    r.digest();
    return r;
  }
  /// What every call compares across ranks (RowTransforms::agreement(): a rank whose Rope differs
  /// is Error(plan_mismatch) on every rank): a digest of head_dim, rotary_dim, style, theta (0:
  /// tables given), inverse() and the positions; not max_position nor the given tables' values.
  std::uint64_t agreement_word() const { return word_; }

  /// The position of the row at (b, token).
  std::int64_t position(const RowCoord& at) const {
    if (!has_ids_) return at.token;
    const std::int64_t i = at.batch * batch_stride_ + at.token;
    return i >= 0 && i < static_cast<std::int64_t>(ids_.size()) ? ids_[static_cast<std::size_t>(i)] : 0;
  }
  /// Rotates one head row in place (the row-transform concept): its values rounded to float
  /// (exact for the elements of a 16- or 32-bit tensor), rotated in float32 as the class comment
  /// says, and written back exactly.
  /// @pre check_rows() passed for the plan: n == head_dim(), the position in [0, max_position)
  void operator()(const RowCoord& at, double* row, std::int64_t n) const {
    const std::int64_t p = position(at), half = rd_ / 2;
    (void)n;
    const float* t = &tab_[static_cast<std::size_t>(p * half * 2)];
    const std::int64_t step = style_ == RopeStyle::half ? 1 : 2, other = style_ == RopeStyle::half ? half : 1;
    float x[kMaxPairs], y[kMaxPairs];  // (interleaved: pairs 2k, 2k + 1 gathered into halves)
    for (std::int64_t k = 0; k < half; ++k) {
      x[k] = static_cast<float>(row[step * k]);
      y[k] = static_cast<float>(row[step * k + other]);
    }
    rotate(x, y, t, half);
    for (std::int64_t k = 0; k < half; ++k) {
      row[step * k] = static_cast<double>(x[k]);
      row[step * k + other] = static_cast<double>(y[k]);
    }
  }
  /// Loads, rotates and stores one head row of `type` in one pass: the same bits as
  /// detail::load_row(type, src, row, n), (*this)(at, row, n) and detail::store_row(type, dst,
  /// row, n) (the same IEEE operations: the elements widen to float exactly, and the float
  /// results round to the type once, as store_row() rounds them held exactly in double). The
  /// optional fused form of the row-transform concept: the host executor takes it for a row that
  /// only this transform touches (no fp8 or cast wire, no transform on the other side). src and
  /// dst hold n elements each, may be misaligned, and are either the same row or disjoint.
  /// @returns false, touching nothing, for a type it has no fused form for (float64, opaque), or
  ///          n != head_dim(): the executor then takes the row path.
  /// @pre as operator(): n == head_dim(), the position in [0, max_position)
  bool copy_row(const RowCoord& at, ElementType type, const std::byte* src, std::byte* dst, std::int64_t n) const {
    return copy_run(RowRun{at, RowCoord{}, src, 0, dst, 0, n, 1}, type);
  }
  /// copy_row() over a RowRun of rows in one call (the run form of the row-transform concept):
  /// the same bits as copy_row() on each row, with one dispatch for the run; the rows of a run
  /// along the heads (run.step.token == run.step.batch == 0) share one position's table.
  /// @returns false, touching nothing, where copy_row() would (a type it has no fused form for,
  ///          or run.n != head_dim()).
  /// @pre as copy_row(), for every row of the run
  bool copy_run(const RowRun& run, ElementType type) const {
    const std::int64_t eb = static_cast<std::int64_t>(size_of(type));
    if (type != ElementType::bfloat16 && type != ElementType::float16 && type != ElementType::float32) return false;
    if (run.n != d_) return false;  // (outside the precondition: the general path, which reads the row as given)
    if (run.count <= 0) return true;  // (no row: nothing to read, not even a position)
    for (std::int64_t i = 0; run.n > rd_ && i < run.count; ++i) {  // the elements past rotary_dim: one load and store
      double rest[kMaxPairs * 2];                                  // (a NaN made canonical)
      detail::load_row(type, run.src + i * run.src_stride + rd_ * eb, rest, run.n - rd_);
      detail::store_row(type, run.dst + i * run.dst_stride + rd_ * eb, rest, run.n - rd_);
    }
    detail::with_sum_arith(type, [&](auto a) {
      using A = decltype(a);
      if constexpr (!std::is_same_v<typename A::Acc, double>) {
#if ULYSSES_HOST_AVX2
        if constexpr (std::is_same_v<A, detail::SumArith<ElementType::bfloat16>>)  // (half rotation, 16 pairs a vector)
          if (style_ == RopeStyle::half && rd_ % 32 == 0 && detail::host_has_avx512_bf16()) return rd_ == 128 ? copy_rotated_bf16<64>(run) : copy_rotated_bf16<0>(run);
        if constexpr (std::is_same_v<A, detail::SumArith<ElementType::float32>>)  // (half rotation, 16 pairs a vector)
          if (style_ == RopeStyle::half && rd_ % 32 == 0 && detail::host_has_avx512()) return copy_rotated_f32(run);
        if (detail::host_has_avx512()) return copy_rotated_avx512<A>(run);
        if (detail::host_has_avx2_fma()) return copy_rotated_avx2<A>(run);
#endif
        copy_rotated_sized<A>(run);
      }
    });
    return true;
  }
  /// copy_run() prefetches RowRun::next_src a row at a time, row i of it while it copies row i
  /// (layout/transform.hpp): the executor then issues no burst of prefetches before the run.
  static constexpr bool prefetches_next_src = true;
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
  /// Rotates the pairs (x[k], y[k]), k < m, by a position's table t: c[m] and s[m] back to back
  /// (two contiguous loads: the loop vectorises).
  static void rotate(float* x, float* y, const float* t, std::int64_t m) {
#if ULYSSES_HOST_AVX2
    if (detail::host_has_avx2_fma()) return rotate_pairs_avx2(x, y, t, m);
#endif
    rotate_pairs(x, y, t, m);
  }
  /// rotate()'s loop, written once and compiled twice: plainly (std::fma: the library's fmaf where
  /// the ISA has no FMA) and inside an AVX2 + FMA twin. Pair k: x' = fma(x, c, −(y·s)),
  /// y' = fma(y, c, x·s), as the class comment says (the inverse's table holds the sines negated).
  ULYSSES_ALWAYS_INLINE static void rotate_pairs(float* x, float* y, const float* t, std::int64_t m) {
    for (std::int64_t k = 0; k < m; ++k) rotate_pair(x[k], y[k], t[k], t[m + k]);
  }
  /// The rotation of one pair (x, y) by c and s, in place: the class comment's arithmetic, written once.
  ULYSSES_ALWAYS_INLINE static void rotate_pair(float& x, float& y, float c, float s) {
    const float u = x, v = y;
    x = std::fma(u, c, -(v * s));
    y = std::fma(v, c, u * s);
  }
#if ULYSSES_HOST_AVX2
  /// rotate_pairs() 8 pairs a step in AVX2 + FMA intrinsics (fmsub / fmadd of the rounded
  /// products: rotate_pair()'s operations; not left to the vectoriser, which -O2 skips), the last
  /// m % 8 pairs one by one through rotate_pair().
  ULYSSES_TARGET_AVX2_FMA static void rotate_pairs_avx2(float* x, float* y, const float* t, std::int64_t m) {
    const std::int64_t body = m > 0 ? m - m % 8 : 0;
    for (std::int64_t k = 0; k < body; k += 8) {
      const __m256 u = _mm256_loadu_ps(x + k), v = _mm256_loadu_ps(y + k);
      const __m256 c = _mm256_loadu_ps(t + k), sn = _mm256_loadu_ps(t + m + k);
      _mm256_storeu_ps(x + k, _mm256_fmsub_ps(u, c, _mm256_mul_ps(v, sn)));
      _mm256_storeu_ps(y + k, _mm256_fmadd_ps(v, c, _mm256_mul_ps(u, sn)));
    }
    for (std::int64_t k = body; k < m; ++k) rotate_pair(x[k], y[k], t[k], t[m + k]);
  }
#endif
  /// copy_row()'s pass over the first 2m elements (A: SumArith of a type whose Acc is float):
  /// each pair widened to float (exactly), rotated as rotate_pairs() does, narrowed (RNE, a NaN
  /// made canonical), in one loop between two local rows (the row is read whole first: src may be
  /// dst). Written once and compiled three times: plainly, in an AVX2 + FMA twin and in an AVX-512
  /// twin; each for m = 32 and 64 (head dims 64 and 128: fixed trip counts) and for any m (M = 0).
  template <class A, int M>
  ULYSSES_ALWAYS_INLINE static void copy_rotated(const std::byte* src, std::byte* dst, const float* t, std::int64_t m_any, bool il) {
    const std::int64_t m = M != 0 ? M : m_any;
    using Bits = typename A::Bits;
    constexpr std::size_t kPairs = M != 0 ? static_cast<std::size_t>(M) : kMaxPairs;
    Bits b[2 * kPairs], o[2 * kPairs];
    const std::size_t bytes = static_cast<std::size_t>(2 * m) * sizeof(Bits);
    std::memcpy(b, src, bytes);
    const float* c = t;
    const float* s = t + m;
    if (il) {
      for (std::int64_t k = 0; k < m; ++k) {
        float u = A::widen(b[2 * k]), v = A::widen(b[2 * k + 1]);
        rotate_pair(u, v, c[k], s[k]);
        o[2 * k] = A::narrow(u);
        o[2 * k + 1] = A::narrow(v);
      }
    } else {
      for (std::int64_t k = 0; k < m; ++k) {
        float u = A::widen(b[k]), v = A::widen(b[k + m]);
        rotate_pair(u, v, c[k], s[k]);
        o[k] = A::narrow(u);
        o[k + m] = A::narrow(v);
      }
    }
    std::memcpy(dst, o, bytes);
  }
  /// The table (c then s, rotary_dim / 2 each) of the row at `at`.
  const float* table_of(const RowCoord& at) const { return &tab_[static_cast<std::size_t>(position(at) * rd_)]; }
  /// The table of row i of a run, given first = table_of(run.first): that one for a run along the
  /// heads (no step in tokens or batches: one position, looked up once a run), row i's own otherwise.
  const float* run_table(const RowRun& run, std::int64_t i, const float* first) const {
    return run.step.token == 0 && run.step.batch == 0 ? first : table_of(run.at(i));
  }
  /// Row i of the run after this one (RowRun::next_src, rows src_stride apart), where there is one.
  ULYSSES_ALWAYS_INLINE static void prefetch_next(const RowRun& run, std::int64_t i) {
    if (run.next_src != nullptr) detail::prefetch_run(run.next_src + i * run.src_stride, 1, run.src_stride);
  }
  /// The run's rows through copy_rotated<A, M>, each with its run_table() and prefetch_next().
  template <class A, int M>
  ULYSSES_ALWAYS_INLINE void copy_rotated_run(const RowRun& run) const {
    const std::int64_t m = rd_ / 2;
    const bool il = style_ == RopeStyle::interleaved;
    const float* first = table_of(run.first);  // (copy_run() returns before an empty run)
    for (std::int64_t i = 0; i < run.count; ++i) {
      prefetch_next(run, i);
      copy_rotated<A, M>(run.src + i * run.src_stride, run.dst + i * run.dst_stride, run_table(run, i, first), m, il);
    }
  }
  template <class A>
  ULYSSES_ALWAYS_INLINE void copy_rotated_sized(const RowRun& run) const {
    if (rd_ == 128) return copy_rotated_run<A, 64>(run);
    if (rd_ == 64) return copy_rotated_run<A, 32>(run);
    copy_rotated_run<A, 0>(run);
  }
#if ULYSSES_HOST_AVX2
  template <class A>
  ULYSSES_TARGET_AVX512 void copy_rotated_avx512(const RowRun& run) const {
    copy_rotated_sized<A>(run);
  }
  template <class A>
  ULYSSES_TARGET_AVX2_FMA void copy_rotated_avx2(const RowRun& run) const {
    copy_rotated_sized<A>(run);
  }
  /// 16 pairs k..k+15 of a bf16 row at src rotated by table t (c then s, m each): x and y widened
  /// exactly, x' = x·c − (y·s) and y' = y·c + (x·s) (rotate_pair()'s operations, one fused rounding
  /// each, the products rounded first) into xo and yo; the lanes bf16_special_lanes() flags or-ed
  /// into `special`.
  ULYSSES_TARGET_AVX512_BF16 static void rotate_bf16x16(const std::byte* src, const float* t, std::int64_t m, std::int64_t k,
                                                        __m512& xo, __m512& yo, __mmask16& special) {
    const __m512 x = detail::bf16x16_load(src + 2 * k), y = detail::bf16x16_load(src + 2 * (m + k));
    const __m512 c = _mm512_loadu_ps(t + k), sn = _mm512_loadu_ps(t + m + k);
    xo = _mm512_fmsub_ps(x, c, _mm512_mul_ps(y, sn));
    yo = _mm512_fmadd_ps(y, c, _mm512_mul_ps(x, sn));
    special = static_cast<__mmask16>(special | detail::bf16_special_lanes(xo) | detail::bf16_special_lanes(yo));
  }
  /// copy_rotated_run<bf16>'s half rotation (rotary_dim a multiple of 32) in AVX-512 with BF16, the
  /// same bits: per 32 pairs (64 bytes of x', 64 of y'), rotate_bf16x16() twice, every load before
  /// any store (src may be dst); where no lane is special, one VCVTNE2PS2BF16 and one 64-byte
  /// store per 32 elements (one check a group: no branch waits on each store), else
  /// detail::bf16x16_store()'s lane by lane narrowing. A run along the heads keeps one position's table.
  /// M: rotary_dim / 2 fixed at 64 (head dim 128: the loop's trip count known), or 0 (any).
  template <int M>
  ULYSSES_TARGET_AVX512_BF16 void copy_rotated_bf16(const RowRun& run) const {
    const std::int64_t m = M != 0 ? M : rd_ / 2;
    const bool stream = run.stream;
    const float* first = table_of(run.first);  // (copy_run() returns before an empty run)
    for (std::int64_t i = 0; i < run.count; ++i) {
      const float* t = run_table(run, i, first);
      const std::byte* src = run.src + i * run.src_stride;
      std::byte* dst = run.dst + i * run.dst_stride;
      prefetch_next(run, i);
      for (std::int64_t k = 0; k < m; k += 32) {
        __m512 x0, y0, x1 = _mm512_setzero_ps(), y1 = _mm512_setzero_ps();
        __mmask16 special = 0;
        const bool two = k + 32 <= m;  // (else 16 pairs left: rotary_dim a multiple of 32, not of 64)
        rotate_bf16x16(src, t, m, k, x0, y0, special);
        if (two) rotate_bf16x16(src, t, m, k + 16, x1, y1, special);
        if (two && special == 0) {
          detail::bf16x32_store_plain(dst + 2 * k, x0, x1, stream);
          detail::bf16x32_store_plain(dst + 2 * (m + k), y0, y1, stream);
          continue;
        }
        detail::bf16x16_store(dst + 2 * k, x0, stream);
        detail::bf16x16_store(dst + 2 * (m + k), y0, stream);
        if (!two) continue;
        detail::bf16x16_store(dst + 2 * (k + 16), x1, stream);
        detail::bf16x16_store(dst + 2 * (m + k + 16), y1, stream);
      }
    }
  }
  /// copy_rotated_run<float32>'s half rotation (rotary_dim a multiple of 32) in AVX-512, the same
  /// bits: per 16 pairs x and y loaded (both before either store: src may be dst), rotated by
  /// rotate_pair()'s operations, a NaN lane made SumArith<float32>::narrow()'s canonical NaN by a
  /// masked move, stored (non-temporal with run.stream where 16-byte aligned: stream_store_x64()).
  ULYSSES_TARGET_AVX512 void copy_rotated_f32(const RowRun& run) const {
    const std::int64_t m = rd_ / 2;
    const __m512 canonical = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000));
    const float* first = table_of(run.first);  // (copy_run() returns before an empty run)
    for (std::int64_t i = 0; i < run.count; ++i) {
      const float* t = run_table(run, i, first);
      const std::byte* src = run.src + i * run.src_stride;  // (4-byte elements: any alignment)
      std::byte* dst = run.dst + i * run.dst_stride;
      const bool stream = run.stream;
      prefetch_next(run, i);
      for (std::int64_t k = 0; k < m; k += 16) {
        const __m512 x = _mm512_loadu_ps(src + 4 * k), y = _mm512_loadu_ps(src + 4 * (m + k));
        const __m512 c = _mm512_loadu_ps(t + k), sn = _mm512_loadu_ps(t + m + k);
        __m512 xo = _mm512_fmsub_ps(x, c, _mm512_mul_ps(y, sn)), yo = _mm512_fmadd_ps(y, c, _mm512_mul_ps(x, sn));
        xo = _mm512_mask_mov_ps(xo, _mm512_fpclass_ps_mask(xo, 0x81), canonical);  // (0x01 quiet, 0x80 signalling NaN)
        yo = _mm512_mask_mov_ps(yo, _mm512_fpclass_ps_mask(yo, 0x81), canonical);
        if (stream) {
          detail::stream_store_x64(dst + 4 * k, _mm512_castps_si512(xo));
          detail::stream_store_x64(dst + 4 * (m + k), _mm512_castps_si512(yo));
        } else {
          _mm512_storeu_ps(dst + 4 * k, xo);
          _mm512_storeu_ps(dst + 4 * (m + k), yo);
        }
      }
    }
  }
#endif
  static constexpr std::int64_t kMaxPairs = 512;  // rotary_dim / 2 for D <= 1024
  double freq(std::int64_t i) const { return std::pow(theta_, -2.0 * static_cast<double>(i) / static_cast<double>(rd_)); }
  /// The tables [max_position][c, s][rotary_dim / 2], from the given float tables or from theta
  /// (cos and sin in double, rounded to float).
  void tables(const float* cos_t, const float* sin_t, double theta) {
    check(d_ >= 1 && rd_ >= 2 && rd_ % 2 == 0 && rd_ <= d_, "rotary_dim must be even, >= 2 and <= head_dim");
    check(d_ <= 2 * kMaxPairs, "head_dim must be <= 1024 (the longest row a row transform sees: Plan refuses longer ones too)");
    check(max_pos_ >= 1, "max_position must be >= 1");
    theta_ = theta;
    const std::int64_t half = rd_ / 2;
    tab_.assign(static_cast<std::size_t>(detail::mul(detail::mul(max_pos_, half, "Rope table"), 2, "Rope table")), 0.0f);
    for (std::int64_t p = 0; p < max_pos_; ++p)
      for (std::int64_t i = 0; i < half; ++i) {
        float* e = &tab_[static_cast<std::size_t>(p * half * 2 + i)];  // c, s: `half` apart
        e[0] = cos_t ? cos_t[p * half + i] : static_cast<float>(std::cos(static_cast<double>(p) * freq(i)));
        e[half] = sin_t ? sin_t[p * half + i] : static_cast<float>(std::sin(static_cast<double>(p) * freq(i)));
      }
    digest();
  }
  /// word_ of the present state (agreement_word()).
  void digest() {
    std::uint64_t w = detail::fnv1a(detail::fnv1a(detail::fnv1a(detail::kFnvBasis, d_), rd_), static_cast<int>(style_));
    std::uint64_t theta_bits;
    std::memcpy(&theta_bits, &theta_, 8);
    w = detail::fnv1a(detail::fnv1a(detail::fnv1a(detail::fnv1a(w, theta_bits), static_cast<int>(inverse_)), static_cast<int>(has_ids_)), batch_stride_);
    for (std::int64_t v : ids_) w = detail::fnv1a(w, v);
    word_ = w;
  }

  std::int64_t d_, rd_;
  RopeStyle style_;
  std::int64_t max_pos_;
  double theta_ = 10000.0;
  std::vector<float> tab_;
  std::vector<std::int64_t> ids_;
  bool has_ids_ = false;  // positions from ids_ (position ids or documents), even when it is empty
  std::int64_t batch_stride_ = 0;
  bool inverse_ = false;   // made by inverse() (an odd number of times)
  std::uint64_t word_ = 0;  // agreement_word()
};

ULYSSES_NAMESPACE_END
