// A value family of lib/math/primitives.h for the eager kernels: Lanes<T, B> holds kLanes values
// of T (float, double, uint32_t, uint64_t; bool for masks) as GCC vectors of B bytes (the
// target's register: 64 for AVX-512, 32 for AVX2, 16 for SSE2), so that a primitive instantiated
// with Lanes<float, B> or Lanes<double, B> computes kLanes elements with vector instructions
// where the auto-vectorizer gives up on the scalar loop (a branch, a float-double mix, a table
// lookup). Every operation is the scalar one lane by lane: IEEE operations rounded once each,
// fmadd rounded once; so each lane holds the scalar instantiation's bits. lib/loops.h runs such a
// primitive on blocks of kLanes elements.
//
// Values are parts of the register's size because GCC splits arithmetic on a wider vector into
// registers but compares a wider vector lane by lane in scalar code.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "lib/math/primitives.h"

namespace kiln::math {

// 16 lanes: one AVX-512 register of float32, two of float64.
inline constexpr int kLanes = 16;

// A mask's lanes are 0 or all ones, 32 bits wide (a float64 comparison's mask is narrowed, and
// widened again where it selects 64-bit lanes). int32_t and int64_t lanes are the masks' widths.
template <typename T>
using LaneElement = std::conditional_t<std::is_same_v<T, bool>, int32_t, T>;
template <typename E>
using SignedOfWidth = std::conditional_t<sizeof(E) == 4, int32_t, int64_t>;

template <typename T, int B>
struct Lanes;
template <typename To, typename T, int B>
KILN_MATH_INLINE To resize(const Lanes<T, B>& x);

template <typename T, int B>
struct Lanes {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bool> ||
                std::is_same_v<T, uint32_t> || std::is_same_v<T, uint64_t> ||
                std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>);
  using E = LaneElement<T>;
  typedef E Part __attribute__((vector_size(B)));
  static constexpr int kParts = kLanes * sizeof(E) / B;
  static_assert(kParts >= 1 && kParts * B == kLanes * int(sizeof(E)));
  using Mask = Lanes<bool, B>;
  using Wide = Lanes<SignedOfWidth<E>, B>;  // a mask as wide as T

  Part p[kParts];

  Lanes() = default;
  // NOLINTNEXTLINE: constants splat implicitly, as in scalar code (true: all ones)
  KILN_MATH_INLINE Lanes(T c) {
    const E e = std::is_same_v<T, bool> ? E(-E(c)) : E(c);
    for (Part& q : p) q = Part{} + e;
  }

  // The lanes f(a[i], ...) computed part by part.
  template <typename F, typename... L>
  static KILN_MATH_INLINE Lanes map(F f, const L&... a) {
    Lanes r;
#pragma GCC unroll 8
    for (int i = 0; i < kParts; ++i) r.p[i] = f(a.p[i]...);
    return r;
  }
  friend KILN_MATH_INLINE Lanes operator+(Lanes a, Lanes b) {
    return map([](Part x, Part y) KILN_MATH_LAMBDA_INLINE { return x + y; }, a, b);
  }
  friend KILN_MATH_INLINE Lanes operator-(Lanes a, Lanes b) {
    return map([](Part x, Part y) KILN_MATH_LAMBDA_INLINE { return x - y; }, a, b);
  }
  friend KILN_MATH_INLINE Lanes operator*(Lanes a, Lanes b) {
    return map([](Part x, Part y) KILN_MATH_LAMBDA_INLINE { return x * y; }, a, b);
  }
  friend KILN_MATH_INLINE Lanes operator/(Lanes a, Lanes b) {
    return map([](Part x, Part y) KILN_MATH_LAMBDA_INLINE { return x / y; }, a, b);
  }
  friend KILN_MATH_INLINE Lanes operator-(Lanes a) {
    return map([](Part x) KILN_MATH_LAMBDA_INLINE { return -x; }, a);
  }
  friend KILN_MATH_INLINE Lanes operator&(Lanes a, Lanes b) {
    return map([](Part x, Part y) KILN_MATH_LAMBDA_INLINE { return x & y; }, a, b);
  }
  friend KILN_MATH_INLINE Lanes operator|(Lanes a, Lanes b) {
    return map([](Part x, Part y) KILN_MATH_LAMBDA_INLINE { return x | y; }, a, b);
  }
  friend KILN_MATH_INLINE Lanes operator!(Lanes a) {
    return map([](Part x) KILN_MATH_LAMBDA_INLINE { return ~x; }, a);
  }
  friend KILN_MATH_INLINE Lanes operator<<(Lanes a, int n) {
    return map([n](Part x) KILN_MATH_LAMBDA_INLINE { return x << n; }, a);
  }
  friend KILN_MATH_INLINE Lanes operator>>(Lanes a, int n) {
    return map([n](Part x) KILN_MATH_LAMBDA_INLINE { return x >> n; }, a);
  }
  friend KILN_MATH_INLINE Lanes operator<<(Lanes a, Lanes n) {
    return map([](Part x, Part y) KILN_MATH_LAMBDA_INLINE { return x << y; }, a, n);
  }
  friend KILN_MATH_INLINE Lanes operator>>(Lanes a, Lanes n) {
    return map([](Part x, Part y) KILN_MATH_LAMBDA_INLINE { return x >> y; }, a, n);
  }

