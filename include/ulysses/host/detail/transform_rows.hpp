// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The host executor's transformed blocks: each row of a block of a tensor planned with
///        TensorSpec::with_row_transforms() is loaded into double, given to the call's pack and
///        unpack transforms with its RowCoord, and stored rounded once (layout/transform.hpp);
///        a transformed sum adds its terms by the sum rules first. docs/transforms.md.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../../layout/blocks.hpp"
#include "../../layout/element.hpp"
#include "../../layout/fp8.hpp"
#include "../../layout/rows.hpp"
#include "../../layout/transform.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// Most elements of one transformed row (D): Plan refuses a larger head dim with row transforms.
inline constexpr std::int64_t kMaxTransformedRow = 1024;

/// Whether block c takes the row path: a block of a tensor planned by rows with an fp8 wire, or
/// whose call has a transform on a side the block touches. Otherwise it is copied (or summed) as
/// bytes: the same bits as with no transform.
inline bool transforms_rows(const BlockCopy& c, const BufferTable& t) {
  if (c.row_tensor < 0 || c.op == BlockOp::sum_term) return false;
  if (c.wire) return true;
  if (!t.transforms) return false;
  const RowTransforms& x = *t.transforms;
  if (c.op == BlockOp::sum) return static_cast<bool>(x.unpack(c.row_tensor)) || static_cast<bool>(x.pack(c.row_tensor));
  return ((c.row_sides & 1) && x.pack(c.row_tensor)) || ((c.row_sides & 2) && x.unpack(c.row_tensor));
}

/// The RowCoord of the cursor's row of block c (c.origin advanced along c.axis).
inline RowCoord row_coord(const BlockCopy& c, const RowCursor& at) {
  RowCoord rc{c.origin[0], c.origin[1], c.origin[2]};  // (selects, not an indexed array: stays in registers)
  for (int i = 0; i < 4; ++i) {
    rc.batch += c.axis[i] == 0 ? at.idx[i] : 0;
    rc.token += c.axis[i] == 1 ? at.idx[i] : 0;
    rc.head += c.axis[i] == 2 ? at.idx[i] : 0;
  }
  return rc;
}

/// The RowCoord increment from one row of block c to the next along its innermost loop.
inline RowCoord row_step(const BlockCopy& c) {
  return {c.axis[3] == 0 ? 1 : 0, c.axis[3] == 1 ? 1 : 0, c.axis[3] == 2 ? 1 : 0};
}

/// Rows [r, r1) of block c through a transform's fused copy_run(), one run along the block's
/// innermost loop at a time, the cursor `at` on row r and advanced past the rows copied;
/// `streaming`: the runs may store non-temporally (RowRun::stream; the caller fences).
/// @returns the first row not copied: r1, or r untouched where the transform does not fuse.
inline std::int64_t copy_runs(const BlockCopy& c, const RowTransformRef& x, ElementType type, std::int64_t n, const std::byte* src,
                              std::byte* dst, RowCursor& at, std::int64_t r, std::int64_t r1, bool streaming) {
  const RowCoord step = row_step(c);
  while (r < r1) {
    const std::int64_t count = std::min(c.extent[3] - at.idx[3], r1 - r);
    RowRun run{row_coord(c, at), step, src + at.offset(c, true), c.src_stride[3], dst + at.offset(c, false), c.dst_stride[3], n, count,
               streaming};
    RowCursor next = at;
    next.idx[3] += count - 1;  // (count - 1 stays inside the loop's extent; next() carries)
    next.next(c);
    if (r + count < r1) {
      const std::byte* next_src = src + next.offset(c, true);
      const bool contiguous = c.src_stride[3] == c.row_bytes;  // (rows one after the other: the next run's too)
      if (!contiguous || next_src != run.src + count * c.row_bytes) {
        if (contiguous && x.prefetches_next_src) run.next_src = next_src;  // (row by row as this run's are copied: no burst of prefetches)
        else prefetch_run(next_src, contiguous ? count : 1, c.row_bytes);
      }
    }
    if (!x.copy_run(x.object, run, type)) return r;
    r += count;
    at = next;
  }
  return r;
}

/// One row's work space and the call's transforms of the block's tensor.
struct RowWork {
  RowTransformRef pack, unpack;  // the call's, for this tensor (empty: none)
  ElementType type;              // the tensor's elements
  Fp8Format wire;                // its fp8 wire (when fp8)
  bool fp8;                      // whether it has one
  ElementType cast;              // its cast wire's type (opaque: none)
  std::int64_t n;                // D
  double v[kMaxTransformedRow];
  float f[kMaxTransformedRow];
  std::uint8_t q[kMaxTransformedRow];

