// SPDX-License-Identifier: Apache-2.0
// comm/nccl.cuh: NcclComm with the CUDA executor. With one device: P=1 (every shared case that
// has a P=1 form, and the raw all-to-all-v paths). With >= 2 devices: the shared cases (C1–C8,
// zigzag, models) end to end on P GPUs of this process, one thread per GPU, one NCCL communicator
// each (ncclCommInitAll), for every P <= the device count. Without a device only the suite "host"
// runs (see support/device_main.cpp).
#include <doctest/doctest.h>
#include <ulysses/comm/nccl.cuh>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "device_harness.cuh"
#include "expect_error.hpp"

using namespace ulysses;

namespace {

void nccl_ok(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}

/// NCCL communicators over devices 0..P-1 of this process (ncclCommInitAll), with a stream on
/// each device. Made once per P and kept for the whole test run.
class NcclWorld {
 public:
  explicit NcclWorld(int P) : comms_(static_cast<std::size_t>(P)), streams_(static_cast<std::size_t>(P)) {
    std::vector<int> devs(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) devs[static_cast<std::size_t>(r)] = r;
    nccl_ok(ncclCommInitAll(comms_.data(), P, devs.data()), "ncclCommInitAll");
    for (int r = 0; r < P; ++r) {
      UT_CUDA(cudaSetDevice(r));
      UT_CUDA(cudaStreamCreateWithFlags(&streams_[static_cast<std::size_t>(r)], cudaStreamNonBlocking));
    }
    UT_CUDA(cudaSetDevice(0));
  }
  ~NcclWorld() {
    for (std::size_t r = 0; r < comms_.size(); ++r) {
      cudaSetDevice(static_cast<int>(r));
      cudaStreamDestroy(streams_[r]);
      ncclCommDestroy(comms_[r]);
    }
    cudaSetDevice(0);
  }
  int size() const { return static_cast<int>(comms_.size()); }

  /// Runs fn(NcclComm&) on one thread per rank (its device current); returns all failures.
  template <class F>
  std::string run(F&& fn) {
    std::vector<std::string> err(comms_.size());
    std::vector<std::thread> th;
    for (int r = 0; r < size(); ++r)
      th.emplace_back([&, r] {
        auto& e = err[static_cast<std::size_t>(r)];
        try {
          UT_CUDA(cudaSetDevice(r));
          NcclComm comm(comms_[static_cast<std::size_t>(r)], streams_[static_cast<std::size_t>(r)]);
          e = fn(comm);
        } catch (const std::exception& x) {
          e = x.what();
        }
      });
    for (auto& t : th) t.join();
    std::string all;
    for (auto& e : err) all += e.empty() ? "" : e + "\n";
    return all;
  }

