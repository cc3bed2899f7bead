// Sampling kernels; see sampling.h for the numerics both versions follow.
#include "kernels/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "util/random.h"

namespace attnres {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline float sanitize(float x) {
  return std::isnan(x) ? kNegInf : x;
}

inline float penalise(float l, uint32_t count, const SamplingParams& p) {
  if (p.repetition_penalty != 1.0f)
    l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
  l -= p.presence_penalty;
  l -= p.frequency_penalty * static_cast<float>(count);
  return l;
}

inline bool greedy(const SamplingParams& p) {
  return p.temperature == 0.0f || p.top_k == 1;
}

inline uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

Status bad(const char* field, const std::string& range, double v) {
  return Status(ErrorCode::kInvalidArgument, std::string("sampling: ") + field + " must be " +
                                                 range + ", found " + std::to_string(v));
}

}  // namespace

Status validate_sampling_params(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    return bad("temperature", "finite and >= 0", p.temperature);
  if (p.top_k < 0) return bad("top_k", ">= 0 (0 = off)", p.top_k);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return bad("top_p", "in (0, 1]", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return bad("min_p", "in [0, 1]", p.min_p);
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty))
    return bad("repetition_penalty", "finite and > 0", p.repetition_penalty);
  if (!std::isfinite(p.presence_penalty))
    return bad("presence_penalty", "finite", p.presence_penalty);
  if (!std::isfinite(p.frequency_penalty))
    return bad("frequency_penalty", "finite", p.frequency_penalty);
  return Status::ok();
}

void SamplingRng::reseed(uint64_t seed) {
  SplitMix64 mix{seed};
  for (uint64_t& s : s_) s = mix.next();
}

uint64_t SamplingRng::next_u64() {  // xoshiro256**
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double SamplingRng::next_uniform() {
  return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}

void SamplingScratch::resize(int64_t vocab_size) {
  const size_t v = static_cast<size_t>(vocab_size);
  z.resize(v);
  p.resize(v);
  order.resize(v);
  counts.assign(v, 0);
  seen.clear();
  seen.reserve(v);
}

int32_t sample_token(const SamplingParams& p, std::span<const float> logits,
                     std::span<const int32_t> history, double u, SamplingScratch& s) {
  const int32_t V = static_cast<int32_t>(logits.size());
  if (s.z.size() < logits.size()) s.resize(V);
  float* z = s.z.data();  // [V]
  for (int32_t i = 0; i < V; ++i) z[i] = sanitize(logits[i]);
  // 1. Penalties over distinct history tokens.
  s.seen.clear();
  for (int32_t id : history) {
    if (id < 0 || id >= V) continue;
    if (s.counts[id]++ == 0) s.seen.push_back(id);
  }
  for (int32_t id : s.seen) {
    z[id] = penalise(z[id], s.counts[id], p);
    s.counts[id] = 0;  // Invariant: counts is all zero between calls.
  }
  // 2. Greedy.
  if (greedy(p)) return static_cast<int32_t>(std::max_element(z, z + V) - z);
  // 3. Temperature; candidate order is (z desc, id asc).
  for (int32_t i = 0; i < V; ++i) z[i] = z[i] / p.temperature;
  const auto before = [z](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); };
  int32_t* order = s.order.data();  // [n] candidate ids
  for (int32_t i = 0; i < V; ++i) order[i] = i;
  int32_t n = V;
  // 4. top-k: the first k of the order, then back to id order for the sums.
  if (p.top_k > 0 && p.top_k < V) {
    std::nth_element(order, order + p.top_k, order + V, before);
    n = p.top_k;
    std::sort(order, order + n);
  }
  // 5. Softmax over the candidates, summed in id order.
  float zmax = kNegInf;
  for (int32_t k = 0; k < n; ++k) zmax = std::max(zmax, z[order[k]]);
  if (zmax == kNegInf) return order[0];  // no finite logit: lowest candidate id
  double* prob = s.p.data();             // [V], valid at candidate ids
  double sum = 0.0;
  for (int32_t k = 0; k < n; ++k) {
    const int32_t id = order[k];
    prob[id] = std::exp(static_cast<double>(z[id]) - static_cast<double>(zmax));
    sum += prob[id];
  }
  for (int32_t k = 0; k < n; ++k) prob[order[k]] /= sum;
  // 6. top-p: the shortest prefix of the order reaching top_p. The order is built in windows
  // of growing size (nth_element brings the next best ones forward, then they are sorted), so
  // the prefix and its running sum are those of a full sort without sorting the vocabulary.
  if (p.top_p < 1.0f) {
    int32_t sorted = 0, keep = -1, window = 64;
    double cum = 0.0;
    while (keep < 0 && sorted < n) {
      const int32_t end = static_cast<int32_t>(std::min<int64_t>(n, int64_t{sorted} + window));
      if (end < n) std::nth_element(order + sorted, order + end, order + n, before);
      std::sort(order + sorted, order + end, before);
      for (int32_t k = sorted; k < end; ++k) {
        cum += prob[order[k]];
        if (cum >= static_cast<double>(p.top_p)) {
          keep = k + 1;
          break;
        }
      }
      sorted = end;
      window *= 4;
    }
    if (keep > 0) n = keep;
    std::sort(order, order + n);
  }
  // 7. min-p relative to the most probable candidate.
  if (p.min_p > 0.0f) {
    double pmax = 0.0;
    for (int32_t k = 0; k < n; ++k) pmax = std::max(pmax, prob[order[k]]);
    const double threshold = static_cast<double>(p.min_p) * pmax;
    int32_t w = 0;
    for (int32_t k = 0; k < n; ++k)
      if (prob[order[k]] >= threshold) order[w++] = order[k];
    n = w;
  }
  // 8. Draw in id order.
  double total = 0.0;
  for (int32_t k = 0; k < n; ++k) total += prob[order[k]];
  const double target = u * total;
  double acc = 0.0;
  for (int32_t k = 0; k < n; ++k) {
    acc += prob[order[k]];
    if (acc > target) return order[k];
  }
  return order[n - 1];
}

