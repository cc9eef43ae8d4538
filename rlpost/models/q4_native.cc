// y [N, O] = x [N, I] @ W [I, O] for a 4-bit W read as it is stored (rlpost.models.q4_native).
//
// W is output-major: codes uint8 [O, I / 2], two 4-bit codes a byte; within each run of
// 2 * half inputs, byte j holds input j (low nibble) and input j + half (high nibble).
// Every weight is lut[code] * scale[g] + shift[g] for its group g of 32 consecutive
// inputs (scale, shift float32 [O, I / 32]; lut float32 [16]). Each 16 codes are widened,
// looked up, dequantised with one fused multiply-add and multiplied into every row of x,
// in registers: no dequantised matrix is written. Outputs are split into chunks that the
// calling thread and XLA's intra-op thread pool take from a shared counter.
//
// Built at first use with the machine's own instruction set (-march=native): AVX-512,
// AVX2 or plain C++, whichever the compiler enables.

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kGroup = 32;

struct Problem {
  const float* x;          // [N, I]
  const uint8_t* codes;    // [O, I / 2]
  const float* scale;      // [O, I / 32]
  const float* shift;      // [O, I / 32]
  const float* lut;        // [16]
  float* y;                // [N, O]
  int64_t n, in, out, half;
};

// Sums over the inputs [0, I) of output o for rows [r0, r0 + R) into acc[0..R): two
// accumulators a row (low and high nibbles), so consecutive multiply-adds do not wait
// on each other; R is a compile-time constant, so they stay in registers.
#if defined(__AVX512F__)
using Vec = __m512;
constexpr int64_t kLanes = 16;
inline Vec Zero() { return _mm512_setzero_ps(); }
inline Vec Load(const float* x) { return _mm512_loadu_ps(x); }
inline Vec Broadcast(float a) { return _mm512_set1_ps(a); }
inline Vec Fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float Sum(Vec v) { return _mm512_reduce_add_ps(v); }
struct Table {
  __m512 lut;
  explicit Table(const float* t) : lut(_mm512_loadu_ps(t)) {}
};
// The 16 codes at `c` looked up: (low nibbles' values, high nibbles' values).
inline void Lookup(const Table& t, const uint8_t* c, Vec* lo, Vec* hi) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
  *lo = _mm512_permutexvar_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)), t.lut);
  *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), t.lut);
}
#elif defined(__AVX2__)
using Vec = __m256;
constexpr int64_t kLanes = 8;
inline Vec Zero() { return _mm256_setzero_ps(); }
inline Vec Load(const float* x) { return _mm256_loadu_ps(x); }
inline Vec Broadcast(float a) { return _mm256_set1_ps(a); }
inline Vec Fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float Sum(Vec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
struct Table {
  __m256 lo, hi;
  explicit Table(const float* t) : lo(_mm256_loadu_ps(t)), hi(_mm256_loadu_ps(t + 8)) {}
};
inline Vec Pick(const Table& t, __m256i idx) {
  const __m256 upper = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));  // bit 3 -> sign
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(t.lo, idx),
                          _mm256_permutevar8x32_ps(t.hi, idx), upper);
}
inline void Lookup(const Table& t, const uint8_t* c, Vec* lo, Vec* hi) {
  int64_t word;
  std::memcpy(&word, c, 8);
  const __m256i v = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(word));
  *lo = Pick(t, _mm256_and_si256(v, _mm256_set1_epi32(15)));
  *hi = Pick(t, _mm256_srli_epi32(v, 4));
}
#else
struct Vec {
  float v;
};
constexpr int64_t kLanes = 1;
inline Vec Zero() { return Vec{0.0f}; }
inline Vec Load(const float* x) { return Vec{*x}; }
inline Vec Broadcast(float a) { return Vec{a}; }
inline Vec Fma(Vec a, Vec b, Vec c) { return Vec{a.v * b.v + c.v}; }
inline float Sum(Vec v) { return v.v; }
struct Table {
  const float* t;
  explicit Table(const float* t_) : t(t_) {}
};
inline void Lookup(const Table& t, const uint8_t* c, Vec* lo, Vec* hi) {
  *lo = Vec{t.t[*c & 15]};
  *hi = Vec{t.t[*c >> 4]};
}
#endif

