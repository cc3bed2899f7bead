// Hostile input end to end (issue 16): every case used to crash the CLI, hang it, print wrong
// numbers or destroy a file. Each now has to exit with status 1 and a message naming the
// flag, field or file, and leave every file as it was.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "io/safetensors.h"
#include "io/weights.h"
#include "synth/synth.h"

namespace attnres {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Cli {
  int exit_code = -1;  // -1: killed by a signal (a crash)
  std::string out, err;
};

class HostileCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("attnres_hostile_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  Cli cli(const std::string& args) const {
    const fs::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    const std::string cmd = std::string(ATTNRES_CLI_PATH) + " " + args + " </dev/null >'" +
                            out.string() + "' 2>'" + err.string() + "'";
    const int st = std::system(cmd.c_str());
    Cli c;
    c.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    c.out = read_bytes(out);
    c.err = read_bytes(err);
    return c;
  }
  // A failure with status 1 (not a crash) whose message holds every string of `expect`.
  void expect_error(const Cli& c, std::initializer_list<std::string> expect) const {
    EXPECT_EQ(c.exit_code, 1) << c.err;
    for (const std::string& e : expect) EXPECT_NE(c.err.find(e), std::string::npos) << c.err;
  }
  // The synthetic tiny model (7 layers, tokenizer included) in dir_/name.
  std::string tiny(const std::string& name, uint64_t seed = 1, int64_t shard_bytes = 0) const {
    auto p = synth_preset("tiny");
    EXPECT_TRUE(p.is_ok());
    p->shard_bytes = shard_bytes;
    const std::string out = (dir_ / name).string();
    auto r = write_synthetic_model(*p, out, seed);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return out;
  }
  // A model directory with the tiny model's weights and its config edited by `edit` (the
  // text_config object).
  std::string edited(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    const std::string m = tiny(name);
    nlohmann::json cfg = nlohmann::json::parse(read_bytes(fs::path(m) / "config.json"));
    edit(cfg["text_config"]);
    std::ofstream(fs::path(m) / "config.json") << cfg.dump(2);
    return m;
  }
  fs::path dir_;
};

void set_layers(nlohmann::json& tc, int L) {
  nlohmann::json full = nlohmann::json::array(), kda = nlohmann::json::array();
  for (int l = 1; l <= L; ++l) (l % 4 == 0 || l == L ? full : kda).push_back(l);
  tc["num_hidden_layers"] = L;
  tc["linear_attn_config"]["full_attn_layers"] = full;
  tc["linear_attn_config"]["kda_layers"] = kda;
}

// 64 layers with attn_res_block_size 1: 65 sources at the final read, beyond the kernels'
// tables. inspect used to pass it and run to segfault.
TEST_F(HostileCli, TooManyAttnResSourcesRefusedByInspectAndRun) {
  const std::string m = edited("m64", [](nlohmann::json& tc) {
    set_layers(tc, 64);
    tc["attn_res_block_size"] = 1;
  });
  for (const std::string& cmd :
       {"inspect " + m, "run --model " + m + " --prompt-ids 1,2,3 --max-new-tokens 2"}) {
    expect_error(cli(cmd), {"attn_res_block_size' is 1 with num_hidden_layers 64", "65 sources",
                            "at most 64", "attn_res_block_size >= 2"});
  }
}

// short_conv_kernel_size 200: the convolution's window tables hold 16 (segfault before).
TEST_F(HostileCli, ConvolutionWidthRefusedByRun) {
  const std::string m = edited(
      "conv", [](nlohmann::json& tc) { tc["linear_attn_config"]["short_conv_kernel_size"] = 200; });
  expect_error(cli("run --model " + m + " --prompt-ids 1 --max-new-tokens 2"),
               {"short_conv_kernel_size' is 200, expected 1..16"});
}

// `harness --layers 757 --tokens 16 --hidden 64` segfaulted (65 sources per read).
TEST_F(HostileCli, HarnessFlagsOutOfRange) {
  expect_error(cli("harness --layers 757 --tokens 16 --hidden 64 --reps 1"),
               {"--layers 757 with --block 12", "65 sources", "--block >= 13"});
  expect_error(
      cli("harness --layers 0 --tokens 0 --hidden 4000000 --reps 0"),
      {"--layers is 0, expected 1..65536", "--tokens is 0", "--hidden is 4000000", "--reps is 0"});
  expect_error(cli("harness --block -1 --tokens 16 --hidden 64"), {"--block is -1"});
  // The largest accepted source count runs, and `planned` is exact there. (Exit status 1:
  // preserve-final, the published fix, has a hazard at this shape, which the verifier reports.)
  const Cli ok = cli("harness --layers 63 --block 1 --tokens 8 --hidden 64 --reps 1 --json");
  ASSERT_TRUE(ok.exit_code == 0 || ok.exit_code == 1) << ok.err;
  const auto j = nlohmann::json::parse(ok.out);
  const auto& planned = j["policies"]["planned"];
  EXPECT_TRUE(planned["hazards"].empty());
  EXPECT_EQ(planned["output_mismatches"], nlohmann::json::array({0}));
  EXPECT_EQ(planned["bank_mismatches"], nlohmann::json::array({0}));
}