 private:
  std::vector<ncclComm_t> comms_;
  std::vector<cudaStream_t> streams_;
};

NcclWorld& world(int P) {
  // Kept until the process exits (never destroyed: no NCCL teardown racing the CUDA runtime's).
  static auto* worlds = new std::map<int, std::unique_ptr<NcclWorld>>;
  auto& w = (*worlds)[P];
  if (!w) w = std::make_unique<NcclWorld>(P);
  return *w;
}

template <class T>
void check_nccl(const std::vector<ut::Case>& cases) {
  for (auto c : cases)
    for (Path path : ut::device_paths<NcclComm>()) {  // grouped send/recv of chunks, then of pieces
      if (c.P > ut::device_count()) continue;
      c.path = path;
      const std::string via = to_string(path);
      CAPTURE(c.name);
      CAPTURE(via);
      CHECK(world(c.P).run([&](NcclComm& comm) { return ut::run_case_device<T>(comm, c, comm.stream()); }) == "");
    }
}

/// Raw alltoallv on P=1 from offset `so` to offset `ro` of `n` bytes; "" when the bytes arrive.
std::string self_exchange(std::size_t n, std::size_t so, std::size_t ro) {
  return world(1).run([&](NcclComm& comm) -> std::string {
    std::vector<std::byte> h(so + n);
    ut::fill_random(h, 5);
    ut::DeviceBuffer send(so + n), recv(ro + n);
    send.upload(h.data(), comm.stream());
    const std::size_t sb[1] = {n}, sof[1] = {so}, rb[1] = {n}, rof[1] = {ro};
    if (NcclComm::path(1, sb, rb) != NcclComm::Path::send_recv) return "unexpected path";
    comm.alltoallv(send.get(), sb, sof, recv.get(), rb, rof);
    std::vector<std::byte> got(ro + n);
    recv.download(got.data(), comm.stream());
    return std::equal(got.begin() + static_cast<std::ptrdiff_t>(ro), got.end(), h.begin() + static_cast<std::ptrdiff_t>(so))
               ? ""
               : "bytes differ";
  });
}

/// A fake NCCL behind NcclComm's seam (detail::NcclCalls): two ranks, this one rank 0; what each
/// call returns is set per test; the calls are counted. Host only: no device, no NCCL communicator.
struct FakeNccl {
  ncclResult_t group_end = ncclSuccess;         // what ncclGroupEnd returns
  ncclResult_t async = ncclSuccess;             // what ncclCommGetAsyncError reports
  ncclResult_t async_after_end = ncclSuccess;   // ... once ncclGroupEnd has run
  cudaError_t query = cudaSuccess;              // what cudaStreamQuery returns
  int error_at_query = 0;                       // > 0: at that cudaStreamQuery, ncclCommGetAsyncError turns to ncclRemoteError
  int not_ready_queries = 0;                    // the first n cudaStreamQuery calls return cudaErrorNotReady (then `query`)
  int in_progress_polls = 0;                    // the next n ncclCommGetAsyncError calls report ncclInProgress (then `async`)
  ncclResult_t split = ncclSuccess;             // what ncclCommSplit returns (it sets the child)
  int posted = 0, stops = 0, queries = 0, polls = 0, aborts = 0, splits = 0;
};
FakeNccl fake;
ncclComm_t fake_handle(std::uintptr_t n) { return reinterpret_cast<ncclComm_t>(n); }  // never dereferenced

detail::NcclCalls fake_calls() {
  detail::NcclCalls c = detail::nccl_calls();  // stop_frees as the real build
  c.comm_count = [](ncclComm_t, int* n) { return *n = 2, ncclSuccess; };
  c.user_rank = [](ncclComm_t, int* r) { return *r = 0, ncclSuccess; };
  c.group_start = [] { return ncclSuccess; };
  c.group_end = [] { return fake.async = fake.async_after_end, fake.group_end; };
  c.send = [](const void*, std::size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) { return ++fake.posted, ncclSuccess; };
  c.recv = [](void*, std::size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) { return ++fake.posted, ncclSuccess; };
  c.all_gather = [](const void* mine, void* all, std::size_t n, ncclDataType_t, ncclComm_t, cudaStream_t) {  // rank 1 sent the same
    for (int r = 0; r < 2; ++r) std::memmove(static_cast<char*>(all) + r * n, mine, n);
    return ncclSuccess;
  };
  c.async_error = [](ncclComm_t, ncclResult_t* s) {
    ++fake.polls;
    if (fake.in_progress_polls > 0) return --fake.in_progress_polls, *s = ncclInProgress, ncclSuccess;
    return *s = fake.async, ncclSuccess;
  };
  c.last_error = [](ncclComm_t) { return "fake: peer 1 closed its connection"; };
  c.stop = [](ncclComm_t) { return ++fake.stops, ncclSuccess; };
  c.stream_query = [](cudaStream_t) {
    if (++fake.queries == fake.error_at_query) fake.async = ncclRemoteError;
    return fake.queries <= fake.not_ready_queries ? cudaErrorNotReady : fake.query;
  };
  c.abort = [](ncclComm_t) { return ++fake.aborts, ncclSuccess; };
  c.split = [](ncclComm_t, int color, int, ncclComm_t* out, ncclConfig_t*) {
    *out = fake_handle(0x100 + static_cast<std::uintptr_t>(color));
    return ++fake.splits, fake.split;
  };
  // allgather's CUDA calls on host memory (the fake communicator's "device" is the host)
  c.is_capturing = [](cudaStream_t, cudaStreamCaptureStatus* st) { return *st = cudaStreamCaptureStatusNone, cudaSuccess; };
  c.malloc_async = [](void** p, std::size_t n, cudaStream_t) { return *p = std::malloc(n), cudaSuccess; };
  c.free_async = [](void* p, cudaStream_t) { return std::free(p), cudaSuccess; };
  c.memcpy_async = [](void* d, const void* src, std::size_t n, cudaMemcpyKind, cudaStream_t) { return std::memcpy(d, src, n), cudaSuccess; };
  return c;
}
/// The fake table with the stop of the other kind: abort (handle freed) or revoke (handle valid).
const detail::NcclCalls& fake_table_stopping(bool frees) {
  static const detail::NcclCalls aborting = [] {
    detail::NcclCalls c = fake_calls();
    c.stop_frees = true;
    return c;
  }();
  static const detail::NcclCalls revoking = [] {
    detail::NcclCalls c = fake_calls();
    c.stop_frees = false;
    return c;
  }();
  return frees ? aborting : revoking;
}
const detail::NcclCalls& fake_table() {
  static const detail::NcclCalls c = fake_calls();
  return c;
}

constexpr std::chrono::milliseconds kDeadline{100};
constexpr double kMarginMs = 1000;  // scheduling delays on a loaded machine, not a speed target

/// One all-to-all-v of 8 bytes each way with rank 1 (device pointers are never touched by the fake).
void fake_exchange(NcclComm& comm) {
  std::byte b[16] = {};
  const std::size_t n[2] = {0, 8}, o[2] = {0, 8};
  comm.alltoallv(b, n, o, b, n, o);
}

/// Every call of a broken communicator throws aborted at once, calling nothing of NCCL's.
void check_broken(NcclComm& comm, const std::string& why) {
  const int posted = fake.posted, stops = fake.stops, queries = fake.queries;
  for (int call = 0; call < 3; ++call) {
    const ut::TimedError e = ut::timed_error_of([&] {
      if (call == 0) fake_exchange(comm);
      if (call == 1) comm.synchronize();
      if (call == 2) comm.exchange_messages(nullptr, 0, nullptr, 0);
    });
    CAPTURE(call);
    CAPTURE(e.message);
    CHECK(e.code == Errc::aborted);
    CHECK(e.ms < 50);
    CHECK(e.message.find(why) != std::string::npos);
  }
  CHECK(comm.broken());
  CHECK(comm.handle_freed() == !NcclComm::revokes());
  CHECK(fake.posted == posted);
  CHECK(fake.stops == stops);
  CHECK(fake.queries == queries);
}

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("NcclComm with the CUDA executor takes the message path (one message per piece) by default") {
    CHECK(PathSupport<NcclComm, CudaExecutor>::messages);
    CHECK(!PathSupport<NcclComm, CudaExecutor>::direct);
    CHECK(!PathSupport<NcclComm, HostExecutor>::messages);  // host executor, device communicator: no
    const Plan plan({2, 0}, 1, SeqPartition::even(4, 2), {TensorSpec::of<float>(HeadPartition::even(2, 2), 4)});
    CHECK(choose_path<NcclComm, CudaExecutor>(plan) == Path::messages);
  }

