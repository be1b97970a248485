// kiln::testing::gradcheck and gradgradcheck: autograd's Jacobians against central differences.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/autograd.h"
#include "kiln/error.h"
#include "kiln/ops.h"
#include "kiln/testing.h"
#include "lib/lazy.h"

namespace kiln::testing {
namespace {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

// Enough digits to see how far apart two nearly equal derivatives are.
std::string num_str(double v) {
  std::ostringstream os;
  os.precision(10);
  os << v;
  return os.str();
}

std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    idx[i] = flat % shape[i];
    flat /= shape[i];
  }
  return idx;
}

// Perturbing one element through its address would move every element that aliases it, so the
// finite differences would no longer be per-element (torch refuses such inputs too).
bool has_internal_overlap(const Tensor& t) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.push_back(d);
  std::sort(dims.begin(), dims.end(),
            [&](int64_t a, int64_t b) { return std::abs(t.stride(a)) < std::abs(t.stride(b)); });
  int64_t reach = 0;  // the farthest element offset the smaller-stride dims can address
  for (int64_t d : dims) {
    int64_t stride = std::abs(t.stride(d));
    if (stride <= reach) return true;
    reach += stride * (t.size(d) - 1);
  }
  return false;
}

// Address of element `flat` (row-major over t's logical shape) in t's strided storage, for a
// perturbation: pending work that reads t runs first.
double* element_address(const Tensor& t, int64_t flat) {
  detail::prepare_write(t);
  std::vector<int64_t> idx = unravel(flat, t.sizes());
  int64_t offset = 0;
  for (size_t d = 0; d < idx.size(); ++d) offset += idx[d] * t.stride(static_cast<int64_t>(d));
  return static_cast<double*>(t.raw_data_ptr()) + offset;
}

// Row-major values of every floating-point output (other outputs have no gradient).
std::vector<std::vector<double>> float_output_values(const std::vector<Tensor>& outputs) {
  std::vector<std::vector<double>> values(outputs.size());
  for (size_t k = 0; k < outputs.size(); ++k)
    if (outputs[k].defined() && outputs[k].is_floating_point())
      values[k] = outputs[k].to_vector<double>();
  return values;
}

}  // namespace

bool gradcheck(const DifferentiableFunction& fn, const std::vector<Tensor>& inputs,
               const GradcheckOptions& options) {
  std::vector<size_t> diff;  // positions of the inputs that require grad
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    if (!x.defined() || !x.requires_grad()) continue;
    KILN_CHECK(x.dtype() == kFloat64, "gradcheck: input ", i, " requires grad but is ", x.dtype(),
               shape_str(x.sizes()), "; finite differences need float64 inputs");
    KILN_CHECK(!has_internal_overlap(x), "gradcheck: input ", i, " (shape ", shape_str(x.sizes()),
               ", strides ", shape_str(x.strides()),
               ") has elements that share memory; perturbing one would move the others");
    diff.push_back(i);
  }
  if (diff.empty()) return true;

  // Numerical Jacobian: numeric[d][k][j * out_numel + m] = d out_k[m] / d input_d[j].
  std::vector<std::vector<std::vector<double>>> numeric(diff.size());
  std::vector<Shape> out_shapes;
  std::vector<bool> out_float;
  {
    NoGradGuard no_grad;
    std::vector<Tensor> base = fn(inputs);
    for (const Tensor& o : base) {
      out_shapes.push_back(o.defined() ? o.sizes() : Shape{});
      out_float.push_back(o.defined() && o.is_floating_point());
    }
    for (size_t d = 0; d < diff.size(); ++d) {
      const Tensor& x = inputs[diff[d]];
      const int64_t n = x.numel();
      numeric[d].resize(base.size());
      for (size_t k = 0; k < base.size(); ++k)
        if (out_float[k]) numeric[d][k].assign(n * base[k].numel(), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        double* p = element_address(x, j);
        const double original = *p;
        *p = original + options.eps;
        std::vector<std::vector<double>> plus = float_output_values(fn(inputs));
        *p = original - options.eps;
        std::vector<std::vector<double>> minus = float_output_values(fn(inputs));
        *p = original;
        for (size_t k = 0; k < base.size(); ++k) {
          if (!out_float[k]) continue;
          const size_t m_count = plus[k].size();
          KILN_CHECK(m_count == minus[k].size() && static_cast<int64_t>(m_count) == base[k].numel(),
                     "gradcheck: output ", k, " changed size when input ", diff[d],
                     " was perturbed");
          for (size_t m = 0; m < m_count; ++m)
            numeric[d][k][j * m_count + m] = (plus[k][m] - minus[k][m]) / (2 * options.eps);
        }
      }
    }
  }

  // Analytical Jacobian, one row (vector-Jacobian product with a one-hot vector) at a time.
  AutoGradMode grad_mode(true);
  std::vector<Tensor> outputs = fn(inputs);
  KILN_CHECK(outputs.size() == out_shapes.size(), "gradcheck: the function returned ",
             outputs.size(), " outputs, then ", out_shapes.size());
  std::vector<Tensor> diff_inputs;
  for (size_t i : diff) diff_inputs.push_back(inputs[i]);

  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!out_float[k]) continue;
    const Tensor& out = outputs[k];
    const int64_t m_count = out.numel();
    for (int64_t m = 0; m < m_count; ++m) {
      std::vector<Tensor> grads(diff.size());
      if (out.requires_grad()) {
        std::vector<double> one_hot(m_count, 0.0);
        one_hot[m] = 1.0;
        Tensor go = from_vector(one_hot, out.sizes()).to(out.dtype());
        grads = autograd::grad({out}, diff_inputs, {go}, /*retain_graph=*/true,
                               /*create_graph=*/false, /*allow_unused=*/true);
      }
      for (size_t d = 0; d < diff.size(); ++d) {
        const Tensor& x = diff_inputs[d];
        const int64_t n = x.numel();
        std::vector<double> analytic(n, 0.0);
        if (grads[d].defined()) {
          KILN_CHECK(grads[d].sizes() == x.sizes(), "gradcheck: the gradient of input ", diff[d],
                     " has shape ", shape_str(grads[d].sizes()), " but the input has shape ",
                     shape_str(x.sizes()), " (output ", k, ")");
          KILN_CHECK(grads[d].dtype() == x.dtype(), "gradcheck: the gradient of input ", diff[d],
                     " is ", grads[d].dtype(), " but the input is ", x.dtype(), " (output ", k,
                     ")");
          analytic = grads[d].to_vector<double>();
        }
        for (int64_t j = 0; j < n; ++j) {
          const double a = analytic[j];
          const double num = numeric[d][k][j * m_count + m];
          if (std::fabs(a - num) <= options.atol + options.rtol * std::fabs(num)) continue;
          std::vector<int64_t> in_idx = unravel(j, x.sizes());
          std::vector<int64_t> out_idx = unravel(m, out.sizes());
          KILN_FAIL("gradcheck: Jacobian mismatch for input ", diff[d], " (shape ",
                    shape_str(x.sizes()), ") element ", shape_str(in_idx), " and output ", k,
                    " (shape ", shape_str(out.sizes()), ") element ", shape_str(out_idx),
                    ": analytic ", num_str(a), ", numeric ", num_str(num), " (atol ", options.atol,
                    ", rtol ", options.rtol, ")");
        }
      }
    }
  }
  return true;
}

