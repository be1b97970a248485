// Reductions (sum, mean, prod, max/min, amax/amin, argmax/argmin, var/std, logsumexp, all, any).
//
// Every reduction goes through one driver. `geometry` validates the dims from the input's metadata
// (in lazy mode the call is then recorded: every op here has a node whose kernel is its public
// function, run later with recording off). `arrange` views the input so that the kept dims come
// first and the reduced dims last; when that view is contiguous each output
// element reduces one contiguous row of length R ("rows" layout). When instead the view with the
// reduced dims first is contiguous (a reduction over leading dims of a contiguous tensor, as in a
// bias gradient) the simple accumulating ops read it in place ("cols" layout): for each reduced
// index a whole contiguous run of outputs is updated, which vectorizes across outputs. Otherwise
// the rows view is copied once. Work is split across threads over output rows when there are many
// of them, and over chunks of each row when there are few (per-chunk partials are then combined
// serially, in order, so ties and first-NaN rules still pick the first occurrence).
//
// Accumulation is in double for floating inputs and in 64-bit modular integers for integral ones.
// Sums add in blocks with several independent lanes: the lanes let the compiler vectorize and the
// blocks keep the rounding error growing with the block count rather than the element count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>

#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/dispatch.h"
#include "lib/fastmath.h"
#include "lib/lazy.h"
#include "lib/loops.h"
#include "lib/op_registry.h"
#include "lib/op_table.h"
#include "lib/parallel.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;
using detail::DTypeRule;
using detail::OpKind;
using detail::TypeTag;

namespace {

using Inputs = std::vector<Tensor>;
using detail::Attrs;

// `formula`: what the fuser computes for a fused reduction (see OpDef::formula), with the
// reductions rsum, rmax and rmin over the folded elements, n their number and widen the sums'
// accumulation type (double for floats, int64 otherwise), as the kernels below compute.
const detail::OpDef& def_reduction(const char* name, DTypeRule rule, bool supports_bool,
                                   detail::Invoke invoke, std::vector<std::string> attr_names,
                                   const char* formula = nullptr) {
  return detail::register_op({name, OpKind::Reduction, 1, rule, supports_bool, invoke,
                              std::move(attr_names), nullptr, formula});
}

// var and std: the corrected two-pass formula of var_like, NaN when n - correction <= 0; an
// overflowing sum of squares is the result (inf), never inf minus the correction's inf.
#define KILN_VAR_FORMULA(OPEN, CLOSE)                                                        \
  "(let d (sub (widen x) (div (rsum (widen x)) n)) (let s (rsum d) (let q (rsum (mul d d)) " \
  "(let den (sub n a1) "                                                                     \
  "(let v (div (select (eq q inf) q (sub q (div (mul s s) n))) den) "                        \
  "(cast " OPEN "(select (gt den 0) (select (lt v 0) 0 v) nan)" CLOSE "))))))"
detail::OpHandle sum_def;
detail::OpHandle mean_def;
detail::OpHandle prod_def;
detail::OpHandle max_def;
detail::OpHandle min_def;
detail::OpHandle max_dim_def;
detail::OpHandle min_dim_def;
detail::OpHandle amax_def;
detail::OpHandle amin_def;
detail::OpHandle argmax_def;
detail::OpHandle argmin_def;
detail::OpHandle var_def;
detail::OpHandle std_def;
detail::OpHandle logsumexp_def;
detail::OpHandle all_def;
detail::OpHandle any_def;
}  // namespace

// The reductions' entries, with the formulas the fuser computes them by.
void registration::register_reductions() {
  // Attributes: dims are wrapped and ascending, the empty list meaning every dim (as the caller's).
  sum_def.bind(def_reduction(
      "sum", DTypeRule::Custom, true,
      [](const Inputs& in, const Attrs& a) {
        return Inputs{sum(in[0], detail::attr_ints(a.at(0)), detail::attr_bool(a.at(1)),
                          detail::attr_optional_dtype(a.at(2)))};
      },
      {"dims", "keepdim", "dtype"}, "(cast (rsum (widen x)))"));
  mean_def.bind(def_reduction(
      "mean", DTypeRule::Custom, false,
      [](const Inputs& in, const Attrs& a) {
        return Inputs{mean(in[0], detail::attr_ints(a.at(0)), detail::attr_bool(a.at(1)))};
      },
      {"dims", "keepdim"}, "(cast (div (rsum (widen x)) n))"));
  prod_def.bind(def_reduction(
      "prod", DTypeRule::Custom, true,
      [](const Inputs& in, const Attrs& a) {
        return Inputs{prod(in[0], detail::attr_ints(a.at(0)), detail::attr_bool(a.at(1)))};
      },
      {"dims", "keepdim"}, "(cast (rprod (widen x)))"));
  // max() and min() over every element; max_dim and min_dim are max(x, dim) and min(x, dim), which
  // return (values, int64 indices).
  max_def.bind(def_reduction(
      "max", DTypeRule::Same, true,
      [](const Inputs& in, const Attrs&) { return Inputs{max(in[0])}; }, {}, "(rmax x)"));
  min_def.bind(def_reduction(
      "min", DTypeRule::Same, true,
      [](const Inputs& in, const Attrs&) { return Inputs{min(in[0])}; }, {}, "(rmin x)"));
  max_dim_def.bind(def_reduction("max_dim", DTypeRule::Custom, true,
                                 [](const Inputs& in, const Attrs& a) {
                                   auto [values, indices] = max(in[0], detail::attr_int(a.at(0)),
                                                                detail::attr_bool(a.at(1)));
                                   return Inputs{values, indices};
                                 },
                                 {"dim", "keepdim"}));
  min_dim_def.bind(def_reduction("min_dim", DTypeRule::Custom, true,
                                 [](const Inputs& in, const Attrs& a) {
                                   auto [values, indices] = min(in[0], detail::attr_int(a.at(0)),
                                                                detail::attr_bool(a.at(1)));
                                   return Inputs{values, indices};
                                 },
                                 {"dim", "keepdim"}));
  amax_def.bind(def_reduction(
      "amax", DTypeRule::Same, true,
      [](const Inputs& in, const Attrs& a) {
        return Inputs{amax(in[0], detail::attr_ints(a.at(0)), detail::attr_bool(a.at(1)))};
      },
      {"dims", "keepdim"}, "(rmax x)"));
  amin_def.bind(def_reduction(
      "amin", DTypeRule::Same, true,
      [](const Inputs& in, const Attrs& a) {
        return Inputs{amin(in[0], detail::attr_ints(a.at(0)), detail::attr_bool(a.at(1)))};
      },
      {"dims", "keepdim"}, "(rmin x)"));
  // dim: an int, or none for the flat index over every element.
  argmax_def.bind(def_reduction("argmax", DTypeRule::Custom, true,
                                [](const Inputs& in, const Attrs& a) {
                                  return Inputs{argmax(in[0], detail::attr_optional_int(a.at(0)),
                                                       detail::attr_bool(a.at(1)))};
                                },
                                {"dim", "keepdim"}));
  argmin_def.bind(def_reduction("argmin", DTypeRule::Custom, true,
                                [](const Inputs& in, const Attrs& a) {
                                  return Inputs{argmin(in[0], detail::attr_optional_int(a.at(0)),
                                                       detail::attr_bool(a.at(1)))};
                                },
                                {"dim", "keepdim"}));
  var_def.bind(def_reduction(
      "var", DTypeRule::Custom, false,
      [](const Inputs& in, const Attrs& a) {
        return Inputs{var(in[0], detail::attr_ints(a.at(0)), detail::attr_int(a.at(1)),
                          detail::attr_bool(a.at(2)))};
      },
      {"dims", "correction", "keepdim"}, KILN_VAR_FORMULA("", "")));
  std_def.bind(def_reduction(
      "std", DTypeRule::Custom, false,
      [](const Inputs& in, const Attrs& a) {
        return Inputs{kiln::std(in[0], detail::attr_ints(a.at(0)), detail::attr_int(a.at(1)),
                                detail::attr_bool(a.at(2)))};
      },
      {"dims", "correction", "keepdim"}, KILN_VAR_FORMULA("(sqrt ", ")")));
  logsumexp_def.bind(def_reduction(
      "logsumexp", DTypeRule::Float, true,
      [](const Inputs& in, const Attrs& a) {
        return Inputs{logsumexp(in[0], detail::attr_ints(a.at(0)), detail::attr_bool(a.at(1)))};
      },
      {"dims", "keepdim"},
      // An infinite max is the result (+inf, or -inf when every element is -inf); otherwise the
      // exp of x minus the max (an exp_nonpos in the kernel) summed in double.
      "(let m (rmax x) (let l (cast (add (log (rsum (widen (exp (sub x m))))) (widen m))) "
      "(select (or (eq m inf) (eq m -inf)) m l)))"));
  all_def.bind(def_reduction(
      "all", DTypeRule::Logical, true,
      [](const Inputs& in, const Attrs& a) {
        return Inputs{all(in[0], detail::attr_ints(a.at(0)), detail::attr_bool(a.at(1)))};
      },
      {"dims", "keepdim"}, "(rmin (ne x 0))"));  // an empty fold is true
  any_def.bind(def_reduction(
      "any", DTypeRule::Logical, true,
      [](const Inputs& in, const Attrs& a) {
        return Inputs{any(in[0], detail::attr_ints(a.at(0)), detail::attr_bool(a.at(1)))};
      },
      {"dims", "keepdim"}, "(rmax (ne x 0))"));  // an empty fold is false
}

