"""The bulk actions' query lexer (``workers/client/query_lexer.py``): what it takes
and what it refuses, by the rules of the server's own lexer. The real server's
side is in ``test_cli_bulk.py``."""

from __future__ import annotations

import pytest

from aiworker.workers.client.query_lexer import MAX_QUERY_CHARS, QueryLexError, check_query


@pytest.mark.parametrize(
    "query",
    [
        "AiworkerStatus = 'failed'",
        "AiworkerPipeline = 'a /* b */ c'",  # comment marks inside strings are text
        "AiworkerPipeline = 'x -- y # z // w'",
        'AiworkerPipeline = "a ) OR ( b"',  # and so are parentheses
        "AiworkerPipeline = 'it''s'",  # a doubled quote is one quote
        "AiworkerPipeline = 'it\\'s /* not a comment'",  # a backslash escapes
        'AiworkerPipeline = "say ""hi"" -- twice"',
        "AiworkerPipeline = 'ends with a backslash \\\\'",
        "`AiworkerPipeline` = 'a' AND `odd``name` != 'b'",  # quoted names, doubled backtick
        "(AiworkerStatus IN ('failed', 'partial')) AND NOT (AiworkerTenant = 'x')",
        "StartTime >= '2026-01-01T00:00:00Z' AND AiworkerErrorCode IS NOT NULL",
        "CloseTime BETWEEN '2026-01-01' AND '2026-02-01' OR HistoryLength > -1.5e+3",
        "AiworkerPipeline = 'ünïcödé ✓'",
        "WorkflowId STARTS_WITH 'order-'\n\tAND\r\nAiworkerStatus<>'failed'",
    ],
)
def test_queries_a_user_writes_are_taken(query: str) -> None:
    check_query(query)


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("/*(*/ WorkflowId = 'none') OR (AiworkerTenant = 'globex' /*)*/", "a comment ('/*')"),
        ("x = 1 /*! OR 1 = 1 */", "a comment ('/*')"),
        ("x = 1 -- ) OR (y = 2", "a comment ('--')"),
        ("x = 1 --", "a comment ('--')"),
        ("x = 1 # ) OR (y = 2", "a comment ('#')"),
        ("x = 1 // ) OR (y = 2", "a comment ('//')"),
        ("x = 'a' /* 'b' */", "a comment"),
        ("a) OR (b", "closes more than the query opened"),
        ("(a", "1 '(' never closed"),
        ("x = 'open", "a string that is never closed"),
        ("x = 'escaped end\\'", "a string that is never closed"),
        ('x = "open', "a string that is never closed"),
        ("`open = 1", "never closed"),
        ("`` = 1", "an empty quoted name"),
        ("x = 1; DROP", "';' has no use"),
        ("@@x = 1", "'@' has no use"),
        ("x = :v", "':' has no use"),
        ("x = ?", "'?' has no use"),
        ("x = 1 || y = 2", "'|' has no use"),
        ("x = 1 && y = 2", "'&' has no use"),
        ("x = 1 / 2", "'/' has no use"),
        ("x = \\'a'", "'\\\\' has no use"),
        ("x = 1\x00", "'\\x00' has no use"),
        ("x = 1\u00a0", "has no use"),
        ("x = X'41'", "a quote directly after 'X'"),
        ("x = b'1'", "a quote directly after 'b'"),
    ],
)
def test_what_could_leave_the_parentheses_is_refused(query: str, says: str) -> None:
    with pytest.raises(QueryLexError) as e:
        check_query(query)
    assert says in str(e.value), str(e.value)


def test_the_refusal_names_where() -> None:
    with pytest.raises(QueryLexError) as e:
        check_query("x = 'a /* b' AND /* c */")
    assert e.value.position == len("x = 'a /* b' AND ")
    assert str(e.value).endswith(f"at character {e.value.position + 1}")


def test_a_query_is_bounded() -> None:
    check_query("x = '" + "a" * (MAX_QUERY_CHARS - 6) + "'")
    with pytest.raises(QueryLexError, match="at most"):
        check_query("x = '" + "a" * MAX_QUERY_CHARS + "'")
