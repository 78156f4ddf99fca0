// SPDX-License-Identifier: Apache-2.0
// layout/rope.hpp: the rotation's float32 bits (fma(x, c, -(y s)), fma(y, c, x s)) and its error
// against an exact rotation, both pairings, the inverse (the adjoint: <R x, y> = <x, R^T y>),
// given tables, and the position modes
// of C22 (global token, position ids read at the global token, per document), through the fused
// seq→head on P=2 as well as row by row; the checks every call makes before a byte moves.
#include <doctest/doctest.h>
#include <ulysses/layout/rope.hpp>
#include <ulysses/ulysses.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "expect_error.hpp"

using namespace ulysses;

namespace {

/// The rotation's defining float32 arithmetic (rope.hpp's class comment), written from it: c and
/// s the double cos and sin rounded to float, x' = fma(x, c, -(y s)), y' = fma(y, c, x s).
void float_rotation(float x, float y, float c, float s, float& ox, float& oy) {
  ox = std::fma(x, c, -(y * s));
  oy = std::fma(y, c, x * s);
}

std::vector<double> random_row(std::int64_t D, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<double> r;
  for (std::int64_t i = 0; i < D; ++i) r.push_back(static_cast<double>(u(rng)));
  return r;
}

}  // namespace

namespace {
/// The error bound of rope.hpp's class comment for x' (y': swap x and y): 2^-22 (|x c| + |y s|)
/// + (|x| + |y|) (a (ln theta + 3) + 2) 2^-53, a = p f_i the angle, c and s exact.
long double rope_bound(long double x, long double y, long double c, long double s, long double a, double theta) {
  return std::ldexp(std::fabs(x * c) + std::fabs(y * s), -22) +
         std::ldexp((std::fabs(x) + std::fabs(y)) * (a * (std::log(static_cast<long double>(theta)) + 3) + 2), -53);
}
}  // namespace

TEST_CASE("Rope's float32 arithmetic: its exact bits, and within the documented bound of an exact rotation; both pairings, partial rotary dims, positions up to 128k") {
  long double worst = 0;  // the largest error over its bound
  for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved})
    for (std::int64_t rd : {16, 8}) {
      const std::int64_t D = 16, maxp = 131072;
      const double theta = 500000.0;
      const Rope rope(D, maxp, theta, rd, style);
      for (std::int64_t p : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{4095}, std::int64_t{131071}}) {
        std::vector<double> row = random_row(D, static_cast<unsigned>(p + rd));
        const std::vector<double> x = row;
        rope(RowCoord{0, p, 0}, row.data(), D);
        for (std::int64_t i = 0; i < rd / 2; ++i) {
          const std::size_t a = static_cast<std::size_t>(style == RopeStyle::half ? i : 2 * i);
          const std::size_t b = static_cast<std::size_t>(style == RopeStyle::half ? i + rd / 2 : 2 * i + 1);
          const double ang = static_cast<double>(p) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rd));
          float ex, ey;
          float_rotation(static_cast<float>(x[a]), static_cast<float>(x[b]), static_cast<float>(std::cos(ang)),
                         static_cast<float>(std::sin(ang)), ex, ey);
          CHECK(row[a] == static_cast<double>(ex));  // the bits the class comment defines
          CHECK(row[b] == static_cast<double>(ey));
          const long double la = static_cast<long double>(p) * std::pow(static_cast<long double>(theta), -2.0L * i / rd);
          const long double c = std::cos(la), s = std::sin(la), u = x[a], v = x[b];
          worst = std::max(worst, std::fabs(row[a] - (u * c - v * s)) / rope_bound(u, v, c, s, la, theta));
          worst = std::max(worst, std::fabs(row[b] - (v * c + u * s)) / rope_bound(v, u, c, s, la, theta));
        }
        for (std::int64_t i = rd; i < D; ++i) CHECK(row[static_cast<std::size_t>(i)] == x[static_cast<std::size_t>(i)]);  // not rotated
      }
    }
  CHECK(worst <= 1);
  CHECK(worst > 0);  // (float32 arithmetic: not exact)
}

