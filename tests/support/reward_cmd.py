"""A `kind = "command"` reward for tests/grpo_rewards.rs, and the protocol's example
(docs/rl.md): one JSON request a line on stdin, one JSON list of scores a line on stdout.

    reward_cmd.py length TARGET    -abs(TARGET - characters), the built-in `length`
    reward_cmd.py regex PATTERN    1.0 when PATTERN matches (re.search), the built-in `regex`
    reward_cmd.py column NAME      1.0 when the completion, trimmed, equals the row's NAME
                                   column (None where the row has none), as `exact` without
                                   a pattern

Misbehaving on purpose, after answering the first request correctly with `length 5`:
    die (exit 3), hang (never answers), count (one score too many), word (a string)
Every request is appended to $REWARD_LOG when it is set, for the test to read.
"""

import json
import os
import re
import sys
import time


def text(completion):
    """A completion's text: TRL's conversational form is one assistant message."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


def scores(mode, arg, request):
    completions = [text(c) for c in request["completions"]]
    if mode == "length":
        return [-abs(int(arg) - len(c)) for c in completions]
    if mode == "regex":
        return [1.0 if re.search(arg, c) else 0.0 for c in completions]
    if mode == "column":
        expected = request["columns"].get(arg, [None] * len(completions))
        return [None if e is None else float(c.strip() == str(e).strip()) for c, e in zip(completions, expected)]
    raise SystemExit(f"unknown mode {mode}")


def main():
    mode, arg = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "5"
    print(f"reward_cmd.py {mode} started", file=sys.stderr, flush=True)
    for n, line in enumerate(sys.stdin):
        request = json.loads(line)
        if os.environ.get("REWARD_LOG"):
            with open(os.environ["REWARD_LOG"], "a") as log:
                log.write(line)
        if n == 0 or mode in ("length", "regex", "column"):
            answer = scores(mode if mode in ("regex", "column") else "length", arg, request)
        elif mode == "die":
            print("reward_cmd.py: dying on purpose", file=sys.stderr, flush=True)
            sys.exit(3)
        elif mode == "hang":
            time.sleep(3600)
        elif mode == "count":
            answer = scores("length", arg, request) + [0.0]
        elif mode == "word":
            answer = ["good"] * len(request["completions"])
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
