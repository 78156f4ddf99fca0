// SPDX-License-Identifier: Apache-2.0
// torch.hpp: ProcessGroupComm over ProcessGroupGloo (P ranks as threads of this process, one
// in-memory HashStore), the at::Tensor entry points and their checks, and the autograd functions'
// backward (the summed adjoint for replicated kv heads), every value exact.
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <ulysses/torch/torch.hpp>
// libtorch's glog defines CHECK and CHECK_EQ...; this file's CHECKs are doctest's.
#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE
#include <doctest/doctest.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.hpp"

using namespace ulysses;

namespace {

/// Runs fn(comm) on P threads, each with its own ProcessGroupGloo of one shared HashStore (loopback).
void run_gloo(int P, const std::function<void(ProcessGroupComm&)>& fn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r)
    threads.emplace_back([&, r] {
      try {
        auto opts = c10d::ProcessGroupGloo::Options::create();
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
        ProcessGroupComm comm(c10::make_intrusive<c10d::ProcessGroupGloo>(store, r, P, opts));
        fn(comm);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < P; ++r) {
    INFO("rank ", r, ": ", errors[static_cast<std::size_t>(r)]);
    CHECK(errors[static_cast<std::size_t>(r)].empty());
  }
}

/// A global [B, S, H, D] tensor of distinct whole numbers (exact in float32), a function of `seed`.
at::Tensor global_tensor(std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D, int seed, at::ScalarType type = at::kFloat) {
  return (torch::arange(B * S * H * D, torch::kDouble).reshape({B, S, H, D}) * 7 + seed * 100003).remainder(1 << 20).to(type);
}

/// The tokens of rank r as an index tensor (global positions, in local order).
at::Tensor tokens_of(const SeqPartition& seq, int r) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = 0; i < seq.local_length(r); ++i) v.push_back(seq.global_token(r, i));
  return torch::tensor(v, torch::kLong);
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && torch::equal(a.contiguous(), b.contiguous());
}

}  // namespace

TEST_CASE("ProcessGroupComm: all-to-all-v with zero-byte chunks, packed and not, and all-gather over Gloo") {
  const int P = 3;
  run_gloo(P, [&](ProcessGroupComm& comm) {
    const int r = comm.rank();
    REQUIRE(comm.size() == P);
    for (bool packed : {true, false}) {
      // rank r sends (r + p) % 3 bytes to p, each byte r * 10 + p; unpacked: a gap of one byte between chunks
      std::vector<std::size_t> sb(P), so(P), rb(P), ro(P);
      std::size_t s = 0, d = 0;
      for (int p = 0; p < P; ++p) {
        sb[static_cast<std::size_t>(p)] = static_cast<std::size_t>((r + p) % 3);
        rb[static_cast<std::size_t>(p)] = static_cast<std::size_t>((p + r) % 3);
        so[static_cast<std::size_t>(p)] = s, ro[static_cast<std::size_t>(p)] = d;
        s += sb[static_cast<std::size_t>(p)] + (packed ? 0 : 1), d += rb[static_cast<std::size_t>(p)] + (packed ? 0 : 1);
      }
      std::vector<std::byte> send(s, std::byte{0xEE}), recv(d, std::byte{0xEE});
      for (int p = 0; p < P; ++p)
        for (std::size_t i = 0; i < sb[static_cast<std::size_t>(p)]; ++i)
          send[so[static_cast<std::size_t>(p)] + i] = static_cast<std::byte>(r * 10 + p);
      comm.alltoallv(send.data(), sb.data(), so.data(), recv.data(), rb.data(), ro.data());
      for (int p = 0; p < P; ++p)
        for (std::size_t i = 0; i < rb[static_cast<std::size_t>(p)]; ++i)
          CHECK(recv[ro[static_cast<std::size_t>(p)] + i] == static_cast<std::byte>(p * 10 + r));
      if (!packed)  // the gaps are untouched
        for (int p = 0; p < P; ++p) CHECK(recv[ro[static_cast<std::size_t>(p)] + rb[static_cast<std::size_t>(p)]] == std::byte{0xEE});
    }
    const std::uint32_t mine = 1000u + static_cast<std::uint32_t>(r);
    std::vector<std::uint32_t> all(P);
    comm.allgather(&mine, sizeof mine, all.data());
    CHECK(all == std::vector<std::uint32_t>({1000, 1001, 1002}));
  });
}

