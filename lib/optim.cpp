// kiln::optim: SGD and Adam, as one fused pass over raw memory where the layout allows it.
//
// An optimizer step is memory bound: written with eager in-place ops, Adam makes about ten passes
// over each parameter-sized array; the fused loop reads p, grad and the state once and writes
// them once. It runs when the parameter, its gradient and its state are contiguous CPU float32 or
// float64 tensors of one dtype and shape (what a module's parameters and backward's gradients
// are). Anything else takes the fallback built from kiln's in-place ops, which computes the same
// formulas.
#include "kiln/optim.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <string>

#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "lib/dispatch.h"
#include "lib/lazy.h"
#include "lib/parallel.h"
#include "lib/tensor_impl.h"

namespace kiln::optim {

using detail::describe;

namespace {

// Inside jit::trace every update must be made of ops, so that the trace records it.
bool is_fusable(const Tensor& p, const Tensor& g, std::initializer_list<const Tensor*> state) {
  if (detail::trace_mode()) return false;
  if (p.device() != kCPU || !p.is_floating_point() || !p.is_contiguous()) return false;
  if (g.device() != kCPU || g.dtype() != p.dtype() || !g.is_contiguous() || g.sizes() != p.sizes())
    return false;
  for (const Tensor* s : state)
    if (s->defined() && (s->dtype() != p.dtype() || !s->is_contiguous())) return false;
  return true;
}

// Raw access for the fused loops, which write p and the state in place: pending work that reads
// them runs first.
template <typename T>
T* data(const Tensor& t) {
  detail::prepare_write(t);
  return static_cast<T*>(t.raw_data_ptr());
}

void check_non_negative(double value, const char* optimizer, const char* what) {
  KILN_CHECK(value >= 0.0, optimizer, ": invalid ", what, " ", value, " (must be >= 0)");
}

// ---------------------------------------------------------------------------- state_dict

// Flat names for torch's nested optimizer state_dict: {"state": {i: {name: t}}, "param_groups":
// [{hyperparameter: v, "params": [i...]}]} becomes "state.<i>.<name>" and
// "param_groups.0.<hyperparameter>" (kiln's optimizers have one parameter group).
std::string state_key(size_t i, const char* name) {
  return "state." + std::to_string(i) + "." + name;
}
constexpr const char* kGroupPrefix = "param_groups.0.";
std::string group_key(const char* name) {
  return std::string(kGroupPrefix) + name;
}

void put_group_common(StateDict& out, size_t num_parameters) {
  std::vector<int64_t> indices(num_parameters);
  for (size_t i = 0; i < num_parameters; ++i) indices[i] = static_cast<int64_t>(i);
  out.insert(group_key("params"),
             from_vector(indices, Shape{static_cast<int64_t>(num_parameters)}));
}

// The hyperparameter `name` as a vector of `count` values; raises naming the optimizer when the
// dict lacks it or it has another number of values.
std::vector<double> read_group(const StateDict& d, const char* optimizer, const char* name,
                               int64_t count = 1) {
  const std::string key = group_key(name);
  KILN_CHECK(d.contains(key), optimizer, ".load_state_dict: missing '", key, "'");
  const Tensor& t = d.at(key);
  KILN_CHECK(t.defined() && t.numel() == count, optimizer, ".load_state_dict: '", key,
             "' must hold ", count, " value(s), got ", describe(t));
  return t.to_vector<double>();
}

// Checks every "state." and "param_groups." name of `d` against the optimizer's parameters:
// the index in range, the state name known, a tensor-valued state shaped as its parameter.
void check_optimizer_dict(const StateDict& d, const std::vector<Tensor>& parameters,
                          const char* optimizer, const std::vector<std::string>& scalar_state,
                          const std::vector<std::string>& tensor_state,
                          const std::vector<std::string>& group) {
  auto known = [](const std::vector<std::string>& names, const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  const std::vector<double> params =
      read_group(d, optimizer, "params", static_cast<int64_t>(parameters.size()));
  for (size_t i = 0; i < params.size(); ++i)
    KILN_CHECK(params[i] == static_cast<double>(i), optimizer,
               ".load_state_dict: param_groups.0.params must be 0..", parameters.size() - 1);
  for (const auto& [key, t] : d) {
    const std::string where = std::string(optimizer) + ".load_state_dict: '" + key + "'";
    if (key.rfind(kGroupPrefix, 0) == 0) {
      const std::string name = key.substr(std::string(kGroupPrefix).size());
      KILN_CHECK(known(group, name) || name == "params", where, ": unknown hyperparameter");
      continue;
    }
    KILN_CHECK(key.rfind("state.", 0) == 0, where, ": expected state.<i>.<name> or ", kGroupPrefix,
               "<name>");
    const size_t dot = key.find('.', 6);
    const std::string index = key.substr(6, dot == std::string::npos ? dot : dot - 6);
    KILN_CHECK(dot != std::string::npos && !index.empty() &&
                   index.find_first_not_of("0123456789") == std::string::npos &&
                   index.size() < 10 && std::stoul(index) < parameters.size(),
               where, ": no parameter of that index (the optimizer has ", parameters.size(), ")");
    const Tensor& p = parameters[std::stoul(index)];
    const std::string name = key.substr(dot + 1);
    KILN_CHECK(t.defined(), where, " is undefined");
    if (known(scalar_state, name)) {
      KILN_CHECK(t.numel() == 1, where, " must hold one value, got ", describe(t));
    } else {
      KILN_CHECK(known(tensor_state, name), where, ": unknown state '", name, "'");
      KILN_CHECK(t.sizes() == p.sizes(), where, " is ", describe(t), ", its parameter ",
                 describe(p));
    }
  }
}

// Sets a state tensor to `src`'s values: in place when it exists (a traced step holds it),
// else as a copy on the parameter's device and in its dtype.
void assign_state(Tensor& slot, const Tensor& src, const Tensor& parameter) {
  if (slot.defined()) {
    slot.copy_(src);
    return;
  }
  slot = src.to(parameter.device()).to(parameter.dtype()).clone();
}

}  // namespace

Optimizer::Optimizer(std::vector<Tensor> parameters) : parameters_(std::move(parameters)) {
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const Tensor& p = parameters_[i];
    KILN_CHECK(p.defined() && p.is_floating_point(), "Optimizer: parameter ", i,
               " must be a floating-point tensor, got ", describe(p));
    KILN_CHECK(p.is_leaf(), "Optimizer: can't optimize a non-leaf tensor (parameter ", i, ", ",
               describe(p), ", made by ", p.grad_fn_name(), ")");
  }
}

void Optimizer::zero_grad() {
  // Without reading .grad first: a traced zero_grad then does not depend on whether it was set.
  for (Tensor& p : parameters_) p.mutable_grad() = Tensor();
}

// ---------------------------------------------------------------------------- SGD

SGD::SGD(std::vector<Tensor> parameters, SGDOptions options)
    : Optimizer(std::move(parameters)), options_(options) {
  check_non_negative(options_.lr, "SGD", "learning rate");
  check_non_negative(options_.momentum, "SGD", "momentum");
  check_non_negative(options_.weight_decay, "SGD", "weight_decay");
  KILN_CHECK(!options_.nesterov || (options_.momentum > 0.0 && options_.dampening == 0.0),
             "SGD: Nesterov momentum requires a momentum and zero dampening, got momentum ",
             options_.momentum, " and dampening ", options_.dampening);
  momentum_buffers_.resize(parameters_.size());
}

void SGD::step() {
  NoGradGuard no_grad;
  const SGDOptions o = options_;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    Tensor& p = parameters_[i];
    const Tensor& g = p.grad();
    if (!g.defined()) continue;
    KILN_CHECK(g.sizes() == p.sizes(), "SGD: gradient ", describe(g), " does not match parameter ",
               i, " ", describe(p));
    Tensor& buf = momentum_buffers_[i];
    bool first = !buf.defined();
    if (detail::trace_mode()) {
      traced_update(p, g, buf);
      continue;
    }
    if (is_fusable(p, g, {&buf})) {
      if (o.momentum != 0.0 && first) buf = empty_like(p);
      detail::dispatch_floating(p.dtype(), "SGD", [&](auto tag) {
        using T = KILN_TYPE(tag);
        T* pp = data<T>(p);
        const T* gp = data<T>(g);
        T* bp = buf.defined() ? data<T>(buf) : nullptr;
        const T lr = static_cast<T>(o.lr), wd = static_cast<T>(o.weight_decay);
        const T momentum = static_cast<T>(o.momentum);
        const T keep = static_cast<T>(1.0 - o.dampening);
        const bool use_momentum = o.momentum != 0.0, nesterov = o.nesterov;
        detail::parallel_for(p.numel(), detail::kParallelGrain, [&](int64_t b, int64_t e) {
          for (int64_t k = b; k < e; ++k) {
            T d = gp[k];
            if (wd != T(0)) d += wd * pp[k];
            if (use_momentum) {
              T v = first ? d : momentum * bp[k] + keep * d;
              bp[k] = v;
              d = nesterov ? d + momentum * v : v;
            }
            pp[k] -= lr * d;
          }
        });
      });
      detail::bump_version(p);
      continue;
    }
    // The update is computed in the parameter's dtype, whatever the gradient's.
    Tensor d = g.dtype() == p.dtype() ? g : g.to(p.dtype());
    if (o.weight_decay != 0.0) d = d.add(p, o.weight_decay);
    if (o.momentum != 0.0) {
      if (first)
        buf = empty_like(p).copy_(d);
      else
        buf.mul_(o.momentum).add_(d, 1.0 - o.dampening);
      d = o.nesterov ? d.add(buf, o.momentum) : buf;
    }
    p.add_(d, -o.lr);
  }
}

