// Checkpoints: named tensors saved to and loaded from safetensors files
// (https://huggingface.co/docs/safetensors), the format Python's `safetensors` package, PyTorch
// and the Hugging Face tools read and write; and the random generator's state, so that a training
// run resumed from a checkpoint draws the numbers the uninterrupted run would have drawn.
//
// A checkpoint of a model and its optimizer is one StateDict with prefixed names, for example
//   StateDict all;
//   for (auto& [k, v] : model->state_dict()) all.insert("model." + k, v);
//   for (auto& [k, v] : adam.state_dict()) all.insert("optim." + k, v);
//   all.insert("rng", kiln::get_rng_state());
//   kiln::save("run.safetensors", all);
#pragma once

#include <cstddef>
#include <map>
#include <string>

#include "kiln/state_dict.h"
#include "kiln/tensor.h"

namespace kiln {
namespace nn {
class Module;
}
namespace optim {
class Optimizer;
}

// String pairs stored in the file's "__metadata__" header entry.
using Metadata = std::map<std::string, std::string>;

// Writes `tensors` (any device, layout or pending state: each is read as a contiguous host copy)
// to `path` as safetensors: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the raw little-endian bytes.
// The file is written to a temporary name and renamed, so a crash never leaves half a checkpoint.
// Dtypes map as bool BOOL, int32 I32, int64 I64, float32 F32, float64 F64.
void save(const std::string& path, const StateDict& tensors, const Metadata& metadata = {});
// Reads a safetensors file into host tensors, in the header's order. A malformed file (truncated,
// a header longer than the file, bad JSON, offsets out of range, overlapping or leaving gaps, a
// dtype kiln does not have, a shape whose byte count differs from its offsets) raises kiln::Error
// naming the file and the problem. `metadata`, when given, receives "__metadata__".
StateDict load(const std::string& path, Metadata* metadata = nullptr);

// A module's or optimizer's state_dict() to a file, and back into an existing one (as libtorch's
// torch::save(module, path) / torch::load(module, path)). A load that fails (a bad file, or a name
// or shape the module does not have under strict) raises kiln::Error naming the file, and leaves
// the module or optimizer unchanged.
void save(const std::string& path, const nn::Module& module);
void save(const std::string& path, const optim::Optimizer& optimizer);
void load(const std::string& path, nn::Module& module, bool strict = true);
void load(const std::string& path, optim::Optimizer& optimizer);

// The same on bytes in memory; `source` names them in error messages.
std::string save_to_string(const StateDict& tensors, const Metadata& metadata = {});
StateDict load_from_bytes(const void* data, size_t size, const std::string& source,
                          Metadata* metadata = nullptr);

// The state of the process-wide generator that manual_seed seeds (and every random factory,
// dropout and randperm draws from): an int64 tensor of the Mersenne Twister's words. torch's
// get_rng_state returns a uint8 tensor, kiln has no uint8: the state is its own format, valid
// only for set_rng_state of kiln. set_rng_state raises kiln::Error on a tensor that is not one.
Tensor get_rng_state();
void set_rng_state(const Tensor& state);

}  // namespace kiln
