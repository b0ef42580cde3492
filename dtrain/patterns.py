"""Regular expressions from users that run on every line of a job's output (--progress-pattern).

Python's re backtracks: `(a+)+$` on a line of 30 `a`s and a `!` takes minutes, and the
supervisor applies the pattern to every rank line, `dtrain report` to every line of a log. So a
pattern is checked before it is used (`backtracking`: a small static analysis of the parsed
regex, plus a length bound), and the line it is applied to is cut to `MAX_LINE` characters
(`search`), which bounds what a pattern the check lets through can cost, and applies to a pattern
from an older job record alike.

What is refused (the shapes that backtrack exponentially, or polynomially with a high degree):
- a repetition (`+`, `*`, `{m,n}` with n >= 2) whose body holds a large repetition that can end
  where the next round or what follows begins with the same characters: `(a+)+`, `(a*)*`,
  `(\\w+\\s?)+`, `(.*a){20}`, `(x+x+)+y`;
- a repetition over alternatives that can start with the same character: `(a|aa)+`, `(\\w|\\d)*`;
- a repetition whose body can match nothing, unbounded: `(a?)*`;
- more than two large repetitions in a row that can each take the others' characters
  (`.*a.*b.*c`: a polynomial of degree 4 once search tries every start);
- backreferences (`(a+)\\1`): what they cost cannot be bounded this way.
Possessive repetitions (`a++`) and atomic groups (`(?>...)`) do not backtrack and pass.

Standard library only: the supervisor (launch/node/supervise.py) imports it in the image's Python.
"""

from __future__ import annotations

import re

try:  # Python 3.11+; 3.10 and older: sre_parse (the image's Python may be either)
    from re import _parser as _sre  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - older Pythons
    import sre_parse as _sre  # type: ignore[no-redef]

MAX_PATTERN = 512  # characters of a pattern; a progress line's pattern is a few words
MAX_LINE = 2048  # characters of a line a pattern is applied to (the rest is not searched)
LARGE = 32  # a repetition with more rounds than this (or unbounded) counts as large
REPEATS = 4  # a repetition of more rounds than this is checked for nested choices
MAX_POWER = 2  # a failing search's cost: at most about MAX_LINE**2 (x the small choices) ...
MAX_STEPS = 2 * MAX_LINE ** 2  # ... and MAX_STEPS in all: a fraction of a second on one line
MAX_FACTOR = 64  # ways to split a line among small repetitions: (a{2,5}.{2,5}){3} has 4096

# The characters a class is tested on: ASCII and a few others (a letter, a digit, a space, CJK).
_UNIVERSE = frozenset(range(128)) | frozenset((0xA0, 0xE9, 0x0663, 0x2003, 0x4E00))
_EMPTY: frozenset = frozenset()


def _name(op) -> str:
    return getattr(op, "name", str(op))


def _category(cat) -> frozenset:
    name = _name(cat).removeprefix("CATEGORY_")
    negate = name.startswith("NOT_")
    name = name.removeprefix("NOT_").removeprefix("UNI_").removeprefix("LOC_")
    test = {"DIGIT": lambda c: chr(c).isdecimal(), "SPACE": lambda c: chr(c).isspace(),
            "WORD": lambda c: chr(c).isalnum() or c == 0x5F, "LINEBREAK": lambda c: c == 10}.get(name)
    if test is None:
        return _UNIVERSE
    hit = frozenset(c for c in _UNIVERSE if test(c))
    return _UNIVERSE - hit if negate else hit


def _fold(chars: frozenset, ignore_case: bool) -> frozenset:
    if not ignore_case:
        return chars
    more = set(chars)
    for c in chars:
        for o in (ord(x) for x in {chr(c).lower(), chr(c).upper()} if len(x) == 1):
            if o in _UNIVERSE:
                more.add(o)
    return frozenset(more)


def _class(items, ignore_case: bool) -> frozenset:
    """The characters (of _UNIVERSE) an IN class matches."""
    out: set = set()
    negate = False
    for op, av in items:
        n = _name(op)
        if n == "NEGATE":
            negate = True
        elif n == "LITERAL":
            out.add(av)
        elif n == "RANGE":
            out.update(c for c in _UNIVERSE if av[0] <= c <= av[1])
        elif n == "CATEGORY":
            out |= _category(av)
        else:  # BIGCHARSET, CHARSET (compiled forms): assume anything
            out |= _UNIVERSE
    chars = _fold(frozenset(c for c in out if c in _UNIVERSE), ignore_case)
    return _UNIVERSE - chars if negate else chars


class Refused(ValueError):
    """Why a pattern can backtrack without bound; str() is the reason, in words."""


