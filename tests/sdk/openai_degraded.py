"""Reads a degraded answer through the probeok proxy with the official `openai` SDK, unchanged
but for base_url: the answer still parses, and the `probeok` object is there for a caller who
looks (`model_extra` / `to_dict()`), streamed (first chunk) and not.

Usage: python openai_degraded.py BASE_URL MODEL
Prints one JSON object.
"""

import json
import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="client-key", max_retries=0, timeout=20)
messages = [{"role": "user", "content": "hello"}]
out = {}

raw = client.chat.completions.with_raw_response.create(model=model, messages=messages)
completion = raw.parse()
out["plain"] = {
    "text": completion.choices[0].message.content,
    "mode": raw.headers.get("x-probeok-mode"),
    "model_extra": (completion.model_extra or {}).get("probeok"),
    "to_dict": completion.to_dict().get("probeok"),
}

chunks = list(client.chat.completions.create(model=model, messages=messages, stream=True))
out["stream"] = {
    "text": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
    "first": (chunks[0].model_extra or {}).get("probeok") if chunks else None,
    "later": [(c.model_extra or {}).get("probeok") for c in chunks[1:]],
}

print(json.dumps(out))
