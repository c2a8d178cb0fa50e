"""LiteLLM (the library) against Bulkhead's OpenAI-compatible routes, as a
user of its context-window fallbacks would call it: an answer, a prompt
over the model's window raised as litellm.ContextWindowExceededError (it
recognises OpenAI's wording), a required tool call parsed into tool_calls,
and a refused parameter as BadRequestError.

Environment: BULKHEAD_BASE_URL (ending in /v1), BULKHEAD_TOKEN,
BULKHEAD_MODEL. Prints one JSON line of what it saw.
"""

import json
import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
import litellm  # noqa: E402

base = os.environ["BULKHEAD_BASE_URL"]
key = os.environ["BULKHEAD_TOKEN"]
model = "openai/" + os.environ["BULKHEAD_MODEL"]
seen = {}


def fail(what):
    print(f"FAILED: {what}", file=sys.stderr)
    print(json.dumps(seen), file=sys.stderr)
    sys.exit(1)


r = litellm.completion(
    model=model,
    api_base=base,
    api_key=key,
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    max_tokens=8,
    temperature=0,
)
seen["answer"] = r.choices[0].message.content
seen["completion_tokens"] = r.usage.completion_tokens
if not seen["answer"] or r.usage.completion_tokens < 1:
    fail("no answer")

try:
    litellm.completion(
        model=model,
        api_base=base,
        api_key=key,
        messages=[{"role": "user", "content": "word " * 20000}],
        max_tokens=8,
    )
    fail("an over-long prompt was answered")
except litellm.ContextWindowExceededError as e:
    seen["context_window_error"] = type(e).__name__
except Exception as e:  # noqa: BLE001
    fail(f"an over-long prompt raised {type(e).__name__}: {e}")

# Tools: a required call comes back as tool_calls LiteLLM parses.
r = litellm.completion(
    model=model,
    api_base=base,
    api_key=key,
    messages=[{"role": "user", "content": "What is the weather in Paris?"}],
    max_tokens=48,
    temperature=0,
    tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}}}],
    tool_choice="required",
)
calls = r.choices[0].message.tool_calls or []
if not calls or calls[0].function.name != "get_weather":
    fail(f"no get_weather call: {r}")
seen["tool_call"] = json.loads(calls[0].function.arguments)

# What Bulkhead does not do is refused by name: BadRequestError.
try:
    litellm.completion(
        model=model,
        api_base=base,
        api_key=key,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        frequency_penalty=1.5,
    )
    fail("frequency_penalty was accepted")
except litellm.BadRequestError as e:
    seen["refused"] = "frequency_penalty" in str(e)
    if not seen["refused"]:
        fail(f"the refusal does not name frequency_penalty: {e}")

print(json.dumps(seen))
