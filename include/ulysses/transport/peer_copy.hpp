// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Path::direct, the peer copy: ranks that can load and store each other's memory copy
///        their share of every peer's input straight into their own outputs, one copy per
///        element, with no workspace and no wire (FlashInfer's and TensorRT-LLM's IPC
///        all-to-alls do the same between GPUs); for the decode exchange, every rank merges its
///        heads reading its peers' partials in place. Needs, lists and copies:
///        PeerCopyTransport; docs/design.md, "Transports".
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../detail/hash.hpp"
#include "../comm/cross_memory.hpp"
#include "common.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// FNV-1a of a rank's layout record and its plan's fingerprint (the wire, equal on every rank
/// once the agreement check passed): PeerCopyLists::layouts.
inline std::uint64_t layout_hash(const LayoutRecord& r, std::uint64_t fingerprint) {
  std::uint64_t h = fnv1a(kFnvBasis, fingerprint);
  for (const auto& t : r.v)
    for (const auto& side : t)
      for (std::int64_t v : side) h = fnv1a(h, v);
  return h;
}

/// CrossMemoryRecord::range_bytes from this rank's list: per input t, the mean contiguous bytes of the
/// ranges of its reads of its peers' input t (rows merged where the source is contiguous, or for
/// a copy the destination where that is longer: such blocks the owner pushes); with `total`,
/// also the bytes read of each input t.
inline void remote_range_bytes(const std::vector<BlockCopy>& list, std::uint64_t* out, std::uint64_t* total = nullptr) {
  double bytes[kMaxTensors] = {}, ranges[kMaxTensors] = {};
  for (const BlockCopy& b : list) {
    const int i = b.src_buffer - BufferIndex::count;
    if (i < 0) continue;
    const std::int64_t src = contiguous_run(b, true), run = b.op == BlockOp::copy ? std::max(src, contiguous_run(b, false)) : src;  // pulled or pushed
    bytes[i % kMaxTensors] += static_cast<double>(b.bytes());
    ranges[i % kMaxTensors] += static_cast<double>(b.bytes()) / static_cast<double>(run);
  }
  for (int t = 0; t < kMaxTensors; ++t) out[t] = ranges[t] > 0 ? static_cast<std::uint64_t>(bytes[t] / ranges[t]) : 0;
  if (total)
    for (int t = 0; t < kMaxTensors; ++t) total[t] = static_cast<std::uint64_t>(bytes[t]);
}

/// Fills PeerCopyLists::peer_read_bytes and peer_range_bytes: what the peers' lists (built here
/// from every rank's record, the blocks each peer builds) read of this rank's inputs, per
/// direction. A rank whose peers have no tokens (or no heads) then knows that they read none of
/// its input, and a rank with no tokens of its own what its peers read of its head-sharded input,
/// where its own (empty) list says nothing (bug case C17).
inline void peer_reads(const Plan& plan, const LayoutRecord* all, PeerCopyLists& l) {
  const int me = plan.rank();
  std::vector<BlockCopy> reads[2];
  for (int q = 0; q < plan.degree(); ++q) {
    if (q == me) continue;
    for (int t = 0; t < plan.num_tensors(); ++t) {
      peer_copy_seq_to_head(plan, all, t, reads[0], q, me);
      peer_copy_head_to_seq(plan, all, t, reads[1], q, me);
    }
  }
  for (int d = 0; d < 2; ++d) remote_range_bytes(reads[d], l.peer_range_bytes[d], l.peer_read_bytes[d]);
  l.peer_reads = true;
}

/// Whether a communicator keeps the peer copy's Cross Memory Attach scratch
/// (`detail::RemoteReadScratch& cross_memory_scratch()`: MpiWindowComm); else each call makes one.
template <class C, class = void>
struct has_cross_memory_scratch : std::false_type {};
template <class C>
struct has_cross_memory_scratch<C, std::enable_if_t<std::is_same_v<decltype(std::declval<C&>().cross_memory_scratch()), RemoteReadScratch&>>>
    : std::true_type {};

/// Runs the peer copy's list with the peers' inputs: what with_peers() calls on each rank.
template <class Exec>
struct PeerCopyWork {
  const std::vector<BlockCopy>* list;  // the pulled list of the direction
  const std::vector<BlockCopy>* push_list;  // seq→head pushed (null: never), taken when every rank's outputs are storable
  const BufferTable* table;
  Exec* exec;
  int P;
  const std::vector<std::uint64_t>* layouts;  // what every rank's lists were built from (may be empty)
  std::vector<std::byte*>* peers;  // the communicator's scratch, 2 P * kMaxTensors + 1 entries (inputs, outputs, the bounce buffer)
  RemoteReadScratch* remote;       // the scratch for inputs read with Cross Memory Attach (the communicator's, or this call's)
  int rank;                        // this rank

