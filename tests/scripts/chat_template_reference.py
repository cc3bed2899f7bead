#!/usr/bin/env python3
"""Reference renderings of the Kimi-K3 chat template for the C++ renderer's parity test.

Generates seeded random OpenAI chat-completions requests covering every feature the template
renders, turns each into the template's variables the way attnres's server does (chat.h:
parse_chat_request), renders it with jinja2 and writes one JSON object per line:

  {"case": N, "parse_string_arguments": bool, "features": [...], "request": {...},
   "text": RENDERED | null, "error": MESSAGE | null}

followed by one {"floats": [...]} line (repr() of edge and random doubles) and one
{"lower": [[code point, [lowercase code points]], ...]} line (every code point whose
str.lower() differs), which check the JSON number formatting and key sorting on their own.

jinja2 is configured as Hugging Face transformers configures it for chat templates
(transformers/utils/chat_template_utils.py, _compile_jinja_template): ImmutableSandboxedEnvironment
with trim_blocks, lstrip_blocks and loopcontrols, `raise_exception`, and `tojson` replaced by
json.dumps(x, ensure_ascii, indent, separators, sort_keys). That is the renderer vLLM and SGLang
feed the model; jinja2's built-in tojson cannot render this template (it takes no ensure_ascii).

Usage: chat_template_reference.py --template FILE --seed S --count N --out FILE
Needs only the standard library and jinja2 (Debian 12: python3-jinja2).
"""
import argparse
import copy
import json
import random
import struct
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def make_template(path):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    with open(path, encoding="utf-8") as f:
        return env.from_string(f.read())


# ---- the server's mapping from a request to the template's variables (chat.h) ----------------

EFFORTS = ("low", "high", "max")


def preprocess_messages(messages, parse_string_arguments):
    """String tool-call arguments parsed into objects (vLLM's _postprocess_messages; blank -> {})."""
    messages = copy.deepcopy(messages)
    if not parse_string_arguments:
        return messages
    for m in messages:
        if m.get("role") != "assistant" or not isinstance(m.get("tool_calls"), list):
            continue
        for call in m["tool_calls"]:
            fn = call["function"] if isinstance(call.get("function"), dict) else call
            args = fn.get("arguments")
            if isinstance(args, str):
                fn["arguments"] = json.loads(args) if args.strip() else {}
    return messages


def template_vars(request, parse_string_arguments):
    v = {"messages": preprocess_messages(request["messages"], parse_string_arguments)}
    for key in ("tools", "tool_choice", "response_format"):
        if request.get(key) is not None:
            v[key] = request[key]
    kw = request.get("chat_template_kwargs") or {}
    thinking, thinking_given = True, False
    if kw.get("thinking") is not None:
        thinking, thinking_given = kw["thinking"], True
    effort_given = "thinking_effort" in kw
    effort = kw.get("thinking_effort")
    effort_req = request.get("reasoning_effort")
    if effort_req == "none":
        if not thinking_given:
            thinking = False
    elif effort_req in EFFORTS and not effort_given:
        effort, effort_given = effort_req, True
    v["thinking"] = thinking
    if effort_given:
        v["thinking_effort"] = effort
    agp = request.get("add_generation_prompt")
    v["add_generation_prompt"] = True if agp is None else agp
    return v


# ---- random requests -------------------------------------------------------------------------

TEXT_ATOMS = [
    "hello", "world", "the weather", "Paris", "42", "3.14", " ", "  ", "\n", "\n\n", "\t",
    "中文", "天气很好", "日本語のテキスト", "한국어", "🚀", "👍🏽", "👨‍👩‍👧", "e\u0301", "é", "Ωμέγα",
    "Привет", "مرحبا", "שלום", "ñandú", "straße", "\u3000", "\u00a0", "\u2028", "\x01", "\x7f",
    "\x00", "<", ">", "&", "'", '"', "\\", "<b>bold</b>", "a & b", 'say "hi"', "it's",
    "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "<|open|>message role=\"system\"<|sep|>",
    "<|kimi_image_placeholder|>", "&amp;", "&quot;", "{\"json\": true}", "```json", "#", "$x",
]

KEYS = [
    "name", "Name", "NAME", "type", "Type", "description", "properties", "required", "items",
    "enum", "$ref", "$defs", "additionalProperties", "a", "B", "c", "_x", "x_1", "10", "2", "",
    "key with space", 'k"q', "k&a", "<tag>", "Ärger", "ärger", "école", "ÉCOLE", "İstanbul",
    "istanbul", "ß", "ẞ", "Ω", "ω", "Ǆ", "ǅ", "ǆ", "Ⅻ", "ⅻ", "Ⓐ", "ⓐ", "\U00010400", "\U00010428",
    "中文", "日本", "Zeta", "zeta", "émoji🚀", "ǈ", "Ꙁ",
]

