// Lazy recording: ops record nodes into the thread's pending trace instead of running, and pending
// tensors become concrete when their data is needed.
//
// A pending tensor is a TensorImpl whose Storage carries `lazy`: the node output that will fill it.
// Its sizes, dtype and device are known at once (ops validate and infer them at record time); its
// data does not exist yet. Views of a pending tensor share its Storage, as views of a concrete one
// do, so that materializing the root fills every view at once. Nodes are reference counted: a node
// lives while a pending tensor, a view or a later node needs it, and nodes nobody can reach are
// freed at once, so a training loop's pending trace never grows from one iteration to the next.
//
// Materializing (exec/lazy_eval.cpp) takes the sub-graph the requested values need, optimizes and
// runs it, fills the waiting storages, and turns every executed node that is still referenced into
// a computed node holding its result, so nothing is computed twice. In-place writes to a storage
// that pending nodes read (or that is itself pending) first flush the pending trace; in trace mode
// (kiln::jit::trace) they are instead recorded functionally (see exec/trace_record.cpp).
//
// Threads. Each thread records into its own live list, so a flush on one thread evaluates only
// that thread's pending work. Node structure (inputs, results, claims, the live links) and every
// Storage's `lazy` are read and written under one process-wide lock (LazyLock), held for the few
// pointer updates of a recording or a hand-over, never while a graph is optimized, compiled or
// run. An evaluation claims the nodes it computes (`in_flight`); another thread that needs one of
// them waits until it is computed instead of computing it again.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "kiln/tensor.h"
#include "lib/op_table.h"

namespace kiln::detail {

struct LazyNode;
struct LiveList;
struct Storage;
struct TensorImpl;

// One output of a node.
struct LazyRef {
  std::shared_ptr<LazyNode> node;
  uint32_t index = 0;
  explicit operator bool() const { return node != nullptr; }
};

struct LazyType {
  Shape sizes;
  DType dtype;
  // Set by the recorder from the inputs (see device_of_inputs) unless the op moves data.
  Device device = kCPU;
};

// An input of a node: a pending producer, or a concrete tensor (a leaf). Neither: an absent
// optional input.
struct LazyInput {
  LazyRef ref;
  Tensor tensor;
};

struct LazyNode {
  const OpDef* op = nullptr;
  Attrs attrs;
  // Inline room for the common arities: recording allocates as little as it can.
  absl::InlinedVector<LazyInput, 3> inputs;
  absl::InlinedVector<LazyType, 1> outputs;
  // The storage that waits for each output, when the output is a root (not a view).
  absl::InlinedVector<std::weak_ptr<Storage>, 1> storages;
  // After execution: the result of each output; inputs are then released.
  std::vector<Tensor> results;
  bool computed = false;
  // Claimed by an evaluation running on some thread (see exec/lazy_eval.cpp).
  bool in_flight = false;
  uint64_t serial = 0;  // creation order, for stable graph building
  // Uncomputed nodes that read this one. While a computed node has such readers, the storages its
  // results were handed to count one lazy reader each (`reader_storages`), so an in-place write to
  // them first runs the readers, as it would for a concrete input.
  int32_t consumers = 0;
  absl::InlinedVector<std::shared_ptr<Storage>, 1> reader_storages;
  // The recording thread's live list of uncomputed nodes, while on it.
  LiveList* live_list = nullptr;
  LazyNode* live_prev = nullptr;
  LazyNode* live_next = nullptr;

  LazyNode() = default;
  LazyNode(const LazyNode&) = delete;
  LazyNode& operator=(const LazyNode&) = delete;
  ~LazyNode();  // releases inputs iteratively: a million-node chain frees without recursion
  // Stores results, releases inputs and leaves the live list (under the lazy lock).
  void mark_computed(std::vector<Tensor> values);
};

// The lazy lock: see the threading note above. Re-entrant on one thread (freeing a node frees its
// producers under the lock its destructor took).
class LazyLock {
 public:
  LazyLock() { lock(); }
  ~LazyLock() {
    if (held_) unlock();
  }
  LazyLock(const LazyLock&) = delete;
  LazyLock& operator=(const LazyLock&) = delete;
  void lock();
  void unlock();
  // Waits until some evaluation ends (its claims are released); this thread must hold the lock
  // exactly once.
  void wait_for_evaluations();