namespace {

template <typename T>
constexpr bool kIsFloat = std::is_floating_point_v<T>;

// The accumulator of sums and products: double for floats, wrapping 64-bit integers otherwise.
template <typename T>
using Wide = std::conditional_t<kIsFloat<T>, double, uint64_t>;

template <typename T>
bool is_nan(T x) {
  if constexpr (kIsFloat<T>)
    return x != x;
  else
    return false;
}

// ------------------------------------------------------------------------------------ geometry

enum class Layout { Rows, Cols };

// The checked shape of a reduction, from the input's metadata alone (nothing is read, so it runs
// before a call is recorded in lazy mode).
struct Geometry {
  Shape out_shape;
  std::vector<int64_t> reduced_dims;  // wrapped, ascending (every dim for an empty list)
  std::vector<int64_t> kept_dims;     // ascending
  std::vector<int64_t> dims_attr;     // the caller's dims wrapped and sorted (empty stays empty)
  bool all_dims = false;              // the caller gave no dims
  int64_t rows = 1;
  int64_t R = 1;
};

// Validates `dims` (empty: all) against `x`.
Geometry geometry(const Tensor& x, const char* op, const std::vector<int64_t>& dims, bool keepdim) {
  const int64_t nd = x.dim();
  Geometry g;
  g.all_dims = dims.empty();
  std::vector<bool> reduced(static_cast<size_t>(std::max<int64_t>(nd, 1)), dims.empty());
  if (!dims.empty()) {
    std::vector<bool> seen(reduced.size(), false);
    for (int64_t d : dims) {
      int64_t w = detail::wrap_dim(d, nd, op, &x);
      KILN_CHECK(!seen[w], op, ": dim ", w, " appears multiple times in the list of dims ",
                 detail::shape_str(dims), " (input ", describe(x), ")");
      seen[w] = true;
      reduced[w] = true;
      // A 0-dim tensor accepts dim 0 (or -1), which names the tensor itself: reducing it over
      // that dim is reducing it over all of its (no) dims, so the graph sees no dims at all.
      if (w < nd) g.dims_attr.push_back(w);
    }
    std::sort(g.dims_attr.begin(), g.dims_attr.end());
  }
  for (int64_t d = 0; d < nd; ++d) {
    int64_t s = x.size(d);
    if (reduced[d]) {
      g.reduced_dims.push_back(d);
      g.R *= s;
      if (keepdim) g.out_shape.push_back(1);
    } else {
      g.kept_dims.push_back(d);
      g.rows *= s;
      g.out_shape.push_back(s);
    }
  }
  return g;
}

// The input arranged for reduction: element (row i, reduced index r) is at data[i * R + r] in the
// Rows layout and at data[r * rows + i] in the Cols layout.
struct Prepared : Geometry {
  Tensor data;  // contiguous
  Layout layout = Layout::Rows;
};

// Arranges `x` (whose geometry is `g`). allow_cols: the caller can read the Cols layout.
Prepared arrange(const Tensor& x, const Geometry& g, bool allow_cols) {
  AutoGradMode kernel_only(false);  // the views below are the kernel's, not the user's
  Prepared p;
  static_cast<Geometry&>(p) = g;
  std::vector<int64_t> kept_first = g.kept_dims;
  kept_first.insert(kept_first.end(), g.reduced_dims.begin(), g.reduced_dims.end());
  Tensor rows_view = x.permute(kept_first);
  if (rows_view.is_contiguous()) {
    p.data = rows_view;
    return p;
  }
  if (allow_cols) {
    std::vector<int64_t> reduced_first = g.reduced_dims;
    reduced_first.insert(reduced_first.end(), g.kept_dims.begin(), g.kept_dims.end());
    Tensor cols_view = x.permute(reduced_first);
    if (cols_view.is_contiguous()) {
      p.data = cols_view;
      p.layout = Layout::Cols;
      return p;
    }
  }
  p.data = rows_view.contiguous();
  return p;
}

// max/min/argmax/... have no identity: they reject a reduction over zero elements, as torch does.
void check_nonempty(const char* op, const Tensor& x, const Geometry& g) {
  if (g.R != 0) return;
  if (g.all_dims) {
    KILN_FAIL(op,
              ": expected a reduction dim to be specified for an input with no elements (input ",
              describe(x), "); specify a dim with non-zero size");
  }
  KILN_FAIL(op, ": expected reduction dim(s) ", detail::shape_str(g.reduced_dims),
            " to have non-zero size (input ", describe(x), ")");
}

// Records a reduction of x in lazy mode: one output of the given shape and type.
Tensor record_reduction(const detail::OpDef& def, const Tensor& x, Attrs attrs, const Geometry& g,
                        DType dtype) {
  return detail::lazy_record1(def, {x}, std::move(attrs), {g.out_shape, dtype});
}

void check_input(const Tensor& x, const char* op) {
  detail::check_defined(x, op);
  detail::check_cpu(x, op);
}

// A plain array of accumulators (not std::vector, whose bool specialization packs bits that
// threads could not write independently).
template <typename T>
class Buffer {
 public:
  explicit Buffer(int64_t n) : p_(new T[static_cast<size_t>(n)]()) {}
  T& operator[](int64_t i) { return p_[i]; }
  T* data() { return p_.get(); }

