// What the route handlers of `attnres serve` share (internal to src/server).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "server/api.h"
#include "server/engine_loop.h"
#include "server/http.h"
#include "server/server.h"

namespace attnres::server {

// What the request log line reports; filled by the handler.
struct RequestLog {
  std::string id;
  int status = 0;
  int64_t prompt_tokens = -1, cached_tokens = -1, completion_tokens = -1;
  double ttft_seconds = -1;
  bool stream = false;
  std::string note;  // "client closed", "shutdown", ...
};

struct ServerState {
  ServerOptions opt;
  std::shared_ptr<const Model> model;  // set before `ready`
  std::unique_ptr<EngineLoop> loop;    // set before `ready`
  std::atomic<bool> ready{false};
  std::atomic<bool> stopping{false};
  std::string model_id;
  ApiLimits limits;
  int64_t created = 0;  // unix seconds of the start
  std::string id_salt;
  std::atomic<uint64_t> next_id{1};
  std::atomic<int64_t> streams_active{0};
  std::atomic<int64_t> client_aborts{0};

  std::mutex counters_mu;
  std::map<std::pair<std::string, int>, int64_t> http_requests;  // (route, status) -> count

  std::string new_id(const char* prefix) {
    char b[64];
    std::snprintf(b, sizeof b, "%s%s%08llx", prefix, id_salt.c_str(),
                  static_cast<unsigned long long>(next_id.fetch_add(1)));
    return b;
  }
};

// JSON bodies and errors.
void send_json(HttpResponder& res, int status, const nlohmann::ordered_json& body,
               const HttpHeaders& extra = {});
void send_error(HttpResponder& res, const ApiError& e, RequestLog& log);
// Serialises JSON for the wire (invalid UTF-8 in model text is replaced, never thrown on).
std::string wire(const nlohmann::ordered_json& v);

// POST /v1/chat/completions and /v1/completions (generate.cpp).
void handle_chat_completion(ServerState& s, const HttpRequest& req, HttpResponder& res,
                            RequestLog& log);
void handle_completion(ServerState& s, const HttpRequest& req, HttpResponder& res, RequestLog& log);

}  // namespace attnres::server
