"""Every model field reaches the Hugging Face export, or is declared not to need to.

An exported folder is rebuilt elsewhere from its config.json alone: a field that changes
what the model computes but not config.json would load there as another model, with no
error. So each field either changes the exported config (or the export refuses the value,
as the StableLM layout refuses a learned position table), or is declared to change
nothing an exported model computes: execution-only (``ten.model.presets.EXECUTION_FIELDS``) or
read only to make the first weights (``ten.model.presets.INIT_FIELDS``). A field added to a
model config fails here until it is one or the other (issue 46)."""

import dataclasses

import pytest

from runner.trained.hf_model.layouts import LAYOUTS, layout_of
from ten.config import SCAN_BACKENDS
from ten.model import config as configs
from ten.model.presets import EXECUTION_FIELDS, INIT_FIELDS, model_config

CHOICES = (configs.MLP_KINDS, configs.POSITIONS, configs.RESIDUAL_DTYPES,
           configs.STATES, SCAN_BACKENDS)


def candidates(value):
    if value is None:  # an optional count, e.g. value_dim
        return [1, 2, 8]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value * 2, value + 1, value // 2]
    if isinstance(value, float):
        return [value * 1.5 + 0.1, value / 2]
    if isinstance(value, str):
        return [c for choices in CHOICES if value in choices for c in choices if c != value]
    return []


def another(cfg, name):
    """``cfg`` with ``name`` set to some other value it accepts."""
    for value in candidates(getattr(cfg, name)):
        try:
            return dataclasses.replace(cfg, **{name: value})
        except ValueError:  # the config's own checks (FieldError): try the next
            continue
    raise AssertionError(f"no other valid value of {name} to try: teach candidates() its type")


def exported(model_class, cfg):
    try:
        return layout_of(model_class, cfg).config(cfg)
    except ValueError as refused:  # the export refuses it: nothing is lost silently
        return f"refused: {refused}"


@pytest.mark.parametrize("arch,model_class", [("ten", "TENLM"), ("transformer", "TransformerLM")])
def test_every_model_field_reaches_the_export_or_is_declared_not_to(arch, model_class):
    assert model_class in LAYOUTS
    base = model_config(arch, "tiny")
    unexported = []
    for field in dataclasses.fields(base):
        if field.name in EXECUTION_FIELDS | INIT_FIELDS:
            continue
        if exported(model_class, another(base, field.name)) == exported(model_class, base):
            unexported.append(field.name)
    assert unexported == [], (f"{arch} model fields config.json does not carry: export them "
                              "(runner/trained/hf_model) or declare them in "
                              "ten.model.presets.EXECUTION_FIELDS / INIT_FIELDS")


def test_the_declared_fields_are_model_fields():
    names = {f.name for cls in configs.MODEL_CONFIGS.values() for f in dataclasses.fields(cls)}
    assert (EXECUTION_FIELDS | INIT_FIELDS) <= names
    assert not EXECUTION_FIELDS & INIT_FIELDS
