// SPDX-License-Identifier: Apache-2.0
// ulysses_gpu_probe: the first rungs of bench/gpu_check.sh's ladder, each one short and bounded.
//   versions  the CUDA runtime this binary carries, the driver and the NCCL it loaded, the devices
//             and the verdict (exit 0 ok, 3 no driver / no device, 5 build mismatch)
//   kernel    one tiny kernel (1024 threads write 3i+1), checked on the host (exit 0, or 1)
//   copy      the copy kernel (CudaExecutor, one block of 64 MiB) against cudaMemcpyAsync of the same
//             bytes: bytes equal, then GB/s of both (exit 0, or 1)
// Every command prints one line starting with its name and "ok" or "FAIL"; exit 3 without a device.
#include <ulysses/cuda/detail/config.cuh>
#include <ulysses/cuda/executor.cuh>
#if defined(ULYSSES_PROBE_NCCL)
#include <ulysses/comm/nccl_comm.cuh>
#endif

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

/// 3i + 1 into out[i], i < n.
__global__ void probe_kernel(int* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = 3 * i + 1;
}

/// The verdict of this machine (prints the versions line); 0 when a device is there.
int versions(bool print) {
  int n = 0, driver = 0, runtime = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  const ulysses::detail::CudaVerdict v = ulysses::detail::cuda_verdict(driver, runtime, e, n);
  if (print) {
    std::string nccl = "not in this build";
#if defined(ULYSSES_PROBE_NCCL)
    const int nv = ulysses::detail::nccl_loaded_version();
    nccl = std::to_string(nv / 10000) + "." + std::to_string(nv / 100 % 100) + "." + std::to_string(nv % 100) + " loaded (headers " +
           std::to_string(NCCL_VERSION_CODE) + "; a failed communicator is " + (ulysses::detail::nccl_revoke() ? "revoked" : "aborted") + ")";
#endif
    std::printf("versions %s: %s; NCCL %s\n", v == ulysses::detail::CudaVerdict::ok ? "ok" : "FAIL",
                ulysses::detail::cuda_report(driver, runtime, e, n).c_str(), nccl.c_str());
    if (v == ulysses::detail::CudaVerdict::ok) {
      cudaDeviceProp p{};
      cudaGetDeviceProperties(&p, 0);
      std::printf("device 0: %s, sm_%d%d, %d SMs, %.1f GiB\n", p.name, p.major, p.minor, p.multiProcessorCount,
                  static_cast<double>(p.totalGlobalMem) / (1 << 30));
    }
  }
  switch (v) {
    case ulysses::detail::CudaVerdict::ok: return 0;
    case ulysses::detail::CudaVerdict::build_mismatch: return 5;
    default: return 3;
  }
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::printf("FAIL: %s: %s: %s\n", what, cudaGetErrorName(e), cudaGetErrorString(e));
  return false;
}

int kernel() {
  const int n = 1024;
  int* d = nullptr;
  std::vector<int> h(n, 0);
  if (!ok(cudaMalloc(&d, n * sizeof(int)), "cudaMalloc")) return 1;
  probe_kernel<<<n / 256, 256>>>(d, n);
  const bool ran = ok(cudaGetLastError(), "probe_kernel launch") && ok(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost), "cudaMemcpy");
  cudaFree(d);
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += h[static_cast<std::size_t>(i)] != 3 * i + 1;
  std::printf("kernel %s: %d of %d values wrong\n", ran && wrong == 0 ? "ok" : "FAIL", ran ? wrong : n, n);
  return ran && wrong == 0 ? 0 : 1;
}

int copy() {
  const std::int64_t bytes = std::int64_t{64} << 20, row = 4096;
  ulysses::BlockCopy b{};
  b.extent[0] = b.extent[1] = b.extent[2] = 1;
  b.extent[3] = bytes / row;
  b.src_stride[3] = b.dst_stride[3] = row;
  b.row_bytes = row;
  b.src_buffer = ulysses::BufferIndex::send;
  b.dst_buffer = ulysses::BufferIndex::recv;
  b.elem_bytes = 1;
  const ulysses::BlockList list{&b, 1};
  std::byte *src = nullptr, *dst = nullptr, *ref = nullptr;
  cudaStream_t s = nullptr;
  cudaEvent_t e[3] = {};
  bool good = ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate") &&
              ok(cudaMalloc(&src, bytes), "cudaMalloc") && ok(cudaMalloc(&dst, bytes), "cudaMalloc") && ok(cudaMalloc(&ref, bytes), "cudaMalloc");
  for (cudaEvent_t& x : e) good = good && ok(cudaEventCreate(&x), "cudaEventCreate");
  float kernel_ms = 0, memcpy_ms = 0;
  bool same = false;
  if (good) {
    std::vector<unsigned char> h(static_cast<std::size_t>(bytes));
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<unsigned char>(i * 131 + (i >> 12));
    good = ok(cudaMemcpy(src, h.data(), h.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    try {
      ulysses::CudaExecutor ex(&list, 1, s);
      ulysses::BufferTable t;
      t.base[ulysses::BufferIndex::send] = src;
      t.base[ulysses::BufferIndex::recv] = dst;
      ex.run(list.data, list.size, t);  // warm: loads the kernel, first touch
      good = good && ok(cudaMemcpyAsync(ref, src, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
      good = good && ok(cudaEventRecord(e[0], s), "cudaEventRecord");
      for (int i = 0; i < 10; ++i) ex.run(list.data, list.size, t);
      good = good && ok(cudaEventRecord(e[1], s), "cudaEventRecord");
      for (int i = 0; i < 10 && good; ++i) good = ok(cudaMemcpyAsync(ref, src, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
      good = good && ok(cudaEventRecord(e[2], s), "cudaEventRecord") && ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
      good = good && ok(cudaEventElapsedTime(&kernel_ms, e[0], e[1]), "cudaEventElapsedTime") &&
             ok(cudaEventElapsedTime(&memcpy_ms, e[1], e[2]), "cudaEventElapsedTime");
      std::vector<unsigned char> a(h.size()), r(h.size());
      good = good && ok(cudaMemcpy(a.data(), dst, a.size(), cudaMemcpyDeviceToHost), "cudaMemcpy") &&
             ok(cudaMemcpy(r.data(), ref, r.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
      same = good && a == h && r == h;
    } catch (const std::exception& x) {
      std::printf("FAIL: %s\n", x.what());
      good = false;
    }
  }
  for (cudaEvent_t x : e)
    if (x) cudaEventDestroy(x);
  cudaFree(src), cudaFree(dst), cudaFree(ref);
  if (s) cudaStreamDestroy(s);
  const double gb = 10.0 * static_cast<double>(bytes) * 1e-9;
  std::printf("copy %s: 64 MiB, bytes %s; copy kernel %.1f GB/s, cudaMemcpyAsync %.1f GB/s (ratio %.2f)\n", good && same ? "ok" : "FAIL",
              same ? "equal" : "DIFFER", kernel_ms > 0 ? gb / (kernel_ms * 1e-3) : 0.0, memcpy_ms > 0 ? gb / (memcpy_ms * 1e-3) : 0.0,
              kernel_ms > 0 ? memcpy_ms / kernel_ms : 0.0);
  return good && same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "versions") return versions(true);
  if (cmd != "kernel" && cmd != "copy") {
    std::fprintf(stderr, "usage: %s versions | kernel | copy\n", argv[0]);
    return 2;
  }
  if (const int v = versions(false)) {
    std::printf("%s skipped: no usable device (run '%s versions')\n", cmd.c_str(), argv[0]);
    return v;
  }
  return cmd == "kernel" ? kernel() : copy();
}