  TEST_CASE("path: grouped send/recv whenever a byte moves (never ncclAlltoAll: ranks could not agree on it)") {
    const std::size_t pb[4] = {100, 0, 100, 100};  // a plan's chunks: own chunk 0
    CHECK(NcclComm::path(4, pb, pb) == NcclComm::Path::send_recv);
    const std::size_t cb[4] = {100, 100, 100, 100};  // the canonical all-to-all layout: still send/recv
    CHECK(NcclComm::path(4, cb, cb) == NcclComm::Path::send_recv);
    const std::size_t zb[4] = {0, 0, 0, 0};
    CHECK(NcclComm::path(4, zb, zb) == NcclComm::Path::none);
    CHECK(NcclComm::path(4, zb, pb) == NcclComm::Path::send_recv);  // receives only
    CHECK(NcclComm::device_memory);
  }
}

TEST_SUITE("host") {
  TEST_CASE("failure model (fake NCCL): a non-blocking exchange still in progress at the deadline is a timeout; the communicator is stopped once, then broken") {
    fake = FakeNccl{};
    fake.group_end = ncclInProgress;
    fake.async_after_end = ncclInProgress;  // never leaves ncclInProgress: a peer that never comes
    NcclComm comm(nullptr, nullptr, kDeadline, fake_table());
    CHECK(comm.timeout() == kDeadline);
    const ut::TimedError e = ut::timed_error_of([&] { fake_exchange(comm); });
    CAPTURE(e.message);
    CHECK(e.code == Errc::timeout);
    CHECK(e.ms >= kDeadline.count() * 0.95);
    CHECK(e.ms < kDeadline.count() + kMarginMs);
    CHECK(e.message.find("ncclGroupEnd still in progress after 100 ms") != std::string::npos);
    CHECK(e.message.find(NcclComm::revokes() ? "ncclCommRevoke" : "ncclCommAbort") != std::string::npos);
    CHECK(fake.posted == 2);
    CHECK(fake.stops == 1);
    check_broken(comm, "still in progress");
    MESSAGE("in-progress timeout after " << e.ms << " ms (deadline " << kDeadline.count() << " ms); a failed communicator is "
                                         << (NcclComm::revokes() ? "revoked (ncclCommRevoke)" : "aborted (ncclCommAbort)"));
  }

  TEST_CASE("failure model (fake NCCL): abort() (what a call failing on this rank alone does) stops the communicator once, then every call is aborted with the reason") {
    fake = FakeNccl{};
    NcclComm comm(nullptr, nullptr, kDeadline, fake_table());
    static_assert(comm_traits<NcclComm>::abort, "NcclComm has abort(): comm/tell_peers.hpp breaks its group");
    comm.abort("rank 0 failed in seq_to_head with ulysses: buffer_too_small: output 0 holds 2 bytes too few");
    CHECK(fake.stops == 1);  // revoked (or aborted): nothing of this rank stays enqueued; NCCL carries no message to the peers
    CHECK(comm.broken());
    comm.abort("a second failure");  // a no-op: the first reason is kept, the communicator is not stopped again
    CHECK(fake.stops == 1);
    check_broken(comm, "rank 0 failed in seq_to_head with ulysses: buffer_too_small");
  }

  TEST_CASE("failure model (fake NCCL): an asynchronous error of an earlier operation (a dead peer) is backend at the next call, with NCCL's last error") {
    fake = FakeNccl{};
    fake.async = ncclRemoteError;
    NcclComm comm(nullptr, nullptr, kDeadline, fake_table());
    const ut::TimedError e = ut::timed_error_of([&] { fake_exchange(comm); });
    CAPTURE(e.message);
    CHECK(e.code == Errc::backend);
    CHECK(e.ms < 50);
    CHECK(e.message.find(ncclGetErrorString(ncclRemoteError)) != std::string::npos);
    CHECK(e.message.find("fake: peer 1 closed its connection") != std::string::npos);
    CHECK(fake.posted == 0);  // nothing posted on a failed communicator
    CHECK(fake.stops == 1);
    check_broken(comm, "peer 1 closed its connection");
  }

  TEST_CASE("failure model (fake NCCL): synchronize() is a bounded stream wait; a stalled stream is a timeout, a drained one returns") {
    fake = FakeNccl{};
    {
      NcclComm comm(nullptr, nullptr, kDeadline, fake_table());
      fake.query = cudaSuccess;
      comm.synchronize();
      CHECK(!comm.broken());
      fake_exchange(comm);  // a healthy exchange: posted, nothing stopped
      CHECK(fake.posted == 2);
      CHECK(fake.stops == 0);
      fake.query = cudaErrorNotReady;  // the exchange's peer never comes: the stream never drains
      const ut::TimedError e = ut::timed_error_of([&] { comm.synchronize(); });
      CAPTURE(e.message);
      CHECK(e.code == Errc::timeout);
      CHECK(e.ms >= kDeadline.count() * 0.95);
      CHECK(e.ms < kDeadline.count() + kMarginMs);
      CHECK(e.message.find("the stream had not finished after 100 ms") != std::string::npos);
      CHECK(fake.stops == 1);
      check_broken(comm, "the stream had not finished");
      MESSAGE("stalled-stream timeout after " << e.ms << " ms (deadline " << kDeadline.count() << " ms)");
    }
    {
      fake = FakeNccl{};
      NcclComm comm(nullptr, nullptr, kDeadline, fake_table());
      fake.query = cudaErrorNotReady;
      fake.error_at_query = 40;  // the asynchronous error arrives while synchronize() waits
      const ut::TimedError e = ut::timed_error_of([&] { comm.synchronize(); });
      CAPTURE(e.message);
      CHECK(e.code == Errc::backend);
      CHECK(e.ms < kDeadline.count());
      check_broken(comm, ncclGetErrorString(ncclRemoteError));
    }
  }

  TEST_CASE("failure model (fake NCCL): an NCCL error while posting closes the group and stops the communicator") {
    fake = FakeNccl{};
    fake.group_end = ncclInvalidUsage;
    NcclComm comm(nullptr, nullptr, kDeadline, fake_table());
    NcclComm copy = comm;  // copies share the failure state
    CHECK(ut::code_of([&] { fake_exchange(comm); }) == Errc::backend);
    CHECK(fake.stops == 1);
    check_broken(copy, "ncclGroupEnd failed");
  }
}

