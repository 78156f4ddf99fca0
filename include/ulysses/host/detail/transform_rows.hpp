// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The host executor's transformed blocks: each row of a block of a tensor planned with
///        TensorSpec::with_row_transforms() is loaded into double, given to the call's pack and
///        unpack transforms with its RowCoord, and stored rounded once (layout/transform.hpp);
///        a transformed sum adds its terms by the sum rules first. docs/transforms.md.
#pragma once

#include <cstdint>

#include "../../layout/blocks.hpp"
#include "../../layout/element.hpp"
#include "../../layout/rows.hpp"
#include "../../layout/transform.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// Most elements of one transformed row (D): Plan refuses a larger head dim with row transforms.
inline constexpr std::int64_t kMaxTransformedRow = 1024;

/// Whether block c runs through the transforms of table t: a transformed block whose tensor has
/// a transform on a side the block touches. Otherwise it is copied (or summed) as bytes: the
/// same bits as with no transform.
inline bool transforms_rows(const BlockCopy& c, const BufferTable& t) {
  if (c.row_tensor < 0 || !t.transforms || c.op == BlockOp::sum_term) return false;
  const RowTransforms& x = *t.transforms;
  if (c.op == BlockOp::sum) return static_cast<bool>(x.unpack(c.row_tensor)) || static_cast<bool>(x.pack(c.row_tensor));
  return ((c.row_sides & 1) && x.pack(c.row_tensor)) || ((c.row_sides & 2) && x.unpack(c.row_tensor));
}

/// The RowCoord of the cursor's row of block c (c.origin advanced along c.axis).
inline RowCoord row_coord(const BlockCopy& c, const RowCursor& at) {
  std::int64_t v[3] = {c.origin[0], c.origin[1], c.origin[2]};
  for (int i = 0; i < 4; ++i)
    if (c.axis[i] >= 0) v[c.axis[i]] += at.idx[i];
  return {v[0], v[1], v[2]};
}

/// Rows [r0, r1) of the transformed copy block c: load, the pack transform (a source that is an
/// input), a rounding to the element type when both sides apply (what the wire would carry), the
/// unpack transform (a destination that is an output), store rounded once.
/// @pre transforms_rows(c, t); c.row_bytes == D * elem_bytes with D <= kMaxTransformedRow
inline void run_transformed_rows(const BlockCopy& c, const BufferTable& t, std::int64_t r0, std::int64_t r1) {
  if (r0 >= r1) return;
  const RowTransforms& x = *t.transforms;
  const RowTransformRef pack = (c.row_sides & 1) ? x.pack(c.row_tensor) : RowTransformRef{};
  const RowTransformRef unpack = (c.row_sides & 2) ? x.unpack(c.row_tensor) : RowTransformRef{};
  const std::int64_t n = c.row_bytes / c.elem_bytes;
  const std::byte* src = buffer_at(t, c.src_buffer) + c.src_offset;
  std::byte* dst = buffer_at(t, c.dst_buffer) + c.dst_offset;
  double row[kMaxTransformedRow];
  RowCursor at(c, r0);
  for (std::int64_t r = r0; r < r1; ++r, at.next(c)) {
    const RowCoord rc = row_coord(c, at);
    load_row(c.type, src + at.offset(c, true), row, n);
    if (pack) pack(rc, row, n);
    if (pack && unpack)
      for (std::int64_t i = 0; i < n; ++i) row[i] = round_to(c.type, row[i]);
    if (unpack) unpack(rc, row, n);
    store_row(c.type, dst + at.offset(c, false), row, n);
  }
}

/// Rows [r0, r1) of the transformed sum g[0..g[0].sources): each term loaded (an input term
/// through the pack transform, rounded to the element type as the wire carries it), the terms
/// added in order in the sum's accumulator type (SumArith: float32 for 16-bit types), the unpack
/// transform applied to that sum in double, stored rounded once.
/// @pre g[0].op == BlockOp::sum, transforms_rows(g[0], t), as run_transformed_rows()
inline void run_transformed_sum(const BlockCopy* g, const BufferTable& t, std::int64_t r0, std::int64_t r1) {
  if (r0 >= r1) return;
  const BlockCopy& c = g[0];
  const RowTransforms& x = *t.transforms;
  const RowTransformRef pack = x.pack(c.row_tensor), unpack = x.unpack(c.row_tensor);
  const std::int64_t n = c.row_bytes / c.elem_bytes;
  std::byte* dst = buffer_at(t, c.dst_buffer) + c.dst_offset;
  double row[kMaxTransformedRow], sum[kMaxTransformedRow];
  RowCursor at(c, r0);
  with_sum_arith(c.type, [&](auto a) {
    using Acc = typename decltype(a)::Acc;
    for (std::int64_t r = r0; r < r1; ++r, at.next(c)) {
      const RowCoord rc = row_coord(c, at);
      for (int j = 0; j < c.sources; ++j) {
        load_row(c.type, buffer_at(t, g[j].src_buffer) + g[j].src_offset + at.offset(g[j], true), row, n);
        if (pack && (g[j].row_sides & 1)) {
          pack(rc, row, n);
          for (std::int64_t i = 0; i < n; ++i) row[i] = round_to(c.type, row[i]);
        }
        for (std::int64_t i = 0; i < n; ++i)  // the sum rules: ascending order, in Acc
          sum[i] = j == 0 ? row[i] : static_cast<double>(static_cast<Acc>(sum[i]) + static_cast<Acc>(row[i]));
      }
      if (unpack) unpack(rc, sum, n);
      store_row(c.type, dst + at.offset(c, false), sum, n);
    }
  });
}

}  // namespace detail

ULYSSES_NAMESPACE_END
