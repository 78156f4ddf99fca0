// SPDX-License-Identifier: Apache-2.0
// Every public header under an engine's strict flags (tests/CMakeLists.txt compiles this file with
// -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wsign-conversion -Wold-style-cast -Werror, by
// g++ and, where found, clang++, in C++17 and C++20). Including is not enough: a template's body is
// checked only when it is instantiated, so this file instantiates the entry points over every
// path, the pipeline, the summed backward and (with ULYSSES_STRICT_MPI) MpiComm, and runs the
// in-process ones: each round trip must give back its input bit for bit.
#include <ulysses/ulysses.hpp>
#include <ulysses/compat/v0_1.hpp>  // (the deprecated names compile under the strict flags; none is used)
#include <ulysses/tune/cost.hpp>
#include <ulysses/tune/fit.hpp>
#include <ulysses/tune/advise.hpp>
#include <ulysses/tune/ring_cost.hpp>
#include <ulysses/tune/hybrid.hpp>
#include <ulysses/tune/ring_split.hpp>
#include <ulysses/tune/band_cost.hpp>
#include <ulysses/ring/agreement.hpp>
#include <ulysses/ring/merge.hpp>
#include <ulysses/partition/ring.hpp>
#include <ulysses/transport/ring_step.hpp>
#include <ulysses/ring/rotation.hpp>
#include <ulysses/ring/schedule.hpp>
#include <ulysses/attention/distributed.hpp>
#ifdef ULYSSES_STRICT_MPI
#include <ulysses/ring/mpi_mesh.hpp>
#include <ulysses/comm/mpi.hpp>
#endif
#include <ulysses/comm/device_window_records.hpp>  // the device window's host half: no nvcc, no MPI needed

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <vector>

// Every member of the ring rotations, under the strict flags.
template class ulysses::RingRotation<ulysses::LocalGroup::Comm>;
template class ulysses::RingGradRotation<ulysses::LocalGroup::Comm>;
template void ulysses::check_ring_config(const ulysses::RingConfig&, ulysses::LocalGroup::Comm&, ulysses::LocalGroup::Comm&);
template void ulysses::check_ring_config(const ulysses::Plan&, ulysses::LocalGroup::Comm&, ulysses::LocalGroup::Comm&);
// The distributed attention, both overloads of each direction, under the strict flags.
using StrictAttn = void (*)(const ulysses::AttentionStep&);
using StrictGrad = void (*)(const ulysses::AttentionGradStep&);
template void ulysses::distributed_attention(const ulysses::DistributedAttentionPlan&, ulysses::LocalGroup::Comm&, ulysses::LocalGroup::Comm&,
                                             const ulysses::QkvIn&, ulysses::ByteSpan, StrictAttn&&, ulysses::ByteSpan, ulysses::Workspace,
                                             const ulysses::RowTransforms&);
template void ulysses::distributed_attention(const ulysses::DistributedAttentionPlan&, ulysses::LocalGroup::Comm&, const ulysses::QkvIn&,
                                             ulysses::ByteSpan, StrictAttn&&, ulysses::ByteSpan, ulysses::Workspace,
                                             const ulysses::RowTransforms&);
template void ulysses::distributed_attention_backward(const ulysses::DistributedAttentionPlan&, ulysses::LocalGroup::Comm&,
                                                      ulysses::LocalGroup::Comm&, ulysses::ConstByteSpan, const ulysses::QkvGradOut&, StrictGrad&&,
                                                      ulysses::ConstByteSpan, ulysses::Workspace, const ulysses::RowTransforms&);
template void ulysses::distributed_attention_backward(const ulysses::DistributedAttentionPlan&, ulysses::LocalGroup::Comm&, ulysses::ConstByteSpan,
                                                      const ulysses::QkvGradOut&, StrictGrad&&, ulysses::ConstByteSpan, ulysses::Workspace,
                                                      const ulysses::RowTransforms&);

