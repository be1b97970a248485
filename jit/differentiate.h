// Splitting a graph that computes a function and its gradients into an augmented forward graph and
// a backward graph, deciding per value between saving it and recomputing it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "jit/ir.h"

namespace kiln::jit {

// The part of `g` that computes `outputs`, as a new graph. Its inputs are, in order, the inputs of
// g it reads (in g's input order) and then every value of `cut` (values computed elsewhere and
// passed in). `input_origin` receives, per new input, the index of the g input it stands for, or
// -1 - k for cut[k]. Iterative and linear in g.
std::unique_ptr<Graph> extract(const Graph& g, const std::vector<const Value*>& outputs,
                               const std::vector<const Value*>& cut,
                               std::vector<int64_t>* input_origin);

// A joint graph split in two. `joint` computes a function's outputs (its first
// `num_forward_outputs` outputs) and, from the inputs marked in `is_grad_input` (the gradients of
// some outputs), gradients (the remaining outputs).
//
// What the backward needs from the forward is recomputed where that is cheap (elementwise ops,
// views and numbers: inside the backward's fused kernels they cost no memory traffic) and saved
// where it is not (GEMMs, reductions and every other op, whose results the augmented forward then
// also returns). Graph inputs are read by both halves directly.
struct Differentiated {
  std::unique_ptr<Graph> forward;   // outputs: the forward outputs, then the saved values
  std::unique_ptr<Graph> backward;  // outputs: the gradients
  size_t num_saved = 0;
  // Per input of each graph: the joint input it stands for, or (backward) -1 - k: saved value k.
  std::vector<int64_t> forward_inputs;
  std::vector<int64_t> backward_inputs;
};
Differentiated split_forward_backward(const Graph& joint, size_t num_forward_outputs,
                                      const std::vector<bool>& is_grad_input);

// The symbolic derivative of a graph (one without fusion groups): an augmented forward graph and
// a backward graph, made with the ops' own gradient formulas (those eager autograd runs), split as
// split_forward_backward does. `wrt` flags the inputs to differentiate (by default every input of
// a floating type); the outputs differentiated are the floating ones that depend on them.
struct GraphGradient {
  enum SourceKind { kInput, kConstant, kSaved, kOutputGrad };
  struct Source {
    SourceKind kind;
    size_t index;  // g's input, constants[index], the saved value, or g's output whose gradient
                   // it is
  };
  // Inputs: per forward_inputs (g's inputs and constants). Outputs: g's outputs, then num_saved
  // values for the backward.
  std::unique_ptr<Graph> forward;
  std::vector<Source> forward_inputs;
  size_t num_saved = 0;
  // Null when no output depends on a differentiated input. Inputs: per backward_inputs. Outputs:
  // the gradient of g's input gradient_of[k] (an input no output depends on gets none).
  std::unique_ptr<Graph> backward;
  std::vector<Source> backward_inputs;
  std::vector<size_t> gradient_of;
  std::vector<size_t> differentiated_outputs;  // g's outputs that get an incoming gradient
  // Tensors the gradient formulas made (e.g. a zero-filled buffer), read as graph inputs.
  std::vector<Tensor> constants;
};
GraphGradient differentiate(const Graph& g, std::vector<bool> wrt = {});

// Ops whose result is cheap to recompute where it is read rather than saved: elementwise ops the
// fuser has a formula for, and views; never random draws. Traced backwards (below) and lazy
// evaluation's recipes (exec/lazy_recipe.cpp) both use it.
bool cheap_to_recompute(const OpDef& op);
// Whether the backward recomputes a forward value made by `n` rather than saving it.
bool recompute_in_backward(const Node& n);

}  // namespace kiln::jit
