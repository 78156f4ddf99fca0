// SPDX-License-Identifier: Apache-2.0
// CUDA benchmarks (Google Benchmark, manual time from CUDA events):
// - pack / unpack of q, k, v (one launch each) on rank 0 of P, reported as bytes/s, with the
//   bandwidth of cudaMemcpyAsync device-to-device of the same byte count measured in the same
//   run (counters memcpy_GBps and ratio_to_memcpy = kernel bandwidth / memcpy bandwidth; the
//   target is >= 0.9);
// - seq_to_head of q, k, v (one exchange) with P virtual ranks on one GPU (DeviceLocalGroup),
//   timed from the first rank's start to the last rank's end, with pack + copy + unpack of all
//   ranks measured separately on one stream in the same run (counter ratio_to_parts; the target
//   is <= 1.1).
// - seq_to_head of q, k, v through CudaPipeline (cuda/pipeline.cuh) with K in {1, 2, 4} stages
//   (pack of stage k+1 and unpack of stage k-1 overlapping the exchange of stage k), P in {2, 4},
//   D=128, timed like seq_to_head (counter stages = K; compare with seq_to_head/D:128/P:*).
// - seq_to_head of q, k, v on each path (direct, messages, alltoallv) on P virtual ranks, next to one
//   cudaMemcpyAsync of the same bytes (counter ratio_to_memcpy; the direct path's target is >= 0.8);
// - head_to_seq of dq, dk, dv summing the kv heads' replicas (the backward of seq_to_head) against
//   taking their owner's copy, P in {4, 16} (at 16 every kv head is on 2 ranks).
// Shapes: bf16, B=1, S=32768, H=32, Hkv=8, D in {64, 128}, P in {2, 4, 8}. The L2 cache is
// flushed before every timed operation, so both sides are measured from DRAM. Without a device
// the binary says so and exits 0.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <ulysses/ulysses.hpp>
#include <ulysses/comm/local_device.cuh>
#include <ulysses/cuda/executor.cuh>
#include <ulysses/cuda/pipeline.cuh>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

using namespace ulysses;

namespace {

struct bf16 {
  std::uint16_t bits;
};

constexpr std::int64_t kS = 32768, kH = 32, kHkv = 8;

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
#define BENCH_CUDA(x) ok((x), #x)

/// Device memory, zero-filled (values do not matter for bandwidth).
struct DevMem {
  void* p = nullptr;
  std::size_t n = 0;
  explicit DevMem(std::size_t bytes) : n(bytes) {
    BENCH_CUDA(cudaMalloc(&p, n ? n : 1));
    BENCH_CUDA(cudaMemset(p, 0, n ? n : 1));
  }
  DevMem(const DevMem&) = delete;
  ~DevMem() { cudaFree(p); }
  std::byte* get() const { return static_cast<std::byte*>(p); }
  std::size_t bytes() const { return n; }
};

/// Timing events (a..d).
struct Events {
  cudaEvent_t a, b, c, d;
  Events() {
    for (cudaEvent_t* e : {&a, &b, &c, &d}) BENCH_CUDA(cudaEventCreate(e));
  }
  ~Events() {
    for (cudaEvent_t e : {a, b, c, d}) cudaEventDestroy(e);
  }
  static double seconds(cudaEvent_t from, cudaEvent_t to) {
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, from, to));
    return ms * 1e-3;
  }
};

/// Evicts the L2 cache (writes a buffer larger than it) on stream s.
struct L2Flush {
  std::size_t bytes;
  std::unique_ptr<DevMem> buf;
  L2Flush() {
    int dev = 0, l2 = 0;
    BENCH_CUDA(cudaGetDevice(&dev));
    BENCH_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    bytes = 2 * static_cast<std::size_t>(l2 > 0 ? l2 : 64 << 20);
    buf = std::make_unique<DevMem>(bytes);
  }
  void operator()(cudaStream_t s) const { BENCH_CUDA(cudaMemsetAsync(buf->get(), 1, bytes, s)); }
};

