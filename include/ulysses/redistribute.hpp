// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief seq_to_head / head_to_seq and their backwards over any communicator and executor:
///        pack → exchange → unpack.
///
/// DeepSpeed-Ulysses' all-to-alls (arXiv:2309.14509), with q, k and v in ONE exchange. The
/// backward of seq_to_head is seq_to_head_backward (head→seq, Replicas::sum); of head_to_seq,
/// head_to_seq_backward (seq→head). The concepts are comm/concepts.hpp, the transports
/// transport/; details: README.md's table of adjoints, docs/headers.md, "redistribute.hpp".
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/concepts.hpp"
#include "comm/tell_peers.hpp"
#include "error.hpp"
#include "layout/algebra.hpp"
#include "layout/blocks.hpp"
#include "layout/transform.hpp"
#include "plan/buffers.hpp"  // ConstByteSpan, ByteSpan, TensorList, Workspace, bind_buffers()
#include "plan/plan.hpp"
#include "transport/dispatch.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// The name of direction d's call, for the peers' messages.
constexpr const char* call_name(Direction d) { return d == Direction::seq_to_head ? "seq_to_head" : "head_to_seq"; }
/// What an exchange of `plan` in direction `dir` with row transforms `tx` (null: none) is, for the
/// call numbering (begin_call()): its plan, direction, the tensors and sides that carry a
/// transform and what the transforms that say so compute (RowTransforms::agreement(): Rope's
/// parameters and positions), so that ranks which disagree on them get Error(plan_mismatch)
/// instead of moving rows transformed on some ranks only, or two ways.
inline std::uint64_t exchange_word(const Plan& plan, Direction dir, const RowTransforms* tx) {
  const std::uint64_t w = fnv1a(plan.fingerprint(), static_cast<int>(dir)), sides = tx ? tx->agreement() : 0;
  return sides ? fnv1a(w, sides) : w;
}
/// Throws Error(not_adjoint) unless seq→head and head→seq of the plan are each other's adjoints.
inline void require_adjoint(const Plan& plan, const char* what) {
  const int t = plan.first_non_adjoint_tensor();
  if (t < 0) return;
  fail(Errc::not_adjoint, std::string(what) + ": tensor " + std::to_string(t) +
                              " has heads held by several ranks and Replicas::owner: head→seq takes their owner's copy, which "
                              "is the inverse of seq→head but not its backward (the backward sums the copies). Plan the "
                              "gradients with Replicas::sum (the default)");
}
}  // namespace detail

namespace detail {
/// Throws Error(invalid_shape), on this rank alone (the group is not broken: that would enter the
/// communicator beside the worker), when a split-phase handle's worker is inside `comm`: a library
/// call on it now would race with the worker. Call it before begin_call().
template <class Comm>
void refuse_beside_worker(Comm& comm, const char* name) {
  if constexpr (comm_traits<Comm>::exchange_state) {
    if (comm.exchange_state().workers_in_flight() > 0)
      fail(Errc::invalid_shape, std::string(name) + ": a split-phase handle's exchange is in flight on a worker thread of this "
                                                    "communicator (finish() it first, or put the exchanges that overlap in one handle)");
  } else {
    (void)comm;
    (void)name;
  }
}
}  // namespace detail

/// A run of a plan's stages, [first, first + count) (count -1: every stage from `first`): what a
/// split-phase exchange moves (ExchangeCall, split_phase.hpp); one stage of a HeadBands plan is
/// one head band.
struct StageRange {
  int first = 0;   ///< the first stage, in [0, Plan::num_stages())
  int count = -1;  ///< how many; -1: the rest
  static constexpr StageRange all() noexcept { return {0, -1}; }    ///< every stage
  static constexpr StageRange one(int k) noexcept { return {k, 1}; }  ///< stage k alone
};

