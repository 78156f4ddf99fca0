// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief at::Tensor in the libtorch client (target ulysses::torch; torch/torch.hpp includes the
///        whole client): a tensor's element type, layout and TensorSpec, and seq_to_head /
///        head_to_seq (redistribute()) of at::Tensor lists, each tensor checked against the plan
///        before any rank enters the exchange. docs/torch.md. Requires libtorch.
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../layout/element.hpp"
#include "../layout/layout.hpp"
#include "../partition/heads.hpp"
#include "../plan/plan.hpp"
#include "../redistribute.hpp"
#include "../transport/dispatch.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The ElementType of a torch dtype: float32, float64, float16, bfloat16; any other dtype is
/// ElementType::opaque (moved exactly, never summed).
inline ElementType element_type_of_dtype(at::ScalarType s) noexcept {
  switch (s) {
    case at::kFloat: return ElementType::float32;
    case at::kDouble: return ElementType::float64;
    case at::kHalf: return ElementType::float16;
    case at::kBFloat16: return ElementType::bfloat16;
    default: return ElementType::opaque;
  }
}

/// The Layout (extents and strides in elements, over (b, s, h, d)) of a 4-dimensional strided
/// tensor read as [B, S, H, D]: `x` [B, S_r, H, D] contiguous is bshd; `y.permute({0, 2, 1, 3})` of
/// a contiguous [B, H, S, D] is bhsd; a slice of a fused projection keeps its strides.
/// @throws Error(tensor_mismatch) when `t` is not a defined strided tensor of 4 dimensions.
inline Layout layout_from(const at::Tensor& t) {
  if (!t.defined() || t.layout() != at::kStrided || t.dim() != 4)
    detail::fail(Errc::tensor_mismatch, "a tensor of ulysses is a defined strided [B, S, H, D] tensor; got " +
                                            (t.defined() ? std::to_string(t.dim()) + " dimensions, layout " + c10::str(t.layout())
                                                         : std::string("an undefined tensor")));
  return Layout::strided({t.size(0), t.size(1), t.size(2), t.size(3)}, {t.stride(0), t.stride(1), t.stride(2), t.stride(3)});
}

/// The TensorSpec of one tensor from this rank's two tensors: `seq_local` (seq-sharded
/// [B, S_r, H, D]) and `head_local` (head-sharded [B, S, H_r, D]), in any strides; the element type
/// and size are their dtype's. Either may be undefined: that side then takes the plan's format.
/// @throws Error(tensor_mismatch) the two differ in dtype, or one is not a strided 4-D tensor.
inline TensorSpec spec_of(HeadPartition heads, const at::Tensor& seq_local, const at::Tensor& head_local = at::Tensor()) {
  const at::Tensor& any = seq_local.defined() ? seq_local : head_local;
  if (!any.defined()) detail::fail(Errc::tensor_mismatch, "spec_of needs at least one defined tensor");
  if (seq_local.defined() && head_local.defined() && seq_local.scalar_type() != head_local.scalar_type())
    detail::fail(Errc::tensor_mismatch, std::string("the seq-sharded tensor is ") + c10::toString(seq_local.scalar_type()) +
                                            " but the head-sharded one " + c10::toString(head_local.scalar_type()));
  TensorSpec s{std::move(heads), layout_from(any).extent[3], static_cast<std::size_t>(any.element_size()), std::nullopt, std::nullopt};
  s.type = element_type_of_dtype(any.scalar_type());
  if (seq_local.defined()) s.with_seq_layout(layout_from(seq_local));
  if (head_local.defined()) s.with_head_layout(layout_from(head_local));
  return s;
}

