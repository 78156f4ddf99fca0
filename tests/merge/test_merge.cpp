// SPDX-License-Identifier: Apache-2.0
// merge/lse.hpp: the LSE merge of partial attention outputs. Exact values where the arithmetic
// makes them exact (ties, empty contributions, a first contribution taken as is, weights that
// vanish), the streaming form == the n-way form bit for bit (every element type in and out, rows
// across the chunking), accuracy against the formula in double, base 2, and the own exp2/log1p.
#include <doctest/doctest.h>
#include <ulysses/merge/lse.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

using namespace ulysses;

namespace {

const float kNegInf = -std::numeric_limits<float>::infinity();

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// Contributions of one row: n rows of dv elements (stored as `type`) and their LSEs.
struct Rows {
  ElementType type;
  std::int64_t dv;
  std::vector<std::vector<std::byte>> data;
  std::vector<float> lse;
  std::vector<const void*> ptrs() const {
    std::vector<const void*> v;
    for (const auto& d : data) v.push_back(d.data());
    return v;
  }
  /// Element k of row i, widened.
  float at(std::size_t i, std::int64_t k) const {
    float v = 0;
    detail::with_merge_arith(type, [&](auto a) { v = decltype(a)::load(data[i].data() + k * static_cast<std::int64_t>(size_of(type))); });
    return v;
  }
};

Rows random_rows(std::mt19937& g, ElementType type, int n, std::int64_t dv, double empty_prob) {
  std::uniform_real_distribution<float> val(-4.f, 4.f), l(-20.f, 20.f), u(0.f, 1.f);
  Rows r{type, dv, {}, {}};
  for (int i = 0; i < n; ++i) {
    std::vector<std::byte> row(static_cast<std::size_t>(dv) * size_of(type));
    const bool empty = u(g) < empty_prob;
    detail::with_merge_arith(type, [&](auto a) {
      for (std::int64_t k = 0; k < dv; ++k)
        decltype(a)::store(row.data() + k * static_cast<std::int64_t>(size_of(type)), empty ? std::nanf("") : val(g));
    });
    r.data.push_back(row);
    r.lse.push_back(empty ? kNegInf : l(g));
  }
  return r;
}

/// merge_rows() into `out_type`: the merged row's bytes and LSE.
std::pair<std::vector<std::byte>, float> nway(const Rows& r, ElementType out_type, LseBase base = LseBase::natural) {
  std::vector<std::byte> out(static_cast<std::size_t>(r.dv) * size_of(out_type), std::byte{0x5a});
  const auto p = r.ptrs();
  const float l = merge_rows(p.data(), r.type, r.lse.data(), static_cast<int>(r.lse.size()), r.dv, out.data(), out_type, base);
  return {out, l};
}

/// The streaming form: merge() of i = 0..n-1 into an fp32 state from (0, -inf), then one rounding.
std::pair<std::vector<std::byte>, float> streamed(const Rows& r, ElementType out_type, LseBase base = LseBase::natural) {
  std::vector<float> state(static_cast<std::size_t>(r.dv), 0.0f);
  float lse = kNegInf;
  for (std::size_t i = 0; i < r.lse.size(); ++i) merge(state.data(), lse, r.data[i].data(), r.type, r.lse[i], r.dv, base);
  std::vector<std::byte> out(static_cast<std::size_t>(r.dv) * size_of(out_type));
  detail::with_merge_arith(out_type, [&](auto a) {
    for (std::int64_t k = 0; k < r.dv; ++k) decltype(a)::store(out.data() + k * static_cast<std::int64_t>(size_of(out_type)), state[static_cast<std::size_t>(k)]);
  });
  return {out, lse};
}

float out_at(const std::vector<std::byte>& out, ElementType t, std::int64_t k) {
  float v = 0;
  detail::with_merge_arith(t, [&](auto a) { v = decltype(a)::load(out.data() + k * static_cast<std::int64_t>(size_of(t))); });
  return v;
}

Rows fp32_rows(std::vector<std::vector<float>> rows, std::vector<float> lse) {
  Rows r{ElementType::float32, static_cast<std::int64_t>(rows[0].size()), {}, lse};
  for (auto& v : rows) {
    std::vector<std::byte> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    r.data.push_back(b);
  }
  return r;
}

double ulps(float got, double ref) {
  const float r = static_cast<float>(ref);
  const double u = std::nextafter(std::fabs(r), INFINITY) - std::fabs(r);
  return std::fabs(static_cast<double>(got) - ref) / u;
}

}  // namespace

