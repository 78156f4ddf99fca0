// SPDX-License-Identifier: Apache-2.0
// version.hpp: the version macros and the versioned inline namespace.
#include <doctest/doctest.h>
#include <ulysses/ulysses.hpp>  // the umbrella compiles on its own

#include <type_traits>

TEST_CASE("version macros agree with each other and with the project version") {
  CHECK(ULYSSES_VERSION == ULYSSES_VERSION_MAJOR * 10000 + ULYSSES_VERSION_MINOR * 100 + ULYSSES_VERSION_PATCH);
  CHECK(ULYSSES_VERSION == 200);  // 0.2.0, as in CMakeLists.txt's project(VERSION)
}

TEST_CASE("public names live in the versioned inline namespace") {
  CHECK(std::is_same_v<ulysses::Plan, ulysses::v0::Plan>);
  CHECK(std::is_same_v<ulysses::Layout, ulysses::v0::Layout>);
}
