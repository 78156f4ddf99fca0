// SPDX-License-Identifier: Apache-2.0
// ulysses_perf's model modes (cost.hpp): --fit (calibrate the α-β model from ulysses_perf --json
// measurements), --check (its error against measurements, as a distribution) and --advise (the
// Ulysses degree for a model, a sequence length and a world). The JSON files are read with
// nlohmann_json; a build without it has --advise only.
#pragma once

#include <ulysses/tune/advise.hpp>
#include <ulysses/tune/cost.hpp>
#include <ulysses/tune/fit.hpp>
#include <ulysses/tune/ring_cost.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#if ULYSSES_PERF_JSON
#include <nlohmann/json.hpp>
#endif

#include "models.hpp"

namespace perf_model {

using namespace ulysses;

/// Link parameters given on the command line (negative: not given).
struct LinkFlags {
  double intra_us = -1, intra_GBps = -1, inter_us = -1, inter_GBps = -1, copy_GBps = -1;
  double cache_MiB = -1, intra_cached_GBps = -1, copy_cached_GBps = -1, row_ns = -1, round_us = -1;
  double intra_latency_us = -1, inter_latency_us = -1;
  double ranks_per_nic = -1;  ///< CostModel::ranks_per_nic (>= 1 when given)
  double intra_flow_GBps = -1, inter_flow_GBps = -1;  ///< LinkCost::flow_seconds_per_byte as GB/s (0: no per-flow cap)
  /// `m` with the given flags applied.
  CostModel apply(CostModel m) const {
    if (intra_us >= 0) m.intra.alpha_s = intra_us * 1e-6;
    if (intra_GBps >= 0) m.intra.seconds_per_byte = intra_GBps > 0 ? 1e-9 / intra_GBps : 0;
    if (inter_us >= 0) m.inter.alpha_s = inter_us * 1e-6;
    if (inter_GBps >= 0) m.inter.seconds_per_byte = inter_GBps > 0 ? 1e-9 / inter_GBps : 0;
    if (copy_GBps >= 0) m.copy_seconds_per_byte = copy_GBps > 0 ? 1e-9 / copy_GBps : 0;
    if (cache_MiB >= 0) m.cache_bytes = cache_MiB * 1048576.0;
    if (intra_cached_GBps >= 0) m.intra_cached_seconds_per_byte = intra_cached_GBps > 0 ? 1e-9 / intra_cached_GBps : 0;
    if (copy_cached_GBps >= 0) m.copy_cached_seconds_per_byte = copy_cached_GBps > 0 ? 1e-9 / copy_cached_GBps : 0;
    if (row_ns >= 0) m.copy_seconds_per_row = row_ns * 1e-9;
    if (round_us >= 0) m.round_seconds = round_us * 1e-6;
    if (intra_latency_us >= 0) m.intra.latency_s = intra_latency_us * 1e-6;
    if (inter_latency_us >= 0) m.inter.latency_s = inter_latency_us * 1e-6;
    if (ranks_per_nic >= 1) m.ranks_per_nic = ranks_per_nic;
    if (intra_flow_GBps >= 0) m.intra.flow_seconds_per_byte = intra_flow_GBps > 0 ? 1e-9 / intra_flow_GBps : 0;
    if (inter_flow_GBps >= 0) m.inter.flow_seconds_per_byte = inter_flow_GBps > 0 ? 1e-9 / inter_flow_GBps : 0;
    return m;
  }
};


/// Prints the feasible layouts, best first (advise_degree()).
inline int advise(const AttentionShape& shape, const std::string& model, std::int64_t S, int world, int R, const CostModel& m,
                  ElementType type, std::int64_t batch, double budget_bytes, bool balanced, const BandAdvice& bands = {}) {
  const auto choices =
      advise_degree(shape, S, world, R, m, type, batch, balanced ? HeadPolicy::balanced : HeadPolicy::even, budget_bytes, false, bands);
  std::printf("# ulysses_perf --advise: %s (H=%lld Hkv=%lld D=%lld), S=%lld, B=%lld, %s, world=%d on nodes of %d\n", model.c_str(),
              static_cast<long long>(shape.num_heads), static_cast<long long>(shape.num_kv_heads), static_cast<long long>(shape.head_dim),
              static_cast<long long>(S), static_cast<long long>(batch), to_string(type), world, R);
  std::printf("# model (a prediction, not a measurement): %s\n", m.str().c_str());
  if (budget_bytes <= 0)
    std::printf("# no --budget-GiB: every layout fits, and the one with the least traffic (P = 1: no exchange) comes first\n");
  else if (!choices.front().fits)
    std::printf("# WARNING: no layout fits %.3g GiB a rank: all listed by memory\n", budget_bytes / (1024.0 * 1024 * 1024));
  if (world > R && m.inter.alpha_s == 0 && m.inter.seconds_per_byte == 0)
    std::printf("# WARNING: the model has no inter-node terms (calibrated on one node?): groups across nodes cost nothing there;\n"
                "# give --inter-us / --inter-GBps, or calibrate on several nodes\n");
  std::printf("# time: one layer's forward exchanges (q,k,v seq->head + o head->seq) on the faster path; bytes: the busiest\n"
              "# rank's, per layer; memory: a rank's q,k,v,o in both shardings + workspaces, one layer%s\n",
              budget_bytes > 0 ? "; fits: within the budget" : "");
  std::printf("# paths: flat (the faster of one all-to-all-v and every message at once), 2-level (one inter-node message per node pair), rail (2-level, lanes 0);\n"
              "# nodes: nodes a Ulysses group spans; degrees that the mesh or the head counts refuse are not listed\n");
  if (bands.flops_per_s > 0) {
    char attn[64];
    if (bands.attention_ratio > 0) std::snprintf(attn, sizeof attn, "%.4g x the row's exchanges", bands.attention_ratio);
    else std::snprintf(attn, sizeof attn, "at %.4g TFLOP/s a rank, causal", bands.flops_per_s * 1e-12);
    std::printf("# bands: head bands G of the forward (best_bands(): seq->head of band g+1 and head->seq of g-1 on the link while band\n"
                "# g's attention runs; a band is a run of a rank's query heads: G <= H/P; 1 where overlap loses), attention\n"
                "# %s, %.4g us a call; band(ms): the exchanges the bands leave exposed (pipelined - attention)\n",
                attn, bands.overhead.exchange_call_s * 1e6);
  }
  std::printf("#%5s %6s %6s %-9s %10s %10s %11s %10s %11s %11s %10s %5s %5s %9s\n", "P", "outer", "nodes", "path", "time(ms)", "flat(ms)",
              "2-level(ms)", "rail(ms)", "intra(MB)", "inter(MB)", "mem(GiB)", "fits", "bands", "band(ms)");
  for (const DegreeChoice& d : choices)
    std::printf(" %5d %6d %6d %-9s %10.3f %10.3f %11.3f %10.3f %11.1f %11.1f %10.2f %5s %5s %9.3f\n", d.ulysses_degree, d.outer_degree,
                d.nodes_per_group, d.path == Path::two_level ? (d.lanes == 0 ? "rail" : "2-level") : (d.path == Path::messages ? "flat-msg" : "flat"), d.seconds * 1e3,
                d.flat_seconds * 1e3, d.two_level_seconds * 1e3, d.rail_seconds * 1e3, d.intra_bytes / 1e6, d.inter_bytes / 1e6,
                d.activation_bytes / (1024.0 * 1024 * 1024), d.fits ? "yes" : "no",
                bands.flops_per_s > 0 ? std::to_string(d.bands.bands).c_str() : "-", bands.flops_per_s > 0 ? d.bands.exposed_s * 1e3 : d.seconds * 1e3);
  return 0;
}

/// Prints the Ulysses x Ring x outer layouts, best first (advise_hybrid()), causal.
inline int advise_hybrid_rows(const AttentionShape& shape, std::int64_t S, int world, int R, const CostModel& m, double flops_per_s,
                              ElementType type, std::int64_t batch, double budget_bytes, bool balanced, const Documents* docs = nullptr,
                              const std::string& docs_text = "one sequence", const BandOverhead* band_overhead = nullptr) {
  const auto choices = advise_hybrid(shape, S, world, R, m, flops_per_s, true, type, batch, balanced ? HeadPolicy::balanced : HeadPolicy::even,
                                     budget_bytes, docs, band_overhead);
  const std::string count = docs ? " (" + std::to_string(docs->non_empty()) + " non-empty documents)" : "";
  std::printf("# hybrid: Ulysses U inside a node first x ring R x outer (data parallel), causal %s, S=%lld: %s%s; attention at %.4g TFLOP/s a rank\n"
              "# time = Ulysses exchanges (q,k,v seq->head + o head->seq of a ring rank's tokens over U) + the ring's exposed\n"
              "# communication + its merges + the attention the slowest rank adds over the mean (imb) (kv: ring = RingRotation\n"
              "# overlapped with each step's attention, a merge a step;\n"
              "# allgather = the ring group's kv gathered once, nothing hidden, no merge); ring(ms): its whole communication;\n"
              "# attn(ms): the layer's attention; msgs: the pieces a kv block goes in (best_ring_messages(): RingConfig::messages;\n"
              "# > 1 only under a per-flow cap, --intra-flow-GBps / --inter-flow-GBps); bytes per rank a layer; G, banded(ms):\n"
              "# the head bands (bands x ring steps) and what the layout adds to the attention in them, ranked by it, with\n"
              "# --band-call-us given (%s)\n",
              docs ? "per-document zigzag" : "zigzag", static_cast<long long>(S), docs_text.c_str(), count.c_str(), flops_per_s * 1e-12,
              band_overhead ? ("each call " + std::to_string(band_overhead->exchange_call_s * 1e6) + " us").c_str() : "not given: '-'");
  std::printf("#%4s %5s %6s %-9s %4s %10s %11s %11s %10s %9s %10s %9s %11s %11s %10s %5s %3s %10s  %s\n", "U", "R", "outer", "kv", "msgs", "time(ms)",
              "ulysses(ms)", "exposed(ms)", "merge(ms)", "imb(ms)", "ring(ms)", "attn(ms)", "intra(MB)", "inter(MB)", "mem(GiB)", "fits", "G",
              "banded(ms)", "why");
  for (const HybridChoice& h : choices) {
    char banded[32] = "-";
    if (band_overhead) std::snprintf(banded, sizeof banded, "%.3f", h.banded_seconds * 1e3);
    std::printf(" %4d %5d %6d %-9s %4s %10.3f %11.3f %11.3f %10.3f %9.3f %10.3f %9.3f %11.1f %11.1f %10.2f %5s %3s %10s  %s\n", h.ulysses_degree,
                h.ring_degree, h.outer_degree, to_string(h.kv), h.messages > 0 ? std::to_string(h.messages).c_str() : "-", h.seconds * 1e3,
                h.ulysses.seconds * 1e3, h.ring.exposed_seconds * 1e3, h.ring.merge_seconds * 1e3, h.ring.imbalance_seconds * 1e3,
                h.ring.comm_seconds * 1e3, h.ring.compute_seconds * 1e3, h.intra_bytes / 1e6, h.inter_bytes / 1e6,
                h.activation_bytes / (1024.0 * 1024 * 1024), h.fits ? "yes" : "no",
                band_overhead ? std::to_string(h.bands.bands).c_str() : "-", banded, h.reason.c_str());
  }
  return 0;
}

#if ULYSSES_PERF_JSON
using nlohmann::json;

/// One timed exchange of a ulysses_perf --json file, with the traffic the model sees.
struct Measured {
  std::string backend, label;
  ExchangeTraffic traffic;
  double seconds = 0;         ///< measured (the mean over runs)
  std::vector<double> runs;   ///< each run's time / mean - 1 (several runs only)
};

inline ElementType type_named(const std::string& s) {
  for (ElementType t : {ElementType::float32, ElementType::bfloat16, ElementType::float16, ElementType::float64})
    if (s == to_string(t)) return t;
  throw Error(Errc::invalid_shape, "unknown dtype '" + s + "'");
}
inline Format format_named(const std::string& s) {
  for (Format f : {Format::bshd, Format::sbhd, Format::bhsd})
    if (s == to_string(f)) return f;
  throw Error(Errc::invalid_shape, "unknown layout '" + s + "'");
}
inline Path path_named(const std::string& s) {
  for (Path p : {Path::alltoallv, Path::messages, Path::direct, Path::two_level})
    if (s == to_string(p)) return p;
  throw Error(Errc::invalid_shape, "unknown path '" + s + "'");
}

/// Reads ulysses_perf --json files and re-plans every row (rank 0's plan: the largest share of a
/// balanced split) to count its traffic. Rows of the same exchange in several files (independent
/// runs) become one, with the mean time and each run's deviation from it in `runs`.
inline std::vector<Measured> read_measurements(const std::vector<std::string>& files);

/// One run's rows, not merged.
inline std::vector<Measured> read_runs(const std::vector<std::string>& files) {
  std::vector<Measured> out;
  for (const std::string& f : files) {
    std::ifstream in(f);
    if (!in) throw Error(Errc::invalid_shape, "cannot read " + f);
    const json j = json::parse(in);
    const AttentionShape shape{j.at("heads").get<std::int64_t>(), j.at("kv_heads").get<std::int64_t>(), j.at("head_dim").get<std::int64_t>(),
                               j.at("v_head_dim").get<std::int64_t>()};
    const ElementType type = type_named(j.at("dtype").get<std::string>());
    const Format layout = format_named(j.at("layout").get<std::string>());
    const int P = j.at("ranks").get<int>(), R = j.value("ranks_per_node", 0), lanes = j.value("lanes", 1);
    const std::int64_t B = j.at("batch").get<std::int64_t>();
    const HeadPolicy policy = j.value("balanced", false) ? HeadPolicy::balanced : HeadPolicy::even;
    const AttentionSpecs a = attention_specs<float>(P, shape, ElementType::float32, policy);
    auto retype = [type](std::vector<TensorSpec> v) {
      for (TensorSpec& x : v) {
        x.elem_bytes = size_of(type);
        x.type = type;
      }
      return v;
    };
    for (const json& row : j.at("rows")) {
      const std::string dir = row.at("direction").get<std::string>();
      const bool qkv = dir.rfind("seq_to_head", 0) == 0, backward = dir.find("_backward") != std::string::npos;
      const Direction d = qkv != backward ? Direction::seq_to_head : Direction::head_to_seq;
      const Path path = path_named(row.at("path").get<std::string>());
      PlanOptions o;
      o.path = path;
      if (R > 0) o.nodes = NodeLayout::uniform(P, R);
      o.lanes = lanes;
      const std::int64_t S = row.at("S").get<std::int64_t>();
      const Plan plan({P, 0}, B, SeqPartition::balanced(S, P), retype(qkv ? a.qkv() : a.out()), layout, o);
      Measured m;
      m.backend = j.at("backend").get<std::string>() +
                  (R > 0 ? " (nodes of " + std::to_string(R) + (lanes != 1 ? ", lanes " + std::to_string(lanes) : "") + ")" : "");
      m.label = j.at("model").get<std::string>() + " P=" + std::to_string(P) + " S=" + std::to_string(S) + " " + dir + " " + to_string(path);
      m.traffic = exchange_traffic(plan, d, path);
      m.seconds = row.at("time_us").get<double>() * 1e-6;
      out.push_back(m);
    }
  }
  return out;
}

inline std::vector<Measured> read_measurements(const std::vector<std::string>& files) {
  std::vector<Measured> all = read_runs(files), out;
  std::map<std::string, std::size_t> at;
  std::vector<std::vector<double>> times;
  for (const Measured& m : all) {
    const std::string key = m.backend + "|" + m.label;
    if (!at.count(key)) {
      at[key] = out.size();
      out.push_back(m);
      times.emplace_back();
    }
    times[at[key]].push_back(m.seconds);
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    double mean = 0;
    for (double t : times[i]) mean += t;
    mean /= static_cast<double>(times[i].size());
    out[i].seconds = mean;
    out[i].runs.clear();
    if (times[i].size() > 1)
      for (double t : times[i]) out[i].runs.push_back(t / mean - 1);
  }
  return out;
}

/// The transport family of a backend name: "local", "mpi" (simulated nodes use the MPI fit).
inline std::string family(const std::string& backend) { return backend.substr(0, backend.find(' ')); }

/// Whether `file` is Google Benchmark JSON (bench_ring / bench_ring_mpi: a "benchmarks" array).
inline bool benchmark_json(const std::string& file) {
  std::ifstream in(file);
  if (!in) throw Error(Errc::invalid_shape, "cannot read " + file);
  return json::parse(in).contains("benchmarks");
}

/// --fit's per-flow cap (fit_flow_cost()) of each backend family from the bare ring steps of
/// bench_ring / bench_ring_mpi JSON in `files` (read_ring_rows(): the "ring_step" rows whose
/// variant ends in "sendrecv", a `messages` counter giving the pieces of the block, 1 when absent):
/// fitted, on `models`' other parameters (`base` for a family without one), only for a family
/// with steps of 1 and of several messages; `models` updated. Defined after read_ring_rows().
inline void fit_ring_flows(const std::vector<std::string>& files, std::map<std::string, CostModel>& models, const CostModel& base);

/// --fit: one model per backend family, written to `out_file`; prints the parameters and the
/// in-sample error distribution. `base`: what the fit keeps (its ranks_per_nic, per-flow caps, and
/// the parameters no sample sees: fit_cost_model()). Files of Google Benchmark JSON among `files`
/// are ring steps: they fit the per-flow cap (fit_ring_flows()), written as intra_flow_GBps /
/// inter_flow_GBps when > 0 (absent: no cap).
inline int fit(const std::string& out_file, const std::vector<std::string>& files, const CostModel& base = {}) {
  std::vector<std::string> exchanges, rings;
  for (const std::string& f : files) (benchmark_json(f) ? rings : exchanges).push_back(f);
  const std::vector<Measured> ms = read_measurements(exchanges);
  std::map<std::string, std::vector<CostSample>> by;
  for (const Measured& m : ms) by[family(m.backend)].push_back({m.traffic, m.seconds});
  std::map<std::string, CostModel> models;
  for (const auto& [backend, samples] : by) models[backend] = fit_cost_model(samples, base);
  if (!rings.empty()) fit_ring_flows(rings, models, base);
  json j;
  j["tool"] = "ulysses_perf --fit";
  j["inputs"] = files;
  for (const auto& [backend, c] : models) {
    const std::size_t n = by.count(backend) ? by[backend].size() : 0;
    std::printf("# %s: %zu exchanges -> %s\n", backend.c_str(), n, c.str().c_str());
    j["models"][backend] = {{"intra_alpha_us", c.intra.alpha_s * 1e6}, {"intra_GBps", c.intra.GBps()},
                            {"inter_alpha_us", c.inter.alpha_s * 1e6}, {"inter_GBps", c.inter.GBps()},
                            {"copy_GBps", c.copy_seconds_per_byte > 0 ? 1e-9 / c.copy_seconds_per_byte : 0.0},
                            {"cache_MiB", c.cache_bytes / 1048576.0},
                            {"intra_cached_GBps", c.intra_cached_seconds_per_byte > 0 ? 1e-9 / c.intra_cached_seconds_per_byte : 0.0},
                            {"copy_cached_GBps", c.copy_cached_seconds_per_byte > 0 ? 1e-9 / c.copy_cached_seconds_per_byte : 0.0},
                            {"row_ns", c.copy_seconds_per_row * 1e9},
                            {"round_us", c.round_seconds * 1e6},
                            {"intra_latency_us", c.intra.latency_s * 1e6},
                            {"inter_latency_us", c.inter.latency_s * 1e6},
                            {"ranks_per_nic", c.ranks_per_nic},
                            {"samples", n}};
    if (c.intra.flow_seconds_per_byte > 0) j["models"][backend]["intra_flow_GBps"] = c.intra.flow_GBps();
    if (c.inter.flow_seconds_per_byte > 0) j["models"][backend]["inter_flow_GBps"] = c.inter.flow_GBps();
  }
  std::ofstream o(out_file);
  o << j.dump(1) << "\n";
  if (!o) throw Error(Errc::invalid_shape, "cannot write " + out_file);
  std::printf("# wrote %s\n", out_file.c_str());
  return 0;
}

/// The model of backend family `backend` in a --fit file.
inline CostModel load_model(const std::string& file, const std::string& backend) {
  std::ifstream in(file);
  if (!in) throw Error(Errc::invalid_shape, "cannot read " + file);
  const json j = json::parse(in);
  if (!j.contains("models") || !j["models"].contains(backend))
    throw Error(Errc::invalid_shape, file + " has no model for backend '" + backend + "'");
  const json& m = j["models"][backend];
  LinkFlags f;
  f.intra_us = m.at("intra_alpha_us").get<double>();
  f.intra_GBps = m.at("intra_GBps").get<double>();
  f.inter_us = m.at("inter_alpha_us").get<double>();
  f.inter_GBps = m.at("inter_GBps").get<double>();
  f.copy_GBps = m.at("copy_GBps").get<double>();
  f.cache_MiB = m.value("cache_MiB", 0.0);
  f.intra_cached_GBps = m.value("intra_cached_GBps", 0.0);
  f.copy_cached_GBps = m.value("copy_cached_GBps", 0.0);
  f.row_ns = m.value("row_ns", 0.0);
  f.round_us = m.value("round_us", 0.0);
  f.intra_latency_us = m.value("intra_latency_us", 0.0);
  f.inter_latency_us = m.value("inter_latency_us", 0.0);
  f.ranks_per_nic = m.value("ranks_per_nic", 1.0);
  f.intra_flow_GBps = m.value("intra_flow_GBps", 0.0);
  f.inter_flow_GBps = m.value("inter_flow_GBps", 0.0);
  return f.apply(CostModel{});
}

/// --check: the model of each row's backend family (from `params`) against the measurements:
/// every row, then per backend the distribution of |predicted / measured - 1|.
inline int check(const std::string& params, const std::vector<std::string>& files, bool rows) {
  const std::vector<Measured> ms = read_measurements(files);
  std::map<std::string, std::vector<double>> err, noise;
  std::map<std::string, CostModel> models;
  if (rows) std::printf("#%-58s %-22s %12s %12s %8s\n", "exchange", "backend", "measured(us)", "model(us)", "error");
  for (const Measured& m : ms) {
    const std::string fam = family(m.backend);
    if (!models.count(fam)) models[fam] = load_model(params, fam);
    const double pred = predict_seconds(m.traffic, models[fam]);
    const double e = pred / m.seconds - 1;
    err[m.backend].push_back(std::fabs(e));
    for (double d : m.runs) noise[m.backend].push_back(std::fabs(d));
    if (rows) std::printf(" %-58s %-22s %12.1f %12.1f %+7.1f%%\n", m.label.c_str(), m.backend.c_str(), m.seconds * 1e6, pred * 1e6, e * 100);
  }
  int over = 0;
  auto line = [](const std::string& what, std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    auto q = [&](double f) { return v[std::min(v.size() - 1, static_cast<std::size_t>(f * static_cast<double>(v.size())))]; };
    const auto within = std::count_if(v.begin(), v.end(), [](double x) { return x <= 0.15; });
    std::printf(" %-34s %6zu %7.1f%% %7.1f%% %7.1f%% %7.1f%% %8.1f%%\n", what.c_str(), v.size(), q(0.5) * 100, q(0.9) * 100, q(0.99) * 100,
                v.back() * 100, 100.0 * static_cast<double>(within) / static_cast<double>(v.size()));
    return static_cast<int>(v.size()) - static_cast<int>(within);
  };
  std::printf("# |model / measured - 1| (measured: the mean over runs); noise: |run / mean - 1| of each run\n");
  std::printf("#%-34s %6s %8s %8s %8s %8s %9s\n", "backend", "n", "median", "p90", "p99", "max", "<=15%");
  for (auto& [backend, v] : err) {
    over += line(backend + ": model", v);
    if (noise.count(backend)) line(backend + ": noise of one run", noise[backend]);
  }
  return over ? 1 : 0;
}

/// One ring benchmark row of bench_ring / bench_ring_mpi (Google Benchmark JSON), the fastest repetition.
struct RingRow {
  std::string name, family, variant;
  int R = 0;
  double seconds = 0;  ///< per iteration (a whole rotation)
  double steps = 1, block_bytes = 0, bare_step_s = 0, compute_s = 0, exposed_step_s = 0;
  double step_s = 0;   ///< a transfer step's time: step_median_s when given, else seconds / steps
  int messages = 1;    ///< pieces a block goes in (the `messages` counter; 1 when absent)
};

/// The ring rows of Google Benchmark JSON files: "<family>/bf16/S:<S>/P:<R>/<case>/<variant>".
inline std::vector<RingRow> read_ring_rows(const std::vector<std::string>& files) {
  std::map<std::string, RingRow> best;
  for (const std::string& f : files) {
    std::ifstream in(f);
    if (!in) throw Error(Errc::invalid_shape, "cannot read " + f);
    const json j = json::parse(in);
    for (const json& b : j.value("benchmarks", json::array())) {
      if (b.value("run_type", "iteration") != "iteration" || b.value("error_occurred", false)) continue;
      std::string name = b.value("run_name", b.at("name").get<std::string>());
      for (const char* suf : {"/manual_time", "/real_time"})
        if (name.size() > std::strlen(suf) && name.compare(name.size() - std::strlen(suf), std::string::npos, suf) == 0)
          name.resize(name.size() - std::strlen(suf));
      if (name.rfind("ring_", 0) != 0) continue;
      RingRow r;
      r.name = name;
      r.family = name.substr(0, name.find('/'));
      const std::size_t p = name.find("/P:");
      r.R = std::stoi(name.substr(p + 3));
      r.variant = name.substr(name.find('/', p + 1) + 1);
      const std::string unit = b.value("time_unit", "ns");
      r.seconds = b.at("real_time").get<double>() * (unit == "ms" ? 1e-3 : unit == "us" ? 1e-6 : unit == "s" ? 1.0 : 1e-9);
      r.steps = b.value("steps", 1.0);
      r.block_bytes = b.value("block_bytes", 0.0);
      r.bare_step_s = b.value("bare_step_s", 0.0);
      r.compute_s = b.value("compute_s", 0.0);
      r.exposed_step_s = b.value("exposed_step_s", 0.0);
      r.step_s = b.value("step_median_s", r.seconds / r.steps);
      r.messages = static_cast<int>(b.value("messages", 1.0));
      auto it = best.find(name);
      if (it == best.end() || r.seconds < it->second.seconds) best[name] = r;
    }
  }
  std::vector<RingRow> v;
  for (auto& kv : best) v.push_back(kv.second);
  return v;
}

inline void fit_ring_flows(const std::vector<std::string>& files, std::map<std::string, CostModel>& models, const CostModel& base) {
  std::map<std::string, std::vector<FlowSample>> by;
  std::map<std::string, bool> split;
  for (const RingRow& r : read_ring_rows(files)) {
    const std::string b = r.family.find("local") != std::string::npos ? "local" : "mpi";
    if (b == "local" || r.family.rfind("ring_step", 0) != 0 || r.variant.size() < 8 ||
        r.variant.compare(r.variant.size() - 8, 8, "sendrecv") != 0)
      continue;  // in process a step is a copy: no per-flow cap
    const int k = std::max(1, std::min(kMaxRingMessages, r.messages));
    by[b].push_back(ring_flow_sample(ring_step_traffic(Mesh(r.R, 1, r.R, r.R), r.block_bytes, RingTransport::network, k), r.step_s));
    split[b] = split[b] || k > 1;
  }
  for (auto& [b, samples] : by) {
    if (!split[b]) {
      std::printf("# %s: %zu ring steps, all of one message: the per-flow cap not fitted (give --intra-flow-GBps)\n", b.c_str(), samples.size());
      continue;
    }
    if (!models.count(b)) models[b] = base;
    models[b] = fit_flow_cost(samples, models[b]);
    std::printf("# %s: %zu ring steps of 1 and more messages -> one message <= %.4g GB/s inside a node\n", b.c_str(), samples.size(),
                models[b].intra.flow_GBps());
  }
}

/// --check-ring: the model's ring step (tune/ring_cost.hpp: one message of the block a step, or the
/// row's `messages` pieces, ring_step_seconds(); in process one copy; the ring fit is
/// fit_cost_model()'s, linear: it does not fit the per-flow cap, which only the exchange fit's
/// PARAMS carries) against bench_ring / bench_ring_mpi, as Markdown: (1) out of sample, with
/// the exchanges' fit in `params` (backend local / mpi); (2) the model fitted (fit_cost_model())
/// to the bare send/recv rows of the ring itself, checked on the rotation rows; (3) the exposed
/// communication predicted as max(0, comm - compute) with comm the model's step (2) and compute
/// the measured stand-in, against the measured exposed part.
inline int check_ring(const std::string& params, const std::vector<std::string>& files) {
  const std::vector<RingRow> rows = read_ring_rows(files);
  if (rows.empty()) throw Error(Errc::invalid_shape, "--check-ring: no ring_* benchmarks in the files");
  auto backend = [](const RingRow& r) { return r.family.find("local") != std::string::npos ? std::string("local") : std::string("mpi"); };
  auto step = [&](const RingRow& r) {  // the row's block in its `messages` pieces (1 when the row has no such counter)
    return ring_step_traffic(Mesh(r.R, 1, r.R, r.R), r.block_bytes,
                             backend(r) == "local" ? RingTransport::shared_memory : RingTransport::network,
                             std::max(1, std::min(kMaxRingMessages, r.messages)));
  };
  auto traffic = [&](const RingRow& r) { return step(r).step; };
  std::map<std::string, CostModel> exch, ring;
  std::map<std::string, std::vector<CostSample>> bare;
  for (const RingRow& r : rows) {
    if (!exch.count(backend(r))) exch[backend(r)] = load_model(params, backend(r));
    if (r.family.rfind("ring_step", 0) == 0 && r.variant.size() >= 8 && r.variant.compare(r.variant.size() - 8, 8, "sendrecv") == 0)
      bare[backend(r)].push_back({traffic(r), r.step_s});
  }
  for (auto& [b, samples] : bare) ring[b] = fit_cost_model(samples, exch[b]);
  std::printf("## The cost model's ring step against the measurements\n\n"
              "Model (tune/ring_cost.hpp): a transfer step is one message of the block, or a row's `messages` pieces of it "
              "(ring_step_seconds(); in process: one copy of it, `RingTransport::shared_memory`). **exchange fit**: the parameters `%s` fitted to the Ulysses exchanges "
              "(`ulysses_perf --fit`), applied out of sample; **ring fit**: `fit_cost_model()` on this run's bare send/recv "
              "rows (in sample for them), applied to the rotations. Measured: a step of the median iteration "
              "(step_median_s). Error = model / measured - 1.\n\n",
              params.c_str());
  for (auto& [b, m] : ring) std::printf("- ring fit, %s: %s\n", b.c_str(), m.str().c_str());
  std::printf("\n| benchmark | block MiB | measured step ms | exchange fit ms | error | ring fit ms | error |\n|---|---:|---:|---:|---:|---:|---:|\n");
  std::map<std::string, std::vector<double>> err_x, err_r;
  for (const RingRow& r : rows) {
    if (r.family.rfind("ring_step", 0) != 0) continue;
    const double meas = r.step_s, px = ring_step_seconds(step(r), exch[backend(r)]), pr = ring_step_seconds(step(r), ring[backend(r)]);
    const std::string kind = backend(r) + (r.variant.find("sendrecv") != std::string::npos ? " sendrecv" : " rotation");
    err_x[kind].push_back(std::fabs(px / meas - 1));
    err_r[kind].push_back(std::fabs(pr / meas - 1));
    std::printf("| %s | %.2f | %.3f | %.3f | %+.0f%% | %.3f | %+.0f%% |\n", r.name.c_str(), r.block_bytes / 1048576.0, meas * 1e3, px * 1e3,
                (px / meas - 1) * 100, pr * 1e3, (pr / meas - 1) * 100);
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  std::printf("\n| rows | n | median abs error, exchange fit | median abs error, ring fit |\n|---|---:|---:|---:|\n");
  for (auto& [k, v] : err_x) std::printf("| %s | %zu | %.0f%% | %.0f%% |\n", k.c_str(), v.size(), med(v) * 100, med(err_r[k]) * 100);
  std::printf("\n### Exposed communication: max(0, comm - compute) against the measurement\n\n"
              "The overlap model (ring_cost(): exposed = max(0, comm - compute) a step; in_start: nothing overlaps, "
              "exposed = comm) with compute = the stand-in's measured duration and comm = (a) the bare step measured in the "
              "same benchmark, (b) the ring fit's step. Errors in units of the measured bare step: "
              "(predicted - measured exposed) / bare step.\n\n"
              "| benchmark | bare step ms | compute ms | measured exposed ms | (a) predicted ms | (a) error | (b) predicted ms | (b) error |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|\n");
  std::map<std::string, std::vector<double>> err_a, err_b;
  for (const RingRow& r : rows) {
    if (r.family.rfind("ring_exposed", 0) != 0 || r.bare_step_s <= 0) continue;
    const bool overlaps = r.variant.find("in_start") == std::string::npos;
    auto exposed = [&](double comm) { return overlaps ? std::max(0.0, comm - r.compute_s) : comm; };
    const double pa = exposed(r.bare_step_s), pb = exposed(ring_step_seconds(step(r), ring[backend(r)]));
    const double ea = (pa - r.exposed_step_s) / r.bare_step_s, eb = (pb - r.exposed_step_s) / r.bare_step_s;
    const std::string k = backend(r) + (overlaps ? " thread" : " in_start");
    err_a[k].push_back(std::fabs(ea));
    err_b[k].push_back(std::fabs(eb));
    std::printf("| %s | %.3f | %.3f | %.3f | %.3f | %+.2f | %.3f | %+.2f |\n", r.name.c_str(), r.bare_step_s * 1e3, r.compute_s * 1e3,
                r.exposed_step_s * 1e3, pa * 1e3, ea, pb * 1e3, eb);
  }
  std::printf("\n| rows | n | median abs error / bare step, (a) | (b) |\n|---|---:|---:|---:|\n");
  for (auto& [k, v] : err_a) std::printf("| %s | %zu | %.2f | %.2f |\n", k.c_str(), v.size(), med(v), med(err_b[k]));
  return 0;
}
#endif

}  // namespace perf_model
