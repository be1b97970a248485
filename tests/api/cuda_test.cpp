// CUDA tensors. Without a GPU: every entry raises a clear kiln::Error and leaves its inputs as they
// were, and compiled kernels are cached per architecture. With one: each op on CUDA tensors
// matches the CPU reference (differential tests over random inputs and layouts), autograd and
// jit::trace work unchanged, and the allocator's statistics follow the tensors.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <tuple>

#include "fuser/fuse.h"
#include "jit/passes/passes.h"
#include "kiln/jit.h"
#include "kiln/nn.h"
#include "kiln/optim.h"
#include "kiln/profiler.h"
#include "lib/cuda_driver.h"
#include "tests/fuser/fuser_testing.h"
#include "tests/testing.h"

#ifdef KILN_HAS_CUDA
#include "fuser/cache.h"
#include "fuser/codegen/cuda/cuda_codegen.h"
#include "fuser/codegen/cuda/cuda_kernel.h"
#include "fuser/fuse.h"
#include "jit/ir.h"
#endif

namespace kiln {
namespace {

#define KILN_REQUIRE_GPU()                                                        \
  if (!cuda::is_available())                                                      \
  GTEST_SKIP() << "no usable CUDA device (" << detail::cuda::unavailable_reason() \
               << "): GPU checks skipped; run tools/gpu-check on a GPU machine"

TEST(Cuda, DeviceNamesParse) {
  EXPECT_EQ(Device::parse("cpu"), kCPU);
  EXPECT_EQ(Device::parse("cuda"), kCUDA);
  EXPECT_EQ(Device::parse("cuda:3"), Device(DeviceType::CUDA, 3));
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "CPU"})
    testing::expect_error([&] { Device::parse(bad); }, {"Device", bad});
}

TEST(Cuda, WithoutAGpuEveryEntryRaisesClearly) {
  if (cuda::is_available()) GTEST_SKIP() << "a GPU is present: this checks machines without one";
  EXPECT_EQ(cuda::device_count(), 0);
  EXPECT_FALSE(detail::cuda::unavailable_reason().empty());
  const std::string reason = detail::cuda::unavailable_reason();
  testing::expect_error([] { full({2, 3}, 1.0, kCUDA); }, {"full", "cuda:0", reason});
  testing::expect_error([] { zeros({2}, kCUDA); }, {"zeros", "cuda:0"});
  testing::expect_error([] { empty({2}, Device(DeviceType::CUDA, 1)); }, {"empty", "cuda:1"});
  testing::expect_error([] { randn({2}, kCUDA); }, {"randn", "cuda:0"});
  testing::expect_error([] { arange(5, kCUDA); }, {"arange", "cuda:0"});
  Tensor a = testing::random_tensor({2, 3});
  const std::vector<double> before = testing::values(a);
  testing::expect_error([&] { a.to(kCUDA); }, {"to", "cuda:0", "float32[2, 3]"});
  testing::expect_error([&] { (a * 2).to(kCUDA); }, {"to", "cuda:0"});
  testing::expect_error([] { cuda::synchronize(); }, {"cuda:0"});
  testing::expect_error([] { cuda::memory_stats(); }, {"cuda:0"});
  EXPECT_NO_THROW(cuda::empty_cache());   // nothing to release
  EXPECT_EQ(testing::values(a), before);  // the input is untouched
}

TEST(Cuda, Tf32IsOffByDefault) {
  if (std::getenv("KILN_ALLOW_TF32")) GTEST_SKIP() << "KILN_ALLOW_TF32 is set in the environment";
  EXPECT_FALSE(cuda::allow_tf32());
  cuda::set_allow_tf32(true);
  EXPECT_TRUE(cuda::allow_tf32());
  cuda::set_allow_tf32(false);
}

#ifdef KILN_HAS_CUDA
// The one fused kernel of tanh(a * b) over inputs of `shape`, as the fuser makes it.
fuser::FusionGroup mul_tanh_group(const Shape& shape) {
  jit::Graph g;
  const jit::ValueType type{kFloat32, shape};
  jit::Value* a = g.add_input(type);
  jit::Value* b = g.add_input(type);
  jit::Node* m = g.create("mul", {a, b}, {}, {type});
  jit::Node* t = g.create("tanh", {m->output()}, {}, {type});
  g.add_output(t->output());
  std::vector<fuser::FusionGroup> groups = fuser::find_groups(g);
  EXPECT_EQ(groups.size(), 1u);
  return groups.at(0);
}

TEST(Cuda, BinariesAreCachedOnDiskPerArchitectureAndCompiler) {
  const fuser::FusionGroup g = mul_tanh_group({4, 5});
  fuser::Layout layout;
  layout.single_element.assign(g.kernel.input_types.size(), false);
  const fuser::cuda::CudaCallFlags v{true, true};
  const std::string key90 = fuser::cuda::cuda_binary_key(g.kernel, layout, v, 90);
  const std::string key80 = fuser::cuda::cuda_binary_key(g.kernel, layout, v, 80);
  EXPECT_NE(key90, key80);
  EXPECT_NE(key90.find("sm_90"), std::string::npos);
  EXPECT_NE(key90.find("NVRTC"), std::string::npos);
  const fuser::cuda::CudaCompileStats before = fuser::cuda::cuda_compile_stats();
  const fuser::cuda::CudaBinary bin = fuser::cuda::cuda_binary(g.kernel, layout, v, 90);
  EXPECT_FALSE(bin.ptx);
  EXPECT_GT(bin.image.size(), 100u);
  EXPECT_EQ(bin.image.compare(0, 4,
                              "\x7f"
                              "ELF"),
            0)
      << "a cubin is an ELF image";
  EXPECT_EQ(bin.symbol.rfind("kiln_mul_tanh_", 0), 0u) << bin.symbol;
  // The same request again is served from memory; the disk holds the same bytes.
  const fuser::cuda::CudaBinary again = fuser::cuda::cuda_binary(g.kernel, layout, v, 90);
  EXPECT_EQ(again.image, bin.image);
  const fuser::cuda::CudaCompileStats after = fuser::cuda::cuda_compile_stats();
  EXPECT_EQ(after.memory_hits, before.memory_hits + 1);
  if (fuser::DiskCache::instance().enabled()) {
    // On disk the binary is filed under the source it was compiled from.
    const std::string disk_key = fuser::cuda::cuda_disk_key(
        fuser::cuda::cuda_source(g.kernel, layout, bin.symbol, v), 90, /*ptx=*/false);
    std::optional<std::string> on_disk =
        fuser::DiskCache::instance().load(disk_key, fuser::kCudaBinary);
    ASSERT_TRUE(on_disk.has_value());
    EXPECT_EQ(*on_disk, bin.image);
  }
  // Another architecture is another binary.
  const fuser::cuda::CudaBinary other = fuser::cuda::cuda_binary(g.kernel, layout, v, 80);
  EXPECT_NE(other.image, bin.image);
}

// Each variant (index32, vec) is a binary of its own, under a key of its own, with the kernel's
// symbol; a variant the kernel cannot have (vec of a strided layout) is the scalar one.
TEST(Cuda, EachVariantIsABinaryOfItsOwn) {
  const fuser::FusionGroup g = mul_tanh_group({4, 5});
  fuser::Layout flat;
  flat.single_element.assign(g.kernel.input_types.size(), false);
  std::set<std::string> keys;
  std::string symbol;
  for (bool index32 : {false, true})
    for (bool vec : {false, true}) {
      const fuser::cuda::CudaCallFlags v{index32, vec};
      keys.insert(fuser::cuda::cuda_binary_key(g.kernel, flat, v, 90));
      const fuser::cuda::CudaBinary bin = fuser::cuda::cuda_binary(g.kernel, flat, v, 90);
      EXPECT_TRUE(symbol.empty() || bin.symbol == symbol) << bin.symbol;
      symbol = bin.symbol;
    }
  EXPECT_EQ(keys.size(), 4u);
  fuser::Layout strided;
  strided.flat = false;
  strided.rank = 2;
  strided.inner.assign(3, fuser::Layout::kUnit);
  EXPECT_EQ(fuser::cuda::cuda_binary_key(g.kernel, strided, {true, true}, 90),
            fuser::cuda::cuda_binary_key(g.kernel, strided, {true, false}, 90));
  EXPECT_NE(fuser::cuda::cuda_binary_key(g.kernel, strided, {true, false}, 90),
            fuser::cuda::cuda_binary_key(g.kernel, strided, {false, false}, 90));
}

