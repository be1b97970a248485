// The recipe of a lazy evaluation's graph: the pending nodes a request needs, collected in
// topological order with their inputs' sources; made into a Graph, or hashed into the key of its
// cached plan without building the graph.
#include "exec/lazy_recipe.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "jit/differentiate.h"
#include "jit/infer.h"
#include "jit/wire.h"
#include "kiln/error.h"
#include "lib/lazy_saved.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

using detail::LazyNode;
using detail::LazyRef;

namespace {
// Appends to a buffer that keeps its capacity between keys: a key is a few bytes at a time.
struct KeyOut {
  std::vector<unsigned char>& buf;
  size_t used = 0;
  void write(const void* data, size_t n) {
    if (used + n > buf.size()) buf.resize(std::max(buf.size() * 2, used + n + 256));
    std::memcpy(buf.data() + used, data, n);
    used += n;
  }
};

// Rematerialization (docs/architecture.md): a value held outside an evaluation that is not
// requested stays a recipe, uncomputed, when its producing sub-graph is at most this many cheap
// nodes.
constexpr size_t kMaxRecipeNodes = 16;

int64_t type_bytes(const detail::LazyType& t) {
  return detail::shape_numel(t.sizes) * static_cast<int64_t>(element_size(t.dtype));
}

// Collects a recipe in three steps: the nodes in order, the graph inputs, the outputs.
class Collector {
 public:
  explicit Collector(LazyGraphBinding* binding) : binding_(binding) {}

  // 1. The uncomputed nodes the requests need, in topological order (iterative post-order DFS).
  // False when one of them is claimed by another thread's evaluation.
  bool order_nodes(const std::vector<LazyRef>& requests) {
    for (const LazyRef& req : requests) {
      if (req.node->computed || !info_.try_emplace(req.node.get()).second) continue;
      if (req.node->in_flight || !visit_from(req.node)) return false;
    }
    return true;
  }

  // 2. Concrete leaves and computed values become graph inputs, wrapped scalars constants; trace
  // placeholders become the graph inputs after them, bound to the traced function's arguments.
  void bind_inputs(const std::vector<Tensor>* placeholder_values) {
    // Tensors first, in one pass: the graph keeps its inputs ahead of every other node.
    for (const auto& n : r.order) {
      if (n->op == &input_op()) continue;
      for (const detail::LazyInput& in : n->inputs) {
        if (in.ref.node && in.ref.node->computed)
          bind_input(in.ref.node->results.at(in.ref.index));
        else if (!in.ref.node && in.tensor.defined() && !in.tensor.impl()->wrapped_number)
          bind_input(in.tensor);
      }
    }
    r.placeholder_input.reserve(r.order.size());
    for (const auto& n : r.order) {
      if (n->op == &input_op()) {
        bind_placeholder(*n, placeholder_values);
        continue;
      }
      r.placeholder_input.push_back(-1);
      for (const detail::LazyInput& in : n->inputs) r.sources.push_back(source_of(in));
    }
  }

  // 3. Outputs: what was requested, and every node someone outside this graph still holds (a
  // pending tensor, a view, a later node): computing it now saves computing it again, unless it
  // is cheaper to recompute where it is read (stays_recipe). In order, so that a producer's
  // decision is made before its readers'.
  void add_outputs(const std::vector<LazyRef>& requests, bool keep_referenced) {
    is_output_.assign(r.order.size(), false);
    for (const LazyRef& req : requests)
      if (!req.node->computed) add_output_node(req.node);
    if (!keep_referenced) return;
    find_gemm_operands();
    for (const auto& n : r.order) {
      const Info& info = info_.at(n.get());
      if (is_output_[info.index] || n.use_count() <= info.internal_refs + 1) continue;
      if (stays_recipe(n)) {
        ++r.kept_as_recipes;
        continue;
      }
      add_output_node(n);
    }
  }

  Recipe r;

 private:
  // Per node: its place in the order and the references to it from inside the graph.
  struct Info {
    size_t index = 0;
    int64_t internal_refs = 0;
  };

  bool visit_from(const std::shared_ptr<LazyNode>& root) {
    struct Frame {
      std::shared_ptr<LazyNode> node;
      size_t next_input;
    };
    std::vector<Frame> stack{{root, 0}};
    while (!stack.empty()) {
      Frame& f = stack.back();
      if (f.next_input < f.node->inputs.size()) {
        const LazyRef& in = f.node->inputs[f.next_input++].ref;
        if (!in.node || in.node->computed) continue;
        if (in.node->in_flight) return false;
        auto [it, fresh] = info_.try_emplace(in.node.get());
        ++it->second.internal_refs;
        if (fresh) stack.push_back({in.node, 0});
        continue;
      }
      info_[f.node.get()].index = r.order.size();
      r.order.push_back(std::move(f.node));
      stack.pop_back();
    }
    return true;
  }

  size_t bind_input(const Tensor& t) {
    auto [it, inserted] = leaf_input_.try_emplace(t.impl(), r.input_types.size());
    if (!inserted) return it->second;
    r.input_types.push_back(type_of(t));
    binding_->inputs.push_back(t);
    binding_->arguments.push_back(-1);
    return it->second;
  }

