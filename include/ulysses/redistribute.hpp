// SPDX-License-Identifier: Apache-2.0
/// @file redistribute.hpp
/// @brief seq_to_head / head_to_seq over any communicator and executor: pack → exchange → unpack.
///
/// Follows DeepSpeed-Ulysses (Jacobs et al., arXiv:2309.14509): before attention an all-to-all
/// turns seq-sharded q, k, v into head-sharded ones (scatter heads, gather sequence); after it,
/// the inverse all-to-all returns the output to the seq sharding. Unlike DeepSpeed, q, k and v
/// (with their own head counts under GQA) travel in ONE all-to-all.
///
/// Communicator concept — a type C used here must provide:
/// - `int C::size() const` and `int C::rank() const`: the group's degree and this member's rank;
/// - `void C::alltoallv(const std::byte* send, const std::size_t* send_bytes,
///       const std::size_t* send_offsets, std::byte* recv, const std::size_t* recv_bytes,
///       const std::size_t* recv_offsets)`: collective over the group; every array has size()
///   entries indexed by peer rank, in bytes; the chunk for peer p is
///   `[send + send_offsets[p], + send_bytes[p])`, and what p sends to this rank lands at
///   `recv + recv_offsets[p]`. Zero-byte pairs occur (the own chunk is always 0) and must not
///   hang. On return (or, for stream-ordered backends, in stream order) the data is in place.
///   Errors are thrown as ulysses::Error(backend). Shipped: LocalGroup::Comm (comm/local.hpp),
///   MpiComm (comm/mpi.hpp), NcclComm (comm/nccl.cuh).
/// - optionally `void C::exchange_messages(const Message* send, std::size_t n_send,
///       const Message* recv, std::size_t n_recv)`: collective; this rank sends each message of
///   `send` to its peer and receives each message of `recv` from its peer, into its `data`. The
///   k-th message rank i sends to rank j is the k-th message rank j receives from rank i (same
///   byte count). Messages never go to the rank itself; every rank calls it, even with empty
///   lists. (Parameters of type `Message*` work too.) With it, redistribute() on a host
///   executor sends one message per (peer, tensor), straight from / into the user's tensors where
///   they are contiguous (PlanOptions::direct_pieces). Shipped: LocalGroup::Comm, MpiComm.
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

#include "copy.hpp"
#include "error.hpp"
#include "plan.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Caller-owned scratch memory of at least Plan::workspace_bytes() bytes (host memory for the host
/// executor, device memory for the CUDA one). Its start must be aligned to 16 bytes for the CUDA
/// executor's widest copies (any alignment is correct, narrower copies are taken otherwise).
struct Workspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

/// The base pointers of the plan's tensors (q, k, v, ...) in the plan's order, held by value
/// (at most kMaxTensors; more is reported as Error(wrong_tensor_count) by the calls).
template <class Ptr>
struct TensorList {
  Ptr data[kMaxTensors] = {};
  std::size_t size = 0;
  TensorList() = default;
  TensorList(std::initializer_list<Ptr> l) : TensorList(l.begin(), l.size()) {}
  /// From an array of n pointers.
  TensorList(const Ptr* d, std::size_t n) : size(n) {
    for (std::size_t i = 0; i < n && i < static_cast<std::size_t>(kMaxTensors); ++i) data[i] = d[i];
  }
};

namespace detail {

/// One dimension of the search below: the range of the index difference i - j (i an index of the
/// first view, j of the second) and the stride both views share there.
struct DiffDim {
  std::int64_t lo, hi, s;
};

/// Depth-first search over the index difference of dimension k (dims sorted by stride, largest
/// first; the remaining dims k..n-1 reach offsets in [rest_lo[k], rest_hi[k]]). `budget` bounds
/// the work.
inline bool diff_search(const DiffDim* d, const std::int64_t* rest_lo, const std::int64_t* rest_hi, int n, int k,
                        std::int64_t rem, int& budget) {
  if (--budget < 0) return true;  // give up: answer "reachable" (conservative)
  if (k >= n || k >= 4) return rem == 0;
  auto floor_div = [](std::int64_t a, std::int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); };
  const std::int64_t s = d[k].s;
  // rem - j*s must stay within what dims k+1.. can reach.
  const std::int64_t lo = std::max(d[k].lo, -floor_div(rest_hi[k + 1] - rem, s));
  const std::int64_t hi = std::min(d[k].hi, floor_div(rem - rest_lo[k + 1], s));
  for (std::int64_t j = lo; j <= hi; ++j)
    if (diff_search(d, rest_lo, rest_hi, n, k + 1, rem - j * s, budget)) return true;
  return false;
}

