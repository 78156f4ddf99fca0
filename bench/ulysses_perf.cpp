// SPDX-License-Identifier: Apache-2.0
// ulysses_perf: one driver with an operation table, as nccl-tests (--op seq_to_head | head_to_seq |
// decode | ring; perf_ops.hpp has decode and ring): a sweep of sizes, each the library call against
// the bare transport of the same bytes on the same communicator, alternating per iteration; each
// time the median over iterations of the slowest rank's (kTimeDefinition); algbw, busbw, ratio;
// -c 1 a bit-exact check against an oracle (#wrong); --json. Backends local, mpi, and the device
// ones (perf_device.hpp / .cu: nccl, cuda-local, cuda-ipc; exit 3 without a device). The α-β model
// (perf_model.hpp): --fit, --check, --check-ring, --advise. `ulysses_perf --help` has the flags.
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
#include <functional>
#include <memory>
#include <string>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cli.hpp"
#include "group.hpp"
#include "models.hpp"
#include "perf_model.hpp"
#include "host_buffer.hpp"
#include "perf_ops.hpp"
#include "band_bench.hpp"
#include "perf_transform.hpp"
#include "perf_allgather.hpp"
#include "perf_documents.hpp"
#if ULYSSES_PERF_MPI
#include "perf_layer.hpp"
#endif

namespace {

using namespace ulysses;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string backend = "local";
  std::string op = "seq_to_head";      // --op: seq_to_head | head_to_seq | decode | ring (the operation table)
  bool direction_given = false;        // --direction: the seq ops' rows (both: seq_to_head and head_to_seq)
  int ring_u = 1;                      // --op ring: the Ulysses degree U of the ring's partition (kv heads a rank: Hkv / U)
  int ring_messages = 1;               // --op ring: --ring-messages K, the rotation's pieces a block (RingRotation's `messages`)
  RingAccess ring_access = RingAccess::copy;  // --op ring: --ring-access copy|zero_copy (RingRotation's `access`)
  std::vector<int> bands{1, 2, 4};      // --op bands: --bands G,...: the band counts timed against the serial layer
  bool bands_given = false;             // --bands was given (--op layer: each G through DistributedAttentionOptions::bands)
  std::vector<double> attn_ratios{0.25, 1, 4};  // --op bands: --attn-ratio f,...: the stand-in attention, f x the serial exchange
  std::string attn_kind;                // --op bands: --attn-kind sleep|spin (default: spin in-process, sleep over MPI)
  Progress progress = Progress::automatic;  // --op bands, --op layer --bands: --progress automatic|in_start|thread (the split-phase handles')
  bool posts_progress = true;           // --op bands: --posts-progress 0|1, whether posted messages move without a thread in MPI
  int ranks = 4;
  bool ranks_given = false;
  std::string model = "Llama-3.1-8B";
  AttentionShape shape{32, 8, 128, 128};
  ElementType type = ElementType::float32;
  bool type_given = false;  // --advise defaults to bf16
  std::int64_t begin = 1024, end = 16384, factor = 2, increment = 0, batch = 1;
  Format layout = Format::bshd;
  bool seq_to_head = true, head_to_seq = false, backward = false, check = false, balanced = false;
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
  double attn_TFLOPS = AttentionRate::h100_bf16() * 1e-12;  // --advise: a rank's attention rate for the ring's overlap and the bands
  double attn_ratio = 0;                // --advise --attn-ratio F: the bands' attention as a multiple of the exchanges (0: the rate; a list: its first)
  double band_call_us = 0;              // --advise --band-call-us: what each band's exchange and attention call adds
  bool rope = false;                    // --rope (--op seq_to_head, host backends): plain, RoPE fused on pack of q and k, a separate RoPE pass + plain
  double rope_theta = 10000.0;          // --rope-theta: the rotation's base
  Wire wire = Wire::element;            // --wire W (--op seq_to_head, host backends): q and k (--wire-tensors) on wire W against every tensor on its element wire
  bool wire_given = false;
  int wire_tensors = 2;                 // --wire-tensors qk|qkv: (b) puts the first 2 (q, k) or all 3 (q, k, v) on wire W
  perf_model::LinkFlags links;          // --advise
  perf_documents::Spec docs;            // --docs: packed documents (--advise's hybrid table, --allgather-kv's third split, --op layer)
#if ULYSSES_PERF_MPI
  perf_layer::Layout layer;             // --layer U,R[,ring|allgather] (--op layer)
#endif
};

/// One line of the table.
struct Row {
  std::int64_t S = 0;
  double bytes = 0;         // per rank (largest over ranks)
  std::string direction;    // seq_to_head, head_to_seq, or their _backward
  std::string path;         // the transport taken
  double us = 0, bare_us = 0;
  long long wrong = -1;     // -1: not checked
  // --op ring's other baselines (perf_ops::RingBaseline), 0 when not timed (--bare 0):
  double split_us = 0;      // the fastest of plain MPI's k-message patterns (k in kRingSplits)
  int split_k = 0;          // its k
  double rfa_us = 0, rfa_fresh_us = 0;  // ring-flash-attention's pattern, receive buffers reused / fresh each step
  double own_us = 0;        // --backend window: MPI_Sendrecv between the rotation's own (window) buffers
  double small_us = 0;      // MPI: MPI_Sendrecv between small-page private buffers
  // the ratios of the rotation to each, from their own alternating run (ring_row()):
  double split_ratio = 0, rfa_ratio = 0, own_ratio = 0, small_ratio = 0;  // ours/split, rfa/ours, ours/own, ours/small
  long long base_wrong = -1;  // bytes the baselines received wrong (-1: not checked)
  // --rope (run_rope()): us = (a) plain seq->head; the other two from the same alternating run:
  double rope_us = 0;       // (b) seq->head with RoPE fused on pack of q and k (RowTransforms)
  double separate_us = 0;   // (c) a separate RoPE pass over q and k (row by row, into a copy) + plain seq->head
  long long rope_diff = -1; // -c 1: output elements where (b) and (c) differ (bitwise; -1: not checked)
  // --wire (run_wire()): us = every tensor on its element wire (the baseline); from the same alternating run:
  double wire_us = 0;       // q and k on the wire W (with_wire), v on its element wire
  long long wire_wrong = -1;  // -c 1: output elements of the wire call that differ from the reference quantizer (bitwise)
  // the wire bytes of seq->head (Plan::stage_lists(seq_to_head).send_total, summed over ranks and stages):
  double qk_bytes = 0, qk_wire_bytes = 0;     // q and k alone: on their element wire, on W
  double qkv_bytes = 0, qkv_wire_bytes = 0;   // q, k, v: all on their element wire (the baseline's), q and k on W
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

// ---- the one definition of time(us), every backend and op ----------------------------------
/// One call of fn() timed on every rank after a barrier: the slowest rank's microseconds
/// (max-reduced). Collective.
template <class Comm, class F>
double slowest_us(Comm& comm, F&& fn) {
  barrier(comm);
  const double t0 = seconds_now(comm);
  fn();
  return max_over_ranks(comm, (seconds_now(comm) - t0) * 1e6);
}

/// The median of v (not empty).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// The medians of several calls timed alternately: `warmup` untimed rounds, then `iters` rounds,
/// each round every call once, round i from call i mod n on (calls[i]() runs one and returns its time, the slowest
/// rank's); the medians over the rounds, by call, so that ratios between them come from the same
/// run. --reps R: R such runs, the one with the least median of calls[0] (and the others' of the
/// same run). Collective.
std::vector<double> alternate_all(const Options& o, const std::vector<std::function<double()>>& calls) {
  for (int i = 0; i < o.warmup; ++i)
    for (const auto& c : calls) c();
  std::vector<double> best;
  for (int k = 0; k < o.reps; ++k) {
    std::vector<std::vector<double>> t(calls.size());
    for (int i = 0; i < o.iters; ++i)  // round i starts at call i mod n: each call follows each other alike (no call
      for (std::size_t j = 0; j < calls.size(); ++j) {  // always finds its buffers warm from the one before it)
        const std::size_t c = (static_cast<std::size_t>(i) + j) % calls.size();
        t[c].push_back(calls[c]());
      }
    std::vector<double> m;
    for (const auto& v : t) m.push_back(median(v));
    if (k == 0 || m[0] < best[0]) best = m;
  }
  return best;
}

/// time(us) and bare(us) of a row: alternate_all() of the library call (one(false)) and, with
/// `bare`, the bare transport of the same bytes (one(true)), each call's time the slowest rank's;
/// {median(ours), median(bare)} (bare 0 without `bare`), so that ratio = median(ours) /
/// median(bare) comes from the same run. Collective.
template <class One>
std::pair<double, double> alternate_us(const Options& o, bool bare, One&& one) {
  std::vector<std::function<double()>> calls{[&] { return one(false); }};
  if (bare) calls.push_back([&] { return one(true); });
  const std::vector<double> m = alternate_all(o, calls);
  return {m[0], bare ? m[1] : 0};
}

/// The definition, as the table's header and --help print it.
const char* kTimeDefinition =
    "iterations alternate the library call and the bare transport of the same bytes; each time is the median over "
    "iterations of the slowest rank's time (max-reduced per iteration); ratio = median(ours)/median(bare), same run";

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

/// What ran, for the table's header and the JSON: the communicator, how seq->head moves its
/// bytes (push, pull or messages), and whether copying the inputs into a window is timed.
struct Setup {
  std::string comm;         // LocalGroup::Comm, MpiComm, MpiWindowComm, ...
  std::string transfer;     // seq->head: "push" (into the peers' outputs), "pull" (out of the peers' inputs), "messages"
  bool window = false;      // inputs staged in a shared window
  std::string device;       // the device backends: the GPU ("" for the host ones)
};

/// How the host backends (local, mpi) run an exchange: redistribute() with a HostExecutor (or
/// SkipCopies) on the host buffers of the Exchange; the bare all-to-all-v of the same bytes on the
/// same communicator; one_us() times one call of either (slowest_us()).
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
  void load_bare(std::size_t bytes) { bare_ = std::make_unique<Bare>(comm_.size(), bytes); }  // the same bytes, contiguous
  void once() { redistribute(x_->plan, x_->dir, comm_, exec_, in_, out_, x_->ws, tx_); }
  void fetch() {}  // the outputs are the Exchange's
  void transforms(const RowTransforms* tx) { tx_ = tx; }  ///< --rope: the row transforms once() passes (null: none)
  std::byte* input(int t) { return x_->in[static_cast<std::size_t>(t)].data(); }  ///< where once() reads input t
  double one_us(bool bare) {
    return bare ? slowest_us(comm_, [&] { bare_->run(comm_); }) : slowest_us(comm_, [&] { once(); });
  }
  void unload() noexcept { bare_.reset(); }

 private:
  Comm& comm_;
  Exec exec_;
  Exchange* x_ = nullptr;
  TensorList<ConstByteSpan> in_;
  TensorList<ByteSpan> out_;
  std::unique_ptr<Bare> bare_;
  const RowTransforms* tx_ = nullptr;
};

#if ULYSSES_PERF_MPI
/// How --backend mpi runs an exchange on one node (the default there; --mpi-window 0: HostRunner
/// on the MpiComm): the inputs copied into an MpiWindow in load(), untimed (one registration a
/// tensor, of the largest size over ranks, so every rank registers alike), redistribute() over
/// MpiWindowComm (Path::direct unless --path forces another). With `outputs` (--window-outputs 1)
/// the outputs are in the window too, so seq->head pushes; else it pulls. fetch() copies the
/// outputs back for the oracle. Bare: the all-to-all-v on the MpiComm. Collective load().
class WindowRunner {
 public:
  WindowRunner(MpiComm& comm, bool outputs) : comm_(comm), outputs_(outputs) {}
  MpiComm& group() { return comm_; }  ///< the host collectives
  std::string path(const Plan& plan) const { return to_string(choose_path<MpiWindowComm, HostExecutor>(plan)); }
  void load(Exchange& x);
  void load_bare(std::size_t bytes) { bare_ = std::make_unique<Bare>(comm_.size(), bytes); }
  void once() { redistribute(x_->plan, x_->dir, *wc_, exec_, in_, out_, x_->ws, tx_); }
  void transforms(const RowTransforms* tx) { tx_ = tx; }  ///< --rope: the row transforms once() passes (null: none)
  /// Where once() reads input t: its copy in the window (what a separate RoPE pass writes).
  std::byte* input(int t) { return static_cast<std::byte*>(const_cast<void*>(in_.data[static_cast<std::size_t>(t)].data)); }
  void fetch() {  // the outputs back into the Exchange's for the oracle
    if (outputs_)
      for (std::size_t t = 0; t < x_->out.size(); ++t) std::memcpy(x_->out[t].data(), out_.data[t].data, x_->out[t].size());
  }
  double one_us(bool bare) {
    return bare ? slowest_us(comm_, [&] { bare_->run(comm_); }) : slowest_us(comm_, [&] { once(); });
  }
  void unload() noexcept { bare_.reset(); }

