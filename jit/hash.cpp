// The structural graph hash: canonical numbering of live nodes, sorted keys for dead nodes.
#include "jit/hash.h"

#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <vector>

#include "jit/address_map.h"
#include "jit/wire.h"
#include "kiln/error.h"

namespace kiln::jit {

std::string GraphHash::hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016" PRIx64 "%016" PRIx64, hi, lo);
  return buf;
}

namespace {

// Bumped whenever the canonical byte form changes, so old cache keys can never match new ones.
constexpr uint32_t kHashFormat = 1;

// Operand reference tags in the canonical form.
enum RefTag : uint8_t {
  kRefNull = 0,
  kRefLive = 1,       // canonical number of a live node of the same graph
  kRefDead = 2,       // key of a dead node of the same graph
  kRefOuterLive = 3,  // live node of an enclosing graph: levels up, canonical number
  kRefOuterDead = 4,  // dead node of an enclosing graph: levels up only
  kRefUndefined = 5,  // a node of this graph not defined before its use (not a valid graph)
  kRefForeign = 6,    // a node of no enclosing graph (not a valid graph)
};

GraphHash to_hash(XXH128_hash_t h) {
  return GraphHash{h.low64, h.high64};
}

// A buffered front to an XXH3-128 streaming state: most writes are a few bytes.
class HashOut {
 public:
  HashOut() : state_(XXH3_createState()) { KILN_CHECK(state_, "graph_hash: out of memory"); }
  ~HashOut() { XXH3_freeState(state_); }
  HashOut(const HashOut&) = delete;
  HashOut& operator=(const HashOut&) = delete;

  void reset() {
    XXH3_128bits_reset(state_);
    used_ = 0;
  }
  void write(const void* data, size_t n) {
    if (n > sizeof(buf_) - used_) flush();
    if (n >= sizeof(buf_)) {
      XXH3_128bits_update(state_, data, n);
      return;
    }
    std::memcpy(buf_ + used_, data, n);
    used_ += n;
  }
  GraphHash digest() {
    flush();
    return to_hash(XXH3_128bits_digest(state_));
  }

 private:
  void flush() {
    if (used_) XXH3_128bits_update(state_, buf_, used_);
    used_ = 0;
  }
  XXH3_state_t* state_;
  unsigned char buf_[4096];
  size_t used_ = 0;
};

constexpr uint64_t kVisiting = ~uint64_t(0);

struct Frame {
  Frame(const Graph* graph, const Node* owner_node, uint32_t d)
      : g(graph), owner(owner_node), depth(d) {}
  const Graph* g;
  const Node* owner;  // the node whose subgraph this is; null for the root
  uint32_t depth;
  bool labeled = false;
  std::vector<const Node*> live;  // in canonical order
  // Per input of each live node, in order: the producer's canonical number when it is a live node
  // of this graph (read while it is still in cache), else kVisiting.
  std::vector<uint64_t> operand_labels;
  std::vector<const Node*> dead;  // nodes that reach no output, in list order
  // Nodes whose subgraphs are hashed before this graph: the live ones (in canonical order), then
  // the dead ones (in list order); and their digests, in the same order.
  std::vector<const Node*> with_sub;
  size_t live_with_sub = 0;
  std::vector<GraphHash> sub_digests;
  size_t next_child = 0;
};

class Hasher {
 public:
  GraphHash run(const Graph& root) {
    std::vector<Frame> stack;
    stack.emplace_back(&root, nullptr, 0);
    set_depth(&root, 0);
    GraphHash result;
    while (!stack.empty()) {
      Frame& f = stack.back();
      if (!f.labeled) {
        label(f);
        f.labeled = true;
      }
      if (f.next_child < f.with_sub.size()) {
        const Node* owner = f.with_sub[f.next_child++];
        uint32_t depth = f.depth + 1;
        set_depth(owner->subgraph(), depth);
        stack.emplace_back(owner->subgraph(), owner, depth);  // invalidates f
        continue;
      }
      GraphHash d = digest(f);
      set_depth(f.g, kClosed);
      const Node* owner = f.owner;
      stack.pop_back();
      if (owner)
        stack.back().sub_digests.push_back(d);  // children finish in with_sub order
      else
        result = d;
    }
    return result;
  }

 private:
  // Inputs first by index, then a post-order walk from the outputs in order: a node's number
  // depends only on the structure, never on the list order or on pointers.
  void label(Frame& f) {
    const Graph* g = f.g;
    label_.reserve(g->size());
    bool inserted;
    for (const Value* v : g->inputs()) {
      if (!v || v->node()->owning_graph() != g) continue;
      uint64_t* slot = label_.find_or_insert(v->node(), kVisiting, &inserted);
      if (!inserted) continue;
      *slot = f.live.size();
      f.live.push_back(v->node());
      f.operand_labels.resize(f.operand_labels.size() + v->node()->num_inputs(), kVisiting);
      if (v->node()->subgraph()) f.with_sub.push_back(v->node());
    }
    struct Step {
      const Node* n;
      size_t next;
      uint64_t* slot;
    };
    std::vector<Step> dfs;
    for (const Value* out : g->outputs()) {
      if (!out || out->node()->owning_graph() != g) continue;
      uint64_t* slot = label_.find_or_insert(out->node(), kVisiting, &inserted);
      if (!inserted) continue;
      dfs.push_back({out->node(), 0, slot});
      while (!dfs.empty()) {
        Step& top = dfs.back();
        if (top.next < top.n->num_inputs()) {
          const Value* in = top.n->input(top.next++);
          if (!in || in->node()->owning_graph() != g) continue;
          uint64_t* in_slot = label_.find_or_insert(in->node(), kVisiting, &inserted);
          if (inserted) dfs.push_back({in->node(), 0, in_slot});  // invalidates top
          continue;
        }
        for (const Value* in : top.n->inputs()) {
          const uint64_t* l =
              in && in->node()->owning_graph() == g ? find_label(in->node()) : nullptr;
          f.operand_labels.push_back(l ? *l : kVisiting);
        }
        *top.slot = f.live.size();
        f.live.push_back(top.n);
        if (top.n->subgraph()) f.with_sub.push_back(top.n);
        dfs.pop_back();
      }
    }
    f.live_with_sub = f.with_sub.size();
    // The whole list is walked only when some nodes were not reached.
    if (f.live.size() == g->size()) return;
    for (const Node* n = g->first(); n; n = n->next()) {
      if (find_label(n)) continue;
      f.dead.push_back(n);
      if (n->subgraph()) f.with_sub.push_back(n);
    }
  }

