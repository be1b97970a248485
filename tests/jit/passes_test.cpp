// Tests of the graph passes: each rule fires where it should and nowhere else, rewrites reach a
// fixpoint, the pass manager's switches and profile, numerical accuracy of the stabilized forms,
// and million-node graphs through every pass.
#include "jit/passes/passes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <unordered_set>
#include <utility>

#include "exec/executor.h"
#include "jit/ir.h"
#include "kiln/kiln.h"
#include "tests/scale.h"
#include "tests/testing.h"

namespace kiln::jit {
namespace {

using Pass = bool (*)(Graph&, PassContext&);

ValueType vt(DType dtype, Shape sizes, bool wrapped = false) {
  return ValueType{dtype, std::move(sizes), kCPU, wrapped};
}
ValueType f32(Shape sizes) {
  return vt(kFloat32, std::move(sizes));
}

Value* op(Graph& g, const std::string& name, std::vector<Value*> inputs, Attrs attrs,
          ValueType type) {
  return g.create(name, inputs, std::move(attrs), {std::move(type)})->output();
}
Value* unary(Graph& g, const std::string& name, Value* x) {
  return op(g, name, {x}, {}, x->type());
}
Value* cint(Graph& g, int64_t v) {
  return g.constant(AttrValue(v), kInt64);
}
Value* cdouble(Graph& g, double v) {
  return g.constant(AttrValue(v), kFloat64);
}

int64_t count(const Graph& g, const std::string& kind) {
  int64_t n = 0;
  for (const Node* node = g.first(); node; node = node->next()) n += node->kind() == kind;
  return n;
}

// Runs one pass and checks the graph it leaves.
PassContext apply(Pass pass, Graph& g) {
  PassContext ctx;
  pass(g, ctx);
  g.verify();
  return ctx;
}

int64_t rewrites(const PassContext& ctx, const std::string& rule) {
  auto it = ctx.rewrites.find(rule);
  return it == ctx.rewrites.end() ? 0 : it->second;
}

// The node producing the graph's first output.
const Node* out_node(const Graph& g) {
  return g.outputs().at(0)->node();
}

// ------------------------------------------------------------------------------------------- dce
TEST(Dce, RemovesNodesThatReachNoOutput) {
  Graph g;
  Value* x = g.add_input(f32({3}));
  Value* unused_input = g.add_input(f32({2}));
  Value* e = unary(g, "exp", x);
  Value* dead1 = unary(g, "neg", x);
  unary(g, "log", dead1);
  cdouble(g, 2.0);
  g.add_output(e);
  PassContext ctx = apply(&eliminate_dead_code, g);
  EXPECT_EQ(rewrites(ctx, "dead_node"), 3);
  EXPECT_EQ(g.size(), 3u);  // two inputs and exp
  EXPECT_EQ(g.inputs().size(), 2u);
  EXPECT_EQ(g.inputs()[1], unused_input);
  EXPECT_FALSE(eliminate_dead_code(g, ctx));
}

TEST(Dce, KeepsEverythingAnOutputNeeds) {
  Graph g;
  Value* x = g.add_input(f32({3}));
  Value* a = unary(g, "exp", x);
  Value* b = op(g, "mul", {a, a}, {}, f32({3}));
  g.add_output(b);
  g.add_output(a);
  PassContext ctx;
  EXPECT_FALSE(eliminate_dead_code(g, ctx));
  EXPECT_EQ(g.size(), 3u);
}

// ------------------------------------------------------------------------------------------- cse
TEST(Cse, MergesEqualNodesAndTheirUsers) {
  Graph g;
  Value* x = g.add_input(f32({3}));
  Value* e1 = unary(g, "exp", x);
  Value* e2 = unary(g, "exp", x);
  Value* n1 = unary(g, "neg", e1);
  Value* n2 = unary(g, "neg", e2);
  g.add_output(op(g, "add", {n1, n2}, {int64_t{1}}, f32({3})));
  PassContext ctx = apply(&eliminate_common_subexpressions, g);
  EXPECT_EQ(rewrites(ctx, "common_subexpression"), 2);
  EXPECT_EQ(count(g, "exp"), 1);
  EXPECT_EQ(count(g, "neg"), 1);
  const Node* add = out_node(g);
  EXPECT_EQ(add->input(0), add->input(1));
}

TEST(Cse, ConstantsMergeByValueDtypeAndWrappedFlag) {
  Graph g;
  Value* x = g.add_input(f32({3}));
  std::vector<Value*> cs = {
      g.constant(AttrValue(2.0), kFloat64),        g.constant(AttrValue(2.0), kFloat64),
      g.constant(AttrValue(2.0), kFloat64, false), g.constant(AttrValue(int64_t{2}), kInt64),
      g.constant(AttrValue(2.0), kFloat32),        g.constant(AttrValue(0.0), kFloat64),
      g.constant(AttrValue(-0.0), kFloat64),
  };
  for (Value* c : cs) g.add_output(op(g, "mul", {x, c}, {}, f32({3})));
  PassContext ctx = apply(&eliminate_common_subexpressions, g);
  EXPECT_EQ(rewrites(ctx, "duplicate_constant"), 1);
  EXPECT_EQ(rewrites(ctx, "common_subexpression"), 1);  // x * 2.0 twice
  EXPECT_EQ(count(g, "constant"), 6);
  EXPECT_EQ(count(g, "mul"), 6);
}

TEST(Cse, DifferentAttributesDoNotMerge) {
  Graph g;
  Value* x = g.add_input(f32({2, 3}));
  Value* y = g.add_input(f32({2, 3}));
  g.add_output(op(g, "add", {x, y}, {int64_t{1}}, f32({2, 3})));
  g.add_output(op(g, "add", {x, y}, {int64_t{2}}, f32({2, 3})));
  g.add_output(op(g, "add", {x, y}, {2.0}, f32({2, 3})));
  g.add_output(op(g, "add", {y, x}, {int64_t{1}}, f32({2, 3})));
  g.add_output(op(g, "sum", {x}, {std::vector<int64_t>{0}, false, std::monostate{}}, f32({3})));
  g.add_output(op(g, "sum", {x}, {std::vector<int64_t>{1}, false, std::monostate{}}, f32({2})));
  PassContext ctx;
  EXPECT_FALSE(eliminate_common_subexpressions(g, ctx));
  EXPECT_EQ(g.size(), 8u);
}

TEST(Cse, NeverMergesRandomOps) {
  Graph g;
  Value* x = g.add_input(f32({4}));
  Value* draws = g.add_input(vt(kFloat64, {4}));
  g.add_output(op(g, "dropout", {x, draws}, {0.5}, f32({4})));
  g.add_output(op(g, "dropout", {x, draws}, {0.5}, f32({4})));
  PassContext ctx;
  EXPECT_FALSE(eliminate_common_subexpressions(g, ctx));
  EXPECT_EQ(count(g, "dropout"), 2);
}

// ------------------------------------------------------------------------------------------ fold
bool has_kernel(const std::string& name) {
  const OpDef* def = detail::find_op(name);
  return def && def->invoke;
}

TEST(Fold, ScalarArithmeticBecomesAConstant) {
  if (!has_kernel("mul") || !has_kernel("neg")) GTEST_SKIP() << "mul/neg have no kernel yet";
  Graph g;
  Value* x = g.add_input(f32({3}));
  // Two wrapped doubles multiply to float32, the default dtype (as in torch).
  Value* p = op(g, "mul", {cdouble(g, 2.0), cdouble(g, 3.0)}, {}, f32({}));
  Value* n = unary(g, "neg", p);
  g.add_output(op(g, "mul", {x, n}, {}, f32({3})));
  PassContext ctx = apply(&fold_constants, g);
  EXPECT_EQ(rewrites(ctx, "constant_fold"), 2);
  EXPECT_EQ(count(g, "constant"), 1);
  const Node* c = out_node(g)->input(1)->node();
  ASSERT_TRUE(c->is_constant());
  EXPECT_EQ(std::get<double>(c->attr(0)), -6.0);
  EXPECT_EQ(c->output()->type(), f32({}));
}

TEST(Fold, IntegerAndWrappedResults) {
  if (!has_kernel("add")) GTEST_SKIP() << "add has no kernel yet";
  Graph g;
  Value* s = op(g, "add", {cint(g, 2), cint(g, 3)}, {int64_t{2}}, vt(kInt64, {}, true));
  g.add_output(s);
  PassContext ctx = apply(&fold_constants, g);
  EXPECT_EQ(rewrites(ctx, "constant_fold"), 1);
  const Node* c = out_node(g);
  ASSERT_TRUE(c->is_constant());
  EXPECT_EQ(std::get<int64_t>(c->attr(0)), 8);
  EXPECT_EQ(c->output()->type(), vt(kInt64, {}, true));
}

TEST(Fold, LeavesNonScalarsNonConstantsAndFailingKernels) {
  Graph g;
  Value* x = g.add_input(f32({3}));
  Value* x0 = g.add_input(f32({}));
  g.add_output(op(g, "mul", {x, cdouble(g, 2.0)}, {}, f32({3})));  // not 0-dim
  g.add_output(op(g, "mul", {x0, cdouble(g, 2.0)}, {}, f32({})));  // input not constant
  g.add_output(op(g, "remainder", {cint(g, 5), cint(g, 0)}, {}, vt(kInt64, {})));  // throws
  g.add_output(op(g, "dropout", {cdouble(g, 1.0), cdouble(g, 0.7)}, {0.5}, f32({})));
  PassContext ctx;
  EXPECT_FALSE(fold_constants(g, ctx));
  g.verify();
  EXPECT_EQ(count(g, "mul"), 2);
  EXPECT_EQ(count(g, "remainder"), 1);
  EXPECT_EQ(count(g, "dropout"), 1);
}

// ---------------------------------------------------------------------------------- canonicalize
TEST(Canonicalize, MulAndDivByOne) {
  Graph g;
  Value* x = g.add_input(f32({3}));
  g.add_output(op(g, "mul", {x, cint(g, 1)}, {}, f32({3})));
  g.add_output(op(g, "mul", {cdouble(g, 1.0), x}, {}, f32({3})));
  g.add_output(op(g, "div", {x, g.constant(AttrValue(1.0), kFloat32, false)}, {}, f32({3})));
  g.add_output(op(g, "mul", {x, g.constant(AttrValue(true), kBool)}, {}, f32({3})));
  PassContext ctx = apply(&canonicalize, g);
  EXPECT_EQ(rewrites(ctx, "mul_by_one"), 3);
  EXPECT_EQ(rewrites(ctx, "div_by_one"), 1);
  for (Value* o : g.outputs()) EXPECT_EQ(o, x);
  EXPECT_EQ(count(g, "mul") + count(g, "div"), 0);
}

TEST(Canonicalize, InexactOrTypeChangingRewritesDoNotFire) {
  Graph g;
  Value* x = g.add_input(f32({3}));
  Value* xi = g.add_input(vt(kInt64, {3}));
  Value* w = g.add_input(vt(kFloat64, {}, true));
  g.add_output(op(g, "add", {x, cint(g, 0)}, {int64_t{1}}, f32({3})));  // x + 0
  g.add_output(op(g, "sub", {x, x}, {int64_t{1}}, f32({3})));           // x - x
  g.add_output(op(g, "mul", {xi, cdouble(g, 1.0)}, {}, f32({3})));      // int * 1.0
  g.add_output(op(g, "div", {xi, cint(g, 1)}, {}, f32({3})));           // int / 1
  g.add_output(op(g, "mul", {w, cint(g, 1)}, {}, vt(kFloat64, {})));    // unwraps
  g.add_output(op(g, "mul", {x, cint(g, 2)}, {}, f32({3})));
  g.add_output(op(g, "mul", {x, g.constant(AttrValue(-0.0), kFloat64)}, {}, f32({3})));
  g.add_output(op(
      g, "transpose",
      {op(g, "transpose", {g.add_input(f32({2, 2, 2}))}, {int64_t{0}, int64_t{1}}, f32({2, 2, 2}))},
      {int64_t{0}, int64_t{1}}, f32({2, 2, 2})));
  const size_t before = g.size();
  PassContext ctx = apply(&canonicalize, g);
  // Only the last (a real transpose pair) may change.
  EXPECT_EQ(rewrites(ctx, "mul_by_one") + rewrites(ctx, "div_by_one"), 0);
  EXPECT_EQ(rewrites(ctx, "transpose_of_transpose"), 1);
  EXPECT_EQ(g.size(), before - 2);
  EXPECT_EQ(count(g, "add"), 1);
  EXPECT_EQ(count(g, "sub"), 1);
  EXPECT_EQ(count(g, "mul"), 4);
  EXPECT_EQ(count(g, "div"), 1);
}

TEST(Canonicalize, NegChainsReachTheFixpoint) {
  for (int depth = 1; depth <= 6; ++depth) {
    Graph g;
    Value* x = g.add_input(f32({3}));
    Value* v = x;
    for (int i = 0; i < depth; ++i) v = unary(g, "neg", v);
    g.add_output(v);
    PassContext ctx = apply(&canonicalize, g);
    EXPECT_EQ(rewrites(ctx, "double_neg"), depth / 2) << depth;
    EXPECT_EQ(count(g, "neg"), depth % 2) << depth;
    if (depth % 2 == 0) {
      EXPECT_EQ(g.outputs()[0], x);
    }
  }
}

TEST(Canonicalize, TransposePairs) {
  Graph g;
  Value* x = g.add_input(f32({2, 3, 4}));
  Value* t = op(g, "transpose", {x}, {int64_t{0}, int64_t{2}}, f32({4, 3, 2}));
  g.add_output(op(g, "transpose", {t}, {int64_t{0}, int64_t{2}}, f32({2, 3, 4})));
  g.add_output(op(g, "transpose", {t}, {int64_t{2}, int64_t{0}}, f32({2, 3, 4})));
  g.add_output(op(g, "transpose", {x}, {int64_t{1}, int64_t{1}}, f32({2, 3, 4})));
  PassContext ctx = apply(&canonicalize, g);
  EXPECT_EQ(rewrites(ctx, "transpose_of_transpose"), 2);
  EXPECT_EQ(rewrites(ctx, "identity_view"), 1);
  for (Value* o : g.outputs()) EXPECT_EQ(o, x);
  EXPECT_EQ(g.size(), 1u);
}

TEST(Canonicalize, PermuteChainsCompose) {
  Graph g;
  Value* x = g.add_input(f32({2, 3, 4, 5}));
  Value* a = op(g, "permute", {x}, {std::vector<int64_t>{1, 2, 3, 0}}, f32({3, 4, 5, 2}));
  Value* b = op(g, "transpose", {a}, {int64_t{0}, int64_t{3}}, f32({2, 4, 5, 3}));
  Value* c = op(g, "permute", {b}, {std::vector<int64_t>{1, 0, 2, 3}}, f32({4, 2, 5, 3}));
  g.add_output(c);
  PassContext ctx = apply(&canonicalize, g);
  EXPECT_EQ(rewrites(ctx, "permute_chain"), 2);
  EXPECT_EQ(count(g, "permute"), 1);
  EXPECT_EQ(count(g, "transpose"), 0);
  const Node* p = out_node(g);
  ASSERT_EQ(p->kind(), "permute");
  EXPECT_EQ(p->input(0), x);
  // a: out i reads x dim [1,2,3,0][i]; b swaps 0 and 3: [0,2,3,1]; c swaps 0 and 1: [2,0,3,1].
  EXPECT_EQ(std::get<std::vector<int64_t>>(p->attr(0)), (std::vector<int64_t>{2, 0, 3, 1}));
  EXPECT_EQ(p->output()->type(), f32({4, 2, 5, 3}));
}

TEST(Canonicalize, PermuteChainThatCancelsAndIdentityPermute) {
  Graph g;
  Value* x = g.add_input(f32({2, 3, 4}));
  Value* a = op(g, "permute", {x}, {std::vector<int64_t>{1, 2, 0}}, f32({3, 4, 2}));
  g.add_output(op(g, "permute", {a}, {std::vector<int64_t>{2, 0, 1}}, f32({2, 3, 4})));
  g.add_output(op(g, "permute", {x}, {std::vector<int64_t>{0, 1, 2}}, f32({2, 3, 4})));
  PassContext ctx = apply(&canonicalize, g);
  EXPECT_EQ(rewrites(ctx, "permute_chain"), 1);
  EXPECT_EQ(rewrites(ctx, "identity_view"), 1);
  EXPECT_EQ(g.outputs()[0], x);
  EXPECT_EQ(g.outputs()[1], x);
  EXPECT_EQ(g.size(), 1u);
}

TEST(Canonicalize, ReshapeChains) {
  Graph g;
  Value* x = g.add_input(f32({2, 6}));
  Value* r = op(g, "reshape", {x}, {std::vector<int64_t>{3, 4}}, f32({3, 4}));
  Value* v = op(g, "view", {r}, {std::vector<int64_t>{12}}, f32({12}));
  g.add_output(op(g, "view", {v}, {std::vector<int64_t>{4, 3}}, f32({4, 3})));
  Value* v1 = op(g, "view", {x}, {std::vector<int64_t>{12}}, f32({12}));
  g.add_output(op(g, "view", {v1}, {std::vector<int64_t>{6, 2}}, f32({6, 2})));
  PassContext ctx = apply(&canonicalize, g);
  EXPECT_EQ(rewrites(ctx, "reshape_chain"), 3);
  const Node* a = g.outputs()[0]->node();
  EXPECT_EQ(a->kind(), "reshape");  // a reshape in the chain: no promise of a view
  EXPECT_EQ(a->input(0), x);
  EXPECT_EQ(std::get<std::vector<int64_t>>(a->attr(0)), (std::vector<int64_t>{4, 3}));
  const Node* b = g.outputs()[1]->node();
  EXPECT_EQ(b->kind(), "view");
  EXPECT_EQ(b->input(0), x);
  EXPECT_EQ(g.size(), 3u);
}

TEST(Canonicalize, RulesRetryTheNodesTheyCreate) {
  // reshape(reshape(x, [3, 4]), [2, 6]) becomes reshape(x, [2, 6]), which is x itself: the second
  // rule fires on the node the first one made.
  Graph g;
  Value* x = g.add_input(f32({2, 6}));
  Value* r = op(g, "reshape", {x}, {std::vector<int64_t>{3, 4}}, f32({3, 4}));
  Value* r2 = op(g, "reshape", {r}, {std::vector<int64_t>{2, 6}}, f32({2, 6}));
  // neg(neg(pow(neg(neg(r2)), 1))): every layer only cancels once the one inside it has.
  Value* v = unary(g, "neg", unary(g, "neg", r2));
  v = op(g, "pow", {v, cint(g, 1)}, {}, f32({2, 6}));
  g.add_output(unary(g, "neg", unary(g, "neg", v)));
  PassContext ctx = apply(&canonicalize, g);
  EXPECT_EQ(rewrites(ctx, "reshape_chain"), 1);
  EXPECT_EQ(rewrites(ctx, "identity_view"), 1);
  EXPECT_EQ(rewrites(ctx, "double_neg"), 2);
  EXPECT_EQ(rewrites(ctx, "pow_one"), 1);
  EXPECT_EQ(g.outputs()[0], x);
  EXPECT_EQ(g.size(), 1u);
}

TEST(Canonicalize, IdentityViewsAndExpandChains) {
  Graph g;
  Value* x = g.add_input(f32({1, 3}));
  g.add_output(op(g, "reshape", {x}, {std::vector<int64_t>{1, 3}}, f32({1, 3})));
  g.add_output(op(g, "expand", {x}, {std::vector<int64_t>{1, 3}}, f32({1, 3})));
  g.add_output(op(g, "slice", {x}, {int64_t{1}, int64_t{0}, int64_t{3}, int64_t{1}}, f32({1, 3})));
  Value* e = op(g, "expand", {x}, {std::vector<int64_t>{4, 3}}, f32({4, 3}));
  Value* u = op(g, "unsqueeze", {e}, {int64_t{0}}, f32({1, 4, 3}));
  Value* e2 = op(g, "expand", {u}, {std::vector<int64_t>{2, 4, 3}}, f32({2, 4, 3}));
  g.add_output(op(g, "expand", {e2}, {std::vector<int64_t>{5, 2, 4, 3}}, f32({5, 2, 4, 3})));
  Value* e3 = op(g, "expand", {x}, {std::vector<int64_t>{2, 3}}, f32({2, 3}));
  g.add_output(op(g, "expand", {e3}, {std::vector<int64_t>{7, 2, 3}}, f32({7, 2, 3})));
  Value* sq = op(g, "unsqueeze", {x}, {int64_t{2}}, f32({1, 3, 1}));
  g.add_output(op(g, "squeeze", {sq}, {int64_t{2}}, f32({1, 3})));
  g.add_output(op(g, "slice", {x}, {int64_t{1}, int64_t{1}, int64_t{3}, int64_t{1}}, f32({1, 2})));
  PassContext ctx = apply(&canonicalize, g);
  EXPECT_EQ(rewrites(ctx, "identity_view"), 3);
  EXPECT_EQ(rewrites(ctx, "expand_chain"), 2);
  EXPECT_EQ(rewrites(ctx, "squeeze_of_unsqueeze"), 1);
  for (int i : {0, 1, 2, 5}) EXPECT_EQ(g.outputs()[i], x) << i;
  const Node* ex = g.outputs()[4]->node();
  EXPECT_EQ(ex->kind(), "expand");
  EXPECT_EQ(ex->input(0), x);
  EXPECT_EQ(g.outputs()[6]->node()->kind(), "slice");
}

// The muls that pow(x, c) became, as a map from each mul to its operands, checked against the
// squaring sequence evaluated on a symbolic "power of x".
int64_t power_of(const Value* v, const Value* x) {
  std::vector<const Value*> stack{v};
  // Iterative evaluation: powers of x multiply, so the exponent is the sum over the leaves.
  int64_t total = 0;
  while (!stack.empty()) {
    const Value* cur = stack.back();
    stack.pop_back();
    if (cur == x) {
      ++total;
      continue;
    }
    EXPECT_EQ(cur->node()->kind(), "mul");
    stack.push_back(cur->node()->input(0));
    stack.push_back(cur->node()->input(1));
  }
  return total;
}

TEST(Canonicalize, PowBySquaring) {
  struct Case {
    int64_t c;
    int64_t muls;
  };
  for (Case k : std::vector<Case>{{2, 1}, {3, 2}, {8, 3}, {7, 4}, {64, 6}, {-1, 0}, {-3, 2}}) {
    Graph g;
    Value* x = g.add_input(f32({5}));
    g.add_output(op(g, "pow", {x, cint(g, k.c)}, {}, f32({5})));
    PassContext ctx = apply(&canonicalize, g);
    EXPECT_EQ(rewrites(ctx, "pow_by_squaring"), 1) << k.c;
    EXPECT_EQ(count(g, "mul"), k.muls) << k.c;
    EXPECT_EQ(count(g, "pow"), 0);
    const Value* r = g.outputs()[0];
    if (k.c < 0) {
      ASSERT_EQ(r->node()->kind(), "reciprocal");
      r = r->node()->input(0);
    }
    EXPECT_EQ(power_of(r, x), std::abs(k.c)) << k.c;
  }
}

TEST(Canonicalize, PowSpecialExponentsAndNonRules) {
  Graph g;
  Value* x = g.add_input(f32({5}));
  Value* xd = g.add_input(vt(kFloat64, {5}));
  Value* xi = g.add_input(vt(kInt64, {5}));
  g.add_output(op(g, "pow", {x, cdouble(g, 1.0)}, {}, f32({5})));
  g.add_output(op(g, "pow", {x, cdouble(g, 0.5)}, {}, f32({5})));
  g.add_output(op(g, "pow", {xd, cdouble(g, -0.5)}, {}, vt(kFloat64, {5})));
  g.add_output(op(g, "pow", {xd, cdouble(g, 4.0)}, {}, vt(kFloat64, {5})));
  const size_t kept = 4;
  g.add_output(op(g, "pow", {x, cdouble(g, 2.5)}, {}, f32({5})));
  g.add_output(op(g, "pow", {x, cint(g, 65)}, {}, f32({5})));
  g.add_output(op(g, "pow", {x, cint(g, 0)}, {}, f32({5})));
  g.add_output(op(g, "pow", {xi, cint(g, 2)}, {}, vt(kInt64, {5})));
  g.add_output(op(g, "pow", {x, x}, {}, f32({5})));
  g.add_output(op(g, "pow", {x, g.constant(AttrValue(2.0), kFloat64, false)}, {}, f32({5})));
  PassContext ctx = apply(&canonicalize, g);
  EXPECT_EQ(rewrites(ctx, "pow_one"), 1);
  EXPECT_EQ(rewrites(ctx, "pow_half_to_sqrt"), 1);
  EXPECT_EQ(rewrites(ctx, "pow_neg_half_to_rsqrt"), 1);
  EXPECT_EQ(rewrites(ctx, "pow_by_squaring"), 2);  // xd ** 4.0 and x ** f64 tensor 2.0
  EXPECT_EQ(g.outputs()[0], x);
  EXPECT_EQ(g.outputs()[1]->node()->kind(), "sqrt");
  EXPECT_EQ(g.outputs()[2]->node()->kind(), "rsqrt");
  EXPECT_EQ(g.outputs()[3]->node()->kind(), "mul");
  for (size_t i = kept; i < kept + 5; ++i) EXPECT_EQ(g.outputs()[i]->node()->kind(), "pow") << i;
}

// ------------------------------------------------------------------------------------- stabilize
TEST(Stabilize, Log1pBothOrders) {
  Graph g;
  Value* x = g.add_input(f32({3}));
  g.add_output(unary(g, "log", op(g, "add", {x, cint(g, 1)}, {int64_t{1}}, f32({3}))));
  g.add_output(unary(g, "log", op(g, "add", {cdouble(g, 1.0), x}, {1.0}, f32({3}))));
  // Not log(x + 1): alpha 2, or a constant 2.
  g.add_output(unary(g, "log", op(g, "add", {x, cint(g, 1)}, {int64_t{2}}, f32({3}))));
  g.add_output(unary(g, "log", op(g, "add", {x, cint(g, 2)}, {int64_t{1}}, f32({3}))));
  // An integer x: log's result is float, log1p(x)'s type would not be x's.
  Value* xi = g.add_input(vt(kInt64, {3}));
  g.add_output(
      op(g, "log", {op(g, "add", {xi, cint(g, 1)}, {int64_t{1}}, vt(kInt64, {3}))}, {}, f32({3})));
  PassContext ctx = apply(&stabilize, g);
  EXPECT_EQ(rewrites(ctx, "log1p"), 2);
  for (int i : {0, 1}) {
    EXPECT_EQ(g.outputs()[i]->node()->kind(), "log1p");
    EXPECT_EQ(g.outputs()[i]->node()->input(0), x);
  }
  for (int i : {2, 3, 4}) EXPECT_EQ(g.outputs()[i]->node()->kind(), "log");
}

TEST(Stabilize, Expm1LogSoftmaxLogSigmoid) {
  Graph g;
  Value* x = g.add_input(f32({2, 3}));
  g.add_output(op(g, "sub", {unary(g, "exp", x), cint(g, 1)}, {int64_t{1}}, f32({2, 3})));
  g.add_output(op(g, "sub", {unary(g, "exp", x), cint(g, 1)}, {int64_t{2}}, f32({2, 3})));
  g.add_output(unary(g, "log", op(g, "softmax", {x}, {int64_t{1}}, f32({2, 3}))));
  g.add_output(unary(g, "log", unary(g, "sigmoid", x)));
  PassContext ctx = apply(&stabilize, g);
  EXPECT_EQ(rewrites(ctx, "expm1"), 1);
  EXPECT_EQ(rewrites(ctx, "log_softmax"), 1);
  EXPECT_EQ(rewrites(ctx, "log_sigmoid"), 1);
  EXPECT_EQ(g.outputs()[0]->node()->kind(), "expm1");
  EXPECT_EQ(g.outputs()[1]->node()->kind(), "sub");
  const Node* ls = g.outputs()[2]->node();
  EXPECT_EQ(ls->kind(), "log_softmax");
  EXPECT_EQ(std::get<int64_t>(ls->attr(0)), 1);
  const Node* n = g.outputs()[3]->node();
  ASSERT_EQ(n->kind(), "neg");
  const Node* sp = n->input(0)->node();
  ASSERT_EQ(sp->kind(), "softplus");
  EXPECT_EQ(std::get<double>(sp->attr(0)), 1.0);
  EXPECT_EQ(std::get<double>(sp->attr(1)), 20.0);
  EXPECT_EQ(sp->input(0)->node()->kind(), "neg");
  EXPECT_EQ(sp->input(0)->node()->input(0), x);
  EXPECT_EQ(count(g, "sigmoid") + count(g, "softmax") + count(g, "log"), 0);
}

TEST(Stabilize, Logsumexp) {
  Graph g;
  Value* x = g.add_input(f32({2, 3}));
  Value* e = unary(g, "exp", x);
  g.add_output(unary(
      g, "log", op(g, "sum", {e}, {std::vector<int64_t>{}, false, std::monostate{}}, f32({}))));
  g.add_output(
      unary(g, "log",
            op(g, "sum", {e}, {std::vector<int64_t>{-1}, true, std::monostate{}}, f32({2, 1}))));
  // An accumulation dtype: not the same computation.
  g.add_output(unary(
      g, "log", op(g, "sum", {e}, {std::vector<int64_t>{1}, false, kFloat64}, vt(kFloat64, {2}))));
  PassContext ctx = apply(&stabilize, g);
  EXPECT_EQ(rewrites(ctx, "logsumexp"), 2);
  const Node* a = g.outputs()[0]->node();
  ASSERT_EQ(a->kind(), "logsumexp");
  EXPECT_EQ(a->input(0), x);
  EXPECT_EQ(std::get<std::vector<int64_t>>(a->attr(0)), (std::vector<int64_t>{0, 1}));
  EXPECT_FALSE(std::get<bool>(a->attr(1)));
  const Node* b = g.outputs()[1]->node();
  ASSERT_EQ(b->kind(), "logsumexp");
  EXPECT_EQ(std::get<std::vector<int64_t>>(b->attr(0)), (std::vector<int64_t>{1}));
  EXPECT_TRUE(std::get<bool>(b->attr(1)));
  EXPECT_EQ(b->output()->type(), f32({2, 1}));
  EXPECT_EQ(g.outputs()[2]->node()->kind(), "log");
}

TEST(Stabilize, Softmax) {
  Graph g;
  Value* x = g.add_input(f32({2, 3}));
  Value* e = unary(g, "exp", x);
  Value* s = op(g, "sum", {e}, {std::vector<int64_t>{1}, true, std::monostate{}}, f32({2, 1}));
  g.add_output(op(g, "div", {e, s}, {}, f32({2, 3})));
  // Two equal exps (as before CSE) also match.
  Value* e2 = unary(g, "exp", x);
  Value* s2 = op(g, "sum", {e2}, {std::vector<int64_t>{0}, true, std::monostate{}}, f32({1, 3}));
  g.add_output(op(g, "div", {unary(g, "exp", x), s2}, {}, f32({2, 3})));
  // keepdim false cannot broadcast back like softmax; exps of different values are not softmax.
  Value* s3 = op(g, "sum", {e}, {std::vector<int64_t>{0}, false, std::monostate{}}, f32({3}));
  g.add_output(op(g, "div", {e, s3}, {}, f32({2, 3})));
  Value* y = g.add_input(f32({2, 3}));
  g.add_output(op(g, "div", {unary(g, "exp", y), s}, {}, f32({2, 3})));
  PassContext ctx = apply(&stabilize, g);
  EXPECT_EQ(rewrites(ctx, "softmax"), 2);
  const Node* a = g.outputs()[0]->node();
  ASSERT_EQ(a->kind(), "softmax");
  EXPECT_EQ(std::get<int64_t>(a->attr(0)), 1);
  const Node* b = g.outputs()[1]->node();
  ASSERT_EQ(b->kind(), "softmax");
  EXPECT_EQ(std::get<int64_t>(b->attr(0)), 0);
  EXPECT_EQ(g.outputs()[2]->node()->kind(), "div");
  EXPECT_EQ(g.outputs()[3]->node()->kind(), "div");
}

TEST(Stabilize, SoftmaxOfAMaxShiftedValueReadsTheValue) {
  // exp(x - amax(x)) / sum(...) -> softmax(x): softmax shifts by the row's max itself; a shift
  // by the max along another dim stays.
  Graph g;
  Value* x = g.add_input(f32({2, 3}));
  auto shifted_softmax = [&](int64_t max_dim, int64_t dim) {
    Shape kept{2, 3};
    kept[static_cast<size_t>(max_dim)] = 1;
    Value* m = op(g, "amax", {x}, {std::vector<int64_t>{max_dim}, true}, f32(kept));
    Value* e = unary(g, "exp", op(g, "sub", {x, m}, {1.0}, f32({2, 3})));
    Shape summed{2, 3};
    summed[static_cast<size_t>(dim)] = 1;
    Value* s = op(g, "sum", {e}, {std::vector<int64_t>{dim}, true, std::monostate{}}, f32(summed));
    g.add_output(op(g, "div", {e, s}, {}, f32({2, 3})));
  };
  shifted_softmax(1, 1);
  shifted_softmax(0, 1);
  PassContext ctx = apply(&stabilize, g);
  EXPECT_EQ(rewrites(ctx, "softmax"), 2);
  const Node* a = g.outputs()[0]->node();
  ASSERT_EQ(a->kind(), "softmax");
  EXPECT_EQ(a->input(0), x);
  const Node* b = g.outputs()[1]->node();
  ASSERT_EQ(b->kind(), "softmax");
  EXPECT_EQ(b->input(0)->node()->kind(), "sub");
}

TEST(Stabilize, ExposedPatternsAreRewrittenToo) {
  // log(exp(x) / sum(exp(x))) -> log(softmax(x)) -> log_softmax(x), in one run.
  Graph g;
  Value* x = g.add_input(f32({4, 5}));
  Value* e = unary(g, "exp", x);
  Value* s = op(g, "sum", {e}, {std::vector<int64_t>{1}, true, std::monostate{}}, f32({4, 1}));
  g.add_output(unary(g, "log", op(g, "div", {e, s}, {}, f32({4, 5}))));
  PassContext ctx = apply(&stabilize, g);
  EXPECT_EQ(rewrites(ctx, "softmax"), 1);
  EXPECT_EQ(rewrites(ctx, "log_softmax"), 1);
  EXPECT_EQ(out_node(g)->kind(), "log_softmax");
  EXPECT_EQ(g.size(), 2u);
}

// ------------------------------------------------------------------------------------ gemm_bias
TEST(GemmBias, AddOfAProductFoldsIntoAddmm) {
  Graph g;
  Value* a = g.add_input(f32({4, 5}));
  Value* b = g.add_input(f32({5, 3}));
  Value* bias = g.add_input(f32({3}));
  // mm(a, b) + bias and bias + matmul(a, b) fold; alpha != 1, a product read twice, and a bias
  // of another dtype do not.
  g.add_output(op(g, "add", {op(g, "mm", {a, b}, {}, f32({4, 3})), bias}, {1.0}, f32({4, 3})));
  g.add_output(op(g, "add", {bias, op(g, "matmul", {a, b}, {}, f32({4, 3}))}, {1.0}, f32({4, 3})));
  g.add_output(op(g, "add", {op(g, "mm", {a, b}, {}, f32({4, 3})), bias}, {2.0}, f32({4, 3})));
  Value* twice = op(g, "mm", {a, b}, {}, f32({4, 3}));
  g.add_output(op(g, "add", {twice, bias}, {1.0}, f32({4, 3})));
  g.add_output(twice);
  Value* f64_bias = g.add_input(ValueType{kFloat64, {3}});
  g.add_output(op(g, "add", {op(g, "mm", {a, b}, {}, f32({4, 3})), f64_bias}, {1.0},
                  ValueType{kFloat64, {4, 3}}));
  PassContext ctx = apply(&fold_gemm_bias, g);
  EXPECT_EQ(rewrites(ctx, "bias folded into the GEMM"), 2);
  for (size_t i = 0; i < 2; ++i) {
    const Node* n = g.outputs()[i]->node();
    ASSERT_EQ(n->kind(), "addmm");
    EXPECT_EQ(n->input(0), bias);
    EXPECT_EQ(n->input(1), a);
    EXPECT_EQ(n->input(2), b);
  }
  for (size_t i : {2, 3, 5}) EXPECT_EQ(g.outputs()[i]->node()->kind(), "add") << "output " << i;
}

// ------------------------------------------------------------------------------------- manager
TEST(PassManager, FixedOrder) {
  std::vector<std::string> names;
  for (const PassInfo& p : all_passes()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"dce", "cse", "fold", "canonicalize", "stabilize",
                                             "transfers", "gemm_bias", "conv_fold", "dce",
                                             "push_views", "sink_views"}));
}

