// Optimizers in the style of libtorch's torch::optim: SGD (momentum, Nesterov), Adam, AdamW,
// RMSprop and Adagrad, with parameter groups, and the learning-rate schedulers of
// torch.optim.lr_scheduler.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/state_dict.h"
#include "kiln/tensor.h"

namespace kiln::optim {

// Parameters updated with their own options (torch::optim::OptimizerParamGroup). A group made
// without options takes the optimizer's defaults.
template <typename Options>
struct ParamGroup {
  ParamGroup(std::vector<Tensor> params) : params(std::move(params)) {}  // NOLINT: as libtorch
  ParamGroup(std::vector<Tensor> params, Options options)
      : params(std::move(params)), options(options), has_options(true) {}
  // Fixed once the group is in an optimizer: change `options`, or add a group.
  std::vector<Tensor> params;
  // Read at every step (and by every call of a traced step): a schedule changes them between steps.
  Options options;
  bool has_options = false;
};

// Updates parameters from their grad(). Updates write into the parameters' own storage (handles
// held elsewhere, such as a module's members, see the new values) and record no autograd history.
// Parameters whose grad is undefined are skipped, as in torch.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual void step() = 0;
  // Makes every parameter's grad undefined (torch's default, set_to_none=True).
  void zero_grad();
  // Every group's parameters, in group order: parameter i of the state_dict is parameters()[i].
  const std::vector<Tensor>& parameters() const { return parameters_; }
  const char* name() const { return name_; }

  // What the learning-rate schedulers read and set between steps: group g's learning rate, and the
  // momentum OneCycleLR cycles (SGD's and RMSprop's momentum, Adam's and AdamW's beta1; null for
  // Adagrad). A traced step reads both at each call.
  virtual size_t num_param_groups() const = 0;
  virtual double& group_lr(size_t group) = 0;
  virtual double* group_momentum(size_t /*group*/) { return nullptr; }

  // The optimizer's state as flat names of torch's nested state_dict(): "state.<i>.<name>" for
  // parameter i's state (only parameters updated at least once, as in torch, except Adagrad's,
  // which exists from the start) and "param_groups.<g>.<hyperparameter>" as 0-dim float64 tensors
  // ("betas" holds two values, flags are bool), "param_groups.<g>.params" the indices of group g's
  // parameters (int64). Tensors are copies.
  virtual StateDict state_dict() const = 0;
  // Restores what state_dict() gave (hyperparameters included). Everything is checked first (the
  // groups and their parameter indices, the options, each state tensor's shape against its
  // parameter's): a mismatch raises kiln::Error and leaves the optimizer as it was. State tensors
  // that exist are written in place, so a traced step (jit::trace) sees the loaded values.
  virtual void load_state_dict(const StateDict& dict) = 0;

 protected:
  explicit Optimizer(const char* name) : name_(name) {}
  // Checks and appends parameters: floating-point leaves not already in this optimizer.
  void add_parameters(const std::vector<Tensor>& params);

  const char* name_;
  std::vector<Tensor> parameters_;
  // Expires with the optimizer: a traced step reads its options through it (lr, betas, ...), so a
  // replay after the optimizer is gone fails instead of reading freed memory.
  std::shared_ptr<const char> alive_ = std::make_shared<const char>(0);
};

// The part of every optimizer that is the same whatever its update: groups of parameters with
// options of type Options, and the state_dict's groups. Groups live in a deque, so that their
// options keep their address (a traced step reads them by reference) when a group is added.
template <typename Options>
class GroupedOptimizer : public Optimizer {
 public:
  // Change a group's options here; add groups with add_param_group, which makes their state.
  std::deque<ParamGroup<Options>>& param_groups() { return groups_; }
  const std::deque<ParamGroup<Options>>& param_groups() const { return groups_; }
  // The first group's options: an optimizer made from a list of parameters has only that group.
  Options& options() { return groups_.front().options; }
  const Options& defaults() const { return defaults_; }
  // Checks the group (its options, and that no parameter is already optimized here) and adds it.
  void add_param_group(ParamGroup<Options> group);