/// Whether two layouts have the same stride in every dimension where either has more than one
/// index (the condition of the exact test below; e.g. q, k, v views of one fused buffer).
inline bool same_strides(const Layout& a, const Layout& b) {
  for (int i = 0; i < 4; ++i)
    if (a.extent[i] > 1 && b.extent[i] > 1 && a.stride[i] != b.stride[i]) return false;
  return true;
}

/// True when some element offset difference x - y (x an offset of `a`, y of `b`) equals `delta`,
/// for injective layouts with the same strides: the strides, sorted, are nested, so each dimension
/// leaves at most a few candidates for its index difference. Answers true (conservatively) if the
/// search would branch more than a small budget.
inline bool offset_difference_reachable(const Layout& a, const Layout& b, std::int64_t delta) {
  DiffDim d[4] = {};
  int n = 0;
  for (int i = 0; i < 4; ++i) {
    if (a.extent[i] < 1 || b.extent[i] < 1) return false;  // an empty view shares nothing
    if (a.extent[i] == 1 && b.extent[i] == 1) continue;
    const DiffDim x{-(b.extent[i] - 1), a.extent[i] - 1, a.extent[i] > 1 ? a.stride[i] : b.stride[i]};
    int k = n++;  // insertion by stride, largest first
    for (; k > 0 && d[k - 1].s < x.s; --k) d[k] = d[k - 1];
    d[k] = x;
  }
  std::int64_t rest_lo[5] = {0, 0, 0, 0, 0}, rest_hi[5] = {0, 0, 0, 0, 0};
  for (int k = n - 1; k >= 0; --k) {
    rest_lo[k] = rest_lo[k + 1] + d[k].lo * d[k].s;
    rest_hi[k] = rest_hi[k + 1] + d[k].hi * d[k].s;
  }
  int budget = 64;
  return diff_search(d, rest_lo, rest_hi, n, 0, delta, budget);
}

/// Whether views with layouts `la` at `a` and `lb` at `b` (elements of e bytes) share a byte.
/// Exact for layouts with the same strides (same_strides()); otherwise true whenever their byte
/// spans meet (the caller's test).
inline bool views_overlap(const Layout& la, const std::byte* a, const Layout& lb, const std::byte* b, std::size_t e) {
  if (!same_strides(la, lb)) return true;
  const std::int64_t delta = static_cast<std::int64_t>(b - a), E = static_cast<std::int64_t>(e);
  const std::int64_t q = delta / E - (delta % E < 0);  // floor
  // Elements at a + E*x and b + E*y overlap iff |delta + E*(y - x)| < E.
  if (delta % E == 0) return offset_difference_reachable(la, lb, q);
  return offset_difference_reachable(la, lb, q) || offset_difference_reachable(la, lb, q + 1);
}

inline std::size_t align_of_elem(std::size_t e) {
  std::size_t a = 1;
  while (a < 16 && e % (a * 2) == 0) a *= 2;
  return a;
}

