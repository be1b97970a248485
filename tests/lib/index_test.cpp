// Tests for index_select, gather, embedding, cat and stack against plain reference loops.
#include <algorithm>

#include "tests/testing.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::layouts;
using testing::random_tensor;
using testing::ravel;
using testing::unravel;
using testing::values;

const std::vector<DType> kDTypes = {kFloat32, kFloat64, kInt64, kInt32, kBool};

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

int64_t rand_int(int64_t lo, int64_t hi) {  // inclusive
  return std::uniform_int_distribution<int64_t>(lo, hi)(testing::rng());
}

// A tensor of `shape` with integer values uniform in [0, high).
Tensor random_index(const Shape& shape, int64_t high, DType dtype = kInt64) {
  std::vector<int64_t> v(numel_of(shape));
  for (auto& x : v) x = rand_int(0, high - 1);
  return from_vector(v, shape).to(dtype);
}

std::string dims(const Tensor& t) {
  return ::testing::PrintToString(t.sizes());
}

// -------------------------------------------------------------------------------- index_select
std::vector<double> ref_index_select(const Tensor& x, int64_t dim, const Tensor& index,
                                     Shape* shape) {
  std::vector<double> xv = values(x), iv = values(index);
  Shape s = x.sizes();
  s[dim] = static_cast<int64_t>(iv.size());
  std::vector<double> out(numel_of(s));
  for (int64_t f = 0; f < numel_of(s); ++f) {
    std::vector<int64_t> idx = unravel(f, s);
    idx[dim] = static_cast<int64_t>(iv[idx[dim]]);
    out[f] = xv[ravel(idx, x.sizes())];
  }
  *shape = s;
  return out;
}

TEST(IndexSelect, MatchesReference) {
  for (int trial = 0; trial < 60; ++trial) {
    Shape xs = testing::random_shape(1, 4, 5);
    int64_t d = rand_int(0, static_cast<int64_t>(xs.size()) - 1);
    int64_t n = xs[d] == 0 ? 0 : rand_int(0, 6);
    int64_t dim_arg = rand_int(0, 1) ? d : d - static_cast<int64_t>(xs.size());
    for (DType dt : kDTypes) {
      Tensor x = random_tensor(xs, dt);
      for (DType it : {kInt64, kInt32}) {
        Tensor index = random_index({n}, std::max<int64_t>(xs[d], 1), it);
        Shape shape;
        std::vector<double> expected = ref_index_select(x, d, index, &shape);
        for (auto& [lx, tx] : layouts(x)) {
          for (auto& [li, ti] : layouts(index)) {
            SCOPED_TRACE(lx + " " + li + " x " + dims(x) + " dim " + std::to_string(dim_arg) +
                         " index " + dims(index) + " " + dtype_name(dt) + "/" + dtype_name(it));
            expect_close(index_select(tx, dim_arg, ti), expected, shape, dt, 0, 0);
          }
        }
      }
    }
  }
}

