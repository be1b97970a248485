// Checks and kernels shared by the ops that index with a tensor of positions (lib/ops/index.cpp,
// lib/ops/scatter.cpp): every index is read and range-checked before anything is written.
#pragma once

#include <string>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::detail {

// self, index and src on one device, checked before recording too (a mixed call would otherwise
// raise only inside the executor). A 0-dim CPU index counts as a number, as everywhere
// (lib/lazy.cpp): its value is read on the host anyway.
void check_index_device(const char* op, const Tensor& self, const Tensor& index, const Tensor& src);

void check_index_dtype(const Tensor& index, const char* op, bool allow_int32);

// The index values in row-major order, each checked to lie in [0, size). A pending index is
// computed first (only its own sub-graph); `what` names the indexed dimension in the error.
std::vector<int64_t> read_indices(const Tensor& index, int64_t size, const char* op,
                                  const std::string& what);

// The checks of a scatter of src into self at index along dim (torch's): one dtype, index and src
// of self's rank (a 0-dim self takes only 0-dim ones; torch also takes [1]), nowhere larger than
// src, nor than self outside dim. Returns dim wrapped and src narrowed to index's shape (the part
// of src that is scattered).
struct ScatterOperands {
  int64_t dim;
  Tensor src;
};
ScatterOperands check_scatter(const char* op, const Tensor& self, int64_t dim, const Tensor& index,
                              const Tensor& src);

// How a scattered value combines with the one at its position.
enum class ScatterMode { Add, Assign, Multiply, Max, Min };

// self with src (of index's shape, index_shape) combined in at positions idx along d, in index's
// row-major order (so the last of repeated positions is assigned last). Without include_self a
// position's first scattered value replaces self's. CPU tensors; Max and Min propagate NaN from
// either side.
Tensor scatter_values(const Tensor& self, int64_t d, const std::vector<int64_t>& idx,
                      const Shape& index_shape, const Tensor& src, ScatterMode mode,
                      bool include_self = true);

}  // namespace kiln::detail
