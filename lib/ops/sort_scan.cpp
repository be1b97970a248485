// Sorting and scans: sort, argsort, topk, cumsum and cumprod.
//
// sort finds the permutation on the host (a stable sort of each line along dim, NaN as the largest
// value, as torch) and gathers the values with gather, so that gradients flow through gather's.
// The permutation depends on the data, so sorting a pending (lazy) tensor makes it concrete.
// cumsum and cumprod are table ops (OpKind::NN, no formula: the fuser leaves them to their own
// kernel), recorded lazily and traced as one node each; floating sums accumulate in double and
// integer ones in int64, as torch's CPU kernels. cumprod's gradient handles zeros as torch's.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/dispatch.h"
#include "lib/lazy.h"
#include "lib/op_registry.h"
#include "lib/op_table.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;

namespace {
// Lines along dim d of a contiguous tensor of `sizes`: outer * inner lines of `size` elements,
// `inner` apart.
struct Lines {
  int64_t outer = 1, size = 1, inner = 1;
  Lines(const Shape& sizes, int64_t d) {
    for (int64_t i = 0; i < static_cast<int64_t>(sizes.size()); ++i) {
      if (i < d) outer *= sizes[i];
      if (i > d) inner *= sizes[i];
    }
    size = sizes.empty() ? 1 : sizes[d];
  }
  int64_t start(int64_t o, int64_t i) const { return o * size * inner + i; }
};

template <typename T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>)
    return v != v;
  else
    return false;
}

// The stable sorting permutation of every line, as int64 indices along dim.
Tensor sort_indices(const Tensor& x, int64_t d, bool descending) {
  const Tensor c = x.to(kCPU).contiguous();
  const Lines lines(x.sizes(), d);
  std::vector<int64_t> out(static_cast<size_t>(x.numel()));
  detail::dispatch_all(c.dtype(), [&](auto tag) {
    using T = KILN_TYPE(tag);
    const T* p = c.data_ptr<T>();
    std::vector<int64_t> perm(static_cast<size_t>(lines.size));
    for (int64_t o = 0; o < lines.outer; ++o) {
      for (int64_t i = 0; i < lines.inner; ++i) {
        const T* line = p + lines.start(o, i);
        auto at = [&](int64_t k) { return line[k * lines.inner]; };
        std::iota(perm.begin(), perm.end(), 0);
        std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
          const T va = at(a), vb = at(b);
          if (descending) return (is_nan(va) && !is_nan(vb)) || va > vb;
          return (!is_nan(va) && is_nan(vb)) || va < vb;
        });
        for (int64_t k = 0; k < lines.size; ++k) out[lines.start(o, i) + k * lines.inner] = perm[k];
      }
    }
  });
  return from_vector(out, x.sizes()).to(x.device());
}
}  // namespace

std::tuple<Tensor, Tensor> sort(const Tensor& x, int64_t dim, bool descending) {
  detail::check_defined(x, "sort");
  if (x.dim() == 0) {
    detail::wrap_dim(dim, 1, "sort", &x);
    return {x.clone(), zeros({}, TensorOptions(kInt64).device(x.device()))};
  }
  const int64_t d = detail::wrap_dim(dim, x.dim(), "sort", &x);
  Tensor indices = sort_indices(x, d, descending);
  return {gather(x, d, indices), indices};
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending) {
  return std::get<1>(sort(x, dim, descending));
}

std::tuple<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim, bool largest,
                                bool sorted) {
  detail::check_defined(x, "topk");
  const int64_t d = detail::wrap_dim(dim, std::max<int64_t>(x.dim(), 1), "topk", &x);
  const int64_t size = x.dim() == 0 ? 1 : x.size(d);
  KILN_CHECK(k >= 0 && k <= size, "topk: k (", k, ") is out of range [0, ", size, "] for dim ", d,
             " of ", describe(x));
  auto [values, indices] = sort(x, d, largest);
  if (x.dim() == 0) return {values, indices};
  (void)sorted;  // always sorted: torch leaves the order unspecified when !sorted
  return {values.narrow(d, 0, k), indices.narrow(d, 0, k)};
}

