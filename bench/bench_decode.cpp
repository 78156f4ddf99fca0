// SPDX-License-Identifier: Apache-2.0
// The decode exchange (decode/exchange.hpp) against the two-collective baseline engines run today,
// in process (LocalGroup, one persistent thread per rank, host memory): every rank holds the
// partial output O_r [B, 1, H, Dv] (bf16) and LSE_r [B, 1, H] (fp32) of one decode step over its
// KV shard; both variants leave every rank with the merged output of its heads [B, 1, H/P, Dv]
// (bf16), the same bits (checked once per shape before timing).
//   decode   — decode_exchange(): one pack, ONE exchange of O and LSE together (one message per
//              peer, the own share never sent), one unpack + merge;
//   ag       — the baseline (the two collectives engines run today, as the issue describes
//              vLLM's "ag_rs"): an all-gather of O, an all-gather of LSE (every rank receives
//              every rank's full partials), then a local merge of its heads (the library's merge,
//              as fast as HostDecodeExecutor's, same order: the same bits).
// Shape: Llama-3.1-8B attention (H=32, Dv=128), T=1, P in {2, 4}, B from 1 to 1024.
// Counters: bytes_received (per rank, per step), and the time per step (wall time). The report
// (bench/report or the table in the reply) takes the ratio ag / decode per (P, B).
//
// Run: bench_decode [--benchmark_filter=REGEX] [--benchmark_min_time=0.2] [--benchmark_out=decode.json]
#include <benchmark/benchmark.h>
#include <ulysses/comm/local.hpp>
#include <ulysses/decode/exchange.hpp>
#include <ulysses/decode/host.hpp>

#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace ulysses;