TEST_CASE("two contributions with equal LSE: weights 1/2 exactly, lse + ln 2") {
  const Rows r = fp32_rows({{1.0f, -2.0f, 3.5f}, {3.0f, 2.0f, 0.5f}}, {0.25f, 0.25f});
  const auto [out, l] = nway(r, ElementType::float32);
  CHECK(out_at(out, ElementType::float32, 0) == 2.0f);
  CHECK(out_at(out, ElementType::float32, 1) == 0.0f);
  CHECK(out_at(out, ElementType::float32, 2) == 2.0f);
  CHECK(l == doctest::Approx(0.25 + std::log(2.0)).epsilon(1e-7));
  // Base 2: the tie adds exactly log2(2) = 1 (to within the polynomial's last bit).
  const auto [out2, l2] = nway(r, ElementType::float32, LseBase::two);
  CHECK(out2 == out);
  CHECK(l2 == doctest::Approx(1.25).epsilon(1e-7));
}

TEST_CASE("a contribution with LSE -inf adds nothing and makes no NaN, even when its output is NaN") {
  const float nan = std::nanf("");
  const Rows r = fp32_rows({{nan, nan}, {1.5f, -7.25f}, {nan, std::numeric_limits<float>::infinity()}}, {kNegInf, 3.0f, kNegInf});
  for (ElementType t : {ElementType::float32, ElementType::bfloat16, ElementType::float16}) {
    const auto [out, l] = nway(r, t);
    CHECK(out_at(out, t, 0) == 1.5f);  // the one non-empty contribution, taken exactly
    CHECK(out_at(out, t, 1) == -7.25f);
    CHECK(bits(l) == bits(3.0f));
    const auto [s, sl] = streamed(r, t);
    CHECK(s == out);
    CHECK(bits(sl) == bits(l));
  }
}

TEST_CASE("every contribution -inf: output 0 (all bits clear) and LSE -inf, in every output type") {
  const float nan = std::nanf("");
  const Rows r = fp32_rows({{nan, 1.0f, 2.0f}, {nan, nan, nan}, {4.0f, 5.0f, 6.0f}}, {kNegInf, kNegInf, kNegInf});
  for (ElementType t : {ElementType::float32, ElementType::bfloat16, ElementType::float16}) {
    const auto [out, l] = nway(r, t);
    CHECK(out == std::vector<std::byte>(out.size(), std::byte{0}));
    CHECK(bits(l) == bits(kNegInf));
  }
  // No contributions at all: the same.
  std::vector<float> o(4, 9.0f);
  const float l = merge_rows(nullptr, ElementType::float32, nullptr, 0, 4, o.data(), ElementType::float32);
  CHECK(o == std::vector<float>(4, 0.0f));
  CHECK(bits(l) == bits(kNegInf));
  // The streaming form: an empty block leaves the state (0, -inf) as it is.
  std::vector<float> st(3, 0.0f);
  float sl = kNegInf;
  merge(st.data(), sl, r.data[1].data(), ElementType::float32, kNegInf, 3);
  CHECK(st == std::vector<float>(3, 0.0f));
  CHECK(bits(sl) == bits(kNegInf));
}