namespace {
/// A fake of NcclWindow's NCCL calls (detail::NcclWindowCalls): host memory, counted, with the
/// number of stream queries seen at the deregistration and the free (the teardown's order).
struct FakeWindow {
  ncclResult_t reg = ncclSuccess;  // what ncclCommWindowRegister returns
  bool stuck = false;              // the registration never completes: ncclCommGetAsyncError reports ncclInProgress from then on
  int allocs = 0, frees = 0, registers = 0, deregisters = 0;
  int queries_at_deregister = -1, queries_at_free = -1;
  void* buffer = nullptr;  // the last allocation (a leaked one is freed by the test)
};
FakeWindow fwin;
detail::NcclWindowCalls fake_window_calls() {
  detail::NcclWindowCalls c{};
  c.mem_alloc = [](void** p, std::size_t n) { return ++fwin.allocs, *p = fwin.buffer = std::malloc(n), ncclSuccess; };
  c.mem_free = [](void* p) { return ++fwin.frees, fwin.queries_at_free = fake.queries, std::free(p), ncclSuccess; };
  c.window_register = [](ncclComm_t, void*, std::size_t, ncclWindow_t* w, int) {
    *w = reinterpret_cast<ncclWindow_t>(std::uintptr_t{0x200});
    if (fwin.stuck) fake.async = ncclInProgress;
    return ++fwin.registers, fwin.reg;
  };
  c.window_deregister = [](ncclComm_t, ncclWindow_t) { return ++fwin.deregisters, fwin.queries_at_deregister = fake.queries, ncclSuccess; };
  return c;
}
const detail::NcclWindowCalls& fake_window_table() {
  static const detail::NcclWindowCalls c = fake_window_calls();
  return c;
}
}  // namespace

