// PLACEHOLDER: replaced by the reductions implementation.
#include "kiln/ops.h"
namespace kiln {
#define TODO KILN_FAIL("not implemented yet")
Tensor sum(const Tensor&, const std::vector<int64_t>&, bool, std::optional<DType>) { TODO; }
Tensor mean(const Tensor&, const std::vector<int64_t>&, bool) { TODO; }
Tensor prod(const Tensor&, const std::vector<int64_t>&, bool) { TODO; }
Tensor max(const Tensor&) { TODO; }
std::tuple<Tensor, Tensor> max(const Tensor&, int64_t, bool) { TODO; }
Tensor min(const Tensor&) { TODO; }
std::tuple<Tensor, Tensor> min(const Tensor&, int64_t, bool) { TODO; }
Tensor amax(const Tensor&, const std::vector<int64_t>&, bool) { TODO; }
Tensor amin(const Tensor&, const std::vector<int64_t>&, bool) { TODO; }
Tensor argmax(const Tensor&, std::optional<int64_t>, bool) { TODO; }
Tensor argmin(const Tensor&, std::optional<int64_t>, bool) { TODO; }
Tensor var(const Tensor&, const std::vector<int64_t>&, int64_t, bool) { TODO; }
Tensor std(const Tensor&, const std::vector<int64_t>&, int64_t, bool) { TODO; }
Tensor logsumexp(const Tensor&, const std::vector<int64_t>&, bool) { TODO; }
Tensor all(const Tensor&, const std::vector<int64_t>&, bool) { TODO; }
Tensor any(const Tensor&, const std::vector<int64_t>&, bool) { TODO; }
}  // namespace kiln