 private:
  bool held_ = false;
};
// Wakes the threads waiting for claimed nodes (an evaluation ended, computed or failed).
void notify_evaluations();
// Marks a storage pending with `ref` (or concrete, for an empty ref); under the lazy lock.
// `bump`: views' cached nodes of it become stale.
void set_storage_lazy(Storage& s, LazyRef ref, bool bump);
// After a hand-over: the storage `s`, now holding node `n`'s result, counts as read by n's
// uncomputed consumers while there are any.
void note_computed_storage(LazyNode& n, const std::shared_ptr<Storage>& s);

// ------------------------------------------------------------------------------- mode switches
// True when this thread records ops: lazy mode on (KILN_LAZY, default on; kiln::LazyGuard) and
// not inside the executor.
bool lazy_mode();
void set_lazy_mode(bool on);
// Recording off for a scope, restored at its end: a kernel that builds its result with ops runs
// them at once.
class RecordingOff {
 public:
  RecordingOff() : previous_(lazy_mode()) { set_lazy_mode(false); }
  ~RecordingOff() { set_lazy_mode(previous_); }
  RecordingOff(const RecordingOff&) = delete;
  RecordingOff& operator=(const RecordingOff&) = delete;

 private:
  bool previous_;
};
// True while kiln::jit::trace records a function on this thread.
bool trace_mode();

// A value a traced function reads from outside its tensors (an optimizer's learning rate, a
// module's training flag): `read` gives its value at each call of the traced function.
struct TraceRead {
  std::string what;  // for messages: "SGD lr", "Dropout training"
  std::function<double()> read;
  double value = 0;       // at trace time
  int64_t argument = -1;  // traced_scalar: the placeholder's index among TraceState::examples
};

// What a trace records besides the values its function returns (see exec/trace_record.cpp).
struct TraceState {
  // Concrete storages the function wrote in place: their `lazy` holds the written value (a flat
  // [numel] value of the whole storage) until the trace ends and restores them, and their version
  // counters as they were before the trace (`written_versions`, restored too).
  std::vector<std::shared_ptr<Storage>> written;
  std::vector<uint64_t> written_versions;
  // Storages allocated while tracing (factories' results). A write to one that nothing outside
  // the trace holds when it ends is local to the function: not written back, so that every
  // replay starts from the factory's value.
  std::unordered_set<const Storage*> created;
  // Hyperparameters read through traced_scalar: graph inputs, read again at each call.
  std::vector<TraceRead> scalars;
  // Modes read through traced_flag: each call checks them, and a change traces anew.
  std::vector<TraceRead> flags;
  // (What the function does to leaves' .grad: lib/autograd.h, TracedGrad.)
  std::vector<std::string> warnings;
  // The example inputs the placeholders stand for: a value read inside the trace (item()) is
  // computed from them.
  std::vector<Tensor> examples;
};
TraceState* trace_state();
void set_trace_state(TraceState* state);
// In trace mode, an in-place write of `value` into `self` is recorded functionally: the written
// storage's value becomes a new node, and views read it from there.
void trace_assign(const Tensor& self, const Tensor& value);
// The storage of a concrete tensor as one flat [numel] tensor (what trace writes address).
Tensor flat_storage_tensor(const std::shared_ptr<Storage>& storage, DType dtype);
// A hyperparameter as a float64 scalar tensor. Inside a trace it is a graph input that each call
// reads again through `value` (so a changed learning rate is followed without tracing anew);
// outside it is the value itself. `owner` keeps `value` alive: a call after its owner is gone
// fails.
Tensor traced_scalar(const char* what, const double& value, std::weak_ptr<const void> owner);
// A mode (a module's training flag, whether an optimizer uses momentum): `read()`. Inside a trace,
// each call of the traced function checks it again and traces anew when it changed.
bool traced_flag(const char* what, std::function<bool()> read, std::weak_ptr<const void> owner);
// Reports that a traced function read a value: the trace is specialized to it.
void trace_warn_value_read(const Tensor& t, const char* what);
// Marks reads that only validate (index bounds): the node still takes the value as an input and
// its kernel checks again on every replay, so the trace is not specialized to it.
struct ValueCheckScope {
  ValueCheckScope();
  ~ValueCheckScope();
  ValueCheckScope(const ValueCheckScope&) = delete;
  ValueCheckScope& operator=(const ValueCheckScope&) = delete;
};

// Whether a call with these inputs is recorded rather than run: lazy mode, and every defined
// input on the CPU.
bool should_record(const Tensor& a);
bool should_record(const Tensor& a, const Tensor& b);
bool should_record(const std::vector<Tensor>& inputs);

inline bool is_pending(const Tensor& t);

// ---------------------------------------------------------------------------------- recording
// Records one call of `def` and returns its pending outputs (contiguous, on the CPU).
std::vector<Tensor> lazy_record(const OpDef& def, std::vector<Tensor> inputs, Attrs attrs,
                                std::vector<LazyType> outputs);
Tensor lazy_record1(const OpDef& def, std::initializer_list<Tensor> inputs, Attrs attrs,
                    LazyType output);
Tensor lazy_record1(const OpDef& def, const std::vector<Tensor>& inputs, Attrs attrs,
                    LazyType output);
Tensor lazy_record1(const OpDef& def, const Tensor* inputs, size_t count, Attrs attrs,
                    LazyType output);
// Gives `view` (made by make_view over a pending input's storage) its own node: `def(input,
// attrs)`. Views of concrete tensors are not recorded outside trace mode.
void lazy_record_view(const OpDef& def, const Tensor& input, Attrs attrs, const Tensor& view);

// A pending placeholder for traced function argument `index`, with t's type.
Tensor trace_placeholder(const OpDef& input_op, int64_t index, const Tensor& t);

// The node input that stands for `t` (a pending value, a view of one, or a concrete leaf).
LazyInput lazy_input(const Tensor& t);

// --------------------------------------------------------------------------- materialization
// Computes every pending tensor among `tensors` in one graph; `reason` says why (KILN_LOG=lazy).
void materialize(const std::vector<Tensor>& tensors, const char* reason);
// Names, for KILN_LOG=lazy, what on this thread reads pending data within its scope (item(),
// printing, an op checking its operand's values): data access alone does not say who asked.
class MaterializeCause {
 public:
  explicit MaterializeCause(const char* what) noexcept;
  ~MaterializeCause();
  MaterializeCause(const MaterializeCause&) = delete;
  MaterializeCause& operator=(const MaterializeCause&) = delete;

