// Building a Plan: the graph's nodes and fusion groups as typed steps (exec/plan_step.h) in run
// order, their values in slots assigned by liveness, small values in an arena, and the step that
// waits for each collective.
#include <algorithm>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "exec/exec_state.h"
#include "exec/executor.h"
#include "exec/plan_step.h"
#include "fuser/fuse.h"
#include "jit/constant_value.h"
#include "jit/dump.h"
#include "jit/log.h"
#include "lib/allocator.h"
#include "lib/profiler.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

namespace {
// Values at most this large may live in a plan's arena: for them allocation costs as much as the
// work; larger ones are allocated per run, so a plan does not hold big buffers between runs.
constexpr size_t kArenaValueMaxBytes = 16 * 1024;
constexpr size_t kArenaAlignment = 64;

size_t value_bytes(const ValueType& t) {
  return static_cast<size_t>(detail::shape_numel(t.sizes)) * element_size(t.dtype);
}

bool on_cuda(const Node& n) {
  return n.num_outputs() > 0 && n.output(0)->type().device.is_cuda();
}

// A step before slot assignment: a fusion group is one step where its last node is, reading its
// inputs and defining its outputs there; its other nodes are no steps of their own.
struct Proto {
  const Node* node;
  const fuser::FusionGroup* group;
  std::vector<const Value*> inputs, outputs;
};

using GroupOf = absl::flat_hash_map<const Node*, const fuser::FusionGroup*>;

GroupOf group_of_nodes(const std::vector<fuser::FusionGroup>& groups) {
  GroupOf group_of;
  for (const fuser::FusionGroup& g : groups)
    for (const Node* n : g.nodes) group_of[n] = &g;
  return group_of;
}

std::vector<Proto> proto_steps(const Graph& graph, const GroupOf& group_of) {
  std::vector<Proto> protos;
  for (const Node* n = graph.first(); n; n = n->next()) {
    auto g = group_of.find(n);
    if (g == group_of.end()) {
      Proto p{n, nullptr, {n->inputs().begin(), n->inputs().end()}, {}};
      for (size_t k = 0; k < n->num_outputs(); ++k) p.outputs.push_back(n->output(k));
      protos.push_back(std::move(p));
    } else if (g->second->anchor == n) {
      protos.push_back({n, g->second, g->second->inputs, g->second->outputs});
    }
  }
  return protos;
}

// The steps `root` needs (itself included) that are not placed yet, in the graph's order.
std::vector<size_t> unplaced_needs(const std::vector<Proto>& steps, size_t root,
                                   const absl::flat_hash_map<const Value*, size_t>& producer,
                                   const std::vector<bool>& placed, std::vector<size_t>& seen_by) {
  std::vector<size_t> found{root}, stack{root};
  seen_by[root] = root;
  while (!stack.empty()) {
    const size_t i = stack.back();
    stack.pop_back();
    for (const Value* in : steps[i].inputs) {
      auto p = in ? producer.find(in) : producer.end();
      if (p == producer.end() || placed[p->second] || seen_by[p->second] == root) continue;
      seen_by[p->second] = root;
      found.push_back(p->second);
      stack.push_back(p->second);
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

// Steps reordered so that collectives start as soon as their inputs are ready and their readers
// run as late as the graph allows: the graph's order, a post-order walk from its outputs, puts
// each collective right before its first reader, where waiting for it would leave nothing to
// overlap. The collectives go in the order their inputs get ready (fewest steps needed first: in
// a trace's DDP step, the last layers' bucket, as in eager DDP), each right after the steps it
// needs that are not placed yet; every other step follows in the graph's order. A deterministic
// function of the graph, so every rank that traced the same function runs its collectives in the
// same order.
void start_collectives_early(std::vector<Proto>& steps) {
  std::vector<size_t> collectives;
  for (size_t i = 0; i < steps.size(); ++i)
    if (!steps[i].group && detail::collective_start(steps[i].node->op())) collectives.push_back(i);
  if (collectives.empty()) return;
  absl::flat_hash_map<const Value*, size_t> producer;
  for (size_t i = 0; i < steps.size(); ++i)
    for (const Value* v : steps[i].outputs) producer[v] = i;
  std::vector<bool> placed(steps.size(), false);
  std::vector<size_t> seen_by(steps.size(), steps.size());
  std::vector<Proto> ordered;
  ordered.reserve(steps.size());
  // The graph's inputs stay first: their slots are bound before any step runs.
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!steps[i].node->is_input()) continue;
    placed[i] = true;
    ordered.push_back(std::move(steps[i]));
  }
  std::vector<std::pair<size_t, size_t>> by_readiness;  // (steps needed, collective)
  for (size_t c : collectives)
    by_readiness.push_back({unplaced_needs(steps, c, producer, placed, seen_by).size(), c});
  std::sort(by_readiness.begin(), by_readiness.end());
  std::fill(seen_by.begin(), seen_by.end(), steps.size());
  for (const auto& [count, c] : by_readiness) {
    if (placed[c]) continue;  // needed by an earlier one
    for (size_t i : unplaced_needs(steps, c, producer, placed, seen_by)) {
      placed[i] = true;
      ordered.push_back(std::move(steps[i]));
    }
  }
  for (size_t i = 0; i < steps.size(); ++i)
    if (!placed[i]) ordered.push_back(std::move(steps[i]));
  steps = std::move(ordered);
}

std::unique_ptr<FusedGraphDump> fused_graph_dump(const Graph& graph,
                                                 const std::vector<fuser::FusionGroup>& groups) {
  std::vector<DumpGroup> dumped;
  for (const fuser::FusionGroup& g : groups) {
    std::vector<const Node*> joins;
    for (const fuser::FusionGroup::Join& j : g.joins) joins.push_back(j.node);
    dumped.push_back(
        {g.nodes, g.inputs, g.outputs, g.kernel.ops, g.shape, g.rows, std::move(joins)});
  }
  return FusedGraphDump::create(graph, dumped);
}

// Where each output of a rows group varies (an output per element that the kernel computes per
// row is written per element).
std::vector<fuser::Level> rows_output_levels(const fuser::FusionGroup& g) {
  std::vector<fuser::Level> out;
  if (!g.rows) return out;
  const std::vector<fuser::Level> levels = fuser::instr_levels(g.kernel);
  const fuser::Kernel& k = g.kernel;
  for (size_t o = 0; o < k.outputs.size(); ++o) {
    const fuser::Level l = levels[static_cast<size_t>(k.outputs[o])];
    const bool widen = o < k.output_per_element.size() && k.output_per_element[o] &&
                       (l == fuser::Level::kRow || l == fuser::Level::kConst);
    out.push_back(widen ? fuser::Level::kElement : l);
  }
  return out;
}
}  // namespace

// Turns the graph's steps into the plan's, in one pass in run order: each value takes a free
// slot when defined and frees it after its last reader (graph outputs are never freed).
class PlanBuilder {
 public:
  PlanBuilder(Plan& plan, const Graph& graph)
      : plan_(plan),
        graph_(graph),
        group_of_(group_of_nodes(plan.groups_)),
        outputs_(graph.outputs().begin(), graph.outputs().end()) {}

