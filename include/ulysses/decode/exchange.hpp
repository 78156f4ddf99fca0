// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief decode_exchange(): the decode-time exchange of partial attention outputs and their LSE
///        over any communicator, merged on arrival, through the transports of the Ulysses
///        exchange (transport/dispatch.hpp: visit_transport(), each transport's
///        exchange_chunks()); choose_path() of a DecodePlan. Steps and guarantees: docs/decode.md.
///
/// Decode executor concept (HostDecodeExecutor in decode/host.hpp, CudaDecodeExecutor in
/// cuda/merge.cuh): `const DecodePeer* peer_table(const DecodePlan&) const` (may throw
/// Error(plan_mismatch)); `pack`, `merge`, `unpack_gathered` of `const DecodeArgs&` (the passes of
/// decode/kernels.hpp); `runs_on_host = true`, or `device_memory = true` and `stream()`.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../comm/agreement.hpp"
#include "../comm/concepts.hpp"
#include "../comm/tell_peers.hpp"
#include "../error.hpp"
#include "../transport/common.hpp"
#include "../transport/dispatch.hpp"
#include "plan.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// choose_path() of a decode plan whose DecodeSpec::path is `p`.
template <class Comm, class Exec>
Path decode_path(Path p) {
  if (p == Path::automatic) return PathSupport<Comm, Exec>::messages ? Path::messages : Path::alltoallv;
  if (!serves_decode<Comm, Exec>(p))
    fail(Errc::path_unsupported, std::string("DecodeSpec::path = ") + to_string(p) + ", but " +
                                     (p == Path::two_level ? std::string("the decode wire is flat (a decode plan has no node layout)")
                                                           : why_unsupported(p) + " (for the decode exchange: a host one)") +
                                     "; use Path::automatic");
  return p;
}
}  // namespace detail

/// The transport a decode exchange of `plan` takes with a communicator of type Comm and a decode
/// executor of type Exec (the decode twin of choose_path(const Plan&)): DecodeSpec::path when
/// set, else messages where the communicator has exchange_messages() in the executor's memory,
/// else alltoallv (never direct: it needs the same layouts on every rank; ask for it). The same
/// on every rank that uses the same types and spec (the path is in the agreement record).
/// @throws Error(path_unsupported) DecodeSpec::path names a transport that does not serve the
///         decode exchange with these types (transport `serves_decode`; Path::two_level never).
template <class Comm, class Exec>
Path choose_path(const DecodePlan& plan) {
  static_assert(check_communicator<Comm>());
  return detail::decode_path<Comm, Exec>(plan.path());
}

namespace detail {

/// One step of a decode exchange as a transport runs it (exchange_chunks()): the partials'
/// (before: the pack; after: the merge; or, read in place, the merge over the peers' O_p and
/// LSE_p) or the all-gather's (before: nothing, the merge wrote the chunk; after: the unpack).
template <class Exec>
struct DecodeStep {
  const Exec* exec;
  DecodeArgs args;
  bool gather;                      // the all-gather's step
  std::uint64_t layouts;            // this rank's direct_layouts_hash()
  std::size_t partial_bytes, lse_bytes;  // the spans of O_r and LSE_r
  std::array<const std::byte*, kMaxTableRanks> partial{}, lse{};

