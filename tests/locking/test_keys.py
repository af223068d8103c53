"""Keys from a call's arguments: templates checked at decoration, rendered per call."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import pytest

from django_tasklock.locking.keys import KeyBuilder, default_key, root_name, signature_of


def process(work: Any, day: str = "today", *rest: Any, **extra: Any) -> None:
    """A function to build keys for."""


def strict(work: Any, day: str = "today", *rest: Any) -> None:
    """No ``**kwargs``: every name in a template must be a parameter."""


class Report:
    def build(self, request: Any, kind: str = "full") -> None: ...


def render(key: Any, *args: Any, **kwargs: Any) -> str:
    return KeyBuilder(process, key)(args, kwargs)


def test_default_key_is_the_dotted_name() -> None:
    assert render(None, 1) == "tests.locking.test_keys.process"
    assert default_key(Report.build) == "tests.locking.test_keys.Report.build"


def test_template_over_arguments_with_defaults_applied() -> None:
    work = SimpleNamespace(id=7, tags=["a", "b"])
    assert render("pr:{work.id}:{day}", work) == "pr:7:today"
    assert render("pr:{work.id}:{day}", work, day="mon") == "pr:7:mon"
    assert render("pr:{work.tags[1]}", work) == "pr:b"
    assert render("{rest[0]}-{extra[k]}", work, "d", "r0", k="v") == "r0-v"
    assert render("{work:>4}", 12) == "  12"


def test_attribute_chains_like_request_user_pk() -> None:
    request = SimpleNamespace(user=SimpleNamespace(pk=42))
    builder = KeyBuilder(Report.build, "report:{request.user.pk}:{kind}")
    assert builder((Report(), request), {}) == "report:42:full"


def test_callable_key_takes_the_same_arguments() -> None:
    def key(work: Any, day: str = "today") -> str:
        return f"k:{work}:{day}"

    assert render(key, 3, day="tue") == "k:3:tue"


@pytest.mark.parametrize(
    ("template", "named"),
    [("pr:{wrok.id}", "'wrok'"), ("{work}{missing[0]}", "'missing'"), ("{work:{width}}", "width")],
)
def test_template_naming_a_missing_parameter_fails_at_decoration(
    template: str, named: str
) -> None:
    with pytest.raises(ValueError, match=named) as info:
        KeyBuilder(strict, template)
    assert "not a parameter of tests.locking.test_keys.strict" in str(info.value)


@pytest.mark.parametrize("template", ["pr:{}", "pr:{0}", "pr:{0.id}"])
def test_positional_fields_are_refused(template: str) -> None:
    with pytest.raises(ValueError, match="positional field"):
        KeyBuilder(strict, template)


def test_malformed_template_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not a valid str\\.format template"):
        KeyBuilder(process, "pr:{work.id")


def test_non_string_key_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="key must be"):
        KeyBuilder(process, 42)  # type: ignore[arg-type]


def test_template_that_cannot_be_rendered_names_what_is_missing() -> None:
    with pytest.raises(ValueError, match="has no attribute 'id'"):
        render("pr:{work.id}", SimpleNamespace(pk=1))
    with pytest.raises(ValueError, match="'k'"):
        render("pr:{extra[k]}", 1)


def test_arguments_that_do_not_fit_are_a_type_error_as_calling_would_be() -> None:
    with pytest.raises(TypeError, match="work"):
        render("pr:{work}")


def test_names_may_come_through_var_keyword_arguments() -> None:
    def view(request: Any, **kwargs: Any) -> None: ...

    builder = KeyBuilder(view, "v:{name}:{request}")
    assert builder(("r",), {"name": "n"}) == "v:n:r"
    with pytest.raises(ValueError, match="KeyError: 'name'"):
        builder(("r",), {})


def test_root_name() -> None:
    assert [root_name(f) for f in ("a", "a.b", "a[0].b", "a.b[c]")] == ["a", "a", "a", "a"]


def test_signature_of_a_method_decorator_partial_has_no_self() -> None:
    report = Report()
    # What django.utils.decorators.method_decorator hands a decorator per call.
    bound = functools.wraps(Report.build)(functools.partial(Report.build.__get__(report, Report)))
    assert list(signature_of(bound).parameters) == ["request", "kind"]
    assert list(signature_of(Report.build).parameters) == ["self", "request", "kind"]


def two_parts(repo: str, number: Any) -> None:
    """A function whose key joins two arguments."""


def test_an_over_long_key_names_the_template_and_the_argument_that_made_it() -> None:
    build = KeyBuilder(two_parts, "pr:{repo}:{number}")
    assert build(("a" * 100, 7), {}) == "pr:" + "a" * 100 + ":7"
    with pytest.raises(ValueError, match="rendered") as info:
        build(("x" * 300, 7), {})
    message = str(info.value)
    assert "'pr:{repo}:{number}'" in message
    assert "{repo}" in message
    assert "305" in message  # the rendered length
    assert "245" in message
    assert "key=" in message  # how to bound it
    assert "x" * 50 not in message  # the user's value is not echoed whole


def test_an_over_long_key_from_a_key_function_names_it() -> None:
    build = KeyBuilder(two_parts, lambda repo, number: f"pr:{repo}:{number}")
    with pytest.raises(ValueError, match=r"key= function .* 305 characters"):
        build(("x" * 300, 7), {})


def test_a_decorated_view_given_an_over_long_value_raises_the_clear_error(
    client: Any, settings: Any
) -> None:
    # A clear exception, not a 409 nor a 400: the template (not the visitor)
    # must be fixed, and Django reports a 500 to the site's admins.
    settings.TASKLOCK_BACKEND = "memory"
    client.raise_request_exception = True
    with pytest.raises(ValueError, match=r"'view:\{name\}' of tests\.views\.report.*\{name\}"):
        client.get(f"/report/{'n' * 300}/")
    assert client.get(f"/report/{'n' * 200}/").status_code == 200
