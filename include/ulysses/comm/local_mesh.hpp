// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief LocalMesh: a Ulysses × Ring mesh of U · R ranks on threads of one process, a LocalGroup
///        per Ulysses group and per ring: the in-process counterpart of split_ring() (MPI, NCCL)
///        for tests, examples and single-process engines. docs/ring.md.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "../error.hpp"
#include "failure.hpp"
#include "local.hpp"

ULYSSES_NAMESPACE_BEGIN

/// U · R ranks on threads: world rank w is Ulysses rank w % U of Ulysses group w / U and ring rank
/// w / U of ring w % U (Mesh's `RingOrder::ulysses_inner` on one node: a Ulysses group is U
/// consecutive ranks). A rank that throws breaks its Ulysses group and its ring, so that no peer
/// waits out its timeout, and spawn() rethrows the first root cause.
class LocalMesh {
 public:
  /// @param ulysses_degree U >= 1; @param ring_degree R >= 1
  /// @param timeout every wait of the groups (LocalGroup's)
  /// @throws Error(invalid_group) U or R < 1.
  LocalMesh(int ulysses_degree, int ring_degree, std::chrono::milliseconds timeout = kDefaultCommTimeout)
      : U_(ulysses_degree), R_(ring_degree), world_(check(ulysses_degree, ring_degree), timeout) {
    for (int j = 0; j < R_; ++j) ulysses_.push_back(std::make_unique<LocalGroup>(U_, timeout));
    for (int u = 0; u < U_; ++u) rings_.push_back(std::make_unique<LocalGroup>(R_, timeout));
  }

  int ulysses_degree() const { return U_; }  ///< U
  int ring_degree() const { return R_; }     ///< R
  int size() const { return U_ * R_; }       ///< U · R

  /// Runs fn(w, ulysses, ring) on U · R threads, one a world rank w, with the LocalGroup::Comm of
  /// w's Ulysses group (rank w % U of U) and of its ring (rank w / U of R). Returns when every
  /// thread has. A LocalMesh runs one spawn() at a time.
  /// @throws the first root-cause exception of any rank (its peers' Error(aborted) are dropped).
  template <class F>
  void spawn(F&& fn) {
    world_.spawn([&](LocalGroup::Comm& c) {
      const int w = c.rank();
      LocalGroup& ug = *ulysses_[static_cast<std::size_t>(w / U_)];
      LocalGroup& rg = *rings_[static_cast<std::size_t>(w % U_)];
      LocalGroup::Comm uc = ug.comm(w % U_), rc = rg.comm(w / U_);
      try {
        fn(w, uc, rc);
      } catch (...) {
        const std::string why = "rank " + std::to_string(w) + " threw: " + detail::exception_message(std::current_exception());
        ug.abort(why);
        rg.abort(why);
        throw;
      }
    });
  }

 private:
  static int check(int U, int R) {
    if (U < 1 || R < 1)
      detail::fail(Errc::invalid_group, "LocalMesh: U=" + std::to_string(U) + " and R=" + std::to_string(R) + " must be >= 1");
    return U * R;
  }
  int U_, R_;
  LocalGroup world_;
  std::vector<std::unique_ptr<LocalGroup>> ulysses_, rings_;
};

ULYSSES_NAMESPACE_END
