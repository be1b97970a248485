// Helpers shared by the fuser's tests: planning a lazily recorded function (fused), running it
// eagerly, comparing the two, and the random elementwise ops of the differential tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "exec/executor.h"
#include "exec/lazy_eval.h"
#include "fuser/fuse.h"
#include "jit/passes/passes.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"
#include "tests/testing.h"

namespace kiln::testing {

using Inputs = std::vector<Tensor>;
using Fn = std::function<Inputs(const Inputs&)>;

// The plans here are built from pending tensors: a KILN_MAX_PENDING from the environment is lifted
// for the whole run of every test binary that includes this header (an inline variable: registered
// once per binary).
[[maybe_unused]] inline ::testing::Environment* const kFuserNoFlush =
    ::testing::AddGlobalTestEnvironment(new NoFlushEnvironment);

// Records fn lazily and plans the graph of its results, fused.
struct Planned {
  jit::LazyGraphBinding binding;
  std::unique_ptr<jit::Graph> graph;
  std::unique_ptr<jit::Plan> plan;
};
inline Planned plan_of(const Fn& fn, const Inputs& inputs, bool passes = false) {
  Planned p;
  LazyGuard lazy(true);
  Inputs outs = fn(inputs);
  std::vector<detail::LazyRef> requests;
  for (const Tensor& t : outs) {
    EXPECT_TRUE(detail::is_pending(t)) << "an output was not recorded";
    requests.push_back(t.impl()->storage->lazy);
  }
  p.graph = jit::build_graph(requests, &p.binding, false);
  if (passes) jit::run_passes(*p.graph);
  fuser::FusionGuard fusion(true);
  p.plan = std::make_unique<jit::Plan>(*p.graph);
  return p;
}

inline Inputs eager(const Fn& fn, const Inputs& inputs) {
  LazyGuard eager_mode(false);
  return fn(inputs);
}

// Runs fn fused (planned from a lazy recording) and eagerly; results must be bit-equal.
inline void expect_fused_equals_eager(const Fn& fn, const Inputs& inputs, const std::string& what) {
  Planned p = plan_of(fn, inputs);
  Inputs got = p.plan->run(p.binding.inputs);
  Inputs want = eager(fn, inputs);
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < got.size(); ++k)
    expect_bit_equal(got[k], want[k], what + ", output " + std::to_string(k));
}

// The random differential tests' elementwise ops: op in [0, kElementwiseOps) applied to a (and b
// for binary ops), with one of seven C++ numbers picked by `number` in [0, 7). Each is computed by
// a fused kernel bit for bit as eager mode computes it (conversions of out-of-range floats and NaN
// to integers included, and operands of different dtypes converted inside the kernel); it throws
// kiln::Error, in either mode alike, when the op does not take these dtypes or values (sub of
// bools, an integer remainder by 0, an integer to a negative power).
constexpr int kElementwiseOps = 57;
// Ops that read b's values before recording (integer divisors and exponents are checked for 0 and
// negative ones): a pending b is materialized then, so the random programs give them inputs.
inline bool reads_values_of_b(int op) {
  return op == 37 || op == 41 || op == 42;
}
inline Tensor elementwise_op(int op, const Tensor& a, const Tensor& b, int number) {
  static const double numbers[] = {0.5, -1.25, 2.0, 3.0, 1e-3, -7.0, 0.0};
  const double v = numbers[number];
  const auto iv = static_cast<int64_t>(v);
  switch (op) {
    case 0:
      return neg(a);
    case 1:
      return abs(a);
    case 2:
      return sign(a);
    case 3:
      return exp(a);
    case 4:
      return log(a);
    case 5:
      return log1p(a);
    case 6:
      return expm1(a);
    case 7:
      return sqrt(a);
    case 8:
      return rsqrt(a);
    case 9:
      return tanh(a);
    case 10:
      return sigmoid(a);
    case 11:
      return relu(a);
    case 12:
      return silu(a);
    case 13:
      return floor(a * v);
    case 14:
      return round(a * v);
    case 15:
      return sin(a) + cos(b);
    case 16:
      return a * b;
    case 17:
      return a / b;
    case 18:
      return minimum(a, b);
    case 19:
      return maximum(a, b);
    case 20:
      return add(a, b, v == 0.0 ? 1.0 : v);
    case 21:
      return sub(a, b);
    case 22:
      return a * v;
    case 23:
      return a + static_cast<int64_t>(v);
    case 24:
      return lt(a, b);
    case 25:
      return ge(a, v);
    case 26:
      return eq(a, b);
    case 27:
      return logical_and(a, b);
    case 28:
      return logical_or(logical_not(a), b);
    case 29:
      return isnan(a);
    // Conversions: float to integer out of range (after exp) and NaN included.
    case 30:
      return (a * v).to(kInt32);
    case 31:
      return exp(a * 30.0).to(kInt64) + a.to(kInt64);
    case 32:
      return a.to(kBool);
    case 33:
      return a.to(number % 2 ? kFloat64 : kFloat32) * b;
    // Transcendental ops with a primitive or attributes of their own.
    case 34:
      return erf(a * v);
    case 35:
      return gelu(a * v, number % 2 ? "tanh" : "none");
    case 36:
      return softplus(a, v == 0.0 ? 1.0 : v, number % 3 ? 20.0 : 0.75);
    // pow: tensor exponents (integral ones multiply by squaring, others call pow), a C++ number
    // (0.5 and -1.25, 2 and 3, -7 and 0), integer exponents and a C++ base.
    case 37:
      return pow(a, b);
    case 38:
      return pow(a, v);
    case 39:
      return pow(a, iv < 0 ? -iv : iv);
    case 40:
      return pow(v, a);
    case 41:
      return pow(a, round(b * v));
    // remainder: negative operands, an integer divisor of 0 (an error in both modes), a float one
    // (NaN).
    case 42:
      return remainder(a, b);
    case 43:
      return remainder(a, v);
    // where and clamp: every form, with operands of other dtypes.
    case 44:
      return where(gt(a, v), a, b);
    case 45:
      return where(isfinite(b), a, v);
    case 46:
      return clamp(a, v, std::nullopt);
    case 47:
      return clamp(a, std::nullopt, v);
    case 48:
      return clamp(a, number % 2 ? Scalar(-iv) : Scalar(-v), number % 3 ? Scalar(iv) : Scalar(v));
    case 49:
      return isfinite(a / b);
    // Mixed dtypes inside a group: an int32 operand, a float64 comparison, logic over floats.
    case 50:
      return a.to(kInt32) * b + (a * v).clone();
    // tan, the inverse trigonometric and the hyperbolic functions (NaN outside their domains).
    case 51:
      return tan(a * v) + atan(b);
    case 52:
      return asin(a * v) + acos(b);
    case 53:
      return sinh(a) * cosh(b * v);
    case 54:
      return asinh(a) + acosh(b * v) + atanh(a * v);
    case 55:
      return atan2(a, b) + exp2(a * v) + log2(b);
    default:
      return logical_and(lt(a.to(kFloat64), b), a);
  }
}

