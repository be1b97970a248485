// The CUDA code generator, without a GPU: every formula op of the op table in every dtype it takes,
// and random elementwise programs, as flat and strided kernels that NVRTC compiles for sm_90
// without a warning; generated kernels (without transcendental functions) run on the host, flat
// and strided, compute what the LLVM emitter's kernels compute; scalars are kernel arguments;
// compile errors carry NVRTC's log.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#if KILN_HAS_CUDA
#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <thread>

#include "fuser/codegen/cuda/cuda_codegen.h"
#include "fuser/codegen/cuda/cuda_index.h"
#include "fuser/codegen/cuda/cuda_kernel.h"
#include "fuser/codegen/cuda/nvrtc.h"
#include "fuser/codegen/llvm/cpu_codegen.h"
#include "kiln/kiln.h"
#include "lib/op_table.h"
#include "tests/fuser/fuser_testing.h"
#include "tests/fuser/random_reduction.h"
#include "tests/scale.h"
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

using fuser::cuda::CudaCallFlags;

// The distinct variants of (kernel, layout): index32 both ways, and vec both ways where the kernel
// has a 4-wide loop.
std::vector<CudaCallFlags> variants_of(const Kernel& k, const Layout& layout) {
  std::vector<CudaCallFlags> out;
  for (bool index32 : {true, false})
    for (bool vec : {true, false}) {
      const CudaCallFlags v = fuser::cuda::cuda_variant(k, layout, {index32, vec});
      if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
    }
  return out;
}
std::string variant_name(CudaCallFlags v) {
  return std::string(v.index32 ? "index32" : "index64") + (v.vec ? ", vec" : "") +
         (v.per_thread > 0 ? ", K " + std::to_string(v.per_thread) : "");
}

// Variants in turn, for tests that compile many kernels: NVRTC takes 0.1-0.2 s per source, and
// the variants differ only in the loops around the body, which every op shares, so each kernel
// compiles one variant and the test checks that every variant came up (`seen`).
struct VariantTurns {
  std::map<std::string, size_t> turn;  // per layout kind, which alternate in the callers' loops
  std::set<std::string> seen;
  CudaCallFlags next(const Kernel& k, const Layout& layout) {
    const std::vector<CudaCallFlags> v = variants_of(k, layout);
    const std::string kind = layout.rows ? "rows" : layout.flat ? "flat" : "strided";
    const CudaCallFlags pick = v[turn[kind]++ % v.size()];
    seen.insert(kind + ", " + variant_name(pick));
    return pick;
  }
  // Every variant of flat (4-wide ones when `vec`), strided and (when `rows`) rows kernels.
  void expect_all(bool flat, bool vec, bool strided, bool rows) const {
    std::set<std::string> want;
    for (const char* index : {"index32", "index64"}) {
      if (flat) want.insert(std::string("flat, ") + index);
      if (flat && vec) want.insert(std::string("flat, ") + index + ", vec");
      if (strided) want.insert(std::string("strided, ") + index);
      if (rows) want.insert(std::string("rows, ") + index);
    }
    for (const std::string& w : want) EXPECT_EQ(seen.count(w), 1u) << w << " was never compiled";
  }
};

// Generates and compiles (kernel, layout, variant) to PTX for sm_90: no error, no warning, and the
// PTX defines the kernel's entry point.
void expect_compiles(const Kernel& k, const Layout& layout, CudaCallFlags variant,
                     const std::string& what) {
  const std::string symbol = symbol_of(k);
  std::string source;
  try {
    source = fuser::cuda::cuda_source(k, layout, symbol, variant);
    const fuser::cuda::CudaCompiled ptx = fuser::cuda::nvrtc_compile(
        source, symbol, kSm, CudaOutput::kPtx, fuser::cuda::cuda_compile_options());
    EXPECT_EQ(ptx.log, "") << what << ", " << variant_name(variant) << "\n"
                           << k.str() << "\n"
                           << source;
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
  VariantTurns turns;
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
          expect_compiles(g.kernel, layout, turns.next(g.kernel, layout), what + ", " + name);
          ++kernels;
        }
      }
      if (::testing::Test::HasFailure()) return fused_ops;
    }
  }
  std::printf("%s: %zu of %zu formula ops fused, %d kernels compiled to PTX\n", dtype_name(dtype),
              fused_ops.size(), ops.size(), kernels);
  // float64 and int64 tensors have no 4-wide loop.
  turns.expect_all(true, dtype == kFloat32 || dtype == kInt32 || dtype == kBool, true, false);
  return fused_ops;
}

// The bitwise ops take bools and integers only; every other formula op takes float32.
const char* const kBitwiseOps[] = {"bitwise_and", "bitwise_or", "bitwise_xor"};
bool is_bitwise(const std::string& op) {
  return std::find(std::begin(kBitwiseOps), std::end(kBitwiseOps), op) != std::end(kBitwiseOps);
}
void expect_bitwise_fused(const std::set<std::string>& fused) {
  for (const char* op : kBitwiseOps) EXPECT_EQ(fused.count(op), 1u) << op << " was not fused";
}

// Every formula op that takes float32 is compiled.
TEST(CudaCodegen, EveryFormulaOpInFloat32CompilesForSm90) {
  std::set<std::string> ops;
  const std::set<std::string> fused = compile_every_formula_op(kFloat32, ops);
  for (const std::string& op : ops)
    if (!is_bitwise(op)) {
      EXPECT_EQ(fused.count(op), 1u) << op << " was not fused";
    }
  EXPECT_GE(ops.size(), 40u);
}
TEST(CudaCodegen, EveryFormulaOpInFloat64CompilesForSm90) {
  std::set<std::string> ops;
  EXPECT_GE(compile_every_formula_op(kFloat64, ops).size(), 30u);
}
TEST(CudaCodegen, EveryFormulaOpInInt32CompilesForSm90) {
  std::set<std::string> ops;
  const std::set<std::string> fused = compile_every_formula_op(kInt32, ops);
  EXPECT_GE(fused.size(), 20u);
  expect_bitwise_fused(fused);
}
TEST(CudaCodegen, EveryFormulaOpInInt64CompilesForSm90) {
  std::set<std::string> ops;
  const std::set<std::string> fused = compile_every_formula_op(kInt64, ops);
  EXPECT_GE(fused.size(), 20u);
  expect_bitwise_fused(fused);
}
TEST(CudaCodegen, EveryFormulaOpInBoolCompilesForSm90) {
  std::set<std::string> ops;
  const std::set<std::string> fused = compile_every_formula_op(kBool, ops);
  EXPECT_GE(fused.size(), 10u);
  expect_bitwise_fused(fused);
}

// (a & b) | (c ^ d), a comparison and a where.
Inputs bitwise_mask_chain(const Inputs& in) {
  const Tensor m = (in[0] & in[1]) | (in[2] ^ in[3]);
  return Inputs{where(ne(m, 0), m, ~in[0])};
}

// The mask chain is one group, whose kernel compiles in bool, int32 and int64, flat and strided.
TEST(CudaCodegen, ABitwiseMaskChainIsOneKernelThatCompilesForSm90) {
  const Fn fn = bitwise_mask_chain;
  VariantTurns turns;
  for (DType t : {kBool, kInt32, kInt64}) {
    Inputs in;
    for (const Shape& s : {Shape{6, 7}, Shape{7}, Shape{6, 1}, Shape{6, 7}})
      in.push_back(testing::input(s, t, -50, 50));
    const Grouped grouped = groups_of(fn, in);
    ASSERT_EQ(grouped.groups.size(), 1u) << grouped.planned.graph->str();
    EXPECT_EQ(grouped.planned.plan->num_steps(), 1u) << grouped.planned.graph->str();
    const FusionGroup& g = grouped.groups[0];
    for (const auto& [name, layout] : layouts_of(g.kernel, g))
      expect_compiles(g.kernel, layout, turns.next(g.kernel, layout),
                      std::string("bitwise mask chain of ") + dtype_name(t) + ", " + name);
  }
}

// Random elementwise programs (those of the fuser's differential tests): each group's kernel,
// flat and strided, until `count` programs have been compiled.
void compile_random_programs(uint64_t seed, int count) {
  testing::RandomProgram gen(seed);
  int programs = 0, kernels = 0;
  VariantTurns turns;
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
            g.kernel, layout, turns.next(g.kernel, layout),
            "seed " + std::to_string(seed) + ", program " + std::to_string(i) + ", " + name);
        ++kernels;
        compiled = true;
      }
      if (::testing::Test::HasFailure()) return;
    }
    programs += compiled;
  }
  EXPECT_GE(programs, count);
  turns.expect_all(true, true, true, false);
  std::printf("seed %llu: %d random programs, %d kernels compiled to PTX\n",
              static_cast<unsigned long long>(seed), programs, kernels);
}

