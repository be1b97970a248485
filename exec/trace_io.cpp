// Saving and loading a traced Function: its specialization's graph, captured tensors and a
// description of how calls bind to the graph (jit/serialize.h holds the graph format).
#include <sstream>

#include "exec/executor.h"
#include "exec/specialization.h"
#include "jit/serialize.h"
#include "kiln/error.h"
#include "kiln/jit.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

// Function files: the graph and its captured tensors (serialize.h), and as metadata a line-based
// description of how the graph is called:
//   kiln-function 2
//   inputs <n> then per call argument: dtype code, requires_grad, rank, sizes (the guard)
//   bindings <k> then per graph input: the call argument, or -1 for a captured tensor
//   outputs <m> then per graph output: kind (0 return, 1 write-back, 2 grad, 3 saved for a
//   backward: ignored by load), the graph input whose captured tensor it writes (-1 for returns)
//   and, for returns, 1 when the function computed the value (Specialization::fresh_returns), else
//   0. Version 1 files lack that last column: their returns load as not computed.
void Function::save(const std::string& path) const {
  KILN_CHECK(impl_, "jit::Function::save: empty Function");
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const Specialization* s = impl_->last ? impl_->last : impl_->specs.at(0).get();
  std::ostringstream meta;
  meta << "kiln-function 2\ninputs " << s->key.size() << '\n';
  for (const InputKey& k : s->key) {
    meta << static_cast<int>(k.dtype) << ' ' << k.requires_grad << ' ' << k.sizes.size();
    for (int64_t d : k.sizes) meta << ' ' << d;
    meta << '\n';
  }
  // A hyperparameter read at each call is saved as its value now: a captured constant. The file
  // has no way to say that a call reads a .grad, or writes one other than by assigning a captured
  // leaf's.
  for (const GradSlot& g : s->grad_slots)
    KILN_CHECK(g.input < 0 && (g.write == GradSlot::Write::kNone ||
                               (g.write == GradSlot::Write::kAssign && g.leaf)),
               "jit::Function::save: the function reads the .grad of a tensor at each call, "
               "writes it in place, clears it or assigns an argument's; such a function cannot be "
               "saved");
  auto is_scalar = [s](int64_t a) { return a >= static_cast<int64_t>(s->key.size()); };
  meta << "bindings " << s->arguments.size() << '\n';
  for (int64_t a : s->arguments) meta << (is_scalar(a) ? -1 : a) << '\n';
  meta << "outputs " << s->kinds.size() << '\n';
  for (size_t k = 0; k < s->kinds.size(); ++k) {
    int64_t target = -1;
    const bool targets = s->kinds[k] == OutputKind::WriteBack || s->kinds[k] == OutputKind::Grad;
    for (size_t i = 0; i < s->captures.size() && targets; ++i) {
      if (!s->captures[i].defined()) continue;
      const Tensor& cap = s->captures[i];
      if (s->kinds[k] == OutputKind::WriteBack &&
          cap.impl()->storage == s->write_targets[k].impl()->storage &&
          cap.numel() == s->write_targets[k].numel() && cap.is_contiguous() &&
          cap.storage_offset() == 0)
        target = static_cast<int64_t>(i);
      if (s->kinds[k] == OutputKind::Grad &&
          s->captures[i].impl_ptr() == s->grad_slots[s->grad_slot_of[k]].leaf)
        target = static_cast<int64_t>(i);
    }
    KILN_CHECK(!targets || target >= 0, "jit::Function::save: output ", k,
               " writes a tensor the function never reads; such a function cannot be saved");
    const bool fresh = s->fresh_returns.size() > k && s->fresh_returns[k];
    meta << static_cast<int64_t>(s->kinds[k]) << ' ' << target << ' ' << fresh << '\n';
  }
  std::vector<Tensor> constants;
  for (size_t i = 0; i < s->captures.size(); ++i) {
    const int64_t a = s->arguments[i];
    if (is_scalar(a))
      constants.push_back(
          s->arguments_of(std::vector<Tensor>(s->key.size())).at(static_cast<size_t>(a)));
    else
      constants.push_back(a >= 0 ? Tensor() : s->captures[i].detach());
  }
  save_graph(path, *s->graph, constants, meta.str());
}

namespace {
// Reads a function description, raising kiln::Error naming the file and what is wrong.
class DescriptionReader {
 public:
  DescriptionReader(const std::string& path, const std::string& text) : path_(path), meta_(text) {}

  [[noreturn]] void fail(const std::string& what) const {
    KILN_FAIL("kiln::jit::load: ", path_, ": bad function description (", what, ")");
  }
  int64_t read_int(const char* what) {
    int64_t v;
    if (!(meta_ >> v)) fail(std::string("reading ") + what);
    return v;
  }
  void expect_word(const char* word) {
    std::string w;
    if (!(meta_ >> w) || w != word) fail(std::string("expected '") + word + "'");
  }

