// The graph file format: writer, and a reader that bounds-checks every field it reads.
#include "jit/serialize.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "jit/address_map.h"
#include "jit/passes/rewriter.h"
#include "jit/wire.h"
#include "kiln/error.h"
#include "kiln/kiln.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'G', 'R', 'P', 'H'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderSize = 32;
// Smallest encodings, used to reject counts the remaining bytes cannot hold before allocating.
constexpr uint64_t kMinTypeBytes = 1 + 1 + 4 + 1 + 4;
constexpr uint64_t kMinNodeBytes = 4 + 4 + 4 + 4 + 1;

uint64_t read_le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

void write_le(char* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<char>(static_cast<unsigned char>(v >> (8 * i)));
}

// Fills in the header's payload length and checksum from the payload after it.
void seal_payload(std::string& bytes) {
  uint64_t len = bytes.size() - kHeaderSize;
  write_le(&bytes[16], len, 8);
  write_le(&bytes[24], XXH3_64bits(bytes.data() + kHeaderSize, len), 8);
}

// Product of sizes (empty dims counted as 1, as strides are), or false on a negative size or
// overflow.
bool checked_extent(const Shape& sizes, int64_t* numel) {
  int64_t n = 1, extent = 1;
  for (int64_t s : sizes) {
    if (s < 0) return false;
    if (__builtin_mul_overflow(extent, std::max<int64_t>(s, 1), &extent)) return false;
    n = s == 0 ? 0 : n * s;  // n <= extent, so no overflow
  }
  *numel = n;
  return true;
}

// ------------------------------------------------------------------------------------------ writer
// Appends to a string grown geometrically: most writes are a few bytes, too small for
// std::string::append's out-of-line path to pay off.
class BufferOut {
 public:
  explicit BufferOut(size_t reserved) : buf_(reserved, '\0'), used_(reserved) {}
  void write(const void* data, size_t n) {
    if (n > buf_.size() - used_) buf_.resize(std::max(2 * buf_.size(), used_ + n));
    std::memcpy(&buf_[used_], data, n);
    used_ += n;
  }
  size_t size() const { return used_; }
  char* at(size_t offset) { return &buf_[offset]; }
  std::string take() {
    buf_.resize(used_);
    return std::move(buf_);
  }

 private:
  std::string buf_;
  size_t used_;
};

class Writer {
 public:
  explicit Writer(std::string where) : where_(std::move(where)) {}

  std::string finish(const Graph& g, const std::vector<Tensor>& constants,
                     const std::string& metadata) {
    write_graphs(g);
    write_constants(constants);
    wire::put_u64(out_, metadata.size());
    out_.write(metadata.data(), metadata.size());
    std::string bytes = out_.take();
    std::memcpy(&bytes[0], kMagic, 8);
    write_le(&bytes[8], kFormatVersion, 4);
    write_le(&bytes[12], 0, 4);
    seal_payload(bytes);
    return bytes;
  }

 private:
  struct Frame {
    const Graph* g;
    const Node* next;
    size_t count_at;  // where the node count goes, once known
    uint64_t count;
  };

  void begin_graph(const Graph* g) {
    set_open(g, true);
    index_.reserve(g->size());
    wire::put_count(out_, g->inputs().size());
    for (const Value* v : g->inputs()) {
      KILN_CHECK(v && v->node()->is_input() && v->node()->owning_graph() == g, where_,
                 ": a graph input is not an input node of its graph");
      wire::put_type(out_, v->type());
      define(v);
    }
    stack_.push_back({g, g->first(), out_.size(), 0});
    wire::put_u64(out_, 0);
  }

  void define(const Value* v) {
    bool inserted;
    *index_.find_or_insert(v, 0, &inserted) = ++defined_;
  }

  uint64_t ref(const Value* v, const Graph* current, const char* what) {
    if (!v) return 0;
    const uint64_t* index = index_.find(v);
    const Graph* owner = v->node()->owning_graph();
    KILN_CHECK(index && (owner == current || is_open(owner)), where_, ": ", what, " refers to %",
               v->id(), ", which is not defined before it in an enclosing graph");
    return *index;
  }