// 300 programs in all, in three test cases (each has its own timeout); fewer under
// KILN_TEST_SCALE.
TEST(CudaCodegen, RandomProgramsCompileForSm90Seed1) {
  compile_random_programs(20261125, static_cast<int>(testing::scaled(100, 24)));
}
TEST(CudaCodegen, RandomProgramsCompileForSm90Seed2) {
  compile_random_programs(20261126, static_cast<int>(testing::scaled(100, 24)));
}
TEST(CudaCodegen, RandomProgramsCompileForSm90Seed3) {
  compile_random_programs(20261127, static_cast<int>(testing::scaled(100, 24)));
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
      for (const CudaCallFlags v : variants_of(groups[0].kernel, layout))
        out.push_back(fuser::cuda::cuda_source(groups[0].kernel, layout, "kiln_k", v));
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

// A number from the host (a 0-dim CPU tensor such as an optimizer's step size) read by a flat
// device kernel is one of its parameters, not a copy to the device: the entry takes the value and
// reads it through its address, the launch carries its bytes, and the binary compiles for sm_90.
TEST(CudaCodegen, NumbersFromTheHostArePassedByValue) {
  Fn fn = [](const Inputs& in) { return Inputs{tanh(in[0] * in[1]) + in[1]}; };
  const std::vector<FusionGroup> groups =
      groups_of(fn, {testing::input({64}), testing::input({})}).groups;
  ASSERT_EQ(groups.size(), 1u);
  const Kernel& k = groups[0].kernel;
  ASSERT_EQ(k.input_types.size(), 2u);
  fuser::Layout layout;
  layout.single_element = {false, true};
  layout.by_value = {false, true};
  const CudaCallFlags v{true, true};
  const std::string src = fuser::cuda::cuda_source(k, layout, "kiln_k", v);
  const size_t entry = src.find("extern \"C\" __global__");
  ASSERT_NE(entry, std::string::npos) << src;
  const std::string signature = src.substr(entry, src.find('\n', entry) - entry);
  EXPECT_NE(signature.find("const float in1_value"), std::string::npos) << signature;
  EXPECT_NE(src.find("&in1_value"), std::string::npos) << src;
  EXPECT_GT(fuser::cuda::cuda_binary(k, layout, v, 90).image.size(), 100u);
  // Another binary than the one reading the number from device memory.
  fuser::Layout on_device = layout;
  on_device.by_value.clear();
  EXPECT_NE(fuser::cuda::cuda_binary_key(k, layout, v, 90),
            fuser::cuda::cuda_binary_key(k, on_device, v, 90));
  const float number = 2.5f;
  std::vector<char*> pointers{reinterpret_cast<char*>(uintptr_t{4096}),
                              reinterpret_cast<char*>(const_cast<float*>(&number)),
                              reinterpret_cast<char*>(uintptr_t{8192})};
  const fuser::cuda::KernelCall call = fuser::cuda::elementwise_call(
      k, layout, 64, nullptr, nullptr, pointers.data(), groups[0].scalars.data(), 132);
  ASSERT_GE(call.args.size(), 3u);  // n, in0, in1 (the value), out0, ...
  EXPECT_EQ(call.bytes[2], sizeof(float));
  EXPECT_EQ(*static_cast<const float*>(call.args[2]), 2.5f);
  EXPECT_EQ(call.bytes[1], sizeof(char*));
}

// Both cubin (machine code for sm_90) and PTX come out of a compile; NVRTC's version is known.
TEST(CudaCodegen, CompilesToCubinAndReportsTheNvrtcVersion) {
  Fn fn = [](const Inputs& in) { return Inputs{tanh(in[0]) * in[1] + 0.5}; };
  const std::vector<FusionGroup> groups =
      groups_of(fn, {testing::input({4, 8}), testing::input({8})}).groups;
  ASSERT_EQ(groups.size(), 1u);
  const Kernel& k = groups[0].kernel;
  const std::string source =
      fuser::cuda::cuda_source(k, layouts_of(k, groups[0])[0].layout, "kiln_t", {true, true});
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

// The float32 flat kernel's vec variant has a 4-wide loop (16-byte loads and stores); the scalar
// variant has none (it runs on pointers of any alignment). Each variant is one instance: 32-bit
// or 64-bit indices, not both.
TEST(CudaCodegen, Float32FlatKernelsLoadAndStoreFourElementsAtOnce) {
  Fn fn = [](const Inputs& in) { return Inputs{sigmoid(in[0]) * in[1]}; };
  const std::vector<FusionGroup> groups =
      groups_of(fn, {testing::input({4, 8}), testing::input({4, 8})}).groups;
  ASSERT_EQ(groups.size(), 1u);
  Layout flat;
  flat.single_element = {false, false};
  auto source = [&](CudaCallFlags v) {
    return fuser::cuda::cuda_source(groups[0].kernel, flat, "kiln_v", v);
  };
  auto ptx = [&](CudaCallFlags v) {
    return fuser::cuda::nvrtc_compile(source(v), "kiln_v", kSm, CudaOutput::kPtx,
                                      fuser::cuda::cuda_compile_options())
        .code;
  };
  const std::string vec = ptx({true, true}), scalar = ptx({true, false});
  EXPECT_NE(vec.find("ld.global.v4.f32"), std::string::npos) << vec;
  EXPECT_NE(vec.find("st.global.v4.f32"), std::string::npos) << vec;
  EXPECT_EQ(scalar.find(".v4."), std::string::npos) << scalar;
  EXPECT_EQ(source({true, false}).find("float4"), std::string::npos);
  EXPECT_EQ(source({true, true}).find("unsigned long long>"), std::string::npos);
  EXPECT_EQ(source({false, true}).find("<unsigned>"), std::string::npos);
  EXPECT_NE(source({false, true}).find("kiln_flat<unsigned long long>"), std::string::npos);
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

// ------------------------------------------------------------------------ rows kernels
// The rows layout a rows group's kernel is generated for: the group's outer dims, each input read
// per row (broadcast against the kept dims) with a zero stride along the row, the others unit,
// any and zero in turn (`turn` shifts the pattern); element-level outputs unit or any, the others
// (row-level, global, column) zero.
Layout rows_layout_of(const Kernel& k, const FusionGroup& g, size_t turn = 0) {
  Layout rows;
  rows.flat = false;
  rows.rows = true;
  rows.rank = static_cast<int32_t>(g.shape.size()) - g.reduced_dims;
  const std::vector<fuser::Level> level = fuser::instr_levels(k);
  for (size_t p = 0; p < k.input_types.size(); ++p) {
    const bool outer = p < g.input_outer.size() && g.input_outer[p];
    rows.inner.push_back(outer ? Layout::kZero : static_cast<Layout::Inner>((p + turn + 1) % 3));
  }
  for (size_t o = 0; o < k.outputs.size(); ++o) {
    const fuser::Level l = level[static_cast<size_t>(k.outputs[o])];
    const bool element = l == fuser::Level::kElement ||
                         (o < k.output_per_element.size() && k.output_per_element[o] &&
                          (l == fuser::Level::kRow || l == fuser::Level::kConst));
    rows.inner.push_back(!element ? Layout::kZero : (o + turn) % 2 ? Layout::kAny : Layout::kUnit);
  }
  return rows;
}

// A rows group's kernel, as the tests below generate and run it.
struct RowsCase {
  Kernel kernel;
  std::vector<uint64_t> scalars;
  std::vector<bool> input_outer;
  int rank = 0;  // outer dims
  std::string what;
  Layout layout;  // for the PTX compile
};
// The rows groups of fn's plan (those with a kernel: at least one reduction).
std::vector<RowsCase> rows_cases_of(const Fn& fn, const Inputs& inputs, const std::string& what,
                                    size_t turn = 0) {
  const Grouped grouped = groups_of(fn, inputs);
  std::vector<RowsCase> out;
  for (const FusionGroup& g : grouped.groups) {
    if (!g.rows) continue;
    const int rank = static_cast<int>(g.shape.size()) - g.reduced_dims;
    out.push_back({g.kernel, g.scalars, g.input_outer, rank, what,
                   rows_layout_of(g.kernel, g, turn + out.size())});
  }
  return out;
}

// The case's layout with every pointer that moves along the row contiguous along it: the layout of
// the vec variant where the kernel's types have one.
Layout unit_rows_layout(const RowsCase& c) {
  Layout unit = c.layout;
  for (Layout::Inner& inner : unit.inner)
    if (inner == Layout::kAny) inner = Layout::kUnit;
  return unit;
}

// Compiles the cases to PTX for sm_90 (no error, no warning, the entry points defined), on two
// threads (NVRTC is thread-safe; a rows kernel takes it about 0.15 s). Failures are reported from
// this thread.
void compile_rows_cases(const std::vector<RowsCase>& cases) {
  // Both variants (32-bit and 64-bit indices) in turn, and where the kernel has one the vec
  // variant (16-byte quad accesses) on the unit layout, with the generic loop and with K = 16.
  VariantTurns turns;
  struct Job {
    const RowsCase* c;
    Layout layout;
    CudaCallFlags variant;
  };
  std::vector<Job> jobs;
  size_t vec_jobs = 0;
  for (const RowsCase& c : cases) {
    jobs.push_back({&c, c.layout, turns.next(c.kernel, c.layout)});
    const Layout unit = unit_rows_layout(c);
    const int per_thread = vec_jobs % 4 < 2 ? 0 : 16;
    const CudaCallFlags vec = {vec_jobs % 2 == 0, true, per_thread, per_thread > 0 ? 256 : 0};
    if (fuser::cuda::cuda_variant(c.kernel, unit, vec).vec) {
      jobs.push_back({&c, unit, vec});
      turns.seen.insert("rows, " + variant_name(vec));
      ++vec_jobs;
    }
  }
  turns.expect_all(false, false, false, true);
  for (const char* v : {"rows, index32, vec", "rows, index64, vec", "rows, index32, vec, K 16",
                        "rows, index64, vec, K 16"})
    EXPECT_EQ(turns.seen.count(v), 1u) << v << " was never compiled";
  std::vector<std::string> failures(jobs.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) {
      const RowsCase& c = *jobs[i].c;
      const std::string symbol = symbol_of(c.kernel);
      std::string source;
      try {
        source = fuser::cuda::cuda_source(c.kernel, jobs[i].layout, symbol, jobs[i].variant);
        const fuser::cuda::CudaCompiled ptx = fuser::cuda::nvrtc_compile(
            source, symbol, kSm, CudaOutput::kPtx, fuser::cuda::cuda_compile_options());
        std::string missing;
        std::vector<std::string> entries = {symbol};
        if (c.kernel.num_globals > 0) entries.push_back(symbol + "_finish");
        if (c.kernel.num_columns() > 0) entries.push_back(symbol + "_columns");
        for (const std::string& e : entries)
          if (ptx.code.find(".entry " + e + "(") == std::string::npos) missing += " " + e;
        if (!ptx.log.empty() || !missing.empty())
          failures[i] = "log: " + ptx.log + "\nmissing entries:" + missing;
      } catch (const Error& e) {
        failures[i] = e.what();
      }
      if (!failures[i].empty())
        failures[i] += "\n" + variant_name(jobs[i].variant) + "\n" + c.kernel.str() + "\n" + source;
    }
  };
  std::thread helper(work);
  work();
  helper.join();
  for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(failures[i], "") << jobs[i].c->what;
}

// The fused rows kernels of the models: softmax, log_softmax, layer_norm, cross entropy (mean
// over the batch: a global reduction of row losses), GELU then a sum, global sum and mean, and
// column sums (a broadcast bias's gradient, and a layer_norm-like backward's weight and bias
// gradients), in float32 and float64.
std::vector<RowsCase> model_cases() {
  std::vector<RowsCase> cases;
  for (DType dtype : {kFloat32, kFloat64}) {
    const std::string t = dtype_name(dtype);
    Tensor x = testing::input({6, 40}, dtype, -3, 3);
    Tensor w = testing::input({40}, dtype), b = testing::input({40}, dtype);
    Tensor onehot = testing::input({6, 40}, dtype, 0, 1);
    struct Model {
      std::string name;
      Fn fn;
      Inputs inputs;
    };
    const std::vector<Model> models = {
        {"softmax", [](const Inputs& in) { return Inputs{softmax(in[0] * 2.0, -1)}; }, {x}},
        {"log_softmax", [](const Inputs& in) { return Inputs{log_softmax(in[0] + 1.0, -1)}; }, {x}},
        {"layer_norm",
         [](const Inputs& in) {
           Tensor mean = in[0].mean({-1}, true);
           Tensor d = in[0] - mean;
           Tensor var = (d * d).mean({-1}, true);
           return Inputs{d / sqrt(var + 1e-5) * in[1] + in[2]};
         },
         {x, w, b}},
        {"cross_entropy",
         [](const Inputs& in) {
           Tensor m = in[0].amax({-1}, true);
           Tensor lse = log(exp(in[0] - m).sum({-1}, true)) + m;
           return Inputs{((lse - in[0]) * in[1]).sum({-1}).mean()};
         },
         {x, onehot}},
        {"gelu_sum", [](const Inputs& in) { return Inputs{gelu(in[0], "none").sum({-1})}; }, {x}},
        {"global_sum_mean",
         [](const Inputs& in) {
           Tensor e = exp(in[0]);
           return Inputs{e.sum(), (in[0] * 3.0).mean()};
         },
         {x}},
        {"bias_grad",
         [](const Inputs& in) {
           Tensor g = tanh(in[0]) * in[1];
           return Inputs{g, g.sum({0})};
         },
         {x, w}},
        {"layer_norm_backward_columns",
         [](const Inputs& in) {
           Tensor xhat = in[0] - in[0].mean({-1}, true);
           Tensor g = in[1] * 0.5;
           return Inputs{g * xhat, (g * xhat).sum({0}), g.sum({0})};
         },
         {x, onehot}},
    };
    for (const Model& m : models) {
      std::vector<RowsCase> got = rows_cases_of(m.fn, m.inputs, m.name + " of " + t);
      EXPECT_GE(got.size(), 1u) << m.name << " of " << t << " has no rows kernel";
      cases.insert(cases.end(), got.begin(), got.end());
    }
  }
  return cases;
}

// ---- The launcher's arguments against the kernels' signatures ----

// The sizes of the parameters of `entry` in PTX text, in order (.u64 8, .u32 4, .b8 x[N] N, ...).
std::vector<size_t> ptx_param_bytes(const std::string& ptx, const std::string& entry) {
  std::vector<size_t> out;
  const size_t at = ptx.find(".entry " + entry + "(");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no entry " << entry << " in the PTX";
    return out;
  }
  const size_t end = ptx.find(')', at);
  std::string params = ptx.substr(at, end - at);
  for (size_t p = params.find(".param"); p != std::string::npos; p = params.find(".param", p + 1)) {
    const size_t line_end = params.find_first_of(",\n", p);
    const std::string decl = params.substr(p, line_end - p);
    size_t width = 0;
    for (const auto& [type, bytes] : std::vector<std::pair<std::string, size_t> >{{".u64", 8},
                                                                                  {".s64", 8},
                                                                                  {".f64", 8},
                                                                                  {".b64", 8},
                                                                                  {".u32", 4},
                                                                                  {".s32", 4},
                                                                                  {".f32", 4},
                                                                                  {".b32", 4},
                                                                                  {".u16", 2},
                                                                                  {".s16", 2},
                                                                                  {".b16", 2},
                                                                                  {".u8", 1},
                                                                                  {".s8", 1},
                                                                                  {".b8", 1}})
      if (decl.find(type + " ") != std::string::npos) {
        width = bytes;
        break;
      }
    const size_t bracket = decl.find('[');
    if (bracket != std::string::npos) width *= std::stoul(decl.substr(bracket + 1));
    EXPECT_GT(width, 0u) << "unknown parameter type in: " << decl;
    out.push_back(width);
  }
  return out;
}

// What the launcher passes for (kernel, layout) has the count and sizes of the parameters of the
// kernels of the variant the calls need: a mismatch would read garbage on a GPU, and only there.
void expect_calls_match(const Kernel& k, const Layout& layout,
                        const std::vector<fuser::cuda::KernelCall>& calls,
                        const std::string& what) {
  const std::string symbol = symbol_of(k);
  ASSERT_FALSE(calls.empty()) << what;
  for (const fuser::cuda::KernelCall& call : calls) EXPECT_EQ(call.variant, calls[0].variant);
  const std::string source = fuser::cuda::cuda_source(k, layout, symbol, calls[0].variant);
  const fuser::cuda::CudaCompiled ptx = fuser::cuda::nvrtc_compile(
      source, symbol, kSm, CudaOutput::kPtx, fuser::cuda::cuda_compile_options());
  std::vector<std::string> entries{symbol};
  if (layout.rows && k.num_globals > 0) entries.push_back(symbol + "_finish");
  if (layout.rows && k.num_columns() > 0) entries.push_back(symbol + "_columns");
  ASSERT_EQ(calls.size(), entries.size()) << what;
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].bytes, ptx_param_bytes(ptx.code, entries[i])) << what << ": " << entries[i];
    EXPECT_EQ(calls[i].args.size(), calls[i].bytes.size());
    EXPECT_GE(calls[i].grid, 1u);
    EXPECT_GE(calls[i].block, 1u);
  }
}

TEST(CudaCodegen, LaunchArgumentsMatchTheKernelSignatures) {
  // Elementwise: random programs (scalars of several dtypes, bool tensors), every layout kind,
  // and calls that need each variant in turn: n past 2^31 or strides reaching past it for 64-bit
  // indices, pointers off 16-byte alignment for the scalar loop.
  testing::RandomProgram gen(99);
  int kernels = 0;
  std::set<std::string> seen;
  for (int i = 0; i < 40; ++i) {
    Inputs in = gen.make_inputs();
    Fn fn = gen.make_program(2 + i % 7);
    if (testing::eager(fn, in).empty()) continue;
    const Grouped grouped = groups_of(fn, in);
    for (const FusionGroup& g : grouped.groups) {
      if (g.rows) continue;
      const Kernel& k = g.kernel;
      const size_t ptrs = k.input_types.size() + k.outputs.size();
      for (const auto& [name, layout] : layouts_of(k, g)) {
        const bool wide = kernels % 2 == 1, misaligned = kernels % 4 >= 2;
        const size_t rank = static_cast<size_t>(std::max(1, layout.rank));
        std::vector<int64_t> sizes(rank, 3), strides(rank * ptrs, wide ? int64_t{1} << 31 : 1);
        std::vector<char*> pointers(ptrs,
                                    reinterpret_cast<char*>(uintptr_t{misaligned ? 4097u : 4096u}));
        const int64_t n = layout.flat && wide ? int64_t{1} << 32 : 27;
        std::vector<fuser::cuda::KernelCall> calls;
        calls.push_back(fuser::cuda::elementwise_call(k, layout, n, sizes.data(), strides.data(),
                                                      pointers.data(), g.scalars.data(), 132));
        EXPECT_EQ(calls[0].variant.index32, !wide) << name;
        seen.insert(std::string(layout.flat ? "flat, " : "strided, ") +
                    variant_name(calls[0].variant));
        expect_calls_match(
            k, layout, calls,
            "program " + std::to_string(i) + ", " + name + ", " + variant_name(calls[0].variant));
        ++kernels;
      }
    }
  }
  EXPECT_GE(kernels, 40);
  for (const char* v : {"flat, index32", "flat, index32, vec", "flat, index64",
                        "flat, index64, vec", "strided, index32", "strided, index64"})
    EXPECT_EQ(seen.count(v), 1u) << v << " was never launched";
  // Rows: the models' kernels (row, global and column reductions), with 32-bit and 64-bit indices
  // in turn, and the vec variant where a contiguous layout's rows start aligned (rows of 4).
  int rows_kernels = 0;
  seen.clear();
  for (const RowsCase& c : model_cases()) {
    const bool wide = rows_kernels % 2 == 1;
    const Layout layout = rows_kernels++ % 4 == 0 ? unit_rows_layout(c) : c.layout;
    const size_t ptrs = c.kernel.input_types.size() + c.kernel.outputs.size();
    const size_t dims = static_cast<size_t>(layout.rank) + 1;
    std::vector<int64_t> sizes(dims, 4), strides(dims * ptrs, wide ? int64_t{1} << 31 : 1);
    for (size_t p = 0; p < ptrs && !wide; ++p)
      for (size_t d = 0; d + 1 < dims; ++d) strides[p * dims + d] = 4;
    std::vector<char*> pointers(ptrs, reinterpret_cast<char*>(uintptr_t{4096}));
    const fuser::cuda::CudaRowsLaunch geometry =
        fuser::cuda::cuda_rows_launch(c.kernel, layout, sizes.data(), strides.data());
    const std::vector<fuser::cuda::KernelCall> calls = fuser::cuda::rows_calls(
        c.kernel, layout, geometry, sizes.data(), strides.data(), pointers.data(), c.scalars.data(),
        reinterpret_cast<void*>(uintptr_t{8192}));
    EXPECT_EQ(calls.at(0).variant.index32, !wide) << c.what;
    seen.insert(variant_name(calls[0].variant));
    expect_calls_match(c.kernel, layout, calls, c.what + ", " + variant_name(calls[0].variant));
  }
  for (const char* v : {"index32", "index64", "index32, vec"})
    EXPECT_EQ(seen.count(v), 1u) << v << " was never launched";
}

