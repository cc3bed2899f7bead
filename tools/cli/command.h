// Subcommand registry of the `attnres` executable. Each cmd_*.cpp registers one subcommand:
//   static const CommandRegistration kReg("name", "one-line help", setup);
// where setup adds the subcommand's options to `sub` and returns the function that runs it
// (its return value is the process exit status).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace attnres::cli {

using CommandRun = std::function<int()>;
using CommandSetup = std::function<CommandRun(CLI::App* sub)>;

struct CommandSpec {
  std::string name;
  std::string help;
  CommandSetup setup;
};

std::vector<CommandSpec>& command_registry();

struct CommandRegistration {
  CommandRegistration(std::string name, std::string help, CommandSetup setup) {
    command_registry().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

// Prints "error: <message>" to stderr and returns the exit status for errors (1).
int fail(const std::string& message);

}  // namespace attnres::cli
