// What the passes ask about fusion: the fuser's registered answers (see fusibility.h).
#include "jit/fusibility.h"

#include "kiln/error.h"

namespace kiln::jit {

namespace {

struct FusibilityState {
  FusionQueries queries;  // set once at start, then read-only
};

FusibilityState& state() {
  static FusibilityState s;
  return s;
}

}  // namespace

void set_fusion_queries(const FusionQueries& queries) {
  state().queries = queries;
}

const FusionQueries& fusion_queries() {
  const FusionQueries& q = state().queries;
  KILN_CHECK(q.enabled && q.is_fusible && q.has_device_kernel,
             "jit passes: the fuser's fusion queries are not registered "
             "(fuser::register_fusion_queries runs when libkiln loads)");
  return q;
}

}  // namespace kiln::jit