 private:
  MpiComm& comm_;
  bool outputs_;
  HostExecutor exec_;
  std::unique_ptr<MpiWindow> win_;
  std::unique_ptr<MpiWindowComm> wc_;
  Exchange* x_ = nullptr;
  TensorList<ConstByteSpan> in_;
  TensorList<ByteSpan> out_;
  std::unique_ptr<Bare> bare_;
  const RowTransforms* tx_ = nullptr;
};

void WindowRunner::load(Exchange& x) {
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
/// How the device backends (nccl, cuda-local, cuda-ipc) run an exchange: perf_device::Rank (the
/// host inputs copied to device buffers, redistribute() with a CudaExecutor on the rank's stream,
/// the outputs copied back for the oracle); one_us(): one call timed with CUDA events on that
/// stream after a stream sync and a barrier, the slowest rank's; the bare all-to-all-v of the same
/// bytes on the same communicator.
class DeviceRunner {
 public:
  explicit DeviceRunner(perf_device::Rank& dev) : dev_(dev) {}
  perf_device::Rank& group() { return dev_; }
  std::string path(const Plan& plan) const { return dev_.path(plan); }
  void load(Exchange& x) {
    x_ = &x;
    dev_.load(x.plan, x.dir, x.ins());
  }
  void load_bare(std::size_t bytes) { dev_.load_bare(bytes); }
  void once() { dev_.run(perf_device::Op::exchange, 1); }
  void fetch() { dev_.fetch(x_->outs()); }
  double one_us(bool bare) {
    dev_.sync();
    barrier(dev_);
    return max_over_ranks(dev_, dev_.time_us(bare ? perf_device::Op::bare : perf_device::Op::exchange, 1));
  }
  void unload() noexcept { dev_.unload(); }

 private:
  perf_device::Rank& dev_;
  Exchange* x_ = nullptr;
};
#endif

/// The plan and buffers of one step at S, or none (nullptr) when --max-rank-bytes skips it (the
/// same verdict on every rank: the largest input over ranks). With -c 1 the inputs hold the
/// oracle's values; every page is written unless --copies 0 (touch_buffers()). Collective.
template <class Comm>
std::unique_ptr<Exchange> make_exchange(Comm& comm, const Options& o, const AttentionSpecs& a, const Step& step, std::int64_t S,
                                        bool transformed = false, Wire wire = Wire::element) {
  const int P = comm.size(), r = comm.rank();
  PlanOptions po;
  po.path = o.path;
  if (o.ranks_per_node > 0) po.nodes = NodeLayout::uniform(P, o.ranks_per_node);
  po.lanes = o.lanes;
  const SeqPartition seq = SeqPartition::balanced(S, P);
  auto specs = step.qkv ? a.qkv() : a.out();
  if (transformed)  // --rope (b): q and k planned row by row, so that a call's RowTransforms rotate them
    for (std::size_t t = 0; t < 2 && t < specs.size(); ++t) specs[t].with_row_transforms();
  if (wire != Wire::element)  // --wire: q and k travel on the wire (v too with --wire-tensors qkv)
    for (std::size_t t = 0; t < static_cast<std::size_t>(o.wire_tensors) && t < specs.size(); ++t) specs[t].with_wire(wire);
  auto x = std::make_unique<Exchange>(Exchange{Plan({P, r}, o.batch, seq, specs, o.layout, po), step.dir, {}, {}, {}, 0});
  double in = 0;
  for (int t = 0; t < x->plan.num_tensors(); ++t) in += static_cast<double>(x->plan.input_bytes(x->dir, t));
  if (o.max_rank_bytes > 0 && max_over_ranks(comm, in) > o.max_rank_bytes) {
    if (r == 0) std::fprintf(stderr, "# S=%lld skipped: %.0f bytes a rank > --max-rank-bytes\n", static_cast<long long>(S), in);
    return nullptr;
  }
  for (int t = 0; t < x->plan.num_tensors(); ++t) {
    x->in.emplace_back(x->plan.input_bytes(x->dir, t));
    x->out.emplace_back(x->plan.output_bytes(x->dir, t));
    x->in_bytes += x->plan.input_bytes(x->dir, t);
  }
  x->ws.resize(x->plan.workspace_bytes());
  if (o.check || o.copies) {  // every page written before timing (see touch_buffers())
    touch_buffers(*x, o.check ? std::byte{0} : std::byte{0x5a});
    if (o.check) fill_inputs(*x, seq, r);
  }
  return x;
}

/// The row's times (alternate_us()): the exchange against the bare all-to-all-v of its bytes, or
/// with --call-numbers both the exchange numbered (time) against not numbered (bare). Collective.
template <class Runner>
void time_row(Runner& runner, const Options& o, Row& row) {
  if (o.call_numbers == 2) {
    std::tie(row.us, row.bare_us) = alternate_us(o, true, [&](bool plain) {
      set_call_numbering(!plain);
      return runner.one_us(false);
    });
    set_call_numbering(true);
    return;
  }
  if (o.bare) runner.load_bare(static_cast<std::size_t>(row.bytes));
  std::tie(row.us, row.bare_us) = alternate_us(o, o.bare, [&](bool bare) { return runner.one_us(bare); });
}

/// The next size of the sweep after S (-f or -i), or 0 at the end (one size when neither grows;
/// it stops before an overflow).
std::int64_t next_size(std::int64_t S, const Options& o) {
  if (o.increment > 0) return S > o.end - o.increment ? 0 : S + o.increment;
  return o.factor == 1 || S > o.end / o.factor ? 0 : S * o.factor;
}

/// --op seq_to_head / head_to_seq on one rank of `runner`'s group (HostRunner, WindowRunner or
/// DeviceRunner): per S, per step(), the plan, with -c 1 one checked run against the oracle, then
/// the timed ones. Collective. @returns the rows (every rank's same ones).
template <class Runner>
std::vector<Row> run(Runner& runner, const Options& o) {
  auto& comm = runner.group();
  const int P = comm.size(), r = comm.rank();
  std::vector<Row> rows;
  const HeadPolicy policy = o.balanced ? HeadPolicy::balanced : HeadPolicy::even;
  const AttentionSpecs a = with_storage(o.type, [&](auto x) { return attention_specs<decltype(x)>(P, o.shape, o.type, policy); });
  for (std::int64_t S = o.begin; S > 0; S = next_size(S, o)) {
    for (const Step& step : steps(o)) {
      const std::unique_ptr<Exchange> x = make_exchange(comm, o, a, step, S);
      if (!x) continue;
      runner.load(*x);
      struct Unload {
        Runner& r;
        ~Unload() { r.unload(); }
      } unload{runner};  // before x (whose plan a device executor holds) goes
      Row row;
      row.S = S;
      row.direction = step.name;
      row.path = runner.path(x->plan);
      row.bytes = max_over_ranks(comm, static_cast<double>(x->in_bytes));
      if (o.check) {
        runner.once();
        runner.fetch();
        row.wrong = sum_over_ranks(comm, count_wrong(*x, SeqPartition::balanced(S, P), r));
      }
      time_row(runner, o, row);
      rows.push_back(row);
    }
  }
  return rows;
}

// ---- --rope: RoPE fused into seq->head against a separate pass (layout/rope.hpp) -------------
/// (c)'s separate RoPE pass: rows of q and k (tensors 0 and 1) of this rank's seq-sharded inputs
/// read from `x`'s inputs, each loaded into double, rotated by `rope` at its global token and
/// stored rounded once (the library's detail::load_row / store_row: the fused pack's arithmetic)
/// into the inputs `runner` reads (the window's copy under MpiWindowComm). A plain loop, one row
/// at a time, as a user without the fused transform would write it.
template <class Runner>
void rope_pass(const Exchange& x, Runner& runner, const Rope& rope, const SeqPartition& seq, int r) {
  double row[detail::kMaxTransformedRow];
  for (int t = 0; t < 2; ++t) {
    const TensorSpec& spec = x.plan.tensor(t);
    const std::size_t e = size_of(spec.type);
    const std::byte* src = x.in[static_cast<std::size_t>(t)].data();
    std::byte* dst = runner.input(t);
    for_each_row(x.plan, t, true, seq, r, [&](std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t off, std::int64_t) {
      detail::load_row(spec.type, src + static_cast<std::size_t>(off) * e, row, spec.head_dim);
      rope(RowCoord{b, s, h}, row, spec.head_dim);
      detail::store_row(spec.type, dst + static_cast<std::size_t>(off) * e, row, spec.head_dim);
    });
  }
}

/// Output elements (all tensors) where exchanges x and y differ bitwise.
long long count_differ(const Exchange& x, const Exchange& y) {
  long long n = 0;
  for (int t = 0; t < x.plan.num_tensors(); ++t) {
    const std::size_t e = size_of(x.plan.tensor(t).type), bytes = x.out[static_cast<std::size_t>(t)].size();
    for (std::size_t i = 0; i < bytes; i += e)
      n += std::memcmp(x.out[static_cast<std::size_t>(t)].data() + i, y.out[static_cast<std::size_t>(t)].data() + i, e) != 0;
  }
  return n;
}

/// --rope on one rank of the runners' group (make(): a new HostRunner or WindowRunner, each with
/// its own buffers and window): per S, three seq->head exchanges of q, k, v timed in one
/// alternating run (alternate_all(): the median over iterations of the slowest rank's time, each):
/// (a) plain, the tensors planned without row transforms; (b) RoPE (Rope(D, S, --rope-theta),
/// half rotation) fused on pack of q and k (planned with_row_transforms(), RowTransforms::on_pack);
/// (c) rope_pass() over q and k into a copy, then (a)'s plain exchange of the copy. -c 1: (a)
/// against the oracle (#wrong), and (b) against (c) bit for bit (rope_diff). Collective.
template <class Make>
std::vector<Row> run_rope(const Options& o, Make&& make) {
  auto ra = make(), rb = make(), rc = make();
  auto& comm = ra->group();
  const int P = comm.size(), r = comm.rank();
  std::vector<Row> rows;
  const HeadPolicy policy = o.balanced ? HeadPolicy::balanced : HeadPolicy::even;
  const AttentionSpecs a = with_storage(o.type, [&](auto x) { return attention_specs<decltype(x)>(P, o.shape, o.type, policy); });
  const Step step{true, Direction::seq_to_head, "seq_to_head"};
  for (std::int64_t S = o.begin; S > 0; S = next_size(S, o)) {
    const std::unique_ptr<Exchange> xa = make_exchange(comm, o, a, step, S);
    if (!xa) continue;
    const std::unique_ptr<Exchange> xb = make_exchange(comm, o, a, step, S, true), xc = make_exchange(comm, o, a, step, S);
    const Rope rope(o.shape.head_dim, S, o.rope_theta, 0, RopeStyle::half);
    RowTransforms tx;
    tx.on_pack(0, rope).on_pack(1, rope);
    ra->load(*xa), rb->load(*xb), rc->load(*xc);
    rb->transforms(&tx);
    struct Unload {
      decltype(ra)& a;
      decltype(ra)& b;
      decltype(ra)& c;
      ~Unload() { a->unload(), b->unload(), c->unload(); }
    } unload{ra, rb, rc};
    const SeqPartition seq = SeqPartition::balanced(S, P);
    Row row;
    row.S = S;
    row.direction = "seq_to_head";
    row.path = ra->path(xa->plan) + "/" + rb->path(xb->plan);
    row.bytes = max_over_ranks(comm, static_cast<double>(xa->in_bytes));
    if (o.check) {
      ra->once(), ra->fetch();
      rb->once(), rb->fetch();
      rope_pass(*xa, *rc, rope, seq, r);
      rc->once(), rc->fetch();
      row.wrong = sum_over_ranks(comm, count_wrong(*xa, seq, r));
      row.rope_diff = sum_over_ranks(comm, count_differ(*xb, *xc));
      if (sum_over_ranks(comm, count_differ(*xa, *xb)) == 0 && S > 1) {  // RoPE rotated nothing: the check would prove nothing
        if (r == 0) std::fprintf(stderr, "ulysses_perf --rope: the fused RoPE changed no element at S=%lld\n", static_cast<long long>(S));
        row.rope_diff = std::max(row.rope_diff, 1LL);
      }
    }
    const std::vector<double> m = alternate_all(o, {[&] { return ra->one_us(false); }, [&] { return rb->one_us(false); },
                                                    [&] { return slowest_us(comm, [&] { rope_pass(*xa, *rc, rope, seq, r), rc->once(); }); }});
    row.us = m[0], row.rope_us = m[1], row.separate_us = m[2];
    rows.push_back(row);
  }
  return rows;
}

// ---- --wire: q and k on an fp8 (or cast) wire against every tensor on its element wire --------
/// --wire's reference of one head row of D elements of `type` at p into `want`: the elements
/// converted to float (exact for the oracle's values), then on an fp8 wire row_amax(),
/// fp8_scale_of(), quantize_fp8() and dequantize_fp8() (layout/fp8.hpp), on a cast wire each
/// element rounded to the wire's type and widened back; then each rounded back to the type.
void wire_reference_row(ElementType type, Wire wire, const std::byte* p, std::byte* want, std::int64_t D) {
  double row[detail::kMaxTransformedRow];
  float x[detail::kMaxTransformedRow], y[detail::kMaxTransformedRow];
  std::uint8_t q[detail::kMaxTransformedRow];
  detail::load_row(type, p, row, D);
  for (std::int64_t d = 0; d < D; ++d) x[d] = static_cast<float>(row[d]);
  if (wire == Wire::fp8_e4m3 || wire == Wire::fp8_e5m2) {
    const Fp8Format f = wire == Wire::fp8_e4m3 ? Fp8Format::e4m3 : Fp8Format::e5m2;
    const float scale = fp8_scale_of(row_amax(x, D), f);
    quantize_fp8(x, D, scale, f, q);
    dequantize_fp8(q, D, scale, f, y);
  } else {
    for (std::int64_t d = 0; d < D; ++d)
      y[d] = wire == Wire::bfloat16 ? detail::bfloat16_to_float(detail::float_to_bfloat16(x[d]))
             : wire == Wire::float16 ? detail::half_to_float(detail::float_to_half(x[d]))
                                     : x[d];
  }
  for (std::int64_t d = 0; d < D; ++d) row[d] = static_cast<double>(y[d]);
  detail::store_row(type, want, row, D);
}

/// Output elements of seq->head exchange `x` (its first `wired` tensors planned on `wire`, the
/// others on their element wire) that differ bitwise from the reference: the oracle's input row
/// through wire_reference_row() for tensors t < wired, the oracle's value for the others.
long long count_wire_wrong(const Exchange& x, const SeqPartition& seq, int r, Wire wire, int wired) {
  long long wrong = 0;
  std::byte in[8 * detail::kMaxTransformedRow], want[8 * detail::kMaxTransformedRow];
  for (int t = 0; t < x.plan.num_tensors(); ++t) {
    const TensorSpec& spec = x.plan.tensor(t);
    const std::size_t e = size_of(spec.type);
    const std::byte* base = x.out[static_cast<std::size_t>(t)].data();
    for_each_row(x.plan, t, false, seq, r, [&](std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t off, std::int64_t sd) {
      for (std::int64_t d = 0; d < spec.head_dim; ++d) {
        const double v = value(spec.type, t, b, s, h, d, -1);
        store_sum(spec.type, &v, 1, in + static_cast<std::size_t>(d) * e);
      }
      if (t < wired) wire_reference_row(spec.type, wire, in, want, spec.head_dim);
      else std::memcpy(want, in, static_cast<std::size_t>(spec.head_dim) * e);
      for (std::int64_t d = 0; d < spec.head_dim; ++d)
        wrong += std::memcmp(want + static_cast<std::size_t>(d) * e, base + static_cast<std::size_t>(off + d * sd) * e, e) != 0;
    });
  }
  return wrong;
}

/// The wire bytes of seq->head of `specs` (Plan::exchanged_bytes: its stages' send_total, this
/// rank's own chunk excluded), summed over the ranks of `comm`. Collective.
template <class Comm>
double wire_bytes(Comm& comm, const Options& o, const std::vector<TensorSpec>& specs, std::int64_t S) {
  const int P = comm.size(), r = comm.rank();
  const Plan plan({P, r}, o.batch, SeqPartition::balanced(S, P), specs, o.layout);
  return sum_over_ranks(comm, static_cast<double>(plan.exchanged_bytes(Direction::seq_to_head)));
}

/// --wire W on one rank of the runners' group (make(): a new HostRunner or WindowRunner): per S,
/// two seq->head exchanges of q, k, v timed in one alternating run (alternate_all()): (a) every
/// tensor on its element wire (the baseline), (b) q and k on wire W (TensorSpec::with_wire), v on
/// its element wire (on W too with --wire-tensors qkv). The wire bytes of both (q, k alone and
/// q, k, v) from the plans. -c 1: (a) against the oracle (#wrong), (b) against the reference
/// quantizer (count_wire_wrong()) bit for bit; an fp8 wire that changed no element is a failure
/// too (the check would prove nothing). Collective.
template <class Make>
std::vector<Row> run_wire(const Options& o, Make&& make) {
  auto ra = make(), rb = make();
  auto& comm = ra->group();
  const int P = comm.size(), r = comm.rank();
  std::vector<Row> rows;
  const HeadPolicy policy = o.balanced ? HeadPolicy::balanced : HeadPolicy::even;
  const AttentionSpecs a = with_storage(o.type, [&](auto x) { return attention_specs<decltype(x)>(P, o.shape, o.type, policy); });
  const Step step{true, Direction::seq_to_head, "seq_to_head"};
  const bool fp8 = o.wire == Wire::fp8_e4m3 || o.wire == Wire::fp8_e5m2;
  for (std::int64_t S = o.begin; S > 0; S = next_size(S, o)) {
    const std::unique_ptr<Exchange> xa = make_exchange(comm, o, a, step, S);
    if (!xa) continue;
    const std::unique_ptr<Exchange> xb = make_exchange(comm, o, a, step, S, false, o.wire);
    ra->load(*xa), rb->load(*xb);
    struct Unload {
      decltype(ra)& a;
      decltype(ra)& b;
      ~Unload() { a->unload(), b->unload(); }
    } unload{ra, rb};
    const SeqPartition seq = SeqPartition::balanced(S, P);
    Row row;
    row.S = S;
    row.direction = "seq_to_head";
    row.path = ra->path(xa->plan) + "/" + rb->path(xb->plan);
    row.bytes = max_over_ranks(comm, static_cast<double>(xa->in_bytes));
    std::vector<TensorSpec> base = a.qkv(), wired = base;
    for (int t = 0; t < o.wire_tensors; ++t) wired[static_cast<std::size_t>(t)].with_wire(o.wire);
    row.qkv_bytes = wire_bytes(comm, o, base, S), row.qkv_wire_bytes = wire_bytes(comm, o, wired, S);
    row.qk_bytes = wire_bytes(comm, o, {base[0], base[1]}, S), row.qk_wire_bytes = wire_bytes(comm, o, {wired[0], wired[1]}, S);
    if (o.check) {
      ra->once(), ra->fetch();
      rb->once(), rb->fetch();
      row.wrong = sum_over_ranks(comm, count_wrong(*xa, seq, r));
      row.wire_wrong = sum_over_ranks(comm, count_wire_wrong(*xb, seq, r, o.wire, o.wire_tensors));
      if (fp8 && sum_over_ranks(comm, count_differ(*xa, *xb)) == 0) {  // the fp8 wire rounded nothing: the check would prove nothing
        if (r == 0) std::fprintf(stderr, "ulysses_perf --wire: the fp8 wire changed no element at S=%lld\n", static_cast<long long>(S));
        row.wire_wrong = std::max(row.wire_wrong, 1LL);
      }
    }
    const std::vector<double> m = alternate_all(o, {[&] { return ra->one_us(false); }, [&] { return rb->one_us(false); }});
    row.us = m[0], row.wire_us = m[1];
    rows.push_back(row);
  }
  return rows;
}

/// --op ring's row at S: with -c 1 one checked rotation and one checked rotation of each
/// baseline; then, per baseline (perf_ops::RingBaseline: sendrecv, the split of each k in
/// kRingSplits, rfa, rfa_fresh, and where they apply sendrecv_own and sendrecv_small), one
/// alternate_all() of the rotation (op.run()) against that baseline alone, so that each ratio
/// comes from the two calls' own alternating run (and no baseline's memory traffic sits between
/// them); time(us) is the rotation's median of its run against sendrecv. Without --bare, the
/// rotation alone. Every call timed by slowest_us() on `group` (the communicator whose clock and
/// collectives time it: the ring's own, or under MpiWindowComm the MpiComm it wraps). Collective.
template <class Group, class Op>
Row ring_row(Group& group, const Options& o, std::int64_t S, Op& op, const char* path, bool own = false) {
  using perf_ops::RingBaseline;
  Row row;
  row.S = S;
  row.direction = "ring";
  row.path = path;
  row.bytes = max_over_ranks(group, static_cast<double>(op.input_bytes()));
  if (o.check) {
    op.fill();
    row.wrong = sum_over_ranks(group, op.wrong());
    if (o.bare) row.base_wrong = sum_over_ranks(group, op.baselines_wrong());
  }
  auto ours = [&] { return slowest_us(group, [&] { op.run(); }); };
  if (!o.bare) {
    row.us = alternate_all(o, {ours})[0];
    return row;
  }
  auto pair = [&](RingBaseline b, int k) {  // {ours, theirs} of one alternating run
    const std::vector<double> m = alternate_all(o, {ours, [&] { return slowest_us(group, [&] { op.baseline(b, k); }); }});
    return std::pair<double, double>{m[0], m[1]};
  };
  std::tie(row.us, row.bare_us) = pair(RingBaseline::sendrecv, 1);
  for (int k : perf_ops::kRingSplits) {
    const auto [us, theirs] = pair(RingBaseline::split, k);
    if (row.split_k == 0 || theirs < row.split_us) row.split_us = theirs, row.split_k = k, row.split_ratio = us / theirs;
  }
  double us = 0;
  std::tie(us, row.rfa_us) = pair(RingBaseline::rfa, 1);
  row.rfa_ratio = row.rfa_us / us;
  std::tie(us, row.rfa_fresh_us) = pair(RingBaseline::rfa_fresh, 1);
  if (own) std::tie(us, row.own_us) = pair(RingBaseline::sendrecv_own, 1), row.own_ratio = us / row.own_us;
  if (o.backend != "local") std::tie(us, row.small_us) = pair(RingBaseline::sendrecv_small, 1), row.small_ratio = us / row.small_us;
  return row;
}

/// --op decode (B = the sizes of the sweep) or --op ring (S = the sizes) on one rank of `comm`:
/// per size the op (perf_ops.hpp), with -c 1 one checked call, then the call against the bare
/// transport of its bytes (alternate_us(); the ring against all its baselines, ring_row()).
/// Collective. @returns the rows.
template <class Comm>
std::vector<Row> run_op(Comm& comm, const Options& o) {
  std::vector<Row> rows;
  const HeadPolicy policy = o.balanced ? HeadPolicy::balanced : HeadPolicy::even;
  for (std::int64_t n = o.begin; n > 0; n = next_size(n, o)) {
    if (o.op == "ring") {
      perf_ops::RingOp<Comm> op(comm, n, o.ring_u, o.shape, o.type, o.batch, o.ring_messages, nullptr, nullptr, o.ring_access);
      rows.push_back(ring_row(comm, o, n, op, o.ring_access == RingAccess::zero_copy ? "zero_copy" : "ring"));
      continue;
    }
    perf_ops::DecodeOp op(comm.size(), comm.rank(), n, o.shape.num_heads, o.shape.v_head_dim, o.type, policy);
    Row row;
    row.S = n;
    row.direction = o.op;
    row.path = "decode";
    row.bytes = max_over_ranks(comm, static_cast<double>(op.input_bytes()));
    if (o.check) {
      op.fill();
      op.run(comm);
      row.wrong = sum_over_ranks(comm, op.wrong());
    }
    std::tie(row.us, row.bare_us) = alternate_us(o, o.bare, [&](bool bare) {
      return bare ? slowest_us(comm, [&] { op.bare(comm); }) : slowest_us(comm, [&] { op.run(comm); });
    });
    rows.push_back(row);
  }
  return rows;
}

#if ULYSSES_PERF_MPI
/// --backend window --op ring: per S, an MpiWindow over `comm` holding the rotation's two buffers
/// (each the largest block, allocated alike on every rank), the rotation over MpiWindowComm, so
/// that each step reads ring rank r − 1's block in place from its window slot (one copy, no MPI
/// message); the baselines over `comm` (MPI_Sendrecv etc. between private buffers), timed on
/// `comm` (ring_row()). The window is freed before the next size's. Collective. @returns the rows.
std::vector<Row> run_ring_window(MpiComm& comm, const Options& o) {
  std::vector<Row> rows;
  for (std::int64_t n = o.begin; n > 0; n = next_size(n, o)) {
    using Op = perf_ops::RingOp<MpiWindowComm>;
    const std::size_t big = Op::largest(Op::blocks(comm.size(), n, o.ring_u, o.shape, o.type, o.batch));
    const std::size_t slot = (big + MpiWindow::kAlignment - 1) / MpiWindow::kAlignment * MpiWindow::kAlignment;
    MpiWindow win(comm, 2 * slot);
    MpiWindowComm wc(comm, win);
    const WindowSpan a = win.allocate(big), b = win.allocate(big);
    Op op(wc, n, o.ring_u, o.shape, o.type, o.batch, o.ring_messages, a.data(), b.data(), o.ring_access);
    rows.push_back(ring_row(comm, o, n, op, o.ring_access == RingAccess::zero_copy ? "zero_copy" : "in_place", true));
  }
  return rows;
}
#endif

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

/// What the bare column measures on `backend` for `op`, for the table's header.
std::string bare_of(const std::string& backend, const std::string& op) {
  if (op == "ring")
    return backend == "mpi"      ? "R-1 MPI_Sendrecv of the same blocks to rank r+1 from r-1, same communicator"
           : backend == "window" ? "R-1 MPI_Sendrecv of the same blocks to rank r+1 from r-1 over the MpiComm the MpiWindowComm wraps, private buffers"
                                 : "R-1 exchange_messages() of one message each way, the same blocks, same communicator, on the rank's own thread";
  const std::string what = op == "decode" ? "the all-to-all-v of O_r's and LSE_r's bytes" : "the all-to-all-v of the same bytes";
  if (backend == "nccl") return what + ": NcclComm's (grouped ncclSend/ncclRecv, as nccl-tests' alltoall_perf), device buffers, same stream";
  if (backend == "cuda-ipc") return "one cudaMemcpyAsync of the same bytes on each rank's stream (no exchange: the copy floor)";
  if (backend == "cuda-local") return what + ": DeviceLocalGroup's (one cudaMemcpyAsync a chunk), device buffers, same streams";
  return what + " between contiguous buffers on the same communicator";
}

/// The header's line on what ran: the communicator, push or pull, the window copy (untimed).
void print_setup(const Options& o, const Setup& setup) {
  if (o.op == "ring" && setup.window) {
    std::printf("# communicator: %s; the rotation's two buffers allocated from an MpiWindow: %s; the baselines over the MpiComm it wraps, "
                "private buffers\n", setup.comm.c_str(),
                o.ring_access == RingAccess::zero_copy
                    ? "RingAccess::zero_copy, step s's block is ring rank r-s's own buffer 0 in its window slot, read in place (no copy, no "
                      "MPI message; a rotation is two synchronisations: start(0) publishes the blocks, finish(R-1) waits for every reader)"
                    : "each step reads ring rank r-1's block in place from its window slot (one copy, no MPI message)");
    return;
  }
  if (o.op == "decode" || o.op == "ring") {
    std::printf("# communicator: %s; no window (the inputs stay in private memory)\n", setup.comm.c_str());
    return;
  }
  const char* how = setup.transfer == "push"       ? "pushes (outputs in the window: each rank writes into its peers' outputs)"
                    : setup.transfer == "pull"     ? "pulls (outputs in private memory: each rank reads its heads out of its peers' inputs)"
                    : setup.transfer == "messages" ? "moves messages (neither push nor pull)"
                                                   : "as the path column says";
  std::printf("# communicator: %s; seq->head %s; copying the inputs into the window: %s\n", setup.comm.c_str(), how,
              setup.window ? "not timed (once per size, before the iterations)" : "none (no window)");
}

/// Whether the table has --op ring's baseline columns (split, rfa, rfa-new: with the bare ones).
bool ring_columns(const Options& o) { return o.op == "ring" && o.bare; }

/// The header of the table: the shape, the run, what ran (`setup`), and the columns' definitions.
void print_header(const Options& o, int P, const Setup& setup) {
  std::printf("# ulysses_perf --op %s: %s (H=%lld Hkv=%lld D=%lld Dv=%lld), %s, %s, B=%lld, P=%d, backend %s, %d iters after %d warm-up%s%s\n",
              o.op.c_str(), o.model.c_str(), static_cast<long long>(o.shape.num_heads), static_cast<long long>(o.shape.num_kv_heads),
              static_cast<long long>(o.shape.head_dim), static_cast<long long>(o.shape.v_head_dim), to_string(o.type), to_string(o.layout),
              static_cast<long long>(o.batch), P, o.backend.c_str(), o.iters, o.warmup,
              o.reps > 1 ? (", the least median of " + std::to_string(o.reps) + " runs").c_str() : "", o.check ? ", checked bit for bit" : "");
  print_setup(o, setup);
  if (o.call_numbers == 0) std::printf("# library calls not numbered (--call-numbers 0)\n");
  if (o.call_numbers == 2) std::printf("# --call-numbers both: time = each call numbered, bare = the same call not numbered; ratio = their ratio\n");
  if (o.ranks_per_node > 0)
    std::printf("# simulated nodes of %d ranks %s, lanes %d (the two-level exchange where the path column says two_level)\n",
                o.ranks_per_node, NodeLayout::uniform(P, o.ranks_per_node).str().c_str(), o.lanes);
  if (!setup.device.empty()) std::printf("# device: %s, buffers in device memory, CUDA events, the oracle's check on the host\n", setup.device.c_str());
  if (o.op == "decode") std::printf("# decode: S = the batch B (T=1 token each); bytes: a rank's O_r and LSE_r\n");
  else if (o.op == "ring") {
    std::printf("# ring: R=P, U=%d, zigzag, --ring-messages %d (pieces a block on a message transport), --ring-access %s; bytes: the R-1 k|v "
                "blocks a rank sends in a rotation; #wrong counts bytes\n", o.ring_u, o.ring_messages,
                o.ring_access == RingAccess::zero_copy ? "zero_copy (no block moves: each step's block is read where its owner wrote it)" : "copy");
    if (o.bare)
      std::printf("# baselines, each timed against the rotation in an alternating run of the two (every ratio from its own pair's run; "
                  "time(us) from the run against sendrecv), %s, k|v block = k then v (D/(D+Dv) of it k): split(us): plain MPI's k-message "
                  "pattern a step (MPI_Irecv x k, MPI_Isend x k, MPI_Waitall), the fastest k of 1,2,4,8, /split = ours/split(us); rfa(us): "
                  "ring-flash-attention's send_recv_kv (k and v two messages each way a step, isend k, irecv k, isend v, irecv v, wait), two "
                  "pairs of receive buffers reused, rfa/ours = rfa(us)/ours; rfa-new(us): the same with fresh malloc'd receive buffers every "
                  "step (as written)%s\n",
                  o.backend == "local" ? "in process each an exchange_messages() on the rank's own thread (k pieces; k and v)" : "plain MPI on the same MPI communicator",
                  o.check ? "; -c 1 checks every baseline's bytes too" : "");
    if (o.bare && o.backend != "local")
      std::printf("# sr-4k(us): MPI_Sendrecv between private buffers of small pages (std::vector, no madvise), /sr4k = ours/sr-4k(us): "
                  "what the page size costs this MPI's copy (the other baselines: huge-page buffers)\n");
    if (o.bare && o.backend == "window")
      std::printf("# the baselines run between huge-page private buffers (bench/host_buffer.hpp), where this MPI's single copy is "
                  "fastest; sr-win(us): MPI_Sendrecv between the rotation's own buffers in the window (the same memory the rotation "
                  "reads), /srwin = ours/sr-win(us)\n");
  }
  else std::printf("# bytes: a rank's input tensors (own chunk included, as nccl-tests counts an all-to-all; the largest rank's)\n");
  std::printf("# time(us): %s\n# algbw = bytes/time; busbw = algbw*(P-1)/P; bare: %s\n", kTimeDefinition, bare_of(o.backend, o.op).c_str());
  std::printf("#%9s %13s %-22s %-9s %11s %9s %9s %7s %11s %9s %6s", "S", "bytes", "direction", "path", "time(us)", "algbw",
              "busbw", "#wrong", "bare(us)", "algbw", "ratio");
  if (ring_columns(o)) std::printf(" %11s %2s %6s %11s %8s %11s", "split(us)", "k", "/split", "rfa(us)", "rfa/ours", "rfa-new(us)");
  if (ring_columns(o) && o.backend == "window") std::printf(" %11s %6s", "sr-win(us)", "/srwin");
  if (ring_columns(o) && o.backend != "local") std::printf(" %11s %6s", "sr-4k(us)", "/sr4k");
  std::printf("\n#%9s %13s %-22s %-9s %11s %9s %9s %7s %11s %9s %6s", "", "", "", "", "", "(GB/s)", "(GB/s)", "", "", "(GB/s)", "");
  if (ring_columns(o)) std::printf(" %11s %2s %6s %11s %8s %11s", "", "", "", "", "", "");
  if (ring_columns(o) && o.backend == "window") std::printf(" %11s %6s", "", "");
  if (ring_columns(o) && o.backend != "local") std::printf(" %11s %6s", "", "");
  std::printf("\n");
}

/// Writes --json: the run's parameters, what ran (`setup`), the time definition, the rows.
/// @returns false when the file cannot be written.
bool write_json(const Options& o, int P, const std::vector<Row>& rows, const Setup& setup) {
  FILE* f = std::fopen(o.json.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "ulysses_perf: cannot write %s: %s\n", o.json.c_str(), std::strerror(errno));
    return false;
  }
  std::fprintf(f, "{\"tool\": \"ulysses_perf\", \"op\": \"%s\", \"model\": \"%s\", \"heads\": %lld, \"kv_heads\": %lld, \"head_dim\": %lld, \"v_head_dim\": %lld,\n",
               o.op.c_str(), json_escape(o.model).c_str(), static_cast<long long>(o.shape.num_heads), static_cast<long long>(o.shape.num_kv_heads),
               static_cast<long long>(o.shape.head_dim), static_cast<long long>(o.shape.v_head_dim));
  std::fprintf(f, " \"dtype\": \"%s\", \"layout\": \"%s\", \"batch\": %lld, \"ranks\": %d, \"backend\": \"%s\", \"iters\": %d, \"warmup\": %d,\n",
               to_string(o.type), to_string(o.layout), static_cast<long long>(o.batch), P, o.backend.c_str(), o.iters, o.warmup);
  std::fprintf(f, " \"balanced\": %s, \"ranks_per_node\": %d, \"reps\": %d, \"device\": \"%s\", \"call_numbers\": %s,\n",
               o.balanced ? "true" : "false", o.ranks_per_node, o.reps, json_escape(setup.device).c_str(), o.call_numbers == 2 ? "\"both\"" : o.call_numbers ? "true" : "false");
  std::fprintf(f, " \"communicator\": \"%s\", \"seq_to_head_transfer\": \"%s\", \"window_copy_timed\": false, \"inputs_in_window\": %s, \"ring_u\": %d, \"ring_messages\": %d, \"ring_access\": \"%s\",\n",
               setup.comm.c_str(), setup.transfer.c_str(), setup.window ? "true" : "false", o.ring_u, o.ring_messages,
               o.ring_access == RingAccess::zero_copy ? "zero_copy" : "copy");
  std::fprintf(f, " \"time_definition\": \"%s\",\n \"rows\": [\n", kTimeDefinition);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& w = rows[i];
    const double alg = w.bytes / w.us * 1e-3;
    std::fprintf(f,
                 "  {\"S\": %lld, \"bytes\": %.0f, \"op\": \"%s\", \"direction\": \"%s\", \"path\": \"%s\", \"time_us\": %.3f, \"algbw_GBps\": %.4f, "
                 "\"busbw_GBps\": %.4f, \"wrong\": %lld, \"bare_us\": %.3f, \"bare_algbw_GBps\": %.4f, \"ratio\": %.4f",
                 static_cast<long long>(w.S), w.bytes, o.op.c_str(), w.direction.c_str(), w.path.c_str(), w.us, alg, alg * (P - 1) / P, w.wrong,
                 w.bare_us, w.bare_us > 0 ? w.bytes / w.bare_us * 1e-3 : 0, w.bare_us > 0 ? w.us / w.bare_us : 0);
    if (o.rope)  // --rope: (b) and (c) of the same alternating run as time_us (a)
      std::fprintf(f, ", \"rope_fused_us\": %.3f, \"rope_separate_us\": %.3f, \"rope_diff\": %lld", w.rope_us, w.separate_us, w.rope_diff);
    if (o.wire_given)  // --wire: time_us is (a) every tensor on its element wire; (b) of the same alternating run
      std::fprintf(f, ", \"wire\": \"%s\", \"wire_us\": %.3f, \"wire_wrong\": %lld, \"qk_wire_bytes\": %.0f, \"qk_element_bytes\": %.0f, "
                   "\"qkv_wire_bytes\": %.0f, \"qkv_element_bytes\": %.0f, \"wire_tensors\": \"%s\"", to_string(o.wire), w.wire_us,
                   w.wire_wrong, w.qk_wire_bytes, w.qk_bytes, w.qkv_wire_bytes, w.qkv_bytes, o.wire_tensors == 3 ? "qkv" : "qk");
    if (ring_columns(o))  // --op ring's baselines (the table's split, rfa and rfa-new columns)
      std::fprintf(f, ", \"split_us\": %.3f, \"split_k\": %d, \"rfa_us\": %.3f, \"rfa_fresh_us\": %.3f, \"baselines_wrong\": %lld", w.split_us,
                   w.split_k, w.rfa_us, w.rfa_fresh_us, w.base_wrong);
    std::fprintf(f, "}%s\n", i + 1 < rows.size() ? "," : "");
  }
  std::fprintf(f, " ],\n \"lanes\": %d}\n", o.lanes);  // PlanOptions::lanes of the two-level rows (perf_model.hpp re-plans with it)
  return std::fclose(f) == 0;
}

