// The inference loop (engine_loop.h).
#include "server/engine_loop.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

namespace attnres::server {

RequestChannel::RequestChannel() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

RequestChannel::~RequestChannel() {
  if (fd_ >= 0) close(fd_);
}

void RequestChannel::push(LoopEvent e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    events_.push_back(std::move(e));
  }
  const uint64_t one = 1;
  ssize_t ignored = write(fd_, &one, sizeof one);
  (void)ignored;
}

std::vector<LoopEvent> RequestChannel::take() {
  uint64_t v = 0;
  ssize_t ignored = read(fd_, &v, sizeof v);
  (void)ignored;
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<LoopEvent> out;
  out.swap(events_);
  return out;
}

EngineLoop::EngineLoop(std::unique_ptr<Engine> engine, int64_t capacity, int step_delay_ms)
    : engine_(std::move(engine)),
      capacity_(capacity),
      context_(engine_->context_length()),
      step_delay_ms_(step_delay_ms) {
  stats_.engine = engine_->stats();
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() {
  shutdown();
}

bool EngineLoop::try_submit(GenerationRequest request, std::shared_ptr<RequestChannel> channel) {
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_ || in_loop_.load() >= capacity_) {
    ++refused_;
    return false;
  }
  ++in_loop_;
  Command c;
  c.request = std::move(request);
  c.channel = std::move(channel);
  commands_.push_back(std::move(c));
  cv_.notify_one();
  return true;
}

void EngineLoop::cancel(const std::shared_ptr<RequestChannel>& channel) {
  int64_t unset = -1;
  channel->cancel_step.compare_exchange_strong(unset, step_index_.load());
  std::lock_guard<std::mutex> lk(mu_);
  Command c;
  c.cancel = true;
  c.channel = channel;
  commands_.push_back(std::move(c));
  cv_.notify_one();
}

void EngineLoop::shutdown() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

LoopStats EngineLoop::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  LoopStats s = stats_;
  s.in_loop = in_loop_.load();
  s.refused_full = refused_.load();
  return s;
}

void EngineLoop::submit_now(Command& c) {
  std::shared_ptr<RequestChannel> ch = c.channel;
  GenerationCallbacks cb;
  cb.on_prefill = [this, ch](int64_t, int64_t) { ch->last_work_step = step_index_.load(); };
  cb.on_token = [this, ch](const TokenEvent& e) {
    if (e.token >= 0) ch->last_work_step = step_index_.load();
    LoopEvent ev;
    ev.kind = LoopEvent::Kind::kToken;
    ev.token = e;
    ch->push(std::move(ev));
  };
  cb.on_finish = [this, ch](GenerationResult&& r) {
    LoopEvent ev;
    ev.kind = LoopEvent::Kind::kFinished;
    ev.result = std::move(r);
    {
      std::lock_guard<std::mutex> lk(mu_);
      ev.shutdown = stopping_;
      if (const int64_t mark = ch->cancel_step.load(); mark >= 0) {
        ++stats_.cancels;
        stats_.max_steps_after_cancel =
            std::max(stats_.max_steps_after_cancel, ch->last_work_step.load() - mark);
      }
    }
    active_.erase(std::remove_if(active_.begin(), active_.end(),
                                 [&](const auto& a) { return a.first == ch; }),
                  active_.end());
    --in_loop_;
    ch->push(std::move(ev));
  };
  auto id = engine_->submit(std::move(c.request), std::move(cb));
  if (!id.is_ok()) {
    LoopEvent ev;
    ev.kind = LoopEvent::Kind::kRejected;
    ev.status = id.status();
    --in_loop_;
    ch->push(std::move(ev));
    return;
  }
  active_.emplace_back(ch, *id);
  LoopEvent ev;
  ev.kind = LoopEvent::Kind::kAccepted;
  ch->push(std::move(ev));
}

void EngineLoop::run() {
  using Clock = std::chrono::steady_clock;
  while (true) {
    std::deque<Command> cmds;
    bool stop = false;
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (commands_.empty() && !stopping_ && !engine_->has_work())
        cv_.wait(lk, [&] { return !commands_.empty() || stopping_; });
      cmds.swap(commands_);
      stop = stopping_;
    }
    for (Command& c : cmds) {
      if (!c.cancel) {
        submit_now(c);
        continue;
      }
      for (const auto& [ch, id] : active_)
        if (ch == c.channel) {
          engine_->cancel(id);  // a waiting request finishes here, a running one next step
          break;
        }
    }
    if (stop) {
      // Every request ends now: cancel all (waiting ones finish at once), then one step reaps
      // the running ones without computing anything for them.
      std::vector<RequestId> ids;
      for (const auto& a : active_) ids.push_back(a.second);
      for (RequestId id : ids) engine_->cancel(id);
      (void)engine_->step();
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      stats_.engine = engine_->stats();  // submissions and cancels change the counts
    }
    if (!engine_->has_work()) continue;
    const auto t0 = Clock::now();
    ++step_index_;
    Status st = engine_->step();  // a failed step fails its sequences (kFinished, kError)
    (void)st;
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (step_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms_));
    std::lock_guard<std::mutex> lk(mu_);
    stats_.engine = engine_->stats();
    ++stats_.loop_steps;
    stats_.last_step_seconds = dt;
  }
}

}  // namespace attnres::server
