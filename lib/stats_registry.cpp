// Named statistics: the registry of providers (see stats_registry.h).
#include "lib/stats_registry.h"

#include <map>
#include <mutex>

namespace kiln::detail {

namespace {

struct StatsRegistryState {
  std::mutex mu;
  std::map<std::string, StatProvider> providers;  // guarded by mu
};

StatsRegistryState& state() {
  // Never destroyed: a provider may be read while static objects are destroyed at exit.
  static auto* s = new StatsRegistryState;
  return *s;
}

}  // namespace

void register_stats(const std::string& name, StatProvider provider) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().providers[name] = std::move(provider);
}

StatValues read_stats(const std::string& name) {
  StatProvider provider;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    auto it = state().providers.find(name);
    if (it == state().providers.end()) return {};
    provider = it->second;
  }
  return provider();
}

double stat(const StatValues& values, const std::string& counter) {
  for (const auto& [name, value] : values)
    if (name == counter) return value;
  return 0;
}

}  // namespace kiln::detail
