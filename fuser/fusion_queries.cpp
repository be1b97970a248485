// The fuser's answers to the passes' questions about fusion, handed down to jit/fusibility.h.
#include "fuser/fuse.h"
#include "fuser/registration.h"
#include "jit/fusibility.h"

namespace kiln::fuser {

void register_fusion_queries() {
  jit::FusionQueries q;
  q.enabled = &fusion_enabled;
  q.is_fusible = &is_fusible;
  q.has_device_kernel = &has_device_kernel;
  jit::set_fusion_queries(q);
}

}  // namespace kiln::fuser
