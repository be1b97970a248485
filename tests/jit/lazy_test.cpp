// Lazy mode's semantics: deferral, errors, sub-graphs, freeing, in-place, autograd, eager parity.
#include <gtest/gtest.h>

#include <iomanip>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "exec/lazy_eval.h"
#include "jit/passes/passes.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"
#include "tests/scale.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using detail::is_pending;
using detail::pending_count;

int64_t evaluations() {
  return jit::stats().evaluations;
}

// A concrete tensor of random values, made in eager mode (so that it is never pending).
Tensor concrete_random(const Shape& shape, DType dtype = kFloat64, double lo = -2.0,
                       double hi = 2.0) {
  LazyGuard eager(false);
  return testing::random_tensor(shape, dtype, lo, hi);
}

Tensor concrete(const std::vector<double>& values, const Shape& shape, DType dtype = kFloat64) {
  LazyGuard eager(false);
  return from_vector(values, shape).to(dtype);
}

// Runs f in eager mode.
template <typename F>
auto eager(F f) {
  LazyGuard off(false);
  return f();
}

// Same dtype, sizes and values: bits for integers, testing::lazy_close for floats (fused
// reductions fold in another order than eager mode). `why` says where not.
bool same_bits(const Tensor& a, const Tensor& b, std::string* why) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) {
    *why = detail::describe(a) + " vs " + detail::describe(b);
    return false;
  }
  std::vector<double> va = eager([&] { return a.to_vector<double>(); });
  std::vector<double> vb = eager([&] { return b.to_vector<double>(); });
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) && std::isnan(vb[i])) continue;
    if (is_floating_point(a.dtype()) ? !testing::lazy_close(va[i], vb[i], a.dtype())
                                     : std::memcmp(&va[i], &vb[i], sizeof(double)) != 0) {
      std::ostringstream os;
      os.precision(17);
      os << "element " << i << ": " << va[i] << " vs " << vb[i];
      *why = os.str();
      return false;
    }
  }
  return true;
}

bool has_nan(const Tensor& t) {
  for (double v : eager([&] { return t.to_vector<double>(); }))
    if (std::isnan(v)) return true;
  return false;
}

// Every test runs in lazy mode with the default pending limit, whatever KILN_LAZY and
// KILN_MAX_PENDING say.
class Lazy : public ::testing::Test {
 protected:
  Lazy() : max_pending_(detail::max_pending()) { detail::set_max_pending(10000); }
  ~Lazy() override { detail::set_max_pending(max_pending_); }
  LazyGuard lazy_{true};
  int64_t max_pending_;
};

// ------------------------------------------------------------------------------- deferral

TEST_F(Lazy, PendingTensorsKnowTheirTypeAndNothingRunsUntilDataIsNeeded) {
  Tensor a = concrete_random({3, 4});
  Tensor b = concrete_random({4});
  auto program = [&] { return (tanh(a * 2 + b).sum({1}) * 0.5).to(kFloat32); };
  const Tensor want = eager(program);
  ASSERT_FALSE(is_pending(want));

  const int64_t e0 = evaluations();
  const int64_t p0 = pending_count();
  Tensor y = program();
  EXPECT_TRUE(is_pending(y));
  EXPECT_EQ(y.sizes(), Shape({3}));
  EXPECT_EQ(y.dtype(), kFloat32);
  EXPECT_TRUE(y.device().is_cpu());
  EXPECT_EQ(y.numel(), 3);
  EXPECT_EQ(y.dim(), 1);
  EXPECT_TRUE(y.is_contiguous());
  // Views of a pending tensor are pending and know their geometry too.
  Tensor v = y.unsqueeze(0).expand({2, 3});
  EXPECT_TRUE(is_pending(v));
  EXPECT_EQ(v.sizes(), Shape({2, 3}));
  EXPECT_EQ(v.strides(), Shape({0, 1}));
  // mul, add, tanh, sum, mul, to (+ the views): recorded, not run.
  EXPECT_GE(pending_count() - p0, 6);
  EXPECT_EQ(evaluations(), e0);
  EXPECT_EQ(jit::stats().pending_nodes, pending_count());

  // Each way of reading data runs exactly one evaluation, and the value is the eager one.
  const std::vector<std::pair<std::string, std::function<void(Tensor&)>>> reads = {
      {"item", [](Tensor& t) { (void)t.sum().item<float>(); }},
      {"operator<<",
       [](Tensor& t) {
         std::ostringstream os;
         os << t;
         EXPECT_NE(os.str().find("tensor("), std::string::npos) << os.str();
       }},
      {"eval", [](Tensor& t) { kiln::eval(t); }},
      {"to_vector", [](Tensor& t) { EXPECT_EQ(t.to_vector<float>().size(), 3u); }},
      {"const data_ptr",
       [](Tensor& t) {
         const Tensor& c = t;
         EXPECT_NE(c.data_ptr<float>(), nullptr);
       }},
      {"raw_data_ptr", [](Tensor& t) { EXPECT_NE(t.raw_data_ptr(), nullptr); }},
  };
  for (const auto& [name, read] : reads) {
    SCOPED_TRACE(name);
    Tensor t = program();
    ASSERT_TRUE(is_pending(t));
    const int64_t before = evaluations();
    read(t);
    EXPECT_EQ(evaluations(), before + 1);
    EXPECT_FALSE(is_pending(t));
    EXPECT_TRUE(equal(t, want)) << t << " vs " << want;
  }
  // The first y and its views were left alone by all that, and still compute the right value.
  EXPECT_TRUE(is_pending(y));
  EXPECT_TRUE(is_pending(v));
  const int64_t before = evaluations();
  const std::vector<float> v_values = v.to_vector<float>();
  EXPECT_EQ(evaluations(), before + 1);
  EXPECT_EQ(v_values, eager([&] { return want.unsqueeze(0).expand({2, 3}).to_vector<float>(); }));
  EXPECT_FALSE(is_pending(y));  // the view's storage is y's: one evaluation fills both
  EXPECT_TRUE(equal(y, want));

  // The mutable data pointer may be written through, so it flushes the whole pending trace (one
  // evaluation) before handing out the pointer.
  Tensor t = program();
  Tensor other = program() * 2;
  ASSERT_TRUE(is_pending(t) && is_pending(other));
  const int64_t before_write = evaluations();
  EXPECT_NE(t.data_ptr<float>(), nullptr);
  EXPECT_EQ(evaluations(), before_write + 1);
  EXPECT_FALSE(is_pending(t));
  EXPECT_FALSE(is_pending(other));
  EXPECT_TRUE(equal(t, want));
}

