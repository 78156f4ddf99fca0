// SPDX-License-Identifier: Apache-2.0
// redistribute.hpp: seq_to_head / head_to_seq on the in-process group, every shared fault case
// (C1–C8) and every model, bit for bit; argument errors with their codes.
#include <chrono>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <doctest/doctest.h>
#include <ulysses/compat/v0_1.hpp>  // make_buffers: the deprecated name is tested too

#include "cases.hpp"
#include "expect_error.hpp"

using namespace ulysses;

namespace {

/// Runs case c on a fresh in-process group of c.P ranks; returns every rank's failures.
template <class T>
std::string run_local(const ut::Case& c, bool pull = false) {
  LocalGroup g(c.P);
  std::vector<std::string> err(static_cast<std::size_t>(c.P));
  g.spawn([&](LocalGroup::Comm& comm) {
    err[static_cast<std::size_t>(comm.rank())] = ut::with_direct_form(comm, pull, [&](auto& cm) { return ut::run_case<T>(cm, c); });
  });
  std::string all;
  for (auto& e : err) all += e.empty() ? "" : e + "\n";
  return all;
}

/// Runs every case on every transport of the in-process group: direct (each rank copies from its
/// peers' inputs, seq→head pushed into the peers' outputs: the default; and pulled, as across
/// processes), one message per (peer, tensor), one all-to-all-v of the wire.
template <class T>
void check_all(const std::vector<ut::Case>& cases) {
  for (auto c : cases)
    for (Path path : ut::host_paths<LocalGroup::Comm>())
      for (bool pull : {false, true}) {
        if (pull && path != Path::direct) continue;
        c.path = path;
        const std::string via = to_string(path) + std::string(pull ? " (pull)" : "");
        CAPTURE(c.name);
        CAPTURE(via);
        CHECK(run_local<T>(c, pull) == "");
      }
}

}  // namespace

TEST_CASE("C1: batch > 1 keeps tokens of each sequence apart (literal values, bshd)") {
  // B=2, S=4 over P=2, H=4, D=1, x[b][s][h] = (b*4 + s)*4 + h. Rank r must hold
  // out[b][s][j] = x[b][s][2r + j].
  const int P = 2;
  LocalGroup g(P);
  std::vector<std::vector<float>> out(P);
  g.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    Plan plan({P, r}, 2, SeqPartition::even(4, P), {TensorSpec::of<float>(HeadPartition::even(4, P), 1)});
    std::vector<float> in;
    for (int b = 0; b < 2; ++b)
      for (int s = 0; s < 2; ++s)
        for (int h = 0; h < 4; ++h) in.push_back(static_cast<float>((b * 4 + 2 * r + s) * 4 + h));
    out[r].resize(16);
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    seq_to_head(plan, comm, ex, in, out[r], ws);
  });
  CHECK(out[0] == std::vector<float>{0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29});
  CHECK(out[1] == std::vector<float>{2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31});
}

namespace {
struct ChunkOnlyComm {  // a communicator with alltoallv only (no exchange_messages)
  int size() const { return 1; }
  int rank() const { return 0; }
  void alltoallv(const std::byte*, const std::size_t*, const std::size_t*, std::byte*, const std::size_t*, const std::size_t*) {}
};
struct MutableMessagesComm : ChunkOnlyComm {  // exchange_messages with non-const lists
  void exchange_messages(Message*, std::size_t, Message*, std::size_t) {}
};
}  // namespace

TEST_CASE("choose_path: the fewest copies the communicator and executor allow, or the path asked for") {
  auto plan = [](PlanOptions o) { return Plan({2, 0}, 1, SeqPartition::even(8, 2), {TensorSpec::of<float>(HeadPartition::even(4, 2), 2)}, Format::bshd, o); };
  CHECK(has_exchange_messages_v<LocalGroup::Comm>);
  CHECK(!has_exchange_messages_v<ChunkOnlyComm>);
  CHECK(has_exchange_messages_v<MutableMessagesComm>);
  CHECK(PathSupport<LocalGroup::Comm, HostExecutor>::direct);
  CHECK(!PathSupport<MutableMessagesComm, HostExecutor>::direct);
  CHECK(choose_path<LocalGroup::Comm, HostExecutor>(plan({})) == Path::direct);
  // in-process ranks push seq→head into their peers' outputs; a communicator that does not say
  // its ranks share one address space (as across processes) gets the pull
  CHECK(comm_traits<LocalGroup::Comm>::one_address_space);
  CHECK(PeerCopyTransport::pushes<LocalGroup::Comm, HostExecutor>);
  CHECK(!comm_traits<ut::PullingComm>::one_address_space);
  CHECK(!PeerCopyTransport::pushes<ut::PullingComm, HostExecutor>);
  CHECK(choose_path<ut::PullingComm, HostExecutor>(plan({})) == Path::direct);
  CHECK(choose_path<MutableMessagesComm, HostExecutor>(plan({})) == Path::messages);
  CHECK(choose_path<ChunkOnlyComm, HostExecutor>(plan({})) == Path::alltoallv);
  CHECK(choose_path<MutableMessagesComm, HostExecutor>(plan(PlanOptions{1, false})) == Path::alltoallv);  // in_place_messages off
  CHECK(choose_path<LocalGroup::Comm, HostExecutor>(plan(PlanOptions{1, true, Path::messages})) == Path::messages);
  CHECK(uses_pieces<LocalGroup::Comm, HostExecutor>(plan(PlanOptions{1, true, Path::messages})));
  CHECK(!uses_pieces<LocalGroup::Comm, HostExecutor>(plan({})));
  CHECK(ut::code_of([&] { choose_path<ChunkOnlyComm, HostExecutor>(plan(PlanOptions{1, true, Path::direct})); }) == Errc::path_unsupported);
  CHECK(ut::code_of([&] { choose_path<ChunkOnlyComm, HostExecutor>(plan(PlanOptions{1, true, Path::messages})); }) == Errc::path_unsupported);
  CHECK(std::string(to_string(Path::direct)) == "direct");
}

TEST_CASE("copies per element per direction: direct 1, messages 1 (bshd: received in place), alltoallv (2P-1)/P") {
  // Llama-3.1-8B q, k, v at P=4, bshd, B=1 (seq→head receives in place on the message path) and B=4.
  for (std::int64_t B : {1, 4}) {
    const auto a = attention_specs<float>(4, {32, 8, 128});
    Plan plan({4, 1}, B, SeqPartition::even(64, 4), a.qkv());
    const CopyCount all = plan.copies(Direction::seq_to_head, Path::alltoallv), msg = plan.copies(Direction::seq_to_head, Path::messages),
                    dir = plan.copies(Direction::seq_to_head, Path::direct);
    CHECK(all.executor == doctest::Approx(7.0 / 4));  // pack 3/4 + unpack 1
    CHECK(all.transport == doctest::Approx(3.0 / 4));
    CHECK(msg.executor == doctest::Approx(1.0));  // the unpack goes away (received in place, one piece per batch index)
    CHECK(dir.executor == 1.0);
    CHECK(dir.transport == 0.0);
    const CopyCount back = plan.copies(Direction::head_to_seq, Path::messages);  // sent in place, unpacked
    CHECK(back.executor == doctest::Approx(1.0));
  }
}

