#!/usr/bin/env python3
"""Compiles one program (syntax only) and checks the outcome.

    compile_check.py EXPECTED SOURCE COMPILER [ARGS...]

EXPECTED '-': the program must compile. Anything else: the program must not
compile, and the compiler's diagnostics must contain EXPECTED, the rule the
program breaks, so that it fails for that reason and for no other.
"""
import subprocess
import sys


def main() -> int:
    expected, source, *compiler = sys.argv[1:]
    run = subprocess.run(compiler + ["-fsyntax-only", source], capture_output=True, text=True)
    diagnostics = run.stdout + run.stderr
    if expected == "-":
        if run.returncode == 0:
            return 0
        print(f"{source} should compile, and does not:\n{diagnostics}")
        return 1
    if run.returncode == 0:
        print(f"{source} compiled; it should fail with '{expected}'")
        return 1
    if expected not in diagnostics:
        print(f"{source} failed without naming '{expected}':\n{diagnostics}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
