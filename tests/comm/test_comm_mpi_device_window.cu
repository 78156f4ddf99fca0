// SPDX-License-Identifier: Apache-2.0
// comm/device_window_protocol.cuh and comm/mpi_device_window.cuh (ctest runs this under
// `mpiexec -n 2`). Suite "host" (no device needed): the shared cases of the one epoch barrier
// (tests/support/window_protocol_cases.hpp, also run by test_comm_mpi_window) over DeviceWords; the protocol of the device
// kernels run on the host, ranks as threads over host memory (the same __host__ __device__
// functions): epochs in order and no torn reads over many calls, a rank that never arrives (the
// others time out naming it, a later waiter gets `aborted` naming it too), records that differ (count,
// registrations, offsets, layouts: every rank the same verdict); the list logic (the record,
// where staged inputs go, the peers' addresses) and the errors' codes. Suite "device" (skipped,
// saying so, without a CUDA device): the peer copy across processes through CUDA IPC on the case
// list, inputs in the window and staged, bit for bit; registrations in another order; a rank that
// never enters (timeout, then aborted); a rank that skips the destructor (the others leak after
// their timeout); CUDA-graph capture and replay.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include <ulysses/comm/mpi_device_window.cuh>
#include <ulysses/ulysses.hpp>

#include "device_harness.cuh"
#include "expect_error.hpp"
#include "window_protocol_cases.hpp"

using namespace ulysses;
using detail::DeviceWaitCode;

namespace {

// ---- the protocol on the host ------------------------------------------------------------------

std::uint64_t host_now() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}
void host_pause() { std::this_thread::yield(); }

/// P ranks' control blocks and statuses in host memory, and each rank's view of the group.
struct HostGroup {
  explicit HostGroup(int P) : ctrl(static_cast<std::size_t>(P)), status(static_cast<std::size_t>(P)) {
    for (auto& c : ctrl) c = std::make_unique<detail::DeviceWindowControl>();
    for (auto& s : status) s = detail::DeviceWindowStatus{};
  }
  detail::DeviceWindowGroup view(int r) const {
    detail::DeviceWindowGroup g{};
    g.size = static_cast<int>(ctrl.size());
    g.rank = r;
    for (int p = 0; p < g.size; ++p) g.ctrl[p] = ctrl[static_cast<std::size_t>(p)].get();
    return g;
  }
  std::vector<std::unique_ptr<detail::DeviceWindowControl>> ctrl;
  std::vector<detail::DeviceWindowStatus> status;
};

detail::DeviceWindowRecord record_of(std::uint64_t count, std::uint64_t reg_hash = 7) {
  detail::DeviceWindowRecord r;
  r.count = count;
  r.reg_count = 2, r.reg_total = 1024, r.reg_hash = reg_hash;
  for (auto& o : r.offset) o = detail::DeviceWindowRecord::kNone;
  for (std::uint64_t t = 0; t < count; ++t) r.offset[t] = 256 * t;
  return r;
}

/// CHECKs that f throws Error(code) whose message contains `says`.
template <class F>
void expect_error(Errc code, const std::string& says, F&& f) {
  const std::pair<Errc, std::string> e = ut::error_of(f);
  const std::string& m = e.second;
  const Errc c = e.first;
  CAPTURE(m);
  CHECK(c == code);
  CHECK(m.find(says) != std::string::npos);
}

