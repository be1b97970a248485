// kiln's float32 and float64 transcendental primitives, each defined once: exp, log, log1p,
// expm1, sin, cos, tanh and erf (and whatever is built on them: sigmoid, silu, gelu, softplus),
// pow (of floats and of integers), and, in lib/math/trig_hyperbolic.h (included at the end), tan,
// atan, atan2, asin, acos, the hyperbolic functions, exp2, log2 and log10.
//
// Every function is a template over a value type F (the float or double of a value family), as
// Dr.Jit's math library serves scalars and JIT values alike. One definition has four
// instantiations:
//   - plain C++ scalars (float, double, uint32_t, uint64_t, bool): the eager kernels and the
//     references (lib/fastmath.h names them);
//   - blocks of 16 lanes (lib/math/lanes.h: GCC vectors): the eager elementwise kernels of math
//     ops, vectors even where the compiler would leave the scalar loop scalar;
//   - LLVM IR values (fuser/codegen/llvm/ir_value.h: operators that call an IRBuilder): the CPU
//     code generator emits the very same sequence, vectorized by LLVM;
//   - CUDA C source (fuser/codegen/cuda/source_value.h: operators that append statements): the
//     CUDA code generator renders each function once as a device function.
// A value family supplies: + - * / and unary -, comparisons giving masks (ordered; != unordered),
// mask & | !, select(mask, a, b), fmadd(a, b, c) (a * b + c rounded once, on every target),
// bitcast<S>(x), convert<S>(x)
// (integer sources are signed; integer to integer zero-extends or truncates), sar(u, n)
// (arithmetic shift of an unsigned value read as signed), lt_signed(a, b), integer & | << >>
// (logical), gather<Table>(index) (an element of a constant table), sqrt_of(x) and trunc_of(x)
// (IEEE's, correctly rounded) and libm_pow(where, x, y) (the math library's pow where `where`
// holds, called only there; x elsewhere). Like<F, S> is the family's type for the scalar type S.
//
// Separate operations are never contracted (plain * and + round twice on every target); fmadd
// always rounds once. So every instantiation computes the same bits on every machine: eager,
// fused on the CPU and fused on a GPU agree, and the bounds measured by tests/lib/ulp_test.cpp
// (docs/numerics.md) hold everywhere. Where an algorithm needs an exact product or sum (Dekker's
// product, TwoSum, Veltkamp's split), it uses plain operations.
//
// Branch-free (but for a branch around a rare costly case in plain scalars and blocks, see
// branches): every case is computed and the right one selected, integers come from the bits of
// rounded values, table indices are in range for every input, so that no NaN, infinity or
// out-of-range value meets a float-to-int conversion (undefined in C++, poison in LLVM IR), a
// shift or an index, and so that the loops vectorize.
// Special values follow libm: NaN in, NaN out; log of a negative NaN, of 0 -inf; sin and cos of
// +-inf NaN; +-0 kept where libm keeps it; |erf| <= 1.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>

// Every function is inlined into its caller, so that the eager kernels' loops vectorize it (with
// the caller's instruction set: lib/loops.h's multiversioned loops).
#define KILN_MATH_INLINE inline __attribute__((always_inline))
#define KILN_MATH_LAMBDA_INLINE __attribute__((always_inline))

