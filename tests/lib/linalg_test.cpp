// Tests for mm, bmm, matmul, linear and addmm against a float64 reference loop written here.
#include <cmath>
#include <limits>

#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::layouts;
using testing::random_tensor;
using testing::values;

const std::vector<DType> kDTypes = {kFloat32, kFloat64, kInt64, kInt32};

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Element `idx` (right-aligned, numpy broadcasting) of row-major values v of shape s.
double at_bcast(const std::vector<double>& v, const Shape& s, const std::vector<int64_t>& idx) {
  size_t off = idx.size() - s.size();
  int64_t flat = 0;
  for (size_t i = 0; i < s.size(); ++i) flat = flat * s[i] + (s[i] == 1 ? 0 : idx[off + i]);
  return v[flat];
}

struct Ref {
  Shape shape;
  std::vector<double> v;
};

// torch.matmul computed plainly in double.
Ref ref_matmul(const Tensor& a, const Tensor& b) {
  std::vector<double> av = values(a), bv = values(b);
  Shape as = a.dim() == 1 ? Shape{1, a.size(0)} : a.sizes();
  Shape bs = b.dim() == 1 ? Shape{b.size(0), 1} : b.sizes();
  int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  Shape batch =
      testing::broadcast_shape(Shape(as.begin(), as.end() - 2), Shape(bs.begin(), bs.end() - 2));
  Shape full = batch;
  full.push_back(M);
  full.push_back(N);
  Ref r;
  r.v.resize(numel_of(full));
  for (int64_t f = 0; f < numel_of(full); ++f) {
    std::vector<int64_t> idx = testing::unravel(f, full);
    std::vector<int64_t> ia = idx, ib = idx;
    double s = 0;
    for (int64_t k = 0; k < K; ++k) {
      ia.back() = k;
      ib[ib.size() - 2] = k;
      s += at_bcast(av, as, ia) * at_bcast(bv, bs, ib);
    }
    r.v[f] = s;
  }
  r.shape = batch;
  if (a.dim() > 1) r.shape.push_back(M);
  if (b.dim() > 1) r.shape.push_back(N);
  return r;
}

double rtol_for(DType d) {
  return d == kFloat32 ? 1e-4 : 1e-12;
}
double atol_for(DType d, int64_t K) {
  return d == kFloat32 ? 1e-4 * static_cast<double>(std::max<int64_t>(K, 1)) : 1e-9;
}

void check_matmul(const Tensor& got, const Tensor& a, const Tensor& b, DType dtype, int64_t K,
                  const std::string& what) {
  SCOPED_TRACE(what);
  Ref r = ref_matmul(a, b);
  expect_close(got, r.v, r.shape, dtype, rtol_for(dtype), atol_for(dtype, K));
}

std::string dims(const Tensor& t) {
  return ::testing::PrintToString(t.sizes());
}

// ------------------------------------------------------------------------------------------ mm
TEST(Mm, MatchesReferenceOverShapesLayoutsAndDTypes) {
  auto& g = testing::rng();
  for (int trial = 0; trial < 40; ++trial) {
    auto pick = [&]() {
      int r = std::uniform_int_distribution<int>(0, 9)(g);
      return r == 0 ? 0 : r <= 2 ? 1 : std::uniform_int_distribution<int>(2, 9)(g);
    };
    int64_t M = pick(), K = pick(), N = pick();
    for (DType dt : kDTypes) {
      Tensor a = random_tensor({M, K}, dt), b = random_tensor({K, N}, dt);
      for (auto& [la, ta] : layouts(a)) {
        for (auto& [lb, tb] : layouts(b)) {
          check_matmul(mm(ta, tb), a, b, dt, K,
                       la + " x " + lb + " " + dims(a) + dims(b) + " " + dtype_name(dt));
        }
      }
    }
  }
}

