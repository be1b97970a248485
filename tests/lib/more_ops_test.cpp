// topk, sort, argsort, cumsum, cumprod, flip, roll, repeat, tril/triu, norm, clamp with tensor
// bounds, lerp, addcmul/addcdiv and einsum against float64 reference loops on random shapes (size
// 0 and 1 dims, broadcasting, non-contiguous layouts); gradients by gradcheck; lazy and traced
// runs equal to eager ones; bad input raising kiln::Error with the inputs untouched.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>

#include "kiln/jit.h"
#include "kiln/testing.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::rng;
using testing::values;

using Line = std::vector<double>;

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

// Applies f to every line of x along d; f returns out_len values. The result has x's shape with
// dim d of size out_len.
std::vector<double> line_ref(const Tensor& x, int64_t d, int64_t out_len,
                             const std::function<Line(const Line&)>& f) {
  const std::vector<double> v = values(x);
  Shape out_shape = x.sizes();
  out_shape[d] = out_len;
  std::vector<double> out(static_cast<size_t>(numel_of(out_shape)));
  Shape lines_shape = x.sizes();
  lines_shape[d] = 1;
  for (int64_t l = 0; l < numel_of(lines_shape); ++l) {
    std::vector<int64_t> at = testing::unravel(l, lines_shape);
    Line line;
    for (int64_t k = 0; k < x.size(d); ++k) {
      at[d] = k;
      line.push_back(v[testing::ravel(at, x.sizes())]);
    }
    const Line r = f(line);
    for (int64_t k = 0; k < out_len; ++k) {
      at[d] = k;
      out[testing::ravel(at, out_shape)] = r[k];
    }
  }
  return out;
}

// The stable sorting permutation of a line, NaN largest.
std::vector<int64_t> order(const Line& line, bool descending) {
  std::vector<int64_t> p(line.size());
  std::iota(p.begin(), p.end(), 0);
  std::stable_sort(p.begin(), p.end(), [&](int64_t a, int64_t b) {
    const double x = line[a], y = line[b];
    if (descending) return (std::isnan(x) && !std::isnan(y)) || x > y;
    return (!std::isnan(x) && std::isnan(y)) || x < y;
  });
  return p;
}

int64_t random_dim(const Tensor& x) {
  return std::uniform_int_distribution<int64_t>(-x.dim(), x.dim() - 1)(rng());
}

// Long lines (the radix sort's path): every dtype, both directions, ties, +-0, infinities, NaN of
// both signs, and the extremes of each integer type, against the reference's stable order.
TEST(MoreOps, SortOfLongLinesIsStableForEveryDtype) {
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dtype : {kFloat32, kFloat64, kInt32, kInt64, kBool}) {
    for (int trial = 0; trial < 4; ++trial) {
      const int64_t n = std::uniform_int_distribution<int64_t>(64, 3000)(rng());
      const int64_t rows = trial % 2 ? 3 : 1;
      Tensor base = testing::random_tensor({rows, n}, kFloat64, -20, 20).round();
      if (is_floating_point(dtype)) {
        const Tensor u = testing::random_tensor({rows, n}, kFloat64, 0, 1);
        // Later fills win: NaN of either sign, -0 (equal to +0), infinities.
        base = masked_fill(masked_fill(base, lt(u, 0.1), inf), lt(u, 0.05), -inf);
        base = masked_fill(masked_fill(base, lt(u, 0.2), 0.0 * -1.0), lt(u, 0.15), std::nan(""));
        base = masked_fill(base, lt(u, 0.12), -std::nan(""));
      } else if (dtype != kBool) {
        const double lo = dtype == kInt32 ? -2147483648.0 : -9.2233720368547758e18;
        base = masked_fill(masked_fill(base, eq(base, 7), lo), eq(base, -7), -lo - 1024);
      }
      const Tensor x = dtype == kBool ? gt(base, 0) : base.to(dtype);
      const bool descending = trial >= 2;
      const Tensor ref_values = x.to(kFloat64);
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " [" + std::to_string(rows) + ", " +
                   std::to_string(n) + "]" + (descending ? " descending" : " ascending"));
      const std::vector<double> idx = line_ref(ref_values, 1, n, [&](const Line& l) {
        Line r;
        for (int64_t k : order(l, descending)) r.push_back(double(k));
        return r;
      });
      expect_close(argsort(x, 1, descending), idx, {rows, n}, kInt64, 0, 0);
      expect_close(argsort(x.t().contiguous(), 0, descending).t(), idx, {rows, n}, kInt64, 0, 0);
    }
  }
}

