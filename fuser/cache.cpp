// The on-disk kernel cache (see cache.h for the file format and the policies).
#include "fuser/cache.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <vector>

#include "jit/log.h"

namespace kiln::fuser {

namespace fs = std::filesystem;

namespace {
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'K', 'E', 'R', 'N'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderSize = 8 + 4 + 4 + 16 + 8 + 8;

std::mutex g_mutex;  // serializes writes and eviction within the process
std::atomic<int64_t> g_hits{0}, g_writes{0}, g_rejected{0};

XXH128_hash_t key_hash(const std::string& key) {
  return XXH3_128bits(key.data(), key.size());
}

std::string hex(XXH128_hash_t h) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return buf;
}

template <typename T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <typename T>
T get(const std::string& s, size_t at) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof v);
  return v;
}
}  // namespace

DiskCache& DiskCache::instance() {
  static DiskCache* cache = new DiskCache();
  return *cache;
}

DiskCache::DiskCache() {
  const char* off = std::getenv("KILN_CACHE");
  if (off && std::string(off) == "0") return;
  if (const char* d = std::getenv("KILN_CACHE_DIR"); d && *d) {
    dir_ = d;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    dir_ = std::string(x) + "/kiln";
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    dir_ = std::string(h) + "/.cache/kiln";
  } else {
    return;
  }
  if (const char* m = std::getenv("KILN_CACHE_MAXSIZE"); m && *m)
    max_bytes_ = std::strtoull(m, nullptr, 10);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || access(dir_.c_str(), W_OK) != 0) {
    disable("cannot write to " + dir_ + (ec ? " (" + ec.message() + ")" : ""));
    return;
  }
  enabled_ = true;
}

void DiskCache::disable(const std::string& why) {
  if (enabled_ || !dir_.empty())
    std::cerr << "kiln: the kernel cache directory is unusable (" << why
              << "); compiled kernels are kept in memory only\n";
  enabled_ = false;
}

std::string DiskCache::path_of(const std::string& key) const {
  return dir_ + "/" + hex(key_hash(key)) + ".kernel";
}

std::optional<std::string> DiskCache::load(const std::string& key, uint32_t kind) {
  if (!enabled_) return std::nullopt;
  const std::string path = path_of(key);
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const XXH128_hash_t h = key_hash(key);
  std::string why;
  if (data.size() < kHeaderSize || std::memcmp(data.data(), kMagic, 8) != 0) {
    why = "not a kernel file";
  } else if (get<uint32_t>(data, 8) != kFormatVersion) {
    why = "format version " + std::to_string(get<uint32_t>(data, 8));
  } else if (get<uint32_t>(data, 12) != kind || get<uint64_t>(data, 16) != h.low64 ||
             get<uint64_t>(data, 24) != h.high64) {
    why = "another kernel's key";
  } else if (get<uint64_t>(data, 32) != data.size() - kHeaderSize) {
    why = "truncated";
  } else if (get<uint64_t>(data, 40) !=
             XXH3_64bits(data.data() + kHeaderSize, data.size() - kHeaderSize)) {
    why = "checksum mismatch";
  }
  if (!why.empty()) {
    jit::log("cache", "deleting bad cache entry ", path, ": ", why);
    std::error_code ec;
    fs::remove(path, ec);
    g_rejected.fetch_add(1);
    return std::nullopt;
  }
  std::error_code ec;
  fs::last_write_time(path, fs::file_time_type::clock::now(), ec);  // recently used
  g_hits.fetch_add(1);
  jit::log("cache", "disk hit ", path);
  return data.substr(kHeaderSize);
}

void DiskCache::store(const std::string& key, uint32_t kind, const std::string& payload) {
  if (!enabled_) return;
  const XXH128_hash_t h = key_hash(key);
  std::string data(kMagic, 8);
  put<uint32_t>(data, kFormatVersion);
  put<uint32_t>(data, kind);
  put<uint64_t>(data, h.low64);
  put<uint64_t>(data, h.high64);
  put<uint64_t>(data, payload.size());
  put<uint64_t>(data, XXH3_64bits(payload.data(), payload.size()));
  data += payload;
  const std::string path = path_of(key);
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  std::lock_guard<std::mutex> lock(g_mutex);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    out.close();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      disable("writing " + tmp + " failed");
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    disable("renaming " + tmp + " failed");
    return;
  }
  g_writes.fetch_add(1);
  jit::log("cache", "wrote ", path, " (", data.size(), " bytes)");
  bytes_estimate_ += data.size();
  constexpr int64_t kRescanWrites = 256;
  if (!scanned_ || bytes_estimate_ > max_bytes_ || ++writes_since_scan_ >= kRescanWrites)
    evict_to_cap();
}

void DiskCache::evict_to_cap() {
  struct Entry {
    fs::file_time_type time;
    uint64_t size;
    fs::path path;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (e.path().extension() != ".kernel") continue;
    std::error_code fe;
    const uint64_t size = e.file_size(fe);
    const auto time = e.last_write_time(fe);
    if (fe) continue;
    entries.push_back({time, size, e.path()});
    total += size;
  }
  scanned_ = true;
  writes_since_scan_ = 0;
  bytes_estimate_ = total;
  if (total <= max_bytes_) return;
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.time < b.time; });
  for (const Entry& e : entries) {
    if (total <= max_bytes_) break;
    std::error_code re;
    fs::remove(e.path, re);
    if (!re) total -= e.size;
    jit::log("cache", "evicted ", e.path.string());
  }
  bytes_estimate_ = total;
}

DiskCacheStats disk_cache_stats() {
  return {g_hits.load(), g_writes.load(), g_rejected.load()};
}

}  // namespace kiln::fuser
