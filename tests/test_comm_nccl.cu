// SPDX-License-Identifier: Apache-2.0
// comm/nccl.cuh: NcclComm with the CUDA executor. With one device: P=1 (every shared case that
// has a P=1 form, and the raw all-to-all-v paths). With >= 2 devices: the shared cases (C1–C8,
// zigzag, models) end to end on P GPUs of this process, one thread per GPU, one NCCL communicator
// each (ncclCommInitAll), for every P <= the device count. Without a device only the suite "host"
// runs (see support/device_main.cpp).
#include <doctest/doctest.h>
#include <ulysses/comm/nccl.cuh>

#include <map>
#include <memory>
#include <thread>

#include "device_harness.cuh"

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