TEST(MoreOps, SortArgsortTopkAgainstReference) {
  for (int trial = 0; trial < 30; ++trial) {
    const Tensor base = testing::random_tensor(testing::random_shape(1, 3, 5), kFloat64).round();
    const int64_t dim = random_dim(base), d = dim < 0 ? dim + base.dim() : dim;
    const bool descending = trial % 2;
    const int64_t n = base.size(d);
    for (const auto& [layout, x] : testing::layouts(base)) {
      SCOPED_TRACE(layout + " dim " + std::to_string(dim));
      auto [v, i] = sort(x, dim, descending);
      expect_close(v,
                   line_ref(base, d, n,
                            [&](const Line& l) {
                              Line r;
                              for (int64_t k : order(l, descending)) r.push_back(l[k]);
                              return r;
                            }),
                   base.sizes(), kFloat64);
      const std::vector<double> idx = line_ref(base, d, n, [&](const Line& l) {
        Line r;
        for (int64_t k : order(l, descending)) r.push_back(double(k));
        return r;
      });
      expect_close(i, idx, base.sizes(), kInt64);
      expect_close(x.argsort(dim, descending), idx, base.sizes(), kInt64);
      const int64_t k = std::uniform_int_distribution<int64_t>(0, n)(rng());
      auto [tv, ti] = x.topk(k, dim, !descending);
      Shape ks = base.sizes();
      ks[d] = k;
      expect_close(tv,
                   line_ref(base, d, k,
                            [&](const Line& l) {
                              Line r;
                              for (int64_t j : order(l, !descending)) r.push_back(l[j]);
                              return Line(r.begin(), r.begin() + k);
                            }),
                   ks, kFloat64);
      EXPECT_EQ(ti.sizes(), ks);
      EXPECT_TRUE(equal(gather(x, d, ti), tv));
    }
  }
  const double nan = std::nan("");
  auto [v, i] = sort(from_vector(std::vector<double>{3, nan, -1, 3}));
  expect_close(v, {-1, 3, 3, nan}, {4}, kFloat64);
  expect_close(i, {2, 0, 3, 1}, {4}, kInt64);
  auto [dv, di] = sort(from_vector(std::vector<int64_t>{2, 5, 2}), 0, true);
  expect_close(dv, {5, 2, 2}, {3}, kInt64);
  expect_close(di, {1, 0, 2}, {3}, kInt64);
  auto [sv, si] = sort(full({}, 4.0, kFloat64));
  EXPECT_EQ(sv.item<double>(), 4.0);
  EXPECT_EQ(si.item<int64_t>(), 0);
}

// sort's permutation is a node of the trace: a replay sorts the new values (and sort, topk,
// quantile and the gradient through them follow).
TEST(MoreOps, TracedSortFollowsNewValues) {
  auto fn = [](const std::vector<Tensor>& in) {
    auto [values, indices] = sort(in[0], 1, true);
    return std::vector<Tensor>{values * 2.0, indices, std::get<0>(in[0].topk(2, 0)),
                               quantile(in[0], 0.3)};
  };
  const Tensor example = testing::random_tensor({3, 5}, kFloat64);
  jit::Function traced = jit::trace(fn, {example});
  for (int i = 0; i < 3; ++i) {
    const Tensor x = testing::random_tensor({3, 5}, kFloat64);
    std::vector<Tensor> want;
    {
      LazyGuard eager(false);
      want = fn({x});
    }
    const std::vector<Tensor> got = traced({x});
    for (size_t k = 0; k < got.size(); ++k)
      testing::expect_lazy_equal(got[k], want[k], "output " + std::to_string(k));
  }
}

TEST(MoreOps, CumsumCumprodAgainstReference) {
  for (int trial = 0; trial < 30; ++trial) {
    const DType dtype = trial % 3 == 0 ? kInt32 : kFloat64;
    const Tensor base = testing::random_tensor(testing::random_shape(1, 3, 5), dtype, -2, 2);
    const int64_t dim = random_dim(base), d = dim < 0 ? dim + base.dim() : dim;
    const DType out = dtype == kInt32 ? kInt64 : dtype;
    for (const auto& [layout, x] : testing::layouts(base)) {
      SCOPED_TRACE(layout);
      expect_close(x.cumsum(dim),
                   line_ref(base, d, base.size(d),
                            [](const Line& l) {
                              Line r;
                              double acc = 0;
                              for (double v : l) r.push_back(acc += v);
                              return r;
                            }),
                   base.sizes(), out, 1e-12, 1e-12);
      expect_close(cumprod(x, dim),
                   line_ref(base, d, base.size(d),
                            [](const Line& l) {
                              Line r;
                              double acc = 1;
                              for (double v : l) r.push_back(acc *= v);
                              return r;
                            }),
                   base.sizes(), out, 1e-12, 1e-12);
    }
  }
  expect_close(cumsum(from_vector(std::vector<bool>{true, true, false}), 0), {1, 2, 2}, {3},
               kInt64);
  expect_close(cumsum(from_vector(std::vector<int64_t>{1, 2}), 0, kFloat64), {1, 3}, {2}, kFloat64);
  expect_close(cumsum(full({}, 2.5, kFloat64), 0), {2.5}, {}, kFloat64);
}

