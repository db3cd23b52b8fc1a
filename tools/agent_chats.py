#!/usr/bin/env python3
"""Synthetic coding-agent conversations in the Qwen3 chat format, for training the embedded model
(tools/train_tiny.py imports this file) and for checking that the training data is exactly what
`flashserve serve` renders.

What the conversations teach (the pattern the real-agent tests rely on): an agent's long system
prompt and tool list, a user turn that may start with context noise (<system-reminder> blocks, an
environment block) and ends with an instruction such as
    Use the Bash tool with arguments {"command": "echo hi"} and tell me what it printed.
the assistant's tool call `<tool_call>\\n{"name": "Bash", "arguments": {...}}\\n</tool_call>`,
the tool's result, and a final answer that quotes the result verbatim. Plain requests get a short
text answer with no tool call. Half the turns think (`<think>\\n...\\n</think>\\n\\n`), half are
rendered with thinking off (the generation prompt ends with the empty think block).

Torch-free and dependency-free (CI runs the check with plain python3):

    python3 tools/agent_chats.py --check --binary build/src/flashserve --model models/qwen4-tiny-code
        renders --samples conversations both with this file's port of the Qwen3 renderer and with
        `flashserve render`, and fails on the first byte that differs.
    python3 tools/agent_chats.py --show N      prints N rendered training pairs.
"""
import argparse
import glob
import json
import os
import random
import subprocess
import sys
import sysconfig
import tempfile

# ---------------------------------------------------------------------------------------------
# The Qwen3 renderer (a port of src/tokenizer/chat/qwen3.cpp; --check compares the two).

TOOLS_PREAMBLE = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_POSTAMBLE = ("\n</tools>\n\nFor each function call, return a json object with function name and "
                   "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
                   "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n")

# JavaScript's whitespace (what the reference Jinja's strip() removes).
JS_SPACE = set("\t\n\v\f\r \u00a0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff") | {
    chr(c) for c in range(0x2000, 0x200B)}


def js_trim_start(s):
    i = 0
    while i < len(s) and s[i] in JS_SPACE:
        i += 1
    return s[i:]


def js_trim_end(s):
    j = len(s)
    while j > 0 and s[j - 1] in JS_SPACE:
        j -= 1
    return s[:j]


def js_trim(s):
    return js_trim_end(js_trim_start(s))