namespace detail {
/// What every call does before it moves a byte: the communicator's size and rank and the
/// streams against the plan, the path (choose_path()), the stages and the buffer table of this
/// call (the peer copy needs no workspace). One exchange of a call.
struct ExchangePart {
  const Plan* plan = nullptr;
  Direction dir = Direction::seq_to_head;
  Path path = Path::alltoallv;
  BufferTable table;
  StageRange stages;  // resolved: count >= 1
};
/// Sets a call's row transforms into its buffer table, after checking them: every tensor given
/// is one of the plan's, planned with TensorSpec::with_row_transforms(), and the executor applies
/// transforms (executor_traits::row_transforms). Nothing for none (null or empty). A plan with an
/// fp8 wire (TensorSpec::with_wire()) needs such an executor too. `caller`: the user's call the
/// messages name (e.g. "banded_attention": "banded_attention (its seq_to_head): ..."); null: the
/// exchange's own name.
/// @throws Error(invalid_shape) naming the call, the tensor or the executor, before any byte moves.
template <class Exec>
void bind_transforms(const Plan& plan, Direction dir, const RowTransforms* tx, BufferTable& table, const char* caller = nullptr) {
  auto name = [&] { return caller ? std::string(caller) + " (its " + call_name(dir) + ")" : std::string(call_name(dir)); };  // (built on failure only)
  if constexpr (!executor_traits<Exec>::row_transforms) {
    for (int t = 0; t < plan.num_tensors(); ++t)
      if (plan.tensor(t).wire != Wire::element)
        fail(Errc::invalid_shape, name() + ": tensor " + std::to_string(t) + " travels as " +
                                      to_string(plan.tensor(t).wire) + ", but the executor applies no row work (HostExecutor does; "
                                      "executor_traits::row_transforms)");
  }
  if (!tx || (tx->empty() && !tx->has_bad_index())) return;
  if (tx->has_bad_index())
    fail(Errc::invalid_shape, name() + ": a row transform was given for tensor " + std::to_string(tx->bad_index()) +
                                  ", outside the plan's " + std::to_string(plan.num_tensors()) + " tensors");
  for (int t = 0; t < kMaxTensors; ++t) {
    if (!tx->any(t)) continue;
    if (t >= plan.num_tensors())
      fail(Errc::invalid_shape, name() + ": a row transform was given for tensor " + std::to_string(t) + ", but the plan moves " +
                                    std::to_string(plan.num_tensors()) + " tensors");
    if (!plan.tensor(t).by_rows())
      fail(Errc::invalid_shape, name() + ": a row transform was given for tensor " + std::to_string(t) +
                                    ", whose plan was not built for them: plan it with TensorSpec::with_row_transforms() (with "
                                    "attention_specs(): specs.q, specs.k or specs.v .with_row_transforms() before the plans or HeadBands)");
    for (int side = 0; side < 2; ++side) {
      const RowTransformRef r = side == 0 ? tx->pack(t) : tx->unpack(t);
      if (!r || !r.check) continue;
      try {
        r.check(r.object, plan.batch(), plan.seq().seq_len(), plan.tensor(t).head_dim);
      } catch (const Error& e) {  // (named: which tensor, which side)
        const std::string what = e.what(), head = std::string("ulysses: ") + to_string(e.code()) + ": ";
        fail(e.code(), name() + ": the " + (side == 0 ? "pack" : "unpack") + " transform of tensor " + std::to_string(t) + " refuses its rows: " +
                           (what.compare(0, head.size(), head) == 0 ? what.substr(head.size()) : what));
      }
    }
  }
  if constexpr (!executor_traits<Exec>::row_transforms)
    fail(Errc::invalid_shape, name() + ": row transforms were given, but the executor applies none (HostExecutor does; "
                                     "executor_traits::row_transforms)");
  table.transforms = tx;
}

/// Local: a refusal is told to the peers by the caller's tell_peers_on_failure() (comm/tell_peers.hpp).
/// A call of some stages of a plan whose path is direct runs the peer copy stage by stage between
/// the threads of one process with a host executor (LocalGroup). Across processes (MpiWindowComm:
/// its inputs outside the window are staged or read by Cross Memory Attach whole, for every
/// stage: docs/overlap.md, "Head bands") and with a device executor
/// (whose uploaded lists are all stages at once) it takes the message path where the types have
/// it, else the all-to-all-v (the same on every rank).
/// @throws Error(invalid_shape) a stage range outside [0, plan.num_stages()); what check_comm(),
///         check_streams(), choose_path(), bind_table() and bind_transforms() throw.
template <class Comm, class Exec>
ExchangePart bind_part(const Plan& plan, Direction dir, Comm& comm, const Exec& exec, const TensorList<ConstByteSpan>& in,
                       const TensorList<ByteSpan>& out, Workspace ws, StageRange stages = StageRange::all(),
                       const RowTransforms* transforms = nullptr) {
  check_comm(plan, comm);
  check_streams(comm, exec);
  const int K = plan.num_stages();
  const int count = stages.count == -1 ? K - stages.first : stages.count;
  if (stages.first < 0 || count < 1 || stages.first + count > K)
    fail(Errc::invalid_shape, std::string(call_name(dir)) + ": stages [" + std::to_string(stages.first) + ", " +
                                  std::to_string(stages.first + count) + ") are not a run of the plan's " + std::to_string(K) + " stages");
  Path path = choose_path<Comm, Exec>(plan);
  if (path == Path::direct && count < K && !(executor_traits<Exec>::runs_on_host && comm_traits<Comm>::one_address_space))
    path = PathSupport<Comm, Exec>::messages && plan.options().messages_enabled() ? Path::messages : Path::alltoallv;
  ExchangePart part{&plan, dir, path, bind_table(plan, dir, in, out, ws, path == Path::direct ? 0 : plan.workspace_bytes()), {stages.first, count}};
  bind_transforms<Exec>(plan, dir, transforms, part.table);
  return part;
}
/// Runs one bound exchange to its end: the peer copy, or per stage pack, exchange, unpack (the
/// stages one after the other; see HostPipeline to overlap them). What redistribute() and a
/// split-phase handle that runs in start() or on a worker do.
template <class Comm, class Exec>
void run_part(const ExchangePart& p, Comm& comm, Exec& exec);
}  // namespace detail

