// Neural-network ops: softmax, log_softmax, layer_norm, the losses and dropout, with row kernels.
//
// softmax and log_softmax work on a contiguous copy of the input (no copy when it already is one)
// viewed as [outer, D, inner], D being the reduced dim. When inner == 1 every row is contiguous and
// is processed while it sits in cache: a max pass, an exp-and-sum pass (writing exp(x - max) for
// softmax) and a final pass (scale by 1/sum, or x - max - log(sum)), rows split across threads.
// When inner > 1 a task takes a block of adjacent columns (up to kColWidth) and runs the same three
// passes down the D rows, each inner loop over a contiguous row segment, with the running maxima
// and sums in per-task arrays. Wide segments matter: narrow ones touch a new page on every row.
//
// exp is lib/math/primitives.h's (lib/fastmath.h: the one definition every backend uses) rather
// than std::exp: plain arithmetic (Cody-Waite range reduction, a polynomial and an exponent built
// from integer bits), always inlined, so that the loops that call it vectorize, which a call into
// libm prevents. The kernels are also compiled for AVX2 + FMA (target_clones), chosen at load time
// on CPUs that have them; there fmadd is one instruction.
//
// In lazy mode each op validates its arguments at the call and records a node whose kernel is its
// public function. nll_loss and cross_entropy read the target to check its classes first (the
// target alone is materialized when pending); dropout draws its random numbers at the call, in
// program order, and records the node with those draws as an input.
//
// layer_norm normalizes each row of M = prod(normalized_shape) elements: mean, then the biased
// variance around it (both accumulated in double), then one pass writing (x - mean) * rstd * w + b.
//
// The losses of kiln/nn_functional.h other than nll_loss (binary cross entropies, l1, smooth l1,
// huber, kl_div) are compositions of elementwise ops and reductions, recorded and fused as such.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include <omp.h>

#include "kiln/autograd.h"
#include "kiln/nn_functional.h"
#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/dispatch.h"
#include "lib/fastmath.h"
#include "lib/lazy.h"
#include "lib/loops.h"
#include "lib/op_registry.h"
#include "lib/op_table.h"
#include "lib/ops/losses.h"
#include "lib/parallel.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::check_loss_pair;
using detail::describe;
using detail::DTypeRule;
using detail::OpKind;
using detail::reduce_loss;
using detail::shape_str;

namespace {

using Inputs = std::vector<Tensor>;
using detail::Attrs;

const detail::OpDef& def_nn(const char* name, int arity, DTypeRule rule, detail::Invoke invoke,
                            std::vector<std::string> attr_names, const char* formula = nullptr,
                            bool checks_integer_values = false) {
  return detail::register_op({name, OpKind::NN, arity, rule, true, invoke, std::move(attr_names),
                              nullptr, formula, checks_integer_values});
}

// Losses carry their reduction as an int: 0 none, 1 mean, 2 sum.
int64_t reduction_attr(Reduction r) {
  return static_cast<int64_t>(r);
}
Reduction attr_reduction(const detail::AttrValue& a) {
  const int64_t r = detail::attr_int(a);
  KILN_CHECK(r >= 0 && r <= 2,
             "expected a reduction attribute of 0 (none), 1 (mean) or 2 (sum), got ", r);
  return static_cast<Reduction>(r);
}

Tensor dropout_apply(const Tensor& x, const Tensor& draws, double p);

Tensor nll_kernel(const Tensor& log_probs, const Tensor& target, const Tensor& weight,
                  Reduction reduction, int64_t ignore_index, Tensor* total_weight);
detail::OpHandle softmax_def;
detail::OpHandle log_softmax_def;
detail::OpHandle layer_norm_def;
detail::OpHandle nll_loss_def;
detail::OpHandle cross_entropy_def;
detail::OpHandle mse_loss_def;
detail::OpHandle dropout_def;
}  // namespace

// The nn ops' entries.
void registration::register_nn_ops() {
  // softmax and log_softmax: attrs [dim], wrapped. Their formulas (for the fuser, over a row along
  // dim, see OpDef::formula) compute what softmax_row does, with the fuser's exp.
  softmax_def.bind(def_nn(
      "softmax", 1, DTypeRule::Float,
      [](const Inputs& in, const Attrs& a) {
        return Inputs{softmax(in[0], detail::attr_int(a.at(0)))};
      },
      {"dim"}, "(let e (exp (sub x (rmax x))) (mul e (cast (div 1 (rsum (widen e))))))"));
  log_softmax_def.bind(def_nn(
      "log_softmax", 1, DTypeRule::Float,
      [](const Inputs& in, const Attrs& a) {
        return Inputs{log_softmax(in[0], detail::attr_int(a.at(0)))};
      },
      {"dim"}, "(let d (sub x (rmax x)) (sub d (cast (log (rsum (widen (exp d)))))))"));
  // Inputs (x, weight, bias); weight and bias may be absent.
  layer_norm_def.bind(def_nn("layer_norm", 3, DTypeRule::Float,
                             [](const Inputs& in, const Attrs& a) {
                               return Inputs{layer_norm(in[0], detail::attr_ints(a.at(0)), in[1],
                                                        in[2], detail::attr_double(a.at(1)))};
                             },
                             {"normalized_shape", "eps"}));
  // Inputs (log_probs, target, weight); weight may be absent. Outputs (loss, total_weight): as
  // torch's nll_loss_forward, the sum of the weights of the targets not ignored, which divides the
  // mean and which the backward reads.
  nll_loss_def.bind(def_nn(
      "nll_loss", 3, DTypeRule::Custom,
      [](const Inputs& in, const Attrs& a) {
        Tensor total_weight;
        Tensor loss = nll_kernel(in[0], in[1], in[2], attr_reduction(a.at(0)),
                                 detail::attr_int(a.at(1)), &total_weight);
        return Inputs{loss, total_weight};
      },
      {"reduction", "ignore_index"}, nullptr, /*checks_integer_values=*/true));
  // Inputs (logits, target, weight). A composition (log_softmax, then nll_loss, plus the label
  // smoothing term): its pieces record themselves in lazy mode.
  cross_entropy_def.bind(def_nn(
      "cross_entropy", 3, DTypeRule::Custom,
      [](const Inputs& in, const Attrs& a) {
        return Inputs{cross_entropy(in[0], in[1], in[2], attr_reduction(a.at(0)),
                                    detail::attr_int(a.at(1)), detail::attr_double(a.at(2)))};
      },
      {"reduction", "ignore_index", "label_smoothing"}, nullptr, /*checks_integer_values=*/true));
  mse_loss_def.bind(def_nn("mse_loss", 2, DTypeRule::Float,
                           [](const Inputs& in, const Attrs& a) {
                             return Inputs{mse_loss(in[0], in[1], attr_reduction(a.at(0)))};
                           },
                           {"reduction"}));
  // Inputs (x, draws): draws are the float64 uniform numbers dropout drew for x (one per element),
  // so that the node itself is deterministic; the draw happens when dropout is called.
  dropout_def.bind(def_nn("dropout", 2, DTypeRule::Custom,
                          [](const Inputs& in, const Attrs& a) {
                            return Inputs{
                                dropout_apply(in[0], in[1], detail::attr_double(a.at(0)))};
                          },
                          {"p"}));
}

