// SPDX-License-Identifier: Apache-2.0
// A row transform whose call operator takes the row as float* (the concept's rows are double, in
// place): RowTransforms::on_pack() must refuse to compile, saying which signature it expects,
// instead of applying nothing. Compiled twice by tests/concepts/expect_compile.cmake: as it is
// (must fail, naming the signature), and with ULYSSES_TEST_CORRECT_SIGNATURE (must compile).
#include <ulysses/ulysses.hpp>

#include <cstdint>

struct MyRope {
#if defined(ULYSSES_TEST_CORRECT_SIGNATURE)
  void operator()(const ulysses::RowCoord&, double* row, std::int64_t n) const {
    for (std::int64_t i = 0; i < n; ++i) row[i] *= 2;
  }
#else
  void operator()(const ulysses::RowCoord&, float* row, std::int64_t n) const {  // the mistake: float rows
    for (std::int64_t i = 0; i < n; ++i) row[i] *= 2;
  }
#endif
};

int main() {
  const MyRope rope;
  ulysses::RowTransforms tx;
  tx.on_pack(0, rope);
  return tx.any(0) ? 0 : 1;
}
