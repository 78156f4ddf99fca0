// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Autograd functions of the libtorch client (target ulysses::torch; torch/torch.hpp
///        includes the whole client): SeqToHead / HeadToSeq, torch::autograd::Function wrappers
///        (seq_to_head_autograd(), head_to_seq_autograd()) whose backward is the adjoint.
///
/// seq→head's backward is seq_to_head_backward (head→seq summing the partial gradients of
/// replicated kv heads), head→seq's is head_to_seq_backward (seq→head), as DeepSpeed-Ulysses
/// (arXiv:2309.14509) pairs them. CPU tensors with the host executor. Requires libtorch.
#pragma once

#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <cstddef>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../host/executor.hpp"
#include "../layout/element.hpp"
#include "../layout/layout.hpp"
#include "../plan/plan.hpp"
#include "../redistribute.hpp"
#include "tensor.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// What an autograd node keeps between forward and backward: the plan and the communicator (not
/// owned: they must outlive the backward pass).
template <class Comm>
struct TorchExchange : torch::CustomClassHolder {
  TorchExchange(const Plan* p, Comm* c) : plan(p), comm(c) {}
  const Plan* plan;
  Comm* comm;
};

/// The torch dtype of a tensor spec's elements (an opaque type of n bytes: a dtype of n bytes).
inline at::ScalarType dtype_of(const TensorSpec& spec) {
  switch (spec.type) {
    case ElementType::float32: return at::kFloat;
    case ElementType::float64: return at::kDouble;
    case ElementType::float16: return at::kHalf;
    case ElementType::bfloat16: return at::kBFloat16;
    case ElementType::opaque: break;
  }
  switch (spec.elem_bytes) {
    case 1: return at::kByte;
    case 2: return at::kShort;
    case 4: return at::kInt;
    case 8: return at::kLong;
    default: fail(Errc::tensor_mismatch, "no torch dtype has " + std::to_string(spec.elem_bytes) + "-byte elements");
  }
}

/// `x` as a tensor with exactly layout `l` (copied when its strides differ; zeros when undefined).
inline at::Tensor in_layout(const at::Tensor& x, const Layout& l, const at::TensorOptions& opts) {
  if (x.defined() && layout_from(x) == l) return x;
  at::Tensor y = at::empty_strided({l.extent[0], l.extent[1], l.extent[2], l.extent[3]}, {l.stride[0], l.stride[1], l.stride[2], l.stride[3]}, opts);
  if (x.defined()) y.copy_(x);
  else y.zero_();
  return y;
}

/// The autograd node of one direction: forward runs `dir`, backward runs its adjoint (the other
/// direction on the same plan; replicated heads summed in head→seq, as seq_to_head_backward).
template <class Comm>
struct RedistributeFn {
  static torch::autograd::variable_list run(const Plan& plan, Comm& comm, Direction dir, const torch::autograd::variable_list& in) {
    const bool s2h = dir == Direction::seq_to_head;
    if (in.size() != static_cast<std::size_t>(plan.num_tensors()))
      fail(Errc::wrong_tensor_count, "the plan has " + std::to_string(plan.num_tensors()) + " tensors; got " + std::to_string(in.size()));
    std::vector<at::Tensor> x, y;
    std::vector<at::ScalarType> dtypes;
    for (int t = 0; t < plan.num_tensors(); ++t) {
      const at::Tensor& a = in[static_cast<std::size_t>(t)];
      // An undefined tensor (the gradient of an output that took no part in the loss) is zeros of
      // the plan's element type.
      const at::ScalarType dtype = a.defined() ? a.scalar_type() : dtype_of(plan.tensor(t));
      x.push_back(in_layout(a, s2h ? plan.seq_layout(t) : plan.head_layout(t), at::TensorOptions().dtype(dtype)));
      dtypes.push_back(dtype);
    }
    y = empty_like_plan(plan, !s2h, dtypes);
    HostExecutor exec;
    ulysses::redistribute(plan, dir, comm, exec, x, y);
    return y;
  }
};

}  // namespace detail

/// The autograd function of one direction: forward runs `Forward`, backward its adjoint, the other
/// direction on the same plan (seq→head's backward is head→seq with Replicas::sum: the partial
/// gradients of a replicated kv head summed in ascending rank order; head→seq's is seq→head).
/// Use seq_to_head_autograd() / head_to_seq_autograd().
template <class Comm, Direction Forward>
struct ExchangeFunction : torch::autograd::Function<ExchangeFunction<Comm, Forward>> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList in,
                                                c10::intrusive_ptr<detail::TorchExchange<Comm>> x) {
    ctx->saved_data["ulysses"] = at::IValue::make_capsule(x);
    return detail::RedistributeFn<Comm>::run(*x->plan, *x->comm, Forward, in.vec());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad) {
    auto x = c10::static_intrusive_pointer_cast<detail::TorchExchange<Comm>>(ctx->saved_data["ulysses"].toCapsule());
    const int t = x->plan->first_non_adjoint_tensor();
    if (t >= 0)
      detail::fail(Errc::not_adjoint, "the autograd backward needs Replicas::sum on tensor " + std::to_string(t) +
                                          " (its replicated heads take their owner's copy: that is not the adjoint)");
    torch::autograd::variable_list g = detail::RedistributeFn<Comm>::run(*x->plan, *x->comm, backward_of(Forward), grad);
    g.emplace_back();  // no gradient for the exchange object
    return g;
  }
};
/// seq→head forward, seq_to_head_backward backward.
template <class Comm>
using SeqToHead = ExchangeFunction<Comm, Direction::seq_to_head>;
/// head→seq forward, head_to_seq_backward backward.
template <class Comm>
using HeadToSeq = ExchangeFunction<Comm, Direction::head_to_seq>;

/// seq→head of `in` (this rank's seq-sharded [B, S_r, H, D] tensors, in the plan's order, CPU)
/// with autograd: returns the head-sharded [B, S, H_r, D] tensors in the plan's head layouts; their
/// gradients flow back through seq_to_head_backward (replicated kv heads summed). Inputs in other
/// strides are copied into the plan's layout first. `plan` and `comm` must outlive the backward
/// pass. Collective, in forward and in backward.
/// @throws as redistribute() on tensors; Error(not_adjoint) in backward for a plan with
///         Replicas::owner on a replicated tensor.
template <class Comm>
std::vector<at::Tensor> seq_to_head_autograd(const Plan& plan, Comm& comm, const std::vector<at::Tensor>& in) {
  return SeqToHead<Comm>::apply(at::TensorList(in), c10::make_intrusive<detail::TorchExchange<Comm>>(&plan, &comm));
}

/// head→seq of `in` (this rank's head-sharded [B, S, H_r, D] tensors, in the plan's order) with
/// autograd: returns the seq-sharded [B, S_r, H, D] tensors; gradients flow back through
/// head_to_seq_backward (seq→head). As seq_to_head_autograd() otherwise.
template <class Comm>
std::vector<at::Tensor> head_to_seq_autograd(const Plan& plan, Comm& comm, const std::vector<at::Tensor>& in) {
  return HeadToSeq<Comm>::apply(at::TensorList(in), c10::make_intrusive<detail::TorchExchange<Comm>>(&plan, &comm));
}

ULYSSES_NAMESPACE_END
