// Storage and look-up for the op table.
#include "lib/op_table.h"

#include <memory>

#include "absl/container/flat_hash_map.h"
#include "kiln/error.h"

namespace kiln::detail {

namespace {
absl::flat_hash_map<std::string, std::unique_ptr<OpDef>>& table() {
  static auto* t = new absl::flat_hash_map<std::string, std::unique_ptr<OpDef>>();
  return *t;
}
}  // namespace

const OpDef& register_op(OpDef def) {
  auto& t = table();
  KILN_CHECK(!t.contains(def.name), "op '", def.name, "' is defined twice");
  auto entry = std::make_unique<OpDef>(std::move(def));
  const OpDef& ref = *entry;
  t.emplace(ref.name, std::move(entry));
  return ref;
}

const OpDef* find_op(std::string_view name) {
  auto it = table().find(std::string(name));
  return it == table().end() ? nullptr : it->second.get();
}

std::vector<const OpDef*> all_ops() {
  std::vector<const OpDef*> out;
  for (const auto& [name, def] : table()) out.push_back(def.get());
  return out;
}

}  // namespace kiln::detail