// -------------------------------------------------------------------------------- errors

TEST_F(Lazy, ShapeAndDtypeErrorsRaiseAtTheCallThatCausedThem) {
  Tensor a0 = concrete_random({2, 3}), b0 = concrete_random({4, 5});
  Tensor a = a0 + 1, b = b0 * 2;  // pending
  Tensor mask = gt(a, 0.0);       // pending bool
  ASSERT_TRUE(is_pending(a) && is_pending(b) && is_pending(mask));
  const int64_t e0 = evaluations();

  testing::expect_error([&] { (void)add(a, b); },
                        {"add", "[2, 3]", "[4, 5]", "cannot be broadcast"});
  testing::expect_error([&] { (void)(a * b); }, {"mul", "[2, 3]", "[4, 5]"});
  testing::expect_error([&] { (void)where(mask, a, b); }, {"[2, 3]", "[4, 5]"});
  testing::expect_error([&] { (void)matmul(a, b); },
                        {"matmul", "2x3", "4x5", "float64[2, 3]", "float64[4, 5]"});
  testing::expect_error([&] { (void)mm(a, a); }, {"mm", "2x3"});
  testing::expect_error([&] { (void)neg(mask); }, {"neg", "bool", "[2, 3]"});
  testing::expect_error([&] { (void)relu(mask); }, {"relu", "bool"});
  testing::expect_error([&] { (void)sub(mask, mask); }, {"sub", "bool"});
  testing::expect_error([&] { (void)a.sum({5}); }, {"sum"});
  testing::expect_error([&] { (void)a.view({4}); }, {"view", "[4]"});
  testing::expect_error([&] { (void)a.transpose(0, 2); }, {"transpose"});

  EXPECT_EQ(evaluations(), e0) << "a failed call ran the pending trace";
  EXPECT_TRUE(is_pending(a));
  EXPECT_TRUE(is_pending(b));
  EXPECT_TRUE(is_pending(mask));
  EXPECT_TRUE(equal(a, eager([&] { return a0 + 1; })));
  EXPECT_TRUE(equal(b, eager([&] { return b0 * 2; })));
}

TEST_F(Lazy, AFailedInPlaceCallLeavesItsInputsUntouched) {
  Tensor a0 = concrete_random({2, 3}), b0 = concrete_random({4, 5});
  Tensor a = a0 + 1, b = b0 * 2;
  Tensor mask = gt(a0, 0.0);
  testing::expect_error([&] { a.add_(b); }, {"add", "[2, 3]", "[4, 5]"});
  testing::expect_error([&] { a.mul_(b.t()); }, {"mul", "[2, 3]", "[5, 4]"});
  testing::expect_error([&] { a.copy_(b); }, {"copy_", "[2, 3]", "[4, 5]"});
  testing::expect_error([&] { mask.mul_(1.5); }, {"mul_", "float32", "bool[2, 3]"});
  // In-place calls flush the pending trace before they check their arguments (lib/autograd.cpp,
  // apply_inplace: prepare_write runs first), so a and b are computed by now; their values, and
  // mask's, are untouched.
  EXPECT_TRUE(equal(a, eager([&] { return a0 + 1; })));
  EXPECT_TRUE(equal(b, eager([&] { return b0 * 2; })));
  EXPECT_TRUE(equal(mask, eager([&] { return gt(a0, 0.0); })));
}

// ------------------------------------------------------------------ what an evaluation runs

TEST_F(Lazy, OnlyTheSubgraphTheRequestedValueNeedsRuns) {
  Tensor x = concrete_random({16});
  const int kP = 20, kQ = 30;
  auto chain_p = [&](Tensor t) {
    for (int i = 0; i < kP; ++i) t = sin(t);
    return t;
  };
  auto chain_q = [&](Tensor t) {
    for (int i = 0; i < kQ; ++i) t = cos(t);
    return t;
  };
  Tensor p = chain_p(x), q = chain_q(x);
  ASSERT_TRUE(is_pending(p) && is_pending(q));
  const int64_t pend = pending_count();
  const jit::Stats s0 = jit::stats();
  kiln::eval(p);
  const jit::Stats s1 = jit::stats();
  EXPECT_EQ(s1.evaluations, s0.evaluations + 1);
  EXPECT_GE(s1.nodes_executed - s0.nodes_executed, kP);
  EXPECT_LE(s1.nodes_executed - s0.nodes_executed, kP + 2) << "ran more than p's chain";
  EXPECT_FALSE(is_pending(p));
  EXPECT_TRUE(is_pending(q)) << "q's chain ran although only p was requested";
  EXPECT_EQ(pending_count(), pend - kP);
  EXPECT_TRUE(equal(p, eager([&] { return chain_p(x); })));

  kiln::eval(q);
  const jit::Stats s2 = jit::stats();
  EXPECT_GE(s2.nodes_executed - s1.nodes_executed, kQ);
  EXPECT_LE(s2.nodes_executed - s1.nodes_executed, kQ + 2);
  EXPECT_TRUE(equal(q, eager([&] { return chain_q(x); })));
}

TEST_F(Lazy, ASharedPrefixIsComputedOnce) {
  Tensor x = concrete_random({8, 8});
  auto prefix = [&] { return tanh(x.matmul(x) * 0.25) + 1; };  // matmul, mul, tanh, add
  auto tail_p = [](Tensor t) {
    for (int i = 0; i < 10; ++i) t = sin(t);
    return t;
  };
  auto tail_q = [](Tensor t) {
    for (int i = 0; i < 15; ++i) t = cos(t);
    return t;
  };
  Tensor shared = prefix();
  Tensor p = tail_p(shared), q = tail_q(shared);
  shared = Tensor();  // only p's and q's chains hold the prefix now
  const jit::Stats s0 = jit::stats();
  kiln::eval(p);
  const jit::Stats s1 = jit::stats();
  EXPECT_GE(s1.nodes_executed - s0.nodes_executed, 14);
  EXPECT_LE(s1.nodes_executed - s0.nodes_executed, 16);
  EXPECT_TRUE(is_pending(q));
  kiln::eval(q);
  const jit::Stats s2 = jit::stats();
  // The prefix q reads was kept from p's evaluation: only q's own 15 nodes run.
  EXPECT_EQ(s2.nodes_executed - s1.nodes_executed, 15) << "the shared prefix ran twice";
  Tensor want_shared = eager(prefix);
  EXPECT_TRUE(equal(p, eager([&] { return tail_p(want_shared); })));
  EXPECT_TRUE(equal(q, eager([&] { return tail_q(want_shared); })));
}