// How random_inputs draws: sizes[1..] for each dim (sizes[0] is 0, drawn for one dim with odds
// 1 in zero_odds), dtypes (each input keeps the first draw but with odds 1 in other_dtype_odds),
// and each dim broadcast (size 1) with odds 1 in broadcast_odds.
struct RandomInputSpec {
  std::vector<int64_t> sizes;
  std::vector<DType> dtypes;
  int zero_odds;
  int broadcast_odds;
  int other_dtype_odds;
};

// 1-3 inputs broadcastable to one shape of rank 0-3, in random layouts (some non-contiguous).
inline Inputs random_inputs(std::mt19937_64& rng, const RandomInputSpec& spec) {
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int rank = pick(0, 3);
  const int num_sizes = static_cast<int>(spec.sizes.size()) - 1;
  const int num_dtypes = static_cast<int>(spec.dtypes.size()) - 1;
  Shape shape;
  for (int d = 0; d < rank; ++d)
    shape.push_back(spec.sizes[static_cast<size_t>(pick(1, num_sizes))]);
  if (rank > 0 && pick(0, spec.zero_odds) == 0)
    shape[static_cast<size_t>(pick(0, rank - 1))] = spec.sizes[0];
  const DType dtype = spec.dtypes[static_cast<size_t>(pick(0, num_dtypes))];
  Inputs in;
  const int count = pick(1, 3);
  for (int i = 0; i < count; ++i) {
    Shape s = shape;
    for (auto& d : s)
      if (pick(0, spec.broadcast_odds) == 0) d = 1;  // broadcast along this dim
    const DType t = pick(0, spec.other_dtype_odds) == 0
                        ? spec.dtypes[static_cast<size_t>(pick(0, num_dtypes))]
                        : dtype;
    Tensor x = input(s, t, -3, 3);
    auto layouts = input_layouts(x);
    in.push_back(
        layouts[static_cast<size_t>(pick(0, static_cast<int>(layouts.size()) - 1))].second);
  }
  return in;
}

// The last three values a random program made (after its inputs): a group with several outputs.
// to() of the same dtype returns its operand: each tensor is kept once, and no input.
inline Inputs last_new_values(const Inputs& in, const std::vector<Tensor>& values) {
  Inputs out;
  for (size_t k = std::max(in.size(), values.size() > 3 ? values.size() - 3 : 0); k < values.size();
       ++k) {
    bool seen = false;
    for (const Tensor& t : in) seen |= values[k].is_same(t);
    for (const Tensor& t : out) seen |= values[k].is_same(t);
    if (!seen) out.push_back(values[k]);
  }
  return out;
}

// Random elementwise programs of the differential tests (and the CUDA code generator's tests):
// ops from elementwise_op on 1-3 random inputs, each value picked from everything made so far.
class RandomProgram {
 public:
  explicit RandomProgram(uint64_t seed) : rng_(seed) {}

  // Inputs for one program: 1-3 tensors broadcastable to one shape, some non-contiguous.
  Inputs make_inputs() {
    return random_inputs(
        rng_,
        {{0, 1, 2, 3, 5, 8, 17}, {kFloat32, kFloat32, kFloat64, kInt32, kInt64, kBool}, 30, 3, 4});
  }

  // A program of `ops` random elementwise ops; values are picked from everything made so far.
  Fn make_program(int ops) {
    std::vector<int> choice;
    for (int i = 0; i < ops * 4; ++i) choice.push_back(pick(0, 1 << 20));
    return [choice, ops](const Inputs& in) {
      std::vector<Tensor> values(in.begin(), in.end());
      size_t c = 0;
      auto next = [&](int n) { return choice[c++ % choice.size()] % n; };
      for (int i = 0; i < ops; ++i) {
        const Tensor& a = values[static_cast<size_t>(next(static_cast<int>(values.size())))];
        size_t b_index = static_cast<size_t>(next(static_cast<int>(values.size())));
        const int op = next(kElementwiseOps);
        if (reads_values_of_b(op)) b_index %= in.size();
        const Tensor& b = values[b_index];
        try {
          values.push_back(elementwise_op(op, a, b, next(7)));
        } catch (const Error&) {
          // The op does not take these dtypes (sub of bools, ...): eager and lazy agree on that.
        }
      }
      return last_new_values(in, values);
    };
  }

 private:
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  std::mt19937_64 rng_;
};

}  // namespace kiln::testing
