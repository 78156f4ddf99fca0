// SPDX-License-Identifier: Apache-2.0
// doctest main of the CUDA tests: without a CUDA device (cudaGetDeviceCount fails or returns 0)
// it says so and runs only the test suite "host" (what needs no device), so CI without a GPU
// still compiles, links and runs these executables, and passes.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdio>

int main(int argc, char** argv) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  doctest::Context ctx(argc, argv);
  if (e != cudaSuccess || n == 0) {
    std::printf("no CUDA device: skipping the device tests (cudaGetDeviceCount: %s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    ctx.setOption("test-suite", "host");
  } else {
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, 0);
    std::printf("CUDA devices: %d (device 0: %s, sm_%d%d, %d SMs)\n", n, p.name, p.major, p.minor, p.multiProcessorCount);
  }
  return ctx.run();
}
