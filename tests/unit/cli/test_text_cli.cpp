// End-to-end tests of the text front ends (generate, chat, run, make-model) on a synthetic tiny
// model written into a temporary directory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

namespace fs = std::filesystem;

struct Cmd {
  int status = -1;
  std::string out;
  std::string err;
};

Cmd run(const std::string& args, const std::string& stdin_text = "") {
  const fs::path dir = fs::temp_directory_path();
  const std::string tag = std::to_string(::getpid());
  const fs::path in = dir / ("attnres_cli_in_" + tag), err = dir / ("attnres_cli_err_" + tag);
  std::ofstream(in) << stdin_text;
  const std::string cmd =
      std::string(ATTNRES_CLI_PATH) + " " + args + " <" + in.string() + " 2>" + err.string();
  Cmd c;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) c.out.append(buf, n);
  c.status = pclose(p);
  std::ifstream e(err);
  c.err.assign(std::istreambuf_iterator<char>(e), {});
  fs::remove(in);
  fs::remove(err);
  return c;
}

class TextCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ =
        (fs::temp_directory_path() / ("attnres_cli_tiny_" + std::to_string(::getpid()))).string();
    fs::remove_all(model_);
    const Cmd c = run("make-model --preset tiny --out " + model_ + " --seed 5");
    ASSERT_EQ(c.status, 0) << c.err;
  }
  static void TearDownTestSuite() { fs::remove_all(model_); }
  static std::string model_;
};
std::string TextCli::model_;

TEST_F(TextCli, GenerateIsReproducibleAndMatchesGreedyRun) {
  const std::string base = "generate --model " + model_ + " --prompt 'Hello, world' --json ";
  const Cmd a = run(base + "--max-new-tokens 12 --temperature 0.9 --top-p 0.95 --seed 7");
  const Cmd b = run(base + "--max-new-tokens 12 --temperature 0.9 --top-p 0.95 --seed 7");
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja["tokens"], jb["tokens"]);
  EXPECT_EQ(ja["tokens"].size(), 12u);

  // Greedy generate == the `run` command's greedy ids on the same prompt ids.
  const Cmd tok =
      run("tokenize --tokenizer " + model_ + "/tiktoken.model --text 'Hello, world' --json");
  ASSERT_EQ(tok.status, 0) << tok.err;
  std::string ids;
  for (const auto& id : nlohmann::json::parse(tok.out))
    ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
  const Cmd g = run(base + "--max-new-tokens 6");
  const Cmd r = run("run --model " + model_ + " --prompt-ids " + ids +
                    " --max-new-tokens 6 --ignore-eos --json");
  ASSERT_EQ(g.status, 0) << g.err;
  ASSERT_EQ(r.status, 0) << r.err;
  const auto jg = nlohmann::json::parse(g.out), jr = nlohmann::json::parse(r.out);
  ASSERT_LE(jg["tokens"].size(), 6u);
  for (size_t i = 0; i < jg["tokens"].size(); ++i)
    EXPECT_EQ(jg["tokens"][i], jr["generated"][i]) << i;
}

// --mmap (weights viewed in the file mapping) changes no token of `run` or `generate`.
TEST_F(TextCli, MmapChangesNoToken) {
  for (const std::string& cmd :
       {"run --model " + model_ + " --prompt-ids 5,9,2,7 --max-new-tokens 8 --ignore-eos --json",
        "generate --model " + model_ + " --prompt 'abc' --max-new-tokens 8 --seed 3 " +
            "--temperature 0.8 --json"}) {
    const Cmd a = run(cmd);
    const Cmd b = run(cmd + " --mmap");
    ASSERT_EQ(a.status, 0) << a.err;
    ASSERT_EQ(b.status, 0) << b.err;
    const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
    const char* key = ja.contains("generated") ? "generated" : "tokens";
    ASSERT_EQ(ja[key].size(), 8u) << cmd;
    EXPECT_EQ(ja[key], jb[key]) << cmd;
  }
}

TEST_F(TextCli, GenerateStreamsTextAndReportsSpeed) {
  const Cmd c = run("generate --model " + model_ + " --prompt 'abc' --max-new-tokens 5");
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_NE(c.err.find("tok/s"), std::string::npos) << c.err;
  EXPECT_EQ(c.err.find("loading"), std::string::npos)
      << "no progress when stderr is not a terminal";
}

