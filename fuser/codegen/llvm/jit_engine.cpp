// The LLVM side of the CPU JIT: LLVM started for the host; a kernel compiled and linked.
//
// Starting LLVM for the host CPU (target machine, features, the LLJIT); a kernel's IR emitted and
// verified, optimized, compiled (and dumped under KILN_DUMP) and linked.
#include "fuser/codegen/llvm/jit_engine.h"

#include <elf.h>
#include <link.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <utility>

#include "fuser/codegen/llvm/cpu_internal.h"
#include "jit/dump.h"
#include "jit/log.h"
#include "kiln/error.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/ExecutionEngine/Orc/CompileUtils.h"
#include "llvm/ExecutionEngine/Orc/ExecutionUtils.h"
#include "llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h"
#include "llvm/IR/DiagnosticInfo.h"
#include "llvm/IR/DiagnosticPrinter.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Verifier.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Transforms/Utils/Cloning.h"

namespace kiln::fuser::cpu {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string module_text(const llvm::Module& module) {
  std::string ir;
  llvm::raw_string_ostream os(ir);
  module.print(os, nullptr);
  return os.str();
}

// LLVM's remarks and warnings (a loop it was asked to vectorize and did not) are the JIT's
// business, not the user's: they go to KILN_LOG=codegen.
void report_diagnostic(const llvm::DiagnosticInfo* info, void*) {
  std::string text;
  llvm::raw_string_ostream os(text);
  llvm::DiagnosticPrinterRawOStream printer(os);
  info->print(printer);
  if (info->getSeverity() == llvm::DS_Error)
    std::cerr << "kiln: LLVM: " << os.str() << "\n";
  else
    jit::log("codegen", "LLVM: ", os.str());
}

std::string layout_text(const Layout& layout) {
  if (layout.rows) return "rows layout, rank " + std::to_string(layout.rank);
  if (layout.flat) return "flat layout";
  return "strided layout, rank " + std::to_string(layout.rank);
}

// The GNU build ID (hex) of the loaded object holding `address`, or "" where it has none.
std::string build_id_of(const void* address) {
  struct Search {
    uintptr_t address;
    std::string id;
  } search{reinterpret_cast<uintptr_t>(address), {}};
  auto visit = [](dl_phdr_info* info, size_t, void* data) {
    Search& s = *static_cast<Search*>(data);
    bool holds = false;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
      const ElfW(Phdr)& p = info->dlpi_phdr[i];
      const uintptr_t start = info->dlpi_addr + p.p_vaddr;
      holds |= p.p_type == PT_LOAD && s.address >= start && s.address < start + p.p_memsz;
    }
    if (!holds) return 0;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
      const ElfW(Phdr)& p = info->dlpi_phdr[i];
      if (p.p_type != PT_NOTE) continue;
      const char* at = reinterpret_cast<const char*>(info->dlpi_addr + p.p_vaddr);
      const char* end = at + p.p_memsz;
      while (at + sizeof(ElfW(Nhdr)) <= end) {
        const auto* note = reinterpret_cast<const ElfW(Nhdr)*>(at);
        const char* name = at + sizeof(ElfW(Nhdr));
        const char* desc = name + ((note->n_namesz + 3) & ~3u);
        if (desc + note->n_descsz > end) break;
        if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 &&
            std::memcmp(name, "GNU", 4) == 0) {
          for (uint32_t b = 0; b < note->n_descsz; ++b) {
            char byte[3];
            std::snprintf(byte, sizeof byte, "%02x", static_cast<unsigned char>(desc[b]));
            s.id += byte;
          }
          return 1;
        }
        at = desc + ((note->n_descsz + 3) & ~3u);
      }
    }
    return 1;
  };
  dl_iterate_phdr(visit, &search);
  return search.id;
}

// kiln's build (the emitter's code) and LLVM's, or "" where either has no build ID.
std::string build_ids() {
  const std::string kiln = build_id_of(reinterpret_cast<const void*>(&emit_kernel));
  const std::string llvm = build_id_of(reinterpret_cast<const void*>(&llvm::verifyModule));
  return kiln.empty() || llvm.empty() ? "" : "kiln " + kiln + "|LLVM " + llvm;
}

}  // namespace

