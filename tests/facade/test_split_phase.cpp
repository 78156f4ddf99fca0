// SPDX-License-Identifier: Apache-2.0
// split_phase.hpp: start_seq_to_head() / finish() and their siblings in-process give the bytes of
// the blocking calls, with the worker thread and without; one handle carries several exchanges;
// the misuses (finish twice, finish of nothing, start while in flight, a handle destroyed before
// finish(), a rank that leaves between start and finish) are coded errors on every rank within
// the deadline, never a hang.
#include <doctest/doctest.h>
#include <ulysses/comm/local.hpp>
#include <ulysses/host/executor.hpp>
#include <ulysses/plan/attention.hpp>
#include <ulysses/split_phase.hpp>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "expect_error.hpp"

using namespace ulysses;

namespace {
constexpr int kP = 3;
constexpr std::int64_t kS = 9;
const AttentionShape kShape{6, 3, 4, 4};

/// Rank r's seq-sharded tensor t: whole numbers naming rank, tensor and element.
std::vector<float> input(const Plan& p, int t, int r) {
  std::vector<float> x(p.seq_bytes(t) / sizeof(float));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((r * 4 + t) * 100000 + static_cast<long>(i));
  return x;
}

/// seq→head of q, k, v, then head→seq of the result (the summed inverse), blocking or split-phase.
struct Layer {
  Plan plan;
  std::vector<float> q, k, v, q2, k2, v2, q3, k3, v3;
  std::vector<std::byte> ws;
  Layer(int r, PlanOptions o = {}) : plan({kP, r}, 1, SeqPartition::even(kS, kP), attention_specs<float>(kP, kShape).qkv(), Format::bshd, o) {
    q = input(plan, 0, r), k = input(plan, 1, r), v = input(plan, 2, r);
    q2.assign(plan.head_bytes(0) / 4, 0), k2.assign(plan.head_bytes(1) / 4, 0), v2.assign(plan.head_bytes(2) / 4, 0);
    q3.assign(q.size(), 0), k3.assign(k.size(), 0), v3.assign(v.size(), 0);
    ws.resize(plan.workspace_bytes());
  }
  TensorList<ConstByteSpan> in() const { return {q, k, v}; }
  TensorList<ByteSpan> head() { return {q2, k2, v2}; }
  TensorList<ConstByteSpan> head_in() const { return {q2, k2, v2}; }
  TensorList<ByteSpan> back() { return {q3, k3, v3}; }
  ExchangeCall call() { return {&plan, Direction::seq_to_head, in(), head(), ws}; }
};
}  // namespace

TEST_CASE("start_seq_to_head / finish and the backward: the blocking calls' bytes, threaded and not") {
  for (Progress pr : {Progress::automatic, Progress::thread, Progress::in_start}) {
    CAPTURE(static_cast<int>(pr));
    LocalGroup g(kP);
    g.spawn([&](LocalGroup::Comm& comm) {
      HostExecutor exec;
      Layer a(comm.rank()), b(comm.rank());
      seq_to_head(a.plan, comm, exec, a.in(), a.head(), a.ws);
      seq_to_head_backward(a.plan, comm, exec, a.head_in(), a.back(), a.ws);
      auto h = start_seq_to_head(b.plan, comm, exec, b.in(), b.head(), b.ws, pr);
      CHECK(h.pending());
      CHECK(std::string(h.progress_name()) == (pr == Progress::in_start ? "in start" : "thread"));
      finish(h);
      CHECK_FALSE(h.pending());
      auto h2 = start_seq_to_head_backward(b.plan, comm, exec, b.head_in(), b.back(), b.ws, pr);
      finish(h2);
      CHECK(a.q2 == b.q2);
      CHECK(a.k2 == b.k2);
      CHECK(a.v2 == b.v2);
      CHECK(a.q3 == b.q3);
      CHECK(a.k3 == b.k3);  // the summed kv heads (replicated: Hkv = 3 on P = 3 ranks of 2 query heads each)
      CHECK(a.v3 == b.v3);
      // head→seq and head_to_seq_backward alike
      auto h3 = start_head_to_seq(b.plan, comm, exec, b.head_in(), b.back(), b.ws, pr);
      finish(h3);
      head_to_seq(a.plan, comm, exec, a.head_in(), a.back(), a.ws);
      CHECK(a.q3 == b.q3);
      auto h4 = start_head_to_seq_backward(b.plan, comm, exec, TensorList<ConstByteSpan>{b.q3, b.k3, b.v3}, b.head(), b.ws, pr);
      finish(h4);
      head_to_seq_backward(a.plan, comm, exec, TensorList<ConstByteSpan>{a.q3, a.k3, a.v3}, a.head(), a.ws);
      CHECK(a.k2 == b.k2);
    });
  }
}

