// DType, Device, Scalar and Error basics, and the TensorImpl helpers every op uses.
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "lib/allocator.h"
#include "lib/autograd.h"
#include "lib/cuda_driver.h"
#include "lib/cuda_tensor.h"
#include "lib/int_math.h"
#include "lib/pool.h"
#include "lib/tensor_impl.h"

namespace kiln {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Bool:
      return "bool";
    case DType::Int32:
      return "int32";
    case DType::Int64:
      return "int64";
    case DType::Float32:
      return "float32";
    case DType::Float64:
      return "float64";
  }
  return "unknown";
}

size_t element_size(DType t) {
  switch (t) {
    case DType::Bool:
      return 1;
    case DType::Int32:
      return 4;
    case DType::Int64:
      return 8;
    case DType::Float32:
      return 4;
    case DType::Float64:
      return 8;
  }
  return 0;
}

DType promote_types(DType a, DType b) {
  // The enum is ordered so that the larger of two types holds both (bool < int32 < int64 < f32 <
  // f64).
  return static_cast<int>(a) >= static_cast<int>(b) ? a : b;
}

bool can_cast(DType from, DType to) {
  if (is_floating_point(from) && !is_floating_point(to)) return false;
  if (from != kBool && to == kBool) return false;
  return true;
}

std::ostream& operator<<(std::ostream& os, DType t) {
  return os << dtype_name(t);
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}
Device Device::parse(const std::string& text) {
  if (text == "cpu") return kCPU;
  if (text == "cuda") return kCUDA;
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() < 15 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos)
    return Device(DeviceType::CUDA, std::stoi(text.substr(5)));
  KILN_FAIL("Device: cannot parse \"", text, "\" (expected cpu, cuda or cuda:N)");
}

std::ostream& operator<<(std::ostream& os, const Device& d) {
  return os << d.str();
}

std::ostream& operator<<(std::ostream& os, const Scalar& s) {
  if (s.is_bool()) return os << (s.to_int() ? "true" : "false");
  if (s.is_integral()) return os << s.to_int();
  return os << s.to_double();
}

namespace detail {

void throw_error(const char* file, int line, const std::string& msg) {
  (void)file;
  (void)line;
  throw Error(msg);
}

int64_t TensorImpl::numel() const {
  return shape_numel(sizes);
}

int64_t shape_numel(const Shape& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n = KILN_CHECKED_MUL(n, s, "numel: the shape ", shape_str(sizes));
  return n;
}

int64_t checked_numel(const Shape& sizes, const char* op) {
  int64_t numel = 1, extent = 1;
  for (int64_t s : sizes) {
    KILN_CHECK(s >= 0, op, ": negative dimension ", s, " in shape ", shape_str(sizes));
    extent =
        KILN_CHECKED_MUL(extent, std::max<int64_t>(s, 1), op, ": the shape ", shape_str(sizes));
    numel = s == 0 ? 0 : numel * s;  // numel <= extent: no overflow
  }
  return numel;
}

size_t checked_nbytes(int64_t numel, DType dtype, const char* op, const Shape& shape) {
  // PTRDIFF_MAX bounds every object (malloc refuses more), and keeps byte offsets int64.
  int64_t nbytes;
  KILN_CHECK(!mul_overflows(numel, static_cast<int64_t>(element_size(dtype)), &nbytes), op,
             ": the shape ", shape_str(shape), " of ", dtype_name(dtype), " needs more than ",
             INT64_MAX, " bytes, more than one allocation can hold");
  return static_cast<size_t>(nbytes);
}

int64_t checked_last_element(const Shape& sizes, const Shape& strides, int64_t offset,
                             const char* op) {
  int64_t last = offset;
  for (size_t i = 0; i < sizes.size(); ++i) {
    int64_t step;
    KILN_CHECK(!mul_overflows(sizes[i] - 1, strides[i], &step) && !add_overflows(last, step, &last),
               op, ": sizes ", shape_str(sizes), " with strides ", shape_str(strides),
               " and offset ", offset, " reach past the 64-bit element range");
  }
  return last;
}

Shape contiguous_strides(const Shape& sizes) {
  Shape strides(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    if (i > 0)
      s = KILN_CHECKED_MUL(s, std::max<int64_t>(sizes[i], 1), "strides: the shape ",
                           shape_str(sizes));
  }
  return strides;
}

bool is_contiguous_layout(const Shape& sizes, const Shape& strides) {
  int64_t expected = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] == 0) return true;
    if (sizes[i] != 1 && strides[i] != expected) return false;
    expected *= sizes[i];
  }
  return true;
}

