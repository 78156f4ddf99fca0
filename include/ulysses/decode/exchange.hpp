// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief decode_exchange(): the decode-time exchange of partial attention outputs and their LSE
///        over any communicator, merged on arrival (decode context parallelism).
///
/// One call, on every rank of the group, after each rank has computed attention of the new
/// tokens' queries (all H heads) over its own KV shard (DecodeSpec in decode/plan.hpp):
///   1. pack: one pass over O_r and LSE_r writes, for every peer p, the rows and LSEs of p's heads
///      into one chunk (O and LSE together; wire format in decode/plan.hpp);
///   2. exchange: ONE message per peer with a non-empty chunk (exchange_messages() where the
///      communicator has it and its memory is the executor's), else one alltoallv(); the rank's
///      own share never goes through the transport (zero bytes to itself: no self-send, nothing
///      to deadlock under CUDA graph replay);
///   3. unpack + merge: each row of this rank's heads merges the P partials in ascending rank
///      order, its own read in place (merge/lse.hpp: fp32, fixed order, empty contributions —
///      LSE −inf, +inf or NaN — add nothing, 16-bit outputs rounded once);
///   4. DecodeOutput::all_heads only: a second exchange of the merged head groups (the same chunk
///      to every peer) and their unpack, so that every rank holds all H heads merged.
/// DecodePath::direct (ranks sharing memory: a communicator with with_peers(), a host executor)
/// replaces 1-3: every rank publishes O_r and LSE_r and merges its heads reading its peers'
/// partials in place (no pack, no transport); the same bits.
/// Compared with the two collectives engines use today (an all-gather of O and one of LSE, then a
/// local merge: P−1 full partials received per rank), a rank receives only its heads: 1/P of the
/// bytes, in one collective, and the pack is one pass instead of the separate permute copies of O
/// and LSE.
///
/// Decode executor concept — a type X provides (HostDecodeExecutor in decode/host.hpp,
/// CudaDecodeExecutor in cuda/merge.cuh):
/// - `const DecodePeer* peer_table(const DecodePlan&) const`: the plan's peer table in memory the
///   executor reads (may throw Error(plan_mismatch) for a plan it does not serve);
/// - `void pack(const DecodeArgs&) const`, `void merge(const DecodeArgs&) const`,
///   `void unpack_gathered(const DecodeArgs&) const`: the passes of decode/kernels.hpp;
/// - `static constexpr bool runs_on_host = true` (host loads and stores, done on return), or
///   `static constexpr bool device_memory = true` and `stream()` (stream-ordered device work).
/// Communicator: the concept of comm/concepts.hpp (alltoallv(); optionally exchange_messages(),
/// allgather(), exchange_state()).
#pragma once

#include "../comm/concepts.hpp"
#include "../comm/tell_peers.hpp"
#include "../plan/agreement.hpp"
#include "../transport/common.hpp"
#include "plan.hpp"
#include "../layout/blocks.hpp"
#include "../error.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// Whether the decode exchange of Comm and Exec can take exchange_messages(): the communicator
/// has it and its memory is the executor's.
template <class Comm, class Exec>
constexpr bool decode_can_message_v = comm_traits<Comm>::exchange_messages && same_memory_v<Comm, Exec>;

/// Whether the decode exchange of Comm and Exec can take DecodePath::direct: the communicator
/// has with_peers() and the executor runs on the host in the communicator's memory.
template <class Comm, class Exec>
constexpr bool decode_can_direct_v = comm_traits<Comm>::with_peers && executor_traits<Exec>::runs_on_host && same_memory_v<Comm, Exec>;

/// What the direct path's with_peers() work needs (on the calling rank's stack: no allocation).
template <class Exec>
struct DecodeDirectWork {
  const Exec* exec;
  DecodeArgs args;
  std::uint64_t layouts;  // this rank's direct_layouts_hash()
  std::array<const std::byte*, kDecodeDirectMaxRanks> partial{}, lse{};

