"""Runs the named examples of fresh_examples.py, each in a process forked from one that has imported
thunder_subclass (and thunder) and compiled nothing: ``python _fresh_runner.py name...`` prints one JSON line of
{name: null or the error's traceback}."""

import json
import os
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fresh_examples  # noqa: E402  (imports thunder_subclass, and so thunder)


def run(name: str) -> str | None:
    with tempfile.TemporaryFile("w+") as report:
        pid = os.fork()
        if pid == 0:  # the child: a process in which nothing was compiled yet
            status = 0
            try:
                getattr(fresh_examples, name)()
            except BaseException:
                report.write(traceback.format_exc())
                report.flush()
                status = 1
            os._exit(status)
        _, status = os.waitpid(pid, 0)
        report.seek(0)
        text = report.read()
    if status == 0:
        return None
    return text or f"the process exited with status {status}"


if __name__ == "__main__":
    print(json.dumps({name: run(name) for name in sys.argv[1:]}))
