// The batched engine (include/attnres/engine.h): admission, the step scheduler, and the
// generation loop every front end uses.
//
// A step: every decoding sequence contributes one row (its last chosen token), then prefill
// chunks are added in admission order while they fit the token budget. A prefill chunk runs
// from the sequence's position to the next multiple of prefill_chunk (or the end of its
// prompt), so how a prompt is cut depends only on the prompt and where its prefix was
// restored, never on the other requests; the budget (max_sequences + prefill_chunk rows) always
// has room for one whole chunk next to every decode row, so a prefill never starves.
//
// Several ranks (runtime/follower.h): the leader's engine records every accepted submit and
// every cancel; step() first broadcasts them to the followers, whose engines (same id, same
// options) apply them in the same order and step too. Nothing the engine decides depends on
// time or on the rank: admission and the prefix store count KDA states rank-independently
// (kda_state_bytes of the rank with the most heads), and the logits are bitwise the same on
// every rank, so sampling is too.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <type_traits>

#include "attnres/engine.h"
#include "io/weights.h"
#include "model/batch.h"
#include "model/planned.h"
#include "parallel/gather.h"
#include "runtime/follower.h"
#include "runtime/generation.h"
#include "runtime/prefix_store.h"
#include "tokenizer/tokenizer.h"

namespace attnres {

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStopToken:
      return "stop";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kContext:
      return "context";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

KvCacheDtype cache_dtype(const EngineOptions& o) {
  switch (o.cache) {
    case CacheType::kF32:
      return KvCacheDtype::kF32;
    case CacheType::kBF16:
      return KvCacheDtype::kBF16;
    case CacheType::kFP8:
      return KvCacheDtype::kFP8;
    default:
      return o.activation == ActivationType::kF32 ? KvCacheDtype::kF32 : KvCacheDtype::kBF16;
  }
}

// One request from submit() to its finish.
struct Seq {
  RequestId id = 0;
  GenerationRequest req;
  GenerationCallbacks cb;
  std::unique_ptr<Generation> gen;
  SequenceState state;
  int64_t max_new = 0;                 // bounded by the context
  bool context_bound = false;          // max_new was cut to fit the context
  int64_t reserved = 0;                // bytes held in the kv budget
  int64_t prompt_done = 0;             // prompt positions absorbed (restored or prefilled)
  int64_t next_snapshot = 0;           // next prefill position to snapshot at
  std::optional<int32_t> pending;      // chosen token, fed at the next step
  std::optional<FinishReason> ending;  // set while the last token is fed for snapshot_at_end
  bool cancel = false;
  GenerationResult result;
  Clock::time_point submitted, admitted, first_token;

  int64_t prompt_len() const { return static_cast<int64_t>(req.prompt.size()); }
  std::string where() const {
    return "at position " + std::to_string(state.position) + " of request " + std::to_string(id);
  }
};

// What one segment of a step does with its rows.
struct Planned {
  Seq* seq;
  int64_t rows;
  bool prefill;
  int64_t logits_at = -1;  // first of its logits rows in the step's output, -1: none
  int64_t logit_rows = 0;
};

}  // namespace

struct Engine::Impl {
  std::shared_ptr<const Model> model;
  const ModelWeights& w;
  EngineOptions opt;
  ForwardOptions fwd;
  int64_t ctx = 0, interval = 0;
  std::string ctx_source;  // where the context length comes from, for messages
  MemoryBudget live, physical;
  KvPool pool;
  std::unique_ptr<PlannedForward> forward;
  std::unique_ptr<PrefixStore> prefix;
  Arena arena;
  ProjectionStats proj;
  std::deque<std::unique_ptr<Seq>> waiting;
  std::vector<std::unique_ptr<Seq>> running;
  RequestId next_id = 1;
  EngineStats stats;
  std::vector<float> logits;  // [logit rows of a step, V]
  // Tensor parallelism: the ranks, the gathers' state, this engine's id in the protocol and
  // the events (submits, cancels) to broadcast at the next step.
  std::shared_ptr<Communicator> group;
  std::unique_ptr<TensorParallel> tp;
  int64_t engine_id = 0;
  Writer outbox;
  bool leader() const { return group->size() > 1 && group->rank() == 0; }

