// The on-disk kernel cache (see cache.h for the file format and the policies).
#include "fuser/cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <vector>

#include "jit/log.h"
#include "lib/env.h"
#include "lib/ops/conv.h"

namespace kiln::fuser {

namespace fs = std::filesystem;

namespace {
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'K', 'E', 'R', 'N'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderSize = 8 + 4 + 4 + 16 + 8 + 8;

// The process's disk-cache state outside the DiskCache object: its counters are read without
// setting the cache up (disk_cache_stats).
struct DiskCacheState {
  std::mutex write_mutex;            // serializes writes and eviction within the process
  std::atomic<int64_t> hits{0};      // atomic: entries read back and accepted
  std::atomic<int64_t> writes{0};    // atomic: entries written
  std::atomic<int64_t> rejected{0};  // atomic: entries found bad and deleted
};
DiskCacheState& cache_state() {
  static DiskCacheState s;  // constant-initialized: no guard, usable at exit
  return s;
}

XXH128_hash_t key_hash(const std::string& key) {
  return XXH3_128bits(key.data(), key.size());
}

std::string hex(XXH128_hash_t h) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return buf;
}

// The largest payload read back (a kernel's object code is kilobytes): a damaged size field
// cannot make a read allocate the disk.
constexpr uint64_t kMaxPayload = uint64_t{256} << 20;

bool read_fully(int fd, char* out, uint64_t n) {
  while (n > 0) {
    const ssize_t got = ::read(fd, out, std::min<uint64_t>(n, uint64_t{1} << 30));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    out += got;
    n -= static_cast<uint64_t>(got);
  }
  return true;
}

bool write_fully(int fd, const char* data, uint64_t n) {
  while (n > 0) {
    const ssize_t put = ::write(fd, data, std::min<uint64_t>(n, uint64_t{1} << 30));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    data += put;
    n -= static_cast<uint64_t>(put);
  }
  return true;
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
  if (!detail::env_bool("KILN_CACHE")) return;
  if (std::string d = detail::env_string("KILN_CACHE_DIR"); !d.empty()) {
    dir_ = d;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    dir_ = std::string(x) + "/kiln";
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    dir_ = std::string(h) + "/.cache/kiln";
  } else {
    return;
  }
  max_bytes_ = static_cast<uint64_t>(detail::env_int("KILN_CACHE_MAXSIZE"));
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_, ec) || access(dir_.c_str(), W_OK | X_OK) != 0) {
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

std::string DiskCache::entry_name(const std::string& key) {
  return hex(key_hash(key));
}

std::optional<std::string> DiskCache::load(const std::string& key, uint32_t kind) {
  const XXH128_hash_t h = key_hash(key);
  return load_hashed(hex(h), h.low64, h.high64, kind);
}

std::optional<std::string> DiskCache::load_named(const std::string& name, uint32_t kind) {
  // Only a name entry_name makes: it becomes a path.
  if (name.size() != 32 || name.find_first_not_of("0123456789abcdef") != std::string::npos)
    return std::nullopt;
  const uint64_t high = std::stoull(name.substr(0, 16), nullptr, 16);
  const uint64_t low = std::stoull(name.substr(16), nullptr, 16);
  return load_hashed(name, low, high, kind);
}

std::optional<std::string> DiskCache::load_hashed(const std::string& name, uint64_t low,
                                                  uint64_t high, uint32_t kind) {
  if (!enabled_) return std::nullopt;
  const std::string path = dir_ + "/" + name + ".kernel";
  try {
    std::string why;
    std::optional<std::string> payload = read_entry(path, low, high, kind, why);
    if (payload) {
      cache_state().hits.fetch_add(1);
      jit::log("cache", "disk hit ", path);
      return payload;
    }
    if (!why.empty()) reject(path, why);
  } catch (const std::exception& e) {  // memory, say: the kernel is compiled instead
    reject(path, e.what());
  }
  return std::nullopt;
}

// Opens without following a link or waiting on a FIFO, checks the file's type and size against
// its header before reading, and reads only the length the header gives. Returns the payload,
// or nothing with `why` empty (no entry) or saying what is wrong with it.
std::optional<std::string> DiskCache::read_entry(const std::string& path, uint64_t low,
                                                 uint64_t high, uint32_t kind,
                                                 std::string& why) const {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) why = std::string("cannot open: ") + std::strerror(errno);
    return std::nullopt;
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return why = "cannot stat", std::nullopt;
  if (!S_ISREG(st.st_mode)) return why = "not a regular file", std::nullopt;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kHeaderSize || size - kHeaderSize > std::min(max_bytes_, kMaxPayload))
    return why = "size " + std::to_string(size) + " out of range", std::nullopt;
  std::string header(kHeaderSize, '\0');
  if (!read_fully(fd, header.data(), kHeaderSize)) return why = "unreadable", std::nullopt;
  if (std::memcmp(header.data(), kMagic, 8) != 0) return why = "not a kernel file", std::nullopt;
  if (get<uint32_t>(header, 8) != kFormatVersion)
    return why = "format version " + std::to_string(get<uint32_t>(header, 8)), std::nullopt;
  if (get<uint32_t>(header, 12) != kind || get<uint64_t>(header, 16) != low ||
      get<uint64_t>(header, 24) != high)
    return why = "another kernel's key", std::nullopt;
  const uint64_t length = get<uint64_t>(header, 32);
  if (length != size - kHeaderSize)
    return why = "header says " + std::to_string(length) + " payload bytes, file has " +
                 std::to_string(size - kHeaderSize),
           std::nullopt;
  std::string payload(length, '\0');
  if (!read_fully(fd, payload.data(), length)) return why = "truncated", std::nullopt;
  if (get<uint64_t>(header, 40) != XXH3_64bits(payload.data(), payload.size()))
    return why = "checksum mismatch", std::nullopt;
  ::futimens(fd, nullptr);  // recently used, for the eviction order
  return payload;
}

