// kiln::optim: SGD, Adam, AdamW, RMSprop and Adagrad, each as one fused pass over raw memory where
// the layout allows it, and parameter groups with their state_dict.
//
// An optimizer step is memory bound: written with eager in-place ops, Adam makes about ten passes
// over each parameter-sized array; the fused loop reads p, grad and the state once and writes
// them once. It runs when the parameter, its gradient and its state are contiguous CPU float32 or
// float64 tensors of one dtype and shape (what a module's parameters and backward's gradients
// are). Anything else, and every step inside jit::trace, takes the update built from kiln's ops,
// which computes the same formulas and which the fuser makes one kernel per parameter.
#include "kiln/optim.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <string>
#include <unordered_set>

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
// them runs first. Null for state a configuration does not use (undefined).
template <typename T>
T* data(const Tensor& t) {
  if (!t.defined()) return nullptr;
  detail::prepare_write(t);
  return static_cast<T*>(t.raw_data_ptr());
}

void check_grad(const char* optimizer, const Tensor& g, const Tensor& p, size_t i) {
  KILN_CHECK(g.sizes() == p.sizes(), optimizer, ": gradient ", describe(g),
             " does not match parameter ", i, " ", describe(p));
}

// The update is computed in the parameter's dtype, whatever the gradient's.
Tensor grad_as_param(const Tensor& g, const Tensor& p) {
  return g.dtype() == p.dtype() ? g : g.to(p.dtype());
}

// Reads of the options by an update made of ops: inside jit::trace, hyperparameters become graph
// inputs read at each call (a schedule's new lr is followed without tracing anew) and the choices
// that shape the update (momentum or not, ...) are checked at each call, which traces anew when
// one changed. Outside a trace they are the values.
class TracedOptions {
 public:
  TracedOptions(const char* optimizer, std::weak_ptr<const void> alive)
      : optimizer_(optimizer), alive_(std::move(alive)) {}
  Tensor scalar(const char* what, const double& value) const {
    return detail::traced_scalar(label(what).c_str(), value, alive_);
  }
  bool flag(const char* what, std::function<bool()> read) const {
    return detail::traced_flag(label(what).c_str(), std::move(read), alive_);
  }

 private:
  std::string label(const char* what) const { return std::string(optimizer_) + " " + what; }
  const char* optimizer_;
  std::weak_ptr<const void> alive_;
};

// ---------------------------------------------------------------------------- options

void check_non_negative(double value, const char* optimizer, const char* what) {
  KILN_CHECK(value >= 0.0, optimizer, ": invalid ", what, " ", value, " (must be >= 0)");
}

void check_betas(const char* optimizer, double beta1, double beta2) {
  KILN_CHECK(beta1 >= 0.0 && beta1 < 1.0 && beta2 >= 0.0 && beta2 < 1.0, optimizer,
             ": invalid betas (", beta1, ", ", beta2, "): each must be in [0, 1)");
}

void check_options(const char* name, const SGDOptions& o) {
  check_non_negative(o.lr, name, "learning rate (lr)");
  check_non_negative(o.momentum, name, "momentum");
  check_non_negative(o.weight_decay, name, "weight_decay");
  KILN_CHECK(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0), name,
             ": Nesterov momentum requires a momentum and zero dampening, got momentum ",
             o.momentum, " and dampening ", o.dampening);
}

template <typename AdamFamilyOptions>
void check_adam_options(const char* name, const AdamFamilyOptions& o) {
  check_non_negative(o.lr, name, "learning rate (lr)");
  check_non_negative(o.eps, name, "epsilon (eps)");
  check_non_negative(o.weight_decay, name, "weight_decay");
  check_betas(name, o.beta1, o.beta2);
}
void check_options(const char* name, const AdamOptions& o) {
  check_adam_options(name, o);
}
void check_options(const char* name, const AdamWOptions& o) {
  check_adam_options(name, o);
}

void check_options(const char* name, const RMSpropOptions& o) {
  check_non_negative(o.lr, name, "learning rate (lr)");
  check_non_negative(o.eps, name, "epsilon (eps)");
  check_non_negative(o.momentum, name, "momentum");
  check_non_negative(o.weight_decay, name, "weight_decay");
  check_non_negative(o.alpha, name, "alpha");
}

void check_options(const char* name, const AdagradOptions& o) {
  check_non_negative(o.lr, name, "learning rate (lr)");
  check_non_negative(o.lr_decay, name, "lr_decay");
  check_non_negative(o.weight_decay, name, "weight_decay");
  check_non_negative(o.initial_accumulator_value, name, "initial_accumulator_value");
  check_non_negative(o.eps, name, "epsilon (eps)");
}

