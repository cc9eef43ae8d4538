// y [N, O] = x [N, I] @ W [I, O] for a 4-bit W read as it is stored (rlpost.models.q4_native),
// and (`RowsMatmul`) for an int8 W [O, I] with one scale an output row (the sampler's output
// projection).
//
// W is output-major: codes uint8 [O, I / 2], two 4-bit codes a byte; within each run of
// 2 * half inputs, byte j holds input j (low nibble) and input j + half (high nibble).
// Every weight is v[code] * scale[g] + shift[g] for its group g of 32 consecutive inputs
// (scale, shift [O, I / 32], float16 or float32); v is the code itself, or (NF4) a signed
// 8-bit table (int8 [16]) whose values the scale carries the rest of.
//
// The rows of x are quantised to int8 per group of 32 inputs (d = max |x| / 127,
// q = round(x / d), as llama.cpp's Q8 activations), so each group's sum over the codes is
// an integer dot product (VNNI vpdpbusd, or maddubs + madd), scaled once per group:
//   y[r, o] = sum_g scale[o, g] d[r, g] sum_{i in g} v[code_i] q[r, i] + shift[o, g] d[r, g] sum_{i in g} q[r, i].
// No dequantised matrix is written. Outputs are split into chunks that the calling thread
// and XLA's intra-op thread pool take from a shared counter.
//
// Built at first use with the machine's own instruction set (-march=native): AVX-512
// (BW; VNNI where present), AVX2 or plain C++, whichever the compiler enables.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#if defined(__AVX512BW__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kGroupBytes = kGroup / 2;  // code bytes a group spans, on average

// x's rows as int8, per group their scale d and d * (sum of the group's q) ([N, groups]);
// `lo` and `hi`: the q under every code byte's low and high nibble ([N, bytes]), or (half
// 0: one byte a weight) `lo` the q in input order. Zero-padded to whole chunks.
struct Activations {
  std::vector<int8_t> lo, hi;
  std::vector<float> d, dsum;
  int64_t bytes, groups;  // padded row lengths
};

Activations Quantize(const float* x, int64_t n, int64_t in, int64_t half, int64_t chunk_bytes) {
  Activations a;
  const int64_t g_real = in / kGroup, real_bytes = half ? in / 2 : in;
  a.bytes = (real_bytes + chunk_bytes - 1) / chunk_bytes * chunk_bytes;
  a.groups = a.bytes * g_real / real_bytes;
  a.lo.assign(n * a.bytes, 0), a.hi.assign(half ? n * a.bytes : 0, 0);
  a.d.assign(n * a.groups, 0.0f), a.dsum.assign(n * a.groups, 0.0f);
  std::vector<int8_t> q(in);
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * in;
    for (int64_t g = 0; g < g_real; ++g) {
      float amax = 0.0f;
      for (int64_t i = g * kGroup; i < (g + 1) * kGroup; ++i) amax = std::max(amax, std::fabs(xr[i]));
      const float d = amax / 127.0f;
      int32_t sum = 0;
      for (int64_t i = g * kGroup; i < (g + 1) * kGroup; ++i) {
        q[i] = d == 0.0f ? 0 : static_cast<int8_t>(std::nearbyint(xr[i] / d));
        sum += q[i];
      }
      a.d[r * a.groups + g] = d;
      a.dsum[r * a.groups + g] = d * static_cast<float>(sum);
    }
    if (!half) {
      std::memcpy(a.lo.data() + r * a.bytes, q.data(), in);
      continue;
    }
    for (int64_t j = 0; j < in / 2; ++j) {
      const int64_t i_lo = j / half * 2 * half + j % half;
      a.lo[r * a.bytes + j] = q[i_lo];
      a.hi[r * a.bytes + j] = q[i_lo + half];
    }
  }
  return a;
}