namespace {
void check_input(const Tensor& t, const char* op, const char* arg) {
  detail::check_defined(t, op, arg);
  detail::check_cpu(t, op);
}

// ------------------------------------------------------------------------------- vectorizable exp
// GCC will not if-convert the selects below while floating-point traps are honoured (it sinks
// arithmetic into the branches), which keeps the loops scalar: the kernels are compiled without
// them.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#endif

// The hot row kernels are also compiled for AVX2 + FMA and picked at load time where the CPU has
// them.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define KILN_NN_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define KILN_NN_CLONES
#endif

// ---------------------------------------------------------------------------- softmax kernels
constexpr int64_t kSumBlock = 512;   // a row's exp sum: float partial sums per block, then double
constexpr int64_t kColWidth = 4096;  // columns processed together when the reduced dim is strided
constexpr int64_t kMinColWidth = 64;

// The max of a row of n > 0 elements.
template <typename T>
KILN_MATH_INLINE T row_max(const T* __restrict x, int64_t n) {
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// log_softmax's normalizer of a row of n > 0 elements: its max *m and *log_sum = log(sum(exp(x -
// m))), so that log_softmax(x) = (x - m) - log_sum (cross_entropy reads them without the row).
template <typename T>
KILN_NN_CLONES void log_normalizer_row(const T* __restrict x, int64_t n, T* m, T* log_sum) {
  const T top = row_max(x, n);
  double total = 0;
  for (int64_t b = 0; b < n; b += kSumBlock) {
    const int64_t e = std::min(n, b + kSumBlock);
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = b; i < e; ++i) s += detail::exp_nonpos(x[i] - top);
    total += static_cast<double>(s);
  }
  *m = top;
  *log_sum = static_cast<T>(std::log(total));
}

// One contiguous row of n > 0 elements.
template <typename T, bool Log>
KILN_NN_CLONES void softmax_row(const T* __restrict x, T* __restrict y, int64_t n) {
  if constexpr (Log) {
    T m, ls;
    log_normalizer_row(x, n, &m, &ls);
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - ls;
    return;
  }
  const T m = row_max(x, n);
  double total = 0;
  for (int64_t b = 0; b < n; b += kSumBlock) {
    const int64_t e = std::min(n, b + kSumBlock);
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = b; i < e; ++i) {
      T v = detail::exp_nonpos(x[i] - m);
      y[i] = v;
      s += v;
    }
    total += static_cast<double>(s);
  }
  const T inv = static_cast<T>(1.0 / total);
  for (int64_t i = 0; i < n; ++i) y[i] *= inv;
}

// Columns [0, w) of a [D, stride] block: softmax down each column. m and s are scratch of w
// elements; the rows are streamed three times, each pass over contiguous row segments.
template <typename T, bool Log>
KILN_NN_CLONES void softmax_cols(const T* __restrict x, T* __restrict y, int64_t D, int64_t stride,
                                 int64_t w, T* __restrict m, double* __restrict s) {
  for (int64_t j = 0; j < w; ++j) m[j] = -std::numeric_limits<T>::infinity();
  for (int64_t d = 0; d < D; ++d) {
    const T* xr = x + d * stride;
    for (int64_t j = 0; j < w; ++j) m[j] = xr[j] > m[j] ? xr[j] : m[j];
  }
  for (int64_t j = 0; j < w; ++j) s[j] = 0;
  for (int64_t d = 0; d < D; ++d) {
    const T* xr = x + d * stride;
    T* yr = y + d * stride;
#pragma omp simd
    for (int64_t j = 0; j < w; ++j) {
      T v = detail::exp_nonpos(xr[j] - m[j]);
      if constexpr (!Log) yr[j] = v;
      s[j] += static_cast<double>(v);
    }
  }
  if constexpr (Log) {
    for (int64_t j = 0; j < w; ++j) s[j] = std::log(s[j]);
    for (int64_t d = 0; d < D; ++d) {
      const T* xr = x + d * stride;
      T* yr = y + d * stride;
      for (int64_t j = 0; j < w; ++j) yr[j] = (xr[j] - m[j]) - static_cast<T>(s[j]);
    }
  } else {
    // m is free again: it holds the reciprocal sums.
    for (int64_t j = 0; j < w; ++j) m[j] = static_cast<T>(1.0 / s[j]);
    for (int64_t d = 0; d < D; ++d) {
      T* yr = y + d * stride;
      for (int64_t j = 0; j < w; ++j) yr[j] *= m[j];
    }
  }
}

// x and y contiguous [outer, D, inner], D > 0.
template <typename T, bool Log>
void softmax_kernel(const T* x, T* y, int64_t outer, int64_t D, int64_t inner) {
  if (inner == 1) {
    detail::parallel_for(outer, std::max<int64_t>(1, detail::kParallelGrain / D),
                         [&](int64_t b, int64_t e) {
                           for (int64_t r = b; r < e; ++r)
                             softmax_row<T, Log>(x + r * D, y + r * D, D);
                         });
    return;
  }
  // Tasks of [D, width] columns. Wide row segments stream well (narrow ones touch a new page per
  // row); the width shrinks only to give every thread a task.
  const bool nested = omp_in_parallel();
  const int64_t threads = nested ? 1 : omp_get_max_threads();
  int64_t width = std::min(inner, kColWidth);
  while (width > kMinColWidth && outer * ((inner + width - 1) / width) < threads &&
         outer * D * inner >= detail::kParallelGrain)
    width = std::max(kMinColWidth, (width / 2 + 15) / 16 * 16);
  const int64_t blocks = (inner + width - 1) / width;
  // Scratch for each thread, allocated here: nothing may throw inside the parallel region.
  std::vector<T> maxima(threads * width);
  std::vector<double> sums(threads * width);
  detail::parallel_for(outer * blocks, std::max<int64_t>(1, detail::kParallelGrain / (D * width)),
                       [&](int64_t b, int64_t e) {
                         const int64_t slot = nested ? 0 : omp_get_thread_num();
                         T* m = maxima.data() + slot * width;
                         double* s = sums.data() + slot * width;
                         for (int64_t task = b; task < e; ++task) {
                           const int64_t o = task / blocks, j0 = (task % blocks) * width;
                           const int64_t off = o * D * inner + j0;
                           softmax_cols<T, Log>(x + off, y + off, D, inner,
                                                std::min(width, inner - j0), m, s);
                         }
                       });
}

Tensor softmax_impl(const detail::OpDef& def, const Tensor& x, int64_t dim, bool log) {
  const char* op = def.name.c_str();
  check_input(x, op, "input");
  const int64_t d = detail::wrap_dim(dim, x.dim(), op, &x);
  const DType compute = to_floating(x.dtype());
  if (detail::should_record(x)) return detail::lazy_record1(def, {x}, {d}, {x.sizes(), compute});
  Tensor out = detail::make_empty(x.sizes(), compute);
  if (out.numel() == 0) return out;
  Tensor in = x.to(compute).contiguous();
  const int64_t D = x.dim() == 0 ? 1 : x.size(d);
  int64_t inner = 1;
  for (int64_t i = d + 1; i < x.dim(); ++i) inner *= x.size(i);
  const int64_t outer = out.numel() / (D * inner);
  detail::dispatch_floating(compute, op, [&](auto tag) {
    using T = KILN_TYPE(tag);
    const T* xp = std::as_const(in).data_ptr<T>();
    T* yp = out.data_ptr<T>();
    if (log)
      softmax_kernel<T, true>(xp, yp, outer, D, inner);
    else
      softmax_kernel<T, false>(xp, yp, outer, D, inner);
  });
  return out;
}

// softmax: y (g - sum(g y)); log_softmax: g - exp(y) sum(g), both along the dim.
Tensor softmax_with_grad(const detail::OpDef& def, const Tensor& x, int64_t dim, bool log) {
  Tensor out = softmax_impl(def, x, dim, log);
  if (detail::needs_grad(x)) {
    const int64_t d = x.dim() == 0 ? 0 : detail::wrap_dim(dim, x.dim(), def.name.c_str(), &x);
    std::vector<int64_t> dims;
    if (x.dim() > 0) dims.push_back(d);
    detail::record(def.name.c_str(), {x}, {out}, {out},
                   [dims, log](const detail::BackwardContext& c) {
                     const Tensor &g = c.grad(), &y = c.saved(0);
                     if (log) return std::vector<Tensor>{g - exp(y) * sum(g, dims, true)};
                     return std::vector<Tensor>{y * (g - sum(g * y, dims, true))};
                   });
  }
  return out;
}

// ---------------------------------------------------------------------------- layer_norm kernel
// A row's statistics: the mean and the biased variance, accumulated in double.
struct RowStats {
  double mean;
  double var;
};

// The statistics of one row of n > 0 elements.
template <typename T>
KILN_NN_CLONES RowStats layer_norm_row_stats(const T* __restrict x, int64_t n) {
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]);
  const double mean = sum / static_cast<double>(n);
  double sq = 0;