TEST_CASE("a weight below 2^-126 vanishes: the larger contribution comes out exactly") {
  const Rows r = fp32_rows({{0.1f, 0.2f}, {1e6f, -1e6f}}, {1000.0f, 800.0f});
  const auto [out, l] = nway(r, ElementType::float32);
  CHECK(out_at(out, ElementType::float32, 0) == 0.1f);
  CHECK(out_at(out, ElementType::float32, 1) == 0.2f);
  CHECK(l == 1000.0f);
  const Rows swapped = fp32_rows({{1e6f, -1e6f}, {0.1f, 0.2f}}, {800.0f, 1000.0f});
  const auto [out2, l2] = nway(swapped, ElementType::float32);
  CHECK(out2 == out);
  CHECK(l2 == 1000.0f);
}

TEST_CASE("lse_step: keep, take and blend, weights summing to one") {
  const LseStep keep = lse_step(1.0f, kNegInf);
  CHECK(keep.kind == LseStepKind::keep);
  CHECK(keep.lse == 1.0f);
  const LseStep take = lse_step(kNegInf, -3.0f);
  CHECK(take.kind == LseStepKind::take);
  CHECK(take.lse == -3.0f);
  CHECK(lse_apply(take, 123.0f, 0.375f) == 0.375f);
  const LseStep b = lse_step(0.0f, 1.0f);
  CHECK(b.kind == LseStepKind::blend);
  // w_block = 1/(1+e^-1), w_state = e^-1/(1+e^-1); lse = 1 + log1p(e^-1).
  CHECK(b.w_block == doctest::Approx(1.0 / (1.0 + std::exp(-1.0))).epsilon(2e-7));
  CHECK(b.w_state == doctest::Approx(std::exp(-1.0) / (1.0 + std::exp(-1.0))).epsilon(2e-7));
  CHECK(b.lse == doctest::Approx(1.0 + std::log1p(std::exp(-1.0))).epsilon(2e-7));
  CHECK(std::fabs(static_cast<double>(b.w_state) + b.w_block - 1.0) < 1.2e-7);
}

TEST_CASE("C18 lse_step: an LSE of +inf or NaN is an empty partial, exactly as -inf (keep / take); an empty state's LSE becomes -inf") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  for (float empty : {kNegInf, inf, nan, -nan}) {
    CAPTURE(empty);
    const LseStep keep = lse_step(1.0f, empty);
    CHECK(keep.kind == LseStepKind::keep);
    CHECK(bits(keep.lse) == bits(1.0f));
    CHECK(lse_apply(keep, 123.0f, nan) == 123.0f);  // the contribution's output is not read
    const LseStep take = lse_step(empty, -3.0f);
    CHECK(take.kind == LseStepKind::take);
    CHECK(bits(take.lse) == bits(-3.0f));
    CHECK(lse_apply(take, nan, 0.375f) == 0.375f);
    for (float empty2 : {kNegInf, inf, nan}) {  // both empty: kept, and the LSE is -inf (never +inf or NaN)
      const LseStep both = lse_step(empty, empty2);
      CHECK(both.kind == LseStepKind::keep);
      CHECK(bits(both.lse) == bits(kNegInf));
    }
  }
  CHECK(detail::lse_empty(kNegInf));
  CHECK(detail::lse_empty(inf));
  CHECK(detail::lse_empty(nan));
  CHECK(!detail::lse_empty(std::numeric_limits<float>::max()));
  CHECK(!detail::lse_empty(-std::numeric_limits<float>::max()));
  CHECK(!detail::lse_empty(std::numeric_limits<float>::denorm_min()));
  CHECK(!detail::lse_empty(0.0f));
}

