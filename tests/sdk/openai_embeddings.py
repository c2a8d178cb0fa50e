"""Bulkhead's embeddings through the official `openai` Python SDK, as a
retrieval client calls them: `embeddings.create` with one string and with
a list (the SDK asks for base64 and decodes it), with `encoding_format`
float, with token ids, a `dimensions` other than the model's refused as a
BadRequestError, and similar texts closer than unrelated ones.

Environment: BULKHEAD_BASE_URL (ending in /v1), BULKHEAD_TOKEN,
BULKHEAD_EMBED_MODEL. Prints one JSON line of what it saw.
"""

import json
import math
import os

import openai
from openai import OpenAI

client = OpenAI(
    base_url=os.environ["BULKHEAD_BASE_URL"],
    api_key=os.environ["BULKHEAD_TOKEN"],
    max_retries=0,
    timeout=300,
)
MODEL = os.environ["BULKHEAD_EMBED_MODEL"]
seen = {"sdk": openai.__version__}


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


one = client.embeddings.create(model=MODEL, input="The cat sits on the mat.")
assert len(one.data) == 1 and one.data[0].index == 0, one
seen["dimensions"] = len(one.data[0].embedding)
seen["usage"] = {"prompt_tokens": one.usage.prompt_tokens, "total_tokens": one.usage.total_tokens}

texts = ["The cat sits on the mat.", "A cat is sitting on a mat.", "Quarterly revenue rose by four percent."]
many = client.embeddings.create(model=MODEL, input=texts)
vectors = [d.embedding for d in sorted(many.data, key=lambda d: d.index)]
assert len(vectors) == 3, many
seen["same_text_cosine"] = cosine(vectors[0], one.data[0].embedding)
seen["similar_cosine"] = cosine(vectors[0], vectors[1])
seen["unrelated_cosine"] = cosine(vectors[0], vectors[2])

floats = client.embeddings.create(model=MODEL, input=texts[0], encoding_format="float")
seen["float_vs_base64_cosine"] = cosine(floats.data[0].embedding, vectors[0])

ids = client.embeddings.create(model=MODEL, input=[[1996, 4937, 7719, 2006, 1996, 13523, 1012]])
seen["token_ids_dimensions"] = len(ids.data[0].embedding)
seen["token_ids_cosine"] = cosine(ids.data[0].embedding, vectors[0])

try:
    client.embeddings.create(model=MODEL, input="x", dimensions=128)
    raise AssertionError("dimensions=128 was answered")
except openai.BadRequestError as e:
    seen["dimensions_refused"] = e.message

print(json.dumps(seen))
