// DLPack: kiln's tensors shared with libtorch (at::toDLPack / at::fromDLPack) both ways without
// copies, strided views and byte offsets honoured, and the deleter contract: the producer's
// memory is released exactly once, after both sides are done with it.
#include <gtest/gtest.h>

#include <vector>

#include "kiln/dlpack.h"
#include "kiln/kiln.h"
#include "tests/testing.h"

#ifdef KILN_HAS_TORCH
#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#endif

namespace kiln {
namespace {

using testing::expect_error;

// A kiln tensor over a buffer whose release is counted.
struct Counted {
  std::vector<float> buffer;
  int releases = 0;
  Tensor tensor(const Shape& shape) {
    return from_blob(buffer.data(), shape, kFloat32, [this](void*) { ++releases; });
  }
};

// A producer's DLManagedTensor over `data` whose deleter is counted.
struct Producer {
  std::vector<int64_t> shape, strides;
  int releases = 0;
  DLManagedTensor managed{};
  Producer(void* data, DLDataType dtype, std::vector<int64_t> shape_, std::vector<int64_t> strides_,
           uint64_t byte_offset = 0, DLDevice device = {kDLCPU, 0})
      : shape(std::move(shape_)), strides(std::move(strides_)) {
    managed.dl_tensor = {data,       device,       static_cast<int>(shape.size()),
                         dtype,      shape.data(), strides.empty() ? nullptr : strides.data(),
                         byte_offset};
    managed.manager_ctx = this;
    managed.deleter = [](DLManagedTensor* self) {
      ++static_cast<Producer*>(self->manager_ctx)->releases;
    };
  }
};

TEST(DLPack, ExportDescribesAStridedViewInPlace) {
  Tensor base = arange(24, kFloat64).reshape({4, 6});
  Tensor view = base.t().narrow(0, 1, 3);  // [3, 4], strides [1, 6], storage offset 1
  DLManagedTensor* m = to_dlpack(view);
  const DLTensor& dl = m->dl_tensor;
  EXPECT_EQ(dl.ndim, 2);
  EXPECT_EQ(std::vector<int64_t>(dl.shape, dl.shape + 2), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(std::vector<int64_t>(dl.strides, dl.strides + 2), (std::vector<int64_t>{1, 6}));
  EXPECT_EQ(dl.device.device_type, kDLCPU);
  EXPECT_EQ(dl.dtype.code, kDLFloat);
  EXPECT_EQ(dl.dtype.bits, 64);
  const double* p = static_cast<const double*>(dl.data) + dl.byte_offset / sizeof(double);
  EXPECT_EQ(p, base.data_ptr<double>() + 1);  // no copy
  EXPECT_EQ(p[2 * 1 + 3 * 6], 21.0);          // view[2][3] = base[3][3]
  m->deleter(m);
}

TEST(DLPack, ExportedMemoryLivesUntilBothSidesAreDone) {
  Counted c{std::vector<float>(6, 1.5f)};
  Tensor t = c.tensor({2, 3});
  DLManagedTensor* m = to_dlpack(t.narrow(1, 1, 2));
  t = Tensor();  // kiln is done; the consumer still holds it
  EXPECT_EQ(c.releases, 0);
  EXPECT_EQ(static_cast<float*>(m->dl_tensor.data)[0], 1.5f);
  m->deleter(m);
  EXPECT_EQ(c.releases, 1);

  Tensor u = c.tensor({6});
  m = to_dlpack(u);
  m->deleter(m);  // the consumer is done first
  EXPECT_EQ(c.releases, 1);
  u = Tensor();
  EXPECT_EQ(c.releases, 2);
}

TEST(DLPack, ImportHonoursStridesByteOffsetAndCallsTheDeleterOnceAtTheEnd) {
  std::vector<int32_t> data(20);
  for (int i = 0; i < 20; ++i) data[i] = i;
  // Elements from index 3, a [3, 2] view with strides [5, 2]: rows 3.., 8.., 13.. step 2.
  Producer p(data.data(), {kDLInt, 32, 1}, {3, 2}, {5, 2}, 3 * sizeof(int32_t));
  Tensor t = from_dlpack(&p.managed);
  EXPECT_EQ(t.dtype(), kInt32);
  EXPECT_EQ(t.strides(), (Shape{5, 2}));
  EXPECT_EQ(t.to_vector<int32_t>(), (std::vector<int32_t>{3, 5, 8, 10, 13, 15}));
  data[8] = -1;  // shared, not copied
  EXPECT_EQ(t.to_vector<int32_t>()[2], -1);
  Tensor row = t.select(0, 1);
  t = Tensor();
  EXPECT_EQ(p.releases, 0) << "a view still uses the memory";
  EXPECT_EQ(row.sum().item<int64_t>(), -1 + 10);
  row = Tensor();
  EXPECT_EQ(p.releases, 1);

  // Null strides: contiguous.
  Producer q(data.data(), {kDLInt, 64, 1}, {2, 5}, {});
  Tensor c = from_dlpack(&q.managed);
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.sizes(), (Shape{2, 5}));
  c = Tensor();
  EXPECT_EQ(q.releases, 1);
}

TEST(DLPack, KilnToKilnRoundTripSharesMemory) {
  for (DType dt : {kBool, kInt32, kInt64, kFloat32, kFloat64}) {
    Tensor a = (arange(12, kFloat64).reshape({3, 4}) - 5.0).to(dt).t();
    if (dt == kBool) continue;  // exported as uint8 (libtorch 1.13's bool), which kiln lacks
    Tensor b = from_dlpack(to_dlpack(a));
    EXPECT_EQ(b.dtype(), dt);
    EXPECT_EQ(b.strides(), a.strides());
    EXPECT_EQ(b.raw_data_ptr(), a.raw_data_ptr());
    EXPECT_TRUE(equal(b, a)) << dtype_name(dt);
  }
}

TEST(DLPack, UnsupportedInputsRaiseAndLeaveOwnershipWithTheCaller) {
  std::vector<uint16_t> half(4);
  Producer f16(half.data(), {kDLFloat, 16, 1}, {4}, {});
  expect_error([&] { from_dlpack(&f16.managed); }, {"from_dlpack", "16 bits", "float16"});
  Producer u8(half.data(), {kDLUInt, 8, 1}, {4}, {});
  expect_error([&] { from_dlpack(&u8.managed); }, {"from_dlpack", "uint8"});
  Producer lanes(half.data(), {kDLFloat, 32, 2}, {2}, {});
  expect_error([&] { from_dlpack(&lanes.managed); }, {"lanes 2"});
  std::vector<float> data(4);
  Producer negative(data.data(), {kDLFloat, 32, 1}, {4}, {-1}, 3 * sizeof(float));
  expect_error([&] { from_dlpack(&negative.managed); }, {"negative stride", "[-1]"});
  Producer opencl(data.data(), {kDLFloat, 32, 1}, {4}, {}, 0, {kDLOpenCL, 0});
  expect_error([&] { from_dlpack(&opencl.managed); }, {"device type 4"});
  for (const Producer* p : {&f16, &u8, &lanes, &negative, &opencl}) EXPECT_EQ(p->releases, 0);
}

TEST(DLPack, CudaTensorsCarryTheirDevice) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Tensor a = arange(12, kFloat32).reshape({3, 4}).to(kCUDA).t();
  DLManagedTensor* m = to_dlpack(a);
  EXPECT_EQ(m->dl_tensor.device.device_type, kDLCUDA);
  EXPECT_EQ(m->dl_tensor.device.device_id, 0);
  Tensor b = from_dlpack(m);
  EXPECT_TRUE(b.device().is_cuda());
  EXPECT_EQ(b.raw_data_ptr(), a.raw_data_ptr());
  EXPECT_EQ(b.strides(), (Shape{1, 4}));
  EXPECT_TRUE(equal(b.to(kCPU), a.to(kCPU)));
  EXPECT_TRUE(equal((b * 2.0).to(kCPU), arange(12, kFloat32).reshape({3, 4}).t() * 2.0));
}

#ifdef KILN_HAS_TORCH

TEST(DLPackTorch, KilnViewsReachTorchWithoutCopies) {
  Counted c{std::vector<float>(24)};
  for (int i = 0; i < 24; ++i) c.buffer[i] = 0.25f * static_cast<float>(i);
  Tensor base = c.tensor({4, 6});
  Tensor view = base.t().narrow(0, 2, 3);  // [3, 4], strides [1, 6], offset 2
  at::Tensor tt = at::fromDLPack(to_dlpack(view));
  EXPECT_EQ(tt.sizes().vec(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(tt.strides().vec(), (std::vector<int64_t>{1, 6}));
  EXPECT_EQ(tt.data_ptr<float>(), c.buffer.data() + 2);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j)
      EXPECT_EQ(tt[i][j].item<float>(), c.buffer[j * 6 + 2 + i]) << i << "," << j;
  base = Tensor();
  view = Tensor();
  EXPECT_EQ(c.releases, 0) << "torch still holds the memory";
  tt.mul_(2.0);  // torch writes where kiln's buffer is
  EXPECT_EQ(c.buffer[2], 1.0f);
  tt = at::Tensor();
  EXPECT_EQ(c.releases, 1);

  for (DType dt : {kInt32, kInt64, kFloat64}) {
    Tensor k = (arange(6, kFloat64) - 2.0).to(dt);
    at::Tensor t = at::fromDLPack(to_dlpack(k));
    EXPECT_EQ(t.element_size(), static_cast<int64_t>(element_size(dt)));
    EXPECT_TRUE(at::equal(t.to(at::kDouble), at::arange(6, at::kDouble) - 2.0)) << dtype_name(dt);
  }
  at::Tensor b = at::fromDLPack(to_dlpack(from_vector(std::vector<bool>{true, false})));
  EXPECT_EQ(b.scalar_type(), at::kByte);  // DLPack 0.6 has no bool: torch's own convention
  EXPECT_EQ(b[0].item<uint8_t>(), 1);
}

TEST(DLPackTorch, TorchViewsReachKilnWithoutCopies) {
  int torch_releases = 0;
  std::vector<double> buffer(30);
  for (int i = 0; i < 30; ++i) buffer[i] = static_cast<double>(i) - 7.5;
  at::Tensor base = at::from_blob(
      buffer.data(), {5, 6}, [&](void*) { ++torch_releases; },
      at::TensorOptions().dtype(at::kDouble));
  at::Tensor view = base.t().slice(0, 1, 4).slice(1, 0, 5, 2);  // [3, 3], strides [1, 12], off 1
  Tensor k = from_dlpack(at::toDLPack(view));
  EXPECT_EQ(k.dtype(), kFloat64);
  EXPECT_EQ(k.sizes(), (Shape{3, 3}));
  EXPECT_EQ(k.strides(), (Shape{1, 12}));
  EXPECT_EQ(k.raw_data_ptr(), static_cast<void*>(buffer.data() + 1));
  std::vector<double> want;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) want.push_back(buffer[(2 * j) * 6 + 1 + i]);
  EXPECT_EQ(k.to_vector<double>(), want);
  base = at::Tensor();
  view = at::Tensor();
  EXPECT_EQ(torch_releases, 0) << "kiln still holds the memory";
  Tensor doubled = k * 2.0;
  eval(doubled);  // a pending result would hold the memory until computed
  k = Tensor();
  EXPECT_EQ(torch_releases, 1);
  EXPECT_EQ(doubled.to_vector<double>()[0], 2.0 * want[0]);

  for (auto st : {at::kInt, at::kLong, at::kFloat}) {
    at::Tensor t = at::arange(6, at::TensorOptions().dtype(st)).reshape({2, 3}) - 2;
    Tensor got = from_dlpack(at::toDLPack(t));
    EXPECT_EQ(got.to(kFloat64).to_vector<double>(), (std::vector<double>{-2, -1, 0, 1, 2, 3}));
  }
}

#else

TEST(DLPackTorch, NeedsLibtorch) {
  GTEST_SKIP() << "libtorch (Debian libtorch-dev) was not found at configure time; run tools/setup";
}

#endif

}  // namespace
}  // namespace kiln
