// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Calibration of the α-β cost model (tune/cost.hpp) from measured exchanges:
///        CostSample and fit_cost_model(), a non-negative least-squares fit on the relative error;
///        the per-flow cap from steps of several messages: FlowSample and fit_flow_cost().
///
/// Each sample is the traffic of one exchange (exchange_traffic()) and its measured time, e.g. the
/// rows of `ulysses_perf --json` (`ulysses_perf --fit`). The fit minimises
/// Σ (predicted / measured − 1)² over the parameters ≥ 0 by solving the normal equations of every
/// subset of the parameters (Gauss-Jordan elimination with partial pivoting) and keeping the best
/// fit whose parameters are all ≥ 0: the minimum of the non-negative problem is the unconstrained
/// fit on its set of non-zero parameters (the active-set view of Lawson & Hanson's NNLS, "Solving
/// Least Squares Problems", 1974, chapter 23), so the enumeration, cheap at this size, finds it.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "cost.hpp"

ULYSSES_NAMESPACE_BEGIN

/// One measurement for fit_cost_model(): the traffic of an exchange and its measured time.
struct CostSample {
  ExchangeTraffic traffic;  ///< what the exchange moved (exchange_traffic() of its plan, direction and path)
  double seconds = 0;       ///< measured, > 0
};

namespace detail {

/// Unknowns of the fit: the model's parameters (cost_params()).
inline constexpr int kFitParams = static_cast<int>(kCostParams);

/// Solves the n x n linear system held as augmented rows A[0..n) (column n: the right-hand side)
/// in place, by Gauss-Jordan elimination with partial pivoting: on success unknown i is
/// A[i][n] / A[i][i]. False when a pivot falls below 1e-12 (singular at the columns' scale).
inline bool gauss_jordan(double (&A)[kFitParams][kFitParams + 1], int n) {
  for (int col = 0; col < n; ++col) {
    int piv = col;
    for (int r = col + 1; r < n; ++r)
      if (std::fabs(A[r][col]) > std::fabs(A[piv][col])) piv = r;
    if (std::fabs(A[piv][col]) < 1e-12) return false;
    for (int c2 = 0; c2 <= n; ++c2) std::swap(A[col][c2], A[piv][c2]);
    for (int r = 0; r < n; ++r) {
      if (r == col) continue;
      const double f = A[r][col] / A[col][col];
      for (int c2 = col; c2 <= n; ++c2) A[r][c2] -= f * A[col][c2];
    }
  }
  return true;
}

/// The least-squares fit of the parameters idx[0..n) (the others 0) to the samples' relative
/// error: row r of the problem is X[r] / seconds_r, each column divided by `scale`, target 1.
/// Writes the parameters (unscaled) to p; false when the normal equations are singular or a
/// parameter comes out negative.
inline bool fit_subset(const std::vector<std::array<double, kCostParams>>& X, const std::vector<CostSample>& samples,
                       const double (&scale)[kFitParams], const int (&idx)[kFitParams], int n, double (&p)[kFitParams]) {
  double A[kFitParams][kFitParams + 1] = {};  // normal equations of the weighted, scaled problem (target: time / time = 1)
  for (std::size_t r = 0; r < X.size(); ++r) {
    double x[kFitParams];
    for (int a = 0; a < n; ++a) x[a] = X[r][static_cast<std::size_t>(idx[a])] / samples[r].seconds / scale[idx[a]];
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) A[a][b] += x[a] * x[b];
      A[a][n] += x[a];
    }
  }
  if (!gauss_jordan(A, n)) return false;
  for (int a = 0; a < n; ++a) {
    const double v = A[a][n] / A[a][a];
    if (!(v >= 0)) return false;
    p[idx[a]] = v / scale[idx[a]];
  }
  return true;
}

/// Σ_r (prediction_r / seconds_r − 1)² of parameters p on features X.
inline double relative_error(const std::vector<std::array<double, kCostParams>>& X, const std::vector<CostSample>& samples,
                             const double (&p)[kFitParams]) {
  double err = 0;
  for (std::size_t r = 0; r < X.size(); ++r) {
    double pred = 0;
    for (int i = 0; i < kFitParams; ++i) pred += p[i] * X[r][static_cast<std::size_t>(i)];
    err += (pred / samples[r].seconds - 1) * (pred / samples[r].seconds - 1);
  }
  return err;
}

