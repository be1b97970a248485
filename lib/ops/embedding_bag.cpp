// torch.nn.functional.embedding_bag composed of kiln's indexing ops: every index's row is looked
// up (index_select, whose gradient adds into weight's rows), each position is assigned its bag
// (row of a 2-D input, or the last offset at or before it), and the rows are added into their
// bags (index_add) or reduced to their maximum (the first row holding it, found with
// scatter_reduce's "amax" and "amin"). padding_idx entries are masked rather than removed, so
// shapes never depend on values and a traced step replays.
#include <algorithm>
#include <limits>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "kiln/nn_functional.h"
#include "kiln/ops.h"
#include "lib/lazy.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;

namespace {

constexpr const char* kOp = "embedding_bag";

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

Tensor embedding_bag(const Tensor& input, const Tensor& weight, const Tensor& offsets,
                     std::string_view mode, const Tensor& per_sample_weights,
                     bool include_last_offset, std::optional<int64_t> padding_idx) {
  check_arguments(input, weight, mode, per_sample_weights);
  const int64_t count = input.numel(), num = weight.size(0), dim = weight.size(1);
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
  Tensor rows = index_select(weight, 0, indices);
  if (per_sample_weights.defined()) rows = rows * per_sample_weights.reshape({count, 1});
  const Tensor kept = padding_row ? ne(indices, *padding_row)
                                  : ones({count}, TensorOptions(kBool).device(input.device()));
  const TensorOptions options = TensorOptions(weight.dtype()).device(weight.device());
  const Tensor kept_count = index_add(zeros({bags}, options), 0, bag, kept.to(weight.dtype()));
  if (mode == "max") return bag_maxima(rows, kept, bag, kept_count, bags);
  if (padding_row) rows = where(kept.unsqueeze(1), rows, 0);
  const Tensor sums = index_add(zeros({bags, dim}, options), 0, bag, rows);
  if (mode == "sum") return sums;
  return sums / clamp_min(kept_count, 1).unsqueeze(1);
}

}  // namespace kiln