// A 4-wide kernel's stand-in is its scalar loop (tiered compiles, cuda_kernel.h): the launch takes
// a scalar binary for a call that could run 4 wide, but never a binary of another index width.
TEST(Cuda, AScalarLoopServesAFourWideCallButNotAnotherIndexWidth) {
  KILN_REQUIRE_GPU();
  const fuser::FusionGroup g = mul_tanh_group({1024});
  fuser::Layout flat;
  flat.single_element.assign(g.kernel.input_types.size(), false);
  const Tensor a = zeros({1024}, kCUDA), b = zeros({1024}, kCUDA), out = empty({1024}, kCUDA);
  char* ptrs[] = {static_cast<char*>(a.raw_data_ptr()), static_cast<char*>(b.raw_data_ptr()),
                  static_cast<char*>(out.raw_data_ptr())};
  ASSERT_TRUE((fuser::cuda::launch_variant(g.kernel, flat, 0, 1024, nullptr, nullptr, ptrs) ==
               fuser::cuda::CudaCallFlags{true, true}));
  auto launch_as = [&](fuser::cuda::CudaCallFlags variant) {
    fuser::cuda::CudaKernel k;  // no function: past the variant check, the driver refuses it
    k.name = "kiln_test_kernel";
    k.variant = variant;
    try {
      fuser::cuda::launch_elementwise(k, g.kernel, flat, 0, 1024, nullptr, nullptr, ptrs,
                                      g.scalars.data());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("launched");
  };
  EXPECT_EQ(launch_as({true, false}).find("launched as variant"), std::string::npos);
  EXPECT_NE(launch_as({false, false}).find("launched as variant"), std::string::npos);
  EXPECT_NE(launch_as({false, true}).find("launched as variant"), std::string::npos);
}

// The rows kernel of a softmax along dim 1 of float32 [rows, R].
fuser::FusionGroup softmax_group(int64_t rows, int64_t R) {
  jit::Graph g;
  const jit::ValueType type{kFloat32, {rows, R}}, row{kFloat32, {rows, 1}};
  jit::Value* x = g.add_input(type);
  jit::Value* m = g.create("amax", {x}, {std::vector<int64_t>{1}, true}, {row})->output();
  jit::Value* e =
      g.create("exp", {g.create("sub", {x, m}, {int64_t{1}}, {type})->output()}, {}, {type})
          ->output();
  jit::Value* s =
      g.create("sum", {e}, {std::vector<int64_t>{1}, true, std::monostate{}}, {row})->output();
  g.add_output(g.create("div", {e, s}, {}, {type})->output());
  for (fuser::FusionGroup& group : fuser::find_groups(g))
    if (group.rows) return group;
  ADD_FAILURE() << "the softmax has no rows group";
  return {};
}

// The layout of a rows kernel over rank-2 tensors contiguous along their rows (softmax_group's).
fuser::Layout contiguous_rows_layout() {
  fuser::Layout rows;
  rows.flat = false;
  rows.rows = true;
  rows.rank = 1;
  rows.inner.assign(2, fuser::Layout::kUnit);
  return rows;
}

// A rows call takes the vec variant (16-byte quad accesses) only where every row of its
// contiguous pointers starts 16-byte aligned: x[:, 1:] of a [64, 1025] tensor takes the scalar
// loop, and the launcher refuses a vec binary for it; a scalar binary serves an aligned call.
TEST(Cuda, RowsOfAMisalignedViewNeverRunAVecBinary) {
  KILN_REQUIRE_GPU();
  const fuser::FusionGroup g = softmax_group(64, 1024);
  const fuser::Layout rows = contiguous_rows_layout();
  const Tensor x = zeros({64, 1025}, kCUDA), out = empty({64, 1024}, kCUDA);
  const Tensor view = x.slice(1, 1);
  const int64_t sizes[] = {64, 1024};
  const int64_t view_strides[] = {1025, 1, 1024, 1}, aligned_strides[] = {1024, 1, 1024, 1};
  char* view_ptrs[] = {static_cast<char*>(view.raw_data_ptr()),
                       static_cast<char*>(out.raw_data_ptr())};
  char* aligned_ptrs[] = {static_cast<char*>(x.raw_data_ptr()),
                          static_cast<char*>(out.raw_data_ptr())};
  const fuser::cuda::CudaCallFlags misaligned =
      fuser::cuda::launch_variant(g.kernel, rows, 0, 64, sizes, view_strides, view_ptrs);
  const fuser::cuda::CudaCallFlags aligned =
      fuser::cuda::launch_variant(g.kernel, rows, 0, 64, sizes, aligned_strides, aligned_ptrs);
  EXPECT_FALSE(misaligned.vec);
  EXPECT_TRUE(aligned.vec);
  auto launch_as = [&](fuser::cuda::CudaCallFlags variant, const int64_t* strides,
                       char* const* ptrs) {
    fuser::cuda::CudaKernel k;  // no function: past the variant check, the driver refuses it
    k.name = "kiln_test_kernel";
    k.variant = variant;
    try {
      fuser::cuda::launch_rows(k, g.kernel, rows, 0, sizes, strides, ptrs, g.scalars.data());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("launched");
  };
  fuser::cuda::CudaCallFlags vec = misaligned;
  vec.vec = true;
  EXPECT_NE(launch_as(vec, view_strides, view_ptrs).find("launched as variant"), std::string::npos);
  EXPECT_EQ(launch_as(misaligned, view_strides, view_ptrs).find("launched as variant"),
            std::string::npos);
  fuser::cuda::CudaCallFlags scalar = aligned;
  scalar.vec = false;
  EXPECT_EQ(launch_as(scalar, aligned_strides, aligned_ptrs).find("launched as variant"),
            std::string::npos);
}

// A loaded rows kernel knows its row caches (softmax keeps x, which its three passes read) and may
// launch with the device's opt-in shared memory (above the default 48 KiB), which the loader
// allowed; the register variant keeps no row in shared memory.
TEST(Cuda, RowsKernelsMayUseTheDevicesOptInSharedMemory) {
  KILN_REQUIRE_GPU();
  const fuser::FusionGroup g = softmax_group(64, 1024);
  const fuser::Layout rows = contiguous_rows_layout();
  const fuser::cuda::CudaKernel generic = fuser::cuda::cuda_kernel(g.kernel, rows, {true}, 0);
  EXPECT_EQ(generic.row_caches, std::vector<int>{4});
  const int optin = detail::cuda::device_info(0).max_shared_per_block_optin;
  EXPECT_GT(optin, 48 << 10);
  EXPECT_EQ(generic.max_dynamic_shared, optin - 1024);
  const fuser::cuda::CudaKernel registers =
      fuser::cuda::cuda_kernel(g.kernel, rows, {true, false, 16, 256}, 0);
  EXPECT_TRUE(registers.row_caches.empty());
}
#endif

// ---- With a GPU: CUDA against the CPU reference ----

// Runs f on CPU copies and on CUDA copies of `inputs`; the results must agree within tolerance.
void expect_same_on_cuda(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                         const std::vector<Tensor>& inputs, double rtol = 1e-5,
                         double atol = 1e-6) {
  std::vector<Tensor> on_gpu;
  for (const Tensor& t : inputs) on_gpu.push_back(t.to(kCUDA));
  Tensor expected = f(inputs);
  Tensor actual = f(on_gpu);
  ASSERT_EQ(actual.device(), kCUDA);
  testing::expect_close(actual.to(kCPU), testing::values(expected), expected.sizes(),
                        expected.dtype(), rtol, atol);
}

TEST(Cuda, CopiesRoundTripEveryDtypeAndLayout) {
  KILN_REQUIRE_GPU();
  for (DType dt : {kFloat32, kFloat64, kInt32, kInt64, kBool}) {
    const Tensor t = testing::random_tensor({3, 4, 5}, dt);
    for (const auto& [name, v] : testing::layouts(t)) {
      const Tensor d = v.to(kCUDA);
      EXPECT_EQ(d.device(), kCUDA);
      EXPECT_EQ(testing::values(d.to(kCPU)), testing::values(t)) << name;
      // A view of a device tensor comes back as its own values.
      const Tensor back = d.transpose(0, 2).to(kCPU);
      EXPECT_EQ(testing::values(back), testing::values(t.transpose(0, 2))) << name;
    }
  }
  EXPECT_EQ(zeros({0, 3}, kCUDA).to(kCPU).numel(), 0);
  EXPECT_EQ(full({}, 2.5, kCUDA).item<float>(), 2.5f);
}

// Fills made on the device (a memset for zero bytes, the copy kernel for other values) hold what
// the host's factories make, in every dtype: -0.0 keeps its sign, integers their full range.
TEST(Cuda, FactoriesFillOnTheDevice) {
  KILN_REQUIRE_GPU();
  for (DType dt : {kFloat32, kFloat64, kInt32, kInt64, kBool}) {
    for (const Scalar& v : {Scalar(0), Scalar(1), Scalar(-0.0), Scalar(2.5), Scalar(int64_t{-7}),
                            Scalar(int64_t{4000000000})}) {
      const Tensor expected = full({5, 3}, v, dt);
      const Tensor got = full({5, 3}, v, TensorOptions(dt).device(kCUDA));
      ASSERT_EQ(got.device(), kCUDA);
      EXPECT_EQ(got.dtype(), dt);
      EXPECT_EQ(testing::values(got.to(kCPU)), testing::values(expected));
      if (is_floating_point(dt)) {
        EXPECT_EQ(std::signbit(got.to(kCPU).to(kFloat64).data_ptr<double>()[0]),
                  std::signbit(expected.to(kFloat64).data_ptr<double>()[0]));
      }
    }
    EXPECT_EQ(testing::values(zeros({4, 4}, TensorOptions(dt).device(kCUDA)).to(kCPU)),
              testing::values(zeros({4, 4}, dt)));
    EXPECT_EQ(testing::values(ones({4, 4}, TensorOptions(dt).device(kCUDA)).to(kCPU)),
              testing::values(ones({4, 4}, dt)));
    EXPECT_EQ(zeros({0, 4}, TensorOptions(dt).device(kCUDA)).numel(), 0);
  }
  const Tensor on = testing::random_tensor({2, 3}).to(kCUDA);
  EXPECT_EQ(testing::values(zeros_like(on).to(kCPU)), testing::values(zeros({2, 3})));
  EXPECT_EQ(zeros_like(on).device(), kCUDA);
}

TEST(Cuda, ElementwiseGroupsMatchTheCpu) {
  KILN_REQUIRE_GPU();
  const Tensor a = testing::random_tensor({64, 33}), b = testing::random_tensor({64, 33}),
               c = testing::random_tensor({33});
  expect_same_on_cuda(
      [](const std::vector<Tensor>& in) { return sigmoid(in[0]) * tanh(in[1]) + in[2]; }, {a, b, c},
      1e-5, 1e-6);
  expect_same_on_cuda(
      [](const std::vector<Tensor>& in) {
        const Tensor& x = in[0];
        return 0.5 * x * (1 + tanh(0.7978845608 * (x + 0.044715 * x * x * x)));
      },
      {testing::random_tensor({1 << 16})}, 1e-5, 1e-6);
  expect_same_on_cuda([](const std::vector<Tensor>& in) { return in[0].t() * 3 - in[1].t(); },
                      {a, b}, 0, 0);
  const Tensor i = testing::random_tensor({100}, kInt64, -50, 50),
               j = testing::random_tensor({100}, kInt64, 1, 9);
  expect_same_on_cuda(
      [](const std::vector<Tensor>& in) { return remainder(in[0] * in[1] + 7, in[1]); }, {i, j}, 0,
      0);
  expect_same_on_cuda([](const std::vector<Tensor>& in) { return gt(in[0], in[1]).to(kFloat32); },
                      {a, b}, 0, 0);
}

// The fuser's random elementwise programs (mixed dtypes, broadcasts, non-contiguous inputs, sizes
// 0 and 1), run on CUDA copies of their inputs and compared with the CPU's results.
TEST(Cuda, RandomProgramsMatchTheCpu) {
  KILN_REQUIRE_GPU();
  testing::RandomProgram gen(2026);
  for (int p = 0; p < 300; ++p) {
    const testing::Inputs inputs = gen.make_inputs();
    const testing::Fn fn = gen.make_program(1 + p % 8);
    testing::Inputs expected;
    bool cpu_threw = false;
    try {
      expected = fn(inputs);
    } catch (const Error&) {
      cpu_threw = true;
    }
    testing::Inputs on_gpu;
    for (const Tensor& t : inputs) on_gpu.push_back(t.to(kCUDA));
    if (cpu_threw) {
      EXPECT_THROW(
          {
            for (const Tensor& t : fn(on_gpu)) t.to(kCPU);
          },
          Error)
          << "program " << p;
      continue;
    }
    const testing::Inputs got = fn(on_gpu);
    ASSERT_EQ(got.size(), expected.size()) << "program " << p;
    for (size_t k = 0; k < got.size(); ++k) {
      const bool exact = !is_floating_point(expected[k].dtype());
      testing::expect_close(got[k].to(kCPU), testing::values(expected[k]), expected[k].sizes(),
                            expected[k].dtype(), exact ? 0 : 1e-4, exact ? 0 : 1e-5);
    }
  }
}

TEST(Cuda, IndexOpsMatchTheCpu) {
  KILN_REQUIRE_GPU();
  for (DType dt : {kFloat32, kFloat64, kInt64, kBool}) {
    const Tensor x = testing::random_tensor({5, 7, 3}, dt);
    const Tensor rows = testing::random_tensor({9}, kInt64, 0, 7);
    for (int64_t d : {0, 1, 2}) {
      const Tensor idx = testing::random_tensor({6}, kInt64, 0, x.size(d));
      expect_same_on_cuda(
          [d](const std::vector<Tensor>& in) { return index_select(in[0], d, in[1]); }, {x, idx}, 0,
          0);
      Shape ishape = x.sizes();
      ishape[static_cast<size_t>(d)] = 4;
      const Tensor g = testing::random_tensor(ishape, kInt64, 0, x.size(d));
      expect_same_on_cuda([d](const std::vector<Tensor>& in) { return gather(in[0], d, in[1]); },
                          {x, g}, 0, 0);
    }
    expect_same_on_cuda(
        [](const std::vector<Tensor>& in) { return index_select(in[0].transpose(0, 1), 1, in[1]); },
        {x, testing::random_tensor({4}, kInt64, 0, 5)}, 0, 0);
    if (is_floating_point(dt))
      expect_same_on_cuda(
          [](const std::vector<Tensor>& in) {
            return embedding(in[0].reshape({7, 15}), in[1].view({3, 3}));
          },
          {x, rows}, 0, 0);
    expect_same_on_cuda(
        [](const std::vector<Tensor>& in) {
          return cat({in[0], in[0].narrow(1, 2, 3), in[0]}, 1);
        },
        {x}, 0, 0);
    expect_same_on_cuda(
        [](const std::vector<Tensor>& in) {
          return stack({in[0], in[0].transpose(0, 0)}, 2);
        },
        {x}, 0, 0);
  }
}

// index_add and scatter_add on a device add in the CPU's order, so they match it exactly: every
// dtype (bool adds as or), indices repeated many times, every dim, views as self and src, a
// scatter_add index smaller than self outside dim, 0-dim and empty operands. The backward of
// embedding, gather and index_select (a scatter-add of the gradient) gives the CPU's gradients.
TEST(Cuda, ScatterOpsMatchTheCpu) {
  KILN_REQUIRE_GPU();
  using In = std::vector<Tensor>;
  for (DType dt : {kFloat32, kFloat64, kInt32, kInt64, kBool}) {
    const Tensor x = testing::random_tensor({5, 7, 3}, dt);
    const Tensor xt = testing::random_tensor({3, 7, 5}, dt);  // transposed: x's shape
    for (int64_t d : {0, 1, 2}) {
      // 11 entries among at most 3 rows: every row repeats.
      const double rows = static_cast<double>(std::min<int64_t>(3, x.size(d)));
      Shape sshape = x.sizes();
      sshape[static_cast<size_t>(d)] = 11;
      const Tensor idx = testing::random_tensor({11}, kInt64, 0, rows);
      const Tensor src = testing::random_tensor(sshape, dt);
      expect_same_on_cuda([d](const In& in) { return index_add(in[0], d, in[1], in[2]); },
                          {x, idx, src}, 0, 0);
      const Tensor srct = testing::random_tensor({sshape[2], sshape[1], sshape[0]}, dt);
      expect_same_on_cuda(
          [d](const In& in) {
            return index_add(in[0].transpose(0, 2), d, in[1], in[2].transpose(0, 2));
          },
          {xt, idx, srct}, 0, 0);
      Shape ishape = x.sizes();
      ishape[static_cast<size_t>(d)] = 9;
      ishape[static_cast<size_t>((d + 1) % 3)] -= 1;  // smaller than self outside dim
      const Tensor g = testing::random_tensor(ishape, kInt64, 0, rows);
      const Tensor s = testing::random_tensor(ishape, dt);
      expect_same_on_cuda([d](const In& in) { return scatter_add(in[0], d, in[1], in[2]); },
                          {x, g, s}, 0, 0);
      expect_same_on_cuda(
          [d](const In& in) { return scatter_add(in[0].transpose(0, 2), d, in[1], in[2]); },
          {xt, g, s}, 0, 0);
    }
    // 0-dim self and src count as [1]; an empty index adds nothing; an empty self.
    const Tensor one = testing::random_tensor({}, dt), zero = zeros({}, kInt64);
    expect_same_on_cuda([](const In& in) { return index_add(in[0], 0, in[1], in[2]); },
                        {one, zeros({1}, kInt64), testing::random_tensor({1}, dt)}, 0, 0);
    expect_same_on_cuda([](const In& in) { return scatter_add(in[0], 0, in[1], in[2]); },
                        {one, zero, testing::random_tensor({}, dt)}, 0, 0);
    expect_same_on_cuda([](const In& in) { return index_add(in[0], 1, in[1], in[2]); },
                        {x, zeros({0}, kInt64), zeros({5, 0, 3}, dt)}, 0, 0);
    expect_same_on_cuda([](const In& in) { return scatter_add(in[0], 0, in[1], in[2]); },
                        {x, zeros({0, 7, 3}, kInt64), zeros({0, 7, 3}, dt)}, 0, 0);
    expect_same_on_cuda([](const In& in) { return index_add(in[0], 0, in[1], in[2]); },
                        {zeros({4, 0}, dt), zeros({2}, kInt64), zeros({2, 0}, dt)}, 0, 0);
  }
  // Bad input raises as on the CPU; so does an operand on another device, naming both.
  const Tensor self = zeros({4, 3}, kCUDA), src = ones({2, 3}, kCUDA);
  testing::expect_error(
      [&] {
        index_add(self, 0, from_vector<int64_t>({0, 4}).to(kCUDA), src);
      },
      {"index_add", "index 4 is out of range", "[0, 4)"});
  testing::expect_error(
      [&] {
        index_add(self, 0, from_vector<int64_t>({0, 1}), src);
      },
      {"index_add", "cpu", "cuda:0"});
  testing::expect_error(
      [&] {
        index_add(self, 0, from_vector<int64_t>({0, 1}).to(kCUDA), src.to(kCPU));
      },
      {"index_add", "cpu", "cuda:0"});
  testing::expect_error(
      [&] {
        scatter_add(self, 1, from_vector<int64_t>({3, 0}).view({1, 2}).to(kCUDA),
                    src.narrow(0, 0, 1).narrow(1, 0, 2));
      },
      {"scatter_add", "index 3 is out of range", "[0, 3)"});
  testing::expect_error(
      [&] {
        scatter_add(self, 1, zeros({1, 2}, kInt64), src.narrow(0, 0, 1).narrow(1, 0, 2));
      },
      {"scatter_add", "cpu", "cuda:0"});
  // Gradients: each a sum of the upstream gradient's rows at repeated indices.
  const Tensor w = testing::random_tensor({6, 4}), c = testing::random_tensor({10, 4});
  const Tensor rows = testing::random_tensor({10}, kInt64, 0, 3);
  const Tensor gi = testing::random_tensor({6, 4}, kInt64, 0, 3);
  auto grads_on = [&](Device d) {
    std::vector<Tensor> grads;
    for (int form = 0; form < 3; ++form) {
      Tensor wd = w.to(d).detach().requires_grad_(true);
      const Tensor rd = rows.to(d), cd = c.to(d);
      Tensor y = form == 0   ? embedding(wd, rd.view({2, 5})).reshape({10, 4}) * cd
                 : form == 1 ? index_select(wd, 0, rd) * cd
                             : gather(wd, 1, gi.to(d)) * cd.narrow(0, 0, 6);
      y.sum().backward();
      grads.push_back(wd.grad().to(kCPU));
    }
    return grads;
  };
  const std::vector<Tensor> expected = grads_on(kCPU), got = grads_on(kCUDA);
  for (size_t k = 0; k < expected.size(); ++k)
    testing::expect_close(got[k], testing::values(expected[k]), expected[k].sizes(), kFloat32, 0,
                          0);
}

// Statistics, grids, unique and the newer elementwise rows on a device: the CPU's values (the
// sorts and data-dependent sizes go through the host, the elementwise parts run on the device).
TEST(Cuda, StatisticsAndGridsMatchTheCpu) {
  KILN_REQUIRE_GPU();
  using In = std::vector<Tensor>;
  for (DType dt : {kFloat32, kFloat64}) {
    const Tensor a = testing::random_tensor({4, 6}, dt), b = testing::random_tensor({30, 6}, dt);
    expect_same_on_cuda([](const In& in) { return quantile(in[0], 0.3, int64_t{1}); }, {a});
    expect_same_on_cuda([](const In& in) { return nanquantile(in[0], 0.7); }, {a});
    expect_same_on_cuda([](const In& in) { return cov(in[0]); }, {a}, 1e-5, 1e-5);
    expect_same_on_cuda([](const In& in) { return corrcoef(in[0]); }, {a}, 1e-5, 1e-5);
    expect_same_on_cuda([](const In& in) { return cdist(in[0], in[1]); }, {a, b}, 1e-4, 1e-4);
    expect_same_on_cuda([](const In& in) { return cdist(in[0], in[1], 1); }, {a, b}, 1e-5, 1e-5);
    expect_same_on_cuda([](const In& in) { return histc(in[0], 7); }, {a});
    expect_same_on_cuda(
        [](const In& in) { return std::get<2>(unique(in[0].round(), true, true, true)); }, {a});
    expect_same_on_cuda([](const In& in) { return hypot(in[0], in[0] * 0.5); }, {a});
    expect_same_on_cuda([](const In& in) { return log10(in[0].abs()) + sinc(in[0]); }, {a});
    expect_same_on_cuda([](const In& in) { return trapezoid(in[0], 0.5) + diff(in[0]).sum(1); },
                        {a}, 1e-5, 1e-5);
    expect_same_on_cuda([](const In& in) { return tensordot(in[0], in[1], {1}, {1}); }, {a, b},
                        1e-5, 1e-5);
    expect_same_on_cuda([](const In& in) { return block_diag({in[0], rot90(in[0])}); }, {a});
    // flip and the triangles index on the tensor's device.
    expect_same_on_cuda([](const In& in) { return flip(in[0], {0, 1}) + tril(in[0], 1); }, {a});
  }
  const Tensor counts = bincount(testing::random_tensor({50}, kInt64, 0, 9).to(kCUDA));
  EXPECT_EQ(counts.device(), kCUDA);
  EXPECT_EQ(counts.sum().item<int64_t>(), 50);
}

// The products, LU, sign rows, indexing rows, padding and losses on a device: the CPU's values
// (LU and the sorts behind isin go through the host; the rest runs on the device).
TEST(Cuda, ProductsLuAndPaddingMatchTheCpu) {
  KILN_REQUIRE_GPU();
  using In = std::vector<Tensor>;
  for (DType dt : {kFloat32, kFloat64}) {
    const Tensor a = (testing::random_tensor({2, 4, 4}, dt, -1, 1) + eye(4, dt) * 4.0);
    const Tensor b = testing::random_tensor({2, 4, 3}, dt), v = testing::random_tensor({4}, dt);
    expect_same_on_cuda([](const In& in) { return baddbmm(in[1], in[0], in[1], 0.5, 2); }, {a, b},
                        1e-5, 1e-5);
    expect_same_on_cuda([](const In& in) { return addmv(in[1], in[0].select(0, 0), in[1], 0, 3); },
                        {a, v}, 1e-5, 1e-5);
    expect_same_on_cuda(
        [](const In& in) {
          return linalg::multi_dot({in[0].select(0, 0), in[0].select(0, 1), in[1]});
        },
        {a, v}, 1e-5, 1e-5);
    expect_same_on_cuda(
        [](const In& in) {
          const auto [lu, pivots] = linalg::lu_factor(in[0]);
          return linalg::lu_solve(lu, pivots, in[1], true, true);
        },
        {a, b}, 1e-5, 1e-5);
    expect_same_on_cuda([](const In& in) { return std::get<0>(linalg::lu(in[0].flip({1}))); }, {a});
    expect_same_on_cuda(
        [](const In& in) { return copysign(in[0], in[0].flip({2})) + fmax(in[0], 0.5); }, {a});
    expect_same_on_cuda([](const In& in) { return signbit(in[0] - 0.5); }, {a});
    expect_same_on_cuda([](const In& in) { return isin(in[0].round(), in[1].round()); }, {a, b});
    expect_same_on_cuda(
        [](const In& in) {
          return take_along_dim(in[0], argsort(in[0], 2), 2) + renorm(in[0], 2, 0, 1);
        },
        {a}, 1e-5, 1e-5);
    expect_same_on_cuda(
        [](const In& in) { return diagonal_scatter(in[0], in[1].select(2, 0), 0, 1, 2); },
        {a, testing::random_tensor({2, 4, 3}, dt)});
    expect_same_on_cuda([](const In& in) { return pad(in[0], {1, 2, 2, 1}, "reflect"); }, {a});
    expect_same_on_cuda(
        [](const In& in) {
          return pixel_shuffle(in[0].reshape({1, 8, 1, 4}), 2);
        },
        {a});
    expect_same_on_cuda(
        [](const In& in) { return soft_margin_loss(in[0], in[1].sign(), Reduction::None); },
        {a, a.flip({0})}, 1e-5, 1e-5);
  }
}

// Matrix functions on a device run on the host's LAPACK (copied there and back): the CPU's
// values, a device result, and gradients that come back to the device.
TEST(Cuda, MatrixFunctionsMatchTheCpu) {
  KILN_REQUIRE_GPU();
  using In = std::vector<Tensor>;
  for (DType dt : {kFloat32, kFloat64}) {
    const Tensor a = (testing::random_tensor({2, 4, 4}, dt, -1, 1) + eye(4, dt) * 4.0);
    const Tensor b = testing::random_tensor({4, 3}, dt);
    expect_same_on_cuda([](const In& in) { return linalg::solve(in[0], in[1]); }, {a, b});
    expect_same_on_cuda([](const In& in) { return linalg::inv(in[0].transpose(1, 2)); }, {a});
    expect_same_on_cuda([](const In& in) { return linalg::det(in[0]); }, {a});
    expect_same_on_cuda([](const In& in) { return std::get<1>(linalg::slogdet(in[0])); }, {a});
    expect_same_on_cuda(
        [](const In& in) { return linalg::cholesky(matmul(in[0], in[0].transpose(1, 2))); }, {a});
    expect_same_on_cuda(
        [](const In& in) { return linalg::solve_triangular(in[0], in[1], true, true, false); },
        {a, b});
    expect_same_on_cuda([](const In& in) { return linalg::svdvals(in[0]); }, {a}, 1e-4, 1e-4);
    expect_same_on_cuda([](const In& in) { return linalg::pinv(in[0]); }, {b}, 1e-4, 1e-4);
    expect_same_on_cuda([](const In& in) { return linalg::matrix_power(in[0], -2); }, {a}, 1e-4,
                        1e-5);
    expect_same_on_cuda([](const In& in) { return linalg::matrix_norm(in[0], "nuc"); }, {a}, 1e-4,
                        1e-4);
    // The scans and searchsorted run on the host too.
    expect_same_on_cuda([](const In& in) { return std::get<1>(cummax(in[0], 0)); }, {b});
    expect_same_on_cuda([](const In& in) { return logcumsumexp(in[0], 1); }, {b});
    expect_same_on_cuda(
        [](const In& in) { return searchsorted(cumsum(abs(in[0]), 1) - 2.0, in[0]); }, {b});
    const Tensor ad = a.to(kCUDA).requires_grad_();
    linalg::det(ad).sum().backward();
    ASSERT_EQ(ad.grad().device(), kCUDA);
    const Tensor ac = a.clone().requires_grad_();
    linalg::det(ac).sum().backward();
    testing::expect_close(ad.grad().to(kCPU), testing::values(ac.grad()), a.sizes(), dt, 1e-4,
                          1e-4);
  }
  // A singular matrix on a device raises as on the CPU.
  try {
    (void)linalg::inv(zeros({2, 2}, TensorOptions(kFloat64).device(kCUDA)));
    ADD_FAILURE() << "inv of a singular matrix on a device did not raise";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("singular"), std::string::npos) << e.what();
  }
}

TEST(Cuda, ReductionsAndNormalizationsMatchTheCpu) {
  KILN_REQUIRE_GPU();
  const Tensor x = testing::random_tensor({37, 129});
  expect_same_on_cuda([](const std::vector<Tensor>& in) { return softmax(in[0], 1); }, {x}, 1e-5,
                      1e-6);
  expect_same_on_cuda([](const std::vector<Tensor>& in) { return log_softmax(in[0], 1); }, {x},
                      1e-5, 1e-5);
  expect_same_on_cuda([](const std::vector<Tensor>& in) { return layer_norm(in[0], {129}); }, {x},
                      1e-4, 1e-5);
  expect_same_on_cuda([](const std::vector<Tensor>& in) { return in[0].sum({0}); }, {x}, 1e-5,
                      1e-5);
  expect_same_on_cuda([](const std::vector<Tensor>& in) { return in[0].sum(); }, {x}, 1e-5, 1e-4);
  expect_same_on_cuda([](const std::vector<Tensor>& in) { return in[0].amax({1}); }, {x}, 0, 0);
}

// Rows kernels on views whose rows start anywhere (the scalar loop) and on aligned ones (16-byte
// quad accesses) give the CPU's softmax, layer_norm and column sums.
TEST(Cuda, RowsOfMisalignedAndAlignedViewsMatchTheCpu) {
  KILN_REQUIRE_GPU();
  const Tensor x = testing::random_tensor({64, 1025});
  for (int64_t start : {0, 1}) {
    auto view = [start](const Tensor& t) { return t.slice(1, start, start + 1024); };
    expect_same_on_cuda([&](const std::vector<Tensor>& in) { return softmax(view(in[0]), 1); }, {x},
                        1e-5, 1e-6);
    expect_same_on_cuda(
        [&](const std::vector<Tensor>& in) { return layer_norm(view(in[0]), {1024}); }, {x}, 1e-4,
        1e-5);
    expect_same_on_cuda([&](const std::vector<Tensor>& in) { return view(in[0]).sum({0}); }, {x},
                        1e-5, 1e-5);
  }
}

// prod folds on the device as a row, column and global reduction, and pow (lib/math's single
// definition rendered as CUDA C) gives the CPU's values: exact for integral exponents up to 64
// and square roots, libdevice's pow otherwise.
TEST(Cuda, ProductsAndPowersMatchTheCpu) {
  KILN_REQUIRE_GPU();
  const Tensor x = testing::input({64, 33}, kFloat64, 0.9, 1.1);
  expect_same_on_cuda([](const std::vector<Tensor>& in) { return prod(in[0] * in[0], {1}); }, {x},
                      1e-12, 0);
  expect_same_on_cuda([](const std::vector<Tensor>& in) { return prod(in[0] * in[0], {0}); }, {x},
                      1e-12, 0);
  expect_same_on_cuda([](const std::vector<Tensor>& in) { return prod(in[0] * in[0]); }, {x}, 1e-12,
                      0);
  // Exponents by squaring (integral, |e| <= 64) and square roots: exact.
  const Tensor e = floor(testing::input({64, 33}, kFloat64, -64.0, 64.99));
  e.narrow(0, 0, 1).fill_(0.5);
  e.narrow(0, 1, 1).fill_(-0.5);
  // Other exponents: the math library's pow on each side (libdevice's within 2 ulp in float64).
  const Tensor other = testing::input({64, 33}, kFloat64, -70.0, 70.0);
  auto power = [](const std::vector<Tensor>& in) { return pow(in[0] + 0.5, in[1]) * 1.0; };
  for (DType t : {kFloat32, kFloat64}) {
    expect_same_on_cuda(power, {x.to(t), e.to(t)}, 0, 0);
    expect_same_on_cuda(power, {x.to(t), other.to(t)}, t == kFloat32 ? 2e-6 : 1e-14, 0);
  }
}

// The ops that a device computes as compositions of fusible ops (lib/ops/nn.cpp, reduce.cpp):
// values and gradients as the CPU's reference kernels give them, ties and NaN included.
TEST(Cuda, ComposedOpsMatchTheCpu) {
  KILN_REQUIRE_GPU();
  const Tensor x = testing::random_tensor({6, 5, 9}), w = testing::random_tensor({5, 9}),
               b = testing::random_tensor({5, 9});
  for (const DType dt : {kFloat32, kFloat64}) {
    const double tol = dt == kFloat32 ? 1e-5 : 1e-12;
    expect_same_on_cuda(
        [](const std::vector<Tensor>& in) {
          return layer_norm(in[0], {5, 9}, in[1], in[2], 1e-3) + layer_norm(in[0], {9});
        },
        {x.to(dt), w.to(dt), b.to(dt)}, 10 * tol, tol);
    for (const Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
      expect_same_on_cuda(
          [r](const std::vector<Tensor>& in) { return mse_loss(in[0], in[1].select(0, 2), r); },
          {x.to(dt), x.to(dt) * 0.5}, tol, tol);
      const Tensor target = testing::random_tensor({6, 9}, kInt64, 0, 5);
      expect_same_on_cuda(
          [r](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], r); },
          {x.to(dt), target}, tol, tol);
      expect_same_on_cuda(
          [r](const std::vector<Tensor>& in) { return nll_loss(in[0].select(2, 0), in[1], r); },
          {x.to(dt), target.select(1, 3)}, tol, tol);
      expect_same_on_cuda(
          [r](const std::vector<Tensor>& in) { return nll_loss(in[0][0][1], in[1], r); },
          {x.to(dt), scalar_tensor(4, kInt64)}, tol, tol);
      // Class weights, an ignored class and label smoothing: the weighted mean's divisor on the
      // device.
      const Tensor class_weight = testing::random_tensor({5}, dt, 0.5, 2.0);
      expect_same_on_cuda(
          [r](const std::vector<Tensor>& in) {
            return cross_entropy(in[0], in[1], in[2], r, 2, 0.1) + nll_loss(in[0], in[1], in[2], r);
          },
          {x.to(dt), target, class_weight}, tol, tol);
      expect_same_on_cuda(
          [r](const std::vector<Tensor>& in) {
            return cross_entropy(in[0], in[1], Tensor(), r, 3);
          },
          {x.to(dt), target}, tol, tol);
    }
  }
  // Ties (integers from a small range) and NaN: the first extremum, NaN counting as one.
  Tensor ties = floor(testing::random_tensor({7, 6, 5}, kFloat32, 0, 3));
  Tensor with_nan = ties.clone();
  with_nan.narrow(0, 2, 1).narrow(1, 1, 1).fill_(std::nan(""));
  for (const Tensor& t : {ties, with_nan, ties.to(kInt64), gt(ties, 1.0), ties.transpose(0, 2)}) {
    for (int64_t d : {0, 1, 2, -1}) {
      for (bool keep : {false, true}) {
        expect_same_on_cuda(
            [d, keep](const std::vector<Tensor>& in) { return argmax(in[0], d, keep); }, {t}, 0, 0);
        expect_same_on_cuda(
            [d, keep](const std::vector<Tensor>& in) { return argmin(in[0], d, keep); }, {t}, 0, 0);
        expect_same_on_cuda(
            [d, keep](const std::vector<Tensor>& in) {
              auto [v, i] = max(in[0], d, keep);
              return cat({v.to(kFloat64).reshape({-1}), i.to(kFloat64).reshape({-1})}, 0);
            },
            {t}, 0, 0);
        expect_same_on_cuda(
            [d, keep](const std::vector<Tensor>& in) {
              auto [v, i] = min(in[0], d, keep);
              return cat({v.to(kFloat64).reshape({-1}), i.to(kFloat64).reshape({-1})}, 0);
            },
            {t}, 0, 0);
        expect_same_on_cuda(
            [d, keep](const std::vector<Tensor>& in) { return all(in[0], {d}, keep); }, {t}, 0, 0);
        expect_same_on_cuda(
            [d, keep](const std::vector<Tensor>& in) { return any(in[0], {d}, keep); }, {t}, 0, 0);
      }
    }
    for (bool keep : {false, true})
      expect_same_on_cuda(
          [keep](const std::vector<Tensor>& in) { return argmax(in[0], std::nullopt, keep); }, {t},
          0, 0);
    expect_same_on_cuda([](const std::vector<Tensor>& in) { return all(in[0]); }, {t}, 0, 0);
    expect_same_on_cuda([](const std::vector<Tensor>& in) { return any(in[0]); }, {t}, 0, 0);
  }
  // An empty fold: all is true and any false, as on the host.
  expect_same_on_cuda([](const std::vector<Tensor>& in) { return all(in[0], {1}); },
                      {zeros({3, 0})}, 0, 0);
  expect_same_on_cuda([](const std::vector<Tensor>& in) { return any(in[0], {1}); },
                      {zeros({3, 0})}, 0, 0);
  expect_same_on_cuda(
      [](const std::vector<Tensor>& in) { return slice_scatter(in[0], in[1], 1, 1, 5, 2); },
      {x, x.narrow(1, 0, 2) * 3}, 0, 0);
  expect_same_on_cuda(
      [](const std::vector<Tensor>& in) {
        return as_strided_scatter(in[0], in[1], {4, 5}, {9, 2}, 3) +
               as_strided_scatter(in[0].transpose(0, 2), in[1], {4, 5}, {1, 6}, 2).transpose(0, 2);
      },
      {x, testing::random_tensor({4, 5})}, 0, 0);
  // dropout draws from the process generator: one seed, the CPU's mask.
  for (const DType dt : {kFloat32, kFloat64}) {
    manual_seed(7);
    const Tensor expected = dropout(x.to(dt), 0.3, true);
    manual_seed(7);
    const Tensor got = dropout(x.to(dt).to(kCUDA), 0.3, true);
    EXPECT_EQ(testing::values(got.to(kCPU)), testing::values(expected));
  }
}