// `plan` printed negative byte counts for a huge hidden_size (signed overflow).
TEST_F(HostileCli, PlanSizeArithmeticIsChecked) {
  const std::string k3 = std::string(ATTNRES_FIXTURES_DIR) + "/kimi-k3-config.json";
  nlohmann::json cfg = nlohmann::json::parse(read_bytes(k3));
  cfg["text_config"]["hidden_size"] = 1000000000000000LL;
  std::ofstream(dir_ / "huge.json") << cfg.dump();
  expect_error(cli("plan --config " + (dir_ / "huge.json").string() + " --tokens 4096"),
               {"hidden_size' is 1000000000000000, expected 1..1048576"});
  expect_error(cli("plan --config " + k3 + " --tokens 4000000000000000"),
               {"--tokens 4000000000000000 x hidden_size 7168", "overflows"});
  // The largest representable case still prints exact, non-negative numbers.
  const Cli ok = cli("plan --config " + k3 + " --tokens 50000000000000 --json");
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  const auto j = nlohmann::json::parse(ok.out);
  EXPECT_EQ(j["buffer_bytes"].get<int64_t>(), int64_t{50000000000000} * 7168 * 2);
  EXPECT_EQ(j["policies"]["separate"]["peak_bytes"].get<int64_t>(),
            int64_t{12} * 50000000000000 * 7168 * 2);
}

// `run --dump-logits PATH` replaced whatever was at PATH.
TEST_F(HostileCli, DumpLogitsNeverReplacesAnInputOrASpecialFile) {
  const std::string m = tiny("model");
  const fs::path prompt = dir_ / "prompt.txt";
  std::ofstream(prompt) << "1, 2, 3\n";
  const fs::path ro = dir_ / "readonly.safetensors";
  std::ofstream(ro) << "keep";
  ASSERT_EQ(::chmod(ro.c_str(), 0444), 0);
  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  fs::create_symlink(fs::path(m) / "model.safetensors", dir_ / "link.safetensors");
  const std::string weights = read_bytes(fs::path(m) / "model.safetensors");
  const std::string base = "run --model " + m + " --prompt-file " + prompt.string() +
                           " --max-new-tokens 2 --overwrite --dump-logits ";
  expect_error(cli(base + m + "/model.safetensors"), {"--dump-logits", "is an input"});
  expect_error(cli(base + m + "/config.json"), {"is an input"});
  expect_error(cli(base + prompt.string()), {"is an input"});
  expect_error(cli(base + (dir_ / "link.safetensors").string()), {"the same file as the input"});
  expect_error(cli(base + ro.string()), {"is read-only"});
  expect_error(cli(base + fifo.string()), {"is a FIFO"});
  expect_error(cli(base + "/dev/full"), {"is a character device"});
  expect_error(cli(base + dir_.string()), {"is a directory"});
  // A flag validator: CLI11's usage error (exit status 105, like every malformed flag).
  const Cli empty = cli(base + "''");
  EXPECT_EQ(empty.exit_code, 105) << empty.err;
  EXPECT_NE(empty.err.find("--dump-logits: an empty path"), std::string::npos) << empty.err;
  EXPECT_EQ(read_bytes(fs::path(m) / "model.safetensors"), weights);
  EXPECT_EQ(read_bytes(prompt), "1, 2, 3\n");
  EXPECT_EQ(read_bytes(ro), "keep");
  EXPECT_EQ(fs::status(fifo).type(), fs::file_type::fifo);

  // A new file is written; replacing it needs --overwrite.
  const std::string out = (dir_ / "logits.safetensors").string();
  const std::string plain = "run --model " + m + " --prompt-ids 1,2 --max-new-tokens 2 ";
  ASSERT_EQ(cli(plain + "--dump-logits " + out).exit_code, 0);
  const std::string first = read_bytes(out);
  expect_error(cli(plain + "--dump-logits " + out),
               {"--dump-logits '" + out + "' already exists; pass --overwrite"});
  EXPECT_EQ(read_bytes(out), first);
  const Cli again = cli(plain + "--dump-logits " + out + " --overwrite");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_TRUE(SafetensorsFile::open(out).is_ok());
}

