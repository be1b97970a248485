// Convolutions and pools on CUDA (lib/ops/conv_cuda.cpp), and the convolution chooser's choices
// kept on disk (lib/ops/conv.cpp).
//
// The kernels' CUDA C compiles with NVRTC for sm_90 always. The ops run on a GPU, or on the fake
// driver (tests/fake_cuda), whose launches run the same kernel sources compiled as host C++
// (KILN_HOST_LAUNCH) and whose cuBLAS is a plain loop: either way every op on the device is
// compared with the CPU's, on random geometries (strides, padding, dilation, groups, one image,
// 1x1 kernels, non-contiguous inputs) in float32 and float64. Without either the device tests
// skip, naming the reason.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>

#include "fuser/cache.h"
#include "kiln/kiln.h"
#include "lib/cuda_driver.h"
#include "lib/ops/conv.h"
#include "lib/ops/conv_cuda.h"
#include "lib/tensor_impl.h"
#include "resnet.h"
#include "tests/testing.h"

#ifdef KILN_HAS_CUDA
#include "fuser/codegen/cuda/cuda_codegen.h"
#include "fuser/codegen/cuda/nvrtc.h"
#endif

namespace kiln {
namespace {

namespace fs = std::filesystem;
using detail::ConvAlgo;

bool on_fake_driver() {
  return detail::cuda::device_info(0).name.find("kiln fake") != std::string::npos;
}

// On the fake driver: builds every kernel source for the host once and registers each with the
// fake driver, so that launches run it. "" when the device can run the kernels, else why not.
std::string prepare_device() {
  if (!cuda::is_available())
    return "no usable CUDA device (" + detail::cuda::unavailable_reason() + ")";
  if (!on_fake_driver()) return "";
  static const std::string why = []() -> std::string {
    if (std::system("c++ --version > /dev/null 2>&1") != 0)
      return "the fake driver runs kernels built by the host's C++ compiler, and there is no c++";
    const std::string dir = ::testing::TempDir() + "/kiln_cuda_conv_" + std::to_string(getpid());
    fs::create_directories(dir);
    std::string files;
    for (const auto& [name, source] : detail::cuda_conv::kernel_sources()) {
      std::ofstream(dir + "/" + name + ".cpp") << source;
      files += " " + dir + "/" + name + ".cpp";
    }
    const std::string lib = dir + "/kernels.so";
    if (std::system(("c++ -std=c++17 -O1 -ffp-contract=off -DKILN_HOST_LAUNCH -shared -fPIC -o " +
                     lib + files + " > " + dir + "/log.txt 2>&1")
                        .c_str()) != 0)
      return "the host build of the kernels failed: see " + dir + "/log.txt";
    void* kernels = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    void* driver = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY);
    auto* reg = driver ? reinterpret_cast<void (*)(const char*, void (*)(void**))>(
                             dlsym(driver, "kiln_fake_register_kernel"))
                       : nullptr;
    if (!kernels || !reg)
      return std::string("cannot load the host kernels or the fake driver's hook");
    for (const auto& [name, source] : detail::cuda_conv::kernel_sources()) {
      auto* fn = reinterpret_cast<void (*)(void**)>(dlsym(kernels, (name + "_host").c_str()));
      if (!fn) return "no " + name + "_host in the host build";
      reg(name.c_str(), fn);
    }
    return "";
  }();
  return why;
}

#define KILN_REQUIRE_DEVICE()                                 \
  if (const std::string why = prepare_device(); !why.empty()) \
  GTEST_SKIP() << why << ": CUDA convolution checks skipped; run tools/gpu-check on a GPU machine"

const Device kDev = kCUDA;

// Forces a convolution algorithm for a scope (the chooser measures again after it).
struct ForcedAlgo {
  explicit ForcedAlgo(ConvAlgo a) { detail::set_conv_algo(a); }
  ~ForcedAlgo() { detail::set_conv_algo(ConvAlgo::Auto); }
};

double tol(DType t) {
  return t == kFloat64 ? 1e-10 : 2e-4;
}

// Device result `d` equals CPU result `c` within the dtype's tolerance (relative to the values'
// scale: sums of many products).
void expect_matches(const Tensor& d, const Tensor& c, const std::string& what) {
  ASSERT_EQ(d.device(), kDev) << what;
  ASSERT_EQ(d.sizes(), c.sizes()) << what;
  ASSERT_EQ(d.dtype(), c.dtype()) << what;
  const std::vector<double> dv = testing::values(d.to(kCPU)), cv = testing::values(c);
  double scale = 1;
  for (double v : cv) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < dv.size(); ++i)
    ASSERT_NEAR(dv[i], cv[i], tol(c.dtype()) * scale) << what << " at " << i;
}

struct Geometry {
  int64_t N, C, H, W, O, kH, kW, groups;
  Shape stride, padding, dilation;
  std::string str() const {
    std::ostringstream os;
    os << "input [" << N << ", " << C << ", " << H << ", " << W << "] weight [" << O << ", "
       << C / groups << ", " << kH << ", " << kW << "] stride " << stride[0] << "x" << stride[1]
       << " padding " << padding[0] << "x" << padding[1] << " dilation " << dilation[0] << "x"
       << dilation[1] << " groups " << groups;
    return os.str();
  }
};

