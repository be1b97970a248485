// Reductions against float64 reference loops: random shapes, dim subsets, layouts and dtypes, plus
// NaN propagation, ties, empty inputs, errors, result dtypes and large (parallel) inputs.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>

#include "lib/op_table.h"
#include "lib/tensor_impl.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::rng;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ------------------------------------------------------------------------------- reference

// A group of reduced values per output element (row-major over the kept dims); within a group the
// values are in row-major order over the reduced dims.
struct Reference {
  Shape out_shape;
  std::vector<std::vector<double>> groups;
};

std::vector<bool> reduced_mask(int64_t nd, const std::vector<int64_t>& dims) {
  std::vector<bool> mask(static_cast<size_t>(nd), dims.empty());
  for (int64_t d : dims) {
    if (nd == 0) continue;
    mask[static_cast<size_t>(d < 0 ? d + nd : d)] = true;
  }
  return mask;
}

Reference reference(const std::vector<double>& v, const Shape& shape,
                    const std::vector<int64_t>& dims, bool keepdim) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  std::vector<bool> mask = reduced_mask(nd, dims);
  Reference r;
  for (int64_t d = 0; d < nd; ++d) {
    if (mask[d]) {
      if (keepdim) r.out_shape.push_back(1);
    } else {
      r.out_shape.push_back(shape[d]);
    }
  }
  // Each dim's step in the row index (0 for reduced dims), walked with an odometer.
  std::vector<int64_t> step(static_cast<size_t>(nd), 0);
  int64_t rows = 1;
  for (int64_t d = nd - 1; d >= 0; --d) {
    if (!mask[d]) {
      step[d] = rows;
      rows *= shape[d];
    }
  }
  r.groups.resize(static_cast<size_t>(rows));
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  int64_t row = 0;
  for (double x : v) {
    r.groups[row].push_back(x);
    for (int64_t d = nd - 1; d >= 0; --d) {
      row += step[d];
      if (++idx[d] < shape[d]) break;
      row -= step[d] * shape[d];
      idx[d] = 0;
    }
  }
  return r;
}

template <typename F>
std::vector<double> per_group(const Reference& r, const F& f) {
  std::vector<double> out;
  for (const auto& g : r.groups) out.push_back(f(g));
  return out;
}

double ref_sum(const std::vector<double>& g) {
  double s = 0;
  for (double x : g) s += x;
  return s;
}
double ref_prod(const std::vector<double>& g) {
  double p = 1;
  for (double x : g) p *= x;
  return p;
}
double ref_mean(const std::vector<double>& g) {
  return ref_sum(g) / static_cast<double>(g.size());
}
// Index of the max (or min): first occurrence on ties, the first NaN wins.
int64_t ref_arg(const std::vector<double>& g, bool is_max) {
  int64_t best = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(g.size()); ++i) {
    if (std::isnan(g[i])) return i;
    if (is_max ? g[i] > g[best] : g[i] < g[best]) best = i;
  }
  return best;
}
double ref_extremum(const std::vector<double>& g, bool is_max) {
  return g[ref_arg(g, is_max)];
}
double ref_var(const std::vector<double>& g, int64_t correction) {
  double n = static_cast<double>(g.size());
  if (n - static_cast<double>(correction) <= 0) return kNaN;
  double m = ref_mean(g), ss = 0;
  for (double x : g) ss += (x - m) * (x - m);
  return ss / (n - static_cast<double>(correction));
}
double ref_logsumexp(const std::vector<double>& g) {
  if (g.empty()) return -kInf;
  double m = -kInf;
  for (double x : g) {
    if (std::isnan(x)) return kNaN;
    m = std::max(m, x);
  }
  if (std::isinf(m)) return m;
  double s = 0;
  for (double x : g) s += std::exp(x - m);
  return std::log(s) + m;
}

// ------------------------------------------------------------------------------- random cases

// A random subset of the dims, each possibly negative, in random order; may be empty (all dims).
std::vector<int64_t> random_dims(int64_t nd) {
  auto& g = rng();
  std::vector<int64_t> dims;
  if (nd == 0) {
    int pick = std::uniform_int_distribution<int>(0, 2)(g);
    if (pick == 1) dims = {0};
    if (pick == 2) dims = {-1};
    return dims;
  }
  for (int64_t d = 0; d < nd; ++d) {
    if (std::uniform_int_distribution<int>(0, 1)(g)) {
      dims.push_back(std::uniform_int_distribution<int>(0, 1)(g) ? d - nd : d);
    }
  }
  std::shuffle(dims.begin(), dims.end(), g);
  return dims;
}

bool coin() {
  return std::uniform_int_distribution<int>(0, 1)(rng()) == 1;
}