  void build() {
    std::vector<Proto> protos = proto_steps(graph_, group_of_);
    start_collectives_early(protos);
    for (size_t i = 0; i < protos.size(); ++i)
      for (const Value* in : protos[i].inputs)
        if (in) last_use_[in] = i;
    find_direct(protos);
    for (size_t i = 0; i < protos.size(); ++i) add_step(protos[i], i);
    lay_out_arena();
    for (const Value* o : graph_.outputs()) plan_.output_slots_.push_back(slot_of_.at(o));
    for (const Value* in : graph_.inputs()) plan_.input_slots_.push_back(slot_of_.at(in));
  }

 private:
  // Which nodes run straight into their outputs, in which type, and which of their constant
  // operands need converting to it.
  void find_direct(const std::vector<Proto>& protos) {
    std::vector<bool> convert;
    for (const Proto& p : protos) {
      if (p.group || on_cuda(*p.node)) continue;
      std::optional<DType> compute = fuser::elementwise_compute_type(*p.node, convert);
      if (!compute) continue;
      direct_[p.node] = *compute;
      if (std::find(convert.begin(), convert.end(), true) != convert.end())
        conversions_[p.node] = convert;
    }
  }

  void add_step(const Proto& proto, size_t i) {
    const Node* n = proto.node;
    PlanStep step{n, {}, {}, {}, {}, -1, InvokeStep{}};
    if (n->op().kind != detail::OpKind::Transfer && !proto.outputs.empty() &&
        proto.outputs[0]->type().device.is_cuda())
      step.cuda_device = proto.outputs[0]->type().device.index;
    step.kind = step_kind(proto, step.cuda_device);
    for (const Value* in : proto.inputs) step.inputs.push_back(in ? slot_of_.at(in) : -1);
    assign_outputs(proto, step);
    release_inputs(proto, i, step);
    if (n->is_constant()) {
      // Made once with the plan, bound before the steps: its slot is never shared.
      plan_.constants_.push_back({step.outputs[0], constant_value(*n)});
      plan_.constant_storages_.insert(plan_.constants_.back().second.impl()->storage.get());
      constant_slots_.insert(step.outputs[0]);
    }
    if (step.direct()) convert_constants(*n, step);
    if (step.own()) place_in_arena(proto, step);
    for (int64_t s : step.release)
      if (!constant_slots_.contains(s)) free_slots_.push_back(s);
    if (!n->is_input() && !n->is_constant()) plan_.steps_.push_back(std::move(step));
  }

