"""Lock keys made from a call's arguments, for :func:`django_tasklock.exclusive`.

A key is a ``str.format`` template over the decorated function's parameters
(``"community-pr:{work.id}"``), checked against the signature when the
function is decorated and rendered from the bound arguments (defaults
applied) at each call; or a callable that takes the same arguments; or,
with neither, the function's dotted name.

Rendering is ``str.format``'s, so it is not one-to-one: ``("a:1", "2")`` and
``("a", "1:2")`` both give ``"pr:a:1:2"`` under ``"pr:{repo}:{number}"``, and
``None`` renders as ``"None"``. A key function can make keys that cannot
collide (quoting or hashing the parts). A rendered key longer than the
lock's limit is a ``ValueError`` naming the template and the field that
made it long.
"""

from __future__ import annotations

import functools
import inspect
import string
from collections.abc import Callable, Iterator
from typing import Any

from django_tasklock.locking.options import MAX_KEY_LENGTH

KeySpec = str | Callable[..., str] | None

_FORMATTER = string.Formatter()


def default_key(func: Callable[..., Any]) -> str:
    """The key of a bare ``@exclusive``: ``"module.QualifiedName"``."""
    return f"{func.__module__}.{func.__qualname__}"


def signature_of(func: Callable[..., Any]) -> inspect.Signature:
    """The signature callers use, also for a method wrapped by ``method_decorator``.

    ``method_decorator`` hands each decorator a ``functools.partial`` of the
    bound method carrying ``__wrapped__`` = the plain function: following
    ``__wrapped__`` there would bring back ``self``, which callers never pass.
    """
    return inspect.signature(func, follow_wrapped=not isinstance(func, functools.partial))


def template_fields(template: str) -> Iterator[str]:
    """Each replacement field of ``template`` (``"work.id"``, ``"day"``), nested ones included.

    Raises ``ValueError`` when ``template`` is not a valid ``str.format`` template.
    """
    try:
        parsed = list(_FORMATTER.parse(template))
    except ValueError as exc:
        raise ValueError(f"key {template!r} is not a valid str.format template: {exc}") from None
    for _, field, spec, _ in parsed:
        if field is None:
            continue
        yield field
        if spec:
            yield from template_fields(spec)


def root_name(field: str) -> str:
    """The parameter a field starts from: ``"work"`` for ``"work.id"`` or ``"work[0]"``."""
    end = len(field)
    for mark in ".[":
        at = field.find(mark)
        if at != -1:
            end = min(end, at)
    return field[:end]


class KeyBuilder:
    """Renders the lock key of one call of ``func``.

    Raises ``ValueError`` at construction when a template is invalid or names
    something ``func`` has no parameter for (any name passes when ``func``
    takes ``**kwargs``: it is looked up there at each call), and ``TypeError``
    when ``key`` is neither a string, a callable nor None.
    """

    def __init__(self, func: Callable[..., Any], key: KeySpec) -> None:
        self.func = func
        self.key = key
        self.signature: inspect.Signature | None = None
        if key is None or callable(key):
            return
        if not isinstance(key, str):
            raise TypeError(
                f"key must be a str.format template or a callable, not {type(key).__name__}"
            )
        self.signature = signature_of(func)
        parameters = self.signature.parameters
        # A name may also arrive through **kwargs (``def view(request, **kwargs)``,
        # and the stand-in function method_decorator passes decorators first).
        self.var_keyword = next(
            (p.name for p in parameters.values() if p.kind is p.VAR_KEYWORD), None
        )
        for field in template_fields(key):
            name = root_name(field)
            if not name or name.isdigit():
                raise ValueError(
                    f"key {key!r} has a positional field {{{field}}}: name a parameter of "
                    f"{default_key(func)} instead, such as {{{next(iter(parameters), 'arg')}}}"
                )
            if name not in parameters and self.var_keyword is None:
                raise ValueError(
                    f"key {key!r} names {name!r}, which is not a parameter of "
                    f"{default_key(func)}{self.signature}"
                )

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The key for ``func(*args, **kwargs)``.

        Raises ``TypeError`` when the arguments do not fit ``func`` (as calling
        it would), and ``ValueError`` naming the field when a template cannot
        be rendered from them.
        """
        if self.key is None:
            return default_key(self.func)
        if callable(self.key):
            key = self.key(*args, **kwargs)
            if isinstance(key, str) and len(key) > MAX_KEY_LENGTH:
                raise ValueError(
                    f"the key= function of {default_key(self.func)} returned a key of "
                    f"{len(key)} characters, more than the {MAX_KEY_LENGTH} a key may have"
                )
            return key
        assert self.signature is not None
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        names = bound.arguments
        if self.var_keyword is not None:
            names = {**names[self.var_keyword], **names}
        try:
            key = self.key.format_map(names)
        except (AttributeError, LookupError, TypeError, ValueError) as exc:
            raise ValueError(
                f"key {self.key!r} of {default_key(self.func)} could not be rendered from "
                f"this call's arguments: {type(exc).__name__}: {exc}"
            ) from exc
        if len(key) > MAX_KEY_LENGTH:
            raise ValueError(self._too_long(key, names))
        return key

    def _too_long(self, key: str, names: dict[str, Any]) -> str:
        """Which field made ``key`` too long: the caller's values are measured, not shown."""
        assert isinstance(self.key, str)
        lengths: dict[str, int] = {}
        for _, field, spec, conversion in _FORMATTER.parse(self.key):
            if field is None:
                continue
            try:
                value = _FORMATTER.convert_field(
                    _FORMATTER.get_field(field, (), names)[0], conversion
                )
                lengths[field] = max(lengths.get(field, 0), len(format(value, spec or "")))
            except (AttributeError, LookupError, TypeError, ValueError):
                continue  # a nested spec: the total still says enough
        longest = max(lengths, key=lengths.__getitem__, default=None)
        culprit = f": {{{longest}}} gave {lengths[longest]} of them" if longest else ""
        return (
            f"key {self.key!r} of {default_key(self.func)} rendered {len(key)} characters "
            f"from this call's arguments, more than the {MAX_KEY_LENGTH} a key may have"
            f"{culprit}. Bound what the template takes from the caller, or pass key= a "
            "function that shortens it (a hash of the long part, for instance)"
        )
