// CUDA C source as a value family of lib/math/primitives.h: Src<T> names a value of scalar type T
// (float, double, uint32_t, uint64_t; bool for masks) in a device function being written, and
// each operation appends one statement (const T vN = ...;) to it. render() instantiates a
// primitive with Src<float> or Src<double> once and returns it as a device function, so that the
// CUDA code generator computes what the CPU's computes: the same operations in the same order,
// fmadd as fma (CUDA devices always fuse it; the kernels compile with --fmad=false, so nothing
// else is contracted), every choice a ?: of computed values, tables as __device__ constants.
#pragma once

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "lib/math/primitives.h"

namespace kiln::fuser::src {

struct Context {
  std::vector<std::string> expressions;  // variable vN's value, by N
  std::vector<std::string> types;        // and its type
  std::string tables;                    // the __device__ tables the function reads
};
inline thread_local Context* current = nullptr;

template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "float";
  if constexpr (std::is_same_v<T, double>) return "double";
  if constexpr (std::is_same_v<T, bool>) return "bool";
  if constexpr (std::is_same_v<T, uint32_t>) return "unsigned";
  if constexpr (std::is_same_v<T, uint64_t>) return "unsigned long long";
}
// The signed type of the same width (integer sources of conversions, sar and lt_signed).
template <typename T>
const char* signed_name() {
  return std::is_same_v<T, uint32_t> ? "int" : "long long";
}

// A literal of T that reads back as exactly c (%.9g and %.17g round-trip float and double).
template <typename T>
std::string literal(T c) {
  char text[64];
  if constexpr (std::is_same_v<T, float>)
    std::snprintf(text, sizeof text, "%.9gf", static_cast<double>(c));
  else if constexpr (std::is_same_v<T, double>)
    std::snprintf(text, sizeof text, "%.17g", c);
  else if constexpr (std::is_same_v<T, bool>)
    std::snprintf(text, sizeof text, "%s", c ? "true" : "false");
  else
    std::snprintf(text, sizeof text, "%lluull", static_cast<unsigned long long>(c));
  std::string s = text;
  // A float literal needs a point or exponent before its suffix ("1f" is no literal).
  if constexpr (std::is_floating_point_v<T>)
    if (s.find_first_of(".en") == std::string::npos) s.insert(s.size() - (sizeof(T) == 4), ".0");
  if constexpr (std::is_same_v<T, uint32_t>) s = "(unsigned)" + s;
  return s;
}

template <typename T>
struct Src {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bool> ||
                std::is_same_v<T, uint32_t> || std::is_same_v<T, uint64_t>);
  static constexpr bool kFloat = std::is_floating_point_v<T>;
  using Mask = Src<bool>;

  std::string e;  // a variable's name or a literal

  Src() = default;
  Src(T c) : e(literal(c)) {}  // NOLINT: constants convert implicitly, as in scalar code

  // A new variable holding `expression`.
  static Src of(const std::string& expression) {
    Src s;
    s.e = "v" + std::to_string(current->expressions.size());
    current->expressions.push_back(expression);
    current->types.push_back(type_name<T>());
    return s;
  }

  friend Src operator+(const Src& a, const Src& b) { return of(a.e + " + " + b.e); }
  friend Src operator-(const Src& a, const Src& b) { return of(a.e + " - " + b.e); }
  friend Src operator*(const Src& a, const Src& b) { return of(a.e + " * " + b.e); }
  friend Src operator/(const Src& a, const Src& b) { return of(a.e + " / " + b.e); }
  friend Src operator-(const Src& a) { return of("-(" + a.e + ")"); }
  friend Src operator&(const Src& a, const Src& b) { return of(a.e + " & " + b.e); }
  friend Src operator|(const Src& a, const Src& b) { return of(a.e + " | " + b.e); }
  friend Src operator!(const Src& a) { return of("!" + a.e); }
  friend Src operator<<(const Src& a, int n) { return of(a.e + " << " + std::to_string(n)); }
  friend Src operator>>(const Src& a, int n) { return of(a.e + " >> " + std::to_string(n)); }
  friend Src operator<<(const Src& a, const Src& n) { return of(a.e + " << " + n.e); }
  friend Src operator>>(const Src& a, const Src& n) { return of(a.e + " >> " + n.e); }
  // C++'s comparisons are primitives.h's: ordered but !=; unsigned on unsigned types.
  friend Mask operator<(const Src& a, const Src& b) { return Mask::of(a.e + " < " + b.e); }
  friend Mask operator<=(const Src& a, const Src& b) { return Mask::of(a.e + " <= " + b.e); }
  friend Mask operator>(const Src& a, const Src& b) { return Mask::of(a.e + " > " + b.e); }
  friend Mask operator>=(const Src& a, const Src& b) { return Mask::of(a.e + " >= " + b.e); }
  friend Mask operator==(const Src& a, const Src& b) { return Mask::of(a.e + " == " + b.e); }
  friend Mask operator!=(const Src& a, const Src& b) { return Mask::of(a.e + " != " + b.e); }

  friend Src select(const Src<bool>& m, const Src& a, const Src& b) {
    return of(m.e + " ? " + a.e + " : " + b.e);
  }
  friend Src fmadd(const Src& a, const Src& b, const Src& c) {
    return of(std::string(kFloat && sizeof(T) == 4 ? "fmaf(" : "fma(") + a.e + ", " + b.e + ", " +
              c.e + ")");
  }
  friend Src sar(const Src& a, int n) {
    return of("(" + std::string(type_name<T>()) + ")((" + signed_name<T>() + ")" + a.e + " >> " +
              std::to_string(n) + ")");
  }
  friend Mask lt_signed(const Src& a, const Src& b) {
    const std::string s = std::string("(") + signed_name<T>() + ")";
    return Mask::of(s + a.e + " < " + s + b.e);
  }
};