TEST(Mm, LargerThanOneCacheBlock) {
  // K > 128 and N > 256 cross the loop kernel's blocks; M spans several row blocks and threads.
  for (DType dt : kDTypes) {
    Tensor a = random_tensor({37, 300}, dt), b = random_tensor({300, 270}, dt);
    check_matmul(mm(a, b), a, b, dt, 300, std::string("contiguous ") + dtype_name(dt));
    // Transposed operands: sgemm reads them with 'T' instead of copying.
    Tensor at = a.t().contiguous().t(), bt = b.t().contiguous().t();
    check_matmul(mm(at, bt), a, b, dt, 300, std::string("transposed ") + dtype_name(dt));
    check_matmul(a.mm(bt), a, b, dt, 300, std::string("method ") + dtype_name(dt));
  }
}

TEST(Mm, SlicedRowsAndColumns) {
  // A view whose rows are further apart than its width (a column slice of a wider matrix).
  Tensor big_a = random_tensor({9, 12}, kFloat32), big_b = random_tensor({12, 10}, kFloat32);
  Tensor a = big_a.narrow(1, 3, 5), b = big_b.narrow(0, 2, 5).narrow(1, 1, 7);
  check_matmul(mm(a, b), a.contiguous(), b.contiguous(), kFloat32, 5, "narrowed");
  Tensor ad = a.to(kFloat64), bd = b.to(kFloat64);
  check_matmul(mm(ad.narrow(0, 1, 4), bd), ad.narrow(0, 1, 4), bd, kFloat64, 5, "narrowed f64");
}

TEST(Mm, MixedDTypesPromote) {
  Tensor a = random_tensor({3, 4}, kInt32), b = random_tensor({4, 2}, kFloat64);
  check_matmul(mm(a, b), a, b, kFloat64, 4, "int32 x float64");
  Tensor c = random_tensor({4, 2}, kInt64);
  check_matmul(mm(a, c), a, c, kInt64, 4, "int32 x int64");
  Tensor f = random_tensor({4, 2}, kFloat32);
  check_matmul(mm(a, f), a, f, kFloat32, 4, "int32 x float32");
  check_matmul(mm(f.t(), a.t()), f.t(), a.t(), kFloat32, 4, "float32 x int32");
}

TEST(Mm, EmptyAndZeroInnerDim) {
  for (DType dt : kDTypes) {
    Tensor z = mm(random_tensor({3, 0}, dt), random_tensor({0, 4}, dt));
    expect_close(z, std::vector<double>(12, 0.0), {3, 4}, dt);
    expect_close(mm(random_tensor({0, 5}, dt), random_tensor({5, 4}, dt)), {}, {0, 4}, dt);
    expect_close(mm(random_tensor({3, 5}, dt), random_tensor({5, 0}, dt)), {}, {3, 0}, dt);
  }
}

TEST(Mm, IntegerResultsAreExact) {
  Tensor a = from_vector(std::vector<int64_t>{1000000007, 2, -3, 4}, Shape{2, 2});
  Tensor b = from_vector(std::vector<int64_t>{5, -6, 7, 8}, Shape{2, 2});
  EXPECT_EQ(mm(a, b).to_vector<int64_t>(),
            (std::vector<int64_t>{5000000035 + 14, -6000000042 + 16, -15 + 28, 18 + 32}));
}

TEST(Mm, Errors) {
  Tensor a = zeros({2, 3}), b = zeros({4, 5});
  expect_error([&] { mm(a, b); }, {"mm: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)",
                                   "float32[2, 3]", "float32[4, 5]"});
  expect_error(
      [&] {
        mm(zeros({2, 3}, kFloat64), zeros({4, 5}, kInt64));
      },
      {"2x3 and 4x5", "float64[2, 3]", "int64[4, 5]"});
  expect_error([&] { mm(zeros({3}), b); }, {"mm", "mat1", "2-D", "float32[3]"});
  expect_error([&] { mm(a, zeros({3, 4, 5})); }, {"mm", "mat2", "2-D", "float32[3, 4, 5]"});
  expect_error([&] { mm(zeros({2, 2}, kBool), zeros({2, 2}, kBool)); }, {"mm", "bool"});
  expect_error([&] { mm(Tensor(), b); }, {"mm", "mat1", "undefined"});
}