Tensor make_empty(const Shape& shape, DType dtype) {
  for (int64_t s : shape)
    KILN_CHECK(s >= 0, "empty: negative dimension in shape ", shape_str(shape));
  auto storage = make_pooled<Storage>();
  size_t nbytes = checked_nbytes(checked_numel(shape, "empty"), dtype, "empty", shape);
  storage->data = cpu_alloc(nbytes);
  storage->nbytes = nbytes;
  storage->deleter = [nbytes](void* p) { cpu_free(p, nbytes); };
  storage->owns_allocation = true;
  // Inside jit::trace a new storage is the function's own until the trace sees it escape.
  if (TraceState* trace = trace_state()) trace->created.insert(storage.get());
  auto impl = make_pooled<TensorImpl>();
  impl->storage = std::move(storage);
  impl->sizes = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor make_empty_strided(const Shape& shape, const Shape& strides, DType dtype, Device device) {
  for (size_t i = 0; i < shape.size(); ++i)
    KILN_CHECK(shape[i] >= 0, "empty_strided: negative dimension in shape ", shape_str(shape));
  const bool empty = checked_numel(shape, "empty_strided") == 0;
  const int64_t extent =
      empty ? 0
            : KILN_CHECKED_ADD(checked_last_element(shape, strides, 0, "empty_strided"), 1,
                               "empty_strided: the shape ", shape_str(shape));
  Tensor flat = make_empty_on({extent}, dtype, device);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = flat.impl()->storage;
  impl->sizes = shape;
  impl->strides = strides;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor make_zeros_strided(const Shape& shape, const Shape& strides, DType dtype, Device device) {
  if (device.is_cuda()) {
    Tensor t = make_empty_strided(shape, strides, dtype, device);
    cuda::memset_on_device(device.index, t.impl()->storage->data, 0, t.impl()->storage->nbytes);
    return t;
  }
  Tensor t = is_contiguous_layout(shape, strides) ? make_empty(shape, dtype)
                                                  : make_empty_strided(shape, strides, dtype);
  std::memset(t.impl()->storage->data, 0, t.impl()->storage->nbytes);
  return t;
}

Tensor make_view(const Tensor& base, Shape sizes, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  const TensorImpl* b = base.impl();
  impl->storage = b->storage;
  impl->offset = offset;
  impl->sizes = std::move(sizes);
  impl->strides = std::move(strides);
  impl->dtype = b->dtype;
  impl->view_base = b->view_base ? b->view_base : base.impl_ptr();
  impl->view_version = b->storage->version.load(std::memory_order_relaxed);
  impl->view_tracks_base = grad_mode();
  return Tensor(std::move(impl));
}

namespace {
// A wrapped number's few bytes live inside its Storage: one allocation instead of three, which
// matters because every `x * 0.5` makes one.
struct InlineScalarStorage : Storage {
  alignas(16) unsigned char bytes[16];
};
}  // namespace

Tensor wrap_scalar(const Scalar& s) {
  auto storage = make_pooled<InlineScalarStorage>();
  storage->data = storage->bytes;
  storage->nbytes = element_size(s.kind());
  switch (s.kind()) {
    case DType::Bool:
      *reinterpret_cast<bool*>(storage->bytes) = s.to<bool>();
      break;
    case DType::Int64:
      *reinterpret_cast<int64_t*>(storage->bytes) = s.to_int();
      break;
    default:
      *reinterpret_cast<double*>(storage->bytes) = s.to_double();
      break;
  }
  auto impl = make_pooled<TensorImpl>();
  impl->storage = std::move(storage);
  impl->dtype = s.kind();
  impl->wrapped_number = true;
  return Tensor(std::move(impl));
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op, const Tensor* input) {
  int64_t n = std::max<int64_t>(ndim, 1);  // a 0-dim tensor accepts dim 0 and -1, as in torch
  KILN_CHECK(dim >= -n && dim < n, op, ": dimension out of range (expected to be in range of [", -n,
             ", ", n - 1, "], but got ", dim, ")",
             input ? " for input " + describe(*input) : std::string());
  return dim < 0 ? dim + n : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    KILN_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
               " cannot be broadcast together (size ", da, " vs ", db, " at dimension ", i, ")");
    out[i] = da == 1 ? db : da;
  }
  checked_numel(out, op);  // two valid shapes can broadcast to one too large
  return out;
}

Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  const Shape& sz = t.sizes();
  const Shape& st = t.strides();
  Shape out(shape.size(), 0);
  size_t off = shape.size() - sz.size();
  for (size_t i = 0; i < sz.size(); ++i) out[off + i] = sz[i] == 1 ? 0 : st[i];
  return out;
}

