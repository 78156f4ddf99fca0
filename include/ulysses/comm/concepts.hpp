// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The communicator and executor concepts, stated once: what a type must provide, the
///        optional capabilities that open the faster transports, the traits the library reads
///        (comm_traits, executor_traits; a user type may specialise them), and the compile-time
///        checks that name a member whose signature is wrong instead of silently not using it.
///        Every member and what it opens: docs/extending.md; which shipped type has which:
///        README.md (Communicators, executors, and the path each takes). Source of the pattern:
///        c10d's Backend (optional features queried, default false) and NCCL's
///        ncclCommQueryProperties (capabilities as data).
///        Notes: docs/headers.md (comm/concepts.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "../layout/blocks.hpp"
#include "exchange_state.hpp"
#include "peer_record.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// The callback of with_peers(): work(ctx, all) with all[p] = what rank p published.
using PeerWork = void (*)(void* ctx, const void* const* all);

// ---- whether a member can be called as the concept says --------------------------------------
template <class C, class = void>
struct has_size_rank : std::false_type {};
template <class C>
struct has_size_rank<C, std::void_t<decltype(int{std::declval<const C&>().size()}), decltype(int{std::declval<const C&>().rank()})>>
    : std::true_type {};

template <class C, class = void>
struct has_alltoallv : std::false_type {};
template <class C>
struct has_alltoallv<C, std::void_t<decltype(std::declval<C&>().alltoallv(
                            std::declval<const std::byte*>(), std::declval<const std::size_t*>(), std::declval<const std::size_t*>(),
                            std::declval<std::byte*>(), std::declval<const std::size_t*>(), std::declval<const std::size_t*>()))>>
    : std::true_type {};

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

template <class C, class = void>
struct has_split_messages : std::false_type {};
template <class C>
struct has_split_messages<C, std::void_t<decltype(std::declval<C&>().start_messages(std::declval<Message*>(), std::size_t{},
                                                                                    std::declval<Message*>(), std::size_t{})),
                                         decltype(std::declval<C&>().finish_messages())>> : std::true_type {};

template <class C, class = void>
struct has_with_peers : std::false_type {};
template <class C>
struct has_with_peers<C, std::void_t<decltype(std::declval<C&>().with_peers(std::declval<const void*>(), std::declval<PeerWork>(),
                                                                            std::declval<void*>()))>> : std::true_type {};

template <class C, class = void>
struct has_exchange_state : std::false_type {};
template <class C>
struct has_exchange_state<C, std::enable_if_t<std::is_same_v<decltype(std::declval<C&>().exchange_state()), ExchangeState&>>>
    : std::true_type {};

template <class E, class = void>
struct has_run : std::false_type {};
template <class E>
struct has_run<E, std::void_t<decltype(std::declval<E&>().run(std::declval<const BlockCopy*>(), std::size_t{},
                                                              std::declval<const BufferTable&>()))>> : std::true_type {};

template <class E, class = void>
struct has_prepare_direct : std::false_type {};
template <class E>
struct has_prepare_direct<E, std::void_t<decltype(std::declval<const E&>().prepare_direct(BlockList{}, BlockList{}, int{}))>>
    : std::true_type {};

template <class C, class = void>
struct has_stream : std::false_type {};
template <class C>
struct has_stream<C, std::void_t<decltype(std::declval<const C&>().stream())>> : std::true_type {};

template <class E, class = void>
struct runs_on_host : std::false_type {};
template <class E>
struct runs_on_host<E, std::enable_if_t<E::runs_on_host>> : std::true_type {};

template <class E, class = void>
struct row_transforms : std::false_type {};
template <class E>
struct row_transforms<E, std::enable_if_t<E::row_transforms>> : std::true_type {};

template <class C, class = void>
struct has_abort : std::false_type {};
template <class C>
struct has_abort<C, std::void_t<decltype(std::declval<C&>().abort(std::declval<const std::string&>()))>> : std::true_type {};