TEST_CASE("the message-level stages run one by one give C1's literal values (seq→head in place)") {
  // C1's shapes with B=1: x[s][h] = 4*s + h; rank r holds heads 2r, 2r+1 of all 4 tokens.
  const int P = 2;
  LocalGroup g(P);
  std::vector<std::vector<float>> out(P);
  std::vector<std::size_t> staged_unpack(P);
  g.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    Plan plan({P, r}, 1, SeqPartition::even(4, P), {TensorSpec::of<float>(HeadPartition::even(4, P), 1)});
    std::vector<float> in;
    for (int s = 0; s < 2; ++s)
      for (int h = 0; h < 4; ++h) in.push_back(static_cast<float>(4 * (2 * r + s) + h));
    out[r].assign(8, -1.f);
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    const BufferTable t = make_buffers(plan, Direction::seq_to_head, {in}, {out[r]}, ws);
    pack_pieces(plan, Direction::seq_to_head, ex, t);
    exchange_pieces(plan, Direction::seq_to_head, comm, t);
    unpack_pieces(plan, Direction::seq_to_head, ex, t);
    staged_unpack[r] = plan.stage_lists(Direction::seq_to_head).unpack_staged.size();
  });
  CHECK(out[0] == std::vector<float>{0, 1, 4, 5, 8, 9, 12, 13});
  CHECK(out[1] == std::vector<float>{2, 3, 6, 7, 10, 11, 14, 15});
  CHECK(staged_unpack == std::vector<std::size_t>{1, 1});  // the own chunk only: the peer's landed in place
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

TEST_CASE("direct path: seq→head pushed in token tiles, chunks longer than one tile (zigzag, GQA, B=2, strided views)") {
  // H=8 heads of D=64 floats at B=2: 4 KiB a token, a tile of 16 tokens (kPushTileBytes); the
  // chunks hold 50-101 tokens, so every chunk spans several tiles and ends in a partial one.
  static_assert(detail::kPushTileBytes == 64 << 10, "the token counts below assume 64 KiB tiles");
  std::vector<ut::Case> cases;
  for (int P : {2, 3, 4}) {
    auto q = HeadPartition::balanced(8, P);
    auto kv = HeadPartition::gqa(q, 2);
    cases.push_back({"contiguous P=" + std::to_string(P), P, 2, SeqPartition::balanced(101 * P - 1, P), {{q, 64}, {kv, 64}}, Format::bshd});
    cases.push_back({"zigzag P=" + std::to_string(P), P, 2, SeqPartition::zigzag(100 * P + 3, P), {{q, 64}, {kv, 32}}, Format::sbhd});
    ut::Case padded{"padded P=" + std::to_string(P), P, 2, SeqPartition::balanced(70 * P, P), {{q, 64}}, Format::bshd};
    padded.padded = true;
    cases.push_back(padded);
  }
  check_all<float>(cases);
}

TEST_CASE("C7: a non-contiguous input view x[:, 4:12] is honoured") {
  LocalGroup g(2);
  std::string err[2];
  g.spawn([&](LocalGroup::Comm& comm) { err[comm.rank()] = ut::run_view_case<float>(comm, 2); });
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
  static Errc code_of(const std::function<void()>& f) { return ut::code_of(f); }
};
}  // namespace

TEST_CASE_FIXTURE(Fixture, "argument errors are raised before the exchange, with their codes") {
  LocalGroup g(1);
  auto comm = g.comm(0);
  HostExecutor ex;
  Workspace w{ws.data(), ws.size()};
  auto at = [](std::vector<float>& v, std::size_t i) { return ByteSpan{v.data() + i, (v.size() - i) * sizeof(float)}; };
  CHECK(code_of([&] { seq_to_head(plan, comm, ex, in, out, w); }) == Errc{});
  CHECK(code_of([&] { seq_to_head(plan, comm, ex, {in, in}, {out}, w); }) == Errc::wrong_tensor_count);
  CHECK(code_of([&] { seq_to_head(plan, comm, ex, in, out, Workspace{ws.data(), 0}); }) ==
        (plan.workspace_bytes() ? Errc::workspace_too_small : Errc{}));
  CHECK(code_of([&] { seq_to_head(plan, comm, ex, in, in, w); }) == Errc::buffer_overlap);
  CHECK(code_of([&] { seq_to_head(plan, comm, ex, in, ByteSpan{in.data() + 31, 32 * sizeof(float)}, w); }) == Errc::buffer_overlap);
  CHECK(code_of([&] {
          seq_to_head(plan, comm, ex, in, ByteSpan{reinterpret_cast<std::byte*>(out.data()) + 1, 32 * sizeof(float)}, w);
        }) == Errc::misaligned);
  CHECK(code_of([&] { seq_to_head(plan, comm, ex, in, ByteSpan{nullptr, 32 * sizeof(float)}, w); }) == Errc::invalid_shape);
  LocalGroup g2(2);
  auto other = g2.comm(1);
  CHECK(code_of([&] { seq_to_head(plan, other, ex, in, out, w); }) == Errc::comm_mismatch);
  // Buffers shorter than their layouts: the message names the tensor, the bytes given and needed.
  auto [code, msg] = ut::error_of([&] { seq_to_head(plan, comm, ex, in, at(out, 1), w); });
  CHECK(code == Errc::buffer_too_small);
  CHECK(msg.find("output 0") != std::string::npos);
  CHECK(msg.find("124 bytes") != std::string::npos);
  CHECK(msg.find("needs 128 bytes") != std::string::npos);
  CHECK(code_of([&] { seq_to_head(plan, comm, ex, ConstByteSpan{in.data(), 64}, out, w); }) == Errc::buffer_too_small);
  CHECK(code_of([&] { seq_to_head(plan, comm, ex, ConstByteSpan{nullptr, 0}, out, w); }) == Errc::buffer_too_small);
}

TEST_CASE_FIXTURE(Fixture, "a tensor given as a range of another element size (std::vector<double> for float32) is tensor_mismatch before anything moves; bytes, (pointer, bytes), the same size and an opaque element's divisor pass with the same bits (new user's report)") {
  LocalGroup g(1);
  auto comm = g.comm(0);
  HostExecutor ex;
  Workspace w{ws.data(), ws.size()};
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) + 0.5f;
  seq_to_head(plan, comm, ex, in, out, w);
  const std::vector<float> want = out;
  std::vector<double> din(16), dout(16);  // the plan's 128 bytes, as doubles
  auto [code, msg] = ut::error_of([&] { seq_to_head(plan, comm, ex, din, out, w); });
  CHECK(code == Errc::tensor_mismatch);
  CHECK(msg.find("input 0 (tensor 0, seq-sharded) was given as a range of 8-byte elements; the tensor's are 4-byte float32") !=
        std::string::npos);
  std::fill(out.begin(), out.end(), -1.0f);
  CHECK(ut::error_of([&] { seq_to_head(plan, comm, ex, in, dout, w); }).second.find("output 0") != std::string::npos);
  CHECK(ut::code_of([&] { head_to_seq(plan, comm, ex, in, dout, w); }) == Errc::tensor_mismatch);
  CHECK(ut::code_of([&] { seq_to_head(plan, comm, ex, TensorList<ConstByteSpan>{in}, TensorList<ByteSpan>{span_from(dout, 0)}, w); }) ==
        Errc::tensor_mismatch);
  std::vector<std::uint16_t> half(64);
  CHECK(ut::code_of([&] { seq_to_head(plan, comm, ex, half, out, w); }) == Errc::tensor_mismatch);
  CHECK(out == std::vector<float>(32, -1.0f));  // nothing written by the refused calls
  // bytes: a std::vector<std::byte>, or (pointer, bytes) of the doubles' memory
  std::vector<std::byte> raw(128);
  std::memcpy(raw.data(), in.data(), 128);
  CHECK(ut::code_of([&] { seq_to_head(plan, comm, ex, raw, out, w); }) == Errc{});
  CHECK(out == want);
  std::memcpy(din.data(), in.data(), 128);
  std::fill(out.begin(), out.end(), -1.0f);
  CHECK(ut::code_of([&] { seq_to_head(plan, comm, ex, ConstByteSpan(din.data(), 128), out, w); }) == Errc{});
  CHECK(out == want);
  // an opaque 12-byte element held in a range of floats (a divisor) passes; in doubles it does not
  struct Vec3 {
    float x, y, z;
  };
  Plan p3{{1, 0}, 1, SeqPartition::even(4, 1), {TensorSpec::of<Vec3>(HeadPartition::even(2, 1), 4)}};
  std::vector<float> a(96), b(96, -1.0f);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  std::vector<std::byte> w3(p3.workspace_bytes() + 64);
  CHECK(ut::code_of([&] { seq_to_head(p3, comm, ex, a, b, Workspace{w3.data(), w3.size()}); }) == Errc{});
  CHECK(b == a);  // one rank: the layouts coincide
  std::vector<double> a8(48);
  CHECK(ut::code_of([&] { seq_to_head(p3, comm, ex, a8, b, Workspace{w3.data(), w3.size()}); }) == Errc::tensor_mismatch);
}