  // Nodes in list order; a subgraph's block follows its node, through an explicit stack.
  void write_graphs(const Graph& root) {
    begin_graph(&root);
    while (!stack_.empty()) {
      Frame& f = stack_.back();
      const Graph* g = f.g;
      if (!f.next) {
        write_le(out_.at(f.count_at), f.count, 8);
        wire::put_count(out_, g->outputs().size());
        for (const Value* v : g->outputs()) {
          KILN_CHECK(v, where_, ": a graph output is null");
          wire::put_u64(out_, ref(v, g, "a graph output"));
        }
        set_open(g, false);
        stack_.pop_back();
        continue;
      }
      const Node* n = f.next;
      f.next = n->next();
      if (n->is_input()) continue;
      ++f.count;
      wire::put_string(out_, n->kind());
      wire::put_attrs(out_, n->attrs());
      wire::put_count(out_, n->num_inputs());
      for (const Value* in : n->inputs()) wire::put_u64(out_, ref(in, g, n->kind().c_str()));
      wire::put_count(out_, n->num_outputs());
      for (const auto& v : n->outputs()) {
        wire::put_type(out_, v->type());
        define(v.get());
      }
      wire::put_u8(out_, n->subgraph() ? 1 : 0);
      if (n->subgraph()) begin_graph(n->subgraph());  // invalidates f
    }
  }

  void write_constants(const std::vector<Tensor>& constants) {
    wire::put_count(out_, constants.size());
    for (const Tensor& t : constants) {
      if (!t.defined()) {
        wire::put_u8(out_, 0);
        continue;
      }
      Tensor c = t.device().is_cpu() ? t : t.to(kCPU);
      c = c.contiguous();
      wire::put_u8(out_, 1);
      wire::put_u8(out_, wire::dtype_code(t.dtype()));
      wire::put_u8(out_, wire::device_code(t.device().type));
      wire::put_u32(out_, static_cast<uint32_t>(t.device().index));
      wire::put_count(out_, c.sizes().size());
      for (int64_t s : c.sizes()) wire::put_i64(out_, s);
      uint64_t nbytes = static_cast<uint64_t>(c.numel()) * c.element_size();
      wire::put_u64(out_, nbytes);
      if (nbytes) out_.write(c.raw_data_ptr(), nbytes);
    }
  }

  std::string where_;
  BufferOut out_{kHeaderSize};
  std::vector<Frame> stack_;
  AddressMap<uint64_t> index_;  // value -> 1-based number, in definition order
  AddressMap<bool> open_;       // graph -> being written (its values are visible)
  void set_open(const Graph* g, bool open) {
    bool inserted;
    *open_.find_or_insert(g, open, &inserted) = open;
  }
  bool is_open(const Graph* g) const {
    const bool* open = open_.find(g);
    return open && *open;
  }
  uint64_t defined_ = 0;
};

// ------------------------------------------------------------------------------------------ reader
class Reader {
 public:
  Reader(const std::string& bytes, const std::string& source) : source_(source) {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
    set_context("header");
    if (bytes.size() < kHeaderSize)
      fail_header("truncated at byte ", bytes.size(), " (reading the ", kHeaderSize,
                  "-byte header)");
    if (std::memcmp(p, kMagic, 8) != 0) fail_header("not a kiln graph file (bad magic)");
    uint32_t version = static_cast<uint32_t>(read_le(p + 8, 4));
    if (version != kFormatVersion)
      fail_header("unsupported format version ", version, " (this build reads version ",
                  kFormatVersion, ")");
    uint32_t flags = static_cast<uint32_t>(read_le(p + 12, 4));
    if (flags != 0) fail_header("unsupported header flags ", flags, " (at byte 12)");
    uint64_t len = read_le(p + 16, 8);
    uint64_t have = bytes.size() - kHeaderSize;
    if (len > have)
      fail_header("truncated at byte ", bytes.size(), " (the header announces ", len,
                  " payload bytes, ", have, " follow)");
    if (len < have)
      fail_header("trailing data at byte ", kHeaderSize + len, " after the ", len,
                  "-byte payload (", have - len, " extra bytes)");
    if (XXH3_64bits(p + kHeaderSize, len) != read_le(p + 24, 8))
      fail_header("checksum mismatch: the file is corrupted");
    data_ = p + kHeaderSize;
    size_ = len;
  }

