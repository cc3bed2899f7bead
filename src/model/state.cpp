#include "model/state.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace attnres {

std::string_view kv_cache_dtype_name(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::kAuto:
      return "auto";
    case KvCacheDtype::kF32:
      return "f32";
    case KvCacheDtype::kBF16:
      return "bf16";
    case KvCacheDtype::kFP8:
      return "fp8";
  }
  return "?";
}

void KdaState::clear() {
  std::fill(conv_q.begin(), conv_q.end(), 0.0f);
  std::fill(conv_k.begin(), conv_k.end(), 0.0f);
  std::fill(conv_v.begin(), conv_v.end(), 0.0f);
  std::fill(recurrent.begin(), recurrent.end(), 0.0f);
}

LatentCache::LatentCache(KvCacheDtype dtype, int64_t r, int64_t rope)
    : dtype_(dtype), r_(r), rope_(rope) {
  assert(dtype != KvCacheDtype::kAuto);
}

size_t LatentCache::bytes_per_token() const {
  const size_t w = static_cast<size_t>(r_ + rope_);
  switch (dtype_) {
    case KvCacheDtype::kBF16:
      return 2 * w;
    case KvCacheDtype::kFP8:
      return w + 2 * sizeof(float);
    default:
      return 4 * w;
  }
}

void LatentCache::grow(int64_t min_tokens) {
  if (min_tokens <= cap_) return;
  const int64_t cap = std::max(min_tokens, cap_ * 2);
  for (int p = 0; p < 2; ++p) {
    const size_t n = static_cast<size_t>(cap * width(p));
    switch (dtype_) {
      case KvCacheDtype::kBF16:
        bf16_[p].resize(n);
        break;
      case KvCacheDtype::kFP8:
        fp8_[p].resize(n);
        break;
      default:
        f32_[p].resize(n);
    }
  }
  if (dtype_ == KvCacheDtype::kFP8) scales_.resize(static_cast<size_t>(cap) * 2);
  cap_ = cap;
}

void LatentCache::reserve(int64_t tokens) {
  grow(tokens);
}

void LatentCache::append(const float* c_kv, const float* k_rot, int64_t T) {
  grow(len_ + T);
  for (int64_t t = 0; t < T; ++t) {
    const float* parts[2] = {c_kv + t * r_, k_rot + t * rope_};
    for (int p = 0; p < 2; ++p) {
      const float* src = parts[p];
      const int64_t w = width(p), row = (len_ + t) * w;
      switch (dtype_) {
        case KvCacheDtype::kBF16:
          for (int64_t i = 0; i < w; ++i)
            bf16_[p][static_cast<size_t>(row + i)] = f32_to_bf16(src[i]);
          break;
        case KvCacheDtype::kFP8: {
          float amax = 0.0f;
          for (int64_t i = 0; i < w; ++i) amax = std::max(amax, std::fabs(src[i]));
          const float scale = amax > 0.0f ? amax / kFp8E4m3Max : 1.0f;
          scales_[static_cast<size_t>((len_ + t) * 2 + p)] = scale;
          for (int64_t i = 0; i < w; ++i)
            fp8_[p][static_cast<size_t>(row + i)] = f32_to_fp8_e4m3(src[i] / scale);
          break;
        }
        default:
          std::copy(src, src + w, f32_[p].begin() + row);
      }
    }
  }
  len_ += T;
}

void LatentCache::read(int64_t n, float* c_kv, float* k_rot) const {
  assert(n <= len_);
#pragma omp parallel for schedule(static) if (n > 256)
  for (int64_t t = 0; t < n; ++t) {
    float* dst[2] = {c_kv + t * r_, k_rot + t * rope_};
    for (int p = 0; p < 2; ++p) {
      const int64_t w = width(p), row = t * w;
      switch (dtype_) {
        case KvCacheDtype::kBF16:
          for (int64_t i = 0; i < w; ++i)
            dst[p][i] = bf16_to_f32(bf16_[p][static_cast<size_t>(row + i)]);
          break;
        case KvCacheDtype::kFP8: {
          const float scale = scales_[static_cast<size_t>(t * 2 + p)];
          for (int64_t i = 0; i < w; ++i)
            dst[p][i] = fp8_e4m3_to_f32(fp8_[p][static_cast<size_t>(row + i)]) * scale;
          break;
        }
        default:
          std::copy(f32_[p].begin() + row, f32_[p].begin() + row + w, dst[p]);
      }
    }
  }
}

SequenceState SequenceState::create(const ModelConfig& c, KvCacheDtype cache_dtype) {
  SequenceState s;
  const size_t L = c.schedule.layers.size();
  s.kda.resize(L);
  s.mla.resize(L);
  const int64_t H = c.linear.num_heads, dk = c.linear.head_dim, dv = dk;
  const int64_t W = c.linear.short_conv_kernel_size;
  for (size_t i = 0; i < L; ++i) {
    if (c.schedule.layers[i].attention == AttnKind::kKda) {
      KdaState& k = s.kda[i];
      k.conv_q.assign(static_cast<size_t>(H * dk * (W - 1)), 0.0f);
      k.conv_k.assign(static_cast<size_t>(H * dk * (W - 1)), 0.0f);
      k.conv_v.assign(static_cast<size_t>(H * dv * (W - 1)), 0.0f);
      k.recurrent.assign(static_cast<size_t>(H * dk * dv), 0.0f);
    } else {
      s.mla[i] = LatentCache(cache_dtype, c.kv_lora_rank, c.qk_rope_head_dim);
    }
  }
  return s;
}

void SequenceState::reserve(int64_t tokens) {
  for (LatentCache& m : mla) m.reserve(tokens);
}

void SequenceState::clear() {
  for (KdaState& k : kda) k.clear();
  for (LatentCache& m : mla) m.clear();
  position = 0;
}

}  // namespace attnres