 private:
  std::unique_ptr<T[]> p_;
};

int max_threads() {
  return omp_in_parallel() ? 1 : omp_get_max_threads();
}

// ------------------------------------------------------------------------------------- drivers

// Reduces each of `rows` rows of length R. row_fn(i, b, e) reduces elements [b, e) of row i (with
// b == e only when R == 0); combine(left, right) merges partials of adjacent chunks; store(i, acc)
// writes the result. None of them may throw.
template <typename Acc, typename RowFn, typename Combine, typename Store>
void reduce_rows(int64_t rows, int64_t R, const RowFn& row_fn, const Combine& combine,
                 const Store& store) {
  if (rows == 0) return;
  const int64_t nt = max_threads();
  const int64_t grain = detail::kParallelGrain;
  const int64_t work = rows * std::max<int64_t>(R, 1);
  auto whole_rows = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) store(i, row_fn(i, int64_t{0}, R));
  };
  if (nt <= 1 || work < 2 * grain) {
    whole_rows(0, rows);
    return;
  }
  if (rows >= 4 * nt || R < 2 * grain) {
    detail::parallel_for(rows, std::max<int64_t>(1, grain / std::max<int64_t>(R, 1)), whole_rows);
    return;
  }
  // Few long rows: split every row into chunks, one task per (row, chunk).
  int64_t chunks = std::min<int64_t>(nt, (R + grain - 1) / grain);
  const int64_t len = (R + chunks - 1) / chunks;
  chunks = (R + len - 1) / len;  // every chunk non-empty
  Buffer<Acc> partial(rows * chunks);
  detail::parallel_for(rows * chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t i = t / chunks, c = t % chunks;
      partial[t] = row_fn(i, c * len, std::min(R, (c + 1) * len));
    }
  });
  for (int64_t i = 0; i < rows; ++i) {
    Acc acc = partial[i * chunks];
    for (int64_t c = 1; c < chunks; ++c) acc = combine(acc, partial[i * chunks + c]);
    store(i, acc);
  }
}

// Reads the Cols layout: data[r * rows + i]. acc_i = lift(x_0i), then step(acc_i, x_ri) for r > 0.
// With R == 0 every output gets `init`.
template <typename Acc, typename T, typename Lift, typename Step, typename Combine, typename Store>
void reduce_cols(const T* data, int64_t rows, int64_t R, Acc init, const Lift& lift,
                 const Step& step, const Combine& combine, const Store& store) {
  if (rows == 0) return;
  if (R == 0) {
    for (int64_t i = 0; i < rows; ++i) store(i, init);
    return;
  }
  constexpr int64_t kTile = 1024;  // outputs updated together; their accumulators stay in cache
  // Reduces r in [rb, re) for outputs [cb, ce) into out[0, ce - cb).
  auto block = [&](int64_t rb, int64_t re, int64_t cb, int64_t ce, Acc* out) {
    for (int64_t tb = cb; tb < ce; tb += kTile) {
      const int64_t n = std::min(kTile, ce - tb);
      Acc* __restrict a = out + (tb - cb);
      const T* __restrict p = data + rb * rows + tb;
      for (int64_t j = 0; j < n; ++j) a[j] = lift(p[j]);
      for (int64_t r = rb + 1; r < re; ++r) {
        p = data + r * rows + tb;
        for (int64_t j = 0; j < n; ++j) a[j] = step(a[j], p[j]);
      }
    }
  };
  const int64_t nt = max_threads();
  const int64_t grain = detail::kParallelGrain;
  const int64_t work = rows * R;
  if (nt <= 1 || work < 2 * grain || rows >= 64 * nt || R < 2 * nt) {
    // Split over outputs (a single task when the work is small).
    int64_t g = work < 2 * grain ? rows : std::max<int64_t>(64, grain / R);
    detail::parallel_for(rows, g, [&](int64_t cb, int64_t ce) {
      Buffer<Acc> acc(ce - cb);
      block(0, R, cb, ce, acc.data());
      for (int64_t i = cb; i < ce; ++i) store(i, acc[i - cb]);
    });
    return;
  }
  // Few outputs, many reduced elements: split the reduced range, then combine in order.
  const int64_t chunks = std::min<int64_t>(nt, R);
  const int64_t len = (R + chunks - 1) / chunks;
  const int64_t used = (R + len - 1) / len;
  Buffer<Acc> partial(used * rows);
  detail::parallel_for(used, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c)
      block(c * len, std::min(R, (c + 1) * len), 0, rows, partial.data() + c * rows);
  });
  for (int64_t i = 0; i < rows; ++i) {
    Acc acc = partial[i];
    for (int64_t c = 1; c < used; ++c) acc = combine(acc, partial[c * rows + i]);
    store(i, acc);
  }
}

// A simple accumulating reduction: Ops has `Acc init`, `Acc run(const T*, int64_t n)` (a contiguous
// run; returns init when n == 0), `Acc lift(T)`, `Acc step(Acc, T)` and `Acc combine(Acc, Acc)`.
template <typename T, typename Ops, typename Store>
void run_simple(const Prepared& p, const Ops& ops, const Store& store) {
  using Acc = decltype(ops.init);
  const T* data = static_cast<const T*>(p.data.raw_data_ptr());
  auto combine = [&](Acc a, Acc b) { return ops.combine(a, b); };
  if (p.layout == Layout::Cols) {
    reduce_cols<Acc, T>(
        data, p.rows, p.R, ops.init, [&](T x) { return ops.lift(x); },
        [&](Acc a, T x) { return ops.step(a, x); }, combine, store);
    return;
  }
  const int64_t R = p.R;
  reduce_rows<Acc>(
      p.rows, R, [&](int64_t i, int64_t b, int64_t e) { return ops.run(data + i * R + b, e - b); },
      combine, store);
}