// ------------------------------------------------------------------------------------------ scans
namespace {
using Inputs = std::vector<Tensor>;

template <bool Product>
Tensor scan_kernel(const Tensor& x, int64_t d) {
  const Tensor c = x.to(kCPU).contiguous();
  Tensor out = detail::make_empty(x.sizes(), x.dtype());
  const Lines lines(x.sizes(), d);
  detail::dispatch_all(c.dtype(), [&](auto tag) {
    using T = KILN_TYPE(tag);
    using Acc = std::conditional_t<std::is_floating_point_v<T>, double,
                                   std::conditional_t<std::is_same_v<T, bool>, bool, int64_t>>;
    const T* p = c.data_ptr<T>();
    T* q = out.data_ptr<T>();
    for (int64_t o = 0; o < lines.outer; ++o) {
      for (int64_t i = 0; i < lines.inner; ++i) {
        Acc acc = Product ? Acc(1) : Acc(0);
        for (int64_t k = 0; k < lines.size; ++k) {
          const int64_t at = lines.start(o, i) + k * lines.inner;
          if constexpr (std::is_same_v<Acc, bool>)
            acc = Product ? (acc && p[at]) : (acc || p[at]);
          else if constexpr (std::is_integral_v<Acc>)  // wraps, as torch's
            acc = static_cast<Acc>(Product ? static_cast<uint64_t>(acc) * uint64_t(p[at])
                                           : static_cast<uint64_t>(acc) + uint64_t(p[at]));
          else
            acc = Product ? acc * Acc(p[at]) : acc + Acc(p[at]);
          q[at] = static_cast<T>(acc);
        }
      }
    }
  });
  return out.to(x.device());
}

Tensor scan(const detail::OpDef& def, const Tensor& x, int64_t dim, std::optional<DType> dtype);

detail::OpHandle cumsum_def;
detail::OpHandle cumprod_def;
}  // namespace

// cumsum's and cumprod's entries.
void registration::register_scans() {
  cumsum_def.bind(detail::register_op({"cumsum",
                                       detail::OpKind::NN,
                                       1,
                                       detail::DTypeRule::Custom,
                                       true,
                                       [](const Inputs& in, const detail::Attrs& a) {
                                         return Inputs{cumsum(in[0], detail::attr_int(a.at(0)))};
                                       },
                                       {"dim"}}));
  cumprod_def.bind(detail::register_op({"cumprod",
                                        detail::OpKind::NN,
                                        1,
                                        detail::DTypeRule::Custom,
                                        true,
                                        [](const Inputs& in, const detail::Attrs& a) {
                                          return Inputs{cumprod(in[0], detail::attr_int(a.at(0)))};
                                        },
                                        {"dim"}}));
}

namespace {

// The reversed cumulative sum along d: sum over k >= i.
Tensor reverse_cumsum(const Tensor& g, int64_t d) {
  return flip(cumsum(flip(g, {d}), d), {d});
}

// d y_k / d x_i = prod over j <= k, j != i of x_j, summed against g over k >= i. Before a line's
// first zero that is y_k / x_i; past it, 0 (the product keeps that zero); at it, the products of
// the line with that zero replaced by 1 (y'), as torch's formula.
Tensor cumprod_grad(const Tensor& g, const Tensor& x, const Tensor& y, int64_t d) {
  const Tensor zero = eq(x, 0);
  const Tensor zeros_so_far = cumsum(zero, d);
  const Tensor before = eq(zeros_so_far, 0);
  const Tensor first_zero = logical_and(zero, eq(zeros_so_far, 1));
  const Tensor y1 = cumprod(where(first_zero, ones_like(x), x), d);
  const Tensor at_first = where(first_zero, reverse_cumsum(g * y1, d), zeros_like(x));
  return where(before, reverse_cumsum(g * y, d) / where(before, x, ones_like(x)), at_first);
}

Tensor scan(const detail::OpDef& def, const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  const char* op = def.name.c_str();
  detail::check_defined(x, op);
  const int64_t d =
      x.dim() == 0 ? (detail::wrap_dim(dim, 1, op, &x), 0) : detail::wrap_dim(dim, x.dim(), op, &x);
  // Integers and bool accumulate in int64 unless told otherwise, as torch.
  const DType target = dtype.value_or(is_floating_point(x.dtype()) ? x.dtype() : kInt64);
  const Tensor in = x.to(target);
  const bool product = &def == &cumprod_def.get();
  Tensor out = detail::should_record(in)
                   ? detail::lazy_record1(def, {in}, {d}, {in.sizes(), target})
               : product ? scan_kernel<true>(in, d)
                         : scan_kernel<false>(in, d);
  if (detail::needs_grad(in)) {
    if (!product) {
      detail::record(op, {in}, {out}, {}, [d](const detail::BackwardContext& c) {
        const Tensor& g = c.grad();
        return std::vector<Tensor>{g.dim() == 0 ? g : reverse_cumsum(g, d)};
      });
    } else {
      detail::record(op, {in}, {out}, {in, out}, [d](const detail::BackwardContext& c) {
        const Tensor &g = c.grad(), &x = c.saved(0), &y = c.saved(1);
        return std::vector<Tensor>{g.dim() == 0 ? g : cumprod_grad(g, x, y, d)};
      });
    }
  }
  return out;
}
}  // namespace

Tensor cumsum(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  return scan(cumsum_def, x, dim, dtype);
}
Tensor cumprod(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  return scan(cumprod_def, x, dim, dtype);
}

}  // namespace kiln
