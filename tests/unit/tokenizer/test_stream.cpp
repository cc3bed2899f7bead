// UTF-8 handling at token boundaries: the lossy decoder follows the maximal-subpart practice,
// the streaming decoder equals the one-shot decoder for every way of cutting the bytes, and the
// stop-string matcher never shows a stop string, even one split across chunks.
#include <gtest/gtest.h>

#include <random>

#include "tokenizer/stop.h"
#include "tokenizer/utf8.h"

namespace attnres {
namespace {

const std::string kFffd = "\xef\xbf\xbd";

TEST(Utf8, LossyFollowsMaximalSubparts) {
  EXPECT_EQ(utf8_lossy("abc"), "abc");
  EXPECT_EQ(utf8_lossy("\xe4\xbd\xa0"), "\xe4\xbd\xa0");  // 你
  EXPECT_EQ(utf8_lossy("\xff"), kFffd);
  EXPECT_EQ(utf8_lossy("\xe4\xbd"), kFffd);  // truncated: one replacement
  EXPECT_EQ(utf8_lossy("\xe4\xbd"
                       "a"),
            kFffd + "a");                                        // interrupted
  EXPECT_EQ(utf8_lossy("\xc0\xaf"), kFffd + kFffd);              // overlong: C0 never starts one
  EXPECT_EQ(utf8_lossy("\xed\xa0\x80"), kFffd + kFffd + kFffd);  // surrogate: ED A0 is ill-formed
  EXPECT_EQ(utf8_lossy("\xf4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);
  EXPECT_EQ(utf8_lossy("\xf0\x9f\x98"), kFffd);
  EXPECT_EQ(utf8_lossy("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
  EXPECT_TRUE(utf8_valid("héllo 🚀"));
  EXPECT_FALSE(utf8_valid("\x80"));
}

TEST(Utf8, StreamingEqualsOneShotForEveryCut) {
  std::mt19937 rng(3);
  const std::string alphabet[] = {"a",        "é",        "你",   "🚀",        "\xff",
                                  "\xe4\xbd", "\xf0\x9f", "\x80", "\xed\xa0", "\xc3"};
  for (int iter = 0; iter < 500; ++iter) {
    std::string bytes;
    const int parts = static_cast<int>(rng() % 12);
    for (int i = 0; i < parts; ++i) bytes += alphabet[rng() % std::size(alphabet)];
    Utf8StreamDecoder dec;
    std::string streamed;
    for (size_t i = 0; i < bytes.size();) {
      const size_t n = 1 + rng() % 3;
      streamed += dec.push(std::string_view(bytes).substr(i, n));
      EXPECT_LE(dec.pending_bytes(), 3u);
      i += n;
    }
    streamed += dec.flush();
    ASSERT_EQ(streamed, utf8_lossy(bytes)) << iter;
    EXPECT_TRUE(utf8_valid(streamed));
  }
}

TEST(Utf8, StreamingHoldsOnlyIncompleteSequences) {
  Utf8StreamDecoder dec;
  EXPECT_EQ(dec.push("a\xf0\x9f"), "a");  // emoji half: held
  EXPECT_EQ(dec.pending_bytes(), 2u);
  EXPECT_EQ(dec.push("\x98"), "");
  EXPECT_EQ(dec.push("\x80!"), "\xf0\x9f\x98\x80!");
  EXPECT_EQ(dec.push("\xff"), kFffd);  // can never become valid: flushed at once
  EXPECT_EQ(dec.push("\xe4"), "");
  EXPECT_EQ(dec.flush(), kFffd);  // end of stream with an incomplete sequence
  EXPECT_EQ(dec.pending_bytes(), 0u);
}

std::string run_matcher(StopStringMatcher& m, const std::vector<std::string>& chunks) {
  std::string out;
  for (const auto& c : chunks) out += m.push(c);
  return out + m.flush();
}

TEST(StopStrings, SplitAcrossChunksIsNeverShown) {
  StopStringMatcher m({"</answer>", "STOP"});
  EXPECT_EQ(m.push("The result is 4</an"), "The result is 4");  // "</an" held back
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("swer> and more"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "</answer>");
  EXPECT_EQ(m.push("ignored"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStrings, FalseStartIsReleased) {
  StopStringMatcher m({"STOP"});
  EXPECT_EQ(run_matcher(m, {"ST", "OP?"}), "");  // matched
  StopStringMatcher m2({"STOP"});
  EXPECT_EQ(run_matcher(m2, {"ST", "ART", " S"}), "START S");  // held "S" released at the end
  EXPECT_FALSE(m2.stopped());
  StopStringMatcher none;
  EXPECT_EQ(run_matcher(none, {"a", "b"}), "ab");
}

TEST(StopStrings, EarliestStopWins) {
  StopStringMatcher m({"world", "lo w"});
  EXPECT_EQ(run_matcher(m, {"hello world"}), "hel");
  EXPECT_EQ(m.matched(), "lo w");
}

// Cutting the text anywhere gives the same output as feeding it whole.
TEST(StopStrings, OutputIndependentOfChunking) {
  const std::string text = "abc<stop>def<st";
  for (size_t cut1 = 0; cut1 <= text.size(); ++cut1) {
    for (size_t cut2 = cut1; cut2 <= text.size(); ++cut2) {
      StopStringMatcher m({"<stop>"});
      const std::string out =
          run_matcher(m, {text.substr(0, cut1), text.substr(cut1, cut2 - cut1), text.substr(cut2)});
      ASSERT_EQ(out, "abc") << cut1 << "," << cut2;
    }
  }
}

}  // namespace
}  // namespace attnres