TEST(MoreOps, FlipRollRepeatTriangles) {
  for (int trial = 0; trial < 20; ++trial) {
    const Tensor base = testing::random_tensor(testing::random_shape(2, 3, 4), kFloat64);
    const Shape s = base.sizes();
    const int64_t nd = base.dim();
    const int64_t shift = std::uniform_int_distribution<int64_t>(-7, 7)(rng());
    const int64_t diag = std::uniform_int_distribution<int64_t>(-3, 3)(rng());
    for (const auto& [layout, x] : testing::layouts(base)) {
      SCOPED_TRACE(layout);
      const std::vector<double> v = values(base);
      auto pick = [&](const Shape& shape,
                      const std::function<std::vector<int64_t>(std::vector<int64_t>)>& from) {
        std::vector<double> out;
        for (int64_t i = 0; i < numel_of(shape); ++i)
          out.push_back(v[testing::ravel(from(testing::unravel(i, shape)), s)]);
        return out;
      };
      expect_close(flip(x, {0, -1}),
                   pick(s,
                        [&](std::vector<int64_t> i) {
                          i[0] = s[0] - 1 - i[0];
                          i[nd - 1] = s[nd - 1] - 1 - i[nd - 1];
                          return i;
                        }),
                   s, kFloat64);
      expect_close(x.roll({shift}, {1}),
                   pick(s,
                        [&](std::vector<int64_t> i) {
                          if (s[1]) i[1] = ((i[1] - shift) % s[1] + s[1]) % s[1];
                          return i;
                        }),
                   s, kFloat64);
      const int64_t n = numel_of(s);
      expect_close(roll(x, {shift}),
                   pick(s,
                        [&](std::vector<int64_t> i) {
                          const int64_t flat = testing::ravel(i, s);
                          return testing::unravel(((flat - shift) % n + n) % n, s);
                        }),
                   s, kFloat64);
      Shape reps(static_cast<size_t>(nd + 1), 1);
      reps[0] = 2;
      reps[nd] = 3;
      Shape rs = {2};
      rs.insert(rs.end(), s.begin(), s.end());
      rs[nd] *= 3;
      expect_close(x.repeat(reps),
                   pick(rs,
                        [&](std::vector<int64_t> i) {
                          std::vector<int64_t> j(i.begin() + 1, i.end());
                          j[nd - 1] %= s[nd - 1];
                          return j;
                        }),
                   rs, kFloat64);
      auto triangle = [&](bool lower) {
        std::vector<double> out;
        for (int64_t i = 0; i < n; ++i) {
          const std::vector<int64_t> at = testing::unravel(i, s);
          const int64_t offset = at[nd - 1] - at[nd - 2];
          out.push_back((lower ? offset <= diag : offset >= diag) ? v[i] : 0.0);
        }
        return out;
      };
      expect_close(x.tril(diag), triangle(true), s, kFloat64);
      expect_close(triu(x, diag), triangle(false), s, kFloat64);
    }
  }
  expect_close(tril(from_vector(std::vector<int64_t>{1, 2, 3, 4}, {2, 2})), {1, 0, 3, 4}, {2, 2},
               kInt64);
}

TEST(MoreOps, NormAgainstReference) {
  for (int trial = 0; trial < 20; ++trial) {
    const Tensor base = testing::random_tensor(testing::random_shape(1, 3, 4, false), kFloat64);
    const int64_t dim = random_dim(base), d = dim < 0 ? dim + base.dim() : dim;
    for (const auto& [layout, x] : testing::layouts(base)) {
      SCOPED_TRACE(layout);
      for (double p : {1.0, 2.0, 3.0, std::numeric_limits<double>::infinity()}) {
        Shape ks = base.sizes();
        ks[d] = 1;
        expect_close(norm(x, p, {dim}, true),
                     line_ref(base, d, 1,
                              [&](const Line& l) {
                                double acc = 0;
                                for (double v : l)
                                  acc = std::isinf(p) ? std::max(acc, std::abs(v))
                                                      : acc + std::pow(std::abs(v), p);
                                return Line{std::isinf(p) ? acc : std::pow(acc, 1 / p)};
                              }),
                     ks, kFloat64, 1e-12, 1e-12);
      }
      double total = 0;
      for (double v : values(base)) total += v * v;
      expect_close(x.norm(), {std::sqrt(total)}, {}, kFloat64, 1e-12, 1e-12);
    }
  }
}

