// The lib/math primitives (transcendentals, pow) and rem as IR.
//
// The primitives defined in lib/math (transcendentals, pow), inline or as out-of-line
// functions with a vector variant, and the libm calls and integer remainder of rem.
#include <cstdint>
#include <string>

#include "fuser/codegen/llvm/emitter.h"
#include "fuser/codegen/llvm/ir_value.h"
#include "fuser/prim_math.h"
#include "kiln/error.h"

namespace kiln::fuser::cpu {

// A primitive defined in lib/math/primitives.h (fuser/prim_math.h), instantiated for IR values
// (fuser/codegen/llvm/ir_value.h) of t: float32 and float64, and for pow int32 and int64 (as
// unsigned values of their width). Inline, or for a float transcendental that a flat or rows
// kernel uses more than once (sin, cos and tan: always, in vectorized kernels), a call of its
// out-of-line function (math_function).
llvm::Value* Emitter::math(Prim p, DType t, llvm::Value* a, llvm::Value* b) {
  // sin, cos and tan branch around their large reduction in vector code only (see
  // ir::only_where_needed): out of line even where the kernel uses them once. A strided kernel
  // inlines every primitive: around calls in its loop, LLVM 19's vectorizer dropped the check
  // that a strided operand's inner stride is 1 and loaded it as contiguous
  // (Fuser.StridedKernelsWithTranscendentalsMatchEager).
  const bool branches = vector_width_ > 0 && (p == Prim::Sin || p == Prim::Cos || p == Prim::Tan);
  if (!b && !strided_ && is_floating_point(t) && (uses_of(p, t) > 1 || branches)) {
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
llvm::Value* Emitter::inline_math(Prim p, DType t, llvm::Value* a, llvm::Value* b) {
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

int Emitter::uses_of(Prim p, DType t) const {
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
llvm::Function* Emitter::math_function(Prim p, DType t) {
  const std::string name = std::string("kiln_") + prim_name(p) + (t == kFloat32 ? "_f32" : "_f64");
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
    for (llvm::BasicBlock& block : *f)
      for (llvm::Instruction& in : block) reads |= in.mayReadFromMemory();
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

// A call of the libm function of two arguments (fmod, pow) that the reference kernel calls,
// which LLVM must not reinterpret.
llvm::Value* Emitter::libm2(const char* name, llvm::Value* x, llvm::Value* y, DType t) {
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
llvm::Value* Emitter::int_rem(llvm::Value* a, llvm::Value* b) {
  llvm::Type* ty = a->getType();
  llvm::Value* bad = b_.CreateOr(b_.CreateICmpEQ(b, llvm::ConstantInt::get(ty, 0)),
                                 b_.CreateICmpEQ(b, llvm::ConstantInt::getSigned(ty, -1)));
  return b_.CreateSRem(a, b_.CreateSelect(bad, llvm::ConstantInt::get(ty, 1), b));
}

}  // namespace kiln::fuser::cpu
