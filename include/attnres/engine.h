// attnres public API: load a model, and run generation requests through the batched engine.
//
// Model: the weights (memory-mapped, validated) and the tokenizer of one model directory in the
// published Kimi-K3 layout. Immutable after load; one Model may serve several engines.
//
// Engine: continuous batching over many sequences. Each step() is one forward pass over every
// running sequence: one row per decoding sequence plus prefill chunks of the others, within a
// token budget. Chunks start and end on a fixed grid of the sequence's own positions (multiples
// of prefill_chunk), so a sequence's chunking, and with it every logit it gets, is the same
// whatever else runs; the engine is batch invariant bit for bit (model/batch.h): a request's
// output does not depend on what shares its steps. Sampling, stop tokens and strings, streaming
// detokenisation, context limits and cancellation live here, one loop for every front end.
//
// Memory: the latent cache lives in pages of one pool; every admitted sequence reserves its
// worst case (KDA states + pages for prompt + max_new_tokens, bounded by the context) against
// `kv_budget`, so an admitted request never runs out of memory; pages are allocated as they
// are written. The prefix store (snapshots of exact positions, runtime/prefix_store.h) has a
// budget of its own. A request that cannot fit even in an empty engine is refused at submit().
//
// Thread-safety: an Engine is driven by one thread (submit, cancel, step); callbacks run on
// that thread inside step(). Models are safe to share.
//
// Several processes (attnres/parallel.h): a Model loaded under an MPI launcher is this rank's
// share of the weights, and an Engine runs on every rank of the group: the leader (rank 0)
// drives it through this API; step() broadcasts what was submitted and cancelled since the last
// step to the followers, which mirror it. Results and callbacks are the leader's; they are
// bitwise those of one process.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attnres/sampling.h"
#include "attnres/status.h"

namespace attnres {

// The physical cores this process may run on (its CPU affinity, one per core whatever its SMT
// siblings), at least 1: the default thread count.
int default_thread_count();
// Threads every kernel uses from now on (results never depend on it).
void set_thread_count(int threads);
int thread_count();

struct ModelWeights;    // internal (src/io/weights.h)
class Tokenizer;        // internal (src/tokenizer/tokenizer.h)
class Communicator;     // internal (src/parallel/comm.h)
struct FollowerAccess;  // internal (src/runtime/follower.h)

struct ModelLoadOptions {
  std::string dir;        // config.json + model.safetensors (or shards + index)
  std::string tokenizer;  // tiktoken.model path; default DIR/tiktoken.model
  bool require_tokenizer = true;
  // View the weights in the read-only file mapping instead of reading them into memory: a
  // faster start and a page cache shared between processes, but a slower decode (README,
  // "Weights in memory"). Sharded rows on several ranks are read either way.
  bool mmap = false;
  // Called with a line to show while loading (model mapped, tokenizer loaded); may be null.
  std::function<void(const std::string&)> progress;
  // The ranks that share the model; null: this process's group (attnres/parallel.h), one
  // process unless started by an MPI launcher. On several ranks, load() runs on the leader
  // (the followers load their shares in follow_leader()).
  std::shared_ptr<Communicator> group;
};

struct ModelInfo {
  std::string dir;
  int64_t vocab_size = 0;
  int64_t context_length = 0;  // max_position_embeddings (0 if the config has none)
  int num_layers = 0;
  int64_t hidden_size = 0;
  int64_t bytes_mapped = 0;
  int64_t bytes_in_memory = 0;  // weights read into private memory (see ModelLoadOptions::mmap)
  int64_t bytes_in_memory_huge = 0;  // of those, on transparent huge pages right after the load
  int64_t tensors_bound = 0;
  int64_t weight_bytes = 0;           // bytes of every bound tensor
  int ranks = 1;                      // processes sharing the model (tensor parallelism)
  int64_t rank_weight_bytes = 0;      // this rank's share: its rows and the replicated tensors
  int64_t rank_replicated_bytes = 0;  // the replicated tensors alone
  int64_t rank_copy_bytes = 0;  // copies made of them at load (MLA's per-head absorbed weights)
  bool has_tokenizer = false;
  int32_t eos_token = -1;            // the config's eos_token_id, -1 if none
  std::vector<int32_t> stop_tokens;  // <|end_of_msg|> and the config's eos, when present
};

class Model {
 public:
  static Result<std::shared_ptr<const Model>> load(const ModelLoadOptions& options);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelInfo& info() const;
  // Text to ids (ordinary text: control tokens never come out of it unless allow_special).
  Result<std::vector<int32_t>> encode(std::string_view text, bool allow_special = false) const;
  Result<std::string> decode(std::span<const int32_t> ids) const;
  int32_t special_token(std::string_view name) const;  // -1 when absent

  // In-tree access for the engine and the developer tools.
  const ModelWeights& weights() const;
  const Tokenizer* tokenizer() const;  // null without one
  const std::shared_ptr<Communicator>& group() const;

