// The unfused executor: runs a graph node by node through the reference kernels, releasing each
// value's slot after its last reader so the allocator can reuse the memory.
#include "jit/executor.h"

#include <optional>
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "kiln/autograd.h"
#include "kiln/error.h"
#include "kiln/ops.h"
#include "lib/allocator.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

namespace {
// Recording off and autograd off while reference kernels run; restored on exit.
struct EagerScope {
  bool lazy = detail::lazy_mode();
  NoGradGuard no_grad;
  detail::EvaluationScope evaluating;
  EagerScope() { detail::set_lazy_mode(false); }
  ~EagerScope() { detail::set_lazy_mode(lazy); }
};

Tensor constant_tensor(const Node& n) {
  const ValueType& t = n.output()->type();
  Scalar value = detail::attr_scalar(n.attr(0));
  Tensor out = t.wrapped_number && t.dtype == value.kind() ? detail::wrap_scalar(value)
                                                           : scalar_tensor(value, t.dtype);
  out.impl()->wrapped_number = t.wrapped_number;
  return out;
}
}  // namespace

namespace {
// invoke_node without setting up the eager scope (the caller holds one).
std::vector<Tensor> invoke_in_scope(const Node& node, const std::vector<Tensor>& inputs) {
  if (node.is_constant()) return {constant_tensor(node)};
  const OpDef& op = node.op();
  KILN_CHECK(op.invoke, "jit: op '", op.name, "' has no reference kernel to run");
  std::vector<Tensor> out = op.invoke(inputs, node.attrs());
  KILN_CHECK(out.size() == node.num_outputs(), "jit: ", op.name, " returned ", out.size(),
             " values for ", node.num_outputs(), " outputs");
  return out;
}
}  // namespace

std::vector<Tensor> invoke_node(const Node& node, const std::vector<Tensor>& inputs) {
  EagerScope eager;
  return invoke_in_scope(node, inputs);
}

namespace {
// Values at most this large may live in a plan's arena: for them allocation costs as much as the
// work; larger ones are allocated per run, so a plan does not hold big buffers between runs.
constexpr size_t kArenaValueMaxBytes = 16 * 1024;
constexpr size_t kArenaAlignment = 64;

size_t value_bytes(const ValueType& t) {
  return static_cast<size_t>(detail::shape_numel(t.sizes)) * element_size(t.dtype);
}

// The type an elementwise op computes in when its operands are `node`'s (see compute_type in
// lib/elementwise.h), or nullopt when the node can't run straight into its output: another kind
// of op, off the CPU, or an operand that needs a conversion at run time. Constants of another
// type are allowed (set in `convert`): the plan converts them once.
std::optional<DType> direct_compute_type(const Node& n, std::vector<bool>& convert) {
  const OpDef& op = n.op();
  if (!op.map_into || (op.kind != detail::OpKind::Unary && op.kind != detail::OpKind::Binary))
    return std::nullopt;
  if (n.num_outputs() != 1 || n.output()->type().device != kCPU) return std::nullopt;
  DType compute;
  switch (op.dtype_rule) {
    case detail::DTypeRule::Same:
    case detail::DTypeRule::Float:
      compute = n.output()->type().dtype;
      break;
    case detail::DTypeRule::Logical:
      compute = kBool;
      break;
    case detail::DTypeRule::Predicate:
      // Promotion between differing operands is left to the op's entry point.
      if (!n.input(0)) return std::nullopt;
      compute = n.input(0)->type().dtype;
      break;
    default:
      return std::nullopt;
  }
  convert.assign(n.num_inputs(), false);
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    const Value* in = n.input(i);
    if (!in || in->type().device != kCPU) return std::nullopt;
    if (in->type().dtype == compute) continue;
    if (!in->node()->is_constant() || op.dtype_rule == detail::DTypeRule::Predicate)
      return std::nullopt;
    convert[i] = true;
  }
  return compute;
}
}  // namespace

static std::atomic<int64_t> g_arena_bytes{0};

struct Plan::Arena {
  std::shared_ptr<detail::Storage> storage;
  std::vector<Tensor> values;  // one per arena value, over its slot's region of the storage
};

int64_t plan_arena_bytes() {
  return g_arena_bytes.load(std::memory_order_relaxed);
}

