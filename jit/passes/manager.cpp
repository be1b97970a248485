// The pass manager: the fixed pass order, switches (KILN_DISABLE_PASSES, KILN_VERIFY) and the
// passes' own profile.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <optional>

#include "jit/passes/passes.h"

#include "absl/strings/str_join.h"

#include "jit/dump.h"
#include "jit/log.h"
#include "kiln/error.h"
#include "lib/env.h"
#include "lib/profiler.h"

namespace kiln::jit {

// The order matters. dce first, so the other passes do not spend time on dead nodes; cse next, so
// that equal subexpressions are one value when the pattern rules look for "the same x" (softmax's
// two exps); fold before the rewrites, so rules see constants rather than constant arithmetic;
// canonicalize before stabilize, so views and x * 1 do not hide a stabilizable pattern; gemm_bias
// and conv_fold after them (x * 1 + b is a bias add once canonical); transfers after the rewrites,
// so that the elementwise chains it moves to the device are in their final form; and dce after
// them, for nodes the rewrites left behind that they did not remove themselves; push_views and
// sink_views at the very end, for the fuser.
const std::vector<PassInfo>& all_passes() {
  static const std::vector<PassInfo> passes = {
      {"dce", &eliminate_dead_code},  {"cse", &eliminate_common_subexpressions},
      {"fold", &fold_constants},      {"canonicalize", &canonicalize},
      {"stabilize", &stabilize},      {"transfers", &eliminate_transfers},
      {"gemm_bias", &fold_gemm_bias}, {"conv_fold", &fold_conv_epilogues},
      {"dce", &eliminate_dead_code},  {"push_views", &push_views},
      {"sink_views", &sink_views},
  };
  return passes;
}

namespace {

bool known_pass(const std::string& name) {
  for (const PassInfo& p : all_passes())
    if (name == p.name) return true;
  return false;
}

// Every pass name once, in order of first appearance.
std::vector<std::string> pass_names() {
  std::vector<std::string> names;
  for (const PassInfo& p : all_passes()) {
    bool seen = false;
    for (const std::string& n : names) seen |= n == p.name;
    if (!seen) names.emplace_back(p.name);
  }
  return names;
}

// What KILN_DISABLE_PASSES accepts.
std::vector<std::string> names_and_all() {
  std::vector<std::string> names = pass_names();
  names.emplace_back("all");
  return names;
}

bool env_verify_default() {
  return detail::env_bool("KILN_VERIFY");  // the default follows the build (NDEBUG: off)
}

// The pass manager's settings and per-pass profile.
struct ManagerState {
  std::mutex mu;
  std::vector<std::string> disabled;      // under mu: "all" disables every pass
  bool verify;                            // under mu: check the graph after each pass
  std::vector<PassProfileEntry> profile;  // under mu: one per pass name, in pass order

  ManagerState() : verify(env_verify_default()) {
    disabled = detail::env_list("KILN_DISABLE_PASSES", detail::OnBad::Throw, names_and_all());
    for (const std::string& name : pass_names()) {
      profile.emplace_back();
      profile.back().pass = name;
    }
  }

  bool is_disabled(const std::string& name) const {
    for (const std::string& d : disabled)
      if (d == name || d == "all") return true;
    return false;
  }
};

ManagerState& state() {
  static ManagerState* s = new ManagerState();  // never destroyed: usable from exit handlers
  return *s;
}

void verify_after(const Graph& g, const char* when) {
  try {
    g.verify();
  } catch (const Error& e) {
    KILN_FAIL("jit: the graph is invalid ", when, ": ", e.what());
  }
}

}  // namespace

void set_disabled_passes(const std::vector<std::string>& names) {
  for (const std::string& n : names)
    KILN_CHECK(n == "all" || known_pass(n), "set_disabled_passes: no pass named '", n,
               "' (passes: ", absl::StrJoin(pass_names(), ", "), ", all)");
  ManagerState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.disabled = names;
}

bool pass_disabled(const std::string& name) {
  ManagerState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.is_disabled(name);
}

void set_verify_passes(bool on) {
  ManagerState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.verify = on;
}

bool verify_passes() {
  ManagerState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.verify;
}

void run_passes(Graph& g) {
  detail::ProfileSpan span("passes");
  ManagerState& s = state();
  std::vector<const PassInfo*> enabled;
  bool verify;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (const PassInfo& p : all_passes())
      if (!s.is_disabled(p.name)) enabled.push_back(&p);
    verify = s.verify;
  }
  // Checking the input first means a broken graph is blamed on whoever built it, not on dce.
  if (verify) verify_after(g, "before the passes");
  const bool dump = dump_enabled();
  if (dump) dump_graph(g, "input");
  for (const PassInfo* p : enabled) {
    PassContext ctx;
    const int64_t before = static_cast<int64_t>(g.size());
    const auto start = std::chrono::steady_clock::now();
    {
      detail::ProfileSpan pass_span("pass:", p->name);
      p->fn(g, ctx);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const int64_t after = static_cast<int64_t>(g.size());
    if (verify) verify_after(g, std::string("after pass '").append(p->name).append("'").c_str());
    if (dump) dump_graph(g, p->name);
    if (!ctx.rewrites.empty() && log_enabled("passes")) {
      std::string rules;
      for (const auto& [rule, n] : ctx.rewrites)
        rules += (rules.empty() ? "" : ", ") + rule + " x" + std::to_string(n);
      log("passes", p->name, ": ", before, " -> ", after, " nodes (", rules, ")");
    }
    std::lock_guard<std::mutex> lock(s.mu);
    for (PassProfileEntry& e : s.profile) {
      if (e.pass != p->name) continue;
      e.runs += 1;
      e.seconds += seconds;
      e.nodes_before += before;
      e.nodes_after += after;
      for (const auto& [rule, n] : ctx.rewrites) e.rewrites[rule] += n;
    }
  }
}

std::vector<PassProfileEntry> pass_profile() {
  ManagerState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.profile;
}

void reset_pass_profile() {
  ManagerState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  for (PassProfileEntry& e : s.profile) {
    std::string name = std::move(e.pass);
    e = PassProfileEntry();
    e.pass = std::move(name);
  }
}

}  // namespace kiln::jit
