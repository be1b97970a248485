// The elementwise loop engine: N typed operands read or written at broadcast strides over one
// shape.
//
// Dimensions are first coalesced (two adjacent dims merge when every operand steps through them as
// one), so a contiguous or simply broadcast operation becomes a single flat loop the compiler
// vectorizes. The flat index range is split across threads; each chunk walks its rows with an
// odometer over the outer dims and calls the inner loop once per row segment.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "lib/math/lanes.h"
#include "lib/parallel.h"
#include "lib/tensor_impl.h"

namespace kiln::detail {

template <size_t N>
struct LoopGeometry {
  std::vector<int64_t> sizes;                   // innermost last
  std::vector<std::array<int64_t, N>> strides;  // bytes, per dim, per operand
  std::array<char*, N> base{};
};

// Builds the geometry for operands already viewed at `shape` (strides in elements).
template <size_t N>
LoopGeometry<N> make_geometry(const Shape& shape, const std::array<char*, N>& base,
                              const std::array<Shape, N>& elem_strides,
                              const std::array<int64_t, N>& elem_sizes) {
  LoopGeometry<N> g;
  g.base = base;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    std::array<int64_t, N> s;
    for (size_t k = 0; k < N; ++k) s[k] = elem_strides[k][d] * elem_sizes[k];
    if (!g.sizes.empty()) {
      bool merge = true;
      for (size_t k = 0; k < N; ++k) merge &= g.strides.back()[k] == s[k] * shape[d];
      if (merge) {
        g.sizes.back() *= shape[d];
        g.strides.back() = s;
        continue;
      }
    }
    g.sizes.push_back(shape[d]);
    g.strides.push_back(s);
  }
  if (g.sizes.empty()) {  // a single element
    g.sizes.push_back(1);
    g.strides.push_back(std::array<int64_t, N>{});
  }
  return g;
}

// Calls row(ptrs, n, inner_strides) over every element of the geometry, in parallel chunks.
template <size_t N, typename Row>
void run_geometry(const LoopGeometry<N>& g, int64_t grain, const Row& row) {
  const int64_t ndim = static_cast<int64_t>(g.sizes.size());
  const int64_t inner = g.sizes.back();
  int64_t total = 1;
  for (int64_t s : g.sizes) total *= s;
  if (total == 0) return;
  const std::array<int64_t, N> inner_strides = g.strides.back();
  parallel_for(total, grain, [&](int64_t begin, int64_t end) {
    // Decompose `begin` into the outer multi-index and the inner offset.
    std::vector<int64_t> idx(ndim, 0);
    int64_t rem = begin / inner;
    int64_t i = begin % inner;
    for (int64_t d = ndim - 2; d >= 0; --d) {
      idx[d] = rem % g.sizes[d];
      rem /= g.sizes[d];
    }
    std::array<char*, N> p;
    for (size_t k = 0; k < N; ++k) {
      p[k] = g.base[k];
      for (int64_t d = 0; d < ndim - 1; ++d) p[k] += idx[d] * g.strides[d][k];
    }
    int64_t pos = begin;
    while (pos < end) {
      int64_t len = std::min(inner - i, end - pos);
      std::array<char*, N> q;
      for (size_t k = 0; k < N; ++k) q[k] = p[k] + i * inner_strides[k];
      row(q, len, inner_strides);
      pos += len;
      i = 0;
      for (int64_t d = ndim - 2; d >= 0; --d) {  // odometer step over the outer dims
        for (size_t k = 0; k < N; ++k) p[k] += g.strides[d][k];
        if (++idx[d] < g.sizes[d]) break;
        for (size_t k = 0; k < N; ++k) p[k] -= g.strides[d][k] * g.sizes[d];
        idx[d] = 0;
      }
    }
  });
}

// A functor whose formula also runs on lib/math/lanes.h's blocks (a primitive of lib/math, or
// arithmetic over them): map_kernel's rows call it on math::kLanes elements at a time, so that it
// is computed with vector instructions even where the compiler leaves the scalar loop scalar.
// Each lane gets the scalar formula's bits.
template <typename F>
struct Lanewise : F {};
template <typename F>
Lanewise<F> lanewise(F f) {
  return {f};
}
template <typename F>
inline constexpr bool is_lanewise = false;
template <typename F>
inline constexpr bool is_lanewise<Lanewise<F>> = true;

