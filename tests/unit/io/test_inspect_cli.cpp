// `attnres inspect MODEL_DIR [--json]` end to end: runs the built binary.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>

#include "io_test_util.h"

namespace attnres {
namespace {

using namespace attnres::testing;

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

RunResult run_cli(const std::string& args, const TempDir& tmp) {
  const std::string out = tmp.file("stdout.txt"), err = tmp.file("stderr.txt");
  const std::string cmd =
      std::string("'") + ATTNRES_CLI_PATH + "' " + args + " >'" + out + "' 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_bytes(out);
  r.err = read_bytes(err);
  return r;
}

TEST(InspectCli, GoldenModelJson) {
  TempDir tmp;
  const RunResult r = run_cli("inspect '" + golden_dir("tiny-a") + "' --json", tmp);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["num_layers"], 13);
  EXPECT_EQ(j["hidden_size"], 128);
  EXPECT_EQ(j["bank_slots"], 5);
  EXPECT_EQ(j["max_sources"], 6);
  ASSERT_EQ(j["layers"].size(), 13u);
  EXPECT_EQ(j["layers"][3]["attention"], "mla");
  EXPECT_EQ(j["layers"][0]["ffn"], "dense");
  EXPECT_EQ(j["layers"][9]["commit_slot"], 3);
  EXPECT_TRUE(j["layers"][10]["commit_slot"].is_null());
  EXPECT_EQ(j["extra_tensors"], 0);
  EXPECT_EQ(j["weights"]["tensors_bound"], 1492);
  // 274 BF16, 66 F32, 1152 U8 tensors (README); U8 elements are the experts' packed + scales.
  const int64_t u8 = j["params_by_dtype"]["U8"];
  EXPECT_EQ(u8, 12 * 16 * (96 * 32 + 96 * 2 + 64 * 48 + 64 * 3 + 96 * 32 + 96 * 2));
  EXPECT_EQ(j["bytes_by_dtype"]["U8"], u8);
  EXPECT_EQ(j["weights"]["params_by_part"]["routed_experts"]["params"], 12 * 16 * 3 * 96 * 64);
  // The parts cover every bound byte exactly once.
  int64_t part_bytes = 0;
  for (const auto& [part, c] : j["weights"]["params_by_part"].items())
    part_bytes += c["bytes"].get<int64_t>();
  EXPECT_EQ(part_bytes, j["weights"]["bytes_bound"].get<int64_t>());
  EXPECT_EQ(j["weights"]["params_by_part"]["attn_res"]["params"], (13 * 2 + 1) * 2 * 128);
}

TEST(InspectCli, GoldenModelText) {
  TempDir tmp;
  const RunResult r = run_cli("inspect '" + golden_dir("tiny-b") + "'", tmp);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("1990 bound, 0 missing, 0 extra"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("BF16"), std::string::npos);
}

TEST(InspectCli, BrokenModelFailsNamingTheTensor) {
  TempDir tmp;
  const std::string name = std::string(kLm) + "layers.5.self_attn.o_proj.weight";
  golden_with_header_edit("tiny-a", tmp.path(), [&](nlohmann::json& h) { h.erase(name); });
  const RunResult r = run_cli("inspect '" + tmp.path() + "' --json", tmp);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(name), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("missing_tensor"), std::string::npos) << r.err;
}

TEST(InspectCli, ConfigOnlyStillWorks) {
  TempDir tmp;
  const RunResult r = run_cli(
      "inspect --json --config '" + std::string(ATTNRES_FIXTURES_DIR) + "/kimi-k3-config.json'",
      tmp);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["num_layers"], 93);
  EXPECT_EQ(j["bank_slots"], 8);
  EXPECT_FALSE(j.contains("weights"));
}

}  // namespace
}  // namespace attnres
