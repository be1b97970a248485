// The transfer-elimination pass on graphs that mix devices (built directly: the pass needs no GPU).
#include <map>

#include "jit/infer.h"
#include "jit/ir.h"
#include "jit/passes/passes.h"
#include "tests/testing.h"

namespace kiln::jit {
namespace {

const Device kGpu0{DeviceType::CUDA, 0};
const Device kGpu1{DeviceType::CUDA, 1};

ValueType on(Device d, Shape sizes, DType dtype = kFloat32) {
  return ValueType{dtype, std::move(sizes), d};
}

Value* copy_to(Graph& g, Value* x, Device d) {
  ValueType t = x->type();
  t.device = d;
  return g.create("to_device", {x}, {d.str()}, {t})->output();
}

Value* unary(Graph& g, const char* op, Value* x) {
  return g.create(op, {x}, {}, {x->type()})->output();
}

Value* binary(Graph& g, const char* op, Value* a, Value* b, ValueType out) {
  Attrs attrs;
  if (std::string(op) == "add") attrs.push_back(int64_t{1});  // alpha
  return g.create(op, {a, b}, std::move(attrs), {std::move(out)})->output();
}

// Runs the pass and dce, checks the graph, and counts the nodes left per "op@device".
std::map<std::string, int> run(Graph& g, PassContext& ctx) {
  eliminate_transfers(g, ctx);
  PassContext dce;
  eliminate_dead_code(g, dce);
  g.verify();
  verify_types(g);
  std::map<std::string, int> count;
  for (const Node* n = g.first(); n; n = n->next())
    if (!n->is_input() && !n->is_constant())
      ++count[n->kind() + "@" + n->output()->type().device.str()];
  return count;
}

TEST(Transfers, ARoundTripIsRemoved) {
  Graph g;
  Value* x = g.add_input(on(kCPU, {8}));
  Value* back = copy_to(g, copy_to(g, x, kGpu0), kCPU);
  g.add_output(unary(g, "exp", back));
  PassContext ctx;
  const auto count = run(g, ctx);
  EXPECT_EQ(count, (std::map<std::string, int>{{"exp@cpu", 1}}));
  EXPECT_EQ(ctx.rewrites["round trip removed"], 1);
  EXPECT_EQ(g.outputs()[0]->node()->input(0), g.inputs()[0]);
}

TEST(Transfers, ACopyToTheSameDeviceIsRemoved) {
  Graph g;
  Value* x = g.add_input(on(kGpu0, {8}));
  g.add_output(unary(g, "neg", copy_to(g, x, kGpu0)));
  PassContext ctx;
  EXPECT_EQ(run(g, ctx), (std::map<std::string, int>{{"neg@cuda:0", 1}}));
  EXPECT_EQ(ctx.rewrites["copy to the same device removed"], 1);
}

TEST(Transfers, ACopyOfACopyGoesStraightToItsTarget) {
  Graph g;
  Value* x = g.add_input(on(kCPU, {8}));
  g.add_output(copy_to(g, copy_to(g, x, kGpu0), kGpu1));
  PassContext ctx;
  EXPECT_EQ(run(g, ctx), (std::map<std::string, int>{{"to_device@cuda:1", 1}}));
  EXPECT_EQ(g.outputs()[0]->node()->input(0), x);
}

TEST(Transfers, ElementwiseWorkMovesToTheDeviceItsResultIsCopiedTo) {
  // y = exp(x) * 2 + 1 on the host, then copied to the device: the chain runs on the device, and
  // only x is copied (the numbers stay host scalars that a device kernel takes as arguments).
  Graph g;
  Value* x = g.add_input(on(kCPU, {1000}));
  Value* e = unary(g, "exp", x);
  Value* m = binary(g, "mul", e, g.constant(int64_t{2}, kInt64), on(kCPU, {1000}));
  Value* y = binary(g, "add", m, g.constant(int64_t{1}, kInt64), on(kCPU, {1000}));
  g.add_output(unary(g, "tanh", copy_to(g, y, kGpu0)));
  PassContext ctx;
  const auto count = run(g, ctx);
  EXPECT_EQ(count, (std::map<std::string, int>{{"to_device@cuda:0", 1},
                                               {"exp@cuda:0", 1},
                                               {"mul@cuda:0", 1},
                                               {"add@cuda:0", 1},
                                               {"tanh@cuda:0", 1}}));
  EXPECT_EQ(ctx.rewrites["work moved to the copy's device"], 3);
  // The one copy left reads the graph input.
  for (const Node* n = g.first(); n; n = n->next())
    if (n->kind() == "to_device") EXPECT_EQ(n->input(0), x);
}

TEST(Transfers, WorkStaysWhereMovingItWouldCopyMore) {
  Graph g;
  // An outer sum makes a 1000x1000 result from 2000 values: moving it copies less, so it moves.
  Value* a = g.add_input(on(kCPU, {1, 1000}));
  Value* b = g.add_input(on(kCPU, {1000, 1}));
  g.add_output(copy_to(g, binary(g, "add", a, b, on(kCPU, {1000, 1000})), kGpu0));
  // A reduction's input is larger than its result: it stays on the host.
  Value* c = g.add_input(on(kCPU, {1000, 1000}));
  Value* s =
      g.create("sum", {c}, {std::vector<int64_t>{1}, false, std::monostate{}}, {on(kCPU, {1000})})
          ->output();
  g.add_output(copy_to(g, s, kGpu0));
  // Two operands as large as the result would copy twice the bytes: the add stays on the host.
  Value* p = g.add_input(on(kCPU, {100}));
  Value* q = g.add_input(on(kCPU, {100}));
  g.add_output(copy_to(g, binary(g, "add", p, q, on(kCPU, {100})), kGpu0));
  // A value the host also reads stays there too.
  Value* d = g.add_input(on(kCPU, {10}));
  Value* e = unary(g, "exp", d);
  g.add_output(e);
  g.add_output(copy_to(g, e, kGpu0));
  PassContext ctx;
  const auto count = run(g, ctx);
  EXPECT_EQ(count, (std::map<std::string, int>{{"to_device@cuda:0", 5},
                                               {"add@cuda:0", 1},
                                               {"add@cpu", 1},
                                               {"sum@cpu", 1},
                                               {"exp@cpu", 1}}));
}

// GEMMs, joins, views and gathers move too (a device computes them itself) when their operands
// are no larger than their result; ops a device would run through the host (layer_norm, prod) stay.
TEST(Transfers, WorkWithDeviceKernelsMovesAndHostOnlyWorkStays) {
  Graph g;
  // [256, 4] x [4, 256]: 8 KiB of factors for a 256 KiB product, which moves; its transpose (a
  // view) and a cat with itself move with it.
  Value* a = g.add_input(on(kCPU, {256, 4}));
  Value* b = g.add_input(on(kCPU, {4, 256}));
  Value* mm = g.create("mm", {a, b}, {}, {on(kCPU, {256, 256})})->output();
  Value* t =
      g.create("transpose", {mm}, {int64_t{0}, int64_t{1}}, {on(kCPU, {256, 256})})->output();
  Value* joined = g.create("cat", {t, b}, {int64_t{0}}, {on(kCPU, {260, 256})})->output();
  g.add_output(copy_to(g, joined, kGpu0));
  // [256, 256] x [256, 1]: the factors are larger than the product, which stays.
  Value* c = g.add_input(on(kCPU, {256, 256}));
  Value* v = g.add_input(on(kCPU, {256, 1}));
  g.add_output(copy_to(g, g.create("mm", {c, v}, {}, {on(kCPU, {256, 1})})->output(), kGpu0));
  // layer_norm has no device kernel (a device records it as fusible ops): it stays.
  Value* x = g.add_input(on(kCPU, {8, 16}));
  Value* ln = g.create("layer_norm", {x, nullptr, nullptr}, {std::vector<int64_t>{16}, 1e-5},
                       {on(kCPU, {8, 16})})
                  ->output();
  g.add_output(copy_to(g, ln, kGpu0));
  PassContext ctx;
  const auto count = run(g, ctx);
  EXPECT_EQ(count, (std::map<std::string, int>{{"to_device@cuda:0", 5},
                                               {"mm@cuda:0", 1},
                                               {"transpose@cuda:0", 1},
                                               {"cat@cuda:0", 1},
                                               {"mm@cpu", 1},
                                               {"layer_norm@cpu", 1}}));
  EXPECT_EQ(ctx.rewrites["work moved to the copy's device"], 3);
}

// The rule works both ways: an outer sum on the device whose result is copied to the host runs on
// the host instead, which copies its 2000 operand values down rather than its million results.
TEST(Transfers, WorkMovesToTheHostWhenItsResultIsCopiedThere) {
  Graph g;
  Value* a = g.add_input(on(kGpu0, {1, 1000}));
  Value* b = g.add_input(on(kGpu0, {1000, 1}));
  g.add_output(copy_to(g, binary(g, "add", a, b, on(kGpu0, {1000, 1000})), kCPU));
  PassContext ctx;
  EXPECT_EQ(run(g, ctx), (std::map<std::string, int>{{"to_device@cpu", 2}, {"add@cpu", 1}}));
  EXPECT_EQ(ctx.rewrites["work moved to the copy's device"], 1);
}

}  // namespace
}  // namespace kiln::jit
