// Linear-algebra ops (mm, bmm, matmul, linear, addmm): oneDNN's sgemm for float32, a blocked loop
// else.
//
// Every op reduces to one driver, gemm_into: C[b] = beta * C[b] + alpha * A[b] @ B[b] over a batch
// shape whose dims broadcast (stride 0) on either operand. C is always a fresh contiguous tensor
// that the caller has pre-filled with the (broadcast) bias when beta != 0, so a bias add folds into
// the GEMM instead of taking a separate pass.
//
// Operand layouts. sgemm reads a row-major matrix ('N', rows `ld` elements apart) or the transpose
// of one ('T'); an operand whose last two dims fit neither (a general strided or expanded view) is
// copied to contiguous first. The loop kernel reads A at any strides but needs B's rows
// unit-strided so that its inner loop vectorizes. When B is the same matrix for every batch (a 2-D
// weight) and A's batch and row dims merge into one strided dim, the batch folds into M: one large
// GEMM instead of many small ones.
//
// The loop kernel (float64 and integers) is cache-blocked: each thread owns a band of output rows
// and, for a tile of K x N of B that stays in L2, streams each of its rows through it
// (C[i, j-tile] += a_ik * B[k, j-tile]), so the innermost loop is a unit-stride axpy. Integers
// accumulate in the unsigned type of the same width, so overflow wraps as it does in torch instead
// of being undefined.
//
// In lazy mode (lib/lazy.h) each op records one node once its checks and output shape are done;
// the node stays a library call (the executor runs the op itself).
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <type_traits>
#include <vector>

#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "lib/autograd.h"
#include "lib/broadcast.h"
#include "lib/cuda_blas.h"
#include "lib/cuda_tensor.h"
#include "lib/dispatch.h"
#include "lib/lazy.h"
#include "lib/loops.h"
#include "lib/op_registry.h"
#include "lib/op_table.h"
#include "lib/ops/gemm.h"
#include "lib/parallel.h"
#include "lib/tensor_impl.h"

namespace kiln {

using detail::broadcasts_to;
using detail::describe;
using detail::DTypeRule;
using detail::OpKind;
using detail::shape_str;

namespace {

using detail::Attrs;
using Inputs = std::vector<Tensor>;

const detail::OpDef& def_linalg(const char* name, int arity, detail::Invoke invoke,
                                std::vector<std::string> attr_names = {}) {
  return detail::register_op(
      {name, OpKind::Linalg, arity, DTypeRule::Same, false, invoke, std::move(attr_names)});
}
detail::OpHandle mm_def;
detail::OpHandle bmm_def;
detail::OpHandle matmul_def;
detail::OpHandle linear_def;
detail::OpHandle addmm_def;
}  // namespace

// The GEMM-backed ops' entries.
void registration::register_linalg_ops() {
  mm_def.bind(
      def_linalg("mm", 2, [](const Inputs& in, const Attrs&) { return Inputs{mm(in[0], in[1])}; }));
  bmm_def.bind(def_linalg(
      "bmm", 2, [](const Inputs& in, const Attrs&) { return Inputs{bmm(in[0], in[1])}; }));
  matmul_def.bind(def_linalg(
      "matmul", 2, [](const Inputs& in, const Attrs&) { return Inputs{matmul(in[0], in[1])}; }));
  // The bias is an absent (undefined) input when there is none.
  linear_def.bind(def_linalg("linear", 3, [](const Inputs& in, const Attrs&) {
    return Inputs{linear(in[0], in[1], in[2])};
  }));
  addmm_def.bind(def_linalg("addmm", 3,
                            [](const Inputs& in, const Attrs& a) {
                              return Inputs{addmm(in[0], in[1], in[2], detail::attr_scalar(a.at(0)),
                                                  detail::attr_scalar(a.at(1)))};
                            },
                            {"beta", "alpha"}));
}

namespace {

// "2x3": the dims of a shape joined by 'x', as torch prints matrix shapes in its errors.
std::string dims_str(const Shape& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "x" : "") + std::to_string(s[i]);
  return s.empty() ? "scalar" : out;
}

void check_input(const Tensor& t, const std::string& op, const char* arg) {
  detail::check_defined(t, op.c_str(), arg);
  KILN_CHECK(t.dtype() != kBool, op, ": not supported for bool tensors (", arg, " is ", describe(t),
             ")");
}

// The dtype an op computes and returns in: the promoted type of its operands.
DType compute_dtype(const std::string& op, const std::vector<Tensor>& operands) {
  DType d = detail::result_type(operands);
  KILN_CHECK(d != kBool, op, ": not supported for bool tensors");
  return d;
}

// How sgemm can read a rows x cols matrix at strides (rs, cs), if it can without a copy.
struct BlasLayout {
  char trans;  // 'N': row-major, 'T': the transpose of a row-major cols x rows matrix
  int64_t ld;
};
std::optional<BlasLayout> blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  if ((cols <= 1 || cs == 1) && (rows <= 1 || rs >= std::max<int64_t>(cols, 1)))
    return BlasLayout{'N', rows <= 1 ? std::max<int64_t>(cols, 1) : rs};
  if ((rows <= 1 || rs == 1) && (cols <= 1 || cs >= std::max<int64_t>(rows, 1)))
    return BlasLayout{'T', cols <= 1 ? std::max<int64_t>(rows, 1) : cs};
  return std::nullopt;
}