  LoadedGraph read() {
    LoadedGraph out;
    out.graph = read_graphs();
    read_constants(out.constants);
    set_context("metadata");
    uint64_t len = u64();
    need(len);
    out.metadata.assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    set_context("end of payload");
    if (pos_ != size_) fail("unexpected data after the metadata");
    try {
      out.graph->verify();
    } catch (const std::exception& e) {
      fail_header("the loaded graph is invalid: ", e.what());
    }
    return out;
  }

 private:
  // -------------------------------------------------------------------------------- primitives
  void set_context(const char* what, int64_t item = -1, const char* part = nullptr) {
    what_ = what;
    item_ = item;
    part_ = part;
  }
  std::string context() const {
    std::string s = "reading ";
    s += what_;
    if (item_ >= 0) s += " " + std::to_string(item_);
    if (part_) s += std::string(" ") + part_;
    return s;
  }
  template <typename... Args>
  [[noreturn]] void fail_header(const Args&... args) const {
    KILN_FAIL("kiln::jit::load: ", source_, ": ", args...);
  }
  // A problem with the field just read (at the current position).
  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    KILN_FAIL("kiln::jit::load: ", source_, ": ", args..., " at byte ", kHeaderSize + pos_, " (",
              context(), ")");
  }
  uint64_t remaining() const { return size_ - pos_; }
  void need(uint64_t n) const {
    if (n > remaining())
      KILN_FAIL("kiln::jit::load: ", source_, ": truncated at byte ", kHeaderSize + size_, " (",
                context(), ": ", n, " bytes needed at byte ", kHeaderSize + pos_, ")");
  }
  uint64_t le(int n) {
    need(static_cast<uint64_t>(n));
    uint64_t v = read_le(data_ + pos_, n);
    pos_ += static_cast<uint64_t>(n);
    return v;
  }
  uint8_t u8() { return static_cast<uint8_t>(le(1)); }
  uint32_t u32() { return static_cast<uint32_t>(le(4)); }
  uint64_t u64() { return le(8); }
  int64_t i64() { return static_cast<int64_t>(le(8)); }
  bool flag() {
    uint8_t b = u8();
    if (b > 1) fail("bad boolean byte ", int(b));
    return b == 1;
  }
  // A count of items of at least `min_bytes` each: checked against the bytes left, so that a
  // corrupt count can never make us reserve more than the file could describe.
  uint64_t count(uint64_t min_bytes, uint64_t n) {
    if (n > remaining() / min_bytes)
      KILN_FAIL("kiln::jit::load: ", source_, ": truncated at byte ", kHeaderSize + size_, " (",
                context(), ": a count of ", n, " at byte ", kHeaderSize + pos_,
                " cannot fit in the ", remaining(), " bytes left)");
    return n;
  }
  uint64_t count32(uint64_t min_bytes) { return count(min_bytes, u32()); }
  std::string string() {
    uint64_t len = u32();
    need(len);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return s;
  }
  DType dtype() {
    uint8_t code = u8();
    DType t;
    if (!wire::dtype_from_code(code, &t)) fail("bad dtype tag ", int(code));
    return t;
  }
  Device device() {
    uint8_t code = u8();
    DeviceType type;
    if (!wire::device_from_code(code, &type)) fail("bad device type tag ", int(code));
    uint32_t index = u32();
    if (type == DeviceType::CPU ? index != 0 : index > 1023) fail("bad device index ", index);
    return Device(type, static_cast<int>(index));
  }
  Shape sizes(int64_t* numel) {
    Shape s(count32(8));
    for (int64_t& x : s) {
      x = i64();
      if (x < 0) fail("negative size ", x);
    }
    if (!checked_extent(s, numel)) fail("the sizes ", detail::shape_str(s), " overflow");
    return s;
  }
  ValueType type() {
    ValueType t;
    t.dtype = dtype();
    t.device = device();
    t.wrapped_number = flag();
    int64_t numel;
    t.sizes = sizes(&numel);
    return t;
  }
  AttrValue attr() {
    uint8_t tag = u8();
    switch (tag) {
      case wire::kAttrNone:
        return std::monostate{};
      case wire::kAttrBool:
        return flag();
      case wire::kAttrInt:
        return i64();
      case wire::kAttrDouble: {
        uint64_t bits = u64();
        double d;
        std::memcpy(&d, &bits, sizeof d);
        return d;
      }
      case wire::kAttrString:
        return string();
      case wire::kAttrInts: {
        std::vector<int64_t> v(count32(8));
        for (int64_t& x : v) x = i64();
        return v;
      }
      case wire::kAttrDType:
        return dtype();
      default:
        fail("attribute tag ", int(tag), " out of range (0..", wire::kNumAttrTags - 1, ")");
    }
  }

  // ------------------------------------------------------------------------------------ graphs
  struct Frame {
    Graph* g;
    std::unique_ptr<Graph> owned;  // null for the root, which the caller owns
    Node* owner;
    uint64_t nodes_left;
    uint32_t id;
  };

  void begin_graph(Graph* g, std::unique_ptr<Graph> owned, Node* owner) {
    if (graphs_ >= std::numeric_limits<uint32_t>::max()) fail("too many nested graphs");
    uint32_t id = graphs_++;
    open_.push_back(1);
    set_context("graph inputs");
    uint64_t n = count32(kMinTypeBytes);
    for (uint64_t i = 0; i < n; ++i) define(g->add_input(type()), id);
    set_context("graph node count");
    uint64_t nodes = count(kMinNodeBytes, u64());
    stack_.push_back(Frame{g, std::move(owned), owner, nodes, id});
  }

  void define(Value* v, uint32_t graph) {
    values_.push_back(v);
    scope_.push_back(graph);
  }

  Value* value_ref(bool allow_null) {
    uint64_t r = u64();
    if (r == 0) {
      if (!allow_null) fail("a graph output is absent");
      return nullptr;
    }
    if (r > values_.size())
      fail("reference to value ", r, ", but only ", values_.size(), " are defined before it");
    if (!open_[scope_[r - 1]])
      fail("reference to value ", r, ", which belongs to a subgraph that is already closed");
    return values_[r - 1];
  }

  std::unique_ptr<Graph> read_graphs() {
    auto root = std::make_unique<Graph>();
    begin_graph(root.get(), nullptr, nullptr);
    int64_t node_number = 0;
    std::vector<Value*> inputs;
    std::vector<ValueType> types;
    while (!stack_.empty()) {
      Frame& f = stack_.back();
      if (f.nodes_left == 0) {
        set_context("graph outputs");
        uint64_t n = count32(8);
        for (uint64_t i = 0; i < n; ++i) f.g->add_output(value_ref(false));
        open_[f.id] = 0;
        if (f.owner) f.owner->set_subgraph(std::move(f.owned));
        stack_.pop_back();
        continue;
      }
      --f.nodes_left;
      int64_t k = node_number++;
      set_context("node", k, "op name");
      std::string name = string();
      const OpDef* def = detail::find_op(name);
      if (!def) fail("unknown op '", name, "'");
      if (def == &input_op()) fail("an input node among the computations");
      set_context("node", k, "attributes");
      Attrs attrs(count32(1));
      for (AttrValue& a : attrs) a = attr();
      set_context("node", k, "inputs");
      inputs.resize(count32(8));
      for (Value*& v : inputs) v = value_ref(true);
      set_context("node", k, "output types");
      types.resize(count32(kMinTypeBytes));
      for (ValueType& t : types) t = type();
      Node* n = f.g->create(*def, inputs, std::move(attrs), std::move(types));
      types.clear();
      for (const auto& v : n->outputs()) define(v.get(), f.id);
      set_context("node", k, "subgraph flag");
      if (flag()) {
        auto sub = std::make_unique<Graph>();
        Graph* g = sub.get();
        begin_graph(g, std::move(sub), n);  // invalidates f
      }
    }
    return root;
  }

  void read_constants(std::vector<Tensor>& out) {
    set_context("constant count");
    uint64_t n = count32(1);
    out.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      set_context("constant", static_cast<int64_t>(i));
      if (!flag()) {
        out.emplace_back();
        continue;
      }
      DType dt = dtype();
      Device dev = device();
      int64_t numel;
      Shape shape = sizes(&numel);
      uint64_t nbytes = u64();
      uint64_t expect;
      if (__builtin_mul_overflow(static_cast<uint64_t>(numel), element_size(dt), &expect) ||
          nbytes != expect)
        fail("data of ", nbytes, " bytes for ", dtype_name(dt), detail::shape_str(shape));
      set_context("constant", static_cast<int64_t>(i), "data");
      need(nbytes);
      Tensor t = kiln::empty(shape, dt);
      if (nbytes) std::memcpy(t.raw_data_ptr(), data_ + pos_, nbytes);
      pos_ += nbytes;
      if (dev.is_cuda() && cuda::is_available() && dev.index < cuda::device_count()) t = t.to(dev);
      out.push_back(std::move(t));
    }
  }

  const std::string& source_;
  const unsigned char* data_ = nullptr;  // the payload
  uint64_t size_ = 0;
  uint64_t pos_ = 0;
  const char* what_ = "";
  int64_t item_ = -1;
  const char* part_ = nullptr;

  std::vector<Frame> stack_;
  std::vector<Value*> values_;   // every value defined so far, in order
  std::vector<uint32_t> scope_;  // the graph each value belongs to
  std::vector<uint8_t> open_;    // per graph: still being read (its values are visible)
  uint32_t graphs_ = 0;
};

}  // namespace