  /// with_peers()' callback: the peers' O_p and LSE_p (PeerRecord data[0], data[1]) into the
  /// tables, then this rank's merge reading them in place.
  static void run(void* ctx, const void* const* all) {
    auto& w = *static_cast<DecodeDirectWork*>(ctx);
    for (int p = 0; p < w.args.P; ++p) {
      const auto& in = *static_cast<const PeerRecord*>(all[p]);
      if (in.layouts != w.layouts)
        fail(Errc::plan_mismatch, "DecodePath::direct: rank " + std::to_string(p) + " has other partial or LSE layouts than rank " +
                                      std::to_string(w.args.rank) + "; the direct path reads every rank's O_r at the same offsets");
      w.partial[static_cast<std::size_t>(p)] = in.data[0];
      w.lse[static_cast<std::size_t>(p)] = in.data[1];
    }
    w.args.peer_partial = w.partial.data();
    w.args.peer_lse = w.lse.data();
    w.exec->merge(w.args);
  }
};

/// One byte range of a call's buffers, for the checks.
struct DecodeRange {
  const char* name;
  const void* p;
  std::size_t need, given, align;
  bool written;
};

/// The local checks of one call (this rank's buffers against its plan).
inline void check_decode_buffers(const DecodePlan& plan, const DecodeBuffers& b) {
  const DecodeSpec& s = plan.spec();
  const DecodeRange r[5] = {
      {"the partial output O_r (DecodeBuffers::partial)", b.partial, plan.partial_span_bytes(), b.partial_bytes, size_of(s.partial_type), false},
      {"the partial LSE_r (DecodeBuffers::lse)", b.lse, plan.lse_span_bytes(), b.lse_bytes, 4, false},
      {"the merged output (DecodeBuffers::out)", b.out, plan.out_span_bytes(), b.out_bytes, size_of(s.out_type), true},
      {"the merged LSE (DecodeBuffers::out_lse)", b.out_lse, b.out_lse ? plan.out_lse_span_bytes() : 0, b.out_lse_bytes, 4, true},
      {"the workspace (DecodeBuffers::workspace)", b.workspace, plan.workspace_bytes(), b.workspace_bytes, 1, true}};
  for (int i = 0; i < 5; ++i) {
    const DecodeRange& x = r[i];
    if (x.need == 0) continue;
    if (!x.p || x.given < x.need)
      fail(i == 4 ? Errc::workspace_too_small : Errc::buffer_too_small,
           std::string(x.name) + " holds " + std::to_string(x.p ? x.given : 0) + " bytes; the decode plan needs " +
               std::to_string(x.need) + (i == 4 ? " (DecodePlan::workspace_bytes())" : " (its layout's span)"));
    if (reinterpret_cast<std::uintptr_t>(x.p) % x.align != 0)
      fail(Errc::misaligned, std::string(x.name) + " is not aligned to its element size of " + std::to_string(x.align) + " bytes");
  }
  for (int i = 0; i < 5; ++i)
    for (int j = i + 1; j < 5; ++j) {
      if (!(r[i].written || r[j].written) || r[i].need == 0 || r[j].need == 0) continue;
      const auto a0 = reinterpret_cast<std::uintptr_t>(r[i].p), b0 = reinterpret_cast<std::uintptr_t>(r[j].p);
      if (a0 < b0 + r[j].need && b0 < a0 + r[i].need)
        fail(Errc::buffer_overlap, std::string(r[i].name) + " overlaps " + r[j].name + "; decode outputs and the workspace must not overlap any other buffer");
    }
}

/// The communicator's size and rank against the plan's.
template <class Comm>
void check_decode_comm(const DecodePlan& plan, const Comm& comm) {
  check_comm_size(comm, plan.degree(), plan.rank(), "the decode plan");
}

