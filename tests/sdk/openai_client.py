"""Drives the probeok proxy with the official `openai` SDK, unchanged but for base_url.

Usage: python openai_client.py BASE_URL MODEL
Prints one JSON object: the non-streamed and streamed answers' text and probeok headers, and
what the SDK raised for a stream the proxy interrupted (the fake upstream cuts its stream short
when the user message is "interrupt"), and for an unknown model.
"""

import json
import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="client-key", max_retries=0, timeout=20)
messages = [{"role": "user", "content": "hello"}]
wanted = ["x-probeok-route", "x-probeok-attempts", "x-probeok-mode", "x-request-id",
          "x-probeok-fallback-reason"]
out = {}

raw = client.chat.completions.with_raw_response.create(model=model, messages=messages)
completion = raw.parse()
out["plain"] = {
    "text": completion.choices[0].message.content,
    "finish_reason": completion.choices[0].finish_reason,
    "headers": {h: raw.headers.get(h) for h in wanted},
}

with client.chat.completions.with_streaming_response.create(
    model=model, messages=messages, stream=True
) as resp:
    text = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in resp.parse()
        if chunk.choices
    )
    out["stream"] = {"text": text, "headers": {h: resp.headers.get(h) for h in wanted}}

try:
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "interrupt"}], stream=True,
    )
    partial = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    out["interrupted"] = {"raised": None, "text": partial}
except openai.APIError as e:
    body = e.body if isinstance(e.body, dict) else {}
    out["interrupted"] = {"raised": type(e).__name__, "code": body.get("code"),
                          "type": body.get("type")}

try:
    client.chat.completions.create(model="no-such-model", messages=messages)
    out["unknown"] = None
except openai.NotFoundError as e:
    out["unknown"] = {"status": e.status_code, "code": e.code}

print(json.dumps(out))