TEST_F(Lazy, EvalOfSeveralTensorsIsOneEvaluation) {
  Tensor x = concrete_random({5, 4});
  Tensor a = exp(x) * 3, b = sin(x).sum({0}), c = x.t() * 2;  // c: a view's consumer
  const int64_t e0 = evaluations();
  kiln::eval(a, b, c);
  EXPECT_EQ(evaluations(), e0 + 1);
  EXPECT_FALSE(is_pending(a));
  EXPECT_FALSE(is_pending(b));
  EXPECT_FALSE(is_pending(c));
  kiln::eval(a, b, c);  // nothing left to compute
  EXPECT_EQ(evaluations(), e0 + 1);
  EXPECT_TRUE(equal(a, eager([&] { return exp(x) * 3; })));
  EXPECT_TRUE(equal(b, eager([&] { return sin(x).sum({0}); })));
  EXPECT_TRUE(equal(c, eager([&] { return x.t() * 2; })));
  EXPECT_EQ(evaluations(), e0 + 1);
}

// ----------------------------------------------------------------- unreachable values are freed

TEST_F(Lazy, DiscardedIntermediatesAreFreedAtOnce) {
  Tensor x = concrete_random({8});
  const int64_t base = pending_count();
  const int64_t e0 = evaluations();
  for (int i = 0; i < 10000; ++i) {
    Tensor t = exp(x * static_cast<double>(i % 7)) + 1;
    Tensor u = t.unsqueeze(0).expand({3, 8}).sum({0});
    ASSERT_TRUE(is_pending(u));
    ASSERT_GE(pending_count(), base + 5);
    ASSERT_LE(pending_count(), base + 8) << "iteration " << i;
  }
  EXPECT_EQ(pending_count(), base) << "values nobody can reach stayed in the pending trace";
  EXPECT_EQ(evaluations(), e0) << "unreachable values were computed instead of dropped";
}

TEST_F(Lazy, ATrainingLoopKeepsThePendingTraceBounded) {
  Tensor w1 = concrete_random({4, 16}, kFloat32, -0.5, 0.5).requires_grad_();
  Tensor b1 = concrete_random({16}, kFloat32, -0.1, 0.1).requires_grad_();
  Tensor w2 = concrete_random({16, 1}, kFloat32, -0.5, 0.5).requires_grad_();
  Tensor b2 = concrete_random({1}, kFloat32, -0.1, 0.1).requires_grad_();
  Tensor x = concrete_random({32, 4}, kFloat32);
  Tensor y = eager([&] { return sin(x.sum({1}, true) * 0.5); });
  optim::SGD opt({w1, b1, w2, b2}, optim::SGDOptions{0.05});
  const int64_t base = pending_count();
  const int64_t e0 = evaluations();
  int64_t peak = 0;
  float first_loss = 0, last_loss = 0;
  const auto start = std::chrono::steady_clock::now();
  const int kIterations = 10000;
  for (int i = 0; i < kIterations; ++i) {
    opt.zero_grad();
    Tensor loss = mse_loss(relu(x.matmul(w1) + b1).matmul(w2) + b2, y);
    peak = std::max(peak, pending_count() - base);
    loss.backward();
    peak = std::max(peak, pending_count() - base);
    opt.step();
    peak = std::max(peak, pending_count() - base);
    ASSERT_LT(peak, 200) << "the pending trace grows: iteration " << i;
    if (i == 0) first_loss = loss.item<float>();
    if (i == kIterations - 1) last_loss = loss.item<float>();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ lazy ] %d MLP training steps: %.2f s, %lld evaluations, peak pending %lld\n",
              kIterations, seconds, static_cast<long long>(evaluations() - e0),
              static_cast<long long>(peak));
  EXPECT_LE(pending_count() - base, 0);
  EXPECT_GT(peak, 10);  // the forward and backward were recorded, not run eagerly
  EXPECT_LT(last_loss, first_loss * 0.5) << first_loss << " -> " << last_loss;
}

// --------------------------------------------------------------------------- KILN_MAX_PENDING

TEST_F(Lazy, MaxPendingFlushesSoTheTraceStaysSmall) {
  struct Restore {
    int64_t previous = detail::max_pending();
    ~Restore() { detail::set_max_pending(previous); }
  } restore;
  detail::set_max_pending(50);
  EXPECT_EQ(detail::max_pending(), 50);
  Tensor x = concrete({1, -2, 3.5, 0.25}, {4});
  auto program = [&](auto&& check) {
    Tensor t = x;
    for (int i = 0; i < 1000; ++i) {
      t = i % 2 == 0 ? t * 1.001 : t + 0.25;
      check();
    }
    return t;
  };
  const int64_t e0 = evaluations();
  int64_t peak = 0;
  Tensor t = program([&] { peak = std::max(peak, pending_count()); });
  EXPECT_LE(peak, 51);
  EXPECT_GE(peak, 40);  // it did record
  EXPECT_GE(evaluations() - e0, 1000 / 51);
  Tensor want = eager([&] { return program([] {}); });
  EXPECT_TRUE(equal(t, want)) << t << " vs " << want;
  std::vector<double> ref = {1, -2, 3.5, 0.25};
  for (int i = 0; i < 1000; ++i)
    for (double& v : ref) v = i % 2 == 0 ? v * 1.001 : v + 0.25;
  std::vector<double> got = t.to_vector<double>();
  for (size_t k = 0; k < ref.size(); ++k) EXPECT_NEAR(got[k], ref[k], 1e-9 * std::abs(ref[k]));
}

// ------------------------------------------------------------------ random differential programs

