// View pushing: a view of an elementwise result becomes the same elementwise op over views of its
// operands, so that views turn into index arithmetic inside fusion groups instead of splitting
// them.
//
// transpose(mul(a, b)) computes the same elements as mul(transpose(a), transpose(b)): an
// elementwise op commutes with any view that only picks and reorders elements (transpose,
// permute, expand, slice, select, squeeze, unsqueeze), once each operand is broadcast to the op's
// shape. After the rewrite the views sit on values computed elsewhere (graph inputs, GEMM
// outputs), where they cost nothing: a fused kernel reads its inputs through their strides. A
// chain is pushed all the way down, so `(a * b).t() + c` and an LSTM cell's `(x_gates +
// h_gates).chunk(4)` followed by the gate activations each become one kernel.
//
// The rewrite never duplicates work: an elementwise node is pushed through only when every use of
// it is such a view and each of those views is read by something that fuses (an elementwise op,
// a reduction, a join, or another view), so the original node disappears. The views' element sets
// may overlap (a value read both as x and x.t()), in which case the overlap is computed twice,
// inside kernels. Operands of rank 0 broadcast as they are and keep their place in type
// promotion (so a 0-dim result is left alone); a view to rank 0 (select of a vector) is pushed only
// when the operands share a dtype, since 0-dim operands promote differently from dimensioned ones.
//
// Elementwise results are the same element for element, so the rewrite is exact. It runs only
// when fusion is on: without kernels to absorb them, pushed views save nothing.
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "jit/fusibility.h"
#include "jit/passes/passes.h"
#include "jit/passes/rewriter.h"

namespace kiln::jit {

namespace {

// Beyond this many uses a value is left alone: the checks scan use lists, and bounding them keeps
// the pass linear in the graph.
constexpr size_t kMaxScannedUses = 64;

struct ViewOps {
  absl::flat_hash_set<const OpDef*> pushable;
  const OpDef* expand = detail::find_op("expand");
  const OpDef* cat = detail::find_op("cat");
  const OpDef* stack = detail::find_op("stack");
  ViewOps() {
    for (const char* name :
         {"transpose", "permute", "expand", "slice", "select", "squeeze", "unsqueeze"})
      if (const OpDef* op = detail::find_op(name)) pushable.insert(op);
  }
};

const ViewOps& view_ops() {
  static const ViewOps o;
  return o;
}

bool is_pushable_view(const Node& n) {
  return n.num_inputs() == 1 && n.num_outputs() == 1 && n.input(0) &&
         view_ops().pushable.contains(&n.op());
}

bool is_elementwise(const Node& n) {
  const OpDef& op = n.op();
  // where (ternary: the ReLU gradient's) has a formula but no map_into.
  const bool unary_binary = op.kind == detail::OpKind::Unary || op.kind == detail::OpKind::Binary;
  return ((unary_binary && op.map_into) || op.kind == detail::OpKind::Ternary) && op.formula &&
         n.num_outputs() == 1 && !passes::is_nondeterministic(op);
}

// Whether a view's result is read only by nodes that fuse with what computes it.
bool feeds_fusion(const Node& view, const absl::flat_hash_set<Node*>& dead) {
  const Value* v = view.output();
  if (v->node()->owning_graph()->is_output(v) || v->uses().size() > kMaxScannedUses) return false;
  bool any = false;
  for (const Use& u : v->uses()) {
    if (dead.contains(u.user)) continue;
    const OpDef& op = u.user->op();
    const bool fuses = op.formula != nullptr || is_pushable_view(*u.user) ||
                       &op == view_ops().cat || &op == view_ops().stack;
    if (!fuses) return false;
    any = true;
  }
  return any;
}

class ViewPusher {
 public:
  explicit ViewPusher(Graph& g) : g_(g) {}

  int64_t run() {
    for (Node* n = g_.first(); n; n = n->next())
      if (is_pushable_view(*n)) stack_.push_back(n);
    int64_t pushed = 0;
    while (!stack_.empty()) {
      Node* view = stack_.back();
      stack_.pop_back();
      if (dead_.contains(view)) continue;
      pushed += push(view);
    }
    std::vector<Node*> doomed(dead_.begin(), dead_.end());
    passes::remove_dead_nodes(g_, doomed);
    return pushed;
  }

 private:
  // Uses of v by nodes still alive.
  std::vector<Node*> live_users(const Value* v) const {
    std::vector<Node*> users;
    for (const Use& u : v->uses())
      if (!dead_.contains(u.user)) users.push_back(u.user);
    return users;
  }

  bool push(Node* view) {
    Value* x = view->input(0);
    Node* e = x->node();
    if (!is_elementwise(*e) || g_.is_output(x) || x->uses().size() > kMaxScannedUses) return false;
    for (Node* user : live_users(x))
      if (!is_pushable_view(*user) || !feeds_fusion(*user, dead_)) return false;
    const ValueType& out = view->output()->type();
    const Shape& e_shape = x->type().sizes;
    // A 0-dim result of 0-dim operands: viewing them would change their rank, and with it type
    // promotion.
    if (e_shape.empty()) return false;
    if (out.sizes.empty()) {
      for (const Value* in : e->inputs())
        if (!in || in->type().dtype != x->type().dtype) return false;
    }
    const ViewOps& ops = view_ops();
    const bool is_expand = &view->op() == ops.expand;
    std::vector<Value*> operands;
    std::vector<Node*> created;
    for (Value* in : e->inputs()) {
      if (!in) return false;
      if (in->type().sizes.empty()) {
        operands.push_back(in);
        continue;
      }
      ValueType t{in->type().dtype, out.sizes, in->type().device, false};
      if (is_expand) {
        // Broadcasting composes: the operand expands straight to the view's shape.
        Node* v = g_.create(*ops.expand, {in}, {std::vector<int64_t>(out.sizes)}, {t}, view);
        operands.push_back(v->output());
        created.push_back(v);
        continue;
      }
      Value* full = in;
      if (in->type().sizes != e_shape) {
        ValueType et{in->type().dtype, e_shape, in->type().device, false};
        full = g_.create(*ops.expand, {in}, {std::vector<int64_t>(e_shape)}, {et}, view)->output();
      }
      Node* v = g_.create(view->op(), {full}, view->attrs(), {t}, view);
      operands.push_back(v->output());
      created.push_back(v);
    }
    Node* pushed = g_.create(e->op(), operands, e->attrs(), {out}, view);
    view->output()->replace_all_uses_with(pushed->output());
    dead_.insert(view);
    // The new views may push further down, now or once their operand loses its other readers.
    for (Node* v : created) stack_.push_back(v);
    // The views this one fed may now sit on an elementwise node.
    for (Node* user : live_users(pushed->output()))
      if (is_pushable_view(*user)) stack_.push_back(user);
    if (live_users(x).empty()) {
      dead_.insert(e);
      for (Value* in : e->inputs())
        if (in->uses().size() <= kMaxScannedUses)
          for (Node* user : live_users(in))
            if (is_pushable_view(*user)) stack_.push_back(user);
    }
    return true;
  }

  Graph& g_;
  std::vector<Node*> stack_;
  absl::flat_hash_set<Node*> dead_;
};

}  // namespace

bool push_views(Graph& g, PassContext& ctx) {
  if (!fusion_queries().enabled()) return false;
  const int64_t pushed = ViewPusher(g).run();
  if (pushed) ctx.count("view pushed through an elementwise op", pushed);
  return pushed > 0;
}

}  // namespace kiln::jit
