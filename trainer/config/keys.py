"""Every recipe key with its type, default and description, read from the schema itself (`hflow
recipes keys`), and which algorithms read each section."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from hflow.errors import UserError
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.config.algorithm_sections import ALGORITHMS


@dataclass(frozen=True)
class Key:
    key: str
    type: str
    default: str
    description: str
    read_by: str


def recipe_keys(section: str | None = None) -> list[Key]:
    """The keys of `section` (every section when None), in the schema's order."""
    top = Recipe.model_fields
    if section is not None and section not in top:
        raise UserError(f"recipes keys {section!r}: no such section; accepted: {', '.join(top)}")
    out = []
    for name, field in top.items():
        if section is not None and name != section:
            continue
        model = _model(field.annotation)
        if model is None:
            out.append(Key(name, _type(field.annotation), _default(field), field.description or "", "all"))
        else:
            out += _section_keys(name, model, _read_by(name))
    return out


def _section_keys(prefix: str, model: type[BaseModel], read_by: str) -> list[Key]:
    keys = []
    for name, field in model.model_fields.items():
        inner = _model(field.annotation)
        if inner is not None and inner is not model:
            listed = typing.get_origin(field.annotation) is list  # a list of sections: eval.sets[].name
            keys.append(Key(f"{prefix}.{name}", f"{'list of sections' if listed else 'section'} ({inner.__name__})",
                            _default(field), field.description or "", read_by))
            keys += _section_keys(f"{prefix}.{name}{'[]' if listed else ''}", inner, read_by)
        else:
            keys.append(Key(f"{prefix}.{name}", _type(field.annotation), _default(field), field.description or "",
                            read_by))
    return keys


def _read_by(section: str) -> str:
    """The algorithms that read a section: its own, the ones whose settings, trained or running
    roles it holds; "all" when every algorithm does."""
    names = [a.name for a in ALGORITHMS.values()
             if section in (a.name, a.settings) or section in a.trained or section in a.roles]
    return "all" if not names or len(names) == len(ALGORITHMS) else ", ".join(names)


def _model(annotation) -> type[BaseModel] | None:
    """The section model behind a field's annotation (Optional[X] included), or None."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _type(annotation) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    return text or str(annotation).replace("typing.", "")


def _default(field) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    if field.default_factory is not None:
        value = field.default_factory()
        return "(section)" if isinstance(value, BaseModel) else repr(value)
    return repr(field.default)