// ---- the stages one by one (engines that time or overlap them; redistribute() runs them) -----

namespace detail {
/// Runs one of the plan's block lists on the executor.
template <class Exec>
void run_list(Exec& exec, const std::vector<BlockCopy>& l, const BufferTable& t) {
  exec.run(l.data(), l.size(), t);
}
/// stage_exchange() on a path of messages (messages, two_level), which the communicator must have.
template <class Comm>
void exchange_messages_on(Path path, const Plan& plan, Direction dir, Comm& comm, const BufferTable& buffers, int stage) {
  static_assert(comm_traits<Comm>::exchange_messages, "exchange_pieces / exchange_two_level need a communicator with exchange_messages()");
  stage_exchange(plan, dir, path, comm, buffers, stage);
}
}  // namespace detail

/// Pack stage of the all-to-all-v and two-level paths: copies this rank's inputs into the send
/// region of the workspace (wire format); `stage` in [0, plan.num_stages()).
/// @pre `buffers` from bind_buffers(); @throws nothing itself (executor errors propagate).
template <class Exec>
void pack(const Plan& plan, Direction dir, Exec& exec, const BufferTable& buffers, int stage = 0) {
  detail::run_list(exec, AlltoallvTransport::pack_list(plan, dir, stage), buffers);
}
/// Exchange stage of the all-to-all-v path: the all-to-all-v of the send region into the receive
/// region, after the checks of stage_exchange().
/// @throws as stage_exchange().
template <class Comm>
void exchange(const Plan& plan, Direction dir, Comm& comm, const BufferTable& buffers, int stage = 0) {
  stage_exchange(plan, dir, Path::alltoallv, comm, buffers, stage);
}
/// Unpack stage of the all-to-all-v and two-level paths: the receive region into the outputs,
/// this rank's own chunk straight from its inputs, and the sums of replicated heads.
template <class Exec>
void unpack(const Plan& plan, Direction dir, Exec& exec, const BufferTable& buffers, int stage = 0) {
  detail::run_list(exec, AlltoallvTransport::unpack_list(plan, dir, stage), buffers);
}

/// True when Comm has the optional exchange_messages() of the communicator concept.
template <class Comm>
inline constexpr bool has_exchange_messages_v = comm_traits<Comm>::exchange_messages;