// A random program over float tensors: elementwise ops (unary, binary with broadcasting, scalar),
// views, reductions, softmax, matmul, in-place updates and mid-program reads. Its choices depend
// only on its seed and on the shapes and dtypes of the values it makes (never on their data), so
// the eager and the lazy run of one seed make the same calls. With `exp_log`, exp and log are
// generated too (patterns the stabilize pass rewrites may then appear).
class RandomProgram {
 public:
  RandomProgram(uint64_t seed, bool exp_log) : rng_(seed), exp_log_(exp_log) {}

  // Runs the program in the current mode; returns every value it made (pending ones included).
  std::vector<Tensor> run() {
    dtype_ = chance(0.5) ? kFloat32 : kFloat64;
    mixed_ = chance(0.2);
    max_size_ = chance(0.2) ? 33 : 5;
    const int64_t num_inputs = uniform(1, 3);
    for (int64_t i = 0; i < num_inputs; ++i) add_value(input(random_shape()), false, "input");
    const int64_t steps = uniform(6, 16);
    for (int64_t s = 0; s < steps; ++s) step();
    return pool_;
  }
  const std::string& history() const { return log_; }

 private:
  int64_t uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  DType other_dtype(DType d) const { return d == kFloat32 ? kFloat64 : kFloat32; }

  // Rank 0 to 3; sizes up to 5, or up to 33 in one program of five (past the kernels' vector
  // widths and parallel grain).
  Shape random_shape() {
    Shape s(static_cast<size_t>(chance(0.1) ? 0 : uniform(1, 3)));
    for (int64_t& d : s) d = chance(0.25) ? 1 : uniform(2, max_size_);
    return s;
  }

  Tensor input(const Shape& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<double> v(static_cast<size_t>(n));
    for (double& x : v) x = std::uniform_real_distribution<double>(-2, 2)(rng_);
    DType d = mixed_ && chance(0.3) ? other_dtype(dtype_) : dtype_;
    LazyGuard off(false);
    return from_vector(v, shape).to(d);
  }

  // An index into the pool, recent values more likely.
  size_t pick() {
    size_t back = static_cast<size_t>(std::geometric_distribution<int>(0.4)(rng_));
    return pool_.size() - 1 - std::min(back, pool_.size() - 1);
  }

  std::string name(size_t i) const { return "v" + std::to_string(i); }

  void add_value(const Tensor& t, bool overlapping, const std::string& what) {
    log_ += name(pool_.size()) + " = " + what + " : " + detail::describe(t) + "\n";
    pool_.push_back(t);
    overlapping_.push_back(overlapping);
  }

