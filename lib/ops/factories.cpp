// Factory ops: tensors made from shapes, ranges, random draws and user memory.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <sstream>

#include "kiln/ops.h"
#include "kiln/serialize.h"
#include "lib/cuda_driver.h"
#include "lib/cuda_tensor.h"
#include "lib/dispatch.h"
#include "lib/int_math.h"
#include "lib/lazy.h"
#include "lib/op_registry.h"
#include "lib/op_table.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::make_empty;

namespace {
const detail::OpDef& def_factory(const char* name) {
  return detail::register_op({name, detail::OpKind::Factory, 0, detail::DTypeRule::Custom});
}
// Random draws are recorded inside a trace (lazy mode draws at once, in program order): a replay
// must draw new numbers, where a trace's other factories are constants. Their reference kernels
// draw from the process generator when the plan runs them.
const detail::OpDef& def_random(const char* name, detail::Invoke invoke,
                                std::vector<std::string> attr_names) {
  return detail::register_op({name, detail::OpKind::Factory, 0, detail::DTypeRule::Custom, true,
                              invoke, std::move(attr_names)});
}
detail::OpHandle empty_def;
detail::OpHandle full_def;
detail::OpHandle arange_def;
detail::OpHandle linspace_def;
detail::OpHandle eye_def;
detail::OpHandle rand_def;
detail::OpHandle randn_def;
detail::OpHandle randint_def;
}  // namespace

// The factories' entries: a trace records only the random draws; the others are constants.
void registration::register_factories() {
  empty_def.bind(def_factory("empty"));
  full_def.bind(def_factory("full"));
  arange_def.bind(def_factory("arange"));
  linspace_def.bind(def_factory("linspace"));
  eye_def.bind(def_factory("eye"));
  rand_def.bind(def_random("rand",
                           [](const std::vector<Tensor>&, const detail::Attrs& a) {
                             return std::vector<Tensor>{
                                 rand(detail::attr_ints(a[0]),
                                      TensorOptions().dtype(detail::attr_dtype(a[1])))};
                           },
                           {"shape", "dtype"}));
  randn_def.bind(def_random("randn",
                            [](const std::vector<Tensor>&, const detail::Attrs& a) {
                              return std::vector<Tensor>{
                                  randn(detail::attr_ints(a[0]),
                                        TensorOptions().dtype(detail::attr_dtype(a[1])))};
                            },
                            {"shape", "dtype"}));
  randint_def.bind(def_random("randint",
                              [](const std::vector<Tensor>&, const detail::Attrs& a) {
                                return std::vector<Tensor>{
                                    randint(detail::attr_int(a[0]), detail::attr_int(a[1]),
                                            detail::attr_ints(a[2]),
                                            TensorOptions().dtype(detail::attr_dtype(a[3])))};
                              },
                              {"low", "high", "shape", "dtype"}));
}

namespace {

// Inside a trace, except where the executor runs a plan's reference kernels (lazy mode off).
bool recording_draws() {
  return detail::trace_mode() && detail::lazy_mode();
}

// A factory's host result on `device`: copied at once, so that a factory's tensor is concrete in
// every mode (inside a trace, a constant of the trace), except a draw recorded inside a trace,
// whose copy is recorded too (each replay draws anew).
Tensor on_device(const Tensor& t, Device device) {
  return detail::is_pending(t) ? t.to(device) : detail::copy_to_device(t, device);
}

// Checks the device, and that `shape` is valid and its elements of `dtype` fit in one allocation.
void check_factory(const char* op, const Shape& shape, const TensorOptions& o, DType dtype) {
  if (o.device_.is_cuda()) detail::cuda::require_device(o.device_.index, op);
  detail::checked_nbytes(detail::checked_numel(shape, op), dtype, op, shape);
}

// A double as a value of T; integers as the fused kernels convert (detail::float_to_int).
template <typename T>
T from_double(double v) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
    return detail::float_to_int<T>(v);
  else
    return static_cast<T>(v);
}

