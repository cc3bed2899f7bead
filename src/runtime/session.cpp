#include "runtime/session.h"

#include <chrono>

#include "model/reference.h"

namespace attnres {

Session::Session(const ModelWeights& w, const SessionOptions& o)
    : weights_(w), options_(o), pool_(w.config, o.forward.cache_dtype(), o.page_tokens) {}

Result<std::unique_ptr<Session>> Session::create(const ModelWeights& weights,
                                                 const SessionOptions& options) {
  if (options.chunk_size <= 0 || options.page_tokens <= 0) {
    return Status(ErrorCode::kInvalidArgument,
                  "session: chunk size and page size must be positive, got " +
                      std::to_string(options.chunk_size) + " and " +
                      std::to_string(options.page_tokens));
  }
  std::unique_ptr<Session> s(new Session(weights, options));
  ATTNRES_ASSIGN_OR_RETURN(s->state_,
                           SequenceState::create(weights.config, s->pool_, nullptr, weights.shard));
  if (options.planned) {
    ATTNRES_ASSIGN_OR_RETURN(
        s->planned_, PlannedForward::create(weights, options.forward.act, options.chunk_size,
                                            Policy::kPlanned, options.read_kernel));
  }
  return s;
}

Status Session::step(const int32_t* tokens, int64_t T, bool all_logits, float* logits) {
  ForwardOptions opt = options_.forward;
  opt.projection_stats = &projection_stats_;
  if (planned_) return planned_->run(state_, opt, arena_, tokens, T, all_logits, logits);
  arena_.reset();
  return reference_forward(weights_, state_, opt, arena_, tokens, T, all_logits, logits);
}

Status Session::prefill(std::span<const int32_t> tokens, bool all_logits,
                        std::vector<float>& logits) {
  const int64_t n = static_cast<int64_t>(tokens.size()), V = vocab_size();
  if (n == 0) return Status(ErrorCode::kInvalidArgument, "session: empty prefill");
  logits.resize(static_cast<size_t>((all_logits ? n : 1) * V));
  for (int64_t t0 = 0; t0 < n; t0 += options_.chunk_size) {
    const int64_t T = std::min(options_.chunk_size, n - t0);
    // Without all_logits only each chunk's last row is computed; the final chunk's stays.
    float* dst = all_logits ? logits.data() + t0 * V : logits.data();
    ATTNRES_RETURN_IF_ERROR(step(tokens.data() + t0, T, all_logits, dst));
  }
  return Status::ok();
}

Status Session::decode(int32_t token, std::span<float> logits) {
  if (static_cast<int64_t>(logits.size()) != vocab_size()) {
    return Status(ErrorCode::kInvalidArgument,
                  "session: decode logits span has " + std::to_string(logits.size()) +
                      " values, expected vocab_size " + std::to_string(vocab_size()));
  }
  return step(&token, 1, false, logits.data());
}

int32_t argmax(std::span<const float> row) {
  int32_t best = 0;
  for (size_t i = 1; i < row.size(); ++i)
    if (row[i] > row[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  return best;
}

Result<GenerateResult> generate_greedy(Session& session, std::span<const int32_t> prompt,
                                       int64_t max_new_tokens, int64_t stop_token,
                                       bool keep_logits) {
  using Clock = std::chrono::steady_clock;
  GenerateResult r;
  const int64_t V = session.vocab_size();
  std::vector<float> logits;
  auto t0 = Clock::now();
  ATTNRES_RETURN_IF_ERROR(session.prefill(prompt, keep_logits, logits));
  r.prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<float> row(logits.end() - V, logits.end());  // [V] last prefill row
  if (keep_logits) r.prefill_logits = std::move(logits);
  t0 = Clock::now();
  for (int64_t g = 0; g < max_new_tokens; ++g) {
    if (g > 0) ATTNRES_RETURN_IF_ERROR(session.decode(r.generated.back(), row));
    if (keep_logits) r.decode_logits.insert(r.decode_logits.end(), row.begin(), row.end());
    r.generated.push_back(argmax(row));
    if (r.generated.back() == stop_token) break;
  }
  r.decode_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

}  // namespace attnres