/// Pack stage of the message path: packs only the pieces that are not in place (pack_staged).
template <class Exec>
void pack_pieces(const Plan& plan, Direction dir, Exec& exec, const BufferTable& buffers, int stage = 0) {
  detail::run_list(exec, MessagesTransport::pack_list(plan, dir, stage), buffers);
}
/// Exchange stage of the message path (transport/messages.hpp): one message per piece, from the
/// input or into the output where in place. No allocation after the communicator's first call
/// (its ExchangeState keeps the message lists). @throws as stage_exchange().
template <class Comm>
void exchange_pieces(const Plan& plan, Direction dir, Comm& comm, const BufferTable& buffers, int stage = 0) {
  detail::exchange_messages_on(Path::messages, plan, dir, comm, buffers, stage);
}
/// Unpack stage of the message path: the pieces that are not in place, this rank's own chunk and
/// the sums (unpack_staged).
template <class Exec>
void unpack_pieces(const Plan& plan, Direction dir, Exec& exec, const BufferTable& buffers, int stage = 0) {
  detail::run_list(exec, MessagesTransport::unpack_list(plan, dir, stage), buffers);
}
/// Whether redistribute() takes the message path for this plan, communicator type and executor
/// type (choose_path() gives Path::messages). Its stages are then pack_pieces(),
/// exchange_pieces(), unpack_pieces(). @throws as choose_path().
template <class Comm, class Exec>
bool uses_pieces(const Plan& plan) {
  return choose_path<Comm, Exec>(plan) == Path::messages;
}
/// Exchange stage of the two-level path (transport/two_level.hpp): three rounds of
/// exchange_messages() between the pack and the unpack of the all-to-all-v path; every rank calls
/// every round. @throws as stage_exchange(); Error(path_unsupported) for a plan without a
/// two-level layout.
template <class Comm>
void exchange_two_level(const Plan& plan, Direction dir, Comm& comm, const BufferTable& buffers, int stage = 0) {
  detail::exchange_messages_on(Path::two_level, plan, dir, comm, buffers, stage);
}

/// The peer copy (Path::direct, transport/peer_copy.hpp) of direction `dir`, all stages at once:
/// every rank copies its share of every peer's input straight into its own outputs (one copy
/// per element, no workspace, no wire), between two synchronisations of the group. Before a
/// plan's first exchange on this communicator, check_agreement() when enabled; before its first
/// peer copy, one all-gather of the ranks' layouts (LayoutRecord), from which the lists are built
/// and kept in the communicator's ExchangeState (allocation, once).
/// @pre `buffers` from bind_buffers() (or with no workspace); PathSupport<Comm, Exec>::direct.
/// @throws as stage_exchange(); Error(plan_mismatch) when a peer's layouts do not fit this rank's plan.
/// `stage` -1: every stage at once; else that stage alone (a head band; a host executor).
template <class Comm, class Exec>
void exchange_direct(const Plan& plan, Direction dir, Comm& comm, Exec& exec, const BufferTable& buffers, int stage = -1) {
  static_assert(PathSupport<Comm, Exec>::direct, "exchange_direct needs with_peers(), allgather() and an executor of the same memory");
  detail::before_exchange(plan, comm);
  PeerCopyTransport::exchange(plan, dir, comm, exec, buffers, stage);
}

/// Redistributes the plan's tensors in direction `dir` over the path choose_path() gives (see
/// transport.hpp): direct (ranks sharing memory copy each element once, input to output; no
/// workspace needed), messages (one message per (peer, tensor); pieces contiguous in the user's
/// tensors skip their pack or unpack copy; see exchange_pieces()), or alltoallv (pack, one
/// all-to-all-v of the wire, unpack). Same bytes on every path.
///
/// Every rank of the group calls it with the same plan inputs. Before a plan's first exchange the
/// ranks compare what they planned (check_agreement(), one small all-gather). No allocation other
/// than that and the argument checks' small vectors; host executors return when done, CUDA ones
/// when enqueued.
/// @throws everything bind_buffers() and exchange() throw, and Error(comm_mismatch) for a
///         stream-ordered executor on another stream than the communicator's; all argument errors
///         are raised before the exchange. An error of this rank alone (anything but aborted and
///         plan_mismatch) breaks the group first where the communicator can carry it (its abort():
///         LocalGroup, MpiComm, MpiWindowComm, NcclComm, the device groups), so that the peers throw
///         Error(aborted) naming this rank and its code at once (comm/tell_peers.hpp).
///
/// `transforms` (optional): the call's row transforms (layout/transform.hpp: RoPE, a scale, your
/// own), applied in the copy to the tensors planned with TensorSpec::with_row_transforms():
/// on pack as rows are read from `in`, on unpack as they are written into `out`. Same bits on
/// every path. Errors: bind_transforms().
template <class Comm, class Exec>
void redistribute(const Plan& plan, Direction dir, Comm& comm, Exec& exec, const TensorList<ConstByteSpan>& in,
                  const TensorList<ByteSpan>& out, Workspace ws, const RowTransforms* transforms = nullptr) {
  detail::refuse_beside_worker(comm, detail::call_name(dir));
  detail::begin_call(comm, detail::call_name(dir), detail::exchange_word(plan, dir, transforms));
  detail::tell_peers_on_failure(comm, plan.rank(), detail::call_name(dir), [&] {
    detail::run_part(detail::bind_part(plan, dir, comm, exec, in, out, ws, StageRange::all(), transforms), comm, exec);
  });
}

