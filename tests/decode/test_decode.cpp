// SPDX-License-Identifier: Apache-2.0
// decode/plan.hpp, decode/kernels.hpp, decode/host.hpp, decode/exchange.hpp on the in-process
// group (LocalGroup): the decode exchange of partial attention outputs and their LSE, merged on
// arrival. Every case is checked bit for bit against the ascending-rank merge of the same
// partials and against single-rank attention in double (tests/support/decode_case.hpp): the
// shared fault cases C16 (an empty KV shard; a row with no key on any rank) and C18 (empty rows
// whose LSE is +inf or NaN: the bits of -inf), P in {1,2,3,4,8},
// T in {1,4}, GQA/MQA, contiguous and round-robin KV splits, H % P != 0 (and a rank with no
// heads), bf16/fp16 partials with fp32 LSE, base 2, strided and FlashAttention layouts, both
// collectives, the all-gather variant, a communicator with nothing but alltoallv(); the wire
// format; coded errors before any collective; no allocation after the first call; the kernel
// bodies run lane by lane as the CUDA kernels do.
#include <doctest/doctest.h>

#include <functional>
#include <ulysses/comm/local.hpp>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <new>
#include <random>
#include <thread>
#include <type_traits>

#include "decode_case.hpp"
#include "expect_error.hpp"

using namespace ulysses;
using ud::c16;
using ud::DecodeCase;

// ---- allocation counting (this thread only, while armed) ------------------------------------
// (GCC pairs the inlined library allocations with these replacements and warns, wrongly.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
namespace {
thread_local bool g_count = false;
thread_local long g_allocs = 0;
}  // namespace
void* operator new(std::size_t n) {
  if (g_count) ++g_allocs;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

/// Runs case c on a LocalGroup of c.P ranks; "" or what differs (every rank's report). `results`,
/// when given, receives every rank's output buffers (by rank).
std::string run_local(const DecodeCase& c, std::vector<ud::DecodeResult>* results = nullptr) {
  LocalGroup g(c.P, std::chrono::seconds(60));
  std::vector<std::string> res(static_cast<std::size_t>(c.P));
  if (results) results->assign(static_cast<std::size_t>(c.P), {});
  g.spawn([&](LocalGroup::Comm& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    res[r] = ud::run_decode_case(comm, c, 2, results ? &(*results)[r] : nullptr);
  });
  std::string all;
  for (auto& s : res) all += s;
  return all;
}

/// The case list of the sweep: P, T, KV split, head counts (GQA, MQA, H % P != 0, a rank without heads).
std::vector<DecodeCase> sweep() {
  std::vector<DecodeCase> v;
  struct Heads {
    std::int64_t H, Hkv;
  };
  std::uint64_t seed = 100;
  for (int P : {1, 2, 3, 4, 8})
    for (std::int64_t T : {1, 4})
      for (bool rr : {false, true})
        for (Heads hh : {Heads{8, 2}, Heads{12, 4}, Heads{7, 1}, Heads{3, 3}}) {
          DecodeCase c;
          c.P = P, c.T = T, c.round_robin = rr, c.H = hh.H, c.Hkv = hh.Hkv, c.seed = ++seed;
          c.B = 2, c.S = 5 * P + 3, c.D = 8, c.Dv = 8;
          c.name = "P=" + std::to_string(P) + " T=" + std::to_string(T) + (rr ? " round-robin" : " contiguous") + " H=" + std::to_string(hh.H) +
                   " Hkv=" + std::to_string(hh.Hkv);
          v.push_back(c);
        }
  return v;
}

/// A communicator with nothing but the concept's required members (no exchange_messages,
/// allgather or exchange_state): the alltoallv path, and the agreement check through alltoallv.
struct BareComm {
  LocalGroup::Comm* c;
  int size() const { return c->size(); }
  int rank() const { return c->rank(); }
  void alltoallv(const std::byte* s, const std::size_t* sb, const std::size_t* so, std::byte* r, const std::size_t* rb, const std::size_t* ro) {
    c->alltoallv(s, sb, so, r, rb, ro);
  }
};

/// Every rank's error code of the C16 decode case forced onto `path` over BareComm.
std::vector<Errc> bare_comm_codes(Path path) {
  DecodeCase c = c16();
  c.path = path;
  LocalGroup g(c.P, std::chrono::seconds(60));
  std::vector<Errc> codes(static_cast<std::size_t>(c.P));
  g.spawn([&](LocalGroup::Comm& comm) {
    BareComm bare{&comm};
    codes[static_cast<std::size_t>(comm.rank())] = ut::code_of([&] { ud::run_decode_case(bare, c); });
  });
  return codes;
}

}  // namespace

TEST_CASE("C16: an empty KV shard at decode time: merged output == single-rank attention, no NaN (its partial output is NaN)") {
  DecodeCase c = c16();
  for (bool rr : {false, true}) {
    c.round_robin = rr;
    CAPTURE(rr);
    CHECK(run_local(c) == "");
  }
}