class _Info:
    """nullable, first characters and the largest repetition of a piece of pattern."""

    __slots__ = ("nullable", "first")

    def __init__(self, nullable: bool, first: frozenset):
        self.nullable, self.first = nullable, first


def _seq_info(seq, ic: bool) -> _Info:
    first: set = set()
    for item in seq:
        i = _item_info(item, ic)
        first |= i.first
        if not i.nullable:
            return _Info(False, frozenset(first))
    return _Info(True, frozenset(first))


def _item_info(item, ic: bool) -> _Info:
    op, av = item
    n = _name(op)
    if n == "LITERAL":
        return _Info(False, _fold(frozenset({av}) & _UNIVERSE or {0x4E00}, ic))
    if n == "NOT_LITERAL":
        return _Info(False, _UNIVERSE - _fold(frozenset({av}), ic))
    if n == "ANY":
        return _Info(False, _UNIVERSE)
    if n == "IN":
        return _Info(False, _class(av, ic))
    if n in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
        lo, _hi, body = av
        b = _seq_info(body, ic)
        return _Info(lo == 0 or b.nullable, b.first)
    if n == "SUBPATTERN":
        return _seq_info(av[-1], _ic(ic, av))
    if n == "ATOMIC_GROUP":
        return _seq_info(av, ic)
    if n == "BRANCH":
        infos = [_seq_info(alt, ic) for alt in av[1]]
        return _Info(any(i.nullable for i in infos), frozenset().union(*(i.first for i in infos)))
    if n == "GROUPREF_EXISTS":
        alts = [a for a in av[1:] if a is not None]
        infos = [_seq_info(a, ic) for a in alts]
        return _Info(len(alts) < 2 or any(i.nullable for i in infos), frozenset().union(*(i.first for i in infos)))
    if n == "GROUPREF":
        return _Info(True, _UNIVERSE)
    return _Info(True, _EMPTY)  # AT, ASSERT, ASSERT_NOT: match no character


def _ic(ic: bool, sub) -> bool:
    add, delete = sub[1], sub[2]
    return (ic or bool(add & re.IGNORECASE)) and not (delete & re.IGNORECASE)


def _large(lo: int, hi: int) -> bool:
    return hi == _sre.MAXREPEAT or hi > LARGE and hi > lo


def _follows(seq, follow: frozenset, ic: bool) -> list[frozenset]:
    """What can come after each item of seq (the rest of seq, then `follow`)."""
    out = [follow] * len(seq)
    after = follow
    for k in range(len(seq) - 1, -1, -1):
        out[k] = after
        i = _item_info(seq[k], ic)
        after = i.first | after if i.nullable else i.first
    return out


def _walk(seq, follow: frozenset, ic: bool, inside: str | None) -> list[tuple[frozenset, bool, bool]]:
    """Checks seq (what can follow it: `follow`; `inside`: the enclosing repetition's shape, or
    None outside any that repeats more than a few times); raises Refused. Returns the large
    repetitions along seq and the single characters between them, in order: (characters, whether
    where a repetition stops is a choice because what follows can start with its characters,
    whether it is a single character)."""
    found: list[tuple[frozenset, bool, bool]] = []
    for item, after in zip(seq, _follows(seq, follow, ic)):
        op, av = item
        n = _name(op)
        if n in ("MAX_REPEAT", "MIN_REPEAT"):
            lo, hi, body = av
            b = _seq_info(body, ic)
            again = b.first | after if hi >= 2 else after  # after one round: another, or what follows
            if b.nullable and hi >= REPEATS:
                raise Refused("a repetition of something that can match nothing, e.g. (a*)* or (a?){30}: exponential time on a line")
            if b.nullable and hi > lo:  # (a*)?: nothing, two ways
                if inside is not None:
                    raise Refused(f"an optional part that can also match nothing inside a repetition, e.g. "
                                  f"((a*)?){{20}}: exponential time on a line")
                found.append((_EMPTY, 2, False))
            choice = hi > lo and bool(b.first & after)
            if choice and inside is not None:
                raise Refused(f"nested repetitions that can match the same text in many ways, e.g. {inside}: exponential time on a line")
            inner = _walk(body, again, ic, _shape(inside, hi) if hi >= REPEATS else inside)
            closed = (any(not e[2] for e in inner) and inner[-1][2]  # (\d+\.)+\d+: the . decides, and
                      and not inner[-1][0] & after)          # the \d+ inside stands for the rounds
            if _large(lo, hi) and not closed:
                found.append((b.first, choice, False))
            elif hi > lo and not _large(lo, hi):  # a{2,5}, a?: a few ways to go on, a constant factor
                found.append((_EMPTY, hi - lo + 1, False))
            if lo == 0:  # maybe none of it: its characters do not separate what is around it
                inner = [e for e in inner if not e[2]]
            found += inner * (hi if hi < REPEATS else 1)  # (x.*){3}: three of them; (\d+\.)+: none a choice
        elif n in ("LITERAL", "NOT_LITERAL", "ANY", "IN"):
            found.append((_item_info(item, ic).first, False, True))  # a character every match has here
        elif n == "POSSESSIVE_REPEAT":
            _walk(av[2], _EMPTY, ic, None)
        elif n == "SUBPATTERN":
            found += _walk(av[-1], after, _ic(ic, av), inside)
        elif n == "ATOMIC_GROUP":
            _walk(av, _EMPTY, ic, None)
        elif n == "BRANCH":
            alts = av[1]
            if inside is not None:
                seen: frozenset = frozenset()
                for alt in alts:
                    i = _seq_info(alt, ic)
                    starts = i.first | after if i.nullable else i.first
                    if seen & starts:
                        raise Refused("alternatives that can start alike under a repetition, e.g. (a|aa)+: exponential time on a line")
                    seen |= starts
            found += _either([_walk(alt, after, ic, inside) for alt in alts])
        elif n == "GROUPREF_EXISTS":
            found += _either([_walk(alt, after, ic, inside) for alt in av[1:] if alt is not None])
        elif n in ("ASSERT", "ASSERT_NOT"):
            found += _walk(av[1], _EMPTY, ic, inside)
        elif n == "GROUPREF":
            raise Refused("a backreference (\\1, (?P=name)): its time on a line cannot be bounded")
    return found


