// SPDX-License-Identifier: Apache-2.0
// bands.hpp and split_phase.hpp under mpiexec (-n 2, 3, 4): the band pipeline over MpiComm (the
// split-phase posts: start() packs and posts, finish() waits and unpacks) and over MpiWindowComm
// (the peer copy unbanded, messages for a band), forward and backward, gives the bits of the
// unbanded layer for every band count (GQA, MQA with replicated kv heads, uneven H); a rank that
// leaves a split-phase exchange unfinished is every rank's coded error within the deadline.
#include "mpi_groups.hpp"

#include <ulysses/bands.hpp>
#include <ulysses/comm/mpi.hpp>
#include <ulysses/host/executor.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "band_case.hpp"
#include "expect_error.hpp"

using namespace ulysses;

namespace {
/// A window big enough to stage every tensor of case c on this rank (a few times over).
std::size_t window_bytes(const bt::BandCase& c) {
  return static_cast<std::size_t>(c.B * c.S * (c.H + 2 * c.Hkv) * c.D) * sizeof(float) * 8 + (1u << 16);
}
}  // namespace

TEST_CASE("banded_attention over MpiComm: the bits of the unbanded layer for every band count, split-phase posts") {
  for (int P = 2; P <= 4; ++P)
    ut::on_groups_of(P, [&](MPI_Comm sub) {
      MpiComm comm(sub);
      HostExecutor exec;
      for (const bt::BandCase& c : bt::band_cases(P)) {
        CAPTURE(c.name());
        const bt::BandResult ref = bt::run_layer(c, comm, exec, 0);
        for (int G = 1; G <= bt::max_bands(c); ++G) {
          CAPTURE(G);
          const bt::BandResult got = bt::run_layer(c, comm, exec, G);
          CHECK(got == ref);
          CHECK(got.late == 0);
          CHECK(got.early == 0);
        }
      }
    });
}

TEST_CASE("banded_attention over MpiWindowComm: the bits of the unbanded layer for every band count") {
  for (int P = 2; P <= 4; ++P)
    ut::on_groups_of(P, [&](MPI_Comm sub) {
      MpiComm comm(sub);
      HostExecutor exec;
      for (const bt::BandCase& c : bt::band_cases(P)) {
        CAPTURE(c.name());
        MpiWindow win(comm, window_bytes(c));
        MpiWindowComm wc(comm, win);
        const bt::BandResult ref = bt::run_layer(c, wc, exec, 0);
        for (int G = 1; G <= bt::max_bands(c); ++G) {
          CAPTURE(G);
          CHECK(bt::run_layer(c, wc, exec, G) == ref);
        }
      }
    });
}

TEST_CASE("split-phase over MpiComm: a rank that destroys its handle before finish() is every rank's error, in time") {
  ut::on_groups_of(3, [&](MPI_Comm sub) {
    MpiComm comm(sub, MpiComm::kIntMaxBytes, std::chrono::seconds(20));
    HostExecutor exec;
    const int r = comm.rank();
    const AttentionSpecs specs = attention_specs<float>(3, AttentionShape{6, 3, 4, 4});
    const Plan plan({3, r}, 1, SeqPartition::even(9, 3), specs.qkv());
    std::vector<float> q(plan.seq_bytes(0) / 4, 1.0f), k(plan.seq_bytes(1) / 4, 2.0f), v(plan.seq_bytes(2) / 4, 3.0f);
    std::vector<float> q2(plan.head_bytes(0) / 4), k2(plan.head_bytes(1) / 4), v2(plan.head_bytes(2) / 4);
    std::vector<std::byte> ws(plan.workspace_bytes());
    const TensorList<ConstByteSpan> in{q, k, v};
    const TensorList<ByteSpan> out{q2, k2, v2};
    {
      auto h = start_seq_to_head(plan, comm, exec, in, out, ws);
      CHECK(std::string(h.progress_name()) == "split");
      if (r != 1) finish(h);
    }
    const auto t = ut::timed_error_of([&] { seq_to_head(plan, comm, exec, in, out, ws); });
    CHECK(t.code == Errc::aborted);
    CHECK(t.message.find("rank 1 destroyed a split-phase seq_to_head before its finish()") != std::string::npos);
    CHECK(t.ms < 10000);
  });
}

int main(int argc, char** argv) { return ut::mpi_doctest_main(argc, argv); }
