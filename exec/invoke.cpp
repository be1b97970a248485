// Running one graph node through its op's reference kernel, as the plan's unfused steps do.
#include "exec/invoke.h"

#include "exec/executor.h"
#include "jit/constant_value.h"
#include "kiln/device.h"
#include "kiln/error.h"
#include "kiln/ops.h"
#include "lib/cuda_tensor.h"
#include "lib/tensor_impl.h"

namespace kiln::jit {

std::vector<Tensor> invoke_in_scope(const Node& node, const std::vector<Tensor>& inputs) {
  if (node.is_constant()) return {constant_value(node)};
  const OpDef& op = node.op();
  KILN_CHECK(op.invoke, "jit: op '", op.name, "' has no reference kernel to run");
  std::vector<Tensor> out = op.invoke(inputs, node.attrs());
  KILN_CHECK(out.size() == node.num_outputs(), "jit: ", op.name, " returned ", out.size(),
             " values for ", node.num_outputs(), " outputs");
  return out;
}

std::vector<Tensor> invoke_through_host(const Node& node, const std::vector<Tensor>& inputs) {
  std::vector<Tensor> host;
  host.reserve(inputs.size());
  for (const Tensor& t : inputs) host.push_back(t.defined() ? t.to(kCPU) : t);
  std::vector<Tensor> out = invoke_in_scope(node, host);
  for (size_t k = 0; k < out.size(); ++k) {
    const Device d = node.output(k)->type().device;
    if (out[k].defined() && out[k].device() != d) out[k] = detail::copy_to_device(out[k], d);
  }
  return out;
}

std::vector<Tensor> invoke_node(const Node& node, const std::vector<Tensor>& inputs) {
  EagerScope eager;
  return invoke_in_scope(node, inputs);
}

}  // namespace kiln::jit