  Impl(std::shared_ptr<const Model> m, const EngineOptions& o, int64_t context, int64_t kv_budget)
      : model(std::move(m)),
        w(model->weights()),
        opt(o),
        ctx(context),
        live(kv_budget),
        physical(kv_budget + std::max<int64_t>(0, o.prefix_cache_bytes)),
        pool(w.config, cache_dtype(o), o.page_tokens, &physical) {}

  int64_t reservation(int64_t positions) const {
    return reservation_bytes(w.config, w.shard, pool, positions);
  }
  // KV memory of a sequence of `positions` positions: its KDA states and latent pages.
  // Rank-independent (kda_state_bytes of the rank with the most heads), so every rank admits
  // the same requests.
  static int64_t reservation_bytes(const ModelConfig& c, const Shard& shard, const KvPool& pool,
                                   int64_t positions) {
    const int64_t pt = pool.page_tokens();
    return kda_state_bytes(c, shard) + (positions + pt - 1) / pt * pool.page_bytes();
  }

  Status validate(const GenerationRequest& r, int64_t& max_new, bool& context_bound) const;
  void admit();
  const PrefixEntry* restore_prefix(Seq& s);
  std::vector<Planned> plan_step(std::vector<Segment>& segs, std::vector<int32_t>& tokens,
                                 std::vector<int64_t>& rows);
  void after_prefill(Seq& s, const Planned& p);
  void after_decode(Seq& s, const Planned& p);
  void choose_next(Seq& s, const float* row);
  void end(Seq& s, FinishReason reason);
  void fail(Seq& s, const Status& st);
  void finish(Seq& s, FinishReason reason, Status error = Status::ok());
  void reap();
  void snapshot(const Seq& s, std::span<const int32_t> tokens, const float* last_logits);
  const float* row(const Planned& p, int64_t i) const {
    return logits.data() + (p.logits_at + i) * w.config.vocab_size;
  }
};

Engine::Engine() = default;
Engine::~Engine() {
  if (impl_ && impl_->leader())
    send_to_followers(*impl_->group, LeaderOp::kDestroyEngine, impl_->engine_id, "");
}

// Protocol events of a step message.
enum class EngineEvent : int64_t { kSubmit = 1, kCancel = 2 };

Result<std::unique_ptr<Engine>> Engine::create(std::shared_ptr<const Model> model,
                                               const EngineOptions& o) {
  static int64_t next_engine_id = 1;
  const std::shared_ptr<Communicator>& group = model->group();
  int64_t id = 0;
  if (group->size() > 1) {
    if (group->rank() != 0)
      return Status(ErrorCode::kInvalidArgument,
                    rank_prefix(*group) +
                        "Engine::create runs on the leader (rank 0); followers "
                        "mirror its engines in follow_leader()");
    id = next_engine_id++;
    static_assert(std::is_trivially_copyable_v<EngineOptions>);
    Writer w;
    w.pod(o);
    send_to_followers(*group, LeaderOp::kCreateEngine, id, w.bytes());
  }
  return FollowerAccess::create(std::move(model), o, id);
}

Result<std::unique_ptr<Engine>> FollowerAccess::create(std::shared_ptr<const Model> model,
                                                       const EngineOptions& o, int64_t id) {
  std::shared_ptr<Communicator> group = model->group();
  auto e = Engine::create_local(std::move(model), o, id);
  ATTNRES_RETURN_IF_ERROR(agree(*group, e.is_ok() ? Status::ok() : e.status()));
  return e;
}