  // The header and the guard: per call argument, its dtype, requires_grad and sizes.
  void read_inputs(Specialization& spec) {
    expect_word("kiln-function");
    version_ = read_int("version");
    if (version_ != 1 && version_ != 2) fail("unknown version");
    expect_word("inputs");
    const int64_t n = read_int("input count");
    if (n < 0 || n > 1 << 20) fail("input count");
    for (int64_t i = 0; i < n; ++i) {
      const int64_t dtype = read_int("dtype");
      const int64_t rg = read_int("requires_grad");
      const int64_t rank = read_int("rank");
      if (dtype < 0 || dtype > static_cast<int64_t>(DType::Float64) || rank < 0 || rank > 64)
        fail("input type");
      InputKey k{static_cast<DType>(dtype), {}, kCPU, rg != 0};
      for (int64_t d = 0; d < rank; ++d) k.sizes.push_back(read_int("size"));
      spec.key.push_back(k);
    }
  }

  // Per graph input: the call argument, or -1 for its captured tensor.
  void read_bindings(const LoadedGraph& loaded, Specialization& spec) {
    expect_word("bindings");
    const Graph& g = *loaded.graph;
    if (read_int("binding count") != static_cast<int64_t>(g.inputs().size()) ||
        loaded.constants.size() != g.inputs().size())
      fail("bindings do not match the graph's inputs");
    const auto n = static_cast<int64_t>(spec.key.size());
    for (size_t i = 0; i < g.inputs().size(); ++i) {
      const int64_t a = read_int("binding");
      if (a < -1 || a >= n) fail("binding out of range");
      if (a < 0 && !loaded.constants[i].defined()) fail("a captured tensor is missing");
      spec.arguments.push_back(a);
      spec.captures.push_back(loaded.constants[i]);
    }
  }

  // Per graph output: its kind and the captured tensor it writes back or whose .grad it assigns.
  void read_outputs(const Graph& g, Specialization& spec) {
    expect_word("outputs");
    if (read_int("output count") != static_cast<int64_t>(g.outputs().size()))
      fail("outputs do not match the graph's");
    for (size_t k = 0; k < g.outputs().size(); ++k) {
      const int64_t kind = read_int("output kind");
      const int64_t target = read_int("output target");
      const int64_t fresh = version_ >= 2 ? read_int("output computed") : 0;
      if (kind < 0 || kind > 3) fail("output kind");
      if (fresh != 0 && (fresh != 1 || kind != 0)) fail("output computed");
      spec.kinds.push_back(static_cast<OutputKind>(kind));
      spec.fresh_returns.push_back(fresh != 0);  // indexed by output, as a trace's
      spec.write_targets.emplace_back();
      spec.grad_slot_of.emplace_back();
      if (kind == 0 || kind == 3) continue;
      if (target < 0 || target >= static_cast<int64_t>(spec.captures.size()) ||
          spec.arguments[static_cast<size_t>(target)] >= 0)
        fail("output target");
      bind_output(spec, kind, spec.captures[static_cast<size_t>(target)]);
    }
  }

 private:
  static void bind_output(Specialization& spec, int64_t kind, Tensor& cap) {
    if (kind == 1) {
      spec.write_targets.back() = detail::flat_storage_tensor(cap.impl()->storage, cap.dtype());
      return;
    }
    if (!cap.requires_grad()) cap.requires_grad_(true);
    GradSlot slot;
    slot.leaf = cap.impl_ptr();
    slot.write = GradSlot::Write::kAssign;
    spec.grad_slot_of.back() = spec.grad_slots.size();
    spec.grad_slots.push_back(std::move(slot));
  }

  const std::string& path_;
  std::istringstream meta_;
  int64_t version_ = 0;
};
}  // namespace

Function load(const std::string& path) {
  LoadedGraph loaded = load_graph(path);
  DescriptionReader reader(path, loaded.metadata);
  auto spec = std::make_unique<Specialization>();
  reader.read_inputs(*spec);
  reader.read_bindings(loaded, *spec);
  reader.read_outputs(*loaded.graph, *spec);
  spec->graph = std::move(loaded.graph);
  spec->plan = std::make_unique<Plan>(*spec->graph, in_place_inputs(*spec));
  spec->grad_mode = true;  // no backward: serves calls with autograd on or off
  Function f;
  f.impl_ = std::make_shared<FunctionImpl>();
  f.impl_->max_specializations = 1;
  f.impl_->specs.push_back(std::move(spec));
  return f;
}

}  // namespace kiln::jit