#pragma omp simd reduction(+ : sq)
  for (int64_t i = 0; i < n; ++i) {
    double c = static_cast<double>(x[i]) - mean;
    sq += c * c;
  }
  return {mean, sq / static_cast<double>(n)};
}

// One row of n > 0 elements; w and b may be null; the row's statistics go to *stats when given
// (for the backward). The mean and 1 / sqrt(var + eps) are rounded to T, then (x - mean) * rstd.
template <typename T>
KILN_NN_CLONES void layer_norm_row(const T* __restrict x, T* __restrict y, int64_t n,
                                   const T* __restrict w, const T* __restrict b, double eps,
                                   RowStats* stats) {
  const RowStats s = layer_norm_row_stats(x, n);
  if (stats) *stats = s;
  const T mu = static_cast<T>(s.mean);
  const T rstd = static_cast<T>(1.0 / std::sqrt(s.var + eps));
  if (w && b) {
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mu) * rstd * w[i] + b[i];
  } else if (w) {
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mu) * rstd * w[i];
  } else if (b) {
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mu) * rstd + b[i];
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mu) * rstd;
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

// The statistics of x's rows as layer_norm_row_stats computes them (float64, kept dims): what the
// forward saves for its backward. Reductions, so a fused forward writes them as row values.
struct LayerNormStats {
  Tensor mean;
  Tensor var;
};

// The statistics composed of ops: the forward in lazy mode and on devices, and a backward that is
// differentiated again (create_graph), which needs them as functions of x.
LayerNormStats layer_norm_stats(const Tensor& x, const std::vector<int64_t>& dims) {
  const Tensor wide = x.to(kFloat64);
  const Tensor mu = mean(wide, dims, true);
  const Tensor centered = wide - mu;
  return {mu, mean(centered * centered, dims, true)};
}

// x (floating) normalized by its rows' statistics as layer_norm_row does: xhat = (x - mean) * rstd
// with the mean and rstd = 1 / sqrt(var + eps) rounded to x's type.
struct LayerNormed {
  Tensor xhat;
  Tensor rstd;
};
LayerNormed layer_norm_normalize(const Tensor& x, const LayerNormStats& s, double eps) {
  const Tensor rstd = (1.0 / sqrt(s.var + eps)).to(x.dtype());
  return {(x - s.mean.to(x.dtype())) * rstd, rstd};
}

// xhat * weight + bias (either may be absent), in xhat's type.
Tensor layer_norm_affine(const Tensor& xhat, const Tensor& weight, const Tensor& bias) {
  Tensor y = xhat;
  if (weight.defined()) y = y * weight.to(xhat.dtype());
  if (bias.defined()) y = y + bias.to(xhat.dtype());
  return y;
}

// --------------------------------------------------------------------------------- nll helpers
// The checked geometry of a (log_probs or logits, target) pair: input [N, C, K...] or [C].
struct NllGeometry {
  int64_t N = 1, C = 0, K = 1;
  Shape out_shape;  // the target's shape: the unreduced loss
  Tensor target;    // int64, contiguous
};

// Each target must be a class in [0, C) or ignore_index.
NllGeometry check_nll(const char* op, const Tensor& input, const Tensor& target,
                      int64_t ignore_index) {
  check_input(input, op, "input");
  check_input(target, op, "target");
  KILN_CHECK(input.dim() >= 1, op, ": expected input of shape [C], [N, C] or [N, C, d1, ...], got ",
             describe(input));
  KILN_CHECK(target.dtype() == kInt64 || target.dtype() == kInt32, op,
             ": expected target of integer class indices (int64 or int32), got ", describe(target));
  NllGeometry g;
  if (input.dim() == 1) {
    g.C = input.size(0);
    KILN_CHECK(target.dim() == 0, op, ": for input ", describe(input),
               " of shape [C] the target must be 0-dim, got ", describe(target));
  } else {
    g.N = input.size(0);
    g.C = input.size(1);
    Shape expected{g.N};
    for (int64_t i = 2; i < input.dim(); ++i) {
      expected.push_back(input.size(i));
      g.K *= input.size(i);
    }
    KILN_CHECK(target.sizes() == expected, op, ": expected target of shape ", shape_str(expected),
               " for input ", describe(input), ", got ", describe(target));
  }
  g.out_shape = target.sizes();
  g.target = target.to(kInt64).contiguous();
  detail::ValueCheckScope checking;
  detail::MaterializeCause cause(op);
  // Checked on the host: a device target's values are copied over first.
  const Tensor host_target = g.target.to(kCPU);
  const int64_t* t = std::as_const(host_target).data_ptr<int64_t>();
  const int64_t count = host_target.numel();
  for (int64_t i = 0; i < count; ++i) {
    KILN_CHECK((t[i] >= 0 && t[i] < g.C) || t[i] == ignore_index, op, ": target ", t[i],
               " is out of bounds for ", g.C, " classes (input ", describe(input), ", target ",
               describe(target), ", ignore_index ", ignore_index, ")");
  }
  return g;
}

// weight, when given, holds one floating-point number per class.
void check_class_weight(const char* op, const Tensor& weight, const Tensor& input, int64_t C) {
  if (!weight.defined()) return;
  KILN_CHECK(weight.dim() == 1 && weight.size(0) == C && weight.is_floating_point(), op,
             ": expected a floating-point weight of shape [", C, "] (one per class) for input ",
             describe(input), ", got ", describe(weight));
  KILN_CHECK(weight.device() == input.device(), op, ": expected weight on the input's device ",
             input.device().str(), ", got ", describe(weight), " on ", weight.device().str());
}

// The shape that puts a [C] tensor along the class dim of an input of `rank` dims.
Shape class_view(int64_t rank, int64_t C) {
  Shape shape(static_cast<size_t>(rank), 1);
  shape[rank == 1 ? 0 : 1] = C;
  return shape;
}

// Where each position [N, C, K...] holds its target's class (and the target is not ignored).
Tensor target_hits(const Tensor& target, int64_t rank, int64_t C, int64_t ignore_index) {
  const Tensor classes = arange(C, target.device()).view(class_view(rank, C));
  const Tensor t = rank == 1 ? target : target.unsqueeze(1);
  Tensor hit = eq(classes, t);
  // An ignore_index outside [0, C) never equals a class: only one inside needs the mask.
  if (ignore_index >= 0 && ignore_index < C) hit = logical_and(hit, ne(t, ignore_index));
  return hit;
}

struct NllResult {
  Tensor loss, total_weight;  // total_weight: the sum of the weights of the targets not ignored
};