TEST(MoreOps, ClampLerpAddcmulAddcdiv) {
  for (int trial = 0; trial < 20; ++trial) {
    const Shape sa = testing::random_shape(0, 3, 4);
    const Shape sb = sa.empty() ? Shape{} : Shape{sa.back()};
    const Tensor base = testing::random_tensor(sa, kFloat64);
    const Tensor lo = testing::random_tensor(sb, kFloat64, -2, 0);
    const Tensor hi = testing::random_tensor(sb, kFloat64, 0, 2);
    const Tensor w = testing::random_tensor(sb, kFloat64, 0, 1);
    const Tensor t2 = testing::random_tensor(sb, kFloat64, 1, 2);
    for (const auto& [layout, x] : testing::layouts(base)) {
      SCOPED_TRACE(layout);
      auto ternary = [&](const std::function<double(double, double, double)>& f, const Tensor& b,
                         const Tensor& c) {
        const std::vector<double> vx = values(base), vb = values(b), vc = values(c);
        std::vector<double> out;
        for (int64_t i = 0; i < numel_of(sa); ++i) {
          const std::vector<int64_t> at = testing::unravel(i, sa);
          out.push_back(
              f(vx[i], testing::broadcast_at(b, vb, at, sa), testing::broadcast_at(c, vc, at, sa)));
        }
        return out;
      };
      expect_close(
          x.clamp(lo, hi),
          ternary([](double v, double l, double h) { return std::min(std::max(v, l), h); }, lo, hi),
          sa, kFloat64);
      expect_close(clamp(x, std::nullopt, hi),
                   ternary([](double v, double, double h) { return std::min(v, h); }, lo, hi), sa,
                   kFloat64);
      expect_close(x.lerp(hi, w),
                   ternary([](double s, double e, double t) { return s + t * (e - s); }, hi, w), sa,
                   kFloat64, 1e-12, 1e-12);
      expect_close(lerp(x, hi, 0.25),
                   ternary([](double s, double e, double) { return s + 0.25 * (e - s); }, hi, w),
                   sa, kFloat64, 1e-12, 1e-12);
      expect_close(x.addcmul(w, t2, 0.5),
                   ternary([](double s, double a, double b) { return s + 0.5 * a * b; }, w, t2), sa,
                   kFloat64, 1e-12, 1e-12);
      expect_close(addcdiv(x, w, t2, -2),
                   ternary([](double s, double a, double b) { return s - 2 * a / b; }, w, t2), sa,
                   kFloat64, 1e-12, 1e-12);
    }
  }
  const double nan = std::nan("");
  expect_close(clamp(from_vector(std::vector<double>{nan, 1}), full({}, 0.0, kFloat64),
                     full({}, 0.5, kFloat64)),
               {nan, 0.5}, {2}, kFloat64);
}

// A reference einsum: every assignment of the letters, products accumulated into the output.
std::vector<double> einsum_ref(const std::string& eq, const std::vector<Tensor>& ops,
                               Shape& out_shape) {
  const size_t arrow = eq.find("->");
  std::vector<std::string> terms(1);
  for (char c : eq.substr(0, arrow)) {
    if (c == ',')
      terms.emplace_back();
    else
      terms.back() += c;
  }
  const std::string out = eq.substr(arrow + 2);
  std::map<char, int64_t> size;
  for (size_t i = 0; i < terms.size(); ++i)
    for (size_t k = 0; k < terms[i].size(); ++k) size[terms[i][k]] = ops[i].size(k);
  std::string letters;
  Shape all;
  for (const auto& [c, n] : size) letters += c, all.push_back(n);
  out_shape.clear();
  for (char c : out) out_shape.push_back(size[c]);
  std::vector<std::vector<double>> vals;
  for (const Tensor& t : ops) vals.push_back(values(t));
  std::vector<double> result(static_cast<size_t>(numel_of(out_shape)), 0.0);
  for (int64_t i = 0; i < numel_of(all); ++i) {
    const std::vector<int64_t> at = testing::unravel(i, all);
    auto coord = [&](const std::string& t) {
      std::vector<int64_t> c;
      for (char ch : t) c.push_back(at[letters.find(ch)]);
      return c;
    };
    double p = 1;
    for (size_t k = 0; k < ops.size(); ++k)
      p *= vals[k][testing::ravel(coord(terms[k]), ops[k].sizes())];
    result[testing::ravel(coord(out), out_shape)] += p;
  }
  return result;
}