  /// Whether every rank's non-empty outputs reached this rank storable (PeerRecord::outputs): the
  /// same verdict on every rank, which all see the same records.
  static bool outputs_storable(int P, const void* const* all) {
    for (int p = 0; p < P; ++p) {
      const PeerRecord& in = *static_cast<const PeerRecord*>(all[p]);
      for (int t = 0; t < in.count && t < kMaxTensors; ++t)
        if (in.output_bytes[t] && !in.outputs[t]) return false;
    }
    return true;
  }

  static void run(void* ctx, const void* const* all) {
    const auto& w = *static_cast<const PeerCopyWork*>(ctx);
    std::vector<std::byte*>& peers = *w.peers;
    const bool push = w.push_list && outputs_storable(w.P, all);
    const std::vector<BlockCopy>& list = push ? *w.push_list : *w.list;
    bool remote = false;  // a peer's input this process cannot load (published by pid and address)
    for (int p = 0; p < w.P; ++p) {
      const PeerRecord& in = *static_cast<const PeerRecord*>(all[p]);
      if (!w.layouts->empty() && in.layouts != (*w.layouts)[static_cast<std::size_t>(p)])
        fail(Errc::plan_mismatch, "rank " + std::to_string(p) +
                                      " runs a plan with other layouts or another wire than the one this rank's peer-copy lists were built "
                                      "from on this communicator: on a communicator, a plan must meet the same peer plans at every "
                                      "exchange (a peer's layouts are its own, but fixed for the pairing)");
      for (int t = 0; t < kMaxTensors; ++t) {
        peers[static_cast<std::size_t>(p * kMaxTensors + t)] = in.data[t];
        if (push) peers[static_cast<std::size_t>((w.P + p) * kMaxTensors + t)] = in.outputs[t];
        remote = remote || (in.cross_memory && in.cross_memory->remote[t]);  // a peer's input to read remotely, or this rank's to push
      }
    }
    BufferTable t = *w.table;
    t.peers = peers.data();
    if (push || !remote) {  // (the pushed list reads this rank's own inputs only)
      w.exec->run(list.data(), list.size(), t);
      return;
    }
    if constexpr (executor_traits<Exec>::runs_on_host) {
      run_remote(w, all, t);
    } else {
      fail(Errc::backend, "the peer copy got inputs of another process to read with Cross Memory Attach, and its executor runs on a device");
    }
  }

  /// The list with some inputs in other processes' private memory (Cross Memory Attach, one copy
  /// per element): a copy block is pulled straight into the outputs (process_vm_readv) where its
  /// source is the more contiguous side, else its owner pushes it (process_vm_writev, below: the
  /// kernel pays per remote range); a sum's remote terms are read into the bounce buffer (packed)
  /// and summed from there by the executor with the other blocks, whose sources it loads (this
  /// rank's inputs, the window's). Then this rank pushes, for every peer, the blocks of the peer's
  /// list that read this rank's remote inputs and that pushed_by_owner() gives to it (the peer's
  /// list and buffer table are read from its memory first). Every peer returns only once every
  /// rank's work is done (with_peers()), so its outputs are complete.
  static void run_remote(const PeerCopyWork& w, const void* const* all, const BufferTable& t) {
    RemoteReadScratch& s = *w.remote;
    s.reader.discard();  // (a failed earlier call may have left ranges pending: never replay them)
    auto remote_of = [&](const BlockCopy& b) -> const CrossMemoryRecord* {  // the source's owner when it is read remotely
      const int i = b.src_buffer - BufferIndex::count;
      if (i < 0) return nullptr;
      const auto* in = static_cast<const PeerRecord*>(all[i / kMaxTensors]);
      return in->cross_memory && in->cross_memory->pid && !in->data[i % kMaxTensors] ? in->cross_memory : nullptr;
    };
    auto padded = [](const BlockCopy& b) { return (static_cast<std::size_t>(b.bytes()) + 63) / 64 * 64; };  // each term 64-byte aligned
    // A transformed block (a call with row transforms) is read into the bounce buffer too, and
    // the executor transforms it from there; its owner then does not push it (push(): the same test).
    auto bounced = [&](const BlockCopy& b) { return b.op != BlockOp::copy || (b.row_tensor >= 0 && (t.transforms || b.wire)); };
    std::size_t bounce = 0;
    for (const BlockCopy& b : *w.list)
      if (bounced(b) && remote_of(b)) bounce += padded(b);
    if (s.bounce.size() < bounce) s.bounce.resize(bounce);
    (*w.peers)[static_cast<std::size_t>(BufferIndex::bounce(w.P) - BufferIndex::count)] = s.bounce.data();
    s.blocks.clear();
    std::size_t off = 0;
    int owner = -1;
    for (const BlockCopy& b : *w.list) {
      const CrossMemoryRecord* in = remote_of(b);
      if (!in) {
        s.blocks.push_back(b);
        continue;
      }
      const int i = b.src_buffer - BufferIndex::count;
      if (i / kMaxTensors != owner) s.reader.begin(in->pid, owner = i / kMaxTensors);
      const std::uint64_t src = in->remote[i % kMaxTensors];
      if (!bounced(b)) {
        if (!pushed_by_owner(b)) read_block(s.reader, b, src, buffer_at(t, b.dst_buffer), false);
        continue;
      }
      read_block(s.reader, b, src, s.bounce.data() + off, true);
      BlockCopy c = b;  // the term (or transformed copy), from its packed rows in the bounce buffer
      c.src_buffer = BufferIndex::bounce(w.P);
      c.src_offset = static_cast<std::int64_t>(off);
      c.src_stride[3] = b.row_bytes;
      for (int k = 2; k >= 0; --k) c.src_stride[k] = c.src_stride[k + 1] * b.extent[k + 1];
      s.blocks.push_back(c);
      off += padded(b);
    }
    s.reader.flush();  // every remote row is here before the executor sums the bounce buffer
    w.exec->run(s.blocks.data(), s.blocks.size(), t);
    push(w, all);
  }