// ----------------------------------------------------------------------------------- row kernels

constexpr int kLanes = 8;
constexpr int64_t kSumBlock = 4096;

// Sum of f(p[i]) accumulated in A: blocks of kSumBlock elements, kLanes independent lanes each.
template <typename A, typename T, typename F>
A sum_run(const T* __restrict p, int64_t n, const F& f) {
  A total = 0;
  for (int64_t b = 0; b < n; b += kSumBlock) {
    const int64_t e = std::min(n, b + kSumBlock);
    A lane[kLanes] = {};
    int64_t i = b;
    for (; i + kLanes <= e; i += kLanes)
      for (int k = 0; k < kLanes; ++k) lane[k] += f(p[i + k]);
    A tail = 0;
    for (; i < e; ++i) tail += f(p[i]);
    A s = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    total += s + tail;
  }
  return total;
}

// The sum of exp(p[i] - m) in double for a finite m at least every p[i], logsumexp's row. A block's
// exps go to a small buffer and are then summed: written so, both loops vectorize (one loop adding
// float exps into a double does not).
template <typename T>
double exp_sum_run(const T* __restrict p, int64_t n, T m) {
  constexpr int64_t kBlock = 256;
  alignas(64) T exps[kBlock];
  double total = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t len = std::min(kBlock, n - b);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) exps[i] = detail::exp_nonpos(p[b + i] - m);
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < len; ++i) s += static_cast<double>(exps[i]);
    total += s;
  }
  return total;
}

template <typename T>
struct SumOps {
  using A = Wide<T>;
  A init = 0;
  A run(const T* p, int64_t n) const {
    return sum_run<A>(p, n, [](T x) { return static_cast<A>(x); });
  }
  A lift(T x) const { return static_cast<A>(x); }
  A step(A a, T x) const { return a + static_cast<A>(x); }
  A combine(A a, A b) const { return a + b; }
};

template <typename T>
struct ProdOps {
  using A = Wide<T>;
  A init = 1;
  A run(const T* __restrict p, int64_t n) const {
    A lane[4] = {1, 1, 1, 1};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
      for (int k = 0; k < 4; ++k) lane[k] *= static_cast<A>(p[i + k]);
    A r = (lane[0] * lane[1]) * (lane[2] * lane[3]);
    for (; i < n; ++i) r *= static_cast<A>(p[i]);
    return r;
  }
  A lift(T x) const { return static_cast<A>(x); }
  A step(A a, T x) const { return a * static_cast<A>(x); }
  A combine(A a, A b) const { return a * b; }
};

// max or min where a NaN wins over everything and +0 counts as greater than -0 (IEEE 754-2019's
// maximum and minimum, as LLVM's llvm.maximum/llvm.minimum and the CUDA emitter's kiln_fmax fold
// fused reductions): the result does not depend on the order the elements are visited in.
template <typename T, bool IsMax>
T pick(T a, T x) {
  bool better = IsMax ? x > a : x < a;
  if constexpr (kIsFloat<T>)
    if (x == a && std::signbit(x) != std::signbit(a)) better = std::signbit(x) != IsMax;
  return (better || is_nan(x)) ? x : a;
}

template <typename T, bool IsMax>
T extremum_scalar(const T* __restrict p, int64_t n) {
  T r = p[0];
  for (int64_t i = 1; i < n; ++i) r = pick<T, IsMax>(r, p[i]);
  return r;
}

template <typename T, bool IsMax>
struct ExtremumOps {
  T init{};  // unused: an empty reduction is rejected before
  // Lanes of plain max (or min) vectorize; for floats a second set of lanes adds x - x, which turns
  // NaN on a NaN or an infinity, and then the run is redone by the exact NaN-aware scalar loop,
  // as it is when the result is a zero (whose sign the lanes' plain comparison leaves to order).
  T run(const T* __restrict p, int64_t n) const {
    T lane[kLanes], bad[kLanes];
    for (int k = 0; k < kLanes; ++k) {
      lane[k] = p[0];
      bad[k] = T(0);
    }
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (int k = 0; k < kLanes; ++k) {
        T v = p[i + k];
        lane[k] = (IsMax ? v > lane[k] : v < lane[k]) ? v : lane[k];
        if constexpr (kIsFloat<T>) bad[k] += v - v;
      }
    }
    if constexpr (kIsFloat<T>) {
      T any_bad = T(0);
      for (int k = 0; k < kLanes; ++k) any_bad += bad[k];
      if (any_bad != T(0) || is_nan(any_bad)) return extremum_scalar<T, IsMax>(p, n);
    }
    T r = p[0];
    for (int k = 0; k < kLanes; ++k) r = pick<T, IsMax>(r, lane[k]);
    for (; i < n; ++i) r = pick<T, IsMax>(r, p[i]);
    if constexpr (kIsFloat<T>)
      if (r == T(0)) return extremum_scalar<T, IsMax>(p, n);
    return r;
  }
  T lift(T x) const { return x; }
  T step(T a, T x) const { return pick<T, IsMax>(a, x); }
  T combine(T a, T b) const { return pick<T, IsMax>(a, b); }
};

// all (IsAll) or any: blocks of elements, stopping once the answer is known. Within a block the
// non-zero elements are counted (or, for bool, the bytes and-ed/or-ed), which vectorizes.
template <typename T, bool IsAll>
struct LogicalOps {
  bool init = IsAll;
  bool run(const T* __restrict p, int64_t n) const {
    constexpr int64_t kBlock = 1024;
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t e = std::min(n, b + kBlock);
      bool decided;
      if constexpr (std::is_same_v<T, bool>) {
        const uint8_t* q = reinterpret_cast<const uint8_t*>(p);
        uint8_t acc = IsAll ? 1 : 0;
        for (int64_t i = b; i < e; ++i) {
          if constexpr (IsAll)
            acc &= q[i];
          else
            acc |= q[i];
        }
        decided = (acc != 0) != IsAll;
      } else {
        using C = std::conditional_t<sizeof(T) == 8, int64_t, int32_t>;
        C count = 0;
        for (int64_t i = b; i < e; ++i) count += static_cast<C>(p[i] != T(0));
        decided = IsAll ? count != e - b : count != 0;
      }
      if (decided) return !IsAll;
    }
    return IsAll;
  }
  bool lift(T x) const { return x != T(0); }
  bool step(bool a, T x) const {
    if constexpr (IsAll)
      return a & (x != T(0));
    else
      return a | (x != T(0));
  }
  bool combine(bool a, bool b) const { return IsAll ? (a && b) : (a || b); }
};

