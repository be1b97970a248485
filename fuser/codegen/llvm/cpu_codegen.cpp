// CPU code generation for fused elementwise kernels through LLVM 19's ORC LLJIT.
//
// One LLJIT serves the process; each kernel is its own module under its own ResourceTracker, whose
// handle the kernel's CompiledKernels share: the in-memory cache keeps at most
// KILN_KERNEL_CACHE_MAX kernels (least recently used evicted), and a kernel's code is removed
// when the cache and every plan holding it have let go. The
// IR is a loop over elements (flat layout) or over rows with an inner loop over the last dimension
// (strided layout, strides passed per call: LLVM's loop vectorizer versions the inner loop on a
// unit stride). Every primitive computes what the op's reference kernel computes: IEEE
// operations without fast-math flags or contraction (a fused result of ops without a
// transcendental is bit-equal to the eager one); the transcendental functions (float32 and
// float64) are lib/math/primitives.h's single definitions instantiated for IR values
// (fuser/codegen/llvm/ir_value.h: branch-free, so loops vectorize; FMA inside a primitive where
// the host has it), within the bounds of docs/numerics.md of the exact result; fmod and pow call
// the same libm functions the reference kernels call (marked nobuiltin, so LLVM does not rewrite
// them).
#include "fuser/codegen/llvm/cpu_codegen.h"

#include <xxhash.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "fuser/cache.h"
#include "fuser/codegen/llvm/ir_value.h"
#include "fuser/prim_math.h"
#include "fuser/registration.h"
#include "fuser/rows_plan.h"
#include "jit/dump.h"
#include "jit/log.h"
#include "kiln/error.h"
#include "lib/env.h"
#include "lib/profiler.h"
#include "lib/stats_registry.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/ExecutionEngine/Orc/CompileUtils.h"
#include "llvm/ExecutionEngine/Orc/ExecutionUtils.h"
#include "llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h"
#include "llvm/ExecutionEngine/Orc/LLJIT.h"
#include "llvm/ExecutionEngine/Orc/ThreadSafeModule.h"
#include "llvm/IR/DiagnosticInfo.h"
#include "llvm/IR/DiagnosticPrinter.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/Verifier.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/Transforms/Utils/Cloning.h"

// Every primitive (fuser/primitives.h) is rendered: a switch over Prim that misses one does not
// compile.
#pragma GCC diagnostic error "-Wswitch"

namespace kiln::fuser {

namespace {

std::string llvm_message(llvm::Error e) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << e;
  return os.str();
}

template <typename T>
T take(llvm::Expected<T> v, const char* what) {
  if (!v) KILN_CHECK(false, "fuser: ", what, ": ", llvm_message(v.takeError()));
  return std::move(*v);
}

// The optimization pipeline. The kernels are straight-line loop bodies that the emitter already
// writes in the form LLVM wants (rotated loops, values in registers except reduction accumulators),
// so instead of O3's full pipeline (4.5-5 ms per 10-op kernel, a third of a cold compile; this
// takes about 1.8 ms) they get what they need: SROA for the accumulators, CSE and instcombine on
// the bodies, LICM to hoist what is invariant (kernel scalars, row starts), the loop vectorizer,
// and a cleanup of its output. On BM_FuseGelu16M and BM_FuseSoftmax4096 the kernels run as fast as
// O3's (tools/bench/RESULTS.md).
// instcombine as the O3 pipeline runs it: a textual "instcombine" also verifies that one iteration
// reached a fixpoint and aborts the process when it did not.
constexpr const char* kPipeline =
    "function(sroa,early-cse,instcombine<no-verify-fixpoint>,simplifycfg,loop-simplify,lcssa,"
    "loop-mssa(licm),loop-vectorize,kiln-prefetch,instcombine<no-verify-fixpoint>,simplifycfg)";

// Marks a kernel function whose vector loops PrefetchPass prefetches: flat kernels computing a
// transcendental, and rows kernels.
constexpr const char* kPrefetchAttribute = "kiln-prefetch";
// How far ahead, in elements of the access.
constexpr int64_t kPrefetchAhead = 1024;

// A flat kernel that computes a transcendental spends so long on each vector that the
// out-of-order window covers too few cache lines to keep memory busy, and the hardware
// prefetchers fall behind: GELU's memory time and arithmetic added up instead of overlapping.
// After vectorization, each vector load and store of a tensor (the parallel accesses, see
// Emitter::loop) in such a function is preceded by a prefetch of the elements kPrefetchAhead
// further on (for writing, before a store), one per cache line: GELU 16M, -27% CPU time. Done
// here rather than in the emitted loop, where a prefetch per element would keep the loop from
// vectorizing and a loop over chunks cost a quarter more compile time.
struct PrefetchPass : llvm::PassInfoMixin<PrefetchPass> {
  llvm::PreservedAnalyses run(llvm::Function& f, llvm::FunctionAnalysisManager&) {
    if (!f.hasFnAttribute(kPrefetchAttribute)) return llvm::PreservedAnalyses::all();
    const llvm::DataLayout& layout = f.getParent()->getDataLayout();
    std::vector<std::pair<llvm::Instruction*, bool>> accesses;  // (access, writes)
    for (llvm::BasicBlock& block : f)
      for (llvm::Instruction& in : block) {
        if (!in.getMetadata(llvm::LLVMContext::MD_access_group)) continue;
        if (auto* l = llvm::dyn_cast<llvm::LoadInst>(&in); l && l->getType()->isVectorTy())
          accesses.emplace_back(l, false);
        if (auto* st = llvm::dyn_cast<llvm::StoreInst>(&in);
            st && st->getValueOperand()->getType()->isVectorTy())
          accesses.emplace_back(st, true);
      }
    for (const auto& [access, writes] : accesses) {
      llvm::Type* type = writes ? llvm::cast<llvm::StoreInst>(access)->getValueOperand()->getType()
                                : access->getType();
      const auto bytes = static_cast<int64_t>(layout.getTypeStoreSize(type));
      const int64_t ahead =
          kPrefetchAhead * static_cast<int64_t>(layout.getTypeStoreSize(type->getScalarType()));
      llvm::IRBuilder<> b(access);
      llvm::Value* address = llvm::getLoadStorePointerOperand(access);
      for (int64_t line = 0; line < bytes; line += 64)
        b.CreateIntrinsic(llvm::Intrinsic::prefetch, {b.getPtrTy()},
                          {b.CreateConstGEP1_64(b.getInt8Ty(), address, ahead + line),
                           b.getInt32(writes ? 1 : 0), b.getInt32(3), b.getInt32(1)});
    }
    return accesses.empty() ? llvm::PreservedAnalyses::all() : llvm::PreservedAnalyses::none();
  }
};

void optimize(llvm::Module& m, llvm::TargetMachine& tm) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PassBuilder pb(&tm);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  pb.registerPipelineParsingCallback([](llvm::StringRef name, llvm::FunctionPassManager& fpm,
                                        llvm::ArrayRef<llvm::PassBuilder::PipelineElement>) {
    if (name != "kiln-prefetch") return false;
    fpm.addPass(PrefetchPass());
    return true;
  });
  llvm::ModulePassManager mpm;
  if (llvm::Error e = pb.parsePassPipeline(mpm, kPipeline))
    KILN_CHECK(false, "fuser: the optimization pipeline: ", llvm_message(std::move(e)));
  mpm.run(m, mam);
}

// Kept apart from the JIT, so that reading them does not start LLVM.
std::mutex g_stats_mutex;
CompileStats g_stats;
void add_stats(int64_t hits, int64_t compiled, double seconds) {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  g_stats.memory_hits += hits;
  g_stats.compiled += compiled;
  g_stats.compile_seconds += seconds;
}
template <typename F>
void update_stats(const F& f) {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  f(g_stats);
}

// One loaded kernel's code, removed from the JIT when the last CompiledKernel holding it goes.
struct LoadedCode {
  llvm::orc::ResourceTrackerSP tracker;
  std::string key;
  std::string name;
};

std::string finish_name(const std::string& name) {
  return name + "_finish";
}
std::string columns_name(const std::string& name) {
  return name + "_columns";
}

size_t capacity_from_env() {
  return static_cast<size_t>(detail::env_int("KILN_KERNEL_CACHE_MAX"));
}

