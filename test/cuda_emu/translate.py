"""
cuda_emu's source changes: copies the project's sources into an output folder, with every
kernel launch `kernel<<<grid, block[, shared, stream]>>>(args)` rewritten into C++ that g++ accepts:
`cuda_emu::launch("kernel", cuda_emu::Config(grid, block), kernel)(args)`, and after every
one-line `__shared__` declaration a call that poisons each declared array (or scalar) once per block
(`cuda_emu::shared_poison(&name, sizeof(name));`, on the same line), and each one-line
`extern __shared__ T name[];` (the launch's dynamic shared memory) into a pointer to the
emulator's, which it poisons for each block. Everything else is copied as
it is, so line numbers in compiler errors still match the originals.

    python3 test/cuda_emu/translate.py OUT_DIR FILE...
"""
import os
import re
import sys

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_:]*$")


def kernel_start(src, end):
    """index where the kernel expression that ends at src[end] begins (name, maybe <template args>)"""
    i = end
    while i > 0 and src[i - 1].isspace():
        i -= 1
    if src[i - 1] == ">":  # template arguments: match back to their '<'
        depth = 0
        while i > 0:
            i -= 1
            depth += {">": 1, "<": -1}.get(src[i], 0)
            if depth == 0:
                break
    m = IDENT.search(src[:i])
    if m is None:
        raise SystemExit("translate.py: no kernel name before '<<<' near: %r" % src[max(0, end - 60):end + 20])
    return m.start()


def translate(src):
    out, pos = [], 0
    while True:
        open_ = src.find("<<<", pos)
        if open_ < 0:
            break
        close = src.find(">>>", open_)
        if close < 0:
            raise SystemExit("translate.py: '<<<' without '>>>' near: %r" % src[open_:open_ + 60])
        start = kernel_start(src, open_)
        kernel = src[start:open_].strip()
        config = src[open_ + 3:close]
        out.append(src[pos:start])
        out.append('cuda_emu::launch("%s", cuda_emu::Config(%s), %s)' % (kernel, config, kernel))
        pos = close + 3
    out.append(src[pos:])
    return "".join(out)


SHARED = re.compile(r"^(\s*)__shared__\s(.*?);(.*)$")
DYNAMIC = re.compile(r"^(\s*)extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?(\w[\w\s]*?)\s+(\w+)\[\];(.*)$")


def declared_names(declaration):
    """the names in `T a[N][M], b[K]` (attributes such as __align__(16) may precede T)"""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(declaration):
        depth += {"[": 1, "(": 1, "]": -1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(declaration[start:i])
            start = i + 1
    parts.append(declaration[start:])
    names = []
    for part in parts:
        head = part.split("[", 1)[0]  # the declarator's name ends where its first bound starts
        m = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*$", head)
        if m is None:
            raise SystemExit("translate.py: cannot find the name in __shared__ %r" % declaration)
        names.append(m.group(1))
    return names


def poison_shared(src):
    lines = src.split("\n")
    for k, line in enumerate(lines):
        code = line.split("//", 1)[0]
        if "__shared__" not in code or code.lstrip().startswith(("#", "*", "/*")):
            continue
        if "extern" in code:  # the launch's dynamic shared memory: a pointer to the emulator's
            m = DYNAMIC.match(line)
            if m is None:
                raise SystemExit("translate.py: write dynamic shared memory as one line "
                                 "`extern __shared__ [__align__(N)] T name[];`: %r" % line)
            lines[k] = "%s%s* %s = (%s*)cuda_emu::dynamic_shared();%s" % (m.group(1), m.group(2), m.group(3), m.group(2),
                                                                           m.group(4))
            continue
        m = SHARED.match(line)
        if m is None:  # a declaration over several lines would go unpoisoned: refuse it
            raise SystemExit("translate.py: write each __shared__ declaration on one line, "
                             "starting with __shared__: %r" % line)
        # (&name: an array's address, or a scalar's, such as an mbarrier's uint64_t)
        calls = "".join(" cuda_emu::shared_poison(&%s, sizeof(%s));" % (n, n) for n in declared_names(m.group(2)))
        lines[k] = "%s__shared__ %s;%s%s" % (m.group(1), m.group(2), calls, m.group(3))
    return "\n".join(lines)


def main():
    out_dir, files = sys.argv[1], sys.argv[2:]
    for path in files:
        with open(path) as f:
            text = poison_shared(translate(f.read()))
        dest = os.path.join(out_dir, path)
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        old = None
        if os.path.exists(dest):
            with open(dest) as f:
                old = f.read()
        if old != text:  # unchanged files keep their time stamps, so make rebuilds only what changed
            with open(dest, "w") as f:
                f.write(text)


if __name__ == "__main__":
    main()