TEST_SUITE("host") {
  TEST_CASE("versions: ncclCommRevoke is resolved at run time in the loaded libnccl (no link-time reference), else abort") {
    const int v = detail::nccl_loaded_version();
    MESSAGE("loaded libnccl " << v << " (headers " << NCCL_VERSION_CODE << "); a failed communicator is "
                              << (NcclComm::revokes() ? "revoked" : "aborted"));
    CHECK(v > 0);
    CHECK(NcclComm::revokes() == static_cast<bool>(detail::nccl_revoke()));
    CHECK(detail::nccl_calls().stop_frees == !NcclComm::revokes());
    if (v < 22800) CHECK(!detail::nccl_revoke());
    CHECK(static_cast<bool>(detail::nccl_symbol("ncclGetVersion")));
    CHECK(!detail::nccl_symbol("ncclNoSuchFunction"));
  }

  TEST_CASE("failure model (fake NCCL): timeout milliseconds::max() is no bound (no overflow into an instant timeout)") {
    fake = FakeNccl{};
    fake.group_end = ncclInProgress;
    fake.in_progress_polls = 2000;  // the exchange is enqueued after 2000 polls (> 1 ms)
    NcclComm comm(nullptr, nullptr, std::chrono::milliseconds::max(), fake_table());
    const ut::TimedError e = ut::timed_error_of([&] { fake_exchange(comm); });
    CAPTURE(e.message);
    CHECK(e.code == Errc{});
    CHECK(fake.in_progress_polls == 0);
    CHECK(fake.stops == 0);
    CHECK(!comm.broken());
  }

  TEST_CASE("split_by_node / split_ring (fake NCCL): a non-blocking split's ncclInProgress is polled on the child until success, bounded") {
    fake = FakeNccl{};
    const detail::NcclCalls& calls = fake_table();
    const Mesh mesh(2, 1, 1);  // two nodes of one rank: Ulysses groups of 1, an outer group of 2
    fake.split = ncclInProgress;
    fake.in_progress_polls = 50;  // the first split finishes after 50 polls, the second at once
    const NcclMesh m = split_by_node(fake_handle(1), mesh, 0, kDeadline, calls);
    CHECK(m.ulysses == fake_handle(0x100 + static_cast<std::uintptr_t>(mesh.ulysses_group(0))));
    CHECK(m.outer == fake_handle(0x100 + static_cast<std::uintptr_t>(mesh.outer_group(0))));
    CHECK(fake.splits == 2);
    CHECK(fake.polls == 52);  // 50 in progress + the success that ends each wait
    CHECK(fake.aborts == 0);
    // A split that never finishes: timeout within the deadline, the children aborted.
    fake = FakeNccl{};
    fake.split = ncclInProgress;
    fake.async = ncclInProgress;
    const ut::TimedError e = ut::timed_error_of([&] { split_by_node(fake_handle(1), mesh, 0, kDeadline, calls); });
    CAPTURE(e.message);
    CHECK(e.code == Errc::timeout);
    CHECK(e.ms >= kDeadline.count() * 0.95);
    CHECK(e.ms < kDeadline.count() + kMarginMs);
    CHECK(e.message.find("ncclCommSplit (non-blocking) still in progress after 100 ms") != std::string::npos);
    CHECK(fake.splits == 1);
    CHECK(fake.aborts == 1);
    // An error: backend, child aborted; split_ring the same.
    fake = FakeNccl{};
    fake.split = ncclInProgress;
    fake.async = ncclRemoteError;
    CHECK(ut::code_of([&] { split_ring(fake_handle(1), Mesh(2, 1, 2, 2), 0, kDeadline, calls); }) == Errc::backend);
    CHECK(fake.aborts == 1);
    fake = FakeNccl{};
    fake.split = ncclInProgress;
    fake.in_progress_polls = 10;
    const NcclRingMesh rm = split_ring(fake_handle(1), Mesh(2, 1, 2, 2), 0, kDeadline, calls);
    CHECK(fake.splits == 4);
    CHECK(rm.ulysses != nullptr);
    CHECK(rm.outer != nullptr);
  }

#if ULYSSES_NCCL_HAS_WINDOWS
  TEST_CASE("NcclWindow (fake NCCL): a non-blocking registration is waited out; teardown waits for the stream, then deregisters, then frees") {
    fake = FakeNccl{};
    fwin = FakeWindow{};
    fwin.reg = ncclInProgress;
    NcclComm comm(nullptr, nullptr, kDeadline, fake_table());
    {
      fake.in_progress_polls = 30;  // the registration completes after 30 polls of ncclCommGetAsyncError
      NcclWindow win(comm, 1000, fake_window_table());
      CHECK(win.get() == reinterpret_cast<ncclWindow_t>(std::uintptr_t{0x200}));
      CHECK(fake.in_progress_polls == 0);
      CHECK(fwin.registers == 1);
      CHECK(fwin.frees == 0);
      CHECK(!comm.broken());
      fake.not_ready_queries = fake.queries + 20;  // an ncclSend still reads the window: 20 more queries until the stream drains
    }
    CHECK(fwin.deregisters == 1);
    CHECK(fwin.frees == 1);
    CHECK(fwin.queries_at_deregister >= fake.not_ready_queries + 1);  // after the stream drained
    CHECK(fwin.queries_at_free == fwin.queries_at_deregister);
    CHECK(fake.stops == 0);
  }

  TEST_CASE("NcclWindow (fake NCCL): a registration still in progress at the deadline is a timeout; the buffer is not freed under NCCL") {
    for (bool aborts : {true, false}) {
      CAPTURE(aborts);
      fake = FakeNccl{};
      fwin = FakeWindow{};
      fwin.reg = ncclInProgress;
      fwin.stuck = true;  // never completes, never quiescent
      NcclComm comm(nullptr, nullptr, kDeadline, fake_table_stopping(aborts));
      const ut::TimedError e = ut::timed_error_of([&] { NcclWindow win(comm, 1000, fake_window_table()); });
      CAPTURE(e.message);
      CHECK(e.code == Errc::timeout);
      CHECK(e.message.find("ncclCommWindowRegister still in progress") != std::string::npos);
      CHECK(comm.broken());
      CHECK(comm.handle_freed() == aborts);
      CHECK(fake.stops == 1);
      CHECK(fwin.deregisters == 0);
      CHECK(fwin.frees == 0);  // leaked: NCCL may still be registering it
      std::free(fwin.buffer);
    }
  }

  TEST_CASE("NcclWindow (fake NCCL): destroyed after its communicator failed: no deregistration; aborted leaks, revoked frees once quiescent") {
    for (bool aborts : {true, false}) {
      CAPTURE(aborts);
      fake = FakeNccl{};
      fwin = FakeWindow{};
      NcclComm comm(nullptr, nullptr, kDeadline, fake_table_stopping(aborts));
      {
        NcclWindow win(comm, 1000, fake_window_table());
        CHECK(fwin.registers == 1);
        fake.async = ncclRemoteError;  // a peer died
        CHECK(ut::code_of([&] { fake_exchange(comm); }) == Errc::backend);
        CHECK(comm.broken());
        fake.async = ncclSuccess;  // after the revoke: quiescent
      }
      CHECK(fwin.deregisters == 0);  // no collective call on a broken (freed or revoked) communicator
      CHECK(fwin.frees == (aborts ? 0 : 1));
      if (aborts) std::free(fwin.buffer);
    }
  }

  TEST_CASE("NcclWindow (fake NCCL): a loaded libnccl without windows is a clear backend error, before any collective") {
    fake = FakeNccl{};
    detail::NcclWindowCalls none = fake_window_calls();
    none.window_register = nullptr;
    none.window_deregister = nullptr;
    NcclComm comm(nullptr, nullptr, kDeadline, fake_table());
    const auto [code, message] = ut::error_of([&] { NcclWindow win(comm, 1000, none); });
    CHECK(code == Errc::backend);
    CHECK(message.find("has no ncclCommWindowRegister") != std::string::npos);
    CHECK(fake.queries == 0);
  }
#endif
}

