// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The lists of one stage of one direction, for one rank (StageLists): the wire chunks and
///        the pack/unpack lists every transport starts from, and the parts that only one
///        transport reads (MessageStage: Path::messages; TwoLevelStage: Path::two_level).
///
/// The planner (plan/detail/build.hpp) computes them all once per plan, since they are wire
/// layout and depend only on the plan's inputs; each transport under transport/ says which of
/// them it runs. What a transport learns from its peers at run time (the peer copy's lists)
/// lives with the communicator instead (comm/exchange_state.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../layout/blocks.hpp"
#include "../topology/route.hpp"

ULYSSES_NAMESPACE_BEGIN

/// One message of the message-level exchange (Path::messages): the bytes of one tensor, of one
/// batch index and one sequence chunk of the seq-sharded side, in the chunk between this rank and
/// `peer`, in wire order. Both ranks of a pair list the same pieces (in tensor, then batch, then
/// chunk order; empty ones left out), so the k-th piece one sends to the other is the k-th piece
/// the other receives from it.
struct Piece {
  int peer = 0;             ///< the other rank
  int tensor = 0;           ///< index of the tensor in the plan
  std::size_t bytes = 0;    ///< > 0
  std::int32_t buffer = 0;  ///< where the bytes lie: BufferIndex::input(t) (sending) or BufferIndex::output(t)
                            ///< (receiving) when in place, else BufferIndex::send / BufferIndex::recv
  std::int64_t offset = 0;  ///< bytes from that buffer's base (the piece is `bytes` contiguous bytes there)
  std::size_t wire_offset = 0;  ///< where the piece lies in the send (resp. receive) region, bytes
  std::uint32_t first = 0;      ///< its blocks: [first, last) of StageLists::pack (sending) or of
  std::uint32_t last = 0;       ///< StageLists::unpack (receiving; a summed head's terms are not among them)
  /// True when the piece lies in the user's tensor: it is sent from the input or received into
  /// the output as it is, with no pack or unpack copy.
  bool in_place() const { return buffer != BufferIndex::send && buffer != BufferIndex::recv; }
};

/// What every transport starts from: the wire chunks of one stage (byte counts and offsets
/// indexed by peer rank, relative to the send resp. receive region of the workspace; stage k's
/// chunks follow stage k-1's) and the pack and unpack lists. The chunk with this rank itself is
/// always empty: its data goes straight from input to output through blocks of `unpack` (which
/// thus reads the inputs too).
struct WireStage {
  std::vector<std::size_t> send_bytes;    ///< bytes this rank sends to each peer
  std::vector<std::size_t> send_offsets;  ///< offset of each peer's chunk in the send region
  std::vector<std::size_t> recv_bytes;    ///< bytes this rank receives from each peer
  std::vector<std::size_t> recv_offsets;  ///< offset of each peer's chunk in the receive region
  std::size_t send_total = 0;             ///< bytes this stage sends (its chunks start at send_offsets[0])
  std::size_t recv_total = 0;             ///< bytes this stage receives
  /// Of send_total: bytes of heads this rank holds without owning them, sent in head→seq only for
  /// tensors that sum their replicas (Replicas::sum): the extra bytes of the summed inverse.
  std::size_t replica_bytes = 0;
  std::vector<BlockCopy> pack;  ///< inputs → send region, piece by piece (Piece::first/last)
  /// Receive region → outputs piece by piece, then this rank's own chunk (inputs → outputs), then
  /// the sums of replicated heads (head→seq with Replicas::sum: terms from the receive region and
  /// from this rank's input, in ascending rank order).
  std::vector<BlockCopy> unpack;
  /// Bytes this stage occupies in the send (resp. receive) region: send_total (recv_total), or on
  /// a two-level plan also the areas where this rank gathers and receives other ranks' chunks.
  std::size_t send_span = 0, recv_span = 0;
};

/// The message path's part of a stage (transport/messages.hpp): each list in peer order, then
/// tensor order, batch index and sequence chunk.
struct MessageStage {
  std::vector<Piece> send_pieces;        ///< what this rank sends, one piece per (peer, tensor, b, chunk) with bytes
  std::vector<Piece> recv_pieces;        ///< what this rank receives, likewise
  std::vector<BlockCopy> pack_staged;    ///< the pack blocks of the send pieces that are not in place
  std::vector<BlockCopy> unpack_staged;  ///< the unpack blocks of the receive pieces that are not in place, then the own chunk's and the sums
};

/// The two-level exchange's part of a stage (transport/two_level.hpp; Plan::two_level()): what
/// this rank sends and receives in each of the three rounds (intra-node gather, inter-node,
/// intra-node delivery); each list in the order both ends of a pair list their transfers. Chunks
/// of this rank travel from send_offsets and land at recv_offsets as on the other paths, but
/// those offsets may lie in the gathered / received areas.
struct TwoLevelStage {
  std::array<std::vector<Hop>, 3> hop_send, hop_recv;  ///< [round]
};

/// The lists of one stage of one direction, for this rank: the wire part every transport uses
/// and the parts of the message and two-level transports (Plan::stage_lists()).
struct StageLists : WireStage, MessageStage, TwoLevelStage {};

/// One rank's local layouts (extents and strides of the seq-sharded and head-sharded layout of
/// every tensor), as the ranks exchange them once per plan for the peer copy (Path::direct): a
/// rank that reads a peer's input must know how the peer holds it.
struct LayoutRecord {
  std::int64_t v[kMaxTensors][2][8] = {};  ///< [tensor][0: seq-sharded, 1: head-sharded][extents 0..3, strides 4..7]
};

/// Copies per element of one direction on one rank: bytes the executor copies (packs, unpacks,
/// sums and peer copies; a sum counts once per element it writes) and bytes the transport
/// delivers, both over the bytes of the rank's outputs. DeepSpeed-Ulysses' op sequence counts
/// executor 1 at B = 1 (the permute before its all-to-all) and 2 at B > 1, transport 1.
struct CopyCount {
  double executor = 0;   ///< executor bytes / output bytes
  double transport = 0;  ///< bytes received from other ranks / output bytes
};

ULYSSES_NAMESPACE_END
