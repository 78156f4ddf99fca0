// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief seq_to_head / head_to_seq and their backwards over any communicator and executor:
///        pack → exchange → unpack.
///
/// Follows DeepSpeed-Ulysses (Jacobs et al., arXiv:2309.14509): before attention an all-to-all
/// turns seq-sharded q, k, v into head-sharded ones (scatter heads, gather sequence); after it,
/// the inverse all-to-all returns the output to the seq sharding. Unlike DeepSpeed, q, k and v
/// (with their own head counts under GQA) travel in ONE all-to-all.
///
/// Adjoints (what an autograd wiring calls in the backward pass):
///
///     forward        backward                 what the backward sums
///     seq_to_head    seq_to_head_backward     the copies of a head seq→head sent to several ranks
///                    (= head→seq, Replicas::sum)   (kv heads when Hkv < P), in ascending rank order
///     head_to_seq    head_to_seq_backward     nothing (it copies a replicated head to every holder)
///                    (= seq→head)
///
/// The communicator and executor concepts (what a type must provide, and the optional
/// capabilities that enable the message and direct paths) are in transport.hpp, with the one
/// function that chooses the path (choose_path()).
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

#include "layout/blocks.hpp"
#include "error.hpp"
#include "plan/plan.hpp"
#include "transport/path.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
template <class C, class P, class = void>
struct is_byte_range : std::false_type {};
template <class C, class P>
struct is_byte_range<C, P, std::void_t<decltype(std::declval<C&>().data()), decltype(std::declval<C&>().size())>>
    : std::is_convertible<decltype(std::declval<C&>().data()), P> {};
}  // namespace detail

/// A buffer the library reads: base pointer and size in bytes (at least what the plan needs:
/// Plan::input_bytes(); more is fine). Made from (pointer, bytes) or from any contiguous range
/// with data() and size() (std::vector<T>, std::array, std::span, ...: size() * sizeof(T) bytes).
struct ConstByteSpan {
  const void* data = nullptr;  ///< base pointer (the layout's element (0,0,0,0))
  std::size_t bytes = 0;       ///< bytes available from data
  ConstByteSpan() = default;
  ConstByteSpan(const void* d, std::size_t n) : data(d), bytes(n) {}
  template <class C, class = std::enable_if_t<detail::is_byte_range<const C, const void*>::value>>
  ConstByteSpan(const C& c) : data(c.data()), bytes(c.size() * sizeof(*c.data())) {}  // NOLINT: implicit by design
};

/// A buffer the library writes (or uses as scratch): base pointer and size in bytes. Made like
/// ConstByteSpan, from (pointer, bytes) or a non-const contiguous range.
struct ByteSpan {
  void* data = nullptr;   ///< base pointer
  std::size_t bytes = 0;  ///< bytes available from data
  ByteSpan() = default;
  ByteSpan(void* d, std::size_t n) : data(d), bytes(n) {}
  template <class C, class = std::enable_if_t<detail::is_byte_range<C, void*>::value && !std::is_const_v<C>>>
  ByteSpan(C& c) : data(c.data()), bytes(c.size() * sizeof(*c.data())) {}  // NOLINT: implicit by design
  operator ConstByteSpan() const { return {data, bytes}; }  ///< the same bytes, read-only
};

/// Caller-owned scratch memory of at least Plan::workspace_bytes() bytes (host memory for the host
/// executor, device memory for the CUDA one). Its start must be aligned to 16 bytes for the CUDA
/// executor's widest copies (any alignment is correct, narrower copies are taken otherwise).
using Workspace = ByteSpan;

