// The differential tester: random programs over kiln's public API (tests/diff/ops.cpp) run in
// kiln's eager, lazy and traced modes and in libtorch, on the same input bytes. Outputs must agree
// in shape, dtype and value (bit-exact between kiln's modes unless the program computes
// transcendentals or reorders sums; within a few ulps of libtorch), gradients of a random
// weighting of the outputs must agree, and an error in one must be an error in the other. A
// difference is shrunk to a minimal program, printed as C++ to paste into a test.
//
// TorchDiff.FixedSeed runs KILN_DIFF_PROGRAMS programs (default 300) from fixed seeds;
// TorchDiff.FreshSeed runs for KILN_DIFF_SECONDS (default 30) from the seed KILN_DIFF_SEED, or
// one from the clock, which it prints first.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "tests/diff/ops.h"

namespace kiln_diff {

torch::ScalarType to_torch(kiln::DType t) {
  switch (t) {
    case kiln::kBool:
      return torch::kBool;
    case kiln::kInt32:
      return torch::kInt32;
    case kiln::kInt64:
      return torch::kInt64;
    case kiln::kFloat32:
      return torch::kFloat32;
    case kiln::kFloat64:
      return torch::kFloat64;
  }
  throw std::logic_error("dtype");
}
kiln::DType to_kiln(torch::ScalarType t) {
  for (kiln::DType d : {kiln::kBool, kiln::kInt32, kiln::kInt64, kiln::kFloat32, kiln::kFloat64})
    if (to_torch(d) == t) return d;
  throw std::logic_error("dtype");
}

namespace {

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// ---------------------------------------------------------------- input bytes
template <typename V>
V special_value(std::mt19937_64& rng) {
  if constexpr (std::is_floating_point_v<V>) {
    using L = std::numeric_limits<V>;
    const V values[] = {V(0),     V(-0.0),         L::infinity(), -L::infinity(), L::quiet_NaN(),
                        L::max(), L::denorm_min(), V(1e-30),      V(-1)};
    return values[rng() % std::size(values)];
  } else {
    using L = std::numeric_limits<V>;
    const V values[] = {V(0), V(-1), L::max(), L::min()};
    return values[rng() % std::size(values)];
  }
}
template <typename V>
void fill(const Input& in, std::vector<unsigned char>& bytes) {
  std::mt19937_64 rng(in.seed);
  std::uniform_real_distribution<double> u(in.lo, in.hi);
  int64_t n = numel(in.shape);
  bytes.resize(static_cast<size_t>(n) * sizeof(V));
  V* out = reinterpret_cast<V*>(bytes.data());
  for (int64_t k = 0; k < n; ++k) {
    double v = u(rng);
    if constexpr (std::is_same_v<V, bool>)
      out[k] = v < (in.lo + in.hi) / 2;
    else if constexpr (std::is_integral_v<V>)
      out[k] = static_cast<V>(std::floor(v));
    else
      out[k] = static_cast<V>(v);
    if constexpr (!std::is_same_v<V, bool>)
      if (in.special && rng() % 6 == 0) out[k] = special_value<V>(rng);
  }
}
std::vector<unsigned char> input_bytes(const Input& in) {
  std::vector<unsigned char> bytes;
  switch (in.dtype) {
    case kiln::kBool:
      fill<bool>(in, bytes);
      break;
    case kiln::kInt32:
      fill<int32_t>(in, bytes);
      break;
    case kiln::kInt64:
      fill<int64_t>(in, bytes);
      break;
    case kiln::kFloat32:
      fill<float>(in, bytes);
      break;
    case kiln::kFloat64:
      fill<double>(in, bytes);
      break;
  }
  return bytes;
}
kiln::Tensor kiln_input(const Input& in) {
  std::vector<unsigned char> bytes = input_bytes(in);
  return kiln::detail::from_buffer(bytes.data(), numel(in.shape), in.dtype, in.shape);
}

}  // namespace

torch::Tensor torch_input(const Input& in) {
  std::vector<unsigned char> bytes = input_bytes(in);
  return torch::from_blob(bytes.data(), in.shape, to_torch(in.dtype)).clone();
}

namespace {

// ---------------------------------------------------------------- generation
constexpr int kMaxSteps = 8;

// The ops a program draws from: all of them, or those KILN_DIFF_OPS names (comma-separated), for
// a hunt aimed at a few rows (its seeds name other programs than a full hunt's).
const std::vector<int>& drawable_ops() {
  static const std::vector<int> ops = [] {
    const auto& table = op_table();
    const char* names = std::getenv("KILN_DIFF_OPS");
    std::vector<int> out;
    for (size_t i = 0; i < table.size(); ++i) {
      const std::string name = std::string(",") + table[i].name + ",";
      if (!names || (std::string(",") + names + ",").find(name) != std::string::npos)
        out.push_back(static_cast<int>(i));
    }
    if (out.empty()) {
      std::fprintf(stderr, "torch_diff: KILN_DIFF_OPS=%s names no op\n", names);
      std::exit(2);
    }
    return out;
  }();
  return ops;
}

// A program of 1 to kMaxSteps steps over 1 to 3 inputs of broadcast-compatible shapes (picks add
// more). A step libtorch rejects ends the program: kiln must reject it too.
Program generate(uint64_t seed, bool* grads) {
  Program prog;
  prog.seed = seed;
  Gen g;
  g.rng.seed(seed);
  g.program = &prog;
  *grads = g.coin(0.5);
  Shape base = g.random_shape(3);
  for (int64_t k = g.uniform(1, 3); k > 0; --k) {
    // One draw per statement: the order of a call's arguments is unspecified (GCC and clang
    // differ), and a seed must name the same program whatever compiled the tester.
    Shape shape = g.values.empty() ? base : g.broadcastable(base);
    g.new_input(shape, g.random_dtype());
  }
  const auto& table = op_table();
  const std::vector<int>& drawable = drawable_ops();
  for (int64_t n = g.uniform(1, kMaxSteps); n > 0; --n) {
    for (int attempt = 0; attempt < 50; ++attempt) {
      Step s;
      s.op = drawable[static_cast<size_t>(g.uniform(0, static_cast<int64_t>(drawable.size()) - 1))];
      if (!table[static_cast<size_t>(s.op)].pick(g, s)) continue;
      std::vector<torch::Tensor> args;
      for (ValueId id : s.args)
        for (size_t i = 0; i < g.ids.size(); ++i)
          if (g.ids[i] == id) args.push_back(g.values[i]);
      prog.steps.push_back(s);
      try {
        g.values.push_back(table[static_cast<size_t>(s.op)].torch_fn(args, s.p));
        g.ids.push_back(static_cast<ValueId>(prog.steps.size()) - 1);
      } catch (const std::exception&) {
        return prog;
      }
      if (table[static_cast<size_t>(s.op)].flags & kLast) return prog;
      break;
    }
  }
  return prog;
}

// ---------------------------------------------------------------- running
enum class Mode { Torch, Eager, Lazy, Traced };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::Torch:
      return "torch";
    case Mode::Eager:
      return "eager";
    case Mode::Lazy:
      return "lazy";
    case Mode::Traced:
      return "traced";
  }
  return "?";
}

