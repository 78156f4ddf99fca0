// SPDX-License-Identifier: Apache-2.0
// MPI benchmarks, one rank per process: the exchange alone (MpiComm's MPI_Alltoallv) and
// seq_to_head / head_to_seq of q, k, v end to end, B in {1, 4} — fused in one exchange (`fused`: the
// default path, one message per piece, in place where contiguous; `fused_alltoallv`: pack, one
// MPI_Alltoallv, unpack), as three separate exchanges, and DeepSpeed's op sequence written plainly
// over the same MpiComm (`deepspeed`: permute copy, MPI_Alltoallv of P equal chunks, and at B > 1 the
// second permute copy) — against a bare MPI_Alltoall of the same bytes (bytes per rank in P equal chunks). `two_pass_floor` is a memcpy of the peers' bytes followed by that MPI_Alltoall: the
// least time of any method that copies the exchanged bytes once more than MPI_Alltoall does.
// P is the size of MPI_COMM_WORLD (run with -n 2 and -n 4). Shapes: Llama-3.1-8B attention
// (H=32, Hkv=8, D=128), S in {4096, 16384}, fp32 and bf16, bshd.
//
// Run: mpiexec -n 4 bench_mpi [--benchmark_min_time=0.2] [--benchmark_out=mpi_p4.json]
// Every rank runs every benchmark; only rank 0 reports (the other ranks drop the --benchmark_out*
// flags and use a silent reporter). Timing: each iteration is MPI_Barrier, MPI_Wtime around the
// operation, and the maximum over ranks (MPI_Allreduce) as the benchmark's manual time; every rank
// thus sees the same times and Google Benchmark picks the same iteration counts on every rank.
// The host executor is single-threaded (one rank per process); ULYSSES_BENCH_STREAMING_MIN_BYTES
// overrides its HostExecutorOptions::streaming_min_bytes (e.g. 18446744073709551615: never stream),
// to compare cached and streaming stores.
#include "common.hpp"
#include "mpi_bench.hpp"

#include <ulysses/comm/mpi.hpp>

#include <climits>
#include <functional>
#include <iostream>
#include <tuple>

using namespace ub;

