"""``python -m fusionlab COMMAND ...``: the course's command line.

Each command is a module with ``add_arguments(parser)`` and ``main(args) -> exit status``; adding one
is one line in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: command -> (module, one line of help)
COMMANDS = {
    "grade": ("fusionlab.grade", "grade learners' notebooks, each answer in a process of its own"),
    "bench": ("fusionlab.benchcli", "every kernel against its peers on this GPU (the recorded results on a CPU)"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fusionlab")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=importlib.import_module(module).__doc__.split("\n")[0])
        importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)
    return importlib.import_module(COMMANDS[args.command][0]).main(args)


if __name__ == "__main__":
    sys.exit(main())