namespace detail {
template <class Comm, class Exec>
void run_part(const ExchangePart& p, Comm& comm, Exec& exec) {
  if constexpr (PathSupport<Comm, Exec>::direct) {
    if (p.path == Path::direct && p.stages.count == p.plan->num_stages()) return exchange_direct(*p.plan, p.dir, comm, exec, p.table);
    if (p.path == Path::direct) {
      for (int k = p.stages.first; k < p.stages.first + p.stages.count; ++k) exchange_direct(*p.plan, p.dir, comm, exec, p.table, k);
      return;
    }
  }
  for (int k = p.stages.first; k < p.stages.first + p.stages.count; ++k) {
    run_list(exec, pack_list(*p.plan, p.dir, p.path, k), p.table);
    stage_exchange(*p.plan, p.dir, p.path, comm, p.table, k);
    run_list(exec, unpack_list(*p.plan, p.dir, p.path, k), p.table);
  }
}
}  // namespace detail

/// seq→head (forward, before attention): seq-sharded inputs [B, S_r, H, D] → head-sharded
/// outputs [B, S, H_r, D], all tensors in one exchange; a head several ranks need (GQA/MQA kv
/// heads when Hkv < P) is sent to each of them. See redistribute().
template <class Comm, class Exec>
void seq_to_head(const Plan& plan, Comm& comm, Exec& exec, const TensorList<ConstByteSpan>& in, const TensorList<ByteSpan>& out,
                 Workspace ws) {
  redistribute(plan, Direction::seq_to_head, comm, exec, in, out, ws);
}
/// seq_to_head() with row transforms (layout/transform.hpp), applied in the copy to the tensors
/// planned for them. @throws as redistribute() (bind_transforms()).
template <class Comm, class Exec>
void seq_to_head(const Plan& plan, Comm& comm, Exec& exec, const TensorList<ConstByteSpan>& in, const TensorList<ByteSpan>& out,
                 Workspace ws, const RowTransforms& transforms) {
  redistribute(plan, Direction::seq_to_head, comm, exec, in, out, ws, &transforms);
}

/// head→seq (forward, after attention): head-sharded inputs [B, S, H_r, D] → seq-sharded outputs
/// [B, S_r, H, D]. A head held by several ranks is summed over its holders (Replicas::sum, the
/// default: then this is the adjoint of seq_to_head) or taken from its owner (Replicas::owner:
/// then this is the inverse of seq_to_head). For the attention output o (disjoint query heads)
/// both are the same. See redistribute().
template <class Comm, class Exec>
void head_to_seq(const Plan& plan, Comm& comm, Exec& exec, const TensorList<ConstByteSpan>& in, const TensorList<ByteSpan>& out,
                 Workspace ws) {
  redistribute(plan, Direction::head_to_seq, comm, exec, in, out, ws);
}
/// head_to_seq() with row transforms (layout/transform.hpp), applied in the copy to the tensors
/// planned for them. @throws as redistribute() (bind_transforms()).
template <class Comm, class Exec>
void head_to_seq(const Plan& plan, Comm& comm, Exec& exec, const TensorList<ConstByteSpan>& in, const TensorList<ByteSpan>& out,
                 Workspace ws, const RowTransforms& transforms) {
  redistribute(plan, Direction::head_to_seq, comm, exec, in, out, ws, &transforms);
}

/// The backward of seq_to_head (its adjoint; DeepSpeed-Ulysses' backward of the first
/// all-to-all): head-sharded gradients [B, S, H_r, D] (dq, dk, dv from the attention backward) →
/// seq-sharded gradients [B, S_r, H, D]. Where seq_to_head copied a head to several ranks (kv heads
/// under GQA/MQA with Hkv < P, or the shared boundary head of balanced splits), each holder's
/// partial gradient is added, in ascending rank order (element.hpp: 16-bit types in float32,
/// rounded once). It is head→seq of the same plan, which must sum its replicas (Replicas::sum,
/// the default).
/// @throws Error(not_adjoint) a tensor with replicated heads has Replicas::owner (checked before
///         anything moves, on every rank alike); otherwise as redistribute().
template <class Comm, class Exec>
void seq_to_head_backward(const Plan& plan, Comm& comm, Exec& exec, const TensorList<ConstByteSpan>& grad_head,
                          const TensorList<ByteSpan>& grad_seq, Workspace ws) {
  detail::require_adjoint(plan, "seq_to_head_backward");
  redistribute(plan, Direction::head_to_seq, comm, exec, grad_head, grad_seq, ws);
}
/// seq_to_head_backward() with row transforms (e.g. the inverse RoPE of dq and dk on unpack).
/// @throws as seq_to_head_backward() and redistribute() (bind_transforms()).
template <class Comm, class Exec>
void seq_to_head_backward(const Plan& plan, Comm& comm, Exec& exec, const TensorList<ConstByteSpan>& grad_head,
                          const TensorList<ByteSpan>& grad_seq, Workspace ws, const RowTransforms& transforms) {
  detail::require_adjoint(plan, "seq_to_head_backward");
  redistribute(plan, Direction::head_to_seq, comm, exec, grad_head, grad_seq, ws, &transforms);
}

