// The JIT's intermediate representation: a Graph of Nodes in topological order, each naming an op
// of the op table with its attributes, consuming and producing typed SSA Values.
//
// Every algorithm over a Graph is iterative (explicit stacks and worklists, never recursion) and
// linear in its size, so that a graph of millions of nodes runs with the default stack.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "kiln/device.h"
#include "kiln/dtype.h"
#include "kiln/tensor.h"
#include "lib/op_table.h"

namespace kiln::jit {

using detail::Attrs;
using detail::AttrValue;
using detail::OpDef;

// What is known of a value without running anything.
struct ValueType {
  DType dtype = kFloat32;
  Shape sizes;
  Device device = kCPU;
  // A 0-dim value made from a C++ number: lowest priority in type promotion (see result_type).
  bool wrapped_number = false;

  bool operator==(const ValueType& o) const {
    return dtype == o.dtype && sizes == o.sizes && device == o.device &&
           wrapped_number == o.wrapped_number;
  }
  bool operator!=(const ValueType& o) const { return !(*this == o); }
  std::string str() const;  // "f32[64, 1500]", "f64[]", "i64[3]" (+ "@cuda:0" off the CPU)
};

ValueType type_of(const Tensor& t);

class Node;
class Graph;

struct Use {
  Node* user;
  size_t index;  // which input of user
  bool operator==(const Use& o) const { return user == o.user && index == o.index; }
};

class Value {
 public:
  Node* node() const { return node_; }
  size_t index() const { return index_; }  // which output of node()
  const ValueType& type() const { return type_; }
  void set_type(ValueType t) { type_ = std::move(t); }
  // Unique within the graph; the printer's %id. Not part of any hash.
  int64_t id() const { return id_; }
  const std::vector<Use>& uses() const { return uses_; }
  bool has_uses() const { return !uses_.empty(); }
  // Rewires every use (including graph outputs) to `other`.
  void replace_all_uses_with(Value* other);

 private:
  friend class Node;
  friend class Graph;
  Value(Node* node, size_t index, ValueType type, int64_t id)
      : node_(node), index_(index), type_(std::move(type)), id_(id) {}
  Node* node_;
  size_t index_;
  ValueType type_;
  int64_t id_;
  std::vector<Use> uses_;
  int64_t output_uses_ = 0;  // times it appears among the graph's outputs
};

class Node {
 public:
  const OpDef& op() const { return *op_; }
  const std::string& kind() const { return op_->name; }
  const Attrs& attrs() const { return attrs_; }
  const AttrValue& attr(size_t i) const { return attrs_.at(i); }
  void set_attrs(Attrs attrs) { attrs_ = std::move(attrs); }
  // Inputs may be null: an absent optional tensor (layer_norm without weight).
  const std::vector<Value*>& inputs() const { return inputs_; }
  Value* input(size_t i) const { return inputs_.at(i); }
  size_t num_inputs() const { return inputs_.size(); }
  const std::vector<std::unique_ptr<Value>>& outputs() const { return outputs_; }
  Value* output(size_t i = 0) const { return outputs_.at(i).get(); }
  size_t num_outputs() const { return outputs_.size(); }
  void replace_input(size_t i, Value* v);
  Graph* owning_graph() const { return graph_; }
  Node* next() const { return next_; }
  Node* prev() const { return prev_; }
  // Position in the graph's order: increases along it (gaps allowed); valid after
  // Graph::renumber() and kept valid by insertions (which renumber when they run out of gaps).
  int64_t position() const { return position_; }
  // For fusion groups (#5): the nodes of the group; printed as a nested block.
  Graph* subgraph() const { return subgraph_.get(); }
  void set_subgraph(std::unique_ptr<Graph> g);

  // For the graph-input and constant nodes: which input, or what value.
  bool is_input() const;
  bool is_constant() const;