TEST_CASE("Exchange: one handle carries two exchanges of two plans, and stage by stage") {
  LocalGroup g(kP);
  g.spawn([&](LocalGroup::Comm& comm) {
    HostExecutor exec;
    PlanOptions staged;
    staged.stages = 2;
    Layer a(comm.rank()), b(comm.rank(), staged), c(comm.rank());
    seq_to_head(a.plan, comm, exec, a.in(), a.head(), a.ws);
    Exchange<LocalGroup::Comm, HostExecutor> h(comm, exec);
    const ExchangeCall calls[2] = {{&b.plan, Direction::seq_to_head, b.in(), b.head(), b.ws, StageRange::one(0)},
                                   {&c.plan, Direction::seq_to_head, c.in(), c.head(), c.ws}};
    h.start(calls, 2);
    h.finish();
    const ExchangeCall second{&b.plan, Direction::seq_to_head, b.in(), b.head(), b.ws, StageRange::one(1)};
    h.start(&second, 1);
    h.finish();
    CHECK(a.q2 == b.q2);
    CHECK(a.k2 == b.k2);
    CHECK(a.v2 == b.v2);
    CHECK(a.q2 == c.q2);
    CHECK(a.v2 == c.v2);
  });
}

TEST_CASE("Exchange: finish twice, finish of nothing and a stage range outside the plan are coded errors") {
  LocalGroup g(1);
  g.spawn([&](LocalGroup::Comm& comm) {
    HostExecutor exec;
    const Plan plan({1, 0}, 1, SeqPartition::even(4, 1), attention_specs<float>(1, kShape).qkv());
    Layer* none = nullptr;
    (void)none;
    std::vector<float> q(plan.seq_bytes(0) / 4), k(plan.seq_bytes(1) / 4), v(plan.seq_bytes(2) / 4);
    std::vector<float> q2(q.size()), k2(k.size()), v2(v.size());
    std::vector<std::byte> ws(plan.workspace_bytes());
    Exchange<LocalGroup::Comm, HostExecutor> idle(comm, exec);
    const auto [code, what] = ut::error_of([&] { idle.finish(); });
    CHECK(code == Errc::invalid_group);
    CHECK(what.find("nothing in flight") != std::string::npos);
    auto h = start_seq_to_head(plan, comm, exec, TensorList<ConstByteSpan>{q, k, v}, TensorList<ByteSpan>{q2, k2, v2}, ws);
    finish(h);
    CHECK(ut::code_of([&] { finish(h); }) == Errc::invalid_group);
    const ExchangeCall bad{&plan, Direction::seq_to_head, TensorList<ConstByteSpan>{q, k, v}, TensorList<ByteSpan>{q2, k2, v2}, ws,
                           StageRange::one(1)};
    CHECK(ut::code_of([&] { idle.start(&bad, 1); }) == Errc::invalid_shape);
    CHECK(ut::code_of([&] { idle.start(&bad, 0); }) == Errc::invalid_shape);
  });
}

