// Sorting and scans: sort, argsort, topk, cumsum, cumprod, cummax, cummin and logcumsumexp.
//
// sort finds the permutation on the host (a stable sort of each line along dim, NaN as the largest
// value, as torch: a radix sort of keys that order as the values do) and gathers the values with
// gather, so that gradients flow through gather's. The permutation is a table op ("sort_indices",
// OpKind::NN), recorded lazily and traced: a replay sorts its own values. The scans are table ops
// (OpKind::NN, no formula: the fuser leaves them to their own kernel), recorded lazily and traced
// as one node each (cummax and cummin with two outputs, the values and their indices); floating
// sums accumulate in double and integer ones in int64, as torch's CPU kernels, and logcumsumexp
// accumulates in double. cumprod's gradient handles zeros as torch's; cummax's and cummin's scatter
// the gradient to the indices; logcumsumexp's is torch's, computed in log space with g split by
// sign so that it neither overflows nor underflows.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/dispatch.h"
#include "lib/lazy.h"
#include "lib/op_registry.h"
#include "lib/op_table.h"
#include "lib/parallel.h"
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

// Calls f(first) for the index of each line's first element, lines spread over the thread pool
// (f must not throw: it runs inside an OpenMP region).
template <typename F>
void for_each_line(const Lines& lines, const F& f) {
  const int64_t grain =
      std::max<int64_t>(detail::kParallelGrain / std::max<int64_t>(lines.size, 1), 1);
  detail::parallel_for(lines.outer * lines.inner, grain, [&](int64_t begin, int64_t end) {
    for (int64_t l = begin; l < end; ++l) f(lines.start(l / lines.inner, l % lines.inner));
  });
}

template <typename T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>)
    return v != v;
  else
    return false;
}

// A sort key: an unsigned integer whose order is the sort's (NaN the largest value, -0 equal to
// +0; reversed for descending), so that a stable sort of the keys is the stable sort of the values.
template <typename T>
using KeyOf = std::conditional_t<sizeof(T) <= 4, uint32_t, uint64_t>;

template <typename T>
KeyOf<T> sort_key(T v, bool descending) {
  using K = KeyOf<T>;
  K key;
  if constexpr (std::is_floating_point_v<T>) {
    // The bits, sign-magnitude made monotone: negatives reversed below the positives.
    const K sign = K(1) << (sizeof(K) * 8 - 1);
    K bits;
    const T value = v == T(0) ? T(0) : v;
    std::memcpy(&bits, &value, sizeof bits);
    key = v != v ? ~K(0) : (bits & sign) ? ~bits : (bits | sign);
  } else if constexpr (std::is_same_v<T, bool>) {
    key = v;
  } else {
    using U = std::make_unsigned_t<T>;
    key = K(U(v) ^ (U(1) << (sizeof(U) * 8 - 1)));  // two's complement, offset to unsigned
  }
  return descending ? K(~key) : key;
}

// The stable sorting permutation of keys, in order: a least-significant-digit radix sort by bytes
// (the bytes every key shares skipped), or for short lines a comparison sort.
template <typename K>
void stable_order(std::vector<K>& keys, std::vector<int64_t>& order) {
  const size_t n = keys.size();
  std::iota(order.begin(), order.end(), 0);
  if (n < 64) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });
    return;
  }
  std::vector<K> next_keys(n);
  std::vector<int64_t> next_order(n);
  for (unsigned shift = 0; shift < sizeof(K) * 8; shift += 8) {
    size_t start[257] = {};
    for (K k : keys) ++start[((k >> shift) & 0xFF) + 1];
    if (start[((keys[0] >> shift) & 0xFF) + 1] == n) continue;  // one byte value: order kept
    for (int b = 0; b < 256; ++b) start[b + 1] += start[b];
    for (size_t i = 0; i < n; ++i) {
      const size_t at = start[(keys[i] >> shift) & 0xFF]++;
      next_keys[at] = keys[i];
      next_order[at] = order[i];
    }
    keys.swap(next_keys);
    order.swap(next_order);
  }
}