TEST_CASE("C18: P=4, empty rows with LSE +inf or NaN (on one rank, and on every rank): the same bits as with -inf there, every path and output; a row with no key anywhere is 0 and -inf") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  int cases = 0;
  for (const std::vector<float>& empty : {std::vector<float>{inf}, std::vector<float>{nan}, std::vector<float>{inf, nan, -inf}})
    for (Path path : {Path::alltoallv, Path::messages, Path::direct})
      for (DecodeOutput out : {DecodeOutput::heads, DecodeOutput::all_heads})
        for (ElementType in : {ElementType::float32, ElementType::bfloat16})
          for (std::int64_t T : {1, 4}) {
            DecodeCase c = ud::c18(empty);
            c.path = path, c.output = out, c.partial_type = in, c.T = T;
            DecodeCase ref = c;
            ref.empty_lse = {-inf};
            std::vector<ud::DecodeResult> got, want;
            CAPTURE(empty.size());
            CAPTURE(empty[0]);
            CAPTURE(to_string(path));
            CAPTURE(to_string(out));
            CAPTURE(to_string(in));
            CAPTURE(T);
            REQUIRE(run_local(c, &got) == "");  // == merge_rows() with -inf, == attention in double, no-key row 0 / -inf
            REQUIRE(run_local(ref, &want) == "");
            for (int r = 0; r < c.P; ++r) {
              CHECK(got[static_cast<std::size_t>(r)].out == want[static_cast<std::size_t>(r)].out);
              CHECK(got[static_cast<std::size_t>(r)].out_lse == want[static_cast<std::size_t>(r)].out_lse);
            }
            ++cases;
          }
  CHECK(cases == 3 * 3 * 2 * 2 * 2);
}

TEST_CASE("C16: every rank empty for a row: that row's output is exactly 0 and its LSE -inf (the others exact)") {
  DecodeCase c = c16();
  c.no_keys = 1;
  for (ElementType out : {ElementType::float32, ElementType::bfloat16}) {
    c.out_type = out;
    CHECK(run_local(c) == "");
  }
  c.T = 4;  // with T = 4 the early queries of other sequences see fewer keys, some ranks none
  CHECK(run_local(c) == "");
}

TEST_CASE("sweep: P in {1,2,3,4,8}, T in {1,4}, contiguous and round-robin KV, GQA/MQA, H % P != 0, a rank without heads") {
  for (const DecodeCase& c : sweep()) {
    CAPTURE(c.name);
    REQUIRE(run_local(c) == "");
  }
}

TEST_CASE("bf16 and fp16 partial outputs with fp32 LSE; 16-bit and fp32 merged outputs; base-2 LSE") {
  for (ElementType in : {ElementType::bfloat16, ElementType::float16})
    for (ElementType out : {ElementType::bfloat16, ElementType::float32, ElementType::float16})
      for (LseBase base : {LseBase::natural, LseBase::two}) {
        DecodeCase c = c16();
        c.T = 4, c.H = 12, c.Hkv = 4, c.P = 8, c.S = 40, c.round_robin = true;  // H % P != 0
        c.partial_type = in, c.out_type = out, c.base = base;
        CAPTURE(to_string(in));
        CAPTURE(to_string(out));
        CAPTURE(to_string(base));
        CHECK(run_local(c) == "");
      }
}

TEST_CASE("layouts: FlashAttention's (O bhsd, LSE [B,H,T]) and padded strided views that differ between ranks; Dv != D and Dv not a multiple of 16 bytes") {
  for (int lay : {1, 2})
    for (ElementType in : {ElementType::float32, ElementType::bfloat16}) {
      DecodeCase c = c16();
      c.layouts = lay, c.partial_type = in, c.T = 4, c.Dv = 5, c.D = 6, c.P = 3, c.H = 6, c.Hkv = 3;
      CAPTURE(lay);
      CHECK(run_local(c) == "");
      c.output = DecodeOutput::all_heads;
      CHECK(run_local(c) == "");
    }
}

TEST_CASE("both collectives (alltoallv, one message per peer), the direct path (peers' partials read in place) and the all-gather variant give the same bits") {
  for (Path path : {Path::alltoallv, Path::messages, Path::automatic, Path::direct})
    for (DecodeOutput out : {DecodeOutput::heads, DecodeOutput::all_heads})
      for (int P : {1, 2, 4, 8}) {
        DecodeCase c = c16();
        c.P = P, c.H = 7, c.Hkv = 1, c.S = 6 * P, c.T = 4, c.path = path, c.output = out, c.partial_type = ElementType::bfloat16;
        c.empty = {{P - 1, 0}};
        CAPTURE(to_string(path));
        CAPTURE(to_string(out));
        CAPTURE(P);
        CHECK(run_local(c) == "");
      }
}