/// Prints --rope's table (run_rope()'s rows).
void print_rope(const Options& o, int P, const std::vector<Row>& rows, const Setup& setup) {
  std::printf("# ulysses_perf --op seq_to_head --rope: %s (H=%lld Hkv=%lld D=%lld), %s, %s, B=%lld, P=%d, backend %s, %d iters after %d warm-up%s\n",
              o.model.c_str(), static_cast<long long>(o.shape.num_heads), static_cast<long long>(o.shape.num_kv_heads),
              static_cast<long long>(o.shape.head_dim), to_string(o.type), to_string(o.layout), static_cast<long long>(o.batch), P,
              o.backend.c_str(), o.iters, o.warmup, o.check ? ", checked bit for bit" : "");
  print_setup(o, setup);
  std::printf("# one alternating run of three seq->head calls of q, k, v (each time: the median over iterations of the slowest rank's):\n"
              "# plain(us): (a) the tensors planned without row transforms; fused(us): (b) RoPE (half rotation, theta %g, positions = global\n"
              "# token) fused on pack of q and k (with_row_transforms(), RowTransforms::on_pack); separate(us): (c) a RoPE pass over q and k\n"
              "# row by row into a copy (load_row, Rope, store_row: the same arithmetic), then the plain call on the copy.\n"
              "# path: (a)'s / (b)'s; #wrong: (a) against the oracle; #diff: output elements where (b) and (c) differ (bitwise)\n",
              o.rope_theta);
  std::printf("#%9s %13s %-17s %11s %11s %12s %8s %8s %7s %7s\n", "S", "bytes", "path", "plain(us)", "fused(us)", "separate(us)", "fused/a",
              "separ/a", "#wrong", "#diff");
  long long bad = 0;
  for (const Row& w : rows) {
    char wrong[24], diff[24];
    if (w.wrong < 0) std::snprintf(wrong, sizeof wrong, "N/A");
    else std::snprintf(wrong, sizeof wrong, "%lld", w.wrong);
    if (w.rope_diff < 0) std::snprintf(diff, sizeof diff, "N/A");
    else std::snprintf(diff, sizeof diff, "%lld", w.rope_diff);
    std::printf(" %9lld %13.0f %-17s %11.1f %11.1f %12.1f %8.3f %8.3f %7s %7s\n", static_cast<long long>(w.S), w.bytes, w.path.c_str(), w.us,
                w.rope_us, w.separate_us, w.rope_us / w.us, w.separate_us / w.us, wrong, diff);
    bad += std::max(0LL, w.wrong) + std::max(0LL, w.rope_diff);
  }
  if (o.check) std::printf("# wrong elements and (b)/(c) differences (all sizes, all ranks): %lld %s\n", bad, bad ? "FAILED" : "OK");
}

