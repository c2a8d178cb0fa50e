"""Tool calling through the official `openai` Python SDK, as an agent calls
it: a required call and a named one whose arguments validate against the
function's parameters, the conversation continued with the tool's result,
and a streamed call assembled from its deltas by the SDK's own helper.

Environment: BULKHEAD_BASE_URL (the gateway's /v1), BULKHEAD_TOKEN,
BULKHEAD_MODEL. Prints one JSON line of what it saw.
"""

import json
import os

import openai

client = openai.OpenAI(
    base_url=os.environ["BULKHEAD_BASE_URL"],
    api_key=os.environ["BULKHEAD_TOKEN"],
    max_retries=0,
    timeout=300,
)
MODEL = os.environ["BULKHEAD_MODEL"]
seen = {}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 40}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


def valid_weather(args):
    """The arguments as get_weather's parameters say they must be."""
    assert set(args) == {"city", "unit"}, args
    assert isinstance(args["city"], str) and len(args["city"]) <= 40, args
    assert args["unit"] in ("celsius", "fahrenheit"), args


# `required`: one call at least, its arguments valid JSON matching the schema.
r = client.chat.completions.create(
    model=MODEL,
    messages=ASK,
    tools=[WEATHER, TIME],
    tool_choice="required",
    parallel_tool_calls=False,
    temperature=0,
    max_tokens=64,
)
choice = r.choices[0]
assert choice.finish_reason == "tool_calls", choice
calls = choice.message.tool_calls
assert len(calls) == 1, calls
call = calls[0]
assert call.type == "function" and call.id.startswith("call_"), call
assert call.function.name in ("get_weather", "get_time"), call
args = json.loads(call.function.arguments)
if call.function.name == "get_weather":
    valid_weather(args)
seen["required"] = {"name": call.function.name, "arguments": args}
assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0, r.usage

# A named function: that function, whatever the model would rather do.
r = client.chat.completions.create(
    model=MODEL,
    messages=ASK,
    tools=[WEATHER, TIME],
    tool_choice={"type": "function", "function": {"name": "get_weather"}},
    temperature=0,
    max_tokens=64,
)
named = r.choices[0].message.tool_calls
assert named and all(c.function.name == "get_weather" for c in named), named
for c in named:
    valid_weather(json.loads(c.function.arguments))
seen["named"] = [json.loads(c.function.arguments) for c in named]

# The conversation goes on with the call and the tool's result, and is
# answered (text, with the tool's result in the prompt).
first = named[0]
follow = client.chat.completions.create(
    model=MODEL,
    messages=ASK
    + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": first.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": first.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": first.id, "content": "22 degrees and sunny"},
    ],
    tools=[WEATHER, TIME],
    tool_choice="none",
    temperature=0,
    max_tokens=24,
)
answer = follow.choices[0]
assert answer.message.content and not answer.message.tool_calls, answer
assert answer.finish_reason in ("stop", "length"), answer
# The call and the result were in the prompt: it is longer than the
# question's with the same functions.
seen["follow_up"] = answer.message.content
seen["follow_up_prompt_tokens"] = follow.usage.prompt_tokens
assert follow.usage.prompt_tokens > r.usage.prompt_tokens, (follow.usage, r.usage)

# Streamed: the SDK's stream helper assembles the call from its deltas.
with client.chat.completions.stream(
    model=MODEL,
    messages=ASK,
    tools=[WEATHER],
    tool_choice="required",
    temperature=0,
    max_tokens=64,
) as stream:
    for _ in stream:
        pass
    final = stream.get_final_completion()
streamed = final.choices[0]
assert streamed.finish_reason == "tool_calls", streamed
s_args = json.loads(streamed.message.tool_calls[0].function.arguments)
valid_weather(s_args)
seen["streamed"] = s_args

# A raw stream: deltas carry index, id, type and the function's fragments.
raw = client.chat.completions.create(
    model=MODEL,
    messages=ASK,
    tools=[WEATHER],
    tool_choice="required",
    temperature=0,
    max_tokens=64,
    stream=True,
)
fragments = {}
finish = None
for chunk in raw:
    for ch in chunk.choices:
        for d in ch.delta.tool_calls or []:
            f = fragments.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
            f["name"] += d.function.name or ""
            f["arguments"] += d.function.arguments or ""
        finish = ch.finish_reason or finish
assert finish == "tool_calls", finish
assert fragments[0]["id"].startswith("call_") and fragments[0]["name"] == "get_weather", fragments
valid_weather(json.loads(fragments[0]["arguments"]))
seen["raw_stream_calls"] = len(fragments)

# A schema Bulkhead cannot enforce is refused by name, not ignored.
try:
    client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"oneOf": [{"type": "string"}]}}}}}],
        max_tokens=4,
    )
    raise AssertionError("an unenforceable schema was accepted")
except openai.BadRequestError as e:
    assert e.code == "unsupported_parameter" and e.param == "tools", e.body
    assert "oneOf" in e.message, e.message
    seen["refused"] = e.param

print(json.dumps(seen))
