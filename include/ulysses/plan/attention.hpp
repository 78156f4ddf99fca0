// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief attention_specs(): the q, k, v and o tensor specs of one attention layer, with the GQA
///        pairing right by construction.
///
/// The query heads split by a policy, the kv split derived from it (HeadPartition::gqa), k and v
/// marked as serving q and as summing their replicas in head→seq, so that `Plan(group, B, seq,
/// specs.qkv())` and `specs.out()` are right for training and inference alike. check_heads():
/// whether a layer's heads split over a Mesh's Ulysses groups. docs/guide.md; docs/headers.md,
/// "plan/attention.hpp".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../layout/element.hpp"
#include "../error.hpp"
#include "../partition/heads.hpp"
#include "../topology/mesh.hpp"
#include "plan.hpp"

ULYSSES_NAMESPACE_BEGIN

/// How the query heads are split over the group (underlying type int: topology/mesh.hpp declares
/// it ahead).
enum class HeadPolicy : int {
  even,      ///< H / P query heads a rank (H % P == 0), kv heads split (Hkv % P == 0) or replicated
             ///< (P % Hkv == 0) evenly: DeepSpeed-Ulysses' rule
  balanced,  ///< the first H % P ranks one query head more; kv heads follow (any H, Hkv, P)
  automatic, ///< `even` where its rule holds (H % P == 0, and Hkv % P == 0 or P % Hkv == 0), else
             ///< `balanced`: never refuses a head count (resolve_head_policy() says which)
};

/// The policy HeadPolicy::automatic stands for on P ranks with H query and Hkv kv heads (`even`
/// where its rule holds, else `balanced`); any other policy is returned as it is.
inline HeadPolicy resolve_head_policy(HeadPolicy policy, int P, std::int64_t H, std::int64_t Hkv) noexcept {
  if (policy != HeadPolicy::automatic) return policy;
  const bool even = P >= 1 && H % P == 0 && Hkv >= 1 && (Hkv % P == 0 || P % Hkv == 0);
  return even ? HeadPolicy::even : HeadPolicy::balanced;
}

/// The head shapes of an attention layer.
struct AttentionShape {
  std::int64_t num_heads = 0;     ///< H, query heads
  std::int64_t num_kv_heads = 0;  ///< Hkv, key/value heads (H for multi-head attention, 1 for MQA)
  std::int64_t head_dim = 0;      ///< D of q and k
  std::int64_t v_head_dim = 0;    ///< Dv of v and o; 0 means head_dim (differs under MLA)
};

/// The tensor specs of one attention layer on a group of P ranks (see docs/headers.md, "plan/attention.hpp").
struct AttentionSpecs {
  HeadPartition query_heads;  ///< the split of q and o (and dq, do)
  HeadPartition kv_heads;     ///< the split of k and v: HeadPartition::gqa(query_heads, Hkv)
  TensorSpec q;  ///< [.., H, D]
  TensorSpec k;  ///< [.., Hkv, D], serves tensor 0 (q), Replicas::sum
  TensorSpec v;  ///< [.., Hkv, Dv], serves tensor 0 (q), Replicas::sum
  TensorSpec o;  ///< [.., H, Dv]

  /// {q, k, v}: one plan, one exchange each way (forward seq→head, backward its adjoint).
  std::vector<TensorSpec> qkv() const { return {q, k, v}; }
  /// {o}: the attention output's plan (forward head→seq, backward seq→head).
  std::vector<TensorSpec> out() const { return {o}; }
  /// Query heads per kv head, H / Hkv.
  std::int64_t query_per_kv() const { return query_heads.num_heads() / kv_heads.num_heads(); }
  /// The index, in rank r's head-sharded k and v (heads [kv_heads.begin(r), kv_heads.end(r))), of
  /// the kv head that rank r's local query head `local_query` (0 .. query_heads.count(r) - 1) uses.
  std::int64_t local_kv_head(int r, std::int64_t local_query) const {
    return (query_heads.begin(r) + local_query) / query_per_kv() - kv_heads.begin(r);
  }
};

