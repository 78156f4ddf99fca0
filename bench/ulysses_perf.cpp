// SPDX-License-Identifier: Apache-2.0
// ulysses_perf: the Ulysses exchanges of a real model shape, measured the way nccl-tests'
// alltoall_perf measures a collective (a sweep of sizes; per size: warm-up, then n back-to-back
// iterations between two barriers, the time per iteration taken as the slowest rank's; algbw =
// bytes / time, busbw = algbw * (P-1)/P as nccl-tests defines it for all-to-all), next to the bare
// all-to-all-v of the same bytes on the same communicator, with an optional bit-exact check
// against an oracle computed from the partitions alone (#wrong).
//
//   ulysses_perf --backend local --ranks 4 --model llama-3.1-8b -b 1024 -e 16384 -f 2 -c 1
//   mpiexec -n 4 ulysses_perf --backend mpi --model llama-3.1-8b -b 1024 -e 16384 -f 2 -c 1
//   mpiexec -n 8 ulysses_perf --backend mpi --ranks-per-node 4 ...   (simulated nodes: two-level)
//   mpiexec -n 8 ulysses_perf --backend nccl ...        (one process per GPU; device memory, CUDA events)
//   ulysses_perf --backend cuda-local --ranks 4 ...     (4 virtual ranks on one GPU, DeviceLocalGroup)
//
// The device backends (perf_device.hpp / .cu, built where CUDA is) run the same sweep, flags,
// columns, JSON and -c 1 oracle (checked on the host from the copied-back outputs); without a CUDA
// device they refuse to start (exit 3).
// The α-β model of cost.hpp (perf_model.hpp): --fit PARAMS.json RUN.json... calibrates it from
// this tool's --json files, --check PARAMS.json RUN.json... reports its error, and
// --advise --model NAME --seq S --world N --ranks-per-node R lists the Ulysses degrees.
//
// The exchanges: --direction seq_to_head is q, k, v in one exchange (the plan of
// attention_specs().qkv()); head_to_seq is the attention output o. --backward adds the backward
// pass to the forward, as the demo's --backward does: head_to_seq_backward (seq->head of do) and
// seq_to_head_backward (head->seq of dq, dk, dv, summing the partial gradients of replicated kv
// heads). Bytes per rank are this rank's input tensor bytes (its own chunk included, as nccl-tests
// counts an all-to-all's size), the largest over ranks for uneven splits; the demo counts them so.
#include <ulysses/ulysses.hpp>
#if ULYSSES_PERF_MPI
#include <ulysses/comm/mpi.hpp>

#include "mpi_node.hpp"
#endif
#if ULYSSES_PERF_CUDA
#include "perf_device.hpp"  // the device backends (perf_device.cu)
#endif

#include <algorithm>
#include <cerrno>
#include <climits>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cli.hpp"
#include "group.hpp"
#include "models.hpp"
#include "perf_model.hpp"
#include "host_buffer.hpp"

namespace {

using namespace ulysses;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string backend = "local";
  int ranks = 4;
  bool ranks_given = false;
  std::string model = "Llama-3.1-8B";
  AttentionShape shape{32, 8, 128, 128};
  ElementType type = ElementType::float32;
  bool type_given = false;  // --advise defaults to bf16
  std::int64_t begin = 1024, end = 16384, factor = 2, increment = 0, batch = 1;
  Format layout = Format::bshd;
  bool seq_to_head = true, head_to_seq = true, backward = false, check = false, balanced = false;
  Path path = Path::automatic;
  int iters = 20, warmup = 5, reps = 1;
  bool bare = true;  // --bare 0: skip the bare all-to-all-v (its columns print 0)
  bool copies = true;  // --copies 0 (--backend mpi over MpiComm, -c 0): the executor skips the host copies (SkipCopies)
  std::string json;
  int ranks_per_node = 0;               // > 0: simulated nodes of that many ranks (PlanOptions::nodes)
  int mpi_window = -1;                  // --backend mpi: 1 MpiWindowComm, 0 MpiComm, -1 the window when all ranks share a node
  int call_numbers = 1;                 // --call-numbers 0: library calls not numbered; 2 (both): numbered and not, alternately (what numbering costs)
  bool window_outputs = true;           // --window-outputs 0: over MpiWindowComm, the outputs outside the window (seq->head pulls)
  double window_MiB = 1024;             // --backend cuda-ipc: the device window's bytes per rank
  int lanes = 1;                        // PlanOptions::lanes of the two-level exchange
  int groups = 1;                       // --backend mpi: the world cut into this many groups exchanging at once
  double max_rank_bytes = 0;            // > 0: skip sizes whose per-rank input exceeds it
  std::string mode = "sweep";           // sweep | advise | fit | check
  std::string params;                   // --fit output / --check and --advise input
  std::string params_backend = "mpi";   // the model of the --params file --advise uses
  std::vector<std::string> inputs;      // --fit / --check measurement files
  bool rows = false;                    // --check: every row
  std::int64_t seq = 131072;            // --advise
  int world = 64;                       // --advise
  double budget_GiB = 0;                // --advise
  double attn_TFLOPS = AttentionRate::h100_bf16() * 1e-12;  // --advise: a rank's attention rate for the ring's overlap
  perf_model::LinkFlags links;          // --advise
};

/// One line of the table.
struct Row {
  std::int64_t S = 0;
  double bytes = 0;         // per rank (largest over ranks)
  std::string direction;    // seq_to_head, head_to_seq, or their _backward
  std::string path;         // the transport taken
  double us = 0, bare_us = 0;
  long long wrong = -1;     // -1: not checked
};

using ulysses_group::barrier;
using ulysses_group::max_over_ranks;
using ulysses_group::sum_over_ranks;