TEST_CASE("at::Tensor seq_to_head and head_to_seq: GQA, uneven S, bshd in and a bhsd view out, bit for bit") {
  const int P = 3;
  const std::int64_t B = 2, S = 10, H = 6, Hkv = 3, D = 4;
  const at::Tensor gq = global_tensor(B, S, H, D, 1), gk = global_tensor(B, S, Hkv, D, 2);
  run_gloo(P, [&](ProcessGroupComm& comm) {
    const int r = comm.rank();
    const auto seq = SeqPartition::balanced(S, P);
    const AttentionSpecs a = attention_specs<float>(P, {H, Hkv, D}, HeadPolicy::even);
    const at::Tensor tok = tokens_of(seq, r);
    const at::Tensor q = gq.index_select(1, tok).contiguous(), k = gk.index_select(1, tok).contiguous();
    // head side: bhsd storage [B, H_r, S, D], seen as [B, S, H_r, D]
    const std::int64_t Hr = a.query_heads.count(r), Kr = a.kv_heads.count(r);
    const at::Tensor q2 = torch::empty({B, Hr, S, D}).permute({0, 2, 1, 3}), k2 = torch::empty({B, Kr, S, D}).permute({0, 2, 1, 3});
    Plan plan({P, r}, B, seq, {spec_of(a.query_heads, q, q2), spec_of(a.kv_heads, k, k2)});
    HostExecutor exec;
    redistribute(plan, Direction::seq_to_head, comm, exec, {q, k}, {q2, k2});
    CHECK(same_bits(q2, gq.narrow(2, a.query_heads.begin(r), Hr)));
    CHECK(same_bits(k2, gk.narrow(2, a.kv_heads.begin(r), Kr)));
    const at::Tensor q3 = torch::full_like(q, -1), k3 = torch::full_like(k, -1);
    redistribute(plan, Direction::head_to_seq, comm, exec, {q2, k2}, {q3, k3});
    CHECK(same_bits(q3, q));
    CHECK(same_bits(k3, k));
  });
}

TEST_CASE("at::Tensor checks: device, dtype, layout kind, sizes and strides, before any exchange") {
  const int P = 2;
  run_gloo(P, [&](ProcessGroupComm& comm) {
    const int r = comm.rank();
    const std::int64_t B = 1, S = 4, H = 2, D = 8;
    const at::Tensor x = torch::zeros({B, S / P, H, D}), y = torch::zeros({B, S, H / P, D});
    Plan plan({P, r}, B, SeqPartition::even(S, P), {spec_of(HeadPartition::even(H, P), x, y)});
    HostExecutor exec;
    auto code = [&](const at::Tensor& in, const at::Tensor& out) {
      return ut::code_of([&] { redistribute(plan, Direction::seq_to_head, comm, exec, {in}, {out}); });
    };
    CHECK(code(x.to(at::kDouble), y) == Errc::tensor_mismatch);                          // dtype
    CHECK(code(x, torch::zeros({B, S, H / P, D}, at::kHalf)) == Errc::tensor_mismatch);   // dtype of the output
    CHECK(code(torch::empty({B, S / P, H, D}, at::TensorOptions().device(at::kMeta)), y) == Errc::tensor_mismatch);  // device
    CHECK(code(x.to_sparse(), y) == Errc::tensor_mismatch);                              // not strided
    CHECK(code(at::Tensor(), y) == Errc::tensor_mismatch);                               // undefined
    CHECK(code(torch::zeros({B, S / P, H, D + 1}).narrow(3, 0, D), y) == Errc::layout_mismatch);  // strides
    CHECK(code(torch::zeros({B, S, H, D}), y) == Errc::layout_mismatch);                  // sizes
    CHECK(ut::code_of([&] { redistribute(plan, Direction::seq_to_head, comm, exec, {x, x}, {y, y}); }) == Errc::wrong_tensor_count);
    // and a good call still works after all of them (no rank entered a collective above)
    redistribute(plan, Direction::seq_to_head, comm, exec, {x}, {y});
  });
}