  RowWork(const BlockCopy& c, const BufferTable& t)
      : pack(t.transforms ? t.transforms->pack(c.row_tensor) : RowTransformRef{}),
        unpack(t.transforms ? t.transforms->unpack(c.row_tensor) : RowTransformRef{}),
        type(c.type), wire(static_cast<Fp8Format>(c.wire)), fp8(c.wire == 1 || c.wire == 2),
        cast(c.wire == 3 ? ElementType::bfloat16 : c.wire == 4 ? ElementType::float16 : ElementType::opaque),
        n((c.row_sides & 2) ? c.row_bytes / c.elem_bytes : c.src_row_bytes / c.elem_bytes) {}  // (a wire side's rows differ)
  /// v rounded to the element type (and, through a cast wire, to the wire's type).
  void round() {
    round_row(type, v, n);
    if (cast != ElementType::opaque) round_row(cast, v, n);
  }
  /// f (n float32 elements) quantized into q by the scale of its amax; @returns the scale.
  float quantize_f() {
    const float scale = fp8_scale_of(row_amax(f, n), wire);
    quantize_fp8(f, n, scale, wire, q);
    return scale;
  }
  /// The wire's fp8 row at p: q's D codes, then the float32 scale.
  void put_fp8(std::byte* p, float scale) const {
    std::memcpy(p, q, static_cast<std::size_t>(n));
    std::memcpy(p + n, &scale, 4);
  }
  /// f = the wire's fp8 row at p dequantized in float32 (its codes kept in q).
  void get_fp8(const std::byte* p) {
    float scale;
    std::memcpy(q, p, static_cast<std::size_t>(n));
    std::memcpy(&scale, p + n, 4);
    dequantize_fp8(q, n, scale, wire, f);
  }
  /// f = v narrowed to float32 (the quantizer's input).
  void v_to_f() {
    for (std::int64_t i = 0; i < n; ++i) f[i] = static_cast<float>(v[i]);
  }
  /// v = f widened (exact).
  void f_to_v() {
    for (std::int64_t i = 0; i < n; ++i) v[i] = static_cast<double>(f[i]);
  }
  /// The fp8 wire of a row that no transform touches (from an input to the wire, from the wire to
  /// an output, or both: the peer copy), in float32 throughout: the elements widen to float
  /// exactly, and a dequantized float stored to the type rounds once, as read() and write() do
  /// through double (a NaN gives the same canonical codes, scale and element). @returns false,
  /// touching nothing, for float64 rows (the general path).
  bool fp8_direct(const std::byte* src, std::byte* dst, bool input, bool output) {
    bool done = false;
    with_sum_arith(type, [&](auto a) {
      using A = decltype(a);
      if constexpr (!std::is_same_v<typename A::Acc, double>) {
        done = true;
#if ULYSSES_HOST_AVX2
        if constexpr (std::is_same_v<A, SumArith<ElementType::bfloat16>>)
          if (n % 16 == 0 && host_has_avx512_bf16()) return fp8_direct_bf16(src, dst, input, output);
        if (host_has_avx512()) return fp8_direct_avx512<A>(src, dst, input, output);
        if (host_has_avx2()) return fp8_direct_avx2<A>(src, dst, input, output);
#endif
        fp8_direct_rows<A>(src, dst, input, output);
      }
    });
    return done;
  }
  /// fp8_direct()'s work for the SumArith A of a 16- or 32-bit type, written once and compiled
  /// three times: plainly and inside AVX2 and AVX-512 twins (a bfloat16 row widens and narrows in
  /// detail/row_lanes.hpp's AVX2 lanes; the codec's loops dispatch on their own).
  template <class A>
  ULYSSES_ALWAYS_INLINE void fp8_direct_rows(const std::byte* src, std::byte* dst, bool input, bool output) {
    using Bits = typename A::Bits;
    Bits b[kMaxTransformedRow];
    if (!input) {
      get_fp8(src);
    } else {
      std::memcpy(b, src, static_cast<std::size_t>(n) * sizeof(Bits));
      std::int64_t i = 0;
#if ULYSSES_HOST_AVX2
      if constexpr (std::is_same_v<A, SumArith<ElementType::bfloat16>>) i = host_has_avx2() ? bf16_to_float_avx2(b, f, n) : 0;
#endif
      for (; i < n; ++i) f[i] = A::widen(b[i]);
      const float scale = quantize_f();
      if (!output) return put_fp8(dst, scale);
      dequantize_fp8(q, n, scale, wire, f);
    }
    std::int64_t i = 0;
#if ULYSSES_HOST_AVX2
    if constexpr (std::is_same_v<A, SumArith<ElementType::bfloat16>>) i = host_has_avx2() ? float_to_bf16_avx2(f, b, n) : 0;
#endif
    for (; i < n; ++i) b[i] = A::narrow(f[i]);
    std::memcpy(dst, b, static_cast<std::size_t>(n) * sizeof(Bits));
  }
#if ULYSSES_HOST_AVX2
  template <class A>
  ULYSSES_TARGET_AVX512 void fp8_direct_avx512(const std::byte* src, std::byte* dst, bool input, bool output) {
    fp8_direct_rows<A>(src, dst, input, output);
  }
  template <class A>
  ULYSSES_TARGET_AVX2 void fp8_direct_avx2(const std::byte* src, std::byte* dst, bool input, bool output) {
    fp8_direct_rows<A>(src, dst, input, output);
  }
  /// fp8_direct_rows() of a bf16 row of a multiple of 16 elements in AVX-512 with BF16: widened,
  /// its amax taken and quantized in one pass over registers and one local float row, dequantized
  /// and narrowed in registers (fp8.hpp's fp8_code_x16() and fp8_value_x16(), element.hpp's
  /// bf16x16_store()): the same bits, without the row's trips through the work space.
  ULYSSES_TARGET_AVX512_BF16 void fp8_direct_bf16(const std::byte* src, std::byte* dst, bool input, bool output) {
    if (wire == Fp8Format::e4m3) return fp8_direct_bf16_as<3, 7, 0x7e, 0x7f, true>(src, dst, input, output);
    fp8_direct_bf16_as<2, 15, 0x7b, 0x7e, false>(src, dst, input, output);
  }
  template <std::uint32_t M, std::uint32_t B, std::uint32_t MaxCode, std::uint32_t NanCode, bool E4M3>
  ULYSSES_TARGET_AVX512_BF16 void fp8_direct_bf16_as(const std::byte* src, std::byte* dst, bool input, bool output) {
    float scale;
    if (!input) {  // the wire's codes and scale, dequantized into the output
      std::memcpy(&scale, src + n, 4);
      const __m512 s = _mm512_set1_ps(scale);
      for (std::int64_t i = 0; i < n; i += 16) {
        const __m512i c = _mm512_maskz_cvtepu8_epi32(0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
        bf16x16_store(dst + 2 * i, fp8_value_x16<M, B, E4M3>(c, s));
      }
      return;
    }
    Amax16 amax{_mm512_setzero_si512()};  // row_amax()'s, on the widened lanes
    for (std::int64_t i = 0; i < n; i += 16) {
      const __m512 x = bf16x16_load(src + 2 * i);
      _mm512_storeu_ps(f + i, x);
      amax_add_x16(amax, x);
    }
    scale = fp8_scale_of(amax_of_x16(amax), wire);
    const __m512 s = _mm512_set1_ps(scale);
    for (std::int64_t i = 0; i < n; i += 16) {
      const __m128i c = fp8_code_x16<M, B, MaxCode, NanCode>(_mm512_div_ps(_mm512_loadu_ps(f + i), s));
      if (!output)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), c);
      else
        bf16x16_store(dst + 2 * i, fp8_value_x16<M, B, E4M3>(_mm512_maskz_cvtepu8_epi32(0xffff, c), s));
    }
    if (!output) std::memcpy(dst + n, &scale, 4);
  }