// Each option under its torch name, for the state_dict: visit("name", fields...) with one double,
// one bool or (betas) two doubles.
template <typename Visit>
void visit_options(SGDOptions& o, Visit&& visit) {
  visit("lr", o.lr);
  visit("momentum", o.momentum);
  visit("dampening", o.dampening);
  visit("weight_decay", o.weight_decay);
  visit("nesterov", o.nesterov);
}
template <typename AdamFamilyOptions, typename Visit>
void visit_adam_options(AdamFamilyOptions& o, Visit&& visit) {
  visit("lr", o.lr);
  visit("betas", o.beta1, o.beta2);
  visit("eps", o.eps);
  visit("weight_decay", o.weight_decay);
  visit("amsgrad", o.amsgrad);
}
template <typename Visit>
void visit_options(AdamOptions& o, Visit&& visit) {
  visit_adam_options(o, visit);
}
template <typename Visit>
void visit_options(AdamWOptions& o, Visit&& visit) {
  visit_adam_options(o, visit);
}
template <typename Visit>
void visit_options(RMSpropOptions& o, Visit&& visit) {
  visit("lr", o.lr);
  visit("alpha", o.alpha);
  visit("eps", o.eps);
  visit("weight_decay", o.weight_decay);
  visit("momentum", o.momentum);
  visit("centered", o.centered);
}
template <typename Visit>
void visit_options(AdagradOptions& o, Visit&& visit) {
  visit("lr", o.lr);
  visit("lr_decay", o.lr_decay);
  visit("weight_decay", o.weight_decay);
  visit("initial_accumulator_value", o.initial_accumulator_value);
  visit("eps", o.eps);
}

Tensor option_tensor(double v) {
  return scalar_tensor(v, kFloat64);
}
Tensor option_tensor(bool v) {
  return scalar_tensor(v, kBool);
}
Tensor option_tensor(double a, double b) {
  return from_vector(std::vector<double>{a, b});
}

// The values of `key`, `count` of them; raises naming the optimizer when the dict lacks it or it
// holds another number of values.
std::vector<double> read_values(const StateDict& d, const char* optimizer, const std::string& key,
                                int64_t count) {
  KILN_CHECK(d.contains(key), optimizer, ".load_state_dict: missing '", key, "'");
  const Tensor& t = d.at(key);
  KILN_CHECK(t.defined() && t.numel() == count, optimizer, ".load_state_dict: '", key,
             "' must hold ", count, " value(s), got ", describe(t));
  return t.to_vector<double>();
}
void read_option(const StateDict& d, const char* optimizer, const std::string& key, double& v) {
  v = read_values(d, optimizer, key, 1)[0];
}
// A missing flag keeps its default (false), as torch's __setstate__ does for dicts saved before
// the flag existed (amsgrad, nesterov).
void read_option(const StateDict& d, const char* optimizer, const std::string& key, bool& v) {
  if (d.contains(key)) v = read_values(d, optimizer, key, 1)[0] != 0.0;
}
void read_option(const StateDict& d, const char* optimizer, const std::string& key, double& a,
                 double& b) {
  const std::vector<double> v = read_values(d, optimizer, key, 2);
  a = v[0];
  b = v[1];
}

// ---------------------------------------------------------------------------- state_dict names

// Flat names for torch's nested optimizer state_dict: {"state": {i: {name: t}}, "param_groups":
// [{hyperparameter: v, "params": [i...]}]} becomes "state.<i>.<name>" and
// "param_groups.<g>.<hyperparameter>".
std::string state_key(size_t i, const char* name) {
  return "state." + std::to_string(i) + "." + name;
}
std::string group_prefix(size_t g) {
  return "param_groups." + std::to_string(g) + ".";
}

// For a key "<prefix><n>.<rest>": n and rest. False when the key has another form.
bool split_indexed(const std::string& key, const std::string& prefix, size_t& n,
                   std::string& rest) {
  if (key.rfind(prefix, 0) != 0) return false;
  const size_t dot = key.find('.', prefix.size());
  if (dot == std::string::npos) return false;
  const std::string index = key.substr(prefix.size(), dot - prefix.size());
  if (index.empty() || index.size() > 9 ||
      index.find_first_not_of("0123456789") != std::string::npos)
    return false;
  n = std::stoul(index);
  rest = key.substr(dot + 1);
  return true;
}

bool contains(const std::vector<std::string>& names, const std::string& n) {
  return std::find(names.begin(), names.end(), n) != names.end();
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

void put_step(StateDict& out, size_t i, const StepCount& step) {
  // torch keeps the step as a float32 tensor; exact to 2^24 steps.
  out.insert(state_key(i, "step"), scalar_tensor(static_cast<double>(step.value()), kFloat32));
}
void load_step(const StateDict& d, size_t i, StepCount& step) {
  step.set(static_cast<int64_t>(d.at(state_key(i, "step")).item<double>()));
}

}  // namespace