// dropout on a device draws on the host and sends only the keep mask: a byte an element.
TEST(Cuda, DropoutUploadsItsMaskNotItsDraws) {
  KILN_REQUIRE_GPU();
  const Tensor x = testing::random_tensor({64, 64}).to(kCUDA);
  for (bool grad : {false, true}) {
    const Tensor in = grad ? x.detach().requires_grad_(true) : x;
    const detail::cuda::TransferCounts before = detail::cuda::transfer_counts();
    const Tensor y = dropout(in, 0.5, true);  // recorded: what it sent is the mask alone
    const detail::cuda::TransferCounts after = detail::cuda::transfer_counts();
    EXPECT_EQ(y.device(), kCUDA);
    EXPECT_LE(after.host_to_device - before.host_to_device, 64 * 64 + 64) << "grad " << grad;
  }
}

// The gradients of the composed ops on the device are the CPU's.
TEST(Cuda, ComposedOpsGiveTheCpuGradients) {
  KILN_REQUIRE_GPU();
  const Tensor x = testing::random_tensor({6, 5, 9}, kFloat64),
               w = testing::random_tensor({9}, kFloat64),
               target = testing::random_tensor({6, 9}, kInt64, 0, 5);
  auto grads_on = [&](Device dev) {
    Tensor xd = x.to(dev).detach().requires_grad_(true),
           wd = w.to(dev).detach().requires_grad_(true);
    manual_seed(3);
    Tensor loss = cross_entropy(dropout(layer_norm(xd, {9}, wd), 0.25, true), target.to(dev)) +
                  mse_loss(xd.select(1, 0), xd.select(1, 1) * 0.5) + std::get<0>(max(xd, 2)).sum() +
                  slice_scatter(xd, xd.narrow(2, 0, 3) * 2, 2, 4, 7).sum() +
                  (as_strided(xd, {4, 5}, {3, 1}, 2) * 3).sum() +
                  (as_strided(xd.transpose(0, 2), {4, 5}, {1, 2}, 1) * 5).sum() +
                  (as_strided(xd, {4, 5}, {1, 1}, 0) * 7).sum();
    loss.backward();
    return std::vector<Tensor>{xd.grad().to(kCPU), wd.grad().to(kCPU)};
  };
  const std::vector<Tensor> expected = grads_on(kCPU), got = grads_on(kCUDA);
  for (size_t k = 0; k < expected.size(); ++k)
    testing::expect_close(got[k], testing::values(expected[k]), expected[k].sizes(), kFloat64,
                          1e-10, 1e-12);
}

