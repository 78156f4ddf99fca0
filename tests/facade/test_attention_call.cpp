// SPDX-License-Identifier: Apache-2.0
// attention_call.hpp: seq_to_head / seq_to_head_backward of q, k, v by name (Qkv, QkvGrad). k and v
// of the same size, filled with values that say which tensor, token, head and element they are:
// k's bytes land in k's output and v's in v's; the positional form swaps them silently (what the
// size check cannot catch); the backward sums dk, dv over their holders; the plan and
// missing-buffer checks, with their codes and messages.
#include <doctest/doctest.h>
#include <ulysses/attention_call.hpp>
#include <ulysses/comm/local.hpp>
#include <ulysses/host/executor.hpp>
#include <ulysses/layout/rope.hpp>
#include <ulysses/plan/attention.hpp>

#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "expect_error.hpp"

using namespace ulysses;

namespace {

// The layer of every case: H=8 query heads, Hkv=2 kv heads, D = Dv = 4 (k and v of one size), fp32,
// B=2, S=12 (uneven on P=5 is not needed: balanced splits are covered by redistribute's suites).
constexpr std::int64_t kB = 2, kS = 12, kH = 8, kHkv = 2, kD = 4;

/// Global element (tensor t: 0 q, 1 k, 2 v; b, s, global head h, d), held by rank `holder` for
/// head-sharded gradients (-1 for seq-sharded values): a whole number, exact in float, and sums of
/// a few of them too.
float value(int t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d, int holder = -1) {
  return static_cast<float>(((((t * kB + b) * kS + s) * kH + h) * kD + d) * 8 + holder + 1);
}

/// Rank r's seq-sharded tensor t of the plan, filled with value().
std::vector<float> seq_tensor(const Plan& plan, int t, int r) {
  const Layout& l = plan.seq_layout(t);
  std::vector<float> x(plan.seq_bytes(t) / sizeof(float));
  for (std::int64_t b = 0; b < l.extent[0]; ++b)
    for (std::int64_t i = 0; i < l.extent[1]; ++i)
      for (std::int64_t h = 0; h < l.extent[2]; ++h)
        for (std::int64_t d = 0; d < l.extent[3]; ++d)
          x[static_cast<std::size_t>(l.offset(b, i, h, d))] = value(t, b, plan.seq().global_token(r, i), h, d);
  return x;
}

/// Elements of rank r's head-sharded buffer `x` (the layout of plan tensor `slot`) that do not hold
/// tensor `t`'s values: 0 when x is tensor t's head-sharded part, many when it is another's.
long not_tensor(const Plan& plan, int slot, int t, int r, const std::vector<float>& x) {
  const Layout& l = plan.head_layout(slot);
  const std::int64_t h0 = plan.tensor(slot).heads.begin(r);
  long wrong = 0;
  for (std::int64_t b = 0; b < l.extent[0]; ++b)
    for (std::int64_t s = 0; s < l.extent[1]; ++s)
      for (std::int64_t h = 0; h < l.extent[2]; ++h)
        for (std::int64_t d = 0; d < l.extent[3]; ++d) wrong += x[static_cast<std::size_t>(l.offset(b, s, h, d))] != value(t, b, s, h0 + h, d);
  return wrong;
}

/// Rank r's buffers of one q, k, v exchange: seq-sharded q, k, v (filled), head-sharded outputs, ws.
struct Buffers {
  std::vector<float> q, k, v, q2, k2, v2;
  std::vector<std::byte> ws;
  Buffers(const Plan& plan, int r)
      : q(seq_tensor(plan, 0, r)), k(seq_tensor(plan, 1, r)), v(seq_tensor(plan, 2, r)), q2(plan.head_bytes(0) / sizeof(float)),
        k2(plan.head_bytes(1) / sizeof(float)), v2(plan.head_bytes(2) / sizeof(float)), ws(plan.workspace_bytes()) {}
};

Plan qkv_plan(int P, int r) {
  return Plan({P, r}, kB, SeqPartition::balanced(kS, P), attention_specs<float>(P, {kH, kHkv, kD}).qkv());
}

}  // namespace