JitEngine::JitEngine() {
  const auto start = std::chrono::steady_clock::now();
  llvm::InitializeNativeTarget();
  llvm::InitializeNativeTargetAsmPrinter();
  auto builder = take(llvm::orc::JITTargetMachineBuilder::detectHost(), "detecting the host");
  builder.setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);
  target_ = take(builder.createTargetMachine(), "creating the target machine");
  start_lljit(builder);
  read_host_features();
  jit::log(
      "codegen", "LLVM JIT started in ",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count(),
      " ms");
}

// The LLJIT only links the objects compile_object makes (never IR), with this one target
// machine: given the data layout and a compiler over target_, it creates no target machines of
// its own (two, 0.2 ms each), and without a platform (kernels have no static initializers) it
// skips the platform's set-up. Together they halve the JIT's start-up, which a new process
// that finds its kernels on disk pays on its first evaluation.
void JitEngine::start_lljit(const llvm::orc::JITTargetMachineBuilder& builder) {
  llvm::TargetMachine* target = target_.get();
  jit_ =
      take(llvm::orc::LLJITBuilder()
               .setJITTargetMachineBuilder(builder)
               .setDataLayout(target_->createDataLayout())
               .setCompileFunctionCreator(
                   [target](llvm::orc::JITTargetMachineBuilder)
                       -> llvm::Expected<std::unique_ptr<llvm::orc::IRCompileLayer::IRCompiler>> {
                     return std::make_unique<llvm::orc::SimpleCompiler>(*target);
                   })
               .setPlatformSetUp(llvm::orc::setUpInactivePlatform)
               .setLinkProcessSymbolsByDefault(false)
               .create(),
           "creating the ORC LLJIT");
  // Kernels call libm (fmod, pow) and malloc: resolve symbols from the process.
  jit_->getMainJITDylib().addGenerator(
      take(llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
               jit_->getDataLayout().getGlobalPrefix()),
           "adding the process's symbols"));
}

// The vector width the emitter asks for, and the target's part of every disk cache key.
void JitEngine::read_host_features() {
  wide_vectors_ = target_->getTargetFeatureString().contains("+avx512f");
  // A full register of float lanes: LLVM's cost model picks 4 (see Emitter::mark_vectorized).
  vector_lanes_ = wide_vectors_ ? 16 : target_->getTargetFeatureString().contains("+avx2") ? 8 : 0;
  // Everything besides the kernel that decides the machine code: part of every cache key.
  target_key_ = target_->getTargetTriple().str() + "|" + target_->getTargetCPU().str() + "|" +
                target_->getTargetFeatureString().str() + "|LLVM " LLVM_VERSION_STRING + "|" +
                optimization_key();
  build_ids_ = build_ids();
}

Emitted JitEngine::emit_module(const std::string& name, const Kernel& k,
                               const Layout& layout) const {
  auto context = std::make_unique<llvm::LLVMContext>();
  context->setDiagnosticHandlerCallBack(report_diagnostic, nullptr);
  auto module = std::make_unique<llvm::Module>(name, *context);
  module->setDataLayout(jit_->getDataLayout());
  module->setTargetTriple(target_->getTargetTriple().str());
  emit_kernel(*module, name, k, layout, vector_lanes_);
  // The host's CPU and features on the function itself, so that every pass sees them, and
  // full-width vectors (LLVM prefers 256-bit ones on AVX-512 CPUs by default).
  for (llvm::Function& f : *module) {
    if (f.isDeclaration()) continue;
    f.addFnAttr("target-cpu", target_->getTargetCPU());
    f.addFnAttr("target-features", target_->getTargetFeatureString());
    if (wide_vectors_) f.addFnAttr("prefer-vector-width", "512");
  }
  std::string errors;
  llvm::raw_string_ostream err(errors);
  KILN_CHECK(!llvm::verifyModule(*module, &err), "fuser: generated invalid IR for ", name, ": ",
             err.str(), "\n", k.str());
  return {std::move(context), std::move(module)};
}

std::string JitEngine::disk_key_of(const llvm::Module& module) const {
  return module_text(module) + "|" + target_key_;
}

