// Internals of the convolution ops (lib/ops/conv.cpp) that tests and tools reach: the algorithm
// each pass runs and the chooser's memory of measured choices; the argument and output-size rules
// the pooling files share.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/tensor.h"

namespace kiln::detail {

// The sizes of one convolution: input [N, C, H, W], weight [O, C / groups, kH, kW], output
// [N, O, oH, oW]; input pixel (oh * sH - pH + i * dH) feeds output row oh through kernel row i.
struct ConvGeom {
  int64_t N, C, H, W, O, kH, kW, oH, oW, sH, sW, pH, pW, dH, dW, groups;
  int64_t Cg() const { return C / groups; }
  int64_t Og() const { return O / groups; }
  int64_t K() const { return Cg() * kH * kW; }
  int64_t L() const { return oH * oW; }
};

// How a convolution pass is computed.
//   Im2col: im2col (or col2im) and one GEMM per group with the batch folded into it.
//   WeightGrad: the forward pass computed as the weight gradient of a convolution whose images
//     are the input's channels (Theano's GpuCorrMM choice for kernels large next to the output);
//     forward only, groups == 1.
//   OneDNN: oneDNN's convolution primitive (float32).
//   Im2colL2: CUDA only; im2col in chunks of images whose columns fit in half the device's L2,
//     with one GEMM a group strided-batched over the chunk's images, reading and writing the
//     images in their NCHW layout (lib/ops/conv_cuda.h, Layout::PerImage).
// Auto measures the available ones once per problem and remembers the fastest; Gemm takes the
// GEMM formulation that Theano's rule picks (KILN_CONV_ALGO=im2col; im2col_l2 forces Im2colL2).
enum class ConvAlgo { Auto, Gemm, Im2col, WeightGrad, OneDNN, Im2colL2 };
const char* conv_algo_name(ConvAlgo a);

// Overrides KILN_CONV_ALGO for the process; Auto returns to the environment's setting.
void set_conv_algo(ConvAlgo a);
// Forgets every measured choice in memory (stored ones are read back on the next use).
void clear_conv_choices();
// Whether choices are read from and written to the ConvChoiceStore (on by default; off: the
// chooser measures each problem once per process, for tests of the measuring itself).
void set_conv_choices_on_disk(bool on);
// The algorithm the last convolution pass computed on this thread ran.
ConvAlgo last_conv_algo();

// Where measured choices are kept between processes: the kernel cache's directory (fuser/cache.cpp
// fills these in when exec/init.cpp runs at load; lib/ does not depend on fuser/). load returns ""
// when no valid entry is stored under the key; null entries keep choices in memory only.
struct ConvChoiceStore {
  std::string (*load)(const std::string& key) = nullptr;
  void (*store)(const std::string& key, const std::string& choice) = nullptr;
};
ConvChoiceStore& conv_choice_store();

// A spatial argument of op with one value per spatial dim (a single value applies to each), each
// at least min (lib/ops/conv.cpp).
Shape spatial_arg(const char* op, const char* name, const Shape& v, size_t dims, int64_t min);

// torch's pooling output size along a dim of `in` values: kernel k, stride s, padding p,
// dilation d; floor or ceil division, where a ceil window must still start inside the input or
// its left padding (lib/ops/pool_norm.cpp).
int64_t pool_output_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode);

}  // namespace kiln::detail
