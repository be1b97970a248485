// A vector of tensors taken from this thread's spares and given back empty with its capacity, so
// that a replay of a small plan allocates none of its working vectors (exec/plan_run.cpp).
#pragma once

#include <vector>

#include "kiln/tensor.h"

namespace kiln::jit {

// A run's working vectors (its slots, a step's arguments and outputs, a replay's plan inputs). A
// run inside a step's op takes spares of its own.
class ScratchTensors {
 public:
  ScratchTensors();
  ~ScratchTensors();
  ScratchTensors(const ScratchTensors&) = delete;
  ScratchTensors& operator=(const ScratchTensors&) = delete;
  std::vector<Tensor>& operator*() { return *v_; }

 private:
  std::vector<Tensor>* v_;  // a spare, or a new one; given back (or deleted) by the destructor
};

}  // namespace kiln::jit
