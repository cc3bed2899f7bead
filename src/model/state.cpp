#include "model/state.h"

#include <algorithm>

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

int64_t KdaState::bytes() const {
  return static_cast<int64_t>(sizeof(float) *
                              (conv_q.size() + conv_k.size() + conv_v.size() + recurrent.size()));
}

namespace {

// The zero state of `H` heads.
KdaState zero_kda_state(const ModelConfig& c, int64_t H) {
  const int64_t dk = c.linear.head_dim, dv = dk;
  const int64_t W = c.linear.short_conv_kernel_size;
  KdaState k;
  k.conv_q.assign(static_cast<size_t>(H * dk * (W - 1)), 0.0f);
  k.conv_k.assign(static_cast<size_t>(H * dk * (W - 1)), 0.0f);
  k.conv_v.assign(static_cast<size_t>(H * dv * (W - 1)), 0.0f);
  k.recurrent.assign(static_cast<size_t>(H * dk * dv), 0.0f);
  return k;
}

}  // namespace

int64_t kda_state_bytes(const ModelConfig& c, const Shard& shard) {
  const int64_t H = shard.max_units(c.linear.num_heads);
  return c.schedule.num_kda > 0 ? zero_kda_state(c, H).bytes() * c.schedule.num_kda : 0;
}

Result<SequenceState> SequenceState::create(const ModelConfig& c, KvPool& pool,
                                            MemoryBudget* budget, const Shard& shard) {
  SequenceState s;
  s.kda_accounted = kda_state_bytes(c, shard);
  if (budget != nullptr) {
    const int64_t bytes = s.kda_accounted;
    ATTNRES_RETURN_IF_ERROR(budget->take(bytes, "the KDA states of a sequence"));
    s.budget_ = budget;
    s.charged_ = bytes;
  }
  const size_t L = c.schedule.layers.size();
  s.kda.resize(L);
  s.mla_index.assign(L, -1);
  int m = 0;
  for (size_t i = 0; i < L; ++i) {
    if (c.schedule.layers[i].attention == AttnKind::kKda) {
      s.kda[i] = zero_kda_state(c, shard.range(c.linear.num_heads).size());
    } else {
      s.mla_index[i] = m++;
    }
  }
  s.cache = SequenceCache(&pool);
  return s;
}

SequenceState::SequenceState(SequenceState&& o) noexcept
    : kda(std::move(o.kda)),
      cache(std::move(o.cache)),
      mla_index(std::move(o.mla_index)),
      position(o.position),
      kda_accounted(o.kda_accounted),
      budget_(o.budget_),
      charged_(o.charged_) {
  o.budget_ = nullptr;
  o.charged_ = 0;
  o.position = 0;
}

SequenceState& SequenceState::operator=(SequenceState&& o) noexcept {
  if (this != &o) {
    release_budget();
    kda = std::move(o.kda);
    cache = std::move(o.cache);
    mla_index = std::move(o.mla_index);
    position = o.position;
    kda_accounted = o.kda_accounted;
    budget_ = o.budget_;
    charged_ = o.charged_;
    o.budget_ = nullptr;
    o.charged_ = 0;
    o.position = 0;
  }
  return *this;
}

SequenceState::~SequenceState() {
  release_budget();
}

void SequenceState::release_budget() {
  if (budget_ != nullptr) budget_->give(charged_);
  budget_ = nullptr;
  charged_ = 0;
}

void SequenceState::clear() {
  for (KdaState& k : kda) k.clear();
  cache.truncate(0);
  position = 0;
}

SequenceSnapshot SequenceState::snapshot() const {
  SequenceSnapshot s;
  s.position = position;
  s.kda = kda;
  s.kda_accounted = kda_accounted;
  s.cache = SequenceCache::share_prefix(cache, position);
  return s;
}

void SequenceState::restore(const SequenceSnapshot& snap) {
  for (size_t i = 0; i < kda.size(); ++i) {
    const KdaState& from = snap.kda[i];
    KdaState& to = kda[i];
    std::copy(from.conv_q.begin(), from.conv_q.end(), to.conv_q.begin());
    std::copy(from.conv_k.begin(), from.conv_k.end(), to.conv_k.begin());
    std::copy(from.conv_v.begin(), from.conv_v.end(), to.conv_v.begin());
    std::copy(from.recurrent.begin(), from.recurrent.end(), to.recurrent.begin());
  }
  cache = SequenceCache::share_prefix(snap.cache, snap.position);
  position = snap.position;
}

}  // namespace attnres
