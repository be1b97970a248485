// searchsorted and bucketize, with libtorch's names and semantics: where values would be inserted
// into the innermost dim of a sorted sequence to keep it sorted.
//
// One table op, "searchsorted" (OpKind::NN, its own kernel), recorded lazily and traced: the
// sequence and the values in their promoted dtype, right and out_int32 as attributes, int64 or
// int32 indices out. A sorter (the permutation that sorts an unsorted sequence) is applied first
// with gather, whose range check it gets. The kernel binary-searches each value's line on the
// host, values spread over the thread pool; NaN sorts as the largest value, as kiln's sort (a CUDA
// tensor goes through the host). The indices are integers: nothing differentiates through them.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/ops.h"
#include "lib/dispatch.h"
#include "lib/lazy.h"
#include "lib/op_registry.h"
#include "lib/op_table.h"
#include "lib/parallel.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::describe;

namespace {
using Inputs = std::vector<Tensor>;

detail::OpHandle searchsorted_def;

// a < b with NaN the largest value (two NaNs are equal).
template <typename T>
bool before(T a, T b) {
  if constexpr (std::is_floating_point_v<T>)
    if (b != b) return a == a;
  return a < b;
}

// The insertion index of each value into its line of seq (of one dtype, checked): the first
// position (the last, with right) that keeps the line sorted.
Tensor searchsorted_kernel(const Tensor& seq_in, const Tensor& values_in, bool right,
                           bool out_int32) {
  const Tensor seq = seq_in.to(kCPU).contiguous();
  const Tensor values = values_in.to(kCPU).contiguous();
  Tensor out = detail::make_empty(values.sizes(), kInt64);
  const int64_t line = seq.size(-1);
  // A 1-D sequence serves every value; otherwise each row of `row` values has its own line.
  const int64_t row = seq.dim() == 1 ? values.numel() : values.size(-1);
  detail::dispatch_numeric(seq.dtype(), "searchsorted", [&](auto tag) {
    using T = KILN_TYPE(tag);
    const T* s = seq.data_ptr<T>();
    const T* v = values.data_ptr<T>();
    int64_t* index = out.data_ptr<int64_t>();
    detail::parallel_for(values.numel(), detail::kParallelGrain / 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const T* first = s + (row == 0 ? 0 : i / row) * line;
        const T value = v[i];
        const T* at = right ? std::upper_bound(first, first + line, value, before<T>)
                            : std::lower_bound(first, first + line, value, before<T>);
        index[i] = at - first;
      }
    });
  });
  return (out_int32 ? out.to(kInt32) : out).to(values_in.device());
}

// The checks of torch's: shapes, dtypes, devices, side and right, the sorter.
void check_search(const Tensor& seq, const Tensor& values, bool right,
                  std::optional<std::string_view> side, const Tensor& sorter, bool scalar) {
  const char* op = "searchsorted";
  detail::check_defined(seq, op, "sorted_sequence");
  detail::check_defined(values, op, "values");
  KILN_CHECK(seq.dim() >= 1, op, ": the sorted sequence must have at least one dim, got ",
             describe(seq));
  KILN_CHECK(seq.dtype() != kBool && values.dtype() != kBool, op,
             ": not supported for bool tensors, got sorted_sequence ", describe(seq),
             " and values ", describe(values));
  KILN_CHECK(seq.device() == values.device(), op,
             ": expected the sorted sequence and the values on one device, got ", seq.device(),
             " and ", values.device());
  KILN_CHECK(!side || *side == "left" || *side == "right", op,
             ": side must be \"left\" or \"right\", got \"", std::string(side.value_or("")), "\"");
  KILN_CHECK(!side || !right || *side == "right", op, ": side \"left\" contradicts right = true");
  if (seq.dim() > 1) {
    KILN_CHECK(!scalar, op, ": a scalar value needs a 1-D sorted sequence, got ", describe(seq));
    const bool leading_match =
        values.dim() == seq.dim() &&
        std::equal(seq.sizes().begin(), seq.sizes().end() - 1, values.sizes().begin());
    KILN_CHECK(leading_match, op,
               ": the sorted sequence must be 1-D or match the values in every dim but the "
               "last, got sorted_sequence ",
               describe(seq), " and values ", describe(values));
  }
  if (!sorter.defined()) return;
  KILN_CHECK(sorter.dtype() == kInt64, op, ": sorter must be int64, got ", describe(sorter));
  KILN_CHECK(sorter.sizes() == seq.sizes(), op,
             ": sorter must have the sorted sequence's shape, got sorter ", describe(sorter),
             " and sorted_sequence ", describe(seq));
  KILN_CHECK(sorter.device() == seq.device(), op,
             ": expected sorter on the sorted sequence's device, got ", sorter.device(), " and ",
             seq.device());
}

