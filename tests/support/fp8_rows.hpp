// SPDX-License-Identifier: Apache-2.0
// The rows of fault case C23 (per-(token, head) fp8 scales; docs/headers.md, "fp8 codec
// (layout/fp8.hpp)"), shared by tests/layout/test_fp8.cpp and tests/cuda/test_cuda_fp8.cu so
// that the host and the device quantize the very same inputs. Rows of D = 16 floats.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace fp8t {

inline constexpr int kD = 16;
inline constexpr float kFloatMin = 1.17549435e-38f;  // FLT_MIN = 2^-126

/// One row of the case and what kind it is.
struct Row {
  std::string name;
  enum Kind { zero, tiny, ordinary } kind;
  std::vector<float> x;  // kD floats
};

inline float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// A row of kD values spread over [-amax, amax] (amax itself at index 3, -amax/2 at index 7),
/// with a +0 and a -0 among them.
inline std::vector<float> spread(float amax) {
  std::vector<float> x(kD);
  for (int i = 0; i < kD; ++i) x[static_cast<std::size_t>(i)] = amax * (static_cast<float>(i - 8) / 8.0f);  // finite for amax = FLT_MAX
  x[3] = amax, x[7] = -amax / 2, x[8] = 0.0f, x[9] = -0.0f;
  return x;
}

/// The rows of C23: all +0; all -0; one 1e-43 and zeros; amax 1e-40 (a subnormal amax/fp8_max
/// and 1/scale infinite without the floor); amax FLT_MIN; amax 3e38; two padding tokens' zero
/// rows of a 4-token x 2-head batch beside its ordinary rows; ordinary rows of several magnitudes.
inline std::vector<Row> c23_rows() {
  std::vector<Row> rows;
  rows.push_back({"all +0", Row::zero, std::vector<float>(kD, 0.0f)});
  rows.push_back({"all -0", Row::zero, std::vector<float>(kD, -0.0f)});
  std::vector<float> one(kD, 0.0f);
  one[5] = 1e-43f, one[6] = -0.0f;
  rows.push_back({"one 1e-43, the rest 0", Row::tiny, one});
  std::vector<float> neg(kD, -0.0f);
  neg[11] = -1e-43f;
  rows.push_back({"one -1e-43, the rest -0", Row::tiny, neg});
  rows.push_back({"amax 1e-40", Row::tiny, spread(1e-40f)});
  rows.push_back({"amax FLT_MIN", Row::tiny, spread(kFloatMin)});
  rows.push_back({"amax 3e38", Row::ordinary, spread(3e38f)});
  rows.push_back({"amax FLT_MAX", Row::ordinary, spread(from_bits(0x7f7fffffu))});
  std::mt19937 gen(23);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int token = 0; token < 4; ++token)
    for (int head = 0; head < 2; ++head) {
      const std::string name = "batch token " + std::to_string(token) + " head " + std::to_string(head);
      if (token >= 2) {  // padding tokens: zero rows
        rows.push_back({name + " (padding)", Row::zero, std::vector<float>(kD, 0.0f)});
        continue;
      }
      std::vector<float> x(kD);
      for (float& v : x) v = u(gen) * (head ? 3.0f : 0.02f);
      rows.push_back({name, Row::ordinary, x});
    }
  for (float mag : {1e-30f, 1e-6f, 1.0f, 1e4f, 1e30f}) {
    std::vector<float> x(kD);
    for (float& v : x) v = u(gen) * mag;
    rows.push_back({"ordinary, magnitude " + std::to_string(mag), Row::ordinary, x});
  }
  return rows;
}

/// Floats for the device comparison of float_to_fp8: every float whose top 16 bits vary (the low
/// 16 bits 0, 0x8000, 0x7fff and 0xffff; NaNs and infinities included).
inline std::vector<float> sweep_floats() {
  std::vector<float> xs;
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (std::uint32_t lo : {0u, 0x8000u, 0x7fffu, 0xffffu}) xs.push_back(from_bits((hi << 16) | lo));
  return xs;
}

}  // namespace fp8t
