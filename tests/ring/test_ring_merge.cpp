// SPDX-License-Identifier: Apache-2.0
// The ring merge executor (ring/merge.hpp): bitwise against merge/lse.hpp's merge_rows() of the same
// contributions in the same (step) order; empty blocks and −inf rows; rows with LSE +inf or NaN
// (C18) the same bits as −inf; 16-bit output rounded once.
#include <doctest/doctest.h>
#include <ulysses/ring/merge.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "expect_error.hpp"
#include "ring_attention.hpp"

using namespace ulysses;

TEST_CASE("ring_merge_block over steps == merge_rows in step order, bit for bit; empty blocks change nothing") {
  const RingMergeShape s{2, 6, 3, 5};
  const int n = 4;
  // Step i covers query rows [q0[i], q0[i] + ql[i]); step 2 is empty; some rows have −inf (NaN outputs).
  const std::int64_t q0[n] = {0, 3, 2, 0}, ql[n] = {6, 3, 0, 4};
  std::vector<std::vector<float>> ob(n), lb(n);
  for (int i = 0; i < n; ++i) {
    ob[i].resize(static_cast<std::size_t>(s.B * ql[i] * s.H * s.Dv));
    lb[i].resize(static_cast<std::size_t>(s.B * s.H * ql[i]));
    for (std::size_t e = 0; e < ob[i].size(); ++e) ob[i][e] = ulysses_ring_demo::rand_value(i, static_cast<std::int64_t>(e)) * 3.0f;
    for (std::size_t e = 0; e < lb[i].size(); ++e) lb[i][e] = e % 7 == 3 ? -INFINITY : ulysses_ring_demo::rand_value(10 + i, static_cast<std::int64_t>(e)) * 4.0f;
    for (std::size_t e = 0; e < lb[i].size(); ++e)
      if (lb[i][e] == -INFINITY)
        for (std::int64_t d = 0; d < s.Dv; ++d) {
          // row of (b, h, q) for lse index e: b = e / (H·ql), h = (e / ql) % H, q = e % ql
          const std::int64_t b = static_cast<std::int64_t>(e) / (s.H * ql[i]), h = (static_cast<std::int64_t>(e) / ql[i]) % s.H,
                             q = static_cast<std::int64_t>(e) % ql[i];
          ob[i][static_cast<std::size_t>(((b * ql[i] + q) * s.H + h) * s.Dv + d)] = NAN;
        }
  }
  std::vector<float> out(static_cast<std::size_t>(s.out_elems())), lse(static_cast<std::size_t>(s.lse_elems()));
  ring_merge_init(s, out.data(), lse.data());
  for (int i = 0; i < n; ++i) ring_merge_block(s, out.data(), lse.data(), ob[i].data(), ElementType::float32, lb[i].data(), q0[i], ql[i]);
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t q = 0; q < s.S_q; ++q)
      for (std::int64_t h = 0; h < s.H; ++h) {
        std::vector<const void*> rows;
        std::vector<float> ls;
        for (int i = 0; i < n; ++i)
          if (q >= q0[i] && q < q0[i] + ql[i]) {
            rows.push_back(&ob[i][static_cast<std::size_t>(((b * ql[i] + q - q0[i]) * s.H + h) * s.Dv)]);
            ls.push_back(lb[i][static_cast<std::size_t>((b * s.H + h) * ql[i] + q - q0[i])]);
          }
        std::vector<float> want(static_cast<std::size_t>(s.Dv));
        const float wl = merge_rows(rows.data(), ElementType::float32, ls.data(), static_cast<int>(rows.size()), s.Dv, want.data(),
                                    ElementType::float32);
        const float gl = lse[static_cast<std::size_t>((b * s.H + h) * s.S_q + q)];
        CHECK(std::memcmp(&wl, &gl, sizeof(float)) == 0);
        CHECK(std::memcmp(want.data(), &out[static_cast<std::size_t>(((b * s.S_q + q) * s.H + h) * s.Dv)], want.size() * sizeof(float)) == 0);
        for (std::int64_t d = 0; d < s.Dv; ++d) CHECK(!std::isnan(out[static_cast<std::size_t>(((b * s.S_q + q) * s.H + h) * s.Dv + d)]));
      }
}

