// UTF-8 validation and lossy decoding; see utf8.h for the contract.
#include "tokenizer/utf8.h"

namespace attnres {

Utf8Step utf8_step(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char b0 = byte(pos);
  if (b0 < 0x80) return {1, b0, true, false};
  uint32_t need;
  unsigned char lo = 0x80, hi = 0xbf;  // allowed range of the second byte
  uint32_t cp;
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    need = 2;
    cp = b0 & 0x1f;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    need = 3;
    cp = b0 & 0x0f;
    if (b0 == 0xe0) lo = 0xa0;  // no overlong forms
    if (b0 == 0xed) hi = 0x9f;  // no surrogates
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    need = 4;
    cp = b0 & 0x07;
    if (b0 == 0xf0) lo = 0x90;  // no overlong forms
    if (b0 == 0xf4) hi = 0x8f;  // nothing above U+10FFFF
  } else {
    return {1, 0, false, false};  // 80..C1, F5..FF never start a sequence
  }
  for (uint32_t k = 1; k < need; ++k) {
    if (pos + k >= text.size()) return {k, 0, false, true};
    const unsigned char b = byte(pos + k);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xbf;
    if (b < l || b > h) return {k, 0, false, false};
    cp = (cp << 6) | (b & 0x3f);
  }
  return {need, cp, true, false};
}

bool utf8_valid(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const Utf8Step s = utf8_step(text, i);
    if (!s.ok) return false;
    i += s.length;
  }
  return true;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

// Python str.isspace(): bidirectional class WS, B or S, or general category Zs.
bool python_isspace(uint32_t cp) {
  if (cp >= 0x09 && cp <= 0x0d) return true;
  if (cp >= 0x1c && cp <= 0x20) return true;
  switch (cp) {
    case 0x85:
    case 0xa0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202f:
    case 0x205f:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200a;
  }
}

namespace {
constexpr std::string_view kReplacement = "\xef\xbf\xbd";  // U+FFFD

// Appends the decoded text of bytes[0, n) to out; returns the number of bytes consumed, which is
// less than n only when `hold_truncated` and the tail is an incomplete sequence.
size_t decode_into(std::string_view bytes, bool hold_truncated, std::string& out) {
  size_t i = 0;
  while (i < bytes.size()) {
    const Utf8Step s = utf8_step(bytes, i);
    if (s.ok) {
      out.append(bytes.substr(i, s.length));
    } else if (s.truncated && hold_truncated) {
      return i;
    } else {
      out.append(kReplacement);
    }
    i += s.length;
  }
  return i;
}
}  // namespace

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  decode_into(bytes, /*hold_truncated=*/false, out);
  return out;
}

std::string Utf8StreamDecoder::push(std::string_view bytes) {
  std::string out;
  if (pending_.empty()) {
    const size_t used = decode_into(bytes, /*hold_truncated=*/true, out);
    pending_.assign(bytes.substr(used));
    return out;
  }
  std::string joined = pending_;
  joined.append(bytes);
  const size_t used = decode_into(joined, /*hold_truncated=*/true, out);
  pending_ = joined.substr(used);
  return out;
}

std::string Utf8StreamDecoder::flush() {
  std::string out;
  decode_into(pending_, /*hold_truncated=*/false, out);
  pending_.clear();
  return out;
}

}  // namespace attnres