// ---------------------------------------------------------------------------- Optimizer

void Optimizer::add_parameters(const std::vector<Tensor>& params) {
  std::unordered_set<const detail::TensorImpl*> earlier;
  for (const Tensor& q : parameters_) earlier.insert(q.impl());
  for (size_t k = 0; k < params.size(); ++k) {
    const Tensor& p = params[k];
    const size_t i = parameters_.size() + k;
    KILN_CHECK(p.defined() && p.is_floating_point(), name_, ": parameter ", i,
               " must be a floating-point tensor, got ", describe(p));
    KILN_CHECK(p.is_leaf(), name_, ": can't optimize a non-leaf tensor (parameter ", i, ", ",
               describe(p), ", made by ", p.grad_fn_name(), ")");
    KILN_CHECK(!earlier.count(p.impl()), name_, ": parameter ", i, " (", describe(p),
               ") is already in another parameter group");
  }
  parameters_.insert(parameters_.end(), params.begin(), params.end());
}

void Optimizer::zero_grad() {
  // Without reading .grad first: a traced zero_grad then does not depend on whether it was set.
  for (Tensor& p : parameters_) p.mutable_grad() = Tensor();
}

// ---------------------------------------------------------------------------- StepCount

int64_t StepCount::value() const {
  return tensor_.defined() ? tensor_.item<int64_t>() : steps_;
}

void StepCount::set(int64_t steps) {
  steps_ = steps;
  if (tensor_.defined()) tensor_.fill_(steps);
}

int64_t StepCount::advance() {
  set(value() + 1);
  return steps_;
}

Tensor StepCount::advance_traced() {
  if (!tensor_.defined()) tensor_ = scalar_tensor(steps_, kFloat64);
  tensor_.add_(1);
  return tensor_;
}

// ---------------------------------------------------------------------------- groups

template <typename O>
GroupedOptimizer<O>::GroupedOptimizer(const char* name, O defaults)
    : Optimizer(name), defaults_(defaults) {
  check_options(name_, defaults_);
}

template <typename O>
void GroupedOptimizer<O>::add_groups(std::vector<ParamGroup<O>> groups) {
  KILN_CHECK(!groups.empty(), name_, ": no parameter groups given");
  for (ParamGroup<O>& g : groups) add_param_group(std::move(g));
}

template <typename O>
void GroupedOptimizer<O>::add_param_group(ParamGroup<O> group) {
  if (!group.has_options) group.options = defaults_;
  group.has_options = true;
  check_options(name_, group.options);
  const size_t first = parameters_.size();
  add_parameters(group.params);  // checks every parameter before it adds any
  groups_.push_back(std::move(group));
  for (size_t i = first; i < parameters_.size(); ++i) {
    group_of_.push_back(groups_.size() - 1);
    add_state(i);
  }
}

template <typename O>
void GroupedOptimizer<O>::check_groups() const {
  for (const ParamGroup<O>& g : groups_) check_options(name_, g.options);
}

template <typename O>
StateDict GroupedOptimizer<O>::state_dict() const {
  StateDict out;
  for (size_t i = 0; i < parameters_.size(); ++i) put_state(out, i);
  int64_t first = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string prefix = group_prefix(g);
    O o = groups_[g].options;
    visit_options(o, [&](const char* name, const auto&... fields) {
      out.insert(prefix + name, option_tensor(fields...));
    });
    const auto n = static_cast<int64_t>(groups_[g].params.size());
    std::vector<int64_t> indices(static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k) indices[static_cast<size_t>(k)] = first + k;
    out.insert(prefix + "params", from_vector(indices, Shape{n}));
    first += n;
  }
  return out;
}

template <typename O>
void GroupedOptimizer<O>::load_state_dict(const StateDict& d) {
  std::vector<O> loaded(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    visit_options(loaded[g], [&](const char* name, auto&... fields) {
      read_option(d, name_, group_prefix(g) + name, fields...);
    });
    check_options(name_, loaded[g]);
  }
  check_dict(d, loaded);
  NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].options = loaded[g];
  for (size_t i = 0; i < parameters_.size(); ++i) load_state(d, i);
}

