// Where a tensor's memory lives.
#pragma once

#include <ostream>
#include <string>

namespace kiln {

enum class DeviceType : int8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  constexpr Device(DeviceType t = DeviceType::CPU, int i = 0) : type(t), index(i) {}
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;  // "cpu", "cuda:0"
  // "cpu", "cuda", "cuda:1"; raises kiln::Error naming the text otherwise.
  static Device parse(const std::string& text);
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

constexpr Device kCPU{DeviceType::CPU, 0};
constexpr Device kCUDA{DeviceType::CUDA, 0};

std::ostream& operator<<(std::ostream& os, const Device& d);

namespace cuda {
// True when libcuda.so.1 loads and reports at least one device. Never throws.
bool is_available();
int device_count();
// Waits for every copy and kernel queued on the device.
void synchronize(int device = 0);
// Returns the device's cached, unused memory (and the pinned host buffers') to the driver.
void empty_cache();
struct MemoryStats {
  size_t allocated_bytes = 0;       // held by live tensors
  size_t reserved_bytes = 0;        // held from the driver (allocated + cached)
  size_t peak_allocated_bytes = 0;  // since the start or the last reset_peak_memory_stats
  size_t peak_reserved_bytes = 0;
  int64_t driver_allocations = 0;  // cuMemAlloc calls
  int64_t cache_hits = 0;          // allocations served from the cache
};
MemoryStats memory_stats(int device = 0);
void reset_peak_memory_stats(int device = 0);
// TF32 tensor cores for float32 GEMMs (about 10 bits of mantissa): off by default, so that float32
// matmuls are accurate to float32; KILN_ALLOW_TF32=1 sets the initial value.
void set_allow_tf32(bool allow);
bool allow_tf32();
}  // namespace cuda

}  // namespace kiln
