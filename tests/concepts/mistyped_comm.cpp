// SPDX-License-Identifier: Apache-2.0
// A communicator whose exchange_messages() has another signature than the concept's (the count
// before the second list is missing): choose_path() must refuse to compile, naming the member,
// instead of silently taking the slower all-to-all-v path. Compiled twice by
// tests/concepts/expect_compile.cmake: as it is (must fail, naming exchange_messages), and with
// ULYSSES_TEST_CORRECT_SIGNATURE (must compile: the failure is the signature's, nothing else's).
#include <ulysses/ulysses.hpp>

#include <cstddef>

struct MyComm {
  int size() const { return 1; }
  int rank() const { return 0; }
  void alltoallv(const std::byte*, const std::size_t*, const std::size_t*, std::byte*, const std::size_t*, const std::size_t*) {}
#if defined(ULYSSES_TEST_CORRECT_SIGNATURE)
  void exchange_messages(const ulysses::Message*, std::size_t, const ulysses::Message*, std::size_t) {}
#else
  void exchange_messages(const ulysses::Message*, const ulysses::Message*, std::size_t) {}  // the typo
#endif
};

int main() {
  const ulysses::AttentionSpecs a = ulysses::attention_specs<float>(1, {2, 1, 4});
  const ulysses::Plan plan({1, 0}, 1, ulysses::SeqPartition::even(4, 1), a.qkv());
  return ulysses::choose_path<MyComm, ulysses::HostExecutor>(plan) == ulysses::Path::messages ? 0 : 1;
}