// nll_loss with its gradient: minus the (weighted, scaled) output gradient at each target's class.
NllResult nll_with_grad(const Tensor& log_probs, const NllGeometry& geo, const Tensor& weight,
                        Reduction reduction, int64_t ignore_index) {
  NllResult r;
  const DType compute = to_floating(log_probs.dtype());
  const int64_t rank = log_probs.dim(), C = geo.C;
  if (log_probs.device().is_cuda()) {
    // Composed for the device's fuser: each target's log-probability as the sum over the classes
    // of where(class == target, lp, 0) (exact: one value and zeros), so that the pick joins the
    // rows kernel that made lp (log_softmax's, for cross_entropy) and reads no index on the host.
    AutoGradMode kernel_only(false);
    const int64_t class_dim = rank == 1 ? 0 : 1;
    const Tensor hit = target_hits(geo.target, rank, C, ignore_index);
    Tensor lp = log_probs.to(compute), weights = hit.to(compute);
    if (weight.defined()) {
      const Tensor w = weight.to(compute).view(class_view(rank, C));
      lp = lp * w;
      weights = where(hit, w, 0.0);
    }
    const Tensor picked = where(hit, lp, 0.0).sum({class_dim});
    // Per row first, so that both sums are reductions of the rows kernel's row values. A target
    // equal to ignore_index weighs nothing even where that index is no class (-100).
    r.total_weight = sum(weights.sum({class_dim}));
    r.loss = reduction == Reduction::Mean ? sum(-picked) / r.total_weight
                                          : reduce_loss(-picked, reduction);
  } else if (detail::should_record({log_probs, geo.target, weight})) {
    // The target was read (bounds-checked) already; it is recorded as the checked int64 copy.
    std::vector<Tensor> out = detail::lazy_record(
        nll_loss_def, {log_probs, geo.target, weight}, {reduction_attr(reduction), ignore_index},
        {{reduction == Reduction::None ? geo.out_shape : Shape{}, compute}, {Shape{}, compute}});
    r.loss = out[0];
    r.total_weight = out[1];
  } else {
    AutoGradMode kernel_only(false);
    r.loss = nll_kernel(log_probs, geo.target, weight, reduction, ignore_index, &r.total_weight);
  }
  if (detail::needs_grad(log_probs)) {
    detail::record(
        "nll_loss", {log_probs}, {r.loss}, {geo.target, weight, r.total_weight},
        [rank, C, reduction, ignore_index](const detail::BackwardContext& c) {
          const Tensor &g = c.grad(), &target = c.saved(0), &weight = c.saved(1);
          Tensor scale = g;
          if (reduction == Reduction::None && rank > 1) scale = g.unsqueeze(1);
          if (reduction == Reduction::Mean) scale = g / c.saved(2);
          Tensor grad = -scale;
          if (weight.defined()) grad = grad * weight.to(grad.dtype()).view(class_view(rank, C));
          return std::vector<Tensor>{where(target_hits(target, rank, C, ignore_index), grad, 0.0)};
        });
  }
  return r;
}

// The reference kernel: the loss of log-probabilities [N, C, K...] (or [C]) at checked int64
// targets, and the total weight into *total_weight. Ignored targets give 0 and weigh nothing.
Tensor nll_kernel(const Tensor& log_probs, const Tensor& target, const Tensor& weight,
                  Reduction reduction, int64_t ignore_index, Tensor* total_weight) {
  const char* op = nll_loss_def->name.c_str();
  check_input(log_probs, op, "input");
  const DType compute = to_floating(log_probs.dtype());
  const Tensor lp = log_probs.to(compute).contiguous();
  const Tensor tg = target.to(kInt64).contiguous();
  const Tensor w = weight.defined() ? weight.to(compute).contiguous() : Tensor();
  const int64_t C = lp.dim() == 1 ? lp.size(0) : lp.size(1);
  const int64_t count = tg.numel();
  int64_t K = 1;  // [N, C, K]: the positions per row
  for (int64_t d = 2; d < lp.dim(); ++d) K *= lp.size(d);
  Tensor out = detail::make_empty(reduction == Reduction::None ? tg.sizes() : Shape{}, compute);
  *total_weight = detail::make_empty({}, compute);
  detail::dispatch_floating(compute, op, [&](auto tag) {
    using T = KILN_TYPE(tag);
    const T* p = lp.data_ptr<T>();
    const T* wp = w.defined() ? w.data_ptr<T>() : nullptr;
    const int64_t* t = tg.data_ptr<int64_t>();
    T* o = out.data_ptr<T>();
    double total = 0, weights = 0;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t n = i / K, k = i % K;
      const bool ignored = t[i] == ignore_index;
      const T wi = ignored ? T(0) : wp ? wp[t[i]] : T(1);
      const T v = ignored ? T(0) : -wi * p[(n * C + t[i]) * K + k];
      if (reduction == Reduction::None) o[i] = v;
      total += static_cast<double>(v);
      weights += static_cast<double>(wi);
    }
    *total_weight->data_ptr<T>() = static_cast<T>(weights);
    // Mean over no weight is 0/0 = NaN, as torch.
    if (reduction != Reduction::None)
      *o = static_cast<T>(reduction == Reduction::Mean ? total / weights : total);
  });
  return out;
}

// dropout's kernel from its draws (float64 uniform numbers shaped like x): x / (1 - p) where the
// draw is below 1 - p, else 0.
Tensor dropout_apply(const Tensor& x, const Tensor& draws, double p) {
  const char* op = dropout_def->name.c_str();
  check_input(x, op, "input");
  check_input(draws, op, "draws");
  KILN_CHECK(draws.dtype() == kFloat64 && draws.sizes() == x.sizes(), op,
             ": expected float64 draws shaped like the input ", describe(x), ", got ",
             describe(draws));
  Tensor out = detail::make_empty(x.sizes(), x.dtype());
  const double keep = 1.0 - p;
  detail::dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = KILN_TYPE(tag);
    const T scale = T(1) / static_cast<T>(keep);  // as torch: the mask divided by 1 - p in T
    detail::map_kernel<T, T, double>([=](T v, double r) { return r < keep ? v * scale : T(0); },
                                     out, x, draws);
  });
  return out;
}

}  // namespace

// ------------------------------------------------------------------------------- public entries
Tensor softmax(const Tensor& x, int64_t dim) {
  return softmax_with_grad(softmax_def, x, dim, false);
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_with_grad(log_softmax_def, x, dim, true);
}

namespace {
// The reference kernel: layer_norm of x into out (of the compute dtype, not empty), row by row;
// with `stats`, also the rows' statistics.
void layer_norm_into(Tensor& out, const Tensor& x, const Shape& normalized_shape,
                     const Tensor& weight, const Tensor& bias, double eps, LayerNormStats* stats) {
  const DType compute = out.dtype();
  const int64_t n = detail::shape_numel(normalized_shape);
  const int64_t rows = out.numel() / n;
  Tensor in = x.to(compute).contiguous();
  Tensor w = weight.defined() ? weight.to(compute).contiguous() : Tensor();
  Tensor b = bias.defined() ? bias.to(compute).contiguous() : Tensor();
  if (stats) {
    Shape kept = x.sizes();
    std::fill(kept.end() - static_cast<int64_t>(normalized_shape.size()), kept.end(), 1);
    stats->mean = detail::make_empty(kept, kFloat64);
    stats->var = detail::make_empty(kept, kFloat64);
  }
  detail::dispatch_floating(compute, layer_norm_def->name.c_str(), [&](auto tag) {
    using T = KILN_TYPE(tag);
    const T* xp = std::as_const(in).data_ptr<T>();
    T* yp = out.data_ptr<T>();
    const T* wp = w.defined() ? std::as_const(w).data_ptr<T>() : nullptr;
    const T* bp = b.defined() ? std::as_const(b).data_ptr<T>() : nullptr;
    double* mp = stats ? stats->mean.data_ptr<double>() : nullptr;
    double* vp = stats ? stats->var.data_ptr<double>() : nullptr;
    detail::parallel_for(
        rows, std::max<int64_t>(1, detail::kParallelGrain / n), [&](int64_t begin, int64_t end) {
          RowStats s{};
          for (int64_t r = begin; r < end; ++r) {
            layer_norm_row<T>(xp + r * n, yp + r * n, n, wp, bp, eps, stats ? &s : nullptr);
            if (!stats) continue;
            mp[r] = s.mean;
            vp[r] = s.var;
          }
        });
  });
}
}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  const char* op = layer_norm_def->name.c_str();
  check_input(x, op, "input");
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  KILN_CHECK(k >= 1, op, ": normalized_shape must have at least one dimension, got [] for input ",
             describe(x));
  bool match = k <= x.dim();
  for (int64_t i = 0; match && i < k; ++i) match = x.size(x.dim() - k + i) == normalized_shape[i];
  KILN_CHECK(match, op, ": normalized_shape ", shape_str(normalized_shape),
             " does not match the trailing dimensions of input ", describe(x));
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    const char* arg = p == &weight ? "weight" : "bias";
    detail::check_cpu(*p, op);
    KILN_CHECK(p->sizes() == normalized_shape, op, ": expected ", arg, " of shape ",
               shape_str(normalized_shape), " (normalized_shape), got ", describe(*p));
    KILN_CHECK(p->device() == x.device(), op, ": expected ", arg, " on the input's device ",
               x.device().str(), ", got ", describe(*p), " on ", p->device().str(), " for input ",
               describe(x));
  }
  const DType compute = to_floating(x.dtype());
  std::vector<int64_t> dims;
  for (int64_t i = x.dim() - k; i < x.dim(); ++i) dims.push_back(i);
  const bool grads_needed = detail::needs_grad(x, weight, bias);
  Tensor out;
  LayerNormStats stats;  // what the backward reads
  if (x.device().is_cuda() || detail::should_record({x, weight, bias})) {
    // Composed of ops (the fuser makes them one rows kernel, which also writes the statistics
    // when the backward keeps them).
    AutoGradMode kernel_only(false);
    const Tensor xc = x.to(compute);
    stats = layer_norm_stats(xc, dims);
    out = layer_norm_affine(layer_norm_normalize(xc, stats, eps).xhat, weight, bias);
  } else {
    out = detail::make_empty(x.sizes(), compute);
    if (out.numel() > 0)
      layer_norm_into(out, x, normalized_shape, weight, bias, eps, grads_needed ? &stats : nullptr);
  }
  // An empty result requires grad too (as torch's): its inputs' gradients are empty or zero.
  // The backward reads the forward's statistics; differentiated again (create_graph), it
  // recomputes them from x with kiln ops, so that the formula differentiates too. The weight's and
  // bias's gradients are summed over the batch dims by the engine.
  if (grads_needed) {
    detail::record(
        op, {x, weight, bias}, {out}, {x, weight, stats.mean, stats.var},
        [dims, eps](const detail::BackwardContext& c) {
          const Tensor &g = c.grad(), &x = c.saved(0), &w = c.saved(1);
          const Tensor xf = x.to(g.dtype());
          const LayerNormStats saved{c.saved(2), c.saved(3)};
          const LayerNormed n = layer_norm_normalize(
              xf, is_grad_enabled() || !saved.mean.defined() ? layer_norm_stats(xf, dims) : saved,
              eps);
          const Tensor &xhat = n.xhat, &rstd = n.rstd;
          std::vector<Tensor> grads(3);
          if (c.needs_grad(0)) {
            Tensor gx = w.defined() ? g * w : g;
            grads[0] = rstd * (gx - mean(gx, dims, true) - xhat * mean(gx * xhat, dims, true));
          }
          if (c.needs_grad(1)) grads[1] = g * xhat;
          if (c.needs_grad(2)) grads[2] = g;
          return grads;
        });
  }
  return out;
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, Reduction reduction) {
  return nll_loss(log_probs, target, Tensor(), reduction);
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const Tensor& weight,
                Reduction reduction, int64_t ignore_index) {
  const char* op = nll_loss_def->name.c_str();
  NllGeometry g = check_nll(op, log_probs, target, ignore_index);
  check_class_weight(op, weight, log_probs, g.C);
  return nll_with_grad(log_probs, g, weight, reduction, ignore_index).loss;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction) {
  return cross_entropy(logits, target, Tensor(), reduction);
}