// The single stride at which dims [0, count) of (sizes, strides) step as one flattened dim, if
// they do (size-1 dims are ignored; 0 when all are size 1).
std::optional<int64_t> merged_stride(const Shape& sizes, const Shape& strides, size_t count) {
  int64_t stride = -1, expected = 0;
  for (size_t d = count; d-- > 0;) {
    if (sizes[d] == 1) continue;
    if (stride < 0) {
      stride = strides[d];
      expected = strides[d] * sizes[d];
    } else if (strides[d] == expected) {
      expected *= sizes[d];
    } else {
      return std::nullopt;
    }
  }
  return stride < 0 ? 0 : stride;
}

// One operand of a batched product: per-batch element offsets from `base` and matrix strides.
struct Operand {
  const char* base = nullptr;
  std::vector<int64_t> offsets;
  int64_t rs = 0, cs = 0;
};

Operand make_operand(const Tensor& t, const Shape& batch) {
  Operand o;
  o.base = t.impl()->data();
  const size_t nb = batch.size();
  o.rs = t.strides()[nb];
  o.cs = t.strides()[nb + 1];
  int64_t count = detail::shape_numel(batch);
  o.offsets.resize(static_cast<size_t>(count));
  std::vector<int64_t> idx(nb, 0);
  int64_t off = 0;
  for (int64_t i = 0; i < count; ++i) {
    o.offsets[i] = off;
    for (size_t d = nb; d-- > 0;) {  // odometer over the batch dims
      off += t.strides()[d];
      if (++idx[d] < batch[d]) break;
      off -= t.strides()[d] * batch[d];
      idx[d] = 0;
    }
  }
  return o;
}

struct GemmProblem {
  int64_t batches, M, N, K;
  Operand a, b;
  char* c;  // contiguous [batches, M, N]
};

// C = beta * C (beta == 0 writes zeros without reading C, so NaNs there do not survive).
template <typename T>
void scale_output(const Tensor& out, T beta) {
  if (beta == T(1)) return;
  if (beta == T(0)) {
    detail::map_kernel<T, T>([](T) { return T(0); }, out, out);
  } else {
    detail::map_kernel<T, T>([beta](T x) { return T(beta * x); }, out, out);
  }
}

// The type the loop kernel accumulates T in: T itself, or its unsigned twin so overflow wraps.
template <typename T, bool = std::is_integral_v<T>>
struct Accum {
  using type = T;
};
template <typename T>
struct Accum<T, true> {
  using type = std::make_unsigned_t<T>;
};