TEST_CASE("Exchange: a second start() while in flight, or a handle destroyed before finish(), is every rank's error") {
  for (int misuse = 0; misuse < 2; ++misuse) {
    CAPTURE(misuse);
    LocalGroup g(kP, std::chrono::seconds(20));
    std::vector<Errc> later(kP, Errc{});
    std::vector<std::string> whats(kP);
    const auto t0 = std::chrono::steady_clock::now();
    g.spawn([&](LocalGroup::Comm& comm) {
      HostExecutor exec;
      const int r = comm.rank();
      Layer a(r);
      {
        auto h = start_seq_to_head(a.plan, comm, exec, a.in(), a.head(), a.ws, Progress::in_start);
        if (r == 1 && misuse == 0) CHECK(ut::code_of([&] { h.start(nullptr, 0); }) == Errc::invalid_group);
        if (r != 1) finish(h);
        // rank 1 leaves its handle unfinished (misuse 1) or broke the group by its second start (misuse 0)
        if (r == 1 && misuse == 0) finish(h);
      }
      const auto [code, what] = ut::error_of([&] { seq_to_head(a.plan, comm, exec, a.in(), a.head(), a.ws); });
      later[static_cast<std::size_t>(r)] = code;
      whats[static_cast<std::size_t>(r)] = what;
    });
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
    for (int r = 0; r < kP; ++r) {
      CHECK(later[static_cast<std::size_t>(r)] == Errc::aborted);
      CHECK(whats[static_cast<std::size_t>(r)].find(misuse ? "destroyed a split-phase seq_to_head before its finish()"
                                                           : "start() of a split-phase handle in flight") != std::string::npos);
    }
  }
}

// ---- break31: misuses of one handle across ranks ------------------------------------------------

namespace {
/// Runs `body(comm, r)` on kP ranks with a 20 s deadline; every rank's error code and message.
template <class F>
std::pair<std::vector<Errc>, std::vector<std::string>> every_rank(F&& body, int P = kP) {
  LocalGroup g(P, std::chrono::seconds(20));
  std::vector<Errc> codes(static_cast<std::size_t>(P), Errc{});
  std::vector<std::string> whats(static_cast<std::size_t>(P));
  const auto t0 = std::chrono::steady_clock::now();
  g.spawn([&](LocalGroup::Comm& comm) {
    const auto [code, what] = ut::error_of([&] { body(comm, comm.rank()); });
    codes[static_cast<std::size_t>(comm.rank())] = code;
    whats[static_cast<std::size_t>(comm.rank())] = what;
  });
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  return {codes, whats};
}
}  // namespace

TEST_CASE("break33: two exchanges of one handle sharing a workspace or an output: buffer_overlap on every rank before a byte moves; one plan's stages with the same buffers pass") {
  PlanOptions a2a;
  a2a.path = Path::alltoallv;  // (a path with a workspace; the peer copy has none)
  for (int variant = 0; variant < 3; ++variant) {
    CAPTURE(variant);
    const auto [codes, whats] = every_rank([&](LocalGroup::Comm& comm, int r) {
      HostExecutor exec;
      Layer a(r, a2a), c(r, a2a);
      const std::vector<float> c_q2 = c.q2;
      // 0: c's workspace is a's; 1: c writes its outputs over a's; 2: c's workspace holds a's input q
      std::vector<float> big(c.ws.size() / 4 + a.q.size());
      std::copy(a.q.begin(), a.q.end(), big.begin());
      const TensorList<ConstByteSpan> a_in = variant == 2 ? TensorList<ConstByteSpan>{ConstByteSpan(big.data(), a.q.size() * 4), a.k, a.v} : a.in();
      const Workspace cws = variant == 0 ? Workspace(a.ws) : variant == 2 ? Workspace(big.data(), big.size() * 4) : Workspace(c.ws);
      const ExchangeCall calls[2] = {{&a.plan, Direction::seq_to_head, a_in, a.head(), a.ws},
                                     {&c.plan, Direction::seq_to_head, c.in(), variant == 1 ? a.head() : c.head(), cws}};
      Exchange<LocalGroup::Comm, HostExecutor> h(comm, exec);
      struct Untouched {  // checked as the error leaves: nothing written
        const Layer& c;
        const std::vector<float>& q2;
        ~Untouched() { CHECK(c.q2 == q2); }
      } untouched{c, c_q2};
      h.start(calls, 2);
      h.finish();
    });
    for (int r = 0; r < kP; ++r) {
      CAPTURE(whats[static_cast<std::size_t>(r)]);
      CHECK(codes[static_cast<std::size_t>(r)] == Errc::buffer_overlap);
      CHECK(whats[static_cast<std::size_t>(r)].find("in flight together") != std::string::npos);
    }
  }
  // A null list of exchanges, or a count outside [1, kMaxExchangeParts]: invalid_shape, said as such.
  for (int n : {1, 0, kMaxExchangeParts + 1}) {
    const auto [codes, whats] = every_rank([&](LocalGroup::Comm& comm, int r) {
      HostExecutor exec;
      Layer a(r);
      const ExchangeCall calls[kMaxExchangeParts + 1] = {a.call(), a.call(), a.call(), a.call(), a.call()};
      Exchange<LocalGroup::Comm, HostExecutor> h(comm, exec);
      h.start(n == 1 ? nullptr : calls, n);
    });
    for (int r = 0; r < kP; ++r) {
      CAPTURE(whats[static_cast<std::size_t>(r)]);
      CHECK(codes[static_cast<std::size_t>(r)] == Errc::invalid_shape);
      CHECK(whats[static_cast<std::size_t>(r)].find(n == 1 ? "no exchanges (null)" : std::to_string(n) + " exchanges in one handle") != std::string::npos);
    }
  }
  // Stages 0 and 1 of one plan in one handle, with the same buffers and workspace: other heads
  // and other workspace regions; the blocking call's bytes.
  PlanOptions staged = a2a;
  staged.stages = 2;
  LocalGroup g(kP);
  g.spawn([&](LocalGroup::Comm& comm) {
    HostExecutor exec;
    Layer a(comm.rank()), b(comm.rank(), staged);
    seq_to_head(a.plan, comm, exec, a.in(), a.head(), a.ws);
    Exchange<LocalGroup::Comm, HostExecutor> h(comm, exec);
    const ExchangeCall calls[2] = {{&b.plan, Direction::seq_to_head, b.in(), b.head(), b.ws, StageRange::one(1)},
                                   {&b.plan, Direction::seq_to_head, b.in(), b.head(), b.ws, StageRange::one(0)}};
    h.start(calls, 2);
    h.finish();
    CHECK(a.q2 == b.q2);
    CHECK(a.k2 == b.k2);
    CHECK(a.v2 == b.v2);
  });
}

