"""`python ARGS...` through the tests' fork server (tests/support/pyserver.py), for scripts
that take a Python program (gpu/validate.sh and gpu/lent.sh's `--python`): tests/common/py.rs
writes a wrapper that runs

  python -S -E pyclient.py SOCKET PYTHON ARGS...

which hands ARGS, its working directory, its environment and its own stdin, stdout and stderr
to the server, whose child runs them as `PYTHON ARGS...` would (a script, `-c CODE`, `-m
MODULE` or `-` for a program on stdin), and exits with the child's exit code. Where no server
answers, it becomes `PYTHON ARGS...` itself. Only the standard library: it starts in
milliseconds.
"""
import json
import os
import socket
import sys


def main():
    path, python, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        os.execv(python, [python] + argv)
    request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "fds": True}
    socket.send_fds(sock, [(json.dumps(request) + "\n").encode()], [0, 1, 2])
    reply = b""
    while True:
        chunk = sock.recv(64)
        if not chunk:
            break
        reply += chunk
    try:
        code = int(reply.decode().strip())
    except ValueError:
        print("pyclient: the command died without an exit code (killed by a signal)", file=sys.stderr)
        code = 134
    sys.exit(code)


if __name__ == "__main__":
    main()