template <class C, class = void>
struct progress_thread : std::false_type {};
template <class C>
struct progress_thread<C, std::enable_if_t<C::progress_thread>> : std::true_type {};
template <class C, class = void>
struct one_address_space : std::false_type {};
template <class C>
struct one_address_space<C, std::enable_if_t<C::one_address_space>> : std::true_type {};

template <class C, class = void>
struct peer_outputs : std::false_type {};
template <class C>
struct peer_outputs<C, std::enable_if_t<C::peer_outputs>> : std::true_type {};

template <class C, class = void>
struct device_memory : std::false_type {};
template <class C>
struct device_memory<C, std::enable_if_t<C::device_memory>> : std::true_type {};

// ---- whether a member of that name exists at all (one non-template, non-overloaded member) ----
#define ULYSSES_DETAIL_NAMES_MEMBER(name)                                                    \
  template <class C, class = void>                                                          \
  struct names_##name : std::false_type {};                                                 \
  template <class C>                                                                        \
  struct names_##name<C, std::void_t<decltype(&C::name)>> : std::true_type {};
ULYSSES_DETAIL_NAMES_MEMBER(allgather)
ULYSSES_DETAIL_NAMES_MEMBER(exchange_messages)
ULYSSES_DETAIL_NAMES_MEMBER(with_peers)
ULYSSES_DETAIL_NAMES_MEMBER(exchange_state)
ULYSSES_DETAIL_NAMES_MEMBER(prepare_direct)
#undef ULYSSES_DETAIL_NAMES_MEMBER

}  // namespace detail

/// What a communicator type can do, as the library reads it. Computed from its members (see the
/// file comment); specialise it for your type to declare capabilities explicitly (for example to
/// turn one off: `exchange_messages = false` keeps a member of that name unused). Every field
/// that is true must be backed by a member with the concept's signature.
template <class Comm>
struct comm_traits {
  static constexpr bool allgather = detail::has_allgather<Comm>::value;                  ///< allgather() of host memory
  static constexpr bool exchange_messages = detail::has_exchange_messages<Comm>::value;  ///< Path::messages, two_level
  static constexpr bool with_peers = detail::has_with_peers<Comm>::value;                ///< Path::direct (with allgather)
  /// start_messages() / finish_messages(): exchange_messages() in two halves, posted then completed
  /// (MpiComm), so that the ring's RingProgress::in_start posts a step in start() and waits in finish()
  static constexpr bool split_messages = detail::has_split_messages<Comm>::value;
  static constexpr bool exchange_state = detail::has_exchange_state<Comm>::value;        ///< ExchangeState& exchange_state()
  static constexpr bool device_memory = detail::device_memory<Comm>::value;              ///< buffers in device memory
  static constexpr bool stream = detail::has_stream<Comm>::value;                        ///< stream() for the stream check
  static constexpr bool abort = detail::has_abort<Comm>::value;                          ///< abort(why): break the group at once
  /// with_peers() among ranks of one address space: the peer copy may write the peers' outputs
  static constexpr bool one_address_space = detail::one_address_space<Comm>::value;
  /// with_peers() hands work() the peers' outputs where this rank can store to them
  /// (one_address_space, or a communicator that declares peer_outputs: MpiWindowComm)
  static constexpr bool peer_outputs = one_address_space || detail::peer_outputs<Comm>::value;
  /// exchange_messages() may run on a worker thread while the caller computes (it blocks its
  /// thread until the peers' data is in: host threads): RingProgress::automatic overlaps the ring's
  /// exchanges on a worker for such a communicator (LocalGroup::Comm declares it)
  static constexpr bool progress_thread = detail::progress_thread<Comm>::value;
};

