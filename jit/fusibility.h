// What the passes ask about fusion (is it on, may a node fuse, has a device a kernel for it),
// answered by the fuser, which sits above jit/ and hands its answers down at load time.
#pragma once

#include "jit/ir.h"

namespace kiln::jit {

// The fuser's answers (fuser/fuse.h), registered by fuser::register_fusion_queries.
struct FusionQueries {
  bool (*enabled)() = nullptr;                         // fuser::fusion_enabled (KILN_FUSE)
  bool (*is_fusible)(const Node& n) = nullptr;         // fuser::is_fusible
  bool (*has_device_kernel)(const Node& n) = nullptr;  // fuser::has_device_kernel
};

// Sets the queries; called once at load time (exec/layer_hooks.cpp), before any pass runs.
void set_fusion_queries(const FusionQueries& queries);

// The registered queries. Throws kiln::Error when none are registered: a pass must not guess
// what the fuser would say.
const FusionQueries& fusion_queries();

}  // namespace kiln::jit
