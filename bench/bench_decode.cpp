// SPDX-License-Identifier: Apache-2.0
// The decode exchange (decode/exchange.hpp) against the two-collective baseline engines run today,
// in process (LocalGroup, P persistent rank threads: Lockstep, common.hpp), host memory: every
// rank holds the partial output O_r [B, 1, H, Dv] (bf16) and LSE_r [B, 1, H] (fp32) of one decode
// step over its KV shard; every variant leaves every rank with the merged output of its heads
// [B, 1, H/P, Dv] (bf16), the same bits (checked once per shape before timing):
//   exchange — decode_exchange() on the default path (Path::automatic: messages): one pack,
//              ONE exchange of O and LSE together (one message per peer, the own share never
//              sent), one unpack + merge;
//   direct   — decode_exchange() on Path::direct: every rank merges its heads reading its
//              peers' O_r and LSE_r in place (LocalGroup's with_peers()): no pack, no transport;
//   ag       — the baseline (DecodeRank::baseline, common.hpp): LocalGroup's all-gather of O, then
//              of LSE (every rank receives every rank's full partials), then the local merge of
//              its heads by the library's own merge.
// Shape: Llama-3.1-8B attention (H=32, Dv=128), T=1, P in {2, 4}, B from 1 to 1024.
// Timing: wall time of one step of all ranks (the slowest rank's), 2 warm-up steps each; the
// shapes' buffers are kept, so --benchmark_enable_random_interleaving (bench/run_decode.sh) can
// alternate the variants' repetitions.
// Counters: bytes_received (per rank, per step), collectives. bench/report pairs each variant with
// its label's baseline (ratio = ag time / variant time; bench/run_decode.sh).
//
// Run: bench_decode [--benchmark_filter=REGEX] [--benchmark_min_time=0.2] [--benchmark_out=decode.json]
#include "common.hpp"

#include <ulysses/comm/local.hpp>
#include <ulysses/decode/exchange.hpp>
#include <ulysses/decode/host.hpp>

using namespace ub;

namespace {

enum class Variant { exchange, direct, ag };
const char* variant_name(Variant v) { return v == Variant::exchange ? "exchange" : v == Variant::direct ? "direct" : "ag"; }

/// The ranks of (P, B), built once and kept (with --benchmark_enable_random_interleaving the
/// shapes alternate), every variant checked against the baseline on the first use.
std::vector<std::unique_ptr<DecodeRank>>& setup(int P, std::int64_t B) {
  static std::map<std::pair<int, std::int64_t>, std::vector<std::unique_ptr<DecodeRank>>> cache;
  auto& ranks = cache[{P, B}];
  if (ranks.empty()) {
    for (int r = 0; r < P; ++r) ranks.push_back(std::make_unique<DecodeRank>(P, r, B));
    // Every variant once, and the same bits from each (otherwise the comparison means nothing).
    Lockstep& ls = lockstep(P);
    const std::function<void(int)> check = [&](int r) {
      LocalGroup::Comm c = ls.group().comm(r);
      DecodeRank& me = *ranks[static_cast<std::size_t>(r)];
      for (const DecodePlan* plan : {&me.plan, &me.direct_plan}) {
        decode_exchange(*plan, c, HostDecodeExecutor{}, me.buffers());
        me.baseline(P, [&](const void* s, std::size_t n, void* d) { c.allgather(s, n, d); });
        if (!me.agree()) throw std::runtime_error("bench_decode: the decode exchange and the baseline disagree");
      }
    };
    ls.step(check);
  }
  return ranks;
}

void bm(benchmark::State& st, Variant v, int P, std::int64_t B) {
  auto& rs = setup(P, B);
  Lockstep& ls = lockstep(P);
  std::vector<LocalGroup::Comm> comms;
  for (int r = 0; r < P; ++r) comms.push_back(ls.group().comm(r));
  const HostDecodeExecutor ex;
  const std::function<void(int)> job = [&](int r) {
    DecodeRank& me = *rs[static_cast<std::size_t>(r)];
    LocalGroup::Comm& c = comms[static_cast<std::size_t>(r)];
    if (v == Variant::ag)
      me.baseline(P, [&](const void* s, std::size_t n, void* d) { c.allgather(s, n, d); });
    else
      decode_exchange(v == Variant::direct ? me.direct_plan : me.plan, c, ex, me.buffers());
  };
  for (int k = 0; k < 2; ++k) ls.step(job);  // warm-up, the same for every variant (agreement check, message lists)
  for (auto _ : st) ls.step(job);
  const DecodeRank& r0 = *rs[0];
  decode_counters(st, v == Variant::ag ? r0.baseline_received(P) : r0.plan.received_bytes(), v == Variant::ag ? 2 : 1,
                  v == Variant::ag ? "" : decode_name("decode", "ag", P, B));
}

void register_all() {
  for (int P : kDegrees)
    for (std::int64_t B : kDecodeBatches)
      for (Variant v : {Variant::ag, Variant::exchange, Variant::direct})
        benchmark::RegisterBenchmark(decode_name("decode", variant_name(v), P, B).c_str(), [=](benchmark::State& st) { bm(st, v, P, B); })
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_all();
  benchmark::AddCustomContext("ulysses_benchmark", "decode");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