  // A trace placeholder: the traced function's argument.
  void bind_placeholder(const LazyNode& n, const std::vector<Tensor>* placeholder_values) {
    const int64_t arg = detail::attr_int(n.attrs.at(0));
    const detail::LazyType& t = n.outputs[0];
    r.placeholder_input.push_back(static_cast<int64_t>(r.input_types.size()));
    r.input_types.push_back(ValueType{t.dtype, t.sizes, t.device});
    if (placeholder_values) {
      KILN_CHECK(arg >= 0 && static_cast<size_t>(arg) < placeholder_values->size(),
                 "jit: a value computed inside jit::trace from its argument ", arg,
                 " was used outside the trace");
      binding_->inputs.push_back((*placeholder_values)[static_cast<size_t>(arg)]);
    } else {
      binding_->inputs.push_back(Tensor());
    }
    binding_->arguments.push_back(arg);
  }

  Source source_of(const detail::LazyInput& in) {
    Source src;
    if (in.ref.node) {
      if (in.ref.node->computed) {
        src.kind = Source::kInput;
        src.index = leaf_input_.at(in.ref.node->results.at(in.ref.index).impl());
      } else {
        src.kind = Source::kNode;
        src.index = info_.at(in.ref.node.get()).index;
        src.output = in.ref.index;
      }
    } else if (in.tensor.defined()) {
      if (in.tensor.impl()->wrapped_number) {
        src.kind = Source::kConstant;
        src.number = &in.tensor;
        ++r.num_constants;
      } else {
        src.kind = Source::kInput;
        src.index = leaf_input_.at(in.tensor.impl());
      }
    }
    return src;
  }

  // The values a GEMM of this evaluation reads, directly or through views: they are written out
  // for it anyway, so they are saved rather than recomputed (as jit/differentiate.cpp decides for
  // traced backwards, where a GEMM would read them again).
  void find_gemm_operands() {
    for (const auto& m : r.order) {
      if (m->op->kind != detail::OpKind::Linalg) continue;
      for (const detail::LazyInput& in : m->inputs) {
        const LazyNode* p = in.ref.node.get();
        while (p && !p->computed && p->op->kind == detail::OpKind::View && !p->inputs.empty())
          p = p->inputs[0].ref.node.get();
        if (p && !p->computed) gemm_operands_.insert(p);
      }
    }
  }

  // Whether n, a pending value held outside this evaluation but not requested, stays a recipe:
  // autograd saved it (lib/lazy_saved.h; values only the program holds are computed now, as
  // before), no GEMM here reads it, its storage waits for it (it is a value, not a view), and its
  // producers down to what
  // is materialized (concrete tensors, computed nodes, this evaluation's outputs) are at most
  // kMaxRecipeNodes cheap nodes whose inputs add fewer bytes than n would store (added_bytes), so
  // the recipe keeps less memory alive than the value would. Iterative DFS.
  bool stays_recipe(const std::shared_ptr<LazyNode>& n) const {
    if (!detail::saved_for_backward(*n) || n->outputs.size() != 1 || !cheap_to_recompute(*n->op) ||
        gemm_operands_.contains(n.get()))
      return false;
    const std::shared_ptr<detail::Storage> s = n->storages[0].lock();
    if (!s || s->lazy.node != n || s->lazy.index != 0) return false;
    const int64_t stored = type_bytes(n->outputs[0]);
    int64_t added = 0;
    size_t nodes = 0;
    absl::flat_hash_set<const void*> seen{n.get()};
    std::vector<const LazyNode*> stack{n.get()};
    while (!stack.empty()) {
      const LazyNode* m = stack.back();
      stack.pop_back();
      if (++nodes > kMaxRecipeNodes || !cheap_to_recompute(*m->op)) return false;
      for (const detail::LazyInput& in : m->inputs) {
        const LazyNode* p = in.ref.node.get();
        const bool pending = p && !p->computed;
        if (!seen.insert(pending ? static_cast<const void*>(p) : storage_of(in)).second) continue;
        if (pending && !is_output_[info_.at(p).index])
          stack.push_back(p);
        else
          added += added_bytes(in);
      }
      if (added >= stored) return false;
    }
    return true;
  }

  // The storage behind a materialized input (a concrete tensor or a computed node's result), or
  // nullptr for an absent input or a wrapped number.
  static const void* storage_of(const detail::LazyInput& in) {
    const Tensor& t = in.ref.node ? in.ref.node->results.at(in.ref.index) : in.tensor;
    return t.defined() && !t.impl()->wrapped_number ? t.impl()->storage.get() : nullptr;
  }