Result<std::unique_ptr<Engine>> Engine::create_local(std::shared_ptr<const Model> model,
                                                     const EngineOptions& o, int64_t id) {
  const ModelConfig& c = model->weights().config;
  auto bad = [](const std::string& m) { return Status(ErrorCode::kInvalidArgument, m); };
  if (o.max_sequences < 1 || o.max_sequences > 4096)
    return bad("max_sequences is " + std::to_string(o.max_sequences) + ", expected 1..4096");
  if (o.prefill_chunk < 1 || o.prefill_chunk > (int64_t{1} << 20))
    return bad("prefill chunk is " + std::to_string(o.prefill_chunk) + ", expected 1..1048576");
  if (o.page_tokens < 1 || o.page_tokens > 65536)
    return bad("page size is " + std::to_string(o.page_tokens) + " positions, expected 1..65536");
  if (o.kda_chunk < 1) return bad("kda chunk must be positive");
  if (o.max_queue < 0) return bad("max_queue must not be negative");
  const int64_t model_ctx = c.max_position_embeddings.value_or(0);
  const int64_t context = o.context_length > 0 ? o.context_length : model_ctx;
  if (context <= 0)
    return bad(c.source + " has no max_position_embeddings: give the engine a context length");
  if (model_ctx > 0 && context > model_ctx)
    return bad("context length " + std::to_string(context) +
               " exceeds the model's max_position_embeddings " + std::to_string(model_ctx));
  std::unique_ptr<Engine> e(new Engine());
  const int64_t per_seq = Impl::reservation_bytes(
      c, model->weights().shard, KvPool(c, cache_dtype(o), o.page_tokens), context);
  const int64_t kv_budget = o.kv_budget >= 0 ? o.kv_budget : per_seq * o.max_sequences;
  auto impl = std::make_unique<Impl>(std::move(model), o, context, kv_budget);
  Impl& m = *impl;
  m.ctx_source =
      o.context_length > 0 ? "the engine's context length" : c.source + " max_position_embeddings";
  m.fwd.act = o.activation == ActivationType::kF32 ? ActDType::kF32 : ActDType::kBF16;
  m.fwd.kv = cache_dtype(o);
  m.fwd.kda_chunk = o.kda_chunk;
  m.fwd.projection_stats = &m.proj;
  m.interval = o.snapshot_interval > 0 ? o.snapshot_interval : 4 * o.prefill_chunk;
  ATTNRES_ASSIGN_OR_RETURN(
      m.forward, PlannedForward::create(m.w, m.fwd.act, o.max_sequences + o.prefill_chunk));
  if (o.prefix_cache_bytes > 0)
    m.prefix = std::make_unique<PrefixStore>(o.prefix_cache_bytes, m.pool.page_bytes());
  m.stats.kv_budget_bytes = kv_budget;
  m.stats.kv_page_bytes = m.pool.page_bytes();
  m.group = m.model->group();
  m.tp = std::make_unique<TensorParallel>(m.group);
  if (m.group->size() > 1) m.fwd.tp = m.tp.get();
  m.engine_id = id;
  m.stats.ranks = m.group->size();
  e->impl_ = std::move(impl);
  return e;
}

const EngineStats& Engine::stats() const {
  return impl_->stats;
}
const EngineOptions& Engine::options() const {
  return impl_->opt;
}
int64_t Engine::context_length() const {
  return impl_->ctx;
}
int64_t Engine::token_budget() const {
  return impl_->opt.max_sequences + impl_->opt.prefill_chunk;
}
bool Engine::has_work() const {
  return !impl_->waiting.empty() || !impl_->running.empty();
}

