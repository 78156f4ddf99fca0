// SPDX-License-Identifier: Apache-2.0
// redistribute.hpp: seq_to_head / head_to_seq on the in-process group, every shared fault case
// (C1–C8) and every model, bit for bit; argument errors with their codes.
#include <doctest/doctest.h>

#include "cases.hpp"

using namespace ulysses;

namespace {

/// Runs case c on a fresh in-process group of c.P ranks; returns every rank's failures.
template <class T>
std::string run_local(const ut::Case& c) {
  LocalGroup g(c.P);
  std::vector<std::string> err(static_cast<std::size_t>(c.P));
  g.run([&](LocalGroup::Comm& comm) { err[static_cast<std::size_t>(comm.rank())] = ut::run_case<T>(comm, c); });
  std::string all;
  for (auto& e : err) all += e.empty() ? "" : e + "\n";
  return all;
}

template <class T>
void check_all(const std::vector<ut::Case>& cases) {
  for (const auto& c : cases) {
    CAPTURE(c.name);
    CHECK(run_local<T>(c) == "");
  }
}

}  // namespace

TEST_CASE("C1: batch > 1 keeps tokens of each sequence apart (literal values, bshd)") {
  // B=2, S=4 over P=2, H=4, D=1, x[b][s][h] = (b*4 + s)*4 + h. Rank r must hold
  // out[b][s][j] = x[b][s][2r + j].
  const int P = 2;
  LocalGroup g(P);
  std::vector<std::vector<float>> out(P);
  g.run([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    Plan plan({P, r}, 2, SeqPartition::even(4, P), {TensorSpec::of<float>(HeadPartition::even(4, P), 1)});
    std::vector<float> in;
    for (int b = 0; b < 2; ++b)
      for (int s = 0; s < 2; ++s)
        for (int h = 0; h < 4; ++h) in.push_back(static_cast<float>((b * 4 + 2 * r + s) * 4 + h));
    out[r].resize(16);
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    seq_to_head(plan, comm, ex, in.data(), out[r].data(), {ws.data(), ws.size()});
  });
  CHECK(out[0] == std::vector<float>{0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29});
  CHECK(out[1] == std::vector<float>{2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31});
}

TEST_CASE("C1: batch > 1 in bshd, sbhd, bhsd") { check_all<float>(ut::c1_cases()); }

TEST_CASE("C2: head_to_seq inverts seq_to_head; P in {2,4,8}, B in {1,2}, all layouts, q/k/v fused") {
  for (int P : {2, 4, 8}) check_all<float>(ut::c2_cases(P));
}

TEST_CASE("C2 with every element size: double, bf16 stand-in, fp8 stand-in") {
  check_all<double>(ut::c2_cases(4));
  check_all<ut::bf16_t>(ut::c2_cases(4));
  check_all<ut::fp8_t>(ut::c2_cases(2));
}

TEST_CASE("C3: S=7 over P=2 round-trips and the head-sharded tensor holds exactly 7 tokens") {
  check_all<float>(ut::c3_cases());
  Plan plan({2, 1}, 2, SeqPartition::balanced(7, 2), {TensorSpec::of<float>(HeadPartition::even(4, 2), 8)});
  CHECK(plan.seq_layout(0).extent[1] == 3);
  CHECK(plan.head_layout(0).extent[1] == 7);
  CHECK(plan.head_bytes(0) == 2 * 7 * 2 * 8 * sizeof(float));
}

TEST_CASE("C4: head counts not divisible by P, balanced") {
  check_all<float>(ut::c4_cases(4));
  check_all<float>(ut::c4_cases(8));
}

TEST_CASE("C5: GQA with fewer kv heads than ranks: rank r receives kv head r/2, once") {
  check_all<float>({ut::c5_case()});
  check_all<ut::bf16_t>({ut::c5_case()});
}

TEST_CASE("C6: empty chunks complete and are exact") { check_all<float>(ut::c6_cases()); }

TEST_CASE("C7: a non-contiguous input view x[:, 4:12] is honoured") {
  LocalGroup g(2);
  std::string err[2];
  g.run([&](LocalGroup::Comm& comm) { err[comm.rank()] = ut::run_view_case<float>(comm, 2); });
  CHECK(err[0] == "");
  CHECK(err[1] == "");
}