struct Value {
  Shape shape;
  kiln::DType dtype = kiln::kFloat32;
  std::vector<double> f;   // floating values
  std::vector<int64_t> i;  // integral and bool values
  bool requires_grad = false;
};

struct Outcome {
  bool error = false;
  bool foreign_exception = false;  // an exception other than kiln::Error (kiln only)
  // Pending nodes still alive after every tensor of the run is gone (kiln only): something
  // holds the run's lazy values (a trace's placeholders, say), and the thread's next flush
  // would compute or reject them in an unrelated program.
  int64_t leaked_pending = 0;
  std::string message;
  std::vector<Value> values;  // one per step
  std::vector<Value> grads;   // one per floating input, when the program checks gradients
  // libtorch: the largest finite magnitude of the loss's gradient with respect to any value of
  // the program (0 when none), the scale of the terms its backward sums (see Tolerance).
  double value_grad_scale = 0;
};

struct Run {
  const Program& prog;
  bool grads;  // floating inputs require grad; gradients are compared
};

template <typename Tensor>
std::vector<Tensor> run_steps(const Program& prog, const std::vector<Tensor>& inputs) {
  const auto& table = op_table();
  std::vector<Tensor> vals;
  for (const Step& s : prog.steps) {
    std::vector<Tensor> args;
    for (ValueId id : s.args)
      args.push_back(id < 0 ? inputs[input_index(id)] : vals[static_cast<size_t>(id)]);
    const Op& op = table[static_cast<size_t>(s.op)];
    if constexpr (std::is_same_v<Tensor, kiln::Tensor>)
      vals.push_back(op.kiln_fn(args, s.p));
    else
      vals.push_back(op.torch_fn(args, s.p));
  }
  return vals;
}

