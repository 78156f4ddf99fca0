// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief PeerRecord: what the peer copy (transport/peer_copy.hpp) publishes through
///        with_peers() — every rank's inputs, outputs and layouts hash — and what work() gets of
///        each peer. The cross-memory part (process ids, remote addresses) is the mechanism's
///        own record (CrossMemoryRecord, comm/cross_memory.hpp), linked, not held here.
///        Contract: docs/extending.md; the window's use of it: docs/guide.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../layout/blocks.hpp"

ULYSSES_NAMESPACE_BEGIN

struct CrossMemoryRecord;  // comm/cross_memory.hpp

/// What the peer copy publishes through with_peers(): `mine` points to one, and work() gets
/// all[p] pointing to rank p's. Input t of this call starts at data[t] and spans bytes[t] bytes
/// (Plan::input_bytes(): from the layout's first element past its last); entries from `count` on
/// (at most kMaxTensors) are null and 0. The sizes let a communicator across processes check that
/// an input lies in registered memory, or stage it there.
struct PeerRecord {
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
  /// Set by the publisher where known (PeerCopyLists::peer_read_bytes): the bytes of input t its
  /// peers' works read, each read counted (0: unknown), e.g. for a communicator's count of the
  /// bytes read in place (MpiWindowComm::remote_bytes(): a view's gaps, such as the other tensors
  /// of a fused q/k/v buffer, are not read).
  std::uint64_t read_bytes[kMaxTensors] = {};
  /// Set by the publisher: no peer's work reads input t, only this rank's own (e.g. every peer
  /// that would read it has no tokens, C17). A communicator across processes need neither stage
  /// nor publish it (the peers get a null data[t]).
  bool unread[kMaxTensors] = {};
  /// The cross-memory part (comm/cross_memory.hpp), null where none: set by a publisher whose
  /// work() also reads inputs this process cannot load (the peer copy on a host executor), and in
  /// what work() gets, each peer's process id and remote addresses (MpiWindowComm). A
  /// communicator of one address space passes it on unchanged.
  const CrossMemoryRecord* cross_memory = nullptr;
};


ULYSSES_NAMESPACE_END