// The gather kernel of index_select, gather and embedding, in every dtype: a clean compile, and the
// launch's parameters match its signature.
TEST(CudaCodegen, GatherKernelsCompileAndTheirLaunchesMatch) {
  for (DType t : {kFloat32, kFloat64, kInt32, kInt64, kBool}) {
    const std::string name = fuser::cuda::gather_name(t);
    const fuser::cuda::CudaCompiled ptx =
        fuser::cuda::nvrtc_compile(fuser::cuda::gather_source(t), name, kSm, CudaOutput::kPtx,
                                   fuser::cuda::cuda_compile_options());
    EXPECT_EQ(ptx.log, "") << name;
    const Tensor x = zeros({4, 5}, t), idx = zeros({3}, kInt64), out = zeros({4, 3}, t);
    const fuser::cuda::KernelCall call = fuser::cuda::gather_call(out, x, 1, idx, {0, 1}, 132);
    EXPECT_EQ(call.bytes, ptx_param_bytes(ptx.code, name)) << name;
  }
}

// A hand-written kernel's source (`name` in the messages) compiled by the host's C++ compiler and
// loaded, to run as one thread of one block: its grid-stride loop then covers every element.
// nullptr after a failure, which it reports.
void* load_on_host(const std::string& source, const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/kiln_cuda_" + name + "_" + std::to_string(getpid());
  if (std::system(("mkdir -p " + dir).c_str()) != 0) {
    ADD_FAILURE() << "cannot make " << dir;
    return nullptr;
  }
  const std::string unit =
      "#define __global__\nstruct kiln_dim3 { unsigned x; };\n"
      "static kiln_dim3 blockIdx{0}, blockDim{1}, gridDim{1}, threadIdx{0};\n" +
      source;
  {
    std::FILE* f = std::fopen((dir + "/" + name + ".cpp").c_str(), "w");
    if (!f) {
      ADD_FAILURE() << "cannot write in " << dir;
      return nullptr;
    }
    std::fwrite(unit.data(), 1, unit.size(), f);
    std::fclose(f);
  }
  const std::string lib = dir + "/" + name + ".so";
  if (std::system(("c++ -std=c++17 -O1 -ffp-contract=off -shared -fPIC -o " + lib + " " + dir +
                   "/" + name + ".cpp > " + dir + "/log.txt 2>&1")
                      .c_str()) != 0) {
    ADD_FAILURE() << "the host compile failed: see " << dir;
    return nullptr;
  }
  void* handle = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) ADD_FAILURE() << dlerror();
  return handle;
}