// The process-wide generator: a 64-bit Mersenne Twister; draws are serial so results do not
// depend on the thread count.
struct Generator {
  std::mutex mu;
  std::mt19937_64 engine{0x6b696c6eULL};
};
Generator& generator() {
  static Generator g;
  return g;
}
// Uniform in [0, 1) with 53 (double) random bits.
double next_uniform(std::mt19937_64& e) {
  return static_cast<double>(e() >> 11) * 0x1.0p-53;
}
}  // namespace

Tensor empty(const Shape& shape, TensorOptions options) {
  (void)empty_def;
  check_factory("empty", shape, options, options.dtype_or(kFloat32));
  if (options.device_.is_cuda())
    return detail::make_empty_on(shape, options.dtype_or(kFloat32), options.device_);
  return make_empty(shape, options.dtype_or(kFloat32));
}
Tensor zeros(const Shape& shape, TensorOptions options) {
  check_factory("zeros", shape, options, options.dtype_or(kFloat32));
  return full(shape, 0, options.dtype(options.dtype_or(kFloat32)));
}
Tensor ones(const Shape& shape, TensorOptions options) {
  check_factory("ones", shape, options, options.dtype_or(kFloat32));
  return full(shape, 1, options.dtype(options.dtype_or(kFloat32)));
}
Tensor full(const Shape& shape, const Scalar& value, TensorOptions options) {
  (void)full_def;
  DType dt = options.dtype_or(value.is_floating_point() ? kFloat32 : value.kind());
  check_factory("full", shape, options, dt);
  if (options.device_.is_cuda()) {
    // Filled on the device (zeros and backward formulas' buffers are often as large as a
    // parameter): zero bytes by a memset, other values by the copy kernel broadcasting the one
    // value; where that kernel declines, filled on the host and copied.
    const Device device = options.device_;
    Tensor one = make_empty({}, dt);
    detail::copy_kernel(one, detail::wrap_scalar(value));
    Tensor t = detail::make_empty_on(shape, dt, device);
    if (t.numel() == 0) return t;
    const char* bytes = one.impl()->data();
    if (std::all_of(bytes, bytes + element_size(dt), [](char b) { return b == 0; })) {
      detail::cuda::memset_on_device(device.index, t.impl()->data(), 0,
                                     static_cast<size_t>(t.numel()) * element_size(dt));
      return t;
    }
    const auto device_copy = detail::device_kernels().copy;
    if (device_copy && device_copy(t, detail::copy_to_device(one, device))) return t;
    return on_device(full(shape, value, options.device(kCPU)), device);
  }
  // The kernel directly, not fill_: factories make concrete tensors in every mode (inside a
  // trace they are the trace's constants), and fill_ would be recorded there.
  Tensor t = make_empty(shape, dt);
  detail::copy_kernel(t, detail::wrap_scalar(value));
  return t;
}
Tensor zeros_like(const Tensor& t) {
  return zeros(t.sizes(), TensorOptions(t.dtype()).device(t.device()));
}
Tensor ones_like(const Tensor& t) {
  return ones(t.sizes(), TensorOptions(t.dtype()).device(t.device()));
}
Tensor empty_like(const Tensor& t) {
  return empty(t.sizes(), TensorOptions(t.dtype()).device(t.device()));
}
Tensor full_like(const Tensor& t, const Scalar& value) {
  return full(t.sizes(), value, TensorOptions(t.dtype()).device(t.device()));
}
Tensor scalar_tensor(const Scalar& value, TensorOptions options) {
  return full({}, value,
              options.dtype(options.dtype_or(value.is_floating_point() ? kFloat32 : value.kind())));
}