TEST(MoreOps, EinsumAgainstReference) {
  struct Case {
    std::string eq;
    std::vector<Shape> shapes;
  };
  const std::vector<Case> cases = {
      {"ij,jk->ik", {{3, 4}, {4, 5}}},
      {"bij,bjk->bik", {{2, 3, 4}, {2, 4, 1}}},
      {"i,i->", {{6}, {6}}},
      {"ij->ji", {{3, 0}}},
      {"ij->", {{3, 4}}},
      {"bhqd,bhkd->bhqk", {{2, 3, 4, 5}, {2, 3, 6, 5}}},
      {"i,j->ij", {{3}, {4}}},
      {"ij,kj->ki", {{3, 4}, {2, 4}}},
      {"bij,jk->bk", {{2, 3, 4}, {4, 2}}},
      {"ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 2}}},
      {"ab,b,ac->c", {{2, 3}, {3}, {2, 4}}},
      {"ij,jk->ik", {{0, 4}, {4, 5}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.eq);
    std::vector<Tensor> ops;
    for (const Shape& s : c.shapes) ops.push_back(testing::random_tensor(s, kFloat64));
    Shape shape;
    const std::vector<double> ref = einsum_ref(c.eq, ops, shape);
    expect_close(einsum(c.eq, ops), ref, shape, kFloat64, 1e-12, 1e-12);
    // A non-contiguous first operand.
    std::vector<Tensor> strided = ops;
    strided[0] = testing::layouts(ops[0]).back().second;
    expect_close(einsum(c.eq, strided), ref, shape, kFloat64, 1e-12, 1e-12);
  }
  // The implicit output: letters seen once, alphabetically.
  const Tensor a = testing::random_tensor({3, 4}, kFloat64),
               b = testing::random_tensor({4, 2}, kFloat64);
  EXPECT_TRUE(allclose(einsum("ij,jk", {a, b}), matmul(a, b), 1e-12, 1e-12));
  EXPECT_TRUE(allclose(einsum("ba", {a}), a.t(), 0, 0));
  // Batch dims of size 1 broadcast.
  const Tensor p = testing::random_tensor({1, 3, 4}, kFloat64),
               q = testing::random_tensor({2, 4, 5}, kFloat64);
  EXPECT_TRUE(allclose(einsum("bij,bjk->bik", {p, q}), matmul(p, q), 1e-12, 1e-12));
}

TEST(MoreOps, Gradients) {
  auto g = [](const Shape& s) { return testing::random_tensor(s, kFloat64).requires_grad_(); };
  const Tensor x = g({3, 4}), y = g({3, 4}), r = g({4});
  using In = std::vector<Tensor>;
  EXPECT_TRUE(
      testing::gradcheck([](const In& in) { return std::get<0>(sort(in[0], 1, true)); }, {x}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return std::get<0>(topk(in[0], 2, 0)); }, {x}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return cumsum(in[0], 1); }, {x}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return cumsum(in[0], 0); }, {x}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return cumprod(in[0], 1); }, {x}));
  // Zeros: one, two in a line, and one at a line's end.
  const Tensor z =
      from_vector(std::vector<double>{1.5, 0, 2, -1, 0, 0.5, 0, 3, 2, -2, 1.5, 0}, {3, 4})
          .requires_grad_();
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return cumprod(in[0], 1); }, {z}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return cumprod(in[0], 0); }, {z}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return flip(in[0], {0, 1}); }, {x}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return roll(in[0], {1, -2}, {0, 1}); }, {x}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return in[0].repeat({2, 1, 2}); }, {x}));
  EXPECT_TRUE(
      testing::gradcheck([](const In& in) { return tril(in[0], 1) + triu(in[0], 1); }, {x}));
  for (double p : {1.0, 2.0, 3.0, std::numeric_limits<double>::infinity()})
    EXPECT_TRUE(testing::gradcheck([p](const In& in) { return norm(in[0], p, {1}); }, {x}));
  // An all-zero row has gradient 0 (a subgradient), not NaN, as torch's.
  const Tensor zero_row = cat({zeros({1, 4}, kFloat64), x.detach()}).requires_grad_();
  norm(zero_row, 2, {1}).sum().backward();
  expect_close(zero_row.grad().select(0, 0), {0, 0, 0, 0}, {4}, kFloat64);
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return norm(in[0], 3, {}, true) * 2; }, {x}));
  EXPECT_TRUE(testing::gradgradcheck([](const In& in) { return norm(in[0]); }, {x}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return clamp(in[0], in[1] - 1, in[2] + 1); },
                                 {x, y, r}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return lerp(in[0], in[1], in[2].sigmoid()); },
                                 {x, y, r}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return addcmul(in[0], in[1], in[2], 0.5); },
                                 {x, y, r}));
  EXPECT_TRUE(testing::gradcheck(
      [](const In& in) { return addcdiv(in[0], in[1], in[2].exp(), 0.5); }, {x, y, r}));
  EXPECT_TRUE(testing::gradcheck(
      [](const In& in) {
        return einsum("ij,kj->ik", {in[0], in[1]});
      },
      {x, y}));
  EXPECT_TRUE(testing::gradcheck(
      [](const In& in) {
        return einsum("ij,j,ij->i", {in[0], in[2], in[1]});
      },
      {x, y, r}));
}

TEST(MoreOps, LazyAndTracedEqualEager) {
  const Tensor x = testing::input({5, 6}, kFloat32), y = testing::input({6, 3}, kFloat32);
  const Tensor w = testing::input({6}, kFloat32, 0, 1);
  testing::check_lazy("more ops", [&] {
    Tensor a = x * 2;
    return std::vector<Tensor>{cumsum(a, 1),      cumprod(a, 0),    flip(a, {1}),
                               roll(a, {2}, {1}), a.repeat({2, 1}), tril(a),
                               norm(a, 2, {1}),   norm(a, 1),       lerp(a, a.sin(), w),
                               addcmul(a, a, w),  clamp(a, -w, w),  einsum("ij,jk->ik", {a, y})};
  });
  // Sorting reads the values (the permutation is data), so its input is computed at the call.
  testing::check_lazy(
      "sort",
      [&] {
        return std::vector<Tensor>{std::get<0>((x * 2).sort(1)), std::get<1>(topk(x * 3, 2))};
      },
      false);
  auto fn = [&](const std::vector<Tensor>& in) {
    Tensor a = in[0].exp();
    return std::vector<Tensor>{cumsum(a, 1) + norm(a, 2, {0}), einsum("ij,jk->ik", {a, in[1]}),
                               lerp(a, in[0], 0.5).triu(1)};
  };
  jit::Function traced = jit::trace(fn, {x, y});
  const Tensor x2 = testing::input({5, 6}, kFloat32), y2 = testing::input({6, 3}, kFloat32);
  const std::vector<Tensor> got = traced({x2, y2}), want = fn({x2, y2});
  for (size_t i = 0; i < got.size(); ++i)
    testing::expect_lazy_equal(got[i], want[i], "traced output " + std::to_string(i));
}

