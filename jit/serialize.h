// Saving and loading a Graph, its tensor constants and a metadata blob in a checked binary file.
//
// The format is versioned and fully checked on load.
//
// Layout (all integers little-endian):
//   header, 32 bytes: magic "KILNGRPH", u32 format version (1), u32 flags (0),
//                     u64 payload length, u64 XXH3-64 of the payload
//   payload: graph block, u32 constant count + constants, u64 metadata length + metadata bytes
//   graph block: u32 input count + input types, u64 node count + nodes (input nodes excluded;
//                they are the inputs), u32 output count + u64 value references
//   node: op name (u32 length + bytes), u32 attr count + tagged attrs, u32 input count + u64
//         value references (0: absent, k: the k-th value defined so far, counting from 1), u32
//         output count + types, u8 has-subgraph, then the subgraph's block inline when it has one
//   type: u8 dtype, u8 device type, u32 device index, u8 wrapped, u32 rank + i64 sizes
//   constant: u8 defined; when defined: u8 dtype, u8 device type, u32 device index, u32 rank +
//             i64 sizes, u64 byte count + the contiguous data
//
// A value may be referenced only after its definition and only from its own graph or a graph
// nested in it. Loading never trusts the file: any truncation, corruption or inconsistency throws
// kiln::Error naming the file, the byte offset and what was being read.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "jit/ir.h"
#include "kiln/tensor.h"

namespace kiln::jit {

struct LoadedGraph {
  std::unique_ptr<Graph> graph;
  std::vector<Tensor> constants;
  std::string metadata;
};

// Writes `g`, tensor constants (e.g. captured parameters, their data included) and an opaque
// metadata blob. The file is written next to `path` and renamed into place, so readers never see a
// partial file.
void save_graph(const std::string& path, const Graph& g, const std::vector<Tensor>& constants,
                const std::string& metadata);
std::string serialize_graph(const Graph& g, const std::vector<Tensor>& constants,
                            const std::string& metadata);

// Constants come back on the CPU, or on their saved device when it is a CUDA device available here.
LoadedGraph load_graph(const std::string& path);
// `source_name` names the bytes in error messages.
LoadedGraph deserialize_graph(const std::string& bytes, const std::string& source_name);

// Rewrites the header's payload length and checksum to match the payload after it; lets tests
// reach the parser with corrupted payloads that the checksum would otherwise reject.
void reseal_for_testing(std::string& bytes);

}  // namespace kiln::jit