/// Error(invalid_shape) unless there are samples, every time is finite and > 0, and every count
/// of the traffic (and the working set) is finite and >= 0.
inline void check_samples(const std::vector<CostSample>& samples) {
  if (samples.empty()) fail(Errc::invalid_shape, "fit_cost_model: no samples");
  for (const CostSample& s : samples) {
    if (!(s.seconds > 0) || !std::isfinite(s.seconds))
      fail(Errc::invalid_shape, "fit_cost_model: a sample with time " + std::to_string(s.seconds) + " s (need finite, > 0)");
    for (double v : cost_features(s.traffic, 1, CostModel{}))
      if (!(v >= 0) || !std::isfinite(v))
        fail(Errc::invalid_shape, "fit_cost_model: a sample whose traffic has a negative or non-finite count (" + std::to_string(v) + ")");
    if (!(s.traffic.working_set_bytes >= 0) || !std::isfinite(s.traffic.working_set_bytes))
      fail(Errc::invalid_shape, "fit_cost_model: a sample with working set " + std::to_string(s.traffic.working_set_bytes));
  }
}

}  // namespace detail

/// Fits the model's parameters (α and λ of each link class, β of each and β_intra' of
/// cache-resident bytes, γ, γ', δ and ε; see tune/cost.hpp) to measurements by least squares on
/// the relative error (each sample weighted by 1 / its time), every parameter >= 0 (the best of
/// the exact fits over the subsets of parameters; see the file comment). The cache share C is
/// `base.cache_bytes` when > 0, else the best of 0 and 1 MiB .. 4 GiB in powers of 2. Parameters
/// whose features are 0 in every sample (e.g. the inter-node link on one machine) keep `base`'s
/// value. Which class of an overlapped round takes time depends on the parameters: the features
/// are taken with `base`'s, then again with the fit's, until the choice holds (at most 4 passes).
/// O(2^11 · (samples · 121 + 11^3)) per cache size and pass.
/// @param samples the measurements (at least one)
/// @param base    the model whose unseen parameters (and cache share, when > 0) the fit keeps
/// @throws Error(invalid_shape) no sample, a time not finite and > 0, or traffic with a negative or
///         non-finite count.
inline CostModel fit_cost_model(const std::vector<CostSample>& samples, const CostModel& base = {}) {
  detail::check_samples(samples);
  constexpr int K = detail::kFitParams;
  std::vector<double> caches;
  if (base.cache_bytes > 0) caches.push_back(base.cache_bytes);
  else {
    caches.push_back(0);
    for (int k = 0; k <= 12; ++k) caches.push_back(1048576.0 * static_cast<double>(1 << k));
  }
  double best_err = INFINITY;
  CostModel best_model = base;
  CostModel chooser = base;
  for (int pass = 0; pass < 4; ++pass) {
    for (double C : caches) {
      std::vector<std::array<double, detail::kCostParams>> X;
      for (const CostSample& s : samples) X.push_back(detail::cost_features(s.traffic, C, chooser));
      bool seen[K] = {};
      double scale[K] = {};  // columns differ by orders of magnitude: scale them before solving
      for (std::size_t r = 0; r < X.size(); ++r)
        for (int i = 0; i < K; ++i) {
          seen[i] = seen[i] || X[r][static_cast<std::size_t>(i)] != 0;
          scale[i] = std::max(scale[i], std::fabs(X[r][static_cast<std::size_t>(i)]) / samples[r].seconds);
        }
      for (unsigned mask = 1; mask < (1u << K); ++mask) {
        int idx[K] = {}, n = 0;
        bool usable = true;
        for (int i = 0; i < K; ++i)
          if ((mask >> i) & 1u) {
            usable = usable && seen[i];
            idx[n++] = i;
          }
        double p[K] = {};
        if (!usable || !detail::fit_subset(X, samples, scale, idx, n, p)) continue;
        const double err = detail::relative_error(X, samples, p);
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
    bool same = true;  // the fit's choice of the slower class in every overlapped round is the one its features assumed
    for (const CostSample& s : samples)
      same = same && detail::cost_features(s.traffic, best_model.cache_bytes, best_model) ==
                         detail::cost_features(s.traffic, best_model.cache_bytes, chooser);
    if (same) break;
    chooser = best_model;
  }
  return best_model;
}

/// One measured step for fit_flow_cost(): an exchange's traffic (a ring step's: ring_step_traffic(),
/// ring_flow_sample()), its largest message on each link class and its measured time.
struct FlowSample {
  ExchangeTraffic traffic;                 ///< what the step moved
  std::array<double, 2> largest_message{}; ///< bytes of its largest message per link class [intra, inter], >= 0
  double seconds = 0;                      ///< measured, > 0
};

namespace detail {
/// fit_flow_cost()'s fit of link class c's β_f (see there).
inline double fit_flow_class(const std::vector<FlowSample>& samples, const CostModel& m, std::size_t c) {
  struct Row {
    double brk, fixed, p, s;  // binds above brk; then predicts fixed + p·β_f
  };
  std::vector<Row> rows;
  for (const FlowSample& x : samples) {
    if (!(x.largest_message[c] > 0)) continue;
    const double link = link_byte_seconds(x.traffic, m)[c], p = x.largest_message[c];
    rows.push_back({link / p, predict_flow_seconds(x.traffic, x.largest_message, m) - link, p, x.seconds});
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.brk < b.brk; });
  auto error = [&rows](double f) {
    double e = 0;
    for (const Row& r : rows) {
      const double pred = std::max(r.fixed + r.brk * r.p, r.fixed + r.p * f);
      e += (pred / r.s - 1) * (pred / r.s - 1);
    }
    return e;
  };
  double best = 0, best_err = error(0), num = 0, den = 0;
  for (std::size_t j = 0; j < rows.size(); ++j) {  // β_f in [brk_j, brk_j+1): rows 0 .. j bind, a quadratic in β_f
    num += rows[j].p / rows[j].s * (1 - rows[j].fixed / rows[j].s);
    den += rows[j].p / rows[j].s * (rows[j].p / rows[j].s);
    const double hi = j + 1 < rows.size() ? rows[j + 1].brk : INFINITY;
    const double f = std::min(hi, std::max(rows[j].brk, den > 0 ? num / den : 0));
    const double e = error(f);
    if (e < best_err) {
      best = f;
      best_err = e;
    }
  }
  return best;
}
}  // namespace detail

/// Fits the per-flow cost β_f of each link class (LinkCost::flow_seconds_per_byte) to measured
/// steps whose messages are in flight together, e.g. ring steps of the same block sent as 1 and
/// as 2, 4, ... messages (ring_flow_sample()): least squares on the relative error of
/// predict_flow_seconds(), every other parameter `base`'s (α, β, λ: fit_cost_model() on the
/// exchanges, or on the one-message steps). The prediction is piecewise linear in β_f (a sample
/// binds once its largest message at β_f outlasts the link's bytes), so the fit solves each piece's
/// quadratic exactly and keeps the best, the smallest β_f of equal errors (0: no cap, when no
/// step is slower than `base` predicts). A class no sample's largest message crosses keeps base's
/// β_f. Separating β from β_f needs steps of several message counts: with one message a step β_f
/// only absorbs a single message's slower rate.
/// @param samples the measurements (at least one)
/// @param base    the model whose other parameters the fit keeps
/// @throws Error(invalid_shape) no sample, a time not finite and > 0, a largest message negative
///         or not finite, or traffic with a negative or non-finite count.
inline CostModel fit_flow_cost(const std::vector<FlowSample>& samples, const CostModel& base) {
  std::vector<CostSample> check;
  for (const FlowSample& x : samples) {
    check.push_back({x.traffic, x.seconds});
    for (double v : x.largest_message)
      if (!(v >= 0) || !std::isfinite(v)) detail::fail(Errc::invalid_shape, "fit_flow_cost: a largest message of " + std::to_string(v) + " bytes");
  }
  detail::check_samples(check);
  CostModel m = base;
  m.intra.flow_seconds_per_byte = 0;
  m.inter.flow_seconds_per_byte = 0;
  CostModel out = base;
  double* fitted[2] = {&out.intra.flow_seconds_per_byte, &out.inter.flow_seconds_per_byte};
  for (std::size_t c = 0; c < 2; ++c)
    if (std::any_of(samples.begin(), samples.end(), [c](const FlowSample& x) { return x.largest_message[c] > 0; }))
      *fitted[c] = detail::fit_flow_class(samples, m, c);
  return out;
}

ULYSSES_NAMESPACE_END
