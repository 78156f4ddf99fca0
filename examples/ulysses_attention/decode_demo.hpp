// SPDX-License-Identifier: Apache-2.0
// `ulysses_attention --decode`: one decode step of decode context parallelism (DCP) on the
// in-process group, or (--backend mpi) on the processes of `mpiexec -n P`. The KV cache of B
// sequences (S keys each) is split over P ranks (contiguous ranges; --round-robin: blocks of 16
// tokens dealt to the ranks); every rank computes attention of the T new tokens' queries (all H
// heads, GQA) over its own shard — the partial output O_r [B, T, H, Dv] (bf16 with --bf16, else
// fp32) and its LSE [B, T, H] (fp32) — and decode_exchange() gives rank j the merged output of its
// heads (one exchange of O and LSE together, merged by LSE weight on arrival). Compared with
// single-rank attention in double; bytes and time against the two all-gathers engines run today.
//   ulysses_attention --decode [--ranks P] [--batch B] [--seq S] [--tokens T] [--heads H]
//                              [--kv-heads Hkv] [--head-dim D] [--round-robin] [--bf16] [--repeat N]
//                              [--backend local|mpi]
//   mpiexec -n P ulysses_attention --decode --backend mpi ...   (P is the number of processes)
#pragma once

#include <ulysses/comm/local.hpp>
#include <ulysses/decode/exchange.hpp>
#include <ulysses/decode/host.hpp>
#if ULYSSES_DEMO_MPI
#include <ulysses/comm/mpi.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cli.hpp"

namespace decode_demo {

using namespace ulysses;

/// True when the command line asks for the decode demo.
inline bool wanted(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--decode") return true;
  return false;
}

struct Options {
  int P = 4, repeat = 20;
  std::int64_t B = 8, S = 4096, T = 1, H = 32, Hkv = 8, D = 128;
  bool round_robin = false, bf16 = false;
  bool ranks_given = false;       ///< --ranks on the command line (under MPI it must equal the process count)
  std::string backend = "local";  ///< local (threads of this process) or mpi (the processes of mpiexec)
};

inline Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto num = [&] { return ulysses_cli::whole(argc, argv, i, 1, INT_MAX); };
    if (a == "--decode") continue;
    if (a == "--ranks") o.P = static_cast<int>(num()), o.ranks_given = true;
    else if (a == "--batch") o.B = num();
    else if (a == "--seq") o.S = num();
    else if (a == "--tokens") o.T = num();
    else if (a == "--heads") o.H = num();
    else if (a == "--kv-heads") o.Hkv = num();
    else if (a == "--head-dim") o.D = num();
    else if (a == "--repeat") o.repeat = static_cast<int>(num());
    else if (a == "--round-robin") o.round_robin = true;
    else if (a == "--bf16") o.bf16 = true;
    else if (a == "--backend" && i + 1 < argc) o.backend = argv[++i];
    else {
      std::fprintf(stderr, "--decode: unknown flag %s (see the comment of examples/ulysses_attention/decode_demo.hpp)\n", a.c_str());
      std::exit(2);
    }
  }
  if (o.backend != "local" && o.backend != "mpi") {
    std::fprintf(stderr, "--decode: --backend must be local or mpi, not '%s'\n", o.backend.c_str());
    std::exit(2);
  }
  return o;
}

/// The problem every rank computes its partials of: q [B, T, H, D], K and V [B, S, Hkv, D]
/// (random, the same on every rank and process), the KV split over o.P ranks, and attention in double.
struct Problem {
  Options o;
  double scale;
  std::vector<float> q, k, v;
  explicit Problem(const Options& opt) : o(opt), scale(1.0 / std::sqrt(static_cast<double>(opt.D))) {
    std::mt19937 g(1);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    q.resize(static_cast<std::size_t>(o.B * o.T * o.H * o.D));
    k.resize(static_cast<std::size_t>(o.B * o.S * o.Hkv * o.D));
    v.resize(k.size());
    for (auto* x : {&q, &k, &v})
      for (float& e : *x) e = u(g);
  }
  /// The rank holding key s.
  int owner(std::int64_t s) const { return o.round_robin ? static_cast<int>((s / 16) % o.P) : static_cast<int>(s * o.P / o.S); }
  /// Attention of (b, t, h) over the keys of rank `r` (r < 0: all), in double; query t at
  /// position S - T + t (causal). Writes the output row (D) and returns the LSE (-inf: no key).
  double attend(std::int64_t b, std::int64_t t, std::int64_t h, int r, double* out) const {
    const std::int64_t T = o.T, H = o.H, Hkv = o.Hkv, D = o.D, S = o.S, kvh = h / (H / Hkv), pos = S - T + t;
    double m = -INFINITY, sum = 0;
    std::vector<double> z;
    std::vector<std::int64_t> idx;
    for (std::int64_t s = 0; s <= pos; ++s) {
      if (r >= 0 && owner(s) != r) continue;
      double dot = 0;
      for (std::int64_t d = 0; d < D; ++d) dot += double(q[std::size_t(((b * T + t) * H + h) * D + d)]) * k[std::size_t(((b * S + s) * Hkv + kvh) * D + d)];
      z.push_back(dot * scale), idx.push_back(s), m = std::max(m, dot * scale);
    }
    for (std::int64_t d = 0; d < D; ++d) out[d] = 0;
    if (z.empty()) return -INFINITY;
    for (double x : z) sum += std::exp(x - m);
    for (std::size_t i = 0; i < z.size(); ++i)
      for (std::int64_t d = 0; d < D; ++d) out[d] += std::exp(z[i] - m) / sum * v[std::size_t(((b * S + idx[i]) * Hkv + kvh) * D + d)];
    return m + std::log(sum);
  }
};