std::string serialize_graph(const Graph& g, const std::vector<Tensor>& constants,
                            const std::string& metadata) {
  return Writer("kiln::jit::serialize").finish(g, constants, metadata);
}

void save_graph(const std::string& path, const Graph& g, const std::vector<Tensor>& constants,
                const std::string& metadata) {
  // A collective names its process group by a number of this process (lib/distributed): another
  // process could not run it against the same ranks.
  for (const Node* n = g.first(); n; n = n->next())
    KILN_CHECK(n->is_input() || !passes::has_side_effects(n->op()), "kiln::jit::save: ", path,
               ": the graph runs a collective (", n->kind(),
               ") over a process group of this process, which a file cannot name");
  std::string bytes = Writer("kiln::jit::save: " + path).finish(g, constants, metadata);
  static std::atomic<uint64_t> counter{0};
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (f) f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (f) f.flush();
    if (!f) {
      int err = errno;
      f.close();
      std::remove(tmp.c_str());
      KILN_FAIL("kiln::jit::save: ", path, ": cannot write ", tmp, ": ", std::strerror(err));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    KILN_FAIL("kiln::jit::save: ", path, ": cannot rename ", tmp,
              " into place: ", std::strerror(err));
  }
}

LoadedGraph deserialize_graph(const std::string& bytes, const std::string& source_name) {
  return Reader(bytes, source_name).read();
}