  template <typename Out>
  void put_ref(Out& out, const Value* v, const Frame& f) {
    using namespace wire;
    if (!v) {
      put_u8(out, kRefNull);
      return;
    }
    const Node* p = v->node();
    const Graph* pg = p->owning_graph();
    auto idx = static_cast<uint32_t>(v->index());
    if (pg == f.g) {
      if (const uint64_t* l = find_label(p)) {
        put_u8(out, kRefLive);
        put_u64(out, *l);
      } else if (const GraphHash* d = dead_key_.find(p)) {
        put_u8(out, kRefDead);
        put_u64(out, d->lo);
        put_u64(out, d->hi);
      } else {
        put_u8(out, kRefUndefined);
      }
      put_u32(out, idx);
      return;
    }
    const uint32_t* depth = open_depth_.find(pg);
    if (!depth || *depth == kClosed) {
      put_u8(out, kRefForeign);
      put_u32(out, idx);
      return;
    }
    const uint64_t* l = find_label(p);
    put_u8(out, l ? kRefOuterLive : kRefOuterDead);
    put_u32(out, f.depth - *depth);
    if (l) put_u64(out, *l);
    put_u32(out, idx);
  }

  // `known`, when given, holds the operand numbers recorded by label() for this node; `*sub` is
  // the digest of the next subgraph, taken when the node has one.
  template <typename Out>
  void put_node(Out& out, const Node* n, const Frame& f, const uint64_t* known,
                const GraphHash*& sub) {
    using namespace wire;
    put_string(out, n->kind());
    put_attrs(out, n->attrs());
    put_count(out, n->num_inputs());
    for (size_t i = 0; i < n->num_inputs(); ++i) {
      if (known && known[i] != kVisiting) {
        put_u8(out, kRefLive);
        put_u64(out, known[i]);
        put_u32(out, static_cast<uint32_t>(n->input(i)->index()));
      } else {
        put_ref(out, n->input(i), f);
      }
    }
    put_count(out, n->num_outputs());
    for (const auto& v : n->outputs()) put_type(out, v->type());
    if (n->subgraph()) {
      put_u8(out, 1);
      put_u64(out, sub->lo);
      put_u64(out, sub->hi);
      ++sub;
    } else {
      put_u8(out, 0);
    }
  }

  GraphHash digest(const Frame& f) {
    using namespace wire;
    // Dead nodes, in list order so that their operands' keys exist: Merkle keys that also carry
    // use counts, so sharing among dead nodes changes the multiset.
    std::vector<GraphHash> dead;
    const GraphHash* sub = f.sub_digests.data() + f.live_with_sub;
    for (const Node* n : f.dead) {
      scratch_.clear();
      StringOut s{scratch_};
      put_node(s, n, f, nullptr, sub);
      for (const auto& v : n->outputs()) put_u64(s, v->uses().size());
      GraphHash key = to_hash(XXH3_128bits(scratch_.data(), scratch_.size()));
      bool inserted;
      *dead_key_.find_or_insert(n, key, &inserted) = key;
      dead.push_back(key);
    }
    std::sort(dead.begin(), dead.end());

    out_.reset();
    put_u32(out_, kHashFormat);
    put_count(out_, f.g->inputs().size());
    put_count(out_, f.live.size());
    const uint64_t* known = f.operand_labels.data();
    sub = f.sub_digests.data();
    for (const Node* n : f.live) {
      put_node(out_, n, f, known, sub);
      known += n->num_inputs();
    }
    put_count(out_, f.g->outputs().size());
    for (const Value* v : f.g->outputs()) put_ref(out_, v, f);
    put_count(out_, dead.size());
    for (const GraphHash& k : dead) {
      put_u64(out_, k.lo);
      put_u64(out_, k.hi);
    }
    return out_.digest();
  }

  // Pointers are only keys of these look-ups; they never reach the hashed bytes.
  // Node -> canonical number (kVisiting while on the walk's stack).
  AddressMap<uint64_t> label_;
  const uint64_t* find_label(const Node* n) const {
    const uint64_t* l = label_.find(n);
    return l && *l != kVisiting ? l : nullptr;
  }
  AddressMap<GraphHash> dead_key_;
  // Graph -> nesting depth while it is being hashed (an enclosing graph), else kClosed.
  AddressMap<uint32_t> open_depth_;
  static constexpr uint32_t kClosed = ~uint32_t(0);
  void set_depth(const Graph* g, uint32_t depth) {
    bool inserted;
    *open_depth_.find_or_insert(g, depth, &inserted) = depth;
  }
  HashOut out_;
  std::string scratch_;
};

}  // namespace

GraphHash graph_hash(const Graph& g) {
  return Hasher().run(g);
}

}  // namespace kiln::jit
