// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What the transports share: the memory rule (the executor's memory must be the
///        communicator's for the message paths and the peer copy), message posting over a
///        plan's lists or a chunk wire (ChunkWire) with the communicator's scratch, the
///        flat-plan check and copy counting. docs/design.md, "Transports".
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "../comm/concepts.hpp"
#include "../error.hpp"
#include "../layout/blocks.hpp"
#include "../plan/plan.hpp"

ULYSSES_NAMESPACE_BEGIN

/// A flat wire of one chunk per peer: what the decode exchange hands a transport
/// (`exchange_chunks()`), its partials' and its all-gather's. Arrays of `peers` entries, bytes;
/// the chunk to peer p is [send + send_offsets[p], + send_bytes[p]), the one from p lands at
/// recv + recv_offsets[p] (recv_bytes[p] bytes); the own entries are 0.
struct ChunkWire {
  std::byte* send = nullptr;                 ///< the send region (read only; Message holds a mutable pointer)
  const std::size_t* send_bytes = nullptr;   ///< [p]: bytes of the chunk to peer p
  const std::size_t* send_offsets = nullptr; ///< [p]: its offset from `send`
  std::byte* recv = nullptr;                 ///< the receive region
  const std::size_t* recv_bytes = nullptr;   ///< [p]: bytes of the chunk from peer p
  const std::size_t* recv_offsets = nullptr; ///< [p]: its offset from `recv`
  int peers = 0;                             ///< P, the entries of each array
};

namespace detail {

/// The executor's memory is the communicator's (both host, or both device).
template <class Comm, class Exec>
inline constexpr bool same_memory_v =
    comm_traits<Comm>::device_memory ? executor_traits<Exec>::device_memory : executor_traits<Exec>::runs_on_host;

/// An executor stand-in with the memory of communicator type Comm: supported<Comm,
/// AnyMemoryOf<Comm>> asks only what the communicator can do.
template <class Comm>
struct AnyMemoryOf {
  static constexpr bool runs_on_host = !comm_traits<Comm>::device_memory;
  static constexpr bool device_memory = comm_traits<Comm>::device_memory;
  void run(const BlockCopy*, std::size_t, const BufferTable&) {}
};

/// What a transport that moves a decode wire's chunks (alltoallv, messages) declares for the
/// decode exchange: it serves it wherever the transport is supported, and reads nothing in place.
/// Base of the transport `T` (CRTP); its exchange_chunks() moves the chunks.
template <class T>
struct MovesChunks {
  /// Whether it serves the decode exchange (decode/exchange.hpp) with these types: as supported.
  template <class Comm, class Exec>
  static constexpr bool serves_decode = T::template supported<Comm, Exec>;
  static constexpr bool reads_in_place = false;  ///< it moves the chunks
};

/// One exchange_messages() call of the lists `fill(send, recv)` writes, in the communicator's
/// scratch (ExchangeState::send_messages(), recv_messages(): no allocation once they have grown),
/// or in two vectors of this call for a communicator without ExchangeState.
template <class Comm, class Fill>
void post_filled(Comm& comm, Fill&& fill) {
  auto post = [&](std::vector<Message>& s, std::vector<Message>& r) {
    s.clear();
    r.clear();
    fill(s, r);
    comm.exchange_messages(s.data(), s.size(), r.data(), r.size());
  };
  if constexpr (comm_traits<Comm>::exchange_state) {
    ExchangeState& st = comm.exchange_state();
    post(st.send_messages(), st.recv_messages());
  } else {
    std::vector<Message> s, r;
    post(s, r);
  }
}

/// One exchange_messages() call over a plan's lists (Piece or Hop: peer, buffer, offset, bytes)
/// over the buffer table `t`, as post_filled().
template <class Comm, class Item>
void post_messages(Comm& comm, const BufferTable& t, const std::vector<Item>& send, const std::vector<Item>& recv) {
  post_filled(comm, [&](std::vector<Message>& s, std::vector<Message>& r) {
    for (const Item& i : send) s.push_back({i.peer, t.base[i.buffer] + i.offset, i.bytes});
    for (const Item& i : recv) r.push_back({i.peer, t.base[i.buffer] + i.offset, i.bytes});
  });
}

/// One exchange_messages() call of a chunk wire: one message per peer with a non-empty chunk, in
/// each direction, as post_filled().
template <class Comm>
void post_chunks(Comm& comm, const ChunkWire& w) {
  post_filled(comm, [&](std::vector<Message>& s, std::vector<Message>& r) {
    for (int p = 0; p < w.peers; ++p) {
      const auto i = static_cast<std::size_t>(p);
      if (w.send_bytes[i]) s.push_back(Message{p, w.send + w.send_offsets[i], w.send_bytes[i]});
      if (w.recv_bytes[i]) r.push_back(Message{p, w.recv + w.recv_offsets[i], w.recv_bytes[i]});
    }
  });
}

/// Throws Error(comm_mismatch) with `why` when two streams differ (stream-ordered work that
/// would not be ordered).
template <class S>
void check_same_stream(const S& a, const S& b, const char* why) {
  if (!(a == b)) fail(Errc::comm_mismatch, why);
}

/// Throws Error(comm_mismatch) when both the communicator and the executor are stream-ordered and
/// on different streams (pack → exchange → unpack would not be ordered).
template <class Comm, class Exec>
void check_streams(const Comm& comm, const Exec& exec) {
  if constexpr (comm_traits<Comm>::stream && executor_traits<Exec>::stream)
    check_same_stream(comm.stream(), exec.stream(),
                      "the executor runs on another stream than the communicator exchanges on, so pack, exchange "
                      "and unpack would not be ordered: make both on the same stream");
}

/// Throws Error(path_unsupported) when a flat exchange is asked of a plan laid out for the
/// two-level exchange (its chunks partly lie in gathered / received areas).
inline void require_flat(const Plan& plan, const char* what) {
  if (plan.two_level())
    fail(Errc::path_unsupported, std::string(what) + ": the plan lays out the two-level exchange (PlanOptions::nodes " +
                                     plan.nodes().str() + "); run it with exchange_two_level() (Path::two_level), or plan with "
                                     "PlanOptions::path = Path::alltoallv or messages for a flat exchange");
}

/// Bytes a list writes (a sum counts once per element it writes).
inline double written_bytes(const std::vector<BlockCopy>& l) {
  double n = 0;
  for (const BlockCopy& c : l) n += static_cast<double>(c.written_bytes());
  return n;
}
/// Contiguous rows a list copies (every term of a sum counted).
inline double rows(const std::vector<BlockCopy>& l) {
  double n = 0;
  for (const BlockCopy& c : l) n += static_cast<double>(c.rows());
  return n;
}

/// The bytes each stage's transport delivers to this rank: what every flat exchange receives.
inline double received_bytes(const StageLists& s) { return static_cast<double>(s.recv_total); }

/// Copies per element of direction d when the executor runs the lists `pack` and `unpack` of
/// every stage (members of StageLists) and the transport delivers `wire(stage)` bytes, over the
/// bytes of this rank's outputs.
template <class PackList, class UnpackList, class Wire = double (*)(const StageLists&)>
CopyCount count_copies(const Plan& plan, Direction d, PackList pack, UnpackList unpack, Wire wire = received_bytes) {
  double out = 0, exec = 0, delivered = 0;
  for (int k = 0; k < plan.num_stages(); ++k) {
    const StageLists& sc = plan.stage_lists(d, k);
    out += written_bytes(sc.unpack);
    exec += written_bytes(sc.*pack) + written_bytes(sc.*unpack);
    delivered += wire(sc);
  }
  if (out == 0) return {};
  return {exec / out, delivered / out};
}

}  // namespace detail