  static bool broadcastable(const Shape& a, const Shape& b) {
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      int64_t da = a[a.size() - 1 - i], db = b[b.size() - 1 - i];
      if (da != db && da != 1 && db != 1) return false;
    }
    return true;
  }
  static Shape broadcast(const Shape& a, const Shape& b) {
    Shape out(std::max(a.size(), b.size()));
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
      int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
      out[out.size() - 1 - i] = da == 1 ? db : da;
    }
    return out;
  }

  // A pool value (or a new input) whose shape broadcasts with `shape`; with `into`, one whose
  // broadcast with `shape` is `shape` itself (a source for an in-place op), of dtype `dtype`.
  std::pair<Tensor, std::string> partner(const Shape& shape, bool into, DType dtype) {
    for (int attempt = 0; attempt < 6; ++attempt) {
      size_t j = pick();
      const Tensor& c = pool_[j];
      if (!broadcastable(shape, c.sizes())) continue;
      if (into && (broadcast(shape, c.sizes()) != shape || c.dtype() != dtype)) continue;
      return {c, name(j)};
    }
    Shape s = shape;
    while (!s.empty() && chance(0.3)) s.erase(s.begin());
    for (int64_t& d : s)
      if (chance(0.3)) d = 1;
    Tensor t = input(s);
    if (into && t.dtype() != dtype) t = eager([&] { return t.to(dtype); });
    add_value(t, false, "input");
    return {t, name(pool_.size() - 1)};
  }

  std::vector<int64_t> random_dims(int64_t rank) {
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < rank; ++d)
      if (chance(0.5)) dims.push_back(chance(0.3) ? d - rank : d);
    return dims;
  }

  static std::string dims_str(const std::vector<int64_t>& d) { return detail::shape_str(d); }

  void step() {
    static const std::vector<double> kWeights = {22, 22, 12, 18, 10, 5, 7, 4, 3};
    std::discrete_distribution<int> kind(kWeights.begin(), kWeights.end());
    switch (kind(rng_)) {
      case 0:
        return unary();
      case 1:
        return binary();
      case 2:
        return scalar();
      case 3:
        return view();
      case 4:
        return reduction();
      case 5:
        return softmax_op();
      case 6:
        return matmul_op();
      case 7:
        return inplace();
      default:
        return read();
    }
  }

  void unary() {
    size_t i = pick();
    const Tensor& a = pool_[i];
    const std::string n = name(i);
    const int64_t k = uniform(0, exp_log_ ? 21 : 18);
    switch (k) {
      case 0:
        return add_value(neg(a), false, "neg(" + n + ")");
      case 1:
        return add_value(abs(a), false, "abs(" + n + ")");
      case 2:
        return add_value(sin(a), false, "sin(" + n + ")");
      case 3:
        return add_value(cos(a), false, "cos(" + n + ")");
      case 4:
        return add_value(tanh(a), false, "tanh(" + n + ")");
      case 5:
        return add_value(sigmoid(a), false, "sigmoid(" + n + ")");
      case 6:
        return add_value(relu(a), false, "relu(" + n + ")");
      case 7:
        return add_value(sqrt(abs(a)), false, "sqrt(abs(" + n + "))");
      case 8:
        return add_value(erf(a), false, "erf(" + n + ")");
      case 9:
        return add_value(floor(a * 3), false, "floor(" + n + " * 3)");
      case 10:
        return add_value(reciprocal(abs(a) + 1), false, "reciprocal(abs(" + n + ") + 1)");
      case 11:
        return add_value(pow(a, 2), false, "pow(" + n + ", 2)");
      case 12:
        return add_value(pow(a, 3.0), false, "pow(" + n + ", 3.0)");
      case 13:
        return add_value(pow(abs(a), 0.5), false, "pow(abs(" + n + "), 0.5)");
      case 14:
        return add_value(clamp(a, -1.0, 1.5), false, "clamp(" + n + ", -1, 1.5)");
      case 15:
        return add_value(gelu(a), false, "gelu(" + n + ")");
      case 16:
        return add_value(silu(a), false, "silu(" + n + ")");
      case 17:
        return add_value(neg(neg(a)) * 1, false, "neg(neg(" + n + ")) * 1");
      case 18:
        return add_value(a.to(other_dtype(a.dtype())), false,
                         n + ".to(" + dtype_name(other_dtype(a.dtype())) + ")");
      case 19:
        return add_value(exp(a), false, "exp(" + n + ")");
      case 20:
        return add_value(log(abs(a) + 0.5), false, "log(abs(" + n + ") + 0.5)");
      default:
        return add_value(log(sigmoid(a)), false, "log(sigmoid(" + n + "))");
    }
  }

  void binary() {
    size_t i = pick();
    Tensor a = pool_[i];
    const std::string na = name(i);
    auto [b, nb] = partner(a.sizes(), false, a.dtype());
    if (chance(0.3)) return binary_of(b, a, nb, na);  // the partner on the left
    return binary_of(a, b, na, nb);
  }
  void binary_of(const Tensor& a, const Tensor& b, const std::string& na, const std::string& nb) {
    const std::string args = "(" + na + ", " + nb + ")";
    switch (uniform(0, 9)) {
      case 0:
        return add_value(a + b, false, "add" + args);
      case 1:
        return add_value(a - b, false, "sub" + args);
      case 2:
        return add_value(a * b, false, "mul" + args);
      case 3:
        return add_value(a / (abs(b) + 0.5), false, "div(" + na + ", abs(" + nb + ") + 0.5)");
      case 4:
        return add_value(maximum(a, b), false, "maximum" + args);
      case 5:
        return add_value(minimum(a, b), false, "minimum" + args);
      case 6:
        return add_value(add(a, b, 0.5), false, "add_alpha" + args);
      case 7:
        return add_value(sub(a, b, 2), false, "sub_alpha" + args);
      case 8:
        return add_value(where(gt(a, b), a, b), false, "where(gt" + args + ")");
      default:
        return add_value(a * b + a, false, "mul_add" + args);
    }
  }

  void scalar() {
    size_t i = pick();
    const Tensor& a = pool_[i];
    const std::string n = name(i);
    static const std::vector<Scalar> kScalars = {Scalar(0.5),        Scalar(-1.5),  Scalar(2.0),
                                                 Scalar(int64_t{3}), Scalar(-0.25), Scalar(1.0)};
    const Scalar s = kScalars[static_cast<size_t>(uniform(0, 5))];
    std::ostringstream os;
    os << s;
    const std::string ss = os.str();
    switch (uniform(0, 5)) {
      case 0:
        return add_value(a * s, false, n + " * " + ss);
      case 1:
        return add_value(a + s, false, n + " + " + ss);
      case 2:
        return add_value(s - a, false, ss + " - " + n);
      case 3:
        return add_value(a / s, false, n + " / " + ss);
      case 4:
        return add_value(s * a, false, ss + " * " + n);
      default:
        return add_value(a - s, false, n + " - " + ss);
    }
  }

  void view() {
    size_t i = pick();
    const Tensor a = pool_[i];
    const bool ov = overlapping_[i];
    const std::string n = name(i);
    const int64_t r = a.dim();
    switch (uniform(0, 8)) {
      case 0:
        if (r >= 2) {
          int64_t d0 = uniform(0, r - 1), d1 = uniform(0, r - 1);
          return add_value(
              a.transpose(d0, d1), ov,
              n + ".transpose(" + std::to_string(d0) + ", " + std::to_string(d1) + ")");
        }
        [[fallthrough]];
      case 1:
        if (r <= 2) return add_value(a.t(), ov, n + ".t()");
        [[fallthrough]];
      case 2:
        if (r >= 2) {
          std::vector<int64_t> perm(static_cast<size_t>(r));
          for (int64_t d = 0; d < r; ++d) perm[static_cast<size_t>(d)] = d;
          std::shuffle(perm.begin(), perm.end(), rng_);
          return add_value(a.permute(perm), ov, n + ".permute(" + dims_str(perm) + ")");
        }
        [[fallthrough]];
      case 3:
        if (r >= 1) {
          int64_t d = uniform(0, r - 1), size = a.size(d);
          int64_t start = uniform(0, size - 1), end = uniform(start + 1, size);
          int64_t step = uniform(1, 2);
          return add_value(a.slice(d, start, end, step), ov,
                           n + ".slice(" + std::to_string(d) + ", " + std::to_string(start) + ", " +
                               std::to_string(end) + ", " + std::to_string(step) + ")");
        }
        [[fallthrough]];
      case 4:
        if (r >= 1) {
          int64_t d = uniform(0, r - 1), idx = uniform(0, a.size(d) - 1);
          return add_value(a.select(d, idx), ov,
                           n + ".select(" + std::to_string(d) + ", " + std::to_string(idx) + ")");
        }
        [[fallthrough]];
      case 5:
        if (r < 4) {
          Shape s;
          if (chance(0.5)) s.push_back(uniform(1, 3));
          bool expanded = false;
          for (int64_t d : a.sizes()) {
            int64_t e = d == 1 ? uniform(1, 3) : d;
            expanded |= e != d;
            s.push_back(e);
          }
          expanded |= s.size() > a.sizes().size() && s[0] > 1;
          return add_value(a.expand(s), ov || expanded, n + ".expand(" + dims_str(s) + ")");
        }
        [[fallthrough]];
      case 6:
        if (r < 4) {
          int64_t d = uniform(0, r);
          return add_value(a.unsqueeze(d), ov, n + ".unsqueeze(" + std::to_string(d) + ")");
        }
        [[fallthrough]];
      case 7: {
        int64_t numel = a.numel(), f = uniform(1, 4);
        if (numel % f != 0) f = 1;
        Shape s = chance(0.5) ? Shape{-1} : Shape{f, -1};
        return add_value(a.reshape(s), ov, n + ".reshape(" + dims_str(s) + ")");
      }
      default:
        return add_value(a.squeeze(), ov, n + ".squeeze()");
    }
  }

  void reduction() {
    size_t i = pick();
    const Tensor& a = pool_[i];
    const std::string n = name(i);
    std::vector<int64_t> dims = random_dims(a.dim());
    const bool keep = chance(0.5);
    const std::string args = "(" + n + ", " + dims_str(dims) + (keep ? ", keepdim)" : ")");
    switch (uniform(0, exp_log_ ? 4 : 3)) {
      case 0:
        return add_value(sum(a, dims, keep), false, "sum" + args);
      case 1:
        return add_value(mean(a, dims, keep), false, "mean" + args);
      case 2:
        return add_value(amax(a, dims, keep), false, "amax" + args);
      case 3:
        return add_value(amin(a, dims, keep), false, "amin" + args);
      default:
        if (dims.empty()) dims.push_back(0);
        if (a.dim() == 0) return add_value(sum(a), false, "sum(" + n + ")");
        return add_value(log(sum(exp(a), dims, keep)), false, "log(sum(exp" + args + "))");
    }
  }

  void softmax_op() {
    size_t i = pick();
    const Tensor& a = pool_[i];
    const std::string n = name(i);
    if (a.dim() == 0) return add_value(a.sum() * 2, false, "sum(" + n + ") * 2");
    int64_t d = uniform(-a.dim(), a.dim() - 1);
    const std::string args = "(" + n + ", " + std::to_string(d) + ")";
    switch (uniform(0, exp_log_ ? 3 : 1)) {
      case 0:
        return add_value(softmax(a, d), false, "softmax" + args);
      case 1:
        return add_value(log_softmax(a, d), false, "log_softmax" + args);
      case 2:
        return add_value(log(softmax(a, d)), false, "log(softmax" + args + ")");
      default:
        return add_value(exp(a) / sum(exp(a), {d}, true), false, "exp/sum(exp)" + args);
    }
  }

  void matmul_op() {
    size_t i = pick();
    const Tensor a = pool_[i];
    const std::string n = name(i);
    if (a.dim() == 0) return unary();
    const int64_t k = a.size(-1);
    if (a.dim() == 2 && chance(0.25))
      return add_value(matmul(a, a.t()), false, "matmul(" + n + ", " + n + ".t())");
    for (int attempt = 0; attempt < 6; ++attempt) {
      size_t j = pick();
      const Tensor& b = pool_[j];
      bool fits = (b.dim() == 1 && b.size(0) == k) || (b.dim() == 2 && b.size(0) == k);
      if (fits) return add_value(matmul(a, b), false, "matmul(" + n + ", " + name(j) + ")");
    }
    Shape s = chance(0.3) ? Shape{k} : Shape{k, uniform(1, max_size_)};
    Tensor b = input(s);
    add_value(b, false, "input");
    add_value(matmul(a, b), false, "matmul(" + n + ", " + name(pool_.size() - 1) + ")");
  }

  void inplace() {
    size_t i = pick();
    if (overlapping_[i]) return scalar();
    Tensor a = pool_[i];
    const std::string n = name(i);
    switch (uniform(0, 3)) {
      case 0:
        a.mul_(-1.5);
        log_ += n + ".mul_(-1.5)\n";
        return;
      case 1: {
        auto [b, nb] = partner(a.sizes(), true, a.dtype());
        a.add_(b);
        log_ += n + ".add_(" + nb + ")\n";
        return;
      }
      case 2:
        a.clamp_(-1.0, 1.0);
        log_ += n + ".clamp_(-1, 1)\n";
        return;
      default: {
        auto [b, nb] = partner(a.sizes(), true, a.dtype());
        a.copy_(b * 0.5);
        log_ += n + ".copy_(" + nb + " * 0.5)\n";
        return;
      }
    }
  }

  // A value read mid-program (a no-op in eager mode).
  void read() {
    size_t i = pick();
    if (chance(0.5)) {
      kiln::eval(pool_[i]);
      log_ += "eval(" + name(i) + ")\n";
    } else {
      (void)pool_[i].sum().item();
      log_ += "item(sum(" + name(i) + "))\n";
    }
  }

  std::mt19937_64 rng_;
  bool exp_log_;
  DType dtype_ = kFloat32;
  bool mixed_ = false;
  int64_t max_size_ = 5;
  std::vector<Tensor> pool_;
  std::vector<bool> overlapping_;
  std::string log_;
};