// A random geometry whose dilated kernel fits the padded input; every fourth one has one image,
// every third 1x1 kernels.
Geometry random_geometry(int i) {
  std::mt19937_64& r = testing::rng();
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(r);
  };
  Geometry g{};
  g.groups = pick(1, 3);
  g.N = i % 4 == 0 ? 1 : pick(2, 3);
  g.C = g.groups * pick(1, 3);
  g.O = g.groups * pick(1, 3);
  g.kH = i % 3 == 0 ? 1 : pick(1, 3);
  g.kW = i % 3 == 0 ? 1 : pick(1, 3);
  g.stride = {pick(1, 2), pick(1, 3)};
  g.padding = {pick(0, 2), pick(0, 1)};
  g.dilation = {pick(1, 2), pick(1, 2)};
  g.H = std::max<int64_t>(pick(3, 8), g.dilation[0] * (g.kH - 1) + 1);
  g.W = std::max<int64_t>(pick(3, 8), g.dilation[1] * (g.kW - 1) + 1);
  return g;
}

// ------------------------------------------------------------------------ NVRTC, no GPU needed

#ifdef KILN_HAS_CUDA
TEST(CudaConv, KernelsCompileWithNvrtcForSm90) {
  const auto sources = detail::cuda_conv::kernel_sources();
  EXPECT_EQ(sources.size(), 18u);  // 9 kernels, float32 and float64
  for (const auto& [name, source] : sources) {
    const fuser::cuda::CudaCompiled ptx = fuser::cuda::nvrtc_compile(
        source, name, 90, fuser::cuda::CudaOutput::kPtx, fuser::cuda::cuda_compile_options());
    EXPECT_EQ(ptx.log, "") << name;
    EXPECT_NE(ptx.code.find(".entry " + name), std::string::npos) << name;
  }
}
#else
TEST(CudaConv, NeedsTheCudaToolkit) {
  GTEST_SKIP() << "kiln was built without the CUDA toolkit (no NVRTC): CUDA kernels not compiled";
}
#endif

// ------------------------------------------------------------------- the ops on the device

// conv2d (with a bias) and its two gradient passes on geometry g match the CPU's, each run by
// `algo`. `layouts` picks the device operands' layouts: bit 0, x and gy as transposed views
// (channel planes that are not rows); bit 1, w as a transposed view; bit 2, gy as a view into a
// larger tensor whose channel planes are rows, channels and images further apart than the plane
// and the batch entry.
void expect_passes_match(const Geometry& g, DType dt, int layouts, ConvAlgo algo) {
  const std::string what = g.str() + " " + dtype_name(dt) + " layouts " + std::to_string(layouts);
  SCOPED_TRACE(what);
  const Tensor x = testing::random_tensor({g.N, g.C, g.H, g.W}, dt);
  const Tensor w = testing::random_tensor({g.O, g.C / g.groups, g.kH, g.kW}, dt);
  const Tensor b = testing::random_tensor({g.O}, dt);
  Tensor xd = x.to(kDev);
  if (layouts & 1) {  // the same values through a transposed view on the device
    xd = x.transpose(2, 3).contiguous().to(kDev).transpose(2, 3);
    EXPECT_FALSE(xd.is_contiguous());
  }
  const Tensor y = conv2d(x, w, b, g.stride, g.padding, g.dilation, g.groups);
  Tensor wd = w.to(kDev);
  if (layouts & 2) wd = w.transpose(0, 1).contiguous().to(kDev).transpose(0, 1);
  expect_matches(conv2d(xd, wd, b.to(kDev), g.stride, g.padding, g.dilation, g.groups), y,
                 "conv2d " + what);
  EXPECT_EQ(detail::last_conv_algo(), algo);
  Tensor gy = testing::random_tensor(y.sizes(), dt);
  Tensor gyd = gy.to(kDev);
  if (layouts & 1) {
    gyd = gy.transpose(1, 3).contiguous().to(kDev).transpose(1, 3);
  } else if (layouts & 4) {  // planes of L at a channel stride of L + 3 and an image stride beyond
    const int64_t N = y.size(0), O = y.size(1), L = y.size(2) * y.size(3), ld = L + 3;
    const Tensor big = testing::random_tensor({N + 1, O + 1, ld}, dt);
    const Shape sizes = y.sizes(), strides{(O + 1) * ld, ld, y.size(3), 1};
    gy = as_strided(big, sizes, strides, ld).contiguous();
    gyd = as_strided(big.to(kDev), sizes, strides, ld);
    EXPECT_EQ(gyd.strides(), strides);
  }
  const Shape xs{g.N, g.C, g.H, g.W}, ws = w.sizes();
  expect_matches(conv2d_grad_input(gyd, wd, xs, g.stride, g.padding, g.dilation, g.groups),
                 conv2d_grad_input(gy, w, xs, g.stride, g.padding, g.dilation, g.groups),
                 "conv2d_grad_input " + what);
  EXPECT_EQ(detail::last_conv_algo(), algo);
  expect_matches(conv2d_grad_weight(gyd, xd, ws, g.stride, g.padding, g.dilation, g.groups),
                 conv2d_grad_weight(gy, x, ws, g.stride, g.padding, g.dilation, g.groups),
                 "conv2d_grad_weight " + what);
  EXPECT_EQ(detail::last_conv_algo(), algo);
}

