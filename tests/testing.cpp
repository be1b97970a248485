// Implementation of the shared test helpers in tests/testing.h.
#include "tests/testing.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "exec/lazy_eval.h"
#include "kiln/jit.h"
#include "lib/tensor_impl.h"

namespace kiln::testing {

std::mt19937_64& rng() {
  static std::mt19937_64 gen;
  static std::string seeded_for;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "";
  if (name != seeded_for) {
    gen.seed(std::hash<std::string>{}(name));
    seeded_for = name;
  }
  return gen;
}

Shape random_shape(int min_rank, int max_rank, int64_t max_size, bool allow_zero) {
  auto& g = rng();
  int rank = std::uniform_int_distribution<int>(min_rank, max_rank)(g);
  Shape s(rank);
  for (auto& d : s) {
    // Size 0 rarely, size 1 often (for broadcasting), otherwise up to max_size.
    int pick = std::uniform_int_distribution<int>(0, 9)(g);
    if (allow_zero && pick == 0)
      d = 0;
    else if (pick <= 2)
      d = 1;
    else
      d = std::uniform_int_distribution<int64_t>(1, max_size)(g);
  }
  return s;
}

Tensor random_tensor(const Shape& shape, DType dtype, double lo, double hi) {
  auto& g = rng();
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v(n);
  for (auto& x : v) {
    if (dtype == kBool)
      x = std::uniform_int_distribution<int>(0, 1)(g);
    else if (is_integral(dtype))
      x = std::floor(std::uniform_real_distribution<double>(lo, hi)(g));
    else
      x = std::uniform_real_distribution<double>(lo, hi)(g);
  }
  return from_vector(v, shape).to(dtype);
}

std::vector<std::pair<std::string, Tensor>> layouts(const Tensor& t) {
  std::vector<std::pair<std::string, Tensor>> out;
  Tensor c = t.contiguous();
  out.emplace_back("contiguous", c);
  if (t.dim() >= 2) {
    // Reverse the dims, copy, reverse back: same values, column-major-like strides.
    std::vector<int64_t> rev(t.dim());
    for (int64_t i = 0; i < t.dim(); ++i) rev[i] = t.dim() - 1 - i;
    out.emplace_back("transposed", c.permute(rev).contiguous().permute(rev));
  }
  if (t.dim() >= 1) {
    // Every other element of a tensor twice as long in the last dim.
    Shape big = t.sizes();
    big.back() *= 2;
    Tensor b = zeros(big, t.dtype());
    Tensor view = b.slice(-1, 0, std::nullopt, 2);
    view.copy_(c);
    out.emplace_back("strided", view);
  }
  bool has_one = false;
  for (int64_t d : t.sizes()) has_one |= d == 1;
  if (has_one) {
    // Squeeze-then-expand: the size-1 dims become stride-0 broadcasts of the same values.
    Shape sq;
    for (int64_t d : t.sizes())
      if (d != 1) sq.push_back(d);
    Shape view_shape = t.sizes();
    out.emplace_back("expanded", c.reshape(sq).reshape(view_shape).expand(view_shape));
  }
  return out;
}

std::vector<double> values(const Tensor& t) {
  return t.to_vector<double>();
}

Shape broadcast_shape(const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    idx[i] = shape[i] ? flat % shape[i] : 0;
    flat = shape[i] ? flat / shape[i] : 0;
  }
  return idx;
}

int64_t ravel(const std::vector<int64_t>& index, const Shape& shape) {
  int64_t flat = 0;
  for (size_t i = 0; i < shape.size(); ++i) flat = flat * shape[i] + index[i];
  return flat;
}

double broadcast_at(const Tensor& t, const std::vector<double>& tv,
                    const std::vector<int64_t>& index, const Shape& shape) {
  const Shape& ts = t.sizes();
  size_t off = shape.size() - ts.size();
  int64_t flat = 0;
  for (size_t i = 0; i < ts.size(); ++i) flat = flat * ts[i] + (ts[i] == 1 ? 0 : index[off + i]);
  return tv[flat];
}