// The gather kernel's source run on the host computes index_select and gather as the CPU's
// reference kernels do, bit for bit.
TEST(CudaCodegen, GatherKernelsComputeWhatTheCpuComputes) {
  if (std::system("c++ --version > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "no host C++ compiler (c++) to run the gather kernel with";
  void* lib = load_on_host(fuser::cuda::gather_source(kFloat32), "gather");
  ASSERT_NE(lib, nullptr);
  struct Dims {
    long long v[3 * fuser::cuda::kGatherMaxRank];
  };
  using GatherFn = void (*)(long long, int, int, Dims, const float*, const long long*, float*);
  auto fn = reinterpret_cast<GatherFn>(dlsym(lib, fuser::cuda::gather_name(kFloat32).c_str()));
  ASSERT_NE(fn, nullptr);
  LazyGuard eager(false);
  const Tensor x = testing::input({5, 7, 3}, kFloat32, -3, 3);
  for (int64_t d = 0; d < 3; ++d) {
    for (const bool select : {true, false}) {
      Shape ishape = select ? Shape{4} : x.sizes();
      if (!select) ishape[static_cast<size_t>(d)] = 4;
      const Tensor index = testing::input(ishape, kInt64, 0, static_cast<double>(x.size(d)))
                               .clamp(int64_t{0}, x.size(d) - 1)
                               .contiguous();
      const Tensor expected = select ? index_select(x, d, index) : gather(x, d, index);
      Tensor out = zeros(expected.sizes());
      std::vector<int64_t> strides(3, 0);
      for (int64_t k = 0; k < 3; ++k)
        strides[static_cast<size_t>(k)] = select ? (k == d ? 1 : 0) : index.stride(k);
      const fuser::cuda::KernelCall call = fuser::cuda::gather_call(out, x, d, index, strides, 1);
      Dims dims;
      std::memcpy(dims.v, call.args[3], sizeof dims.v);
      fn(*static_cast<long long*>(call.args[0]), *static_cast<int*>(call.args[1]),
         *static_cast<int*>(call.args[2]), dims, x.data_ptr<float>(),
         reinterpret_cast<const long long*>(index.data_ptr<int64_t>()), out.data_ptr<float>());
      EXPECT_EQ(testing::values(out), testing::values(expected))
          << (select ? "index_select" : "gather") << " along " << d;
    }
  }
  dlclose(lib);
}

// The scatter-add kernel of index_add and scatter_add, in every dtype: a clean compile, and the
// launch's parameters match its signature.
TEST(CudaCodegen, ScatterAddKernelsCompileAndTheirLaunchesMatch) {
  for (DType t : {kFloat32, kFloat64, kInt32, kInt64, kBool}) {
    const std::string name = fuser::cuda::scatter_add_name(t);
    const fuser::cuda::CudaCompiled ptx =
        fuser::cuda::nvrtc_compile(fuser::cuda::scatter_add_source(t), name, kSm, CudaOutput::kPtx,
                                   fuser::cuda::cuda_compile_options());
    EXPECT_EQ(ptx.log, "") << name;
    const Tensor self = zeros({4, 5}, t), src = zeros({4, 3}, t), out = zeros({4, 5}, t);
    const Tensor lines = zeros({6}, kInt64);
    for (const bool select : {true, false}) {
      const fuser::cuda::KernelCall call = fuser::cuda::scatter_add_call(
          out, self, 1, select ? Shape{3} : Shape{4, 3}, src, lines, select, 132);
      EXPECT_EQ(call.bytes, ptx_param_bytes(ptx.code, name)) << name;
      EXPECT_EQ(call.args.size(), call.bytes.size());
    }
  }
}

// The scatter-add kernel's source run on the host computes index_add and scatter_add as the CPU's
// reference kernels do, bit for bit: many indices repeat (the adds must come in the CPU's order
// for float sums to match), along every dim, self and src contiguous or transposed views, and a
// scatter_add index smaller than self outside dim.
TEST(CudaCodegen, ScatterAddKernelsComputeWhatTheCpuComputes) {
  if (std::system("c++ --version > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "no host C++ compiler (c++) to run the scatter-add kernel with";
  void* lib = load_on_host(fuser::cuda::scatter_add_source(kFloat32), "scatter_add");
  ASSERT_NE(lib, nullptr);
  struct Dims {
    long long v[5 * fuser::cuda::kScatterMaxRank];
  };
  using ScatterFn = void (*)(long long, int, int, long long, Dims, const float*, const float*,
                             const long long*, float*);
  auto fn =
      reinterpret_cast<ScatterFn>(dlsym(lib, fuser::cuda::scatter_add_name(kFloat32).c_str()));
  ASSERT_NE(fn, nullptr);
  LazyGuard eager(false);
  // shape's values in a contiguous tensor, or in the transpose of one (of the reversed shape).
  const auto make = [](const Shape& shape, bool transposed) {
    if (!transposed) return testing::input(shape, kFloat32, -3, 3);
    return testing::input({shape[2], shape[1], shape[0]}, kFloat32, -3, 3).transpose(0, 2);
  };
  const Shape sizes{5, 7, 3};
  for (int64_t d = 0; d < 3; ++d) {
    for (const bool select : {true, false}) {
      for (const bool transposed : {false, true}) {
        const Tensor self = make(sizes, transposed);
        // 12 entries into at most 7 rows: every index line repeats values.
        Shape ishape = select ? Shape{12} : sizes;
        if (!select) {
          ishape[static_cast<size_t>(d)] = 12;
          ishape[static_cast<size_t>((d + 1) % 3)] -= 1;  // smaller than self outside dim
        }
        const Tensor index = testing::input(ishape, kInt64, 0, static_cast<double>(sizes[d]))
                                 .clamp(int64_t{0}, sizes[d] - 1)
                                 .contiguous();
        Shape sshape = ishape;
        if (select) {
          sshape = sizes;
          sshape[static_cast<size_t>(d)] = 12;
        }
        const Tensor src = make(sshape, transposed);
        const Tensor expected =
            select ? index_add(self, d, index, src) : scatter_add(self, d, index, src);
        const int64_t* ip = index.data_ptr<int64_t>();
        const std::vector<int64_t> idx(ip, ip + index.numel());
        const std::vector<int64_t> pairs =
            fuser::cuda::scatter_add_lines(idx, index.sizes(), select ? 0 : d);
        const Tensor lines = from_vector(pairs);
        Tensor out = zeros(sizes);
        const fuser::cuda::KernelCall call =
            fuser::cuda::scatter_add_call(out, self, d, index.sizes(), src, lines, select, 1);
        Dims dims;
        std::memcpy(dims.v, call.args[4], sizeof dims.v);
        fn(*static_cast<long long*>(call.args[0]), *static_cast<int*>(call.args[1]),
           *static_cast<int*>(call.args[2]), *static_cast<long long*>(call.args[3]), dims,
           self.data_ptr<float>(), src.data_ptr<float>(),
           reinterpret_cast<const long long*>(lines.data_ptr<int64_t>()), out.data_ptr<float>());
        EXPECT_EQ(testing::bytes(out), testing::bytes(expected))
            << (select ? "index_add" : "scatter_add") << " along " << d
            << (transposed ? ", transposed" : "");
      }
    }
  }
  dlclose(lib);
}

TEST(CudaCodegen, ModelRowsKernelsCompileForSm90) {
  compile_rows_cases(model_cases());
}

// The vec variant of float32 softmax (the generic loop and K = 16) loads and stores a row's quads
// with 16-byte accesses (v4 in PTX), and keeps them in the row cache the same way; the scalar
// variant moves one element per access. float64 kernels have no vec variant.
TEST(CudaCodegen, VecRowsKernelsMoveSixteenBytesPerAccess) {
  const std::vector<RowsCase> cases = model_cases();
  const RowsCase* softmax = nullptr;
  for (const RowsCase& c : cases)
    if (!softmax && c.what == "softmax of float32") softmax = &c;
  ASSERT_NE(softmax, nullptr);
  const Layout unit = unit_rows_layout(*softmax);
  const std::string symbol = symbol_of(softmax->kernel);
  auto ptx = [&](CudaCallFlags variant) {
    const std::string source = fuser::cuda::cuda_source(softmax->kernel, unit, symbol, variant);
    return fuser::cuda::nvrtc_compile(source, symbol, kSm, CudaOutput::kPtx,
                                      fuser::cuda::cuda_compile_options())
        .code;
  };
  auto has = [](const std::string& code, const std::string& what) {
    return code.find(what) != std::string::npos;
  };
  for (int per_thread : {0, 16}) {
    const std::string vec = ptx({true, true, per_thread, per_thread > 0 ? 256 : 0});
    EXPECT_TRUE(has(vec, "ld.global.nc.v4.f32") || has(vec, "ld.global.v4.f32")) << per_thread;
    EXPECT_TRUE(has(vec, "st.global.v4.f32")) << per_thread;
    if (per_thread == 0) {
      EXPECT_TRUE(has(vec, "st.shared.v4.f32") && has(vec, "ld.shared.v4.f32"));
    }
    const std::string scalar = ptx({true, false, per_thread, per_thread > 0 ? 256 : 0});
    EXPECT_FALSE(has(scalar, ".v4.f32")) << per_thread;
  }
  // The rule of cuda_variant: 4-byte (or bool) tensors, none strided along the row.
  Kernel wide = softmax->kernel;
  for (DType& t : wide.input_types) t = kFloat64;
  EXPECT_FALSE(fuser::cuda::cuda_variant(wide, unit, {true, true}).vec);
  EXPECT_TRUE(fuser::cuda::cuda_variant(softmax->kernel, unit, {true, true}).vec);
  Layout strided = unit;
  strided.inner[0] = Layout::kAny;
  EXPECT_FALSE(fuser::cuda::cuda_variant(softmax->kernel, strided, {true, true}).vec);
}

// Every reduction op of the op table with a formula, in every dtype it takes, over the last dim
// (row reductions), every dim (global) and the leading dim (a column exit where the op can be
// one), after an elementwise op so that they fuse.
std::vector<RowsCase> reduction_op_cases(std::set<std::string>& ops) {
  using detail::AttrValue;
  std::vector<RowsCase> cases;
  for (const detail::OpDef* def : detail::all_ops()) {
    if (def->kind != detail::OpKind::Reduction || !def->formula) continue;
    ops.insert(def->name);
    for (DType dtype : {kFloat32, kFloat64, kInt32, kInt64, kBool}) {
      for (int form = 0; form < 3; ++form) {
        // dims: [-1], every dim, [0]; the other attributes as each op names them.
        std::vector<int64_t> dims = form == 0   ? std::vector<int64_t>{1}
                                    : form == 1 ? std::vector<int64_t>{}
                                                : std::vector<int64_t>{0};
        detail::Attrs attrs;
        for (const std::string& name : def->attr_names) {
          if (name == "dims")
            attrs.push_back(AttrValue(dims));
          else if (name == "keepdim")
            attrs.emplace_back(form == 0);
          else if (name == "correction")
            attrs.push_back(AttrValue(int64_t{1}));
          else
            attrs.push_back(AttrValue());  // dtype: none
        }
        if (def->attr_names.empty() && form != 1) continue;  // max() and min(): every dim
        Inputs in = {testing::input({5, 7}, dtype, -3, 3), testing::input({5, 7}, kBool)};
        Fn fn = [def, attrs](const Inputs& in) {
          return Inputs{def->invoke({where(in[1], in[0], in[0])}, attrs).at(0)};
        };
        try {
          std::vector<RowsCase> got = rows_cases_of(
              fn, in, def->name + " of " + dtype_name(dtype) + ", form " + std::to_string(form),
              static_cast<size_t>(form));
          cases.insert(cases.end(), got.begin(), got.end());
        } catch (const Error&) {
          // The op does not take this dtype (mean of integers, ...).
        }
      }
    }
  }
  return cases;
}

TEST(CudaCodegen, EveryReductionOpCompilesForSm90) {
  std::set<std::string> ops;
  const std::vector<RowsCase> cases = reduction_op_cases(ops);
  std::set<std::string> fused;
  int globals = 0, columns = 0;
  for (const RowsCase& c : cases) {
    fused.insert(c.what.substr(0, c.what.find(' ')));
    globals += c.kernel.num_globals > 0;
    columns += c.kernel.num_columns() > 0;
  }
  for (const std::string& op : ops) EXPECT_EQ(fused.count(op), 1u) << op << " was not fused";
  EXPECT_GE(ops.size(), 8u);
  EXPECT_GE(globals, 10);
  EXPECT_GE(columns, 10);
  compile_rows_cases(cases);
  std::printf(
      "%zu reduction ops, %zu rows kernels (%d with global, %d with column reductions) "
      "compiled to PTX\n",
      ops.size(), cases.size(), globals, columns);
}

// The rows kernels of random reduction programs, until `count` programs gave at least one.
std::vector<RowsCase> random_reduction_cases(uint64_t seed, int count) {
  testing::RandomReductionProgram gen(seed);
  std::vector<RowsCase> cases;
  int programs = 0;
  for (int i = 0; i < 50 * count && programs < count; ++i) {
    Inputs in = gen.make_inputs();
    const Fn fn = [program = gen.make_program(2 + i % 7)](const Inputs& x) {
      return program(x, nullptr);
    };
    if (testing::eager(fn, in).empty()) continue;
    std::vector<RowsCase> got =
        rows_cases_of(fn, in, "seed " + std::to_string(seed) + ", program " + std::to_string(i),
                      static_cast<size_t>(i));
    programs += !got.empty();
    cases.insert(cases.end(), got.begin(), got.end());
  }
  EXPECT_GE(programs, count);
  return cases;
}

TEST(CudaCodegen, RandomReductionProgramsCompileForSm90) {
  const std::vector<RowsCase> cases = random_reduction_cases(20261129, 40);
  int globals = 0, columns = 0;
  for (const RowsCase& c : cases) {
    globals += c.kernel.num_globals > 0;
    columns += c.kernel.num_columns() > 0;
  }
  compile_rows_cases(cases);
  std::printf(
      "%zu rows kernels of random programs (%d with global, %d with column reductions) "
      "compiled to PTX\n",
      cases.size(), globals, columns);
}

// A launcher's index32 and vec: 32-bit only while every index and offset fits, 4-wide only for
// kernels of 4-byte and bool tensors whose pointers are aligned to 4 elements.
TEST(CudaCodegen, CallFlagsFollowTheLaunchRules) {
  Kernel k;
  k.input_types = {kFloat32, kBool};
  const int32_t x = k.add({fuser::Prim::Load, kFloat32, -1, -1, -1, 0});
  const int32_t m = k.add({fuser::Prim::Load, kBool, -1, -1, -1, 1});
  k.outputs = {k.add({fuser::Prim::Select, kFloat32, m, x, x})};
  k.output_types = {kFloat32};
  alignas(16) static char buffer[256];
  char* aligned[] = {buffer, buffer + 64, buffer + 128};
  char* shifted[] = {buffer + 4, buffer + 64, buffer + 128};  // float32 input off by one element
  char* bool_shifted[] = {buffer, buffer + 65, buffer + 128};
  Layout flat;
  flat.single_element = {false, false};
  const int64_t threads = 1 << 20;
  auto flags = fuser::cuda::cuda_call_flags(k, flat, 1000, nullptr, nullptr, aligned, threads);
  EXPECT_TRUE(flags.index32);
  EXPECT_TRUE(flags.vec);
  EXPECT_FALSE(fuser::cuda::cuda_call_flags(k, flat, 1000, nullptr, nullptr, shifted, threads).vec);
  EXPECT_FALSE(
      fuser::cuda::cuda_call_flags(k, flat, 1000, nullptr, nullptr, bool_shifted, threads).vec);
  flat.single_element = {true, false};  // a single element is read as such, never 4-wide
  EXPECT_TRUE(fuser::cuda::cuda_call_flags(k, flat, 1000, nullptr, nullptr, shifted, threads).vec);
  EXPECT_FALSE(
      fuser::cuda::cuda_call_flags(k, flat, int64_t{1} << 31, nullptr, nullptr, aligned, threads)
          .index32);
  EXPECT_TRUE(
      fuser::cuda::cuda_call_flags(k, flat, INT32_MAX, nullptr, nullptr, aligned, threads).index32);
  Kernel wide = k;  // float64 tensors have no 4-wide loop
  wide.input_types[0] = kFloat64;
  flat.single_element = {false, false};
  EXPECT_FALSE(
      fuser::cuda::cuda_call_flags(wide, flat, 1000, nullptr, nullptr, aligned, threads).vec);
  // ... so its variants are the scalar ones (one binary for vec and not).
  EXPECT_FALSE(fuser::cuda::cuda_variant(wide, flat, {true, true}).vec);
  EXPECT_TRUE(fuser::cuda::cuda_variant(k, flat, {true, true}).vec);
  EXPECT_TRUE(fuser::cuda::cuda_variant(k, flat, {false, true}) == CudaCallFlags({false, true}));

  // Strided: offsets reach sum (size - 1) * |stride| per pointer.
  Layout strided;
  strided.flat = false;
  strided.rank = 2;
  strided.inner = {Layout::kUnit, Layout::kAny, Layout::kUnit};
  const int64_t sizes[] = {1000, 1000};
  const int64_t small[] = {1000, 1, -1000, 1, 1000, 1};
  const int64_t far[] = {1000, 1, 1000, 2200000, 1000, 1};   // 999 * 2.2e6 > 2^31
  const int64_t edge[] = {1000, 1, 1000, 2148633, 1000, 1};  // 999000 + 999 * 2148633 < 2^31
  const int64_t past[] = {1000, 1, 1000, 2148634, 1000, 1};  // 999000 + 999 * 2148634 > 2^31
  EXPECT_TRUE(
      fuser::cuda::cuda_call_flags(k, strided, 1000000, sizes, small, aligned, threads).index32);
  EXPECT_FALSE(
      fuser::cuda::cuda_call_flags(k, strided, 1000000, sizes, far, aligned, threads).index32);
  EXPECT_TRUE(
      fuser::cuda::cuda_call_flags(k, strided, 1000000, sizes, edge, aligned, threads).index32);
  EXPECT_FALSE(
      fuser::cuda::cuda_call_flags(k, strided, 1000000, sizes, past, aligned, threads).index32);
  EXPECT_FALSE(
      fuser::cuda::cuda_call_flags(k, strided, 1000000, sizes, small, aligned, int64_t{1} << 32)
          .index32);
  EXPECT_FALSE(
      fuser::cuda::cuda_call_flags(k, strided, 1000000, sizes, small, aligned, threads).vec);
  EXPECT_FALSE(fuser::cuda::cuda_variant(k, strided, {true, true}).vec);
  EXPECT_TRUE(fuser::cuda::cuda_variant(k, strided, {true, true}).index32);

  // Rows (rank 1: 10 rows of 64): vec where every kUnit pointer's rows start at a multiple of 4
  // elements (4 bytes for bool), kZero pointers as they come; never with a kAny pointer or a
  // tensor of another width.
  Layout rows;
  rows.flat = false;
  rows.rows = true;
  rows.rank = 1;
  rows.inner = {Layout::kUnit, Layout::kZero, Layout::kUnit};
  const int64_t row_sizes[] = {10, 64};
  auto rows_vec = [&](const Kernel& kernel, const Layout& layout, const int64_t* strides,
                      char* const* ptrs) {
    return fuser::cuda::cuda_call_flags(kernel, layout, 10, row_sizes, strides, ptrs, 10).vec;
  };
  const int64_t row_strides[] = {64, 1, 1, 0, 64, 1};
  char* bool_row_shifted[] = {buffer, buffer + 65, buffer + 128};  // kZero: read as it is
  char* bool_unit_shifted[] = {buffer, buffer + 65, buffer + 128};
  EXPECT_TRUE(rows_vec(k, rows, row_strides, aligned));
  EXPECT_TRUE(rows_vec(k, rows, row_strides, bool_row_shifted));
  EXPECT_FALSE(rows_vec(k, rows, row_strides, shifted));
  EXPECT_FALSE(rows_vec(k, rows, row_strides, nullptr));  // a geometry without pointers
  const int64_t odd_pitch[] = {65, 1, 1, 0, 64, 1};  // rows of 65 floats: every other misaligned
  EXPECT_FALSE(rows_vec(k, rows, odd_pitch, aligned));
  const int64_t one_row_sizes[] = {1, 64};  // one row: its outer stride never moves a pointer
  EXPECT_TRUE(fuser::cuda::cuda_call_flags(k, rows, 1, one_row_sizes, odd_pitch, aligned, 1).vec);
  Layout bool_unit = rows;
  bool_unit.inner[1] = Layout::kUnit;
  const int64_t bool_strides[] = {64, 1, 4, 1, 64, 1};
  const int64_t bool_odd[] = {64, 1, 2, 1, 64, 1};
  char* bool_at_4[] = {buffer, buffer + 68, buffer + 128};
  EXPECT_TRUE(rows_vec(k, bool_unit, bool_strides, bool_at_4));  // bools: 4-byte quads
  EXPECT_FALSE(rows_vec(k, bool_unit, bool_strides, bool_unit_shifted));
  EXPECT_FALSE(rows_vec(k, bool_unit, bool_odd, aligned));
  Layout any = rows;
  any.inner[0] = Layout::kAny;
  EXPECT_FALSE(rows_vec(k, any, row_strides, aligned));
  EXPECT_FALSE(rows_vec(wide, rows, row_strides, aligned));
  EXPECT_FALSE(fuser::cuda::cuda_variant(wide, rows, {true, true}).vec);
  EXPECT_FALSE(fuser::cuda::cuda_variant(k, any, {true, true}).vec);
  EXPECT_TRUE(fuser::cuda::cuda_variant(k, rows, {true, true, 16, 256}) ==
              CudaCallFlags({true, true, 16, 256}));
}

// Launch geometry, pinned for a few shapes: the grids and blocks of elementwise calls (256 threads,
// 4 elements per thread when flat, at most 32 blocks per multiprocessor) and of rows launches by
// the default policy (cuda_codegen.h), and the per_thread variant a policy change asks for.
TEST(CudaCodegen, LaunchGeometriesFollowTheRules) {
  Kernel k;
  k.input_types = {kFloat32};
  k.outputs = {k.add({fuser::Prim::Load, kFloat32, -1, -1, -1, 0})};
  k.output_types = {kFloat32};
  alignas(16) static char buffer[64];
  char* ptrs[] = {buffer, buffer + 32};
  Layout flat;
  flat.single_element = {false};
  Layout strided;
  strided.flat = false;
  strided.rank = 1;
  strided.inner = {Layout::kAny, Layout::kUnit};
  const int64_t sizes[] = {1000000}, strides[] = {2, 1};
  struct Elementwise {
    const Layout& layout;
    int64_t n;
    unsigned grid;
  };
  for (const Elementwise& e :
       {Elementwise{flat, 1000000, 977}, Elementwise{flat, 1, 1},
        Elementwise{flat, int64_t{1} << 40, 4224}, Elementwise{strided, 1000000, 3907}}) {
    const fuser::cuda::KernelCall call =
        fuser::cuda::elementwise_call(k, e.layout, e.n, sizes, strides, ptrs, nullptr, 132);
    EXPECT_EQ(call.grid, e.grid) << e.n << (e.layout.flat ? " flat" : " strided");
    EXPECT_EQ(call.block, 256u);
  }

  // Rows: a kernel of each kind from the models (row reductions only, global, column ones), of
  // rank 1 or more (rank 0 has one row).
  const RowsCase *row = nullptr, *global = nullptr, *column = nullptr;
  const std::vector<RowsCase> cases = model_cases();
  for (const RowsCase& c : cases) {
    const bool g = c.kernel.num_globals > 0, col = c.kernel.num_columns() > 0;
    if (c.layout.rank < 1) continue;
    if (!g && !col && !row) row = &c;
    if (g && !col && !global) global = &c;
    if (col && !column) column = &c;
  }
  ASSERT_TRUE(row && global && column);
  struct Rows {
    const RowsCase* c;
    int64_t rows, R;
    int threads, per_thread;
    int64_t blocks;
  };
  const Rows expected[] = {
      {row, 1000, 1000, 256, 0, 1000},  {row, 3, 100000, 512, 0, 3},
      {row, 100000, 8, 32, 0, 65536},   {global, 5000, 64, 32, 0, 1024},
      {column, 4096, 300, 128, 4, 512}, {column, 10, 5000, 512, 16, 10},
      {column, 10, 10000, 512, 0, 10},
  };
  auto launch = [](const Rows& e, int64_t stride) {
    const size_t ptrs = e.c->kernel.input_types.size() + e.c->kernel.outputs.size();
    const size_t dims = static_cast<size_t>(e.c->layout.rank) + 1;
    std::vector<int64_t> sizes{e.rows};  // the outer dims (rank 1 or more), then the row
    sizes.resize(dims - 1, 1);
    sizes.push_back(e.R);
    const std::vector<int64_t> strides(dims * ptrs, stride);
    return fuser::cuda::cuda_rows_launch(e.c->kernel, e.c->layout, sizes.data(), strides.data());
  };
  for (const Rows& e : expected) {
    const std::string what =
        e.c->what + ", " + std::to_string(e.rows) + " rows of " + std::to_string(e.R);
    const fuser::cuda::CudaRowsLaunch g = launch(e, 1);
    EXPECT_EQ(g.threads, e.threads) << what;
    EXPECT_EQ(g.per_thread, e.per_thread) << what;
    EXPECT_EQ(g.blocks, e.blocks) << what;
    EXPECT_TRUE(g.index32) << what;
    const Kernel& kk = e.c->kernel;
    const int64_t stride =
        kk.num_globals > 0 || kk.num_columns() > 0 ? kk.partials_per_call(e.R) : 0;
    EXPECT_EQ(g.stride, stride) << what;
    EXPECT_EQ(g.partials_bytes, g.blocks * stride * 8) << what;
    int32_t widest = 0;
    for (int32_t parts : kk.column_parts) widest = std::max(widest, parts);
    EXPECT_EQ(g.column_positions, widest * e.R) << what;
    EXPECT_EQ(g.columns_threads, kk.num_columns() > 0 ? 128 : 0) << what;
    EXPECT_EQ(g.columns_blocks, kk.num_columns() > 0 ? (widest * e.R + 127) / 128 : 0) << what;
    EXPECT_FALSE(launch(e, int64_t{1} << 31).index32) << what;
  }
  // The register variant for kernels without column reductions, when the policy asks for it.
  const fuser::cuda::CudaRowsPolicy before = fuser::cuda::cuda_rows_policy();
  fuser::cuda::CudaRowsPolicy registers = before;
  registers.registers_without_columns = true;
  fuser::cuda::set_cuda_rows_policy(registers);
  const fuser::cuda::CudaRowsLaunch g = launch({row, 1000, 1000, 0, 0, 0}, 1);
  fuser::cuda::set_cuda_rows_policy(before);
  EXPECT_EQ(g.threads, 256);
  EXPECT_EQ(g.per_thread, 4);
  // The vec variant where the pointers allow it, unless the policy turns it off.
  EXPECT_TRUE(launch({row, 1000, 1000, 0, 0, 0}, 1).vec);
  fuser::cuda::CudaRowsPolicy scalar = before;
  scalar.vec = false;
  fuser::cuda::set_cuda_rows_policy(scalar);
  const bool vec_off = launch({row, 1000, 1000, 0, 0, 0}, 1).vec;
  fuser::cuda::set_cuda_rows_policy(before);
  EXPECT_FALSE(vec_off);
}

size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// The generic variant keeps every load that several passes read in a row cache of its own (the
// backward of softmax, s = sum(x * g) then x * (g - s): both x and g), one after another in the
// dynamic shared memory; a launch gives room to the first ones that fit its budget, each row
// rounded up to 16 bytes; a load read by one pass is not kept.
TEST(CudaCodegen, RowCachesHoldEveryLoadSeveralPassesRead) {
  for (DType dtype : {kFloat32, kFloat64}) {
    const Inputs in = {testing::input({6, 40}, dtype), testing::input({6, 40}, dtype),
                       testing::input({6, 40}, dtype)};
    const std::vector<RowsCase> two = rows_cases_of(
        [](const Inputs& x) {
          return Inputs{x[0] * (x[1] - (x[0] * x[1]).sum({-1}, true)) + x[2]};
        },
        in, "softmax's backward");
    ASSERT_EQ(two.size(), 1u);
    const int size = static_cast<int>(element_size(dtype));
    EXPECT_EQ(fuser::cuda::cuda_row_caches(two[0].kernel, two[0].layout),
              (std::vector<int>{size, size}))
        << two[0].kernel.str();
    const std::string source =
        fuser::cuda::cuda_source(two[0].kernel, two[0].layout, "k", {true, false});
    EXPECT_EQ(count_of(source, "_fits = kiln_smem_end <= kiln_dynamic_shared_bytes()"), 2u)
        << source;
    // A tensor with one value a row (a saved row statistic) is read there, not kept.
    Layout row_constant = two[0].layout;
    row_constant.inner[1] = Layout::kZero;
    EXPECT_EQ(fuser::cuda::cuda_row_caches(two[0].kernel, row_constant), (std::vector<int>{size}));
    const std::vector<RowsCase> one = rows_cases_of(
        [](const Inputs& x) { return Inputs{x[0] / x[0].sum({-1}, true)}; }, in, "a row's shares");
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(fuser::cuda::cuda_row_caches(one[0].kernel, one[0].layout), (std::vector<int>{size}));
  }
  using fuser::cuda::rows_shared_bytes;
  EXPECT_EQ(rows_shared_bytes({4, 4}, 8192, 96 << 10), 65536u);
  EXPECT_EQ(rows_shared_bytes({4, 4}, 8192, 48 << 10), 32768u);  // the first only
  EXPECT_EQ(rows_shared_bytes({4, 4}, 8193, 96 << 10), 2u * 32784);
  EXPECT_EQ(rows_shared_bytes({4, 4}, 30000, 96 << 10), 0u);  // none: the first does not fit
  EXPECT_EQ(rows_shared_bytes({8, 4}, 3, 1 << 20), 48u);
  EXPECT_EQ(rows_shared_bytes({}, 8192, 96 << 10), 0u);
}

// ---------------------------------------------------------- semantics, checked on the host
// Without a GPU the generated kernels still run: their source is plain C++ but for CUDA's
// qualifiers, thread indices, vector types and bit casts, so the host compiler builds it (with
// shims for those) into a shared library, where each kernel runs as a grid of threads taken one
// after another (the elements are independent, so the order is immaterial), flat (scalar and 4-wide
// loops) and strided (transposed and broadcast operands), with 32-bit and 64-bit indices, on the
// same special and random values as the LLVM emitter's kernel. Outputs must be bit-equal (any NaN
// for a NaN). Kernels with transcendental functions are left out here (the rows kernels below run
// them): an fmadd inside them may round once or twice by the CPU (see cuda_codegen.h). What the
// host cannot show: CUDA's own float-to-integer conversion (x86's is what the prelude's guard
// gives).

// A lib/math primitive with fmadd inside: every one but pow (fuser/primitives.h's table).
bool has_transcendental(const Kernel& k) {
  for (const fuser::Instr& in : k.body)
    if (fuser::prim_info(in.prim).math && in.prim != fuser::Prim::Pow) return true;
  return false;
}

const char* host_storage_type(DType t) {
  switch (t) {
    case kBool:
      return "unsigned char";
    case kInt32:
      return "int";
    case kInt64:
      return "long long";
    case kFloat32:
      return "float";
    case kFloat64:
      return "double";
  }
  return "?";
}

constexpr const char* kHostShims = R"(#include <math.h>
#include <string.h>
#define __device__
#define __global__
#define __launch_bounds__(threads)
#define __forceinline__ inline
struct kiln_dim3 {
  unsigned x, y, z;
};
static kiln_dim3 blockIdx, threadIdx, blockDim, gridDim;
struct float4 {
  float x, y, z, w;
};
struct int4 {
  int x, y, z, w;
};
struct uchar4 {
  unsigned char x, y, z, w;
};
static inline int __float_as_int(float f) {
  int i;
  memcpy(&i, &f, sizeof i);
  return i;
}
static inline long long __double_as_longlong(double d) {
  long long i;
  memcpy(&i, &d, sizeof i);
  return i;
}
static inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, sizeof f);
  return f;
}
static inline double __longlong_as_double(long long i) {
  double d;
  memcpy(&d, &i, sizeof d);
  return d;
}
template <typename T>
static T kiln_scalar(const unsigned long long* s, int i) {
  T v;
  memcpy(&v, s + i, sizeof v);
  return v;
}
// Runs a kernel as a grid of 3 blocks of 5 threads, one thread after another.
template <typename F>
static void kiln_grid(F run) {
  blockDim.x = 5;
  gridDim.x = 3;
  for (blockIdx.x = 0; blockIdx.x < gridDim.x; ++blockIdx.x)
    for (threadIdx.x = 0; threadIdx.x < blockDim.x; ++threadIdx.x) run();
}
)";

// Kernel source `source` (its prelude cut off) in namespace `ns`, and
// `extern "C" void <ns>_run(long long n, const long long* dims, void* const* ptrs,
// const unsigned long long* scalars)` that runs its kernel `symbol` on a grid; `dims` (sizes then
// strides) for strided kernels.
std::string host_kernel(const Kernel& k, const Layout& layout, const std::string& source,
                        const std::string& symbol, const std::string& ns) {
  const size_t body = source.find("KILN_D void kiln_body(");
  EXPECT_NE(body, std::string::npos);
  // The math device functions the kernel calls (pow: no fmadd inside), each guarded, before it.
  std::string s;
  const std::string start = "#ifndef KILN_MATH_", end = "#endif  // KILN_MATH_";
  for (size_t at = source.find(start); at < body; at = source.find(start, at + 1))
    s += source.substr(at, source.find('\n', source.find(end, at)) + 1 - at);
  s += "namespace " + ns + " {\n" + source.substr(body) + "}\n";
  s += "extern \"C\" void " + ns +
       "_run(long long n, const long long* dims, void* const* ptrs, "
       "const unsigned long long* scalars) {\n";
  std::string args = layout.flat ? "" : ", d";
  if (!layout.flat)
    s += "  " + ns + "::KilnDims d;\n  memcpy(&d, dims, sizeof d);\n";
  else
    s += "  (void)dims;\n";
  const size_t inputs = k.input_types.size();
  auto ptr = [&](size_t p, DType t, bool in) {
    return std::string(", (") + (in ? "const " : "") + host_storage_type(t) + "*)ptrs[" +
           std::to_string(p) + "]";
  };
  for (size_t p = 0; p < inputs; ++p) args += ptr(p, k.input_types[p], true);
  for (size_t o = 0; o < k.outputs.size(); ++o) args += ptr(inputs + o, k.output_types[o], false);
  for (size_t i = 0; i < k.scalar_types.size(); ++i)
    args += std::string(", kiln_scalar<") + host_storage_type(k.scalar_types[i]) + ">(scalars, " +
            std::to_string(i) + ")";
  s += "  kiln_grid([&] { " + ns + "::" + symbol + "(n" + args + "); });\n}\n";
  return s;
}

// n values of type t, as bytes: the special values where the primitives' cases meet, then random
// ones.
std::vector<char> test_values(DType t, size_t n, std::mt19937_64& rng) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  static const std::vector<double> floats = {
      nan,  inf,   -inf, 0.0,   -0.0, 0.5,   -0.5, 1.0,   -1.0,   1.5,    2.5,  -2.5,
      2.0,  3.0,   -3.0, 64.0,  65.0, -64.0, 7.25, 1e-3,  1e10,   -1e10,  3e9,  -3e9,
      1e19, -1e19, 1e30, 1e-40, 4.5,  -4.5,  0.3,  1e300, -1e300, 1e-310, 33.0, -0.75};
  static const std::vector<double> ints = {0,  1,  -1, 2,  3,   -2, -3, -7,  64,
                                           65, 31, 32, 63, -64, 5,  10, 100, -100};
  std::vector<char> bytes(n * element_size(t));
  std::uniform_real_distribution<double> uniform(-8.0, 8.0);
  std::uniform_int_distribution<int64_t> any_int(std::numeric_limits<int64_t>::min(),
                                                 std::numeric_limits<int64_t>::max());
  for (size_t i = 0; i < n; ++i) {
    const size_t pick = rng() % 4;
    char* dst = bytes.data() + i * element_size(t);
    if (is_floating_point(t)) {
      double v = pick == 0   ? uniform(rng)
                 : pick == 1 ? std::round(uniform(rng) * 2) / 2
                             : floats[rng() % floats.size()];
      if (t == kFloat32) {
        const auto f = static_cast<float>(v);
        std::memcpy(dst, &f, sizeof f);
      } else {
        std::memcpy(dst, &v, sizeof v);
      }
    } else if (t == kBool) {
      *dst = static_cast<char>(rng() % 2);
    } else {
      int64_t v = pick == 0   ? any_int(rng)
                  : pick == 1 ? static_cast<int64_t>(uniform(rng))
                              : static_cast<int64_t>(ints[rng() % ints.size()]);
      if (pick == 3 && rng() % 4 == 0)
        v = rng() % 2 ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();
      if (t == kInt32) {
        auto w = static_cast<int32_t>(v);
        if (pick == 3 && rng() % 8 == 0) w = std::numeric_limits<int32_t>::min();
        std::memcpy(dst, &w, sizeof w);
      } else {
        std::memcpy(dst, &v, sizeof v);
      }
    }
  }
  return bytes;
}