Status Engine::Impl::validate(const GenerationRequest& r, int64_t& max_new,
                              bool& context_bound) const {
  auto bad = [](const std::string& m) { return Status(ErrorCode::kInvalidArgument, m); };
  const int64_t V = w.config.vocab_size, n = static_cast<int64_t>(r.prompt.size());
  if (n == 0) return bad("prompt: empty (at least one token is needed)");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] < 0 || r.prompt[i] >= V)
      return bad("prompt: token id " + std::to_string(r.prompt[i]) + " at position " +
                 std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  const bool score_only = r.max_new_tokens == 0 && r.keep_logits;
  if (n > ctx || (n == ctx && !score_only))
    return Status(ErrorCode::kContextLengthExceeded,
                  "prompt of " + std::to_string(n) + " tokens leaves no room to generate in the " +
                      "context of " + std::to_string(ctx) + " tokens (" + ctx_source + ")");
  if ((r.max_new_tokens == 0 && !score_only) || r.max_new_tokens < -1)
    return bad("max_new_tokens is " + std::to_string(r.max_new_tokens) +
               ", expected >= 1, -1 (up to the context) or 0 with keep_logits (score the prompt)");
  if (r.strict_context && r.max_new_tokens > ctx - n)
    return Status(ErrorCode::kContextLengthExceeded,
                  "prompt of " + std::to_string(n) + " tokens + max_new_tokens " +
                      std::to_string(r.max_new_tokens) + " exceeds the context of " +
                      std::to_string(ctx) + " tokens (" + ctx_source + ")");
  context_bound = r.max_new_tokens < 0 || r.max_new_tokens > ctx - n;
  max_new = context_bound ? ctx - n : r.max_new_tokens;
  ATTNRES_RETURN_IF_ERROR(validate_sampling_params(r.sampling));
  for (const auto& [id, bias] : r.logit_bias)
    if (id < 0 || id >= V || !std::isfinite(bias))
      return bad("logit_bias: token " + std::to_string(id) + " with bias " + std::to_string(bias) +
                 ", expected an id in [0, " + std::to_string(V) + ") and a finite bias");
  for (int32_t id : r.stop_tokens)
    if (id < 0 || id >= V)
      return bad("stop token " + std::to_string(id) + " is not in the vocabulary");
  for (int32_t id : r.forced_tokens)
    if (id < 0 || id >= V)
      return bad("forced token " + std::to_string(id) + " is not in the vocabulary");
  if (!r.forced_tokens.empty() && !opt.allow_forced_tokens)
    return bad("forced tokens are a test feature this engine was not started with");
  if (r.top_logprobs > 20)
    return bad("top_logprobs is " + std::to_string(r.top_logprobs) + ", expected 0..20");
  if (!r.stop_strings.empty() && model->tokenizer() == nullptr)
    return bad("stop strings need the model's tokenizer, which is not loaded");
  const int64_t need = reservation(std::min(ctx, n + max_new + 1));
  if (live.limit() >= 0 && need > live.limit())
    return Status(ErrorCode::kResourceExhausted,
                  "the request needs " + std::to_string(need) +
                      " bytes of KV memory (KDA states + " + "latent cache for " +
                      std::to_string(n + max_new) + " positions) but the " +
                      "engine's kv budget is " + std::to_string(live.limit()) + " bytes");
  return Status::ok();
}

Result<RequestId> Engine::submit(GenerationRequest request, GenerationCallbacks callbacks) {
  Impl& m = *impl_;
  auto s = std::make_unique<Seq>();
  if (Status st = m.validate(request, s->max_new, s->context_bound); !st.is_ok()) {
    ++m.stats.rejected;
    return st;
  }
  if (static_cast<int64_t>(m.waiting.size()) >= m.opt.max_queue) {
    ++m.stats.rejected;
    return Status(ErrorCode::kUnavailable, "the queue is full (" +
                                               std::to_string(m.waiting.size()) +
                                               " requests waiting); retry later");
  }
  s->id = m.next_id++;
  if (m.leader()) {
    m.outbox.pod(EngineEvent::kSubmit);
    m.outbox.pod(s->id);
    write_request(m.outbox, request);
  }
  s->req = std::move(request);
  s->cb = std::move(callbacks);
  s->submitted = Clock::now();
  s->result.prompt_tokens = s->prompt_len();
  ++m.stats.submitted;
  m.stats.prompt_tokens += s->prompt_len();
  const RequestId id = s->id;
  m.waiting.push_back(std::move(s));
  m.stats.waiting = static_cast<int64_t>(m.waiting.size());
  return id;
}

void Engine::cancel(RequestId id) {
  Impl& m = *impl_;
  if (m.leader()) {
    m.outbox.pod(EngineEvent::kCancel);
    m.outbox.pod(id);
  }
  for (auto it = m.waiting.begin(); it != m.waiting.end(); ++it) {
    if ((*it)->id != id) continue;
    std::unique_ptr<Seq> s = std::move(*it);
    m.waiting.erase(it);
    m.stats.waiting = static_cast<int64_t>(m.waiting.size());
    m.finish(*s, FinishReason::kCancelled);
    return;
  }
  for (auto& s : m.running)
    if (s->id == id) s->cancel = true;
}