/// Checks the call's arguments against the plan and fills the buffer table. The checks are
/// local to this rank (the plan has made the global ones) and allocate nothing unless they fail.
/// @throws Error(wrong_tensor_count, workspace_too_small, misaligned, buffer_overlap, invalid_shape)
inline BufferTable make_table(const Plan& plan, Direction dir, const TensorList<const void*>& in,
                              const TensorList<void*>& out, Workspace ws) {
  const int T = plan.num_tensors();
  if (in.size != static_cast<std::size_t>(T) || out.size != static_cast<std::size_t>(T))
    fail(Errc::wrong_tensor_count, std::to_string(in.size) + " inputs and " + std::to_string(out.size) +
                                       " outputs given; the plan moves " + std::to_string(T) + " tensors");
  if (ws.bytes < plan.workspace_bytes() || (plan.workspace_bytes() && !ws.data))
    fail(Errc::workspace_too_small, "workspace of " + std::to_string(ws.bytes) + " bytes at " +
                                        (ws.data ? "a valid address" : "null") + "; the plan needs " +
                                        std::to_string(plan.workspace_bytes()) + " bytes (Plan::workspace_bytes())");
  // Byte ranges: inputs 0..T-1, outputs T..2T-1, the workspace 2T.
  struct Range {
    const std::byte* p;
    std::size_t n;
  };
  Range range[2 * kMaxTensors + 1];
  auto name = [T](int i) {
    return i < T ? "input " + std::to_string(i) : i < 2 * T ? "output " + std::to_string(i - T) : std::string("the workspace");
  };
  BufferTable tab;
  for (int i = 0; i < 2 * T; ++i) {
    const int t = i % T;
    const bool is_in = i < T;
    const auto* p = is_in ? static_cast<const std::byte*>(in.data[t]) : static_cast<const std::byte*>(out.data[t]);
    const std::size_t n = is_in ? plan.input_bytes(dir, t) : plan.output_bytes(dir, t);
    const std::size_t e = plan.tensor(t).elem_bytes;
    if (n && !p) fail(Errc::invalid_shape, name(i) + " is null but holds " + std::to_string(n) + " bytes");
    if (reinterpret_cast<std::uintptr_t>(p) % align_of_elem(e))
      fail(Errc::misaligned, name(i) + " is not aligned to its element size of " + std::to_string(e) + " bytes");
    range[i] = {p, n};
    tab.base[is_in ? Buffer::input(t) : Buffer::output(t)] = const_cast<std::byte*>(p);
  }
  auto* w = static_cast<std::byte*>(ws.data);
  range[2 * T] = {w, plan.workspace_bytes()};
  // Every output against every other range, every input against the workspace. Byte spans that
  // meet are an overlap, except views with the same strides interleaved without sharing a byte
  // (q, k, v gradients written into one fused [B, S, 3, H, D] or [B, S, H + 2*Hkv, D] buffer),
  // which an exact test clears.
  auto layout_of = [&](int i) -> const Layout& {
    const int t = i % T;
    return (i < T) == (dir == Direction::seq_to_head) ? plan.seq_layout(t) : plan.head_layout(t);
  };
  for (int i = 0; i < 2 * T; ++i)
    for (int j = i < T ? 2 * T : 0; j <= 2 * T; ++j) {  // inputs only against the workspace
      const Range &a = range[i], &o = range[j];
      if (j == i || !a.n || !o.n || !(a.p < o.p + o.n && o.p < a.p + a.n)) continue;
      if (j < 2 * T && plan.tensor(i % T).elem_bytes == plan.tensor(j % T).elem_bytes &&
          !views_overlap(layout_of(i), a.p, layout_of(j), o.p, plan.tensor(i % T).elem_bytes))
        continue;
      fail(Errc::buffer_overlap, name(i) + " [" + std::to_string(a.n) + " bytes] overlaps " + name(j) + " [" +
                                     std::to_string(o.n) + " bytes]; outputs and the workspace need their own memory");
    }
  tab.base[Buffer::send] = w;
  tab.base[Buffer::recv] = w ? w + plan.recv_region_offset() : nullptr;
  return tab;
}

template <class T>
void check_elem(const Plan& plan) {
  if (plan.tensor(0).elem_bytes != sizeof(T))
    fail(Errc::invalid_shape, "element type of " + std::to_string(sizeof(T)) + " bytes given; the plan was made for " +
                                  std::to_string(plan.tensor(0).elem_bytes) + "-byte elements");
}