int32_t sample_token_ref(const SamplingParams& p, std::span<const float> logits,
                         std::span<const int32_t> history, double u) {
  const int32_t V = static_cast<int32_t>(logits.size());
  std::vector<float> z(logits.begin(), logits.end());
  for (float& x : z) x = sanitize(x);
  std::map<int32_t, uint32_t> counts;
  for (int32_t id : history)
    if (id >= 0 && id < V) ++counts[id];
  for (const auto& [id, c] : counts) z[id] = penalise(z[id], c, p);
  if (greedy(p)) {
    int32_t best = 0;
    for (int32_t i = 1; i < V; ++i)
      if (z[i] > z[best]) best = i;
    return best;
  }
  for (float& x : z) x = x / p.temperature;
  std::vector<int32_t> sorted(V);
  for (int32_t i = 0; i < V; ++i) sorted[i] = i;
  std::sort(sorted.begin(), sorted.end(),
            [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
  if (p.top_k > 0 && p.top_k < V) sorted.resize(p.top_k);
  if (z[sorted[0]] == kNegInf) {
    return *std::min_element(sorted.begin(), sorted.end());
  }
  std::vector<int32_t> by_id = sorted;
  std::sort(by_id.begin(), by_id.end());
  const double zmax = z[sorted[0]];
  std::vector<double> prob(V, 0.0);
  double sum = 0.0;
  for (int32_t id : by_id) {
    prob[id] = std::exp(static_cast<double>(z[id]) - zmax);
    sum += prob[id];
  }
  for (int32_t id : by_id) prob[id] /= sum;
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    size_t keep = sorted.size();
    for (size_t k = 0; k < sorted.size(); ++k) {
      cum += prob[sorted[k]];
      if (cum >= static_cast<double>(p.top_p)) {
        keep = k + 1;
        break;
      }
    }
    sorted.resize(keep);
  }
  if (p.min_p > 0.0f) {
    const double threshold = static_cast<double>(p.min_p) * prob[sorted[0]];
    std::erase_if(sorted, [&](int32_t id) { return prob[id] < threshold; });
  }
  std::sort(sorted.begin(), sorted.end());
  double total = 0.0;
  for (int32_t id : sorted) total += prob[id];
  double acc = 0.0;
  for (int32_t id : sorted) {
    acc += prob[id];
    if (acc > u * total) return id;
  }
  return sorted.back();
}

Sampler::Sampler(const SamplingParams& params, int64_t vocab_size)
    : params_(params), rng_(params.seed) {
  scratch_.resize(vocab_size);
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const double u = rng_.next_uniform();  // one draw per call, greedy included
  return sample_token(params_, logits, history, u, scratch_);
}

}  // namespace attnres