// Inside jit::trace: the update made of ops, so that the trace records it. The hyperparameters are
// graph inputs read at each call of the traced step (a schedule's new learning rate is followed
// without tracing anew), and the choices that shape the update (momentum or not, Nesterov, weight
// decay or not) are checked at each call, which traces anew when one changed.
void SGD::traced_update(Tensor& p, const Tensor& g, Tensor& buf) {
  const SGDOptions& o = options_;
  auto scalar = [&](const char* what, const double& v) {
    return detail::traced_scalar(what, v, alive_);
  };
  auto flag = [&](const char* what, std::function<bool()> read) {
    return detail::traced_flag(what, std::move(read), alive_);
  };
  Tensor d = g.dtype() == p.dtype() ? g : g.to(p.dtype());
  if (flag("SGD weight_decay != 0", [this] { return options_.weight_decay != 0.0; }))
    d = d + p * scalar("SGD weight_decay", o.weight_decay);
  if (flag("SGD momentum != 0", [this] { return options_.momentum != 0.0; })) {
    const Tensor momentum = scalar("SGD momentum", o.momentum);
    if (!buf.defined()) {
      // A trace replays its first step forever: start from a zero buffer instead, which gives
      // the first step's buf = g exactly when there is no dampening.
      KILN_CHECK(o.dampening == 0.0,
                 "SGD: with dampening, the first step differs from the others; run one step "
                 "before jit::trace records the step");
      buf = zeros_like(p);
    }
    buf.mul_(momentum).add_(d * (1.0 - scalar("SGD dampening", o.dampening)));
    d = flag("SGD nesterov", [this] { return options_.nesterov; }) ? d + buf * momentum : buf;
  }
  p.sub_(d * scalar("SGD lr", o.lr));
}

