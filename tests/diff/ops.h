// The differential tester's op table: for each op, how the generator picks its operands and
// parameters (from the libtorch values computed so far, so that most draws are valid and a few
// are not, to test that both libraries reject the same programs), and one C++ expression that
// applies it, compiled once against kiln and once against libtorch. The kiln text of the
// expression is what a minimized program prints.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "tests/diff/program.h"

namespace kiln_diff {

using kiln::differential::Input;
using kiln::differential::input_id;
using kiln::differential::input_index;
using kiln::differential::Params;
using kiln::differential::Program;
using kiln::differential::Step;
using kiln::differential::ValueId;
using Shape = std::vector<int64_t>;

torch::ScalarType to_torch(kiln::DType t);
kiln::DType to_kiln(torch::ScalarType t);
// The input's values as libtorch makes them from the program's bytes (defined with the runner).
torch::Tensor torch_input(const Input& in);

// What the expressions use for parameters, for kiln (K) and libtorch (T).
struct K {
  static kiln::Scalar scalar(const Params& p, size_t k);
  static kiln::DType dtype(int64_t code) { return static_cast<kiln::DType>(code); }
  static std::nullopt_t none() { return std::nullopt; }
};
struct T {
  static c10::Scalar scalar(const Params& p, size_t k);
  static c10::ScalarType dtype(int64_t code) { return to_torch(K::dtype(code)); }
  static c10::nullopt_t none() { return c10::nullopt; }
};

// The generator's state while it builds one program: the values so far, as libtorch computed
// them, whose sizes and dtypes the picks read.
struct Gen {
  std::mt19937_64 rng;
  Program* program = nullptr;
  std::vector<ValueId> ids;
  std::vector<torch::Tensor> values;
  size_t max_inputs = 6;

  int64_t uniform(int64_t lo, int64_t hi) {  // inclusive
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  }
  bool coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

  // A value satisfying pred (a recent one half of the time), or -1.
  int pick(const std::function<bool(const torch::Tensor&)>& pred) {
    std::vector<int> found;
    for (size_t i = 0; i < values.size(); ++i)
      if (pred(values[i])) found.push_back(static_cast<int>(i));
    if (found.empty()) return -1;
    if (coin(0.5)) return found.back();
    return found[static_cast<size_t>(uniform(0, static_cast<int64_t>(found.size()) - 1))];
  }
  ValueId id(int index) const { return ids[static_cast<size_t>(index)]; }
  const torch::Tensor& value(int index) const { return values[static_cast<size_t>(index)]; }

  kiln::DType random_dtype() {
    static const kiln::DType all[] = {kiln::kFloat32, kiln::kFloat64, kiln::kInt32, kiln::kInt64,
                                      kiln::kBool};
    // Mostly floats: most ops and every gradient want them.
    int64_t r = uniform(0, 9);
    return r < 4 ? kiln::kFloat32 : r < 6 ? kiln::kFloat64 : all[uniform(2, 4)];
  }
  kiln::DType random_float_dtype() { return coin(0.7) ? kiln::kFloat32 : kiln::kFloat64; }
  Shape random_shape(int max_rank = 3) {
    Shape s(static_cast<size_t>(uniform(0, max_rank)));
    for (auto& d : s) d = coin(0.08) ? 0 : uniform(1, 4);
    return s;
  }
  // A shape that broadcasts with `s`: some dims set to 1, some leading dims dropped.
  Shape broadcastable(const Shape& s) {
    Shape out(s.begin() + uniform(0, static_cast<int64_t>(s.size())), s.end());
    for (auto& d : out)
      if (coin(0.3)) d = 1;
    return out;
  }
  // A new program input (returns its value id), or a kind of failure when there are enough.
  // Callers draw its shape and dtype in separate statements: the order in which a call's
  // arguments are evaluated is unspecified (GCC and clang differ), and a seed must name the same
  // program whatever compiler built the tester.
  ValueId new_input(const Shape& shape, kiln::DType dtype, double lo = -3, double hi = 3) {
    Input in;
    in.shape = shape;
    in.dtype = dtype;
    in.seed = rng();
    in.lo = lo;
    in.hi = hi;
    in.special = lo < 0 && coin(0.3);  // index tensors (lo >= 0) stay in range
    program->inputs.push_back(in);
    ids.push_back(input_id(program->inputs.size() - 1));
    values.push_back(torch_input(in));
    return ids.back();
  }
  bool inputs_full() const { return program->inputs.size() >= max_inputs; }

  // A random dim of a rank-r tensor, negative half of the time.
  int64_t dim(int64_t rank) {
    if (rank == 0) return coin(0.5) ? 0 : -1;  // a 0-dim tensor accepts dim 0 and -1
    int64_t d = uniform(0, rank - 1);
    return coin(0.5) ? d - rank : d;
  }
  void scalar(Params& p) {
    using Kind = Params::ScalarKind;
    static const double special[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1e30, 1e-30};
    int64_t r = uniform(0, 9);
    if (r < 4) {
      p.scalar_kind = Kind::Int;
      p.scalars.push_back(static_cast<double>(uniform(-3, 3)));
    } else if (r < 8) {
      p.scalar_kind = Kind::Float;
      p.scalars.push_back(static_cast<double>(uniform(-10, 10)) / 4);
    } else if (r < 9) {
      p.scalar_kind = Kind::Bool;
      p.scalars.push_back(static_cast<double>(coin(0.5)));
    } else {
      p.scalar_kind = Kind::Float;
      p.scalars.push_back(special[uniform(0, 6)]);
    }
  }
};

using Pick = bool (*)(Gen&, Step&);

enum OpFlags : unsigned {
  kInexact = 1,  // not bit-exact between kiln's modes (transcendentals, reordered sums)
  // Ends the program: libtorch's backward multiplies the op's zero local gradients by the
  // incoming gradient, so an infinite or NaN one from a later step gives NaN where kiln's chain
  // rule gives 0 (deliberate difference); only the finite random weights reach it.
  kLast = 2,
};

struct Op {
  const char* name;
  unsigned flags;
  Pick pick;
  kiln::Tensor (*kiln_fn)(const std::vector<kiln::Tensor>&, const Params&);
  torch::Tensor (*torch_fn)(const std::vector<torch::Tensor>&, const Params&);
  const char* source;  // the kiln expression, over a[k] and p
};

const std::vector<Op>& op_table();

}  // namespace kiln_diff