/// The q, k, v plan (bf16, bshd) of rank r of P (GQA: kv head partition from q's; `rep`: what
/// head→seq does with the kv heads' replicas).
Plan qkv_plan(int P, int r, std::int64_t D, PlanOptions options = {}, Replicas rep = Replicas::sum) {
  const auto q = HeadPartition::even(kH, P);
  const auto kv = HeadPartition::gqa(q, kHkv);
  return Plan({P, r}, 1, SeqPartition::even(kS, P),
              {TensorSpec::of<bf16>(q, D, ElementType::bfloat16), TensorSpec::of<bf16>(kv, D, ElementType::bfloat16).with_replicas(rep),
               TensorSpec::of<bf16>(kv, D, ElementType::bfloat16).with_replicas(rep)},
              Format::bshd, options);
}

/// One rank's device buffers for seq_to_head: inputs, outputs, workspace.
struct RankBuffers {
  std::vector<std::unique_ptr<DevMem>> in, out;
  std::unique_ptr<DevMem> ws;
  std::size_t ws_bytes;
  explicit RankBuffers(const Plan& p) : ws_bytes(p.workspace_bytes()) {
    for (int t = 0; t < p.num_tensors(); ++t) {
      in.push_back(std::make_unique<DevMem>(p.seq_bytes(t)));
      out.push_back(std::make_unique<DevMem>(p.head_bytes(t)));
    }
    ws = std::make_unique<DevMem>(ws_bytes);
  }
  TensorList<ConstByteSpan> inputs() const {
    TensorList<ConstByteSpan> l;
    for (auto& b : in) l.push_back({b->get(), b->bytes()});
    return l;
  }
  TensorList<ByteSpan> outputs() const {
    TensorList<ByteSpan> l;
    for (auto& b : out) l.push_back({b->get(), b->bytes()});
    return l;
  }
  Workspace workspace() const { return {ws->get(), ws_bytes}; }
};

/// Every rank's qkv_plan() and device buffers, for the benchmarks on P virtual ranks.
struct GroupPlans {
  std::vector<Plan> plans;
  std::vector<std::unique_ptr<RankBuffers>> bufs;
  GroupPlans(int P, std::int64_t D, PlanOptions options = {}, Replicas rep = Replicas::sum) {
    for (int r = 0; r < P; ++r) plans.push_back(qkv_plan(P, r, D, options, rep));
    for (const Plan& p : plans) bufs.push_back(std::make_unique<RankBuffers>(p));
  }
};

std::size_t list_bytes(const std::vector<BlockCopy>& l) {
  std::size_t n = 0;
  for (const BlockCopy& c : l) n += static_cast<std::size_t>(c.bytes());
  return n;
}

/// pack (or unpack) of rank 0 of P, next to cudaMemcpyAsync D2D of the same bytes.
void bm_copy(benchmark::State& state, bool is_pack, std::int64_t D, int P) {
  const Plan plan = qkv_plan(P, 0, D);
  const Direction dir = Direction::seq_to_head;
  const std::vector<BlockCopy>& list = is_pack ? plan.stage_lists(dir).pack : plan.stage_lists(dir).unpack;
  const std::size_t bytes = list_bytes(list);
  cudaStream_t s;
  BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    RankBuffers b(plan);
    const BufferTable t = bind_buffers(plan, dir, b.inputs(), b.outputs(), b.workspace());
    DevMem from(bytes), to(bytes);
    CudaExecutor ex(plan, s);
    L2Flush flush;
    Events ev;
    double kernel_s = 0, memcpy_s = 0;
    for (auto _ : state) {
      flush(s);
      BENCH_CUDA(cudaEventRecord(ev.a, s));
      ex.run(list.data(), list.size(), t);
      BENCH_CUDA(cudaEventRecord(ev.b, s));
      flush(s);
      BENCH_CUDA(cudaEventRecord(ev.c, s));
      BENCH_CUDA(cudaMemcpyAsync(to.get(), from.get(), bytes, cudaMemcpyDeviceToDevice, s));
      BENCH_CUDA(cudaEventRecord(ev.d, s));
      BENCH_CUDA(cudaEventSynchronize(ev.d));
      const double k = Events::seconds(ev.a, ev.b);
      kernel_s += k;
      memcpy_s += Events::seconds(ev.c, ev.d);
      state.SetIterationTime(k);
    }
    const double n = static_cast<double>(state.iterations());
    state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
    state.counters["bytes"] = static_cast<double>(bytes);
    state.counters["blocks"] = static_cast<double>(list.size());
    state.counters["kernel_GBps"] = bytes * n / kernel_s * 1e-9;
    state.counters["memcpy_GBps"] = bytes * n / memcpy_s * 1e-9;
    state.counters["ratio_to_memcpy"] = memcpy_s / kernel_s;
  }
  BENCH_CUDA(cudaStreamDestroy(s));
}