Graph* neg_neg_graph(Graph& g) {
  Value* x = g.add_input(f32({3}));
  g.add_output(unary(g, "neg", unary(g, "neg", x)));
  unary(g, "exp", x);  // dead
  return &g;
}

TEST(PassManager, DisabledPassesAreSkipped) {
  set_disabled_passes({"canonicalize"});
  EXPECT_TRUE(pass_disabled("canonicalize"));
  EXPECT_FALSE(pass_disabled("dce"));
  {
    Graph g;
    neg_neg_graph(g);
    run_passes(g);
    EXPECT_EQ(count(g, "neg"), 2);
    EXPECT_EQ(count(g, "exp"), 0);
  }
  set_disabled_passes({"all"});
  {
    Graph g;
    neg_neg_graph(g);
    run_passes(g);
    EXPECT_EQ(g.size(), 4u);
  }
  set_disabled_passes({});
  {
    Graph g;
    neg_neg_graph(g);
    run_passes(g);
    EXPECT_EQ(g.size(), 1u);
  }
  EXPECT_THROW(set_disabled_passes({"no_such_pass"}), Error);
}

// The environment is read once per process, so these run in a fresh child process.
TEST(PassManagerDeathTest, EnvironmentSwitches) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("KILN_DISABLE_PASSES", " cse,stabilize ", 1);
        setenv("KILN_VERIFY", "1", 1);
        bool ok = pass_disabled("cse") && pass_disabled("stabilize") && !pass_disabled("dce") &&
                  verify_passes();
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(  // an unknown pass is an error that lists the passes
      {
        setenv("KILN_DISABLE_PASSES", "cse,bogus", 1);
        try {
          pass_disabled("cse");
        } catch (const Error& e) {
          std::fprintf(stderr, "%s\n", e.what());
          std::exit(0);
        }
        std::exit(1);
      },
      ::testing::ExitedWithCode(0), "names 'bogus'.*stabilize");
  EXPECT_EXIT(
      {
        setenv("KILN_VERIFY", "0", 1);
        std::exit(verify_passes() ? 1 : 0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(PassManager, VerificationNamesTheCulprit) {
  Graph g;
  Value* x = g.add_input(f32({3}));
  Value* a = unary(g, "exp", x);
  Value* b = unary(g, "neg", a);
  g.add_output(b);
  g.move_before(b->node(), a->node());  // b now reads a before it is defined
  set_disabled_passes({});
  set_verify_passes(true);
  EXPECT_TRUE(verify_passes());
  testing::expect_error([&] { run_passes(g); }, {"before the passes", "before it is defined"});
}

TEST(PassManager, ProfileCountsRunsNodesAndRewrites) {
  set_disabled_passes({});
  set_verify_passes(true);
  reset_pass_profile();
  for (int i = 0; i < 2; ++i) {
    Graph g;
    neg_neg_graph(g);  // 4 nodes: x, neg, neg, dead exp
    run_passes(g);
    EXPECT_EQ(g.size(), 1u);
  }
  std::vector<PassProfileEntry> profile = pass_profile();
  ASSERT_EQ(profile.size(), 10u);  // the distinct passes of all_passes()
  for (const PassProfileEntry& e : profile) {
    EXPECT_EQ(e.runs, e.pass == "dce" ? 4 : 2) << e.pass;
    EXPECT_GE(e.seconds, 0.0);
    if (e.pass == "canonicalize") {
      EXPECT_EQ(e.nodes_before, 6);
      EXPECT_EQ(e.nodes_after, 2);
      EXPECT_EQ(e.rewrites.at("double_neg"), 2);
    }
    if (e.pass == "dce") {
      EXPECT_EQ(e.nodes_before, 2 * (4 + 1));
      EXPECT_EQ(e.nodes_after, 2 * (3 + 1));
      EXPECT_EQ(e.rewrites.at("dead_node"), 2);
    }
  }
  reset_pass_profile();
  for (const PassProfileEntry& e : pass_profile()) {
    EXPECT_EQ(e.runs, 0);
    EXPECT_TRUE(e.rewrites.empty());
  }
}

// -------------------------------------------------------------------------------------- accuracy
// Skips a test whose graph uses an op without a reference kernel yet.
bool runnable(const Graph& g, std::string* missing) {
  for (const Node* n = g.first(); n; n = n->next())
    if (!n->is_input() && !n->is_constant() && !n->op().invoke) {
      *missing = n->kind();
      return false;
    }
  return true;
}

#define SKIP_UNLESS_RUNNABLE(g)                                                    \
  do {                                                                             \
    std::string missing_op;                                                        \
    if (!runnable(g, &missing_op)) GTEST_SKIP() << missing_op << " has no kernel"; \
  } while (0)

std::vector<float> run1(const Graph& g, const std::vector<Tensor>& inputs, size_t output = 0) {
  return run_graph(g, inputs).at(output).contiguous().to_vector<float>();
}

// Runs `build`'s graph on `inputs` before and after `pass`; returns (before, after).
template <typename Build>
std::pair<std::vector<float>, std::vector<float>> before_after(Build build, Pass pass,
                                                               const std::vector<Tensor>& inputs,
                                                               int64_t* fired = nullptr) {
  Graph g;
  build(g);
  std::vector<float> before = run1(g, inputs);
  PassContext ctx = apply(pass, g);
  if (fired) {
    *fired = 0;
    for (const auto& [rule, n] : ctx.rewrites) *fired += n;
  }
  return {before, run1(g, inputs)};
}

TEST(Accuracy, Log1pOfTinyValues) {
  auto build = [](Graph& g) {
    Value* x = g.add_input(f32({2}));
    g.add_output(unary(g, "log", op(g, "add", {x, cint(g, 1)}, {int64_t{1}}, f32({2}))));
  };
  Graph probe;
  build(probe);
  SKIP_UNLESS_RUNNABLE(probe);
  int64_t fired = 0;
  auto [before, after] =
      before_after(build, &stabilize, {from_vector<float>({1e-10f, -3e-9f})}, &fired);
  EXPECT_EQ(fired, 1);
  EXPECT_EQ(before[0], 0.0f);  // 1 + 1e-10 rounds to 1
  EXPECT_EQ(after[0], std::log1p(1e-10f));
  EXPECT_EQ(after[1], std::log1p(-3e-9f));
}

TEST(Accuracy, Expm1OfTinyValues) {
  auto build = [](Graph& g) {
    Value* x = g.add_input(f32({2}));
    g.add_output(op(g, "sub", {unary(g, "exp", x), cint(g, 1)}, {int64_t{1}}, f32({2})));
  };
  Graph probe;
  build(probe);
  SKIP_UNLESS_RUNNABLE(probe);
  auto [before, after] = before_after(build, &stabilize, {from_vector<float>({1e-10f, 2e-8f})});
  EXPECT_EQ(before[0], 0.0f);
  EXPECT_EQ(after[0], std::expm1(1e-10f));
  EXPECT_EQ(after[1], std::expm1(2e-8f));
}

TEST(Accuracy, LogSigmoidOfVeryNegativeValues) {
  auto build = [](Graph& g) {
    Value* x = g.add_input(f32({3}));
    g.add_output(unary(g, "log", unary(g, "sigmoid", x)));
  };
  Graph probe;
  build(probe);
  SKIP_UNLESS_RUNNABLE(probe);
  auto [before, after] = before_after(build, &stabilize, {from_vector<float>({-200, 0, 30})});
  EXPECT_TRUE(std::isinf(before[0]));
  EXPECT_EQ(after[0], -200.0f);
  EXPECT_NEAR(after[1], -std::log(2.0f), 1e-6);
  EXPECT_NEAR(after[2], 0.0f, 1e-6);
}

TEST(Accuracy, LogsumexpOfLargeValues) {
  auto build = [](Graph& g) {
    Value* x = g.add_input(f32({2, 2}));
    Value* s = op(g, "sum", {unary(g, "exp", x)},
                  {std::vector<int64_t>{1}, false, std::monostate{}}, f32({2}));
    g.add_output(unary(g, "log", s));
  };
  Graph probe;
  build(probe);
  SKIP_UNLESS_RUNNABLE(probe);
  auto [before, after] =
      before_after(build, &stabilize, {from_vector<float>({1000, 1000, 1, 2}, Shape{2, 2})});
  EXPECT_TRUE(std::isinf(before[0]));
  EXPECT_NEAR(after[0], 1000.0f + std::log(2.0f), 1e-3);
  EXPECT_NEAR(after[1], 2.0f + std::log1p(std::exp(-1.0f)), 1e-5);
}

TEST(Accuracy, SoftmaxAndLogSoftmaxOfLargeLogits) {
  auto build = [](Graph& g) {
    Value* x = g.add_input(f32({1, 3}));
    Value* e = unary(g, "exp", x);
    Value* s = op(g, "sum", {e}, {std::vector<int64_t>{1}, true, std::monostate{}}, f32({1, 1}));
    g.add_output(op(g, "div", {e, s}, {}, f32({1, 3})));
  };
  Graph probe;
  build(probe);
  SKIP_UNLESS_RUNNABLE(probe);
  Tensor logits = from_vector<float>({1000, 999, 0}, Shape{1, 3});
  auto [before, after] = before_after(build, &stabilize, {logits});
  EXPECT_TRUE(std::isnan(before[0]));
  float z = 1 + std::exp(-1.0f);
  EXPECT_NEAR(after[0], 1 / z, 1e-6);
  EXPECT_NEAR(after[1], std::exp(-1.0f) / z, 1e-6);
  EXPECT_EQ(after[2], 0.0f);

  auto build_log = [](Graph& g) {
    Value* x = g.add_input(f32({1, 3}));
    g.add_output(unary(g, "log", op(g, "softmax", {x}, {int64_t{1}}, f32({1, 3}))));
  };
  Graph probe_log;
  build_log(probe_log);
  SKIP_UNLESS_RUNNABLE(probe_log);
  auto [lb, la] = before_after(build_log, &stabilize, {logits});
  EXPECT_TRUE(std::isinf(lb[2]));
  EXPECT_NEAR(la[2], -1000.0f - std::log(z), 1e-3);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every canonicalize rule on random data: the rewritten graph gives the same bits.
TEST(Differential, CanonicalizeIsBitExact) {
  auto build = [](Graph& g) {
    Value* x = g.add_input(f32({3, 4}));
    Value* v = op(g, "mul", {x, cint(g, 1)}, {}, f32({3, 4}));
    v = op(g, "div", {v, cdouble(g, 1.0)}, {}, f32({3, 4}));
    v = unary(g, "neg", unary(g, "neg", v));
    v = op(g, "transpose", {v}, {int64_t{0}, int64_t{1}}, f32({4, 3}));
    v = op(g, "permute", {v}, {std::vector<int64_t>{1, 0}}, f32({3, 4}));
    v = op(g, "reshape", {v}, {std::vector<int64_t>{2, 6}}, f32({2, 6}));
    v = op(g, "view", {v}, {std::vector<int64_t>{12}}, f32({12}));
    v = op(g, "reshape", {v}, {std::vector<int64_t>{1, 12}}, f32({1, 12}));
    v = op(g, "expand", {v}, {std::vector<int64_t>{2, 12}}, f32({2, 12}));
    v = op(g, "expand", {v}, {std::vector<int64_t>{3, 2, 12}}, f32({3, 2, 12}));
    v = op(g, "transpose", {v}, {int64_t{0}, int64_t{2}}, f32({12, 2, 3}));
    v = op(g, "transpose", {v}, {int64_t{1}, int64_t{2}}, f32({12, 3, 2}));
    Value* p = op(g, "pow", {v, cint(g, 7)}, {}, f32({12, 3, 2}));
    p = op(g, "pow", {p, cdouble(g, -0.5)}, {}, f32({12, 3, 2}));
    g.add_output(op(g, "add", {v, op(g, "pow", {p, cdouble(g, -3.0)}, {}, f32({12, 3, 2}))},
                    {int64_t{1}}, f32({12, 3, 2})));
  };
  Graph probe;
  build(probe);
  SKIP_UNLESS_RUNNABLE(probe);
  Tensor x = testing::random_tensor({3, 4}, kFloat32, 0.0, 3.0);
  int64_t fired = 0;
  auto [before, after] = before_after(build, &canonicalize, {x}, &fired);
  EXPECT_GE(fired, 10);
  EXPECT_TRUE(same_bits(before, after));
}

// pow by squaring: the rewritten graph computes exactly the documented multiplication sequence.
TEST(Differential, PowBySquaringSequence) {
  std::vector<float> xs = {0.5f, 1.1f, -1.3f, 3.7f, 1e-3f, -0.0f, 1e10f, -2.5f};
  Tensor x = from_vector<float>(xs);
  for (int64_t c : {2, 3, 5, 7, 8, 13, 64, -1, -2, -7}) {
    auto build = [c](Graph& g) {
      Value* in = g.add_input(f32({8}));
      g.add_output(op(g, "pow", {in, cint(g, c)}, {}, f32({8})));
    };
    Graph g;
    build(g);
    apply(&canonicalize, g);
    SKIP_UNLESS_RUNNABLE(g);
    std::vector<float> got = run1(g, {x});
    std::vector<float> want;
    for (float v : xs) {
      float result = 0, base = v;
      bool have = false;
      for (uint64_t m = static_cast<uint64_t>(std::abs(c)); m;) {
        if (m & 1) {
          result = have ? result * base : base;
          have = true;
        }
        m >>= 1;
        if (m) base = base * base;
      }
      want.push_back(c < 0 ? 1.0f / result : result);
    }
    EXPECT_TRUE(same_bits(got, want)) << "c = " << c;
    // The eager pow kernel runs the same sequence, so the unrewritten graph agrees bit for bit.
    Graph orig;
    build(orig);
    SKIP_UNLESS_RUNNABLE(orig);
    EXPECT_TRUE(same_bits(got, run1(orig, {x}))) << "c = " << c;
  }
}

// pow(x, +-0.5) -> sqrt / rsqrt, as the eager kernel computes them: bit for bit, -0 and inf
// included.
TEST(Differential, PowHalf) {
  for (double c : {0.5, -0.5}) {
    auto build = [c](Graph& g) {
      Value* in = g.add_input(f32({8}));
      g.add_output(op(g, "pow", {in, cdouble(g, c)}, {}, f32({8})));
    };
    Graph probe;
    build(probe);
    SKIP_UNLESS_RUNNABLE(probe);
    const float inf = std::numeric_limits<float>::infinity();
    Tensor x = from_vector<float>({0.25f, 1, 2, 3.5f, 1e-20f, 7e30f, -0.0f, inf});
    int64_t fired = 0;
    auto [before, after] = before_after(build, &canonicalize, {x}, &fired);
    EXPECT_EQ(fired, 1);
    EXPECT_TRUE(same_bits(before, after)) << c;
  }
}

TEST(Differential, StabilizeAgreesOnOrdinaryValues) {
  auto build = [](Graph& g) {
    Value* x = g.add_input(f32({4, 5}));
    Value* e = unary(g, "exp", x);
    Value* s = op(g, "sum", {e}, {std::vector<int64_t>{1}, true, std::monostate{}}, f32({4, 1}));
    Value* sm = op(g, "div", {e, s}, {}, f32({4, 5}));
    Value* l1 = unary(g, "log", op(g, "add", {sm, cint(g, 1)}, {int64_t{1}}, f32({4, 5})));
    Value* em = op(g, "sub", {unary(g, "exp", l1), cint(g, 1)}, {int64_t{1}}, f32({4, 5}));
    Value* ls = unary(g, "log", unary(g, "sigmoid", em));
    Value* lse = unary(g, "log",
                       op(g, "sum", {unary(g, "exp", ls)},
                          {std::vector<int64_t>{1}, true, std::monostate{}}, f32({4, 1})));
    g.add_output(op(g, "add", {unary(g, "log", sm), lse}, {int64_t{1}}, f32({4, 5})));
  };
  Graph probe;
  build(probe);
  SKIP_UNLESS_RUNNABLE(probe);
  Tensor x = testing::random_tensor({4, 5}, kFloat32, -3.0, 3.0);
  int64_t fired = 0;
  auto [before, after] = before_after(build, &stabilize, {x}, &fired);
  EXPECT_EQ(fired, 6);
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_NEAR(after[i], before[i], 1e-5 + 1e-5 * std::abs(before[i])) << i;
}

TEST(Differential, RunPassesPreservesResults) {
  auto build = [](Graph& g) {
    Value* x = g.add_input(f32({3, 4}));
    Value* two = op(g, "mul", {cdouble(g, 1.0), cdouble(g, 2.0)}, {}, f32({}));
    Value* a = op(g, "mul", {x, two}, {}, f32({3, 4}));
    Value* b = op(g, "mul", {x, two}, {}, f32({3, 4}));
    Value* t = op(g, "transpose", {op(g, "transpose", {a}, {int64_t{0}, int64_t{1}}, f32({4, 3}))},
                  {int64_t{1}, int64_t{0}}, f32({3, 4}));
    unary(g, "exp", b);  // dead
    g.add_output(op(g, "add", {t, unary(g, "neg", unary(g, "neg", b))}, {int64_t{1}}, f32({3, 4})));
  };
  Graph probe;
  build(probe);
  SKIP_UNLESS_RUNNABLE(probe);
  set_disabled_passes({});
  Graph g;
  build(g);
  Tensor x = testing::random_tensor({3, 4});
  std::vector<float> before = run1(g, {x});
  run_passes(g);
  g.verify();
  EXPECT_EQ(count(g, "transpose") + count(g, "neg"), 0);
  EXPECT_EQ(count(g, "mul"), 1);
  EXPECT_TRUE(same_bits(before, run1(g, {x})));
}

// ----------------------------------------------------------------------------- million-node graphs
const int64_t kMillion = kiln::testing::scaled(1000000);

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct PassCase {
  const char* name;
  Pass pass;
};
const std::vector<PassCase>& each_pass() {
  static const std::vector<PassCase> cases = {
      {"dce", &eliminate_dead_code}, {"cse", &eliminate_common_subexpressions},
      {"fold", &fold_constants},     {"canonicalize", &canonicalize},
      {"stabilize", &stabilize},
  };
  return cases;
}

// Graph::verify checks each input against its value's whole use list, quadratic in fan-out: these
// graphs have values with a million readers, so they are checked for the same invariants here in
// linear time (SSA order, use lists that match the inputs exactly, the node count).
void verify_linear(const Graph& g) {
  int64_t max_id = -1;
  std::vector<const Node*> nodes;  // sorted, for membership
  nodes.reserve(g.size());
  for (const Node* n = g.first(); n; n = n->next()) {
    nodes.push_back(n);
    for (const auto& out : n->outputs()) max_id = std::max(max_id, out->id());
  }
  ASSERT_EQ(nodes.size(), g.size());
  std::sort(nodes.begin(), nodes.end());
  auto in_graph = [&nodes](const Node* n) {
    return std::binary_search(nodes.begin(), nodes.end(), n);
  };
  std::vector<char> defined(static_cast<size_t>(max_id + 1), 0);
  int64_t input_slots = 0, use_entries = 0;
  const Node* prev = nullptr;
  std::vector<std::pair<const Node*, size_t>> slots;
  for (const Node* n = g.first(); n; prev = n, n = n->next()) {
    ASSERT_EQ(n->prev(), prev);
    ASSERT_EQ(n->owning_graph(), &g);
    if (prev) {
      ASSERT_LT(prev->position(), n->position());
    }
    for (const Value* in : n->inputs()) {
      if (!in) continue;
      ASSERT_TRUE(in->id() <= max_id && defined[static_cast<size_t>(in->id())])
          << n->kind() << " reads %" << in->id() << " before it is defined";
      ++input_slots;
    }
    for (size_t i = 0; i < n->num_outputs(); ++i) {
      const Value* out = n->output(i);
      ASSERT_EQ(out->node(), n);
      ASSERT_EQ(out->index(), i);
      defined[static_cast<size_t>(out->id())] = 1;
      slots.clear();
      for (const Use& u : out->uses()) {
        ASSERT_TRUE(in_graph(u.user)) << "a use of %" << out->id() << " by a node not in the graph";
        ASSERT_LT(u.index, u.user->num_inputs());
        ASSERT_EQ(u.user->input(u.index), out) << "stale use of %" << out->id();
        slots.emplace_back(u.user, u.index);
      }
      std::sort(slots.begin(), slots.end());
      ASSERT_TRUE(std::adjacent_find(slots.begin(), slots.end()) == slots.end())
          << "a use of %" << out->id() << " is listed twice";
      use_entries += static_cast<int64_t>(slots.size());
    }
  }
  // Every entry matches an input slot and none repeats, so equal counts mean every input is listed.
  ASSERT_EQ(use_entries, input_slots);
  for (const Value* o : g.outputs()) ASSERT_TRUE(o && in_graph(o->node()));
}

// Builds the graph fresh for each pass, runs the pass alone, then all passes through run_passes;
// prints the times.
template <typename Build, typename Check>
void through_every_pass(const char* what, Build build, Check check) {
  for (const PassCase& p : each_pass()) {
    Graph g;
    build(g);
    const size_t nodes = g.size();
    auto start = std::chrono::steady_clock::now();
    PassContext ctx;
    p.pass(g, ctx);
    double t = seconds_since(start);
    std::printf("  %s, %zu nodes: %-12s %.3f s -> %zu nodes\n", what, nodes, p.name, t, g.size());
    std::fflush(stdout);
    verify_linear(g);
  }
  Graph g;
  build(g);
  set_disabled_passes({});
  set_verify_passes(false);  // see verify_linear
  reset_pass_profile();
  auto start = std::chrono::steady_clock::now();
  run_passes(g);
  std::printf("  %s: run_passes %.3f s -> %zu nodes (", what, seconds_since(start), g.size());
  for (const PassProfileEntry& e : pass_profile())
    std::printf(" %s %.3f s", e.pass.c_str(), e.seconds);
  std::printf(" )\n");
  verify_linear(g);
  check(g);
}

// The builders below look ops up once: a million look-ups by name would dominate the test's time.
Value* make(Graph& g, const OpDef& def, std::vector<Value*> inputs, Attrs attrs = {}) {
  ValueType t = inputs[0]->type();
  return g.create(def, inputs, std::move(attrs), {std::move(t)})->output();
}

TEST(LargeGraphs, MillionNodeChains) {
  const OpDef& neg = *detail::find_op("neg");
  const OpDef& exp = *detail::find_op("exp");
  const OpDef& mul = *detail::find_op("mul");
  through_every_pass(
      "neg/exp chain",
      [&](Graph& g) {
        Value* v = g.add_input(f32({4}));
        for (int64_t i = 0; i < kMillion; ++i) v = make(g, i % 2 ? exp : neg, {v});
        g.add_output(v);
      },
      [](const Graph& g) { EXPECT_EQ(g.size(), static_cast<size_t>(kMillion + 1)); });
  through_every_pass(
      "neg chain",
      [&](Graph& g) {
        Value* x = g.add_input(f32({4}));
        Value* v = x;
        for (int64_t i = 0; i < kMillion; ++i) v = make(g, neg, {v});
        g.add_output(v);
      },
      [](const Graph& g) {
        EXPECT_EQ(g.size(), 1u);
        EXPECT_EQ(g.outputs()[0], g.inputs()[0]);
      });
  through_every_pass(
      "mul-by-constant chain",
      [&](Graph& g) {
        Value* v = g.add_input(f32({4}));
        for (int64_t i = 0; i < kMillion / 2; ++i)
          v = make(g, mul, {v, cdouble(g, i % 2 ? 1.0 : 1.5)});
        g.add_output(v);
      },
      [](const Graph& g) {
        EXPECT_EQ(count(g, "mul"), kMillion / 4);
        EXPECT_EQ(count(g, "constant"), 1);
      });
}

TEST(LargeGraphs, MillionNodeWideGraphs) {
  // A million unary nodes of one input, summed pairwise level by level. With equal nodes CSE
  // collapses everything; with distinct constants nothing merges.
  const OpDef& add = *detail::find_op("add");
  const OpDef& exp = *detail::find_op("exp");
  const OpDef& mul = *detail::find_op("mul");
  auto sum_tree = [&add](Graph& g, std::vector<Value*> level) {
    while (level.size() > 1) {
      std::vector<Value*> next;
      for (size_t i = 0; i + 1 < level.size(); i += 2)
        next.push_back(make(g, add, {level[i], level[i + 1]}, {int64_t{1}}));
      if (level.size() % 2) next.push_back(level.back());
      level = std::move(next);
    }
    g.add_output(level[0]);
  };
  through_every_pass(
      "wide equal unary nodes",
      [&](Graph& g) {
        Value* x = g.add_input(f32({4}));
        std::vector<Value*> leaves;
        leaves.reserve(kMillion);
        for (int64_t i = 0; i < kMillion; ++i) leaves.push_back(make(g, exp, {x}));
        sum_tree(g, std::move(leaves));
      },
      [](const Graph& g) { EXPECT_LE(g.size(), 30u); });
  through_every_pass(
      "wide distinct mul nodes",
      [&](Graph& g) {
        Value* x = g.add_input(f32({4}));
        std::vector<Value*> leaves;
        leaves.reserve(kMillion / 2);
        for (int64_t i = 0; i < kMillion / 2; ++i)
          leaves.push_back(make(g, mul, {x, cdouble(g, static_cast<double>(i))}));
        sum_tree(g, std::move(leaves));
      },
      [](const Graph& g) { EXPECT_EQ(count(g, "mul"), kMillion / 2 - 1); });  // x * 1 goes
}

}  // namespace
}  // namespace kiln::jit
