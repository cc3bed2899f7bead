// attnres: command-line front end. Subcommands register themselves (see command.h).
// `attnres --version` prints the project version (CMake's PROJECT_VERSION) and the Highway
// target the kernels dispatched to on this CPU.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <new>
#include <string>

#include "command.h"
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

int main(int argc, char** argv) {
  using namespace attnres::cli;
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [sub, run] : runs) {
    if (sub->parsed()) {
      try {
        return run();
      } catch (const std::bad_alloc&) {
        return fail(
            "out of memory: the model, the input or the flags need more memory than this machine "
            "could allocate");
      } catch (const std::exception& e) {
        return fail(std::string("internal error: ") + e.what());
      }
    }
  }
  return fail("no subcommand given");
}
