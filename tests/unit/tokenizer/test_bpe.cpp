// Rank-file loading (every malformed-input kind is a named error), base64, and the BPE merge
// against its scalar twin.
#include <gtest/gtest.h>

#include <random>

#include "tokenizer/bpe.h"

namespace attnres {
namespace {

std::string byte_lines() {
  std::string s;
  for (int b = 0; b < 256; ++b)
    s += base64_encode(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  return s;
}

TEST(Base64, RoundTripsAndRejectsGarbage) {
  std::string out;
  for (std::string s : {"", "a", "ab", "abc", "abcd", "\xff\x00\x80"}) {
    const std::string enc = base64_encode(s);
    if (s.empty()) continue;
    ASSERT_TRUE(base64_decode(enc, out)) << enc;
    EXPECT_EQ(out, s);
  }
  EXPECT_EQ(base64_encode("!"), "IQ==");
  EXPECT_FALSE(base64_decode("IQ=", out));   // length not a multiple of 4
  EXPECT_FALSE(base64_decode("I*==", out));  // bad character
  EXPECT_FALSE(base64_decode("", out));
  EXPECT_FALSE(base64_decode("=Q==", out));  // padding in the wrong place
}

TEST(RankTable, ParsesAndLooksUp) {
  auto t = RankTable::parse(
      byte_lines() + base64_encode("ab") + " 256\n\n" + base64_encode("abc") + " 300\r\n", "mem");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->size(), 258u);
  EXPECT_EQ(t->find("ab"), 256);
  EXPECT_EQ(t->find("abc"), 300);
  EXPECT_EQ(t->find("abcd"), -1);
  EXPECT_EQ(t->bytes(300), "abc");
  EXPECT_TRUE(t->is_token(256));
  EXPECT_FALSE(t->is_token(257));  // a hole between ranks
  EXPECT_EQ(t->bytes(257), "");
  EXPECT_EQ(t->max_rank(), 300);
}

struct BadCase {
  const char* what;
  std::string extra;  // appended after the 256 byte lines (lines 257...)
  ErrorCode code;
  const char* message_part;
};

TEST(RankTable, MalformedFilesNameTheLine) {
  const std::vector<BadCase> cases = {
      {"bad base64", "a*b= 256\n", ErrorCode::kInvalidValue, "mem:257: token is not valid base64"},
      {"bad rank", base64_encode("ab") + " 25x\n", ErrorCode::kInvalidValue,
       "mem:257: rank must be"},
      {"negative rank", base64_encode("ab") + " -1\n", ErrorCode::kInvalidValue, "mem:257: rank"},
      {"huge rank", base64_encode("ab") + " 99999999999\n", ErrorCode::kInvalidValue, "mem:257"},
      {"three fields", base64_encode("ab") + " 256 7\n", ErrorCode::kInvalidValue,
       "mem:257: expected"},
      {"one field", base64_encode("ab") + "\n", ErrorCode::kInvalidValue, "mem:257: expected"},
      {"duplicate rank", base64_encode("ab") + " 65\n", ErrorCode::kInconsistent,
       "mem:257: duplicate rank 65 (also on line 66)"},
      {"duplicate token", base64_encode("A") + " 256\n", ErrorCode::kInconsistent,
       "duplicate token bytes"},
  };
  for (const BadCase& c : cases) {
    auto t = RankTable::parse(byte_lines() + c.extra, "mem");
    ASSERT_FALSE(t.is_ok()) << c.what;
    EXPECT_EQ(t.status().code(), c.code) << c.what << ": " << t.status().to_string();
    EXPECT_NE(t.status().message().find(c.message_part), std::string::npos)
        << c.what << ": " << t.status().message();
  }
  auto empty = RankTable::parse("\n\n", "mem");
  ASSERT_FALSE(empty.is_ok());
  EXPECT_NE(empty.status().message().find("empty"), std::string::npos);
  auto missing_byte = RankTable::parse("QQ== 0\n", "mem");
  ASSERT_FALSE(missing_byte.is_ok());
  EXPECT_NE(missing_byte.status().message().find("single byte 0x00 has no rank"), std::string::npos)
      << missing_byte.status().message();
  auto missing_file = RankTable::load("/nonexistent/tiktoken.model");
  ASSERT_FALSE(missing_file.is_ok());
  EXPECT_EQ(missing_file.status().code(), ErrorCode::kIoError);
  EXPECT_NE(missing_file.status().message().find("/nonexistent/tiktoken.model"), std::string::npos);
}

// A table with merges that make the merge order matter: several tokens overlap and ranks are
// not monotone in length.
RankTable merge_table() {
  std::string s = byte_lines();
  const char* merges[] = {"ab",   "bc",  "abc",  "ca", "bca", "aa", "aaa",
                          "aaaa", "cab", "abca", "bb", "b b", " b"};
  int rank = 256;
  for (const char* m : merges) s += base64_encode(m) + " " + std::to_string(rank++) + "\n";
  auto t = RankTable::parse(s, "merges");
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  return std::move(t).value();
}

TEST(BytePairEncode, KnownMerges) {
  const RankTable t = merge_table();
  BpeScratch scratch;
  std::vector<TokenId> out;
  byte_pair_encode(t, "abc", scratch, out);  // whole piece is a token
  EXPECT_EQ(out, std::vector<TokenId>{258});
  out.clear();
  byte_pair_encode(t, "abcab", scratch, out);  // ab(256) first, then ... per rank order
  EXPECT_EQ(out, byte_pair_encode_ref(t, "abcab"));
  std::string joined;
  for (TokenId id : out) joined += t.bytes(id);
  EXPECT_EQ(joined, "abcab");
  out.clear();
  byte_pair_encode(t, "", scratch, out);
  EXPECT_TRUE(out.empty());
}

// The linear and heap paths against tiktoken's algorithm on random pieces over a small alphabet
// (many merge opportunities), lengths up to 600 so both paths run.
TEST(BytePairEncode, FastPathsEqualReference) {
  const RankTable t = merge_table();
  std::mt19937 rng(7);
  BpeScratch scratch;
  for (int iter = 0; iter < 400; ++iter) {
    const size_t len = iter < 300 ? rng() % 40 : 100 + rng() % 500;
    std::string piece;
    for (size_t i = 0; i < len; ++i) piece.push_back("abc b\xff"[rng() % 6]);
    std::vector<TokenId> fast;
    byte_pair_encode(t, piece, scratch, fast);
    ASSERT_EQ(fast, byte_pair_encode_ref(t, piece)) << "piece of length " << len;
  }
}

}  // namespace
}  // namespace attnres
