// The HTTP layer's connection limits: a request that does not arrive within the read timeout
// gets 408 (however much of it came) and its connection closes; connections beyond the bound get
// 503 at once (and do not hold a thread for the keep-alive timeout); `serve`'s options reach the
// layer.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "server/http.h"
#include "server_util.h"

namespace attnres::server::test {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// An HTTP server whose handler answers every request with 200 "ok".
std::unique_ptr<HttpServer> ok_server(const HttpOptions& o) {
  auto s = HttpServer::listen(
      o, [](const HttpRequest&, HttpResponder& res) { res.send(200, "text/plain", "ok"); });
  if (!s.is_ok()) {
    ADD_FAILURE() << s.status().to_string();
    return nullptr;
  }
  auto server = std::move(s).value();
  server->start();
  return server;
}

HttpOptions loopback(int read_timeout_ms, int max_connections) {
  HttpOptions o;
  o.port = 0;
  o.read_timeout_ms = read_timeout_ms;
  o.max_connections = max_connections;
  return o;
}

// Waits (up to 5 s) until the server counts `n` open connections.
bool wait_for_connections(const HttpServer& s, int n) {
  const auto t0 = Clock::now();
  while (s.connections() != n) {
    if (seconds_since(t0) > 5) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

TEST(HttpConnections, AStalledHeadOrBodyIs408AfterTheReadTimeout) {
  auto server = ok_server(loopback(/*read_timeout_ms=*/400, /*max_connections=*/8));
  ASSERT_NE(server, nullptr);
  struct Case {
    const char* what;
    std::string sent;
  };
  for (const Case& c :
       {Case{"part of the request line", "GET /he"},
        Case{"the request line", "GET /health HTTP/1.1\r\n"},
        Case{"part of the head", "GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n"},
        Case{"body", "POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\nabc"}}) {
    Client client(server->port());
    ASSERT_TRUE(client.ok());
    const auto t0 = Clock::now();
    ASSERT_TRUE(client.send_raw(c.sent));
    const Reply r = client.read_reply(10000);
    const double s = seconds_since(t0);
    EXPECT_EQ(r.status, 408) << c.what << ": " << client.raw();
    EXPECT_NE(r.body.find("not received in time"), std::string::npos) << c.what << ": " << r.body;
    EXPECT_EQ(r.header("connection"), "close") << c.what;
    EXPECT_GE(s, 0.3) << c.what;  // the timeout, not an immediate refusal
    EXPECT_LT(s, 5.0) << c.what;
  }
  // A request sent whole in time is served on the same server.
  EXPECT_EQ(call(server->port(), request("GET", "/x", "", "")).status, 200);
  server->stop();
}

TEST(HttpConnections, BeyondMaxConnectionsIs503AndFreedSlotsServeAgain) {
  auto server = ok_server(loopback(/*read_timeout_ms=*/5000, /*max_connections=*/2));
  ASSERT_NE(server, nullptr);
  // Two connections hold the two slots (open, nothing sent yet).
  auto first = std::make_unique<Client>(server->port());
  Client second(server->port());
  ASSERT_TRUE(first->ok() && second.ok());
  ASSERT_TRUE(wait_for_connections(*server, 2));
  // A third is answered 503 with Retry-After, whatever it asks.
  const Reply over = call(server->port(), request("GET", "/health", "", ""), 10000);
  EXPECT_EQ(over.status, 503) << over.body;
  EXPECT_EQ(over.header("retry-after"), "1");
  EXPECT_NE(over.body.find("too many connections"), std::string::npos) << over.body;
  // The connections holding the slots are served as usual.
  ASSERT_TRUE(second.send_raw(request("GET", "/x", "", "")));
  EXPECT_EQ(second.read_reply(10000).status, 200);
  // Closing one frees its slot for a new connection.
  first.reset();
  ASSERT_TRUE(wait_for_connections(*server, 1)) << server->connections();
  EXPECT_EQ(call(server->port(), request("GET", "/x", "", ""), 10000).status, 200);
  server->stop();
}

TEST(HttpConnections, AnIdleConnectionBeyondTheBoundIsClosedWithinSeconds) {
  HttpOptions o = loopback(/*read_timeout_ms=*/5000, /*max_connections=*/1);
  o.keep_alive_timeout_ms = 60000;  // an admitted idle connection may wait this long
  auto server = ok_server(o);
  ASSERT_NE(server, nullptr);
  Client admitted(server->port());
  ASSERT_TRUE(admitted.ok());
  ASSERT_TRUE(wait_for_connections(*server, 1));
  // One beyond the bound that sends nothing: closed after about a second, not the keep-alive
  // timeout (each such connection holds a thread).
  Client idle(server->port());
  ASSERT_TRUE(idle.ok());
  const auto t0 = Clock::now();
  EXPECT_FALSE(idle.read_more(10000));  // end of stream: the server closed it
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_TRUE(idle.raw().empty()) << idle.raw();
  EXPECT_TRUE(wait_for_connections(*server, 1));
  server->stop();
}

// `serve --timeout` and `--max-connections` (ServerOptions) reach the HTTP layer.
TEST(ServeConnections, ReadTimeoutAndMaxConnectionsOptionsApply) {
  ServerOptions o = kjv_options();
  o.read_timeout_ms = 400;
  o.max_connections = 1;
  TestServer ts(o, /*load=*/false);
  ASSERT_NE(ts.server, nullptr);
  {
    Client stalled(ts.port());
    ASSERT_TRUE(stalled.ok());
    ASSERT_TRUE(stalled.send_raw("GET /health HTTP/1.1\r\n"));
    // While it holds the only slot, another connection is refused.
    const Reply over = call(ts.port(), request("GET", "/health", "", ""), 10000);
    EXPECT_EQ(over.status, 503) << over.body;
    const Reply r = stalled.read_reply(10000);
    EXPECT_EQ(r.status, 408) << stalled.raw();
  }
}

}  // namespace
}  // namespace attnres::server::test
