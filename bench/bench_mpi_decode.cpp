// SPDX-License-Identifier: Apache-2.0
// The decode exchange (decode/exchange.hpp) between MPI processes, one rank per process, against
// the two-collective baseline engines run today: bench_decode.cpp's comparison under MPI. Every
// rank holds O_r [B, 1, H, Dv] (bf16) and LSE_r [B, 1, H] (fp32) (DecodeRank, common.hpp); every
// variant leaves it with the merged output of its heads [B, 1, H/P, Dv] (bf16), the same bits
// (checked once per shape before timing):
//   exchange — decode_exchange() over MpiComm, the default path (one MPI_Isend/Irecv per peer
//              carrying O and LSE together; the own share never sent);
//   direct   — decode_exchange() on Path::direct over MpiWindowComm, O_r and LSE_r allocated
//              in the node's shared window: every rank merges its heads reading its peers'
//              partials in place (no pack, no MPI message);
//   ag       — the baseline (DecodeRank::baseline): MPI_Allgather of O, MPI_Allgather of LSE
//              (what all_gather_into_tensor does), then the local merge of its heads by the
//              library's own merge.
// Shape: Llama-3.1-8B attention (H=32, Dv=128), T=1, B from 1 to 1024; P is the size of
// MPI_COMM_WORLD (run with -n 2 and -n 4, all on one node). Timing as bench_mpi.cpp
// (mpi_bench.hpp: per iteration a barrier, MPI_Wtime around the step, the maximum over ranks),
// 2 warm-up steps for every variant; only rank 0 reports. bench/run_decode.sh runs it.
//
// Run: mpiexec -n 4 bench_mpi_decode [--benchmark_min_time=0.2] [--benchmark_out=decode_mpi_p4.json]
#include "common.hpp"
#include "mpi_bench.hpp"

#include <ulysses/comm/mpi.hpp>
#include <ulysses/comm/mpi_window.hpp>

#include <tuple>

using namespace ub;

namespace {

int g_rank = 0, g_size = 1;

enum class Variant { exchange, direct, ag };
const char* variant_name(Variant v) { return v == Variant::exchange ? "exchange" : v == Variant::direct ? "direct" : "ag"; }

/// This rank's decode step for B (its DecodeRank) and, for the direct path, a shared window
/// holding copies of O_r and LSE_r.
struct MpiDecodeSetup {
  DecodeRank rank;
  MpiComm comm{MPI_COMM_WORLD};
  MpiWindow win;
  MpiWindowComm wc;
  WindowSpan o, lse;

  explicit MpiDecodeSetup(std::int64_t B)
      : rank(g_size, g_rank, B),
        win(comm, rank.o.size() + rank.lse.size() + 4 * MpiWindow::kAlignment),
        wc(comm, win) {
    o = win.allocate(rank.o.size());
    lse = win.allocate(rank.lse.size());
    std::memcpy(o.data(), rank.o.data(), o.size());
    std::memcpy(lse.data(), rank.lse.data(), lse.size());
    MPI_Barrier(MPI_COMM_WORLD);
  }
  DecodeBuffers window_buffers() const {
    return rank.buffers().partial({o.data(), o.size()}).lse({lse.data(), lse.size()});
  }
  /// One step of variant v.
  void step(Variant v) {
    const HostDecodeExecutor ex;
    if (v == Variant::exchange) {
      decode_exchange(rank.plan, comm, ex, rank.buffers());
    } else if (v == Variant::direct) {
      decode_exchange(rank.direct_plan, wc, ex, window_buffers());
    } else {
      rank.baseline(g_size, [](const void* s, std::size_t n, void* d) {
        MPI_Allgather(s, static_cast<int>(n), MPI_BYTE, d, static_cast<int>(n), MPI_BYTE, MPI_COMM_WORLD);
      });
    }
  }
};

std::unique_ptr<MpiDecodeSetup> cache;  // the current setup (reset before MPI_Finalize: its window is freed collectively)

MpiDecodeSetup& setup(std::int64_t B) {
  static std::int64_t key = 0;
  if (!cache || key != B) {
    cache.reset();  // every rank frees the previous window (collective) before the next one
    cache = std::make_unique<MpiDecodeSetup>(B);
    key = B;
    // Every variant once, and the same bits from each (otherwise the comparison means nothing).
    int bad = 0, any = 0;
    for (Variant v : {Variant::exchange, Variant::direct}) {
      cache->step(v);
      cache->step(Variant::ag);
      bad |= cache->rank.agree() ? 0 : 1;
    }
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) {
      if (g_rank == 0) std::cerr << "bench_mpi_decode: the decode exchange and the baseline disagree at B=" << B << "\n";
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  return *cache;
}

void bm(benchmark::State& st, Variant v, std::int64_t B) {
  MpiDecodeSetup& s = setup(B);
  for (int k = 0; k < 2; ++k) s.step(v);  // warm-up, the same for every variant
  mpi_timed_loop(st, [&] { s.step(v); });
  decode_counters(st, v == Variant::ag ? s.rank.baseline_received(g_size) : s.rank.plan.received_bytes(), v == Variant::ag ? 2 : 1,
                  v == Variant::ag ? "" : decode_name("mpi_decode", "ag", g_size, B));
}

void register_all() {
  for (std::int64_t B : kDecodeBatches)
    for (Variant v : {Variant::ag, Variant::exchange, Variant::direct})
      benchmark::RegisterBenchmark(decode_name("mpi_decode", variant_name(v), g_size, B).c_str(), [=](benchmark::State& st) { bm(st, v, B); })
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
}

void done() { cache.reset(); }

}  // namespace

int main(int argc, char** argv) { return mpi_benchmark_main(argc, argv, "mpi_decode", g_rank, g_size, register_all, done); }