TEST_CASE("a null workspace that the path needs is invalid_shape, as a null tensor is (its size was enough: not workspace_too_small), and its peer gets aborted; a short one is workspace_too_small (new user's report)") {
  const int P = 2;
  for (int fault = 0; fault < 3; ++fault) {  // null with enough bytes, short, none
    CAPTURE(fault);
    LocalGroup g(P, std::chrono::seconds(20));
    std::vector<std::pair<Errc, std::string>> errs(P);
    const auto t0 = std::chrono::steady_clock::now();
    g.spawn([&](LocalGroup::Comm& comm) {
      const int r = comm.rank();
      PlanOptions o;
      o.path = Path::alltoallv;
      const Plan plan{{P, r}, 1, SeqPartition::even(4, P), {TensorSpec::of<float>(HeadPartition::even(2, P), 4)}, Format::bshd, o};
      REQUIRE(plan.workspace_bytes() > 0);
      HostExecutor ex;
      std::vector<float> in(plan.seq_bytes(0) / 4), out(plan.head_bytes(0) / 4);
      std::vector<std::byte> ws(plan.workspace_bytes());
      Workspace w{ws.data(), ws.size()};
      if (r == 0) w = fault == 0 ? Workspace{nullptr, ws.size()} : fault == 1 ? Workspace{ws.data(), ws.size() - 1} : Workspace{nullptr, 0};
      errs[static_cast<std::size_t>(r)] = ut::error_of([&] { seq_to_head(plan, comm, ex, in, out, w); });
    });
    CHECK(errs[0].first == (fault == 0 ? Errc::invalid_shape : Errc::workspace_too_small));
    if (fault == 0) CHECK(errs[0].second.find("the workspace is null but holds") != std::string::npos);
    CHECK(errs[1].first == Errc::aborted);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));  // the peer heard at once (its deadline is 20 s)
  }
}

TEST_CASE("q, k, v carved from one arena and passed in the wrong order (q and k of different sizes): buffer_too_small naming the tensor") {
  // GQA H=4, Hkv=2, P=2, B=1, S=4, D=4 float: q needs 128 bytes a rank, k and v 64. A user who
  // passes {k, q, v} gives tensor 0 (q) the 64 bytes of k: refused before anything moves.
  LocalGroup g(2);
  std::vector<std::string> msg(2);
  g.spawn([&](LocalGroup::Comm& comm) {
    const auto a = attention_specs<float>(2, {4, 2, 4});
    Plan plan({2, comm.rank()}, 1, SeqPartition::even(4, 2), a.qkv());
    std::vector<float> arena((plan.seq_bytes(0) + plan.seq_bytes(1) + plan.seq_bytes(2)) / 4);
    const ConstByteSpan q{arena.data(), plan.seq_bytes(0)}, k{arena.data() + 32, plan.seq_bytes(1)},
        v{arena.data() + 48, plan.seq_bytes(2)};
    std::vector<float> q2(plan.head_bytes(0) / 4), k2(plan.head_bytes(1) / 4), v2(plan.head_bytes(2) / 4);
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    try {
      seq_to_head(plan, comm, ex, {k, q, v}, {q2, k2, v2}, ws);
    } catch (const Error& e) {
      if (e.code() == Errc::buffer_too_small) msg[comm.rank()] = e.what();
    }
  });
  for (const auto& m : msg) {
    CAPTURE(m);
    CHECK(m.find("input 0 (tensor 0, seq-sharded) holds 64 bytes") != std::string::npos);
    CHECK(m.find("needs 128 bytes") != std::string::npos);
  }
}

