// Writes the fuzz targets' seed corpora from kiln itself, so that they follow the formats:
//   kiln_fuzz_seeds tests/fuzz/corpus
// corpus/jit_load: a saved jit::Function (a traced matmul, relu and sum with a captured weight)
// and broken copies of it; corpus/kernel_cache: a real kernel cache entry (the object code of a
// fused elementwise kernel) and broken copies; corpus/safetensors: a checkpoint of every dtype
// with metadata, and broken copies. Each jit_load and kernel_cache seed starts with the target's
// flags byte (see the targets' comments); safetensors seeds are plain files.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "jit/serialize.h"
#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "kiln/serialize.h"

namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_seed(const fs::path& dir, const std::string& name, char flags,
                const std::string& bytes) {
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.put(flags);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string flipped(std::string bytes, size_t at) {
  bytes[at] = static_cast<char>(bytes[at] ^ 0x5a);
  return bytes;
}

// Runs a small traced function once (compiling its kernels into the cache under `work`) and
// returns its saved file.
std::string saved_function(const fs::path& work) {
  using namespace kiln;
  manual_seed(1);
  Tensor w = randn({4, 3});
  jit::Function f = jit::trace(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{relu(in[0].matmul(w) * 2.0 + 1.0).sum({0})};
      },
      {randn({5, 4})});
  f({randn({5, 4})});
  const fs::path path = work / "function.kiln";
  f.save(path.string());
  return read_file(path);
}

void jit_load_seeds(const fs::path& dir, const std::string& file) {
  const size_t header = 32;
  write_seed(dir, "valid", 0, file);
  write_seed(dir, "truncated_header", 0, file.substr(0, header - 4));
  write_seed(dir, "truncated_payload", 0, file.substr(0, file.size() / 2));
  write_seed(dir, "bad_magic", 0, flipped(file, 0));
  write_seed(dir, "bad_checksum", 0, flipped(file, file.size() - 1));
  // Resealed (flags bit 0): past the checksum, into the parser.
  write_seed(dir, "resealed_truncated_payload", 1,
             file.substr(0, header + (file.size() - header) / 2));
  std::string bad_meta = file;
  const size_t at = bad_meta.find("kiln-function");
  if (at != std::string::npos) bad_meta[at] = 'K';
  write_seed(dir, "resealed_bad_description", 1, bad_meta);
}

void kernel_cache_seeds(const fs::path& dir, const fs::path& cache) {
  // The smallest kernel the function compiled: a real object file behind a real header.
  std::string entry;
  for (const auto& f : fs::directory_iterator(cache))
    if (f.path().extension() == ".kernel" && (entry.empty() || f.file_size() < entry.size()))
      entry = read_file(f.path());
  if (entry.empty()) {
    std::fprintf(stderr, "kiln_fuzz_seeds: no kernel was written to %s\n", cache.c_str());
    std::exit(1);
  }
  const size_t header = 48;
  write_seed(dir, "valid", 7, entry);        // this target's key, size and checksum
  write_seed(dir, "another_key", 0, entry);  // as written: another kernel's key
  write_seed(dir, "truncated", 7, entry.substr(0, entry.size() / 2));
  write_seed(dir, "short_header", 7, entry.substr(0, header - 8));
  write_seed(dir, "empty_payload", 7, entry.substr(0, header));
  write_seed(dir, "bad_size", 5, entry.substr(0, entry.size() - 1));
  write_seed(dir, "bad_checksum", 3, flipped(entry, entry.size() - 1));
  write_seed(dir, "bad_version", 6, flipped(entry, 8));
}

void safetensors_seeds(const fs::path& dir) {
  using namespace kiln;
  StateDict d;
  d.insert("layers.0.weight", arange(6, kFloat32).reshape({2, 3}));
  d.insert("f64", from_vector<double>({0.5, -2.0}));
  d.insert("i64", from_vector<int64_t>({-1, 7}));
  d.insert("i32", from_vector<int32_t>({3}));
  d.insert("b", from_vector(std::vector<bool>{true, false}));
  d.insert("scalar", scalar_tensor(1.5, kFloat64));
  d.insert("empty", zeros({0, 2}));
  const std::string file = save_to_string(d, {{"format", "pt"}});
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir / name, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  write("valid", file);
  write("truncated", file.substr(0, file.size() - 5));
  write("short_length", file.substr(0, 6));
  write("bad_json", flipped(file, 9));
  std::string bad_offsets = file;
  const size_t at = bad_offsets.find("[0,24]");
  if (at != std::string::npos) bad_offsets.replace(at, 6, "[0,28]");
  write("bad_offsets", bad_offsets);
  StateDict linear;
  linear.insert("weight", zeros({3, 2}));
  linear.insert("bias", ones({3}));
  write("linear", save_to_string(linear));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kiln_fuzz_seeds <corpus directory>\n");
    return 2;
  }
  const fs::path corpus = argv[1];
  const fs::path work = fs::temp_directory_path() / ("kiln_fuzz_seeds." + std::to_string(getpid()));
  fs::create_directories(work / "cache");
  // Before kiln's first use: the cache directory is read once.
  setenv("KILN_CACHE_DIR", (work / "cache").c_str(), 1);
  const std::string function = saved_function(work);
  for (const char* target : {"jit_load", "kernel_cache", "safetensors"}) {
    fs::remove_all(corpus / target);
    fs::create_directories(corpus / target);
  }
  jit_load_seeds(corpus / "jit_load", function);
  kernel_cache_seeds(corpus / "kernel_cache", work / "cache");
  safetensors_seeds(corpus / "safetensors");
  fs::remove_all(work);
  return 0;
}
