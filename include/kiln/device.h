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
}  // namespace cuda

}  // namespace kiln
