// Reverse-mode autograd internals: graph nodes, saved tensors, and the hooks through which each op
// records its gradient formula.
//
// An op that may be differentiated records, after its kernel ran, one Node holding its gradient
// formula (a function of the output gradients written in kiln ops, so that a backward pass is
// itself a sequence of ordinary, recordable ops), the tensors the formula needs (SavedTensor,
// which detects in-place changes through the storage's version counter) and one Edge per input
// pointing at the node that produced that input (or at the leaf's AccumulateGrad).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "lib/tensor_impl.h"

namespace kiln::detail {

struct Node;

struct Edge {
  std::shared_ptr<Node> node;
  uint32_t input_nr = 0;  // which of node's outputs the gradient belongs to
  bool valid() const { return node != nullptr; }
};

// Per-tensor autograd state, allocated the first time a tensor takes part in autograd.
struct AutogradMeta {
  bool requires_grad = false;  // set on leaves by requires_grad_()
  bool retains_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;
  std::weak_ptr<Node> grad_accumulator;
};

// A tensor a gradient formula needs. Inputs keep their history (to differentiate the formula
// again); outputs hold their node weakly to avoid a cycle through the node that saves them.
class SavedTensor {
 public:
  SavedTensor() = default;
  // output_nr: which output of the recording node t is (its grad_fn is not set yet when saved).
  SavedTensor(const Tensor& t, bool is_output, uint32_t output_nr = 0);
  // The saved tensor, or an error naming `op` when it was modified in place since it was saved
  // or the graph was already freed by a backward pass.
  Tensor unpack(const std::shared_ptr<Node>& owner, const std::string& op) const;
  void release();

 private:
  Tensor data_;  // for non-leaf tensors, a detached alias of the same storage
  bool defined_ = false, is_output_ = false, is_leaf_ = false, released_ = false;
  bool output_differentiable_ = false;
  uint64_t version_ = 0;
  uint32_t output_nr_ = 0;
  std::shared_ptr<Node> grad_fn_;
};

struct InputMeta {
  Shape sizes;
  DType dtype = kFloat32;
  bool defined = false;
};

struct Node : std::enable_shared_from_this<Node> {
  explicit Node(std::string name);
  // Releases the nodes this one keeps alive without recursing, so that dropping a long chain
  // cannot overflow the stack.
  virtual ~Node();
  // Gradients for each input from gradients for each output; an undefined tensor means zero.
  // needs[i] says whether this pass wants input i's gradient.
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs,
                                    const std::vector<bool>& needs) = 0;
  virtual void release_saved() {}
  virtual bool is_accumulator() const { return false; }

  std::string name;      // the forward op's name
  uint64_t sequence_nr;  // creation order: later nodes run first
  uint32_t num_outputs = 1;
  std::vector<Edge> next_edges;       // one per forward input
  std::vector<InputMeta> input_meta;  // the shape and dtype each input's gradient must have
  // Tensors whose gradient the user asked to keep (retain_grad), per output.
  std::vector<std::pair<uint32_t, std::weak_ptr<TensorImpl>>> retained;
};

// What a gradient formula sees: the output gradients, the saved tensors (unpacked and checked)
// and which inputs need a gradient.
class BackwardContext {
 public:
  const Tensor& grad(size_t i = 0) const { return grads_[i]; }
  size_t num_grads() const { return grads_.size(); }
  const Tensor& saved(size_t i) const { return saved_[i]; }
  bool needs_grad(size_t input) const { return needs_[input]; }

  std::vector<Tensor> grads_;
  std::vector<Tensor> saved_;
  std::vector<bool> needs_;
};

// Returns one gradient per forward input (undefined where none or not needed).
using GradFormula = std::function<std::vector<Tensor>(const BackwardContext&)>;

bool grad_mode();
// Autograd nodes alive in the process (a leak check for graphs that must be freed).
int64_t live_autograd_nodes();
AutogradMeta* autograd_meta(const Tensor& t);  // null when the tensor never took part
AutogradMeta& ensure_autograd_meta(const Tensor& t);
bool requires_grad(const Tensor& t);
// The edge a gradient for `t` flows along: its grad_fn, its leaf accumulator, or none.
Edge gradient_edge(const Tensor& t);