LoadedGraph load_graph(const std::string& path) {
  // A directory opens as a stream of unknown size: check what the path is first.
  std::error_code ec;
  auto type = std::filesystem::status(path, ec).type();
  KILN_CHECK(type != std::filesystem::file_type::not_found, "kiln::jit::load: ", path,
             ": cannot open: no such file");
  KILN_CHECK(!ec, "kiln::jit::load: ", path, ": cannot open: ", ec.message());
  KILN_CHECK(type == std::filesystem::file_type::regular, "kiln::jit::load: ", path,
             ": cannot open: not a regular file");
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  KILN_CHECK(f, "kiln::jit::load: ", path, ": cannot open: ", std::strerror(errno));
  std::streamoff size = f.tellg();
  KILN_CHECK(size >= 0, "kiln::jit::load: ", path, ": cannot read its size");
  std::string bytes(static_cast<size_t>(size), '\0');
  f.seekg(0);
  f.read(&bytes[0], size);
  KILN_CHECK(f && f.gcount() == size, "kiln::jit::load: ", path, ": read error");
  return deserialize_graph(bytes, path);
}

void reseal_for_testing(std::string& bytes) {
  KILN_CHECK(bytes.size() >= kHeaderSize, "reseal_for_testing: shorter than the header");
  seal_payload(bytes);
}

}  // namespace kiln::jit