template <typename T>
void loop_gemm(const GemmProblem& p, T alpha, T beta) {
  using U = typename Accum<T>::type;
  constexpr int64_t kRowBlock = 16, kKBlock = 128, kNBlock = 256;
  const int64_t rows = p.batches * p.M, N = p.N, K = p.K;
  const int64_t grain = std::max<int64_t>(1, detail::kParallelGrain / std::max<int64_t>(1, N * K));
  detail::parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r0 = begin; r0 < end; r0 += kRowBlock) {
      const int64_t r1 = std::min(end, r0 + kRowBlock);
      for (int64_t r = r0; r < r1; ++r) {
        T* c = reinterpret_cast<T*>(p.c) + r * N;
        if (beta == T(0))
          std::fill(c, c + N, T(0));
        else if (beta != T(1))
          for (int64_t j = 0; j < N; ++j) c[j] = T(U(beta) * U(c[j]));
      }
      for (int64_t k0 = 0; k0 < K; k0 += kKBlock) {
        const int64_t k1 = std::min(K, k0 + kKBlock);
        for (int64_t j0 = 0; j0 < N; j0 += kNBlock) {
          const int64_t j1 = std::min(N, j0 + kNBlock);
          for (int64_t r = r0; r < r1; ++r) {
            const int64_t bi = r / p.M, i = r % p.M;
            const T* a = reinterpret_cast<const T*>(p.a.base) + p.a.offsets[bi] + i * p.a.rs;
            const T* bm = reinterpret_cast<const T*>(p.b.base) + p.b.offsets[bi];
            T* __restrict c = reinterpret_cast<T*>(p.c) + r * N;
            int64_t k = k0;
            // Four rows of B per pass over the C segment: a quarter of the loads and stores of C.
            for (; k + 4 <= k1; k += 4) {
              const U a0 = U(alpha) * U(a[k * p.a.cs]), a1 = U(alpha) * U(a[(k + 1) * p.a.cs]);
              const U a2 = U(alpha) * U(a[(k + 2) * p.a.cs]),
                      a3 = U(alpha) * U(a[(k + 3) * p.a.cs]);
              const T* __restrict b0 = bm + k * p.b.rs;
              const T* __restrict b1 = b0 + p.b.rs;
              const T* __restrict b2 = b1 + p.b.rs;
              const T* __restrict b3 = b2 + p.b.rs;
              for (int64_t j = j0; j < j1; ++j)
                c[j] = T(U(c[j]) + a0 * U(b0[j]) + a1 * U(b1[j]) + a2 * U(b2[j]) + a3 * U(b3[j]));
            }
            for (; k < k1; ++k) {
              const U aik = U(alpha) * U(a[k * p.a.cs]);
              const T* __restrict brow = bm + k * p.b.rs;
              for (int64_t j = j0; j < j1; ++j) c[j] = T(U(c[j]) + aik * U(brow[j]));
            }
          }
        }
      }
    }
  });
}

void sgemm_batches(const GemmProblem& p, float alpha, float beta, const BlasLayout& la,
                   const BlasLayout& lb, const char* op) {
  std::atomic<int> failed{0};
  auto one = [&](int64_t bi) {
    dnnl_status_t st = dnnl_sgemm(la.trans, lb.trans, p.M, p.N, p.K, alpha,
                                  reinterpret_cast<const float*>(p.a.base) + p.a.offsets[bi], la.ld,
                                  reinterpret_cast<const float*>(p.b.base) + p.b.offsets[bi], lb.ld,
                                  beta, reinterpret_cast<float*>(p.c) + bi * p.M * p.N, p.N);
    if (st != dnnl_success) failed.store(static_cast<int>(st));
  };
  // Large products parallelize inside sgemm; many small ones parallelize over the batch.
  const int64_t work = p.M * p.N * p.K;
  if (p.batches > 1 && work < 64 * 64 * 64) {
    const int64_t grain = std::max<int64_t>(1, detail::kParallelGrain / std::max<int64_t>(work, 1));
    detail::parallel_for(p.batches, grain, [&](int64_t b, int64_t e) {
      for (int64_t bi = b; bi < e; ++bi) one(bi);
    });
  } else {
    for (int64_t bi = 0; bi < p.batches; ++bi) one(bi);
  }
  KILN_CHECK(failed.load() == 0, op, ": oneDNN sgemm failed with status ", failed.load(),
             " (M=", p.M, ", N=", p.N, ", K=", p.K, ")");
}

