// The IR of flat and strided kernels, and of each instruction (a dispatch by primitive).
//
// Also what every kind of kernel function is built from: the function's entry, loops over
// elements, each instruction's value, loads, stores, casts and folds.
#include "fuser/codegen/llvm/emitter.h"

#include <cmath>

#include "fuser/codegen/llvm/cpu_internal.h"
#include "kiln/error.h"

// Every primitive (fuser/primitives.h) is rendered: a switch over Prim that misses one does not
// compile.
#pragma GCC diagnostic error "-Wswitch"

namespace kiln::fuser::cpu {

void emit_kernel(llvm::Module& m, const std::string& name, const Kernel& k, const Layout& layout,
                 int vector_width) {
  Emitter(m, k, vector_width).emit(name, layout);
  if (k.num_globals > 0) Emitter(m, k, vector_width).emit_finish(finish_name(name));
  if (k.num_columns() > 0) Emitter(m, k, vector_width).emit_columns(columns_name(name));
}

void Emitter::emit(const std::string& name, const Layout& layout) {
  const KernelArgs args = begin_kernel(name);
  if (layout.rows) {
    // Its first pass streams the rows from memory while it computes (cross entropy's exp and
    // log): see PrefetchPass.
    fn_->addFnAttr(kPrefetchAttribute);
    emit_rows(layout, args);
    return;
  }
  load_bases(args.ptrs);
  auto* exit = llvm::BasicBlock::Create(ctx_, "exit", fn_);
  if (layout.flat)
    emit_flat(layout, args, exit);
  else
    emit_strided(layout, args, exit);
  b_.SetInsertPoint(exit);
  b_.CreateRetVoid();
}

// The kernel function (see KernelFn) with its entry block, the builder there.
Emitter::KernelArgs Emitter::begin_kernel(const std::string& name) {
  llvm::Type* i64 = b_.getInt64Ty();
  llvm::Type* ptr = b_.getPtrTy();
  auto* type = llvm::FunctionType::get(b_.getVoidTy(), {i64, i64, ptr, ptr, ptr, ptr, ptr}, false);
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
  KernelArgs args;
  args.begin = &*arg++;
  args.end = &*arg++;
  args.ptrs = &*arg++;
  args.sizes = &*arg++;
  args.strides = &*arg++;
  scalars_ = &*arg++;
  args.partials = &*arg++;
  b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn_));
  return args;
}

// Each pointer's first element, from the call's `ptrs`.
void Emitter::load_bases(llvm::Value* ptrs) {
  llvm::Type* ptr = b_.getPtrTy();
  const size_t num_ptrs = k_.input_types.size() + k_.outputs.size();
  for (size_t p = 0; p < num_ptrs; ++p)
    bases_.push_back(b_.CreateLoad(ptr, b_.CreateConstGEP1_64(ptr, ptrs, p), "base"));
}

// The call's `dims` sizes, then `dims` strides per pointer.
Emitter::Geometry Emitter::load_geometry(llvm::Value* sizes, llvm::Value* strides, int dims) {
  llvm::Type* i64 = b_.getInt64Ty();
  const size_t num_ptrs = k_.input_types.size() + k_.outputs.size();
  Geometry g;
  g.size.resize(dims);
  for (int d = 0; d < dims; ++d)
    g.size[d] = b_.CreateLoad(i64, b_.CreateConstGEP1_64(i64, sizes, d), "size");
  g.stride.assign(num_ptrs, std::vector<llvm::Value*>(dims));
  for (size_t p = 0; p < num_ptrs; ++p)
    for (int d = 0; d < dims; ++d)
      g.stride[p][d] =
          b_.CreateLoad(i64, b_.CreateConstGEP1_64(i64, strides, p * dims + d), "stride");
  return g;
}

// One loop over the elements, every pointer at the same offset (or a single element).
void Emitter::emit_flat(const Layout& layout, const KernelArgs& args, llvm::BasicBlock* exit) {
  const size_t num_ptrs = k_.input_types.size() + k_.outputs.size();
  single_ = layout.single_element;
  loop(args.begin, args.end, exit, [&](llvm::Value* i) {
    std::vector<llvm::Value*> offsets(num_ptrs, i);
    body(offsets);
  });
  // See PrefetchPass.
  if (computes_transcendentals()) fn_->addFnAttr(kPrefetchAttribute);
}