class CpuJit {
 public:
  CpuJit() {
    const auto start = std::chrono::steady_clock::now();
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    auto builder = take(llvm::orc::JITTargetMachineBuilder::detectHost(), "detecting the host");
    builder.setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);
    target_ = take(builder.createTargetMachine(), "creating the target machine");
    // The LLJIT only links the objects compile_object makes (never IR), with this one target
    // machine: given the data layout and a compiler over target_, it creates no target machines of
    // its own (two, 0.2 ms each), and without a platform (kernels have no static initializers) it
    // skips the platform's set-up. Together they halve the JIT's start-up, which a new process
    // that finds its kernels on disk pays on its first evaluation.
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
    wide_vectors_ = target_->getTargetFeatureString().contains("+avx512f");
    // A full register of float lanes: LLVM's cost model picks 4 (see the loop metadata below).
    vector_lanes_ = wide_vectors_                                         ? 16
                    : target_->getTargetFeatureString().contains("+avx2") ? 8
                                                                          : 0;
    // Everything besides the kernel that decides the machine code: part of every cache key.
    target_key_ = target_->getTargetTriple().str() + "|" + target_->getTargetCPU().str() + "|" +
                  target_->getTargetFeatureString().str() + "|LLVM " LLVM_VERSION_STRING;
    jit::log(
        "codegen", "LLVM JIT started in ",
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count(),
        " ms");
  }

  // The in-memory cache: a hit, else a kernel still loaded for someone who holds it, else one
  // from the disk cache, else a new compile. Lookups run beside a compile; compiles (and loads)
  // take turns.
  CompiledKernel get(const Kernel& k, const Layout& layout) {
    std::string key;
    {
      // The look-up (key and map) as a span of its own: the profile shows what a plan's first run
      // of a kernel costs when nothing compiles.
      kiln::detail::ProfileSpan span("kernel.lookup", nullptr, kiln::profiler::Category::kCache);
      key = kernel_key(k, layout);
      if (std::optional<CompiledKernel> hit = find(key)) {
        add_stats(1, 0, 0);
        jit::log("cache", "memory hit ", hit->name);
        if (span.active()) span.set_detail(std::string(hit->name) + " (hit)");
        return std::move(*hit);
      }
      if (span.active()) span.set_detail(kernel_symbol(key, k) + " (miss)");
    }
    std::lock_guard<std::mutex> compiling(compile_mutex_);
    if (std::optional<CompiledKernel> hit = find(key)) {  // loaded by another thread meanwhile
      add_stats(1, 0, 0);
      return std::move(*hit);
    }
    if (std::optional<CompiledKernel> alive = revive(key)) {
      update_stats([](CompileStats& s) {
        ++s.memory_hits;
        ++s.revived;
      });
      jit::log("cache", "memory hit ", alive->name, " (evicted, still loaded for a plan)");
      insert(key, *alive);
      return std::move(*alive);
    }
    if (jit::log_enabled("cache")) jit::log("cache", "memory miss ", kernel_symbol(key, k));
    CompiledKernel code = load(key, k, layout);
    insert(key, code);
    return code;
  }

  std::string disk_key(const Kernel& k, const Layout& layout) {
    const std::string name = kernel_symbol(kernel_key(k, layout), k);
    return disk_key_of(*emit_module(name, k, layout).module);
  }

  // Sets the in-memory cache's capacity (a number of kernels), evicting down to it.
  size_t set_capacity(size_t capacity) {
    std::vector<CompiledKernel> evicted;
    size_t previous;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      previous = capacity_;
      capacity_ = capacity;
      evict_past_capacity(evicted);
    }
    return previous;  // `evicted` goes now, outside the lock
  }

 private:
  // The cached kernel under `key`, made the most recently used.
  std::optional<CompiledKernel> find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(key);
    if (it == index_.end()) return std::nullopt;
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }
  // Adds a kernel as the most recently used one, and evicts the least recently used ones past the
  // capacity. Eviction drops the cache's reference only: code that a plan still holds stays loaded
  // (and `live_` finds it again), the rest is removed from the JIT as the last reference goes.
  void insert(const std::string& key, const CompiledKernel& code) {
    std::vector<CompiledKernel> evicted;
    std::lock_guard<std::mutex> lock(mutex_);
    lru_.emplace_front(key, code);
    index_.emplace(lru_.front().first, lru_.begin());
    evict_past_capacity(evicted);
  }
  // (Under mutex_.) Moves the entries past the capacity to `evicted`, for the caller to drop once
  // the lock is released: dropping the last reference removes code from the JIT.
  void evict_past_capacity(std::vector<CompiledKernel>& evicted) {
    while (lru_.size() > capacity_) {
      auto& [key, code] = lru_.back();
      jit::log("cache", "evicting a kernel from memory (", lru_.size(), " loaded, capacity ",
               capacity_, ")");
      evicted.push_back(std::move(code));
      index_.erase(key);
      lru_.pop_back();
    }
    if (!evicted.empty()) {
      const auto n = static_cast<int64_t>(evicted.size());
      update_stats([n](CompileStats& s) { s.evicted += n; });
    }
  }
  // A kernel evicted from the cache but still held (by a plan): its code, without reloading it. If
  // its last holder is removing it right now, waits for the removal to finish, so that loading it
  // again does not define its symbols twice.
  std::optional<CompiledKernel> revive(const std::string& key) {
    std::unique_lock<std::mutex> lock(live_mutex_);
    for (;;) {
      auto it = live_.find(key);
      if (it == live_.end()) return std::nullopt;
      if (std::shared_ptr<const void> owner = it->second.owner.lock())
        return CompiledKernel{it->second.fn, it->second.finish, it->second.columns,
                              std::move(owner), it->second.name};
      live_cv_.wait(lock);
    }
  }
  // (Under compile_mutex_.) Loads the kernel from the disk cache, or compiles it.
  CompiledKernel load(const std::string& key, const Kernel& k, const Layout& layout) {
    kiln::detail::ProfileSpan span("compile");
    const auto start = std::chrono::steady_clock::now();
    const std::string name = kernel_symbol(key, k);
    CompiledKernel code;
    llvm::orc::ResourceTrackerSP tracker = jit_->getMainJITDylib().createResourceTracker();
    // On disk, the object is filed under the IR it is compiled from (and the target): a change of
    // the emitter's output can never load an object built from other code.
    Phases phases;
    auto t = std::chrono::steady_clock::now();
    Emitted emitted = emit_module(name, k, layout);
    const std::string disk_key = disk_key_of(*emitted.module);
    phases.ir = seconds_since(t);
    // With KILN_DUMP on, kernels are compiled rather than read from the disk cache, so that every
    // kernel's IR and assembly are dumped; the object still goes to the disk cache.
    std::optional<std::string> object;
    if (!jit::dump_enabled()) object = DiskCache::instance().load(disk_key, kCpuObject);
    bool from_disk = object.has_value();
    if (from_disk) {
      // A disk entry passed its checks; it must also link and define this kernel's symbol, else
      // it is dropped and the kernel compiled (and the entry replaced).
      llvm::Error e =
          jit_->addObjectFile(tracker, llvm::MemoryBuffer::getMemBufferCopy(*object, name));
      if (!e) e = lookup(name, k, code);
      if (e) {
        jit::log("cache", "disk entry for ", name, " does not link: ", llvm_message(std::move(e)));
        llvm::consumeError(tracker->remove());
        tracker = jit_->getMainJITDylib().createResourceTracker();
        code = CompiledKernel{};
        from_disk = false;
      }
    }
    span.set_detail(name);
    if (from_disk) {
      update_stats([](CompileStats& s) { ++s.disk_hits; });
      span.set_name("kernel.disk_load");
      span.set_category(kiln::profiler::Category::kCache);
    }
    if (!from_disk) {
      object = compile_object(name, k, layout, std::move(emitted), phases);
      t = std::chrono::steady_clock::now();
      DiskCache::instance().store(disk_key, kCpuObject, *object);
      phases.store = seconds_since(t);
      t = std::chrono::steady_clock::now();
      llvm::Error e =
          jit_->addObjectFile(tracker, llvm::MemoryBuffer::getMemBufferCopy(*object, name));
      if (!e) e = lookup(name, k, code);
      if (e) {
        llvm::consumeError(tracker->remove());
        KILN_CHECK(false, "fuser: loading ", name, ": ", llvm_message(std::move(e)));
      }
      phases.link = seconds_since(t);
      const double total = seconds_since(start);
      add_stats(0, 1, total);
      if (jit::log_enabled("codegen")) {
        auto ms = [](double s) { return std::to_string(s * 1e3).substr(0, 5); };
        jit::log("codegen", "compiled ", name, " in ", ms(total), " ms: IR ", ms(phases.ir),
                 ", optimization ", ms(phases.optimize), ", object code ", ms(phases.object),
                 ", disk cache ", ms(phases.store), ", linking ", ms(phases.link));
      }
    }
    std::shared_ptr<LoadedCode> owner(new LoadedCode{std::move(tracker), key, name},
                                      [this](LoadedCode* c) { unload(c); });
    {
      std::lock_guard<std::mutex> lock(live_mutex_);
      live_[key] = Live{owner, code.fn, code.finish, code.columns, owner->name.c_str()};
    }
    code.name = owner->name.c_str();
    code.owner = std::move(owner);
    return code;
  }
  // The deleter of a LoadedCode: removes the kernel's code from the JIT. Runs on the thread that
  // dropped the last reference, holding none of this class's locks.
  void unload(LoadedCode* c) {
    if (llvm::Error e = c->tracker->remove())
      jit::log("codegen", "removing ", c->name, " failed: ", llvm_message(std::move(e)));
    {
      std::lock_guard<std::mutex> lock(live_mutex_);
      if (auto it = live_.find(c->key); it != live_.end() && it->second.owner.expired())
        live_.erase(it);
    }
    live_cv_.notify_all();
    update_stats([](CompileStats& s) { ++s.unloaded; });
    jit::log("codegen", "unloaded ", c->name);
    delete c;
  }

  static void emit(llvm::Module& m, const std::string& name, const Kernel& k, const Layout& layout,
                   int vector_width);
  // The kernel's functions, linked.
  llvm::Error lookup(const std::string& name, const Kernel& k, CompiledKernel& code) {
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
  // Where a compile's time goes (KILN_LOG=codegen prints it).
  struct Phases {
    double ir = 0, optimize = 0, object = 0, store = 0, link = 0;
  };
  static double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }
  // A kernel's module, as emitted (before optimization), in its own context.
  struct Emitted {
    std::unique_ptr<llvm::LLVMContext> context;
    std::unique_ptr<llvm::Module> module;
  };
  // The kernel as LLVM IR, verified.
  Emitted emit_module(const std::string& name, const Kernel& k, const Layout& layout) {
    auto context = std::make_unique<llvm::LLVMContext>();
    // LLVM's remarks and warnings (a loop it was asked to vectorize and did not) are the JIT's
    // business, not the user's: they go to KILN_LOG=codegen.
    context->setDiagnosticHandlerCallBack(
        [](const llvm::DiagnosticInfo* info, void*) {
          std::string text;
          llvm::raw_string_ostream os(text);
          llvm::DiagnosticPrinterRawOStream printer(os);
          info->print(printer);
          if (info->getSeverity() == llvm::DS_Error)
            std::cerr << "kiln: LLVM: " << os.str() << "\n";
          else
            jit::log("codegen", "LLVM: ", os.str());
        },
        nullptr);
    auto module = std::make_unique<llvm::Module>(name, *context);
    module->setDataLayout(jit_->getDataLayout());
    module->setTargetTriple(target_->getTargetTriple().str());
    emit(*module, name, k, layout, vector_lanes_);
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
  // The disk cache's key of a kernel: its emitted module's text and the target (triple, CPU,
  // features, LLVM's version). No version is bumped by hand: whatever changes the emitted code
  // (the emitter, lib/math/primitives.h) changes the key.
  std::string disk_key_of(const llvm::Module& module) const {
    std::string key;
    llvm::raw_string_ostream os(key);
    module.print(os, nullptr);
    return os.str() + "|" + target_key_;
  }
  // The emitted module optimized and compiled to an object file (ELF) in memory.
  std::string compile_object(const std::string& name, const Kernel& k, const Layout& layout,
                             Emitted emitted, Phases& phases) {
    jit::log("codegen", "compiling ", name, " (", layout.flat ? "flat" : "strided", " layout",
             layout.flat ? "" : ", rank " + std::to_string(layout.rank), ")\n", k.str());
    std::unique_ptr<llvm::Module> module = std::move(emitted.module);
    if (jit::log_enabled("ir-raw")) {
      std::string ir;
      llvm::raw_string_ostream os(ir);
      module->print(os, nullptr);
      jit::log("ir-raw", "generated IR of ", name, ":\n", os.str());
    }
    auto t = std::chrono::steady_clock::now();
    optimize(*module, *target_);
    phases.optimize = seconds_since(t);
    t = std::chrono::steady_clock::now();
    if (jit::log_enabled("ir")) {
      std::string ir;
      llvm::raw_string_ostream os(ir);
      module->print(os, nullptr);
      jit::log("ir", "optimized IR of ", name, ":\n", os.str());
    }
    // KILN_DUMP: the optimized IR, headed by the kernel's program as comments, and the assembly,
    // emitted from a copy of the module (emitting the object rewrites parts of the IR in place).
    const bool dump = jit::dump_enabled();
    std::unique_ptr<llvm::Module> asm_module;
    if (dump) {
      std::string ir = "; " + name + ": " + layout_text(layout) + "\n; program:\n";
      const std::string program = k.str();
      for (size_t b = 0, e; b < program.size(); b = e + 1) {
        e = program.find('\n', b);
        if (e == std::string::npos) e = program.size();
        ir += "; " + program.substr(b, e - b) + "\n";
      }
      llvm::raw_string_ostream os(ir);
      module->print(os, nullptr);
      jit::dump_kernel_file(name, ".ll", os.str());
      asm_module = llvm::CloneModule(*module);
    }
    std::string object = emit_code(*module, llvm::CodeGenFileType::ObjectFile);
    phases.object = seconds_since(t);
    if (dump)
      jit::dump_kernel_file(name, ".s",
                            emit_code(*asm_module, llvm::CodeGenFileType::AssemblyFile));
    return object;
  }
  static std::string layout_text(const Layout& layout) {
    if (layout.rows) return "rows layout, rank " + std::to_string(layout.rank);
    if (layout.flat) return "flat layout";
    return "strided layout, rank " + std::to_string(layout.rank);
  }
  // The module compiled to an object file (ELF) or assembly text in memory.
  std::string emit_code(llvm::Module& m, llvm::CodeGenFileType type) {
    llvm::SmallVector<char, 0> buffer;
    llvm::raw_svector_ostream os(buffer);
    llvm::legacy::PassManager pm;
    KILN_CHECK(!target_->addPassesToEmitFile(pm, os, nullptr, type),
               "fuser: the target cannot emit ",
               type == llvm::CodeGenFileType::ObjectFile ? "object files" : "assembly");
    pm.run(m);
    return std::string(buffer.data(), buffer.size());
  }
  std::string target_key_;
  bool wide_vectors_ = false;  // AVX-512
  int vector_lanes_ = 0;       // float lanes of a vector register (AVX-512 16, AVX2 8), or 0

  std::unique_ptr<llvm::TargetMachine> target_;
  std::unique_ptr<llvm::orc::LLJIT> jit_;
  // Serializes loads and compiles (LLVM work), so that a kernel is loaded once.
  std::mutex compile_mutex_;
  // The in-memory cache: most recently used first, indexed by key (views of the list's keys).
  std::mutex mutex_;
  size_t capacity_ = capacity_from_env();
  std::list<std::pair<std::string, CompiledKernel>> lru_;
  absl::flat_hash_map<std::string_view, std::list<std::pair<std::string, CompiledKernel>>::iterator>
      index_;
  // Every loaded kernel, cached or not, by key: what revive() finds. An entry goes when its code
  // is removed. Nothing may drop a CompiledKernel while holding live_mutex_ (the deleter takes it).
  struct Live {
    std::weak_ptr<const void> owner;
    KernelFn fn = nullptr;
    FinishFn finish = nullptr;
    ColumnsFn columns = nullptr;
    const char* name = nullptr;  // the LoadedCode's, alive while owner is
  };
  std::mutex live_mutex_;
  std::condition_variable live_cv_;
  absl::flat_hash_map<std::string, Live> live_;
};