// `make-model --overwrite` over a sharded model left the old index and shards; the loader
// preferred the index and ran the old weights.
TEST_F(HostileCli, MakeModelOverwriteLeavesExactlyTheNewModel) {
  const std::string m = tiny("model", /*seed=*/7, /*shard_bytes=*/1 << 18);
  ASSERT_TRUE(fs::exists(fs::path(m) / "model.safetensors.index.json"));
  std::ofstream(fs::path(m) / "notes.txt") << "mine";
  const Cli refused = cli("make-model --preset tiny --out " + m + " --seed 1");
  expect_error(refused, {"already holds", "--overwrite"});
  const Cli c = cli("make-model --preset tiny --out " + m + " --seed 1 --overwrite");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_NE(c.err.find("removed the previous checkpoint's model-00001-of-"), std::string::npos)
      << c.err;
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(m)) files.insert(e.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"config.json", "model.safetensors", "notes.txt",
                                          "tiktoken.model", "tokenizer_config.json"}));
  // Byte for byte what a fresh directory gets, and that is what loads.
  const std::string fresh = tiny("fresh", /*seed=*/1);
  EXPECT_EQ(read_bytes(fs::path(m) / "model.safetensors"),
            read_bytes(fs::path(fresh) / "model.safetensors"));
  auto w = load_model(m);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  ASSERT_EQ(w->files.size(), 1u);
  EXPECT_EQ(fs::path(w->files[0]->path()).filename(), "model.safetensors");
  EXPECT_EQ(read_bytes(fs::path(m) / "notes.txt"), "mine");
  // And back: a sharded model over a single-file one removes model.safetensors.
  auto p = synth_preset("tiny");
  p->shard_bytes = 1 << 18;
  auto r = write_synthetic_model(*p, m, 3, /*overwrite=*/true);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->removed, (std::vector<std::string>{"model.safetensors"}));
  EXPECT_FALSE(fs::exists(fs::path(m) / "model.safetensors"));
  EXPECT_TRUE(load_model(m).is_ok());
}

// --overwrite replaces regular files the writer owns, never a link or a special file.
TEST_F(HostileCli, MakeModelOverwriteRefusesLinksAndSpecialFiles) {
  const std::string m = tiny("model");
  const std::string target = read_bytes(fs::path(m) / "tiktoken.model");
  fs::rename(fs::path(m) / "tiktoken.model", dir_ / "elsewhere.model");
  fs::create_symlink(dir_ / "elsewhere.model", fs::path(m) / "tiktoken.model");
  expect_error(cli("make-model --preset tiny --out " + m + " --overwrite"),
               {"--out", "tiktoken.model' is a symbolic link"});
  EXPECT_EQ(read_bytes(dir_ / "elsewhere.model"), target);
  fs::remove(fs::path(m) / "tiktoken.model");
  ASSERT_EQ(::mkfifo((fs::path(m) / "tiktoken.model").c_str(), 0644), 0);
  expect_error(cli("make-model --preset tiny --out " + m + " --overwrite"), {"is a FIFO"});
  std::ofstream(dir_ / "file") << "x";
  expect_error(cli("make-model --preset tiny --out " + (dir_ / "file").string()),
               {"exists and is not a directory"});
}

// Progress: not a terminal here, so one summary line on stderr.
TEST_F(HostileCli, MakeModelSummaryOnStderrWhenNotATerminal) {
  const Cli c = cli("make-model --preset tiny --out " + (dir_ / "m").string());
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(c.err.find('\r'), std::string::npos) << c.err;
  EXPECT_NE(
      c.err.find("make-model: wrote " + (dir_ / "m").string() + ": 0.002 GB in 1 weight file(s)"),
      std::string::npos)
      << c.err;
}

TEST_F(HostileCli, VersionNamesTheProjectVersionAndTheSimdTarget) {
  const Cli c = cli("--version");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(c.out.rfind(std::string("attnres ") + ATTNRES_VERSION + " (SIMD target ", 0), 0u)
      << c.out;
}

// inspect checks the tokenizer generate and chat will load (it used to ignore it).
TEST_F(HostileCli, InspectChecksTheTokenizer) {
  const std::string m = tiny("model");
  const Cli ok = cli("inspect " + m + " --json");
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  const auto j = nlohmann::json::parse(ok.out);
  EXPECT_EQ(j["tokenizer"]["vocab_size"], 512);
  EXPECT_EQ(j["tokenizer"]["chat_tokens"]["<|end_of_msg|>"], 258);
  const fs::path rank = fs::path(m) / "tiktoken.model";
  const std::string good = read_bytes(rank);

  std::ofstream(rank, std::ios::app) << "not-a-rank-line\n";
  expect_error(cli("inspect " + m), {rank.string() + ":257", "expected \"<base64 token> <rank>\""});
  // 258 ranks + 256 control ids > vocab_size 512.
  std::ofstream(rank, std::ios::trunc) << good << "QUJD 256\nQUJE 257\n";
  expect_error(cli("inspect " + m), {"tokenizer has ids up to 513", "vocab_size 512"});
  std::ofstream(rank, std::ios::trunc) << good;
  std::ofstream(fs::path(m) / "tokenizer_config.json")
      << R"({"added_tokens_decoder": {"256": {"content": "[BOS]"}}})";
  expect_error(cli("inspect " + m), {"needs control token <|open|>"});
  std::ofstream(fs::path(m) / "tokenizer_config.json") << "{not json";
  expect_error(cli("inspect " + m), {"tokenizer_config.json", "not valid JSON"});
  // Without a tokenizer the directory still serves `run`.
  fs::remove(rank);
  const Cli none = cli("inspect " + m);
  ASSERT_EQ(none.exit_code, 0) << none.err;
  EXPECT_NE(none.out.find("tokenizer     none in the directory"), std::string::npos) << none.out;
}

}  // namespace
}  // namespace attnres