// The stable sorting permutation of every line, as int64 indices along dim. Lines of up to 64K
// elements run on the thread pool (their buffers are small); longer ones one after another.
Tensor sort_indices(const Tensor& x, int64_t d, bool descending) {
  const Tensor c = x.to(kCPU).contiguous();
  const Lines lines(x.sizes(), d);
  Tensor out = detail::make_empty(x.sizes(), kInt64);
  int64_t* indices = out.data_ptr<int64_t>();
  detail::dispatch_all(c.dtype(), [&](auto tag) {
    using T = KILN_TYPE(tag);
    const T* p = c.data_ptr<T>();
    auto sort_line = [&](int64_t first) {
      std::vector<KeyOf<T>> keys(static_cast<size_t>(lines.size));
      std::vector<int64_t> order(keys.size());
      for (int64_t k = 0; k < lines.size; ++k)
        keys[k] = sort_key(p[first + k * lines.inner], descending);
      stable_order(keys, order);
      for (int64_t k = 0; k < lines.size; ++k) indices[first + k * lines.inner] = order[k];
    };
    if (lines.size <= (int64_t{1} << 16)) return for_each_line(lines, sort_line);
    for (int64_t o = 0; o < lines.outer; ++o)
      for (int64_t i = 0; i < lines.inner; ++i) sort_line(lines.start(o, i));
  });
  return out.to(x.device());
}

detail::OpHandle sort_indices_def;
}  // namespace

std::tuple<Tensor, Tensor> sort(const Tensor& x, int64_t dim, bool descending) {
  detail::check_defined(x, "sort");
  if (x.dim() == 0) {
    detail::wrap_dim(dim, 1, "sort", &x);
    return {x.clone(), zeros({}, TensorOptions(kInt64).device(x.device()))};
  }
  const int64_t d = detail::wrap_dim(dim, x.dim(), "sort", &x);
  const Tensor keys = x.detach();
  const Tensor indices =
      detail::should_record(keys)
          ? detail::lazy_record1(sort_indices_def, {keys}, {d, descending}, {x.sizes(), kInt64})
          : sort_indices(keys, d, descending);
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

enum class Scan { Sum, Prod, LogSumExp };

// log(e^a + e^b) of two running values, a itself where both are the same infinity (and NaN where
// either is NaN).
double log_add_exp(double a, double b) {
  if (a != a || b != b) return a + b;
  if (a == b && std::isinf(a)) return a;
  return std::max(a, b) + std::log1p(std::exp(-std::abs(a - b)));
}

// cumsum, cumprod or logcumsumexp of each line along d, in x's dtype.
template <Scan kind>
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
    constexpr bool product = kind == Scan::Prod;
    constexpr bool log_sum = kind == Scan::LogSumExp && std::is_floating_point_v<T>;
    for_each_line(lines, [&](int64_t first) {
      Acc acc = product ? Acc(1) : Acc(0);
      if constexpr (log_sum) acc = -std::numeric_limits<double>::infinity();
      for (int64_t k = 0; k < lines.size; ++k) {
        const int64_t at = first + k * lines.inner;
        if constexpr (log_sum)
          acc = log_add_exp(acc, double(p[at]));
        else if constexpr (std::is_same_v<Acc, bool>)
          acc = product ? (acc && p[at]) : (acc || p[at]);
        else if constexpr (std::is_integral_v<Acc>)  // wraps, as torch's
          acc = static_cast<Acc>(product ? static_cast<uint64_t>(acc) * uint64_t(p[at])
                                         : static_cast<uint64_t>(acc) + uint64_t(p[at]));
        else
          acc = product ? acc * Acc(p[at]) : acc + Acc(p[at]);
        q[at] = static_cast<T>(acc);
      }
    });
  });
  return out.to(x.device());
}