 private:
  const char* previous_;
};
// Marks the evaluator's work on this thread: flushes are no-ops inside it.
// True while the evaluator runs a graph on this thread (inside an EvaluationScope).
bool in_evaluation();
struct EvaluationScope {
  EvaluationScope();
  ~EvaluationScope();
  EvaluationScope(const EvaluationScope&) = delete;
  EvaluationScope& operator=(const EvaluationScope&) = delete;
};

// Marks type inference (jit/infer.cpp): asking for data inside it throws NeedsData.
struct NeedsData {};
struct InferenceScope {
  InferenceScope();
  ~InferenceScope();
  InferenceScope(const InferenceScope&) = delete;
  InferenceScope& operator=(const InferenceScope&) = delete;
};

// Computes every uncomputed node this thread recorded that is still alive (before an in-place
// write, before a trace or replay, or past the size limit).
void flush_pending(const char* reason = "flush");
// Why the evaluator was called this time (for KILN_LOG=lazy): the MaterializeCause in scope, if
// any, and the kind of request ("item() (data access)").
std::string evaluation_reason();
// Called before writing into t's storage: flushes pending work that reads it or fills it.
void prepare_write(const Tensor& t);
// TensorImpl::data() calls this for a pending storage.
void materialize_storage(TensorImpl& impl);

// Number of uncomputed nodes alive that this thread recorded (its pending trace's size).
int64_t pending_count();
// KILN_MAX_PENDING (default 10000): recording past it flushes the pending trace.
int64_t max_pending();
void set_max_pending(int64_t n);

// The evaluator lives in exec/ (lib/ does not depend on it); exec/init.cpp sets it at load time.
using Evaluator = void (*)(const std::vector<LazyRef>& requests);
void set_evaluator(Evaluator e);

}  // namespace kiln::detail
