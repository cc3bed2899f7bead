// attnres: command-line front end. Subcommands register themselves (see command.h).
// `attnres --version` prints the project version (CMake's PROJECT_VERSION) and the Highway
// target the kernels dispatched to on this CPU.
//
// Under an MPI launcher (attnres/parallel.h) every rank parses the same arguments; rank 0 runs
// the command, the other ranks follow it (follow_leader) with their own model flags, and every
// rank ends with the leader's exit status. A follower whose arguments do not parse (or name a
// bad --dtype / --kv-dtype) reports it, with its rank, when the leader loads the model.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <new>
#include <string>

#include "attnres/parallel.h"
#include "command.h"
#include "frontend.h"
#include "kernels/attnres.h"

namespace attnres::cli {

std::vector<CommandSpec>& command_registry() {
  static std::vector<CommandSpec> registry;
  return registry;
}

int fail(const std::string& message) {
  std::fflush(stdout);
  std::cerr << "error: " << message << "\n";
  return 1;
}

}  // namespace attnres::cli

namespace {

int follow(const std::vector<std::pair<CLI::App*, attnres::cli::CommandRun>>& runs,
           attnres::Status prior) {
  using namespace attnres;
  FollowerOptions fo;
  fo.prior = std::move(prior);
  for (const auto& [sub, run] : runs) {
    const cli::ModelArgs* a = sub->parsed() ? cli::model_args_of(sub) : nullptr;
    if (a == nullptr) continue;
    fo.load.dir = a->model;
    fo.load.tokenizer = a->tokenizer;
    fo.load.mmap = a->mmap;
    fo.threads = a->threads;
    if (fo.prior.is_ok()) {
      auto eo = cli::engine_options(*a);
      if (!eo.is_ok()) fo.prior = eo.status();
    }
  }
  return follow_leader(fo);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace attnres::cli;
  if (attnres::Status st = attnres::start_processes(&argc, &argv); !st.is_ok())
    return fail(st.message());
  const bool follower = attnres::process_rank() != 0;
  CLI::App app{"attnres: inference engine for Kimi-K3 and other Block-AttnRes transformers"};
  app.require_subcommand(1);
  app.set_version_flag(
      "--version",
      [] {
        return std::string("attnres ") + ATTNRES_VERSION + " (SIMD target " +
               attnres::attnres_target_name() + ", chosen at run time)";
      },
      "Print the version and the SIMD target the kernels run on");
  auto& registry = command_registry();
  std::sort(registry.begin(), registry.end(),
            [](const CommandSpec& a, const CommandSpec& b) { return a.name < b.name; });
  std::vector<std::pair<CLI::App*, CommandRun>> runs;
  for (const auto& spec : registry) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.help);
    runs.emplace_back(sub, spec.setup(sub));
  }
  int code = 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (follower) {
      // The leader parsed the same arguments (mpirun) and reports them; a follower whose own
      // arguments alone are bad reports it with its rank.
      const int status = follow(runs, e.get_exit_code() == 0
                                          ? attnres::Status::ok()
                                          : attnres::Status(attnres::ErrorCode::kInvalidArgument,
                                                            "arguments: " + std::string(e.what())));
      attnres::end_processes(status);
      return status;
    }
    code = app.exit(e);
    attnres::end_processes(code);
    return code;
  }
  if (follower) {
    code = follow(runs, attnres::Status::ok());
    attnres::end_processes(code);
    return code;
  }
  bool ran = false;
  for (auto& [sub, run] : runs) {
    if (!sub->parsed()) continue;
    ran = true;
    try {
      code = run();
    } catch (const std::bad_alloc&) {
      code = fail(
          "out of memory: the model, the input or the flags need more memory than this machine "
          "could allocate");
    } catch (const std::exception& e) {
      code = fail(std::string("internal error: ") + e.what());
    }
    break;
  }
  if (!ran) code = fail("no subcommand given");
  attnres::end_processes(code);
  return code;
}