// gemm_into on a CUDA device, through cuBLAS's strided-batched GEMM: each operand is read in
// place when its matrices have a layout BLAS reads and its batch dims step by one stride, and
// copied to a contiguous buffer otherwise.
void cuda_gemm_into(const char* op, const Tensor& out, Tensor a, Tensor b, const Shape& batch,
                    DType compute, const Scalar& alpha, const Scalar& beta) {
  KILN_CHECK(compute == kFloat32 || compute == kFloat64, op, ": on ", out.device(),
             " matrix products compute in float32 or float64, not ", dtype_name(compute));
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  const int64_t batches = detail::shape_numel(batch);
  auto operand = [&](Tensor t, int64_t rows, int64_t cols, BlasLayout* layout, int64_t* stride) {
    Shape shape = batch;
    shape.insert(shape.end(), {rows, cols});
    t = t.to(compute).expand(shape);
    for (int attempt = 0;; ++attempt) {
      const auto l = blas_layout(rows, cols, t.stride(-2), t.stride(-1));
      const auto s = merged_stride(t.sizes(), t.strides(), batch.size());
      if (l && s) {
        *layout = *l;
        *stride = *s;
        return t;
      }
      KILN_CHECK(attempt == 0, op, ": internal error: a contiguous operand is not BLAS-readable");
      t = t.contiguous();
    }
  };
  BlasLayout la{}, lb{};
  int64_t sa = 0, sb = 0;
  const Tensor ae = operand(a, M, K, &la, &sa), be = operand(b, K, N, &lb, &sb);
  detail::cuda::gemm(out.device().index, compute, la.trans, lb.trans, M, N, K, alpha.to_double(),
                     ae.impl()->data(), la.ld, sa, be.impl()->data(), lb.ld, sb, beta.to_double(),
                     out.impl()->data(), N, M * N, batches);
}

}  // namespace

// (Declared in lib/ops/gemm.h.)
void detail::gemm_into(const char* op, const Tensor& out, Tensor a, Tensor b, const Shape& batch,
                       DType compute, const Scalar& alpha, const Scalar& beta) {
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  const int64_t batches = detail::shape_numel(batch);
  if (batches == 0 || M == 0 || N == 0) return;
  if (out.device().is_cuda()) {
    cuda_gemm_into(op, out, std::move(a), std::move(b), batch, compute, alpha, beta);
    return;
  }
  if (K == 0) {
    detail::dispatch_numeric(compute, op, [&](auto tag) {
      using T = KILN_TYPE(tag);
      scale_output<T>(out, std::is_floating_point_v<T> ? T(beta.to_double()) : T(beta.to_int()));
    });
    return;
  }
  const bool blas = compute == kFloat32;
  a = a.to(compute);
  b = b.to(compute);
  auto ok_layout = [&](const Tensor& t, bool is_b) {
    int64_t r = t.size(-2), c = t.size(-1), rs = t.stride(-2), cs = t.stride(-1);
    if (blas) return blas_layout(r, c, rs, cs).has_value();
    return !is_b || c <= 1 || cs == 1;
  };
  if (!ok_layout(a, false)) a = a.contiguous();
  if (!ok_layout(b, true)) b = b.contiguous();

  Shape a_shape = batch, b_shape = batch;
  a_shape.insert(a_shape.end(), {M, K});
  b_shape.insert(b_shape.end(), {K, N});
  Tensor ae = a.expand(a_shape), be = b.expand(b_shape);

  GemmProblem p{batches, M, N, K, {}, {}, static_cast<char*>(out.impl()->data())};
  // Fold the batch into M when every batch multiplies by the same B and A's rows merge.
  bool b_shared = true;
  for (size_t d = 0; d < batch.size(); ++d) b_shared &= batch[d] == 1 || be.strides()[d] == 0;
  std::optional<int64_t> row_stride;
  if (batches > 1 && b_shared)
    row_stride = merged_stride(ae.sizes(), ae.strides(), batch.size() + 1);
  if (row_stride && (!blas || blas_layout(batches * M, K, *row_stride, ae.stride(-1)))) {
    Tensor a2 =
        detail::make_view(ae, {batches * M, K}, {*row_stride, ae.stride(-1)}, ae.storage_offset());
    Tensor b2 = detail::make_view(be, {K, N}, {be.stride(-2), be.stride(-1)}, be.storage_offset());
    p.batches = 1;
    p.M = batches * M;
    p.a = make_operand(a2, {});
    p.b = make_operand(b2, {});
  } else {
    p.a = make_operand(ae, batch);
    p.b = make_operand(be, batch);
  }

  if (blas) {
    auto la = blas_layout(p.M, p.K, p.a.rs, p.a.cs);
    auto lb = blas_layout(p.K, p.N, p.b.rs, p.b.cs);
    KILN_CHECK(la && lb, op, ": internal error: operand layout not accepted by sgemm");
    sgemm_batches(p, static_cast<float>(alpha.to_double()), static_cast<float>(beta.to_double()),
                  *la, *lb, op);
    return;
  }
  detail::dispatch_numeric(compute, op, [&](auto tag) {
    using T = KILN_TYPE(tag);
    if constexpr (std::is_floating_point_v<T>) {
      loop_gemm<T>(p, T(alpha.to_double()), T(beta.to_double()));
    } else {
      loop_gemm<T>(p, T(alpha.to_int()), T(beta.to_int()));
    }
  });
}