bool gradgradcheck(const DifferentiableFunction& fn, const std::vector<Tensor>& inputs,
                   const GradcheckOptions& options) {
  const size_t n_inputs = inputs.size();
  std::vector<size_t> diff;
  for (size_t i = 0; i < n_inputs; ++i)
    if (inputs[i].defined() && inputs[i].requires_grad()) diff.push_back(i);
  if (diff.empty()) return true;

  // Which outputs carry a gradient, and random cotangents for them. A private generator keeps
  // kiln's own (which fn may reseed, e.g. for dropout) untouched.
  std::vector<size_t> carried;
  std::vector<Tensor> all_inputs = inputs;
  {
    AutoGradMode grad_mode(true);
    std::vector<Tensor> outputs = fn(inputs);
    std::mt19937_64 gen(0x6b696c6e);
    std::uniform_real_distribution<double> dist(-1.0, 1.0);
    for (size_t k = 0; k < outputs.size(); ++k) {
      const Tensor& o = outputs[k];
      if (!o.defined() || !o.is_floating_point() || !o.requires_grad()) continue;
      KILN_CHECK(o.dtype() == kFloat64, "gradgradcheck: output ", k, " is ", o.dtype(),
                 "; its random grad_output must be float64 for finite differences");
      std::vector<double> v(o.numel());
      for (double& x : v) x = dist(gen);
      Tensor go = from_vector(v, o.sizes());
      go.requires_grad_();
      carried.push_back(k);
      all_inputs.push_back(go);
    }
  }
  if (carried.empty()) return true;

  DifferentiableFunction first_derivative = [fn, n_inputs, diff,
                                             carried](const std::vector<Tensor>& args) {
    // gradcheck evaluates this under NoGradGuard for finite differences, but the inner backward
    // needs a recorded graph.
    AutoGradMode grad_mode(true);
    std::vector<Tensor> x(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(n_inputs));
    std::vector<Tensor> outputs = fn(x);
    std::vector<Tensor> outs, gos;
    for (size_t c = 0; c < carried.size(); ++c) {
      const Tensor& o = outputs[carried[c]];
      if (!o.requires_grad()) continue;
      outs.push_back(o);
      gos.push_back(args[n_inputs + c]);
    }
    std::vector<Tensor> wrt;
    for (size_t i : diff) wrt.push_back(x[i]);
    std::vector<Tensor> grads(wrt.size());
    if (!outs.empty())
      grads = autograd::grad(outs, wrt, gos, /*retain_graph=*/true, /*create_graph=*/true,
                             /*allow_unused=*/true);
    for (size_t d = 0; d < grads.size(); ++d)
      if (!grads[d].defined()) grads[d] = zeros(wrt[d].sizes(), wrt[d].dtype());
    return grads;
  };
  return gradcheck(first_derivative, all_inputs, options);
}

}  // namespace kiln::testing