TEST_CASE("Rope's error bound at every position up to 128k, where cos or sin nears 0 (the double angle's rounding counts there)") {
  // Unit rows (x, y) = (1, 0) and (0, 1): the error is then the table's alone, and where c or s is
  // near 0 the angle's rounding in double dominates (a breaker's case: p = 104348, theta 10000).
  // Here the error reaches 4.4x the bound without the angle's term, and 0.25x the bound with it.
  for (double theta : {10000.0}) {
    const std::int64_t D = 16, half = D / 2, maxp = 131072;
    const Rope rope(D, maxp, theta);
    long double f[8];
    for (std::int64_t i = 0; i < half; ++i) f[i] = std::pow(static_cast<long double>(theta), -2.0L * i / D);
    long double worst = 0;
    std::vector<double> row(static_cast<std::size_t>(D));
    for (int unit = 0; unit < 2; ++unit)
      for (std::int64_t p = 0; p < maxp; ++p) {
        for (std::int64_t k = 0; k < D; ++k) row[static_cast<std::size_t>(k)] = (k < half) == (unit == 0) ? 1.0 : 0.0;
        rope(RowCoord{0, p, 0}, row.data(), D);
        for (std::int64_t i = 0; i < half; ++i) {
          const long double a = static_cast<long double>(p) * f[i], c = std::cos(a), s = std::sin(a);
          const long double u = unit == 0 ? 1 : 0, v = 1 - u;
          worst = std::max(worst, std::fabs(row[static_cast<std::size_t>(i)] - (u * c - v * s)) / rope_bound(u, v, c, s, a, theta));
          worst = std::max(worst, std::fabs(row[static_cast<std::size_t>(i + half)] - (v * c + u * s)) / rope_bound(v, u, c, s, a, theta));
        }
      }
    CAPTURE(theta);
    CHECK(worst <= 1);
  }
}

TEST_CASE("Rope's inverse is its adjoint: <R x, y> == <x, R^T y> (C22's backward check) and R^T R x == x, to float32's error") {
  const std::int64_t D = 8;
  for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved}) {
    const Rope r(D, 64, 10000.0, 0, style);
    const Rope rt = r.inverse();
    for (std::int64_t p : {3, 17, 63}) {
      std::vector<double> x = random_row(D, 5), y = random_row(D, 6), rx = x, rty = y;
      r(RowCoord{0, p, 1}, rx.data(), D);
      rt(RowCoord{0, p, 1}, rty.data(), D);
      long double a = 0, b = 0, ax = 0, ay = 0, mx = 0;
      for (std::size_t i = 0; i < static_cast<std::size_t>(D); ++i) {
        a += static_cast<long double>(rx[i]) * y[i];
        b += static_cast<long double>(x[i]) * rty[i];
        ax += std::fabs(x[i]);
        ay += std::fabs(y[i]);
        mx = std::max(mx, static_cast<long double>(std::fabs(x[i])));
      }
      CHECK(std::fabs(a - b) <= std::ldexp(ax * ay, -20));  // each rotated element within 2^-22 (|x| + |y|)
      CHECK(std::fabs(a - b) > 0);
      std::vector<double> back = rx;
      rt(RowCoord{0, p, 1}, back.data(), D);
      for (std::size_t i = 0; i < static_cast<std::size_t>(D); ++i) CHECK(std::fabs(back[i] - x[i]) <= std::ldexp(mx, -20));
    }
  }
}

