// The HTTP/1.1 layer of `attnres serve`: a listening socket, one thread per connection, request
// framing by Boost.Beast's parser (Debian's libboost-dev; header-only), responses written here.
//
// Why this shape: a connection thread blocks only in poll() with a deadline, so every read and
// write has a timeout, a streaming response notices a closed peer the moment the kernel does
// (POLLRDHUP on the socket, waited on together with the request's wake-up fd), and /health
// never queues behind long streams (each connection has its own thread; the number of
// connections is bounded, and one beyond the bound gets 503 at once). Beast's parser enforces
// the header and body limits (431, 413 before the body is read) and handles chunked request
// bodies and `Expect: 100-continue`.
//
// Thread-safety: HttpServer's methods may be called from any thread. An HttpResponder belongs
// to the connection thread that runs the handler and must not be used from another.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attnres/status.h"

namespace attnres::server {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;   // "GET", "POST", ...
  std::string target;   // as sent: path and query
  std::string path;     // target without the query
  HttpHeaders headers;  // names lower-cased
  std::string body;
  std::string peer;  // "ADDR:PORT"
  // First header of that (lower-case) name, or "".
  std::string_view header(std::string_view name) const;
};

std::string_view http_status_text(int status);

// One response on one connection: either send() once, or start_stream() then write_chunk()s and
// end_stream() (chunked transfer encoding). The write functions return false when the peer is
// gone or a write timed out; the connection is then closed after the handler returns.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  virtual bool send(int status, std::string_view content_type, std::string_view body,
                    const HttpHeaders& extra = {}) = 0;
  virtual bool start_stream(int status, std::string_view content_type,
                            const HttpHeaders& extra = {}) = 0;
  virtual bool write_chunk(std::string_view data) = 0;
  virtual bool end_stream() = 0;
  virtual bool started() const = 0;  // a status line went out

  enum class Wait { kWoken, kPeerClosed, kTimeout };
  // Blocks until `wake_fd` is readable, the peer closed its side, or `timeout_ms` passed
  // (wake_fd -1: only the peer and the timeout).
  virtual Wait wait(int wake_fd, int timeout_ms) = 0;
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponder&)>;

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (see HttpServer::port)
  int max_connections = 256;
  int64_t max_body_bytes = 8 << 20;
  int64_t max_header_bytes = 64 << 10;
  int read_timeout_ms = 30000;         // a request's head and body, from its first byte
  int write_timeout_ms = 30000;        // one blocked write
  int keep_alive_timeout_ms = 120000;  // idle between requests
};

class HttpServer {
 public:
  // Binds and listens (errors name the address); serving starts with start().
  static Result<std::unique_ptr<HttpServer>> listen(const HttpOptions& options,
                                                    HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;  // the bound port
  void start();      // the accept thread
  // Stops accepting and closes idle connections; running handlers go on, and their connections
  // close when they return.
  void begin_stop();
  // begin_stop(), then lets running handlers finish (up to `grace_ms`, then their sockets are
  // shut down), and joins every thread.
  void stop(int grace_ms = 5000);
  int connections() const;  // open now

 private:
  HttpServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnres::server