// half 16 or 32: codes [O, I / 2] with a scale and shift per group; half 0 (`rows`): int8
// weights [O, I] with one scale an output row, no shift.
struct Problem {
  const uint8_t* codes;  // [O, I / 2], or int8 [O, I]
  const void* scale;     // [O, I / 32] float16 or float32 (`half_scales`), or float32 [O]
  const void* shift;     // [O, I / 32] as the scale, or null
  const int8_t* table;   // [16]
  const Activations* act;
  float* y;  // [N, O]
  int64_t n, in, out, half;
  bool signed_table, half_scales;
};

// An IEEE half's value (F16C where the build has it).
inline float HalfToFloat(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const int exponent = (h >> 10) & 31, mantissa = h & 1023;
  const float v = exponent == 0    ? std::ldexp(static_cast<float>(mantissa), -24)
                  : exponent == 31 ? (mantissa ? NAN : INFINITY)
                                   : std::ldexp(static_cast<float>(mantissa | 1024), exponent - 25);
  return h & 0x8000 ? -v : v;
#endif
}
inline float ToFloat(float f) { return f; }
inline float ToFloat(uint16_t h) { return HalfToFloat(h); }
inline float RowScale(const Problem& p, int64_t o) { return static_cast<const float*>(p.scale)[o]; }

#if defined(__AVX512BW__)
constexpr int64_t kChunk = 64;  // code bytes a step
using VecI = __m512i;
inline VecI LoadCodes(const uint8_t* c, int64_t bytes) {
  return bytes == kChunk ? _mm512_loadu_si512(c) : _mm512_maskz_loadu_epi8(~0ULL >> (64 - bytes), c);
}
inline VecI LoadActs(const int8_t* a) { return _mm512_loadu_si512(a); }
inline void Nibbles(VecI w, VecI* lo, VecI* hi) {
  const VecI m = _mm512_set1_epi8(15);
  *lo = _mm512_and_si512(w, m);
  *hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m);
}
inline VecI Lookup(VecI table, VecI idx) { return _mm512_shuffle_epi8(table, idx); }
inline VecI Table(const int8_t* t) {
  return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
}
// acc + the sums of 4 consecutive products u[k] s[k] (u unsigned, s signed) a lane.
inline VecI Dot(VecI acc, VecI u, VecI s) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(acc, u, s);
#else
  const VecI pairs = _mm512_maddubs_epi16(u, s);
  return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
#endif
}
// Dot(Dot(0, u1, s1), u2, s2) for codes u below 16: the two 16-bit pair sums (each at most
// 2 * 15 * 128) add without overflow before one widening.
inline VecI DotPair(VecI u1, VecI s1, VecI u2, VecI s2) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u1, s1), u2, s2);
#else
  const VecI pairs = _mm512_add_epi16(_mm512_maddubs_epi16(u1, s1), _mm512_maddubs_epi16(u2, s2));
  return _mm512_madd_epi16(pairs, _mm512_set1_epi16(1));