/// What one exchange moves, as the cost model (tune/cost.hpp) sees it; each transport counts its
/// own (`traffic()`), exchange_traffic() sums the stages: per link class, the messages and bytes of each
/// round's busiest rank, summed over rounds (and stages); and the bytes the executor writes on
/// the plan's rank.
struct ExchangeTraffic {
  std::array<double, 2> messages{};  ///< [link class]: 0 inside a node, 1 between nodes (PlanOptions::nodes)
  std::array<double, 2> bytes{};     ///< [link class]
  double copy_bytes = 0;             ///< executor bytes written (pack, unpack, sums, direct copies)
  double copy_rows = 0;              ///< contiguous rows the executor copies (every term of a sum counted)
  int rounds = 0;                    ///< communication rounds (1 flat, 3 two-level; per stage)
  /// [link class]: the exchange's sequential message steps whose slowest message crosses a link of
  /// that class (each step pays that link's latency once: the messages of one step are in flight
  /// together, so their latencies overlap): 1 per round of concurrent messages, P - 1 for a
  /// pairwise all-to-all-v (one peer a step)
  std::array<double, 2> latency_steps{};
  /// The busiest rank's bytes of each link class in every round whose intra- and inter-node
  /// messages are in flight at once (distinct links: only the slower class takes time), and [2]
  /// that round's busiest node's inter-node bytes (as inter_rounds); a round of one class, or of
  /// sequential steps, is not listed
  std::vector<std::array<double, 3>> overlapped;
  /// Every round with inter-node bytes: {the busiest rank's inter-node bytes (its share of
  /// bytes[1]), the busiest node's: the sum over the node's ranks of what they send across nodes,
  /// or receive, whichever is more}: what one NIC carries when the node's ranks share it
  /// (CostModel::ranks_per_nic)
  std::vector<std::array<double, 2>> inter_rounds;
  double node_ranks = 1;             ///< the most ranks one node holds (PlanOptions::nodes)
  double working_set_bytes = 0;      ///< the rank's inputs, outputs and workspace (none on Path::direct)
  double workspace_bytes = 0;        ///< the workspace this exchange needs on its busiest rank (two-level: a forwarder's)
};

