// Reverse-mode automatic differentiation: grad mode, backward and autograd::grad.
#pragma once

#include <optional>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

// Whether ops record the graph that backward walks. On by default, per thread.
bool is_grad_enabled();
void set_grad_enabled(bool enabled);

// Sets grad mode for a scope and restores the previous mode on exit.
class AutoGradMode {
 public:
  explicit AutoGradMode(bool enabled) : previous_(is_grad_enabled()) { set_grad_enabled(enabled); }
  ~AutoGradMode() { set_grad_enabled(previous_); }
  AutoGradMode(const AutoGradMode&) = delete;
  AutoGradMode& operator=(const AutoGradMode&) = delete;

 private:
  bool previous_;
};

// Ops in this scope record nothing: for optimizer updates, evaluation and in-place edits of
// parameters.
class NoGradGuard : public AutoGradMode {
 public:
  NoGradGuard() : AutoGradMode(false) {}
};

namespace autograd {

// Gradients of sum(outputs[i] * grad_outputs[i]) with respect to each of `inputs`, returned
// rather than accumulated into .grad(). grad_outputs may be empty when every output is a scalar
// (a gradient of 1 each). retain_graph defaults to create_graph; create_graph records the backward
// pass itself, so the result can be differentiated again. An input the outputs do not depend on
// is an error unless allow_unused, and then its gradient is undefined.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {},
                         std::optional<bool> retain_graph = std::nullopt, bool create_graph = false,
                         bool allow_unused = false);

// Accumulates the gradients of sum(tensors[i] * grad_tensors[i]) into the .grad() of every leaf
// that requires grad.
void backward(const std::vector<Tensor>& tensors, const std::vector<Tensor>& grad_tensors = {},
              std::optional<bool> retain_graph = std::nullopt, bool create_graph = false);

}  // namespace autograd
}  // namespace kiln
