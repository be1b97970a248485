// In-place planning: which of a trace's write-backs a plan may compute straight in the buffer of
// the captured tensor it writes (see Plan's class comment), and why not for the others.
#include <string>

#include "absl/container/flat_hash_map.h"
#include "exec/executor.h"
#include "exec/plan_step.h"
#include "jit/log.h"
#include "jit/passes/rewriter.h"
#include "kiln/error.h"

namespace kiln::jit {

namespace {
// The graph input each value aliases (through views), in one pass over the nodes in order.
absl::flat_hash_map<const Value*, int64_t> alias_roots(const Graph& graph) {
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
  return root;
}

// Whether a step may raise after it has started writing: on the values it reads (an index out of
// range, an integer division by zero, a singular matrix), or a collective or a wait for one (a peer
// gone, the timeout); otherwise only when memory runs out.
bool may_fail(const PlanStep& st) {
  if (!st.wait_for.empty()) return true;
  if (st.group()) return false;
  if (passes::has_side_effects(st.node->op()) || st.node->op().raises_on_values) return true;
  if (st.direct() || !st.node->op().checks_integer_values) return false;
  for (const Value* in : st.node->inputs())
    if (in && !is_floating_point(in->type().dtype)) return true;
  return false;
}

// What the in-place decision reads about the steps.
struct InPlaceFacts {
  absl::flat_hash_map<const Value*, int64_t> root;  // see alias_roots
  // Per graph input: the last step reading it or an alias of it; and whether an alias is an
  // output.
  std::vector<int64_t> last_read;
  std::vector<bool> aliased_output;
  absl::flat_hash_map<const Node*, size_t> step_of;  // by the node a step runs
  absl::flat_hash_map<const Node*, const fuser::FusionGroup*> group_of;
  // From each step on, the first step that may fail (may_fail), or the number of steps.
  std::vector<size_t> next_unsafe;
};

InPlaceFacts in_place_facts(const Graph& graph, const std::vector<PlanStep>& steps,
                            const std::vector<fuser::FusionGroup>& groups) {
  InPlaceFacts f;
  f.root = alias_roots(graph);
  f.last_read.assign(graph.inputs().size(), -1);
  f.aliased_output.assign(graph.inputs().size(), false);
  f.next_unsafe.assign(steps.size() + 1, steps.size());
  for (size_t i = 0; i < steps.size(); ++i) f.step_of[steps[i].node] = i;
  for (size_t i = steps.size(); i-- > 0;)
    f.next_unsafe[i] = may_fail(steps[i]) ? i : f.next_unsafe[i + 1];
  for (const fuser::FusionGroup& g : groups)
    for (const Node* n : g.nodes) f.group_of[n] = &g;
  for (size_t i = 0; i < steps.size(); ++i) {
    const PlanStep& st = steps[i];
    const std::vector<const Value*> reads =
        st.group() ? st.group()->inputs
                   : std::vector<const Value*>(st.node->inputs().begin(), st.node->inputs().end());
    for (const Value* v : reads) {
      auto r = v ? f.root.find(v) : f.root.end();
      if (r != f.root.end()) f.last_read[static_cast<size_t>(r->second)] = static_cast<int64_t>(i);
    }
  }
  for (const Value* o : graph.outputs())
    if (auto r = f.root.find(o); r != f.root.end())
      f.aliased_output[static_cast<size_t>(r->second)] = true;
  return f;
}

// Why step `at` may not compute its output in graph input j's buffer, or "".
std::string why_not_in_place(const InPlaceFacts& f, const std::vector<PlanStep>& steps, size_t at,
                             int64_t j) {
  const PlanStep& st = steps[at];
  const fuser::FusionGroup* g = st.group();
  if (!(g && !g->rows && g->joins.empty()) && !st.direct())
    return "its step is no elementwise kernel or direct step";
  if (f.last_read[static_cast<size_t>(j)] > static_cast<int64_t>(at))
    return "a later step reads the input's old value";
  if (f.aliased_output[static_cast<size_t>(j)])
    return "the input, or a view of it, is a graph output";
  if (const size_t u = f.next_unsafe[at + 1]; u < steps.size())
    return "a step after it may fail (step " + std::to_string(u) + ", " + steps[u].node->op().name +
           ")";
  return "";
}
}  // namespace

void Plan::plan_in_place(const Graph& graph, const std::vector<int64_t>& in_place_inputs) {
  KILN_CHECK(in_place_inputs.size() == graph.outputs().size(), "jit: ", in_place_inputs.size(),
             " in-place entries for ", graph.outputs().size(), " graph outputs");
  const InPlaceFacts f = in_place_facts(graph, steps_, groups_);
  for (size_t k = 0; k < in_place_inputs.size(); ++k) {
    const int64_t j = in_place_inputs[k];
    if (j < 0) continue;
    KILN_CHECK(j < static_cast<int64_t>(graph.inputs().size()), "jit: in-place input ", j,
               " of a graph with ", graph.inputs().size(), " inputs");
    // The value the output views, and the step that computes it.
    const Value* v = graph.outputs()[k];
    while (v->node()->op().kind == detail::OpKind::View && v->node()->num_inputs() > 0 &&
           v->node()->input(0) && !f.root.contains(v))
      v = v->node()->input(0);
    const Node* producer = v->node();
    auto g = f.group_of.find(producer);
    auto s = f.step_of.find(g == f.group_of.end() ? producer : g->second->anchor);
    const std::string why = s == f.step_of.end() ? "it is not computed by a step"
                                                 : why_not_in_place(f, steps_, s->second, j);
    if (!why.empty()) {
      log("fuser", "write-back %", graph.outputs()[k]->id(), " gets a buffer of its own: ", why);
      continue;
    }
    PlanStep& st = steps_[s->second];
    OwnOutputs& own = *st.own();
    for (size_t o = 0; o < st.outputs.size(); ++o) {
      const Value* out = st.group() ? st.group()->outputs[o] : st.node->output(o);
      if (out == v && own.arena[o] < 0) own.in_place[o] = j;
    }
    log("fuser", "write-back %", graph.outputs()[k]->id(), " is computed in the buffer of input ",
        j, " (step ", s->second, ", ", st.group() ? st.group()->kernel.ops : st.node->op().name,
        ")");
  }
}

size_t Plan::num_in_place_outputs() const {
  size_t n = 0;
  for (const PlanStep& step : steps_)
    if (const OwnOutputs* own = step.own())
      for (int64_t j : own->in_place) n += j >= 0;
  return n;
}

}  // namespace kiln::jit