TEST_CASE("streaming merge() over i = 0..n-1 == the n-way merge_rows() bit for bit (types in x out, rows across chunks, base e and 2)") {
  std::mt19937 g(2024);
  const ElementType types[] = {ElementType::float32, ElementType::float16, ElementType::bfloat16};
  int cases = 0;
  for (ElementType in : types)
    for (ElementType out_t : types)
      for (LseBase base : {LseBase::natural, LseBase::two})
        for (int n : {1, 2, 3, 5, 8, 9})
          for (std::int64_t dv : {1, 7, 32, 33, 100}) {
            const Rows r = random_rows(g, in, n, dv, 0.25);
            const auto a = nway(r, out_t, base);
            const auto s = streamed(r, out_t, base);
            CAPTURE(to_string(in));
            CAPTURE(to_string(out_t));
            CAPTURE(n);
            CAPTURE(dv);
            REQUIRE(a.first == s.first);
            REQUIRE(bits(a.second) == bits(s.second));
            ++cases;
          }
  CHECK(cases == 3 * 3 * 2 * 6 * 5);
}

TEST_CASE("the merge against the formula in double: out within 1e-6 of max |out_i| (n <= 8), LSE within 2e-7 relative (fp32); 16-bit rounded once") {
  std::mt19937 g(7);
  double worst_out = 0, worst_lse = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 1 + trial % 8;
    const std::int64_t dv = 16;
    const Rows r = random_rows(g, ElementType::float32, n, dv, 0.2);
    const auto [out, l] = nway(r, ElementType::float32);
    double m = -INFINITY, s = 0;
    for (float x : r.lse) m = std::max(m, static_cast<double>(x));
    if (m == -INFINITY) {
      CHECK(bits(l) == bits(kNegInf));
      continue;
    }
    for (float x : r.lse) s += std::exp(static_cast<double>(x) - m);
    const double lse = m + std::log(s);
    worst_lse = std::max(worst_lse, std::fabs(l - lse) / std::max(1.0, std::fabs(lse)));
    for (std::int64_t k = 0; k < dv; ++k) {
      double ref = 0, scale = 0;
      for (std::size_t i = 0; i < r.lse.size(); ++i) {
        if (r.lse[i] == kNegInf) continue;
        ref += std::exp(static_cast<double>(r.lse[i]) - lse) * r.at(i, k);
        scale = std::max(scale, std::fabs(static_cast<double>(r.at(i, k))));
      }
      worst_out = std::max(worst_out, std::fabs(out_at(out, ElementType::float32, k) - ref) / scale);
    }
    // bf16 out: the fp32 result rounded once (within half a bf16 ulp of the fp32 result).
    const auto [ob, lb] = nway(r, ElementType::bfloat16);
    CHECK(bits(lb) == bits(l));
    for (std::int64_t k = 0; k < dv; ++k)
      REQUIRE(detail::float_to_bfloat16(out_at(out, ElementType::float32, k)) ==
              [&] {
                std::uint16_t u;
                std::memcpy(&u, ob.data() + 2 * k, 2);
                return u;
              }());
  }
  CHECK(worst_out < 1e-6);
  CHECK(worst_lse < 2e-7);
  MESSAGE("worst relative error: out " << worst_out << ", lse " << worst_lse);
}

TEST_CASE("base 2: the same merge in log2 units (lse2 = lse * log2 e)") {
  std::mt19937 g(11);
  for (int trial = 0; trial < 200; ++trial) {
    Rows r = random_rows(g, ElementType::float32, 4, 8, 0.1);
    const auto [out, l] = nway(r, ElementType::float32);
    Rows r2 = r;
    for (float& x : r2.lse) x = static_cast<float>(x * 1.4426950408889634);
    const auto [out2, l2] = nway(r2, ElementType::float32, LseBase::two);
    if (l == kNegInf) {
      CHECK(bits(l2) == bits(kNegInf));
      continue;
    }
    CHECK(l2 == doctest::Approx(l * 1.4426950408889634).epsilon(1e-6));
    for (std::int64_t k = 0; k < 8; ++k)
      CHECK(out_at(out2, ElementType::float32, k) == doctest::Approx(out_at(out, ElementType::float32, k)).epsilon(1e-5).scale(1.0));
  }
}