Value read(const torch::Tensor& t) {
  Value v;
  v.shape = t.sizes().vec();
  v.dtype = to_kiln(t.scalar_type());
  v.requires_grad = t.requires_grad();
  torch::Tensor c = t.detach().contiguous();
  if (t.is_floating_point()) {
    c = c.to(torch::kFloat64);
    v.f.assign(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  } else {
    c = c.to(torch::kInt64);
    v.i.assign(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  }
  return v;
}
Value read(const kiln::Tensor& t) {
  Value v;
  v.shape = t.sizes();
  v.dtype = t.dtype();
  v.requires_grad = t.requires_grad();
  if (t.is_floating_point())
    v.f = t.to_vector<double>();
  else
    v.i = t.to_vector<int64_t>();
  return v;
}

// The weight of output k in the loss whose gradients are compared.
Input weight_of(const Program& prog, size_t k, const Value& out) {
  Input w;
  w.shape = out.shape;
  w.dtype = out.dtype;
  w.seed = prog.seed * 7919 + k;
  w.lo = -1;
  w.hi = 1;
  return w;
}

// The largest finite magnitude of the gradient of sum(outs_k * weights_k) with respect to any of
// `outs` (0 where libtorch cannot say).
double value_grad_scale(const std::vector<torch::Tensor>& outs,
                        const std::vector<torch::Tensor>& weights) {
  double scale = 0;
  try {
    for (const torch::Tensor& g : torch::autograd::grad(outs, outs, weights, true, false, true)) {
      if (!g.defined() || g.numel() == 0) continue;
      torch::Tensor a = g.detach().to(torch::kFloat64).abs();
      a = torch::where(torch::isfinite(a), a, torch::zeros_like(a));
      scale = std::max(scale, a.max().item<double>());
    }
  } catch (const std::exception&) {
    return 0;
  }
  return scale;
}

Outcome run_torch(const Run& r) {
  Outcome out;
  std::string phase;
  try {
    std::vector<torch::Tensor> inputs;
    for (const Input& in : r.prog.inputs) {
      inputs.push_back(torch_input(in));
      if (r.grads && inputs.back().is_floating_point()) inputs.back().requires_grad_(true);
    }
    std::vector<torch::Tensor> vals = run_steps(r.prog, inputs);
    std::vector<torch::Tensor> outs, weights, wrt;
    for (size_t k = 0; k < vals.size(); ++k) {
      out.values.push_back(read(vals[k]));
      if (vals[k].requires_grad()) {
        outs.push_back(vals[k]);
        weights.push_back(torch_input(weight_of(r.prog, k, out.values.back())));
      }
    }
    for (const auto& in : inputs)
      if (in.requires_grad()) wrt.push_back(in);
    phase = "backward: ";
    if (!outs.empty() && !wrt.empty()) {
      auto g = torch::autograd::grad(outs, wrt, weights, true, false, true);
      for (size_t k = 0; k < g.size(); ++k)
        out.grads.push_back(read(g[k].defined() ? g[k] : torch::zeros_like(wrt[k])));
      out.value_grad_scale = value_grad_scale(outs, weights);
    }
  } catch (const std::exception& e) {
    out.error = true;
    out.message = phase + e.what();
    out.message = out.message.substr(0, out.message.find('\n'));
  }
  return out;
}

// kiln in one mode; the loss weighs the outputs that require grad in libtorch (`weigh`).
Outcome run_kiln(const Run& r, Mode mode, const std::vector<bool>& weigh) {
  Outcome out;
  const int64_t pending_before = kiln::jit::stats().pending_nodes;
  std::string phase;
  try {
    kiln::LazyGuard lazy(mode != Mode::Eager);
    std::vector<kiln::Tensor> inputs;
    for (const Input& in : r.prog.inputs) {
      inputs.push_back(kiln_input(in));
      if (r.grads && inputs.back().is_floating_point()) inputs.back().requires_grad_(true);
    }
    auto body = [&](const std::vector<kiln::Tensor>& in) { return run_steps(r.prog, in); };
    std::vector<kiln::Tensor> vals;
    if (mode == Mode::Traced)
      vals = kiln::jit::trace(body, inputs)(inputs);
    else
      vals = body(inputs);
    std::vector<kiln::Tensor> outs, weights, wrt;
    for (size_t k = 0; k < vals.size(); ++k) {
      out.values.push_back(read(vals[k]));
      if (k < weigh.size() && weigh[k] && vals[k].requires_grad()) {
        outs.push_back(vals[k]);
        weights.push_back(kiln_input(weight_of(r.prog, k, out.values.back())));
      }
    }
    for (const auto& in : inputs)
      if (in.requires_grad()) wrt.push_back(in);
    phase = "backward: ";
    if (!outs.empty() && !wrt.empty()) {
      auto g = kiln::autograd::grad(outs, wrt, weights, true, false, true);
      for (size_t k = 0; k < g.size(); ++k)
        out.grads.push_back(read(g[k].defined() ? g[k] : kiln::zeros_like(wrt[k])));
    }
  } catch (const kiln::Error& e) {
    out.error = true;
    out.message = phase + e.what();
  } catch (const std::exception& e) {
    out.error = true;
    out.foreign_exception = true;
    out.message = phase + e.what();
  }
  out.message = out.message.substr(0, out.message.find('\n'));
  out.leaked_pending = kiln::jit::stats().pending_nodes - pending_before;
  return out;
}

// ---------------------------------------------------------------- comparing
struct Tolerance {
  bool exact = false;
  // float32 ulps for float64 values too: the program rounds to float32 somewhere on the way.
  bool float32_precision = false;
  double ulps = 0;  // |a - b| <= ulps * eps * (|b| + max(min_scale, the largest finite |b|))
  // Gradients: the largest finite magnitude of any of the program's gradients, with respect to
  // its inputs or to any of its values. A gradient that cancels to about 0 (var's with respect to
  // a shift of its input, say) keeps the rounding of the terms it summed, whose size the other
  // gradients show: seed 13667168042827404008 gave 7e16 in kiln and -4e16 in libtorch where the
  // terms were near 1e27.
  double min_scale = 1;
  // An infinity on one side and NaN on the other count alike (gradients: where infinite terms of
  // both signs meet, whether a sum sees them both depends on how each backward formula is
  // written, e.g. layer_norm's over pow(-0.0, x); see docs/torch-differences.md).
  bool infinity_is_nan = false;
  // An infinity on one side and a finite value of the same sign within 1/16 of the largest
  // float on the other count alike (gradients: whether a product of a near-largest factor
  // overflows depends on the order of a backward formula's multiplications; seed
  // 12740376029904553827: DBL_MAX * var(x)'s gradient, 8.8e307 in kiln, inf in libtorch).
  bool overflow_is_infinity = false;
};

// Whether a and b are an infinity and a finite value of its sign past 1/16 of the largest float.
bool overflow_alike(double a, double b, kiln::DType t) {
  if (std::isinf(a) == std::isinf(b) || std::isnan(a) || std::isnan(b)) return false;
  const double largest =
      t == kiln::kFloat64 ? std::numeric_limits<double>::max() : std::numeric_limits<float>::max();
  const double finite = std::isinf(a) ? b : a;
  return std::signbit(a) == std::signbit(b) && std::abs(finite) >= largest / 16;
}

double eps_of(kiln::DType t) {
  return t == kiln::kFloat64 ? std::numeric_limits<double>::epsilon()
                             : std::numeric_limits<float>::epsilon();
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t k = 0; k < s.size(); ++k) os << (k ? ", " : "") << s[k];
  os << "]";
  return os.str();
}

// An empty string when `got` matches `want`, else what differs.
std::string compare(const Value& got, const Value& want, const Tolerance& tol) {
  std::ostringstream os;
  if (got.shape != want.shape || got.dtype != want.dtype) {
    os << "shape/dtype " << shape_str(got.shape) << " " << kiln::dtype_name(got.dtype) << " vs "
       << shape_str(want.shape) << " " << kiln::dtype_name(want.dtype);
    return os.str();
  }
  for (size_t k = 0; k < got.i.size(); ++k)
    if (got.i[k] != want.i[k]) {
      os << "element " << k << ": " << got.i[k] << " vs " << want.i[k];
      return os.str();
    }
  // Errors are measured against the tensor's largest magnitude, and at least 1: libtorch rounds
  // differently where a result cancels to (almost) zero, e.g. x - mean(x) in layer_norm.
  double scale = tol.min_scale;
  for (double v : want.f)
    if (std::isfinite(v)) scale = std::max(scale, std::abs(v));
  for (size_t k = 0; k < got.f.size(); ++k) {
    double a = got.f[k], b = want.f[k];
    if (a == b || (std::isnan(a) && std::isnan(b))) continue;
    if (tol.infinity_is_nan &&
        ((std::isinf(a) && std::isnan(b)) || (std::isnan(a) && std::isinf(b))))
      continue;
    if (tol.overflow_is_infinity && overflow_alike(a, b, got.dtype)) continue;
    if (!tol.exact && std::isfinite(a) && std::isfinite(b) &&
        std::abs(a - b) <= tol.ulps * eps_of(tol.float32_precision ? kiln::kFloat32 : got.dtype) *
                               (std::abs(b) + scale))
      continue;
    os.precision(17);
    os << "element " << k << ": " << a << " vs " << b;
    return os.str();
  }
  return "";
}

// One difference: its signature (which modes, what kind) and a description.
struct Mismatch {
  std::string signature;
  std::string detail;
  bool empty() const { return signature.empty(); }
};

struct Flags {
  unsigned any = 0;  // the OpFlags of the program's ops
  // An integral input holds special values (limits): integer kernels overflow on them.
  bool int_specials = false;
  bool float32 = false;         // an input or a value (in libtorch) is float32
  double value_grad_scale = 0;  // libtorch's Outcome::value_grad_scale
};
Flags flags_of(const Program& prog, const Outcome& torch_out) {
  Flags f;
  const auto& table = op_table();
  for (const Step& s : prog.steps) f.any |= table[static_cast<size_t>(s.op)].flags;
  for (const Input& in : prog.inputs) {
    if (in.special && kiln::is_integral(in.dtype, true)) f.int_specials = true;
    f.float32 |= in.dtype == kiln::kFloat32;
  }
  for (const Value& v : torch_out.values) f.float32 |= v.dtype == kiln::kFloat32;
  f.value_grad_scale = torch_out.value_grad_scale;
  return f;
}

// Differences in which programs raise that are known: deliberate or open (both listed in
// docs/torch-differences.md).
struct KnownError {
  const char* torch_says;  // libtorch raised this and kiln did not, or
  const char* kiln_says;   // kiln raised this and libtorch did not
  const char* why;
};
const KnownError kKnownErrors[] = {
    {"not implemented for '", nullptr,
     "deliberate: kiln computes floating ops of integral and bool inputs in float32, and reduces "
     "bool tensors, where libtorch has no kernel for them"},
    {"must have the same dtype", nullptr, "deliberate: kiln promotes the operands of a GEMM"},
    {"expected scalar type", nullptr, "deliberate: kiln promotes the operands of a GEMM"},
    {"expected both vectors to have same dtype", nullptr,
     "deliberate: kiln promotes the operands of a GEMM (matmul of two vectors, libtorch's dot)"},
    {"std and var only support floating point", nullptr,
     "deliberate: kiln computes var/std of integral inputs in float32"},
    {"This view is the output of a function that returns multiple views", nullptr,
     "deliberate: kiln differentiates in-place writes to a view made by chunk/split, which "
     "libtorch forbids"},
    {"view size is not compatible with input tensor's size and stride", nullptr,
     "deliberate: kiln's elementwise results are contiguous; libtorch's follow a permuted "
     "input's layout, which view() may not be able to address"},
    {"Boolean alpha only supported", nullptr, "deliberate: kiln accepts a bool alpha"},
    {"LinalgSolveExBackward0 returned an invalid gradient", nullptr,
     "deliberate: libtorch 1.13's linalg.solve backward fails for a vector B of A's shape "
     "without its last dim (B [1, 1] with A [1, 1, 1], seed 7220472918233607694); kiln "
     "differentiates it"},
    {"derivative for aten::floor_divide is not implemented", nullptr,
     "deliberate: kiln's floor_divide has div(a, b, \"floor\")'s gradient, 0"},
    {"modified by an inplace operation", nullptr,
     "deliberate: kiln's backward saves fewer tensors, so fewer in-place writes invalidate it"},
    {nullptr, "saved by copysign",
     "deliberate: kiln's copysign saves its sign operand (its gradient reads the sign bits; "
     "libtorch saves the result), so an in-place write to it before backward raises"},
    {nullptr, "saved by cross_entropy",
     "deliberate: kiln's cross_entropy saves its logits (it never writes libtorch's saved "
     "log_softmax output), so an in-place write to the logits before backward raises"},
    {"more than one element of the written-to tensor refers to a single memory location", nullptr,
     "open: kiln writes in place through an expanded view (its elements share memory), which "
     "libtorch refuses"},
    {nullptr, "not supported for bool tensors",
     "open: kiln rejects bool operands of pow, clamp, remainder, fmod and div with a rounding "
     "mode, which libtorch promotes"},
    {nullptr, "integers to negative integer powers are not allowed",
     "open: kiln rejects negative integral exponent tensors, which libtorch computes (to 0, 1 or "
     "-1)"},
};
bool known_error(const Outcome& got, const Outcome& want) {
  const std::string& msg = got.error ? got.message : want.message;
  for (const KnownError& k : kKnownErrors) {
    const char* says = got.error ? k.kiln_says : k.torch_says;
    if (says && msg.find(says) != std::string::npos) return true;
  }
  return false;
}

// Compares kiln's outcome in `mode` with `want` (libtorch's, or kiln eager's).
Mismatch compare_outcomes(const Run& r, Mode mode, const Outcome& got, Mode ref,
                          const Outcome& want, const Flags& flags) {
  std::string who = std::string(mode_name(mode)) + " vs " + mode_name(ref);
  if (got.foreign_exception) return {who + ": not a kiln::Error", got.message};
  if (got.leaked_pending > 0)
    return {std::string(mode_name(mode)) + ": pending nodes left alive",
            std::to_string(got.leaked_pending) + " nodes"};
  if (got.error != want.error) {
    if (known_error(got, want)) return {};
    return {who + ": error parity", got.error ? "kiln raised: " + got.message
                                              : "kiln did not raise; torch: " + want.message};
  }
  if (got.error) return {};
  // BEING FIXED (signed-overflow UB in integer kernels, on another branch): integral values are
  // not compared when an integral input holds limits. Delete when that fix lands.
  const bool ints_unreliable = flags.int_specials;
  Tolerance tol;
  tol.exact = ref != Mode::Torch && !(flags.any & kInexact);
  tol.ulps = ref == Mode::Torch ? 512 : 64;
  tol.float32_precision = flags.float32;
  // A transcendental whose result rounds to just below the largest float in one library may
  // overflow in the other (seed 9073048168342238386: sinh(acosh(FLT_MAX)), 3.40281961e38 in
  // kiln, inf in libtorch's vectorized loop).
  tol.overflow_is_infinity = ref == Mode::Torch && (flags.any & kInexact);
  for (size_t k = 0; k < got.values.size() && k < want.values.size(); ++k) {
    Value g = got.values[k], w = want.values[k];
    if (ints_unreliable && !kiln::is_floating_point(w.dtype)) g.i = w.i;
    // Deliberate: an op without integral kernels in libtorch checks no dtype on an empty tensor
    // and returns its input's; kiln's result dtype never depends on the sizes.
    if (ref == Mode::Torch && w.f.empty() && w.i.empty() && g.shape == w.shape &&
        kiln::is_floating_point(g.dtype) && !kiln::is_floating_point(w.dtype))
      continue;
    std::string d = compare(g, w, tol);
    if (!d.empty()) return {who + ": values", "v" + std::to_string(k) + " " + d};
    if (r.grads && ref == Mode::Torch && kiln::is_floating_point(w.dtype) &&
        g.requires_grad != w.requires_grad)
      return {who + ": requires_grad",
              "v" + std::to_string(k) +
                  (g.requires_grad ? " requires grad" : " does not require grad")};
  }
  if (!r.grads) return {};
  Tolerance gtol = tol;
  gtol.ulps *= 4;
  // OPEN (docs/torch-differences.md): a traced backward may sum a value's gradient contributions
  // in another order than the eager engine, so gradients agree within ulps, not bit for bit.
  gtol.exact = false;
  gtol.infinity_is_nan = true;
  gtol.overflow_is_infinity = true;
  for (const Value& g : want.grads)
    for (double v : g.f)
      if (std::isfinite(v)) gtol.min_scale = std::max(gtol.min_scale, std::abs(v));
  // Nor below the gradient of any value: the backward sums terms of that size, which may cancel
  // in every input's gradient (seed 9543046567305424547: 1e30 * sum(selu(softmax(x))), whose
  // gradient is 0 but for the rounding of terms near 1e30: 0.0076 in kiln, 1.7e21 in libtorch).
  gtol.min_scale = std::max(gtol.min_scale, flags.value_grad_scale);
  if (got.grads.size() != want.grads.size())
    return {who + ": gradients", std::to_string(got.grads.size()) + " vs " +
                                     std::to_string(want.grads.size()) + " gradients"};
  for (size_t k = 0; k < got.grads.size(); ++k) {
    std::string d = compare(got.grads[k], want.grads[k], gtol);
    if (!d.empty()) return {who + ": gradients", "d/dx" + std::to_string(k) + " " + d};
  }
  return {};
}

// Runs every mode and returns the first difference.
Mismatch check(const Program& prog, bool grads) {
  Run r{prog, grads};
  Outcome t = run_torch(r);
  std::vector<bool> weigh;
  for (const Value& v : t.values) weigh.push_back(v.requires_grad);
  Flags flags = flags_of(prog, t);
  Outcome eager = run_kiln(r, Mode::Eager, weigh);
  Mismatch m = compare_outcomes(r, Mode::Eager, eager, Mode::Torch, t, flags);
  if (!m.empty()) return m;
  for (Mode mode : {Mode::Lazy, Mode::Traced}) {
    Outcome o = run_kiln(r, mode, weigh);
    m = compare_outcomes(r, mode, o, Mode::Eager, eager, flags);
    if (m.empty()) m = compare_outcomes(r, mode, o, Mode::Torch, t, flags);
    if (!m.empty()) return m;
  }
  return {};
}

// ---------------------------------------------------------------- shrinking
// Drops step k and every step that uses it, renumbering the rest.
Program drop_step(const Program& prog, size_t k) {
  Program out = prog;
  out.steps.clear();
  std::vector<int> renumber(prog.steps.size(), -1);
  std::vector<bool> dropped(prog.steps.size(), false);
  for (size_t s = 0; s < prog.steps.size(); ++s) {
    Step step = prog.steps[s];
    bool uses_dropped = s == k;
    for (ValueId& id : step.args)
      if (id >= 0) {
        if (dropped[static_cast<size_t>(id)])
          uses_dropped = true;
        else
          id = renumber[static_cast<size_t>(id)];
      }
    dropped[s] = uses_dropped;
    if (uses_dropped) continue;
    renumber[s] = static_cast<int>(out.steps.size());
    out.steps.push_back(step);
  }
  return out;
}

// Shrinks a program while it still shows a difference with the same signature.
Program shrink(Program prog, bool grads, const std::string& signature) {
  auto same = [&](const Program& p) { return check(p, grads).signature == signature; };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t k = prog.steps.size(); k-- > 0;) {
      Program smaller = drop_step(prog, k);
      if (!smaller.steps.empty() && smaller.steps.size() < prog.steps.size() && same(smaller)) {
        prog = smaller;
        changed = true;
      }
    }
    for (size_t i = 0; i < prog.inputs.size(); ++i) {
      Program plain = prog;
      if (plain.inputs[i].special) {
        plain.inputs[i].special = false;
        if (same(plain)) prog = plain, changed = true;
      }
      for (size_t d = 0; d < prog.inputs[i].shape.size(); ++d)
        for (int64_t size : {int64_t{1}, prog.inputs[i].shape[d] / 2}) {
          Program smaller = prog;
          if (size >= smaller.inputs[i].shape[d]) continue;
          smaller.inputs[i].shape[d] = size;
          if (same(smaller)) prog = smaller, changed = true;
        }
    }
  }
  return prog;
}