TEST_CASE("one rank's refused call (an output one element short) aborts the in-process group: its peers get aborted at once, not a timeout") {
  // A timeout of 10 minutes: Errc::timeout would mean the peers waited it out (ctest ends the test first).
  LocalGroup g(4, std::chrono::minutes(10));
  std::vector<Errc> code(4, Errc{});
  std::vector<std::string> msg(4);
  g.spawn([&](LocalGroup::Comm& comm) {
    const int P = 4, r = comm.rank();
    Plan plan({P, r}, 1, SeqPartition::even(8, P), {TensorSpec::of<float>(HeadPartition::even(4, P), 2)});
    std::vector<float> in(plan.seq_bytes(0) / 4), out(plan.head_bytes(0) / 4 - (r == 2 ? 1 : 0));
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    try {
      seq_to_head(plan, comm, ex, in, out, ws);
    } catch (const Error& e) {
      code[static_cast<std::size_t>(r)] = e.code();
      msg[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    CAPTURE(msg[static_cast<std::size_t>(r)]);
    CHECK(code[static_cast<std::size_t>(r)] == (r == 2 ? Errc::buffer_too_small : Errc::aborted));
    if (r != 2) CHECK(msg[static_cast<std::size_t>(r)].find("rank 2 failed in seq_to_head with ulysses: buffer_too_small") != std::string::npos);
  }
}

TEST_CASE("a larger plan's workspace is the send region (256-aligned) plus the receive region") {
  // P=4, B=1, S=8 (2 tokens a rank), one float tensor H=4, D=2: each peer chunk 2*1*2*4 = 16 bytes.
  Plan plan({4, 2}, 1, SeqPartition::even(8, 4), {TensorSpec::of<float>(HeadPartition::even(4, 4), 2)});
  const auto& s = plan.stage_lists(Direction::seq_to_head);
  CHECK(s.send_bytes == std::vector<std::size_t>{16, 16, 0, 16});
  CHECK(s.send_offsets == std::vector<std::size_t>{0, 16, 32, 32});
  CHECK(plan.recv_region_offset() == 256);
  CHECK(plan.workspace_bytes() == 256 + 48);
}

TEST_CASE("cross-rank agreement (on by default, every build): a rank that planned another wire makes EVERY rank throw, naming it and the field") {
  const int P = 4;
  struct Variant {
    const char* what;   // the field agreement_field() names
    std::function<Plan(int)> make;  // rank → its plan; rank 2 differs
  };
  auto q = HeadPartition::even(8, P);
  auto kv = HeadPartition::gqa(q, 2);  // kv head 0 on ranks 0, 1; kv head 1 on ranks 2, 3
  const std::vector<Variant> variants = {
      {"the sequence length S", [&](int r) { return Plan({P, r}, 1, SeqPartition::even(r == 2 ? 12 : 8, P), {TensorSpec::of<float>(q, 4)}); }},
      {"the head partition of tensor 0", [&](int r) { return Plan({P, r}, 1, SeqPartition::even(8, P), {TensorSpec::of<float>(HeadPartition::even(r == 2 ? 4 : 8, P), 4)}); }},
      {"the rows of tensor 0: head dim, element size, row transforms and wire (rank 2: D=4, 8-byte elements; rank 0: D=4, 4-byte elements)", [&](int r) { return Plan({P, r}, 1, SeqPartition::even(8, P), {r == 2 ? TensorSpec::of<double>(q, 4) : TensorSpec::of<float>(q, 4)}); }},
      {"the sequence partition", [&](int r) { return Plan({P, r}, 1, r == 2 ? SeqPartition::lengths(8, P, {3, 1, 2, 2}) : SeqPartition::even(8, P), {TensorSpec::of<float>(q, 4)}); }},
      {"the number of stages K", [&](int r) { return Plan({P, r}, 1, SeqPartition::even(8, P), {TensorSpec::of<float>(q, 4)}, Format::bshd, PlanOptions{r == 2 ? 2 : 1}); }},
      {"the path and stage options (PlanOptions::path, in_place_messages, head_bands)", [&](int r) { return Plan({P, r}, 1, SeqPartition::even(8, P), {TensorSpec::of<float>(q, 4)}, Format::bshd, PlanOptions{1, r != 2}); }},
      {"the head partition of tensor 0", [&](int r) { return Plan({P, r}, 1, SeqPartition::even(8, P), {TensorSpec::of<float>(r == 2 ? HeadPartition::ranges(8, {{0, 3}, {3, 4}, {4, 6}, {6, 8}}) : q, 4)}); }},
      {"the replica handling (Replicas, element type) of tensor 1", [&](int r) {
         return Plan({P, r}, 1, SeqPartition::even(8, P), {TensorSpec::of<float>(q, 4), TensorSpec::of<float>(kv, 4).with_replicas(r == 2 ? Replicas::owner : Replicas::sum)});
       }},
      {"the number of tensors", [&](int r) {
         std::vector<TensorSpec> t{TensorSpec::of<float>(q, 4)};
         if (r == 2) t.push_back(TensorSpec::of<float>(kv, 4));
         return Plan({P, r}, 1, SeqPartition::even(8, P), t);
       }},
  };
  for (const auto& v : variants) {
    const std::string what = v.what;
    CAPTURE(what);
    LocalGroup g(P);
    std::vector<std::string> msg(P);
    std::vector<Errc> code(P, Errc{});
    g.spawn([&](LocalGroup::Comm& comm) {
      Plan plan = v.make(comm.rank());
      REQUIRE(plan.agreement_check_enabled());  // the default
      TensorList<ConstByteSpan> in;
      TensorList<ByteSpan> out;
      std::vector<std::vector<std::byte>> bufs;
      for (int t = 0; t < plan.num_tensors(); ++t) bufs.emplace_back(plan.seq_bytes(t)), bufs.emplace_back(plan.head_bytes(t));
      for (int t = 0; t < plan.num_tensors(); ++t) in.push_back(bufs[2 * t]), out.push_back(bufs[2 * t + 1]);
      std::vector<std::byte> ws(plan.workspace_bytes());
      HostExecutor ex;
      try {
        seq_to_head(plan, comm, ex, in, out, ws);
      } catch (const Error& e) {
        code[comm.rank()] = e.code();
        msg[comm.rank()] = e.what();
      }
    });
    for (int r = 0; r < P; ++r) {
      CAPTURE(msg[r]);
      CHECK(code[r] == Errc::plan_mismatch);
      CHECK(msg[r].find("ranks {2}") != std::string::npos);
      CHECK(msg[r].find("rank 2 differs from rank 0 in " + what) != std::string::npos);
    }
  }
}

TEST_CASE("cross-rank agreement ignores what is a rank's own business: bshd next to sbhd next to a strided view, exact") {
  // Rank 0 holds bshd, rank 1 sbhd, rank 2 bhsd, rank 3 a padded view: the wire is the same, the
  // check passes, and every rank gets its exact slice (the debug-only check used to refuse this).
  const int P = 4;
  const std::int64_t B = 2, S = 8, H = 4, D = 3;
  auto hp = HeadPartition::even(H, P);
  LocalGroup g(P);
  std::vector<std::string> err(P);
  g.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    const std::int64_t L = S / P;
    auto spec = TensorSpec::of<float>(hp, D);
    if (r == 3) spec.with_seq_layout(Layout::strided({B, L, H, D}, {L * H * 5, H * 5, 5, 1}));  // rows padded to 5
    Plan plan({P, r}, B, SeqPartition::even(S, P), {spec}, r == 0 ? Format::bshd : r == 1 ? Format::sbhd : Format::bhsd);
    const Layout& sl = plan.seq_layout(0);
    std::vector<float> x(plan.seq_bytes(0) / 4, -1.f), y(plan.head_bytes(0) / 4), back(x.size(), -1.f);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t s = 0; s < L; ++s)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t d = 0; d < D; ++d)
            x[static_cast<std::size_t>(sl.offset(b, s, h, d))] = static_cast<float>(((b * S + r * L + s) * H + h) * D + d);
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    seq_to_head(plan, comm, ex, x, y, ws);
    const Layout& hl = plan.head_layout(0);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t h = 0; h < hl.extent[2]; ++h)
          for (std::int64_t d = 0; d < D; ++d)
            if (y[static_cast<std::size_t>(hl.offset(b, s, h, d))] != static_cast<float>(((b * S + s) * H + hp.begin(r) + h) * D + d))
              err[r] = "wrong element";
    head_to_seq(plan, comm, ex, y, back, ws);
    if (back != x) err[r] += " round trip differs";
    if (!plan.agreement_checked()) err[r] += " not checked";
  });
  for (int r = 0; r < P; ++r) CHECK(err[r] == "");
}

TEST_CASE("C9: ranks that planned different head splits throw plan_mismatch on every rank, with default options") {
  // P=2, H=3, S=4, D=2, B=1, fp32. Rank 0 splits [2,1]; rank 1 [1,2], [0,3] or [3,0]. Before the
  // fix: output elements never written, a hang, a truncation error. Now: one verdict, no data moved.
  const std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> rank1 = {
      {{0, 1}, {1, 3}}, {{0, 0}, {0, 3}}, {{0, 3}, {3, 3}}};
  for (const auto& other : rank1) {
    LocalGroup g(2);
    std::vector<std::string> msg(2);
    std::vector<Errc> code(2, Errc{});
    std::vector<std::vector<float>> out(2);
    g.spawn([&](LocalGroup::Comm& comm) {
      const int r = comm.rank();
      const auto heads = r == 0 ? HeadPartition::ranges(3, {{0, 2}, {2, 3}}) : HeadPartition::ranges(3, other);
      Plan plan({2, r}, 1, SeqPartition::even(4, 2), {TensorSpec::of<float>(heads, 2)});
      std::vector<float> in(plan.seq_bytes(0) / 4, 1.f);
      out[r].assign(plan.head_bytes(0) / 4, -7.f);
      std::vector<std::byte> ws(plan.workspace_bytes());
      HostExecutor ex;
      try {
        seq_to_head(plan, comm, ex, in, out[r], ws);
      } catch (const Error& e) {
        code[r] = e.code();
        msg[r] = e.what();
      }
    });
    for (int r = 0; r < 2; ++r) {
      CAPTURE(msg[r]);
      CHECK(code[r] == Errc::plan_mismatch);
      CHECK(msg[r].find("ranks {1}") != std::string::npos);
      CHECK(msg[r].find("the head partition of tensor 0") != std::string::npos);
      for (float v : out[r]) CHECK(v == -7.f);  // nothing arrived
    }
  }
}

TEST_CASE("cross-rank agreement passes once for identical plans, and is off when asked") {
  LocalGroup g(2);
  std::vector<int> checked(2, 0);
  g.spawn([&](LocalGroup::Comm& comm) {
    Plan plan({2, comm.rank()}, 1, SeqPartition::even(4, 2), {TensorSpec::of<float>(HeadPartition::even(2, 2), 4)});
    std::vector<float> in(plan.seq_bytes(0) / sizeof(float)), out(plan.head_bytes(0) / sizeof(float));
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    seq_to_head(plan, comm, ex, in, out, ws);
    checked[comm.rank()] = plan.agreement_checked();
  });
  CHECK(checked == std::vector<int>{1, 1});
  Plan off({1, 0}, 1, SeqPartition::even(4, 1), {TensorSpec::of<float>(HeadPartition::even(2, 1), 4)});
  CHECK(off.agreement_check_enabled());
  off.set_agreement_check(false);
  CHECK_FALSE(off.agreement_check_enabled());
}

namespace {
/// A communicator with alltoallv only: check_agreement() all-gathers through it.
struct AlltoallvOnly {
  LocalGroup::Comm c;
  int size() const { return c.size(); }
  int rank() const { return c.rank(); }
  void alltoallv(const std::byte* s, const std::size_t* sb, const std::size_t* so, std::byte* r, const std::size_t* rb,
                 const std::size_t* ro) {
    c.alltoallv(s, sb, so, r, rb, ro);
  }
};
}  // namespace

