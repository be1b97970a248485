// LLVM IR values for lib/math's templates, so that the emitter instantiates each primitive once.
//
// LLVM IR values as a value family of lib/math/primitives.h: Ir<T> wraps the llvm::Value of
// scalar type T (float, double, uint32_t, uint64_t; bool for masks), or of a vector of them in a
// Scope with lanes (a primitive's out-of-line vector function), and its operators emit the
// instruction through the IRBuilder of the enclosing Scope. Instantiating a primitive with
// Ir<float> or Ir<double> emits exactly the operations that the scalar instantiation runs:
// IEEE operations without fast-math flags (never contracted), fmadd as llvm.fma (rounded once,
// as the scalar fmadd: one instruction on a host with FMA), select for every choice.
#pragma once

#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "lib/math/primitives.h"
#include "llvm/IR/Constants.h"
#include "llvm/IR/GlobalVariable.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/Intrinsics.h"
#include "llvm/IR/Module.h"

namespace kiln::fuser::ir {

struct Context {
  llvm::IRBuilder<>* b;
  llvm::Module* m;
  unsigned lanes;  // 0: scalar values; else vectors of this many lanes
  // (Vectors only.) Each scalar constant's splat, made once by instructions: the module's text
  // (the disk cache's key) then spells a constant once, not lane by lane at every use.
  std::vector<std::pair<llvm::Constant*, llvm::Value*>> splats;
};
inline thread_local Context* current = nullptr;

// Makes `b` (emitting into `m`) the builder of Ir values while it lives; with `lanes`, values
// are vectors of that many lanes (a primitive's out-of-line vector function).
class Scope {
 public:
  Scope(llvm::IRBuilder<>& b, llvm::Module& m, unsigned lanes = 0)
      : context_{&b, &m, lanes, {}}, outer_(current) {
    current = &context_;
  }
  ~Scope() { current = outer_; }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Context context_;
  Context* outer_;
};

inline llvm::IRBuilder<>& builder() {
  return *current->b;
}

template <typename T>
llvm::Type* scalar_type_of() {
  llvm::IRBuilder<>& b = builder();
  if constexpr (std::is_same_v<T, float>) return b.getFloatTy();
  if constexpr (std::is_same_v<T, double>) return b.getDoubleTy();
  if constexpr (std::is_same_v<T, bool>) return b.getInt1Ty();
  if constexpr (std::is_same_v<T, uint32_t>) return b.getInt32Ty();
  if constexpr (std::is_same_v<T, uint64_t>) return b.getInt64Ty();
}
// The type of a value of T in the current scope: T's, or a vector of them.
inline llvm::Type* lanes_of(llvm::Type* scalar) {
  return current->lanes ? llvm::FixedVectorType::get(scalar, current->lanes) : scalar;
}
template <typename T>
llvm::Type* type_of() {
  return lanes_of(scalar_type_of<T>());
}
// A scalar constant as a value of the current scope (a vector's splat made once: straight-line
// code, so the first use's place dominates the later ones). instcombine folds it back into a
// vector constant.
inline llvm::Value* in_scope(llvm::Constant* c) {
  if (!current->lanes) return c;
  for (const auto& [constant, value] : current->splats)
    if (constant == c) return value;
  llvm::IRBuilder<>& b = builder();
  auto* type = llvm::FixedVectorType::get(c->getType(), current->lanes);
  llvm::Instruction* one =
      b.Insert(llvm::InsertElementInst::Create(llvm::PoisonValue::get(type), c, b.getInt64(0)));
  llvm::Instruction* all =
      b.Insert(new llvm::ShuffleVectorInst(one, llvm::SmallVector<int, 16>(current->lanes, 0)));
  current->splats.emplace_back(c, all);
  return all;
}

template <typename T>
struct Ir {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bool> ||
                std::is_same_v<T, uint32_t> || std::is_same_v<T, uint64_t>);
  static constexpr bool kFloat = std::is_floating_point_v<T>;
  using Mask = Ir<bool>;

  llvm::Value* v = nullptr;

  Ir() = default;
  // From an instruction (a template, so that a literal 0 picks the constant below).
  template <
      typename P,
      std::enable_if_t<std::is_convertible_v<P, llvm::Value*> && std::is_pointer_v<P>, int> = 0>
  explicit Ir(P value) : v(value) {}
  Ir(T c) : v(constant(c)) {}  // NOLINT: constants convert implicitly, as in scalar code

  static llvm::Value* constant(T c) {
    if constexpr (kFloat)
      return in_scope(llvm::ConstantFP::get(scalar_type_of<T>(), c));
    else
      return in_scope(llvm::ConstantInt::get(scalar_type_of<T>(), static_cast<uint64_t>(c)));
  }

