#!/usr/bin/env python3
"""The real coding agents' prompts as training frames for the embedded model.

tests/agents/fixtures holds the requests Claude Code, Codex and Qwen Code really sent during a
tool turn (request 1: system prompt, tools, the user's "Use the TOOL tool with arguments ARGS and
tell me what it printed."; request 2: the same plus the tool call and the tool's result in the
agent's own wrapper). `capture` posts them to `flashserve serve --log-prompts` and keeps the
prompts exactly as the model sees them, with the shell command and its output cut out as
placeholders. tools/train_tiny.py then fills the placeholders with other commands and outputs,
so the model learns, inside each agent's real frame, to copy the arguments it is given into its
call and to quote the result it gets back. The test marker (flashserve-tool-ok) never reaches
the training data: train_tiny.py refuses a sample holding it.

    python3 tools/agent_frames.py capture --binary build/src/flashserve \\
        --model models/qwen4-tiny-code --out .train/agent_frames.json
    python3 tools/agent_frames.py show .train/agent_frames.json   # one filled sample per frame
"""
import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agent_chats as AC  # noqa: E402

MARKER = "flashserve-tool-ok"
COMMAND = "echo " + MARKER
HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "agents", "fixtures")
AGENTS = {  # fixture prefix: (shell tool, its argument holding the command)
    "claude-code": ("Bash", "command"),
    "codex": ("exec_command", "cmd"),
    "qwen-code": ("run_shell_command", "command"),
}
PLACEHOLDERS = ("{{CMD}}", "{{OUT}}", "{{CHUNK}}", "{{NTOK}}", "{{WALL}}")


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json",
                                          "anthropic-version": "2023-06-01"})
    with urllib.request.urlopen(req, timeout=600) as r:
        r.read()


def cut(text):
    """The prompt with the command, its output and Codex's per-run numbers as placeholders."""
    for p in PLACEHOLDERS:
        assert p not in text
    text = text.replace(COMMAND, "{{CMD}}")
    text = re.sub(r"Chunk ID: [0-9a-f]{6}", "Chunk ID: {{CHUNK}}", text)
    text = re.sub(r"Wall time: [0-9.]+ seconds", "Wall time: {{WALL}} seconds", text)
    text = re.sub(r"Original token count: \d+", "Original token count: {{NTOK}}", text)
    text = text.replace(MARKER, "{{OUT}}")
    assert MARKER not in text
    return text


def capture(binary, model, out):
    log = tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False).name
    srv = subprocess.Popen([binary, "serve", "--model", model, "--port", "0", "--mtp-depth", "0",
                            "--log-prompts", log], stderr=subprocess.PIPE, text=True)
    base = None
    try:
        for line in srv.stderr:
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                base = m.group(1)
                break
        assert base, "the server did not start"
        frames = []
        for agent, (tool, arg) in AGENTS.items():
            prompts = []
            for n in (2, 3):  # the tool turn's two requests
                rec = json.load(open(os.path.join(FIXTURES, f"{agent}-{n}.json")))
                body = dict(rec["body"])
                body["stream"] = False
                # One token is enough: the prompt is logged before generation starts.
                for k in ("max_tokens", "max_output_tokens", "max_completion_tokens"):
                    body.pop(k, None)
                body["max_output_tokens" if "responses" in rec["path"] else "max_tokens"] = 1
                before = sum(1 for _ in open(log))
                post(base, rec["path"], body)
                for _ in range(100):
                    lines = open(log).read().splitlines()
                    if len(lines) > before:
                        break
                    time.sleep(0.05)
                prompts.append(json.loads(lines[before])["prompt"])
            p1, p2 = prompts
            assert p2.startswith(p1), f"{agent}: request 2 does not extend request 1"
            # What follows the generation prompt in request 2: the call as the history holds it,
            # then the tool result and a new generation prompt.
            thinking = not p1.endswith("<think>\n\n</think>\n\n")
            frames.append({"agent": agent, "tool": tool, "arg": arg, "thinking": thinking,
                           "call_prompt": cut(p1), "answer_prompt": cut(p2)})
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        json.dump({"frames": frames}, open(out, "w"), indent=1)
        for f in frames:
            print(f"{f['agent']}: call prompt {len(f['call_prompt'])} chars, answer prompt "
                  f"{len(f['answer_prompt'])} chars, thinking {f['thinking']}")
    finally:
        srv.terminate()
        srv.wait()
        os.unlink(log)