namespace detail {

/// Busiest rank of a round: the one with the most bytes (sent or received), then messages.
struct RankLoad {
  std::array<double, 2> msgs{}, bytes{};
  double total() const { return bytes[0] + bytes[1]; }
};
/// Adds the busiest rank's load of one round (sent or received, whichever is more) to t, and
/// with inter-node bytes the busiest node's of `nodes` (ExchangeTraffic::inter_rounds). A
/// `concurrent` round (every message in flight at once) also pays one latency of the slowest link
/// class any of its messages crosses (ExchangeTraffic::latency_steps) and lists its busiest rank's
/// bytes of both classes as overlapped (ExchangeTraffic::overlapped); a round of sequential steps
/// (concurrent false) counts its steps itself.
inline void add_busiest(ExchangeTraffic& t, const std::vector<RankLoad>& send, const std::vector<RankLoad>& recv, const NodeLayout& nodes,
                        bool concurrent = true) {
  RankLoad best;
  double best_total = -1, best_msgs = -1;
  for (std::size_t r = 0; r < send.size(); ++r) {
    const RankLoad& a = send[r].total() >= recv[r].total() ? send[r] : recv[r];
    const double m = a.msgs[0] + a.msgs[1];
    if (a.total() > best_total || (a.total() == best_total && m > best_msgs)) {
      best = a;
      best_total = a.total();
      best_msgs = m;
    }
  }
  for (int c = 0; c < 2; ++c) {
    t.messages[static_cast<std::size_t>(c)] += best.msgs[static_cast<std::size_t>(c)];
    t.bytes[static_cast<std::size_t>(c)] += best.bytes[static_cast<std::size_t>(c)];
  }
  ++t.rounds;
  double node_inter = 0;  // the busiest node's inter-node bytes, sent or received
  {
    std::vector<double> out(static_cast<std::size_t>(nodes.num_nodes()), 0), in(out.size(), 0);
    for (std::size_t r = 0; r < send.size(); ++r) {
      const auto n = static_cast<std::size_t>(nodes.node(static_cast<int>(r)));
      out[n] += send[r].bytes[1];
      in[n] += recv[r].bytes[1];
    }
    for (std::size_t n = 0; n < out.size(); ++n) node_inter = std::max({node_inter, out[n], in[n]});
  }
  if (best.bytes[1] > 0 || node_inter > 0) t.inter_rounds.push_back({best.bytes[1], node_inter});
  if (!concurrent) return;
  bool any[2] = {false, false};
  for (const RankLoad& a : send)
    for (std::size_t c = 0; c < 2; ++c) any[c] = any[c] || a.msgs[c] > 0;
  if (any[1]) t.latency_steps[1] += 1;
  else if (any[0]) t.latency_steps[0] += 1;
  if (best.bytes[0] > 0 && best.bytes[1] > 0) t.overlapped.push_back({best.bytes[0], best.bytes[1], node_inter});
}

/// The send and receive regions a transport's stages occupy: per rank on a two-level plan
/// (the busiest forwarder's is the workspace), else this rank's at index 0.
struct TrafficSpans {
  explicit TrafficSpans(int P) : send(static_cast<std::size_t>(P), 0), recv(static_cast<std::size_t>(P), 0) {}
  std::vector<std::size_t> send, recv;
};
/// The workspace of regions of `send` and `recv` bytes (the receive region aligned as the plan's).
inline double workspace_of(std::size_t send, std::size_t recv) {
  const std::size_t a = Plan::kRegionAlignment;
  return static_cast<double>((send + a - 1) / a * a + recv);
}
/// Executor bytes and rows of the lists a transport runs before and after its exchange.
inline void add_copies(ExchangeTraffic& t, const std::vector<BlockCopy>& pack, const std::vector<BlockCopy>& unpack) {
  t.copy_bytes += written_bytes(pack) + written_bytes(unpack);
  t.copy_rows += rows(pack) + rows(unpack);
}
/// The traffic of one flat round: for every pair (i, j) with chunk bytes c[i * P + j] > 0,
/// msgs(i, j) messages of those bytes, on the link class of their nodes; the busiest rank counts
/// (`concurrent`: as add_busiest()).
template <class Msgs>
void add_flat_round(const Plan& plan, const std::vector<std::size_t>& c, ExchangeTraffic& t, Msgs msgs, bool concurrent = true) {
  const int P = plan.degree();
  const NodeLayout& nodes = plan.nodes();
  std::vector<RankLoad> send(at(P)), recv(at(P));
  for (int i = 0; i < P; ++i)
    for (int j = 0; j < P; ++j) {
      const double bytes = static_cast<double>(c[at(i) * at(P) + at(j)]);
      if (i == j || bytes == 0) continue;
      const double m = msgs(i, j);
      const std::size_t cl = nodes.node(i) == nodes.node(j) ? 0 : 1;
      send[at(i)].msgs[cl] += m;
      send[at(i)].bytes[cl] += bytes;
      recv[at(j)].msgs[cl] += m;
      recv[at(j)].bytes[cl] += bytes;
    }
  add_busiest(t, send, recv, nodes, concurrent);
}
}  // namespace detail

ULYSSES_NAMESPACE_END
