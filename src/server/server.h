// `attnres serve`: the OpenAI-compatible server over the batched engine.
//
// Threads: the HTTP layer (http.h) runs one thread per connection; those threads parse and
// check requests (api.h), render chat prompts and tokenize, and turn engine events into JSON
// and SSE. One EngineLoop thread (engine_loop.h) owns the Engine. The model loads on the thread
// that calls start() after the socket listens, so /health answers 503 while it loads.
//
// Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models[/ID], GET /health,
// GET /metrics, POST /tokenize, POST /detokenize, POST /apply-template (docs/serving.md).
//
// Thread-safety: start() and stop() from one controlling thread; everything else is internal.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "attnres/engine.h"

namespace attnres::server {

struct ServerOptions {
  ModelLoadOptions model;
  EngineOptions engine;  // max_sequences = --parallel, context_length, kv_budget, ...
  std::string host = "127.0.0.1";
  int port = 8080;
  int64_t queue = 64;   // waiting requests beyond the running ones before 503
  std::string api_key;  // empty: no authentication
  std::string alias;    // the model id in /v1/models (default: the model directory's name)
  int64_t max_body_bytes = 8 << 20;
  int ping_interval_ms = 15000;  // SSE comment while a stream is silent this long
  int read_timeout_ms = 30000;
  int max_connections = 0;     // 0: parallel + queue + 64
  int test_load_delay_ms = 0;  // test-only: wait this long before loading (/health 503)
  int test_step_delay_ms = 0;  // test-only: sleep after each engine step (slow, steady steps)
  bool log_requests = true;
  // Where log lines go (default stderr); called from several threads, one line at a time.
  std::function<void(const std::string&)> log;
};

class Server {
 public:
  // Binds the socket (the port is known from here on) and starts answering (503 until ready).
  static Result<std::unique_ptr<Server>> listen(const ServerOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;
  // Loads the model and starts the engine loop; /health turns 200. A load failure is returned
  // (the server keeps answering 503).
  Status load();
  // Ends every request (streams get a final error event), stops accepting and joins every
  // thread.
  void stop();
  bool ready() const;

 private:
  Server() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnres::server
