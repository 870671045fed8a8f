"""The bench set's prompts, kind by kind: what is asked of which public text.

Used by make_bench_set.py; benchset_sources.py reads and cites the texts. Prompts with no source
file were written for this set (source "written for localspec's bench set", CC0).
"""

from __future__ import annotations

import random

from benchset_sources import (
    BUILT_WITH,
    Entry,
    Text,
    blank_body,
    head_paragraphs,
    head_statements,
    inject_off_by_one,
    module_docstring,
    package_file,
    reference_topic,
    signature_and_docstring,
    stdlib_file,
    string_constant,
)

WRITTEN = "written for localspec's bench set (CC0)"
WHOLE_FILE = "Output the whole updated file in one ```python block, and nothing else."


def all_entries(seed: int) -> list[Entry]:
    """Every prompt, in a fixed order; `seed` draws the edits that need a choice."""
    rng = random.Random(seed)
    return [
        *code_edits(rng),
        *code_writing(),
        *summaries(),
        *questions(),
        *translations(),
        *chats(),
        *maths(),
    ]


def _code(text: Text) -> str:
    return f"```python\n{text.body.rstrip()}\n```"


def _edit(name: str, text: Text, ask: str) -> Entry:
    return Entry(name, "code_edit", text.cite, f"{ask} {WHOLE_FILE}\n\n{_code(text)}")


def code_edits(rng: random.Random) -> list[Entry]:
    bisect = stdlib_file("bisect.py")
    # Dense with numbers (~2.3 characters a token), so a shorter cut.
    colorsys = head_statements(stdlib_file("colorsys.py"), 2200)
    nturl2path = stdlib_file("nturl2path.py")
    textwrap = head_statements(package_file("click", "click/_textwrap.py"))
    buggy_ranges, ranges_fn = inject_off_by_one(package_file("idna", "idna/intranges.py"), rng)
    buggy_repr, repr_fn = inject_off_by_one(head_statements(stdlib_file("reprlib.py")), rng)
    holed_sched, sched_fn = blank_body(head_statements(stdlib_file("sched.py")), rng)
    return [
        _edit(
            "edit_rename_bisect",
            bisect,
            "Rename the parameters `lo` and `hi` to `low` and `high` in every function of this module, "
            "including the docstrings and error messages.",
        ),
        _edit(
            "edit_rename_click_textwrap",
            textwrap,
            "Rename the helper `_truncate_visible` to `truncate_to_visible_width` and update every use.",
        ),
        _edit("edit_docstrings_colorsys", colorsys, "Add a one-line docstring to each function without one."),
        _edit(
            "edit_typehints_nturl2path",
            nturl2path,
            "Add type hints to every function signature. Change nothing else.",
        ),
        _edit(
            "edit_bugfix_intranges",
            buggy_ranges,
            f"Users report that `{ranges_fn}` gives wrong answers at the edges of a range. "
            "Find the bug and fix it.",
        ),
        _edit(
            "edit_bugfix_reprlib",
            buggy_repr,
            f"A test shows that `{repr_fn}` is off by one at one of its limits. Find the bug and fix it.",
        ),
        _edit(
            "edit_fill_body_sched",
            holed_sched,
            f"The body of `{sched_fn}` is missing (marked TODO). Write it, following its docstring "
            "and the rest of the class.",
        ),
    ]


def code_writing() -> list[Entry]:
    merge = signature_and_docstring(stdlib_file("heapq.py"), "merge")
    genericpath = head_statements(stdlib_file("genericpath.py"), 2400)
    return [
        Entry(
            "write_from_docstring_merge",
            "code_write",
            merge.cite,
            "Implement this function from its signature and docstring, without importing heapq. "
            f"Use a heap you write yourself and add type hints.\n\n{_code(merge)}",
        ),
        Entry(
            "write_tests_genericpath",
            "code_write",
            genericpath.cite,
            "Write pytest tests for `commonprefix` and `getsize` in this module, using the tmp_path "
            f"fixture where files are needed. Cover the edge cases.\n\n{_code(genericpath)}",
        ),
        Entry(
            "write_cli_csv_stats",
            "code_write",
            WRITTEN,
            "Write a Python command-line script that reads a CSV file given as an argument and prints, "
            "for every numeric column, the count, mean, minimum and maximum. Use only the standard "
            "library (argparse and csv), skip empty cells, and include type hints and a main() function.",
        ),
        Entry(
            "write_js_debounce",
            "code_write",
            WRITTEN,
            "Write a JavaScript function `debounce(fn, waitMs)` that returns a debounced version of fn "
            "with `cancel()` and `flush()` methods. Use modern JavaScript with JSDoc comments, and show "
            "a short usage example.",
        ),
        Entry(
            "write_sql_ranking",
            "code_write",
            WRITTEN,
            "Write a PostgreSQL query that returns, for each customer, the total amount of their orders "
            "in 2024 and their rank by that total (customers with no orders get 0), from the tables "
            "customers(id, name) and orders(id, customer_id, amount, created_at). Explain it briefly.",
        ),
    ]


