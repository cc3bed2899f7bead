// HTTP/1.1 over POSIX sockets with Beast's request parser (http.h says why this shape).
#include "server/http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>

namespace attnres::server {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;

std::string_view HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return v;
  return {};
}

std::string_view http_status_text(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

namespace {

using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

// A non-blocking socket read through poll() with a deadline: the SyncReadStream Beast's
// http::read needs. A passed deadline is beast::error::timeout.
class SocketStream {
 public:
  using executor_type = net::any_io_executor;
  explicit SocketStream(int fd) : fd_(fd) {}
  void expires_at(Clock::time_point t) { deadline_ = t; }

  template <class MutableBufferSequence>
  size_t read_some(const MutableBufferSequence& buffers, boost::system::error_code& ec) {
    ec = {};
    for (auto it = net::buffer_sequence_begin(buffers); it != net::buffer_sequence_end(buffers);
         ++it) {
      const net::mutable_buffer b = *it;
      if (b.size() == 0) continue;
      while (true) {
        const ssize_t n = recv(fd_, b.data(), b.size(), MSG_DONTWAIT);
        if (n > 0) return static_cast<size_t>(n);
        if (n == 0) {
          ec = net::error::eof;
          return 0;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          ec = boost::system::error_code(errno, boost::system::system_category());
          return 0;
        }
        pollfd p{fd_, POLLIN, 0};
        const int r = poll(&p, 1, ms_left(deadline_));
        if (r == 0) {
          ec = beast::error::timeout;
          return 0;
        }
        if (r < 0 && errno != EINTR) {
          ec = boost::system::error_code(errno, boost::system::system_category());
          return 0;
        }
      }
    }
    return 0;
  }
  template <class MutableBufferSequence>
  size_t read_some(const MutableBufferSequence& buffers) {
    boost::system::error_code ec;
    const size_t n = read_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }

 private:
  int fd_;
  Clock::time_point deadline_ = Clock::now();
};

// Writes all of `data` with a deadline per blocked wait; false when the peer is gone or slow.
bool write_all(int fd, std::string_view data, int timeout_ms) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    pollfd p{fd, POLLOUT, 0};
    const int r = poll(&p, 1, timeout_ms);
    if (r == 0) return false;
    if (r < 0 && errno != EINTR) return false;
    if (r > 0 && (p.revents & (POLLERR | POLLHUP))) return false;
  }
  return true;
}

std::string head(int status, const HttpHeaders& headers) {
  std::string h =
      "HTTP/1.1 " + std::to_string(status) + " " + std::string(http_status_text(status)) + "\r\n";
  for (const auto& [k, v] : headers) h += k + ": " + v + "\r\n";
  h += "\r\n";
  return h;
}

// Closes the sending side, then reads what the client still sends (up to a bound), so a
// response sent before the whole request was read is not destroyed by a reset.
void linger_close(int fd) {
  shutdown(fd, SHUT_WR);
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  char buf[16384];
  int64_t drained = 0;
  while (drained < (int64_t{64} << 20)) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, ms_left(deadline)) <= 0) break;
    const ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0 && !(n < 0 && (errno == EINTR || errno == EAGAIN))) break;
    drained += std::max<ssize_t>(n, 0);
  }
}

// How long a connection beyond HttpOptions::max_connections waits for its request (then 503).
constexpr int kRejectTimeoutMs = 1000;

struct Conn {
  std::mutex mu;
  int fd = -1;  // -1 once closed (under mu)
  std::string peer;
  bool busy = false;  // in a request (under mu)
  bool reject = false;
  std::atomic<bool> done{false};
  std::thread thread;
};

class Responder final : public HttpResponder {
 public:
  Responder(int fd, const HttpOptions& o, bool keep_alive)
      : fd_(fd), opt_(o), keep_alive_(keep_alive) {}