bool same_value(DType t, const char* a, const char* b) {
  if (std::memcmp(a, b, element_size(t)) == 0) return true;
  if (t == kFloat32) {
    float x, y;
    std::memcpy(&x, a, sizeof x);
    std::memcpy(&y, b, sizeof y);
    return std::isnan(x) && std::isnan(y);
  }
  if (t == kFloat64) {
    double x, y;
    std::memcpy(&x, a, sizeof x);
    std::memcpy(&y, b, sizeof y);
    return std::isnan(x) && std::isnan(y);
  }
  return false;
}

// Element (i, j) of an R x C iteration shape in memory laid out as `inner` says: kUnit row-major,
// kAny transposed (column-major), kZero one value per row (broadcast along the row).
constexpr int64_t kRows = 7, kCols = 13, kElements = kRows * kCols;  // n % 4 == 3: a tail
int64_t memory_index(Layout::Inner inner, int64_t i, int64_t j) {
  return inner == Layout::kUnit ? i * kCols + j : inner == Layout::kAny ? j * kRows + i : i;
}
std::vector<int64_t> strides_of(Layout::Inner inner) {
  return inner == Layout::kUnit  ? std::vector<int64_t>{kCols, 1}
         : inner == Layout::kAny ? std::vector<int64_t>{1, kRows}
                                 : std::vector<int64_t>{1, 0};
}

