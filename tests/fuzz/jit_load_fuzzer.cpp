// libFuzzer target for kiln::jit::load (jit/serialize.cpp and the function description in
// exec/trace_io.cpp): any file either loads or raises kiln::Error. A crash, a sanitizer report, a
// hang or any other exception is a bug.
//
// Input: one flags byte, then the file. Flag bit 0 rewrites the header's payload length and
// checksum to match (jit::reseal_for_testing), so that mutated payloads reach the parser instead
// of stopping at the checksum. Seeds: tests/fuzz/corpus/jit_load (tests/fuzz/make_seeds.cpp).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "jit/serialize.h"
#include "kiln/error.h"
#include "kiln/jit.h"

namespace {

const std::string& scratch_path() {
  static const std::string path = "/tmp/kiln_jit_load_fuzzer." + std::to_string(getpid());
  return path;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const bool reseal = data[0] & 1;
  try {
    if (reseal) kiln::jit::reseal_for_testing(bytes);  // throws when shorter than a header
  } catch (const kiln::Error&) {
    return 0;
  }
  write_file(scratch_path(), bytes);
  try {
    kiln::jit::load(scratch_path());
  } catch (const kiln::Error&) {
    // Rejected with a message: the expected outcome for almost every input.
  }
  return 0;
}