void expect_close(const Tensor& actual, const std::vector<double>& expected, const Shape& shape,
                  DType dtype, double rtol, double atol) {
  ASSERT_TRUE(actual.defined());
  ASSERT_EQ(actual.sizes(), shape);
  ASSERT_EQ(actual.dtype(), dtype);
  std::vector<double> got = values(actual);
  ASSERT_EQ(got.size(), expected.size());
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double e = expected[i], a = got[i];
    bool ok = (std::isnan(e) && std::isnan(a)) || a == e ||
              std::fabs(a - e) <= atol + rtol * std::fabs(e);
    if (!ok && reported++ < 5) {
      ADD_FAILURE() << "element " << i << " of shape " << ::testing::PrintToString(shape)
                    << ": got " << a << ", expected " << e;
    }
  }
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected kiln::Error, nothing was thrown";
  } catch (const kiln::Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message '" << msg << "' lacks '" << p << "'";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected kiln::Error, got another exception: " << e.what();
  }
}

}  // namespace kiln::testing

namespace kiln::testing {

std::vector<unsigned char> bytes(const Tensor& t) {
  LazyGuard eager(false);
  Tensor c = t.contiguous();
  std::vector<unsigned char> out(static_cast<size_t>(c.numel()) * element_size(c.dtype()));
  if (!out.empty()) std::memcpy(out.data(), c.raw_data_ptr(), out.size());
  return out;
}

void expect_bit_equal(const Tensor& lazy, const Tensor& eager, const std::string& what) {
  ASSERT_EQ(lazy.defined(), eager.defined()) << what;
  if (!lazy.defined()) return;
  ASSERT_EQ(lazy.sizes(), eager.sizes()) << what;
  ASSERT_EQ(lazy.dtype(), eager.dtype()) << what;
  const std::vector<unsigned char> a = bytes(lazy), b = bytes(eager);
  bool same = a == b;
  if (!same && is_floating_point(lazy.dtype())) {
    // Element by element, with any NaN matching any NaN.
    same = true;
    const size_t size = element_size(lazy.dtype());
    for (size_t i = 0; same && i < a.size(); i += size) {
      if (std::memcmp(&a[i], &b[i], size) == 0) continue;
      double x, y;
      if (size == 4) {
        float fx, fy;
        std::memcpy(&fx, &a[i], 4);
        std::memcpy(&fy, &b[i], 4);
        x = fx, y = fy;
      } else {
        std::memcpy(&x, &a[i], 8);
        std::memcpy(&y, &b[i], 8);
      }
      same = std::isnan(x) && std::isnan(y);
    }
  }
  EXPECT_TRUE(same) << what << ": lazy " << lazy << "\neager " << eager;
}

bool lazy_close(double lazy, double eager, DType dtype) {
  if (std::isnan(lazy) || std::isnan(eager)) return std::isnan(lazy) && std::isnan(eager);
  if (lazy == eager) return true;
  if (!is_floating_point(dtype) || std::isinf(lazy) || std::isinf(eager)) return false;
  const double rtol = dtype == kFloat32 ? 1e-5 : 1e-12;
  const double atol = dtype == kFloat32 ? 1e-6 : 1e-12;
  return std::abs(lazy - eager) <= rtol * std::abs(eager) + atol;
}

void expect_lazy_equal(const Tensor& lazy, const Tensor& eager, const std::string& what) {
  ASSERT_EQ(lazy.defined(), eager.defined()) << what;
  if (!lazy.defined()) return;
  ASSERT_EQ(lazy.sizes(), eager.sizes()) << what;
  ASSERT_EQ(lazy.dtype(), eager.dtype()) << what;
  if (!is_floating_point(lazy.dtype())) {
    expect_bit_equal(lazy, eager, what);
    return;
  }
  std::vector<double> a, b;
  {
    LazyGuard mode(false);
    a = lazy.to_vector<double>();
    b = eager.to_vector<double>();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (lazy_close(a[i], b[i], lazy.dtype())) continue;
    ADD_FAILURE() << what << ": element " << i << ": lazy " << a[i] << ", eager " << b[i]
                  << "\nlazy " << lazy << "\neager " << eager;
    return;
  }
}

std::pair<Tensor, Tensor> expect_replay_matches(const std::vector<Tensor>& traced,
                                                const std::vector<Tensor>& reloaded,
                                                const std::vector<Tensor>& lazy,
                                                const std::vector<Tensor>& eager) {
  EXPECT_EQ(traced.size(), eager.size());
  EXPECT_EQ(reloaded.size(), eager.size());
  if (!lazy.empty()) {
    EXPECT_EQ(lazy.size(), eager.size());
  }
  Tensor loss_traced = zeros({}, kFloat64), loss_eager = zeros({}, kFloat64);
  for (size_t k = 0; k < eager.size() && k < traced.size() && k < reloaded.size(); ++k) {
    expect_lazy_equal(traced[k], eager[k], "traced output " + std::to_string(k));
    expect_lazy_equal(reloaded[k], eager[k], "loaded output " + std::to_string(k));
    if (k < lazy.size()) expect_lazy_equal(lazy[k], eager[k], "lazy output " + std::to_string(k));
    loss_traced = loss_traced + (traced[k] * (static_cast<double>(k) + 1)).sum();
    loss_eager = loss_eager + (eager[k] * (static_cast<double>(k) + 1)).sum();
  }
  return {loss_traced, loss_eager};
}

void check_lazy(const std::string& what, const std::function<std::vector<Tensor>()>& f,
                bool expect_pending) {
  SCOPED_TRACE(what);
  std::vector<Tensor> eager, lazy;
  {
    LazyGuard mode(false);
    eager = f();
  }
  {
    LazyGuard mode(true);
    lazy = f();
    if (expect_pending) {
      for (const Tensor& t : lazy) EXPECT_TRUE(detail::is_pending(t)) << what;
    }
  }
  ASSERT_EQ(lazy.size(), eager.size());
  const int64_t executed = jit::lazy_stats().nodes_executed;
  for (size_t i = 0; i < lazy.size(); ++i)
    expect_lazy_equal(lazy[i], eager[i], what + " output " + std::to_string(i));
  // The pending outputs were computed by the executor, not by an eager fallback (empty outputs
  // have no data to compute).
  bool has_data = false;
  for (const Tensor& t : lazy) has_data = has_data || (t.defined() && t.numel() > 0);
  if (expect_pending && has_data) {
    EXPECT_GT(jit::lazy_stats().nodes_executed, executed) << what;
  }
}

Tensor input(const Shape& shape, DType dtype, double lo, double hi) {
  LazyGuard eager(false);
  return random_tensor(shape, dtype, lo, hi);
}

std::vector<std::pair<std::string, Tensor>> input_layouts(const Tensor& t) {
  LazyGuard eager(false);
  return layouts(t);
}

void NoFlushEnvironment::SetUp() {
  saved_ = detail::max_pending();
  detail::set_max_pending(int64_t{1} << 40);
}
void NoFlushEnvironment::TearDown() {
  detail::set_max_pending(saved_);
}

ChildRun run_this_binary(const std::string& env, const std::string& args) {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  EXPECT_GT(n, 0);
  exe[n > 0 ? n : 0] = '\0';
  const std::string command = "env -u GTEST_TOTAL_SHARDS -u GTEST_SHARD_INDEX " + env +
                              " timeout -s KILL 60 '" + exe + "' " + args + " 2>&1";
  ChildRun run;
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr) << command;
  if (!pipe) return run;
  char buf[1024];
  while (std::fgets(buf, sizeof buf, pipe)) run.output += buf;
  run.status = pclose(pipe);
  return run;
}

}  // namespace kiln::testing
