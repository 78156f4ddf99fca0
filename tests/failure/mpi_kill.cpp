// SPDX-License-Identifier: Apache-2.0
// A process killed mid-run under MPI (ctest: `mpiexec -n 3` through mpi_kill.cmake), on the two
// ways between processes. Rank 2 raises SIGKILL; ranks 0 and 1 then call with every rank (2
// included) under a 500 ms deadline and must leave with a coded error within the deadline plus a
// margin:
//   (no argument) MpiComm::exchange_messages: Error(timeout) naming rank 2 (Open MPI's
//       shared-memory transport does not notice a dead peer, so the deadline does), or
//       Error(backend) if MPI noticed the death and returned an error (MPI_ERRORS_RETURN);
//   `window`: seq_to_head over MpiWindowComm, the inputs in an MpiWindow, after one exchange of all
//       three under a long deadline (the agreement check and the peer lists done): Error(timeout)
//       on a survivor whose deadline passed first, or Error(aborted) on one that saw the other
//       break the group first, each naming rank 2 among the ranks that did not arrive; then the
//       survivors' window destructors return within the window's timeout (they leak the window:
//       the dead rank never frees it);
//   `split`: a split-phase seq_to_head over MpiComm (split_phase.hpp), rank 2 killed between its
//       start() and its finish(): the survivors' finish() throws Error(timeout) naming it, or
//       Error(backend) / Error(aborted).
// Each survivor prints one line, "mpi_kill: rank R: OK ..." or "mpi_kill: rank R: WRONG ...", for
// mpi_kill.cmake to judge; Open MPI's runtime may end the job before the survivors get that far
// (see there).
#include <ulysses/comm/mpi.hpp>
#include <ulysses/split_phase.hpp>
#include <ulysses/ulysses.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "messages.hpp"

namespace {
using namespace ulysses;
using clock_type = std::chrono::steady_clock;
const std::chrono::milliseconds kDeadline(500);
constexpr double kMarginMs = 1500;

double ms_since(clock_type::time_point t0) { return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count(); }

/// Runs `f` and returns {code, message} of the Error it throws ({Errc{}, "no error"} without one).
template <class F>
std::pair<Errc, std::string> error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  return {Errc{}, "no error"};
}

/// The message path: rank `dead` is killed before exchange_messages with every rank.
bool messages_case(MpiComm& mc, int r, int n, int dead, std::string& report) {
  MPI_Barrier(MPI_COMM_WORLD);  // every rank is up; from here on, no collective on the world
  if (r == dead) std::raise(SIGKILL);
  ut::MessagePattern m(n, r);  // messages to and from every rank, the dead one included
  const auto t0 = clock_type::now();
  const auto [code, what] = error_of([&] { mc.exchange_messages(m.send.data(), m.send.size(), m.recv.data(), m.recv.size()); });
  const double ms = ms_since(t0);
  const bool ok = ((code == Errc::timeout && what.find("ranks {" + std::to_string(dead) + "}") != std::string::npos) || code == Errc::backend) &&
                  ms < static_cast<double>(kDeadline.count()) + kMarginMs;
  report = std::string(to_string(code)) + " after " + std::to_string(ms) + " ms: " + what;
  return ok;
}

/// Whether `what` names `rank` among the ranks "ranks {a, b, ...} did not arrive" (a late survivor
/// may be named too: under load it can be behind as well).
bool names_not_arrived(const std::string& what, int rank) {
  const std::string tail = "} did not arrive";
  const std::size_t end = what.find(tail);
  const std::size_t begin = end == std::string::npos ? end : what.rfind("ranks {", end);
  if (begin == std::string::npos) return false;
  std::string set = what.substr(begin + 7, end - begin - 7) + ",";
  for (std::size_t at = 0, comma; (comma = set.find(',', at)) != std::string::npos; at = comma + 1)
    if (std::stoi(set.substr(at, comma - at)) == rank) return true;
  return false;
}

