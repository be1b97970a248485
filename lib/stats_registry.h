// Named statistics: a subsystem publishes its counters under its name, and a reader in any layer
// reads them without including that subsystem (jit::stats() reads the code generators' this way).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace kiln::detail {

// A provider's counters at the moment it is read, as (name, value) pairs. Counts are held as
// doubles, exact up to 2^53.
using StatValues = std::vector<std::pair<std::string, double>>;
using StatProvider = std::function<StatValues()>;

// Registers `provider` under `name`, replacing an earlier provider of that name. Registration is
// explicit (exec/layer_hooks.cpp, at load time). Thread-safe.
void register_stats(const std::string& name, StatProvider provider);

// The counters of the provider registered under `name`, read now; empty when there is none (a
// build without the CUDA code generator). Thread-safe: the provider runs outside the registry's
// lock, so it may take its own.
StatValues read_stats(const std::string& name);

// The value of `counter` in `values`, or 0 when it is absent.
double stat(const StatValues& values, const std::string& counter);

}  // namespace kiln::detail
