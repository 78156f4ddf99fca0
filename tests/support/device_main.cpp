// SPDX-License-Identifier: Apache-2.0
// doctest main of the CUDA tests: without a CUDA device (cudaGetDeviceCount fails or returns 0)
// it says so and runs only the test suite "host" (what needs no device), so CI without a GPU
// still compiles, links and runs these executables, and passes. A driver too old for this
// build's runtime is said to be a build mismatch, and fails (exit 5 after the host suite).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdio>

#include <ulysses/cuda/detail/config.cuh>

int main(int argc, char** argv) {
  int n = 0, driver = 0, runtime = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  doctest::Context ctx(argc, argv);
  const ulysses::detail::CudaVerdict v = ulysses::detail::cuda_verdict(driver, runtime, e, n);
  if (v != ulysses::detail::CudaVerdict::ok) {
    std::printf("%s: skipping the device tests\n", ulysses::detail::cuda_report(driver, runtime, e, n).c_str());
    ctx.setOption("test-suite", "host");
    const int rc = ctx.run();
    // A machine with a GPU whose driver cannot run this build is a failure, not a skip.
    return v == ulysses::detail::CudaVerdict::build_mismatch ? (rc ? rc : 5) : rc;
  } else {
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, 0);
    std::printf("CUDA devices: %d (device 0: %s, sm_%d%d, %d SMs)\n", n, p.name, p.major, p.minor, p.multiProcessorCount);
  }
  return ctx.run();
}