// ----------------------------------------------------------------------------------------- bmm
TEST(Bmm, MatchesReference) {
  auto& g = testing::rng();
  for (int trial = 0; trial < 25; ++trial) {
    auto pick = [&](int lo) { return std::uniform_int_distribution<int>(lo, 6)(g); };
    int64_t B = pick(0), M = pick(0), K = pick(0), N = pick(1);
    if (trial % 5 == 0) B = 1;
    for (DType dt : {kFloat32, kFloat64, kInt64}) {
      Tensor a = random_tensor({B, M, K}, dt), b = random_tensor({B, K, N}, dt);
      for (auto& [la, ta] : layouts(a)) {
        for (auto& [lb, tb] : layouts(b)) {
          check_matmul(bmm(ta, tb), a, b, dt, K,
                       la + " x " + lb + " " + dims(a) + dims(b) + " " + dtype_name(dt));
        }
      }
    }
  }
}

TEST(Bmm, BroadcastBatchViewsAndManySmallBatches) {
  // A batch dim expanded from size 1 (stride 0) and many small products (parallel over batches).
  for (DType dt : {kFloat32, kFloat64, kInt32}) {
    Tensor a = random_tensor({1, 4, 3}, dt).expand({64, 4, 3});
    Tensor b = random_tensor({64, 3, 5}, dt);
    check_matmul(bmm(a, b), a, b, dt, 3, std::string("expanded a ") + dtype_name(dt));
    Tensor w = random_tensor({1, 3, 5}, dt).expand({64, 3, 5});
    check_matmul(bmm(b.transpose(1, 2), w.transpose(1, 2).transpose(1, 2)), b.transpose(1, 2), w,
                 dt, 3, std::string("expanded b ") + dtype_name(dt));
  }
}

TEST(Bmm, Errors) {
  expect_error(
      [&] {
        bmm(zeros({2, 3, 4}), zeros({3, 4, 5}));
      },
      {"bmm", "same batch size", "float32[2, 3, 4]", "float32[3, 4, 5]"});
  expect_error(
      [&] {
        bmm(zeros({2, 3, 4}), zeros({2, 5, 6}));
      },
      {"bmm: batch1 and batch2 shapes cannot be multiplied (2x3x4 and 2x5x6)"});
  expect_error([&] { bmm(zeros({3, 4}), zeros({2, 4, 5})); }, {"bmm", "batch1", "3-D", "[3, 4]"});
  expect_error([&] { bmm(zeros({2, 3, 4}), zeros({4, 5})); }, {"bmm", "batch2", "3-D"});
}

// -------------------------------------------------------------------------------------- matmul
TEST(Matmul, EveryRankCombinationWithBroadcastBatches) {
  auto& g = testing::rng();
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g); };
  for (int ra = 1; ra <= 4; ++ra) {
    for (int rb = 1; rb <= 4; ++rb) {
      for (int trial = 0; trial < 4; ++trial) {
        int64_t M = pick(0, 4) == 0 ? 0 : pick(1, 5), K = pick(0, 5), N = pick(1, 5);
        if (trial == 0) M = K = N = 3;
        if (ra == 1 && rb == 1) K = pick(0, 6);
        int nbatch = std::max(ra, rb) - 2;
        Shape batch(std::max(nbatch, 0));
        for (auto& d : batch) d = pick(1, 3);
        // Each operand takes its trailing batch dims, some of them 1 to broadcast.
        auto batch_of = [&](int rank) {
          Shape s;
          for (int i = 0; i < rank - 2; ++i) {
            int64_t d = batch[batch.size() - (rank - 2) + i];
            s.push_back(pick(0, 2) == 0 ? 1 : d);
          }
          return s;
        };
        Shape as = ra == 1 ? Shape{K} : batch_of(ra), bs = rb == 1 ? Shape{K} : batch_of(rb);
        if (ra > 1) as.insert(as.end(), {M, K});
        if (rb > 1) bs.insert(bs.end(), {K, N});
        for (DType dt : {kFloat32, kFloat64, kInt64}) {
          Tensor a = random_tensor(as, dt), b = random_tensor(bs, dt);
          for (auto& [la, ta] : layouts(a)) {
            for (auto& [lb, tb] : layouts(b)) {
              check_matmul(matmul(ta, tb), a, b, dt, K,
                           la + " x " + lb + " " + dims(a) + dims(b) + " " + dtype_name(dt));
            }
          }
        }
      }
    }
  }
}