TEST_CASE("C18: ring steps whose rows have LSE +inf or NaN (FlashAttention-2's fully masked rows) merge to the bits of -inf there; no NaN; a row empty at every step is 0 and -inf") {
  const RingMergeShape s{2, 5, 3, 6};
  const int n = 4;  // steps, each over all S_q rows
  const float inf = INFINITY, nan = NAN;
  // Row (b, h, q) is empty at step i when empty_at(i, e) (e its LSE index); rows with q == 4 are empty at every step.
  auto empty_at = [&](int i, std::size_t e) { return e % 5 == 4 || (e + static_cast<std::size_t>(i)) % 4 == 1; };
  std::vector<std::vector<float>> ob(n), lb(n);
  for (int i = 0; i < n; ++i) {
    ob[i].resize(static_cast<std::size_t>(s.out_elems()));
    lb[i].resize(static_cast<std::size_t>(s.lse_elems()));
    for (std::size_t e = 0; e < ob[i].size(); ++e) ob[i][e] = ulysses_ring_demo::rand_value(20 + i, static_cast<std::int64_t>(e)) * 3.0f;
    for (std::size_t e = 0; e < lb[i].size(); ++e) {
      lb[i][e] = empty_at(i, e) ? -INFINITY : ulysses_ring_demo::rand_value(30 + i, static_cast<std::int64_t>(e)) * 4.0f;
      if (!empty_at(i, e)) continue;
      const std::int64_t b = static_cast<std::int64_t>(e) / (s.H * s.S_q), h = (static_cast<std::int64_t>(e) / s.S_q) % s.H,
                         q = static_cast<std::int64_t>(e) % s.S_q;
      for (std::int64_t d = 0; d < s.Dv; ++d) ob[i][static_cast<std::size_t>(((b * s.S_q + q) * s.H + h) * s.Dv + d)] = NAN;
    }
  }
  auto run = [&](const std::vector<std::vector<float>>& lses, std::vector<float>& lse) {
    std::vector<float> out(static_cast<std::size_t>(s.out_elems()));
    lse.assign(static_cast<std::size_t>(s.lse_elems()), 0.0f);
    ring_merge_init(s, out.data(), lse.data());
    for (int i = 0; i < n; ++i) ring_merge_block(s, out.data(), lse.data(), ob[i].data(), ElementType::float32, lses[i].data(), 0, s.S_q);
    return out;
  };
  std::vector<float> ref_lse;
  const std::vector<float> ref = run(lb, ref_lse);
  int variant = 0;
  for (float empty : {inf, nan, -nan}) {
    auto lb2 = lb;
    int k = 0;
    for (int i = 0; i < n; ++i)
      for (float& l : lb2[static_cast<std::size_t>(i)])
        if (l == -INFINITY) l = variant == 2 ? (k++ % 2 ? inf : nan) : empty;  // the last variant mixes +inf and NaN
    ++variant;
    std::vector<float> got_lse;
    const std::vector<float> got = run(lb2, got_lse);
    CHECK(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(got_lse.data(), ref_lse.data(), got_lse.size() * sizeof(float)) == 0);
    for (float x : got) REQUIRE(!std::isnan(x));
    for (std::int64_t b = 0; b < s.B; ++b)
      for (std::int64_t h = 0; h < s.H; ++h) {
        const std::int64_t q = 4;  // empty at every step: 0 and -inf
        CHECK(got_lse[static_cast<std::size_t>((b * s.H + h) * s.S_q + q)] == -INFINITY);
        for (std::int64_t d = 0; d < s.Dv; ++d) CHECK(got[static_cast<std::size_t>(((b * s.S_q + q) * s.H + h) * s.Dv + d)] == 0.0f);
        for (std::int64_t qq = 0; qq < 4; ++qq) CHECK(std::isfinite(got_lse[static_cast<std::size_t>((b * s.H + h) * s.S_q + qq)]));
      }
    std::uint16_t bf[2 * 5 * 3 * 6], bf_ref[2 * 5 * 3 * 6];
    ring_merge_finish(s, got.data(), bf, ElementType::bfloat16);
    ring_merge_finish(s, ref.data(), bf_ref, ElementType::bfloat16);
    CHECK(std::memcmp(bf, bf_ref, sizeof bf) == 0);
  }
}