TEST_CASE("NCCL P=1: raw all-to-all-v, grouped send/recv to self") {
  CHECK(self_exchange(1000, 0, 0) == "");
  CHECK(self_exchange(1000, 24, 8) == "");
}

TEST_CASE("NCCL P=1, non-blocking communicator: calls return with the work enqueued (ncclInProgress waited out)") {
  ncclUniqueId id;
  nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t nc = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&nc, 1, id, 0, &cfg);
  while (r == ncclInProgress) ncclCommGetAsyncError(nc, &r);
  REQUIRE(r == ncclSuccess);
  ut::Stream s;
  {
    NcclComm comm(nc, s.get());
    const std::uint64_t mine = 0x0123456789abcdefull;
    std::uint64_t all = 0;
    comm.allgather(&mine, sizeof mine, &all);  // returned: the bytes are there
    CHECK(all == mine);
    CHECK(ut::run_case_device<float>(comm, ut::c2_cases(1)[1], s.get()) == "");
  }
  ncclCommDestroy(nc);
}

TEST_CASE("NCCL P=1: the plan check refuses to run inside a stream capture; an executor on another stream is refused") {
  CHECK(world(1).run([](NcclComm& comm) -> std::string {
    const Plan plan({1, 0}, 1, SeqPartition::even(4, 1), {TensorSpec::of<float>(HeadPartition::even(2, 1), 4)});
    cudaGraph_t g = nullptr;
    UT_CUDA(cudaStreamBeginCapture(comm.stream(), cudaStreamCaptureModeThreadLocal));
    std::string err;
    try {
      check_agreement(plan, comm);
      err = "no error under capture";
    } catch (const Error& e) {
      if (e.code() != Errc::backend || std::string(e.what()).find("before capturing") == std::string::npos) err = e.what();
    }
    UT_CUDA(cudaStreamEndCapture(comm.stream(), &g));
    if (g) UT_CUDA(cudaGraphDestroy(g));
    ut::Stream other;
    CudaExecutor ex(plan, other.get());
    ut::DeviceBuffer in(plan.seq_bytes(0)), out(plan.head_bytes(0)), ws(16);
    try {
      seq_to_head(plan, comm, ex, ConstByteSpan{in.get(), in.bytes()}, ByteSpan{out.get(), out.bytes()}, ByteSpan{ws.get(), 16});
      err += " executor on another stream accepted";
    } catch (const Error& e) {
      if (e.code() != Errc::comm_mismatch) err += e.what();
    }
    UT_CUDA(cudaStreamSynchronize(other.get()));
    return err;
  }) == "");
}

