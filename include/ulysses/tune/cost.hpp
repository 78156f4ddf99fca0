// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief An α-β cost model of one exchange of a plan (flat or two-level), its calibration from
///        measurements, and advice on the Ulysses degree of a world of ranks.
///
/// The model is Hockney's α-β model (R. Hockney, "The communication challenge for MPP", Parallel
/// Computing 20(3), 1994; as used for collectives by Thakur, Rabenseifner & Gropp, IJHPCA 2005),
/// one (α, β) pair per link class — intra-node (NVLink, shared memory) and inter-node (InfiniBand,
/// RoCE) — plus a term for the executor's copies (pack, unpack, sums; memory bandwidth):
///
///     T = Σ_rounds ( ε + Σ_class ( α_class · messages + β_class · bytes ) ) + γ · copied bytes + δ · copied rows
///
/// (ε: what a round costs whatever it moves — posting, waiting, the group's synchronisation; δ: a
/// contiguous row of D elements costs a loop step, an address computation and a partly used cache
/// line or vector; short rows, e.g. D = 64 in bf16, cost more per byte than D = 256.)
/// Memory-to-memory moves (copies, shared-memory and NVLink transfers) run faster while the
/// exchange's working set W (a rank's inputs, outputs and workspace) fits its share C of the
/// last-level cache: a fraction f = min(1, C / W) of those bytes takes the cached rates β_intra'
/// and γ' instead (the two-regime "roofline" of the memory hierarchy, Williams, Waterman &
/// Patterson, CACM 52(4), 2009). C = 0 turns that off (the placeholders: a GPU's exchange of
/// activations rarely fits its L2).
///
/// where each round's messages and bytes are those of its busiest rank (the largest of what it
/// sends and what it receives): one round for the flat paths, three for the two-level one
/// (intra, inter, intra). The volume follows DeepSpeed-Ulysses' analysis (Jacobs et al.,
/// arXiv:2309.14509, section 3.1): a rank sends (P-1)/P of its q, k, v (and o) shards per
/// exchange, so the bytes per link stay constant when S and P grow together, while the message
/// count grows with P — which the two-level exchange trades against extra hops.
///
/// Everything here is a prediction: calibrate it on the machine at hand (fit_cost_model() from
/// `ulysses_perf --json` measurements, `ulysses_perf --calibrate`) and treat link defaults as
/// placeholders.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "../plan/attention.hpp"
#include "../error.hpp"
#include "../topology/mesh.hpp"
#include "../plan/plan.hpp"
#include "../topology/route.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The link classes of the model.
enum class LinkClass : int {
  intra = 0,  ///< between ranks of one node (NVLink / NVSwitch, PCIe, shared memory)
  inter = 1,  ///< between nodes (InfiniBand, RoCE, Ethernet)
};

/// α and β of one link class.
struct LinkCost {
  double alpha_s = 0;           ///< seconds per message (latency and per-message overhead)
  double seconds_per_byte = 0;  ///< β: inverse bandwidth of one rank's link, seconds per byte
  /// From microseconds per message and GB/s (1e9 bytes per second; 0 GB/s means no bandwidth term).
  static LinkCost of(double alpha_us, double GBps) { return {alpha_us * 1e-6, GBps > 0 ? 1e-9 / GBps : 0}; }
  double GBps() const { return seconds_per_byte > 0 ? 1e-9 / seconds_per_byte : 0; }  ///< 1 / β in GB/s
};