bool may_overlap(const Tensor& a, const Tensor& b) {
  if (a.impl()->storage != b.impl()->storage) return false;
  if (a.numel() == 0 || b.numel() == 0) return false;
  if (a.sizes() == b.sizes() && a.strides() == b.strides() &&
      a.storage_offset() == b.storage_offset())
    return false;  // the same view: element i is read before it is written
  return true;
}

void bump_version(const Tensor& t) {
  t.impl()->storage->version.fetch_add(1);
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  std::string s = std::string(dtype_name(t.dtype())) + shape_str(t.sizes());
  if (!t.device().is_cpu()) s += " on " + t.device().str();
  return s;
}

namespace {
std::optional<DType> promote_opt(std::optional<DType> a, std::optional<DType> b) {
  if (!a) return b;
  if (!b) return a;
  return promote_types(*a, *b);
}
std::optional<DType> combine_categories(std::optional<DType> higher, std::optional<DType> lower) {
  if (!higher) return lower;
  if (is_floating_point(*higher)) return higher;
  if (*higher == kBool || (lower && is_floating_point(*lower))) return promote_opt(higher, lower);
  return higher;
}
}  // namespace

DType result_type(const std::vector<Tensor>& operands) {
  std::vector<const Tensor*> ptrs;
  ptrs.reserve(operands.size());
  for (const Tensor& t : operands) ptrs.push_back(&t);
  return result_type(ptrs.data(), ptrs.size());
}

DType result_type(const Tensor& a, const Tensor& b) {
  const Tensor* ptrs[2] = {&a, &b};
  return result_type(ptrs, 2);
}

DType result_type(const Tensor* const* operands, size_t count) {
  PromotionOperand facts[8];
  std::vector<PromotionOperand> more;
  PromotionOperand* p = facts;
  if (count > 8) {
    more.resize(count);
    p = more.data();
  }
  size_t n = 0;
  for (size_t i = 0; i < count; ++i) {
    const Tensor& t = *operands[i];
    if (!t.defined()) continue;
    p[n++] = {t.dtype(), t.dim() == 0, t.impl()->wrapped_number};
  }
  return result_type(p, n);
}

DType result_type(const PromotionOperand* operands, size_t count) {
  std::optional<DType> dim_result, zero_result, wrapped_result;
  for (size_t i = 0; i < count; ++i) {
    const PromotionOperand& t = operands[i];
    DType d = t.dtype;
    if (t.wrapped) {
      wrapped_result = promote_opt(wrapped_result, is_floating_point(d) ? kFloat32 : d);
    } else if (t.zero_dim) {
      zero_result = promote_opt(zero_result, d);
    } else {
      dim_result = promote_opt(dim_result, d);
    }
  }
  auto r = combine_categories(dim_result, combine_categories(zero_result, wrapped_result));
  KILN_CHECK(r.has_value(), "result_type: no operands");
  return *r;
}

void check_defined(const Tensor& t, const char* op, const char* arg) {
  KILN_CHECK(t.defined(), op, ": argument '", arg, "' is an undefined tensor");
}

// A CUDA tensor passes: its op is recorded and runs on the device (lib/lazy.cpp). Only inside the
// evaluator, whose reference kernels read host memory, may it not reach an op's kernel.
void check_cpu(const Tensor& t, const char* op) {
  KILN_CHECK(t.device().is_cpu() || !in_evaluation(), op,
             ": internal error: a reference kernel was given a device tensor, ", describe(t),
             " on ", t.device());
}

}  // namespace detail
}  // namespace kiln