namespace {
// cross_entropy with class probabilities (target shaped like the logits), as torch's
// cross_entropy_loss_prob_target: the mean divides by the number of rows (N * d1 * ...), whatever
// the weights.
Tensor cross_entropy_probs(const Tensor& logits, const Tensor& target, const Tensor& weight,
                           Reduction reduction, int64_t ignore_index, double label_smoothing) {
  const char* op = cross_entropy_def->name.c_str();
  KILN_CHECK(target.is_floating_point(), op,
             ": expected a floating-point target of class probabilities (the target has the "
             "input's shape), got ",
             describe(target), " for input ", describe(logits));
  KILN_CHECK(ignore_index < 0, op, ": ignore_index (", ignore_index,
             ") is not supported with class probabilities (target ", describe(target), ")");
  KILN_CHECK(logits.dim() >= 1, op,
             ": expected input of shape [C], [N, C] or [N, C, d1, ...], got ", describe(logits));
  const int64_t class_dim = logits.dim() == 1 ? 0 : 1, C = logits.size(class_dim);
  check_class_weight(op, weight, logits, C);
  const Tensor lp = log_softmax(logits, class_dim);
  const Tensor w = weight.defined() ? weight.to(lp.dtype()) : weight;
  Tensor t = target;
  if (label_smoothing > 0)
    t = target * (1 - label_smoothing) + label_smoothing / static_cast<double>(C);
  Tensor terms = lp * t;
  if (w.defined()) terms = terms * w.view(class_view(logits.dim(), C));
  if (reduction == Reduction::None) return -terms.sum({class_dim});
  if (reduction == Reduction::Sum) return -terms.sum();
  const int64_t rows = C == 0 ? 0 : logits.numel() / C;
  return -terms.sum() / static_cast<double>(rows);  // no rows: 0/0 = NaN, as torch
}
}  // namespace

