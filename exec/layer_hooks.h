// The upper layers' hooks handed to the lower ones at load time (see layer_hooks.cpp).
#pragma once

namespace kiln::jit {

// Registers the fuser's fusion queries with the passes and the code generators' statistics with
// lib/stats_registry.h. Called once, by the library's load-time registration.
void register_layer_hooks();

}  // namespace kiln::jit