TEST_CASE("a communicator with only alltoallv(): the automatic path takes it, the agreement check goes through it") {
  for (DecodeOutput out : {DecodeOutput::heads, DecodeOutput::all_heads}) {
    DecodeCase c = c16();
    c.output = out;
    LocalGroup g(c.P, std::chrono::seconds(60));
    std::vector<std::string> res(4);
    g.spawn([&](LocalGroup::Comm& comm) {
      BareComm bare{&comm};
      res[static_cast<std::size_t>(comm.rank())] = ud::run_decode_case(bare, c);
    });
    for (auto& s : res) CHECK(s == "");
  }
  // Path::messages cannot be served by it: a coded error, before any collective.
  for (Errc e : bare_comm_codes(Path::messages)) CHECK(e == Errc::path_unsupported);
}

TEST_CASE("the decode exchange takes the Ulysses exchange's transports: choose_path() of a DecodePlan, through visit_transport()") {
  const auto plan = [](Path p) { return DecodePlan(DecodeSpec(1, 1, HeadPartition::even(4, 2), 8).with_path(p), 0); };
  // automatic: messages where the communicator has them in the executor's memory, else alltoallv; never direct.
  CHECK(choose_path<LocalGroup::Comm, HostDecodeExecutor>(plan(Path::automatic)) == Path::messages);
  CHECK(choose_path<BareComm, HostDecodeExecutor>(plan(Path::automatic)) == Path::alltoallv);
  for (Path p : {Path::alltoallv, Path::messages, Path::direct}) CHECK(choose_path<LocalGroup::Comm, HostDecodeExecutor>(plan(p)) == p);
  // Each transport says whether it serves the decode exchange (serves_decode); two_level never does (a flat wire).
  CHECK(serves_decode<LocalGroup::Comm, HostDecodeExecutor>(Path::direct));
  CHECK(!serves_decode<BareComm, HostDecodeExecutor>(Path::direct));
  CHECK(!serves_decode<BareComm, HostDecodeExecutor>(Path::messages));
  CHECK(!serves_decode<LocalGroup::Comm, HostDecodeExecutor>(Path::two_level));
  CHECK(reads_in_place(Path::direct));
  CHECK(!reads_in_place(Path::messages));
  const auto [code, msg] = ut::error_of([&] { choose_path<LocalGroup::Comm, HostDecodeExecutor>(plan(Path::two_level)); });
  CHECK(code == Errc::path_unsupported);
  CHECK(msg.find("flat") != std::string::npos);
  CHECK(ut::code_of([&] { choose_path<BareComm, HostDecodeExecutor>(plan(Path::direct)); }) == Errc::path_unsupported);
  // DecodeSpec::path is the shared Path.
  static_assert(std::is_same_v<decltype(DecodeSpec::path), Path>, "DecodeSpec::path is a Path");
}

