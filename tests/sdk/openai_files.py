"""Batch input files through the official `openai` Python SDK: a JSON Lines
file of 100 requests uploaded with `files.create`, read back with
`files.retrieve` and `files.content`, listed, and deleted; another account
asking for it gets exactly what an unknown id gets; a malformed line is
refused naming its line.

Environment: BULKHEAD_BASE_URL (the gateway's /v1), BULKHEAD_TOKEN,
BULKHEAD_SPENT_TOKEN (another account's token), BULKHEAD_MODEL. Prints one
JSON line of what it saw.
"""

import io
import json
import os

import openai


def client(token):
    return openai.OpenAI(
        base_url=os.environ["BULKHEAD_BASE_URL"], api_key=token, max_retries=0, timeout=300
    )


mine = client(os.environ["BULKHEAD_TOKEN"])
theirs = client(os.environ["BULKHEAD_SPENT_TOKEN"])
MODEL = os.environ["BULKHEAD_MODEL"]
seen = {}

lines = [
    {
        "custom_id": f"request-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": f"Say {i}."}], "max_tokens": 4},
    }
    for i in range(100)
]
text = "\n".join(json.dumps(line) for line in lines) + "\n"

f = mine.files.create(file=("requests.jsonl", io.BytesIO(text.encode())), purpose="batch")
assert f.id.startswith("file-") and f.purpose == "batch", f
assert f.bytes == len(text.encode()) and f.filename == "requests.jsonl", f
got = mine.files.retrieve(f.id)
assert got.id == f.id and got.bytes == f.bytes and got.created_at == f.created_at, got
assert mine.files.content(f.id).text == text, "the bytes as uploaded"
assert f.id in [x.id for x in mine.files.list()], "listed"
seen["file"] = {"id": f.id, "bytes": f.bytes}

# Another account: the file does not exist for it, exactly as an unknown
# id does not (only the id differs in the answer).
unknown = "file-000000000000000000000000"
bodies = []
for fid in (f.id, unknown):
    try:
        theirs.files.retrieve(fid)
        raise AssertionError(f"another account read {fid}")
    except openai.NotFoundError as e:
        bodies.append(json.dumps(e.body, sort_keys=True).replace(fid, "ID"))
assert bodies[0] == bodies[1], bodies
assert f.id not in [x.id for x in theirs.files.list()], "not listed for another account"
for call in (lambda: theirs.files.content(f.id), lambda: theirs.files.delete(f.id)):
    try:
        call()
        raise AssertionError("another account reached the file")
    except openai.NotFoundError:
        pass
seen["another_account"] = "not found"

# A malformed line is refused, naming it.
try:
    mine.files.create(file=("bad.jsonl", io.BytesIO(text.encode() + b"{\"custom_id\": 1}\n")), purpose="batch")
    raise AssertionError("a malformed file was accepted")
except openai.BadRequestError as e:
    assert "line 101" in e.message, e.message
    seen["refused"] = e.message

deleted = mine.files.delete(f.id)
assert deleted.deleted and deleted.id == f.id, deleted
try:
    mine.files.retrieve(f.id)
    raise AssertionError("a deleted file was found")
except openai.NotFoundError:
    seen["deleted"] = True

print(json.dumps(seen))