constexpr std::uint64_t kLong = 20'000'000'000ull;  // 20 s: never reached by a healthy run
constexpr std::uint64_t kShort = 100'000'000ull;    // 100 ms

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("protocol: the epoch barrier's shared cases (comm/window_protocol.hpp: the MPI window's test runs them too)") {
    ut::window_protocol_cases<detail::DeviceWords, detail::DeviceWindowControl>();
  }

  TEST_CASE("protocol: epochs in order, every peer's input read whole before its owner rewrites it") {
    constexpr int P = 3, kCalls = 200, kWords = 64;
    HostGroup grp(P);
    std::vector<std::vector<std::atomic<std::uint64_t>>> input(P);
    for (auto& v : input) v = std::vector<std::atomic<std::uint64_t>>(kWords);
    std::atomic<int> torn{0};
    std::vector<std::thread> ranks;
    for (int r = 0; r < P; ++r)
      ranks.emplace_back([&, r] {
        const detail::DeviceWindowGroup g = grp.view(r);
        for (int call = 1; call <= kCalls; ++call) {
          for (auto& w : input[static_cast<std::size_t>(r)]) w.store(static_cast<std::uint64_t>(call * 100 + r), std::memory_order_relaxed);
          const std::uint64_t e = detail::dw_arrive_and_wait(g, record_of(2), kLong, grp.status[static_cast<std::size_t>(r)], host_now, host_pause);
          if (e != static_cast<std::uint64_t>(call)) torn.fetch_add(1000);
          for (int p = 0; p < P; ++p)  // the copy: every peer's input of this call
            for (auto& w : input[static_cast<std::size_t>(p)])
              if (w.load(std::memory_order_relaxed) != static_cast<std::uint64_t>(call * 100 + p)) torn.fetch_add(1);
          detail::dw_done_and_wait(g, kLong, grp.status[static_cast<std::size_t>(r)], host_now, host_pause);
        }
      });
    for (auto& t : ranks) t.join();
    CHECK(torn.load() == 0);
    for (int r = 0; r < P; ++r) {
      CHECK(grp.status[static_cast<std::size_t>(r)].code == 0);
      CHECK(grp.ctrl[static_cast<std::size_t>(r)]->epoch == static_cast<std::uint64_t>(kCalls));
      CHECK(grp.ctrl[static_cast<std::size_t>(r)]->arrive == static_cast<std::uint64_t>(kCalls));
      CHECK(grp.ctrl[static_cast<std::size_t>(r)]->done == static_cast<std::uint64_t>(kCalls));
    }
    CHECK(grp.ctrl[0]->abort == 0);
  }

  TEST_CASE("protocol: a rank that never arrives: the others time out naming it, later waits end with aborted") {
    HostGroup grp(3);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)  // rank 2 never enters
      ranks.emplace_back([&, r] {
        detail::dw_arrive_and_wait(grp.view(r), record_of(1), kShort, grp.status[static_cast<std::size_t>(r)], host_now, host_pause);
      });
    for (auto& t : ranks) t.join();
    for (int r = 0; r < 2; ++r) {
      const auto& st = grp.status[static_cast<std::size_t>(r)];
      const bool timed_out = st.code == static_cast<std::uint64_t>(DeviceWaitCode::timeout_arrive);
      const bool saw_abort = st.code == static_cast<std::uint64_t>(DeviceWaitCode::aborted);  // the other one timed out first
      CHECK((timed_out || saw_abort));
      if (timed_out) CHECK(st.peer == 2);
      CHECK(st.epoch == 1);
      CHECK(st.not_arrived == 1u << 2);  // both name rank 2: the one that timed out, and the one that saw the abort (the group's mask)
      CHECK(st.not_done == 0);
      CHECK(st.missed_call == 1);
      Errc code = Errc::backend;
      const std::string m = detail::device_window_failure(st, r, 100, code);
      CAPTURE(m);
      CHECK(code == (timed_out ? Errc::timeout : Errc::aborted));
      CHECK(m.find(timed_out ? "for the peers to arrive; ranks {2} did not arrive in call 1" : "broke it: ranks {2} did not arrive in call 1") !=
            std::string::npos);
    }
    const std::uint64_t who = grp.ctrl[0]->abort;
    CHECK((who == 1 || who == 2));  // 1 + the rank that timed out
    CHECK(grp.status[static_cast<std::size_t>(who - 1)].code == static_cast<std::uint64_t>(DeviceWaitCode::timeout_arrive));
    CHECK(grp.ctrl[2]->missed == detail::missed_word(1, true));  // rank 2 is marked in its own control block
    // Rank 2 arrives late: the group is broken, its wait ends at once with aborted (no timeout).
    const auto t0 = std::chrono::steady_clock::now();
    detail::dw_arrive_and_wait(grp.view(2), record_of(1), kLong, grp.status[2], host_now, host_pause);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    CHECK(grp.status[2].code == static_cast<std::uint64_t>(DeviceWaitCode::aborted));
    CHECK(grp.status[2].peer == who - 1);
    CHECK(grp.status[2].not_arrived == 1u << 2);  // it learns it was the one missing
    // A rank that failed publishes nothing more.
    const std::uint64_t arrive0 = grp.ctrl[0]->arrive;
    detail::dw_arrive_and_wait(grp.view(0), record_of(1), kLong, grp.status[0], host_now, host_pause);
    CHECK(grp.ctrl[0]->arrive == arrive0);
    // The done wait of a broken group ends at once too.
    detail::DeviceWindowStatus fresh{};
    detail::dw_done_and_wait(grp.view(1), kLong, fresh, host_now, host_pause);
    CHECK(fresh.code == static_cast<std::uint64_t>(DeviceWaitCode::aborted));
  }

  TEST_CASE("protocol: records that differ give every rank the same verdict") {
    struct Variant {
      const char* name;
      DeviceWaitCode code;
      std::uint64_t field;
    };
    for (const Variant& v : {Variant{"count", DeviceWaitCode::record_mismatch, 0}, Variant{"registrations", DeviceWaitCode::record_mismatch, 1},
                             Variant{"offset", DeviceWaitCode::record_mismatch, 3}, Variant{"layouts", DeviceWaitCode::layouts_mismatch, 0}}) {
      CAPTURE(v.name);
      constexpr int P = 3;
      HostGroup grp(P);
      std::vector<std::thread> ranks;
      for (int r = 0; r < P; ++r)
        ranks.emplace_back([&, r] {
          detail::DeviceWindowGroup g = grp.view(r);
          detail::DeviceWindowRecord rec = record_of(2);
          rec.layouts = 40 + static_cast<std::uint64_t>(r);
          g.check_layouts = 1;
          for (int p = 0; p < P; ++p) g.expect_layouts[p] = 40 + static_cast<std::uint64_t>(p);
          if (r == 1) {
            if (std::string(v.name) == "count") rec = record_of(3), rec.layouts = 41;
            if (std::string(v.name) == "registrations") rec.reg_hash = 8;
            if (std::string(v.name) == "offset") rec.offset[1] = 4096;
            if (std::string(v.name) == "layouts") rec.layouts = 99;
          }
          detail::dw_arrive_and_wait(g, rec, kLong, grp.status[static_cast<std::size_t>(r)], host_now, host_pause);
          detail::dw_done_and_wait(g, kLong, grp.status[static_cast<std::size_t>(r)], host_now, host_pause);
        });
      for (auto& t : ranks) t.join();
      for (int r = 0; r < P; ++r) {
        const auto& st = grp.status[static_cast<std::size_t>(r)];
        CHECK(st.code == static_cast<std::uint64_t>(v.code));
        CHECK(st.peer == 1);
        if (v.code == DeviceWaitCode::record_mismatch) CHECK(st.field == v.field);
        CHECK(st.epoch == 1);
      }
      CHECK(grp.ctrl[0]->abort != 0);  // and the group is broken
    }
  }

  TEST_CASE("the window is built and freed, or refused on every rank, without hanging (the destructor's rendezvous meets)") {
    MpiComm comm(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    const auto result = ut::error_of([&] {
      MpiDeviceWindow win(comm, 4096);
      win.set_timeout(std::chrono::seconds(60));
    });
    const Errc code = result.first;
    const std::string msg = result.second;  // (not a structured binding: CAPTURE() captures it in a lambda)
    CAPTURE(msg);
    if (ut::device_count() == 0) {  // every rank fails to allocate: one coded error everywhere, then the collective free of what was made
      CHECK(code == Errc::backend);
      CHECK(msg.find("MpiDeviceWindow: allocating and exporting the segments") != std::string::npos);
    } else {
      CHECK(code == Errc{});
    }
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
  }

  TEST_CASE("list logic: offsets of registered inputs, shares of staged ones, the peers' addresses") {
    detail::WindowRegistry reg(4096, 256);
    CHECK(reg.allocate(1000, 0, "MpiDeviceWindow") == 0);
    CHECK(reg.allocate(500, 0, "MpiDeviceWindow") == 1024);
    CHECK(reg.used() == 1524);
    std::vector<std::byte> slot0(4096), slot1(4096), outside(2048);
    const std::uint64_t expect[2] = {11, 12};
    PeerRecord in;
    in.count = 3;
    in.data[0] = slot0.data() + 1024, in.bytes[0] = 500;  // the second registration
    in.data[1] = outside.data(), in.bytes[1] = 700;        // staged
    in.data[2] = outside.data() + 1000, in.bytes[2] = 100;  // staged
    in.layouts = 11;
    in.peer_layouts = expect;
    detail::DeviceWindowRecord rec;
    std::vector<detail::DeviceStageCopy> stage;
    CHECK(detail::device_window_record(reg, slot0.data(), in, 256, 0, rec, stage) == "");
    // free bytes from 1536: (4096 - 1536) / 3 = 853, aligned down to 768 per input
    CHECK(rec.count == 3);
    CHECK(rec.layouts == 11);
    CHECK(rec.reg_count == 2);
    CHECK(rec.reg_total == 1500);
    CHECK(rec.reg_hash == reg.digest().hash);
    CHECK(rec.offset[0] == 1024);
    CHECK(rec.offset[1] == 1536 + 768);
    CHECK(rec.offset[2] == 1536 + 2 * 768);
    CHECK(rec.offset[3] == detail::DeviceWindowRecord::kNone);
    REQUIRE(stage.size() == 2);
    CHECK(stage[0].src == outside.data());
    CHECK(stage[0].offset == 2304);
    CHECK(stage[0].bytes == 700);
    CHECK(stage[1].src == outside.data() + 1000);
    CHECK(stage[1].offset == 3072);
    CHECK(stage[1].bytes == 100);
    std::byte* slots[2] = {slot0.data(), slot1.data()};
    PeerRecord views[2];
    detail::device_window_views(rec, in, slots, 2, views);
    CHECK(views[1].count == 3);
    CHECK(views[1].data[0] == slot1.data() + 1024);
    CHECK(views[1].data[1] == slot1.data() + 2304);
    CHECK(views[1].data[2] == slot1.data() + 3072);
    CHECK(views[1].data[3] == nullptr);
    CHECK(views[0].data[1] == slot0.data() + 2304);
    CHECK(views[0].layouts == 11);
    CHECK(views[1].layouts == 12);
    // An input in the slot past the registrations, and one that does not fit its share.
    in.data[0] = slot0.data() + 1400, in.bytes[0] = 500;
    CHECK(detail::device_window_record(reg, slot0.data(), in, 256, 0, rec, stage).find("runs past its registrations") != std::string::npos);
    in.data[0] = slot0.data(), in.bytes[0] = 1000;
    in.bytes[1] = 769;
    CHECK(detail::device_window_record(reg, slot0.data(), in, 256, 0, rec, stage).find("holds 768") != std::string::npos);
  }

  TEST_CASE("peer atomics: a visible peer GPU without native atomics over the link is refused; same GPU, NVLink, invisible peers pass") {
    const std::vector<std::string> bus = {"0000:19:00.0", "0000:3b:00.0", "0000:19:00.0", "0000:5d:00.0"};
    std::vector<std::string> asked;
    auto link = [&](bool visible, bool native) {
      return [&asked, visible, native](const std::string& id) {
        asked.push_back(id);
        detail::PeerLink l;
        l.visible = visible;
        l.native_atomics = native;
        return l;
      };
    };
    CHECK(detail::peer_atomics_error(0, bus, link(true, true)) == "");  // NVLink: native atomics
    CHECK(asked == std::vector<std::string>{"0000:3b:00.0", "0000:5d:00.0"});  // rank 2 shares rank 0's GPU: not asked
    CHECK(detail::peer_atomics_error(0, bus, link(false, false)) == "");  // CUDA_VISIBLE_DEVICES hides the peers: assumed
    const std::string e = detail::peer_atomics_error(2, bus, link(true, false));
    CHECK(e.find("the GPUs of rank 2 (0000:19:00.0) and rank 1 (0000:3b:00.0) have no native atomics") != std::string::npos);
    CHECK(e.find("PlanOptions::path = Path::alltoallv") != std::string::npos);
    CHECK(detail::peer_atomics_error(0, {"0000:19:00.0", "0000:19:00.0"}, link(true, false)) == "");  // one GPU, two processes
  }

  TEST_CASE("the device status as the host's coded errors") {
    struct Row {
      DeviceWaitCode code;
      std::uint64_t field, not_arrived, not_done, missed_call;
      Errc errc;
      const char* says;
    };
    const std::uint64_t r2 = 1u << 2, r0_63 = 1u | std::uint64_t{1} << 63;
    for (const Row& row : {Row{DeviceWaitCode::timeout_arrive, 0, r2 | 1u << 3, 0, 5, Errc::timeout, "for the peers to arrive; ranks {2, 3} did not arrive in call 5"},
                           Row{DeviceWaitCode::timeout_arrive, 0, 0, 0, 0, Errc::timeout, "for the peers to arrive; ranks {2} did not arrive in call 5"},
                           Row{DeviceWaitCode::timeout_done, 0, 0, r2, 5, Errc::timeout, "finish reading; ranks {2} did not finish reading in call 5"},
                           Row{DeviceWaitCode::aborted, 0, 0, 0, 0, Errc::aborted, "(rank 2 timed out or failed"},
                           Row{DeviceWaitCode::aborted, 0, r0_63, 0, 4, Errc::aborted, "(rank 2 broke it: ranks {0, 63} did not arrive in call 4)"},
                           Row{DeviceWaitCode::aborted, 0, 1, r2, 4, Errc::aborted,
                               "(rank 2 broke it: ranks {0} did not arrive in call 4; ranks {2} did not finish reading in call 4)"},
                           Row{DeviceWaitCode::record_mismatch, 1, 0, 0, 0, Errc::plan_mismatch, "other registrations"},
                           Row{DeviceWaitCode::record_mismatch, 4, 0, 0, 0, Errc::plan_mismatch, "input 2 at another offset"},
                           Row{DeviceWaitCode::layouts_mismatch, 0, 0, 0, 0, Errc::plan_mismatch, "other layouts"}}) {
      detail::DeviceWindowStatus st{static_cast<std::uint64_t>(row.code), 2, 5, row.field, row.not_arrived, row.not_done, row.missed_call};
      Errc code = Errc::backend;
      const std::string m = detail::device_window_failure(st, 1, 300, code);
      CAPTURE(m);
      CHECK(code == row.errc);
      CHECK(m.find(row.says) != std::string::npos);
      CHECK(m.find("rank 1: MpiDeviceWindowComm::with_peers (call 5)") != std::string::npos);
    }
  }
}