/// Prints --wire's table (run_wire()'s rows).
void print_wire(const Options& o, int P, const std::vector<Row>& rows, const Setup& setup) {
  std::printf("# ulysses_perf --op seq_to_head --wire %s: %s (H=%lld Hkv=%lld D=%lld), %s, %s, B=%lld, P=%d, backend %s, %d iters after %d warm-up%s\n",
              to_string(o.wire), o.model.c_str(), static_cast<long long>(o.shape.num_heads), static_cast<long long>(o.shape.num_kv_heads),
              static_cast<long long>(o.shape.head_dim), to_string(o.type), to_string(o.layout), static_cast<long long>(o.batch), P,
              o.backend.c_str(), o.iters, o.warmup, o.check ? ", checked bit for bit" : "");
  print_setup(o, setup);
  std::printf("# one alternating run of two seq->head calls of q, k, v (each time: the median over iterations of the slowest rank's):\n"
              "# element(us): (a) every tensor on its element wire (the baseline); wire(us): (b) %s on wire %s (with_wire)%s\n"
              "# wire/el = wire(us) / element(us). Wire bytes: Plan::exchanged_bytes(seq_to_head) (the stages' send_total,\n"
              "# own chunk excluded) summed over the ranks: qk = (b)'s / (a)'s for q and k alone, qkv = for q, k, v together.\n"
              "# path: (a)'s / (b)'s; #wrong: (a) against the oracle; #wrong-w: (b) against the reference quantizer (layout/fp8.hpp's\n"
              "# row_amax, fp8_scale_of, quantize_fp8, dequantize_fp8 on each row as float, rounded back to the type%s)\n",
              o.wire_tensors == 3 ? "q, k and v" : "q and k", to_string(o.wire), o.wire_tensors == 3 ? ";" : ", v on its element wire;",
              o.wire_tensors == 3 ? "" : "; v: the oracle");
  std::printf("#%9s %13s %-17s %12s %10s %8s %14s %8s %8s %7s %8s\n", "S", "bytes", "path", "element(us)", "wire(us)", "wire/el",
              "qkv wire bytes", "qk", "qkv", "#wrong", "#wrong-w");
  long long bad = 0;
  for (const Row& w : rows) {
    char wrong[24], ww[24];
    if (w.wrong < 0) std::snprintf(wrong, sizeof wrong, "N/A");
    else std::snprintf(wrong, sizeof wrong, "%lld", w.wrong);
    if (w.wire_wrong < 0) std::snprintf(ww, sizeof ww, "N/A");
    else std::snprintf(ww, sizeof ww, "%lld", w.wire_wrong);
    std::printf(" %9lld %13.0f %-17s %12.1f %10.1f %8.3f %14.0f %8.6f %8.6f %7s %8s\n", static_cast<long long>(w.S), w.bytes, w.path.c_str(), w.us,
                w.wire_us, w.wire_us / w.us, w.qkv_wire_bytes, w.qk_wire_bytes / w.qk_bytes, w.qkv_wire_bytes / w.qkv_bytes, wrong, ww);
    bad += std::max(0LL, w.wrong) + std::max(0LL, w.wire_wrong);
  }
  if (o.check) std::printf("# wrong elements of (a) and (b) (all sizes, all ranks): %lld %s\n", bad, bad ? "FAILED" : "OK");
}

