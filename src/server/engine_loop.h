// The inference loop of `attnres serve`: one thread owns the Engine and every sequence in it.
//
// HTTP threads never touch the Engine. They hand a GenerationRequest and a RequestChannel to
// try_submit(); the loop thread takes commands (submit, cancel) from a mutex-guarded queue
// between steps, so a request submitted while a step runs joins the next one (continuous
// batching), and a cancel reaches the engine before the next step (a running sequence computes
// no further token: Engine::cancel). The engine's callbacks run on the loop thread and only push
// events into the request's channel, whose eventfd wakes the HTTP thread waiting on it.
//
// Admission control: at most `capacity` requests (running + waiting in the engine + not yet
// taken by the loop) are in the loop at once; try_submit() refuses beyond that at once, so the
// caller answers 503 without waiting for a step.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "attnres/engine.h"

namespace attnres::server {

struct LoopEvent {
  enum class Kind { kAccepted, kRejected, kToken, kFinished };
  Kind kind = Kind::kToken;
  TokenEvent token;         // kToken
  Status status;            // kRejected: why (the engine's submit error)
  GenerationResult result;  // kFinished
  bool shutdown = false;    // kFinished: ended because the server is stopping
};

// The events of one request, from the loop thread to the HTTP thread that waits on wake_fd().
class RequestChannel {
 public:
  RequestChannel();
  ~RequestChannel();
  RequestChannel(const RequestChannel&) = delete;
  RequestChannel& operator=(const RequestChannel&) = delete;

  int wake_fd() const { return fd_; }
  // What "cancelled within one step" is measured by: the loop's step number when cancel() was
  // called (-1: never), and the number of the last step that did work for the request (a
  // prefill chunk or a token).
  std::atomic<int64_t> cancel_step{-1};
  std::atomic<int64_t> last_work_step{-1};
  void push(LoopEvent e);
  std::vector<LoopEvent> take();  // everything pushed so far (and clears the wake-up)

 private:
  int fd_ = -1;
  std::mutex mu_;
  std::vector<LoopEvent> events_;
};

struct LoopStats {
  EngineStats engine;
  int64_t in_loop = 0;       // requests admitted by try_submit and not finished
  int64_t refused_full = 0;  // try_submit refusals (capacity)
  int64_t loop_steps = 0;    // engine steps run
  double last_step_seconds = 0;
  int64_t cancels = 0;  // requests that finished after cancel()
  // Most steps after the one running at cancel() that still did work for the request: 0 when the
  // cancel took effect before the next step, 1 when it came just as that step began.
  int64_t max_steps_after_cancel = 0;
};

class EngineLoop {
 public:
  // `step_delay_ms` (tests only): a pause after each step, so that requests stay in the loop
  // long enough for scheduling tests to act on them.
  EngineLoop(std::unique_ptr<Engine> engine, int64_t capacity, int step_delay_ms = 0);
  ~EngineLoop();  // shutdown() if still running
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Queues a request; its events arrive on `channel` (first kAccepted or kRejected). Returns
  // false, queuing nothing, when `capacity` requests are in the loop or it is shutting down.
  bool try_submit(GenerationRequest request, std::shared_ptr<RequestChannel> channel);
  // Cancels the request of `channel` (queued, waiting or running); its kFinished follows.
  void cancel(const std::shared_ptr<RequestChannel>& channel);
  // Finishes every request (kFinished with shutdown = true) and stops the thread.
  void shutdown();

  LoopStats stats() const;
  int64_t context_length() const { return context_; }
  int64_t capacity() const { return capacity_; }

 private:
  struct Command {
    bool cancel = false;
    GenerationRequest request;
    std::shared_ptr<RequestChannel> channel;
  };
  void run();
  void submit_now(Command& c);

  std::unique_ptr<Engine> engine_;
  const int64_t capacity_;
  const int64_t context_;
  const int step_delay_ms_;
  std::atomic<int64_t> in_loop_{0};
  std::atomic<int64_t> refused_{0};
  std::atomic<int64_t> step_index_{0};  // incremented before each engine step
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> commands_;  // under mu_
  bool stopping_ = false;         // under mu_
  LoopStats stats_;               // under mu_ (engine part copied after each step)
  // Loop thread only: the engine id of each channel's request.
  std::vector<std::pair<std::shared_ptr<RequestChannel>, RequestId>> active_;
  std::thread thread_;
};

}  // namespace attnres::server
