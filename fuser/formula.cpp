// Op-table formulas parsed into kernel instructions.
#include "fuser/formula.h"

#include <cctype>
#include <cstdlib>
#include <utility>

#include "fuser/primitives.h"
#include "kiln/error.h"

namespace kiln::fuser {
namespace {

// One formula's parse: a cursor over its text and the names `let` binds.
class FormulaParser {
 public:
  FormulaParser(Kernel& k, const std::string& text, const FormulaArgs& args)
      : k_(k), text_(text), args_(args) {}

  int32_t parse() {
    int32_t r = expr();
    skip_space();
    check(pos_ == text_.size(), "trailing text");
    return r;
  }

 private:
  void check(bool ok, const char* what) {
    KILN_CHECK(ok, "fuser: bad formula '", text_, "' (", what, " at ", pos_, ")");
  }
  void skip_space() {
    while (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
  }
  std::string token() {
    skip_space();
    size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != ' ' && text_[pos_] != '(' && text_[pos_] != ')')
      ++pos_;
    check(pos_ > start, "expected a name or number");
    return text_.substr(start, pos_ - start);
  }
  const Instr& at(int32_t i) const { return k_.body[static_cast<size_t>(i)]; }
  int32_t expr() {
    skip_space();
    check(pos_ < text_.size(), "unexpected end");
    if (text_[pos_] != '(') return atom(token());
    ++pos_;
    const std::string name = token();
    if (name == "let") {
      const std::string bound = token();
      const int32_t value = expr();
      lets_.emplace_back(bound, value);
      const int32_t body = expr();
      lets_.pop_back();
      close();
      return body;
    }
    if (name == "if-attr") {
      const std::string a = token();
      check(a.size() >= 2 && a[0] == 'a' && std::isdigit(static_cast<unsigned char>(a[1])),
            "expected an attribute");
      const std::string word = token();
      const std::optional<std::string> text =
          args_.attr_text ? args_.attr_text(std::atoi(a.c_str() + 1)) : std::nullopt;
      check(text.has_value(), "no such attribute");
      int32_t r;
      if (*text == word) {
        r = expr();
        skip();
      } else {
        skip();
        r = expr();
      }
      close();
      return r;
    }
    std::vector<int32_t> args;
    for (;;) {
      skip_space();
      check(pos_ < text_.size(), "unclosed '('");
      if (text_[pos_] == ')') break;
      args.push_back(expr());
    }
    ++pos_;
    return apply(name, args);
  }
  // Passes over one expression without parsing it.
  void skip() {
    skip_space();
    check(pos_ < text_.size(), "unexpected end");
    if (text_[pos_] != '(') {
      token();
      return;
    }
    int depth = 0;
    do {
      check(pos_ < text_.size(), "unclosed '('");
      if (text_[pos_] == '(') ++depth;
      if (text_[pos_] == ')') --depth;
      ++pos_;
    } while (depth > 0);
  }
  void close() {
    skip_space();
    check(pos_ < text_.size() && text_[pos_] == ')', "expected ')'");
    ++pos_;
  }
  int32_t atom(const std::string& t) {
    for (size_t i = lets_.size(); i-- > 0;)
      if (lets_[i].first == t) return lets_[i].second;
    if (t == "x" || t == "y" || t == "z") {
      const auto i = static_cast<size_t>(t[0] - 'x');
      check(i < args_.operands.size(), "operand missing");
      return args_.operands[i];
    }
    if (t == "n") {
      check(args_.count != nullptr, "no element count here");
      if (count_instr_ < 0) count_instr_ = args_.count();
      return count_instr_;
    }
    if (t.size() >= 2 && t[0] == 'a' && std::isdigit(static_cast<unsigned char>(t[1]))) {
      const int32_t a = args_.attr ? args_.attr(std::atoi(t.c_str() + 1)) : -1;
      check(a >= 0, "no such attribute");
      return a;
    }
    char* end = nullptr;
    double v = std::strtod(t.c_str(), &end);
    check(end && *end == '\0', "unknown name");
    return literal(args_.type, v);
  }
  int32_t literal(DType type, double v) {
    Instr in{Prim::Literal, type};
    in.literal = v;
    return k_.add(in);
  }
  // `v` as `type`: numbers are retyped, attributes and counts converted.
  int32_t coerce(int32_t v, DType type) {
    const Instr& in = at(v);
    if (in.type == type) return v;
    if (in.prim == Prim::Literal) return literal(type, in.literal);
    check(in.prim == Prim::Scalar || in.prim == Prim::Cast, "operands of different types");
    Instr c{Prim::Cast, type};
    c.a = v;
    return k_.add(c);
  }
  // The type two operands meet in: a computed value's, over numbers, attributes and counts.
  DType meet(int32_t a, int32_t b) const {
    auto weak = [this](int32_t v) {
      Prim p = at(v).prim;
      return p == Prim::Literal || p == Prim::Scalar;
    };
    if (weak(a) && !weak(b)) return at(b).type;
    return at(a).type;
  }
  // The primitive `name` (kPrims' names; "widen" is a cast to the accumulation type of sums).
  int32_t apply(const std::string& name, std::vector<int32_t> args) {
    const bool widen = name == "widen";
    const PrimInfo* e = prim_named(widen ? "cast" : name);
    check(e != nullptr, "unknown primitive");
    check(static_cast<int>(args.size()) == e->arity, "wrong number of operands");
    // Operands of arithmetic, comparisons and select's choices meet in one type.
    if (e->arity == 2 && e->prim != Prim::And && e->prim != Prim::Or) {
      const DType t = meet(args[0], args[1]);
      args[0] = coerce(args[0], t);
      args[1] = coerce(args[1], t);
    }
    if (e->prim == Prim::Select) {
      const DType t = meet(args[1], args[2]);
      args[1] = coerce(args[1], t);
      args[2] = coerce(args[2], t);
    }
    Instr in{e->prim, e->result == PrimResult::kBool
                          ? kBool
                          : at(args[e->prim == Prim::Select ? 1 : 0]).type};
    if (e->prim == Prim::Cast) in.type = args_.out_type;
    if (widen) {
      // The accumulation type of sums: double for floating types, int64 otherwise.
      in.type = is_floating_point(at(args[0]).type) ? kFloat64 : kInt64;
      if (in.type == at(args[0]).type) return args[0];
    }
    if (is_reduction(e->prim)) {
      if (args_.column_slot >= 0) {
        in.index = args_.column_slot;
        in.column = true;
        in.part = args_.part;
      } else {
        in.index = args_.global ? k_.num_globals++ : -1;
      }
    }
    in.a = args[0];
    if (e->arity > 1) in.b = args[1];
    if (e->arity > 2) in.c = args[2];
    return k_.add(in);
  }

  Kernel& k_;
  const std::string& text_;
  const FormulaArgs& args_;
  int32_t count_instr_ = -1;  // n's instruction, once made
  std::vector<std::pair<std::string, int32_t>> lets_;
  size_t pos_ = 0;
};

}  // namespace

int32_t parse_formula(Kernel& k, const std::string& text, const FormulaArgs& args) {
  return FormulaParser(k, text, args).parse();
}

}  // namespace kiln::fuser
