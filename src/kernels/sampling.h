// Next-token sampling: penalties, greedy, temperature, top-k, top-p, min-p, seeded RNG.
//
// Numerics (the scalar twin sample_token_ref defines them; sample_token must equal it exactly):
//   1. Penalties, for each distinct token t of `history` seen c_t times:
//        l = logits[t]; if repetition_penalty != 1: l = l > 0 ? l / rp : l * rp   (CTRL/HF rule)
//        l -= presence_penalty; l -= frequency_penalty * c_t                        (OpenAI rule)
//      NaN logits count as -inf.
//   2. Greedy (temperature == 0, or top_k == 1): the largest penalised logit, lowest id on ties.
//   3. z = l / temperature. Order: z descending, then id ascending.
//   4. top_k > 0 keeps the first k in that order.
//   5. p = exp(z - z_max) / sum over the kept set (double; sums run in ascending id order).
//   6. top_p < 1 keeps the shortest prefix of the order whose cumulative p (in order) >= top_p.
//   7. min_p > 0 keeps tokens with p >= min_p * p_max.
//   8. With u in [0, 1): walk the kept set in ascending id order accumulating p; the first token
//      whose running sum exceeds u * (sum of kept p) is chosen (the last kept token if rounding
//      leaves none).
// Reproducibility: Sampler draws exactly one u per call from xoshiro256** seeded by splitmix64
// of the seed, so a given seed, logits and history always give the same tokens at any thread
// count (the kernel is single-threaded and its order is fixed), and across machines whose libm
// exp() returns the same doubles (e.g. the same glibc).
//
// Allocation: sample_token uses only the caller's SamplingScratch, which it grows once if it is
// smaller than the vocabulary; Sampler owns one sized at construction.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attnres/sampling.h"
#include "util/status.h"

namespace attnres {

// kInvalidArgument naming the field, its legal range and the value found.
Status validate_sampling_params(const SamplingParams& p);

// Deterministic generator: xoshiro256** seeded through splitmix64.
class SamplingRng {
 public:
  explicit SamplingRng(uint64_t seed = 0) { reseed(seed); }
  void reseed(uint64_t seed);
  uint64_t next_u64();
  double next_uniform();  // [0, 1), 53 random bits

 private:
  uint64_t s_[4];
};

struct SamplingScratch {
  std::vector<float> z;          // [V] penalised, scaled logits
  std::vector<double> p;         // [V] probabilities of the candidate set
  std::vector<int32_t> order;    // [V] candidate ids
  std::vector<uint32_t> counts;  // [V] occurrences in history (zero between calls)
  std::vector<int32_t> seen;     // distinct ids of history
  void resize(int64_t vocab_size);
};

// logits: [V]; history: token ids seen so far (prompt and generated), ids outside [0, V) are
// ignored; u in [0, 1). Returns the chosen id.
int32_t sample_token(const SamplingParams& p, std::span<const float> logits,
                     std::span<const int32_t> history, double u, SamplingScratch& scratch);
int32_t sample_token_ref(const SamplingParams& p, std::span<const float> logits,
                         std::span<const int32_t> history, double u);

class Sampler {
 public:
  // `params` must have passed validate_sampling_params.
  Sampler(const SamplingParams& params, int64_t vocab_size);
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  SamplingRng rng_;
  SamplingScratch scratch_;
};

}  // namespace attnres