TEST_CASE("the own exp2 and log1p: within 2 and 3 ulp of the double-precision functions") {
  std::mt19937 g(3);
  std::uniform_real_distribution<float> x(-125.9f, 0.0f), e(0.0f, 1.0f);
  double w_exp = 0, w_log = 0, w_log2 = 0;
  for (int i = 0; i < 200000; ++i) {
    const float a = i % 2 ? x(g) : -e(g);
    w_exp = std::max(w_exp, ulps(detail::exp2_nonpos(a), std::exp2(static_cast<double>(a))));
    const float b = e(g);
    w_log = std::max(w_log, ulps(detail::log1p_unit(b, LseBase::natural), std::log1p(static_cast<double>(b))));
    w_log2 = std::max(w_log2, ulps(detail::log1p_unit(b, LseBase::two), std::log1p(static_cast<double>(b)) / std::log(2.0)));
  }
  CHECK(w_exp <= 2.0);
  CHECK(w_log <= 3.0);
  CHECK(w_log2 <= 3.0);
  CHECK(detail::exp2_nonpos(0.0f) == 1.0f);
  CHECK(detail::exp2_nonpos(-1.0f) == 0.5f);
  CHECK(detail::exp2_nonpos(-126.0f) == 0.0f);  // flushed
  CHECK(std::isnan(detail::exp2_nonpos(std::nanf(""))));
  CHECK(detail::log1p_unit(0.0f, LseBase::natural) == 0.0f);
  MESSAGE("worst ulp: exp2 " << w_exp << ", log1p " << w_log << ", log1p base 2 " << w_log2);
}

TEST_CASE("types that cannot be merged: mergeable(), and merge() leaves the state alone") {
  CHECK(mergeable(ElementType::float32));
  CHECK(mergeable(ElementType::float16));
  CHECK(mergeable(ElementType::bfloat16));
  CHECK(!mergeable(ElementType::float64));
  CHECK(!mergeable(ElementType::opaque));
  std::vector<float> st{1.0f};
  float l = 0.0f;
  const double x = 5.0;
  merge(st.data(), l, &x, ElementType::float64, 1.0f, 1);
  CHECK(st[0] == 1.0f);
  CHECK(l == 0.0f);
  CHECK(std::string(to_string(LseBase::two)) == "two");
}

namespace {

/// Copies of r whose -inf LSEs are +inf, NaN, and a mix of the three in turn (C18).
std::vector<Rows> with_empty_lse_variants(const Rows& r) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  std::vector<Rows> v;
  for (int kind = 0; kind < 3; ++kind) {
    Rows x = r;
    int k = 0;
    for (float& l : x.lse)
      if (l == kNegInf) {
        const int pick = kind == 2 ? k++ % 3 : kind;
        l = pick == 0 ? inf : pick == 1 ? nan : kNegInf;
      }
    v.push_back(x);
  }
  return v;
}

/// merge_rows_batch() of g copies of r (row k's contributions: r's rows rotated by k), into out_type:
/// the merged rows' bytes and LSEs.
std::pair<std::vector<std::vector<std::byte>>, std::vector<float>> batched(const Rows& r, int g, ElementType out_type) {
  const int n = static_cast<int>(r.lse.size());
  std::vector<const void*> rows;
  std::vector<float> lses;
  const auto p = r.ptrs();
  for (int k = 0; k < g; ++k)
    for (int i = 0; i < n; ++i) {
      rows.push_back(p[static_cast<std::size_t>((i + k) % n)]);
      lses.push_back(r.lse[static_cast<std::size_t>((i + k) % n)]);
    }
  std::vector<std::vector<std::byte>> outs(static_cast<std::size_t>(g), std::vector<std::byte>(static_cast<std::size_t>(r.dv) * size_of(out_type), std::byte{0x5a}));
  std::vector<void*> op;
  for (auto& o : outs) op.push_back(o.data());
  std::vector<float> ol(static_cast<std::size_t>(g), 7.0f);
  merge_rows_batch(g, n, rows.data(), lses.data(), r.type, r.dv, op.data(), out_type, ol.data());
  return {outs, ol};
}