namespace {
// The element count of arange(start, end, step) (the caller checked the step's sign), or an error
// when it exceeds int64. Integer ranges are exact in 128 bits: end - start alone may not fit.
int64_t arange_length(const Scalar& start, const Scalar& end, const Scalar& step, bool all_int) {
  const auto too_long = [&](const auto& count) {
    return detail::str_cat("arange: the range ", start, " -> ", end, " with step ", step,
                           " is too long (", count, " elements)");
  };
  if (all_int) {
    const __int128 st = step.to_int();
    const __int128 n = (__int128{end.to_int()} - start.to_int() + st - (st > 0 ? 1 : -1)) / st;
    KILN_CHECK(n <= INT64_MAX, too_long(static_cast<double>(n)));
    return static_cast<int64_t>(n);
  }
  const double n = std::ceil((end.to_double() - start.to_double()) / step.to_double());
  KILN_CHECK(n < 0x1p63, too_long(n));
  return static_cast<int64_t>(n);
}
}  // namespace

Tensor arange(const Scalar& end, TensorOptions options) {
  return arange(0, end, 1, options);
}
Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step, TensorOptions options) {
  (void)arange_def;
  if (options.device_.is_cuda()) {
    check_factory("arange", {}, options, kFloat32);
    return on_device(arange(start, end, step, options.device(kCPU)), options.device_);
  }
  bool all_int =
      !start.is_floating_point() && !end.is_floating_point() && !step.is_floating_point();
  DType dt = options.dtype_or(all_int ? kInt64 : kFloat32);
  double s = start.to_double(), e = end.to_double(), st = step.to_double();
  KILN_CHECK(st != 0, "arange: step must be nonzero");
  KILN_CHECK(std::isfinite(s) && std::isfinite(e), "arange: unsupported range ", start, " -> ",
             end);
  KILN_CHECK((st > 0 && e >= s) || (st < 0 && e <= s), "arange: upper bound (", end,
             ") and lower bound (", start, ") inconsistent with step sign (", step, ")");
  const int64_t n = arange_length(start, end, step, all_int);
  check_factory("arange", {n}, options, dt);
  Tensor t = make_empty({n}, dt);
  detail::dispatch_all(dt, [&](auto tag) {
    using T = KILN_TYPE(tag);
    T* p = t.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) {
      if (all_int)  // every value lies between start and end, but i * step may not fit
        p[i] = static_cast<T>(detail::wrap_add(start.to_int(), detail::wrap_mul(i, step.to_int())));
      else
        p[i] = from_double<T>(s + static_cast<double>(i) * st);
    }
  });
  return t;
}

Tensor linspace(double start, double end, int64_t steps, TensorOptions options) {
  (void)linspace_def;
  KILN_CHECK(steps >= 0, "linspace: number of steps must be non-negative, got ", steps);
  DType dt = options.dtype_or(kFloat32);
  check_factory("linspace", {steps}, options, dt);
  if (options.device_.is_cuda())
    return on_device(linspace(start, end, steps, options.device(kCPU)), options.device_);
  Tensor t = make_empty({steps}, dt);
  double step = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0.0;
  detail::dispatch_all(dt, [&](auto tag) {
    using T = KILN_TYPE(tag);
    T* p = t.data_ptr<T>();
    // Fill symmetrically from both ends, as torch does, so the last value is exactly `end`; a
    // single step gives `start`.
    int64_t half = std::max<int64_t>(steps / 2, 1);
    for (int64_t i = 0; i < steps; ++i)
      p[i] = from_double<T>(i < half ? start + step * i : end - step * (steps - 1 - i));
  });
  return t;
}

Tensor eye(int64_t n, TensorOptions options) {
  return eye(n, n, options);
}
Tensor eye(int64_t n, int64_t m, TensorOptions options) {
  (void)eye_def;
  check_factory("eye", {n, m}, options, options.dtype_or(kFloat32));
  if (options.device_.is_cuda()) return on_device(eye(n, m, options.device(kCPU)), options.device_);
  Tensor t = zeros({n, m}, options);
  Tensor one = detail::wrap_scalar(1);
  for (int64_t i = 0; i < std::min(n, m); ++i)
    detail::copy_kernel(t.select(0, i).select(0, i), one);
  return t;
}

void manual_seed(uint64_t seed) {
  auto& g = generator();
  std::lock_guard<std::mutex> lock(g.mu);
  g.engine.seed(seed);
}

