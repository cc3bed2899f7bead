// `attnres tokenize` / `attnres detokenize` end to end: output formats, round trip, and the
// bad-input errors (missing or malformed rank file, unknown id) with a non-zero exit.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace attnres {
namespace {

namespace fs = std::filesystem;
const std::string kCli = ATTNRES_CLI_PATH;
const std::string kFix = std::string(ATTNRES_FIXTURES_DIR) + "/tokenizer";

struct CliRun {
  int status;
  std::string out;  // stdout and stderr together
};

CliRun run(const std::string& args) {
  const std::string cmd = "'" + kCli + "' " + args + " 2>&1";
  CliRun r{-1, ""};
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kCli)) GTEST_SKIP() << "attnres executable not built: " << kCli;
  }
};

TEST_F(Cli, TokenizeMatchesTiktokenAndRoundTrips) {
  // "hello world" in o200k_base is [24912, 2375] (tiktoken).
  CliRun r = run("tokenize --tokenizer " + kFix +
                 "/o200k_base.tiktoken --pattern o200k_base --text 'hello world' --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out, "[24912,2375]\n");
  r = run("tokenize --tokenizer " + kFix +
          "/o200k_base.tiktoken --pattern o200k_base --text 'hello world'");
  EXPECT_EQ(r.out, "24912 2375\n");
  r = run("detokenize --tokenizer " + kFix +
          "/o200k_base.tiktoken --pattern o200k_base --ids 24912,2375");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out, "hello world\n");
}

TEST_F(Cli, AllowSpecialControlsControlTokens) {
  const std::string synth = kFix + "/synthetic";
  CliRun plain = run("tokenize --tokenizer " + synth + " --text '<|open|>' --json");
  CliRun special =
      run("tokenize --tokenizer " + synth + " --text '<|open|>' --json --allow-special");
  ASSERT_EQ(special.status, 0) << special.out;
  EXPECT_EQ(special.out, "[346]\n");  // base 343 + 3
  EXPECT_NE(plain.out, special.out);
  CliRun back = run("detokenize --tokenizer " + synth + " --ids 346");
  EXPECT_EQ(back.out, "<|open|>\n");
}

// --chat encodes a message file exactly as the chat fixtures (tiktoken ids of encoding_k3.py's
// segments) say.
TEST_F(Cli, ChatFileMatchesReferenceIds) {
  std::ifstream in(kFix + "/synthetic/chat.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const auto fx = nlohmann::json::parse(ss.str());
  const fs::path dir =
      fs::temp_directory_path() / ("attnres_cli_chat_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  int checked = 0;
  for (const auto& c : fx["chat"]) {
    std::ofstream(dir / "messages.json") << c["messages"].dump();
    std::string flags;
    if (!c["thinking"].get<bool>()) flags += " --no-thinking";
    if (!c["add_generation_prompt"].get<bool>()) flags += " --no-generation-prompt";
    CliRun r = run("tokenize --tokenizer " + kFix + "/synthetic --json --chat " +
                   (dir / "messages.json").string() + flags);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(nlohmann::json::parse(r.out), c["ids"]) << c["messages"].dump();
    if (++checked == 8) break;  // each run loads the tokenizer; a sample is enough here
  }
  std::ofstream(dir / "bad.json") << R"([{"role": "robot", "content": "x"}])";
  CliRun bad =
      run("tokenize --tokenizer " + kFix + "/synthetic --chat " + (dir / "bad.json").string());
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("bad.json: messages[0].role: unknown role \"robot\""), std::string::npos)
      << bad.out;
  fs::remove_all(dir);
}

TEST_F(Cli, FileInputAndRawOutputRoundTripBytes) {
  const fs::path dir = fs::temp_directory_path() / ("attnres_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string bytes = std::string("caf\xc3\xa9 \xff\xfe tail\n", 14);
  std::ofstream(dir / "in.txt", std::ios::binary) << bytes;
  CliRun ids =
      run("tokenize --tokenizer " + kFix + "/cl100k_base.tiktoken --pattern cl100k_base --file " +
          (dir / "in.txt").string() + " --json");
  ASSERT_EQ(ids.status, 0) << ids.out;
  std::ofstream(dir / "ids.json") << ids.out;
  CliRun raw = run("detokenize --tokenizer " + kFix +
                   "/cl100k_base.tiktoken --pattern cl100k_base --raw --file " +
                   (dir / "ids.json").string());
  ASSERT_EQ(raw.status, 0) << raw.out;
  EXPECT_EQ(raw.out, bytes);
  fs::remove_all(dir);
}

TEST_F(Cli, BadInputIsANamedErrorWithNonZeroExit) {
  const fs::path dir =
      fs::temp_directory_path() / ("attnres_cli_bad_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "bad.model") << "IQ== 0\nIg== zero\n";
  struct Case {
    std::string args;
    std::string expect;
  } cases[] = {
      {"tokenize --tokenizer /nonexistent/tiktoken.model --text x", "/nonexistent/tiktoken.model"},
      {"tokenize --tokenizer " + (dir / "bad.model").string() + " --text x",
       "bad.model:2: rank must be"},
      {"detokenize --tokenizer " + kFix + "/synthetic --ids 1,99999", "unknown token id 99999"},
      {"detokenize --tokenizer " + kFix + "/synthetic --ids 1,x2", "\"x2\" is not a token id"},
      {"tokenize --tokenizer " + kFix + "/synthetic --pattern gpt9 --text x",
       "unknown pre-tokenizer pattern \"gpt9\""},
      {"tokenize --tokenizer " + kFix + "/synthetic", "exactly one of --text, --file or --chat"},
  };
  for (const Case& c : cases) {
    CliRun r = run(c.args);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_NE(r.out.find("error: "), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.args << "\n" << r.out;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace attnres
