// The unfused executor: runs a graph node by node through the reference kernels, releasing each
// value's slot after its last reader so the allocator can reuse the memory.
#include "exec/executor.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "fuser/codegen/llvm/cpu_codegen.h"
#ifdef KILN_HAS_CUDA
#include "fuser/codegen/cuda/cuda_kernel.h"
#endif
#include "fuser/fuse.h"
#include "jit/constant_value.h"
#include "jit/dump.h"
#include "jit/log.h"
#include "jit/passes/rewriter.h"
#include "kiln/autograd.h"
#include "kiln/device.h"
#include "kiln/error.h"
#include "kiln/ops.h"
#include "lib/allocator.h"
#include "lib/cuda_driver.h"
#include "lib/cuda_tensor.h"
#include "lib/lazy.h"
#include "lib/parallel.h"
#include "lib/profiler.h"
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
}  // namespace

namespace {
// invoke_node without setting up the eager scope (the caller holds one).
std::vector<Tensor> invoke_in_scope(const Node& node, const std::vector<Tensor>& inputs) {
  if (node.is_constant()) return {constant_value(node)};
  const OpDef& op = node.op();
  KILN_CHECK(op.invoke, "jit: op '", op.name, "' has no reference kernel to run");
  std::vector<Tensor> out = op.invoke(inputs, node.attrs());
  KILN_CHECK(out.size() == node.num_outputs(), "jit: ", op.name, " returned ", out.size(),
             " values for ", node.num_outputs(), " outputs");
  return out;
}

// A node on a CUDA device that no kernel of the device computes (not fused, not a GEMM, join or
// view): its reference kernel runs on copies of its inputs on the host, and its outputs are
// copied back. Correct for every op, at the price of the transfers, which KILN_PROFILE counts and
// its tips name.
std::vector<Tensor> invoke_through_host(const Node& node, const std::vector<Tensor>& inputs) {
  std::vector<Tensor> host;
  host.reserve(inputs.size());
  for (const Tensor& t : inputs) host.push_back(t.defined() ? t.to(kCPU) : t);
  std::vector<Tensor> out = invoke_in_scope(node, host);
  for (size_t k = 0; k < out.size(); ++k) {
    const Device d = node.output(k)->type().device;
    if (out[k].defined() && out[k].device() != d) out[k] = detail::copy_to_device(out[k], d);
  }
  return out;
}

bool on_cuda(const Node& n) {
  return n.num_outputs() > 0 && n.output(0)->type().device.is_cuda();
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
// The most calls (row ranges) a rows kernel with column reductions is split into (see
// run_rows_group).
constexpr int64_t kMaxColumnCalls = 64;
constexpr size_t kArenaAlignment = 64;

size_t value_bytes(const ValueType& t) {
  return static_cast<size_t>(detail::shape_numel(t.sizes)) * element_size(t.dtype);
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

size_t Plan::num_nodes() const {
  size_t n = 0;
  for (const Step& s : steps_) n += s.group ? s.group->nodes.size() : 1;
  return n;
}

size_t Plan::num_kernel_steps() const {
  size_t n = 0;
  for (const Step& s : steps_) n += s.group != nullptr;
  return n;
}

size_t Plan::num_join_kernel_steps() const {
  size_t n = 0;
  for (const Step& s : steps_) n += s.group && !s.group->joins.empty();
  return n;
}

namespace {
// Steps (graph nodes or fusion groups, each with the values it reads and defines) reordered so
// that collectives start as soon as their inputs are ready and their readers run as late as the
// graph allows: the graph's order, a post-order walk from its outputs, puts each collective right
// before its first reader, where waiting for it would leave nothing to overlap. The collectives
// go in the order their inputs get ready (fewest steps needed first: in a trace's DDP step, the
// last layers' bucket, as in eager DDP), each right after the steps it needs that are not placed
// yet; every other step follows in the graph's order. A deterministic function of the graph, so
// every rank that traced the same function runs its collectives in the same order.
template <typename Proto>
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
  // The steps `root` needs (itself included) that are not placed yet, in the graph's order.
  auto needs = [&](size_t root) {
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
  };
  std::vector<std::pair<size_t, size_t>> by_readiness;  // (steps needed, collective)
  for (size_t c : collectives) by_readiness.push_back({needs(c).size(), c});
  std::sort(by_readiness.begin(), by_readiness.end());
  std::fill(seen_by.begin(), seen_by.end(), steps.size());
  for (const auto& [count, c] : by_readiness) {
    if (placed[c]) continue;  // needed by an earlier one
    for (size_t i : needs(c)) {
      placed[i] = true;
      ordered.push_back(std::move(steps[i]));
    }
  }
  for (size_t i = 0; i < steps.size(); ++i)
    if (!placed[i]) ordered.push_back(std::move(steps[i]));
  steps = std::move(ordered);
}
}  // namespace

Plan::Plan(const Graph& graph, const std::vector<int64_t>& in_place_inputs)
    : graph_(graph_number(graph)) {
  detail::ProfileSpan span("plan.build");
  if (fuser::fusion_enabled()) {
    detail::ProfileSpan fusion("fusion");
    groups_ = fuser::find_groups(graph);
  }
  if (dump_enabled()) {
    std::vector<DumpGroup> dumped;
    for (const fuser::FusionGroup& g : groups_) {
      std::vector<const Node*> joins;
      for (const fuser::FusionGroup::Join& j : g.joins) joins.push_back(j.node);
      dumped.push_back(
          {g.nodes, g.inputs, g.outputs, g.kernel.ops, g.shape, g.rows, std::move(joins)});
    }
    dump_ = FusedGraphDump::create(graph, dumped);
  }
  // The steps before slot assignment: a fusion group is one step where its last node is, reading
  // its inputs and defining its outputs there; its other nodes are no steps of their own.
  struct Proto {
    const Node* node;
    const fuser::FusionGroup* group;
    std::vector<const Value*> inputs, outputs;
  };
  absl::flat_hash_map<const Node*, const fuser::FusionGroup*> group_of;
  for (const fuser::FusionGroup& g : groups_)
    for (const Node* n : g.nodes) group_of[n] = &g;
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
  start_collectives_early(protos);
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
  // Last step reading each value.
  absl::flat_hash_map<const Value*, size_t> last_use;
  for (size_t i = 0; i < protos.size(); ++i)
    for (const Value* in : protos[i].inputs)
      if (in) last_use[in] = i;
  // Which nodes run straight into their outputs, and in which type.
  absl::flat_hash_map<const Node*, DType> direct;
  absl::flat_hash_map<const Node*, std::vector<bool>> conversions;
  {
    std::vector<bool> convert;
    for (const Proto& p : protos) {
      if (p.group || on_cuda(*p.node)) continue;
      if (std::optional<DType> compute = fuser::elementwise_compute_type(*p.node, convert)) {
        direct[p.node] = *compute;
        for (bool c : convert)
          if (c) {
            conversions[p.node] = convert;
            break;
          }
      }
    }
  }
  // A value may live in the arena when it is small, no graph output, and read only by direct
  // steps and kernels (which keep no reference to it, so its region is free after its last
  // reader).
  auto arena_eligible = [&](const Value* v) {
    if (graph.is_output(v) || value_bytes(v->type()) > kArenaValueMaxBytes ||
        v->type().device.is_cuda())
      return false;
    for (const Use& u : v->uses())
      if (!direct.contains(u.user) && !group_of.contains(u.user)) return false;
    return true;
  };
  std::vector<size_t> slot_bytes;  // arena region size per slot
  absl::flat_hash_map<const Value*, int64_t> slot_of;
  absl::flat_hash_set<int64_t> constant_slots;
  absl::flat_hash_set<const Value*> output_set(graph.outputs().begin(), graph.outputs().end());
  for (size_t i = 0; i < protos.size(); ++i) {
    const Proto& proto = protos[i];
    const Node* n = proto.node;
    Step step;
    step.node = n;
    step.group = proto.group;
    if (n->op().kind != detail::OpKind::Transfer && !proto.outputs.empty() &&
        proto.outputs[0]->type().device.is_cuda())
      step.cuda_device = proto.outputs[0]->type().device.index;
    step.through_host = step.cuda_device >= 0 && !step.group && !fuser::has_device_kernel(*n);
    if (step.through_host && !n->is_constant())
      log("fuser", n->op().name, " (%", n->output(0)->id(), ") on cuda:", step.cuda_device,
          " runs through the host: no device kernel computes it unfused");
    if (step.group && step.group->rows) {
      const std::vector<fuser::Level> levels = fuser::instr_levels(step.group->kernel);
      const fuser::Kernel& k = step.group->kernel;
      for (size_t o = 0; o < k.outputs.size(); ++o) {
        const fuser::Level l = levels[static_cast<size_t>(k.outputs[o])];
        const bool widen = o < k.output_per_element.size() && k.output_per_element[o] &&
                           (l == fuser::Level::kRow || l == fuser::Level::kConst);
        step.output_levels.push_back(widen ? fuser::Level::kElement : l);
      }
    }
    for (const Value* in : proto.inputs) step.inputs.push_back(in ? slot_of.at(in) : -1);
    for (const Value* v : proto.outputs) {
      // Constants are bound before the steps run, so their slots are never shared.
      int64_t s = n->is_constant() ? static_cast<int64_t>(num_slots_++) : take_slot();
      slot_of[v] = s;
      step.outputs.push_back(s);
      step.arena.push_back(-1);
      // A value nobody reads (and no output) is released right away.
      if (!last_use.count(v) && !output_set.count(v)) step.release.push_back(s);
    }
    for (const Value* in : proto.inputs) {
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
      constants_.push_back({step.outputs[0], constant_value(*n)});
      constant_storages_.insert(constants_.back().second.impl()->storage.get());
      constant_slots.insert(step.outputs[0]);
    }
    auto direct_it = direct.find(n);
    if (direct_it != direct.end()) {
      step.map_into = n->op().map_into;
      // Constants of another type get a converted copy of their own, made once.
      if (auto c = conversions.find(n); c != conversions.end()) {
        for (size_t k = 0; k < c->second.size(); ++k) {
          if (!c->second[k]) continue;
          Tensor converted = detail::make_empty({}, direct_it->second);
          detail::copy_kernel(converted, constant_value(*n->input(k)->node()));
          const auto slot = static_cast<int64_t>(num_slots_++);
          constants_.push_back({slot, converted});
          constant_slots.insert(slot);
          step.inputs[k] = slot;
        }
      }
    }
    if (step.map_into || step.group) {
      for (size_t k = 0; k < proto.outputs.size(); ++k) {
        const Value* out = proto.outputs[k];
        if (!arena_eligible(out)) continue;
        const int64_t slot = step.outputs[k];
        if (slot_bytes.size() <= static_cast<size_t>(slot)) slot_bytes.resize(slot + 1, 0);
        slot_bytes[slot] = std::max(slot_bytes[slot], value_bytes(out->type()));
        step.arena[k] = static_cast<int64_t>(arena_values_.size());
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
  for (const Value* in : graph.inputs()) input_slots_.push_back(slot_of.at(in));
  for (Step& step : steps_) step.in_place.assign(step.outputs.size(), -1);
  plan_collectives();
  if (!in_place_inputs.empty()) plan_in_place(graph, in_place_inputs);
}

void Plan::plan_collectives() {
  for (size_t i = 0; i + 1 < steps_.size(); ++i) {
    Step& st = steps_[i];
    if (st.group || !(st.start = detail::collective_start(st.node->op()))) continue;
    // A slot holds the result from here to its last reader, so the first later step reading the
    // slot reads the result (unless nothing does: the step released it, and the slot may be
    // taken again). A result no step reads is waited for before the last step, so that a failed
    // collective still raises before the run's last write.
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
  // The last step's collective, if any, is waited for at the end of the run.
  if (!steps_.empty() && !steps_.back().group)
    steps_.back().start = detail::collective_start(steps_.back().node->op());
}

size_t Plan::num_in_place_outputs() const {
  size_t n = 0;
  for (const Step& step : steps_)
    for (int64_t j : step.in_place) n += j >= 0;
  return n;
}

void Plan::plan_in_place(const Graph& graph, const std::vector<int64_t>& in_place_inputs) {
  KILN_CHECK(in_place_inputs.size() == graph.outputs().size(), "jit: ", in_place_inputs.size(),
             " in-place entries for ", graph.outputs().size(), " graph outputs");
  // The graph input each value aliases (through views), in one pass over the nodes in order.
  absl::flat_hash_map<const Value*, int64_t> root;
  for (size_t j = 0; j < graph.inputs().size(); ++j)
    root[graph.inputs()[j]] = static_cast<int64_t>(j);
  for (const Node* n = graph.first(); n; n = n->next()) {
    if (n->op().kind != detail::OpKind::View || n->num_inputs() == 0 || !n->input(0)) continue;
    auto r = root.find(n->input(0));
    if (r == root.end()) continue;
    const int64_t j = r->second;
    for (size_t k = 0; k < n->num_outputs(); ++k) root[n->output(k)] = j;
  }
  // Per graph input: the last step reading it or an alias of it; and whether an alias is an output.
  std::vector<int64_t> last_read(graph.inputs().size(), -1);
  std::vector<bool> aliased_output(graph.inputs().size(), false);
  absl::flat_hash_map<const Node*, size_t> step_of;
  // From each step on, the first step that may raise on the values it reads (an index out of
  // range, an integer division by zero).
  std::vector<size_t> next_unsafe(steps_.size() + 1, steps_.size());
  for (size_t i = 0; i < steps_.size(); ++i) step_of[steps_[i].node] = i;
  for (size_t i = steps_.size(); i-- > 0;) {
    const Step& st = steps_[i];
    // On the values it reads, or a collective or a wait for one (a peer gone, the timeout);
    // otherwise only when
    // memory runs out.
    bool may_fail = !st.group && passes::has_side_effects(st.node->op());
    may_fail |= !st.wait_for.empty();
    if (!st.group && !st.map_into && st.node->op().checks_integer_values)
      for (const Value* in : st.node->inputs())
        may_fail |= in && !is_floating_point(in->type().dtype);
    next_unsafe[i] = may_fail ? i : next_unsafe[i + 1];
  }
  absl::flat_hash_map<const Node*, const fuser::FusionGroup*> group_of;
  for (const fuser::FusionGroup& g : groups_)
    for (const Node* n : g.nodes) group_of[n] = &g;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& st = steps_[i];
    const std::vector<const Value*> reads =
        st.group ? st.group->inputs
                 : std::vector<const Value*>(st.node->inputs().begin(), st.node->inputs().end());
    for (const Value* v : reads) {
      auto r = v ? root.find(v) : root.end();
      if (r != root.end()) last_read[static_cast<size_t>(r->second)] = static_cast<int64_t>(i);
    }
  }
  for (const Value* o : graph.outputs())
    if (auto r = root.find(o); r != root.end())
      aliased_output[static_cast<size_t>(r->second)] = true;
  for (size_t k = 0; k < in_place_inputs.size(); ++k) {
    const int64_t j = in_place_inputs[k];
    if (j < 0) continue;
    KILN_CHECK(j < static_cast<int64_t>(graph.inputs().size()), "jit: in-place input ", j,
               " of a graph with ", graph.inputs().size(), " inputs");
    // The value the output views, and the step that computes it.
    const Value* v = graph.outputs()[k];
    while (v->node()->op().kind == detail::OpKind::View && v->node()->num_inputs() > 0 &&
           v->node()->input(0) && !root.contains(v))
      v = v->node()->input(0);
    const Node* producer = v->node();
    auto g = group_of.find(producer);
    const fuser::FusionGroup* group = g == group_of.end() ? nullptr : g->second;
    auto s = step_of.find(group ? group->anchor : producer);
    std::string why;
    size_t at = 0;
    if (s == step_of.end()) {
      why = "it is not computed by a step";
    } else {
      at = s->second;
      const Step& st = steps_[at];
      if (!(st.group && !st.group->rows && st.group->joins.empty()) && !st.map_into)
        why = "its step is no elementwise kernel or direct step";
      else if (last_read[static_cast<size_t>(j)] > static_cast<int64_t>(at))
        why = "a later step reads the input's old value";
      else if (aliased_output[static_cast<size_t>(j)])
        why = "the input, or a view of it, is a graph output";
      else if (const size_t u = next_unsafe[at + 1]; u < steps_.size())
        why = "a step after it may fail (step " + std::to_string(u) + ", " +
              steps_[u].node->op().name + ")";
    }
    if (!why.empty()) {
      log("fuser", "write-back %", graph.outputs()[k]->id(), " gets a buffer of its own: ", why);
      continue;
    }
    Step& st = steps_[at];
    for (size_t o = 0; o < st.outputs.size(); ++o) {
      const Value* out = st.group ? st.group->outputs[o] : st.node->output(o);
      if (out == v && st.arena[o] < 0) st.in_place[o] = j;
    }
    log("fuser", "write-back %", graph.outputs()[k]->id(), " is computed in the buffer of input ",
        j, " (step ", at, ", ", st.group ? st.group->kernel.ops : st.node->op().name, ")");
  }
}

namespace {
// The span of the plan step running on this thread, while profiling: a step whose kernel must be
// looked up, loaded or compiled first closes it and opens it again after, so that the JIT's work
// is a span of its own beside the kernel's and never counted as kernel time.
// Initial-exec: Plan::run sets it on every run, where the general model would add a call.
__attribute__((tls_model("initial-exec"))) thread_local detail::SpanStart* t_step_span = nullptr;
// The timed event opening the profiled device step running on this thread: recorded again after
// a compile, so that the step's device time leaves the compile out.
__attribute__((tls_model("initial-exec"))) thread_local void** t_step_event = nullptr;

// A run's working vectors (its slots, a step's arguments and outputs), taken from this thread's
// spares and given back empty with their capacity: a replay of a small plan allocates none of
// them. A run inside a step's op takes spares of its own.
__attribute__((tls_model("initial-exec"))) thread_local std::vector<std::vector<Tensor>> t_spares;
class ScratchTensors {
 public:
  ScratchTensors() {
    std::vector<std::vector<Tensor>>& spares = t_spares;
    if (spares.empty()) return;
    v_ = std::move(spares.back());
    spares.pop_back();
  }
  ~ScratchTensors() {
    v_.clear();
    // A large plan's slots are not kept: a thread would hold their capacity for good.
    if (t_spares.size() < kMaxSpares && v_.capacity() <= kMaxKept)
      t_spares.push_back(std::move(v_));
  }
  ScratchTensors(const ScratchTensors&) = delete;
  ScratchTensors& operator=(const ScratchTensors&) = delete;
  std::vector<Tensor>& operator*() { return v_; }

 private:
  static constexpr size_t kMaxSpares = 16;
  static constexpr size_t kMaxKept = 1024;  // tensors (16 KiB of handles)
  std::vector<Tensor> v_;
};

}  // namespace

fuser::CompiledKernel Plan::kernel_for(const Step& step, const fuser::Layout& layout) const {
  {
    std::lock_guard<std::mutex> lock(kernels_mutex_);
    for (const auto& [l, fn] : step.kernels)
      if (l == layout) return fn;
  }
  detail::SpanStart* step_span = t_step_span;
  if (step_span) detail::profile_end_discard(*step_span);
  fuser::CompiledKernel fn = fuser::cpu_kernel(step.group->kernel, layout);
  if (dump_ && fn.name)
    dump_->add_kernel(static_cast<size_t>(step.group - groups_.data()), fn.name);
  if (step_span) *step_span = detail::profile_begin();
  std::lock_guard<std::mutex> lock(kernels_mutex_);
  step.kernels.emplace_back(layout, fn);
  return fn;
}

const char* Plan::launch_cuda_group(const Step& step, const fuser::Layout& layout, int64_t n,
                                    const int64_t* sizes, const int64_t* strides,
                                    char* const* ptrs) const {
#ifdef KILN_HAS_CUDA
  // The variant before the lookup: each is a binary of its own, compiled on first use.
  const fuser::cuda::CudaCallFlags variant = fuser::cuda::launch_variant(
      step.group->kernel, layout, step.cuda_device, n, sizes, strides, ptrs);
  const int variant_bits = (variant.index32 ? 1 : 0) | (variant.vec ? 2 : 0) |
                           (variant.per_thread << 2) | (variant.block << 10);
  std::shared_ptr<const void> held;
  {
    std::lock_guard<std::mutex> lock(kernels_mutex_);
    for (const Step::CudaLoaded& c : step.cuda_kernels)
      if (c.variant == variant_bits && c.layout == layout) held = c.kernel;
  }
  if (!held) {
    detail::SpanStart* step_span = t_step_span;
    if (step_span) detail::profile_end_discard(*step_span);
    auto loaded = std::make_shared<fuser::cuda::CudaKernel>(
        fuser::cuda::cuda_kernel(step.group->kernel, layout, variant, step.cuda_device));
    if (step_span) *step_span = detail::profile_begin();
    if (t_step_event && *t_step_event) {
      detail::cuda::destroy_event(*t_step_event);
      *t_step_event = detail::cuda::record_event(
          step.cuda_device, detail::cuda::stream(step.cuda_device), /*timed=*/true);
    }
    held = loaded;
    std::lock_guard<std::mutex> lock(kernels_mutex_);
    step.cuda_kernels.push_back({layout, variant_bits, held});
  }
  const auto& kernel = *static_cast<const fuser::cuda::CudaKernel*>(held.get());
  if (layout.rows)
    fuser::cuda::launch_rows(kernel, step.group->kernel, layout, step.cuda_device, sizes, strides,
                             ptrs, step.group->scalars.data());
  else
    fuser::cuda::launch_elementwise(kernel, step.group->kernel, layout, step.cuda_device, n, sizes,
                                    strides, ptrs, step.group->scalars.data());
  return kernel.name;
#else
  (void)layout, (void)n, (void)sizes, (void)strides, (void)ptrs;
  KILN_FAIL("jit: ", step.group->kernel.ops, " is on cuda:", step.cuda_device,
            " but kiln was built without the CUDA toolkit");
#endif
}

namespace {
// The flat layout of a call (single_element, by_value) and whether it is flat: every input whole
// and contiguous or a single element, every destination contiguous. On a device, CPU inputs (0-dim
// numbers) are passed by value.
void set_flat_layout(fuser::Layout& layout, const std::vector<Tensor>& args,
                     const std::vector<Tensor>& dests, int64_t numel, bool on_device) {
  const size_t num_inputs = args.size();
  layout.flat = true;
  layout.rows = false;
  layout.rank = 0;
  layout.single_element.assign(num_inputs, false);
  layout.by_value.clear();
  layout.inner.clear();
  for (size_t k = 0; k < num_inputs; ++k) {
    const Tensor& t = args[k];
    const int64_t n = t.numel();
    if (on_device && t.device().is_cpu()) {
      layout.by_value.resize(num_inputs, false);
      layout.single_element[k] = layout.by_value[k] = true;
      continue;
    }
    if (n == numel && detail::is_contiguous_layout(t.sizes(), t.strides())) continue;
    if (n == 1) {
      layout.single_element[k] = true;
      continue;
    }
    layout.flat = false;
  }
  for (const Tensor& t : dests)
    if (!detail::is_contiguous_layout(t.sizes(), t.strides())) layout.flat = false;
}
}  // namespace

const char* Plan::run_group(const Step& step, const std::vector<Tensor>& host_args,
                            std::vector<Tensor>& outs) const {
  const fuser::FusionGroup& g = *step.group;
  // A CUDA kernel reads device memory, or numbers among its parameters: a CPU input (a 0-dim
  // number) of a flat kernel is passed by value (Layout::by_value), of another copied over first.
  std::vector<Tensor> moved;
  auto uploaded = [&] {
    moved = host_args;
    for (Tensor& t : moved)
      if (t.defined() && t.device().is_cpu())
        t = detail::copy_to_device(t, Device(DeviceType::CUDA, step.cuda_device));
    return &moved;
  };
  const std::vector<Tensor>* args_ptr = &host_args;
  // Where the kernel's outputs go: the outputs, then each join's pieces in their slices of its
  // value (the joins' values are the last outputs).
  std::vector<Tensor> joined;
  const std::vector<Tensor>* dests = &outs;
  if (!g.joins.empty()) {
    const size_t first_whole = outs.size() - g.joins.size();
    joined.assign(outs.begin(), outs.begin() + static_cast<std::ptrdiff_t>(first_whole));
    for (size_t j = 0; j < g.joins.size(); ++j) {
      const Tensor& whole = outs[first_whole + j];
      const bool stack = g.joins[j].node->op().name == "stack";
      const int64_t d = g.joins[j].dim;
      const int64_t width = stack ? 1 : g.shape[static_cast<size_t>(d)];
      for (int64_t p = 0; p < static_cast<int64_t>(g.joins[j].node->num_inputs()); ++p)
        joined.push_back(stack ? whole.select(d, p) : whole.narrow(d, p * width, width));
    }
    dests = &joined;
  }
  if (g.rows) return run_rows_group(step, step.cuda_device >= 0 ? *uploaded() : host_args, *dests);
  const Shape& shape = g.shape;
  const int64_t numel = detail::shape_numel(shape);
  // This thread's layout, reset: its vectors keep their capacity, so finding the step's kernel
  // allocates nothing (a copy is kept only when a new kernel is looked up).
  static thread_local fuser::Layout t_layout;
  fuser::Layout& layout = t_layout;
  set_flat_layout(layout, host_args, *dests, numel, step.cuda_device >= 0);
  if (!layout.flat && !layout.by_value.empty()) {  // strided on a device: numbers go over
    args_ptr = uploaded();
    set_flat_layout(layout, *args_ptr, *dests, numel, true);
  }
  const std::vector<Tensor>& args = *args_ptr;
  const size_t num_inputs = args.size();
  if (numel == 0) return nullptr;
  absl::InlinedVector<char*, 16> ptrs(num_inputs + dests->size());
  for (size_t k = 0; k < num_inputs; ++k) ptrs[k] = args[k].impl()->data();
  for (size_t k = 0; k < dests->size(); ++k) ptrs[num_inputs + k] = (*dests)[k].impl()->data();
  if (layout.flat) {
    if (step.cuda_device >= 0)
      return launch_cuda_group(step, layout, numel, nullptr, nullptr, ptrs.data());
    // Held while it runs (the plan holds it too).
    const fuser::CompiledKernel kernel = kernel_for(step, layout);
    const fuser::KernelFn fn = kernel.fn;
    detail::parallel_for(numel, detail::kParallelGrain, [&](int64_t begin, int64_t end) {
      fn(begin, end, ptrs.data(), nullptr, nullptr, g.scalars.data(), nullptr);
    });
    return kernel.name;
  }
  layout.single_element.clear();
  layout.rank = static_cast<int32_t>(shape.size());
  const size_t rank = shape.size();
  std::vector<int64_t> strides;
  strides.reserve(ptrs.size() * rank);
  for (const Tensor& t : args) {
    const Shape st = detail::broadcast_strides(t, shape);
    strides.insert(strides.end(), st.begin(), st.end());
  }
  for (const Tensor& t : *dests)
    strides.insert(strides.end(), t.strides().begin(), t.strides().end());
  // Kernels are specialized on each pointer's stride along the innermost dim (broadcast, unit or
  // other), so that the inner loop reads and writes whole vectors where it can.
  for (size_t p = 0; p < ptrs.size(); ++p) {
    const int64_t s = strides[p * rank + rank - 1];
    layout.inner.push_back(shape.back() == 1 || s == 0 ? fuser::Layout::kZero
                           : s == 1                    ? fuser::Layout::kUnit
                                                       : fuser::Layout::kAny);
  }
  if (step.cuda_device >= 0)
    return launch_cuda_group(step, layout, numel, shape.data(), strides.data(), ptrs.data());
  const fuser::CompiledKernel kernel = kernel_for(step, layout);
  const fuser::KernelFn fn = kernel.fn;
  const int64_t inner = shape.back();
  detail::parallel_for(numel / inner, std::max<int64_t>(1, detail::kParallelGrain / inner),
                       [&](int64_t begin, int64_t end) {
                         fn(begin, end, ptrs.data(), shape.data(), strides.data(), g.scalars.data(),
                            nullptr);
                       });
  return kernel.name;
}

const char* Plan::run_rows_group(const Step& step, const std::vector<Tensor>& args,
                                 const std::vector<Tensor>& outs) const {
  const fuser::FusionGroup& g = *step.group;
  const Shape& shape = g.shape;
  const int rank = static_cast<int>(shape.size());
  const int outer = rank - g.reduced_dims;
  const Shape outer_shape(shape.begin(), shape.begin() + outer);
  const int64_t rows = detail::shape_numel(outer_shape);
  const int64_t row_length = detail::shape_numel(Shape(shape.begin() + outer, shape.end()));
  fuser::Layout layout;
  layout.flat = false;
  layout.rows = true;
  layout.rank = outer;
  std::vector<int64_t> sizes(outer_shape.begin(), outer_shape.end());
  sizes.push_back(row_length);
  std::vector<int64_t> strides;
  std::vector<char*> ptrs;
  // A pointer's strides over the outer dims and its one stride along a row, if the row's dims
  // collapse into one for it.
  auto add = [&](const Shape& st, char* data) {
    int64_t inner = 0, span = 0;
    for (int d = rank - 1; d >= outer; --d) {
      if (shape[static_cast<size_t>(d)] == 1) continue;
      if (span == 0) {
        inner = st[static_cast<size_t>(d)];
        span = shape[static_cast<size_t>(d)];
      } else if (st[static_cast<size_t>(d)] != inner * span) {
        return false;
      } else {
        span *= shape[static_cast<size_t>(d)];
      }
    }
    strides.insert(strides.end(), st.begin(), st.begin() + outer);
    strides.push_back(inner);
    layout.inner.push_back(inner == 0   ? fuser::Layout::kZero
                           : inner == 1 ? fuser::Layout::kUnit
                                        : fuser::Layout::kAny);
    ptrs.push_back(data);
    return true;
  };
  std::vector<Tensor> copies;  // inputs whose rows do not collapse, made contiguous
  for (size_t i = 0; i < args.size(); ++i) {
    const Tensor& t = args[i];
    Shape st;
    if (g.input_outer[i]) {
      st = detail::broadcast_strides(t, outer_shape);
      st.resize(shape.size(), 0);
    } else {
      st = detail::broadcast_strides(t, shape);
    }
    if (add(st, t.impl()->data())) continue;
    copies.push_back(t.expand(shape).contiguous());
    const bool ok = add(detail::contiguous_strides(shape), copies.back().impl()->data());
    KILN_CHECK(ok, "jit: a contiguous input's rows do not collapse");
  }
  const Shape row_strides = detail::contiguous_strides(outer_shape);
  for (size_t o = 0; o < outs.size(); ++o) {
    Shape st(shape.size(), 0);
    switch (step.output_levels[o]) {
      case fuser::Level::kElement:
        // Fresh and contiguous, or a join's piece in its slice (rows of one dim then).
        st = outs[o].strides();
        break;
      case fuser::Level::kGlobal:
      case fuser::Level::kColumn:  // written by the finish functions
        break;
      default:
        std::copy(row_strides.begin(), row_strides.end(), st.begin());
        break;
    }
    char* data = outs[o].impl()->data();
    const bool ok = add(st, data);
    KILN_CHECK(ok || row_length == 0, "jit: an output's rows do not collapse");
    if (!ok) {
      strides.insert(strides.end(), st.begin(), st.begin() + outer);
      strides.push_back(1);
      layout.inner.push_back(fuser::Layout::kUnit);
      ptrs.push_back(data);
    }
  }
  if (step.cuda_device >= 0)
    return launch_cuda_group(step, layout, rows * row_length, sizes.data(), strides.data(),
                             ptrs.data());
  const fuser::CompiledKernel kernel = kernel_for(step, layout);
  int64_t chunk = std::max<int64_t>(1, detail::kParallelGrain / std::max<int64_t>(1, row_length));
  const fuser::Kernel& k = g.kernel;
  const int32_t globals = k.num_globals;
  const int32_t columns = k.num_columns();
  if (globals == 0 && columns == 0) {
    detail::parallel_for(rows, chunk, [&](int64_t begin, int64_t end) {
      kernel.fn(begin, end, ptrs.data(), sizes.data(), strides.data(), g.scalars.data(), nullptr);
    });
    return kernel.name;
  }
  // Global and column reductions: calls of fixed row ranges (so results do not depend on the
  // thread count), each folding into its own partials, combined in row order by the finish and
  // columns functions. Column partials are a row's length each: at most kMaxColumnCalls calls keep
  // them (and their combination) small beside the data, with enough calls for every core.
  if (columns > 0) chunk = std::max(chunk, (rows + kMaxColumnCalls - 1) / kMaxColumnCalls);
  const int64_t calls = std::max<int64_t>(1, (rows + chunk - 1) / chunk);
  const int64_t stride = k.partials_per_call(row_length);
  // Every call writes its whole block first: no need to clear it.
  std::unique_ptr<uint64_t[]> partials(new uint64_t[static_cast<size_t>(calls * stride)]);
  detail::parallel_for(calls, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      kernel.fn(std::min(rows, c * chunk), std::min(rows, (c + 1) * chunk), ptrs.data(),
                sizes.data(), strides.data(), g.scalars.data(), partials.get() + c * stride);
  });
  if (globals > 0) kernel.finish(calls, stride, partials.get(), ptrs.data(), g.scalars.data());
  if (columns > 0) {
    int64_t positions = 0;
    for (int32_t parts : k.column_parts) positions = std::max(positions, parts * row_length);
    detail::parallel_for(positions, detail::kParallelGrain / std::max<int64_t>(1, calls),
                         [&](int64_t begin, int64_t end) {
                           kernel.columns(begin, end, calls, stride, row_length, partials.get(),
                                          ptrs.data(), g.scalars.data());
                         });
  }
  return kernel.name;
}

namespace {
std::atomic<int64_t> g_fused_kernels_run{0}, g_unfused_steps_run{0}, g_in_place_writes{0};

int64_t tensor_bytes(const Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(element_size(t.dtype())) : 0;
}

std::string shape_text(const Shape& s) {
  std::string out;
  for (size_t d = 0; d < s.size(); ++d) out += (d ? "x" : "") + std::to_string(s[d]);
  return out.empty() ? "scalar" : out;
}

// The profile record of a step that ran (profiling on): its kind, name, shape, the bytes of its
// inputs and outputs, and for GEMMs their 2*M*N*K floating-point operations.
profiler::Record step_record(const Node& node, const fuser::FusionGroup* group, const char* kernel,
                             bool direct, const std::vector<Tensor>& args,
                             const std::vector<Tensor>& outs) {
  profiler::Record r;
  if (group) {
    r.category = profiler::Category::kKernel;
    r.name = "fused:" + group->kernel.ops;
    if (kernel) r.kernel = kernel;
    r.shape = shape_text(group->shape);
  } else {
    const std::string& op = node.op().name;
    r.category = direct ? profiler::Category::kOp : profiler::Category::kLibrary;
    r.name = op;
    if (!outs.empty() && outs[0].defined()) r.shape = shape_text(outs[0].sizes());
    // The contracted length: the first matrix's last dim (addmm's first matrix is its second
    // input).
    const size_t a = op == "addmm" ? 1 : 0;
    if ((op == "mm" || op == "bmm" || op == "matmul" || op == "addmm" || op == "linear") &&
        args.size() > a && args[a].defined() && args[a].dim() > 0 && !outs.empty() &&
        outs[0].defined() && is_floating_point(outs[0].dtype()))
      r.flops = 2 * outs[0].numel() * args[a].size(-1);
  }
  for (const Tensor& t : args) r.bytes += tensor_bytes(t);
  for (const Tensor& t : outs) r.bytes += tensor_bytes(t);
  return r;
}

// The device steps of a profiled run: their records wait for the events bracketing each step on
// its device's stream, read once the run has issued everything, so that profiling does not make
// the host wait for the device step by step.
struct DeviceSpans {
  struct Span {
    detail::SpanStart start;
    profiler::Record record;
    void* begin;
    void* end;
  };
  std::vector<Span> spans;
  // Stores the records, each with the time its device took from reaching the step's first event
  // to finishing the step's work.
  void store() {
    for (Span& s : spans) {
      const float ms = detail::cuda::elapsed_ms(s.begin, s.end);
      detail::profile_store(s.start, std::move(s.record), static_cast<int64_t>(ms * 1e6));
    }
  }
  ~DeviceSpans() {
    for (Span& s : spans) {
      detail::cuda::destroy_event(s.begin);
      detail::cuda::destroy_event(s.end);
    }
  }
};
}  // namespace

PlanRunCounts plan_run_counts() {
  return {g_fused_kernels_run.load(std::memory_order_relaxed),
          g_unfused_steps_run.load(std::memory_order_relaxed),
          g_in_place_writes.load(std::memory_order_relaxed)};
}

namespace {
// Whether a step may write a value of `type` into `target` (a graph input): the target is a whole,
// contiguous, concrete buffer of that type that no other graph input shares, and the step reads
// it, if at all, at the element it writes (contiguous, from the same first element).
bool writable_in_place(const Tensor& target, const ValueType& type, const std::vector<Tensor>& args,
                       const std::vector<Tensor>& inputs) {
  if (!target.defined() || target.dtype() != type.dtype || !target.is_contiguous()) return false;
  const detail::Storage* storage = target.impl()->storage.get();
  const int64_t numel = detail::shape_numel(type.sizes);
  if (storage->pending.load(std::memory_order_acquire) || target.numel() != numel ||
      static_cast<size_t>(numel) * element_size(type.dtype) != storage->nbytes)
    return false;
  int sharing = 0;
  for (const Tensor& t : inputs) sharing += t.defined() && t.impl()->storage.get() == storage;
  if (sharing != 1) return false;
  for (const Tensor& a : args) {
    if (!a.defined() || a.impl()->storage.get() != storage) continue;
    if (a.impl()->data() != target.impl()->data() || !a.is_contiguous() || a.numel() != numel)
      return false;
  }
  return true;
}
}  // namespace

namespace {
// A run's collectives in flight: (the step that started one, its wait), in start order.
using InFlight = std::vector<std::pair<size_t, std::function<void()>>>;

void finish_collective(InFlight& in_flight, size_t step) {
  for (auto& [started_by, wait] : in_flight) {
    if (started_by != step || !wait) continue;
    std::function<void()> w = std::move(wait);
    wait = nullptr;
    w();
    return;
  }
}
}  // namespace

std::vector<Tensor> Plan::run(const std::vector<Tensor>& inputs) const {
  KILN_CHECK(inputs.size() == input_slots_.size(), "jit: the graph takes ", input_slots_.size(),
             " inputs, got ", inputs.size());
  ScratchTensors slots_scratch;
  std::vector<Tensor>& slots = *slots_scratch;
  slots.resize(num_slots_);
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
  const bool warm = warm_.load(std::memory_order_acquire);
  ScratchTensors args_scratch, outs_scratch;
  std::vector<Tensor>& args = *args_scratch;
  std::vector<Tensor>& outs = *outs_scratch;
  // Read once per run: off, the steps' only profiling cost is a branch on this.
  const bool profiling = detail::profiling();
  detail::SpanStart span{0, 0};
  // t_step_span points at `span` during this run (restored after: a run inside a step's op).
  void* step_event = nullptr;  // the timed event opening a profiled device step
  struct StepSpanScope {
    detail::SpanStart* previous = t_step_span;
    void** previous_event = t_step_event;
    ~StepSpanScope() {
      t_step_span = previous;
      t_step_event = previous_event;
    }
  } step_span_scope;
  t_step_span = profiling ? &span : nullptr;
  t_step_event = profiling ? &step_event : nullptr;
  DeviceSpans device_spans;
  const char* kernel = nullptr;  // the symbol of the group's kernel that ran
  // A step's profile record, naming its graph and fusion group: a kernel that several groups
  // share is timed per group.
  auto record_of = [&](const Step& step) {
    profiler::Record r =
        step_record(*step.node, step.group, kernel, step.map_into != nullptr, args, outs);
    r.graph = graph_;
    if (step.group) r.group = static_cast<int64_t>(step.group - groups_.data());
    return r;
  };
  InFlight in_flight;
  for (const Step& step : steps_) {
    for (size_t started_by : step.wait_for) finish_collective(in_flight, started_by);
    if (profiling) {
      span = detail::profile_begin();
      if (step.cuda_device >= 0)
        step_event = detail::cuda::record_event(
            step.cuda_device, detail::cuda::stream(step.cuda_device), /*timed=*/true);
    }
    args.clear();
    for (int64_t s : step.inputs) args.push_back(s < 0 ? Tensor() : slots[static_cast<size_t>(s)]);
    if (step.start) {
      detail::StartedCollective started = step.start(args, step.node->attrs());
      outs = std::move(started.outputs);
      in_flight.emplace_back(static_cast<size_t>(&step - steps_.data()), std::move(started.wait));
      g_unfused_steps_run.fetch_add(1, std::memory_order_relaxed);
    } else if (step.map_into || step.group) {
      outs.clear();
      for (size_t k = 0; k < step.outputs.size(); ++k) {
        if (step.arena[k] >= 0) {
          outs.push_back(arena->values[static_cast<size_t>(step.arena[k])]);
          continue;
        }
        const ValueType& type =
            step.group ? step.group->outputs[k]->type() : step.node->output()->type();
        if (step.in_place[k] >= 0 && warm) {
          const Tensor& target = inputs[static_cast<size_t>(step.in_place[k])];
          if (writable_in_place(target, type, args, inputs)) {
            outs.push_back(target.view(type.sizes));
            g_in_place_writes.fetch_add(1, std::memory_order_relaxed);
            continue;
          }
        }
        outs.push_back(step.cuda_device < 0
                           ? detail::make_empty(type.sizes, type.dtype)
                           : detail::make_empty_on(type.sizes, type.dtype, type.device));
      }
      if (step.group) {
        kernel = run_group(step, args, outs);
        g_fused_kernels_run.fetch_add(1, std::memory_order_relaxed);
      } else {
        step.map_into(outs[0], args.data(), step.node->attrs());
        g_unfused_steps_run.fetch_add(1, std::memory_order_relaxed);
      }
    } else if (step.cuda_device >= 0) {
      outs = step.through_host ? invoke_through_host(*step.node, args)
                               : invoke_in_scope(*step.node, args);
      g_unfused_steps_run.fetch_add(1, std::memory_order_relaxed);
    } else {
      outs = invoke_in_scope(*step.node, args);
      if (step.node->op().kind != detail::OpKind::View)
        g_unfused_steps_run.fetch_add(1, std::memory_order_relaxed);
    }
    if (profiling) {
      // Views compute nothing: no record.
      const bool records =
          step.group || step.map_into || step.node->op().kind != detail::OpKind::View;
      if (step.cuda_device >= 0) {
        // Device work is asynchronous: a device step's span is its time on the device, from the
        // events around it (read after the run).
        void* end = detail::cuda::record_event(
            step.cuda_device, detail::cuda::stream(step.cuda_device), /*timed=*/true);
        if (records) {
          device_spans.spans.push_back({span, record_of(step), step_event, end});
        } else {
          detail::cuda::destroy_event(step_event);
          detail::cuda::destroy_event(end);
        }
        step_event = nullptr;
        detail::profile_end_discard(span);
      } else if (records) {
        detail::profile_end(span, record_of(step));
      } else {
        detail::profile_end_discard(span);
      }
    }
    for (int64_t s : step.release) slots[static_cast<size_t>(s)] = Tensor();
    for (size_t k = 0; k < outs.size(); ++k) {
      bool released = false;
      for (int64_t r : step.release) released |= r == step.outputs[k];
      if (!released) slots[static_cast<size_t>(step.outputs[k])] = std::move(outs[k]);
    }
  }
  for (const auto& entry : in_flight) finish_collective(in_flight, entry.first);
  if (profiling) device_spans.store();
  warm_.store(true, std::memory_order_release);
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
