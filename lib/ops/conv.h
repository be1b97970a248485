// Internals of the convolution ops (lib/ops/conv.cpp) that tests and tools reach: the algorithm
// each pass runs and the chooser's memory of measured choices.
#pragma once

#include <string>

namespace kiln::detail {

// How a convolution pass is computed.
//   Im2col: im2col (or col2im) and one GEMM per group with the batch folded into it.
//   WeightGrad: the forward pass computed as the weight gradient of a convolution whose images
//     are the input's channels (Theano's GpuCorrMM choice for kernels large next to the output);
//     forward only, groups == 1.
//   OneDNN: oneDNN's convolution primitive (float32).
// Auto measures the available ones once per problem and remembers the fastest; Gemm takes the
// GEMM formulation that Theano's rule picks (KILN_CONV_ALGO=im2col).
enum class ConvAlgo { Auto, Gemm, Im2col, WeightGrad, OneDNN };
const char* conv_algo_name(ConvAlgo a);

// Overrides KILN_CONV_ALGO for the process; Auto returns to the environment's setting.
void set_conv_algo(ConvAlgo a);
// Forgets every measured choice.
void clear_conv_choices();
// The algorithm the last convolution pass computed on this thread ran.
ConvAlgo last_conv_algo();

}  // namespace kiln::detail
