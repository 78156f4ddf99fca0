// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The communicator and executor concepts, stated once: what a type must provide, the
///        optional capabilities that open the faster transports, the traits the library reads
///        (comm_traits, executor_traits; a user type may specialise them), and the compile-time
///        checks that name a member whose signature is wrong instead of silently not using it.
///
/// **Communicator** — a type C must provide:
/// - `int size() const`, `int rank() const`: the group's degree and this member's rank;
/// - `void alltoallv(const std::byte* send, const std::size_t* send_bytes, const std::size_t*
///   send_offsets, std::byte* recv, const std::size_t* recv_bytes, const std::size_t* recv_offsets)`:
///   collective; arrays of size() entries indexed by peer, in bytes; the chunk for peer p is
///   `[send + send_offsets[p], + send_bytes[p])`, what p sends lands at `recv + recv_offsets[p]`;
///   zero-byte pairs occur (the own chunk is always 0 in plans) and must not hang; errors are
///   thrown as ulysses::Error(backend). Data in place on return, or in stream order.
///
/// and may provide (each opens what it says; a member of that NAME whose signature does not fit
/// is a compile error naming it, check_communicator()):
/// - `void allgather(const void* send, std::size_t bytes, void* recv)` of HOST memory (rank p's
///   bytes at recv + p * bytes): the cross-rank plan check (without it: alltoallv on host buffers,
///   unless the type declares `static constexpr bool device_memory = true`), and the peer copy;
/// - `void exchange_messages(const Message* send, std::size_t n_send, const Message* recv,
///   std::size_t n_recv)` (Message* works too): collective; sends each message of `send` to its
///   peer, receives each of `recv` from its peer; the k-th message rank i sends rank j is the k-th
///   j receives from i (same bytes); never to the rank itself; every rank calls it, even with empty
///   lists → Path::messages and Path::two_level;
/// - `void with_peers(const void* mine, void (*work)(void* ctx, const void* const* all), void* ctx)`:
///   collective over ranks that share one address space (threads of one process): publishes `mine`,
///   waits for every rank, calls work(ctx, all) with all[p] = rank p's `mine`, and returns only after
///   every rank's work has returned (no rank may then touch a peer's memory) → Path::direct, the
///   peer copy (with allgather(), which exchanges the ranks' layouts once per plan). For device
///   memory (DeviceLocalGroup::Comm) the same in stream order. The peer copy's `mine` points to a
///   PeerInputs (below): a communicator of one address space passes the pointer on; one across
///   processes (MpiWindowComm, comm/mpi_window.hpp) publishes the ranges and hands `work` each
///   peer's PeerInputs translated into its own mapping;
/// - `ExchangeState& exchange_state()`: where the transports keep what they learn about a plan on
///   this communicator (the passed agreement check, the peer copy's lists) and their scratch
///   (comm/exchange_state.hpp). Without it the check runs at every call, and the message lists
///   and peer copy lists are allocated per call;
/// - `static constexpr bool device_memory = true`: its buffers are device memory (NcclComm,
///   DeviceLocalGroup::Comm); otherwise host memory;
/// - `static constexpr bool one_address_space = true`: its with_peers() passes every rank's `mine`
///   on unchanged to ranks of one address space (LocalGroup::Comm), so a rank may also write its
///   peers' published outputs (PeerInputs::outputs): seq→head then pushes (each rank reads its
///   own rows whole and writes its peers' heads), which reads memory in order;
/// - `static constexpr bool peer_outputs = true`: its with_peers() hands work() the peers'
///   published outputs that every rank can store to (PeerInputs::outputs; null where it cannot):
///   MpiWindowComm does for outputs allocated from its window, so seq→head pushes across
///   processes when every rank's outputs are there (implied by one_address_space);
/// - `static constexpr bool progress_thread = true`: its exchange_messages() may run on a worker
///   thread while the caller computes (RingProgress::automatic then overlaps the ring's exchanges
///   on one: LocalGroup::Comm);
/// - `stream()`: the stream its exchanges are ordered on (checked against a stream-ordered executor's);
/// - `void abort(const std::string& why)`: breaks the group at once, so that every peer's current
///   and later calls throw Error(aborted) with `why` (LocalGroup::Comm). A call that refuses its
///   arguments before its collectives (bind_buffers()' errors) aborts the group with it, so the
///   peers that entered do not wait out their timeout.
///
/// Shipped: LocalGroup::Comm (all but device_memory and stream), MpiWindowComm (allgather,
/// exchange_messages, with_peers across the processes of one node, exchange_state), MpiComm (allgather,
/// exchange_messages, exchange_state), NcclComm (allgather, exchange_messages, exchange_state,
/// device_memory, stream), DeviceLocalGroup::Comm (all), torch's ProcessGroupComm.
///
/// **Executor** — a type E must provide `void run(const BlockCopy* blocks, std::size_t n, const
/// BufferTable& t)` (layout/blocks.hpp: run the n block copies over the buffers of t) and may
/// declare `static constexpr bool runs_on_host = true` (host loads and stores, done on return:
/// HostExecutor) or `static constexpr bool device_memory = true` (stream-ordered device work:
/// CudaExecutor), `stream()`, and `void prepare_direct(BlockList seq_to_head, BlockList
/// head_to_seq, int degree) const` (a device executor uploads the peer copy's lists once). The
/// message paths and the peer copy need the executor's memory to be the communicator's.
///
/// Source of the pattern: c10d's Backend (every optional feature a query that defaults to false,
/// a loud failure otherwise) and NCCL's ncclCommQueryProperties (capabilities as data).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "../layout/blocks.hpp"
#include "exchange_state.hpp"

