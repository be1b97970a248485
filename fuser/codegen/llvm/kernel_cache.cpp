// The CPU JIT's kernels in memory: the cache and its eviction, loads and compiles, statistics.
//
// The public entry points of cpu_codegen.h: the cache of loaded kernels with its
// least-recently-used eviction, evicted kernels that plans still hold, a kernel's load from the
// disk cache or its compile, and the statistics.
#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "fuser/cache.h"
#include "fuser/codegen/llvm/cpu_codegen.h"
#include "fuser/codegen/llvm/cpu_internal.h"
#include "fuser/codegen/llvm/jit_engine.h"
#include "fuser/registration.h"
#include "jit/dump.h"
#include "jit/log.h"
#include "kiln/error.h"
#include "lib/env.h"
#include "lib/profiler.h"
#include "lib/stats_registry.h"

namespace kiln::fuser {

namespace cpu {

namespace {

// One loaded kernel's code, removed from the JIT when the last CompiledKernel holding it goes.
struct LoadedCode {
  llvm::orc::ResourceTrackerSP tracker;
  std::string key;
  std::string name;
};

// A loaded kernel, cached or not: what revive() finds.
struct Live {
  std::weak_ptr<const void> owner;
  KernelFn fn = nullptr;
  FinishFn finish = nullptr;
  ColumnsFn columns = nullptr;
  const char* name = nullptr;  // the LoadedCode's, alive while owner is
};

// Most recently used first.
using Lru = std::list<std::pair<std::string, CompiledKernel>>;

// The CPU JIT's state. Locks are taken one at a time, except that compile_mutex is held around
// the others; nothing may drop a CompiledKernel while holding live_mutex (the last reference's
// deleter takes it), nor while holding cache_mutex (evicted entries are dropped after it).
struct CpuJitState {
  std::once_flag engine_started;
  JitEngine* engine = nullptr;  // set once (engine_started) by the early start or the first
                                // request, then read-only; never destroyed: kernels may run until
                                // the process exits
  std::mutex compile_mutex;     // serializes loads and compiles (LLVM work), so that a kernel is
                                // loaded once
  std::mutex cache_mutex;       // the in-memory cache: capacity, lru, index
  size_t capacity = static_cast<size_t>(detail::env_int("KILN_KERNEL_CACHE_MAX"));  // cache_mutex
  Lru lru;                                                                          // cache_mutex
  absl::flat_hash_map<std::string_view, Lru::iterator> index;  // cache_mutex; views of lru's keys
  std::mutex live_mutex;                                       // live
  std::condition_variable live_cv;  // with live_mutex: an entry's code was removed
  // Every loaded kernel, cached or not, by key. An entry goes when its code is removed.
  absl::flat_hash_map<std::string, Live> live;  // live_mutex
  std::mutex stats_mutex;                       // stats
  CompileStats stats;  // stats_mutex; kept apart from the engine: reading it starts no LLVM
};

CpuJitState& state() {
  // Never destroyed: a kernel's last holder may let go of it while the process exits.
  static CpuJitState* s = new CpuJitState();
  return *s;
}

JitEngine& engine() {
  CpuJitState& s = state();
  std::call_once(s.engine_started, [&s] { s.engine = new JitEngine(); });
  return *s.engine;
}

template <typename F>
void update_stats(const F& f) {
  CpuJitState& s = state();
  std::lock_guard<std::mutex> lock(s.stats_mutex);
  f(s.stats);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The thread of start_cpu_jit_early, apart from CpuJitState: starting it reads no environment
// variable that could throw while kiln loads (the state reads KILN_KERNEL_CACHE_MAX).
struct EarlyStart {
  std::mutex mutex;  // started, thread
  bool started = false;
  std::thread thread;  // until joined
};

EarlyStart& early_start() {
  static EarlyStart* e = new EarlyStart();  // never destroyed: joined by an exit handler
  return *e;
}

// The early start's work (see start_cpu_jit_early). Only LLVM's start: a warm process finds its
// kernels on disk without emitting them (load_by_build), so warming the emitter here too would
// cost every process CPU time that only a compile, milliseconds long, would win back a little of.
void start_early() {
  pthread_setname_np(pthread_self(), "kiln-jit-start");  // as profilers and debuggers show it
  try {
    const auto start = std::chrono::steady_clock::now();
    engine();
    jit::log("codegen", "LLVM JIT started on a background thread as kiln loaded, ready after ",
             seconds_since(start) * 1e3, " ms");
  } catch (...) {
    // Silently: the first request starts LLVM again and raises the error at the op that needs
    // it (a bad KILN_LOG value, say, which logging here would throw again).
  }
}

// Joins the early start: at exit, before the static destructors of LLVM and of kiln's earlier
// state run under it, and before a fork, whose child would otherwise inherit whatever lock the
// thread held at that instant (LLVM's, the log's) locked for good.
void join_early_start() {
  EarlyStart& e = early_start();
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(e.mutex);
    t = std::move(e.thread);
  }
  if (t.joinable()) t.join();
}

// (Under cache_mutex.) Moves the entries past the capacity to `evicted`, for the caller to drop
// once the lock is released: dropping the last reference removes code from the JIT.
void evict_past_capacity(CpuJitState& s, std::vector<CompiledKernel>& evicted) {
  while (s.lru.size() > s.capacity) {
    auto& [key, code] = s.lru.back();
    jit::log("cache", "evicting a kernel from memory (", s.lru.size(), " loaded, capacity ",
             s.capacity, ")");
    evicted.push_back(std::move(code));
    s.index.erase(key);
    s.lru.pop_back();
  }
  if (!evicted.empty()) {
    const auto n = static_cast<int64_t>(evicted.size());
    update_stats([n](CompileStats& st) { st.evicted += n; });
  }
}

// The cached kernel under `key`, made the most recently used.
std::optional<CompiledKernel> find(const std::string& key) {
  CpuJitState& s = state();
  std::lock_guard<std::mutex> lock(s.cache_mutex);
  auto it = s.index.find(key);
  if (it == s.index.end()) return std::nullopt;
  s.lru.splice(s.lru.begin(), s.lru, it->second);
  return it->second->second;
}

// Adds a kernel as the most recently used one, and evicts the least recently used ones past the
// capacity. Eviction drops the cache's reference only: code that a plan still holds stays loaded
// (and `live` finds it again), the rest is removed from the JIT as the last reference goes.
void insert(const std::string& key, const CompiledKernel& code) {
  CpuJitState& s = state();
  std::vector<CompiledKernel> evicted;
  std::lock_guard<std::mutex> lock(s.cache_mutex);
  s.lru.emplace_front(key, code);
  s.index.emplace(s.lru.front().first, s.lru.begin());
  evict_past_capacity(s, evicted);
}

// A kernel evicted from the cache but still held (by a plan): its code, without reloading it. If
// its last holder is removing it right now, waits for the removal to finish, so that loading it
// again does not define its symbols twice.
std::optional<CompiledKernel> revive(const std::string& key) {
  CpuJitState& s = state();
  std::unique_lock<std::mutex> lock(s.live_mutex);
  for (;;) {
    auto it = s.live.find(key);
    if (it == s.live.end()) return std::nullopt;
    if (std::shared_ptr<const void> owner = it->second.owner.lock())
      return CompiledKernel{it->second.fn, it->second.finish, it->second.columns, std::move(owner),
                            it->second.name};
    s.live_cv.wait(lock);
  }
}

// The deleter of a LoadedCode: removes the kernel's code from the JIT. Runs on the thread that
// dropped the last reference, holding none of the state's locks.
void unload(LoadedCode* c) {
  CpuJitState& s = state();
  if (llvm::Error e = c->tracker->remove())
    jit::log("codegen", "removing ", c->name, " failed: ", llvm_message(std::move(e)));
  {
    std::lock_guard<std::mutex> lock(s.live_mutex);
    if (auto it = s.live.find(c->key); it != s.live.end() && it->second.owner.expired())
      s.live.erase(it);
  }
  s.live_cv.notify_all();
  update_stats([](CompileStats& st) { ++st.unloaded; });
  jit::log("codegen", "unloaded ", c->name);
  delete c;
}

// One kernel on its way into the JIT.
struct KernelLoad {
  const std::string& name;
  const Kernel& k;
  const Layout& layout;
  std::string disk_key;
  llvm::orc::ResourceTrackerSP tracker;
  CompiledKernel code;
  Phases phases;
};

// A disk entry passed its checks; it must also link and define this kernel's symbol, else it is
// dropped and the kernel compiled (and the entry replaced). Whether it was loaded.
bool link_from_disk(JitEngine& jit, KernelLoad& load, const std::optional<std::string>& object) {
  if (!object) return false;
  llvm::Error e = jit.link(load.tracker, *object, load.name, load.k, load.code);
  if (!e) return true;
  jit::log("cache", "disk entry for ", load.name, " does not link: ", llvm_message(std::move(e)));
  llvm::consumeError(load.tracker->remove());
  load.tracker = jit.new_tracker();
  load.code = CompiledKernel{};
  return false;
}

bool load_from_disk(JitEngine& jit, KernelLoad& load) {
  return link_from_disk(jit, load, DiskCache::instance().load(load.disk_key, kCpuObject));
}

// The kernel's object found through the entry this build of kiln and LLVM filed under the
// kernel's structure (JitEngine::build_key_of), which names the object's entry: a disk hit
// without emitting the kernel and printing its IR for the key (two thirds of a warm process's
// load). Any miss, or an object that does not link, leaves the way through the emitted code.
bool load_by_build(JitEngine& jit, const std::string& build_key, KernelLoad& load) {
  if (build_key.empty()) return false;
  DiskCache& cache = DiskCache::instance();
  const std::optional<std::string> entry = cache.load(build_key, kCpuEntryByBuild);
  if (!entry || !link_from_disk(jit, load, cache.load_named(*entry, kCpuObject))) return false;
  jit::log("cache", "found ", load.name, " on disk by its kernel and this build (not emitted)");
  return true;
}

// Compiles the kernel, files its object in the disk cache, and links it.
void compile(JitEngine& jit, KernelLoad& load, Emitted emitted,
             std::chrono::steady_clock::time_point start) {
  Phases& phases = load.phases;
  const std::string object =
      jit.compile_object(load.name, load.k, load.layout, std::move(emitted), phases);
  auto t = std::chrono::steady_clock::now();
  DiskCache::instance().store(load.disk_key, kCpuObject, object);
  phases.store = seconds_since(t);
  t = std::chrono::steady_clock::now();
  if (llvm::Error e = jit.link(load.tracker, object, load.name, load.k, load.code)) {
    llvm::consumeError(load.tracker->remove());
    KILN_CHECK(false, "fuser: loading ", load.name, ": ", llvm_message(std::move(e)));
  }
  phases.link = seconds_since(t);
  const double total = seconds_since(start);
  update_stats([total](CompileStats& st) {
    ++st.compiled;
    st.compile_seconds += total;
  });
  if (jit::log_enabled("codegen")) {
    auto ms = [](double s) { return std::to_string(s * 1e3).substr(0, 5); };
    jit::log("codegen", "compiled ", load.name, " in ", ms(total), " ms: IR ", ms(phases.ir),
             ", optimization ", ms(phases.optimize), ", object code ", ms(phases.object),
             ", disk cache ", ms(phases.store), ", linking ", ms(phases.link));
  }
}

// The loaded kernel, owning its code (removed when the last holder lets go), and known to revive.
CompiledKernel hold(const std::string& key, KernelLoad& load) {
  std::shared_ptr<LoadedCode> owner(new LoadedCode{std::move(load.tracker), key, load.name},
                                    [](LoadedCode* c) { unload(c); });
  CompiledKernel code = std::move(load.code);
  {
    CpuJitState& s = state();
    std::lock_guard<std::mutex> lock(s.live_mutex);
    s.live[key] = Live{owner, code.fn, code.finish, code.columns, owner->name.c_str()};
  }
  code.name = owner->name.c_str();
  code.owner = std::move(owner);
  return code;
}

// (Under compile_mutex.) Loads the kernel from the disk cache, or compiles it. On disk, the
// object is filed under the IR it is compiled from (and the target): a change of the emitter's
// output can never load an object built from other code. A second, small entry filed under the
// kernel's structure, the target and the build IDs of kiln and LLVM names that object's entry, so
// that the same build finds it without emitting the kernel; a new build of either emits again.
CompiledKernel load_or_compile(const std::string& key, const Kernel& k, const Layout& layout) {
  kiln::detail::ProfileSpan span("compile");
  const auto start = std::chrono::steady_clock::now();
  JitEngine& jit = engine();
  const std::string name = kernel_symbol(key, k);
  KernelLoad load{name, k, layout, {}, jit.new_tracker(), {}, {}};
  span.set_detail(name);
  // With KILN_DUMP on, kernels are compiled rather than read from the disk cache, so that every
  // kernel's IR and assembly are dumped; the object still goes to the disk cache.
  const bool dump = jit::dump_enabled();
  const std::string build_key = jit.build_key_of(key);
  bool from_disk = !dump && load_by_build(jit, build_key, load);
  if (!from_disk) {
    auto t = std::chrono::steady_clock::now();
    Emitted emitted = jit.emit_module(name, k, layout);
    load.disk_key = jit.disk_key_of(*emitted.module);
    load.phases.ir = seconds_since(t);
    from_disk = !dump && load_from_disk(jit, load);
    if (!from_disk) compile(jit, load, std::move(emitted), start);
    if (!build_key.empty())
      DiskCache::instance().store(build_key, kCpuEntryByBuild,
                                  DiskCache::entry_name(load.disk_key));
  }
  if (from_disk) {
    update_stats([](CompileStats& st) { ++st.disk_hits; });
    span.set_name("kernel.disk_load");
    span.set_category(kiln::profiler::Category::kCache);
  }
  return hold(key, load);
}

// The in-memory cache: a hit, else a kernel still loaded for someone who holds it, else one
// from the disk cache, else a new compile. Lookups run beside a compile; compiles (and loads)
// take turns.
CompiledKernel get(const Kernel& k, const Layout& layout) {
  engine();  // LLVM starts at the first request (its start-up logged before the first look-up)
  std::string key;
  {
    // The look-up (key and map) as a span of its own: the profile shows what a plan's first run
    // of a kernel costs when nothing compiles.
    kiln::detail::ProfileSpan span("kernel.lookup", nullptr, kiln::profiler::Category::kCache);
    key = kernel_key(k, layout);
    if (std::optional<CompiledKernel> hit = find(key)) {
      update_stats([](CompileStats& st) { ++st.memory_hits; });
      jit::log("cache", "memory hit ", hit->name);
      if (span.active()) span.set_detail(std::string(hit->name) + " (hit)");
      return std::move(*hit);
    }
    if (span.active()) span.set_detail(kernel_symbol(key, k) + " (miss)");
  }
  std::lock_guard<std::mutex> compiling(state().compile_mutex);
  if (std::optional<CompiledKernel> hit = find(key)) {  // loaded by another thread meanwhile
    update_stats([](CompileStats& st) { ++st.memory_hits; });
    return std::move(*hit);
  }
  if (std::optional<CompiledKernel> alive = revive(key)) {
    update_stats([](CompileStats& st) {
      ++st.memory_hits;
      ++st.revived;
    });
    jit::log("cache", "memory hit ", alive->name, " (evicted, still loaded for a plan)");
    insert(key, *alive);
    return std::move(*alive);
  }
  if (jit::log_enabled("cache")) jit::log("cache", "memory miss ", kernel_symbol(key, k));
  CompiledKernel code = load_or_compile(key, k, layout);
  insert(key, code);
  return code;
}

}  // namespace

}  // namespace cpu

void start_cpu_jit_early() {
  // KILN_LAZY=0 records nothing and fuses nothing on the CPU: no thread, no LLVM.
  if (!detail::env_bool("KILN_LAZY", detail::OnBad::Warn) ||
      !detail::env_bool("KILN_JIT_EARLY_START", detail::OnBad::Warn))
    return;
  cpu::EarlyStart& e = cpu::early_start();
  std::lock_guard<std::mutex> lock(e.mutex);
  if (e.started) return;
  e.started = true;
  // Registered before the thread exists: exit and fork never find it unjoined.
  std::atexit(cpu::join_early_start);
  pthread_atfork(cpu::join_early_start, nullptr, nullptr);
  e.thread = std::thread(cpu::start_early);
}

CompiledKernel cpu_kernel(const Kernel& kernel, const Layout& layout) {
  return cpu::get(kernel, layout);
}

std::string cpu_disk_key(const Kernel& kernel, const Layout& layout) {
  cpu::JitEngine& jit = cpu::engine();
  const std::string name = kernel_symbol(kernel_key(kernel, layout), kernel);
  return jit.disk_key_of(*jit.emit_module(name, kernel, layout).module);
}

size_t set_cpu_kernel_cache_capacity(size_t kernels) {
  cpu::CpuJitState& s = cpu::state();
  std::vector<CompiledKernel> evicted;
  size_t previous;
  {
    std::lock_guard<std::mutex> lock(s.cache_mutex);
    previous = s.capacity;
    s.capacity = kernels;
    cpu::evict_past_capacity(s, evicted);
  }
  return previous;  // `evicted` goes now, outside the lock
}

CompileStats cpu_compile_stats() {
  cpu::CpuJitState& s = cpu::state();
  std::lock_guard<std::mutex> lock(s.stats_mutex);
  return s.stats;
}

void register_cpu_codegen_stats() {
  detail::register_stats("cpu_codegen", [] {
    const CompileStats s = cpu_compile_stats();
    return detail::StatValues{{"compiled", s.compiled},
                              {"memory_hits", s.memory_hits},
                              {"disk_hits", s.disk_hits},
                              {"evicted", s.evicted},
                              {"revived", s.revived},
                              {"unloaded", s.unloaded},
                              {"compile_seconds", s.compile_seconds}};
  });
}

}  // namespace kiln::fuser