// The kernels (without transcendental functions) of random programs run from their CUDA source on
// the host, flat and strided, in every variant (32-bit and 64-bit indices; 4-wide and scalar
// loops where the kernel has a 4-wide one), and by the LLVM emitter: bit-equal.
TEST(CudaCodegen, GeneratedKernelsComputeWhatTheLlvmEmitterComputes) {
  if (std::system("c++ --version > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "no host C++ compiler (c++) to run the generated kernels with";
  struct Case {
    Kernel kernel;
    std::vector<uint64_t> scalars;
    std::string what;
    Layout flat, strided;
    std::vector<CudaCallFlags> flat_variants, strided_variants;
  };
  std::vector<Case> cases;
  const auto add_cases = [&cases](const Grouped& grouped, const std::string& what) {
    for (const FusionGroup& g : grouped.groups) {
      if (g.rows || has_transcendental(g.kernel)) continue;
      Case c{g.kernel, g.scalars, what, {}, {}, {}, {}};
      const size_t inputs = g.kernel.input_types.size(), outputs = g.kernel.outputs.size();
      c.flat.single_element.assign(inputs, false);
      c.strided.flat = false;
      c.strided.rank = 2;
      // Inputs unit, transposed and broadcast in turn; outputs unit and transposed.
      for (size_t p = 0; p < inputs; ++p)
        c.strided.inner.push_back(static_cast<Layout::Inner>((p + cases.size()) % 3));
      for (size_t o = 0; o < outputs; ++o)
        c.strided.inner.push_back((o + cases.size()) % 2 ? Layout::kAny : Layout::kUnit);
      c.flat_variants = variants_of(c.kernel, c.flat);
      c.strided_variants = variants_of(c.kernel, c.strided);
      cases.push_back(std::move(c));
    }
  };
  testing::RandomProgram gen(20261128);
  for (int i = 0; i < 3000 && cases.size() < 250; ++i) {
    Inputs in = gen.make_inputs();
    Fn fn = gen.make_program(2 + i % 9);
    if (testing::eager(fn, in).empty()) continue;
    add_cases(groups_of(fn, in), "program " + std::to_string(i));
  }
  ASSERT_GE(cases.size(), 150u);
  // The random programs have no bitwise ops: in CUDA C bools promote to int for & | ^.
  for (DType t : {kBool, kInt32, kInt64}) {
    Inputs in;
    for (int i = 0; i < 4; ++i) in.push_back(testing::input({kRows, kCols}, t, -50, 50));
    add_cases(groups_of(bitwise_mask_chain, in),
              std::string("bitwise mask chain of ") + dtype_name(t));
  }
  const std::string dir = ::testing::TempDir() + "/kiln_cuda_host_" + std::to_string(getpid());
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  // Each variant's source is another kernel (namespace flat<case>_<variant>, strided...). Their
  // sources must differ, or a variant would silently run another's loop.
  std::string unit = kHostShims;
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& cs = cases[c];
    const std::string id = std::to_string(c);
    for (const bool is_flat : {true, false}) {
      const Layout& layout = is_flat ? cs.flat : cs.strided;
      const std::vector<CudaCallFlags>& variants = is_flat ? cs.flat_variants : cs.strided_variants;
      std::set<std::string> same_symbol;
      for (size_t v = 0; v < variants.size(); ++v) {
        const std::string symbol = (is_flat ? "kf" : "ks") + id + "_" + std::to_string(v);
        const std::string source = fuser::cuda::cuda_source(cs.kernel, layout, symbol, variants[v]);
        if (unit.size() == std::strlen(kHostShims))
          unit += source.substr(0, source.find("KILN_D void kiln_body("));
        unit += host_kernel(cs.kernel, layout, source, symbol,
                            (is_flat ? "flat" : "strided") + id + "_" + std::to_string(v));
        same_symbol.insert(fuser::cuda::cuda_source(cs.kernel, layout, "kiln_s", variants[v]));
      }
      EXPECT_EQ(same_symbol.size(), variants.size()) << cs.what << ": variants of the same source";
    }
  }
  {
    std::FILE* f = std::fopen((dir + "/kernels.cpp").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fwrite(unit.data(), 1, unit.size(), f);
    std::fclose(f);
  }
  // No contraction (as --fmad=false), no fast-math: IEEE arithmetic as the LLVM emitter's; the
  // 4-wide loop reads float arrays through float4, as CUDA does.
  const std::string command =
      "c++ -std=c++17 -O1 -ffp-contract=off -fno-fast-math -fno-strict-aliasing -shared -fPIC "
      "-o " +
      dir + "/kernels.so " + dir + "/kernels.cpp > " + dir + "/log.txt 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << "the host compile failed: see " << dir;
  void* lib = dlopen((dir + "/kernels.so").c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  using HostFn = void (*)(long long, const long long*, void* const*, const unsigned long long*);
  std::mt19937_64 rng(11);
  const auto n = static_cast<size_t>(kElements);
  size_t compared = 0;
  std::map<std::string, size_t> runs_of;  // kernels run per layout kind and variant
  for (size_t c = 0; c < cases.size() && !HasFailure(); ++c) {
    const Kernel& k = cases[c].kernel;
    const Layout& strided = cases[c].strided;
    const std::string id = std::to_string(c);
    const size_t num_inputs = k.input_types.size(), num_ptrs = num_inputs + k.outputs.size();
    // Each input's values as the flat kernels read them (row-major), and as the strided one does.
    std::vector<std::vector<char> > flat_in, strided_in;
    for (size_t p = 0; p < num_inputs; ++p) {
      const DType t = k.input_types[p];
      const size_t size = element_size(t);
      const Layout::Inner inner = strided.inner[p];
      std::vector<char> memory = test_values(t, inner == Layout::kZero ? kRows : n, rng);
      std::vector<char> rows(n * size);
      for (int64_t i = 0; i < kRows; ++i)
        for (int64_t j = 0; j < kCols; ++j)
          std::memcpy(rows.data() + (i * kCols + j) * size,
                      memory.data() + memory_index(inner, i, j) * size, size);
      flat_in.push_back(std::move(rows));
      strided_in.push_back(std::move(memory));
    }
    auto outputs = [&] {
      std::vector<std::vector<char> > out;
      for (DType t : k.output_types) out.emplace_back(n * element_size(t), 0);
      return out;
    };
    auto pointers = [&](std::vector<std::vector<char> >& in, std::vector<std::vector<char> >& out) {
      std::vector<char*> ptrs;
      for (auto& v : in) ptrs.push_back(v.data());
      for (auto& v : out) ptrs.push_back(v.data());
      return ptrs;
    };
    // The LLVM emitter's flat kernel gives the expected outputs, row-major.
    Layout flat_layout = cases[c].flat;
    const fuser::CompiledKernel cpu = fuser::cpu_kernel(k, flat_layout);
    std::vector<std::vector<char> > want = outputs();
    std::vector<char*> cpu_ptrs = pointers(flat_in, want);
    cpu.fn(0, kElements, cpu_ptrs.data(), nullptr, nullptr, cases[c].scalars.data(), nullptr);
    std::vector<long long> dims = {kRows, kCols};
    for (size_t p = 0; p < num_ptrs; ++p)
      for (int64_t st : strides_of(strided.inner[p])) dims.push_back(st);
    const auto* scalars = reinterpret_cast<const unsigned long long*>(cases[c].scalars.data());
    const size_t num_flat = cases[c].flat_variants.size();
    for (size_t run = 0; run < num_flat + cases[c].strided_variants.size() && !HasFailure();
         ++run) {
      const bool is_flat = run < num_flat;
      const size_t v = is_flat ? run : run - num_flat;
      const CudaCallFlags variant =
          is_flat ? cases[c].flat_variants[v] : cases[c].strided_variants[v];
      const std::string name = (is_flat ? "flat" : "strided") + id + "_" + std::to_string(v);
      auto fn = reinterpret_cast<HostFn>(dlsym(lib, (name + "_run").c_str()));
      ASSERT_NE(fn, nullptr) << name;
      ++runs_of[std::string(is_flat ? "flat, " : "strided, ") + variant_name(variant)];
      std::vector<std::vector<char> > got = outputs();
      std::vector<char*> ptrs = pointers(is_flat ? flat_in : strided_in, got);
      fn(kElements, dims.data(), reinterpret_cast<void* const*>(ptrs.data()), scalars);
      for (size_t o = 0; o < want.size(); ++o) {
        const DType t = k.output_types[o];
        const size_t size = element_size(t);
        const Layout::Inner inner = is_flat ? Layout::kUnit : strided.inner[num_inputs + o];
        for (int64_t e = 0; e < kElements; ++e) {
          const int64_t m = memory_index(inner, e / kCols, e % kCols);
          if (same_value(t, want[o].data() + e * size, got[o].data() + m * size)) continue;
          ADD_FAILURE() << cases[c].what << " (" << (is_flat ? "flat" : "strided") << ", "
                        << variant_name(variant) << "), output " << o << ", element " << e
                        << " differs\n"
                        << k.str();
          break;
        }
        ++compared;
      }
    }
  }
  dlclose(lib);
  // Every variant ran, on many kernels.
  for (const char* v : {"flat, index32", "flat, index32, vec", "flat, index64",
                        "flat, index64, vec", "strided, index32", "strided, index64"})
    EXPECT_GE(runs_of[v], 20u) << v;
  std::printf("%zu kernels, %zu outputs of %lld elements bit-equal to the LLVM emitter's\n",
              cases.size(), compared, static_cast<long long>(kElements));
  for (const auto& [v, count] : runs_of) std::printf("  %s: %zu kernels run\n", v.c_str(), count);
}

// ------------------------------------------------ rows kernels, run on the host
// Generated rows kernels run on the host too: each CUDA thread of a block is a fiber (ucontext),
// __syncthreads() a barrier at which every fiber of the block yields to a scheduler that resumes
// them once all have arrived, and __shfl_xor_sync a write of the value to the lane's slot, a
// barrier, and a read of the partner lane's slot (two sets of slots, alternating, so that a slot
// is never rewritten before every lane has read it). So the real generated code runs: per-thread
// folds, the warp butterflies and the shared memory between warps, bands of rows per block, the
// finish and columns kernels. Transcendental functions are the generated ones (lib/math/
// primitives.h rendered as device functions, which the LLVM emitter's kernels compute too; their
// fmadd is the host's fma, fused as LLVM's is on a host with FMA), so softmax and layer_norm run
// too. The outputs are compared
// with the LLVM emitter's rows kernel, finish and columns functions called over the same bands of
// rows (calls = blocks): bit for bit, but for kernels with floating sums, whose order differs
// (see cuda_codegen.h): those within rtol 1e-5, atol 1e-5 (float32) or 1e-12 (float64) of it
// (on these inputs most sums are exact in double, so most of these are bit-equal too).
constexpr const char* kFiberShims = R"(#include <stdlib.h>
#include <ucontext.h>
#define __shared__ static
// The row caches: the block's (static) shared memory, room for every row these tests make.
#define KILN_ROW_CACHE(name) alignas(16) static unsigned char name[1 << 18]
static unsigned kiln_dynamic_shared_bytes() { return 1u << 18; }
// A quad access (16 bytes; 4 for bool) at an address it would fault at on a GPU: counted (the
// grid reports it), and sent to a scratch quad instead (the host's aligned moves would fault).
static unsigned kiln_misaligned;
template <typename T>
static T* kiln_quad_at(T* p) {
  alignas(16) static unsigned char scratch[16];
  if ((unsigned long long)p % (4 * sizeof(T)) == 0) return p;
  ++kiln_misaligned;
  return (T*)scratch;
}
#define KILN_QUAD_AT(p) kiln_quad_at(p)
struct KilnFiber {
  ucontext_t context;
  int state;  // 0 runnable, 1 at a barrier, 2 returned
};
static KilnFiber kiln_fibers[1024];
static ucontext_t kiln_scheduler;
static unsigned kiln_current;
static void (*kiln_entry)(void*);
static void* kiln_entry_arg;
static unsigned long long kiln_slots[2][1024];
static unsigned kiln_shuffles[1024];
static void kiln_barrier() {
  kiln_fibers[kiln_current].state = 1;
  swapcontext(&kiln_fibers[kiln_current].context, &kiln_scheduler);
}
static void __syncthreads() { kiln_barrier(); }
template <typename T>
static T __shfl_xor_sync(unsigned, T v, int lanes) {
  const unsigned t = threadIdx.x, set = kiln_shuffles[t]++ & 1u;
  memcpy(&kiln_slots[set][t], &v, sizeof v);
  kiln_barrier();
  T r;
  memcpy(&r, &kiln_slots[set][t ^ (unsigned)lanes], sizeof r);
  return r;
}
static void kiln_fiber_main() {
  kiln_entry(kiln_entry_arg);
  kiln_fibers[kiln_current].state = 2;
}
// Runs `run` as a grid of blocks of `threads` fibers, one block after another. Returns 0, -1
// when some threads of a block returned while others waited at a barrier, or -3 when a quad
// access was misaligned.
template <typename F>
static int kiln_fiber_grid(unsigned blocks, unsigned threads, F run) {
  const size_t stack = 1 << 16;
  char* stacks = (char*)malloc(stack * threads);
  kiln_entry = [](void* f) { (*(F*)f)(); };
  kiln_entry_arg = &run;
  blockDim.x = threads;
  gridDim.x = blocks;
  int status = 0;
  kiln_misaligned = 0;
  for (blockIdx.x = 0; blockIdx.x < blocks && status == 0; ++blockIdx.x) {
    for (unsigned t = 0; t < threads; ++t) {
      KilnFiber& f = kiln_fibers[t];
      getcontext(&f.context);
      f.context.uc_stack.ss_sp = stacks + t * stack;
      f.context.uc_stack.ss_size = stack;
      f.context.uc_link = &kiln_scheduler;
      makecontext(&f.context, kiln_fiber_main, 0);
      f.state = 0;
      kiln_shuffles[t] = 0;
    }
    for (;;) {
      unsigned waiting = 0, done = 0;
      for (unsigned t = 0; t < threads; ++t) {
        if (kiln_fibers[t].state == 0) {
          kiln_current = t;
          threadIdx.x = t;
          swapcontext(&kiln_scheduler, &kiln_fibers[t].context);
        }
        waiting += kiln_fibers[t].state == 1;
        done += kiln_fibers[t].state == 2;
      }
      if (done == threads) break;
      if (done > 0) {
        status = -1;
        break;
      }
      for (unsigned t = 0; t < threads; ++t) kiln_fibers[t].state = 0;
    }
  }
  free(stacks);
  return status == 0 && kiln_misaligned > 0 ? -3 : status;
}
)";

// The source of a rows kernel (its preludes cut off) in namespace `ns`, and
// `extern "C" int <ns>_run(int which, unsigned blocks, unsigned threads, long long rows,
// const long long* dims, void* const* ptrs, const unsigned long long* scalars,
// unsigned long long* partials, long long stride, long long R)` that runs its rows kernel
// (which 0, on `blocks` blocks of `threads` threads), finish kernel (1) or columns kernel (2).
// The transcendental device functions a generated source carries (each guarded by
// KILN_MATH_<name>), for a translation unit of several kernels.
std::string math_functions_of(const std::string& source) {
  std::string functions;
  for (size_t at = source.find("#ifndef KILN_MATH_"); at != std::string::npos;
       at = source.find("#ifndef KILN_MATH_", at)) {
    const size_t end = source.find('\n', source.find("#endif  // KILN_MATH_", at));
    functions += source.substr(at, end + 1 - at);
    at = end;
  }
  return functions;
}

std::string host_rows_kernel(const Kernel& k, const std::string& source, const std::string& symbol,
                             const std::string& ns) {
  const size_t start = source.find("\nstruct KilnRowsDims");
  EXPECT_NE(start, std::string::npos);
  std::string s = "namespace " + ns + " {\n" + source.substr(start) + "}\n";
  s += "extern \"C\" __attribute__((visibility(\"default\"))) int " + ns +
       "_run(int which, unsigned blocks, unsigned threads, long long rows, "
       "const long long* dims, void* const* ptrs, const unsigned long long* scalars, "
       "unsigned long long* partials, long long stride, long long R) {\n";
  std::string args;
  const size_t inputs = k.input_types.size();
  auto ptr = [&](size_t p, DType t, bool in) {
    return std::string(", (") + (in ? "const " : "") + host_storage_type(t) + "*)ptrs[" +
           std::to_string(p) + "]";
  };
  for (size_t p = 0; p < inputs; ++p) args += ptr(p, k.input_types[p], true);
  for (size_t o = 0; o < k.outputs.size(); ++o) args += ptr(inputs + o, k.output_types[o], false);
  for (size_t i = 0; i < k.scalar_types.size(); ++i)
    args += std::string(", kiln_scalar<") + host_storage_type(k.scalar_types[i]) + ">(scalars, " +
            std::to_string(i) + ")";
  const bool has_partials = k.num_globals > 0 || k.num_columns() > 0;
  s +=
      "  " + ns + "::KilnRowsDims d;\n  memcpy(&d, dims, sizeof d);\n  (void)R;\n  (void)stride;\n";
  s += "  if (which == 0)\n    return kiln_fiber_grid(blocks, threads, [&] { " + ns +
       "::" + symbol + "(rows, d" + args + (has_partials ? ", partials" : "") + "); });\n";
  if (k.num_globals > 0)
    s += "  if (which == 1)\n    return kiln_fiber_grid(1, 1, [&] { " + ns + "::" + symbol +
         "_finish(blocks, stride, partials" + args + "); });\n";
  if (k.num_columns() > 0)
    s += "  if (which == 2)\n    return kiln_fiber_grid(3, 32, [&] { " + ns + "::" + symbol +
         "_columns(blocks, stride, R, partials" + args + "); });\n";
  s += "  (void)partials;\n  return -2;\n}\n";
  return s;
}

std::string value_text(DType t, const char* bytes) {
  char buf[64];
  switch (t) {
    case kFloat32: {
      float f;
      std::memcpy(&f, bytes, sizeof f);
      std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(f));
      break;
    }
    case kFloat64: {
      double d;
      std::memcpy(&d, bytes, sizeof d);
      std::snprintf(buf, sizeof buf, "%.17g", d);
      break;
    }
    case kInt32: {
      int32_t i;
      std::memcpy(&i, bytes, sizeof i);
      std::snprintf(buf, sizeof buf, "%d", i);
      break;
    }
    case kInt64: {
      int64_t i;
      std::memcpy(&i, bytes, sizeof i);
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(i));
      break;
    }
    case kBool:
      std::snprintf(buf, sizeof buf, "%d", static_cast<int>(*bytes));
      break;
  }
  return buf;
}