// Runs `count` programs eagerly and lazily and compares every value (see same_bits).
void check_random_programs(int count, uint64_t seed0, bool exp_log) {
  int64_t lazy_evaluations = 0, compared = 0;
  for (int p = 0; p < count; ++p) {
    const uint64_t seed = seed0 + static_cast<uint64_t>(p);
    RandomProgram eager_program(seed, exp_log), lazy_program(seed, exp_log);
    std::vector<Tensor> want, got;
    {
      LazyGuard off(false);
      want = eager_program.run();
    }
    const int64_t e0 = evaluations();
    {
      LazyGuard on(true);
      got = lazy_program.run();
      bool any_pending = false;
      for (const Tensor& t : got) any_pending |= is_pending(t);
      EXPECT_TRUE(any_pending || evaluations() > e0) << "program " << seed << " ran eagerly";
      kiln::eval(got);
      for (const Tensor& t : got) ASSERT_FALSE(is_pending(t));
    }
    lazy_evaluations += evaluations() - e0;
    ASSERT_EQ(eager_program.history(), lazy_program.history())
        << "program " << seed << " took different paths in eager and lazy mode";
    ASSERT_EQ(want.size(), got.size());
    for (size_t k = 0; k < want.size(); ++k) {
      std::string why;
      EXPECT_TRUE(same_bits(got[k], want[k], &why))
          << "program " << seed << ", value v" << k << ": " << why << "\n"
          << lazy_program.history();
      if (!has_nan(want[k]) && !is_floating_point(want[k].dtype())) {
        EXPECT_TRUE(eager([&] { return equal(got[k], want[k]); }));
      }
      ++compared;
    }
    if (::testing::Test::HasFailure()) break;
  }
  std::printf("[ lazy ] %d random programs: %lld values compared, %lld lazy evaluations\n", count,
              static_cast<long long>(compared), static_cast<long long>(lazy_evaluations));
}

TEST_F(Lazy, RandomProgramsMatchEager) {
  check_random_programs(static_cast<int>(testing::scaled(200, 40)), 1000, false);
}