  StepKind step_kind(const Proto& proto, int cuda_device) {
    const Node* n = proto.node;
    const bool through_host = cuda_device >= 0 && !proto.group && !fuser::has_device_kernel(*n);
    if (through_host && !n->is_constant())
      log("fuser", n->op().name, " (%", n->output(0)->id(), ") on cuda:", cuda_device,
          " runs through the host: no device kernel computes it unfused");
    const OwnOutputs own{std::vector<int64_t>(proto.outputs.size(), -1),
                         std::vector<int64_t>(proto.outputs.size(), -1)};
    if (proto.group) {
      const fuser::FusionGroup& g = *proto.group;
      const size_t index = static_cast<size_t>(&g - plan_.groups_.data());
      return KernelStep{&g, index, rows_output_levels(g),
                        cuda_device >= 0 ? cuda_kernels(g, cuda_device, index, plan_.dump_.get())
                                         : cpu_kernels(g, index, plan_.dump_.get()),
                        own};
    }
    if (detail::StartCollective start = detail::collective_start(n->op()))
      return CollectiveStep{start};
    if (direct_.contains(n)) return DirectStep{n->op().map_into, own};
    return InvokeStep{through_host};
  }

  int64_t take_slot() {
    if (free_slots_.empty()) return static_cast<int64_t>(plan_.num_slots_++);
    const int64_t s = free_slots_.back();
    free_slots_.pop_back();
    return s;
  }

  void assign_outputs(const Proto& proto, PlanStep& step) {
    for (const Value* v : proto.outputs) {
      // Constants are bound before the steps run, so their slots are never shared.
      const int64_t s =
          proto.node->is_constant() ? static_cast<int64_t>(plan_.num_slots_++) : take_slot();
      slot_of_[v] = s;
      step.outputs.push_back(s);
      // A value nobody reads (and no output) is released right away.
      if (!last_use_.count(v) && !outputs_.count(v)) step.release.push_back(s);
    }
  }

  void release_inputs(const Proto& proto, size_t i, PlanStep& step) {
    for (const Value* in : proto.inputs) {
      if (!in || outputs_.count(in)) continue;
      auto it = last_use_.find(in);
      if (it == last_use_.end() || it->second != i) continue;
      const int64_t s = slot_of_.at(in);
      if (std::find(step.release.begin(), step.release.end(), s) == step.release.end())
        step.release.push_back(s);
    }
  }

  // Constants of another type than a direct step computes in get a converted copy of their own,
  // made once.
  void convert_constants(const Node& n, PlanStep& step) {
    auto c = conversions_.find(&n);
    if (c == conversions_.end()) return;
    for (size_t k = 0; k < c->second.size(); ++k) {
      if (!c->second[k]) continue;
      Tensor converted = detail::make_empty({}, direct_.at(&n));
      detail::copy_kernel(converted, constant_value(*n.input(k)->node()));
      const auto slot = static_cast<int64_t>(plan_.num_slots_++);
      plan_.constants_.push_back({slot, converted});
      constant_slots_.insert(slot);
      step.inputs[k] = slot;
    }
  }

  // A value may live in the arena when it is small, no graph output, and read only by direct
  // steps and kernels (which keep no reference to it, so its region is free after its last
  // reader).
  bool arena_eligible(const Value* v) const {
    if (graph_.is_output(v) || value_bytes(v->type()) > kArenaValueMaxBytes ||
        v->type().device.is_cuda())
      return false;
    for (const Use& u : v->uses())
      if (!direct_.contains(u.user) && !group_of_.contains(u.user)) return false;
    return true;
  }

  void place_in_arena(const Proto& proto, PlanStep& step) {
    OwnOutputs& own = *step.own();
    for (size_t k = 0; k < proto.outputs.size(); ++k) {
      const Value* out = proto.outputs[k];
      if (!arena_eligible(out)) continue;
      const auto slot = static_cast<size_t>(step.outputs[k]);
      if (slot_bytes_.size() <= slot) slot_bytes_.resize(slot + 1, 0);
      slot_bytes_[slot] = std::max(slot_bytes_[slot], value_bytes(out->type()));
      own.arena[k] = static_cast<int64_t>(plan_.arena_values_.size());
      plan_.arena_values_.push_back({step.outputs[k], 0, &out->type()});
    }
  }

