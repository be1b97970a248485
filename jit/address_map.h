// A map from IR object addresses to small values, for the per-node look-ups of whole-graph walks.
//
// Open addressing with linear probing over (key, value) pairs: one cache miss per probe where a
// general-purpose map costs two, and neighbouring addresses land in neighbouring slots, so nodes
// created one after another (and usually visited one after another) are found almost in order.
// Addresses only place entries: nothing derived from this table's layout may reach a hash or a
// file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::jit {

template <typename V>
class AddressMap {
 public:
  // Makes room for `n` more entries; value pointers stay valid while at most that many are added.
  void reserve(size_t n) {
    size_t want = 2 * (size_ + n);
    if (want <= table_.size()) return;
    size_t cap = 64;
    while (cap < want) cap *= 2;
    std::vector<Entry> old(cap);
    old.swap(table_);
    mask_ = cap - 1;
    for (const Entry& e : old)
      if (e.key) *probe(e.key) = e;
  }

  // The value of `key`, inserted as `init` when absent (then *inserted is true).
  V* find_or_insert(const void* key, const V& init, bool* inserted) {
    if (table_.empty()) reserve(1);
    Entry* e = probe(key);
    *inserted = !e->key;
    if (e->key) return &e->value;
    if (2 * (size_ + 1) > table_.size()) {  // only past what reserve() made room for
      reserve(1);
      e = probe(key);
    }
    e->key = key;
    e->value = init;
    ++size_;
    return &e->value;
  }

  const V* find(const void* key) const {
    if (table_.empty()) return nullptr;
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      const Entry& e = table_[i];
      if (e.key == key) return &e.value;
      if (!e.key) return nullptr;
    }
  }

  size_t size() const { return size_; }

 private:
  struct Entry {
    const void* key = nullptr;
    V value{};
  };
  size_t slot(const void* key) const {
    auto x = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(key));
    return static_cast<size_t>((x >> 4) ^ (x >> 26)) & mask_;
  }
  Entry* probe(const void* key) {
    for (size_t i = slot(key);; i = (i + 1) & mask_)
      if (table_[i].key == key || !table_[i].key) return &table_[i];
  }

  std::vector<Entry> table_;
  size_t size_ = 0;
  size_t mask_ = 0;
};

}  // namespace kiln::jit