namespace {

constexpr std::int64_t kH = 32, kDv = 128, kT = 1;

/// P rank threads created once; step(job) runs job(r) on every rank and waits for all.
class Ranks {
 public:
  explicit Ranks(int P) : group_(P) {
    for (int r = 0; r < P; ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  ~Ranks() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    go_.notify_all();
    for (auto& t : threads_) t.join();
  }
  LocalGroup& group() { return group_; }
  void step(const std::function<void(int)>& job) {
    std::unique_lock<std::mutex> l(m_);
    job_ = &job;
    left_ = static_cast<int>(threads_.size());
    ++gen_;
    go_.notify_all();
    done_.wait(l, [&] { return left_ == 0; });
    if (err_) std::rethrow_exception(std::exchange(err_, nullptr));
  }

 private:
  void loop(int r) {
    std::uint64_t seen = 0;
    std::unique_lock<std::mutex> l(m_);
    for (;;) {
      go_.wait(l, [&] { return stop_ || gen_ != seen; });
      if (stop_) return;
      seen = gen_;
      const auto* job = job_;
      l.unlock();
      std::exception_ptr e;
      try {
        (*job)(r);
      } catch (...) {
        e = std::current_exception();
      }
      l.lock();
      if (e && !err_) err_ = e;
      if (--left_ == 0) done_.notify_one();
    }
  }
  LocalGroup group_;
  std::vector<std::thread> threads_;
  std::mutex m_;
  std::condition_variable go_, done_;
  const std::function<void(int)>* job_ = nullptr;
  int left_ = 0;
  std::uint64_t gen_ = 0;
  bool stop_ = false;
  std::exception_ptr err_;
};

Ranks& ranks(int P) {
  static std::map<int, std::unique_ptr<Ranks>> m;
  auto& p = m[P];
  if (!p) p = std::make_unique<Ranks>(P);
  return *p;
}

/// One rank's buffers and plan for (P, B): partials in, merged heads out (ours and the baseline's).
struct Rank {
  DecodePlan plan;
  std::vector<std::byte> o, lse, out, out_base, ws;
  std::vector<std::byte> ag_o, ag_lse;           // the baseline's gathered partials [P][B][T][H][Dv], [P][B][T][H]
  std::vector<std::size_t> o_bytes, o_off, lse_bytes, lse_off, zeros;  // the baseline's all-gathers as alltoallv
  Rank(int P, int r, std::int64_t B)
      : plan(DecodeSpec(B, kT, HeadPartition::even(kH, P), kDv).with_types(ElementType::bfloat16, ElementType::bfloat16), r) {
    std::mt19937 g(static_cast<std::uint32_t>(r * 7919 + B));
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const std::int64_t rows = B * kT * kH;
    o.resize(static_cast<std::size_t>(rows * kDv * 2));
    lse.resize(static_cast<std::size_t>(rows * 4));
    for (std::int64_t i = 0; i < rows * kDv; ++i) {
      const std::uint16_t b = detail::float_to_bfloat16(u(g));
      std::memcpy(o.data() + 2 * i, &b, 2);
    }
    for (std::int64_t i = 0; i < rows; ++i) {
      const float l = 4 * u(g);
      std::memcpy(lse.data() + 4 * i, &l, 4);
    }
    out.assign(plan.out_span_bytes(), std::byte{0});
    out_base.assign(plan.out_span_bytes(), std::byte{0});
    ws.assign(plan.workspace_bytes() + 16, std::byte{0});
    ag_o.resize(o.size() * static_cast<std::size_t>(P));
    ag_lse.resize(lse.size() * static_cast<std::size_t>(P));
    const auto uP = static_cast<std::size_t>(P);
    o_bytes.assign(uP, o.size()), lse_bytes.assign(uP, lse.size()), zeros.assign(uP, 0), o_off.resize(uP), lse_off.resize(uP);
    for (std::size_t p = 0; p < uP; ++p) o_off[p] = p * o.size(), lse_off[p] = p * lse.size();
  }
  DecodeBuffers buffers() {
    return DecodeBuffers{o.data(), o.size(), reinterpret_cast<const float*>(lse.data()), lse.size(), out.data(), out.size(), nullptr, 0,
                         ws.data(), ws.size()};
  }
  /// The baseline: all-gather O, all-gather LSE (alltoallv with the same chunk to every rank, the
  /// own one included, as all_gather_into_tensor writes it), then merge this rank's heads.
  template <class Comm>
  void baseline(Comm& comm) {
    const int P = comm.size();
    comm.alltoallv(o.data(), o_bytes.data(), zeros.data(), ag_o.data(), o_bytes.data(), o_off.data());
    comm.alltoallv(lse.data(), lse_bytes.data(), zeros.data(), ag_lse.data(), lse_bytes.data(), lse_off.data());
    // The local merge, as fast as the library's own (HostDecodeExecutor::merge): four rows at
    // once, their LSE folds interleaved, then each row's element steps; the same bits.
    using A = detail::SumArith<ElementType::bfloat16>;
    const std::int64_t B = plan.batch(), Hr = plan.local_heads(), h0 = plan.head_begin(), rows = B * kT * Hr;
    const std::size_t per_rank_rows = static_cast<std::size_t>(B * kT * kH);
    for (std::int64_t r0 = 0; r0 < rows; r0 += 4) {
      const int g = rows - r0 < 4 ? static_cast<int>(rows - r0) : 4;
      LseStep steps[4][8];  // P <= 8 here
      float l[4];
      std::size_t src[4];
      for (int k = 0; k < g; ++k) {
        const std::int64_t r = r0 + k, bt = r / Hr, j = r - bt * Hr;
        src[k] = static_cast<std::size_t>(bt * kH + h0 + j);
        l[k] = detail::neg_inf();
      }
      for (int p = 0; p < P; ++p)
        for (int k = 0; k < g; ++k) {
          float v;
          std::memcpy(&v, ag_lse.data() + (static_cast<std::size_t>(p) * per_rank_rows + src[k]) * 4, 4);
          steps[k][p] = lse_step(l[k], v);
          l[k] = steps[k][p].lse;
        }
      for (int k = 0; k < g; ++k) {
        float acc[kDv] = {};
        for (int p = 0; p < P; ++p)
          detail::apply_step<A>(steps[k][p], acc, ag_o.data() + (static_cast<std::size_t>(p) * per_rank_rows + src[k]) * kDv * 2, static_cast<int>(kDv));
        std::byte* out = out_base.data() + static_cast<std::size_t>((r0 + k) * kDv * 2);
        for (int e = 0; e < kDv; ++e) A::store(out + 2 * e, acc[e]);
      }
    }
  }
  std::size_t baseline_received() const { return (o.size() + lse.size()) * (o_bytes.size() - 1); }
};

std::vector<std::unique_ptr<Rank>>& setup(int P, std::int64_t B) {
  static std::pair<int, std::int64_t> key{0, 0};
  static std::vector<std::unique_ptr<Rank>> cache;
  if (key != std::make_pair(P, B)) {
    cache.clear();
    for (int r = 0; r < P; ++r) cache.push_back(std::make_unique<Rank>(P, r, B));
    key = {P, B};
    // Both variants once, and the same bits from both (otherwise the comparison means nothing).
    Ranks& rs = ranks(P);
    const std::function<void(int)> check = [&](int r) {
      LocalGroup::Comm c = rs.group().comm(r);
      Rank& me = *cache[static_cast<std::size_t>(r)];
      decode_exchange(me.plan, c, HostDecodeExecutor{}, me.buffers());
      me.baseline(c);
      if (me.out != me.out_base) throw std::runtime_error("bench_decode: the decode exchange and the baseline disagree");
    };
    rs.step(check);
  }
  return cache;
}

enum class Variant { decode, ag };

void bm(benchmark::State& st, Variant v, int P, std::int64_t B) {
  auto& rs = setup(P, B);
  Ranks& group = ranks(P);
  std::vector<LocalGroup::Comm> comms;
  for (int r = 0; r < P; ++r) comms.push_back(group.group().comm(r));
  const HostDecodeExecutor ex;
  const std::function<void(int)> job = [&](int r) {
    Rank& me = *rs[static_cast<std::size_t>(r)];
    LocalGroup::Comm& c = comms[static_cast<std::size_t>(r)];
    if (v == Variant::decode)
      decode_exchange(me.plan, c, ex, me.buffers());
    else
      me.baseline(c);
  };
  for (int k = 0; k < 2; ++k) group.step(job);  // warm: agreement check, message lists
  for (auto _ : st) group.step(job);
  const std::size_t recv = v == Variant::decode ? rs[0]->plan.received_bytes() : rs[0]->baseline_received();
  st.counters["bytes_received"] = static_cast<double>(recv);
  st.counters["collectives"] = v == Variant::decode ? 1 : 2;
  st.SetBytesProcessed(static_cast<std::int64_t>(recv) * static_cast<std::int64_t>(st.iterations()));
  st.SetLabel(v == Variant::decode ? "baseline=decode/ag/P:" + std::to_string(P) + "/B:" + std::to_string(B) : "");
}

void register_all() {
  for (int P : {2, 4})
    for (std::int64_t B : {1, 4, 16, 64, 256, 1024})
      for (Variant v : {Variant::ag, Variant::decode}) {
        const std::string name = std::string("decode/") + (v == Variant::decode ? "exchange" : "ag") + "/P:" + std::to_string(P) + "/B:" + std::to_string(B);
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { bm(st, v, P, B); })->UseRealTime()->Unit(benchmark::kMicrosecond);
      }
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