// Moves waiting requests into the running set while sequences and kv budget allow.
void Engine::Impl::admit() {
  while (!waiting.empty() && static_cast<int64_t>(running.size()) < opt.max_sequences) {
    Seq& s = *waiting.front();
    const int64_t need = reservation(std::min(ctx, s.prompt_len() + s.max_new + 1));
    if (!live.fits(need)) break;  // wait for running sequences to finish
    (void)live.take(need, "request " + std::to_string(s.id));
    s.reserved = need;
    auto state = SequenceState::create(w.config, pool, nullptr, w.shard);
    if (!state.is_ok()) {
      std::unique_ptr<Seq> done = std::move(waiting.front());
      waiting.pop_front();
      fail(*done, state.status());
      continue;
    }
    s.state = std::move(state).value();
    s.gen = std::make_unique<Generation>(s.req, model->tokenizer(), model->info().stop_tokens,
                                         w.config.vocab_size);
    s.admitted = Clock::now();
    s.result.queue_seconds = seconds(s.submitted, s.admitted);
    running.push_back(std::move(waiting.front()));
    waiting.pop_front();
    Seq& r = *running.back();
    r.next_snapshot = interval;
    const PrefixEntry* e = restore_prefix(r);
    if (e != nullptr && r.prompt_done == r.prompt_len()) choose_next(r, e->last_logits.data());
  }
  stats.waiting = static_cast<int64_t>(waiting.size());
  stats.running = static_cast<int64_t>(running.size());
}

// Restores the deepest stored prefix of the prompt; returns its entry (null: none).
const PrefixEntry* Engine::Impl::restore_prefix(Seq& s) {
  if (!prefix || !s.req.use_prefix_cache || s.max_new == 0) return nullptr;  // 0: scoring
  const PrefixStore::Match m = prefix->lookup(s.req.prompt);
  if (m.entry == nullptr) return nullptr;
  s.state.restore(m.entry->snapshot);
  s.prompt_done = m.entry->snapshot.position;
  s.result.cached_tokens = s.prompt_done;
  while (s.next_snapshot <= s.prompt_done) s.next_snapshot += interval;
  return m.entry;
}

std::vector<Planned> Engine::Impl::plan_step(std::vector<Segment>& segs,
                                             std::vector<int32_t>& tokens,
                                             std::vector<int64_t>& rows) {
  std::vector<Planned> plan;
  const int64_t budget = opt.max_sequences + opt.prefill_chunk;
  auto add = [&](Seq& s, const int32_t* t, int64_t n, bool prefill, int64_t logit_rows) {
    const int64_t row0 = static_cast<int64_t>(tokens.size());
    segs.push_back(Segment{&s.state, row0, n});
    tokens.insert(tokens.end(), t, t + n);
    Planned p{&s, n, prefill, logit_rows > 0 ? static_cast<int64_t>(rows.size()) : -1, logit_rows};
    for (int64_t i = n - logit_rows; i < n; ++i) rows.push_back(row0 + i);
    plan.push_back(p);
  };
  for (auto& s : running)
    if (s->pending) add(*s, &*s->pending, 1, false, 1);
  for (auto& sp : running) {
    Seq& s = *sp;
    if (s.pending || s.prompt_done >= s.prompt_len()) continue;
    const int64_t C = opt.prefill_chunk;
    const int64_t end = std::min(s.prompt_len(), (s.prompt_done / C + 1) * C);
    const int64_t n = end - s.prompt_done;
    if (static_cast<int64_t>(tokens.size()) + n > budget) continue;
    const int64_t want = s.req.keep_logits ? n : (end == s.prompt_len() ? 1 : 0);
    add(s, s.req.prompt.data() + s.prompt_done, n, true, want);
  }
  return plan;
}

Status FollowerAccess::replay(Engine& e, std::string_view events) {
  Reader r(events);
  while (!r.done() && r.ok()) {
    const auto ev = r.pod<EngineEvent>();
    const auto id = r.pod<RequestId>();
    if (ev == EngineEvent::kCancel) {
      e.cancel(id);
      continue;
    }
    GenerationRequest req = read_request(r);
    if (!r.ok()) break;
    auto got = e.submit(std::move(req), GenerationCallbacks{});
    if (!got.is_ok() || *got != id)
      return Status(ErrorCode::kInconsistent,
                    "request " + std::to_string(id) + " of the leader was " +
                        (got.is_ok() ? "given id " + std::to_string(*got) + " here"
                                     : "refused here: " + got.status().message()));
  }
  if (!r.ok()) return Status(ErrorCode::kInternal, "malformed step message from the leader");
  return Status::ok();
}

