// attnres serve: the OpenAI-compatible HTTP server (src/server/server.h, docs/serving.md).
//   serve --model DIR [--host 127.0.0.1] [--port 8080] [--parallel N] [--ctx-size C]
//         [--kv-budget BYTES] [--queue Q] [--api-key KEY] [--threads T] [--prefix-cache-mb M]
//         [--prefill-chunk N] [--alias NAME] [--max-body-mb M] [--ping-interval-ms MS]
// It listens first (printing "listening on http://HOST:PORT"; --port 0 takes a free port),
// answers /health with 503 while the model loads, and stops cleanly on SIGINT or SIGTERM:
// running streams get a final error event, then every thread is joined.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "command.h"
#include "frontend.h"
#include "server/server.h"

namespace attnres::cli {
namespace {

struct ServeArgs {
  ModelArgs model;
  std::string host = "127.0.0.1";
  int port = 8080;
  int parallel = 4;
  int64_t queue = 64;
  std::string api_key;
  int64_t prefix_cache_mb = 1024;
  int64_t prefill_chunk = 512;
  std::string alias;
  int64_t max_body_mb = 8;
  int ping_interval_ms = 15000;
  int timeout_s = 30;
  int max_connections = 0;
  bool quiet = false;
  bool test_forced_output = false;
  int test_load_delay_ms = 0;
  int test_step_delay_ms = 0;
};

int g_signal_pipe[2] = {-1, -1};

void on_stop_signal(int sig) {
  const int saved = errno;
  if (write(g_signal_pipe[1], &sig, sizeof sig) < 0) {
  }
  errno = saved;
}

int run_serve(const ServeArgs& a) {
  auto bad = [](const std::string& m) { return fail(m); };
  if (a.parallel < 1 || a.parallel > 1024) return bad("--parallel must be in 1..1024");
  if (a.queue < 0 || a.queue > 100000) return bad("--queue must be in 0..100000");
  if (a.prefix_cache_mb < 0) return bad("--prefix-cache-mb must not be negative");
  if (a.max_body_mb < 1 || a.max_body_mb > 4096) return bad("--max-body-mb must be in 1..4096");
  if (a.ping_interval_ms < 1) return bad("--ping-interval-ms must be positive");
  if (a.timeout_s < 1) return bad("--timeout must be positive");
  auto eo = engine_options(a.model);
  if (!eo) return bad(eo.status().to_string());
  if (Status st = apply_threads(a.model.threads); !st.is_ok()) return bad(st.message());

  server::ServerOptions o;
  o.model.dir = a.model.model;
  o.model.tokenizer = a.model.tokenizer;
  o.model.require_tokenizer = true;
  o.model.mmap = a.model.mmap;
  o.engine = *eo;
  o.engine.max_sequences = a.parallel;
  o.engine.prefix_cache_bytes = a.prefix_cache_mb << 20;
  o.engine.prefill_chunk = a.prefill_chunk;
  o.engine.allow_forced_tokens = a.test_forced_output;
  o.host = a.host;
  o.port = a.port;
  o.queue = a.queue;
  o.api_key = a.api_key;
  if (o.api_key.empty()) {
    if (const char* k = std::getenv("ATTNRES_API_KEY")) o.api_key = k;
  }
  o.alias = a.alias;
  o.max_body_bytes = a.max_body_mb << 20;
  o.ping_interval_ms = a.ping_interval_ms;
  o.read_timeout_ms = a.timeout_s * 1000;
  o.max_connections = a.max_connections;
  o.test_load_delay_ms = a.test_load_delay_ms;
  o.test_step_delay_ms = a.test_step_delay_ms;
  o.log_requests = !a.quiet;

  // SIGINT and SIGTERM write their number to a pipe that one thread waits on: whichever thread
  // the kernel picks (a worker, an MPI library thread) runs only the async-signal-safe write.
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) return bad("cannot create the signal pipe");
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto srv = server::Server::listen(o);
  if (!srv) return bad(srv.status().to_string());
  std::fprintf(stderr, "attnres serve: listening on http://%s:%d (loading %s)\n", a.host.c_str(),
               (*srv)->port(), a.model.model.c_str());
  std::fflush(stderr);
  std::atomic<int> got_signal{0};
  std::thread waiter([&] {
    int sig = 0;
    while (read(g_signal_pipe[0], &sig, sizeof sig) < 0 && errno == EINTR) {
    }
    got_signal = sig;
  });
  Status st = (*srv)->load();
  if (!st.is_ok()) {
    (*srv)->stop();
    const int none = -1;  // wakes the waiter: no signal came
    if (write(g_signal_pipe[1], &none, sizeof none) < 0) std::perror("attnres serve: signal pipe");
    waiter.join();
    return bad(st.to_string());
  }
  if (got_signal.load() == 0) {
    std::fprintf(stderr, "attnres serve: ready: model %s, %d parallel, queue %lld%s%s\n",
                 a.model.model.c_str(), a.parallel, static_cast<long long>(a.queue),
                 o.api_key.empty() ? "" : ", API key required",
                 a.test_forced_output ? ", TEST: forced output allowed" : "");
    std::fflush(stderr);
  }
  waiter.join();
  std::fprintf(stderr, "attnres serve: %s: stopping\n",
               got_signal == SIGINT ? "SIGINT" : "SIGTERM");
  (*srv)->stop();
  std::fprintf(stderr, "attnres serve: stopped\n");
  return 0;
}

const CommandRegistration kServe(
    "serve", "OpenAI-compatible HTTP server (chat, completions, streaming)", [](CLI::App* sub) {
      auto a = std::make_shared<ServeArgs>();
      add_model_options(sub, a->model);
      sub->add_option("--host", a->host, "Address to listen on (default 127.0.0.1)");
      sub->add_option("--port", a->port, "Port (default 8080; 0: a free port)");
      sub->add_option("--parallel", a->parallel, "Sequences generated at once (default 4)");
      sub->add_option("--queue", a->queue,
                      "Requests waiting beyond the running ones before 503 (default 64)");
      sub->add_option("--api-key", a->api_key,
                      "Require Authorization: Bearer KEY (default: $ATTNRES_API_KEY, or none)");
      sub->add_option("--prefix-cache-mb", a->prefix_cache_mb,
                      "Memory for prompt-prefix snapshots reused across requests (default 1024; "
                      "0: off)");
      sub->add_option("--prefill-chunk", a->prefill_chunk,
                      "Prompt positions per prefill chunk (default 512)");
      sub->add_option("--alias", a->alias, "Model id in the API (default: the directory's name)");
      sub->add_option("--max-body-mb", a->max_body_mb, "Largest request body (default 8 MiB)");
      sub->add_option("--ping-interval-ms", a->ping_interval_ms,
                      "SSE comment ping while a stream is silent this long (default 15000)");
      sub->add_option("--timeout", a->timeout_s, "Seconds to receive a request (default 30)");
      sub->add_option("--max-connections", a->max_connections,
                      "Open connections (default --parallel + --queue + 64)");
      sub->add_flag("--quiet", a->quiet, "No request log lines");
      sub->add_flag("--test-forced-output", a->test_forced_output,
                    "TEST ONLY: accept attnres_forced_output, output tokens dictated by the "
                    "request");
      sub->add_option("--test-load-delay-ms", a->test_load_delay_ms,
                      "TEST ONLY: wait this long before loading the model");
      sub->add_option("--test-step-delay-ms", a->test_step_delay_ms,
                      "TEST ONLY: sleep this long after every engine step");
      return CommandRun([a] { return run_serve(*a); });
    });

}  // namespace
}  // namespace attnres::cli
