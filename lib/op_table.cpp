// Storage and look-up for the op table, and the one place that registers lib's op families.
#include "lib/op_table.h"

#include <atomic>
#include <iomanip>
#include <memory>
#include <mutex>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "kiln/error.h"
#include "lib/op_registry.h"

namespace kiln::detail {

namespace {
// The entries, filled only by register_op; read through registered_table(), which completes
// registration first. Never destroyed: ops may be looked up from other objects' destructors.
absl::flat_hash_map<std::string, std::unique_ptr<OpDef>>& storage() {
  static auto* t = new absl::flat_hash_map<std::string, std::unique_ptr<OpDef>>();
  return *t;
}

const absl::flat_hash_map<std::string, std::unique_ptr<OpDef>>& registered_table() {
  ensure_ops_registered();
  return storage();
}

// The families in a fixed order: each file's ops register together, and nothing depends on the
// order across families (ops refer to each other by handle or name only when they run).
void register_lib_ops() {
  using namespace kiln::registration;
  register_factories();
  register_tensor_ops();
  register_views();
  register_elementwise_ops();
  register_bitwise_ops();
  register_reductions();
  register_scans();
  register_searchsorted();
  register_index_ops();
  register_scatter_ops();
  register_linalg_ops();
  register_matrix_functions();
  register_nn_ops();
  register_pool_ops();
  register_conv_ops();
  register_embedding_bag_ops();
  register_collective_ops();
}
}  // namespace

void ensure_ops_registered() {
  // Function-local and constant-initialized, so this works from any static initializer too.
  // std::call_once orders every caller after the registration (no data race on the table); the
  // flag spares later callers its cost (it sets thread-locals and calls into libc each time).
  static std::once_flag once;
  static std::atomic<bool> done{false};  // atomic: set after the registration completed
  if (done.load(std::memory_order_acquire)) return;
  std::call_once(once, register_lib_ops);
  done.store(true, std::memory_order_release);
}

// Writes the table without completing registration first: the families call it from inside
// ensure_ops_registered, and the upper layers (exec/init.cpp) during their one-time initialization.
const OpDef& register_op(OpDef def) {
  auto& t = storage();
  KILN_CHECK(!t.contains(def.name), "op '", def.name, "' is defined twice");
  auto entry = std::make_unique<OpDef>(std::move(def));
  const OpDef& ref = *entry;
  t.emplace(ref.name, std::move(entry));
  return ref;
}

const OpDef* find_op(std::string_view name) {
  const auto& t = registered_table();
  auto it = t.find(std::string(name));
  return it == t.end() ? nullptr : it->second.get();
}

std::vector<const OpDef*> all_ops() {
  std::vector<const OpDef*> out;
  for (const auto& [name, def] : registered_table()) out.push_back(def.get());
  return out;
}

}  // namespace kiln::detail

namespace kiln::detail {

AttrValue scalar_attr(const Scalar& s) {
  if (s.is_bool()) return s.to<bool>();
  if (s.is_integral()) return s.to_int();
  return s.to_double();
}

Scalar attr_scalar(const AttrValue& a) {
  if (auto* b = std::get_if<bool>(&a)) return Scalar(*b);
  if (auto* i = std::get_if<int64_t>(&a)) return Scalar(*i);
  return Scalar(std::get<double>(a));
}

int64_t attr_int(const AttrValue& a) {
  KILN_CHECK(std::holds_alternative<int64_t>(a), "attribute ", attr_str(a), " is not an integer");
  return std::get<int64_t>(a);
}

double attr_double(const AttrValue& a) {
  if (auto* i = std::get_if<int64_t>(&a)) return static_cast<double>(*i);
  if (auto* b = std::get_if<bool>(&a)) return *b ? 1.0 : 0.0;
  KILN_CHECK(std::holds_alternative<double>(a), "attribute ", attr_str(a), " is not a number");
  return std::get<double>(a);
}

bool attr_bool(const AttrValue& a) {
  KILN_CHECK(std::holds_alternative<bool>(a), "attribute ", attr_str(a), " is not a bool");
  return std::get<bool>(a);
}

const std::string& attr_string(const AttrValue& a) {
  KILN_CHECK(std::holds_alternative<std::string>(a), "attribute ", attr_str(a), " is not a string");
  return std::get<std::string>(a);
}

const std::vector<int64_t>& attr_ints(const AttrValue& a) {
  KILN_CHECK(std::holds_alternative<std::vector<int64_t>>(a), "attribute ", attr_str(a),
             " is not a list of integers");
  return std::get<std::vector<int64_t>>(a);
}

DType attr_dtype(const AttrValue& a) {
  KILN_CHECK(std::holds_alternative<DType>(a), "attribute ", attr_str(a), " is not a dtype");
  return std::get<DType>(a);
}

std::optional<int64_t> attr_optional_int(const AttrValue& a) {
  if (std::holds_alternative<std::monostate>(a)) return std::nullopt;
  return attr_int(a);
}

std::optional<DType> attr_optional_dtype(const AttrValue& a) {
  if (std::holds_alternative<std::monostate>(a)) return std::nullopt;
  return attr_dtype(a);
}

std::string attr_str(const AttrValue& a) {
  std::ostringstream os;
  std::visit(
      [&os](const auto& v) {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::monostate>) {
          os << "none";
        } else if constexpr (std::is_same_v<V, bool>) {
          os << (v ? "true" : "false");
        } else if constexpr (std::is_same_v<V, double>) {
          // Round-trips exactly, and always reads as a float (1.0, not 1).
          std::ostringstream num;
          num << std::setprecision(17) << v;
          std::string text = num.str();
          if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
          os << text;
        } else if constexpr (std::is_same_v<V, std::string>) {
          os << '"' << v << '"';
        } else if constexpr (std::is_same_v<V, std::vector<int64_t>>) {
          os << '[';
          for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
          os << ']';
        } else {
          os << v;
        }
      },
      a);
  return os.str();
}

}  // namespace kiln::detail