TEST_CASE("break31: ranks giving one handle different exchanges, orders or counts: a coded error on every rank") {
  for (int variant = 0; variant < 3; ++variant)
    for (Progress pr : {Progress::thread, Progress::in_start}) {
      CAPTURE(variant);
      CAPTURE(static_cast<int>(pr));
      const auto [codes, whats] = every_rank([&](LocalGroup::Comm& comm, int r) {
        HostExecutor exec;
        PlanOptions staged;
        staged.stages = 2;
        Layer a(r, staged), c(r);
        Exchange<LocalGroup::Comm, HostExecutor> h(comm, exec, pr);
        const ExchangeCall A{&a.plan, Direction::seq_to_head, a.in(), a.head(), a.ws, StageRange::one(0)};
        const ExchangeCall C{&c.plan, Direction::seq_to_head, c.in(), c.head(), c.ws};
        const ExchangeCall A1{&a.plan, Direction::seq_to_head, a.in(), a.head(), a.ws, StageRange::one(1)};
        ExchangeCall calls[2] = {A, C};
        int n = 2;
        if (r == 1 && variant == 0) calls[0] = C, calls[1] = A;  // another order
        if (r == 1 && variant == 1) n = 1;                        // fewer exchanges
        if (r == 1 && variant == 2) calls[0] = A1;                // another stage of the same plan
        h.start(calls, n);
        h.finish();
      });
      for (int r = 0; r < kP; ++r) {
        CAPTURE(r);
        CAPTURE(whats[static_cast<std::size_t>(r)]);
        CHECK(codes[static_cast<std::size_t>(r)] != Errc{});
      }
    }
}

TEST_CASE("break31: head_bands or the stage count differing between ranks is plan_mismatch on every rank") {
  for (int variant = 0; variant < 2; ++variant)
    for (int split = 0; split < 2; ++split) {
      CAPTURE(variant);
      CAPTURE(split);
      const auto [codes, whats] = every_rank([&](LocalGroup::Comm& comm, int r) {
        HostExecutor exec;
        PlanOptions o;
        o.stages = 2;
        o.head_bands = variant == 0 ? r != 1 : true;
        if (variant == 1 && r == 2) o.stages = 3;
        Layer a(r, o);
        if (split) {
          auto h = start_seq_to_head(a.plan, comm, exec, a.in(), a.head(), a.ws);
          finish(h);
        } else {
          seq_to_head(a.plan, comm, exec, a.in(), a.head(), a.ws);
        }
      });
      for (int r = 0; r < kP; ++r) {
        CAPTURE(r);
        CAPTURE(whats[static_cast<std::size_t>(r)]);
        CHECK(codes[static_cast<std::size_t>(r)] == Errc::plan_mismatch);
      }
    }
}