// There is no way to pass q, k, v to the named call without naming them: no positional
// constructor, no aggregate braces, no conversion from a positional list, and the forward's
// buffers are not the backward's.
static_assert(!std::is_aggregate_v<QkvIn> && !std::is_aggregate_v<QkvGradOut>, "no Qkv{q, k, v}");
static_assert(!std::is_constructible_v<QkvIn, ConstByteSpan, ConstByteSpan, ConstByteSpan>, "no positional constructor");
static_assert(!std::is_constructible_v<QkvOut, ByteSpan, ByteSpan, ByteSpan>, "no positional constructor");
static_assert(!std::is_convertible_v<TensorList<ConstByteSpan>, QkvIn>, "a positional list does not become a named one");
static_assert(!std::is_convertible_v<QkvGradIn, QkvIn> && !std::is_convertible_v<QkvIn, QkvGradIn>, "q is not dq");

TEST_CASE("seq_to_head by name: k's bytes land in k's output and v's in v's (k and v of one size), P in {1, 2, 4}") {
  for (int P : {1, 2, 4}) {  // at P=4 each kv head is on 2 ranks (copied to both)
    CAPTURE(P);
    LocalGroup g(P);
    std::vector<long> wrong(static_cast<std::size_t>(P), -1);
    std::vector<std::size_t> k_bytes(static_cast<std::size_t>(P)), v_bytes(static_cast<std::size_t>(P));
    g.spawn([&](LocalGroup::Comm& comm) {
      const int r = comm.rank();
      const Plan plan = qkv_plan(P, r);
      Buffers x(plan, r);
      HostExecutor exec;
      // The buffers in another order than the plan's: the names place them.
      seq_to_head(plan, comm, exec, QkvIn().v(x.v).q(x.q).k(x.k), QkvOut().k(x.k2).v(x.v2).q(x.q2), x.ws);
      k_bytes[static_cast<std::size_t>(r)] = plan.seq_bytes(1);
      v_bytes[static_cast<std::size_t>(r)] = plan.seq_bytes(2);
      wrong[static_cast<std::size_t>(r)] = not_tensor(plan, 0, 0, r, x.q2) + not_tensor(plan, 1, 1, r, x.k2) + not_tensor(plan, 2, 2, r, x.v2);
    });
    CHECK(k_bytes == v_bytes);  // the sizes cannot tell k from v
    CHECK(wrong == std::vector<long>(static_cast<std::size_t>(P), 0));
  }
}

TEST_CASE("the positional form cannot tell k from v of one size: {q, v, k} passes every check and swaps them") {
  // What the size check catches is a buffer shorter than its tensor (q's place given k); what it
  // cannot catch is two tensors of one size swapped. The named call is the remedy.
  const int P = 2;
  LocalGroup g(P);
  std::vector<long> k_is_v(P, -1), k_is_k(P, -1);
  g.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    const Plan plan = qkv_plan(P, r);
    Buffers x(plan, r);
    HostExecutor exec;
    seq_to_head(plan, comm, exec, {x.q, x.v, x.k}, {x.q2, x.k2, x.v2}, x.ws);  // no error
    k_is_v[static_cast<std::size_t>(r)] = not_tensor(plan, 1, 2, r, x.k2);  // k's output holds v
    k_is_k[static_cast<std::size_t>(r)] = not_tensor(plan, 1, 1, r, x.k2);
  });
  CHECK(k_is_v == std::vector<long>{0, 0});
  CHECK(k_is_k[0] == static_cast<long>(kB * kS * 1 * kD));  // every element of rank 0's one kv head is wrong
}

TEST_CASE("seq_to_head_backward by name: dk and dv are the sums of their holders' partials, each in its own output") {
  const int P = 4;  // Hkv=2: every kv head on 2 ranks, its gradient summed over them
  LocalGroup g(P);
  std::vector<long> wrong(P, -1);
  g.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    const Plan plan = qkv_plan(P, r);
    // Head-sharded partial gradients: rank r's value of (t, b, s, h, d) says r.
    std::vector<float> grad[3], seq[3];
    for (int t = 0; t < 3; ++t) {
      const Layout& l = plan.head_layout(t);
      grad[t].resize(plan.head_bytes(t) / sizeof(float));
      seq[t].resize(plan.seq_bytes(t) / sizeof(float));
      for (std::int64_t b = 0; b < l.extent[0]; ++b)
        for (std::int64_t s = 0; s < l.extent[1]; ++s)
          for (std::int64_t h = 0; h < l.extent[2]; ++h)
            for (std::int64_t d = 0; d < l.extent[3]; ++d)
              grad[t][static_cast<std::size_t>(l.offset(b, s, h, d))] = value(t, b, s, plan.tensor(t).heads.begin(r) + h, d, r);
    }
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor exec;
    seq_to_head_backward(plan, comm, exec, QkvGradIn().dv(grad[2]).dk(grad[1]).dq(grad[0]),
                         QkvGradOut().dq(seq[0]).dv(seq[2]).dk(seq[1]), ws);
    long w = 0;
    for (int t = 0; t < 3; ++t) {
      const Layout& l = plan.seq_layout(t);
      for (std::int64_t b = 0; b < l.extent[0]; ++b)
        for (std::int64_t i = 0; i < l.extent[1]; ++i)
          for (std::int64_t h = 0; h < l.extent[2]; ++h)
            for (std::int64_t d = 0; d < l.extent[3]; ++d) {
              const std::int64_t s = plan.seq().global_token(r, i);
              const auto holders = plan.tensor(t).heads.holders(h);
              float want = 0;  // ascending holder order, as the library adds
              for (int q = holders.first; q < holders.second; ++q) want += value(t, b, s, h, d, q);
              w += seq[t][static_cast<std::size_t>(l.offset(b, i, h, d))] != want;
            }
    }
    wrong[static_cast<std::size_t>(r)] = w;
  });
  CHECK(wrong == std::vector<long>(P, 0));
}