// Floating sums and products may reassociate: their results may differ in the last bits.
bool has_float_sum_or_product(const Kernel& k) {
  for (const fuser::Instr& in : k.body)
    if ((in.prim == fuser::Prim::ReduceSum || in.prim == fuser::Prim::ReduceProd) &&
        is_floating_point(in.type))
      return true;
  return false;
}

// Values for the rows kernels: floats mostly multiples of 1/8 in [-4, 4] (sums of them, and of
// exp of their differences, are exact in double in any order), sometimes NaN, infinities and
// signed zeros; integers anywhere in their range; bools.
std::vector<char> rows_test_values(DType t, size_t n, std::mt19937_64& rng) {
  if (!is_floating_point(t)) return test_values(t, n, rng);
  std::vector<char> bytes(n * element_size(t));
  const double inf = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < n; ++i) {
    const uint64_t pick = rng() % 96;
    const double v = pick == 0   ? std::nan("")
                     : pick == 1 ? inf
                     : pick == 2 ? -inf
                     : pick == 3 ? -0.0
                                 : static_cast<double>(static_cast<int64_t>(rng() % 65) - 32) / 8;
    char* dst = bytes.data() + i * element_size(t);
    if (t == kFloat32) {
      const auto f = static_cast<float>(v);
      std::memcpy(dst, &f, sizeof f);
    } else {
      std::memcpy(dst, &v, sizeof v);
    }
  }
  return bytes;
}

// One run of a rows case: sizes (outer dims, then R), per pointer its strides (rank + 1), the
// element its first element sits at in its buffer and the buffer's length, and the geometry.
struct RowsRun {
  std::vector<int64_t> sizes, strides, base, length;
  Layout layout;
  unsigned blocks = 1, threads = 32;
  bool index32 = true;  // the variant ...
  bool vec = false;
  int per_thread = 0;  // ... and its positions per thread (0: the generic loop)
  CudaCallFlags variant() const { return {index32, vec, per_thread, static_cast<int>(threads)}; }
};

// How a case's pointer p moves: along the row (an element per position), once per row (a per-row
// input, a row-level output), or not at all (global and column outputs, written at element 0).
enum class Moves { kElement, kRow, kNone };
Moves pointer_moves(const RowsCase& c, const std::vector<fuser::Level>& level, size_t p) {
  const Kernel& k = c.kernel;
  const size_t inputs = k.input_types.size();
  if (p < inputs)
    return p < c.input_outer.size() && c.input_outer[p] ? Moves::kRow : Moves::kElement;
  const size_t o = p - inputs;
  const fuser::Level l = level[static_cast<size_t>(k.outputs[o])];
  const bool row_level = l == fuser::Level::kRow || l == fuser::Level::kConst;
  if (l == fuser::Level::kElement ||
      (o < k.output_per_element.size() && k.output_per_element[o] && row_level))
    return Moves::kElement;
  return row_level ? Moves::kRow : Moves::kNone;
}

// A pointer of strides `st` added to the run: its base (past the elements a negative stride
// reaches), its buffer's length (at least `min_length`) and its layout's inner kind.
void add_pointer(RowsRun& r, const std::vector<int64_t>& st, int64_t min_length) {
  const size_t rank = st.size() - 1;
  int64_t reach = 0, back = 0;
  for (size_t d = 0; d <= rank; ++d) {
    const int64_t extent = std::max<int64_t>(0, r.sizes[d] - 1) * std::abs(st[d]);
    reach += extent;
    if (st[d] < 0) back += extent;
  }
  r.base.push_back(back);
  r.length.push_back(std::max<int64_t>(reach + 1, min_length));
  r.strides.insert(r.strides.end(), st.begin(), st.end());
  r.layout.inner.push_back(st[rank] == 0   ? Layout::kZero
                           : st[rank] == 1 ? Layout::kUnit
                                           : Layout::kAny);
}

int64_t widest_column(const Kernel& k) {
  int64_t widest = 0;
  for (int32_t parts : k.column_parts) widest = std::max<int64_t>(widest, parts);
  return widest;
}

RowsRun make_rows_run(const RowsCase& c, std::mt19937_64& rng) {
  const Kernel& k = c.kernel;
  const size_t inputs = k.input_types.size(), np = inputs + k.outputs.size();
  const auto rank = static_cast<size_t>(c.rank);
  RowsRun r;
  static const int64_t lengths[] = {0, 1, 1, 3, 31, 64, 100, 129};
  static const int64_t outer[] = {1, 2, 3, 5, 0};
  for (size_t d = 0; d < rank; ++d)
    r.sizes.push_back(outer[rng() % (rank > 1 ? 3 : (rng() % 8 ? 4 : 5))]);
  r.sizes.push_back(lengths[rng() % 8]);
  const int64_t R = r.sizes[rank];
  const std::vector<fuser::Level> level = fuser::instr_levels(k);
  r.layout.flat = false;
  r.layout.rows = true;
  r.layout.rank = c.rank;
  for (size_t p = 0; p < np; ++p) {
    // Which dims the pointer steps through, in which order (innermost first), how far apart.
    std::vector<int64_t> st(rank + 1, 0);
    const Moves moves = pointer_moves(c, level, p);
    const bool per_row = moves == Moves::kRow;
    if (moves != Moves::kNone) {
      std::vector<size_t> order;
      for (size_t d = 0; d <= rank; ++d)
        if (!(per_row && d == rank)) order.push_back(d);
      const uint64_t form = rng() % 4;  // row-major, column-major, padded, reversed row
      if (form == 1) std::reverse(order.begin(), order.end());
      int64_t step = form == 2 ? 2 : 1;
      for (auto it = order.rbegin(); it != order.rend(); ++it) {
        st[*it] = step;
        step *= std::max<int64_t>(1, r.sizes[*it]);
      }
      // Inputs broadcast along a dim now and then.
      if (p < inputs)
        for (size_t d = 0; d <= rank; ++d)
          if (rng() % 6 == 0) st[d] = 0;
      if (form == 3 && !per_row) st[rank] = -st[rank];
    }
    add_pointer(r, st, moves == Moves::kNone ? std::max<int64_t>(1, widest_column(k) * R) : 1);
  }
  static const unsigned threads[] = {32, 64, 96};
  static const unsigned blocks[] = {1, 2, 3, 5};
  r.threads = threads[rng() % 3];
  r.blocks = blocks[rng() % 4];
  r.index32 = rng() % 2 == 0;
  // Half of the runs where a row fits K positions per thread take the per_thread variant, with
  // one of the K that fit.
  std::vector<int> fits;
  for (int per_thread : {4, 8, 16, 32, 64})
    if (R <= per_thread * int64_t{r.threads}) fits.push_back(per_thread);
  if (!fits.empty() && rng() % 2 == 0) r.per_thread = fits[rng() % fits.size()];
  return r;
}

// A run that the vec variant may take: 3 rows (rank 1; 3 x 2 x ... for more outer dims) of R in
// 2 blocks of `threads`, every pointer that moves along the row contiguous along it, its rows
// padded to start at multiples of 4 elements, and now and then an input that every row shares.
RowsRun aligned_rows_run(const RowsCase& c, int64_t R, unsigned threads) {
  const Kernel& k = c.kernel;
  const size_t inputs = k.input_types.size(), np = inputs + k.outputs.size();
  const auto rank = static_cast<size_t>(c.rank);
  RowsRun r;
  for (size_t d = 0; d < rank; ++d) r.sizes.push_back(d == 0 ? 3 : 2);
  r.sizes.push_back(R);
  r.layout.flat = false;
  r.layout.rows = true;
  r.layout.rank = c.rank;
  const int64_t pitch = (R + 3) / 4 * 4 + 4;
  const std::vector<fuser::Level> level = fuser::instr_levels(k);
  for (size_t p = 0; p < np; ++p) {
    std::vector<int64_t> st(rank + 1, 0);
    const Moves moves = pointer_moves(c, level, p);
    if (moves != Moves::kNone) {
      int64_t step = moves == Moves::kElement ? pitch : 1;
      if (moves == Moves::kElement) st[rank] = 1;
      for (size_t d = rank; d-- > 0;) {
        st[d] = step;
        step *= r.sizes[d];
      }
      if (p < inputs && moves == Moves::kElement && p % 3 == 2)
        std::fill(st.begin(), st.begin() + static_cast<std::ptrdiff_t>(rank), 0);
    }
    add_pointer(r, st, moves == Moves::kNone ? std::max<int64_t>(1, widest_column(k) * R) : 1);
  }
  r.threads = threads;
  r.blocks = 2;
  return r;
}

DType pointer_type(const Kernel& k, size_t p) {
  const size_t inputs = k.input_types.size();
  return p < inputs ? k.input_types[p] : k.output_types[p - inputs];
}

using Buffers = std::vector<std::vector<char> >;

// The run's outputs as the kernels find them (0x5a everywhere), and the pointers at each tensor's
// first element (its base element into its buffer).
Buffers rows_outputs(const Kernel& k, const RowsRun& r) {
  Buffers out;
  const size_t inputs = k.input_types.size();
  for (size_t p = inputs; p < inputs + k.outputs.size(); ++p)
    out.emplace_back(static_cast<size_t>(r.length[p]) * element_size(pointer_type(k, p)),
                     static_cast<char>(0x5a));
  return out;
}
std::vector<char*> rows_pointers(const Kernel& k, const RowsRun& r, Buffers& in, Buffers& out) {
  std::vector<char*> ptrs;
  const size_t inputs = k.input_types.size();
  for (size_t p = 0; p < inputs + k.outputs.size(); ++p) {
    char* data = p < inputs ? in[p].data() : out[p - inputs].data();
    ptrs.push_back(data + r.base[p] * static_cast<int64_t>(element_size(pointer_type(k, p))));
  }
  return ptrs;
}

int64_t rows_of(const RowsRun& r) {
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < r.sizes.size(); ++d) rows *= r.sizes[d];
  return rows;
}

// The LLVM emitter's rows kernel, finish and columns functions over the run's bands of rows
// (calls = blocks): their outputs.
Buffers llvm_rows_outputs(const RowsCase& c, const RowsRun& r, Buffers& in) {
  const Kernel& k = c.kernel;
  const int64_t rows = rows_of(r), R = r.sizes.back(), stride = k.partials_per_call(R);
  const fuser::CompiledKernel cpu = fuser::cpu_kernel(k, r.layout);
  Buffers want = rows_outputs(k, r);
  std::vector<char*> ptrs = rows_pointers(k, r, in, want);
  std::vector<uint64_t> partials(static_cast<size_t>(std::max<int64_t>(1, r.blocks * stride)));
  const int64_t chunk = (rows + r.blocks - 1) / r.blocks;
  for (int64_t b = 0; b < r.blocks; ++b)
    cpu.fn(std::min(rows, b * chunk), std::min(rows, (b + 1) * chunk), ptrs.data(), r.sizes.data(),
           r.strides.data(), c.scalars.data(), partials.data() + b * stride);
  if (k.num_globals > 0)
    cpu.finish(r.blocks, stride, partials.data(), ptrs.data(), c.scalars.data());
  if (k.num_columns() > 0)
    cpu.columns(0, widest_column(k) * R, r.blocks, stride, R, partials.data(), ptrs.data(),
                c.scalars.data());
  return want;
}

using RowsHostFn = int (*)(int, unsigned, unsigned, long long, const long long*, void* const*,
                           const unsigned long long*, unsigned long long*, long long, long long);

// The generated kernels' outputs on the host (`fn`: the run's rows<i>_run) in `got`: 0, or the
// status of the first kernel that failed (-1: a barrier some threads never reached; -3: a
// misaligned quad access).
int host_rows_outputs(RowsHostFn fn, const RowsCase& c, const RowsRun& r, Buffers& in,
                      Buffers& got) {
  const Kernel& k = c.kernel;
  const int64_t rows = rows_of(r), R = r.sizes.back(), stride = k.partials_per_call(R);
  got = rows_outputs(k, r);
  std::vector<char*> ptrs = rows_pointers(k, r, in, got);
  std::vector<uint64_t> partials(static_cast<size_t>(std::max<int64_t>(1, r.blocks * stride)),
                                 0x5a5a5a5a5a5a5a5aull);
  std::vector<long long> dims(r.sizes.begin(), r.sizes.end());
  dims.insert(dims.end(), r.strides.begin(), r.strides.end());
  const auto* scalars = reinterpret_cast<const unsigned long long*>(c.scalars.data());
  auto* gpu_partials = reinterpret_cast<unsigned long long*>(partials.data());
  auto* gpu_ptrs = reinterpret_cast<void* const*>(ptrs.data());
  for (int which = 0; which <= 2; ++which) {
    if (which == 1 ? k.num_globals == 0 : which == 2 && k.num_columns() == 0) continue;
    const int status = fn(which, r.blocks, r.threads, rows, dims.data(), gpu_ptrs, scalars,
                          gpu_partials, stride, R);
    if (status != 0) return status;
  }
  return 0;
}

// The first output element where `got` differs from `want` ("" when none): bit for bit (any NaN
// for a NaN), or, when `tolerant` and the kernel has floating sums, within their tolerance.
// Counts the elements equal and close.
std::string rows_difference(const Kernel& k, const Buffers& want, const Buffers& got, bool tolerant,
                            size_t& exact, size_t& close) {
  const bool sums = tolerant && has_float_sum_or_product(k);
  for (size_t o = 0; o < want.size(); ++o) {
    const DType t = k.output_types[o];
    const size_t size = element_size(t);
    for (size_t e = 0; e < want[o].size() / size; ++e) {
      const char* w = want[o].data() + e * size;
      const char* g = got[o].data() + e * size;
      if (same_value(t, w, g)) {
        ++exact;
        continue;
      }
      if (sums && is_floating_point(t)) {
        double x, y;
        if (t == kFloat32) {
          float fx, fy;
          std::memcpy(&fx, w, sizeof fx);
          std::memcpy(&fy, g, sizeof fy);
          x = fx;
          y = fy;
        } else {
          std::memcpy(&x, w, sizeof x);
          std::memcpy(&y, g, sizeof y);
        }
        const double tol = t == kFloat32 ? 1e-5 : 1e-12;
        if (std::isfinite(x) && std::isfinite(y) && std::abs(x - y) <= tol * std::abs(x) + tol) {
          ++close;
          continue;
        }
      }
      return "output " + std::to_string(o) + ", element " + std::to_string(e) +
             " differs: " + value_text(t, w) + " vs " + value_text(t, g);
    }
  }
  return "";
}

