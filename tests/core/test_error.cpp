// SPDX-License-Identifier: Apache-2.0
// error.hpp: codes, names and the message format.
#include <doctest/doctest.h>
#include <ulysses/error.hpp>

#include <set>
#include <string>

using namespace ulysses;

TEST_CASE("Error carries its code and a message prefixed with the code's name") {
  const Error e(Errc::heads_not_divisible, "num_heads=30 is not divisible by group size 4");
  CHECK(e.code() == Errc::heads_not_divisible);
  CHECK(std::string(e.what()) == "ulysses: heads_not_divisible: num_heads=30 is not divisible by group size 4");
}

TEST_CASE("every code has its own name") {
  std::set<std::string> names;
  for (int c = static_cast<int>(Errc::invalid_group); c <= static_cast<int>(Errc::invalid_mesh); ++c) {
    const std::string n = to_string(static_cast<Errc>(c));
    CHECK(n != "unknown");
    names.insert(n);
  }
  CHECK(names.size() == static_cast<std::size_t>(Errc::invalid_mesh));
  CHECK(std::string(to_string(Errc::gqa_group_mismatch)) == "gqa_group_mismatch");
}

TEST_CASE("Error is a std::runtime_error") {
  try {
    throw Error(Errc::timeout, "x");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "ulysses: timeout: x");
  }
}