// ---------------------------------------------------------------------------- Adam

Adam::Adam(std::vector<Tensor> parameters, AdamOptions options)
    : Optimizer(std::move(parameters)), options_(options) {
  check_non_negative(options_.lr, "Adam", "learning rate");
  check_non_negative(options_.eps, "Adam", "epsilon");
  check_non_negative(options_.weight_decay, "Adam", "weight_decay");
  KILN_CHECK(options_.beta1 >= 0.0 && options_.beta1 < 1.0 && options_.beta2 >= 0.0 &&
                 options_.beta2 < 1.0,
             "Adam: invalid betas (", options_.beta1, ", ", options_.beta2,
             "): each must be in [0, 1)");
  state_.resize(parameters_.size());
}

void Adam::step() {
  NoGradGuard no_grad;
  const AdamOptions o = options_;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    Tensor& p = parameters_[i];
    const Tensor& g = p.grad();
    if (!g.defined()) continue;
    KILN_CHECK(g.sizes() == p.sizes(), "Adam: gradient ", describe(g), " does not match parameter ",
               i, " ", describe(p));
    State& s = state_[i];
    if (!s.exp_avg.defined()) {
      s.exp_avg = zeros_like(p);
      s.exp_avg_sq = zeros_like(p);
    }
    if (detail::trace_mode()) {
      traced_update(p, g, s);
      continue;
    }
    if (s.step_tensor.defined()) s.step = s.step_tensor.item<int64_t>();
    s.step += 1;
    if (s.step_tensor.defined()) s.step_tensor.fill_(s.step);
    const double t = static_cast<double>(s.step);
    const double step_size = o.lr / (1.0 - std::pow(o.beta1, t));
    const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, t));

    if (is_fusable(p, g, {&s.exp_avg, &s.exp_avg_sq})) {
      detail::dispatch_floating(p.dtype(), "Adam", [&](auto tag) {
        using T = KILN_TYPE(tag);
        T* pp = data<T>(p);
        const T* gp = data<T>(g);
        T* mp = data<T>(s.exp_avg);
        T* vp = data<T>(s.exp_avg_sq);
        const T wd = static_cast<T>(o.weight_decay), w1 = static_cast<T>(1.0 - o.beta1);
        const T beta2 = static_cast<T>(o.beta2), w2 = static_cast<T>(1.0 - o.beta2);
        const T eps = static_cast<T>(o.eps), lr = static_cast<T>(step_size);
        const T inv_bc2 = static_cast<T>(1.0 / bias_correction2_sqrt);
        detail::parallel_for(p.numel(), detail::kParallelGrain, [&](int64_t b, int64_t e) {
          for (int64_t k = b; k < e; ++k) {
            T grad = gp[k];
            if (wd != T(0)) grad += wd * pp[k];
            // exp_avg.lerp_(grad, 1 - beta1), as torch writes it.
            T m = mp[k] + w1 * (grad - mp[k]);
            T v = beta2 * vp[k] + w2 * grad * grad;
            mp[k] = m;
            vp[k] = v;
            pp[k] -= lr * m / (std::sqrt(v) * inv_bc2 + eps);
          }
        });
      });
      detail::bump_version(p);
      continue;
    }
    Tensor grad = g.dtype() == p.dtype() ? g : g.to(p.dtype());
    if (o.weight_decay != 0.0) grad = grad.add(p, o.weight_decay);
    s.exp_avg.mul_(o.beta1).add_(grad, 1.0 - o.beta1);
    s.exp_avg_sq.mul_(o.beta2).add_(grad * grad, 1.0 - o.beta2);
    Tensor denom = (s.exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(o.eps);
    p.add_(s.exp_avg / denom, -step_size);
  }
}