  // GCC's vector comparisons: ordered for floats (!= true for NaN), unsigned for unsigned lanes.
  friend KILN_MATH_INLINE Mask operator<(Lanes a, Lanes b) {
    return compare([](Part x, Part y) KILN_MATH_LAMBDA_INLINE { return x < y; }, a, b);
  }
  friend KILN_MATH_INLINE Mask operator<=(Lanes a, Lanes b) {
    return compare([](Part x, Part y) KILN_MATH_LAMBDA_INLINE { return x <= y; }, a, b);
  }
  friend KILN_MATH_INLINE Mask operator>(Lanes a, Lanes b) {
    return compare([](Part x, Part y) KILN_MATH_LAMBDA_INLINE { return x > y; }, a, b);
  }
  friend KILN_MATH_INLINE Mask operator>=(Lanes a, Lanes b) {
    return compare([](Part x, Part y) KILN_MATH_LAMBDA_INLINE { return x >= y; }, a, b);
  }
  friend KILN_MATH_INLINE Mask operator==(Lanes a, Lanes b) {
    return compare([](Part x, Part y) KILN_MATH_LAMBDA_INLINE { return x == y; }, a, b);
  }
  friend KILN_MATH_INLINE Mask operator!=(Lanes a, Lanes b) {
    return compare([](Part x, Part y) KILN_MATH_LAMBDA_INLINE { return x != y; }, a, b);
  }
  friend KILN_MATH_INLINE Mask lt_signed(Lanes a, Lanes b) {
    using S = typename Wide::Part;
    return compare([](Part x, Part y) KILN_MATH_LAMBDA_INLINE { return S(x) < S(y); }, a, b);
  }

  friend KILN_MATH_INLINE Lanes select(Mask m, Lanes a, Lanes b) {
    const Wide w = resize<Wide>(m);
    Lanes r;
#pragma GCC unroll 8
    for (int i = 0; i < kParts; ++i) r.p[i] = w.p[i] ? a.p[i] : b.p[i];
    return r;
  }
  friend KILN_MATH_INLINE Lanes fmadd(Lanes a, Lanes b, Lanes c) {
    E x[kLanes], y[kLanes], z[kLanes];
    std::memcpy(x, a.p, sizeof(x));
    std::memcpy(y, b.p, sizeof(y));
    std::memcpy(z, c.p, sizeof(z));
    for (int i = 0; i < kLanes; ++i) x[i] = math::fmadd(x[i], y[i], z[i]);
    Lanes r;
    std::memcpy(r.p, x, sizeof(x));
    return r;
  }
  friend KILN_MATH_INLINE Lanes sar(Lanes a, int n) {
    using S = typename Wide::Part;
    return map([n](Part x) KILN_MATH_LAMBDA_INLINE { return Part(S(x) >> n); }, a);
  }

  // E's lane i at i (of the parts, stored in order).
  KILN_MATH_INLINE E operator[](int i) const {
    E e;
    std::memcpy(&e, reinterpret_cast<const char*>(p) + i * sizeof(E), sizeof(E));
    return e;
  }

 private:
  template <typename F>
  static KILN_MATH_INLINE Mask compare(F f, Lanes a, Lanes b) {
    Wide m;
#pragma GCC unroll 8
    for (int i = 0; i < kParts; ++i) m.p[i] = f(a.p[i], b.p[i]);
    return resize<Mask>(m);
  }
};