// The `count` (at most kLanes) elements of type T at p, `stride` bytes apart, as a block (the
// remaining lanes 0); and a block's first `count` lanes stored so.
template <typename T, int B>
inline __attribute__((always_inline)) math::Lanes<T, B> load_block(const char* p, int64_t stride,
                                                                   int64_t count) {
  math::Lanes<T, B> v;
  if (stride == sizeof(T) && count == math::kLanes) {
    std::memcpy(v.p, p, sizeof(v.p));
    return v;
  }
  T lanes[math::kLanes] = {};
  for (int64_t k = 0; k < count; ++k) std::memcpy(&lanes[k], p + k * stride, sizeof(T));
  std::memcpy(v.p, lanes, sizeof(v.p));
  return v;
}
template <typename T, int B>
inline __attribute__((always_inline)) void store_block(const math::Lanes<T, B>& v, char* p,
                                                       int64_t stride, int64_t count) {
  if (stride == sizeof(T) && count == math::kLanes) {
    std::memcpy(p, v.p, sizeof(v.p));
    return;
  }
  T lanes[math::kLanes];
  std::memcpy(lanes, v.p, sizeof(v.p));
  for (int64_t k = 0; k < count; ++k) std::memcpy(p + k * stride, &lanes[k], sizeof(T));
}

// One row of map_kernel: o[j] = f(in[j]...) for j < n, operands at p, contiguous or at byte
// strides s. A Lanewise f runs on blocks of Lanes<T, B> (B: the vector registers' bytes).
template <int B, typename Out, typename... Ins, typename F, size_t N, size_t... I>
inline __attribute__((always_inline)) void map_row(const F& f, const std::array<char*, N>& p,
                                                   int64_t n, const std::array<int64_t, N>& s,
                                                   bool contiguous, std::index_sequence<I...>) {
  if constexpr (is_lanewise<F>) {
    for (int64_t j = 0; j < n; j += math::kLanes) {
      const int64_t count = std::min<int64_t>(math::kLanes, n - j);
      const math::Lanes<Out, B> r =
          f(load_block<Ins, B>(p[1 + I] + j * s[1 + I], s[1 + I], count)...);
      store_block<Out, B>(r, p[0] + j * s[0], s[0], count);
    }
    return;
  }
  Out* __restrict o = reinterpret_cast<Out*>(p[0]);
  if (contiguous) {
    std::tuple<const Ins* __restrict...> in{reinterpret_cast<const Ins*>(p[1 + I])...};
    for (int64_t j = 0; j < n; ++j) o[j] = static_cast<Out>(f(std::get<I>(in)[j]...));
  } else {
    for (int64_t j = 0; j < n; ++j)
      *reinterpret_cast<Out*>(p[0] + j * s[0]) =
          static_cast<Out>(f(*reinterpret_cast<const Ins*>(p[1 + I] + j * s[1 + I])...));
  }
}

// The row loop compiled for the CPU kiln runs on: AVX-512 (512-bit vectors) or AVX2, with FMA,
// where it has them, else x86-64's baseline. Everything the loop calls is inlined into it
// (flatten), so that the formula is compiled for that instruction set too. Separate operations
// never contract (fp-contract=off: GCC would contract a * b + c in C++ wherever FMA is enabled),
// so each version computes the same bits; lib/math/primitives.h's fmadd is one FMA instruction in
// the first two and a call of libm's fma in the baseline one.
#if defined(__x86_64__) && defined(__GNUC__)
#if defined(__clang__)  // contracts nothing anyway (-ffp-contract=off); its own vector widths
#define KILN_LOOP_AVX512 \
  __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,bmi2"), flatten))
