// kiln::optim's learning-rate schedules (torch.optim.lr_scheduler), each as its closed form.
//
// A schedule only sets numbers the optimizer's groups hold; a traced step (jit::trace) reads
// those at each call (detail::traced_scalar), so the next replay after step() uses the new lr.
#include <algorithm>
#include <cmath>

#include "kiln/error.h"
#include "kiln/optim.h"

namespace kiln::optim {

LRScheduler::LRScheduler(Optimizer& optimizer, const char* name)
    : optimizer_(optimizer), name_(name) {
  KILN_CHECK(optimizer.num_param_groups() > 0, name_, ": the optimizer (", optimizer.name(),
             ") has no parameter group");
  for (size_t g = 0; g < optimizer.num_param_groups(); ++g)
    base_lrs_.push_back(optimizer.group_lr(g));
}

void LRScheduler::step() {
  const size_t groups = optimizer_.num_param_groups();
  KILN_CHECK(groups == base_lrs_.size(), name_, ": the optimizer (", optimizer_.name(), ") has ",
             groups, " parameter groups, it had ", base_lrs_.size(),
             " when the scheduler was made");
  // Every lr first: a schedule past its end raises before anything changes.
  std::vector<double> lrs(groups);
  for (size_t g = 0; g < groups; ++g) lrs[g] = lr_at(g, last_epoch_ + 1);
  ++last_epoch_;
  for (size_t g = 0; g < groups; ++g) optimizer_.group_lr(g) = lrs[g];
  last_lr_ = std::move(lrs);
  after_step();
}

// ---------------------------------------------------------------------------- StepLR

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer, "StepLR"), step_size_(step_size), gamma_(gamma) {
  KILN_CHECK(step_size > 0, name_, ": step_size must be positive, got ", step_size);
  initial_step();
}

double StepLR::lr_at(size_t group, int64_t epoch) const {
  return base_lrs_[group] * std::pow(gamma_, static_cast<double>(epoch / step_size_));
}

// ---------------------------------------------------------------------------- MultiStepLR

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer, "MultiStepLR"), milestones_(std::move(milestones)), gamma_(gamma) {
  std::sort(milestones_.begin(), milestones_.end());
  initial_step();
}

double MultiStepLR::lr_at(size_t group, int64_t epoch) const {
  // torch's closed form: bisect_right over the sorted milestones (a repeated one counts twice).
  const auto passed =
      std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin();
  return base_lrs_[group] * std::pow(gamma_, static_cast<double>(passed));
}

// ---------------------------------------------------------------------------- ExponentialLR

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma)
    : LRScheduler(optimizer, "ExponentialLR"), gamma_(gamma) {
  initial_step();
}

double ExponentialLR::lr_at(size_t group, int64_t epoch) const {
  return base_lrs_[group] * std::pow(gamma_, static_cast<double>(epoch));
}

// ---------------------------------------------------------------------------- CosineAnnealingLR

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min)
    : LRScheduler(optimizer, "CosineAnnealingLR"), t_max_(T_max), eta_min_(eta_min) {
  KILN_CHECK(T_max > 0, name_, ": T_max must be positive, got ", T_max);
  initial_step();
}

double CosineAnnealingLR::lr_at(size_t group, int64_t epoch) const {
  const double pi = std::acos(-1.0);
  return eta_min_ +
         (base_lrs_[group] - eta_min_) *
             (1.0 + std::cos(pi * static_cast<double>(epoch) / static_cast<double>(t_max_))) / 2.0;
}

// ---------------------------------------------------------------------------- LinearLR

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor,
                   int64_t total_iters)
    : LRScheduler(optimizer, "LinearLR"),
      start_factor_(start_factor),
      end_factor_(end_factor),
      total_iters_(total_iters) {
  KILN_CHECK(start_factor > 0.0 && start_factor <= 1.0, name_,
             ": start_factor must be in (0, 1], got ", start_factor);
  KILN_CHECK(end_factor >= 0.0 && end_factor <= 1.0, name_, ": end_factor must be in [0, 1], got ",
             end_factor);
  KILN_CHECK(total_iters > 0, name_, ": total_iters must be positive, got ", total_iters);
  initial_step();
}

double LinearLR::lr_at(size_t group, int64_t epoch) const {
  const double done = static_cast<double>(std::min(epoch, total_iters_));
  return base_lrs_[group] *
         (start_factor_ + (end_factor_ - start_factor_) * done / static_cast<double>(total_iters_));
}

// ---------------------------------------------------------------------------- LambdaLR

LambdaLR::LambdaLR(Optimizer& optimizer, Lambda lr_lambda)
    : LambdaLR(optimizer, std::vector<Lambda>(optimizer.num_param_groups(), lr_lambda)) {}

