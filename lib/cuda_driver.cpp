// Lazy loading of the CUDA driver (libcuda.so.1) with dlopen, so that builds with the CUDA backend
// run unchanged on machines without a GPU or driver.
#include <dlfcn.h>

#include <mutex>

#include "kiln/device.h"

namespace kiln::cuda {

namespace {
struct Driver {
  bool loaded = false;
  int count = 0;
};

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
#ifdef KILN_HAS_CUDA
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    using InitFn = int (*)(unsigned);
    using CountFn = int (*)(int*);
    auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
    auto get_count = reinterpret_cast<CountFn>(dlsym(lib, "cuDeviceGetCount"));
    if (!init || !get_count || init(0) != 0) return;
    int n = 0;
    if (get_count(&n) != 0) return;
    d.loaded = true;
    d.count = n;
#endif
  });
  return d;
}
}  // namespace

bool is_available() {
  return driver().loaded && driver().count > 0;
}
int device_count() {
  return driver().count;
}

}  // namespace kiln::cuda