TEST_CASE("autograd: seq_to_head's backward sums the partial gradients of a replicated kv head; head_to_seq's is seq->head") {
  const int P = 4;
  const std::int64_t B = 1, S = 6, H = 8, Hkv = 2, D = 3;  // each kv head on 2 ranks
  // Every rank's upstream gradient of its head-sharded q2, k2 is a function of (rank, position),
  // so every thread can compute what the sum over holders must be.
  auto w = [&](int rank, std::int64_t heads, int t) { return global_tensor(B, S, heads, D, 10 + 4 * rank + t, at::kDouble); };
  run_gloo(P, [&](ProcessGroupComm& comm) {
    const int r = comm.rank();
    const auto seq = SeqPartition::balanced(S, P);
    const AttentionSpecs a = attention_specs<double>(P, {H, Hkv, D}, HeadPolicy::even);
    const at::Tensor tok = tokens_of(seq, r);
    const at::Tensor q = global_tensor(B, S, H, D, 1, at::kDouble).index_select(1, tok).contiguous().requires_grad_(true);
    const at::Tensor k = global_tensor(B, S, Hkv, D, 2, at::kDouble).index_select(1, tok).contiguous().requires_grad_(true);
    Plan plan({P, r}, B, seq, {spec_of(a.query_heads, q), spec_of(a.kv_heads, k)});
    const std::vector<at::Tensor> out = seq_to_head_autograd(plan, comm, {q, k});
    const at::Tensor wq = w(r, H, 0).narrow(2, a.query_heads.begin(r), a.query_heads.count(r));
    const at::Tensor wk = w(r, Hkv, 1).narrow(2, a.kv_heads.begin(r), a.kv_heads.count(r));
    ((out[0] * wq).sum() + (out[1] * wk).sum()).backward();
    // Expected: dq = each query head's one holder's w; dk = the sum of the holders' w, in rank order.
    at::Tensor dq = torch::zeros({B, S, H, D}, at::kDouble), dk = torch::zeros({B, S, Hkv, D}, at::kDouble);
    for (int p = 0; p < P; ++p) {
      dq.narrow(2, a.query_heads.begin(p), a.query_heads.count(p)) += w(p, H, 0).narrow(2, a.query_heads.begin(p), a.query_heads.count(p));
      dk.narrow(2, a.kv_heads.begin(p), a.kv_heads.count(p)) += w(p, Hkv, 1).narrow(2, a.kv_heads.begin(p), a.kv_heads.count(p));
    }
    CHECK(same_bits(q.grad(), dq.index_select(1, tok)));
    CHECK(same_bits(k.grad(), dk.index_select(1, tok)));
    CHECK_FALSE(same_bits(k.grad(), w(r, Hkv, 1).index_select(1, tok)));  // (not one holder's copy)

    // An output that takes no part in the loss has an undefined gradient: zeros flow back for it.
    q.mutable_grad().reset();
    k.mutable_grad().reset();
    const std::vector<at::Tensor> again = seq_to_head_autograd(plan, comm, {q, k});
    (again[0] * wq).sum().backward();
    CHECK(same_bits(q.grad(), dq.index_select(1, tok)));
    CHECK(same_bits(k.grad(), torch::zeros_like(k)));

    // head_to_seq_autograd: its backward is seq->head of the upstream gradient.
    const at::Tensor o2 = torch::zeros({B, S, a.query_heads.count(r), D}, at::kDouble).requires_grad_(true);
    Plan po({P, r}, B, seq, {spec_of(a.query_heads, at::Tensor(), o2)});
    const std::vector<at::Tensor> o = head_to_seq_autograd(po, comm, {o2});
    const at::Tensor g = w(0, H, 2);  // the same global upstream gradient on every rank
    (o[0] * g.index_select(1, tok)).sum().backward();
    CHECK(same_bits(o2.grad(), g.narrow(2, a.query_heads.begin(r), a.query_heads.count(r))));
  });
}

TEST_CASE("autograd refuses a plan whose replicated heads take their owner's copy (not the adjoint)") {
  const int P = 2;
  run_gloo(P, [&](ProcessGroupComm& comm) {
    const int r = comm.rank();
    const AttentionSpecs a = attention_specs<float>(P, {2, 1, 4}, HeadPolicy::even);  // the kv head on both ranks
    const at::Tensor k = torch::ones({1, 2, 1, 4}).requires_grad_(true);
    Plan plan({P, r}, 1, SeqPartition::even(4, P), {spec_of(a.kv_heads, k).with_replicas(Replicas::owner).serving(TensorSpec::kNone)});
    const std::vector<at::Tensor> out = seq_to_head_autograd(plan, comm, {k});
    CHECK(ut::code_of([&] { out[0].sum().backward(); }) == Errc::not_adjoint);
  });
}