/// The parameters of the model (see the file comment).
struct CostModel {
  LinkCost intra;                      ///< intra-node link of one rank (working set beyond the cache)
  LinkCost inter;                      ///< inter-node link of one rank
  double copy_seconds_per_byte = 0;    ///< γ: seconds per byte the executor writes (pack, unpack, sums, direct copies)
  double cache_bytes = 0;              ///< C: a rank's share of the last-level cache, bytes (0: no cache regime)
  double intra_cached_seconds_per_byte = 0;  ///< β_intra' of cache-resident bytes
  double copy_cached_seconds_per_byte = 0;   ///< γ' of cache-resident bytes
  double copy_seconds_per_row = 0;           ///< δ: seconds per contiguous row the executor copies (short rows cost more a byte)
  double round_seconds = 0;                  ///< ε: fixed cost of one communication round (its synchronisation)
  /// Link classes of an 8-GPU H100/H200 node on a rail-optimised InfiniBand NDR fabric, as
  /// placeholders until calibrated: NVLink 4 moves 450 GB/s per direction per GPU (NVIDIA H100
  /// datasheet), of which an all-to-all reaches about 350 GB/s (nccl-tests alltoall busbw);
  /// one 400 Gb/s NDR NIC per GPU, about 45 GB/s achieved; per-message costs of a few µs
  /// (NCCL's grouped send/recv); HBM3 copies at about 1.5 TB/s of written bytes.
  static CostModel nvlink_infiniband() { return {LinkCost::of(3, 350), LinkCost::of(6, 45), 1.0 / 1.5e12}; }
  /// The parameters as text: "intra 3 us + 1/350 GB/s, inter ..., copy 1500 GB/s".
  std::string str() const {
    auto f = [](double v) {
      char b[32];
      std::snprintf(b, sizeof b, "%.4g", v);
      return std::string(b);
    };
    auto gbps = [&f](double spb) { return spb > 0 ? f(1e-9 / spb) + " GB/s" : std::string("no byte term"); };
    std::string s = "intra " + f(intra.alpha_s * 1e6) + " us/msg, " + gbps(intra.seconds_per_byte) + "; inter " + f(inter.alpha_s * 1e6) +
                    " us/msg, " + gbps(inter.seconds_per_byte) + "; copy " + gbps(copy_seconds_per_byte);
    if (cache_bytes > 0)
      s += "; within " + f(cache_bytes / 1048576.0) + " MiB of cache: intra " + gbps(intra_cached_seconds_per_byte) + ", copy " +
           gbps(copy_cached_seconds_per_byte);
    if (copy_seconds_per_row > 0) s += "; " + f(copy_seconds_per_row * 1e9) + " ns a copied row";
    if (round_seconds > 0) s += "; " + f(round_seconds * 1e6) + " us a round";
    return s;
  }
};

/// What one exchange moves, as the model sees it: per link class, the messages and bytes of each
/// round's busiest rank, summed over rounds (and stages); and the bytes the executor writes on
/// the plan's rank.
struct ExchangeTraffic {
  std::array<double, 2> messages{};  ///< [LinkClass]
  std::array<double, 2> bytes{};     ///< [LinkClass]
  double copy_bytes = 0;             ///< executor bytes written (pack, unpack, sums, direct copies)
  double copy_rows = 0;              ///< contiguous rows the executor copies (every term of a sum counted)
  int rounds = 0;                    ///< communication rounds (1 flat, 3 two-level; per stage)
  double working_set_bytes = 0;      ///< the rank's inputs, outputs and workspace (none on Path::direct)
  double workspace_bytes = 0;        ///< the workspace this exchange needs on its busiest rank (two-level: a forwarder's)
};

namespace detail {

/// Busiest rank of a round: the one with the most bytes (sent or received), then messages.
struct RankLoad {
  std::array<double, 2> msgs{}, bytes{};
  double total() const { return bytes[0] + bytes[1]; }
};
inline void add_busiest(ExchangeTraffic& t, const std::vector<RankLoad>& send, const std::vector<RankLoad>& recv) {
  RankLoad best;
  double best_total = -1, best_msgs = -1;
  for (std::size_t r = 0; r < send.size(); ++r) {
    const RankLoad& a = send[r].total() >= recv[r].total() ? send[r] : recv[r];
    const double m = a.msgs[0] + a.msgs[1];
    if (a.total() > best_total || (a.total() == best_total && m > best_msgs)) {
      best = a;
      best_total = a.total();
      best_msgs = m;
    }
  }
  for (int c = 0; c < 2; ++c) {
    t.messages[static_cast<std::size_t>(c)] += best.msgs[static_cast<std::size_t>(c)];
    t.bytes[static_cast<std::size_t>(c)] += best.bytes[static_cast<std::size_t>(c)];
  }
  ++t.rounds;
}
inline double written(const std::vector<BlockCopy>& l) {
  double n = 0;
  for (const BlockCopy& c : l) n += static_cast<double>(c.written_bytes());
  return n;
}
inline double rows(const std::vector<BlockCopy>& l) {
  double n = 0;
  for (const BlockCopy& c : l) n += static_cast<double>(c.rows());
  return n;
}

}  // namespace detail

