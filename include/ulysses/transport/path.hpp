// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The communicator and executor concepts, their capabilities, and the one place where
///        the transport (Path) of a redistribution is chosen.
///
/// One plan, three transports (heFFTe's reshape: alltoall, alltoallv and point-to-point over the
/// same pack plans; NCCL's and c10d's capability queries): every transport runs the plan's block
/// lists; they differ in how the bytes cross between ranks, and in how many copies that takes.
///
/// | path      | moves bytes by                         | copies per element (executor)            |
/// |-----------|----------------------------------------|------------------------------------------|
/// | alltoallv | pack, one all-to-all-v, unpack         | 2 for peers' bytes (pack + unpack), 1 own |
/// | messages  | one message per (peer, tensor)         | 0-2: a piece contiguous in the user's tensor skips its pack (sending) or unpack (receiving) |
/// | direct    | ranks read each other's inputs         | 1 (no transport, no workspace)           |
/// | two_level | pack, 3 rounds of messages (gather per node, one message per node pair, deliver), unpack | 2, as alltoallv; a chunk crosses 1-3 links |
///
/// Plan::copies() gives the counts of a plan's actual lists.
///
/// Communicator concept — a type C must provide:
/// - `int size() const`, `int rank() const`: the group's degree and this member's rank;
/// - `void alltoallv(const std::byte* send, const std::size_t* send_bytes, const std::size_t*
///   send_offsets, std::byte* recv, const std::size_t* recv_bytes, const std::size_t* recv_offsets)`:
///   collective; arrays of size() entries indexed by peer, in bytes; the chunk for peer p is
///   `[send + send_offsets[p], + send_bytes[p])`, what p sends lands at `recv + recv_offsets[p]`;
///   zero-byte pairs occur (the own chunk is always 0 in plans) and must not hang; errors are
///   thrown as ulysses::Error(backend). Data in place on return, or in stream order.
/// and may provide (each enables what it says; a member with another signature is just not used):
/// - `void allgather(const void* send, std::size_t bytes, void* recv)` of HOST memory (rank p's
///   bytes at recv + p * bytes): the cross-rank plan check (without it: alltoallv on host buffers,
///   unless the type declares `static constexpr bool device_memory = true`), and the direct path;
/// - `void exchange_messages(const Message* send, std::size_t n_send, const Message* recv,
///   std::size_t n_recv)`: collective; sends each message of `send` to its peer, receives each of
///   `recv` from its peer; the k-th message rank i sends rank j is the k-th j receives from i (same
///   bytes); never to the rank itself; every rank calls it, even with empty lists → Path::messages;
/// - `void with_peers(const void* mine, void (*work)(void* ctx, const void* const* all), void* ctx)`:
///   collective over ranks that share one address space (threads of one process): publishes `mine`,
///   waits for every rank, calls work(ctx, all) with all[p] = rank p's `mine`, and returns only after
///   every rank's work has returned (no rank may then touch a peer's memory) → Path::direct (with
///   allgather(), which exchanges the ranks' layouts once per plan). For device memory
///   (DeviceLocalGroup::Comm) the same in stream order: work enqueues the copies after every
///   peer's input is ready, and no peer's later work overwrites an input before they have run;
/// - `static constexpr bool device_memory = true`: its buffers are device memory (NcclComm,
///   DeviceLocalGroup::Comm); otherwise host memory;
/// - `stream()`: the stream its exchanges are ordered on (checked against a stream-ordered executor's).
/// Shipped: LocalGroup::Comm (all of them but device_memory), MpiComm (allgather, exchange_messages),
/// NcclComm (allgather, exchange_messages, device_memory, stream) and DeviceLocalGroup::Comm (all
/// of them).
///
/// Executor concept — a type E must provide `void run(const BlockCopy* blocks, std::size_t n, const
/// BufferTable& t)` (copy.hpp) and may declare `static constexpr bool runs_on_host = true` (host
/// loads and stores, done on return: HostExecutor) or `static constexpr bool device_memory = true`
/// (stream-ordered device work: CudaExecutor). The message and direct paths need the executor's
/// memory to be the communicator's; on the direct path a device executor also provides
/// `prepare_direct(const Plan&)` (uploads the direct lists once).
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

#include "../layout/blocks.hpp"
#include "../error.hpp"
#include "../plan/plan.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

template <class C, class = void>
struct has_allgather : std::false_type {};
template <class C>
struct has_allgather<C, std::void_t<decltype(std::declval<C&>().allgather(std::declval<const void*>(), std::size_t{},
                                                                          std::declval<void*>()))>> : std::true_type {};

template <class C, class = void>
struct has_exchange_messages : std::false_type {};
template <class C>
struct has_exchange_messages<C, std::void_t<decltype(std::declval<C&>().exchange_messages(
                                    std::declval<Message*>(), std::size_t{}, std::declval<Message*>(), std::size_t{}))>>
    : std::true_type {};