/// The buffers of the plan's tensors (q, k, v, ...) in the plan's order, held by value (at most
/// kMaxTensors; more is reported as Error(wrong_tensor_count) by the calls). Span is
/// ConstByteSpan (inputs) or ByteSpan (outputs): `{q, k, v}` with q, k, v vectors, or
/// `{{q_ptr, q_bytes}, {k_ptr, k_bytes}, {v_ptr, v_bytes}}`.
template <class Span>
struct TensorList {
  Span data[kMaxTensors] = {};
  std::size_t size = 0;
  TensorList() = default;
  TensorList(std::initializer_list<Span> l) : TensorList(l.begin(), l.size()) {}
  /// From an array of n spans.
  TensorList(const Span* d, std::size_t n) : size(n) {
    for (std::size_t i = 0; i < n && i < static_cast<std::size_t>(kMaxTensors); ++i) data[i] = d[i];
  }
  /// From a list of spans convertible to Span (ByteSpan → ConstByteSpan).
  template <class S, class = std::enable_if_t<std::is_convertible_v<S, Span> && !std::is_same_v<S, Span>>>
  TensorList(const TensorList<S>& o) : size(o.size) {  // NOLINT: implicit by design
    for (std::size_t i = 0; i < static_cast<std::size_t>(kMaxTensors); ++i) data[i] = o.data[i];
  }
  /// Appends one span (at most kMaxTensors are kept; size counts them all).
  void push_back(Span s) {
    if (size < static_cast<std::size_t>(kMaxTensors)) data[size] = s;
    ++size;
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
/// @throws Error(wrong_tensor_count, workspace_too_small, buffer_too_small, misaligned,
///         buffer_overlap, invalid_shape)
/// `ws_needed`: the workspace bytes the path uses (Plan::workspace_bytes(), or 0 for the direct path).
inline BufferTable make_table(const Plan& plan, Direction dir, const TensorList<ConstByteSpan>& in,
                              const TensorList<ByteSpan>& out, Workspace ws, std::size_t ws_needed) {
  const int T = plan.num_tensors();
  if (in.size != static_cast<std::size_t>(T) || out.size != static_cast<std::size_t>(T))
    fail(Errc::wrong_tensor_count, std::to_string(in.size) + " inputs and " + std::to_string(out.size) +
                                       " outputs given; the plan moves " + std::to_string(T) + " tensors");
  if (ws.bytes < ws_needed || (ws_needed && !ws.data))
    fail(Errc::workspace_too_small, "workspace of " + std::to_string(ws.bytes) + " bytes at " +
                                        (ws.data ? "a valid address" : "null") + "; the plan needs " +
                                        std::to_string(plan.workspace_bytes()) + " bytes (Plan::workspace_bytes())");
  // Byte ranges: inputs 0..T-1, outputs T..2T-1, the workspace 2T.
  struct Range {
    const std::byte* p;
    std::size_t n;
  };
  Range range[2 * kMaxTensors + 1];
  const bool s2h = dir == Direction::seq_to_head;
  auto name = [T, s2h](int i) {
    if (i >= 2 * T) return std::string("the workspace");
    const bool is_in = i < T;
    return std::string(is_in ? "input " : "output ") + std::to_string(i % T) + " (tensor " + std::to_string(i % T) + ", " +
           (is_in == s2h ? "seq-sharded" : "head-sharded") + ")";
  };
  BufferTable tab;
  for (int i = 0; i < 2 * T; ++i) {
    const int t = i % T;
    const bool is_in = i < T;
    const auto* p = is_in ? static_cast<const std::byte*>(in.data[t].data) : static_cast<const std::byte*>(out.data[t].data);
    const std::size_t given = is_in ? in.data[t].bytes : out.data[t].bytes;
    const std::size_t n = is_in ? plan.input_bytes(dir, t) : plan.output_bytes(dir, t);
    const std::size_t e = plan.tensor(t).elem_bytes;
    if (given < n)
      fail(Errc::buffer_too_small, name(i) + " holds " + std::to_string(given) + " bytes; its layout " +
                                       (is_in == s2h ? plan.seq_layout(t) : plan.head_layout(t)).str() + " of " +
                                       std::to_string(e) + "-byte elements needs " + std::to_string(n) +
                                       " bytes (Plan::" + (is_in == s2h ? "seq_bytes" : "head_bytes") + "(" + std::to_string(t) +
                                       ")); are the tensors in the plan's order?");
    if (n && !p) fail(Errc::invalid_shape, name(i) + " is null but holds " + std::to_string(n) + " bytes");
    if (reinterpret_cast<std::uintptr_t>(p) % align_of_elem(e))
      fail(Errc::misaligned, name(i) + " is not aligned to its element size of " + std::to_string(e) + " bytes");
    range[i] = {p, n};
    tab.base[is_in ? Buffer::input(t) : Buffer::output(t)] = const_cast<std::byte*>(p);
  }
  auto* w = ws_needed ? static_cast<std::byte*>(ws.data) : nullptr;
  range[2 * T] = {w, ws_needed};
  // Every output against every other range, every input against the workspace. Byte spans that
  // meet are an overlap, except views with the same strides interleaved without sharing a byte
  // (q, k, v gradients written into one fused [B, S, 3, H, D] or [B, S, H + 2*Hkv, D] buffer),
  // which an exact test clears.
  auto layout_of = [&](int i) -> const Layout& {
    const int t = i % T;
    return (i < T) == s2h ? plan.seq_layout(t) : plan.head_layout(t);
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

template <class Comm>
void check_comm(const Plan& plan, const Comm& comm) {
  if (comm.size() != plan.degree() || comm.rank() != plan.rank())
    fail(Errc::comm_mismatch, "communicator has size " + std::to_string(comm.size()) + " and rank " +
                                  std::to_string(comm.rank()) + "; the plan was made for P=" + std::to_string(plan.degree()) +
                                  ", rank " + std::to_string(plan.rank()));
}

/// Throws Error(comm_mismatch) when both the communicator and the executor are stream-ordered and
/// on different streams (pack → exchange → unpack would not be ordered).
template <class Comm, class Exec>
void check_streams(const Comm& comm, const Exec& exec) {
  if constexpr (has_stream<Comm>::value && has_stream<Exec>::value) {
    if (!(comm.stream() == exec.stream()))
      fail(Errc::comm_mismatch, "the executor runs on another stream than the communicator exchanges on, so pack, exchange "
                                "and unpack would not be ordered: make both on the same stream");
  }
}

/// Whether check_agreement() can run on this communicator: it has allgather() (host memory), or
/// its alltoallv() takes host memory (it does not declare `device_memory = true`).
template <class Comm>
constexpr bool can_check_agreement_v = has_allgather<Comm>::value || !device_memory<Comm>::value;

/// The words of `a` that differ from `b`, as "the head partition of tensor 0, ..." (at most 4).
inline std::string differing_fields(const AgreementRecord& a, const AgreementRecord& b) {
  std::string out;
  int n = 0;
  for (int i = 0; i < kAgreementWords; ++i) {
    if (a[static_cast<std::size_t>(i)] == b[static_cast<std::size_t>(i)]) continue;
    if (n++ < 4) out += (out.empty() ? "" : ", ") + Plan::agreement_field(i);
  }
  if (n > 4) out += " and " + std::to_string(n - 4) + " more";
  return out;
}

}  // namespace detail

/// Cross-rank agreement: all-gathers every rank's Plan::agreement_record() (512 bytes: what
/// determines the wire — P, B, the sequence partition, head partitions, head dims, element sizes,
/// stages, path options, replica handling — and nothing a rank may choose alone, such as its
/// layouts or format) and throws on EVERY rank when they differ, naming the ranks whose records
/// differ from rank 0's and the fields, instead of a hang, a truncation or silently wrong data in
/// the exchange. Collective; redistribute() and the stage functions call it by themselves before
/// a plan's first exchange (Plan::check_agreement(), on by default in every build).
///
/// Uses the communicator's optional `void allgather(const void* send, std::size_t bytes, void*
/// recv)` (host memory; LocalGroup::Comm, MpiComm, NcclComm, DeviceLocalGroup::Comm have it), or
/// else its alltoallv() on host buffers. A communicator of device memory without allgather()
/// declares `static constexpr bool device_memory = true`, and the check is skipped for it.
/// @throws Error(plan_mismatch) the records differ; Error(comm_mismatch) as exchange(); the
///         communicator's errors.
template <class Comm>
void check_agreement(const Plan& plan, Comm& comm) {
  detail::check_comm(plan, comm);
  if constexpr (detail::can_check_agreement_v<Comm>) {
    const int P = plan.degree(), me = plan.rank();
    const AgreementRecord mine = plan.agreement_record();
    std::vector<AgreementRecord> all(static_cast<std::size_t>(P));
    if constexpr (detail::has_allgather<Comm>::value) {
      comm.allgather(mine.data(), sizeof mine, all.data());
    } else {  // an all-gather through alltoallv: every peer receives this rank's record
      std::vector<std::size_t> sb(static_cast<std::size_t>(P), sizeof mine), so(static_cast<std::size_t>(P), 0), rb = sb, ro = so;
      for (int p = 0; p < P; ++p) ro[static_cast<std::size_t>(p)] = static_cast<std::size_t>(p) * sizeof mine;
      sb[static_cast<std::size_t>(me)] = rb[static_cast<std::size_t>(me)] = 0;  // the own chunk stays empty
      all[static_cast<std::size_t>(me)] = mine;
      comm.alltoallv(reinterpret_cast<const std::byte*>(mine.data()), sb.data(), so.data(),
                     reinterpret_cast<std::byte*>(all.data()), rb.data(), ro.data());
    }
    std::string diff;
    int first = -1;
    for (int r = 1; r < P; ++r) {
      const std::string f = detail::differing_fields(all[static_cast<std::size_t>(r)], all[0]);
      if (f.empty()) continue;
      if (first < 0) first = r;
      if (diff.size() < 600) diff += (diff.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " in " + f;
    }
    if (first >= 0) {
      std::vector<int> differ;
      for (int r = 1; r < P; ++r)
        if (all[static_cast<std::size_t>(r)] != all[0]) differ.push_back(r);
      detail::fail(Errc::plan_mismatch,
                   "ranks " + detail::join(differ) + " planned another wire than rank 0 (every rank reports this; this is rank " +
                       std::to_string(me) + "): " + diff +
                       ". Every rank must plan with the same P, B, sequence partition, head partitions, head dims, element "
                       "sizes, stages, path options and replica handling (local layouts may differ)");
    }
  }
  plan.mark_agreement_checked();
}

namespace detail {
/// What every exchange stage does first: the cross-rank check before a plan's first exchange (when
/// Plan::check_agreement() is on), then the communicator's size and rank against the plan.
template <class Comm>
void before_exchange(const Plan& plan, Comm& comm) {
  check_comm(plan, comm);
  if (plan.check_agreement() && !plan.agreement_checked()) check_agreement(plan, comm);
}

/// One exchange_messages() call over a plan's lists (Piece or Hop: peer, buffer, offset, bytes),
/// with the buffers of `t`. The message lists live per thread and keep their capacity: no
/// allocation after the first call. (Non-const elements: a communicator may take Message* or
/// const Message*.)
template <class Comm, class Item>
void post_messages(Comm& comm, const BufferTable& t, const std::vector<Item>& send, const std::vector<Item>& recv) {
  thread_local std::vector<Message> s, r;
  auto fill = [&t](std::vector<Message>& m, const std::vector<Item>& items) {
    m.clear();
    for (const Item& i : items) m.push_back({i.peer, t.base[i.buffer] + i.offset, i.bytes});
  };
  fill(s, send);
  fill(r, recv);
  comm.exchange_messages(s.data(), s.size(), r.data(), r.size());
}

/// Throws Error(path_unsupported) when a flat exchange is asked of a plan laid out for the
/// two-level exchange (its chunks partly lie in gathered / received areas).
inline void require_flat(const Plan& plan, const char* what) {
  if (plan.two_level())
    fail(Errc::path_unsupported, std::string(what) + ": the plan lays out the two-level exchange (PlanOptions::nodes " +
                                     plan.nodes().str() + "); run it with exchange_two_level() (Path::two_level), or plan with "
                                     "PlanOptions::path = Path::alltoallv or messages for a flat exchange");
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
  detail::require_flat(plan, "exchange");
  detail::before_exchange(plan, comm);
  const Schedule& s = plan.schedule(dir, stage);
  comm.alltoallv(buffers.base[Buffer::send], s.send_bytes.data(), s.send_offsets.data(), buffers.base[Buffer::recv],
                 s.recv_bytes.data(), s.recv_offsets.data());
}

/// True when Comm has the optional exchange_messages() of the communicator concept.
template <class Comm>
inline constexpr bool has_exchange_messages_v = detail::has_exchange_messages<Comm>::value;

/// Whether redistribute() exchanges one message per (peer, tensor) for this plan, communicator
/// type and executor type (choose_path() gives Path::messages). Its stages are then pack_pieces(),
/// exchange_pieces(), unpack_pieces().
/// @throws as choose_path().
template <class Comm, class Exec>
bool uses_pieces(const Plan& plan) {
  return choose_path<Comm, Exec>(plan) == Path::messages;
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
  detail::require_flat(plan, "exchange_pieces");
  detail::before_exchange(plan, comm);
  const Schedule& s = plan.schedule(dir, stage);
  detail::post_messages(comm, buffers, s.send_pieces, s.recv_pieces);
}

/// Unpack stage: copies the receive region into the outputs, and this rank's own chunk straight
/// from its inputs to its outputs.
template <class Exec>
void unpack(const Plan& plan, Direction dir, Exec& exec, const BufferTable& buffers, int stage = 0) {
  const Schedule& s = plan.schedule(dir, stage);
  exec.run(s.unpack.data(), s.unpack.size(), buffers);
}

/// The block list the executor runs before (`before_exchange` true: the pack) or after (the
/// unpack) the exchange of stage `stage` on `path`: Schedule::pack / unpack on Path::alltoallv,
/// Schedule::pack_staged / unpack_staged on Path::messages (only the pieces that are not in place);
/// Path::two_level packs and unpacks as alltoallv.
/// Path::direct has no stages (exchange_direct() runs its one list). What redistribute(), the
/// pipelines and anything that times the phases run.
/// @pre path is alltoallv, messages or two_level.
inline const std::vector<BlockCopy>& stage_copies(const Plan& plan, Direction dir, Path path, bool before_exchange, int stage = 0) {
  const Schedule& s = plan.schedule(dir, stage);
  if (path == Path::messages) return before_exchange ? s.pack_staged : s.unpack_staged;
  return before_exchange ? s.pack : s.unpack;
}

/// The two-level exchange of one stage (Path::two_level, topology.hpp): three rounds of
/// exchange_messages() over the plan's Schedule::hop_send / hop_recv — the intra-node gather into
/// each node's forwarders, one message per ordered node pair between a forwarder and a receiver,
/// the intra-node delivery — between the pack and the unpack of the alltoallv path. Every rank calls
/// every round (with empty lists where it has nothing to move). Before a plan's first exchange,
/// runs check_agreement() when Plan::check_agreement() is on. Allocates only on a thread's first
/// call (two message lists, reused afterwards).
/// @pre `buffers` from make_buffers().
/// @throws as exchange(); Error(path_unsupported) for a plan without a two-level layout
///         (Plan::two_level() false).
template <class Comm>
void exchange_two_level(const Plan& plan, Direction dir, Comm& comm, const BufferTable& buffers, int stage = 0) {
  static_assert(detail::has_exchange_messages<Comm>::value, "exchange_two_level needs a communicator with exchange_messages()");
  if (!plan.two_level())
    detail::fail(Errc::path_unsupported, "exchange_two_level: the plan has no two-level layout (give PlanOptions::nodes, or "
                                         "PlanOptions::path = Path::two_level)");
  detail::before_exchange(plan, comm);
  const Schedule& s = plan.schedule(dir, stage);
  for (std::size_t round = 0; round < 3; ++round) detail::post_messages(comm, buffers, s.hop_send[round], s.hop_recv[round]);
}

/// The exchange of stage `stage` on `path`: exchange_pieces() on Path::messages,
/// exchange_two_level() on Path::two_level (the communicator must have exchange_messages()),
/// exchange() otherwise. @throws as exchange().
template <class Comm>
void stage_exchange(const Plan& plan, Direction dir, Path path, Comm& comm, const BufferTable& buffers, int stage = 0) {
  if constexpr (detail::has_exchange_messages<Comm>::value) {
    if (path == Path::messages) return exchange_pieces(plan, dir, comm, buffers, stage);
    if (path == Path::two_level) return exchange_two_level(plan, dir, comm, buffers, stage);
  }
  exchange(plan, dir, comm, buffers, stage);
}

/// Checks one call's buffers against the plan and returns the buffer table the stages run on.
///
/// @param plan the plan the stages will run
/// @param dir the direction (which side is input)
/// @param in  the plan's tensors in order: seq-sharded [B, S_r, H, D] for seq_to_head,
///            head-sharded [B, S, H_r, D] for head_to_seq (in the plan's layouts), each with its
///            size in bytes (at least Plan::input_bytes(dir, t))
/// @param out the other sharding, same order, sizes at least Plan::output_bytes(dir, t); must not
///            overlap the inputs, each other or `ws`
/// @param ws  at least Plan::workspace_bytes() bytes
/// @throws Error(wrong_tensor_count) list sizes differ from Plan::num_tensors();
///         Error(workspace_too_small) ws.bytes < Plan::workspace_bytes();
///         Error(buffer_too_small) a tensor's buffer is shorter than its layout's span (the
///         message names the tensor, the bytes given and the bytes needed);
///         Error(misaligned) a pointer not aligned to its element size (up to 16 bytes);
///         Error(buffer_overlap) an output overlapping another buffer;
///         Error(invalid_shape) a null pointer for a non-empty tensor.
inline BufferTable make_buffers(const Plan& plan, Direction dir, const TensorList<ConstByteSpan>& in,
                                const TensorList<ByteSpan>& out, Workspace ws) {
  return detail::make_table(plan, dir, in, out, ws, plan.workspace_bytes());
}

namespace detail {
/// Runs the direct transport's list with the peers' inputs: what with_peers() calls on each rank.
template <class Exec>
struct DirectWork {
  const std::vector<BlockCopy>* list;
  const BufferTable* table;
  Exec* exec;
  int P;
  static void run(void* ctx, const void* const* all) {
    const auto& w = *static_cast<const DirectWork*>(ctx);
    // peers[p * kMaxTensors + t] = rank p's input t; kept per thread (no allocation after the first call).
    thread_local std::vector<std::byte*> peers;
    peers.resize(static_cast<std::size_t>(w.P) * kMaxTensors);
    for (int p = 0; p < w.P; ++p)
      for (int t = 0; t < kMaxTensors; ++t)
        peers[static_cast<std::size_t>(p * kMaxTensors + t)] = static_cast<std::byte* const*>(all[p])[t];
    BufferTable t = *w.table;
    t.peers = peers.data();
    w.exec->run(w.list->data(), w.list->size(), t);
  }
};
}  // namespace detail

/// The direct transport (Path::direct) of direction `dir`, all stages at once: every rank copies
/// its share of every peer's input straight into its own outputs (one copy per element, no
/// workspace, no wire), between two synchronisations of the group (with_peers(): no rank reads a
/// peer's input before the peer has published it, and none returns while a peer may still read
/// its input). Before a plan's first exchange, check_agreement() when on; before its first direct
/// exchange, one all-gather of the ranks' layouts (LayoutRecord), from which the plan builds its
/// direct lists (allocation, once).
/// @pre `buffers` from make_buffers(); the communicator shares this process's memory
///      (PathSupport<Comm, Exec>::direct).
/// @throws as exchange(); Error(plan_mismatch) when a peer's layouts do not fit this rank's plan.
template <class Comm, class Exec>
void exchange_direct(const Plan& plan, Direction dir, Comm& comm, Exec& exec, const BufferTable& buffers) {
  static_assert(PathSupport<Comm, Exec>::direct, "exchange_direct needs with_peers(), allgather() and an executor of the same memory");
  detail::before_exchange(plan, comm);
  if (!plan.has_direct_lists()) {
    const LayoutRecord mine = plan.layout_record();
    std::vector<LayoutRecord> all(static_cast<std::size_t>(plan.degree()));
    comm.allgather(&mine, sizeof mine, all.data());
    plan.set_peer_layouts(all.data());
  }
  if constexpr (detail::has_prepare_direct<Exec>::value) {
    const std::vector<BlockCopy>& s2h = plan.direct_list(Direction::seq_to_head);
    const std::vector<BlockCopy>& h2s = plan.direct_list(Direction::head_to_seq);
    exec.prepare_direct({s2h.data(), s2h.size()}, {h2s.data(), h2s.size()}, plan.degree());
  }
  std::byte* inputs[kMaxTensors] = {};
  for (int t = 0; t < plan.num_tensors(); ++t) inputs[t] = buffers.base[Buffer::input(t)];
  detail::DirectWork<Exec> work{&plan.direct_list(dir), &buffers, &exec, plan.degree()};
  comm.with_peers(inputs, &detail::DirectWork<Exec>::run, &work);
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
/// @throws everything make_buffers() and exchange() throw, and Error(comm_mismatch) for a
///         stream-ordered executor on another stream than the communicator's; all argument errors
///         are raised before the exchange, but they are local to this rank (what every rank must
///         share is compared by check_agreement() at the first exchange).
template <class Comm, class Exec>
void redistribute(const Plan& plan, Direction dir, Comm& comm, Exec& exec, const TensorList<ConstByteSpan>& in,
                  const TensorList<ByteSpan>& out, Workspace ws) {
  detail::check_comm(plan, comm);
  detail::check_streams(comm, exec);
  const Path path = choose_path<Comm, Exec>(plan);
  const BufferTable t = detail::make_table(plan, dir, in, out, ws, path == Path::direct ? 0 : plan.workspace_bytes());
  if constexpr (PathSupport<Comm, Exec>::direct) {
    if (path == Path::direct) return exchange_direct(plan, dir, comm, exec, t);
  }
  for (int k = 0; k < plan.num_stages(); ++k) {  // stages one after the other; see HostPipeline to overlap them
    const std::vector<BlockCopy>& before = stage_copies(plan, dir, path, true, k);
    exec.run(before.data(), before.size(), t);
    stage_exchange(plan, dir, path, comm, t, k);
    const std::vector<BlockCopy>& after = stage_copies(plan, dir, path, false, k);
    exec.run(after.data(), after.size(), t);
  }
}

/// seq→head (forward, before attention): seq-sharded inputs [B, S_r, H, D] → head-sharded
/// outputs [B, S, H_r, D], all tensors in one exchange; a head several ranks need (GQA/MQA kv
/// heads when Hkv < P) is sent to each of them. See redistribute().
template <class Comm, class Exec>
void seq_to_head(const Plan& plan, Comm& comm, Exec& exec, const TensorList<ConstByteSpan>& in, const TensorList<ByteSpan>& out,
                 Workspace ws) {
  redistribute(plan, Direction::seq_to_head, comm, exec, in, out, ws);
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