TEST_CASE("NCCL P=1: allgather of host memory (what check_agreement uses)") {
  CHECK(world(1).run([](NcclComm& comm) -> std::string {
    const std::uint64_t mine = 0x0123456789abcdefull;
    std::uint64_t all = 0;
    comm.allgather(&mine, sizeof mine, &all);
    const Plan plan({1, 0}, 1, SeqPartition::even(4, 1), {TensorSpec::of<float>(HeadPartition::even(2, 1), 4)});
    check_agreement(plan, comm);
    return all == mine && plan.agreement_checked() ? "" : "allgather lost the bytes";
  }) == "");
}

TEST_CASE("NCCL split_ring (comm/nccl_mesh.cuh): the Ulysses group, ring, block and outer group of every U x R of the devices") {
  const int n = std::min(ut::device_count(), 2);
  for (int W = 1; W <= n; ++W)
    for (int U = 1; U <= W; ++U) {
      if (W % U) continue;
      const Mesh mesh(W, U, W / U, W);
      CHECK(world(W).run([&](NcclComm& comm) -> std::string {
        NcclRingMesh m = split_ring(comm.get(), mesh, comm.rank());
        int nu = 0, nr = 0, nb = 0, no = 0, ru = 0, rr = 0;
        ncclCommCount(m.ulysses, &nu), ncclCommCount(m.ring, &nr), ncclCommCount(m.block, &nb), ncclCommCount(m.outer, &no);
        ncclCommUserRank(m.ulysses, &ru), ncclCommUserRank(m.ring, &rr);
        m.destroy();
        const int w = comm.rank();
        if (nu != U || nr != W / U || nb != W || no != 1 || ru != mesh.ulysses_rank(w) || rr != mesh.ring_rank(w))
          return "split_ring made groups of " + std::to_string(nu) + ", " + std::to_string(nr) + ", " + std::to_string(nb) + ", " +
                 std::to_string(no) + " ranks";
        return m.ulysses == nullptr && m.ring == nullptr ? "" : "destroy() left a handle";
      }) == "");
    }
  CHECK(world(1).run([](NcclComm& comm) -> std::string {
    return ut::code_of([&] { split_ring(comm.get(), Mesh(2, 1, 2, 2), 0); }) == Errc::invalid_mesh ? "" : "a mesh of 2 on a world of 1";
  }) == "");
}