/// The traffic of one exchange of `plan` in direction `dir` on `path` (see ExchangeTraffic):
/// alltoallv: one message per peer with bytes; messages: one per (peer, tensor, b, sequence chunk);
/// two_level: the three rounds of the plan's route (a plan without one is laid out with its
/// PlanOptions::nodes for the count); direct: one synchronisation per peer and every output byte
/// copied once. A peer on another node (PlanOptions::nodes) is an inter-node link. Pure: builds
/// the global picture from the plan's shared inputs (O(P^2) per stage).
/// @throws Error(path_unsupported) Path::automatic (choose one: choose_path()).
inline ExchangeTraffic exchange_traffic(const Plan& plan, Direction dir, Path path) {
  if (path == Path::automatic) detail::fail(Errc::path_unsupported, "exchange_traffic: give the path the exchange takes (choose_path())");
  ExchangeTraffic t;
  const int P = plan.degree();
  for (int i = 0; i < plan.num_tensors(); ++i)
    t.working_set_bytes += static_cast<double>(plan.input_bytes(dir, i) + plan.output_bytes(dir, i));
  if (path != Path::direct) t.working_set_bytes += static_cast<double>(plan.workspace_bytes());
  auto workspace_of = [](std::size_t send, std::size_t recv) { return static_cast<double>((send + 255) / 256 * 256 + recv); };
  std::vector<std::size_t> send_span(static_cast<std::size_t>(P), 0), recv_span(static_cast<std::size_t>(P), 0);  // two-level, per rank
  const NodeLayout& nodes = plan.nodes();
  const auto cls = [&](int i, int j) { return nodes.node(i) == nodes.node(j) ? 0 : 1; };
  for (int k = 0; k < plan.num_stages(); ++k) {
    const Schedule& s = plan.schedule(dir, k);
    const std::vector<std::size_t> c = plan.chunk_matrix(dir, k);
    const auto C = [&](int i, int j) { return static_cast<double>(c[static_cast<std::size_t>(i) * static_cast<std::size_t>(P) + static_cast<std::size_t>(j)]); };
    if (path == Path::direct) {  // the direct lists copy the unpack's rows, from the peers' inputs
      t.messages[0] += P - 1;
      ++t.rounds;
      t.copy_bytes += detail::written(s.unpack);
      t.copy_rows += detail::rows(s.unpack);
      continue;
    }
    const bool staged = path == Path::messages;
    t.copy_bytes += staged ? detail::written(s.pack_staged) + detail::written(s.unpack_staged) : detail::written(s.pack) + detail::written(s.unpack);
    t.copy_rows += staged ? detail::rows(s.pack_staged) + detail::rows(s.unpack_staged) : detail::rows(s.pack) + detail::rows(s.unpack);
    std::vector<detail::RankLoad> send(static_cast<std::size_t>(P)), recv(static_cast<std::size_t>(P));
    if (path == Path::two_level) {
      const detail::TwoLevelRoute route(nodes, c, std::vector<std::size_t>(static_cast<std::size_t>(P), 0),
                                        std::vector<std::size_t>(static_cast<std::size_t>(P), 0), plan.options().lanes);
      for (int x = 0; x < P; ++x) {
        const auto sp = route.spans(x);
        send_span[static_cast<std::size_t>(x)] += sp.first;
        recv_span[static_cast<std::size_t>(x)] += sp.second;
      }
      for (int round = 0; round < 3; ++round) {
        std::fill(send.begin(), send.end(), detail::RankLoad{});
        std::fill(recv.begin(), recv.end(), detail::RankLoad{});
        for (int x = 0; x < P; ++x)
          for (const auto& tr : route.sends(x, round)) {
            const auto cl = static_cast<std::size_t>(cls(tr.from, tr.to));
            send[static_cast<std::size_t>(tr.from)].msgs[cl] += 1;
            send[static_cast<std::size_t>(tr.from)].bytes[cl] += static_cast<double>(tr.bytes);
            recv[static_cast<std::size_t>(tr.to)].msgs[cl] += 1;
            recv[static_cast<std::size_t>(tr.to)].bytes[cl] += static_cast<double>(tr.bytes);
          }
        detail::add_busiest(t, send, recv);
      }
      continue;
    }
    // Flat: one chunk (alltoallv) or its pieces (messages) per pair with bytes.
    const std::int64_t B = plan.batch();
    const bool s2h = dir == Direction::seq_to_head;
    for (int i = 0; i < P; ++i)
      for (int j = 0; j < P; ++j) {
        if (i == j || C(i, j) == 0) continue;
        double msgs = 1;
        if (path == Path::messages) {  // one per (tensor, b, non-empty sequence chunk of the seq-sharded side)
          msgs = 0;
          for (const SeqChunk& ch : plan.seq().chunks_of(s2h ? i : j)) msgs += ch.length > 0 ? 1 : 0;
          msgs *= static_cast<double>(plan.num_tensors() * B);
        }
        const auto cl = static_cast<std::size_t>(cls(i, j));
        send[static_cast<std::size_t>(i)].msgs[cl] += msgs;
        send[static_cast<std::size_t>(i)].bytes[cl] += C(i, j);
        recv[static_cast<std::size_t>(j)].msgs[cl] += msgs;
        recv[static_cast<std::size_t>(j)].bytes[cl] += C(i, j);
      }
    detail::add_busiest(t, send, recv);
    send_span[0] += s.send_span;  // flat: this rank's (rank 0 holds the most under balanced splits)
    recv_span[0] += s.recv_span;
  }
  if (path == Path::two_level)
    for (int x = 0; x < P; ++x)
      t.workspace_bytes = std::max(t.workspace_bytes, workspace_of(send_span[static_cast<std::size_t>(x)], recv_span[static_cast<std::size_t>(x)]));
  else if (path != Path::direct)
    t.workspace_bytes = workspace_of(send_span[0], recv_span[0]);
  return t;
}

