// Elementwise kernels' source: kiln_body (one element's program) and the flat (scalar and 4-wide)
// and strided grid-stride loops that call it.
#include <string>
#include <vector>

#include "fuser/codegen/cuda/cuda_source_writer.h"
#include "fuser/codegen/cuda/cuda_values.h"

namespace kiln::fuser::cuda::codegen {

namespace {
// The 4-wide vector type of a stored dtype, or null when the flat kernel has no 4-wide loop.
const char* vector_type(DType t) {
  switch (t) {
    case kFloat32:
      return "float4";
    case kInt32:
      return "int4";
    case kBool:
      return "uchar4";
    default:
      return nullptr;
  }
}

// `s` with `term` added (" + " between terms).
void add_term(std::string& s, const std::string& term) {
  s += std::string(s.empty() ? "" : " + ") + term;
}
}  // namespace

bool Source::vectorizable() const {
  if (layout_.rows) {
    // Rows: every tensor of a type with a vector type, none strided along the row (kAny), and some
    // moving along it (kUnit: those the quads move).
    bool any_unit = false;
    for (size_t p = 0; p < num_ptrs(); ++p) {
      const Layout::Inner inner = p < layout_.inner.size() ? layout_.inner[p] : Layout::kAny;
      if (!vector_type(ptr_type(p)) || inner == Layout::kAny) return false;
      any_unit |= inner == Layout::kUnit;
    }
    return any_unit;
  }
  if (!layout_.flat) return false;
  for (size_t p = 0; p < num_ptrs(); ++p)
    if (!single(p) && !vector_type(ptr_type(p))) return false;
  return true;
}

// The instructions some output needs (a backward pass over the straight line).
std::vector<bool> Source::live_body() const {
  const size_t n = k_.body.size();
  std::vector<bool> live(n, false);
  for (int32_t o : k_.outputs) live.at(static_cast<size_t>(o)) = true;
  for (size_t i = n; i-- > 0;) {
    if (!live[i]) continue;
    const Instr& in = k_.body[i];
    for (int32_t op : {in.a, in.b, in.c})
      if (op >= 0) live.at(static_cast<size_t>(op)) = true;
  }
  return live;
}

// kiln_body(x0.., scalars.., &o0..): the program for one element, from its inputs' stored
// values. Instructions no output needs are left out.
void Source::body() {
  const std::vector<bool> live = live_body();
  out_ += "\nKILN_D void kiln_body(";
  std::string params;
  for (size_t p = 0; p < k_.input_types.size(); ++p)
    params += std::string(params.empty() ? "" : ", ") + storage_type(k_.input_types[p]) + " x" +
              std::to_string(p);
  params += scalar_params();
  for (size_t o = 0; o < k_.outputs.size(); ++o)
    params += std::string(params.empty() ? "" : ", ") + storage_type(k_.output_types[o]) + "& o" +
              std::to_string(o);
  if (params.rfind(", ", 0) == 0) params = params.substr(2);
  out_ += params + ") {\n";
  for (size_t i = 0; i < k_.body.size(); ++i) {
    if (!live[i]) continue;
    const Instr& in = k_.body[i];
    out_ += "  const " + std::string(value_type(in.type)) + " " + v(static_cast<int32_t>(i)) +
            " = " + expr(in) + ";\n";
  }
  for (size_t o = 0; o < k_.outputs.size(); ++o) {
    const std::string value = v(k_.outputs[o]);
    out_ += "  o" + std::to_string(o) + " = " +
            (k_.output_types[o] == kBool ? "(unsigned char)" + value : value) + ";\n";
  }
  out_ += "}\n";
}

// The call of kiln_body for element `index` of each pointer (offsets[p] its index per pointer).
std::string Source::body_call(const std::vector<std::string>& offsets) const {
  std::string s = "kiln_body(";
  std::string args;
  const size_t n = k_.input_types.size();
  for (size_t p = 0; p < num_ptrs(); ++p) {
    if (p == n) args += scalar_args();
    args += ", " + ptr_name(p) + "[" + offsets[p] + "]";
  }
  if (n == num_ptrs()) args += scalar_args();
  return s + args.substr(2) + ");";
}

void Source::flat() {
  out_ += "\ntemplate <typename U>\nKILN_D void kiln_flat(U n" + ptr_params() + scalar_params() +
          ") {\n";
  out_ += "  const U step = (U)blockDim.x * (U)gridDim.x;\n";
  out_ += "  U first = (U)blockIdx.x * (U)blockDim.x + (U)threadIdx.x;\n";
  if (variant_.vec && vectorizable()) flat_vec_loop();
  std::vector<std::string> offsets;
  for (size_t p = 0; p < num_ptrs(); ++p) offsets.push_back(single(p) ? "0" : "i");
  out_ += "  for (U i = first; i < n; i += step) " + body_call(offsets) + "\n}\n";
  out_ += "\nextern \"C\" __global__ void " + symbol_ + "(long long n" + entry_params() +
          scalar_params() + ") {\n";
  const std::string args = entry_args() + scalar_args();
  out_ += "  kiln_flat<" + index_type() + ">((" + index_type() + ")n" + args + ");\n}\n";
}

// 4 elements per access: each pointer viewed as 4-vectors (aligned: the launcher picks this
// variant only then), the body run on each lane; flat() finishes the tail of n % 4 elements one by
// one.
void Source::flat_vec_loop() {
  const size_t n = k_.input_types.size();
  out_ += "  {\n    const U chunks = n / 4;\n";
  out_ += "    for (U c = first; c < chunks; c += step) {\n";
  for (size_t p = 0; p < n; ++p) {
    if (single(p)) continue;
    out_ += "      const " + std::string(vector_type(ptr_type(p))) + " a" + std::to_string(p) +
            " = reinterpret_cast<const " + vector_type(ptr_type(p)) + "*>(" + ptr_name(p) +
            ")[c];\n";
  }
  for (size_t p = n; p < num_ptrs(); ++p)
    out_ += "      " + std::string(vector_type(ptr_type(p))) + " a" + std::to_string(p) + ";\n";
  for (const char* lane : {"x", "y", "z", "w"}) {
    std::string args;
    for (size_t p = 0; p < num_ptrs(); ++p) {
      if (p == n) args += scalar_args();
      args += ", " + (single(p) ? ptr_name(p) + "[0]" : "a" + std::to_string(p) + "." + lane);
    }
    if (n == num_ptrs()) args += scalar_args();
    out_ += "      kiln_body(" + args.substr(2) + ");\n";
  }
  for (size_t p = n; p < num_ptrs(); ++p)
    out_ += "      reinterpret_cast<" + std::string(vector_type(ptr_type(p))) + "*>(" +
            ptr_name(p) + ")[c] = a" + std::to_string(p) + ";\n";
  out_ += "    }\n    first += chunks * 4;\n  }\n";
}

// Element e of the iteration shape: its index per dim from the sizes (the innermost one `j`),
// each pointer's offset the sum of index times stride, the innermost as the layout says.
void Source::strided() {
  const int rank = layout_.rank;
  const size_t np = num_ptrs();
  out_ += "\nstruct KilnDims {\n  long long size[" + std::to_string(rank) +
          "];\n  long long stride[" + std::to_string(np * static_cast<size_t>(rank)) +
          "];  // pointer-major\n};\n";
  out_ += "\ntemplate <typename U, typename S>\nKILN_D void kiln_strided(U n, const KilnDims& d" +
          ptr_params() + scalar_params() + ") {\n";
  for (int dim = 1; dim < rank; ++dim)
    out_ += "  const U size" + std::to_string(dim) + " = (U)d.size[" + std::to_string(dim) + "];\n";
  bool need_j = false;
  for (size_t p = 0; p < np; ++p) need_j |= layout_.inner[p] != Layout::kZero;
  out_ += "  const U step = (U)blockDim.x * (U)gridDim.x;\n";
  out_ += "  for (U e = (U)blockIdx.x * (U)blockDim.x + (U)threadIdx.x; e < n; e += step) {\n";
  const std::vector<std::string> idx = strided_indices(need_j);
  std::vector<std::string> offsets;
  for (size_t p = 0; p < np; ++p) {
    const std::string name = "o" + ptr_name(p);
    out_ += "    const S " + name + " = " + strided_offset(p, idx) + ";\n";
    offsets.push_back(name);
  }
  out_ += "    " + body_call(offsets) + "\n  }\n}\n";
  out_ += "\nextern \"C\" __global__ void " + symbol_ + "(long long n, KilnDims dims" +
          ptr_params() + scalar_params() + ") {\n";
  const std::string args = "dims" + ptr_args() + scalar_args();
  out_ += "  kiln_strided<" + index_types() + ">((" + index_type() + ")n, " + args + ");\n}\n";
}

// Element e's index per outer dim (innermost first; the outermost is what remains of e), and its
// innermost index j where some pointer moves along it. Returns the outer dims' index names.
std::vector<std::string> Source::strided_indices(bool need_j) {
  const int rank = layout_.rank;
  std::vector<std::string> idx(static_cast<size_t>(rank));
  if (rank == 1) {
    if (need_j) out_ += "    const U j = e;\n";
    return idx;
  }
  const std::string last = "size" + std::to_string(rank - 1);
  out_ += "    U rem = e / " + last + ";\n";
  if (need_j) out_ += "    const U j = e - rem * " + last + ";\n";
  for (int dim = rank - 2; dim >= 1; --dim) {
    const std::string s = "size" + std::to_string(dim), i = "i" + std::to_string(dim);
    out_ += "    const U " + i + " = rem % " + s + ";\n    rem /= " + s + ";\n";
    idx[static_cast<size_t>(dim)] = i;
  }
  idx[0] = "rem";
  return idx;
}

// Pointer p's offset at the element: the outer indices times their strides, and the innermost as
// the layout says (kZero adds nothing, kUnit adds j, kAny j times the stride).
std::string Source::strided_offset(size_t p, const std::vector<std::string>& idx) const {
  const int rank = layout_.rank;
  auto stride = [&](int dim) {
    return "(S)d.stride[" +
           std::to_string(p * static_cast<size_t>(rank) + static_cast<size_t>(dim)) + "]";
  };
  std::string off;
  for (int dim = 0; dim + 1 < rank; ++dim)
    add_term(off, "(S)" + idx[static_cast<size_t>(dim)] + " * " + stride(dim));
  switch (layout_.inner[p]) {
    case Layout::kZero:
      break;
    case Layout::kUnit:
      add_term(off, "(S)j");
      break;
    case Layout::kAny:
      add_term(off, "(S)j * " + stride(rank - 1));
      break;
  }
  return off.empty() ? "0" : off;
}

}  // namespace kiln::fuser::cuda::codegen