/// What one rank measured: the merged output's max abs error against single-rank attention, the
/// mean time of a decode_exchange() and of the two all-gathers, the bytes it receives.
struct RankResult {
  double err = 0, ms = 0, ms_ag = 0;
  std::size_t bytes = 0;
};

/// The group's barrier: LocalGroup's own, MPI_Barrier for MpiComm.
inline void sync(LocalGroup::Comm& c) { c.barrier(); }
#if ULYSSES_DEMO_MPI
inline void sync(MpiComm& c) { MPI_Barrier(c.get()); }
#endif

/// This rank's decode step on `comm` (LocalGroup::Comm or MpiComm): its partials over its shard,
/// decode_exchange(), the check of its heads, then the timing against the two all-gathers.
template <class Comm>
RankResult rank_step(Comm& comm, const Problem& pb) {
  const Options& o = pb.o;
  const std::int64_t B = o.B, T = o.T, H = o.H, D = o.D;
  const ElementType type = o.bf16 ? ElementType::bfloat16 : ElementType::float32;
  const auto e = static_cast<std::int64_t>(size_of(type));
  RankResult res;
  const int r = comm.rank();
  const DecodePlan plan(DecodeSpec(B, T, HeadPartition::balanced(H, o.P), D).with_types(type, type), r);
  // This rank's partials over its shard (an engine's attention kernel would write them).
  std::vector<std::byte> part(plan.partial_span_bytes()), out(plan.out_span_bytes()), ws(plan.workspace_bytes());
  std::vector<float> lse(static_cast<std::size_t>(B * T * H)), out_lse(static_cast<std::size_t>(B * T * plan.local_heads()));
  std::vector<double> row(static_cast<std::size_t>(D));
  for (std::int64_t i = 0; i < B * T * H; ++i) {
    const double l = pb.attend(i / (T * H), (i / H) % T, i % H, r, row.data());
    lse[std::size_t(i)] = static_cast<float>(l);
    for (std::int64_t d = 0; d < D; ++d) {
      const float x = std::isinf(l) ? 0.0f : static_cast<float>(row[std::size_t(d)]);
      detail::with_merge_arith(type, [&](auto a) { decltype(a)::store(part.data() + (i * D + d) * e, x); });
    }
  }
  const DecodeBuffers buf = DecodeBuffers().partial(part).lse(lse).out(out).out_lse(out_lse).workspace(ws);
  const HostDecodeExecutor ex;
  decode_exchange(plan, comm, ex, buf);
  // Check this rank's heads against single-rank attention in double.
  for (std::int64_t bt = 0; bt < B * T; ++bt)
    for (std::int64_t j = 0; j < plan.local_heads(); ++j) {
      pb.attend(bt / T, bt % T, plan.head_begin() + j, -1, row.data());
      for (std::int64_t d = 0; d < D; ++d) {
        float x = 0;
        detail::with_merge_arith(type, [&](auto a) { x = decltype(a)::load(out.data() + ((bt * plan.local_heads() + j) * D + d) * e); });
        res.err = std::max(res.err, std::fabs(x - row[std::size_t(d)]));
      }
    }
  // Time: the decode exchange, and the two all-gathers (O, then LSE) it replaces (no merge).
  std::vector<std::byte> ag_o(part.size() * std::size_t(o.P)), ag_l(lse.size() * 4 * std::size_t(o.P));
  std::vector<std::size_t> ob(std::size_t(o.P), part.size()), lb(std::size_t(o.P), lse.size() * 4), zero(std::size_t(o.P), 0), oo(ob), lo(lb);
  for (std::size_t p = 0; p < oo.size(); ++p) oo[p] = p * part.size(), lo[p] = p * lse.size() * 4;
  sync(comm);
  auto t0 = std::chrono::steady_clock::now();
  for (int n = 0; n < o.repeat; ++n) decode_exchange(plan, comm, ex, buf);
  sync(comm);
  auto t1 = std::chrono::steady_clock::now();
  for (int n = 0; n < o.repeat; ++n) {
    comm.alltoallv(part.data(), ob.data(), zero.data(), ag_o.data(), ob.data(), oo.data());
    comm.alltoallv(reinterpret_cast<const std::byte*>(lse.data()), lb.data(), zero.data(), ag_l.data(), lb.data(), lo.data());
  }
  sync(comm);
  auto t2 = std::chrono::steady_clock::now();
  res.ms = std::chrono::duration<double, std::milli>(t1 - t0).count() / o.repeat;
  res.ms_ag = std::chrono::duration<double, std::milli>(t2 - t1).count() / o.repeat;
  res.bytes = plan.received_bytes();
  return res;
}