TEST_CASE("by name with row transforms: RoPE on q and k (its inverse on dq and dk backward) gives the positional call's bits") {
  for (int P : {2, 4}) {
    CAPTURE(P);
    LocalGroup g(P);
    std::vector<long> wrong(static_cast<std::size_t>(P), -1), rotated(static_cast<std::size_t>(P), -1);
    const Rope rope(kD, kS), inverse = rope.inverse();
    RowTransforms fwd, bwd;
    fwd.on_pack(0, rope).on_pack(1, rope);
    bwd.on_unpack(0, inverse).on_unpack(1, inverse);
    g.spawn([&](LocalGroup::Comm& comm) {
      const int r = comm.rank();
      std::vector<TensorSpec> specs = attention_specs<float>(P, {kH, kHkv, kD}).qkv();
      specs[0].with_row_transforms();
      specs[1].with_row_transforms();
      const Plan plan({P, r}, kB, SeqPartition::balanced(kS, P), specs);
      Buffers named(plan, r), positional(plan, r), plain(plan, r);
      HostExecutor exec;
      seq_to_head(plan, comm, exec, QkvIn().v(named.v).k(named.k).q(named.q), QkvOut().q(named.q2).v(named.v2).k(named.k2), named.ws, fwd);
      seq_to_head(plan, comm, exec, {ConstByteSpan(positional.q), ConstByteSpan(positional.k), ConstByteSpan(positional.v)},
                  {ByteSpan(positional.q2), ByteSpan(positional.k2), ByteSpan(positional.v2)}, positional.ws, fwd);
      seq_to_head(plan, comm, exec, QkvIn().q(plain.q).k(plain.k).v(plain.v), QkvOut().q(plain.q2).k(plain.k2).v(plain.v2), plain.ws);
      long w = (named.q2 != positional.q2) + (named.k2 != positional.k2) + (named.v2 != positional.v2) + (named.v2 != plain.v2);
      // The backward: the head-sharded outputs back by name and positionally, through the inverse.
      std::vector<float> dq(plan.seq_bytes(0) / sizeof(float)), dk(plan.seq_bytes(1) / sizeof(float)), dv(plan.seq_bytes(2) / sizeof(float));
      std::vector<float> pq(dq.size()), pk(dk.size()), pv(dv.size());
      seq_to_head_backward(plan, comm, exec, QkvGradIn().dq(named.q2).dk(named.k2).dv(named.v2), QkvGradOut().dq(dq).dk(dk).dv(dv),
                           named.ws, bwd);
      seq_to_head_backward(plan, comm, exec, {ConstByteSpan(named.q2), ConstByteSpan(named.k2), ConstByteSpan(named.v2)},
                           {ByteSpan(pq), ByteSpan(pk), ByteSpan(pv)}, positional.ws, bwd);
      w += (dq != pq) + (dk != pk) + (dv != pv);
      wrong[static_cast<std::size_t>(r)] = w;
      rotated[static_cast<std::size_t>(r)] = named.q2 != plain.q2 && named.k2 != plain.k2;  // (the transforms did run)
    });
    CHECK(wrong == std::vector<long>(static_cast<std::size_t>(P), 0));
    CHECK(rotated == std::vector<long>(static_cast<std::size_t>(P), 1));
  }
}