TOOL_NAMES = ["get_weather", "search", "run_code", "lookup_user", "名字", 'a&b"c', "x.y-z", "f"]

FLOAT_EDGES = [0.0, -0.0, 1.0, -1.0, 0.1, 0.5, 2.5, 1e16, 1e15, 9999999999999998.0, 1e17,
               1.5e-5, 0.0001, 0.00001, 123456789.123, 1e308, 5e-324, 2.2250738585072014e-308,
               1e22, 1e21, 1.7976931348623157e308, 3.0, 100.0, 1e-7, 0.3, 2.0 ** 53, 2.0 ** 63]


def rand_text(r, allow_empty=True, n_max=8):
    n = r.randint(0 if allow_empty else 1, n_max)
    return "".join(r.choice(TEXT_ATOMS) for _ in range(n))


def rand_float(r):
    k = r.random()
    if k < 0.3:
        return r.choice(FLOAT_EDGES)
    if k < 0.6:
        return r.uniform(-1, 1) * 10.0 ** r.randint(-30, 30)
    while True:
        x = struct.unpack("<d", struct.pack("<Q", r.getrandbits(64)))[0]
        if x == x and abs(x) != float("inf"):
            return x


def rand_int(r):
    return r.choice([0, 1, -1, 7, 42, -273, 10 ** 6, 2 ** 53, 2 ** 53 + 1, 2 ** 63 - 1, -2 ** 63,
                     2 ** 64 - 1, r.randint(-10 ** 12, 10 ** 12)])


def rand_scalar(r):
    k = r.randrange(6)
    return [None, r.random() < 0.5, rand_int(r), rand_float(r), rand_text(r), rand_text(r)][k]


def rand_value(r, depth=0):
    k = r.random()
    if depth >= 3 or k < 0.55:
        return rand_scalar(r)
    if k < 0.75:
        return [rand_value(r, depth + 1) for _ in range(r.randint(0, 4))]
    return {r.choice(KEYS): rand_value(r, depth + 1) for _ in range(r.randint(0, 5))}


def rand_schema(r, depth=0):
    kind = r.choice(["object", "string", "number", "integer", "boolean", "array"] if depth < 3
                    else ["string", "number", "boolean"])
    s = {"type": kind}
    if r.random() < 0.6:
        s["description"] = rand_text(r, False, 5)
    if kind == "object":
        props = {}
        for _ in range(r.randint(0, 4)):
            props[r.choice(KEYS)] = rand_schema(r, depth + 1)
        s["properties"] = props
        if props and r.random() < 0.7:
            s["required"] = r.sample(list(props), r.randint(1, len(props)))
        if r.random() < 0.3:
            s["additionalProperties"] = r.random() < 0.5
    elif kind == "array":
        s["items"] = rand_schema(r, depth + 1)
    elif kind in ("number", "integer"):
        if r.random() < 0.5:
            s["minimum"] = rand_float(r) if kind == "number" else rand_int(r)
    elif kind == "string" and r.random() < 0.4:
        s["enum"] = [rand_text(r, False, 2) for _ in range(r.randint(1, 3))]
    items = list(s.items())
    r.shuffle(items)  # insertion order must not matter to json_sorted
    return dict(items)


def rand_tools(r):
    tools = []
    for _ in range(r.randint(1, 4)):
        fn = {"name": r.choice(TOOL_NAMES), "description": rand_text(r, False, 6),
              "parameters": rand_schema(r)}
        if r.random() < 0.3:
            fn["strict"] = True
        items = list(fn.items())
        r.shuffle(items)
        tools.append({"type": "function", "function": dict(items)})
    return tools


def rand_content(r, feats, allow_empty=True):
    if r.random() < 0.2:
        feats.add("content_parts")
        return [{"type": "text", "text": rand_text(r)} for _ in range(r.randint(0, 3))]
    return rand_text(r, allow_empty)


