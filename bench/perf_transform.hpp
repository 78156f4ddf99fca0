// SPDX-License-Identifier: Apache-2.0
// ulysses_perf --op transform: a one-thread host micro-benchmark of the row transforms' throughput
// (layout/transform.hpp, layout/rope.hpp) and of the fp8 row codec (layout/fp8.hpp), each against
// std::memcpy of the same bytes in the same alternating run. Rows: T tokens (the sweep's sizes)
// x H heads of D elements, token-major ([T, H, D], as a seq-sharded q of one rank).
//   rope  bf16 / fp32: one transformed BlockCopy (detail::make_block with a RowOrigin, Rope on
//         pack) run by run_block_host(): each row loaded into double, rotated, stored rounded once;
//         streaming (non-temporal stores, then detail::stream_fence()) from HostExecutorOptions'
//         streaming_min_bytes (4 MiB) on, as HostExecutor decides for a call that moves as much;
//   fp8   e4m3 from fp32: per row row_amax(), fp8_scale_of(), quantize_fp8() into bytes + a scale.
// GB/s = the rows' input bytes / time (memcpy: the same bytes); ratio = memcpy(us) / ours(us)
// (1: as fast as memcpy). -c 1: the transformed copy against a row-by-row load_row, Rope,
// store_row (bitwise), and the fp8 codes against a second quantization.
#pragma once

#include <ulysses/layout/fp8.hpp>
#include <ulysses/layout/rope.hpp>
#include <ulysses/ulysses.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "host_buffer.hpp"