// ---- the clock: MPI_Wtime under --backend mpi -------------------------------------------------
/// Seconds on the clock of `comm`'s backend. Under MPI it is MPI_Wtime: the same wall clock on a real
/// MPI, and simulated time under SimGrid's SMPI, which virtualises MPI_Wtime but not steady_clock
/// (bench/smpi/smpi.sh perf: this tool then reports the simulated cluster's times).
#if ULYSSES_PERF_MPI
double seconds_now(const MpiComm&) { return MPI_Wtime(); }
#endif
template <class Comm>
double seconds_now(const Comm&) { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

#if ULYSSES_PERF_MPI
/// --groups G: the world cut into G groups of consecutive ranks (MPI_COMM_WORLD when G = 1; the
/// communicator lives until MPI_Finalize). Exits (2) when G does not divide the world.
MPI_Comm world_group(int groups) {
  int W = 0, w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  if (groups == 1) return MPI_COMM_WORLD;
  if (groups < 1 || W % groups != 0) {
    if (w == 0) std::fprintf(stderr, "ulysses_perf: --groups %d does not divide the %d processes\n", groups, W);
    MPI_Finalize();
    std::exit(2);
  }
  MPI_Comm g;
  MPI_Comm_split(MPI_COMM_WORLD, w / (W / groups), w, &g);
  return g;
}
#endif

/// Microseconds per iteration of fn(), the slowest rank's: `warmup` untimed iterations, then
/// `reps` times: a barrier, `iters` back-to-back iterations, a barrier; the fastest repetition
/// (the least disturbed by other load: what a model is calibrated on; nccl-tests' one block is reps = 1).
template <class Comm, class F>
double time_us(Comm& comm, int warmup, int iters, int reps, F&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  double best = 0;
  for (int k = 0; k < reps; ++k) {
    barrier(comm);
    const double t0 = seconds_now(comm);
    for (int i = 0; i < iters; ++i) fn();
    barrier(comm);
    const double us = max_over_ranks(comm, (seconds_now(comm) - t0) * 1e6 / iters);
    best = k == 0 ? us : std::min(best, us);
  }
  return best;
}

/// Per-call times of two operations run alternately (what one user's call costs, each against
/// the other in the same moments of machine load): `warmup` untimed pairs, then `iters` times: a
/// barrier, a() timed on each rank, the slowest rank's time; a barrier, b() the same. Returns the
/// medians (microseconds) of a's and of b's times. Collective.
template <class Comm, class A, class B>
std::pair<double, double> interleaved_us(Comm& comm, int warmup, int iters, A&& a, B&& b) {
  for (int i = 0; i < warmup; ++i) a(), b();
  std::vector<double> ta, tb;
  auto call = [&](auto&& f, std::vector<double>& out) {
    barrier(comm);
    const double t0 = seconds_now(comm);
    f();
    out.push_back(max_over_ranks(comm, (seconds_now(comm) - t0) * 1e6));
  };
  for (int i = 0; i < iters; ++i) call(a, ta), call(b, tb);
  auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  return {median(ta), median(tb)};
}

/// One exchange timed per call numbered and not (set_call_numbering(), on every rank alike),
/// alternately (interleaved_us()): {numbered, not numbered} in microseconds. Collective.
template <class Comm, class Once>
std::pair<double, double> numbered_and_not(Comm& comm, const Options& o, Once&& once) {
  const auto r = interleaved_us(comm, o.warmup, o.iters, [&] { set_call_numbering(true); once(); }, [&] { set_call_numbering(false); once(); });
  set_call_numbering(true);
  return r;
}

// ---- the oracle: every element's value is a function of where it is -------------------------
/// A small whole number (exact in every element type, so that sums are exact until the one
/// rounding the library defines) from the element's global position (tensor, b, s, h, d) and, for
/// head-sharded inputs of head->seq, the holding rank q (so a sum over holders differs from any one
/// copy); q = -1 for seq-sharded inputs.
double value(ElementType type, int t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d, int q) {
  std::uint64_t x = ((((static_cast<std::uint64_t>(t) * 257u + static_cast<std::uint64_t>(b)) * 1000003u + static_cast<std::uint64_t>(s)) * 4099u +
                      static_cast<std::uint64_t>(h)) * 1031u + static_cast<std::uint64_t>(d)) * 131u + static_cast<std::uint64_t>(q + 1);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  const std::uint64_t range = type == ElementType::bfloat16 ? 128 : type == ElementType::float16 ? 1024 : 1u << 19;
  return static_cast<double>(static_cast<std::int64_t>(x % (2 * range + 1)) - static_cast<std::int64_t>(range));
}

/// Writes the sum of `terms` (ascending holder order, in the type's accumulation type, rounded once:
/// the library's rule) as one element of `type` at p.
void store_sum(ElementType type, const double* terms, int n, std::byte* p) {
  detail::with_sum_arith(type, [&](auto a) {
    using A = decltype(a);
    typename A::Acc acc = static_cast<typename A::Acc>(terms[0]);
    for (int j = 1; j < n; ++j) acc = acc + static_cast<typename A::Acc>(terms[j]);
    A::store(p, acc);
  });
}

/// A buffer of the sweep: the benchmarks' host memory (bench/host_buffer.hpp: 2 MiB-aligned,
/// huge pages unless ULYSSES_BENCH_THP=0, as bench_host's), left unwritten at allocation: run()
/// writes it once (touch_buffers()), except with --copies 0, where zeroing every buffer took a
/// third of the wall time of a simulated run at 512 ranks (SMPI, bench/smpi/fold.cpp).
using Bytes = std::vector<std::byte, ub::HugePageAllocator<std::byte>>;
/// The bare all-to-all-v of the same bytes, in the same kind of memory as the exchange's buffers.
using Bare = ulysses_group::BareAlltoall<Bytes>;

/// One exchange of the sweep: the plan (q,k,v or o), the direction run, and its buffers.
struct Exchange {
  Plan plan;
  Direction dir;
  std::vector<Bytes> in, out;
  Bytes ws;
  std::size_t in_bytes = 0;
  TensorList<ConstByteSpan> ins() const {
    TensorList<ConstByteSpan> l;
    for (const auto& b : in) l.push_back(ConstByteSpan{b.data(), b.size()});
    return l;
  }
  TensorList<ByteSpan> outs() {
    TensorList<ByteSpan> l;
    for (auto& b : out) l.push_back(ByteSpan{b.data(), b.size()});
    return l;
  }
};

/// Calls f(b, s_global, h_global, local_offset_in_elements) for every element position of tensor t
/// on this rank's side (`seq_side`: seq-sharded, else head-sharded), d = 0 (rows of D follow).
template <class F>
void for_each_row(const Plan& plan, int t, bool seq_side, const SeqPartition& seq, int r, F&& f) {
  const Layout& l = seq_side ? plan.seq_layout(t) : plan.head_layout(t);
  const HeadPartition& hp = plan.tensor(t).heads;
  for (std::int64_t b = 0; b < l.extent[0]; ++b)
    for (std::int64_t i = 0; i < l.extent[1]; ++i)
      for (std::int64_t h = 0; h < l.extent[2]; ++h) {
        const std::int64_t s = seq_side ? seq.global_token(r, i) : i, hg = seq_side ? h : hp.begin(r) + h;
        f(b, s, hg, l.offset(b, i, h, 0), l.stride[3]);
      }
}

void fill_inputs(Exchange& x, const SeqPartition& seq, int r) {
  const bool s2h = x.dir == Direction::seq_to_head;
  for (int t = 0; t < x.plan.num_tensors(); ++t) {
    const ElementType type = x.plan.tensor(t).type;
    const std::size_t e = size_of(type);
    const std::int64_t D = x.plan.tensor(t).head_dim;
    std::byte* base = x.in[static_cast<std::size_t>(t)].data();
    for_each_row(x.plan, t, s2h, seq, r, [&](std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t off, std::int64_t sd) {
      for (std::int64_t d = 0; d < D; ++d) {
        const double v = value(type, t, b, s, h, d, s2h ? -1 : r);
        store_sum(type, &v, 1, base + static_cast<std::size_t>(off + d * sd) * e);
      }
    });
  }
}

/// Writes every byte of the exchange's buffers (inputs, outputs, workspace) with `fill`, so that
/// every page is mapped before timing. -c 0 needs it too: an input page never written reads the
/// kernel's shared zero page, which stays in cache, and the exchange then times faster than any
/// user's call while the bare all-to-all-v (whose buffers are written) does not. Skipped only with
/// --copies 0, which copies nothing (simulated time, bench/smpi).
void touch_buffers(Exchange& x, std::byte fill) {
  std::fill(x.ws.begin(), x.ws.end(), fill);
  for (std::vector<Bytes>* l : {&x.in, &x.out})
    for (Bytes& b : *l) std::fill(b.begin(), b.end(), fill);
}

/// Elements of this rank's outputs that differ (bitwise) from what the partitions say they hold.
long long count_wrong(const Exchange& x, const SeqPartition& seq, int r) {
  const bool s2h = x.dir == Direction::seq_to_head;
  long long wrong = 0;
  std::vector<double> terms;
  std::byte want[8];
  for (int t = 0; t < x.plan.num_tensors(); ++t) {
    const TensorSpec& spec = x.plan.tensor(t);
    const std::size_t e = size_of(spec.type);
    const bool sums = !s2h && spec.replicas == Replicas::sum;
    const std::byte* base = x.out[static_cast<std::size_t>(t)].data();
    for_each_row(x.plan, t, !s2h, seq, r, [&](std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t off, std::int64_t sd) {
      const auto holders = spec.heads.holders(h);
      const int last = sums ? holders.second : holders.first + 1;  // summed over all, or the owner's copy
      for (std::int64_t d = 0; d < spec.head_dim; ++d) {
        terms.clear();
        if (s2h) terms.push_back(value(spec.type, t, b, s, h, d, -1));
        else
          for (int q = holders.first; q < last; ++q) terms.push_back(value(spec.type, t, b, s, h, d, q));
        store_sum(spec.type, terms.data(), static_cast<int>(terms.size()), want);
        wrong += std::memcmp(want, base + static_cast<std::size_t>(off + d * sd) * e, e) != 0;
      }
    });
  }
  return wrong;
}

/// The element type's C++ stand-in for attention_specs (only its size matters here).
template <class F>
auto with_storage(ElementType type, F&& f) {
  switch (type) {
    case ElementType::float64: return f(double{});
    case ElementType::float32: return f(float{});
    default: return f(std::uint16_t{});
  }
}

/// One exchange of a layer the sweep times: on the q, k, v plan or on o's, in `dir`, named as the
/// rows and the JSON name it.
struct Step {
  bool qkv;
  Direction dir;
  const char* name;
};

/// The exchanges of a layer the options ask for, in the order a training step runs them: the
/// forward's (seq_to_head of q, k, v; head_to_seq of o), then with --backward the backward's
/// (head_to_seq_backward of do: seq->head; seq_to_head_backward of dq, dk, dv: head->seq, summing
/// the partial gradients of replicated kv heads). --direction keeps one plan's.
std::vector<Step> steps(const Options& o) {
  std::vector<Step> s;
  if (o.seq_to_head) s.push_back({true, Direction::seq_to_head, "seq_to_head"});
  if (o.head_to_seq) s.push_back({false, Direction::head_to_seq, "head_to_seq"});
  if (o.backward && o.head_to_seq) s.push_back({false, backward_of(Direction::head_to_seq), "head_to_seq_backward"});
  if (o.backward && o.seq_to_head) s.push_back({true, backward_of(Direction::seq_to_head), "seq_to_head_backward"});
  return s;
}

/// --copies 0: an executor that runs none of the blocks it is given (pack, unpack, sums): the
/// transports send the same messages (sizes, peers, order) as with a HostExecutor, and the output is
/// garbage. For timing the communication under a simulator that gives host work no time (SMPI
/// with smpi/simulate-computation:no, bench/smpi/smpi.sh), where it gives the same simulated times
/// and saves the wall time of copying every rank's tensors (docs/simulation.md); on a real machine
/// the copies' time is missing from what it measures.
struct SkipCopies {
  static constexpr bool runs_on_host = true;  ///< as HostExecutor: the same path choice
  /// Runs nothing (see the struct).
  void run(const BlockCopy*, std::size_t, const BufferTable&) const {}
};

/// How the host backends (local, mpi) run an exchange: redistribute() with a HostExecutor (or
/// SkipCopies) on the host buffers of the Exchange; wall-clock time between barriers (time_us());
/// the bare all-to-all-v of the same bytes on the same communicator.
template <class Comm, class Exec = HostExecutor>
class HostRunner {
 public:
  explicit HostRunner(Comm& comm) : comm_(comm) {}
  Comm& group() { return comm_; }  ///< the host collectives (barrier, max and sum over ranks)
  std::string path(const Plan& plan) const { return to_string(choose_path<Comm, Exec>(plan)); }
  void load(Exchange& x) {
    x_ = &x;
    in_ = x.ins();
    out_ = x.outs();
  }
  void once() { redistribute(x_->plan, x_->dir, comm_, exec_, in_, out_, x_->ws); }
  void fetch() {}  // the outputs are the Exchange's
  double exchange_us(const Options& o) { return time_us(comm_, o.warmup, o.iters, o.reps, [&] { once(); }); }
  double bare_us(std::size_t bytes, const Options& o) {
    Bare bare(comm_.size(), bytes);  // the same bytes, contiguous
    return time_us(comm_, o.warmup, o.iters, o.reps, [&] { bare.run(comm_); });
  }
  /// The exchange and the bare all-to-all-v of `bytes` timed per call, alternately
  /// (interleaved_us()): {exchange, bare} in microseconds.
  std::pair<double, double> pair_us(std::size_t bytes, const Options& o) {
    Bare bare(comm_.size(), bytes);
    return interleaved_us(comm_, o.warmup, o.iters, [&] { once(); }, [&] { bare.run(comm_); });
  }
  /// The exchange numbered and not, per call, alternately (--call-numbers both): {numbered, not}.
  std::pair<double, double> numbering_us(const Options& o) { return numbered_and_not(comm_, o, [&] { once(); }); }
  void unload() noexcept {}

 private:
  Comm& comm_;
  Exec exec_;
  Exchange* x_ = nullptr;
  TensorList<ConstByteSpan> in_;
  TensorList<ByteSpan> out_;
};

#if ULYSSES_PERF_MPI
/// How --backend mpi runs an exchange on one node (the default there; --mpi-window 0: HostRunner
/// on the MpiComm): the inputs copied into an MpiWindow (one registration a tensor, of the largest
/// size over ranks, so every rank registers alike), redistribute() over MpiWindowComm (Path::direct:
/// the peer copy between processes, unless --path forces another); time and bare columns as
/// HostRunner's, on the MpiComm. With `outputs` (--window-outputs 1, the default) the outputs are
/// allocated from the window too, so seq→head pushes (MpiWindowComm::outputs_in_window()); fetch()
/// copies them back for the oracle. The window of a step lives until the next load() (collective).
class WindowRunner {
 public:
  WindowRunner(MpiComm& comm, bool outputs) : comm_(comm), outputs_(outputs) {}
  MpiComm& group() { return comm_; }  ///< the host collectives
  std::string path(const Plan& plan) const { return to_string(choose_path<MpiWindowComm, HostExecutor>(plan)); }
  void load(Exchange& x) {
    x_ = &x;
    std::vector<std::size_t> sizes;  // every registration: the inputs, then (with outputs_) the outputs
    std::size_t total = 0;
    for (const auto* l : {&x.in, &x.out}) {
      if (l == &x.out && !outputs_) break;
      for (const auto& b : *l) {
        sizes.push_back(static_cast<std::size_t>(max_over_ranks(comm_, static_cast<double>(b.size()))));
        total += (sizes.back() + MpiWindow::kAlignment - 1) / MpiWindow::kAlignment * MpiWindow::kAlignment;
      }
    }
    wc_.reset();
    win_.reset();  // every rank frees the previous step's window first
    win_ = std::make_unique<MpiWindow>(comm_, total);
    wc_ = std::make_unique<MpiWindowComm>(comm_, *win_);
    in_ = {};
    for (std::size_t t = 0; t < x.in.size(); ++t) {
      const WindowSpan w = win_->allocate(sizes[t]);
      std::memcpy(w.data(), x.in[t].data(), x.in[t].size());
      in_.push_back(ConstByteSpan{w.data(), x.in[t].size()});
    }
    out_ = x.outs();
    if (outputs_)
      for (std::size_t t = 0; t < x.out.size(); ++t) {
        const WindowSpan w = win_->allocate(sizes[x.in.size() + t]);
        std::memcpy(w.data(), x.out[t].data(), x.out[t].size());  // (written: every page mapped)
        out_.data[t] = ByteSpan{w.data(), x.out[t].size()};
      }
  }
  void once() { redistribute(x_->plan, x_->dir, *wc_, exec_, in_, out_, x_->ws); }
  void fetch() {  // the outputs back into the Exchange's for the oracle
    if (outputs_)
      for (std::size_t t = 0; t < x_->out.size(); ++t) std::memcpy(x_->out[t].data(), out_.data[t].data, x_->out[t].size());
  }
  double exchange_us(const Options& o) { return time_us(comm_, o.warmup, o.iters, o.reps, [&] { once(); }); }
  /// As HostRunner::numbering_us().
  std::pair<double, double> numbering_us(const Options& o) { return numbered_and_not(comm_, o, [&] { once(); }); }
  double bare_us(std::size_t bytes, const Options& o) {
    Bare bare(comm_.size(), bytes);  // the same bytes, contiguous, on the MpiComm
    return time_us(comm_, o.warmup, o.iters, o.reps, [&] { bare.run(comm_); });
  }
  void unload() noexcept {}

 private:
  MpiComm& comm_;
  bool outputs_;
  HostExecutor exec_;
  std::unique_ptr<MpiWindow> win_;
  std::unique_ptr<MpiWindowComm> wc_;
  Exchange* x_ = nullptr;
  TensorList<ConstByteSpan> in_;
  TensorList<ByteSpan> out_;
};

/// Whether every process of `comm` shares one node (MPI_COMM_TYPE_SHARED). Collective.
bool one_node(const MpiComm& comm) {
  MPI_Comm node;
  MPI_Comm_split_type(comm.get(), MPI_COMM_TYPE_SHARED, comm.rank(), MPI_INFO_NULL, &node);
  int n = 0;
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  return n == comm.size();
}
#endif

#if ULYSSES_PERF_CUDA
/// How the device backends (nccl, cuda-local) run an exchange: perf_device::Rank (the host
/// inputs copied to device buffers, redistribute() with a CudaExecutor on the rank's stream, the
/// outputs copied back for the oracle); CUDA events on that stream, the slowest rank's, the
/// fastest of --reps blocks (each after a stream sync and a barrier); the bare all-to-all-v of
/// the same bytes on the same communicator.
class DeviceRunner {
 public:
  explicit DeviceRunner(perf_device::Rank& dev) : dev_(dev) {}
  perf_device::Rank& group() { return dev_; }
  std::string path(const Plan& plan) const { return dev_.path(plan); }
  void load(Exchange& x) {
    x_ = &x;
    dev_.load(x.plan, x.dir, x.ins());
  }
  void once() { dev_.run(perf_device::Op::exchange, 1); }
  void fetch() { dev_.fetch(x_->outs()); }
  double exchange_us(const Options& o) { return timed(perf_device::Op::exchange, o); }
  double bare_us(std::size_t bytes, const Options& o) {
    dev_.load_bare(bytes);
    return timed(perf_device::Op::bare, o);
  }
  void unload() noexcept { dev_.unload(); }

 private:
  double timed(perf_device::Op op, const Options& o) {
    dev_.run(op, o.warmup);
    double best = 0;
    for (int k = 0; k < o.reps; ++k) {
      dev_.sync();
      barrier(dev_);
      const double us = max_over_ranks(dev_, dev_.time_us(op, o.iters));
      best = k == 0 ? us : std::min(best, us);
    }
    return best;
  }
  perf_device::Rank& dev_;
  Exchange* x_ = nullptr;
};
#endif

/// Whether a runner times the exchange numbered and not alternately (numbering_us()).
template <class R, class = void>
struct numbers_pairs : std::false_type {};
template <class R>
struct numbers_pairs<R, std::void_t<decltype(&R::numbering_us)>> : std::true_type {};
/// Whether a runner times the exchange and the bare all-to-all-v alternately (pair_us()).
template <class R, class = void>
struct interleaves : std::false_type {};
template <class R>
struct interleaves<R, std::void_t<decltype(&R::pair_us)>> : std::true_type {};

/// The sweep on one rank of `runner`'s group (HostRunner or DeviceRunner): per S, per step(), the
/// plan, with -c 1 its buffers filled from the oracle and one checked run, then the timed runs and
/// the bare all-to-all-v. Collective. @returns the rows (every rank's same ones).
template <class Runner>
std::vector<Row> run(Runner& runner, const Options& o) {
  auto& comm = runner.group();
  const int P = comm.size(), r = comm.rank();
  std::vector<Row> rows;
  PlanOptions po;
  po.path = o.path;
  if (o.ranks_per_node > 0) po.nodes = NodeLayout::uniform(P, o.ranks_per_node);
  po.lanes = o.lanes;
  const HeadPolicy policy = o.balanced ? HeadPolicy::balanced : HeadPolicy::even;
  const AttentionSpecs a = with_storage(o.type, [&](auto x) { return attention_specs<decltype(x)>(P, o.shape, o.type, policy); });
  for (std::int64_t S = o.begin; S <= o.end;) {
    const SeqPartition seq = SeqPartition::balanced(S, P);
    for (const Step& step : steps(o)) {
      Exchange x{Plan({P, r}, o.batch, seq, step.qkv ? a.qkv() : a.out(), o.layout, po), step.dir, {}, {}, {}, 0};
      if (o.max_rank_bytes > 0) {  // the same verdict on every rank: the largest input over ranks
        double in = 0;
        for (int t = 0; t < x.plan.num_tensors(); ++t) in += static_cast<double>(x.plan.input_bytes(x.dir, t));
        if (max_over_ranks(comm, in) > o.max_rank_bytes) {
          if (r == 0) std::fprintf(stderr, "# S=%lld skipped: %.0f bytes a rank > --max-rank-bytes\n", static_cast<long long>(S), in);
          continue;
        }
      }
      for (int t = 0; t < x.plan.num_tensors(); ++t) {
        x.in.emplace_back(x.plan.input_bytes(x.dir, t));
        x.out.emplace_back(x.plan.output_bytes(x.dir, t));
        x.in_bytes += x.plan.input_bytes(x.dir, t);
      }
      x.ws.resize(x.plan.workspace_bytes());
      if (o.check || o.copies) {  // every page written before timing (see touch_buffers())
        touch_buffers(x, o.check ? std::byte{0} : std::byte{0x5a});
        if (o.check) fill_inputs(x, seq, r);
      }
      runner.load(x);
      struct Unload {
        Runner& r;
        ~Unload() { r.unload(); }
      } unload{runner};  // before x (whose plan a device executor holds) goes
      Row row;
      row.S = S;
      row.direction = step.name;
      row.path = runner.path(x.plan);
      row.bytes = max_over_ranks(comm, static_cast<double>(x.in_bytes));
      if (o.check) {
        runner.once();
        runner.fetch();
        row.wrong = sum_over_ranks(comm, count_wrong(x, seq, r));
      }
      if constexpr (numbers_pairs<Runner>::value) {
        if (o.call_numbers == 2) {
          std::tie(row.us, row.bare_us) = runner.numbering_us(o);
          rows.push_back(row);
          continue;
        }
      }
      if constexpr (interleaves<Runner>::value) {
        if (o.bare && o.backend == "local") {  // in-process: per call, alternating with the bare all-to-all-v
          std::tie(row.us, row.bare_us) = runner.pair_us(static_cast<std::size_t>(row.bytes), o);
          rows.push_back(row);
          continue;
        }
      }
      row.us = runner.exchange_us(o);
      if (o.bare) row.bare_us = runner.bare_us(static_cast<std::size_t>(row.bytes), o);
      rows.push_back(row);
    }
    // The next size (stop at the end, at one size when neither grows, and before an overflow).
    if (o.increment > 0) {
      if (S > o.end - o.increment) break;
      S += o.increment;
    } else {
      if (o.factor == 1 || S > o.end / o.factor) break;
      S *= o.factor;
    }
  }
  return rows;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

/// What the time and bare columns measure on `backend`, for the table's header.
struct Measures {
  const char* time;
  const char* bare;
};
Measures measures(const std::string& backend) {
  if (backend == "nccl")
    return {"CUDA events on each rank's stream", "NcclComm's all-to-all-v (grouped ncclSend/ncclRecv, as nccl-tests' alltoall_perf) of the same bytes between contiguous device buffers, same communicator and stream"};
  if (backend == "cuda-ipc")
    return {"CUDA events on each rank's stream", "one cudaMemcpyAsync of the same bytes on each rank's stream (no exchange: the copy floor)"};
  if (backend == "cuda-local")
    return {"CUDA events on each rank's stream", "DeviceLocalGroup's all-to-all-v (one cudaMemcpyAsync a chunk) of the same bytes between contiguous device buffers, same group and streams"};
  if (backend == "local")
    return {"per call, each after a barrier, the slowest rank's wall clock; the median of the iterations, the exchange and the bare all-to-all-v alternating",
            "the all-to-all-v of the same bytes between contiguous buffers on the same communicator (LocalGroup::Comm::alltoallv)"};
  return {"wall clock between two barriers", "the all-to-all-v of the same bytes between contiguous buffers on the same communicator"};
}

/// Prints the table (and writes --json); `device` names the GPU of the device backends ("" for
/// the host ones). @returns false when the JSON file cannot be written.
bool print(const Options& o, int P, const std::vector<Row>& rows, const std::string& device = "") {
  std::printf("# ulysses_perf: %s (H=%lld Hkv=%lld D=%lld Dv=%lld), %s, %s, B=%lld, P=%d, backend %s, %d iters after %d warm-up%s%s\n",
              o.model.c_str(), static_cast<long long>(o.shape.num_heads), static_cast<long long>(o.shape.num_kv_heads),
              static_cast<long long>(o.shape.head_dim), static_cast<long long>(o.shape.v_head_dim), to_string(o.type), to_string(o.layout),
              static_cast<long long>(o.batch), P, o.backend.c_str(), o.iters, o.warmup,
              o.reps > 1 ? (", fastest of " + std::to_string(o.reps) + " repetitions").c_str() : "", o.check ? ", checked bit for bit" : "");
  if (o.call_numbers == 0) std::printf("# library calls not numbered (--call-numbers 0)\n");
  if (o.call_numbers == 2)
    std::printf("# --call-numbers both: time = each call numbered, bare = the same call not numbered, alternately (per call, the median); ratio = their ratio\n");
  if (o.ranks_per_node > 0)
    std::printf("# simulated nodes of %d ranks %s, lanes %d (the two-level exchange where the path column says two_level)\n",
                o.ranks_per_node, NodeLayout::uniform(P, o.ranks_per_node).str().c_str(), o.lanes);
  if (!device.empty()) std::printf("# device: %s, buffers in device memory, the oracle's check on the host from copied-back outputs\n", device.c_str());
  const Measures m = measures(o.backend);
  std::printf("# bytes: a rank's input tensors (own chunk included, as nccl-tests counts an all-to-all; the largest rank's)\n"
              "# algbw = bytes/time; busbw = algbw*(P-1)/P; ratio = time/bare; time: %s, the slowest rank's\n# bare: %s\n",
              m.time, m.bare);
  std::printf("#%9s %13s %-22s %-9s %11s %9s %9s %7s %11s %9s %6s\n", "S", "bytes", "direction", "path", "time(us)", "algbw",
              "busbw", "#wrong", "bare(us)", "algbw", "ratio");
  std::printf("#%9s %13s %-22s %-9s %11s %9s %9s %7s %11s %9s %6s\n", "", "", "", "", "", "(GB/s)", "(GB/s)", "", "", "(GB/s)", "");
  for (const Row& w : rows) {
    const double alg = w.bytes / w.us * 1e-3, bare = w.bare_us > 0 ? w.bytes / w.bare_us * 1e-3 : 0;
    char wrong[24];
    if (w.wrong < 0) std::snprintf(wrong, sizeof wrong, "N/A");
    else std::snprintf(wrong, sizeof wrong, "%lld", w.wrong);
    std::printf(" %9lld %13.0f %-22s %-9s %11.1f %9.2f %9.2f %7s %11.1f %9.2f %6.2f\n", static_cast<long long>(w.S), w.bytes,
                w.direction.c_str(), w.path.c_str(), w.us, alg, alg * (P - 1) / P, wrong, w.bare_us, bare, w.bare_us > 0 ? w.us / w.bare_us : 0);
  }
  long long wrong = 0;
  for (const Row& w : rows) wrong += std::max(0LL, w.wrong);
  if (o.check) std::printf("# wrong elements (all sizes, all ranks): %lld %s\n", wrong, wrong ? "FAILED" : "OK");
  if (o.json.empty()) return true;
  FILE* f = std::fopen(o.json.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "ulysses_perf: cannot write %s: %s\n", o.json.c_str(), std::strerror(errno));
    return false;
  }
  std::fprintf(f, "{\"tool\": \"ulysses_perf\", \"model\": \"%s\", \"heads\": %lld, \"kv_heads\": %lld, \"head_dim\": %lld, \"v_head_dim\": %lld,\n",
               json_escape(o.model).c_str(), static_cast<long long>(o.shape.num_heads), static_cast<long long>(o.shape.num_kv_heads),
               static_cast<long long>(o.shape.head_dim), static_cast<long long>(o.shape.v_head_dim));
  std::fprintf(f, " \"dtype\": \"%s\", \"layout\": \"%s\", \"batch\": %lld, \"ranks\": %d, \"backend\": \"%s\", \"iters\": %d, \"warmup\": %d,\n",
               to_string(o.type), to_string(o.layout), static_cast<long long>(o.batch), P, o.backend.c_str(), o.iters, o.warmup);
  std::fprintf(f, " \"balanced\": %s, \"ranks_per_node\": %d, \"reps\": %d, \"device\": \"%s\", \"call_numbers\": %s,\n",
               o.balanced ? "true" : "false", o.ranks_per_node, o.reps, json_escape(device).c_str(), o.call_numbers == 2 ? "\"both\"" : o.call_numbers ? "true" : "false");
  std::fprintf(f, " \"rows\": [\n");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& w = rows[i];
    const double alg = w.bytes / w.us * 1e-3;
    std::fprintf(f,
                 "  {\"S\": %lld, \"bytes\": %.0f, \"direction\": \"%s\", \"path\": \"%s\", \"time_us\": %.3f, \"algbw_GBps\": %.4f, "
                 "\"busbw_GBps\": %.4f, \"wrong\": %lld, \"bare_us\": %.3f, \"bare_algbw_GBps\": %.4f, \"ratio\": %.4f}%s\n",
                 static_cast<long long>(w.S), w.bytes, w.direction.c_str(), w.path.c_str(), w.us, alg, alg * (P - 1) / P, w.wrong,
                 w.bare_us, w.bare_us > 0 ? w.bytes / w.bare_us * 1e-3 : 0, w.bare_us > 0 ? w.us / w.bare_us : 0, i + 1 < rows.size() ? "," : "");
  }
  std::fprintf(f, " ],\n \"lanes\": %d}\n", o.lanes);  // PlanOptions::lanes of the two-level rows (perf_model.hpp re-plans with it)
  return std::fclose(f) == 0;
}