  /// This rank's pushes into its peers' outputs (see run_remote()).
  static void push(const PeerCopyWork& w, const void* const* all) {
    RemoteReadScratch& s = *w.remote;
    s.reader.discard();  // (as in run_remote)
    const auto& mine = *static_cast<const PeerRecord*>(all[w.rank]);
    static const CrossMemoryRecord kNone{};
    const CrossMemoryRecord& own = mine.cross_memory ? *mine.cross_memory : kNone;
    bool any = false;
    for (int x = 0; x < kMaxTensors; ++x) any = any || own.remote[x];
    if (!any) return;
    for (int q = 0; q < w.P; ++q) {
      const auto* rec = static_cast<const PeerRecord*>(all[q])->cross_memory;
      if (q == w.rank || !rec || !rec->pid || !rec->list || !rec->list_blocks) continue;
      const CrossMemoryRecord& peer = *rec;
      s.peer_list.resize(static_cast<std::size_t>(peer.list_blocks));
      BufferTable table;
      s.reader.begin(peer.pid, q);
      s.reader.add(reinterpret_cast<std::byte*>(s.peer_list.data()), peer.list, s.peer_list.size() * sizeof(BlockCopy));
      s.reader.add(reinterpret_cast<std::byte*>(&table), peer.table, sizeof table);
      s.reader.begin(peer.pid, q, true);  // (reads the list and the table first)
      for (const BlockCopy& c : s.peer_list) {
        const int i = c.src_buffer - BufferIndex::count;
        if (i < 0 || i / kMaxTensors != w.rank || !own.remote[i % kMaxTensors] || !pushed_by_owner(c)) continue;
        if (c.row_tensor >= 0 && (table.transforms || c.wire)) continue;  // the peer reads it to transform it (run_remote())
        write_block(s.reader, c, mine.data[i % kMaxTensors], reinterpret_cast<std::uintptr_t>(table.base[c.dst_buffer]));
      }
    }
    s.reader.flush();
  }
};
}  // namespace detail

/// Needs: with_peers() and allgather() on the communicator, the executor's memory the
/// communicator's (a device executor also prepare_direct()). Lists: PeerCopyLists, built once per
/// plan and group from the ranks' layouts, kept in the communicator's ExchangeState. Copies per
/// element: executor 1, transport 0. Traffic: every element read once from its owner's memory.
/// Where every rank can store to every rank's outputs (comm_traits::peer_outputs: threads of one
/// process, or MpiWindowComm with every rank's outputs in the window) with a host executor,
/// seq→head pushes instead: each rank reads its own rows in order and writes every peer's heads
/// into that peer's output (PeerCopyLists::push_seq_to_head); head→seq and its sums always pull.
/// The peer copy transport (see the file comment). It has no stages of its own: exchange() runs
/// every stage's share at once, or one stage's alone (a head band).
struct PeerCopyTransport {
  static constexpr Path path = Path::direct;  ///< the Path it serves
  /// with_peers() and allgather() on the communicator, the executor's memory the communicator's,
  /// and a host executor or one that uploads the lists (prepare_direct()).
  template <class Comm, class Exec>
  static constexpr bool supported = comm_traits<Comm>::with_peers && comm_traits<Comm>::allgather &&
                                    detail::same_memory_v<Comm, Exec> &&
                                    (executor_traits<Exec>::runs_on_host || executor_traits<Exec>::prepare_direct);