TEST(IndexSelect, LargeParallelCopyAndZeroDim) {
  Tensor x = random_tensor({300, 257}, kFloat32);
  for (int64_t d : {0, 1}) {
    Tensor index = random_index({400}, x.size(d));
    Shape shape;
    std::vector<double> expected = ref_index_select(x, d, index, &shape);
    expect_close(index_select(x, d, index), expected, shape, kFloat32, 0, 0);
    EXPECT_TRUE(equal(index_select(x.t(), 1 - d, index), index_select(x, d, index).t()));
  }
  // A 0-dim input takes a single index 0 (as a 0-dim or 1-element index) and stays 0-dim.
  Tensor s = scalar_tensor(4.5, kFloat64);
  Tensor r = index_select(s, 0, from_vector(std::vector<int64_t>{0}));
  EXPECT_EQ(r.dim(), 0);
  EXPECT_EQ(r.item<double>(), 4.5);
  EXPECT_EQ(index_select(s, -1, scalar_tensor(0, kInt64)).item<double>(), 4.5);
  // A 0-dim index selects one row and keeps the dim.
  Tensor m = arange(6, kInt64).reshape({2, 3});
  EXPECT_EQ(index_select(m, 1, scalar_tensor(2, kInt32)).to_vector<int64_t>(),
            (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(index_select(m, 1, scalar_tensor(2, kInt32)).sizes(), (Shape{2, 1}));
}

TEST(IndexSelect, ErrorsLeaveInputsUnchanged) {
  Tensor x = random_tensor({3, 4});
  Tensor x0 = x.clone();
  Tensor bad = from_vector(std::vector<int64_t>{0, 4, 1});
  Tensor bad0 = bad.clone();
  expect_error([&] { index_select(x, 1, bad); },
               {"index_select", "index 4", "out of range", "float32[3, 4]", "[0, 4)"});
  expect_error([&] { index_select(x, 0, from_vector(std::vector<int32_t>{-1})); },
               {"index_select", "index -1", "[0, 3)"});
  expect_error([&] { index_select(x, 0, from_vector(std::vector<float>{0})); },
               {"index_select", "int64", "float32[1]"});
  expect_error(
      [&] {
        index_select(x, 0, zeros({1, 1}, kInt64));
      },
      {"index_select", "1-D", "int64[1, 1]"});
  expect_error([&] { index_select(x, 2, bad); }, {"index_select", "dimension out of range"});
  expect_error([&] { index_select(scalar_tensor(1.0), 0, zeros({2}, kInt64)); },
               {"index_select", "exactly one"});
  expect_error(
      [&] {
        index_select(zeros({0, 2}), 0, zeros({1}, kInt64));
      },
      {"index_select", "index 0", "[0, 0)"});
  EXPECT_TRUE(equal(x, x0));
  EXPECT_TRUE(equal(bad, bad0));
}

// -------------------------------------------------------------------------------------- gather
TEST(Gather, MatchesReference) {
  for (int trial = 0; trial < 80; ++trial) {
    Shape xs = testing::random_shape(1, 4, 5);
    int64_t nd = static_cast<int64_t>(xs.size());
    int64_t d = rand_int(0, nd - 1);
    Shape is(nd);
    for (int64_t k = 0; k < nd; ++k) is[k] = k == d ? rand_int(0, 6) : rand_int(0, xs[k]);
    if (xs[d] == 0) is[d] = 0;
    int64_t dim_arg = rand_int(0, 1) ? d : d - nd;
    Tensor index = random_index(is, std::max<int64_t>(xs[d], 1));
    std::vector<double> iv = values(index);
    for (DType dt : kDTypes) {
      Tensor x = random_tensor(xs, dt);
      std::vector<double> xv = values(x), expected(numel_of(is));
      for (int64_t f = 0; f < numel_of(is); ++f) {
        std::vector<int64_t> idx = unravel(f, is);
        idx[d] = static_cast<int64_t>(iv[f]);
        expected[f] = xv[ravel(idx, xs)];
      }
      for (auto& [lx, tx] : layouts(x)) {
        for (auto& [li, ti] : layouts(index)) {
          SCOPED_TRACE(lx + " " + li + " x " + dims(x) + " dim " + std::to_string(dim_arg) +
                       " index " + dims(index) + " " + dtype_name(dt));
          expect_close(gather(tx, dim_arg, ti), expected, is, dt, 0, 0);
        }
      }
    }
  }
}

TEST(Gather, LargeAndZeroDim) {
  Tensor x = random_tensor({200, 300}, kFloat64);
  Tensor index = random_index({150, 300}, 200);
  std::vector<double> xv = values(x), iv = values(index), expected(iv.size());
  for (int64_t i = 0; i < 150; ++i)
    for (int64_t j = 0; j < 300; ++j)
      expected[i * 300 + j] = xv[static_cast<int64_t>(iv[i * 300 + j]) * 300 + j];
  expect_close(gather(x, 0, index), expected, {150, 300}, kFloat64, 0, 0);
  Tensor s = scalar_tensor(7, kInt64);
  Tensor r = gather(s, 0, scalar_tensor(0, kInt64));
  EXPECT_EQ(r.dim(), 0);
  EXPECT_EQ(r.item<int64_t>(), 7);
}

TEST(Gather, ErrorsLeaveInputsUnchanged) {
  Tensor x = random_tensor({3, 4});
  Tensor x0 = x.clone();
  Tensor index = from_vector(std::vector<int64_t>{0, 1, 2, 3, 1, 5}, Shape{2, 3});
  expect_error([&] { gather(x, 1, index); },
               {"gather", "index 5", "out of range", "dimension 1", "[0, 4)"});
  expect_error(
      [&] {
        gather(x, 0, from_vector(std::vector<int64_t>{-1}, Shape{1, 1}));
      },
      {"gather", "index -1", "[0, 3)"});
  expect_error([&] { gather(x, 1, zeros({2}, kInt64)); },
               {"gather", "same number of dimensions", "int64[2]", "float32[3, 4]"});
  expect_error(
      [&] {
        gather(x, 1, zeros({4, 1}, kInt64));
      },
      {"gather", "int64[4, 1]", "dimension 0"});
  expect_error([&] { gather(x, 1, zeros({2, 1}, kInt32)); }, {"gather", "int64", "int32[2, 1]"});
  expect_error([&] { gather(x, -3, zeros({2, 1}, kInt64)); }, {"gather", "dimension out of range"});
  EXPECT_TRUE(equal(x, x0));
}

// ----------------------------------------------------------------------------------- embedding
TEST(Embedding, MatchesReference) {
  for (int trial = 0; trial < 20; ++trial) {
    int64_t V = rand_int(1, 8), D = rand_int(0, 6);
    Shape is = testing::random_shape(0, 3, 4);
    for (DType dt : {kFloat32, kFloat64, kInt64}) {
      Tensor w = random_tensor({V, D}, dt);
      std::vector<double> wv = values(w);
      for (DType it : {kInt64, kInt32}) {
        Tensor indices = random_index(is, V, it);
        std::vector<double> iv = values(indices), expected;
        for (double i : iv)
          for (int64_t j = 0; j < D; ++j) expected.push_back(wv[static_cast<int64_t>(i) * D + j]);
        Shape os = is;
        os.push_back(D);
        for (auto& [lw, tw] : layouts(w)) {
          for (auto& [li, ti] : layouts(indices)) {
            SCOPED_TRACE(lw + " " + li + " w " + dims(w) + " indices " + dims(indices));
            expect_close(embedding(tw, ti), expected, os, dt, 0, 0);
          }
        }
      }
    }
  }
}

// An empty embedding_dim: the backward makes a [V, 0] gradient (it reshaped the output gradient
// with an inferred -1 row count, which is ambiguous for 0 elements).
TEST(Embedding, GradientWithEmptyEmbeddingDim) {
  for (bool lazy : {false, true}) {
    LazyGuard mode(lazy);
    Tensor w = zeros({3, 0}, kFloat64).requires_grad_();
    Tensor indices = from_vector<int64_t>({2, 0, 2, 1}, Shape{2, 2});
    Tensor out = embedding(w, indices);
    EXPECT_EQ(out.sizes(), (Shape{2, 2, 0}));
    std::vector<Tensor> g = autograd::grad({out}, {w}, {zeros({2, 2, 0}, kFloat64)});
    EXPECT_EQ(g[0].sizes(), (Shape{3, 0}));
  }
}

TEST(Embedding, Errors) {
  Tensor w = random_tensor({5, 3});
  Tensor w0 = w.clone();
  expect_error(
      [&] {
        embedding(w, from_vector(std::vector<int64_t>{1, 5}, Shape{1, 2}));
      },
      {"embedding", "index 5", "out of range", "[0, 5)"});
  expect_error([&] { embedding(w, from_vector(std::vector<int32_t>{-2})); },
               {"embedding", "index -2"});
  expect_error([&] { embedding(zeros({5}), zeros({2}, kInt64)); },
               {"embedding", "weight", "2-D", "float32[5]"});
  expect_error([&] { embedding(w, zeros({2})); }, {"embedding", "int64", "float32[2]"});
  EXPECT_TRUE(equal(w, w0));
}

// ----------------------------------------------------------------------------------------- cat
// Concatenation of row-major values along d, each piece's shape given.
std::vector<double> ref_cat(const std::vector<Tensor>& ts, int64_t d, const Shape& out_shape) {
  std::vector<double> out(numel_of(out_shape));
  int64_t offset = 0;
  for (const Tensor& t : ts) {
    std::vector<double> v = values(t);
    for (int64_t f = 0; f < t.numel(); ++f) {
      std::vector<int64_t> idx = unravel(f, t.sizes());
      idx[d] += offset;
      out[ravel(idx, out_shape)] = v[f];
    }
    offset += t.size(d);
  }
  return out;
}

TEST(Cat, MatchesReferenceWithPromotionAndLayouts) {
  for (int trial = 0; trial < 60; ++trial) {
    Shape base = testing::random_shape(1, 4, 4);
    int64_t nd = static_cast<int64_t>(base.size());
    int64_t d = rand_int(0, nd - 1);
    int64_t dim_arg = rand_int(0, 1) ? d : d - nd;
    int64_t pieces = rand_int(1, 4);
    std::vector<Tensor> ts;
    std::vector<DType> dts;
    Shape out_shape = base;
    out_shape[d] = 0;
    DType expected_dtype = kBool;
    for (int64_t p = 0; p < pieces; ++p) {
      Shape s = base;
      s[d] = rand_int(0, 3);
      out_shape[d] += s[d];
      DType dt = kDTypes[rand_int(0, trial % 3 == 0 ? 4 : 1)];
      if (trial % 3 != 0) dt = trial % 2 ? kFloat32 : kInt64;
      expected_dtype = p == 0 ? dt : promote_types(expected_dtype, dt);
      ts.push_back(random_tensor(s, dt));
    }
    std::vector<double> expected = ref_cat(ts, d, out_shape);
    // Every piece in each of its layouts in turn (the others contiguous).
    for (size_t p = 0; p < ts.size(); ++p) {
      for (auto& [l, t] : layouts(ts[p])) {
        std::vector<Tensor> in = ts;
        in[p] = t;
        SCOPED_TRACE(l + " piece " + std::to_string(p) + " of " + std::to_string(ts.size()) +
                     " dim " + std::to_string(dim_arg) + " out " +
                     ::testing::PrintToString(out_shape));
        expect_close(cat(in, dim_arg), expected, out_shape, expected_dtype, 0, 0);
      }
    }
  }
}

TEST(Cat, LargePiecesAndLegacyEmptySkipped) {
  Tensor a = random_tensor({100, 300}, kFloat32), b = random_tensor({100, 200}, kFloat32);
  expect_close(cat({a, b}, 1), ref_cat({a, b}, 1, {100, 500}), {100, 500}, kFloat32, 0, 0);
  expect_close(cat({a.t(), b.t()}, 0), ref_cat({a.t(), b.t()}, 0, {500, 100}), {500, 100}, kFloat32,
               0, 0);
  // 1-D empty tensors are skipped whatever the others' rank, but still take part in promotion.
  Tensor m = random_tensor({2, 3}, kInt64);
  Tensor e = zeros({0}, kFloat64);
  expect_close(cat({e, m, e, m}, 1), ref_cat({m, m}, 1, {2, 6}), {2, 6}, kFloat64, 0, 0);
  expect_close(cat({m, e}, -2), values(m), {2, 3}, kFloat64, 0, 0);
  Tensor only = cat({zeros({0}, kInt32), zeros({0}, kInt64)});
  EXPECT_EQ(only.sizes(), (Shape{0}));
  EXPECT_EQ(only.dtype(), kInt64);
  // Size-0 pieces of full rank are not skipped; they contribute nothing along dim.
  expect_close(cat({m, zeros({2, 0}, kInt64), m}, 1), ref_cat({m, m}, 1, {2, 6}), {2, 6}, kInt64);
  expect_close(cat({zeros({0, 3}), zeros({0, 3})}), {}, {0, 3}, kFloat32);
}

TEST(Cat, Errors) {
  expect_error([&] { cat({}, 0); }, {"cat", "non-empty"});
  expect_error(
      [&] {
        cat({zeros({2}), scalar_tensor(1.0)});
      },
      {"cat", "zero-dimensional", "position 1"});
  expect_error(
      [&] {
        cat({zeros({2, 3}), zeros({2, 4})}, 0);
      },
      {"cat", "dimension 0", "Expected size 3 but got size 4", "tensor number 1"});
  expect_error(
      [&] {
        cat({zeros({2, 3}), zeros({2, 3, 1})}, 0);
      },
      {"cat", "same number of dimensions", "float32[2, 3, 1]"});
  expect_error([&] { cat({zeros({2, 3}), zeros({2, 3})}, 2); }, {"cat", "dimension out of range"});
  expect_error([&] { cat({zeros({2, 3}), Tensor()}, 0); }, {"cat", "undefined"});
}

// --------------------------------------------------------------------------------------- stack
TEST(Stack, MatchesReference) {
  for (int trial = 0; trial < 40; ++trial) {
    Shape s = testing::random_shape(0, 3, 4);
    int64_t nd = static_cast<int64_t>(s.size());
    int64_t d = rand_int(0, nd);
    int64_t dim_arg = rand_int(0, 1) ? d : d - nd - 1;
    int64_t n = rand_int(1, 4);
    std::vector<Tensor> ts;
    DType expected_dtype = kBool;
    for (int64_t p = 0; p < n; ++p) {
      DType dt = trial % 4 == 0 ? kDTypes[rand_int(0, 4)] : kFloat64;
      expected_dtype = p == 0 ? dt : promote_types(expected_dtype, dt);
      ts.push_back(random_tensor(s, dt));
    }
    Shape out_shape = s;
    out_shape.insert(out_shape.begin() + d, n);
    std::vector<double> expected(numel_of(out_shape));
    for (int64_t f = 0; f < numel_of(out_shape); ++f) {
      std::vector<int64_t> idx = unravel(f, out_shape);
      int64_t p = idx[d];
      idx.erase(idx.begin() + d);
      expected[f] = values(ts[p])[ravel(idx, s)];
    }
    for (size_t p = 0; p < ts.size(); ++p) {
      for (auto& [l, t] : layouts(ts[p])) {
        std::vector<Tensor> in = ts;
        in[p] = t;
        SCOPED_TRACE(l + " piece " + std::to_string(p) + " shape " + dims(ts[0]) + " dim " +
                     std::to_string(dim_arg));
        expect_close(stack(in, dim_arg), expected, out_shape, expected_dtype, 0, 0);
      }
    }
  }
}

TEST(Stack, Errors) {
  expect_error([&] { stack({}, 0); }, {"stack", "non-empty"});
  expect_error(
      [&] {
        stack({zeros({2, 3}), zeros({2, 4})});
      },
      {"stack", "equal size", "[2, 3]", "[2, 4]", "entry 1"});
  expect_error(
      [&] {
        stack({zeros({2, 3}), zeros({2, 3})}, 3);
      },
      {"stack", "dimension out of range"});
  expect_error(
      [&] {
        stack({zeros({2, 3}), zeros({2, 3})}, -4);
      },
      {"stack", "dimension out of range"});
}

}  // namespace
}  // namespace kiln
