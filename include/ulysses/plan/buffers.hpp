// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief A call's buffers: TensorList and Workspace (over layout/byte_span.hpp's spans), and
///        bind_buffers(), which checks them against a plan (count, sizes, alignment, overlaps)
///        and binds them to the plan's buffer indices: what redistribute.hpp's calls run on
///        (docs/guide.md, "Errors").
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "../error.hpp"
#include "../layout/algebra.hpp"
#include "../layout/blocks.hpp"
#include "../layout/byte_span.hpp"
#include "plan.hpp"

ULYSSES_NAMESPACE_BEGIN

// ConstByteSpan, ByteSpan, span_from(): layout/byte_span.hpp.

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

inline std::size_t align_of_elem(std::size_t e) {
  std::size_t a = 1;
  while (a < 16 && e % (a * 2) == 0) a *= 2;
  return a;
}

/// The byte ranges of one call's buffers: inputs 0..T-1, outputs T..2T-1, the workspace 2T, with
/// their names for messages. What bind_table() checks.
struct CallBuffers {
  struct Range {
    const std::byte* p = nullptr;
    std::size_t n = 0;
  };
  Range range[2 * kMaxTensors + 1];
  int T = 0;
  bool s2h = true;
  /// "input 1 (tensor 1, seq-sharded)", "the workspace".
  std::string name(int i) const {
    if (i >= 2 * T) return "the workspace";
    const bool is_in = i < T;
    return std::string(is_in ? "input " : "output ") + std::to_string(i % T) + " (tensor " + std::to_string(i % T) + ", " +
           (is_in == s2h ? "seq-sharded" : "head-sharded") + ")";
  }
  /// The layout of buffer i (the seq-sharded or head-sharded layout of its tensor).
  const Layout& layout(const Plan& plan, int i) const { return (i < T) == s2h ? plan.seq_layout(i % T) : plan.head_layout(i % T); }
};

/// Checks buffer i of a call (input or output) against its element size (given as a range of
/// range_elem-byte elements; 0: bytes), its size, null pointer and alignment.
/// @throws Error(tensor_mismatch, buffer_too_small, invalid_shape, misaligned)
inline void check_buffer(const Plan& plan, Direction dir, const CallBuffers& b, int i, std::size_t given, std::size_t range_elem) {
  const int t = i % b.T;
  const bool is_in = i < b.T;
  const std::size_t n = b.range[i].n, e = plan.tensor(t).elem_bytes;
  const ElementType type = plan.tensor(t).type;
  check_range_element([&] { return b.name(i); }, range_elem, e, to_string(type), type == ElementType::opaque);
  if (given < n)
    fail(Errc::buffer_too_small, b.name(i) + " holds " + std::to_string(given) + " bytes; its layout " + b.layout(plan, i).str() +
                                     " of " + std::to_string(e) + "-byte elements needs " + std::to_string(n) + " bytes (Plan::" +
                                     (is_in == (dir == Direction::seq_to_head) ? "seq_bytes" : "head_bytes") + "(" +
                                     std::to_string(t) + ")); are the tensors in the plan's order?");
  if (n && !b.range[i].p) fail(Errc::invalid_shape, b.name(i) + " is null but holds " + std::to_string(n) + " bytes");
  if (reinterpret_cast<std::uintptr_t>(b.range[i].p) % align_of_elem(e))
    fail(Errc::misaligned, b.name(i) + " is not aligned to its element size of " + std::to_string(e) + " bytes");
}

/// Every output against every other range, every input against the workspace. Byte spans that
/// meet are an overlap, except views with the same strides interleaved without sharing a byte
/// (q, k, v gradients written into one fused [B, S, 3, H, D] or [B, S, H + 2*Hkv, D] buffer),
/// which an exact test clears (layout/algebra.hpp). @throws Error(buffer_overlap)
inline void check_overlaps(const Plan& plan, const CallBuffers& b) {
  const int T = b.T;
  for (int i = 0; i < 2 * T; ++i)
    for (int j = i < T ? 2 * T : 0; j <= 2 * T; ++j) {  // inputs only against the workspace
      const CallBuffers::Range &x = b.range[i], &y = b.range[j];
      if (j == i || !x.n || !y.n || !(x.p < y.p + y.n && y.p < x.p + x.n)) continue;
      const std::size_t e = plan.tensor(i % T).elem_bytes;
      if (j < 2 * T && e == plan.tensor(j % T).elem_bytes && !views_overlap(b.layout(plan, i), x.p, b.layout(plan, j), y.p, e))
        continue;
      fail(Errc::buffer_overlap, b.name(i) + " [" + std::to_string(x.n) + " bytes] overlaps " + b.name(j) + " [" +
                                     std::to_string(y.n) + " bytes]; outputs and the workspace need their own memory");
    }
}