template <int R>
void OutputDot(const Problem& p, const Table& table, int64_t o, int64_t r0, float* acc) {
  const uint8_t* codes = p.codes + o * (p.in / 2);
  const float* scale = p.scale + o * (p.in / kGroup);
  const float* shift = p.shift + o * (p.in / kGroup);
  const float* x[R];
  Vec sum_lo[R], sum_hi[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    x[r] = p.x + (r0 + r) * p.in;
    sum_lo[r] = sum_hi[r] = Zero();
  }
  const int64_t run = 2 * p.half;
  for (int64_t base = 0; base < p.in; base += run) {
    for (int64_t b = 0; b < p.half; b += kLanes) {
      Vec w_lo, w_hi;
      Lookup(table, codes + base / 2 + b, &w_lo, &w_hi);
      const int64_t i_lo = base + b, i_hi = base + p.half + b;
      const int64_t g_lo = i_lo / kGroup, g_hi = i_hi / kGroup;
      w_lo = Fma(w_lo, Broadcast(scale[g_lo]), Broadcast(shift[g_lo]));
      w_hi = Fma(w_hi, Broadcast(scale[g_hi]), Broadcast(shift[g_hi]));
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        sum_lo[r] = Fma(w_lo, Load(x[r] + i_lo), sum_lo[r]);
        sum_hi[r] = Fma(w_hi, Load(x[r] + i_hi), sum_hi[r]);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = Sum(sum_lo[r]) + Sum(sum_hi[r]);
}

// Outputs [o0, o1) of rows [r0, r0 + R).
template <int R>
void Block(const Problem& p, const Table& table, int64_t o0, int64_t o1, int64_t r0) {
  float acc[R];
  for (int64_t o = o0; o < o1; ++o) {
    OutputDot<R>(p, table, o, r0, acc);
    for (int r = 0; r < R; ++r) p.y[(r0 + r) * p.out + o] = acc[r];
  }
}

// Outputs [o0, o1) for every row of x, in blocks of 8, 4, 2 and 1 rows.
void OutputRange(const Problem& p, int64_t o0, int64_t o1) {
  const Table table(p.lut);
  int64_t r0 = 0;
  for (; r0 + 8 <= p.n; r0 += 8) Block<8>(p, table, o0, o1, r0);
  if (r0 + 4 <= p.n) Block<4>(p, table, o0, o1, r0), r0 += 4;
  if (r0 + 2 <= p.n) Block<2>(p, table, o0, o1, r0), r0 += 2;
  if (r0 < p.n) Block<1>(p, table, o0, o1, r0);
}

// Chunks of outputs handed out by a shared counter; `done` counts finished chunks.
struct Shared {
  Problem p;
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

ffi::Error Q4Matmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> codes,
                    ffi::Buffer<ffi::F32> scale, ffi::Buffer<ffi::F32> shift,
                    ffi::Buffer<ffi::F32> lut, int64_t half, int64_t chunk,
                    ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), cd = codes.dimensions();
  if (xd.size() != 2 || cd.size() != 2 || lut.element_count() != 16) {
    return ffi::Error::InvalidArgument("q4_matmul: x [N, I], codes [O, I / 2], lut [16]");
  }
  const int64_t n = xd[0], in = xd[1], out = cd[0];
  if (cd[1] * 2 != in || in % kGroup != 0 || (half != 16 && half != 32) ||
      in % (2 * half) != 0 || scale.element_count() != out * (in / kGroup) ||
      shift.element_count() != out * (in / kGroup) || chunk < 1) {
    return ffi::Error::InvalidArgument("q4_matmul: inconsistent shapes or half");
  }
  auto shared = std::make_shared<Shared>();
  shared->p = Problem{x.typed_data(), codes.typed_data(), scale.typed_data(),
                      shift.typed_data(), lut.typed_data(), y->typed_data(),
                      n, in, out, half};
  shared->chunk = chunk;
  shared->chunks = (out + chunk - 1) / chunk;
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), shared->chunks) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([shared] { Drain(*shared); });
  Drain(*shared);
  while (shared->done.load(std::memory_order_acquire) < shared->chunks) {
    std::this_thread::yield();
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RlpostQ4Matmul, Q4Matmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("half")
                                  .Attr<int64_t>("chunk")
                                  .Ret<ffi::Buffer<ffi::F32>>());