namespace detail {
/// The model's features of `t` for a cache of `cache_bytes`, in the order of cost_params().
inline constexpr std::size_t kCostParams = 9;
inline std::array<double, kCostParams> cost_features(const ExchangeTraffic& t, double cache_bytes) {
  const double f = cache_bytes > 0 && t.working_set_bytes > 0 ? std::min(1.0, cache_bytes / t.working_set_bytes) : 0;
  return {t.messages[0], t.bytes[0] * (1 - f), t.bytes[0] * f, t.messages[1], t.bytes[1], t.copy_bytes * (1 - f), t.copy_bytes * f,
          t.copy_rows, static_cast<double>(t.rounds)};
}
/// The model's parameters, in the order of cost_features().
inline std::array<double*, kCostParams> cost_params(CostModel& m) {
  return {&m.intra.alpha_s, &m.intra.seconds_per_byte, &m.intra_cached_seconds_per_byte, &m.inter.alpha_s, &m.inter.seconds_per_byte,
          &m.copy_seconds_per_byte, &m.copy_cached_seconds_per_byte, &m.copy_seconds_per_row, &m.round_seconds};
}
}  // namespace detail

/// The model's time of an exchange with this traffic, in seconds (see the file comment).
inline double predict_seconds(const ExchangeTraffic& t, const CostModel& m) {
  CostModel c = m;
  const auto x = detail::cost_features(t, m.cache_bytes);
  const auto p = detail::cost_params(c);
  double s = 0;
  for (std::size_t i = 0; i < x.size(); ++i) s += x[i] * *p[i];
  return s;
}

/// The model's time of one exchange of `plan` in direction `dir` on `path`, in seconds
/// (exchange_traffic() then predict_seconds()). @throws as exchange_traffic().
inline double predict_seconds(const Plan& plan, Direction dir, Path path, const CostModel& m) {
  return predict_seconds(exchange_traffic(plan, dir, path), m);
}

/// One measurement for fit_cost_model(): the traffic of an exchange and its measured time.
struct CostSample {
  ExchangeTraffic traffic;
  double seconds = 0;  ///< measured, > 0
};