TEST_CASE("the plan: sizes and offsets of the wire format (O then LSE, each part padded to 16 bytes; chunks in peer order; no self chunk)") {
  // P=4, H=7 balanced [2,2,2,1], B=3, T=2, Dv=5, bf16: rank 1 sends 2,2,1 heads to ranks 0,2,3.
  DecodeSpec s(3, 2, HeadPartition::balanced(7, 4), 5);
  s.with_types(ElementType::bfloat16, ElementType::float32);
  const DecodePlan p(s, 1);
  auto chunk = [](std::uint64_t h) { return (6 * h * 5 * 2 + 15) / 16 * 16 + (6 * h * 4 + 15) / 16 * 16; };
  CHECK(p.send_bytes() == std::vector<std::size_t>{chunk(2), 0, chunk(2), chunk(1)});
  CHECK(p.send_offsets() == std::vector<std::size_t>{0, 0, chunk(2), 2 * chunk(2)});
  CHECK(p.recv_bytes() == std::vector<std::size_t>{chunk(2), 0, chunk(2), chunk(2)});
  CHECK(p.recv_offsets() == std::vector<std::size_t>{0, 0, chunk(2), 2 * chunk(2)});
  CHECK(chunk(2) == 128 + 48);  // 120 bytes of O padded to 128, 48 of LSE
  CHECK(p.peers()[0].send_lse_offset == 128);
  CHECK(p.recv_region() == 2 * chunk(2) + chunk(1));
  CHECK(p.workspace_bytes() == p.recv_region() + 3 * chunk(2));
  CHECK(p.sent_bytes() == 2 * chunk(2) + chunk(1));
  CHECK(p.received_bytes() == 3 * chunk(2));
  CHECK(p.head_begin() == 2);
  CHECK(p.local_heads() == 2);
  CHECK(p.gather_send_bytes().empty());
  // Rank 3 holds one head; H=3 over P=4 leaves rank 3 with none: it sends everything, receives nothing.
  const DecodePlan none(DecodeSpec(1, 1, HeadPartition::balanced(3, 4), 4), 3);
  CHECK(none.local_heads() == 0);
  CHECK(none.recv_bytes() == std::vector<std::size_t>(4, 0));
  CHECK(none.send_bytes() == std::vector<std::size_t>{32, 32, 32, 0});
  // The all-gather variant: the merged chunk (out type) to every peer; its receive region reuses the first exchange's.
  DecodeSpec g = s;
  g.with_output(DecodeOutput::all_heads);
  const DecodePlan pg(g, 1);
  auto merged = [](std::uint64_t h) { return (6 * h * 5 * 4 + 15) / 16 * 16 + (6 * h * 4 + 15) / 16 * 16; };
  CHECK(pg.gather_send_bytes() == std::vector<std::size_t>{merged(2), 0, merged(2), merged(2)});
  CHECK(pg.gather_recv_bytes() == std::vector<std::size_t>{merged(2), 0, merged(2), merged(1)});
  CHECK(pg.gather_send_region() == pg.recv_region() + 3 * chunk(2));
  CHECK(pg.out_heads() == 7);
  // One rank: nothing to exchange.
  const DecodePlan one(DecodeSpec(2, 1, HeadPartition::even(4, 1), 8), 0);
  CHECK(one.workspace_bytes() == 0);
  CHECK(one.sent_bytes() == 0);
  CHECK(p.peer_read_bytes() == 0);
  // Path::direct: the peers read the partials in place, nothing is sent or received in the first exchange;
  // the all-gather variant still sends and receives its merged chunks.
  DecodeSpec d = s;
  d.with_path(Path::direct);
  const DecodePlan pd(d, 1);
  CHECK(pd.sent_bytes() == 0);
  CHECK(pd.received_bytes() == 0);
  CHECK(pd.peer_read_bytes() == 3 * chunk(2));
  d.with_output(DecodeOutput::all_heads);
  const DecodePlan pdg(d, 1);
  CHECK(pdg.sent_bytes() == 3 * merged(2));
  CHECK(pdg.received_bytes() == 2 * merged(2) + merged(1));
  CHECK(pdg.peer_read_bytes() == 3 * chunk(2));
  CHECK(pg.sent_bytes() == 2 * chunk(2) + chunk(1) + 3 * merged(2));  // (not direct: both exchanges)
}

TEST_CASE("planning errors are coded, the same on every rank, before any collective") {
  const HeadPartition h8 = HeadPartition::balanced(8, 4);
  CHECK(ut::code_of([&] { DecodePlan(DecodeSpec(1, 1, h8, 8), 4); }) == Errc::invalid_group);
  CHECK(ut::code_of([&] { DecodePlan(DecodeSpec(0, 1, h8, 8), 0); }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { DecodePlan(DecodeSpec(1, 0, h8, 8), 0); }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { DecodePlan(DecodeSpec(1, 1, h8, 0), 0); }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { DecodePlan(DecodeSpec(1, 1, HeadPartition(), 8), 0); }) == Errc::invalid_group);
  // Overlapping head ranges (a GQA kv partition is not a decode head split).
  const HeadPartition overlap = HeadPartition::ranges(4, {{0, 2}, {1, 4}});
  const auto [code, msg] = ut::error_of([&] { DecodePlan(DecodeSpec(1, 1, overlap, 8), 0); });
  CHECK(code == Errc::invalid_partition);
  CHECK(msg.find("overlap") != std::string::npos);
  // An even split of H % P != 0 is refused by the partition itself, naming the fix.
  CHECK(ut::code_of([&] { HeadPartition::even(7, 4); }) == Errc::heads_not_divisible);
  // Types that cannot be merged.
  CHECK(ut::code_of([&] { DecodePlan(DecodeSpec(1, 1, h8, 8).with_types(ElementType::float64, ElementType::float32), 0); }) == Errc::not_summable);
  CHECK(ut::code_of([&] { DecodePlan(DecodeSpec(1, 1, h8, 8).with_types(ElementType::float32, ElementType::opaque), 0); }) == Errc::not_summable);
  // Layouts: wrong extents, a non-contiguous head dim, aliasing.
  DecodeSpec s(2, 1, h8, 8);
  CHECK(ut::code_of([&] { DecodePlan(DecodeSpec(s).with_partial_layouts(Layout::bshd(2, 1, 2, 8), lse_layout_bth(2, 1, 8)), 0); }) ==
        Errc::layout_mismatch);
  CHECK(ut::code_of([&] { DecodePlan(DecodeSpec(s).with_out_layouts(Layout::bshd(2, 1, 8, 8), lse_layout_bth(2, 1, 2)), 0); }) ==
        Errc::layout_mismatch);  // out of rank 0 holds 2 heads, not 8
  CHECK(ut::code_of([&] {
          DecodePlan(DecodeSpec(s).with_partial_layouts(Layout::strided({2, 1, 8, 8}, {128, 128, 1, 8}), lse_layout_bth(2, 1, 8)), 0);
        }) == Errc::layout_mismatch);
  CHECK(ut::code_of([&] {
          DecodePlan(DecodeSpec(s).with_partial_layouts(Layout::strided({2, 1, 8, 8}, {8, 8, 8, 1}), lse_layout_bth(2, 1, 8)), 0);
        }) == Errc::layout_aliasing);
  // Byte counts that overflow.
  CHECK(ut::code_of([&] { DecodePlan(DecodeSpec(std::int64_t{1} << 40, 1 << 20, h8, 1 << 20), 0); }) == Errc::size_overflow);
}