// A loop over rows (the outer dimensions), each an inner loop over the last dimension.
void Emitter::emit_strided(const Layout& layout, const KernelArgs& args, llvm::BasicBlock* exit) {
  const size_t num_ptrs = k_.input_types.size() + k_.outputs.size();
  const int rank = layout.rank;
  const Geometry g = load_geometry(args.sizes, args.strides, rank);
  single_.assign(k_.input_types.size(), false);
  strided_ = true;
  loop(
      args.begin, args.end, exit,
      [&](llvm::Value* row) {
        // The row's first element per pointer, from the row's index over the outer dims.
        std::vector<llvm::Value*> start(num_ptrs, b_.getInt64(0));
        llvm::Value* rem = row;
        for (int d = rank - 2; d >= 0; --d) {
          llvm::Value* idx = b_.CreateURem(rem, g.size[d]);
          rem = b_.CreateUDiv(rem, g.size[d]);
          for (size_t p = 0; p < num_ptrs; ++p)
            start[p] = b_.CreateAdd(start[p], b_.CreateMul(idx, g.stride[p][d]));
        }
        auto* inner_exit = llvm::BasicBlock::Create(ctx_, "row_done", fn_);
        loop(b_.getInt64(0), g.size[rank - 1], inner_exit, [&](llvm::Value* j) {
          std::vector<llvm::Value*> offsets(num_ptrs);
          for (size_t p = 0; p < num_ptrs; ++p)
            offsets[p] = inner_offset(layout.inner[p], start[p], j, g.stride[p][rank - 1]);
          body(offsets);
        });
        b_.SetInsertPoint(inner_exit);
      },
      /*vectorize=*/false);
}

// Every instruction at `offsets` (elements, per pointer), then the outputs stored there.
void Emitter::body(const std::vector<llvm::Value*>& offsets) {
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

bool Emitter::computes_transcendentals() const {
  for (const Instr& in : k_.body)
    if (is_costly(in.prim)) return true;
  return false;
}

// The loop metadata of a loop over elements: vector_width_ lanes, kInterleave times, and its
// tensor accesses independent across iterations.
void Emitter::mark_vectorized(llvm::BasicBlock* head, llvm::BranchInst* back) {
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
    ops.push_back(
        llvm::MDNode::get(ctx_, {llvm::MDString::get(ctx_, "llvm.loop.parallel_accesses"), group}));
  }
  llvm::MDNode* loop_id = llvm::MDNode::getDistinct(ctx_, ops);
  loop_id->replaceOperandWith(0, loop_id);
  back->setMetadata(llvm::LLVMContext::MD_loop, loop_id);
}

llvm::MDNode* Emitter::property(const char* name, llvm::Constant* value) {
  return llvm::MDNode::get(ctx_,
                           {llvm::MDString::get(ctx_, name), llvm::ConstantAsMetadata::get(value)});
}