// ---- the device path across processes ----------------------------------------------------------

namespace {

int g_world = 1, g_rank = 0;

/// Rank r's shard of case c uploaded into `span` (device memory), sentinel in the gaps.
template <class T>
void upload(const std::vector<T>& v, const WindowSpan& span, cudaStream_t s) {
  UT_CUDA(cudaMemcpyAsync(span.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  UT_CUDA(cudaStreamSynchronize(s));
}
template <class T>
std::vector<T> download(const WindowSpan& span, std::size_t n, cudaStream_t s) {
  std::vector<T> v(n);
  UT_CUDA(cudaMemcpyAsync(v.data(), span.data(), n * sizeof(T), cudaMemcpyDeviceToHost, s));
  UT_CUDA(cudaStreamSynchronize(s));
  return v;
}

/// seq→head of case c with every input and output in the window (the inputs read in place by
/// the peers); `graph`: captured once into a CUDA graph and replayed `replays` times. "" or what
/// went wrong.
template <class T>
std::string run_in_window(const ut::Case& c, MPI_Comm world, bool graph, int replays) {
  MpiComm comm(world);
  const Plan plan = ut::plan_of<T>(c, comm.rank());
  const int NT = plan.num_tensors();
  // The largest shard any rank holds, for every rank's registrations alike.
  std::vector<unsigned long long> most(2 * static_cast<std::size_t>(NT));
  for (int t = 0; t < NT; ++t) most[2 * t] = plan.seq_bytes(t), most[2 * t + 1] = plan.head_bytes(t);
  MPI_Allreduce(MPI_IN_PLACE, most.data(), 2 * NT, MPI_UNSIGNED_LONG_LONG, MPI_MAX, world);
  std::size_t total = 0;
  for (auto b : most) total += static_cast<std::size_t>(b) + MpiDeviceWindow::kAlignment;
  MpiDeviceWindow win(comm, total);
  ut::Stream s;
  MpiDeviceWindowComm wc(comm, win, s.get());
  TensorList<ConstByteSpan> in;
  TensorList<ByteSpan> out;
  std::vector<WindowSpan> ins, outs;
  for (int t = 0; t < NT; ++t) {
    ins.push_back(win.allocate(static_cast<std::size_t>(most[2 * t])));
    outs.push_back(win.allocate(static_cast<std::size_t>(most[2 * t + 1])));
  }
  win.check_registrations();
  std::vector<std::vector<T>> want(NT);
  for (int t = 0; t < NT; ++t) {
    upload(ut::seq_shard<T>(plan, c, t, comm.rank()), ins[t], s.get());
    want[t] = ut::head_shard<T>(plan, c, t, comm.rank());
    upload(std::vector<T>(want[t].size(), ut::sentinel<T>()), outs[t], s.get());
    in.push_back({ins[t].data(), plan.seq_bytes(t)});
    out.push_back({outs[t].data(), plan.head_bytes(t)});
  }
  CudaExecutor ex(plan, s.get());
  if (!graph) {
    seq_to_head(plan, wc, ex, in, out, {});
  } else {
    seq_to_head(plan, wc, ex, in, out, {});  // the first call builds and uploads the lists (not capturable)
    wc.synchronize();
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    UT_CUDA(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal));
    seq_to_head(plan, wc, ex, in, out, {});
    UT_CUDA(cudaStreamEndCapture(s.get(), &g));
    UT_CUDA(cudaGraphInstantiate(&ge, g, 0));
    wc.synchronize();
    for (int t = 0; t < NT; ++t) upload(std::vector<T>(want[t].size(), ut::sentinel<T>()), outs[t], s.get());  // the replays must write them
    for (int i = 0; i < replays; ++i) UT_CUDA(cudaGraphLaunch(ge, s.get()));
    wc.synchronize();
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
  }
  wc.synchronize();
  if (wc.staged_bytes() != 0) return "inputs in the window were staged";
  for (int t = 0; t < NT; ++t) {
    const std::string d = ut::first_difference(download<T>(outs[t], want[t].size(), s.get()), want[t]);
    if (!d.empty()) return c.name + " rank " + std::to_string(comm.rank()) + " tensor " + std::to_string(t) + ": " + d;
  }
  return "";
}

}  // namespace

TEST_SUITE("device") {
  TEST_CASE("the peer copy across processes: inputs staged into the window, the case list bit for bit") {
    MpiComm comm(MPI_COMM_WORLD);
    MpiDeviceWindow win(comm, 64u << 20);
    ut::Stream s;
    MpiDeviceWindowComm wc(comm, win, s.get());
    std::vector<ut::Case> cases = ut::c2_cases(g_world);
    for (const auto& c : ut::c4_cases(g_world)) cases.push_back(c);
    for (auto c : cases) {
      if (c.P != g_world) continue;
      CAPTURE(c.name);
      CHECK(choose_path<MpiDeviceWindowComm, CudaExecutor>(ut::plan_of<float>(c, g_rank)) == Path::direct);
      CHECK(ut::run_case_device<float>(wc, c, s.get()) == "");
      CHECK(wc.staged_bytes() > 0);
      c.path = Path::alltoallv;  // forced: through host memory and the MpiComm
      CHECK(ut::run_case_device<float>(wc, c, s.get()) == "");
    }
    wc.synchronize();
  }

  TEST_CASE("the peer copy across processes: inputs in the window, read in place; captured in a CUDA graph") {
    for (const auto& c : ut::c2_cases(g_world)) {
      if (c.P != g_world) continue;
      CAPTURE(c.name);
      CHECK(run_in_window<float>(c, MPI_COMM_WORLD, false, 0) == "");
      CHECK(run_in_window<float>(c, MPI_COMM_WORLD, true, 3) == "");
    }
  }

  TEST_CASE("registrations in another order on one rank: plan_mismatch on every rank") {
    MpiComm comm(MPI_COMM_WORLD);
    MpiDeviceWindow win(comm, 1u << 20);
    if (g_rank == 1) win.allocate(4096), win.allocate(1024);
    else win.allocate(1024), win.allocate(4096);
    expect_error(Errc::plan_mismatch, "rank 1: 2 buffers (4096, 1024 bytes)", [&] { win.check_registrations(); });
    // The device check: a peer copy on these registrations reports it at synchronize().
    ut::Stream s;
    MpiDeviceWindowComm wc(comm, win, s.get(), std::chrono::milliseconds(20000));
    const ut::Case c = ut::c2_cases(g_world).front();
    expect_error(Errc::plan_mismatch, "other registrations", [&] {
      (void)ut::run_case_device<float>(wc, c, s.get());  // (its outputs are unspecified)
      wc.synchronize();
    });
    expect_error(Errc::aborted, "broken", [&] { wc.check(); });
  }

  TEST_CASE("a rank that never enters: the others get timeout naming it, then aborted") {
    MpiComm comm(MPI_COMM_WORLD);
    MpiDeviceWindow win(comm, 1u << 20);
    ut::Stream s;
    MpiDeviceWindowComm wc(comm, win, s.get(), std::chrono::milliseconds(300));
    const int absent = g_world - 1;  // (under -n 2: rank 0 alone enters)
    if (g_rank != absent) {
      ut::DeviceBuffer x(64);
      expect_error(Errc::timeout, "ranks {" + std::to_string(absent) + "} did not arrive in call 1", [&] {
        PeerRecord mine;
        mine.count = 1;
        mine.data[0] = x.get(), mine.bytes[0] = 64;
        wc.with_peers(&mine, [](void*, const void* const*) {}, nullptr);
        wc.synchronize();
      });
      expect_error(Errc::aborted, "broken", [&] { wc.check(); });
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }

  TEST_CASE("a rank that skips the destructor: the others' destructors leak the window after its timeout, never hang") {
    MpiComm comm(MPI_COMM_WORLD);
    const int stopped = 0;
    auto win = std::make_unique<MpiDeviceWindow>(comm, 1u << 20);
    win->set_timeout(std::chrono::milliseconds(300));
    CHECK(win->timeout() == std::chrono::milliseconds(300));
    if (g_rank != stopped) {
      const auto t0 = std::chrono::steady_clock::now();
      win.reset();  // MPI_Barrier here would wait for rank 0, which is in the MPI_Barrier below: a hang
      CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(300 + 5000));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == stopped) {
      CHECK(!win->broken());  // the verdict alone says leak: its destructor does not wait
      const auto t0 = std::chrono::steady_clock::now();
      win.reset();
      CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    }
    MpiDeviceWindow again(comm, 1u << 20);  // every rank present: freed collectively
    if (g_rank == 1) again.mark_broken();   // group-wide: every rank's destructor then leaks at once
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(again.broken());
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  doctest::Context ctx(argc, argv);
  if (g_rank != 0) ctx.setOption("minimal", true);
  const int devices = ut::device_count();
  if (devices == 0) {
    if (g_rank == 0) std::printf("no CUDA device: skipping the device tests (the protocol and list logic run on the host)\n");
    ctx.setOption("test-suite", "host");
  } else if (g_world < 2) {
    if (g_rank == 0) std::printf("one process: skipping the device tests (run under mpiexec -n 2 or more)\n");
    ctx.setOption("test-suite", "host");
  } else {
    UT_CUDA(cudaSetDevice(g_rank % devices));
  }
  const int failed = ctx.run();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any ? 1 : 0;
}
