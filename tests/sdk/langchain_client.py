"""LangChain's ChatOpenAI against Bulkhead's OpenAI-compatible routes, as an
agent built on it calls them: an answer with its token usage, JSON mode
through with_structured_output, a stop sequence, a tool binding answered
with a parsed call, an over-long prompt raised as the context-length
error its fallbacks look for, and OpenAIEmbeddings embedding documents and
a query.

Environment: BULKHEAD_BASE_URL (ending in /v1), BULKHEAD_TOKEN,
BULKHEAD_MODEL, BULKHEAD_EMBED_MODEL. Prints one JSON line of what it saw.
"""

import json
import os

import langchain_openai
import openai
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI, OpenAIEmbeddings


def chat(**kwargs):
    return ChatOpenAI(
        base_url=os.environ["BULKHEAD_BASE_URL"],
        api_key=os.environ["BULKHEAD_TOKEN"],
        model=os.environ["BULKHEAD_MODEL"],
        temperature=0,
        max_retries=0,
        timeout=300,
        **kwargs,
    )


seen = {}

# An answer, with the usage LangChain reads from the response.
m = chat(max_tokens=8).invoke([HumanMessage("What is the capital of France?")])
assert m.content, m
assert m.usage_metadata["output_tokens"] >= 1, m.usage_metadata
assert m.response_metadata["finish_reason"] in ("stop", "length"), m.response_metadata
seen["answer"] = m.content
seen["usage"] = m.usage_metadata

# JSON mode through with_structured_output: a dict, parsed by LangChain.
cat = chat(max_tokens=48).with_structured_output(None, method="json_mode").invoke(
    "Describe a cat as a JSON object with its name and age."
)
assert isinstance(cat, dict), cat
seen["json_mode"] = cat

# A stop sequence cuts the answer before it.
full = chat(max_tokens=16).invoke("Count from one to ten in words.").content
cut = full[len(full) // 2 :][:3]
stopped = chat(max_tokens=16, stop=[cut]).invoke("Count from one to ten in words.")
assert stopped.content == full[: full.find(cut)], (full, cut, stopped.content)
assert stopped.response_metadata["finish_reason"] == "stop", stopped.response_metadata
seen["stop"] = [full, cut, stopped.content]


def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


# bind_tools: the model's answer is a call LangChain parses into tool_calls,
# with the arguments the function's signature asks for.
m = chat(max_tokens=64).bind_tools([get_weather], tool_choice="get_weather").invoke(
    "What is the weather in Paris?"
)
assert m.tool_calls, m
call = m.tool_calls[0]
assert call["name"] == "get_weather" and isinstance(call["args"].get("city"), str), call
assert call["id"].startswith("call_"), call
assert m.response_metadata["finish_reason"] == "tool_calls", m.response_metadata
seen["tool_call"] = {"name": call["name"], "args": call["args"]}

# An over-long prompt is OpenAI's context-length error.
try:
    chat(max_tokens=8).invoke("hello " * 12000)
    raise AssertionError("an over-long prompt was answered")
except openai.BadRequestError as e:
    assert e.code == "context_length_exceeded", e.body
    assert "maximum context length is" in e.message, e.message
    seen["context_error"] = e.code

# OpenAIEmbeddings, as documented for OpenAI-compatible servers: texts
# sent as text (not as tiktoken ids of OpenAI's own vocabulary).
embeddings = OpenAIEmbeddings(
    base_url=os.environ["BULKHEAD_BASE_URL"],
    api_key=os.environ["BULKHEAD_TOKEN"],
    model=os.environ["BULKHEAD_EMBED_MODEL"],
    check_embedding_ctx_length=False,
    max_retries=0,
)
documents = embeddings.embed_documents(["The cat sits on the mat.", "Revenue rose four percent."])
query = embeddings.embed_query("Where is the cat?")
seen["embeddings"] = {"documents": [len(d) for d in documents], "query": len(query)}

seen["langchain_openai"] = getattr(langchain_openai, "__version__", "?")
print(json.dumps(seen))
