// SPDX-License-Identifier: Apache-2.0
// The whole attention through Ulysses × Ring, in-process (examples/common/ring_attention.hpp, shared with the demo's --ring): seq→head in
// the ring group, R ring steps on the schedule, the LSE merge in step order, head→seq; and the
// backward (kv and fp32 dk|dv around the ring, dq local, the summed Ulysses inverse) against the
// single-rank double-precision reference: causal zigzag, non-causal, GQA with Hkv < U, uneven S.
#include <doctest/doctest.h>

#include <cstring>

#include "ring_attention.hpp"

using namespace ulysses;
namespace ut = ulysses_ring_demo;

namespace {
void check_case(const ut::RingCase& c, bool backward, double tol = 2e-5) {
  const ut::RingGlobals g(c);
  const ut::RingReference ref(c, g, backward);
  const auto res = ut::run_ring_attention(c, g, backward);
  INFO("U=" << c.U << " R=" << c.R << " S=" << c.S << " H=" << c.H << " Hkv=" << c.Hkv << " B=" << c.B << (c.causal ? " causal " : " ")
            << to_string(c.layout));
  const ut::RingErrors e = ut::max_errors(c, ref, res);
  CHECK(e.out < tol);
  CHECK(e.lse < tol);  // the merged LSE, [B, Hq, L] of ring rank j's tokens
  if (!backward) return;
  CHECK(e.dq < tol);
  CHECK(e.dk < tol);
  CHECK(e.dv < tol);
}
}  // namespace

TEST_CASE("forward and backward: causal zigzag and non-causal, U x R = 2 x 2, 1 x 4, 4 x 1, 2 x 3, 3 x 2") {
  for (auto [U, R] : {std::pair{2, 2}, {1, 4}, {4, 1}, {2, 3}, {3, 2}})
    for (bool causal : {true, false}) {
      ut::RingCase c;
      c.U = U;
      c.R = R;
      c.S = 24;
      c.H = 12;
      c.Hkv = 12;
      c.causal = causal;
      c.layout = causal ? RingLayout::zigzag : RingLayout::contiguous;
      check_case(c, true);
    }
}

TEST_CASE("causal with the contiguous layout (unbalanced, still exact) and non-causal zigzag") {
  ut::RingCase c;
  c.S = 20;
  c.layout = RingLayout::contiguous;
  check_case(c, true);
  c.layout = RingLayout::zigzag;
  c.causal = false;
  check_case(c, true);
}

TEST_CASE("GQA: Hkv < U (each kv head on several Ulysses ranks; the ring carries the rank's kv heads only)") {
  ut::RingCase c;
  c.U = 4;
  c.R = 2;
  c.H = 8;
  c.Hkv = 2;
  c.S = 32;
  check_case(c, true);
  c.Hkv = 1;  // MQA
  check_case(c, true);
}

TEST_CASE("C15: U=2 x R=3 causal zigzag, H=6, Hkv=2, S=61 (not a multiple of 2RU=12), B=2, D=8: forward and backward") {
  ut::RingCase c;
  c.U = 2;
  c.R = 3;
  c.H = 6;
  c.Hkv = 2;
  c.S = 61;
  c.B = 2;
  c.D = 8;
  c.Dv = 8;
  check_case(c, true);
}

TEST_CASE("uneven S everywhere, MLA-like Dv != D, P = 16 in-process") {
  ut::RingCase c;
  c.U = 4;
  c.R = 4;
  c.H = 4;
  c.Hkv = 2;
  c.S = 37;
  c.D = 4;
  c.Dv = 6;
  check_case(c, true);
}

TEST_CASE("the merged LSE does not drift with the ring degree (aiter #3334: an offset that grew with R)") {
  for (int R : {1, 2, 4, 8}) {
    ut::RingCase c;
    c.U = 2;
    c.R = R;
    c.S = 16 * R + 5;
    c.H = 2;
    c.Hkv = 2;
    check_case(c, false, 1e-5);
  }
}

TEST_CASE("same bits on every run and with either progress mode") {
  ut::RingCase c;
  c.U = 2;
  c.R = 3;
  c.H = 6;
  c.Hkv = 2;
  c.S = 29;
  const ut::RingGlobals g(c);
  const auto a = ut::run_ring_attention(c, g, true, RingProgress::thread);
  const auto b = ut::run_ring_attention(c, g, true, RingProgress::in_start);
  const auto d = ut::run_ring_attention(c, g, true, RingProgress::thread);
  for (std::size_t w = 0; w < a.size(); ++w)
    for (const auto* x : {&b, &d}) {
      const auto& y = (*x)[w];
      CHECK(std::memcmp(a[w].out.data(), y.out.data(), y.out.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(a[w].dq.data(), y.dq.data(), y.dq.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(a[w].dk.data(), y.dk.data(), y.dk.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(a[w].dv.data(), y.dv.data(), y.dv.size() * sizeof(float)) == 0);
    }
}