# ---------------------------------------------------------------------------------------------
# Filling a frame (used by train_tiny.py).

def marker(rng):
    """agent_chats.py's made-up words and random strings, never the test's marker."""
    m = AC.marker(rng)
    return m if MARKER not in m else "x" + m


def command(rng):
    """(command, output): shell commands whose text needs no escaping inside JSON strings."""
    r = rng.random()
    if r < 0.8:
        m = marker(rng)
        return f"echo {m}", m
    if r < 0.88:
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        return f"echo $(({a} + {b}))", str(a + b)
    if r < 0.94:
        n = rng.randint(2, 5)
        return f"seq 1 {n}", "\n".join(str(i) for i in range(1, n + 1))
    return "pwd", f"/home/{rng.choice(['dev', 'alice', 'sam'])}/{rng.choice(['project', 'repo', 'work'])}"


ANSWERS = ["It printed `{out}`.", "It printed: {out}", "The command printed `{out}`.",
           "The output was `{out}`.", "It printed:\n\n```\n{out}\n```", "Output: {out}"]
THINK_CALL = ["The user wants me to run {tool} with the given arguments.", "I'll call {tool} as asked."]
THINK_ANSWER = ["The tool returned its output; I'll report it.", "I have the result."]


def fill(text, cmd, out, rng):
    return (text.replace("{{CMD}}", cmd).replace("{{OUT}}", out)
            .replace("{{CHUNK}}", f"{rng.getrandbits(24):06x}")
            .replace("{{WALL}}", f"{rng.random() * 0.02:.4f}")
            .replace("{{NTOK}}", str(max(1, math.ceil(len((out + chr(10)).encode()) / 4)))))


def sample(frame, rng, stage=None):
    """(prompt, completion, kind) for one use of a frame: the call (kind "call") or the answer
    after the result (kind "answer"), with a fresh command and output."""
    cmd, out = command(rng)
    stage = stage or rng.choice(["call", "answer"])
    think = frame["thinking"]
    if stage == "call":
        prompt = fill(frame["call_prompt"], cmd, out, rng)
        args = json.dumps({frame["arg"]: cmd}, ensure_ascii=False)
        body = "<tool_call>\n" + json.dumps({"name": frame["tool"]})[:-1] + ", \"arguments\": " + args + "}\n</tool_call>"
        reason = rng.choice(THINK_CALL).format(tool=frame["tool"])
    else:
        prompt = fill(frame["answer_prompt"], cmd, out, rng)
        body = rng.choice(ANSWERS).format(out=out)
        reason = rng.choice(THINK_ANSWER)
    completion = (f"<think>\n{reason}\n</think>\n\n" if think else "") + body + "<|im_end|>"
    assert MARKER not in prompt and MARKER not in completion
    return prompt, completion, stage


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("capture")
    c.add_argument("--binary", default="build/src/flashserve")
    c.add_argument("--model", default="models/qwen4-tiny-code")
    c.add_argument("--out", default=".train/agent_frames.json")
    s = sub.add_parser("show")
    s.add_argument("file")
    a = ap.parse_args()
    if a.mode == "capture":
        capture(a.binary, a.model, a.out)
    else:
        rng = random.Random(0)
        for f in json.load(open(a.file))["frames"]:
            for stage in ("call", "answer"):
                p, comp, _ = sample(f, rng, stage)
                print(f"===== {f['agent']} {stage}: ...{p[-700:]!r}\n----- completion: {comp!r}")


if __name__ == "__main__":
    sys.exit(main())