// The engine's words as the standard's text form writes them (state_size words, then the
// position), each uint64 kept bit for bit in an int64.
constexpr int64_t kRngStateWords = std::mt19937_64::state_size + 1;

Tensor get_rng_state() {
  std::ostringstream text;
  {
    auto& g = generator();
    std::lock_guard<std::mutex> lock(g.mu);
    text << g.engine;
  }
  std::istringstream in(text.str());
  std::vector<int64_t> words;
  for (uint64_t w; in >> w;) words.push_back(static_cast<int64_t>(w));
  KILN_CHECK(static_cast<int64_t>(words.size()) == kRngStateWords,
             "get_rng_state: unexpected generator state of ", words.size(), " words");
  return from_vector(words);
}

void set_rng_state(const Tensor& state) {
  KILN_CHECK(state.defined() && state.dtype() == kInt64 && state.sizes() == Shape{kRngStateWords},
             "set_rng_state: expected the int64[", kRngStateWords,
             "] tensor that get_rng_state returns, got ", detail::describe(state));
  std::ostringstream text;
  for (int64_t w : state.to_vector<int64_t>()) text << static_cast<uint64_t>(w) << ' ';
  std::mt19937_64 engine;
  std::istringstream in(text.str());
  in >> engine;
  KILN_CHECK(!in.fail(), "set_rng_state: the tensor is not a generator state");
  auto& g = generator();
  std::lock_guard<std::mutex> lock(g.mu);
  g.engine = engine;
}

Tensor rand(const Shape& shape, TensorOptions options) {
  (void)rand_def;
  check_factory("rand", shape, options, options.dtype_or(kFloat32));
  if (options.device_.is_cuda())
    return on_device(rand(shape, options.device(kCPU)), options.device_);
  DType dt = options.dtype_or(kFloat32);
  KILN_CHECK(is_floating_point(dt), "rand: expected a floating dtype, got ", dtype_name(dt));
  if (recording_draws()) return detail::lazy_record1(rand_def, {}, {shape, dt}, {shape, dt});
  Tensor t = make_empty(shape, dt);
  auto& g = generator();
  std::lock_guard<std::mutex> lock(g.mu);
  detail::dispatch_floating(dt, "rand", [&](auto tag) {
    using T = KILN_TYPE(tag);
    T* p = t.data_ptr<T>();
    const int64_t n = t.numel();  // numel() walks the sizes: not once per element
    for (int64_t i = 0; i < n; ++i) {
      T v = static_cast<T>(next_uniform(g.engine));
      p[i] = v < T(1) ? v : std::nextafter(T(1), T(0));  // rounding to float must not reach 1
    }
  });
  return t;
}

Tensor randn(const Shape& shape, TensorOptions options) {
  (void)randn_def;
  check_factory("randn", shape, options, options.dtype_or(kFloat32));
  if (options.device_.is_cuda())
    return on_device(randn(shape, options.device(kCPU)), options.device_);
  DType dt = options.dtype_or(kFloat32);
  KILN_CHECK(is_floating_point(dt), "randn: expected a floating dtype, got ", dtype_name(dt));
  if (recording_draws()) return detail::lazy_record1(randn_def, {}, {shape, dt}, {shape, dt});
  Tensor t = make_empty(shape, dt);
  auto& g = generator();
  std::lock_guard<std::mutex> lock(g.mu);
  detail::dispatch_floating(dt, "randn", [&](auto tag) {
    using T = KILN_TYPE(tag);
    T* p = t.data_ptr<T>();
    const int64_t n = t.numel();
    for (int64_t i = 0; i < n; i += 2) {         // Box-Muller: two normals per pair of uniforms
      double u1 = 1.0 - next_uniform(g.engine);  // (0, 1]
      double u2 = next_uniform(g.engine);
      double r = std::sqrt(-2.0 * std::log(u1));
      p[i] = static_cast<T>(r * std::cos(2.0 * M_PI * u2));
      if (i + 1 < n) p[i + 1] = static_cast<T>(r * std::sin(2.0 * M_PI * u2));
    }
  });
  return t;
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options) {
  (void)randint_def;
  check_factory("randint", shape, options, kInt64);
  if (options.device_.is_cuda())
    return on_device(randint(low, high, shape, options.device(kCPU)), options.device_);
  KILN_CHECK(low < high, "randint: expected low < high, got low=", low, " high=", high);
  DType dt = options.dtype_or(kInt64);
  if (recording_draws())
    return detail::lazy_record1(randint_def, {}, {low, high, shape, dt}, {shape, dt});
  Tensor t = make_empty(shape, kInt64);
  auto& g = generator();
  {
    std::lock_guard<std::mutex> lock(g.mu);
    uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
    int64_t* p = t.data_ptr<int64_t>();
    // Rejection sampling keeps every value equally likely.
    uint64_t limit =
        std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % range;
    const int64_t n = t.numel();
    for (int64_t i = 0; i < n; ++i) {
      uint64_t r;
      do r = g.engine();
      while (r >= limit);
      p[i] = low + static_cast<int64_t>(r % range);
    }
  }
  return t.to(dt);
}
Tensor randint(int64_t high, const Shape& shape, TensorOptions options) {
  return randint(0, high, shape, options);
}

