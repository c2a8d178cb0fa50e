"""Batch input files and batches through the official `openai` Python SDK:
a JSON Lines file of 100 requests uploaded with `files.create`, read back
with `files.retrieve` and `files.content`, listed; run as a batch
(`batches.create`, `batches.retrieve` until it completes, the output read
with `files.content`: one answer per line, by `custom_id`); then deleted.
Another account asking for the file or the batch gets exactly what an
unknown id gets; a malformed line is refused naming its line.

Environment: BULKHEAD_BASE_URL (the gateway's /v1), BULKHEAD_TOKEN,
BULKHEAD_SPENT_TOKEN (another account's token), BULKHEAD_MODEL. Prints one
JSON line of what it saw.
"""

import io
import json
import os
import time

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

# The 100 lines as a batch, run by the platform's batch runner.
batch = mine.batches.create(
    input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
    metadata={"suite": "sdk"},
)
assert batch.status == "validating" and batch.request_counts.total == 100, batch
started = time.time()
while batch.status not in ("completed", "failed", "cancelled", "expired"):
    assert time.time() - started < 600, f"the batch did not finish: {batch}"
    time.sleep(0.5)
    batch = mine.batches.retrieve(batch.id)
assert batch.status == "completed", batch
assert (batch.request_counts.completed, batch.request_counts.failed) == (100, 0), batch
assert batch.metadata == {"suite": "sdk"} and batch.error_file_id is None, batch
out = [json.loads(l) for l in mine.files.content(batch.output_file_id).text.splitlines()]
assert sorted(o["custom_id"] for o in out) == sorted(l["custom_id"] for l in lines), "one answer per line"
for o in out:
    assert o["response"]["status_code"] == 200, o
    assert o["response"]["body"]["choices"][0]["message"]["content"], o
assert batch.id in [b.id for b in mine.batches.list()], "listed"
ids = []
for bid in (batch.id, "batch_000000000000000000000000"):
    try:
        theirs.batches.retrieve(bid)
        raise AssertionError(f"another account read {bid}")
    except openai.NotFoundError as e:
        ids.append(json.dumps(e.body, sort_keys=True).replace(bid, "ID"))
assert ids[0] == ids[1], ids
try:
    mine.batches.cancel(batch.id)
    raise AssertionError("a finished batch was cancelled")
except openai.ConflictError:
    pass
seen["batch"] = {"id": batch.id, "answers": len(out), "seconds": round(time.time() - started, 1)}

deleted = mine.files.delete(f.id)
assert deleted.deleted and deleted.id == f.id, deleted
try:
    mine.files.retrieve(f.id)
    raise AssertionError("a deleted file was found")
except openai.NotFoundError:
    seen["deleted"] = True

print(json.dumps(seen))