  size_t num_param_groups() const override { return groups_.size(); }
  double& group_lr(size_t group) override { return groups_.at(group).options.lr; }
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& dict) override;

 protected:
  GroupedOptimizer(const char* name, Options defaults);
  // Adds the groups one by one (the constructors of the optimizers call it).
  void add_groups(std::vector<ParamGroup<Options>> groups);
  const Options& options_of(size_t i) const { return groups_[group_of_[i]].options; }
  // Checks every group's options; step() does, before it changes anything.
  void check_groups() const;

  // The per-parameter state, which each optimizer keeps as it likes.
  // A new parameter i was added: make its state slot.
  virtual void add_state(size_t i) = 0;
  // Parameter i's state into `out` under state.<i>.<name> (nothing when it has none).
  virtual void put_state(StateDict& out, size_t i) const = 0;
  // The names of the state a parameter may have: one-value ones (step) and parameter-shaped ones;
  // and those it must have, when it has any, to be updated with `o`.
  virtual std::vector<std::string> scalar_state() const { return {"step"}; }
  virtual std::vector<std::string> tensor_state() const = 0;
  virtual std::vector<std::string> required_state(const Options& o) const = 0;
  // Sets parameter i's state from `d` (checked already); it starts anew when `d` has none.
  virtual void load_state(const StateDict& d, size_t i) = 0;

 private:
  void check_dict(const StateDict& d, const std::vector<Options>& loaded) const;

  Options defaults_;
  std::deque<ParamGroup<Options>> groups_;
  std::vector<size_t> group_of_;  // parameter i belongs to groups_[group_of_[i]]
};

// The number of steps a parameter took. Inside jit::trace it moves into a tensor, which replays
// advance (torch's capturable Adam does the same for CUDA graphs); from then on the tensor holds
// it.
struct StepCount {
  int64_t value() const;
  void set(int64_t steps);
  int64_t advance();        // eager: adds one, gives the new count
  Tensor advance_traced();  // in ops (recorded by a trace): adds one, gives the new count (float64)

 private:
  int64_t steps_ = 0;
  Tensor tensor_;
};

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// torch.optim.SGD: g = grad + weight_decay * p; with momentum, buf = g on the first step and
// buf = momentum * buf + (1 - dampening) * g after, and g = g + momentum * buf (Nesterov) or
// g = buf; then p -= lr * g.
class SGD : public GroupedOptimizer<SGDOptions> {
 public:
  SGD(std::vector<Tensor> parameters, SGDOptions options);
  SGD(std::vector<ParamGroup<SGDOptions>> groups, SGDOptions defaults);
  void step() override;
  double* group_momentum(size_t group) override {
    return &param_groups().at(group).options.momentum;
  }
  // The momentum buffer of parameter i; undefined before its first update or without momentum.
  const Tensor& momentum_buffer(size_t i) const { return momentum_buffers_.at(i); }

 private:
  void traced_update(Tensor& p, const Tensor& g, Tensor& buf, const SGDOptions& o);
  void add_state(size_t) override { momentum_buffers_.emplace_back(); }
  void put_state(StateDict& out, size_t i) const override;
  std::vector<std::string> scalar_state() const override { return {}; }
  std::vector<std::string> tensor_state() const override { return {"momentum_buffer"}; }
  std::vector<std::string> required_state(const SGDOptions&) const override { return {}; }
  void load_state(const StateDict& d, size_t i) override;
  std::vector<Tensor> momentum_buffers_;
};

// The state of Adam and AdamW for one parameter: steps taken, first and second moment estimates,
// and with amsgrad the running maximum of the second (undefined before the first update).
struct AdamState {
  StepCount step;
  Tensor exp_avg, exp_avg_sq, max_exp_avg_sq;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // L2 penalty added to the gradient (Adam, not AdamW)
  bool amsgrad = false;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // decoupled: p *= 1 - lr * weight_decay before the Adam update
  bool amsgrad = false;
};

// What Adam and AdamW share: their state, its state_dict entries, and the update, which applies
// weight decay to the gradient (Adam) or to the parameter (AdamW, `decoupled`).
template <typename Options>
class AdamFamily : public GroupedOptimizer<Options> {
 public:
  void step() override;
  double* group_momentum(size_t group) override {
    return &this->param_groups().at(group).options.beta1;
  }
  int64_t step_count(size_t i) const { return state_.at(i).step.value(); }
  const Tensor& exp_avg(size_t i) const { return state_.at(i).exp_avg; }
  const Tensor& exp_avg_sq(size_t i) const { return state_.at(i).exp_avg_sq; }
  const Tensor& max_exp_avg_sq(size_t i) const { return state_.at(i).max_exp_avg_sq; }

 protected:
  AdamFamily(const char* name, bool decoupled, std::vector<ParamGroup<Options>> groups,
             Options defaults);