CpuJit& cpu_jit() {
  // Never destroyed: kernels may run until the process exits.
  static CpuJit* jit = new CpuJit();
  return *jit;
}

// Emits one kernel function (see KernelFn).
class Emitter {
 public:
  Emitter(llvm::Module& m, const Kernel& k, int vector_width)
      : m_(m), ctx_(m.getContext()), b_(ctx_), k_(k), vector_width_(vector_width) {}

  void emit(const std::string& name, const Layout& layout) {
    llvm::Type* i64 = b_.getInt64Ty();
    llvm::Type* ptr = b_.getPtrTy();
    auto* type =
        llvm::FunctionType::get(b_.getVoidTy(), {i64, i64, ptr, ptr, ptr, ptr, ptr}, false);
    fn_ = llvm::Function::Create(type, llvm::Function::ExternalLinkage, name, m_);
    fn_->addFnAttr(llvm::Attribute::NoUnwind);
    // The sizes, strides and scalars are the caller's small arrays, read only and never a
    // tensor's memory: saying so lets LICM hoist the scalars' loads (and their conversions) out of
    // the loops, where the kernel's stores would otherwise have to be assumed to overwrite them.
    for (unsigned p : {3u, 4u, 5u}) {
      fn_->addParamAttr(p, llvm::Attribute::NoAlias);
      fn_->addParamAttr(p, llvm::Attribute::ReadOnly);
    }
    auto arg = fn_->arg_begin();
    llvm::Value* begin = &*arg++;
    llvm::Value* end = &*arg++;
    llvm::Value* ptrs = &*arg++;
    llvm::Value* sizes = &*arg++;
    llvm::Value* strides = &*arg++;
    scalars_ = &*arg++;
    llvm::Value* partials = &*arg++;
    auto* entry = llvm::BasicBlock::Create(ctx_, "entry", fn_);
    b_.SetInsertPoint(entry);
    if (layout.rows) {
      // Its first pass streams the rows from memory while it computes (cross entropy's exp and
      // log): see PrefetchPass.
      fn_->addFnAttr(kPrefetchAttribute);
      emit_rows(layout, begin, end, ptrs, sizes, strides, partials);
      return;
    }
    const size_t num_inputs = k_.input_types.size();
    const size_t num_ptrs = num_inputs + k_.outputs.size();
    for (size_t p = 0; p < num_ptrs; ++p)
      bases_.push_back(b_.CreateLoad(ptr, b_.CreateConstGEP1_64(ptr, ptrs, p), "base"));
    auto* exit = llvm::BasicBlock::Create(ctx_, "exit", fn_);
    if (layout.flat) {
      single_ = layout.single_element;
      loop(begin, end, exit, [&](llvm::Value* i) {
        std::vector<llvm::Value*> offsets(num_ptrs, i);
        body(offsets);
      });
      // See PrefetchPass.
      if (computes_transcendentals()) fn_->addFnAttr(kPrefetchAttribute);
    } else {
      const int rank = layout.rank;
      std::vector<llvm::Value*> size(rank);
      for (int d = 0; d < rank; ++d)
        size[d] = b_.CreateLoad(i64, b_.CreateConstGEP1_64(i64, sizes, d), "size");
      std::vector<std::vector<llvm::Value*>> stride(num_ptrs, std::vector<llvm::Value*>(rank));
      for (size_t p = 0; p < num_ptrs; ++p)
        for (int d = 0; d < rank; ++d)
          stride[p][d] =
              b_.CreateLoad(i64, b_.CreateConstGEP1_64(i64, strides, p * rank + d), "stride");
      single_.assign(num_inputs, false);
      loop(
          begin, end, exit,
          [&](llvm::Value* row) {
            // The row's first element per pointer, from the row's index over the outer dims.
            std::vector<llvm::Value*> start(num_ptrs, b_.getInt64(0));
            llvm::Value* rem = row;
            for (int d = rank - 2; d >= 0; --d) {
              llvm::Value* idx = b_.CreateURem(rem, size[d]);
              rem = b_.CreateUDiv(rem, size[d]);
              for (size_t p = 0; p < num_ptrs; ++p)
                start[p] = b_.CreateAdd(start[p], b_.CreateMul(idx, stride[p][d]));
            }
            auto* inner_exit = llvm::BasicBlock::Create(ctx_, "row_done", fn_);
            loop(b_.getInt64(0), size[rank - 1], inner_exit, [&](llvm::Value* j) {
              std::vector<llvm::Value*> offsets(num_ptrs);
              for (size_t p = 0; p < num_ptrs; ++p)
                offsets[p] = inner_offset(layout.inner[p], start[p], j, stride[p][rank - 1]);
              body(offsets);
            });
            b_.SetInsertPoint(inner_exit);
          },
          /*vectorize=*/false);
    }
    b_.SetInsertPoint(exit);
    b_.CreateRetVoid();
  }

