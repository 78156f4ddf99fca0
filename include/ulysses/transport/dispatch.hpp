// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The one place that knows every transport: the table from Path to its transport
///        (visit_transport()), the one choice of a path (choose_path()), and what the facade and
///        the pipelines call per stage (pack_list(), unpack_list(), stage_exchange()). The
///        transports' members and how to add one: visit_transport(); docs/design.md,
///        "Transports", and docs/extending.md.
#pragma once

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "alltoallv.hpp"
#include "common.hpp"
#include "messages.hpp"
#include "peer_copy.hpp"
#include "two_level.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Every transport is a file of its own under transport/, a type with the same static members:
/// `path`; `supported<Comm, Exec>` (what it needs from the communicator and executor, compile
/// time); `pack_list` / `unpack_list` (the plan's lists it runs before and after the exchange of
/// a stage; none for the peer copy, which has no stages); `exchange`; `copies` (copies per
/// element); and for the decode exchange (decode/exchange.hpp) `serves_decode<Comm, Exec>`,
/// `reads_in_place` and `exchange_chunks` (a flat wire of one chunk per peer, ChunkWire). Adding
/// one is a new file, an enumerator of Path (plan/spec.hpp) and one line below; it then serves
/// seq→head, head→seq, their backward and the decode exchange.
///
/// | path      | moves bytes by                                                   | copies per element (executor) |
/// |-----------|------------------------------------------------------------------|-------------------------------|
/// | alltoallv | pack, one all-to-all-v, unpack (transport/alltoallv.hpp)          | 2 for peers' bytes, 1 own      |
/// | messages  | one message per piece, in place where contiguous (messages.hpp)   | 0-2 for peers' bytes, 1 own    |
/// | direct    | ranks read each other's inputs, the peer copy (peer_copy.hpp)     | 1 (no transport, no workspace) |
/// | two_level | pack, 3 rounds of messages along the node layout (two_level.hpp)  | 2, as alltoallv; 1-3 links     |
///
/// Calls f(T{}) with the transport type T of path p (Path::automatic: the all-to-all-v, as
/// Plan::copies() counts it) and returns what it returns: the one switch over Path.
template <class F>
decltype(auto) visit_transport(Path p, F&& f) {
  switch (p) {
    case Path::messages: return std::forward<F>(f)(MessagesTransport{});
    case Path::direct: return std::forward<F>(f)(PeerCopyTransport{});
    case Path::two_level: return std::forward<F>(f)(TwoLevelTransport{});
    case Path::automatic:
    case Path::alltoallv: break;
  }
  return std::forward<F>(f)(AlltoallvTransport{});
}

/// What a communicator type C and an executor type E can do together (compile time): each
/// transport's `supported<C, E>`.
template <class Comm, class Exec>
struct PathSupport {
  /// The executor's memory is the communicator's (both host, or both device).
  static constexpr bool same_memory = detail::same_memory_v<Comm, Exec>;
  static constexpr bool alltoallv = AlltoallvTransport::supported<Comm, Exec>;  ///< every communicator
  static constexpr bool messages = MessagesTransport::supported<Comm, Exec>;    ///< exchange_messages()
  static constexpr bool direct = PeerCopyTransport::supported<Comm, Exec>;      ///< with_peers() + allgather()
  static constexpr bool two_level = TwoLevelTransport::supported<Comm, Exec>;   ///< exchange_messages()
  /// Whether path p is possible (Path::automatic always is).
  static constexpr bool can(Path p) {
    return p == Path::automatic ||
           visit_transport(p, [](auto t) { return decltype(t)::template supported<Comm, Exec>; });
  }
};

/// Whether path p serves the decode exchange of a communicator of type Comm and an executor of
/// type Exec (the transport's `serves_decode`; Path::automatic: the all-to-all-v's).
template <class Comm, class Exec>
bool serves_decode(Path p) {
  return visit_transport(p, [](auto t) { return decltype(t)::template serves_decode<Comm, Exec>; });
}
/// Whether path p reads the peers' inputs in place instead of moving chunks (the peer copy).
inline bool reads_in_place(Path p) {
  return visit_transport(p, [](auto t) { return decltype(t)::reads_in_place; });
}

namespace detail {
/// Why a path is not possible with these types (for Error(path_unsupported)).
inline std::string why_unsupported(Path p) {
  if (p == Path::direct)
    return "the direct path (peer copy) needs ranks that share memory: a communicator with with_peers() and allgather() "
           "of host memory (LocalGroup::Comm; MpiWindowComm between the MPI processes of one node), and a host executor";
  return std::string("the ") + to_string(p) +
         " path needs a communicator with exchange_messages() whose memory is the executor's (host and host, or device and device)";
}

/// What Plan::copies() forwards to.
struct TransportDispatch {
  static CopyCount copies(const Plan& plan, Direction d, Path p) {
    return visit_transport(p, [&](auto t) { return decltype(t)::copies(plan, d); });
  }
};
}  // namespace detail