llvm::Type* Emitter::storage_type(DType t) {
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
llvm::Type* Emitter::value_type(DType t) {
  return t == kBool ? b_.getInt1Ty() : storage_type(t);
}

llvm::Value* Emitter::load(DType t, llvm::Value* address) {
  llvm::Value* v = b_.CreateLoad(storage_type(t), address);
  return t == kBool ? b_.CreateICmpNE(v, b_.getInt8(0)) : v;
}
void Emitter::store_value(DType t, llvm::Value* value, llvm::Value* address) {
  if (t == kBool) value = b_.CreateZExt(value, b_.getInt8Ty());
  b_.CreateStore(value, address);
}

llvm::Value* Emitter::cast(llvm::Value* v, DType from, DType to) {
  if (from == to) return v;
  llvm::Type* dst = value_type(to);
  if (to == kBool)
    return is_floating_point(from) ? b_.CreateFCmpUNE(v, llvm::ConstantFP::get(v->getType(), 0))
                                   : b_.CreateICmpNE(v, llvm::ConstantInt::get(v->getType(), 0));
  if (from == kBool) return is_floating_point(to) ? b_.CreateUIToFP(v, dst) : b_.CreateZExt(v, dst);
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

llvm::Value* Emitter::intrinsic(llvm::Intrinsic::ID id, llvm::Value* x) {
  return b_.CreateUnaryIntrinsic(id, x);
}

// Element j of a row starting at `start`, for a pointer whose elements along it are `inner`
// apart (the stride, passed at run time, only for kAny).
llvm::Value* Emitter::inner_offset(Layout::Inner inner, llvm::Value* start, llvm::Value* j,
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

llvm::AllocaInst* Emitter::entry_alloca(llvm::Type* ty) {
  llvm::IRBuilder<> at(&fn_->getEntryBlock(), fn_->getEntryBlock().begin());
  return at.CreateAlloca(ty);
}

// Instruction n's value, from its operands' in v; loads read at offsets[input] (elements). One
// case per primitive of the table, by family.
llvm::Value* Emitter::compute(size_t n, const std::vector<llvm::Value*>& v,
                              const std::vector<llvm::Value*>& offsets) {
  const Instr& in = k_.body[n];
  const DType t = in.type;
  auto operand = [&](int32_t i) { return i >= 0 ? v[static_cast<size_t>(i)] : nullptr; };
  const DType at = in.a >= 0 ? k_.body[static_cast<size_t>(in.a)].type : t;
  const Operands o{operand(in.a),         operand(in.b), operand(in.c), at,
                   is_floating_point(at), at == kBool};
  switch (in.prim) {
    case Prim::Load:
    case Prim::Scalar:
    case Prim::Literal:
      return leaf(in, offsets);
    case Prim::Cast:
      return cast(o.a, at, t);
    case Prim::Neg:
    case Prim::Add:
    case Prim::Sub:
    case Prim::Mul:
    case Prim::Div:
      return arithmetic(in.prim, o);
    case Prim::Lt:
    case Prim::Le:
    case Prim::Gt:
    case Prim::Ge:
    case Prim::Eq:
    case Prim::Ne:
      return compare(in.prim, o);
    case Prim::And:
    case Prim::Or:
    case Prim::Not:
    case Prim::Select:
    case Prim::BitAnd:
    case Prim::BitOr:
    case Prim::BitXor:
      return logic(in.prim, o);
    case Prim::Sqrt:
    case Prim::Floor:
    case Prim::Ceil:
    case Prim::Round:
      return rounding(in.prim, o);
    case Prim::Exp:
    case Prim::Log:
    case Prim::Log1p:
    case Prim::Expm1:
    case Prim::Sin:
    case Prim::Cos:
    case Prim::Tanh:
    case Prim::Erf:
    case Prim::ExpNonPos:
    case Prim::Tan:
    case Prim::Atan:
    case Prim::Asin:
    case Prim::Acos:
    case Prim::Sinh:
    case Prim::Cosh:
    case Prim::Asinh:
    case Prim::Acosh:
    case Prim::Atanh:
    case Prim::Atan2:
    case Prim::Exp2:
    case Prim::Log2:
    case Prim::Log10:
    case Prim::Erfc:
    case Prim::Erfinv:
    case Prim::Lgamma:
    case Prim::Digamma:
    case Prim::Trigamma:
      return math(in.prim, t, o.a, o.b);
    case Prim::Pow:  // pow takes no bools; a squaring loop over an i1 exponent gives 1
      return o.boolean ? b_.getInt1(true) : math(in.prim, at, o.a, o.b);
    case Prim::Rem:
      return o.fp ? libm2("fmod", o.a, o.b, t) : int_rem(o.a, o.b);
    case Prim::Signbit: {  // a float's sign bit, read from its bits; x < 0 of an integer
      if (o.boolean) return b_.getInt1(false);
      llvm::Value* bits =
          o.fp ? b_.CreateBitCast(o.a, b_.getIntNTy(o.a->getType()->getScalarSizeInBits())) : o.a;
      return b_.CreateICmpSLT(bits, llvm::Constant::getNullValue(bits->getType()));
    }
    case Prim::ReduceSum:
    case Prim::ReduceMax:
    case Prim::ReduceMin:
    case Prim::ReduceProd:
      KILN_CHECK(false, "fuser: a reduction is folded by its loop, not computed");
  }
  return nullptr;
}

// A load of a tensor input's element, a kernel scalar or a literal.
llvm::Value* Emitter::leaf(const Instr& in, const std::vector<llvm::Value*>& offsets) {
  const DType t = in.type;
  if (in.prim == Prim::Load) {
    const auto p = static_cast<size_t>(in.index);
    llvm::Value* offset = single_[p] ? b_.getInt64(0) : offsets[p];
    return load(t, b_.CreateGEP(storage_type(t), bases_[p], offset));
  }
  if (in.prim == Prim::Scalar)
    return load(t, b_.CreateConstGEP1_64(b_.getInt64Ty(), scalars_, in.index));
  if (is_floating_point(t)) return llvm::ConstantFP::get(value_type(t), in.literal);
  if (t == kBool) return b_.getInt1(in.literal != 0);
  return llvm::ConstantInt::get(value_type(t), static_cast<int64_t>(in.literal), true);
}

// neg, add, sub, mul, div; on bools add is `or` and mul `and`.
llvm::Value* Emitter::arithmetic(Prim p, const Operands& o) {
  switch (p) {
    case Prim::Neg:
      return o.fp ? b_.CreateFNeg(o.a) : b_.CreateNeg(o.a);
    case Prim::Add:
      return o.fp        ? b_.CreateFAdd(o.a, o.b)
             : o.boolean ? b_.CreateOr(o.a, o.b)
                         : b_.CreateAdd(o.a, o.b);
    case Prim::Sub:
      return o.fp ? b_.CreateFSub(o.a, o.b) : b_.CreateSub(o.a, o.b);
    case Prim::Mul:
      return o.fp        ? b_.CreateFMul(o.a, o.b)
             : o.boolean ? b_.CreateAnd(o.a, o.b)
                         : b_.CreateMul(o.a, o.b);
    default:  // div, of floats only
      return b_.CreateFDiv(o.a, o.b);
  }
}

// The comparisons: ordered on floats (not equal: unordered, true for NaN), unsigned on bools,
// signed on integers.
llvm::Value* Emitter::compare(Prim p, const Operands& o) {
  using P = llvm::CmpInst::Predicate;
  struct Predicates {
    P fp, boolean, integer;
  };
  auto predicates = [](Prim q) -> Predicates {
    switch (q) {
      case Prim::Lt:
        return {P::FCMP_OLT, P::ICMP_ULT, P::ICMP_SLT};
      case Prim::Le:
        return {P::FCMP_OLE, P::ICMP_ULE, P::ICMP_SLE};
      case Prim::Gt:
        return {P::FCMP_OGT, P::ICMP_UGT, P::ICMP_SGT};
      case Prim::Ge:
        return {P::FCMP_OGE, P::ICMP_UGE, P::ICMP_SGE};
      case Prim::Eq:
        return {P::FCMP_OEQ, P::ICMP_EQ, P::ICMP_EQ};
      default:  // ne
        return {P::FCMP_UNE, P::ICMP_NE, P::ICMP_NE};
    }
  };
  const Predicates q = predicates(p);
  if (o.fp) return b_.CreateFCmp(q.fp, o.a, o.b);
  return b_.CreateICmp(o.boolean ? q.boolean : q.integer, o.a, o.b);
}

// Logic of bools (and, or, not, select) and bitwise operations on i1, i32 and i64 alike (the
// formulas reject floats before fusing).
llvm::Value* Emitter::logic(Prim p, const Operands& o) {
  switch (p) {
    case Prim::And:
    case Prim::BitAnd:
      return b_.CreateAnd(o.a, o.b);
    case Prim::Or:
    case Prim::BitOr:
      return b_.CreateOr(o.a, o.b);
    case Prim::Not:
      return b_.CreateNot(o.a);
    case Prim::Select:
      return b_.CreateSelect(o.a, o.b, o.c);
    default:  // bxor
      return b_.CreateXor(o.a, o.b);
  }
}

// sqrt, and floor, ceil and round, which are the identity on integers (as the reference kernels'
// on_floats).
llvm::Value* Emitter::rounding(Prim p, const Operands& o) {
  switch (p) {
    case Prim::Sqrt:
      return intrinsic(llvm::Intrinsic::sqrt, o.a);
    case Prim::Floor:
      return o.fp ? intrinsic(llvm::Intrinsic::floor, o.a) : o.a;
    case Prim::Ceil:
      return o.fp ? intrinsic(llvm::Intrinsic::ceil, o.a) : o.a;
    default:  // round
      return o.fp ? intrinsic(llvm::Intrinsic::nearbyint, o.a) : o.a;
  }
}

// The value a reduction starts from (its table entry's FoldIdentity).
llvm::Value* Emitter::identity(const Instr& r) {
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
llvm::Value* Emitter::fold(const Instr& r, llvm::Value* acc, llvm::Value* x, bool reassociate) {
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

}  // namespace kiln::fuser::cpu