/// The cross-rank comparison of agreement_record() before a plan's first exchange: every rank
/// all-gathers the records (allgather() of host memory, or alltoallv() on host buffers) and throws
/// the same Error(plan_mismatch) when any differs from rank 0's. Skipped for a device-memory
/// communicator without allgather(). Allocates (first call only).
template <class Comm>
void check_decode_agreement(const DecodePlan& plan, Comm& comm) {
  static_assert(check_communicator<Comm>());
  if constexpr (can_check_agreement_v<Comm>) {
    const std::vector<DecodeRecord> all = allgather_record(comm, plan.degree(), plan.rank(), plan.agreement_record());
    const std::string why = words_differ(all, [](int w) { return std::string(DecodePlan::agreement_field(w)); }, [](int w) { return DecodePlan::agreement_word_printed(w); });
    if (!why.empty())
      fail(Errc::plan_mismatch, "the ranks planned different decode exchanges (every rank reports this; this is rank " +
                                    std::to_string(plan.rank()) + "): " + why +
                                    ". Every rank must plan with the same B, T, heads, Dv, types, LSE base, output and path");
  }
  mark_agreed(comm, plan.id(), plan.agreement_check());
}

/// One exchange of chunks: by messages (one per peer with a non-empty chunk, both directions) or
/// by one alltoallv(). Sizes and offsets from the plan; `send_at` / `recv_at` the regions.
template <class Comm>
void decode_collective(Comm& comm, bool messages, const std::vector<std::size_t>& sb, const std::vector<std::size_t>& so,
                       std::byte* send_at, const std::vector<std::size_t>& rb, const std::vector<std::size_t>& ro, std::byte* recv_at,
                       std::vector<Message>& sm, std::vector<Message>& rm) {
  if (!messages) {
    comm.alltoallv(send_at, sb.data(), so.data(), recv_at, rb.data(), ro.data());
    return;
  }
  if constexpr (comm_traits<Comm>::exchange_messages) {
    sm.clear();
    rm.clear();
    for (std::size_t p = 0; p < sb.size(); ++p) {
      if (sb[p]) sm.push_back(Message{static_cast<int>(p), send_at + so[p], sb[p]});
      if (rb[p]) rm.push_back(Message{static_cast<int>(p), recv_at + ro[p], rb[p]});
    }
    comm.exchange_messages(sm.data(), sm.size(), rm.data(), rm.size());
  }
}

}  // namespace detail

/// The decode exchange of `plan` on this rank: pack, one exchange, unpack + merge (and for
/// DecodeOutput::all_heads a second exchange of the merged head groups); see the file comment.
/// Collective: every rank of the group calls it with its own plan, communicator and buffers.
///
/// @param plan  this rank's DecodePlan (the same spec on every rank; layouts may differ)
/// @param comm  the group's communicator (concept: comm/concepts.hpp), size P, rank plan.rank()
/// @param exec  a decode executor (HostDecodeExecutor, CudaDecodeExecutor)
/// @param b     this rank's buffers: O_r [B, T, H, Dv] and LSE_r [B, T, H] (fp32) in, the merged
///              O [B, T, H_rank or H, Dv] and LSE (optional) out, and plan.workspace_bytes() of
///              workspace, all in the executor's memory
/// Allocation: none (the message lists live in the communicator's exchange_state() scratch and
/// keep their capacity), except on a plan's first call (the cross-rank check, when on) and with a
/// communicator without exchange_state() on the message path (two small vectors per call). No
/// host synchronisation beyond what the backend itself does (a CUDA executor with NcclComm: all
/// stream-ordered, capturable after the first call). Waits are the communicator's own (bounded
/// for LocalGroup: Error(timeout) / Error(aborted)).
/// Every error below is thrown before this rank enters a collective; those that depend on shared
/// inputs only (the plan's) are thrown by every rank alike at planning, and plan_mismatch by every
/// rank at the first call. An error of this rank alone breaks the group first where the
/// communicator can carry it (comm/tell_peers.hpp): the peers throw Error(aborted) naming it.
/// @throws Error(comm_mismatch) the communicator's size or rank is not the plan's, or the executor
///         and the communicator run on different streams;
///         Error(buffer_too_small) a buffer shorter than its layout's span (the message names it);
///         Error(workspace_too_small) a workspace smaller than plan.workspace_bytes();
///         Error(misaligned) a pointer not aligned to its element size;
///         Error(buffer_overlap) an output or the workspace overlapping another buffer;
///         Error(path_unsupported) DecodePath::messages or direct on a communicator that cannot;
///         Error(plan_mismatch) (first call, every rank) the ranks planned different exchanges
///         (DecodePath::direct: also different partial or LSE layouts; checked again in the
///         direct step, should the cross-rank check be off);
///         the communicator's and executor's errors (Error(backend), timeout, aborted).
/// Source: vLLM's decode context parallelism (`dcp_a2a_lse_reduce`), TensorRT-LLM's Helix
/// parallelism; the merge of merge/lse.hpp.
namespace detail {
template <class Comm, class Exec>
void run_decode_exchange(const DecodePlan& plan, Comm& comm, const Exec& exec, const DecodeBuffers& b);
}  // namespace detail
template <class Comm, class Exec>
void decode_exchange(const DecodePlan& plan, Comm& comm, const Exec& exec, const DecodeBuffers& b) {
  detail::begin_call(comm, "decode_exchange");
  detail::tell_peers_on_failure(comm, plan.rank(), "decode_exchange", [&] { detail::run_decode_exchange(plan, comm, exec, b); });
}

