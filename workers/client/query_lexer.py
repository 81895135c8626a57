"""A visibility query read the way Temporal's server reads it, to refuse what could
step out of the scope a bulk action wraps it in.

A bulk action runs ``(<user query>) AND <scope>``
(:func:`aiworker.workers.client.bulk.scoped_query`). That holds only if the
server sees the user's text as one parenthesized expression. Temporal parses a
visibility query with a MySQL-dialect SQL lexer (``temporalio/sqlparser``, from
Vitess) that drops comments before the grammar sees them: in
``/*(*/ WorkflowId = 'none') OR (AiworkerTenant = 'globex' /*)*/`` a check that
counts parentheses sees them balanced, while the server sees
``( WorkflowId = 'none') OR (AiworkerTenant = 'globex' )`` and the ``OR``
escapes the scope.

:func:`check_query` lexes the text with that lexer's rules for what hides
text from the grammar (strings, quoted names, comments) and refuses:

- comments of every kind the server drops or reads specially: ``--``, ``#``,
  ``//``, ``/* */`` and ``/*! */`` (whose inside the server reads as code);
- an unterminated string or quoted name, and parentheses that close more than
  they opened or stay open;
- outside strings, any character a Temporal query has no use for
  (``; @ : ? & | / \\ ^ ~ $ [ ] { }``, control characters, non-ASCII), so that a
  construct this lexer does not model (``@@var'...``, bind variables, ``;``)
  is refused here rather than read differently by the server;
- a string that directly follows a name or number (``x'41'``, ``b'1'``: the
  server's hex and bit literals, whose quoting rules differ from a string's).

Strings follow the server's rules: ``'`` or ``"`` delimited, a backslash
escapes the next character, a doubled delimiter is one delimiter character.
Quoted names (backticks) take a doubled backtick as an escape and no
backslash. Inside them, ``/*``, ``--``, quotes and parentheses are text.

Stricter than the server is safe (a query is refused with its reason, exit 2);
looser would not be, so the allowed set is what a Temporal list filter uses:
names, numbers, strings, ``= != <> < <= > >=``, ``( ) ,``, ``.``, ``+ -``
(signs and exponents), and ``*``.
"""

from __future__ import annotations

from dataclasses import dataclass

# Characters the server's lexer skips between tokens (anything else is a token or an
# error): a tab, a newline, a carriage return, a space.
_BLANK = frozenset(" \t\n\r")
_NAME = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
# Operators and punctuation a list filter uses; ``-`` and ``/`` are checked for
# comments first, and ``/`` is never allowed alone (division has no use here).
_PUNCTUATION = frozenset("=!<>(),.+-*")
_QUOTES = frozenset("'\"")

MAX_QUERY_CHARS = 8192
"""Characters of one ``--query``: a filter, not a list of ids."""


class QueryLexError(ValueError):
    """A query refused before it reaches the server: ``reason`` at ``position`` (0-based)."""

    def __init__(self, reason: str, position: int) -> None:
        super().__init__(f"{reason} at character {position + 1}")
        self.reason = reason
        self.position = position


@dataclass(frozen=True)
class Lexed:
    """What :func:`check_query` found: the deepest nesting and how many strings."""

    depth: int
    strings: int


def check_query(query: str) -> Lexed:
    """Lex ``query`` as the server would and refuse what could leave ``(query)``.

    Raises:
        QueryLexError: a comment, an unterminated string or quoted name, an
            unbalanced parenthesis, a character no list filter uses, or a
            string glued to a name (see the module docstring).
    """
    if len(query) > MAX_QUERY_CHARS:
        raise QueryLexError(f"the query has {len(query)} characters; at most {MAX_QUERY_CHARS}", 0)
    depth = deepest = strings = 0
    i, n = 0, len(query)
    while i < n:
        ch = query[i]
        if ch in _BLANK:
            i += 1
        elif ch in _NAME:
            start = i
            while i < n and query[i] in _NAME:
                i += 1
            if i < n and (query[i] in _QUOTES or query[i] == "`"):
                raise QueryLexError(
                    f"a quote directly after {query[start:i]!r} (put a space or an "
                    "operator between a name and a string)",
                    i,
                )
        elif ch in _QUOTES:
            i = _string_end(query, i)
            strings += 1
        elif ch == "`":
            i = _quoted_name_end(query, i)
        elif ch == "#" or query.startswith(("--", "//", "/*"), i):
            mark = "#" if ch == "#" else query[i : i + 2]
            raise QueryLexError(
                f"a comment ({mark!r}); comments are not allowed in a bulk action's query",
                i,
            )
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
            i += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise QueryLexError("a ')' that closes more than the query opened", i)
            i += 1
        elif ch in _PUNCTUATION:
            i += 1
        else:
            raise QueryLexError(f"{ch!r} has no use in a list filter", i)
    if depth:
        raise QueryLexError(f"{depth} '(' never closed", n)
    return Lexed(deepest, strings)


def _string_end(query: str, start: int) -> int:
    """The index after the string opening at ``start`` (the server's rules)."""
    delim = query[start]
    i, n = start + 1, len(query)
    while i < n:
        ch = query[i]
        if ch == "\\":
            i += 2  # the escaped character, whatever it is
        elif ch == delim:
            if i + 1 < n and query[i + 1] == delim:
                i += 2  # a doubled delimiter is one quote character
            else:
                return i + 1
        else:
            i += 1
    raise QueryLexError("a string that is never closed", start)


def _quoted_name_end(query: str, start: int) -> int:
    """The index after the backtick-quoted name opening at ``start``."""
    i, n = start + 1, len(query)
    while i < n:
        if query[i] == "`":
            if i + 1 < n and query[i + 1] == "`":
                i += 2
                continue
            if i == start + 1:
                raise QueryLexError("an empty quoted name (``)", start)
            return i + 1
        i += 1
    raise QueryLexError("a quoted name (`) that is never closed", start)


__all__ = ["MAX_QUERY_CHARS", "Lexed", "QueryLexError", "check_query"]
