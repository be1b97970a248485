// Hooks into the autograd engine for code that acts as gradients become ready (data-parallel
// gradient reduction), kept apart from lib/autograd.h so that its many includers do not see them.
#pragma once

#include <functional>
#include <memory>

#include "lib/autograd.h"

namespace kiln::detail {

// Runs hook(leaf) each time a backward pass has accumulated a gradient into leaf.grad() (torch's
// register_post_accumulate_grad_hook), on the thread running the backward. Returns the leaf's
// gradient accumulator, which owns the hook: the leaf holds its accumulator only weakly, so the
// caller keeps it alive for as long as the hook should run.
std::shared_ptr<Node> add_post_accumulate_grad_hook(const Tensor& leaf,
                                                    std::function<void(const Tensor&)> hook);

}  // namespace kiln::detail