// conv2d and its two gradient passes on random geometries match the CPU's, in both dtypes, with
// the input and output gradient given as non-contiguous views every other time.
TEST(CudaConv, PassesMatchTheCpuOnRandomGeometries) {
  KILN_REQUIRE_DEVICE();
  LazyGuard eager(false);
  ForcedAlgo im2col(ConvAlgo::Im2col);
  for (int i = 0; i < 16; ++i) {
    const Geometry g = random_geometry(i);
    for (DType dt : {kFloat32, kFloat64}) expect_passes_match(g, dt, i % 8, ConvAlgo::Im2col);
  }
}

// Restores the default chunk budgets of both layouts when it goes.
struct ChunkBudgets {
  ChunkBudgets(int64_t grouped, int64_t per_image) {
    detail::cuda_conv::set_max_cols_bytes(grouped);
    detail::cuda_conv::set_l2_chunk_bytes(per_image);
  }
  ~ChunkBudgets() {
    detail::cuda_conv::set_max_cols_bytes(int64_t{256} << 20);
    detail::cuda_conv::set_l2_chunk_bytes(0);
  }
};

// The bytes of one image's columns.
int64_t column_bytes(const Geometry& g, DType dt) {
  auto out = [](int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
    return (in + 2 * p - d * (k - 1) - 1) / s + 1;
  };
  return g.C * g.kH * g.kW * out(g.H, g.kH, g.stride[0], g.padding[0], g.dilation[0]) *
         out(g.W, g.kW, g.stride[1], g.padding[1], g.dilation[1]) *
         static_cast<int64_t>(element_size(dt));
}

// im2col_l2 (per-image GEMMs on NCHW images, in chunks sized to the L2) computes the CPU's passes
// on random geometries (groups, strides, padding, dilation, one image, 1x1 kernels, every operand
// layout) in both dtypes: with the fake device's L2 (chunks of one to a few images), and with
// budgets of one image and of two and a half (5 images in chunks of 2, 2 and 1).
TEST(CudaConv, Im2colL2MatchesTheCpuOnRandomGeometries) {
  KILN_REQUIRE_DEVICE();
  LazyGuard eager(false);
  ForcedAlgo l2(ConvAlgo::Im2colL2);
  for (int budget = 0; budget < 3; ++budget) {
    for (int i = 0; i < 12; ++i) {
      Geometry g = random_geometry(i);
      if (i % 4 != 0) g.N = 5;
      for (DType dt : {kFloat32, kFloat64}) {
        const int64_t bytes = budget == 0 ? 0 : budget == 1 ? 1 : column_bytes(g, dt) * 5 / 2;
        ChunkBudgets chunks(int64_t{256} << 20, bytes);
        SCOPED_TRACE("budget " + std::to_string(bytes));
        expect_passes_match(g, dt, i % 8, ConvAlgo::Im2colL2);
      }
    }
  }
}

// A batch whose column matrix passes the budget runs in chunks of images (the weight gradient
// summing theirs), computing what the CPU does.
TEST(CudaConv, LargeBatchesRunInChunks) {
  KILN_REQUIRE_DEVICE();
  LazyGuard eager(false);
  ForcedAlgo im2col(ConvAlgo::Im2col);
  for (int64_t budget : {int64_t{1}, int64_t{3000}}) {  // one image a chunk; a few
    ChunkBudgets chunks(budget, 0);
    for (int i = 1; i < 4; ++i) {
      Geometry g = random_geometry(i);
      g.N = 5;
      const std::string what = g.str() + " budget " + std::to_string(budget);
      SCOPED_TRACE(what);
      const Tensor x = testing::random_tensor({g.N, g.C, g.H, g.W}, kFloat64);
      const Tensor w = testing::random_tensor({g.O, g.C / g.groups, g.kH, g.kW}, kFloat64);
      const Tensor y = conv2d(x, w, {}, g.stride, g.padding, g.dilation, g.groups);
      expect_matches(conv2d(x.to(kDev), w.to(kDev), {}, g.stride, g.padding, g.dilation, g.groups),
                     y, "conv2d " + what);
      const Tensor gy = testing::random_tensor(y.sizes(), kFloat64);
      const Shape xs = x.sizes(), ws = w.sizes();
      expect_matches(
          conv2d_grad_input(gy.to(kDev), w.to(kDev), xs, g.stride, g.padding, g.dilation, g.groups),
          conv2d_grad_input(gy, w, xs, g.stride, g.padding, g.dilation, g.groups),
          "conv2d_grad_input " + what);
      expect_matches(conv2d_grad_weight(gy.to(kDev), x.to(kDev), ws, g.stride, g.padding,
                                        g.dilation, g.groups),
                     conv2d_grad_weight(gy, x, ws, g.stride, g.padding, g.dilation, g.groups),
                     "conv2d_grad_weight " + what);
    }
  }
}