/// The window path: one exchange of all ranks, then rank `dead` is killed before the second.
bool window_case(MpiComm& mc, int r, int n, int dead, std::string& report) {
  const std::chrono::seconds first_deadline(60);  // the first exchange (every rank alive) is not what is timed
  mc.set_timeout(first_deadline);
  const auto heads = HeadPartition::even(2 * n, n);
  const Plan plan({n, r}, 1, SeqPartition::even(2 * n, n), {TensorSpec::of<float>(heads, 4)});
  auto win = std::make_unique<MpiWindow>(mc, plan.seq_bytes(0) + 4096);
  win->set_timeout(kDeadline);
  const WindowSpan in = win->allocate(plan.seq_bytes(0));
  std::memset(in.data(), 0, in.size());
  std::vector<float> out(plan.head_bytes(0) / sizeof(float));
  auto wc = std::make_unique<MpiWindowComm>(mc, *win, first_deadline);
  HostExecutor ex;
  auto run = [&] { seq_to_head(plan, *wc, ex, {in}, {ByteSpan(out)}, {}); };
  const auto [first, first_what] = error_of(run);  // all ranks: the agreement check and the peer lists
  if (first != Errc{}) {
    report = "the first exchange (every rank alive) failed: " + first_what;
    return false;
  }
  mc.set_timeout(kDeadline);
  wc->set_timeout(kDeadline);
  MPI_Barrier(MPI_COMM_WORLD);  // from here on, no collective on the world
  if (r == dead) std::raise(SIGKILL);
  const auto t0 = clock_type::now();
  const auto [code, what] = error_of(run);
  const double ms = ms_since(t0);
  const auto t1 = clock_type::now();
  wc.reset();
  win.reset();  // leaks the window after at most the window's timeout (the dead rank never frees it)
  const double free_ms = ms_since(t1);
  const bool ok = (code == Errc::timeout || code == Errc::aborted) && names_not_arrived(what, dead) &&
                  ms < static_cast<double>(kDeadline.count()) + kMarginMs && free_ms < static_cast<double>(kDeadline.count()) + kMarginMs;
  report = std::string(to_string(code)) + " after " + std::to_string(ms) + " ms, the window destroyed in " + std::to_string(free_ms) +
           " ms: " + what;
  return ok;
}
/// The split-phase path: one split-phase seq->head of all ranks (the agreement check done), then
/// every rank starts a second (its messages posted) and rank `dead` is killed between its start()
/// and its finish(): the survivors' finish() leaves with Error(timeout) naming it, or
/// Error(backend) / Error(aborted) (MPI noticed, or a peer broke the group first), or succeeds
/// with every output byte right (the killed rank had moved them all before it died).
bool split_case(MpiComm& mc, int r, int n, int dead, std::string& report) {
  const std::chrono::seconds first_deadline(60);
  mc.set_timeout(first_deadline);
  const auto heads = HeadPartition::even(2 * n, n);
  // 1 MiB a message: past every transport's eager limit, so that the killed rank's posted sends
  // cannot have completed on their own (with 64-byte messages they had, and the survivors'
  // finish() succeeded: the exchange was whole before the kill)
  const Plan plan({n, r}, 1, SeqPartition::even(2 * n, n), {TensorSpec::of<float>(heads, std::int64_t{1} << 16)});
  std::vector<float> in(plan.seq_bytes(0) / sizeof(float)), out(plan.head_bytes(0) / sizeof(float));
  const std::int64_t D = std::int64_t{1} << 16, H = 2 * n;
  auto value = [](int p, std::int64_t i) { return static_cast<float>(p * 131 + i % 1009); };
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = value(r, static_cast<std::int64_t>(i));  // [1, 2, H, D] of rank r
  std::vector<std::byte> ws(plan.workspace_bytes());
  HostExecutor ex;
  auto start = [&] { return start_seq_to_head(plan, mc, ex, {ConstByteSpan(in)}, {ByteSpan(out)}, ws); };
  const auto [first, first_what] = error_of([&] {
    auto h = start();
    finish(h);
  });
  if (first != Errc{}) {
    report = "the first exchange (every rank alive) failed: " + first_what;
    return false;
  }
  mc.set_timeout(kDeadline);
  MPI_Barrier(MPI_COMM_WORLD);  // from here on, no collective on the world
  auto h = start();
  if (r == dead) std::raise(SIGKILL);
  const auto t0 = clock_type::now();
  const auto [code, what] = error_of([&] { finish(h); });
  const double ms = ms_since(t0);
  const bool named = what.find(std::to_string(dead)) != std::string::npos;
  // The killed rank may have moved all of this rank's bytes before it died (its MPI calls in
  // start() progress the messages: Cross Memory Attach copies a whole 1 MiB in microseconds), and
  // then the exchange is whole: success is right if, and only if, every output byte is.
  bool whole = code == Errc{};
  for (int p = 0; p < n && whole; ++p)  // out [1, 2n, 2, D]: token 2p + s from rank p, head 2r + j
    for (std::int64_t s = 0; s < 2 && whole; ++s)
      for (std::int64_t j = 0; j < 2 && whole; ++j)
        for (std::int64_t d = 0; d < D && whole; d += 4093)
          whole = out[static_cast<std::size_t>(((2 * p + s) * 2 + j) * D + d)] == value(p, (s * H + 2 * r + j) * D + d);
  const bool ok = ((code == Errc::timeout && named) || code == Errc::backend || code == Errc::aborted || whole) &&
                  ms < static_cast<double>(kDeadline.count()) + kMarginMs;
  report = std::string(to_string(code)) + " after " + std::to_string(ms) + " ms: " + (code == Errc{} ? (whole ? "the exchange was whole" : "no error, and WRONG bytes") : what);
  return ok;
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "message";
  const bool window = mode == "window";
  int r = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MpiComm mc(comm, MpiComm::kIntMaxBytes, kDeadline);
  std::string report;
  const bool ok = window ? window_case(mc, r, n, n - 1, report)
                  : mode == "split" ? split_case(mc, r, n, n - 1, report) : messages_case(mc, r, n, n - 1, report);
  std::printf("mpi_kill: rank %d: %s (%s path, deadline %lld ms): %s\n", r, ok ? "OK" : "WRONG", mode.c_str(),
              static_cast<long long>(kDeadline.count()), report.c_str());
  std::fflush(stdout);
  MPI_Finalize();
  return ok ? 0 : 1;
}