/// detail::merge_chunk() (what the decode merge unit, host and CUDA kernel, runs) in chunks of 8.
std::pair<std::vector<std::byte>, float> chunked(const Rows& r, ElementType out_type) {
  std::vector<std::byte> out(static_cast<std::size_t>(r.dv) * size_of(out_type), std::byte{0x5a});
  const auto p = r.ptrs();
  float l = kNegInf;
  detail::with_merge_arith(r.type, [&](auto in) {
    detail::with_merge_arith(out_type, [&](auto o) {
      for (std::int64_t d0 = 0; d0 < r.dv; d0 += 8)
        l = detail::merge_chunk<8, decltype(in), decltype(o)>(
            static_cast<int>(r.lse.size()), [&](int i) { return static_cast<const std::byte*>(p[static_cast<std::size_t>(i)]); },
            [&](int i) { return r.lse[static_cast<std::size_t>(i)]; }, d0, r.dv - d0 < 8 ? static_cast<int>(r.dv - d0) : 8, out.data(),
            LseBase::natural);
    });
  });
  return {out, l};
}

bool has_nan(const std::vector<std::byte>& out, ElementType t, std::int64_t dv) {
  for (std::int64_t k = 0; k < dv; ++k)
    if (std::isnan(out_at(out, t, k))) return true;
  return false;
}

}  // namespace

TEST_CASE("C18: partials with LSE +inf or NaN merge to the same bits as with -inf in those places, in every merge (merge_rows with and beyond the step tables, merge_rows_batch, merge_chunk, streaming merge()); no NaN") {
  std::mt19937 g(18);
  const ElementType types[] = {ElementType::float32, ElementType::float16, ElementType::bfloat16};
  int cases = 0, empties = 0;
  for (ElementType in : types)
    for (ElementType out_t : types)
      for (int n : {1, 2, 4, 7, 70})  // 70 > kMaxTableRanks: the chunked fold
        for (std::int64_t dv : {1, 33, 300}) {  // 300 > the host's 256-element chunk
          const Rows r = random_rows(g, in, n, dv, 0.35);  // -inf LSEs, their outputs NaN
          for (const float l : r.lse) empties += l == kNegInf;
          const auto a = nway(r, out_t);
          const auto s = streamed(r, out_t);
          const auto b = batched(r, 5, out_t);
          const auto c = chunked(r, out_t);
          const bool any = [&] {
            for (const float l : r.lse)
              if (l != kNegInf) return true;
            return false;
          }();
          for (const Rows& x : with_empty_lse_variants(r)) {
            CAPTURE(to_string(in));
            CAPTURE(to_string(out_t));
            CAPTURE(n);
            CAPTURE(dv);
            const auto a2 = nway(x, out_t);
            REQUIRE(a2.first == a.first);
            REQUIRE(bits(a2.second) == bits(a.second));
            const auto s2 = streamed(x, out_t);
            REQUIRE(s2.first == s.first);
            REQUIRE(bits(s2.second) == bits(s.second));
            const auto b2 = batched(x, 5, out_t);
            REQUIRE(b2.first == b.first);
            for (int k = 0; k < 5; ++k) REQUIRE(bits(b2.second[static_cast<std::size_t>(k)]) == bits(b.second[static_cast<std::size_t>(k)]));
            const auto c2 = chunked(x, out_t);
            REQUIRE(c2.first == c.first);
            REQUIRE(bits(c2.second) == bits(c.second));
            REQUIRE(!has_nan(a2.first, out_t, dv));
            REQUIRE(!std::isnan(a2.second));
            REQUIRE(!(a2.second == std::numeric_limits<float>::infinity()));
            if (!any) {  // every contribution empty: 0 and -inf
              REQUIRE(a2.first == std::vector<std::byte>(a2.first.size(), std::byte{0}));
              REQUIRE(bits(a2.second) == bits(kNegInf));
            }
          }
          // the -inf reference itself against the other forms (the same bits, as before)
          REQUIRE(s.first == a.first);
          REQUIRE(c.first == a.first);
          REQUIRE(bits(c.second) == bits(a.second));
          ++cases;
        }
  CHECK(cases == 3 * 3 * 5 * 3);
  CHECK(empties > 100);
}

