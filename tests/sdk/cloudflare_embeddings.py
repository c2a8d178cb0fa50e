"""Bulkhead's embedding model through the official `cloudflare` Python
SDK's `ai.run`, as a Workers AI user calls `@cf/baai/bge-*`: one text and a
list of texts, answered with `shape` and `data` (and `pooling`).

Environment: BULKHEAD_GATEWAY_URL (the gateway's root), BULKHEAD_TOKEN,
BULKHEAD_ACCOUNT_ID, BULKHEAD_EMBED_MODEL. Prints one JSON line of what it
saw.
"""

import json
import os

import cloudflare
from cloudflare import Cloudflare

client = Cloudflare(
    api_token=os.environ["BULKHEAD_TOKEN"],
    base_url=os.environ["BULKHEAD_GATEWAY_URL"] + "/client/v4",
    max_retries=0,
    timeout=300,
)
ACCOUNT = os.environ["BULKHEAD_ACCOUNT_ID"]
MODEL = os.environ["BULKHEAD_EMBED_MODEL"]
seen = {"sdk": cloudflare.__version__}


def field(result, name):
    """A field of ai.run's result, which the SDK gives as a dict or a model."""
    return result.get(name) if isinstance(result, dict) else getattr(result, name, None)


one = client.ai.run(MODEL, account_id=ACCOUNT, text="The cat sits on the mat.")
seen["one_shape"] = field(one, "shape")
assert len(field(one, "data")) == 1, one
many = client.ai.run(MODEL, account_id=ACCOUNT, text=["first text", "second text", "third text"])
seen["many_shape"] = field(many, "shape")
seen["rows"] = [len(row) for row in field(many, "data")]
seen["pooling"] = field(many, "pooling")
print(json.dumps(seen))