namespace {

using namespace ulysses;
struct bf16 {
  std::uint16_t bits;
  bool operator==(const bf16& o) const { return bits == o.bits; }
};

// seq→head then head→seq of q, k, v (GQA, kv heads replicated at P=4) on `path`, with K stages
// through HostPipeline when `pipelined`; returns the number of elements that did not come back.
long round_trip(LocalGroup::Comm& comm, Path path, int stages, bool pipelined) {
  const int P = comm.size(), r = comm.rank();
  const AttentionSpecs a = attention_specs<bf16>(P, {8, 2, 16}, ElementType::bfloat16, HeadPolicy::even);
  std::vector<TensorSpec> specs = a.qkv();
  for (TensorSpec& s : specs) s = s.with_replicas(Replicas::owner);  // the plain inverse
  PlanOptions options;
  options.stages = stages;
  options.path = path;
  if (path == Path::two_level) options.nodes = NodeLayout::uniform(P, 2);
  Plan plan({P, r}, 2, SeqPartition::zigzag(24, P), specs, Format::bshd, options);
  std::vector<std::vector<bf16>> seq(3), head(3), back(3);
  for (std::size_t t = 0; t < 3; ++t) {
    seq[t].resize(plan.seq_bytes(static_cast<int>(t)) / sizeof(bf16));
    head[t].resize(plan.head_bytes(static_cast<int>(t)) / sizeof(bf16));
    back[t].resize(seq[t].size());
    for (std::size_t i = 0; i < seq[t].size(); ++i)
      seq[t][i].bits = static_cast<std::uint16_t>(i * 7u + t * 1000u + static_cast<unsigned>(r) * 10000u);
  }
  std::vector<std::byte> ws(plan.workspace_bytes());
  HostExecutor exec;
  if (pipelined) {
    HostExecutor unpack_exec;
    HostPipeline pipeline;
    pipeline.redistribute(plan, Direction::seq_to_head, comm, exec, unpack_exec, {seq[0], seq[1], seq[2]},
                 {head[0], head[1], head[2]}, ws);
    pipeline.redistribute(plan, Direction::head_to_seq, comm, exec, unpack_exec, {head[0], head[1], head[2]},
                 {back[0], back[1], back[2]}, ws);
  } else {
    seq_to_head(plan, comm, exec, QkvIn().q(seq[0]).k(seq[1]).v(seq[2]), QkvOut().q(head[0]).k(head[1]).v(head[2]), ws);  // by name
    head_to_seq(plan, comm, exec, {head[0], head[1], head[2]}, {back[0], back[1], back[2]}, ws);
  }
  long wrong = 0;
  for (std::size_t t = 0; t < 3; ++t)
    for (std::size_t i = 0; i < seq[t].size(); ++i) wrong += !(seq[t][i] == back[t][i]);
  return wrong;
}

// The summed backward of seq→head over fp32 with every kv head on 2 of 4 ranks: each holder's
// partial gradient is 1, so every dk element must be exactly 2.
long summed_backward(LocalGroup::Comm& comm) {
  const int P = comm.size(), r = comm.rank();
  const AttentionSpecs a = attention_specs<float>(P, {4, 2, 8}, HeadPolicy::even);
  Plan plan({P, r}, 1, SeqPartition::balanced(10, P), {TensorSpec(a.k).serving(TensorSpec::kNone)});  // k alone
  std::vector<float> grad_head(plan.head_bytes(0) / sizeof(float), 1.0f), grad_seq(plan.seq_bytes(0) / sizeof(float));
  std::vector<std::byte> ws(plan.workspace_bytes());
  HostExecutor exec;
  seq_to_head_backward(plan, comm, exec, grad_head, grad_seq, ws);
  long wrong = 0;
  for (float g : grad_seq) wrong += g != 2.0f;
  return wrong;
}

}  // namespace

#ifdef ULYSSES_STRICT_MPI
// Instantiated, not run (no MPI_Init here): the MPI adapter's templates under the same flags.
template void ulysses::seq_to_head<ulysses::MpiComm, ulysses::HostExecutor>(
    const Plan&, MpiComm&, HostExecutor&, const TensorList<ConstByteSpan>&, const TensorList<ByteSpan>&, Workspace);
template void ulysses::head_to_seq_backward<ulysses::MpiComm, ulysses::HostExecutor>(
    const Plan&, MpiComm&, HostExecutor&, const TensorList<ConstByteSpan>&, const TensorList<ByteSpan>&, Workspace);
template void ulysses::check_agreement<ulysses::MpiComm>(const Plan&, MpiComm&);
static_assert(ulysses::PathSupport<ulysses::MpiComm, ulysses::HostExecutor>::messages, "MpiComm has exchange_messages");
template void ulysses::seq_to_head<ulysses::MpiWindowComm, ulysses::HostExecutor>(
    const Plan&, MpiWindowComm&, HostExecutor&, const TensorList<ConstByteSpan>&, const TensorList<ByteSpan>&, Workspace);
static_assert(ulysses::PathSupport<ulysses::MpiWindowComm, ulysses::HostExecutor>::direct, "MpiWindowComm has with_peers");
#endif
// The backward of q, k, v by name (attention_call.hpp), instantiated under the same flags.
template void ulysses::seq_to_head_backward<ulysses::LocalGroup::Comm, ulysses::HostExecutor>(
    const Plan&, LocalGroup::Comm&, HostExecutor&, const QkvGradIn&, const QkvGradOut&, Workspace);

int main() {
  std::atomic<long> wrong{0};
  for (Path path : {Path::direct, Path::messages, Path::alltoallv, Path::two_level})
    for (int stages : {1, 2})
      for (bool pipelined : {false, true}) {
        LocalGroup group(4);
        group.spawn([&](LocalGroup::Comm& comm) {
          const long w = round_trip(comm, path, stages, pipelined);
          if (w) std::printf("rank %d: %ld elements wrong (path %d, K=%d, pipelined %d)\n", comm.rank(), w,
                             static_cast<int>(path), stages, static_cast<int>(pipelined));
          wrong += w;
        });
      }
  LocalGroup group(4);
  group.spawn([&](LocalGroup::Comm& comm) { wrong += summed_backward(comm); });
  // The cost model: the degree advice of a small world, and a fit that recovers its own model.
  const CostModel m = CostModel::nvlink_infiniband();
  const std::vector<DegreeChoice> advice = advise_degree({8, 2, 16, 16}, 4096, 16, 4, m);
  Plan p({4, 0}, 1, SeqPartition::even(64, 4), {TensorSpec::of<float>(HeadPartition::even(8, 4), 4)});
  const ExchangeTraffic t = exchange_traffic(p, Direction::seq_to_head, Path::alltoallv);
  const CostModel fit = fit_cost_model({{t, predict_seconds(t, m)}}, m);
  if (advice.empty() || !(fit.intra.alpha_s >= 0)) wrong += 1;
  std::printf("strict_headers: %s\n", wrong ? "WRONG" : "every round trip exact, every summed gradient 2");
  return wrong.load() ? 1 : 0;
}
