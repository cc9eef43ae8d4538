// One decode step's attention read from the KV cache where it lies
// (rlpost.models.attention.decode_native): for every row b and query head n,
//   out[b, n] = sum_s p[s] v[layer, b, n / G, s],  p = softmax_s(q[b, n] . k[layer, b, n / G, s])
// over the slots s that mask[b, s] allows (G = N / K query heads share a KV head).
//
// XLA computes this as two batched matmuls over every slot of the cache, after copying
// the layer's keys and values out of the [L, B, K, S, H] stack; here the layer is read in
// place and masked slots are skipped. Each (b, KV head) pair reads its key and value rows
// once for all G query heads. A row with no allowed slot averages v over all S slots (the
// uniform weights XLA's form gives when every score is its finite MASKED constant).
//
// Keys and values are float32 or bfloat16; scores, softmax and sums are float32.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

inline float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 Load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float Sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

inline float Scalar(float x) { return x; }
inline float Scalar(uint16_t x) { return Bf16ToFloat(x); }

// q [h] . k [h] in float32.
template <typename T>
float Dot(const float* q, const T* k, int64_t h) {
  int64_t i = 0;
  float sum = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (; i + 16 <= h; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), Load8(k + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), Load8(k + i + 8), a1);
  }
  for (; i + 8 <= h; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), Load8(k + i), a0);
  sum = Sum8(_mm256_add_ps(a0, a1));
#endif
  for (; i < h; ++i) sum += q[i] * Scalar(k[i]);
  return sum;
}

// out [h] += w * v [h].
template <typename T>
void Axpy(float w, const T* v, float* out, int64_t h) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 wv = _mm256_set1_ps(w);
  for (; i + 8 <= h; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(wv, Load8(v + i), _mm256_loadu_ps(out + i)));
  }
#endif
  for (; i < h; ++i) out[i] += w * Scalar(v[i]);
}

struct Problem {
  const float* q;            // [B, N, H]
  const void* k;             // [L, B, K, S, H], float32 or bfloat16
  const void* v;             // as k
  const bool* mask;          // [B, S]
  float* out;                // [B, N, H]
  int64_t layer, b, kv, g, s, h;
  bool bf16;
};

// Rows `b` and KV head `kv`: its G query heads' outputs.
template <typename T>
void Pair(const Problem& p, int64_t b, int64_t kv) {
  const int64_t base = ((p.layer * p.b + b) * p.kv + kv) * p.s * p.h;
  const T* keys = static_cast<const T*>(p.k) + base;
  const T* values = static_cast<const T*>(p.v) + base;
  const bool* allowed = p.mask + b * p.s;
  std::vector<int32_t> slots;
  slots.reserve(p.s);
  for (int64_t s = 0; s < p.s; ++s) {
    if (allowed[s]) slots.push_back(static_cast<int32_t>(s));
  }
  const int64_t n = static_cast<int64_t>(slots.size());
  std::vector<float> scores(std::max<int64_t>(n, 1) * p.g);
  for (int64_t j = 0; j < n; ++j) {
    const T* key = keys + slots[j] * p.h;
    for (int64_t g = 0; g < p.g; ++g) {
      scores[g * n + j] = Dot(p.q + ((b * p.kv + kv) * p.g + g) * p.h, key, p.h);
    }
  }
  for (int64_t g = 0; g < p.g; ++g) {
    float* out = p.out + ((b * p.kv + kv) * p.g + g) * p.h;
    std::fill(out, out + p.h, 0.0f);
    if (n == 0) {  // no allowed slot: uniform weights over all of them
      for (int64_t s = 0; s < p.s; ++s) Axpy(1.0f / p.s, values + s * p.h, out, p.h);
      continue;
    }
    float* row = scores.data() + g * n;
    const float top = *std::max_element(row, row + n);
    float total = 0.0f;
    for (int64_t j = 0; j < n; ++j) total += (row[j] = std::exp(row[j] - top));
    const float inv = 1.0f / total;
    for (int64_t j = 0; j < n; ++j) Axpy(row[j] * inv, values + slots[j] * p.h, out, p.h);
  }
}

// Pair i of the B * K (row, KV head) pairs.
void PairAt(const Problem& p, int64_t i) {
  if (p.bf16) {
    Pair<uint16_t>(p, i / p.kv, i % p.kv);
  } else {
    Pair<float>(p, i / p.kv, i % p.kv);
  }
}

// Pairs handed out one at a time by a shared counter to this thread and the pool's.
struct Shared {
  Problem p;
  int64_t pairs;
  std::atomic<int64_t> next{0}, done{0};
};

void Drain(Shared& s) {
  for (int64_t i; (i = s.next.fetch_add(1)) < s.pairs;) {
    PairAt(s.p, i);
    s.done.fetch_add(1, std::memory_order_release);
  }
}

// Below this many multiply-adds (keys and values of all pairs) the calling thread does
// all the work: waking a pool thread costs more than it saves.
constexpr int64_t kThreadedWork = 1 << 18;

ffi::Error DecodeAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k,
                           ffi::AnyBuffer v, ffi::Buffer<ffi::PRED> mask,
                           ffi::Buffer<ffi::S32> layer, ffi::ResultBuffer<ffi::F32> out) {
  const auto qd = q.dimensions(), kd = k.dimensions(), md = mask.dimensions();
  if (qd.size() != 3 || kd.size() != 5 || md.size() != 2 || layer.element_count() != 1) {
    return ffi::Error::InvalidArgument(
        "decode_attention: q [B, N, H], k and v [L, B, K, S, H], mask [B, S], layer []");
  }
  const ffi::DataType type = k.element_type();
  if ((type != ffi::DataType::F32 && type != ffi::DataType::BF16) || v.element_type() != type) {
    return ffi::Error::InvalidArgument("decode_attention: k and v both float32 or bfloat16");
  }
  const auto vd = v.dimensions();
  const int64_t B = qd[0], N = qd[1], H = qd[2], L = kd[0], K = kd[2], S = kd[3];
  if (!std::equal(kd.begin(), kd.end(), vd.begin(), vd.end()) || kd[1] != B || kd[4] != H ||
      K == 0 || N % K != 0 || md[0] != B || md[1] != S) {
    return ffi::Error::InvalidArgument("decode_attention: inconsistent shapes");
  }
  const int64_t l = layer.typed_data()[0];
  if (l < 0 || l >= L) return ffi::Error::InvalidArgument("decode_attention: layer out of range");
  auto shared = std::make_shared<Shared>();
  shared->p = Problem{q.typed_data(), k.untyped_data(), v.untyped_data(), mask.typed_data(),
                      out->typed_data(), l, B, K, N / K, S, H, type == ffi::DataType::BF16};
  shared->pairs = B * K;
  const int64_t helpers =
      B * N * S * H * 2 < kThreadedWork ? 0 : std::min<int64_t>(pool.num_threads(), B * K) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([shared] { Drain(*shared); });
  Drain(*shared);
  while (shared->done.load(std::memory_order_acquire) < shared->pairs) std::this_thread::yield();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RlpostDecodeAttention, DecodeAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