std::string JitEngine::build_key_of(const std::string& kernel_key) const {
  if (build_ids_.empty()) return "";
  return "kernel by build|" + kernel_key + "|" + target_key_ + "|" + build_ids_;
}

std::string JitEngine::compile_object(const std::string& name, const Kernel& k,
                                      const Layout& layout, Emitted emitted, Phases& phases) const {
  jit::log("codegen", "compiling ", name, " (", layout.flat ? "flat" : "strided", " layout",
           layout.flat ? "" : ", rank " + std::to_string(layout.rank), ")\n", k.str());
  std::unique_ptr<llvm::Module> module = std::move(emitted.module);
  if (jit::log_enabled("ir-raw"))
    jit::log("ir-raw", "generated IR of ", name, ":\n", module_text(*module));
  auto t = std::chrono::steady_clock::now();
  optimize(*module, *target_);
  phases.optimize = seconds_since(t);
  t = std::chrono::steady_clock::now();
  if (jit::log_enabled("ir")) jit::log("ir", "optimized IR of ", name, ":\n", module_text(*module));
  // KILN_DUMP: the assembly is emitted from a copy of the module (emitting the object rewrites
  // parts of the IR in place).
  const bool dump = jit::dump_enabled();
  std::unique_ptr<llvm::Module> asm_module;
  if (dump) {
    dump_kernel(name, k, layout, *module);
    asm_module = llvm::CloneModule(*module);
  }
  std::string object = emit_code(*module, llvm::CodeGenFileType::ObjectFile);
  phases.object = seconds_since(t);
  if (dump)
    jit::dump_kernel_file(name, ".s", emit_code(*asm_module, llvm::CodeGenFileType::AssemblyFile));
  return object;
}

// KILN_DUMP: the optimized IR, headed by the kernel's program as comments.
void JitEngine::dump_kernel(const std::string& name, const Kernel& k, const Layout& layout,
                            llvm::Module& module) const {
  std::string ir = "; " + name + ": " + layout_text(layout) + "\n; program:\n";
  const std::string program = k.str();
  for (size_t b = 0, e; b < program.size(); b = e + 1) {
    e = program.find('\n', b);
    if (e == std::string::npos) e = program.size();
    ir += "; " + program.substr(b, e - b) + "\n";
  }
  llvm::raw_string_ostream os(ir);
  module.print(os, nullptr);
  jit::dump_kernel_file(name, ".ll", os.str());
}

// The module compiled to an object file (ELF) or assembly text in memory.
std::string JitEngine::emit_code(llvm::Module& m, llvm::CodeGenFileType type) const {
  llvm::SmallVector<char, 0> buffer;
  llvm::raw_svector_ostream os(buffer);
  llvm::legacy::PassManager pm;
  KILN_CHECK(!target_->addPassesToEmitFile(pm, os, nullptr, type), "fuser: the target cannot emit ",
             type == llvm::CodeGenFileType::ObjectFile ? "object files" : "assembly");
  pm.run(m);
  return std::string(buffer.data(), buffer.size());
}

llvm::orc::ResourceTrackerSP JitEngine::new_tracker() {
  return jit_->getMainJITDylib().createResourceTracker();
}

llvm::Error JitEngine::link(const llvm::orc::ResourceTrackerSP& tracker, const std::string& object,
                            const std::string& name, const Kernel& k, CompiledKernel& code) {
  if (llvm::Error e =
          jit_->addObjectFile(tracker, llvm::MemoryBuffer::getMemBufferCopy(object, name)))
    return e;
  return lookup(name, k, code);
}

// The kernel's functions, linked.
llvm::Error JitEngine::lookup(const std::string& name, const Kernel& k, CompiledKernel& code) {
  auto fn = jit_->lookup(name);
  if (!fn) return fn.takeError();
  code.fn = fn->toPtr<KernelFn>();
  if (k.num_globals > 0) {
    auto finish = jit_->lookup(finish_name(name));
    if (!finish) return finish.takeError();
    code.finish = finish->toPtr<FinishFn>();
  }
  if (k.num_columns() > 0) {
    auto columns = jit_->lookup(columns_name(name));
    if (!columns) return columns.takeError();
    code.columns = columns->toPtr<ColumnsFn>();
  }
  return llvm::Error::success();
}

}  // namespace kiln::fuser::cpu
