// SPDX-License-Identifier: Apache-2.0
// fp8.hpp on the GPU: float_to_fp8, fp8_to_float, fp8_scale_of, row_amax, quantize_fp8 and
// dequantize_fp8 in kernels give the host's bits for the same inputs (every code of both formats,
// a sweep of floats, the rows of fault case C23). Without a device only the host suite runs
// (support/device_main.cpp): the functions compiled by nvcc's host compiler, checked for C23.
#include <doctest/doctest.h>
#include <ulysses/layout/fp8.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "fp8_rows.hpp"

using namespace ulysses;

namespace {

void ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::ostringstream m;
  m << what << ": " << cudaGetErrorName(e) << ": " << cudaGetErrorString(e);
  throw std::runtime_error(m.str());
}

/// Device copy of a host vector, freed on destruction.
template <class T>
struct Dev {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Dev(std::size_t count) : n(count) { ok(cudaMalloc(&p, (n ? n : 1) * sizeof(T)), "cudaMalloc"); }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { ok(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), "upload"); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    ok(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
};

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

__global__ void encode(const float* x, long long n, Fp8Format f, std::uint8_t* out) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n; i += static_cast<long long>(gridDim.x) * blockDim.x)
    out[i] = float_to_fp8(x[i], f);
}

__global__ void decode_all(Fp8Format f, std::uint32_t* out) {
  const int c = threadIdx.x;
  const float v = fp8_to_float(static_cast<std::uint8_t>(c), f);
  std::uint32_t u;
  memcpy(&u, &v, 4);
  out[c] = u;
}

/// One thread per row: the row's amax and scale (as bits), its codes and its dequantized values.
__global__ void rows_kernel(const float* x, int rows, Fp8Format f, std::uint32_t* scales, std::uint8_t* q, float* back) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* row = x + static_cast<long long>(r) * fp8t::kD;
  const float s = fp8_scale_of(row_amax(row, fp8t::kD), f);
  std::uint32_t u;
  memcpy(&u, &s, 4);
  scales[r] = u;
  quantize_fp8(row, fp8t::kD, s, f, q + static_cast<long long>(r) * fp8t::kD);
  dequantize_fp8(q + static_cast<long long>(r) * fp8t::kD, fp8t::kD, s, f, back + static_cast<long long>(r) * fp8t::kD);
}

__global__ void scales_kernel(const float* amax, int n, Fp8Format f, std::uint32_t* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float s = fp8_scale_of(amax[i], f);
  memcpy(out + i, &s, 4);
}

constexpr Fp8Format kFormats[] = {Fp8Format::e4m3, Fp8Format::e5m2};

std::vector<float> flat_rows() {
  std::vector<float> x;
  for (const fp8t::Row& r : fp8t::c23_rows()) x.insert(x.end(), r.x.begin(), r.x.end());
  return x;
}

std::vector<float> amaxes() {
  return {0.0f, -0.0f, 1e-43f, 1e-40f, fp8t::kFloatMin, 448.0f * fp8t::kFloatMin, 1.0f, 3e38f, fp8t::from_bits(0x7f7fffffu), HUGE_VALF,
          -HUGE_VALF, fp8t::from_bits(0x7fc00000u), fp8t::from_bits(0xffc00001u), 6.5e-20f, 1234.5f};
}

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("fp8.hpp compiled by nvcc's host compiler: C23's rows give no NaN or inf, zeros keep their sign") {
    for (Fp8Format f : kFormats) {
      const std::string fmt = to_string(f);
    CAPTURE(fmt);
      for (const fp8t::Row& row : fp8t::c23_rows()) {
        CAPTURE(row.name);
        const float s = fp8_scale_of(row_amax(row.x.data(), fp8t::kD), f);
        REQUIRE(std::isfinite(s));
        std::uint8_t q[fp8t::kD];
        float back[fp8t::kD];
        quantize_fp8(row.x.data(), fp8t::kD, s, f, q);
        dequantize_fp8(q, fp8t::kD, s, f, back);
        for (int i = 0; i < fp8t::kD; ++i) {
          CHECK(std::isfinite(back[i]));
          if (row.x[static_cast<std::size_t>(i)] == 0.0f) CHECK(bits(back[i]) == bits(row.x[static_cast<std::size_t>(i)]));
        }
      }
    }
  }
}

TEST_CASE("fp8 on the GPU gives the host's bytes: every code, a float sweep, the scales and C23's rows quantized and back") {
  const std::vector<float> xs = fp8t::sweep_floats(), rows = flat_rows(), am = amaxes();
  const int nrows = static_cast<int>(rows.size() / fp8t::kD);
  Dev<float> dxs(xs), drows(rows), dam(am);
  for (Fp8Format f : kFormats) {
    const std::string fmt = to_string(f);
    CAPTURE(fmt);
    Dev<std::uint8_t> enc(xs.size()), q(rows.size());
    Dev<std::uint32_t> dec(256), sc(static_cast<std::size_t>(nrows)), sa(am.size());
    Dev<float> back(rows.size());
    encode<<<256, 256>>>(dxs.p, static_cast<long long>(xs.size()), f, enc.p);
    decode_all<<<1, 256>>>(f, dec.p);
    rows_kernel<<<(nrows + 63) / 64, 64>>>(drows.p, nrows, f, sc.p, q.p, back.p);
    scales_kernel<<<1, 64>>>(dam.p, static_cast<int>(am.size()), f, sa.p);
    ok(cudaGetLastError(), "launch");
    ok(cudaDeviceSynchronize(), "kernels");
    long long wrong = 0;
    const std::vector<std::uint8_t> e = enc.get();
    for (std::size_t i = 0; i < xs.size(); ++i) wrong += e[i] != float_to_fp8(xs[i], f);
    CHECK(wrong == 0);
    const std::vector<std::uint32_t> d = dec.get();
    wrong = 0;
    for (int c = 0; c < 256; ++c) wrong += d[static_cast<std::size_t>(c)] != bits(fp8_to_float(static_cast<std::uint8_t>(c), f));
    CHECK(wrong == 0);
    const std::vector<std::uint32_t> s = sa.get();
    for (std::size_t i = 0; i < am.size(); ++i) {
      CAPTURE(am[i]);
      CHECK(s[i] == bits(fp8_scale_of(am[i], f)));
    }
    const std::vector<std::uint32_t> rs = sc.get();
    const std::vector<std::uint8_t> qd = q.get();
    const std::vector<float> bd = back.get();
    for (int r = 0; r < nrows; ++r) {
      const float* row = rows.data() + static_cast<std::size_t>(r) * fp8t::kD;
      const float scale = fp8_scale_of(row_amax(row, fp8t::kD), f);
      CHECK(rs[static_cast<std::size_t>(r)] == bits(scale));
      std::uint8_t qh[fp8t::kD];
      float bh[fp8t::kD];
      quantize_fp8(row, fp8t::kD, scale, f, qh);
      dequantize_fp8(qh, fp8t::kD, scale, f, bh);
      for (int i = 0; i < fp8t::kD; ++i) {
        const std::size_t k = static_cast<std::size_t>(r) * fp8t::kD + static_cast<std::size_t>(i);
        CHECK(qd[k] == qh[i]);
        CHECK(bits(bd[k]) == bits(bh[i]));
      }
    }
  }
}
