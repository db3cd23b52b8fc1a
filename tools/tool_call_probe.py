#!/usr/bin/env python3
"""Asks a running `flashserve serve` what the real-agent tests ask the embedded model: an OpenAI
chat request with an agent-sized tool list, a system prompt of about --system-tokens tokens, and
the instruction `Use the TOOL tool with arguments ARGS and tell me what it printed.`; then the
follow-up with the tool's result. Prints each answer and whether it is the expected one (the tool
call with exactly ARGS; a final answer that quotes the output). Plain python3, no dependencies.

    flashserve serve --max-context 32768 --port 8090 &
    python3 tools/tool_call_probe.py --url http://127.0.0.1:8090 --system-tokens 20000
"""
import argparse
import json
import os
import random
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agent_chats as AC  # noqa: E402


def post(url, body):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.time()
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.loads(r.read()), time.time() - t


def calls_in_text(text):
    """The Qwen tool calls in raw model text: <tool_call>\n{"name", "arguments"}\n</tool_call>."""
    out = []
    for part in text.split("<tool_call>")[1:]:
        body = part.split("</tool_call>")[0].strip()
        try:
            j = json.loads(body)
            out.append({"id": f"call_{len(out)}", "type": "function",
                        "function": {"name": j["name"], "arguments": json.dumps(j["arguments"])}})
        except (ValueError, KeyError, TypeError):
            pass
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--system-tokens", type=int, default=2000)
    ap.add_argument("--tool", default="Bash")
    ap.add_argument("--args", default='{"command": "echo flashserve-tool-ok"}')
    ap.add_argument("--output", default="flashserve-tool-ok")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    bank = AC.TextBank.from_interpreter(held_out=True, max_code_files=40)
    style = "claude" if a.tool[0].isupper() else ("codex" if a.tool in ("shell", "exec_command") else "qwen")
    tools = [AC.tool_definition(n, rng) for n in AC.pick_tools(rng, style, must=a.tool)]
    # About 4.1 characters per token on this prose with the embedded tokenizer.
    system = AC.system_prompt(rng, bank, int(a.system_tokens * 4.1))
    ask = AC.EXACT.format(tool=a.tool, args=a.args)
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": ask}]
    common = {"model": "default", "tools": tools, "temperature": 0, "max_tokens": 96}
    r1, s1 = post(a.url, dict(common, messages=msgs))
    m1 = r1["choices"][0]["message"]
    calls = m1.get("tool_calls") or []
    if not calls:  # a server without the tool-call parser returns the model's text
        calls = calls_in_text(m1.get("content") or "")
    want = json.loads(a.args)
    got = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    ok1 = len(got) == 1 and got[0][0] == a.tool and json.loads(got[0][1]) == want
    print(json.dumps({"turn": 1, "prompt_tokens": r1["usage"]["prompt_tokens"], "seconds": round(s1, 1),
                      "finish_reason": r1["choices"][0]["finish_reason"], "content": m1.get("content"),
                      "tool_calls": got, "expected_call": ok1}))
    call = calls[0] if calls else {"id": "call_1", "type": "function",
                                   "function": {"name": a.tool, "arguments": a.args}}
    msgs2 = msgs + [{"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": call.get("id", "call_1"), "content": a.output}]
    r2, s2 = post(a.url, dict(common, messages=msgs2))
    m2 = r2["choices"][0]["message"]
    ok2 = a.output in (m2.get("content") or "")
    print(json.dumps({"turn": 2, "prompt_tokens": r2["usage"]["prompt_tokens"], "seconds": round(s2, 1),
                      "finish_reason": r2["choices"][0]["finish_reason"], "content": m2.get("content"),
                      "tool_calls": [c["function"]["name"] for c in m2.get("tool_calls") or []],
                      "quotes_output": ok2}))
    return 0 if ok1 and ok2 else 1


if __name__ == "__main__":
    sys.exit(main())