/// Blocks a stream until the host releases it, so that everything enqueued behind it is
/// measured without the host's enqueue time (the P threads, their barriers).
__global__ void hold(volatile int* flag) {
  while (*flag == 0) {
  }
}

/// P rank streams and the timing protocol shared by the group benchmarks: stream 0 is held by a
/// spin kernel while the host enqueues every rank's work (so the P threads, their barriers and the
/// enqueue cost are not timed), the other streams fork from it and join back, then the kernel is
/// released and the GPU time from fork to join is measured with events.
class GroupTimer {
 public:
  explicit GroupTimer(int P) : streams(static_cast<std::size_t>(P)), done_(static_cast<std::size_t>(P)) {
    for (std::size_t r = 0; r < streams.size(); ++r) {
      BENCH_CUDA(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
      BENCH_CUDA(cudaEventCreateWithFlags(&done_[r], cudaEventDisableTiming));
    }
    BENCH_CUDA(cudaHostAlloc(&flag_, sizeof(int), cudaHostAllocMapped));
    BENCH_CUDA(cudaHostGetDevicePointer(&dflag_, flag_, 0));
    // Lazy loading (CUDA >= 12.2's default) may load a kernel at its first launch with a context
    // synchronisation, which would wait for the spinning hold kernel: load it (and the copy
    // kernel the ranks launch behind it; CudaExecutor's occupancy query also loads that one) now.
    cudaFuncAttributes a{};
    BENCH_CUDA(cudaFuncGetAttributes(&a, hold));
    BENCH_CUDA(cudaFuncGetAttributes(&a, ulysses::detail::block_copy_kernel<ulysses::detail::kCopyThreads>));
  }
  GroupTimer(const GroupTimer&) = delete;
  GroupTimer& operator=(const GroupTimer&) = delete;
  ~GroupTimer() {
    cudaDeviceSynchronize();
    cudaFreeHost(flag_);
    for (std::size_t r = 0; r < streams.size(); ++r) {
      cudaStreamDestroy(streams[r]);
      cudaEventDestroy(done_[r]);
    }
  }

  /// Runs per_rank(comm) on every rank of `group` (each on its own stream) and returns the GPU
  /// seconds from the fork to the join of all rank streams, with a cold L2.
  template <class F>
  double step(DeviceLocalGroup& group, F&& per_rank) {
    const cudaStream_t s0 = streams[0];
    *reinterpret_cast<volatile int*>(flag_) = 0;
    // However step() ends (a rank throws: a comm error, a timeout, a plan mismatch), the hold
    // kernel is released, so that ~GroupTimer's cudaDeviceSynchronize returns and the error is seen.
    struct Release {
      int* flag;
      ~Release() { *reinterpret_cast<volatile int*>(flag) = 1; }
    } const release{flag_};
    flush(s0);
    hold<<<1, 1, 0, s0>>>(dflag_);
    BENCH_CUDA(cudaGetLastError());
    BENCH_CUDA(cudaEventRecord(ev.a, s0));
    for (std::size_t r = 1; r < streams.size(); ++r) BENCH_CUDA(cudaStreamWaitEvent(streams[r], ev.a, 0));
    group.spawn(streams.data(), [&](DeviceLocalGroup::Comm& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      per_rank(comm);
      BENCH_CUDA(cudaEventRecord(done_[r], streams[r]));
    });
    for (std::size_t r = 1; r < streams.size(); ++r) BENCH_CUDA(cudaStreamWaitEvent(s0, done_[r], 0));
    BENCH_CUDA(cudaEventRecord(ev.b, s0));
    *reinterpret_cast<volatile int*>(flag_) = 1;  // release: the GPU runs everything now (release's destructor again, harmless)
    BENCH_CUDA(cudaEventSynchronize(ev.b));
    return Events::seconds(ev.a, ev.b);
  }

  std::vector<cudaStream_t> streams;  ///< one per rank
  L2Flush flush;
  Events ev;

 private:
  std::vector<cudaEvent_t> done_;
  int* flag_ = nullptr;
  int* dflag_ = nullptr;
};

/// seq_to_head of q, k, v on P virtual ranks of one GPU; then the same work as separate parts.
void bm_seq_to_head(benchmark::State& state, std::int64_t D, int P) {
  GroupPlans g(P, D);
  std::vector<Plan>& plans = g.plans;
  std::vector<std::unique_ptr<RankBuffers>>& bufs = g.bufs;
  GroupTimer timer(P);
  const std::vector<cudaStream_t>& streams = timer.streams;
  {
    std::vector<CudaExecutor> ex, ex0;  // per rank on its stream; per rank on stream 0 (parts)
    for (int r = 0; r < P; ++r) {
      ex.emplace_back(plans[static_cast<std::size_t>(r)], streams[static_cast<std::size_t>(r)]);
      ex0.emplace_back(plans[static_cast<std::size_t>(r)], streams[0]);
    }
    DeviceLocalGroup group(P);
    L2Flush& flush = timer.flush;
    Events& ev = timer.ev;
    const cudaStream_t s0 = streams[0];
    std::size_t moved = 0;  // bytes read (= written) by all ranks: pack + exchange + unpack
    for (int r = 0; r < P; ++r) {
      const StageLists& sc = plans[static_cast<std::size_t>(r)].stage_lists(Direction::seq_to_head);
      moved += list_bytes(sc.pack) + sc.recv_total + list_bytes(sc.unpack);
    }
    BENCH_CUDA(cudaDeviceSynchronize());
    double total_s = 0;
    for (auto _ : state) {
      const double t = timer.step(group, [&](DeviceLocalGroup::Comm& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        seq_to_head(plans[r], comm, ex[r], bufs[r]->inputs(), bufs[r]->outputs(), bufs[r]->workspace());
      });
      total_s += t;
      state.SetIterationTime(t);
    }
    // The same work in parts on stream 0: all packs, all exchange copies, all unpacks.
    double parts_s[3] = {0, 0, 0};
    const int reps = 5;
    std::vector<BufferTable> tabs;
    for (int r = 0; r < P; ++r) {
      const auto& b = *bufs[static_cast<std::size_t>(r)];
      tabs.push_back(bind_buffers(plans[static_cast<std::size_t>(r)], Direction::seq_to_head, b.inputs(), b.outputs(), b.workspace()));
    }
    for (int rep = 0; rep < reps; ++rep)
      for (int part = 0; part < 3; ++part) {
        flush(s0);
        BENCH_CUDA(cudaEventRecord(ev.a, s0));
        for (int r = 0; r < P; ++r) {
          const auto ru = static_cast<std::size_t>(r);
          const StageLists& sc = plans[ru].stage_lists(Direction::seq_to_head);
          if (part == 0) ex0[ru].run(sc.pack.data(), sc.pack.size(), tabs[ru]);
          if (part == 2) ex0[ru].run(sc.unpack.data(), sc.unpack.size(), tabs[ru]);
          if (part == 1)
            for (int p = 0; p < P; ++p) {
              const StageLists& sp = plans[static_cast<std::size_t>(p)].stage_lists(Direction::seq_to_head);
              if (sc.recv_bytes[static_cast<std::size_t>(p)])
                BENCH_CUDA(cudaMemcpyAsync(tabs[ru].base[BufferIndex::recv] + sc.recv_offsets[static_cast<std::size_t>(p)],
                                           tabs[static_cast<std::size_t>(p)].base[BufferIndex::send] + sp.send_offsets[ru],
                                           sc.recv_bytes[static_cast<std::size_t>(p)], cudaMemcpyDeviceToDevice, s0));
            }
        }
        BENCH_CUDA(cudaEventRecord(ev.b, s0));
        BENCH_CUDA(cudaEventSynchronize(ev.b));
        parts_s[part] += Events::seconds(ev.a, ev.b) / reps;
      }
    const double n = static_cast<double>(state.iterations());
    const double parts = parts_s[0] + parts_s[1] + parts_s[2];
    state.SetBytesProcessed(static_cast<std::int64_t>(moved) * state.iterations());
    state.counters["bytes_moved"] = static_cast<double>(moved);
    state.counters["pack_us"] = parts_s[0] * 1e6;
    state.counters["copy_us"] = parts_s[1] * 1e6;
    state.counters["unpack_us"] = parts_s[2] * 1e6;
    state.counters["parts_us"] = parts * 1e6;
    state.counters["ratio_to_parts"] = total_s / n / parts;
  }
}

/// seq_to_head of q, k, v with K stages overlapped by one CudaPipeline per rank, on P virtual
/// ranks of one GPU (DeviceLocalGroup), timed from the first rank's start to the last rank's end.
void bm_pipeline(benchmark::State& state, std::int64_t D, int P, int K) {
  GroupPlans g(P, D, PlanOptions{K});
  std::vector<Plan>& plans = g.plans;
  std::vector<std::unique_ptr<RankBuffers>>& bufs = g.bufs;
  GroupTimer timer(P);
  const std::vector<cudaStream_t>& streams = timer.streams;
  {
    std::vector<CudaExecutor> ex;
    std::vector<std::unique_ptr<CudaPipeline>> pipes;
    for (int r = 0; r < P; ++r) {
      ex.emplace_back(plans[static_cast<std::size_t>(r)], streams[static_cast<std::size_t>(r)]);
      pipes.push_back(std::make_unique<CudaPipeline>(streams[static_cast<std::size_t>(r)]));
    }
    DeviceLocalGroup group(P);
    std::size_t moved = 0;  // bytes read (= written) by all ranks: pack + exchange + unpack
    for (int r = 0; r < P; ++r)
      for (int k = 0; k < K; ++k) {
        const StageLists& sc = plans[static_cast<std::size_t>(r)].stage_lists(Direction::seq_to_head, k);
        moved += list_bytes(sc.pack) + sc.recv_total + list_bytes(sc.unpack);
      }
    BENCH_CUDA(cudaDeviceSynchronize());
    for (auto _ : state)
      state.SetIterationTime(timer.step(group, [&](DeviceLocalGroup::Comm& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        pipes[r]->seq_to_head(plans[r], comm, ex[r], bufs[r]->inputs(), bufs[r]->outputs(), bufs[r]->workspace());
      }));
    state.SetBytesProcessed(static_cast<std::int64_t>(moved) * state.iterations());
    state.counters["bytes_moved"] = static_cast<double>(moved);
    state.counters["stages"] = K;
    BENCH_CUDA(cudaDeviceSynchronize());
  }
}

/// seq_to_head of q, k, v (bf16, D=128) on P virtual ranks of one GPU on one path — direct (each
/// rank's kernel reads its peers' inputs: one copy per element), messages (a cudaMemcpyAsync per
/// piece, in place where contiguous), alltoallv (pack, a copy per chunk, unpack) — next to one
/// cudaMemcpyAsync device-to-device of the same bytes (all ranks' q, k, v) in the same run
/// (counter ratio_to_memcpy = memcpy time / path time; the direct path's target is >= 0.8).
void bm_path(benchmark::State& state, Path path, int P) {
  GroupPlans g(P, 128, PlanOptions{1, true, path});
  std::vector<Plan>& plans = g.plans;
  std::vector<std::unique_ptr<RankBuffers>>& bufs = g.bufs;
  GroupTimer timer(P);
  const std::vector<cudaStream_t>& streams = timer.streams;
  {
    std::vector<CudaExecutor> ex;
    for (int r = 0; r < P; ++r) ex.emplace_back(plans[static_cast<std::size_t>(r)], streams[static_cast<std::size_t>(r)]);
    DeviceLocalGroup group(P);
    auto run = [&](DeviceLocalGroup::Comm& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      seq_to_head(plans[r], comm, ex[r], bufs[r]->inputs(), bufs[r]->outputs(), bufs[r]->workspace());
    };
    timer.step(group, run);  // the plan check and (direct) the layouts and lists: not timed
    std::size_t bytes = 0;   // all ranks' q, k, v
    for (int r = 0; r < P; ++r)
      for (int t = 0; t < 3; ++t) bytes += plans[static_cast<std::size_t>(r)].seq_bytes(t);
    double path_s = 0;
    for (auto _ : state) {
      const double t = timer.step(group, run);
      path_s += t;
      state.SetIterationTime(t);
    }
    DevMem from(bytes), to(bytes);
    double memcpy_s = 0;
    const int reps = 5;
    for (int i = 0; i < reps; ++i) {
      timer.flush(streams[0]);
      BENCH_CUDA(cudaEventRecord(timer.ev.a, streams[0]));
      BENCH_CUDA(cudaMemcpyAsync(to.get(), from.get(), bytes, cudaMemcpyDeviceToDevice, streams[0]));
      BENCH_CUDA(cudaEventRecord(timer.ev.b, streams[0]));
      BENCH_CUDA(cudaEventSynchronize(timer.ev.b));
      memcpy_s += Events::seconds(timer.ev.a, timer.ev.b) / reps;
    }
    const double n = static_cast<double>(state.iterations());
    state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
    state.counters["memcpy_us"] = memcpy_s * 1e6;
    state.counters["ratio_to_memcpy"] = memcpy_s / (path_s / n);
    state.counters["copies"] = plans[0].copies(Direction::seq_to_head, path).executor;
    BENCH_CUDA(cudaDeviceSynchronize());
  }
}

/// head→seq of dq, dk, dv (bf16, D=128) on P virtual ranks of one GPU, the kv heads' replicas
/// summed (Replicas::sum: the backward of seq→head, float32 accumulation and one rounding in the
/// unpack kernel) or taken from their owner (Replicas::owner: the plain inverse). At P=16 every
/// kv head is on 2 ranks. Timed like seq_to_head; counters: bytes a rank sends (mean) and the
/// replica copies among them.
void bm_summed_inverse(benchmark::State& state, bool sum, int P) {
  GroupPlans g(P, 128, PlanOptions{}, sum ? Replicas::sum : Replicas::owner);
  std::vector<Plan>& plans = g.plans;
  std::vector<std::unique_ptr<RankBuffers>>& bufs = g.bufs;
  GroupTimer timer(P);
  const std::vector<cudaStream_t>& streams = timer.streams;
  {
    std::vector<CudaExecutor> ex;
    for (int r = 0; r < P; ++r) ex.emplace_back(plans[static_cast<std::size_t>(r)], streams[static_cast<std::size_t>(r)]);
    DeviceLocalGroup group(P);
    // head→seq reads the head-sharded buffers (RankBuffers' outputs) and writes the seq-sharded ones.
    auto run = [&](DeviceLocalGroup::Comm& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      const RankBuffers& b = *bufs[r];
      TensorList<ConstByteSpan> in;
      TensorList<ByteSpan> out;
      for (std::size_t t = 0; t < 3; ++t) in.push_back({b.out[t]->get(), b.out[t]->bytes()}), out.push_back({b.in[t]->get(), b.in[t]->bytes()});
      head_to_seq(plans[r], comm, ex[r], in, out, b.workspace());
    };
    timer.step(group, run);  // the first call compares the ranks' plans (host all-gather): not timed
    double sent = 0, replica = 0;
    for (const Plan& p : plans)
      sent += static_cast<double>(p.exchanged_bytes(Direction::head_to_seq)), replica += static_cast<double>(p.replica_bytes(Direction::head_to_seq));
    for (auto _ : state) state.SetIterationTime(timer.step(group, run));
    state.counters["bytes_sent"] = sent / P;
    state.counters["replica_bytes"] = replica / P;
    BENCH_CUDA(cudaDeviceSynchronize());
  }
}

/// The group benchmarks' error path (gpu_check's ladder runs it under a timeout): a rank that
/// throws inside GroupTimer::step() must release the hold kernel, so that the error reaches the
/// caller and ~GroupTimer's cudaDeviceSynchronize returns (before the fix: a hang). 0 when so.
int check_throwing_rank() {
  int code = 1;
  {
    DeviceLocalGroup group(2, std::chrono::seconds(10));
    GroupTimer timer(2);
    try {
      timer.step(group, [](DeviceLocalGroup::Comm& comm) {
        if (comm.rank() == 1) throw std::runtime_error("rank 1 fails inside a group benchmark");
        comm.barrier();  // rank 0 then gets aborted
      });
      std::printf("check_throwing_rank FAIL: no error reached the caller\n");
    } catch (const std::exception& x) {
      std::printf("check_throwing_rank: the error reached the caller (%s)\n", x.what());
      code = 0;
    }
  }  // ~GroupTimer: cudaDeviceSynchronize, which needs the hold kernel released
  std::printf("check_throwing_rank %s: ~GroupTimer returned\n", code == 0 ? "ok" : "FAIL");
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("no CUDA device: skipping the CUDA benchmarks (cudaGetDeviceCount: %s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 0;
  }
  if (argc == 2 && std::string(argv[1]) == "--check-throwing-rank") return check_throwing_rank();
  for (std::int64_t D : {64, 128})
    for (int P : {2, 4, 8}) {
      const std::string shape = "/D:" + std::to_string(D) + "/P:" + std::to_string(P);
      benchmark::RegisterBenchmark(("pack" + shape).c_str(), bm_copy, true, D, P)->UseManualTime()->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("unpack" + shape).c_str(), bm_copy, false, D, P)->UseManualTime()->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("seq_to_head" + shape).c_str(), bm_seq_to_head, D, P)->UseManualTime()->Unit(benchmark::kMicrosecond);
    }
  for (int P : {2, 4})
    for (int K : {1, 2, 4}) {
      const std::string name = "pipeline_seq_to_head/D:128/P:" + std::to_string(P) + "/K:" + std::to_string(K);
      benchmark::RegisterBenchmark(name.c_str(), bm_pipeline, std::int64_t{128}, P, K)->UseManualTime()->Unit(benchmark::kMicrosecond);
    }
  for (int P : {2, 4, 8})
    for (Path path : {Path::direct, Path::messages, Path::alltoallv}) {
      const std::string name = "path_seq_to_head/bf16/D:128/P:" + std::to_string(P) + "/" + to_string(path);
      benchmark::RegisterBenchmark(name.c_str(), bm_path, path, P)->UseManualTime()->Unit(benchmark::kMicrosecond);
    }
  for (int P : {4, 16})
    for (bool sum : {false, true}) {
      const std::string name = "summed_inverse/bf16/D:128/P:" + std::to_string(P) + (sum ? "/sum" : "/owner");
      benchmark::RegisterBenchmark(name.c_str(), bm_summed_inverse, sum, P)->UseManualTime()->Unit(benchmark::kMicrosecond);
    }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    benchmark::RunSpecifiedBenchmarks();
  } catch (const std::exception& x) {
    std::fprintf(stderr, "bench_cuda: %s\n", x.what());
    return 1;
  }
  benchmark::Shutdown();
  return 0;
}