// The running maximum (minimum) of each line along d and the index where it was reached, as
// torch's: a NaN replaces anything, nothing but a NaN replaces a NaN, and equal values move the
// index on.
template <bool largest>
Inputs extreme_kernel(const Tensor& x, int64_t d) {
  const Tensor c = x.to(kCPU).contiguous();
  Tensor values = detail::make_empty(x.sizes(), x.dtype());
  Tensor indices = detail::make_empty(x.sizes(), kInt64);
  const Lines lines(x.sizes(), d);
  detail::dispatch_all(c.dtype(), [&](auto tag) {
    using T = KILN_TYPE(tag);
    const T* p = c.data_ptr<T>();
    T* v = values.data_ptr<T>();
    int64_t* index = indices.data_ptr<int64_t>();
    for_each_line(lines, [&](int64_t first) {
      T best{};
      int64_t best_at = 0;
      for (int64_t k = 0; k < lines.size; ++k) {
        const int64_t at = first + k * lines.inner;
        const T value = p[at];
        if (k == 0 || is_nan(value) || (!is_nan(best) && (largest ? value >= best : value <= best)))
          best = value, best_at = k;
        v[at] = best;
        index[at] = best_at;
      }
    });
  });
  return {values.to(x.device()), indices.to(x.device())};
}

Tensor scan(const detail::OpDef& def, const Tensor& x, int64_t dim, std::optional<DType> dtype);
Tensor log_scan(const Tensor& x, int64_t dim);
std::tuple<Tensor, Tensor> extreme_scan(const detail::OpDef& def, const Tensor& x, int64_t dim);

detail::OpHandle cumsum_def, cumprod_def, logcumsumexp_def, cummax_def, cummin_def;
}  // namespace

// The scans' entries.
void registration::register_scans() {
  sort_indices_def.bind(detail::register_op(
      {"sort_indices",
       detail::OpKind::NN,
       1,
       detail::DTypeRule::Custom,
       true,
       [](const Inputs& in, const detail::Attrs& a) {
         return Inputs{sort_indices(in[0], detail::attr_int(a.at(0)), detail::attr_bool(a.at(1)))};
       },
       {"dim", "descending"}}));
  auto def = [](const char* name, detail::Invoke invoke) {
    return &detail::register_op(
        {name, detail::OpKind::NN, 1, detail::DTypeRule::Custom, true, std::move(invoke), {"dim"}});
  };
  cumsum_def.bind(*def("cumsum", [](const Inputs& in, const detail::Attrs& a) {
    return Inputs{cumsum(in[0], detail::attr_int(a.at(0)))};
  }));
  cumprod_def.bind(*def("cumprod", [](const Inputs& in, const detail::Attrs& a) {
    return Inputs{cumprod(in[0], detail::attr_int(a.at(0)))};
  }));
  logcumsumexp_def.bind(*def("logcumsumexp", [](const Inputs& in, const detail::Attrs& a) {
    return Inputs{logcumsumexp(in[0], detail::attr_int(a.at(0)))};
  }));
  cummax_def.bind(*def("cummax", [](const Inputs& in, const detail::Attrs& a) {
    auto [values, indices] = cummax(in[0], detail::attr_int(a.at(0)));
    return Inputs{values, indices};
  }));
  cummin_def.bind(*def("cummin", [](const Inputs& in, const detail::Attrs& a) {
    auto [values, indices] = cummin(in[0], detail::attr_int(a.at(0)));
    return Inputs{values, indices};
  }));
}

