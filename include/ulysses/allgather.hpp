// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief All-gather-KV context parallelism: k|v of a context-parallel group gathered whole on
///        every rank in one exchange (the sequence in global order: zigzag and document order
///        undone), and its backward, the reduce-scatter of dk|dv in float32 in ascending rank
///        order, rounded once. Llama 3's context parallelism (arXiv:2407.21783, §3.3.2); PyTorch's
///        context_parallel all-gather method; Megatron's fp32 reduce-scatter fix (#6199). docs/allgather.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "error.hpp"
#include "partition/heads.hpp"
#include "plan/plan.hpp"
#include "redistribute.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The specs of the k and v an all-gather-KV group moves: every rank holds all Hkv heads
/// (HeadPartition::all), so seq→head of the plan is the all-gather of the sequence and its
/// backward (head→seq, Replicas::sum) the reduce-scatter.
struct AllGatherSpecs {
  TensorSpec k;  ///< [.., Hkv, D]
  TensorSpec v;  ///< [.., Hkv, Dv]
  /// {k, v}: one plan, one exchange each way.
  std::vector<TensorSpec> kv() const { return {k, v}; }
};

/// The k and v specs of an all-gather-KV group of P ranks: Hkv kv heads of D (k) and Dv (v, 0:
/// D) elements of type T that are `type` (the backward sums them: a summable type).
/// @throws Error(invalid_group) P < 1; Error(invalid_shape) Hkv or D < 1, or Dv < 0.
template <class T>
AllGatherSpecs allgather_kv_specs(int P, std::int64_t Hkv, std::int64_t D, std::int64_t Dv, ElementType type) {
  if (D < 1 || Dv < 0)
    detail::fail(Errc::invalid_shape, "all-gather KV: head_dim=" + std::to_string(D) + " must be >= 1 and v_head_dim=" +
                                          std::to_string(Dv) + " >= 0 (0: head_dim)");
  const HeadPartition all = HeadPartition::all(Hkv, P);
  AllGatherSpecs s{TensorSpec::of<T>(all, D, type), TensorSpec::of<T>(all, Dv ? Dv : D, type)};
  s.k.serving(TensorSpec::kNone).with_replicas(Replicas::sum);
  s.v.serving(TensorSpec::kNone).with_replicas(Replicas::sum);
  return s;
}

/// allgather_kv_specs() with the element type of T (element_type_of<T>).
template <class T>
AllGatherSpecs allgather_kv_specs(int P, std::int64_t Hkv, std::int64_t D, std::int64_t Dv = 0) {
  return allgather_kv_specs<T>(P, Hkv, D, Dv, element_type_of_v<T>);
}

namespace detail {
/// Refuses a plan that is not an all-gather: a tensor whose heads some rank does not hold whole.
inline void require_allgather(const Plan& plan, const char* call) {
  for (int t = 0; t < plan.num_tensors(); ++t) {
    const HeadPartition& h = plan.tensor(t).heads;
    for (int r = 0; r < plan.degree(); ++r)
      if (h.begin(r) != 0 || h.end(r) != h.num_heads())
        fail(Errc::invalid_shape, std::string(call) + ": tensor " + std::to_string(t) + " holds heads [" + std::to_string(h.begin(r)) +
                                      ", " + std::to_string(h.end(r)) + ") on rank " + std::to_string(r) +
                                      ", not all of them: an all-gather plan has HeadPartition::all on every tensor "
                                      "(allgather_kv_specs())");
  }
}
}  // namespace detail

/// The all-gather of k|v (forward): each rank's seq-sharded k and v, [B, S_r, Hkv, D] (its tokens
/// of the plan's sequence partition: zigzag, packed documents, uneven), become the whole
/// sequence [B, S, Hkv, D] in global token order on every rank, in ONE exchange over the plan's
/// path (the peer copy reads each peer's rows once; messages send and receive in place where the
/// layouts are contiguous). It is seq_to_head() of an all-gather plan (allgather_kv_specs()):
/// every argument check, the agreement check, bounded waits, one error on every rank, and the
/// optional row transforms (e.g. RoPE of k fused into the gather) are seq_to_head()'s.
/// @throws Error(invalid_shape) the plan is not an all-gather (a tensor without
///         HeadPartition::all), before any byte moves; otherwise as seq_to_head().
template <class Comm, class Exec>
void allgather_kv(const Plan& plan, Comm& comm, Exec& exec, const TensorList<ConstByteSpan>& kv_seq, const TensorList<ByteSpan>& kv_full,
                  Workspace ws, const RowTransforms& transforms = RowTransforms{}) {
  detail::require_allgather(plan, "allgather_kv");
  seq_to_head(plan, comm, exec, kv_seq, kv_full, ws, transforms);
}

/// The backward of allgather_kv(): every rank's gradients of the whole sequence, dk|dv [B, S,
/// Hkv, D], reduce-scattered to the ranks' own tokens [B, S_r, Hkv, D]: each element the sum of
/// the P ranks' copies in ascending rank order (rank 0's first), added in float32 for 16-bit
/// types (float64 for float64) and rounded once, so the result is the same in every run, on
/// every path and transport, and does not depend on where a chain would start (case C25; a ring
/// reduce-scatter rounds at every hop). seq_to_head_backward() of the plan.
/// @throws as allgather_kv(); Error(not_adjoint) a tensor with Replicas::owner.
template <class Comm, class Exec>
void allgather_kv_backward(const Plan& plan, Comm& comm, Exec& exec, const TensorList<ConstByteSpan>& dkv_full,
                           const TensorList<ByteSpan>& dkv_seq, Workspace ws, const RowTransforms& transforms = RowTransforms{}) {
  detail::require_allgather(plan, "allgather_kv_backward");
  seq_to_head_backward(plan, comm, exec, dkv_full, dkv_seq, ws, transforms);
}

ULYSSES_NAMESPACE_END