// Inside jit::trace, as SGD's: hyperparameters are read at each call of the traced step. The step
// count lives in a tensor, so that replays advance it and the bias corrections follow (torch's
// capturable Adam does the same for CUDA graphs).
void Adam::traced_update(Tensor& p, const Tensor& g, State& s) {
  const AdamOptions& o = options_;
  auto scalar = [&](const char* what, const double& v) {
    return detail::traced_scalar(what, v, alive_);
  };
  const Tensor lr = scalar("Adam lr", o.lr), beta1 = scalar("Adam beta1", o.beta1);
  const Tensor beta2 = scalar("Adam beta2", o.beta2), eps = scalar("Adam eps", o.eps);
  if (!s.step_tensor.defined()) s.step_tensor = scalar_tensor(s.step, kFloat64);
  s.step_tensor.add_(1);
  Tensor step_size = reciprocal(1.0 - pow(beta1, s.step_tensor)) * lr;
  Tensor bias_correction2_sqrt = sqrt(1.0 - pow(beta2, s.step_tensor));
  Tensor grad = g.dtype() == p.dtype() ? g : g.to(p.dtype());
  if (detail::traced_flag(
          "Adam weight_decay != 0", [this] { return options_.weight_decay != 0.0; }, alive_))
    grad = grad + p * scalar("Adam weight_decay", o.weight_decay);
  s.exp_avg.mul_(beta1).add_(grad * (1.0 - beta1));
  s.exp_avg_sq.mul_(beta2).add_(grad * grad * (1.0 - beta2));
  Tensor denom = (s.exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps);
  p.sub_(s.exp_avg / denom * step_size);
}

int64_t Adam::step_count(size_t i) const {
  const State& s = state_.at(i);
  return s.step_tensor.defined() ? s.step_tensor.item<int64_t>() : s.step;
}