TEST(Cuda, MatrixProductsGoThroughCublas) {
  KILN_REQUIRE_GPU();
  for (DType dt : {kFloat32, kFloat64}) {
    const double tol = dt == kFloat32 ? 1e-4 : 1e-12;
    const Tensor a = testing::random_tensor({17, 31}, dt), b = testing::random_tensor({31, 9}, dt);
    expect_same_on_cuda([](const std::vector<Tensor>& in) { return in[0].matmul(in[1]); }, {a, b},
                        tol, tol);
    expect_same_on_cuda([](const std::vector<Tensor>& in) { return in[1].t().matmul(in[0].t()); },
                        {a, b}, tol, tol);
    const Tensor p = testing::random_tensor({4, 5, 6}, dt),
                 q = testing::random_tensor({4, 6, 3}, dt);
    expect_same_on_cuda([](const std::vector<Tensor>& in) { return bmm(in[0], in[1]); }, {p, q},
                        tol, tol);
    const Tensor bias = testing::random_tensor({9}, dt);
    expect_same_on_cuda(
        [](const std::vector<Tensor>& in) { return addmm(in[2], in[0], in[1], 1, 1); },
        {a, b, bias}, tol, tol);
  }
}

TEST(Cuda, AutogradGivesTheCpuGradients) {
  KILN_REQUIRE_GPU();
  const Tensor x = testing::random_tensor({8, 16}),
               w = testing::random_tensor({16, 4}, kFloat32, -1, 1);
  auto grads_on = [&](Device d) {
    Tensor xd = x.to(d), wd = w.to(d).detach().requires_grad_(true);
    Tensor loss = (tanh(xd.matmul(wd)) * 2).sum();
    loss.backward();
    return wd.grad().to(kCPU);
  };
  const Tensor expected = grads_on(kCPU);
  testing::expect_close(grads_on(kCUDA), testing::values(expected), expected.sizes(), kFloat32,
                        1e-4, 1e-5);
}

