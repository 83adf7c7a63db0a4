"""The prompt template: plain column names in braces, literal braces doubled, anything else
refused naming the field; rendered for a whole batch, column by column, nulls reported."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from rowbatch.consumer.model.openai.template import PromptTemplate, TemplateError


def render(
    template: str,
    columns: dict[str, NDArray[Any]],
    nulls: dict[str, NDArray[np.bool_]] | None = None,
) -> tuple[list[str], dict[int, str]]:
    rows = len(next(iter(columns.values()))) if columns else 1
    return PromptTemplate(template).render(columns, nulls or {}, rows)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("Summarise {a.b}", "{a.b}"),
        ("Summarise {a!r}", "{a!r}"),
        ("Summarise {a:>5}", "{a:>5}"),
        ("Summarise {0}", "{0}"),
        ("Summarise {}", "{}"),
        ("Summarise {a[0]}", "{a[0]}"),
        ("{body} and {x!s:^3}", "{x!s:^3}"),
    ],
)
def test_a_field_that_is_not_a_plain_column_is_refused_by_name(text: str, named: str) -> None:
    with pytest.raises(TemplateError) as caught:
        PromptTemplate(text)
    message = str(caught.value)
    assert f"prompt template field {named} is not a plain column name" in message
    assert "{{ and }} for literal braces" in message


@pytest.mark.parametrize("text", ["Summarise {body", "Summarise body}", "{a} }{ {b}", "{"])
def test_unbalanced_braces_do_not_parse(text: str) -> None:
    with pytest.raises(TemplateError, match="does not parse") as caught:
        PromptTemplate(text)
    assert repr(text) in str(caught.value)


def test_template_error_is_a_value_error() -> None:
    # pydantic turns a ValueError raised in a validator into a field error.
    assert issubclass(TemplateError, ValueError)


def test_literal_braces_are_doubled() -> None:
    template = PromptTemplate('Answer as {{"label": ...}} for {body}}}')
    assert template.fields == ("body",)
    texts, nulls = template.render({"body": np.array(["x", "y"], object)}, {}, 2)
    assert texts == ['Answer as {"label": ...} for x}', 'Answer as {"label": ...} for y}']
    assert nulls == {}


def test_a_template_without_fields_is_its_text_for_every_row() -> None:
    template = PromptTemplate("Say {{hi}}")
    assert template.fields == ()
    assert template.columns == ()
    assert template.render({}, {}, 3) == (["Say {hi}"] * 3, {})
    assert template.render({}, {}, 0) == ([], {})


def test_text_columns_render_as_they_are() -> None:
    texts, nulls = render(
        "Summarise: {body} ({lang})",
        {"body": np.array(["first", "sécond"], object), "lang": np.array(["en", "fr"], object)},
    )
    assert texts == ["Summarise: first (en)", "Summarise: sécond (fr)"]
    assert nulls == {}


def test_numpy_unicode_columns_render() -> None:
    texts, _ = render("<{s}>", {"s": np.array(["ab", "c"])})
    assert texts == ["<ab>", "<c>"]


def test_numbers_render_as_python_writes_them() -> None:
    texts, nulls = render(
        "{n}|{f}|{b}",
        {
            "n": np.array([1, -20, 300], np.int64),
            "f": np.array([0.5, 2.0, -1.25], np.float64),
            "b": np.array([True, False, True]),
        },
    )
    assert texts == ["1|0.5|True", "-20|2.0|False", "300|-1.25|True"]
    assert nulls == {}


def test_float32_renders_its_python_float() -> None:
    texts, _ = render("{f}", {"f": np.array([0.25, 1.5], np.float32)})
    assert texts == ["0.25", "1.5"]


def test_bytes_are_decoded_as_utf8_replacing_what_does_not_decode() -> None:
    texts, _ = render(
        "[{raw}]", {"raw": np.array(["héllo".encode(), b"ok", b"bad \xff byte"], object)}
    )
    assert texts == ["[héllo]", "[ok]", "[bad \ufffd byte]"]


def test_a_null_row_is_reported_and_rendered_empty() -> None:
    body = np.array(["a", "", "c", ""], object)
    lang = np.array(["en", "fr", "", "de"], object)
    texts, nulls = render(
        "{body}/{lang}",
        {"body": body, "lang": lang},
        {
            "body": np.array([False, True, False, True]),
            "lang": np.array([False, True, True, False]),
        },
    )
    assert texts == ["a/en", "/", "c/", "/de"]
    # Each null row once, naming the first of its null columns in the template's order.
    assert nulls == {1: "body", 2: "lang", 3: "body"}


def test_a_null_number_is_rendered_empty_not_as_its_placeholder() -> None:
    texts, nulls = render(
        "n={n}", {"n": np.array([7, 0, 9], np.int64)}, {"n": np.array([False, True, False])}
    )
    assert texts == ["n=7", "n=", "n=9"]
    assert nulls == {1: "n"}


def test_a_null_mask_of_a_column_the_template_does_not_name_is_ignored() -> None:
    texts, nulls = render(
        "{body}",
        {"body": np.array(["a", "b"], object), "other": np.array([1, 2])},
        {"other": np.array([True, True])},
    )
    assert texts == ["a", "b"]
    assert nulls == {}


def test_a_field_named_twice_renders_twice() -> None:
    template = PromptTemplate("{q} -- {a} -- {q}!")
    assert template.fields == ("q", "a", "q")
    assert template.columns == ("q", "a")
    texts, nulls = template.render(
        {"q": np.array(["why", "how"], object), "a": np.array([1, 2])},
        {"q": np.array([False, True])},
        2,
    )
    assert texts == ["why -- 1 -- why!", " -- 2 -- !"]
    assert nulls == {1: "q"}


def test_the_text_is_kept() -> None:
    assert PromptTemplate("x {y}").text == "x {y}"