namespace detail {
Tensor from_buffer(const void* data, int64_t count, DType dtype, const Shape& shape) {
  KILN_CHECK(count == 0 || data != nullptr, "from_vector: null data pointer");
  check_factory("from_vector", shape, {}, dtype);
  Tensor t = make_empty(shape, dtype);
  KILN_CHECK(t.numel() == count, "from_vector: ", count, " values do not fill shape ",
             shape_str(shape), " (", t.numel(), " elements)");
  if (count) std::memcpy(t.raw_data_ptr(), data, static_cast<size_t>(count) * element_size(dtype));
  return t;
}
}  // namespace detail

Tensor from_vector(const std::vector<bool>& data, std::optional<Shape> shape) {
  std::vector<uint8_t> bytes(data.begin(), data.end());
  return detail::from_buffer(bytes.data(), static_cast<int64_t>(bytes.size()), kBool,
                             shape.value_or(Shape{static_cast<int64_t>(data.size())}));
}

Tensor from_blob(void* data, const Shape& shape, TensorOptions options,
                 std::function<void(void*)> deleter) {
  return from_blob(data, shape, detail::contiguous_strides(shape), options, std::move(deleter));
}

Tensor from_blob(void* data, const Shape& shape, const Shape& strides, TensorOptions options,
                 std::function<void(void*)> deleter) {
  KILN_CHECK(data != nullptr, "from_blob: data pointer is null (shape ", detail::shape_str(shape),
             ")");
  KILN_CHECK(shape.size() == strides.size(), "from_blob: shape ", detail::shape_str(shape),
             " and strides ", detail::shape_str(strides), " differ in length");
  DType dt = options.dtype_or(kFloat32);
  check_factory("from_blob", shape, options, dt);
  for (size_t i = 0; i < shape.size(); ++i)
    KILN_CHECK(strides[i] >= 0, "from_blob: negative stride in ", detail::shape_str(strides));
  // The elements the geometry reaches (one for an empty tensor, as before).
  const int64_t extent =
      detail::shape_numel(shape) == 0
          ? 1
          : KILN_CHECKED_ADD(detail::checked_last_element(shape, strides, 0, "from_blob"), 1,
                             "from_blob: the shape ", detail::shape_str(shape));
  auto storage = std::make_shared<detail::Storage>();
  storage->data = data;
  storage->nbytes = detail::checked_nbytes(extent, dt, "from_blob", shape);
  storage->deleter = std::move(deleter);
  auto impl = std::make_shared<detail::TensorImpl>();
  impl->storage = std::move(storage);
  impl->sizes = shape;
  impl->strides = strides;
  impl->dtype = dt;
  return Tensor(std::move(impl));
}

}  // namespace kiln
