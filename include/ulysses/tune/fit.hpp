// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Calibration of the α-β cost model (tune/cost.hpp) from measured exchanges:
///        CostSample and fit_cost_model(), a non-negative least-squares fit on the relative error.
///
/// Each sample is the traffic of one exchange (exchange_traffic()) and its measured time, e.g. the
/// rows of `ulysses_perf --json` (`ulysses_perf --fit`, `--calibrate`). The fit minimises
/// Σ (predicted / measured − 1)² over the parameters ≥ 0 by solving the normal equations of every
/// subset of the parameters (Gauss-Jordan elimination with partial pivoting; 2^9 − 1 subsets of at
/// most 9 unknowns) and keeping the best fit whose parameters are all ≥ 0. The minimum of the
/// non-negative problem is the unconstrained fit on its set of non-zero parameters (the active-set
/// view of Lawson & Hanson's NNLS, "Solving Least Squares Problems", 1974, chapter 23), so the
/// enumeration, cheap at this size, finds it.
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

ULYSSES_NAMESPACE_END