// Checks every name of `d` against the groups and parameters: each group's parameter indices, the
// hyperparameters known, the state of existing parameters, known, shaped as its parameter, and
// complete for the options it will be updated with.
template <typename O>
void GroupedOptimizer<O>::check_dict(const StateDict& d, const std::vector<O>& loaded) const {
  std::vector<std::string> hyperparameters{"params"};
  O probe;
  visit_options(probe, [&](const char* name, auto&...) { hyperparameters.push_back(name); });
  size_t first = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const size_t n = groups_[g].params.size();
    const std::vector<double> params =
        read_values(d, name_, group_prefix(g) + "params", static_cast<int64_t>(n));
    for (size_t k = 0; k < n; ++k)
      KILN_CHECK(params[k] == static_cast<double>(first + k), name_,
                 ".load_state_dict: ", group_prefix(g), "params must be ", first, "..",
                 first + n - 1, " (the optimizer's parameter groups)");
    first += n;
  }
  const std::vector<std::string> scalars = scalar_state(), tensors = tensor_state();
  std::vector<bool> has_state(parameters_.size(), false);
  for (const auto& [key, t] : d) {
    const std::string where = std::string(name_) + ".load_state_dict: '" + key + "'";
    size_t n = 0;
    std::string name;
    if (split_indexed(key, "param_groups.", n, name)) {
      KILN_CHECK(n < groups_.size(), where, ": the optimizer has ", groups_.size(),
                 " parameter group(s)");
      KILN_CHECK(contains(hyperparameters, name), where, ": unknown hyperparameter");
      continue;
    }
    KILN_CHECK(split_indexed(key, "state.", n, name), where,
               ": expected state.<i>.<name> or param_groups.<g>.<name>");
    KILN_CHECK(n < parameters_.size(), where, ": no parameter of that index (the optimizer has ",
               parameters_.size(), ")");
    KILN_CHECK(t.defined(), where, " is undefined");
    const Tensor& p = parameters_[n];
    if (contains(scalars, name)) {
      KILN_CHECK(t.numel() == 1, where, " must hold one value, got ", describe(t));
    } else {
      KILN_CHECK(contains(tensors, name), where, ": unknown state '", name, "'");
      KILN_CHECK(t.sizes() == p.sizes(), where, " is ", describe(t), ", its parameter ",
                 describe(p));
    }
    has_state[n] = true;
  }
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (!has_state[i]) continue;
    for (const std::string& name : required_state(loaded[group_of_[i]]))
      KILN_CHECK(d.contains(state_key(i, name.c_str())), name_, ".load_state_dict: parameter ", i,
                 " has state but no '", state_key(i, name.c_str()), "'");
  }
}

// ---------------------------------------------------------------------------- SGD

SGD::SGD(std::vector<Tensor> parameters, SGDOptions options)
    : SGD(std::vector<ParamGroup<SGDOptions>>{ParamGroup<SGDOptions>(std::move(parameters))},
          options) {}

SGD::SGD(std::vector<ParamGroup<SGDOptions>> groups, SGDOptions defaults)
    : GroupedOptimizer("SGD", defaults) {
  add_groups(std::move(groups));
}