TEST_CASE("C8: the gathered sequence is in (B, P, S_local) order for every b") { check_all<float>(ut::c8_cases()); }

TEST_CASE("zigzag sequence partitions (several chunks per rank)") {
  for (int P : {1, 2, 3, 4}) check_all<float>(ut::zigzag_cases(P));
}

TEST_CASE("models: every model and P in {1,2,4,8,16,32}: even planning verdict, q/k/v round trip") {
  for (const auto& m : ulysses_models::kModels)
    for (int P : {1, 2, 4, 8, 16, 32}) {
      const std::string name = m.name;
      CAPTURE(name);
      CAPTURE(P);
      const Errc want = ut::expected_even_error(m, P);
      if (want == Errc{}) {
        CHECK(run_local<ut::bf16_t>(ut::model_case(m, P, true)) == "");
      } else {
        try {
          (void)ut::model_case(m, P, true);
          FAIL("even planning must fail");
        } catch (const Error& e) {
          CHECK(e.code() == want);
        }
        CHECK(run_local<ut::bf16_t>(ut::model_case(m, P, false)) == "");
      }
    }
}

namespace {
struct Fixture {
  Plan plan{{1, 0}, 1, SeqPartition::even(4, 1), {TensorSpec::of<float>(HeadPartition::even(2, 1), 4)}};
  std::vector<float> in = std::vector<float>(32), out = std::vector<float>(32);
  std::vector<std::byte> ws = std::vector<std::byte>(plan.workspace_bytes() + 64);
  Errc code_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.code();
    }
    return Errc{};
  }
};
}  // namespace

TEST_CASE_FIXTURE(Fixture, "argument errors are raised before the exchange, with their codes") {
  LocalGroup g(1);
  auto comm = g.comm(0);
  HostExecutor ex;
  Workspace w{ws.data(), ws.size()};
  CHECK(code_of([&] { seq_to_head(plan, comm, ex, in.data(), out.data(), w); }) == Errc{});
  CHECK(code_of([&] { seq_to_head(plan, comm, ex, {in.data(), in.data()}, {out.data()}, w); }) == Errc::wrong_tensor_count);
  CHECK(code_of([&] { seq_to_head(plan, comm, ex, in.data(), out.data(), Workspace{ws.data(), 0}); }) ==
        (plan.workspace_bytes() ? Errc::workspace_too_small : Errc{}));
  CHECK(code_of([&] { seq_to_head(plan, comm, ex, in.data(), in.data(), w); }) == Errc::buffer_overlap);
  CHECK(code_of([&] { seq_to_head(plan, comm, ex, in.data(), in.data() + 31, w); }) == Errc::buffer_overlap);
  CHECK(code_of([&] {
          seq_to_head(plan, comm, ex, {static_cast<const void*>(in.data())},
                      {static_cast<void*>(reinterpret_cast<std::byte*>(out.data()) + 1)}, w);
        }) == Errc::misaligned);
  CHECK(code_of([&] { seq_to_head(plan, comm, ex, in.data(), static_cast<float*>(nullptr), w); }) == Errc::invalid_shape);
  double* dbl = nullptr;
  CHECK(code_of([&] { seq_to_head(plan, comm, ex, dbl, dbl, w); }) == Errc::invalid_shape);
  LocalGroup g2(2);
  auto other = g2.comm(1);
  CHECK(code_of([&] { seq_to_head(plan, other, ex, in.data(), out.data(), w); }) == Errc::comm_mismatch);
}

TEST_CASE("a larger plan's workspace is the send region (256-aligned) plus the receive region") {
  // P=4, B=1, S=8 (2 tokens a rank), one float tensor H=4, D=2: each peer chunk 2*1*2*4 = 16 bytes.
  Plan plan({4, 2}, 1, SeqPartition::even(8, 4), {TensorSpec::of<float>(HeadPartition::even(4, 4), 2)});
  const auto& s = plan.schedule(Direction::seq_to_head);
  CHECK(s.send_bytes == std::vector<std::size_t>{16, 16, 0, 16});
  CHECK(s.send_offsets == std::vector<std::size_t>{0, 16, 32, 32});
  CHECK(plan.recv_region_offset() == 256);
  CHECK(plan.workspace_bytes() == 256 + 48);
}