  /// Before the wire moves: the pack of the partials (the all-gather's chunk the merge wrote).
  void before() const {
    if (!gather) exec->pack(args);
  }
  /// After it arrived: the merge of the partials, or the unpack of the merged head groups.
  void after() const { gather ? exec->unpack_gathered(args) : exec->merge(args); }
  /// What the peers read in place: O_r and LSE_r (MpiWindowComm stages them when outside its window).
  PeerRecord peer_inputs() const {
    PeerRecord in;
    in.count = 2;
    in.data[0] = const_cast<std::byte*>(args.partial);  // read only (PeerRecord is the peer copy's type)
    in.data[1] = const_cast<std::byte*>(args.lse);
    in.bytes[0] = partial_bytes;
    in.bytes[1] = lse_bytes;
    in.layouts = layouts;
    return in;
  }
  /// with_peers()' callback: the peers' O_p and LSE_p (PeerRecord data[0], data[1]) into the
  /// tables, then this rank's merge reading them in place.
  static void read_peers(void* ctx, const void* const* all) {
    auto& w = *static_cast<DecodeStep*>(ctx);
    if (w.gather) fail(Errc::path_unsupported, "decode_exchange: the merged chunks of all_heads are moved, not read in place");
    for (int p = 0; p < w.args.P; ++p) {
      const auto& in = *static_cast<const PeerRecord*>(all[p]);
      if (in.layouts != w.layouts)
        fail(Errc::plan_mismatch, "Path::direct: rank " + std::to_string(p) + " has other partial or LSE layouts than rank " +
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
  std::size_t need, given, align;  // align: the element's size (1: the workspace's bytes)
  bool written;
  std::size_t range_elem;  // ConstByteSpan::elem_bytes of the span given
  const char* type;        // the element type's name
};

/// The local checks of one call (this rank's buffers against its plan).
/// @throws Error(tensor_mismatch), Error(buffer_too_small), Error(workspace_too_small),
///         Error(misaligned), Error(buffer_overlap) as decode_exchange().
inline void check_decode_buffers(const DecodePlan& plan, const DecodeBuffers& b) {
  const DecodeSpec& s = plan.spec();
  const DecodeRange r[5] = {
      {"the partial output O_r (DecodeBuffers::partial)", b.partial().data, plan.partial_span_bytes(), b.partial().bytes, size_of(s.partial_type), false,
       b.partial().elem_bytes, to_string(s.partial_type)},
      {"the partial LSE_r (DecodeBuffers::lse)", b.lse().data, plan.lse_span_bytes(), b.lse().bytes, 4, false, b.lse().elem_bytes, "float32"},
      {"the merged output (DecodeBuffers::out)", b.out().data, plan.out_span_bytes(), b.out().bytes, size_of(s.out_type), true,
       b.out().elem_bytes, to_string(s.out_type)},
      {"the merged LSE (DecodeBuffers::out_lse)", b.out_lse().data, b.out_lse().data ? plan.out_lse_span_bytes() : 0, b.out_lse().bytes, 4, true,
       b.out_lse().elem_bytes, "float32"},
      {"the workspace (DecodeBuffers::workspace)", b.workspace().data, plan.workspace_bytes(), b.workspace().bytes, 1, true, 0, "bytes"}};
  for (int i = 0; i < 5; ++i) {
    const DecodeRange& x = r[i];
    if (x.need == 0) continue;
    check_range_element([&] { return x.name; }, x.range_elem, x.align, x.type, false);
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

/// Runs `step` over the wire `w` on the transport of `path` (the one switch: visit_transport()).
/// @pre serves_decode<Comm, Exec>(path) (choose_path() checked it).
template <class Comm, class Exec>
void decode_step(Path path, Comm& comm, const ChunkWire& w, DecodeStep<Exec>& step) {
  visit_transport(path, [&](auto t) {
    using T = decltype(t);
    if constexpr (T::template serves_decode<Comm, Exec>) T::exchange_chunks(comm, w, step);
    else fail(Errc::path_unsupported, std::string("decode_exchange: the ") + to_string(T::path) + " path does not serve it");
  });
}

/// decode_exchange() once its failures are told to the peers.
template <class Comm, class Exec>
void run_decode_exchange(const DecodePlan& plan, Comm& comm, const Exec& exec, const DecodeBuffers& b) {
  check_comm_size(comm, plan.degree(), plan.rank(), "the decode plan");
  check_streams(comm, exec);
  check_decode_buffers(plan, b);
  const Path path = choose_path<Comm, Exec>(plan);
  DecodeStep<Exec> step{&exec, plan.args(b, exec.peer_table(plan)), false, plan.direct_layouts_hash(),
                        plan.partial_span_bytes(), plan.lse_span_bytes(), {}, {}};
  if (plan.degree() == 1) {  // nothing to exchange: the merge of one contribution
    exec.merge(step.args);
    return;
  }
  before_exchange(plan, comm);
  const DecodeArgs& a = step.args;
  const int P = plan.degree();
  decode_step(path, comm, ChunkWire{a.send, plan.send_bytes().data(), plan.send_offsets().data(), a.recv, plan.recv_bytes().data(),
                                    plan.recv_offsets().data(), P}, step);
  if (plan.spec().output != DecodeOutput::all_heads) return;
  // The merged chunks always move: on a path that reads in place, by the transport automatic takes.
  const Path moved = reads_in_place(path) ? decode_path<Comm, Exec>(Path::automatic) : path;
  step.gather = true;
  decode_step(moved, comm, ChunkWire{a.gather_send, plan.gather_send_bytes().data(), plan.gather_send_offsets().data(), a.gather_recv,
                                     plan.gather_recv_bytes().data(), plan.gather_recv_offsets().data(), P}, step);
}

}  // namespace detail

/// The decode exchange of `plan` on this rank: pack, one exchange, unpack + merge (and for
/// DecodeOutput::all_heads a second exchange of the merged head groups), on the transport
/// choose_path<Comm, Exec>(plan) takes (docs/decode.md, "The call"). Collective: every rank of
/// the group calls it with its own plan, communicator and buffers.
///
/// @param plan  this rank's DecodePlan (the same spec on every rank; layouts may differ)
/// @param comm  the group's communicator (concept: comm/concepts.hpp), size P, rank plan.rank()
/// @param exec  a decode executor (HostDecodeExecutor, CudaDecodeExecutor)
/// @param b     this rank's buffers by name (DecodeBuffers): O_r [B, T, H, Dv] and LSE_r [B, T, H]
///              (fp32) in, the merged O [B, T, H_rank or H, Dv] and LSE (optional) out, and
///              plan.workspace_bytes() of workspace, all in the executor's memory
/// Allocation: none after a plan's first call (the cross-rank check), except with a communicator
/// without exchange_state() on the message path (two small vectors per call). Waits are the
/// communicator's own (Error(timeout) / Error(aborted)). Every error is thrown before this rank
/// enters a collective; an error of this rank alone breaks the group first where the
/// communicator can carry it (comm/tell_peers.hpp): the peers throw Error(aborted) naming it.
/// @throws Error(comm_mismatch) the communicator's size or rank is not the plan's, or the executor
///         and the communicator run on different streams;
///         Error(tensor_mismatch) a buffer given as a range of elements of another size than its
///         type's (std::vector<double> for fp32 LSEs; ranges of bytes and (pointer, bytes) pass);
///         Error(buffer_too_small) a buffer shorter than its layout's span (the message names it);
///         Error(workspace_too_small) a workspace smaller than plan.workspace_bytes();
///         Error(misaligned) a pointer not aligned to its element size;
///         Error(buffer_overlap) an output or the workspace overlapping another buffer;
///         Error(path_unsupported) DecodeSpec::path a transport that cannot serve these types;
///         Error(plan_mismatch) (first call, every rank) the ranks planned different exchanges
///         (Path::direct: also different partial or LSE layouts, checked again in the direct
///         step should the cross-rank check be off);
///         the communicator's and executor's errors (Error(backend), timeout, aborted).
template <class Comm, class Exec>
void decode_exchange(const DecodePlan& plan, Comm& comm, const Exec& exec, const DecodeBuffers& b) {
  detail::begin_call(comm, "decode_exchange");
  detail::tell_peers_on_failure(comm, plan.rank(), "decode_exchange", [&] { detail::run_decode_exchange(plan, comm, exec, b); });
}

ULYSSES_NAMESPACE_END