namespace {

Tensor reverse(const Tensor& x, int64_t d) {
  return flip(x, {d});
}

// The reversed cumulative sum along d: sum over k >= i.
Tensor reverse_cumsum(const Tensor& g, int64_t d) {
  return reverse(cumsum(reverse(g, d), d), d);
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

// d y_k / d x_i = e^(x_i - y_k) for k >= i: the gradient sum_{k >= i} g_k e^(x_i - y_k) is
// e^(x_i + log sum_{k >= i} e^(log g_k - y_k)), taken apart for g's positive and negative parts.
// Where a part is not positive its log is the dtype's lowest finite value, not -inf, as torch's:
// -inf - y would be NaN where y is -inf, and the second derivative through the part's own
// logcumsumexp would be NaN. A NaN in g is in neither part: it is dropped, as by torch's formula
// (carrying it to the elements before it would be the IEEE reading; kept torch's for parity).
Tensor logcumsumexp_grad(const Tensor& g, const Tensor& x, const Tensor& y, int64_t d) {
  const double lowest = g.dtype() == kFloat64 ? std::numeric_limits<double>::lowest()
                                              : double(std::numeric_limits<float>::lowest());
  auto log_part = [&](const Tensor& part) {
    const Tensor positive = gt(part, 0);
    const Tensor logs = where(positive, log(where(positive, part, 1.0)), lowest);
    return reverse(logcumsumexp(reverse(logs - y, d), d), d);
  };
  return exp(x + log_part(g)) - exp(x + log_part(-g));
}

// The line dim (0 for a 0-dim x, which is its own line) of x, checked.
int64_t scan_dim(const Tensor& x, int64_t dim, const char* op) {
  detail::check_defined(x, op);
  return x.dim() == 0 ? (detail::wrap_dim(dim, 1, op, &x), 0)
                      : detail::wrap_dim(dim, x.dim(), op, &x);
}

Tensor scan(const detail::OpDef& def, const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  const char* op = def.name.c_str();
  const int64_t d = scan_dim(x, dim, op);
  // Integers and bool accumulate in int64 unless told otherwise, as torch.
  const DType target = dtype.value_or(is_floating_point(x.dtype()) ? x.dtype() : kInt64);
  const Tensor in = x.to(target);
  const bool product = &def == &cumprod_def.get();
  Tensor out = detail::should_record(in)
                   ? detail::lazy_record1(def, {in}, {d}, {in.sizes(), target})
               : product ? scan_kernel<Scan::Prod>(in, d)
                         : scan_kernel<Scan::Sum>(in, d);
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

Tensor log_scan(const Tensor& x, int64_t dim) {
  const char* op = "logcumsumexp";
  const int64_t d = scan_dim(x, dim, op);
  KILN_CHECK(x.is_floating_point(), op, ": expected a floating-point input, got ", describe(x));
  Tensor out = detail::should_record(x)
                   ? detail::lazy_record1(logcumsumexp_def, {x}, {d}, {x.sizes(), x.dtype()})
                   : scan_kernel<Scan::LogSumExp>(x, d);
  if (detail::needs_grad(x))
    detail::record(op, {x}, {out}, {x, out}, [d](const detail::BackwardContext& c) {
      const Tensor &g = c.grad(), &x = c.saved(0), &y = c.saved(1);
      return std::vector<Tensor>{g.dim() == 0 ? g : logcumsumexp_grad(g, x, y, d)};
    });
  return out;
}

std::tuple<Tensor, Tensor> extreme_scan(const detail::OpDef& def, const Tensor& x, int64_t dim) {
  const int64_t d = scan_dim(x, dim, def.name.c_str());
  const bool largest = &def == &cummax_def.get();
  std::vector<Tensor> out;
  if (detail::should_record(x)) {
    std::vector<detail::LazyType> types{{x.sizes(), x.dtype()}, {x.sizes(), kInt64}};
    out = detail::lazy_record(def, {x}, {d}, std::move(types));
  } else {
    out = largest ? extreme_kernel<true>(x, d) : extreme_kernel<false>(x, d);
  }
  if (detail::needs_grad(x))
    // Each g to the element its value came from (summed where several share one), as torch's.
    detail::record(def.name.c_str(), {x}, {out[0]}, {out[1]},
                   [d, shape = x.sizes()](const detail::BackwardContext& c) {
                     const Tensor &g = c.grad(), &indices = c.saved(0);
                     if (g.dim() == 0) return std::vector<Tensor>{g};
                     const Tensor zero = zeros(shape, TensorOptions(g.dtype()).device(g.device()));
                     return std::vector<Tensor>{scatter_add(zero, d, indices, g)};
                   });
  return {out[0], out[1]};
}
}  // namespace

Tensor cumsum(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  return scan(cumsum_def, x, dim, dtype);
}
Tensor cumprod(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  return scan(cumprod_def, x, dim, dtype);
}
Tensor logcumsumexp(const Tensor& x, int64_t dim) {
  return log_scan(x, dim);
}
std::tuple<Tensor, Tensor> cummax(const Tensor& x, int64_t dim) {
  return extreme_scan(cummax_def, x, dim);
}
std::tuple<Tensor, Tensor> cummin(const Tensor& x, int64_t dim) {
  return extreme_scan(cummin_def, x, dim);
}

}  // namespace kiln
