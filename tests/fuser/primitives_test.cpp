// The primitive table (fuser/primitives.h): one row per Prim, the formula vocabulary derived from
// it, and every elementwise primitive rendered by both code generators: the CPU's kernel compiles
// and runs (bit-equal to the reference kernel where an op computes the primitive alone), the CUDA
// source compiles to PTX with NVRTC (when kiln is built with the CUDA toolkit).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "fuser/codegen/llvm/cpu_codegen.h"
#include "fuser/kernel.h"
#include "fuser/primitives.h"
#include "kiln/error.h"
#include "lib/math/primitives.h"
#if KILN_HAS_CUDA
#include "fuser/codegen/cuda/cuda_codegen.h"
#include "fuser/codegen/cuda/nvrtc.h"
#endif

namespace kiln {
namespace {

using fuser::Instr;
using fuser::Kernel;
using fuser::kNumPrims;
using fuser::kPrims;
using fuser::Prim;
using fuser::prim_info;
using fuser::PrimKind;

TEST(Primitives, TheTableHasOneRowPerPrim) {
  std::set<std::string> names;
  int folds = 0;
  for (size_t i = 0; i < kNumPrims; ++i) {
    const auto p = static_cast<Prim>(i);
    const fuser::PrimInfo& info = prim_info(p);
    EXPECT_EQ(info.prim, p) << i;
    EXPECT_TRUE(names.insert(info.name).second) << "two primitives named " << info.name;
    // Formulas name every primitive but the leaves, by its table name.
    if (info.kind == PrimKind::kLeaf)
      EXPECT_EQ(fuser::prim_named(info.name), nullptr) << info.name;
    else
      EXPECT_EQ(fuser::prim_named(info.name), &kPrims[i]) << info.name;
    EXPECT_EQ(fuser::is_reduction(p), info.kind == PrimKind::kFold) << info.name;
    folds += info.kind == PrimKind::kFold;
  }
  EXPECT_EQ(folds, 4);  // sum, max, min, prod
  EXPECT_EQ(static_cast<size_t>(Prim::Trigamma) + 1, kNumPrims) << "the last enumerator's row";
  EXPECT_EQ(fuser::prim_named("widen"), nullptr) << "widen is the parser's alias of cast";
}

// The operand and result types primitive p is rendered with here.
struct Typed {
  std::vector<DType> operands;
  DType result;
};
Typed types_of(Prim p) {
  const fuser::PrimInfo& info = prim_info(p);
  switch (p) {
    case Prim::And:
    case Prim::Or:
    case Prim::Not:
      return {std::vector<DType>(static_cast<size_t>(info.arity), kBool), kBool};
    case Prim::BitAnd:
    case Prim::BitOr:
    case Prim::BitXor:
      return {{kInt32, kInt32}, kInt32};
    case Prim::Select:
      return {{kBool, kFloat32, kFloat32}, kFloat32};
    case Prim::Cast:
      return {{kFloat32}, kFloat64};
    default: {
      const DType r = info.result == fuser::PrimResult::kBool ? kBool : kFloat32;
      return {std::vector<DType>(static_cast<size_t>(info.arity), kFloat32), r};
    }
  }
}

// out0[i] = p(in0[i], ...): a flat kernel of the one primitive.
Kernel kernel_of(Prim p, const Typed& t) {
  Kernel k;
  k.input_types = t.operands;
  std::vector<int32_t> loads;
  for (size_t i = 0; i < t.operands.size(); ++i) {
    Instr load{Prim::Load, t.operands[i]};
    load.index = static_cast<int32_t>(i);
    loads.push_back(k.add(load));
  }
  Instr in{p, t.result};
  if (loads.size() > 0) in.a = loads[0];
  if (loads.size() > 1) in.b = loads[1];
  if (loads.size() > 2) in.c = loads[2];
  k.outputs = {k.add(in)};
  k.output_types = {t.result};
  k.ops = std::string("prim_") + prim_info(p).name;
  return k;
}

TEST(Primitives, EveryElementwisePrimitiveIsRenderedByBothCodeGenerators) {
  int rendered = 0;
  for (const fuser::PrimInfo& info : kPrims) {
    if (info.kind != PrimKind::kElementwise) continue;
    const Typed t = types_of(info.prim);
    const Kernel k = kernel_of(info.prim, t);
    fuser::Layout layout;  // flat
    layout.single_element.assign(t.operands.size(), false);
    // Runs on 4 elements of 8 bytes each (every value type fits), inputs of 1s.
    std::vector<std::vector<uint64_t>> inputs(t.operands.size(), std::vector<uint64_t>(4));
    for (size_t i = 0; i < t.operands.size(); ++i)
      for (uint64_t& v : inputs[i]) {
        const double one = 1.0;
        const float onef = 1.0f;
        v = 0;
        if (t.operands[i] == kFloat32) std::memcpy(&v, &onef, sizeof onef);
        if (t.operands[i] == kFloat64) std::memcpy(&v, &one, sizeof one);
        if (t.operands[i] == kInt32 || t.operands[i] == kInt64 || t.operands[i] == kBool) v = 1;
      }
    std::vector<uint64_t> out(4, 0);
    std::vector<char*> ptrs;
    for (auto& in : inputs) ptrs.push_back(reinterpret_cast<char*>(in.data()));
    ptrs.push_back(reinterpret_cast<char*>(out.data()));
    try {
      const fuser::CompiledKernel c = fuser::cpu_kernel(k, layout);
      ASSERT_NE(c.fn, nullptr) << info.name;
      c.fn(0, 4, ptrs.data(), nullptr, nullptr, nullptr, nullptr);
    } catch (const Error& e) {
      ADD_FAILURE() << info.name << " on the CPU: " << e.what() << "\n" << k.str();
    }
    if (info.prim == Prim::Exp) {  // e^1 in float32, as lib/math computes it
      float got;
      std::memcpy(&got, out.data(), sizeof got);
      EXPECT_FLOAT_EQ(got, 2.71828183f);
    }
#if KILN_HAS_CUDA
    const std::string symbol = "kiln_" + k.ops;
    std::string source;
    try {
      source = fuser::cuda::cuda_source(k, layout, symbol, fuser::cuda::CudaCallFlags{});
      const fuser::cuda::CudaCompiled ptx = fuser::cuda::nvrtc_compile(
          source, symbol, 90, fuser::cuda::CudaOutput::kPtx, fuser::cuda::cuda_compile_options());
      EXPECT_EQ(ptx.log, "") << info.name << "\n" << source;
      EXPECT_NE(ptx.code.find(".entry " + symbol), std::string::npos) << info.name;
    } catch (const Error& e) {
      ADD_FAILURE() << info.name << " for CUDA: " << e.what() << "\n" << k.str() << "\n" << source;
    }
#endif
    ++rendered;
  }
  EXPECT_EQ(rendered, static_cast<int>(kNumPrims) - 3 - 4);  // but the leaves and the folds
}

// The reference kernel's pow as it was written before lib/math defined it (torch's CPU kernel's
// cases), branch by branch: the single definition must give its bits.
template <typename T>
T pow_cases(T x, T y) {
  if (y == T(0.5)) return std::sqrt(x);
  if (y == T(-0.5)) return T(1) / std::sqrt(x);
  if (y != std::trunc(y) || y == T(0) || std::abs(y) > T(64)) return std::pow(x, y);
  auto m = static_cast<int64_t>(std::abs(y));
  T result = x, base = x;
  bool have = false;
  while (m) {
    if (m & 1) {
      result = have ? T(result * base) : base;
      have = true;
    }
    m >>= 1;
    if (m) base = T(base * base);
  }
  return y < T(0) ? T(T(1) / result) : result;
}

template <typename T>
bool same_bits(T a, T b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
}

// x^y for every pair of special values: lib/math's pow, the fused CPU kernel's (the same
// definition instantiated for LLVM IR) and the case analysis above agree bit for bit; integers
// wrap as 64-bit (or 32-bit) products do.
template <typename T>
void expect_pow_matches(DType dtype, const std::vector<T>& values) {
  const size_t n = values.size() * values.size();
  std::vector<T> xs, ys;
  for (T x : values)
    for (T y : values) {
      xs.push_back(x);
      ys.push_back(y);
    }
  const Kernel k = kernel_of(Prim::Pow, Typed{{dtype, dtype}, dtype});
  fuser::Layout layout;
  layout.single_element = {false, false};
  std::vector<T> out(n);
  char* ptrs[] = {reinterpret_cast<char*>(xs.data()), reinterpret_cast<char*>(ys.data()),
                  reinterpret_cast<char*>(out.data())};
  fuser::cpu_kernel(k, layout).fn(0, static_cast<int64_t>(n), ptrs, nullptr, nullptr, nullptr,
                                  nullptr);
  for (size_t i = 0; i < n; ++i) {
    T want;
    if constexpr (std::is_floating_point_v<T>) {
      want = pow_cases(xs[i], ys[i]);
      EXPECT_TRUE(same_bits(math::pow_float(xs[i], ys[i]), want)) << xs[i] << " ^ " << ys[i];
    } else {
      using U = std::make_unsigned_t<T>;
      U r = 1;
      for (T e = 0; e < ys[i]; ++e) r = static_cast<U>(r * static_cast<U>(xs[i]));
      want = static_cast<T>(r);
      EXPECT_EQ(static_cast<T>(math::pow_int(static_cast<U>(xs[i]), static_cast<U>(ys[i]))), want)
          << xs[i] << " ^ " << ys[i];
    }
    EXPECT_TRUE(same_bits(out[i], want)) << "fused " << xs[i] << " ^ " << ys[i];
  }
}

TEST(Primitives, PowIsTheReferenceKernelsCaseAnalysis) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const std::vector<double> special = {nan,   inf,  -inf, 0.0,  -0.0,  0.5,   -0.5,  1.0,   -1.0,
                                       2.0,   -3.0, 7.5,  64.0, 65.0,  -64.0, 63.0,  -63.0, 1e-30,
                                       1e30,  3.25, 1.5,  0.3,  -0.75, 1e22,  -20.0, 33.0,  1e-310,
                                       -2.75, 1.01, 0.99, 17.0, -17.0, 2.5,   -1e300};
  expect_pow_matches<double>(kFloat64, special);
  std::vector<float> specialf;
  for (double v : special) specialf.push_back(static_cast<float>(v));
  expect_pow_matches<float>(kFloat32, specialf);
  expect_pow_matches<int32_t>(kInt32, {0, 1, 2, 3, -1, -2, 7, 31, 40, 100, 1000003, -65537});
  expect_pow_matches<int64_t>(kInt64, {0, 1, 2, 3, -1, -2, 7, 31, 63, 70, 1000003, -65537});
}

}  // namespace
}  // namespace kiln