template <class Comm>
void check_comm(const Plan& plan, const Comm& comm) {
  if (comm.size() != plan.degree() || comm.rank() != plan.rank())
    fail(Errc::comm_mismatch, "communicator has size " + std::to_string(comm.size()) + " and rank " +
                                  std::to_string(comm.rank()) + "; the plan was made for P=" + std::to_string(plan.degree()) +
                                  ", rank " + std::to_string(plan.rank()));
}

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

template <class E, class = void>
struct runs_on_host : std::false_type {};
template <class E>
struct runs_on_host<E, std::enable_if_t<E::runs_on_host>> : std::true_type {};

/// Whether redistribute() takes the message-level path for this communicator and executor.
template <class Comm, class Exec>
constexpr bool message_path_v = has_exchange_messages<Comm>::value && runs_on_host<Exec>::value;

}  // namespace detail

/// Cross-rank agreement: all-gathers every rank's Plan::fingerprint() and throws on EVERY rank
/// when they differ, naming the ranks whose inputs differ from rank 0's — instead of a hang or
/// silently wrong data in the exchange. Collective; call it after planning (redistribute() calls
/// it by itself before a plan's first exchange when Plan::check_agreement() is on). Needs the
/// communicator's optional `void allgather(const void* send, std::size_t bytes, void* recv)`
/// (LocalGroup::Comm and MpiComm have it); with a communicator without it, it does nothing.
/// @throws Error(plan_mismatch) the fingerprints differ; Error(comm_mismatch) as exchange().
template <class Comm>
void check_agreement(const Plan& plan, Comm& comm) {
  detail::check_comm(plan, comm);
  if constexpr (detail::has_allgather<Comm>::value) {
    const std::uint64_t mine = plan.fingerprint();
    std::vector<std::uint64_t> all(static_cast<std::size_t>(plan.degree()));
    comm.allgather(&mine, sizeof mine, all.data());
    std::vector<int> differ;
    for (int r = 1; r < plan.degree(); ++r)
      if (all[static_cast<std::size_t>(r)] != all[0]) differ.push_back(r);
    if (!differ.empty())
      detail::fail(Errc::plan_mismatch,
                   "ranks " + detail::join(differ) + " built their plans from other inputs than rank 0 (every rank "
                       "reports this; this is rank " + std::to_string(plan.rank()) + "); every rank must plan with the "
                       "same P, B, sequence partition, head partitions, head dims, element sizes, format, stages and direct_pieces");
  }
  plan.mark_agreement_checked();
}

namespace detail {
/// What every exchange stage does first: the cross-rank check before a plan's first exchange (when
/// Plan::check_agreement() is on), then the communicator's size and rank against the plan.
template <class Comm>
void before_exchange(const Plan& plan, Comm& comm) {
  if (plan.check_agreement() && !plan.agreement_checked()) check_agreement(plan, comm);
  check_comm(plan, comm);
}
}  // namespace detail

/// Pack stage: copies this rank's inputs into the send region of the workspace (wire format);
/// `stage` in [0, plan.num_stages()) selects the pipeline stage (all stages' regions are disjoint).
/// @pre `buffers` from make_buffers(); @throws nothing itself (executor errors propagate).
template <class Exec>
void pack(const Plan& plan, Direction dir, Exec& exec, const BufferTable& buffers, int stage = 0) {
  const Schedule& s = plan.schedule(dir, stage);
  exec.run(s.pack.data(), s.pack.size(), buffers);
}

/// Exchange stage: the all-to-all-v of the send region into the receive region. Before a plan's
/// first exchange, runs check_agreement() when Plan::check_agreement() is on.
/// @throws Error(comm_mismatch) communicator of another size or rank; Error(plan_mismatch) ranks
///         planned from different inputs; backend errors.
template <class Comm>
void exchange(const Plan& plan, Direction dir, Comm& comm, const BufferTable& buffers, int stage = 0) {
  detail::before_exchange(plan, comm);
  const Schedule& s = plan.schedule(dir, stage);
  comm.alltoallv(buffers.base[Buffer::send], s.send_bytes.data(), s.send_offsets.data(), buffers.base[Buffer::recv],
                 s.recv_bytes.data(), s.recv_offsets.data());
}