TEST_F(TextCli, PromptLongerThanContextIsAnError) {
  const fs::path small = fs::path(model_ + "_ctx");
  fs::remove_all(small);
  fs::copy(model_, small);
  auto cfg = nlohmann::json::parse(std::ifstream(small / "config.json"));
  cfg["text_config"]["max_position_embeddings"] = 8;
  std::ofstream(small / "config.json") << cfg.dump();
  const Cmd c = run("generate --model " + small.string() +
                    " --prompt 'this prompt is longer than eight tokens' --max-new-tokens 2");
  EXPECT_NE(c.status, 0);
  EXPECT_NE(c.err.find("max_position_embeddings"), std::string::npos) << c.err;
  fs::remove_all(small);
}

TEST_F(TextCli, MissingTokenizerIsAnError) {
  const Cmd c =
      run("generate --model " + model_ + " --tokenizer /nonexistent/tiktoken.model --prompt x");
  EXPECT_NE(c.status, 0);
  EXPECT_NE(c.err.find("/nonexistent/tiktoken.model"), std::string::npos) << c.err;
}

TEST_F(TextCli, BadSamplingFlagIsAnError) {
  const Cmd c = run("generate --model " + model_ + " --prompt x --top-p 1.5");
  EXPECT_NE(c.status, 0);
  EXPECT_NE(c.err.find("top_p"), std::string::npos) << c.err;
}