void SGD::step() {
  check_groups();
  NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    Tensor& p = parameters_[i];
    const Tensor& g = p.grad();
    if (!g.defined()) continue;
    check_grad(name_, g, p, i);
    Tensor& buf = momentum_buffers_[i];
    if (!is_fusable(p, g, {&buf})) {
      traced_update(p, g, buf, options_of(i));
      continue;
    }
    const SGDOptions o = options_of(i);
    const bool first = !buf.defined();
    if (o.momentum != 0.0 && first) buf = empty_like(p);
    detail::dispatch_floating(p.dtype(), "SGD", [&](auto tag) {
      using T = KILN_TYPE(tag);
      T* pp = data<T>(p);
      const T* gp = data<T>(g);
      T* bp = data<T>(buf);
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
  }
}

// The update made of ops (inside jit::trace, or for layouts the fused loop does not take).
void SGD::traced_update(Tensor& p, const Tensor& g, Tensor& buf, const SGDOptions& o) {
  const TracedOptions read(name_, alive_);
  Tensor d = grad_as_param(g, p);
  if (read.flag("weight_decay != 0", [&o] { return o.weight_decay != 0.0; }))
    d = d + p * read.scalar("weight_decay", o.weight_decay);
  if (read.flag("momentum != 0", [&o] { return o.momentum != 0.0; })) {
    const Tensor momentum = read.scalar("momentum", o.momentum);
    if (!buf.defined() && !detail::trace_mode()) {
      buf = empty_like(p).copy_(d);  // torch's first step: buf = g
    } else {
      if (!buf.defined()) {
        // A trace replays its first step forever: start from a zero buffer instead, which gives
        // the first step's buf = g exactly when there is no dampening.
        KILN_CHECK(o.dampening == 0.0,
                   "SGD: with dampening, the first step differs from the others; run one step "
                   "before jit::trace records the step");
        buf = zeros_like(p);
      }
      buf.mul_(momentum).add_(d * (1.0 - read.scalar("dampening", o.dampening)));
    }
    d = read.flag("nesterov", [&o] { return o.nesterov; }) ? d + buf * momentum : buf;
  }
  p.sub_(d * read.scalar("lr", o.lr));
}

void SGD::put_state(StateDict& out, size_t i) const {
  if (momentum_buffers_[i].defined())
    out.insert(state_key(i, "momentum_buffer"), momentum_buffers_[i].detach().clone());
}

void SGD::load_state(const StateDict& d, size_t i) {
  const std::string key = state_key(i, "momentum_buffer");
  if (d.contains(key))
    assign_state(momentum_buffers_[i], d.at(key), parameters_[i]);
  else
    momentum_buffers_[i] = Tensor();  // as torch: a parameter without saved state starts anew
}

// ---------------------------------------------------------------------------- Adam, AdamW

namespace {

// One step of Adam (decoupled = false: weight decay added to the gradient) or AdamW (decoupled:
// p *= 1 - lr * weight_decay first) for one parameter, as one loop over raw memory.
template <typename O>
void adam_fused(const Tensor& p, const Tensor& g, AdamState& s, const O& o, bool decoupled) {
  const double t = static_cast<double>(s.step.advance());
  const double step_size = o.lr / (1.0 - std::pow(o.beta1, t));
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, t));
  detail::dispatch_floating(p.dtype(), "Adam", [&](auto tag) {
    using T = KILN_TYPE(tag);
    T* pp = data<T>(p);
    const T* gp = data<T>(g);
    T* mp = data<T>(s.exp_avg);
    T* vp = data<T>(s.exp_avg_sq);
    T* maxp = o.amsgrad ? data<T>(s.max_exp_avg_sq) : nullptr;
    const T l2 = static_cast<T>(decoupled ? 0.0 : o.weight_decay);
    const T decay = static_cast<T>(1.0 - o.lr * o.weight_decay);
    const bool decay_param = decoupled && o.weight_decay != 0.0;
    const T w1 = static_cast<T>(1.0 - o.beta1);
    const T beta2 = static_cast<T>(o.beta2), w2 = static_cast<T>(1.0 - o.beta2);
    const T eps = static_cast<T>(o.eps), lr = static_cast<T>(step_size);
    const T inv_bc2 = static_cast<T>(1.0 / bias_correction2_sqrt);
    detail::parallel_for(p.numel(), detail::kParallelGrain, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        T grad = gp[k];
        if (l2 != T(0)) grad += l2 * pp[k];
        if (decay_param) pp[k] *= decay;
        // exp_avg.lerp_(grad, 1 - beta1), as torch writes it.
        T m = mp[k] + w1 * (grad - mp[k]);
        T v = beta2 * vp[k] + w2 * grad * grad;
        mp[k] = m;
        vp[k] = v;
        if (maxp) v = maxp[k] = std::max(maxp[k], v);
        pp[k] -= lr * m / (std::sqrt(v) * inv_bc2 + eps);
      }
    });
  });
  detail::bump_version(p);
}

// The same step made of ops (inside jit::trace, or for layouts the fused loop does not take).
template <typename O>
void adam_ops(Tensor& p, const Tensor& g, AdamState& s, const O& o, bool decoupled,
              const TracedOptions& read) {
  const Tensor lr = read.scalar("lr", o.lr), beta1 = read.scalar("beta1", o.beta1);
  const Tensor beta2 = read.scalar("beta2", o.beta2), eps = read.scalar("eps", o.eps);
  const Tensor t = s.step.advance_traced();
  Tensor step_size = reciprocal(1.0 - pow(beta1, t)) * lr;
  Tensor bias_correction2_sqrt = sqrt(1.0 - pow(beta2, t));
  Tensor grad = grad_as_param(g, p);
  if (read.flag("weight_decay != 0", [&o] { return o.weight_decay != 0.0; })) {
    const Tensor weight_decay = read.scalar("weight_decay", o.weight_decay);
    if (decoupled)
      p.mul_(1.0 - lr * weight_decay);
    else
      grad = grad + p * weight_decay;
  }
  s.exp_avg.mul_(beta1).add_(grad * (1.0 - beta1));
  s.exp_avg_sq.mul_(beta2).add_(grad * grad * (1.0 - beta2));
  Tensor v = s.exp_avg_sq;
  if (read.flag("amsgrad", [&o] { return o.amsgrad; })) {
    s.max_exp_avg_sq.copy_(maximum(s.max_exp_avg_sq, s.exp_avg_sq));
    v = s.max_exp_avg_sq;
  }
  Tensor denom = (v.sqrt() / bias_correction2_sqrt).add_(eps);
  p.sub_(s.exp_avg / denom * step_size);
}