/// Fits the model's parameters (α of each link class, β of each and β_intra' of cache-resident
/// bytes, γ, γ', δ and ε) to measurements by least squares on the relative error (each sample weighted
/// by 1 / its time), every parameter >= 0 (the best of the exact fits over the subsets of
/// parameters). The cache share C is `base.cache_bytes` when > 0, else the best of 0 and 1 MiB ..
/// 4 GiB in powers of 2. Parameters whose features are 0 in every sample (e.g. the inter-node link
/// on one machine) keep `base`'s value.
/// @throws Error(invalid_shape) no sample, a time not finite and > 0, or traffic with a negative or
///         non-finite count.
inline CostModel fit_cost_model(const std::vector<CostSample>& samples, const CostModel& base = {}) {
  if (samples.empty()) detail::fail(Errc::invalid_shape, "fit_cost_model: no samples");
  for (const CostSample& s : samples) {
    if (!(s.seconds > 0) || !std::isfinite(s.seconds))
      detail::fail(Errc::invalid_shape, "fit_cost_model: a sample with time " + std::to_string(s.seconds) + " s (need finite, > 0)");
    for (double v : detail::cost_features(s.traffic, 1))
      if (!(v >= 0) || !std::isfinite(v))
        detail::fail(Errc::invalid_shape, "fit_cost_model: a sample whose traffic has a negative or non-finite count (" + std::to_string(v) + ")");
    if (!(s.traffic.working_set_bytes >= 0) || !std::isfinite(s.traffic.working_set_bytes))
      detail::fail(Errc::invalid_shape, "fit_cost_model: a sample with working set " + std::to_string(s.traffic.working_set_bytes));
  }
  constexpr int K = static_cast<int>(detail::kCostParams);
  std::vector<double> caches;
  if (base.cache_bytes > 0) caches.push_back(base.cache_bytes);
  else {
    caches.push_back(0);
    for (int k = 0; k <= 12; ++k) caches.push_back(1048576.0 * static_cast<double>(1 << k));
  }
  double best_err = INFINITY;
  CostModel best_model = base;
  for (double C : caches) {
    std::vector<std::array<double, K>> X;
    for (const CostSample& s : samples) X.push_back(detail::cost_features(s.traffic, C));
    bool seen[K] = {};
    double scale[K] = {};  // columns differ by orders of magnitude: scale them before solving
    for (std::size_t r = 0; r < X.size(); ++r)
      for (int i = 0; i < K; ++i) {
        seen[i] = seen[i] || X[r][static_cast<std::size_t>(i)] != 0;
        scale[i] = std::max(scale[i], std::fabs(X[r][static_cast<std::size_t>(i)]) / samples[r].seconds);
      }
    for (unsigned mask = 1; mask < (1u << K); ++mask) {
      int idx[K], n = 0;
      bool usable = true;
      for (int i = 0; i < K; ++i)
        if ((mask >> i) & 1u) {
          usable = usable && seen[i];
          idx[n++] = i;
        }
      if (!usable) continue;
      double A[K][K + 1] = {};  // normal equations of the weighted, scaled problem (target: time / time = 1)
      for (std::size_t r = 0; r < X.size(); ++r) {
        double x[K];
        for (int a = 0; a < n; ++a) x[a] = X[r][static_cast<std::size_t>(idx[a])] / samples[r].seconds / scale[idx[a]];
        for (int a = 0; a < n; ++a) {
          for (int b = 0; b < n; ++b) A[a][b] += x[a] * x[b];
          A[a][n] += x[a];
        }
      }
      bool ok = true;  // Gauss-Jordan elimination with partial pivoting
      for (int col = 0; col < n && ok; ++col) {
        int piv = col;
        for (int r = col + 1; r < n; ++r)
          if (std::fabs(A[r][col]) > std::fabs(A[piv][col])) piv = r;
        if (std::fabs(A[piv][col]) < 1e-12) {
          ok = false;
          break;
        }
        for (int c2 = 0; c2 <= n; ++c2) std::swap(A[col][c2], A[piv][c2]);
        for (int r = 0; r < n; ++r) {
          if (r == col) continue;
          const double f = A[r][col] / A[col][col];
          for (int c2 = col; c2 <= n; ++c2) A[r][c2] -= f * A[col][c2];
        }
      }
      if (!ok) continue;
      double p[K] = {};
      for (int a = 0; a < n && ok; ++a) {
        const double v = A[a][n] / A[a][a];
        ok = v >= 0;
        p[idx[a]] = v / scale[idx[a]];
      }
      if (!ok) continue;
      double err = 0;
      for (std::size_t r = 0; r < X.size(); ++r) {
        double pred = 0;
        for (int i = 0; i < K; ++i) pred += p[i] * X[r][static_cast<std::size_t>(i)];
        err += (pred / samples[r].seconds - 1) * (pred / samples[r].seconds - 1);
      }
      if (err < best_err) {
        best_err = err;
        best_model = base;
        best_model.cache_bytes = C;
        const auto q = detail::cost_params(best_model);
        for (int i = 0; i < K; ++i)
          if (seen[i]) *q[static_cast<std::size_t>(i)] = p[i];
      }
    }
  }
  return best_model;
}