/// True when Comm has the optional exchange_messages() of the communicator concept.
template <class Comm>
inline constexpr bool has_exchange_messages_v = detail::has_exchange_messages<Comm>::value;

/// Whether redistribute() exchanges one message per (peer, tensor) for this plan, communicator
/// type and executor type: the communicator has exchange_messages(), the executor runs on the host
/// and PlanOptions::direct_pieces is on. Its stages are then pack_pieces(), exchange_pieces(),
/// unpack_pieces(); otherwise pack(), exchange(), unpack().
template <class Comm, class Exec>
bool uses_pieces(const Plan& plan) {
  return detail::message_path_v<Comm, Exec> && plan.options().direct_pieces;
}

/// Pack stage of the message-level path: packs only the pieces that are not direct
/// (Schedule::pack_staged) into the send region.
template <class Exec>
void pack_pieces(const Plan& plan, Direction dir, Exec& exec, const BufferTable& buffers, int stage = 0) {
  const Schedule& s = plan.schedule(dir, stage);
  exec.run(s.pack_staged.data(), s.pack_staged.size(), buffers);
}

/// Unpack stage of the message-level path: unpacks the pieces that are not direct and copies this
/// rank's own chunk (Schedule::unpack_staged).
template <class Exec>
void unpack_pieces(const Plan& plan, Direction dir, Exec& exec, const BufferTable& buffers, int stage = 0) {
  const Schedule& s = plan.schedule(dir, stage);
  exec.run(s.unpack_staged.data(), s.unpack_staged.size(), buffers);
}

/// Message-level exchange of one stage (PlanOptions::direct_pieces): one message per (peer,
/// tensor), sent from the user's input where the piece is contiguous there and from the send
/// region otherwise (after pack_staged), received into the output where contiguous and into the
/// receive region otherwise (before unpack_staged). Before a plan's first exchange, runs
/// check_agreement() when Plan::check_agreement() is on. Allocates only on a thread's first call
/// (two message lists, one entry per piece, reused afterwards).
/// @throws as exchange().
template <class Comm>
void exchange_pieces(const Plan& plan, Direction dir, Comm& comm, const BufferTable& buffers, int stage = 0) {
  static_assert(detail::has_exchange_messages<Comm>::value, "exchange_pieces needs a communicator with exchange_messages()");
  detail::before_exchange(plan, comm);
  const Schedule& s = plan.schedule(dir, stage);
  // The message lists live per thread and keep their capacity: no allocation after the first call.
  // (Non-const elements: a communicator may take Message* or const Message*.)
  thread_local std::vector<Message> send, recv;
  auto fill = [&buffers](std::vector<Message>& m, const std::vector<Piece>& pieces) {
    m.clear();
    for (const Piece& p : pieces) m.push_back({p.peer, buffers.base[p.buffer] + p.offset, p.bytes});
  };
  fill(send, s.send_pieces);
  fill(recv, s.recv_pieces);
  comm.exchange_messages(send.data(), send.size(), recv.data(), recv.size());
}

/// Unpack stage: copies the receive region into the outputs, and this rank's own chunk straight
/// from its inputs to its outputs.
template <class Exec>
void unpack(const Plan& plan, Direction dir, Exec& exec, const BufferTable& buffers, int stage = 0) {
  const Schedule& s = plan.schedule(dir, stage);
  exec.run(s.unpack.data(), s.unpack.size(), buffers);
}

/// Checks one call's pointers against the plan and returns the buffer table the stages run on.
///
/// @param in  the plan's tensors in order: seq-sharded [B, S_r, H, D] for seq_to_head,
///            head-sharded [B, S, H_r, D] for head_to_seq (in the plan's layouts)
/// @param out the other sharding, same order; must not overlap the inputs, each other or `ws`
/// @throws Error(wrong_tensor_count) list sizes differ from Plan::num_tensors();
///         Error(workspace_too_small) ws.bytes < Plan::workspace_bytes();
///         Error(misaligned) a pointer not aligned to its element size (up to 16 bytes);
///         Error(buffer_overlap) an output overlapping another buffer;
///         Error(invalid_shape) a null pointer for a non-empty tensor.
inline BufferTable make_buffers(const Plan& plan, Direction dir, const TensorList<const void*>& in,
                                const TensorList<void*>& out, Workspace ws) {
  return detail::make_table(plan, dir, in, out, ws);
}