[[noreturn]] void usage(int code) {
  std::printf(
      "usage: ulysses_perf [--backend local|mpi|nccl|cuda-local|cuda-ipc] [--ranks P] [--model NAME | --heads H --kv-heads Hkv --head-dim D\n"
      "                    [--v-head-dim Dv]] [--dtype fp32|bf16|fp16|fp64] [-b S0] [-e S1] [-f F | -i INC] [--batch B]\n"
      "                    [--layout bshd|sbhd|bhsd] [--direction seq_to_head|head_to_seq|both] [--balanced]\n"
      "                    [--path auto|alltoallv|messages|direct|two_level] [--ranks-per-node R [--lanes L]] [--backward]\n"
      "                    [--mpi-window 0|1] [--window-outputs 1|0] [--call-numbers 1|0|both] [-n ITERS] [-w WARMUP] [--reps R] [--bare 0|1] [--copies 0|1] [-c 0|1] [--max-rank-bytes N] [--json FILE] [--list-models]\n"
      "       ulysses_perf --advise [--model NAME ...] [--seq S] [--world N] [--ranks-per-node R] [--dtype T] [--batch B]\n"
      "                    [--budget-GiB G] [--params FILE [--params-backend local|mpi]] [--intra-us A] [--intra-GBps BW]\n"
      "                    [--inter-us A] [--inter-GBps BW] [--intra-latency-us L] [--inter-latency-us L] [--copy-GBps BW] [--ranks-per-nic N]\n"
      "                    [--attn-TFLOPS T]\n"
      "       ulysses_perf --fit PARAMS.json [--ranks-per-nic N] RUN.json [RUN.json ...]\n"
      "       ulysses_perf --check PARAMS.json [--rows] RUN.json [RUN.json ...]\n"
      "       ulysses_perf --check-ring PARAMS.json RING.json [RING.json ...]   (bench_ring / bench_ring_mpi JSON)\n"
      "The Ulysses exchanges of one attention layer (q,k,v seq->head in one exchange; o head->seq), for\n"
      "S = S0, S0*F, ... <= S1 (or S0, S0+INC, ...; balanced sequence split; uneven S welcome), timed like nccl-tests'\n"
      "alltoall_perf next to the bare all-to-all-v of the same bytes. Bytes: a rank's input tensors, own chunk included\n"
      "(as nccl-tests counts an all-to-all). -c 1 checks every output element bit for bit against an oracle (#wrong);\n"
      "-c 0 only times (every buffer written once with a constant instead of the oracle's values). --copies 0 (--backend mpi,\n"
      "with -c 0): the executor skips the host copies and the buffers stay unwritten, the messages stay the same: for simulated time only (SMPI).\n"
      "--backend local times what one call costs: each call after a barrier, the slowest rank's time, the exchange and\n"
      "the bare all-to-all-v alternating, the median of -n of each after -w warm-up pairs (--reps ignored there).\n"
      "--backward adds the backward pass to the forward (as the demo's --backward does): head_to_seq_backward of do\n"
      "and seq_to_head_backward of dq, dk, dv (which sums the partial gradients of replicated kv heads).\n"
      "Backends: local (P threads, host memory), mpi (run under mpiexec -n P), nccl (one process per GPU, under\n"
      "mpiexec -n P when built with MPI, which passes the NCCL unique id; P=1 without), cuda-local (P virtual ranks on\n"
      "one GPU, DeviceLocalGroup), cuda-ipc (mpiexec -n P on one node, several processes may share a GPU: the peer\n"
      "copy across processes through CUDA IPC, inputs in a device window of --window-MiB M per rank, default 1024;\n"
      "its bare column is one cudaMemcpyAsync of the same bytes); the device backends time with CUDA events and check on the host. Without a CUDA\n"
      "device they refuse to start (exit 3).\n"
      "Defaults: Llama-3.1-8B, fp32, bshd, B=1, -b 1024 -e 16384 -f 2, both directions, -n 20 -w 5, local P=4.\n"
      "--ranks-per-node R: the group's ranks sit on simulated nodes of R (PlanOptions::nodes), so the plan takes the\n"
      "two-level exchange (intra-node gather, one message per node pair, intra-node delivery) under MPI; in-process\n"
      "ranks share memory and take the direct path unless --path two_level. The last node may hold fewer ranks.\n"
      "--lanes L: inter-node messages per node pair (1: one forwarder per pair; 0: rail-aligned, one per rank).\n"
      "--groups G (--backend mpi): G groups of N/G consecutive ranks (of the N processes) run the sweep at the same time (each group's rank 0\n"
      "prints its table): one Ulysses group timed while the others load the shared links.\n"
      "--mpi-window 0|1: --backend mpi over MpiWindowComm (inputs in an MPI-3 shared window, the peer copy between\n"
      "processes: the default when every process is on one node and no --ranks-per-node) or over MpiComm (0);\n"
      "--call-numbers 1|0|both: number the library calls (1, the default; 0 only to measure what numbering costs); both (host\n"
      "                    backends): each call numbered and not, alternately, time = numbered, bare = not numbered, ratio = their ratio\n"
      "--window-outputs 1|0: the outputs allocated from the window too (the default: seq->head then pushes into the\n"
      "peers' outputs) or left in private memory (0: each rank pulls its heads out of its peers' rows).\n"
      "--fit: calibrates the alpha-beta model (cost.hpp) per backend from --json files (--ranks-per-nic N: N ranks of a\n"
      "node share one inter-node NIC, their concurrent inter-node flows dividing its bandwidth; 1, a NIC per rank, by\n"
      "default; written to PARAMS.json as ranks_per_nic, not fitted); --check: its error on\n"
      "measurements (per row with --rows; exits 1 when some row is off by more than 15%%); --advise: the feasible\n"
      "(Ulysses degree, outer degree) layouts of --world ranks for --model at --seq, predicted, best first: within\n"
      "--budget-GiB (a rank's memory for one layer's attention tensors; default none: then every layout fits and the\n"
      "least traffic, P=1, wins) by time, the others after by memory (defaults: S=131072, world 64, 8 ranks per node,\n"
      "bf16, the NVLink/InfiniBand placeholders of CostModel, or --params); then the Ulysses x Ring x outer layouts\n"
      "(advise_hybrid: the ring rotation overlapped with each step's attention at --attn-TFLOPS, default 500: H100/H200 bf16,\n"
      "and the all-gather-kv alternative). --check-ring: the model's ring step against bench_ring / bench_ring_mpi JSON\n"
      "(out of sample with PARAMS, and fitted to the bare send/recv rows), and the exposed communication, as Markdown.\n");
  std::exit(code);
}