/// Prints the table (and writes --json). @returns false when the JSON file cannot be written.
bool print(const Options& o, int P, const std::vector<Row>& rows, const Setup& setup) {
  if (o.rope || o.wire_given) {
    if (o.rope) print_rope(o, P, rows, setup);
    else print_wire(o, P, rows, setup);
    return o.json.empty() || write_json(o, P, rows, setup);
  }
  print_header(o, P, setup);
  for (const Row& w : rows) {
    const double alg = w.bytes / w.us * 1e-3, bare = w.bare_us > 0 ? w.bytes / w.bare_us * 1e-3 : 0;
    char wrong[24];
    if (w.wrong < 0) std::snprintf(wrong, sizeof wrong, "N/A");
    else std::snprintf(wrong, sizeof wrong, "%lld", w.wrong);
    std::printf(" %9lld %13.0f %-22s %-9s %11.1f %9.2f %9.2f %7s %11.1f %9.2f %6.2f", static_cast<long long>(w.S), w.bytes,
                w.direction.c_str(), w.path.c_str(), w.us, alg, alg * (P - 1) / P, wrong, w.bare_us, bare, w.bare_us > 0 ? w.us / w.bare_us : 0);
    if (ring_columns(o))
      std::printf(" %11.1f %2d %6.2f %11.1f %8.2f %11.1f", w.split_us, w.split_k, w.split_ratio, w.rfa_us, w.rfa_ratio, w.rfa_fresh_us);
    if (ring_columns(o) && o.backend == "window")
      std::printf(" %11.1f %6.2f", w.own_us, w.own_ratio);
    if (ring_columns(o) && o.backend != "local") std::printf(" %11.1f %6.2f", w.small_us, w.small_ratio);
    std::printf("\n");
  }
  long long wrong = 0;
  for (const Row& w : rows) wrong += std::max(0LL, w.wrong);
  if (o.check) std::printf("# wrong elements (all sizes, all ranks): %lld %s\n", wrong, wrong ? "FAILED" : "OK");
  if (o.check && ring_columns(o)) {
    long long base = 0;
    for (const Row& w : rows) base += std::max(0LL, w.base_wrong);
    std::printf("# the baselines' wrong bytes (all sizes, all ranks): %lld %s\n", base, base ? "FAILED" : "OK");
  }
  return o.json.empty() || write_json(o, P, rows, setup);
}

/// The model modes' part of --help.
void usage_model() {
  std::printf(
      "--fit: calibrates the alpha-beta model (cost.hpp) per backend from --json files (--ranks-per-nic N: N ranks of a\n"
      "node share one inter-node NIC, their concurrent inter-node flows dividing its bandwidth; 1, a NIC per rank, by\n"
      "default; written to PARAMS.json as ranks_per_nic, not fitted); --check: its error on\n"
      "measurements (per row with --rows; exits 1 when some row is off by more than 15%%); --advise: the feasible\n"
      "(Ulysses degree, outer degree) layouts of --world ranks for --model at --seq, predicted, best first: within\n"
      "--budget-GiB (a rank's memory for one layer's attention tensors; default none: then every layout fits and the\n"
      "least traffic, P=1, wins) by time, the others after by memory (defaults: S=131072, world 64, 8 ranks per node,\n"
      "bf16, the NVLink/InfiniBand placeholders of CostModel, or --params); then the Ulysses x Ring x outer layouts\n"
      "(advise_hybrid: the ring rotation overlapped with each step's attention at --attn-TFLOPS, default 500: H100/H200 bf16,\n"
      "and the all-gather-kv alternative; msgs: the pieces of a kv block, best_ring_messages(), > 1 only under a per-flow\n"
      "cap: --intra-flow-GBps / --inter-flow-GBps BW, one message's most, 0 = none, the default; --fit fits it from\n"
      "bench_ring_mpi JSON among its files whose bare steps carry a `messages` counter of 1 and more, and keeps the\n"
      "given value otherwise); bands: the forward of each degree in head bands (tune/band_cost.hpp, best_bands(): 1 where\n"
      "overlap loses), its attention at --attn-TFLOPS (causal) or --attn-ratio F times the row's exchanges, each band's\n"
      "exchange and attention call adding --band-call-us U (default 0; the model's per-message terms are paid again a band\n"
      "anyway); band(ms): the exchanges the bands leave exposed. With --band-call-us > 0 the hybrid table bands its rows too\n"
      "(G: the bands x ring steps; banded(ms): what the layout adds to the attention in them) and ranks them by it. --check-ring: the model's ring step against bench_ring / bench_ring_mpi JSON\n"
      "(out of sample with PARAMS, and fitted to the bare send/recv rows), and the exposed communication, as Markdown.\n"
      "--op layer --layer U,R[,ring|allgather] (--backend mpi; bench/perf_layer.hpp): one layer's distributed_attention()\n"
      "forward on a U x R x outer mesh of the world around a stand-in attention at --attn-TFLOPS (a sleep per step, simulated\n"
      "under SMPI), against the model's advise_hybrid() row of the same layout (--params); with --bands G,... (plain Ulysses\n"
      "or the ring rotation), each size once per band count (DistributedAttentionOptions::bands), the G in a last column;\n"
      "--progress automatic|in_start|thread: how the bands' exchanges and the ring move during a band's attention\n"
      "(DistributedAttentionOptions::progress; thread: a worker calls MPI, MPI_THREAD_MULTIPLE asked for).\n"
      "--docs L1,L2,... | lognormal:MEAN[:SIGMA[:SEED]]: packed documents (bench/perf_documents.hpp): the given token counts\n"
      "(S = their sum), or lengths drawn from a log-normal of mean MEAN tokens (sigma 1, seed 1234 by default) packed to S.\n"
      "With --advise the hybrid table prices them (advise_hybrid's documents: the per-document zigzag, each step's document\n"
      "blocks; imb(ms): the attention the slowest rank adds over the mean); with --allgather-kv a third split, docs.\n");
}