// The lanes of x converted to To's element type one by one (GCC's vector conversion: floats round,
// integers truncate or extend by their signedness): each part of To from the lanes of x it holds.
template <typename To, typename T, int B>
KILN_MATH_INLINE To resize(const Lanes<T, B>& x) {
  using From = typename Lanes<T, B>::E;
  constexpr int kPerPart = B / sizeof(typename To::E);
  typedef From Chunk __attribute__((vector_size(kPerPart * sizeof(From))));
  To r;
#pragma GCC unroll 8
  for (int i = 0; i < To::kParts; ++i) {
    Chunk c;
    std::memcpy(&c, reinterpret_cast<const char*>(x.p) + i * sizeof(Chunk), sizeof(Chunk));
    r.p[i] = __builtin_convertvector(c, typename To::Part);
  }
  return r;
}

template <typename S, typename T, int B>
KILN_MATH_INLINE Lanes<S, B> bitcast(const Lanes<T, B>& x) {
  static_assert(sizeof(S) == sizeof(T));
  Lanes<S, B> r;
  std::memcpy(r.p, x.p, sizeof(r.p));
  return r;
}

// Integer sources are signed (to floats); integers zero-extend or truncate.
template <typename S, typename T, int B>
KILN_MATH_INLINE Lanes<S, B> convert(const Lanes<T, B>& x) {
  if constexpr (std::is_integral_v<T> && std::is_floating_point_v<S>)
    return resize<Lanes<S, B>>(bitcast<SignedOfWidth<T>>(x));
  else
    return resize<Lanes<S, B>>(x);
}

// The operations without a vector form in GCC's extensions, lane by lane (a loop the compiler
// vectorizes where the target has the instruction).
template <typename T, int B, typename F>
KILN_MATH_INLINE Lanes<T, B> each_lane(Lanes<T, B> x, F f) {
#pragma GCC unroll 8
  for (int i = 0; i < Lanes<T, B>::kParts; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < B / int(sizeof(T)); ++j) x.p[i][j] = f(x.p[i][j]);
  return x;
}
template <typename T, int B>
KILN_MATH_INLINE Lanes<T, B> sqrt_of(Lanes<T, B> x) {
  return each_lane(x, [](T v) KILN_MATH_LAMBDA_INLINE { return std::sqrt(v); });
}
template <typename T, int B>
KILN_MATH_INLINE Lanes<T, B> trunc_of(Lanes<T, B> x) {
  return each_lane(x, [](T v) KILN_MATH_LAMBDA_INLINE { return std::trunc(v); });
}
template <typename T, int B>
KILN_MATH_INLINE Lanes<T, B> libm_pow(Lanes<bool, B> where, Lanes<T, B> x, Lanes<T, B> y) {
  Lanes<T, B> r = x;
  for (int i = 0; i < kLanes; ++i)
    if (where[i]) {
      const T v = std::pow(x[i], y[i]);
      std::memcpy(reinterpret_cast<char*>(r.p) + i * sizeof(T), &v, sizeof(T));
    }
  return r;
}

template <typename Table, typename U, int B>
KILN_MATH_INLINE Lanes<uint32_t, B> gather(const Lanes<U, B>& index) {
  uint32_t r[kLanes];
  for (int i = 0; i < kLanes; ++i) r[i] = Table::kData[index[i]];
  Lanes<uint32_t, B> v;
  std::memcpy(v.p, r, sizeof(r));
  return v;
}

// The scalar type of a plain value or of a block's lanes.
template <typename T>
struct ScalarOfT {
  using type = T;
};
template <typename T, int B>
struct ScalarOfT<Lanes<T, B>> {
  using type = T;
};
template <typename T>
using ScalarOf = typename ScalarOfT<T>::type;

// Blocks branch around a costly case no lane needs (see branches).
template <typename T, int B>
inline constexpr bool branches<Lanes<T, B>> = true;
template <int B>
KILN_MATH_INLINE bool any_of(const Lanes<bool, B>& m) {
  typename Lanes<bool, B>::Part any = m.p[0];
  for (int i = 1; i < Lanes<bool, B>::kParts; ++i) any |= m.p[i];
  for (int j = 0; j < B / 4; ++j)
    if (any[j]) return true;
  return false;
}

}  // namespace kiln::math
