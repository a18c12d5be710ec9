"""
Shared-memory bank conflicts of the flash attention kernels, counted from their source.

    /usr/bin/python3 dev/cuda/bank_conflicts.py            # the kernels as written: exit 1 on any conflict
    /usr/bin/python3 dev/cuda/bank_conflicts.py --pad 0    # rows of HS elements, unpadded: what padding saves
    /usr/bin/python3 dev/cuda/bank_conflicts.py --cuh FILE # another version of flash_attention.cuh

1. Banks. Shared memory is 32 banks, each 4 bytes wide: the 4-byte word at byte address a lives in
bank (a / 4) % 32, so a row of 128 bytes covers every bank once. Each bank delivers one word per
cycle. When the lanes of a warp ask for words that sit in different banks, one pass (a
"wavefront") serves them all; lanes that ask for the same word share it (a broadcast); lanes
that ask for different words in the same bank are served one word per wavefront. So a request
takes, per group of lanes served together, max over the banks of the number of distinct words
asked for in that bank, wavefronts: the "n-way bank conflict" of the textbooks is that maximum.

2. Wide accesses and phases. A wavefront carries at most 32 x 4 = 128 bytes. A warp that moves 16
bytes per lane (a 128-bit ld.shared/st.shared, a 16-byte cp.async landing in shared memory) asks
for 512 bytes, so the hardware serves it in 4 phases of 8 lanes (lanes 0-7, 8-15, ...), each of
which can be one wavefront; 8-byte accesses go in 2 phases of 16 lanes. Conflicts only count
within a phase. The ideal is therefore one wavefront per phase: 1 for a 4-byte request, 4 for a
16-byte one. ldmatrix.x4 loads four 8 x 8 matrices of 16-bit elements; each matrix is 8 rows of
16 bytes, whose addresses lanes 8i..8i+7 supply for matrix i (PTX ISA), and each matrix is one
phase: its 8 rows must lie in 8 different groups of 4 banks.

3. Why rows of HS + 8 elements. Count in 16-byte units: a unit is a group of 4 banks, and 8 units
cover the 32 banks, so unit u is in bank group u % 8. A (64, HS) bf16 tile stored with a row
stride of HS elements has HS / 8 units per row: row r starts in group (r HS / 8) % 8. For HS = 64
that is group 0 for every row, so the 8 rows an ldmatrix phase reads (same column, rows r..r+7)
all want the same 4 banks: 8 wavefronts instead of 1 (4-way at HS = 32, 2-way at HS = 16).
With a stride of HS + 8 elements a row is HS / 8 + 1 units long: 3, 5 or 9, always odd, and an
odd number times r = 0..7 leaves 8 different remainders mod 8, so the 8 rows fall in 8 different
groups of 4 banks. The cost: 16 bytes per row of shared memory (12.5% at HS = 64).
Padding fixes the reads; the stores that fill the tile have phases too. 8 lanes storing 16 bytes
each along a row fill one row of HS = 64 (8 groups, no conflict) but two rows of HS = 32: groups
5r + {0, 1, 2, 3} and 5r + {5, 6, 7, 8}, and 8 is 0 again: 2-way. A phase that stores down a
column (8 rows, one unit each, the way an ldmatrix phase reads) is conflict-free for any HS.
--pad 0 shows what the padding saves; the default shows the code as it is.

4. What is modelled, and how it follows the code. Nothing about the kernels is typed in here. The
script reads llmc/cuda/flash_attention.cuh and llmc/cuda/mma.cuh: the macros (FLASH_LD, FLASH_TILE,
FLASH_WARPS, ...), the template arguments the launchers instantiate (head size, and the forward's
row tiles per warp), the shared arrays of each kernel, the
calls of the helpers, their loops and int declarations, and the address expression of every
shared-memory access: each ldmatrix_x4 / ldmatrix_x4_trans / cp_async16 (16-byte rows, from
mma.cuh's PTX) and each element access of a shared array or of a helper's pointer to one (a
helper that hands the pointer on to another is followed into it, at any depth). It
evaluates those C expressions for the 128 threads of a block, loop iteration by loop iteration,
groups the lanes of each warp into requests and counts wavefronts. A loop whose bound is not a
compile-time value (the kernels' loop over tiles) is taken at its first iteration: a shift that
is the same for every lane of a request changes no count. Every use of a shared array that is
neither an access nor a pointer handed to a helper stops the script: it must follow the code
or say that it cannot. Integer division is Python's // (the expressions involved are >= 0).

Not modelled: dev/cuda/flash_wmma.cuh (its unpadded WMMA tiles): wmma::load_matrix_sync does
not document which lane reads which address, so there is nothing to evaluate.
"""
import argparse
import itertools
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ---------------------------------------------------------------------------------------------
# 1. The bank model
# ---------------------------------------------------------------------------------------------
BANKS = 32        # "Shared memory has 32 banks" (CUDA C++ Programming Guide, Compute Capabilities, Shared Memory)
BANK_BYTES = 4    # "successive 32-bit words map to successive banks" (same section)
WAVEFRONT_BYTES = BANKS * BANK_BYTES  # one word per bank per wavefront: 128 bytes at most