/// The transport a redistribution of `plan` takes with a communicator of type Comm and an
/// executor of type Exec: PlanOptions::path when set, else the fewest copies possible: direct
/// (peer copy), else messages (unless PlanOptions::in_place_messages is off), else alltoallv. A
/// two-level plan (Plan::two_level(): PlanOptions::nodes spans nodes) takes direct where
/// possible, else two_level. The same on every rank that uses the same types and plan options
/// (which check_agreement() compares). Compile error when Comm or Exec names a concept member
/// with a signature that does not fit (comm/concepts.hpp).
/// @throws Error(path_unsupported) PlanOptions::path names a transport the types cannot do, or a
///         two-level plan meets types without exchange_messages() (before any exchange, on every
///         rank alike).
template <class Comm, class Exec>
Path choose_path(const Plan& plan) {
  static_assert(check_communicator<Comm>() && check_executor<Exec>());
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
    if (S::messages && o.messages_enabled()) return Path::messages;
    return Path::alltoallv;
  }
  if (!S::can(o.path))
    detail::fail(Errc::path_unsupported, std::string("PlanOptions::path = ") + to_string(o.path) + ", but " +
                                             detail::why_unsupported(o.path) + "; use Path::automatic or another path");
  return o.path;
}

/// The block list the executor runs before the exchange of stage `stage` on `path` (the pack):
/// StageLists::pack on alltoallv and two_level, pack_staged on messages (only the pieces not in
/// place). What redistribute(), the pipelines and anything that times the phases run.
/// @pre path is alltoallv, messages or two_level (the peer copy has no stages).
inline const std::vector<BlockCopy>& pack_list(const Plan& plan, Direction dir, Path path, int stage = 0) {
  return visit_transport(path, [&](auto t) -> const std::vector<BlockCopy>& {
    if constexpr (decltype(t)::path == Path::direct) return plan.stage_lists(dir, stage).pack;  // unused: no stages
    else return decltype(t)::pack_list(plan, dir, stage);
  });
}
/// The block list the executor runs after the exchange of stage `stage` on `path` (the unpack,
/// the own chunk and the sums): StageLists::unpack, or unpack_staged on messages.
/// @pre as pack_list().
inline const std::vector<BlockCopy>& unpack_list(const Plan& plan, Direction dir, Path path, int stage = 0) {
  return visit_transport(path, [&](auto t) -> const std::vector<BlockCopy>& {
    if constexpr (decltype(t)::path == Path::direct) return plan.stage_lists(dir, stage).unpack;  // unused: no stages
    else return decltype(t)::unpack_list(plan, dir, stage);
  });
}

/// The exchange of stage `stage` on `path` (alltoallv, messages or two_level), after the
/// communicator check and, before a plan's first exchange on this communicator, the cross-rank
/// check (when Plan::agreement_check_enabled()).
/// @throws Error(comm_mismatch) communicator of another size or rank; Error(plan_mismatch) ranks
///         planned from different inputs; Error(path_unsupported) a flat path on a two-level plan,
///         two_level on a flat one, or a path the communicator cannot do; backend errors.
template <class Comm>
void stage_exchange(const Plan& plan, Direction dir, Path path, Comm& comm, const BufferTable& buffers, int stage = 0) {
  static_assert(check_communicator<Comm>());
  if (path == Path::two_level) {
    if (!plan.two_level())
      detail::fail(Errc::path_unsupported, "exchange_two_level: the plan has no two-level layout (give PlanOptions::nodes, or "
                                           "PlanOptions::path = Path::two_level)");
  } else {
    detail::require_flat(plan, path == Path::messages ? "exchange_pieces" : "exchange");
  }
  detail::before_exchange(plan, comm);
  visit_transport(path, [&](auto t) {
    using T = decltype(t);
    if constexpr (T::path == Path::direct) {
      detail::fail(Errc::path_unsupported, "stage_exchange: the direct path (peer copy) has no stages; use exchange_direct()");
    } else if constexpr (T::template supported<Comm, detail::AnyMemoryOf<Comm>>) {
      T::exchange(plan, dir, comm, buffers, stage);
    } else {
      detail::fail(Errc::path_unsupported, std::string("stage_exchange: ") + detail::why_unsupported(T::path));
    }
  });
}

ULYSSES_NAMESPACE_END
