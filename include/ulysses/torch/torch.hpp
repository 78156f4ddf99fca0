// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief libtorch client (target ulysses::torch): a communicator over a c10d::ProcessGroup,
/// at::Tensor entry points, and autograd functions whose backward is the right adjoint.
///
/// - ProcessGroupComm: the communicator concept of transport.hpp over any c10d::ProcessGroup whose
///   backend moves CPU tensors (Gloo, MPI): all-to-all-v through `alltoall_base` with byte split
///   sizes, the agreement check's all-gather through `allgather`. Host memory.
/// - spec_of(), layout_of(), element_type_of_dtype(): an at::Tensor's dtype, sizes and strides become a
///   TensorSpec's element type and layouts (the tensors are [B, S, H, D] in that logical order, any
///   strides: bshd, a permuted bhsd view, a slice of a fused projection...).
/// - seq_to_head() / head_to_seq() and their backward on at::Tensor lists: every tensor is checked
///   against the plan (device, dtype, layout kind, sizes, strides) before any rank enters the
///   exchange: Error(tensor_mismatch) or Error(layout_mismatch), naming the tensor.
/// - SeqToHead / HeadToSeq: torch::autograd::Function wrappers (seq_to_head_autograd(),
///   head_to_seq_autograd()) whose backward is the adjoint: seq_to_head_backward (summing the
///   partial gradients of replicated kv heads) and head_to_seq_backward.
///
/// Requires libtorch (CMake: find_package(Torch); Debian: libtorch-dev, and libgloo-dev for
/// ProcessGroupGloo). CPU tensors with the host executor; GPU tensors through a ProcessGroupNCCL
/// are not covered here (use NcclComm and CudaExecutor with the tensors' data pointers).
#pragma once

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "../ulysses.hpp"
#include "../comm/exchange_state.hpp"

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
inline Layout layout_of(const at::Tensor& t) {
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
  TensorSpec s{std::move(heads), layout_of(any).extent[3], static_cast<std::size_t>(any.element_size()), std::nullopt, std::nullopt};
  s.type = element_type_of_dtype(any.scalar_type());
  if (seq_local.defined()) s.with_seq_layout(layout_of(seq_local));
  if (head_local.defined()) s.with_head_layout(layout_of(head_local));
  return s;
}

/// Communicator over a c10d::ProcessGroup of CPU tensors (Gloo, MPI), modelling the concept of
/// transport.hpp with alltoallv() and allgather() (so Path::alltoallv). Collective calls are
/// blocking (`work->wait()`), on the process group's own threads. The process group must outlive
/// the communicator; every rank of the group calls in the same order.
class ProcessGroupComm {
 public:
  /// Wraps `pg` (shared, not copied). @throws Error(invalid_group) a null process group.
  explicit ProcessGroupComm(c10::intrusive_ptr<c10d::ProcessGroup> pg) : pg_(std::move(pg)) {
    if (!pg_) detail::fail(Errc::invalid_group, "ProcessGroupComm needs a process group");
  }
  int size() const { return pg_->getSize(); }  ///< P
  int rank() const { return pg_->getRank(); }  ///< this rank

  /// All-to-all-v in bytes (transport.hpp). One `alltoall_base` over uint8 views of the buffers
  /// when the chunks lie back to back in peer order (the plan's always do); otherwise through
  /// contiguous copies. @throws Error(backend) with the process group's message.
  void alltoallv(const std::byte* send, const std::size_t* send_bytes, const std::size_t* send_offsets, std::byte* recv,
                 const std::size_t* recv_bytes, const std::size_t* recv_offsets) {
    const auto P = static_cast<std::size_t>(size());
    std::vector<std::int64_t> ss(P), rs(P);
    std::size_t st = 0, rt = 0;
    bool packed = true;
    for (std::size_t p = 0; p < P; ++p) {
      packed = packed && send_offsets[p] == send_offsets[0] + st && recv_offsets[p] == recv_offsets[0] + rt;
      ss[p] = static_cast<std::int64_t>(send_bytes[p]);
      rs[p] = static_cast<std::int64_t>(recv_bytes[p]);
      st += send_bytes[p];
      rt += recv_bytes[p];
    }
    auto bytes = [](void* p, std::size_t n) {
      return torch::from_blob(p, {static_cast<std::int64_t>(n)}, torch::TensorOptions().dtype(torch::kUInt8));
    };
    if (packed) {
      at::Tensor in = bytes(const_cast<std::byte*>(send + send_offsets[0]), st), out = bytes(recv + recv_offsets[0], rt);
      run("alltoall_base", [&] { return pg_->alltoall_base(out, in, rs, ss); });
      return;
    }
    std::vector<std::byte> s(st), r(rt);
    std::size_t o = 0;
    for (std::size_t p = 0; p < P; o += send_bytes[p], ++p)
      if (send_bytes[p]) std::memcpy(s.data() + o, send + send_offsets[p], send_bytes[p]);
    at::Tensor in = bytes(s.data(), st), out = bytes(r.data(), rt);
    run("alltoall_base", [&] { return pg_->alltoall_base(out, in, rs, ss); });
    o = 0;
    for (std::size_t p = 0; p < P; o += recv_bytes[p], ++p)
      if (recv_bytes[p]) std::memcpy(recv + recv_offsets[p], r.data() + o, recv_bytes[p]);
  }

  /// All-gather of `bytes` bytes per rank into recv (rank p's at recv + p * bytes): the agreement
  /// check's collective. @throws Error(backend) with the process group's message.
  void allgather(const void* send, std::size_t bytes, void* recv) {
    const auto n = static_cast<std::int64_t>(bytes);
    const auto u8 = torch::TensorOptions().dtype(torch::kUInt8);
    std::vector<at::Tensor> in{torch::from_blob(const_cast<void*>(send), {n}, u8).clone()};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int p = 0; p < size(); ++p) out[0].push_back(torch::empty({n}, u8));
    run("allgather", [&] { return pg_->allgather(out, in); });
    for (std::size_t p = 0; p < out[0].size(); ++p)
      std::memcpy(static_cast<std::byte*>(recv) + p * bytes, out[0][p].data_ptr(), bytes);
  }

  /// The process group.
  const c10::intrusive_ptr<c10d::ProcessGroup>& process_group() const { return pg_; }

  /// What the transports learn on this communicator about the plans run on it, and their
  /// scratch lists (comm/exchange_state.hpp).
  ExchangeState& exchange_state() noexcept { return state_; }

 private:
  ExchangeState state_;  // see exchange_state()
  template <class F>
  void run(const char* what, F&& f) {
    try {
      f()->wait();
    } catch (const std::exception& e) {
      detail::fail(Errc::backend, std::string("c10d ") + what + " on " + pg_->getBackendName() + ": " + e.what());
    }
  }
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
};

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
  const Layout want = seq_side ? plan.seq_layout(t) : plan.head_layout(t), got = layout_of(x);
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
  if (x.defined() && layout_of(x) == l) return x;
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