template <typename O>
void adam_step(const char* name, bool decoupled, std::vector<Tensor>& parameters,
               std::vector<AdamState>& state, const std::function<const O&(size_t)>& options_of,
               const TracedOptions& read) {
  NoGradGuard no_grad;
  for (size_t i = 0; i < parameters.size(); ++i) {
    Tensor& p = parameters[i];
    const Tensor& g = p.grad();
    if (!g.defined()) continue;
    check_grad(name, g, p, i);
    AdamState& s = state[i];
    const O& o = options_of(i);
    if (!s.exp_avg.defined()) {
      s.exp_avg = zeros_like(p);
      s.exp_avg_sq = zeros_like(p);
    }
    if (o.amsgrad && !s.max_exp_avg_sq.defined()) s.max_exp_avg_sq = zeros_like(p);
    if (is_fusable(p, g, {&s.exp_avg, &s.exp_avg_sq, &s.max_exp_avg_sq}))
      adam_fused(p, g, s, o, decoupled);
    else
      adam_ops(p, g, s, o, decoupled, read);
  }
}

void put_adam_state(StateDict& out, size_t i, const AdamState& s) {
  if (!s.exp_avg.defined()) return;
  put_step(out, i, s.step);
  out.insert(state_key(i, "exp_avg"), s.exp_avg.detach().clone());
  out.insert(state_key(i, "exp_avg_sq"), s.exp_avg_sq.detach().clone());
  if (s.max_exp_avg_sq.defined())
    out.insert(state_key(i, "max_exp_avg_sq"), s.max_exp_avg_sq.detach().clone());
}

void load_adam_state(const StateDict& d, size_t i, AdamState& s, const Tensor& p) {
  if (!d.contains(state_key(i, "step"))) {
    s = AdamState();  // as torch: a parameter without saved state starts anew
    return;
  }
  load_step(d, i, s.step);
  assign_state(s.exp_avg, d.at(state_key(i, "exp_avg")), p);
  assign_state(s.exp_avg_sq, d.at(state_key(i, "exp_avg_sq")), p);
  const std::string max_key = state_key(i, "max_exp_avg_sq");
  if (d.contains(max_key))
    assign_state(s.max_exp_avg_sq, d.at(max_key), p);
  else
    s.max_exp_avg_sq = Tensor();
}

std::vector<std::string> adam_required_state(bool amsgrad) {
  std::vector<std::string> names{"step", "exp_avg", "exp_avg_sq"};
  if (amsgrad) names.push_back("max_exp_avg_sq");
  return names;
}

}  // namespace

template <typename Options>
AdamFamily<Options>::AdamFamily(const char* name, bool decoupled,
                                std::vector<ParamGroup<Options>> groups, Options defaults)
    : GroupedOptimizer<Options>(name, defaults), decoupled_(decoupled) {
  this->add_groups(std::move(groups));
}

template <typename Options>
void AdamFamily<Options>::step() {
  this->check_groups();
  adam_step<Options>(
      this->name_, decoupled_, this->parameters_, state_,
      [this](size_t i) -> const Options& { return this->options_of(i); },
      TracedOptions(this->name_, this->alive_));
}

template <typename Options>
void AdamFamily<Options>::put_state(StateDict& out, size_t i) const {
  put_adam_state(out, i, state_[i]);
}
template <typename Options>
std::vector<std::string> AdamFamily<Options>::tensor_state() const {
  return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
}
template <typename Options>
std::vector<std::string> AdamFamily<Options>::required_state(const Options& o) const {
  return adam_required_state(o.amsgrad);
}
template <typename Options>
void AdamFamily<Options>::load_state(const StateDict& d, size_t i) {
  load_adam_state(d, i, state_[i], this->parameters_[i]);
}

template class AdamFamily<AdamOptions>;
template class AdamFamily<AdamWOptions>;

Adam::Adam(std::vector<Tensor> parameters, AdamOptions options)
    : Adam(std::vector<ParamGroup<AdamOptions>>{ParamGroup<AdamOptions>(std::move(parameters))},
           options) {}

Adam::Adam(std::vector<ParamGroup<AdamOptions>> groups, AdamOptions defaults)
    : AdamFamily("Adam", false, std::move(groups), defaults) {}

AdamW::AdamW(std::vector<Tensor> parameters, AdamWOptions options)
    : AdamW(std::vector<ParamGroup<AdamWOptions>>{ParamGroup<AdamWOptions>(std::move(parameters))},
            options) {}

AdamW::AdamW(std::vector<ParamGroup<AdamWOptions>> groups, AdamWOptions defaults)
    : AdamFamily("AdamW", true, std::move(groups), defaults) {}

// ---------------------------------------------------------------------------- RMSprop

RMSprop::RMSprop(std::vector<Tensor> parameters, RMSpropOptions options)
    : RMSprop(std::vector<ParamGroup<RMSpropOptions>>{ParamGroup<RMSpropOptions>(
                  std::move(parameters))},
              options) {}

RMSprop::RMSprop(std::vector<ParamGroup<RMSpropOptions>> groups, RMSpropOptions defaults)
    : GroupedOptimizer("RMSprop", defaults) {
  add_groups(std::move(groups));
}