// Values for a tensor of `dtype`: integer-valued (so ties happen) or continuous, with NaN/inf
// sprinkled in floating tensors when `specials`.
Tensor make_input(const Shape& shape, DType dtype, double lo, double hi, bool ties, bool specials) {
  if (dtype == kBool || is_integral(dtype) || !(ties || specials))
    return testing::random_tensor(shape, dtype, lo, hi);
  auto& g = rng();
  std::vector<double> v(static_cast<size_t>(detail::shape_numel(shape)));
  for (auto& x : v) {
    x = std::uniform_real_distribution<double>(lo, hi)(g);
    if (ties) x = std::floor(x);
    if (specials) {
      int pick = std::uniform_int_distribution<int>(0, 19)(g);
      if (pick == 0) x = kNaN;
      if (pick == 1) x = kInf;
      if (pick == 2) x = -kInf;
    }
  }
  return from_vector(v, shape).to(dtype);
}

std::string describe_case(const Tensor& x, const std::string& layout,
                          const std::vector<int64_t>& dims, bool keepdim) {
  std::ostringstream os;
  os << detail::describe(x) << " layout " << layout << " dims " << detail::shape_str(dims)
     << " keepdim " << keepdim;
  return os.str();
}

double rtol_for(DType t) {
  return t == kFloat32 ? 1e-5 : 1e-10;
}
double atol_for(DType t) {
  return t == kFloat32 ? 1e-5 : 1e-10;
}

struct Options {
  int cases = 150;
  std::vector<DType> dtypes{kFloat32, kFloat64, kInt32, kInt64, kBool};
  double lo = -3, hi = 3;
  bool ties = false;
  bool specials = false;
};

// Calls body(x, layout_tensor, dims, keepdim) for random cases over every layout.
template <typename Body>
void for_each_case(const Options& o, const Body& body) {
  for (int c = 0; c < o.cases; ++c) {
    for (DType dt : o.dtypes) {
      Shape shape = testing::random_shape(0, 4, 5);
      std::vector<int64_t> dims = random_dims(static_cast<int64_t>(shape.size()));
      bool keepdim = coin();
      bool ties = o.ties && coin();
      bool specials = o.specials && coin();
      Tensor x = make_input(shape, dt, o.lo, o.hi, ties, specials);
      for (const auto& [name, lx] : testing::layouts(x)) {
        SCOPED_TRACE(describe_case(x, name, dims, keepdim));
        body(x, lx, dims, keepdim);
      }
    }
  }
}

int64_t reduced_count(const Shape& shape, const std::vector<int64_t>& dims) {
  std::vector<bool> mask = reduced_mask(static_cast<int64_t>(shape.size()), dims);
  int64_t n = 1;
  for (size_t d = 0; d < shape.size(); ++d)
    if (mask[d]) n *= shape[d];
  return n;
}

DType sum_type(DType t) {
  return is_floating_point(t) ? t : kInt64;
}

// ------------------------------------------------------------------------------- random tests

TEST(Reduce, SumMatchesReference) {
  for_each_case(
      {}, [](const Tensor& x, const Tensor& lx, const std::vector<int64_t>& dims, bool keepdim) {
        Reference r = reference(testing::values(x), x.sizes(), dims, keepdim);
        DType out = sum_type(x.dtype());
        expect_close(sum(lx, dims, keepdim), per_group(r, ref_sum), r.out_shape, out, rtol_for(out),
                     atol_for(out));
      });
}

TEST(Reduce, SumWithDtypeConvertsFirst) {
  Options o;
  o.cases = 20;
  o.dtypes = {kFloat32, kInt32, kBool};
  for_each_case(
      o, [](const Tensor& x, const Tensor& lx, const std::vector<int64_t>& dims, bool keepdim) {
        for (DType target : {kFloat64, kInt64, kInt32}) {
          Reference r = reference(testing::values(x.to(target)), x.sizes(), dims, keepdim);
          expect_close(sum(lx, dims, keepdim, target), per_group(r, ref_sum), r.out_shape, target,
                       rtol_for(target), atol_for(target));
        }
      });
}

TEST(Reduce, MeanMatchesReference) {
  Options o;
  o.dtypes = {kFloat32, kFloat64};
  o.specials = true;
  for_each_case(
      o, [](const Tensor& x, const Tensor& lx, const std::vector<int64_t>& dims, bool keepdim) {
        Reference r = reference(testing::values(x), x.sizes(), dims, keepdim);
        expect_close(mean(lx, dims, keepdim), per_group(r, ref_mean), r.out_shape, x.dtype(),
                     rtol_for(x.dtype()), atol_for(x.dtype()));
      });
}

TEST(Reduce, ProdMatchesReference) {
  Options o;
  o.lo = -1.5;
  o.hi = 1.5;  // integers in {-2, -1, 0, 1}: products stay small
  for_each_case(
      o, [](const Tensor& x, const Tensor& lx, const std::vector<int64_t>& dims, bool keepdim) {
        Reference r = reference(testing::values(x), x.sizes(), dims, keepdim);
        DType out = sum_type(x.dtype());
        expect_close(prod(lx, dims, keepdim), per_group(r, ref_prod), r.out_shape, out,
                     rtol_for(out), 1e-12);
      });
}

