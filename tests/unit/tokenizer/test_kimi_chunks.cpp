// Kimi's input chunking (tokenization_kimi.py encode): 400,000-character chunks, then cuts where a
// run of whitespace or of non-whitespace (Python str.isspace) exceeds 25,000 characters. Checked
// on the rule itself with small limits, and end to end: a 30,000-letter run encodes as its first
// 25,000 letters followed by the remaining 5,000, each encoded alone.
#include <gtest/gtest.h>

#include "tokenizer/tokenizer.h"

namespace attnres {
namespace {

std::vector<std::string> chunks(std::string_view text, size_t max_chunk, size_t max_run) {
  std::vector<std::string> out;
  for (std::string_view v : kimi_chunks(text, max_chunk, max_run)) out.emplace_back(v);
  return out;
}

TEST(KimiChunks, RunsLongerThanTheLimitAreCut) {
  using V = std::vector<std::string>;
  EXPECT_EQ(chunks("abcdefg", 100, 3), (V{"abc", "def", "g"}));
  EXPECT_EQ(chunks("ab  cd", 100, 3), (V{"ab  cd"}));        // no run exceeds 3
  EXPECT_EQ(chunks("a     b", 100, 3), (V{"a   ", "  b"}));  // the space run is cut after 3
  // Characters are code points, not bytes; U+3000 and U+001C are Python whitespace.
  EXPECT_EQ(chunks("你好世界", 100, 2), (V{"你好", "世界"}));
  EXPECT_EQ(chunks("x\u3000\u3000\x1c\x1cy", 100, 3), (V{"x\u3000\u3000\x1c", "\x1cy"}));
  // 400k chunks first, then runs within each chunk (the run count restarts per chunk).
  EXPECT_EQ(chunks("abcdefgh", 5, 3), (V{"abc", "de", "fgh"}));
  EXPECT_EQ(chunks("", 5, 3), (V{""}));
  // Below both limits nothing is cut.
  EXPECT_EQ(chunks("hello world", 400000, 25000), (V{"hello world"}));
}

TEST(KimiChunks, EncodeCutsA30000LetterRun) {
  const std::string synth = std::string(ATTNRES_FIXTURES_DIR) + "/tokenizer/synthetic";
  auto t = Tokenizer::load(synth, PreTokenizer::kKimi);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  // "message" is one token, so without the cut no token boundary could fall at byte 25,000
  // (not a multiple of 7); with it, one must.
  ASSERT_EQ(t->encode("message", false)->size(), 1u);
  std::string run;
  while (run.size() < 30000) run += "message";
  run.resize(30000);
  auto whole = t->encode(run, false);
  ASSERT_TRUE(whole.is_ok());
  std::vector<TokenId> expect = *t->encode(run.substr(0, 25000), false);
  const std::vector<TokenId> tail = *t->encode(run.substr(25000), false);
  expect.insert(expect.end(), tail.begin(), tail.end());
  EXPECT_EQ(*whole, expect);
  size_t bytes = 0;
  bool boundary_at_cut = false;
  for (TokenId id : *whole) {
    bytes += t->token_bytes(id)->size();
    boundary_at_cut = boundary_at_cut || bytes == 25000;
  }
  EXPECT_TRUE(boundary_at_cut);
  EXPECT_EQ(*t->decode(*whole), run);
}

}  // namespace
}  // namespace attnres