/// The backward of head_to_seq (its adjoint): seq-sharded gradients [B, S_r, H, D] (do) →
/// head-sharded gradients [B, S, H_r, D]: seq→head of the same plan (which copies a replicated
/// head to every holder, the adjoint of summing them).
/// @throws Error(not_adjoint) a tensor with replicated heads has Replicas::owner (the adjoint of
///         taking the owner's copy is not seq→head); otherwise as redistribute().
template <class Comm, class Exec>
void head_to_seq_backward(const Plan& plan, Comm& comm, Exec& exec, const TensorList<ConstByteSpan>& grad_seq,
                          const TensorList<ByteSpan>& grad_head, Workspace ws) {
  detail::require_adjoint(plan, "head_to_seq_backward");
  redistribute(plan, Direction::seq_to_head, comm, exec, grad_seq, grad_head, ws);
}
/// head_to_seq_backward() with row transforms (e.g. the inverse RoPE of dq and dk on unpack).
/// @throws as head_to_seq_backward() and redistribute() (bind_transforms()).
template <class Comm, class Exec>
void head_to_seq_backward(const Plan& plan, Comm& comm, Exec& exec, const TensorList<ConstByteSpan>& grad_seq,
                          const TensorList<ByteSpan>& grad_head, Workspace ws, const RowTransforms& transforms) {
  detail::require_adjoint(plan, "head_to_seq_backward");
  redistribute(plan, Direction::seq_to_head, comm, exec, grad_seq, grad_head, ws, &transforms);
}

/// The direction that runs the backward of direction d (seq_to_head ↔ head_to_seq), for engines
/// that drive redistribute() or a pipeline with a Direction; valid when
/// Plan::first_non_adjoint_tensor() < 0.
constexpr Direction backward_of(Direction d) {
  return d == Direction::seq_to_head ? Direction::head_to_seq : Direction::seq_to_head;
}

/// One-tensor seq_to_head: `in` and `out` are the plan's only tensor (a span, or a contiguous
/// range such as a std::vector). @throws as seq_to_head().
template <class Comm, class Exec>
void seq_to_head(const Plan& plan, Comm& comm, Exec& exec, ConstByteSpan in, ByteSpan out, Workspace ws) {
  redistribute(plan, Direction::seq_to_head, comm, exec, TensorList<ConstByteSpan>{in}, TensorList<ByteSpan>{out}, ws);
}
/// One-tensor head_to_seq. @throws as head_to_seq().
template <class Comm, class Exec>
void head_to_seq(const Plan& plan, Comm& comm, Exec& exec, ConstByteSpan in, ByteSpan out, Workspace ws) {
  redistribute(plan, Direction::head_to_seq, comm, exec, TensorList<ConstByteSpan>{in}, TensorList<ByteSpan>{out}, ws);
}
/// One-tensor seq_to_head_backward. @throws as seq_to_head_backward().
template <class Comm, class Exec>
void seq_to_head_backward(const Plan& plan, Comm& comm, Exec& exec, ConstByteSpan grad_head, ByteSpan grad_seq, Workspace ws) {
  seq_to_head_backward(plan, comm, exec, TensorList<ConstByteSpan>{grad_head}, TensorList<ByteSpan>{grad_seq}, ws);
}
/// One-tensor head_to_seq_backward. @throws as head_to_seq_backward().
template <class Comm, class Exec>
void head_to_seq_backward(const Plan& plan, Comm& comm, Exec& exec, ConstByteSpan grad_seq, ByteSpan grad_head, Workspace ws) {
  head_to_seq_backward(plan, comm, exec, TensorList<ConstByteSpan>{grad_seq}, TensorList<ByteSpan>{grad_head}, ws);
}

ULYSSES_NAMESPACE_END