TEST_CASE("cross-rank agreement through alltoallv when the communicator has no allgather") {
  LocalGroup g(3);
  std::vector<Errc> code(3, Errc{});
  g.spawn([&](LocalGroup::Comm& comm) {
    AlltoallvOnly c{comm};
    Plan plan({3, comm.rank()}, 1, SeqPartition::even(comm.rank() == 1 ? 6 : 3, 3), {TensorSpec::of<float>(HeadPartition::even(3, 3), 2)});
    code[comm.rank()] = ut::code_of([&] { check_agreement(plan, c); });
  });
  CHECK(code == std::vector<Errc>(3, Errc::plan_mismatch));
}

namespace {
/// A 16-byte element (e.g. a complex<double> or a packed quartet of fp32).
struct u128_t {
  std::uint64_t lo, hi;
};

/// Special-value patterns of each element size, indexed by a position code.
template <class T>
T special(std::uint64_t code) {
  T v{};
  if constexpr (sizeof(T) == 1) {
    const auto b = static_cast<std::uint8_t>(code);  // all 256 patterns
    std::memcpy(&v, &b, 1);
  } else if constexpr (sizeof(T) == 2) {
    const auto b = static_cast<std::uint16_t>(code);  // all 65536 patterns (bf16/fp16 NaNs, -0, subnormals)
    std::memcpy(&v, &b, 2);
  } else if constexpr (sizeof(T) == 4) {
    static const std::uint32_t pat[] = {0x7fc00000u, 0x7fc00001u, 0xffc12345u, 0x7f800001u /*sNaN*/, 0x80000000u /*-0*/,
                                        0x00000001u /*min subnormal*/, 0x807fffffu, 0x7f800000u, 0xff800000u, 0x3f800000u};
    const std::uint32_t b = code % 16 < 10 ? pat[code % 16] : static_cast<std::uint32_t>(code * 2654435761u);
    std::memcpy(&v, &b, 4);
  } else if constexpr (sizeof(T) == 8) {
    static const std::uint64_t pat[] = {0x7ff8000000000000ull, 0x7ff0000000000001ull /*sNaN*/, 0xfff8dead0000beefull,
                                        0x8000000000000000ull /*-0*/, 0x0000000000000001ull, 0x800fffffffffffffull};
    const std::uint64_t b = code % 8 < 6 ? pat[code % 8] : code * 0x9E3779B97F4A7C15ull;
    std::memcpy(&v, &b, 8);
  } else {
    const u128_t b{code * 0x9E3779B97F4A7C15ull, ~code};
    std::memcpy(&v, &b, sizeof b);
  }
  return v;
}

template <class T>
std::string run_special(const ut::Case& c) {
  LocalGroup g(c.P);
  std::vector<std::string> err(static_cast<std::size_t>(c.P));
  g.spawn([&](LocalGroup::Comm& comm) { err[comm.rank()] = ut::run_case<T>(comm, c, HostExecutor{}, special<T>); });
  std::string all;
  for (auto& e : err) all += e;
  return all;
}
}  // namespace

TEST_CASE("special values: NaN payloads, -0.0, subnormals and every 1- and 2-byte pattern stay bit-exact") {
  // 1 x 256 x 4 x 64 = 65536 elements per tensor: every 2-byte pattern appears once.
  auto q = HeadPartition::even(4, 4);
  ut::Case c{"special", 4, 1, SeqPartition::even(256, 4), {{q, 64}, {HeadPartition::gqa(q, 2), 64}}, Format::sbhd};
  c.replicas = Replicas::owner;  // data movement only (sums of special values: test_copy.cpp)
  CHECK(run_special<std::uint8_t>(c) == "");
  CHECK(run_special<std::uint16_t>(c) == "");
  CHECK(run_special<float>(c) == "");
  CHECK(run_special<double>(c) == "");
  CHECK(run_special<u128_t>(c) == "");
}

TEST_CASE("bad input matrix: each bad input gets its own error code") {
  auto code = ut::code_of;
  auto hp = HeadPartition::even(4, 2);
  // zero or negative extents
  CHECK(code([] { SeqPartition::even(0, 2); }) == Errc::invalid_shape);
  CHECK(code([] { SeqPartition::balanced(-3, 2); }) == Errc::invalid_shape);
  CHECK(code([] { HeadPartition::even(-4, 2); }) == Errc::invalid_shape);
  CHECK(code([&] { Plan({2, 0}, -1, SeqPartition::even(4, 2), {TensorSpec::of<float>(hp, 4)}); }) == Errc::invalid_shape);
  CHECK(code([&] { Plan({2, 0}, 1, SeqPartition::even(4, 2), {TensorSpec::of<float>(hp, -4)}); }) == Errc::invalid_shape);
  CHECK(code([&] {
          Plan({2, 0}, 1, SeqPartition::even(4, 2), {TensorSpec::of<float>(hp, 4).with_seq_layout(Layout::bshd(1, -2, 4, 4))});
        }) == Errc::layout_mismatch);
  // products that overflow int64
  CHECK(code([&] {
          Plan({2, 0}, std::int64_t(1) << 31, SeqPartition::even(std::int64_t(1) << 31, 2), {TensorSpec::of<float>(hp, 4)});
        }) == Errc::size_overflow);
  CHECK(code([&] {
          Plan({2, 0}, 1, SeqPartition::even(4, 2),
               {TensorSpec::of<float>(hp, 4).with_seq_layout(Layout::strided({1, 2, 4, 4}, {1, std::int64_t(1) << 62, 4, 1}))});
        }) == Errc::size_overflow);
  // aliasing strides
  CHECK(code([&] {
          Plan({2, 0}, 1, SeqPartition::even(4, 2), {TensorSpec::of<float>(hp, 4).with_seq_layout(Layout::strided({1, 2, 4, 4}, {0, 4, 4, 1}))});
        }) == Errc::layout_aliasing);
  // sequence lengths that do not sum to S; impossible GQA mapping
  CHECK(code([] { SeqPartition::lengths(8, 2, {3, 4}); }) == Errc::seq_lengths_mismatch);
  CHECK(code([] { HeadPartition::gqa(HeadPartition::even(12, 4), 6); }) == Errc::gqa_group_mismatch);
  CHECK(code([] { HeadPartition::gqa(HeadPartition::even(12, 4), 5); }) == Errc::gqa_invalid);
  // call-time errors: see "argument errors are raised before the exchange" above (workspace,
  // overlap, misaligned, communicator size/rank, tensor count, null pointers).
}

TEST_CASE("pointers misaligned for vectors (but aligned for the element) take the narrow path and stay exact") {
  LocalGroup g(2);
  std::string err[2];
  g.spawn([&](LocalGroup::Comm& comm) {
    Plan plan({2, comm.rank()}, 2, SeqPartition::even(6, 2), {TensorSpec::of<float>(HeadPartition::even(4, 2), 5)});
    std::vector<float> in(plan.seq_bytes(0) / 4 + 1), out(plan.head_bytes(0) / 4 + 1), back(in.size());
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i * 7 + comm.rank());
    std::vector<std::byte> ws(plan.workspace_bytes() + 4);
    HostExecutor ex;
    const Workspace w{ws.data() + 4, plan.workspace_bytes()};
    seq_to_head(plan, comm, ex, ConstByteSpan{in.data() + 1, plan.seq_bytes(0)}, ByteSpan{out.data() + 1, plan.head_bytes(0)}, w);
    head_to_seq(plan, comm, ex, ConstByteSpan{out.data() + 1, plan.head_bytes(0)}, ByteSpan{back.data() + 1, plan.seq_bytes(0)}, w);
    if (!std::equal(in.begin() + 1, in.end(), back.begin() + 1)) err[comm.rank()] = "round trip differs";
  });
  CHECK(err[0] == "");
  CHECK(err[1] == "");
}

