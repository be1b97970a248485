// The optimization pipeline that every CPU kernel goes through, and kiln's PrefetchPass in it.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fuser/codegen/llvm/cpu_internal.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/Module.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Target/TargetMachine.h"

namespace kiln::fuser::cpu {

namespace {

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

// LLVM's loop vectorizer may version a loop on a symbolic stride being 1 ("memory access
// versioning"). kiln specializes every kernel on each pointer's innermost stride (unit or not)
// already, and in its parallel loops (llvm.loop.parallel_accesses) that speculation read a
// strided input as contiguous without checking (a rows kernel with a column reduction and a math
// call, tests/fuser/reduce_fusion_test.cpp's StridedRowsWithMathCalls): it is turned off, once per
// process, before the first kernel is optimized.
constexpr const char* kVectorizerOptions = "enable-mem-access-versioning=false";

void set_vectorizer_options() {
  static const bool done = [] {
    auto& options = llvm::cl::getRegisteredOptions();
    auto it = options.find("enable-mem-access-versioning");
    KILN_CHECK(it != options.end(),
               "fuser: LLVM has no option enable-mem-access-versioning to turn off");
    static_cast<llvm::cl::opt<bool>*>(it->second)->setValue(false);
    return true;
  }();
  (void)done;
}

// How far ahead PrefetchPass prefetches, in elements of the access.
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
    const std::vector<std::pair<llvm::Instruction*, bool>> accesses = vector_accesses(f);
    const llvm::DataLayout& layout = f.getParent()->getDataLayout();
    for (const auto& [access, writes] : accesses) prefetch_before(layout, access, writes);
    return accesses.empty() ? llvm::PreservedAnalyses::all() : llvm::PreservedAnalyses::none();
  }

  // The vector loads and stores of tensors (in the loops' parallel access groups): (access,
  // writes).
  static std::vector<std::pair<llvm::Instruction*, bool>> vector_accesses(llvm::Function& f) {
    std::vector<std::pair<llvm::Instruction*, bool>> accesses;
    for (llvm::BasicBlock& block : f)
      for (llvm::Instruction& in : block) {
        if (!in.getMetadata(llvm::LLVMContext::MD_access_group)) continue;
        if (auto* l = llvm::dyn_cast<llvm::LoadInst>(&in); l && l->getType()->isVectorTy())
          accesses.emplace_back(l, false);
        if (auto* st = llvm::dyn_cast<llvm::StoreInst>(&in);
            st && st->getValueOperand()->getType()->isVectorTy())
          accesses.emplace_back(st, true);
      }
    return accesses;
  }

  // Before `access`, a prefetch of each cache line it touches, kPrefetchAhead elements further on.
  static void prefetch_before(const llvm::DataLayout& layout, llvm::Instruction* access,
                              bool writes) {
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
};

}  // namespace

std::string optimization_key() {
  return std::string(kPipeline) + "|" + kVectorizerOptions;
}

void optimize(llvm::Module& m, llvm::TargetMachine& tm) {
  set_vectorizer_options();
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

}  // namespace kiln::fuser::cpu