TEST_CASE("call errors are coded and thrown by every rank before any collective (no hang): buffers, workspace, alignment, overlap, communicator") {
  const DecodeCase c = c16();
  enum Fault { small_out, small_lse, small_ws, no_ws, misaligned_lse, overlap_out, overlap_ws, wrong_comm };
  for (Fault f : {small_out, small_lse, small_ws, no_ws, misaligned_lse, overlap_out, overlap_ws, wrong_comm}) {
    LocalGroup g(c.P, std::chrono::seconds(20));
    std::vector<std::pair<Errc, std::string>> errs(4);
    const auto t0 = std::chrono::steady_clock::now();
    g.spawn([&](LocalGroup::Comm& comm) {
      const int r = comm.rank();
      const DecodePlan plan(ud::spec_of(c, f == wrong_comm ? (r + 1) % c.P : r), f == wrong_comm ? (r + 1) % c.P : r);
      std::vector<std::byte> in(plan.partial_span_bytes()), lse(plan.lse_span_bytes() + 4), out(plan.out_span_bytes()),
          olse(plan.out_lse_span_bytes()), ws(plan.workspace_bytes());
      DecodeBuffers b = DecodeBuffers().partial(in).lse({lse.data(), plan.lse_span_bytes()}).out(out).out_lse(olse).workspace(ws);
      if (f == small_out) b = b.out({out.data(), out.size() - 1});
      if (f == small_lse) b = b.lse({lse.data(), plan.lse_span_bytes() - 4});
      if (f == small_ws) b = b.workspace({ws.data(), ws.size() - 16});
      if (f == no_ws) b = b.workspace({nullptr, ws.size()});
      if (f == misaligned_lse) b = b.lse({lse.data() + 2, plan.lse_span_bytes()});
      if (f == overlap_out) b = b.out({in.data(), in.size()});
      if (f == overlap_ws) b = b.workspace({out.data(), std::max(ws.size(), out.size())});
      errs[static_cast<std::size_t>(r)] = ut::error_of([&] { decode_exchange(plan, comm, HostDecodeExecutor{}, b); });
    });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const Errc want[] = {Errc::buffer_too_small, Errc::buffer_too_small, Errc::workspace_too_small, Errc::workspace_too_small,
                         Errc::misaligned,       Errc::buffer_overlap,   Errc::buffer_overlap,      Errc::comm_mismatch};
    CAPTURE(static_cast<int>(f));
    for (const auto& e : errs) {
      CHECK(e.first == want[f]);
      CAPTURE(e.second);
    }
    CHECK(secs < 10.0);  // thrown up front: nobody waited for a peer
  }
  // The message names the buffer and the numbers.
  const DecodePlan plan(ud::spec_of(c, 0), 0);
  std::vector<std::byte> big(1 << 16);
  const DecodeBuffers b = DecodeBuffers().partial({big.data(), 10});
  LocalGroup g1(4);
  LocalGroup::Comm comm0 = g1.comm(0);
  const auto [code, msg] = ut::error_of([&] { decode_exchange(plan, comm0, HostDecodeExecutor{}, b); });
  CHECK(code == Errc::buffer_too_small);
  CHECK(msg.find("partial output O_r") != std::string::npos);
  CHECK(msg.find("holds 10 bytes") != std::string::npos);
}

TEST_CASE("a buffer given as a range of another element size (the LSE in doubles, the output in floats for bf16): tensor_mismatch before any collective, naming it; bytes pass") {
  const DecodeCase c = c16();
  const DecodePlan plan(ud::spec_of(c, 0), 0);
  std::vector<std::byte> in(plan.partial_span_bytes()), out(plan.out_span_bytes()), olse(plan.out_lse_span_bytes()), ws(plan.workspace_bytes());
  std::vector<double> lse8(plan.lse_span_bytes() / 8 + 1);
  LocalGroup g1(c.P);
  LocalGroup::Comm comm0 = g1.comm(0);
  const DecodeBuffers b = DecodeBuffers().partial(in).lse(lse8).out(out).out_lse(olse).workspace(ws);
  const auto [code, msg] = ut::error_of([&] { decode_exchange(plan, comm0, HostDecodeExecutor{}, b); });
  CHECK(code == Errc::tensor_mismatch);
  CHECK(msg.find("the partial LSE_r (DecodeBuffers::lse) was given as a range of 8-byte elements; the tensor's are 4-byte float32") !=
        std::string::npos);
  std::vector<std::uint16_t> out16(plan.out_span_bytes() / 2 + 1);
  REQUIRE(plan.spec().out_type == ElementType::float32);
  const auto [code2, msg2] = ut::error_of([&] { decode_exchange(plan, comm0, HostDecodeExecutor{}, b.lse(ConstByteSpan(lse8.data(), lse8.size() * 8)).out(out16)); });
  CHECK(code2 == Errc::tensor_mismatch);
  CHECK(msg2.find("the merged output (DecodeBuffers::out)") != std::string::npos);
}

