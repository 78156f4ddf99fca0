// SPDX-License-Identifier: Apache-2.0
// Implementation of perf_device.hpp (see there): ulysses_perf's device backends.
#include "perf_device.hpp"

#include <ulysses/comm/local_device.cuh>
#if PERF_DEVICE_MPI
#include <ulysses/comm/mpi_device_window.cuh>
#endif
#include <ulysses/cuda/executor.cuh>
#if PERF_DEVICE_NCCL
#include <nccl.h>

#include <ulysses/comm/nccl.cuh>
#endif

#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace perf_device {

using namespace ulysses;
using ulysses::detail::cuda_check;

namespace {

/// cudaMalloc'd bytes (at least 1, so that a zero-byte tensor still has an address), freed on
/// destruction.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n) { cuda_check(cudaMalloc(&p_, n ? n : 1), "cudaMalloc"); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(p_); }
  std::byte* get() const { return static_cast<std::byte*>(p_); }

 private:
  void* p_ = nullptr;
};

/// The bare all-to-all-v's buffers and arrays: P equal chunks of bytes / P, own chunk included.
struct Bare {
  std::unique_ptr<DeviceBuffer> send, recv;
  std::vector<std::size_t> counts, offsets;
};

}  // namespace

/// A rank's stream, events and loaded exchange; the communicator is the derived class's.
struct Rank::Impl {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  const Plan* plan = nullptr;
  Direction dir = Direction::seq_to_head;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;  // inputs, outputs, workspace
  TensorList<ConstByteSpan> in;
  TensorList<ByteSpan> out;
  Workspace ws;
  std::unique_ptr<CudaExecutor> exec;
  Bare bare;

  explicit Impl(cudaStream_t s) : stream(s) {
    cuda_check(cudaEventCreate(&start), "cudaEventCreate");
    cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  virtual ~Impl() {
    release();
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  virtual int size() const = 0;
  virtual int rank() const = 0;
  virtual void allgather(const void* send, std::size_t bytes, void* recv) = 0;
  virtual std::string path(const Plan& p) const = 0;
  virtual void exchange() = 0;  ///< redistribute() of the loaded exchange, enqueued
  virtual void alltoallv() = 0;  ///< the bare all-to-all-v, enqueued
  /// Device memory for input t of `n` bytes of the exchange being loaded (t = 0, 1, ... in order).
  virtual std::byte* input(int t, std::size_t n) {
    (void)t;
    return alloc(n);
  }

  std::byte* alloc(std::size_t n) {
    buffers.push_back(std::make_unique<DeviceBuffer>(n));
    return buffers.back()->get();
  }
  void release() noexcept {
    cudaStreamSynchronize(stream);
    exec.reset();
    buffers.clear();
    bare = Bare{};
    plan = nullptr;
    in = {};
    out = {};
    ws = {};
  }
};

namespace {

/// The exchange and the bare all-to-all-v over communicator type Comm (NcclComm or
/// DeviceLocalGroup::Comm), whose stream is the Impl's.
template <class Comm>
struct ImplOf : Rank::Impl {
  Comm& comm;
  ImplOf(Comm& c, cudaStream_t s) : Rank::Impl(s), comm(c) {}
  int size() const override { return comm.size(); }
  int rank() const override { return comm.rank(); }
  void allgather(const void* send, std::size_t bytes, void* recv) override { comm.allgather(send, bytes, recv); }
  std::string path(const Plan& p) const override { return to_string(choose_path<Comm, CudaExecutor>(p)); }
  void exchange() override { redistribute(*plan, dir, comm, *exec, in, out, ws); }
  void alltoallv() override {
    comm.alltoallv(bare.send->get(), bare.counts.data(), bare.offsets.data(), bare.recv->get(), bare.counts.data(), bare.offsets.data());
  }
};

Rank::Impl& checked(Rank::Impl* impl) {
  if (!impl) throw Error(Errc::backend, "perf_device::Rank without a communicator");
  return *impl;
}

}  // namespace

std::string unavailable() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  return n > 0 ? "" : "cudaGetDeviceCount found 0 devices";
}

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::string device_name(int device) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return "unknown device";
  return std::string(p.name) + " (" + std::to_string(p.multiProcessorCount) + " SMs)";
}

