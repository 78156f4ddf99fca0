// SPDX-License-Identifier: Apache-2.0
// Host benchmarks (one process): pack and unpack on the host executor against std::memcpy of the
// same bytes, and the in-process group (LocalGroup, one persistent thread per rank) — the exchange
// alone, and seq_to_head / head_to_seq of q, k, v end to end (B in {1, 4}: the default path,
// which is direct in-process; the message and all-to-all-v paths; three separate exchanges; and
// DeepSpeed's op sequence written plainly on the same group) — against a bare in-process
// all-to-all of the same bytes. Shapes: Llama-3.1-8B attention
// (H=32, Hkv=8, D=128), B=1, S in {4096, 16384}, P in {2, 4}, fp32 and bf16; and head→seq of
// dq, dk, dv summing the kv heads' replicas (the backward of seq→head) against taking the owner's
// copy, at P=4 (no replica) and P=16 (every kv head on 2 ranks).
//
// Run: bench_host [--benchmark_filter=REGEX] [--benchmark_min_time=0.2] [--benchmark_out=host.json]
// Naming, labels and counters: see common.hpp; bench/report turns the JSON into a table and chart.
//
// Timing: single-threaded pack / unpack / memcpy use CPU time (Google Benchmark's default: robust
// to other load on a shared machine); the 2-thread executor and the in-process group use wall
// time. The default path of seq_to_head / head_to_seq (".../fused") is timed as a user's call
// costs and as ulysses_perf --backend local times it (time_calls()): each call after a barrier
// of the group, the slowest rank's time, alternating with the bare all-to-all-v of the same bytes
// through the same LocalGroup::Comm; the counters call_s and bare_s are the medians, and
// bench/report compares those two. The bare in-process all-to-all copies P equal chunks of the rank's bytes (its own chunk
// included, like MPI_Alltoall) straight from the peers' buffers, with no plan and no barrier
// beyond the driver's: it is the memory-bandwidth limit of an in-process exchange. The exchange
// alone (LocalGroup::Comm::alltoallv) moves only the P-1 peer chunks: a rank's own chunk is
// copied by unpack.
#include "common.hpp"
#include "lockstep.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <tuple>

using namespace ub;