#endif
}
// acc + the same sums for signed w: |w| times s with w's sign.
inline VecI DotSigned(VecI acc, VecI w, VecI s) {
  const VecI flipped = _mm512_mask_sub_epi8(s, _mm512_movepi8_mask(w), _mm512_setzero_si512(), s);
  return Dot(acc, _mm512_abs_epi8(w), flipped);
}
using VecF = __m512;
inline VecF ZeroF() { return _mm512_setzero_ps(); }
inline float SumF(VecF v) { return _mm512_reduce_add_ps(v); }
// Per-group factors of a chunk (4 groups) spread over the lanes, each lane covering 4
// code bytes: byte b's group is b / 16 for half 16; for half 32, byte b is in run b / 32,
// whose low nibbles are group 2 (b / 32) and high ones the next.
// Rows (half 0): a chunk is 64 inputs, 2 groups, byte b's group b / 32.
struct Spread {
  __m512i lo, hi;
  explicit Spread(int64_t half)
      : lo(half == 16   ? _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0)
           : half == 32 ? _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0)
                        : _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0)),
        hi(half == 32 ? _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1) : lo) {}
};
inline __m128 LoadGroups(const float* f, int64_t groups) {
  return groups == 4 ? _mm_loadu_ps(f) : _mm_maskz_loadu_ps((1 << groups) - 1, f);
}
inline __m128 LoadGroups(const uint16_t* h, int64_t groups) {
  return _mm_cvtph_ps(_mm_maskz_loadu_epi16((1 << groups) - 1, h));
}
inline VecF Lanes(__m512i idx, __m128 g) {
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(g));
}
inline VecF FmaI(VecI i, VecF f, VecF acc) { return _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), f, acc); }
inline VecI ZeroI() { return _mm512_setzero_si512(); }
#elif defined(__AVX2__)
constexpr int64_t kChunk = 32;
using VecI = __m256i;
inline VecI LoadCodes(const uint8_t* c, int64_t bytes) {
  return bytes == kChunk ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c))
                         : _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
}
inline VecI LoadActs(const int8_t* a) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)); }
inline void Nibbles(VecI w, VecI* lo, VecI* hi) {
  const VecI m = _mm256_set1_epi8(15);
  *lo = _mm256_and_si256(w, m);
  *hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m);
}
inline VecI Lookup(VecI table, VecI idx) { return _mm256_shuffle_epi8(table, idx); }
inline VecI Table(const int8_t* t) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
}
inline VecI Dot(VecI acc, VecI u, VecI s) {
  const VecI pairs = _mm256_maddubs_epi16(u, s);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
inline VecI DotPair(VecI u1, VecI s1, VecI u2, VecI s2) {
  const VecI pairs = _mm256_add_epi16(_mm256_maddubs_epi16(u1, s1), _mm256_maddubs_epi16(u2, s2));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}
inline VecI DotSigned(VecI acc, VecI w, VecI s) {
  return Dot(acc, _mm256_abs_epi8(w), _mm256_sign_epi8(s, w));
}
using VecF = __m256;
inline VecF ZeroF() { return _mm256_setzero_ps(); }
inline float SumF(VecF v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// A chunk holds 2 groups: half 16, byte b's group is b / 16; half 32, one run (low, high);
// rows (half 0): one group.
struct Spread {
  __m256i lo, hi;
  explicit Spread(int64_t half)
      : lo(half == 16 ? _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0) : _mm256_setzero_si256()),
        hi(half == 32 ? _mm256_set1_epi32(1) : lo) {}
};
inline __m128 LoadGroups(const float* f, int64_t groups) {
  return groups == 2 ? _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(f))) : _mm_load_ss(f);
}
inline __m128 LoadGroups(const uint16_t* h, int64_t groups) {
  uint32_t bits = h[0];
  if (groups == 2) bits |= static_cast<uint32_t>(h[1]) << 16;
  return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(bits)));
}
inline VecF Lanes(__m256i idx, __m128 g) {
  return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(g), idx);
}
inline VecF FmaI(VecI i, VecF f, VecF acc) { return _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), f, acc); }
inline VecI ZeroI() { return _mm256_setzero_si256(); }
#endif

#if defined(__AVX512BW__) || defined(__AVX2__)
constexpr int64_t kChunkGroups = kChunk / kGroupBytes;
constexpr int64_t kAhead = 4;  // outputs ahead to prefetch

// sum_g shift[g] dsum[g], 8 groups a step (F16C widens float16 shifts), then the rest.
inline __m256 Load8(const float* f) { return _mm256_loadu_ps(f); }
inline __m256 Load8(const uint16_t* h) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
}
template <typename S>
inline float ShiftDot(const S* shift, const float* dsum, int64_t groups) {
  __m256 acc = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= groups; g += 8) acc = _mm256_fmadd_ps(Load8(shift + g), _mm256_loadu_ps(dsum + g), acc);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  float s = _mm_cvtss_f32(_mm_add_ss(s4, _mm_movehdup_ps(s4)));
  for (; g < groups; ++g) s += ToFloat(shift[g]) * dsum[g];
  return s;
}

