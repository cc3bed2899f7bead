// Model directory checks (model_check.h).
#include "check/model_check.h"

#include <filesystem>

#include "plan/plan.h"
#include "plan/program.h"
#include "tokenizer/tokenizer.h"

namespace attnres {

Result<TokenizerFacts> check_tokenizer(const std::string& path, const ModelConfig& config) {
  ATTNRES_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(path, PreTokenizer::kKimi));
  TokenizerFacts f;
  f.path = tok.source();
  f.ranks = static_cast<int64_t>(tok.ranks().size());
  f.vocab_size = tok.vocab_size();
  f.control_token_source = tok.control_token_source();
  if (tok.vocab_size() > config.vocab_size)
    return Status(ErrorCode::kInconsistent,
                  tok.source() + ": tokenizer has ids up to " +
                      std::to_string(tok.vocab_size() - 1) + " (" + std::to_string(f.ranks) +
                      " ranks + control tokens) but " + config.source + " has vocab_size " +
                      std::to_string(config.vocab_size) +
                      ": those ids would index past the embedding and the logits");
  for (std::string_view name : {kOpenToken, kCloseToken, kSepToken, kEndOfMsgToken}) {
    const TokenId id = tok.special_id(name);
    if (id < 0)
      return Status(
          ErrorCode::kMissingField,
          tok.source() + ": the chat format (chat, generate --chat) needs control token " +
              std::string(name) + ", which " + tok.control_token_source() + " does not define");
    f.chat_tokens.emplace_back(std::string(name), id);
  }
  return f;
}

Result<ModelCheck> check_model_dir(const std::string& model_dir) {
  ModelCheck c;
  // The checks read little of the weights: view them in the mapping.
  ATTNRES_ASSIGN_OR_RETURN(c.weights, load_model(model_dir, {}, WeightResidence::kMapped));
  const ModelConfig& cfg = c.weights.config;
  // What PlannedForward::create builds and the executor verifies.
  const Program program = build_program(cfg.schedule);
  const Plan plan = make_plan(program, Policy::kPlanned);
  ATTNRES_ASSIGN_OR_RETURN(std::vector<Hazard> hazards, verify_plan(program, plan));
  if (!hazards.empty())
    return Status(ErrorCode::kHazard, cfg.source + ": the planned storage of this schedule has " +
                                          std::to_string(hazards.size()) +
                                          " hazard(s); first: " + format_hazard(hazards.front()));
  c.plan_buffers = plan.num_storages();
  const std::string tok = (std::filesystem::path(model_dir) / "tiktoken.model").string();
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::symlink_status(tok, ec))) {
    ATTNRES_ASSIGN_OR_RETURN(c.tokenizer, check_tokenizer(tok, cfg));
  }
  return c;
}

}  // namespace attnres
