// The LLVM side of the CPU JIT: LLVM started for the host; a kernel compiled and linked.
//
// The host's target machine and the process's one LLJIT, and the steps of a kernel's way from
// Kernel to linked code (emit, key, optimize and compile, link).
#pragma once

#include <memory>
#include <string>

#include "fuser/kernel.h"
#include "llvm/ExecutionEngine/Orc/LLJIT.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "llvm/Target/TargetMachine.h"

namespace kiln::fuser::cpu {

// A kernel's module, as emitted (before optimization), in its own context.
struct Emitted {
  std::unique_ptr<llvm::LLVMContext> context;
  std::unique_ptr<llvm::Module> module;
};

// Where a compile's time goes (KILN_LOG=codegen prints it), in seconds.
struct Phases {
  double ir = 0, optimize = 0, object = 0, store = 0, link = 0;
};

// Made once per process (it starts LLVM), then used from any thread: its LLVM objects are only
// read, and the LLJIT's own locks guard what linking and removing code change in it.
class JitEngine {
 public:
  JitEngine();

  // The kernel as LLVM IR, verified.
  Emitted emit_module(const std::string& name, const Kernel& k, const Layout& layout) const;
  // The disk cache's key of a kernel: its emitted module's text and the target (triple, CPU,
  // features, LLVM's version). No version is bumped by hand: whatever changes the emitted code
  // (the emitter, lib/math/primitives.h) changes the key.
  std::string disk_key_of(const llvm::Module& module) const;
  // Another key of the kernel, known without emitting it: its structure (kernel_key), the target
  // and the builds of kiln and LLVM (their GNU build IDs), which fix what the emitter makes of
  // that structure. Empty where a build ID is missing (the kernel is then always emitted).
  std::string build_key_of(const std::string& kernel_key) const;
  // The emitted module optimized and compiled to an object file (ELF) in memory.
  std::string compile_object(const std::string& name, const Kernel& k, const Layout& layout,
                             Emitted emitted, Phases& phases) const;
  // A tracker for one kernel's code, which removing it removes.
  llvm::orc::ResourceTrackerSP new_tracker();
  // Links the object under `tracker` and looks up the kernel's functions into `code`.
  llvm::Error link(const llvm::orc::ResourceTrackerSP& tracker, const std::string& object,
                   const std::string& name, const Kernel& k, CompiledKernel& code);

 private:
  void start_lljit(const llvm::orc::JITTargetMachineBuilder& builder);
  void read_host_features();
  llvm::Error lookup(const std::string& name, const Kernel& k, CompiledKernel& code);
  void dump_kernel(const std::string& name, const Kernel& k, const Layout& layout,
                   llvm::Module& module) const;
  std::string emit_code(llvm::Module& m, llvm::CodeGenFileType type) const;

  std::string target_key_;     // everything besides the kernel that decides the machine code
  std::string build_ids_;      // kiln's and LLVM's build IDs, or empty
  bool wide_vectors_ = false;  // AVX-512
  int vector_lanes_ = 0;       // float lanes of a vector register (AVX-512 16, AVX2 8), or 0
  std::unique_ptr<llvm::TargetMachine> target_;
  std::unique_ptr<llvm::orc::LLJIT> jit_;
};

}  // namespace kiln::fuser::cpu