/// One feasible way to lay out a world for Ulysses (see advise_degree()).
struct DegreeChoice {
  int ulysses_degree = 0;         ///< P
  int outer_degree = 0;           ///< world / P (data parallel, or context parallel when asked)
  int nodes_per_group = 1;        ///< nodes a Ulysses group spans
  Path path = Path::alltoallv;    ///< the fastest of the flat (alltoallv) and the two-level exchanges
  int lanes = 0;                  ///< PlanOptions::lanes of the two-level exchange taken (0 when flat)
  double seconds = 0;             ///< predicted exchange time of one layer's forward: q,k,v seq→head + o head→seq
  double flat_seconds = 0;        ///< the same on the flat exchange
  double two_level_seconds = 0;   ///< the same on the two-level exchange, one message per node pair (lanes 1)
  double rail_seconds = 0;        ///< the same on the rail-aligned two-level exchange (lanes 0)
                                  ///< (both = flat_seconds when the group fits in a node)
  double intra_bytes = 0;         ///< bytes per layer over the busiest rank's intra-node link (path taken)
  double inter_bytes = 0;         ///< bytes per layer over the busiest rank's inter-node link (path taken)
  double activation_bytes = 0;    ///< a rank's q,k,v,o in both shardings and the workspaces of the two forward exchanges on
                                  ///< the path taken (its busiest rank: a forwarder's on the two-level paths), one layer
  bool fits = true;               ///< activation_bytes within the budget given to advise_degree()
};