// The repository's root (for lib/fastmath.h), from this file's path as the compiler saw it:
// absolute, or relative to the build directory (this binary's parent's parent) or to the working
// directory. "" when not found.
std::string repository_root() {
  std::string file = __FILE__, root;
  file = file.substr(0, file.rfind("tests/fuser/"));
  char exe[4096] = {0};
  const ssize_t exe_length = readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string build = exe_length > 0 ? std::string(exe, static_cast<size_t>(exe_length)) : ".";
  for (int up = 0; up < 2; ++up) build = build.substr(0, build.rfind('/'));
  for (const std::string& candidate : {file, build + "/" + file, "./" + file})
    if (root.empty() && std::ifstream(candidate + "/lib/fastmath.h")) root = candidate;
  return root;
}

// Rows kernels built on the host into one library, `sources[i]` (a kernel and its source, whose
// entry is kr<i>) as namespace <name><i>, run by <name><i>_run (host_rows_kernel). Null, with a
// failure reported, when the build fails. Only the entries are exported.
void* build_rows_library(const std::string& root,
                         const std::vector<std::pair<const Kernel*, std::string> >& sources,
                         const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/kiln_cuda_" + name + "_" + std::to_string(getpid());
  EXPECT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  std::string unit = std::string(kHostShims) + kFiberShims;
  for (size_t i = 0; i < sources.size(); ++i) {
    const std::string& source = sources[i].second;
    if (i == 0) unit += source.substr(0, source.find("\nstruct KilnRowsDims"));
    unit += math_functions_of(source);
    unit += host_rows_kernel(*sources[i].first, source, "kr" + std::to_string(i),
                             name + std::to_string(i));
  }
  std::FILE* f = std::fopen((dir + "/rows.cpp").c_str(), "w");
  if (!f) {
    ADD_FAILURE() << "cannot write " << dir << "/rows.cpp";
    return nullptr;
  }
  std::fwrite(unit.data(), 1, unit.size(), f);
  std::fclose(f);
  const std::string command =
      "c++ -std=c++17 -O1 -ffp-contract=off -fno-fast-math -fno-strict-aliasing -shared -fPIC "
      "-fvisibility=hidden -I" +
      root + " -o " + dir + "/rows.so " + dir + "/rows.cpp > " + dir + "/log.txt 2>&1";
  if (std::system(command.c_str()) != 0) {
    ADD_FAILURE() << "the host compile failed: see " << dir;
    return nullptr;
  }
  void* lib = dlopen((dir + "/rows.so").c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) ADD_FAILURE() << dlerror();
  return lib;
}

RowsHostFn rows_entry(void* lib, const std::string& name, size_t i) {
  return reinterpret_cast<RowsHostFn>(dlsym(lib, (name + std::to_string(i) + "_run").c_str()));
}

std::string run_text(const RowsCase& c, const RowsRun& r) {
  return c.what + ", sizes " + ::testing::PrintToString(r.sizes) + ", strides " +
         ::testing::PrintToString(r.strides) + ", " + std::to_string(r.blocks) + " blocks of " +
         std::to_string(r.threads) + ", index32 " + std::to_string(r.index32) + ", vec " +
         std::to_string(r.vec) + ", per_thread " + std::to_string(r.per_thread);
}

TEST(CudaCodegen, GeneratedRowsKernelsComputeWhatTheLlvmEmitterComputes) {
  if (std::system("c++ --version > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "no host C++ compiler (c++) to run the generated kernels with";
  const std::string root = repository_root();
  if (root.empty()) GTEST_SKIP() << "lib/fastmath.h not found from " << __FILE__;
  std::vector<RowsCase> cases = model_cases();
  const size_t num_models = cases.size();
  {
    std::set<std::string> ops;
    const std::vector<RowsCase> more = reduction_op_cases(ops);
    for (size_t i = 0; i < more.size(); i += 2) cases.push_back(more[i]);
    const std::vector<RowsCase> random = random_reduction_cases(20261130, 25);
    cases.insert(cases.end(), random.begin(), random.end());
  }
  // The runs first: a kernel is generated for each run's layout and variant. The models' kernels
  // run twice.
  std::mt19937_64 rng(12);
  std::vector<std::pair<size_t, RowsRun> > runs;
  for (size_t c = 0; c < cases.size(); ++c)
    for (size_t repeat = 0; repeat < (c < num_models ? 2u : 1u); ++repeat)
      runs.emplace_back(c, make_rows_run(cases[c], rng));
  std::vector<std::pair<const Kernel*, std::string> > sources;
  for (size_t i = 0; i < runs.size(); ++i) {
    const Kernel& k = cases[runs[i].first].kernel;
    sources.emplace_back(
        &k, fuser::cuda::cuda_source(k, runs[i].second.layout, "kr" + std::to_string(i),
                                     runs[i].second.variant()));
  }
  void* lib = build_rows_library(root, sources, "rows");
  ASSERT_NE(lib, nullptr);
  size_t exact = 0, close = 0, index32_runs = 0, per_thread_runs = 0;
  for (size_t i = 0; i < runs.size() && !HasFailure(); ++i) {
    const RowsCase& c = cases[runs[i].first];
    const RowsRun& r = runs[i].second;
    const Kernel& k = c.kernel;
    const RowsHostFn fn = rows_entry(lib, "rows", i);
    ASSERT_NE(fn, nullptr);
    Buffers in;
    for (size_t p = 0; p < k.input_types.size(); ++p)
      in.push_back(rows_test_values(k.input_types[p], static_cast<size_t>(r.length[p]), rng));
    const Buffers want = llvm_rows_outputs(c, r, in);
    index32_runs += r.index32;
    per_thread_runs += r.per_thread > 0;
    Buffers got;
    ASSERT_EQ(host_rows_outputs(fn, c, r, in, got), 0)
        << "a barrier not reached by every thread: " << run_text(c, r) << "\n"
        << k.str();
    const std::string difference = rows_difference(k, want, got, true, exact, close);
    EXPECT_EQ(difference, "") << run_text(c, r) << " (LLVM vs CUDA)\n" << k.str();
  }
  dlclose(lib);
  // Both variants ran, each on many kernels.
  EXPECT_GE(index32_runs, runs.size() / 4);
  EXPECT_GE(runs.size() - index32_runs, runs.size() / 4);
  EXPECT_GE(per_thread_runs, runs.size() / 5);
  EXPECT_GE(runs.size() - per_thread_runs, runs.size() / 4);
  std::printf(
      "%zu rows kernels, %zu runs (%zu with 32-bit indices, %zu with K positions per thread): %zu "
      "output elements bit-equal to the LLVM emitter's, %zu within the tolerance of floating "
      "sums\n",
      cases.size(), runs.size(), index32_runs, per_thread_runs, exact, close);
}

// Every variant of a rows kernel takes the same positions of a row per thread (quads) and folds
// them in the same order, so on the same geometry the vec variant (16-byte quad accesses), the
// scalar loop and the per_thread variants (registers) give the same bits, for rows of every
// length modulo 4 and every block size, with row, global and column reductions; the scalar loop's
// equal the LLVM emitter's (within the tolerance of floating sums, as above). The host's quad
// accesses check their alignment (a GPU's would fault): a vec kernel run on a misaligned row
// reports it, and the launch rule gives such a call the scalar variant.
TEST(CudaCodegen, RowsVariantsGiveTheSameBits) {
  if (std::system("c++ --version > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "no host C++ compiler (c++) to run the generated kernels with";
  const std::string root = repository_root();
  if (root.empty()) GTEST_SKIP() << "lib/fastmath.h not found from " << __FILE__;
  // The kernels with a vec variant: the models' in float32, and random programs'.
  std::vector<RowsCase> cases;
  std::vector<RowsCase> candidates = model_cases();
  const std::vector<RowsCase> random = random_reduction_cases(20261201, 40);
  candidates.insert(candidates.end(), random.begin(), random.end());
  int globals = 0, columns = 0;
  for (const RowsCase& c : candidates) {
    const RowsRun r = aligned_rows_run(c, 8, 32);
    if (!fuser::cuda::cuda_variant(c.kernel, r.layout, {true, true}).vec || cases.size() >= 24)
      continue;
    globals += c.kernel.num_globals > 0;
    columns += c.kernel.num_columns() > 0;
    cases.push_back(c);
  }
  EXPECT_GE(cases.size(), 12u);
  EXPECT_GE(globals, 2);
  EXPECT_GE(columns, 2);
  // Per case its variants: the generic loop and K = 4, 16, 64 positions per thread, each scalar
  // and vec (source 8 * case + 2 * turn + vec).
  static const int kPerThread[] = {0, 4, 16, 64};
  std::vector<std::pair<const Kernel*, std::string> > sources;
  for (size_t c = 0; c < cases.size(); ++c)
    for (int turn = 0; turn < 4; ++turn)
      for (bool vec : {false, true}) {
        RowsRun r = aligned_rows_run(cases[c], 8, 32);
        r.vec = vec;
        r.per_thread = kPerThread[turn];
        sources.emplace_back(
            &cases[c].kernel,
            fuser::cuda::cuda_source(cases[c].kernel, r.layout,
                                     "kr" + std::to_string(sources.size()), r.variant()));
      }
  void* lib = build_rows_library(root, sources, "variants");
  ASSERT_NE(lib, nullptr);
  std::mt19937_64 rng(13);
  static const unsigned kThreads[] = {32, 64, 128, 256, 512, 1024};
  size_t exact = 0, close = 0, variant_runs = 0;
  for (size_t c = 0; c < cases.size() && !HasFailure(); ++c) {
    const Kernel& k = cases[c].kernel;
    int64_t lengths = 0;
    for (int64_t R : {1, 3, 4, 5, 7, 8, 1000, 1027}) {
      RowsRun r = aligned_rows_run(cases[c], R, kThreads[(c + lengths++) % 6]);
      Buffers in;
      for (size_t p = 0; p < k.input_types.size(); ++p)
        in.push_back(rows_test_values(k.input_types[p], static_cast<size_t>(r.length[p]), rng));
      Buffers scalar_out;
      ASSERT_EQ(host_rows_outputs(rows_entry(lib, "variants", 8 * c), cases[c], r, in, scalar_out),
                0);
      const std::string llvm =
          rows_difference(k, llvm_rows_outputs(cases[c], r, in), scalar_out, true, exact, close);
      EXPECT_EQ(llvm, "") << run_text(cases[c], r) << " (LLVM vs CUDA)\n" << k.str();
      {  // the launch rule allows the vec variant here
        Buffers out = rows_outputs(k, r);
        const std::vector<char*> ptrs = rows_pointers(k, r, in, out);
        EXPECT_TRUE(fuser::cuda::cuda_call_flags(k, r.layout, rows_of(r), r.sizes.data(),
                                                 r.strides.data(), ptrs.data(), r.blocks)
                        .vec)
            << run_text(cases[c], r);
      }
      for (int turn = 0; turn < 4; ++turn) {
        r.per_thread = kPerThread[turn];
        if (R > r.per_thread * int64_t{r.threads} && r.per_thread > 0) continue;
        for (bool vec : {false, true}) {
          if (turn == 0 && !vec) continue;  // the scalar loop itself
          r.vec = vec;
          Buffers got;
          ASSERT_EQ(host_rows_outputs(rows_entry(lib, "variants", 8 * c + 2 * turn + vec), cases[c],
                                      r, in, got),
                    0)
              << run_text(cases[c], r);
          size_t same = 0, near = 0;
          EXPECT_EQ(rows_difference(k, scalar_out, got, false, same, near), "")
              << run_text(cases[c], r) << " (the scalar loop vs this variant)\n"
              << k.str();
          ++variant_runs;
        }
      }
    }
    {  // a row start off by one element: the rule takes the scalar loop, a vec kernel faults
      RowsRun r = aligned_rows_run(cases[c], 8, 32);
      size_t p = r.layout.inner.size();
      while (p-- > 0 && r.layout.inner[p] != Layout::kUnit) {
      }
      ++r.base[p];
      ++r.length[p];
      Buffers in;
      for (size_t q = 0; q < k.input_types.size(); ++q)
        in.push_back(rows_test_values(k.input_types[q], static_cast<size_t>(r.length[q]), rng));
      Buffers got = rows_outputs(k, r);
      const std::vector<char*> ptrs = rows_pointers(k, r, in, got);
      EXPECT_FALSE(fuser::cuda::cuda_call_flags(k, r.layout, rows_of(r), r.sizes.data(),
                                                r.strides.data(), ptrs.data(), r.blocks)
                       .vec)
          << run_text(cases[c], r);
      EXPECT_EQ(host_rows_outputs(rows_entry(lib, "variants", 8 * c), cases[c], r, in, got), 0);
      r.vec = true;
      EXPECT_EQ(host_rows_outputs(rows_entry(lib, "variants", 8 * c + 1), cases[c], r, in, got), -3)
          << run_text(cases[c], r) << ": a misaligned quad went unnoticed";
    }
  }
  std::printf(
      "%zu kernels with a vec variant, %zu variant runs bit-equal to the scalar loop's; "
      "%zu output elements bit-equal to the LLVM emitter's, %zu within the tolerance of "
      "floating sums\n",
      cases.size(), variant_runs, exact, close);
  dlclose(lib);
}

// The disk cache files a CUDA binary under the source it is compiled from, with the target and
// NVRTC's version and options, never a version number bumped by hand: the same source gets the
// same key, and other code (here: another primitive's device function) or another target another.
TEST(CudaCodegen, TheDiskKeyIsTheSourceAndTheTarget) {
  auto source_of = [](fuser::Prim prim) {
    Kernel k;
    k.input_types = {kFloat32};
    const int32_t x = k.add({fuser::Prim::Load, kFloat32, -1, -1, -1, 0});
    k.outputs = {k.add({prim, kFloat32, x})};
    k.output_types = {kFloat32};
    k.ops = "unary";
    Layout flat;
    flat.single_element = {false};
    return fuser::cuda::cuda_source(k, flat, "kiln_unary", {true, false});
  };
  const std::string exp_source = source_of(fuser::Prim::Exp);
  const std::string key = fuser::cuda::cuda_disk_key(exp_source, 90, false);
  EXPECT_EQ(key, fuser::cuda::cuda_disk_key(source_of(fuser::Prim::Exp), 90, false));
  EXPECT_EQ(key.rfind(exp_source, 0), 0u);  // the whole source, first
  EXPECT_NE(key.find("kiln_exp_f32"), std::string::npos);
  EXPECT_NE(key.find("--fmad=false"), std::string::npos);
  EXPECT_EQ(key.find("cuda-emitter"), std::string::npos);
  EXPECT_NE(key, fuser::cuda::cuda_disk_key(source_of(fuser::Prim::Tanh), 90, false));
  EXPECT_NE(key, fuser::cuda::cuda_disk_key(exp_source, 80, false));
  EXPECT_NE(key, fuser::cuda::cuda_disk_key(exp_source, 90, true));
}

#endif  // KILN_HAS_CUDA

}  // namespace
}  // namespace kiln