TEST_CASE("C18: a row whose every partial has LSE +inf or NaN (a fully masked row on every rank): output 0 (all bits clear) and LSE -inf, in every form and output type") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const Rows r = fp32_rows({{nan, 1.0f, 2.0f}, {nan, nan, nan}, {4.0f, inf, 6.0f}}, {inf, nan, inf});
  for (ElementType t : {ElementType::float32, ElementType::bfloat16, ElementType::float16}) {
    const auto [out, l] = nway(r, t);
    CHECK(out == std::vector<std::byte>(out.size(), std::byte{0}));
    CHECK(bits(l) == bits(kNegInf));
    const auto [s, sl] = streamed(r, t);
    CHECK(s == out);
    CHECK(bits(sl) == bits(kNegInf));
    const auto [b, bl] = batched(r, 3, t);
    for (int k = 0; k < 3; ++k) {
      CHECK(b[static_cast<std::size_t>(k)] == out);
      CHECK(bits(bl[static_cast<std::size_t>(k)]) == bits(kNegInf));
    }
    const auto [c, cl] = chunked(r, t);
    CHECK(c == out);
    CHECK(bits(cl) == bits(kNegInf));
  }
  // One finite partial among them is taken exactly.
  const Rows one = fp32_rows({{nan, nan}, {1.5f, -7.25f}, {nan, inf}}, {inf, 3.0f, nan});
  const auto [o1, l1] = nway(one, ElementType::float32);
  CHECK(out_at(o1, ElementType::float32, 0) == 1.5f);
  CHECK(out_at(o1, ElementType::float32, 1) == -7.25f);
  CHECK(bits(l1) == bits(3.0f));
  // The streaming state started from a +inf (or NaN) block is empty: it takes the next finite block, and a state left empty ends -inf.
  for (float start : {inf, nan}) {
    std::vector<float> st{nan, nan};
    float sl = start;
    merge(st.data(), sl, one.data[0].data(), ElementType::float32, inf, 2);
    CHECK(bits(sl) == bits(kNegInf));
    merge(st.data(), sl, one.data[1].data(), ElementType::float32, 3.0f, 2);
    CHECK(st == std::vector<float>{1.5f, -7.25f});
    CHECK(bits(sl) == bits(3.0f));
  }
}

TEST_CASE("host f_mul / f_add round twice, never fused: a*b + c where one rounding (FMA) differs in the last bit") {
  // a = b = 1 + 2^-12: a·b = 1 + 2^-11 + 2^-24 rounds (tie to even) to 1 + 2^-11; with
  // c = -(1 + 2^-11) the two-rounding sum is 0, the fused one 2^-24. The build's -ffp-contract=off
  // (the ulysses target's compile options) keeps GCC/Clang from contracting on aarch64 (always FMA)
  // or x86-64 with -mfma; volatile keeps the values from being folded at compile time.
  volatile float va = 1.0f + 0x1p-12f, vc = -(1.0f + 0x1p-11f);
  const float a = va, c = vc;
  const float two_roundings = ulysses::detail::f_add(ulysses::detail::f_mul(a, a), c);
  CHECK(std::fma(a, a, c) == 0x1p-24f);  // the inputs do tell fused from unfused
  CHECK(two_roundings == 0.0f);
  float p = a;  // a Horner step as exp2_nonpos runs it, across statements
  p = ulysses::detail::f_add(ulysses::detail::f_mul(p, a), c);
  CHECK(p == 0.0f);
}

