// operator<< prints tensors as torch does (expected strings are what PyTorch prints for the same
// values, with kiln's dtype names: dtype=float64 where torch writes dtype=torch.float64).
#include <limits>
#include <sstream>

#include "tests/testing.h"

namespace kiln {
namespace {

std::string str(const Tensor& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

Tensor f32(std::vector<float> v, std::optional<Shape> shape = std::nullopt) {
  return from_vector(v, shape);
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(Print, Float32OneTwoThreeDims) {
  EXPECT_EQ(str(f32({1.0f, 2.5f, -3.0f})), "tensor([ 1.0000,  2.5000, -3.0000])");
  EXPECT_EQ(str(f32({1.0f, 2.5f, 3.0f, 4.0f}, Shape{2, 2})),
            "tensor([[1.0000, 2.5000],\n        [3.0000, 4.0000]])");
  EXPECT_EQ(str(arange(8, kFloat32).reshape({2, 2, 2})),
            "tensor([[[0., 1.],\n"
            "         [2., 3.]],\n"
            "\n"
            "        [[4., 5.],\n"
            "         [6., 7.]]])");
  EXPECT_EQ(str(f32({0.1f, -0.25f, 123.456f})), "tensor([ 1.0000e-01, -2.5000e-01,  1.2346e+02])");
  EXPECT_EQ(str(f32({0.1f, -0.25f, 12.3456f})), "tensor([ 0.1000, -0.2500, 12.3456])");
  EXPECT_EQ(str(f32({-1, 2})), "tensor([-1.,  2.])");
  EXPECT_EQ(str(zeros({2, 2})), "tensor([[0., 0.],\n        [0., 0.]])");
  EXPECT_EQ(str(ones({1, 1, 1, 1})), "tensor([[[[1.]]]])");
}

TEST(Print, IntegersAndBools) {
  EXPECT_EQ(str(from_vector(std::vector<int64_t>{1, -20, 300})), "tensor([  1, -20, 300])");
  EXPECT_EQ(str(arange(6).reshape({2, 3})), "tensor([[0, 1, 2],\n        [3, 4, 5]])");
  EXPECT_EQ(str(from_vector(std::vector<int64_t>{(int64_t{1} << 53) + 1})),
            "tensor([9007199254740993])");
  EXPECT_EQ(str(from_vector(std::vector<bool>{true, false})), "tensor([ True, False])");
  EXPECT_EQ(str(from_vector(std::vector<bool>{true, true, false, false}, Shape{2, 2})),
            "tensor([[ True,  True],\n        [False, False]])");
  EXPECT_EQ(str(from_vector(std::vector<bool>{true})), "tensor([True])");
}

TEST(Print, DTypeSuffixes) {
  EXPECT_EQ(str(from_vector(std::vector<double>{1.5, 2})),
            "tensor([1.5000, 2.0000], dtype=float64)");
  EXPECT_EQ(str(from_vector(std::vector<double>{1, 2})), "tensor([1., 2.], dtype=float64)");
  EXPECT_EQ(str(from_vector(std::vector<int32_t>{1, 2})), "tensor([1, 2], dtype=int32)");
  EXPECT_EQ(str(ones({2}, kInt64)), "tensor([1, 1])");
  EXPECT_EQ(str(ones({2}, kBool)), "tensor([True, True])");
}

TEST(Print, ZeroDim) {
  EXPECT_EQ(str(full({}, 3.5)), "tensor(3.5000)");
  EXPECT_EQ(str(full({}, 2.0)), "tensor(2.)");
  EXPECT_EQ(str(full({}, -7)), "tensor(-7)");
  EXPECT_EQ(str(full({}, true)), "tensor(True)");
  EXPECT_EQ(str(full({}, 2.5, kFloat64)), "tensor(2.5000, dtype=float64)");
  EXPECT_EQ(str(full({}, 4, kInt32)), "tensor(4, dtype=int32)");
  EXPECT_EQ(str(full({}, 1e-5)), "tensor(1.0000e-05)");
  EXPECT_EQ(str(full({}, kNaN)), "tensor(nan)");
}

TEST(Print, Empty) {
  EXPECT_EQ(str(zeros({0})), "tensor([])");
  EXPECT_EQ(str(zeros({2, 0})), "tensor([], size=(2, 0))");
  EXPECT_EQ(str(zeros({0}, kInt64)), "tensor([], dtype=int64)");
  EXPECT_EQ(str(zeros({0, 3}, kInt32)), "tensor([], size=(0, 3), dtype=int32)");
  EXPECT_EQ(str(zeros({0}, kBool)), "tensor([], dtype=bool)");
}

TEST(Print, NonContiguousViews) {
  Tensor a = arange(6, kFloat32).reshape({2, 3});
  EXPECT_EQ(str(a.t()), "tensor([[0., 3.],\n        [1., 4.],\n        [2., 5.]])");
  Tensor d = arange(10, kFloat64) / 4;
  EXPECT_EQ(str(d.slice(0, 1, std::nullopt, 3)), "tensor([0.2500, 1.0000, 1.7500], dtype=float64)");
  Tensor i = arange(12).reshape({3, 4});
  EXPECT_EQ(str(i.slice(1, 1, 3).t()), "tensor([[ 1,  5,  9],\n        [ 2,  6, 10]])");
  EXPECT_EQ(str(i[2]), "tensor([ 8,  9, 10, 11])");
  EXPECT_EQ(str(from_vector(std::vector<float>{1.5f}).expand({2, 2})),
            "tensor([[1.5000, 1.5000],\n        [1.5000, 1.5000]])");
}

TEST(Print, ScientificNotation) {
  EXPECT_EQ(str(f32({1e10f, 1.5f})), "tensor([1.0000e+10, 1.5000e+00])");
  EXPECT_EQ(str(f32({-1e10f, 1.5f})), "tensor([-1.0000e+10,  1.5000e+00])");
  EXPECT_EQ(str(f32({1e-5f, 1.0f})), "tensor([1.0000e-05, 1.0000e+00])");
  // Whole numbers too, when they span more than three orders of magnitude or pass 1e8.
  EXPECT_EQ(str(f32({1, 10000})), "tensor([1.0000e+00, 1.0000e+04])");
  EXPECT_EQ(str(f32({1, 1000})), "tensor([   1., 1000.])");
  EXPECT_EQ(str(f32({100000000.0f})), "tensor([100000000.])");
  EXPECT_EQ(str(f32({123456792.0f})), "tensor([1.2346e+08])");
  // Zeros don't count toward the range, but print in the chosen mode.
  EXPECT_EQ(str(f32({0, 1e10f})), "tensor([0.0000e+00, 1.0000e+10])");
  EXPECT_EQ(str(f32({0, 0.5f})), "tensor([0.0000, 0.5000])");
}

TEST(Print, NonFiniteValues) {
  EXPECT_EQ(str(from_vector(std::vector<double>{1, kInf}).to(kFloat32)), "tensor([1., inf])");
  EXPECT_EQ(str(from_vector(std::vector<double>{-kInf, 2}).to(kFloat32)), "tensor([-inf, 2.])");
  EXPECT_EQ(str(from_vector(std::vector<double>{kNaN, 1.5}).to(kFloat32)),
            "tensor([   nan, 1.5000])");
  EXPECT_EQ(str(from_vector(std::vector<double>{kNaN, kInf}).to(kFloat32)), "tensor([nan, inf])");
}

TEST(Print, LongRowsWrapAtEightyColumns) {
  EXPECT_EQ(str(arange(30, kFloat32)),
            "tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.,\n"
            "        14., 15., 16., 17., 18., 19., 20., 21., 22., 23., 24., 25., 26., 27.,\n"
            "        28., 29.])");
  EXPECT_EQ(str(ones({2, 20})),
            "tensor([[1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,\n"
            "         1., 1.],\n"
            "        [1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,\n"
            "         1., 1.]])");
}

TEST(Print, LargeTensorsAreSummarized) {
  EXPECT_EQ(str(arange(2000)), "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
  EXPECT_EQ(str(arange(1000)).find("..."), std::string::npos);  // 1000 elements: all shown
  EXPECT_EQ(str(arange(2000, kFloat32)),
            "tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, 1.9980e+03,\n"
            "        1.9990e+03])");
  EXPECT_EQ(str(arange(1200).reshape({40, 30})),
            "tensor([[   0,    1,    2,  ...,   27,   28,   29],\n"
            "        [  30,   31,   32,  ...,   57,   58,   59],\n"
            "        [  60,   61,   62,  ...,   87,   88,   89],\n"
            "        ...,\n"
            "        [1110, 1111, 1112,  ..., 1137, 1138, 1139],\n"
            "        [1140, 1141, 1142,  ..., 1167, 1168, 1169],\n"
            "        [1170, 1171, 1172,  ..., 1197, 1198, 1199]])");
  EXPECT_EQ(str(zeros({100, 100})),
            "tensor([[0., 0., 0.,  ..., 0., 0., 0.],\n"
            "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
            "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
            "        ...,\n"
            "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
            "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
            "        [0., 0., 0.,  ..., 0., 0., 0.]])");
  // Dims of 6 or fewer are shown whole even when summarizing.
  EXPECT_EQ(str(arange(1002).reshape({501, 2})),
            "tensor([[   0,    1],\n"
            "        [   2,    3],\n"
            "        [   4,    5],\n"
            "        ...,\n"
            "        [ 996,  997],\n"
            "        [ 998,  999],\n"
            "        [1000, 1001]])");
  // The formatter only looks at the shown elements: a huge hidden value changes nothing.
  Tensor big = arange(2000, kInt64);
  big[1000].fill_(123456789);
  EXPECT_EQ(str(big), "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
}

TEST(Print, ThreeDimSummarized) {
  EXPECT_EQ(str(arange(1400).reshape({7, 2, 100})),
            "tensor([[[   0,    1,    2,  ...,   97,   98,   99],\n"
            "         [ 100,  101,  102,  ...,  197,  198,  199]],\n"
            "\n"
            "        [[ 200,  201,  202,  ...,  297,  298,  299],\n"
            "         [ 300,  301,  302,  ...,  397,  398,  399]],\n"
            "\n"
            "        [[ 400,  401,  402,  ...,  497,  498,  499],\n"
            "         [ 500,  501,  502,  ...,  597,  598,  599]],\n"
            "\n"
            "        ...,\n"
            "\n"
            "        [[ 800,  801,  802,  ...,  897,  898,  899],\n"
            "         [ 900,  901,  902,  ...,  997,  998,  999]],\n"
            "\n"
            "        [[1000, 1001, 1002,  ..., 1097, 1098, 1099],\n"
            "         [1100, 1101, 1102,  ..., 1197, 1198, 1199]],\n"
            "\n"
            "        [[1200, 1201, 1202,  ..., 1297, 1298, 1299],\n"
            "         [1300, 1301, 1302,  ..., 1397, 1398, 1399]]])");
}

TEST(Print, Undefined) {
  EXPECT_EQ(str(Tensor()), "[ undefined tensor ]");
}

TEST(Print, AutogradState) {
  Tensor x = from_vector<double>({1.5, -2});
  x.requires_grad_();
  EXPECT_EQ(str(x), "tensor([ 1.5000, -2.0000], dtype=float64, requires_grad=True)");
  EXPECT_EQ(str(x * 2.0), "tensor([ 3., -4.], dtype=float64, grad_fn=<mul>)");
  EXPECT_EQ(str(x.detach()), "tensor([ 1.5000, -2.0000], dtype=float64)");
}

}  // namespace
}  // namespace kiln
