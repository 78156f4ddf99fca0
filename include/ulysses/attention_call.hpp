// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief q, k, v by name: seq_to_head() and seq_to_head_backward() of an attention layer's
///        q, k, v plan with named buffers (Qkv, QkvGrad) instead of a positional list.
///
/// `QkvIn().q(q).k(k).v(v)`: a swap of k and v (same size, so a positional list cannot catch it)
/// is written out at the call site. The calls check that the plan is attention_specs(...).qkv()'s
/// and that all three buffers are given, then run the positional form (redistribute.hpp). Why and
/// how: docs/guide.md; docs/headers.md, "attention_call.hpp".
#pragma once

#include <string>

#include "error.hpp"
#include "plan/plan.hpp"
#include "redistribute.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// Three named buffers of one call (q, k, v or dq, dk, dv, in the plan's order) and which were
/// given: the storage of Qkv and QkvGrad.
template <class Span>
class NamedTriple {
 public:
  /// The buffers in the plan's order (q, k, v), the ones not given as empty spans.
  TensorList<Span> list() const { return TensorList<Span>(span_, 3); }
  /// Whether buffer i (0 q, 1 k, 2 v) was given.
  bool given(int i) const { return given_[i]; }

 protected:
  /// This triple with buffer i set to s (a copy: three spans and three flags).
  template <class Self>
  static Self with(Self self, int i, Span s) {
    self.span_[i] = s;
    self.given_[i] = true;
    return self;
  }

 private:
  Span span_[3] = {};
  bool given_[3] = {false, false, false};
};

/// The checks of a named call before anything moves: the plan is the q, k, v plan of
/// attention_specs().qkv() and every buffer of `in` and `out` was given.
/// @param call  the function's name, for the message ("seq_to_head")
/// @param names the three names ("q", "k", "v" or "dq", "dk", "dv")
/// @throws Error(wrong_tensor_count) the plan has not 3 tensors, or a buffer was not given;
///         Error(gqa_invalid) k or v does not serve q, or q serves a tensor, or k and v have
///         different head splits; Error(invalid_shape) k's head dim differs from q's.
template <class In, class Out>
void check_named_call(const Plan& plan, const char* call, const char* const names[3], const In& in, const Out& out) {
  const std::string what = std::string(call) + " of q, k, v by name: ";
  const std::string fix = "; plan q, k, v with attention_specs(...).qkv() (or mark k and v with TensorSpec::serving(0)), "
                          "or use the positional form for other tensors";
  if (plan.num_tensors() != 3)
    fail(Errc::wrong_tensor_count, what + "the plan has " + std::to_string(plan.num_tensors()) + " tensors, not q, k, v" + fix);
  if (plan.serves(0) != TensorSpec::kNone || plan.serves(1) != 0 || plan.serves(2) != 0)
    fail(Errc::gqa_invalid, what + "in this plan tensor 1 serves " + std::to_string(plan.serves(1)) + " and tensor 2 serves " +
                                std::to_string(plan.serves(2)) + " (k and v must serve tensor 0, q, which serves none)" + fix);
  if (plan.tensor(1).head_dim != plan.tensor(0).head_dim)
    fail(Errc::invalid_shape, what + "k's head dim " + std::to_string(plan.tensor(1).head_dim) + " differs from q's " +
                                  std::to_string(plan.tensor(0).head_dim) + " (q . k needs one D)" + fix);
  if (!(plan.tensor(1).heads == plan.tensor(2).heads))
    fail(Errc::gqa_invalid, what + "k and v have different head partitions (they are the same kv heads)" + fix);
  for (int i = 0; i < 3; ++i)
    if (!in.given(i) || !out.given(i))
      fail(Errc::wrong_tensor_count, what + "the " + (in.given(i) ? "output " : "input ") + names[i] +
                                         " was not given: name all three, e.g. .q(...).k(...).v(...)");
}
}  // namespace detail

