"""Bulkhead through the official `openai` Python SDK, as a user calls it.

Run by tests/sdk.rs against a real `bulkhead up`; every check raises on a
mismatch and the script prints one JSON line of what it saw.
Environment: BULKHEAD_BASE_URL (the gateway's /v1), BULKHEAD_TOKEN,
BULKHEAD_MODEL, and BULKHEAD_SPENT_TOKEN (an account whose budget is spent).
"""

import json
import os
import re

import httpx
import openai

client = openai.OpenAI(
    base_url=os.environ["BULKHEAD_BASE_URL"],
    api_key=os.environ["BULKHEAD_TOKEN"],
    max_retries=0,
    timeout=300,
)
MODEL = os.environ["BULKHEAD_MODEL"]
ASK = [{"role": "user", "content": "Describe a cat as JSON with its name and age."}]
seen = {"sdk": openai.__version__}

# JSON schema output, parsed by the SDK's own helper.
schema = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer"},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
r = client.chat.completions.create(
    model=MODEL,
    messages=ASK,
    temperature=0,
    max_tokens=64,
    response_format={
        "type": "json_schema",
        "json_schema": {"name": "cat", "schema": schema, "strict": True},
    },
)
cat = json.loads(r.choices[0].message.content)
assert set(cat) == {"name", "age"} and isinstance(cat["age"], int), cat
assert r.choices[0].finish_reason == "stop", r
seen["json_schema"] = cat

# JSON mode.
r = client.chat.completions.create(
    model=MODEL, messages=ASK, temperature=0, max_tokens=48,
    response_format={"type": "json_object"},
)
text = r.choices[0].message.content
assert text.startswith("{"), text
if r.choices[0].finish_reason == "stop":
    assert isinstance(json.loads(text), dict), text
seen["json_object"] = r.choices[0].finish_reason

# Log-probabilities, as the SDK types them.
r = client.chat.completions.create(
    model=MODEL, messages=[{"role": "user", "content": "Name a colour."}],
    temperature=0, max_tokens=6, logprobs=True, top_logprobs=3,
)
content = r.choices[0].logprobs.content
assert len(content) == r.usage.completion_tokens, (len(content), r.usage)
assert "".join(c.token for c in content) == r.choices[0].message.content
for c in content:
    assert c.logprob <= 0 and len(c.top_logprobs) == 3
    assert c.top_logprobs[0].token == c.token  # greedy takes the likeliest
    assert bytes(c.bytes).decode("utf-8", "replace") == c.token
seen["logprobs"] = [round(c.logprob, 4) for c in content]

# Several choices; with a fixed seed they are reproducible.
r = client.chat.completions.create(
    model=MODEL, messages=ASK, temperature=1.0, seed=7, max_tokens=8, n=3,
)
assert [c.index for c in r.choices] == [0, 1, 2], r
again = client.chat.completions.create(
    model=MODEL, messages=ASK, temperature=1.0, seed=7, max_tokens=8, n=3,
)
assert [c.message.content for c in r.choices] == [c.message.content for c in again.choices]
# Each choice is sampled on its own, not one answer copied three times.
assert len({c.message.content for c in r.choices}) > 1, [c.message.content for c in r.choices]
# Usage counts the prompt once and every choice's output.
assert 3 <= r.usage.completion_tokens <= 3 * 8, r.usage
seen["n"] = len(r.choices)

# Streaming with usage in the last chunk, and a stop string.
chunks = list(client.chat.completions.create(
    model=MODEL, messages=ASK, temperature=0, max_tokens=16, stream=True,
    stream_options={"include_usage": True},
))
assert chunks[-1].usage is not None and chunks[-1].choices == []
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
seen["stream_chunks"] = len(chunks)
plain = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=16)
assert plain.choices[0].message.content == streamed, (plain, streamed)

# A stop string ends the answer before it, with finish_reason "stop".
text = plain.choices[0].message.content
cut = text[len(text) // 2 :][:3]
stopped = client.chat.completions.create(
    model=MODEL, messages=ASK, temperature=0, max_tokens=16, stop=[cut],
)
assert stopped.choices[0].message.content == text[: text.find(cut)], (text, cut, stopped)
assert stopped.choices[0].finish_reason == "stop", stopped
seen["stop"] = [text, cut, stopped.choices[0].message.content]

# Rate-limit headers on a model response, as OpenAI sends them.
raw = client.chat.completions.with_raw_response.create(
    model=MODEL, messages=ASK, temperature=0, max_tokens=2,
)
for h in ("limit", "remaining", "reset"):
    for what in ("requests", "tokens"):
        assert raw.headers.get(f"x-ratelimit-{h}-{what}"), (h, what, dict(raw.headers))
seen["ratelimit_remaining_requests"] = raw.headers["x-ratelimit-remaining-requests"]
# On a streamed response too (they are headers: before the first event).
raw = client.chat.completions.with_raw_response.create(
    model=MODEL, messages=ASK, temperature=0, max_tokens=2, stream=True,
)
assert raw.headers.get("x-ratelimit-remaining-tokens"), dict(raw.headers)
assert list(raw.parse()), "the stream has events"

# An over-long prompt: a BadRequestError in OpenAI's wording, which
# context-window fallbacks (LiteLLM's, LangChain's) recognise.
try:
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello " * 12000}], max_tokens=8,
    )
    raise AssertionError("an over-long prompt was answered")
except openai.BadRequestError as e:
    assert e.code == "context_length_exceeded", e.body
    assert re.search(r"maximum context length is \d+ tokens", e.message), e.message
    seen["context_error"] = e.message[:80]

# What Bulkhead cannot do is refused by name.
for kwargs, param in [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "^a+$"}}}}}]}, "tools"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "pattern": "^a+$"}}}}, "response_format"),
    ({"n": 2, "stream": True}, "n"),
]:
    try:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2, **kwargs)
        raise AssertionError(f"{param} was accepted")
    except openai.BadRequestError as e:
        assert e.code == "unsupported_parameter" and e.param == param, e.body

# A spent budget: OpenAI's RateLimitError with `insufficient_quota`, which
# the SDK does not retry (the reset is hours away), even when allowed to.
attempts = []
spent = openai.OpenAI(
    base_url=os.environ["BULKHEAD_BASE_URL"],
    api_key=os.environ["BULKHEAD_SPENT_TOKEN"],
    max_retries=3,
    timeout=60,
    http_client=httpx.Client(event_hooks={"request": [attempts.append]}),
)
try:
    spent.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2)
    raise AssertionError("a request over budget was answered")
except openai.RateLimitError as e:
    assert e.code == "insufficient_quota", e.body
    assert e.type == "insufficient_quota", e.body
    assert "daily budget of 0 neurons" in e.message, e.message
    assert int(e.response.headers["retry-after"]) > 0, dict(e.response.headers)
seen["over_budget_attempts"] = len(attempts)

# A flex request (batch class: served after interactive work) is answered.
r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, temperature=0, service_tier="flex")
assert r.choices[0].message.content, r
seen["flex"] = r.choices[0].message.content

# The models list, as the SDK pages it.
ids = [m.id for m in client.models.list()]
assert MODEL in ids, ids
seen["models"] = len(ids)

print(json.dumps(seen))