TEST(Matmul, DotIsZeroDim) {
  Tensor a = from_vector(std::vector<double>{1, 2, 3}),
         b = from_vector(std::vector<double>{4, 5, 6});
  Tensor d = matmul(a, b);
  EXPECT_EQ(d.dim(), 0);
  EXPECT_EQ(d.item<double>(), 32.0);
  Tensor e = matmul(zeros({0}), zeros({0}));
  EXPECT_EQ(e.dim(), 0);
  EXPECT_EQ(e.item<float>(), 0.0f);
  EXPECT_EQ(a.matmul(b).item<double>(), 32.0);
}

TEST(Matmul, FoldedAndUnfoldedBatchesOfLargerProducts) {
  // [B, T, K] @ [K, N]: a contiguous A folds the batch into M; a transposed A loops over batches.
  for (DType dt : {kFloat32, kFloat64, kInt64}) {
    Tensor a = random_tensor({3, 20, 70}, dt), b = random_tensor({70, 40}, dt);
    check_matmul(matmul(a, b), a, b, dt, 70, std::string("folded ") + dtype_name(dt));
    Tensor at = a.transpose(1, 2).contiguous().transpose(1, 2);
    check_matmul(matmul(at, b), a, b, dt, 70, std::string("per batch ") + dtype_name(dt));
    Tensor ap = a.permute({1, 0, 2}).contiguous().permute({1, 0, 2});  // rows don't merge
    check_matmul(matmul(ap, b.t().contiguous().t()), a, b, dt, 70,
                 std::string("permuted ") + dtype_name(dt));
    // 2-D @ batched and batched @ batched with a broadcast dim.
    Tensor c = random_tensor({2, 1, 70, 9}, dt);
    check_matmul(matmul(a.select(0, 0), c), a.select(0, 0), c, dt, 70,
                 std::string("2d x 4d ") + dtype_name(dt));
    check_matmul(matmul(a, c), a, c, dt, 70, std::string("3d x 4d ") + dtype_name(dt));
  }
}

TEST(Matmul, Errors) {
  expect_error(
      [&] {
        matmul(scalar_tensor(2.0), zeros({2, 2}));
      },
      {"matmul", "at least 1-D", "0-D and 2-D"});
  expect_error([&] { matmul(zeros({3}), scalar_tensor(1.0)); }, {"matmul", "1-D and 0-D"});
  expect_error([&] { matmul(zeros({3}), zeros({4})); }, {"matmul", "float32[3]", "float32[4]"});
  expect_error(
      [&] {
        matmul(zeros({2, 3}), zeros({4, 5}));
      },
      {"matmul", "cannot be multiplied (2x3 and 4x5)"});
  expect_error([&] { matmul(zeros({2, 3}), zeros({4})); }, {"matmul", "(2x3 and 4)", "float32[4]"});
  expect_error(
      [&] {
        matmul(zeros({2, 2, 3}), zeros({3, 3, 4}));
      },
      {"matmul", "batch dimensions [2] and [3] cannot be broadcast", "float32[2, 2, 3]",
       "float32[3, 3, 4]"});
  expect_error([&] { matmul(zeros({2, 2}, kBool), zeros({2, 2}, kBool)); }, {"matmul", "bool"});
}

// --------------------------------------------------------------------------------------- addmm
std::vector<double> ref_addmm(const Tensor& self, const Tensor& m1, const Tensor& m2, double beta,
                              double alpha) {
  Ref r = ref_matmul(m1, m2);
  std::vector<double> sv = values(self);
  for (int64_t f = 0; f < numel_of(r.shape); ++f) {
    double s = beta == 0 ? 0 : beta * at_bcast(sv, self.sizes(), testing::unravel(f, r.shape));
    r.v[f] = s + alpha * r.v[f];
  }
  return r.v;
}

