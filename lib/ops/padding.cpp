// torch.nn.functional's pad (constant, reflect, replicate, circular), pixel_shuffle,
// pixel_unshuffle and softmin, composed of narrow, flip, expand, cat, reshape and permute: they
// record lazily, trace and differentiate through those (a reflected element's gradient adds into
// the element it copies, as torch's reflection_pad backward does).
#include <string>
#include <string_view>
#include <vector>

#include "kiln/nn_functional.h"
#include "kiln/ops.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;

Tensor softmin(const Tensor& x, int64_t dim) {
  detail::check_defined(x, "softmin");
  return softmax(-x, dim);
}

namespace {
// x's dim d padded by `before` and `after` elements (negative ones crop) as `mode` says.
Tensor pad_dim(const Tensor& x, int64_t d, int64_t before, int64_t after, std::string_view mode,
               double value) {
  const int64_t n = x.size(d);
  Tensor core = x.narrow(d, std::max<int64_t>(-before, 0),
                         n - std::max<int64_t>(-before, 0) - std::max<int64_t>(-after, 0));
  before = std::max<int64_t>(before, 0);
  after = std::max<int64_t>(after, 0);
  if (before == 0 && after == 0) return core;
  auto block = [&](int64_t count, bool front) -> Tensor {
    Shape shape = core.sizes();
    shape[static_cast<size_t>(d)] = count;
    if (mode == "constant") return full(shape, value, TensorOptions(x.dtype()).device(x.device()));
    if (mode == "replicate") return x.narrow(d, front ? 0 : n - 1, 1).expand(shape);
    if (mode == "reflect") return x.narrow(d, front ? 1 : n - 1 - count, count).flip({d});
    return x.narrow(d, front ? n - count : 0, count);  // circular
  };
  return cat({block(before, true), core, block(after, false)}, d);
}
}  // namespace

Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, std::string_view mode, double value) {
  const char* op = "pad";
  detail::check_defined(x, op);
  KILN_CHECK(pads.size() % 2 == 0 && pads.size() / 2 <= static_cast<size_t>(x.dim()), op,
             ": expected an even number of pads, at most two per dim of ", describe(x), ", got ",
             pads.size());
  KILN_CHECK(mode == "constant" || mode == "reflect" || mode == "replicate" || mode == "circular",
             op, ": mode must be \"constant\", \"reflect\", \"replicate\" or \"circular\", got \"",
             std::string(mode), "\"");
  const int64_t padded = static_cast<int64_t>(pads.size() / 2);
  if (mode != "constant") {
    KILN_CHECK(padded >= 1 && padded <= 3 && x.dim() >= padded + 1 && x.dim() <= padded + 2, op,
               ": ", std::string(mode), " pads the last 1 to 3 dims of an input with 1 or 2 more ",
               "(batch and channel) dims; got ", padded, " padded dims of ", describe(x));
    KILN_CHECK(value == 0.0, op, ": a value is for mode \"constant\" only, got ", value);
  }
  Tensor out = x;
  for (int64_t i = 0; i < padded; ++i) {
    const int64_t d = x.dim() - 1 - i, n = x.size(d);
    const int64_t before = pads[static_cast<size_t>(2 * i)];
    const int64_t after = pads[static_cast<size_t>(2 * i + 1)];
    KILN_CHECK(n + before + after >= 0 && -before <= n && -after <= n, op, ": pads (", before, ", ",
               after, ") of dim ", d, " leave a negative size for ", describe(x));
    if (mode == "reflect")
      KILN_CHECK(before < n && after < n, op, ": reflect's pads (", before, ", ", after,
                 ") must be smaller than dim ", d, "'s size ", n, " of ", describe(x));
    if (mode == "replicate" || mode == "circular")
      KILN_CHECK(n > 0 || (before <= 0 && after <= 0), op, ": ", std::string(mode),
                 " cannot pad the empty dim ", d, " of ", describe(x));
    if (mode == "circular")
      KILN_CHECK(before <= n && after <= n, op, ": circular's pads (", before, ", ", after,
                 ") must be at most dim ", d, "'s size ", n, " of ", describe(x));
    out = pad_dim(out, d, before, after, mode, value);
  }
  // A new tensor even when nothing was added (crops are views until then), as torch's.
  return out.impl()->storage == x.impl()->storage ? out.clone() : out;
}

namespace {
// The checks shared by pixel_shuffle and pixel_unshuffle: at least 3 dims, a positive factor.
void check_pixels(const char* op, const Tensor& x, int64_t factor) {
  detail::check_defined(x, op);
  KILN_CHECK(x.dim() >= 3, op, ": expected an input of at least 3 dims [..., C, H, W], got ",
             describe(x));
  KILN_CHECK(factor > 0, op, ": the factor must be positive, got ", factor);
}
Shape leading_dims(const Tensor& x) {
  return Shape(x.sizes().begin(), x.sizes().end() - 3);
}
// torch's pixel shuffles return new tensors: a rearrangement that is still a view of x (a factor
// of 1, or sizes of 1 that make it one) is copied, so that writing it never changes x.
Tensor own(const Tensor& rearranged, const Tensor& x) {
  return rearranged.impl()->storage == x.impl()->storage ? rearranged.clone() : rearranged;
}
}  // namespace

Tensor pixel_shuffle(const Tensor& x, int64_t r) {
  const char* op = "pixel_shuffle";
  check_pixels(op, x, r);
  const int64_t c = x.size(-3), h = x.size(-2), w = x.size(-1);
  KILN_CHECK(c % (r * r) == 0, op, ": the channels ", c, " of ", describe(x),
             " are not divisible by upscale_factor^2 = ", r * r);
  const Shape lead = leading_dims(x);
  const int64_t k = static_cast<int64_t>(lead.size());
  Shape split = lead;
  for (int64_t s : {c / (r * r), r, r, h, w}) split.push_back(s);
  std::vector<int64_t> order;
  for (int64_t i = 0; i < k; ++i) order.push_back(i);
  for (int64_t i : {0, 3, 1, 4, 2}) order.push_back(k + i);  // C, H, r, W, r
  Shape out = lead;
  for (int64_t s : {c / (r * r), h * r, w * r}) out.push_back(s);
  return own(x.reshape(split).permute(order).reshape(out), x);
}

Tensor pixel_unshuffle(const Tensor& x, int64_t r) {
  const char* op = "pixel_unshuffle";
  check_pixels(op, x, r);
  const int64_t c = x.size(-3), h = x.size(-2), w = x.size(-1);
  KILN_CHECK(h % r == 0 && w % r == 0, op, ": the height and width of ", describe(x),
             " are not divisible by downscale_factor ", r);
  const Shape lead = leading_dims(x);
  const int64_t k = static_cast<int64_t>(lead.size());
  Shape split = lead;
  for (int64_t s : {c, h / r, r, w / r, r}) split.push_back(s);
  std::vector<int64_t> order;
  for (int64_t i = 0; i < k; ++i) order.push_back(i);
  for (int64_t i : {0, 2, 4, 1, 3}) order.push_back(k + i);  // C, r, r, H, W
  Shape out = lead;
  for (int64_t s : {c * r * r, h / r, w / r}) out.push_back(s);
  return own(x.reshape(split).permute(order).reshape(out), x);
}

}  // namespace kiln