TEST(Cuda, TracedFunctionsReplayOnTheDevice) {
  KILN_REQUIRE_GPU();
  auto step = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{softmax(in[0].matmul(in[1]) + 1, 1)};
  };
  const Tensor a = testing::random_tensor({32, 64}).to(kCUDA),
               b = testing::random_tensor({64, 16}).to(kCUDA);
  jit::Function f = jit::trace(step, {a, b});
  for (int i = 0; i < 3; ++i) {
    const Tensor x = testing::random_tensor({32, 64}).to(kCUDA);
    const Tensor expected = step({x.to(kCPU), b.to(kCPU)})[0];
    const Tensor got = f({x, b})[0];
    EXPECT_EQ(got.device(), kCUDA);
    testing::expect_close(got.to(kCPU), testing::values(expected), expected.sizes(), kFloat32, 1e-4,
                          1e-6);
  }
}

// A traced function on device tensors differentiates there: its outputs' gradients, and the zeros
// that stand for an output without one, live on the outputs' device.
TEST(Cuda, TracedFunctionsDifferentiateOnTheDevice) {
  KILN_REQUIRE_GPU();
  const Tensor x = testing::random_tensor({4, 6}).to(kCUDA);
  const Tensor w = testing::random_tensor({6, 8}).to(kCUDA).requires_grad_(true);
  auto fn = [](const std::vector<Tensor>& in) {
    std::vector<Tensor> g = in[0].matmul(in[1]).chunk(2, 1);
    return std::vector<Tensor>{sigmoid(g[0]) * tanh(g[1]), tanh(g[1])};
  };
  jit::Function f = jit::trace(fn, {x, w});
  for (bool both : {true, false}) {
    auto loss = [&](const std::vector<Tensor>& out) {
      return both ? out[0].sum() + out[1].sum() : out[0].sum();
    };
    const Tensor expected = autograd::grad({loss(fn({x, w}))}, {w})[0].to(kCPU);
    const Tensor got = autograd::grad({loss(f({x, w}))}, {w})[0];
    EXPECT_EQ(got.device(), kCUDA);
    testing::expect_close(got.to(kCPU), testing::values(expected), expected.sizes(), kFloat32, 1e-5,
                          1e-6);
  }
}

