// libFuzzer target for the on-disk kernel cache's reader (fuser::DiskCache::load in
// fuser/cache.cpp): whatever bytes sit in a cache file, load returns exactly the payload of a
// well-formed entry for the requested key, and otherwise nothing, deleting the bad file. A crash,
// a sanitizer report, a wrong payload or a bad file left in place is a bug.
//
// Input: one flags byte, then the file. The header fields a random file would almost never get
// right are set from the real entry on request, so that mutations reach each later check: bit 0
// copies magic, version, kind and key hash (the first 32 bytes), bit 1 sets the payload size and
// bit 2 the payload checksum. Seeds: tests/fuzz/corpus/kernel_cache (tests/fuzz/make_seeds.cpp).
#include <xxhash.h>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "fuser/cache.h"

namespace {

namespace fs = std::filesystem;

constexpr size_t kHeaderSize = 48;  // magic 8, version 4, kind 4, key hash 16, size 8, checksum 8
const std::string kKey = "kernel_cache_fuzzer key";

struct Entry {
  fs::path path;       // the cache's file for kKey
  std::string header;  // its header as DiskCache::store wrote it
};

// The process's cache, in a fresh directory, holding one entry written by DiskCache::store: its
// file name and header are the cache's own, not a copy of its format.
const Entry& entry() {
  static const Entry e = [] {
    const fs::path dir =
        fs::temp_directory_path() / ("kiln_cache_fuzzer." + std::to_string(getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    setenv("KILN_CACHE_DIR", dir.c_str(), 1);
    setenv("KILN_CACHE_MAXSIZE", "1000000000", 1);
    auto& cache = kiln::fuser::DiskCache::instance();
    if (!cache.enabled()) std::abort();
    cache.store(kKey, kiln::fuser::kCpuObject, "payload");
    for (const auto& f : fs::directory_iterator(dir)) {
      if (f.path().extension() != ".kernel") continue;
      std::ifstream in(f.path(), std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      return Entry{f.path(), bytes.substr(0, kHeaderSize)};
    }
    std::abort();  // store wrote no file
  }();
  return e;
}

template <typename T>
void put(std::string& s, size_t at, T v) {
  std::memcpy(&s[at], &v, sizeof v);
}

template <typename T>
T get(const std::string& s, size_t at) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof v);
  return v;
}

// An entry for the same key as `header`'s, whose size and checksum match its payload.
bool well_formed(const std::string& bytes, const std::string& header) {
  if (bytes.size() < kHeaderSize || bytes.compare(0, 32, header, 0, 32) != 0) return false;
  const size_t payload = bytes.size() - kHeaderSize;
  return get<uint64_t>(bytes, 32) == payload &&
         get<uint64_t>(bytes, 40) == XXH3_64bits(bytes.data() + kHeaderSize, payload);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Entry& e = entry();
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const uint8_t flags = data[0];
  if (bytes.size() >= kHeaderSize) {
    const size_t payload = bytes.size() - kHeaderSize;
    if (flags & 1) bytes.replace(0, 32, e.header, 0, 32);
    if (flags & 2) put<uint64_t>(bytes, 32, payload);
    if (flags & 4) put<uint64_t>(bytes, 40, XXH3_64bits(bytes.data() + kHeaderSize, payload));
  }
  {
    std::ofstream out(e.path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) std::abort();
  }
  const auto loaded = kiln::fuser::DiskCache::instance().load(kKey, kiln::fuser::kCpuObject);
  if (loaded) {
    // Accepted: only a well-formed entry for kKey, and its payload byte for byte.
    if (!well_formed(bytes, e.header) || *loaded != bytes.substr(kHeaderSize)) {
      std::fprintf(stderr, "DiskCache::load accepted a bad entry or returned a wrong payload\n");
      std::abort();
    }
  } else if (fs::exists(e.path)) {
    std::fprintf(stderr, "DiskCache::load rejected an entry but left the file in place\n");
    std::abort();
  }
  return 0;
}
