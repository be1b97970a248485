// Random sampling with libtorch's names and semantics: randperm, bernoulli, normal and
// multinomial, composed of the random factories (lib/ops/factories.cpp) and sorts, so that they
// draw from kiln's one generator, record lazily and draw anew on every replay of a trace.
#include <cmath>
#include <string>
#include <vector>

#include "kiln/ops.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;

Tensor randperm(int64_t n, TensorOptions options) {
  const char* op = "randperm";
  KILN_CHECK(n >= 0, op, ": n must be non-negative, got ", n);
  const DType dtype = options.dtype_or(kInt64);
  KILN_CHECK(dtype != kBool && (dtype != kFloat32 || n <= (int64_t{1} << 24)), op, ": ", n,
             " values do not fit exactly in ", dtype_name(dtype));
  // The order of n independent uniform keys is a uniform permutation (ties of float64 keys
  // aside, at most n^2 / 2^54 likely).
  const Tensor keys = rand({n}, TensorOptions(kFloat64).device(options.device_));
  return argsort(keys).to(dtype);
}

namespace {
// Uniform numbers in [0, 1) of t's shape, dtype and device.
Tensor uniform_like(const Tensor& t) {
  return rand(t.sizes(), TensorOptions(t.dtype()).device(t.device()));
}
}  // namespace

Tensor bernoulli(const Tensor& p) {
  detail::check_defined(p, "bernoulli");
  KILN_CHECK(p.is_floating_point(), "bernoulli: expected floating-point probabilities, got ",
             describe(p));
  // u < p with u uniform in [0, 1): 1 with probability p (0 never, 1 always).
  return lt(uniform_like(p), p.detach()).to(p.dtype());
}

Tensor bernoulli(const Tensor& x, double p) {
  detail::check_defined(x, "bernoulli");
  KILN_CHECK(p >= 0 && p <= 1, "bernoulli: p must be in [0, 1], got ", p);
  KILN_CHECK(x.is_floating_point(), "bernoulli: expected a floating-point tensor, got ",
             describe(x));
  return lt(uniform_like(x), p).to(x.dtype());
}

// mean + std * z with z standard normal, of the broadcast shape; the gradient reaches mean and
// std through that (torch's normal has none for its operands: a difference kiln keeps, since it
// is the reparameterization users would write).
Tensor normal(const Tensor& mean, const Tensor& std) {
  const char* op = "normal";
  detail::check_defined(mean, op, "mean");
  detail::check_defined(std, op, "std");
  KILN_CHECK(mean.is_floating_point() && std.is_floating_point(), op,
             ": expected floating-point mean and std, got ", describe(mean), " and ",
             describe(std));
  const Shape shape = detail::broadcast_shapes(mean.sizes(), std.sizes(), op);
  const DType dtype = detail::result_type(mean, std);
  const Tensor z = randn(shape, TensorOptions(dtype).device(mean.device()));
  return mean + std * z;
}

Tensor normal(const Tensor& mean, double std) {
  detail::check_defined(mean, "normal", "mean");
  KILN_CHECK(std >= 0, "normal: std must be non-negative, got ", std);
  return normal(mean, full({}, std, TensorOptions(mean.dtype()).device(mean.device())));
}

Tensor normal(double mean, const Tensor& std) {
  detail::check_defined(std, "normal", "std");
  return normal(full({}, mean, TensorOptions(std.dtype()).device(std.device())), std);
}

Tensor normal(double mean, double std, const Shape& size, TensorOptions options) {
  KILN_CHECK(std >= 0, "normal: std must be non-negative, got ", std);
  return randn(size, options) * std + mean;
}

// With replacement: each draw inverts the row's cumulative distribution at a uniform number.
// Without: the first num_samples of an exponential race (the smallest E_i / p_i, E_i standard
// exponential), which samples without replacement in proportion to p.
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement) {
  const char* op = "multinomial";
  detail::check_defined(probs, op, "probs");
  KILN_CHECK(probs.dim() == 1 || probs.dim() == 2, op,
             ": expected a 1-D or 2-D tensor of probabilities, got ", describe(probs));
  KILN_CHECK(probs.is_floating_point(), op, ": expected floating-point probabilities, got ",
             describe(probs));
  const int64_t categories = probs.size(-1);
  KILN_CHECK(num_samples > 0, op, ": num_samples must be positive, got ", num_samples);
  KILN_CHECK(categories > 0, op, ": the distribution has no categories: ", describe(probs));
  KILN_CHECK(replacement || num_samples <= categories, op, ": cannot draw ", num_samples,
             " samples without replacement from ", categories, " categories");
  const Tensor p = probs.detach().dim() == 1 ? probs.detach().unsqueeze(0) : probs.detach();
  {
    // A validity check only, as torch's (the draws do not depend on it): inside jit::trace it
    // checks the example's probabilities and leaves the trace unspecialized.
    detail::ValueCheckScope checking;
    KILN_CHECK(all(logical_and(isfinite(p), ge(p, 0))).item<bool>(), op,
               ": probabilities must be finite and non-negative, got ", describe(probs));
    KILN_CHECK(all(gt(p.sum({1}), 0)).item<bool>(), op,
               ": invalid distribution (a row's probabilities sum to 0) in ", describe(probs));
    KILN_CHECK(replacement || all(ge(ne(p, 0).sum({1}), num_samples)).item<bool>(), op,
               ": cannot draw ", num_samples,
               " samples without replacement from a row with "
               "fewer nonzero probabilities, in ",
               describe(probs));
  }
  const TensorOptions f64 = TensorOptions(kFloat64).device(p.device());
  Tensor samples;
  if (replacement) {
    const Tensor cdf = cumsum(p.to(kFloat64), 1);
    const Tensor total = cdf.narrow(1, categories - 1, 1);
    const Tensor u = rand({p.size(0), num_samples}, f64) * total;
    // The first category whose cumulative sum exceeds u; zero-probability ones are never chosen.
    samples = searchsorted(cdf, u, false, true).clamp_max(categories - 1);
  } else {
    const Tensor race = -log1p(-rand(p.sizes(), f64)) / p.to(kFloat64);  // inf where p is 0
    samples = std::get<1>(topk(race, num_samples, 1, false));
  }
  return probs.dim() == 1 ? samples.squeeze(0) : samples;
}

}  // namespace kiln