// Kernels kiln launches while `f` runs and its results are computed (device ops record; eval runs
// them).
int64_t launches(const std::function<Tensor()>& f) {
  const int64_t before = detail::cuda::launch_count();
  eval({f()});
  return detail::cuda::launch_count() - before;
}

// The fake device reports an L2 and im2col_l2's chunks hold the images whose columns fit in half
// of it (or in the budget set for tests), one im2col each; im2col's chunks follow their own
// budget (256 MiB).
TEST(CudaConv, Im2colL2ChunksFollowTheDeviceL2) {
  KILN_REQUIRE_DEVICE();
  LazyGuard eager(false);
  using detail::cuda_conv::chunk_images;
  using detail::cuda_conv::Layout;
  const int64_t l2 = detail::cuda::device_info(0).l2_cache_bytes;
  EXPECT_GT(l2, 0);
  if (on_fake_driver()) {
    EXPECT_EQ(l2, 64 << 10);
  }
  // x [7, 4, 6, 6], w [3, 4, 3, 3], padding 1: 36 rows of 36 columns an image.
  const detail::ConvGeom g{7, 4, 6, 6, 3, 3, 3, 6, 6, 1, 1, 1, 1, 1, 1, 1};
  const int64_t per_image = 36 * 36 * 8, step = std::clamp<int64_t>(l2 / 2 / per_image, 1, 7);
  EXPECT_EQ(chunk_images(g, kFloat64, 0, Layout::PerImage), step);
  EXPECT_EQ(chunk_images(g, kFloat32, 0, Layout::PerImage),
            std::clamp<int64_t>(l2 / 2 / (per_image / 2), 1, 7));
  EXPECT_EQ(chunk_images(g, kFloat64, 0, Layout::Grouped), 7);
  {
    ChunkBudgets budgets(per_image, 2 * per_image);
    EXPECT_EQ(chunk_images(g, kFloat64, 0, Layout::PerImage), 2);
    EXPECT_EQ(chunk_images(g, kFloat64, 0, Layout::Grouped), 1);
  }
  const Tensor x = testing::random_tensor({7, 4, 6, 6}, kFloat64).to(kDev),
               w = testing::random_tensor({3, 4, 3, 3}, kFloat64).to(kDev);
  eval({x, w});
  ForcedAlgo l2_algo(ConvAlgo::Im2colL2);
  EXPECT_EQ(launches([&] { return conv2d(x, w, {}, {1}, {1}); }), (7 + step - 1) / step);
}

// im2col_l2 writes the forward's output and reads a contiguous output gradient in place: of the
// kernels, only im2col and col2im run (im2col also regroups: its GEMM's result, and the gradient
// it reads). A gradient whose channel planes are not rows is regrouped first.
TEST(CudaConv, Im2colL2RunsNoRegroupingCopies) {
  KILN_REQUIRE_DEVICE();
  LazyGuard eager(false);
  const Tensor x = testing::random_tensor({3, 4, 6, 6}).to(kDev),
               w = testing::random_tensor({6, 2, 3, 3}).to(kDev),
               gy = testing::random_tensor({3, 6, 4, 4}).to(kDev),
               gyt = testing::random_tensor({3, 4, 4, 6}).to(kDev).transpose(1, 3);
  eval({x, w, gy, gyt});
  const Shape xs = x.sizes();
  auto count = [&](ConvAlgo a, const Tensor& g) {
    ForcedAlgo forced(a);
    return std::make_pair(launches([&] { return conv2d(x, w, {}, {1}, {0}, {1}, 2); }),
                          launches([&] { return conv2d_grad_input(g, w, xs, {1}, {0}, {1}, 2); }));
  };
  EXPECT_EQ(count(ConvAlgo::Im2colL2, gy), std::make_pair(int64_t{1}, int64_t{1}));
  EXPECT_EQ(count(ConvAlgo::Im2col, gy), std::make_pair(int64_t{2}, int64_t{2}));
  EXPECT_EQ(count(ConvAlgo::Im2colL2, gyt).second, 2);
}

// What the chooser stored last (ChooserListsIm2colL2OnTheDeviceOnly's store).
std::string& last_stored_key() {
  static std::string key;
  return key;
}