// ---------------------------------------------------------------- printing as C++
std::string literal(double v, kiln::DType dtype) {
  const bool f32 = dtype == kiln::kFloat32;
  if (std::isnan(v)) return "NAN";
  if (std::isinf(v)) return v > 0 ? "INFINITY" : "-INFINITY";
  if (dtype == kiln::kBool) return v != 0 ? "true" : "false";
  if (kiln::is_integral(dtype)) {
    auto i = static_cast<int64_t>(v);
    if (dtype == kiln::kInt32 && i == std::numeric_limits<int32_t>::min()) return "INT32_MIN";
    if (dtype == kiln::kInt64 && i == std::numeric_limits<int64_t>::min()) return "INT64_MIN";
    return std::to_string(i);
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, f32 ? "%.9g" : "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  if (std::signbit(v) && v == 0) s = "-0.0";
  return f32 ? s + "f" : s;
}
const char* cpp_type(kiln::DType t) {
  switch (t) {
    case kiln::kBool:
      return "bool";
    case kiln::kInt32:
      return "int32_t";
    case kiln::kInt64:
      return "int64_t";
    case kiln::kFloat32:
      return "float";
    case kiln::kFloat64:
      return "double";
  }
  return "?";
}
std::string list_str(const std::vector<int64_t>& v) {
  std::string s = "{";
  for (size_t k = 0; k < v.size(); ++k) s += (k ? ", " : "") + std::to_string(v[k]);
  return s + "}";
}
void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}
std::string value_name(ValueId id) {
  return id < 0 ? "x" + std::to_string(input_index(id)) : "v" + std::to_string(id);
}
std::string step_source(const Step& s) {
  std::string src = op_table()[static_cast<size_t>(s.op)].source;
  static const char* reductions[] = {"Reduction::None", "Reduction::Mean", "Reduction::Sum"};
  for (size_t k = 0; k < s.p.i.size(); ++k) {
    std::string ik = "p.i[" + std::to_string(k) + "]";
    int64_t v = s.p.i[k];
    replace_all(src, "kiln_diff::kiln_reduction(" + ik + ")",
                reductions[std::clamp<int64_t>(v, 0, 2)]);
    replace_all(
        src, "B::dtype(" + ik + ")",
        std::string("k") +
            static_cast<char>(std::toupper(kiln::dtype_name(static_cast<kiln::DType>(v))[0])) +
            (kiln::dtype_name(static_cast<kiln::DType>(v)) + 1));
    replace_all(src, ik + " != 0", v ? "true" : "false");
    replace_all(src, ik, std::to_string(v));
  }
  static const kiln::DType kinds[] = {kiln::kInt64, kiln::kFloat64, kiln::kBool};
  for (size_t k = 0; k < s.p.scalars.size(); ++k)
    replace_all(src, "B::scalar(p, " + std::to_string(k) + ")",
                literal(s.p.scalars[k], kinds[static_cast<int>(s.p.scalar_kind)]));
  replace_all(src, "B::none()", "std::nullopt");
  replace_all(src, "p.list", "Shape" + list_str(s.p.list));
  for (size_t k = s.args.size(); k-- > 0;)
    replace_all(src, "a[" + std::to_string(k) + "]", value_name(s.args[k]));
  return src;
}
std::string to_cpp(const Program& prog, bool grads, const Mismatch& m) {
  std::ostringstream os;
  os << "// " << m.signature << ": " << m.detail << "\n";
  os << "// (the values v0.. are compared; gradients are of sum(v_k * w_k) for random w_k)\n";
  std::vector<bool> used(prog.inputs.size(), false);
  for (const Step& s : prog.steps)
    for (ValueId id : s.args)
      if (id < 0) used[input_index(id)] = true;
  for (size_t i = 0; i < prog.inputs.size(); ++i) {
    const Input& in = prog.inputs[i];
    if (!used[i]) continue;
    torch::Tensor t = torch_input(in).to(torch::kFloat64).contiguous();
    os << "Tensor x" << i << " = from_vector(std::vector<" << cpp_type(in.dtype) << ">{";
    for (int64_t k = 0; k < t.numel(); ++k)
      os << (k ? ", " : "") << literal(t.data_ptr<double>()[k], in.dtype);
    os << "}, Shape" << list_str(in.shape) << ")";
    if (grads && kiln::is_floating_point(in.dtype)) os << ".requires_grad_()";
    os << ";\n";
  }
  for (size_t k = 0; k < prog.steps.size(); ++k)
    os << "Tensor v" << k << " = " << step_source(prog.steps[k]) << ";\n";
  return os.str();
}

