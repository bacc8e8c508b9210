// Robust Levenberg-Marquardt fit of a cluster's free parameters, and leave-one-out (fit.hpp).
#include "lab/fit.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace loom::fit {

namespace {

using published::PreparedRow;

constexpr double kJacobianStep = 1e-4;  // in log(value + offset)
constexpr double kNotInformed = 1e-7;   // largest |d residual / d log value| of an idle parameter
constexpr double kBadResidual = 10;     // a prediction that is not a positive number
// Leave-one-out polishes the chord method's result with true Jacobians until a step is below
// this (Gauss-Newton steps shrink geometrically, so the result is within about this of the
// optimum without the row).
constexpr double kPolishTolerance = 1e-4;

// The problem in log coordinates u = log(value + offset), clamped to the box.
class Problem {
 public:
  Problem(const profiles::Cluster& cluster, const std::vector<PreparedRow>& rows,
          std::vector<ParameterSpec> parameters, const FitOptions& options)
      : cluster_(cluster), rows_(rows), parameters_(std::move(parameters)), options_(options) {
    for (std::size_t r = 0; r < rows_.size(); ++r) {
      const published::RowResult& row = rows_[r].result;
      if (row.measured > 0 && !row.oom && !row.doubtful) residuals_.push_back({r, false});
      if (row.measured_memory_gib && !row.doubtful) residuals_.push_back({r, true});
    }
    active_.assign(residuals_.size(), true);
  }

  std::size_t size() const { return parameters_.size(); }
  std::size_t num_residuals() const { return residuals_.size(); }
  const std::vector<ParameterSpec>& parameters() const { return parameters_; }

  double to_u(std::size_t i, double value) const { return std::log(value + parameters_[i].offset); }
  double to_value(std::size_t i, double u) const { return std::exp(u) - parameters_[i].offset; }
  double clamp(std::size_t i, double u) const {
    return std::clamp(u, to_u(i, parameters_[i].lower), to_u(i, parameters_[i].upper));
  }
  std::vector<double> values(const std::vector<double>& u) const {
    std::vector<double> out(u.size());
    // exp(log(x)) can land an ulp beyond a bound (a ceiling at its peak): keep it inside.
    for (std::size_t i = 0; i < u.size(); ++i) {
      out[i] = std::clamp(to_value(i, u[i]), parameters_[i].lower, parameters_[i].upper);
    }
    return out;
  }
  profiles::Cluster cluster_at(const std::vector<double>& u) const {
    return with_parameters(cluster_, parameters_, values(u));
  }

  // Every row's figures at u (only rows that have a residual).
  std::vector<published::RowFigures> predict(const std::vector<double>& u) const {
    const profiles::Cluster c = cluster_at(u);
    std::vector<published::RowFigures> out(rows_.size());
    std::vector<bool> done(rows_.size(), false);
    for (const auto& [row, memory] : residuals_) {
      if (done[row]) continue;
      out[row] = published::predict_prepared(rows_[row], c);
      done[row] = true;
    }
    return out;
  }

  std::vector<double> residuals(const std::vector<double>& u) const {
    const std::vector<published::RowFigures> f = predict(u);
    std::vector<double> out(residuals_.size());
    for (std::size_t k = 0; k < residuals_.size(); ++k) {
      const auto& [row, memory] = residuals_[k];
      const published::RowResult& r = rows_[row].result;
      const double predicted = memory ? f[row].memory_gib : f[row].throughput;
      const double measured = memory ? *r.measured_memory_gib : r.measured;
      out[k] =
          predicted > 0 && std::isfinite(predicted) ? std::log(predicted / measured) : kBadResidual;
    }
    return out;
  }

  // Forward differences, backward at the upper bound.
  std::vector<std::vector<double>> jacobian(const std::vector<double>& u,
                                            const std::vector<double>& r0) const {
    std::vector<std::vector<double>> out(size());  // out[i][k] = d r_k / d u_i
    for (std::size_t i = 0; i < size(); ++i) {
      std::vector<double> v = u;
      double h = kJacobianStep;
      if (clamp(i, u[i] + h) < u[i] + h) h = -h;
      v[i] = u[i] + h;
      const std::vector<double> r1 = residuals(v);
      out[i].resize(r0.size());
      for (std::size_t k = 0; k < r0.size(); ++k) out[i][k] = (r1[k] - r0[k]) / h;
    }
    return out;
  }