  // Arena regions: one per slot that ever holds an arena value, aligned.
  void lay_out_arena() {
    std::vector<size_t> slot_offset(slot_bytes_.size(), 0);
    for (size_t s = 0; s < slot_bytes_.size(); ++s) {
      if (!slot_bytes_[s]) continue;
      slot_offset[s] = plan_.arena_bytes_;
      plan_.arena_bytes_ +=
          (slot_bytes_[s] + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
    }
    for (ArenaValue& v : plan_.arena_values_)
      v.byte_offset = slot_offset[static_cast<size_t>(v.slot)];
  }

  Plan& plan_;
  const Graph& graph_;
  const GroupOf group_of_;
  const absl::flat_hash_set<const Value*> outputs_;
  absl::flat_hash_map<const Value*, size_t> last_use_;  // the last step reading each value
  absl::flat_hash_map<const Node*, DType> direct_;
  absl::flat_hash_map<const Node*, std::vector<bool>> conversions_;
  std::vector<int64_t> free_slots_;
  absl::flat_hash_map<const Value*, int64_t> slot_of_;
  absl::flat_hash_set<int64_t> constant_slots_;
  std::vector<size_t> slot_bytes_;  // arena region size per slot
};

Plan::Plan(const Graph& graph, const std::vector<int64_t>& in_place_inputs)
    : graph_(graph_number(graph)) {
  detail::ProfileSpan span("plan.build");
  if (fuser::fusion_enabled()) {
    detail::ProfileSpan fusion("fusion");
    groups_ = fuser::find_groups(graph);
  }
  if (dump_enabled()) dump_ = fused_graph_dump(graph, groups_);
  PlanBuilder(*this, graph).build();
  plan_collectives();
  if (!in_place_inputs.empty()) plan_in_place(graph, in_place_inputs);
}

Plan::~Plan() = default;

void Plan::plan_collectives() {
  for (size_t i = 0; i + 1 < steps_.size(); ++i) {
    const PlanStep& st = steps_[i];
    if (!std::holds_alternative<CollectiveStep>(st.kind)) continue;
    // A slot holds the result from here to its last reader, so the first later step reading the
    // slot reads the result (unless nothing does: the step released it, and the slot may be
    // taken again). A result no step reads is waited for before the last step, so that a failed
    // collective still raises before the run's last write. The last step's collective, if any,
    // is waited for at the end of the run.
    size_t waiter = steps_.size() - 1;
    for (size_t j = i + 1; j < waiter; ++j) {
      bool reads = false;
      for (int64_t in : steps_[j].inputs)
        for (int64_t out : st.outputs)
          reads |=
              in == out && std::find(st.release.begin(), st.release.end(), out) == st.release.end();
      if (reads) {
        waiter = j;
        break;
      }
    }
    steps_[waiter].wait_for.push_back(i);
  }
}

std::unique_ptr<PlanArena> make_arena(const std::vector<ArenaValue>& values, size_t nbytes) {
  auto arena = std::make_unique<PlanArena>();
  arena->storage = std::make_shared<detail::Storage>();
  detail::Storage& st = *arena->storage;
  st.data = detail::cpu_alloc(nbytes);
  st.nbytes = nbytes;
  st.deleter = [nbytes](void* p) {
    detail::cpu_free(p, nbytes);
    exec_state().arena_bytes.fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
  };
  exec_state().arena_bytes.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
  for (const ArenaValue& v : values) {
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

int64_t plan_arena_bytes() {
  return exec_state().arena_bytes.load(std::memory_order_relaxed);
}

size_t Plan::num_steps() const {
  return steps_.size();
}

size_t Plan::num_direct_steps() const {
  size_t n = 0;
  for (const PlanStep& s : steps_) n += s.direct();
  return n;
}

size_t Plan::num_nodes() const {
  size_t n = 0;
  for (const PlanStep& s : steps_) n += s.group() ? s.group()->nodes.size() : 1;
  return n;
}

size_t Plan::num_kernel_steps() const {
  size_t n = 0;
  for (const PlanStep& s : steps_) n += s.group() != nullptr;
  return n;
}

size_t Plan::num_join_kernel_steps() const {
  size_t n = 0;
  for (const PlanStep& s : steps_) n += s.group() && !s.group()->joins.empty();
  return n;
}

}  // namespace kiln::jit