namespace {

using detail::check_scalar_kind;
using detail::gemm_into;

std::string pair_str(const Tensor& a, const Tensor& b) {
  return describe(a) + " and " + describe(b);
}

}  // namespace

namespace {
// t as a matrix of its last dim's columns. The row count is spelled out: reshape's -1 cannot
// infer it when the columns number 0 (torch rejects that as ambiguous too).
Tensor as_rows(const Tensor& t) {
  const int64_t cols = t.size(-1);
  const int64_t rows = cols == 0
                           ? detail::shape_numel(Shape(t.sizes().begin(), t.sizes().end() - 1))
                           : t.numel() / cols;
  return t.reshape({rows, cols});
}

// A gradient formula reads an operand only for the other operand's gradient (d(a b)/da = b):
// saved are the operands the inputs that require grad need, so in-place writes to the others
// stay allowed, as in torch.
Tensor saved_if(bool needed, const Tensor& t) {
  return needed ? t : Tensor();
}

// Whether m is a transposed contiguous matrix (a weight used as w.t()). Recorded with the
// forward, as the matrix itself may not be saved.
bool is_transposed(const Tensor& m) {
  return !m.is_contiguous() && m.t().is_contiguous();
}

// a @ b, produced transposed when the operand it is the gradient of is_transposed, so that the
// gradient reaches w contiguous instead of through a transposing copy.
Tensor mm_like(const Tensor& a, const Tensor& b, bool transposed) {
  if (transposed) return mm(b.t(), a.t()).t();
  return mm(a, b);
}
}  // namespace