// The best value of a run and its index (relative to the row): ties keep the first, the first NaN
// wins. p[0] must exist.
template <typename T, bool IsMax>
std::pair<T, int64_t> arg_run(const T* __restrict p, int64_t n, int64_t offset) {
  T best = p[0];
  int64_t at = 0;
  if (is_nan(best)) return {best, offset};
  for (int64_t i = 1; i < n; ++i) {
    T x = p[i];
    if (IsMax ? x > best : x < best) {
      best = x;
      at = i;
    } else if (is_nan(x)) {
      return {x, offset + i};
    }
  }
  return {best, offset + at};
}

template <typename T, bool IsMax>
std::pair<T, int64_t> arg_combine(const std::pair<T, int64_t>& left,
                                  const std::pair<T, int64_t>& right) {
  if (is_nan(left.first)) return left;
  if (is_nan(right.first)) return right;
  bool better = IsMax ? right.first > left.first : right.first < left.first;
  return better ? right : left;
}

// ------------------------------------------------------------------------------- op bodies

// sum (attrs [dims, keepdim, dtype]) or mean (attrs [dims, keepdim]).
Tensor sum_like(const detail::OpDef& def, const Tensor& x, const std::vector<int64_t>& dims,
                bool keepdim, std::optional<DType> dtype, bool mean) {
  const char* op = def.name.c_str();
  check_input(x, op);
  if (mean) {
    KILN_CHECK(is_floating_point(x.dtype()), op,
               ": could not infer the output dtype; the input must be floating point, got ",
               describe(x));
  }
  DType out_type = dtype ? *dtype : (is_floating_point(x.dtype()) ? x.dtype() : kInt64);
  Geometry g = geometry(x, op, dims, keepdim);
  if (detail::should_record(x)) {
    Attrs attrs{g.dims_attr, keepdim};
    if (!mean) attrs.emplace_back(std::monostate{});
    if (!mean && dtype) attrs[2].emplace<DType>(*dtype);
    return record_reduction(def, x, std::move(attrs), g, out_type);
  }
  Tensor in = dtype ? x.to(*dtype) : x;
  Prepared p = arrange(in, g, true);
  Tensor out = detail::make_empty(p.out_shape, out_type);
  const double count = static_cast<double>(p.R);
  detail::dispatch_all(in.dtype(), [&](auto tag) {
    using T = KILN_TYPE(tag);
    using A = Wide<T>;
    auto write = [&](auto otag) {
      using O = KILN_TYPE(otag);
      O* o = out.data_ptr<O>();
      if constexpr (kIsFloat<T>) {
        if (mean) {
          run_simple<T>(p, SumOps<T>{}, [&](int64_t i, A a) { o[i] = static_cast<O>(a / count); });
          return;
        }
      }
      run_simple<T>(p, SumOps<T>{}, [&](int64_t i, A a) { o[i] = static_cast<O>(a); });
    };
    if (out_type == in.dtype())
      write(TypeTag<T>{});
    else
      write(TypeTag<int64_t>{});
  });
  return out;
}

// amax/amin (attrs [dims, keepdim]), or max()/min() over every element (no attrs) when `whole`.
template <bool IsMax>
Tensor extremum(const detail::OpDef& def, const Tensor& x, const std::vector<int64_t>& dims,
                bool keepdim, bool whole) {
  const char* op = def.name.c_str();
  check_input(x, op);
  Geometry g = geometry(x, op, dims, keepdim);
  check_nonempty(op, x, g);
  if (detail::should_record(x))
    return record_reduction(def, x, whole ? Attrs{} : Attrs{g.dims_attr, keepdim}, g, x.dtype());
  Prepared p = arrange(x, g, true);
  Tensor out = detail::make_empty(p.out_shape, x.dtype());
  detail::dispatch_all(x.dtype(), [&](auto tag) {
    using T = KILN_TYPE(tag);
    T* o = out.data_ptr<T>();
    run_simple<T>(p, ExtremumOps<T, IsMax>{}, [&](int64_t i, T v) { o[i] = v; });
  });
  return out;
}

template <bool IsAll>
Tensor logical_reduce(const detail::OpDef& def, const Tensor& x, const std::vector<int64_t>& dims,
                      bool keepdim) {
  const char* op = def.name.c_str();
  check_input(x, op);
  Geometry g = geometry(x, op, dims, keepdim);
  if (detail::should_record(x)) return record_reduction(def, x, {g.dims_attr, keepdim}, g, kBool);
  Prepared p = arrange(x, g, true);
  Tensor out = detail::make_empty(p.out_shape, kBool);
  bool* o = out.data_ptr<bool>();
  detail::dispatch_all(x.dtype(), [&](auto tag) {
    using T = KILN_TYPE(tag);
    run_simple<T>(p, LogicalOps<T, IsAll>{}, [&](int64_t i, bool v) { o[i] = v; });
  });
  return out;
}

// arg_reduce on a device, composed of reductions the fuser fuses (one rows kernel): the extremum
// m, then the least position whose element is m, or is NaN (where m is NaN), as the reference
// kernel's first extremum with NaN counting as the extremum. Without a dim, over the flat index.
template <bool IsMax>
void arg_reduce_composed(const Tensor& x, std::optional<int64_t> dim, const Geometry& g,
                         Tensor* values, Tensor* indices) {
  AutoGradMode kernel_only(false);
  const Tensor v = dim && x.dim() > 0 ? x : x.reshape({-1});
  const int64_t d = dim && x.dim() > 0 ? g.reduced_dims[0] : 0, n = v.size(d);
  const Tensor m = IsMax ? amax(v, {d}, true) : amin(v, {d}, true);
  Tensor hit = eq(v, m);
  if (is_floating_point(x.dtype())) hit = logical_or(hit, ne(v, v));
  Shape positions(static_cast<size_t>(v.dim()), 1);
  positions[static_cast<size_t>(d)] = n;
  const Tensor pos = arange(n, TensorOptions(kInt64).device(x.device())).view(positions);
  *indices = amin(where(hit, pos, scalar_tensor(n, kInt64)), {d}, true).reshape(g.out_shape);
  if (values) *values = m.reshape(g.out_shape);
}

