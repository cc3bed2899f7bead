// `attnres serve` (server.h): routing, authentication, the routes that do not generate, the
// metrics, the request log, and the model's loading and the server's shutdown.
#include "server/server.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>
#include <thread>

#include "attnres/chat.h"
#include "server/state.h"
#include "util/memory.h"

namespace attnres::server {

using json = nlohmann::ordered_json;

std::string wire(const json& v) {
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

void send_json(HttpResponder& res, int status, const json& body, const HttpHeaders& extra) {
  res.send(status, "application/json", wire(body), extra);
}

void send_error(HttpResponder& res, const ApiError& e, RequestLog& log) {
  log.status = e.status;
  log.note = e.message.size() > 160 ? e.message.substr(0, 157) + "..." : e.message;
  HttpHeaders extra;
  if (e.status == 503) extra.emplace_back("Retry-After", "1");
  if (e.status == 401) extra.emplace_back("WWW-Authenticate", "Bearer");
  send_json(res, e.status, error_json(e), extra);
}

namespace {

using Clock = std::chrono::steady_clock;

void handle_models(ServerState& s, const HttpRequest& req, HttpResponder& res, RequestLog& log) {
  json m = {{"id", s.model_id},
            {"object", "model"},
            {"created", s.created},
            {"owned_by", "attnres"},
            {"meta",
             {{"context_length", s.loop->context_length()},
              {"vocab_size", s.model->info().vocab_size},
              {"num_layers", s.model->info().num_layers},
              {"hidden_size", s.model->info().hidden_size}}}};
  const std::string prefix = "/v1/models/";
  if (req.path.rfind(prefix, 0) == 0) {
    const std::string id = req.path.substr(prefix.size());
    if (id != s.model_id)
      return send_error(
          res, api_error(404, "model '" + id + "' does not exist", "model", "model_not_found"),
          log);
    log.status = 200;
    return send_json(res, 200, m);
  }
  log.status = 200;
  send_json(res, 200, {{"object", "list"}, {"data", json::array({m})}});
}

void handle_tokenize(ServerState& s, const HttpRequest& req, HttpResponder& res, RequestLog& log) {
  auto body = parse_json_body(req.header("content-type"), req.body);
  if (!body.ok()) return send_error(res, body.error, log);
  auto p = parse_tokenize(*body.value);
  if (!p.ok()) return send_error(res, p.error, log);
  std::vector<int32_t> ids;
  if (p.value->chat_body) {
    auto prompt = apply_chat_template(*s.model, *p.value->chat_body);
    if (!prompt.is_ok()) return send_error(res, status_error(prompt.status()), log);
    ids = std::move(prompt->tokens);
  } else {
    auto e = s.model->encode(*p.value->text, p.value->allow_special);
    if (!e.is_ok()) return send_error(res, status_error(e.status()), log);
    ids = std::move(e).value();
  }
  json tokens = json::array();
  for (int32_t id : ids) {
    if (!p.value->with_pieces) {
      tokens.push_back(id);
      continue;
    }
    auto piece = s.model->decode(std::span<const int32_t>(&id, 1));
    tokens.push_back({{"id", id}, {"piece", piece.is_ok() ? *piece : std::string()}});
  }
  log.status = 200;
  log.prompt_tokens = static_cast<int64_t>(ids.size());
  send_json(res, 200,
            {{"tokens", std::move(tokens)},
             {"count", ids.size()},
             {"max_model_len", s.loop->context_length()}});
}

void handle_detokenize(ServerState& s, const HttpRequest& req, HttpResponder& res,
                       RequestLog& log) {
  auto body = parse_json_body(req.header("content-type"), req.body);
  if (!body.ok()) return send_error(res, body.error, log);
  auto p = parse_detokenize(*body.value, s.limits);
  if (!p.ok()) return send_error(res, p.error, log);
  auto text = s.model->decode(p.value->tokens);
  if (!text.is_ok()) return send_error(res, status_error(text.status()), log);
  log.status = 200;
  send_json(res, 200, {{"content", *text}, {"prompt", *text}});
}

void handle_apply_template(ServerState& s, const HttpRequest& req, HttpResponder& res,
                           RequestLog& log) {
  auto body = parse_json_body(req.header("content-type"), req.body);
  if (!body.ok()) return send_error(res, body.error, log);
  auto prompt = apply_chat_template(*s.model, *body.value);
  if (!prompt.is_ok()) return send_error(res, status_error(prompt.status()), log);
  log.status = 200;
  log.prompt_tokens = static_cast<int64_t>(prompt->tokens.size());
  send_json(res, 200,
            {{"prompt", prompt->text},
             {"tokens", prompt->tokens.size()},
             {"thinking", prompt->thinking}});
}

// Prometheus text exposition format 0.0.4.
class Metrics {
 public:
  void add(const std::string& name, const char* type, const char* help, double v,
           const std::string& labels = {}) {
    if (name != last_) {
      out_ += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
      last_ = name;
    }
    char b[64];
    std::snprintf(b, sizeof b, "%.17g", v);
    out_ += name + (labels.empty() ? "" : "{" + labels + "}") + " " + b + "\n";
  }
  const std::string& text() const { return out_; }

 private:
  std::string out_, last_;
};

void handle_metrics(ServerState& s, RequestLog& log, HttpResponder& res) {
  const LoopStats ls = s.loop->stats();
  const EngineStats& e = ls.engine;
  Metrics m;
  const auto d = [](int64_t v) { return static_cast<double>(v); };
  m.add("attnres_requests_running", "gauge", "Requests in the engine's running set.", d(e.running));
  m.add("attnres_requests_waiting", "gauge",
        "Requests accepted and waiting for a running slot (queued).",
        d(std::max<int64_t>(0, ls.in_loop - e.running)));
  m.add("attnres_requests_rejected_total", "counter",
        "Requests refused: the server was full (503), or the engine refused them.",
        d(ls.refused_full), "reason=\"full\"");
  m.add("attnres_requests_rejected_total", "counter",
        "Requests refused: the server was full (503), or the engine refused them.", d(e.rejected),
        "reason=\"engine\"");
  m.add("attnres_requests_finished_total", "counter", "Engine requests that finished.",
        d(e.finished));
  m.add("attnres_requests_cancelled_total", "counter",
        "Engine requests cancelled (client gone, stop string, shutdown).", d(e.cancelled));
  m.add("attnres_requests_failed_total", "counter", "Engine requests that failed.", d(e.failed));
  m.add("attnres_client_aborts_total", "counter",
        "Generating requests whose client closed the connection before the end.",
        d(s.client_aborts.load()));
  m.add("attnres_cancels_total", "counter",
        "Requests cancelled by the server (client gone, stop string, end of message).",
        d(ls.cancels));
  m.add("attnres_cancel_max_steps_after", "gauge",
        "Most steps after the one running at a cancel that still did work for that request.",
        d(ls.max_steps_after_cancel));
  m.add("attnres_streams_active", "gauge", "SSE streams open now.", d(s.streams_active.load()));
  m.add("attnres_prompt_tokens_total", "counter", "Prompt tokens of submitted requests.",
        d(e.prompt_tokens));
  m.add("attnres_prefill_tokens_total", "counter",
        "Prompt tokens computed (not restored from the prefix store).", d(e.prefilled_tokens));
  m.add("attnres_generation_tokens_total", "counter", "Tokens generated.", d(e.generated_tokens));
  m.add("attnres_prefix_cache_lookups_total", "counter", "Prefix-store lookups.",
        d(e.prefix_lookups));
  m.add("attnres_prefix_cache_hits_total", "counter", "Prefix-store lookups that restored a state.",
        d(e.prefix_hits));
  m.add("attnres_prefix_cache_tokens_matched_total", "counter",
        "Prompt tokens matching a stored prefix.", d(e.prefix_tokens_matched));
  m.add("attnres_prefix_cache_tokens_restored_total", "counter",
        "Prompt tokens restored from a snapshot (not recomputed).", d(e.prefix_tokens_restored));
  m.add("attnres_prefix_cache_tokens_recomputed_total", "counter",
        "Matched tokens recomputed because no snapshot was at their end.",
        d(e.prefix_tokens_recomputed));
  m.add("attnres_prefix_cache_bytes", "gauge", "Bytes held by the prefix store.",
        d(e.prefix_bytes));
  m.add("attnres_prefix_cache_entries", "gauge", "Snapshots in the prefix store.",
        d(e.prefix_entries));
  m.add("attnres_engine_steps_total", "counter", "Forward steps run.", d(e.steps));
  m.add("attnres_engine_step_seconds_total", "counter",
        "Seconds in engine steps (forward passes and sampling).", e.step_seconds);
  m.add("attnres_engine_forward_seconds_total", "counter", "Seconds in forward passes.",
        e.forward_seconds);
  m.add("attnres_engine_last_step_seconds", "gauge", "Duration of the latest step.",
        ls.last_step_seconds);
  m.add("attnres_kv_reserved_bytes", "gauge", "KV budget reserved by admitted requests.",
        d(e.kv_reserved_bytes));
  m.add("attnres_kv_budget_bytes", "gauge", "KV budget (--kv-budget).", d(e.kv_budget_bytes));
  m.add("attnres_kv_pages_in_use", "gauge", "Latent-cache pages in use.", d(e.kv_pages_in_use));
  {
    std::lock_guard<std::mutex> lk(s.counters_mu);
    for (const auto& [k, v] : s.http_requests)
      m.add("attnres_http_requests_total", "counter",
            "HTTP requests answered, by route and status.", d(v),
            "route=\"" + k.first + "\",code=\"" + std::to_string(k.second) + "\"");
  }
  log.status = 200;
  res.send(200, "text/plain; version=0.0.4; charset=utf-8", m.text());
}

struct Route {
  const char* path;
  const char* method;
  bool prefix = false;  // path is a prefix (/v1/models/ID)
};

constexpr Route kRoutes[] = {
    {"/v1/chat/completions", "POST"},
    {"/v1/completions", "POST"},
    {"/v1/models", "GET"},
    {"/v1/models/", "GET", true},
    {"/health", "GET"},
    {"/metrics", "GET"},
    {"/tokenize", "POST"},
    {"/detokenize", "POST"},
    {"/apply-template", "POST"},
};

void dispatch(ServerState& s, const HttpRequest& req, HttpResponder& res, RequestLog& log,
              std::string& route) {
  const Route* r = nullptr;
  for (const Route& c : kRoutes)
    if (c.prefix ? req.path.rfind(c.path, 0) == 0 && req.path.size() > std::strlen(c.path)
                 : req.path == c.path) {
      r = &c;
      break;
    }
  if (r == nullptr) {
    route = "other";
    return send_error(res, api_error(404, "no route " + req.method + " " + req.path), log);
  }
  route = r->prefix ? "/v1/models/ID" : r->path;
  if (req.method != r->method) {
    log.status = 405;
    json e = error_json(api_error(405, req.path + " takes " + r->method + ", not " + req.method));
    return send_json(res, 405, e, {{"Allow", r->method}});
  }
  if (route == "/health") {
    log.status = s.ready.load() ? 200 : 503;
    if (s.ready.load()) return send_json(res, 200, {{"status", "ok"}});
    return send_json(res, 503, {{"status", "loading"}}, {{"Retry-After", "1"}});
  }
  if (!s.opt.api_key.empty() && !bearer_matches(req.header("authorization"), s.opt.api_key))
    return send_error(res,
                      api_error(401,
                                "invalid or missing API key: send the header Authorization: "
                                "Bearer KEY",
                                "", "invalid_api_key"),
                      log);
  if (!s.ready.load())
    return send_error(res, api_error(503, "the model is loading; retry later", "", "loading"), log);
  if (s.stopping.load())
    return send_error(res, api_error(503, "the server is shutting down", "", "shutdown"), log);
  if (route == "/v1/chat/completions") return handle_chat_completion(s, req, res, log);
  if (route == "/v1/completions") return handle_completion(s, req, res, log);
  if (route == "/v1/models" || route == "/v1/models/ID") return handle_models(s, req, res, log);
  if (route == "/metrics") return handle_metrics(s, log, res);
  if (route == "/tokenize") return handle_tokenize(s, req, res, log);
  if (route == "/detokenize") return handle_detokenize(s, req, res, log);
  handle_apply_template(s, req, res, log);
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

}  // namespace

struct Server::Impl {
  ServerState state;
  std::unique_ptr<HttpServer> http;

  void log(const std::string& line) {
    if (state.opt.log) {
      state.opt.log(line);
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  }

  void handle(const HttpRequest& req, HttpResponder& res) {
    const auto t0 = Clock::now();
    RequestLog log;
    std::string route;
    try {
      dispatch(state, req, res, log, route);
    } catch (const std::exception& ex) {  // a bug: answer 500 rather than lose the process
      if (!res.started())
        send_error(res, api_error(500, std::string("internal: ") + ex.what()), log);
    }
    {
      std::lock_guard<std::mutex> lk(state.counters_mu);
      ++state.http_requests[{route, log.status}];
    }
    if (!state.opt.log_requests || route == "/health" || route == "/metrics") return;
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    char b[512];
    std::snprintf(b, sizeof b, "%s %s %s %s %d%s", utc_now().c_str(),
                  log.id.empty() ? "-" : log.id.c_str(), req.method.c_str(), req.path.c_str(),
                  log.status, log.stream ? " stream" : "");
    std::string line = b;
    auto field = [&](const char* name, int64_t v) {
      if (v >= 0) line += std::string(" ") + name + "=" + std::to_string(v);
    };
    field("prompt", log.prompt_tokens);
    field("cached", log.cached_tokens);
    field("completion", log.completion_tokens);
    if (log.ttft_seconds >= 0) {
      std::snprintf(b, sizeof b, " ttft=%.3fs", log.ttft_seconds);
      line += b;
    }
    std::snprintf(b, sizeof b, " time=%.3fs peer=%s", secs, req.peer.c_str());
    line += b;
    if (!log.note.empty() && log.status != 200) line += " (" + log.note + ")";
    this->log(line);
  }
};

Result<std::unique_ptr<Server>> Server::listen(const ServerOptions& o) {
  std::unique_ptr<Server> s(new Server());
  s->impl_ = std::make_unique<Impl>();
  Impl& m = *s->impl_;
  m.state.opt = o;
  m.state.created = static_cast<int64_t>(std::time(nullptr));
  std::random_device rd;
  char salt[16];
  std::snprintf(salt, sizeof salt, "%06x", rd() & 0xffffff);
  m.state.id_salt = salt;
  m.state.model_id = o.alias;
  if (m.state.model_id.empty()) {
    std::filesystem::path p(o.model.dir);
    while (!p.empty() && p.filename().empty()) p = p.parent_path();
    m.state.model_id = p.filename().string();
  }
  HttpOptions h;
  h.host = o.host;
  h.port = o.port;
  h.max_body_bytes = o.max_body_bytes;
  h.read_timeout_ms = o.read_timeout_ms;
  h.max_connections = o.max_connections > 0
                          ? o.max_connections
                          : static_cast<int>(o.engine.max_sequences + o.queue + 64);
  ATTNRES_ASSIGN_OR_RETURN(
      m.http,
      HttpServer::listen(h, [impl = s->impl_.get()](const HttpRequest& r, HttpResponder& res) {
        impl->handle(r, res);
      }));
  m.http->start();
  return s;
}

Server::~Server() {
  if (impl_) stop();
}

int Server::port() const {
  return impl_->http->port();
}

bool Server::ready() const {
  return impl_->state.ready.load();
}

Status Server::load() {
  ServerState& st = impl_->state;
  if (st.opt.test_load_delay_ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(st.opt.test_load_delay_ms));
  ATTNRES_ASSIGN_OR_RETURN(st.model, Model::load(st.opt.model));
  const ModelInfo& info = st.model->info();
  if (const std::string w = huge_pages_warning(info.bytes_in_memory, info.bytes_in_memory_huge);
      !w.empty())
    impl_->log(w);
  if (!st.model->info().has_tokenizer)
    return Status(ErrorCode::kInvalidArgument,
                  st.opt.model.dir + ": serving needs the model's tokenizer (tiktoken.model)");
  EngineOptions eo = st.opt.engine;
  eo.max_queue = st.opt.queue + eo.max_sequences;
  ATTNRES_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(st.model, eo));
  st.limits.vocab_size = st.model->info().vocab_size;
  st.limits.context_length = engine->context_length();
  st.limits.allow_forced_output = eo.allow_forced_tokens;
  st.loop = std::make_unique<EngineLoop>(std::move(engine), eo.max_sequences + st.opt.queue,
                                         st.opt.test_step_delay_ms);
  st.ready.store(true);
  return Status::ok();
}

void Server::stop() {
  ServerState& st = impl_->state;
  if (st.stopping.exchange(true)) return;
  impl_->http->begin_stop();         // no new connections or requests
  if (st.loop) st.loop->shutdown();  // every request ends; handlers send their last event
  impl_->http->stop();
  st.loop.reset();
}

}  // namespace attnres::server