namespace kiln::math {

// ---- The value family of plain C++ scalars ----

// Like<V, S>: the type of scalar type S in V's family (S itself for plain scalars, W<S> for a
// wrapper W<T>).
template <typename V, typename S>
struct Rebind {
  using type = S;
};
template <template <typename> class W, typename T, typename S>
struct Rebind<W<T>, S> {
  using type = W<S>;
};
template <template <typename, int> class W, typename T, int B, typename S>
struct Rebind<W<T, B>, S> {
  using type = W<S, B>;
};
template <typename V, typename S>
using Like = typename Rebind<V, S>::type;

template <typename T>
using IfScalar = std::enable_if_t<std::is_arithmetic_v<T>, int>;
// Plain scalars take a branch where a case is costly and rare (sin and cos's large reduction);
// other families compute every case and select.
template <typename T>
inline constexpr bool is_scalar = std::is_arithmetic_v<T>;
// Families that may branch on a mask where a case is costly and rare, running it only when any_of
// the mask's lanes needs it: plain scalars (one lane) and lib/math/lanes.h's blocks.
template <typename T>
inline constexpr bool branches = is_scalar<T>;
KILN_MATH_INLINE bool any_of(bool m) {
  return m;
}
// f() (a tuple of family values) where some lane of `needed` is set, else `otherwise`: a costly,
// rare case (sin's large reduction) whose result is selected only in the lanes that need it.
// Plain scalars and blocks branch; the LLVM family branches in vector code (ir_value.h); the CUDA
// family computes f() in every case.
template <typename M, typename Fn, typename R>
KILN_MATH_INLINE R only_where_needed(M needed, const Fn& f, R otherwise) {
  if constexpr (branches<M>) {
    if (!any_of(needed)) return otherwise;
  }
  return f();
}

template <typename T, IfScalar<T> = 0>
KILN_MATH_INLINE T select(bool m, T a, T b) {
  return m ? a : b;
}

// a * b + c rounded once, on every CPU: the same bits as the code generators' fmadd (llvm.fma,
// CUDA's fma), so that eager and fused results agree. Where this is compiled for a CPU with FMA
// (the eager kernels' multiversioned loops, lib/loops.h) it is one instruction; elsewhere a call
// of libm's fma.
KILN_MATH_INLINE float fmadd(float a, float b, float c) {
  return __builtin_fmaf(a, b, c);
}
KILN_MATH_INLINE double fmadd(double a, double b, double c) {
  return __builtin_fma(a, b, c);
}

template <typename S, typename T, IfScalar<T> = 0>
KILN_MATH_INLINE S bitcast(T x) {
  static_assert(sizeof(S) == sizeof(T));
  S s;
  std::memcpy(&s, &x, sizeof(S));
  return s;
}

template <typename S, typename T, IfScalar<T> = 0>
KILN_MATH_INLINE S convert(T x) {
  if constexpr (std::is_integral_v<T> && std::is_floating_point_v<S>)
    return static_cast<S>(static_cast<std::make_signed_t<T>>(x));
  else
    return static_cast<S>(x);
}

template <typename T, IfScalar<T> = 0>
KILN_MATH_INLINE T sar(T x, int n) {
  return static_cast<T>(static_cast<std::make_signed_t<T>>(x) >> n);
}

template <typename T, IfScalar<T> = 0>
KILN_MATH_INLINE bool lt_signed(T a, T b) {
  return static_cast<std::make_signed_t<T>>(a) < static_cast<std::make_signed_t<T>>(b);
}

template <typename Table, typename U, IfScalar<U> = 0>
KILN_MATH_INLINE uint32_t gather(U index) {
  return Table::kData[index];
}

template <typename T, IfScalar<T> = 0>
KILN_MATH_INLINE T sqrt_of(T x) {
  return std::sqrt(x);
}
template <typename T, IfScalar<T> = 0>
KILN_MATH_INLINE T trunc_of(T x) {
  return std::trunc(x);
}
template <typename T, IfScalar<T> = 0>
KILN_MATH_INLINE T libm_pow(bool where, T x, T y) {
  return where ? std::pow(x, y) : x;
}

// ---- Accuracy ----

// Each primitive's largest error, in ulps of the result (the distance in representable values from
// the correctly rounded result), over a dense sweep of every binade and every float around its
// case and range-reduction boundaries (float32), or random doubles of every binade and around
// those boundaries (float64): measured by tests/lib/ulp_test.cpp, listed in docs/numerics.md.
// Identical on every machine and in every instantiation (fmadd always rounds once).
struct UlpBound {
  const char* name;
  int f32;
  int f64;
};
inline constexpr UlpBound kUlpBounds[] = {
    {"exp", 1, 1},     {"log", 1, 1},   {"log1p", 1, 1},  {"expm1", 1, 1},  {"sin", 1, 1},
    {"cos", 1, 1},     {"tanh", 1, 2},  {"erf", 1, 1},    {"tan", 1, 2},    {"atan", 1, 1},
    {"atan2", 1, 2},   {"asin", 1, 2},  {"acos", 1, 2},   {"sinh", 1, 2},   {"cosh", 1, 2},
    {"asinh", 1, 2},   {"acosh", 1, 2}, {"atanh", 1, 2},  {"exp2", 1, 1},   {"log2", 1, 2},
    {"log10", 1, 2},   {"erfc", 1, 3},  {"erfinv", 1, 2}, {"lgamma", 1, 2}, {"digamma", 1, 3},
    {"trigamma", 1, 5}};
// lgamma and digamma of x < 0 are the reflection formula's difference of two terms, which cancel
// near the functions' negative zeros: there the float64 error is bounded instead by
// kReflectionSlack times 1 plus the larger term; the float32 bound holds everywhere.
inline constexpr double kReflectionSlack = 8 * 0x1p-52;

// ---- Helpers over any family ----

template <typename F>
KILN_MATH_INLINE F abs_of(F x) {  // x < 0 ? -x : x (-0 stays -0: the callers compare it only)
  return select(x < F(0), -x, x);
}
template <typename F>
KILN_MATH_INLINE F clamp(F x, F lo, F hi) {
  return select(x < lo, lo, select(x > hi, hi, x));
}
// c[0] x^(n-1) + ... + c[n-1] (Horner, each step an fmadd). The loops are unrolled where they are
// written: GCC does not unroll them itself once the primitive is inlined into a kernel's loop,
// which then does not vectorize (tanh: 7x slower).
template <typename F, typename C, int N>
KILN_MATH_INLINE F horner(F x, const C (&c)[N]) {
  F p = F(c[0]);
#pragma GCC unroll 16
  for (int i = 1; i < N; ++i) p = fmadd(p, x, F(c[i]));
  return p;
}
// c[0] + c[1] x + ... + c[n-1] x^(n-1) (the coefficients in ascending order).
template <typename F, typename C, int N>
KILN_MATH_INLINE F horner_up(F x, const C (&c)[N]) {
  F p = F(c[N - 1]);
#pragma GCC unroll 16
  for (int i = N - 2; i >= 0; --i) p = fmadd(p, x, F(c[i]));
  return p;
}

// ---- float32 ----

struct ExpF32 {
  static constexpr float kLo = -103.972084f;        // below: the result rounds to 0
  static constexpr float kHi = 88.72283935546875f;  // from here up: inf
  static constexpr float kLog2e = 1.44269504088896341f;
  static constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to integer
  static constexpr uint32_t kMagicBits = 0x4b400000u;
  static constexpr float kLn2Hi = 0.693359375f;  // ln 2 in two parts, n * hi exact
  static constexpr float kLn2Lo = -2.12194440e-4f;
  static constexpr float kPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                     4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
};

// x = n ln 2 + r (Cody-Waite, |r| <= ln2/2 or so), n's integer from the bits of the rounded
// n + 1.5 2^23 (it fits below 2^22), x clamped to [lo, hi] first.
template <typename F>
KILN_MATH_INLINE void reduce_exp_f32(F xc, F* r, Like<F, uint32_t>* ni) {
  using C = ExpF32;
  const F t = fmadd(xc, F(C::kLog2e), F(C::kMagic));
  const F n = t - F(C::kMagic);
  *r = fmadd(-n, F(C::kLn2Lo), fmadd(-n, F(C::kLn2Hi), xc));
  *ni = bitcast<uint32_t>(t) - Like<F, uint32_t>(C::kMagicBits);
}

// e^r - 1 for the reduced argument r: r + r^2 P(r), the polynomial every exp-based float32
// primitive evaluates (exp, its form for x <= 0, tanh, expm1).
template <typename F>
KILN_MATH_INLINE F expm1_reduced_f32(F r) {
  return fmadd(horner(r, ExpF32::kPoly), r * r, r);
}

// exp(x): e^r by a degree-7 polynomial, times 2^n applied as 2^(n/2) 2^(n - n/2) (both normal)
// so that subnormal results round once.
template <typename F>
KILN_MATH_INLINE F exp_f32(F x) {
  using C = ExpF32;
  using U = Like<F, uint32_t>;
  F r;
  U ni;
  reduce_exp_f32(clamp(x, F(C::kLo), F(C::kHi)), &r, &ni);
  const F p = expm1_reduced_f32(r) + F(1.0f);
  const U n1 = sar(ni, 1), n2 = ni - n1;
  const F s1 = bitcast<float>((n1 + U(127)) << 23), s2 = bitcast<float>((n2 + U(127)) << 23);
  return select(x < F(C::kLo), F(0.0f), (p * s1) * s2);
}

// exp(x) for x <= 0 (or NaN), as the softmax kernels call it on x - max: the same bits as
// exp_f32 there, cheaper. n <= 0, so 2^(n + 64) is a normal float for every n >= -150 and the
// scaling is (p 2^(n + 64)) 2^-64: the first product exact, the second the one rounding, as
// exp_f32's two steps; no upper clamp, no halving of n. Checked bit for bit against exp_f32 over
// every float <= 0 (tests/lib/ulp_test.cpp).
template <typename F>
KILN_MATH_INLINE F exp_nonpos_f32(F x) {
  using C = ExpF32;
  using U = Like<F, uint32_t>;
  F r;
  U ni;
  reduce_exp_f32(select(x < F(C::kLo), F(C::kLo), x), &r, &ni);
  const F p = expm1_reduced_f32(r) + F(1.0f);
  const F s = bitcast<float>((ni + U(127 + 64)) << 23);
  return select(x < F(C::kLo), F(0.0f), (p * s) * F(0x1p-64f));
}

struct TanhF32 {
  static constexpr float kSmall = 0.625f;  // below: the odd polynomial
  // 2|x| is clamped to this before its exp: from 2|x| = 18 on the result rounds to 1, and up to
  // here 2^n stays normal (n <= 93), so one multiplication applies it exactly.
  static constexpr float kExpHi = 64.0f;
  static constexpr float kPoly[5] = {-5.70498872745e-3f, 2.06390887954e-2f, -5.37397155531e-2f,
                                     1.33314422036e-1f, -3.33332819422e-1f};
};

// tanh(x) = sign(x) tanh(|x|), tanh(|x|): |x| + |x|^3 P(x^2) for |x| < 0.625 (Cephes), else
// 1 - 2 / (e^(2|x|) + 1); x's sign bit is put back last (+-0 kept). e^(2|x|) is exp_f32's
// reduction and polynomial on an argument in [0, 64], whose result is never subnormal, so 2^n is
// applied by one multiplication instead of exp_f32's two: the same bits as exp_f32 (both
// multiplications are exact there) with fewer instructions, on the GELU path.
template <typename F>
KILN_MATH_INLINE F tanh_f32(F x) {
  using C = TanhF32;
  using U = Like<F, uint32_t>;
  const U bits = bitcast<uint32_t>(x);
  const U sign = bits & U(0x80000000u);
  const F ax = bitcast<float>(bits & U(0x7fffffffu));
  const F z = ax * ax;
  const F small = fmadd(horner(z, C::kPoly) * z, ax, ax);
  const F x2 = ax + ax;
  F r;
  U ni;
  reduce_exp_f32(select(x2 > F(C::kExpHi), F(C::kExpHi), x2), &r, &ni);  // NaN stays NaN
  const F p = expm1_reduced_f32(r) + F(1.0f);
  const F e = p * bitcast<float>((ni + U(127)) << 23);
  const F big = F(1.0f) - F(2.0f) / (e + F(1.0f));
  const F magnitude = select(ax < F(C::kSmall), small, big);
  return bitcast<float>(bitcast<uint32_t>(magnitude) | sign);
}

struct LogF32 {
  static constexpr float kSmallest = 1.17549435e-38f;  // 2^-126: below, scale subnormals up
  static constexpr float kScale = 8388608.0f;          // 2^23
  static constexpr uint32_t kSqrtHalf = 0x3f3504f3;    // sqrt(1/2)
  static constexpr float kLn2Hi = 0.693359375f;        // ln 2 in two parts, k * hi exact
  static constexpr float kLn2Lo = -2.12194440e-4f;
  static constexpr float kPoly[9] = {7.0376836292e-2f,  -1.1514610310e-1f, 1.1676998740e-1f,
                                     -1.2420140846e-1f, 1.4249322787e-1f,  -1.6668057665e-1f,
                                     2.0000714765e-1f,  -2.4999993993e-1f, 3.3333331174e-1f};
};

// log(x): x = 2^k m with m in [sqrt(1/2), sqrt(2)) taken from the bits (subnormals scaled by 2^23
// first), f = m - 1 exact, log(1 + f) = f - f^2/2 + f^3 P(f) (Cephes' logf), plus k ln 2 in two
// parts.
template <typename F>
KILN_MATH_INLINE F log_f32(F x) {
  using C = LogF32;
  using U = Like<F, uint32_t>;
  const auto sub = x < F(C::kSmallest);
  const F xs = select(sub, x * F(C::kScale), x);
  const U bias = select(sub, U(23), U(0));
  const U ix = bitcast<uint32_t>(xs) + U(0x3f800000u - C::kSqrtHalf);
  const U k = ((ix >> 23) - U(127)) - bias;
  const F f = bitcast<float>((ix & U(0x007fffffu)) + U(C::kSqrtHalf)) - F(1.0f);
  const F fk = convert<float>(k);
  const F z = f * f;
  F y = horner(f, C::kPoly) * f * z;
  y = fmadd(F(C::kLn2Lo), fk, y);
  y = fmadd(F(-0.5f), z, y);
  F r = fmadd(F(C::kLn2Hi), fk, f + y);
  const F inf = bitcast<float>(U(0x7f800000u));
  r = select(x < F(0.0f), bitcast<float>(U(0x7fc00000u)), r);
  r = select(x == F(0.0f), -inf, r);
  r = select(x == inf, inf, r);
  return select(x != x, x, r);
}

struct Log1pF32 {
  static constexpr float kTiny = 5.96046448e-8f;  // 2^-24: below, log1p(x) rounds to x
};

// log1p(x) = log(u) + c / u with u = 1 + x rounded and c = 1 + x - u exactly (Fast2Sum, the
// larger operand first): the correction carries what rounding u lost.
template <typename F>
KILN_MATH_INLINE F log1p_f32(F x) {
  using U = Like<F, uint32_t>;
  const F u = F(1.0f) + x;
  const F ax = abs_of(x);
  const F c = select(ax <= F(1.0f), x - (u - F(1.0f)), F(1.0f) - (u - x));
  F r = log_f32(u) + c / u;
  const F inf = bitcast<float>(U(0x7f800000u));
  r = select(ax < F(Log1pF32::kTiny), x, r);  // +-0 kept
  r = select(x == F(-1.0f), -inf, r);
  return select(x == inf, inf, r);
}

struct Expm1F32 {
  static constexpr float kLo = -30.0f;            // below, expm1 rounds to -1
  static constexpr float kTiny = 2.98023224e-8f;  // 2^-25: below, expm1(x) rounds to x
};

// expm1(x) = 2^n (e^r - 1) + (2^n - 1) with x = n ln 2 + r as in exp_f32, e^r - 1 = r + r^2 P(r)
// (exp_f32's polynomial). n = 128 (x near the overflow bound) takes 2^127 and doubles the result.
template <typename F>
KILN_MATH_INLINE F expm1_f32(F x) {
  using E = ExpF32;
  using C = Expm1F32;
  using U = Like<F, uint32_t>;
  F r;
  U ni;
  reduce_exp_f32(clamp(x, F(C::kLo), F(E::kHi)), &r, &ni);
  const F em = expm1_reduced_f32(r);
  const auto big = lt_signed(U(127), ni);
  const F s = bitcast<float>((ni - select(big, U(1), U(0)) + U(127)) << 23);
  F y = fmadd(s, em, s - F(1.0f));
  y = select(big, y * F(2.0f), y);
  y = select(x > F(E::kHi), bitcast<float>(U(0x7f800000u)), y);
  return select(abs_of(x) < F(C::kTiny), x, y);
}

// The bits of 2/pi for reduce_large_f32: entry j is floor(2/pi * 2^(8j + 8)) mod 2^32.
struct InvPio2F32 {
  static constexpr const char* kName = "kiln_inv_pio2_f32";
  static constexpr int kSize = 24;
  static constexpr uint32_t kData[24] = {0x000000a2, 0x0000a2f9, 0x00a2f983, 0xa2f9836e, 0xf9836e4e,
                                         0x836e4e44, 0x6e4e4415, 0x4e441529, 0x441529fc, 0x1529fc27,
                                         0x29fc2757, 0xfc2757d1, 0x2757d1f5, 0x57d1f534, 0xd1f534dd,
                                         0xf534ddc0, 0x34ddc0db, 0xddc0db62, 0xc0db6295, 0xdb629599,
                                         0x6295993c, 0x95993c43, 0x993c4390, 0x3c439041};
};

struct SinCosF32 {
  static constexpr float kFast = 1048576.0f;  // 2^20: from here up, the integer reduction
  static constexpr double k2OverPi = 0x1.45f306dc9c883p-1;
  static constexpr double kMagic = 0x1.8p52;          // adding it rounds to integer
  static constexpr double kPio2Hi = 0x1.921fb544p+0;  // pi/2: 33 bits (n * hi exact), the rest
  static constexpr double kPio2Lo = 0x1.0b4611a626331p-34;
  static constexpr double kPi63 = 0x1.921fb54442d18p-62;  // pi * 2^-63
  // sin r = r + r^3 S(r^2), cos r = 1 - r^2/2 + r^4 C(r^2) on |r| <= pi/4 (fdlibm's kernels,
  // cut to float accuracy), coefficients in ascending order.
  static constexpr double kSin[4] = {-1.66666666666666324348e-01, 8.33333333332248946124e-03,
                                     -1.98412698298579493134e-04, 2.75573137070700676789e-06};
  static constexpr double kCos[4] = {4.16666666666666019037e-02, -1.38888888888741095749e-03,
                                     2.48015872894767294178e-05, -2.75573143513906633035e-07};
};

// |x| for |x| >= 2 (xi: its bits) as n pi/2 + r, |r| <= pi/4 (n mod 4 in *quadrant): the
// fixed-point product of the float's 24-bit significand and a 96-bit window of 2/pi's bits
// picked by its exponent, exact to 2^-62 of the quadrant (ARM optimized-routines'
// reduce_large). Indices stay in the table for every xi.
template <typename U>
KILN_MATH_INLINE Like<U, double> reduce_large_f32(U xi, U* quadrant) {
  using C = SinCosF32;
  using U64 = Like<U, uint64_t>;
  const U j = (xi >> 26) & U(15);
  const U m = ((xi & U(0x7fffffu)) | U(0x800000u)) << ((xi >> 23) & U(7));
  const U64 m64 = convert<uint64_t>(m);
  const U64 r0 = convert<uint64_t>(m * gather<InvPio2F32>(j));
  const U64 r1 = m64 * convert<uint64_t>(gather<InvPio2F32>(j + U(4)));
  const U64 r2 = m64 * convert<uint64_t>(gather<InvPio2F32>(j + U(8)));
  U64 f = ((r2 >> 32) | (r0 << 32)) + r1;  // 2.62 fixed point: x 2/pi mod 4
  const U64 n = (f + U64(uint64_t{1} << 61)) >> 62;
  f = f - (n << 62);
  *quadrant = convert<uint32_t>(n);
  return convert<double>(f) * Like<U, double>(C::kPi63);
}

// x = n pi/2 + r in double (n mod 4 returned): |x| < 2^20 by Cody-Waite with pi/2 in two parts
// (exact to 2^-66 there), larger |x| by reduce_large_f32 on |x| and the signs flipped (computed
// only where some lane needs it: only_where_needed).
template <typename F>
KILN_MATH_INLINE Like<F, uint32_t> reduce_pio2_f32(F x, Like<F, double>* r) {
  using C = SinCosF32;
  using D = Like<F, double>;
  using U = Like<F, uint32_t>;
  const D xd = convert<double>(x);
  const auto negative = x < F(0.0f);
  const F ax = abs_of(x);
  const D t = fmadd(xd, D(C::k2OverPi), D(C::kMagic));
  const D n = t - D(C::kMagic);
  const U q_fast = convert<uint32_t>(bitcast<uint64_t>(t));
  const D r_fast = fmadd(-n, D(C::kPio2Lo), fmadd(-n, D(C::kPio2Hi), xd));
  const auto fast = ax < F(C::kFast);
  const auto [rl, ql] = only_where_needed(
      !fast,
      [&]() KILN_MATH_LAMBDA_INLINE {
        U q;
        const D large = reduce_large_f32(bitcast<uint32_t>(ax), &q);
        return std::tuple{large, q};
      },
      std::tuple{D(0.0), U(0)});
  *r = select(fast, r_fast, select(negative, -rl, rl));
  return select(fast, q_fast, select(negative, U(0) - ql, ql));
}

// sin r and cos r in double for |r| <= pi/4 (float32's polynomials).
template <typename D>
KILN_MATH_INLINE void sin_cos_reduced_f32(D r, D* s, D* c) {
  using C = SinCosF32;
  const D z = r * r;
  *s = fmadd(r * z, horner_up(z, C::kSin), r);
  *c = fmadd(z * z, horner_up(z, C::kCos), fmadd(D(-0.5), z, D(1.0)));
}

// sin(x) (cosine false) or cos(x), in double: x = n pi/2 + r, then +-sin r or +-cos r by n mod 4
// (cos x = sin(x + pi/2): one more quadrant). Then one rounding to float.
template <bool kCosine, typename F>
KILN_MATH_INLINE F sincos_f32(F x) {
  using D = Like<F, double>;
  using U = Like<F, uint32_t>;
  D r, s, c;
  U q = reduce_pio2_f32(x, &r);
  if (kCosine) q = q + U(1);
  sin_cos_reduced_f32(r, &s, &c);
  D v = select((q & U(1)) != U(0), c, s);
  v = select((q & U(2)) != U(0), -v, v);
  F y = convert<float>(v);
  if (!kCosine) y = select(x == F(0.0f), x, y);  // sin(-0) = -0 (the polynomial gives +0)
  return select(abs_of(x) < bitcast<float>(U(0x7f800000u)), y, x - x);  // inf and NaN: NaN
}
template <typename F>
KILN_MATH_INLINE F sin_f32(F x) {
  return sincos_f32<false>(x);
}
template <typename F>
KILN_MATH_INLINE F cos_f32(F x) {
  return sincos_f32<true>(x);
}

// ---- float64 (fdlibm's algorithms and coefficients, rewritten branch-free) ----

struct ExpF64 {
  static constexpr double kLo = -746.0;  // below: 0 (exp(-746) rounds to 0)
  static constexpr double kHi = 710.0;   // above: inf (exp(710) overflows)
  static constexpr double kLog2e = 1.44269504088896338700e+00;
  static constexpr double kMagic = 0x1.8p52;  // adding it rounds to integer
  static constexpr uint64_t kMagicBits = 0x4338000000000000u;
  static constexpr double kLn2Hi = 6.93147180369123816490e-01;  // 32 bits: k * hi exact
  static constexpr double kLn2Lo = 1.90821492927058770002e-10;
  static constexpr double kPoly[5] = {1.66666666666666019037e-01, -2.77777777770155933842e-03,
                                      6.61375632143793436117e-05, -1.65339022054652515390e-06,
                                      4.13813679705723846039e-08};
};

// exp(x) (fdlibm's e_exp.c): x = k ln 2 + r, |r| <= ln2/2, e^r = 1 + r + r c/(2 - c) with
// c = r - r^2 P(r^2), times 2^k as 2^(k/2) 2^(k - k/2) (so that subnormal results round once).
template <typename F>
KILN_MATH_INLINE F exp_f64(F x) {
  using C = ExpF64;
  using U = Like<F, uint64_t>;
  const F xc = clamp(x, F(C::kLo), F(C::kHi));
  const F t = fmadd(xc, F(C::kLog2e), F(C::kMagic));
  const F k = t - F(C::kMagic);
  const U ki = bitcast<uint64_t>(t) - U(C::kMagicBits);
  const F hi = xc - k * F(C::kLn2Hi);
  const F lo = k * F(C::kLn2Lo);
  const F r = hi - lo;
  const F z = r * r;
  const F c = fmadd(-z, horner_up(z, C::kPoly), r);
  const F y = F(1.0) - ((lo - (r * c) / (F(2.0) - c)) - hi);
  const U k1 = sar(ki, 1), k2 = ki - k1;
  const F s1 = bitcast<double>((k1 + U(1023)) << 52);
  const F s2 = bitcast<double>((k2 + U(1023)) << 52);
  return (y * s1) * s2;
}

struct LogF64 {
  static constexpr double kSmallest = 0x1p-1022;  // below, scale subnormals up
  static constexpr double kScale = 0x1p54;
  static constexpr uint64_t kSqrtHalf = 0x3fe6a09e00000000;  // about sqrt(1/2)
  static constexpr double kLn2Hi = 6.93147180369123816490e-01;
  static constexpr double kLn2Lo = 1.90821492927058770002e-10;
  static constexpr double kLgOdd[4] = {6.666666666666735130e-01, 2.857142874366239149e-01,
                                       1.818357216161805012e-01,
                                       1.479819860511658591e-01};  // Lg1, Lg3, Lg5, Lg7
  static constexpr double kLgEven[3] = {3.999999999940941908e-01, 2.222219843214978396e-01,
                                        1.531383769920937332e-01};  // Lg2, Lg4, Lg6
};

// log(1 + f) - f + hfsq's pieces, fdlibm's R(s^2): s = f / (2 + f), the polynomial in two halves
// over w = s^4.
template <typename F>
KILN_MATH_INLINE F log_r_f64(F s) {
  using C = LogF64;
  const F z = s * s;
  const F w = z * z;
  const F t1 = w * horner_up(w, C::kLgEven);
  const F t2 = z * horner_up(w, C::kLgOdd);
  return t2 + t1;
}

// x's bits plus the offset that puts [sqrt(1/2), sqrt(2)) into one binade.
template <typename U>
KILN_MATH_INLINE U log_offset_bits(U bits) {
  return bits + U(0x3ff0000000000000u - LogF64::kSqrtHalf);
}

// log(x) (fdlibm's e_log.c): x = 2^k (1 + f), 1 + f in [sqrt(1/2), sqrt(2)) from the bits,
// s = f / (2 + f), log(1 + f) = f - hfsq + s (hfsq + R(s^2)), hfsq = f^2/2.
template <typename F>
KILN_MATH_INLINE F log_f64(F x) {
  using C = LogF64;
  using U = Like<F, uint64_t>;
  const auto sub = x < F(C::kSmallest);
  const F xs = select(sub, x * F(C::kScale), x);
  const U bias = select(sub, U(54), U(0));
  const U ix = log_offset_bits(bitcast<uint64_t>(xs));
  const U k = ((ix >> 52) - U(1023)) - bias;
  const F f = bitcast<double>((ix & U(0x000fffffffffffffu)) + U(C::kSqrtHalf)) - F(1.0);
  const F hfsq = F(0.5) * f * f;
  const F s = f / (F(2.0) + f);
  const F dk = convert<double>(k);
  F r = dk * F(C::kLn2Hi) - ((hfsq - fmadd(s, hfsq + log_r_f64(s), dk * F(C::kLn2Lo))) - f);
  const F inf = bitcast<double>(U(0x7ff0000000000000u));
  r = select(x < F(0.0), bitcast<double>(U(0x7ff8000000000000u)), r);
  r = select(x == F(0.0), -inf, r);
  r = select(x == inf, inf, r);
  return select(x != x, x, r);
}

struct Expm1F64 {
  static constexpr double kLo = -40.0;                       // below: -1 (e^-40 < 2^-57)
  static constexpr double kHi = 7.09782712893383973096e+02;  // above: inf
  static constexpr double kTiny = 0x1p-54;                   // below: x
  // fdlibm's s_expm1.c: R1(z) = 1 + Q1 z + ... + Q5 z^5, z = r^2/2, within 2^-61 on [0, 0.347].
  static constexpr double kQ[6] = {1.0,
                                   -3.33333333333331316428e-02,
                                   1.58730158725481460165e-03,
                                   -7.93650757867487942473e-05,
                                   4.00821782732936239552e-06,
                                   -2.01099218183624371326e-07};
};

// expm1(x) (fdlibm's algorithm): x = k ln 2 + r as in exp_f64 with r = hi - lo rounded and c
// the rounding's error, expm1(r + c) = r - e with e from fdlibm's rational form, then
// 2^k (1 + expm1(r)) - 1 rearranged by k so that it rounds about once: k = 0: r - e;
// k = -1: (r - e)/2 - 1/2; k = 1: 2 (r - e) + 1; 2 <= k < 20: 2^k (r - e + (1 - 2^-k));
// 20 <= k <= 56: 2^k (r - (e + 2^-k) + 1); else 2^k (r - e + 1) - 1 (k = 1024 as 2^1023 * 2).
template <typename F>
KILN_MATH_INLINE F expm1_f64(F x) {
  using E = ExpF64;
  using C = Expm1F64;
  using U = Like<F, uint64_t>;
  const F xc = clamp(x, F(C::kLo), F(C::kHi));
  const F t = fmadd(xc, F(E::kLog2e), F(E::kMagic));
  const F kd = t - F(E::kMagic);
  const U k = bitcast<uint64_t>(t) - U(E::kMagicBits);  // two's complement
  const F hi = xc - kd * F(E::kLn2Hi);
  const F lo = kd * F(E::kLn2Lo);
  const F r = hi - lo;
  const F c = (hi - r) - lo;
  const F hfx = F(0.5) * r;
  const F hxs = r * hfx;
  const F r1 = horner_up(hxs, C::kQ);
  const F tt = fmadd(-r1, hfx, F(3.0));
  F e = hxs * ((r1 - tt) / fmadd(-r, tt, F(6.0)));
  e = r * (e - c) - c;
  e = e - hxs;
  const F em = r - e;
  const F y_m1 = F(0.5) * em - F(0.5);
  const F y_p1 = select(r < F(-0.25), F(-2.0) * (e - (r + F(0.5))), F(2.0) * em + F(1.0));
  const auto top = k == U(1024);
  const F twopk = bitcast<double>((k - select(top, U(1), U(0)) + U(1023)) << 52);
  const F twomk = bitcast<double>((U(1023) - k) << 52);
  F y_far = (em + F(1.0)) * twopk;
  y_far = select(top, y_far * F(2.0), y_far) - F(1.0);
  const F y_mid = (em + (F(1.0) - twomk)) * twopk;
  const F y_high = ((r - (e + twomk)) + F(1.0)) * twopk;
  F y = select(lt_signed(k, U(20)), y_mid, y_high);
  y = select(lt_signed(k, U(0)) | lt_signed(U(56), k), y_far, y);
  y = select(k == U(1), y_p1, y);
  y = select(k == U(uint64_t{0} - 1), y_m1, y);
  y = select(k == U(0), em, y);
  y = select(x > F(C::kHi), bitcast<double>(U(0x7ff0000000000000u)), y);
  y = select(x < F(C::kLo), F(-1.0), y);
  return select(abs_of(x) < F(C::kTiny), x, y);
}

struct Log1pF64 {
  static constexpr double kTiny = 0x1p-54;  // below: x
};

// log1p(x) as log_f64 computes log(u), u = 1 + x rounded and c = 1 + x - u exactly (Fast2Sum):
// u = 2^k (1 + f), log1p(x) = k ln 2 + log(1 + f) + c / u, the correction added with k ln2's low
// part, before the last roundings (fdlibm's s_log1p.c). Where k = 0, f is x itself (exact).
template <typename F>
KILN_MATH_INLINE F log1p_f64(F x) {
  using C = LogF64;
  using U = Like<F, uint64_t>;
  const F u = F(1.0) + x;
  const F ax = abs_of(x);
  const F c = select(ax <= F(1.0), x - (u - F(1.0)), F(1.0) - (u - x));
  const U iu = log_offset_bits(bitcast<uint64_t>(u));
  const U k = (iu >> 52) - U(1023);
  const F fu = bitcast<double>((iu & U(0x000fffffffffffffu)) + U(C::kSqrtHalf)) - F(1.0);
  const auto k0 = k == U(0);
  const F f = select(k0, x, fu);
  const F cu = select(k0, F(0.0), c / u);
  const F hfsq = F(0.5) * f * f;
  const F s = f / (F(2.0) + f);
  const F dk = convert<double>(k);
  F r =
      dk * F(C::kLn2Hi) - ((hfsq - fmadd(s, hfsq + log_r_f64(s), fmadd(dk, F(C::kLn2Lo), cu))) - f);
  const F inf = bitcast<double>(U(0x7ff0000000000000u));
  r = select(ax < F(Log1pF64::kTiny), x, r);  // +-0 kept
  r = select(x < F(-1.0), bitcast<double>(U(0x7ff8000000000000u)), r);
  r = select(x == F(-1.0), -inf, r);
  r = select(x == inf, inf, r);
  return select(x != x, x, r);
}

struct TanhF64 {
  static constexpr double kTiny = 0x1p-28;                    // below: x
  static constexpr double kMid = 5.49306144334054845697e-01;  // log(3)/2: tanh = 1/2
};

// tanh(|x|) = u / (u + 2) below log(3)/2, else 1 - 2 / (u + 2), u = expm1(2|x|) (fdlibm's
// s_tanh.c); x's sign.
template <typename F>
KILN_MATH_INLINE F tanh_f64(F x) {
  const F ax = abs_of(x);
  const F u = expm1_f64(ax + ax);
  const F d = u + F(2.0);
  F t = select(ax < F(TanhF64::kMid), u / d, F(1.0) - F(2.0) / d);
  t = select(x < F(0.0), -t, t);
  return select(ax < F(TanhF64::kTiny), x, t);  // +-0 kept
}

struct ErfF64 {
  // fdlibm's s_erf.c: its intervals and rational approximations (ascending coefficients).
  static constexpr double kTiny = 0x1p-28;     // below: x (1 + efx)
  static constexpr double kSmall = 0.84375;    // below: x + x P(x^2) / Q(x^2)
  static constexpr double kMid = 1.25;         // below: erx + P(|x| - 1) / Q(|x| - 1)
  static constexpr double kFar = 0x1.6db6ep1;  // about 1/0.35: from here, R and S's second set
  static constexpr double kBig = 6.0;          // from here: +-1
  static constexpr double kEfx8 = 1.02703333676410069053e+00;  // 8 (2/sqrt(pi) - 1)
  static constexpr double kErx = 8.45062911510467529297e-01;   // erf(1) to float precision
  static constexpr double kPp[5] = {1.28379167095512558561e-01, -3.25042107247001499370e-01,
                                    -2.84817495755985104766e-02, -5.77027029648944159157e-03,
                                    -2.37630166566501626084e-05};
  static constexpr double kQq[6] = {1.0,
                                    3.97917223959155352819e-01,
                                    6.50222499887672944485e-02,
                                    5.08130628187576562776e-03,
                                    1.32494738004321644526e-04,
                                    -3.96022827877536812320e-06};
  static constexpr double kPa[7] = {-2.36211856075265944077e-03, 4.14856118683748331666e-01,
                                    -3.72207876035701323847e-01, 3.18346619901161753674e-01,
                                    -1.10894694282396677476e-01, 3.54783043256182359371e-02,
                                    -2.16637559486879084300e-03};
  static constexpr double kQa[7] = {1.0,
                                    1.06420880400844228286e-01,
                                    5.40397917702171048937e-01,
                                    7.18286544141962662868e-02,
                                    1.26171219808761642112e-01,
                                    1.36370839120290507362e-02,
                                    1.19844998467991074170e-02};
  // erfc(x) = exp(-x^2 - 0.5625 + R(1/x^2) / S(1/x^2)) / x: coefficients for [1.25, 1/0.35),
  // then for [1/0.35, 28) padded with zeros to the same length.
  static constexpr double kRa[8] = {-9.86494403484714822705e-03, -6.93858572707181764372e-01,
                                    -1.05586262253232909814e+01, -6.23753324503260060396e+01,
                                    -1.62396669462573470355e+02, -1.84605092906711035994e+02,
                                    -8.12874355063065934246e+01, -9.81432934416914548592e+00};
  static constexpr double kSa[9] = {1.0,
                                    1.96512716674392571292e+01,
                                    1.37657754143519042600e+02,
                                    4.34565877475229228821e+02,
                                    6.45387271733267880336e+02,
                                    4.29008140027567833386e+02,
                                    1.08635005541779435134e+02,
                                    6.57024977031928170135e+00,
                                    -6.04244152148580987438e-02};
  static constexpr double kRb[8] = {-9.86494292470009928597e-03, -7.99283237680523006574e-01,
                                    -1.77579549177547519889e+01, -1.60636384855821916062e+02,
                                    -6.37566443368389627722e+02, -1.02509513161107724954e+03,
                                    -4.83519191608651397019e+02, 0.0};
  static constexpr double kSb[9] = {1.0,
                                    3.03380607434824582924e+01,
                                    3.25792512996573918826e+02,
                                    1.53672958608443695994e+03,
                                    3.19985821950859553908e+03,
                                    2.55305040643316442583e+03,
                                    4.74528541206955367215e+02,
                                    -2.24409524465858183362e+01,
                                    0.0};
};

// Ascending Horner whose coefficients are picked per lane: b where `use_b`, else a.
template <typename F, typename M, int N>
KILN_MATH_INLINE F horner_up_pick(F x, M use_b, const double (&a)[N], const double (&b)[N]) {
  F p = select(use_b, F(b[N - 1]), F(a[N - 1]));
#pragma GCC unroll 16
  for (int i = N - 2; i >= 0; --i) p = fmadd(p, x, select(use_b, F(b[i]), F(a[i])));
  return p;
}

// erfc(a) for a in [1.25, 28) (fdlibm's s_erf.c): exp(-z^2 - 0.5625) exp((z - a)(z + a) + R/S) / a,
// z = a with its low 32 bits cleared (so z^2 is exact). Shared by erf and erfc.
template <typename F>
KILN_MATH_INLINE F erfc_tail_f64(F a) {
  using C = ErfF64;
  using U = Like<F, uint64_t>;
  const auto far = a >= F(C::kFar);
  const F v = F(1.0) / (a * a);
  const F rs = horner_up_pick(v, far, C::kRa, C::kRb);
  const F ss = horner_up_pick(v, far, C::kSa, C::kSb);
  const F zh = bitcast<double>(bitcast<uint64_t>(a) & U(0xffffffff00000000u));
  return exp_f64(-zh * zh - F(0.5625)) * exp_f64((zh - a) * (zh + a) + rs / ss) / a;
}

// erf(x) on |x| (fdlibm's s_erf.c, every interval computed and the right one selected), then
// x's sign: |x| < 2^-28: x + efx x (as (8x + 8efx x) / 8, exact scalings that keep subnormals);
// < 0.84375: x + x P/Q(x^2); < 1.25: erx + P/Q(|x| - 1); < 6: 1 - erfc(|x|) (erfc_tail_f64);
// from 6 on: 1.
template <typename F>
KILN_MATH_INLINE F erf_f64(F x) {
  using C = ErfF64;
  const F ax = abs_of(x);
  const F y_tiny = F(0.125) * fmadd(F(8.0), ax, F(C::kEfx8) * ax);
  const F z = ax * ax;
  const F y_small = fmadd(ax, horner_up(z, C::kPp) / horner_up(z, C::kQq), ax);
  const F s = ax - F(1.0);
  const F y_mid = F(C::kErx) + horner_up(s, C::kPa) / horner_up(s, C::kQa);
  const F y_big = F(1.0) - erfc_tail_f64(ax);
  F y = select(ax < F(C::kBig), y_big, F(1.0));
  y = select(ax < F(C::kMid), y_mid, y);
  y = select(ax < F(C::kSmall), y_small, y);
  y = select(ax < F(C::kTiny), y_tiny, y);
  y = select(x < F(0.0), -y, y);
  return select(x != x, x, y);
}

// erf(x) for float32: erf_f64 of x, rounded once (within 1 ulp, and at most 1 in magnitude: a
// float32 rational approximation was 7 ulp off and rounded past 1 near |x| = 3.6-4).
template <typename F>
KILN_MATH_INLINE F erf_f32(F x) {
  return convert<float>(erf_f64(convert<double>(x)));
}

// Bits of 2/pi behind 63 zero bits: bit p of the table (word p / 32, from its most significant
// bit) is 2/pi's bit of weight 2^(63 - p). 40 words cover every double's window.
struct InvPio2F64 {
  static constexpr const char* kName = "kiln_inv_pio2_f64";
  static constexpr int kSize = 40;
  static constexpr uint32_t kData[40] = {
      0x00000000, 0x00000000, 0xa2f9836e, 0x4e441529, 0xfc2757d1, 0xf534ddc0, 0xdb629599,
      0x3c439041, 0xfe5163ab, 0xdebbc561, 0xb7246e3a, 0x424dd2e0, 0x06492eea, 0x09d1921c,
      0xfe1deb1c, 0xb129a73e, 0xe88235f5, 0x2ebb4484, 0xe99c7026, 0xb45f7e41, 0x3991d639,
      0x835339f4, 0x9c845f8b, 0xbdf9283b, 0x1ff897ff, 0xde05980f, 0xef2f118b, 0x5a0a6d1f,
      0x6d367ecf, 0x27cb09b7, 0x4f463f66, 0x9e5fea2d, 0x7527bac7, 0xebe5f17b, 0x3d0739f7,
      0x8a5292ea, 0x6bfb5fb1, 0x1f8d5d08, 0x56033046, 0xfc7b6bab};
};

struct SinCosF64 {
  static constexpr double kFast = 0x1p20;  // below: Cody-Waite (n < 2^20); from here Payne-Hanek
  static constexpr double k2OverPi = 6.36619772367581382433e-01;
  static constexpr double kMagic = 0x1.8p52;  // adding it rounds to integer
  // pi/2 = kPio2[0] + kPio2[1] + kPio2[2] + kPio2[3] to 152 bits; the first three have 33
  // significant bits, so that n times each is exact for n < 2^20 (fdlibm's pio2_1, pio2_2,
  // pio2_3, pio2_3t).
  static constexpr double kPio2[4] = {1.57079632673412561417e+00, 6.07710050630396597660e-11,
                                      2.02226624871116645580e-21, 8.47842766036889956997e-32};
  static constexpr double kPio2Hi = 0x1.921fb54442d18p0;  // pi/2 as a double-double
  static constexpr double kPio2Lo = 0x1.1a62633145c07p-54;
  static constexpr double kSplit = 134217729.0;  // 2^27 + 1: Veltkamp's splitting
  // sin r = r + S1 r^3 + ... + S6 r^13 and cos r = 1 - r^2/2 + C1 r^4 + ... + C6 r^14 on
  // |r| <= pi/4, within 2^-58 (fdlibm's k_sin.c and k_cos.c).
  static constexpr double kSin[6] = {-1.66666666666666324348e-01, 8.33333333332248946124e-03,
                                     -1.98412698298579493134e-04, 2.75573137070700676789e-06,
                                     -2.50507602534068634195e-08, 1.58969099521155010221e-10};
  static constexpr double kCos[6] = {4.16666666666666019037e-02, -1.38888888888741095749e-03,
                                     2.48015872894767294178e-05, -2.75573143513906633035e-07,
                                     2.08757232129817482790e-09, -1.13596475577881948265e-11};
};

// s + e = a + b exactly (Knuth's TwoSum; plain operations).
template <typename F>
KILN_MATH_INLINE F two_sum(F a, F b, F* e) {
  const F s = a + b;
  const F bb = s - a;
  *e = (a - (s - bb)) + (b - bb);
  return s;
}
// p + e = a * b exactly (Dekker's product, the operands split in halves by Veltkamp's method;
// plain operations, which never contract: an FMA would break the split).
template <typename F>
KILN_MATH_INLINE F two_product(F a, F b, F* e) {
  using C = SinCosF64;
  const F p = a * b;
  const F ta = F(C::kSplit) * a;
  const F ah = ta - (ta - a);
  const F al = a - ah;
  const F tb = F(C::kSplit) * b;
  const F bh = tb - (tb - b);
  const F bl = b - bh;
  *e = (((ah * bh - p) + ah * bl) + al * bh) + al * bl;
  return p;
}

// x = n pi/2 + (hi + lo), |x| < 2^20: n = x 2/pi rounded (its low bits from the rounded value's
// bits); x - n pi/2 with pi/2 in four parts, the first three products exact, summed by TwoSum.
template <typename F>
KILN_MATH_INLINE Like<F, uint32_t> reduce_medium_f64(F x, F* hi, F* lo) {
  using C = SinCosF64;
  const F t = x * F(C::k2OverPi) + F(C::kMagic);
  const F n = t - F(C::kMagic);
  const F a = x - n * F(C::kPio2[0]);
  F e1, e2;
  const F s1 = two_sum(a, -(n * F(C::kPio2[1])), &e1);
  const F s2 = two_sum(s1, -(n * F(C::kPio2[2])), &e2);
  const F tail = (e1 + e2) - n * F(C::kPio2[3]);
  *hi = s2 + tail;
  *lo = tail - (*hi - s2);
  return convert<uint32_t>(bitcast<uint64_t>(t));
}

// |x| >= 2^20 (ix: its bits) as n pi/2 + (hi + lo), Payne-Hanek: |x| = m 2^(E - 1075) with a
// 53-bit integer m, and x 2/pi mod 4 = m W 2^-190 mod 4, W the 192 bits of 2/pi from the one of
// weight 2^(E - 1076) on (the bits before it add multiples of 4; those after, less than 2^-137).
// The product modulo 2^192 is formed from 32-bit limbs (each partial product fits 64 bits,
// each column sum of 32-bit halves well within them), n is its top 2 bits rounded, and the
// rest, a signed fraction of a quadrant with 126 bits (|fraction| >= 2^-62 for every double),
// becomes a double-double and is multiplied by pi/2 (Dekker). The exponent is clamped to
// [1043, 2046] so that other lanes (smaller |x|, inf, NaN) index the table in range.
template <typename U>
KILN_MATH_INLINE Like<U, uint32_t> reduce_large_f64(U ix, Like<U, double>* hi,
                                                    Like<U, double>* lo) {
  using C = SinCosF64;
  using F = Like<U, double>;
  const U e = clamp(ix >> 52, U(1043), U(2046));
  const U p0 = e - U(1013);  // the window's first bit in the table
  const U k = p0 >> 5, sh = p0 & U(31);
  U words[7];
  for (int j = 0; j < 7; ++j) words[j] = convert<uint64_t>(gather<InvPio2F64>(k + U(j)));
  U w[6];  // the window, w[5] most significant
  for (int j = 0; j < 6; ++j) w[5 - j] = (((words[j] << 32) | words[j + 1]) << sh) >> 32;
  const U m = (ix & U(0x000fffffffffffffu)) | U(0x0010000000000000u);
  const U m0 = m & U(0xffffffffu), m1 = m >> 32;
  U pa[6], pb[5];
  for (int j = 0; j < 6; ++j) pa[j] = m0 * w[j];
  for (int j = 0; j < 5; ++j) pb[j] = m1 * w[j];
  U out[6];
  U carry = U(0);
  for (int j = 0; j < 6; ++j) {
    U col = carry + (pa[j] & U(0xffffffffu));
    if (j >= 1) col = col + (pa[j - 1] >> 32) + (pb[j - 1] & U(0xffffffffu));
    if (j >= 2) col = col + (pb[j - 2] >> 32);
    out[j] = col & U(0xffffffffu);
    carry = col >> 32;
  }
  const U top = (out[5] << 32) | out[4];  // 2.62 fixed point: x 2/pi mod 4
  const U mid = (out[3] << 32) | out[2];  // the next 64 bits
  const U n = (top + U(uint64_t{1} << 61)) >> 62;
  const U f = top - (n << 62);  // the fraction's top, signed: |f| <= 2^61
  // The fraction as three exact doubles: f's top 53 bits, its low 11 and mid's top 42, mid's
  // low 22.
  const U f_hi = sar(f, 11);
  const U f_mid = ((f & U(0x7ffu)) << 42) | (mid >> 22);
  const U f_lo = mid & U(0x3fffffu);
  F e1;
  const F s =
      two_sum(convert<double>(f_hi) * F(0x1p-51), convert<double>(f_mid) * F(0x1p-104), &e1);
  const F l = e1 + convert<double>(f_lo) * F(0x1p-126);
  F pe;
  const F p = two_product(s, F(C::kPio2Hi), &pe);
  const F e2 = pe + (s * F(C::kPio2Lo) + l * F(C::kPio2Hi));
  *hi = p + e2;
  *lo = e2 - (*hi - p);
  return convert<uint32_t>(n);
}

// sin(x + y) and cos(x + y) for |x| <= pi/4, y the tail (fdlibm's k_sin.c and k_cos.c).
template <typename F>
KILN_MATH_INLINE F kernel_sin_f64(F x, F y) {
  const auto& s = SinCosF64::kSin;
  const F z = x * x;
  const F w = z * z;
  const F r = fmadd(z, fmadd(z, F(s[3]), F(s[2])), F(s[1])) + z * w * fmadd(z, F(s[5]), F(s[4]));
  const F v = z * x;
  return x - ((z * (F(0.5) * y - v * r) - y) - v * F(s[0]));
}
template <typename F>
KILN_MATH_INLINE F kernel_cos_f64(F x, F y) {
  const auto& c = SinCosF64::kCos;
  const F z = x * x;
  const F w = z * z;
  const F r = z * fmadd(z, fmadd(z, F(c[2]), F(c[1])), F(c[0])) +
              w * w * fmadd(z, fmadd(z, F(c[5]), F(c[4])), F(c[3]));
  const F hz = F(0.5) * z;
  const F h = F(1.0) - hz;  // 1 - hz = h + ((1 - h) - hz) exactly
  return h + (((F(1.0) - h) - hz) + (z * r - x * y));
}

// x = n pi/2 + (hi + lo), n mod 4 returned: reduce_medium_f64 below 2^20, else reduce_large_f64
// on |x| and the signs flipped (the large one computed only where some lane needs it:
// only_where_needed); the right one is selected.
template <typename F>
KILN_MATH_INLINE Like<F, uint32_t> reduce_pio2_f64(F x, F* hi, F* lo) {
  using C = SinCosF64;
  using U = Like<F, uint32_t>;
  const auto negative = x < F(0.0);
  const F ax = abs_of(x);
  const auto fast = ax < F(C::kFast);
  F hf, lf;
  const U qf = reduce_medium_f64(x, &hf, &lf);
  const auto [ql, hl, ll] = only_where_needed(
      !fast,
      [&]() KILN_MATH_LAMBDA_INLINE {
        F h, l;
        const U q = reduce_large_f64(bitcast<uint64_t>(ax), &h, &l);
        return std::tuple{q, h, l};
      },
      std::tuple{U(0), F(0.0), F(0.0)});
  *hi = select(fast, hf, select(negative, -hl, hl));
  *lo = select(fast, lf, select(negative, -ll, ll));
  return select(fast, qf, select(negative, U(0) - ql, ql));
}

// sin(x) (cosine false) or cos(x): x = n pi/2 + r, then +-sin r or +-cos r by n mod 4 (cos x =
// sin(x + pi/2): one more quadrant).
template <bool kCosine, typename F>
KILN_MATH_INLINE F sincos_f64(F x) {
  using U = Like<F, uint32_t>;
  using U64 = Like<F, uint64_t>;
  F hi, lo;
  U q = reduce_pio2_f64(x, &hi, &lo);
  if (kCosine) q = q + U(1);
  const F s = kernel_sin_f64(hi, lo);
  const F c = kernel_cos_f64(hi, lo);
  F v = select((q & U(1)) != U(0), c, s);
  v = select((q & U(2)) != U(0), -v, v);
  if (!kCosine) v = select(x == F(0.0), x, v);                                     // sin(-0) = -0
  return select(abs_of(x) < bitcast<double>(U64(0x7ff0000000000000u)), v, x - x);  // inf, NaN
}
template <typename F>
KILN_MATH_INLINE F sin_f64(F x) {
  return sincos_f64<false>(x);
}
template <typename F>
KILN_MATH_INLINE F cos_f64(F x) {
  return sincos_f64<true>(x);
}

// ---- pow ----

// x^e of integers by squaring over e's bits, the products wrapping (modulo 2^bits, so a narrower
// type's result is this one's truncated); a negative e (read as signed) gives 1.
template <typename U>
KILN_MATH_INLINE U pow_int(U x, U e) {
  using M = Like<U, bool>;
  constexpr int kBits = std::is_same_v<Like<U, uint32_t>, U> ? 32 : 64;
  e = select(lt_signed(e, U(0)), U(0), e);
  U result = U(1), base = x;
  for (int bit = 0; bit + 1 < kBits; ++bit) {
    if constexpr (is_scalar<U>)
      if ((e >> bit) == U(0)) break;
    const M set = ((e >> bit) & U(1)) != U(0);
    result = select(set, result * base, result);
    base = base * base;
  }
  return result;
}

// x^m for an integer m in [1, 64] (of the family's unsigned type), by squaring in the order the
// canonicalize pass's rewrite of pow(x, c) multiplies (jit/passes/canonicalize.cpp): the base at
// m's lowest set bit, times the base squared at each higher one.
template <typename F, typename U>
KILN_MATH_INLINE F pow_by_squaring(F x, U m) {
  using M = Like<F, bool>;
  F result = x, base = x;
  M have = M(false);
  for (int bit = 0; bit < 7; ++bit) {
    if constexpr (is_scalar<F>)
      if ((m >> bit) == U(0)) break;
    const M set = ((m >> bit) & U(1)) != U(0);
    result = select(set, select(have, result * base, base), result);
    have = have | set;
    base = base * base;
  }
  return result;
}

// pow(x, y) of floats, as torch's CPU kernel special-cases it: square roots for y = +-0.5,
// multiplication by squaring for an integral y (not 0) of magnitude at most 64 (exact where the
// rewritten graph is), the math library's pow otherwise (NaN exponents included), called only
// there. |y|'s integer comes from the bits of |y| plus exp's rounding constant (1.5 2^23 or
// 1.5 2^52), taken of 0 where y is not such an exponent.
template <typename F>
KILN_MATH_INLINE F pow_float(F x, F y) {
  using M = Like<F, bool>;
  constexpr bool kF32 = std::is_same_v<Like<F, float>, F>;
  using S = std::conditional_t<kF32, float, double>;
  using B = std::conditional_t<kF32, uint32_t, uint64_t>;
  using U = Like<F, B>;
  const S magic = kF32 ? S(ExpF32::kMagic) : S(ExpF64::kMagic);
  const B magic_bits = kF32 ? B(ExpF32::kMagicBits) : B(ExpF64::kMagicBits);
  const F ay = abs_of(y);
  const M squaring = (y == trunc_of(y)) & (y != F(S(0))) & (ay <= F(S(64)));
  const M half = y == F(S(0.5)), minus_half = y == F(S(-0.5));
  const M general = !(squaring | half | minus_half);
  if constexpr (is_scalar<F>) {  // only the case taken
    if (half) return sqrt_of(x);
    if (minus_half) return S(1) / sqrt_of(x);
    if (general) return libm_pow(true, x, y);
  }
  const U m = bitcast<B>(select(squaring, ay, F(S(0))) + F(magic)) - U(magic_bits);
  F by_squaring = pow_by_squaring(x, m);
  by_squaring = select(y < F(S(0)), F(S(1)) / by_squaring, by_squaring);
  if constexpr (is_scalar<F>) {
    return by_squaring;
  } else {
    const F root = sqrt_of(x);
    const F other = select(half, root, select(minus_half, F(S(1)) / root, libm_pow(general, x, y)));
    return select(squaring, by_squaring, other);
  }
}

}  // namespace kiln::math

#include "lib/math/special.h"          // erfc, erfinv, lgamma, digamma, trigamma
#include "lib/math/trig_hyperbolic.h"  // tan, atan, atan2, asin, acos and the hyperbolic functions