TEST_CASE("q, k, v as views of one fused [B, S, 3, H, D] buffer, both ways (forward and the dqkv backward)") {
  // P=2, B=2, S=6 (3 tokens a rank), H=4, D=3 float. Rank r's fused buffer holds its 3 tokens.
  const int P = 2;
  const std::int64_t B = 2, S = 6, L = 3, H = 4, D = 3;
  const Layout view = Layout::strided({B, L, H, D}, {L * 3 * H * D, 3 * H * D, D, 1});
  LocalGroup g(P);
  std::string err[P];
  g.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    auto hp = HeadPartition::even(H, P);
    std::vector<TensorSpec> specs(3, TensorSpec::of<float>(hp, D).with_seq_layout(view));
    Plan plan({P, r}, B, SeqPartition::even(S, P), specs);
    std::vector<float> fused(static_cast<std::size_t>(B * L * 3 * H * D)), back(fused.size(), -1.f);
    for (std::size_t i = 0; i < fused.size(); ++i) fused[i] = static_cast<float>(i + 1000 * r);
    std::vector<float> q(plan.head_bytes(0) / 4), k(q.size()), v(q.size());
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    // Views of the fused buffers: from a pointer to the buffer's end.
    auto in_view = [&](std::int64_t at) { return ConstByteSpan{fused.data() + at, (fused.size() - static_cast<std::size_t>(at)) * 4}; };
    auto out_view = [&](std::int64_t at) { return ByteSpan{back.data() + at, (back.size() - static_cast<std::size_t>(at)) * 4}; };
    seq_to_head(plan, comm, ex, {in_view(0), in_view(H * D), in_view(2 * H * D)}, {q, k, v}, ws);
    // Backward: the gradients go back into the fused layout, three interleaved views of one buffer.
    head_to_seq(plan, comm, ex, {q, k, v}, {out_view(0), out_view(H * D), out_view(2 * H * D)}, ws);
    if (back != fused) err[r] = "fused round trip differs";
    // Views that do share bytes are still refused: k shifted by one element overlaps q.
    try {
      head_to_seq(plan, comm, ex, {q, k, v}, {out_view(0), out_view(1), out_view(2 * H * D)}, ws);
      err[r] += " overlapping views accepted";
    } catch (const Error& e) {
      if (e.code() != Errc::buffer_overlap) err[r] += " wrong code";
    }
  });
  CHECK(err[0] == "");
  CHECK(err[1] == "");
}

TEST_CASE("q, k, v (GQA) as views of one fused [B, S, H + 2*Hkv, D] buffer, both ways") {
  // P=2, B=2, S=6 (3 tokens a rank), H=4, Hkv=2, D=3 float: q, k and v views have other head
  // counts but the same strides, and share no byte.
  const int P = 2;
  const std::int64_t B = 2, S = 6, L = 3, H = 4, Hkv = 2, D = 3, Hs = H + 2 * Hkv;
  const std::int64_t st[4] = {L * Hs * D, Hs * D, D, 1};
  LocalGroup g(P);
  std::string err[P];
  g.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    auto hq = HeadPartition::even(H, P);
    auto hkv = HeadPartition::gqa(hq, Hkv);
    std::vector<TensorSpec> specs{
        TensorSpec::of<float>(hq, D).with_seq_layout(Layout::strided({B, L, H, D}, {st[0], st[1], st[2], st[3]})),
        TensorSpec::of<float>(hkv, D).with_seq_layout(Layout::strided({B, L, Hkv, D}, {st[0], st[1], st[2], st[3]})),
        TensorSpec::of<float>(hkv, D).with_seq_layout(Layout::strided({B, L, Hkv, D}, {st[0], st[1], st[2], st[3]}))};
    Plan plan({P, r}, B, SeqPartition::even(S, P), specs);
    std::vector<float> fused(static_cast<std::size_t>(B * L * Hs * D)), back(fused.size(), -1.f);
    for (std::size_t i = 0; i < fused.size(); ++i) fused[i] = static_cast<float>(i + 1000 * r);
    std::vector<float> q(plan.head_bytes(0) / 4), k(plan.head_bytes(1) / 4), v(plan.head_bytes(2) / 4);
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    auto in_view = [&](std::int64_t at) { return ConstByteSpan{fused.data() + at, (fused.size() - static_cast<std::size_t>(at)) * 4}; };
    auto out_view = [&](std::int64_t at) { return ByteSpan{back.data() + at, (back.size() - static_cast<std::size_t>(at)) * 4}; };
    seq_to_head(plan, comm, ex, {in_view(0), in_view(H * D), in_view((H + Hkv) * D)}, {q, k, v}, ws);
    // Rank r holds kv head r of token s, batch b at fused[((b*L + s)*Hs + H + r)*D] (from the rank that holds s).
    if (k[0] != static_cast<float>(H * D + r * D)) err[r] += " k of token 0 is not kv head r of rank 0's first token";
    head_to_seq(plan, comm, ex, {q, k, v}, {out_view(0), out_view(H * D), out_view((H + Hkv) * D)}, ws);
    if (back != fused) err[r] += " fused round trip differs";
    try {  // k's view moved one element into q's heads: refused
      head_to_seq(plan, comm, ex, {q, k, v}, {out_view(0), out_view(H * D - 1), out_view((H + Hkv) * D)}, ws);
      err[r] += " overlapping views accepted";
    } catch (const Error& e) {
      if (e.code() != Errc::buffer_overlap) err[r] += " wrong code";
    }
  });
  CHECK(err[0] == "");
  CHECK(err[1] == "");
}

TEST_CASE("exact overlap test of views with the same strides (other extents allowed)") {
  // Fused [2, 3, 6, 3] (B, S, H + 2*Hkv with H = 4, Hkv = 1, D): q has 4 heads, k and v one each.
  const std::int64_t st[4] = {54, 18, 3, 1};
  const Layout q = Layout::strided({2, 3, 4, 3}, {st[0], st[1], st[2], st[3]});
  const Layout kv = Layout::strided({2, 3, 1, 3}, {st[0], st[1], st[2], st[3]});
  static std::byte buf[4096];
  auto at = [&](std::int64_t elems) { return buf + 4 * (elems + 64); };
  CHECK_FALSE(detail::views_overlap(q, at(0), kv, at(12), 4));   // q and k
  CHECK_FALSE(detail::views_overlap(q, at(0), kv, at(15), 4));   // q and v
  CHECK_FALSE(detail::views_overlap(kv, at(12), kv, at(15), 4));  // k and v
  CHECK_FALSE(detail::views_overlap(kv, at(15), q, at(0), 4));   // either order
  CHECK(detail::views_overlap(q, at(0), kv, at(11), 4));         // k starts on q's last element
  CHECK(detail::views_overlap(q, at(0), kv, at(18), 4));         // k on q's next token
  CHECK(detail::views_overlap(kv, at(18), q, at(0), 4));
  CHECK(detail::views_overlap(q, at(0), kv, at(-2), 4));         // k's last elements inside q's first row
  CHECK_FALSE(detail::views_overlap(q, at(0), kv, at(-3), 4));   // k's first token ends just before q
  // Other strides: no exact test, spans that meet count as an overlap.
  CHECK(detail::views_overlap(q, at(0), Layout::bshd(2, 3, 1, 3), at(12), 4));
}