 private:
  // LLVM's cost model picks 4 lanes for these loops, and unrolls them 4 times more; measured on
  // the GELU kernel, 16 lanes twice interleaved run 2.6x faster (10.4 ms against 27 ms per 16M
  // elements) and compile 3x faster (13 ms against 45 ms) than the defaults; not interleaved
  // (interleave count 1) the GELU kernel ran 2.2x slower.
  static constexpr int kInterleave = 2;

  // for (i = from; i < to; ++i) f(i), leaving the builder at `done`'s predecessor... then `done`.
  // With `vectorize`, vector_width_ lanes kInterleave times (the loops over elements).
  template <typename F>
  void loop(llvm::Value* from, llvm::Value* to, llvm::BasicBlock* done, const F& f,
            bool vectorize = true) {
    llvm::BasicBlock* pre = b_.GetInsertBlock();
    auto* head = llvm::BasicBlock::Create(ctx_, "loop", fn_);
    b_.CreateCondBr(b_.CreateICmpSLT(from, to), head, done);
    b_.SetInsertPoint(head);
    llvm::PHINode* i = b_.CreatePHI(b_.getInt64Ty(), 2, "i");
    i->addIncoming(from, pre);
    f(i);
    llvm::Value* next = b_.CreateAdd(i, b_.getInt64(1), "", true, true);
    i->addIncoming(next, b_.GetInsertBlock());
    llvm::BranchInst* back = b_.CreateCondBr(b_.CreateICmpSLT(next, to), head, done);
    if (vector_width_ == 0 || !vectorize) return;
    std::vector<llvm::Metadata*> ops = {
        nullptr, property("llvm.loop.vectorize.width", b_.getInt32(vector_width_)),
        property("llvm.loop.interleave.count", b_.getInt32(kInterleave)),
        property("llvm.loop.vectorize.enable", b_.getTrue())};
    // The iterations are independent: element i reads its inputs' elements and writes its
    // outputs' elements i, and an output overlaps an input only at the same elements (the
    // executor gives kernels fresh buffers, or an input's own buffer when the layouts match
    // element for element; calls already run ranges of the same loop on several threads at once,
    // so a kernel may assume it). Saying so (the loads and stores of tensors in one access group,
    // listed as parallel) spares the vectorizer its run-time overlap checks and the scalar loop
    // they fall back to. Single-block bodies only; accumulators in allocas are not tensor accesses.
    if (b_.GetInsertBlock() == head) {
      llvm::MDNode* group = llvm::MDNode::getDistinct(ctx_, {});
      for (llvm::Instruction& in : *head) {
        llvm::Value* address = nullptr;
        if (auto* l = llvm::dyn_cast<llvm::LoadInst>(&in)) address = l->getPointerOperand();
        if (auto* st = llvm::dyn_cast<llvm::StoreInst>(&in)) address = st->getPointerOperand();
        if (!address || llvm::isa<llvm::AllocaInst>(address->stripPointerCasts())) continue;
        in.setMetadata(llvm::LLVMContext::MD_access_group, group);
      }
      ops.push_back(llvm::MDNode::get(
          ctx_, {llvm::MDString::get(ctx_, "llvm.loop.parallel_accesses"), group}));
    }
    llvm::MDNode* loop_id = llvm::MDNode::getDistinct(ctx_, ops);
    loop_id->replaceOperandWith(0, loop_id);
    back->setMetadata(llvm::LLVMContext::MD_loop, loop_id);
  }

  bool computes_transcendentals() const {
    for (const Instr& in : k_.body)
      if (is_costly(in.prim)) return true;
    return false;
  }
  llvm::MDNode* property(const char* name, llvm::Constant* value) {
    return llvm::MDNode::get(
        ctx_, {llvm::MDString::get(ctx_, name), llvm::ConstantAsMetadata::get(value)});
  }

  llvm::Type* storage_type(DType t) {
    switch (t) {
      case kBool:
        return b_.getInt8Ty();
      case kInt32:
        return b_.getInt32Ty();
      case kInt64:
        return b_.getInt64Ty();
      case kFloat32:
        return b_.getFloatTy();
      case kFloat64:
        return b_.getDoubleTy();
    }
    return nullptr;
  }
  llvm::Type* value_type(DType t) { return t == kBool ? b_.getInt1Ty() : storage_type(t); }

  llvm::Value* load(DType t, llvm::Value* address) {
    llvm::Value* v = b_.CreateLoad(storage_type(t), address);
    return t == kBool ? b_.CreateICmpNE(v, b_.getInt8(0)) : v;
  }

  llvm::Value* cast(llvm::Value* v, DType from, DType to) {
    if (from == to) return v;
    llvm::Type* dst = value_type(to);
    if (to == kBool)
      return is_floating_point(from) ? b_.CreateFCmpUNE(v, llvm::ConstantFP::get(v->getType(), 0))
                                     : b_.CreateICmpNE(v, llvm::ConstantInt::get(v->getType(), 0));
    if (from == kBool)
      return is_floating_point(to) ? b_.CreateUIToFP(v, dst) : b_.CreateZExt(v, dst);
    if (is_floating_point(from) && is_floating_point(to)) return b_.CreateFPCast(v, dst);
    if (is_floating_point(from)) {
      // As x86's truncating conversion (what static_cast compiles to): the lowest integer for
      // NaN and values out of range, where LLVM's fptosi would give poison.
      const unsigned bits = dst->getIntegerBitWidth();
      llvm::Value* limit = llvm::ConstantFP::get(v->getType(), std::ldexp(1.0, bits - 1));
      llvm::Value* fits = b_.CreateFCmpOLT(intrinsic(llvm::Intrinsic::fabs, v), limit);
      return b_.CreateSelect(fits, b_.CreateFPToSI(v, dst),
                             llvm::ConstantInt::get(dst, llvm::APInt::getSignedMinValue(bits)));
    }
    if (is_floating_point(to)) return b_.CreateSIToFP(v, dst);
    return b_.CreateSExtOrTrunc(v, dst);
  }