/// The callback of with_peers(): work(ctx, all) with all[p] = what rank p published.
using PeerWork = void (*)(void* ctx, const void* const* all);
template <class C, class = void>
struct has_with_peers : std::false_type {};
template <class C>
struct has_with_peers<C, std::void_t<decltype(std::declval<C&>().with_peers(std::declval<const void*>(), std::declval<PeerWork>(),
                                                                            std::declval<void*>()))>> : std::true_type {};

template <class E, class = void>
struct runs_on_host : std::false_type {};
template <class E>
struct runs_on_host<E, std::enable_if_t<E::runs_on_host>> : std::true_type {};

template <class C, class = void>
struct device_memory : std::false_type {};
template <class C>
struct device_memory<C, std::enable_if_t<C::device_memory>> : std::true_type {};

/// Whether an executor uploads the direct path's lists on demand (`prepare_direct(s2h, h2s, degree)`: CudaExecutor).
template <class E, class = void>
struct has_prepare_direct : std::false_type {};
template <class E>
struct has_prepare_direct<E, std::void_t<decltype(std::declval<const E&>().prepare_direct(BlockList{}, BlockList{}, int{}))>>
    : std::true_type {};

/// Whether C has `stream()` (stream-ordered communicators and executors: NcclComm,
/// DeviceLocalGroup::Comm, CudaExecutor).
template <class C, class = void>
struct has_stream : std::false_type {};
template <class C>
struct has_stream<C, std::void_t<decltype(std::declval<const C&>().stream())>> : std::true_type {};

}  // namespace detail

/// What a communicator type C and an executor type E can do together (compile time).
template <class Comm, class Exec>
struct PathSupport {
  /// The executor's memory is the communicator's (both host, or both device).
  static constexpr bool same_memory = detail::device_memory<Comm>::value ? detail::device_memory<Exec>::value
                                                                          : detail::runs_on_host<Exec>::value;
  static constexpr bool alltoallv = true;  ///< every communicator
  /// exchange_messages() and executor memory the communicator's.
  static constexpr bool messages = detail::has_exchange_messages<Comm>::value && same_memory;
  /// with_peers() and allgather() (host memory) on the communicator, and executor memory the
  /// communicator's (a device executor must also have prepare_direct(plan), as CudaExecutor).
  static constexpr bool direct = detail::has_with_peers<Comm>::value && detail::has_allgather<Comm>::value && same_memory &&
                                 (detail::runs_on_host<Exec>::value || detail::has_prepare_direct<Exec>::value);
  /// The two-level exchange (three rounds of messages): exchange_messages() and executor memory
  /// the communicator's, as Path::messages.
  static constexpr bool two_level = messages;
  /// Whether path p is possible (Path::automatic always is).
  static constexpr bool can(Path p) {
    return p == Path::direct ? direct : p == Path::messages ? messages : p == Path::two_level ? two_level : true;
  }
};

/// The transport a redistribution of `plan` takes with a communicator of type Comm and an
/// executor of type Exec: PlanOptions::path when set, else the fewest copies possible: direct,
/// else messages (unless PlanOptions::direct_pieces is off), else alltoallv. A two-level plan
/// (Plan::two_level(): PlanOptions::nodes spans nodes) takes direct where possible, else
/// two_level. The same on every rank that uses the same types and plan options (which
/// check_agreement() compares).
/// @throws Error(path_unsupported) PlanOptions::path names a transport the types cannot do, or a
///         two-level plan meets types without exchange_messages() (before any exchange, on every
///         rank alike).
template <class Comm, class Exec>
Path choose_path(const Plan& plan) {
  using S = PathSupport<Comm, Exec>;
  const PlanOptions& o = plan.options();
  if (plan.two_level()) {
    if (o.path == Path::automatic && S::direct) return Path::direct;
    if (!S::two_level)
      detail::fail(Errc::path_unsupported, std::string("the plan lays out the two-level exchange (PlanOptions::nodes ") +
                                               plan.nodes().str() + ", path " + to_string(o.path) +
                                               "), which needs a communicator with exchange_messages() whose memory is "
                                               "the executor's; set PlanOptions::path = Path::alltoallv for the flat exchange");
    return Path::two_level;
  }
  if (o.path == Path::automatic) {
    if (S::direct) return Path::direct;
    if (S::messages && o.direct_pieces) return Path::messages;
    return Path::alltoallv;
  }
  if (!S::can(o.path)) {
    const std::string why = o.path == Path::direct
                                ? "the direct path needs ranks that share memory: a communicator with with_peers() and "
                                  "allgather() of host memory (LocalGroup::Comm), and a host executor"
                                : std::string("the ") + to_string(o.path) +
                                      " path needs a communicator with exchange_messages() whose memory is the "
                                      "executor's (host and host, or device and device)";
    detail::fail(Errc::path_unsupported, std::string("PlanOptions::path = ") + to_string(o.path) + ", but " + why +
                                             "; use Path::automatic or another path");
  }
  return o.path;
}

ULYSSES_NAMESPACE_END