#endif
  /// v = the row at p of a source that is an input (`input`) or the wire, as the receiver sees it
  /// before its unpack transform. From an input: the pack transform, then, as the wire would
  /// carry it when something follows (`carried`: the destination is not the wire; `summed`: a
  /// term of a sum), rounded to the type and, for an fp8 wire, quantized and dequantized.
  void read(const std::byte* p, bool input, bool carried, const RowCoord& rc, bool summed = false) {
    if (!input && fp8) {
      get_fp8(p);
      return f_to_v();
    }
    load_row(!input && cast != ElementType::opaque ? cast : type, p, v, n);
    if (!input) return;
    if (pack) pack(rc, v, n);
    if (!carried) return;
    // Rounded as the wire would carry it where something follows: a sum, an unpack transform, a
    // cast or fp8 wire (otherwise the store's one rounding gives the same bits).
    if (fp8 || (pack && (unpack || summed)) || cast != ElementType::opaque) round();
    if (!fp8) return;
    v_to_f();
    dequantize_fp8(q, n, quantize_f(), wire, f);
    f_to_v();
  }
  /// Writes v at p: to an output through the unpack transform, rounded once; to the wire
  /// rounded to the type (fp8: quantized).
  void write(std::byte* p, bool output, const RowCoord& rc) {
    if (output) {
      if (unpack) unpack(rc, v, n);
      return store_row(type, p, v, n);
    }
    if (!fp8) {
      if (cast == ElementType::opaque) return store_row(type, p, v, n);
      round();
      return store_row(cast, p, v, n);
    }
    round();
    v_to_f();
    put_fp8(p, quantize_f());
  }
};