// `bench --json` reports every field issue 5 asks for, consistent with each other: median
// between min and max, the roofline fraction = achieved / probe, shares of decode time in
// [0, 1] whose sum stays below 1 (the dense and MXFP4 projection batches and the AttnRes reads
// are disjoint parts of the decode), and GB/s = bytes / seconds of each projection kind.
TEST_F(TextCli, BenchJsonReportsConsistentFields) {
  const Cmd c =
      run("bench --model " + model_ + " --prompt-tokens 5 --gen-tokens 6 --reps 2 --json");
  ASSERT_EQ(c.status, 0) << c.err;
  const auto j = nlohmann::json::parse(c.out);
  for (const char* key :
       {"prefill_tok_s", "prefill_cold_tok_s", "decode_tok_s", "decode_tok_s_min",
        "decode_tok_s_max", "bytes_per_token", "stream_gb_s", "achieved_gb_s", "peak_rss_bytes"})
    EXPECT_GT(j.at(key).get<double>(), 0.0) << key;
  EXPECT_LE(j["decode_tok_s_min"].get<double>(), j["decode_tok_s"].get<double>());
  EXPECT_LE(j["decode_tok_s"].get<double>(), j["decode_tok_s_max"].get<double>());
  // The roofline is the better of the probes before and after the repetitions.
  EXPECT_DOUBLE_EQ(j["stream_gb_s"].get<double>(), std::max(j["stream_gb_s_before"].get<double>(),
                                                            j["stream_gb_s_after"].get<double>()));
  EXPECT_NEAR(j["roofline_fraction"].get<double>(),
              j["achieved_gb_s"].get<double>() / j["stream_gb_s"].get<double>(), 1e-9);
  // A probe that read less than decode streamed is flagged, never silently a roofline above 1.
  EXPECT_EQ(j["probe_below_decode"].get<bool>(),
            j["achieved_gb_s"].get<double>() > j["stream_gb_s"].get<double>());
  EXPECT_NEAR(j["achieved_gb_s"].get<double>(),
              j["bytes_per_token"].get<double>() * j["decode_tok_s"].get<double>() * 1e-9, 1e-6);
  double sum = 0;
  for (const char* key : {"attnres_share", "dense_proj_share", "mxfp4_proj_share"}) {
    const double v = j.at(key).get<double>();
    EXPECT_GE(v, 0.0) << key;
    EXPECT_LE(v, 1.0) << key;
    sum += v;
  }
  EXPECT_LT(sum, 1.0);
  // The tiny model has dense projections and MXFP4 experts: both kinds ran and were timed.
  EXPECT_GT(j["dense_proj_share"].get<double>(), 0.0);
  EXPECT_GT(j["mxfp4_proj_share"].get<double>(), 0.0);
  EXPECT_GT(j["dense_proj_gb_s"].get<double>(), 0.0);
  EXPECT_GT(j["mxfp4_proj_gb_s"].get<double>(), 0.0);
  // Each phase's GB/s against the probe, and decode against the sustained read of the same run.
  EXPECT_NEAR(j["dense_proj_roofline_fraction"].get<double>(),
              j["dense_proj_gb_s"].get<double>() / j["stream_gb_s"].get<double>(), 1e-9);
  EXPECT_NEAR(j["mxfp4_proj_roofline_fraction"].get<double>(),
              j["mxfp4_proj_gb_s"].get<double>() / j["stream_gb_s"].get<double>(), 1e-9);
  // The rest of decode time: what the two projection shares leave, and its time per token.
  EXPECT_NEAR(j["decode_rest_share"].get<double>(),
              1.0 - j["dense_proj_share"].get<double>() - j["mxfp4_proj_share"].get<double>(),
              1e-9);
  EXPECT_GT(j["decode_rest_share"].get<double>(), 0.0);
  EXPECT_NEAR(j["decode_rest_ms_per_token"].get<double>(),
              1e3 * j["decode_rest_share"].get<double>() / j["decode_tok_s"].get<double>(), 1e-9);
  EXPECT_GT(j["sustained_read_gb_s"].get<double>(), 0.0);
  EXPECT_NEAR(j["sustained_read_fraction"].get<double>(),
              j["achieved_gb_s"].get<double>() / j["sustained_read_gb_s"].get<double>(), 1e-9);
  // Prefill against the compute peak (issue 17): the fraction is the achieved rate over the
  // peak, and the prefill's phase shares are a partition of its time.
  for (const char* key : {"prefill_flops_per_token", "peak_gflops", "prefill_compute_fraction",
                          "prefill_dense_gflop_s", "prefill_mxfp4_gflop_s"})
    EXPECT_GT(j.at(key).get<double>(), 0.0) << key;
  EXPECT_NEAR(j["prefill_compute_fraction"].get<double>(),
              j["prefill_tok_s"].get<double>() * j["prefill_flops_per_token"].get<double>() * 1e-9 /
                  j["peak_gflops"].get<double>(),
              1e-9);
  // The peak is the better of a probe before and one after the repetitions.
  EXPECT_DOUBLE_EQ(j["peak_gflops"].get<double>(), std::max(j["peak_gflops_before"].get<double>(),
                                                            j["peak_gflops_after"].get<double>()));
  EXPECT_NEAR(j["prefill_dense_share"].get<double>() + j["prefill_mxfp4_share"].get<double>() +
                  j["prefill_rest_share"].get<double>(),
              1.0, 1e-9);
  for (const char* key : {"prefill_dense_share", "prefill_mxfp4_share", "prefill_rest_share"}) {
    EXPECT_GT(j.at(key).get<double>(), 0.0) << key;
    EXPECT_LT(j.at(key).get<double>(), 1.0) << key;
  }
  // The weights were read into memory (no --mmap), into one chunk for the tiny model: its huge
  // pages hold them and at most the rest of the last 2 MiB page they touch.
  const int64_t in_memory = j["weights_in_memory_bytes"].get<int64_t>();
  const int64_t huge = j["weights_huge_page_bytes"].get<int64_t>();
  EXPECT_GT(in_memory, 0);
  EXPECT_GE(huge, 0);
  EXPECT_LE(huge, in_memory + (int64_t{2} << 20));
}

TEST_F(TextCli, BenchBadArgumentsAreErrors) {
  const Cmd missing = run("bench --model /nonexistent/model-dir --reps 1");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.err.find("/nonexistent/model-dir"), std::string::npos) << missing.err;
  const Cmd reps = run("bench --model " + model_ + " --reps 0");
  EXPECT_NE(reps.status, 0);
  EXPECT_NE(reps.err.find("--reps"), std::string::npos) << reps.err;
  const Cmd dtype = run("bench --model " + model_ + " --dtype fp8");
  EXPECT_NE(dtype.status, 0);
  EXPECT_NE(dtype.err.find("fp8"), std::string::npos) << dtype.err;
}

TEST_F(TextCli, ChatKeepsHistoryResetsAndExits) {
  const Cmd c = run("chat --model " + model_ + " --max-new-tokens 4 --thinking off",
                    "hi there\nand again\n/reset\nhello\n/exit\nnever read\n");
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_NE(c.out.find("(history cleared)"), std::string::npos) << c.out;
}

}  // namespace
