// Test helpers for `attnres serve`: an in-process server on a free loopback port over the
// trained models/kjv, and a raw HTTP/1.1 client (so framing errors can be sent as they are).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/server.h"

namespace attnres::server::test {

using json = nlohmann::ordered_json;

inline std::string kjv_dir() {
  return std::string(ATTNRES_SOURCE_DIR) + "/models/kjv";
}

inline ServerOptions kjv_options() {
  ServerOptions o;
  o.model.dir = kjv_dir();
  o.port = 0;
  o.engine.max_sequences = 4;
  o.engine.prefix_cache_bytes = 64 << 20;
  o.queue = 8;
  o.log_requests = std::getenv("ATTNRES_TEST_SERVER_LOG") != nullptr;  // for debugging
  return o;
}

// A served model for the duration of a test (or a suite).
struct TestServer {
  std::unique_ptr<Server> server;
  explicit TestServer(const ServerOptions& o, bool load = true) {
    auto s = Server::listen(o);
    if (!s.is_ok()) {
      ADD_FAILURE() << s.status().to_string();
      return;
    }
    server = std::move(s).value();
    if (load) {
      Status st = server->load();
      if (!st.is_ok()) ADD_FAILURE() << st.to_string();
    }
  }
  ~TestServer() {
    if (server) server->stop();
  }
  int port() const { return server->port(); }
};

struct Reply {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
  bool complete = false;
  std::string header(const std::string& k) const {
    auto it = headers.find(k);
    return it == headers.end() ? "" : it->second;
  }
  json body_json() const { return json::parse(body, nullptr, false); }
};

// One connection.
class Client {
 public:
  explicit Client(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~Client() { close_now(); }
  bool ok() const { return fd_ >= 0; }
  void close_now() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  bool send_raw(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads more bytes into the buffer; false at end or after timeout_ms.
  bool read_more(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[65536];
    const ssize_t n = recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return false;
    raw_.append(buf, static_cast<size_t>(n));
    return true;
  }
  // Parses the head once it has arrived; then the body as far as it has arrived.
  Reply parse() const {
    Reply r;
    const size_t end = raw_.find("\r\n\r\n");
    if (end == std::string::npos) return r;
    const std::string head = raw_.substr(0, end);
    size_t pos = head.find("\r\n");
    r.status = std::atoi(head.substr(9, 3).c_str());
    while (pos != std::string::npos && pos < head.size()) {
      const size_t next = head.find("\r\n", pos + 2);
      const std::string line =
          head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string k = line.substr(0, colon);
        for (char& c : k) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        std::string v = line.substr(colon + 1);
        while (!v.empty() && v.front() == ' ') v.erase(0, 1);
        r.headers[k] = v;
      }
      pos = next;
    }
    const std::string rest = raw_.substr(end + 4);
    if (r.header("transfer-encoding") == "chunked") {
      size_t p = 0;
      while (p < rest.size()) {
        const size_t eol = rest.find("\r\n", p);
        if (eol == std::string::npos) break;
        const size_t n = std::stoul(rest.substr(p, eol - p), nullptr, 16);
        if (n == 0) {
          r.complete = true;
          break;
        }
        if (eol + 2 + n + 2 > rest.size()) break;
        r.body += rest.substr(eol + 2, n);
        p = eol + 2 + n + 2;
      }
    } else {
      const size_t len = static_cast<size_t>(std::atoll(r.header("content-length").c_str()));
      r.body = rest.substr(0, std::min(len, rest.size()));
      r.complete = rest.size() >= len;
    }
    return r;
  }
  // Reads until the response is complete, the peer closes, or timeout_ms passes.
  Reply read_reply(int timeout_ms = 60000) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      Reply r = parse();
      if (r.complete) {
        consume(r);
        return r;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0 || !read_more(static_cast<int>(left))) return parse();
    }
  }
  const std::string& raw() const { return raw_; }

 private:
  void consume(const Reply&) { raw_.clear(); }
  int fd_ = -1;
  std::string raw_;
};

inline std::string request(const std::string& method, const std::string& path,
                           const std::string& body = "",
                           const std::string& content_type = "application/json",
                           const std::string& extra_headers = "") {
  std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  if (!content_type.empty()) r += "Content-Type: " + content_type + "\r\n";
  if (!body.empty() || method == "POST")
    r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  r += extra_headers;
  r += "\r\n" + body;
  return r;
}

inline Reply call(int port, const std::string& raw, int timeout_ms = 120000) {
  Client c(port);
  EXPECT_TRUE(c.ok());
  EXPECT_TRUE(c.send_raw(raw));
  return c.read_reply(timeout_ms);
}

inline Reply post(int port, const std::string& path, const json& body,
                  const std::string& extra_headers = "") {
  return call(port, request("POST", path, body.dump(), "application/json", extra_headers));
}

inline Reply get(int port, const std::string& path, const std::string& extra_headers = "") {
  return call(port, request("GET", path, "", "", extra_headers));
}

// SSE events of a body: data payloads in order ("[DONE]" included) and comment lines.
struct Sse {
  std::vector<std::string> data;
  int comments = 0;
  int comments_before_data = 0;
  bool framing_ok = true;  // every event ends with a blank line
};

inline Sse parse_sse(const std::string& body) {
  Sse s;
  size_t p = 0;
  while (p < body.size()) {
    const size_t end = body.find("\n\n", p);
    if (end == std::string::npos) {
      s.framing_ok = false;
      break;
    }
    const std::string ev = body.substr(p, end - p);
    if (ev.rfind("data: ", 0) == 0) {
      s.data.push_back(ev.substr(6));
    } else if (ev.rfind(":", 0) == 0) {
      ++s.comments;
      if (s.data.empty()) ++s.comments_before_data;
    } else {
      s.framing_ok = false;
    }
    p = end + 2;
  }
  return s;
}

inline json chat_body(const std::string& user, bool thinking, int max_tokens) {
  json b = {{"model", "kjv"},
            {"messages", json::array({{{"role", "user"}, {"content", user}}})},
            {"max_tokens", max_tokens},
            {"temperature", 0}};
  b["chat_template_kwargs"] = {{"thinking", thinking}};
  return b;
}

}  // namespace attnres::server::test
