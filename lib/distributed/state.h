// The distributed subsystem's process-wide state, in one place: the default group, the numbers
// that recorded collectives name groups by, and the communication times.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "kiln/distributed.h"

namespace kiln::distributed {

struct DistributedState {
  std::mutex groups_mu;
  std::shared_ptr<ProcessGroup> default_group;  // under groups_mu: what init_process_group made
  int groups_made = 0;  // under groups_mu: names each group's keys in a shared store

  // Groups that a recorded node names, by number (functional.cpp). Held weakly: a graph does not
  // keep a group alive, and a replay after its group was destroyed raises.
  std::mutex registry_mu;
  std::vector<std::weak_ptr<ProcessGroup>> registry;  // under registry_mu: by group number

  std::mutex times_mu;
  CommTimes times;  // under times_mu: the Gloo groups' waits and overlaps (gloo_group.cpp)
};

// Never destroyed: groups may be released from exit handlers (process_group.cpp).
DistributedState& distributed_state();

}  // namespace kiln::distributed