namespace perf_transform {

using namespace ulysses;
using Bytes = std::vector<std::byte, ub::HugePageAllocator<std::byte>>;

/// One line of the table.
struct Line {
  std::string what;          // "rope", "fp8 e4m3"
  ElementType type;          // the rows' element type (fp8: the float32 input)
  std::int64_t T = 0, rows = 0;
  double bytes = 0;          // the rows' input bytes (what memcpy copies)
  double us = 0, memcpy_us = 0;
  long long wrong = -1;      // -1: not checked
};

/// Microseconds of one call of f().
template <class F>
double time_us(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

/// A value in [-4, 4) from an index (exact in bf16: 8 bits of mantissa at most).
inline double value_at(std::size_t i) {
  std::uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  return static_cast<double>(static_cast<std::int64_t>((x >> 20) % 2048) - 1024) / 256.0;
}

/// The lines of T tokens x H heads x D: rope bf16, rope fp32, fp8 e4m3 from fp32. `alternate`
/// times calls alternately (the medians by call, as ulysses_perf's alternate_all()).
template <class Alternate>
std::vector<Line> lines_at(std::int64_t T, std::int64_t H, std::int64_t D, double theta, bool check, Alternate&& alternate) {
  std::vector<Line> out;
  const std::int64_t N = T * H;
  const Rope rope(D, T, theta, 0, RopeStyle::half);
  RowTransforms tx;
  tx.on_pack(0, rope);
  for (ElementType type : {ElementType::bfloat16, ElementType::float32}) {
    const std::size_t e = size_of(type), bytes = static_cast<std::size_t>(N * D) * e;
    Bytes src(bytes), dst(bytes, std::byte{1}), copy(bytes, std::byte{2});
    for (std::size_t i = 0; i < static_cast<std::size_t>(N * D); ++i) {
      const double v = value_at(i);
      detail::store_row(type, src.data() + i * e, &v, 1);
    }
    const std::int64_t ext[4] = {1, T, H, D}, stride[4] = {T * H * D, H * D, D, 1};
    detail::RowOrigin origin;  // (batch 0, token 0, head 0) of tensor 0 on a group of 1
    BlockCopy c;
    detail::make_block(ext, stride, stride, static_cast<std::int64_t>(e), 0, 0, BufferIndex::input(0), BufferIndex::output(0), c, &origin, type);
    BufferTable t;
    t.base[BufferIndex::input(0)] = src.data();
    t.base[BufferIndex::output(0)] = dst.data();
    t.transforms = &tx;
    Line l{"rope", type, T, N, static_cast<double>(bytes)};
    const bool streaming = bytes >= HostExecutorOptions{}.streaming_min_bytes;  // (HostExecutor's choice for a call of these bytes)
    auto transformed = [&] {
      run_block_host(c, t, streaming);
      if (streaming) detail::stream_fence();
    };
    if (check) {
      transformed();
      std::vector<std::byte> want(bytes);
      double row[detail::kMaxTransformedRow];
      l.wrong = 0;
      for (std::int64_t s = 0; s < T; ++s)
        for (std::int64_t h = 0; h < H; ++h) {
          const std::size_t off = static_cast<std::size_t>((s * H + h) * D) * e;
          detail::load_row(type, src.data() + off, row, D);
          rope(RowCoord{0, s, h}, row, D);
          detail::store_row(type, want.data() + off, row, D);
        }
      for (std::size_t i = 0; i < bytes; i += e) l.wrong += std::memcmp(want.data() + i, dst.data() + i, e) != 0;
    }
    const std::vector<double> m = alternate(std::vector<std::function<double()>>{
        [&] { return time_us([&] { std::memcpy(copy.data(), src.data(), bytes); }); },
        [&] { return time_us(transformed); }});
    l.memcpy_us = m[0], l.us = m[1];
    out.push_back(l);
    if (type != ElementType::float32) continue;
    // fp8 e4m3 from the same float32 rows: a scale per row, then the codes.
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(N * D)), codes2(codes.size());
    std::vector<float> scales(static_cast<std::size_t>(N));
    const float* x = reinterpret_cast<const float*>(src.data());
    auto quantize = [&](std::uint8_t* q) {
      for (std::int64_t i = 0; i < N; ++i) {
        const float* r = x + i * D;
        const float s = fp8_scale_of(row_amax(r, D), Fp8Format::e4m3);
        scales[static_cast<std::size_t>(i)] = s;
        quantize_fp8(r, D, s, Fp8Format::e4m3, q + i * D);
      }
    };
    Line f{"fp8 e4m3", type, T, N, static_cast<double>(bytes)};
    if (check) {
      quantize(codes.data());
      f.wrong = 0;
      for (std::int64_t i = 0; i < N; ++i) {  // against float_to_fp8 element by element
        const float* r = x + i * D;
        float amax = 0;
        for (std::int64_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(r[d]));
        const float s = fp8_scale_of(amax, Fp8Format::e4m3);
        for (std::int64_t d = 0; d < D; ++d) f.wrong += codes[static_cast<std::size_t>(i * D + d)] != float_to_fp8(r[d] / s, Fp8Format::e4m3);
      }
    }
    const std::vector<double> q = alternate(std::vector<std::function<double()>>{
        [&] { return time_us([&] { std::memcpy(copy.data(), src.data(), bytes); }); },
        [&] { return time_us([&] { quantize(codes2.data()); }); }});
    f.memcpy_us = q[0], f.us = q[1];
    out.push_back(f);
  }
  return out;
}

/// Prints the table. @returns 1 when a check failed, else 0.
inline int print(const std::vector<Line>& lines, std::int64_t H, std::int64_t D, double theta, int iters, int warmup, bool check) {
  std::printf("# ulysses_perf --op transform: one thread, rows of T tokens x H=%lld heads x D=%lld ([T, H, D]), %d iters after %d warm-up%s\n",
              static_cast<long long>(H), static_cast<long long>(D), iters, warmup, check ? ", checked bit for bit" : "");
  std::printf("# rope: one transformed BlockCopy through run_block_host() (Rope theta %g, half rotation, on pack: widen to float, rotate\n"
              "# with fma, round once; streaming stores from 4 MiB, as HostExecutor); fp8 e4m3: per row row_amax, fp8_scale_of, quantize_fp8 from the float32 rows (codes + a scale a row);\n"
              "# each alternating with std::memcpy of the same input bytes; time: the median over iterations; GB/s = input bytes / time;\n"
              "# ratio = memcpy(us) / time(us) (1 = memcpy's speed)\n",
              theta);
  std::printf("#%-9s %-9s %7s %9s %12s %10s %9s %11s %9s %7s %7s\n", "what", "dtype", "T", "rows", "bytes", "time(us)", "GB/s", "memcpy(us)",
              "GB/s", "ratio", "#wrong");
  long long bad = 0;
  for (const Line& l : lines) {
    char wrong[24];
    if (l.wrong < 0) std::snprintf(wrong, sizeof wrong, "N/A");
    else std::snprintf(wrong, sizeof wrong, "%lld", l.wrong);
    std::printf(" %-9s %-9s %7lld %9lld %12.0f %10.1f %9.2f %11.1f %9.2f %7.3f %7s\n", l.what.c_str(), to_string(l.type),
                static_cast<long long>(l.T), static_cast<long long>(l.rows), l.bytes, l.us, l.bytes / l.us * 1e-3, l.memcpy_us,
                l.bytes / l.memcpy_us * 1e-3, l.memcpy_us / l.us, wrong);
    bad += l.wrong > 0 ? l.wrong : 0;
  }
  if (check) std::printf("# wrong elements: %lld %s\n", bad, bad ? "FAILED" : "OK");
  return bad ? 1 : 0;
}

}  // namespace perf_transform