// Values (when `values` is non-null) and int64 indices of the max or min along `dim` (every dim in
// order when absent). def takes attrs [dim (none when absent), keepdim]; with values it has two
// outputs.
template <bool IsMax>
void arg_reduce(const detail::OpDef& def, const Tensor& x, std::optional<int64_t> dim, bool keepdim,
                Tensor* values, Tensor* indices) {
  const char* op = def.name.c_str();
  check_input(x, op);
  std::vector<int64_t> dims;
  if (dim) dims.push_back(*dim);
  Geometry g = geometry(x, op, dims, keepdim);
  check_nonempty(op, x, g);
  if (x.device().is_cuda()) {
    arg_reduce_composed<IsMax>(x, dim, g, values, indices);
    return;
  }
  if (detail::should_record(x)) {
    Attrs attrs{std::monostate{}, keepdim};
    if (dim) attrs[0].emplace<int64_t>(detail::wrap_dim(*dim, x.dim(), op));
    if (values) {
      std::vector<Tensor> out = detail::lazy_record(
          def, {x}, std::move(attrs), {{g.out_shape, x.dtype()}, {g.out_shape, kInt64}});
      *values = out[0];
      *indices = out[1];
    } else {
      *indices = record_reduction(def, x, std::move(attrs), g, kInt64);
    }
    return;
  }
  Prepared p = arrange(x, g, false);
  *indices = detail::make_empty(p.out_shape, kInt64);
  if (values) *values = detail::make_empty(p.out_shape, x.dtype());
  int64_t* idx = indices->data_ptr<int64_t>();
  detail::dispatch_all(x.dtype(), [&](auto tag) {
    using T = KILN_TYPE(tag);
    using Acc = std::pair<T, int64_t>;
    const T* data = static_cast<const T*>(p.data.raw_data_ptr());
    T* val = values ? values->data_ptr<T>() : nullptr;
    const int64_t R = p.R;
    reduce_rows<Acc>(
        p.rows, R,
        [&](int64_t i, int64_t b, int64_t e) {
          return arg_run<T, IsMax>(data + i * R + b, e - b, b);
        },
        [](const Acc& l, const Acc& r) { return arg_combine<T, IsMax>(l, r); },
        [&](int64_t i, const Acc& a) {
          idx[i] = a.second;
          if (val) val[i] = a.first;
        });
  });
}

// var or std (take_sqrt): attrs [dims, correction, keepdim].
Tensor var_like(const detail::OpDef& def, const Tensor& x, const std::vector<int64_t>& dims,
                int64_t correction, bool keepdim, bool take_sqrt) {
  const char* op = def.name.c_str();
  check_input(x, op);
  KILN_CHECK(is_floating_point(x.dtype()), op,
             ": std and var only support floating-point dtypes, got ", describe(x));
  Geometry g = geometry(x, op, dims, keepdim);
  if (detail::should_record(x))
    return record_reduction(def, x, {g.dims_attr, correction, keepdim}, g, x.dtype());
  Prepared p = arrange(x, g, false);
  Tensor out = detail::make_empty(p.out_shape, x.dtype());
  const int64_t R = p.R;
  const double count = static_cast<double>(R);
  const double denom = count - static_cast<double>(correction);
  detail::dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = KILN_TYPE(tag);
    const T* data = static_cast<const T*>(p.data.raw_data_ptr());
    T* o = out.data_ptr<T>();
    // Pass 1: the mean of each row.
    std::vector<double> means(static_cast<size_t>(p.rows));
    reduce_rows<double>(
        p.rows, R,
        [&](int64_t i, int64_t b, int64_t e) {
          return sum_run<double>(data + i * R + b, e - b, [](T v) { return double(v); });
        },
        [](double a, double b) { return a + b; },
        [&](int64_t i, double s) { means[i] = s / count; });
    // Pass 2: sums of deviations d and d^2. The corrected two-pass formula subtracts (sum d)^2 / n,
    // which removes most of the error left in the mean.
    using Acc = std::pair<double, double>;
    reduce_rows<Acc>(
        p.rows, R,
        [&](int64_t i, int64_t b, int64_t e) {
          const double m = means[i];
          const T* q = data + i * R + b;
          double s = 0, ss = 0;
          for (int64_t bb = 0; bb < e - b; bb += kSumBlock) {
            const int64_t ee = std::min(e - b, bb + kSumBlock);
            double ls[kLanes] = {}, lss[kLanes] = {};
            int64_t j = bb;
            for (; j + kLanes <= ee; j += kLanes) {
              for (int k = 0; k < kLanes; ++k) {
                double d = double(q[j + k]) - m;
                ls[k] += d;
                lss[k] += d * d;
              }
            }
            for (; j < ee; ++j) {
              double d = double(q[j]) - m;
              s += d;
              ss += d * d;
            }
            for (int k = 0; k < kLanes; ++k) {
              s += ls[k];
              ss += lss[k];
            }
          }
          return Acc{s, ss};
        },
        [](const Acc& a, const Acc& b) {
          return Acc{a.first + b.first, a.second + b.second};
        },
        [&](int64_t i, const Acc& a) {
          double v = std::numeric_limits<double>::quiet_NaN();
          if (denom > 0) {
            // An overflowing sum of squares is the result: the correction (sum d)^2 / n, at
            // most it, may overflow too (its rounding residue squared) and give inf - inf.
            const double squares = a.second;
            v = (std::isinf(squares) ? squares : squares - a.first * a.first / count) / denom;
            if (v < 0) v = 0;
          }
          o[i] = static_cast<T>(take_sqrt ? std::sqrt(v) : v);
        });
  });
  return out;
}

}  // namespace

// ------------------------------------------------------------------------------- gradients

// The dims of x a reduction over `dims` removes, ascending (all of them for an empty list). A
// 0-dim x has none, even when dims names its dim 0 (or -1), as torch allows.
std::vector<int64_t> reduced_dims(const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < x.dim(); ++d) out.push_back(d);
  } else if (x.dim() > 0) {
    for (int64_t d : dims) out.push_back(detail::wrap_dim(d, x.dim(), "reduce"));
    std::sort(out.begin(), out.end());
  }
  return out;
}

// A reduction's output (or its gradient) with the reduced dims back as size 1.
Tensor unreduce(const Tensor& t, const std::vector<int64_t>& rdims, bool keepdim) {
  if (keepdim) return t;
  Tensor r = t;
  for (int64_t d : rdims) r = r.unsqueeze(d);
  return r;
}

int64_t reduced_count(const Shape& sizes, const std::vector<int64_t>& rdims) {
  int64_t n = 1;
  for (int64_t d : rdims) n *= sizes[d];
  return n;
}

