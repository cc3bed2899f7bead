// Model (include/attnres/engine.h): the weights and tokenizer of one model directory.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "attnres/engine.h"
#include "io/weights.h"
#include "parallel/comm.h"
#include "runtime/follower.h"
#include "tokenizer/tokenizer.h"
#include "util/memory.h"

namespace attnres {

struct Model::Impl {
  ModelWeights weights;
  std::unique_ptr<Tokenizer> tokenizer;
  ModelInfo info;
  std::shared_ptr<Communicator> group;
};

Model::Model() : impl_(std::make_unique<Impl>()) {}
Model::~Model() = default;

const ModelInfo& Model::info() const {
  return impl_->info;
}
const ModelWeights& Model::weights() const {
  return impl_->weights;
}
const Tokenizer* Model::tokenizer() const {
  return impl_->tokenizer.get();
}
const std::shared_ptr<Communicator>& Model::group() const {
  return impl_->group;
}

namespace {

Status load_tokenizer(const ModelLoadOptions& o, const ModelWeights& w,
                      std::unique_ptr<Tokenizer>& out) {
  const std::string path = o.tokenizer.empty() ? o.dir + "/tiktoken.model" : o.tokenizer;
  std::error_code ec;
  if (o.tokenizer.empty() && !o.require_tokenizer && !std::filesystem::exists(path, ec))
    return Status::ok();
  ATTNRES_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(path, PreTokenizer::kKimi));
  if (tok.vocab_size() > w.config.vocab_size) {
    return Status(ErrorCode::kInconsistent,
                  path + ": tokenizer has " + std::to_string(tok.vocab_size()) +
                      " ids but the model's vocab_size is " + std::to_string(w.config.vocab_size));
  }
  out = std::make_unique<Tokenizer>(std::move(tok));
  return Status::ok();
}

}  // namespace

Result<std::shared_ptr<const Model>> Model::load(const ModelLoadOptions& o) {
  std::shared_ptr<Communicator> group = o.group ? o.group : process_group();
  if (group->size() > 1) {
    if (group->rank() != 0)
      return Status(ErrorCode::kInvalidArgument,
                    rank_prefix(*group) +
                        "Model::load runs on the leader (rank 0); followers "
                        "load their shares in follow_leader()");
    Writer w;
    w.pod(o.require_tokenizer);
    send_to_followers(*group, LeaderOp::kLoadModel, 0, w.bytes());
  }
  return FollowerAccess::load(o, std::move(group), Status::ok());
}

// This rank's share of the model, then the agreement of every rank (prior: an error this rank
// already has, e.g. a bad flag, reported in the agreement instead of loading).
Result<std::shared_ptr<const Model>> FollowerAccess::load(const ModelLoadOptions& o,
                                                          std::shared_ptr<Communicator> group,
                                                          Status prior) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  std::shared_ptr<Model> m(new Model());
  m->impl_->group = group;
  const Shard shard{group->rank(), group->size()};
  Status st = prior;
  if (st.is_ok()) {
    auto w =
        load_model(o.dir, shard, o.mmap ? WeightResidence::kMapped : WeightResidence::kPrivate);
    if (w.is_ok())
      m->impl_->weights = std::move(w).value();
    else
      st = w.status();
  }
  if (st.is_ok()) st = load_tokenizer(o, m->impl_->weights, m->impl_->tokenizer);
  ATTNRES_RETURN_IF_ERROR(agree(*group, st));
  const ModelWeights& w = m->impl_->weights;
  int64_t bound = 0;
  for (const auto& [dtype, bytes] : w.report.bytes_by_dtype) bound += bytes;
  if (group->size() > 1) {
    // Every rank must have loaded the same model (its share of it): the same shape and the same
    // whole-tensor byte counts.
    const ModelConfig& c = w.config;
    uint64_t h = 0xcbf29ce484222325ull;
    for (int64_t v : {c.hidden_size, c.vocab_size, int64_t{c.num_hidden_layers},
                      int64_t{c.num_experts}, int64_t{c.num_attention_heads},
                      int64_t{c.linear.num_heads}, w.report.tensors_bound, bound})
      h = (h ^ static_cast<uint64_t>(v)) * 0x100000001b3ull;
    const auto fp = static_cast<int64_t>(h >> 1);
    const int64_t hi = group->max(fp), lo = -group->max(-fp);
    if (hi != lo)
      return Status(ErrorCode::kInconsistent,
                    "the ranks loaded different models (shape or tensor sizes differ; this is " +
                        rank_prefix(*group) + o.dir + "): give every rank the same --model");
  }
  const int64_t huge =
      w.private_memory ? static_cast<int64_t>(w.private_memory->huge_page_bytes()) : 0;
  if (o.progress) {
    char line[512];
    std::snprintf(
        line, sizeof line,
        "loaded %s: %lld tensors (%.2f GB), %.2f GB read into memory (%.2f GB of it on "
        "huge pages), in %.2f s",
        o.dir.c_str(), static_cast<long long>(w.report.tensors_bound),
        static_cast<double>(bound) / 1e9, static_cast<double>(w.report.bytes_private) / 1e9,
        static_cast<double>(huge) / 1e9, std::chrono::duration<double>(Clock::now() - t0).count());
    o.progress(line);
  }
  ModelInfo& info = m->impl_->info;
  info.dir = o.dir;
  info.vocab_size = w.config.vocab_size;
  info.context_length = w.config.max_position_embeddings.value_or(0);
  info.num_layers = w.config.num_hidden_layers;
  info.hidden_size = w.config.hidden_size;
  info.bytes_mapped = w.report.bytes_mapped;
  info.bytes_in_memory = w.report.bytes_private;
  info.bytes_in_memory_huge = huge;
  info.tensors_bound = w.report.tensors_bound;
  info.weight_bytes = bound;
  info.ranks = shard.ranks;
  info.rank_weight_bytes = w.report.rank_bytes;
  info.rank_replicated_bytes = w.report.rank_replicated_bytes;
  info.rank_copy_bytes = w.report.rank_copy_bytes;
  info.has_tokenizer = m->impl_->tokenizer != nullptr;
  if (const Tokenizer* t = m->impl_->tokenizer.get()) {
    if (const TokenId eom = t->special_id(kEndOfMsgToken); eom >= 0)
      info.stop_tokens.push_back(eom);
  }
  if (w.config.eos_token_id) {
    info.eos_token = static_cast<int32_t>(*w.config.eos_token_id);
    info.stop_tokens.push_back(info.eos_token);
  }
  return std::shared_ptr<const Model>(std::move(m));
}

Result<std::vector<int32_t>> Model::encode(std::string_view text, bool allow_special) const {
  if (!impl_->tokenizer)
    return Status(ErrorCode::kInvalidArgument, impl_->info.dir + ": the model has no tokenizer");
  return impl_->tokenizer->encode(text, allow_special);
}

Result<std::string> Model::decode(std::span<const int32_t> ids) const {
  if (!impl_->tokenizer)
    return Status(ErrorCode::kInvalidArgument, impl_->info.dir + ": the model has no tokenizer");
  return impl_->tokenizer->decode(ids);
}

int32_t Model::special_token(std::string_view name) const {
  return impl_->tokenizer ? impl_->tokenizer->special_id(name) : -1;
}

}  // namespace attnres