  // A call of the libm function of two arguments (fmod, pow) that the reference kernel calls,
  // which LLVM must not reinterpret.
  llvm::Value* libm2(const char* name, llvm::Value* x, llvm::Value* y, DType t) {
    std::string fname = std::string(name) + (t == kFloat32 ? "f" : "");
    llvm::Type* ty = value_type(t);
    llvm::FunctionCallee f =
        m_.getOrInsertFunction(fname, llvm::FunctionType::get(ty, {ty, ty}, false));
    llvm::CallInst* call = b_.CreateCall(f, {x, y});
    call->addFnAttr(llvm::Attribute::NoBuiltin);
    return call;
  }
  // The truncated remainder of integers, a divisor of 0 or -1 taken as 1 (a result of 0) so that
  // the kernel never traps (the entry point rejects 0; INT_MIN % -1 overflows the division).
  llvm::Value* int_rem(llvm::Value* a, llvm::Value* b) {
    llvm::Type* ty = a->getType();
    llvm::Value* bad = b_.CreateOr(b_.CreateICmpEQ(b, llvm::ConstantInt::get(ty, 0)),
                                   b_.CreateICmpEQ(b, llvm::ConstantInt::getSigned(ty, -1)));
    return b_.CreateSRem(a, b_.CreateSelect(bad, llvm::ConstantInt::get(ty, 1), b));
  }
  // A primitive defined in lib/math/primitives.h (fuser/prim_math.h), instantiated for IR values
  // (fuser/codegen/llvm/ir_value.h) of t: float32 and float64, and for pow int32 and int64 (as
  // unsigned values of their width). Inline, or for a float transcendental that the kernel uses
  // more than once, a call of its out-of-line function (math_function).
  llvm::Value* math(Prim p, DType t, llvm::Value* a, llvm::Value* b) {
    if (!b && is_floating_point(t) && uses_of(p, t) > 1) {
      llvm::Function* f = math_function(p, t);
      llvm::CallInst* call = b_.CreateCall(f, {a});
      if (vector_width_ > 0) {
        const std::string name = f->getName().str(), lanes = std::to_string(vector_width_);
        call->addFnAttr(llvm::Attribute::get(
            ctx_, "vector-function-abi-variant",
            "_ZGV_LLVM_N" + lanes + "v_" + name + "(" + name + "_v" + lanes + ")"));
      }
      return call;
    }
    ir::Scope scope(b_, m_);
    return inline_math(p, t, a, b);
  }
  // The primitive's instructions at the current scope's builder (and lane count).
  llvm::Value* inline_math(Prim p, DType t, llvm::Value* a, llvm::Value* b) {
    llvm::Value* r = nullptr;
    visit_math(p, [&](auto m) {
      using M = decltype(m);
      auto run = [&](auto zero) {
        using V = ir::Ir<decltype(zero)>;
        if constexpr (M::kArity == 1)
          r = M::apply(V(a)).v;
        else
          r = M::apply(V(a), V(b)).v;
      };
      if (t == kFloat32) run(float{});
      if (t == kFloat64) run(double{});
      if constexpr (M::kIntegers) {
        if (t == kInt32) run(uint32_t{});
        if (t == kInt64) run(uint64_t{});
      }
    });
    KILN_CHECK(r, "fuser: LLVM codegen: ", prim_name(p), " of ", dtype_name(t));
    return r;
  }
  int uses_of(Prim p, DType t) const {
    int uses = 0;
    for (const Instr& in : k_.body) uses += in.prim == p && in.type == t;
    return uses;
  }
  // A primitive that the kernel uses more than once is emitted once per module, as a function
  // (kiln_<prim>_<f32|f64>) with a vector variant of vector_width_ lanes, which the loop
  // vectorizer calls in its place (the call's "vector-function-abi-variant"). Inlined, every use
  // is instruction-selected again in each interleaved copy of the vector body and in the scalar
  // remainder loop (about 2 ms of a cold compile per float32 tanh); out of line, once per module.
  // A primitive used once stays inline (GELU's tanh): the call costs the loop spills around it.
  llvm::Function* math_function(Prim p, DType t) {
    const std::string name =
        std::string("kiln_") + prim_name(p) + (t == kFloat32 ? "_f32" : "_f64");
    if (llvm::Function* f = m_.getFunction(name)) return f;
    // The function of `lanes` lanes (0: scalar), its body from `body`.
    auto define = [&](const std::string& fname, unsigned lanes, const auto& body) {
      llvm::Type* ty = value_type(t);
      if (lanes) ty = llvm::FixedVectorType::get(ty, lanes);
      auto* f = llvm::Function::Create(llvm::FunctionType::get(ty, {ty}, false),
                                       llvm::Function::InternalLinkage, fname, m_);
      llvm::IRBuilder<> b(llvm::BasicBlock::Create(ctx_, "entry", f));
      b.CreateRet(body(b, f->getArg(0)));
      f->addFnAttr(llvm::Attribute::NoInline);
      f->addFnAttr(llvm::Attribute::NoUnwind);
      f->addFnAttr(llvm::Attribute::WillReturn);
      // sin and cos read a constant table; the others touch no memory.
      bool reads = false;
      for (llvm::Instruction& in : f->getEntryBlock()) reads |= in.mayReadFromMemory();
      if (reads)
        f->setOnlyReadsMemory();
      else
        f->setDoesNotAccessMemory();
      return f;
    };
    auto primitive = [&](unsigned lanes) {
      return [&, lanes](llvm::IRBuilder<>& b, llvm::Value* x) {
        ir::Scope scope(b, m_, lanes);
        return inline_math(p, t, x, nullptr);
      };
    };
    if (vector_width_ == 0) return define(name, 0, primitive(0));
    // The scalar function (the remainder loop's, and unvectorized loops') is the vector one on a
    // splat, lane 0: one copy of the primitive to compile, at the cost of a scalar's work.
    const auto lanes = static_cast<unsigned>(vector_width_);
    llvm::Function* vector = define(name + "_v" + std::to_string(lanes), lanes, primitive(lanes));
    return define(name, 0, [&](llvm::IRBuilder<>& b, llvm::Value* x) {
      return b.CreateExtractElement(b.CreateCall(vector, {b.CreateVectorSplat(lanes, x)}),
                                    uint64_t{0});
    });
  }
  llvm::Value* intrinsic(llvm::Intrinsic::ID id, llvm::Value* x) {
    return b_.CreateUnaryIntrinsic(id, x);
  }

  // Instruction n's value, from its operands' in v; loads read at offsets[input] (elements).
  llvm::Value* compute(size_t n, const std::vector<llvm::Value*>& v,
                       const std::vector<llvm::Value*>& offsets) {
    const Instr& in = k_.body[n];
    const DType t = in.type;
    llvm::Value* a = in.a >= 0 ? v[static_cast<size_t>(in.a)] : nullptr;
    llvm::Value* b = in.b >= 0 ? v[static_cast<size_t>(in.b)] : nullptr;
    llvm::Value* c = in.c >= 0 ? v[static_cast<size_t>(in.c)] : nullptr;
    const DType at = in.a >= 0 ? k_.body[static_cast<size_t>(in.a)].type : t;
    const bool fp = is_floating_point(at);
    const bool boolean = at == kBool;
    llvm::Value* r = nullptr;
    switch (in.prim) {
      case Prim::Load: {
        const auto p = static_cast<size_t>(in.index);
        llvm::Value* offset = single_[p] ? b_.getInt64(0) : offsets[p];
        r = load(t, b_.CreateGEP(storage_type(t), bases_[p], offset));
        break;
      }
      case Prim::Scalar:
        r = load(t, b_.CreateConstGEP1_64(b_.getInt64Ty(), scalars_, in.index));
        break;
      case Prim::Literal:
        if (is_floating_point(t))
          r = llvm::ConstantFP::get(value_type(t), in.literal);
        else if (t == kBool)
          r = b_.getInt1(in.literal != 0);
        else
          r = llvm::ConstantInt::get(value_type(t), static_cast<int64_t>(in.literal), true);
        break;
      case Prim::Cast:
        r = cast(a, at, t);
        break;
      case Prim::Neg:
        r = fp ? b_.CreateFNeg(a) : b_.CreateNeg(a);
        break;
      case Prim::Add:
        r = fp ? b_.CreateFAdd(a, b) : boolean ? b_.CreateOr(a, b) : b_.CreateAdd(a, b);
        break;
      case Prim::Sub:
        r = fp ? b_.CreateFSub(a, b) : b_.CreateSub(a, b);
        break;
      case Prim::Mul:
        r = fp ? b_.CreateFMul(a, b) : boolean ? b_.CreateAnd(a, b) : b_.CreateMul(a, b);
        break;
      case Prim::Div:
        r = b_.CreateFDiv(a, b);
        break;
      case Prim::Lt:
        r = fp ? b_.CreateFCmpOLT(a, b) : boolean ? b_.CreateICmpULT(a, b) : b_.CreateICmpSLT(a, b);
        break;
      case Prim::Le:
        r = fp ? b_.CreateFCmpOLE(a, b) : boolean ? b_.CreateICmpULE(a, b) : b_.CreateICmpSLE(a, b);
        break;
      case Prim::Gt:
        r = fp ? b_.CreateFCmpOGT(a, b) : boolean ? b_.CreateICmpUGT(a, b) : b_.CreateICmpSGT(a, b);
        break;
      case Prim::Ge:
        r = fp ? b_.CreateFCmpOGE(a, b) : boolean ? b_.CreateICmpUGE(a, b) : b_.CreateICmpSGE(a, b);
        break;
      case Prim::Eq:
        r = fp ? b_.CreateFCmpOEQ(a, b) : b_.CreateICmpEQ(a, b);
        break;
      case Prim::Ne:
        r = fp ? b_.CreateFCmpUNE(a, b) : b_.CreateICmpNE(a, b);
        break;
      case Prim::And:
        r = b_.CreateAnd(a, b);
        break;
      case Prim::Or:
        r = b_.CreateOr(a, b);
        break;
      case Prim::Not:
        r = b_.CreateNot(a);
        break;
      case Prim::Select:
        r = b_.CreateSelect(a, b, c);
        break;
      case Prim::Exp:
      case Prim::Log:
      case Prim::Log1p:
      case Prim::Expm1:
      case Prim::Sin:
      case Prim::Cos:
      case Prim::Tanh:
      case Prim::Erf:
        r = math(in.prim, t, a, b);
        break;
      case Prim::Sqrt:
        r = intrinsic(llvm::Intrinsic::sqrt, a);
        break;
      // On integers these are the identity (as the reference kernels' on_floats).
      case Prim::Floor:
        r = fp ? intrinsic(llvm::Intrinsic::floor, a) : a;
        break;
      case Prim::Ceil:
        r = fp ? intrinsic(llvm::Intrinsic::ceil, a) : a;
        break;
      case Prim::ReduceSum:
      case Prim::ReduceMax:
      case Prim::ReduceMin:
      case Prim::ReduceProd:
        KILN_CHECK(false, "fuser: a reduction is folded by its loop, not computed");
        break;
      case Prim::Round:
        r = fp ? intrinsic(llvm::Intrinsic::nearbyint, a) : a;
        break;
      case Prim::Rem:
        r = fp ? libm2("fmod", a, b, t) : int_rem(a, b);
        break;
      case Prim::Pow:  // pow takes no bools; a squaring loop over an i1 exponent gives 1
        r = boolean ? b_.getInt1(true) : math(in.prim, at, a, b);
        break;
      // On i1, i32 and i64 alike; the formulas reject floats before fusing.
      case Prim::BitAnd:
        r = b_.CreateAnd(a, b);
        break;
      case Prim::BitOr:
        r = b_.CreateOr(a, b);
        break;
      case Prim::BitXor:
        r = b_.CreateXor(a, b);
        break;
    }
    return r;
  }