TEST_CASE("ranks that planned different exchanges: every rank throws plan_mismatch at the first call, naming what differs") {
  DecodeCase c = c16();
  LocalGroup g(c.P, std::chrono::seconds(20));
  std::vector<std::pair<Errc, std::string>> errs(4);
  g.spawn([&](LocalGroup::Comm& comm) {
    DecodeCase mine = c;
    if (comm.rank() == 2) mine.T = 2;  // rank 2 planned two new tokens
    errs[static_cast<std::size_t>(comm.rank())] = ut::error_of([&] { ud::run_decode_case(comm, mine); });
  });
  for (const auto& e : errs) {
    CHECK(e.first == Errc::plan_mismatch);
    CHECK(e.second.find("rank 2 differs from rank 0 in the new tokens T (rank 2: 2; rank 0: 1)") != std::string::npos);
  }
  // Every field by name, with its values where they are not hashes.
  struct Variant {
    std::function<void(DecodeCase&)> change;  // rank 1's plan
    const char* says;
  };
  const Variant variants[] = {
      {[](DecodeCase& m) { m.out_type = ElementType::bfloat16; }, "rank 1 differs from rank 0 in the output's element type (rank 1: bfloat16; rank 0: float32)"},
      {[](DecodeCase& m) { m.base = LseBase::two; }, "rank 1 differs from rank 0 in the LSE base (rank 1: two; rank 0: natural)"},
      {[](DecodeCase& m) { m.output = DecodeOutput::all_heads; }, "rank 1 differs from rank 0 in the output (heads, all_heads) (rank 1: all_heads; rank 0: heads)"},
      {[](DecodeCase& m) { m.path = Path::alltoallv; }, "rank 1 differs from rank 0 in the path (rank 1: alltoallv; rank 0: automatic)"},
  };
  for (const Variant& v : variants) {
    const std::string says = v.says;
    CAPTURE(says);
    g.spawn([&](LocalGroup::Comm& comm) {
      DecodeCase mine = c;
      if (comm.rank() == 1) v.change(mine);
      errs[static_cast<std::size_t>(comm.rank())] = ut::error_of([&] { ud::run_decode_case(comm, mine); });
    });
    for (const auto& e : errs) {
      CHECK(e.first == Errc::plan_mismatch);
      CHECK(e.second.find(v.says) != std::string::npos);
    }
  }
}

TEST_CASE("the direct path: bf16 and strided layouts the same on every rank exact; layouts that differ, a communicator without with_peers(), P > 64: coded errors on every rank") {
  for (int lay : {0, 1}) {
    DecodeCase c = c16();
    c.path = Path::direct, c.layouts = lay, c.partial_type = ElementType::bfloat16, c.out_type = ElementType::bfloat16, c.T = 4;
    CAPTURE(lay);
    CHECK(run_local(c) == "");
  }
  {  // rank-dependent padded layouts: the ranks' records differ in the path word, every rank throws at the first call
    DecodeCase c = c16();
    c.path = Path::direct, c.layouts = 2;
    LocalGroup g(c.P, std::chrono::seconds(60));
    std::vector<std::string> msgs(4);
    std::vector<Errc> codes(4);
    g.spawn([&](LocalGroup::Comm& comm) {
      const auto [code, msg] = ut::error_of([&] { ud::run_decode_case(comm, c); });
      codes[static_cast<std::size_t>(comm.rank())] = code, msgs[static_cast<std::size_t>(comm.rank())] = msg;
    });
    for (int r = 0; r < 4; ++r) {
      CHECK(codes[static_cast<std::size_t>(r)] == Errc::plan_mismatch);
      CHECK(msgs[static_cast<std::size_t>(r)].find("partial and LSE layouts") != std::string::npos);
    }
  }
  for (Errc e : bare_comm_codes(Path::direct)) CHECK(e == Errc::path_unsupported);  // no with_peers(): before any collective
  const DecodeSpec big = DecodeSpec(1, 1, HeadPartition::balanced(65, 65), 8).with_path(Path::direct);
  CHECK(ut::code_of([&] { DecodePlan(big, 0); }) == Errc::path_unsupported);
}