TEST(Addmm, BetaAlphaAndBroadcastSelf) {
  auto& g = testing::rng();
  for (int trial = 0; trial < 12; ++trial) {
    int64_t M = std::uniform_int_distribution<int>(1, 6)(g),
            K = std::uniform_int_distribution<int>(0, 6)(g),
            N = std::uniform_int_distribution<int>(1, 6)(g);
    if (trial == 0) K = 150;
    for (DType dt : {kFloat32, kFloat64, kInt64}) {
      bool fl = is_floating_point(dt);
      std::vector<std::pair<Scalar, Scalar>> ba = {{1, 1}, {2, 3}, {0, 1}, {-1, 0}};
      if (fl) ba.push_back({0.5, -1.5});
      for (Shape ss : {Shape{}, Shape{N}, Shape{1, N}, Shape{M, 1}, Shape{M, N}}) {
        Tensor self = random_tensor(ss, dt), m1 = random_tensor({M, K}, dt),
               m2 = random_tensor({K, N}, dt);
        for (auto& [beta, alpha] : ba) {
          for (auto& [ls, ts] : layouts(self)) {
            for (auto& [l1, t1] : layouts(m1)) {
              SCOPED_TRACE(ls + " " + l1 + " self " + dims(self) + " " + dims(m1) + dims(m2) + " " +
                           dtype_name(dt) + " beta " + std::to_string(beta.to_double()) +
                           " alpha " + std::to_string(alpha.to_double()));
              Tensor out = addmm(ts, t1, m2.t().contiguous().t(), beta, alpha);
              expect_close(out, ref_addmm(self, m1, m2, beta.to_double(), alpha.to_double()),
                           {M, N}, dt, rtol_for(dt), atol_for(dt, K));
            }
          }
        }
      }
    }
  }
}

TEST(Addmm, ZeroBetaIgnoresNaNInSelfAndZeroKGivesBetaSelf) {
  for (DType dt : {kFloat32, kFloat64}) {
    Tensor self = full({2, 3}, std::numeric_limits<double>::quiet_NaN(), dt);
    Tensor m1 = random_tensor({2, 4}, dt), m2 = random_tensor({4, 3}, dt);
    Tensor out = addmm(self, m1, m2, 0, 2);
    expect_close(out, ref_addmm(zeros({2, 3}, dt), m1, m2, 0, 2), {2, 3}, dt, 1e-5, 1e-5);
    Tensor s = random_tensor({3}, dt);
    expect_close(addmm(s, zeros({2, 0}, dt), zeros({0, 3}, dt), 3, 5),
                 ref_addmm(s, zeros({2, 0}, dt), zeros({0, 3}, dt), 3, 5), {2, 3}, dt);
  }
  Tensor s = random_tensor({2, 1}, kInt64);
  expect_close(addmm(s, zeros({2, 0}, kInt64), zeros({0, 3}, kInt64), 0, 5),
               std::vector<double>(6, 0.0), {2, 3}, kInt64);
}

TEST(Addmm, MixedDTypes) {
  Tensor self = random_tensor({3}, kFloat64), m1 = random_tensor({2, 4}, kInt32),
         m2 = random_tensor({4, 3}, kFloat32);
  expect_close(addmm(self, m1, m2, 2, 1), ref_addmm(self, m1, m2, 2, 1), {2, 3}, kFloat64, 1e-6,
               1e-5);
}

TEST(Addmm, ErrorsLeaveInputsUnchanged) {
  Tensor self = random_tensor({2, 3}, kInt64), m1 = random_tensor({2, 4}, kInt64),
         m2 = random_tensor({4, 3}, kInt64);
  Tensor s0 = self.clone(), a0 = m1.clone(), b0 = m2.clone();
  expect_error([&] { addmm(self, m1, m2, 0.5, 1); }, {"addmm", "beta", "floating point"});
  expect_error([&] { addmm(self, m1, m2, 1, 2.5); }, {"addmm", "alpha", "floating point"});
  expect_error(
      [&] {
        addmm(zeros({3, 3}), zeros({2, 4}), zeros({4, 3}));
      },
      {"addmm", "float32[3, 3]", "[2, 3]"});
  expect_error(
      [&] {
        addmm(zeros({1, 2, 3}), zeros({2, 4}), zeros({4, 3}));
      },
      {"addmm", "float32[1, 2, 3]"});
  expect_error(
      [&] {
        addmm(zeros({2, 3}), zeros({2, 4}), zeros({5, 3}));
      },
      {"addmm: mat1 and mat2 shapes cannot be multiplied (2x4 and 5x3)"});
  expect_error([&] { addmm(zeros({2, 3}), zeros({4}), zeros({4, 3})); }, {"addmm", "mat1", "2-D"});
  EXPECT_TRUE(equal(self, s0));
  EXPECT_TRUE(equal(m1, a0));
  EXPECT_TRUE(equal(m2, b0));
}

