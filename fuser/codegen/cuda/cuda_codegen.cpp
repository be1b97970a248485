// CUDA code generation's entry: a kernel as one CUDA C++ source, its checks and parameter lists
// (see cuda_codegen.h).
//
// The source has three parts: a prelude of device helpers whose semantics are the LLVM emitter's
// (wrapping integer arithmetic through unsigned types, x86's float-to-integer conversion, pow's
// case analysis; cuda_prelude.cpp), `kiln_body`, the kernel's straight-line program over one
// element's input values (only the instructions the outputs need, so that NVRTC never warns about
// unused variables), and the loops that call it: a grid-stride loop over elements, with 32-bit or
// 64-bit indices as the variant says (one instance per source: each instance inlines the body,
// libdevice's functions with it, and NVRTC and ptxas pay for every copy). Emitting the body once
// as a function and calling it from every loop (scalar, 4-wide, strided) keeps each loop short to
// write and to read; NVRTC inlines it (__forceinline__). Rows kernels (reductions) are written by
// cuda_rows_*.cpp instead.
#include "fuser/codegen/cuda/cuda_codegen.h"

#include <cctype>
#include <string>
#include <vector>

#include "fuser/codegen/cuda/cuda_prelude.h"
#include "fuser/codegen/cuda/cuda_source_writer.h"
#include "fuser/codegen/cuda/cuda_values.h"
#include "kiln/error.h"
#include "lib/env.h"

