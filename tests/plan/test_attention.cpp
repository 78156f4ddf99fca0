// SPDX-License-Identifier: Apache-2.0
// attention.hpp: attention_specs() for every model shape and group size, the GQA pairing it
// builds (checked by Plan), the local kv head of each local query head, and its errors.
#include <doctest/doctest.h>
#include <ulysses/plan/attention.hpp>

#include "cases.hpp"
#include "expect_error.hpp"

using namespace ulysses;

TEST_CASE("attention_specs: every model, P in {1,2,4,8,16,32}, both policies: the verdict, the pairing, the kv head of each query head") {
  for (const auto& m : ulysses_models::kModels)
    for (int P : {1, 2, 4, 8, 16, 32})
      for (HeadPolicy policy : {HeadPolicy::even, HeadPolicy::balanced}) {
        const std::string name = m.name;
        CAPTURE(name);
        CAPTURE(P);
        const AttentionShape shape{m.num_heads, m.num_kv_heads, m.head_dim, m.v_head_dim};
        if (policy == HeadPolicy::even && ut::expected_even_error(m, P) != Errc{}) {
          CHECK(ut::code_of([&] { attention_specs<float>(P, shape, policy); }) == ut::expected_even_error(m, P));
          continue;
        }
        const AttentionSpecs a = attention_specs<float>(P, shape, policy);
        CHECK(a.q.head_dim == m.head_dim);
        CHECK(a.v.head_dim == m.v_head_dim);
        CHECK(a.o.head_dim == m.v_head_dim);
        CHECK(a.query_per_kv() == m.num_heads / m.num_kv_heads);
        CHECK(a.k.replicas == Replicas::sum);
        CHECK(a.k.type == ElementType::float32);
        for (int r = 0; r < P; ++r) {
          const Plan plan({P, r}, 1, SeqPartition::balanced(P, P), a.qkv());  // validates the pairing
          CHECK(plan.serves(1) == 0);
          CHECK(plan.serves(2) == 0);
          CHECK(plan.serves(0) == TensorSpec::kNone);
          CHECK(plan.first_non_adjoint_tensor() == -1);
          for (std::int64_t h = 0; h < a.query_heads.count(r); ++h) {
            const std::int64_t kv = a.local_kv_head(r, h);
            CHECK(kv >= 0);
            CHECK(kv < a.kv_heads.count(r));
            CHECK(a.kv_heads.begin(r) + kv == (a.query_heads.begin(r) + h) / a.query_per_kv());
          }
        }
      }
}

TEST_CASE("HeadPolicy::automatic: even's partition wherever even's rule holds, balanced's elsewhere; it refuses no head count") {
  for (const auto& m : ulysses_models::kModels)
    for (int P : {1, 2, 3, 4, 6, 8, 16, 32}) {
      const std::string name = m.name;
      CAPTURE(name);
      CAPTURE(P);
      const AttentionShape shape{m.num_heads, m.num_kv_heads, m.head_dim, m.v_head_dim};
      const bool even_holds = ut::expected_even_error(m, P) == Errc{};
      CHECK(resolve_head_policy(HeadPolicy::automatic, P, m.num_heads, m.num_kv_heads) == (even_holds ? HeadPolicy::even : HeadPolicy::balanced));
      CHECK(resolve_head_policy(HeadPolicy::even, P, m.num_heads, m.num_kv_heads) == HeadPolicy::even);
      if (m.num_heads % m.num_kv_heads != 0) continue;  // gqa_invalid under every policy
      const AttentionSpecs a = attention_specs<float>(P, shape, HeadPolicy::automatic);
      const AttentionSpecs b = attention_specs<float>(P, shape, even_holds ? HeadPolicy::even : HeadPolicy::balanced);
      for (int r = 0; r < P; ++r) {
        CHECK(a.query_heads.begin(r) == b.query_heads.begin(r));
        CHECK(a.query_heads.end(r) == b.query_heads.end(r));
        CHECK(a.kv_heads.begin(r) == b.kv_heads.begin(r));
        CHECK(a.kv_heads.end(r) == b.kv_heads.end(r));
      }
    }
  // H = 30 on P = 4 (the guide's heads_not_divisible example): 8, 8, 7, 7 query heads.
  const AttentionSpecs a = attention_specs<float>(4, {30, 5, 64}, HeadPolicy::automatic);
  CHECK(a.query_heads.count(0) == 8);
  CHECK(a.query_heads.count(3) == 7);
  CHECK(resolve_head_policy(HeadPolicy::automatic, 4, 32, 8) == HeadPolicy::even);
  CHECK(resolve_head_policy(HeadPolicy::automatic, 4, 12, 6) == HeadPolicy::balanced);  // even: gqa_group_mismatch
}

TEST_CASE("attention_specs: errors with their codes") {
  CHECK(ut::code_of([] { attention_specs<float>(4, {30, 5, 64}); }) == Errc::heads_not_divisible);
  CHECK(ut::code_of([] { attention_specs<float>(4, {12, 5, 64}, HeadPolicy::balanced); }) == Errc::gqa_invalid);
  CHECK(ut::code_of([] { attention_specs<float>(4, {12, 6, 64}); }) == Errc::gqa_group_mismatch);
  CHECK(ut::code_of([] { attention_specs<float>(4, {12, 6, 0}); }) == Errc::invalid_shape);
  CHECK(ut::code_of([] { attention_specs<float>(0, {12, 6, 64}); }) == Errc::invalid_group);
  // An opaque element type plans fine where no kv head is replicated, and is refused where the
  // backward would have to sum (P=16 > Hkv=8), with what to do.
  struct bf16 {
    unsigned short bits;
  };
  const auto ok = attention_specs<bf16>(4, {32, 8, 128});
  CHECK(ut::code_of([&] { Plan({4, 0}, 1, SeqPartition::even(8, 4), ok.qkv()); }) == Errc{});
  const auto replicated = attention_specs<bf16>(16, {32, 8, 128});
  auto [code, msg] = ut::error_of([&] { Plan({16, 0}, 1, SeqPartition::even(16, 16), replicated.qkv()); });
  CHECK(code == Errc::not_summable);
  CHECK(msg.find("ElementType::bfloat16") != std::string::npos);
  const auto declared = attention_specs<bf16>(16, {32, 8, 128}, ElementType::bfloat16);
  CHECK(ut::code_of([&] { Plan({16, 0}, 1, SeqPartition::even(16, 16), declared.qkv()); }) == Errc{});
}
