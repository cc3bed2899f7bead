// The chat facade of the public API (include/attnres/chat.h) over src/tokenizer/chat*.h.
#include "attnres/chat.h"

#include "tokenizer/chat.h"
#include "tokenizer/chat_parse.h"

namespace attnres {

namespace {
Result<const Tokenizer*> need_tokenizer(const Model& model) {
  if (model.tokenizer() == nullptr)
    return Status(ErrorCode::kInvalidArgument,
                  model.info().dir + ": the chat format needs the model's tokenizer");
  return model.tokenizer();
}
}  // namespace

Result<ChatPrompt> apply_chat_template(const Model& model, const nlohmann::ordered_json& body) {
  ATTNRES_ASSIGN_OR_RETURN(const Tokenizer* tok, need_tokenizer(model));
  ATTNRES_ASSIGN_OR_RETURN(ChatRequest req, parse_chat_request(body));
  ATTNRES_ASSIGN_OR_RETURN(std::vector<ChatSegment> seg, render_chat_request(req));
  ChatPrompt p;
  p.text = chat_segments_text(seg);
  ATTNRES_ASSIGN_OR_RETURN(p.tokens, encode_chat_segments(*tok, seg));
  p.thinking = req.options.thinking;
  return p;
}

struct ChatOutput::Impl {
  const Tokenizer* tokenizer;
  ChatOutputParser parser;
};

ChatOutput::ChatOutput(const Model& model, bool thinking, std::string call_id_prefix) {
  ChatParserOptions o;
  o.thinking = thinking;
  o.call_id_prefix = std::move(call_id_prefix);
  impl_ = std::make_unique<Impl>(Impl{model.tokenizer(), ChatOutputParser(o)});
}
ChatOutput::~ChatOutput() = default;
ChatOutput::ChatOutput(ChatOutput&&) noexcept = default;
ChatOutput& ChatOutput::operator=(ChatOutput&&) noexcept = default;

Result<std::vector<ChatEvent>> ChatOutput::push(int32_t token) {
  if (impl_->tokenizer == nullptr)
    return Status(ErrorCode::kInvalidArgument, "chat output: the model has no tokenizer");
  ATTNRES_ASSIGN_OR_RETURN(ChatPiece piece, chat_piece(*impl_->tokenizer, token));
  return impl_->parser.push(piece);
}

std::vector<ChatEvent> ChatOutput::finish(ChatOutputEnd end) {
  return impl_->parser.finish(end);
}

ChatParsed ChatOutput::message() const {
  return impl_->parser.result();
}

bool ChatOutput::ended() const {
  return impl_->parser.ended();
}

}  // namespace attnres