// The chooser measures im2col_l2 on a device (KILN_LOG=conv names it), never on the CPU, stores
// the choice under a key that names it (so choices stored before it existed are not read back),
// and KILN_CONV_ALGO=im2col_l2 forces it on a device.
TEST(CudaConv, ChooserListsIm2colL2OnTheDeviceOnly) {
  KILN_REQUIRE_DEVICE();
  LazyGuard eager(false);
  const Tensor x = testing::random_tensor({2, 3, 7, 7}), w = testing::random_tensor({4, 3, 3, 3});
  const Tensor y = conv2d(x, w, {}, {1}, {1});
  const detail::ConvChoiceStore saved = detail::conv_choice_store();
  detail::conv_choice_store() = {
      [](const std::string&) { return std::string(); },
      [](const std::string& key, const std::string&) { last_stored_key() = key; }};
  detail::clear_conv_choices();
  setenv("KILN_LOG", "conv", 1);
  ::testing::internal::CaptureStderr();
  conv2d(x, w, {}, {1}, {1});
  const std::string cpu_key = last_stored_key();
  expect_matches(conv2d(x.to(kDev), w.to(kDev), {}, {1}, {1}), y, "chosen");
  const std::string log = ::testing::internal::GetCapturedStderr();
  unsetenv("KILN_LOG");
  detail::conv_choice_store() = saved;
  const std::string device_key = last_stored_key();
  const size_t at = log.find("conv2d cuda:0");
  ASSERT_NE(at, std::string::npos) << log;
  EXPECT_NE(log.find("im2col_l2 ", at), std::string::npos) << log;
  EXPECT_EQ(log.substr(0, at).find("im2col_l2"), std::string::npos) << log;
  EXPECT_NE(device_key.find("im2col_l2"), std::string::npos) << device_key;
  EXPECT_EQ(cpu_key.find("im2col_l2"), std::string::npos) << cpu_key;
  struct Env {
    Env() { setenv("KILN_CONV_ALGO", "im2col_l2", 1); }
    ~Env() { unsetenv("KILN_CONV_ALGO"); }
  } forced;
  expect_matches(conv2d(x.to(kDev), w.to(kDev), {}, {1}, {1}), y, "forced by the environment");
  EXPECT_EQ(detail::last_conv_algo(), ConvAlgo::Im2colL2);
  conv2d(x, w, {}, {1}, {1});
  EXPECT_NE(detail::last_conv_algo(), ConvAlgo::Im2colL2);  // not on the CPU: the preferred runs
}

// The forward pass by the weight-gradient formulation, and the chooser measuring both on the
// device.
TEST(CudaConv, WeightGradFormulationAndChooser) {
  KILN_REQUIRE_DEVICE();
  LazyGuard eager(false);
  const Tensor x = testing::random_tensor({3, 2, 5, 5}), w = testing::random_tensor({4, 2, 5, 5});
  const Tensor y = conv2d(x, w, {}, {1}, {1});
  {
    ForcedAlgo weight_grad(ConvAlgo::WeightGrad);
    expect_matches(conv2d(x.to(kDev), w.to(kDev), {}, {1}, {1}), y, "weight-grad");
    EXPECT_EQ(detail::last_conv_algo(), ConvAlgo::WeightGrad);
  }
  detail::clear_conv_choices();
  detail::set_conv_choices_on_disk(false);
  expect_matches(conv2d(x.to(kDev), w.to(kDev), {}, {1}, {1}), y, "chosen");
  detail::set_conv_choices_on_disk(true);
  EXPECT_NE(detail::last_conv_algo(), ConvAlgo::OneDNN);  // the CPU's library is no candidate
}

// The ops built on the passes: conv1d, conv_transpose2d (with output padding and groups),
// "same" padding, unbatched inputs, gradients through autograd, and lazy mode.
TEST(CudaConv, Conv1dTransposedAutogradAndLazy) {
  KILN_REQUIRE_DEVICE();
  ForcedAlgo im2col(ConvAlgo::Im2col);
  for (DType dt : {kFloat32, kFloat64}) {
    LazyGuard eager(false);
    const Tensor x1 = testing::random_tensor({2, 4, 9}, dt),
                 w1 = testing::random_tensor({6, 2, 3}, dt);
    expect_matches(conv1d(x1.to(kDev), w1.to(kDev), {}, {2}, {1}, {2}, 2),
                   conv1d(x1, w1, {}, {2}, {1}, {2}, 2), "conv1d");
    const Tensor xt = testing::random_tensor({2, 4, 3, 4}, dt),
                 wt = testing::random_tensor({4, 3, 3, 2}, dt);
    const Tensor bt = testing::random_tensor({6}, dt);
    expect_matches(
        conv_transpose2d(xt.to(kDev), wt.to(kDev), bt.to(kDev), {2, 3}, {1, 0}, {1, 2}, 2),
        conv_transpose2d(xt, wt, bt, {2, 3}, {1, 0}, {1, 2}, 2), "conv_transpose2d");
    const Tensor xu = testing::random_tensor({3, 6, 5}, dt),
                 wu = testing::random_tensor({2, 3, 2, 3}, dt);
    expect_matches(conv2d(xu.to(kDev), wu.to(kDev), {}, {1}, PaddingMode("same")),
                   conv2d(xu, wu, {}, {1}, PaddingMode("same")), "unbatched, same padding");
  }
  // Gradients through autograd, on the device as on the CPU.
  LazyGuard eager(false);
  const Tensor x = testing::random_tensor({2, 3, 6, 6}, kFloat64),
               w = testing::random_tensor({4, 3, 3, 3}, kFloat64);
  const Tensor gy = testing::random_tensor({2, 4, 3, 3}, kFloat64);
  Tensor xc = x.clone().requires_grad_(), wc = w.clone().requires_grad_();
  conv2d(xc, wc, {}, {2}, {1}).backward(gy);
  Tensor xd = x.to(kDev).requires_grad_(), wd = w.to(kDev).requires_grad_();
  conv2d(xd, wd, {}, {2}, {1}).backward(gy.to(kDev));
  expect_matches(xd.grad(), xc.grad(), "input gradient");
  expect_matches(wd.grad(), wc.grad(), "weight gradient");
  {
    LazyGuard lazy(true);
    expect_matches(conv2d(x.to(kDev), w.to(kDev), {}, {2}, {1}), conv2d(x, w, {}, {2}, {1}),
                   "lazy");
  }
}