  void body(const std::vector<llvm::Value*>& offsets) {
    std::vector<llvm::Value*> v(k_.body.size());
    for (size_t n = 0; n < k_.body.size(); ++n) v[n] = compute(n, v, offsets);
    const size_t num_inputs = k_.input_types.size();
    for (size_t o = 0; o < k_.outputs.size(); ++o) {
      const DType t = k_.output_types[o];
      llvm::Value* value = v[static_cast<size_t>(k_.outputs[o])];
      if (t == kBool) value = b_.CreateZExt(value, b_.getInt8Ty());
      const size_t p = num_inputs + o;
      b_.CreateStore(value, b_.CreateGEP(storage_type(t), bases_[p], offsets[p]));
    }
  }

  // The value a reduction starts from (its table entry's FoldIdentity).
  llvm::Value* identity(const Instr& r) {
    llvm::Type* ty = value_type(r.type);
    const bool fp = is_floating_point(r.type);
    const unsigned bits = fp ? 0 : ty->getIntegerBitWidth();
    switch (prim_info(r.prim).identity) {
      case FoldIdentity::kZero:
        return llvm::Constant::getNullValue(ty);
      case FoldIdentity::kOne:
        return fp ? llvm::ConstantFP::get(ty, 1.0) : llvm::ConstantInt::get(ty, 1);
      case FoldIdentity::kLowest:
        if (r.type == kBool) return b_.getInt1(false);
        return fp ? llvm::ConstantFP::getInfinity(ty, /*Negative=*/true)
                  : llvm::ConstantInt::get(ty, llvm::APInt::getSignedMinValue(bits));
      case FoldIdentity::kHighest:
        if (r.type == kBool) return b_.getInt1(true);
        return fp ? llvm::ConstantFP::getInfinity(ty, /*Negative=*/false)
                  : llvm::ConstantInt::get(ty, llvm::APInt::getSignedMaxValue(bits));
      case FoldIdentity::kNone:
        break;
    }
    KILN_CHECK(false, "fuser: ", prim_name(r.prim), " is not a reduction");
    return nullptr;
  }
  // acc folded with x. Sums and products of floats may reassociate (so that loops vectorize);
  // maximum and minimum propagate NaN, as the reference kernels do.
  llvm::Value* fold(const Instr& r, llvm::Value* acc, llvm::Value* x, bool reassociate) {
    const bool fp = is_floating_point(r.type);
    switch (r.prim) {
      case Prim::ReduceSum:
      case Prim::ReduceProd: {
        const bool sum = r.prim == Prim::ReduceSum;
        if (!fp) {
          if (r.type == kBool) return sum ? b_.CreateOr(acc, x) : b_.CreateAnd(acc, x);
          return sum ? b_.CreateAdd(acc, x) : b_.CreateMul(acc, x);
        }
        llvm::Value* v = sum ? b_.CreateFAdd(acc, x) : b_.CreateFMul(acc, x);
        if (reassociate) {
          llvm::FastMathFlags flags;
          flags.setAllowReassoc();
          llvm::cast<llvm::Instruction>(v)->setFastMathFlags(flags);
        }
        return v;
      }
      case Prim::ReduceMax:
        if (r.type == kBool) return b_.CreateOr(acc, x);
        return fp ? b_.CreateBinaryIntrinsic(llvm::Intrinsic::maximum, acc, x)
                  : b_.CreateBinaryIntrinsic(llvm::Intrinsic::smax, acc, x);
      default:
        if (r.type == kBool) return b_.CreateAnd(acc, x);
        return fp ? b_.CreateBinaryIntrinsic(llvm::Intrinsic::minimum, acc, x)
                  : b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, acc, x);
    }
  }
  // Element j of a row starting at `start`, for a pointer whose elements along it are `inner`
  // apart (the stride, passed at run time, only for kAny).
  llvm::Value* inner_offset(Layout::Inner inner, llvm::Value* start, llvm::Value* j,
                            llvm::Value* stride) {
    switch (inner) {
      case Layout::kZero:
        return start;
      case Layout::kUnit:
        return b_.CreateAdd(start, j);
      default:
        return b_.CreateAdd(start, b_.CreateMul(j, stride));
    }
  }
  llvm::AllocaInst* entry_alloca(llvm::Type* ty) {
    llvm::IRBuilder<> at(&fn_->getEntryBlock(), fn_->getEntryBlock().begin());
    return at.CreateAlloca(ty);
  }
  void store_value(DType t, llvm::Value* value, llvm::Value* address) {
    if (t == kBool) value = b_.CreateZExt(value, b_.getInt8Ty());
    b_.CreateStore(value, address);
  }
  // Each column slot's first position in a call's partials (Kernel::column_offset), for rows of
  // length R.
  std::vector<llvm::Value*> column_bases(llvm::Value* partials, llvm::Value* R) {
    std::vector<llvm::Value*> base;
    int64_t parts = 0;
    for (int32_t s = 0; s < k_.num_columns(); ++s) {
      llvm::Value* offset =
          b_.CreateAdd(b_.getInt64(k_.num_globals), b_.CreateMul(R, b_.getInt64(parts)));
      base.push_back(b_.CreateGEP(b_.getInt64Ty(), partials, offset, "column_base"));
      parts += k_.column_parts[static_cast<size_t>(s)];
    }
    return base;
  }
  // A column reduction folding into slot s (its parts' reductions share the type and the fold).
  size_t column_reduction_of(int32_t s) const {
    for (size_t n = 0; n < k_.body.size(); ++n)
      if (is_column_reduction(k_.body[n]) && k_.body[n].index == s) return n;
    KILN_CHECK(false, "fuser: column slot ", s, " has no reduction\n", k_.str());
    return 0;
  }

  // A rows kernel (see Layout): for each row, passes over its elements that fold the row
  // reductions available so far, the last one also storing element-level outputs; then the
  // row-level outputs; global reductions fold into `partials`.
  void emit_rows(const Layout& layout, llvm::Value* begin, llvm::Value* end, llvm::Value* ptrs,
                 llvm::Value* sizes, llvm::Value* strides, llvm::Value* partials) {
    llvm::Type* i64 = b_.getInt64Ty();
    llvm::Type* ptr = b_.getPtrTy();
    const size_t num_inputs = k_.input_types.size();
    const size_t num_ptrs = num_inputs + k_.outputs.size();
    const int rank = layout.rank;
    const size_t body_size = k_.body.size();
    // The passes (fuser/rows_plan.h), folding every reduction.
    const RowsPasses plan = plan_rows(k_, [](size_t) { return true; });
    const std::vector<Level>& level = plan.level;
    const std::vector<int32_t>& stage = plan.stage;
    const int32_t final_pass = plan.final_pass;
    const std::vector<std::vector<size_t>>& roots_of = plan.roots_of;
    const std::vector<bool>& stores_in = plan.stores_in;
    auto per_element = [&](size_t o) { return stored_per_element(k_, level, o); };
    single_.assign(num_inputs, false);
    for (size_t p = 0; p < num_ptrs; ++p)
      bases_.push_back(b_.CreateLoad(ptr, b_.CreateConstGEP1_64(ptr, ptrs, p), "base"));
    std::vector<llvm::Value*> size(rank + 1);
    for (int d = 0; d <= rank; ++d)
      size[d] = b_.CreateLoad(i64, b_.CreateConstGEP1_64(i64, sizes, d), "size");
    llvm::Value* row_length = size[rank];
    std::vector<std::vector<llvm::Value*>> stride(num_ptrs, std::vector<llvm::Value*>(rank + 1));
    for (size_t p = 0; p < num_ptrs; ++p)
      for (int d = 0; d <= rank; ++d)
        stride[p][d] =
            b_.CreateLoad(i64, b_.CreateConstGEP1_64(i64, strides, p * (rank + 1) + d), "stride");
    // Global accumulators, folded over every row of the call.
    std::vector<llvm::AllocaInst*> acc(body_size, nullptr);
    for (size_t n = 0; n < body_size; ++n) {
      const Instr& in = k_.body[n];
      if (!is_reduction(in.prim) || is_column_reduction(in)) continue;
      acc[n] = entry_alloca(value_type(in.type));
      if (is_global_reduction(in)) b_.CreateStore(identity(in), acc[n]);
    }
    // Column partials: each slot's positions start at the identity, then every row of the call
    // folds into them, position by position (a loop that vectorizes across the row).
    const std::vector<llvm::Value*> column_base = column_bases(partials, row_length);
    for (int32_t s = 0; s < k_.num_columns(); ++s) {
      const Instr& r = k_.body[column_reduction_of(s)];
      auto* done = llvm::BasicBlock::Create(ctx_, "columns_ready", fn_);
      llvm::Value* width = b_.CreateMul(row_length, b_.getInt64(k_.column_parts[s]));
      loop(b_.getInt64(0), width, done, [&](llvm::Value* j) {
        store_value(r.type, identity(r), b_.CreateGEP(storage_type(r.type), column_base[s], j));
      });
      b_.SetInsertPoint(done);
    }
    // Element-level instructions pass `pass` needs, not looking past values it reads from a row
    // buffer (`from_buffer`).
    auto needed_in = [&](int32_t pass, const std::vector<bool>& from_buffer) {
      std::vector<bool> needed(body_size, false);
      std::vector<size_t> work;
      for (size_t r : roots_of[pass]) work.push_back(static_cast<size_t>(k_.body[r].a));
      if (stores_in[pass])
        for (int32_t o : k_.outputs)
          if (level[static_cast<size_t>(o)] == Level::kElement)
            work.push_back(static_cast<size_t>(o));
      while (!work.empty()) {
        const size_t n = work.back();
        work.pop_back();
        if (needed[n] || level[n] != Level::kElement) continue;
        needed[n] = true;
        if (from_buffer[n]) continue;
        const Instr& in = k_.body[n];
        for (int32_t o : {in.a, in.b, in.c})
          if (o >= 0) work.push_back(static_cast<size_t>(o));
      }
      return needed;
    };
    // A transcendental that several passes need is computed once per element, in the first of
    // them, and kept in a row buffer that later passes read (softmax's exp: computed while
    // summing, read back while scaling). The buffer holds one row, so it stays in cache.
    std::vector<int32_t> first_pass(body_size, -1);
    std::vector<bool> buffered(body_size, false);
    {
      const std::vector<bool> none(body_size, false);
      std::vector<int32_t> passes_needing(body_size, 0);
      for (int32_t pass = 0; pass <= final_pass; ++pass) {
        const std::vector<bool> needed = needed_in(pass, none);
        for (size_t n = 0; n < body_size; ++n) {
          if (!needed[n]) continue;
          if (first_pass[n] < 0) first_pass[n] = pass;
          ++passes_needing[n];
        }
      }
      for (size_t n = 0; n < body_size; ++n)
        buffered[n] =
            passes_needing[n] > 1 && k_.body[n].type != kBool && is_costly(k_.body[n].prim);
    }
    std::vector<llvm::Value*> row_buffer(body_size, nullptr);
    llvm::FunctionCallee malloc_fn =
        m_.getOrInsertFunction("malloc", llvm::FunctionType::get(ptr, {i64}, false));
    llvm::FunctionCallee free_fn =
        m_.getOrInsertFunction("free", llvm::FunctionType::get(b_.getVoidTy(), {ptr}, false));
    for (size_t n = 0; n < body_size; ++n) {
      if (!buffered[n]) continue;
      const uint64_t bytes = m_.getDataLayout().getTypeAllocSize(value_type(k_.body[n].type));
      row_buffer[n] = b_.CreateCall(
          malloc_fn, {b_.CreateMul(b_.CreateAdd(row_length, b_.getInt64(1)), b_.getInt64(bytes))},
          "row_buffer");
    }
    auto* exit = llvm::BasicBlock::Create(ctx_, "exit", fn_);
    loop(
        begin, end, exit,
        [&](llvm::Value* row) {
          // The row's first element per pointer.
          std::vector<llvm::Value*> start(num_ptrs, b_.getInt64(0));
          llvm::Value* rem = row;
          for (int d = rank - 1; d >= 0; --d) {
            llvm::Value* idx = d == 0 ? rem : b_.CreateURem(rem, size[d]);
            if (d > 0) rem = b_.CreateUDiv(rem, size[d]);
            for (size_t p = 0; p < num_ptrs; ++p)
              start[p] = b_.CreateAdd(start[p], b_.CreateMul(idx, stride[p][d]));
          }
          std::vector<llvm::Value*> v(body_size, nullptr);
          // Row-level and constant instructions of `s`, at the row's start.
          auto row_values = [&](int32_t s) {
            for (size_t n = 0; n < body_size; ++n) {
              if (stage[n] != s || v[n]) continue;
              if (level[n] != Level::kRow && level[n] != Level::kConst) continue;
              if (is_reduction(k_.body[n].prim)) continue;
              v[n] = compute(n, v, start);
            }
          };
          row_values(0);
          for (int32_t pass = 0; pass <= final_pass; ++pass) {
            const std::vector<size_t>& roots = roots_of[pass];
            const bool last = pass == final_pass;
            if (roots.empty() && !stores_in[pass]) continue;
            // Buffered values computed by an earlier pass are read back, not recomputed.
            std::vector<bool> from_buffer(body_size, false);
            for (size_t n = 0; n < body_size; ++n)
              from_buffer[n] = buffered[n] && first_pass[n] < pass;
            const std::vector<bool> needed = needed_in(pass, from_buffer);
            for (size_t r : roots)
              if (is_row_reduction(k_.body[r])) b_.CreateStore(identity(k_.body[r]), acc[r]);
            auto* pass_done = llvm::BasicBlock::Create(ctx_, "pass_done", fn_);
            loop(b_.getInt64(0), row_length, pass_done, [&](llvm::Value* j) {
              std::vector<llvm::Value*> offsets(num_ptrs);
              for (size_t p = 0; p < num_ptrs; ++p)
                offsets[p] = inner_offset(layout.inner[p], start[p], j, stride[p][rank]);
              std::vector<llvm::Value*> e = v;
              for (size_t n = 0; n < body_size; ++n) {
                if (!needed[n]) continue;
                llvm::Type* ty = value_type(k_.body[n].type);
                if (from_buffer[n]) {
                  e[n] = b_.CreateLoad(ty, b_.CreateGEP(ty, row_buffer[n], j));
                  continue;
                }
                e[n] = compute(n, e, offsets);
                if (buffered[n] && first_pass[n] == pass)
                  b_.CreateStore(e[n], b_.CreateGEP(ty, row_buffer[n], j));
              }
              for (size_t r : roots) {
                const Instr& in = k_.body[r];
                llvm::Value* x = e[static_cast<size_t>(in.a)];
                if (is_column_reduction(in)) {
                  // Position j of the slot's part: no two elements of a row share it.
                  llvm::Value* at = b_.CreateGEP(
                      storage_type(in.type), column_base[static_cast<size_t>(in.index)],
                      b_.CreateAdd(b_.CreateMul(row_length, b_.getInt64(in.part)), j));
                  store_value(in.type, fold(in, load(in.type, at), x, false), at);
                  continue;
                }
                llvm::Type* ty = value_type(in.type);
                b_.CreateStore(fold(in, b_.CreateLoad(ty, acc[r]), x, true), acc[r]);
              }
              if (last) {
                for (size_t o = 0; o < k_.outputs.size(); ++o) {
                  const auto n = static_cast<size_t>(k_.outputs[o]);
                  if (!per_element(o)) continue;
                  const size_t p = num_inputs + o;
                  const DType t = k_.output_types[o];
                  store_value(t, e[n], b_.CreateGEP(storage_type(t), bases_[p], offsets[p]));
                }
              }
            });
            b_.SetInsertPoint(pass_done);
            for (size_t r : roots)
              if (is_row_reduction(k_.body[r]))
                v[r] = b_.CreateLoad(value_type(k_.body[r].type), acc[r]);
            row_values(pass + 1);
          }
          for (size_t o = 0; o < k_.outputs.size(); ++o) {
            const auto n = static_cast<size_t>(k_.outputs[o]);
            if ((level[n] != Level::kRow && level[n] != Level::kConst) || per_element(o)) continue;
            const size_t p = num_inputs + o;
            const DType t = k_.output_types[o];
            KILN_CHECK(v[n], "fuser: row-level output ", n, " not computed\n", k_.str());
            store_value(t, v[n], b_.CreateGEP(storage_type(t), bases_[p], start[p]));
          }
          for (size_t n = 0; n < body_size; ++n) {
            const Instr& in = k_.body[n];
            if (!is_global_reduction(in)) continue;
            const auto a = static_cast<size_t>(in.a);
            if (level[a] == Level::kElement) continue;
            KILN_CHECK(v[a], "fuser: row-level operand ", a, " not computed\n", k_.str());
            llvm::Type* ty = value_type(in.type);
            b_.CreateStore(fold(in, b_.CreateLoad(ty, acc[n]), v[a], false), acc[n]);
          }
        },
        false);
    b_.SetInsertPoint(exit);
    for (size_t n = 0; n < body_size; ++n) {
      const Instr& in = k_.body[n];
      if (!is_global_reduction(in)) continue;
      store_value(in.type, b_.CreateLoad(value_type(in.type), acc[n]),
                  b_.CreateConstGEP1_64(i64, partials, in.index));
    }
    for (llvm::Value* buffer : row_buffer)
      if (buffer) b_.CreateCall(free_fn, {buffer});
    b_.CreateRetVoid();
  }

 public:
  // The finish function of a kernel with global reductions (see FinishFn).
  // Starts a helper function of a kernel (finish, columns): its parameters are `leading`, then
  // the tensor pointers and the kernel scalars. Loads the pointers' bases (every input read at
  // its first element) and returns the leading arguments.
  std::vector<llvm::Value*> begin_helper(const std::string& name,
                                         std::vector<llvm::Type*> leading) {
    llvm::Type* ptr = b_.getPtrTy();
    const size_t num_leading = leading.size();
    leading.push_back(ptr);
    leading.push_back(ptr);
    auto* type = llvm::FunctionType::get(b_.getVoidTy(), leading, false);
    fn_ = llvm::Function::Create(type, llvm::Function::ExternalLinkage, name, m_);
    fn_->addFnAttr(llvm::Attribute::NoUnwind);
    std::vector<llvm::Value*> args;
    for (llvm::Argument& a : fn_->args()) args.push_back(&a);
    llvm::Value* ptrs = args[num_leading];
    scalars_ = args[num_leading + 1];
    args.resize(num_leading);
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn_));
    const size_t num_inputs = k_.input_types.size();
    const size_t num_ptrs = num_inputs + k_.outputs.size();
    bases_.clear();
    for (size_t p = 0; p < num_ptrs; ++p)
      bases_.push_back(b_.CreateLoad(ptr, b_.CreateConstGEP1_64(ptr, ptrs, p), "base"));
    single_.assign(num_inputs, true);
    return args;
  }

  void emit_finish(const std::string& name) {
    llvm::Type* i64 = b_.getInt64Ty();
    const std::vector<llvm::Value*> args = begin_helper(name, {i64, i64, b_.getPtrTy()});
    llvm::Value* calls = args[0];
    llvm::Value* stride = args[1];
    llvm::Value* partials = args[2];
    const size_t num_inputs = k_.input_types.size();
    const size_t num_ptrs = num_inputs + k_.outputs.size();
    const std::vector<Level> level = instr_levels(k_);
    const size_t body_size = k_.body.size();
    std::vector<llvm::Value*> v(body_size, nullptr);
    std::vector<llvm::AllocaInst*> acc(body_size, nullptr);
    for (size_t n = 0; n < body_size; ++n) {
      const Instr& in = k_.body[n];
      if (!is_global_reduction(in)) continue;
      acc[n] = entry_alloca(value_type(in.type));
      b_.CreateStore(identity(in), acc[n]);
    }
    auto* done = llvm::BasicBlock::Create(ctx_, "combined", fn_);
    loop(
        b_.getInt64(0), calls, done,
        [&](llvm::Value* c) {
          for (size_t n = 0; n < body_size; ++n) {
            const Instr& in = k_.body[n];
            if (!acc[n]) continue;
            llvm::Value* slot = b_.CreateGEP(
                i64, partials, b_.CreateAdd(b_.CreateMul(c, stride), b_.getInt64(in.index)));
            llvm::Value* x = load(in.type, slot);
            llvm::Type* ty = value_type(in.type);
            b_.CreateStore(fold(in, b_.CreateLoad(ty, acc[n]), x, false), acc[n]);
          }
        },
        false);
    b_.SetInsertPoint(done);
    const std::vector<llvm::Value*> origin(num_ptrs, b_.getInt64(0));
    for (size_t n = 0; n < body_size; ++n) {
      if (acc[n]) {
        v[n] = b_.CreateLoad(value_type(k_.body[n].type), acc[n]);
        continue;
      }
      if (level[n] == Level::kGlobal || level[n] == Level::kConst) v[n] = compute(n, v, origin);
    }
    for (size_t o = 0; o < k_.outputs.size(); ++o) {
      const auto n = static_cast<size_t>(k_.outputs[o]);
      if (level[n] != Level::kGlobal) continue;
      const DType t = k_.output_types[o];
      store_value(t, v[n], bases_[num_inputs + o]);
    }
    b_.CreateRetVoid();
  }

  // The columns function of a kernel with column reductions (see ColumnsFn). Per slot, the calls'
  // partials fold into the first call's, call after call (each position in call order, so in row
  // order: the result does not depend on how calls were spread over threads), in a loop over
  // positions that vectorizes; then each position's outputs are computed from the slot's value.
  void emit_columns(const std::string& name) {
    llvm::Type* i64 = b_.getInt64Ty();
    llvm::Type* ptr = b_.getPtrTy();
    const std::vector<llvm::Value*> args = begin_helper(name, {i64, i64, i64, i64, i64, ptr});
    llvm::Value* begin = args[0];
    llvm::Value* end = args[1];
    llvm::Value* calls = args[2];
    llvm::Value* stride = args[3];
    llvm::Value* R = args[4];
    llvm::Value* partials = args[5];
    const size_t num_inputs = k_.input_types.size();
    const size_t num_ptrs = num_inputs + k_.outputs.size();
    const std::vector<Level> level = instr_levels(k_);
    const size_t body_size = k_.body.size();
    // The slot each column-level instruction derives from (one: nothing combines two slots).
    std::vector<int32_t> slot_of(body_size, -1);
    for (size_t n = 0; n < body_size; ++n) {
      const Instr& in = k_.body[n];
      if (is_column_reduction(in)) {
        slot_of[n] = in.index;
        continue;
      }
      if (level[n] != Level::kColumn) continue;
      for (int32_t o : {in.a, in.b, in.c})
        if (o >= 0 && slot_of[static_cast<size_t>(o)] >= 0)
          slot_of[n] = slot_of[static_cast<size_t>(o)];
    }
    const std::vector<llvm::Value*> base = column_bases(partials, R);
    const std::vector<llvm::Value*> origin(num_ptrs, b_.getInt64(0));
    for (int32_t s = 0; s < k_.num_columns(); ++s) {
      const Instr& r = k_.body[column_reduction_of(s)];
      llvm::Type* st = storage_type(r.type);
      llvm::Value* width = b_.CreateMul(R, b_.getInt64(k_.column_parts[static_cast<size_t>(s)]));
      llvm::Value* hi = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, end, width);
      auto* combined = llvm::BasicBlock::Create(ctx_, "combined", fn_);
      loop(
          b_.getInt64(1), calls, combined,
          [&](llvm::Value* c) {
            llvm::Value* from = b_.CreateGEP(b_.getInt64Ty(), base[s], b_.CreateMul(c, stride));
            auto* call_done = llvm::BasicBlock::Create(ctx_, "call_done", fn_);
            loop(begin, hi, call_done, [&](llvm::Value* j) {
              llvm::Value* at = b_.CreateGEP(st, base[s], j);
              llvm::Value* x = load(r.type, b_.CreateGEP(st, from, j));
              store_value(r.type, fold(r, load(r.type, at), x, false), at);
            });
            b_.SetInsertPoint(call_done);
          },
          false);
      b_.SetInsertPoint(combined);
      // What the slot's outputs need: column-level instructions of the slot and constants.
      std::vector<bool> needed(body_size, false);
      std::vector<size_t> work;
      for (int32_t o : k_.outputs)
        if (slot_of[static_cast<size_t>(o)] == s) work.push_back(static_cast<size_t>(o));
      if (work.empty()) continue;
      while (!work.empty()) {
        const size_t n = work.back();
        work.pop_back();
        if (needed[n]) continue;
        needed[n] = true;
        if (is_column_reduction(k_.body[n])) continue;
        for (int32_t o : {k_.body[n].a, k_.body[n].b, k_.body[n].c})
          if (o >= 0) work.push_back(static_cast<size_t>(o));
      }
      auto* stored = llvm::BasicBlock::Create(ctx_, "stored", fn_);
      loop(begin, hi, stored, [&](llvm::Value* j) {
        std::vector<llvm::Value*> v(body_size, nullptr);
        for (size_t n = 0; n < body_size; ++n) {
          if (!needed[n]) continue;
          v[n] = is_column_reduction(k_.body[n]) ? load(r.type, b_.CreateGEP(st, base[s], j))
                                                 : compute(n, v, origin);
        }
        for (size_t o = 0; o < k_.outputs.size(); ++o) {
          const auto n = static_cast<size_t>(k_.outputs[o]);
          if (slot_of[n] != s) continue;
          const DType t = k_.output_types[o];
          store_value(t, v[n], b_.CreateGEP(storage_type(t), bases_[num_inputs + o], j));
        }
      });
      b_.SetInsertPoint(stored);
    }
    b_.CreateRetVoid();
  }

 private:
  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  const Kernel& k_;
  llvm::Function* fn_ = nullptr;
  llvm::Value* scalars_ = nullptr;
  std::vector<llvm::Value*> bases_;
  std::vector<bool> single_;
  int vector_width_;
};