/// Checks the call's arguments against the plan and fills the buffer table. The checks are
/// local to this rank (the plan has made the global ones) and allocate nothing unless they fail.
/// `ws_needed`: the workspace bytes the path uses (Plan::workspace_bytes(), or 0 for the peer copy).
/// @throws Error(wrong_tensor_count, workspace_too_small, tensor_mismatch, buffer_too_small,
///         misaligned, buffer_overlap, invalid_shape)
inline BufferTable bind_table(const Plan& plan, Direction dir, const TensorList<ConstByteSpan>& in,
                              const TensorList<ByteSpan>& out, Workspace ws, std::size_t ws_needed) {
  const int T = plan.num_tensors();
  if (in.size != static_cast<std::size_t>(T) || out.size != static_cast<std::size_t>(T))
    fail(Errc::wrong_tensor_count, std::to_string(in.size) + " inputs and " + std::to_string(out.size) +
                                       " outputs given; the plan moves " + std::to_string(T) + " tensors");
  if (ws.bytes < ws_needed)
    fail(Errc::workspace_too_small, "workspace of " + std::to_string(ws.bytes) + " bytes; the plan needs " +
                                        std::to_string(plan.workspace_bytes()) + " bytes (Plan::workspace_bytes())");
  if (ws_needed && !ws.data)  // (as a null tensor: invalid_shape)
    fail(Errc::invalid_shape, "the workspace is null but holds " + std::to_string(ws.bytes) + " bytes; the plan needs " +
                                  std::to_string(plan.workspace_bytes()) + " (Plan::workspace_bytes())");
  CallBuffers b;
  b.T = T;
  b.s2h = dir == Direction::seq_to_head;
  BufferTable tab;
  for (int i = 0; i < 2 * T; ++i) {
    const int t = i % T;
    const bool is_in = i < T;
    const auto* p = is_in ? static_cast<const std::byte*>(in.data[t].data) : static_cast<const std::byte*>(out.data[t].data);
    b.range[i] = {p, is_in ? plan.input_bytes(dir, t) : plan.output_bytes(dir, t)};
    check_buffer(plan, dir, b, i, is_in ? in.data[t].bytes : out.data[t].bytes, is_in ? in.data[t].elem_bytes : out.data[t].elem_bytes);
    tab.base[is_in ? BufferIndex::input(t) : BufferIndex::output(t)] = const_cast<std::byte*>(p);
  }
  auto* w = ws_needed ? static_cast<std::byte*>(ws.data) : nullptr;
  b.range[2 * T] = {w, ws_needed};
  check_overlaps(plan, b);
  tab.base[BufferIndex::send] = w;
  tab.base[BufferIndex::recv] = w ? w + plan.recv_region_offset() : nullptr;
  return tab;
}

}  // namespace detail

/// Checks one call's buffers against the plan and returns the buffer table the stages run on
/// (binds the buffers to the plan's buffer indices).
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
///         Error(tensor_mismatch) a tensor given as a range of elements of another size than the
///         plan's (std::vector<double> for float32; ranges of bytes and (pointer, bytes) pass);
///         Error(invalid_shape) a null pointer for a non-empty tensor or a needed workspace.
inline BufferTable bind_buffers(const Plan& plan, Direction dir, const TensorList<ConstByteSpan>& in, const TensorList<ByteSpan>& out,
                                Workspace ws) {
  return detail::bind_table(plan, dir, in, out, ws, plan.workspace_bytes());
}
ULYSSES_NAMESPACE_END