  friend Ir operator+(Ir a, Ir b) {
    if constexpr (kFloat) return Ir(builder().CreateFAdd(a.v, b.v));
    return Ir(builder().CreateAdd(a.v, b.v));
  }
  friend Ir operator-(Ir a, Ir b) {
    if constexpr (kFloat) return Ir(builder().CreateFSub(a.v, b.v));
    return Ir(builder().CreateSub(a.v, b.v));
  }
  friend Ir operator*(Ir a, Ir b) {
    if constexpr (kFloat) return Ir(builder().CreateFMul(a.v, b.v));
    return Ir(builder().CreateMul(a.v, b.v));
  }
  friend Ir operator/(Ir a, Ir b) { return Ir(builder().CreateFDiv(a.v, b.v)); }
  friend Ir operator-(Ir a) { return Ir(builder().CreateFNeg(a.v)); }
  friend Ir operator&(Ir a, Ir b) { return Ir(builder().CreateAnd(a.v, b.v)); }
  friend Ir operator|(Ir a, Ir b) { return Ir(builder().CreateOr(a.v, b.v)); }
  friend Ir operator!(Ir a) { return Ir(builder().CreateNot(a.v)); }
  friend Ir operator<<(Ir a, int n) { return Ir(builder().CreateShl(a.v, constant(T(n)))); }
  friend Ir operator>>(Ir a, int n) { return Ir(builder().CreateLShr(a.v, constant(T(n)))); }
  friend Ir operator<<(Ir a, Ir n) { return Ir(builder().CreateShl(a.v, n.v)); }
  friend Ir operator>>(Ir a, Ir n) { return Ir(builder().CreateLShr(a.v, n.v)); }

  // Ordered comparisons of floats (false for NaN) but != (true for NaN), as C++'s; unsigned
  // comparisons of integers.
  friend Mask operator<(Ir a, Ir b) {
    if constexpr (kFloat) return Mask(builder().CreateFCmpOLT(a.v, b.v));
    return Mask(builder().CreateICmpULT(a.v, b.v));
  }
  friend Mask operator<=(Ir a, Ir b) {
    if constexpr (kFloat) return Mask(builder().CreateFCmpOLE(a.v, b.v));
    return Mask(builder().CreateICmpULE(a.v, b.v));
  }
  friend Mask operator>(Ir a, Ir b) {
    if constexpr (kFloat) return Mask(builder().CreateFCmpOGT(a.v, b.v));
    return Mask(builder().CreateICmpUGT(a.v, b.v));
  }
  friend Mask operator>=(Ir a, Ir b) {
    if constexpr (kFloat) return Mask(builder().CreateFCmpOGE(a.v, b.v));
    return Mask(builder().CreateICmpUGE(a.v, b.v));
  }
  friend Mask operator==(Ir a, Ir b) {
    if constexpr (kFloat) return Mask(builder().CreateFCmpOEQ(a.v, b.v));
    return Mask(builder().CreateICmpEQ(a.v, b.v));
  }
  friend Mask operator!=(Ir a, Ir b) {
    if constexpr (kFloat) return Mask(builder().CreateFCmpUNE(a.v, b.v));
    return Mask(builder().CreateICmpNE(a.v, b.v));
  }

  friend Ir select(Ir<bool> m, Ir a, Ir b) { return Ir(builder().CreateSelect(m.v, a.v, b.v)); }
  friend Ir fmadd(Ir a, Ir b, Ir c) {
    return Ir(builder().CreateIntrinsic(llvm::Intrinsic::fma, {a.v->getType()}, {a.v, b.v, c.v}));
  }
  friend Ir sar(Ir a, int n) { return Ir(builder().CreateAShr(a.v, constant(T(n)))); }
  friend Mask lt_signed(Ir a, Ir b) { return Mask(builder().CreateICmpSLT(a.v, b.v)); }
};

template <typename S, typename T>
Ir<S> bitcast(Ir<T> x) {
  static_assert(sizeof(S) == sizeof(T));
  return Ir<S>(builder().CreateBitCast(x.v, type_of<S>()));
}

// Integer sources are signed (to floats); integers zero-extend or truncate.
template <typename S, typename T>
Ir<S> convert(Ir<T> x) {
  llvm::IRBuilder<>& b = builder();
  llvm::Type* to = type_of<S>();
  if constexpr (std::is_floating_point_v<T> && std::is_floating_point_v<S>)
    return Ir<S>(b.CreateFPCast(x.v, to));
  else if constexpr (std::is_floating_point_v<S>)
    return Ir<S>(b.CreateSIToFP(x.v, to));
  else
    return Ir<S>(b.CreateZExtOrTrunc(x.v, to));
}

