// torch.nn.functional.embedding_bag. Each position of the input is assigned its bag (row of a
// 2-D input, or the last offset at or before it). Sums and means run one kernel op,
// "embedding_bag_sum": each bag's run of positions adds its rows of weight (times the per-sample
// weights) as it reads them, one task per bag, skipping padding_idx rows; its gradient is an
// index_add of the output's gradient rows into the looked-up rows (and their dot products for the
// per-sample weights), composed of ops. "max" is a composition: each bag's first row holding its
// maximum, found with scatter_reduce's "amax" and "amin" and read with gather, so the gradient
// goes to that row. padding_idx entries are masked rather than removed, so shapes never depend
// on values and a traced step replays.
#include <algorithm>
#include <limits>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "kiln/autograd.h"
#include "kiln/nn_functional.h"
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

constexpr const char* kOp = "embedding_bag";
using Inputs = std::vector<Tensor>;
detail::OpHandle bag_sum_def;

// out += row (times scale when scaled): restrict, so that the compiler vectorizes it.
template <typename T>
void add_row(T* __restrict out, const T* __restrict row, T scale, bool scaled, int64_t n) {
  if (scaled) {
    for (int64_t d = 0; d < n; ++d) out[d] += row[d] * scale;
  } else {
    for (int64_t d = 0; d < n; ++d) out[d] += row[d];
  }
}

// out [bags, D]: weight's row indices[p] (padding_row's skipped) times scale[p] (when defined)
// added into row bag[p], for bag numbers that never decrease: each bag's run summed in order.
Tensor bag_sum_kernel(const Tensor& weight, const Tensor& indices, const Tensor& bag,
                      const Tensor& scale, int64_t bags, int64_t padding_row) {
  const Tensor w = weight.contiguous(), idx = indices.contiguous(), at = bag.contiguous();
  const Tensor sc = scale.defined() ? scale.contiguous() : scale;
  const int64_t count = idx.numel(), num = w.size(0), dim = w.size(1);
  const int64_t* ip = std::as_const(idx).data_ptr<int64_t>();
  const int64_t* bp = std::as_const(at).data_ptr<int64_t>();
  for (int64_t p = 0; p < count; ++p)
    KILN_CHECK(ip[p] >= 0 && ip[p] < num, kOp, ": index ", ip[p], " is out of bounds for weight ",
               describe(weight));
  std::vector<int64_t> start(static_cast<size_t>(bags) + 1, count);  // each bag's first position
  for (int64_t k = 0, p = 0; k <= bags; ++k) {
    while (p < count && bp[p] < k) ++p;
    start[static_cast<size_t>(k)] = p;
  }
  Tensor out = zeros({bags, dim}, TensorOptions(w.dtype()));
  detail::dispatch_floating(w.dtype(), kOp, [&](auto tag) {
    using T = KILN_TYPE(tag);
    const T* wp = std::as_const(w).data_ptr<T>();
    const T* sp = sc.defined() ? std::as_const(sc).data_ptr<T>() : nullptr;
    T* op = out.data_ptr<T>();
    const int64_t grain = std::max<int64_t>(
        1, detail::kParallelGrain /
               std::max<int64_t>(1, dim * (count / std::max<int64_t>(1, bags) + 1)));
    detail::parallel_for(bags, grain, [&](int64_t first, int64_t last) {
      for (int64_t k = first; k < last; ++k) {
        T* o = op + k * dim;
        for (int64_t p = start[size_t(k)]; p < start[size_t(k) + 1]; ++p) {
          if (ip[p] == padding_row) continue;
          add_row(o, wp + ip[p] * dim, sp ? sp[p] : T(1), sp != nullptr, dim);
        }
      }
    });
  });
  return out;
}

Tensor bag_sum(const Tensor& weight, const Tensor& indices, const Tensor& bag, const Tensor& scale,
               int64_t bags, int64_t padding_row);

// weight's gradient: the output's gradient row of each position's bag (times its scale) added
// into the position's row, padding positions left out; scale's: those rows' dot products.
std::vector<Tensor> bag_sum_backward(const detail::BackwardContext& c, int64_t padding_row) {
  const Tensor &g = c.grad(), &weight = c.saved(0), &indices = c.saved(1), &bag = c.saved(2),
               &scale = c.saved(3);
  const Tensor kept = ne(indices, padding_row).unsqueeze(1);
  const Tensor upstream = index_select(g, 0, bag);
  std::vector<Tensor> grads(2);
  if (c.needs_grad(0)) {
    const Tensor rows = scale.defined() ? upstream * scale.unsqueeze(1) : upstream;
    grads[0] = index_add(zeros_like(weight), 0, indices, where(kept, rows, 0));
  }
  if (c.needs_grad(1))
    grads[1] = where(kept, upstream * index_select(weight, 0, indices), 0).sum({1});
  return grads;
}