void CpuJit::emit(llvm::Module& m, const std::string& name, const Kernel& k, const Layout& layout,
                  int vector_width) {
  Emitter(m, k, vector_width).emit(name, layout);
  if (k.num_globals > 0) Emitter(m, k, vector_width).emit_finish(finish_name(name));
  if (k.num_columns() > 0) Emitter(m, k, vector_width).emit_columns(columns_name(name));
}

}  // namespace

CompiledKernel cpu_kernel(const Kernel& kernel, const Layout& layout) {
  return cpu_jit().get(kernel, layout);
}

std::string cpu_disk_key(const Kernel& kernel, const Layout& layout) {
  return cpu_jit().disk_key(kernel, layout);
}

size_t set_cpu_kernel_cache_capacity(size_t kernels) {
  return cpu_jit().set_capacity(kernels);
}

CompileStats cpu_compile_stats() {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  return g_stats;
}

void register_cpu_codegen_stats() {
  detail::register_stats("cpu_codegen", [] {
    const CompileStats s = cpu_compile_stats();
    return detail::StatValues{{"compiled", s.compiled},
                              {"memory_hits", s.memory_hits},
                              {"disk_hits", s.disk_hits},
                              {"evicted", s.evicted},
                              {"revived", s.revived},
                              {"unloaded", s.unloaded},
                              {"compile_seconds", s.compile_seconds}};
  });
}

}  // namespace kiln::fuser