/// The q, k and v buffers of one seq_to_head() call, by name: inputs (Qkv<ConstByteSpan>, alias
/// QkvIn) or outputs (Qkv<ByteSpan>, alias QkvOut). Made empty, then each buffer named once:
/// `QkvIn().q(q).k(k).v(v)` (any order; a name given twice keeps the last). There is no positional
/// constructor, so which buffer is k and which is v is written at the call site. Each span is a
/// buffer with its size in bytes, in the plan's layout of that tensor (seq-sharded [B, S_r, H, D]
/// inputs, head-sharded [B, S, H_r, D] outputs; Plan::seq_bytes(t) / head_bytes(t) with t = 0, 1, 2
/// for q, k, v): a std::vector, a std::span or {pointer, bytes}, as in TensorList.
template <class Span>
class Qkv : public detail::NamedTriple<Span> {
 public:
  Qkv() noexcept {}  ///< no buffer given (user-provided: not an aggregate, so `Qkv{q, k, v}` does not compile)
  [[nodiscard]] Qkv q(Span s) const { return this->with(*this, 0, s); }  ///< these buffers with q's set to s
  [[nodiscard]] Qkv k(Span s) const { return this->with(*this, 1, s); }  ///< these buffers with k's set to s
  [[nodiscard]] Qkv v(Span s) const { return this->with(*this, 2, s); }  ///< these buffers with v's set to s
};
/// The gradients dq, dk, dv of one seq_to_head_backward() call, by name: the head-sharded
/// gradients of the attention backward (QkvGrad<ConstByteSpan>, alias QkvGradIn: dk and dv are
/// this rank's partial gradients of the kv heads it holds) or the seq-sharded results
/// (QkvGrad<ByteSpan>, alias QkvGradOut). Named like Qkv: `QkvGradIn().dq(dq2).dk(dk2).dv(dv2)`;
/// dq, dk, dv are in the layouts of q, k, v (tensors 0, 1, 2 of the plan).
template <class Span>
class QkvGrad : public detail::NamedTriple<Span> {
 public:
  QkvGrad() noexcept {}  ///< no buffer given (not an aggregate: `QkvGrad{dq, dk, dv}` does not compile)
  [[nodiscard]] QkvGrad dq(Span s) const { return this->with(*this, 0, s); }  ///< these buffers with dq's set to s
  [[nodiscard]] QkvGrad dk(Span s) const { return this->with(*this, 1, s); }  ///< these buffers with dk's set to s
  [[nodiscard]] QkvGrad dv(Span s) const { return this->with(*this, 2, s); }  ///< these buffers with dv's set to s
};

using QkvIn = Qkv<ConstByteSpan>;           ///< seq_to_head()'s seq-sharded q, k, v
using QkvOut = Qkv<ByteSpan>;               ///< seq_to_head()'s head-sharded q, k, v
using QkvGradIn = QkvGrad<ConstByteSpan>;   ///< seq_to_head_backward()'s head-sharded dq, dk, dv
using QkvGradOut = QkvGrad<ByteSpan>;       ///< seq_to_head_backward()'s seq-sharded dq, dk, dv

/// seq_to_head() by name with row transforms fused into the copy (layout/transform.hpp): tensor 0
/// is q, 1 k, 2 v in `transforms` (`RowTransforms().on_pack(0, rope).on_pack(1, rope)` rotates q
/// and k). @throws as seq_to_head() by name; then as the positional call with transforms
/// (Error(invalid_shape) for a transform on a tensor not planned with_row_transforms()).
template <class Comm, class Exec>
void seq_to_head(const Plan& plan, Comm& comm, Exec& exec, const QkvIn& in, const QkvOut& out, Workspace ws,
                 const RowTransforms& transforms) {
  static const char* const names[3] = {"q", "k", "v"};
  detail::check_named_call(plan, "seq_to_head", names, in, out);
  seq_to_head(plan, comm, exec, in.list(), out.list(), ws, transforms);
}

