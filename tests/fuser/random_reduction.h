// Random programs mixing elementwise ops with reductions, for the fuser's differential tests
// (reduce_fusion_test.cpp runs them fused against eager mode; cuda_codegen_test.cpp compiles
// their rows kernels for CUDA and runs them on the host against the LLVM kernels).
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "kiln/kiln.h"
#include "tests/fuser/fuser_testing.h"
#include "tests/testing.h"

namespace kiln::testing {

// A tensor's values as doubles, read eagerly.
inline std::vector<double> values_of(const Tensor& t) {
  LazyGuard eager_mode(false);
  return t.to_vector<double>();
}

// Random programs mixing elementwise ops with reductions (sum, mean, amax, amin, max(), min(),
// logsumexp, var, std) over the last dim, the last two, every dim, or the leading one or two
// (column exits for sum, mean, amax and amin), with or without keepdim, whose results are often
// broadcast back into the rows (x - r, x / r, exp(x - r)). Shapes include 0- and 1-sized dims;
// inputs are float32, float64, int32, int64 or bool, some non-contiguous.
//
// Values are exact (a fused kernel computes them bit for bit as eager mode does: elementwise ops
// other than transcendental functions, max/min reductions of exact values (a zero result made
// +0 by adding 0: its sign depends on the order of comparison), integer sums) or approximate. Ops
// that are not continuous (floor, round, sign, comparisons, conversions to integers or bool, isnan)
// only take exact values, so that one ulp cannot turn into a different integer; approximate values
// go through continuous ops only, and are divided only by numbers of at least 1 in magnitude.
//
// The tolerance of each approximate result adds to the fixed one (see the top of the file) the
// largest change that one-ulp perturbations of every reduction and transcendental result make to
// it in eager mode (over three perturbed runs, times 8): it measures how much the ops after the
// reductions amplify such differences. A program with float32 values gives its float64 results
// float32's tolerance (a float64 result may carry a float32 value's rounding).
class RandomReductionProgram {
 public:
  // What an eager run of a program observes; nullptr for the lazy recording.
  struct Run {
    std::mt19937_64* perturb = nullptr;  // set: move every inexact result by an ulp, then
    int direction = 0;                   // up (1), down (-1) or at random (0) per element
    std::vector<Tensor> values;          // every value made (for the scale)
    int64_t reduced = 0;                 // the most elements one reduction folded
  };
  using Program = std::function<Inputs(const Inputs&, Run*)>;

  explicit RandomReductionProgram(uint64_t seed) : rng_(seed) {}

  // 1-3 inputs broadcastable to one shape of rank 0-3, some non-contiguous.
  Inputs make_inputs() {
    return testing::random_inputs(
        rng_, {{0, 1, 2, 3, 5, 8, 17, 33},
               {kFloat32, kFloat32, kFloat32, kFloat64, kFloat64, kInt32, kInt64, kBool},
               20,
               4,
               5});
  }

  // A program of about `ops` steps (reductions or elementwise ops), with at least one reduction
  // that took its operand. It returns its last three new values.
  Program make_program(int ops) {
    std::vector<int> choice;
    for (int i = 0; i < ops * 12 + 16; ++i) choice.push_back(pick(0, 1 << 20));
    return [choice, ops](const Inputs& in, Run* run) {
      std::vector<Value> values;
      for (const Tensor& t : in) values.push_back({t, true});
      size_t c = 0;
      auto next = [&](int n) { return choice[c++ % choice.size()] % n; };
      // Operands are mostly recent values, so that reductions and their consumers chain.
      auto operand = [&]() -> Value {
        const int n = static_cast<int>(values.size());
        const int back = next(3) ? next(std::min(n, 3)) : next(n);
        return values[static_cast<size_t>(n - 1 - back)];
      };
      auto add = [&](const Tensor& t, bool exact) {
        values.push_back({t, exact});
        if (run) run->values.push_back(t);
      };
      int reductions = 0;
      for (int i = 0; i < ops || (reductions == 0 && i < ops + 6); ++i) {
        const bool reduce = next(5) < 2 || i >= ops;
        try {
          if (reduce) {
            reduction_step(operand(), next, add, run);
            ++reductions;
          } else {
            elementwise_step(operand(), operand(), next, add, run);
          }
        } catch (const Error&) {
          // The op does not take these operands (mean of integers, amax of an empty row, ...):
          // eager and lazy mode agree on that.
        }
      }
      Inputs out;
      for (size_t k = std::max(in.size(), values.size() > 3 ? values.size() - 3 : 0);
           k < values.size(); ++k) {
        bool seen = false;
        for (const Tensor& t : in) seen |= values[k].tensor.is_same(t);
        for (const Tensor& t : out) seen |= values[k].tensor.is_same(t);
        if (!seen) out.push_back(values[k].tensor);
      }
      return out;
    };
  }

 private:
  struct Value {
    Tensor tensor;
    bool exact;  // computed bit for bit alike by fused kernels and eager mode
  };
  using Next = std::function<int(int)>;
  using Add = std::function<void(const Tensor&, bool)>;