namespace detail {

/// Checks one tensor against the plan's layout of tensor t on the given side, and returns its
/// bytes from its first element to the end of its storage.
template <class Exec>
std::size_t check_tensor(const Plan& plan, int t, bool seq_side, const at::Tensor& x, const char* role) {
  const std::string name = std::string(role) + " tensor " + std::to_string(t);
  if (!x.defined()) fail(Errc::tensor_mismatch, name + " is undefined");
  const bool host = runs_on_host<Exec>::value;
  if (host != x.device().is_cpu())
    fail(Errc::tensor_mismatch, name + " is on " + x.device().str() + " but the executor runs on " + (host ? "the CPU" : "a device"));
  if (x.layout() != at::kStrided) fail(Errc::tensor_mismatch, name + " is not strided (layout " + c10::str(x.layout()) + ")");
  const TensorSpec& spec = plan.tensor(t);
  const ElementType et = element_type_of_dtype(x.scalar_type());
  if (static_cast<std::size_t>(x.element_size()) != spec.elem_bytes || (spec.type != ElementType::opaque && et != spec.type))
    fail(Errc::tensor_mismatch, name + " is " + c10::toString(x.scalar_type()) + " but the plan's tensor " + std::to_string(t) + " is " +
                                    to_string(spec.type) + " of " + std::to_string(spec.elem_bytes) + " bytes");
  const Layout want = seq_side ? plan.seq_layout(t) : plan.head_layout(t), got = layout_from(x);
  if (!(got == want))
    fail(Errc::layout_mismatch, name + " has extents and strides " + got.str() + " but the plan's " + (seq_side ? "seq" : "head") +
                                    "-sharded layout is " + want.str());
  const std::size_t offset = static_cast<std::size_t>(x.storage_offset()) * spec.elem_bytes;
  const std::size_t storage = x.storage().nbytes();
  return storage > offset ? storage - offset : 0;
}

}  // namespace detail

/// seq_to_head / head_to_seq (by `dir`) of at::Tensor lists, in the plan's order: `in` and `out`
/// are this rank's tensors of the input and output sharding ([B, S_r, H, D] seq-sharded, [B, S,
/// H_r, D] head-sharded), each with the plan's dtype, extents and strides, on the executor's
/// device (CPU for HostExecutor). `ws`: a workspace tensor of at least Plan::workspace_bytes()
/// bytes (any dtype; undefined: one is allocated for the call). Collective.
/// @throws Error(tensor_mismatch) a tensor undefined, on another device, of another dtype or not
///         strided; Error(layout_mismatch) other sizes or strides than the plan's;
///         Error(wrong_tensor_count); and what redistribute() throws. All checks run before the
///         exchange.
template <class Comm, class Exec>
void redistribute(const Plan& plan, Direction dir, Comm& comm, Exec& exec, const std::vector<at::Tensor>& in,
                  const std::vector<at::Tensor>& out, at::Tensor ws = at::Tensor()) {
  const bool s2h = dir == Direction::seq_to_head;
  if (in.size() != static_cast<std::size_t>(plan.num_tensors()) || out.size() != in.size())
    detail::fail(Errc::wrong_tensor_count, "the plan has " + std::to_string(plan.num_tensors()) + " tensors; got " +
                                               std::to_string(in.size()) + " inputs and " + std::to_string(out.size()) + " outputs");
  TensorList<ConstByteSpan> ins;
  TensorList<ByteSpan> outs;
  for (int t = 0; t < plan.num_tensors(); ++t) {
    const at::Tensor& x = in[static_cast<std::size_t>(t)];
    const at::Tensor& y = out[static_cast<std::size_t>(t)];
    const std::size_t xb = detail::check_tensor<Exec>(plan, t, s2h, x, "input");
    const std::size_t yb = detail::check_tensor<Exec>(plan, t, !s2h, y, "output");
    ins.push_back(ConstByteSpan{x.data_ptr(), xb});
    outs.push_back(ByteSpan{y.data_ptr(), yb});
  }
  if (!ws.defined() || static_cast<std::size_t>(ws.nbytes()) < plan.workspace_bytes())
    ws = at::empty({static_cast<std::int64_t>(plan.workspace_bytes())}, at::TensorOptions().dtype(at::kByte).device(in.at(0).device()));
  redistribute(plan, dir, comm, exec, ins, outs, ByteSpan{ws.data_ptr(), static_cast<std::size_t>(ws.nbytes())});
}

/// Tensors laid out as the plan's tensors on one side (`seq_side`: seq-sharded [B, S_r, H, D],
/// else head-sharded [B, S, H_r, D]), uninitialised, with each tensor's dtype `dtypes[t]` and the
/// plan's strides (at::empty_strided over the layout's span).
inline std::vector<at::Tensor> empty_like_plan(const Plan& plan, bool seq_side, const std::vector<at::ScalarType>& dtypes,
                                               at::Device device = at::kCPU) {
  std::vector<at::Tensor> v;
  for (int t = 0; t < plan.num_tensors(); ++t) {
    const Layout& l = seq_side ? plan.seq_layout(t) : plan.head_layout(t);
    v.push_back(at::empty_strided({l.extent[0], l.extent[1], l.extent[2], l.extent[3]}, {l.stride[0], l.stride[1], l.stride[2], l.stride[3]},
                                  at::TensorOptions().dtype(dtypes.at(static_cast<std::size_t>(t))).device(device)));
  }
  return v;
}

ULYSSES_NAMESPACE_END