def _document(text: Text) -> str:
    return f'"""\n{text.body.strip()}\n"""'


def summaries() -> list[Entry]:
    heapq = head_paragraphs(string_constant(stdlib_file("heapq.py"), "__about__"))
    texts = [
        ("summarize_heapq_about", heapq, "Summarize this explanation of heaps in one paragraph."),
        ("summarize_ref_with", reference_topic("with"), "Summarize this section as 5 bullet points."),
        ("summarize_ref_raise", reference_topic("raise"), "Summarize this section in about 120 words."),
        (
            "summarize_shelve_doc",
            module_docstring("shelve.py"),
            "Summarize what this module is for and its main caveats, in plain words.",
        ),
    ]
    return [Entry(name, "summarize", t.cite, f"{ask}\n\n{_document(t)}") for name, t, ask in texts]


def questions() -> list[Entry]:
    licence = package_file("click", f"click-{BUILT_WITH['click']}.dist-info/licenses/LICENSE.txt")
    texts = [
        ("qa_ref_exceptions", reference_topic("exceptions"), "What happens to an exception nothing handles?"),
        (
            "qa_ref_class",
            reference_topic("class"),
            "In what order are class decorators applied, and what is the class name bound to?",
        ),
        (
            "qa_statistics_doc",
            module_docstring("statistics.py"),
            "Which function gives the middle value of an even number of data points by averaging the two "
            "middle values, and which one returns the lower of the two?",
        ),
        (
            "qa_click_licence",
            licence,
            "May I use the project's name to promote a product built from it without asking?",
        ),
    ]
    return [
        Entry(
            name,
            "qa",
            t.cite,
            f"Answer the question using only the document below, and say which part of it supports "
            f"your answer.\n\nDocument:\n{_document(t)}\n\nQuestion: {question}",
        )
        for name, t, question in texts
    ]


def translations() -> list[Entry]:
    zen = string_constant(stdlib_file("this.py"), "s")
    # this.py keeps the Zen of Python in rot13.
    zen = Text(zen.body.translate(_ROT13), f"the Zen of Python, decoded from {zen.cite}")
    argparse_doc = head_paragraphs(module_docstring("argparse.py"))
    tty = stdlib_file("tty.py")
    return [
        Entry("translate_fr_zen", "translate", zen.cite, f"Translate into French:\n\n{zen.body}"),
        Entry(
            "translate_de_ref_for",
            "translate",
            (ref := reference_topic("for")).cite,
            "Translate this section of the Python reference into German. Keep code and names as they "
            f"are.\n\n{ref.body}",
        ),
        Entry(
            "translate_es_argparse_doc",
            "translate",
            argparse_doc.cite,
            f"Translate into Spanish, keeping the code example unchanged:\n\n{argparse_doc.body}",
        ),
        Entry(
            "translate_zh_tty_comments",
            "translate",
            tty.cite,
            "Translate the comments and docstrings of this file into Simplified Chinese. Leave the code "
            f"itself unchanged and output the whole file.\n\n{_code(tty)}",
        ),
    ]


_ROT13 = str.maketrans(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
    "NOPQRSTUVWXYZABCDEFGHIJKLMnopqrstuvwxyzabcdefghijklm",
)


def chats() -> list[Entry]:
    asks = {
        "chat_weekend_plan": "I have a free weekend in Lisbon in early March. I like food, old "
        "neighbourhoods and long walks, but not museums. Can you suggest a plan for Saturday and Sunday, "
        "with a rough budget?",
        "chat_credit_at_work": "A colleague keeps presenting my work as his in team meetings. I don't want "
        "a fight, but I want it to stop. How should I handle it? Give me a few concrete phrases I could use.",
        "chat_explain_sky": "My 11-year-old asked why the sky is blue and why sunsets are red. Can you "
        "explain it in a way she would understand, and suggest a simple experiment we could do at home?",
    }
    return [Entry(name, "chat", WRITTEN, text) for name, text in asks.items()]


def maths() -> list[Entry]:
    asks = {
        "math_muffins": "A bakery sells muffins at $2.50 each or in boxes of 6 for $12. Priya needs 20 "
        "muffins. What is the cheapest way to buy them, and what does it cost? Reason step by step.",
        "math_linear_system": "Solve the system 3x + 2y = 16 and 5x - 4y = 12. Show each step and check "
        "the solution.",
        "math_dice_prime": "Two fair six-sided dice are rolled. What is the probability that the sum is a "
        "prime number? Explain your counting.",
        "math_odd_sum_proof": "Prove by induction that 1 + 3 + 5 + ... + (2n - 1) = n^2 for every positive "
        "integer n.",
    }
    return [Entry(name, "math", WRITTEN, text) for name, text in asks.items()]