// -------------------------------------------------------------------------------------- linear
TEST(Linear, AnyLeadingDimsWithAndWithoutBias) {
  auto& g = testing::rng();
  for (int trial = 0; trial < 10; ++trial) {
    int64_t in = std::uniform_int_distribution<int>(0, 7)(g),
            out = std::uniform_int_distribution<int>(1, 7)(g);
    if (trial == 0) in = 200;
    for (DType dt : {kFloat32, kFloat64, kInt64}) {
      Tensor w = random_tensor({out, in}, dt), bias = random_tensor({out}, dt);
      for (Shape lead : {Shape{}, Shape{3}, Shape{2, 3}, Shape{2, 1, 3}, Shape{0, 2}}) {
        Shape xs = lead;
        xs.push_back(in);
        Tensor x = random_tensor(xs, dt);
        Ref r = ref_matmul(x, w.t());
        std::vector<double> with_bias = r.v, bv = values(bias);
        for (size_t f = 0; f < with_bias.size(); ++f) with_bias[f] += bv[f % out];
        for (auto& [lx, tx] : layouts(x)) {
          for (auto& [lw, tw] : layouts(w)) {
            SCOPED_TRACE(lx + " " + lw + " x " + dims(x) + " w " + dims(w) + " " + dtype_name(dt));
            expect_close(linear(tx, tw), r.v, r.shape, dt, rtol_for(dt), atol_for(dt, in));
            expect_close(linear(tx, tw, bias), with_bias, r.shape, dt, rtol_for(dt),
                         atol_for(dt, in));
          }
        }
      }
    }
  }
}

TEST(Linear, BroadcastBiasShapesAndMixedDTypes) {
  Tensor x = random_tensor({2, 3, 4}, kFloat32), w = random_tensor({5, 4}, kFloat32);
  Tensor b = random_tensor({3, 1}, kFloat64);  // broadcast to [2, 3, 5], promotes to float64
  Ref r = ref_matmul(x, w.t());
  std::vector<double> bv = values(b);
  for (int64_t f = 0; f < numel_of(r.shape); ++f)
    r.v[f] += at_bcast(bv, b.sizes(), testing::unravel(f, r.shape));
  expect_close(linear(x, w, b), r.v, r.shape, kFloat64, 1e-5, 1e-5);
  Tensor s = scalar_tensor(2.0, kFloat32);
  Ref r2 = ref_matmul(x, w.t());
  for (double& v : r2.v) v += 2.0;
  expect_close(linear(x, w, s), r2.v, r2.shape, kFloat32, 1e-5, 1e-4);
}

TEST(Linear, Errors) {
  Tensor x = zeros({2, 3}), w = zeros({4, 5});
  expect_error([&] { linear(x, w); }, {"linear", "float32[2, 3]", "float32[4, 5]", "3", "5"});
  expect_error([&] { linear(x, zeros({5})); }, {"linear", "weight", "2-D"});
  expect_error([&] { linear(scalar_tensor(1.0), w); }, {"linear", "input", "1-D"});
  expect_error([&] { linear(zeros({2, 5}), w, zeros({5})); }, {"linear", "bias", "float32[5]"});
  expect_error([&] { linear(zeros({2, 5}, kBool), zeros({4, 5}, kBool)); }, {"linear", "bool"});
}

}  // namespace
}  // namespace kiln