TEST_CASE("Rope::copy_row (the fused load, rotate, store): the bits of load_row, the rotation and store_row for every bit pattern") {
  // Random bit patterns: NaNs with payloads, infinities, subnormals, zeros of both signs, the
  // largest finite values and ordinary numbers, in bf16, fp16 and fp32; both pairings, a partial
  // rotary dim, the inverse, in place and not.
  std::mt19937 rng(7);
  for (ElementType type : {ElementType::bfloat16, ElementType::float16, ElementType::float32})
    for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved})
      for (std::int64_t D : {16, 128})
        for (std::int64_t rd : {std::int64_t{0}, D / 2})
          for (bool inv : {false, true}) {
            const Rope fwd(D, 1 << 16, 10000.0, rd, style), rope = inv ? fwd.inverse() : fwd;
            const std::size_t e = size_of(type), bytes = static_cast<std::size_t>(D) * e;
            long long wrong = 0;
            for (int trial = 0; trial < 200; ++trial) {
              std::vector<std::byte> src(bytes), fused(bytes), want(bytes);
              for (std::byte& b : src) b = static_cast<std::byte>(rng() & 0xffu);
              if (trial % 2)  // ordinary numbers too: exponents near 1, random signs and mantissas
                for (std::size_t i = 0; i < bytes; i += e) src[i + e - 1] = static_cast<std::byte>((rng() & 0x80u) | 0x3fu);
              const RowCoord at{0, static_cast<std::int64_t>(rng() % (1u << 16)), 0};
              std::vector<double> row(static_cast<std::size_t>(D));
              detail::load_row(type, src.data(), row.data(), D);
              rope(at, row.data(), D);
              detail::store_row(type, want.data(), row.data(), D);
              CHECK(rope.copy_row(at, type, src.data(), fused.data(), D));
              wrong += std::memcmp(fused.data(), want.data(), bytes) != 0;
              CHECK(rope.copy_row(at, type, src.data(), src.data(), D));  // in place
              wrong += std::memcmp(src.data(), want.data(), bytes) != 0;
            }
            CAPTURE(static_cast<int>(type));
            CAPTURE(static_cast<int>(style));
            CAPTURE(D);
            CAPTURE(rd);
            CAPTURE(inv);
            CHECK(wrong == 0);
          }
  // A row of another length than head_dim (outside the precondition): false, and nothing written.
  {
    const Rope r8(8, 4);
    std::vector<float> x(16, 1.5f), y(16, -2.0f);
    CHECK_FALSE(r8.copy_row(RowCoord{0, 1, 0}, ElementType::float32, reinterpret_cast<const std::byte*>(x.data()),
                            reinterpret_cast<std::byte*>(y.data()), 16));
    CHECK(y == std::vector<float>(16, -2.0f));
  }
  // float64 has no fused form: false, and nothing written.
  const Rope r(8, 4);
  std::vector<double> x(8, 1.5), y(8, -2.0);
  CHECK_FALSE(r.copy_row(RowCoord{0, 1, 0}, ElementType::float64, reinterpret_cast<const std::byte*>(x.data()),
                         reinterpret_cast<std::byte*>(y.data()), 8));
  CHECK(y == std::vector<double>(8, -2.0));
}

