"""``python -m docgen [export|check]``: write or check ``docs/reference/``."""

from __future__ import annotations

import sys

from docgen.pages import check_docs, export_docs


def main(argv: list[str]) -> int:
    action = argv[0] if argv else "export"
    if action == "export":
        for path in export_docs():
            print(path)
        return 0
    if action == "check":
        drift = check_docs()
        for line in drift:
            print(line, file=sys.stderr)
        return 1 if drift else 0
    print("usage: python -m docgen [export|check]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