TEST_CASE("no allocation in a call after the first (both collectives, the direct path, both outputs)") {
  for (Path path : {Path::alltoallv, Path::messages, Path::direct})
    for (DecodeOutput o : {DecodeOutput::heads, DecodeOutput::all_heads}) {
      DecodeCase c = c16();
      c.path = path, c.output = o;
      LocalGroup g(c.P, std::chrono::seconds(60));
      std::vector<long> allocs(4, -1);
      g.spawn([&](LocalGroup::Comm& comm) {
        const int r = comm.rank();
        const DecodePlan plan(ud::spec_of(c, r), r);
        std::vector<std::byte> in(plan.partial_span_bytes()), lse(plan.lse_span_bytes()), out(plan.out_span_bytes()),
            olse(plan.out_lse_span_bytes()), ws(plan.workspace_bytes());
        const DecodeBuffers b = DecodeBuffers().partial(in).lse(lse).out(out).out_lse(olse).workspace(ws);
        const HostDecodeExecutor ex;
        decode_exchange(plan, comm, ex, b);  // the first call checks agreement, sizes the message lists
        g_allocs = 0;
        g_count = true;
        decode_exchange(plan, comm, ex, b);
        decode_exchange(plan, comm, ex, b);
        g_count = false;
        allocs[static_cast<std::size_t>(r)] = g_allocs;
      });
      CAPTURE(to_string(path));
      CAPTURE(to_string(o));
      CHECK(allocs == std::vector<long>(4, 0));
    }
}

namespace {

/// A plan of case c on rank r with every buffer filled with random partials (and a receive region
/// as peers would have sent: random O rows, LSEs finite or `empty`: -inf, or +inf / NaN for C18;
/// the same seed gives the same bytes whatever `empty` is), for the kernel-body checks.
struct BodyRig {
  DecodePlan plan;
  std::vector<std::byte> in, lse, out, olse, ws;
  DecodeBuffers b;
  BodyRig(const DecodeCase& c, int r, std::uint64_t seed, float empty = -INFINITY) : plan(ud::spec_of(c, r), r) {
    std::mt19937 g(static_cast<std::uint32_t>(seed));
    std::uniform_real_distribution<float> u(-3.f, 3.f);
    auto fill = [&](std::vector<std::byte>& v, std::size_t n) {
      v.resize(n + 16);
      for (auto& x : v) x = static_cast<std::byte>(g() & 0xff);
    };
    fill(in, plan.partial_span_bytes()), fill(lse, plan.lse_span_bytes()), fill(out, plan.out_span_bytes()), fill(olse, plan.out_lse_span_bytes()),
        fill(ws, plan.workspace_bytes());
    // Valid numbers where they are read: every element of the partials and received chunks.
    const auto e = static_cast<std::int64_t>(size_of(c.partial_type));
    for (std::size_t i = 0; i + e <= in.size(); i += static_cast<std::size_t>(e)) ud::store(in.data() + i, c.partial_type, u(g));
    for (std::size_t i = 0; i + 4 <= lse.size(); i += 4) {
      const float v = (g() % 5 == 0) ? empty : u(g) * 5;
      std::memcpy(lse.data() + i, &v, 4);
    }
    const std::size_t rr = plan.recv_region();
    for (int p = 0; p < plan.degree(); ++p) {
      const std::size_t at = rr + plan.recv_offsets()[static_cast<std::size_t>(p)], n = plan.recv_bytes()[static_cast<std::size_t>(p)];
      const std::size_t lse_at = at + (static_cast<std::size_t>(c.B * c.T * plan.local_heads() * c.Dv * e) + 15) / 16 * 16;
      for (std::size_t i = at; i + e <= lse_at; i += static_cast<std::size_t>(e)) ud::store(ws.data() + i, c.partial_type, u(g));
      for (std::size_t i = lse_at; i + 4 <= at + n; i += 4) {
        const float v = (g() % 4 == 0) ? empty : u(g) * 5;
        std::memcpy(ws.data() + i, &v, 4);
      }
    }
    b = DecodeBuffers().partial(in).lse(lse).out(out).out_lse(olse).workspace(ws);
  }
  DecodeArgs args() const { return plan.args(b, plan.peers().data()); }
};

}  // namespace