Tensor search(const Tensor& seq_in, const Tensor& values_in, bool out_int32, bool right,
              std::optional<std::string_view> side, const Tensor& sorter, bool scalar) {
  check_search(seq_in, values_in, right, side, sorter, scalar);
  right = right || (side && *side == "right");
  const DType common = detail::result_type(seq_in, values_in);
  Tensor seq = seq_in.to(common).detach();
  const Tensor values = values_in.to(common).detach();
  if (sorter.defined()) seq = gather(seq, -1, sorter);
  if (detail::should_record(Inputs{seq, values}))
    return detail::lazy_record1(searchsorted_def, {seq, values}, {right, out_int32},
                                {values.sizes(), out_int32 ? kInt32 : kInt64});
  return searchsorted_kernel(seq, values, right, out_int32);
}
}  // namespace

void registration::register_searchsorted() {
  searchsorted_def.bind(detail::register_op({"searchsorted",
                                             detail::OpKind::NN,
                                             2,
                                             detail::DTypeRule::Custom,
                                             false,
                                             [](const Inputs& in, const detail::Attrs& a) {
                                               return Inputs{searchsorted_kernel(
                                                   in[0], in[1], detail::attr_bool(a.at(0)),
                                                   detail::attr_bool(a.at(1)))};
                                             },
                                             {"right", "out_int32"}}));
}

Tensor searchsorted(const Tensor& sorted_sequence, const Tensor& values, bool out_int32, bool right,
                    std::optional<std::string_view> side, const Tensor& sorter) {
  return search(sorted_sequence, values, out_int32, right, side, sorter, false);
}

Tensor searchsorted(const Tensor& sorted_sequence, const Scalar& value, bool out_int32, bool right,
                    std::optional<std::string_view> side, const Tensor& sorter) {
  detail::check_defined(sorted_sequence, "searchsorted", "sorted_sequence");
  // A 0-dim tensor of the dtype the scalar promotes to with the sequence, as torch.
  const DType dtype = detail::result_type(sorted_sequence, detail::wrap_scalar(value));
  const Tensor v = full({}, value, TensorOptions(dtype).device(sorted_sequence.device()));
  return search(sorted_sequence, v, out_int32, right, side, sorter, true);
}

Tensor bucketize(const Tensor& values, const Tensor& boundaries, bool out_int32, bool right) {
  detail::check_defined(boundaries, "bucketize", "boundaries");
  KILN_CHECK(boundaries.dim() == 1, "bucketize: boundaries must be 1-D, got ",
             describe(boundaries));
  return searchsorted(boundaries, values, out_int32, right);
}

Tensor bucketize(const Scalar& value, const Tensor& boundaries, bool out_int32, bool right) {
  detail::check_defined(boundaries, "bucketize", "boundaries");
  KILN_CHECK(boundaries.dim() == 1, "bucketize: boundaries must be 1-D, got ",
             describe(boundaries));
  return searchsorted(boundaries, value, out_int32, right);
}

// Membership by binary search: the test elements sorted once, each element found where
// searchsorted would insert it (or not). Equality is ==: NaN is in nothing, -0.0 and 0 match.
Tensor isin(const Tensor& elements, const Tensor& test_elements, bool assume_unique, bool invert) {
  (void)assume_unique;  // the search needs no uniqueness
  const char* op = "isin";
  detail::check_defined(elements, op, "elements");
  detail::check_defined(test_elements, op, "test_elements");
  KILN_CHECK(elements.device() == test_elements.device(), op,
             ": expected elements and test_elements on one device, got ", describe(elements),
             " on ", elements.device().str(), " and ", describe(test_elements), " on ",
             test_elements.device().str());
  DType common = detail::result_type(elements, test_elements);
  if (common == kBool) common = kInt64;  // searched as 0 and 1
  const Tensor values = elements.to(common);
  const int64_t n = test_elements.numel();
  Tensor found;
  if (n == 0) {
    found = zeros(elements.sizes(), TensorOptions(kBool).device(elements.device()));
  } else {
    const Tensor sorted = std::get<0>(sort(test_elements.to(common).reshape({-1})));
    const Tensor at = searchsorted(sorted, values).clamp_max(n - 1);
    found = eq(take(sorted, at), values);
  }
  return invert ? logical_not(found) : found;
}

Tensor isin(const Tensor& elements, const Scalar& test_element, bool assume_unique, bool invert) {
  (void)assume_unique;
  detail::check_defined(elements, "isin", "elements");
  return invert ? ne(elements, test_element) : eq(elements, test_element);
}

Tensor isin(const Scalar& element, const Tensor& test_elements, bool assume_unique, bool invert) {
  (void)assume_unique;
  detail::check_defined(test_elements, "isin", "test_elements");
  const Tensor found = any(eq(test_elements, element));
  return invert ? logical_not(found) : found;
}

}  // namespace kiln