 private:
  friend class Graph;
  friend class Value;
  Node(Graph* graph, const OpDef* op, Attrs attrs);
  ~Node();
  Graph* graph_;
  const OpDef* op_;
  Attrs attrs_;
  std::vector<Value*> inputs_;
  std::vector<std::unique_ptr<Value>> outputs_;
  Node* prev_ = nullptr;
  Node* next_ = nullptr;
  int64_t position_ = 0;
  std::unique_ptr<Graph> subgraph_;
};

// A graph owns its nodes, kept in one list in topological order: graph inputs first (nodes of
// op "input", attribute: the input's index), then constants and computations. Graph outputs are
// a list of values; they count as uses for dead-code elimination but are not Use entries.
class Graph {
 public:
  Graph();
  ~Graph();  // iterative
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // A new graph input (appended after the existing ones).
  Value* add_input(ValueType type);
  const std::vector<Value*>& inputs() const { return inputs_; }
  // A constant scalar: op "constant" with attributes [value, dtype]; its type is a 0-dim
  // wrapped number of that dtype unless `wrapped` is false.
  Value* constant(const detail::AttrValue& value, DType dtype, bool wrapped = true,
                  Node* before = nullptr);

  // Creates a node and inserts it before `before` (at the end when null). Output types are given
  // by the caller: recording knows them, and passes derive them from the node they replace.
  Node* create(const OpDef& op, const std::vector<Value*>& inputs, Attrs attrs,
               std::vector<ValueType> output_types, Node* before = nullptr);
  Node* create(const std::string& op, const std::vector<Value*>& inputs, Attrs attrs,
               std::vector<ValueType> output_types, Node* before = nullptr);
  // Removes a node whose outputs have no uses and are not graph outputs.
  void destroy(Node* node);
  // Moves `node` to just before `before`.
  void move_before(Node* node, Node* before);

  void add_output(Value* v) {
    outputs_.push_back(v);
    ++v->output_uses_;
  }
  const std::vector<Value*>& outputs() const { return outputs_; }
  void set_output(size_t i, Value* v) {
    --outputs_.at(i)->output_uses_;
    outputs_[i] = v;
    ++v->output_uses_;
  }
  void clear_outputs() {
    for (Value* v : outputs_) --v->output_uses_;
    outputs_.clear();
  }
  bool is_output(const Value* v) const { return v->output_uses_ > 0; }

  Node* first() const { return first_; }
  Node* last() const { return last_; }
  size_t size() const { return size_; }  // number of nodes
  // The nodes in order; a snapshot, so callers may destroy nodes while walking it.
  std::vector<Node*> nodes() const;
  void renumber();  // positions 0, kGap, 2*kGap, ...

  // Checks SSA (every input defined earlier in the order, by a node of this graph), use lists,
  // output types against the op's type inference where one is registered, and that inputs and
  // constants precede their uses. Throws kiln::Error describing the first violation.
  void verify() const;

  // One line per node, like "%7 : f32[64, 1500] = mul(%3, %5)"; subgraphs as indented blocks.
  std::string str() const;
  void print(std::ostream& os) const;

  // KILN_DUMP's numbering of this graph (jit/dump.cpp): its id in the file names (-1 until its
  // first file) and how many files of it were written. Metadata only: no pass or hash reads it.
  struct DumpInfo {
    int64_t id = -1;
    int steps = 0;
  };
  DumpInfo& dump_info() const { return dump_info_; }

 private:
  friend class Node;
  friend class Value;
  mutable DumpInfo dump_info_;
  void link_before(Node* node, Node* before);
  void unlink(Node* node);
  int64_t next_value_id_ = 0;
  Node* first_ = nullptr;
  Node* last_ = nullptr;
  size_t size_ = 0;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
};

std::ostream& operator<<(std::ostream& os, const Graph& g);

// The op of a graph input / scalar constant node.
const OpDef& input_op();
const OpDef& constant_op();

}  // namespace kiln::jit