Status Engine::step() {
  Impl& m = *impl_;
  const auto t0 = Clock::now();
  if (m.leader()) {
    send_to_followers(*m.group, LeaderOp::kStep, m.engine_id, m.outbox.bytes(), &m.tp->stats());
    m.outbox.bytes().clear();
  }
  m.reap();
  m.admit();
  std::vector<Segment> segs;
  std::vector<int32_t> tokens;
  std::vector<int64_t> rows;
  const std::vector<Planned> plan = m.plan_step(segs, tokens, rows);
  if (plan.empty()) return Status::ok();
  m.logits.resize(rows.size() * static_cast<size_t>(m.w.config.vocab_size));
  Status st = reserve_segments(segs);
  const double read0 = m.forward->executor().read_seconds();
  const auto f0 = Clock::now();
  if (st.is_ok()) st = m.forward->run(segs, m.fwd, m.arena, tokens.data(), rows, m.logits.data());
  m.stats.forward_seconds += seconds(f0, Clock::now());
  m.stats.attnres_read_seconds += m.forward->executor().read_seconds() - read0;
  ++m.stats.steps;
  m.stats.dense_seconds = m.proj.dense_seconds;
  m.stats.mxfp4_seconds = m.proj.mxfp4_seconds;
  m.stats.dense_bytes = m.proj.dense_bytes;
  m.stats.mxfp4_bytes = m.proj.mxfp4_bytes;
  m.stats.dense_flops = m.proj.dense_flops;
  m.stats.mxfp4_flops = m.proj.mxfp4_flops;
  const CommStats& cs = m.tp->stats();
  m.stats.collectives = cs.collectives;
  m.stats.gathers = cs.gathers;
  m.stats.gather_bytes = cs.gather_bytes;
  m.stats.comm_seconds = cs.seconds;
  for (const Planned& p : plan) {
    if (!st.is_ok())
      m.fail(*p.seq, st);
    else if (p.prefill)
      m.after_prefill(*p.seq, p);
    else
      m.after_decode(*p.seq, p);
  }
  m.reap();
  m.stats.kv_reserved_bytes = m.live.used();
  m.stats.kv_pages_in_use = m.pool.pages_in_use();
  if (m.prefix) {
    const PrefixStoreStats& ps = m.prefix->stats();
    m.stats.prefix_lookups = ps.lookups;
    m.stats.prefix_hits = ps.hits;
    m.stats.prefix_tokens_matched = ps.tokens_matched;
    m.stats.prefix_tokens_restored = ps.tokens_restored;
    m.stats.prefix_tokens_recomputed = ps.tokens_recomputed;
    m.stats.prefix_bytes = m.prefix->bytes();
    m.stats.prefix_entries = static_cast<int64_t>(m.prefix->size());
  }
  m.stats.step_seconds += seconds(t0, Clock::now());
  return st;
}

Status Engine::run(const std::function<bool()>& stop) {
  while (has_work()) {
    if (stop && stop()) return Status(ErrorCode::kCancelled, "stopped");
    ATTNRES_RETURN_IF_ERROR(step());
  }
  return Status::ok();
}

void Engine::Impl::snapshot(const Seq& s, std::span<const int32_t> t, const float* last_logits) {
  if (!prefix || !s.req.use_prefix_cache) return;
  const int64_t V = w.config.vocab_size;
  prefix->insert(t, s.state,
                 last_logits ? std::span<const float>(last_logits, static_cast<size_t>(V))
                             : std::span<const float>());
}

void Engine::Impl::after_prefill(Seq& s, const Planned& p) {
  s.prompt_done += p.rows;
  stats.prefilled_tokens += p.rows;
  const int64_t V = w.config.vocab_size, n = s.prompt_len();
  if (s.req.keep_logits)
    s.result.prompt_logits.insert(s.result.prompt_logits.end(), row(p, 0),
                                  row(p, 0) + p.logit_rows * V);
  if (s.cb.on_prefill) s.cb.on_prefill(s.prompt_done, n);
  const std::span<const int32_t> done(s.req.prompt.data(), static_cast<size_t>(s.prompt_done));
  if (s.prompt_done < n) {
    if (s.prompt_done >= s.next_snapshot) {
      snapshot(s, done, nullptr);
      while (s.next_snapshot <= s.prompt_done) s.next_snapshot += interval;
    }
    return;
  }
  const float* last = row(p, p.logit_rows - 1);
  snapshot(s, done, last);
  if (s.max_new == 0) return finish(s, FinishReason::kLength);  // a scoring request
  choose_next(s, last);
}

