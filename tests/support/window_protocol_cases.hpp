// SPDX-License-Identifier: Apache-2.0
// The windows' one epoch barrier (comm/window_protocol.hpp) on threads as ranks: the same cases
// for the MPI window (tests/test_comm_mpi_window.cpp: HostWords over WindowControl) and the
// device window (tests/test_comm_mpi_device_window.cu: DeviceWords, system-scope atomics, over
// DeviceWindowControl). Each test file calls ut::window_protocol_cases<Words, Ctrl>() once.
#pragma once

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include <ulysses/comm/window_protocol.hpp>

namespace ut {

/// P ranks' control blocks in this process's memory (zeroed), as the protocol sees them.
template <class Ctrl>
struct ProtocolBlocks {
  explicit ProtocolBlocks(int P) : ctrl(static_cast<std::size_t>(P)) {
    for (auto& c : ctrl) c = std::make_unique<Ctrl>();
  }
  std::vector<std::unique_ptr<Ctrl>> ctrl;
};
template <class Ctrl>
struct ProtocolAt {
  const ProtocolBlocks<Ctrl>* b;
  Ctrl& operator()(int p) const { return *b->ctrl[static_cast<std::size_t>(p)]; }
};

struct ProtocolClock {
  std::uint64_t operator()() const {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
  }
};
struct ProtocolPause {
  void operator()() const { std::this_thread::yield(); }
};
struct ProtocolNoLate {
  void operator()(int) const {}
};

inline constexpr std::uint64_t kProtocolLong = 20'000'000'000ull;  // 20 s: never reached by a healthy run
inline constexpr std::uint64_t kProtocolShort = 100'000'000ull;    // 100 ms

/// One rank's step of phase `arrival` in call e: publish, wait; on its own timeout mark the late
/// ranks and break the group (what both windows do). Returns the wait's verdict.
template <class W, class Ctrl, class Check = ulysses::detail::NoRecordCheck>
ulysses::detail::EpochPoll protocol_step(const ProtocolBlocks<Ctrl>& b, int r, std::uint64_t e, bool arrival, std::uint64_t timeout,
                                         Check check = {}) {
  namespace d = ulysses::detail;
  const ProtocolAt<Ctrl> at{&b};
  const int P = static_cast<int>(b.ctrl.size());
  d::epoch_publish<W>(at(r), e, arrival);
  const d::EpochPoll s = d::epoch_wait<W>(at, P, e, arrival, timeout, check, ProtocolClock{}, ProtocolPause{});
  if (s.code == d::EpochCode::timeout_arrive || s.code == d::EpochCode::timeout_done) d::epoch_mark_missed<W>(at, P, e, arrival, ProtocolNoLate{});
  if (s.code != d::EpochCode::ok && s.code != d::EpochCode::aborted) d::epoch_break<W>(at, r);
  return s;
}

template <class W, class Ctrl>
void protocol_in_order() {
  constexpr int P = 3, kCalls = 200, kWords = 64;
  ProtocolBlocks<Ctrl> b(P);
  std::vector<std::vector<std::atomic<std::uint64_t>>> input(P);
  for (auto& v : input) v = std::vector<std::atomic<std::uint64_t>>(kWords);
  std::atomic<int> torn{0}, failed{0};
  std::vector<std::thread> ranks;
  for (int r = 0; r < P; ++r)
    ranks.emplace_back([&, r] {
      for (std::uint64_t e = 1; e <= kCalls; ++e) {
        for (auto& w : input[static_cast<std::size_t>(r)]) w.store(e * 100 + static_cast<std::uint64_t>(r), std::memory_order_relaxed);
        if (protocol_step<W>(b, r, e, true, kProtocolLong).code != ulysses::detail::EpochCode::ok) failed.fetch_add(1);
        for (int p = 0; p < P; ++p)  // the copy: every peer's input of this call
          for (auto& w : input[static_cast<std::size_t>(p)])
            if (w.load(std::memory_order_relaxed) != e * 100 + static_cast<std::uint64_t>(p)) torn.fetch_add(1);
        if (protocol_step<W>(b, r, e, false, kProtocolLong).code != ulysses::detail::EpochCode::ok) failed.fetch_add(1);
      }
    });
  for (auto& t : ranks) t.join();
  CHECK(torn.load() == 0);
  CHECK(failed.load() == 0);
  for (int r = 0; r < P; ++r) {
    CHECK(b.ctrl[static_cast<std::size_t>(r)]->arrive == static_cast<std::uint64_t>(kCalls));
    CHECK(b.ctrl[static_cast<std::size_t>(r)]->done == static_cast<std::uint64_t>(kCalls));
    CHECK(b.ctrl[static_cast<std::size_t>(r)]->missed == 0);
  }
  CHECK(b.ctrl[0]->abort == 0);
}

template <class W, class Ctrl>
void protocol_missing_rank() {
  namespace d = ulysses::detail;
  ProtocolBlocks<Ctrl> b(3);
  std::vector<d::EpochPoll> got(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)  // rank 2 never enters
    ranks.emplace_back([&, r] { got[static_cast<std::size_t>(r)] = protocol_step<W>(b, r, 1, true, kProtocolShort); });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    const d::EpochPoll& s = got[static_cast<std::size_t>(r)];
    CAPTURE(r);
    CHECK((s.code == d::EpochCode::timeout_arrive || s.code == d::EpochCode::aborted));  // aborted: the other one timed out first
    if (s.code == d::EpochCode::timeout_arrive) CHECK((s.peer == 2 && s.late == 1u << 2));
    if (s.code == d::EpochCode::aborted) CHECK((s.not_arrived == 1u << 2 && s.not_done == 0 && s.missed_call == 1));
  }
  const std::uint64_t who = b.ctrl[0]->abort;
  CHECK((who == 1 || who == 2));  // 1 + the rank that timed out
  CHECK(b.ctrl[2]->missed == d::missed_word(1, true));  // marked in its own block, before the abort word
  CHECK(b.ctrl[0]->missed == 0);
  // Rank 2 arrives late: the group is broken, its wait ends at once, naming itself missing.
  const auto t0 = std::chrono::steady_clock::now();
  const d::EpochPoll late = protocol_step<W>(b, 2, 1, true, kProtocolLong);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(late.code == d::EpochCode::aborted);
  CHECK(late.peer == static_cast<int>(who - 1));
  CHECK(late.not_arrived == 1u << 2);
  // A done wait of a broken group ends at once too (rank 0 alone finished reading).
  CHECK(protocol_step<W>(b, 0, 1, false, kProtocolLong).code == d::EpochCode::aborted);
  // A failed rank waits only for the peers that arrived and still read (epoch_readers_done).
  const ProtocolAt<Ctrl> at{&b};
  CHECK(!d::epoch_readers_done<W>(at, 3, 1));  // ranks 1 and 2 arrived, have not finished reading
  d::epoch_publish<W>(at(1), 1, false);
  d::epoch_publish<W>(at(2), 1, false);
  CHECK(d::epoch_readers_done<W>(at, 3, 1));
}