template <typename... Ts>
bool needs_grad(const Ts&... ts) {
  return grad_mode() && (requires_grad(ts) || ...);
}
bool any_needs_grad(const std::vector<Tensor>& ts);

// In trace mode an in-place op gives the tensor it writes (and a view's base) a history that
// reaches the trace's placeholders. jit::trace calls this when the traced function returns or
// throws: every such tensor gets back the history it had before the trace.
void restore_traced_histories();

// The tensors alive that an in-place op under autograd gave a new history in the trace running on
// this thread: jit::trace raises when one outlives the call (a replay writes back its value, but
// could not give it that history).
std::vector<std::shared_ptr<TensorImpl>> tensors_given_traced_history();

// A backward pass that does not keep its graph frees the saved tensors of the nodes it runs. In a
// trace, the nodes from before the trace (a captured tensor's history) are only listed, since
// tracing has no side effects: traced_frees(). Each call of the traced function then frees them
// as its backward would (free_as_traced), raising first as that backward would when one was freed
// already or a tensor it saved was modified in place.
std::vector<std::weak_ptr<Node>> traced_frees();
void free_as_traced(const std::vector<std::weak_ptr<Node>>& nodes);

// What a traced function did to a leaf's .grad (Tensor::grad, mutable_grad, and a backward
// accumulating into it, in trace mode), so that jit::trace replays read the .grad of each call and
// assign it as eager mode would. A leaf's first touch puts in its .grad a placeholder for the
// .grad at each call (none when it is undefined at trace time).
struct TracedGrad {
  std::shared_ptr<TensorImpl> leaf;  // a captured leaf, or the placeholder of call argument:
  int64_t argument = -1;
  Tensor before;          // leaf's .grad before the trace, restored when it ends
  Tensor initial;         // the placeholder, or undefined
  int64_t input = -1;     // the placeholder's index among TraceState::examples
  bool observed = false;  // the function read the .grad it found (grad(), accumulation)
  bool assigned = false;  // the function may have replaced it (mutable_grad(), accumulation)
};
// jit::trace brackets its function with these: `argument_placeholders` stand for the call's
// arguments. traced_grads() lists the leaves touched so far; end_traced_grads() puts back every
// .grad as it was before the trace. Between them, an in-place op under autograd on a tensor whose
// history dates from before the trace raises (a replay could not give it its new history).
void begin_traced_grads(const std::vector<Tensor>& argument_placeholders);
const std::vector<TracedGrad>& traced_grads();
void end_traced_grads();

// Backward passes (backward(), autograd::grad) started on this thread so far, and how many of
// them freed the graph they ran through (no retain_graph or create_graph): jit::trace tells from
// them whether a traced function runs a backward of its own, and whether its returned values can
// still be differentiated.
struct BackwardPasses {
  uint64_t started = 0;
  uint64_t freed_graph = 0;
};
BackwardPasses backward_passes();

// Records a node for `op` making `outputs` from `inputs`. Floating-point outputs get it as their
// grad_fn; `saved` are the tensors the formula reads, in the order it reads them. Call it only
// when needs_grad(inputs...) is true.
void record(const char* op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            const std::vector<Tensor>& saved, GradFormula formula);

// Runs an in-place op on `self`. Without autograd, `direct` writes the result into self. With it,
// `out_of_place(self)` computes the new value with ordinary recorded ops, the value is copied
// into self and self's history (or, for a view, its base's) becomes that computation. When the
// formula of out_of_place saves self, pass `saves_self` so a copy of the old value is saved
// instead of self.
void apply_inplace(Tensor& self, const char* op, std::initializer_list<const Tensor*> others,
                   bool saves_self, const std::function<void()>& direct,
                   const std::function<Tensor(const Tensor& old_self)>& out_of_place);

}  // namespace kiln::detail
