// Optimizers in the style of libtorch's torch::optim: SGD (momentum, Nesterov) and Adam.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/state_dict.h"
#include "kiln/tensor.h"

namespace kiln::optim {

// Updates a fixed list of parameters from their grad(). Updates write into the parameters'
// own storage (handles held elsewhere, such as a module's members, see the new values) and record
// no autograd history. Parameters whose grad is undefined are skipped, as in torch.
class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> parameters);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual void step() = 0;
  // Makes every parameter's grad undefined (torch's default, set_to_none=True).
  void zero_grad();
  const std::vector<Tensor>& parameters() const { return parameters_; }

  // The optimizer's state as flat names of torch's nested state_dict(): "state.<i>.<name>" for
  // parameter i's state (only parameters updated at least once, as in torch) and
  // "param_groups.0.<hyperparameter>" as 0-dim float64 tensors ("betas" holds two values),
  // "param_groups.0.params" the parameter indices (int64). Tensors are copies.
  virtual StateDict state_dict() const = 0;
  // Restores what state_dict() gave (hyperparameters included). Everything is checked first (the
  // parameter count, each state tensor's shape against its parameter's): a mismatch raises
  // kiln::Error and leaves the optimizer as it was. State tensors that exist are written in
  // place, so a traced step (jit::trace) sees the loaded values.
  virtual void load_state_dict(const StateDict& dict) = 0;

 protected:
  std::vector<Tensor> parameters_;
  // Expires with the optimizer: a traced step reads its options through it (lr, betas, ...), so a
  // replay after the optimizer is gone fails instead of reading freed memory.
  std::shared_ptr<const char> alive_ = std::make_shared<const char>(0);
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
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> parameters, SGDOptions options);
  void step() override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& dict) override;
  // Mutable so that a schedule can change the learning rate between steps.
  SGDOptions& options() { return options_; }
  // The momentum buffer of parameter i; undefined before its first update or without momentum.
  const Tensor& momentum_buffer(size_t i) const { return momentum_buffers_.at(i); }

 private:
  void traced_update(Tensor& p, const Tensor& g, Tensor& buf);
  SGDOptions options_;
  std::vector<Tensor> momentum_buffers_;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // L2 penalty added to the gradient (Adam, not AdamW)
};

// torch.optim.Adam (amsgrad=False): g = grad + weight_decay * p, m = beta1 m + (1 - beta1) g,
// v = beta2 v + (1 - beta2) g^2, and with t the parameter's step count,
// p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> parameters, AdamOptions options = {});
  void step() override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& dict) override;
  AdamOptions& options() { return options_; }
  // Per-parameter state: steps taken, first and second moment estimates (undefined before the
  // parameter's first update).
  int64_t step_count(size_t i) const;
  const Tensor& exp_avg(size_t i) const { return state_.at(i).exp_avg; }
  const Tensor& exp_avg_sq(size_t i) const { return state_.at(i).exp_avg_sq; }

 private:
  struct State {
    int64_t step = 0;
    // Set once a step is traced (jit::trace): from then on it holds the count.
    Tensor step_tensor;
    Tensor exp_avg, exp_avg_sq;
  };
  void traced_update(Tensor& p, const Tensor& g, State& s);
  AdamOptions options_;
  std::vector<State> state_;
};

}  // namespace kiln::optim
