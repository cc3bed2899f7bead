// Python and jinja2 value formatting that Kimi-K3's chat template relies on.
//
// The template is rendered by jinja2 the way Hugging Face transformers configures it
// (transformers/utils/chat_template_utils.py, _compile_jinja_template): its `tojson` filter is
// replaced by `json.dumps(x, ensure_ascii=..., indent=None, separators=None, sort_keys=False)`, so
// there is no HTML escaping of `<`, `>`, `&`, `'` (jinja2's built-in tojson does escape them, but
// it rejects the template's `tojson(ensure_ascii=false)` call with a TypeError, so the published
// template cannot be rendered with it at all). These functions reproduce that output byte for
// byte for JSON values as nlohmann parses them:
//   - python_json_dumps: json.dumps(v, ensure_ascii=False): ", " and ": " separators, keys in
//     their stored order, strings escaped as Python does (`"`, `\`, \b \f \n \r \t, other
//     characters below U+0020 as \u00xx, everything else raw), floats as float.__repr__
//     (shortest round-trip digits; exponent form when the decimal exponent is < -4 or >= 16;
//     "Infinity", "-Infinity", "NaN"), integers in decimal.
//   - json_sorted: the template's json_sorted macro: compact (",", ":"), every mapping's keys
//     in jinja2 `dictsort` order (stable sort on Python's key.lower()), arrays in order.
// Known difference: an integer literal beyond 64 bits is a double in nlohmann (Python keeps it
// exact), and str.lower()'s final-sigma rule is not applied (it only changes the order of keys
// that differ in a word-final capital sigma alone).
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace attnres {

// Python json.dumps(value, ensure_ascii=False) with its default separators.
std::string python_json_dumps(const nlohmann::ordered_json& value);
// The chat template's json_sorted macro (compact JSON, keys in dictsort order at every level).
std::string json_sorted(const nlohmann::ordered_json& value);
// A JSON string literal as json.dumps(s, ensure_ascii=False) writes it, appended to `out`.
void append_python_json_string(std::string_view s, std::string& out);
// Python repr(float(x)).
std::string python_float_repr(double x);
// Python str.lower() (Unicode 14.0, per code point, without the final-sigma rule). Bytes that are
// not valid UTF-8 are copied unchanged.
std::string python_lower(std::string_view utf8);
// Python str.strip() and `not s.strip()`.
std::string_view python_strip(std::string_view utf8);
bool python_is_blank(std::string_view utf8);

}  // namespace attnres