StateDict SGD::state_dict() const {
  StateDict out;
  for (size_t i = 0; i < parameters_.size(); ++i)
    if (momentum_buffers_[i].defined())
      out.insert(state_key(i, "momentum_buffer"), momentum_buffers_[i].detach().clone());
  const SGDOptions& o = options_;
  out.insert(group_key("lr"), scalar_tensor(o.lr, kFloat64));
  out.insert(group_key("momentum"), scalar_tensor(o.momentum, kFloat64));
  out.insert(group_key("dampening"), scalar_tensor(o.dampening, kFloat64));
  out.insert(group_key("weight_decay"), scalar_tensor(o.weight_decay, kFloat64));
  out.insert(group_key("nesterov"), scalar_tensor(o.nesterov, kBool));
  put_group_common(out, parameters_.size());
  return out;
}

void SGD::load_state_dict(const StateDict& d) {
  check_optimizer_dict(d, parameters_, "SGD", {}, {"momentum_buffer"},
                       {"lr", "momentum", "dampening", "weight_decay", "nesterov"});
  SGDOptions o;
  o.lr = read_group(d, "SGD", "lr")[0];
  o.momentum = read_group(d, "SGD", "momentum")[0];
  o.dampening = read_group(d, "SGD", "dampening")[0];
  o.weight_decay = read_group(d, "SGD", "weight_decay")[0];
  o.nesterov = read_group(d, "SGD", "nesterov")[0] != 0.0;
  SGD check(parameters_, o);  // the constructor's checks of the options, before any change
  NoGradGuard no_grad;
  options_ = o;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const std::string key = state_key(i, "momentum_buffer");
    if (d.contains(key))
      assign_state(momentum_buffers_[i], d.at(key), parameters_[i]);
    else
      momentum_buffers_[i] = Tensor();  // as torch: a parameter without saved state starts anew
  }
}

StateDict Adam::state_dict() const {
  StateDict out;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const State& s = state_[i];
    if (!s.exp_avg.defined()) continue;
    // torch keeps the step as a float32 tensor; exact to 2^24 steps.
    out.insert(state_key(i, "step"), scalar_tensor(static_cast<double>(step_count(i)), kFloat32));
    out.insert(state_key(i, "exp_avg"), s.exp_avg.detach().clone());
    out.insert(state_key(i, "exp_avg_sq"), s.exp_avg_sq.detach().clone());
  }
  const AdamOptions& o = options_;
  out.insert(group_key("lr"), scalar_tensor(o.lr, kFloat64));
  out.insert(group_key("betas"), from_vector(std::vector<double>{o.beta1, o.beta2}));
  out.insert(group_key("eps"), scalar_tensor(o.eps, kFloat64));
  out.insert(group_key("weight_decay"), scalar_tensor(o.weight_decay, kFloat64));
  put_group_common(out, parameters_.size());
  return out;
}

void Adam::load_state_dict(const StateDict& d) {
  check_optimizer_dict(d, parameters_, "Adam", {"step"}, {"exp_avg", "exp_avg_sq"},
                       {"lr", "betas", "eps", "weight_decay"});
  AdamOptions o;
  o.lr = read_group(d, "Adam", "lr")[0];
  const std::vector<double> betas = read_group(d, "Adam", "betas", 2);
  o.beta1 = betas[0];
  o.beta2 = betas[1];
  o.eps = read_group(d, "Adam", "eps")[0];
  o.weight_decay = read_group(d, "Adam", "weight_decay")[0];
  Adam check(parameters_, o);  // the constructor's checks of the options, before any change
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const bool any = d.contains(state_key(i, "step")) || d.contains(state_key(i, "exp_avg")) ||
                     d.contains(state_key(i, "exp_avg_sq"));
    for (const char* name : {"step", "exp_avg", "exp_avg_sq"})
      KILN_CHECK(!any || d.contains(state_key(i, name)), "Adam.load_state_dict: parameter ", i,
                 " has state but no '", state_key(i, name), "'");
  }
  NoGradGuard no_grad;
  options_ = o;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    State& s = state_[i];
    if (!d.contains(state_key(i, "step"))) {
      s = State();  // as torch: a parameter without saved state starts anew
      continue;
    }
    s.step = static_cast<int64_t>(d.at(state_key(i, "step")).item<double>());
    if (s.step_tensor.defined()) s.step_tensor.fill_(s.step);
    assign_state(s.exp_avg, d.at(state_key(i, "exp_avg")), parameters_[i]);
    assign_state(s.exp_avg_sq, d.at(state_key(i, "exp_avg_sq")), parameters_[i]);
  }
}

}  // namespace kiln::optim