void RMSprop::step() {
  check_groups();
  NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    Tensor& p = parameters_[i];
    const Tensor& g = p.grad();
    if (!g.defined()) continue;
    check_grad(name_, g, p, i);
    State& s = state_[i];
    const RMSpropOptions& o = options_of(i);
    // As torch, the buffers start at zero when first needed.
    if (!s.square_avg.defined()) s.square_avg = zeros_like(p);
    if (o.momentum > 0.0 && !s.momentum_buffer.defined()) s.momentum_buffer = zeros_like(p);
    if (o.centered && !s.grad_avg.defined()) s.grad_avg = zeros_like(p);
    if (!is_fusable(p, g, {&s.square_avg, &s.momentum_buffer, &s.grad_avg})) {
      traced_update(p, g, s, o);
      continue;
    }
    s.step.advance();
    detail::dispatch_floating(p.dtype(), "RMSprop", [&](auto tag) {
      using T = KILN_TYPE(tag);
      T* pp = data<T>(p);
      const T* gp = data<T>(g);
      T* vp = data<T>(s.square_avg);
      T* bp = o.momentum > 0.0 ? data<T>(s.momentum_buffer) : nullptr;
      T* ap = o.centered ? data<T>(s.grad_avg) : nullptr;
      const T lr = static_cast<T>(o.lr), wd = static_cast<T>(o.weight_decay);
      const T alpha = static_cast<T>(o.alpha), w = static_cast<T>(1.0 - o.alpha);
      const T eps = static_cast<T>(o.eps), momentum = static_cast<T>(o.momentum);
      detail::parallel_for(p.numel(), detail::kParallelGrain, [&](int64_t b, int64_t e) {
        for (int64_t k = b; k < e; ++k) {
          T grad = gp[k];
          if (wd != T(0)) grad += wd * pp[k];
          const T v = alpha * vp[k] + w * grad * grad;
          vp[k] = v;
          T avg;
          if (ap) {
            const T a = ap[k] + w * (grad - ap[k]);  // grad_avg.lerp_(grad, 1 - alpha)
            ap[k] = a;
            avg = std::sqrt(v - a * a) + eps;
          } else {
            avg = std::sqrt(v) + eps;
          }
          if (bp) {
            const T buf = momentum * bp[k] + grad / avg;
            bp[k] = buf;
            pp[k] -= lr * buf;
          } else {
            pp[k] -= lr * (grad / avg);
          }
        }
      });
    });
    detail::bump_version(p);
  }
}

// The update made of ops (inside jit::trace, or for layouts the fused loop does not take).
void RMSprop::traced_update(Tensor& p, const Tensor& g, State& s, const RMSpropOptions& o) {
  const TracedOptions read(name_, alive_);
  s.step.advance_traced();
  const Tensor alpha = read.scalar("alpha", o.alpha), eps = read.scalar("eps", o.eps);
  Tensor grad = grad_as_param(g, p);
  if (read.flag("weight_decay != 0", [&o] { return o.weight_decay != 0.0; }))
    grad = grad + p * read.scalar("weight_decay", o.weight_decay);
  s.square_avg.mul_(alpha).add_(grad * grad * (1.0 - alpha));
  Tensor avg;
  if (read.flag("centered", [&o] { return o.centered; })) {
    s.grad_avg.add_((grad - s.grad_avg) * (1.0 - alpha));
    avg = sqrt(s.square_avg - s.grad_avg * s.grad_avg) + eps;
  } else {
    avg = sqrt(s.square_avg) + eps;
  }
  const Tensor lr = read.scalar("lr", o.lr);
  if (read.flag("momentum > 0", [&o] { return o.momentum > 0.0; })) {
    s.momentum_buffer.mul_(read.scalar("momentum", o.momentum)).add_(grad / avg);
    p.sub_(s.momentum_buffer * lr);
  } else {
    p.sub_(grad / avg * lr);
  }
}

void RMSprop::put_state(StateDict& out, size_t i) const {
  const State& s = state_[i];
  if (!s.square_avg.defined()) return;
  put_step(out, i, s.step);
  out.insert(state_key(i, "square_avg"), s.square_avg.detach().clone());
  if (s.momentum_buffer.defined())
    out.insert(state_key(i, "momentum_buffer"), s.momentum_buffer.detach().clone());
  if (s.grad_avg.defined()) out.insert(state_key(i, "grad_avg"), s.grad_avg.detach().clone());
}

std::vector<std::string> RMSprop::tensor_state() const {
  return {"square_avg", "momentum_buffer", "grad_avg"};
}