LambdaLR::LambdaLR(Optimizer& optimizer, std::vector<Lambda> lr_lambdas)
    : LRScheduler(optimizer, "LambdaLR"), lambdas_(std::move(lr_lambdas)) {
  KILN_CHECK(lambdas_.size() == base_lrs_.size(), name_, ": expected ", base_lrs_.size(),
             " lr_lambdas (one per parameter group), got ", lambdas_.size());
  for (size_t g = 0; g < lambdas_.size(); ++g)
    KILN_CHECK(lambdas_[g] != nullptr, name_, ": lr_lambda ", g, " is empty");
  initial_step();
}

double LambdaLR::lr_at(size_t group, int64_t epoch) const {
  return base_lrs_[group] * lambdas_[group](epoch);
}

// ---------------------------------------------------------------------------- OneCycleLR

OneCycleLR::OneCycleLR(Optimizer& optimizer, double max_lr, OneCycleLROptions options)
    : OneCycleLR(optimizer, std::vector<double>(optimizer.num_param_groups(), max_lr),
                 std::move(options)) {}

OneCycleLR::OneCycleLR(Optimizer& optimizer, std::vector<double> max_lrs, OneCycleLROptions options)
    : LRScheduler(optimizer, "OneCycleLR"), options_(std::move(options)) {
  const OneCycleLROptions& o = options_;
  if (o.total_steps != 0) {
    KILN_CHECK(o.total_steps > 0, name_, ": total_steps must be positive, got ", o.total_steps);
    total_steps_ = o.total_steps;
  } else {
    KILN_CHECK(o.epochs > 0 && o.steps_per_epoch > 0, name_,
               ": give total_steps, or positive epochs and steps_per_epoch (got epochs ", o.epochs,
               ", steps_per_epoch ", o.steps_per_epoch, ")");
    total_steps_ = o.epochs * o.steps_per_epoch;
  }
  KILN_CHECK(o.pct_start >= 0.0 && o.pct_start <= 1.0, name_, ": pct_start must be in [0, 1], got ",
             o.pct_start);
  KILN_CHECK(o.anneal_strategy == "cos" || o.anneal_strategy == "linear", name_,
             ": anneal_strategy must be 'cos' or 'linear', got '", o.anneal_strategy, "'");
  KILN_CHECK(o.div_factor > 0.0 && o.final_div_factor > 0.0, name_,
             ": div_factor and final_div_factor must be positive, got ", o.div_factor, " and ",
             o.final_div_factor);
  KILN_CHECK(max_lrs.size() == base_lrs_.size(), name_, ": expected ", base_lrs_.size(),
             " max_lr values (one per parameter group), got ", max_lrs.size());
  KILN_CHECK(!o.cycle_momentum || optimizer.group_momentum(0) != nullptr, name_, ": ",
             optimizer.name(),
             " has no momentum to cycle (SGD and RMSprop's momentum, Adam's beta1); set "
             "cycle_momentum to false");
  for (double max_lr : max_lrs) {
    KILN_CHECK(max_lr >= 0.0, name_, ": max_lr must be >= 0, got ", max_lr);
    const double initial = max_lr / o.div_factor;
    lrs_.push_back({initial, max_lr, initial / o.final_div_factor});
  }
  const double pct_steps = o.pct_start * static_cast<double>(total_steps_);
  const double last = static_cast<double>(total_steps_) - 1.0;
  if (o.three_phase)
    phases_ = {
        {pct_steps - 1.0, 0, 1, 1, 0}, {2.0 * pct_steps - 2.0, 1, 0, 0, 1}, {last, 0, 2, 1, 1}};
  else
    phases_ = {{pct_steps - 1.0, 0, 1, 1, 0}, {last, 1, 2, 0, 1}};
  initial_step();
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (options_.anneal_strategy == "linear") return (end - start) * pct + start;
  return end + (start - end) / 2.0 * (std::cos(std::acos(-1.0) * pct) + 1.0);
}

std::pair<const OneCycleLR::Phase*, double> OneCycleLR::where(int64_t epoch) const {
  const double step = static_cast<double>(epoch);
  double start = 0.0;
  for (size_t k = 0; k < phases_.size(); ++k) {
    const Phase& phase = phases_[k];
    if (step <= phase.end_step || k + 1 == phases_.size())
      return {&phase, (step - start) / (phase.end_step - start)};
    start = phase.end_step;
  }
  return {nullptr, 0.0};  // not reached: phases_ is never empty
}

double OneCycleLR::lr_at(size_t group, int64_t epoch) const {
  KILN_CHECK(epoch <= total_steps_, name_, ": tried to step ", epoch,
             " times; the specified number of total steps is ", total_steps_);
  const auto [phase, pct] = where(epoch);
  return anneal(lrs_[group][phase->start_lr], lrs_[group][phase->end_lr], pct);
}

void OneCycleLR::after_step() {
  if (!options_.cycle_momentum) return;
  const auto [phase, pct] = where(last_epoch());
  const double momenta[2] = {options_.base_momentum, options_.max_momentum};
  const double momentum = anneal(momenta[phase->start_momentum], momenta[phase->end_momentum], pct);
  for (size_t g = 0; g < base_lrs_.size(); ++g) *optimizer_.group_momentum(g) = momentum;
}

}  // namespace kiln::optim