[[noreturn]] void usage(int code) {
  std::printf(
      "usage: ulysses_perf [--op seq_to_head|head_to_seq|decode|ring|bands|transform|allgather_kv | --allgather-kv] [--rope [--rope-theta X]]\n"
      "                    [--wire fp8_e4m3|fp8_e5m2|bfloat16|float16|element [--wire-tensors qk|qkv]] [--backend local|mpi|window|nccl|cuda-local|cuda-ipc] [--ranks P]\n"
      "                    [--model NAME | --heads H --kv-heads Hkv --head-dim D\n"
      "                    [--v-head-dim Dv]] [--dtype fp32|bf16|fp16|fp64] [-b S0] [-e S1] [-f F | -i INC] [--batch B]\n"
      "                    [--layout bshd|sbhd|bhsd] [--direction seq_to_head|head_to_seq|both] [--balanced]\n"
      "                    [--path auto|alltoallv|messages|direct|two_level] [--ranks-per-node R [--lanes L]] [--backward] [--ring-u U] [--ring-messages K] [--ring-access copy|zero_copy]\n"
      "                    [--mpi-window 0|1] [--window-outputs 1|0] [--call-numbers 1|0|both] [-n ITERS] [-w WARMUP] [--reps R] [--bare 0|1] [--copies 0|1] [-c 0|1] [--max-rank-bytes N] [--json FILE] [--list-models]\n"
      "       ulysses_perf --advise [--model NAME ...] [--seq S] [--world N] [--ranks-per-node R] [--dtype T] [--batch B]\n"
      "                    [--budget-GiB G] [--params FILE [--params-backend local|mpi]] [--intra-us A] [--intra-GBps BW]\n"
      "                    [--inter-us A] [--inter-GBps BW] [--intra-latency-us L] [--inter-latency-us L] [--copy-GBps BW] [--ranks-per-nic N]\n"
      "                    [--intra-flow-GBps BW] [--inter-flow-GBps BW] [--attn-TFLOPS T] [--attn-ratio F] [--band-call-us U]\n"
      "       ulysses_perf --fit PARAMS.json [--ranks-per-nic N] [--intra-flow-GBps BW] RUN.json [RUN.json ...] [RING.json ...]\n"
      "       ulysses_perf --check PARAMS.json [--rows] RUN.json [RUN.json ...]\n"
      "       ulysses_perf --check-ring PARAMS.json RING.json [RING.json ...]   (bench_ring / bench_ring_mpi JSON)\n"
      "One operation (--op, as nccl-tests' one binary a collective) for sizes S0, S0*F, ... <= S1 (or S0, S0+INC, ...), next\n"
      "to the bare transport of the same bytes, the same columns, -c 1 and --json for each:\n"
      "  seq_to_head (default): q, k, v seq->head in one exchange; head_to_seq: o head->seq (S: the sequence, balanced split,\n"
      "    uneven S welcome; bytes: a rank's input tensors, own chunk included, as nccl-tests counts an all-to-all;\n"
      "    --direction both: both tables in one run); decode: decode_exchange() of O and LSE (S: the batch B, T=1;\n"
      "    bare: the all-to-all-v of their bytes); ring: one RingRotation rotation (S: the sequence, R = P, U = --ring-u,\n"
      "    default 1; bare: R-1 one-message exchanges of the same blocks). decode and ring: --backend local or mpi; ring also window.\n"
      "  bands (bench/band_bench.hpp): the layer (seq->head, a stand-in attention, head->seq) in --bands G,... head bands\n"
      "    against the serial layer, the attention --attn-ratio f,... times the serial exchange (--attn-kind sleep: a device\n"
      "    kernel, the host free; spin: host compute), the handles' --progress automatic|in_start|thread, and the G the\n"
      "    cost model advises; --posts-progress 0: posted messages move only while a thread is inside MPI (Open MPI over\n"
      "    TCP), so the model overlaps nothing for posted (split) exchanges (BandWork::shares_compute); default 1.\n"
      "--rope (--op seq_to_head, --backend local or mpi/window: HostExecutor runs row transforms): per S, three seq->head calls of\n"
      "  q, k, v in one alternating run: (a) plain (tensors planned without row transforms), (b) RoPE fused on pack of q and k\n"
      "  (Rope(D, S, --rope-theta X, default 10000), half rotation, positions = global token; q, k planned with_row_transforms()),\n"
      "  (c) a separate RoPE pass over q and k row by row into a copy (load_row, Rope, store_row), then (a) on the copy;\n"
      "  columns plain(us), fused(us), separate(us), fused/a, separ/a; -c 1: (a) against the oracle (#wrong) and (b) == (c)\n"
      "  bit for bit (#diff). No bare column.\n"
      "--wire W (--op seq_to_head, --backend local or mpi/window, also under SMPI with --mpi-window 0; W = fp8_e4m3, fp8_e5m2,\n"
      "  bfloat16, float16 or element): per S, two seq->head calls of q, k, v in one alternating run: (a) every tensor on its\n"
      "  element wire (the baseline; give --dtype bf16 for the bf16 one), (b) q and k on wire W (TensorSpec::with_wire; an fp8\n"
      "  row: D bytes then its float32 scale), v on its element wire; columns element(us), wire(us), wire/el, and the exact\n"
      "  wire-byte ratios (b)/(a) of Plan::exchanged_bytes(seq_to_head) (send_total) for q, k alone (qk) and q, k, v (qkv);\n"
      "  -c 1: (a) against the oracle (#wrong), (b) against a reference quantizer of each row (layout/fp8.hpp's row_amax,\n"
      "  fp8_scale_of, quantize_fp8, dequantize_fp8 on the row as float, rounded back to the type) bit for bit (#wrong-w).\n"
      "  --groups G allowed (each group's rank 0 prints). No bare column. --wire-tensors qkv: (b) puts v on wire W too (the\n"
      "  default, qk: q and k only).\n"
      "--op transform: one thread, no group: rows of T tokens (the sizes) x H heads x D ([T, H, D], the model's H and D): the\n"
      "  transformed copy of one BlockCopy with Rope on pack (run_block_host(), bf16 and fp32) and the fp8 e4m3 quantize of\n"
      "  the fp32 rows (row_amax, fp8_scale_of, quantize_fp8 per row), each alternating with std::memcpy of the same input\n"
      "  bytes; GB/s and ratio = memcpy(us)/time(us); -c 1 checks the bytes against row-by-row references.\n"
      "--allgather-kv (--op allgather_kv; --backend local, mpi or window): allgather_kv() of k|v (the model's Hkv, D, Dv; bf16\n"
      "  unless --dtype), each rank's [B, S/P, Hkv, D] gathered whole on every rank, S the sizes, even and zigzag splits, against\n"
      "  MPI_Allgatherv of the same bytes (in process: exchange_messages() to every peer); over MpiWindowComm (one node, or\n"
      "  --mpi-window 1, --backend window) also against MPI_Allgatherv between window buffers. -c 1 checks the gathered bytes.\n"
      "--op ring: --ring-messages K (default 1): the rotation's pieces a block on a message transport (RingRotation's messages).\n"
      "  --ring-access copy|zero_copy (default copy; zero_copy on --backend local or window): RingRotation's access; zero_copy\n"
      "  reads each step's block in its owner's buffer (the path column says zero_copy).\n"
      "  Columns after ratio (ratio = time/bare, bare = R-1 MPI_Sendrecv under MPI), each baseline timed in the same alternating\n"
      "  run (every iteration: the rotation, sendrecv, split k=1,2,4,8, rfa, rfa-new), the same blocks on the same communicator:\n"
      "  split(us), k: the fastest of plain MPI's k-message patterns a step (MPI_Irecv x k, MPI_Isend x k, MPI_Waitall) and its\n"
      "  k; /split = time/split(us); rfa(us): ring-flash-attention's RingComm.send_recv_kv in C++ (k and v two messages each\n"
      "  way a step: isend k, irecv k, isend v, irecv v, then wait; two pairs of receive buffers reused); rfa/ours = rfa(us)/time;\n"
      "  rfa-new(us): the same as written, fresh malloc'd receive buffers every step. In process (local) each baseline is an\n"
      "  exchange_messages() on the rank's own thread (1 or k pieces; k and v). -c 1 checks the baselines' bytes too.\n"
      "  --backend window (mpiexec, one node): the rotation over MpiWindowComm, its two buffers allocated from an MpiWindow, so\n"
      "  each step reads ring rank r-1's block in place (one copy, no MPI message); the baselines over the MpiComm it wraps.\n"
      "  For the seq ops --backend window is --backend mpi --mpi-window 1.\n"
      "time(us), every backend and op: iterations alternate the library call and the bare transport of the same bytes;\n"
      "each time is the median over iterations of the slowest rank's time (max-reduced per iteration, each call after\n"
      "a barrier); ratio = median(ours)/median(bare) of the same run; -w warm-up pairs first; --reps R: R such runs, the\n"
      "one with the least median(ours). The device backends time each call with CUDA events. -c 1 checks every output\n"
      "element bit for bit against an oracle (#wrong);\n"
      "-c 0 only times (every buffer written once with a constant instead of the oracle's values). --copies 0 (--backend mpi,\n"
      "with -c 0): the executor skips the host copies and the buffers stay unwritten, the messages stay the same: for simulated time only (SMPI).\n"

      "--backward adds the backward pass to the forward (as the demo's --backward does): head_to_seq_backward of do\n"
      "and seq_to_head_backward of dq, dk, dv (which sums the partial gradients of replicated kv heads).\n"
      "Backends: local (P threads, host memory), mpi (run under mpiexec -n P), nccl (one process per GPU, under\n"
      "mpiexec -n P when built with MPI, which passes the NCCL unique id; P=1 without), cuda-local (P virtual ranks on\n"
      "one GPU, DeviceLocalGroup), cuda-ipc (mpiexec -n P on one node, several processes may share a GPU: the peer\n"
      "copy across processes through CUDA IPC, inputs in a device window of --window-MiB M per rank, default 1024;\n"
      "its bare column is one cudaMemcpyAsync of the same bytes); the device backends time with CUDA events and check on the host. Without a CUDA\n"
      "device they refuse to start (exit 3).\n"
      "Defaults: --op seq_to_head, Llama-3.1-8B, fp32, bshd, B=1, -b 1024 -e 16384 -f 2, -n 20 -w 5, local P=4.\n"
      "--ranks-per-node R: the group's ranks sit on simulated nodes of R (PlanOptions::nodes), so the plan takes the\n"
      "two-level exchange (intra-node gather, one message per node pair, intra-node delivery) under MPI; in-process\n"
      "ranks share memory and take the direct path unless --path two_level. The last node may hold fewer ranks.\n"
      "--lanes L: inter-node messages per node pair (1: one forwarder per pair; 0: rail-aligned, one per rank).\n"
      "--groups G (--backend mpi): G groups of N/G consecutive ranks (of the N processes) run the sweep at the same time (each group's rank 0\n"
      "prints its table): one Ulysses group timed while the others load the shared links.\n"
      "--mpi-window 0|1: --backend mpi over MpiWindowComm (inputs in an MPI-3 shared window, the peer copy between\n"
      "processes: the default when every process is on one node and no --ranks-per-node) or over MpiComm (0); the\n"
      "header says which ran, whether seq->head pushes or pulls, and that copying the inputs into the window is not timed;\n"
      "--call-numbers 1|0|both: number the library calls (1, the default; 0 only to measure what numbering costs); both (host\n"
      "                    backends): each call numbered and not, alternately, time = numbered, bare = not numbered, ratio = their ratio\n"
      "--window-outputs 1|0: the outputs allocated from the window too (the default: seq->head then pushes into the\n"
      "peers' outputs) or left in private memory (0: each rank pulls its heads out of its peers' rows).\n"
  );
  usage_model();
  std::exit(code);
}