namespace {

// ---- fixtures, cached: Google Benchmark calls a benchmark function several times ---------------

using Key = std::tuple<int, std::int64_t, int, Mem, int, std::int64_t>;  // P, S, elem, mem, ranks built, B

/// The setups of ranks 0..n-1 for (P, S, elem, mem, B); the previous entry is freed first.
std::vector<std::unique_ptr<RankSetup>>& setups(int P, std::int64_t S, int elem, Mem mem, int n, std::int64_t B = kB) {
  static Key key{};
  static std::vector<std::unique_ptr<RankSetup>> cache;
  const Key k{P, S, elem, mem, n, B};
  if (cache.empty() || k != key) {
    cache.clear();
    for (int r = 0; r < n; ++r) cache.push_back(std::make_unique<RankSetup>(P, r, S, elem, mem, B));
    key = k;
  }
  return cache;
}

/// Source and destination of `bytes` for the memcpy baseline.
std::pair<Buf*, Buf*> memcpy_bufs(std::size_t bytes) {
  static Buf src, dst;
  if (src.size() != bytes) {
    src = Buf();
    dst = Buf();
    src = Buf(bytes, 0x44);
    dst = Buf(bytes, 0x55);
  }
  return {&src, &dst};
}

// ---- host pack / unpack ------------------------------------------------------------------------

void bm_pack_unpack(benchmark::State& st, bool is_pack, int P, std::int64_t S, int elem, Mem mem, int threads) {
  RankSetup& r = *setups(P, S, elem, mem, 1)[0];
  const Direction d = Direction::seq_to_head;
  const BufferTable t = r.table(d);
  const StageLists& s = r.fused->stage_lists(d);
  HostExecutor ex(threads);
  for (auto _ : st) {
    if (is_pack)
      pack(*r.fused, d, ex, t);
    else
      unpack(*r.fused, d, ex, t);
    benchmark::ClobberMemory();
  }
  set_counters(st, list_bytes(is_pack ? s.pack : s.unpack));
}

void bm_memcpy(benchmark::State& st, std::size_t bytes) {
  auto [src, dst] = memcpy_bufs(bytes);
  for (auto _ : st) {
    std::memcpy(dst->data(), src->data(), bytes);
    benchmark::ClobberMemory();
  }
  set_counters(st, bytes);
}

/// Bytes of rank 0's seq_to_head pack (resp. unpack) list: the same in every memory arrangement.
std::size_t stage_bytes(bool is_pack, int P, std::int64_t S, int elem) {
  const auto q = HeadPartition::even(kH, P);
  const auto kv = HeadPartition::gqa(q, kHkv);
  std::vector<TensorSpec> specs;
  for (const HeadPartition& h : {q, kv, kv}) specs.push_back(TensorSpec{h, kD, static_cast<std::size_t>(elem), std::nullopt, std::nullopt});
  const Plan p(Group{P, 0}, kB, SeqPartition::even(S, P), specs);
  const StageLists& s = p.stage_lists(Direction::seq_to_head);
  return list_bytes(is_pack ? s.pack : s.unpack);
}


/// What an in-process benchmark runs: the bare all-to-all of the bytes, the exchange alone, or a
/// redistribution of q, k, v (by `how`) in one direction.
enum class Local { bare, exchange, redistribute };
/// How a redistribution of q, k, v is run: one plan on its default path (direct in-process) or on
/// a forced path, three one-tensor plans, or DeepSpeed's op sequence (three all-to-alls).
enum class How { fused, messages, alltoallv, separate, deepspeed };

/// Times what one user's call costs, as ulysses_perf --backend local does: per benchmark
/// iteration, every rank waits at a barrier of the group and times call(r), then waits at a
/// barrier and times the bare all-to-all-v of the same `bytes` (P equal chunks, its own included)
/// through the same LocalGroup::Comm between contiguous buffers. The iteration's time is the
/// slowest rank's call (manual time); the counters call_s and bare_s are the medians over the
/// iterations of the call's and of the bare all-to-all-v's times, measured alternately, so that
/// both see the same moments of load (bench/report takes their ratio).
void time_calls(benchmark::State& st, Lockstep& ls, int P, std::size_t bytes, std::vector<LocalGroup::Comm>& comms,
                const std::function<void(int)>& call) {
  const std::size_t chunk = bytes / static_cast<std::size_t>(P);
  std::vector<Buf> send, recv;
  std::vector<std::size_t> counts(static_cast<std::size_t>(P), chunk), offsets(static_cast<std::size_t>(P));
  for (int p = 0; p < P; ++p) {
    send.emplace_back(chunk * static_cast<std::size_t>(P), 0x44), recv.emplace_back(chunk * static_cast<std::size_t>(P), 0x55);
    offsets[static_cast<std::size_t>(p)] = static_cast<std::size_t>(p) * chunk;
  }
  std::vector<double> t_call(static_cast<std::size_t>(P)), t_bare(static_cast<std::size_t>(P));
  const std::function<void(int)> pair = [&](int r) {
    const auto i = static_cast<std::size_t>(r);
    LocalGroup::Comm& c = comms[i];
    c.barrier();
    auto t0 = std::chrono::steady_clock::now();
    call(r);
    t_call[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    c.barrier();
    t0 = std::chrono::steady_clock::now();
    c.alltoallv(send[i].data(), counts.data(), offsets.data(), recv[i].data(), counts.data(), offsets.data());
    t_bare[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int w = 0; w < 2; ++w) ls.step(pair);  // warm-up pairs
  std::vector<double> calls, bares;
  for (auto _ : st) {
    ls.step(pair);
    calls.push_back(*std::max_element(t_call.begin(), t_call.end()));
    bares.push_back(*std::max_element(t_bare.begin(), t_bare.end()));
    st.SetIterationTime(calls.back());
  }
  auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  st.counters["call_s"] = median(calls);
  st.counters["bare_s"] = median(bares);
}

void bm_local(benchmark::State& st, Local what, How how, Direction d, int P, std::int64_t S, int elem, std::int64_t B) {
  auto& rs = setups(P, S, elem, Mem::bshd, P, B);
  Lockstep& ls = lockstep(P);
  std::vector<LocalGroup::Comm> comms;
  std::vector<BufferTable> tables;
  std::vector<HostExecutor> execs(static_cast<std::size_t>(P));  // one per rank, single-threaded
  std::vector<Buf> ds_send, ds_recv;                             // DeepSpeed's scratch, per rank
  for (int r = 0; r < P; ++r) {
    comms.push_back(ls.group().comm(r));
    tables.push_back(rs[static_cast<std::size_t>(r)]->table(Direction::seq_to_head));
    if (how == How::deepspeed) {
      const std::size_t q_bytes = static_cast<std::size_t>(B * (S / P) * kH * kD * elem);
      ds_send.emplace_back(q_bytes, 0x44), ds_recv.emplace_back(q_bytes, 0x55);
    }
  }
  const std::size_t bytes = rs[0]->bytes_per_rank(), chunk = bytes / static_cast<std::size_t>(P);
  const std::function<void(int)> job = [&](int r) {
    const auto i = static_cast<std::size_t>(r);
    RankSetup& me = *rs[i];
    LocalGroup::Comm& c = comms[i];
    HostExecutor& ex = execs[i];
    if (what == Local::bare) {  // P equal chunks (own one included) straight from the peers' buffers
      for (int p = 0; p < P; ++p)
        std::memcpy(me.head_buf.data() + static_cast<std::size_t>(p) * chunk,
                    rs[static_cast<std::size_t>(p)]->seq_buf.data() + static_cast<std::size_t>(r) * chunk, chunk);
      return;
    }
    if (what == Local::exchange) return exchange(*me.fused, d, c, tables[i]);
    switch (how) {
      case How::fused: redistribute(*me.fused, d, c, ex, me.inputs(d), me.outputs(d), me.workspace()); break;
      case How::messages: redistribute(*me.fused_messages, d, c, ex, me.inputs(d), me.outputs(d), me.workspace()); break;
      case How::alltoallv: redistribute(*me.fused_alltoallv, d, c, ex, me.inputs(d), me.outputs(d), me.workspace()); break;
      case How::separate:
        for (int t = 0; t < 3; ++t)
          redistribute(*me.single[static_cast<std::size_t>(t)], d, c, ex, me.inputs(d, t, 1), me.outputs(d, t, 1), me.workspace());
        break;
      case How::deepspeed:
        for (int t = 0; t < 3; ++t) {
          const std::int64_t H = t == 0 ? kH : kHkv;
          const bool s2h = d == Direction::seq_to_head;
          deepspeed_op_sequence(c, d, B, S, H, kD, elem, s2h ? me.seq_ptr[t] : me.head_ptr[t], s2h ? me.head_ptr[t] : me.seq_ptr[t],
                                ds_send[i].data(), ds_recv[i].data());
        }
        break;
    }
  };
  if (what == Local::redistribute && how == How::fused) {
    time_calls(st, ls, P, bytes, comms, [&](int r) { job(r); });
  } else {
    for (auto _ : st) ls.step(job);
  }
  set_counters(st, bytes, P);
  if (what == Local::redistribute && how != How::separate && how != How::deepspeed) {
    const Plan& p = how == How::fused ? *rs[0]->fused : how == How::messages ? *rs[0]->fused_messages : *rs[0]->fused_alltoallv;
    const Path path = how == How::fused ? choose_path<LocalGroup::Comm, HostExecutor>(p) : p.options().path;
    st.counters["copies"] = p.copies(d, path).executor;  // per element, by the executor (DeepSpeed: 1 at B=1, 2 at B>1)
  }
  if (how == How::deepspeed) st.counters["copies"] = B > 1 ? 2 : 1;  // either direction
}

/// seq_to_head of q, k, v through a K-stage plan and HostPipeline (pack k+1 and unpack k-1 on two
/// worker threads while stage k is exchanged). K = 1 has nothing to overlap: the baseline.
void bm_local_pipeline(benchmark::State& st, int K, int P, std::int64_t S, int elem) {
  auto& rs = setups(P, S, elem, Mem::bshd, P);
  Lockstep& ls = lockstep(P);
  std::vector<LocalGroup::Comm> comms;
  std::vector<std::unique_ptr<Plan>> plans;
  std::vector<std::unique_ptr<HostPipeline>> pipes;
  std::vector<HostExecutor> packers(static_cast<std::size_t>(P)), unpackers(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) {
    const RankSetup& me = *rs[static_cast<std::size_t>(r)];
    comms.push_back(ls.group().comm(r));
    plans.push_back(std::make_unique<Plan>(Group{P, r}, kB, SeqPartition::even(S, P), me.specs, Format::bshd, PlanOptions{K}));
    pipes.push_back(std::make_unique<HostPipeline>());
  }
  const std::function<void(int)> job = [&](int r) {
    const auto i = static_cast<std::size_t>(r);
    RankSetup& me = *rs[i];
    const Direction d = Direction::seq_to_head;
    pipes[i]->redistribute(*plans[i], d, comms[i], packers[i], unpackers[i], me.inputs(d), me.outputs(d), me.workspace());
  };
  for (auto _ : st) ls.step(job);
  set_counters(st, rs[0]->bytes_per_rank(), P);
}

/// head→seq of dq, dk, dv (bshd) on the in-process group, the kv heads' copies summed (the
/// backward of seq→head, Replicas::sum) or taken from their owner (Replicas::owner, the plain
/// inverse): what the summed inverse costs. At P > Hkv every kv head is on P/Hkv ranks, so each
/// holder sends its copy and the receiver adds them; the counters report the bytes a rank sends
/// (bytes_sent, mean over the ranks) and the replica copies among them (replica_bytes).
void bm_summed_inverse(benchmark::State& st, Replicas replicas, int P, std::int64_t S, int elem) {
  auto& rs = setups(P, S, elem, Mem::bshd, P);
  Lockstep& ls = lockstep(P);
  std::vector<LocalGroup::Comm> comms;
  std::vector<std::unique_ptr<Plan>> plans;
  std::vector<Buf> ws;
  std::vector<HostExecutor> execs(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) {
    std::vector<TensorSpec> specs = rs[static_cast<std::size_t>(r)]->specs;
    for (auto& x : specs) x.with_type(elem == 4 ? ElementType::float32 : ElementType::bfloat16).with_replicas(replicas);
    comms.push_back(ls.group().comm(r));
    plans.push_back(std::make_unique<Plan>(Group{P, r}, kB, SeqPartition::even(S, P), specs));
    ws.emplace_back(plans.back()->workspace_bytes(), 0x33);
  }
  const Direction d = Direction::head_to_seq;
  const std::function<void(int)> job = [&](int r) {
    const auto i = static_cast<std::size_t>(r);
    RankSetup& me = *rs[i];
    redistribute(*plans[i], d, comms[i], execs[i], me.inputs(d), me.outputs(d), ws[i]);
  };
  for (auto _ : st) ls.step(job);
  set_counters(st, rs[0]->bytes_per_rank(), P);
  double sent = 0, replica = 0;  // per rank, averaged over the ranks (a kv head's non-owners send the copies)
  for (const auto& p : plans) sent += static_cast<double>(p->exchanged_bytes(d)), replica += static_cast<double>(p->replica_bytes(d));
  st.counters["bytes_sent"] = sent / P;
  st.counters["replica_bytes"] = replica / P;
}

void register_all() {
  auto reg = [](const std::string& name, const std::string& lab, auto fn) {
    return benchmark::RegisterBenchmark(name.c_str(), [fn, lab](benchmark::State& st) {
      fn(st);
      st.SetLabel(lab);
    });
  };
  for (int elem : kElemBytes)
    for (std::int64_t S : kSeqs)
      for (int P : kDegrees) {
        // Host pack / unpack of rank 0's seq_to_head lists, single thread, then 2 threads (bshd).
        for (bool is_pack : {true, false}) {
          const std::string fam = case_name(is_pack ? "host_pack" : "host_unpack", elem, S, P);
          const std::string base = fam + "/memcpy";
          // Single-threaded: CPU time (Google Benchmark's default), robust to other load on a shared machine.
          reg(base, "", [=](benchmark::State& st) { bm_memcpy(st, stage_bytes(is_pack, P, S, elem)); });
          for (Mem m : kMems)
            reg(fam + "/" + mem_name(m), label(base), [=](benchmark::State& st) { bm_pack_unpack(st, is_pack, P, S, elem, m, 1); });
          // Two threads: wall time.
          reg(fam + "/bshd_2threads", label(base), [=](benchmark::State& st) { bm_pack_unpack(st, is_pack, P, S, elem, Mem::bshd, 2); })
              ->UseRealTime();
        }
        // In-process group (bshd).
        const std::string bare = case_name("local_alltoall", elem, S, P) + "/bare";
        reg(bare, "", [=](benchmark::State& st) { bm_local(st, Local::bare, How::fused, Direction::seq_to_head, P, S, elem, 1); })
            ->UseRealTime();
        reg(case_name("local_exchange", elem, S, P) + "/ulysses", label(bare),
            [=](benchmark::State& st) { bm_local(st, Local::exchange, How::fused, Direction::seq_to_head, P, S, elem, 1); })
            ->UseRealTime();
        // Overlap: K pipeline stages (HostPipeline), K = 1 the baseline.
        const std::string pipe = case_name("local_pipeline_seq_to_head", elem, S, P);
        for (int K : {1, 2, 4})
          reg(pipe + "/K:" + std::to_string(K), K == 1 ? "" : label(pipe + "/K:1"),
              [=](benchmark::State& st) { bm_local_pipeline(st, K, P, S, elem); })
              ->UseRealTime();
      }
  // seq_to_head / head_to_seq of q, k, v end to end, B in {1, 4}: the default path (direct), the
  // message and all-to-all-v paths, three separate plans, and DeepSpeed's op sequence on the same
  // group, each against the bare all-to-all of the same bytes.
  for (int elem : kElemBytes)
    for (std::int64_t S : kSeqs)
      for (std::int64_t B : {1, 4})
        for (int P : kDegrees) {
          const std::string bare = case_name("local_alltoall", elem, S, P, B) + "/bare";
          if (B > 1)
            reg(bare, "", [=](benchmark::State& st) { bm_local(st, Local::bare, How::fused, Direction::seq_to_head, P, S, elem, B); })
                ->UseRealTime();
          for (Direction d : {Direction::seq_to_head, Direction::head_to_seq}) {
            const std::string fam = case_name(d == Direction::seq_to_head ? "local_seq_to_head" : "local_head_to_seq", elem, S, P, B);
            const std::pair<How, const char*> hows[] = {{How::fused, "fused"}, {How::messages, "messages"}, {How::alltoallv, "alltoallv"},
                                                        {How::separate, "separate"}, {How::deepspeed, "deepspeed"}};
            for (const auto& [how, name] : hows) {
              auto* b = reg(fam + "/" + name, how == How::fused ? label(bare, fam + "/separate") + ";deepspeed=" + fam + "/deepspeed" : label(bare),
                            [=, how = how](benchmark::State& st) { bm_local(st, Local::redistribute, how, d, P, S, elem, B); });
              if (how == How::fused)
                b->UseManualTime();  // per call after a barrier, the slowest rank's (time_calls)
              else
                b->UseRealTime();
            }
          }
        }
  // The summed inverse (the backward of seq→head) against the plain one: P=16 replicates every
  // Llama-3.1-8B kv head on 2 ranks; P=4 replicates none (the two must match).
  for (int elem : kElemBytes)
    for (std::int64_t S : kSeqs)
      for (int P : {4, 16}) {
        const std::string fam = case_name("local_summed_inverse", elem, S, P);
        reg(fam + "/owner", "", [=](benchmark::State& st) { bm_summed_inverse(st, Replicas::owner, P, S, elem); })->UseRealTime();
        reg(fam + "/sum", label(fam + "/owner"), [=](benchmark::State& st) { bm_summed_inverse(st, Replicas::sum, P, S, elem); })
            ->UseRealTime();
      }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_all();
  benchmark::AddCustomContext("ulysses_benchmark", "host");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