namespace detail {
/// decode_exchange() once its failures are told to the peers.
template <class Comm, class Exec>
void run_decode_exchange(const DecodePlan& plan, Comm& comm, const Exec& exec, const DecodeBuffers& b) {
  detail::check_decode_comm(plan, comm);
  detail::check_streams(comm, exec);
  detail::check_decode_buffers(plan, b);
  const DecodePath path = plan.path_for(detail::decode_can_message_v<Comm, Exec>, detail::decode_can_direct_v<Comm, Exec>);
  const bool messages = path == DecodePath::messages || (path == DecodePath::direct && detail::decode_can_message_v<Comm, Exec>);
  const DecodeArgs a = plan.args(b, exec.peer_table(plan));
  if (plan.degree() == 1) {  // nothing to exchange: the merge of one contribution
    exec.merge(a);
    return;
  }
  if (detail::check_due(comm, plan.id(), plan.agreement_check())) detail::check_decode_agreement(plan, comm);
  std::vector<Message> own_send, own_recv;  // only used without exchange_state() (then they allocate)
  std::vector<Message>* sm = &own_send;
  std::vector<Message>* rm = &own_recv;
  if constexpr (comm_traits<Comm>::exchange_state) {
    sm = &comm.exchange_state().send_messages();
    rm = &comm.exchange_state().recv_messages();
  }
  if (path == DecodePath::direct) {
    if constexpr (detail::decode_can_direct_v<Comm, Exec>) {
      PeerRecord in;  // what the peers read: O_r and LSE_r, in place (MpiWindowComm: staged when outside its window)
      in.count = 2;
      in.data[0] = const_cast<std::byte*>(a.partial);  // read only (PeerRecord is the peer copy's type)
      in.data[1] = const_cast<std::byte*>(a.lse);
      in.bytes[0] = plan.partial_span_bytes();
      in.bytes[1] = plan.lse_span_bytes();
      in.layouts = plan.direct_layouts_hash();
      detail::DecodeDirectWork<Exec> w{&exec, a, in.layouts, {}, {}};
      comm.with_peers(&in, &detail::DecodeDirectWork<Exec>::run, &w);
    }
  } else {
    exec.pack(a);
    detail::decode_collective(comm, messages, plan.send_bytes(), plan.send_offsets(), a.send, plan.recv_bytes(), plan.recv_offsets(),
                              a.recv, *sm, *rm);
    exec.merge(a);
  }
  if (plan.spec().output != DecodeOutput::all_heads) return;
  detail::decode_collective(comm, messages, plan.gather_send_bytes(), plan.gather_send_offsets(), a.gather_send, plan.gather_recv_bytes(),
                            plan.gather_recv_offsets(), a.gather_recv, *sm, *rm);
  exec.unpack_gathered(a);
}
}  // namespace detail

ULYSSES_NAMESPACE_END