// Records a single-input reduction; formula(x, y, g) receives x, the output and its gradient
// with the reduced dims restored as size 1.
template <typename F>
Tensor reduction_with_grad(const detail::OpDef& def, const Tensor& x,
                           const std::vector<int64_t>& dims, bool keepdim, Tensor out, bool saves_x,
                           bool saves_out, F formula) {
  if (!detail::needs_grad(x)) return out;
  std::vector<int64_t> rdims = reduced_dims(x, dims);
  std::vector<Tensor> saved{saves_x ? x : Tensor(), saves_out ? out : Tensor()};
  detail::record(def.name.c_str(), {x}, {out}, saved,
                 [formula, rdims, keepdim, in = x.sizes()](const detail::BackwardContext& c) {
                   Tensor y =
                       c.saved(1).defined() ? unreduce(c.saved(1), rdims, keepdim) : Tensor();
                   return std::vector<Tensor>{
                       formula(c.saved(0), y, unreduce(c.grad(), rdims, keepdim), in, rdims)};
                 });
  return out;
}

// The gradient of a max or min over all of `rdims`: shared equally by the elements that tie.
Tensor extremum_grad(const Tensor& x, const Tensor& y, const Tensor& g,
                     const std::vector<int64_t>& rdims) {
  Tensor mask = eq(x, y).to(g.dtype());
  return mul(g, mask) / sum(mask, rdims, true);
}

// ------------------------------------------------------------------------------- public entries

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim,
           std::optional<DType> dtype) {
  return reduction_with_grad(sum_def, x, dims, keepdim,
                             sum_like(sum_def, x, dims, keepdim, dtype, false), false, false,
                             [](const Tensor&, const Tensor&, const Tensor& g, const Shape& in,
                                const std::vector<int64_t>&) { return g.expand(in); });
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduction_with_grad(mean_def, x, dims, keepdim,
                             sum_like(mean_def, x, dims, keepdim, std::nullopt, true), false, false,
                             [](const Tensor&, const Tensor&, const Tensor& g, const Shape& in,
                                const std::vector<int64_t>& rdims) {
                               return div(g.expand(in),
                                          static_cast<double>(reduced_count(in, rdims)));
                             });
}

Tensor sum_to_size(const Tensor& x, const Shape& shape) {
  detail::check_defined(x, "sum_to_size");
  const int64_t lead = x.dim() - static_cast<int64_t>(shape.size());
  bool ok = lead >= 0;
  std::vector<int64_t> dims;
  for (int64_t d = 0; ok && d < x.dim(); ++d) {
    if (d < lead) {
      dims.push_back(d);
      continue;
    }
    int64_t want = shape[d - lead];
    ok = want == x.size(d) || want == 1;
    if (want == 1 && x.size(d) != 1) dims.push_back(d);
  }
  KILN_CHECK(ok, "sum_to_size: ", describe(x), " cannot be summed to the shape ",
             detail::shape_str(shape), " (that shape must broadcast to the input's)");
  if (dims.empty()) return lead == 0 ? x : x.view(shape);
  return sum(x, dims, true).view(shape);
}

Tensor prod(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const char* op = prod_def->name.c_str();
  check_input(x, op);
  DType out_type = is_floating_point(x.dtype()) ? x.dtype() : kInt64;
  Geometry g = geometry(x, op, dims, keepdim);
  Tensor out;
  if (detail::should_record(x)) {
    out = record_reduction(prod_def, x, {g.dims_attr, keepdim}, g, out_type);
  } else {
    Prepared p = arrange(x, g, true);
    out = detail::make_empty(p.out_shape, out_type);
    detail::dispatch_all(x.dtype(), [&](auto tag) {
      using T = KILN_TYPE(tag);
      using O = std::conditional_t<kIsFloat<T>, T, int64_t>;
      O* o = out.data_ptr<O>();
      run_simple<T>(p, ProdOps<T>{}, [&](int64_t i, Wide<T> a) { o[i] = static_cast<O>(a); });
    });
  }
  // d prod / d x_i is the product of the others: y / x_i when the input has no zero, taken before
  // g multiplies it (as torch: g * y alone may round in the subnormals); g itself for a 0-dim
  // input (nothing else, even where x is inf). With zeros, each element's product of the others
  // is taken directly (x with that element replaced by 1, R^2 work per row), which stays exact
  // and differentiable.
  return reduction_with_grad(
      prod_def, x, dims, keepdim, out, true, true,
      [](const Tensor& x, const Tensor& y, const Tensor& g, const Shape&,
         const std::vector<int64_t>& rdims) {
        if (x.dim() == 0) return g;
        if (!eq(x, 0).any().item<bool>()) return g * (y / x);
        std::vector<int64_t> order, kept_sizes;
        for (int64_t d = 0; d < x.dim(); ++d)
          if (!std::binary_search(rdims.begin(), rdims.end(), d)) {
            order.push_back(d);
            kept_sizes.push_back(x.size(d));
          }
        order.insert(order.end(), rdims.begin(), rdims.end());
        const int64_t R = reduced_count(x.sizes(), rdims);
        Shape rows = kept_sizes, square = kept_sizes;
        rows.push_back(R);
        square.insert(square.end(), {R, R});
        Tensor xr = x.permute(order).reshape(rows);
        Tensor others = where(logical_not(eye(R, TensorOptions(kBool).device(xr.device()))),
                              xr.unsqueeze(-2).expand(square), 1.0);
        Shape permuted;
        for (int64_t d : order) permuted.push_back(x.size(d));
        Shape g_rows = kept_sizes;
        g_rows.push_back(1);
        Tensor grad_r = prod(others, {-1}) * g.permute(order).reshape(g_rows);
        std::vector<int64_t> inverse(order.size());
        for (size_t i = 0; i < order.size(); ++i) inverse[order[i]] = static_cast<int64_t>(i);
        return grad_r.reshape(permuted).permute(inverse);
      });
}

namespace {
auto extremum_formula = [](const Tensor& x, const Tensor& y, const Tensor& g, const Shape&,
                           const std::vector<int64_t>& rdims) {
  return extremum_grad(x, y, g, rdims);
};
// max()/min() of every element, as torch's evenly_distribute_backward (CPU): the elements equal
// to the result share the gradient and the others get exactly 0, even where the gradient is NaN;
// a NaN result's gradient goes to the NaN elements. (amax/amin multiply by the mask, as torch.)
auto all_extremum_formula = [](const Tensor& x, const Tensor& y, const Tensor& g, const Shape&,
                               const std::vector<int64_t>& rdims) {
  const Tensor hit = logical_or(eq(x, y), logical_and(isnan(x), isnan(y)));
  return where(hit, g / sum(hit.to(g.dtype()), rdims, true), 0.0);
};

// max/min along one dim: the gradient goes to the element the index names.
std::tuple<Tensor, Tensor> values_indices_with_grad(const char* op, const Tensor& x, int64_t dim,
                                                    bool keepdim, Tensor values, Tensor indices) {
  if (detail::needs_grad(x)) {
    int64_t d = detail::wrap_dim(dim, x.dim(), op, &x);
    detail::record(op, {x}, {values, indices}, {indices},
                   [d, keepdim, in = x.sizes()](const detail::BackwardContext& c) {
                     if (in.empty()) return std::vector<Tensor>{c.grad()};
                     Tensor idx = unreduce(c.saved(0), {d}, keepdim);
                     Tensor g = unreduce(c.grad(), {d}, keepdim);
                     return std::vector<Tensor>{scatter_add(
                         zeros(in, TensorOptions(g.dtype()).device(g.device())), d, idx, g)};
                   });
  }
  return {values, indices};
}
}  // namespace

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduction_with_grad(amax_def, x, dims, keepdim,
                             extremum<true>(amax_def, x, dims, keepdim, false), true, true,
                             extremum_formula);
}

Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduction_with_grad(amin_def, x, dims, keepdim,
                             extremum<false>(amin_def, x, dims, keepdim, false), true, true,
                             extremum_formula);
}