TEST_CASE("Rope::copy_run (the run form): the bits of copy_row on every row of a run along the heads or the tokens, strided, in place") {
  // Runs of 1..9 rows with gaps between rows (strides above the row), along the heads of one token
  // (one position's table for the run) and along the tokens (each row its own), plain positions
  // and position ids; random bit patterns (NaNs, subnormals: the bf16 kernel's lane-by-lane
  // narrowing) and ordinary numbers; every type and pairing, full and partial rotary dims.
  std::mt19937 rng(11);
  std::vector<std::int64_t> ids(64);
  for (std::int64_t& v : ids) v = static_cast<std::int64_t>(rng() % 4096u);
  RowTransforms tx;
  for (ElementType type : {ElementType::bfloat16, ElementType::float16, ElementType::float32})
    for (RopeStyle style : {RopeStyle::half, RopeStyle::interleaved})
      for (std::int64_t rd : {std::int64_t{0}, std::int64_t{96}, std::int64_t{64}, std::int64_t{32}})
        for (bool with_ids : {false, true}) {
          Rope rope(128, 4096, 10000.0, rd, style);
          if (with_ids) rope.with_position_ids(ids.data(), static_cast<std::int64_t>(ids.size()));
          tx.on_pack(0, rope);
          CHECK(static_cast<bool>(tx.pack(0).copy_run));  // RowTransforms carries the run form
          const std::size_t e = size_of(type), row = 128 * e, stride = row + 3 * e;
          long long wrong = 0;
          for (int trial = 0; trial < 40; ++trial) {
            const std::int64_t count = 1 + trial % 9;
            const bool along_heads = trial % 2 == 0, ordinary = trial % 4 < 2, in_place = trial % 3 == 0;
            std::vector<std::byte> src(stride * static_cast<std::size_t>(count)), run_out(src.size(), std::byte{0x5a}), want(src.size(), std::byte{0x5a});
            for (std::byte& b : src) b = static_cast<std::byte>(rng() & 0xffu);
            if (ordinary)
              for (std::size_t i = 0; i < src.size(); i += e) src[i + e - 1] = static_cast<std::byte>((rng() & 0x80u) | 0x3fu);
            const RowCoord first{0, static_cast<std::int64_t>(rng() % 40u), static_cast<std::int64_t>(rng() % 8u)};
            const RowCoord step = along_heads ? RowCoord{0, 0, 1} : RowCoord{0, 1, 0};
            std::vector<std::byte> copy = src;
            for (std::int64_t i = 0; i < count; ++i) {
              const std::size_t off = stride * static_cast<std::size_t>(i);
              CHECK(rope.copy_row(RowRun{first, step}.at(i), type, src.data() + off, want.data() + off, 128));
            }
            std::byte* dst = in_place ? copy.data() : run_out.data();
            const auto s = static_cast<std::int64_t>(stride);
            RowRun run{first, step, copy.data(), s, dst, s, 128, count};
            if (trial % 5 == 1) run.next_src = src.data();  // a prefetch hint (RowRun::next_src): the same bits
            CHECK(tx.pack(0).copy_run(tx.pack(0).object, run, type));
            for (std::int64_t i = 0; i < count; ++i) {  // each row's bytes; the gaps untouched
              const std::size_t off = stride * static_cast<std::size_t>(i);
              wrong += std::memcmp(dst + off, want.data() + off, row) != 0;
              if (!in_place) wrong += std::memcmp(dst + off + row, want.data() + off + row, stride - row) != 0;
            }
          }
          CAPTURE(static_cast<int>(type));
          CAPTURE(static_cast<int>(style));
          CAPTURE(rd);
          CAPTURE(with_ids);
          CHECK(wrong == 0);
        }
  // Streaming stores (RowRun::stream: non-temporal as wide as the row's alignment allows, 64, 32 or
  // 16 bytes, then fenced): the same bits as copy_row, rows at each alignment and misaligned.
  for (ElementType type : {ElementType::bfloat16, ElementType::float32})
    for (std::int64_t rd : {std::int64_t{0}, std::int64_t{96}}) {
      const Rope rope(128, 4096, 10000.0, rd, RopeStyle::half);
      const std::size_t e = size_of(type), row = 128 * e;
      std::vector<std::byte> src(row * 8), buf(row * 8 + 128), want(row * 8);
      for (std::byte& b : src) b = static_cast<std::byte>(rng() & 0xffu);
      for (std::size_t i = 0; i < src.size(); i += 2 * e) src[i + e - 1] = static_cast<std::byte>((rng() & 0x80u) | 0x3fu);
      const RowRun along{RowCoord{0, 5, 0}, RowCoord{0, 0, 1}};
      for (std::int64_t i = 0; i < 8; ++i) CHECK(rope.copy_row(along.at(i), type, src.data() + row * static_cast<std::size_t>(i), want.data() + row * static_cast<std::size_t>(i), 128));
      const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(buf.data());
      for (std::size_t skew : {std::size_t{0}, std::size_t{16}, std::size_t{32}, std::size_t{48}, 4 * e}) {  // 64-, 16-, 32-, 16-byte aligned, not at all
        std::byte* dst = buf.data() + (64 - a % 64) % 64 + skew;
        RowRun run{along.first, along.step, src.data(), static_cast<std::int64_t>(row), dst, static_cast<std::int64_t>(row), 128, 8};
        run.stream = true;
        run.next_src = skew % 32 == 16 ? src.data() : nullptr;  // (with and without the prefetch hint)
        CHECK(rope.copy_run(run, type));
        detail::stream_fence();
        CAPTURE(static_cast<int>(type));
        CAPTURE(rd);
        CAPTURE(skew);
        CHECK(std::memcmp(dst, want.data(), want.size()) == 0);
      }
    }
  // Rows of another length, or float64: false, nothing written.
  const Rope r(8, 4);
  std::vector<float> x(32, 1.5f), y(32, -2.0f);
  CHECK_FALSE(r.copy_run(RowRun{RowCoord{}, RowCoord{0, 0, 1}, reinterpret_cast<const std::byte*>(x.data()), 64,
                                reinterpret_cast<std::byte*>(y.data()), 64, 16, 2},
                         ElementType::float32));
  CHECK_FALSE(r.copy_run(RowRun{RowCoord{}, RowCoord{0, 0, 1}, reinterpret_cast<const std::byte*>(x.data()), 64,
                                reinterpret_cast<std::byte*>(y.data()), 64, 8, 2},
                         ElementType::float64));
  CHECK(y == std::vector<float>(32, -2.0f));
}

