// Checkpoints: safetensors files (kiln::save / kiln::load) and the state_dict of modules.
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the
// tensors' bytes, offsets counted from the end of the header. Nothing in a file is trusted: the
// reader checks every field and that the tensors tile the data exactly (no gaps, no overlaps)
// before it makes a single tensor, so a bad file fails whole, naming the file and the problem.
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <unordered_set>

#include "kiln/autograd.h"
#include "kiln/nn.h"
#include "kiln/optim.h"
#include "kiln/serialize.h"
#include "lib/tensor_impl.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors stores little-endian bytes; kiln copies host memory as is");

namespace kiln {

using detail::describe;
using detail::shape_str;
using Json = nlohmann::ordered_json;  // keeps the header's order: tensors load in file order

namespace {

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypeNames[] = {
    {kBool, "BOOL"}, {kInt32, "I32"}, {kInt64, "I64"}, {kFloat32, "F32"}, {kFloat64, "F64"}};

const char* safetensors_dtype(DType t) {
  for (const DTypeName& d : kDTypeNames)
    if (d.dtype == t) return d.name;
  KILN_FAIL("save: dtype ", dtype_name(t), " has no safetensors name");
}

std::optional<DType> kiln_dtype(const std::string& name) {
  for (const DTypeName& d : kDTypeNames)
    if (name == d.name) return d.dtype;
  return std::nullopt;
}

// The largest header the reader accepts, as Python's safetensors (100 MB): a corrupt length must
// not make it allocate gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

// One tensor as the header describes it, after its fields were checked.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

// Reads the header's entry for `name`; `where` prefixes every error ("load: <file>").
Entry parse_entry(const std::string& where, const std::string& name, const Json& value,
                  uint64_t data_size) {
  const std::string what = where + ": tensor '" + name + "'";
  KILN_CHECK(value.is_object(), what, ": expected an object {dtype, shape, data_offsets}, got ",
             value.dump());
  for (const char* field : {"dtype", "shape", "data_offsets"})
    KILN_CHECK(value.contains(field), what, ": missing field '", field, "'");
  const Json& dtype = value["dtype"];
  KILN_CHECK(dtype.is_string(), what, ": dtype must be a string, got ", dtype.dump());
  std::optional<DType> dt = kiln_dtype(dtype.get<std::string>());
  KILN_CHECK(dt.has_value(), what, ": unsupported dtype ", dtype.dump(),
             " (kiln reads BOOL, I32, I64, F32, F64)");
  const Json& shape = value["shape"];
  KILN_CHECK(shape.is_array(), what, ": shape must be an array, got ", shape.dump());
  Entry e{name, *dt, {}, 0, 0};
  uint64_t bytes = element_size(*dt);
  for (const Json& d : shape) {
    KILN_CHECK(d.is_number_unsigned(), what, ": shape ", shape.dump(),
               " must hold non-negative integers");
    const uint64_t n = d.get<uint64_t>();
    KILN_CHECK(n <= static_cast<uint64_t>(INT64_MAX) && !__builtin_mul_overflow(bytes, n, &bytes),
               what, ": shape ", shape.dump(), " overflows");
    e.shape.push_back(static_cast<int64_t>(n));
  }
  const Json& offsets = value["data_offsets"];
  KILN_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                 offsets[1].is_number_unsigned(),
             what, ": data_offsets must be two non-negative integers, got ", offsets.dump());
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  KILN_CHECK(e.begin <= e.end && e.end <= data_size, what, ": data_offsets [", e.begin, ", ", e.end,
             "] out of range: the data section holds ", data_size, " bytes");
  KILN_CHECK(e.end - e.begin == bytes, what, ": shape ", shape_str(e.shape), " of ",
             dtype.get<std::string>(), " needs ", bytes, " bytes, its data_offsets span ",
             e.end - e.begin);
  return e;
}

Metadata parse_metadata(const std::string& where, const Json& value) {
  KILN_CHECK(value.is_object(), where, ": ", kMetadataKey, " must be an object, got ",
             value.dump());
  Metadata out;
  for (const auto& [key, v] : value.items()) {
    KILN_CHECK(v.is_string(), where, ": ", kMetadataKey, " value of '", key,
               "' must be a string, got ", v.dump());
    out[key] = v.get<std::string>();
  }
  return out;
}

// The tensors must tile [0, data_size) exactly, as the format requires: no byte read twice
// (overlap) and none left unexplained (a gap).
void check_tiling(const std::string& where, std::vector<const Entry*> entries, uint64_t data_size) {
  std::sort(entries.begin(), entries.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry* e : entries) {
    KILN_CHECK(e->begin >= covered, where, ": tensor '", e->name, "' [", e->begin, ", ", e->end,
               ") overlaps tensor '", previous ? previous->name : "", "' (ending at ", covered,
               ")");
    KILN_CHECK(e->begin == covered, where, ": bytes [", covered, ", ", e->begin,
               ") of the data section belong to no tensor");
    covered = e->end;
    previous = e;
  }
  KILN_CHECK(covered == data_size, where, ": bytes [", covered, ", ", data_size,
             ") of the data section belong to no tensor");
}

Tensor make_tensor(const std::string& where, const Entry& e, const char* data) {
  const char* bytes = data + e.begin;
  const size_t n = e.end - e.begin;
  if (e.dtype == kBool)  // any other byte in a C++ bool is undefined behaviour when read
    for (size_t i = 0; i < n; ++i)
      KILN_CHECK(static_cast<unsigned char>(bytes[i]) <= 1, where, ": BOOL tensor '", e.name,
                 "' holds byte ", static_cast<int>(static_cast<unsigned char>(bytes[i])),
                 " (must be 0 or 1)");
  Tensor t = detail::make_empty(e.shape, e.dtype);
  if (n != 0) std::memcpy(t.raw_data_ptr(), bytes, n);
  return t;
}

// A contiguous host copy of t's values (t itself when it is one already).
Tensor host_contiguous(const Tensor& t) {
  Tensor h = t.detach();
  if (h.device() != kCPU) h = h.to(kCPU);
  return h.contiguous();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "load: can't open '", path, "': ", std::strerror(errno));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  KILN_CHECK(!in.bad(), "load: error reading '", path, "'");
  return std::move(bytes).str();
}