TEST_CASE("the named calls check the plan is q, k, v and every buffer is named, before anything moves") {
  const int P = 2;
  LocalGroup g(P);
  std::vector<std::string> msgs;
  std::vector<Errc> codes;
  g.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    const SeqPartition seq = SeqPartition::balanced(kS, P);
    const AttentionSpecs a = attention_specs<float>(P, {kH, kHkv, kD});
    const Plan good = qkv_plan(P, r);
    Buffers x(good, r);
    HostExecutor exec;
    const QkvIn in = QkvIn().q(x.q).k(x.k).v(x.v);
    const QkvOut out = QkvOut().q(x.q2).k(x.k2).v(x.v2);
    // Plans that are not the q, k, v plan of attention_specs(): o's, MHA specs built by hand
    // (equal head counts: k does not serve q by default), k with another head dim, v on another split.
    const HeadPartition qh = HeadPartition::even(kH, P), kv4 = HeadPartition::gqa(qh, 4);
    const Plan o({P, r}, kB, seq, a.out());
    const Plan mha({P, r}, kB, seq, {TensorSpec::of<float>(qh, kD), TensorSpec::of<float>(qh, kD), TensorSpec::of<float>(qh, kD)});
    const Plan k_dim({P, r}, kB, seq, {a.q, TensorSpec::of<float>(a.kv_heads, kD * 2).serving(0), a.v});
    const Plan v_split({P, r}, kB, seq, {a.q, a.k, TensorSpec::of<float>(kv4, kD).serving(0)});
    std::vector<std::pair<Errc, std::string>> got = {
        ut::error_of([&] { seq_to_head(o, comm, exec, in, out, x.ws); }),
        ut::error_of([&] { seq_to_head(mha, comm, exec, in, out, x.ws); }),
        ut::error_of([&] { seq_to_head(k_dim, comm, exec, in, out, x.ws); }),
        ut::error_of([&] { seq_to_head(v_split, comm, exec, in, out, x.ws); }),
        ut::error_of([&] { seq_to_head(good, comm, exec, QkvIn().q(x.q).k(x.k), out, x.ws); }),
        ut::error_of([&] { seq_to_head_backward(good, comm, exec, QkvGradIn().dq(x.q2).dk(x.k2).dv(x.v2), QkvGradOut().dq(x.q).dv(x.v), x.ws); }),
    };
    if (r == 0)
      for (const auto& e : got) codes.push_back(e.first), msgs.push_back(e.second);
  });
  REQUIRE(codes.size() == 6);
  CHECK(codes[0] == Errc::wrong_tensor_count);
  CHECK(msgs[0].find("the plan has 1 tensors, not q, k, v") != std::string::npos);
  CHECK(codes[1] == Errc::gqa_invalid);
  CHECK(msgs[1].find("k and v must serve tensor 0") != std::string::npos);
  CHECK(codes[2] == Errc::invalid_shape);
  CHECK(msgs[2].find("k's head dim 8 differs from q's 4") != std::string::npos);
  CHECK(codes[3] == Errc::gqa_invalid);
  CHECK(msgs[3].find("different head partitions") != std::string::npos);
  CHECK(codes[4] == Errc::wrong_tensor_count);
  CHECK(msgs[4].find("seq_to_head of q, k, v by name: the input v was not given") != std::string::npos);
  CHECK(codes[5] == Errc::wrong_tensor_count);
  CHECK(msgs[5].find("seq_to_head_backward of q, k, v by name: the output dk was not given") != std::string::npos);
}

TEST_CASE("a name given twice keeps the last, and a named buffer too short is refused like a positional one") {
  LocalGroup g(1);
  Errc code{};
  std::string msg;
  long wrong = -1;
  g.spawn([&](LocalGroup::Comm& comm) {
    const Plan plan = qkv_plan(1, 0);
    Buffers x(plan, 0);
    HostExecutor exec;
    std::vector<float> short_k(x.k.size() - 1);
    seq_to_head(plan, comm, exec, QkvIn().q(x.q).k(x.v).v(x.v).k(x.k), QkvOut().q(x.q2).k(x.k2).v(x.v2), x.ws);
    wrong = not_tensor(plan, 1, 1, 0, x.k2);
    std::tie(code, msg) = ut::error_of([&] { seq_to_head(plan, comm, exec, QkvIn().q(x.q).k(short_k).v(x.v), QkvOut().q(x.q2).k(x.k2).v(x.v2), x.ws); });
  });
  CHECK(wrong == 0);
  CHECK(code == Errc::buffer_too_small);
  CHECK(msg.find("input 1 (tensor 1, seq-sharded)") != std::string::npos);
}