namespace {
// log_softmax's row normalizer along the class dim (kept): the max m and log(sum(exp(x - m))), so
// that log_softmax(x) = (x - m) - log_sum. Eager on the CPU, rows of contiguous classes, it is the
// softmax kernels' own (log_normalizer_row); otherwise, and under create_graph (where it is
// differentiated), the ops of log_softmax's formula, which the fuser makes row values of a rows
// kernel.
struct LogNormalizer {
  Tensor max, log_sum;
};
LogNormalizer log_normalizer(const Tensor& x, int64_t class_dim) {
  const int64_t C = x.dim() == 0 ? 1 : x.size(class_dim);
  Shape kept = x.sizes();
  if (!kept.empty()) kept[class_dim] = 1;
  if (C == 0) return {zeros(kept, x.dtype()), zeros(kept, x.dtype())};  // no class to normalize
  if (class_dim == x.dim() - 1 && !is_grad_enabled() && !x.device().is_cuda() &&
      !detail::should_record(x)) {
    LogNormalizer n{detail::make_empty(kept, x.dtype()), detail::make_empty(kept, x.dtype())};
    if (x.numel() == 0) return n;
    const Tensor in = x.contiguous();
    detail::dispatch_floating(x.dtype(), log_softmax_def->name.c_str(), [&](auto tag) {
      using T = KILN_TYPE(tag);
      const T* xp = std::as_const(in).data_ptr<T>();
      T *mp = n.max.data_ptr<T>(), *lp = n.log_sum.data_ptr<T>();
      detail::parallel_for(x.numel() / C, std::max<int64_t>(1, detail::kParallelGrain / C),
                           [&](int64_t b, int64_t e) {
                             for (int64_t r = b; r < e; ++r)
                               log_normalizer_row<T>(xp + r * C, C, mp + r, lp + r);
                           });
    });
    return n;
  }
  const Tensor m = amax(x, {class_dim}, true);
  return {m, log(exp(x - m).to(kFloat64).sum({class_dim}, true)).to(x.dtype())};
}

// What cross_entropy reads at each target position, as [N, 1, K...] (the class dim kept; [1] for
// an input of shape [C]).
struct TargetPicks {
  Tensor valid;   // the target is not ignore_index
  Tensor logit;   // the logit of the target's class (any value where the target is ignored)
  Tensor weight;  // the target class's weight (1 without a weight), 0 where ignored
};

// Eager on the CPU the picks read one element per position (gather); in lazy mode and on devices
// they are sums over the classes of one value and zeros (exact), so that they join the rows
// kernel that reads the logits for their normalizer, and no index is read on the host.
TargetPicks pick_targets(const Tensor& x, const NllGeometry& geo, const Tensor& weight,
                         int64_t ignore_index) {
  const int64_t rank = x.dim(), class_dim = rank == 1 ? 0 : 1;
  const Tensor target = geo.target.unsqueeze(class_dim);
  TargetPicks p;
  p.valid = ne(target, ignore_index);
  const Tensor w = weight.defined() ? weight.to(x.dtype()) : Tensor();
  // (No classes: only ignored targets, which gather could not read.)
  if (x.device().is_cuda() || geo.C == 0 || detail::should_record({x, geo.target, weight})) {
    const Tensor hit = target_hits(geo.target, rank, geo.C, ignore_index);
    p.logit = where(hit, x, 0.0).sum({class_dim}, true);
    p.weight = w.defined() ? where(hit, w.view(class_view(rank, geo.C)), 0.0).sum({class_dim}, true)
                           : p.valid.to(x.dtype());
    return p;
  }
  const Tensor t = where(p.valid, target, 0);  // an ignored target reads class 0
  p.logit = x.gather(class_dim, t);
  p.weight = w.defined() ? where(p.valid, w.index_select(0, t.flatten()).view(t.sizes()), 0.0)
                         : p.valid.to(x.dtype());
  return p;
}

// The saved pieces of a cross entropy over class indices, and its loss.
struct CrossEntropyParts {
  Tensor x;  // the logits in the compute dtype
  LogNormalizer norm;
  TargetPicks picks;
  Tensor total;          // the sum of the picked weights: what the mean divides by
  Tensor class_weights;  // the weight viewed along the class dim, or undefined
  Tensor loss;
};

// torch's nll_loss(log_softmax(x)) with label smoothing, each log-probability formed where it is
// used from the rows' normalizer (lp = (x - m) - log_sum, the same bits as log_softmax's), so
// that nothing of the logits' size is written: -lp at the target, and -sum_j w_j lp_j for the
// smoothing term.
CrossEntropyParts cross_entropy_forward(const Tensor& logits, const NllGeometry& geo,
                                        const Tensor& weight, Reduction reduction,
                                        int64_t ignore_index, double label_smoothing) {
  AutoGradMode kernel_only(false);
  const int64_t rank = logits.dim(), class_dim = rank == 1 ? 0 : 1;
  CrossEntropyParts c;
  c.x = logits.to(to_floating(logits.dtype()));
  c.norm = log_normalizer(c.x, class_dim);
  c.picks = pick_targets(c.x, geo, weight, ignore_index);
  if (weight.defined()) c.class_weights = weight.to(c.x.dtype()).view(class_view(rank, geo.C));
  // Negated as torch's -lp (so a zero is -0, as torch's for a single class).
  Tensor terms = -((c.picks.logit - c.norm.max) - c.norm.log_sum);
  if (weight.defined()) terms = terms * c.picks.weight;
  if (label_smoothing > 0.0) {
    // torch's -sum_j w_j lp_j, each lp_j formed from the normalizer (a fused kernel folds it
    // with the rows it reads; the shorter (m + log_sum) sum_j w_j - sum_j w_j x_j overflows to
    // inf - inf where torch's sum is inf).
    const Tensor lp = (c.x - c.norm.max) - c.norm.log_sum;
    const Tensor smooth = -(weight.defined() ? lp * c.class_weights : lp).sum({class_dim}, true);
    terms = terms * (1 - label_smoothing) + smooth * (label_smoothing / static_cast<double>(geo.C));
  }
  terms = where(c.picks.valid, terms, 0.0);
  c.total = sum(c.picks.weight);
  // The mean over no terms is 0/0 = NaN, as torch's. Unreduced, the loss is a tensor of its own
  // (not a view of the terms, whose base has no gradient: an in-place write to the loss must
  // rebase the loss's own gradient).
  if (reduction == Reduction::None)
    c.loss = terms.squeeze(class_dim).clone();
  else
    c.loss = reduction == Reduction::Mean ? sum(terms) / c.total : sum(terms);
  return c;
}

// The eager kernel of cross_entropy's backward for rows of C contiguous classes: each element as
// the composition in record_cross_entropy_grad computes it (the same exp: its argument is at most
// 0), in one pass. m, log_sum, target, a and s hold a value per row; s (the smoothing term's
// scale) and w (the class weights) may be null.
template <typename T>
KILN_NN_CLONES void cross_entropy_grad_row(const T* __restrict x, T* __restrict out, int64_t C, T m,
                                           T log_sum, int64_t target, T a, const T* s,
                                           const T* __restrict w, T class_total) {
  if (!s) {
    for (int64_t j = 0; j < C; ++j)
      out[j] = (detail::exp_nonpos((x[j] - m) - log_sum) - T(j == target)) * a;
    return;
  }
  const T spread_scale = a + *s * class_total;
  for (int64_t j = 0; j < C; ++j)
    out[j] = detail::exp_nonpos((x[j] - m) - log_sum) * spread_scale - T(j == target) * a -
             (w ? *s * w[j] : *s);
}

// Per-row operands of cross_entropy_grad_row, contiguous, in x's dtype (s and w may be undefined).
struct GradRows {
  Tensor m, log_sum, target, a, s, w;
};

Tensor cross_entropy_grad_kernel(const Tensor& x, const GradRows& rows, double class_total) {
  const int64_t C = x.size(-1);
  Tensor out = detail::make_empty(x.sizes(), x.dtype());
  if (out.numel() == 0) return out;
  const Tensor xc = x.contiguous();
  detail::dispatch_floating(x.dtype(), cross_entropy_def->name.c_str(), [&](auto tag) {
    using T = KILN_TYPE(tag);
    const auto at = [](const Tensor& t) {
      return t.defined() ? std::as_const(t).data_ptr<T>() : nullptr;
    };
    const T *xp = at(xc), *mp = at(rows.m), *lp = at(rows.log_sum), *ap = at(rows.a);
    const T *sp = at(rows.s), *wp = at(rows.w);
    const int64_t* tp = std::as_const(rows.target).data_ptr<int64_t>();
    T* op = out.data_ptr<T>();
    const T total = static_cast<T>(class_total);
    detail::parallel_for(x.numel() / C, std::max<int64_t>(1, detail::kParallelGrain / C),
                         [&](int64_t begin, int64_t end) {
                           for (int64_t r = begin; r < end; ++r)
                             cross_entropy_grad_row<T>(xp + r * C, op + r * C, C, mp[r], lp[r],
                                                       tp[r], ap[r], sp ? sp + r : nullptr, wp,
                                                       total);
                         });
  });
  return out;
}

// d loss / d x = softmax(x) (a + s sum_j w_j) - a onehot(target) - s w, with a the nll term's
// scale per position (its weight, (1 - smoothing) and the output gradient, over the total weight
// for the mean) and s the smoothing term's (smoothing / C in place of the weight and 1 -
// smoothing); softmax(x) = exp(lp) from the forward's normalizer. Differentiated again
// (create_graph), the normalizer is recomputed from x, as a function of x.
void record_cross_entropy_grad(const Tensor& logits, const CrossEntropyParts& c,
                               const NllGeometry& geo, Reduction reduction, int64_t ignore_index,
                               double label_smoothing) {
  const int64_t rank = logits.dim(), C = geo.C;
  detail::record(
      cross_entropy_def->name.c_str(), {logits}, {c.loss},
      {c.x, c.norm.max, c.norm.log_sum, geo.target, c.picks.weight, c.picks.valid, c.total,
       c.class_weights},
      [rank, C, reduction, ignore_index, label_smoothing](const detail::BackwardContext& b) {
        const Tensor &g = b.grad(), &x = b.saved(0), &target = b.saved(3), &w = b.saved(7);
        const int64_t class_dim = rank == 1 ? 0 : 1;
        const LogNormalizer n = is_grad_enabled() ? log_normalizer(x, class_dim)
                                                  : LogNormalizer{b.saved(1), b.saved(2)};
        Tensor scale = reduction == Reduction::Mean ? g / b.saved(6) : g;
        if (reduction == Reduction::None) scale = scale.unsqueeze(class_dim);
        // Zero where the target is ignored, whatever the scale (a mean over no weight divides by
        // 0): torch's gradient is 0 there.
        const Tensor& valid = b.saved(5);
        const Tensor a = where(valid, scale * b.saved(4) * (1 - label_smoothing), 0.0);
        const Tensor s =
            label_smoothing == 0.0
                ? Tensor()
                : where(valid, scale * (label_smoothing / static_cast<double>(C)), 0.0);
        // sum_j w_j, which only the smoothing term reads.
        const Tensor class_total = !s.defined()  ? Tensor()
                                   : w.defined() ? sum(w)
                                                 : full({}, static_cast<double>(C), x.dtype());
        // Eager on the CPU, rows of contiguous classes: one pass instead of six.
        if (class_dim == x.dim() - 1 && !is_grad_enabled() && !x.device().is_cuda() &&
            !detail::should_record({x, a, g})) {
          const auto rows = [&](const Tensor& t) {
            return t.defined() ? t.to(x.dtype()).expand(n.max.sizes()).contiguous() : t;
          };
          const GradRows r{rows(n.max), rows(n.log_sum), target.contiguous(),
                           rows(a),     rows(s),         w.defined() ? w.contiguous() : w};
          return std::vector<Tensor>{cross_entropy_grad_kernel(
              x, r, class_total.defined() ? class_total.item<double>() : 0.0)};
        }
        const Tensor hit = target_hits(target, rank, C, ignore_index).to(x.dtype());
        // x + (-m) is x - m bit for bit; written so, a trace that holds the forward too does not
        // share the forward's x - m (its kernel would write it out, 64 MiB for 4096 rows of 4096
        // classes, for this kernel to read back) but recomputes it here.
        const Tensor softmax = exp((x + -n.max) - n.log_sum);
        if (!s.defined()) return std::vector<Tensor>{(softmax - hit) * a};
        const Tensor spread = w.defined() ? s * w : s;
        return std::vector<Tensor>{softmax * (a + s * class_total) - hit * a - spread};
      });
}
}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight,
                     Reduction reduction, int64_t ignore_index, double label_smoothing) {
  const char* op = cross_entropy_def->name.c_str();
  check_input(logits, op, "input");
  check_input(target, op, "target");
  KILN_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op,
             ": label_smoothing must be between 0.0 and 1.0, got ", label_smoothing, " (input ",
             describe(logits), ")");
  // As torch: a target of the input's shape holds class probabilities.
  if (target.sizes() == logits.sizes())
    return cross_entropy_probs(logits, target, weight, reduction, ignore_index, label_smoothing);
  NllGeometry g = check_nll(op, logits, target, ignore_index);
  check_class_weight(op, weight, logits, g.C);
  CrossEntropyParts c =
      cross_entropy_forward(logits, g, weight, reduction, ignore_index, label_smoothing);
  if (detail::needs_grad(logits))
    record_cross_entropy_grad(logits, c, g, reduction, ignore_index, label_smoothing);
  return c.loss;
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  const char* op = mse_loss_def->name.c_str();
  check_input(input, op, "input");
  check_input(target, op, "target");
  const Shape shape = detail::broadcast_shapes(input.sizes(), target.sizes(), op);
  const DType compute = to_floating(detail::result_type({input, target}));
  const int64_t count = detail::shape_numel(shape);
  Tensor out;
  if (input.device().is_cuda()) {
    // Composed for the device's fuser: the squares, then their sum or mean in double, as below.
    AutoGradMode kernel_only(false);
    const Tensor d = input.to(compute) - target.to(compute);
    out = reduce_loss(d * d, reduction);
  } else if (detail::should_record(input, target)) {
    out = detail::lazy_record1(mse_loss_def, {input, target}, {reduction_attr(reduction)},
                               {reduction == Reduction::None ? shape : Shape{}, compute});
  } else {
    Tensor a = input.to(compute), b = target.to(compute);
    Tensor sq = detail::make_empty(shape, compute);
    out = reduction == Reduction::None ? sq : detail::make_empty({}, compute);
    detail::dispatch_floating(compute, op, [&](auto tag) {
      using T = KILN_TYPE(tag);
      detail::map_kernel<T, T, T>(
          [](T u, T v) {
            T d = u - v;
            return d * d;
          },
          sq, a, b);
      if (reduction == Reduction::None) return;
      const T* p = sq.data_ptr<T>();
      double total = 0;
      for (int64_t i = 0; i < count; ++i) total += static_cast<double>(p[i]);
      // Mean over no elements is 0/0 = NaN, as torch.
      *out.data_ptr<T>() =
          static_cast<T>(reduction == Reduction::Mean ? total / static_cast<double>(count) : total);
    });
  }
  if (detail::needs_grad(input, target)) {
    const double scale = reduction == Reduction::Mean ? 2.0 / static_cast<double>(count) : 2.0;
    detail::record(op, {input, target}, {out}, {input, target},
                   [scale](const detail::BackwardContext& c) {
                     Tensor g = (c.saved(0) - c.saved(1)) * (c.grad() * scale);
                     return std::vector<Tensor>{c.needs_grad(0) ? g : Tensor(),
                                                c.needs_grad(1) ? -g : Tensor()};
                   });
  }
  return out;
}