Options parse(int argc, char** argv) {
  Options o;
  auto need = [&](int& i) -> std::string { return ulysses_cli::value(argc, argv, i); };
  auto number = [&](int& i) { return ulysses_cli::whole(argc, argv, i, LLONG_MIN, LLONG_MAX); };
  auto small = [&](int& i) { return static_cast<int>(ulysses_cli::whole(argc, argv, i, INT_MIN, INT_MAX)); };
  bool custom = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--backend") o.backend = need(i);
    else if (a == "--ranks") o.ranks = small(i), o.ranks_given = true;
    else if (a == "--model") {
      const std::string name = need(i);
      const auto* m = ulysses_models::find_model(name);
      if (!m) {
        std::fprintf(stderr, "unknown or ambiguous model '%s'; --list-models lists them\n", name.c_str());
        std::exit(2);
      }
      o.model = m->name;
      o.shape = {m->num_heads, m->num_kv_heads, m->head_dim, m->v_head_dim};
    } else if (a == "--heads") o.shape.num_heads = number(i), custom = true;
    else if (a == "--kv-heads") o.shape.num_kv_heads = number(i), custom = true;
    else if (a == "--head-dim") o.shape.head_dim = o.shape.v_head_dim = number(i), custom = true;
    else if (a == "--v-head-dim") o.shape.v_head_dim = number(i), custom = true;
    else if (a == "--dtype") {
      const ElementType types[] = {ElementType::float32, ElementType::bfloat16, ElementType::float16, ElementType::float64};
      o.type = types[ulysses_cli::one_of(argc, argv, i, {"fp32", "bf16", "fp16", "fp64"})];
      o.type_given = true;
    } else if (a == "-b") o.begin = number(i);
    else if (a == "-e") o.end = number(i);
    else if (a == "-f") o.factor = number(i);
    else if (a == "-i") o.increment = number(i);
    else if (a == "--batch") o.batch = number(i);
    else if (a == "--layout") {
      const Format formats[] = {Format::bshd, Format::sbhd, Format::bhsd};
      o.layout = formats[ulysses_cli::one_of(argc, argv, i, {"bshd", "sbhd", "bhsd"})];
    } else if (a == "--direction") {
      const std::size_t d = ulysses_cli::one_of(argc, argv, i, {"seq_to_head", "head_to_seq", "both"});
      o.seq_to_head = d != 1;
      o.head_to_seq = d != 0;
    } else if (a == "--path") {
      const Path paths[] = {Path::automatic, Path::alltoallv, Path::messages, Path::direct, Path::two_level};
      o.path = paths[ulysses_cli::one_of(argc, argv, i, {"auto", "alltoallv", "messages", "direct", "two_level"})];
    } else if (a == "--balanced") o.balanced = true;
    else if (a == "--backward") o.backward = true;
    else if (a == "-n") o.iters = small(i);
    else if (a == "-w") o.warmup = small(i);
    else if (a == "--reps") o.reps = small(i);
    else if (a == "--bare") o.bare = number(i) != 0;
    else if (a == "--copies") o.copies = number(i) != 0;
    else if (a == "-c") o.check = number(i) != 0;
    else if (a == "--json") o.json = need(i);
    else if (a == "--ranks-per-node") o.ranks_per_node = small(i);
    else if (a == "--lanes") o.lanes = small(i);
    else if (a == "--groups") o.groups = small(i);
    else if (a == "--mpi-window") o.mpi_window = number(i) != 0;
    else if (a == "--window-outputs") o.window_outputs = number(i) != 0;
    else if (a == "--call-numbers") {
      const std::string v = need(i);
      o.call_numbers = v == "both" ? 2 : v == "0" ? 0 : 1;
    }
    else if (a == "--window-MiB") o.window_MiB = number(i);
    else if (a == "--max-rank-bytes") o.max_rank_bytes = ulysses_cli::real(argc, argv, i, 0);
    else if (a == "--advise") o.mode = "advise";
    else if (a == "--fit") o.mode = "fit", o.params = need(i);
    else if (a == "--check") o.mode = "check", o.params = need(i);
    else if (a == "--check-ring") o.mode = "check_ring", o.params = need(i);
    else if (a == "--attn-TFLOPS") o.attn_TFLOPS = ulysses_cli::real(argc, argv, i, 1e-9);
    else if (a == "--rows") o.rows = true;
    else if (a == "--params") o.params = need(i);
    else if (a == "--params-backend") o.params_backend = need(i);
    else if (a == "--seq") o.seq = number(i);
    else if (a == "--world") o.world = small(i);
    else if (a == "--budget-GiB") o.budget_GiB = ulysses_cli::real(argc, argv, i, 0);
    else if (a == "--intra-us") o.links.intra_us = ulysses_cli::real(argc, argv, i, 0);
    else if (a == "--intra-GBps") o.links.intra_GBps = ulysses_cli::real(argc, argv, i, 0);
    else if (a == "--inter-us") o.links.inter_us = ulysses_cli::real(argc, argv, i, 0);
    else if (a == "--inter-GBps") o.links.inter_GBps = ulysses_cli::real(argc, argv, i, 0);
    else if (a == "--intra-latency-us") o.links.intra_latency_us = ulysses_cli::real(argc, argv, i, 0);
    else if (a == "--inter-latency-us") o.links.inter_latency_us = ulysses_cli::real(argc, argv, i, 0);
    else if (a == "--ranks-per-nic") o.links.ranks_per_nic = ulysses_cli::real(argc, argv, i, 1);
    else if (a == "--copy-GBps") o.links.copy_GBps = ulysses_cli::real(argc, argv, i, 0);
    else if (!a.empty() && a[0] != '-') o.inputs.push_back(a);
    else if (a == "--list-models") {
      for (const auto& m : ulysses_models::kModels)
        std::printf("%-18s H=%-3lld Hkv=%-3lld D=%-3lld Dv=%-3lld\n", m.name, static_cast<long long>(m.num_heads),
                    static_cast<long long>(m.num_kv_heads), static_cast<long long>(m.head_dim), static_cast<long long>(m.v_head_dim));
      std::exit(0);
    } else if (a == "--help" || a == "-h") usage(0);
    else {
      std::fprintf(stderr, "unknown argument '%s'\n", a.c_str());
      usage(2);
    }
  }
  if (custom) o.model = "custom";
  if (o.backend != "local" && o.backend != "mpi" && o.backend != "nccl" && o.backend != "cuda-local" && o.backend != "cuda-ipc") {
    std::fprintf(stderr, "--backend must be local, mpi, nccl, cuda-local or cuda-ipc, not '%s'\n", o.backend.c_str());
    std::exit(2);
  }
  if (o.begin < 1 || o.end < o.begin || o.factor < 1 || o.increment < 0 || o.iters < 1 || o.warmup < 0 || o.reps < 1 || o.batch < 1 || o.ranks < 1 || o.lanes < 0 ||
      o.ranks_per_node < 0 || o.seq < 1 || o.world < 1) {
    std::fprintf(stderr, "need 1 <= -b <= -e, -f >= 1, -i >= 0, -n >= 1, -w >= 0, --reps >= 1, --batch >= 1, --ranks >= 1, "
                         "--ranks-per-node >= 0, --lanes >= 0, --seq >= 1, --world >= 1\n");
    std::exit(2);
  }
  if (!o.copies && (o.check || o.backend != "mpi")) {
    std::fprintf(stderr, "--copies 0 times the messages alone: it needs --backend mpi and -c 0\n");
    std::exit(2);
  }
  if (!o.inputs.empty() && o.mode != "fit" && o.mode != "check" && o.mode != "check_ring") {
    std::fprintf(stderr, "unknown argument '%s' (measurement files go with --fit or --check)\n", o.inputs.front().c_str());
    std::exit(2);
  }
  if ((o.mode == "fit" || o.mode == "check" || o.mode == "check_ring") && o.inputs.empty()) {
    std::fprintf(stderr, "--%s needs ulysses_perf --json files to read\n", o.mode.c_str());
    std::exit(2);
  }
  return o;
}