// On the device, a convolution pass and a pool move nothing through the host.
TEST(CudaConv, NothingGoesThroughTheHost) {
  KILN_REQUIRE_DEVICE();
  LazyGuard eager(false);
  ForcedAlgo im2col(ConvAlgo::Im2col);
  const Tensor x = testing::random_tensor({2, 4, 7, 7}).to(kDev);
  const Tensor w = testing::random_tensor({6, 2, 3, 3}).to(kDev);
  const Tensor gy = testing::random_tensor({2, 6, 4, 4}).to(kDev);
  const detail::cuda::TransferCounts before = detail::cuda::transfer_counts();
  const Tensor y = conv2d(x, w, {}, {2}, {1}, {1}, 2);
  const Tensor gx = conv2d_grad_input(gy, w, x.sizes(), {2}, {1}, {1}, 2);
  const Tensor gw = conv2d_grad_weight(gy, x, w.sizes(), {2}, {1}, {1}, 2);
  const auto [m, idx] = max_pool2d_with_indices(x, {3}, {2}, {1});
  const Tensor a = avg_pool2d(x, {2}), aa = adaptive_avg_pool2d(x, {3, 2});
  eval({y, gx, gw, m, idx, a, aa});  // device ops record; this runs them
  cuda::synchronize();
  const detail::cuda::TransferCounts after = detail::cuda::transfer_counts();
  EXPECT_EQ(after.copies_to_host, before.copies_to_host);
  EXPECT_EQ(after.copies_to_device, before.copies_to_device);
}

// max_pool2d (values and indices exactly, NaNs included), avg_pool2d and adaptive_avg_pool2d and
// their gradients match the CPU's on random geometries and layouts.
TEST(CudaConv, PoolsAndTheirGradientsMatchTheCpu) {
  KILN_REQUIRE_DEVICE();
  LazyGuard eager(false);
  std::mt19937_64& r = testing::rng();
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(r);
  };
  for (int i = 0; i < 12; ++i) {
    for (DType dt : {kFloat32, kFloat64}) {
      const Shape k{pick(1, 3), pick(1, 3)}, s{pick(1, 3), pick(1, 2)};
      const Shape p{pick(0, k[0] / 2), pick(0, k[1] / 2)};
      const bool ceil = i % 2 == 1, include_pad = i % 3 != 0;
      Tensor x = testing::random_tensor(
          {pick(1, 2), pick(1, 3), pick(2 * k[0] + 1, 9), pick(2 * k[1] + 1, 9)}, dt);
      if (i == 5) x.view({-1}).narrow(0, 0, 1).fill_(std::nan(""));  // a NaN wins its window
      std::ostringstream os;
      using detail::shape_str;
      os << "input " << shape_str(x.sizes()) << " kernel " << shape_str(k) << " stride "
         << shape_str(s) << " padding " << shape_str(p) << " ceil " << ceil << " include_pad "
         << include_pad << " " << dtype_name(dt);
      const std::string what = os.str();
      SCOPED_TRACE(what);
      Tensor xd = i % 2 == 0 ? x.to(kDev) : x.transpose(2, 3).contiguous().to(kDev).transpose(2, 3);
      const Shape d{1 + i % 2, 1};
      auto [mv, mi] = max_pool2d_with_indices(x, k, s, p, d, ceil);
      auto [dv, di] = max_pool2d_with_indices(xd, k, s, p, d, ceil);
      EXPECT_EQ(testing::values(di.to(kCPU)), testing::values(mi)) << "max_pool2d indices";
      EXPECT_EQ(testing::bytes(dv.to(kCPU)), testing::bytes(mv)) << "max_pool2d values";
      const Shape ao{pick(1, 4), pick(1, 4)};
      auto [amv, ami] = adaptive_max_pool2d_with_indices(x, ao);
      auto [adv, adi] = adaptive_max_pool2d_with_indices(xd, ao);
      EXPECT_EQ(testing::values(adi.to(kCPU)), testing::values(ami))
          << "adaptive_max_pool2d indices";
      EXPECT_EQ(testing::bytes(adv.to(kCPU)), testing::bytes(amv)) << "adaptive_max_pool2d values";
      // Each pool's gradient through autograd, with the same upstream gradient.
      struct Case {
        const char* name;
        std::function<Tensor(const Tensor&)> f;
      };
      const std::vector<Case> cases{
          {"max_pool2d", [&](const Tensor& t) { return max_pool2d(t, k, s, p, d, ceil); }},
          {"avg_pool2d",
           [&](const Tensor& t) { return avg_pool2d(t, k, s, p, ceil, include_pad); }},
          {"adaptive_avg_pool2d", [&](const Tensor& t) { return adaptive_avg_pool2d(t, ao); }},
          {"adaptive_max_pool2d", [&](const Tensor& t) { return adaptive_max_pool2d(t, ao); }}};
      for (const Case& c : cases) {
        if (i == 5) continue;  // NaN gradients compare badly
        Tensor xc = x.clone().requires_grad_();
        Tensor xg = xd.detach().requires_grad_();
        const Tensor yc = c.f(xc), yd = c.f(xg);
        expect_matches(yd, yc, std::string(c.name) + " " + what);
        const Tensor gy = testing::random_tensor(yc.sizes(), dt);
        yc.backward(gy);
        yd.backward(gy.to(kDev));
        expect_matches(xg.grad(), xc.grad(), std::string(c.name) + " gradient " + what);
      }
    }
  }
}