Tensor mm(const Tensor& a, const Tensor& b) {
  const std::string& op = mm_def->name;
  check_input(a, op, "mat1");
  check_input(b, op, "mat2");
  KILN_CHECK(a.dim() == 2, "mm: expected mat1 to be a 2-D matrix, got ", describe(a));
  KILN_CHECK(b.dim() == 2, "mm: expected mat2 to be a 2-D matrix, got ", describe(b));
  KILN_CHECK(a.size(1) == b.size(0), "mm: mat1 and mat2 shapes cannot be multiplied (",
             dims_str(a.sizes()), " and ", dims_str(b.sizes()), "): ", pair_str(a, b));
  DType compute = compute_dtype(op, {a, b});
  Tensor out;
  if (detail::should_record(a, b)) {
    out = detail::lazy_record1(mm_def, {a, b}, {}, {{a.size(0), b.size(1)}, compute});
  } else {
    out = detail::make_empty_on({a.size(0), b.size(1)}, compute, a.device());
    gemm_into("mm", out, a, b, {}, compute, 1, 0);
  }
  if (detail::needs_grad(a, b))
    detail::record(
        "mm", {a, b}, {out},
        {saved_if(detail::requires_grad(b), a), saved_if(detail::requires_grad(a), b)},
        [a_t = is_transposed(a), b_t = is_transposed(b)](const detail::BackwardContext& c) {
          const Tensor &g = c.grad(), &a = c.saved(0), &b = c.saved(1);
          return std::vector<Tensor>{c.needs_grad(0) ? mm_like(g, b.t(), a_t) : Tensor(),
                                     c.needs_grad(1) ? mm_like(a.t(), g, b_t) : Tensor()};
        });
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  const std::string& op = bmm_def->name;
  check_input(a, op, "batch1");
  check_input(b, op, "batch2");
  KILN_CHECK(a.dim() == 3, "bmm: expected batch1 to be a 3-D tensor, got ", describe(a));
  KILN_CHECK(b.dim() == 3, "bmm: expected batch2 to be a 3-D tensor, got ", describe(b));
  KILN_CHECK(a.size(0) == b.size(0), "bmm: batch1 and batch2 must have the same batch size (",
             a.size(0), " vs ", b.size(0), "): ", pair_str(a, b));
  KILN_CHECK(a.size(2) == b.size(1), "bmm: batch1 and batch2 shapes cannot be multiplied (",
             dims_str(a.sizes()), " and ", dims_str(b.sizes()), "): ", pair_str(a, b));
  DType compute = compute_dtype(op, {a, b});
  const Shape out_shape{a.size(0), a.size(1), b.size(2)};
  Tensor out;
  if (detail::should_record(a, b)) {
    out = detail::lazy_record1(bmm_def, {a, b}, {}, {out_shape, compute});
  } else {
    out = detail::make_empty_on(out_shape, compute, a.device());
    gemm_into("bmm", out, a, b, {a.size(0)}, compute, 1, 0);
  }
  if (detail::needs_grad(a, b))
    detail::record("bmm", {a, b}, {out},
                   {saved_if(detail::requires_grad(b), a), saved_if(detail::requires_grad(a), b)},
                   [](const detail::BackwardContext& c) {
                     const Tensor &g = c.grad(), &a = c.saved(0), &b = c.saved(1);
                     return std::vector<Tensor>{
                         c.needs_grad(0) ? bmm(g, b.transpose(1, 2)) : Tensor(),
                         c.needs_grad(1) ? bmm(a.transpose(1, 2), g) : Tensor()};
                   });
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  const std::string& op = matmul_def->name;
  check_input(a, op, "input");
  check_input(b, op, "other");
  KILN_CHECK(a.dim() >= 1 && b.dim() >= 1,
             "matmul: both arguments need to be at least 1-D, but they are ", a.dim(), "-D and ",
             b.dim(), "-D (", pair_str(a, b), ")");
  if (a.dim() == 1 && b.dim() == 1) {
    KILN_CHECK(a.size(0) == b.size(0), "matmul: 1-D tensors must have the same size for a dot ",
               "product, got ", pair_str(a, b));
  }
  // 1-D operands become a row (left) or a column (right) matrix; those dims are dropped after.
  // (Shapes only here: the views are made when the product runs.)
  const Shape as = a.dim() == 1 ? Shape{1, a.size(0)} : a.sizes();
  const Shape bs = b.dim() == 1 ? Shape{b.size(0), 1} : b.sizes();
  const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  KILN_CHECK(K == bs[bs.size() - 2], "matmul: shapes cannot be multiplied (", dims_str(a.sizes()),
             " and ", dims_str(b.sizes()), "): ", pair_str(a, b));
  Shape batch_a(as.begin(), as.end() - 2);
  Shape batch_b(bs.begin(), bs.end() - 2);
  size_t nb = std::max(batch_a.size(), batch_b.size());
  Shape batch(nb);
  for (size_t i = 0; i < nb; ++i) {
    int64_t da = i < nb - batch_a.size() ? 1 : batch_a[i - (nb - batch_a.size())];
    int64_t db = i < nb - batch_b.size() ? 1 : batch_b[i - (nb - batch_b.size())];
    KILN_CHECK(da == db || da == 1 || db == 1, "matmul: batch dimensions ", shape_str(batch_a),
               " and ", shape_str(batch_b), " cannot be broadcast together (", pair_str(a, b), ")");
    batch[i] = da == 1 ? db : da;
  }
  DType compute = compute_dtype(op, {a, b});
  Shape full = batch;
  full.insert(full.end(), {M, N});
  Shape result = batch;
  if (a.dim() > 1) result.push_back(M);
  if (b.dim() > 1) result.push_back(N);
  Tensor out;
  if (detail::should_record(a, b)) {
    out = detail::lazy_record1(matmul_def, {a, b}, {}, {result, compute});
  } else {
    out = detail::make_empty_on(result, compute, a.device());
    AutoGradMode kernel_only(false);
    Tensor A = a.dim() == 1 ? a.unsqueeze(0) : a;
    Tensor B = b.dim() == 1 ? b.unsqueeze(1) : b;
    gemm_into("matmul", out.view(full), A, B, batch, compute, 1, 0);
  }
  // Gradients of the matrix form (1-D operands as a row or a column), summed over broadcast
  // batch dims; a 2-D right operand folds the batch into the rows of one GEMM.
  if (detail::needs_grad(a, b))
    detail::record(
        "matmul", {a, b}, {out},
        {saved_if(detail::requires_grad(b), a), saved_if(detail::requires_grad(a), b)},
        [full, a_sizes = a.sizes(), b_sizes = b.sizes()](const detail::BackwardContext& c) {
          const Tensor &a = c.saved(0), &b = c.saved(1);
          Tensor g = c.grad().reshape(full);
          std::vector<Tensor> grads(2);
          if (c.needs_grad(0)) {
            Tensor B = b.dim() == 1 ? b.unsqueeze(1) : b;
            Shape A_sizes = a_sizes.size() == 1 ? Shape{1, a_sizes[0]} : a_sizes;
            grads[0] = sum_to_size(matmul(g, B.transpose(-1, -2)), A_sizes).reshape(a_sizes);
          }
          if (c.needs_grad(1)) {
            Tensor A = a.dim() == 1 ? a.unsqueeze(0) : a;
            if (b_sizes.size() <= 2) {
              Shape a_full(full.begin(), full.end() - 2);
              a_full.insert(a_full.end(), {A.size(-2), A.size(-1)});
              grads[1] = mm(as_rows(A.expand(a_full)).t(), as_rows(g)).reshape(b_sizes);
            } else {
              grads[1] = sum_to_size(matmul(A.transpose(-1, -2), g), b_sizes).reshape(b_sizes);
            }
          }
          return grads;
        });
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const std::string& op = linear_def->name;
  check_input(x, op, "input");
  check_input(weight, op, "weight");
  if (bias.defined()) check_input(bias, op, "bias");
  KILN_CHECK(x.dim() >= 1, "linear: expected input to be at least 1-D, got ", describe(x));
  KILN_CHECK(weight.dim() == 2, "linear: expected weight to be a 2-D [out_features, in_features] ",
             "matrix, got ", describe(weight));
  KILN_CHECK(x.size(-1) == weight.size(1), "linear: input and weight shapes cannot be multiplied (",
             dims_str(x.sizes()), " and ", dims_str(weight.sizes()), "^T): input ", describe(x),
             " has ", x.size(-1), " features, weight ", describe(weight), " expects ",
             weight.size(1));
  Shape out_shape(x.sizes().begin(), x.sizes().end() - 1);
  out_shape.push_back(weight.size(0));
  if (bias.defined()) {
    KILN_CHECK(broadcasts_to(bias.sizes(), out_shape), "linear: bias ", describe(bias),
               " cannot be broadcast to the output shape ", shape_str(out_shape));
  }
  DType compute = compute_dtype(op, {x, weight, bias});
  Tensor out;
  if (detail::should_record({x, weight, bias})) {
    out = detail::lazy_record1(linear_def, {x, weight, bias}, {}, {out_shape, compute});
  } else {
    out = detail::make_empty_on(out_shape, compute, x.device());
    if (bias.defined()) detail::copy_kernel(out, bias);
    AutoGradMode kernel_only(false);
    Tensor A = x.dim() == 1 ? x.unsqueeze(0) : x;
    Shape batch(A.sizes().begin(), A.sizes().end() - 2);
    gemm_into("linear", x.dim() == 1 ? out.unsqueeze(0) : out, A, weight.t(), batch, compute, 1,
              bias.defined() ? 1 : 0);
  }
  // The batch dims fold into the rows of the weight's GEMM; the bias's gradient is g summed down
  // to its shape (by the engine).
  if (detail::needs_grad(x, weight, bias))
    detail::record(
        "linear", {x, weight, bias}, {out},
        {saved_if(detail::requires_grad(weight), x), saved_if(detail::requires_grad(x), weight)},
        [](const detail::BackwardContext& c) {
          const Tensor &g = c.grad(), &x = c.saved(0), &w = c.saved(1);
          std::vector<Tensor> grads(3);
          if (c.needs_grad(0)) grads[0] = matmul(g, w);
          if (c.needs_grad(1)) grads[1] = mm(as_rows(g).t(), as_rows(x));
          if (c.needs_grad(2)) grads[2] = g;
          return grads;
        });
  return out;
}

