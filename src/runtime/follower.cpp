// The leader/follower protocol (follower.h) and the process-group API (attnres/parallel.h).
#include "runtime/follower.h"

#include <cstdio>
#include <map>

#include "attnres/parallel.h"

namespace attnres {
namespace {

// The fixed part of a message, broadcast first.
struct Header {
  LeaderOp op;
  int64_t a;
  int64_t payload_bytes;
};

}  // namespace

std::string rank_prefix(const Communicator& comm) {
  if (comm.size() <= 1) return "";
  return "rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()) + ": ";
}

std::string rank_prefix() {
  return rank_prefix(*process_group());
}

void send_to_followers(Communicator& comm, LeaderOp op, int64_t a, const std::string& payload,
                       CommStats* stats) {
  const double t0 = comm_clock();
  Header h{op, a, static_cast<int64_t>(payload.size())};
  comm.broadcast(&h, sizeof h, 0, /*idle=*/true);
  if (!payload.empty()) comm.broadcast(const_cast<char*>(payload.data()), h.payload_bytes, 0);
  if (stats != nullptr) {
    stats->collectives += payload.empty() ? 1 : 2;
    stats->seconds += comm_clock() - t0;
  }
}

LeaderMessage receive_from_leader(Communicator& comm, CommStats* stats) {
  Header h{};
  comm.broadcast(&h, sizeof h, 0, /*idle=*/true);
  LeaderMessage m;
  m.op = h.op;
  m.a = h.a;
  m.payload.resize(static_cast<size_t>(h.payload_bytes));
  if (h.payload_bytes > 0) comm.broadcast(m.payload.data(), h.payload_bytes, 0);
  if (stats != nullptr) stats->collectives += h.payload_bytes > 0 ? 2 : 1;
  return m;
}

Status agree(Communicator& comm, const Status& mine, CommStats* stats) {
  if (comm.size() <= 1) return mine;
  const int P = comm.size();
  if (stats != nullptr) ++stats->collectives;
  if (comm.max(mine.is_ok() ? 0 : 1) == 0) return Status::ok();
  // Some rank failed: every rank's code and message, to every rank.
  const std::string text = mine.is_ok() ? "" : mine.message();
  std::vector<int64_t> lens(static_cast<size_t>(P), static_cast<int64_t>(sizeof(int64_t) * 2));
  std::vector<int64_t> heads(static_cast<size_t>(2 * P));
  const int64_t my_head[2] = {static_cast<int64_t>(mine.code()), static_cast<int64_t>(text.size())};
  comm.allgatherv(my_head, heads.data(), lens);
  std::vector<int64_t> bytes(static_cast<size_t>(P));
  int64_t total = 0;
  for (int r = 0; r < P; ++r) total += bytes[static_cast<size_t>(r)] = heads[2 * r + 1];
  std::string all(static_cast<size_t>(total), '\0');
  comm.allgatherv(text.data(), all.data(), bytes);
  std::vector<std::pair<int, std::string>> failed;
  int64_t off = 0;
  ErrorCode code = ErrorCode::kOk;
  for (int r = 0; r < P; ++r) {
    const auto n = static_cast<size_t>(bytes[static_cast<size_t>(r)]);
    const auto c = static_cast<ErrorCode>(heads[2 * r]);
    if (c != ErrorCode::kOk) {
      if (code == ErrorCode::kOk) code = c;
      failed.emplace_back(r, all.substr(static_cast<size_t>(off), n));
    }
    off += static_cast<int64_t>(n);
  }
  bool same = static_cast<int>(failed.size()) == P;
  for (const auto& f : failed) same = same && f.second == failed.front().second;
  if (same) return Status(code, failed.front().second);
  std::string msg;
  for (const auto& [r, m] : failed) {
    if (!msg.empty()) msg += "\n";
    msg += "rank " + std::to_string(r) + " of " + std::to_string(P) + ": " + m;
  }
  return Status(code, msg);
}

void write_request(Writer& w, const GenerationRequest& r) {
  // A new field must be added here and in read_request (the followers would not see it).
  static_assert(sizeof(GenerationRequest) == 184, "serialise the new GenerationRequest field");
  w.vec(r.prompt);
  w.pod(r.sampling);
  w.pod(r.max_new_tokens);
  w.pod(r.strict_context);
  w.pod(r.ignore_eos);
  w.vec(r.stop_tokens);
  w.pod(static_cast<int64_t>(r.stop_strings.size()));
  for (const std::string& s : r.stop_strings) w.str(s);
  w.pod(static_cast<int64_t>(r.logit_bias.size()));
  for (const auto& [id, bias] : r.logit_bias) {
    w.pod(id);
    w.pod(bias);
  }
  w.pod(r.top_logprobs);
  w.pod(r.keep_logits);
  w.pod(r.use_prefix_cache);
  w.pod(r.snapshot_at_end);
  w.vec(r.forced_tokens);
}

GenerationRequest read_request(Reader& rd) {
  GenerationRequest r;
  r.prompt = rd.vec<int32_t>();
  r.sampling = rd.pod<SamplingParams>();
  r.max_new_tokens = rd.pod<int64_t>();
  r.strict_context = rd.pod<bool>();
  r.ignore_eos = rd.pod<bool>();
  r.stop_tokens = rd.vec<int32_t>();
  const auto n = rd.pod<int64_t>();
  for (int64_t i = 0; i < n && rd.ok(); ++i) r.stop_strings.push_back(rd.str());
  const auto nb = rd.pod<int64_t>();
  for (int64_t i = 0; i < nb && rd.ok(); ++i) {
    const auto id = rd.pod<int32_t>();
    r.logit_bias.emplace_back(id, rd.pod<float>());
  }
  r.top_logprobs = rd.pod<int>();
  r.keep_logits = rd.pod<bool>();
  r.use_prefix_cache = rd.pod<bool>();
  r.snapshot_at_end = rd.pod<bool>();
  r.forced_tokens = rd.vec<int32_t>();
  return r;
}

// ---------------------------------------------------------------------------------------------
// attnres/parallel.h

Status start_processes(int* argc, char*** argv) {
  const std::string err = start_process_group(argc, argv);
  if (!err.empty()) return Status(ErrorCode::kUnsupported, err);
  return Status::ok();
}

int process_rank() {
  return process_group()->rank();
}

int process_count() {
  return process_group()->size();
}

void end_processes(int status) {
  std::shared_ptr<Communicator> g = process_group();
  if (g->size() > 1 && g->rank() == 0) send_to_followers(*g, LeaderOp::kExit, status, "");
  end_process_group();
}

int follow_leader(const FollowerOptions& o) {
  std::shared_ptr<Communicator> group = o.load.group ? o.load.group : process_group();
  std::shared_ptr<const Model> model;
  std::map<int64_t, std::unique_ptr<Engine>> engines;
  bool reported = false;  // o.prior went to the leader with a load
  // A follower that cannot go on ends the job: the leader would wait on it forever.
  const auto fatal = [&](const Status& st) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s%s\n", rank_prefix(*group).c_str(), st.message().c_str());
    group->abort(1);
  };
  for (;;) {
    LeaderMessage m = receive_from_leader(*group);
    switch (m.op) {
      case LeaderOp::kLoadModel: {
        Reader r(m.payload);
        ModelLoadOptions lo = o.load;
        lo.require_tokenizer = r.pod<bool>();
        lo.group = group;
        lo.progress = nullptr;
        Status prior = o.prior;
        if (prior.is_ok() && (o.threads < 0 || o.threads > 4096))
          prior = Status(ErrorCode::kInvalidArgument, "--threads is " + std::to_string(o.threads) +
                                                          ", expected 1..4096 (0: default)");
        if (prior.is_ok()) set_thread_count(o.threads > 0 ? o.threads : default_thread_count());
        reported = reported || !prior.is_ok();
        auto loaded = FollowerAccess::load(lo, group, prior);
        model = loaded.is_ok() ? std::move(loaded).value() : nullptr;  // the leader reports
        break;
      }
      case LeaderOp::kCreateEngine: {
        Reader r(m.payload);
        const auto eo = r.pod<EngineOptions>();
        if (!model) {  // the leader's load succeeded, so this rank's did too
          fatal(Status(ErrorCode::kInternal, "engine requested before a model was loaded"));
        }
        auto e = FollowerAccess::create(model, eo, m.a);
        if (e.is_ok()) engines[m.a] = std::move(e).value();
        break;
      }
      case LeaderOp::kStep: {
        auto it = engines.find(m.a);
        if (it == engines.end())
          fatal(Status(ErrorCode::kInternal, "step of unknown engine " + std::to_string(m.a)));
        if (Status st = FollowerAccess::replay(*it->second, m.payload); !st.is_ok()) fatal(st);
        // A step's errors depend only on the step (the same on every rank), and the engine
        // reports them to its requests as the leader's does.
        (void)it->second->step();
        break;
      }
      case LeaderOp::kDestroyEngine:
        engines.erase(m.a);
        break;
      case LeaderOp::kExit:
        engines.clear();
        model.reset();
        if (!o.prior.is_ok() && !reported) {
          std::fprintf(stderr, "error: %s%s\n", rank_prefix(*group).c_str(),
                       o.prior.message().c_str());
          return m.a != 0 ? static_cast<int>(m.a) : 1;
        }
        return static_cast<int>(m.a);
      default:
        fatal(Status(
            ErrorCode::kInternal,
            "unknown message " + std::to_string(static_cast<int64_t>(m.op)) + " from the leader"));
    }
  }
}

}  // namespace attnres