// x & y, x | y, x ^ y and ~(x & y) ^ y of a [4, 1, 5] and b [3, 5] broadcast to [4, 3, 5], in
// int64 (bools as 0 and 1, where ~ is logical not).
std::vector<std::vector<double>> bitwise_ref(const Tensor& a, const Tensor& b) {
  const std::vector<double> va = values(a), vb = values(b);
  const Shape out{4, 3, 5};
  std::vector<std::vector<double>> r(4);
  for (int64_t k = 0; k < numel_of(out); ++k) {
    const std::vector<int64_t> i = testing::unravel(k, out);
    const auto x = static_cast<int64_t>(va[testing::ravel({i[0], 0, i[2]}, a.sizes())]);
    const auto y = static_cast<int64_t>(vb[testing::ravel({i[1], i[2]}, b.sizes())]);
    const int64_t not_xy = a.dtype() == kBool ? !(x & y) : ~(x & y);
    r[0].push_back(static_cast<double>(x & y));
    r[1].push_back(static_cast<double>(x | y));
    r[2].push_back(static_cast<double>(x ^ y));
    r[3].push_back(static_cast<double>(not_xy ^ y));
  }
  return r;
}

// The bitwise ops (which fuse) against int64 reference loops on broadcast and non-contiguous
// operands, eagerly, lazily and traced; floating operands raise in every mode.
TEST(MoreOps, BitwiseOpsAgainstReferenceEagerLazyAndTraced) {
  using In = std::vector<Tensor>;
  const auto fn = [](const In& in) {
    const Tensor &a = in[0], &b = in[1];
    return In{a & b, a | b, a ^ b, ~(a & b) ^ b};
  };
  for (DType t : {kBool, kInt32, kInt64}) {
    const double lo = t == kBool ? 0 : -1e6, hi = t == kBool ? 1 : 1e6;
    // b is a transposed (non-contiguous) [3, 5].
    const auto operands = [&] {
      return In{testing::input({4, 1, 5}, t, lo, hi), testing::input({5, 3}, t, lo, hi).t()};
    };
    const auto expect_ref = [&](const In& got, const In& in, const std::string& what) {
      const std::vector<std::vector<double>> want = bitwise_ref(in[0], in[1]);
      ASSERT_EQ(got.size(), want.size());
      for (size_t j = 0; j < got.size(); ++j) {
        SCOPED_TRACE(what + " " + dtype_name(t) + ", output " + std::to_string(j));
        expect_close(got[j], want[j], {4, 3, 5}, t, 0, 0);
      }
    };
    const In x = operands();
    expect_ref(fn(x), x, "eager");
    testing::check_lazy(std::string("bitwise ") + dtype_name(t), [&] { return fn(x); });
    jit::Function traced = jit::trace(fn, x);
    const In x2 = operands();
    expect_ref(traced(x2), x2, "traced");
  }
  const Tensor f = testing::input({3}, kFloat32), i = testing::input({3}, kInt32, -9, 9);
  for (bool lazy : {false, true}) {
    LazyGuard mode(lazy);
    expect_error([&] { (void)((i & 3) | f); }, {"bitwise_or", "float32[3]"});
    expect_error([&] { (void)~(f * 2); }, {"bitwise_not", "float32[3]"});
    expect_error([&] { (void)(i ^ 0.5); }, {"bitwise_xor", "int32[3]"});
  }
  const auto g = [](const In& in) { return In{in[0] & in[1]}; };
  expect_error([&] { (void)jit::trace(g, {i, f}); }, {"bitwise_and", "float32[3]"});
}