std::unique_ptr<Plan::Arena> Plan::make_arena() const {
  auto arena = std::make_unique<Arena>();
  arena->storage = std::make_shared<detail::Storage>();
  detail::Storage& st = *arena->storage;
  const size_t nbytes = arena_bytes_;
  st.data = detail::cpu_alloc(nbytes);
  st.nbytes = nbytes;
  st.deleter = [nbytes](void* p) {
    detail::cpu_free(p, nbytes);
    g_arena_bytes.fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
  };
  g_arena_bytes.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
  for (const ArenaValue& v : arena_values_) {
    auto impl = std::make_shared<detail::TensorImpl>();
    impl->storage = arena->storage;
    impl->offset = static_cast<int64_t>(v.byte_offset / element_size(v.type->dtype));
    impl->sizes = v.type->sizes;
    impl->strides = detail::contiguous_strides(v.type->sizes);
    impl->dtype = v.type->dtype;
    arena->values.push_back(Tensor(std::move(impl)));
  }
  return arena;
}

Plan::~Plan() = default;

size_t Plan::num_direct_steps() const {
  size_t n = 0;
  for (const Step& s : steps_) n += s.map_into != nullptr;
  return n;
}

Plan::Plan(const Graph& graph) : graph_(graph) {
  // Slot assignment by liveness: a value takes a free slot when defined and frees it after its
  // last reader; graph outputs are never freed.
  std::vector<int64_t> free_slots;
  auto take_slot = [&]() -> int64_t {
    if (!free_slots.empty()) {
      int64_t s = free_slots.back();
      free_slots.pop_back();
      return s;
    }
    return static_cast<int64_t>(num_slots_++);
  };
  std::vector<const Node*> order;
  for (const Node* n = graph.first(); n; n = n->next()) order.push_back(n);
  // Last step reading each value.
  absl::flat_hash_map<const Value*, size_t> last_use;
  for (size_t i = 0; i < order.size(); ++i)
    for (const Value* in : order[i]->inputs())
      if (in) last_use[in] = i;
  // Which nodes run straight into their outputs, and in which type.
  absl::flat_hash_map<const Node*, DType> direct;
  absl::flat_hash_map<const Node*, std::vector<bool>> conversions;
  {
    std::vector<bool> convert;
    for (const Node* n : order) {
      if (std::optional<DType> compute = direct_compute_type(*n, convert)) {
        direct[n] = *compute;
        for (bool c : convert)
          if (c) {
            conversions[n] = convert;
            break;
          }
      }
    }
  }
  // A value may live in the arena when it is small, no graph output, and read only by direct
  // steps (which keep no reference to it, so its region is free after its last reader).
  auto arena_eligible = [&](const Value* v) {
    if (graph.is_output(v) || value_bytes(v->type()) > kArenaValueMaxBytes) return false;
    for (const Use& u : v->uses())
      if (!direct.contains(u.user)) return false;
    return true;
  };
  std::vector<size_t> slot_bytes;  // arena region size per slot
  absl::flat_hash_map<const Value*, int64_t> slot_of;
  absl::flat_hash_set<int64_t> constant_slots;
  absl::flat_hash_set<const Value*> output_set(graph.outputs().begin(), graph.outputs().end());
  for (size_t i = 0; i < order.size(); ++i) {
    const Node* n = order[i];
    Step step{n, {}, {}, {}};
    for (const Value* in : n->inputs()) step.inputs.push_back(in ? slot_of.at(in) : -1);
    for (size_t k = 0; k < n->num_outputs(); ++k) {
      const Value* v = n->output(k);
      // Constants are bound before the steps run, so their slots are never shared.
      int64_t s = n->is_constant() ? static_cast<int64_t>(num_slots_++) : take_slot();
      slot_of[v] = s;
      step.outputs.push_back(s);
      if (n->is_input()) input_slots_.push_back(s);
      // A value nobody reads (and no output) is released right away.
      if (!last_use.count(v) && !output_set.count(v)) step.release.push_back(s);
    }
    for (const Value* in : n->inputs()) {
      if (!in || output_set.count(in)) continue;
      auto it = last_use.find(in);
      if (it != last_use.end() && it->second == i) {
        int64_t s = slot_of.at(in);
        bool already = false;
        for (int64_t r : step.release) already |= r == s;
        if (!already) step.release.push_back(s);
      }
    }
    if (n->is_constant()) {
      // Made once with the plan, bound before the steps: its slot is never shared.
      constants_.push_back({step.outputs[0], constant_tensor(*n)});
      constant_storages_.insert(constants_.back().second.impl()->storage.get());
      constant_slots.insert(step.outputs[0]);
    }
    if (auto it = direct.find(n); it != direct.end()) {
      step.map_into = n->op().map_into;
      // Constants of another type get a converted copy of their own, made once.
      if (auto c = conversions.find(n); c != conversions.end()) {
        for (size_t k = 0; k < c->second.size(); ++k) {
          if (!c->second[k]) continue;
          Tensor converted = detail::make_empty({}, it->second);
          detail::copy_kernel(converted, constant_tensor(*n->input(k)->node()));
          const auto slot = static_cast<int64_t>(num_slots_++);
          constants_.push_back({slot, converted});
          constant_slots.insert(slot);
          step.inputs[k] = slot;
        }
      }
      const Value* out = n->output();
      if (arena_eligible(out)) {
        const int64_t slot = step.outputs[0];
        if (slot_bytes.size() <= static_cast<size_t>(slot)) slot_bytes.resize(slot + 1, 0);
        slot_bytes[slot] = std::max(slot_bytes[slot], value_bytes(out->type()));
        step.arena_value = static_cast<int64_t>(arena_values_.size());
        arena_values_.push_back({slot, 0, &out->type()});
      }
    }
    for (int64_t s : step.release)
      if (!constant_slots.contains(s)) free_slots.push_back(s);
    if (!n->is_input() && !n->is_constant()) steps_.push_back(std::move(step));
  }
  // Arena regions: one per slot that ever holds an arena value, aligned.
  std::vector<size_t> slot_offset(slot_bytes.size(), 0);
  for (size_t s = 0; s < slot_bytes.size(); ++s) {
    if (!slot_bytes[s]) continue;
    slot_offset[s] = arena_bytes_;
    arena_bytes_ += (slot_bytes[s] + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
  }
  for (ArenaValue& v : arena_values_) v.byte_offset = slot_offset[static_cast<size_t>(v.slot)];
  for (const Value* o : graph.outputs()) output_slots_.push_back(slot_of.at(o));
  // Input slots in graph-input order.
  input_slots_.clear();
  for (const Value* in : graph.inputs()) input_slots_.push_back(slot_of.at(in));
}

std::vector<Tensor> Plan::run(const std::vector<Tensor>& inputs) const {
  KILN_CHECK(inputs.size() == input_slots_.size(), "jit: the graph takes ", input_slots_.size(),
             " inputs, got ", inputs.size());
  std::vector<Tensor> slots(num_slots_);
  for (size_t i = 0; i < inputs.size(); ++i)
    slots[static_cast<size_t>(input_slots_[i])] = inputs[i];
  for (const auto& [slot, value] : constants_) slots[static_cast<size_t>(slot)] = value;
  // The plan's arena, or one of this run's own while another run holds it.
  std::unique_ptr<Arena> own_arena;
  const Arena* arena = nullptr;
  struct ArenaHold {
    std::atomic<bool>* busy = nullptr;
    ~ArenaHold() {
      if (busy) busy->store(false, std::memory_order_release);
    }
  } hold;
  if (!arena_values_.empty()) {
    if (!arena_busy_.exchange(true, std::memory_order_acquire)) {
      hold.busy = &arena_busy_;
      if (!arena_) arena_ = make_arena();
      arena = arena_.get();
    } else {
      own_arena = make_arena();
      arena = own_arena.get();
    }
  }
  EagerScope eager;
  std::vector<Tensor> args;
  for (const Step& step : steps_) {
    args.clear();
    for (int64_t s : step.inputs) args.push_back(s < 0 ? Tensor() : slots[static_cast<size_t>(s)]);
    if (step.map_into) {
      const ValueType& type = step.node->output()->type();
      Tensor out = step.arena_value >= 0 ? arena->values[static_cast<size_t>(step.arena_value)]
                                         : detail::make_empty(type.sizes, type.dtype);
      step.map_into(out, args.data(), step.node->attrs());
      for (int64_t s : step.release) slots[static_cast<size_t>(s)] = Tensor();
      bool released = false;
      for (int64_t r : step.release) released |= r == step.outputs[0];
      if (!released) slots[static_cast<size_t>(step.outputs[0])] = std::move(out);
      continue;
    }
    std::vector<Tensor> out = invoke_in_scope(*step.node, args);
    for (int64_t s : step.release) slots[static_cast<size_t>(s)] = Tensor();
    for (size_t k = 0; k < out.size(); ++k) {
      bool released = false;
      for (int64_t r : step.release) released |= r == step.outputs[k];
      if (!released) slots[static_cast<size_t>(step.outputs[k])] = std::move(out[k]);
    }
  }
  std::vector<Tensor> result;
  result.reserve(output_slots_.size());
  for (int64_t s : output_slots_) {
    Tensor t = slots[static_cast<size_t>(s)];
    // A plan's constants are reused by every run: callers get their own copy.
    if (t.defined() && constant_storages_.contains(t.impl()->storage.get())) t = t.clone();
    result.push_back(std::move(t));
  }
  return result;
}

std::vector<Tensor> run_graph(const Graph& graph, const std::vector<Tensor>& inputs) {
  return Plan(graph).run(inputs);
}

}  // namespace kiln::jit