Tensor addmm(const Tensor& self, const Tensor& m1, const Tensor& m2, const Scalar& beta,
             const Scalar& alpha) {
  const std::string& op = addmm_def->name;
  check_input(self, op, "self");
  check_input(m1, op, "mat1");
  check_input(m2, op, "mat2");
  KILN_CHECK(m1.dim() == 2, "addmm: expected mat1 to be a 2-D matrix, got ", describe(m1));
  KILN_CHECK(m2.dim() == 2, "addmm: expected mat2 to be a 2-D matrix, got ", describe(m2));
  KILN_CHECK(m1.size(1) == m2.size(0), "addmm: mat1 and mat2 shapes cannot be multiplied (",
             dims_str(m1.sizes()), " and ", dims_str(m2.sizes()), "): ", pair_str(m1, m2));
  Shape out_shape{m1.size(0), m2.size(1)};
  KILN_CHECK(broadcasts_to(self.sizes(), out_shape), "addmm: self ", describe(self),
             " cannot be broadcast to the output shape ", shape_str(out_shape));
  DType compute = compute_dtype(op, {self, m1, m2});
  check_scalar_kind("addmm", compute, beta, "beta");
  check_scalar_kind("addmm", compute, alpha, "alpha");
  Tensor out;
  if (detail::should_record({self, m1, m2})) {
    out = detail::lazy_record1(addmm_def, {self, m1, m2},
                               {detail::scalar_attr(beta), detail::scalar_attr(alpha)},
                               {out_shape, compute});
  } else {
    out = detail::make_empty_on(out_shape, compute, m1.device());
    const bool use_self = beta.to_double() != 0.0 || beta.to_int() != 0;
    if (use_self) detail::copy_kernel(out, self);
    gemm_into("addmm", out, m1, m2, {}, compute, alpha, use_self ? beta : Scalar(0));
  }
  if (detail::needs_grad(self, m1, m2))
    detail::record(
        "addmm", {self, m1, m2}, {out},
        {saved_if(detail::requires_grad(m2), m1), saved_if(detail::requires_grad(m1), m2)},
        [b = beta.to_double(), a = alpha.to_double(), m1_t = is_transposed(m1),
         m2_t = is_transposed(m2)](const detail::BackwardContext& c) {
          const Tensor &g = c.grad(), &m1 = c.saved(0), &m2 = c.saved(1);
          Tensor ga = a == 1.0 ? g : g * a;
          std::vector<Tensor> grads(3);
          if (c.needs_grad(0)) grads[0] = b == 1.0 ? g : g * b;
          if (c.needs_grad(1)) grads[1] = mm_like(ga, m2.t(), m1_t);
          if (c.needs_grad(2)) grads[2] = mm_like(m1.t(), ga, m2_t);
          return grads;
        });
  return out;
}

namespace detail {
void check_scalar_kind(const char* op, DType compute, const Scalar& s, const char* name) {
  KILN_CHECK(!(is_integral(compute) && s.is_floating_point()), op,
             ": for integral input tensors, argument ", name,
             " must not be a floating point number (got ", s, " for ", dtype_name(compute), ")");
}
}  // namespace detail

}  // namespace kiln