TEST(Reduce, AmaxAminMatchReference) {
  Options o;
  o.ties = true;
  o.specials = true;
  for_each_case(
      o, [](const Tensor& x, const Tensor& lx, const std::vector<int64_t>& dims, bool keepdim) {
        if (reduced_count(x.sizes(), dims) == 0) {
          expect_error([&] { amax(lx, dims, keepdim); }, {"amax", detail::describe(lx)});
          expect_error([&] { amin(lx, dims, keepdim); }, {"amin", detail::describe(lx)});
          return;
        }
        Reference r = reference(testing::values(x), x.sizes(), dims, keepdim);
        expect_close(amax(lx, dims, keepdim),
                     per_group(r, [](auto& g) { return ref_extremum(g, true); }), r.out_shape,
                     x.dtype(), 0, 0);
        expect_close(amin(lx, dims, keepdim),
                     per_group(r, [](auto& g) { return ref_extremum(g, false); }), r.out_shape,
                     x.dtype(), 0, 0);
      });
}

TEST(Reduce, MaxMinWithDimMatchReference) {
  Options o;
  o.ties = true;
  o.specials = true;
  for_each_case(o, [](const Tensor& x, const Tensor& lx, const std::vector<int64_t>&,
                      bool keepdim) {
    int64_t nd = x.dim();
    int64_t dim = std::uniform_int_distribution<int64_t>(-std::max<int64_t>(nd, 1),
                                                         std::max<int64_t>(nd, 1) - 1)(rng());
    if (reduced_count(x.sizes(), {dim}) == 0) {
      expect_error([&] { max(lx, dim, keepdim); }, {"max", detail::describe(lx)});
      expect_error([&] { min(lx, dim, keepdim); }, {"min", detail::describe(lx)});
      return;
    }
    Reference r = reference(testing::values(x), x.sizes(), {dim}, keepdim);
    for (bool is_max : {true, false}) {
      auto [values, indices] = is_max ? max(lx, dim, keepdim) : min(lx, dim, keepdim);
      expect_close(values, per_group(r, [&](auto& g) { return ref_extremum(g, is_max); }),
                   r.out_shape, x.dtype(), 0, 0);
      expect_close(indices,
                   per_group(r, [&](auto& g) { return static_cast<double>(ref_arg(g, is_max)); }),
                   r.out_shape, kInt64, 0, 0);
    }
  });
}

TEST(Reduce, FullMaxMinMatchReference) {
  Options o;
  o.ties = true;
  o.specials = true;
  for_each_case(o, [](const Tensor& x, const Tensor& lx, const std::vector<int64_t>&, bool) {
    if (x.numel() == 0) {
      expect_error([&] { max(lx); }, {"max", detail::describe(lx)});
      expect_error([&] { min(lx); }, {"min", detail::describe(lx)});
      return;
    }
    Reference r = reference(testing::values(x), x.sizes(), {}, false);
    expect_close(max(lx), per_group(r, [](auto& g) { return ref_extremum(g, true); }), {},
                 x.dtype(), 0, 0);
    expect_close(min(lx), per_group(r, [](auto& g) { return ref_extremum(g, false); }), {},
                 x.dtype(), 0, 0);
  });
}

TEST(Reduce, ArgmaxArgminMatchReference) {
  Options o;
  o.ties = true;
  o.specials = true;
  for_each_case(
      o, [](const Tensor& x, const Tensor& lx, const std::vector<int64_t>&, bool keepdim) {
        int64_t nd = x.dim();
        std::optional<int64_t> dim;
        if (coin()) {
          dim = std::uniform_int_distribution<int64_t>(-std::max<int64_t>(nd, 1),
                                                       std::max<int64_t>(nd, 1) - 1)(rng());
        }
        std::vector<int64_t> dims;
        if (dim) dims.push_back(*dim);
        if (reduced_count(x.sizes(), dims) == 0) {
          expect_error([&] { argmax(lx, dim, keepdim); }, {"argmax", detail::describe(lx)});
          expect_error([&] { argmin(lx, dim, keepdim); }, {"argmin", detail::describe(lx)});
          return;
        }
        // Without a dim the result indexes the flattened tensor; keepdim keeps every dim as size 1.
        Reference r = reference(testing::values(x), x.sizes(), dims, keepdim);
        expect_close(argmax(lx, dim, keepdim),
                     per_group(r, [](auto& g) { return static_cast<double>(ref_arg(g, true)); }),
                     r.out_shape, kInt64, 0, 0);
        expect_close(argmin(lx, dim, keepdim),
                     per_group(r, [](auto& g) { return static_cast<double>(ref_arg(g, false)); }),
                     r.out_shape, kInt64, 0, 0);
      });
}