TEST_CASE("Rope from float tables: the tables' values, the same bits as theta's tables rounded to float") {
  const std::int64_t D = 8, maxp = 16, half = D / 2;
  std::vector<float> c(static_cast<std::size_t>(maxp * half)), s(c.size());
  for (std::int64_t p = 0; p < maxp; ++p)
    for (std::int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(p) * std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(D));
      c[static_cast<std::size_t>(p * half + i)] = static_cast<float>(std::cos(a));
      s[static_cast<std::size_t>(p * half + i)] = static_cast<float>(std::sin(a));
    }
  const Rope t = Rope::from_tables(D, D, maxp, c.data(), s.data());
  std::vector<double> row = random_row(D, 9), want = row;
  t(RowCoord{0, 5, 0}, row.data(), D);
  for (std::int64_t i = 0; i < half; ++i) {  // the tables' c and s in the float32 rotation
    float ex, ey;
    float_rotation(static_cast<float>(want[static_cast<std::size_t>(i)]), static_cast<float>(want[static_cast<std::size_t>(i + half)]),
                   c[static_cast<std::size_t>(5 * half + i)], s[static_cast<std::size_t>(5 * half + i)], ex, ey);
    CHECK(row[static_cast<std::size_t>(i)] == static_cast<double>(ex));
    CHECK(row[static_cast<std::size_t>(i + half)] == static_cast<double>(ey));
  }
  // and theta's tables are those values: the same rotation bits
  const Rope th(D, maxp);
  std::vector<double> row2 = want;
  th(RowCoord{0, 5, 0}, row2.data(), D);
  CHECK(row2 == row);
}

TEST_CASE("C22: positions of packed documents: global, position ids read at the global token, per document; identical documents give identical rows") {
  const std::int64_t D = 8;
  const Rope global(D, 16);
  Rope docs(D, 16);
  docs.with_documents({0, 4, 8});
  Rope ids(D, 16);
  const std::vector<std::int64_t> pos = {0, 1, 2, 3, 0, 1, 2, 3};
  ids.with_position_ids(pos.data(), static_cast<std::int64_t>(pos.size()));
  // The rows zigzag rank 0 of [0,4,8] over a ring of 2 holds: global tokens 0, 3, 4, 7.
  const std::int64_t rank0[] = {0, 3, 4, 7};
  const std::int64_t want_global[] = {0, 3, 4, 7}, want_doc[] = {0, 3, 0, 3};
  for (int k = 0; k < 4; ++k) {
    CHECK(global.position(RowCoord{0, rank0[k], 0}) == want_global[k]);
    CHECK(docs.position(RowCoord{0, rank0[k], 0}) == want_doc[k]);
    CHECK(ids.position(RowCoord{0, rank0[k], 0}) == want_doc[k]);
  }
  Rope docs2(D, 16);
  docs2.with_documents({0, 5, 12});
  CHECK(docs2.position(RowCoord{0, 4, 0}) == 4);
  CHECK(docs2.position(RowCoord{0, 5, 0}) == 0);
  CHECK(docs2.position(RowCoord{0, 11, 0}) == 6);
  // Two identical documents: the same rows, rotated, give the same bits.
  std::vector<double> a = random_row(D, 3), b = a;
  docs(RowCoord{0, 2, 1}, a.data(), D);
  docs(RowCoord{0, 6, 1}, b.data(), D);
  CHECK(a == b);
  // Zero-length documents (C20's padded forms) change no position.
  Rope padded(D, 64);
  padded.with_documents({0, 16, 40, 40, 40});
  Rope leading(D, 64);
  leading.with_documents({0, 0, 16, 40});
  for (std::int64_t s : {0, 15, 16, 39}) CHECK(padded.position(RowCoord{0, s, 0}) == leading.position(RowCoord{0, s, 0}));
}