/// Prints the report: `worst` holds the max over the ranks of err, ms and ms_ag, `bytes0` rank 0's
/// bytes received; 0 when the error is within tolerance.
inline int report(const Options& o, const RankResult& worst, std::size_t bytes0) {
  const double tol = o.bf16 ? 1e-2 : 1e-5;
  const std::int64_t e = o.bf16 ? 2 : 4;
  const std::size_t ag_bytes = std::size_t(o.B * o.T * o.H) * std::size_t(o.D * e + 4) * std::size_t(o.P - 1);
  std::printf("decode step (DCP): P=%d (%s), B=%lld, T=%lld, S=%lld keys split %s, H=%lld, Hkv=%lld, Dv=%lld, %s partials, fp32 LSE\n", o.P,
              o.backend == "mpi" ? "MPI processes" : "in-process", (long long)o.B, (long long)o.T, (long long)o.S,
              o.round_robin ? "round-robin in blocks of 16" : "contiguously", (long long)o.H, (long long)o.Hkv, (long long)o.D,
              o.bf16 ? "bf16" : "fp32");
  std::printf("  merged output vs single-rank attention in double: max abs error %.3g (tolerance %.0e) %s\n", worst.err, tol,
              worst.err <= tol ? "OK" : "FAIL");
  std::printf("  bytes received per rank: decode_exchange %zu (one exchange), all-gathers of O and LSE %zu (two)\n", bytes0, ag_bytes);
  std::printf("  time per step (%s, mean of %d, slowest rank): decode_exchange %.3f ms (pack, exchange, merge); the two all-gathers alone %.3f ms\n",
              o.backend == "mpi" ? "MPI" : "in process", o.repeat, worst.ms, worst.ms_ag);
  return worst.err <= tol ? 0 : 1;
}

/// Runs the demo; 0 when every rank's merged output matches single-rank attention.
inline int run(int argc, char** argv) {
  Options o = parse(argc, argv);
  if (o.H % o.Hkv != 0 || o.S < o.T) {
    std::fprintf(stderr, "--decode: H must be a multiple of Hkv and S >= T\n");
    return 2;
  }
  if (o.backend == "mpi") {
#if ULYSSES_DEMO_MPI
    MPI_Init(&argc, &argv);
    int rc = 0;
    {
      MpiComm comm(MPI_COMM_WORLD);
      if (o.ranks_given && o.P != comm.size()) {
        if (comm.rank() == 0)
          std::fprintf(stderr, "--decode: --ranks %d but mpiexec started %d processes; with --backend mpi, P is the number of processes\n", o.P,
                       comm.size());
        rc = 2;
      } else {
        o.P = comm.size();
        const Problem pb(o);
        const RankResult mine = rank_step(comm, pb);
        double in[3] = {mine.err, mine.ms, mine.ms_ag}, all[3] = {};
        MPI_Allreduce(in, all, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        unsigned long long b0 = mine.bytes;
        MPI_Bcast(&b0, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
        RankResult worst;
        worst.err = all[0], worst.ms = all[1], worst.ms_ag = all[2];
        if (comm.rank() == 0) rc = report(o, worst, static_cast<std::size_t>(b0));
        MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
      }
    }
    MPI_Finalize();
    return rc;
#else
    std::fprintf(stderr, "--decode: this build has no MPI (install libopenmpi-dev and reconfigure)\n");
    return 2;
#endif
  }
  const Problem pb(o);
  std::vector<RankResult> rs(static_cast<std::size_t>(o.P));
  LocalGroup group(o.P);
  group.spawn([&](LocalGroup::Comm& comm) { rs[static_cast<std::size_t>(comm.rank())] = rank_step(comm, pb); });
  RankResult worst;
  for (const RankResult& x : rs) worst.err = std::max(worst.err, x.err), worst.ms = std::max(worst.ms, x.ms), worst.ms_ag = std::max(worst.ms_ag, x.ms_ag);
  return report(o, worst, rs[0].bytes);
}

}  // namespace decode_demo