Tensor bag_sum(const Tensor& weight, const Tensor& indices, const Tensor& bag, const Tensor& scale,
               int64_t bags, int64_t padding_row) {
  Tensor out;
  if (!weight.device().is_cpu()) {  // composed: index_select, then index_add into the bags
    Tensor rows = index_select(weight, 0, indices);
    if (scale.defined()) rows = rows * scale.unsqueeze(1);
    rows = where(ne(indices, padding_row).unsqueeze(1), rows, 0);
    return index_add(
        zeros({bags, weight.size(1)}, TensorOptions(weight.dtype()).device(weight.device())), 0,
        bag, rows);
  }
  if (detail::should_record({weight, indices, bag, scale})) {
    out = detail::lazy_record1(bag_sum_def, {weight, indices, bag, scale}, {bags, padding_row},
                               {{bags, weight.size(1)}, weight.dtype()});
  } else {
    AutoGradMode kernel_only(false);
    out = bag_sum_kernel(weight, indices, bag, scale, bags, padding_row);
  }
  if (detail::needs_grad(weight, scale))
    detail::record("embedding_bag", {weight, scale}, {out}, {weight, indices, bag, scale},
                   [padding_row](const detail::BackwardContext& c) {
                     return bag_sum_backward(c, padding_row);
                   });
  return out;
}

bool is_index_dtype(DType t) {
  return t == kInt64 || t == kInt32;
}

// The bag of each of the input's `count` positions [count] and the number of bags, from a 1-D
// input's offsets: checked to start at 0 and never decrease (and, with include_last_offset, to
// end at count).
std::pair<Tensor, int64_t> bags_from_offsets(const Tensor& offsets_in, int64_t count,
                                             bool include_last_offset) {
  KILN_CHECK(offsets_in.defined() && offsets_in.dim() == 1 && is_index_dtype(offsets_in.dtype()),
             kOp, ": a 1-D input needs 1-D int64 (or int32) offsets, got ",
             offsets_in.defined() ? describe(offsets_in) : std::string("none"));
  const int64_t bags = offsets_in.numel() - (include_last_offset ? 1 : 0);
  KILN_CHECK(bags >= 0, kOp, ": include_last_offset needs at least one offset");
  const Tensor offsets = offsets_in.detach().to(kInt64);
  if (offsets.numel() > 0) {
    detail::ValueCheckScope checking;
    const Tensor steps =
        offsets.narrow(0, 1, offsets.numel() - 1) - offsets.narrow(0, 0, offsets.numel() - 1);
    const Tensor last = offsets.narrow(0, offsets.numel() - 1, 1);
    const bool valid = eq(offsets.narrow(0, 0, 1), 0).item<bool>() &&
                       all(ge(steps, 0)).item<bool>() &&
                       (include_last_offset ? eq(last, count) : le(last, count)).item<bool>();
    KILN_CHECK(valid, kOp, ": offsets ", describe(offsets_in),
               " must start at 0, never decrease and ",
               include_last_offset ? "end at" : "stay within", " the input's ", count, " indices");
  }
  KILN_CHECK(bags > 0 || count == 0, kOp, ": ", count, " indices but no bag (offsets ",
             describe(offsets_in), ")");
  if (bags == 0) return {zeros({0}, TensorOptions(kInt64).device(offsets.device())), 0};
  const Tensor positions = arange(count, TensorOptions(kInt64).device(offsets.device()));
  return {searchsorted(offsets.narrow(0, 0, bags), positions, false, true) - 1, bags};
}

void check_arguments(const Tensor& input, const Tensor& weight, std::string_view mode,
                     const Tensor& per_sample_weights) {
  detail::check_defined(input, kOp, "input");
  detail::check_defined(weight, kOp, "weight");
  KILN_CHECK(is_index_dtype(input.dtype()) && (input.dim() == 1 || input.dim() == 2), kOp,
             ": expected a 1-D or 2-D int64 (or int32) input, got ", describe(input));
  KILN_CHECK(weight.dim() == 2 && weight.is_floating_point(), kOp,
             ": expected a 2-D floating-point weight, got ", describe(weight));
  KILN_CHECK(mode == "sum" || mode == "mean" || mode == "max", kOp,
             ": mode must be \"sum\", \"mean\" or \"max\", got \"", std::string(mode), "\"");
  if (!per_sample_weights.defined()) return;
  KILN_CHECK(mode == "sum", kOp, ": per_sample_weights is only supported for mode \"sum\", got \"",
             std::string(mode), "\"");
  KILN_CHECK(
      per_sample_weights.sizes() == input.sizes() && per_sample_weights.dtype() == weight.dtype(),
      kOp, ": expected per_sample_weights of the input's shape and the weight's dtype, got ",
      describe(per_sample_weights), " for input ", describe(input), " and weight ",
      describe(weight));
}