TEST_CASE("C22 through seq->head (P=2, fp32): rank r's head-sharded rows are rotated at the positions of their global tokens") {
  const int P = 2;
  const std::int64_t S = 8, D = 8, H = 2;
  Rope per_doc(D, S);
  per_doc.with_documents({0, 4, 8});
  LocalGroup g(P);
  std::vector<std::vector<float>> out(P);
  std::vector<float> x(static_cast<std::size_t>(S * H * D));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
  g.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    const SeqPartition seq = SeqPartition::zigzag(S, P);  // rank 0: tokens {0,1} and {6,7}
    Plan plan({P, r}, 1, seq, {TensorSpec::of<float>(HeadPartition::even(H, P), D).with_row_transforms()});
    std::vector<float> in;
    for (const SeqChunk& c : seq.chunks_of(r))
      in.insert(in.end(), x.begin() + c.offset * H * D, x.begin() + (c.offset + c.length) * H * D);
    out[static_cast<std::size_t>(r)].resize(static_cast<std::size_t>(S * D));
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    RowTransforms tx;
    tx.on_pack(0, per_doc);
    seq_to_head(plan, comm, ex, {ConstByteSpan(in)}, {ByteSpan(out[static_cast<std::size_t>(r)])}, ws, tx);
  });
  for (int r = 0; r < P; ++r)
    for (std::int64_t s = 0; s < S; ++s) {
      std::vector<double> row(x.begin() + (s * H + r) * D, x.begin() + (s * H + r + 1) * D);
      per_doc(RowCoord{0, s, r}, row.data(), D);
      for (std::int64_t d = 0; d < D; ++d) CHECK(out[static_cast<std::size_t>(r)][static_cast<std::size_t>(s * D + d)] == static_cast<float>(row[static_cast<std::size_t>(d)]));
    }
}

TEST_CASE("Rope's checks: odd or too large rotary dims, theta <= 0, ids out of range, a decreasing cu_seqlens; a call whose S or D the Rope does not cover") {
  CHECK(ut::code_of([] { Rope(8, 16, 10000.0, 3); }) == Errc::invalid_shape);
  CHECK(ut::code_of([] { Rope(8, 16, 10000.0, 10); }) == Errc::invalid_shape);
  CHECK(ut::code_of([] { Rope(8, 16, 0.0); }) == Errc::invalid_shape);
  CHECK(ut::code_of([] { Rope(8, 0); }) == Errc::invalid_shape);
  CHECK(ut::code_of([] { Rope(1026, 4); }) == Errc::invalid_shape);  // longer than any transformed row (1024)
  CHECK(ut::code_of([] { Rope(4096, 4, 10000.0, 64); }) == Errc::invalid_shape);
  CHECK(ut::code_of([] { Rope(1024, 4, 10000.0, 0, RopeStyle::interleaved); }) == Errc{});
  CHECK(ut::code_of([] {
          Rope r(8, 4);
          const std::int64_t ids[] = {0, 4};
          r.with_position_ids(ids, 2);
        }) == Errc::invalid_shape);
  CHECK(ut::code_of([] { Rope(8, 64).with_documents({0, 16, 10, 40}); }) == Errc::invalid_shape);
  CHECK(ut::code_of([] { Rope(8, 4).with_documents({0, 8}); }) == Errc::invalid_shape);
  CHECK(ut::code_of([] { Rope(8, 64).check_rows(1, 65, 8); }) == Errc::invalid_shape);
  CHECK(ut::code_of([] { Rope(8, 64).check_rows(1, 64, 16); }) == Errc::invalid_shape);
  CHECK(ut::code_of([] { Rope(8, 64).check_rows(1, 64, 8); }) == Errc{});
}