namespace kiln::fuser::cuda {

namespace codegen {

std::string Source::emit() {
  check_kernel();
  check_parameter_bytes();
  out_ += kPrelude;
  const size_t math_at = out_.size();
  if (layout_.rows) {
    out_ += kRowsPrelude;
    const RowsPlan plan = rows_plan();
    rows_kernel(plan);
    if (k_.num_globals > 0) finish_kernel(plan);
    if (k_.num_columns() > 0) columns_kernel(plan);
  } else {
    body();
    if (layout_.flat)
      flat();
    else
      strided();
  }
  // The math device functions go before the kernels that call them, and are known only now.
  std::string math;
  for (const std::string& name : math_) math += math_functions().at(name);
  out_.insert(math_at, math);
  return out_;
}

// A symbol that is a C identifier, and a layout that describes the kernel's pointers.
void Source::check_kernel() const {
  const size_t num_inputs = k_.input_types.size(), num_outputs = k_.outputs.size();
  KILN_CHECK(num_outputs > 0 && k_.output_types.size() == num_outputs,
             "fuser: CUDA codegen: a kernel without outputs (", symbol_, ")");
  KILN_CHECK(!symbol_.empty() && !std::isdigit(static_cast<unsigned char>(symbol_[0])),
             "fuser: CUDA codegen: '", symbol_, "' is not a C identifier");
  for (char c : symbol_)
    KILN_CHECK(std::isalnum(static_cast<unsigned char>(c)) || c == '_', "fuser: CUDA codegen: '",
               symbol_, "' is not a C identifier");
  if (layout_.rows) {
    KILN_CHECK(layout_.rank >= 0 && layout_.inner.size() == num_inputs + num_outputs,
               "fuser: CUDA codegen: a rows layout of rank ", layout_.rank, " with ",
               layout_.inner.size(), " inner kinds for ", num_inputs + num_outputs, " pointers");
  } else if (layout_.flat) {
    KILN_CHECK(layout_.single_element.empty() || layout_.single_element.size() == num_inputs,
               "fuser: CUDA codegen: single_element has ", layout_.single_element.size(),
               " entries for ", num_inputs, " inputs");
    for (size_t p = 0; p < layout_.by_value.size(); ++p)
      KILN_CHECK(!layout_.by_value[p] || (p < num_inputs && single(p)),
                 "fuser: CUDA codegen: input ", p, " passed by value is not a single element");
  } else {
    KILN_CHECK(layout_.rank >= 1 && layout_.inner.size() == num_inputs + num_outputs,
               "fuser: CUDA codegen: a strided layout of rank ", layout_.rank, " with ",
               layout_.inner.size(), " inner kinds for ", num_inputs + num_outputs, " pointers");
  }
}

// The launch parameters must fit CUDA's limit (32,764 bytes on every architecture CUDA 13
// supports): 8 bytes of n, the dims struct, 8 bytes per pointer and scalar (rows kernels: rank + 1
// dims, and the partials pointer).
void Source::check_parameter_bytes() const {
  const size_t dims_rank = static_cast<size_t>(layout_.rank) + (layout_.rows ? 1 : 0);
  const size_t dims = layout_.flat ? 0 : 8 * dims_rank * (1 + num_ptrs());
  const size_t param_bytes =
      8 + dims + 8 * (num_ptrs() + k_.scalar_types.size() + (layout_.rows ? 1 : 0));
  KILN_CHECK(param_bytes <= 32764, "fuser: CUDA codegen: ", symbol_, " needs ", param_bytes,
             " bytes of kernel parameters, past CUDA's limit of 32764");
}

// "const float* in0, ..., float* out0, ..." (with a leading comma), and the names alone.
std::string Source::ptr_params() const {
  std::string s;
  for (size_t p = 0; p < num_ptrs(); ++p) s += ptr_params_of(p);
  return s;
}

std::string Source::ptr_params_of(size_t p) const {
  return std::string(", ") + (p < k_.input_types.size() ? "const " : "") +
         storage_type(ptr_type(p)) + "* " + ptr_name(p);
}

std::string Source::ptr_name(size_t p) const {
  const size_t n = k_.input_types.size();
  return p < n ? "in" + std::to_string(p) : "out" + std::to_string(p - n);
}

std::string Source::scalar_params() const {
  std::string s;
  for (size_t i = 0; i < k_.scalar_types.size(); ++i)
    s += std::string(", ") + storage_type(k_.scalar_types[i]) + " s" + std::to_string(i);
  return s;
}

std::string Source::ptr_args() const {
  std::string s;
  for (size_t p = 0; p < num_ptrs(); ++p) s += ", " + ptr_name(p);
  return s;
}

// A flat kernel's entry: inputs passed by value arrive as values and are read through their
// address, so that the body reads every single element as ptr[0].
std::string Source::entry_params() const {
  std::string s;
  for (size_t p = 0; p < num_ptrs(); ++p)
    s += by_value(p)
             ? ", const " + std::string(storage_type(ptr_type(p))) + " " + ptr_name(p) + "_value"
             : ptr_params_of(p);
  return s;
}

std::string Source::entry_args() const {
  std::string s;
  for (size_t p = 0; p < num_ptrs(); ++p)
    s += ", " + (by_value(p) ? "&" + ptr_name(p) + "_value" : ptr_name(p));
  return s;
}

std::string Source::scalar_args() const {
  std::string s;
  for (size_t i = 0; i < k_.scalar_types.size(); ++i) s += ", s" + std::to_string(i);
  return s;
}

}  // namespace codegen

const char* cuda_storage_type(DType t) {
  return codegen::storage_type(t);
}

std::string cuda_source(const Kernel& kernel, const Layout& layout, const std::string& symbol,
                        CudaCallFlags variant) {
  return codegen::Source(kernel, layout, symbol, cuda_variant(kernel, layout, variant)).emit();
}

CudaCallFlags cuda_variant(const Kernel& kernel, const Layout& layout, CudaCallFlags flags) {
  flags.vec = flags.vec && codegen::Source(kernel, layout, "", flags).vectorizable();
  if (!layout.rows || flags.per_thread == 0) flags.per_thread = flags.block = 0;
  return flags;
}

std::vector<std::string> cuda_compile_options() {
  // IEEE division and square root, and denormals kept: NVRTC's defaults, stated so that a change
  // of defaults cannot change results. No contraction into FMA: the LLVM emitter never contracts.
  std::vector<std::string> options = {"--fmad=false", "--prec-div=true", "--prec-sqrt=true",
                                      "--ftz=false"};
  // Less optimization for a faster compile, when asked: the same results, slower code.
  static const std::string fast = [] {
    const std::vector<std::string> level = detail::env_list("KILN_CUDA_FAST_COMPILE");
    return level.empty() ? std::string("0") : level.back();
  }();
  if (fast != "0") options.push_back("--Ofast-compile=" + fast);
  return options;
}

}  // namespace kiln::fuser::cuda