/// The feasible (Ulysses degree, outer degree) layouts of `world` ranks on nodes of
/// `ranks_per_node`, with the model's exchange time per layer (forward: q,k,v seq→head and o
/// head→seq, on the fastest of the flat exchange and the two-level one with one lane or with
/// rail-aligned lanes), bytes per link class and per-rank
/// activation memory; best first: those whose activation memory fits `budget_bytes` (0: no
/// limit) by predicted time, then the others by memory. Feasible: Mesh(world, P, ranks_per_node)
/// is valid and check_heads(mesh, shape, policy) passes. The outer dimension is data parallel (each
/// group runs its own sequences of `seq_len` tokens; a smaller P then moves fewer bytes but holds
/// more tokens a rank, so the budget decides) or, with `outer_splits_sequence`, context parallel
/// (ring attention over S / outer tokens a group; the ring's own traffic is not modelled). P = 1
/// needs no exchange: its time is 0.
/// @param shape the attention layer's head counts and dims
/// @param seq_len S, tokens of one sequence (>= 1)
/// @param world ranks in all (GPUs)
/// @param ranks_per_node ranks of one node (R)
/// @param model link and copy parameters (CostModel::nvlink_infiniband(), or fit_cost_model())
/// @param type element type of q, k, v, o (bf16 in training)
/// @param batch B (>= 1)
/// @param policy the query head split (HeadPolicy::balanced admits any H)
/// @param budget_bytes per-rank bytes one layer's attention tensors may take (activation_bytes); 0: no limit
/// @param outer_splits_sequence the outer dimension is context parallel (S / outer tokens a group)
/// @throws Error(invalid_mesh) no feasible degree (the message says why for P = 1);
///         Error(invalid_shape) seq_len or batch < 1.
inline std::vector<DegreeChoice> advise_degree(const AttentionShape& shape, std::int64_t seq_len, int world, int ranks_per_node,
                                               const CostModel& model, ElementType type = ElementType::bfloat16,
                                               std::int64_t batch = 1, HeadPolicy policy = HeadPolicy::even,
                                               double budget_bytes = 0, bool outer_splits_sequence = false) {
  if (seq_len < 1 || batch < 1)
    detail::fail(Errc::invalid_shape, "advise_degree: seq_len=" + std::to_string(seq_len) + " and batch=" + std::to_string(batch) +
                                          " must be >= 1");
  std::vector<DegreeChoice> out;
  std::string why;
  const std::vector<int> candidates = Mesh::degrees(world, ranks_per_node);
  if (candidates.empty()) Mesh(world, 1, ranks_per_node);  // throws invalid_mesh, saying why
  for (int P : candidates) {
    if (P > shape.num_heads) break;  // check_heads refuses the rest
    try {
      const Mesh mesh(world, P, ranks_per_node);
      check_heads(mesh, shape, policy);
      const std::int64_t S = outer_splits_sequence ? seq_len / mesh.outer_degree() : seq_len;
      if (S < P) continue;  // fewer tokens than ranks
      const AttentionSpecs a = attention_specs<float>(P, shape, ElementType::float32, policy);  // retyped below
      auto retype = [type](std::vector<TensorSpec> v) {
        for (TensorSpec& x : v) {
          x.elem_bytes = size_of(type);
          x.type = type;
        }
        return v;
      };
      DegreeChoice d;
      d.ulysses_degree = P;
      d.outer_degree = mesh.outer_degree();
      d.nodes_per_group = mesh.nodes_per_group();
      const SeqPartition seq = SeqPartition::balanced(S, P);
      // Candidates: flat, then (across nodes) two-level with one lane and with rail-aligned lanes.
      struct Candidate {
        Path path;
        int lanes;
        double seconds;
        ExchangeTraffic qkv, o;
      };
      std::vector<Candidate> cands;
      double tensors = 0;
      for (int c = 0; c < (mesh.group_spans_nodes() ? 3 : 1); ++c) {
        PlanOptions po;
        po.path = c == 0 ? Path::alltoallv : Path::two_level;
        po.nodes = mesh.nodes();
        po.lanes = c == 2 ? 0 : 1;
        const Plan q({P, 0}, batch, seq, retype(a.qkv()), Format::bshd, po), o({P, 0}, batch, seq, retype(a.out()), Format::bshd, po);
        Candidate k{po.path, c == 0 ? 0 : po.lanes, 0, exchange_traffic(q, Direction::seq_to_head, po.path),
                    exchange_traffic(o, Direction::head_to_seq, po.path)};
        k.seconds = predict_seconds(k.qkv, model) + predict_seconds(k.o, model);
        cands.push_back(k);
        if (c == 0)
          for (const Plan* p : {&q, &o})
            for (int t = 0; t < p->num_tensors(); ++t) tensors += static_cast<double>(p->seq_bytes(t) + p->head_bytes(t));
      }
      if (P == 1) cands[0].seconds = 0;  // no exchange at all (the plan's local copy is skipped by engines)
      d.flat_seconds = cands[0].seconds;
      d.two_level_seconds = cands.size() > 1 ? cands[1].seconds : d.flat_seconds;
      d.rail_seconds = cands.size() > 2 ? cands[2].seconds : d.flat_seconds;
      const Candidate& best = *std::min_element(cands.begin(), cands.end(), [](const Candidate& x, const Candidate& y) { return x.seconds < y.seconds; });
      d.path = best.path;
      d.lanes = best.lanes;
      d.seconds = best.seconds;
      d.activation_bytes = tensors + best.qkv.workspace_bytes + best.o.workspace_bytes;
      d.intra_bytes = best.qkv.bytes[0] + best.o.bytes[0];
      d.inter_bytes = best.qkv.bytes[1] + best.o.bytes[1];
      d.fits = budget_bytes <= 0 || d.activation_bytes <= budget_bytes;
      out.push_back(d);
    } catch (const Error& e) {
      if (why.empty()) why = e.what();
    }
  }
  if (out.empty())
    detail::fail(Errc::invalid_mesh, "advise_degree: no feasible Ulysses degree for world=" + std::to_string(world) + ", ranks_per_node=" +
                                         std::to_string(ranks_per_node) + (why.empty() ? "" : " (P = " + std::to_string(candidates.front()) + ": " + why + ")"));
  std::stable_sort(out.begin(), out.end(), [](const DegreeChoice& a, const DegreeChoice& b) {
    if (a.fits != b.fits) return a.fits;
    return a.fits ? a.seconds < b.seconds : a.activation_bytes < b.activation_bytes;
  });
  return out;
}

ULYSSES_NAMESPACE_END