TEST_CASE("break32: a negative batch_stride is refused; a max_position whose tables overflow is size_overflow, not a crash") {
  const std::int64_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  CHECK(ut::code_of([&] { Rope(4, 16).with_position_ids(ids, 8, -8); }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { Rope(4, 16).with_position_ids(nullptr, 8); }) == Errc::invalid_shape);
  CHECK(ut::code_of([] { Rope(128, std::int64_t{1} << 61); }) == Errc::size_overflow);
}

TEST_CASE("Rope::agreement_word: the same for the same rotation (whatever max_position), another for another theta, style, rotary_dim, head_dim, position ids, documents, tables or direction") {
  const Rope base(64, 128, 10000.0, 32, RopeStyle::half);
  CHECK(Rope(64, 4096, 10000.0, 32, RopeStyle::half).agreement_word() == base.agreement_word());  // a longer table: the same rotation
  CHECK(Rope(64, 128, 10000.0, 32, RopeStyle::half).agreement_word() == base.agreement_word());
  const std::vector<Rope> others = {Rope(64, 128, 500000.0, 32, RopeStyle::half), Rope(64, 128, 10000.0, 32, RopeStyle::interleaved),
                                    Rope(64, 128, 10000.0, 64, RopeStyle::half), Rope(32, 128, 10000.0, 32, RopeStyle::half), base.inverse()};
  std::vector<std::uint64_t> words = {base.agreement_word()};
  for (const Rope& r : others) words.push_back(r.agreement_word());
  const std::vector<std::int64_t> ids = {3, 2, 1, 0}, ids2 = {3, 2, 1, 1};
  words.push_back(Rope(base).with_position_ids(ids.data(), 4).agreement_word());
  words.push_back(Rope(base).with_position_ids(ids2.data(), 4).agreement_word());
  words.push_back(Rope(base).with_position_ids(ids.data(), 4, 2).agreement_word());  // another batch stride
  words.push_back(Rope(base).with_documents({0, 2, 4}).agreement_word());
  words.push_back(Rope(base).with_documents({0, 1, 4}).agreement_word());
  std::vector<float> c(128 * 16, 0.5f), s(128 * 16, 0.25f);
  words.push_back(Rope::from_tables(64, 32, 128, c.data(), s.data()).agreement_word());
  for (std::size_t i = 0; i < words.size(); ++i)
    for (std::size_t j = i + 1; j < words.size(); ++j) {
      CAPTURE(i);
      CAPTURE(j);
      CHECK(words[i] != words[j]);
    }
  CHECK(base.inverse().inverse().agreement_word() == base.agreement_word());
  CHECK(Rope(base).with_position_ids(ids.data(), 4).agreement_word() == Rope(64, 999, 10000.0, 32).with_position_ids(ids.data(), 4).agreement_word());
  // what the calls compare: RowTransforms::agreement() folds it in after sides()
  RowTransforms a, b, none;
  const Rope theta2(64, 128, 20000.0, 32);
  a.on_pack(0, base);
  b.on_pack(0, theta2);
  CHECK(a.sides() == b.sides());
  CHECK(a.agreement() != b.agreement());
  CHECK(none.agreement() == 0);
  const Scale half{0.5};
  RowTransforms sa, sb;  // a transform without agreement_word(): its sides only
  sa.on_pack(1, half);
  const Scale third{1.0 / 3.0};
  sb.on_pack(1, third);
  CHECK(sa.agreement() == sa.sides());
  CHECK(sa.agreement() == sb.agreement());
}