TEST(Reduce, VarStdMatchReference) {
  Options o;
  o.dtypes = {kFloat32, kFloat64};
  for_each_case(
      o, [](const Tensor& x, const Tensor& lx, const std::vector<int64_t>& dims, bool keepdim) {
        int64_t correction = std::uniform_int_distribution<int64_t>(0, 2)(rng());
        Reference r = reference(testing::values(x), x.sizes(), dims, keepdim);
        std::vector<double> v = per_group(r, [&](auto& g) { return ref_var(g, correction); });
        std::vector<double> s = v;
        for (double& e : s) e = std::sqrt(e);
        expect_close(var(lx, dims, correction, keepdim), v, r.out_shape, x.dtype(),
                     rtol_for(x.dtype()), atol_for(x.dtype()));
        expect_close(kiln::std(lx, dims, correction, keepdim), s, r.out_shape, x.dtype(),
                     rtol_for(x.dtype()), atol_for(x.dtype()));
      });
}

// A sum of squared deviations past the largest double is an infinite variance, eager and
// fused: never NaN from the correction term's own overflow (its rounding residue squared).
TEST(Reduce, VarOfOverflowingDeviationsIsInfinite) {
  const double big = std::numeric_limits<double>::max();
  for (bool lazy : {false, true}) {
    LazyGuard mode(lazy);
    const Tensor x = from_vector<double>({-2.07, big, -0.86, 0.79}) * 1.0;
    EXPECT_EQ(var(x, {0}, 0).item<double>(), INFINITY) << "lazy " << lazy;
    EXPECT_EQ(kiln::std(x, {0}, 1).item<double>(), INFINITY) << "lazy " << lazy;
    const Tensor f = from_vector<float>({1.0f, 3.4e38f, -2.0f, 0.5f}) * 1.0f;
    EXPECT_EQ(var(f, {0}, 0).item<float>(), INFINITY) << "lazy " << lazy;
  }
}

TEST(Reduce, LogsumexpMatchesReference) {
  Options o;
  o.specials = true;
  o.lo = -20;
  o.hi = 20;
  for_each_case(
      o, [](const Tensor& x, const Tensor& lx, const std::vector<int64_t>& dims, bool keepdim) {
        Reference r = reference(testing::values(x), x.sizes(), dims, keepdim);
        DType out = is_floating_point(x.dtype()) ? x.dtype() : kFloat32;
        expect_close(logsumexp(lx, dims, keepdim), per_group(r, ref_logsumexp), r.out_shape, out,
                     rtol_for(out), atol_for(out));
      });
}

TEST(Reduce, AllAnyMatchReference) {
  Options o;
  o.lo = -1;
  o.hi = 1.2;  // integers in {-1, 0, 1}: zeros are common
  o.ties = true;
  o.specials = true;
  for_each_case(
      o, [](const Tensor& x, const Tensor& lx, const std::vector<int64_t>& dims, bool keepdim) {
        Reference r = reference(testing::values(x), x.sizes(), dims, keepdim);
        auto all_ref = [](const std::vector<double>& g) {
          for (double e : g)
            if (e == 0) return 0.0;
          return 1.0;
        };
        auto any_ref = [](const std::vector<double>& g) {
          for (double e : g)
            if (e != 0) return 1.0;  // NaN counts as true
          return 0.0;
        };
        expect_close(all(lx, dims, keepdim), per_group(r, all_ref), r.out_shape, kBool, 0, 0);
        expect_close(any(lx, dims, keepdim), per_group(r, any_ref), r.out_shape, kBool, 0, 0);
      });
}

// ------------------------------------------------------------------------------- large inputs

TEST(Reduce, LargeFullSumFloat32) {
  const int64_t n = 3'000'000;
  Tensor x = testing::random_tensor({n}, kFloat32, 0.0, 1.0);
  std::vector<float> v = x.to_vector<float>();
  double ref = 0;
  for (float e : v) ref += e;
  expect_close(sum(x), {ref}, {}, kFloat32, 1e-6, 0);
  expect_close(mean(x), {ref / n}, {}, kFloat32, 1e-6, 0);
  // The same values as a 2-D view and through the dtype argument.
  expect_close(sum(x.view({1000, 3000})), {ref}, {}, kFloat32, 1e-6, 0);
  expect_close(sum(x, {}, false, kFloat64), {ref}, {}, kFloat64, 1e-12, 0);
  double ss = 0, m = ref / n;
  for (float e : v) ss += (e - m) * (e - m);
  expect_close(var(x), {ss / (n - 1)}, {}, kFloat32, 1e-6, 0);
}

TEST(Reduce, LargeFullSumFloat64IsAccurate) {
  const int64_t n = 3'000'000;
  Tensor x = testing::random_tensor({n}, kFloat64, -1.0, 1.0) + 1e6;
  std::vector<double> v = x.to_vector<double>();
  // Kahan-summed reference.
  double s = 0, c = 0;
  for (double e : v) {
    double y = e - c, t = s + y;
    c = (t - s) - y;
    s = t;
  }
  expect_close(sum(x), {s}, {}, kFloat64, 1e-13, 0);
}

