// SPDX-License-Identifier: Apache-2.0
// Implementation of cuda_backend.hpp (see there).
#include "cuda_backend.hpp"

#include <ulysses/comm/local_device.cuh>
#include <ulysses/cuda/executor.cuh>

#include <cuda_runtime.h>

#include <string>
#include <vector>

namespace demo_cuda {

using ulysses::detail::cuda_check;

struct Rank::Impl {
  ulysses::DeviceLocalGroup::Comm* comm;
  cudaEvent_t ev[4];
};

std::string unavailable() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  return n > 0 ? "" : "no CUDA device";
}

std::string device_name() {
  int dev = 0;
  cudaDeviceProp p{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) return "unknown device";
  return std::string(p.name) + " (" + std::to_string(p.multiProcessorCount) + " SMs)";
}

int Rank::size() const { return impl_->comm->size(); }
int Rank::rank() const { return impl_->comm->rank(); }
ulysses::Path Rank::path(const ulysses::Plan& plan) const {
  return ulysses::choose_path<ulysses::DeviceLocalGroup::Comm, ulysses::CudaExecutor>(plan);
}

void Rank::redistribute(const ulysses::Plan& plan, ulysses::Direction dir, const ulysses::TensorList<ulysses::ConstByteSpan>& in,
                        const ulysses::TensorList<ulysses::ByteSpan>& out, double ms[3]) {
  using namespace ulysses;
  const cudaStream_t s = impl_->comm->stream();
  // Device buffers from the stream-ordered allocator (no device-wide synchronisation).
  std::vector<void*> mem;
  auto alloc = [&](std::size_t n) {
    void* p = nullptr;
    cuda_check(cudaMallocAsync(&p, n ? n : 1, s), "cudaMallocAsync");
    mem.push_back(p);
    return static_cast<std::byte*>(p);
  };
  TensorList<ConstByteSpan> din;
  TensorList<ByteSpan> dout;
  for (int t = 0; t < plan.num_tensors(); ++t) {
    std::byte* i = alloc(plan.input_bytes(dir, t));
    cuda_check(cudaMemcpyAsync(i, in.data[t].data, plan.input_bytes(dir, t), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
    din.push_back({i, plan.input_bytes(dir, t)});
    dout.push_back({alloc(plan.output_bytes(dir, t)), plan.output_bytes(dir, t)});
  }
  const Workspace ws{alloc(plan.workspace_bytes()), plan.workspace_bytes()};
  CudaExecutor ex(plan, s);
  const BufferTable tab = bind_buffers(plan, dir, din, dout, ws);
  cudaEvent_t* ev = impl_->ev;
  const Path path = choose_path<DeviceLocalGroup::Comm, CudaExecutor>(plan);  // the path redistribute() takes
  if (path == Path::direct) {  // each rank's kernel reads its peers' inputs: timed as the exchange
    cuda_check(cudaEventRecord(ev[1], s), "cudaEventRecord");
    exchange_direct(plan, dir, *impl_->comm, ex, tab);
    cuda_check(cudaEventRecord(ev[2], s), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(ev[2]), "cudaEventSynchronize");
    float x = 0;
    cuda_check(cudaEventElapsedTime(&x, ev[1], ev[2]), "cudaEventElapsedTime");
    ms[1] += x;
  }
  for (int k = 0; k < (path == Path::direct ? 0 : plan.num_stages()); ++k) {  // the demo's plans have one stage
    const std::vector<BlockCopy>& before = pack_list(plan, dir, path, k);
    const std::vector<BlockCopy>& after = unpack_list(plan, dir, path, k);
    cuda_check(cudaEventRecord(ev[0], s), "cudaEventRecord");
    ex.run(before.data(), before.size(), tab);
    cuda_check(cudaEventRecord(ev[1], s), "cudaEventRecord");
    stage_exchange(plan, dir, path, *impl_->comm, tab, k);
    cuda_check(cudaEventRecord(ev[2], s), "cudaEventRecord");
    ex.run(after.data(), after.size(), tab);
    cuda_check(cudaEventRecord(ev[3], s), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(ev[3]), "cudaEventSynchronize");
    for (int i = 0; i < 3; ++i) {
      float x = 0;
      cuda_check(cudaEventElapsedTime(&x, ev[i], ev[i + 1]), "cudaEventElapsedTime");
      ms[i] += x;
    }
  }
  for (int t = 0; t < plan.num_tensors(); ++t)
    cuda_check(cudaMemcpyAsync(out.data[t].data, dout.data[t].data, plan.output_bytes(dir, t), cudaMemcpyDeviceToHost, s),
               "cudaMemcpyAsync");
  for (void* p : mem) cuda_check(cudaFreeAsync(p, s), "cudaFreeAsync");
  cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

void run_group(int P, const std::function<void(Rank&)>& fn) {
  std::vector<cudaStream_t> streams(static_cast<std::size_t>(P));
  for (auto& s : streams) cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  try {
    ulysses::DeviceLocalGroup group(P);
    group.spawn(streams.data(), [&](ulysses::DeviceLocalGroup::Comm& comm) {
      Rank::Impl impl{&comm, {}};
      for (auto& e : impl.ev) cuda_check(cudaEventCreate(&e), "cudaEventCreate");
      try {
        Rank r(&impl);
        fn(r);
      } catch (...) {
        for (auto& e : impl.ev) cudaEventDestroy(e);
        throw;
      }
      for (auto& e : impl.ev) cudaEventDestroy(e);
    });
  } catch (...) {
    for (auto& s : streams) cudaStreamDestroy(s);
    throw;
  }
  for (auto& s : streams) cudaStreamDestroy(s);
}

}  // namespace demo_cuda