// A model moved to the device trains as on the host: eager, with KILN_LAZY=0, and as a traced step
// whose parameter updates are written back on the device.
TEST(Cuda, TrainingOnTheDeviceFollowsTheHost) {
  KILN_REQUIRE_GPU();
  auto make_model = [] {
    manual_seed(7);
    return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(6, 16), std::make_shared<nn::Tanh>(),
        std::make_shared<nn::Linear>(16, 3)});
  };
  const Tensor x = testing::random_tensor({32, 6}), target = randint(3, {32});
  auto losses = [&](Device d, bool traced, bool lazy) {
    LazyGuard mode(lazy);
    auto model = make_model();
    model->to(d);
    optim::Adam opt(model->parameters(), optim::AdamOptions{1e-2});
    const Tensor xd = x.to(d), td = target.to(d);
    auto step = [&](const std::vector<Tensor>& in) {
      opt.zero_grad();
      Tensor loss = cross_entropy(model->forward(in[0]), in[1]);
      loss.backward();
      opt.step();
      return std::vector<Tensor>{loss};
    };
    jit::Function f;
    if (traced) f = jit::trace(step, {xd, td});
    std::vector<double> out;
    for (int i = 0; i < 5; ++i) {
      const Tensor loss = traced ? f({xd, td})[0] : step({xd, td})[0];
      EXPECT_EQ(loss.device(), d);
      out.push_back(loss.item<double>());
    }
    for (const Tensor& p : model->parameters()) EXPECT_EQ(p.device(), d);
    return out;
  };
  const std::vector<double> expected = losses(kCPU, false, true);
  for (const auto& [traced, lazy] : {std::pair{false, true}, {false, false}, {true, true}}) {
    const std::vector<double> got = losses(kCUDA, traced, lazy);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], expected[i], 1e-4 * (1 + std::abs(expected[i])))
          << "step " << i << (traced ? " traced" : "") << (lazy ? "" : " KILN_LAZY=0");
  }
}

// A traced function's round trip through the host is removed; the profile counts what is copied.
TEST(Cuda, TracedRoundTripsAreRemovedAndTransfersCounted) {
  KILN_REQUIRE_GPU();
  const Tensor a = testing::random_tensor({64, 64}).to(kCUDA);
  auto fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{exp(in[0].to(kCPU).to(kCUDA)) * 2};
  };
  jit::Function f = jit::trace(fn, {a});
  profiler::set_enabled(true);
  profiler::reset();
  const Tensor got = f({a})[0];
  got.to(kCPU);  // one download of 16 KiB
  const std::string report = profiler::report();
  profiler::set_enabled(false);
  testing::expect_close(got.to(kCPU), testing::values(exp(a.to(kCPU)) * 2), {64, 64}, kFloat32,
                        1e-5, 1e-6);
  int64_t round_trips = 0;
  for (const jit::PassProfileEntry& e : jit::pass_profile())
    if (e.pass == "transfers") round_trips += e.rewrites.count("round trip removed");
  EXPECT_GE(round_trips, 1);
  EXPECT_NE(report.find("host<->device:"), std::string::npos) << report;
  // Fused, the function is one kernel on the device: nothing goes up, the result comes down once
  // (16 KiB). Unfused (the fake driver's runs), exp and * run through the host.
  if (fuser::fusion_enabled()) {
    EXPECT_NE(report.find("0.000 MB to the device in 0 copies, 0.016 MB to the host in 1 copies"),
              std::string::npos)
        << report;
  }
}