def _either(alts: list) -> list:
    """The repetitions of alternatives, each tried in turn: all of them (none separated by the
    others' characters), and a factor of how many there are."""
    found = [e for alt in alts for e in alt if not e[2]]
    return found + [(_EMPTY, len(alts), False)] if len(alts) > 1 else found


def _degree(found: list[tuple[frozenset, bool, bool]]) -> tuple[int, int]:
    r"""How many large repetitions multiply a failing search's cost by the line's length: one
    whose stop is a choice, or one whose characters an earlier one could have taken (unless a
    character between them is one the earlier ones cannot take: `\d+\.\d+`), and the product
    of the small ones' ways to split (a{2,5}a: 4)."""
    degree, factor = 0, 1
    before: frozenset = frozenset()
    for chars, choice, single in found:
        if single:
            before = before if chars & before else frozenset()
        elif not chars:
            factor *= choice
        else:
            degree += choice or bool(chars & before)
            before |= chars
    return degree, factor


def _shape(inside: str | None, hi: int) -> str:
    return inside or ("(a+)+" if hi == _sre.MAXREPEAT else "(.*a){20}")


def backtracking(pattern: str) -> str | None:
    """Why `pattern` can take exponential (or high polynomial) time on a line, in words; None
    when it cannot (by this analysis). A pattern that does not compile: re.error."""
    if len(pattern) > MAX_PATTERN:
        return f"longer than {MAX_PATTERN} characters (a progress line's pattern is a few words)"
    parsed = _sre.parse(pattern)
    ic = bool(parsed.state.flags & re.IGNORECASE)
    try:
        seq = parsed.data if hasattr(parsed, "data") else list(parsed)
        chain, factor = _degree(_walk(seq, _EMPTY, ic, None))
    except Refused as e:
        return str(e)
    except RecursionError:
        return "nested too deep"
    anchored = bool(seq) and _name(seq[0][0]) == "AT" and _name(seq[0][1]) in ("AT_BEGINNING", "AT_BEGINNING_STRING")
    power = chain + (not anchored)  # ^: search tries one position, not every one
    if power > MAX_POWER or factor > MAX_FACTOR or MAX_LINE ** power * factor > MAX_STEPS:
        return ("repetitions that can take each other's text, e.g. .*a.*b or \\w{2,9}.{2,9}x (a search tries "
                f"every split at every position: about {MAX_LINE}^{power}" + (f" x {factor}" if factor > 1 else "")
                + " steps on a line that does not match); keep one, or anchor with ^")
    return None


def compile_bounded(pattern: str) -> re.Pattern:
    """The pattern compiled, after `backtracking`'s check: re.error naming the reason."""
    rx = re.compile(pattern)
    why = backtracking(pattern)
    if why:
        raise re.error(f"can backtrack without bound: {why}")
    return rx


def search(rx: re.Pattern, line: str):
    """rx.search on the line's first MAX_LINE characters (a progress line is short; a longer one
    is matched on its start, so no line costs more than that)."""
    return rx.search(line if len(line) <= MAX_LINE else line[:MAX_LINE])