TEST_CASE("break31: a handle destroyed unfinished with the worker thread, and a wrong stage range on one rank") {
  {
    const auto [codes, whats] = every_rank([&](LocalGroup::Comm& comm, int r) {
      HostExecutor exec;
      Layer a(r);
      {
        auto h = start_seq_to_head(a.plan, comm, exec, a.in(), a.head(), a.ws, Progress::thread);
        CHECK(std::string(h.progress_name()) == "thread");
        if (r != 2) finish(h);
      }
      seq_to_head(a.plan, comm, exec, a.in(), a.head(), a.ws);
    });
    for (int r = 0; r < kP; ++r) {
      CHECK(codes[static_cast<std::size_t>(r)] == Errc::aborted);
      CHECK(whats[static_cast<std::size_t>(r)].find("rank 2 destroyed a split-phase seq_to_head") != std::string::npos);
    }
  }
  const StageRange bad[] = {{-1, 1}, {0, 0}, {0, 3}, {2, 1}, {1, 2}, {0, -2}, {2, -1}};
  for (const StageRange& s : bad) {
    CAPTURE(s.first);
    CAPTURE(s.count);
    const auto [codes, whats] = every_rank([&](LocalGroup::Comm& comm, int r) {
      HostExecutor exec;
      PlanOptions staged;
      staged.stages = 2;
      Layer a(r, staged);
      const ExchangeCall call{&a.plan, Direction::seq_to_head, a.in(), a.head(), a.ws, r == 0 ? s : StageRange::all()};
      Exchange<LocalGroup::Comm, HostExecutor> h(comm, exec);
      h.start(&call, 1);
      h.finish();
    });
    CHECK(codes[0] == Errc::invalid_shape);
    CHECK(codes[1] == Errc::aborted);
    CHECK(codes[2] == Errc::aborted);
  }
}

TEST_CASE("break31: a plan of another group in one handle is a coded error on every rank") {
  const auto [codes, whats] = every_rank([&](LocalGroup::Comm& comm, int r) {
    HostExecutor exec;
    Layer a(r);
    const Plan other({2, r % 2}, 1, SeqPartition::even(4, 2), attention_specs<float>(2, AttentionShape{2, 2, 4, 4}).qkv());
    std::vector<float> x(other.seq_bytes(0) / 4), y(other.seq_bytes(1) / 4), z(other.seq_bytes(2) / 4);
    std::vector<float> x2(other.head_bytes(0) / 4), y2(other.head_bytes(1) / 4), z2(other.head_bytes(2) / 4);
    std::vector<std::byte> ws(other.workspace_bytes());
    const ExchangeCall calls[2] = {{&a.plan, Direction::seq_to_head, a.in(), a.head(), a.ws},
                                   {&other, Direction::seq_to_head, TensorList<ConstByteSpan>{x, y, z}, TensorList<ByteSpan>{x2, y2, z2}, ws}};
    Exchange<LocalGroup::Comm, HostExecutor> h(comm, exec);
    h.start(calls, 2);
    h.finish();
  });
  for (int r = 0; r < kP; ++r) {
    CAPTURE(whats[static_cast<std::size_t>(r)]);
    CHECK(codes[static_cast<std::size_t>(r)] != Errc{});
  }
}

TEST_CASE("break31: StageRange::all() on some ranks and {0, K} on others is one exchange, not a mismatch") {
  for (Progress pr : {Progress::thread, Progress::in_start}) {
    const auto [codes, whats] = every_rank([&](LocalGroup::Comm& comm, int r) {
      HostExecutor exec;
      PlanOptions staged;
      staged.stages = 2;
      Layer a(r, staged), b(r);
      seq_to_head(b.plan, comm, exec, b.in(), b.head(), b.ws);
      const ExchangeCall call{&a.plan, Direction::seq_to_head, a.in(), a.head(), a.ws, r == 0 ? StageRange{0, 2} : StageRange::all()};
      Exchange<LocalGroup::Comm, HostExecutor> h(comm, exec, pr);
      h.start(&call, 1);
      h.finish();
      CHECK(a.q2 == b.q2);
      CHECK(a.k2 == b.k2);
      CHECK(a.v2 == b.v2);
    });
    for (int r = 0; r < kP; ++r) {
      CAPTURE(whats[static_cast<std::size_t>(r)]);
      CHECK(codes[static_cast<std::size_t>(r)] == Errc{});
    }
  }
}

