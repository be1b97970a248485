// What the CPU code generator's files share (private to fuser/codegen/llvm/).
//
// LLVM error text, the names of a kernel's functions, the prefetch marker, and the entry points
// of the emitter and of the optimization pipeline.
#pragma once

#include <string>
#include <utility>

#include "fuser/kernel.h"
#include "kiln/error.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

namespace llvm {
class Module;
class TargetMachine;
}  // namespace llvm

namespace kiln::fuser::cpu {

inline std::string llvm_message(llvm::Error e) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << e;
  return os.str();
}

// The value of an LLVM call that must succeed; else a kiln::Error saying what failed.
template <typename T>
T take(llvm::Expected<T> v, const char* what) {
  if (!v) KILN_CHECK(false, "fuser: ", what, ": ", llvm_message(v.takeError()));
  return std::move(*v);
}

// A kernel's helper functions, beside its main function `name` in the same module.
inline std::string finish_name(const std::string& name) {
  return name + "_finish";
}
inline std::string columns_name(const std::string& name) {
  return name + "_columns";
}

// Marks a kernel function whose vector loops PrefetchPass prefetches (passes.cpp): flat kernels
// computing a transcendental, and rows kernels.
inline constexpr const char* kPrefetchAttribute = "kiln-prefetch";

// Emits the kernel's functions into m: the main one under `name` (see KernelFn), and its finish
// and columns functions where the kernel has global or column reductions. vector_width: float
// lanes of a vector register, or 0 (emitter.cpp).
void emit_kernel(llvm::Module& m, const std::string& name, const Kernel& k, const Layout& layout,
                 int vector_width);

// Runs kiln's optimization pipeline over m (passes.cpp).
void optimize(llvm::Module& m, llvm::TargetMachine& tm);
// The pipeline and LLVM options optimize() runs with: part of every kernel's cache key.
std::string optimization_key();

}  // namespace kiln::fuser::cpu