// Each kernel's 64-bit index variant (which runs where an offset could pass 2^31 - 1) computes
// what its 32-bit one does, bit for bit.
TEST(CudaConv, WideIndexVariantsComputeTheSame) {
  KILN_REQUIRE_DEVICE();
  LazyGuard eager(false);
  ForcedAlgo im2col(ConvAlgo::Im2col);
  auto run_all = [](const Geometry& g, const Tensor& x, const Tensor& w, const Tensor& b,
                    const Tensor& gy) {
    const Shape xs{g.N, g.C, g.H, g.W};
    std::vector<Tensor> out{
        conv2d(x, w, b, g.stride, g.padding, g.dilation, g.groups),
        conv2d_grad_input(gy, w, xs, g.stride, g.padding, g.dilation, g.groups),
        conv2d_grad_weight(gy, x, w.sizes(), g.stride, g.padding, g.dilation, g.groups),
        avg_pool2d(x, {2}, {1}, {1}, true, false), adaptive_avg_pool2d(x, {3, 2})};
    const auto [m, i] = max_pool2d_with_indices(x, {2, 3}, {1, 2}, {1});
    out.push_back(m);
    out.push_back(i);
    Tensor xg = x.detach().requires_grad_();
    (max_pool2d(xg, {2}).sum() + avg_pool2d(xg, {3}, {2}, {1}).sum()).backward();
    out.push_back(xg.grad());
    eval(out);  // device ops record: run them while the setting holds
    return out;
  };
  for (int i = 0; i < 4; ++i) {
    const Geometry g = random_geometry(i);
    SCOPED_TRACE(g.str());
    const Tensor x = testing::random_tensor(
                         {g.N, g.C, std::max<int64_t>(g.H, 4), std::max<int64_t>(g.W, 4)}, kFloat64)
                         .transpose(2, 3)
                         .contiguous()
                         .to(kDev)
                         .transpose(2, 3);
    Geometry gx = g;
    gx.H = x.size(2);
    gx.W = x.size(3);
    const Tensor w = testing::random_tensor({g.O, g.C / g.groups, g.kH, g.kW}, kFloat64).to(kDev);
    const Tensor b = testing::random_tensor({g.O}, kFloat64).to(kDev);
    const Tensor y = conv2d(x, w, b, g.stride, g.padding, g.dilation, g.groups);
    const Tensor gy = testing::random_tensor(y.sizes(), kFloat64).to(kDev);
    const std::vector<Tensor> narrow = run_all(gx, x, w, b, gy);
    detail::cuda_conv::set_wide_indices(true);
    const std::vector<Tensor> wide = run_all(gx, x, w, b, gy);
    detail::cuda_conv::set_wide_indices(false);
    for (size_t k = 0; k < narrow.size(); ++k)
      EXPECT_EQ(testing::bytes(wide[k].to(kCPU)), testing::bytes(narrow[k].to(kCPU)))
          << "result " << k;
  }
}

// batch_norm and group_norm are compositions of ops, so they run on the device as they are.
TEST(CudaConv, NormsRunOnTheDevice) {
  KILN_REQUIRE_DEVICE();
  LazyGuard eager(false);
  const Tensor x = testing::random_tensor({3, 4, 5, 5}, kFloat64);
  const Tensor wt = testing::random_tensor({4}, kFloat64),
               bs = testing::random_tensor({4}, kFloat64);
  Tensor rm = zeros({4}, kFloat64), rv = ones({4}, kFloat64);
  Tensor rmd = rm.to(kDev), rvd = rv.to(kDev);
  expect_matches(batch_norm(x.to(kDev), rmd, rvd, wt.to(kDev), bs.to(kDev), true),
                 batch_norm(x, rm, rv, wt, bs, true), "batch_norm");
  expect_matches(rmd, rm, "running_mean");
  expect_matches(group_norm(x.to(kDev), 2, wt.to(kDev), bs.to(kDev)), group_norm(x, 2, wt, bs),
                 "group_norm");
}

// Bad input raises as on the CPU, naming the op; operands on two devices raise naming both.
TEST(CudaConv, BadInputRaisesAsOnTheCpu) {
  KILN_REQUIRE_DEVICE();
  LazyGuard eager(false);
  const Tensor x = testing::random_tensor({1, 4, 5, 5}).to(kDev);
  const Tensor w = testing::random_tensor({6, 2, 3, 3}).to(kDev);
  testing::expect_error([&] { conv2d(x, w, {}, {1}, {0}, {1}, 3); },
                        {"conv2d", "groups (3) must divide the input channels (4)"});
  testing::expect_error([&] { conv2d(x, w.to(kCPU), {}, {1}, {0}, {1}, 2); },
                        {"conv2d", "same device", "cuda:0", "cpu"});
  testing::expect_error([&] { conv2d(x, w.to(kFloat64), {}, {1}, {0}, {1}, 2); },
                        {"conv2d", "same dtype"});
  testing::expect_error([&] { max_pool2d(x, {9}); },
                        {"max_pool2d", "larger than the padded input"});
  testing::expect_error([&] { avg_pool2d(x.to(kInt64), {2}); },
                        {"avg_pool2d", "float32 or float64"});
}