// Prefixes an error from `body` with the file it concerns.
template <typename F>
auto naming_file(const char* op, const std::string& path, F body) {
  try {
    return body();
  } catch (const Error& e) {
    throw Error(detail::str_cat(op, ": '", path, "': ", e.what()));
  }
}

// The module's tensors by path, in torch's order (see state_dict); `detach` gives the detached
// handles state_dict hands out, otherwise the module's own (for load_state_dict's writes).
StateDict walk_state(const nn::Module& root, bool detach) {
  StateDict out;
  std::unordered_set<const nn::Module*> seen;  // a shared submodule is listed once, as in torch
  std::vector<std::pair<std::string, const nn::Module*>> stack{{"", &root}};
  while (!stack.empty()) {
    auto [prefix, module] = stack.back();
    stack.pop_back();
    if (!seen.insert(module).second) continue;
    for (const auto& named : {module->named_parameters(false), module->named_buffers(false)})
      for (const auto& [name, t] : named)
        if (t.defined()) out.insert(prefix + name, detach ? t.detach() : t);
    auto kids = module->named_children();
    for (auto it = kids.rbegin(); it != kids.rend(); ++it)
      stack.emplace_back(prefix + it->first + ".", it->second.get());
  }
  return out;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "'" : ", '") + n + "'";
  return out;
}

}  // namespace