 private:
  friend struct FollowerAccess;
  Model();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

enum class ActivationType { kBF16, kF32 };
enum class CacheType { kAuto, kF32, kBF16, kFP8 };

struct EngineOptions {
  ActivationType activation = ActivationType::kBF16;
  CacheType cache = CacheType::kAuto;  // auto: bf16 for bf16 activations, f32 for f32
  int max_sequences = 16;              // running at once (the rest wait in the queue)
  int64_t max_queue = 1 << 20;         // waiting requests beyond which submit() refuses
  int64_t prefill_chunk = 512;         // prefill chunk grid (positions)
  int64_t context_length = 0;          // 0: the model's max_position_embeddings
  int64_t kv_budget = -1;              // bytes; -1: max_sequences full contexts
  int64_t prefix_cache_bytes = 0;      // 0: no prefix store
  int64_t snapshot_interval = 0;       // prefill snapshots every N positions (0: 4 chunks)
  int64_t page_tokens = 64;            // latent-cache page size (positions)
  int64_t kda_chunk = 64;              // WY chunk of the KDA prefill form
  bool allow_forced_tokens = false;    // test flag: let requests dictate their output tokens
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_new_tokens = -1;       // -1: up to the context; 0 with keep_logits: score the prompt
  bool strict_context = false;       // prompt + max_new_tokens must fit the context (else refused)
  bool ignore_eos = false;           // generate through the model's stop tokens
  std::vector<int32_t> stop_tokens;  // besides the model's
  std::vector<std::string> stop_strings;              // text that ends the generation (not shown)
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logits before sampling
  int top_logprobs = -1;               // -1: none; 0..20: the chosen token's logprob and the top n
  bool keep_logits = false;            // GenerationResult::prompt_logits and token_logits
  bool use_prefix_cache = true;        // restore from / add to the prefix store
  bool snapshot_at_end = false;        // also store the state after the last token (chat turns)
  std::vector<int32_t> forced_tokens;  // needs EngineOptions::allow_forced_tokens
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

struct TokenEvent {
  int32_t token = 0;
  std::string text;               // what may be shown now (complete UTF-8; stop strings held back)
  float logprob = 0;              // when requested: log softmax of the raw logits
  std::vector<TokenLogprob> top;  // top_logprobs entries, most likely first
};

enum class FinishReason { kStopToken, kStopString, kLength, kContext, kCancelled, kError };
std::string_view finish_reason_name(FinishReason r);  // "stop", "stop_string", "length", ...

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids (a stop token that ended it included)
  std::string text;             // everything shown
  FinishReason reason = FinishReason::kLength;
  std::string stop_string;  // the stop string that matched
  Status error;             // with kError
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // restored from the prefix store
  double queue_seconds = 0;   // submit to admission
  double ttft_seconds = 0;    // submit to the first token
  double decode_seconds = 0;  // first token to the last
  // keep_logits: the logits of every prompt position the engine computed (positions
  // cached_tokens .. prompt_tokens - 1), [rows, V], and the row each generated token was chosen
  // from, [tokens, V] (row 0: the one after the prompt).
  std::vector<float> prompt_logits, token_logits;
};

struct GenerationCallbacks {
  std::function<void(const TokenEvent&)> on_token;
  std::function<void(GenerationResult&&)> on_finish;
  std::function<void(int64_t done, int64_t total)> on_prefill;  // after each prompt chunk
};

using RequestId = uint64_t;

struct EngineStats {
  int64_t running = 0, waiting = 0;
  int64_t submitted = 0, rejected = 0, finished = 0, cancelled = 0, failed = 0;
  int64_t prompt_tokens = 0, prefilled_tokens = 0, generated_tokens = 0;
  int64_t steps = 0;
  double step_seconds = 0;                      // forward passes and sampling
  double forward_seconds = 0;                   // forward passes alone
  double attnres_read_seconds = 0;              // AttnRes reads inside them
  double dense_seconds = 0, mxfp4_seconds = 0;  // projection batches (ProjectionStats)
  int64_t dense_bytes = 0, mxfp4_bytes = 0;
  double dense_flops = 0, mxfp4_flops = 0;
  int64_t prefix_lookups = 0, prefix_hits = 0, prefix_tokens_matched = 0,
          prefix_tokens_restored = 0, prefix_tokens_recomputed = 0, prefix_bytes = 0,
          prefix_entries = 0;
  int64_t kv_reserved_bytes = 0, kv_budget_bytes = 0, kv_pages_in_use = 0, kv_page_bytes = 0;
  // Tensor parallelism: the ranks the engine runs on and this rank's collectives (all-gathers,
  // fused ones counted once, plus the per-step broadcast and agreement), the bytes of the
  // gathered results and the wall time spent waiting in collectives.
  int ranks = 1;
  int64_t collectives = 0, gathers = 0, gather_bytes = 0;
  double comm_seconds = 0;
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> create(std::shared_ptr<const Model> model,
                                                const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request. Errors name the field: kInvalidArgument (bad ids, sampling
  // values, logit_bias), kContextLengthExceeded (the prompt, or with strict_context the prompt
  // plus max_new_tokens, exceeds the context), kResourceExhausted (larger than the whole
  // kv_budget), kUnavailable (the queue is full).
  Result<RequestId> submit(GenerationRequest request, GenerationCallbacks callbacks);
  // A queued request finishes (kCancelled) at once, a running one at the next step. Unknown or
  // finished ids are ignored.
  void cancel(RequestId id);
  // One iteration: admits what fits, runs one forward step, samples, calls back.
  Status step();
  bool has_work() const;
  // Steps until no work is left or `stop` returns true (checked before every step).
  Status run(const std::function<bool()>& stop = nullptr);

  const EngineStats& stats() const;
  const EngineOptions& options() const;
  int64_t context_length() const;
  int64_t token_budget() const;  // rows of one step: max_sequences + prefill_chunk

 private:
  friend struct FollowerAccess;
  Engine();
  static Result<std::unique_ptr<Engine>> create_local(std::shared_ptr<const Model> model,
                                                      const EngineOptions& options, int64_t id);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnres
