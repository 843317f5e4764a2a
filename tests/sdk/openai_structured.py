"""Sends structured-output requests through the probeok proxy with the official `openai` SDK.

Usage: python openai_structured.py BASE_URL MODEL N
Sends N non-streamed `json_object` requests (the user message alternates "valid" and
"broken": the fake upstream answers valid JSON to the first and cut JSON to the second) and
one streamed `json_object` request. Prints one JSON object with the answers' content.
"""

import json
import sys

import openai

base_url, model, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = openai.OpenAI(base_url=base_url, api_key="client-key", max_retries=0, timeout=20)
out = {"plain": [], "stream": None}
for i in range(n):
    word = "valid" if i % 2 == 0 else "broken"
    c = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": word}],
        response_format={"type": "json_object"},
    )
    out["plain"].append(c.choices[0].message.content)

stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "valid"}],
    response_format={"type": "json_object"},
    stream=True,
)
out["stream"] = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
print(json.dumps(out))
