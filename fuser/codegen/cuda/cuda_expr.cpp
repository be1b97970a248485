// One instruction of a kernel's body as a CUDA C expression: a dispatch over the primitive table
// (fuser/primitives.h), each primitive rendered with the LLVM emitter's semantics.
#include <string>

#include "fuser/codegen/cuda/cuda_prelude.h"
#include "fuser/codegen/cuda/cuda_source_writer.h"
#include "fuser/codegen/cuda/cuda_values.h"
#include "fuser/primitives.h"
#include "kiln/error.h"

// Every primitive (fuser/primitives.h) is rendered: a switch over Prim that misses one does not
// compile.
#pragma GCC diagnostic error "-Wswitch"

namespace kiln::fuser::cuda::codegen {

// An instruction's operands by name, and the type of the first (what the operation acts on).
struct Source::Operands {
  std::string a, b, c;
  DType type;
  bool fp, boolean;
  std::string bin(const char* op) const { return a + " " + op + " " + b; }
  std::string call(const std::string& f) const {
    return f + "(" + a + (b.empty() ? "" : ", " + b) + ")";
  }
  // Floats by C's operator, bools by the operator LLVM's i1 arithmetic amounts to, and integers
  // through the prelude's wrapping function.
  std::string arithmetic(const char* float_op, const char* bool_op, const char* wrapping) const {
    return fp ? bin(float_op) : boolean ? bin(bool_op) : call(wrapping);
  }
  // On integers and bools the identity, as the reference kernels' on_floats.
  std::string on_floats(const char* name, DType t) const { return fp ? call(libm(name, t)) : a; }
};

Source::Operands Source::operands(const Instr& in) const {
  Operands o;
  o.type = in.a >= 0 ? k_.body.at(static_cast<size_t>(in.a)).type : in.type;
  o.fp = is_floating_point(o.type);
  o.boolean = o.type == kBool;
  o.a = in.a >= 0 ? v(in.a) : "";
  o.b = in.b >= 0 ? v(in.b) : "";
  o.c = in.c >= 0 ? v(in.c) : "";
  return o;
}

std::string Source::expr(const Instr& in) {
  const DType t = in.type;
  const Operands x = operands(in);
  switch (in.prim) {
    case Prim::Load:
      return load_expr(in);
    case Prim::Scalar:
      return scalar_expr(in);
    case Prim::Literal:
      return literal(in.literal, t);
    case Prim::Cast:
      return cast(x.a, x.type, t);
    case Prim::Neg:  // on bool, LLVM's i1 negation is the identity
      return x.fp ? "-" + x.a : x.boolean ? x.a : x.call("kiln_neg");
    case Prim::Add:
      return x.arithmetic("+", "|", "kiln_add");
    case Prim::Sub:
      return x.arithmetic("-", "!=", "kiln_sub");
    case Prim::Mul:
      return x.arithmetic("*", "&", "kiln_mul");
    case Prim::Div:
      KILN_CHECK(x.fp, "fuser: CUDA codegen: div of ", dtype_name(x.type));
      return x.bin("/");
    // Ordered comparisons of floats are C++'s (false with NaN); ne is unordered (true with NaN),
    // as C++'s != is. Bools compare as unsigned, integers as signed, as C++ compares them.
    case Prim::Lt:
      return x.bin("<");
    case Prim::Le:
      return x.bin("<=");
    case Prim::Gt:
      return x.bin(">");
    case Prim::Ge:
      return x.bin(">=");
    case Prim::Eq:
      return x.bin("==");
    case Prim::Ne:
      return x.bin("!=");
    case Prim::And:
      return x.bin("&");
    case Prim::Or:
      return x.bin("|");
    case Prim::Not:
      return x.boolean ? "!" + x.a : "~" + x.a;
    case Prim::Select:
      return x.a + " ? " + x.b + " : " + x.c;
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
      return math_call(in, t, x.a, x.b);
    case Prim::Sqrt:  // correctly rounded (NVRTC's default -prec-sqrt=true)
      return x.call(libm("sqrt", t));
    case Prim::Floor:
      return x.on_floats("floor", t);
    case Prim::Ceil:
      return x.on_floats("ceil", t);
    case Prim::Round:  // rint: to nearest, ties to even, as nearbyint in the default mode
      return x.on_floats("rint", t);
    case Prim::Rem:  // fmod is exact; on bools LLVM's i1 remainder is always 0
      return x.fp ? x.call(libm("fmod", t)) : x.boolean ? "false" : x.call("kiln_rem");
    case Prim::Signbit:  // a float's sign bit, read from its bits; x < 0 of an integer
      if (x.boolean) return "(" + x.a + " != " + x.a + ")";  // false, naming the operand
      if (!x.fp) return "(" + x.a + " < 0)";
      return x.type == kFloat64 ? "(__double_as_longlong(" + x.a + ") < 0)"
                                : "(__float_as_int(" + x.a + ") < 0)";
    case Prim::Pow:  // pow takes no bools; LLVM's i1 squaring loop gives 1
      return x.boolean ? "true" : math_call(in, x.type, x.a, x.b);
    // Bools promote to int and convert back to bool (0 or 1) in the declared value's type.
    case Prim::BitAnd:
      KILN_CHECK(!x.fp, "fuser: CUDA codegen: bitwise and of ", dtype_name(x.type));
      return x.bin("&");
    case Prim::BitOr:
      KILN_CHECK(!x.fp, "fuser: CUDA codegen: bitwise or of ", dtype_name(x.type));
      return x.bin("|");
    case Prim::BitXor:
      KILN_CHECK(!x.fp, "fuser: CUDA codegen: bitwise xor of ", dtype_name(x.type));
      return x.bin("^");
    case Prim::ReduceSum:
    case Prim::ReduceMax:
    case Prim::ReduceMin:
    case Prim::ReduceProd:  // folded by the rows kernels' passes, never an expression
      KILN_CHECK(false, "fuser: rows kernels are not generated for CUDA yet (", symbol_, ")");
  }
  KILN_CHECK(false, "fuser: CUDA codegen: primitive ", static_cast<int>(in.prim));
  return "";
}

std::string Source::load_expr(const Instr& in) {
  KILN_CHECK(in.index >= 0 && static_cast<size_t>(in.index) < k_.input_types.size(),
             "fuser: CUDA codegen: a load of input ", in.index);
  const std::string x = load(static_cast<size_t>(in.index));
  return in.type == kBool ? "(" + x + " != 0)" : x;
}

std::string Source::scalar_expr(const Instr& in) const {
  KILN_CHECK(in.index >= 0 && static_cast<size_t>(in.index) < k_.scalar_types.size() &&
                 k_.scalar_types[static_cast<size_t>(in.index)] == in.type,
             "fuser: CUDA codegen: scalar ", in.index, " is not of type ", dtype_name(in.type));
  const std::string s = "s" + std::to_string(in.index);
  return in.type == kBool ? "(" + s + " != 0)" : s;
}

// Input p's element where expr reads it: kiln_body's parameter, or (rows kernels) the access
// load_at_ names (an element of the pointer, or a lane of its quad), noting the pointer in
// load_used_.
std::string Source::load(size_t p) {
  if (load_at_.empty()) return "x" + std::to_string(p);
  load_used_.at(p) = true;
  return load_at_.at(p);
}

// The call of primitive in's math device function (math_functions) on its operands, the function
// noted for emit() to include. Integer operands go as unsigned values of their width.
std::string Source::math_call(const Instr& in, DType t, const std::string& a,
                              const std::string& b) {
  const std::string f = std::string("kiln_") + prim_info(in.prim).math + math_suffix(t);
  KILN_CHECK(math_functions().count(f), "fuser: CUDA codegen: ", prim_name(in.prim), " of ",
             dtype_name(t));
  math_.insert(f);
  if (is_floating_point(t)) return f + "(" + a + (b.empty() ? "" : ", " + b) + ")";
  const std::string u = t == kInt32 ? "(unsigned)" : "(unsigned long long)";
  return "(" + std::string(value_type(t)) + ")" + f + "(" + u + a +
         (b.empty() ? "" : ", " + u + b) + ")";
}

}  // namespace kiln::fuser::cuda::codegen