TEST_CASE("the kernel bodies run as the CUDA kernels run them (32 lanes per row; merge chunks of 8) == the host executor, byte for byte") {
  for (ElementType in : {ElementType::float32, ElementType::bfloat16, ElementType::float16})
    for (DecodeOutput o : {DecodeOutput::heads, DecodeOutput::all_heads})
      for (int lay : {0, 2}) {
        DecodeCase c = c16();
        c.P = 5, c.H = 12, c.Hkv = 4, c.T = 3, c.Dv = 19, c.partial_type = in, c.out_type = ElementType::bfloat16, c.output = o, c.layouts = lay;
        for (int r = 0; r < c.P; ++r) {
          BodyRig host(c, r, 77 + static_cast<std::uint64_t>(r)), emu(c, r, 77 + static_cast<std::uint64_t>(r));
          const DecodeArgs ha = host.args(), ea = emu.args();
          const HostDecodeExecutor ex;
          ex.pack(ha);
          for (std::int64_t row = 0; row < detail::decode_other_rows(ea); ++row)
            for (int lane = 0; lane < 32; ++lane) detail::decode_pack_unit(ea, row, lane, 32);
          CHECK(emu.ws == host.ws);
          ex.merge(ha);
          for (std::int64_t row = 0; row < detail::decode_own_rows(ea); ++row)
            for (std::int64_t d0 = 0; d0 < c.Dv; d0 += 8) detail::decode_merge_unit<8>(ea, row, d0);
          CHECK(emu.out == host.out);
          CHECK(emu.olse == host.olse);
          CHECK(emu.ws == host.ws);
          if (o == DecodeOutput::all_heads) {
            ex.unpack_gathered(ha);
            for (std::int64_t row = 0; row < detail::decode_other_rows(ea); ++row)
              for (int lane = 0; lane < 32; ++lane) detail::decode_gather_unit(ea, row, lane, 32);
            CHECK(emu.out == host.out);
            CHECK(emu.olse == host.olse);
          }
        }
      }
}

TEST_CASE("C18: the kernel bodies (as the CUDA kernels run them) and the host executor with LSEs +inf or NaN give the bytes of -inf there") {
  for (ElementType in : {ElementType::float32, ElementType::bfloat16})
    for (DecodeOutput o : {DecodeOutput::heads, DecodeOutput::all_heads}) {
      DecodeCase c = c16();
      c.P = 4, c.H = 12, c.Hkv = 4, c.T = 3, c.Dv = 19, c.partial_type = in, c.out_type = ElementType::float32, c.output = o;
      for (int r = 0; r < c.P; ++r) {
        const std::uint64_t seed = 180 + static_cast<std::uint64_t>(r);
        BodyRig ref(c, r, seed);
        const HostDecodeExecutor ex;
        ex.merge(ref.args());
        for (float empty : {INFINITY, NAN}) {
          CAPTURE(to_string(in));
          CAPTURE(r);
          CAPTURE(empty);
          BodyRig host(c, r, seed, empty), emu(c, r, seed, empty);
          REQUIRE(host.in == ref.in);  // the same partials, only the empty LSEs differ
          REQUIRE(host.lse != ref.lse);
          ex.merge(host.args());
          const DecodeArgs ea = emu.args();
          for (std::int64_t row = 0; row < detail::decode_own_rows(ea); ++row)
            for (std::int64_t d0 = 0; d0 < c.Dv; d0 += 8) detail::decode_merge_unit<8>(ea, row, d0);
          CHECK(host.out == ref.out);
          CHECK(host.olse == ref.olse);
          CHECK(emu.out == ref.out);
          CHECK(emu.olse == ref.olse);
        }
      }
    }
}

TEST_CASE("every model of models.json, P in {1,2,4,8,16,32}: a balanced decode plan, or an even one / a clear error; a small exchange at P=4 exact") {
  struct M {
    const char* name;
    std::int64_t H, Hkv, Dv;
  };
  const M models[] = {{"GPT-2 small", 12, 12, 64},   {"Llama-3.1-8B", 32, 8, 128}, {"Llama-3.1-70B", 64, 8, 128}, {"Llama-3.1-405B", 128, 8, 128},
                      {"Mistral-7B", 32, 8, 128},    {"Qwen2.5-7B", 28, 4, 128},   {"Qwen2.5-14B", 40, 8, 128},  {"Qwen2.5-72B", 64, 8, 128},
                      {"Gemma-2-9B", 16, 8, 256},    {"Phi-3-mini", 32, 32, 96},   {"Falcon-7B", 71, 1, 64},     {"DeepSeek-V3 (MLA)", 128, 128, 128},
                      {"FLUX.1-dev", 24, 24, 128},   {"HunyuanVideo", 24, 24, 128}, {"Wan2.1-14B", 40, 40, 128}, {"CogVideoX-5B", 48, 48, 64}};
  for (const M& m : models) {
    CAPTURE(m.name);
    for (int P : {1, 2, 4, 8, 16, 32}) {
      const DecodePlan p(DecodeSpec(8, 1, HeadPartition::balanced(m.H, P), m.Dv).with_types(ElementType::bfloat16, ElementType::bfloat16), P - 1);
      CHECK(p.local_heads() == m.H / P);  // the last rank of a balanced split
      const Errc even = ut::code_of([&] { DecodePlan(DecodeSpec(8, 1, HeadPartition::even(m.H, P), m.Dv), 0); });
      CHECK(even == (m.H % P == 0 ? Errc{} : Errc::heads_not_divisible));
    }
    DecodeCase c = c16();
    c.H = m.H, c.Hkv = m.Hkv, c.Dv = 16, c.D = 8, c.B = 1, c.S = 12, c.partial_type = ElementType::bfloat16, c.round_robin = true;
    CHECK(run_local(c) == "");
  }
}
