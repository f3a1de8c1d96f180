"""Names shortened to a width, keeping what tells them apart.

    distinct_names(["transformer.h.3.attn.c_attn (Conv1D) forward", ...], 30)
    # ['…h.3.attn.c_attn (Conv1D) forward', ...]: the layer index stays, the shared path goes
    short_name(kernel, 40)        # one name alone: parameters, then template arguments, then the middle
    signatures_shortened(text, 60)  # the C++ signatures inside a sentence, each cut to 60

A table's names are shortened together (:func:`distinct_names`): what they share (a model's
path, ``at::native::``, a kernel's parameter list) goes before what differs (the layer index,
template arguments, a kernel's tile and alignment). A C++ signature is first written the way a
person reads it (no ``void``, no namespaces, no parameter list when it has template arguments,
lambdas as ``[](float)``); if it still does not fit, its words are kept in order of how few
other names in the table share them, each gap shown as ``…``. Names that would still read alike
end in a digest of the whole name (``~3fa2c1``). CSV and JSON keep whole names.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections import Counter
from collections.abc import Sequence

ELLIPSIS = "…"
NAME_WIDTH = 90  # a name alone (a diff's line, an evidence's place) is cut to this by default
_MIN_SHORT_NAME = 8  # the least of a name worth showing before its digest
_MIN_WORD = 8  # the least of a long word shown cut in its middle
_FEW = 2  # a word no more names hold than this tells them apart: worth cutting rather than dropping
# Words (letters and digits) and the single characters between them.
_ATOMS = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9]")
_WORD = re.compile(r"[A-Za-z0-9]+")
# What a C++ signature holds that tells no two kernels apart, in the order it is removed.
_READABLE = (
    (re.compile(r"^void "), ""),
    (re.compile(r"\(anonymous namespace\)::"), ""),
    (re.compile(r"::operator\(\)\(\) const"), ""),
    (re.compile(r"\{lambda\(\)#\d+\}::"), ""),
    (re.compile(r"\([^()]*\)::\{lambda"), "::{lambda"),
    (re.compile(r"::\{lambda\(([^()]*)\)#\d+\}"), r"[](\1)"),
    (re.compile(r"\{lambda\(([^()]*)\)#\d+\}"), r"[](\1)"),
    (re.compile(r"\b[A-Za-z_]\w*::(?=[A-Za-z_~])"), ""),
    (re.compile(r"> >"), ">>"),
)


def digest(name: str) -> str:
    """`` ~3fa2c1``: 24 bits of a hash of the whole name, which a shortened name ends in."""
    return f" ~{hashlib.blake2s(name.encode('utf-8', 'replace'), digest_size=3).hexdigest()}"


def cut_middle(text: str, width: int) -> str:
    """``text`` at most ``width`` characters, its middle replaced by an ellipsis."""
    if len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    head = width // 2
    return text[:head] + ELLIPSIS + text[len(text) - (width - 1 - head):]


def is_signature(name: str) -> bool:
    """Whether a name reads as a C++ function (a kernel): namespaces or template arguments."""
    return "::" in name or ("<" in name and ">" in name)


def readable(name: str) -> str:
    """A C++ signature as a person reads it: no ``void``, namespaces, or parameter list when it
    has template arguments (they repeat them); lambdas as ``[](float)``. Other names as they are."""
    if not is_signature(name):
        return name
    text = name
    if text.endswith(")") and "<" in text:
        opening = _matching(text, len(text) - 1)
        if opening > 0 and "<" in text[:opening]:
            text = text[:opening]
    for pattern, replacement in _READABLE:
        previous = None
        while previous != text:  # nested qualifiers need several passes
            previous, text = text, pattern.sub(replacement, text)
    return text.strip()


def distinct_names(names: Sequence[str], width: int) -> list[str]:
    """Each name at most ``width`` characters, those cut keeping what tells them from the others.

    Args:
        names: a table's names, in its order.
        width: the most characters each may have.

    Returns:
        The names, each whole if it fits, else shortened (see the module's docstring); two
        distinct names never read alike unless their digests collide.
    """
    if all(len(name) <= width for name in names):
        return list(names)
    shown = {name: readable(name) if len(name) > width else name for name in dict.fromkeys(names)}
    # How many of the table's names hold each word: the fewer, the more a word tells.
    holders = Counter(word for text in shown.values() for word in set(_WORD.findall(text)))
    total = max(len(shown), 1)
    fitted = {name: text if len(text) <= width else _fit_words(text, width, holders, total)
              for name, text in shown.items()}
    # Names that still read alike (or read as another's whole name) end in a digest of the whole.
    readings = Counter(fitted.values())
    for name, text in fitted.items():
        if readings[text] > 1 and text != name:
            fitted[name] = _tagged(shown[name], name, width, holders, total)
    return [fitted[name] for name in names]


def short_name(name: str, width: int = NAME_WIDTH) -> str:
    """One name alone made to fit ``width``, still telling distinct names apart by a digest.

    A C++ kernel's parameters are dropped first, then its template arguments from the innermost
    out, then the middle of what is left. Kernels of one template differ only in what goes, so
    a shortened name ends in a digest of the whole name (``~3fa2c1``): two distinct names
    shorten alike only if their 24-bit digests collide too. A table shortens its names together
    with :func:`distinct_names` instead, which keeps what differs between them.
    """
    if len(name) <= width:
        return name
    tag = digest(name)
    if width < len(tag) + _MIN_SHORT_NAME:  # no room to tell names apart: cut only
        return cut_middle(name, width)
    room = width - len(tag)
    short = name
    if short.endswith(")") and (opening := _matching(short, len(short) - 1)) >= 0:
        short = short[:opening] + "(…)"
    depth = _deepest(short)
    while len(short) > room and depth > 0:
        short = _collapse(short, depth)
        depth -= 1
    return cut_middle(short, room) + tag


def signatures_shortened(text: str, width: int) -> str:
    """``text`` with each C++ signature in it longer than ``width`` shortened, the signatures
    of one text shortened together (:func:`distinct_names`): prose that names kernels."""
    spans = list(_signature_spans(text))
    long = [text[start:end] for start, end in spans if end - start > width]
    if not long:
        return text
    short = dict(zip(long, distinct_names(long, width), strict=True))
    out, at = [], 0
    for start, end in spans:
        out.append(text[at:start])
        out.append(short.get(text[start:end], text[start:end]))
        at = end
    return "".join(out) + text[at:]


# A signature starts at a (qualified) name followed by its template arguments or parameters.
_SIGNATURE_START = re.compile(r"(?:void )?[A-Za-z_][\w:]*(?=[<(])")


def _signature_spans(text: str) -> list[tuple[int, int]]:
    """Where the C++ signatures in ``text`` are: a name, its balanced ``<...>`` and ``(...)``."""
    spans = []
    at = 0
    while (found := _SIGNATURE_START.search(text, at)) is not None:
        end = found.end()
        while end < len(text) and text[end] in "<(":
            closed = _matching(text, end)
            if closed < 0:
                break
            end = closed + 1
            if text.startswith("::", end):  # cutlass's Kernel<...>(Params::...) and kin
                word = re.match(r"::[\w:]*", text[end:])
                end += word.end() if word else 0
        if "<" in text[found.start():end] or "::" in text[found.start():end]:
            spans.append((found.start(), end))
        at = max(end, found.end() + 1)
    return spans


def _fit_words(text: str, width: int, holders: Counter[str], total: int) -> str:
    """``text`` cut to ``width`` keeping, in order, the words fewest other names share.

    Words are added one at a time: the one the fewest names hold (a word repeated within the
    name counts at its last place), the leading identifier's words (what names the thing: a
    kernel's template, a model's root) ahead of their equals, then the latest (a kernel's tile,
    layout and alignment end its name), then one next to a word already kept. Each is shown in
    its place, what lies between two kept words kept when it holds no dropped word, each gap an
    ellipsis; a word that would overflow is cut in its middle where it tells the name apart (no
    more than :data:`_FEW` names hold it) and :data:`_MIN_WORD` of it still fits, else passed
    over for the ones after it.
    """
    atoms = _ATOMS.findall(text)
    words = [i for i, atom in enumerate(atoms) if _WORD.fullmatch(atom)]
    if not words:
        return cut_middle(text, width)
    seen: set[str] = set()
    rarity: dict[int, float] = {}
    for index in reversed(words):  # a repeated word counts at its last place
        rarity[index] = holders[atoms[index]] / total if atoms[index] not in seen else 2.0
        seen.add(atoms[index])
    # The name's leading identifier (``cunn_SoftMaxForward``), when short, names what it is.
    lead = re.match(r"[A-Za-z0-9_]+", text)
    naming = [i for i in words if lead and len(lead.group()) <= width // 2 and
              sum(len(a) for a in atoms[:i]) < lead.end()] or words[:1]
    for index in naming:
        rarity[index] -= 0.5 / total
    neighbours = {index: {words[n - 1] if n else -1, words[n + 1] if n + 1 < len(words) else -1}
                  for n, index in enumerate(words)}
    kept: set[int] = set()
    left = set(words)
    best = ""
    shown = list(atoms)
    while left:
        index = min(left, key=lambda i: (rarity[i], -i, not (neighbours[i] & kept)))
        left.discard(index)
        trial = _render(shown, kept | {index})
        over = len(trial) - width
        if over > 0 and holders[atoms[index]] <= _FEW and len(atoms[index]) - over >= _MIN_WORD:
            # A long word that tells the name apart is worth its middle: ScaledDot…Backward0.
            shown[index] = cut_middle(atoms[index], len(atoms[index]) - over)
            trial = _render(shown, kept | {index})
        if len(trial) <= width:
            kept.add(index)
            best = trial
        else:
            shown[index] = atoms[index]
    return best or cut_middle(text, width)


def _render(atoms: list[str], kept: set[int]) -> str:
    """The kept words in order, with what lies between two of them when it holds no dropped
    word, else an ellipsis; an ellipsis too for words dropped before the first or after the last."""
    if not kept:
        return ""
    positions = sorted(kept)
    out = [_between(atoms[:positions[0]])]
    for here, following in itertools.pairwise(positions):
        out += [atoms[here], _between(atoms[here + 1:following])]
    out += [atoms[positions[-1]], _between(atoms[positions[-1] + 1:])]
    return _cleaned("".join(out))


# Parentheses hold a layer's type (``(Conv1D)``): a gap keeps those it leaves open. Angle
# brackets are left to the ellipsis: a template's nesting shown bracket by bracket is noise.
_OPENS = {"(": ")"}
_CLOSES = {")": "("}


def _between(atoms: list[str]) -> str:
    """What shows for atoms between two kept words: themselves when they hold no word, else an
    ellipsis between the parentheses the gap closes (opened before it) and those it opens
    (closed after it), so that what is kept stays balanced: ``c_attn (Conv1D)`` keeps ``c…(Conv1D)``."""
    if not any(_WORD.fullmatch(atom) for atom in atoms):
        return "".join(atoms)
    closes: list[str] = []
    opened: list[str] = []
    for atom in atoms:
        if atom in _OPENS:
            opened.append(atom)
        elif atom in _CLOSES:
            if opened and opened[-1] == _CLOSES[atom]:
                opened.pop()
            elif not opened:
                closes.append(atom)
    return f"{''.join(closes)}{ELLIPSIS}{''.join(opened)}"


def _cleaned(text: str) -> str:
    """Separators left dangling around an ellipsis dropped (``h.…`` reads ``h…``)."""
    text = re.sub(r"[ ._:,]+…", ELLIPSIS, text)
    text = re.sub(r"…[ ._:,]+(?=[A-Za-z0-9(\[<])", ELLIPSIS, text)
    return re.sub(r"…+", ELLIPSIS, text)


def _tagged(text: str, name: str, width: int, holders: Counter[str], total: int) -> str:
    tag = digest(name)
    room = width - len(tag)
    if room < _MIN_SHORT_NAME:
        return cut_middle(name, width)
    body = text if len(text) <= room else _fit_words(text, room, holders, total)
    return body + tag


_PAIRS = {"(": ")", "<": ">", "[": "]"}


def _matching(text: str, at: int) -> int:
    """The index of the bracket that pairs with the one at ``at`` (searching forward from an
    opening one, backward from a closing one), or -1 where none does."""
    char = text[at]
    forward = char in _PAIRS
    mate = _PAIRS[char] if forward else next((o for o, c in _PAIRS.items() if c == char), "")
    depth = 0
    for index in range(at, len(text)) if forward else range(at, -1, -1):
        if text[index] == char:
            depth += 1
        elif text[index] == mate:
            depth -= 1
            if depth == 0:
                return index
    return -1


def _deepest(text: str) -> int:
    """How deep angle brackets nest in ``text``: 0 without any, 2 for ``f<a<b>>``."""
    depth = deepest = 0
    for char in text:
        if char == "<":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ">" and depth:
            depth -= 1
    return deepest


def _collapse(text: str, level: int = 1) -> str:
    """Replace every angle-bracketed part at ``level`` with an ellipsis: ``f<a<b>>`` -> ``f<…>``
    at level 1, ``f<a<…>>`` at level 2."""
    out: list[str] = []
    depth = 0
    for char in text:
        if char == "<":
            if depth < level:
                out.append(char)
            if depth == level - 1:
                out.append(ELLIPSIS)
            depth += 1
        elif char == ">" and depth:
            depth -= 1
            if depth < level:
                out.append(char)
        elif depth < level:
            out.append(char)
    return "".join(out)