namespace {

int g_rank = 0, g_size = 1;

/// Rank `g_rank`'s setup for (S, elem, B), cached (Google Benchmark calls a function several times).
RankSetup& setup(std::int64_t S, int elem, std::int64_t B) {
  static std::tuple<std::int64_t, int, std::int64_t> key{};
  static std::unique_ptr<RankSetup> cache;
  if (!cache || key != std::make_tuple(S, elem, B)) {
    cache.reset();
    cache = std::make_unique<RankSetup>(g_size, g_rank, S, elem, Mem::bshd, B);
    key = {S, elem, B};
  }
  return *cache;
}

enum class What {
  alltoall, two_pass, exchange,
  s2h_fused, s2h_alltoallv, s2h_separate, s2h_deepspeed, h2s_fused, h2s_alltoallv, h2s_separate, h2s_deepspeed
};

void bm(benchmark::State& st, What what, std::int64_t S, int elem, std::int64_t B) {
  RankSetup& r = setup(S, elem, B);
  MpiComm comm(MPI_COMM_WORLD);
  HostExecutorOptions o;
  if (const char* e = std::getenv("ULYSSES_BENCH_STREAMING_MIN_BYTES")) o.streaming_min_bytes = std::stoull(e);
  HostExecutor ex(o);
  const std::size_t bytes = r.bytes_per_rank();
  const std::size_t chunk = bytes / static_cast<std::size_t>(g_size);
  if (chunk > static_cast<std::size_t>(INT_MAX)) {
    st.SkipWithError("chunk over INT_MAX bytes");
    return;
  }
  const Direction d = what == What::h2s_fused || what == What::h2s_alltoallv || what == What::h2s_separate || what == What::h2s_deepspeed
                          ? Direction::head_to_seq
                          : Direction::seq_to_head;
  const BufferTable table = r.table(d);
  std::function<void()> op;
  Buf ds_send, ds_recv;  // DeepSpeed's scratch
  if (what == What::s2h_deepspeed || what == What::h2s_deepspeed) {
    const std::size_t q_bytes = static_cast<std::size_t>(B * (S / g_size) * kH * kD * elem);
    ds_send = Buf(q_bytes, 0x44), ds_recv = Buf(q_bytes, 0x55);
  }
  switch (what) {
    case What::alltoall:
      op = [&] {
        MPI_Alltoall(r.seq_buf.data(), static_cast<int>(chunk), MPI_BYTE, r.head_buf.data(), static_cast<int>(chunk), MPI_BYTE,
                     MPI_COMM_WORLD);
      };
      break;
    case What::two_pass:  // the floor of any method that copies the peers' bytes once more than MPI_Alltoall
      op = [&] {
        std::memcpy(r.ws.data(), r.seq_buf.data(), bytes - chunk);
        MPI_Alltoall(r.seq_buf.data(), static_cast<int>(chunk), MPI_BYTE, r.head_buf.data(), static_cast<int>(chunk), MPI_BYTE,
                     MPI_COMM_WORLD);
      };
      break;
    case What::exchange: op = [&] { exchange(*r.fused, d, comm, table); }; break;
    case What::s2h_alltoallv:
    case What::h2s_alltoallv:
      op = [&] { redistribute(*r.fused_alltoallv, d, comm, ex, r.inputs(d), r.outputs(d), r.workspace()); };
      break;
    case What::s2h_fused:
    case What::h2s_fused: op = [&] { redistribute(*r.fused, d, comm, ex, r.inputs(d), r.outputs(d), r.workspace()); }; break;
    case What::s2h_separate:
    case What::h2s_separate:
      op = [&] {
        for (int t = 0; t < 3; ++t)
          redistribute(*r.single[static_cast<std::size_t>(t)], d, comm, ex, r.inputs(d, t, 1), r.outputs(d, t, 1), r.workspace());
      };
      break;
    case What::s2h_deepspeed:
    case What::h2s_deepspeed:
      op = [&] {
        const bool s2h = d == Direction::seq_to_head;
        for (int t = 0; t < 3; ++t)
          deepspeed_op_sequence(comm, d, B, S, t == 0 ? kH : kHkv, kD, elem, s2h ? r.seq_ptr[t] : r.head_ptr[t],
                                s2h ? r.head_ptr[t] : r.seq_ptr[t], ds_send.data(), ds_recv.data());
      };
      break;
  }
  mpi_timed_loop(st, op);
  set_counters(st, bytes, g_size);
  if (what == What::s2h_fused || what == What::h2s_fused)
    st.counters["copies"] = r.fused->copies(d, choose_path<MpiComm, HostExecutor>(*r.fused)).executor;
  if (what == What::s2h_deepspeed || what == What::h2s_deepspeed) st.counters["copies"] = B > 1 ? 2 : 1;
}

void register_all() {
  auto reg = [](const std::string& name, const std::string& lab, What w, std::int64_t S, int elem, std::int64_t B) {
    benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
      bm(st, w, S, elem, B);
      st.SetLabel(lab);
    })->UseManualTime();
  };
  for (int elem : kElemBytes)
    for (std::int64_t S : kSeqs)
      for (std::int64_t B : {1, 4}) {
        const std::string base = case_name("mpi_alltoall", elem, S, g_size, B) + "/MPI_Alltoall";
        reg(base, "", What::alltoall, S, elem, B);
        if (B == 1) {
          reg(case_name("mpi_exchange", elem, S, g_size) + "/alltoallv", label(base), What::exchange, S, elem, B);
          reg(case_name("mpi_exchange", elem, S, g_size) + "/two_pass_floor", label(base), What::two_pass, S, elem, B);
        }
        for (bool s2h : {true, false}) {
          const std::string fam = case_name(s2h ? "mpi_seq_to_head" : "mpi_head_to_seq", elem, S, g_size, B);
          reg(fam + "/fused", label(base, fam + "/separate") + ";deepspeed=" + fam + "/deepspeed", s2h ? What::s2h_fused : What::h2s_fused,
              S, elem, B);
          reg(fam + "/fused_alltoallv", label(base), s2h ? What::s2h_alltoallv : What::h2s_alltoallv, S, elem, B);
          reg(fam + "/separate", label(base), s2h ? What::s2h_separate : What::h2s_separate, S, elem, B);
          reg(fam + "/deepspeed", label(base), s2h ? What::s2h_deepspeed : What::h2s_deepspeed, S, elem, B);
        }
      }
}

}  // namespace

int main(int argc, char** argv) { return mpi_benchmark_main(argc, argv, "mpi", g_rank, g_size, register_all); }