TEST_CASE("break31: a blocking call on some ranks and the split-phase call of the same exchange on others pair up") {
  for (Progress pr : {Progress::thread, Progress::in_start}) {
    const auto [codes, whats] = every_rank([&](LocalGroup::Comm& comm, int r) {
      HostExecutor exec;
      Layer a(r), b(r);
      seq_to_head(b.plan, comm, exec, b.in(), b.head(), b.ws);  // the reference (every rank blocking)
      if (r == 1) {
        seq_to_head(a.plan, comm, exec, a.in(), a.head(), a.ws);
      } else {
        auto h = start_seq_to_head(a.plan, comm, exec, a.in(), a.head(), a.ws, pr);
        finish(h);
      }
      CHECK(a.q2 == b.q2);
      CHECK(a.k2 == b.k2);
      CHECK(a.v2 == b.v2);
    });
    for (int r = 0; r < kP; ++r) {
      CAPTURE(whats[static_cast<std::size_t>(r)]);
      CHECK(codes[static_cast<std::size_t>(r)] == Errc{});
    }
  }
}

TEST_CASE("break31: two handles in flight on one LocalGroup communicator: the blocking bytes, or a coded error on every rank") {
  for (Progress pr : {Progress::thread, Progress::in_start}) {
    CAPTURE(static_cast<int>(pr));
    std::vector<int> same(kP, 0);
    const auto [codes, whats] = every_rank([&](LocalGroup::Comm& comm, int r) {
      HostExecutor exec;
      PlanOptions staged;
      staged.stages = 2;
      Layer a(r), b(r, staged), ref(r);
      seq_to_head(ref.plan, comm, exec, ref.in(), ref.head(), ref.ws);
      auto h1 = start_seq_to_head(a.plan, comm, exec, a.in(), a.head(), a.ws, pr);
      auto h2 = start_seq_to_head(b.plan, comm, exec, b.in(), b.head(), b.ws, pr);
      finish(h1);
      finish(h2);
      same[static_cast<std::size_t>(r)] = a.q2 == ref.q2 && a.k2 == ref.k2 && a.v2 == ref.v2 && b.q2 == ref.q2 && b.k2 == ref.k2 && b.v2 == ref.v2;
    });
    for (int r = 0; r < kP; ++r) {
      CAPTURE(r);
      CAPTURE(whats[static_cast<std::size_t>(r)]);
      if (pr == Progress::thread)  // the second start() would enter the communicator beside the first's worker
        CHECK(codes[static_cast<std::size_t>(r)] == Errc::invalid_shape);
      else
        CHECK((codes[static_cast<std::size_t>(r)] == Errc{} && same[static_cast<std::size_t>(r)] == 1));
    }
  }
}

TEST_CASE("break31: a blocking call on a communicator whose handle's worker is in flight: invalid_shape there, every rank's error") {
  const auto [codes, whats] = every_rank([&](LocalGroup::Comm& comm, int r) {
    HostExecutor exec;
    Layer a(r), b(r);
    auto h = start_seq_to_head(a.plan, comm, exec, a.in(), a.head(), a.ws, Progress::thread);
    if (r == 2) {
      CHECK(ut::code_of([&] { seq_to_head(b.plan, comm, exec, b.in(), b.head(), b.ws); }) == Errc::invalid_shape);
      return;  // h destroyed unfinished: the exchange completes, the group breaks
    }
    finish(h);
    seq_to_head(b.plan, comm, exec, b.in(), b.head(), b.ws);
  });
  CHECK(codes[0] == Errc::aborted);
  CHECK(codes[1] == Errc::aborted);
  CHECK(codes[2] == Errc{});
  CHECK(whats[0].find("rank 2 destroyed a split-phase seq_to_head") != std::string::npos);
}