#define KILN_LOOP_AVX2 __attribute__((target("avx2,fma,bmi2"), flatten))
#else
#define KILN_LOOP_AVX512                                                                  \
  __attribute__((                                                                         \
      target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,bmi2,prefer-vector-width=512"), \
      optimize("fp-contract=off"), flatten))
#define KILN_LOOP_AVX2 \
  __attribute__((target("avx2,fma,bmi2"), optimize("fp-contract=off"), flatten))
#endif
template <typename Out, typename... Ins, typename F, size_t N, size_t... I>
KILN_LOOP_AVX512 void map_row_avx512(const F& f, const std::array<char*, N>& p, int64_t n,
                                     const std::array<int64_t, N>& s, bool contiguous,
                                     std::index_sequence<I...> i) {
  map_row<64, Out, Ins...>(f, p, n, s, contiguous, i);
}
template <typename Out, typename... Ins, typename F, size_t N, size_t... I>
KILN_LOOP_AVX2 void map_row_avx2(const F& f, const std::array<char*, N>& p, int64_t n,
                                 const std::array<int64_t, N>& s, bool contiguous,
                                 std::index_sequence<I...> i) {
  map_row<32, Out, Ins...>(f, p, n, s, contiguous, i);
}
// f() compiled as map_kernel's rows are: for the kernels that are not maps, such as a row
// reduction that calls a transcendental (whose fmadd would otherwise be a call of libm's fma).
template <typename F>
KILN_LOOP_AVX512 auto call_avx512(const F& f) {
  return f();
}
template <typename F>
KILN_LOOP_AVX2 auto call_avx2(const F& f) {
  return f();
}
// 2: AVX-512 (F, VL, BW, DQ) with FMA; 1: AVX2 with FMA; 0: neither.
inline int cpu_vector_level() {
  static const int level = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("bmi2");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512dq");
    return avx512 ? 2 : avx2 ? 1 : 0;
  }();
  return level;
}
#endif

// f(), in the version for the CPU kiln runs on (see call_avx512).
template <typename F>
auto call_vectorized(const F& f) {
#if defined(__x86_64__) && defined(__GNUC__)
  const int level = cpu_vector_level();
  if (level == 2) return call_avx512(f);
  if (level == 1) return call_avx2(f);
#endif
  return f();
}

// out[i] = f(in_0[i], ..., in_k[i]) over out's shape. `out` must be a CPU tensor of type Out;
// each input must be of type Ins... and broadcastable to out's shape. `out` may be one of the
// inputs (same view), but must not otherwise overlap them.
template <typename Out, typename... Ins, typename F, typename... Ts>
void map_kernel(const F& f, const Tensor& out, const Ts&... ins) {
  static_assert(sizeof...(Ins) == sizeof...(Ts), "one type per input");
  constexpr size_t N = 1 + sizeof...(Ins);
  const Shape& shape = out.sizes();
  std::array<char*, N> base{out.impl()->data(), ins.impl()->data()...};
  std::array<int64_t, N> esz{sizeof(Out), sizeof(Ins)...};
  auto row = [&](const std::array<char*, N>& p, int64_t n, const std::array<int64_t, N>& s) {
    bool contiguous = true;
    for (size_t k = 0; k < N; ++k) contiguous &= s[k] == esz[k];
    const auto i = std::index_sequence_for<Ins...>{};
#if defined(__x86_64__) && defined(__GNUC__)
    const int level = cpu_vector_level();
    if (level == 2) return map_row_avx512<Out, Ins...>(f, p, n, s, contiguous, i);
    if (level == 1) return map_row_avx2<Out, Ins...>(f, p, n, s, contiguous, i);
#endif
    map_row<16, Out, Ins...>(f, p, n, s, contiguous, i);
  };
  // Every operand contiguous with out's element count (so none is actually expanded): one flat
  // row, with no geometry to build.
  const int64_t numel = shape_numel(shape);
  if (is_contiguous_layout(shape, out.strides()) &&
      ((ins.numel() == numel && is_contiguous_layout(ins.sizes(), ins.strides())) && ...)) {
    parallel_for(numel, kParallelGrain, [&](int64_t begin, int64_t end) {
      std::array<char*, N> p;
      for (size_t k = 0; k < N; ++k) p[k] = base[k] + begin * esz[k];
      row(p, end - begin, esz);
    });
    return;
  }
  std::array<Shape, N> strides{out.strides(), broadcast_strides(ins, shape)...};
  run_geometry<N>(make_geometry<N>(shape, base, strides, esz), kParallelGrain, row);
}

}  // namespace kiln::detail
