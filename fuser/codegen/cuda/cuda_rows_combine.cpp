// The finish and columns kernels of a rows kernel's source: the blocks' global and column
// partials combined in block order (the CPU's call order), then the outputs that depend on them.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "fuser/codegen/cuda/cuda_source_writer.h"
#include "fuser/codegen/cuda/cuda_values.h"
#include "kiln/error.h"

namespace kiln::fuser::cuda::codegen {

// A column reduction folding into slot s (its parts' reductions share the type and the fold).
size_t Source::column_reduction_of(int32_t s) const {
  for (size_t n = 0; n < k_.body.size(); ++n)
    if (is_column_reduction(k_.body[n]) && k_.body[n].index == s) return n;
  KILN_CHECK(false, "fuser: column slot ", s, " has no reduction\n", k_.str());
  return 0;
}

// Instructions `needed` of the levels `ok` in program order, inputs read at element 0 (as the
// CPU's finish and columns functions read them).
std::string Source::helper_values(const std::vector<bool>& needed, const RowsPlan& p,
                                  const std::string& indent) {
  std::string s;
  load_at_.clear();
  for (size_t q = 0; q < k_.input_types.size(); ++q) load_at_.push_back(ptr_name(q) + "[0]");
  load_used_.assign(k_.input_types.size(), false);
  for (size_t n = 0; n < k_.body.size(); ++n) {
    if (!needed[n] || is_reduction(k_.body[n].prim)) continue;
    const Level l = p.level[n];
    KILN_CHECK(l == Level::kGlobal || l == Level::kColumn || l == Level::kConst,
               "fuser: CUDA codegen: instruction ", n, " of level ", static_cast<int>(l),
               " after a global or column reduction\n", k_.str());
    s += indent + decl(n) + " = " + expr(k_.body[n]) + ";\n";
  }
  return s;
}

// The finish kernel: the blocks' partials combined in block order by one thread (as the CPU's
// finish function combines its calls', so that a global reduction of row-level values is the
// CPU's bit for bit), then the outputs that depend on them.
void Source::finish_kernel(const RowsPlan& p) {
  out_ += "\nextern \"C\" __global__ void " + symbol_ +
          "_finish(long long blocks, long long stride, const unsigned long long* partials" +
          ptr_params() + scalar_params() + ") {\n";
  out_ += "  if (blockIdx.x != 0 || threadIdx.x != 0) return;\n";
  std::string combine;
  for (size_t n = 0; n < k_.body.size(); ++n) {
    if (!live_global(p, n)) continue;
    const Instr& in = k_.body[n];
    out_ += "  " + std::string(value_type(in.type)) + " " + v(static_cast<int32_t>(n)) + " = " +
            identity(in) + ";\n";
    const std::string at = "*reinterpret_cast<const " + std::string(storage_type(in.type)) +
                           "*>(block + " + std::to_string(in.index) + ")";
    combine += "    " + v(static_cast<int32_t>(n)) + " = " + fold_name(in) + "(" +
               v(static_cast<int32_t>(n)) + ", " + read(in.type, at) + ");\n";
  }
  if (!combine.empty())
    out_ +=
        "  for (long long c = 0; c < blocks; ++c) {\n"
        "    const unsigned long long* block = partials + c * stride;\n" +
        combine + "  }\n";
  out_ += helper_values(p.finish_needed, p, "  ");
  for (size_t o = 0; o < k_.outputs.size(); ++o) {
    const auto n = static_cast<size_t>(k_.outputs[o]);
    if (p.level[n] != Level::kGlobal) continue;
    out_ += "  " + ptr_name(k_.input_types.size() + o) +
            "[0] = " + stored(k_.output_types[o], v(k_.outputs[o])) + ";\n";
  }
  out_ += "}\n";
}

// The columns kernel: a grid-stride loop over positions; per live slot, the blocks' column
// partials at the position combined in block order (the CPU's call order), then the slot's
// outputs at the position, stored contiguously (position q at element q).
void Source::columns_kernel(const RowsPlan& p) {
  out_ += "\nextern \"C\" __global__ void " + symbol_ +
          "_columns(long long blocks, long long stride, long long R, "
          "const unsigned long long* partials" +
          ptr_params() + scalar_params() + ") {\n";
  int32_t widest = 0;
  for (int32_t s = 0; s < k_.num_columns(); ++s)
    if (p.live_slot[static_cast<size_t>(s)])
      widest = std::max(widest, k_.column_parts[static_cast<size_t>(s)]);
  out_ += "  const long long step = (long long)blockDim.x * (long long)gridDim.x;\n";
  out_ +=
      "  for (long long q = (long long)blockIdx.x * (long long)blockDim.x + "
      "(long long)threadIdx.x; q < " +
      std::to_string(widest) + "ll * R; q += step) {\n";
  int64_t parts_before = 0;
  for (int32_t s = 0; s < k_.num_columns(); ++s) {
    const int64_t offset = parts_before;
    parts_before += k_.column_parts[static_cast<size_t>(s)];
    if (p.live_slot[static_cast<size_t>(s)]) columns_slot(p, s, offset);
  }
  out_ += "  }\n}\n";
}

// Slot s at position q (its partials at `offset` parts into each block's): the blocks' values
// combined, then the outputs computed from the slot.
void Source::columns_slot(const RowsPlan& p, int32_t s, int64_t offset) {
  const int32_t parts = k_.column_parts[static_cast<size_t>(s)];
  const Instr& r = k_.body[column_reduction_of(s)];
  const std::string st = storage_type(r.type), vt = value_type(r.type);
  std::vector<size_t> work;
  for (int32_t o : k_.outputs)
    if (p.slot_of[static_cast<size_t>(o)] == s) work.push_back(static_cast<size_t>(o));
  const std::vector<bool> needed =
      reach(work, [&](size_t n) { return is_column_reduction(k_.body[n]); });
  const std::string base = "partials + (" + std::to_string(k_.num_globals) + "ll + " +
                           std::to_string(offset) + "ll * R)";
  auto at = [&](const std::string& block) {
    return read(r.type, "reinterpret_cast<const " + st + "*>(" + block + ")[q]");
  };
  out_ += "    if (q < " + std::to_string(parts) + "ll * R) {\n";
  out_ += "      const unsigned long long* const base = " + base + ";\n";
  out_ += "      " + vt + " acc = " + at("base") + ";\n";
  out_ += "      for (long long c = 1; c < blocks; ++c) acc = " + std::string(fold_name(r)) +
          "(acc, " + at("base + c * stride") + ");\n";
  for (size_t n = 0; n < k_.body.size(); ++n)
    if (needed[n] && is_column_reduction(k_.body[n])) out_ += "      " + decl(n) + " = acc;\n";
  out_ += helper_values(needed, p, "      ");
  for (size_t o = 0; o < k_.outputs.size(); ++o) {
    const auto n = static_cast<size_t>(k_.outputs[o]);
    if (p.slot_of[n] != s) continue;
    out_ += "      " + ptr_name(k_.input_types.size() + o) +
            "[q] = " + stored(k_.output_types[o], v(k_.outputs[o])) + ";\n";
  }
  out_ += "    }\n";
}

}  // namespace kiln::fuser::cuda::codegen