TEST_CASE("ring_merge_finish: a row that saw no key is 0; bf16 rounded once from the fp32 state") {
  const RingMergeShape s{1, 2, 1, 2};
  std::vector<float> out(4), lse(2);
  ring_merge_init(s, out.data(), lse.data());
  const float ob[2] = {1.00390625f, 3.0f}, lb[1] = {0.5f};  // 1 + 2^-8: a bf16 tie, rounds to even (1.0)
  ring_merge_block(s, out.data(), lse.data(), ob, ElementType::float32, lb, 1, 1);
  CHECK(lse[0] == -INFINITY);
  CHECK(lse[1] == 0.5f);
  std::uint16_t bf[4];
  ring_merge_finish(s, out.data(), bf, ElementType::bfloat16);
  CHECK(bf[0] == 0);
  CHECK(bf[1] == 0);
  CHECK(bf[2] == 0x3f80);  // 1.0
  CHECK(bf[3] == 0x4040);  // 3.0
}

TEST_CASE("ring_merge errors and the kv block layout") {
  const RingMergeShape s{1, 2, 1, 2};
  std::vector<float> out(4), lse(2);
  const float ob[4] = {}, lb[2] = {};
  CHECK(ut::code_of([&] { ring_merge_block(s, out.data(), lse.data(), ob, ElementType::float32, lb, 1, 2); }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { ring_merge_block(s, out.data(), lse.data(), ob, ElementType::float64, lb, 0, 1); }) == Errc::tensor_mismatch);
  CHECK(ut::code_of([&] { ring_merge_finish(s, out.data(), out.data(), ElementType::opaque); }) == Errc::tensor_mismatch);
  const RingKvBlock kb{2, 5, 1, 8, 4, 2};
  CHECK(kb.v_offset() == 2u * 5 * 8 * 2);
  CHECK(kb.bytes() == 2u * 5 * (8 + 4) * 2);
}

TEST_CASE("a head range (a band): only heads [lo, hi) merge and are written, with the bits of the whole merge there; a range outside [0, H) is invalid_shape") {
  const RingMergeShape s{2, 3, 4, 2};  // B = 2, S_q = 3, H = 4, Dv = 2
  std::vector<float> blk(static_cast<std::size_t>(s.out_elems())), lb(static_cast<std::size_t>(s.lse_elems()));
  for (std::size_t i = 0; i < blk.size(); ++i) blk[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  for (std::size_t i = 0; i < lb.size(); ++i) lb[i] = 0.125f * static_cast<float>(i % 5);
  std::vector<float> all_o(blk.size()), all_l(lb.size()), band_o(blk.size()), band_l(lb.size());
  ring_merge_init(s, all_o.data(), all_l.data());
  ring_merge_init(s, band_o.data(), band_l.data());
  ring_merge_block(s, all_o.data(), all_l.data(), blk.data(), ElementType::float32, lb.data(), 0, 3);
  ring_merge_block(s, band_o.data(), band_l.data(), blk.data(), ElementType::float32, lb.data(), 0, 3, LseBase::natural, HeadRun{1, 3});
  std::vector<std::uint16_t> all_x(blk.size(), 0xffff), band_x(blk.size(), 0xffff);
  ring_merge_finish(s, all_o.data(), all_x.data(), ElementType::bfloat16);
  ring_merge_finish(s, band_o.data(), band_x.data(), ElementType::bfloat16, HeadRun{1, 3});
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t i = 0; i < 3; ++i)
      for (std::int64_t h = 0; h < 4; ++h) {
        const auto l = static_cast<std::size_t>((b * 4 + h) * 3 + i);
        const bool in = h >= 1 && h < 3;
        CHECK((in ? band_l[l] == all_l[l] : std::isinf(band_l[l]) && band_l[l] < 0));
        for (std::int64_t d = 0; d < 2; ++d) {
          const auto e = static_cast<std::size_t>(((b * 3 + i) * 4 + h) * 2 + d);
          CHECK(band_x[e] == (in ? all_x[e] : std::uint16_t{0xffff}));
          CHECK((in ? band_o[e] == all_o[e] : band_o[e] == 0.0f));
        }
      }
  std::vector<float> o(static_cast<std::size_t>(s.out_elems()));
  CHECK(ut::code_of([&] { ring_merge_block(s, o.data(), band_l.data(), blk.data(), ElementType::float32, lb.data(), 0, 3, LseBase::natural, HeadRun{2, 5}); }) ==
        Errc::invalid_shape);
  CHECK(ut::code_of([&] { ring_merge_finish(s, o.data(), o.data(), ElementType::float32, HeadRun{3, 2}); }) == Errc::invalid_shape);
}
