// A first end-to-end check of the core: factories, a broadcast op, a view and printing.
#include "tests/testing.h"

namespace kiln {
namespace {

TEST(Smoke, BroadcastAddOfTransposedView) {
  Tensor a = arange(6, kFloat32).reshape({2, 3});
  Tensor b = from_vector(std::vector<float>{10, 20});
  Tensor c = a.t() + b;  // [3,2] + [2]
  EXPECT_EQ(c.sizes(), (Shape{3, 2}));
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{10, 23, 11, 24, 12, 25}));
  std::ostringstream os;
  os << c;
  EXPECT_EQ(os.str(), "tensor([[10., 23.],\n        [11., 24.],\n        [12., 25.]])");
}

}  // namespace
}  // namespace kiln
