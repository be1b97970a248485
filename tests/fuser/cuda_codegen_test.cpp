// The CUDA code generator, without a GPU: every formula op of the op table in every dtype it takes,
// and random elementwise programs, as flat and strided kernels that NVRTC compiles for sm_90
// without a warning; scalars are kernel arguments; compile errors carry NVRTC's log.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#if KILN_HAS_CUDA
#include "fuser/codegen/cuda/cuda_codegen.h"
#include "fuser/codegen/cuda/nvrtc.h"
#include "kiln/kiln.h"
#include "lib/op_table.h"
#include "tests/fuser/fuser_testing.h"
#include "tests/testing.h"
#endif

namespace kiln {
namespace {

#if !KILN_HAS_CUDA

TEST(CudaCodegen, NeedsTheCudaToolkit) {
  GTEST_SKIP() << "kiln was built without the CUDA toolkit (no NVRTC): the CUDA code generator "
                  "is not built; configure with -DCUDAToolkit_ROOT=/usr/local/cuda to test it";
}

#else

using fuser::FusionGroup;
using fuser::Kernel;
using fuser::Layout;
using fuser::cuda::CudaOutput;
using testing::Fn;
using testing::Inputs;
using testing::plan_of;
using testing::Planned;

constexpr int kSm = 90;

// The layouts a group's kernel is generated for: flat; (with `single`) flat with its first input a
// single element; strided over the group's shape with the innermost dims of the pointers unit, any
// and zero in turn.
struct NamedLayout {
  std::string name;
  Layout layout;
};
std::vector<NamedLayout> layouts_of(const Kernel& k, const FusionGroup& g, bool single = true) {
  const size_t inputs = k.input_types.size(), ptrs = inputs + k.outputs.size();
  std::vector<NamedLayout> out;
  Layout flat;
  flat.single_element.assign(inputs, false);
  out.push_back({"flat", flat});
  if (single && inputs > 0) {
    flat.single_element[0] = true;
    out.push_back({"flat, input 0 a single element", flat});
  }
  Layout strided;
  strided.flat = false;
  strided.rank = std::max<int>(1, static_cast<int>(g.shape.size()));
  for (size_t p = 0; p < ptrs; ++p)
    strided.inner.push_back(p % 3 == 0 ? Layout::kUnit : p % 3 == 1 ? Layout::kAny : Layout::kZero);
  out.push_back({"strided, rank " + std::to_string(strided.rank), strided});
  return out;
}

std::string symbol_of(const Kernel& k) {
  return "kiln_" + k.ops + "_0123abcd";
}

// Generates and compiles (kernel, layout) to PTX for sm_90: no error, no warning, and the PTX
// defines the kernel's entry point.
void expect_compiles(const Kernel& k, const Layout& layout, const std::string& what) {
  const std::string symbol = symbol_of(k);
  std::string source;
  try {
    source = fuser::cuda::cuda_source(k, layout, symbol);
    const fuser::cuda::CudaCompiled ptx = fuser::cuda::nvrtc_compile(
        source, symbol, kSm, CudaOutput::kPtx, fuser::cuda::cuda_compile_options());
    EXPECT_EQ(ptx.log, "") << what << "\n" << k.str() << "\n" << source;
    EXPECT_NE(ptx.code.find(".entry " + symbol), std::string::npos) << what;
  } catch (const Error& e) {
    ADD_FAILURE() << what << ": " << e.what() << "\n" << k.str() << "\n" << source;
  }
}

// The fusion groups of a lazily recorded function, with the graph their nodes point into.
struct Grouped {
  Planned planned;
  std::vector<FusionGroup> groups;
};
Grouped groups_of(const Fn& fn, const Inputs& inputs) {
  Grouped g{plan_of(fn, inputs), {}};
  g.groups = fuser::find_groups(*g.planned.graph);
  return g;
}

// Attributes for the formula ops that take some: every form the formula distinguishes.
std::vector<detail::Attrs> attrs_for(const detail::OpDef& def) {
  using detail::AttrValue;
  if (def.attr_names.empty()) return {{}};
  if (def.name == "gelu")
    return {{AttrValue(std::string("none"))}, {AttrValue(std::string("tanh"))}};
  if (def.name == "softplus") return {{AttrValue(2.0), AttrValue(5.0)}};
  if (def.name == "add" || def.name == "sub")
    return {{AttrValue(1.5)}, {AttrValue(int64_t{2})}, {AttrValue(true)}};
  if (def.name == "clamp")
    return {{AttrValue(-1.0), AttrValue(2.0)},
            {AttrValue(), AttrValue(int64_t{2})},
            {AttrValue(int64_t{-1}), AttrValue()}};
  if (def.name == "to") {  // a conversion to each dtype (to its own dtype returns its operand)
    std::vector<detail::Attrs> all;
    for (DType t : {kFloat32, kFloat64, kInt32, kInt64, kBool}) all.push_back({AttrValue(t)});
    return all;
  }
  ADD_FAILURE() << "cuda_codegen_test: give attributes for the op " << def.name << " (takes "
                << def.attr_names.size() << ")";
  return {};
}

// Every elementwise op with a formula, in `dtype` when it takes it, in a group with a where (so
// that it fuses): each group's kernel compiles as flat and strided kernels. Returns the ops fused.
// (One test per dtype: NVRTC takes 0.1-0.2 s per kernel, and each test case has its own timeout.)
std::set<std::string> compile_every_formula_op(DType dtype, std::set<std::string>& ops) {
  std::set<std::string> fused_ops;
  int kernels = 0;
  for (const detail::OpDef* def : detail::all_ops()) {
    if (!def->formula ||
        (def->kind != detail::OpKind::Unary && def->kind != detail::OpKind::Binary &&
         def->kind != detail::OpKind::Ternary))
      continue;
    ops.insert(def->name);
    for (const detail::Attrs& attrs : attrs_for(*def)) {
      // Integer values from 1 (no zero divisors or negative exponents); where's condition bool.
      Inputs in;
      for (int i = 0; i < def->arity; ++i)
        in.push_back(testing::input({5, 7}, def->name == "where" && i == 0 ? kBool : dtype, 1, 3));
      in.push_back(testing::input({5, 7}, kBool));
      const int arity = def->arity;
      Fn fn = [def, attrs, arity](const Inputs& in) {
        Inputs operands(in.begin(), in.begin() + arity);
        Tensor r = def->invoke(operands, attrs).at(0);
        return Inputs{where(in.back(), r, r)};
      };
      Grouped grouped;
      try {
        grouped = groups_of(fn, in);
      } catch (const Error&) {
        continue;  // the op does not take this dtype (or these attributes with it)
      }
      const std::string what = def->name + " of " + dtype_name(dtype);
      for (const FusionGroup& g : grouped.groups) {
        bool has_op = false;
        for (const jit::Node* n : g.nodes) has_op |= n->kind() == def->name;
        if (!has_op) continue;
        fused_ops.insert(def->name);
        for (const auto& [name, layout] : layouts_of(g.kernel, g)) {
          expect_compiles(g.kernel, layout, what + ", " + name);
          ++kernels;
        }
      }
      if (::testing::Test::HasFailure()) return fused_ops;
    }
  }
  std::printf("%s: %zu of %zu formula ops fused, %d kernels compiled to PTX\n", dtype_name(dtype),
              fused_ops.size(), ops.size(), kernels);
  return fused_ops;
}

// Every formula op takes float32: all of them are compiled.
TEST(CudaCodegen, EveryFormulaOpInFloat32CompilesForSm90) {
  std::set<std::string> ops;
  const std::set<std::string> fused = compile_every_formula_op(kFloat32, ops);
  for (const std::string& op : ops) EXPECT_EQ(fused.count(op), 1u) << op << " was not fused";
  EXPECT_GE(ops.size(), 40u);
}
TEST(CudaCodegen, EveryFormulaOpInFloat64CompilesForSm90) {
  std::set<std::string> ops;
  EXPECT_GE(compile_every_formula_op(kFloat64, ops).size(), 30u);
}
TEST(CudaCodegen, EveryFormulaOpInInt32CompilesForSm90) {
  std::set<std::string> ops;
  EXPECT_GE(compile_every_formula_op(kInt32, ops).size(), 20u);
}
TEST(CudaCodegen, EveryFormulaOpInInt64CompilesForSm90) {
  std::set<std::string> ops;
  EXPECT_GE(compile_every_formula_op(kInt64, ops).size(), 20u);
}
TEST(CudaCodegen, EveryFormulaOpInBoolCompilesForSm90) {
  std::set<std::string> ops;
  EXPECT_GE(compile_every_formula_op(kBool, ops).size(), 10u);
}

// Random elementwise programs (those of the fuser's differential tests): each group's kernel,
// flat and strided, until `count` programs have been compiled.
void compile_random_programs(uint64_t seed, int count) {
  testing::RandomProgram gen(seed);
  int programs = 0, kernels = 0;
  for (int i = 0; i < 20 * count && programs < count; ++i) {
    Inputs in = gen.make_inputs();
    Fn fn = gen.make_program(2 + i % 9);
    if (testing::eager(fn, in).empty()) continue;  // no op took these inputs
    bool compiled = false;
    const Grouped grouped = groups_of(fn, in);
    for (const FusionGroup& g : grouped.groups) {
      if (g.rows) continue;
      for (const auto& [name, layout] : layouts_of(g.kernel, g, /*single=*/false)) {
        expect_compiles(
            g.kernel, layout,
            "seed " + std::to_string(seed) + ", program " + std::to_string(i) + ", " + name);
        ++kernels;
        compiled = true;
      }
      if (::testing::Test::HasFailure()) return;
    }
    programs += compiled;
  }
  EXPECT_GE(programs, count);
  std::printf("seed %llu: %d random programs, %d kernels compiled to PTX\n",
              static_cast<unsigned long long>(seed), programs, kernels);
}

// 300 programs in all, in three test cases (each has its own timeout).
TEST(CudaCodegen, RandomProgramsCompileForSm90Seed1) {
  compile_random_programs(20261125, 100);
}
TEST(CudaCodegen, RandomProgramsCompileForSm90Seed2) {
  compile_random_programs(20261126, 100);
}
TEST(CudaCodegen, RandomProgramsCompileForSm90Seed3) {
  compile_random_programs(20261127, 100);
}

// A literal of the graph is a kernel scalar: x * 0.37 and x * 0.38 are the same source (and so
// the same compiled kernel), and only the group's scalar values differ. So are sizes: a new shape
// is the same source.
TEST(CudaCodegen, ScalarsAndSizesAreKernelArgumentsNotSource) {
  auto sources = [](double c, const Shape& shape) {
    Fn fn = [c](const Inputs& in) { return Inputs{exp(in[0] * c) + 1.0}; };
    const std::vector<FusionGroup> groups = groups_of(fn, {testing::input(shape)}).groups;
    EXPECT_EQ(groups.size(), 1u);
    std::vector<std::string> out;
    if (groups.empty()) return std::make_pair(out, std::vector<uint64_t>{});
    for (const auto& [name, layout] : layouts_of(groups[0].kernel, groups[0]))
      out.push_back(fuser::cuda::cuda_source(groups[0].kernel, layout, "kiln_k"));
    return std::make_pair(out, groups[0].scalars);
  };
  const auto [a, a_scalars] = sources(0.37, {6, 9});
  const auto [b, b_scalars] = sources(0.38, {6, 9});
  const auto [c, c_scalars] = sources(0.37, {11, 3});
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  EXPECT_NE(a_scalars, b_scalars);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a[0].find("0.37"), std::string::npos) << a[0];
  // The multiplier arrives as a double argument (a C++ number), converted in the kernel.
  const size_t entry = a[0].find("extern \"C\" __global__");
  ASSERT_NE(entry, std::string::npos) << a[0];
  const std::string signature = a[0].substr(entry, a[0].find('\n', entry) - entry);
  EXPECT_NE(signature.find("double s0"), std::string::npos) << signature;
}

// Both cubin (machine code for sm_90) and PTX come out of a compile; NVRTC's version is known.
TEST(CudaCodegen, CompilesToCubinAndReportsTheNvrtcVersion) {
  Fn fn = [](const Inputs& in) { return Inputs{tanh(in[0]) * in[1] + 0.5}; };
  const std::vector<FusionGroup> groups =
      groups_of(fn, {testing::input({4, 8}), testing::input({8})}).groups;
  ASSERT_EQ(groups.size(), 1u);
  const Kernel& k = groups[0].kernel;
  const std::string source =
      fuser::cuda::cuda_source(k, layouts_of(k, groups[0])[0].layout, "kiln_t");
  const fuser::cuda::CudaCompiled cubin = fuser::cuda::nvrtc_compile(
      source, "kiln_t", kSm, CudaOutput::kCubin, fuser::cuda::cuda_compile_options());
  EXPECT_EQ(cubin.log, "");
  ASSERT_GE(cubin.code.size(), 4u);
  EXPECT_EQ(cubin.code.substr(0, 4),
            "\x7f"
            "ELF");
  EXPECT_EQ(fuser::cuda::nvrtc_version().rfind("NVRTC ", 0), 0u) << fuser::cuda::nvrtc_version();
  const std::vector<int> archs = fuser::cuda::nvrtc_supported_archs();
  EXPECT_NE(std::find(archs.begin(), archs.end(), kSm), archs.end());
}

// The float32 flat kernel has a 4-wide loop (16-byte loads and stores) that `vec` turns on.
TEST(CudaCodegen, Float32FlatKernelsLoadAndStoreFourElementsAtOnce) {
  Fn fn = [](const Inputs& in) { return Inputs{sigmoid(in[0]) * in[1]}; };
  const std::vector<FusionGroup> groups =
      groups_of(fn, {testing::input({4, 8}), testing::input({4, 8})}).groups;
  ASSERT_EQ(groups.size(), 1u);
  Layout flat;
  flat.single_element = {false, false};
  const std::string source = fuser::cuda::cuda_source(groups[0].kernel, flat, "kiln_v");
  const std::string ptx = fuser::cuda::nvrtc_compile(source, "kiln_v", kSm, CudaOutput::kPtx,
                                                     fuser::cuda::cuda_compile_options())
                              .code;
  EXPECT_NE(ptx.find("ld.global.v4.f32"), std::string::npos) << ptx;
  EXPECT_NE(ptx.find("st.global.v4.f32"), std::string::npos) << ptx;
}

// A compile error raises kiln::Error whose message holds NVRTC's log (the line and the reason).
TEST(CudaCodegen, ACompileErrorCarriesNvrtcsLog) {
  const std::string broken =
      "extern \"C\" __global__ void kiln_broken(float* out) {\n"
      "  out[0] = no_such_variable_here;\n"
      "}\n";
  try {
    fuser::cuda::nvrtc_compile(broken, "kiln_broken", kSm, CudaOutput::kPtx);
    ADD_FAILURE() << "the broken source compiled";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("kiln_broken"), std::string::npos) << message;
    EXPECT_NE(message.find("no_such_variable_here"), std::string::npos) << message;
    EXPECT_NE(message.find("identifier"), std::string::npos) << message;
    EXPECT_NE(message.find("kiln_broken.cu(2)"), std::string::npos) << message;
  }
}

// Rows kernels (reductions) are not generated for CUDA yet: a clear error, not wrong code.
TEST(CudaCodegen, RowsKernelsRaiseAClearError) {
  Fn fn = [](const Inputs& in) { return Inputs{softmax(in[0] * 2.0, -1)}; };
  const std::vector<FusionGroup> groups = groups_of(fn, {testing::input({4, 8})}).groups;
  ASSERT_EQ(groups.size(), 1u);
  ASSERT_TRUE(groups[0].rows);
  Layout rows;
  rows.flat = false;
  rows.rows = true;
  rows.rank = 1;
  rows.inner.assign(groups[0].kernel.input_types.size() + groups[0].kernel.outputs.size(),
                    Layout::kUnit);
  try {
    fuser::cuda::cuda_source(groups[0].kernel, rows, "kiln_rows");
    ADD_FAILURE() << "a rows kernel was generated";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rows kernels are not generated for CUDA yet"),
              std::string::npos)
        << e.what();
  }
}

#endif  // KILN_HAS_CUDA

}  // namespace
}  // namespace kiln
