// SPDX-License-Identifier: Apache-2.0
// The 0.2 release's removals: no 0.1 header path is left (each one's replacement is in CHANGELOG.md),
// and the deprecated names of <ulysses/compat/v0_1.hpp> give what their replacements give.
#include <ulysses/compat/v0_1.hpp>
#include <ulysses/ulysses.hpp>

#include <cstdio>
#include <type_traits>
#include <vector>

#if __has_include(<ulysses/plan.hpp>) || __has_include(<ulysses/copy.hpp>) || __has_include(<ulysses/layout.hpp>) || \
    __has_include(<ulysses/element.hpp>) || __has_include(<ulysses/block.hpp>) || __has_include(<ulysses/partition.hpp>) ||  \
    __has_include(<ulysses/topology.hpp>) || __has_include(<ulysses/mesh.hpp>) || __has_include(<ulysses/attention.hpp>) ||  \
    __has_include(<ulysses/transport.hpp>) || __has_include(<ulysses/pipeline.hpp>) || __has_include(<ulysses/cost.hpp>) ||  \
    __has_include(<ulysses/torch.hpp>) || __has_include(<ulysses/cuda/copy.cuh>) || __has_include(<ulysses/ring/partition.hpp>) || \
    __has_include(<ulysses/ring/mesh.hpp>)
#error "a 0.1 forwarding header is still there (removed in 0.2: see CHANGELOG.md)"
#endif

int main() {
  using namespace ulysses;
  const Plan plan({2, 0}, 1, SeqPartition::even(4, 2), {TensorSpec::of<float>(HeadPartition::even(4, 2), 1)});
  std::vector<float> in(plan.input_bytes(Direction::seq_to_head, 0) / sizeof(float), 1.f);
  std::vector<float> out(plan.output_bytes(Direction::seq_to_head, 0) / sizeof(float), 0.f);
  std::vector<std::byte> ws(plan.workspace_bytes());
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
  const BufferTable old_name = make_buffers(plan, Direction::seq_to_head, {in}, {out}, ws);
  static_assert(std::is_same_v<RingMesh, Mesh>, "RingMesh is Mesh");
  static_assert(std::is_same_v<PeerInputs, PeerRecord>, "PeerInputs is PeerRecord");
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
  const BufferTable new_name = bind_buffers(plan, Direction::seq_to_head, {in}, {out}, ws);
  bool ok = old_name.peers == new_name.peers;
  for (int i = 0; i < BufferIndex::count; ++i) ok = ok && old_name.base[i] == new_name.base[i];
  ok = ok && new_name.base[BufferIndex::input(0)] != nullptr;
  std::printf("compat headers: %s\n", ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