  // Residuals of `row` are left out of the loss (leave-one-out), or all are used.
  void leave_out(std::optional<std::size_t> row) {
    for (std::size_t k = 0; k < residuals_.size(); ++k) {
      active_[k] = !row || residuals_[k].first != *row;
    }
  }

  // The prior counts as one residual of the loss scale's size per parameter: a parameter moved by
  // prior_sigma costs what one row off by loss_scale does.
  double prior_weight() const { return options_.loss_scale * options_.loss_scale; }

  double weight(double r) const {
    const double f = options_.loss_scale;
    return 1 / std::sqrt(1 + (r / f) * (r / f));
  }
  double loss(const std::vector<double>& u, const std::vector<double>& r) const {
    const double f = options_.loss_scale;
    double out = 0;
    for (std::size_t k = 0; k < r.size(); ++k) {
      if (active_[k]) out += 2 * f * f * (std::sqrt(1 + (r[k] / f) * (r[k] / f)) - 1);
    }
    for (std::size_t i = 0; i < u.size(); ++i) {
      const double d = (u[i] - to_u(i, parameters_[i].centre)) / options_.prior_sigma;
      out += prior_weight() * d * d;
    }
    return out;
  }

  // The Gauss-Newton system of the reweighted problem: H = J^T W J + P, g = J^T W r + P (u - c).
  void normal_equations(const std::vector<double>& u, const std::vector<double>& r,
                        const std::vector<std::vector<double>>& jac,
                        std::vector<std::vector<double>>* h, std::vector<double>* g) const {
    const std::size_t n = size();
    h->assign(n, std::vector<double>(n, 0));
    g->assign(n, 0);
    const double prior = prior_weight() / (options_.prior_sigma * options_.prior_sigma);
    for (std::size_t k = 0; k < r.size(); ++k) {
      if (!active_[k]) continue;
      const double w = weight(r[k]);
      for (std::size_t i = 0; i < n; ++i) {
        (*g)[i] += jac[i][k] * w * r[k];
        for (std::size_t j = 0; j < n; ++j) (*h)[i][j] += jac[i][k] * w * jac[j][k];
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      (*h)[i][i] += prior;
      (*g)[i] += prior * (u[i] - to_u(i, parameters_[i].centre));
    }
  }

  const std::vector<PreparedRow>& rows() const { return rows_; }
  const std::vector<std::pair<std::size_t, bool>>& residual_rows() const { return residuals_; }
  bool active(std::size_t k) const { return active_[k]; }

 private:
  const profiles::Cluster& cluster_;
  const std::vector<PreparedRow>& rows_;
  std::vector<ParameterSpec> parameters_;
  FitOptions options_;
  std::vector<std::pair<std::size_t, bool>> residuals_;  // (row, memory?)
  std::vector<bool> active_;
};

// Solves a x = b (small, symmetric positive definite) by Gaussian elimination with pivoting.
std::vector<double> solve(std::vector<std::vector<double>> a, std::vector<double> b) {
  const std::size_t n = b.size();
  for (std::size_t c = 0; c < n; ++c) {
    std::size_t pivot = c;
    for (std::size_t r = c + 1; r < n; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    }
    std::swap(a[c], a[pivot]);
    std::swap(b[c], b[pivot]);
    if (a[c][c] == 0) continue;
    for (std::size_t r = c + 1; r < n; ++r) {
      const double f = a[r][c] / a[c][c];
      for (std::size_t k = c; k < n; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  std::vector<double> x(n, 0);
  for (std::size_t c = n; c-- > 0;) {
    double s = b[c];
    for (std::size_t k = c + 1; k < n; ++k) s -= a[c][k] * x[k];
    x[c] = a[c][c] != 0 ? s / a[c][c] : 0;
  }
  return x;
}

using Jacobian = std::vector<std::vector<double>>;

// Levenberg-Marquardt from u; returns the iterations run. With `fixed`, every iteration uses that
// Jacobian instead of a new one (a chord method: cheap steps towards the optimum, whose result
// the caller polishes with true Jacobians).
int minimise(const Problem& p, const FitOptions& options, std::vector<double>* u,
             const Jacobian* fixed = nullptr) {
  std::vector<double> r = p.residuals(*u);
  double current = p.loss(*u, r);
  double lambda = 1e-3;
  int iteration = 0;
  for (; iteration < options.max_iterations; ++iteration) {
    const Jacobian jac = fixed ? *fixed : p.jacobian(*u, r);
    std::vector<std::vector<double>> h;
    std::vector<double> g;
    p.normal_equations(*u, r, jac, &h, &g);
    bool accepted = false;
    double largest_step = 0;
    while (lambda < 1e10) {
      auto damped = h;
      for (std::size_t i = 0; i < damped.size(); ++i) damped[i][i] *= 1 + lambda;
      std::vector<double> minus_g(g.size());
      for (std::size_t i = 0; i < g.size(); ++i) minus_g[i] = -g[i];
      const std::vector<double> step = solve(damped, minus_g);
      std::vector<double> next = *u;
      largest_step = 0;
      for (std::size_t i = 0; i < next.size(); ++i) {
        next[i] = p.clamp(i, next[i] + step[i]);
        largest_step = std::max(largest_step, std::abs(next[i] - (*u)[i]));
      }
      if (largest_step == 0) break;
      const std::vector<double> rn = p.residuals(next);
      const double loss = p.loss(next, rn);
      if (loss <= current) {
        *u = next;
        r = rn;
        current = loss;
        lambda = std::max(lambda / 3, 1e-9);
        accepted = true;
        break;
      }
      // A step this small that does not lower the loss: converged (to the model's kinks).
      if (largest_step < options.step_tolerance) break;
      lambda *= 4;
    }
    // Converged when the last step accepted (or refused) was below the tolerance.
    if (!accepted || largest_step < options.step_tolerance) break;
  }
  return iteration + 1;
}

std::optional<double> pct(double predicted, double measured) {
  if (measured <= 0) return std::nullopt;
  return (predicted - measured) / measured * 100;
}

std::optional<double> median_abs(const std::vector<RowFit>& rows,
                                 std::optional<double> (RowFit::*error)() const) {
  std::vector<double> values;
  for (const RowFit& r : rows) {
    if (auto e = (r.*error)()) values.push_back(std::abs(*e));
  }
  return published::median(values);
}

}  // namespace

std::optional<double> RowFit::error_pct() const { return pct(predicted, measured); }
std::optional<double> RowFit::loo_error_pct() const { return pct(loo_predicted, measured); }
std::optional<double> RowFit::memory_error_pct() const {
  if (!measured_memory_gib) return std::nullopt;
  return pct(predicted_memory_gib, *measured_memory_gib);
}
std::optional<double> RowFit::loo_memory_error_pct() const {
  if (!measured_memory_gib) return std::nullopt;
  return pct(loo_predicted_memory_gib, *measured_memory_gib);
}

bool usable(const PreparedRow& row) {
  const published::RowResult& r = row.result;
  if (r.not_expressible || !r.mapping || r.doubtful) return false;
  return (r.measured > 0 && !r.oom) || r.measured_memory_gib.has_value();
}

FitResult calibrate(const profiles::Cluster& cluster, const std::vector<PreparedRow>& rows,
                    const FitOptions& options) {
  for (const PreparedRow& r : rows) {
    if (!usable(r)) throw std::invalid_argument("calibrate: row " + r.result.id + " is not usable");
  }
  if (rows.empty()) throw std::invalid_argument("calibrate: no rows");
  // Which parameters the rows inform: a residual moves when the parameter does.
  const std::vector<ParameterSpec> all = free_parameters(cluster);
  std::vector<ParameterSpec> informed;
  std::vector<bool> is_informed(all.size(), false);
  std::vector<bool> is_fixed(all.size(), false);
  for (std::size_t i = 0; i < all.size(); ++i) {
    is_fixed[i] =
        std::find(options.fixed.begin(), options.fixed.end(), all[i].name) != options.fixed.end();
  }
  {
    Problem probe(cluster, rows, all, options);
    std::vector<double> u(all.size());
    for (std::size_t i = 0; i < all.size(); ++i)
      u[i] = probe.clamp(i, probe.to_u(i, all[i].centre));
    const auto r0 = probe.residuals(u);
    const auto jac = probe.jacobian(u, r0);
    for (std::size_t i = 0; i < all.size(); ++i) {
      double largest = 0;
      for (double d : jac[i]) largest = std::max(largest, std::abs(d));
      is_informed[i] = largest > kNotInformed && !is_fixed[i];
      if (is_informed[i]) informed.push_back(all[i]);
    }
  }
  FitResult out;
  Problem p(cluster, rows, informed, options);
  std::vector<double> u(informed.size());
  for (std::size_t i = 0; i < informed.size(); ++i) {
    u[i] = p.clamp(i, p.to_u(i, informed[i].centre));
  }
  if (!informed.empty()) out.iterations = minimise(p, options, &u);
  out.cluster = p.cluster_at(u);

  // Uncertainty: diag((J^T W J + P)^-1) x the weighted residual variance, in value units.
  const std::vector<double> r = p.residuals(u);
  std::vector<double> sigma_u(informed.size(), 0);
  Jacobian full_jacobian;
  if (!informed.empty()) {
    full_jacobian = p.jacobian(u, r);
    std::vector<std::vector<double>> h;
    std::vector<double> g;
    p.normal_equations(u, r, full_jacobian, &h, &g);
    double sum = 0;
    for (double x : r) sum += p.weight(x) * x * x;
    const double dof =
        std::max<double>(1, static_cast<double>(r.size()) - static_cast<double>(informed.size()));
    const double variance = std::max(sum / dof, 1e-12);
    for (std::size_t i = 0; i < informed.size(); ++i) {
      std::vector<double> e(informed.size(), 0);
      e[i] = 1;
      sigma_u[i] = std::sqrt(std::max(0.0, solve(h, e)[i] * variance));
    }
  }
  std::size_t k = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    ParameterFit f{all[i].name, all[i].centre, all[i].start, 0, is_informed[i]};
    f.fixed = is_fixed[i];
    // Not informed: the cluster's value stays (a calibrated file keeps what it had).
    if (is_informed[i]) {
      f.value = p.to_value(k, u[k]);
      f.uncertainty = (f.value + informed[k].offset) * sigma_u[k];
      ++k;
    }
    out.parameters.push_back(f);
  }

  // In sample, then each row left out in turn.
  const std::vector<published::RowFigures> in_sample = p.predict(u);
  for (std::size_t row = 0; row < rows.size(); ++row) {
    const published::RowResult& res = rows[row].result;
    RowFit f;
    f.id = res.id;
    f.file = res.file;
    f.unit = res.unit;
    if (res.measured > 0 && !res.oom) f.measured = res.measured;
    f.measured_memory_gib = res.measured_memory_gib;
    f.predicted = f.loo_predicted = in_sample[row].throughput;
    f.predicted_memory_gib = f.loo_predicted_memory_gib = in_sample[row].memory_gib;
    if (options.leave_one_out && !informed.empty()) {
      // From the full fit: chord steps with its Jacobian, then Levenberg-Marquardt with true
      // Jacobians to convergence, so the result is the optimum without the row whatever the start.
      p.leave_out(row);
      std::vector<double> v = u;
      minimise(p, options, &v, &full_jacobian);
      FitOptions polish = options;
      polish.step_tolerance = kPolishTolerance;
      minimise(p, polish, &v);
      const published::RowFigures loo = published::predict_prepared(rows[row], p.cluster_at(v));
      f.loo_predicted = loo.throughput;
      f.loo_predicted_memory_gib = loo.memory_gib;
      p.leave_out(std::nullopt);
    }
    out.rows.push_back(f);
  }
  out.median_error_pct = median_abs(out.rows, &RowFit::error_pct);
  out.loo_median_error_pct = median_abs(out.rows, &RowFit::loo_error_pct);
  out.memory_median_error_pct = median_abs(out.rows, &RowFit::memory_error_pct);
  out.loo_memory_median_error_pct = median_abs(out.rows, &RowFit::loo_memory_error_pct);
  return out;
}

}  // namespace loom::fit