// ------------------------------------------------------------------- losses composed of ops
// binary_cross_entropy has a backward of its own (torch's formula, finite at inputs of 0 and 1,
// where the clamped logs have none); the others differentiate through their ops.
namespace {

// An optional weight must broadcast to the loss's elementwise shape (numpy's rule).
void check_broadcasts_to(const char* op, const char* arg, const Tensor& t, const Shape& shape) {
  if (!t.defined()) return;
  const size_t rank = t.sizes().size();
  bool ok = t.is_floating_point() && rank <= shape.size();
  for (size_t i = 0; ok && i < rank; ++i) {
    const int64_t have = t.sizes()[rank - 1 - i], want = shape[shape.size() - 1 - i];
    ok = have == want || have == 1;
  }
  KILN_CHECK(ok, op, ": expected a floating-point ", arg, " that broadcasts to ", shape_str(shape),
             ", got ", describe(t));
}

// x log(x), 0 at x = 0 (torch's xlogy(x, x)); the log reads 1 there, so no gradient is 0 * inf.
Tensor x_log_x(const Tensor& x) {
  const Tensor nonzero = ne(x, 0);
  return where(nonzero, x * log(where(nonzero, x, 1.0)), 0.0);
}

}  // namespace

Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, const Tensor& weight,
                            Reduction reduction) {
  const char* op = "binary_cross_entropy";
  const Shape shape = check_loss_pair(op, input, target, true);
  check_broadcasts_to(op, "weight", weight, shape);
  Tensor out;
  {
    AutoGradMode kernel_only(false);
    // torch's kernel: (t - 1) * max(log1p(-x), -100) - t * max(log(x), -100).
    Tensor terms = (target - 1) * maximum(log1p(-input), -100) - target * maximum(log(input), -100);
    if (weight.defined()) terms = terms * weight.to(terms.dtype());
    out = reduce_loss(terms, reduction);
  }
  if (detail::needs_grad(input, target)) {
    const double count = static_cast<double>(input.numel());
    detail::record(op, {input, target}, {out}, {input, target, weight},
                   [reduction, count](const detail::BackwardContext& c) {
                     const Tensor &x = c.saved(0), &t = c.saved(1), &w = c.saved(2);
                     Tensor g = reduction == Reduction::Mean ? c.grad() / count : c.grad();
                     if (w.defined()) g = g * w.to(g.dtype());
                     std::vector<Tensor> grads(2);
                     // As torch's binary_cross_entropy_backward: (x - t) / max(x (1 - x), 1e-12).
                     if (c.needs_grad(0)) grads[0] = g * (x - t) / maximum((1 - x) * x, 1e-12);
                     if (c.needs_grad(1))
                       grads[1] = g * (maximum(log1p(-x), -100) - maximum(log(x), -100));
                     return grads;
                   });
  }
  return out;
}

Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const Tensor& weight, Reduction reduction,
                                        const Tensor& pos_weight) {
  const char* op = "binary_cross_entropy_with_logits";
  const Shape shape = check_loss_pair(op, input, target, true);
  check_broadcasts_to(op, "weight", weight, shape);
  check_broadcasts_to(op, "pos_weight", pos_weight, shape);
  // As torch: (1 - t) x - lw log_sigmoid(x), lw = 1 + (pos_weight - 1) t.
  // The weights in the input's dtype, as the logits' (their gradients flow back through to()).
  const Tensor log_sig = log_sigmoid(input);
  Tensor terms = (1 - target) * input -
                 (pos_weight.defined() ? ((pos_weight.to(input.dtype()) - 1) * target + 1) * log_sig
                                       : log_sig);
  if (weight.defined()) terms = terms * weight.to(input.dtype());
  return reduce_loss(terms, reduction);
}

Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  check_loss_pair("l1_loss", input, target, false);
  return reduce_loss(abs(input - target), reduction);
}