 private:
  void add_state(size_t) override { state_.emplace_back(); }
  void put_state(StateDict& out, size_t i) const override;
  std::vector<std::string> tensor_state() const override;
  std::vector<std::string> required_state(const Options& o) const override;
  void load_state(const StateDict& d, size_t i) override;
  bool decoupled_;
  std::vector<AdamState> state_;
};

// torch.optim.Adam: g = grad + weight_decay * p, m = beta1 m + (1 - beta1) g,
// v = beta2 v + (1 - beta2) g^2, with amsgrad v_max = max(v_max, v) used in v's place, and with t
// the parameter's step count, p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
class Adam : public AdamFamily<AdamOptions> {
 public:
  Adam(std::vector<Tensor> parameters, AdamOptions options = {});
  Adam(std::vector<ParamGroup<AdamOptions>> groups, AdamOptions defaults = {});
};

// torch.optim.AdamW: p *= 1 - lr * weight_decay, then Adam's update without weight decay.
class AdamW : public AdamFamily<AdamWOptions> {
 public:
  AdamW(std::vector<Tensor> parameters, AdamWOptions options = {});
  AdamW(std::vector<ParamGroup<AdamWOptions>> groups, AdamWOptions defaults = {});
};

struct RMSpropOptions {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;
  bool centered = false;
};

// torch.optim.RMSprop: g = grad + weight_decay * p, v = alpha v + (1 - alpha) g^2; centered:
// a = lerp(a, g, 1 - alpha) and d = sqrt(v - a^2) + eps, else d = sqrt(v) + eps; with momentum
// buf = momentum * buf + g / d and p -= lr * buf, else p -= lr * g / d.
class RMSprop : public GroupedOptimizer<RMSpropOptions> {
 public:
  RMSprop(std::vector<Tensor> parameters, RMSpropOptions options = {});
  RMSprop(std::vector<ParamGroup<RMSpropOptions>> groups, RMSpropOptions defaults = {});
  void step() override;
  double* group_momentum(size_t group) override {
    return &param_groups().at(group).options.momentum;
  }
  int64_t step_count(size_t i) const { return state_.at(i).step.value(); }
  const Tensor& square_avg(size_t i) const { return state_.at(i).square_avg; }

 private:
  struct State {
    StepCount step;
    Tensor square_avg, momentum_buffer, grad_avg;
  };
  void traced_update(Tensor& p, const Tensor& g, State& s, const RMSpropOptions& o);
  void add_state(size_t) override { state_.emplace_back(); }
  void put_state(StateDict& out, size_t i) const override;
  std::vector<std::string> tensor_state() const override;
  std::vector<std::string> required_state(const RMSpropOptions& o) const override;
  void load_state(const StateDict& d, size_t i) override;
  std::vector<State> state_;
};

struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.0;
  double eps = 1e-10;
};

// torch.optim.Adagrad: g = grad + weight_decay * p, sum += g^2, and with t the parameter's step
// count, p -= lr / (1 + (t - 1) lr_decay) * g / (sqrt(sum) + eps). The state exists from the
// start (sum = initial_accumulator_value), as in torch.
class Adagrad : public GroupedOptimizer<AdagradOptions> {
 public:
  Adagrad(std::vector<Tensor> parameters, AdagradOptions options = {});
  Adagrad(std::vector<ParamGroup<AdagradOptions>> groups, AdagradOptions defaults = {});
  void step() override;
  int64_t step_count(size_t i) const { return state_.at(i).step.value(); }
  const Tensor& sum(size_t i) const { return state_.at(i).sum; }

 private:
  struct State {
    StepCount step;
    Tensor sum;
  };
  void traced_update(Tensor& p, const Tensor& g, State& s, const AdagradOptions& o);
  void add_state(size_t i) override;
  void put_state(StateDict& out, size_t i) const override;
  std::vector<std::string> tensor_state() const override { return {"sum"}; }
  std::vector<std::string> required_state(const AdagradOptions&) const override {
    return {"step", "sum"};
  }
  void load_state(const StateDict& d, size_t i) override;
  std::vector<State> state_;
};

// ------------------------------------------------------------------------ learning-rate schedules