std::string save_to_string(const StateDict& tensors, const Metadata& metadata) {
  Json header = Json::object();
  std::vector<Tensor> hosts;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    KILN_CHECK(name != kMetadataKey, "save: '", kMetadataKey, "' can't name a tensor");
    KILN_CHECK(t.defined(), "save: tensor '", name, "' is undefined");
    Tensor h = host_contiguous(t);
    const uint64_t n = static_cast<uint64_t>(h.numel()) * element_size(h.dtype());
    header[name] = {{"dtype", safetensors_dtype(h.dtype())},
                    {"shape", h.sizes()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
    hosts.push_back(std::move(h));
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::string text = header.dump();
  // The data starts 8-byte aligned (padded with spaces, as Python's writer does), so a reader
  // that maps the file can use the tensors in place.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t length = text.size();
  std::memcpy(out.data(), &length, 8);
  out.reserve(8 + text.size() + offset);
  out += text;
  for (const Tensor& h : hosts)
    out.append(static_cast<const char*>(h.raw_data_ptr()), h.numel() * element_size(h.dtype()));
  return out;
}

StateDict load_from_bytes(const void* data, size_t size, const std::string& source,
                          Metadata* metadata) {
  const std::string where = "load: " + source;
  const char* bytes = static_cast<const char*>(data);
  KILN_CHECK(size >= 8, where, ": truncated: ", size, " bytes, less than the 8-byte header length");
  uint64_t length;
  std::memcpy(&length, bytes, 8);
  KILN_CHECK(length <= size - 8, where, ": the header length ", length,
             " is longer than the rest of the file (", size - 8, " bytes): truncated or corrupt");
  KILN_CHECK(length <= kMaxHeaderBytes, where, ": header of ", length, " bytes exceeds the ",
             kMaxHeaderBytes, "-byte limit");
  Json header;
  try {
    header = Json::parse(bytes + 8, bytes + 8 + length);
  } catch (const Json::exception& e) {
    KILN_FAIL(where, ": the header is not valid JSON: ", e.what());
  }
  KILN_CHECK(header.is_object(), where, ": the header must be a JSON object");
  const char* payload = bytes + 8 + length;
  const uint64_t data_size = size - 8 - length;
  std::vector<Entry> entries;
  Metadata meta;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey)
      meta = parse_metadata(where, value);
    else
      entries.push_back(parse_entry(where, name, value, data_size));
  }
  std::vector<const Entry*> order;
  for (const Entry& e : entries) order.push_back(&e);
  check_tiling(where, order, data_size);
  StateDict out;
  for (const Entry& e : entries) out.insert(e.name, make_tensor(where, e, payload));
  if (metadata) *metadata = std::move(meta);
  return out;
}

void save(const std::string& path, const StateDict& tensors, const Metadata& metadata) {
  const std::string bytes = save_to_string(tensors, metadata);
  // Written beside the target and renamed over it: readers see the old file or the new one.
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    KILN_CHECK(out.good(), "save: can't create '", temp, "': ", std::strerror(errno));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out.good()) {
      std::remove(temp.c_str());
      KILN_FAIL("save: error writing '", temp, "'");
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(temp.c_str());
    KILN_FAIL("save: can't rename '", temp, "' to '", path, "': ", std::strerror(err));
  }
}

StateDict load(const std::string& path, Metadata* metadata) {
  const std::string bytes = read_file(path);
  return load_from_bytes(bytes.data(), bytes.size(), "'" + path + "'", metadata);
}

void save(const std::string& path, const nn::Module& module) {
  save(path, module.state_dict());
}
void save(const std::string& path, const optim::Optimizer& optimizer) {
  save(path, optimizer.state_dict());
}
void load(const std::string& path, nn::Module& module, bool strict) {
  StateDict dict = load(path);
  naming_file("load", path, [&] { module.load_state_dict(dict, strict); });
}
void load(const std::string& path, optim::Optimizer& optimizer) {
  StateDict dict = load(path);
  naming_file("load", path, [&] { optimizer.load_state_dict(dict); });
}

namespace nn {

StateDict Module::state_dict() const {
  return walk_state(*this, true);
}

LoadStateDictResult Module::load_state_dict(const StateDict& dict, bool strict) {
  const StateDict own = walk_state(*this, false);
  LoadStateDictResult result;
  for (const auto& [key, t] : own)
    if (!dict.contains(key)) result.missing_keys.push_back(key);
  for (const auto& [key, t] : dict)
    if (!own.contains(key)) result.unexpected_keys.push_back(key);
  const std::string where = "load_state_dict (" + name() + ")";
  KILN_CHECK(!strict || result.unexpected_keys.empty(), where, ": unexpected keys ",
             join(result.unexpected_keys), ": the module has no parameter or buffer of that name");
  KILN_CHECK(!strict || result.missing_keys.empty(), where, ": missing keys ",
             join(result.missing_keys));
  // Every check before the first write: a failed load leaves the module as it was.
  for (const auto& [key, t] : own) {
    if (!dict.contains(key)) continue;
    const Tensor& src = dict.at(key);
    KILN_CHECK(src.defined(), where, ": '", key, "' is undefined");
    KILN_CHECK(src.sizes() == t.sizes(), where, ": size mismatch for '", key,
               "': the state_dict has ", describe(src), ", the module ", describe(t));
  }
  NoGradGuard no_grad;
  for (const auto& [key, t] : own)
    if (dict.contains(key)) Tensor(t).copy_(dict.at(key));
  return result;
}

}  // namespace nn
}  // namespace kiln