namespace {
using DifferenceFn = Tensor (*)(const Tensor& d, double param);

// The elementwise terms f(input - target) of smooth_l1_loss and huber_loss, with torch's backward
// df(d) (in kiln ops, so it differentiates again): through f's ops, an infinite difference would
// reach the quadratic branch that where() does not take as 0 * inf.
Tensor difference_terms(const char* op, const Tensor& input, const Tensor& target, DifferenceFn f,
                        DifferenceFn df, double param) {
  Tensor terms;
  {
    AutoGradMode kernel_only(false);
    terms = f(input - target, param);
  }
  if (detail::needs_grad(input, target))
    detail::record(op, {input, target}, {terms}, {input, target},
                   [df, param](const detail::BackwardContext& c) {
                     const Tensor g = c.grad() * df(c.saved(0) - c.saved(1), param);
                     return std::vector<Tensor>{c.needs_grad(0) ? g : Tensor(),
                                                c.needs_grad(1) ? -g : Tensor()};
                   });
  return terms;
}
}  // namespace

Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, Reduction reduction, double beta) {
  const char* op = "smooth_l1_loss";
  check_loss_pair(op, input, target, false);
  KILN_CHECK(beta >= 0, op, ": beta must be non-negative, got ", beta, " (input ", describe(input),
             ")");
  if (beta == 0.0) return l1_loss(input, target, reduction);
  // |d| < beta ? 0.5 d^2 / beta : |d| - 0.5 beta, as torch's kernel; its gradient
  // clamp(d / beta, -1, 1).
  DifferenceFn f = [](const Tensor& d, double b) {
    const Tensor z = abs(d);
    return where(lt(z, b), d * d * 0.5 / b, z - 0.5 * b);
  };
  DifferenceFn df = [](const Tensor& d, double b) { return clamp(d / b, -1, 1); };
  return reduce_loss(difference_terms(op, input, target, f, df, beta), reduction);
}

Tensor huber_loss(const Tensor& input, const Tensor& target, Reduction reduction, double delta) {
  const char* op = "huber_loss";
  check_loss_pair(op, input, target, false);
  KILN_CHECK(delta > 0, op, ": delta must be positive, got ", delta, " (input ", describe(input),
             ")");
  // |d| < delta ? 0.5 d^2 : delta (|d| - 0.5 delta), as torch's kernel; its gradient
  // clamp(d, -delta, delta).
  DifferenceFn f = [](const Tensor& d, double dl) {
    const Tensor z = abs(d);
    return where(lt(z, dl), d * d * 0.5, (z - 0.5 * dl) * dl);
  };
  DifferenceFn df = [](const Tensor& d, double dl) { return clamp(d, -dl, dl); };
  return reduce_loss(difference_terms(op, input, target, f, df, delta), reduction);
}

namespace {
// kl_div's elementwise terms, as torch's: exp(t) (t - x) for log targets, else t log(t) - t x.
Tensor kl_div_terms(const Tensor& input, const Tensor& target, bool log_target) {
  check_loss_pair("kl_div", input, target, false);
  return log_target ? exp(target) * (target - input) : x_log_x(target) - target * input;
}
}  // namespace

Tensor kl_div(const Tensor& input, const Tensor& target, const KLDivReduction& reduction,
              bool log_target) {
  const Tensor terms = kl_div_terms(input, target, log_target);
  if (const auto* r = std::get_if<Reduction>(&reduction)) return reduce_loss(terms, *r);
  const Tensor total = terms.sum();
  return input.dim() == 0 ? total : total / static_cast<double>(input.size(0));
}

Tensor dropout(const Tensor& x, double p, bool train) {
  const char* op = dropout_def->name.c_str();
  check_input(x, op, "input");
  KILN_CHECK(p >= 0.0 && p <= 1.0, op, ": probability has to be between 0 and 1, but got ", p,
             " (input ", describe(x), ")");
  KILN_CHECK(x.is_floating_point(), op, ": expected a floating-point input, got ", describe(x));
  if (!train || p == 0.0) return x;
  if (p == 1.0) {
    Tensor out = zeros_like(x);
    if (detail::needs_grad(x))
      detail::record(op, {x}, {out}, {}, [](const detail::BackwardContext&) {
        return std::vector<Tensor>{Tensor()};  // nothing passes
      });
    return out;
  }
  // Draws come from the process generator in row-major order, so manual_seed reproduces the mask.
  // They are drawn here, in program order, also in lazy mode (only what follows is recorded). For
  // a device the draws stay on the host: only whether each element is kept goes over (a byte an
  // element, not a double's eight).
  const double keep = 1.0 - p;
  Tensor u, kept;
  if (x.device().is_cuda()) {
    AutoGradMode kernel_only(false);
    kept = lt(rand(x.sizes(), kFloat64), keep).to(x.device());
  } else {
    u = rand(x.sizes(), kFloat64);
  }
  // As torch: the mask divided by 1 - p in x's type; a 0-dim host number for the ops below (made
  // only where they run: the host kernels take the scale themselves).
  auto scale = [&] {
    return detail::dispatch_floating(x.dtype(), op, [&](auto tag) {
      using T = KILN_TYPE(tag);
      return scalar_tensor(static_cast<double>(T(1) / static_cast<T>(keep)), x.dtype());
    });
  };
  Tensor out;
  if (!detail::needs_grad(x)) {
    // dropout_apply composed for the device's fuser: one elementwise kernel.
    if (kept.defined()) return where(kept, x * scale(), 0.0);
    if (detail::should_record(x))
      return detail::lazy_record1(dropout_def, {x, u}, {p}, {x.sizes(), x.dtype()});
    return dropout_apply(x, u, p);
  }
  // With autograd the mask (0 or 1 / (1 - p)) is kept for the backward pass; it is made from the
  // draws at once, and only the product is recorded in lazy mode.
  Tensor mask;
  if (kept.defined() || detail::is_pending(u)) {
    // On a device, or drawn inside a trace (recorded, so each replay draws anew): the mask is made
    // by ops (recorded too) that give the kernel's values exactly (0 or 1 times the scale).
    AutoGradMode kernel_only(false);
    mask = (kept.defined() ? kept : lt(u, keep)).to(x.dtype()) * scale();
  } else {
    mask = detail::make_empty(x.sizes(), x.dtype());
    detail::dispatch_floating(x.dtype(), op, [&](auto tag) {
      using T = KILN_TYPE(tag);
      const T scale = T(1) / static_cast<T>(keep);  // as torch: the mask divided by 1 - p in T
      detail::map_kernel<T, double>([=](double r) { return r < keep ? scale : T(0); }, mask, u);
    });
  }
  {
    AutoGradMode kernel_only(false);
    out = mul(x, mask);
  }
  detail::record(op, {x}, {out}, {mask}, [](const detail::BackwardContext& c) {
    return std::vector<Tensor>{c.grad() * c.saved(0)};
  });
  return out;
}

namespace detail {
Tensor reduce_loss(const Tensor& terms, Reduction reduction) {
  if (reduction == Reduction::None) return terms;
  return reduction == Reduction::Mean ? mean(terms) : sum(terms);
}

Shape check_loss_pair(const char* op, const Tensor& input, const Tensor& target, bool binary) {
  check_defined(input, op, "input");
  check_defined(target, op, "target");
  KILN_CHECK(input.is_floating_point() && (!binary || target.is_floating_point()), op,
             ": expected floating-point input", binary ? " and target" : "", ", got ",
             describe(input), " and ", describe(target));
  KILN_CHECK(!binary || input.sizes() == target.sizes(), op,
             ": expected target of the input's shape ", shape_str(input.sizes()), ", got ",
             describe(target));
  return broadcast_shapes(input.sizes(), target.sizes(), op);
}
}  // namespace detail

}  // namespace kiln