// A traced host GEMM whose product is copied to the device runs on the device (the transfers
// pass moves the copy above it): its factors go up (2 KiB), not its product (16 KiB).
TEST(Cuda, TracedGemmMovesToTheDeviceItsProductIsCopiedTo) {
  KILN_REQUIRE_GPU();
  const Tensor x = testing::random_tensor({64, 4}), w = testing::random_tensor({4, 64});
  auto fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{in[0].mm(in[1]).to(kCUDA)};
  };
  jit::Function f = jit::trace(fn, {x, w});
  const detail::cuda::TransferCounts before = detail::cuda::transfer_counts();
  const Tensor got = f({x, w})[0];
  EXPECT_EQ(got.device(), kCUDA);
  const Tensor host = got.to(kCPU);
  const detail::cuda::TransferCounts after = detail::cuda::transfer_counts();
  testing::expect_close(host, testing::values(x.mm(w)), {64, 64}, kFloat32, 1e-5, 1e-6);
  EXPECT_LE(after.host_to_device - before.host_to_device, 2 * 64 * 4 * 4);
}

// Device values fuse as host ones do: one kernel for an elementwise chain reading a 0-dim host
// tensor (a number), one rows kernel for a softmax written from primitives. (Planning launches
// nothing, so this runs on the fake driver too.)
TEST(Cuda, DeviceGraphsFuseAsHostGraphsDo) {
  KILN_REQUIRE_GPU();
  for (Device d : {kCPU, kCUDA}) {
    const Tensor a = testing::random_tensor({8, 16}).to(d),
                 b = testing::random_tensor({8, 16}).to(d);
    const Tensor c = full({}, 0.5);  // a 0-dim host tensor, not a wrapped number
    const testing::Planned chain = testing::plan_of(
        [](const testing::Inputs& in) {
          return testing::Inputs{sigmoid(in[0]) * tanh(in[1]) + in[2]};
        },
        {a, b, c});
    EXPECT_EQ(chain.plan->num_kernel_steps(), 1u) << d;
    EXPECT_EQ(chain.plan->num_steps(), 1u) << d;
    const testing::Planned soft = testing::plan_of(
        [](const testing::Inputs& in) {
          const Tensor e = exp(in[0] - in[0].amax({1}, true));
          return testing::Inputs{e / e.sum({1}, true)};
        },
        {a});
    EXPECT_EQ(soft.plan->num_kernel_steps(), 1u) << d;
    // An LSTM cell (the passes push the chunk through the GEMMs' sum): one kernel for the gates
    // and the cell beside the two GEMMs; its backward's four gate gradients one kernel writing
    // their cat.
    const int64_t batch = 4, hidden = 6;
    const testing::Inputs cell_in = {testing::random_tensor({batch, 5}).to(d),
                                     testing::random_tensor({batch, hidden}).to(d),
                                     testing::random_tensor({5, 4 * hidden}).to(d),
                                     testing::random_tensor({hidden, 4 * hidden}).to(d),
                                     testing::random_tensor({batch, hidden}).to(d)};
    const testing::Planned cell = testing::plan_of(
        [](const testing::Inputs& in) {
          std::vector<Tensor> g = (in[0].mm(in[2]) + in[1].mm(in[3])).chunk(4, 1);
          Tensor i = sigmoid(g[0]), f = sigmoid(g[1]), c = tanh(g[2]), o = sigmoid(g[3]);
          Tensor c2 = f * in[4] + i * c;
          return testing::Inputs{o * tanh(c2), c2};
        },
        cell_in, /*passes=*/true);
    EXPECT_EQ(cell.plan->num_kernel_steps(), 1u) << d << "\n" << cell.graph->str();
    const testing::Planned gates = testing::plan_of(
        [](const testing::Inputs& x) {
          Tensor i = x[1], f = x[4], g = x[1] * 0.5, o = x[4] * 0.25, dc = x[1] + x[4], c = x[4];
          return testing::Inputs{cat({dc * g * i * (1.0 - i), dc * c * f * (1.0 - f),
                                      dc * i * (1.0 - g * g), tanh(c) * o * (1.0 - o)},
                                     1)};
        },
        cell_in);
    EXPECT_EQ(gates.plan->num_kernel_steps(), 1u) << d;
    EXPECT_EQ(gates.plan->num_steps(), 1u) << d;
  }
}

// The composed nn ops and argmax plan as fused kernels on the device, with nothing through the
// host: layer_norm and mse_loss are one rows kernel each, dropout one elementwise kernel, and
// cross_entropy's mean three: the rows kernel of its terms' sum, the sum of the targets' weights
// (ignored targets weigh nothing) and the division of the two.
TEST(Cuda, ComposedOpsPlanAsFusedKernels) {
  KILN_REQUIRE_GPU();
  const Tensor x = testing::random_tensor({8, 16}).to(kCUDA),
               w = testing::random_tensor({16}).to(kCUDA);
  const Tensor u = testing::random_tensor({8, 16}, kFloat64, 0, 1).to(kCUDA);
  struct Case {
    const char* what;
    std::function<Tensor(const testing::Inputs&)> f;
    size_t kernels;
  };
  const std::vector<Case> cases = {
      {"layer_norm",
       [](const testing::Inputs& in) { return layer_norm(in[0], {16}, in[1], in[1]); }, 1},
      {"mse_loss", [](const testing::Inputs& in) { return mse_loss(in[0], in[0] * 2); }, 1},
      {"argmax", [](const testing::Inputs& in) { return argmax(in[0], 1); }, 1},
      {"all", [](const testing::Inputs& in) { return all(in[0], {0}); }, 1},
      {"cross_entropy",
       [](const testing::Inputs& in) {
         return cross_entropy(in[0], argmax(in[0], 1).detach(), Reduction::Mean);
       },
       3},
  };
  for (const Case& c : cases) {
    const testing::Planned planned = testing::plan_of(
        [&c](const testing::Inputs& in) { return testing::Inputs{c.f(in)}; }, {x, w, u});
    EXPECT_EQ(planned.plan->num_kernel_steps(), c.kernels) << c.what;
    EXPECT_EQ(planned.plan->num_steps(), c.kernels) << c.what;
  }
}

// On the fake driver (tests/fake_cuda), which loads modules but runs no kernel: with fusion on, an
// elementwise group and a rows group are compiled (NVRTC, for the device's sm_90), loaded and
// launched with their arguments, and the launch's failure comes back as a kiln::Error naming the
// kernel, its geometry and the driver's error, with nothing on the host touching device memory.
TEST(Cuda, FusedGroupsReachTheLaunchOnTheFakeDriver) {
  KILN_REQUIRE_GPU();
  if (detail::cuda::device_info(0).name.find("kiln fake") == std::string::npos)
    GTEST_SKIP() << "a real GPU: the fused kernels run in the other tests";
  fuser::FusionGuard fusion(true);
  const Tensor a = testing::random_tensor({8, 16}).to(kCUDA);
  testing::expect_error([&] { (tanh(a * a) + 1).to(kCPU); },
                        {"launching kiln_", "CUDA_ERROR_NOT_SUPPORTED", "cuda:0"});
  // A lone op is a group of one on a device: softmax (rows), a global and a column sum, an add.
  for (const auto& f : std::vector<std::function<Tensor()>>{
           [&] { return softmax(a, 1); }, [&] { return a.sum(); }, [&] { return a.sum({0}); },
           [&] { return a + a; }, [&] { return a.t() * 2; },
           [&] { return index_select(a, 1, arange(3, kCUDA)); },
           [&] { return index_add(a, 0, arange(3, kCUDA), a.narrow(0, 0, 3)); },
           [&] {
             return full({4, 4}, 2.5, kCUDA);
           }})  // a fill by the copy kernel
    testing::expect_error([&] { f().to(kCPU); }, {"launching kiln_", "CUDA_ERROR_NOT_SUPPORTED"});
  EXPECT_EQ(a.to(kCPU).numel(), 128);  // the input is intact
}