/// seq→head of q, k, v by name (forward, before attention): seq-sharded q, k, v [B, S_r, H|Hkv,
/// D|Dv] → head-sharded [B, S, H_r|Hkv_r, D|Dv], in one exchange; what seq_to_head(plan, comm,
/// exec, {q, k, v}, {q2, k2, v2}, ws) does, with k and v named instead of placed.
/// @param plan the q, k, v plan (attention_specs(...).qkv(): tensor 0 q, 1 k, 2 v)
/// @param comm this rank's communicator (the plan's group); every rank calls it
/// @param exec the executor of the block copies (HostExecutor, CudaExecutor on comm's stream)
/// @param in   `QkvIn().q(q).k(k).v(v)`: sizes at least Plan::seq_bytes(0), (1), (2)
/// @param out  `QkvOut().q(q2).k(k2).v(v2)`: sizes at least Plan::head_bytes(0), (1), (2)
/// @param ws   at least Plan::workspace_bytes() bytes
/// @throws what detail::check_named_call() throws (the plan is not q, k, v; a buffer not given),
///         before anything moves and alike on every rank for the plan checks; then as the
///         positional seq_to_head() (redistribute()).
template <class Comm, class Exec>
void seq_to_head(const Plan& plan, Comm& comm, Exec& exec, const QkvIn& in, const QkvOut& out, Workspace ws) {
  seq_to_head(plan, comm, exec, in, out, ws, RowTransforms{});
}

/// seq_to_head_backward() by name with row transforms (tensor 0 dq, 1 dk, 2 dv): for RoPE's
/// backward, `RowTransforms().on_unpack(0, inv).on_unpack(1, inv)` with inv = rope.inverse()
/// rotates dq and dk back after the replicated kv heads' partials are summed (in float32, one
/// rounding). @throws as seq_to_head_backward() by name and the positional call with transforms.
template <class Comm, class Exec>
void seq_to_head_backward(const Plan& plan, Comm& comm, Exec& exec, const QkvGradIn& grad_head, const QkvGradOut& grad_seq,
                          Workspace ws, const RowTransforms& transforms) {
  static const char* const names[3] = {"dq", "dk", "dv"};
  detail::check_named_call(plan, "seq_to_head_backward", names, grad_head, grad_seq);
  seq_to_head_backward(plan, comm, exec, grad_head.list(), grad_seq.list(), ws, transforms);
}

/// The backward of seq_to_head() by name: head-sharded dq, dk, dv (from the attention backward;
/// dk, dv this rank's partials of the kv heads it holds) → seq-sharded dq, dk, dv, where the
/// partial gradients of a kv head held by several ranks are added in ascending rank order; what
/// seq_to_head_backward(plan, comm, exec, {dq2, dk2, dv2}, {dq, dk, dv}, ws) does, by name.
/// @param plan      the q, k, v plan of the forward (Replicas::sum, attention_specs()'s default)
/// @param comm      this rank's communicator (the plan's group); every rank calls it
/// @param exec      the executor of the block copies (HostExecutor, CudaExecutor on comm's stream)
/// @param grad_head `QkvGradIn().dq(dq2).dk(dk2).dv(dv2)`: sizes at least Plan::head_bytes(t)
/// @param grad_seq  `QkvGradOut().dq(dq).dk(dk).dv(dv)`: sizes at least Plan::seq_bytes(t)
/// @param ws        at least Plan::workspace_bytes() bytes
/// @throws what detail::check_named_call() throws; then as the positional seq_to_head_backward()
///         (Error(not_adjoint) for a plan whose k or v takes its owner's copy).
template <class Comm, class Exec>
void seq_to_head_backward(const Plan& plan, Comm& comm, Exec& exec, const QkvGradIn& grad_head, const QkvGradOut& grad_seq,
                          Workspace ws) {
  seq_to_head_backward(plan, comm, exec, grad_head, grad_seq, ws, RowTransforms{});
}

ULYSSES_NAMESPACE_END
