"""The training corpus: the King James Bible from Debian's `bible-kjv-text` package.

Why this corpus: the KJV text (1611) is in the public domain, so a model trained on it and the
held-out slice committed next to it can be redistributed without conditions. Debian ships it in
`bible-kjv-text` (the text, /usr/lib/bible.data) and `bible-kjv` (the `bible` program that
decompresses it); see /usr/share/doc/bible-kjv-text/copyright: "The copyright for the King James
Version text of the Bible is expired". It is plain 7-bit English, 4.3 MB, 31,102 verses in
1,189 chapters: enough for a few-million-parameter model to learn whole words and phrases in
minutes, and small enough to tokenise and train on in one sitting.

Layout of the text the model sees: for every chapter a heading line ("Genesis 1"), then one
verse per line without its number, then a blank line. Every 40th chapter (index % 40 == 20,
30 chapters, about 2.5% of the text) is held out: never trained on, kept for evaluation.
"""

import hashlib
import re
import subprocess

HELDOUT_EVERY = 40
HELDOUT_OFFSET = 20


def read_chapters():
    """[(heading, [verse, ...]), ...] in canonical order, from the `bible` program."""
    try:
        out = subprocess.run(["bible", "-l", "100000", "Gen1:1-Rev22:21"], check=True,
                             capture_output=True, text=True).stdout
    except FileNotFoundError:
        raise SystemExit("error: the `bible` program is missing: apt-get install bible-kjv")
    chapters = []
    for line in out.split("\n"):
        if not line.strip():
            continue
        m = re.match(r"^\s+(\d+) (.*)$", line)
        if m:
            if not chapters:
                raise SystemExit("error: `bible` printed a verse before any chapter heading")
            chapters[-1][1].append(m.group(2).strip())
        else:
            chapters.append((line.strip(), []))
    if len(chapters) != 1189 or sum(len(v) for _, v in chapters) != 31102:
        raise SystemExit(f"error: expected 1189 chapters and 31102 verses from `bible`, got "
                         f"{len(chapters)} and {sum(len(v) for _, v in chapters)}")
    return chapters


def chapter_text(heading, verses):
    return heading + "\n" + "\n".join(verses) + "\n\n"


def split_corpus():
    """(train_text, heldout_text): chapters in order, every 40th one held out."""
    train, held = [], []
    for i, (heading, verses) in enumerate(read_chapters()):
        (held if i % HELDOUT_EVERY == HELDOUT_OFFSET else train).append(
            chapter_text(heading, verses))
    return "".join(train), "".join(held)


def sha256(text):
    return hashlib.sha256(text.encode()).hexdigest()


if __name__ == "__main__":
    tr, he = split_corpus()
    print(f"train {len(tr)} chars sha256 {sha256(tr)}")
    print(f"heldout {len(he)} chars sha256 {sha256(he)}")