TEST_CASE("merge_chunk (the device merge's unit): 16-byte vector loads and stores where aligned, the same bits as merge_rows, aligned or not") {
  // Contributions and outputs placed at a 16-byte-aligned address and at +2 / +4 bytes (the
  // element path): every placement and type pair gives merge_rows()'s bits.
  std::mt19937 g(35);
  const ElementType types[3] = {ElementType::float32, ElementType::bfloat16, ElementType::float16};
  for (ElementType tin : types)
    for (ElementType tout : types)
      for (std::size_t shift : {std::size_t{0}, std::size_t{2}, std::size_t{4}})
        for (std::int64_t dv : {std::int64_t{16}, std::int64_t{13}}) {
          CAPTURE(to_string(tin));
          CAPTURE(to_string(tout));
          CAPTURE(shift);
          CAPTURE(dv);
          const int n = 5;
          const Rows r = random_rows(g, tin, n, dv, 0.2);
          const std::size_t ein = size_of(tin), eout = size_of(tout);
          std::vector<detail::Bytes16> in_store(static_cast<std::size_t>(n) * (static_cast<std::size_t>(dv) * ein / 16 + 2));
          std::vector<const std::byte*> rows(static_cast<std::size_t>(n));
          const std::size_t pitch = (static_cast<std::size_t>(dv) * ein / 16 + 2) * 16;
          for (int i = 0; i < n; ++i) {
            std::byte* p = reinterpret_cast<std::byte*>(in_store.data()) + static_cast<std::size_t>(i) * pitch + shift;
            std::memcpy(p, r.data[static_cast<std::size_t>(i)].data(), r.data[static_cast<std::size_t>(i)].size());
            rows[static_cast<std::size_t>(i)] = p;
          }
          std::vector<detail::Bytes16> out_store(static_cast<std::size_t>(dv) * eout / 16 + 2);
          std::byte* out = reinterpret_cast<std::byte*>(out_store.data()) + shift;
          std::vector<std::byte> want(static_cast<std::size_t>(dv) * eout);
          const auto p = r.ptrs();
          const float want_lse = merge_rows(p.data(), tin, r.lse.data(), n, dv, want.data(), tout);
          float got_lse = 0;
          detail::with_merge_arith(tin, [&](auto in) {
            detail::with_merge_arith(tout, [&](auto o) {
              for (std::int64_t d0 = 0; d0 < dv; d0 += 8)
                got_lse = detail::merge_chunk<8, decltype(in), decltype(o)>(
                    n, [&](int i) { return rows[static_cast<std::size_t>(i)]; }, [&](int i) { return r.lse[static_cast<std::size_t>(i)]; }, d0,
                    static_cast<int>(std::min<std::int64_t>(8, dv - d0)), out, LseBase::natural);
            });
          });
          CHECK(bits(got_lse) == bits(want_lse));
          CHECK(std::memcmp(out, want.data(), want.size()) == 0);
        }
}

TEST_CASE("copy_bytes / load_bits / store_bits: the widest access the addresses allow, every byte as memcpy") {
  alignas(16) std::byte src[64], dst[64];
  for (int i = 0; i < 64; ++i) src[i] = static_cast<std::byte>(i * 7 + 1);
  for (std::size_t so : {0, 1, 2, 4, 8})
    for (std::size_t n : {0, 3, 4, 8, 16, 32, 40}) {
      std::memset(dst, 0, sizeof dst);
      detail::copy_bytes(dst + so, src + so, n);
      for (std::size_t i = 0; i < 64; ++i) CHECK(dst[i] == (i >= so && i < so + n ? src[i] : std::byte{0}));
    }
  CHECK(detail::aligned_to(src, 16));
  CHECK(!detail::aligned_to(src + 2, 4));
  detail::store_bits(dst + 1, 0x01020304u);  // misaligned: memcpy
  CHECK(detail::load_bits<std::uint32_t>(dst + 1) == 0x01020304u);
}