TEST(MoreOps, BadInputRaisesAndLeavesInputs) {
  const Tensor x = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor i = from_vector(std::vector<int64_t>{1, 2});
  expect_error([&] { (void)topk(x, 4, 1); }, {"topk", "k (4)", "float64[2, 3]"});
  expect_error([&] { (void)sort(x, 2); }, {"sort", "float64[2, 3]"});
  expect_error([&] { (void)cumsum(x, -3); }, {"cumsum", "float64[2, 3]"});
  expect_error([&] { (void)flip(x, {0, -2}); }, {"flip", "more than once", "float64[2, 3]"});
  expect_error([&] { (void)roll(x, {1, 2}, {0}); }, {"roll", "float64[2, 3]"});
  expect_error([&] { (void)x.repeat({2}); }, {"repeat", "float64[2, 3]"});
  expect_error([&] { (void)tril(i); }, {"tril", "at least 2 dims", "int64[2]"});
  expect_error([&] { (void)norm(i); }, {"norm", "int64[2]"});
  expect_error([&] { (void)norm(x, -1); }, {"norm", "positive", "float64[2, 3]"});
  expect_error([&] { (void)lerp(i, i, 0.5); }, {"lerp", "int64[2]"});
  expect_error([&] { (void)addcdiv(i, i, i); }, {"addcdiv", "int64[2]"});
  expect_error([&] { (void)clamp(x, Tensor(), Tensor()); }, {"clamp", "float64[2, 3]"});
  expect_error(
      [&] {
        (void)einsum("ij,jk->ik", {x, x});
      },
      {"einsum", "ij,jk->ik", "'j'", "3", "2"});
  expect_error([&] { (void)einsum("ii->i", {x}); }, {"einsum", "repeats", "float64[2, 3]"});
  expect_error([&] { (void)einsum("...ij->ij", {x}); }, {"einsum", "ellipses"});
  expect_error([&] { (void)einsum("ij,jk->ik", {x}); }, {"einsum", "2 operands", "got 1"});
  expect_error([&] { (void)einsum("ijk->i", {x}); }, {"einsum", "3 letters", "float64[2, 3]"});
  expect_error([&] { (void)einsum("ij->iz", {x}); }, {"einsum", "'z'"});
  expect_close(x, {1, 2, 3, 4, 5, 6}, {2, 3}, kFloat64);
  expect_close(i, {1, 2}, {2}, kInt64);
}

// The free-function forms of the view methods give the methods' views; movedim moves the named
// dims and keeps the others in order; swapaxes and swapdims are transpose.
TEST(MoreOps, FreeFunctionViewsAndMovedim) {
  const Tensor x = testing::input({2, 3, 4, 5}, kFloat32);
  auto same_view = [](const Tensor& a, const Tensor& b) {
    EXPECT_EQ(a.sizes(), b.sizes());
    EXPECT_EQ(a.strides(), b.strides());
    EXPECT_EQ(a.storage_offset(), b.storage_offset());
    EXPECT_TRUE(equal(a, b));
  };
  same_view(transpose(x, 0, 2), x.transpose(0, 2));
  same_view(swapaxes(x, 1, -1), x.transpose(1, 3));
  same_view(x.swapdims(0, 1), x.transpose(0, 1));
  same_view(permute(x, {3, 1, 0, 2}), x.permute({3, 1, 0, 2}));
  same_view(reshape(x, {6, 20}), x.reshape({6, 20}));
  same_view(unsqueeze(x, -1), x.unsqueeze(4));
  same_view(squeeze(unsqueeze(x, 1), 1), x);
  same_view(squeeze(x.unsqueeze(0)), x);
  same_view(flatten(x, 1), x.flatten(1, -1));
  same_view(narrow(x, 2, 1, 2), x.narrow(2, 1, 2));
  EXPECT_EQ(chunk(x, 2, 2).size(), 2u);
  same_view(split(x, 2, 1)[1], x.split(2, 1)[1]);
  same_view(split(x, {1, 2}, 1)[1], x.split(std::vector<int64_t>{1, 2}, 1)[1]);
  same_view(unbind(x, 3)[4], x.select(3, 4));
  // movedim, as numpy.moveaxis.
  same_view(movedim(x, {0, 1}, {2, 3}), x.permute({2, 3, 0, 1}));
  same_view(movedim(x, 1, -1), x.permute({0, 2, 3, 1}));
  same_view(x.movedim({0, 3}, {3, 0}), x.permute({3, 1, 2, 0}));
  same_view(movedim(x, -1, 0), x.permute({3, 0, 1, 2}));
  same_view(movedim(x, {}, {}), x);
  expect_error(
      [&] {
        (void)movedim(x, {0, 0}, {1, 2});
      },
      {"movedim", "repeated", "float32[2, 3, 4, 5]"});
  expect_error([&] { (void)movedim(x, {0, 1}, {2}); }, {"movedim", "same number"});
  expect_error([&] { (void)movedim(x, 4, 0); }, {"movedim", "float32[2, 3, 4, 5]"});
}

// logaddexp against float64 references, where exp overflows or underflows, at infinities, and
// its gradient.
TEST(MoreOps, Logaddexp) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  Tensor a = from_vector(std::vector<double>{inf, -inf, inf, 1000, -1000, 0.5, nan, 3, -inf});
  Tensor b = from_vector(std::vector<double>{inf, -inf, -inf, 1000, 1, -2, 1, nan, 2});
  expect_close(
      logaddexp(a, b),
      {inf, -inf, inf, 1000 + std::log(2.0), 1, 0.5 + std::log1p(std::exp(-2.5)), nan, nan, 2}, {9},
      kFloat64, 1e-15, 0);
  expect_close(logaddexp(a.to(kFloat32), 0.0).to(kFloat64),
               {inf, 0, inf, 1000, std::log1p(std::exp(-1000.0)), std::log1p(std::exp(0.5)), nan,
                std::log1p(std::exp(3.0)), 0},
               {9}, kFloat64, 1e-6, 1e-7);
  using In = std::vector<Tensor>;
  const Tensor x = testing::random_tensor({3, 4}, kFloat64).requires_grad_();
  const Tensor y = testing::random_tensor({4}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return logaddexp(in[0], in[1]); }, {x, y}));
  EXPECT_TRUE(testing::gradgradcheck([](const In& in) { return logaddexp(in[0], in[1]); }, {x, y}));
}