// Shapes big enough for the parallel paths: many rows, few long rows, reductions over leading
// dims of contiguous tensors (read in place), and transposed inputs.
TEST(Reduce, LargeShapesMatchReference) {
  struct Big {
    Shape shape;
    std::vector<int64_t> dims;
  };
  std::vector<Big> cases = {{{300, 700}, {1}},      {{300, 700}, {0}},       {{3, 70000}, {1}},
                            {{70000, 3}, {0}},      {{2, 50, 1000}, {0, 2}}, {{2, 50, 1000}, {0}},
                            {{40, 5, 600}, {0, 1}}, {{100000}, {0}},         {{5, 40000}, {}}};
  for (const auto& c : cases) {
    for (bool transpose : {false, true}) {
      Tensor x = make_input(c.shape, kFloat32, -3, 3, true, false);
      Tensor lx = x;
      if (transpose && x.dim() >= 2) lx = testing::layouts(x)[1].second;
      SCOPED_TRACE(describe_case(x, transpose ? "transposed" : "contiguous", c.dims, false));
      Reference r = reference(testing::values(x), x.sizes(), c.dims, false);
      expect_close(sum(lx, c.dims), per_group(r, ref_sum), r.out_shape, kFloat32, 1e-5, 1e-4);
      expect_close(mean(lx, c.dims), per_group(r, ref_mean), r.out_shape, kFloat32, 1e-5, 1e-5);
      expect_close(amax(lx, c.dims), per_group(r, [](auto& g) { return ref_extremum(g, true); }),
                   r.out_shape, kFloat32, 0, 0);
      expect_close(amin(lx, c.dims), per_group(r, [](auto& g) { return ref_extremum(g, false); }),
                   r.out_shape, kFloat32, 0, 0);
      expect_close(var(lx, c.dims), per_group(r, [](auto& g) { return ref_var(g, 1); }),
                   r.out_shape, kFloat32, 1e-5, 1e-5);
      expect_close(logsumexp(lx, c.dims), per_group(r, ref_logsumexp), r.out_shape, kFloat32, 1e-5,
                   1e-5);
      expect_close(any(lx, c.dims),
                   per_group(r,
                             [](auto& g) {
                               for (double e : g)
                                 if (e != 0) return 1.0;
                               return 0.0;
                             }),
                   r.out_shape, kBool, 0, 0);
      if (c.dims.size() == 1) {
        auto [values, indices] = max(lx, c.dims[0]);
        expect_close(indices, per_group(r, [](auto& g) { return double(ref_arg(g, true)); }),
                     r.out_shape, kInt64, 0, 0);
        expect_close(argmin(lx, c.dims[0]),
                     per_group(r, [](auto& g) { return double(ref_arg(g, false)); }), r.out_shape,
                     kInt64, 0, 0);
      }
    }
  }
}