  bool send(int status, std::string_view content_type, std::string_view body,
            const HttpHeaders& extra) override {
    if (started_) return false;
    started_ = true;
    HttpHeaders h = {{"Content-Type", std::string(content_type)},
                     {"Content-Length", std::to_string(body.size())}};
    h.insert(h.end(), extra.begin(), extra.end());
    h.emplace_back("Connection", keep_alive_ ? "keep-alive" : "close");
    std::string out = head(status, h);
    out.append(body);
    ok_ = write_all(fd_, out, opt_.write_timeout_ms);
    return ok_;
  }
  bool start_stream(int status, std::string_view content_type, const HttpHeaders& extra) override {
    if (started_) return false;
    started_ = true;
    streaming_ = true;
    HttpHeaders h = {{"Content-Type", std::string(content_type)}, {"Transfer-Encoding", "chunked"}};
    h.insert(h.end(), extra.begin(), extra.end());
    h.emplace_back("Connection", keep_alive_ ? "keep-alive" : "close");
    ok_ = write_all(fd_, head(status, h), opt_.write_timeout_ms);
    return ok_;
  }
  bool write_chunk(std::string_view data) override {
    if (!streaming_ || !ok_) return false;
    if (data.empty()) return true;  // an empty chunk would end the body
    char size[24];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    std::string out = size;
    out.append(data);
    out += "\r\n";
    ok_ = write_all(fd_, out, opt_.write_timeout_ms);
    return ok_;
  }
  bool end_stream() override {
    if (!streaming_ || !ok_) return false;
    streaming_ = false;
    ended_ = true;
    ok_ = write_all(fd_, "0\r\n\r\n", opt_.write_timeout_ms);
    return ok_;
  }
  bool started() const override { return started_; }

  Wait wait(int wake_fd, int timeout_ms) override {
    pollfd p[2] = {{fd_, POLLRDHUP, 0}, {wake_fd, POLLIN, 0}};
    const nfds_t n = wake_fd >= 0 ? 2 : 1;
    while (true) {
      const int r = poll(p, n, timeout_ms);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return Wait::kTimeout;
      if (p[0].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
        peer_closed_ = true;
        return Wait::kPeerClosed;
      }
      return Wait::kWoken;
    }
  }

  // Whether the connection can carry another request.
  bool reusable() const { return ok_ && !peer_closed_ && keep_alive_ && !streaming_; }
  bool ended_stream() const { return ended_; }

 private:
  int fd_;
  const HttpOptions& opt_;
  bool keep_alive_;
  bool started_ = false, streaming_ = false, ended_ = false, ok_ = true, peer_closed_ = false;
};

