#!/usr/bin/env python3
"""Time to first token and aggregate tokens/s of `attnres serve` at several concurrencies.

Starts `attnres serve` on a free loopback port over MODEL, then for each concurrency C sends
C streaming /v1/completions requests at once (the same prompt, ignore_eos, a fixed number of
tokens, prefix store off so every request prefills), `--rounds` times. Reports per C: the
median and max time to first token (request sent to first text chunk), and the aggregate
generated tokens/s (all tokens of the round / the round's wall time), median over rounds.
Then the chat second-turn time to first token with and without the prefix store (turn 2
re-sends turn 1 and its reply; with the store only the new tokens are computed).

  scripts/bench-serve.py --model /tmp/k3mini [--cli build/release/attnres] [--json]

Standard library only. Not a test: the numbers depend on the machine and its load.
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

PROMPT = ("And it came to pass, when men began to multiply on the face of the earth, and "
          "daughters were born unto them, that the sons of God saw the daughters of men that they "
          "were fair; and they took them wives of all which they chose. ")


def start(cli, model, args):
    proc = subprocess.Popen([cli, "serve", "--model", model, "--port", "0", "--quiet"] + args,
                            stderr=subprocess.PIPE, text=True)
    port = None
    for line in proc.stderr:
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
        if "ready" in line:
            break
    if port is None:
        raise SystemExit("serve did not start")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    return proc, f"http://127.0.0.1:{port}"


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=3600)


def stream_request(base, path, body, out):
    t0 = time.monotonic()
    first = None
    tokens = 0
    with post(base, path, dict(body, stream=True, stream_options={"include_usage": True})) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            ch = chunk.get("choices") or []
            if ch and first is None:
                d = ch[0].get("delta", {})
                if ch[0].get("text") or d.get("content") or d.get("reasoning_content"):
                    first = time.monotonic() - t0
    out.append({"ttft": first, "tokens": tokens, "end": time.monotonic()})


def round_at(base, conc, prompt, gen):
    out = []
    body = {"prompt": prompt, "max_tokens": gen, "temperature": 0, "ignore_eos": True,
            "cache_prompt": False}
    threads = [threading.Thread(target=stream_request, args=(base, "/v1/completions", body, out))
               for _ in range(conc)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = max(o["end"] for o in out) - t0
    return [o["ttft"] for o in out], sum(o["tokens"] for o in out) / wall


def chat_ttft(base, messages, cache):
    out = []
    body = {"messages": messages, "max_tokens": 1, "temperature": 0, "cache_prompt": cache,
            "chat_template_kwargs": {"thinking": False}}
    stream_request(base, "/v1/chat/completions", body, out)
    return out[0]["ttft"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--cli", default="build/release/attnres")
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--prompt-repeat", type=int, default=4, help="prompt = PROMPT x this")
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    concs = [int(c) for c in a.concurrency.split(",")]
    args = ["--parallel", str(max(concs))]
    if a.threads:
        args += ["--threads", str(a.threads)]
    proc, base = start(a.cli, a.model, args)
    try:
        prompt = PROMPT * a.prompt_repeat
        ntok = json.load(post(base, "/tokenize", {"content": prompt}))["count"]
        round_at(base, 1, prompt, 4)  # warm up
        rows = []
        for c in concs:
            ttfts, rates = [], []
            for _ in range(a.rounds):
                t, r = round_at(base, c, prompt, a.gen_tokens)
                ttfts += t
                rates.append(r)
            rows.append({"concurrency": c, "prompt_tokens": ntok, "gen_tokens": a.gen_tokens,
                         "ttft_median_s": statistics.median(ttfts), "ttft_max_s": max(ttfts),
                         "aggregate_tok_s": statistics.median(rates),
                         "aggregate_tok_s_range": [min(rates), max(rates)]})
        # Second turn of a chat, with and without the prefix store.
        turn1 = [{"role": "user", "content": prompt}]
        r1 = json.load(post(base, "/v1/chat/completions",
                            {"messages": turn1, "max_tokens": 32, "temperature": 0,
                             "chat_template_kwargs": {"thinking": False}}))
        # Each round asks a different second question, so each restores turn 1's state only.
        def turn2(i):
            return turn1 + [r1["choices"][0]["message"],
                            {"role": "user", "content": f"And what came after, in verse {i}?"}]
        p2 = json.load(post(base, "/tokenize",
                            {"messages": turn2(0), "chat_template_kwargs": {"thinking": False}}))["count"]
        with_store = [chat_ttft(base, turn2(i), True) for i in range(a.rounds)]
        without = [chat_ttft(base, turn2(a.rounds + i), False) for i in range(a.rounds)]
        turn = {"turn2_prompt_tokens": p2, "ttft_with_store_s": statistics.median(with_store),
                "ttft_without_store_s": statistics.median(without)}
    finally:
        proc.terminate()
        proc.wait()
    if a.json:
        print(json.dumps({"rows": rows, "turn2": turn}, indent=1))
        return
    print(f"prompt {rows[0]['prompt_tokens']} tokens, {a.gen_tokens} generated per request, "
          f"{a.rounds} rounds")
    print("concurrency  TTFT median  TTFT max  aggregate tok/s (range)")
    for r in rows:
        lo, hi = r["aggregate_tok_s_range"]
        print(f"{r['concurrency']:>11}  {r['ttft_median_s']:>9.3f} s  {r['ttft_max_s']:>6.3f} s  "
              f"{r['aggregate_tok_s']:.1f} ({lo:.1f}-{hi:.1f})")
    print(f"chat turn 2 ({turn['turn2_prompt_tokens']} prompt tokens): TTFT "
          f"{turn['ttft_with_store_s']:.3f} s with the prefix store, "
          f"{turn['ttft_without_store_s']:.3f} s without")


if __name__ == "__main__":
    sys.exit(main())