/// What an executor type can do, as the library reads it (see the file comment); specialise it
/// for your type to declare capabilities explicitly.
template <class Exec>
struct executor_traits {
  static constexpr bool runs_on_host = detail::runs_on_host<Exec>::value;        ///< host loads and stores, done on return
  static constexpr bool row_transforms = detail::row_transforms<Exec>::value;    ///< applies BufferTable::transforms (layout/transform.hpp)
  static constexpr bool device_memory = detail::device_memory<Exec>::value;      ///< stream-ordered device work
  static constexpr bool prepare_direct = detail::has_prepare_direct<Exec>::value;  ///< uploads the peer copy's lists
  static constexpr bool stream = detail::has_stream<Exec>::value;                ///< stream() for the stream check
};

/// Compile-time check of a communicator type: what it must have, and every optional member it
/// NAMES with a signature that does not fit (a typo would otherwise silently select a slower
/// path). The transports call it; true when the type passes (else a static_assert fails naming
/// the member and the signature the concept expects).
template <class Comm>
constexpr bool check_communicator() {
  static_assert(detail::has_size_rank<Comm>::value,
                "ulysses communicator concept: the type needs `int size() const` and `int rank() const` (comm/concepts.hpp)");
  static_assert(detail::has_alltoallv<Comm>::value,
                "ulysses communicator concept: the type needs `void alltoallv(const std::byte* send, const std::size_t* send_bytes, "
                "const std::size_t* send_offsets, std::byte* recv, const std::size_t* recv_bytes, const std::size_t* recv_offsets)` "
                "(comm/concepts.hpp)");
  static_assert(!detail::names_exchange_messages<Comm>::value || detail::has_exchange_messages<Comm>::value,
                "ulysses communicator concept: the type has a member named exchange_messages whose signature is not "
                "`void exchange_messages(const Message* send, std::size_t n_send, const Message* recv, std::size_t n_recv)`: "
                "fix it, or rename it if it is not the capability (comm/concepts.hpp)");
  static_assert(!detail::names_allgather<Comm>::value || detail::has_allgather<Comm>::value,
                "ulysses communicator concept: the type has a member named allgather whose signature is not "
                "`void allgather(const void* send, std::size_t bytes, void* recv)` (comm/concepts.hpp)");
  static_assert(!detail::names_with_peers<Comm>::value || detail::has_with_peers<Comm>::value,
                "ulysses communicator concept: the type has a member named with_peers whose signature is not "
                "`void with_peers(const void* mine, void (*work)(void* ctx, const void* const* all), void* ctx)` (comm/concepts.hpp)");
  static_assert(!detail::names_exchange_state<Comm>::value || detail::has_exchange_state<Comm>::value,
                "ulysses communicator concept: the type has a member named exchange_state that does not return "
                "`ulysses::ExchangeState&` (comm/concepts.hpp)");
  static_assert(!comm_traits<Comm>::exchange_messages || detail::has_exchange_messages<Comm>::value,
                "ulysses: comm_traits<C>::exchange_messages is true but C has no exchange_messages() of the concept's signature");
  static_assert(!comm_traits<Comm>::allgather || detail::has_allgather<Comm>::value,
                "ulysses: comm_traits<C>::allgather is true but C has no allgather() of the concept's signature");
  static_assert(!comm_traits<Comm>::with_peers || detail::has_with_peers<Comm>::value,
                "ulysses: comm_traits<C>::with_peers is true but C has no with_peers() of the concept's signature");
  return true;
}

/// Compile-time check of an executor type, as check_communicator().
template <class Exec>
constexpr bool check_executor() {
  static_assert(detail::has_run<Exec>::value,
                "ulysses executor concept: the type needs `void run(const BlockCopy* blocks, std::size_t n, const BufferTable& t)` "
                "(comm/concepts.hpp)");
  static_assert(!detail::names_prepare_direct<Exec>::value || detail::has_prepare_direct<Exec>::value,
                "ulysses executor concept: the type has a member named prepare_direct whose signature is not "
                "`void prepare_direct(BlockList seq_to_head, BlockList head_to_seq, int degree) const` (comm/concepts.hpp)");
  return true;
}

ULYSSES_NAMESPACE_END