  // An inexact result, moved by about one ulp per element in a perturbed eager run.
  static Tensor inexact(const Tensor& t, Run* run) {
    if (!run || !run->perturb || !is_floating_point(t.dtype())) return t;
    std::vector<double> v = values_of(t);
    std::bernoulli_distribution up(0.5);
    for (double& x : v) {
      if (!std::isfinite(x)) continue;
      const bool go_up = run->direction == 0 ? up(*run->perturb) : run->direction > 0;
      const double to = (go_up ? 1 : -1) * std::numeric_limits<double>::infinity();
      x = t.dtype() == kFloat32
              ? static_cast<double>(std::nextafter(static_cast<float>(x), static_cast<float>(to)))
              : std::nextafter(x, to);
    }
    LazyGuard eager_mode(false);
    return from_vector(v, t.sizes()).to(t.dtype());
  }

  static void reduction_step(const Value& v, const Next& next, const Add& add, Run* run) {
    const Tensor& x = v.tensor;
    const int64_t rank = x.dim();
    std::vector<int64_t> dims;
    const int d = next(10);
    if (rank == 0 || d == 5 || d == 6) {
      dims = {};  // every dim
    } else if ((d == 7 || d == 8) && rank >= 2) {
      dims = {0};  // a leading dim: a column exit
    } else if (d == 9 && rank >= 3) {
      dims = {0, 1};  // the two leading dims: a column exit
    } else if ((d == 3 || d == 4) && rank >= 2) {
      dims = {-2, -1};
    } else {
      dims = {-1};
    }
    const bool keepdim = next(2) == 1;
    const int op = next(v.exact ? 9 : 7);  // var and std of exact values only
    const int64_t correction = next(3);
    Tensor r;
    bool exact = false;
    switch (op) {
      case 0:
        r = x.sum(dims, keepdim);
        exact = v.exact && !is_floating_point(r.dtype());
        break;
      case 1:
        r = x.mean(dims, keepdim);
        break;
      case 2:
        r = x.amax(dims, keepdim);
        exact = v.exact;
        break;
      case 3:
        r = x.amin(dims, keepdim);
        exact = v.exact;
        break;
      case 4:
        r = next(2) ? x.max() : x.min();
        exact = v.exact;
        break;
      case 5:
      case 6:
        r = x.logsumexp(dims, keepdim);
        break;
      case 7:
        r = x.var(dims, correction, keepdim);
        break;
      default:
        r = x.std(dims, correction, keepdim);
        break;
    }
    const bool extremum = op >= 2 && op <= 4;
    // Which of +0 and -0 a max or min of both returns depends on the order the elements are
    // compared in (eager mode's vector lanes, the kernel's): adding 0 makes a zero +0.
    if (extremum && is_floating_point(r.dtype())) r = r + 0.0;
    if (run) {
      // The elements one output folds.
      run->reduced = std::max(run->reduced, r.numel() > 0 ? x.numel() / r.numel() : x.numel());
    }
    if (!exact) r = inexact(r, run);
    add(r, exact);
    // Broadcast back into the rows: a keepdim result or a 0-dim one, or one unsqueezed.
    const bool whole = r.dim() == 0;
    if (next(4) == 0 || (!keepdim && !whole && dims != std::vector<int64_t>{-1})) return;
    Tensor back = r;
    if (!keepdim && !whole) back = r.unsqueeze(-1);
    switch (next(4)) {
      case 0:
        add(x - back, v.exact && exact);
        break;
      case 1:
        if (v.exact && exact)
          add(x / back, true);
        else
          add(x / (back.abs() + 1.0), false);
        break;
      case 2:
        if (v.exact && exact && extremum)
          add(inexact((x - back).exp(), run), false);  // as in softmax
        else
          add(x * 0.5 - back, v.exact && exact);
        break;
      default:
        add(back * 2.0 + x, v.exact && exact);
        break;
    }
  }

  static void elementwise_step(const Value& a, const Value& b, const Next& next, const Add& add,
                               Run* run) {
    const int number = next(7);
    if (a.exact && b.exact) {
      int op = next(testing::kElementwiseOps);
      if (op == 31) op = 22;  // exp(a * 30).to(int64): a discontinuous op after exp
      // Integer divisors and exponents are read before recording (materializing them): a scalar
      // one instead.
      if (testing::reads_values_of_b(op)) op = op == 42 ? 43 : 38;
      // Transcendental functions may differ by one ulp inside a fused reduction's kernel (erf,
      // gelu, softplus and pow too).
      static const int transcendental[] = {3,  4,  5,  6,  9,  10, 12, 15,
                                           34, 35, 36, 37, 38, 39, 40, 41};
      const bool approx = std::find(std::begin(transcendental), std::end(transcendental), op) !=
                          std::end(transcendental);
      Tensor t = testing::elementwise_op(op, a.tensor, b.tensor, number);
      add(approx ? inexact(t, run) : t, !approx);
      return;
    }
    // Continuous ops only (Lipschitz, with constants of at most 7).
    static const int continuous[] = {0, 1, 9, 10, 11, 15, 18, 19, 20, 21, 22, 23};
    const int op = continuous[next(static_cast<int>(std::size(continuous)))];
    add(inexact(testing::elementwise_op(op, a.tensor, b.tensor, number), run), false);
  }

  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  std::mt19937_64 rng_;
};

}  // namespace kiln::testing