// isclose: equal values (infinities), NaN only with equal_nan, |a - b| <= atol + |rtol b| where
// finite; integers compare in float32; a dtype mismatch or a negative tolerance raises.
TEST(MoreOps, Isclose) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  Tensor a = from_vector(std::vector<double>{1, 1, inf, inf, nan, 100, 0, 1e-9});
  Tensor b = from_vector(std::vector<double>{1, 1 + 1e-6, inf, -inf, nan, 100.0011, 0, 0});
  expect_close(isclose(a, b), {1, 1, 1, 0, 0, 0, 1, 1}, {8}, kBool, 0, 0);
  expect_close(isclose(a, b, 1e-5, 1e-8, true), {1, 1, 1, 0, 1, 0, 1, 1}, {8}, kBool, 0, 0);
  expect_close(isclose(a, b, 0, 0), {1, 0, 1, 0, 0, 0, 1, 0}, {8}, kBool, 0, 0);
  expect_close(isclose(a, b, 1e-4, 0), {1, 1, 1, 0, 0, 1, 1, 0}, {8}, kBool, 0, 0);
  Tensor i = from_vector(std::vector<int64_t>{100, 7}),
         j = from_vector(std::vector<int64_t>{101, 7});
  expect_close(isclose(i, j, 0.02), {1, 1}, {2}, kBool, 0, 0);
  expect_close(isclose(i, j), {0, 1}, {2}, kBool, 0, 0);
  expect_error([&] { (void)isclose(a, b.to(kFloat32)); },
               {"isclose", "same dtype", "float64[8]", "float32[8]"});
  expect_error([&] { (void)isclose(a, b, -1); }, {"isclose", "rtol", "float64[8]"});
}

// outer, dot, count_nonzero, var_mean and std_mean against references, with gradients.
TEST(MoreOps, OuterDotCountNonzeroAndStatistics) {
  Tensor a = from_vector(std::vector<double>{1, -2, 3}), b = from_vector(std::vector<double>{4, 5});
  expect_close(outer(a, b), {4, 5, -8, -10, 12, 15}, {3, 2}, kFloat64, 0, 0);
  expect_close(outer(a.to(kInt32), b.to(kFloat32)), {4, 5, -8, -10, 12, 15}, {3, 2}, kFloat32, 0,
               0);
  expect_close(dot(a, a * 2), {28}, {}, kFloat64, 0, 0);
  Tensor ia = a.to(kInt32);
  Tensor d = dot(ia, ia);
  EXPECT_EQ(d.dtype(), kInt32);
  expect_close(d, {14}, {}, kInt32, 0, 0);
  expect_close(dot(a.slice(0, 0, 0), a.slice(0, 0, 0)), {0}, {}, kFloat64, 0, 0);
  expect_error([&] { (void)dot(a, b); }, {"dot", "float64[3]", "float64[2]"});
  expect_error([&] { (void)dot(a, a.to(kFloat32)); }, {"dot", "float64[3]", "float32[3]"});
  expect_error([&] { (void)outer(a.unsqueeze(0), b); }, {"outer", "1-D", "float64[1, 3]"});
  Tensor m = from_vector(std::vector<double>{0, 1, -0.0, 2, std::nan(""), 0}, {2, 3});
  Tensor c = count_nonzero(m);
  EXPECT_EQ(c.dtype(), kInt64);
  expect_close(c, {3}, {}, kInt64, 0, 0);
  expect_close(count_nonzero(m, {0}), {1, 2, 0}, {3}, kInt64, 0, 0);
  expect_close(count_nonzero(m, 1), {1, 2}, {2}, kInt64, 0, 0);
  const auto [v, mu] = var_mean(testing::random_tensor({4, 5}, kFloat64), 1);
  EXPECT_EQ(v.sizes(), (Shape{4}));
  EXPECT_EQ(mu.sizes(), (Shape{4}));
  const Tensor x = testing::random_tensor({4, 5}, kFloat64);
  const auto [s1, m1] = std_mean(x, {0}, 0, true);
  expect_close(s1, values(std(x, {0}, 0, true)), {1, 5}, kFloat64, 0, 0);
  expect_close(m1, values(mean(x, {0}, true)), {1, 5}, kFloat64, 0, 0);
  using In = std::vector<Tensor>;
  const Tensor p = testing::random_tensor({3}, kFloat64).requires_grad_();
  const Tensor q = testing::random_tensor({4}, kFloat64).requires_grad_();
  const Tensor r = testing::random_tensor({3}, kFloat64).requires_grad_();
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return outer(in[0], in[1]); }, {p, q}));
  EXPECT_TRUE(testing::gradcheck([](const In& in) { return dot(in[0], in[1]); }, {p, r}));
}

}  // namespace
}  // namespace kiln