TEST_CASE("NCCL P=1: a symmetric window (where NCCL has them): registrations in order, checked, used by an exchange") {
#if ULYSSES_NCCL_HAS_WINDOWS
  CHECK(world(1).run([](NcclComm& comm) -> std::string {
    NcclWindow win(comm, 1000);
    if (win.bytes_per_rank() != NCCL_WIN_REQUIRED_ALIGNMENT) return "bytes_per_rank not rounded up to NCCL's alignment";
    const WindowSpan a = win.allocate(100), b = win.allocate(300);
    if (a.data() != win.local().data() || b.data() != win.local().data() + 256 || win.registrations() != 2) return "registrations out of order";
    win.check_registrations();
    const std::string full = ut::error_of([&] { win.allocate(NCCL_WIN_REQUIRED_ALIGNMENT); }).second;
    if (full.find("NcclWindow::allocate") == std::string::npos) return "a registration past the end: " + full;
    const std::vector<float> x = {1, 2, 3, 4};
    UT_CUDA(cudaMemcpy(a.data(), x.data(), sizeof(float) * 4, cudaMemcpyHostToDevice));
    std::size_t n = 16, off = 0;
    comm.alltoallv(a.data(), &n, &off, b.data(), &n, &off);
    std::vector<float> y(4);
    UT_CUDA(cudaStreamSynchronize(comm.stream()));
    UT_CUDA(cudaMemcpy(y.data(), b.data(), sizeof(float) * 4, cudaMemcpyDeviceToHost));
    return y == x ? "" : "the exchange between window buffers lost the bytes";
  }) == "");
#else
  MESSAGE("the installed NCCL has no symmetric windows (NCCL < 2.27): NcclWindow is not declared");
#endif
}

TEST_CASE("NCCL P=1: every shared case with a P=1 form (C2, zigzag, models), end to end") {
  check_nccl<float>(ut::c2_cases(1));
  check_nccl<float>(ut::zigzag_cases(1));
  for (const auto& m : ulysses_models::kModels) check_nccl<ut::bf16_t>({ut::model_case(m, 1, true)});
}

TEST_CASE("NCCL on >= 2 GPUs: C1–C8, zigzag and the models on every P <= the device count") {
  const int n = ut::device_count();
  if (n < 2) {
    MESSAGE("fewer than 2 CUDA devices (" << n << "): multi-GPU NCCL cases skipped");
    return;
  }
  check_nccl<float>(ut::c1_cases());
  for (int P = 2; P <= n; ++P) {
    check_nccl<float>(ut::c2_cases(P));
    check_nccl<float>(ut::zigzag_cases(P));
  }
  check_nccl<ut::bf16_t>(ut::c2_cases(2));
  check_nccl<float>(ut::c3_cases());
  check_nccl<float>(ut::c4_cases(4));
  check_nccl<float>(ut::c4_cases(8));
  check_nccl<float>({ut::c5_case()});
  check_nccl<float>(ut::c6_cases());
  check_nccl<float>(ut::c8_cases());
  for (auto c : ut::c2_cases(2)) {  // K-stage plans: one exchange per stage
    c.stages = 3;
    check_nccl<float>({c});
  }
  CHECK(world(2).run([](NcclComm& comm) { return ut::run_view_case_device<float>(comm, 2, comm.stream()); }) == "");
  // Plans made from different inputs: check_agreement (ncclAllGather of the fingerprints) throws on every rank.
  CHECK(world(2).run([](NcclComm& comm) -> std::string {
    const Plan plan({2, comm.rank()}, 1, SeqPartition::even(4, 2),
                    {TensorSpec::of<float>(HeadPartition::even(comm.rank() == 0 ? 2 : 4, 2), 4)});
    try {
      check_agreement(plan, comm);
      return "no error";
    } catch (const Error& e) {
      return e.code() == Errc::plan_mismatch ? "" : e.what();
    }
  }) == "");
  for (const auto& m : ulysses_models::kModels)
    for (int P : {2, 4, 8})
      if (P <= n) check_nccl<ut::bf16_t>({ut::model_case(m, P, ut::expected_even_error(m, P) == Errc{})});
}