// tools/examples/resnet --device cuda: parameters, batch norm's running statistics and the batches
// move to the device, and a few traced training steps there compute the CPU's losses.
TEST(CudaConv, ResNetExampleTrainsOnTheDevice) {
  KILN_REQUIRE_DEVICE();
  examples::ResNetConfig c;
  c.image_size = 8;
  c.train_images = 32;
  c.test_images = 8;
  c.width = 4;
  c.batch_size = 8;
  c.steps = 3;
  c.log_every = 0;
  const examples::ResNetResult cpu = examples::train_resnet(c);
  c.device = "cuda";
  const examples::ResNetResult dev = examples::train_resnet(c);
  ASSERT_EQ(dev.step_losses.size(), cpu.step_losses.size());
  for (size_t i = 0; i < cpu.step_losses.size(); ++i)
    EXPECT_NEAR(dev.step_losses[i], cpu.step_losses[i], 1e-3) << "step " << i;
  EXPECT_NEAR(dev.test_loss, cpu.test_loss, 1e-3);
}

// ------------------------------------------------------------- choices kept on disk (the CPU)

// Runs this binary's hidden conv workload in a child process with the given cache directory and
// returns what it logged (KILN_LOG=conv).
std::string run_child(const std::string& cache_dir) {
  const std::string log = cache_dir + "/../child.log";
  const std::string command =
      "env -u GTEST_TOTAL_SHARDS -u GTEST_SHARD_INDEX KILN_CACHE=1 KILN_CACHE_DIR=" + cache_dir +
      " KILN_CONV_ALGO=auto KILN_LOG=conv KILN_LAZY=0 CUDA_CONV_TEST_CHILD=1 " +
      fs::read_symlink("/proc/self/exe").string() + " --gtest_filter=CudaConv.ChildWorkload > " +
      log + " 2>&1";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream in(log);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The workload of ChoicesPersistAcrossProcesses (only in its child processes).
TEST(CudaConv, ChildWorkload) {
  if (!std::getenv("CUDA_CONV_TEST_CHILD")) GTEST_SKIP() << "run by ChoicesPersistAcrossProcesses";
  const Tensor x = testing::random_tensor({2, 3, 9, 9}), w = testing::random_tensor({4, 3, 3, 3});
  conv2d(x, w, {}, {1}, {1});
  std::cerr << "picked " << detail::conv_algo_name(detail::last_conv_algo()) << "\n";
}

size_t count(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

// A second process reads the first one's measured choice from the cache directory instead of
// measuring, and picks the same algorithm; a damaged entry is ignored (measured again, rewritten).
TEST(CudaConv, ChoicesPersistAcrossProcesses) {
  const std::string dir = ::testing::TempDir() + "/kiln_conv_choices_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir + "/cache");
  const std::string first = run_child(dir + "/cache");
  ASSERT_EQ(count(first, "(measured "), 1u) << first;
  const size_t at = first.find("picked ");
  ASSERT_NE(at, std::string::npos) << first;
  const std::string picked = first.substr(at, first.find('\n', at) - at);
  const std::string second = run_child(dir + "/cache");
  EXPECT_EQ(count(second, "(measured "), 0u) << second;
  EXPECT_EQ(count(second, "(from cache)"), 1u) << second;
  EXPECT_NE(second.find(picked), std::string::npos) << second;
  // Damage every entry: flip its last byte (the payload: the checksum no longer matches).
  int damaged = 0;
  for (const auto& e : fs::directory_iterator(dir + "/cache")) {
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    const char c = static_cast<char>(f.get() ^ 0x5a);
    f.seekp(-1, std::ios::end);
    f.put(c);
    ++damaged;
  }
  EXPECT_GE(damaged, 1);
  const std::string third = run_child(dir + "/cache");
  EXPECT_EQ(count(third, "(measured "), 1u) << third;
  EXPECT_EQ(count(run_child(dir + "/cache"), "(from cache)"), 1u);
  fs::remove_all(dir);
}

// In one process, a cleared in-memory table reads the stored choice back.
TEST(CudaConv, ClearedTableReadsTheStoredChoice) {
  if (!fuser::DiskCache::instance().enabled()) GTEST_SKIP() << "the kernel cache is off";
  LazyGuard eager(false);
  const Tensor x = testing::random_tensor({2, 3, 11, 7}), w = testing::random_tensor({5, 3, 2, 2});
  setenv("KILN_LOG", "conv", 1);
  conv2d(x, w);
  detail::clear_conv_choices();
  ::testing::internal::CaptureStderr();
  conv2d(x, w);
  const std::string log = ::testing::internal::GetCapturedStderr();
  unsetenv("KILN_LOG");
  EXPECT_NE(log.find("(from cache)"), std::string::npos) << log;
}

}  // namespace
}  // namespace kiln
