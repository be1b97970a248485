// StateDict: named tensors in insertion order, as torch's OrderedDict[str, Tensor] that
// state_dict() returns. Modules and optimizers produce and consume it; kiln::save and kiln::load
// (kiln/serialize.h) write and read it as a safetensors file.
#pragma once

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln {

class StateDict {
 public:
  using Item = std::pair<std::string, Tensor>;

  // Adds `key`, or replaces its tensor (keeping its position) when it is already there.
  void insert(const std::string& key, Tensor value) {
    auto [it, added] = index_.emplace(key, items_.size());
    if (added)
      items_.emplace_back(key, std::move(value));
    else
      items_[it->second].second = std::move(value);
  }
  bool contains(const std::string& key) const { return index_.count(key) != 0; }
  const Tensor& at(const std::string& key) const {
    auto it = index_.find(key);
    KILN_CHECK(it != index_.end(), "StateDict: no entry named '", key, "'");
    return items_[it->second].second;
  }
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  std::vector<Item>::const_iterator begin() const { return items_.begin(); }
  std::vector<Item>::const_iterator end() const { return items_.end(); }
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    for (const Item& item : items_) out.push_back(item.first);
    return out;
  }

 private:
  std::vector<Item> items_;
  std::unordered_map<std::string, size_t> index_;
};

// What a non-strict load_state_dict left out, as torch's _IncompatibleKeys: the module's names
// the dict lacks, and the dict's names the module lacks. A strict load raises kiln::Error instead.
struct LoadStateDictResult {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

}  // namespace kiln
