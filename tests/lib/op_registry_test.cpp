// Explicit registration: the op table holds every family's ops after initialization, the upper
// layers' hooks are filled, and initializing again changes nothing.
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "exec/init.h"
#include "lib/cuda_tensor.h"
#include "lib/op_registry.h"
#include "lib/ops/conv.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using detail::OpKind;

// One op of each family (lib/op_registry.h's register functions, then exec/init.cpp's graph ops),
// with the kind it registers.
const std::vector<std::pair<std::string, OpKind>>& one_op_per_family() {
  static const std::vector<std::pair<std::string, OpKind>> ops = {
      {"empty", OpKind::Factory},               // register_factories
      {"to", OpKind::Unary},                    // register_tensor_ops
      {"view", OpKind::View},                   // register_views
      {"neg", OpKind::Unary},                   // register_elementwise_ops: unary_ops.inc
      {"mul", OpKind::Binary},                  // register_elementwise_ops: binary_ops.inc
      {"where", OpKind::Ternary},               // register_elementwise_ops: one by one
      {"bitwise_and", OpKind::Binary},          // register_bitwise_ops
      {"sum", OpKind::Reduction},               // register_reductions
      {"cumsum", OpKind::NN},                   // register_scans
      {"index_select", OpKind::Index},          // register_index_ops
      {"mm", OpKind::Linalg},                   // register_linalg_ops
      {"softmax", OpKind::NN},                  // register_nn_ops
      {"max_pool2d_with_indices", OpKind::NN},  // register_pool_ops
      {"avg_pool2d", OpKind::NN},               // register_pool_ops
      {"conv2d", OpKind::NN},                   // register_conv_ops
      {"all_reduce", OpKind::NN},               // register_collective_ops
      {"input", OpKind::Graph},                 // initialize_upper_layers
      {"constant", OpKind::Graph},              // initialize_upper_layers
  };
  return ops;
}

std::set<const detail::OpDef*> table_entries() {
  std::vector<const detail::OpDef*> all = detail::all_ops();
  return {all.begin(), all.end()};
}

TEST(OpRegistry, HoldsEveryFamilysOps) {
  for (const auto& [name, kind] : one_op_per_family()) {
    const detail::OpDef* def = detail::find_op(name);
    ASSERT_NE(def, nullptr) << name;
    EXPECT_EQ(def->name, name);
    EXPECT_EQ(static_cast<int>(def->kind), static_cast<int>(kind)) << name;
  }
  EXPECT_EQ(detail::find_op("no_such_op"), nullptr);
  // Names are unique, and every entry is reachable by its name.
  for (const detail::OpDef* def : detail::all_ops()) EXPECT_EQ(detail::find_op(def->name), def);
}

TEST(OpRegistry, UpperLayersFillLibsHooks) {
  EXPECT_NE(detail::conv_choice_store().load, nullptr);
  EXPECT_NE(detail::conv_choice_store().store, nullptr);
#if KILN_HAS_CUDA
  EXPECT_NE(detail::device_kernels().copy, nullptr);
  EXPECT_NE(detail::device_kernels().source_kernel, nullptr);
  EXPECT_NE(detail::device_kernels().gather, nullptr);
  EXPECT_NE(detail::device_kernels().scatter_add, nullptr);
#endif
  // The evaluator: a value recorded lazily is computed when read.
  Tensor x = from_vector(std::vector<float>{1, -2, 3});
  EXPECT_EQ((-(x * x)).to_vector<float>(), (std::vector<float>{-1, -4, -9}));
}

TEST(OpRegistry, InitializingTwiceIsHarmless) {
  const std::set<const detail::OpDef*> before = table_entries();
  const detail::OpDef* neg = detail::find_op("neg");
  const auto copy = detail::device_kernels().copy;
  const auto load = detail::conv_choice_store().load;
  for (int i = 0; i < 2; ++i) {
    EXPECT_NO_THROW(detail::ensure_ops_registered());
    EXPECT_NO_THROW(detail::initialize_upper_layers());
  }
  EXPECT_EQ(table_entries(), before);  // no entry added, replaced or defined twice
  EXPECT_EQ(detail::find_op("neg"), neg);
  EXPECT_EQ(detail::device_kernels().copy, copy);
  EXPECT_EQ(detail::conv_choice_store().load, load);
  // Ops still run through their handles.
  Tensor x = from_vector(std::vector<float>{1, -2});
  EXPECT_EQ(kiln::neg(x).sum().item<float>(), 1.0f);
}

}  // namespace
}  // namespace kiln