def rand_arguments(r, feats, parse_string_arguments):
    args = {}
    for _ in range(r.randint(0, 5)):
        v = rand_value(r)
        args[r.choice(KEYS)] = v
    for v in args.values():
        feats.add("arg_" + ("null" if v is None else "boolean" if isinstance(v, bool)
                            else "number" if isinstance(v, (int, float))
                            else "string" if isinstance(v, str)
                            else "object" if isinstance(v, dict) else "array"))
    k = r.random()
    if k < 0.45:
        return args
    if k < 0.9:
        feats.add("json_string_arguments" if parse_string_arguments else "raw_json_block")
        sep = r.choice([None, (",", ":"), (", ", ": ")])
        return json.dumps(args, ensure_ascii=r.random() < 0.5, separators=sep,
                          indent=r.choice([None, None, 2]))
    return r.choice(["", "  ", None])


def rand_call(r, feats, call_id, parse_string_arguments):
    fn = {"name": r.choice(TOOL_NAMES)}
    if any(c in fn["name"] for c in '&"'):
        feats.add("attr_escape")
    args = rand_arguments(r, feats, parse_string_arguments)
    if args is not None or r.random() < 0.5:
        fn["arguments"] = args
    if r.random() < 0.05:
        fn["_xtml_json_block"] = json.dumps({"raw": rand_text(r)}, ensure_ascii=False)
        feats.add("xtml_json_block")
    if r.random() < 0.15:  # the flat form {"id", "name", "arguments"}
        call = dict(fn)
        feats.add("flat_tool_call")
    else:
        call = {"type": "function", "function": fn}
    if call_id is not None:
        call["id"] = call_id
    return call


def rand_name(r, feats):
    name = r.choice(["Ann", "bob", 'Ann "the" & co', "Zoë", "ユーザー", "x&y"])
    if any(c in name for c in '&"'):
        feats.add("attr_escape")
    feats.add("named")
    return name


def rand_tool_results(r, feats, calls):
    """Results for a list of calls: by id (in order or reordered), by order, or unresolved."""
    ids = [c.get("id") for c in calls]
    mode = r.choice(["id", "id_shuffled", "order", "named", "unresolved"])
    results = []
    for k, call in enumerate(calls):
        m = {"role": "tool", "content": rand_content(r, feats)}
        if mode in ("id", "id_shuffled") and ids[k] is not None:
            m["tool_call_id"] = ids[k]
        elif mode == "named":
            fn = call.get("function", call)
            m["tool" if r.random() < 0.5 else "name"] = fn["name"]
        elif mode == "unresolved" and r.random() < 0.5:
            m["tool_call_id"] = "call_unknown_%d" % k
        results.append(m)
    if mode == "id_shuffled":
        r.shuffle(results)
    if all("tool_call_id" in m for m in results) and mode.startswith("id"):
        feats.add("tool_result_by_id_reordered" if mode == "id_shuffled" else "tool_result_by_id")
    elif mode == "unresolved":
        feats.add("tool_result_unresolved")
    elif mode == "order":
        feats.add("tool_result_by_order")
    elif mode == "named":
        feats.add("tool_result_named")
    return results