// y[r0 .. r0 + R, o] for one output o; R a compile-time constant, so the accumulators stay
// in registers; HALF 16 puts a chunk's low and high nibbles in the same groups (one sum).
template <int R, int HALF, bool SIGNED, typename S>
void OutputDot(const Problem& p, const Spread& spread, VecI table, int64_t o, int64_t r0) {
  const Activations& a = *p.act;
  const int64_t bytes = p.in / 2, groups = p.in / kGroup;
  const uint8_t* codes = p.codes + o * bytes;
  const S* scale = static_cast<const S*>(p.scale) + o * groups;
  VecF acc[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = ZeroF();
  for (int64_t c = 0; c < bytes; c += kChunk) {
    const int64_t nb = std::min(kChunk, bytes - c), g0 = c / kGroupBytes;
    _mm_prefetch(reinterpret_cast<const char*>(codes + kAhead * bytes + c), _MM_HINT_T0);
    VecI w_lo, w_hi;
    Nibbles(LoadCodes(codes + c, nb), &w_lo, &w_hi);
    if (SIGNED) w_lo = Lookup(table, w_lo), w_hi = Lookup(table, w_hi);
    const __m128 sw = LoadGroups(scale + g0, nb / kGroupBytes);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const VecI x_lo = LoadActs(a.lo.data() + row * a.bytes + c);
      const VecI x_hi = LoadActs(a.hi.data() + row * a.bytes + c);
      const __m128 f = _mm_mul_ps(sw, LoadGroups(a.d.data() + row * a.groups + g0, kChunkGroups));
      if (HALF == 16 && !SIGNED) {
        acc[r] = FmaI(DotPair(w_lo, x_lo, w_hi, x_hi), Lanes(spread.lo, f), acc[r]);
        continue;
      }
      VecI s_lo = SIGNED ? DotSigned(ZeroI(), w_lo, x_lo) : Dot(ZeroI(), w_lo, x_lo);
      if (HALF == 16) {
        s_lo = DotSigned(s_lo, w_hi, x_hi);
        acc[r] = FmaI(s_lo, Lanes(spread.lo, f), acc[r]);
      } else {
        const VecI s_hi = SIGNED ? DotSigned(ZeroI(), w_hi, x_hi) : Dot(ZeroI(), w_hi, x_hi);
        acc[r] = FmaI(s_lo, Lanes(spread.lo, f), acc[r]);
        acc[r] = FmaI(s_hi, Lanes(spread.hi, f), acc[r]);
      }
    }
  }
  _mm_prefetch(reinterpret_cast<const char*>(scale + kAhead * groups), _MM_HINT_T0);
  const S* shift = static_cast<const S*>(p.shift) + o * groups;
  _mm_prefetch(reinterpret_cast<const char*>(shift + kAhead * groups), _MM_HINT_T0);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const float s = ShiftDot(shift, a.dsum.data() + (r0 + r) * a.groups, groups);
    p.y[(r0 + r) * p.out + o] = SumF(acc[r]) + s;
  }
}

template <int R, int HALF, bool SIGNED, typename S>
void BlockAs(const Problem& p, int64_t o0, int64_t o1, int64_t r0) {
  const Spread spread(HALF);
  const VecI table = Table(p.table);
  for (int64_t o = o0; o < o1; ++o) OutputDot<R, HALF, SIGNED, S>(p, spread, table, o, r0);
}