int Rank::size() const { return checked(impl_).size(); }
int Rank::rank() const { return checked(impl_).rank(); }
void Rank::allgather(const void* send, std::size_t bytes, void* recv) { checked(impl_).allgather(send, bytes, recv); }
std::string Rank::path(const Plan& plan) const { return checked(impl_).path(plan); }

void Rank::load(const Plan& plan, Direction dir, const TensorList<ConstByteSpan>& host_in) {
  Impl& m = checked(impl_);
  m.release();
  m.plan = &plan;
  m.dir = dir;
  for (int t = 0; t < plan.num_tensors(); ++t) {
    const std::size_t ib = plan.input_bytes(dir, t), ob = plan.output_bytes(dir, t);
    std::byte* i = m.input(t, ib);
    cuda_check(cudaMemcpyAsync(i, host_in.data[t].data, ib, cudaMemcpyHostToDevice, m.stream), "cudaMemcpyAsync");
    std::byte* o = m.alloc(ob);
    cuda_check(cudaMemsetAsync(o, 0, ob, m.stream), "cudaMemsetAsync");
    m.in.push_back({i, ib});
    m.out.push_back({o, ob});
  }
  m.ws = Workspace{m.alloc(plan.workspace_bytes()), plan.workspace_bytes()};
  m.exec = std::make_unique<CudaExecutor>(plan, m.stream);
  cuda_check(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize");  // the host inputs may go
}

void Rank::load_bare(std::size_t bytes) {
  Impl& m = checked(impl_);
  const auto P = static_cast<std::size_t>(m.size()), chunk = bytes / P;
  m.bare.send = std::make_unique<DeviceBuffer>(chunk * P);
  m.bare.recv = std::make_unique<DeviceBuffer>(chunk * P);
  cuda_check(cudaMemsetAsync(m.bare.send->get(), 1, chunk * P, m.stream), "cudaMemsetAsync");
  m.bare.counts.assign(P, chunk);
  m.bare.offsets.resize(P);
  for (std::size_t p = 0; p < P; ++p) m.bare.offsets[p] = p * chunk;
}

void Rank::run(Op op, int n) {
  Impl& m = checked(impl_);
  if (op == Op::exchange && !m.exec) throw Error(Errc::backend, "perf_device::Rank::run: no exchange loaded");
  if (op == Op::bare && !m.bare.send) throw Error(Errc::backend, "perf_device::Rank::run: no bare all-to-all-v loaded");
  for (int i = 0; i < n; ++i) op == Op::exchange ? m.exchange() : m.alltoallv();
}

double Rank::time_us(Op op, int iters) {
  Impl& m = checked(impl_);
  cuda_check(cudaEventRecord(m.start, m.stream), "cudaEventRecord");
  run(op, iters);
  cuda_check(cudaEventRecord(m.stop, m.stream), "cudaEventRecord");
  cuda_check(cudaEventSynchronize(m.stop), "cudaEventSynchronize");
  float ms = 0;
  cuda_check(cudaEventElapsedTime(&ms, m.start, m.stop), "cudaEventElapsedTime");
  return static_cast<double>(ms) * 1e3 / iters;
}

void Rank::sync() { cuda_check(cudaStreamSynchronize(checked(impl_).stream), "cudaStreamSynchronize"); }

void Rank::fetch(const TensorList<ByteSpan>& host_out) {
  Impl& m = checked(impl_);
  for (std::size_t t = 0; t < m.out.size; ++t)
    cuda_check(cudaMemcpyAsync(host_out.data[t].data, m.out.data[t].data, m.out.data[t].bytes, cudaMemcpyDeviceToHost, m.stream),
               "cudaMemcpyAsync");
  cuda_check(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize");
}

void Rank::unload() noexcept {
  if (impl_) impl_->release();
}

void spawn_local(int P, const std::function<void(Rank&)>& fn) {
  std::vector<cudaStream_t> streams(static_cast<std::size_t>(P), nullptr);
  auto destroy = [&] {
    for (cudaStream_t s : streams)
      if (s) cudaStreamDestroy(s);
  };
  try {
    for (auto& s : streams) cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    DeviceLocalGroup group(P);
    group.spawn(streams.data(), [&](DeviceLocalGroup::Comm& comm) {
      ImplOf<DeviceLocalGroup::Comm> impl(comm, comm.stream());
      Rank r(&impl);
      fn(r);
    });
  } catch (...) {
    destroy();
    throw;
  }
  destroy();
}

#if PERF_DEVICE_MPI
namespace {
/// The CUDA IPC backend: inputs registered in the device window, the bare op one copy.
struct IpcImpl : ImplOf<MpiDeviceWindowComm> {
  MpiDeviceWindow& win;
  IpcImpl(MpiDeviceWindowComm& c, MpiDeviceWindow& w, cudaStream_t s) : ImplOf<MpiDeviceWindowComm>(c, s), win(w) {}
  std::byte* input(int t, std::size_t n) override {
    if (t == 0) win.reset();
    unsigned long long most = n;  // every rank registers the largest size alike
    MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    return win.allocate(static_cast<std::size_t>(most)).data();
  }
  void alltoallv() override {
    const std::size_t n = bare.counts.empty() ? 0 : bare.counts[0] * bare.counts.size();
    cuda_check(cudaMemcpyAsync(bare.recv->get(), bare.send->get(), n, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
  }
};
}  // namespace

bool has_ipc() { return true; }

void with_ipc(int device, std::size_t window_bytes, const std::function<void(Rank&)>& fn) {
  cuda_check(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t s = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  try {
    MpiComm comm(MPI_COMM_WORLD);
    MpiDeviceWindow win(comm, window_bytes);
    MpiDeviceWindowComm wc(comm, win, s);
    IpcImpl impl(wc, win, s);
    Rank r(&impl);
    fn(r);
    wc.synchronize();  // a device wait's error, coded
  } catch (...) {
    cudaStreamDestroy(s);
    throw;
  }
  cudaStreamDestroy(s);
}
#else
bool has_ipc() { return false; }
void with_ipc(int, std::size_t, const std::function<void(Rank&)>&) {
  throw Error(Errc::backend, "this build has no MPI: no CUDA IPC backend (install libopenmpi-dev and reconfigure)");
}
#endif

#if PERF_DEVICE_NCCL
namespace {
void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(Errc::backend, std::string(what) + " failed: " + ncclGetErrorString(r));
}
}  // namespace

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes, "perf_device.hpp's kNcclUniqueIdBytes is NCCL_UNIQUE_ID_BYTES");

bool has_nccl() { return true; }

std::vector<char> nccl_unique_id() {
  ncclUniqueId id;
  nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return std::vector<char>(id.internal, id.internal + sizeof id.internal);
}

void with_nccl(int rank, int P, int device, const std::vector<char>& id_bytes, const std::function<void(Rank&)>& fn) {
  if (id_bytes.size() != sizeof(ncclUniqueId)) throw Error(Errc::backend, "with_nccl: the unique id has the wrong size");
  cuda_check(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId id;
  std::memcpy(id.internal, id_bytes.data(), sizeof id.internal);
  ncclComm_t nc = nullptr;
  nccl_check(ncclCommInitRank(&nc, P, id, rank), "ncclCommInitRank");
  cudaStream_t s = nullptr;
  std::optional<NcclComm> comm;  // outside the try: the catch must know whether a failure already aborted nc
  try {
    cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    comm.emplace(nc, s);
    ImplOf<NcclComm> impl(*comm, s);
    Rank r(&impl);
    fn(r);
  } catch (...) {
    if (s) cudaStreamDestroy(s);
    if (!(comm && comm->handle_freed())) ncclCommAbort(nc);  // after ncclCommAbort in give_up: nc is freed (no double abort)
    throw;
  }
  cudaStreamDestroy(s);
  ncclCommDestroy(nc);
}
#else
bool has_nccl() { return false; }
std::vector<char> nccl_unique_id() { throw Error(Errc::backend, "this build has no NCCL (set NCCL_ROOT and reconfigure)"); }
void with_nccl(int, int, int, const std::vector<char>&, const std::function<void(Rank&)>&) {
  throw Error(Errc::backend, "this build has no NCCL (set NCCL_ROOT and reconfigure)");
}
#endif

}  // namespace perf_device
