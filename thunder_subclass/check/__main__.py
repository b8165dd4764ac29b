"""``python -m thunder_subclass.check module:factory [--fn module:function] [--no-grads] [--no-dynamic]``: run
:func:`thunder_subclass.check_subclass` on ``factory`` (a ``make_sample(seed)``), print the report, exit 1 on
findings."""

from __future__ import annotations

import argparse
import importlib
import sys


def _resolve(spec: str):
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise SystemExit(f"expected module:function, got {spec!r}")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def main(argv: list[str] | None = None) -> int:
    import thunder_subclass

    parser = argparse.ArgumentParser(prog="python -m thunder_subclass.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("factory", help="module:function, make_sample(seed) returning one instance")
    parser.add_argument("--fn", help="module:function of one instance to check beyond the default programs")
    parser.add_argument("--no-grads", action="store_true", help="do not compare gradients")
    parser.add_argument("--no-dynamic", action="store_true", help="do not check that another size reuses the trace")
    args = parser.parse_args(argv)
    sys.path.insert(0, "")
    report = thunder_subclass.check_subclass(
        _resolve(args.factory), _resolve(args.fn) if args.fn else None,
        grads=False if args.no_grads else None, dynamic=not args.no_dynamic,
    )
    print(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
