// Testing utilities for users and kiln's own tests: gradient checks by finite differences.
#pragma once

#include <functional>
#include <type_traits>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::testing {

struct GradcheckOptions {
  double eps = 1e-6;   // central-difference step
  double atol = 1e-5;  // |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-3;
};

using DifferentiableFunction = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// Compares the Jacobian that backward computes (one vector-Jacobian product per output element)
// with central finite differences, for every input that requires grad. Inputs that require grad
// must be float64. Returns true, or throws kiln::Error naming the input, output and element
// where the two disagree.
bool gradcheck(const DifferentiableFunction& fn, const std::vector<Tensor>& inputs,
               const GradcheckOptions& options = {});
// gradcheck of the first derivative: checks that the backward pass, recorded with
// create_graph=true, is itself differentiated correctly (with respect to the inputs and to random
// grad_outputs).
bool gradgradcheck(const DifferentiableFunction& fn, const std::vector<Tensor>& inputs,
                   const GradcheckOptions& options = {});

// Overloads for functions returning a single tensor.
template <typename F, typename = std::enable_if_t<std::is_convertible_v<
                          std::invoke_result_t<F, const std::vector<Tensor>&>, Tensor>>>
bool gradcheck(F fn, const std::vector<Tensor>& inputs, const GradcheckOptions& options = {}) {
  return gradcheck(DifferentiableFunction(
                       [fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in)}; }),
                   inputs, options);
}
template <typename F, typename = std::enable_if_t<std::is_convertible_v<
                          std::invoke_result_t<F, const std::vector<Tensor>&>, Tensor>>>
bool gradgradcheck(F fn, const std::vector<Tensor>& inputs, const GradcheckOptions& options = {}) {
  return gradgradcheck(DifferentiableFunction([fn](const std::vector<Tensor>& in) {
                         return std::vector<Tensor>{fn(in)};
                       }),
                       inputs, options);
}

}  // namespace kiln::testing