void Engine::Impl::after_decode(Seq& s, const Planned& p) {
  const float* r = row(p, 0);
  s.pending.reset();
  if (s.ending) {  // the last token is in: keep the state for the next turn
    std::vector<int32_t> all = s.req.prompt;
    all.insert(all.end(), s.gen->generated().begin(), s.gen->generated().end());
    snapshot(s, all, r);
    finish(s, *s.ending);
    return;
  }
  choose_next(s, r);
}

// Chooses the token after `row`, shows it, and decides whether the request goes on.
void Engine::Impl::choose_next(Seq& s, const float* logits_row) {
  const auto V = static_cast<size_t>(w.config.vocab_size);
  TokenEvent ev;
  if (s.req.keep_logits)
    s.result.token_logits.insert(s.result.token_logits.end(), logits_row, logits_row + V);
  auto token = s.gen->choose(std::span<const float>(logits_row, V), s.where(), ev);
  if (!token.is_ok()) return fail(s, token.status());
  if (Status st = s.gen->accept(*token, ev); !st.is_ok()) return fail(s, st);
  const auto now = Clock::now();
  if (s.gen->generated().size() == 1) {
    s.first_token = now;
    s.result.ttft_seconds = seconds(s.submitted, now);
  }
  ++stats.generated_tokens;
  s.result.text += ev.text;
  if (s.cb.on_token) s.cb.on_token(ev);
  const int64_t g = static_cast<int64_t>(s.gen->generated().size());
  if (s.gen->stopped()) return end(s, *s.gen->reason());
  if (g >= s.max_new)
    return end(s, s.context_bound ? FinishReason::kContext : FinishReason::kLength);
  s.pending = *token;
}

// The generation is over; with snapshot_at_end the last token is fed first (next step).
void Engine::Impl::end(Seq& s, FinishReason reason) {
  if (s.req.snapshot_at_end && prefix && s.req.use_prefix_cache && s.state.position + 1 <= ctx) {
    s.pending = s.gen->generated().back();
    s.ending = reason;
    return;
  }
  finish(s, reason);
}

void Engine::Impl::fail(Seq& s, const Status& st) {
  finish(s, FinishReason::kError, st);
}

void Engine::Impl::finish(Seq& s, FinishReason reason, Status error) {
  s.pending.reset();
  s.ending.reset();
  s.cancel = false;
  GenerationResult& r = s.result;
  if (s.gen) {
    if (std::string tail = s.gen->finish_text(); !tail.empty() && reason != FinishReason::kError) {
      r.text += tail;
      TokenEvent ev;
      ev.token = -1;  // text released at the end, no token
      ev.text = std::move(tail);
      if (s.cb.on_token) s.cb.on_token(ev);
    }
    r.tokens = s.gen->generated();
    r.stop_string = s.gen->stop_string();
  }
  r.reason = reason;
  r.error = std::move(error);
  if (!r.tokens.empty()) r.decode_seconds = seconds(s.first_token, Clock::now());
  live.give(s.reserved);
  s.reserved = 0;
  s.state = SequenceState();  // pages back to the pool
  ++stats.finished;
  stats.cancelled += reason == FinishReason::kCancelled ? 1 : 0;
  stats.failed += reason == FinishReason::kError ? 1 : 0;
  s.gen.reset();
  s.id = 0;  // marks it finished: reap() removes it from the running set
  if (s.cb.on_finish) s.cb.on_finish(std::move(r));
}

// Finishes cancelled sequences and drops finished ones.
void Engine::Impl::reap() {
  for (auto& s : running)
    if (s->id != 0 && s->cancel) finish(*s, FinishReason::kCancelled);
  running.erase(std::remove_if(running.begin(), running.end(),
                               [](const std::unique_ptr<Seq>& s) { return s->id == 0; }),
                running.end());
  stats.running = static_cast<int64_t>(running.size());
}

}  // namespace attnres
