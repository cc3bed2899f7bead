// attnres: command-line front end. Subcommands register themselves (see command.h).
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "command.h"

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
      } catch (const std::exception& e) {
        return fail(std::string("internal error: ") + e.what());
      }
    }
  }
  return fail("no subcommand given");
}