/// Rows [r0, r1) of the row-path copy block c: each row read (RowWork::read()) and written
/// (RowWork::write()) with its RowCoord, or, where one transform alone touches the rows, through
/// its fused copy_run() (copy_runs()) or copy_row(). `streaming`: the call streams its stores
/// (RowRun::stream: a fused copy may store non-temporally; the caller fences).
/// @pre transforms_rows(c, t); D <= kMaxTransformedRow
inline void run_transformed_rows(const BlockCopy& c, const BufferTable& t, std::int64_t r0, std::int64_t r1, bool streaming = false) {
  if (r0 >= r1) return;
  const std::byte* src = buffer_at(t, c.src_buffer) + c.src_offset;
  std::byte* dst = buffer_at(t, c.dst_buffer) + c.dst_offset;
  const bool input = c.row_sides & 1, output = c.row_sides & 2;
  RowWork w(c, t);
  RowCursor at(c, r0);
  // A row only one transform touches, with no wire conversion, takes the transform's fused form
  // when it has one: the pack transform from an input, the unpack transform into an output.
  const RowTransformRef one = w.fp8 || w.cast != ElementType::opaque ? RowTransformRef{}
                              : input && !(output && w.unpack)       ? w.pack
                              : !input && output                     ? w.unpack
                                                                     : RowTransformRef{};
  const bool fp8_plain = w.fp8 && !(input && w.pack) && !(output && w.unpack);  // an fp8 row no transform touches
  if (one.copy_run) r0 = copy_runs(c, one, w.type, w.n, src, dst, at, r0, r1, streaming);
  for (std::int64_t r = r0; r < r1; ++r, at.next(c)) {
    const RowCoord rc = row_coord(c, at);
    if (one.copy && one.copy(one.object, rc, w.type, src + at.offset(c, true), dst + at.offset(c, false), w.n)) continue;
    if (fp8_plain && w.fp8_direct(src + at.offset(c, true), dst + at.offset(c, false), input, output)) continue;
    w.read(src + at.offset(c, true), input, output, rc);
    w.write(dst + at.offset(c, false), output, rc);
  }
}

/// Rows [r0, r1) of the row-path sum g[0..g[0].sources): each term read as the receiver sees it
/// (RowWork::read(): an input term through the pack transform and rounded as the wire carries
/// it, an fp8 term dequantized), the terms added in order in the sum's accumulator type
/// (SumArith: float32 for 16-bit types), then the unpack transform on that sum in double, and
/// one rounding.
/// @pre g[0].op == BlockOp::sum, transforms_rows(g[0], t), as run_transformed_rows()
inline void run_transformed_sum(const BlockCopy* g, const BufferTable& t, std::int64_t r0, std::int64_t r1) {
  if (r0 >= r1) return;
  const BlockCopy& c = g[0];
  std::byte* dst = buffer_at(t, c.dst_buffer) + c.dst_offset;
  RowWork w(c, t);
  double sum[kMaxTransformedRow];
  RowCursor at(c, r0);
  with_sum_arith(c.type, [&](auto a) {
    using Acc = typename decltype(a)::Acc;
    for (std::int64_t r = r0; r < r1; ++r, at.next(c)) {
      const RowCoord rc = row_coord(c, at);
      for (int j = 0; j < c.sources; ++j) {
        w.read(buffer_at(t, g[j].src_buffer) + g[j].src_offset + at.offset(g[j], true), g[j].row_sides & 1, true, rc, true);
        for (std::int64_t i = 0; i < w.n; ++i)  // the sum rules: ascending order, in Acc
          sum[i] = j == 0 ? w.v[i] : static_cast<double>(static_cast<Acc>(sum[i]) + static_cast<Acc>(w.v[i]));
      }
      for (std::int64_t i = 0; i < w.n; ++i) w.v[i] = sum[i];
      w.write(dst + at.offset(c, false), true, rc);
    }
  });
}

}  // namespace detail

ULYSSES_NAMESPACE_END
