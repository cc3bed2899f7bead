// Properties that hold for any input: encoding random bytes (valid or not) and decoding gives the
// bytes back under every pattern, and concurrent encoding from several threads gives the same
// ids as one thread (the tokenizer is shared, its match scratch is per thread).
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <thread>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace attnres {
namespace {

const std::string kSynth = std::string(ATTNRES_FIXTURES_DIR) + "/tokenizer/synthetic";

std::string random_text(std::mt19937& rng) {
  static const std::string atoms[] = {
      "a",    "Z",        " ",    "  ",       "\n",      "\r\n", "\t",           "1",
      "42",   "'s",       "é",    "你",       "、",      "🚀",    "\xe2\x80\x8d", "\xff",
      "\xc3", "\xe4\xbd", "\x80", "<|open|>", "message", "!",    "\u3000"};
  std::string s;
  const size_t n = rng() % 40;
  for (size_t i = 0; i < n; ++i) {
    if (rng() % 8 == 0) {
      s.push_back(static_cast<char>(rng() % 256));  // any byte at all
    } else {
      s += atoms[rng() % std::size(atoms)];
    }
  }
  return s;
}

TEST(TokenizerRobust, RandomBytesRoundTripUnderEveryPattern) {
  for (PreTokenizer pre :
       {PreTokenizer::kKimi, PreTokenizer::kO200kBase, PreTokenizer::kCl100kBase}) {
    // The synthetic ranks are a full byte-level table, so they serve every pattern.
    auto ranks = RankTable::load(kSynth + "/tiktoken.model");
    ASSERT_TRUE(ranks.is_ok());
    auto t = Tokenizer::create(std::move(ranks).value(), {{"<|open|>", 1000}}, pre, "synthetic");
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    auto splitter = Splitter::create(pre);
    ASSERT_TRUE(splitter.is_ok());
    std::mt19937 rng(17);
    for (int iter = 0; iter < 1000; ++iter) {
      const std::string text = random_text(rng);
      for (bool special : {false, true}) {
        auto ids = t->encode(text, special);
        ASSERT_TRUE(ids.is_ok()) << ids.status().to_string();
        auto back = t->decode_bytes(*ids);
        ASSERT_TRUE(back.is_ok());
        ASSERT_EQ(*back, text) << pretokenizer_name(pre) << " iter " << iter;
        if (!special) {
          for (TokenId id : *ids) ASSERT_FALSE(t->is_special(id));
        }
      }
      // Pieces cover the text exactly, in order.
      std::vector<std::string_view> pieces;
      ASSERT_TRUE(splitter->split(text, pieces).is_ok());
      std::string joined;
      for (auto p : pieces) {
        ASSERT_FALSE(p.empty());
        joined.append(p);
      }
      ASSERT_EQ(joined, text);
    }
  }
}

TEST(TokenizerRobust, ConcurrentEncodingMatchesSerial) {
  auto t = Tokenizer::load(kSynth, PreTokenizer::kKimi);
  ASSERT_TRUE(t.is_ok());
  std::mt19937 rng(5);
  std::vector<std::string> texts(400);
  for (auto& s : texts) s = random_text(rng);
  std::vector<std::vector<TokenId>> serial;
  for (const auto& s : texts) serial.push_back(*t->encode(s, true));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (size_t i = static_cast<size_t>(w); i < texts.size() * 4; i += 4) {
        const size_t k = (i * 7919) % texts.size();
        if (*t->encode(texts[k], true) != serial[k]) ++mismatches[w];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

// Special files where the rank file or tokenizer_config.json should be: an error naming the
// file, never a wait for a FIFO's writer.
TEST(TokenizerRobust, SpecialFilesAreRefusedWithoutBlocking) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("attnres_tok_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ASSERT_EQ(::mkfifo((dir / "tiktoken.model").c_str(), 0644), 0);
  auto t = Tokenizer::load(dir.string(), PreTokenizer::kKimi);
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.status().message().find("tokenizer rank file is a FIFO, expected a regular file"),
            std::string::npos)
      << t.status().message();
  fs::remove(dir / "tiktoken.model");
  fs::copy_file(kSynth + "/tiktoken.model", dir / "tiktoken.model");
  fs::create_directory(dir / "tokenizer_config.json");
  auto c = Tokenizer::load(dir.string(), PreTokenizer::kKimi);
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("tokenizer config is a directory"), std::string::npos)
      << c.status().message();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace attnres