// Bit casts through CUDA's intrinsics.
template <typename S, typename T>
Src<S> bitcast(const Src<T>& x) {
  static_assert(sizeof(S) == sizeof(T));
  if constexpr (std::is_same_v<T, float>)
    return Src<S>::of("(unsigned)__float_as_int(" + x.e + ")");
  if constexpr (std::is_same_v<T, double>)
    return Src<S>::of("(unsigned long long)__double_as_longlong(" + x.e + ")");
  if constexpr (std::is_same_v<S, float>) return Src<S>::of("__int_as_float((int)" + x.e + ")");
  if constexpr (std::is_same_v<S, double>)
    return Src<S>::of("__longlong_as_double((long long)" + x.e + ")");
}

// Integer sources are signed (to floats); integers zero-extend or truncate.
template <typename S, typename T>
Src<S> convert(const Src<T>& x) {
  const std::string to = std::string("(") + type_name<S>() + ")";
  if constexpr (std::is_integral_v<T> && std::is_floating_point_v<S>)
    return Src<S>::of(to + "(" + signed_name<T>() + ")" + x.e);
  return Src<S>::of(to + x.e);
}

// IEEE's square root and truncation (correctly rounded: NVRTC's default -prec-sqrt=true).
template <typename T>
Src<T> sqrt_of(const Src<T>& x) {
  return Src<T>::of(std::string(sizeof(T) == 4 ? "sqrtf(" : "sqrt(") + x.e + ")");
}
template <typename T>
Src<T> trunc_of(const Src<T>& x) {
  return Src<T>::of(std::string(sizeof(T) == 4 ? "truncf(" : "trunc(") + x.e + ")");
}
// The math library's pow where `where` holds (called only there: ?: evaluates one side), x
// elsewhere.
template <typename T>
Src<T> libm_pow(const Src<bool>& where, const Src<T>& x, const Src<T>& y) {
  return Src<T>::of(where.e + " ? " + (sizeof(T) == 4 ? "powf(" : "pow(") + x.e + ", " + y.e +
                    ") : " + x.e);
}

// Table's entry `index`, the table declared (once per translation unit) before the function.
template <typename Table, typename U>
Src<uint32_t> gather(const Src<U>& index) {
  const std::string name = Table::kName;
  if (current->tables.find(name) == std::string::npos) {
    std::string t = "#ifndef KILN_TABLE_" + name + "\n#define KILN_TABLE_" + name +
                    "\n__device__ const unsigned " + name + "[" + std::to_string(Table::kSize) +
                    "] = {";
    for (int i = 0; i < Table::kSize; ++i)
      t += (i ? ", " : "") + std::to_string(Table::kData[i]) + "u";
    current->tables += t + "};\n#endif\n";
  }
  return Src<uint32_t>::of(name + "[" + index.e + "]");
}

// The statements defining the variables that `result` depends on, in order: the others (values
// of cases a primitive computes but whose lanes never select them, such as the low limbs of a
// product) would draw NVRTC's "declared but never referenced" warnings.
inline std::string live_statements(const Context& c, const std::string& result) {
  std::vector<bool> live(c.expressions.size(), false);
  auto word = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  auto digit = [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) != 0; };
  // Marks every variable `text` names (a v and digits, not inside another word) as live.
  auto mark = [&](const std::string& text) {
    for (size_t i = 0; i < text.size(); ++i) {
      const bool starts = text[i] == 'v' && (i == 0 || !word(text[i - 1]));
      if (!starts || i + 1 >= text.size() || !digit(text[i + 1])) continue;
      size_t end = i + 1;
      while (end < text.size() && digit(text[end])) ++end;
      live[std::stoul(text.substr(i + 1, end - i - 1))] = true;
      i = end - 1;
    }
  };
  mark(result);
  for (size_t n = c.expressions.size(); n-- > 0;)
    if (live[n]) mark(c.expressions[n]);
  std::string body;
  for (size_t n = 0; n < c.expressions.size(); ++n)
    if (live[n])
      body += "  const " + c.types[n] + " v" + std::to_string(n) + " = " + c.expressions[n] + ";\n";
  return body;
}

// `fn` (a primitive of one or two operands over T: float, double, or an unsigned integer type)
// as the device function `name`.
template <typename T, typename Fn>
std::string render(const std::string& name, const Fn& fn) {
  Context context;
  Context* outer = current;
  current = &context;
  Src<T> x, y, r;
  x.e = "x";
  y.e = "y";
  const std::string t = type_name<T>();
  std::string params = t + " x";
  if constexpr (std::is_invocable_v<const Fn&, Src<T>>) {
    r = fn(x);
  } else {
    r = fn(x, y);
    params += ", " + t + " y";
  }
  current = outer;
  // Guarded, so that sources that each carry it may share a translation unit.
  return "#ifndef KILN_MATH_" + name + "\n#define KILN_MATH_" + name + "\n" + context.tables +
         "KILN_D " + t + " " + name + "(" + params + ") {\n" + live_statements(context, r.e) +
         "  return " + r.e + ";\n}\n#endif  // KILN_MATH_" + name + "\n";
}

}  // namespace kiln::fuser::src