/// Rank `bad` publishes a value other than rank 0's; the check sees it once every rank arrived.
template <class W, class Ctrl>
struct ProtocolValueCheck {
  const std::vector<std::uint64_t>* values;
  ulysses::detail::EpochPoll operator()() const {
    ulysses::detail::EpochPoll s;
    s.finished = true;
    for (std::size_t p = 0; p < values->size(); ++p)
      if ((*values)[p] != (*values)[0]) {
        s.code = ulysses::detail::EpochCode::record_mismatch;
        s.peer = static_cast<int>(p);
        break;
      }
    return s;
  }
};

template <class W, class Ctrl>
void protocol_records_first() {
  namespace d = ulysses::detail;
  constexpr int P = 4;
  ProtocolBlocks<Ctrl> b(P);
  const std::vector<std::uint64_t> values{7, 7, 8, 7};
  std::vector<d::EpochPoll> got(P);
  std::vector<std::thread> ranks;
  for (int r = 0; r < P; ++r)  // each rank breaks the group on its mismatch; the later ones still report the mismatch
    ranks.emplace_back([&, r] { got[static_cast<std::size_t>(r)] = protocol_step<W>(b, r, 1, true, kProtocolLong, ProtocolValueCheck<W, Ctrl>{&values}); });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < P; ++r) {
    CAPTURE(r);
    CHECK(got[static_cast<std::size_t>(r)].code == d::EpochCode::record_mismatch);
    CHECK(got[static_cast<std::size_t>(r)].peer == 2);
  }
  CHECK(b.ctrl[0]->abort != 0);
}

/// The protocol's cases over the words `W` of control blocks `Ctrl` (fields arrive, done, abort, missed).
template <class W, class Ctrl>
void window_protocol_cases() {
  SUBCASE("epochs in order, every peer's input read whole before its owner rewrites it") { protocol_in_order<W, Ctrl>(); }
  SUBCASE("a rank that never arrives: the others time out naming it, it and later waits get aborted naming it") {
    protocol_missing_rank<W, Ctrl>();
  }
  SUBCASE("records that differ: every rank's verdict is the mismatch, even after the first broke the group") {
    protocol_records_first<W, Ctrl>();
  }
}

}  // namespace ut