// The "max" bags: per bag and column the value of the first kept row holding the bag's maximum
// (NaN counting as it), read from `rows` at that position so that the gradient goes to that row
// alone, as torch's; an empty bag is zeros.
Tensor bag_maxima(const Tensor& rows, const Tensor& kept, const Tensor& bag,
                  const Tensor& kept_count, int64_t bags) {
  const int64_t count = rows.size(0), dim = rows.size(1);
  const TensorOptions options = TensorOptions(rows.dtype()).device(rows.device());
  // No rows: zeros, still on the graph of the weight (as torch's result requires grad).
  if (count == 0) return index_add(zeros({bags, dim}, options), 0, bag, rows);
  const double lowest = -std::numeric_limits<double>::infinity();
  const Tensor kept_rows = kept.unsqueeze(1).expand({count, dim});
  const Tensor values = where(kept_rows, rows.detach(), lowest);
  const Tensor bag_rows = bag.unsqueeze(1).expand({count, dim});
  const Tensor maxima =
      scatter_reduce(full({bags, dim}, lowest, options), 0, bag_rows, values, "amax", false);
  const Tensor bag_max = index_select(maxima, 0, bag);
  const Tensor hit = logical_and(
      kept_rows, logical_or(eq(values, bag_max), logical_and(isnan(values), isnan(bag_max))));
  const TensorOptions i64 = TensorOptions(kInt64).device(rows.device());
  const Tensor position = arange(count, i64).unsqueeze(1).expand({count, dim});
  const Tensor first = scatter_reduce(zeros({bags, dim}, i64), 0, bag_rows,
                                      where(hit, position, count), "amin", false);
  const Tensor chosen = gather(rows, 0, clamp_max(first, count - 1));
  return where(gt(kept_count, 0).unsqueeze(1), chosen, 0);
}

}  // namespace

// Inputs (weight, indices, bag, scale), the scale optional.
void registration::register_embedding_bag_ops() {
  bag_sum_def.bind(detail::register_op({"embedding_bag_sum",
                                        detail::OpKind::NN,
                                        4,
                                        detail::DTypeRule::Custom,
                                        false,
                                        [](const Inputs& in, const detail::Attrs& a) {
                                          return Inputs{bag_sum(in[0], in[1], in[2], in[3],
                                                                detail::attr_int(a.at(0)),
                                                                detail::attr_int(a.at(1)))};
                                        },
                                        {"bags", "padding_row"}}));
}

Tensor embedding_bag(const Tensor& input, const Tensor& weight, const Tensor& offsets,
                     std::string_view mode, const Tensor& per_sample_weights,
                     bool include_last_offset, std::optional<int64_t> padding_idx) {
  check_arguments(input, weight, mode, per_sample_weights);
  const int64_t count = input.numel(), num = weight.size(0);
  const TensorOptions i64 = TensorOptions(kInt64).device(input.device());
  Tensor bag;
  int64_t bags = 0;
  if (input.dim() == 2) {
    KILN_CHECK(!offsets.defined(), kOp,
               ": a 2-D input holds one bag per row and takes no offsets, got ", describe(offsets));
    bags = input.size(0);
    bag = floor_divide(arange(count, i64), std::max<int64_t>(1, input.size(1)));
  } else {
    std::tie(bag, bags) = bags_from_offsets(offsets, count, include_last_offset);
  }
  std::optional<int64_t> padding_row = padding_idx;  // normalized to [0, num)
  if (padding_row) {
    KILN_CHECK(*padding_row >= -num && *padding_row < num, kOp, ": padding_idx must be within [",
               -num, ", ", num, ") for weight ", describe(weight), ", got ", *padding_row);
    if (*padding_row < 0) *padding_row += num;
  }
  const Tensor indices = input.reshape({count}).to(kInt64);
  if (count > 0) {  // checked now (the kernel checks again on every replay)
    detail::ValueCheckScope checking;
    const Tensor i = indices.detach();
    KILN_CHECK(all(logical_and(ge(i, 0), lt(i, num))).item<bool>(), kOp, ": input ",
               describe(input), " holds an index outside [0, ", num, ") for weight ",
               describe(weight));
  }
  const int64_t padding = padding_row.value_or(-1);
  if (mode == "sum") {
    const Tensor scale =
        per_sample_weights.defined() ? per_sample_weights.reshape({count}) : Tensor();
    return bag_sum(weight, indices, bag, scale, bags, padding);
  }
  const Tensor kept = ne(indices, padding);
  const TensorOptions options = TensorOptions(weight.dtype()).device(weight.device());
  const Tensor kept_count = index_add(zeros({bags}, options), 0, bag, kept.to(weight.dtype()));
  if (mode == "max")
    return bag_maxima(index_select(weight, 0, indices), kept, bag, kept_count, bags);
  return bag_sum(weight, indices, bag, {}, bags, padding) / clamp_min(kept_count, 1).unsqueeze(1);
}

}  // namespace kiln