TEST(Reduce, LargeArgmaxTiesAndNaNAcrossChunks) {
  const int64_t n = 1'000'000;
  Tensor x = zeros({n});
  float* p = x.data_ptr<float>();
  p[n - 5] = 7;
  p[700'000] = 7;  // the first of the two maxima, in the second half
  EXPECT_EQ(argmax(x).item<int64_t>(), 700'000);
  EXPECT_EQ(argmin(x).item<int64_t>(), 0);
  p[900'000] = std::nanf("");
  p[999'999] = std::nanf("");
  EXPECT_EQ(argmax(x).item<int64_t>(), 900'000);
  EXPECT_EQ(argmin(x).item<int64_t>(), 900'000);
  EXPECT_TRUE(std::isnan(amax(x).item<float>()));
  EXPECT_TRUE(std::isnan(min(x).item<float>()));
  auto [v, i] = max(x.view({2, n / 2}), 1);
  expect_close(i, {0.0, 400'000.0}, {2}, kInt64, 0, 0);
  expect_close(v, {0.0, kNaN}, {2}, kFloat32, 0, 0);
  Tensor row0 = x.view({2, n / 2})[0];
  EXPECT_EQ(argmax(row0).item<int64_t>(), 0);  // all zeros: the first
}

// ------------------------------------------------------------------------------- specific values

TEST(Reduce, ResultDtypes) {
  for (DType dt : {kBool, kInt32, kInt64, kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = ones({2, 3}, dt);
    DType acc = is_floating_point(dt) ? dt : kInt64;
    EXPECT_EQ(sum(x).dtype(), acc);
    EXPECT_EQ(sum(x, {1}).dtype(), acc);
    EXPECT_EQ(prod(x).dtype(), acc);
    EXPECT_EQ(sum(x, {}, false, kFloat64).dtype(), kFloat64);
    EXPECT_EQ(sum(x, {}, false, kInt32).dtype(), kInt32);
    EXPECT_EQ(amax(x).dtype(), dt);
    EXPECT_EQ(amin(x, {0}).dtype(), dt);
    EXPECT_EQ(max(x).dtype(), dt);
    EXPECT_EQ(std::get<0>(min(x, 1)).dtype(), dt);
    EXPECT_EQ(std::get<1>(min(x, 1)).dtype(), kInt64);
    EXPECT_EQ(argmax(x).dtype(), kInt64);
    EXPECT_EQ(argmin(x, 0).dtype(), kInt64);
    EXPECT_EQ(logsumexp(x, {1}).dtype(), is_floating_point(dt) ? dt : kFloat32);
    EXPECT_EQ(all(x).dtype(), kBool);
    EXPECT_EQ(any(x, {0}).dtype(), kBool);
    if (is_floating_point(dt)) {
      EXPECT_EQ(mean(x).dtype(), dt);
      EXPECT_EQ(var(x).dtype(), dt);
      EXPECT_EQ(kiln::std(x).dtype(), dt);
    }
  }
}

TEST(Reduce, FloatingOnlyOpsRejectIntegers) {
  expect_error([] { mean(ones({2, 3}, kInt64)); }, {"mean", "int64[2, 3]"});
  expect_error([] { mean(ones({4}, kBool)); }, {"mean", "bool[4]"});
  expect_error([] { var(ones({2}, kInt32)); }, {"var", "int32[2]"});
  expect_error([] { kiln::std(ones({2, 1}, kBool), {0}); }, {"std", "bool[2, 1]"});
}

TEST(Reduce, DimValidation) {
  Tensor x = ones({2, 3});
  expect_error([&] { sum(x, {0, 0}); }, {"sum", "multiple times"});
  expect_error([&] { sum(x, {1, -1}); }, {"sum", "multiple times"});
  expect_error([&] { amax(x, {2}); }, {"amax", "out of range"});
  expect_error([&] { mean(x, {-3}); }, {"mean", "out of range"});
  expect_error([&] { max(x, 2); }, {"max", "out of range"});
  expect_error([&] { argmin(x, -3); }, {"argmin", "out of range"});
  expect_error([&] { var(x, {5}); }, {"var", "out of range"});
  expect_error([&] { logsumexp(x, {0, -2}); }, {"logsumexp", "multiple times"});
  expect_error([&] { all(x, {3}); }, {"all", "out of range"});
  expect_error([&] { prod(x, {1, 1}); }, {"prod", "multiple times"});
  expect_error([] { sum(Tensor()); }, {"sum", "undefined"});
}

TEST(Reduce, ZeroDimInputs) {
  Tensor s = scalar_tensor(2.5);
  for (std::vector<int64_t> dims : {std::vector<int64_t>{}, {0}, {-1}}) {
    for (bool keepdim : {false, true}) {
      expect_close(sum(s, dims, keepdim), {2.5}, {}, kFloat32);
      expect_close(mean(s, dims, keepdim), {2.5}, {}, kFloat32);
      expect_close(prod(s, dims, keepdim), {2.5}, {}, kFloat32);
      expect_close(amax(s, dims, keepdim), {2.5}, {}, kFloat32);
      expect_close(logsumexp(s, dims, keepdim), {2.5}, {}, kFloat32);
      expect_close(var(s, dims, 0, keepdim), {0.0}, {}, kFloat32);
      expect_close(var(s, dims, 1, keepdim), {kNaN}, {}, kFloat32);
      expect_close(all(s, dims, keepdim), {1.0}, {}, kBool);
    }
  }
  auto [v, i] = max(s, -1);
  expect_close(v, {2.5}, {}, kFloat32);
  expect_close(i, {0.0}, {}, kInt64);
  expect_close(argmin(s, 0, true), {0.0}, {}, kInt64);
  expect_close(argmax(s), {0.0}, {}, kInt64);
  expect_error([&] { sum(s, {1}); }, {"sum", "out of range"});
  expect_error([&] { sum(s, {0, -1}); }, {"sum", "multiple times"});
  expect_error([&] { max(s, 1); }, {"max", "out of range"});
}

TEST(Reduce, EmptyInputs) {
  Tensor e = zeros({0});
  expect_close(sum(e), {0.0}, {}, kFloat32);
  expect_close(sum(zeros({0}, kInt32)), {0.0}, {}, kInt64);
  expect_close(prod(e), {1.0}, {}, kFloat32);
  expect_close(prod(zeros({0}, kBool)), {1.0}, {}, kInt64);
  expect_close(mean(e), {kNaN}, {}, kFloat32);
  expect_close(all(e), {1.0}, {}, kBool);
  expect_close(any(e), {0.0}, {}, kBool);
  expect_close(var(e), {kNaN}, {}, kFloat32);
  expect_close(kiln::std(e, {}, 0), {kNaN}, {}, kFloat32);
  expect_close(logsumexp(e, {0}), {-kInf}, {}, kFloat32);
  // A zero-size kept dim gives an empty result; a zero-size reduced dim gives identities.
  Tensor m = zeros({0, 3});
  expect_close(sum(m, {1}), {}, {0}, kFloat32);
  expect_close(amax(m, {1}), {}, {0}, kFloat32);
  expect_close(std::get<1>(max(m, 1, true)), {}, {0, 1}, kInt64);
  expect_close(argmin(m, 1), {}, {0}, kInt64);
  expect_close(sum(m, {0}), {0, 0, 0}, {3}, kFloat32);
  expect_close(prod(m, {0}, true), {1, 1, 1}, {1, 3}, kFloat32);
  expect_close(mean(m, {0}), {kNaN, kNaN, kNaN}, {3}, kFloat32);
  expect_close(all(m, {0}), {1, 1, 1}, {3}, kBool);
  expect_close(any(m, {-2}), {0, 0, 0}, {3}, kBool);
  expect_close(logsumexp(m, {0}), {-kInf, -kInf, -kInf}, {3}, kFloat32);
  // Ops without an identity refuse, naming the op and the input.
  expect_error([&] { max(e); }, {"max", "float32[0]"});
  expect_error([&] { min(m); }, {"min", "float32[0, 3]"});
  expect_error([&] { amax(m, {0}); }, {"amax", "float32[0, 3]", "non-zero size"});
  expect_error([&] { amin(m); }, {"amin", "float32[0, 3]"});
  expect_error([&] { max(m, 0); }, {"max", "float32[0, 3]", "non-zero size"});
  expect_error([&] { min(m, -2, true); }, {"min", "float32[0, 3]"});
  expect_error([&] { argmax(m); }, {"argmax", "float32[0, 3]"});
  expect_error([&] { argmin(m, 0); }, {"argmin", "float32[0, 3]"});
}

TEST(Reduce, NaNPropagation) {
  Tensor x = from_vector(std::vector<float>{1, NAN, 3, NAN, -2});
  EXPECT_TRUE(std::isnan(amax(x).item<float>()));
  EXPECT_TRUE(std::isnan(amin(x).item<float>()));
  EXPECT_TRUE(std::isnan(max(x).item<float>()));
  EXPECT_TRUE(std::isnan(min(x).item<float>()));
  EXPECT_EQ(argmax(x).item<int64_t>(), 1);
  EXPECT_EQ(argmin(x).item<int64_t>(), 1);
  EXPECT_TRUE(std::isnan(sum(x).item<float>()));
  EXPECT_TRUE(std::isnan(logsumexp(x, {0}).item<float>()));
  EXPECT_TRUE(any(from_vector(std::vector<float>{0, NAN})).item<bool>());
  EXPECT_TRUE(all(from_vector(std::vector<float>{1, NAN})).item<bool>());
  // NaN first in the row, and a row without NaN next to one with it.
  Tensor y = from_vector(std::vector<double>{NAN, 5, 1, 2, 9, 3}, Shape{2, 3});
  auto [v, i] = max(y, 1);
  expect_close(v, {kNaN, 9}, {2}, kFloat64, 0, 0);
  expect_close(i, {0, 1}, {2}, kInt64, 0, 0);
  auto [v2, i2] = min(y, 0, true);
  expect_close(v2, {kNaN, 5, 1}, {1, 3}, kFloat64, 0, 0);
  expect_close(i2, {0, 0, 0}, {1, 3}, kInt64, 0, 0);
}

TEST(Reduce, TiesPickTheFirst) {
  Tensor x = from_vector(std::vector<int32_t>{1, 3, 3, 0, 0, 2});
  EXPECT_EQ(argmax(x).item<int64_t>(), 1);
  EXPECT_EQ(argmin(x).item<int64_t>(), 3);
  Tensor y = from_vector(std::vector<float>{2, 7, 7, 2, 2, 7}, Shape{2, 3});
  expect_close(argmax(y, 1), {1, 2}, {2}, kInt64, 0, 0);
  expect_close(argmin(y, 1), {0, 0}, {2}, kInt64, 0, 0);
  expect_close(argmax(y), {1}, {}, kInt64, 0, 0);
  expect_close(argmax(y, std::nullopt, true), {1}, {1, 1}, kInt64, 0, 0);
  expect_close(argmin(y.t(), 0), {0, 0}, {2}, kInt64, 0, 0);
  expect_close(argmax(y.t(), 0), {1, 2}, {2}, kInt64, 0, 0);
  Tensor b = from_vector(std::vector<bool>{false, true, true});
  EXPECT_EQ(argmax(b).item<int64_t>(), 1);
  EXPECT_EQ(max(b).item<bool>(), true);
  EXPECT_EQ(min(b).item<bool>(), false);
}

TEST(Reduce, SpecificValues) {
  Tensor x = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, Shape{2, 3});
  expect_close(sum(x, {0}), {5, 7, 9}, {3}, kFloat32);
  expect_close(sum(x, {1}, true), {6, 15}, {2, 1}, kFloat32);
  expect_close(mean(x, {-1}), {2, 5}, {2}, kFloat32);
  expect_close(prod(x, {1}), {6, 120}, {2}, kFloat32);
  expect_close(var(x, {1}), {1, 1}, {2}, kFloat32);
  expect_close(var(x, {}, 0), {35.0 / 12}, {}, kFloat32);
  expect_close(kiln::std(x, {0}), {std::sqrt(4.5), std::sqrt(4.5), std::sqrt(4.5)}, {3}, kFloat32);
  expect_close(var(x, {1}, 3), {kNaN, kNaN}, {2}, kFloat32);
  expect_close(var(x, {1}, 4), {kNaN, kNaN}, {2}, kFloat32);
  // Summing with a dtype converts each element first: 1.5 -> 1, 2.7 -> 2.
  Tensor f = from_vector(std::vector<float>{1.5f, 2.7f, -0.5f});
  expect_close(sum(f, {}, false, kInt64), {3}, {}, kInt64, 0, 0);
  expect_close(sum(from_vector(std::vector<bool>{true, false, true})), {2}, {}, kInt64, 0, 0);
  // Integer sums and products are exact (not rounded through double) and wrap like torch.
  int64_t big = int64_t{1} << 53;
  EXPECT_EQ(sum(from_vector(std::vector<int64_t>{big, 1, 1})).item<int64_t>(), big + 2);
  EXPECT_EQ(prod(from_vector(std::vector<int64_t>{big + 1, 3})).item<int64_t>(), 3 * big + 3);
  EXPECT_EQ(sum(from_vector(std::vector<int32_t>{2147483647, 1})).item<int64_t>(), 2147483648);
  EXPECT_EQ(sum(from_vector(std::vector<int64_t>{std::numeric_limits<int64_t>::max(), 1}))
                .item<int64_t>(),
            std::numeric_limits<int64_t>::min());
  // logsumexp is stable for large values and handles infinities.
  expect_close(logsumexp(from_vector(std::vector<float>{1000, 1000}), {0}), {1000 + std::log(2.0)},
               {}, kFloat32);
  expect_close(logsumexp(from_vector(std::vector<float>{-INFINITY, -INFINITY}), {0}), {-kInf}, {},
               kFloat32);
  expect_close(logsumexp(from_vector(std::vector<float>{INFINITY, 1}), {0}), {kInf}, {}, kFloat32);
  expect_close(logsumexp(from_vector(std::vector<int64_t>{0, 0}), {0}), {std::log(2.0)}, {},
               kFloat32);
  // var of inf is NaN, as torch.
  EXPECT_TRUE(std::isnan(var(from_vector(std::vector<float>{INFINITY, 1})).item<float>()));
}

TEST(Reduce, TensorMethodsForward) {
  Tensor x = from_vector(std::vector<double>{3, 1, 2, 5}, Shape{2, 2});
  EXPECT_EQ(x.sum().item<double>(), 11);
  EXPECT_EQ(x.sum({0}).to_vector<double>(), (std::vector<double>{5, 6}));
  EXPECT_EQ(x.mean().item<double>(), 2.75);
  EXPECT_EQ(x.prod().item<double>(), 30);
  EXPECT_EQ(x.prod(1).to_vector<double>(), (std::vector<double>{3, 10}));
  EXPECT_EQ(x.max().item<double>(), 5);
  EXPECT_EQ(x.min().item<double>(), 1);
  EXPECT_EQ(std::get<1>(x.max(0)).to_vector<int64_t>(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(x.amax({1}).to_vector<double>(), (std::vector<double>{3, 5}));
  EXPECT_EQ(x.amin({1}, true).sizes(), (Shape{2, 1}));
  EXPECT_EQ(x.argmax().item<int64_t>(), 3);
  EXPECT_EQ(x.argmin(1).to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  EXPECT_NEAR(x.var().item<double>(), 2.9166666666666665, 1e-12);
  EXPECT_NEAR(x.std({}, 0).item<double>(), std::sqrt(2.1875), 1e-12);
  EXPECT_NEAR(x.logsumexp({0, 1}).item<double>(),
              std::log(std::exp(3.0) + std::exp(1.0) + std::exp(2.0) + std::exp(5.0)), 1e-12);
  EXPECT_TRUE(x.all().item<bool>());
  EXPECT_TRUE(x.any().item<bool>());
}

TEST(Reduce, OpsAreRegistered) {
  for (const char* name : {"sum", "mean", "prod", "max", "min", "amax", "amin", "argmax", "argmin",
                           "var", "std", "logsumexp", "all", "any"}) {
    const detail::OpDef* def = detail::find_op(name);
    ASSERT_NE(def, nullptr) << name;
    EXPECT_EQ(def->kind, detail::OpKind::Reduction) << name;
    EXPECT_EQ(def->arity, 1) << name;
  }
}

}  // namespace
}  // namespace kiln
