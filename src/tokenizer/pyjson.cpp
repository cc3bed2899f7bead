// Python/jinja2 value formatting for the chat template; see pyjson.h for the contract.
#include "tokenizer/pyjson.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <vector>

#include "tokenizer/unicode_lower.h"
#include "tokenizer/utf8.h"

namespace attnres {
namespace {

using Json = nlohmann::ordered_json;

void append_scalar(const Json& v, std::string& out) {
  switch (v.type()) {
    case Json::value_t::null:
      out += "null";
      return;
    case Json::value_t::boolean:
      out += v.get<bool>() ? "true" : "false";
      return;
    case Json::value_t::number_integer:
      out += std::to_string(v.get<int64_t>());
      return;
    case Json::value_t::number_unsigned:
      out += std::to_string(v.get<uint64_t>());
      return;
    case Json::value_t::number_float:
      out += python_float_repr(v.get<double>());
      return;
    case Json::value_t::string:
      append_python_json_string(v.get_ref<const std::string&>(), out);
      return;
    default:
      // Binary and discarded values have no JSON text; callers pass parsed JSON only.
      out += "null";
      return;
  }
}

void dumps(const Json& v, std::string& out) {
  if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ", ";
      dumps(v[i], out);
    }
    out += ']';
  } else if (v.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [k, x] : v.items()) {
      if (!first) out += ", ";
      first = false;
      append_python_json_string(k, out);
      out += ": ";
      dumps(x, out);
    }
    out += '}';
  } else {
    append_scalar(v, out);
  }
}

void sorted(const Json& v, std::string& out) {
  if (v.is_object()) {
    // jinja2 dictsort: sorted(items, key=lambda kv: kv[0].lower()), a stable sort.
    struct Item {
      std::string sort_key;
      Json::const_iterator it;
    };
    std::vector<Item> items;
    items.reserve(v.size());
    for (auto it = v.begin(); it != v.end(); ++it) items.push_back({python_lower(it.key()), it});
    std::stable_sort(items.begin(), items.end(),
                     [](const Item& a, const Item& b) { return a.sort_key < b.sort_key; });
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += ',';
      append_python_json_string(items[i].it.key(), out);
      out += ':';
      sorted(items[i].it.value(), out);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ',';
      sorted(v[i], out);
    }
    out += ']';
  } else {
    append_scalar(v, out);
  }
}

// The lowercase of one code point, appended as UTF-8.
void append_lower(uint32_t cp, std::string& out) {
  for (const auto& m : unicode_lower::kLowerMulti) {
    if (m.code_point == cp) {
      for (uint32_t c : m.lower)
        if (c) append_utf8(c, out);
      return;
    }
  }
  const auto* begin = std::begin(unicode_lower::kLowerRuns);
  const auto* end = std::end(unicode_lower::kLowerRuns);
  const auto* run = std::upper_bound(
      begin, end, cp, [](uint32_t c, const unicode_lower::Run& r) { return c < r.first; });
  if (run != begin) {
    --run;
    const uint32_t off = cp - run->first;
    if (off % run->stride == 0 && off / run->stride < run->count) {
      append_utf8(static_cast<uint32_t>(static_cast<int64_t>(cp) + run->delta), out);
      return;
    }
  }
  append_utf8(cp, out);
}

}  // namespace

std::string python_json_dumps(const Json& value) {
  std::string out;
  dumps(value, out);
  return out;
}

std::string json_sorted(const Json& value) {
  std::string out;
  sorted(value, out);
  return out;
}

void append_python_json_string(std::string_view s, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

// CPython's float_repr_style "short" (Python/pystrtod.c, format_float_short with mode 'r'):
// the shortest digits that round-trip, written with an exponent when the decimal point position
// decpt (value = 0.DIGITS x 10^decpt) is <= -4 or > 16, else positionally with ".0" when integral.
std::string python_float_repr(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x < 0 ? "-Infinity" : "Infinity";
  char buf[64];
  // Shortest round-trip digits in the form d[.ddd]e[+-]XX (C++17 to_chars, like David Gay's
  // mode 0: the closest of the shortest representations).
  const auto r = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(r.ptr - buf));
  std::string out;
  if (sci.front() == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e))
    if (c != '.') digits += c;
  int exp10 = 0;
  std::from_chars(sci.data() + e + 1 + (sci[e + 1] == '+' ? 1 : 0), sci.data() + sci.size(), exp10);
  if (digits == "0") {  // zero (to_chars writes 0e+00)
    out += "0.0";
    return out;
  }
  const int ndigits = static_cast<int>(digits.size());
  const int decpt = exp10 + 1;
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (ndigits > 1) {
      out += '.';
      out += digits.substr(1);
    }
    const int ex = decpt - 1;
    out += ex < 0 ? "e-" : "e+";
    const std::string mag = std::to_string(ex < 0 ? -ex : ex);
    if (mag.size() < 2) out += '0';
    out += mag;
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (decpt >= ndigits) {
    out += digits;
    out.append(static_cast<size_t>(decpt - ndigits), '0');
    out += ".0";
  } else {
    out += digits.substr(0, static_cast<size_t>(decpt));
    out += '.';
    out += digits.substr(static_cast<size_t>(decpt));
  }
  return out;
}

std::string python_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const Utf8Step st = utf8_step(s, i);
    if (!st.ok) {
      out.append(s.substr(i, st.length));
    } else if (st.codepoint < 0x80) {
      const char c = s[i];
      out += (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c;
    } else {
      append_lower(st.codepoint, out);
    }
    i += st.length;
  }
  return out;
}

std::string_view python_strip(std::string_view s) {
  size_t begin = s.size();
  size_t end = 0;
  for (size_t i = 0; i < s.size();) {
    const Utf8Step st = utf8_step(s, i);
    if (!st.ok || !python_isspace(st.codepoint)) {
      begin = std::min(begin, i);
      end = i + st.length;
    }
    i += st.length;
  }
  return begin >= end ? std::string_view() : s.substr(begin, end - begin);
}

bool python_is_blank(std::string_view s) {
  return python_strip(s).empty();
}

}  // namespace attnres