// Deletes a bad entry when it is a file or a link (never a directory or another kind of file,
// which this cache did not make), and counts it.
void DiskCache::reject(const std::string& path, const std::string& why) {
  struct stat st {};
  const bool ours = ::lstat(path.c_str(), &st) == 0 && (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode));
  jit::log("cache", ours ? "deleting" : "skipping", " bad cache entry ", path, ": ", why);
  if (ours) ::unlink(path.c_str());
  cache_state().rejected.fetch_add(1);
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
  const std::string path = dir_ + "/" + hex(h) + ".kernel";
  std::lock_guard<std::mutex> lock(cache_state().write_mutex);
  try {
    if (!write_entry(path, data)) return;
  } catch (const std::exception& e) {
    jit::log("cache", "not storing ", path, ": ", e.what());
    return;
  }
  cache_state().writes.fetch_add(1);
  jit::log("cache", "wrote ", path, " (", data.size(), " bytes)");
  bytes_estimate_ += data.size();
  constexpr int64_t kRescanWrites = 256;
  if (!scanned_ || bytes_estimate_ > max_bytes_ || ++writes_since_scan_ >= kRescanWrites)
    evict_to_cap();
}

// Writes a unique temporary file (mkstemp: created afresh, never through a link) and renames it
// over the entry, so that readers see the old entry or the whole new one. False when it was not
// stored: the directory failing turns the cache off; something in the entry's place that rename
// cannot replace (a directory) only skips this entry.
bool DiskCache::write_entry(const std::string& path, const std::string& data) {
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    disable("cannot create a file in " + dir_ + " (" + std::strerror(errno) + ")");
    return false;
  }
  const bool written = write_fully(fd, data.data(), data.size());
  const bool closed = ::close(fd) == 0;
  if (!written || !closed) {
    ::unlink(tmp.c_str());
    disable("writing " + tmp + " failed");
    return false;
  }
  ::chmod(tmp.c_str(),
          0644);  // mkstemp's 0600 would hide entries from other users of a shared cache
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    if (err == EISDIR || err == ENOTEMPTY || err == EEXIST) {
      jit::log("cache", "not storing ", path, ": a directory is in its place");
      return false;
    }
    disable("renaming " + tmp + " failed (" + std::strerror(err) + ")");
    return false;
  }
  return true;
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
  // Regular files only, their own size (a link is not followed), and an iteration that reports
  // errors rather than throwing them.
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& e = *it;
    std::error_code fe;
    if (e.path().extension() != ".kernel" || !e.is_regular_file(fe) || e.is_symlink(fe)) continue;
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
  return {cache_state().hits.load(), cache_state().writes.load(), cache_state().rejected.load()};
}

namespace {
// The convolution chooser's measured choices (lib/ops/conv.h) live in this cache too, read with
// the same checks as kernels; a payload kind beside cache.h's.
constexpr uint32_t kConvChoice = 3;
}  // namespace

void register_conv_choices() {
  detail::conv_choice_store() = {[](const std::string& key) {
                                   return DiskCache::instance().load(key, kConvChoice).value_or("");
                                 },
                                 [](const std::string& key, const std::string& choice) {
                                   DiskCache::instance().store(key, kConvChoice, choice);
                                 }};
}

}  // namespace kiln::fuser