// With exp and log, stabilizable patterns appear; with the stabilize pass off, lazy mode must
// still agree with eager (see same_bits).
TEST_F(Lazy, RandomProgramsWithExpAndLogMatchEagerWithoutStabilize) {
  // set_disabled_passes overrides KILN_DISABLE_PASSES; restore what was in effect.
  std::vector<std::string> previous;
  for (const char* pass : {"dce", "cse", "fold", "canonicalize", "stabilize"})
    if (jit::pass_disabled(pass)) previous.emplace_back(pass);
  struct Restore {
    std::vector<std::string> names;
    ~Restore() { jit::set_disabled_passes(names); }
  } restore{previous};
  std::vector<std::string> disabled = previous;
  disabled.emplace_back("stabilize");
  jit::set_disabled_passes(disabled);
  check_random_programs(200, 5000, true);
}

// ------------------------------------------------------------------------------- in-place writes

TEST_F(Lazy, AValueRecordedBeforeAnInPlaceWriteKeepsTheOldValues) {
  Tensor base = concrete_random({3, 4});
  Tensor x = base + 1;
  Tensor y = x * 2;
  ASSERT_TRUE(is_pending(x) && is_pending(y));
  x.add_(1);
  EXPECT_TRUE(equal(y, eager([&] { return (base + 1) * 2; })));
  EXPECT_TRUE(equal(x, eager([&] { return (base + 1).add_(1); })));
  // And a value recorded after the write sees the new one.
  Tensor z = x * 2;
  EXPECT_TRUE(equal(z, eager([&] { return (base + 1).add_(1) * 2; })));
}

TEST_F(Lazy, AnInPlaceWriteThroughAViewOfAPendingTensorReachesTheBase) {
  Tensor base = concrete_random({3, 4});
  Tensor x = base + 1;
  Tensor v = x.t();
  ASSERT_TRUE(is_pending(v));
  Tensor before = v * 1.5;  // recorded before the write
  v.mul_(3);
  Tensor want = eager([&] {
    Tensor w = base + 1;
    w.t().mul_(3);
    return w;
  });
  EXPECT_TRUE(equal(x, want)) << x << " vs " << want;
  EXPECT_TRUE(equal(v, eager([&] { return want.t(); })));
  EXPECT_TRUE(equal(before, eager([&] { return (base + 1).t() * 1.5; })));
  // Several views of one pending storage, written one after the other.
  Tensor x2 = base * 2;
  x2.select(0, 1).fill_(7);
  x2.slice(1, 0, 4, 2).mul_(-1);
  Tensor want2 = eager([&] {
    Tensor w = base * 2;
    w.select(0, 1).fill_(7);
    w.slice(1, 0, 4, 2).mul_(-1);
    return w;
  });
  EXPECT_TRUE(equal(x2, want2)) << x2 << " vs " << want2;
}

TEST_F(Lazy, AnInPlaceWriteToAConcreteTensorThatPendingNodesReadFlushesThemFirst) {
  Tensor c = concrete({1, 2, 3, 4}, {4});
  Tensor y = c * 2 + 1;  // pending, reads c
  Tensor z = c.slice(0, 1, 3).sum();
  ASSERT_TRUE(is_pending(y) && is_pending(z));
  c.add_(10);
  EXPECT_EQ(y.to_vector<double>(), std::vector<double>({3, 5, 7, 9}));
  EXPECT_EQ(z.item<double>(), 5.0);
  EXPECT_EQ(c.to_vector<double>(), std::vector<double>({11, 12, 13, 14}));
  // Writing through the mutable data pointer flushes too.
  Tensor w = c + 1;
  ASSERT_TRUE(is_pending(w));
  c.data_ptr<double>()[0] = 100;
  EXPECT_EQ(w.to_vector<double>(), std::vector<double>({12, 13, 14, 15}));
  EXPECT_EQ(c.to_vector<double>(), std::vector<double>({100, 12, 13, 14}));
  // And through a view of the concrete tensor.
  Tensor u = c * 1.0 - 1;
  c.slice(0, 2, 4).fill_(0);
  EXPECT_EQ(u.to_vector<double>(), std::vector<double>({99, 11, 12, 13}));
  EXPECT_EQ(c.to_vector<double>(), std::vector<double>({100, 12, 0, 0}));
}

// A value computed by one evaluation and written in place afterwards: pending work recorded
// before the write still reads it through the computed node, and must see the old values
// (eval, item() and copy_ each compute a prefix of the pending work).
TEST_F(Lazy, AWriteAfterAPartialEvaluationKeepsPendingReadersOnTheOldValues) {
  const std::vector<std::pair<std::string, std::function<void(const Tensor&)>>> computes = {
      {"eval", [](const Tensor& v) { eval(v); }},
      {"item()", [](const Tensor& v) { (void)v[0].item<float>(); }},
      {"copy_", [](const Tensor& v) {
         Tensor dst = zeros({2});
         dst.copy_(v);
       }}};
  for (const auto& [name, compute] : computes) {
    Tensor x = concrete({1, 2}, {2}, kFloat32);
    Tensor v1 = x * 1.f;
    Tensor v4 = v1 * 10.f;
    Tensor view_reader = v1.slice(0, 1, 2) * 3.f;
    compute(v1);
    ASSERT_TRUE(is_pending(v4)) << name;
    v1.add_(100.f);
    EXPECT_EQ(v4.to_vector<double>(), std::vector<double>({10, 20})) << name;
    EXPECT_EQ(view_reader.to_vector<double>(), std::vector<double>({6})) << name;
    EXPECT_EQ(v1.to_vector<double>(), std::vector<double>({101, 102})) << name;
  }
}

TEST_F(Lazy, CopyIntoASliceOfAPendingTensor) {
  Tensor base = concrete_random({4, 5});
  Tensor src = concrete_random({2, 5});
  Tensor x = base + 1;
  Tensor before = x * 1.5;
  x.slice(0, 1, 3).copy_(src);
  Tensor want = eager([&] {
    Tensor w = base + 1;
    w.slice(0, 1, 3).copy_(src);
    return w;
  });
  EXPECT_TRUE(equal(x, want)) << x << " vs " << want;
  EXPECT_TRUE(equal(before, eager([&] { return (base + 1) * 1.5; })));
  // A pending source into a strided slice of a pending destination.
  Tensor d = base * 3;
  Tensor s = sin(src.t());  // [5, 2], pending
  d.slice(1, 0, 4, 2).copy_(s.slice(0, 1, 5));
  d.slice(1, 1, 5, 2).copy_(s.sum({0}, true).expand({4, 2}));
  Tensor want_d = eager([&] {
    Tensor w = base * 3;
    Tensor ws = sin(src.t());
    w.slice(1, 0, 4, 2).copy_(ws.slice(0, 1, 5));
    w.slice(1, 1, 5, 2).copy_(ws.sum({0}, true).expand({4, 2}));
    return w;
  });
  EXPECT_TRUE(equal(d, want_d)) << d << " vs " << want_d;
}