std::vector<std::string> RMSprop::required_state(const RMSpropOptions& o) const {
  std::vector<std::string> names{"step", "square_avg"};
  if (o.momentum > 0.0) names.push_back("momentum_buffer");
  if (o.centered) names.push_back("grad_avg");
  return names;
}

void RMSprop::load_state(const StateDict& d, size_t i) {
  State& s = state_[i];
  if (!d.contains(state_key(i, "step"))) {
    s = State();  // as torch: a parameter without saved state starts anew
    return;
  }
  load_step(d, i, s.step);
  const Tensor& p = parameters_[i];
  assign_state(s.square_avg, d.at(state_key(i, "square_avg")), p);
  for (auto [name, slot] : {std::pair<const char*, Tensor*>{"momentum_buffer", &s.momentum_buffer},
                            {"grad_avg", &s.grad_avg}}) {
    if (d.contains(state_key(i, name)))
      assign_state(*slot, d.at(state_key(i, name)), p);
    else
      *slot = Tensor();
  }
}

// ---------------------------------------------------------------------------- Adagrad

Adagrad::Adagrad(std::vector<Tensor> parameters, AdagradOptions options)
    : Adagrad(std::vector<ParamGroup<AdagradOptions>>{ParamGroup<AdagradOptions>(
                  std::move(parameters))},
              options) {}

Adagrad::Adagrad(std::vector<ParamGroup<AdagradOptions>> groups, AdagradOptions defaults)
    : GroupedOptimizer("Adagrad", defaults) {
  add_groups(std::move(groups));
}

void Adagrad::add_state(size_t i) {
  NoGradGuard no_grad;
  State s;
  s.sum = full_like(parameters_[i], options_of(i).initial_accumulator_value);
  state_.push_back(std::move(s));
}

void Adagrad::step() {
  check_groups();
  NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    Tensor& p = parameters_[i];
    const Tensor& g = p.grad();
    if (!g.defined()) continue;
    check_grad(name_, g, p, i);
    State& s = state_[i];
    const AdagradOptions& o = options_of(i);
    if (!is_fusable(p, g, {&s.sum})) {
      traced_update(p, g, s, o);
      continue;
    }
    const double t = static_cast<double>(s.step.advance());
    const double clr = o.lr / (1.0 + (t - 1.0) * o.lr_decay);
    detail::dispatch_floating(p.dtype(), "Adagrad", [&](auto tag) {
      using T = KILN_TYPE(tag);
      T* pp = data<T>(p);
      const T* gp = data<T>(g);
      T* sp = data<T>(s.sum);
      const T lr = static_cast<T>(clr), wd = static_cast<T>(o.weight_decay);
      const T eps = static_cast<T>(o.eps);
      detail::parallel_for(p.numel(), detail::kParallelGrain, [&](int64_t b, int64_t e) {
        for (int64_t k = b; k < e; ++k) {
          T grad = gp[k];
          if (wd != T(0)) grad += wd * pp[k];
          const T sum = sp[k] + grad * grad;
          sp[k] = sum;
          pp[k] -= lr * (grad / (std::sqrt(sum) + eps));
        }
      });
    });
    detail::bump_version(p);
  }
}

// The update made of ops (inside jit::trace, or for layouts the fused loop does not take).
void Adagrad::traced_update(Tensor& p, const Tensor& g, State& s, const AdagradOptions& o) {
  const TracedOptions read(name_, alive_);
  const Tensor t = s.step.advance_traced();
  const Tensor clr =
      read.scalar("lr", o.lr) / (1.0 + (t - 1.0) * read.scalar("lr_decay", o.lr_decay));
  Tensor grad = grad_as_param(g, p);
  if (read.flag("weight_decay != 0", [&o] { return o.weight_decay != 0.0; }))
    grad = grad + p * read.scalar("weight_decay", o.weight_decay);
  s.sum.add_(grad * grad);
  p.sub_(grad / (sqrt(s.sum) + read.scalar("eps", o.eps)) * clr);
}

void Adagrad::put_state(StateDict& out, size_t i) const {
  put_step(out, i, state_[i].step);
  out.insert(state_key(i, "sum"), state_[i].sum.detach().clone());
}

void Adagrad::load_state(const StateDict& d, size_t i) {
  State& s = state_[i];
  if (!d.contains(state_key(i, "step"))) {
    s.step.set(0);
    s.sum.fill_(options_of(i).initial_accumulator_value);
    return;
  }
  load_step(d, i, s.step);
  assign_state(s.sum, d.at(state_key(i, "sum")), parameters_[i]);
}

template class GroupedOptimizer<SGDOptions>;
template class GroupedOptimizer<AdamOptions>;
template class GroupedOptimizer<AdamWOptions>;
template class GroupedOptimizer<RMSpropOptions>;
template class GroupedOptimizer<AdagradOptions>;

}  // namespace kiln::optim
