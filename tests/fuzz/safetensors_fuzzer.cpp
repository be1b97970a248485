// libFuzzer target for kiln's safetensors reader (lib/checkpoint.cpp): any bytes either load or
// raise kiln::Error. A crash, a sanitizer report, a hang or any other exception is a bug. What
// loads must also survive what a user does next: saved again, it reads back bit for bit, and a
// module takes what fits of it (load_state_dict, not strict).
//
// Input: the file itself. Seeds: tests/fuzz/corpus/safetensors (tests/fuzz/make_seeds.cpp).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kiln/error.h"
#include "kiln/nn.h"
#include "kiln/serialize.h"

namespace {

bool same_bytes(const kiln::Tensor& a, const kiln::Tensor& b) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  const size_t n = static_cast<size_t>(a.numel()) * kiln::element_size(a.dtype());
  return n == 0 || std::memcmp(a.raw_data_ptr(), b.raw_data_ptr(), n) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::StateDict dict;
  kiln::Metadata metadata;
  try {
    dict = kiln::load_from_bytes(data, size, "fuzz input", &metadata);
  } catch (const kiln::Error&) {
    return 0;  // rejected with a message: the expected outcome for most inputs
  }
  const std::string again = kiln::save_to_string(dict, metadata);
  kiln::Metadata metadata2;
  const kiln::StateDict reread =
      kiln::load_from_bytes(again.data(), again.size(), "resaved", &metadata2);
  if (reread.keys() != dict.keys() || metadata2 != metadata) std::abort();
  for (const auto& [name, t] : dict)
    if (!same_bytes(t, reread.at(name))) std::abort();
  kiln::nn::Linear module(2, 3);
  try {
    module.load_state_dict(dict, /*strict=*/false);
  } catch (const kiln::Error&) {
    // A shape that does not fit the module.
  }
  return 0;
}
