// The on-disk kernel cache: compiled kernels (object files on the CPU) kept between processes.
//
// Directory: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln; KILN_CACHE=0 turns it
// off. One file per kernel, named by the 128-bit hash of its full key (kernel program, layout,
// target and CPU features, LLVM and kiln versions), laid out as
//   magic "KILNKERN" | format version (u32) | payload kind (u32) | key hash (16 bytes)
//   | payload size (u64) | XXH3-64 of the payload (u64) | payload
// Files are written to a temporary name and renamed, so readers never see half a file. An entry
// is opened without following links or blocking (a FIFO), must be a regular file whose size is
// what its header says (and within the cap) before anything is read, and is read only up to that
// length. A file whose header, size or checksum does not match is deleted (a link too; a
// directory or FIFO in its place is skipped) and the kernel recompiled: nothing from the cache
// runs unchecked, and no entry throws or hangs. The directory is capped at KILN_CACHE_MAXSIZE bytes
// (default 1 GiB; a size such as 512M) by deleting the least recently used files; a hit refreshes a
// file's time. A directory that is unwritable, a file or a link loop turns the disk cache off with
// one warning. Besides objects and cubins, small entries name other entries (kCpuEntryByBuild).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

namespace kiln::fuser {

struct DiskCacheStats {
  int64_t hits = 0;
  int64_t writes = 0;
  int64_t rejected = 0;  // bad entries deleted
};

class DiskCache {
 public:
  // The process's cache, configured from the environment on first use.
  static DiskCache& instance();

  bool enabled() const { return enabled_; }
  const std::string& directory() const { return dir_; }
  // The payload stored under `key` (any bytes; hashed to name the file), if a valid one is there.
  std::optional<std::string> load(const std::string& key, uint32_t kind);
  // The name of the entry filed under `key` (its hash, 32 hex digits), for an entry that refers
  // to another (kCpuEntryByBuild), and the payload of the entry with that name. The referred
  // entry's header must carry that hash and `kind`, as in load.
  static std::string entry_name(const std::string& key);
  std::optional<std::string> load_named(const std::string& name, uint32_t kind);
  void store(const std::string& key, uint32_t kind, const std::string& payload);

 private:
  DiskCache();
  std::optional<std::string> load_hashed(const std::string& name, uint64_t low, uint64_t high,
                                         uint32_t kind);
  std::optional<std::string> read_entry(const std::string& path, uint64_t low, uint64_t high,
                                        uint32_t kind, std::string& why) const;
  void reject(const std::string& path, const std::string& why);
  bool write_entry(const std::string& path, const std::string& data);
  void disable(const std::string& why);
  // Counts the directory's entries, and removes the least recently written ones past the cap.
  void evict_to_cap();

  std::atomic<bool> enabled_{false};  // read by lookups without the write mutex
  std::string dir_;
  uint64_t max_bytes_ = uint64_t{1} << 30;
  // The directory's size as of the last scan plus this process's writes since (under the write
  // mutex): a store scans the directory only when this passes the cap, or every kRescanWrites
  // writes (for what other processes wrote), not each time.
  bool scanned_ = false;
  uint64_t bytes_estimate_ = 0;
  int64_t writes_since_scan_ = 0;
};

// What the process's disk cache did so far (reading this does not set the cache up).
DiskCacheStats disk_cache_stats();

// Keeps lib/ops/conv.h's measured convolution choices in this cache (exec/init.cpp calls it once).
void register_conv_choices();

// Payload kinds.
constexpr uint32_t kCpuObject = 1;
constexpr uint32_t kCudaBinary = 2;  // a cubin, or PTX (fuser/codegen/cuda/cuda_kernel.h)
// The entry_name of a CPU kernel's kCpuObject entry, filed under the kernel's structure, the
// target and the build of kiln and LLVM (fuser/codegen/llvm/kernel_cache.cpp).
constexpr uint32_t kCpuEntryByBuild = 4;

}  // namespace kiln::fuser