/// The exit status of a sweep: 1 when some element was wrong, else 0.
int status_of(const std::vector<Row>& rows) {
  for (const Row& w : rows)
    if (w.wrong > 0) return 1;
  return 0;
}

/// Whether an MPI launcher started this process (Open MPI, MPICH / PMI).
bool under_mpiexec() { return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE"); }

#if ULYSSES_PERF_CUDA
/// --backend cuda-local: --ranks P virtual ranks on the current GPU (DeviceLocalGroup).
/// @returns the exit status: 3 without a CUDA device (nothing run), 2 when --json cannot be
///          written, 1 when an element was wrong, else 0.
int run_cuda_local(const Options& o) {
  const std::string why = perf_device::unavailable();
  if (!why.empty()) {
    std::fprintf(stderr, "ulysses_perf: --backend cuda-local needs a CUDA device and finds none (%s); nothing run\n", why.c_str());
    return 3;
  }
  std::vector<Row> rows;
  perf_device::spawn_local(o.ranks, [&](perf_device::Rank& dev) {
    DeviceRunner runner(dev);
    std::vector<Row> mine = run(runner, o);
    if (dev.rank() == 0) rows = std::move(mine);
  });
  if (!print(o, o.ranks, rows, perf_device::device_name(0) + ", " + std::to_string(o.ranks) + " virtual ranks")) return 2;
  return status_of(rows);
}

/// --backend nccl: one process per GPU. Built with MPI: the processes of mpiexec, each on the GPU
/// of its node-local rank, rank 0's NCCL unique id broadcast over MPI_COMM_WORLD; without MPI, one
/// process (P = 1). MPI is initialised and finalised here (an error thrown out of the sweep goes
/// to main(), which aborts the job).
/// @returns the exit status, the same on every process: 3 when some process sees no CUDA device
///          (nothing run), 2 for a build without NCCL, a --ranks that is not P, more processes
///          on a node than GPUs, or a --json that cannot be written; 1 when an element was wrong.
int run_nccl(int& argc, char**& argv, const Options& o) {
  int rank = 0, P = 1, local = 0, local_size = 1;
#if ULYSSES_PERF_MPI
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const ulysses_mpi::NodeRank node = ulysses_mpi::node_rank(MPI_COMM_WORLD);
  local = node.rank, local_size = node.size;
#else
  (void)argc, (void)argv;
  if (under_mpiexec()) {
    std::fprintf(stderr, "ulysses_perf: --backend nccl under mpiexec needs a build with MPI (to pass the NCCL unique id); "
                         "this one runs one process, P = 1\n");
    return 2;
  }
#endif
  const std::string why = perf_device::unavailable();
  int devices = why.empty() ? perf_device::device_count() : 0, fewest = devices;
#if ULYSSES_PERF_MPI
  MPI_Allreduce(&devices, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
#endif
  int rc = 0;
  if (!perf_device::has_nccl()) {
    if (rank == 0) std::fprintf(stderr, "ulysses_perf: --backend nccl: this build has no NCCL (set NCCL_ROOT and reconfigure)\n");
    rc = 2;
  } else if (o.ranks_given && o.ranks != P) {
#if ULYSSES_PERF_MPI
    const char* how = ", started by mpiexec -n P";
#else
    const char* how = "; this build has no MPI: P = 1";
#endif
    if (rank == 0) std::fprintf(stderr, "ulysses_perf: --ranks %d but %d processes (--backend nccl runs one process per GPU%s)\n", o.ranks, P, how);
    rc = 2;
  } else if (fewest == 0) {
    if (rank == 0)
      std::fprintf(stderr, "ulysses_perf: --backend nccl needs a CUDA device for every process and finds none (%s); nothing run\n",
                   why.empty() ? "on some other process" : why.c_str());
    rc = 3;
  } else if (local_size > devices) {
    if (rank == 0) std::fprintf(stderr, "ulysses_perf: %d processes on a node with %d GPUs; --backend nccl runs one process per GPU\n", local_size, devices);
    rc = 2;
  } else {
    std::vector<char> id = rank == 0 ? perf_device::nccl_unique_id() : std::vector<char>(perf_device::kNcclUniqueIdBytes);
#if ULYSSES_PERF_MPI
    MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
#endif
    perf_device::with_nccl(rank, P, local, id, [&](perf_device::Rank& dev) {
      DeviceRunner runner(dev);
      const std::vector<Row> rows = run(runner, o);
      if (rank == 0 && !print(o, P, rows, perf_device::device_name(local) + " per process")) rc = 2;
      rc |= status_of(rows);
    });
  }
#if ULYSSES_PERF_MPI
  MPI_Finalize();
#endif
  return rc;
}
#endif

#if ULYSSES_PERF_CUDA
/// --backend cuda-ipc: the processes of mpiexec on one node (several may share a GPU: rank r
/// uses device r % the node's GPUs), the peer copy across processes through CUDA IPC
/// (MpiDeviceWindowComm, inputs in a device window of --window-MiB per rank). MPI is initialised
/// and finalised here. @returns 3 when some process sees no CUDA device (nothing run), 2 for a
/// build without MPI or a --json that cannot be written, 1 when an element was wrong, else 0.
int run_ipc(int& argc, char**& argv, const Options& o) {
#if ULYSSES_PERF_MPI
  MPI_Init(&argc, &argv);
  int rank = 0, P = 1, rc = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const std::string why = perf_device::unavailable();
  int devices = why.empty() ? perf_device::device_count() : 0, fewest = devices;
  MPI_Allreduce(&devices, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (fewest == 0) {
    if (rank == 0)
      std::fprintf(stderr, "ulysses_perf: --backend cuda-ipc needs a CUDA device for every process and finds none (%s); nothing run\n",
                   why.empty() ? "on some other process" : why.c_str());
    rc = 3;
  } else if (!perf_device::has_ipc()) {
    if (rank == 0) std::fprintf(stderr, "ulysses_perf: --backend cuda-ipc: this build's device backends have no MPI\n");
    rc = 2;
  } else {
    const int local = ulysses_mpi::node_rank(MPI_COMM_WORLD).rank % devices;
    perf_device::with_ipc(local, static_cast<std::size_t>(o.window_MiB * 1024 * 1024), [&](perf_device::Rank& dev) {
      DeviceRunner runner(dev);
      const std::vector<Row> rows = run(runner, o);
      if (rank == 0 && !print(o, P, rows, perf_device::device_name(local) + ", " + std::to_string(P) + " processes, CUDA IPC")) rc = 2;
      rc |= status_of(rows);
    });
  }
  MPI_Finalize();
  return rc;
#else
  (void)argc, (void)argv, (void)o;
  std::fprintf(stderr, "ulysses_perf: --backend cuda-ipc needs a build with MPI (install libopenmpi-dev and reconfigure)\n");
  return 2;
#endif
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  set_call_numbering(o.call_numbers != 0);
  if (o.mode == "sweep" && (o.backend == "local" || o.backend == "cuda-local") && under_mpiexec())
    std::fprintf(stderr, "ulysses_perf: started by mpiexec with --backend %s: each process runs its own in-process group; "
                         "give --backend mpi (or nccl) for one group over the MPI processes\n", o.backend.c_str());
  try {
    if (o.mode == "advise") {
      CostModel m = CostModel::nvlink_infiniband();
#if ULYSSES_PERF_JSON
      if (!o.params.empty()) m = perf_model::load_model(o.params, o.params_backend);
#else
      if (!o.params.empty()) throw Error(Errc::invalid_shape, "--params needs a build with nlohmann_json (apt-get install nlohmann-json3-dev)");
#endif
      const int rpn = o.ranks_per_node > 0 ? o.ranks_per_node : 8;
      const ElementType t = o.type_given ? o.type : ElementType::bfloat16;
      const int rc = perf_model::advise(o.shape, o.model, o.seq, o.world, rpn, o.links.apply(m), t, o.batch, o.budget_GiB * 1024.0 * 1024 * 1024,
                                        o.balanced);
      return rc ? rc
                : perf_model::advise_hybrid_rows(o.shape, o.seq, o.world, rpn, o.links.apply(m), o.attn_TFLOPS * 1e12, t, o.batch,
                                                 o.budget_GiB * 1024.0 * 1024 * 1024, o.balanced);
    }
    if (o.mode == "fit" || o.mode == "check" || o.mode == "check_ring") {
#if ULYSSES_PERF_JSON
      if (o.mode == "check_ring") return perf_model::check_ring(o.params, o.inputs);
      return o.mode == "fit" ? perf_model::fit(o.params, o.inputs, o.links.apply(CostModel{})) : perf_model::check(o.params, o.inputs, o.rows);
#else
      std::fprintf(stderr, "ulysses_perf: --%s reads JSON: this build has no nlohmann_json (apt-get install nlohmann-json3-dev)\n", o.mode.c_str());
      return 2;
#endif
    }
    if (o.backend == "mpi") {
#if ULYSSES_PERF_MPI
      MPI_Init(&argc, &argv);
      int rc = 0;
      {
        MpiComm comm(world_group(o.groups));
        if (o.ranks_given && o.ranks != comm.size()) {
          if (comm.rank() == 0) std::fprintf(stderr, "--ranks %d but mpiexec started %d processes\n", o.ranks, comm.size());
          rc = 2;
        } else {
          std::vector<Row> rows;
          if (o.mpi_window == 1 || (o.mpi_window < 0 && o.ranks_per_node == 0 && one_node(comm))) {
            WindowRunner runner(comm, o.window_outputs);  // the peer copy between the processes of the node
            rows = run(runner, o);
          } else {
            if (o.copies) {
              HostRunner<MpiComm> runner(comm);
              rows = run(runner, o);
            } else {
              HostRunner<MpiComm, SkipCopies> runner(comm);
              rows = run(runner, o);
            }
          }
          if (comm.rank() == 0 && !print(o, comm.size(), rows)) rc = 2;
          rc |= status_of(rows);
        }
      }
      MPI_Finalize();
      return rc;
#else
      std::fprintf(stderr, "ulysses_perf: this build has no MPI (install libopenmpi-dev and reconfigure)\n");
      return 2;
#endif
    }
    if (o.backend == "nccl" || o.backend == "cuda-local" || o.backend == "cuda-ipc") {
#if ULYSSES_PERF_CUDA
      if (o.backend == "cuda-ipc") return run_ipc(argc, argv, o);
      return o.backend == "nccl" ? run_nccl(argc, argv, o) : run_cuda_local(o);
#else
      std::fprintf(stderr, "ulysses_perf: --backend %s: this build has no CUDA (install the CUDA toolkit%s and reconfigure)\n",
                   o.backend.c_str(), o.backend == "nccl" ? " and NCCL" : "");
      return 2;
#endif
    }
    LocalGroup group(o.ranks);
    std::vector<Row> rows;
    group.spawn([&](LocalGroup::Comm& comm) {
      HostRunner<LocalGroup::Comm> runner(comm);
      std::vector<Row> mine = run(runner, o);
      if (comm.rank() == 0) rows = std::move(mine);
    });
    if (!print(o, o.ranks, rows)) return 2;
    return status_of(rows);
  } catch (const std::exception& e) {  // ulysses::Error, and std::bad_alloc for sizes this machine cannot hold
    std::fprintf(stderr, "ulysses_perf: %s\n", e.what());
#if ULYSSES_PERF_MPI
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 2);  // peers may be inside a collective
#endif
    return 2;
  }
}