/// Redistributes the plan's tensors in direction `dir`: pack, one exchange, unpack.
///
/// With a communicator that has exchange_messages(), a host executor and
/// PlanOptions::direct_pieces (the default), the exchange is one message per (peer, tensor) and
/// pieces contiguous in the user's tensors skip their pack or unpack copy (see exchange_pieces());
/// otherwise it is one all-to-all-v of the wire. Same bytes either way.
///
/// Every rank of the group calls it with the same plan inputs. No allocation other than the
/// argument checks' small vectors; host executors return when done, CUDA ones when enqueued.
/// @throws everything make_buffers() and exchange() throw; all argument errors are raised before
///         the exchange, but they are local to this rank (cross-rank agreement is the plan's job).
template <class Comm, class Exec>
void redistribute(const Plan& plan, Direction dir, Comm& comm, Exec& exec, TensorList<const void*> in,
                  TensorList<void*> out, Workspace ws) {
  detail::check_comm(plan, comm);
  const BufferTable t = make_buffers(plan, dir, in, out, ws);
  if constexpr (detail::message_path_v<Comm, Exec>) {
    if (uses_pieces<Comm, Exec>(plan)) {
      for (int k = 0; k < plan.num_stages(); ++k) {
        pack_pieces(plan, dir, exec, t, k);
        exchange_pieces(plan, dir, comm, t, k);
        unpack_pieces(plan, dir, exec, t, k);
      }
      return;
    }
  }
  for (int k = 0; k < plan.num_stages(); ++k) {  // stages one after the other; see HostPipeline to overlap them
    pack(plan, dir, exec, t, k);
    exchange(plan, dir, comm, t, k);
    unpack(plan, dir, exec, t, k);
  }
}

/// seq→head: seq-sharded inputs [B, S_r, H, D] → head-sharded outputs [B, S, H_r, D], all tensors
/// in one exchange. See redistribute().
template <class Comm, class Exec>
void seq_to_head(const Plan& plan, Comm& comm, Exec& exec, TensorList<const void*> in, TensorList<void*> out, Workspace ws) {
  redistribute(plan, Direction::seq_to_head, comm, exec, in, out, ws);
}

/// head→seq: head-sharded inputs [B, S, H_r, D] → seq-sharded outputs [B, S_r, H, D] (the inverse
/// of seq_to_head, and its backward). A head held by several ranks (GQA replication) is taken from
/// its lowest rank. See redistribute().
template <class Comm, class Exec>
void head_to_seq(const Plan& plan, Comm& comm, Exec& exec, TensorList<const void*> in, TensorList<void*> out, Workspace ws) {
  redistribute(plan, Direction::head_to_seq, comm, exec, in, out, ws);
}

/// One-tensor seq→head with a typed pointer. @throws Error(invalid_shape) when sizeof(T) differs
/// from the plan's element size; otherwise as redistribute().
template <class T, class Comm, class Exec>
void seq_to_head(const Plan& plan, Comm& comm, Exec& exec, const T* in, T* out, Workspace ws) {
  detail::check_elem<T>(plan);
  seq_to_head(plan, comm, exec, {static_cast<const void*>(in)}, {static_cast<void*>(out)}, ws);
}

/// One-tensor head→seq with a typed pointer. @throws as the one-tensor seq_to_head().
template <class T, class Comm, class Exec>
void head_to_seq(const Plan& plan, Comm& comm, Exec& exec, const T* in, T* out, Workspace ws) {
  detail::check_elem<T>(plan);
  head_to_seq(plan, comm, exec, {static_cast<const void*>(in)}, {static_cast<void*>(out)}, ws);
}

ULYSSES_NAMESPACE_END