def wavefronts(lanes, width, phase_lanes):
    """(wavefronts, ideal, worst phase) of one warp request: lanes = {lane: byte address} of the
    active lanes, each touching width bytes; phases of phase_lanes lanes are served separately.
    The worst phase's count is the "n-way" conflict: 1 when the phase is conflict-free."""
    total = ideal = worst = 0
    for phase in range(32 // phase_lanes):
        words = {}  # bank -> distinct words of this phase in that bank
        for lane, addr in lanes.items():
            if lane // phase_lanes != phase:
                continue
            for word in range(addr // BANK_BYTES, (addr + width - 1) // BANK_BYTES + 1):
                # the same word twice is one read, broadcast (Programming Guide, Shared Memory)
                words.setdefault(word % BANKS, set()).add(word)
        if words:
            # one wavefront serves one word of each bank: the busiest bank sets the count
            n = max(len(w) for w in words.values())
            total, ideal, worst = total + n, ideal + 1, max(worst, n)
    return total, ideal, worst


def phase_lanes_for(width):
    """16-byte accesses in quarter-warp phases, 8-byte in half-warps, 4 bytes and less in one:
    a phase moves at most one wavefront's 128 bytes (Programming Guide, Shared Memory, and
    NVIDIA's Nsight Compute 'shared wavefronts' for 64/128-bit accesses)"""
    return 32 // max(1, width * 32 // WAVEFRONT_BYTES)


# ---------------------------------------------------------------------------------------------
# 2. Reading the C: comments, macros, functions, loops, declarations, expressions
# ---------------------------------------------------------------------------------------------
def strip_comments(text):
    """comments become spaces, so positions and line numbers stay those of the file"""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r"//[^\n]*|/\*.*?\*/", blank, text, flags=re.S)


def matching(text, i):
    """index just past the bracket that closes the one at text[i]"""
    pairs = {"(": ")", "[": "]", "{": "}"}
    depth, open_, close = 0, text[i], pairs[text[i]]
    for j in range(i, len(text)):
        depth += (text[j] == open_) - (text[j] == close)
        if depth == 0:
            return j + 1
    raise SyntaxError("unbalanced %s at %d" % (open_, i))


def split_top(text, sep=","):
    """split at separators outside brackets"""
    parts, depth, start = [], 0, 0
    for j, ch in enumerate(text):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == sep and depth == 0:
            parts.append(text[start:j])
            start = j + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


class Macros:
    """#define NAME BODY and #define NAME(ARG) BODY, expanded token by token"""

    def __init__(self, text):
        self.objects, self.functions = {}, {}
        for m in re.finditer(r"^#define\s+(\w+)(\((\w+)\))?[ \t]+(.+)$", text, re.M):
            if m.group(2):
                self.functions[m.group(1)] = (m.group(3), m.group(4).strip())
            else:
                self.objects[m.group(1)] = m.group(4).strip()

    def expand(self, expr):
        for _ in range(20):
            new = re.sub(r"\b(\w+)\b", lambda m: "(%s)" % self.objects[m.group(1)]
                         if m.group(1) in self.objects else m.group(1), expr)
            for name, (arg, body) in self.functions.items():
                while True:
                    m = re.search(r"\b%s\s*\(" % name, new)
                    if not m:
                        break
                    end = matching(new, m.end() - 1)
                    value = new[m.end():end - 1]
                    new = new[:m.start()] + "(%s)" % re.sub(r"\b%s\b" % arg, "(%s)" % value, body) + new[end:]
            if new == expr:
                return expr
            expr = new
        raise SyntaxError("macro expansion does not end: " + expr)


def to_python(expr, macros):
    """a C integer expression as Python (threadIdx.x -> threadIdx_x, / -> //, && -> and)"""
    e = macros.expand(expr)
    e = re.sub(r"\b(threadIdx|blockDim|blockIdx)\.([xyz])\b", r"\1_\2", e)
    e = re.sub(r"\(\s*(?:size_t|int|unsigned)\s*\)", "", e)  # integer casts
    e = e.replace("&&", " and ").replace("||", " or ")
    e = re.sub(r"!(?!=)", " not ", e)
    e = re.sub(r"(?<![/])/(?![/])", "//", e)
    return e


_compiled = {}


def evaluate(expr, env, macros):
    """value of a C expression for one thread; NameError when it needs a runtime value"""
    key = (expr, id(macros), macros.functions.get("FLASH_LD"))
    if key not in _compiled:
        _compiled[key] = compile(to_python(expr, macros).strip(), expr, "eval")
    return eval(_compiled[key], {"__builtins__": {}, "min": min, "max": max}, env)


IDENT = r"(?<![.\w])%s\b"  # an identifier, not a member (threadIdx.x is not x)
CALL = r"\b(\w+)(?:<[\w\s,*+/]+>)?\s*\("  # a call: its name, template arguments, open parenthesis


def pointer_offset(arg, pname):
    """the offset expression of an argument that is the pointer pname or pname + offset ("0" for
    pname alone), None for any other argument"""
    m = re.match(r"\s*%s\b\s*(?:\+(.*))?$" % pname, arg, re.S)
    return None if not m else m.group(1) or "0"


def refuse_address_of(text, pos, name, instead):
    """stop at &name[..] (a pointer to an element): the model follows whole pointers only"""
    if re.search(r"&\s*$", text[:pos]):
        raise SyntaxError("line %d: &%s[..]: a pointer to an element, which this model does not read (pass %s)"
                          % (line_of(text, pos), name, instead))


def template_params(text, fn):
    """[(name, default expression or None)] of the 'template <int A, int B = X>' before fn"""
    m = re.search(r"template\s*<([^<>]*)>\s*$", text[:fn.decl_start])
    if not m:
        return []
    out = []
    for part in split_top(m.group(1)):
        p = re.fullmatch(r"int\s+(\w+)(?:\s*=\s*(.+))?", part.strip())
        if not p:
            raise SyntaxError("%s: a template parameter this model cannot read: %s" % (fn.name, part))
        out.append((p.group(1), p.group(2)))
    return out


def template_args(text, pos):
    """the expressions of the <...> that starts at text[pos] (after a function's name): (args, end)"""
    if text[pos] != "<":
        return [], pos
    end = text.index(">", pos)
    return split_top(text[pos + 1:end]), end + 1


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


ELEMENT_BYTES = {"floatX": 2, "float": 4, "uint32_t": 4, "int": 4}  # floatX: bf16 in the flash builds


class Function:
    """a __device__ or __global__ function: name, params [(type, name, is_pointer)], body span"""

    def __init__(self, text, name, params, body_start, body_end, is_kernel, header, decl_start):
        self.text, self.name, self.params, self.decl_start = text, name, params, decl_start
        self.start, self.end, self.is_kernel, self.header = body_start, body_end, is_kernel, header

    @property
    def body(self):
        return self.text[self.start:self.end]


def parse_params(plist):
    params = []
    for p in split_top(plist):
        if p == "void":
            continue
        p = p.partition("=")[0].strip()  # a default argument's value is not the name
        m = re.search(r"(\w+)\s*\)?\s*(\[[^\]]*\])*$", p)  # the name: last identifier ((*a)[4] too)
        base = re.sub(r"\bconst\b", "", p).split()[0].rstrip("*")
        params.append((base, m.group(1), "*" in p))
    return params


def functions(text):
    found = {}
    for m in re.finditer(r"(__global__|__device__)\b", text):
        # the function's name is the last identifier before a '(' whose ')' is followed by '{'
        i = m.end()
        while True:
            n = re.compile(r"\b(\w+)\s*\(").search(text, i)
            if not n:
                break
            close = matching(text, n.end() - 1)
            after = text[close:].lstrip()
            if after.startswith("{"):
                body = close + text[close:].index("{")
                found[n.group(1)] = Function(text, n.group(1), parse_params(text[n.end():close - 1]),
                                             body + 1, matching(text, body) - 1, m.group(1) == "__global__",
                                             text[m.start():close], m.start())
                break
            if after.startswith(";"):
                break  # a declaration, no body
            i = close
    return found


def statement_extent(text, pos):
    """span of the statement starting at pos (a block, a for, or up to ';')"""
    while text[pos].isspace():
        pos += 1
    if text[pos] == "{":
        return pos, matching(text, pos)
    m = re.match(r"(for|if)\s*\(", text[pos:])
    if m:
        close = matching(text, pos + m.end() - 1)
        return pos, statement_extent(text, close)[1]
    depth = 0
    for j in range(pos, len(text)):
        depth += text[j] in "([{"
        depth -= text[j] in ")]}"
        if text[j] == ";" and depth == 0:
            return pos, j + 1
    raise SyntaxError("no end of statement at %d" % pos)


def scope_items(fn, pos):
    """The loops and int declarations (const and constexpr ones too) in effect at position pos of
    fn, in source order:
    ('for', var, init, relation, bound, step) and ('int', name, expr)."""
    text, items = fn.text, []
    for m in re.finditer(r"\bfor\s*\(", text[fn.start:fn.end]):
        start = fn.start + m.start()
        close = matching(text, fn.start + m.end() - 1)
        body = statement_extent(text, close)
        if not (body[0] <= pos < body[1]):
            continue
        header = text[fn.start + m.end():close - 1]
        h = re.match(r"\s*int\s+(\w+)\s*=\s*(.+?);\s*\1\s*(<=|<)\s*(.+?);\s*(?:\1\+\+|\+\+\1|\1\s*\+=\s*(.+))\s*$", header, re.S)
        if not h:
            raise SyntaxError("line %d: a loop this model cannot read: for (%s)" % (line_of(text, start), header))
        items.append((start, ("for", h.group(1), h.group(2), h.group(3), h.group(4), h.group(5) or "1")))
    for m in re.finditer(r"(?:^|(?<=[;{}]))\s*(?:constexpr\s+|const\s+)?int\s+(?=\w+\s*=)", text[fn.start:pos], re.M):
        decl_start = fn.start + m.end()
        # visible at pos when the innermost block around the declaration also holds pos
        depth, j = 0, decl_start
        while j > fn.start - 1:
            j -= 1
            depth += (text[j] == "}") - (text[j] == "{")
            if depth < 0:
                break
        if matching(text, j) <= pos:
            continue
        end = statement_extent(text, decl_start)[1]
        for part in split_top(text[decl_start:end - 1]):
            name, _, expr = part.partition("=")
            items.append((decl_start, ("int", name.strip(), expr.strip())))
    return [item for _, item in sorted(items, key=lambda x: x[0])]


def statement_guard(fn, pos):
    """the condition of an 'if (cond) statement;' whose statement holds pos, or None"""
    text, j = fn.text, pos
    while j > fn.start and text[j - 1] not in ";{}":
        j -= 1
    m = re.match(r"\s*if\s*\(", text[j:])
    if m:
        close = matching(text, j + m.end() - 1)
        if close <= pos:
            return text[j + m.end():close - 1]
    return None


def enumerate_scope(items, envs, active, macros, pinned):
    """Every iteration of the loops in items, for all threads at once: yields (envs, active)
    with each thread's variables. A loop whose bound a thread cannot evaluate runs once."""
    if not items:
        yield envs, active
        return
    kind, *rest = items[0]
    if kind == "int":
        name, expr = rest
        new = []
        for env in envs:
            env = dict(env)
            try:
                env[name] = evaluate(expr, env, macros)
            except (NameError, TypeError, SyntaxError):
                pass  # a runtime value (a batch index, T) or a float: no address needs it
            new.append(env)
        yield from enumerate_scope(items[1:], new, active, macros, pinned)
        return
    var, init, relation, bound, step = rest
    for n in itertools.count():
        new, now_active = [], []
        for env, act in zip(envs, active):
            env = dict(env)
            env[var] = evaluate(init, env, macros) + n * evaluate(step, env, macros)
            try:
                value = evaluate(bound, env, macros)
                inside = env[var] < value if relation == "<" else env[var] <= value
            except NameError:
                pinned.add(bound)
                inside = n == 0
            new.append(env)
            now_active.append(act and inside)
        if not any(now_active):
            return
        yield from enumerate_scope(items[1:], new, now_active, macros, pinned)
        if n > 4096:
            raise RuntimeError("loop over %s does not end" % var)


# ---------------------------------------------------------------------------------------------
# 3. The accesses of each kernel
# ---------------------------------------------------------------------------------------------
def primitives(mma_text):
    """mma.cuh's shared-memory instructions: name -> (index of the address parameter, bytes per
    lane, phase size in lanes, lanes that give an address, label)"""
    prims = {}
    for name, fn in functions(strip_comments(mma_text)).items():
        ptx = fn.body
        cvta = re.search(r"__cvta_generic_to_shared\((\w+)\)", ptx)
        if not cvta:
            continue
        arg = [p[1] for p in fn.params].index(cvta.group(1))
        ld = re.search(r"ldmatrix\.[\w.]*?\.m8n8\.x(\d)(\.trans)?[\w.]*\.b16", ptx)
        cp = re.search(r"cp\.async\.\w+\.shared\.global \[%\d\], \[%\d\], (\d+)", ptx)
        if ld:
            # "each address corresponds to the start of a matrix row": lanes 8i..8i+7 give the
            # rows of matrix i (PTX ISA, ldmatrix); one matrix of 8 x 16 bytes per phase
            prims[name] = (arg, 16, 8, 8 * int(ld.group(1)), "ldmatrix.x%s%s" % (ld.group(1), ld.group(2) or ""))
        elif cp:
            width = int(cp.group(1))
            prims[name] = (arg, width, phase_lanes_for(width), 32, "cp.async %d B" % width)
    return prims


def shared_arrays(fn, macros):
    """__shared__ arrays of a kernel: name -> (element bytes, dims, byte offset), in order"""
    arrays, offset = {}, 0
    for m in re.finditer(r"__shared__\s+(?:__align__\((\d+)\)\s+)?(\w+)\s+([^;]+);", fn.body):
        align, elem = int(m.group(1) or 4), ELEMENT_BYTES[m.group(2)]
        for decl in split_top(m.group(3)):
            name = re.match(r"\w+", decl).group(0)
            dims = [evaluate(d, dict(fn.targs), macros) for d in re.findall(r"\[([^\]]+)\]", decl)]
            offset = (offset + align - 1) // align * align
            arrays[name] = (elem, dims, offset)
            size = elem
            for d in dims:
                size *= d
            offset += size
    return arrays


def subscripts(text, i):
    """the [..][..] subscripts starting at text[i]: (list of expressions, end)"""
    subs = []
    while True:
        j = i
        while j < len(text) and text[j].isspace():
            j += 1
        if j >= len(text) or text[j] != "[":
            return subs, i
        end = matching(text, j)
        subs.append(text[j + 1:end - 1])
        i = end


def element_address(name, subs, arrays, env, macros):
    """byte address of name[s0][s1].. (or of the pointer name[s0] for fewer subscripts)"""
    elem, dims, base = arrays[name]
    index = 0
    for k, s in enumerate(subs):
        stride = 1
        for d in dims[k + 1:]:
            stride *= d
        index += evaluate(s, env, macros) * stride
    return base + index * elem


class Access:
    """one shared-memory access site, as seen from one kernel"""

    def __init__(self, kernel, label, line, width, phase, requests):
        self.kernel, self.label, self.line = kernel, label, line
        self.width, self.phase, self.requests = width, phase, requests


def requests_at(fn, pos, envs, active, macros, address, pinned, lanes_used=32):
    """[(warp, {lane: address})] for the access at pos of fn, over every iteration; only lanes
    below lanes_used supply an address (ldmatrix.x1: 8, .x2: 16)"""
    guard = statement_guard(fn, pos)
    out = []
    for envs2, act in enumerate_scope(scope_items(fn, pos), envs, active, macros, pinned):
        lanes_by_warp = {}
        for tid, (env, a) in enumerate(zip(envs2, act)):
            if not a or tid % 32 >= lanes_used:
                continue
            if guard is not None:
                try:
                    if not evaluate(guard, env, macros):
                        continue
                except (NameError, SyntaxError):
                    pass  # a condition on runtime values (T): assumed true
            lanes_by_warp.setdefault(tid // 32, {})[tid % 32] = address(env)
        out += sorted(lanes_by_warp.items())
    return out


def kernel_accesses(kernel, funcs, prims, macros, targs):
    """every shared-memory access that kernel<targs> makes, with its requests; targs: the template
    arguments by name, HS first ({"HS": 64, "MT": 2})"""
    kernel.targs = targs
    arrays = shared_arrays(kernel, macros)
    bounds = re.search(r"__launch_bounds__\((.+)\)\s*" + kernel.name, kernel.header)
    if not bounds:
        raise SyntaxError("%s: no __launch_bounds__ to take the block size from" % kernel.name)
    threads = evaluate(split_top(bounds.group(1))[0], {}, macros)  # (max threads, min blocks)
    base_envs = [dict(targs, threadIdx_x=t, blockDim_x=threads) for t in range(threads)]
    all_active = [True] * threads
    accesses, pinned = [], set()
    text = kernel.text
    declarations = [(kernel.start + m.start(), kernel.start + m.end())
                    for m in re.finditer(r"__shared__[^;]*;", kernel.body)]
    for name in arrays:
        for m in re.finditer(IDENT % name, text[kernel.start:kernel.end]):
            pos = kernel.start + m.start()
            if any(a <= pos < b for a, b in declarations):
                continue  # the declaration itself
            subs, end = subscripts(text, pos + len(name))
            _, dims, _ = arrays[name]
            refuse_address_of(text, pos, name, "%s[..] or %s" % (name, name))
            if len(subs) == len(dims):  # an element: a plain ld.shared / st.shared
                store = re.match(r"\s*(=(?!=)|[-+*/]=)", text[end:]) is not None
                elem = arrays[name][0]
                reqs = requests_at(kernel, pos, base_envs, all_active, macros,
                                   lambda env, s=subs, n=name: element_address(n, s, arrays, env, macros), pinned)
                accesses.append(Access(kernel.name, "%s %s[%s]" % ("st.shared" if store else "ld.shared", name,
                                       "][".join(subs)), line_of(text, pos), elem, phase_lanes_for(elem), reqs))
                continue
            # a pointer into the array: it must be an argument of a helper the model reads
            call = None
            for c in re.finditer(CALL, text[kernel.start:pos]):
                cstart = kernel.start + c.start()
                if matching(text, kernel.start + c.end() - 1) > pos and c.group(1) in funcs:
                    call = (c.group(1), cstart, kernel.start + c.end() - 1)
            if call is None:
                raise SyntaxError("line %d: %s is used in a way this model does not read" % (line_of(text, pos), name))

            def array_argument(arg, env, a_name=name):
                """the address of the argument array[i].. (an element or a row), None if the
                argument is not this array"""
                if re.match(r"\w*", arg).group(0) != a_name:
                    return None
                subs, end = subscripts(arg, len(a_name))
                if arg[end:].strip():
                    raise SyntaxError("line %d: %s: only array[i].. is read as a pointer argument"
                                      % (line_of(text, call[1]), arg))
                return element_address(a_name, subs, arrays, env, macros)
            accesses += helper_accesses(kernel, kernel, call, funcs, prims, macros, base_envs, all_active, pinned,
                                        name, array_argument)
    return accesses, pinned


def pointer_calls(fn, pname, funcs):
    """the calls in fn's body of the helpers this model reads that take the pointer pname as an
    argument (pname or pname + offset): [(helper name, call start, its open parenthesis)]"""
    calls, body = [], fn.text
    for c in re.finditer(CALL, body[fn.start:fn.end]):
        paren = fn.start + c.end() - 1
        if c.group(1) in funcs and any(pointer_offset(a, pname) is not None
                                       for a in split_top(body[paren + 1:matching(body, paren) - 1])):
            calls.append((c.group(1), fn.start + c.start(), paren))
    return calls


def helper_accesses(kernel, caller, call, funcs, prims, macros, base_envs, all_active, pinned, array, argument):
    """the accesses of a helper called from caller (the kernel, or a helper it calls) made through
    its pointer argument that points into the kernel's shared `array`; argument(arg, env): the
    address an argument expression gives in the caller, None if it is not that pointer. A helper
    that hands the pointer on to another helper is followed into that one (any depth)."""
    name, cstart, paren = call
    helper, text = funcs[name], caller.text
    args = split_top(text[paren + 1:matching(text, paren) - 1])
    out = []
    # the helper's parameters, thread by thread, from the caller's variables at the call
    for envs, act in enumerate_scope(scope_items(caller, cstart), base_envs, all_active, macros, pinned):
        guard = statement_guard(caller, cstart)
        if guard is not None:  # thread by thread: 'if (tile == 0)', 'if (warp == 1)'
            def holds(env):
                try:
                    return bool(evaluate(guard, env, macros))
                except (NameError, SyntaxError):
                    return True  # a condition on runtime values: assumed true
            act = [a and holds(env) for env, a in zip(envs, act)]
            if not any(act):
                continue  # no thread calls it at this iteration
        pointer = None
        henvs = []
        for env in envs:
            henv = {"threadIdx_x": env["threadIdx_x"], "blockDim_x": env["blockDim_x"]}
            # the helper's template parameters: the call's <...> arguments, else the defaults
            targs, _ = template_args(text, text.index(name, cstart) + len(name))
            for k, (tname, default) in enumerate(template_params(text, helper)):
                if k < len(targs):
                    henv[tname] = evaluate(targs[k], env, macros)
                elif default is not None:
                    henv[tname] = evaluate(default, henv, macros)
                else:
                    raise SyntaxError("line %d: %s needs template argument %s" % (line_of(text, cstart), name, tname))
            for (ptype, pname, is_ptr), arg in zip(helper.params, args):
                address = argument(arg, env) if is_ptr else None
                if address is not None:
                    henv["__ptr_" + pname] = address
                    pointer = (pname, ELEMENT_BYTES[ptype])
                elif not is_ptr and ptype != "float":  # (a float is never part of an address)
                    try:
                        henv[pname] = evaluate(arg, env, macros)
                    except (NameError, TypeError):
                        pass
            henvs.append(henv)
        if pointer is None:
            raise SyntaxError("line %d: %s passed to %s other than as a pointer" % (line_of(text, cstart), array, name))
        pname, elem = pointer
        body = helper.text
        found = False
        # instructions of mma.cuh called with an address derived from the pointer
        for prim, (argi, width, phase, lanes_used, label) in prims.items():
            for c in re.finditer(r"\b%s\s*\(" % prim, body[helper.start:helper.end]):
                ppos = helper.start + c.start()
                pargs = split_top(body[helper.start + c.end():matching(body, helper.start + c.end() - 1) - 1])
                offset = pointer_offset(pargs[argi], pname)
                if offset is None:
                    continue
                found = True
                reqs = requests_at(helper, ppos, henvs, act, macros,
                                   lambda env, o=offset: env["__ptr_" + pname] + evaluate(o, env, macros) * elem,
                                   pinned, lanes_used)
                out.append(Access(kernel.name, "%s -> %s (%s)" % (label, array, name), line_of(body, ppos),
                                  width, phase, reqs))
        # element accesses pointer[i]
        for c in re.finditer(r"\b%s\s*\[" % pname, body[helper.start:helper.end]):
            ppos = helper.start + c.start()
            refuse_address_of(body, ppos, pname, "%s or %s + i" % (pname, pname))
            subs, end = subscripts(body, ppos + len(pname))
            store = re.match(r"\s*(=(?!=)|[-+*/]=)", body[end:]) is not None
            found = True
            reqs = requests_at(helper, ppos, henvs, act, macros,
                               lambda env, s=subs[0]: env["__ptr_" + pname] + evaluate(s, env, macros) * elem, pinned)
            out.append(Access(kernel.name, "%s %s (%s)" % ("st.shared" if store else "ld.shared", array, name),
                              line_of(body, ppos), elem, phase_lanes_for(elem), reqs))
        # helpers this one hands the pointer on to (pname or pname + offset)
        nested = pointer_calls(helper, pname, funcs)
        for ncall in nested:
            def pointer_argument(arg, env, p=pname, e=elem):
                offset = pointer_offset(arg, p)
                return None if offset is None else env["__ptr_" + p] + evaluate(offset, env, macros) * e
            out += helper_accesses(kernel, helper, ncall, funcs, prims, macros, henvs, act, pinned, array,
                                   pointer_argument)
            found = True
        # nothing else may touch the pointer
        uses = len(re.findall(IDENT % pname, helper.body))
        modeled = len(re.findall(r"\b%s\s*\[" % pname, helper.body)) + sum(
            len(re.findall(r"\b%s\s*\(\s*(?:[^,()]*,\s*)*%s\b" % (p, pname), helper.body)) for p in prims) + len(nested)
        if not found or uses != modeled:
            raise SyntaxError("%s: pointer %s is used in a way this model does not read" % (name, pname))
        # on to the next iteration of the kernel's loops around the call (a loop over row tiles);
        # one whose bound is a runtime value (the loop over tiles) is taken at its first only
    return out


# ---------------------------------------------------------------------------------------------
# 4. The report
# ---------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pad", type=int, help="row padding in elements instead of FLASH_LD's (0: unpadded)")
    ap.add_argument("--cuh", default=os.path.join(ROOT, "llmc", "cuda", "flash_attention.cuh"))
    ap.add_argument("--mma", default=os.path.join(ROOT, "llmc", "cuda", "mma.cuh"))
    args = ap.parse_args()

    text = strip_comments(open(args.cuh).read())
    macros = Macros(text)
    ld = macros.functions.get("FLASH_LD")
    m = ld and re.fullmatch(r"\(\(\s*(\w+)\s*\)\s*\+\s*(\d+)\s*\)", ld[1])
    if not m:
        sys.exit("FLASH_LD is no longer ((HS) + N): update this model")
    pad = int(m.group(2)) if args.pad is None else args.pad
    macros.functions["FLASH_LD"] = (m.group(1), "((%s) + %d)" % (m.group(1), pad))
    prims = primitives(open(args.mma).read())
    funcs = functions(text)
    kernels = [f for f in funcs.values()
               if f.is_kernel and re.search(r"template\s*<int HS\b[^<>]*>\s*$", text[:f.decl_start])]
    print("shared-memory bank model of %s: rows of HS + %d elements%s; %s"
          % (os.path.relpath(args.cuh, ROOT), pad, " (--pad)" if args.pad is not None else " (FLASH_LD)",
             ", ".join("%s = %s" % (k, evaluate(k, {}, macros)) for k in macros.objects
                       if k.startswith("FLASH_") and re.fullmatch(r"[\w\s()*+/-]+", macros.objects[k])
                       and "." not in macros.objects[k])))
    rows, bad = [], 0
    notes = set()
    skipped = []  # kernels on dynamic shared memory, which this model does not read
    for kernel in kernels:
        if "extern __shared__" in kernel.body:  # (its tiles are carved from one byte array)
            skipped.append(kernel.name)
            continue
        # the instantiations the launchers make: kernel<64> or kernel<64, FLASH_Q_TILES>
        names = [tname for tname, _ in template_params(text, kernel)]
        sizes = sorted({tuple(evaluate(a, {}, macros) for a in template_args(text, m.end() - 1)[0])
                        for m in re.finditer(r"\b%s<" % kernel.name, text)})
        if not sizes:
            sys.exit("%s: no instantiation found" % kernel.name)
        for args in sizes:
            if len(args) != len(names):
                sys.exit("%s<%s>: %d template arguments for %s" % (kernel.name, args, len(args), names))
            hs = args[0]
            accesses, pinned = kernel_accesses(kernel, funcs, prims, macros, dict(zip(names, args)))
            notes |= pinned
            seen = {}
            for a in accesses:
                if not a.requests:
                    sys.exit("%s l.%d: no thread makes this access: the model misreads the code" % (a.label, a.line))
                worst = max((wavefronts(lanes, a.width, a.phase) for _, lanes in a.requests),
                            key=lambda wi: wi[0] / wi[1])
                key = (a.line, a.label)  # the same site through another call: keep the worst
                if key not in seen or worst[0] / worst[1] > seen[key][0] / seen[key][1]:
                    seen[key] = worst
            for (line, label), (w, i, n) in sorted(seen.items()):
                ok = w <= i
                bad += not ok
                rows.append((kernel.name.replace("flash_attention_", "").replace("_kernel", ""),
                             "l.%d %s" % (line, label), hs, w, i, "%d-way" % n, "yes" if ok else "NO"))
    head = ("kernel", "access (flash_attention.cuh line)", "HS", "wavefronts", "ideal", "worst phase",
            "conflict-free")
    widths = [max(len(str(r[k])) for r in rows + [head]) for k in range(len(head))]
    fmt = "  ".join("%%-%ds" % w if k < 2 else "%%%ds" % w for k, w in enumerate(widths))
    print(fmt % head)
    for r in rows:
        print(fmt % r)
    print("wavefronts: per request (one warp, one loop iteration), the worst request of the access; ideal: one\n"
          "per phase (ldmatrix.x4 and 16-byte accesses: 4 phases of 8 lanes); worst phase: wavefronts of its worst phase")
    if notes:
        print("loops with runtime bounds taken at their first iteration: %s" % ", ".join(sorted(notes)))
    if skipped:
        print("not read (their tiles carved from dynamic shared memory): %s" % ", ".join(skipped))
    if bad:
        print("%d of %d accesses have bank conflicts" % (bad, len(rows)))
        return 1
    print("all %d accesses conflict-free" % len(rows))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SyntaxError as e:  # code this model cannot follow: say so, never guess
        print("bank_conflicts: cannot read the code: %s" % e.msg, file=sys.stderr)
        sys.exit(2)
