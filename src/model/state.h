// Per-sequence model state carried between forward steps: the KDA recurrent state and conv
// histories of every KDA layer, and the latent cache ([c_kv | k_rot] per token) of every MLA
// layer.
//
// Invariant: after a step over positions [p, p + T), every KDA layer's state has absorbed
// exactly tokens 0..p+T-1 and every latent cache holds p + T rows; `position` == p + T.
// Not thread-safe: owned by one session.
#pragma once

#include <cstdint>
#include <vector>

#include "config/config.h"
#include "model/options.h"
#include "util/numeric.h"

namespace attnres {

struct KdaState {
  std::vector<float> conv_q, conv_k, conv_v;  // [H*dk, W-1] last W-1 conv inputs, oldest first
  std::vector<float> recurrent;               // [H, dk, dv] f32
  void clear();
};

// Latent cache of one MLA layer: c_kv [n, r] and k_rot [n, R] in two planes, each contiguous
// (so a bf16 cache is read in place by the absorbed kernel). F32 and BF16 store the values;
// FP8 stores e4m3 codes with one f32 scale per token for c_kv and one for k_rot
// (scale = amax / 448 of that part of the row), so the normalised c_kv and the unnormalised
// k_rot each use the full fp8 range.
class LatentCache {
 public:
  LatentCache() = default;
  LatentCache(KvCacheDtype dtype, int64_t r, int64_t rope);

  // Makes room for `tokens` rows in total without further allocation.
  void reserve(int64_t tokens);
  // Appends T rows: c_kv [T, r], k_rot [T, R].
  void append(const float* c_kv, const float* k_rot, int64_t T);
  // Rows [0, n) dequantised: c_kv [n, r], k_rot [n, R].
  void read(int64_t n, float* c_kv, float* k_rot) const;
  // A BF16 cache's planes in place: c_kv [size(), r], k_rot [size(), R] (nullptr for other
  // dtypes); valid until the next append or reserve.
  const bf16* bf16_c_kv() const {
    return dtype_ == KvCacheDtype::kBF16 ? bf16_[0].data() : nullptr;
  }
  const bf16* bf16_k_rot() const {
    return dtype_ == KvCacheDtype::kBF16 ? bf16_[1].data() : nullptr;
  }
  int64_t size() const { return len_; }
  int64_t capacity() const { return cap_; }
  KvCacheDtype dtype() const { return dtype_; }
  size_t bytes_per_token() const;
  void clear() { len_ = 0; }

 private:
  void grow(int64_t min_tokens);
  KvCacheDtype dtype_ = KvCacheDtype::kF32;
  int64_t r_ = 0, rope_ = 0, len_ = 0, cap_ = 0;
  int64_t width(int p) const { return p == 0 ? r_ : rope_; }
  // Plane 0: c_kv [cap, r]; plane 1: k_rot [cap, R]; only the cache's dtype is allocated.
  std::vector<float> f32_[2];
  std::vector<bf16> bf16_[2];
  std::vector<uint8_t> fp8_[2];
  std::vector<float> scales_;  // [cap, 2] (FP8)
};

struct SequenceState {
  std::vector<KdaState> kda;     // [num_layers]; empty vectors for MLA layers
  std::vector<LatentCache> mla;  // [num_layers]; default (empty) for KDA layers
  int64_t position = 0;          // tokens absorbed so far

  // Zero state for `config` with MLA caches of `cache_dtype` (must not be kAuto).
  static SequenceState create(const ModelConfig& config, KvCacheDtype cache_dtype);
  void reserve(int64_t tokens);
  void clear();
};

}  // namespace attnres
