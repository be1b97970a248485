// Convolution folding: what follows a convolution per channel or per element moves into it.
//
//   mul(conv2d(x, w, b), s)  -> conv2d(x, w * s[O, 1, 1, 1], b * s)   s per channel ([1, O, 1, 1])
//   add(conv2d(x, w, b), t)  -> conv2d(x, w, b + t)                    t per channel
//   add(conv2d(x, w, b), r)  -> conv2d_epilogue(x, w, b, r)            r of the output's shape
//   act(conv2d...(x, w, b, r)) -> conv2d_epilogue(x, w, b, r, act)     act: relu, gelu, silu
//
// Eval batch norm is a per-channel affine (lib/ops/pool_norm.cpp), so the first two rules fold it
// into the preceding convolution's weight and bias; the last two make the bias, the residual add
// of a ResNet block and the activation the convolution's epilogue (oneDNN post-ops), instead of
// passes that read the output back. The convolution's output must have no other reader (a
// training graph's batch statistics read it, so training convolutions are left alone).
//
// Not exact: w * s rounds the weight before the sums, and the epilogue adds inside oneDNN, so
// results move by a few float32 ulps of the terms (docs/architecture.md states the bound the tests
// check against float64). Like gemm_bias it lives apart from canonicalize.
#include <optional>
#include <string>
#include <variant>

#include "jit/passes/passes.h"
#include "jit/passes/rewriter.h"

namespace kiln::jit {

namespace {

using passes::Rewriter;

struct ConvOps {
  const OpDef* add = detail::find_op("add");
  const OpDef* mul = detail::find_op("mul");
  const OpDef* reshape = detail::find_op("reshape");
  const OpDef* conv = detail::find_op("conv2d");
  const OpDef* epilogue = detail::find_op("conv2d_epilogue");
  const OpDef* relu = detail::find_op("relu");
  const OpDef* gelu = detail::find_op("gelu");
  const OpDef* silu = detail::find_op("silu");
};

const ConvOps& conv_ops() {
  static const ConvOps o;
  return o;
}

// Attribute positions of conv2d (stride, padding, dilation, groups) and conv2d_epilogue (the same,
// then the activation).
constexpr size_t kGeometryAttrs = 4;
constexpr size_t kActivationAttr = 4;

// The convolution (conv2d, or a conv2d_epilogue with no activation yet when `epilogue_ok`)
// computing v, read by nothing but the node being rewritten; null otherwise.
Node* sole_conv(Value* v, bool epilogue_ok) {
  if (!v || v->uses().size() != 1 || v->node()->owning_graph()->is_output(v)) return nullptr;
  // conv2d_epilogue runs on the CPU only (a GPU convolution keeps its own ops).
  if (!v->type().device.is_cpu()) return nullptr;
  Node* c = v->node();
  const ConvOps& op = conv_ops();
  if (&c->op() == op.conv && c->num_inputs() == 3 && c->attrs().size() == kGeometryAttrs) return c;
  if (epilogue_ok && &c->op() == op.epilogue && c->num_inputs() == 4 &&
      c->attrs().size() == kGeometryAttrs + 1) {
    const AttrValue* act = passes::attr_at(c, kActivationAttr);
    if (act && std::holds_alternative<std::string>(*act) && std::get<std::string>(*act) == "none")
      return c;
  }
  return nullptr;
}

// Whether p holds one value per output channel of an [N, O, H, W] convolution output, broadcast
// over the rest ([1, O, 1, 1] or [O, 1, 1]), of the output's dtype and device.
bool per_channel(const Value* p, const ValueType& out) {
  if (!p || p->type().dtype != out.dtype || p->type().device != out.device) return false;
  const Shape& s = p->type().sizes;
  if (out.sizes.size() != 4 || (s.size() != 4 && s.size() != 3)) return false;
  const size_t channel = s.size() - 3;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] != (i == channel ? out.sizes[1] : 1)) return false;
  return true;
}

Attrs geometry(const Node* c) {
  return Attrs(c->attrs().begin(), c->attrs().begin() + kGeometryAttrs);
}

Value* reshaped(Rewriter& rw, Value* v, const Shape& sizes, Node* before) {
  ValueType t = v->type();
  t.sizes = sizes;
  return rw.create(*conv_ops().reshape, {v}, {sizes}, t, before);
}

// A new conv2d like c with weight w and bias b.
Value* conv_like(Rewriter& rw, Node* c, Value* w, Value* b, Node* before) {
  return rw.create(*conv_ops().conv, {c->input(0), w, b}, geometry(c), c->output()->type(), before);
}