def rand_request(r, parse_string_arguments):
    feats = set()
    messages = []
    if r.random() < 0.5:
        m = {"role": "system", "content": rand_content(r, feats, False)}
        if r.random() < 0.3:
            m["name"] = rand_name(r, feats)
        messages.append(m)
        feats.add("system")
    call_serial = 0
    for turn in range(r.randint(1, 4)):
        m = {"role": "user", "content": rand_content(r, feats)}
        if r.random() < 0.25:
            m["name"] = rand_name(r, feats)
        messages.append(m)
        if r.random() < 0.1:
            messages.append({"role": "system", "tools": rand_tools(r), "content": rand_text(r)})
            feats.add("dynamic_tools")
        last = turn == 0 and r.random() < 0.3
        if last:
            break
        a = {"role": "assistant"}
        k = r.random()
        if k < 0.3:
            a["reasoning_content"] = rand_text(r)
            feats.add("reasoning_content")
        elif k < 0.5:
            a["reasoning"] = rand_text(r)
            feats.add("reasoning")
        elif k < 0.6:
            a["reasoning_content"] = ""
            a["reasoning"] = rand_text(r, False)
            feats.add("reasoning")
        elif k < 0.7:
            a["reasoning_content"] = r.choice([" ", "\n\t", "\u3000"])
            feats.add("blank_reasoning")
        c = r.random()
        if c < 0.7:
            a["content"] = rand_content(r, feats)
        elif c < 0.85:
            a["content"] = None
        if r.random() < 0.15:
            a["name"] = rand_name(r, feats)
        if r.random() < 0.45:
            calls = []
            for _ in range(r.randint(1, 3)):
                call_id = "call_%d" % call_serial if r.random() < 0.85 else None
                call_serial += 1
                calls.append(rand_call(r, feats, call_id, parse_string_arguments))
            a["tool_calls"] = calls
            feats.add("tool_calls")
            messages.append(a)
            messages.extend(rand_tool_results(r, feats, calls))
        else:
            if r.random() < 0.1:
                a["tool_calls"] = []
            messages.append(a)
    if messages[-1]["role"] == "tool" and r.random() < 0.5:
        messages.append({"role": "assistant", "content": rand_text(r),
                         "reasoning_content": rand_text(r)})
    req = {"model": "kimi-k3", "messages": messages}
    if r.random() < 0.4:
        req["tools"] = rand_tools(r)
        feats.add("tools")
    k = r.random()
    if k < 0.15:
        req["tool_choice"] = "none"
        feats.add("tool_choice_none")
    elif k < 0.3:
        req["tool_choice"] = "required"
        feats.add("tool_choice_required")
    elif k < 0.4:
        req["tool_choice"] = "auto"
    k = r.random()
    if k < 0.15:
        req["response_format"] = {"type": "json_object"}
        feats.add("response_format_json_object")
    elif k < 0.35:
        schema = rand_schema(r)
        where = r.choice(["schema", "json_schema", "itself"])
        wrapper = ({"name": "out", "schema": schema, "strict": True} if where == "schema"
                   else {"json_schema": schema} if where == "json_schema" else dict(schema))
        req["response_format"] = {"type": "json_schema", "json_schema": wrapper}
        feats.add("response_format_json_schema")
    elif k < 0.4:
        req["response_format"] = {"type": "text"}
    kw = {}
    k = r.random()
    if k < 0.3:
        kw["thinking"] = False
    elif k < 0.5:
        kw["thinking"] = True
    k = r.random()
    if k < 0.45:
        kw["thinking_effort"] = r.choice(["low", "high", "max", None])
    elif k < 0.65:
        req["reasoning_effort"] = r.choice(["none", "low", "high", "max"])
    if kw or r.random() < 0.1:
        req["chat_template_kwargs"] = kw
    if r.random() < 0.2:
        req["add_generation_prompt"] = r.random() < 0.3
    # Requests the template refuses: an unsupported effort, a tool result it cannot name.
    k = r.random()
    if k < 0.04:
        req.setdefault("chat_template_kwargs", {})["thinking_effort"] = r.choice(["medium",
                                                                                   "ultra"])
    elif k < 0.07:
        req["messages"].insert(0, {"role": "tool", "content": "orphan result"})
    v = template_vars(req, parse_string_arguments)
    feats.add("thinking_on" if v["thinking"] else "thinking_off")
    if v["thinking"]:
        e = v.get("thinking_effort", "max")
        feats.add("effort_" + (e if e in EFFORTS else "null" if e is None else "unsupported"))
    if not v["add_generation_prompt"]:
        feats.add("add_generation_prompt_false")
    if any(ord(ch) > 127 for ch in json.dumps(req, ensure_ascii=False)):
        feats.add("non_ascii")
    turns = sum(1 for m in messages if m["role"] == "assistant")
    if turns >= 2:
        feats.add("multi_turn")
    return req, feats


def float_cases(r, n):
    xs = list(FLOAT_EDGES) + [-x for x in FLOAT_EDGES]
    xs += [10.0 ** e for e in range(-30, 30)] + [1.5 * 10.0 ** e for e in range(-30, 30)]
    while len(xs) < n:
        xs.append(rand_float(r))
    return [repr(x) for x in xs]


def lower_table():
    out = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        low = chr(cp).lower()
        if low != chr(cp):
            out.append([cp, [ord(c) for c in low]])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--template", required=True)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    template = make_template(a.template)
    r = random.Random(a.seed)
    with open(a.out, "w", encoding="utf-8") as out:
        for n in range(a.count):
            parse_args = r.random() < 0.7
            req, feats = rand_request(r, parse_args)
            text, error = None, None
            try:
                text = template.render(**template_vars(req, parse_args))
            except jinja2.exceptions.TemplateError as e:
                error = str(e)
                feats.add("template_error")
            out.write(json.dumps({"case": n, "parse_string_arguments": parse_args,
                                  "features": sorted(feats), "request": req, "text": text,
                                  "error": error}) + "\n")
        out.write(json.dumps({"floats": float_cases(r, 20000)}) + "\n")
        out.write(json.dumps({"lower": lower_table()}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
