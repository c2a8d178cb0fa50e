"""Bulkhead's Workers AI API through the official `cloudflare` Python SDK,
as a Workers AI user calls it: `ai.run` with a prompt, and `ai.run` with
`tools` in Cloudflare's flat form and in OpenAI's, answered with
`tool_calls` whose arguments are objects matching the function's schema,
and the same streamed.

Environment: BULKHEAD_GATEWAY_URL (the gateway's root), BULKHEAD_TOKEN,
BULKHEAD_ACCOUNT_ID, BULKHEAD_MODEL. Prints one JSON line of what it saw.
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
MODEL = os.environ["BULKHEAD_MODEL"]
seen = {"sdk": cloudflare.__version__}


def field(result, name):
    """A field of ai.run's result, which the SDK gives as a dict or a model."""
    return result.get(name) if isinstance(result, dict) else getattr(result, name, None)


r = client.ai.run(MODEL, account_id=ACCOUNT, prompt="What is the capital of France?", max_tokens=8)
assert field(r, "response"), r
seen["answer"] = field(r, "response")

PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}},
    "required": ["city"],
    "additionalProperties": False,
}
for shape, tool in [
    ("flat", {"name": "get_weather", "description": "The weather in a city", "parameters": PARAMS}),
    (
        "openai",
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "The weather in a city", "parameters": PARAMS},
        },
    ),
]:
    r = client.ai.run(
        MODEL,
        account_id=ACCOUNT,
        messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
        tools=[tool],
        extra_body={"tool_choice": "required"},
        max_tokens=48,
        temperature=0,
    )
    calls = field(r, "tool_calls")
    assert calls, r
    call = calls[0] if isinstance(calls[0], dict) else calls[0].to_dict()
    assert call["name"] == "get_weather", call
    args = call["arguments"]
    assert isinstance(args, dict) and set(args) == {"city"}, call
    assert isinstance(args["city"], str) and len(args["city"]) <= 40, call
    seen[shape] = args

# Streamed (as Workers AI streams, server-sent events): a call arrives
# whole in a `tool_calls` event, then the usage event and [DONE].
import httpx  # noqa: E402 (the SDK's own HTTP client)

events = []
with httpx.stream(
    "POST",
    f"{os.environ['BULKHEAD_GATEWAY_URL']}/client/v4/accounts/{ACCOUNT}/ai/run/{MODEL}",
    headers={"Authorization": f"Bearer {os.environ['BULKHEAD_TOKEN']}"},
    json={
        "messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
        "tools": [{"name": "get_weather", "description": "The weather in a city", "parameters": PARAMS}],
        "tool_choice": "required",
        "stream": True,
        "max_tokens": 48,
        "temperature": 0,
    },
    timeout=300,
) as r:
    assert r.status_code == 200, r.read()
    for line in r.iter_lines():
        if line.startswith("data: "):
            events.append(line[len("data: "):])
assert events[-1] == "[DONE]", events
parsed = [json.loads(e) for e in events[:-1]]
streamed = [c for e in parsed for c in e.get("tool_calls", [])]
assert len(streamed) == 1 and streamed[0]["name"] == "get_weather", parsed
assert isinstance(streamed[0]["arguments"]["city"], str), parsed
assert parsed[-1]["usage"]["completion_tokens"] > 0, parsed
seen["streamed"] = streamed[0]["arguments"]

print(json.dumps(seen))