Tensor max(const Tensor& x) {
  return reduction_with_grad(max_def, x, {}, false, extremum<true>(max_def, x, {}, false, true),
                             true, true, all_extremum_formula);
}

Tensor min(const Tensor& x) {
  return reduction_with_grad(min_def, x, {}, false, extremum<false>(min_def, x, {}, false, true),
                             true, true, all_extremum_formula);
}

std::tuple<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  Tensor values, indices;
  arg_reduce<true>(max_dim_def, x, dim, keepdim, &values, &indices);
  return values_indices_with_grad("max", x, dim, keepdim, values, indices);
}

std::tuple<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim) {
  Tensor values, indices;
  arg_reduce<false>(min_dim_def, x, dim, keepdim, &values, &indices);
  return values_indices_with_grad("min", x, dim, keepdim, values, indices);
}

// Without a dim every dim is reduced in order, so the row offset is the flat index (keepdim then
// keeps every dim as size 1, as torch).
Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  Tensor indices;
  arg_reduce<true>(argmax_def, x, dim, keepdim, nullptr, &indices);
  return indices;
}

Tensor argmin(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  Tensor indices;
  arg_reduce<false>(argmin_def, x, dim, keepdim, nullptr, &indices);
  return indices;
}

namespace {
// d var / d x = 2 (x - mean) / (N - correction).
Tensor var_grad(const Tensor& x, const Tensor& g, const std::vector<int64_t>& rdims,
                int64_t correction) {
  double denom = static_cast<double>(reduced_count(x.sizes(), rdims) - correction);
  return g * (x - mean(x, rdims, true)) * (2.0 / denom);
}
}  // namespace

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  return reduction_with_grad(var_def, x, dims, keepdim,
                             var_like(var_def, x, dims, correction, keepdim, false), true, false,
                             [correction](const Tensor& x, const Tensor&, const Tensor& g,
                                          const Shape&, const std::vector<int64_t>& rdims) {
                               return var_grad(x, g, rdims, correction);
                             });
}

// d std = d var / (2 std), taken as 0 where std is 0 (as torch).
Tensor std(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  return reduction_with_grad(
      std_def, x, dims, keepdim, var_like(std_def, x, dims, correction, keepdim, true), true, true,
      [correction](const Tensor& x, const Tensor& y, const Tensor& g, const Shape&,
                   const std::vector<int64_t>& rdims) {
        Tensor nonzero = ne(y, 0);  // dividing by a safe 1 keeps NaN out of the next derivative
        Tensor gvar = where(nonzero, g / (where(nonzero, y, 1.0) * 2.0), 0.0);
        return var_grad(x, gvar, rdims, correction);
      });
}

namespace {
Tensor logsumexp_with_grad(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim,
                           const Tensor& out) {
  return reduction_with_grad(logsumexp_def, x, dims, keepdim, out, true, true,
                             [](const Tensor& x, const Tensor& y, const Tensor& g, const Shape&,
                                const std::vector<int64_t>&) { return g * exp(x - y); });
}
}  // namespace

// log(sum(exp(x - m))) + m with m the row's max (0 when the max is infinite, so that all -inf gives
// -inf and any +inf gives +inf); NaN propagates; an empty row gives -inf. Integers become float32.
Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const char* op = logsumexp_def->name.c_str();
  check_input(x, op);
  const DType out_type = is_floating_point(x.dtype()) ? x.dtype() : kFloat32;
  Geometry g = geometry(x, op, dims, keepdim);
  if (detail::should_record(x)) {
    Tensor out = record_reduction(logsumexp_def, x, {g.dims_attr, keepdim}, g, out_type);
    return logsumexp_with_grad(x, dims, keepdim, out);
  }
  Tensor in = x.to(out_type);
  Prepared p = arrange(in, g, false);
  Tensor out = detail::make_empty(p.out_shape, out_type);
  const int64_t R = p.R;
  detail::dispatch_floating(out_type, op, [&](auto tag) {
    using T = KILN_TYPE(tag);
    T* o = out.data_ptr<T>();
    if (R == 0) {
      for (int64_t i = 0; i < p.rows; ++i) o[i] = -std::numeric_limits<T>::infinity();
      return;
    }
    const T* data = static_cast<const T*>(p.data.raw_data_ptr());
    ExtremumOps<T, true> mx;
    // exp and log are lib/math/primitives.h's, as the exp and log ops' and the fused kernels'.
    std::vector<T> maxes(static_cast<size_t>(p.rows));
    reduce_rows<T>(
        p.rows, R, [&](int64_t i, int64_t b, int64_t e) { return mx.run(data + i * R + b, e - b); },
        [&](T a, T b) { return mx.combine(a, b); }, [&](int64_t i, T m) { maxes[i] = m; });
    // A row whose max is infinite sums to it (+inf, or -inf when every element is -inf); a NaN
    // max (the row holds a NaN) makes the sum NaN.
    reduce_rows<double>(
        p.rows, R,
        [&](int64_t i, int64_t b, int64_t e) {
          const T m = maxes[i];
          if (std::isinf(m)) return 0.0;
          return detail::call_vectorized([&] { return exp_sum_run(data + i * R + b, e - b, m); });
        },
        [](double a, double b) { return a + b; },
        [&](int64_t i, double s) {
          const T m = maxes[i];
          o[i] = std::isinf(m) ? m : static_cast<T>(detail::log_f64(s) + double(m));
        });
  });
  return logsumexp_with_grad(x, dims, keepdim, out);
}

Tensor all(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return logical_reduce<true>(all_def, x, dims, keepdim);
}

Tensor any(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return logical_reduce<false>(any_def, x, dims, keepdim);
}

}  // namespace kiln