  /// Whether it serves the decode exchange (decode/exchange.hpp) with these types: with_peers()
  /// on the communicator and a host executor in its memory (the merge reads the peers' partials).
  template <class Comm, class Exec>
  static constexpr bool serves_decode =
      comm_traits<Comm>::with_peers && executor_traits<Exec>::runs_on_host && detail::same_memory_v<Comm, Exec>;
  /// It moves no chunk: every rank reads its peers' inputs in place.
  static constexpr bool reads_in_place = true;
  /// The decode exchange's step without its wire: every rank publishes `step.peer_inputs()`
  /// (with_peers()) and runs `Step::read_peers(&step, all)` with every rank's, reading them in
  /// place; the wire `w` is not moved (the step's merge reads what it would have carried).
  /// @pre comm_traits<Comm>::with_peers; the step is the partials' (the merged chunks of
  ///      DecodeOutput::all_heads go by a transport that moves them).
  template <class Comm, class Step>
  static void exchange_chunks(Comm& comm, const ChunkWire& w, Step& step) {
    (void)w;
    if constexpr (comm_traits<Comm>::with_peers) {
      const PeerRecord in = step.peer_inputs();
      comm.with_peers(&in, &Step::read_peers, &step);
    }
  }

  /// The lists of `plan` on `comm`'s group: from the communicator's ExchangeState, or built from
  /// an all-gather of the ranks' layouts (collective; allocates) and kept there. Without an
  /// ExchangeState they are built into `local` at every call.
  template <class Comm>
  static const PeerCopyLists& lists(const Plan& plan, Comm& comm, PeerCopyLists& local) {
    if constexpr (comm_traits<Comm>::exchange_state) {
      if (const PeerCopyLists* l = comm.exchange_state().peer_copy(plan.id())) return *l;
    }
    const LayoutRecord mine = plan.layout_record();
    std::vector<LayoutRecord> all(static_cast<std::size_t>(plan.degree()));
    comm.allgather(&mine, sizeof mine, all.data());
    PeerCopyLists built = peer_copy_lists(plan, all.data());
    if constexpr (!comm_traits<Comm>::one_address_space) detail::peer_reads(plan, all.data(), built);  // what a window stages or publishes
    const std::uint64_t wire = plan.fingerprint();  // every rank's, once the agreement check passed
    for (const LayoutRecord& r : all) built.layouts.push_back(detail::layout_hash(r, wire));
    if constexpr (comm_traits<Comm>::exchange_state) {
      return comm.exchange_state().set_peer_copy(plan.id(), std::move(built));
    } else {
      local = std::move(built);
      return local;
    }
  }

  /// Whether seq→head may push (PeerCopyLists::push_seq_to_head: every rank reads its own input
  /// in order and writes its peers' outputs) rather than pull: a communicator that hands on the
  /// peers' outputs (comm_traits::peer_outputs) with a host executor. It then pushes when every
  /// rank's outputs reached every rank storable (always between threads of one process; with
  /// MpiWindowComm when they lie in the window). The bytes are the same either way.
  template <class Comm, class Exec>
  static constexpr bool pushes = comm_traits<Comm>::peer_outputs && executor_traits<Exec>::runs_on_host;