/// The q, k, v, o specs of an attention layer of `shape` on P ranks, for elements of type T whose
/// ElementType is `type` (needed to sum the kv gradients when kv heads are replicated; opaque
/// works when they are not).
/// @throws Error(invalid_group) P < 1; Error(invalid_shape) a head count or dim < 1;
///         Error(heads_not_divisible) HeadPolicy::even and H % P != 0;
///         Error(gqa_invalid) H % Hkv != 0; Error(gqa_group_mismatch) HeadPolicy::even and neither
///         Hkv % P nor P % Hkv is 0 (the message lists the P that work).
template <class T>
AttentionSpecs attention_specs(int P, const AttentionShape& shape, ElementType type, HeadPolicy policy = HeadPolicy::even) {
  const std::int64_t Dv = shape.v_head_dim ? shape.v_head_dim : shape.head_dim;
  if (shape.head_dim < 1 || Dv < 1)
    detail::fail(Errc::invalid_shape, "head_dim=" + std::to_string(shape.head_dim) + " and v_head_dim=" + std::to_string(Dv) +
                                          " must be >= 1");
  const bool even = resolve_head_policy(policy, P, shape.num_heads, shape.num_kv_heads) == HeadPolicy::even;
  HeadPartition qh = even ? HeadPartition::even(shape.num_heads, P) : HeadPartition::balanced(shape.num_heads, P);
  HeadPartition kvh = HeadPartition::gqa(qh, shape.num_kv_heads);
  AttentionSpecs a{qh, kvh, TensorSpec::of<T>(qh, shape.head_dim, type), TensorSpec::of<T>(kvh, shape.head_dim, type),
                   TensorSpec::of<T>(kvh, Dv, type), TensorSpec::of<T>(qh, Dv, type)};
  a.q.serving(TensorSpec::kNone);
  a.k.serving(0).with_replicas(Replicas::sum);
  a.v.serving(0).with_replicas(Replicas::sum);
  a.o.serving(TensorSpec::kNone);
  return a;
}

/// attention_specs() with the element type of T (element_type_of<T>: float, double, or your
/// specialisation).
template <class T>
AttentionSpecs attention_specs(int P, const AttentionShape& shape, HeadPolicy policy = HeadPolicy::even) {
  return attention_specs<T>(P, shape, element_type_of_v<T>, policy);
}

/// Checks that an attention layer of `shape` splits over the Ulysses groups of `mesh`: P =
/// mesh.ulysses_degree() <= H (every rank gets a query head), and attention_specs()'s rules for
/// `policy` (H % Hkv == 0; under HeadPolicy::even, DeepSpeed-Ulysses' rule, arXiv:2309.14509:
/// H % P == 0, and Hkv % P == 0 or P % Hkv == 0). Pure: builds the specs and drops them.
/// @throws Error(invalid_shape) H or Hkv < 1; Error(invalid_mesh) P > H; what attention_specs()
///         throws (heads_not_divisible, gqa_group_mismatch, gqa_invalid, invalid_shape), with its message.
inline void check_heads(const Mesh& mesh, const AttentionShape& shape, HeadPolicy policy = HeadPolicy::even) {
  const int P = mesh.ulysses_degree();
  if (shape.num_heads < 1 || shape.num_kv_heads < 1)
    detail::fail(Errc::invalid_shape, "num_heads=" + std::to_string(shape.num_heads) + " and num_kv_heads=" +
                                          std::to_string(shape.num_kv_heads) + " must be >= 1");
  if (P > shape.num_heads)
    detail::fail(Errc::invalid_mesh, "ulysses_degree=" + std::to_string(P) + " exceeds the " + std::to_string(shape.num_heads) +
                                         " query heads: some ranks would hold no head; use a smaller Ulysses degree and a "
                                         "larger outer degree");
  (void)attention_specs<float>(P, shape, ElementType::float32, policy);
}

// The deprecated members declared in topology/mesh.hpp (a Mesh holds integers only).
inline void Mesh::check_heads(const AttentionShape& shape) const { ulysses::check_heads(*this, shape); }
inline void Mesh::check_heads(const AttentionShape& shape, HeadPolicy policy) const { ulysses::check_heads(*this, shape, policy); }

ULYSSES_NAMESPACE_END