// Rows: y[r, o] = scale[o] sum_g d[r, g] sum_{i in g} w[o, i] q[r, i].
template <int R>
void RowsBlock(const Problem& p, int64_t o0, int64_t o1, int64_t r0) {
  const Activations& a = *p.act;
  const Spread spread(0);
  for (int64_t o = o0; o < o1; ++o) {
    const uint8_t* w = p.codes + o * p.in;
    VecF acc[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r] = ZeroF();
    for (int64_t c = 0; c < p.in; c += kChunk) {
      _mm_prefetch(reinterpret_cast<const char*>(w + kAhead * p.in + c), _MM_HINT_T0);
      const VecI wv = LoadCodes(w + c, std::min(kChunk, p.in - c));
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const int64_t row = r0 + r;
        const VecI s = DotSigned(ZeroI(), wv, LoadActs(a.lo.data() + row * a.bytes + c));
        const __m128 d = LoadGroups(a.d.data() + row * a.groups + c / kGroup, kChunk / kGroup);
        acc[r] = FmaI(s, Lanes(spread.lo, d), acc[r]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) p.y[(r0 + r) * p.out + o] = RowScale(p, o) * SumF(acc[r]);
  }
}
#else
// The plain C++ loop: per group, the integer sum of code values times q.
template <int R, int HALF, bool SIGNED, typename S>
void BlockAs(const Problem& p, int64_t o0, int64_t o1, int64_t r0) {
  const Activations& a = *p.act;
  const int64_t bytes = p.in / 2, groups = p.in / kGroup;
  const S* scale = static_cast<const S*>(p.scale);
  const S* shift = static_cast<const S*>(p.shift);
  std::vector<int32_t> sums(groups);
  for (int64_t o = o0; o < o1; ++o) {
    const uint8_t* codes = p.codes + o * bytes;
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      std::fill(sums.begin(), sums.end(), 0);
      for (int64_t j = 0; j < bytes; ++j) {
        const int64_t i_lo = j / HALF * 2 * HALF + j % HALF;
        const int32_t v_lo = SIGNED ? p.table[codes[j] & 15] : codes[j] & 15;
        const int32_t v_hi = SIGNED ? p.table[codes[j] >> 4] : codes[j] >> 4;
        sums[i_lo / kGroup] += v_lo * a.lo[row * a.bytes + j];
        sums[(i_lo + HALF) / kGroup] += v_hi * a.hi[row * a.bytes + j];
      }
      float y = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        const float d = a.d[row * a.groups + g], dsum = a.dsum[row * a.groups + g];
        y += static_cast<float>(sums[g]) * (ToFloat(scale[o * groups + g]) * d) +
             ToFloat(shift[o * groups + g]) * dsum;
      }
      p.y[row * p.out + o] = y;
    }
  }
}

template <int R>
void RowsBlock(const Problem& p, int64_t o0, int64_t o1, int64_t r0) {
  const Activations& a = *p.act;
  const int8_t* weights = reinterpret_cast<const int8_t*>(p.codes);
  for (int64_t o = o0; o < o1; ++o) {
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      float y = 0.0f;
      for (int64_t g = 0; g < p.in / kGroup; ++g) {
        int32_t sum = 0;
        for (int64_t i = g * kGroup; i < (g + 1) * kGroup; ++i) {
          sum += weights[o * p.in + i] * a.lo[row * a.bytes + i];
        }
        y += static_cast<float>(sum) * a.d[row * a.groups + g];
      }
      p.y[row * p.out + o] = RowScale(p, o) * y;
    }
  }
}
#endif

template <int R, typename S>
void BlockHalf(const Problem& p, int64_t o0, int64_t o1, int64_t r0) {
  if (p.half == 16) {
    p.signed_table ? BlockAs<R, 16, true, S>(p, o0, o1, r0) : BlockAs<R, 16, false, S>(p, o0, o1, r0);
  } else {
    p.signed_table ? BlockAs<R, 32, true, S>(p, o0, o1, r0) : BlockAs<R, 32, false, S>(p, o0, o1, r0);
  }
}

template <int R>
void Block(const Problem& p, int64_t o0, int64_t o1, int64_t r0) {
  if (p.half == 0) {
    RowsBlock<R>(p, o0, o1, r0);
  } else if (p.half_scales) {
    BlockHalf<R, uint16_t>(p, o0, o1, r0);
  } else {
    BlockHalf<R, float>(p, o0, o1, r0);
  }
}

// Outputs [o0, o1) for every row of x, in blocks of 8, 4, 2 and 1 rows.
void OutputRange(const Problem& p, int64_t o0, int64_t o1) {
  int64_t r0 = 0;
  for (; r0 + 8 <= p.n; r0 += 8) Block<8>(p, o0, o1, r0);
  if (r0 + 4 <= p.n) Block<4>(p, o0, o1, r0), r0 += 4;
  if (r0 + 2 <= p.n) Block<2>(p, o0, o1, r0), r0 += 2;
  if (r0 < p.n) Block<1>(p, o0, o1, r0);
}

