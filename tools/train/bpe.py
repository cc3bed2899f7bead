"""Byte-level BPE trained on the corpus, written as Kimi's `tiktoken.model` layout.

Layout (what the engine reads, src/tokenizer/tokenizer.h and k3-model.md section 7):
  * tiktoken.model: one line per rank, "base64(token bytes) rank"; ranks 0..255 are the single
    bytes 0..255 (so every byte string encodes), ranks 256.. are the merges in training order.
  * the 256 ids after the last rank are Kimi's control tokens; tokenizer_config.json names them
    in `added_tokens_decoder` ([BOS], [EOS], <|end_of_msg|>, <|open|>, <|close|>, <|sep|>, ...,
    [UNK], [PAD], at the same offsets as the published Kimi-K3 tokenizer and src/synth/synth.cpp).

Pre-tokenisation is Kimi's published split pattern (tokenization_kimi.py, the same string the
engine compiles in src/tokenizer/pretokenizer.cpp), through the `regex` module (python3-regex),
whose V1 mode understands the `[X&&[^Y]]` class intersections of that pattern.

Encoding is tiktoken's (`_byte_pair_merge`): a piece that is itself a token is that token;
otherwise repeatedly merge the adjacent pair whose concatenation has the lowest rank. The
engine does the same (src/tokenizer/bpe.cpp), so ids written here are the ids it produces;
tools/train/check_tokenizer.sh checks that on the held-out text.
"""

import base64
import collections
import json

import regex

KIMI_PATTERN = (
    r"[\p{Han}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+")
_SPLIT = regex.compile(KIMI_PATTERN, flags=regex.V1)

# Kimi-K3 control tokens by offset from the first id after the ranks (synth.cpp's table).
CONTROL_TOKENS = {0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>",
                  5: "<|sep|>", 254: "[UNK]", 255: "[PAD]"}
NUM_CONTROL = 256


def pieces(text):
    return _SPLIT.findall(text)


def train(text, n_ranks):
    """Token byte strings in rank order: the 256 bytes, then n_ranks - 256 merges."""
    counts = collections.Counter(p.encode() for p in pieces(text))
    words = [list(bytes([b]) for b in w) for w in counts]  # each word as its current parts
    freq = list(counts.values())
    pair_count = collections.Counter()
    where = collections.defaultdict(set)  # pair -> indices of words containing it
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] += freq[i]
            where[(a, b)].add(i)
    vocab = [bytes([b]) for b in range(256)]
    while len(vocab) < n_ranks and pair_count:
        # Most frequent pair; ties broken by the smaller byte string, so training is deterministic.
        best = min(pair_count, key=lambda p: (-pair_count[p], p[0] + p[1]))
        if pair_count[best] < 2:
            break
        merged = best[0] + best[1]
        vocab.append(merged)
        for i in list(where[best]):
            w = words[i]
            for a, b in zip(w, w[1:]):  # remove this word's pairs, re-add after merging
                pair_count[(a, b)] -= freq[i]
                if pair_count[(a, b)] <= 0:
                    del pair_count[(a, b)]
                where[(a, b)].discard(i)
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == best[0] and w[j + 1] == best[1]:
                    out.append(merged)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for a, b in zip(out, out[1:]):
                pair_count[(a, b)] += freq[i]
                where[(a, b)].add(i)
        where.pop(best, None)
    if len(vocab) != n_ranks:
        raise SystemExit(f"error: the corpus supports only {len(vocab)} BPE ranks, "
                         f"asked for {n_ranks}")
    return vocab


class Tokenizer:
    def __init__(self, vocab):
        self.vocab = vocab
        self.rank = {t: r for r, t in enumerate(vocab)}
        self.cache = {}
        self.n_ranks = len(vocab)
        self.control = {self.n_ranks + o: n for o, n in CONTROL_TOKENS.items()}

    @property
    def vocab_size(self):
        return self.n_ranks + NUM_CONTROL

    def _encode_piece(self, piece):
        if piece in self.rank:
            return [self.rank[piece]]
        parts = [bytes([b]) for b in piece]
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = self.rank.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        return [self.rank[p] for p in parts]

    def encode(self, text):
        ids = []
        for p in pieces(text):
            b = p.encode()
            if b not in self.cache:
                self.cache[b] = self._encode_piece(b)
            ids.extend(self.cache[b])
        return ids

    def decode(self, ids):
        return b"".join(self.vocab[i] if i < self.n_ranks else self.control.get(
            i, f"<|reserved_token_{i}|>").encode() for i in ids).decode("utf-8", "replace")

    def write(self, out_dir):
        with open(f"{out_dir}/tiktoken.model", "w") as f:
            for r, t in enumerate(self.vocab):
                f.write(f"{base64.b64encode(t).decode()} {r}\n")
        added = {str(self.n_ranks + o): {"content": n, "special": True}
                 for o, n in sorted(CONTROL_TOKENS.items())}
        cfg = {"tokenizer_class": "TikTokenTokenizer", "added_tokens_decoder": added,
               "bos_token": "[BOS]", "eos_token": "[EOS]"}
        with open(f"{out_dir}/tokenizer_config.json", "w") as f:
            f.write(json.dumps(cfg, indent=2) + "\n")

    @staticmethod
    def read(path):
        vocab = []
        with open(path) as f:
            for r, line in enumerate(f):
                tok, rank = line.split()
                if int(rank) != r:
                    raise SystemExit(f"error: {path}: line {r + 1} has rank {rank}, expected {r}")
                vocab.append(base64.b64decode(tok))
        return Tokenizer(vocab)