// torch.optim.lr_scheduler: a schedule sets every group's learning rate from the group's initial
// one (its lr when the scheduler was made) and the epoch count. Construction counts as the first
// step (epoch 0) and sets the lrs, as torch's does; step() advances one epoch. Each lr is the
// closed form of the schedule, so a traced step (jit::trace) that reads the groups' lrs follows
// it without tracing anew. A group added to the optimizer afterwards is an error at step().
class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;
  void step();
  // The lrs the last step set, one per group.
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  int64_t last_epoch() const { return last_epoch_; }

 protected:
  LRScheduler(Optimizer& optimizer, const char* name);
  // Sets the lrs of epoch 0; the constructors of the schedules call it once they are checked.
  void initial_step() { step(); }
  // Group g's lr at `epoch`; raises when the schedule has no such epoch.
  virtual double lr_at(size_t group, int64_t epoch) const = 0;
  // Called after the lrs of an epoch are set (OneCycleLR sets the momentum too).
  virtual void after_step() {}

  Optimizer& optimizer_;
  const char* name_;
  std::vector<double> base_lrs_;

 private:
  int64_t last_epoch_ = -1;
  std::vector<double> last_lr_;
};

// lr = base_lr * gamma^(epoch / step_size).
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 private:
  double lr_at(size_t group, int64_t epoch) const override;
  int64_t step_size_;
  double gamma_;
};

// lr = base_lr * gamma^(the number of milestones <= epoch).
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);

 private:
  double lr_at(size_t group, int64_t epoch) const override;
  std::vector<int64_t> milestones_;  // sorted
  double gamma_;
};

// lr = base_lr * gamma^epoch.
class ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(Optimizer& optimizer, double gamma);

 private:
  double lr_at(size_t group, int64_t epoch) const override;
  double gamma_;
};

// lr = eta_min + (base_lr - eta_min) (1 + cos(pi epoch / T_max)) / 2.
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min = 0.0);

 private:
  double lr_at(size_t group, int64_t epoch) const override;
  int64_t t_max_;
  double eta_min_;
};

// lr = base_lr * (start_factor + (end_factor - start_factor) min(epoch, total_iters) /
// total_iters).
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0,
           int64_t total_iters = 5);

 private:
  double lr_at(size_t group, int64_t epoch) const override;
  double start_factor_, end_factor_;
  int64_t total_iters_;
};

// lr = base_lr * lambda(epoch): one function for every group, or one per group.
class LambdaLR : public LRScheduler {
 public:
  using Lambda = std::function<double(int64_t epoch)>;
  LambdaLR(Optimizer& optimizer, Lambda lr_lambda);
  LambdaLR(Optimizer& optimizer, std::vector<Lambda> lr_lambdas);

 private:
  double lr_at(size_t group, int64_t epoch) const override;
  std::vector<Lambda> lambdas_;
};

// torch.optim.lr_scheduler.OneCycleLR's keyword arguments. Give total_steps, or epochs and
// steps_per_epoch.
struct OneCycleLROptions {
  int64_t total_steps = 0;
  int64_t epochs = 0;
  int64_t steps_per_epoch = 0;
  double pct_start = 0.3;
  std::string anneal_strategy = "cos";  // or "linear"
  bool cycle_momentum = true;
  double base_momentum = 0.85;
  double max_momentum = 0.95;
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  bool three_phase = false;
};

// The 1cycle policy: lr goes from max_lr / div_factor up to max_lr over the first pct_start of
// the steps, then down to max_lr / div_factor / final_div_factor (three_phase: back to the
// initial lr first, then down); the momentum (or Adam's beta1) moves the other way between
// max_momentum and base_momentum. Stepping past total_steps raises.
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, double max_lr, OneCycleLROptions options);
  OneCycleLR(Optimizer& optimizer, std::vector<double> max_lrs, OneCycleLROptions options);

 private:
  struct Phase {
    double end_step;
    // The lr at its start and end: indices into lrs_'s initial, maximum and minimum lr.
    int start_lr, end_lr;
    // The momentum at its start and end: 0 for base_momentum, 1 for max_momentum.
    int start_momentum, end_momentum;
  };
  double lr_at(size_t group, int64_t epoch) const override;
  void after_step() override;
  double anneal(double start, double end, double pct) const;
  // The phase of step `epoch` and how far into it (0 to 1).
  std::pair<const Phase*, double> where(int64_t epoch) const;
  OneCycleLROptions options_;
  int64_t total_steps_;
  std::vector<std::array<double, 3>> lrs_;  // per group: initial, maximum and minimum lr
  std::vector<Phase> phases_;
};

}  // namespace kiln::optim