std::string peer_name(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (a.ss_family == AF_INET) {
    const auto* s = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
    port = ntohs(s->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* s = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
    port = ntohs(s->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

}  // namespace

struct HttpServer::Impl {
  HttpOptions opt;
  HttpHandler handler;
  int listen_fd = -1;
  int port = 0;
  int wake[2] = {-1, -1};  // stops the accept thread
  std::thread acceptor;
  std::atomic<bool> stopping{false};
  mutable std::mutex mu;
  std::condition_variable cv;  // a connection finished
  std::list<std::shared_ptr<Conn>> conns;
  std::atomic<int> open{0};

  bool stopped = false;
  void accept_loop();
  void shut(bool idle_only);  // shuts the sockets of idle (or all) connections down
  void serve(const std::shared_ptr<Conn>& c);
  void reap_done();
  // Sends an error for a request the handler never sees (framing, limits), in the OpenAI error
  // shape the handlers use, and closes.
  void framing_error(int fd, int status, std::string_view message) {
    std::string escaped;
    for (char ch : message) {
      const auto u = static_cast<unsigned char>(ch);
      if (ch == '"' || ch == '\\') {
        escaped += '\\';
        escaped += ch;
      } else if (u < 0x20 || u >= 0x7f) {
        escaped += '?';  // our messages are ASCII; anything else is not worth escaping here
      } else {
        escaped += ch;
      }
    }
    const char* type = status == 503 ? "unavailable_error" : "invalid_request_error";
    const std::string body = "{\"error\":{\"message\":\"" + escaped + "\",\"type\":\"" + type +
                             "\",\"param\":null,\"code\":null}}";
    HttpHeaders h = {{"Content-Type", "application/json"},
                     {"Content-Length", std::to_string(body.size())},
                     {"Connection", "close"}};
    if (status == 503) h.emplace_back("Retry-After", "1");
    (void)write_all(fd, head(status, h) + body, opt.write_timeout_ms);
    linger_close(fd);
  }
};

Result<std::unique_ptr<HttpServer>> HttpServer::listen(const HttpOptions& o, HttpHandler handler) {
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->impl_ = std::make_unique<Impl>();
  Impl& m = *s->impl_;
  m.opt = o;
  m.handler = std::move(handler);
  const std::string where = o.host + ":" + std::to_string(o.port);
  if (o.port < 0 || o.port > 65535)
    return Status(ErrorCode::kInvalidArgument,
                  "--port is " + std::to_string(o.port) + ", expected 0..65535");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(o.port);
  if (int rc = getaddrinfo(o.host.c_str(), port.c_str(), &hints, &res); rc != 0)
    return Status(ErrorCode::kInvalidArgument,
                  "--host " + o.host + ": cannot resolve (" + gai_strerror(rc) + ")");
  std::string last_error = "no address";
  for (addrinfo* a = res; a != nullptr && m.listen_fd < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 512) == 0) {
      m.listen_fd = fd;
    } else {
      last_error = std::strerror(errno);
      close(fd);
    }
  }
  freeaddrinfo(res);
  if (m.listen_fd < 0)
    return Status(ErrorCode::kIoError, "cannot listen on " + where + ": " + last_error);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(m.listen_fd, reinterpret_cast<sockaddr*>(&bound), &len);
  m.port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                       : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (pipe2(m.wake, O_CLOEXEC | O_NONBLOCK) != 0)
    return Status(ErrorCode::kIoError, std::string("pipe: ") + std::strerror(errno));
  return s;
}

HttpServer::~HttpServer() {
  if (!impl_) return;
  stop(0);
  if (impl_->listen_fd >= 0) close(impl_->listen_fd);
  for (int fd : impl_->wake)
    if (fd >= 0) close(fd);
}

int HttpServer::port() const {
  return impl_->port;
}

int HttpServer::connections() const {
  return impl_->open.load();
}

void HttpServer::start() {
  impl_->acceptor = std::thread([m = impl_.get()] { m->accept_loop(); });
}

void HttpServer::Impl::reap_done() {
  std::list<std::shared_ptr<Conn>> done;
  {
    std::lock_guard<std::mutex> lk(mu);
    for (auto it = conns.begin(); it != conns.end();) {
      if ((*it)->done.load()) {
        done.push_back(*it);
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : done)
    if (c->thread.joinable()) c->thread.join();
}

void HttpServer::Impl::accept_loop() {
  while (!stopping.load()) {
    pollfd p[2] = {{listen_fd, POLLIN, 0}, {wake[0], POLLIN, 0}};
    const int r = poll(p, 2, 1000);
    reap_done();
    if (r <= 0 || stopping.load()) continue;
    if (!(p[0].revents & POLLIN)) continue;
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    const int fd =
        accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_shared<Conn>();
    c->fd = fd;
    c->peer = peer_name(addr);
    {
      std::lock_guard<std::mutex> lk(mu);
      const int n = static_cast<int>(conns.size());
      if (n >= opt.max_connections + 64) {  // beyond even the rejecting threads: drop it
        close(fd);
        continue;
      }
      c->reject = n >= opt.max_connections;
      conns.push_back(c);
    }
    ++open;
    c->thread = std::thread([this, c] { serve(c); });
  }
}

void HttpServer::Impl::serve(const std::shared_ptr<Conn>& c) {
  const int fd = c->fd;
  SocketStream stream(fd);
  beast::flat_buffer buf;
  while (!stopping.load()) {
    {
      std::lock_guard<std::mutex> lk(c->mu);
      c->busy = false;
    }
    if (buf.size() == 0) {  // idle: wait for the next request's first byte
      // A connection beyond the bound only waits for the request it is to refuse: about a
      // second, as for that request's head, not the keep-alive timeout.
      pollfd p{fd, POLLIN, 0};
      const int r = poll(&p, 1, c->reject ? kRejectTimeoutMs : opt.keep_alive_timeout_ms);
      if (r <= 0 || stopping.load()) break;
    }
    {
      std::lock_guard<std::mutex> lk(c->mu);
      c->busy = true;
    }
    stream.expires_at(Clock::now() + std::chrono::milliseconds(c->reject ? kRejectTimeoutMs
                                                                         : opt.read_timeout_ms));
    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(static_cast<uint32_t>(opt.max_header_bytes));
    parser.body_limit(static_cast<uint64_t>(opt.max_body_bytes));
    boost::system::error_code ec;
    bhttp::read_header(stream, buf, parser, ec);
    if (ec == bhttp::error::header_limit) {
      framing_error(
          fd, 431,
          "request header fields exceed " + std::to_string(opt.max_header_bytes) + " bytes");
      break;
    }
    if (ec == bhttp::error::body_limit) {
      framing_error(fd, 413,
                    "request body of " + std::to_string(parser.content_length().value_or(0)) +
                        " bytes exceeds the limit of " + std::to_string(opt.max_body_bytes) +
                        " bytes");
      break;
    }
    if (ec == net::error::eof || ec == beast::error::timeout) {
      // The parser consumes a complete request line from buf, so buf alone may be empty.
      if (ec == beast::error::timeout && (buf.size() > 0 || parser.got_some()))
        framing_error(fd, 408, "the request was not received in time");
      break;
    }
    if (ec) {
      framing_error(fd, 400, "malformed HTTP request: " + ec.message());
      break;
    }
    if (c->reject) {
      framing_error(fd, 503, "too many connections; retry later");
      break;
    }
    const auto& h = parser.get();
    if (h[bhttp::field::expect] == "100-continue" && !parser.is_done()) {
      const auto len = parser.content_length();
      if (len && *len > static_cast<uint64_t>(opt.max_body_bytes)) {
        framing_error(fd, 413,
                      "request body of " + std::to_string(*len) + " bytes exceeds the limit of " +
                          std::to_string(opt.max_body_bytes) + " bytes");
        break;
      }
      if (!write_all(fd, "HTTP/1.1 100 Continue\r\n\r\n", opt.write_timeout_ms)) break;
    }
    bhttp::read(stream, buf, parser, ec);
    if (ec == bhttp::error::body_limit) {
      framing_error(
          fd, 413,
          "request body exceeds the limit of " + std::to_string(opt.max_body_bytes) + " bytes");
      break;
    }
    if (ec == beast::error::timeout) {
      framing_error(fd, 408, "the request body was not received in time");
      break;
    }
    if (ec) {
      framing_error(fd, 400, "malformed HTTP request: " + ec.message());
      break;
    }
    bhttp::request<bhttp::string_body> msg = parser.release();
    HttpRequest req;
    req.method = std::string(msg.method_string());
    req.target = std::string(msg.target());
    req.path = req.target.substr(0, req.target.find('?'));
    for (const auto& f : msg) {
      std::string name(f.name_string());
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
      req.headers.emplace_back(std::move(name), std::string(f.value()));
    }
    req.body = std::move(msg.body());
    req.peer = c->peer;
    Responder r(fd, opt, msg.keep_alive() && !stopping.load());
    handler(req, r);
    if (!r.started()) r.send(500, "text/plain", "no response\n", {});
    if (!r.reusable() || stopping.load()) break;
  }
  {
    std::lock_guard<std::mutex> lk(c->mu);
    close(c->fd);
    c->fd = -1;
  }
  --open;
  c->done = true;
  cv.notify_all();
}

void HttpServer::Impl::shut(bool idle_only) {
  std::lock_guard<std::mutex> lk(mu);
  for (auto& c : conns) {
    std::lock_guard<std::mutex> ck(c->mu);
    if (c->fd >= 0 && (!idle_only || !c->busy)) shutdown(c->fd, SHUT_RDWR);
  }
}

void HttpServer::begin_stop() {
  Impl& m = *impl_;
  if (m.stopping.exchange(true)) return;
  if (m.wake[1] >= 0) {
    const char b = 1;
    ssize_t ignored = write(m.wake[1], &b, 1);
    (void)ignored;
  }
  if (m.acceptor.joinable()) m.acceptor.join();
  m.shut(true);
}

void HttpServer::stop(int grace_ms) {
  Impl& m = *impl_;
  if (m.stopped) return;
  m.stopped = true;
  begin_stop();
  auto shut = [&](bool idle_only) { m.shut(idle_only); };
  {
    std::unique_lock<std::mutex> lk(m.mu);
    m.cv.wait_for(lk, std::chrono::milliseconds(grace_ms), [&] {
      for (auto& c : m.conns)
        if (!c->done.load()) return false;
      return true;
    });
  }
  shut(false);
  std::list<std::shared_ptr<Conn>> all;
  {
    std::lock_guard<std::mutex> lk(m.mu);
    all.swap(m.conns);
  }
  for (auto& c : all)
    if (c->thread.joinable()) c->thread.join();
}

}  // namespace attnres::server
