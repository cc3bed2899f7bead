// The leader/follower protocol of multi-process runs (include/attnres/parallel.h).
//
// The leader (rank 0) sends one message before each operation the followers must mirror; a
// message is a fixed header broadcast (op, a, payload size) and, when the payload is not empty,
// the payload broadcast. Followers wait for headers without spinning (Communicator::broadcast
// with idle). Operations:
//   kLoadModel     payload: the leader's load flags    every rank loads its share, then agree()
//   kCreateEngine  a: engine id, payload: EngineOptions every rank creates it, then agree()
//   kStep          a: engine id, payload: events       submits and cancels since the last step,
//                                                      in order; then every rank steps
//   kDestroyEngine a: engine id
//   kExit          a: exit status                      followers return it
// Every rank therefore applies the same requests in the same order to the same engine and, the
// logits being bitwise equal on every rank, makes the same decisions.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "attnres/engine.h"
#include "parallel/comm.h"
#include "parallel/gather.h"

namespace attnres {

enum class LeaderOp : int64_t { kLoadModel = 1, kCreateEngine, kStep, kDestroyEngine, kExit };

struct LeaderMessage {
  LeaderOp op = LeaderOp::kExit;
  int64_t a = 0;
  std::string payload;
};

// Leader: sends a message (counted in `stats` when given).
void send_to_followers(Communicator& comm, LeaderOp op, int64_t a, const std::string& payload,
                       CommStats* stats = nullptr);
// Follower: waits for the next message.
LeaderMessage receive_from_leader(Communicator& comm, CommStats* stats = nullptr);

// Every rank's `mine`, combined: ok when every rank is ok; otherwise the same error on every
// rank: the message every failing rank gave, prefixed with "rank R of P: " unless every rank
// failed with the same message. A collective.
Status agree(Communicator& comm, const Status& mine, CommStats* stats = nullptr);

// "rank R of P: " for P > 1.
std::string rank_prefix(const Communicator& comm);

// Byte serialisation of the protocol's payloads.
class Writer {
 public:
  template <typename T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const char*>(&v);
    out_.append(p, sizeof(T));
  }
  template <typename T>
  void vec(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    pod(static_cast<int64_t>(v.size()));
    out_.append(reinterpret_cast<const char*>(v.data()), sizeof(T) * v.size());
  }
  void str(std::string_view s) {
    pod(static_cast<int64_t>(s.size()));
    out_.append(s);
  }
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  T pod() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v{};
    take(&v, sizeof(T));
    return v;
  }
  template <typename T>
  std::vector<T> vec() {
    const auto n = static_cast<size_t>(pod<int64_t>());
    std::vector<T> v(n);
    take(v.data(), sizeof(T) * n);
    return v;
  }
  std::string str() {
    const auto n = static_cast<size_t>(pod<int64_t>());
    std::string s(n, '\0');
    take(s.data(), n);
    return s;
  }
  bool done() const { return pos_ == in_.size(); }
  bool ok() const { return ok_; }

 private:
  void take(void* dst, size_t n) {
    if (pos_ + n > in_.size()) {
      ok_ = false;
      return;
    }
    if (n > 0) std::memcpy(dst, in_.data() + pos_, n);
    pos_ += n;
  }
  std::string_view in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

void write_request(Writer& w, const GenerationRequest& r);
GenerationRequest read_request(Reader& r);

// The parts of Model and Engine the protocol needs (friends of both).
struct FollowerAccess {
  // This rank's share of the model, then agree() (prior: an error this rank already has).
  static Result<std::shared_ptr<const Model>> load(const ModelLoadOptions& options,
                                                   std::shared_ptr<Communicator> group,
                                                   Status prior);
  // The engine `id` of the protocol, then agree().
  static Result<std::unique_ptr<Engine>> create(std::shared_ptr<const Model> model,
                                                const EngineOptions& options, int64_t id);
  // A follower's step, first half: the leader's events since its last step (an error means
  // this rank disagrees with the leader and cannot go on).
  static Status replay(Engine& engine, std::string_view events);
};

}  // namespace attnres