/// The op's rows from --op and --direction (which wins for the seq ops, and gives both in one
/// run); exits (2) on flags the op cannot honour.
void check_op(Options& o) {
  if (o.rope && (o.op != "seq_to_head" || o.direction_given || o.backward || (o.backend != "local" && o.backend != "mpi" && o.backend != "window") ||
                 o.call_numbers == 2 || !o.copies || o.groups != 1)) {
    std::fprintf(stderr, "--rope goes with --op seq_to_head on --backend local or mpi (host memory: only HostExecutor runs row transforms), "
                         "without --direction, --backward, --call-numbers both, --copies 0, --groups\n");
    std::exit(2);
  }
  if (o.wire_given && (o.rope || o.op != "seq_to_head" || o.direction_given || o.backward ||
                       (o.backend != "local" && o.backend != "mpi" && o.backend != "window") || o.call_numbers == 2 || !o.copies)) {
    std::fprintf(stderr, "--wire goes with --op seq_to_head on --backend local or mpi (host memory: only HostExecutor runs wires), "
                         "without --rope, --direction, --backward, --call-numbers both, --copies 0 (SkipCopies runs no wire)\n");
    std::exit(2);
  }
  if (o.op == "transform") {
    if (o.backend != "local" || o.ranks_given || o.direction_given || o.backward) {
      std::fprintf(stderr, "--op transform is a one-thread host benchmark: --backend local, no --ranks, --direction, --backward\n");
      std::exit(2);
    }
    return;
  }
  if (o.docs.given && o.mode != "advise" && o.op != "allgather_kv" && o.op != "layer") {
    std::fprintf(stderr, "--docs goes with --advise (the hybrid table), --allgather-kv (a third split) or --op layer\n");
    std::exit(2);
  }
  if (o.op == "layer") {
    if (o.backend != "mpi" || o.direction_given || o.backward || o.rope || o.wire_given || o.check) {
      std::fprintf(stderr, "--op layer (--layer U,R[,kv]) runs under mpiexec or smpirun (--backend mpi), forward, -c 0, without --direction, --rope, --wire\n");
      std::exit(2);
    }
    return;
  }
  if (o.op == "allgather_kv") return perf_allgather::check_options(o);  // (perf_allgather.hpp)
  if (o.op == "bands") {
    if (o.backend != "local" && o.backend != "mpi" && o.backend != "window") {
      std::fprintf(stderr, "--op bands runs on --backend local, mpi or window, not %s\n", o.backend.c_str());
      std::exit(2);
    }
    if (o.attn_kind.empty()) o.attn_kind = o.backend == "local" ? "spin" : "sleep";
    return;
  }
  const bool seq_op = o.op == "seq_to_head" || o.op == "head_to_seq";
  if (seq_op && !o.direction_given) o.seq_to_head = o.op == "seq_to_head", o.head_to_seq = o.op == "head_to_seq";
  if (seq_op && o.direction_given) o.op = o.seq_to_head ? "seq_to_head" : "head_to_seq";
  if (seq_op && (o.ring_messages != 1 || o.ring_access != RingAccess::copy)) {
    std::fprintf(stderr, "--ring-messages and --ring-access go with --op ring\n");
    std::exit(2);
  }
  if (seq_op && o.backend == "window") o.backend = "mpi", o.mpi_window = 1;  // the seq ops' --backend window: --backend mpi --mpi-window 1
  if (seq_op) return;
  if (o.direction_given || o.backward || o.call_numbers == 2 || !o.copies || o.ranks_per_node > 0 || o.groups != 1 || o.ring_u < 1) {
    std::fprintf(stderr, "--op %s takes none of --direction, --backward, --call-numbers both, --copies 0, --ranks-per-node, --groups; --ring-u >= 1\n",
                 o.op.c_str());
    std::exit(2);
  }
  if (o.ring_messages < 1 || o.ring_messages > kMaxRingMessages || (o.ring_messages != 1 && o.op != "ring")) {
    std::fprintf(stderr, "--ring-messages K goes with --op ring, 1 <= K <= %d\n", kMaxRingMessages);
    std::exit(2);
  }
  if (o.ring_access == RingAccess::zero_copy && (o.op != "ring" || (o.backend != "local" && o.backend != "window"))) {
    std::fprintf(stderr, "--ring-access zero_copy goes with --op ring on --backend local or window (a communicator whose ranks map each "
                         "other's memory)\n");
    std::exit(2);
  }
  if (o.backend != "local" && o.backend != "mpi" && !(o.op == "ring" && o.backend == "window")) {
    std::fprintf(stderr, "--op %s runs on --backend local or mpi (host memory; ring also on window), not %s\n", o.op.c_str(), o.backend.c_str());
    std::exit(2);
  }
}

/// Exits (2) on options that contradict each other; fixes the op's rows (check_op()).
void validate(Options& o) {
  check_op(o);
  if (o.backend != "local" && o.backend != "mpi" && o.backend != "window" && o.backend != "nccl" && o.backend != "cuda-local" && o.backend != "cuda-ipc") {
    std::fprintf(stderr, "--backend must be local, mpi, window, nccl, cuda-local or cuda-ipc, not '%s'\n", o.backend.c_str());
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
}

/// The flags of how a sweep runs (iterations, checks, JSON, nodes, MPI windows, call numbers):
/// consumes argv[i] (and its value) into `o`. @returns whether it was one of them.
bool parse_run_flag(int argc, char** argv, int& i, Options& o) {
  auto number = [&](int& j) { return ulysses_cli::whole(argc, argv, j, LLONG_MIN, LLONG_MAX); };
  auto small = [&](int& j) { return static_cast<int>(ulysses_cli::whole(argc, argv, j, INT_MIN, INT_MAX)); };
  const std::string a = argv[i];
  if (a == "-n") o.iters = small(i);
  else if (a == "-w") o.warmup = small(i);
  else if (a == "--reps") o.reps = small(i);
  else if (a == "--bare") o.bare = number(i) != 0;
  else if (a == "--copies") o.copies = number(i) != 0;
  else if (a == "-c") o.check = number(i) != 0;
  else if (a == "--json") o.json = ulysses_cli::value(argc, argv, i);
  else if (a == "--ranks-per-node") o.ranks_per_node = small(i);
  else if (a == "--lanes") o.lanes = small(i);
  else if (a == "--groups") o.groups = small(i);
  else if (a == "--mpi-window") o.mpi_window = number(i) != 0;
  else if (a == "--window-outputs") o.window_outputs = number(i) != 0;
  else if (a == "--call-numbers") {
    const std::string v = ulysses_cli::value(argc, argv, i);
    o.call_numbers = v == "both" ? 2 : v == "0" ? 0 : 1;
  }
  else if (a == "--window-MiB") o.window_MiB = number(i);
  else if (a == "--max-rank-bytes") o.max_rank_bytes = ulysses_cli::real(argc, argv, i, 0);
  else return false;
  return true;
}

/// The flags of the model modes (--advise, --fit, --check, --check-ring and their link
/// parameters): consumes argv[i] (and its value) into `o`. @returns whether it was one of them.
bool parse_model_flag(int argc, char** argv, int& i, Options& o) {
  const std::string a = argv[i];
  if (a == "--advise") o.mode = "advise";
  else if (a == "--fit") o.mode = "fit", o.params = ulysses_cli::value(argc, argv, i);
  else if (a == "--check") o.mode = "check", o.params = ulysses_cli::value(argc, argv, i);
  else if (a == "--check-ring") o.mode = "check_ring", o.params = ulysses_cli::value(argc, argv, i);
  else if (a == "--attn-TFLOPS") o.attn_TFLOPS = ulysses_cli::real(argc, argv, i, 1e-9);
  else if (a == "--band-call-us") o.band_call_us = ulysses_cli::real(argc, argv, i, 0);
  else if (a == "--rows") o.rows = true;
  else if (a == "--params") o.params = ulysses_cli::value(argc, argv, i);
  else if (a == "--params-backend") o.params_backend = ulysses_cli::value(argc, argv, i);
  else if (a == "--seq") o.seq = ulysses_cli::whole(argc, argv, i, LLONG_MIN, LLONG_MAX);
  else if (a == "--docs") o.docs = perf_documents::parse(ulysses_cli::value(argc, argv, i));
  else if (a == "--world") o.world = static_cast<int>(ulysses_cli::whole(argc, argv, i, INT_MIN, INT_MAX));
  else if (a == "--budget-GiB") o.budget_GiB = ulysses_cli::real(argc, argv, i, 0);
  else if (a == "--intra-us") o.links.intra_us = ulysses_cli::real(argc, argv, i, 0);
  else if (a == "--intra-GBps") o.links.intra_GBps = ulysses_cli::real(argc, argv, i, 0);
  else if (a == "--inter-us") o.links.inter_us = ulysses_cli::real(argc, argv, i, 0);
  else if (a == "--inter-GBps") o.links.inter_GBps = ulysses_cli::real(argc, argv, i, 0);
  else if (a == "--intra-latency-us") o.links.intra_latency_us = ulysses_cli::real(argc, argv, i, 0);
  else if (a == "--inter-latency-us") o.links.inter_latency_us = ulysses_cli::real(argc, argv, i, 0);
  else if (a == "--ranks-per-nic") o.links.ranks_per_nic = ulysses_cli::real(argc, argv, i, 1);
  else if (a == "--copy-GBps") o.links.copy_GBps = ulysses_cli::real(argc, argv, i, 0);
  else if (a == "--intra-flow-GBps") o.links.intra_flow_GBps = ulysses_cli::real(argc, argv, i, 0);
  else if (a == "--inter-flow-GBps") o.links.inter_flow_GBps = ulysses_cli::real(argc, argv, i, 0);
  else return false;
  return true;
}

/// The items of a comma-separated list ("1,2,4"); exits (2) on an empty item.
std::vector<std::string> split_list(const std::string& v) {
  std::vector<std::string> out;
  std::size_t a = 0;
  for (;;) {
    const std::size_t b = v.find(',', a);
    out.push_back(v.substr(a, b == std::string::npos ? std::string::npos : b - a));
    if (out.back().empty()) {
      std::fprintf(stderr, "ulysses_perf: '%s' is not a comma-separated list\n", v.c_str());
      std::exit(2);
    }
    if (b == std::string::npos) return out;
    a = b + 1;
  }
}
/// A list item as a number in [lo, hi]; exits (2) otherwise.
double list_number(const std::string& x, double lo, double hi, const char* flag) {
  char* end = nullptr;
  const double v = std::strtod(x.c_str(), &end);
  if (end == x.c_str() || *end || !(v >= lo && v <= hi)) {
    std::fprintf(stderr, "ulysses_perf: %s takes numbers in [%g, %g], not '%s'\n", flag, lo, hi, x.c_str());
    std::exit(2);
  }
  return v;
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
      o.direction_given = true;
    } else if (a == "--op") {
      const char* const ops[] = {"seq_to_head", "head_to_seq", "decode", "ring", "bands", "transform", "allgather_kv", "layer"};
      o.op = ops[ulysses_cli::one_of(argc, argv, i, {"seq_to_head", "head_to_seq", "decode", "ring", "bands", "transform", "allgather_kv", "layer"})];
    } else if (a == "--layer") {
      o.op = "layer";
#if ULYSSES_PERF_MPI
      o.layer = perf_layer::parse(need(i));
#else
      (void)need(i);
#endif
    } else if (a == "--allgather-kv") {
      o.op = "allgather_kv";
    } else if (a == "--bands") {
      o.bands.clear();
      o.bands_given = true;
      for (const std::string& x : split_list(need(i))) {
        const double g = list_number(x, 1, kMaxStages, "--bands");
        if (g != static_cast<int>(g)) {
          std::fprintf(stderr, "ulysses_perf: --bands takes whole numbers, not '%s'\n", x.c_str());
          std::exit(2);
        }
        o.bands.push_back(static_cast<int>(g));
      }
    } else if (a == "--attn-ratio") {
      o.attn_ratios.clear();
      for (const std::string& x : split_list(need(i))) o.attn_ratios.push_back(list_number(x, 0, 1e6, "--attn-ratio"));
      o.attn_ratio = o.attn_ratios.front();  // --advise: the first
    } else if (a == "--attn-kind") {
      o.attn_kind = ulysses_cli::one_of(argc, argv, i, {"sleep", "spin"}) == 0 ? "sleep" : "spin";
    } else if (a == "--posts-progress") {
      o.posts_progress = ulysses_cli::one_of(argc, argv, i, {"0", "1"}) == 1;
    } else if (a == "--progress") {
      const Progress ps[] = {Progress::automatic, Progress::in_start, Progress::thread};
      o.progress = ps[ulysses_cli::one_of(argc, argv, i, {"automatic", "in_start", "thread"})];
    } else if (a == "--ring-u") {
      o.ring_u = small(i);
    } else if (a == "--ring-messages") {
      o.ring_messages = small(i);
    } else if (a == "--ring-access") {
      o.ring_access = ulysses_cli::one_of(argc, argv, i, {"copy", "zero_copy"}) == 0 ? RingAccess::copy : RingAccess::zero_copy;
    } else if (a == "--path") {
      const Path paths[] = {Path::automatic, Path::alltoallv, Path::messages, Path::direct, Path::two_level};
      o.path = paths[ulysses_cli::one_of(argc, argv, i, {"auto", "alltoallv", "messages", "direct", "two_level"})];
    } else if (a == "--balanced") o.balanced = true;
    else if (a == "--backward") o.backward = true;
    else if (a == "--rope") o.rope = true;
    else if (a == "--rope-theta") o.rope_theta = ulysses_cli::real(argc, argv, i, 1e-300);
    else if (a == "--wire") {
      const Wire wires[] = {Wire::fp8_e4m3, Wire::fp8_e5m2, Wire::bfloat16, Wire::float16, Wire::element};
      o.wire = wires[ulysses_cli::one_of(argc, argv, i, {"fp8_e4m3", "fp8_e5m2", "bfloat16", "float16", "element"})];
      o.wire_given = true;
    } else if (a == "--wire-tensors") o.wire_tensors = static_cast<int>(ulysses_cli::one_of(argc, argv, i, {"qk", "qkv"})) + 2;
    else if (parse_run_flag(argc, argv, i, o)) continue;
    else if (parse_model_flag(argc, argv, i, o)) continue;
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
  validate(o);
  return o;
}