// IEEE's square root and truncation (correctly rounded): LLVM's intrinsics.
template <typename T>
Ir<T> sqrt_of(Ir<T> x) {
  return Ir<T>(builder().CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, x.v));
}
template <typename T>
Ir<T> trunc_of(Ir<T> x) {
  return Ir<T>(builder().CreateUnaryIntrinsic(llvm::Intrinsic::trunc, x.v));
}

// The math library's pow (powf for float) where `where` holds, x elsewhere: a branch around the
// call, so that it runs only where the reference kernel calls it (an exponent that is a kernel
// scalar lets LLVM hoist the branch out of the loop), and a call LLVM must not reinterpret
// (nobuiltin).
template <typename T>
Ir<T> libm_pow(Ir<bool> where, Ir<T> x, Ir<T> y) {
  llvm::IRBuilder<>& b = builder();
  llvm::BasicBlock* from = b.GetInsertBlock();
  llvm::Function* fn = from->getParent();
  auto* call_block = llvm::BasicBlock::Create(b.getContext(), "pow_general", fn);
  auto* done = llvm::BasicBlock::Create(b.getContext(), "pow_done", fn);
  b.CreateCondBr(where.v, call_block, done);
  b.SetInsertPoint(call_block);
  llvm::Type* ty = type_of<T>();
  llvm::FunctionCallee f = current->m->getOrInsertFunction(
      std::is_same_v<T, float> ? "powf" : "pow", llvm::FunctionType::get(ty, {ty, ty}, false));
  llvm::CallInst* call = b.CreateCall(f, {x.v, y.v});
  call->addFnAttr(llvm::Attribute::NoBuiltin);
  b.CreateBr(done);
  b.SetInsertPoint(done);
  llvm::PHINode* phi = b.CreatePHI(ty, 2);
  phi->addIncoming(call, call_block);
  phi->addIncoming(x.v, from);
  return Ir<T>(phi);
}

// f() where some lane of `needed` is set, else `otherwise` (lib/math/primitives.h): in vector code
// (a primitive's out-of-line vector function) a branch on whether any lane is set around f's
// instructions, and a phi per value; in scalar code, whose loop the loop vectorizer turns into
// vector code (which a branch would keep it from doing), f() in every case.
template <typename Fn, typename... T>
std::tuple<Ir<T>...> only_where_needed(Ir<bool> needed, const Fn& f,
                                       std::tuple<Ir<T>...> otherwise) {
  if (!current->lanes) return f();
  llvm::IRBuilder<>& b = builder();
  llvm::BasicBlock* from = b.GetInsertBlock();
  llvm::Function* fn = from->getParent();
  auto* taken = llvm::BasicBlock::Create(b.getContext(), "needed", fn);
  auto* done = llvm::BasicBlock::Create(b.getContext(), "needed_done", fn);
  b.CreateCondBr(b.CreateOrReduce(needed.v), taken, done);
  b.SetInsertPoint(taken);
  // Splats made in the branch do not dominate the code after it: forgotten there.
  const size_t splats = current->splats.size();
  std::tuple<Ir<T>...> values = f();
  current->splats.resize(splats);
  llvm::BasicBlock* end = b.GetInsertBlock();
  b.CreateBr(done);
  b.SetInsertPoint(done);
  auto merge = [&](auto value, auto other) {
    llvm::PHINode* phi = b.CreatePHI(value.v->getType(), 2);
    phi->addIncoming(value.v, end);
    phi->addIncoming(other.v, from);
    return decltype(value)(phi);
  };
  return std::apply(
      [&](auto... v) {
        return std::apply([&](auto... o) { return std::tuple{merge(v, o)...}; }, otherwise);
      },
      values);
}

// Table's entry `index`: the table is a private constant of the module, emitted once.
template <typename Table, typename U>
Ir<uint32_t> gather(Ir<U> index) {
  llvm::IRBuilder<>& b = builder();
  llvm::Module& m = *current->m;
  llvm::GlobalVariable* g = m.getNamedGlobal(Table::kName);
  if (!g) {
    llvm::Constant* init = llvm::ConstantDataArray::get(
        m.getContext(), llvm::ArrayRef<uint32_t>(Table::kData, Table::kSize));
    g = new llvm::GlobalVariable(m, init->getType(), true, llvm::GlobalValue::PrivateLinkage, init,
                                 Table::kName);
    g->setUnnamedAddr(llvm::GlobalValue::UnnamedAddr::Global);
  }
  llvm::Value* i = b.CreateZExtOrTrunc(index.v, lanes_of(b.getInt64Ty()));
  llvm::Value* at = b.CreateInBoundsGEP(g->getValueType(), g, {b.getInt64(0), i});
  if (current->lanes)
    return Ir<uint32_t>(b.CreateMaskedGather(type_of<uint32_t>(), at, llvm::Align(4)));
  return Ir<uint32_t>(b.CreateLoad(b.getInt32Ty(), at));
}

}  // namespace kiln::fuser::ir