TEST_CASE("the exact overlap test agrees with brute force on random views with shared strides") {
  // Views of one padded parent buffer: strides of a dense parent in a random dimension order,
  // view extents up to the parent's, bases a random number of bytes apart (not always a multiple
  // of the element). views_overlap must say exactly whether two views share a byte.
  std::uint64_t seed = 12345;
  auto rnd = [&](std::int64_t n) {  // 0..n-1
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::int64_t>((seed >> 33) % static_cast<std::uint64_t>(n));
  };
  static std::byte buf[1 << 16];
  int mismatches = 0, overlapping = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::int64_t pext[4], order[4] = {0, 1, 2, 3}, pstride[4];
    for (auto& e : pext) e = 1 + rnd(4);
    for (int i = 3; i > 0; --i) std::swap(order[i], order[rnd(i + 1)]);
    std::int64_t st = 1;
    for (int k = 3; k >= 0; --k) pstride[order[k]] = st, st *= pext[order[k]];
    Layout a, b;
    for (int i = 0; i < 4; ++i) {
      a.extent[i] = 1 + rnd(pext[i]), b.extent[i] = 1 + rnd(pext[i]);
      a.stride[i] = b.stride[i] = pstride[i];
    }
    const std::int64_t E = 4, delta = rnd(4 * st * E) - 2 * st * E;  // |delta| <= 2 KiB
    const std::byte* pa = buf + 8192;
    const std::byte* pb = pa + delta;
    std::vector<char> mark(sizeof buf, 0);
    bool brute = false;
    for (int pass = 0; pass < 2; ++pass) {
      const Layout& l = pass ? b : a;
      const std::byte* base = pass ? pb : pa;
      for (std::int64_t i0 = 0; i0 < l.extent[0]; ++i0)
        for (std::int64_t i1 = 0; i1 < l.extent[1]; ++i1)
          for (std::int64_t i2 = 0; i2 < l.extent[2]; ++i2)
            for (std::int64_t i3 = 0; i3 < l.extent[3]; ++i3)
              for (std::int64_t k = 0; k < E; ++k) {
                const auto at = static_cast<std::size_t>(base - buf + E * l.offset(i0, i1, i2, i3) + k);
                if (pass == 0) mark[at] = 1;
                else brute = brute || mark[at];
              }
    }
    overlapping += brute;
    if (detail::views_overlap(a, pa, b, pb, E) != brute) {
      ++mismatches;
      MESSAGE("brute " << brute << " a " << a.str() << " b " << b.str() << " byte delta " << (pb - pa));
    }
  }
  CHECK(mismatches == 0);
  CHECK(overlapping > 300);   // both outcomes are well represented
  CHECK(overlapping < 2700);
}

TEST_CASE("exact overlap test of two views with one layout") {
  const Layout qkv = Layout::strided({2, 3, 4, 3}, {108, 36, 3, 1});  // fused [2,3,3,4,3], one of q/k/v
  const std::byte* base = nullptr;
  auto at = [&](std::int64_t elems) { return base + 4 * elems + 4096; };
  CHECK_FALSE(detail::views_overlap(qkv, at(0), qkv, at(12), 4));  // q and k
  CHECK_FALSE(detail::views_overlap(qkv, at(0), qkv, at(24), 4));  // q and v
  CHECK(detail::views_overlap(qkv, at(0), qkv, at(11), 4));         // shares q's last row element
  CHECK(detail::views_overlap(qkv, at(0), qkv, at(36), 4));         // next token: same bytes
  CHECK(detail::views_overlap(qkv, base + 4096, qkv, base + 4096 + 46, 4));  // 11.5 elements: into q's last
  CHECK_FALSE(detail::views_overlap(qkv, base + 4096, qkv, base + 4096 + 50, 4));  // 12.5: between q and v
  CHECK_FALSE(detail::views_overlap(Layout::bshd(1, 2, 2, 2), at(0), Layout::bshd(1, 2, 2, 2), at(8), 4));  // adjacent
}

TEST_CASE("an input inside the workspace is refused (the exchange would overwrite it; the direct path uses none)") {
  LocalGroup g(2);
  std::vector<Errc> code(2, Errc{});
  g.spawn([&](LocalGroup::Comm& comm) {
    Plan plan({2, comm.rank()}, 1, SeqPartition::even(4, 2), {TensorSpec::of<float>(HeadPartition::even(2, 2), 4)}, Format::bshd,
              PlanOptions{1, true, Path::messages});
    REQUIRE(plan.workspace_bytes() > 0);
    std::vector<float> ws(plan.workspace_bytes() / 4 + 64), out(plan.head_bytes(0) / 4);
    HostExecutor ex;
    try {
      seq_to_head(plan, comm, ex, ConstByteSpan{ws.data() + plan.recv_region_offset() / 4, plan.seq_bytes(0)}, out, ws);
    } catch (const Error& e) {
      code[comm.rank()] = e.code();
    }
  });
  CHECK(code == std::vector<Errc>{Errc::buffer_overlap, Errc::buffer_overlap});
}

// ---- the backward of seq→head: adjointness and the summed inverse --------------------------------

namespace {
/// Runs run_adjoint_case<T> for case c on an in-process group; "" or the failures, and whether
/// the two inner products agree.
template <class T>
std::string adjoint_local(const ut::Case& c, bool pull = false) {
  LocalGroup g(c.P);
  std::vector<ut::AdjointShare> share(static_cast<std::size_t>(c.P));
  g.spawn([&](LocalGroup::Comm& comm) {
    share[static_cast<std::size_t>(comm.rank())] =
        ut::with_direct_form(comm, pull, [&](auto& cm) { return ut::run_adjoint_case<T>(cm, c); });
  });
  std::string all;
  std::int64_t fwd = 0, bwd = 0;
  for (auto& s : share) all += s.error.empty() ? "" : s.error + "\n", fwd += s.forward, bwd += s.backward;
  if (fwd != bwd) all += c.name + ": <seq_to_head(x), y> = " + std::to_string(fwd) + " but <x, backward(y)> = " + std::to_string(bwd);
  return all;
}
}  // namespace

TEST_CASE("adjointness <seq_to_head(x), y> = <x, seq_to_head_backward(y)>: every model x P in {1..32} x partitions x layouts x K x transports") {
  // Integer-valued data, so every sum is exact; the backward is also checked element by element
  // (the sum over the holders of each head, ascending). P=16 and 32 replicate the kv heads of
  // Llama, Mistral, Qwen and Gemma; Falcon (MQA) on every rank.
  // ULYSSES_TEST_QUICK (the sanitizer presets set it: every thread runs 4-25x slower there)
  // keeps the groups up to P=4, P=4 in the rotation below; the Release test preset runs them all.
  const bool quick = std::getenv("ULYSSES_TEST_QUICK") != nullptr;
  const std::vector<int> groups = quick ? std::vector<int>{1, 2, 4} : std::vector<int>{1, 2, 4, 8, 16, 32};
  int cases = 0;
  const std::vector<Path> paths = ut::host_paths<LocalGroup::Comm>();
  for (const auto& m : ulysses_models::kModels)
    for (int P : groups) {
      const bool even_ok = ut::expected_even_error(m, P) == Errc{};
      int i = 0;
      for (const auto& [pname, seq] : ut::sweep_partitions(P))
        for (int layout = 0; layout < 4; ++layout)
          for (int K : {1, 3}) {
            // every combination for small groups; for P >= 8 a rotation through them (each model
            // still sees every partition, layout and K across its group sizes)
            if ((P >= 8 || (quick && P >= 4)) && (i++ % 4) != (P + layout) % 4) continue;
            const bool even = even_ok && pname != "balanced";
            auto q = even ? HeadPartition::even(m.num_heads, P) : HeadPartition::balanced(m.num_heads, P);
            auto kv = HeadPartition::gqa(q, m.num_kv_heads);
            ut::Case c{std::string(m.name) + " P=" + std::to_string(P) + " " + pname + " layout " + std::to_string(layout) +
                           " K=" + std::to_string(K),
                       P, 1, seq, {{q, m.head_dim}, {kv, m.head_dim}, {kv, m.v_head_dim}},
                       layout == 3 ? Format::bshd : ut::kFormats[layout], K};
            c.padded = layout == 3;
            // every transport in turn, the direct path's pulled form as one more
            const std::size_t slot = static_cast<std::size_t>(cases) % (paths.size() + 1);
            const bool pull = slot == paths.size();
            c.path = pull ? Path::direct : paths[slot];
            const std::string via = to_string(c.path) + std::string(pull ? " (pull)" : "");
            CAPTURE(c.name);
            CAPTURE(via);
            CHECK(adjoint_local<float>(c, pull) == "");
            ++cases;
          }
    }
  CHECK(cases > (quick ? 400 : 700));
}