ULYSSES_NAMESPACE_BEGIN

/// What the peer copy (transport/peer_copy.hpp) publishes through with_peers(): `mine` points to
/// one, and work() gets all[p] pointing to rank p's. Input t of this call starts at data[t] and
/// spans bytes[t] bytes (Plan::input_bytes(): from the layout's first element past its last);
/// entries from `count` on (at most kMaxTensors) are null and 0. The sizes let a communicator
/// across processes check that an input lies in registered memory, or stage it there.
struct PeerInputs {
  std::byte* data[kMaxTensors] = {};     ///< base of input t (null when empty)
  std::size_t bytes[kMaxTensors] = {};   ///< bytes input t spans from data[t]
  int count = 0;                         ///< the plan's number of tensors
  /// Hash of the layouts and wire the publishing rank's peer-copy lists were built from (every
  /// rank checks its peers' against its own lists: a plan meeting another peer plan is refused);
  /// a communicator across processes passes it on unchanged.
  std::uint64_t layouts = 0;
  /// The layouts hash this rank's peer-copy lists expect of each rank (PeerCopyLists::layouts,
  /// P entries; null when the lists carry none): what a communicator that cannot see its peers'
  /// records on the host (MpiDeviceWindowComm: they live in device memory) hands work() as each
  /// peer's `layouts`, and compares on the device with what the peer published.
  const std::uint64_t* peer_layouts = nullptr;
  /// Base of output t (null when empty or not published): published only to a communicator
  /// whose with_peers() hands the peers' outputs on (comm_traits::peer_outputs), whose peers then
  /// write it (the pushed seq→head). In what work() gets: where this process stores to rank p's
  /// output t, or null where it cannot (MpiWindowComm: an output outside the window).
  std::byte* outputs[kMaxTensors] = {};
  /// Bytes output t spans from outputs[t] (Plan::output_bytes()), published with outputs: a
  /// communicator across processes checks that the output lies in memory the peers can store to.
  std::size_t output_bytes[kMaxTensors] = {};
  /// Set by the publisher: its work() also reads inputs that this process cannot load, published
  /// by their owner's process id and address (`pid`, `remote`) — the peer copy does, with Cross
  /// Memory Attach (comm/cross_memory.hpp). A communicator across processes may then publish its
  /// inputs outside registered memory that way instead of staging them (MpiWindowComm).
  bool reads_remote = false;
  /// Set by the publisher with reads_remote: the mean contiguous bytes per range its peers read
  /// of input t (from the peers' lists where known, PeerCopyLists::peer_range_bytes, else
  /// estimated from this rank's own reads of its peers' inputs, which mirror theirs; 0: unknown).
  /// Cross Memory Attach costs about a microsecond a range on top of the bytes, so a
  /// communicator may stage an input whose ranges are short rather than publish it.
  std::uint64_t range_bytes[kMaxTensors] = {};
  /// Set by the publisher where known (PeerCopyLists::peer_read_bytes): the bytes of input t its
  /// peers' works read, each read counted (0: unknown), e.g. for a communicator's count of the
  /// bytes read in place (MpiWindowComm::remote_bytes(): a view's gaps, such as the other tensors
  /// of a fused q/k/v buffer, are not read).
  std::uint64_t read_bytes[kMaxTensors] = {};
  /// Set by the publisher: no peer's work reads input t, only this rank's own (e.g. every peer
  /// that would read it has no tokens, C17). A communicator across processes need neither stage
  /// nor publish it (the peers get a null data[t]).
  bool unread[kMaxTensors] = {};
  /// In what work() gets: 0 when every input is loadable at data[t]; else the owner's process id,
  /// and each input t with data[t] null and bytes[t] > 0 lies at address remote[t] of that process.
  std::int64_t pid = 0;
  std::uint64_t remote[kMaxTensors] = {};  ///< see pid
  /// Set by the publisher with reads_remote: the addresses, in its own process, of the block list
  /// its work() runs (`list_blocks` BlockCopy) and of its BufferTable, so that the owner of an
  /// input read remotely can push the blocks whose destination is the more contiguous side
  /// (transport/peer_copy.hpp); passed on unchanged by a communicator across processes.
  std::uint64_t list = 0;
  std::uint64_t list_blocks = 0;  ///< see list
  std::uint64_t table = 0;        ///< see list
};

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