// mul(conv2d(x, w, b), s), s per channel: the weight and bias scaled instead of the output.
Value* scale_rule(Rewriter& rw, Node* n, const char** rule) {
  const ConvOps& op = conv_ops();
  if (&n->op() != op.mul || n->num_inputs() != 2) return nullptr;
  const ValueType& t = n->output()->type();
  if (!is_floating_point(t.dtype)) return nullptr;
  for (size_t side = 0; side < 2; ++side) {
    Node* c = sole_conv(n->input(side), false);
    Value* s = n->input(1 - side);
    if (!c || c->output()->type() != t || !per_channel(s, t) || !c->input(1)) continue;
    const int64_t O = t.sizes[1];
    Value* w = c->input(1);
    Shape ws(w->type().sizes.size(), 1);
    ws[0] = O;
    ValueType wt = w->type();
    Value* scaled_w = rw.create(*op.mul, {w, reshaped(rw, s, ws, n)}, {}, wt, n);
    Value* b = c->input(2);
    if (b) b = rw.create(*op.mul, {b, reshaped(rw, s, {O}, n)}, {}, b->type(), n);
    *rule = "per-channel scale folded into the convolution's weight";
    return conv_like(rw, c, scaled_w, b, n);
  }
  return nullptr;
}

// add(conv2d(x, w, b), t): a per-channel t joins the bias; one of the output's shape is the
// epilogue's residual.
Value* add_rule(Rewriter& rw, Node* n, const char** rule) {
  const ConvOps& op = conv_ops();
  if (&n->op() != op.add || n->num_inputs() != 2) return nullptr;
  std::optional<double> alpha = passes::number_attr(n, 0);
  if (!alpha || *alpha != 1.0) return nullptr;
  const ValueType& t = n->output()->type();
  if (!is_floating_point(t.dtype)) return nullptr;
  for (size_t side = 0; side < 2; ++side) {
    Value* other = n->input(1 - side);
    if (per_channel(other, t)) {
      Node* c = sole_conv(n->input(side), false);
      if (!c || c->output()->type() != t) continue;
      const int64_t O = t.sizes[1];
      Value* shift = reshaped(rw, other, {O}, n);
      Value* b = c->input(2);
      b = b ? rw.create(*op.add, {b, shift}, {int64_t{1}}, b->type(), n) : shift;
      *rule = "per-channel shift folded into the convolution's bias";
      return conv_like(rw, c, c->input(1), b, n);
    }
    if (other && other->type() == t && op.epilogue) {
      Node* c = sole_conv(n->input(side), false);
      if (!c || c->output()->type() != t) continue;
      Attrs a = geometry(c);
      a.emplace_back(std::string("none"));
      *rule = "residual add as the convolution's epilogue";
      return rw.create(*op.epilogue, {c->input(0), c->input(1), c->input(2), other}, a, t, n);
    }
  }
  return nullptr;
}

// The epilogue's name of n's activation, or null when n is none of them.
const char* activation_of(const Node* n) {
  const ConvOps& op = conv_ops();
  if (&n->op() == op.relu) return "relu";
  if (&n->op() == op.silu) return "silu";
  if (&n->op() != op.gelu) return nullptr;
  const AttrValue* a = passes::attr_at(n, 0);
  if (!a || !std::holds_alternative<std::string>(*a)) return nullptr;
  const std::string& approximate = std::get<std::string>(*a);
  return approximate == "tanh" ? "gelu_tanh" : approximate == "none" ? "gelu" : nullptr;
}

// act(conv2d(...)) or act(conv2d_epilogue(..., "none")): the activation joins the epilogue.
Value* activation_rule(Rewriter& rw, Node* n, const char** rule) {
  const ConvOps& op = conv_ops();
  const char* act = activation_of(n);
  if (!act || !op.epilogue || n->num_inputs() != 1) return nullptr;
  Node* c = sole_conv(n->input(0), true);
  if (!c || c->output()->type() != n->output()->type()) return nullptr;
  Attrs a = geometry(c);
  a.emplace_back(std::string(act));
  Value* residual = &c->op() == op.epilogue ? c->input(3) : nullptr;
  *rule = "activation as the convolution's epilogue";
  return rw.create(*op.epilogue, {c->input(0), c->input(1), c->input(2), residual}, a,
                   n->output()->type(), n);
}

Value* conv_rule(Rewriter& rw, Node* n, const char** rule) {
  if (!conv_ops().conv) return nullptr;
  if (Value* v = scale_rule(rw, n, rule)) return v;
  if (Value* v = add_rule(rw, n, rule)) return v;
  return activation_rule(rw, n, rule);
}

}  // namespace

bool fold_conv_epilogues(Graph& g, PassContext& ctx) {
  Rewriter rw(g, ctx);
  return rw.run(&conv_rule);
}

}  // namespace kiln::jit