// ---------------------------------------------------------------- the tests
uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

struct Tally {
  int programs = 0, torch_errors = 0, differences = 0;
};

// A crash (a kiln bug) ends the run; the handler names the program that crashed first, so the
// run does not end silently. Only async-signal-safe calls: the digits are formed by hand.
std::atomic<uint64_t> g_running_seed{0};
void on_crash(int sig) {
  char buf[160];
  size_t n = 0;
  auto put = [&](const char* text) {
    while (*text && n < sizeof buf) buf[n++] = *text++;
  };
  auto put_seed = [&] {
    char digits[24];
    int d = 0;
    for (uint64_t v = g_running_seed.load(); d == 0 || v; v /= 10)
      digits[d++] = static_cast<char>('0' + v % 10);
    while (d > 0 && n < sizeof buf) buf[n++] = digits[--d];
  };
  put("\ntorch_diff: program seed ");
  put_seed();
  put(" crashed; rerun it alone with KILN_DIFF_PROGRAM=");
  put_seed();
  put("\n");
  (void)!write(STDERR_FILENO, buf, n);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}
void name_crashes() {
  static const bool installed = [] {
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(sig, on_crash);
    return true;
  }();
  (void)installed;
}

void check_seed(uint64_t seed, Tally& tally) {
  // KILN_DIFF_VERBOSE=1 names each program first; KILN_DIFF_VERBOSE=2 prints it as C++ too.
  static const uint64_t verbosity = env_u64("KILN_DIFF_VERBOSE", 0);
  static const bool verbose = verbosity >= 1, print_programs = verbosity >= 2;
  if (verbose) std::fprintf(stderr, "torch_diff: program seed %" PRIu64 "\n", seed);
  name_crashes();
  g_running_seed.store(seed);
  bool grads = false;
  Program prog = generate(seed, &grads);
  ++tally.programs;
  if (print_programs)
    std::fprintf(stderr, "%s",
                 to_cpp(prog, grads, {"program " + std::to_string(seed), ""}).c_str());
  Mismatch m = check(prog, grads);
  if (m.empty()) return;
  ++tally.differences;
  Program small = shrink(prog, grads, m.signature);
  Mismatch ms = check(small, grads);
  ADD_FAILURE() << "program seed " << seed << " differs (" << m.signature << ": " << m.detail
                << "); shrunk to:\n"
                << to_cpp(small, grads, ms.empty() ? m : ms);
}