/// The exit status of a sweep: 1 when some element (or a ring baseline's byte) was wrong, else 0.
int status_of(const std::vector<Row>& rows) {
  for (const Row& w : rows)
    if (w.wrong > 0 || w.base_wrong > 0 || w.rope_diff > 0 || w.wire_wrong > 0) return 1;
  return 0;
}

#if ULYSSES_PERF_MPI
/// --backend mpi: the sweep over MpiWindowComm (--mpi-window 1, or by default when every process
/// is on one node and no --ranks-per-node) or MpiComm; the decode and ring ops over MpiComm.
/// --backend window: the sweep as --mpi-window 1; the ring op over MpiWindowComm (run_ring_window()).
/// Fills `setup` with what ran. Collective.
std::vector<Row> run_mpi(MpiComm& comm, const Options& o, Setup& setup) {
  setup = Setup{"MpiComm", "messages", false, ""};
  if (o.op == "ring" && o.backend == "window") {
    setup = Setup{"MpiWindowComm", "in_place", true, ""};
    return run_ring_window(comm, o);
  }
  if (o.op == "decode" || o.op == "ring") return run_op(comm, o);
  if (o.mpi_window == 1 || (o.mpi_window < 0 && o.ranks_per_node == 0 && one_node(comm))) {
    const bool peer_copy = o.path == Path::automatic || o.path == Path::direct;  // (forced paths move messages over the window)
    setup = Setup{"MpiWindowComm", !peer_copy ? "messages" : o.window_outputs ? "push" : "pull", true, ""};
    if (o.rope) return run_rope(o, [&] { return std::make_unique<WindowRunner>(comm, o.window_outputs); });
    if (o.wire_given) return run_wire(o, [&] { return std::make_unique<WindowRunner>(comm, o.window_outputs); });
    WindowRunner runner(comm, o.window_outputs);  // the peer copy between the processes of the node
    return run(runner, o);
  }
  if (o.rope) return run_rope(o, [&] { return std::make_unique<HostRunner<MpiComm>>(comm); });
  if (o.wire_given) return run_wire(o, [&] { return std::make_unique<HostRunner<MpiComm>>(comm); });
  if (o.copies) {
    HostRunner<MpiComm> runner(comm);
    return run(runner, o);
  }
  HostRunner<MpiComm, SkipCopies> runner(comm);
  return run(runner, o);
}
#endif

// ---- --op bands (band_bench.hpp) ----------------------------------------------------------------
/// --op bands on one rank of `comm`: the sweep; rows printed by rank 0.
template <class Comm>
void run_bands_on(Comm& comm, const Options& o, const std::string& what) {
  std::vector<std::int64_t> sizes;
  for (std::int64_t n = o.begin; n > 0; n = next_size(n, o)) sizes.push_back(n);
  auto run = [&](auto exec) {
    return band_bench::sweep<decltype(exec)>(
        comm, o.shape, o.batch, sizes, o.bands, o.attn_ratios, o.attn_kind, o.progress, o.posts_progress, o.band_call_us * 1e-6,
        [&] { return seconds_now(comm); },
        [&](const std::vector<std::function<double()>>& calls) { return alternate_all(o, calls); });
  };
  const std::vector<band_bench::BandRow> rows = o.copies ? run(HostExecutor{}) : run(SkipCopies{});
  if (comm.rank() == 0)
    band_bench::print(rows, what + ", " + o.model + ", P=" + std::to_string(comm.size()) + ", B=" + std::to_string(o.batch) +
                                ", attention " + o.attn_kind + (o.copies ? "" : ", --copies 0 (the messages alone)") +
                                (o.posts_progress ? "" : ", --posts-progress 0"));
}
/// --backend local --op bands: --ranks P ranks on threads. @returns the exit status.
int run_bands_local(const Options& o) {
  LocalGroup group(o.ranks);
  group.spawn([&](LocalGroup::Comm& comm) { run_bands_on(comm, o, "LocalGroup::Comm"); });
  return 0;
}
#if ULYSSES_PERF_MPI
/// --backend mpi|window --op bands: over MpiComm, or MpiWindowComm (--backend window, --mpi-window 1).
int run_bands_mpi(MpiComm& comm, const Options& o) {
  if (o.backend == "window" || o.mpi_window == 1) {
    std::int64_t S = o.begin;  // the window stages the largest layer's tensors: q, k, v, o both sides, twice over
    for (std::int64_t n = o.begin; n > 0; n = next_size(n, o)) S = n;
    const auto elems = static_cast<std::size_t>(o.batch * (S / comm.size() + 1) * (2 * o.shape.num_heads + 2 * o.shape.num_kv_heads));
    MpiWindow win(comm, 4 * elems * static_cast<std::size_t>(o.shape.head_dim) * size_of(o.type) + (std::size_t{1} << 20));
    MpiWindowComm wc(comm, win);
    run_bands_on(wc, o, "MpiWindowComm");
  } else {
    run_bands_on(comm, o, "MpiComm");
  }
  return 0;
}
#endif

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
  if (!print(o, o.ranks, rows, Setup{"DeviceLocalGroup::Comm", "", false, perf_device::device_name(0) + ", " + std::to_string(o.ranks) + " virtual ranks"})) return 2;
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
      if (rank == 0 && !print(o, P, rows, Setup{"NcclComm", "messages", false, perf_device::device_name(local) + " per process"})) rc = 2;
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
      if (rank == 0 && !print(o, P, rows, Setup{"MpiDeviceWindowComm", "", true, perf_device::device_name(local) + ", " + std::to_string(P) + " processes, CUDA IPC"})) rc = 2;
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

/// --advise, --fit, --check, --check-ring (perf_model.hpp). @returns the exit status.
int run_model_mode(const Options& o) {
  if (o.mode == "advise") {
    CostModel m = CostModel::nvlink_infiniband();
#if ULYSSES_PERF_JSON
    if (!o.params.empty()) m = perf_model::load_model(o.params, o.params_backend);
#else
    if (!o.params.empty()) throw Error(Errc::invalid_shape, "--params needs a build with nlohmann_json (apt-get install nlohmann-json3-dev)");
#endif
    const int rpn = o.ranks_per_node > 0 ? o.ranks_per_node : 8;
    const ElementType t = o.type_given ? o.type : ElementType::bfloat16;
    BandAdvice bands;
    bands.flops_per_s = o.attn_TFLOPS * 1e12;
    bands.attention_ratio = o.attn_ratio;
    bands.overhead = {o.band_call_us * 1e-6, o.band_call_us * 1e-6};
    const int rc = perf_model::advise(o.shape, o.model, o.seq, o.world, rpn, o.links.apply(m), t, o.batch, o.budget_GiB * 1024.0 * 1024 * 1024,
                                      o.balanced, bands);
    const std::int64_t S = o.docs.fixed_seq_len() ? o.docs.fixed_seq_len() : o.seq;
    std::optional<Documents> docs;
    if (o.docs.given) docs = perf_documents::documents(o.docs, S);
    return rc ? rc
              : perf_model::advise_hybrid_rows(o.shape, S, o.world, rpn, o.links.apply(m), o.attn_TFLOPS * 1e12, t, o.batch,
                                               o.budget_GiB * 1024.0 * 1024 * 1024, o.balanced, docs ? &*docs : nullptr,
                                               o.docs.describe(), o.band_call_us > 0 ? &bands.overhead : nullptr);
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
  return 2;
}

/// --backend mpi: MPI initialised and finalised here (an error thrown out of the sweep goes to
/// main(), which aborts the job). @returns the exit status.
int main_mpi(int& argc, char**& argv, const Options& o) {
#if ULYSSES_PERF_MPI
  int provided = 0;  // --op bands|layer --progress thread: the handles' worker calls MPI (--op layer with a ring
  // and bands: on the Ulysses group while the ring moves on the caller's thread, MPI_THREAD_MULTIPLE)
  const bool two_threads = o.op == "layer" && o.progress == Progress::thread;
  if (o.op == "bands" || o.op == "layer")
    MPI_Init_thread(&argc, &argv, two_threads ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED, &provided);
  else MPI_Init(&argc, &argv);
  int rc = 0;
  {
    MpiComm comm(world_group(o.groups));
    if (o.ranks_given && o.ranks != comm.size()) {
      if (comm.rank() == 0) std::fprintf(stderr, "--ranks %d but mpiexec started %d processes\n", o.ranks, comm.size());
      rc = 2;
    } else if (o.op == "bands") {
      rc = run_bands_mpi(comm, o);
    } else if (o.op == "layer") {  // perf_layer.hpp: over MPI_COMM_WORLD's mesh
      CostModel m = CostModel::nvlink_infiniband();
#if ULYSSES_PERF_JSON
      if (!o.params.empty()) m = perf_model::load_model(o.params, o.params_backend);
#endif
      rc = perf_layer::run_mpi(comm, o, o.layer, o.links.apply(m), !o.params.empty(), [&](std::int64_t n) { return next_size(n, o); });
    } else if (o.op == "allgather_kv") {  // perf_allgather.hpp: over MpiWindowComm as the seq ops choose it, else MpiComm
      rc = perf_allgather::run_mpi(comm, o, o.backend == "window" || o.mpi_window == 1 || (o.mpi_window < 0 && one_node(comm)),
                                   [&](std::int64_t n) { return next_size(n, o); }, [&](const auto& c) { return alternate_all(o, c); });
    } else {
      Setup setup;
      const std::vector<Row> rows = run_mpi(comm, o, setup);
      if (comm.rank() == 0 && !print(o, comm.size(), rows, setup)) rc = 2;
      rc |= status_of(rows);
    }
  }
  MPI_Finalize();
  return rc;
#else
  (void)argc, (void)argv, (void)o;
  std::fprintf(stderr, "ulysses_perf: this build has no MPI (install libopenmpi-dev and reconfigure)\n");
  return 2;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  set_call_numbering(o.call_numbers != 0);
  if (o.mode == "sweep" && (o.backend == "local" || o.backend == "cuda-local") && under_mpiexec())
    std::fprintf(stderr, "ulysses_perf: started by mpiexec with --backend %s: each process runs its own in-process group; "
                         "give --backend mpi (or nccl) for one group over the MPI processes\n", o.backend.c_str());
  try {
    if (o.mode != "sweep") return run_model_mode(o);
    if (o.backend == "mpi" || o.backend == "window") return main_mpi(argc, argv, o);
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
    if (o.op == "bands") return run_bands_local(o);
    if (o.op == "allgather_kv")
      return perf_allgather::run_local(o, [&](std::int64_t n) { return next_size(n, o); }, [&](const auto& c) { return alternate_all(o, c); });
    if (o.op == "transform") {  // one thread, no group (perf_transform.hpp)
      std::vector<perf_transform::Line> lines;
      for (std::int64_t T = o.begin; T > 0; T = next_size(T, o))
        for (const auto& l : perf_transform::lines_at(T, o.shape.num_heads, o.shape.head_dim, o.rope_theta, o.check,
                                                      [&](const std::vector<std::function<double()>>& calls) { return alternate_all(o, calls); }))
          lines.push_back(l);
      return perf_transform::print(lines, o.shape.num_heads, o.shape.head_dim, o.rope_theta, o.iters, o.warmup, o.check);
    }
    LocalGroup group(o.ranks);
    std::vector<Row> rows;
    group.spawn([&](LocalGroup::Comm& comm) {
      HostRunner<LocalGroup::Comm> runner(comm);
      std::vector<Row> mine = o.op == "decode" || o.op == "ring" ? run_op(comm, o)
                              : o.rope ? run_rope(o, [&] { return std::make_unique<HostRunner<LocalGroup::Comm>>(comm); })
                              : o.wire_given ? run_wire(o, [&] { return std::make_unique<HostRunner<LocalGroup::Comm>>(comm); })
                                       : run(runner, o);
      if (comm.rank() == 0) rows = std::move(mine);
    });
    if (!print(o, o.ranks, rows, Setup{"LocalGroup::Comm", "", false, ""})) return 2;
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