#ifdef KILN_HAS_CUDA
// A new kernel first runs its stand-in (tiered compiles, cuda_kernel.h), then the kernel compiled
// in the background: both give the same bits, for a 4-wide flat kernel (whose stand-in is its
// scalar loop) and a rows kernel (built with --Ofast-compile=min first).
TEST(Cuda, ANewKernelRunsAStandInThenItsCompiledBinaryWithTheSameBits) {
  KILN_REQUIRE_GPU();
  if (detail::cuda::device_info(0).name.find("kiln fake") != std::string::npos)
    GTEST_SKIP() << "the fake driver runs no generated kernel";
  fuser::FusionGuard fusion(true);
  fuser::cuda::set_cuda_tiered_compile(true);
  // A structure no earlier run compiled (the test kernel cache outlives a run).
  const auto structure = static_cast<uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count() ^ (int64_t{getpid()} << 32));
  auto chain = [&](Tensor x) {
    for (int k = 0; k < 16; ++k) x = (structure >> k) & 1 ? -x : tanh(x);
    return x;
  };
  const Tensor x = testing::random_tensor({64, 1024});
  const Tensor dx = x.to(kCUDA);
  for (const auto& f : std::vector<std::function<Tensor(const Tensor&)>>{
           [&](const Tensor& t) { return chain(t) * 2; },
           [&](const Tensor& t) { return softmax(chain(t), 1); }}) {
    const fuser::cuda::CudaCompileStats before = fuser::cuda::cuda_compile_stats();
    const Tensor first = f(dx).to(kCPU);
    fuser::cuda::wait_for_background_compiles();
    const Tensor second = f(dx).to(kCPU);
    const fuser::cuda::CudaCompileStats after = fuser::cuda::cuda_compile_stats();
    EXPECT_EQ(after.stand_ins - before.stand_ins, 1);
    EXPECT_EQ(after.upgrades - before.upgrades, 1);
    EXPECT_EQ(testing::values(first), testing::values(second));
    const Tensor expected = f(x);
    testing::expect_close(second, testing::values(expected), expected.sizes(), kFloat32, 1e-5,
                          1e-6);
  }
}
#endif

TEST(Cuda, MixingDevicesRaisesNamingBoth) {
  KILN_REQUIRE_GPU();
  const Tensor a = ones({2, 2}), b = ones({2, 2}, kCUDA);
  testing::expect_error([&] { (a + b).to(kCPU); }, {"add", "cpu", "cuda:0"});
  // A 0-dim CPU tensor joins a device tensor, as a number does.
  EXPECT_EQ((b * full({}, 3.0)).sum().item<float>(), 12.0f);
  // The ops composed on a device check their operands first, naming the op.
  testing::expect_error([&] { layer_norm(b, {2}, ones({2})).to(kCPU); },
                        {"layer_norm", "weight", "cpu", "cuda:0"});
  testing::expect_error(
      [&] { cross_entropy(b, full({2}, 5, TensorOptions(kInt64).device(kCUDA))).to(kCPU); },
      {"cross_entropy", "target 5", "2 classes"});
  testing::expect_error([&] { argmax(b, 2).to(kCPU); }, {"argmax", "dim"});
  EXPECT_EQ(b.to(kCPU).sum().item<float>(), 4.0f);  // the input is intact
}

TEST(Cuda, TheAllocatorCachesAndReleases) {
  KILN_REQUIRE_GPU();
  cuda::empty_cache();
  const cuda::MemoryStats start = cuda::memory_stats();
  {
    Tensor t = empty({1 << 20}, kCUDA);  // 4 MiB
    EXPECT_GE(cuda::memory_stats().allocated_bytes, start.allocated_bytes + (4u << 20));
  }
  const cuda::MemoryStats freed = cuda::memory_stats();
  EXPECT_EQ(freed.allocated_bytes, start.allocated_bytes);
  EXPECT_GE(freed.reserved_bytes, start.reserved_bytes + (4u << 20)) << "kept in the cache";
  {
    Tensor t = empty({1 << 20}, kCUDA);  // served from the cache
    EXPECT_GT(cuda::memory_stats().cache_hits, freed.cache_hits);
  }
  cuda::empty_cache();
  EXPECT_LT(cuda::memory_stats().reserved_bytes, freed.reserved_bytes);
}

// A classifier's training step (cross entropy, backward, the optimizer's update) traced on (x, y).
jit::Function traced_training_step(nn::Module& model, optim::Optimizer& opt, const Tensor& x,
                                   const Tensor& y) {
  return jit::trace(
      [&model, &opt](const std::vector<Tensor>& in) {
        opt.zero_grad();
        Tensor loss = cross_entropy(model.forward(in[0]), in[1]);
        loss.backward();
        opt.step();
        return std::vector<Tensor>{loss.detach()};
      },
      {x, y});
}

// A traced training step whose parameters and batch live on the device moves nothing between host
// and device once it runs steadily: no upload (hyperparameters and step counts are kernel
// arguments), no download (the loss stays on the device until read).
TEST(Cuda, ATracedTrainingStepMovesNothingBetweenHostAndDevice) {
  KILN_REQUIRE_GPU();
  if (!fuser::fusion_enabled())
    GTEST_SKIP() << "unfused (the fake driver's runs), device ops go through the host";
  manual_seed(3);
  nn::Sequential model({std::make_shared<nn::Linear>(12, 32), std::make_shared<nn::ReLU>(),
                        std::make_shared<nn::Linear>(32, 5)});
  model.to(kCUDA);
  optim::Adam adam(model.parameters(), optim::AdamOptions{1e-2});
  const Tensor x = testing::random_tensor({16, 12}).to(kCUDA), y = randint(5, {16}).to(kCUDA);
  jit::Function step = traced_training_step(model, adam, x, y);
  const float first = step({x, y})[0].item<float>();
  for (int i = 0; i < 2; ++i) eval(step({x, y}));
  profiler::set_enabled(true);
  profiler::reset();
  const detail::cuda::TransferCounts before = detail::cuda::transfer_counts();
  Tensor loss;
  for (int i = 0; i < 5; ++i) loss = step({x, y})[0];
  eval(loss);
  const detail::cuda::TransferCounts after = detail::cuda::transfer_counts();
  const std::string report = profiler::report();
  profiler::set_enabled(false);
  EXPECT_EQ(after.host_to_device - before.host_to_device, 0) << report;
  EXPECT_EQ(after.device_to_host - before.device_to_host, 0) << report;
  // KILN_PROFILE prints its host<->device line only when something moved.
  EXPECT_EQ(report.find("host<->device:"), std::string::npos) << report;
  EXPECT_LT(loss.item<float>(), first) << "the steps trained";
}

#ifdef KILN_HAS_CUDA
// The workload of ASecondProcessLoadsEveryKernelFromDisk (in its child processes only): fused
// elementwise, rows and reduction kernels and a traced training step; prints the compile counts.
TEST(Cuda, KernelCacheChildWorkload) {
  if (!std::getenv("CUDA_CACHE_TEST_CHILD"))
    GTEST_SKIP() << "run by ASecondProcessLoadsEveryKernelFromDisk";
  auto attempt = [](const char* what, const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {  // the fake driver runs no kernel; NVRTC has compiled it first
      std::cerr << "error in " << what << ": " << e.what() << "\n";
    }
  };
  const Tensor a = testing::random_tensor({64, 48}).to(kCUDA);
  attempt("elementwise", [&] { eval(tanh(a * a) + 1); });
  attempt("softmax", [&] { eval(softmax(a, 1)); });
  attempt("sums", [&] { eval({a.sum(), a.sum({0})}); });
  attempt("training step", [&] {
    manual_seed(1);
    nn::Linear layer(48, 4);
    layer.to(kCUDA);
    optim::SGD sgd(layer.parameters(), optim::SGDOptions{0.1});
    const Tensor y = randint(4, {64}).to(kCUDA);
    eval(traced_training_step(layer, sgd, a, y)({a, y}));
  });
  fuser::cuda::wait_for_background_compiles();  // tiered compiles (cuda_kernel.h)
  const fuser::cuda::CudaCompileStats stats = fuser::cuda::cuda_compile_stats();
  std::cerr << "nvrtc compiles " << stats.compiles << " disk hits " << stats.disk_hits
            << " stand-ins " << stats.stand_ins << "\n";
}

// A second process finds every kernel the first one compiled in the disk cache: no NVRTC call.
TEST(Cuda, ASecondProcessLoadsEveryKernelFromDisk) {
  KILN_REQUIRE_GPU();
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/kiln_cuda_cache_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto run_child = [&] {
    const std::string log = dir + "/child.log";
    // Not sharded (GTEST_* of a sharded parent would pick no test in the child).
    const std::string command =
        "env -u GTEST_TOTAL_SHARDS -u GTEST_SHARD_INDEX KILN_CACHE_DIR=" + dir +
        "/cache KILN_FUSE=1 CUDA_CACHE_TEST_CHILD=1 " +
        fs::read_symlink("/proc/self/exe").string() +
        " --gtest_filter=Cuda.KernelCacheChildWorkload > " + log + " 2>&1";
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    std::ifstream in(log);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  auto counts = [](const std::string& log) {
    const size_t at = log.find("nvrtc compiles ");
    EXPECT_NE(at, std::string::npos) << log;
    int64_t compiles = -1, hits = -1, stand_ins = -1;
    if (at != std::string::npos)
      std::sscanf(log.c_str() + at, "nvrtc compiles %ld disk hits %ld stand-ins %ld", &compiles,
                  &hits, &stand_ins);
    return std::tuple{compiles, hits, stand_ins};
  };
  const std::string first_log = run_child();
  const auto [compiled, first_hits, stand_ins] = counts(first_log);
  EXPECT_GE(compiled, 4) << first_log;
  EXPECT_EQ(first_hits, 0) << first_log;
  const std::string second_log = run_child();
  const auto [recompiled, hits, second_stand_ins] = counts(second_log);
  EXPECT_EQ(recompiled, 0) << second_log;
  EXPECT_EQ(second_stand_ins, 0) << second_log;
  // The first process compiled each binary the second needs, and a stand-in before some of them.
  EXPECT_EQ(hits, compiled - stand_ins) << first_log << second_log;
  if (detail::cuda::device_info(0).name.find("kiln fake") == std::string::npos) {
    EXPECT_EQ(second_log.find("error in "), std::string::npos) << second_log;
  }
  fs::remove_all(dir);
}
#endif

}  // namespace
}  // namespace kiln