  /// The peer copy of direction d, all stages at once (or stage `stage` alone: a head band),
  /// between two synchronisations of the group (with_peers(): no rank reads a peer's input or
  /// writes a peer's output before the peer has published it, and none returns while a peer may
  /// still read its input or write its output). A stage alone pulls (PeerCopyLists::stage_list).
  /// @pre the cross-rank check is done; supported<Comm, Exec>; a stage alone: a host executor.
  /// @throws Error(plan_mismatch) when a peer's layouts do not fit this rank's plan; the
  ///         communicator's and executor's errors.
  template <class Comm, class Exec>
  static void exchange(const Plan& plan, Direction d, Comm& comm, Exec& exec, const BufferTable& t, int stage = -1) {
    PeerCopyLists local;
    const PeerCopyLists& l = lists(plan, comm, local);
    const bool whole = stage < 0 || plan.num_stages() == 1;
    const bool push = pushes<Comm, Exec> && d == Direction::seq_to_head && whole;
    const std::vector<BlockCopy>& list = whole ? l.list[static_cast<int>(d)] : l.stage_list[static_cast<int>(d)].at(static_cast<std::size_t>(stage));
    if constexpr (executor_traits<Exec>::prepare_direct) {
      const std::vector<BlockCopy>& s2h = l.list[0];
      const std::vector<BlockCopy>& h2s = l.list[1];
      exec.prepare_direct(BlockList{s2h.data(), s2h.size()}, BlockList{h2s.data(), h2s.size()}, plan.degree());
    }
    PeerRecord inputs;  // what with_peers() publishes: the inputs, their sizes, the layouts hash (comm/peer_record.hpp)
    inputs.count = plan.num_tensors();
    for (int x = 0; x < plan.num_tensors(); ++x) {
      inputs.data[x] = t.base[BufferIndex::input(x)];
      inputs.bytes[x] = plan.input_bytes(d, x);
      if (pushes<Comm, Exec>) {  // (in both directions: a communicator across processes also keeps its staging off them)
        inputs.outputs[x] = t.base[BufferIndex::output(x)];
        inputs.output_bytes[x] = plan.output_bytes(d, x);
      }
    }
    CrossMemoryRecord cma;  // the cross-memory part (comm/cross_memory.hpp): only a host executor reads remote inputs
    cma.reads_remote = executor_traits<Exec>::runs_on_host;  // PeerCopyWork::run_remote
    if (l.peer_reads)  // an input no peer reads needs neither staging nor publishing (C17)
      for (int x = 0; x < plan.num_tensors(); ++x) {
        inputs.read_bytes[x] = l.peer_read_bytes[static_cast<int>(d)][x];
        inputs.unread[x] = inputs.bytes[x] && !inputs.read_bytes[x];
      }
    if (cma.reads_remote) {
      if (l.peer_reads)
        for (int x = 0; x < kMaxTensors; ++x) cma.range_bytes[x] = l.peer_range_bytes[static_cast<int>(d)][x];
      else
        detail::remote_range_bytes(list, cma.range_bytes);
      cma.list = reinterpret_cast<std::uintptr_t>(list.data());  // for the owners that push (PeerCopyWork::push)
      cma.list_blocks = list.size();
      cma.table = reinterpret_cast<std::uintptr_t>(&t);
      inputs.cross_memory = &cma;
    }
    if (!l.layouts.empty()) {
      inputs.layouts = l.layouts[static_cast<std::size_t>(plan.rank())];
      inputs.peer_layouts = l.layouts.data();
    }
    std::vector<std::byte*> own_scratch;
    detail::RemoteReadScratch own_remote;
    std::vector<std::byte*>* peers = &own_scratch;
    detail::RemoteReadScratch* remote = &own_remote;
    if constexpr (comm_traits<Comm>::exchange_state) peers = &comm.exchange_state().peer_inputs();
    if constexpr (detail::has_cross_memory_scratch<Comm>::value) remote = &comm.cross_memory_scratch();
    peers->resize(2 * static_cast<std::size_t>(plan.degree()) * kMaxTensors + 1);
    detail::PeerCopyWork<Exec> work{&list, push ? &l.push_seq_to_head : nullptr, &t, &exec, plan.degree(), &l.layouts, peers, remote, plan.rank()};
    comm.with_peers(&inputs, &detail::PeerCopyWork<Exec>::run, &work);
  }

  /// Copies per element of direction d: one executor copy, no transport (Plan::copies()).
  static CopyCount copies(const Plan& plan, Direction d) {
    double out = 0;
    for (int k = 0; k < plan.num_stages(); ++k) out += detail::written_bytes(plan.stage_lists(d, k).unpack);
    if (out == 0) return {};
    return {1, 0};
  }
  /// Traffic of stage k for the cost model: one synchronisation with each peer, every output byte
  /// copied once (the peer copy copies the unpack's rows, from the peers' inputs).
  static void traffic(const Plan& plan, Direction d, int k, const std::vector<std::size_t>&, ExchangeTraffic& t, detail::TrafficSpans&) {
    const StageLists& s = plan.stage_lists(d, k);
    t.messages[0] += plan.degree() - 1;
    ++t.rounds;
    if (plan.degree() > 1) t.latency_steps[0] += 1;  // the peers' synchronisations are in flight together
    t.copy_bytes += detail::written_bytes(s.unpack);
    t.copy_rows += detail::rows(s.unpack);
  }
  /// No workspace.
  static double traffic_workspace(const detail::TrafficSpans&) { return 0; }
};

ULYSSES_NAMESPACE_END