  // The bytes a recipe keeps alive by reading a materialized input: none for what stays alive as
  // long anyway (a leaf that requires grad: a parameter or an input the backward differentiates
  // to, which the program holds; a value autograd saved too, computed by this evaluation), else
  // its size.
  int64_t added_bytes(const detail::LazyInput& in) const {
    const LazyNode* p = in.ref.node.get();
    if (p && !p->computed) {
      if (detail::saved_for_backward(*p)) return 0;
      int64_t bytes = 0;
      for (const detail::LazyType& t : p->outputs) bytes += type_bytes(t);
      return bytes;
    }
    if (!storage_of(in) || (!p && in.tensor.requires_grad() && in.tensor.is_leaf())) return 0;
    const Tensor& t = p ? p->results.at(in.ref.index) : in.tensor;
    return static_cast<int64_t>(t.impl()->storage->nbytes);
  }

  void add_output_node(const std::shared_ptr<LazyNode>& n) {
    const size_t at = info_.at(n.get()).index;
    if (is_output_[at]) return;
    is_output_[at] = true;
    for (uint32_t i = 0; i < n->outputs.size(); ++i) {
      r.outputs.emplace_back(at, i);
      binding_->outputs.push_back(LazyRef{n, i});
    }
  }

  LazyGraphBinding* binding_;
  absl::flat_hash_map<const LazyNode*, Info> info_;
  absl::flat_hash_map<const void*, size_t> leaf_input_;  // graph input by TensorImpl
  std::vector<bool> is_output_;
  absl::flat_hash_set<const LazyNode*> gemm_operands_;
};
}  // namespace

Recipe collect(const std::vector<LazyRef>& requests, LazyGraphBinding* binding,
               bool keep_referenced, const std::vector<Tensor>* placeholder_values) {
  Collector c(binding);
  if (!c.order_nodes(requests)) {
    c.r.busy = true;
    return std::move(c.r);
  }
  c.bind_inputs(placeholder_values);
  c.add_outputs(requests, keep_referenced);
  return std::move(c.r);
}

std::unique_ptr<Graph> make_graph(const Recipe& r) {
  auto graph = std::make_unique<Graph>();
  std::vector<Value*> inputs;
  inputs.reserve(r.input_types.size());
  for (const ValueType& t : r.input_types) inputs.push_back(graph->add_input(t));
  std::vector<Node*> node_of(r.order.size(), nullptr);
  const Source* src = r.sources.data();
  std::vector<Value*> operands;
  for (size_t i = 0; i < r.order.size(); ++i) {
    const LazyNode& n = *r.order[i];
    if (r.placeholder_input[i] >= 0) {
      node_of[i] = inputs[static_cast<size_t>(r.placeholder_input[i])]->node();
      continue;
    }
    operands.clear();
    for (size_t k = 0; k < n.inputs.size(); ++k, ++src) {
      switch (src->kind) {
        case Source::kNode:
          operands.push_back(node_of[src->index]->output(src->output));
          break;
        case Source::kInput:
          operands.push_back(inputs[src->index]);
          break;
        case Source::kConstant:
          operands.push_back(graph->constant(detail::scalar_attr(src->number->item()),
                                             src->number->dtype(), true));
          break;
        case Source::kNone:
          operands.push_back(nullptr);
          break;
      }
    }
    std::vector<ValueType> types;
    for (const detail::LazyType& t : n.outputs)
      types.push_back(ValueType{t.dtype, t.sizes, t.device});
    node_of[i] = graph->create(*n.op, operands, n.attrs, std::move(types));
  }
  for (const auto& [at, output] : r.outputs) graph->add_output(node_of[at]->output(output));
  return graph;
}

// Op definitions are keyed by address (the plan cache lives in this process).
GraphHash recipe_key(const Recipe& r) {
  using namespace wire;
  thread_local std::vector<unsigned char> bytes;
  KeyOut out{bytes};
  put_count(out, r.input_types.size());
  for (const ValueType& t : r.input_types) put_type(out, t);
  put_count(out, r.order.size());
  const Source* src = r.sources.data();
  for (size_t i = 0; i < r.order.size(); ++i) {
    const LazyNode& n = *r.order[i];
    if (r.placeholder_input[i] >= 0) {
      put_u8(out, 1);
      put_u64(out, static_cast<uint64_t>(r.placeholder_input[i]));
      continue;
    }
    put_u8(out, 0);
    put_u64(out, reinterpret_cast<uintptr_t>(n.op));
    put_attrs(out, n.attrs);
    put_count(out, n.inputs.size());
    for (size_t k = 0; k < n.inputs.size(); ++k, ++src) {
      put_u8(out, src->kind);
      if (src->kind == Source::kConstant) {
        const Tensor& t = *src->number;
        put_u8(out, dtype_code(t.dtype()));
        uint64_t value = 0;
        std::memcpy(&value, t.impl()->data(), element_size(t.dtype()));
        put_u64(out, value);
      } else {
        put_u64(out, src->index);
        put_u32(out, src->output);
      }
    }
    put_count(out, n.outputs.size());
    for (const detail::LazyType& t : n.outputs)
      put_type(out, ValueType{t.dtype, t.sizes, t.device});
  }
  put_count(out, r.outputs.size());
  for (const auto& [at, output] : r.outputs) {
    put_u64(out, at);
    put_u32(out, output);
  }
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), out.used);
  return GraphHash{h.low64, h.high64};
}

}  // namespace kiln::jit