// KILN_DIFF_SKIP=<program seed>[,<program seed>...] leaves programs out (tools/sanitize: a
// difference open under one compiler only).
bool skipped(uint64_t seed) {
  static const std::string skip = [] {
    const char* v = std::getenv("KILN_DIFF_SKIP");
    return "," + std::string(v ? v : "") + ",";
  }();
  return skip.find("," + std::to_string(seed) + ",") != std::string::npos;
}

TEST(TorchDiff, FixedSeed) {
  const uint64_t n = env_u64("KILN_DIFF_PROGRAMS", 300);
  Tally tally;
  for (uint64_t seed = 1; seed <= n; ++seed)
    if (!skipped(seed)) check_seed(seed, tally);
  std::printf("torch_diff: %d programs, %d differences\n", tally.programs, tally.differences);
}

TEST(TorchDiff, FreshSeed) {
  const uint64_t seed =
      env_u64("KILN_DIFF_SEED",
              static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()));
  const double seconds = static_cast<double>(env_u64("KILN_DIFF_SECONDS", 30));
  std::printf("torch_diff: KILN_DIFF_SEED=%" PRIu64 "\n", seed);
  std::fflush(stdout);
  std::mt19937_64 seeds(seed);
  Tally tally;
  // KILN_DIFF_PROGRAM=<program seed> runs that one program (as printed by KILN_DIFF_VERBOSE).
  if (uint64_t one = env_u64("KILN_DIFF_PROGRAM", 0)) return check_seed(one, tally);
  auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds)
    check_seed(seeds(), tally);
  std::printf("torch_diff: %d programs, %d differences\n", tally.programs, tally.differences);
}

}  // namespace
}  // namespace kiln_diff
