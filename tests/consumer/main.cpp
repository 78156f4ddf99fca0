// SPDX-License-Identifier: Apache-2.0
// Consumer check: seq→head→seq of one bf16-sized tensor over 2 in-process ranks; exit 0 when exact.
// The installed attention/ layer compiles from the install tree (a plan's sizes).
#include <ulysses/ulysses.hpp>
#include <ulysses/attention/distributed.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

int main() {
  using namespace ulysses;
  static_assert(ULYSSES_VERSION_MAJOR == 0, "unexpected version");
  const int P = 2;
  const std::int64_t B = 1, S = 6, H = 4, D = 8;
  LocalGroup group(P);
  int bad = 0;
  group.spawn([&](LocalGroup::Comm& comm) {
    Plan plan({P, comm.rank()}, B, SeqPartition::even(S, P), {TensorSpec::of<std::uint16_t>(HeadPartition::even(H, P), D)});
    std::vector<std::uint16_t> x(plan.seq_bytes(0) / 2), y(plan.head_bytes(0) / 2), z(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::uint16_t>(i + 1000 * comm.rank());
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor exec;
    seq_to_head(plan, comm, exec, x, y, ws);
    head_to_seq(plan, comm, exec, y, z, ws);
    if (x != z) bad = 1;
  });
  const DistributedAttentionPlan attn({1, 0}, B, SeqPartition::even(S, 1), attention_specs<float>(1, {H, 2, D}), true);
  if (attn.saved_bytes() == 0 || attn.steps() != 1) bad = 1;
  std::printf("consumer: %s\n", bad ? "round trip FAILED" : "round trip exact");
  return bad;
}
