// Transfer elimination: removes device round trips and copies that change nothing, and moves
// copies above the work that feeds them (elementwise ops, GEMMs, joins, views and gathers), so that
// the work runs on the device its result is copied to (to a GPU, or back to the host when that
// copies fewer bytes).
#include "jit/fusibility.h"
#include "jit/passes/passes.h"

namespace kiln::jit {

namespace {
bool is_transfer(const Node* n) {
  return n && n->op().kind == detail::OpKind::Transfer;
}

Device target_of(const Node* n) {
  return n->output()->type().device;
}

int64_t bytes_of(const ValueType& t) {
  int64_t n = 1;
  for (int64_t s : t.sizes) n *= s;
  return n * static_cast<int64_t>(element_size(t.dtype));
}
}  // namespace

// A worklist of the copies, in graph order, each rule applied where it matches:
// - to_device(x, d) where x is on d already: x.
// - to_device(to_device(x, a), b): to_device(x, b), or x when x is on b (a round trip).
// - to_device(f(x1, ..., xn), d) for an f that the device computes itself (an elementwise op that
//   fuses there, or an op with a device kernel: fuser::has_device_kernel) and whose value nothing
//   else reads, where the tensor operands together are no larger than the result:
//   f(to_device(x1, d), ...) on d. The work moves to the device with no more bytes copied (a
//   broadcast operand or a GEMM's factors copy less); the new copies join the worklist, so a chain
//   moves as a whole. 0-dim CPU operands stay where they are: a device kernel takes them as
//   numbers. Ops a device would run through the host stay where they are.
// Each rule removes a copy or moves one above a node that then leaves the source device, so the
// work is linear in the graph. A copy is removed as soon as nothing reads it (and a producer
// whose work moved with it), so that later rules see each value's real readers.
// Placement never changes values beyond the CUDA emitter's documented tolerance for
// transcendental functions (fuser/codegen/cuda/cuda_codegen.h).
bool eliminate_transfers(Graph& g, PassContext& ctx) {
  std::vector<Node*> work;
  for (Node* n = g.first(); n; n = n->next())
    if (is_transfer(n)) work.push_back(n);
  bool changed = false;
  for (size_t w = 0; w < work.size(); ++w) {
    Node* n = work[w];
    Value* in = n->input(0);
    const Device to = target_of(n);
    if (in->type().device == to) {
      n->output()->replace_all_uses_with(in);
      g.destroy(n);
      ctx.count("copy to the same device removed");
      changed = true;
      continue;
    }
    Node* producer = in->node();
    if (is_transfer(producer)) {
      Value* source = producer->input(0);
      if (source->type().device == to) {
        n->output()->replace_all_uses_with(source);
        g.destroy(n);
        ctx.count("round trip removed");
      } else {
        n->replace_input(0, source);
        ctx.count("copy of a copy shortened");
      }
      changed = true;
      continue;
    }
    const FusionQueries& fusion = fusion_queries();
    if (!(fusion.is_fusible(*producer) || fusion.has_device_kernel(*producer)) ||
        producer->num_outputs() != 1 || in->uses().size() != 1 || g.is_output(in))
      continue;
    auto is_number = [](const Value* x) {
      return x->type().sizes.empty() && x->type().device.is_cpu();
    };
    int64_t operand_bytes = 0;
    bool movable = true;
    for (Value* x : producer->inputs()) {
      if (!x || is_number(x)) continue;
      movable &= x->type().device == in->type().device;
      operand_bytes += bytes_of(x->type());
    }
    if (!movable || operand_bytes > bytes_of(in->type())) continue;
    std::vector<Value*> moved_inputs;
    for (Value* x : producer->inputs()) {
      if (!x || is_number(x)) {
        moved_inputs.push_back(x);
        continue;
      }
      ValueType t = x->type();
      t.device = to;
      Node* copy = g.create(n->op(), {x}, n->attrs(), {t}, n);
      work.push_back(copy);
      moved_inputs.push_back(copy->output());
    }
    ValueType out_type = in->type();
    out_type.device = to;
    Node* moved = g.create(producer->op(), moved_inputs, producer->attrs(), {out_type}, n);
    n->output()->replace_all_uses_with(moved->output());
    // Gone at once, so that the producer's operands are read only by their new copies.
    g.destroy(n);
    g.destroy(producer);
    ctx.count("work moved to the copy's device");
    changed = true;
  }
  return changed;
}

}  // namespace kiln::jit