TEST_CASE("adjointness in double and bfloat16, B=2, on every transport") {
  auto q = HeadPartition::balanced(6, 4);
  auto kv = HeadPartition::gqa(q, 3);  // kv head 1 on ranks 1 and 2 (a shared boundary head)
  for (Path path : ut::host_paths<LocalGroup::Comm>())
    for (int K : {1, 2}) {
      ut::Case c{"B=2 balanced GQA", 4, 2, SeqPartition::zigzag(11, 4), {{q, 5}, {kv, 5}, {kv, 3}}, Format::sbhd, K};
      c.path = path;
      const std::string via = to_string(path);
      CAPTURE(via);
      CAPTURE(K);
      CHECK(adjoint_local<double>(c) == "");
      CHECK(adjoint_local<ut::bf16v>(c) == "");
      CHECK(adjoint_local<float>(c) == "");
    }
}

TEST_CASE("C11: MQA H=4, Hkv=1, P=4: the gradient of the replicated kv head is the sum of every rank's (fp32 and bf16)") {
  // B=1, S=8, D=2. seq→head gives every rank kv head 0; in the backward rank r holds dk = (r+1)*code(s, d)
  // for all 8 tokens. After seq_to_head_backward every rank's seq-sharded dk is 10*code for its
  // tokens (taking one copy would give 1*code).
  const int P = 4;
  const std::int64_t S = 8, D = 2;
  auto code = [](std::int64_t s, std::int64_t d) { return static_cast<float>(s * D + d + 1); };
  for (bool bf16 : {false, true}) {
    LocalGroup g(P);
    std::vector<std::vector<float>> dk(P);
    g.spawn([&](LocalGroup::Comm& comm) {
      const int r = comm.rank();
      const auto a = attention_specs<float>(P, {4, 1, D}, bf16 ? ElementType::bfloat16 : ElementType::float32);
      std::vector<TensorSpec> specs = a.qkv();
      if (bf16)
        for (auto& x : specs) x.elem_bytes = 2;
      Plan plan({P, r}, 1, SeqPartition::even(S, P), specs);
      REQUIRE(a.kv_heads.count(r) == 1);
      const std::size_t e = bf16 ? 2 : 4;
      std::vector<std::vector<std::byte>> grad_head(3), grad_seq(3);
      for (int t = 0; t < 3; ++t) grad_head[t].resize(plan.head_bytes(t)), grad_seq[t].resize(plan.seq_bytes(t));
      for (std::int64_t s = 0; s < S; ++s)  // dk on rank r: [B=1, S, 1, D] = (r+1) * code
        for (std::int64_t d = 0; d < D; ++d) {
          const float v = static_cast<float>(r + 1) * code(s, d);
          auto* p = grad_head[1].data() + (s * D + d) * static_cast<std::int64_t>(e);
          if (bf16) {
            const std::uint16_t b = detail::float_to_bfloat16(v);
            std::memcpy(p, &b, 2);
          } else {
            std::memcpy(p, &v, 4);
          }
        }
      std::vector<std::byte> ws(plan.workspace_bytes());
      HostExecutor ex;
      seq_to_head_backward(plan, comm, ex, {grad_head[0], grad_head[1], grad_head[2]}, {grad_seq[0], grad_seq[1], grad_seq[2]}, ws);
      for (std::int64_t i = 0; i < 2 * D; ++i) {  // 2 tokens a rank
        const std::byte* p = grad_seq[1].data() + i * static_cast<std::int64_t>(e);
        float v;
        if (bf16) {
          std::uint16_t b;
          std::memcpy(&b, p, 2);
          v = detail::bfloat16_to_float(b);
        } else {
          std::memcpy(&v, p, 4);
        }
        dk[r].push_back(v);
      }
    });
    for (int r = 0; r < P; ++r)
      for (std::int64_t i = 0; i < 2 * D; ++i) {
        const std::int64_t s = 2 * r + i / D, d = i % D;
        float want = 10 * code(s, d);
        if (bf16) {  // fp32 sum of the bf16 terms in rank order, rounded once
          float acc = 0;
          for (int q = 0; q < P; ++q) acc += detail::bfloat16_to_float(detail::float_to_bfloat16(static_cast<float>(q + 1) * code(s, d)));
          want = detail::bfloat16_to_float(detail::float_to_bfloat16(acc));
        }
        CAPTURE(r);
        CAPTURE(i);
        CHECK(dk[r][static_cast<std::size_t>(i)] == want);
      }
  }
}

TEST_CASE("the backwards by name refuse a plan whose replicated heads take their owner's copy (not_adjoint), on every rank") {
  LocalGroup g(4);
  std::vector<Errc> code(4, Errc{}), ok(4, Errc::backend);
  g.spawn([&](LocalGroup::Comm& comm) {
    auto q = HeadPartition::even(4, 4);
    auto kv = HeadPartition::gqa(q, 1);
    Plan inv({4, comm.rank()}, 1, SeqPartition::even(4, 4), {TensorSpec::of<float>(q, 2), TensorSpec::of<float>(kv, 2).with_replicas(Replicas::owner)});
    std::vector<float> a(8), b(8), c(8), d(2);  // q: 8 elements either way; kv: 8 head-sharded, 2 seq-sharded
    std::vector<std::byte> ws(inv.workspace_bytes());
    HostExecutor ex;
    code[comm.rank()] = ut::code_of([&] { seq_to_head_backward(inv, comm, ex, {a, c}, {b, d}, ws); });
    // The plain inverse works with that plan: head_to_seq(seq_to_head(x)) == x.
    ok[comm.rank()] = ut::code_of([&] { head_to_seq(inv, comm, ex, {a, c}, {b, d}, ws); });
  });
  CHECK(code == std::vector<Errc>(4, Errc::not_adjoint));
  CHECK(ok == std::vector<Errc>(4, Errc{}));
  CHECK(backward_of(Direction::seq_to_head) == Direction::head_to_seq);
  CHECK(backward_of(Direction::head_to_seq) == Direction::seq_to_head);
}

TEST_CASE("two-level exchange: the same bits as the flat one on simulated node layouts (in-process)") {
  for (int P : {2, 3, 4, 5, 6, 7, 8}) {
    CAPTURE(P);
    for (const ut::Case& c : ut::two_level_cases(P, Path::two_level)) {
      CAPTURE(c.name);
      CHECK(run_local<float>(c) == "");
    }
  }
  for (const ut::Case& c : ut::two_level_cases(6, Path::two_level)) {
    CAPTURE(c.name);
    CHECK(run_local<ut::bf16_t>(c) == "");  // the kv sums in fp32, rounded once, as on the flat paths
  }
}

TEST_CASE("direct path: a peer that meets this rank's plan with another plan of other layouts is refused, not silently misread") {
  // Rank 1 alternates between a bshd and an sbhd plan of the same wire; rank 0 runs A, then a
  // second plan A2, then A again: every plan's check and lists are cached, but rank 0's lists for
  // A were built from rank 1's bshd layouts while rank 1 now holds sbhd.
  const int P = 2;
  auto mk = [&](int r, Format f) {
    return Plan({P, r}, 2, SeqPartition::even(8, P), {TensorSpec::of<float>(HeadPartition::even(4, P), 3)}, f);
  };
  auto call = [](const Plan& p, LocalGroup::Comm& c) {
    std::vector<float> in(p.seq_bytes(0) / 4);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(1000 * c.rank() + static_cast<int>(i));
    std::vector<float> out(p.head_bytes(0) / 4);
    std::vector<std::byte> ws(p.workspace_bytes());
    HostExecutor ex;
    seq_to_head(p, c, ex, in, out, ws);
  };
  LocalGroup g(P);
  const Errc code = ut::code_of([&] {
    g.spawn([&](LocalGroup::Comm& c) {
      const Plan a = mk(c.rank(), Format::bshd), a2 = mk(c.rank(), c.rank() == 0 ? Format::bshd : Format::sbhd);
      call(a, c);
      call(a2, c);
      call(c.rank() == 0 ? a : a2, c);  // rank 0: A (lists from rank 1's bshd); rank 1: its sbhd plan
    });
  });
  CHECK(code == Errc::plan_mismatch);
}
