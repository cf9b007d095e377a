"""A fork server for the tests' Python helpers (tests/common/py.rs starts and uses it).

Importing torch, transformers and TRL (or MLflow's client) costs 1.5 to 5 s of CPU per process, and the suite
runs a few hundred helper commands: this process imports them once, then forks a child
per request that runs the helper as `python SCRIPT ARGS...` (or `python -c CODE ARGS...`)
would, in the caller's working directory and environment, with stdout and stderr written
to the files the caller names. The helpers and the packages are the real ones: only the
import is shared. Nothing has run in this process before a fork (no torch operation, no
thread pool started), so each child starts as a fresh interpreter that imported them.

  pyserver.py SOCKET IDLE_S

Listens on the Unix socket SOCKET (bound under a temporary name, renamed into place once
the imports are done: a client that can connect is served at once). A request is one JSON
line {"argv": [...], "cwd": ..., "env": {...}, "stdout": FILE, "stderr": FILE}, or with
"fds": true and the client's stdin, stdout and stderr passed along (SCM_RIGHTS) instead of
the files (tests/support/pyclient.py); ARGV is what follows `python`: a script and its
arguments, `-c CODE ...`, `-m MODULE ...` or `- ...`. The reply is the child's exit code as
one line, sent when it ends (no line if it died of a signal).
After IDLE_S seconds without a request and with no child running, it removes SOCKET, serves
what is already queued, and exits.
"""
import json
import os
import runpy
import select
import socket
import sys
import time
import traceback

PRELOAD = ["numpy", "torch", "safetensors.torch", "tokenizers", "transformers", "datasets", "peft", "trl", "mlflow.tracking"]


def preload():
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # a helper that needs it will report the error itself
            pass
    try:  # transformers and TRL import their model and trainer classes lazily
        from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments  # noqa: F401
        from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer  # noqa: F401
    except Exception:
        pass


def child(conn, request, fds):
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if fds:
            # The client's own stdin, stdout and stderr.
            for fd, theirs in enumerate(fds):
                os.dup2(theirs, fd)
                os.close(theirs)
        else:
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            for fd, key in [(1, "stdout"), (2, "stderr")]:
                out = os.open(request[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(out, fd)
                os.close(out)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False, encoding="utf-8")
        sys.stderr = open(2, "w", buffering=1, closefd=False, encoding="utf-8")
        argv = request["argv"]
        try:
            if argv[0] in ("-c", "-"):
                # `-c CODE ARGS` or `- ARGS` (the program on stdin).
                code_text, rest = (argv[1], argv[2:]) if argv[0] == "-c" else (sys.stdin.read(), argv[1:])
                sys.argv = [argv[0]] + rest
                sys.path[0] = ""
                exec(compile(code_text, "<string>" if argv[0] == "-c" else "<stdin>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
            elif argv[0] == "-m":
                sys.argv = [argv[1]] + argv[2:]
                sys.path[0] = os.getcwd()
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = argv
                sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
                runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
    except BaseException:
        traceback.print_exc()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    try:
        conn.sendall(f"{code}\n".encode())
    except OSError:
        pass
    os._exit(code & 0xFF)


def serve(listener, conn):
    """Forks a child for the request on `conn`; whether it did."""
    data, fds, forked = b"", [], False
    try:
        while not data.endswith(b"\n"):
            chunk, more, _, _ = socket.recv_fds(conn, 1 << 16, 3)
            fds += more
            if not chunk:
                return False  # a client that only checked the server is up
            data += chunk
        request = json.loads(data)
        if os.fork() == 0:
            listener.close()
            child(conn, request, fds)
        forked = True
    except Exception:  # a bad request costs its client the reply, never the server
        traceback.print_exc()
    finally:
        for fd in fds:
            os.close(fd)
        conn.close()
    return forked


def main(path, idle):
    # Descriptors the starting test left open without close-on-exec (a jobserver's pipe):
    # the server outlives that test and must not keep them open.
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    preload()
    tmp = f"{path}.{os.getpid()}.tmp"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(tmp)
    listener.listen(64)
    os.rename(tmp, path)
    children = 0
    last = time.monotonic()
    while True:
        ready, _, _ = select.select([listener], [], [], 1.0)
        if ready:
            conn, _ = listener.accept()
            children += serve(listener, conn)
            last = time.monotonic()
        while children:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children = 0
                break
            if pid == 0:
                break
            children -= 1
            last = time.monotonic()
        if not children and time.monotonic() - last > idle:
            break
    # New clients find no socket (and start another server); those already queued are served.
    try:
        os.unlink(path)
    except OSError:
        pass
    listener.setblocking(False)
    while True:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, OSError):
            break
        conn.setblocking(True)
        serve(listener, conn)
    listener.close()
    while True:
        try:
            os.wait()
        except ChildProcessError:
            break


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