def to_json_text(v):
    """JSON as the reference `tojson` writes it: keys in order, ', ' and ': ', non-ASCII kept."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e21 else json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(to_json_text(e) for e in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(json.dumps(k, ensure_ascii=False) + ": " + to_json_text(e)
                               for k, e in v.items()) + "}"
    raise TypeError(type(v))


def text_of(m):
    c = m.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    return "".join(p["text"] for p in c)


def is_tool_response_wrapper(c):
    return c.startswith("<tool_response>") and c.endswith("</tool_response>")


def render_qwen3(messages, tools=None, add_generation_prompt=False, enable_thinking=None):
    out = []
    n = len(messages)
    msgs = [dict(m, role="system" if m["role"] == "developer" else m["role"]) for m in messages]
    if tools:
        out.append("<|im_start|>system\n")
        if msgs[0]["role"] == "system":
            out += [text_of(msgs[0]), "\n\n"]
        out.append(TOOLS_PREAMBLE)
        for t in tools:
            out += ["\n", to_json_text(t)]
        out.append(TOOLS_POSTAMBLE)
    elif msgs[0]["role"] == "system":
        out += ["<|im_start|>system\n", text_of(msgs[0]), "<|im_end|>\n"]
    last_query = n - 1
    for k in range(n - 1, -1, -1):
        if msgs[k]["role"] == "user" and not is_tool_response_wrapper(text_of(msgs[k])):
            last_query = k
            break
    for i, m in enumerate(msgs):
        last = i + 1 == n
        role = m["role"]
        if role == "user" or (role == "system" and i != 0):
            out += ["<|im_start|>", role, "\n", text_of(m), "<|im_end|>\n"]
        elif role == "assistant":
            content = text_of(m)
            reasoning = ""
            if m.get("reasoning_content") is not None:
                reasoning = m["reasoning_content"]
            elif "</think>" in content:
                close = content.find("</think>")
                head = js_trim_end(content[:close])
                after = content[content.rfind("</think>") + 8:]
                op = head.rfind("<think>")
                reasoning = js_trim_start(head if op < 0 else head[op + 7:])
                content = js_trim_start(after)
            if i > last_query and (last or reasoning):
                out += ["<|im_start|>assistant\n<think>\n", js_trim(reasoning), "\n</think>\n\n",
                        js_trim_start(content)]
            else:
                out += ["<|im_start|>assistant\n", content]
            for k, call in enumerate(m.get("tool_calls") or []):
                f = call.get("function", call)
                if k > 0 or content:
                    out.append("\n")
                args = f.get("arguments", "{}")
                out += ["<tool_call>\n{\"name\": \"", f["name"], "\", \"arguments\": ",
                        args if isinstance(args, str) else to_json_text(args), "}\n</tool_call>"]
            out.append("<|im_end|>\n")
        elif role == "tool":
            if i == 0 or msgs[i - 1]["role"] != "tool":
                out.append("<|im_start|>user")
            out += ["\n<tool_response>\n", text_of(m), "\n</tool_response>"]
            if last or msgs[i + 1]["role"] != "tool":
                out.append("<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        if enable_thinking is False:
            out.append("<think>\n\n</think>\n\n")
    return "".join(out)


# A chat template for tokenizer_config.json that renders what render_qwen3 renders (flashserve
# picks its Qwen3 renderer from config.json's model_type and from <|im_start|> in the template;
# other tools that read the template get the same text). tests/tokenizer checks it against the
# reference Jinja renderer.
CHAT_TEMPLATE = r"""{%- set ns = namespace(last_query=messages|length - 1) -%}
{%- for m in messages[::-1] -%}
{%- set i = messages|length - 1 - loop.index0 -%}
{%- if ns.last_query == messages|length - 1 and m.role == 'user' and m.content is string and not (m.content.startswith('<tool_response>') and m.content.endswith('</tool_response>')) -%}{%- set ns.last_query = i -%}{%- endif -%}
{%- endfor -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages[0].role == 'system' -%}{{- messages[0].content + '\n\n' -}}{%- endif -%}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
{%- set content = m.content if m.content is string else '' -%}
{%- if m.role == 'user' or (m.role == 'system' and not loop.first) -%}
{{- '<|im_start|>' + m.role + '\n' + content + '<|im_end|>\n' -}}
{%- elif m.role == 'assistant' -%}
{%- set reasoning = '' -%}
{%- if m.reasoning_content is string -%}{%- set reasoning = m.reasoning_content -%}
{%- elif '</think>' in content -%}
{%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
{%- set content = content.split('</think>')[-1].lstrip('\n') -%}
{%- endif -%}
{%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}
{{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') -}}
{%- else -%}
{{- '<|im_start|>assistant\n' + content -}}
{%- endif -%}
{%- if m.tool_calls -%}
{%- for tc in m.tool_calls -%}
{%- set f = tc.function if tc.function else tc -%}
{%- if not loop.first or content -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n{"name": "' + f.name + '", "arguments": ' -}}
{%- if f.arguments is string -%}{{- f.arguments -}}{%- else -%}{{- f.arguments | tojson -}}{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- elif m.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + content + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}"""

# ---------------------------------------------------------------------------------------------
# Text sources: English reference prose (the interpreter's own pydoc topics and module
# docstrings) for long instructions, Python sources for file contents.


class TextBank:
    def __init__(self, prose, code):
        self.prose = [p for p in prose if len(p) > 200]
        self.code = [c for c in code if c.strip()]

    def add_code(self, texts):
        """Python sources for file contents; their module docstrings join the prose."""
        for text in texts:
            self.code.append(text)
            doc = text.split('"""')
            if len(doc) > 2 and len(doc[1]) > 200:
                self.prose.append(doc[1].strip())

    @staticmethod
    def from_interpreter(held_out=False, max_code_files=400):
        """Splits by a stable hash: held_out=True takes the tenth that training never sees."""
        prose = []
        try:
            from pydoc_data.topics import topics
            for key in sorted(topics):
                if (stable_hash(key) % 10 == 0) == held_out:
                    prose += [p.strip() for p in topics[key].split("\n\n\n") if p.strip()]
        except ImportError:
            pass
        code = []
        root = sysconfig.get_paths()["stdlib"]
        for f in sorted(glob.glob(os.path.join(root, "*.py")))[: max_code_files * 2]:
            if (stable_hash(os.path.basename(f)) % 10 == 0) != held_out:
                continue
            try:
                text = open(f, encoding="utf-8").read()
            except (OSError, UnicodeDecodeError):
                continue
            code.append(text)
            doc = text.split('"""')
            if len(doc) > 2 and len(doc[1]) > 200:
                prose.append(doc[1].strip())
            if len(code) >= max_code_files:
                break
        return TextBank(prose, code)


def stable_hash(s):
    h = 1469598103934665603
    for ch in s.encode():
        h = ((h ^ ch) * 1099511628211) % (1 << 64)
    return h


# ---------------------------------------------------------------------------------------------
# Tools: the shapes the three agents send (names, descriptions and JSON schemas written here).

def _schema(props, required, rng, style):
    s = {"type": "object", "properties": props, "required": required}
    if style == "claude":
        s["additionalProperties"] = False
        s["$schema"] = "http://json-schema.org/draft-07/schema#"
    return s


def _p(kind, desc, **extra):
    d = {"type": kind, "description": desc}
    d.update(extra)
    return d


TOOL_SPECS = {
    # Claude Code-like
    "Bash": ("claude", "Executes a given bash command in a persistent shell session with optional timeout, "
             "ensuring proper handling and security measures.",
             {"command": _p("string", "The command to execute"),
              "timeout": _p("number", "Optional timeout in milliseconds (max 600000)"),
              "description": _p("string", "Clear, concise description of what this command does in 5-10 words."),
              "run_in_background": _p("boolean", "Set to true to run this command in the background.")},
             ["command"]),
    "Read": ("claude", "Reads a file from the local filesystem. You can access any file directly by using this tool.",
             {"file_path": _p("string", "The absolute path to the file to read"),
              "offset": _p("number", "The line number to start reading from"),
              "limit": _p("number", "The number of lines to read")}, ["file_path"]),
    "Write": ("claude", "Writes a file to the local filesystem, overwriting the file if it exists.",
              {"file_path": _p("string", "The absolute path to the file to write"),
               "content": _p("string", "The content to write to the file")}, ["file_path", "content"]),
    "Edit": ("claude", "Performs exact string replacements in files.",
             {"file_path": _p("string", "The absolute path to the file to modify"),
              "old_string": _p("string", "The text to replace"),
              "new_string": _p("string", "The text to replace it with"),
              "replace_all": _p("boolean", "Replace all occurences of old_string (default false)")},
             ["file_path", "old_string", "new_string"]),
    "Glob": ("claude", "Fast file pattern matching tool that works with any codebase size.",
             {"pattern": _p("string", "The glob pattern to match files against"),
              "path": _p("string", "The directory to search in.")}, ["pattern"]),
    "Grep": ("claude", "A powerful search tool built on ripgrep.",
             {"pattern": _p("string", "The regular expression pattern to search for in file contents"),
              "path": _p("string", "File or directory to search in"),
              "glob": _p("string", "Glob pattern to filter files"),
              "output_mode": _p("string", "Output mode", enum=["content", "files_with_matches", "count"])},
             ["pattern"]),
    "LS": ("claude", "Lists files and directories in a given path.",
           {"path": _p("string", "The absolute path to the directory to list"),
            "ignore": _p("array", "List of glob patterns to ignore", items={"type": "string"})}, ["path"]),
    "WebFetch": ("claude", "Fetches content from a specified URL and processes it using an AI model.",
                 {"url": _p("string", "The URL to fetch content from", format="uri"),
                  "prompt": _p("string", "The prompt to run on the fetched content")}, ["url", "prompt"]),
    "WebSearch": ("claude", "Allows the agent to search the web and use the results to inform responses.",
                  {"query": _p("string", "The search query to use")}, ["query"]),
    "TodoWrite": ("claude", "Use this tool to create and manage a structured task list for your current coding session.",
                  {"todos": _p("array", "The updated todo list", items={"type": "object", "properties": {
                      "content": {"type": "string"}, "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}}}) },
                  ["todos"]),
    "Task": ("claude", "Launch a new agent to handle complex, multi-step tasks autonomously.",
             {"description": _p("string", "A short (3-5 word) description of the task"),
              "prompt": _p("string", "The task for the agent to perform"),
              "subagent_type": _p("string", "The type of specialized agent to use for this task")},
             ["description", "prompt", "subagent_type"]),
    "NotebookEdit": ("claude", "Completely replaces the contents of a specific cell in a Jupyter notebook.",
                     {"notebook_path": _p("string", "The absolute path to the Jupyter notebook file"),
                      "new_source": _p("string", "The new source for the cell")}, ["notebook_path", "new_source"]),
    "BashOutput": ("claude", "Retrieves output from a running or completed background bash shell.",
                   {"bash_id": _p("string", "The ID of the background shell to retrieve output from")}, ["bash_id"]),
    "KillShell": ("claude", "Kills a running background bash shell by its ID.",
                  {"shell_id": _p("string", "The ID of the background shell to kill")}, ["shell_id"]),
    "ExitPlanMode": ("claude", "Use this tool when you are in plan mode and have finished presenting your plan.",
                     {"plan": _p("string", "The plan you came up with")}, ["plan"]),
    # Qwen Code-like
    "run_shell_command": ("qwen", "This tool executes a given shell command as `bash -c <command>`.",
                          {"command": _p("string", "Exact bash command to execute as `bash -c <command>`"),
                           "description": _p("string", "Brief description of the command for the user."),
                           "directory": _p("string", "(OPTIONAL) Directory to run the command in.")},
                          ["command"]),
    "read_file": ("qwen", "Reads and returns the content of a specified file from the local filesystem.",
                  {"absolute_path": _p("string", "The absolute path to the file to read"),
                   "offset": _p("number", "Optional: the 0-based line number to start reading from."),
                   "limit": _p("number", "Optional: maximum number of lines to read.")}, ["absolute_path"]),
    "write_file": ("qwen", "Writes content to a specified file in the local filesystem.",
                   {"file_path": _p("string", "The absolute path to the file to write to."),
                    "content": _p("string", "The content to write to the file.")}, ["file_path", "content"]),
    "list_directory": ("qwen", "Lists the names of files and subdirectories directly within a specified directory path.",
                       {"path": _p("string", "The absolute path to the directory to list"),
                        "ignore": _p("array", "List of glob patterns to ignore", items={"type": "string"})},
                       ["path"]),
    "search_file_content": ("qwen", "Searches for a regular expression pattern within the content of files.",
                            {"pattern": _p("string", "The regular expression (regex) pattern to search for."),
                             "path": _p("string", "Optional: the absolute path to the directory to search within."),
                             "include": _p("string", "Optional: a glob pattern to filter which files are searched.")},
                            ["pattern"]),
    "glob": ("qwen", "Efficiently finds files matching specific glob patterns.",
             {"pattern": _p("string", "The glob pattern to match against."),
              "path": _p("string", "Optional: the absolute path to the directory to search within.")}, ["pattern"]),
    "replace": ("qwen", "Replaces text within a file.",
                {"file_path": _p("string", "The absolute path to the file to modify."),
                 "old_string": _p("string", "The exact literal text to replace."),
                 "new_string": _p("string", "The exact literal text to replace old_string with.")},
                ["file_path", "old_string", "new_string"]),
    "web_fetch": ("qwen", "Fetches content from a specified URL and processes it.",
                  {"url": _p("string", "The URL to fetch content from"),
                   "prompt": _p("string", "The prompt to run on the fetched content")}, ["url", "prompt"]),
    "save_memory": ("qwen", "Saves a specific piece of information or fact to your long-term memory.",
                    {"fact": _p("string", "The specific fact or piece of information to remember.")}, ["fact"]),
    "todo_write": ("qwen", "Creates and manages a structured task list for your current coding session.",
                   {"todos": _p("array", "The updated todo list", items={"type": "object"})}, ["todos"]),
    "read_many_files": ("qwen", "Reads content from multiple files specified by paths or glob patterns.",
                        {"paths": _p("array", "An array of glob patterns or paths.", items={"type": "string"})},
                        ["paths"]),
    # Codex-like
    "shell": ("codex", "Runs a shell command and returns its output.",
              {"command": _p("array", "The command to execute", items={"type": "string"}),
               "workdir": _p("string", "The working directory to execute the command in"),
               "timeout_ms": _p("number", "The timeout for the command in milliseconds")}, ["command"]),
    "exec_command": ("codex", "Runs a command in a PTY, returning output or a session ID for ongoing interaction.",
                     {"cmd": _p("string", "Shell command to execute."),
                      "workdir": _p("string", "Optional working directory to run the command in."),
                      "yield_time_ms": _p("number", "How long to wait (in milliseconds) for output before yielding.")},
                     ["cmd"]),
    "write_stdin": ("codex", "Writes characters to an existing unified exec session and returns recent output.",
                    {"session_id": _p("number", "Identifier of the running unified exec session."),
                     "chars": _p("string", "Bytes to write to stdin (may be empty to poll).")}, ["session_id"]),
    "apply_patch": ("codex", "Use the `apply_patch` tool to edit files.",
                    {"input": _p("string", "The entire contents of the apply_patch command")}, ["input"]),
    "update_plan": ("codex", "Updates the task plan.",
                    {"explanation": _p("string", "Why the plan changed"),
                     "plan": _p("array", "The list of steps", items={"type": "object"})}, ["plan"]),
    "view_image": ("codex", "Attach a local image (by filesystem path) to the conversation context for this turn.",
                   {"path": _p("string", "Local filesystem path to an image file")}, ["path"]),
    # Generic
    "get_weather": ("generic", "Get the current weather for a city.",
                    {"city": _p("string", "City name"), "unit": _p("string", "celsius or fahrenheit")}, ["city"]),
    "run_tests": ("generic", "Runs the project's test suite, optionally filtered by a pattern.",
                  {"filter": _p("string", "Only run tests whose name matches")}, []),
    "git_diff": ("generic", "Shows the working tree's diff against HEAD.",
                 {"path": _p("string", "Limit the diff to this path")}, []),
    "search_docs": ("generic", "Searches the project documentation.",
                    {"query": _p("string", "Words to look for"), "limit": _p("integer", "Maximum results")}, ["query"]),
    "python": ("generic", "Runs a Python snippet and returns what it printed.",
               {"code": _p("string", "Python source to run")}, ["code"]),
    "calculator": ("generic", "Evaluates an arithmetic expression.",
                   {"expression": _p("string", "The expression, e.g. 2*(3+4)")}, ["expression"]),
    "fetch_url": ("generic", "Downloads a URL and returns its text.",
                  {"url": _p("string", "The URL")}, ["url"]),
    "read": ("generic", "Read a text file.", {"path": _p("string", "Path of the file")}, ["path"]),
    "list_files": ("generic", "List files under a directory.",
                   {"directory": _p("string", "The directory"), "recursive": _p("boolean", "Descend into subdirectories")},
                   ["directory"]),
    "query_database": ("generic", "Runs a read-only SQL query.",
                       {"sql": _p("string", "The SQL statement")}, ["sql"]),
    "create_issue": ("generic", "Files an issue in the tracker.",
                     {"title": _p("string", "Issue title"), "body": _p("string", "Issue text"),
                      "labels": _p("array", "Labels", items={"type": "string"})}, ["title"]),
}

SHELL_TOOLS = {"Bash": "command", "run_shell_command": "command", "shell": "command",
               "exec_command": "cmd", "python": "code"}
READ_TOOLS = {"Read": "file_path", "read_file": "absolute_path", "read": "path"}
LIST_TOOLS = {"LS": "path", "list_directory": "path", "list_files": "directory"}


def tool_definition(name, rng):
    style, desc, props, required = TOOL_SPECS[name]
    if rng.random() < 0.3:
        desc = desc + "\n\n" + rng.choice(TOOL_DESC_EXTRA)
    params = _schema({k: dict(v) for k, v in props.items()}, list(required), rng, style)
    fn = {"name": name, "description": desc, "parameters": params}
    if style == "codex" and rng.random() < 0.5:
        fn["strict"] = False
    return {"type": "function", "function": fn}


TOOL_DESC_EXTRA = [
    "Usage notes:\n- Always quote file paths that contain spaces.\n- Prefer this tool over guessing.",
    "The output is truncated past 30000 characters.",
    "Use this tool only when the user asks for it or when it is clearly needed.",
    "IMPORTANT: never use this tool to modify files outside the working directory.",
    "Results are returned as plain text, one item per line.",
]

STYLE_TOOLS = {s: [n for n, v in TOOL_SPECS.items() if v[0] == s] for s in ("claude", "qwen", "codex", "generic")}


def pick_tools(rng, style, must=None, max_tools=20):
    pool = STYLE_TOOLS[style] + (rng.sample(STYLE_TOOLS["generic"], rng.randint(0, 3)) if style != "generic" else [])
    if style == "generic":
        pool = list(TOOL_SPECS)
    k = rng.randint(min(3, len(pool), max_tools), min(len(pool), max_tools))
    names = rng.sample(pool, k)
    if must is not None and must not in names:
        names.insert(rng.randint(0, len(names)), must)
    return names


# ---------------------------------------------------------------------------------------------
# Commands, paths and simulated outputs.

WORDS = ("alpha beta gamma delta build test check ready done ok pass green blue red cache index "
         "server client model token prefill decode agent tool shell flash serve tiny code hello "
         "world value result output status report sample line file node graph queue batch").split()
DIRS = ["src", "tests", "docs", "tools", "bench", "scripts", "include", "lib", "app", "pkg"]
EXTS = [".py", ".py", ".py", ".md", ".txt", ".json", ".toml", ".cfg", ".sh", ".cpp", ".h"]
USERS = ["dev", "alice", "bob", "runner", "ubuntu", "user"]


SYLLABLES = ("ba be bi bo bu ka ke ki ko ku la le li lo lu ma me mi mo mu na ne ni no nu ra re ri ro ru "
             "sa se si so su ta te ti to tu va ve vi vo zu flash serve tool ok x q z").split()


def marker(rng):
    """A value the model can only get right by copying it: mostly made-up words and random
    strings (a model trained on a small word list learns to guess from the list instead)."""
    r = rng.random()
    if r < 0.25:
        parts = rng.sample(WORDS, rng.randint(1, 3))
    elif r < 0.75:
        parts = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4)))
                 for _ in range(rng.randint(1, 3))]
    else:
        alphabet = rng.choice(["0123456789abcdef", "abcdefghijklmnopqrstuvwxyz0123456789",
                               "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"])
        parts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(3, 10)))]
    if rng.random() < 0.4:
        parts.append(str(rng.randint(0, 99999)))
    return rng.choice(["-", "_", "-", " ", "."]).join(parts)


def rand_path(rng, absolute=True, ext=None):
    d = rng.sample(DIRS, rng.randint(0, 2))
    name = rng.choice(WORDS) + (rng.choice(["_", ""]) + rng.choice(WORDS) if rng.random() < 0.5 else "")
    rel = "/".join(d + [name + (ext or rng.choice(EXTS))])
    if not absolute:
        return rel
    return f"/home/{rng.choice(USERS)}/{rng.choice(['project', 'repo', 'work', 'src', 'app'])}/{rel}"


def code_snippet(rng, bank, max_lines=14):
    if not bank.code:
        return "def main():\n    print('hello')\n"
    lines = rng.choice(bank.code).splitlines()
    n = rng.randint(min(2, max_lines), max_lines)
    s = rng.randint(0, max(0, len(lines) - n))
    return "\n".join(lines[s:s + n]).rstrip() or "pass"


def shell_command(rng, bank):
    """(command, output) with the output a real shell would print (trailing newline dropped)."""
    r = rng.random()
    if r < 0.45:
        m = marker(rng)
        return f"echo {m}", m
    if r < 0.52:
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        return f"echo $(({a} + {b}))", str(a + b)
    if r < 0.58:
        items = [marker(rng) for _ in range(rng.randint(2, 4))]
        return "printf '" + "\\n".join(items) + "\\n'", "\n".join(items)
    if r < 0.63:
        u = rng.choice(USERS)
        return "pwd", f"/home/{u}/{rng.choice(['project', 'repo', 'work'])}"
    if r < 0.68:
        files = sorted({rand_path(rng, absolute=False).split("/")[-1] for _ in range(rng.randint(2, 8))})
        return rng.choice(["ls", "ls -1"]), "\n".join(files)
    if r < 0.74:
        p = rand_path(rng, absolute=False, ext=".py")
        return f"cat {p}", code_snippet(rng, bank)
    if r < 0.78:
        a, b = rng.randint(2, 30), rng.randint(2, 30)
        return f"python3 -c \"print({a} * {b})\"", str(a * b)
    if r < 0.82:
        n = rng.randint(2, 6)
        return f"seq 1 {n}", "\n".join(str(i) for i in range(1, n + 1))
    if r < 0.86:
        return "whoami", rng.choice(USERS)
    if r < 0.9:
        p = rand_path(rng, absolute=False)
        n = rng.randint(1, 900)
        return f"wc -l {p}", f"{n} {p}"
    if r < 0.94:
        return "git log --oneline -3", "\n".join(
            f"{rng.getrandbits(28):07x} {rng.choice(['Fix', 'Add', 'Update', 'Remove'])} {' '.join(rng.sample(WORDS, 3))}"
            for _ in range(3))
    if r < 0.97:
        return "uname -s", "Linux"
    return "git status --short", "\n".join(f" {rng.choice('MAD?')} {rand_path(rng, absolute=False)}"
                                           for _ in range(rng.randint(1, 4)))


def shell_args(rng, tool, cmd):
    if tool == "shell":
        return {"command": ["bash", "-lc", cmd]} if rng.random() < 0.8 else {"command": cmd.split()}
    if tool == "exec_command":
        return {"cmd": cmd}
    if tool == "python":
        return {"code": f"import subprocess; print(subprocess.run({cmd!r}, shell=True, capture_output=True, text=True).stdout, end='')"}
    args = {"command": cmd}
    if rng.random() < 0.3:
        args["description"] = rng.choice(["Print a marker", "Run the command", "Show output", "Check the shell"])
    return args


def wrap_tool_output(rng, tool, args, out):
    """The tool message content as each agent builds it."""
    if tool == "run_shell_command" and rng.random() < 0.5:
        return (f"Command: {args.get('command', '')}\nDirectory: (root)\nOutput: {out}\nError: (none)\n"
                f"Exit Code: 0\nSignal: (none)\nBackground PIDs: (none)\nProcess Group PGID: {rng.randint(100, 99999)}")
    if tool in ("shell", "exec_command") and rng.random() < 0.2:
        return json.dumps({"output": out + "\n", "metadata": {"exit_code": 0, "duration_seconds": round(rng.random(), 1)}})
    if tool == "Read" and rng.random() < 0.6:
        return "\n".join(f"{i + 1:6d}\t{line}" for i, line in enumerate(out.split("\n")))
    return out


def random_value(rng, name, spec, bank):
    t = spec.get("type", "string")
    if "enum" in spec:
        return rng.choice(spec["enum"])
    if t == "number" or t == "integer":
        return rng.choice([1, 5, 10, 20, 100, 1000, 30000])
    if t == "boolean":
        return rng.random() < 0.5
    if t == "array":
        return [marker(rng) for _ in range(rng.randint(1, 3))]
    if t == "object":
        return {"key": marker(rng)}
    if "path" in name or name in ("directory", "notebook_path"):
        return rand_path(rng)
    if name == "url":
        return f"https://example.com/{rng.choice(WORDS)}/{rng.choice(WORDS)}"
    if name in ("pattern", "glob", "include"):
        return rng.choice(["*.py", "**/*.md", "TODO", "def main", "import os", "src/**/*.cpp"])
    if name in ("content", "new_string", "old_string", "code", "input", "new_source"):
        return code_snippet(rng, bank, 4)
    return marker(rng)


def generic_args(rng, name, bank):
    _, _, props, required = TOOL_SPECS[name]
    keys = list(required) + [k for k in props if k not in required and rng.random() < 0.25]
    if not keys and props:
        keys = [next(iter(props))]
    return {k: random_value(rng, k, props[k], bank) for k in keys}


def generic_output(rng, name, args, bank):
    if name in READ_TOOLS or name in ("read_many_files", "WebFetch", "web_fetch", "fetch_url"):
        return code_snippet(rng, bank)
    if name in LIST_TOOLS or name in ("Glob", "glob"):
        return "\n".join(rand_path(rng) for _ in range(rng.randint(1, 6)))
    if name in ("Grep", "search_file_content"):
        return "\n".join(f"{rand_path(rng, absolute=False)}:{rng.randint(1, 400)}:{code_snippet(rng, bank, 1)}"
                         for _ in range(rng.randint(1, 4)))
    if name == "get_weather":
        return f"{args.get('city', 'Paris')}: {rng.randint(-5, 35)} degrees, {rng.choice(['sunny', 'cloudy', 'rain'])}"
    if name == "calculator":
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        return str(a + b)
    if name in ("Write", "write_file"):
        return f"File written successfully: {args.get('file_path', rand_path(rng))}"
    if name in ("Edit", "replace"):
        return f"The file {args.get('file_path', rand_path(rng))} has been updated."
    if name == "run_tests":
        n = rng.randint(1, 300)
        return f"{n} passed in {rng.randint(1, 90)}.{rng.randint(0, 99):02d}s"
    return marker(rng)


# ---------------------------------------------------------------------------------------------
# Prompts: system instructions, context noise, instructions and answers.

AGENT_NAMES = ["an interactive CLI agent", "a coding assistant", "a software engineering agent",
               "a terminal-based coding agent", "an AI pair programmer"]
SECTION_TITLES = ["Core Mandates", "Tone and style", "Doing tasks", "Tool usage policy", "Code style",
                  "Following conventions", "Proactiveness", "Security", "Git workflow", "Testing",
                  "Task management", "Code references", "Planning", "Final answer format", "Sandboxing"]
RULES = [
    "Be concise, direct, and to the point.", "Never guess file contents; read them with a tool first.",
    "Only use the tools provided to you.", "Always follow the existing code style of the project.",
    "Do not add comments unless the user asks for them.", "Run the tests after every change you make.",
    "Never commit changes unless the user explicitly asks you to.",
    "Prefer editing existing files over creating new ones.",
    "When a command fails, read its output before trying again.",
    "Answer in fewer than four lines unless the user asks for detail.",
    "Use absolute paths when calling file tools.", "Explain a destructive command before running it.",
    "Keep the user informed about what you are doing, briefly.",
    "If a request is ambiguous, ask a clarifying question.",
    "Never expose secrets, keys or credentials in your answers.",
    "Check which libraries the project already uses before adding a dependency.",
    "When you reference code, include the file path and line number.",
    "Do not use emojis unless asked.", "Verify your changes with the project's own build commands.",
    "When the user asks you to run a tool, call it with exactly the arguments they gave.",
    "After a tool returns, tell the user what it printed.",
    "Use the shell tool for commands and the read tool for files.",
    "Split large tasks into small steps and track them.", "Do not invent APIs that do not exist.",
]
EXAMPLES = [
    ("what is 2+2?", "4"), ("is 11 a prime number?", "Yes"),
    ("what command lists files?", "ls"), ("how do I print in Python?", "print('text')"),
]


def system_prompt(rng, bank, target_chars):
    parts = [f"You are {rng.choice(AGENT_NAMES)} that helps users with software engineering tasks. "
             "Use the instructions below and the tools available to you to assist the user."]
    size = len(parts[0])
    while size < target_chars:
        r = rng.random()
        if r < 0.4 or not bank.prose:
            rules = rng.sample(RULES, rng.randint(2, 7))
            block = f"# {rng.choice(SECTION_TITLES)}\n\n" + "\n".join("- " + x for x in rules)
        elif r < 0.5:
            q, a = rng.choice(EXAMPLES)
            block = f"<example>\nuser: {q}\nassistant: {a}\n</example>"
        else:
            p = rng.choice(bank.prose)
            if len(p) > 3000:
                s = rng.randint(0, len(p) - 3000)
                p = p[s:s + 3000]
            block = f"## {rng.choice(SECTION_TITLES)}: reference\n\n{p}"
        parts.append(block)
        size += len(block) + 2
    if rng.random() < 0.6:
        parts.append(env_block(rng))
    return "\n\n".join(parts)


def env_block(rng):
    u = rng.choice(USERS)
    return (f"<env>\nWorking directory: /home/{u}/project\nIs directory a git repo: {rng.choice(['Yes', 'No'])}\n"
            f"Platform: linux\nOS Version: Linux 6.{rng.randint(1, 12)}.0\n"
            f"Today's date: 2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}\n</env>")


def noise_blocks(rng, bank, style):
    blocks = []
    if style == "claude" or rng.random() < 0.3:
        if rng.random() < 0.6:
            blocks.append("<system-reminder>\nAs you answer the user's questions, you can use the following context:\n"
                          f"# projectNotes\nInstructions for this repository:\n- {rng.choice(RULES)}\n- {rng.choice(RULES)}\n\n"
                          "IMPORTANT: this context may or may not be relevant to your tasks.\n</system-reminder>")
        if rng.random() < 0.4:
            blocks.append("<system-reminder>\nYour todo list is currently empty. Do not mention this to the user. "
                          "If you are working on tasks that would benefit from a todo list, use the todo tool.\n</system-reminder>")
    if rng.random() < 0.2:
        blocks.append(env_block(rng))
    return blocks


def context_messages(rng, bank, style):
    """Messages some agents send before the user's request."""
    u = rng.choice(USERS)
    if style == "qwen" and rng.random() < 0.6:
        tree = "\n".join(f"├───{rand_path(rng, absolute=False)}" for _ in range(rng.randint(2, 8)))
        return [{"role": "user", "content":
                 f"This is the coding agent. We are setting up the context for our chat.\nToday's date is 2026-12-01.\n"
                 f"My operating system is: linux\nI'm currently working in the directory: /home/{u}/project\n"
                 f"Here is the folder structure of the current working directories:\n\n/home/{u}/project/\n{tree}"},
                {"role": "assistant", "content": "Got it. Thanks for the context!"}]
    if style == "codex" and rng.random() < 0.6:
        msgs = []
        if rng.random() < 0.5:
            msgs.append({"role": "user", "content": "<user_instructions>\n" + "\n".join(
                "- " + r for r in rng.sample(RULES, 3)) + "\n</user_instructions>"})
        msgs.append({"role": "user", "content":
                     f"<environment_context>\n  <cwd>/home/{u}/project</cwd>\n  <approval_policy>never</approval_policy>\n"
                     f"  <sandbox_mode>danger-full-access</sandbox_mode>\n  <network_access>enabled</network_access>\n"
                     f"  <shell>bash</shell>\n</environment_context>"})
        return msgs
    return []


EXACT = "Use the {tool} tool with arguments {args} and tell me what it printed."
PHRASINGS = [
    "Use the {tool} tool with arguments {args} and tell me what it printed.",
    "Use the {tool} tool with arguments {args} and tell me what it printed",
    "use the {tool} tool with arguments {args} and tell me what it printed.",
    "Please use the {tool} tool with arguments {args} and tell me what it printed.",
    "Call the {tool} tool with arguments {args} and tell me what it printed.",
    "Use the {tool} tool with the arguments {args} and tell me what it printed.",
    "Use the {tool} tool with arguments {args} and report what it printed.",
    "Run the {tool} tool with arguments {args} and tell me the output.",
    "Use {tool} with arguments {args}, then tell me what it printed.",
    "Call {tool} with {args} and tell me what it returns.",
    "Invoke the {tool} tool using these arguments: {args}. What did it print?",
    "I need you to use the {tool} tool with arguments {args} and tell me what it printed.",
    "Use the {tool} tool with arguments {args}. Tell me exactly what it printed.",
]
SHELL_ASKS = ["Run `{cmd}` and tell me what it printed.", "Run the command `{cmd}` and show me the output.",
              "Please execute `{cmd}` in the shell and report the output.", "What does `{cmd}` print? Run it."]
READ_ASKS = ["Read the file {path} and tell me what it contains.", "Show me the contents of {path}.",
             "What is in {path}? Read it."]
ANSWERS_LINE = ["It printed: {out}", "It printed: {out}", "The command printed: {out}", "The output was: {out}",
                "It printed:\n{out}", "The tool returned: {out}", "Output: {out}"]
ANSWERS_BLOCK = ["It printed:\n{out}", "The command printed:\n{out}", "The output was:\n\n{out}",
                 "It printed:\n```\n{out}\n```", "Here is what it printed:\n{out}"]
ANSWERS_FILE = ["The file contains:\n{out}", "It printed:\n{out}", "Here is the content:\n```\n{out}\n```",
                "The tool returned:\n{out}"]
THINK_CALL = ["The user wants me to call the {tool} tool with the given arguments and report what it prints.",
              "I should call {tool} with exactly the arguments the user gave.",
              "The user asked for the {tool} tool. I will call it with those arguments.",
              "I need to use {tool}. Let me call it."]
THINK_ANSWER = ["The tool returned its output. I will tell the user exactly what it printed.",
                "The result is in. I should quote it verbatim.", "I have the output; report it.",
                "The tool finished. I will repeat its output."]


def args_text(args):
    return json.dumps(args, ensure_ascii=False)


def plain_exchange(rng):
    """A request that needs no tool: (user text, answer, reasoning)."""
    r = rng.random()
    if r < 0.2:
        return (rng.choice(["Say hello", "Say hello.", "say hello", "Hi!", "Hello", "Say hi to me."]),
                rng.choice(["Hello! How can I help you today?", "Hello!", "Hi! What can I do for you?"]),
                "The user greets me. No tool is needed.")
    if r < 0.35:
        a, b = rng.randint(1, 60), rng.randint(1, 60)
        op = rng.choice(["+", "*", "-"])
        val = a + b if op == "+" else a * b if op == "*" else a - b
        return (f"What is {a} {op} {b}?", f"{a} {op} {b} = {val}.", "Simple arithmetic, no tool needed.")
    if r < 0.5:
        w = marker(rng)
        return (f"Reply with exactly: {w}", w, "The user wants an exact reply.")
    if r < 0.75:
        fn, body, desc = rng.choice([
            ("reverse_string", "def reverse_string(s):\n    return s[::-1]", "reverses a string"),
            ("square", "def square(x):\n    return x * x", "returns the square of a number"),
            ("is_even", "def is_even(n):\n    return n % 2 == 0", "checks whether a number is even"),
            ("add", "def add(a, b):\n    return a + b", "adds two numbers"),
            ("count_words", "def count_words(text):\n    return len(text.split())", "counts the words in a string"),
            ("max_of", "def max_of(items):\n    return max(items)", "returns the largest item of a list"),
            ("read_lines", "def read_lines(path):\n    with open(path) as f:\n        return f.read().splitlines()",
             "reads the lines of a file"),
        ])
        return (f"Write a Python function that {desc}.", f"```python\n{body}\n```",
                "A short coding question; I can answer directly.")
    q, a = rng.choice([
        ("What does len() do in Python?", "It returns the number of items in a container, such as the length of a string or a list."),
        ("How do I list files in a directory with Python?", "Use `os.listdir(path)`, or `pathlib.Path(path).iterdir()`."),
        ("What is a Python list comprehension?", "A compact way to build a list: `[x * 2 for x in items]`."),
        ("How do I check the Python version?", "Run `python3 --version`."),
        ("What is the difference between a list and a tuple?", "A list is mutable; a tuple is immutable."),
        ("Which command shows the current directory?", "`pwd`"),
    ])
    return q, a, "A short question; no tool is needed."


class Spec:
    """Knobs for one conversation."""
    def __init__(self, system_chars=2000, p_exact=0.45, p_plain=0.15, p_multi=0.25, style=None, max_tools=20):
        self.system_chars, self.p_exact, self.p_plain, self.p_multi, self.style, self.max_tools = (
            system_chars, p_exact, p_plain, p_multi, style, max_tools)


def tool_exchange(rng, bank, tools_present, style, p_exact):
    """Messages for one request that runs a tool: [user, assistant(call), tool, assistant(answer)]."""
    shellish = [t for t in tools_present if t in SHELL_TOOLS]
    r = rng.random()
    if r < 0.72 or not shellish:
        # An explicit request naming the tool and its arguments.
        tool = rng.choice(shellish) if shellish and rng.random() < 0.7 else rng.choice(tools_present)
        if tool in SHELL_TOOLS:
            cmd, out = shell_command(rng, bank)
            args = shell_args(rng, tool, cmd)
        else:
            args = generic_args(rng, tool, bank)
            out = generic_output(rng, tool, args, bank)
        phr = EXACT if rng.random() < p_exact else rng.choice(PHRASINGS)
        ask = phr.format(tool=tool, args=args_text(args))
    elif r < 0.88:
        tool = rng.choice(shellish)
        cmd, out = shell_command(rng, bank)
        args = shell_args(rng, tool, cmd)
        ask = rng.choice(SHELL_ASKS).format(cmd=cmd)
    else:
        readers = [t for t in tools_present if t in READ_TOOLS]
        if not readers:
            tool = rng.choice(shellish)
            path = rand_path(rng)
            args = shell_args(rng, tool, f"cat {path}")
        else:
            tool = rng.choice(readers)
            path = rand_path(rng)
            args = {READ_TOOLS[tool]: path}
        out = code_snippet(rng, bank)
        ask = rng.choice(READ_ASKS).format(path=path)
    content = wrap_tool_output(rng, tool, args, out)
    if "\n" in content:
        answer = rng.choice(ANSWERS_FILE if tool in READ_TOOLS else ANSWERS_BLOCK).format(out=content)
    else:
        answer = rng.choice(ANSWERS_LINE).format(out=content)
    call_id = f"call_{rng.getrandbits(40):010x}"
    arguments = args_text(args) if rng.random() < 0.7 else args  # OpenAI sends a JSON string
    call = {"id": call_id, "type": "function", "function": {"name": tool, "arguments": arguments}}
    return [{"role": "user", "content": ask},
            {"role": "assistant", "content": "", "tool_calls": [call],
             "reasoning_content": rng.choice(THINK_CALL).format(tool=tool)},
            {"role": "tool", "tool_call_id": call_id, "content": content},
            {"role": "assistant", "content": answer, "reasoning_content": rng.choice(THINK_ANSWER)}]


def conversation(rng, bank, spec):
    """A conversation: {"messages", "tools", "enable_thinking", "target"}; target indexes the
    assistant message to learn (the ones before it are history)."""
    style = spec.style or rng.choice(["claude", "qwen", "codex", "generic"])
    plain = rng.random() < spec.p_plain
    with_tools = not plain or rng.random() < 0.8
    tools = pick_tools(rng, style, max_tools=spec.max_tools) if with_tools else []
    msgs = [{"role": "system", "content": system_prompt(rng, bank, spec.system_chars)}] if (
        spec.system_chars > 0 and (rng.random() < 0.95 or not tools)) else []
    msgs += context_messages(rng, bank, style)
    exchanges = 1 + (rng.random() < spec.p_multi) + (rng.random() < spec.p_multi / 3)
    for e in range(exchanges):
        if (plain and e == exchanges - 1) or not tools or (e < exchanges - 1 and rng.random() < 0.3):
            q, a, think = plain_exchange(rng)
            ex = [{"role": "user", "content": q}, {"role": "assistant", "content": a, "reasoning_content": think}]
        else:
            ex = tool_exchange(rng, bank, tools, style, spec.p_exact)
        if rng.random() < 0.6:
            noise = noise_blocks(rng, bank, style)
            if noise:
                if rng.random() < 0.5:
                    ex[0]["content"] = "\n\n".join(noise + [ex[0]["content"]])
                else:  # content parts, as Claude Code sends them
                    ex[0]["content"] = [{"type": "text", "text": b} for b in noise] + [
                        {"type": "text", "text": ex[0]["content"]}]
        msgs += ex
    # History: clients often drop the reasoning of earlier turns (and with thinking off there is none).
    think = rng.random() < 0.5
    for m in msgs:
        if m["role"] == "assistant" and "reasoning_content" in m and (not think or rng.random() < 0.5):
            del m["reasoning_content"]
    assistants = [i for i, m in enumerate(msgs) if m["role"] == "assistant" and i > 0 and
                  msgs[i - 1]["role"] in ("user", "tool")]
    # Learn a turn of the last exchange (the call or the answer).
    last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    candidates = [i for i in assistants if i > last_user] or assistants
    target = rng.choice(candidates)
    return {"messages": msgs, "tools": [tool_definition(t, rng) for t in tools],
            "enable_thinking": think, "target": target}


def training_pair(conv, rng=None):
    """(prompt, completion): the prompt exactly as flashserve renders the request that leads to the
    target turn, and the completion the model must write (ending with <|im_end|>)."""
    msgs = conv["messages"][: conv["target"]]
    target = dict(conv["messages"][conv["target"]])
    think = conv["enable_thinking"]
    if not think:
        target["reasoning_content"] = ""
    elif target.get("reasoning_content") is None:
        target["reasoning_content"] = "The user asked; I will answer."
    prompt = render_qwen3(msgs, conv["tools"], add_generation_prompt=True, enable_thinking=think)
    full = render_qwen3(msgs + [target], conv["tools"])
    assert full.startswith(prompt) and full.endswith("<|im_end|>\n"), "render mismatch"
    return prompt, full[len(prompt):-1]


# ---------------------------------------------------------------------------------------------
# The check against flashserve's renderer.

def check(binary, model, samples, seed):
    rng = random.Random(seed)
    bank = TextBank.from_interpreter(held_out=False, max_code_files=40)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(samples):
            spec = Spec(system_chars=rng.choice([0, 200, 1500, 6000]), p_multi=0.6)
            conv = conversation(rng, bank, spec)
            variants = [(conv["messages"], True, conv["enable_thinking"]),
                        (conv["messages"][: conv["target"] + 1], False, None)]
            for msgs, gen, think in variants:
                path = os.path.join(tmp, f"req{n}.json")
                with open(path, "w", encoding="utf-8") as f:
                    json.dump({"messages": msgs, "tools": conv["tools"]}, f, ensure_ascii=False)
                cmd = [binary, "render", "--tokenizer", model, "--family", "qwen", "--messages", path]
                if gen:
                    cmd.append("--add-generation-prompt")
                if think is not None:
                    cmd += ["--enable-thinking", "true" if think else "false"]
                got = subprocess.run(cmd, capture_output=True, check=True).stdout.decode("utf-8")
                want = render_qwen3(msgs, conv["tools"], add_generation_prompt=gen, enable_thinking=think)
                if got != want:
                    at = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]),
                              min(len(got), len(want)))
                    print(f"sample {n}: differs at byte {at}:\n  flashserve: {got[at - 40:at + 40]!r}\n"
                          f"  port:       {want[at - 40:at + 40]!r}", file=sys.stderr)
                    failures += 1
            training_pair(conv)
    if failures:
        print(f"{failures} renders differ", file=sys.stderr)
        return 1
    print(f"{samples * 2} renders identical to flashserve render")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--binary", default="build/src/flashserve")
    ap.add_argument("--model", default="models/qwen4-tiny-code")
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--show", type=int, default=0)
    ap.add_argument("--template", action="store_true", help="print the chat template")
    args = ap.parse_args()
    if args.template:
        print(CHAT_TEMPLATE)
        return 0
    if args.check:
        return check(args.binary, args.model, args.samples, args.seed)
    rng = random.Random(args.seed)
    bank = TextBank.from_interpreter()
    for _ in range(args.show):
        p, c = training_pair(conversation(rng, bank, Spec(system_chars=300)))
        print("=" * 80 + "\n" + p + "\033[1m" + c + "\033[0m")
    return 0


if __name__ == "__main__":
    sys.exit(main())