// Chunks of outputs handed out by a shared counter; `done` counts finished chunks.
struct Shared {
  Problem p;
  Activations act;
  int64_t chunk, chunks;
  std::atomic<int64_t> next{0}, done{0};
};

void Drain(Shared& s) {
  for (int64_t k; (k = s.next.fetch_add(1)) < s.chunks;) {
    const int64_t o0 = k * s.chunk;
    OutputRange(s.p, o0, o0 + s.chunk < s.p.out ? o0 + s.chunk : s.p.out);
    s.done.fetch_add(1, std::memory_order_release);
  }
}

#if defined(__AVX512BW__) || defined(__AVX2__)
constexpr int64_t kPad = kChunk;
#else
constexpr int64_t kPad = 1;
#endif

// Computes `shared`'s outputs on this thread and `pool`'s, returning when all are done.
void Run(ffi::ThreadPool& pool, std::shared_ptr<Shared> shared, int64_t chunk) {
  shared->chunk = chunk;
  shared->chunks = (shared->p.out + chunk - 1) / chunk;
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), shared->chunks) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([shared] { Drain(*shared); });
  Drain(*shared);
  while (shared->done.load(std::memory_order_acquire) < shared->chunks) {
    std::this_thread::yield();
  }
}

ffi::Error Q4Matmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> codes,
                    ffi::AnyBuffer scale, ffi::AnyBuffer shift,
                    ffi::Buffer<ffi::S8> table, int64_t half, int64_t chunk, bool signed_table,
                    ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), cd = codes.dimensions();
  if (xd.size() != 2 || cd.size() != 2 || table.element_count() != 16) {
    return ffi::Error::InvalidArgument("q4_matmul: x [N, I], codes [O, I / 2], table [16]");
  }
  const int64_t n = xd[0], in = xd[1], out = cd[0];
  const ffi::DataType type = scale.element_type();
  if ((type != ffi::DataType::F16 && type != ffi::DataType::F32) || shift.element_type() != type) {
    return ffi::Error::InvalidArgument("q4_matmul: scale and shift both float16 or float32");
  }
  if (cd[1] * 2 != in || in % kGroup != 0 || (half != 16 && half != 32) ||
      in % (2 * half) != 0 || static_cast<int64_t>(scale.element_count()) != out * (in / kGroup) ||
      static_cast<int64_t>(shift.element_count()) != out * (in / kGroup) || chunk < 1) {
    return ffi::Error::InvalidArgument("q4_matmul: inconsistent shapes or half");
  }
  auto shared = std::make_shared<Shared>();
  shared->act = Quantize(x.typed_data(), n, in, half, kPad);
  shared->p = Problem{codes.typed_data(), scale.untyped_data(), shift.untyped_data(),
                      table.typed_data(), &shared->act, y->typed_data(), n, in, out, half,
                      signed_table, type == ffi::DataType::F16};
  Run(pool, shared, chunk);
  return ffi::Error::Success();
}

ffi::Error RowsMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> w,
                      ffi::Buffer<ffi::F32> scale, int64_t chunk, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1] || xd[1] % kGroup != 0 ||
      static_cast<int64_t>(scale.element_count()) != wd[0] || chunk < 1) {
    return ffi::Error::InvalidArgument("rows_matmul: x [N, I], w [O, I], scale [O], 32 | I");
  }
  const int64_t n = xd[0], in = xd[1], out = wd[0];
  auto shared = std::make_shared<Shared>();
  shared->act = Quantize(x.typed_data(), n, in, 0, kPad);
  shared->p = Problem{reinterpret_cast<const uint8_t*>(w.typed_data()), scale.typed_data(),
                      nullptr, nullptr, &shared->act, y->typed_data(), n, in, out, 0, true, false};
  Run(pool, shared, chunk);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RlpostQ4Matmul, Q4Matmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Attr<int64_t>("half")
                                  .Attr<int64_t>("chunk")
                                  .Attr<bool>("signed_table")
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(RlpostRowsMatmul, RowsMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("chunk")
                                  .Ret<ffi::Buffer<ffi::F32>>());