// ---------------------------------------------------------------------------------- autograd

TEST_F(Lazy, BackwardOnPendingValuesMatchesEagerAndIsRecorded) {
  Tensor x = concrete_random({5, 3});
  Tensor target = concrete_random({5, 2}, kFloat64, 0, 1);
  struct Params {
    Tensor w1, b1, w2, b2;
    std::vector<Tensor> all() const { return {w1, b1, w2, b2}; }
  };
  Tensor w1v = concrete_random({3, 4}), b1v = concrete_random({4}), w2v = concrete_random({4, 2}),
         b2v = concrete_random({1, 2});
  auto make = [&] {
    LazyGuard off(false);
    return Params{w1v.clone().requires_grad_(), b1v.clone().requires_grad_(),
                  w2v.clone().requires_grad_(), b2v.clone().requires_grad_()};
  };
  auto loss_of = [&](const Params& p) {
    Tensor h = tanh(x.matmul(p.w1) + p.b1);  // b1 broadcast over rows
    Tensor out = sigmoid(h.matmul(p.w2) + p.b2);
    Tensor d = out - target;
    return (d * d).mean() + (h * h).sum() * 0.01 + p.w1.pow(2).sum() * 1e-3;
  };
  Params pe = make(), pl = make();
  Tensor loss_e;
  {
    LazyGuard off(false);
    loss_e = loss_of(pe);
    loss_e.backward();
  }
  Tensor loss_l = loss_of(pl);
  EXPECT_TRUE(is_pending(loss_l));
  const int64_t e0 = evaluations();
  loss_l.backward();
  const int64_t backward_evaluations = evaluations() - e0;
  EXPECT_EQ(backward_evaluations, 0) << "backward ran the pending trace";
  const char* names[] = {"w1", "b1", "w2", "b2"};
  std::vector<Tensor> ge, gl;
  for (const Tensor& p : pe.all()) ge.push_back(p.grad());
  for (const Tensor& p : pl.all()) gl.push_back(p.grad());
  for (size_t i = 0; i < gl.size(); ++i) {
    ASSERT_TRUE(gl[i].defined()) << names[i];
    EXPECT_TRUE(is_pending(gl[i]))
        << "the gradient of " << names[i] << " was computed by backward instead of recorded";
  }
  EXPECT_TRUE(is_pending(loss_l));
  kiln::eval(gl);
  EXPECT_EQ(evaluations(), e0 + 1);
  // The loss folds fused reductions in another order than the reference kernels: within
  // testing::lazy_close (the gradients below are bit-equal).
  EXPECT_TRUE(testing::lazy_close(loss_l.item<double>(), loss_e.item<double>(), loss_e.dtype()))
      << std::setprecision(17) << loss_l.item<double>() << " vs " << loss_e.item<double>();
  for (size_t i = 0; i < gl.size(); ++i) {
    std::string why;
    EXPECT_TRUE(same_bits(gl[i], ge[i], &why)) << names[i] << ": " << why;
  }

  // A second backward accumulates into the existing gradients. That accumulation is in place
  // (grad.add_(g), as torch's AccumulateGrad), and an in-place write flushes the pending trace,
  // so this backward is computed as it goes: at most one evaluation per parameter.
  {
    LazyGuard off(false);
    loss_of(pe).backward();
  }
  Tensor loss2 = loss_of(pl);
  const int64_t e1 = evaluations();
  loss2.backward();
  EXPECT_LE(evaluations() - e1, 4);
  for (size_t i = 0; i < gl.size(); ++i) {
    const Tensor& g = pl.all()[i].grad();
    EXPECT_TRUE(g.is_same(gl[i])) << names[i] << ": accumulated into a new tensor";
    std::string why;
    EXPECT_TRUE(same_bits(g, pe.all()[i].grad(), &why)) << names[i] << ": " << why;
  }
}

// ---------------------------------------------------------------------------------- LazyGuard

TEST(LazyGuardTest, TurnsRecordingOffForAScopeAndNestingRestores) {
  Tensor x = concrete({1, 2, 3}, {3});
  LazyGuard outer(true);
  EXPECT_TRUE(is_lazy_enabled());
  Tensor pending = x * 2;
  EXPECT_TRUE(is_pending(pending));
  {
    LazyGuard off(false);
    EXPECT_FALSE(is_lazy_enabled());
    const int64_t e0 = evaluations();
    Tensor y = exp(x) * 2 + 1;
    EXPECT_FALSE(is_pending(y));
    EXPECT_EQ(evaluations(), e0) << "eager ops went through the evaluator";
    EXPECT_NEAR(y.to_vector<double>()[2], std::exp(3.0) * 2 + 1, 1e-12);
    {
      LazyGuard on(true);
      EXPECT_TRUE(is_lazy_enabled());
      Tensor z = x + 1;
      EXPECT_TRUE(is_pending(z));
      EXPECT_EQ(z.to_vector<double>(), std::vector<double>({2, 3, 4}));
    }
    EXPECT_FALSE(is_lazy_enabled());
    Tensor w = x * 3;
    EXPECT_FALSE(is_pending(w));
    // An eager op on a pending input computes it.
    Tensor r = pending + 1;
    EXPECT_FALSE(is_pending(r));
    EXPECT_EQ(r.to_vector<double>(), std::vector<double>({3, 5, 7}));
  }
  EXPECT_TRUE(is_lazy_enabled());
  EXPECT_TRUE(is_pending(x * 4));
  {
    LazyGuard off(false);
    set_lazy_enabled(true);  // changed inside the scope: the guard still restores its own
    EXPECT_TRUE(is_lazy_enabled());
  }
  EXPECT_TRUE(is_lazy_enabled());
  {
    LazyGuard a(false);
    { LazyGuard b(false); }
    EXPECT_FALSE(is_lazy_enabled());
  }
  EXPECT_TRUE(is_lazy_enabled());
}

}  // namespace
}  // namespace kiln
